"""Results: everything one results folder holds, in memory, grouped by cell.

Loaded once from a folder (bench.store.results.ResultsDir.load) and appended to by the runner
as it writes each record, so that judging after a run (or after each run, for the progress
line) reads nothing back from disk. The judge (bench.core.judge.judge) takes one of these and
nothing else.

The plan (plan.json) is a record of its own, written when a run starts: the cells this run
(or this slice of a run) set out to do. A cell planned but never run is judged NOT RUN; a cell
of the matrix that was not planned (another slice's) is not judged at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

from bench.core.config import Config
from bench.core.matrix import Cell, expand
from bench.core.records import Fingerprint, JobRecord, PreflightRecord, Record, RequestRecord, RunRecord, ServerLog


class RunPlan(Record):
    """plan.json: what a run set out to do and when. Written when the run starts (and when a
    resumed run starts again), completed when it ends; a killed bench leaves it without an end."""

    type: Literal["plan"] = "plan"
    run_id: str
    config_name: str
    cells: list[str]  # the planned cells' ids, in matrix order
    started_at: float
    finished_at: float | None = None  # None: the bench never got to finish (killed)
    interrupted: bool = False


@dataclass
class Results:
    config: Config
    plan: RunPlan
    runs: list[RunRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    fingerprints: list[Fingerprint] = field(default_factory=list)
    preflights: list[PreflightRecord] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)
    # Each finished run's server log as the judge reads it, by (cell id, repeat); a run whose log
    # is gone has none (its recorded findings stand in: bench.core.judge.LOG_ONLY_REASONS).
    logs: dict[tuple[str, int], ServerLog] = field(default_factory=dict)
    # Workers append from their threads while another thread judges for the progress line.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def add_run(self, record: RunRecord, log: ServerLog | None = None) -> None:
        with self._lock:
            self.runs.append(record)
            if log is not None:
                self.logs[(record.cell_id, record.repeat)] = log

    def log_of(self, record: RunRecord) -> ServerLog | None:
        with self._lock:
            return self.logs.get((record.cell_id, record.repeat))

    def add_request(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)

    def add_fingerprint(self, record: Fingerprint) -> None:
        with self._lock:
            self.fingerprints.append(record)

    def add_preflight(self, record: PreflightRecord) -> None:
        with self._lock:
            self.preflights.append(record)

    def runs_of(self, cell_id: str) -> list[RunRecord]:
        with self._lock:
            return [r for r in self.runs if r.cell_id == cell_id]

    def requests_of(self, cell_id: str) -> list[RequestRecord]:
        with self._lock:
            return [q for q in self.requests if q.cell_id == cell_id]

    def cells(self) -> list[Cell]:
        """The cells to judge, in matrix order: those planned, and any that ran (a slice merged in)."""
        with self._lock:
            wanted = set(self.plan.cells) | {r.cell_id for r in self.runs}
        return [c for c in expand(self.config) if c.id in wanted]

    def span(self) -> tuple[float, float]:
        """When the run started and ended: the plan's times, or, where a killed bench never wrote
        its end, the end of its last server."""
        if self.plan.finished_at is not None:
            return self.plan.started_at, self.plan.finished_at
        with self._lock:
            ends = [r.server.started_at + sum(x for x in (r.server.boot_s, r.requests_s, r.server.shutdown_s) if x)
                    for r in self.runs]
        return self.plan.started_at, max(ends, default=self.plan.started_at)

    def interrupted(self) -> bool:
        if self.plan.finished_at is not None:
            return self.plan.interrupted
        with self._lock:
            return self.plan.interrupted or any(r.interrupted for r in self.runs)


def plan_for(run_id: str, config: Config, cells: list[Cell], started_at: float) -> RunPlan:
    return RunPlan(run_id=run_id, config_name=config.name, cells=[c.id for c in cells], started_at=started_at)
