"""A table of the README kept between two markers and made from what the suite measured
(scripts/fault_table.py, scripts/false_alarm_table.py): read it, replace it, check it."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def section(name: str) -> str:
    text = README.read_text()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    return text[text.index(begin) + len(begin):text.index(end)].strip()


def write(name: str, made: str) -> None:
    text = README.read_text()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    start, stop = text.index(begin) + len(begin), text.index(end)
    README.write_text(text[:start] + "\n" + made + "\n" + text[stop:])


def rows_named(markdown: str) -> set[str]:
    """The first column of every row but the header, its rule and the total."""
    return {line.split("|")[1].strip() for line in markdown.splitlines()[2:-1]}


def check(name: str, made: str, script: str) -> tuple[bool, list[str]]:
    """Prints how the README's table differs from `made`; returns (same, problems): a problem
    when the two tables name other rows."""
    current = section(name)
    if current != made:
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(True), made.splitlines(True), "README.md", "this suite run"))
    problems = []
    if rows_named(current) != rows_named(made):
        problems.append(f"the README's table lists other rows than this suite run: run {script} --write after a full run")
    return current == made, problems
