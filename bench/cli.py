"""The `regbench` command: one module per subcommand in bench/commands/, each with its arguments
(`add_cli_args`) beside its `main`. Errors are caught here once: every error regbench reports
derives from bench.core.errors.RegbenchError and carries its exit code.

Exit codes: 0 every cell passed, 1 a cell failed or was flaky, 2 usage or config error, 3 the
results could not be written (disk full, read-only: servers are stopped, what was written stays
readable and `--resume` continues), 130 interrupted (Ctrl-C or SIGTERM; servers are stopped first)."""

from __future__ import annotations

import argparse
import os
import sys

from bench.bugreport import command as report_bug
from bench.commands import audit, clean, compare, diagnose, inspect, merge, plan, report, run
from bench.console import err
from bench.core.errors import RegbenchError
from bench.history import command as history
from bench.versions import command as versions

# In the order `regbench --help` lists them.
COMMANDS = (plan, run, merge, clean, report, diagnose, report_bug, compare, history, versions, inspect, audit)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="regbench", description="End-to-end serving regression bench for vLLM.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_cli_args(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except RegbenchError as exc:
        err.print(f"regbench: {exc}{exc.after}", highlight=False, markup=False)
        return exc.exit_code
    except BrokenPipeError:
        # The reader went away (`regbench plan ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
