"""``report.md`` and a self-contained ``report.html`` from one list of blocks.

A report is built once as a list of ``Block`` records (heading, paragraph, table, preformatted
text, image) and written twice: Markdown links the PNGs by relative path; HTML embeds them as
base64 data URIs, so the one file can be mailed or attached to an issue.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.output_dir import atomic_write_text
from reports.breakdown import SEGMENT_BY_NAME, path_segments
from reports.metrics import format_summary
from reports.stats import METRIC_TITLES, percentile_word


@dataclass(frozen=True, slots=True)
class Block:
    """One element of a report."""

    kind: str  # "h1", "h2", "p", "table", "pre", "img"
    text: str = ""  # heading/paragraph/preformatted text, or an image caption
    header: Sequence[str] = ()  # table header
    rows: Sequence[Sequence[str]] = field(default_factory=tuple)  # table cells
    path: Path | None = None  # image file


def _f(x: Any, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def latency_table(summary: Mapping[str, Any]) -> Block:
    """mean / median / std / percentiles (ms) of each reported metric."""
    words = [
        k[1 : -len("_ttft_ms")] for k in summary
        if k.startswith("p") and k.endswith("_ttft_ms")
    ] or [percentile_word(p) for p in summary.get("report_options", {}).get("percentiles", [])]
    header = ["metric", "mean (ms)", "median (ms)", "std (ms)"] + [f"p{w} (ms)" for w in words]
    rows = []
    for key, (name, _) in METRIC_TITLES.items():
        if f"mean_{key}_ms" in summary:
            stats = [f"{s}_{key}_ms" for s in ("mean", "median", "std")]
            stats += [f"p{w}_{key}_ms" for w in words]
            rows.append([name] + [_f(summary.get(k)) for k in stats])
    return Block("table", header=header, rows=rows)


def breakdown_table(breakdown: Mapping[str, Any]) -> Block:
    """Segments × (TTFT p50, TTFT p99, E2EL p50, E2EL p99): ms and share."""
    cols = [(p, at) for p in ("ttft", "e2el") for at in ("p50", "p99")]
    header = ["segment"] + [f"{p.upper()} {at}" for p, at in cols]
    names = [s.name for s in path_segments("e2el")]
    names.insert(names.index("decode"), "output_first")
    rows = []
    for name in names:
        cells = [SEGMENT_BY_NAME[name].label + (" (first token)" if name == "output_first"
                                                 else " (last token)" if name == "output_last"
                                                 else "")]
        for p, at in cols:
            leaf = breakdown.get(p, {}).get(at)
            if leaf is None or name not in leaf["segments_ms"]:
                cells.append("")
            else:
                cells.append(f"{leaf['segments_ms'][name]:,.1f} ms "
                             f"({100 * leaf['shares'][name]:.0f}%)")
        rows.append(cells)
    total = ["**total**"] + [
        f"{breakdown[p][at]['latency_ms']:,.1f} ms ({breakdown[p][at]['num_requests']} req)"
        for p, at in cols
    ]
    rows.append(total)
    return Block("table", header=header, rows=rows)


def group_table(summary: Mapping[str, Any]) -> Block:
    """One row per tenant and per SLO class (``reports.classes``)."""
    header = ["group", "requests", "completed", "rejected", "TTFT p50 / p99 (ms)",
              "TPOT p50 / p99 (ms)", "E2EL p50 / p99 (ms)", "SLO attainment",
              "goodput (req/s)"]
    rows = []
    for key, word in (("by_tenant", "tenant"), ("by_slo_class", "class")):
        for name, g in (summary.get(key) or {}).items():
            att = g.get("slo_attainment")
            rows.append([
                f"{word} {name or '(none)'}", _f(g["num_requests"]), _f(g["completed"]),
                _f(g["rejected"]),
                f"{_f(g['median_ttft_ms'], 1)} / {_f(g['p99_ttft_ms'], 1)}",
                f"{_f(g['median_tpot_ms'], 1)} / {_f(g['p99_tpot_ms'], 1)}",
                f"{_f(g['median_e2el_ms'], 1)} / {_f(g['p99_e2el_ms'], 1)}",
                "–" if att is None else f"{100 * att:.1f}%", _f(g.get("goodput")),
            ])
    return Block("table", header=header, rows=rows)


def engine_table(engine: Mapping[str, Any]) -> Block:
    rows = [[k, _f(v, 3) if isinstance(v, float) else _f(v)] for k, v in engine.items()
            if not isinstance(v, Mapping)]
    for k, v in engine.items():
        if isinstance(v, Mapping):
            rows.append([k, ", ".join(f"{a}: {_f(b, 3)}" for a, b in v.items()) or "–"])
    return Block("table", header=["engine statistic", "value"], rows=rows)


def _policy_blocks(meta: Mapping[str, Any]) -> list[Block]:
    """One line on the run's scheduling policy and what the bulk fast path did with it."""
    policy = meta.get("scheduling_policy")
    if not policy:
        return []
    options = ", ".join(f"{k}={v}" for k, v in (policy.get("options") or {}).items())
    text = (f"Scheduling policy {policy.get('name')} ({policy.get('class')}"
            + (f"; {options}" if options else "") + ")")
    if policy.get("bulk_fast_path"):
        text += f" · bulk fast path: {policy['bulk_fast_path']}"
    return [Block("p", text + ".")]


def report_blocks(
    summary: Mapping[str, Any], meta: Mapping[str, Any], plots: Mapping[str, Path]
) -> list[Block]:
    """The blocks of a single-run report."""
    diag = summary["diagnosis"]
    title = meta.get("label") or summary.get("model_id") or "run"
    source = (meta.get("workload") or {}).get("source", "")
    blocks = [
        Block("h1", f"twinserve report: {title} ({summary.get('kind')})"),
        Block("p", f"Date {summary.get('date')} · backend {summary.get('backend')} · seed "
                   f"{summary.get('seed')} · version {summary.get('version')} · commit "
                   f"{summary.get('git_commit')}" + (f" · workload: {source}" if source else "")
                   + (f" · step costs: {meta['step_costs']}" if meta.get("step_costs") else "")),
        *_policy_blocks(meta),
        Block("h2", f"Diagnosis: {diag['verdict']}"),
        Block("p", diag["text"]),
        Block("h2", "Serving benchmark result (vllm bench serve layout)"),
        Block("pre", format_summary(summary)),
        Block("h2", "Latency statistics"),
        latency_table(summary),
    ]
    if summary.get("slo_attainment"):
        slos = summary.get("goodput_slos_ms") or {}
        rows = [[k, _f(slos.get(k)) if k != "all" else "every SLO", f"{100 * v:.1f}%"]
                for k, v in summary["slo_attainment"].items()]
        blocks += [Block("h2", "Goodput and SLO attainment"),
                   Block("p", f"Goodput {_f(summary.get('request_goodput'))} req/s."),
                   Block("table", header=["SLO", "limit (ms)", "requests meeting it"],
                         rows=rows)]
    if summary.get("by_tenant") or summary.get("by_slo_class"):
        blocks += [Block("h2", "By tenant and SLO class"),
                   Block("p", "Each group's requests, rejections (the admission rule, or shed "
                              "by the scheduling policy), latency of its completed requests, "
                              "and the share of all its requests that completed within their "
                              "SLO (their class's targets, else the run's goodput SLOs)."),
                   group_table(summary)]
    blocks += [Block("h2", "Where the time went"),
               Block("p", "Each request's TTFT and E2EL split into consecutive segments; "
                          "columns are the mean over the requests around that percentile."),
               breakdown_table(summary["breakdown"]),
               Block("h2", "Engine statistics"), engine_table(summary["engine"])]
    captions = {
        "latency_cdfs": "Latency CDFs (TTFT, TPOT, ITL, E2EL)",
        "breakdown": "Request-path breakdown",
        "kv_and_queues": "KV-cache usage and scheduler queues over time",
        "batch_composition": "Batch composition over time",
    }
    if plots:
        blocks.append(Block("h2", "Plots"))
        blocks += [Block("img", captions.get(k, k), path=Path(p)) for k, p in plots.items()]
    blocks += [Block("h2", "Configuration"),
               Block("pre", json.dumps(summary.get("config"), indent=1, default=str))]
    return blocks


# -- writers --------------------------------------------------------------------------------------
def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block], base_dir: Path) -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(("# " if b.kind == "h1" else "## ") + b.text)
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "pre":
            out.append(f"```\n{b.text}\n```")
        elif b.kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out[-1] += "\n|" + "|".join("---" for _ in b.header) + "|"
            for row in b.rows:
                out[-1] += "\n| " + " | ".join(_md_cell(c) for c in row) + " |"
        elif b.kind == "img" and b.path is not None:
            rel = Path(b.path).resolve().relative_to(base_dir.resolve()).as_posix()
            out.append(f"![{b.text}]({rel})")
    return "\n\n".join(out) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#222}table{border-collapse:collapse;margin:1em 0;font-size:14px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}th{background:#f0f0f0}"
    "pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:13px}"
    "img{max-width:100%;border:1px solid #ddd}figure{margin:1.5em 0}"
    "figcaption{color:#555;font-size:14px}"
)


def to_html(blocks: Sequence[Block], title: str = "twinserve report") -> str:
    esc = html.escape
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
           f"<style>{_CSS}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(f"<{b.kind}>{esc(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{esc(b.text)}</p>")
        elif b.kind == "pre":
            out.append(f"<pre>{esc(b.text)}</pre>")
        elif b.kind == "table":
            head = "".join(f"<th>{esc(h)}</th>" for h in b.header)
            body = "".join(
                "<tr>" + "".join(f"<td>{esc(c.replace('**', ''))}</td>" for c in row) + "</tr>"
                for row in b.rows
            )
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        elif b.kind == "img" and b.path is not None:
            data = base64.b64encode(Path(b.path).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt='{esc(b.text)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{esc(b.text)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(
    out_dir: str | Path, summary: Mapping[str, Any], meta: Mapping[str, Any],
    plots: Mapping[str, Path],
) -> tuple[Path, Path]:
    """``report.md`` and ``report.html`` in ``out_dir``."""
    d = Path(out_dir)
    blocks = report_blocks(summary, meta, plots)
    md = atomic_write_text(d / "report.md", to_markdown(blocks, d))
    page = atomic_write_text(d / "report.html", to_html(blocks, blocks[0].text))
    return md, page
