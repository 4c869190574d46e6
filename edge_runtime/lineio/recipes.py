"""What a station's recipe selects, as pure functions of the station's config: the RecipeId a trigger
names, the request its job makes (prompt and verdict schema), the OK / NOK / ERROR of its verdict by
the recipe's rule (or the station's), and the result stamped with the job. docs/line-io.md, Recipes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import regex

from edge_runtime.config.line_io import PART_ID_MAX, DefectCodes, StationConfig
from edge_runtime.config.rules import REGEX_TIMEOUT_S, Condition
from edge_runtime.core.result import Result
from edge_runtime.lineio.signals import (
    DEFECT_NO_VERDICT,
    DEFECT_NOK,
    DEFECT_UNDECIDED,
    JobRequest,
    LineOutcome,
    LineRefused,
)
from edge_runtime.verdicts.rules import condition_holds, lookup


def recipe_id(cfg: StationConfig, recipe: str | None) -> str:
    """The configured recipe a trigger names (empty: the default one), or LineRefused("bad_recipe")."""
    recipe = recipe or ""
    if not isinstance(recipe, str) or len(recipe) > PART_ID_MAX:
        raise LineRefused("bad_recipe", "RecipeId must be a string of at most 32 characters")
    if not recipe:
        return cfg.default_recipe or ""
    if recipe not in cfg.recipes:
        known = ", ".join(sorted(cfg.recipes)[:8]) or "none configured"
        raise LineRefused("bad_recipe", f"unknown RecipeId {recipe[:32]!r} (known: {known})")
    return recipe


def job_request(cfg: StationConfig, seq: int, part_id: str, recipe: str, deadline: float,
                camera_prompt: str | None) -> JobRequest:
    """What the capture side is asked for one job: the recipe's prompt, verdict schema and program (the
    station's program where the recipe names none), if it has them."""
    chosen = cfg.recipes.get(recipe)
    prompt = chosen.prompt if chosen is not None and chosen.prompt else camera_prompt
    program = (chosen.program if chosen is not None else None) or cfg.program
    return JobRequest(cfg.name, seq, part_id, recipe, cfg.camera, prompt, deadline,
                      chosen.verdict_schema if chosen is not None else None, program)


def judge(cfg: StationConfig, result: Result) -> tuple[LineOutcome, int]:
    """OK / NOK (with its defect code) / ERROR for one verdict, by the recipe's or station's rule."""
    if not isinstance(result.verdict, dict) or not result.verdict:
        return LineOutcome.ERROR, DEFECT_NO_VERDICT
    recipe = cfg.recipes.get(result.recipe or "")
    conditions = (recipe.nok_when if recipe is not None and recipe.nok_when else None) or cfg.nok_when
    data = result.to_dict()
    holds = [_holds(c, data) for c in conditions]
    if False in holds:
        return LineOutcome.OK, 0
    if None in holds:  # the rule could not say: never a default OK
        return LineOutcome.ERROR, DEFECT_UNDECIDED
    codes = (recipe.defect_codes if recipe is not None and recipe.defect_codes is not None else None) \
        or cfg.defect_codes
    code = _mapped_code(codes, result) if codes is not None else None
    if code is None and cfg.defect_code_field:
        value = lookup(data, cfg.defect_code_field)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 900:
            code = value
    return LineOutcome.NOK, code or DEFECT_NOK


def _mapped_code(codes: DefectCodes, result: Result) -> int | None:
    """The code of the first NOK region (in region order) by its name, else by its verdict's category;
    without a NOK region, by the frame's verdict's category. None: no mapping applies."""
    failing = next((r for r in result.regions or [] if isinstance(r, dict) and r.get("outcome") == "nok"), None)
    verdict = result.verdict
    if failing is not None:
        by_name = codes.regions.get(str(failing.get("name")))
        if by_name is not None:
            return by_name
        own = failing.get("verdict")
        verdict = own if isinstance(own, dict) else {}
    category = verdict.get(codes.category_field)
    return codes.categories.get(category) if isinstance(category, str) else None


def _holds(cond: Condition, data: dict[str, Any]) -> bool | None:
    """A rule condition on the result; None when its regex did not finish (the rules engine says "no
    match", which for a NOK rule means OK). A regex reads the whole string (the engine: 10,000 chars)."""
    if cond.regex is None:
        return condition_holds(cond, data)
    value = lookup(data, cond.field)
    if not isinstance(value, str):
        return False
    try:
        return regex.search(cond.regex, value, timeout=REGEX_TIMEOUT_S, concurrent=True) is not None
    except TimeoutError:
        return None


def tagged(result: Result, job: JobRequest) -> Result:
    """The result of a station's job, carrying station, part id, recipe and job id."""
    return replace(result, station=job.station, part_id=job.part_id, recipe=job.recipe, inspection_seq=job.seq)
