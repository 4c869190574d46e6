"""`report.json` for machines and one self-contained `report.html` for people.

The HTML holds everything inline: plots (matplotlib, Agg) and thumbnails of every escape and false
reject as data URIs, no script, no external request. Every string from a dataset or a verdict is
untrusted and goes through `html.escape`.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import cv2

from edge_runtime.config.schema import ImageLimits
from edge_runtime.core.errors import ImageError
from edge_runtime.core.images import read_image_file

THUMB_PX = 160
MAX_THUMBS = 500  # per variant and kind; the rest are listed by id


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a report is meant to be read like any file
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(report: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "report.json"
    write_atomic(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never a display
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _confusion_plot(name: str, conf: dict[str, Any]) -> str:
    plt = _pyplot()
    labels = [str(x) for x in conf["labels"]]
    matrix = conf["matrix"]
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(labels), 1.0 + 0.5 * len(labels)))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("verdict")
    ax.set_ylabel("label")
    ax.set_title(name[:60], fontsize=9)
    peak = max((max(row) for row in matrix), default=0) or 1
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                        color="white" if v > peak / 2 else "black")
    return _png(fig)


def _reliability_plot(rel: dict[str, Any]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(3.6, 3.4))
    pts = [(b["confidence"], b["accuracy"], b["count"]) for b in rel["bins"] if b["count"]]
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    ax.set_xlabel("stated confidence")
    ax.set_ylabel("defect decision correct")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title("reliability", fontsize=9)
    return _png(fig)


def _latency_plot(samples: list[float]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(3.6, 2.6))
    ax.hist(samples, bins=30)
    ax.set_xlabel("inspection ms")
    ax.set_ylabel("images")
    ax.set_title("latency", fontsize=9)
    return _png(fig)


def _thumb(path: Path, limits: ImageLimits) -> str | None:
    try:
        frame = read_image_file(path, limits.max_pixels, limits.min_side, int(limits.max_file_mb * 2**20))
    except ImageError:
        return None
    h, w = frame.shape[:2]
    scale = THUMB_PX / max(h, w)
    if scale < 1:
        frame = cv2.resize(frame, (max(1, int(w * scale)), max(1, int(h * scale))), interpolation=cv2.INTER_AREA)
    ok, jpg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 80])
    return "data:image/jpeg;base64," + base64.b64encode(jpg.tobytes()).decode() if ok else None


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _pct(r: dict[str, Any]) -> str:
    if r.get("rate") is None:
        return "—"
    lo, hi = r["ci95"]
    return f"{r['rate']:.2%} <small>({r['count']} of {r['of']}; 95% CI {lo:.2%}–{hi:.2%})</small>"


def _gallery(title: str, ids: list[str], images: dict[str, Path], verdicts: dict[str, Any],
             limits: ImageLimits) -> str:
    parts = [f"<h4>{_e(title)} ({len(ids)})</h4><div class=g>"]
    for sid in ids[:MAX_THUMBS]:
        src = _thumb(images[sid], limits) if sid in images else None
        img = f'<img src="{src}" alt="">' if src else "<span>(image unreadable)</span>"
        caption = json.dumps(verdicts.get(sid), ensure_ascii=False)[:300]
        parts.append(f"<figure>{img}<figcaption>{_e(sid)}<br><code>{_e(caption)}</code></figcaption></figure>")
    if len(ids) > MAX_THUMBS:
        parts.append(f"<p>… and {len(ids) - MAX_THUMBS} more (ids in report.json)</p>")
    return "".join(parts) + "</div>"


def write_html(report: dict[str, Any], images: dict[str, Path], verdicts: dict[str, dict[str, Any]],
               out_dir: Path, limits: ImageLimits) -> Path:
    """`verdicts[variant key][sample id]` is that variant's verdict (for the thumbnails' captions)."""
    ds = report["dataset"]
    body = [f"<h1>Evaluation of {_e(ds['path'])}</h1>",
            f"<p>{ds['samples']} labelled images ({_e(ds['source'])}); left out: "
            f"{_e(', '.join(f'{k} {v}' for k, v in ds['issue_counts'].items()) or 'none')}. "
            f"Defect means: <code>{_e(report['defect_rule'])}</code>. Generated {_e(report['generated'])}.</p>"]
    for v in report["variants"]:
        d = v["defect"]
        errors = ", ".join(f"{k} {n}" for k, n in v["errors"].items()) or "none"
        body.append(f"<h2>{_e(v['label'])}</h2><p><code>{_e(v['model'])}</code> prompt: "
                    f"<code>{_e(v['prompt'])}</code></p><table>"
                    f"<tr><th>escape rate</th><td>{_pct(d['escape'])}</td></tr>"
                    f"<tr><th>false-reject rate</th><td>{_pct(d['false_reject'])}</td></tr>"
                    f"<tr><th>precision / recall / F1</th><td>{_num(d['precision'])} / {_num(d['recall'])} / "
                    f"{_num(d['f1'])}</td></tr><tr><th>counts</th><td>TP {d['tp']} · FP {d['fp']} · FN {d['fn']}"
                    f" · TN {d['tn']} · unknown {d['unknown']}</td></tr>"
                    f"<tr><th>errors</th><td>{_e(errors)}</td></tr>"
                    f"<tr><th>latency p50 / p95</th><td>{_num(v['latency']['total_ms']['p50'])} / "
                    f"{_num(v['latency']['total_ms']['p95'])} ms; tokens per verdict "
                    f"{_num(v['latency']['tokens']['mean'])}</td></tr></table>")
        if v.get("regions"):  # per labelled region of the inspection program (--program)
            body.append("<h3>Regions</h3><table><tr><th>region</th><th>escape rate</th><th>false-reject rate</th>"
                        "<th>no verdict</th></tr>")
            body.extend(f"<tr><td>{_e(name)}</td><td>{_pct(r['escape'])}</td><td>{_pct(r['false_reject'])}</td>"
                        f"<td>{r['no_verdict']}</td></tr>" for name, r in v["regions"].items())
            body.append("</table>")
        body.append("<h3>Fields</h3><table><tr><th>field</th><th>labelled</th><th>accuracy</th><th>more</th></tr>")
        plots = []
        for name, f in v["fields"].items():
            more = ", ".join(f"{k} {_num(f[k])}" for k in ("normalised", "mean_abs_error") if k in f)
            body.append(f"<tr><td>{_e(name)}</td><td>{f['labelled']}</td><td>{f['accuracy']:.2%}</td>"
                        f"<td>{_e(more)}</td></tr>")
            if "confusion" in f:
                plots.append(_confusion_plot(name, f["confusion"]))
        body.append("</table><div class=g>")
        if v["confidence"].get("reliability", {}).get("n"):
            plots.append(_reliability_plot(v["confidence"]["reliability"]))
        if v["latency"]["samples_ms"]:
            plots.append(_latency_plot(v["latency"]["samples_ms"]))
        body.extend(f'<img src="{p}" alt="">' for p in plots)
        body.append("</div>")
        th = v["confidence"].get("threshold")
        if th:
            if th["reachable"]:
                body.append(f"<h3>Confidence</h3><p>target escape {th['target']:.2%}: min_confidence "
                            f"{_e(th['min_confidence'])}; escapes {_pct(th['escape'])}; good parts held for "
                            f"review {_pct(th['good_held_for_review'])}</p>")
            else:
                body.append(f"<h3>Confidence</h3><p>no min_confidence reaches the target escape {th['target']:.2%}:"
                            f" bad parts pass with confidence 1 (escapes {_pct(th['escape'])})</p>")
            if v["confidence"].get("rule_snippet"):
                body.append(f"<pre>{_e(v['confidence']['rule_snippet'])}</pre>")
        body.append(_gallery("Escapes: bad parts passed", d["escape_ids"], images, verdicts[v["key"]], limits))
        body.append(_gallery("False rejects: good parts rejected", d["false_reject_ids"], images,
                             verdicts[v["key"]], limits))
    if report.get("gate"):
        body.append(_gate_html(report["gate"], images, limits))
    for c in report["comparisons"]:
        body.append(f"<h2>{_e(c['b'])} against {_e(c['a'])}</h2><p>{c['paired']} images judged by both</p>"
                    "<table><tr><th></th><th>A</th><th>B</th><th>difference</th><th>only A / only B</th>"
                    "<th>McNemar p</th></tr>")
        for k in ("escape", "false_reject", "wrong"):
            t = c[k]
            body.append(f"<tr><th>{k}</th><td>{t['a']}/{t['of']}</td><td>{t['b']}/{t['of']}</td>"
                        f"<td>{_num(t['difference'])}</td><td>{t['only_a']} / {t['only_b']}</td>"
                        f"<td>{t['p_value']:.4f}{' (significant)' if t['significant'] else ''}</td></tr>")
        body.append("</table>")
    if ds["issues"]:
        body.append("<h2>Left out</h2><pre>" + _e("\n".join(ds["issues"][:1000])) + "</pre>")
    page = ("<!doctype html><html><head><meta charset=utf-8><title>edge-runtime eval</title>"
            "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\"><style>body{font:14px sans-serif;margin:2em;max-width:75em}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
            ".g{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0;width:180px;font-size:11px;"
            "overflow-wrap:anywhere}</style></head><body>" + "".join(body) + "</body></html>\n")
    path = out_dir / "report.html"
    write_atomic(path, page)
    return path


def _gate_plot(section: dict[str, Any]) -> str:
    """The gate's curve: escape, false reject and calls saved against the threshold."""
    plt = _pyplot()
    pts = section["curve"]
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    xs = [p["threshold"] for p in pts]
    for key, label in (("escape", "escape (bad parts gated)"), ("false_reject", "false reject (good parts flagged)"),
                       ("gated", "language-model calls saved")):
        ys = [p[key] for p in pts]
        if any(y is not None for y in ys):
            ax.plot(xs, [float("nan") if y is None else y for y in ys], label=label)
    ax.axvline(section["threshold"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(f"gate threshold ({section.get('score_unit', 'score')})")
    ax.set_ylabel("share")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    ax.set_title("the gate against its threshold", fontsize=9)
    return _png(fig)


def _gate_html(g: dict[str, Any], images: dict[str, Path], limits: ImageLimits) -> str:
    s = g["skip_ok"]
    alone = s["language_model_alone"]
    parts = [f"<h2>Anomaly gate</h2><p>bank <code>{_e(g['bank'])}</code> (sha256 {_e(g['sha256'][:16])}…, encoder "
             f"<code>{_e(g['encoder']['file'])}</code>); threshold {g['threshold']:.4g} ({_e(g['threshold_source'])}); "
             f"{g['scored']} images scored"
             + (f"; {g['not_finite']} scored a non-finite number (NaN/inf): counted as not gated (sent to the "
                "language model), left out of the curve" if g.get("not_finite") else "") + "</p><table>"
             f"<tr><th>gate escape rate (defective parts under the threshold)</th><td>{_pct(g['escape'])}</td></tr>"
             f"<tr><th>gate false-reject rate (good parts flagged)</th><td>{_pct(g['false_reject'])}</td></tr>"
             f"<tr><th>language-model calls saved</th><td>{_pct(g['calls_saved'])}</td></tr>"
             f"<tr><th>skip_ok escape / model alone</th><td>{_pct(s['escape'])} / {_pct(alone['escape'])}</td></tr>"
             f"<tr><th>skip_ok false reject / model alone</th><td>{_pct(s['false_reject'])} / "
             f"{_pct(alone['false_reject'])}</td></tr></table>"]
    if g["curve"]:
        parts.append(f'<div class=g><img src="{_gate_plot(g)}" alt=""></div>')
    verdicts = {i: None for i in g["escape_ids"]}
    parts.append(_gallery("Gate escapes: defective parts under the threshold", g["escape_ids"], images, verdicts,
                          limits))
    return "".join(parts)


def _num(x: Any) -> str:
    return "—" if x is None else f"{x:.3f}" if isinstance(x, float) else _e(x)
