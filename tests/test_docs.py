"""The documentation names files that exist."""

from __future__ import annotations

import re

from .support import ROOT

NAMED = re.compile(r"\b((?:bench|scripts|tests|configs)/[\w./-]*\.(?:py|sh|yaml))\b")


def test_every_file_the_readmes_name_exists():
    for readme in (ROOT / "README.md", ROOT / "results" / "README.md"):
        named = set(NAMED.findall(readme.read_text(encoding="utf-8")))
        assert named, readme
        missing = sorted(n for n in named if not (ROOT / n).exists())
        assert missing == [], f"{readme.relative_to(ROOT)} names {missing}"
