"""Bounded YAML -> Python values for the config file: `${ENV}` / systemd credentials substitution,
alias-bomb and recursion limits, and the line of a key for error messages. Knows nothing of the
config's sections (those are the section modules beside it, joined in `schema.py`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from edge_runtime.core.errors import ConfigError

_MAX_NODES = 100_000  # YAML nodes after alias expansion (a billion-laughs file has ~10^9)
_MAX_DEPTH = 64


_SURROGATE = re.compile("[\ud800-\udfff]")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def shown(text: str, limit: int = 80) -> str:
    """Text from the file as an error quotes it: one line (control characters and lone surrogates
    escaped: a newline in a key split the error, and forged log lines on a reload) and bounded."""
    cut = text[:limit]
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return out + "…" if len(text) > limit else out


def _substitute(text: str, where: str) -> str:
    """Replace ${VAR} and ${VAR:-default}; a missing variable without default is an error."""
    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = os.environ.get(name)
        if value is None:
            cred = _systemd_credential(name)
            value = cred if cred is not None else default
        if value is None:
            raise ConfigError(f"{where}: environment variable {name} is not set (and has no :-default)")
        return value
    return _ENV.sub(repl, text)


def _systemd_credential(name: str) -> str | None:
    """systemd's LoadCredential= files are read like environment variables of the same name."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    return path.read_text().rstrip("\n") if path.is_file() else None


class Expander:
    """Compose tree -> Python values with bounds: a recursive alias (`x: &a [*a]`) or an alias bomb
    (billion laughs) becomes a ConfigError instead of a RecursionError or gigabytes of memory."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.nodes = 0
        self._open: set[int] = set()  # nodes being expanded: seeing one again is a cycle
        self._loader = yaml.SafeLoader("")  # one per parse: its constructed-object cache is per document

    def value(self, node: yaml.Node, depth: int = 0, path: str = "") -> Any:
        """`path`: the dotted place of `node` in the file, for errors (`model.threads`, `cameras.0`)."""
        where = f"{self.source}:{node.start_mark.line + 1}"
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise ConfigError(f"{where}: too many values (over {_MAX_NODES} after expanding aliases)")
        if depth > _MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            if id(node) in self._open:
                raise ConfigError(f"{where}: an alias refers to itself (recursive structure)")
            self._open.add(id(node))
            try:
                if isinstance(node, yaml.SequenceNode):
                    return [self.value(v, depth + 1, f"{path}{i}.") for i, v in enumerate(node.value)]
                out: dict[Any, Any] = {}
                first_line: dict[Any, int] = {}
                for k, v in node.value:
                    line = k.start_mark.line + 1
                    if not isinstance(k, yaml.ScalarNode):
                        raise ConfigError(f"{self.source}:{line}: a key must be a plain "
                                          "value, not a list or mapping")
                    key = self.value(k, depth + 1, path)
                    if key in out:  # the later one silently won: a pasted second `cameras:` dropped the first
                        raise ConfigError(f"{self.source}:{line}: {shown(path + str(key), 120)}: the key appears "
                                          f"twice in one mapping (first on line {first_line[key]})")
                    first_line[key] = line
                    out[key] = self.value(v, depth + 1, f"{path}{str(key)[:64]}.")  # a path per child: bounded
                return out
            finally:
                self._open.discard(id(node))
        return self._scalar(node, where)

    def _scalar(self, node: yaml.Node, where: str) -> Any:
        try:
            value = self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # e.g. a !!python/object tag SafeLoader refuses
            problem = getattr(exc, "problem", None) or str(exc)
            if "tag:yaml.org,2002:merge" in problem:
                problem = "YAML merge keys (<<: *anchor) are not supported here; repeat the keys instead"
            raise ConfigError(f"{where}: {problem}") from None
        except ValueError as exc:  # an integer of thousands of digits (Python's int() limit), a bad date
            raise ConfigError(f"{where}: unusable value: {str(exc)[:120]}") from None
        if isinstance(value, bytes):  # !!binary: a config holds text
            raise ConfigError(f"{where}: binary (!!binary) values are not accepted")
        if isinstance(value, str) and "${" in value:
            value = _substitute(value, where)
            # A substituted scalar is re-read so `port: ${PORT}` becomes an int.
            try:
                parsed = yaml.safe_load(value) if value else value
            except yaml.YAMLError:
                parsed = value
            value = parsed if isinstance(parsed, (int, float, bool)) else value
        if isinstance(value, str) and _SURROGATE.search(value):
            # a "\\ud800" escape in YAML, or an environment variable that is not UTF-8 (Python keeps its
            # bytes as lone surrogates): it cannot be written to a log, a database or a topic later
            raise ConfigError(f"{where}: the value is not valid UTF-8 text (a lone surrogate "
                              f"{value.encode('utf-8', 'backslashreplace').decode()[:80]!r})")
        return value


def line_of(root: yaml.Node, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the node at a pydantic error location, or of its nearest parent."""
    node: yaml.Node | None = root
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == key), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
