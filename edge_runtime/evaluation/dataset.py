"""Labelled images in, `Sample`s out; every bad record is one counted line, never a crash.

Layouts: the `dataset export` folder (`train/metadata.jsonl`: `file_name` + `label`), a folder per
class (`good/`, `scratch/`, ...), a JSONL or CSV file of `image` + the expected verdict fields (flat
columns, or a `label`/`expected` object), and the reviewed results of the journal (`--from-journal`).
Everything is bounded before it costs: the index file's size, each line's length, the number of
records and files; the images themselves are checked (bytes, declared pixels) by `core/images.py`
when the run reads them.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from edge_runtime.core.errors import EdgeRuntimeError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".heic", ".heif"}
MAX_RECORDS = 100_000
MAX_LINE_BYTES = 64 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_ID_CHARS = 200
# Keys of a record that are not expected verdict fields (the export's metadata, our own columns).
META_KEYS = {"id", "image", "file_name", "camera", "ts", "model", "prompt", "verdict", "label", "expected",
             "review_state", "note", "regions"}
MAX_REGION_LABELS = 64  # a program has at most 32 regions and tiles
GOOD_NAMES = {"good", "ok", "pass", "passed", "false", "no", "0", "accept", "accepted", "none"}
BAD_NAMES = {"bad", "ng", "nok", "defect", "defective", "fail", "failed", "true", "yes", "1", "reject",
             "rejected"}


@dataclass(frozen=True)
class Sample:
    """One labelled image: its id (unique in the dataset), file and expected verdict fields."""

    id: str
    image: Path
    expected: dict[str, Any]
    # An inspection program's regions, labelled: region or tile name -> its expected verdict fields.
    regions: dict[str, dict[str, Any]] | None = None


@dataclass
class Dataset:
    """The readable samples, and one line per record that was left out (with counts per kind)."""

    source: str
    samples: list[Sample] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def issue(self, kind: str, line: str) -> None:
        self.counts[kind] += 1
        self.issues.append(f"{kind}: {line}"[:500])


class LabelChecker:
    """Checks expected fields against the bundle's verdict schema, field by field (a label may give
    only some fields, e.g. just `defect`)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.properties: dict[str, Any] = dict(schema.get("properties") or {})
        self._validators = {name: Draft202012Validator(sub) for name, sub in self.properties.items()
                            if isinstance(sub, dict)}

    def problem(self, label: Any) -> str | None:
        """None when the label fits, else why not (one short phrase)."""
        if not isinstance(label, dict):
            return f"the label is {type(label).__name__}, not an object of verdict fields"
        if not label:
            return "no expected verdict field"
        for name, value in label.items():
            if name not in self.properties:
                return f"field {str(name)[:60]!r} is not in the bundle's verdict schema"
            errors = sorted(self._validators[name].iter_errors(value), key=str) if name in self._validators else []
            if errors:
                return f"field {name!r}: {errors[0].message[:160]}"
        return None

    def coerce(self, name: str, text: str) -> Any:
        """A CSV cell as the JSON value its schema type asks for (unchanged when it does not parse)."""
        sub = self.properties.get(name) or {}
        kind = sub.get("type")
        low = text.strip().lower()
        if kind == "boolean":
            return {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}.get(low, text)
        if kind in ("number", "integer"):
            try:
                number = float(low)
            except ValueError:
                return text
            return int(number) if kind == "integer" and number.is_integer() else number
        return text


def open_dataset(path: Path, schema: dict[str, Any], *, class_field: str | None = None,
                 limit: int | None = None, max_records: int = MAX_RECORDS) -> Dataset:
    """Read DATASET (a file or folder; the layout is recognised) into samples and issues."""
    checker = LabelChecker(schema)
    cap = min(limit, max_records) if limit else max_records
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".csv":
            return _finish(Dataset("csv"), _csv_records(path, checker), path.parent, checker, cap)
        if suffix in (".jsonl", ".json", ".ndjson"):
            return _finish(Dataset("jsonl"), _jsonl_records(path), path.parent, checker, cap)
        raise EdgeRuntimeError(f"{path}: not a dataset; give a folder, a .jsonl or a .csv file")
    if not path.is_dir():
        raise EdgeRuntimeError(f"{path}: no such dataset file or folder")
    for index in (path / "train" / "metadata.jsonl", path / "metadata.jsonl"):
        if index.is_file():
            return _finish(Dataset("export"), _jsonl_records(index), index.parent, checker, cap)
    return _class_folders(path, checker, class_field, cap)


def records_from_rows(rows: Iterable[tuple[str, Record]], checker: LabelChecker, cap: int,
                      source: str) -> Dataset:
    """Samples from (where, record) pairs whose `image` is already an absolute path (the journal)."""
    return _finish(Dataset(source), ((where, rec) for where, rec in rows), Path("/"), checker, cap)


Record = dict[str, Any] | str | tuple[str, str]


def _finish(ds: Dataset, records: Iterator[tuple[str, Record]], base: Path,
            checker: LabelChecker, cap: int) -> Dataset:
    seen: set[str] = set()
    for where, rec in records:
        if isinstance(rec, str):  # the reader's own complaint about this line
            ds.issue("bad_line", f"{where}: {rec}")
            continue
        if isinstance(rec, tuple):  # (kind, why): a reader that knows the kind (the journal)
            ds.issue(rec[0], f"{where}: {rec[1]}")
            continue
        if len(ds.samples) >= cap:
            ds.issue("over_limit", f"{where} and the records after it: more than {cap} records; "
                     "the rest were not read (--limit)")
            break
        image = rec.get("image", rec.get("file_name"))
        if not isinstance(image, str) or not image.strip():
            ds.issue("bad_line", f"{where}: no 'image' (or 'file_name') path")
            continue
        raw_id = rec.get("id", image)
        if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or not str(raw_id) \
                or len(str(raw_id)) > MAX_ID_CHARS:
            ds.issue("bad_line", f"{where}: 'id' must be a string or integer of 1 to {MAX_ID_CHARS} characters")
            continue
        sid = str(raw_id)
        label = _label_of(rec, checker)
        regions, why = _region_labels(rec.get("regions"), checker)
        if why is None and not (label == {} and regions):  # regions alone label the image enough
            why = checker.problem(label)
        if why is not None:
            ds.issue("bad_label", f"{where} (id {sid}): {why}")
            continue
        if sid in seen:
            ds.issue("duplicate_id", f"{where}: id {sid} appears again; only its first record is used")
            continue
        img = Path(image) if os.path.isabs(image) else base / image
        if not img.is_file():
            ds.issue("missing_image", f"{where} (id {sid}): {img}: no such image file")
            continue
        seen.add(sid)
        ds.samples.append(Sample(sid, img, label, regions))
    return ds


def _region_labels(raw: Any, checker: LabelChecker) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    """A record's `regions` ({name: {verdict fields}}, checked like the frame's label), or why not."""
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_REGION_LABELS:
        return None, f"'regions' must be an object of 1 to {MAX_REGION_LABELS} region names -> verdict fields"
    for name, label in raw.items():
        if not 1 <= len(name) <= 64:
            return None, "a region name is 1 to 64 characters"
        why = checker.problem(label)
        if why is not None:
            return None, f"region {name[:64]!r}: {why}"
    return raw, None


def _label_of(rec: dict[str, Any], checker: LabelChecker) -> Any:
    for key in ("label", "expected"):
        if key in rec:
            return rec[key]
    return {k: v for k, v in rec.items() if k not in META_KEYS or k in checker.properties}


def _read_index(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise EdgeRuntimeError(f"{path}: {size} bytes, more than the {MAX_INDEX_BYTES} an index file may "
                                   "have; split the dataset")
        with path.open("rb") as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
    except OSError as exc:
        raise EdgeRuntimeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_INDEX_BYTES:
        raise EdgeRuntimeError(f"{path}: grew past {MAX_INDEX_BYTES >> 20} MiB while read")
    return raw.decode("utf-8", errors="replace")


def _lines(path: Path) -> Iterator[tuple[str, str | None]]:
    """(where, line) with line None when it is too long; blank lines skipped."""
    for n, line in enumerate(_read_index(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{n}"
        yield where, (None if len(line.encode("utf-8", errors="replace")) > MAX_LINE_BYTES else line)


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    for where, line in _lines(path):
        if line is None:
            yield where, f"longer than {MAX_LINE_BYTES // 1024} KiB"
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            yield where, f"not JSON ({getattr(exc, 'msg', 'nested too deep')})"
            continue
        yield (where, rec) if isinstance(rec, dict) else (where, "not a JSON object")


def _csv_records(path: Path, checker: LabelChecker) -> Iterator[tuple[str, dict[str, Any] | str]]:
    header: list[str] | None = None
    for where, line in _lines(path):
        if line is None:
            yield where, f"longer than {MAX_LINE_BYTES // 1024} KiB"
            continue
        try:
            cells = next(csv.reader(io.StringIO(line)))
        except (csv.Error, StopIteration) as exc:
            yield where, f"not a CSV row ({exc})"
            continue
        if header is None:
            header = [c.strip() for c in cells]
            if "image" not in header:
                raise EdgeRuntimeError(f"{path}: the first row must name the columns, one of them 'image'")
            continue
        if len(cells) != len(header):
            yield where, f"{len(cells)} cells where the header has {len(header)}"
            continue
        rec: dict[str, Any] = {}
        for name, cell in zip(header, cells, strict=True):
            if cell == "":
                continue  # an empty cell: this field is not labelled for this image
            rec[name] = cell if name in META_KEYS and name not in checker.properties else checker.coerce(name, cell)
        yield where, rec


def _class_folders(root: Path, checker: LabelChecker, class_field: str | None, cap: int) -> Dataset:
    ds = Dataset("folders")
    try:
        with os.scandir(root) as it:
            classes = sorted(e.name for e in it if not e.name.startswith(".") and _dir_or_unknown(e))
    except OSError as exc:
        raise EdgeRuntimeError(f"{root}: cannot be listed ({exc.strerror or exc})") from None
    if not classes:
        raise EdgeRuntimeError(f"{root}: no metadata.jsonl and no class folders; see docs/evaluation.md")
    name = class_field or _guess_class_field(classes, checker)

    def records() -> Iterator[tuple[str, dict[str, Any] | str]]:
        files = 0
        for cls in classes:
            value = _class_value(cls, checker.properties.get(name) or {})
            try:  # listing stops past the cap: a folder of ten million files costs no more than the cap
                with os.scandir(root / cls) as it:
                    entries: list[str] = []
                    for entry in it:
                        if not entry.name.startswith(".") and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                            entries.append(entry.name)
                            if len(entries) > cap:
                                break
            except OSError as exc:  # a link loop, no permission: the folder is one line, the rest is read
                yield cls, f"the class folder cannot be listed ({exc.strerror or exc})"
                continue
            for entry_name in sorted(entries):
                files += 1
                if files > cap + 1:
                    return
                rel = f"{cls}/{entry_name}"
                yield rel, {"id": rel, "image": rel, "label": {name: value}}

    return _finish(ds, records(), root, checker, cap)


def _dir_or_unknown(entry: os.DirEntry[str]) -> bool:
    """A folder, or an entry that cannot be looked at (a link loop): listing it then says why."""
    try:
        return entry.is_dir()
    except OSError:
        return True


def _guess_class_field(classes: list[str], checker: LabelChecker) -> str:
    """A boolean field when every folder reads as good/bad, else the enum field holding the names."""
    props = checker.properties
    if all(c.lower() in GOOD_NAMES | BAD_NAMES for c in classes):
        for name, sub in props.items():
            if isinstance(sub, dict) and sub.get("type") == "boolean":
                return name
    for name, sub in props.items():
        if isinstance(sub, dict) and isinstance(sub.get("enum"), list) and set(classes) <= set(sub["enum"]):
            return name
    for name, sub in props.items():  # the best fit: the enum holding most names; the rest are bad labels
        if isinstance(sub, dict) and isinstance(sub.get("enum"), list) and set(classes) & set(sub["enum"]):
            return name
    raise EdgeRuntimeError(f"class folders {', '.join(classes[:8])}: no verdict field of the schema takes "
                           "these names; say which with --class-field")


def _class_value(cls: str, sub: dict[str, Any]) -> Any:
    if sub.get("type") == "boolean":
        low = cls.lower()
        return False if low in GOOD_NAMES else True if low in BAD_NAMES else cls
    return cls
