"""The orchestrator: cells → launch → requests → verdicts → report, writing as it goes.

The only module that ties the pure core (config, matrix, judge, report) to the I/O edges
(launch, client, results files).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Protocol, TypeVar

from bench.client import run_workload
from bench.config import Config, ConfigError
from bench.judge import divergence, judge_run, reference_outputs
from bench.launch import BootError, Launcher, LocalLauncher
from bench.matrix import Cell
from bench.preflight import preflight
from bench.records import Devices, RunRecord, Summary, TokenDiff
from bench.publish import write_reports
from bench.report import summarize
from bench.results import ResultsDir, log_tail, read_log
from bench.slots import Cancelled, SlotPool
from bench.stats import verdict_settled

T = TypeVar("T")


class Progress(Protocol):
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord, divergence: list[TokenDiff] | None) -> None:
        """`divergence`: where the run's outputs differ from its baseline cell's ([] when they
        match or the cell has no baseline); None while the baseline has no clean run to compare
        with, so a run without findings of its own cannot be called a pass yet."""


class NoProgress:
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord, divergence: list[TokenDiff] | None) -> None: ...


def run_divergence(cell: Cell, record: RunRecord, results: ResultsDir) -> list[TokenDiff] | None:
    """The run's divergence from its baseline as far as it is known now (see Progress.run_done)."""
    if cell.baseline_id is None or record.interrupted:
        return []
    runs = [r for r in results.runs() if r.cell_id == cell.baseline_id]
    requests = results.requests()
    reference = reference_outputs(runs, [q for q in requests if q.cell_id == cell.baseline_id])
    if not reference:
        return None
    mine = [q for q in requests if q.cell_id == cell.id and q.repeat == record.repeat]
    return [TokenDiff(prompt_id=f.prompt_id or "", repeat=repeat, position=pos)
            for repeat, pos, f in divergence(mine, reference)]


class _Stopped(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM, or another worker's fatal error)."""


async def _unless_stopped(work: Awaitable[T], stop: threading.Event) -> T:
    task = asyncio.ensure_future(work)
    while True:
        finished, _ = await asyncio.wait({task}, timeout=0.2)
        if finished:
            return task.result()
        if stop.is_set():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            raise _Stopped()


def run_one(
    config: Config, cell: Cell, repeat: int, launcher: Launcher, results: ResultsDir,
    status: Callable[[str], None], devices: Devices | None = None, stop: threading.Event | None = None,
) -> RunRecord:
    """One fresh server: boot, send the workload, stop, judge. When `stop` is set the server is
    taken down, an interrupted run record is written and KeyboardInterrupt is raised."""
    stop = stop or threading.Event()
    run_dir = results.run_dir(cell.id, repeat)
    server = launcher.server(cell, repeat, run_dir, devices)
    server.should_stop = stop.is_set
    requests = []
    requests_s = None
    interrupted = False
    try:
        status(f"{cell.id} #{repeat}: booting")
        with server:
            status(f"{cell.id} #{repeat}: serving")
            t0 = time.monotonic()
            requests = asyncio.run(
                _unless_stopped(
                    run_workload(
                        server.base_url, cell.model.served, config.workload,
                        cell_id=cell.id, repeat=repeat, on_record=results.add_request,
                    ),
                    stop,
                )
            )
            requests_s = time.monotonic() - t0
            status(f"{cell.id} #{repeat}: stopping")
    except BootError:
        pass  # the outcome says how; judged below like any other run
    except (KeyboardInterrupt, _Stopped):
        interrupted = True
    finally:
        outcome = server.outcome
        log = Path(outcome.log_path)
        findings = []
        if not interrupted:
            shutdown = read_log(log, outcome.stop_requested_at_byte or 0) if outcome.boot_s is not None else ""
            findings = judge_run(outcome, requests, config.workload, shutdown, log_tail(log))
        record = RunRecord(
            cell_id=cell.id, repeat=repeat, server=outcome.model_copy(
                update={"log_path": os.path.relpath(log, results.path)}
            ),
            requests_s=requests_s, findings=findings, interrupted=interrupted,
        )
        results.add_run(record)
    if interrupted:
        raise KeyboardInterrupt
    return record


def make_launcher(config: Config, run_id: str) -> Launcher:
    if config.launcher == "docker":
        from bench.launch_docker import DockerLauncher

        return DockerLauncher(config, run_id)
    return LocalLauncher(config)


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


def device_pools(config: Config, cells: list[Cell], locks: Path | None = None) -> dict[str, SlotPool]:
    """A pool per platform whose profile lists devices."""
    check_devices(config, cells)
    pools = {}
    for profile in {config.profile(c.platform).name: config.profile(c.platform) for c in cells}.values():
        if profile.devices:
            pools[profile.name] = SlotPool(profile.device_kind, profile.devices, locks)
    return pools


def run_matrix(
    config: Config,
    cells: list[Cell],
    results: ResultsDir,
    launcher: Launcher | None = None,
    progress: Progress | None = None,
    done: frozenset[tuple[str, int]] = frozenset(),
    locks: Path | None = None,
) -> Summary:
    """Runs every repeat of every cell not in `done` (finished by an earlier, killed invocation).

    Cells of a platform with `devices` run concurrently, each server on its own devices (one
    worker per device, each holding as many as its cell needs); the others one at a time.
    Ctrl-C (KeyboardInterrupt in the calling thread) stops every server and ends the run as
    interrupted; an error in a worker (results that cannot be written) stops the others too and
    is raised once every server is down."""
    launcher = launcher or make_launcher(config, results.path.name)
    progress = progress or NoProgress()
    pools = device_pools(config, cells, locks)
    started = time.time()
    interrupted = False
    todo = deque((cell, repeat) for cell in cells for repeat in range(1, cell.repeats + 1)
                 if (cell.id, repeat) not in done)
    progress.start(len(todo))
    stop = threading.Event()
    book = threading.Lock()  # guards todo, failed and progress
    one_at_a_time = threading.Lock()  # for cells of platforms without devices
    errors: list[BaseException] = []
    workers: list[tuple[threading.Thread, threading.Event]] = []

    def next_job() -> tuple[Cell, int] | None:
        with book:
            while todo and not stop.is_set():
                cell, repeat = todo.popleft()
                outcomes = failed.setdefault(cell.id, [])
                if config.early_stop and outcomes and verdict_settled(sum(outcomes), len(outcomes), cell.repeats):
                    progress.status(f"{cell.id}: verdict settled after {len(outcomes)} runs, skipping #{repeat}")
                    continue
                return cell, repeat
        return None

    def run_job(cell: Cell, repeat: int) -> None:
        pool = pools.get(cell.platform)
        if pool is None:
            while not one_at_a_time.acquire(timeout=0.2):
                if stop.is_set():
                    return
            try:
                record = run_one(config, cell, repeat, launcher, results, progress.status, None, stop)
            finally:
                one_at_a_time.release()
        else:
            try:
                devices = pool.acquire(cell.model.tensor_parallel_size, stop.is_set, progress.status)
            except Cancelled:
                return
            try:
                record = run_one(config, cell, repeat, launcher, results, progress.status, devices, stop)
            finally:
                pool.release(devices)
        diverged = run_divergence(cell, record, results)
        with book:
            failed[cell.id].append(record.failed)
            progress.run_done(record, diverged)

    def worker(finished: threading.Event) -> None:
        try:
            while (job := next_job()) is not None:
                run_job(*job)
        except KeyboardInterrupt:
            pass  # the run is being stopped; the record says so
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread below
            errors.append(exc)
            stop.set()
        finally:
            finished.set()

    try:
        if config.preflight and not results.preflights():
            for record in preflight(config, cells, progress.status):
                results.add_preflight(record)
        printed = {f.image for f in results.fingerprints()}
        for image in {c.image.name: c.image for c in cells}.values():
            if image.name not in printed:
                progress.status(f"fingerprint of {image.name}")
                results.add_fingerprint(launcher.fingerprint(image))
        failed: dict[str, list[bool]] = {}
        for r in results.runs():
            failed.setdefault(r.cell_id, []).append(r.failed)
        # Enough workers to fill every device, and one for the cells that run one at a time.
        count = sum(len(p.ids) for p in pools.values()) + any(c.platform not in pools for c in cells)
        for i in range(count):
            finished = threading.Event()
            # Not daemons: should the bench ever get to exit early, it still waits for them.
            thread = threading.Thread(target=worker, args=(finished,), name=f"regbench-worker-{i}")
            workers.append((thread, finished))
            thread.start()
        _wait(workers, stop)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        _wait(workers, stop)
    if errors:
        raise errors[0]
    summary = summarize(
        results.path.name, config, cells, results.runs(), results.requests(), started, time.time(),
        interrupted or stop.is_set(), results.preflights(),
    )
    write_reports(results, summary)
    return summary


def _wait(workers: list[tuple[threading.Thread, threading.Event]], stop: threading.Event) -> None:
    """Waits until every worker has finished; a Ctrl-C meanwhile stops them and keeps waiting,
    so that the servers are down before the bench goes on. Not Thread.join: after a
    KeyboardInterrupt landed inside join(), a live worker was seen as finished and the bench
    exited with its server still booting (tests/test_faults.py, test_e2e_vllm.py catch it)."""
    interrupted = False
    while not all(finished.is_set() for _, finished in workers):
        try:
            time.sleep(0.2)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
    for thread, _ in workers:
        thread.join()
    if interrupted:
        raise KeyboardInterrupt
