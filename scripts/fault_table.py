"""The fault table of docs/faults.md, made from the fault ledger the test suite writes (results/faults.json:
one row per test marked `@pytest.mark.fault`, see tests/conftest.py). Never edited by hand.

  .venv/bin/python scripts/fault_table.py           print the table of the last suite run
  .venv/bin/python scripts/fault_table.py --write   put it into docs/faults.md between the markers
  .venv/bin/python scripts/fault_table.py --check   exit 1 if a fault was not survived, a record
                                                    was lost or a process left, a test did not
                                                    count what was lost and left, or the page's
                                                    table lists other faults (scripts/test.sh);
                                                    other differences in the figures are shown

The figures are what each test counted once the fault was over (records on disk against answers
sent, live processes and containers carrying the run's label), recorded before the test asserts
on them: a leak is a number in the table of a failing run. A row whose test failed before it
counted has no figures; it shows as "not counted", never as 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import readme_table

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "results" / "faults.json"
PAGE = ROOT / "docs" / "faults.md"
SECTION = "fault-table"  # the page's markers


def counted(row: dict) -> bool:
    """Whether the test recorded its figures (a test that failed before it counted did not)."""
    return "verdict" in row and row.get("processes_left") is not None


def figure(rows: list[dict], key: str, bold: bool = False) -> str:
    """The sum of what the rows counted; '—' where no row involves it (records_lost is None: no
    request); rows that counted nothing are named, never added as 0."""
    values = [r[key] for r in rows if counted(r) and r.get(key) is not None]
    text = str(sum(values)) if values else "—"
    text = f"**{text}**" if bold else text
    missing = sum(not counted(r) for r in rows)
    return text + (f" ({missing} not counted)" if missing else "")


def table(rows: list[dict]) -> str:
    kinds: dict[str, list[dict]] = {}
    for row in rows:
        kinds.setdefault(row["kind"], []).append(row)
    lines = [
        "| Fault injected | Survived (tests) | Cases | What the bench did | Finished records lost | Processes / containers left |",
        "|---|---|---|---|---|---|",
    ]
    for kind, group in sorted(kinds.items()):
        survived = sum(r["survived"] for r in group)
        verdicts = "; ".join(sorted({r.get("verdict") or "(no result)" for r in group}))
        lines.append(
            f"| {kind} | {survived}/{len(group)} | {sum(r.get('cases') or 0 for r in group)} | {verdicts} "
            f"| {figure(group, 'records_lost')} | {figure(group, 'processes_left')} |"
        )
    lines.append(
        f"| **{len(kinds)} kinds** | **{sum(r['survived'] for r in rows)}/{len(rows)}** "
        f"| **{sum(r.get('cases') or 0 for r in rows)}** | | {figure(rows, 'records_lost', True)} "
        f"| {figure(rows, 'processes_left', True)} |"
    )
    return "\n".join(lines)


def problems(rows: list[dict]) -> list[str]:
    """The rows --check fails on, from the figures their tests counted."""
    bad = []
    for r in rows:
        if not counted(r):
            bad.append(f"{r['test']}: failed before it counted what was lost and left (survived {r['survived']})")
            continue
        lost, left = r.get("records_lost") or 0, r["processes_left"]
        if not r["survived"] or lost != 0 or left != 0:
            bad.append(f"{r['test']}: survived {r['survived']}, records lost {r.get('records_lost')}, "
                       f"processes left {left}")
    return bad


def main() -> int:
    args = readme_table.arguments(__doc__.splitlines()[0], PAGE, LEDGER)
    rows = json.loads(args.ledger.read_text())
    made = table(rows)
    if readme_table.write_or_show(args, SECTION, made):
        return 0
    same, differ = readme_table.check(SECTION, made, "scripts/fault_table.py", args.page)
    return readme_table.verdict("fault table", problems(rows) + differ,
                                f"{len(rows)} fault tests survived, and counted nothing lost, nothing left running"
                                + ("" if same else " (figures above differ from the page's)"))


if __name__ == "__main__":
    sys.exit(main())
