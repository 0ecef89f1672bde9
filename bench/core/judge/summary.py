"""The verdicts of a results folder: every cell judged over its runs against its baseline. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from bench.core.config import Comparison
from bench.core.judge.baseline import Baseline, baseline_of
from bench.core.judge.cells import apply_cell_checks, exit_code, judge_cell
from bench.core.judge.runs import run_findings
from bench.core.matrix import Cell, expand, matrix_image
from bench.core.records import (
    Summary,
)
from bench.core.results import Results
from bench.core.verdicts import (
    Finding,
)


def judge(results: Results, comparison: Comparison | None = None, only: Iterable[str] | None = None) -> Summary:
    """The verdicts of a run: every finding about every planned cell's runs, made here from what
    was observed (records, requests, server logs), and each cell judged over its runs against
    its baseline.

    The one place findings and verdicts are made; the runner (at the end and for its progress
    line), `report`, `compare`, `diagnose`, `merge`, `report-bug`, `history` and the Slurm
    collection all call it. `comparison`: the rule to judge by instead of each cell's own
    (`comparison`, a knob's block's), e.g. `report --compare-mode`. `only`: judge just these cells
    (their baselines are still read), as the progress line does after each run."""
    config = results.config
    cells = results.cells()
    if comparison is not None:
        cells = [c.model_copy(update={"comparison": comparison}) for c in cells]
    by_id = {c.id: c for c in cells}
    if only is not None:
        wanted = set(only)
        cells = [c for c in cells if c.id in wanted]
    audits = {(p.model, p.image, p.load_format): p for p in results.preflights if p.kind == "audit"}
    own_of: dict[str, dict[int, list[Finding]]] = {}

    def own(cell: Cell) -> dict[int, list[Finding]]:
        if cell.id not in own_of:
            requests = results.requests_of(cell.id)
            own_of[cell.id] = {r.repeat: run_findings(cell, r, requests, results.log_of(r), cell.comparator)
                               for r in results.runs_of(cell.id) if not r.interrupted}
        return own_of[cell.id]

    # Many cells share one baseline: work it out once.
    baselines: dict[tuple[str, bool], Baseline] = {}
    out = []
    for cell in cells:
        baseline = None
        if cell.baseline_id is not None:
            key = (cell.baseline_id, cell.knob is not None)
            if key not in baselines:
                # A baseline from another slice is not in this folder's plan: the matrix has it.
                base = by_id.get(cell.baseline_id) or next(
                    (c for c in expand(config) if c.id == cell.baseline_id), None)
                baselines[key] = baseline_of(
                    results.runs_of(cell.baseline_id), results.requests_of(cell.baseline_id),
                    own(base) if base is not None else {}, as_answered=key[1])
            baseline = baselines[key]
        runs = results.runs_of(cell.id)
        summary = judge_cell(cell, runs, results.requests_of(cell.id), own(cell), baseline, cell.comparator,
                             cell.reference_text)
        audit = audits.get((cell.model.name, matrix_image(cell.image.name), cell.load_format.name))
        out.append(apply_cell_checks(summary, runs, audit))
    started, finished = results.span()
    interrupted = results.interrupted()
    return Summary(
        run_id=results.run_id,
        config_name=config.name,
        started_at=started,
        finished_at=finished,
        interrupted=interrupted,
        cells=out,
        exit_code=exit_code(out, interrupted),
        preflight=list(results.preflights),
    )
