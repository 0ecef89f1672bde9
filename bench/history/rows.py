"""A judged run as the rows the run history stores (`regbench history`). Pure: no I/O.

A run enters the history as one `RunEntry`: its cells as `judge` judged them, the first signature
the diagnosis matched per failing cell, the fingerprints of its images and each cell's per-metric
median over its runs (`CellSummary.perf`). Nothing here judges again: a verdict is stored as the
judge gave it, so the history can never disagree with the run's own report.

How the rows are read back across runs (series, regressions, slowdowns) is bench.history.model's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pydantic import Field

from bench.core.diagnosis import Diagnosis
from bench.core.perf import run_values
from bench.core.records import Fingerprint, Record, RequestRecord, RunRecord, Summary
from bench.core.verdicts import Verdict

# What a history row keeps of a fingerprint: what tells one nightly's software from another's.
FINGERPRINT_FIELDS = ("image_ref", "image_pin", "image_digest", "vllm", "runai_model_streamer", "torch")


class StoredRun(Record):
    run_id: str
    config_name: str
    started_at: float
    finished_at: float
    exit_code: int
    interrupted: bool
    source: str  # the results folder it was ingested from, as given


class StoredCell(Record):
    run_id: str
    cell_id: str
    model: str
    load_format: str
    platform: str
    image: str
    knob: str | None = None
    verdict: Verdict
    failures: int
    runs: int
    interval: tuple[float, float] | None = None  # Wilson 95 % of the failure rate
    reasons: dict[str, int] = Field(default_factory=dict)
    signature: str | None = None  # the diagnosis's best match, for failing cells a signature explains


class StoredFingerprint(Record):
    run_id: str
    image: str
    image_ref: str | None = None
    image_pin: str | None = None
    image_digest: str | None = None
    vllm: str | None = None
    runai_model_streamer: str | None = None
    torch: str | None = None


class StoredPerf(Record):
    run_id: str
    cell_id: str
    metric: str  # a key of bench.core.perf.METRICS
    median: float  # the median over the cell's runs of each run's value
    runs: int
    samples: int


class StoredRunValue(Record):
    """One fresh server's value of one metric (a request-level metric: the median of its requests):
    what the slowdown rule resamples. The cell's `StoredPerf.median` is the median of these."""

    run_id: str
    cell_id: str
    metric: str
    repeat: int
    value: float


class RunEntry(Record):
    """One run as the history stores it: all its rows, or none of them."""

    run: StoredRun
    cells: list[StoredCell]
    fingerprints: list[StoredFingerprint]
    perf: list[StoredPerf]
    values: list[StoredRunValue] = Field(default_factory=list)


def run_values_of(summary: Summary, runs: Iterable[RunRecord], requests: Iterable[RequestRecord]) -> list[StoredRunValue]:
    """Per cell, metric and fresh server, the value `judge`'s cell_perf took its median over: the
    same runs (not interrupted) and the same per-run rule (bench.core.perf.run_values)."""
    runs_of: dict[str, dict[int, RunRecord]] = defaultdict(dict)
    for r in runs:
        if not r.interrupted:
            runs_of[r.cell_id][r.repeat] = r  # a repeat recorded twice: its last record, as the folder reads
    reqs_of: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for q in requests:
        reqs_of[(q.cell_id, q.repeat)].append(q)
    out = []
    for c in summary.cells:
        for repeat, run in sorted(runs_of.get(c.cell_id, {}).items()):
            for metric, values in run_values([run], reqs_of.get((c.cell_id, repeat), [])).items():
                out.append(StoredRunValue(run_id=summary.run_id, cell_id=c.cell_id, metric=metric, repeat=repeat,
                                          value=values[0]))
    return out


def entry_of(summary: Summary, diagnosis: Diagnosis, fingerprints: list[Fingerprint], source: str,
             runs: Iterable[RunRecord] = (), requests: Iterable[RequestRecord] = ()) -> RunEntry:
    """A judged run (bench.core.judge.judge) and its diagnosis as history rows; with the run's
    records, each server's performance values too."""
    run_id = summary.run_id
    first_match = {d.cell_id: d.matches[0].signature for d in diagnosis.cells if d.matches}
    cells = [StoredCell(
        run_id=run_id, cell_id=c.cell_id, model=c.model, load_format=c.load_format, platform=c.platform, image=c.image,
        knob=c.knob, verdict=c.verdict, failures=c.failures, runs=c.runs, interval=c.failure_rate_interval,
        reasons={str(r): n for r, n in sorted(c.reasons.items())}, signature=first_match.get(c.cell_id),
    ) for c in summary.cells]
    # An image fingerprinted twice (a resumed run) keeps its last fingerprint, as the reports do.
    prints = {f.image: f for f in fingerprints}
    stored_prints = [StoredFingerprint(run_id=run_id, image=image, **{k: getattr(f, k) for k in FINGERPRINT_FIELDS})
                     for image, f in sorted(prints.items())]
    perf = [StoredPerf(run_id=run_id, cell_id=c.cell_id, metric=name, median=m.run_median, runs=m.runs,
                       samples=m.samples)
            for c in summary.cells for name, m in sorted(c.perf.items())]
    run = StoredRun(run_id=run_id, config_name=summary.config_name, started_at=summary.started_at,
                    finished_at=summary.finished_at, exit_code=summary.exit_code, interrupted=summary.interrupted,
                    source=source)
    return RunEntry(run=run, cells=cells, fingerprints=stored_prints, perf=perf,
                    values=run_values_of(summary, runs, requests))
