"""The `regbench` command. Exit codes: 0 every cell passed, 1 a cell failed or was flaky,
2 usage or config error, 3 the results could not be written (disk full, read-only: servers are
stopped, what was written stays readable and `--resume` continues), 130 interrupted (Ctrl-C or
SIGTERM; servers are stopped first)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import slurm
from bench.core.compare import AXES, compare, format_comparison
from bench.core.config import ENV_NAME, Config, ConfigError, load_config, with_devices, with_image_refs
from bench.core.diagnosis import Diagnosis
from bench.core.judge import probe_key
from bench.core.matrix import expand
from bench.core.perf import METRICS
from bench.core.records import RunRecord, Summary, TokenDiff
from bench.core.redact import redactor_for
from bench.core.slicing import github_matrix, parse_shard, slice_cells
from bench.core.stats import detection_probability, percent_range, repeats_needed, wilson_interval
from bench.core.stop import StopToken
from bench.core.tokens import Comparator, comparator_for
from bench.core.versionmap import Plan, VersionMap
from bench.report.summary import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    EXIT_USAGE,
    EXIT_WRITE,
    diagnosis_markdown,
    table,
)
from bench.report.versions import table as versions_table
from bench.runner import check_devices, run_matrix
from bench.serve.launchers import LauncherUnavailable, backend, open_launcher, remove_leftovers
from bench.serve.platforms import host_facts, select
from bench.slurm import SlurmError, SlurmOptions, SlurmRun
from bench.store.merge import merge
from bench.store.publish import load_side, open_results, rederive, regenerate
from bench.store.results import ResultsDir, ResultsError, ResultsWriteError, new_run_id, writer_lock
from bench.versions import (
    AuditProbe,
    CellProbe,
    VersionsError,
    find_cell,
    open_map,
    run_bisect,
    run_map,
    write_versions,
)
from bench.weights.audit import DEFAULT_TIMEOUT_S, LOADERS, ORDERS, AuditError, ProbeError, audit_checkpoint, default_python
from bench.weights.audit import render as render_audit
from bench.weights.checkpoint import NotACheckpoint, inspect_checkpoint
from bench.weights.checkpoint import render as render_checkpoint
from bench.weights.hub import resolve_models
from bench.weights.overlays import OverlayError, available_versions, default_cache, select_versions
from bench.weights.preflight import preflight

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# CI logs are not terminals; rich would wrap them at 80 columns.
_WIDTH = None if sys.stdout.isatty() else 160
err = Console(stderr=True, width=_WIDTH)
out = Console(width=_WIDTH)


class RichProgress:
    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err, transient=True,
        )
        self.task = self.bar.add_task("starting", total=None, start=False)

    def start(self, total_runs: int) -> None:
        self.bar.start()
        self.bar.update(self.task, total=total_runs)
        self.bar.start_task(self.task)

    def status(self, text: str) -> None:
        self.bar.update(self.task, description=text)

    def run_done(self, record: RunRecord, divergence: list[TokenDiff] | None) -> None:
        self.bar.advance(self.task)
        self.bar.console.print(run_line(record, divergence))

    def stop(self) -> None:
        self.bar.stop()


def run_line(record: RunRecord, divergence: list[TokenDiff] | None) -> str:
    """One finished run for the console: ✓ only for a run the cell verdict cannot contradict."""
    boot = f"boot {record.server.boot_s:.0f} s" if record.server.boot_s is not None else "no boot"
    head = f"{record.cell_id} #{record.repeat} ({boot})"
    if record.interrupted:
        return f"[yellow]-[/] {head}: interrupted"
    probes = [f for f in record.findings if probe_key(f) is not None]
    reasons = sorted({str(f.reason) for f in record.findings if probe_key(f) is None})
    if divergence:
        first = min(divergence, key=lambda d: d.position)
        reasons.append(f"divergence from baseline at token {first.position} ({first.prompt_id})")
    if reasons:
        return f"[red]✗[/] {head}: {', '.join(reasons + sorted({str(f.reason) for f in probes}))}"
    if probes:
        # Known answers and the reference ceiling count only where the baseline meets them
        # (bench.core.judge.set_aside_probes): the cell's verdict says, once the baseline is in.
        missed = ", ".join(sorted({f.prompt_id or "reference text" for f in probes}))
        return f"[yellow]?[/] {head}: missed {missed}; counted unless the baseline misses it too"
    if divergence is None:
        return f"[yellow]?[/] {head}: no finding of its own; compared with the baseline once it has a clean run"
    return f"[green]✓[/] {head}"


def _interrupt_on_sigterm() -> None:
    # SIGTERM (CI cancelling a job) takes the same clean path as Ctrl-C.
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A process started in the background by a non-interactive shell (a CI step's `cmd &`, nohup)
    # inherits SIGINT ignored, and Python then leaves it so: Ctrl-C or a runner's SIGINT would
    # let the servers run on. The bench always stops them cleanly instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def cmd_plan(args: argparse.Namespace) -> int:
    config = with_image_refs(load_config(args.config), args.image or [])
    cells = expand(config)
    check_devices(config, cells)  # what `run` would refuse, plan refuses too
    if args.format == "github-matrix":
        print(github_matrix(config, cells, args.shards))
        return 0
    n = config.repeat_count
    auto = f" (auto: to see a {config.detect.rate:.0%} failure with {config.detect.confidence:.0%} probability)" \
        if config.repeats == "auto" and config.detect else ""
    t_lines = [f"{config.name}: {len(cells)} cells × {n} repeats{auto} = {len(cells) * n} fresh servers"]
    for c in cells:
        role = "baseline" if c.is_baseline else (f"vs {c.baseline_id}" if c.baseline_id else "no baseline")
        tp = c.model.tensor_parallel_size
        t_lines.append(f"  {c.id}  [{role}]" + (f" [{tp} devices]" if tp > 1 else ""))
    for profile in config.profiles:
        if profile.devices:
            t_lines.append(f"platform {profile.name}: cells side by side on {profile.device_kind} devices "
                           f"{','.join(profile.devices)} (one server per device set; --devices to change)")
    if args.detect is not None:
        t_lines += ["", *_detection_lines(args.detect, args.confidence, n, len(cells))]
    elif args.confidence is not None:
        raise ConfigError("--confidence needs --detect P")
    print("\n".join(t_lines))
    return 0


def _detection_lines(p: float, confidence: float | None, repeats: int, cells: int) -> list[str]:
    confidence = 0.95 if confidence is None else confidence
    try:
        n = repeats_needed(p, confidence)
        seen_now = detection_probability(p, repeats)
    except ValueError as exc:
        raise ConfigError(f"--detect/--confidence: {exc}") from None
    return [
        f"to see a failure that happens in {p:.0%} of fresh starts at least once with {confidence:.0%} "
        f"probability: {n} repeats per cell ({cells} cells × {n} = {cells * n} fresh servers)",
        f"the matrix has repeats: {repeats}, which sees it with {seen_now:.0%} probability; "
        f"0 failures in {n} runs would put the failure rate at {percent_range(*wilson_interval(0, n))} (Wilson 95 %)",
    ]


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


def cmd_run(args: argparse.Namespace) -> int:
    if args.executor == "slurm" and args.resume is not None:
        return _resume_on_slurm(args)
    if (args.config is None) == (args.resume is None):
        raise ConfigError("give a matrix file to start a run, or --resume DIR to continue one (not both)")
    with contextlib.ExitStack() as held:
        return _run_here(args, held)


def _hold_folder(held: contextlib.ExitStack, path: Path, wait_s: float) -> None:
    try:
        held.enter_context(writer_lock(path, wait_s))
    except ResultsError as exc:
        raise ConfigError(str(exc)) from None


def _run_here(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    done: frozenset[tuple[str, int]] = frozenset()
    if args.resume is not None:
        _hold_folder(held, Path(args.resume), args.wait_for_folder)
        results, done = _resume(args.resume)
        config, run_id = results.config(), results.path.name
        results.redactor = redactor_for(config.server.env_passthrough)
    else:
        config = with_image_refs(load_config(args.config), args.image or [])
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
    if args.resume is None:
        try:
            results = ResultsDir.create(Path(args.results), run_id, config)
        except FileExistsError:
            raise ConfigError(f"results directory {Path(args.results) / run_id} exists already") from None
        except OSError as exc:
            raise ConfigError(f"cannot create the results directory: {exc}") from None
        _hold_folder(held, results.path, 0.0)
    try:
        launcher = open_launcher(config, run_id)
    except LauncherUnavailable as exc:
        raise ConfigError(str(exc)) from None
    if args.resume is not None:
        # A killed bench leaves its servers running; they hold ports, memory and GPUs. Local
        # ones by this folder (another run may share the id), containers by the run id.
        backend(config.launcher).leftovers(run_id, results.path)
    _interrupt_on_sigterm()
    progress = RichProgress()
    try:
        summary = run_matrix(config, cells, results, launcher=launcher, progress=progress, done=done)
    finally:
        progress.stop()
    out.print(table(summary))
    _print_causes(results.path)
    out.print(f"results: {results.path}", highlight=False)
    return summary.exit_code


def cause_lines(diagnosis: Diagnosis, results: Path) -> list[str]:
    """One line per failing cell for the console: the likely cause, its signature id and the
    command that confirms it (summary.md's Diagnosis has the evidence for and against)."""
    lines = []
    for d in diagnosis.cells:
        cause = next((m for m in d.matches if not m.symptom_only), None)
        if cause is None:
            symptom = f" (symptom seen: {d.matches[0].signature})" if d.matches else ""
            lines.append(f"{d.cell_id}: no known cause{symptom}; evidence: regbench diagnose {results}")
            continue
        confirm = cause.confirm or f"regbench run {results / 'config.yaml'} --cell {d.cell_id}"
        lines.append(f"{d.cell_id}: likely cause: {cause.title} [{cause.signature}]; confirm: {confirm}")
    return lines


def _print_causes(results: Path) -> None:
    try:
        diagnosis = Diagnosis.model_validate_json((results / "diagnosis.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no diagnosis was written (nothing judged): the table says what there is
    for line in cause_lines(diagnosis, results):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def _slurm_status(text: str) -> None:
    err.print(text, highlight=False, markup=False)


def _slurm_options(args: argparse.Namespace) -> SlurmOptions:
    return SlurmOptions(partition=args.partition, account=args.account, time_limit=args.time_limit,
                        gpus_per_job=args.gpus_per_job, cpus_per_job=args.cpus_per_job, mem=args.mem,
                        extra=list(args.sbatch_arg or []))


def _slurm_finished(run: SlurmRun) -> int:
    out.print(table(run.summary))
    _print_causes(run.results.path)
    out.print(f"results: {run.results.path}", highlight=False)
    if run.stopped:
        return EXIT_INTERRUPTED
    if run.incomplete:
        _slurm_status(f"not every job completed: `regbench run --resume {run.results.path} --executor slurm` "
                      "submits their cells again")
        return EXIT_FAIL
    return run.summary.exit_code


def _run_on_slurm(args: argparse.Namespace, config: Config, cells: list, run_id: str) -> int:
    _interrupt_on_sigterm()
    try:
        return _slurm_finished(slurm.start(config, cells, run_id, Path(args.results),
                                           _slurm_options(args), _slurm_status))
    except SlurmError as exc:
        raise ConfigError(str(exc)) from None


def _resume_on_slurm(args: argparse.Namespace) -> int:
    _interrupt_on_sigterm()
    try:
        return _slurm_finished(slurm.resume(Path(args.resume), _slurm_options(args), _slurm_status))
    except SlurmError as exc:
        raise ConfigError(str(exc)) from None


def _comparator(args: argparse.Namespace, config_of: Path) -> Comparator | None:
    if args.compare_mode is None:
        return None
    k = args.top_k if args.top_k is not None else open_results(config_of).config().comparison.top_k
    return comparator_for(args.compare_mode, k)


def _compare_flags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--compare-mode", choices=["exact", "logprobs"], help=what)
    parser.add_argument("--top-k", type=int, choices=range(1, 21), metavar="K",
                        help="with --compare-mode logprobs: how many alternatives count (default: the config's)")


def cmd_report(args: argparse.Namespace) -> int:
    summary = regenerate(Path(args.dir), _comparator(args, Path(args.dir)))
    out.print(table(summary))
    return summary.exit_code


def cmd_diagnose(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    results = open_results(path)
    config = results.config()
    if args.confirm:
        _confirm(results, config, rederive(results, results.runs(), results.requests()))
    summary = regenerate(path)
    diagnosis = Diagnosis.model_validate_json((path / "diagnosis.json").read_text())
    if not diagnosis.cells:
        out.print("no failing cell: nothing to diagnose", highlight=False, soft_wrap=True)
    for line in diagnosis_markdown(diagnosis):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    if args.confirm and diagnosis.cells:
        out.print("## Minimal reproduction", highlight=False, markup=False, soft_wrap=True)
        for d in diagnosis.cells:
            audit = next((m.confirm for m in d.matches if m.confirm), None)
            if audit:
                out.print(f"- {d.cell_id}: {audit}", highlight=False, markup=False, soft_wrap=True)
            out.print(f"- {d.cell_id}: regbench run {path / 'config.yaml'} --cell {d.cell_id}",
                      highlight=False, markup=False, soft_wrap=True)
    return summary.exit_code


def _confirm(results: ResultsDir, config: Config, summary: Summary) -> None:
    """The pre-flight checks the run did not make (inspect; the audit of each failing cell's
    checkpoint in its environment), added to the results as evidence."""
    failing = {c.cell_id for c in summary.cells if c.verdict.failing}
    cells = [c for c in expand(config) if c.id in failing]
    have = {(p.kind, p.model, p.image, p.load_format) for p in results.preflights() if not p.skipped}
    here = backend(config.launcher).audit_in
    cells, _ = resolve_models(config, cells)  # hub ids to their snapshots in the hub cache (HubError: exit 2)
    for record in preflight(config, cells, lambda s: err.print(s, highlight=False), audit_in=here):
        if (record.kind, record.model, record.image, record.load_format) not in have:
            results.add_preflight(record.model_copy(update={"notes": [*record.notes, "made by regbench diagnose --confirm"]}))


def cmd_compare(args: argparse.Namespace) -> int:
    chosen = _comparator(args, Path(args.a))
    if chosen is None:  # the reference run's own rule
        rule = open_results(Path(args.a)).config().comparison
        chosen = comparator_for(rule.mode, args.top_k or rule.top_k)
    a, b = load_side(Path(args.a), chosen), load_side(Path(args.b), chosen)
    thresholds = {}
    for pair in args.threshold:
        name, sep, value = pair.partition("=")
        try:
            thresholds[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or thresholds[name] <= 1:
            raise ConfigError(f"--threshold {pair!r}: expected METRIC=RATIO with RATIO > 1, e.g. ttft_s=1.5")
    result = compare(a, b, ignore=frozenset(args.match_ignore), comparator=chosen, thresholds=thresholds)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        for line in format_comparison(result, verbose=args.verbose):
            out.print(line, highlight=False, markup=False)
    return EXIT_FAIL if result.regressions else EXIT_PASS


def _emit(report, as_json: bool, render) -> int:
    """Prints an inspect or audit report; exit 1 when it found a problem, 2 when an audit could
    not tell (the probe does not support the loader release)."""
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        for part in render(report):
            out.print(part, highlight=False)
    if report.ok:
        return EXIT_PASS
    return EXIT_FAIL if report.problems else EXIT_USAGE


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        report = inspect_checkpoint(args.ckpt)
    except NotACheckpoint as exc:
        raise ConfigError(str(exc)) from None
    return _emit(report, args.json, render_checkpoint)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise ConfigError(f"--env {pair!r}: expected NAME=VALUE")
        env[key] = value
    return env


def _names(value: str, flag: str, known: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"{flag} {value!r}: a comma-separated list of {', '.join(known)}")
    return names


def cmd_audit(args: argparse.Namespace) -> int:
    orders = _names(args.orders, "--orders", ORDERS) if args.orders.strip() else []
    loaders = _names(args.loaders, "--loaders", LOADERS)
    if not orders and not args.shuffles:
        raise ConfigError("nothing to audit: give --orders or --shuffles")
    if args.shuffles < 0:
        raise ConfigError("--shuffles must be >= 0")
    if args.image:  # the image's Python, and folders inside the image
        python, pythonpath, where = args.python or "python3", list(args.pythonpath), f" in a container of {args.image}"
    else:
        for d in args.pythonpath:
            if not Path(d).is_dir():
                raise ConfigError(f"--pythonpath {d}: not a directory")
        python, pythonpath, where = args.python or default_python(), [str(Path(d).resolve()) for d in args.pythonpath], ""
    err.print(f"streaming {args.ckpt} with {python}{where} …", highlight=False)
    try:
        report = audit_checkpoint(
            args.ckpt, python, pythonpath, _env_pairs(args.env),
            orders=orders, shuffles=args.shuffles, seed=args.seed, loaders=loaders, timeout_s=args.timeout,
            image_ref=args.image, pull="never",
        )
    except (NotACheckpoint, AuditError, ProbeError) as exc:
        raise ConfigError(str(exc)) from None
    return _emit(report, args.json, render_audit)


def _version_probe(args: argparse.Namespace, stop: StopToken):
    """The probe and the version list a `versions` or `bisect` command asks for."""
    cache = Path(args.overlays) if args.overlays else default_cache(Path.cwd())
    if (args.audit is None) == (args.config is None):
        raise ConfigError("give a checkpoint to audit (--audit CKPT) or a matrix and a cell (--config FILE --cell ID)")
    if (args.streamer is None) == (args.images is None):
        raise ConfigError("give the versions of one axis: --streamer VERSIONS or --images NAMES")
    probe: AuditProbe | CellProbe
    if args.audit is not None:
        if args.images is not None:
            raise ConfigError("--images needs a matrix (--config): the audit maps runai-model-streamer releases")
        python = args.python or default_python()
        probe = AuditProbe(checkpoint=Path(args.audit).resolve(), python=python, cache=cache,
                           env=tuple(_env_pairs(args.env).items()),
                           orders=tuple(_names(args.orders, "--orders", ORDERS)),
                           loaders=tuple(_names(args.loaders, "--loaders", LOADERS)))
        if not Path(args.audit).is_dir():
            raise ConfigError(f"--audit {args.audit}: not a checkpoint directory")
    else:
        if not args.cell:
            raise ConfigError("--config needs --cell ID: the one cell to probe (`regbench plan` lists them)")
        config = load_config(args.config)
        try:
            cell = find_cell(config, args.cell)
        except VersionsError as exc:
            raise ConfigError(str(exc)) from None
        python = cell.image.python
        probe = CellProbe(config=config, cell=cell, axis="image" if args.images else "runai-model-streamer",
                          cache=cache, progress=None, stop=stop)
    try:
        if args.images is not None:
            versions = [v.strip() for v in args.images.split(",") if v.strip()]
        else:
            versions = select_versions(args.streamer, available_versions(python) if ".." in args.streamer else None)
    except OverlayError as exc:
        raise ConfigError(str(exc)) from None
    return probe, versions


def cmd_versions(args: argparse.Namespace) -> int:
    """`versions` (the map) and `bisect`: one probe across versions, results in a folder."""
    stop = StopToken()
    probe, versions = _version_probe(args, stop)
    mode = "bisect" if args.command == "bisect" else "map"
    if mode == "bisect":
        for end, flag in ((args.good, "--good"), (args.bad, "--bad")):
            if end not in versions:
                raise ConfigError(f"{flag} {end}: not one of the versions ({', '.join(versions)})")
    if not 0 < args.rate <= 1 or not 0 < args.confidence < 1:
        raise ConfigError("--rate must be in (0, 1] and --confidence in (0, 1)")
    fresh = VersionMap(mode=mode, axis="image" if args.images else "runai-model-streamer", probe=probe.describe(),
                       versions=versions, plan=Plan(rate=args.rate, confidence=args.confidence), outcomes=[],
                       good=args.good if mode == "bisect" else None, bad=args.bad if mode == "bisect" else None)
    root = Path(args.dir) if args.dir else Path(args.results) / new_run_id(mode + "-versions")
    try:
        vmap = open_map(root, fresh)
    except (VersionsError, OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from None

    def save(m: VersionMap) -> None:
        write_versions(root, m)

    def status(text: str) -> None:
        err.print(f"{text}", highlight=False, markup=False)

    _interrupt_on_sigterm()
    err.print(f"{mode} of {len(versions)} version(s) into {root}", highlight=False)
    try:
        run = run_bisect if mode == "bisect" else run_map
        vmap = run(probe, root, vmap, save, status)
    except VersionsError as exc:
        raise ConfigError(str(exc)) from None
    out.print(versions_table(vmap))
    out.print(f"results: {root}", highlight=False)
    if vmap.interrupted:
        return EXIT_INTERRUPTED
    if mode == "bisect":
        return EXIT_PASS if vmap.bisect is not None and vmap.bisect.change is not None else EXIT_FAIL
    return EXIT_PASS


def cmd_merge(args: argparse.Namespace) -> int:
    try:
        merged = merge([Path(d) for d in args.dirs], Path(args.out))
    except (ResultsError, OSError) as exc:
        raise ConfigError(f"merge: {exc}") from None
    summary = regenerate(merged.path)
    out.print(table(summary))
    out.print(f"merged: {merged.path}", highlight=False)
    return summary.exit_code


def cmd_clean(args: argparse.Namespace) -> int:
    """Removes what a killed bench left running, of every launcher back-end, found by labels; by
    default only what belongs to benches that are gone (a shared host runs benches side by side)."""
    for name, (removed, kept) in remove_leftovers(args.run_id, only_gone=not args.all).items():
        print(f"{name} launcher: removed {len(removed)} leftover(s)" + (": " + ", ".join(removed) if removed else ""))
        if kept:
            print(f"{name} launcher: left {len(kept)} (--all removes them too): " + "; ".join(kept))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regbench", description="End-to-end serving regression bench for vLLM.")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the cells of a matrix without running anything")
    plan.add_argument("config")
    plan.add_argument("--detect", type=float, metavar="P",
                      help="also print the repeats needed to see a failure of rate P (0 < P <= 1) at least once")
    plan.add_argument("--confidence", type=float, metavar="C",
                      help="with --detect: the probability of seeing it (default 0.95); n = ceil(log(1-C)/log(1-P))")
    plan.add_argument("--format", choices=["text", "github-matrix"], default="text",
                      help="github-matrix: the JSON of a GitHub Actions strategy.matrix, one entry per platform and shard")
    plan.add_argument("--shards", type=int, default=1, metavar="N", help="with github-matrix: shards per platform")
    plan.add_argument("--image", action="append", metavar="NAME=REF", help="replace an image's reference (repeatable)")
    plan.set_defaults(func=cmd_plan)
    run = sub.add_parser("run", help="run a matrix: a fresh server per repeat of every cell")
    run.add_argument("config", nargs="?")
    run.add_argument("--resume", metavar="DIR",
                     help="continue a run that was killed: finished runs are kept, unfinished ones run again")
    run.add_argument("--results", default="results", help="parent folder of the run's results (default: results)")
    run.add_argument("--run-id", help="name of the run's folder (default: timestamp-name)")
    run.add_argument("--platform", help="run this platform's cells (default: those of every profile this host matches)")
    run.add_argument("--cell", action="append", metavar="ID", help="run only this cell (repeatable)")
    run.add_argument("--image", action="append", metavar="NAME=REF", help="replace an image's reference (repeatable)")
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
    run.add_argument("--sbatch-arg", action="append", metavar="ARG",
                     help="with --executor slurm: another sbatch argument. Partition, account, time limit, CPUs, "
                          "memory and sbatch arguments default to the platform profile's `slurm:` block")
    run.set_defaults(func=cmd_run)
    merge_p = sub.add_parser("merge", help="merge the results folders of the slices of one run, reports regenerated")
    merge_p.add_argument("dirs", nargs="+", metavar="DIR")
    merge_p.add_argument("-o", "--out", required=True, help="parent folder of the merged run")
    merge_p.set_defaults(func=cmd_merge)
    clean_p = sub.add_parser("clean", help="stop servers and remove containers a killed bench left behind (by label)")
    clean_p.add_argument("--run-id", help="only those of this run (default: all of regbench's on this host)")
    clean_p.add_argument("--all", action="store_true",
                         help="also those whose bench still runs, or ran on another host (default: only those of "
                              "benches that are gone; what is left is said)")
    clean_p.set_defaults(func=cmd_clean)
    report = sub.add_parser(
        "report", help="regenerate summary.json, summary.md, junit.xml and report.html from a results folder")
    report.add_argument("dir")
    _compare_flags(report, "judge outputs by this rule instead of the run's config's `comparison`")
    report.set_defaults(func=cmd_report)
    diag = sub.add_parser(
        "diagnose", help="from failing cells to known causes, with the evidence for and against each",
        description=("Reasons over a results folder: per failing cell the matrix contrast, facts from its server "
                     "logs, the pre-flight and fingerprints, matched against the signatures of known issues "
                     "(bench/signatures/, plus the config's `signatures` folders). Writes diagnosis.json and "
                     "the Diagnosis sections of summary.md and report.html. Exit 1 when a cell fails."),
    )
    diag.add_argument("dir")
    diag.add_argument("--confirm", action="store_true",
                      help="first run the checks the run did not (inspect, and the audit of each failing cell's "
                           "checkpoint in its environment), then print a minimal reproduction")
    diag.set_defaults(func=cmd_diagnose)
    cmp = sub.add_parser(
        "compare", help="compare two results folders (e.g. image tag N-1 and N); exit 1 on a regression",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Re-judges both results folders from their JSONL and compares them cell by cell.\n\n"
            "Cells are matched by cell id (model__load-format__platform__image). When no cell id is\n"
            "common to both (the same matrix run on another image tag), the image axis is ignored\n"
            "automatically and cells are matched by model, load format and platform; --match-ignore\n"
            "names the axes to leave out explicitly. A key matching two cells of one run is an error.\n\n"
            "Reports verdict changes, new failure reasons, output divergence per prompt (first\n"
            "differing token of each cell's first clean run, by --compare-mode) and fingerprint\n"
            "changes (vLLM,\n"
            "runai-model-streamer, torch, ... and image digest).\n\n"
            "Performance: per metric, the ratio of the cells' medians over runs with a bootstrap 95 %\n"
            "interval; 'slower' when the whole interval lies beyond the metric's threshold, 'cannot\n"
            "tell' when it straddles it or a side has fewer than 3 runs.\n\n"
            "Exit 1 on a regression: a matched cell that passed in A and fails or is flaky in B, that\n"
            "is slower in B, or that shows failure reasons in B it did not show in A. Exit 0 otherwise (cells only in\n"
            "one run and output divergence alone are reported, not regressions); 2 on usage errors."
        ),
    )
    cmp.add_argument("a", metavar="RESULTS_A", help="the reference run's results folder (e.g. the previous tag)")
    cmp.add_argument("b", metavar="RESULTS_B", help="the run under test's results folder")
    cmp.add_argument("--match-ignore", action="append", choices=AXES, default=[], metavar="AXIS",
                     help=f"match cells without this axis ({', '.join(AXES)}); repeatable")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.add_argument("--threshold", action="append", default=[], metavar="METRIC=RATIO",
                     help="slowdown threshold of one metric (repeatable), e.g. boot_s=1.5; metrics: "
                          + ", ".join(f"{m.name} (default {m.threshold})" for m in METRICS.values()))
    cmp.add_argument("--verbose", action="store_true", help="also list the metrics that did not change")
    _compare_flags(cmp, "compare outputs by this rule (default: run A's config's `comparison`)")
    cmp.set_defaults(func=cmd_compare)
    for name in ("versions", "bisect"):
        _versions_parser(sub, name)
    insp = sub.add_parser("inspect", help="read a checkpoint's safetensors headers: shards, index, dtypes, #157 risk")
    insp.add_argument("ckpt", help="checkpoint directory, or s3://bucket/prefix (read with ranged requests under "
                                   "AWS_ENDPOINT_URL or RUNAI_STREAMER_S3_ENDPOINT and the AWS credential variables)")
    insp.add_argument("--json", action="store_true", help="print the report as JSON")
    insp.set_defaults(func=cmd_inspect)
    audit = sub.add_parser("audit", help="stream every tensor through the real loader and compare with the files")
    audit.add_argument("ckpt", help="checkpoint directory, or s3://bucket/prefix (streamed through the streamer's S3 "
                                    "back-end, runai-model-streamer-s3, under the same variables as inspect)")
    audit.add_argument("--python", help="Python of the system under test (default: .venv-vllm/bin/python, else python3)")
    audit.add_argument("--pythonpath", nargs="+", action="extend", default=[], metavar="DIR",
                       help="overlay put first on PYTHONPATH, e.g. one runai-model-streamer version")
    audit.add_argument("--orders", default=",".join(ORDERS), help="comma-separated file orders: sorted, reversed, listing")
    audit.add_argument("--shuffles", type=int, default=0, help="this many seeded random orders besides")
    audit.add_argument("--seed", type=int, default=0, help="seed of the shuffles")
    audit.add_argument("--env", nargs="+", action="extend", default=[], metavar="K=V",
                       help="environment of the loader, e.g. RUNAI_STREAMER_MEMORY_LIMIT=0")
    audit.add_argument("--loaders", default=",".join(LOADERS),
                       help="comma-separated: streamer (SafetensorsStreamer), vllm (vLLM's iterator, where vllm imports)")
    audit.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the whole probe may take")
    audit.add_argument("--image", metavar="REF",
                       help="run the probe in a container of this image (present here, nothing is pulled; no network): "
                            "--python is then the image's (default python3) and --pythonpath names folders inside it")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.set_defaults(func=cmd_audit)
    return p


def _versions_parser(sub, name: str) -> None:
    if name == "versions":
        v = sub.add_parser(
            "versions", help="one probe across the versions of one axis: outcome per version, regimes, change points",
            description=("Runs one probe per version, in the order given: the weight audit of a checkpoint "
                         "(--audit) across runai-model-streamer releases, or one cell of a matrix (--config, "
                         "--cell) across streamer releases or the matrix's images (vLLM venvs, container tags). "
                         "Writes versions.json, summary.md and a folder per probe; the same --dir continues."))
    else:
        v = sub.add_parser(
            "bisect", help="the version where a probe's outcome changes, between a passing and a failing one",
            description=("Binary search between --good and --bad (either may be the older) for the change point, "
                         "each version probed until settled (--rate, --confidence). Sees one change only: when "
                         "the range may hold several, run `regbench versions`. Exit 0 with a change point, 1 "
                         "without one (the good end fails, or the bad end passes), 130 interrupted."))
        v.add_argument("--good", required=True, metavar="V", help="a version that passes")
        v.add_argument("--bad", required=True, metavar="V", help="a version that fails")
    v.add_argument("--streamer", metavar="VERSIONS",
                   help="runai-model-streamer releases: A..B (every release from A to B the index has) or a,b,c; "
                        "installed on demand as overlays")
    v.add_argument("--images", metavar="NAMES", help="with --config: the matrix's images, in this order (a,b,c)")
    v.add_argument("--audit", metavar="CKPT", help="probe: the weight audit of this checkpoint")
    v.add_argument("--config", metavar="FILE", help="probe: one cell of this matrix (with --cell)")
    v.add_argument("--cell", metavar="ID", help="the cell to probe (`regbench plan` lists them)")
    v.add_argument("--python", help="with --audit: Python of the system under test (default: .venv-vllm/bin/python)")
    v.add_argument("--env", nargs="+", action="extend", default=[], metavar="K=V", help="with --audit: loader environment")
    v.add_argument("--orders", default="sorted,listing", help="with --audit: file orders (default: sorted,listing)")
    v.add_argument("--loaders", default="streamer", help="with --audit: loaders (default: streamer)")
    v.add_argument("--rate", type=float, default=0.5, metavar="P",
                   help="a passing version must have run enough to see a failure of this rate (default 0.5)")
    v.add_argument("--confidence", type=float, default=0.95, metavar="C", help="with this probability (default 0.95)")
    v.add_argument("--dir", metavar="DIR", help="the map's folder; an existing one continues (default: a new one)")
    v.add_argument("--results", default="results", help="parent of the default folder (default: results)")
    v.add_argument("--overlays", metavar="DIR", help="where streamer overlays are installed (default: .cache/streamers)")
    v.set_defaults(func=cmd_versions)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        err.print(f"regbench: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    except ResultsWriteError as exc:
        err.print(f"regbench: {exc}; every server was stopped", highlight=False, markup=False)
        return EXIT_WRITE
    except ResultsError as exc:
        err.print(f"regbench: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`regbench plan ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
