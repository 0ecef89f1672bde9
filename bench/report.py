"""Report: records → per-cell verdicts → summary.json, summary.md and the console table. Pure."""

from __future__ import annotations

from rich.table import Table

from bench.config import Config
from bench.judge import judge_cell, reference_outputs
from bench.matrix import Cell
from bench.records import CellSummary, Fingerprint, RequestRecord, RunRecord, Summary

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def summarize_cells(cells: list[Cell], runs: list[RunRecord], requests: list[RequestRecord]) -> list[CellSummary]:
    by_cell_runs: dict[str, list[RunRecord]] = {c.id: [] for c in cells}
    by_cell_reqs: dict[str, list[RequestRecord]] = {c.id: [] for c in cells}
    for r in runs:
        by_cell_runs.setdefault(r.cell_id, []).append(r)
    for q in requests:
        by_cell_reqs.setdefault(q.cell_id, []).append(q)
    out = []
    for cell in cells:
        reference = None
        if cell.baseline_id is not None:
            reference = reference_outputs(by_cell_runs[cell.baseline_id], by_cell_reqs[cell.baseline_id])
        out.append(judge_cell(cell, by_cell_runs[cell.id], by_cell_reqs[cell.id], reference))
    return out


def exit_code(cells: list[CellSummary], interrupted: bool) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_PASS if all(c.verdict == "pass" for c in cells) else EXIT_FAIL


def summarize(
    run_id: str,
    config: Config,
    cells: list[Cell],
    runs: list[RunRecord],
    requests: list[RequestRecord],
    started_at: float,
    finished_at: float,
    interrupted: bool,
) -> Summary:
    cell_summaries = summarize_cells(cells, runs, requests)
    return Summary(
        run_id=run_id,
        config_name=config.name,
        started_at=started_at,
        finished_at=finished_at,
        interrupted=interrupted,
        cells=cell_summaries,
        exit_code=exit_code(cell_summaries, interrupted),
    )


_MARK = {"pass": "PASS", "fail": "FAIL", "flaky": "FLAKY", "not run": "NOT RUN"}


def _reasons(c: CellSummary) -> str:
    parts = [f"{reason} ({n}/{c.runs})" for reason, n in c.reasons.items()]
    if c.divergence_positions:
        parts.append(f"first divergence at token {min(c.divergence_positions)}")
    return ", ".join(parts) or "-"


def markdown(summary: Summary, fingerprints: list[Fingerprint]) -> str:
    verdict = {0: "all cells pass", 1: "FAILURES", 130: "INTERRUPTED"}.get(summary.exit_code, "")
    lines = [
        f"# regbench {summary.config_name}: {verdict}",
        "",
        f"Run `{summary.run_id}`, {summary.finished_at - summary.started_at:.0f} s.",
        "",
        "| cell | verdict | failures/runs | reasons | baseline |",
        "|---|---|---|---|---|",
    ]
    for c in summary.cells:
        lines.append(
            f"| `{c.cell_id}` | **{_MARK[c.verdict]}** | {c.failures}/{c.runs} | {_reasons(c)} | "
            f"{'`' + c.baseline_id + '`' if c.baseline_id else '(is baseline)'} |"
        )
    examples = [c for c in summary.cells if c.example]
    if examples:
        lines += ["", "## First finding per failing cell", ""]
        lines += [f"- `{c.cell_id}`: {c.example}" for c in examples]
    if fingerprints:
        lines += ["", "## Environments", "", "| image | vLLM | runai-model-streamer | torch | CUDA | Python | arch | CPU | GPU |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for f in fingerprints:
            lines.append(
                f"| {f.image} | {f.vllm} | {f.runai_model_streamer} | {f.torch} | {f.cuda or '-'} | "
                f"{f.python} | {f.arch} | {f.cpu} | {f.gpu or '-'} |"
                + (f" probe error: {f.error}" if f.error else "")
            )
    return "\n".join(lines) + "\n"


_STYLE = {"pass": "green", "fail": "bold red", "flaky": "yellow", "not run": "dim"}


def table(summary: Summary) -> Table:
    t = Table(title=f"regbench {summary.config_name} — {summary.run_id}")
    for col in ("model", "load format", "platform", "image", "verdict", "fail/runs", "reasons"):
        t.add_column(col, overflow="fold")
    for c in summary.cells:
        t.add_row(c.model, c.load_format, c.platform, c.image, f"[{_STYLE[c.verdict]}]{_MARK[c.verdict]}[/]",
                  f"{c.failures}/{c.runs}", _reasons(c))
    return t
