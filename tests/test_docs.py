"""The documentation names files that exist."""

from __future__ import annotations

import re

from .support import ROOT

NAMED = re.compile(r"\b((?:bench|scripts|tests|configs|docker)/[\w./-]*\.(?:py|sh|yaml|Dockerfile))\b")
# The workflows and the docs pages (their leading dot and folder are no word boundary).
NAMED_DOTTED = re.compile(r"(?<![\w./-])((?:\.github/workflows|docs)/[\w.-]+\.(?:yml|md))\b")
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def named_in(text: str) -> set[str]:
    return set(NAMED.findall(text)) | set(NAMED_DOTTED.findall(text))


def test_the_patterns_find_what_a_page_names():
    text = ("see `.github/workflows/nightly.yml`, docs/qualify-gpu-host.md and configs/h200.yaml,"
            " not x/docs/a.md or platforms/NAME.yaml")
    assert named_in(text) == {".github/workflows/nightly.yml", "docs/qualify-gpu-host.md", "configs/h200.yaml"}


def test_every_file_the_readmes_and_docs_name_exists():
    assert (ROOT / "docs" / "qualify-gpu-host.md") in PAGES
    for page in PAGES:
        named = named_in(page.read_text(encoding="utf-8"))
        assert named, page
        missing = sorted(n for n in named if not (ROOT / n).exists())
        assert missing == [], f"{page.relative_to(ROOT)} names {missing}"
