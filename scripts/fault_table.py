"""The README's fault table, made from the fault ledger the test suite writes (results/faults.json:
one row per test marked `@pytest.mark.fault`, see tests/conftest.py). Never edited by hand.

  .venv/bin/python scripts/fault_table.py           print the table of the last suite run
  .venv/bin/python scripts/fault_table.py --write   put it into README.md between the markers
  .venv/bin/python scripts/fault_table.py --check   exit 1 if a fault was not survived, a record
                                                    was lost or a process left, or README.md's
                                                    table lists other faults (scripts/test.sh);
                                                    other differences in the figures are shown
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import readme_table

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "results" / "faults.json"
SECTION = "fault-table"  # README.md's markers


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
        lost = [r["records_lost"] for r in group if r.get("records_lost") is not None]
        lines.append(
            f"| {kind} | {survived}/{len(group)} | {sum(r.get('cases') or 0 for r in group)} | {verdicts} "
            f"| {sum(lost) if lost else '—'} | {sum(r.get('processes_left') or 0 for r in group)} |"
        )
    lost_all = sum(r.get("records_lost") or 0 for r in rows)
    left_all = sum(r.get("processes_left") or 0 for r in rows)
    lines.append(
        f"| **{len(kinds)} kinds** | **{sum(r['survived'] for r in rows)}/{len(rows)}** "
        f"| **{sum(r.get('cases') or 0 for r in rows)}** | | **{lost_all}** | **{left_all}** |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args()
    rows = json.loads(args.ledger.read_text())
    made = table(rows)
    if args.write:
        readme_table.write(SECTION, made)
    elif args.check:
        bad = [f"{r['test']}: survived {r['survived']}, records lost {r.get('records_lost')}, "
               f"processes left {r.get('processes_left')}"
               for r in rows if not r["survived"] or r.get("records_lost") or r.get("processes_left")]
        same, problems = readme_table.check(SECTION, made, "scripts/fault_table.py")
        bad += problems
        for line in bad:
            print(f"fault table: {line}")
        if bad:
            return 1
        print(f"fault table: {len(rows)} fault tests survived, nothing lost, nothing left running"
              + ("" if same else " (figures above differ from the README's)"))
    else:
        print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
