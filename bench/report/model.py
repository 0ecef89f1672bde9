"""The one report object every output format receives (bench.report.summary.render_all)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.core.diagnosis import Diagnosis
from bench.core.records import CellSummary, Fingerprint, JobRecord, LogExcerpt, RequestRecord, RunRecord, Summary
from bench.core.verdicts import Verdict


@dataclass(frozen=True)
class Report:
    """What every report file shows: the judged run (bench.core.judge.judge), its records indexed
    by cell and repeat, the log excerpts, the diagnosis and the cluster jobs. Built once per
    report; every renderer takes it and only renders."""

    summary: Summary
    fingerprints: list[Fingerprint]
    all_runs: list[RunRecord] = field(default_factory=list)  # in the order the folder holds them
    runs: dict[str, dict[int, RunRecord]] = field(default_factory=dict)
    requests: dict[str, dict[int, list[RequestRecord]]] = field(default_factory=dict)
    excerpts: dict[str, dict[int, LogExcerpt]] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    jobs: Sequence[JobRecord] = ()

    @classmethod
    def of(
        cls,
        summary: Summary,
        runs: list[RunRecord],
        requests: list[RequestRecord],
        fingerprints: list[Fingerprint],
        excerpts: list[LogExcerpt],
        diagnosis: Diagnosis | None = None,
        jobs: Sequence[JobRecord] = (),
    ) -> Report:
        runs_of: dict[str, dict[int, RunRecord]] = defaultdict(dict)
        for r in runs:
            runs_of[r.cell_id][r.repeat] = r
        reqs_of: dict[str, dict[int, list[RequestRecord]]] = defaultdict(lambda: defaultdict(list))
        for q in requests:
            reqs_of[q.cell_id][q.repeat].append(q)
        excerpts_of: dict[str, dict[int, LogExcerpt]] = defaultdict(dict)
        for x in excerpts:
            excerpts_of[x.cell_id][x.repeat] = x
        return cls(summary=summary, fingerprints=fingerprints, all_runs=list(runs), runs=dict(runs_of),
                   requests={c: dict(by_repeat) for c, by_repeat in reqs_of.items()}, excerpts=dict(excerpts_of),
                   diagnosis=diagnosis, jobs=jobs)

    def runs_of(self, cell: CellSummary) -> dict[int, RunRecord]:
        return self.runs.get(cell.cell_id, {})

    def requests_of(self, cell: CellSummary) -> dict[int, list[RequestRecord]]:
        return self.requests.get(cell.cell_id, {})


def headline(summary: Summary) -> str:
    """The run in a few words, for every format: what the exit code means, with the cells that
    could not run on this host named as such, never as failures."""
    unrunnable = sum(1 for c in summary.cells if c.verdict == Verdict.NOT_RUNNABLE)
    elsewhere = f" ({unrunnable} not runnable on this host)" if unrunnable else ""
    if summary.exit_code == 0:
        return ("all runnable cells pass" if unrunnable else "all cells pass") + elsewhere
    if summary.exit_code == 2 and unrunnable:
        return "NO CELL RUNNABLE ON THIS HOST"
    return {1: "FAILURES" + elsewhere, 130: "INTERRUPTED"}.get(summary.exit_code, "")
