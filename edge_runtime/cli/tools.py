"""The tool commands of `edge-runtime` (`ota …`, `models …`, `config …`, `dataset export`): each
takes the parsed arguments and the config, prints its output and returns the exit code. `cli/main.py`
parses and dispatches; a user mistake raises EdgeRuntimeError (one line, exit code 2)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.config import Config, config_schema
from edge_runtime.core.errors import EdgeRuntimeError

if TYPE_CHECKING:
    from edge_runtime.ota.manifest import Manifest


def cmd_ota_agent(args: argparse.Namespace, config: Config) -> int:
    import signal
    import threading

    from edge_runtime.ota.service import run_agent

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_agent(config, stop)
    return 0


def cmd_ota_keygen(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.ota.manifest import generate_keypair

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    private, public = generate_keypair()
    (out / "fleet.key").write_text(private + "\n")
    (out / "fleet.key").chmod(0o600)
    (out / "fleet.pub").write_text(public + "\n")
    print(json.dumps({"private_key": str(out / "fleet.key"), "public_key": public}))
    return 0


def _with_evaluation(manifest: Manifest, path: Path) -> Manifest:
    from edge_runtime.ota.manifest import MAX_EVALUATION_BYTES, Manifest

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_EVALUATION_BYTES + 1)
    except OSError as exc:
        raise EdgeRuntimeError(f"--evaluation {path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_EVALUATION_BYTES:
        raise EdgeRuntimeError(f"--evaluation {path}: larger than {MAX_EVALUATION_BYTES // 1024} KiB")
    try:
        summary = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise EdgeRuntimeError(f"--evaluation {path}: not JSON (give the summary.json of edge-runtime eval)") from None
    if not isinstance(summary, dict):
        raise EdgeRuntimeError(f"--evaluation {path}: must be a JSON object")
    return Manifest.model_validate({**manifest.model_dump(exclude_none=True), "evaluation": summary})


def cmd_ota_sign(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.ota.manifest import ManifestRefused, parse, sign

    try:
        manifest = parse(Path(args.manifest).read_bytes())
    except ManifestRefused as exc:
        raise EdgeRuntimeError(f"{args.manifest}: {exc}") from None
    if args.evaluation:  # edge-runtime eval's summary.json, signed with the manifest
        manifest = _with_evaluation(manifest, Path(args.evaluation))
    signed = sign(manifest, Path(args.key).read_text().strip())
    text = signed.model_dump_json(exclude_none=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


def cmd_ota_publish(args: argparse.Namespace, config: Config) -> int:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edge_runtime.config.base import TOPIC_PIECE
    from edge_runtime.delivery.mqtt.client import configure_client

    option, target = ("--group", args.group) if args.group else ("--device", args.device)
    if not TOPIC_PIECE.fullmatch(target):  # a '+' or '#' made paho raise; a '/' reached another topic
        raise EdgeRuntimeError(f"{option}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter "
                               "or digit (it is one level of an MQTT topic)")
    payload = Path(args.manifest).read_bytes()
    topic = f"edge/group/{args.group}/cmd/ota" if args.group else f"edge/{args.device}/cmd/ota"
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    configure_client(client, config.mqtt)  # the fleet's broker credentials and TLS from --config
    try:
        client.connect(args.host or config.mqtt.host, args.port or config.mqtt.port)
    except OSError as exc:
        raise EdgeRuntimeError(f"cannot reach the broker: {exc}") from None
    client.loop_start()
    client.publish(topic, payload, qos=1).wait_for_publish(timeout=10)
    client.loop_stop()
    client.disconnect()
    print(f"published to {topic}")
    return 0


def cmd_ota_hawkbit_upload(args: argparse.Namespace, config: Config) -> int:
    import os

    from edge_runtime.ota.ddi.upload import upload_goosebit, upload_hawkbit

    password = os.environ.get("HAWKBIT_PASSWORD")  # never on the command line (ps, shell history)
    if password is None:
        raise EdgeRuntimeError("set HAWKBIT_PASSWORD to the management user's password")
    if args.server == "goosebit":
        result = upload_goosebit(args.url, args.user, password, args.manifest)
    else:
        result = upload_hawkbit(args.url, args.user, password, args.module, args.manifest,
                                args.module_type, args.ds_type)
    print(json.dumps(result))
    return 0


def cmd_models_demo(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime_models.demo import build_demo_bundle

    from edge_runtime.core.bundle.manifest import demo_bundle_dir, load_bundle

    out = Path(args.dir) if args.dir else demo_bundle_dir(config.data_dir)
    bundle = load_bundle(build_demo_bundle(out, quant=args.quant))
    print(json.dumps(bundle.describe()))
    return 0


def cmd_models_bench(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime_models.realistic import build_bench_bundle

    from edge_runtime.core.bundle.manifest import load_bundle

    out = Path(args.dir) if args.dir else config.data_dir / "models" / args.name
    print(json.dumps(load_bundle(build_bench_bundle(args.name, out)).describe()))
    return 0


def cmd_models_export(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime_models.export import ExportError, export_checkpoint
    from edge_runtime_models.llama_cpp_tools import ConverterError

    from edge_runtime.core.bundle.manifest import load_bundle

    schema = None
    if args.schema:
        try:
            schema = json.loads(Path(args.schema).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise EdgeRuntimeError(f"{args.schema}: not a readable JSON schema ({exc})") from None
    try:
        report = export_checkpoint(Path(args.checkpoint), Path(args.out), args.quant, name=args.name, schema=schema,
                                   prompt=args.prompt, llama_cpp_src=Path(args.llama_cpp_src) if args.llama_cpp_src
                                   else None, progress=not args.quiet, threads=config.model.threads)
    except (ExportError, ConverterError) as exc:
        raise EdgeRuntimeError(str(exc)) from None
    print(json.dumps({**load_bundle(report.out_dir).describe(), "family": report.family,
                      "seconds": report.seconds}))
    return 0


def cmd_models_import(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime_models.pair_import import ImportOptions, ImportRefused, import_pair

    from edge_runtime.core.bundle.manifest import load_bundle

    schema = None
    if args.schema:
        schema = _read_schema(args.schema)
    opts = ImportOptions(name=args.name, schema=schema, prompt=args.prompt, prompt_template=args.prompt_template,
                         image_max_tokens=args.image_max_tokens, mode="link" if args.link else "copy")
    try:
        out = import_pair(Path(args.language), Path(args.mmproj), Path(args.dir), opts)
    except ImportRefused as exc:
        raise EdgeRuntimeError(str(exc)) from None
    print(json.dumps(load_bundle(out).describe()))
    return 0


def _read_schema(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            raw = f.read((1 << 20) + 1)
        schema = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise EdgeRuntimeError(f"{path}: not a readable JSON schema ({exc})") from None
    if len(raw) > 1 << 20 or not isinstance(schema, dict):
        raise EdgeRuntimeError(f"{path}: a verdict schema is one JSON object of at most 1 MiB")
    return schema


def cmd_models_verify(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.core.bundle.manifest import load_bundle
    from edge_runtime.core.bundle.verify import verify_steps

    failed = False
    for status, check, detail in verify_steps(args.dir):
        failed = failed or status == "FAIL"
        if not args.json:
            print(f"{status:<4}  {check:<8}  {detail}")
        elif failed:
            print(json.dumps({"ok": False, "check": check, "error": detail}))
    if failed:
        return 2
    if args.json:
        print(json.dumps({"ok": True, **load_bundle(args.dir, verify_checksums=False).describe()}))
    return 0


def cmd_config_validate(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.inference.anomaly.step import any_gate, gates_for
    from edge_runtime.inference.model_source import resolve_bundle
    from edge_runtime.inference.program_fit import check_programs_offline
    from edge_runtime.inference.programs import check_bundle_programs

    if config.programs:  # what start refuses of a program before encoding (the same functions)
        bundle = resolve_bundle(config, getattr(args, "model", None))
        check_bundle_programs(bundle, config.programs, config.cameras)
        check_programs_offline(bundle, config)  # budgets and context, counted by libmtmd (no weights)
    if any_gate(config):  # each camera's bank against the bundle it would score (one line, exit 2)
        gates_for(resolve_bundle(config, getattr(args, "model", None)), config)
    print(f"{args.file}: ok")
    for written, meant in dict.fromkeys(config.resolved_paths()):  # as start and reload read them
        print(f"  {written} -> {meant}")
    return 0


def cmd_dataset_export(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.verdicts.review import export_from_config

    print(json.dumps(export_from_config(config, Path(args.dir), args.all, args.camera)))
    return 0


def cmd_config_schema(args: argparse.Namespace, config: Config) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0
