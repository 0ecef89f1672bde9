"""The orchestrator: cells → launch → requests → verdicts → report, writing as it goes.

The only module that ties the pure core (config, matrix, judge, report) to the I/O edges
(launch, client, results files).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from bench.client import run_workload
from bench.config import Config
from bench.judge import judge_run
from bench.launch import BootError, Launcher, LocalLauncher
from bench.matrix import Cell
from bench.preflight import preflight
from bench.records import RunRecord, Summary
from bench.publish import write_reports
from bench.report import summarize
from bench.results import ResultsDir, log_tail, read_log
from bench.stats import verdict_settled


class Progress(Protocol):
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord) -> None: ...


class NoProgress:
    def start(self, total_runs: int) -> None: ...
    def status(self, text: str) -> None: ...
    def run_done(self, record: RunRecord) -> None: ...


def run_one(
    config: Config, cell: Cell, repeat: int, launcher: Launcher, results: ResultsDir,
    status: Callable[[str], None],
) -> RunRecord:
    """One fresh server: boot, send the workload, stop, judge. KeyboardInterrupt propagates
    after the server is down and an interrupted run record is on disk."""
    run_dir = results.run_dir(cell.id, repeat)
    server = launcher.server(cell, repeat, run_dir)
    requests = []
    requests_s = None
    interrupted = False
    try:
        status(f"{cell.id} #{repeat}: booting")
        with server:
            status(f"{cell.id} #{repeat}: serving")
            t0 = time.monotonic()
            requests = asyncio.run(
                run_workload(
                    server.base_url, cell.model.served, config.workload,
                    cell_id=cell.id, repeat=repeat, on_record=results.add_request,
                )
            )
            requests_s = time.monotonic() - t0
            status(f"{cell.id} #{repeat}: stopping")
    except BootError:
        pass  # the outcome says how; judged below like any other run
    except KeyboardInterrupt:
        interrupted = True
        raise
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
    return record


def make_launcher(config: Config, run_id: str) -> Launcher:
    if config.launcher == "docker":
        from bench.launch_docker import DockerLauncher

        return DockerLauncher(config, run_id)
    return LocalLauncher(config)


def run_matrix(
    config: Config,
    cells: list[Cell],
    results: ResultsDir,
    launcher: Launcher | None = None,
    progress: Progress | None = None,
    done: frozenset[tuple[str, int]] = frozenset(),
) -> Summary:
    """Runs every repeat of every cell not in `done` (finished by an earlier, killed invocation)."""
    launcher = launcher or make_launcher(config, results.path.name)
    progress = progress or NoProgress()
    started = time.time()
    interrupted = False
    todo = [(cell, repeat) for cell in cells for repeat in range(1, cell.repeats + 1) if (cell.id, repeat) not in done]
    progress.start(len(todo))
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
        for cell, repeat in todo:
            outcomes = failed.setdefault(cell.id, [])
            if config.early_stop and outcomes and verdict_settled(sum(outcomes), len(outcomes), cell.repeats):
                progress.status(f"{cell.id}: verdict settled after {len(outcomes)} runs, skipping #{repeat}")
                continue
            record = run_one(config, cell, repeat, launcher, results, progress.status)
            outcomes.append(record.failed)
            progress.run_done(record)
    except KeyboardInterrupt:
        interrupted = True
    summary = summarize(
        results.path.name, config, cells, results.runs(), results.requests(), started, time.time(), interrupted,
        results.preflights(),
    )
    write_reports(results, summary)
    return summary
