"""What every command shares: the consoles, Ctrl-C and SIGTERM, the progress line, the cause
lines, and flags that several commands take."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.core.config import ENV_NAME, Comparison, ConfigError
from bench.core.diagnosis import Diagnosis
from bench.core.errors import EXIT_FAIL, EXIT_PASS, EXIT_USAGE
from bench.core.judge import RunMark, run_mark
from bench.core.records import Finding, RunRecord, TokenDiff
from bench.store.publish import open_results

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

    def run_done(self, record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> None:
        self.bar.advance(self.task)
        self.bar.console.print(run_line(record, findings, divergence))

    def stop(self) -> None:
        self.bar.stop()


def run_line(record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> str:
    """One finished run for the console: ✓ only for a run the cell verdict cannot contradict.
    `findings`: the run's own, as the judge made them."""
    boot = f"boot {record.server.boot_s:.0f} s" if record.server.boot_s is not None else "no boot"
    head = f"{record.cell_id} #{record.repeat} ({boot})"
    mark, what = run_mark(record, findings, divergence)
    if mark == RunMark.INTERRUPTED:
        return f"[yellow]-[/] {head}: interrupted"
    if mark == RunMark.NOT_RUNNABLE:
        return f"[dim]–[/] {head}: not_runnable, not a failure ({'; '.join(what)})"
    if mark == RunMark.FAILED:
        return f"[red]✗[/] {head}: {', '.join(what)}"
    if mark == RunMark.PENDING and what:
        return f"[yellow]?[/] {head}: missed {', '.join(what)}; counted unless the baseline misses it too"
    if mark == RunMark.PENDING:
        return f"[yellow]?[/] {head}: no finding of its own; compared with the baseline once it has a clean run"
    return f"[green]✓[/] {head}"


def interrupt_on_sigterm() -> None:
    # SIGTERM (CI cancelling a job) takes the same clean path as Ctrl-C.
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A process started in the background by a non-interactive shell (a CI step's `cmd &`, nohup)
    # inherits SIGINT ignored, and Python then leaves it so: Ctrl-C or a runner's SIGINT would
    # let the servers run on. The bench always stops them cleanly instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


def print_causes(diagnosis: Diagnosis, results: Path) -> None:
    for line in cause_lines(diagnosis, results):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def comparison(args: argparse.Namespace, config_of: Path) -> Comparison | None:
    """The rule --compare-mode/--top-k ask to judge by instead of each cell's own; None: theirs."""
    if args.compare_mode is None:
        return None
    k = args.top_k if args.top_k is not None else open_results(config_of).config().comparison.top_k
    return Comparison(mode=args.compare_mode, top_k=k)


def compare_flags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--compare-mode", choices=["exact", "logprobs"], help=what)
    parser.add_argument("--top-k", type=int, choices=range(1, 21), metavar="K",
                        help="with --compare-mode logprobs: how many alternatives count (default: the config's)")


class _JsonAlias(argparse.Action):
    """`--json`, the spelling of `--format json` before it was one across the commands: still
    read, so that scripts and CI written for it keep working, but no longer shown."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        err.print("regbench: --json is deprecated; use --format json", highlight=False, markup=False)
        setattr(namespace, self.dest, "json")


def format_flag(parser: argparse.ArgumentParser, choices: list[str], help: str) -> None:
    """`--format`, the one spelling of machine-readable output on every command: `choices[0]` is
    the human output and the default, `json` is always among them."""
    assert "json" in choices
    parser.add_argument("--format", choices=choices, default=choices[0], help=help)
    parser.add_argument("--json", action=_JsonAlias, dest="format")


def env_pairs(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise ConfigError(f"--env {pair!r}: expected NAME=VALUE")
        env[key] = value
    return env


def name_list(value: str, flag: str, known: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ConfigError(f"{flag} {value!r}: a comma-separated list of {', '.join(known)}")
    return names


def emit(report, form: str, render) -> int:
    """Prints an inspect or audit report in its `--format`; exit 1 when it found a problem, 2 when
    an audit could not tell (the reader cannot drive the loader release)."""
    if form == "json":
        print(report.model_dump_json(indent=2))
    else:
        for part in render(report):
            out.print(part, highlight=False)
    if report.ok:
        return EXIT_PASS
    return EXIT_FAIL if report.problems else EXIT_USAGE
