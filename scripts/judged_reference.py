"""The findings table of docs/judged.md, made from the taxonomy (bench/core/taxonomy.py, a
contract probe's entry in its module under bench/core/probes/), where it is written once: every
`Reason`, where the judge finds it and what it means. Never edited by hand: change the data,
then --write.

  .venv/bin/python scripts/judged_reference.py           print the table
  .venv/bin/python scripts/judged_reference.py --write   put it into docs/judged.md between the markers
  .venv/bin/python scripts/judged_reference.py --check   exit 1 if docs/judged.md differs from the
                                                         taxonomy, or a Reason is not in it
                                                         (scripts/lint.sh)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.taxonomy import taxonomy  # noqa: E402
from bench.core.verdicts import Reason  # noqa: E402

PAGE = ROOT / "docs" / "judged.md"
SECTION = "findings-reference"


def table() -> str:
    rows = ["| Finding | Found | What it means |", "|---|---|---|"]
    for entry in taxonomy():
        cell = entry.text.replace("|", "\\|")
        rows.append(f"| `{entry.reason}` | {entry.found} (`{entry.function}`) | {cell} |")
    return "\n".join(rows)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_table

    args = readme_table.arguments(__doc__.splitlines()[0], PAGE)
    listed = {e.reason for e in taxonomy()}
    bad = [f"Reason {r.value!r} is not in the taxonomy (bench/core/taxonomy.py)" for r in Reason if r not in listed]
    return readme_table.generated(args, SECTION, table(), "the taxonomy", "scripts/judged_reference.py",
                                  "findings reference", "docs/judged.md lists every finding of the taxonomy", bad)


if __name__ == "__main__":
    sys.exit(main())
