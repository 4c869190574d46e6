"""The `line_io:` section: stations a line (a PLC) triggers, and the protocols it speaks to them
(line_protocols.py).

A station is bound to one camera; the line triggers it with a part id and a recipe, and reads back
OK/NOK through a FIFO it acknowledges. The state machine is `lineio/station/`; docs/line-io.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edge_runtime.config.base import NAME, Section, beside_config
from edge_runtime.config.gate import GateConfig
from edge_runtime.config.line_protocols import GpioConfig, ModbusConfig, OpcUaConfig, SparkplugConfig
from edge_runtime.config.programs import ProgramConfig, check_regions_inside
from edge_runtime.config.rules import Condition
from edge_runtime.core.errors import InputError
from edge_runtime.core.files import open_regular
from edge_runtime.core.schema_budget import LIMITS, check_schema_budget

PART_ID_MAX = 32
# Printable ASCII: part ids travel as Modbus registers, OPC UA strings and MQTT metrics alike.
TEXT_ID = re.compile(r"[\x20-\x7e]{0,32}")
RECIPE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$"


SCHEMA_FILE_MAX = 4 * LIMITS.max_bytes  # a schema file as written (indented); its compact form is bounded too


def load_schema(value: Any) -> dict[str, Any] | None:
    """A recipe's `schema`: inline (a mapping) or the path of a JSON file; within the API's budget."""
    if isinstance(value, str):
        value = _read_schema_file(value)
    elif value is not None and not isinstance(value, dict):
        raise ValueError("schema must be a JSON schema (a mapping) or the path of a JSON file")
    if value is not None:
        try:
            check_schema_budget(value, "schema")
        except InputError as exc:
            raise ValueError(str(exc)) from None
    return value


def _read_schema_file(name: str) -> Any:
    try:
        with open_regular(Path(name).expanduser()) as f:  # a FIFO would block the read (and a reload) for good
            data = f.read(SCHEMA_FILE_MAX + 1)  # bounded before it costs anything
    except OSError as exc:
        raise ValueError(f"cannot read the schema file {name}: {exc.strerror or exc}") from None
    if len(data) > SCHEMA_FILE_MAX:
        raise ValueError(f"the schema file {name} is more than {SCHEMA_FILE_MAX} bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; nested too deep
        raise ValueError(f"the schema file {name} is not JSON: {str(exc)[:200]}") from None


def schema_has_field(schema: dict[str, Any], path: str) -> bool:
    """Whether a dotted path (under the verdict) is declared by the schema's properties, following
    local $refs and allOf/anyOf/oneOf branches (the walk is bounded by the schema budget's size)."""
    nodes: list[Any] = [schema]
    for part in path.split("."):
        found: list[Any] = []
        seen = 0
        while nodes and seen < LIMITS.max_nodes:
            node = _resolve(schema, nodes.pop())
            seen += 1
            if not isinstance(node, dict):
                continue
            props = node.get("properties")
            if isinstance(props, dict) and part in props:
                found.append(props[part])
            for key in ("allOf", "anyOf", "oneOf"):
                if isinstance(node.get(key), list):
                    nodes.extend(node[key])
        if not found:
            return False
        nodes = found
    return True


def _resolve(schema: dict[str, Any], node: Any) -> Any:
    for _ in range(16):  # a chain of local refs, bounded (a ref cycle ends here as "not found")
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return node
        target: Any = schema
        for key in ref[2:].split("/"):
            target = target.get(key) if isinstance(target, dict) else None
        node = target
    return None


DefectCode = Annotated[int, Field(ge=1, le=899)]  # 0 is OK; 900 and up are the station's own (timeout...)


class DefectCodes(Section):
    """The DefectCode of a NOK by where it failed: the first failing region (in region order) of the
    camera's inspection program, or what that region's verdict (the frame's, without regions) calls it."""

    regions: dict[str, DefectCode] = Field(
        default_factory=dict, max_length=64,
        description="Region or tile name (of the station camera's program) -> DefectCode of a NOK whose "
                    "first failing region it is (codes 1-899).")
    categories: dict[str, DefectCode] = Field(
        default_factory=dict, max_length=256,
        description="Value of the failing verdict's `category_field` -> DefectCode, where the region has no "
                    "code of its own (or the result has no regions).")
    category_field: str = Field("category", pattern=r"^[A-Za-z0-9_]{1,64}$",
                                description="The verdict field whose value `categories` maps.")

    @field_validator("regions", "categories")
    @classmethod
    def _short_keys(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [k for k in v if not 1 <= len(k) <= 64]
        if bad:
            raise ValueError(f"names are 1-64 characters; not {bad[0][:64]!r}")
        return v


def program_region_names(program: ProgramConfig) -> list[str]:
    """The names a program's results carry in `regions`, in their order (inference/regions.py)."""
    names = [r.name for r in program.regions]
    if program.tiling is not None:
        names += [f"tile_r{r + 1}_c{c + 1}" for r in range(program.tiling.rows) for c in range(program.tiling.cols)]
    return names


def check_line_programs(stations: list[StationConfig], programs: dict[str, ProgramConfig],
                        camera_size: dict[str, tuple[int | None, int | None]],
                        camera_program: dict[str, str | None] | None = None) -> None:
    """Every program a station or recipe names exists, has no clip (a job inspects one frame) and, on a
    camera of known size (`camera_size`), its regions lie inside the frame; a station that names no
    program does not inherit its camera's (`camera_program`) clip. ValueError in one line naming
    line_io.stations.<s>[.recipes.<r>].program."""
    for st in stations:
        inherited = (camera_program or {}).get(st.camera)
        clip = programs[inherited].clip if st.program is None and inherited in programs else None
        if clip is not None:
            raise ValueError(f"line_io.stations.{st.name}.program: none is named, so its jobs take camera "
                             f"{st.camera}'s program {inherited!r}, which asks about a clip of {clip.frames} frames; "
                             "a line job inspects the one frame its trigger takes (name a program without a clip)")
        named = [(f"line_io.stations.{st.name}", st.program)]
        named += [(f"line_io.stations.{st.name}.recipes.{rid}", r.program) for rid, r in st.recipes.items()]
        for where, name in named:
            if name is None:
                continue
            program = programs.get(name)
            if program is None:
                raise ValueError(f"{where}.program: no program {name!r} under programs:")
            if program.clip is not None:
                raise ValueError(f"{where}.program: program {name!r} asks about a clip of {program.clip.frames} "
                                 "frames; a line job inspects the one frame its trigger takes")
            width, height = camera_size.get(st.camera, (None, None))
            if width is not None and height is not None:
                try:
                    check_regions_inside(program, width, height, name, st.camera)
                except ValueError as exc:
                    raise ValueError(f"{where}.program: {exc}") from None


def check_defect_code_regions(stations: list[StationConfig], camera_program: dict[str, str | None],
                              programs: dict[str, ProgramConfig]) -> None:
    """Every region a station's (or recipe's) `defect_codes` names is one its program's results carry: a
    typo would silently report the default code. `camera_program`: each configured camera's program."""
    for st in stations:
        if st.camera not in camera_program:
            continue  # an unknown camera is refused at start and by doctor
        owners = [(f"line_io.stations.{st.name}", st.defect_codes, st.program)]
        # A recipe naming a program of its own asks that program's regions in place of the camera's.
        owners += [(f"line_io.stations.{st.name}.recipes.{rid}", r.defect_codes, r.program or st.program)
                   for rid, r in st.recipes.items()]
        for where, codes, own in owners:
            if codes is None or not codes.regions:
                continue
            name = own or camera_program[st.camera]
            program = programs.get(name) if name else None
            known = program_region_names(program) if program is not None else []
            unknown = [k for k in codes.regions if k not in known]
            if unknown:
                have = (", ".join(known[:12]) + (", ..." if len(known) > 12 else "")) if known else "no regions"
                whose = f"program {name!r}" if name else f"camera {st.camera} (no program)"
                raise ValueError(f"{where}.defect_codes.regions: no region {unknown[0][:64]!r} in {whose}; "
                                 f"its regions: {have}")


class RecipeConfig(Section):
    """What one RecipeId selects: the question asked, the verdict's schema and the rule that makes it NOK."""

    prompt: str | None = Field(None, max_length=4000,
                               description="Inspection prompt for this recipe (default: the camera's prompt).")
    verdict_schema: dict[str, Any] | None = Field(
        None, alias="schema",
        description="JSON schema of this recipe's verdict, inline or the path of a JSON file (default: the "
                    "bundle's schema); bounded like a request's response_format (size, depth, lengths). "
                    "The NOK rule must name fields it declares.")
    nok_when: list[Condition] | None = Field(
        None, min_length=1, max_length=16,
        description="NOK when all these conditions hold (default: the station's nok_when).")
    gate: GateConfig | None = Field(
        None, description="This recipe's own anomaly gate, in place of its camera's for the frames it triggers "
        "(a bank of this part on that camera; `mode: off` turns the camera's gate off for them).")
    defect_codes: DefectCodes | None = Field(
        None, description="DefectCode of this recipe's NOKs by failing region or category (default: the "
        "station's defect_codes).")
    program: str | None = Field(
        None, pattern=NAME, description="The inspection program (under programs:) this recipe's parts are "
        "inspected with: its references, regions and image token budget (default: the station's, else the "
        "camera's). Not one with a clip: a job is one frame.")

    @field_validator("verdict_schema", mode="before")
    @classmethod
    def _schema(cls, v: Any, info: ValidationInfo) -> dict[str, Any] | None:
        return load_schema(beside_config(v, info) if isinstance(v, str) else v)  # a file: from the config's folder


class StationConfig(Section):
    """One inspection station of the line, bound to a camera."""

    name: str = Field(pattern=NAME, description="Station name (OPC UA object, metrics label, journal).")
    camera: str = Field(pattern=NAME, description="The configured camera this station triggers.")
    result_deadline_ms: int = Field(
        2000, ge=10, le=600_000,
        description="A verdict not ready this long after the trigger is reported NOK with defect code "
                    "900 (timeout), never a default OK.")
    acquisition_timeout_ms: int = Field(
        1000, ge=10, le=60_000,
        description="How long a trigger waits for a new frame from the camera before it is NOK with "
                    "defect code 901 (no frame).")
    fifo_depth: int = Field(8, ge=1, le=64, description="Results that wait for ResultAck (in-flight jobs "
                            "count); a trigger beyond it is refused and sets Overrun.")
    heartbeat_ms: int = Field(500, ge=50, le=60_000, description="Heartbeat increments this often.")
    enabled_at_start: bool = Field(True, description="TriggerEnable after a start, until the line writes it.")
    nok_when: list[Condition] = Field(
        min_length=1, max_length=16,
        description="The verdict is NOK when all these conditions hold (the rules' conditions, e.g. "
                    "{field: verdict.defect, equals: true}); an empty or missing verdict is ERROR (NOK).")
    defect_code_field: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,4}$",
        description="Dotted path of an integer in the result used as DefectCode of a NOK (default 1).")
    defect_codes: DefectCodes | None = Field(
        None, description="DefectCode of a NOK by its first failing region (in region order) or that "
        "verdict's category; before defect_code_field. docs/line-io.md, Defect codes.")
    program: str | None = Field(
        None, pattern=NAME, description="The inspection program (under programs:) of this station's jobs whose "
        "recipe names none (default: the camera's). Not one with a clip: a job is one frame.")
    recipes: dict[str, RecipeConfig] = Field(
        default_factory=dict, max_length=256,
        description="RecipeId -> recipe; with none configured the line must send an empty RecipeId.")
    default_recipe: str | None = Field(None, description="The recipe used when the line sends an empty RecipeId.")

    @field_validator("recipes")
    @classmethod
    def _recipe_ids(cls, v: dict[str, RecipeConfig], info: ValidationInfo) -> dict[str, RecipeConfig]:
        bad = [k for k in v if not re.fullmatch(RECIPE_ID, k)]
        if bad:
            raise ValueError(f"recipe ids are 1-32 letters, digits, '_', '.' or '-'; not {bad[0]!r}")
        for name, recipe in v.items():  # a recipe with its own schema: its NOK rule reads declared fields
            if recipe.verdict_schema is None:
                continue
            for cond in recipe.nok_when or info.data.get("nok_when") or []:
                head, _, rest = cond.field.partition(".")
                if head == "verdict" and rest and not schema_has_field(recipe.verdict_schema, rest):
                    whose = "its nok_when" if recipe.nok_when else "the station's nok_when"
                    raise ValueError(f"recipe {name}: {whose} reads {cond.field}, which the recipe's schema does "
                                     "not declare (a missing field never holds: the rule could never fire)")
        return v

    @model_validator(mode="after")
    def _default_known(self) -> StationConfig:
        if self.default_recipe is not None and self.default_recipe not in self.recipes:
            raise ValueError(f"default_recipe {self.default_recipe!r} is not one of the recipes")
        return self

class LineIOConfig(Section):
    """Stations and the protocol servers the line talks to (all off unless configured)."""

    stations: list[StationConfig] = Field(default_factory=list, max_length=16,
                                          description="The stations of this device.")
    opcua: OpcUaConfig = Field(default_factory=OpcUaConfig, description="The OPC UA server.")
    modbus: ModbusConfig = Field(default_factory=ModbusConfig, description="Modbus TCP server (off by default).")
    sparkplug: SparkplugConfig = Field(default_factory=SparkplugConfig,
                                       description="Sparkplug B edge node (off by default).")
    gpio: GpioConfig = Field(default_factory=GpioConfig, description="GPIO trigger and outputs (off by default).")

    @model_validator(mode="after")
    def _gpio_stations(self) -> LineIOConfig:
        names = {s.name for s in self.stations}
        for cell in self.gpio.cells:
            if cell.station not in names:
                raise ValueError(f"gpio: station {cell.station!r} is not one of the stations")
        lines = [x for c in self.gpio.cells for x in (c.trigger_line, c.ok_line, c.nok_line) if x is not None]
        if len(set(lines)) != len(lines):
            raise ValueError("gpio: two cells use the same line")
        return self

    @field_validator("stations")
    @classmethod
    def _unique(cls, v: list[StationConfig]) -> list[StationConfig]:
        names = [s.name for s in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"station names must be unique; repeated: {', '.join(dupes)}")
        return v
