"""The console views of `regbench inspect` and `regbench audit`: their reports as rich renderables.

The JSON of both commands is the reports' own dump (bench.weights.model); these are the human
output only.
"""

from __future__ import annotations

import os

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from bench.core.diagnosis import stream_stop_releases
from bench.weights.model import AuditReport, AuditRun, CheckpointReport

SHOWN = 5  # names behind a failing audit run; the JSON has all of them


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def render_checkpoint(report: CheckpointReport) -> list[RenderableType]:
    """The console view of a report: a shard table, then census, quantization, risk, problems."""
    empty = len(report.empty_shards)
    if report.index is None:
        index = "no index"
    elif report.index.error is not None:
        index = "index unreadable"
    else:
        index = f"index names {len(report.index.files)} shard(s), {report.index.tensors} tensor(s)"
    head = Text(f"{report.path}: {len(report.shards)} shard(s) ({empty} empty), {report.tensor_count} tensors, "
                f"{human_size(report.data_bytes)} of weights; {index}")
    listed = {f: i + 1 for i, f in enumerate(report.listing_order)}
    shards = Table(box=None, pad_edge=False)
    for col in ("shard", "listed", "tensors", "size", "dtypes", "in index"):
        shards.add_column(col, justify="right" if col in ("listed", "tensors", "size") else "left", overflow="fold")
    for s in report.shards:
        in_index = {None: "-", True: "yes", False: "no"}[s.in_index]
        if s.error:
            tensors = Text("unreadable", style="red")
        else:
            tensors = Text(str(len(s.tensors)), style="yellow" if s.empty else "")
        shards.add_row(Text(s.file), str(listed[s.file]), tensors, human_size(s.size),
                       ", ".join(s.dtypes) or "-", in_index)

    dtypes = ", ".join(f"{d.dtype} {d.tensors} tensor(s), {human_size(d.bytes)}" for d in report.dtypes)
    scales = ", ".join(f"{s.suffix} {s.tensors} ({', '.join(s.dtypes)})" for s in report.scales)
    lines = [Text(f"dtypes: {dtypes or 'none'}"), Text(f"scale tensors: {scales or 'none'}")]
    lines += [Text("quantization: " + ("; ".join(
        f"{q.source}: {q.method or '(no method named)'}" for q in report.quantization) or "none"))]
    lines.append(Text(f"stream stop ({stream_stop_releases()}):"))
    for stop in report.stream_stops:
        if stop.risk:
            lines.append(Text(f"  {stop.order:8} {stop.describe()}", style="red"))
        else:
            lines.append(Text(f"  {stop.order:8} safe: no empty shard begins a request", style="green"))
    lines += [Text(f"note: {n}", style="dim") for n in report.notes]
    if report.problems:
        lines.append(Text(f"{len(report.problems)} problem(s):", style="bold red"))
        lines += [Text(f"  {p.kind}: {p.message}") for p in report.problems]
    else:
        lines.append(Text("no problems", style="bold green"))
    return [head, shards, *lines]


def details(run: AuditRun) -> list[str]:
    """The first few names behind a failing run's summary line, for the human output."""
    out = []
    for label, names in (("missing", run.missing), ("unknown", run.extra), ("duplicated", run.duplicated)):
        if names:
            more = f" … and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            out.append(f"{label}: {', '.join(names[:SHOWN])}{more}")
    for m in run.mismatched[:SHOWN]:
        out.append(f"{m.name}: {m.field} {m.expected} in the file, {m.got} delivered")
    return out


def _reader_times(report: AuditReport) -> str:
    parts = []
    if report.reader_import_seconds is not None:
        parts.append(f"importing torch and the streamer {report.reader_import_seconds:.2f} s")
    if report.reader_vllm_seconds is not None:
        parts.append(f"loading vLLM's iterator {report.reader_vllm_seconds:.2f} s")
    parts.append(f"{len(report.runs)} run(s) {sum(r.seconds or 0 for r in report.runs):.2f} s")
    return f"{report.reader_seconds:.2f} s, of which " + ", ".join(parts)


def verdict_line(report: AuditReport) -> str:
    """The audit's last line when runs failed: how many lost or altered weights silently, and how
    many failed loudly (the loader raised, timed out or its reader died: an error, not silence)."""
    failed = [r for r in report.runs if r.problem]
    loud = [r for r in failed if r.error]
    silent = [r for r in failed if not r.error]
    parts = []
    if silent:
        parts.append(f"{len(silent)} run(s) lost or altered weights silently")
    if loud:
        errors = list(dict.fromkeys(r.error for r in loud if r.error))
        parts.append(f"{len(loud)} run(s) failed loudly ({errors[0]}" + (f", and {len(errors) - 1} other error(s))"
                                                                        if len(errors) > 1 else ")"))
    return "; ".join(parts) or f"{len(report.problems)} problem(s)"


def render_audit(report: AuditReport) -> list[RenderableType]:
    """The console view: what streamed, the baseline, one line per run, the names behind failures."""
    overlay = f" (PYTHONPATH {os.pathsep.join(report.pythonpath)})" if report.pythonpath else ""
    if report.image is not None:
        mounted = f", overlay {', '.join(report.overlays)} mounted" if report.overlays else ""
        overlay += f" in a container of {report.image}{mounted}"
    env = " ".join(f"{k}={v}" for k, v in report.env.items())
    out: list[RenderableType] = [
        Text(f"{report.path}: runai-model-streamer {report.streamer_version} from {report.streamer_path}, "
             f"torch {report.torch_version}, vLLM {report.vllm_version or 'not imported'}; {report.python}{overlay}"
             + (f"; env {env}" if env else "")),
        Text(f"baseline: {report.baseline_tensors} tensors, {human_size(report.baseline_bytes)} hashed in "
             f"{report.baseline_seconds:.2f} s"),
    ]
    if report.reader_seconds is not None:
        out.append(Text(f"reader: {_reader_times(report)}", style="dim"))
    if report.vllm_iterator:
        out.append(Text(f"loader=vllm: {report.vllm_iterator}", style="dim"))
    out += [Text(f"loader={s.loader} skipped: {s.reason}", style="yellow") for s in report.skipped]
    for run in report.runs:
        mark, style = ("✓ ", "green") if run.ok else ("? ", "yellow") if run.unsupported else ("✗ ", "red")
        out.append(Text(mark + run.line(with_stop=False), style=style))
        if run.stop is not None:
            out.append(Text(f"    {run.stop.describe()}", style="red"))
        out += [Text(f"    {d}") for d in details(run)]
    if report.checkpoint_problems:
        out.append(Text(f"inspect found {len(report.checkpoint_problems)} problem(s) in the checkpoint "
                        "(`regbench inspect` for details)", style="yellow"))
    if report.problems:
        out.append(Text(verdict_line(report), style="bold red"))
    elif report.unsupported:
        out.append(Text("nothing audited: the reader cannot drive this loader version", style="bold yellow"))
    else:
        out.append(Text("every tensor arrived intact in every run", style="bold green"))
    return out
