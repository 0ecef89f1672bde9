"""`regbench run`: a matrix run here or on Slurm, or a killed run resumed."""

from __future__ import annotations

import argparse
import contextlib
import re
from pathlib import Path

from bench import slurm
from bench.console import (
    RichProgress,
    err,
    interrupt_on_sigterm,
    out,
    print_causes,
)
from bench.core.config import Config, ConfigError, with_devices, with_image_refs, with_repeats
from bench.core.diagnosis import Diagnosis
from bench.core.errors import EXIT_FAIL, EXIT_INTERRUPTED, RegbenchError
from bench.core.matrix import expand
from bench.core.records import Summary
from bench.core.redact import redactor_for
from bench.core.slicing import parse_shard, slice_cells
from bench.history.rows import entry_of
from bench.history.store import default_url, open_history
from bench.report.summary import table
from bench.runner import check_devices, run_matrix
from bench.serve.launchers import backend, open_launcher
from bench.serve.platforms import check_host, host_facts, select
from bench.slurm import SlurmOptions, SlurmRun
from bench.store.matrixfile import load_config
from bench.store.results import ResultsDir, ResultsError, new_run_id, writer_lock

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def add_cli_args(sub) -> None:
    run = sub.add_parser("run", help="run a matrix: a fresh server per repeat of every cell")
    run.add_argument("config", nargs="?")
    run.add_argument("--resume", metavar="DIR",
                     help="continue a run that was killed: finished runs are kept, unfinished ones run again")
    run.add_argument("--results", default="results", help="parent folder of the run's results (default: results)")
    run.add_argument("--run-id", help="name of the run's folder (default: timestamp-name)")
    run.add_argument("--platform", help="run this platform's cells (default: those of every profile this host matches)")
    run.add_argument("--cell", action="append", metavar="ID", help="run only this cell (repeatable)")
    run.add_argument("--image", action="append", metavar="NAME=REF", help="replace an image's reference (repeatable)")
    run.add_argument("--repeats", type=_repeats, metavar="N",
                     help="fresh servers per cell instead of the matrix's `repeats` (1..10000), e.g. 1 for a "
                          "quick pass; not with --resume")
    run.add_argument("--shard", metavar="I/N", help="run the I-th of N round-robin slices of the cells")
    run.add_argument("--wait-for-folder", type=float, default=0.0, metavar="SECONDS",
                     help="with --resume: wait this long for another regbench still writing the folder to end "
                          "(default: fail at once); the Slurm executor's resubmitted jobs wait for the last attempt's")
    run.add_argument("--devices", metavar="LIST",
                     help="devices this run may take, e.g. 0,1 or 4-7 or none: cells run side by side, each "
                          "on its own (default: the platform profile's `devices`)")
    run.add_argument("--executor", choices=["local", "slurm"], default="local",
                     help="slurm: one Slurm job per cell (sbatch), followed and merged into one results folder; "
                          "--results must be on a path every node shares")
    run.add_argument("--partition", help="with --executor slurm: sbatch --partition")
    run.add_argument("--account", help="with --executor slurm: sbatch --account")
    run.add_argument("--time-limit", metavar="TIME", help="with --executor slurm: sbatch --time, per job")
    run.add_argument("--gpus-per-job", type=int, metavar="N",
                     help="with --executor slurm: --gres=gpu:N per job (default: the cell's tensor_parallel_size "
                          "on a GPU platform, none on a CPU one)")
    run.add_argument("--cpus-per-job", type=int, metavar="N", help="with --executor slurm: sbatch --cpus-per-task")
    run.add_argument("--mem", metavar="SIZE", help="with --executor slurm: sbatch --mem, per job (e.g. 64G)")
    run.add_argument("--history", metavar="URL",
                     help="record the finished run in this history database (default: sqlite history.sqlite in "
                          "--results; docs/history.md)")
    run.add_argument("--no-history", action="store_true", help="do not record the run in the history database")
    run.add_argument("--sbatch-arg", action="append", metavar="ARG",
                     help="with --executor slurm: another sbatch argument. Partition, account, time limit, CPUs, "
                          "memory and sbatch arguments default to the platform profile's `slurm:` block")
    run.set_defaults(func=main)


def _repeats(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole number of fresh servers, 1..10000")
    return int(value)


def _resume(path: str) -> tuple[ResultsDir, frozenset[tuple[str, int]]]:
    results = ResultsDir(Path(path))
    try:
        done = results.prepare_resume()
        results.config()  # a folder whose matrix no longer loads fails here, before anything runs
    except (ResultsError, OSError, ValueError) as exc:
        raise ConfigError(f"cannot resume {path}: {exc}") from None
    for warning in results.warnings:
        err.print(f"regbench: warning: {warning}", highlight=False, markup=False)
    return results, frozenset(done)


def main(args: argparse.Namespace) -> int:
    if args.resume is not None and args.repeats is not None:
        raise ConfigError("--repeats: a resumed run keeps the repeats it started with")
    if args.executor == "slurm" and args.resume is not None:
        return _resume_on_slurm(args)
    if (args.config is None) == (args.resume is None):
        raise ConfigError("give a matrix file to start a run, or --resume DIR to continue one (not both)")
    with contextlib.ExitStack() as held:
        return _run_here(args, held)


def _hold_folder(held: contextlib.ExitStack, path: Path, wait_s: float) -> None:
    held.enter_context(writer_lock(path, wait_s))


def _run_here(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    done: frozenset[tuple[str, int]] = frozenset()
    if args.resume is not None:
        _hold_folder(held, Path(args.resume), args.wait_for_folder)
        results, done = _resume(args.resume)
        config, run_id = results.config(), results.path.name
        results.redactor = redactor_for(config.server.env_passthrough)
    else:
        config = with_repeats(with_image_refs(load_config(args.config), args.image or []), args.repeats)
        run_id = args.run_id or new_run_id(config.name)
        if not RUN_ID.match(run_id):
            raise ConfigError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only")
    if args.devices is not None:
        config = with_devices(config, args.devices)
    cells = slice_cells(select(expand(config), config, host_facts(), args.platform), args.cell,
                        parse_shard(args.shard) if args.shard else None)
    check_devices(config, cells)
    if args.executor == "slurm":
        return _run_on_slurm(args, config, cells, run_id)
    # The GPU profiles against this host's GPUs, said before the progress bar hides it (what the
    # host lacks: dropped devices, or cells recorded not_runnable without a server).
    host = check_host(config, cells)
    for warning in host.warnings:
        err.print(f"regbench: warning: {warning}", highlight=False, markup=False)
    if args.resume is None:
        try:
            results = ResultsDir.create(Path(args.results), run_id, config)
        except FileExistsError:
            raise ConfigError(f"results directory {Path(args.results) / run_id} exists already") from None
        except OSError as exc:
            raise ConfigError(f"cannot create the results directory: {exc}") from None
        _hold_folder(held, results.path, 0.0)
    launcher = open_launcher(config, run_id)
    if args.resume is not None:
        # A killed bench leaves its servers running; they hold ports, memory and GPUs. Local
        # ones by this folder (another run may share the id), containers by the run id.
        backend(config.launcher).leftovers(run_id, results.path)
    interrupt_on_sigterm()
    progress = RichProgress()
    try:
        report = run_matrix(config, cells, results, launcher=launcher, progress=progress, done=done, host=host)
    finally:
        progress.stop()
    out.print(table(report.summary))
    print_causes(report.diagnosis, results.path)
    # A slice (--cell, --shard: a Slurm job's, a CI shard's) is recorded once merged, as a whole.
    if not (args.cell or args.shard):
        _record_history(args, results, report.summary, report.diagnosis)
    out.print(f"results: {results.path}", highlight=False)
    return report.summary.exit_code


def _record_history(args: argparse.Namespace, results: ResultsDir, summary: Summary, diagnosis: Diagnosis) -> None:
    """A finished run into the history database (bench.history.store), once by its run id. The
    run's verdicts stand whatever happens here: a database that cannot be reached is said, and
    `regbench history ingest DIR` records the folder later."""
    if args.no_history or summary.interrupted:
        return
    url = args.history or default_url(results.path.parent)
    try:
        history = open_history(url)
        try:
            data = results.data
            stored = history.add(entry_of(summary, diagnosis, data.fingerprints, str(results.path), data.runs, data.requests))
        finally:
            history.close()
    except RegbenchError as exc:
        err.print(f"history: the run was not recorded ({exc}); later: regbench history ingest {results.path}",
                  highlight=False, markup=False)
        return
    err.print(f"history: {'recorded in' if stored else 'already in'} {history.shown}", highlight=False, markup=False)


def _slurm_status(text: str) -> None:
    err.print(text, highlight=False, markup=False)


def _slurm_options(args: argparse.Namespace) -> SlurmOptions:
    return SlurmOptions(partition=args.partition, account=args.account, time_limit=args.time_limit,
                        gpus_per_job=args.gpus_per_job, cpus_per_job=args.cpus_per_job, mem=args.mem,
                        extra=list(args.sbatch_arg or []))


def _slurm_finished(args: argparse.Namespace, run: SlurmRun) -> int:
    out.print(table(run.summary))
    print_causes(run.diagnosis, run.results.path)
    if not (run.stopped or run.incomplete):
        _record_history(args, run.results, run.summary, run.diagnosis)
    out.print(f"results: {run.results.path}", highlight=False)
    if run.stopped:
        return EXIT_INTERRUPTED
    if run.incomplete:
        _slurm_status(f"not every job completed: `regbench run --resume {run.results.path} --executor slurm` "
                      "submits their cells again")
        return EXIT_FAIL
    return run.summary.exit_code


def _run_on_slurm(args: argparse.Namespace, config: Config, cells: list, run_id: str) -> int:
    interrupt_on_sigterm()
    return _slurm_finished(args, slurm.start(config, cells, run_id, Path(args.results),
                                       _slurm_options(args), _slurm_status))


def _resume_on_slurm(args: argparse.Namespace) -> int:
    interrupt_on_sigterm()
    return _slurm_finished(args, slurm.resume(Path(args.resume), _slurm_options(args), _slurm_status))
