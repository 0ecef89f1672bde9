"""The console view of a cell's history (`regbench history`): one table per cell, a row per run
in the order the runs started (or per point of a series, in the order --by names), then where it
broke. Renders only."""

from __future__ import annotations

import time

from rich.markup import escape
from rich.table import Table

from bench.core.perf import MIN_RUNS
from bench.core.verdicts import Verdict
from bench.history.model import ORDER_TEXT, CellHistory

_MARK = {Verdict.PASS: "PASS", Verdict.FAIL: "FAIL", Verdict.FLAKY: "FLAKY", Verdict.NOT_RUN: "NOT RUN",
         Verdict.NOT_RUNNABLE: "NOT RUNNABLE"}
_STYLE = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.FLAKY: "yellow", Verdict.NOT_RUN: "dim",
          Verdict.NOT_RUNNABLE: "dim"}


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def history_table(h: CellHistory) -> Table:
    # Time order is the view as it always was; another order is said in the title, the rows don't show it.
    title = h.cell_id if h.by == "time" else f"{h.cell_id}, {ORDER_TEXT[h.by]}"
    t = Table(title=escape(title), title_justify="left")
    for col in ("run", "started", "image", "vLLM", "streamer", "verdict", "fail/runs (failure rate)", "signature"):
        t.add_column(col, overflow="fold")
    for p in h.points:
        t.add_row(escape(p.run_id), _when(p.started_at), escape(p.image), escape(p.vllm or "?"),
                  escape(p.runai_model_streamer or "?"), f"[{_STYLE[p.verdict]}]{_MARK[p.verdict]}[/]",
                  p.rate(), escape(p.signature or "-"))
    return t


def regression_lines(h: CellHistory) -> list[str]:
    """Plain lines under the table: each break and how to narrow it, or that the cell never broke."""
    if not h.regressions:
        return [f"{h.cell_id}: no failing or flaky run in the history"]
    out = []
    for r in h.regressions:
        out.append(f"{h.cell_id}: {r.text()}")
        out += [f"  narrow {hint.text()}" for hint in r.bisect]
    return out


def slowdown_lines(h: CellHistory, window: int) -> list[str]:
    """Each run flagged slower than its window of good runs, or that none was; and the runs too
    small for the rule to flag at all."""
    if h.slowdowns:
        out = [f"{h.cell_id}: {s.text()}" for s in h.slowdowns]
    else:
        out = [f"{h.cell_id}: no run slower than the last {window} good runs before it"]
    unvalued = [p for p in h.points if p.perf and not p.values]
    if unvalued:
        out.append(f"{h.cell_id}: {len(unvalued)} run(s) stored without per-server values (before schema version 2, or "
                   "without the run's records): neither checked nor in a window")
    if h.too_few_runs:
        out.append(f"{h.cell_id}: {len(h.too_few_runs)} run(s) had fewer than {MIN_RUNS} fresh servers measuring "
                   "performance: not enough repeats to tell a slowdown")
    return out
