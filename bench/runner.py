"""The orchestrator: cells → launch → requests → verdicts → report, writing as it goes.

The only module that ties the pure core (config, matrix, judge, report) to the I/O edges
(launch, client, results files). ``run_matrix`` is four parts, each usable alone:
``prepare`` (pre-flight, fingerprints), a ``Schedule`` (which run next, early stop), the
``Workers`` (one thread per device slot, plus one for cells run one at a time) that each run
``run_one`` (one fresh server), and ``finish`` (verdicts and report files).

Stopping has one path: a ``bench.core.stop.StopToken``. Ctrl-C or SIGTERM in the calling thread and a
worker's fatal error both set it; every wait looks at it; a run it cut short is recorded as
interrupted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Protocol, TypeVar

from bench.core.config import Config, ConfigError
from bench.core.judge import judge, observed, run_counts
from bench.core.logfacts import log_facts
from bench.core.matrix import Cell, expand
from bench.core.perf import run_perf
from bench.core.records import (
    Devices,
    Finding,
    PreflightRecord,
    Reason,
    ReferenceScore,
    RequestRecord,
    RunPerf,
    RunRecord,
    ServerMetrics,
    ServerOutcome,
    Summary,
    TokenDiff,
)
from bench.core.results import plan_for
from bench.core.stats import verdict_settled
from bench.core.stop import Stopped, StopToken
from bench.serve.client import run_workload, score_reference
from bench.serve.errors import BootError
from bench.serve.launch import serve_args, server_env
from bench.serve.launchers import backend, open_launcher
from bench.serve.memory import Settler, gpu_memory_utilization
from bench.serve.metrics import ScrapeError, delta, scrape
from bench.serve.platforms import HostCheck, check_host, not_runnable_server
from bench.serve.protocols import LaunchedServer, Launcher
from bench.serve.slots import SlotPool
from bench.store.publish import Published, write_reports
from bench.store.results import ResultsDir, read_log_bytes
from bench.weights.checkpoint import safetensors_bytes
from bench.weights.hub import resolve_models
from bench.weights.preflight import preflight

T = TypeVar("T")
_POLL_S = 0.2


class Progress(Protocol):
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> None:
        """`findings`: the run's own, as the judge made them (bench.core.judge.observed).
        `divergence`: where the run's outputs differ from its baseline cell's ([] when they
        match or the cell has no baseline); None while the baseline has no clean run to compare
        with, so a run without findings of its own cannot be called a pass yet."""


class NoProgress:
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> None: ...


def run_divergence(cell: Cell, record: RunRecord, results: ResultsDir) -> list[TokenDiff] | None:
    """The run's divergence from its baseline as the judge sees it now, None while the baseline
    has no clean run yet (see Progress.run_done). From the folder in memory: nothing read back."""
    if cell.baseline_id is None or record.interrupted:
        return []
    data = results.data
    [summary] = judge(data, only=[cell.id]).cells
    result = next((r for r in summary.run_results if r.repeat == record.repeat), None)
    if result is None or result.baseline_pending:
        return None
    return result.divergence


async def _until_stopped(work: Awaitable[T], stop: StopToken) -> T:
    task = asyncio.ensure_future(work)
    while True:
        finished, _ = await asyncio.wait({task}, timeout=_POLL_S)
        if finished:
            return task.result()
        if stop.stopped:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            raise Stopped(stop.reason)


@dataclasses.dataclass
class _Observed:
    """What a run's server was seen to do, filled in as it happens: a run cut short keeps what
    came before the cut."""

    requests: list[RequestRecord] = dataclasses.field(default_factory=list)
    requests_s: float | None = None
    reference: ReferenceScore | None = None
    metrics: ServerMetrics | None = None


def run_one(
    config: Config, cell: Cell, repeat: int, launcher: Launcher, results: ResultsDir,
    status: Callable[[str], None], devices: Devices | None = None, stop: StopToken | None = None,
    refused: str | None = None,
) -> RunRecord:
    """One fresh server: boot, send the workload, stop, record what was observed (the judge
    makes the findings from it). When `stop` is set meanwhile the server is taken down and the
    run is recorded as interrupted (never judged). `refused`: why the cell cannot run on this
    host (bench.serve.platforms.check_host): recorded as such, no server started."""
    stop = stop or StopToken()
    run_dir = results.run_dir(cell.id, repeat)
    server = _server_for(cell, repeat, launcher, run_dir, status, devices, stop, refused)
    seen = _Observed()
    try:
        status(f"{cell.id} #{repeat}: booting")
        with server:
            _serve(server, cell, repeat, results, status, stop, seen)
    except BootError:
        pass  # the outcome says how; judged below like any other run
    except Stopped:
        pass  # an interrupted run: below
    finally:
        # Interrupted also when the stop came while the server booted or stopped, after the waits
        # that watch for it: it may have reached the server as well (at a job's time limit Slurm
        # signals every process of the job), so how it then booted or exited is not its own doing.
        # Also on the way out of an error (results that cannot be written): what is known of
        # the run is recorded if it can be.
        interrupted = stop.stopped
        record = _run_record(config, cell, repeat, results, server.outcome, seen, interrupted)
        results.add_run(record)
    return record


def _server_for(cell: Cell, repeat: int, launcher: Launcher, run_dir: Path, status: Callable[[str], None],
                devices: Devices | None, stop: StopToken, refused: str | None) -> LaunchedServer:
    """The run's server: the launcher's, or one never started that says why (`refused` on this
    host, or too little memory for vLLM to start, bench.serve.memory)."""
    if refused is not None:
        return not_runnable_server(refused, run_dir)
    short = _settle(launcher, run_dir, status, cell) if cell.profile.unified_memory else None
    if short is not None:
        return not_runnable_server(short, run_dir)
    return launcher.server(cell, repeat, run_dir, devices, stop)


def _serve(server: LaunchedServer, cell: Cell, repeat: int, results: ResultsDir, status: Callable[[str], None],
           stop: StopToken, seen: _Observed) -> None:
    """The workload, the server's counters over it, then the reference text's score, on a booted server."""
    status(f"{cell.id} #{repeat}: serving")
    before = _scrape(server.base_url)
    t0 = time.monotonic()
    seen.requests = asyncio.run(_until_stopped(
        run_workload(server.base_url, cell.model.served, cell.workload,
                     cell_id=cell.id, repeat=repeat, top_k=cell.logprobs_k, on_record=results.add_request),
        stop,
    ))
    seen.requests_s = time.monotonic() - t0
    # Before the reference text is scored: the counters must cover the workload alone.
    seen.metrics = _counters(before, server.base_url)
    reference_text = cell.reference_text
    if reference_text.enabled:
        seen.reference = asyncio.run(_until_stopped(score_reference(
            server.base_url, cell.model.served, reference_text.passage, cell.workload.request_timeout_s), stop))
    status(f"{cell.id} #{repeat}: stopping")


def _run_record(config: Config, cell: Cell, repeat: int, results: ResultsDir, outcome: ServerOutcome,
                seen: _Observed, interrupted: bool) -> RunRecord:
    """What was observed, no more: the judge makes the findings (bench.core.judge.judge)."""
    log = Path(outcome.log_path)
    return RunRecord(
        cell_id=cell.id, repeat=repeat,
        server=outcome.model_copy(update={"log_path": os.path.relpath(log, results.path)}),
        requests_s=seen.requests_s, reference=seen.reference, interrupted=interrupted,
        perf=_perf(config, cell, outcome, seen.requests, seen.requests_s, seen.metrics),
    )


_SETTLERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # launcher -> Settler (one per bench run)


def _settle(launcher: Launcher, run_dir: Path, status: Callable[[str], None], cell: Cell | None = None) -> str | None:
    """Unified memory (GPU allocations are host memory): before a fresh server, memory back near
    its level before the previous one, and at least what the cell's server asks for
    (bench.serve.memory.Settler); the wait is said and kept in the run's folder as
    memory-settle.json. Returns why the server must not be started (vLLM would refuse it)."""
    settler = _SETTLERS.setdefault(launcher, Settler())
    utilization = None if cell is None else gpu_memory_utilization(serve_args(cell, cell.server, 0, cell.model.path))
    done = settler.before_boot(utilization)
    if done is None:
        return None
    status(done.text())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "memory-settle.json").write_text(json.dumps(dataclasses.asdict(done)) + "\n")
    return done.refused


def _scrape(base_url: str) -> dict[str, float] | str:
    try:
        return scrape(base_url)
    except ScrapeError as exc:
        return str(exc)


def _counters(before: dict[str, float] | str, base_url: str) -> ServerMetrics:
    after = _scrape(base_url)
    if isinstance(before, str) or isinstance(after, str):
        return ServerMetrics(error=before if isinstance(before, str) else str(after))
    return delta(before, after)


def _perf(config: Config, cell: Cell, outcome: ServerOutcome, requests: list[RequestRecord], requests_s: float | None,
          metrics: ServerMetrics | None) -> RunPerf:
    facts = None
    log = Path(outcome.log_path)
    if outcome.boot_s is not None and log.is_file():
        end = outcome.stop_requested_at_byte if outcome.stop_requested_at_byte is not None else log.stat().st_size
        facts = log_facts(read_log_bytes(log, 0, end).decode("utf-8", errors="replace"))
    # Object storage is read under the variables the server gets (endpoint, credentials).
    env = {**os.environ, **server_env(cell, cell.server, cell.profile)}
    return run_perf(outcome, facts, requests, requests_s, metrics, safetensors_bytes(cell.model.path, env))


def check_devices(config: Config, cells: list[Cell]) -> None:
    """Raises ConfigError for a cell that needs more devices than its platform lists (pure)."""
    for cell in cells:
        profile = config.profile(cell.platform)
        need = cell.model.tensor_parallel_size
        if profile.devices and need > len(profile.devices):
            raise ConfigError(
                f"{cell.id} needs {need} devices (tensor_parallel_size) and platform "
                f"{profile.name} lists {len(profile.devices)}: {profile.devices}"
            )


def device_pools(config: Config, cells: list[Cell], locks: Path | None = None,
                 host: HostCheck | None = None) -> dict[str, SlotPool]:
    """A pool per platform whose profile lists devices; of those `host` found here, when given."""
    check_devices(config, cells)
    host = host or HostCheck()
    pools = {}
    for profile in {config.profile(c.platform).name: config.profile(c.platform) for c in cells}.values():
        if devices := host.devices(profile):
            pools[profile.name] = SlotPool(profile.device_kind, devices, locks, lock_names=host.locks(profile))
    return pools


def pin_images(cells: list[Cell], results: ResultsDir, launcher: Launcher,
               status: Callable[[str], None]) -> list[Cell]:
    """Each image resolved once for the run by a launcher that pulls images (the docker
    launcher's `resolve_images`: the pull policy applied once, every container pinned to the
    digest; a resumed run to the pin its fingerprint recorded). Returns the cells with their
    images as pinned, for what starts its own containers (the pre-flight audit); raises the
    launcher's error (a ConfigError) before any cell when an image cannot be had."""
    images = list({c.image.name: c.image for c in cells}.values())
    if not any(i.ref for i in images):
        return cells
    status("resolving images: " + ", ".join(i.ref for i in images if i.ref))
    refs = {i.name: i.ref for i in images}
    earlier = {f.image: f.image_pin for f in results.data.fingerprints
               if f.image_pin and f.image_ref == refs.get(f.image)}
    pinned = launcher.resolve_images(images, earlier)
    # An image with no build for this host is left out (no audit of it): its cells say why, each
    # at its first run.
    absent = launcher.not_here()
    for name, why in absent.items():
        status(f"image {name}: {why}")
    return [c.model_copy(update={"image": pinned[c.image.name]}) if c.image.name in pinned else c for c in cells
            if c.image.name not in absent]


def matrix_cells(cells: list[Cell]) -> list[Cell]:
    """The cells of the matrix without the knobs' (`invariance`): a knob's cell runs its
    original's image and weights, resolved, fingerprinted and audited once for both."""
    return [c for c in cells if c.knob is None]


def _resolution(fetch: PreflightRecord) -> tuple[str, str | None, str | None, str | None]:
    """What a fetch record is one of: a model's hub id at a revision, resolved to a commit."""
    return fetch.model, fetch.hub_id, fetch.revision, fetch.commit


def prepare(config: Config, cells: list[Cell], results: ResultsDir, launcher: Launcher,
            status: Callable[[str], None], fetched: Sequence[PreflightRecord] = ()) -> None:
    """Before any cell: where each hub id was resolved to (`fetched`, bench.weights.hub), each
    image resolved and pinned once (pin_images), the pre-flight checks of the weights and each
    image's fingerprint, each once per results folder (a resumed run keeps what it has, and adds
    a hub id's resolution only if it changed)."""
    cells = matrix_cells(cells)
    pinned = pin_images(cells, results, launcher, status)
    earlier = list(results.data.preflights)
    resolutions = {_resolution(p) for p in earlier if p.kind == "fetch"}
    for record in fetched:
        if _resolution(record) not in resolutions:
            results.add_preflight(record)
    if config.preflight and not any(p.kind != "fetch" for p in earlier):
        for record in preflight(config, pinned, status, audit_in=launcher.audit_in, run_id=results.path.name):
            results.add_preflight(record)
    printed = {f.image for f in results.data.fingerprints}
    for image in {c.image.name: c.image for c in cells}.values():
        if image.name not in printed:
            status(f"fingerprint of {image.name}")
            results.add_fingerprint(launcher.fingerprint(image))


class Schedule:
    """The runs still to do, in matrix order, and early stop: thread-safe."""

    def __init__(self, config: Config, cells: list[Cell], done: frozenset[tuple[str, int]],
                 earlier: list[tuple[RunRecord, list[Finding]]], status: Callable[[str], None],
                 settled: Callable[[int, int, int], bool] | None = None):
        # settled(failures, runs, planned): enough repeats of a cell; the config's early stop by default.
        self.settled = settled or (verdict_settled if config.early_stop else None)
        self.status = status
        self.todo = deque((cell, repeat) for cell in cells for repeat in range(1, cell.repeats + 1)
                          if (cell.id, repeat) not in done)
        self.total = len(self.todo)
        self.failed: dict[str, list[bool]] = {}
        # Cells whose image cannot run on this host (its architecture): said once, by their
        # first run; more repeats would only say it again.
        self.unrunnable: set[str] = set()
        for r, findings in earlier:
            self._note(r, findings)
        self.lock = threading.Lock()

    def _note(self, record: RunRecord, findings: list[Finding]) -> None:
        """`findings`: the run's own, as the judge made them (bench.core.judge.observed)."""
        if any(f.reason == Reason.NOT_RUNNABLE for f in findings):
            self.unrunnable.add(record.cell_id)
        counts = run_counts(findings)
        if counts is not None:  # None: only the baseline can tell, at the end
            self.failed.setdefault(record.cell_id, []).append(counts)

    def next(self, stop: StopToken) -> tuple[Cell, int] | None:
        with self.lock:
            while self.todo and not stop.stopped:
                cell, repeat = self.todo.popleft()
                if cell.id in self.unrunnable:
                    self.status(f"{cell.id}: not runnable on this host, skipping #{repeat}")
                    continue
                outcomes = self.failed.get(cell.id, [])
                if self.settled and outcomes and self.settled(sum(outcomes), len(outcomes), cell.repeats):
                    self.status(f"{cell.id}: settled after {len(outcomes)} runs, skipping #{repeat}")
                    continue
                return cell, repeat
        return None

    def record(self, record: RunRecord, findings: list[Finding]) -> None:
        with self.lock:
            if not record.interrupted:
                self._note(record, findings)


class Workers:
    """Threads that take runs from a schedule until it is empty or the token is set. One per
    device of every pool, each holding the devices its cell needs while it runs; one more for
    cells of platforms without devices, which run one at a time."""

    def __init__(self, config: Config, schedule: Schedule, pools: dict[str, SlotPool], launcher: Launcher,
                 results: ResultsDir, progress: Progress, stop: StopToken, host: HostCheck | None = None):
        self.config, self.schedule, self.pools = config, schedule, pools
        self.host = host or HostCheck()
        self.launcher, self.results, self.progress, self.stop = launcher, results, progress, stop
        self.one_at_a_time = threading.Lock()
        self.reporting = threading.Lock()
        self.errors: list[BaseException] = []
        self._finished: list[threading.Event] = []
        self._threads: list[threading.Thread] = []

    def count(self, cells: list[Cell]) -> int:
        return sum(len(p.ids) for p in self.pools.values()) + any(c.platform not in self.pools for c in cells)

    def start(self, count: int) -> None:
        for i in range(count):
            finished = threading.Event()
            # Not daemons: should the bench ever get to exit early, it still waits for them.
            thread = threading.Thread(target=self._work, args=(finished,), name=f"regbench-worker-{i}")
            self._finished.append(finished)
            self._threads.append(thread)
            thread.start()

    def _run(self, cell: Cell, repeat: int) -> RunRecord | None:
        refused = self.host.refused(cell)
        if refused is not None:  # said without a server, and without taking devices
            return run_one(self.config, cell, repeat, self.launcher, self.results, self.progress.status,
                           None, self.stop, refused)
        pool = self.pools.get(cell.platform)
        if pool is None:
            while not self.one_at_a_time.acquire(timeout=_POLL_S):
                if self.stop.stopped:
                    return None
            try:
                return run_one(self.config, cell, repeat, self.launcher, self.results, self.progress.status,
                               None, self.stop)
            finally:
                self.one_at_a_time.release()
        try:
            devices = pool.acquire(cell.model.tensor_parallel_size, self.stop, self.progress.status)
        except Stopped:
            return None
        try:
            return run_one(self.config, cell, repeat, self.launcher, self.results, self.progress.status,
                           devices, self.stop)
        finally:
            pool.release(devices)

    def _work(self, finished: threading.Event) -> None:
        try:
            while (job := self.schedule.next(self.stop)) is not None:
                record = self._run(*job)
                if record is None:
                    continue
                findings = observed(self.results.data, job[0], record)
                self.schedule.record(record, findings)
                diverged = run_divergence(job[0], record, self.results)
                with self.reporting:
                    self.progress.run_done(record, findings, diverged)
        except BaseException as exc:
            self.errors.append(exc)
            self.stop.stop(f"a worker failed: {exc}")
        finally:
            finished.set()

    def wait(self) -> bool:
        """Waits until every worker has finished; returns whether a Ctrl-C came meanwhile. A
        Ctrl-C sets the token and the wait goes on, so that the servers are down before the
        bench goes on. Not Thread.join alone: after a KeyboardInterrupt landed inside join(), a
        live worker was seen as finished and the bench exited with its server still booting."""
        interrupted = False
        while not all(f.is_set() for f in self._finished):
            try:
                time.sleep(_POLL_S)
            except KeyboardInterrupt:
                interrupted = True
                self.stop.stop("interrupted")
        for thread in self._threads:
            thread.join()
        return interrupted


def finish(results: ResultsDir, started: float, interrupted: bool) -> Published:
    """The plan completed with its end, then the verdicts over everything the folder holds, and
    the report files."""
    data = results.data
    results.write_plan(data.plan.model_copy(update={"started_at": started, "finished_at": time.time(),
                                                    "interrupted": interrupted}))
    return write_reports(results, judge(data))


def run_matrix(
    config: Config,
    cells: list[Cell],
    results: ResultsDir,
    launcher: Launcher | None = None,
    progress: Progress | None = None,
    done: frozenset[tuple[str, int]] = frozenset(),
    locks: Path | None = None,
    stop: StopToken | None = None,
    settled: Callable[[int, int, int], bool] | None = None,
    host: HostCheck | None = None,
) -> Published:
    """Runs every repeat of every cell not in `done` (finished by an earlier, killed invocation).
    `host`: the GPU profiles checked against this host (bench.serve.platforms.check_host; made
    here when not given, its warnings said as status).

    Ctrl-C (KeyboardInterrupt in the calling thread) or `stop` set from elsewhere stops every
    server and ends the run as interrupted; an error in a worker (results that cannot be
    written) stops the others too and is raised once every server is down. `settled(failures,
    runs, planned)` ends a cell's repeats early (default: the config's early_stop rule)."""
    launcher = launcher or open_launcher(config, results.path.name)
    progress = progress or NoProgress()
    stop = stop or StopToken()
    started = time.time()
    # The folder in memory, once: the runner appends to it as it writes, the judge reads it.
    data = results.load(config)
    # The plan first, before anything can fail: what this run set out to do (a resumed run, what
    # its first invocation did too), whatever becomes of it.
    resumed = (results.path / "plan.json").exists()
    planned = [*data.plan.cells, *(c.id for c in cells if c.id not in data.plan.cells)] if resumed else [c.id for c in cells]
    if resumed:
        started = data.plan.started_at  # a resumed run is dated from its first start: summary, report, history
    results.write_plan(plan_for(results.path.name, config, cells, started).model_copy(update={"cells": planned}))
    # Hub ids to snapshot folders of the hub cache, once, before the pre-flight and any server
    # (a HubError, a ConfigError, when one cannot be had).
    try:
        cells, fetched = resolve_models(config, cells)
    except KeyboardInterrupt:
        return finish(results, started, True)
    if host is None:
        host = check_host(config, cells)
        for warning in host.warnings:
            progress.status(f"warning: {warning}")
    pools = device_pools(config, cells, locks, host)
    interrupted = False
    by_id = {c.id: c for c in cells}
    earlier = [(r, observed(data, by_id[r.cell_id], r)) for r in data.runs if r.cell_id in by_id]
    schedule = Schedule(config, cells, done, earlier, progress.status, settled)
    workers = Workers(config, schedule, pools, launcher, results, progress, stop, host)
    try:
        progress.start(schedule.total)
        prepare(config, cells, results, launcher, progress.status, fetched)
        workers.start(workers.count(cells))
    except KeyboardInterrupt:
        interrupted = True
        stop.stop("interrupted")
    interrupted = workers.wait() or interrupted
    if workers.errors:
        raise workers.errors[0]
    return finish(results, started, interrupted or stop.stopped)


def confirm(results: ResultsDir, summary: Summary, status: Callable[[str], None]) -> None:
    """The pre-flight checks the run did not make (inspect; the audit of each failing cell's
    checkpoint in its environment), added to the results as evidence."""
    config = results.data.config
    failing = {c.cell_id for c in summary.cells if c.verdict.failing}
    cells = [c for c in expand(config) if c.id in failing]
    have = {(p.kind, p.model, p.image, p.load_format) for p in results.data.preflights if not p.skipped}
    here = backend(config.launcher).audit_in
    cells, _ = resolve_models(config, cells)  # hub ids to their snapshots in the hub cache (HubError: exit 2)
    for record in preflight(config, cells, status, audit_in=here):
        if (record.kind, record.model, record.image, record.load_format) not in have:
            results.add_preflight(record.model_copy(update={"notes": [*record.notes, "made by regbench diagnose --confirm"]}))
