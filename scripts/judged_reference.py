"""The findings table of docs/judged.md, made from the taxonomy at the top of
bench/core/verdicts.py, where it is written once: every `Reason`, where the judge finds it and
what it means. Never edited by hand: change the docstring, then --write.

  .venv/bin/python scripts/judged_reference.py           print the table
  .venv/bin/python scripts/judged_reference.py --write   put it into docs/judged.md between the markers
  .venv/bin/python scripts/judged_reference.py --check   exit 1 if docs/judged.md differs from the
                                                         taxonomy, or a Reason is not in it
                                                         (scripts/lint.sh)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core import verdicts  # noqa: E402

PAGE = ROOT / "docs" / "judged.md"
SECTION = "findings-reference"
# A finding's entry in the docstring: four spaces, its name, spaces, the text; the text goes on
# in lines indented past the name's column.
ENTRY = re.compile(r"^    ([a-z_]+)\s+(\S.*)$")
HEADING = re.compile(r"^(Per [^(]+?)\s*\(([^)]+)\)$")


def taxonomy() -> list[tuple[str, str, str, str]]:
    """(reason, where it is found, the function that finds it, what it means), in the docstring's order."""
    reasons = {r.value for r in verdicts.Reason}
    out: list[list[str]] = []
    where = function = ""
    for line in (verdicts.__doc__ or "").splitlines():
        if (heading := HEADING.match(line)) is not None:
            where, function = heading.group(1), heading.group(2)
            out.append([])  # a section ends the entry before it
            continue
        if (entry := ENTRY.match(line)) is not None and entry.group(1) in reasons:
            out.append([entry.group(1), where, function, entry.group(2)])
        elif out and out[-1] and line.startswith(" " * 20) and line.strip():
            out[-1][3] += " " + line.strip()
        elif (not line.strip() or not line.startswith(" " * 20)) and out and out[-1]:
            out.append([])  # a blank or less indented line ends the entry
    return [(r, w, f, t) for r, w, f, t in (e for e in out if e)]


def table() -> str:
    rows = ["| Finding | Found | What it means |", "|---|---|---|"]
    for reason, where, function, text in taxonomy():
        cell = text.replace("|", "\\|")
        rows.append(f"| `{reason}` | {where} (`{function}`) | {cell} |")
    return "\n".join(rows)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_table

    args = readme_table.arguments(__doc__.splitlines()[0], PAGE)
    listed = {r for r, *_ in taxonomy()}
    bad = [f"Reason {r.value!r} is not in bench/core/verdicts.py's taxonomy" for r in verdicts.Reason
           if r.value not in listed]
    return readme_table.generated(args, SECTION, table(), "the taxonomy", "scripts/judged_reference.py",
                                  "findings reference", "docs/judged.md lists every finding of the taxonomy", bad)


if __name__ == "__main__":
    sys.exit(main())
