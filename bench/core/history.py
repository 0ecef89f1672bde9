"""The run history in memory (`regbench history`). Pure: judged runs in, rows and trends out.

A run enters the history as one `RunEntry`: its cells as `judge` judged them, the first signature
the diagnosis matched per failing cell, the fingerprints of its images and each cell's per-metric
median over its runs (`CellSummary.perf`). Nothing here judges again: a verdict is stored as the
judge gave it, so the history can never disagree with the run's own report.

Across runs a cell is read in the order the runs started. A *regression* is the first run where
the cell's verdict is fail or flaky after a run where it passed; the run before it that passed is
its *last good* run. Flaky counts as broken: a cell that fails one run in five after passing
twenty is the nightly a release manager wants named. Runs where the cell did not run (not in the
matrix, NOT RUN) neither break nor mend it. A cell that never passed before failing has no last
good run, and says so; one that passes again names the run that fixed it.
"""

from __future__ import annotations

from pydantic import Field

from bench.core.diagnosis import Diagnosis
from bench.core.matrix import matrix_image
from bench.core.records import Fingerprint, Record, Summary
from bench.core.stats import percent_range
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


class RunEntry(Record):
    """One run as the history stores it: all its rows, or none of them."""

    run: StoredRun
    cells: list[StoredCell]
    fingerprints: list[StoredFingerprint]
    perf: list[StoredPerf]


def entry_of(summary: Summary, diagnosis: Diagnosis, fingerprints: list[Fingerprint], source: str) -> RunEntry:
    """A judged run (bench.core.judge.judge) and its diagnosis as history rows."""
    run_id = summary.run_id
    first_match = {d.cell_id: d.matches[0].signature for d in diagnosis.cells if d.matches}
    cells = [StoredCell(
        run_id=run_id, cell_id=c.cell_id, model=c.model, load_format=c.load_format, platform=c.platform, image=c.image,
        knob=c.knob, verdict=c.verdict, failures=c.failures, runs=c.runs, interval=c.failure_rate_interval,
        reasons={str(r): n for r, n in sorted(c.reasons.items())}, signature=first_match.get(c.cell_id),
    ) for c in summary.cells]
    # An image probed twice (a resumed run) keeps its last probe, as the reports do.
    prints = {f.image: f for f in fingerprints}
    stored_prints = [StoredFingerprint(run_id=run_id, image=image, **{k: getattr(f, k) for k in FINGERPRINT_FIELDS})
                     for image, f in sorted(prints.items())]
    perf = [StoredPerf(run_id=run_id, cell_id=c.cell_id, metric=name, median=m.run_median, runs=m.runs,
                       samples=m.samples)
            for c in summary.cells for name, m in sorted(c.perf.items())]
    run = StoredRun(run_id=run_id, config_name=summary.config_name, started_at=summary.started_at,
                    finished_at=summary.finished_at, exit_code=summary.exit_code, interrupted=summary.interrupted,
                    source=source)
    return RunEntry(run=run, cells=cells, fingerprints=stored_prints, perf=perf)


class CellPoint(Record):
    """One cell in one run, as `regbench history` shows it."""

    run_id: str
    started_at: float
    image: str
    vllm: str | None
    runai_model_streamer: str | None
    torch: str | None
    image_digest: str | None
    verdict: Verdict
    failures: int
    runs: int
    interval: tuple[float, float] | None
    reasons: dict[str, int]
    signature: str | None
    perf: dict[str, float]  # metric -> median over the cell's runs

    @property
    def good(self) -> bool:
        return self.verdict == Verdict.PASS

    @property
    def broken(self) -> bool:
        return self.verdict.failing

    def rate(self) -> str:
        interval = f" ({percent_range(*self.interval)})" if self.interval else ""
        return f"{self.failures}/{self.runs}{interval}"


class Regression(Record):
    """Where a cell broke: the first run failing or flaky, and the last run before it that passed
    (None: it never passed before), and the first run after it that passed again, if any."""

    first_bad: str
    verdict: Verdict  # at first_bad
    last_good: str | None
    fixed_in: str | None = None
    changed: dict[str, tuple[str | None, str | None]] = Field(default_factory=dict)  # fingerprint field -> (last good, first bad)

    def text(self) -> str:
        before = (f"last good {self.last_good}" if self.last_good is not None
                  else "no good run before it in the history")
        changes = "; changed: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in self.changed.items()) if self.changed else ""
        fixed = f"; passes again from {self.fixed_in}" if self.fixed_in else "; not passing since"
        return f"first {self.verdict.value.upper()} in {self.first_bad}, {before}{changes}{fixed}"


class CellHistory(Record):
    cell_id: str
    points: list[CellPoint]  # in the order the runs started
    regressions: list[Regression]


def ordered(runs: list[StoredRun]) -> list[StoredRun]:
    """By start time; run ids break ties (they begin with the start time, to the second)."""
    return sorted(runs, key=lambda r: (r.started_at, r.run_id))


def regressions(points: list[CellPoint]) -> list[Regression]:
    """Each time the cell went from passing (or from the start of the history) to failing or flaky,
    oldest first."""
    out: list[Regression] = []
    last_good: CellPoint | None = None
    open_: Regression | None = None
    for p in points:
        if p.good:
            if open_ is not None:
                open_.fixed_in = p.run_id
                open_ = None
            last_good = p
        elif p.broken and open_ is None:
            changed = {}
            if last_good is not None:
                for field in ("vllm", "runai_model_streamer", "torch", "image_digest"):
                    a, b = getattr(last_good, field), getattr(p, field)
                    if a != b:
                        changed[field] = (a, b)
            open_ = Regression(first_bad=p.run_id, verdict=p.verdict,
                               last_good=last_good.run_id if last_good else None, changed=changed)
            out.append(open_)
    return out


def cell_histories(
    runs: list[StoredRun], cells: list[StoredCell], fingerprints: list[StoredFingerprint], perf: list[StoredPerf],
) -> list[CellHistory]:
    """Every cell across the runs given, cells in id order, each cell's runs by start time."""
    order = {r.run_id: (i, r) for i, r in enumerate(ordered(runs))}
    # A knob's cell runs its original image: one fingerprint for both.
    prints = {(f.run_id, f.image): f for f in fingerprints}
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for m in perf:
        medians.setdefault((m.run_id, m.cell_id), {})[m.metric] = m.median
    by_cell: dict[str, list[CellPoint]] = {}
    for c in sorted((c for c in cells if c.run_id in order), key=lambda c: (c.cell_id, order[c.run_id][0])):
        fp = prints.get((c.run_id, matrix_image(c.image)))
        by_cell.setdefault(c.cell_id, []).append(CellPoint(
            run_id=c.run_id, started_at=order[c.run_id][1].started_at, image=c.image,
            vllm=fp.vllm if fp else None, runai_model_streamer=fp.runai_model_streamer if fp else None,
            torch=fp.torch if fp else None, image_digest=fp.image_digest if fp else None,
            verdict=c.verdict, failures=c.failures, runs=c.runs, interval=c.interval, reasons=c.reasons,
            signature=c.signature, perf=medians.get((c.run_id, c.cell_id), {}),
        ))
    return [CellHistory(cell_id=cid, points=points, regressions=regressions(points)) for cid, points in by_cell.items()]
