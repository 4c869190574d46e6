"""The docs stay true to the code: every config key and every CLI command is documented."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from edge_runtime.cli.main import build_parser
from edge_runtime.config import CameraConfig, Config

ROOT = Path(__file__).resolve().parents[2]


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        # A field with an alias is documented under either name ("a|b"): the alias is what users write.
        out.append(prefix + name + (f"|{prefix}{field.alias}" if field.alias else ""))
        args = typing.get_args(field.annotation) or (field.annotation,)
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None and name != "cameras":
            out += keys(sub, f"{prefix}{name}.")
    return out


def test_every_config_key_is_in_the_configuration_doc() -> None:
    doc = (ROOT / "docs/configuration.md").read_text()
    missing = [k for k in keys(Config) + keys(CameraConfig, "cameras[].")
               if not any(f"`{name}`" in doc for name in k.split("|"))]
    assert missing == []


def test_every_cli_command_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in sub.choices:  # type: ignore[union-attr]
        assert f"edge-runtime {name}" in readme, name


def test_every_module_is_in_the_architecture_map() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    package = ROOT / "edge_runtime"
    assert sorted(p.name for p in package.glob("*.py")) == ["__init__.py", "__main__.py"]  # folders only
    folders = [f"`{p.relative_to(package).as_posix()}/`" for p in package.rglob("__init__.py") for p in [p.parent]
               if p != package]
    modules = [f"{p.name}`" for p in package.rglob("*.py") if not p.name.startswith("__")]
    assert [m for m in folders + modules if m not in doc] == []
