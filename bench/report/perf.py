"""Performance figures as the reports show them: a Markdown table per cell, and strip plots of
the distributions (boot, weight loading, TTFT, ITL) per cell for report.html. Pure."""

from __future__ import annotations

from markupsafe import Markup

from bench.core.perf import METRICS, fmt
from bench.core.records import CellSummary, MetricSummary
from bench.report.svg import strip

TABLE = ("boot_s", "weights_load_s", "load_gb_s", "ttft_s", "itl_s", "latency_s", "throughput_tok_s", "peak_rss_bytes")
GPU_COLUMN = "peak_gpu_bytes"  # shown when some cell measured it (nvidia-smi on the host)
PLOTS = ("boot_s", "weights_load_s", "ttft_s", "itl_s")


def _figure(m: MetricSummary | None, metric: str) -> str:
    if m is None:
        return "–"
    unit = METRICS[metric].unit
    if m.samples > m.runs:  # request-level: pooled median and p90
        return f"{fmt(m.p50, unit)} / {fmt(m.p90, unit)}"
    ci = f" ({fmt(m.run_median_ci[0], unit)}–{fmt(m.run_median_ci[1], unit)})" if m.run_median_ci else ""
    return fmt(m.run_median, unit) + ci


def perf_markdown(cells: list[CellSummary]) -> list[str]:
    shown = [c for c in cells if c.perf]
    if not shown:
        return []
    table = TABLE + ((GPU_COLUMN,) if any(GPU_COLUMN in c.perf for c in shown) else ())
    head = " | ".join(METRICS[m].label for m in table)
    lines = ["", "## Performance", "",
             "Per cell over its runs: run-level figures as the median with its bootstrap 95 % interval over runs; "
             "request-level ones (TTFT, ITL, latency) as median / p90 over every request or token. "
             "`regbench compare` checks them for slowdowns.", "",
             f"| cell | runs | {head} |", "|---|---|" + "---|" * len(table)]
    for c in shown:
        runs = max((m.runs for m in c.perf.values()), default=0)
        lines.append(f"| `{c.cell_id}` | {runs} | " + " | ".join(_figure(c.perf.get(m), m) for m in table) + " |")
    return lines

LABEL_CHARS = 48  # what fits left of the axis at 10 px


def _middle_cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:(n - 1) // 2] + "…" + text[len(text) - (n - 1 - (n - 1) // 2):]


def short_labels(cell_ids: list[str]) -> list[str]:
    """Row labels that tell cells apart in little room: only the axes (model, load format,
    platform, image) that differ between the rows; when that is still too long, the longest
    axis value is shortened in its middle, again and again (the full id is the label's tooltip)."""
    parts = [cid.split("__") for cid in cell_ids]
    width = min((len(p) for p in parts), default=0)
    varying = [i for i in range(width) if len({p[i] for p in parts}) > 1] or list(range(width))
    labels = []
    for p in parts:
        values = [p[i] for i in varying] if len(p) == width else ["__".join(p)]
        while len(" · ".join(values)) > LABEL_CHARS and max(map(len, values)) > 5:
            longest = max(range(len(values)), key=lambda i: len(values[i]))
            values[longest] = _middle_cut(values[longest], len(values[longest]) - 1)
        labels.append(_middle_cut(" · ".join(values), LABEL_CHARS))
    return labels


def strip_svg(title: str, unit: str, rows: list[tuple[str, list[float]]]) -> Markup:
    """One row per cell, a dot per sample on a shared axis from 0 to the largest value, and a tick
    at each row's median; empty when no row has a sample."""
    return strip(title, unit, rows, short_labels([label for label, _ in rows]))
