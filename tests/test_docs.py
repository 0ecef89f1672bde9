"""The documentation: the README is short and reaches every docs page, links resolve, and the
files the pages name exist."""

from __future__ import annotations

import re
from pathlib import Path

from .support import ROOT

NAMED = re.compile(r"\b((?:bench|scripts|tests|configs|docker)/[\w./-]*\.(?:py|sh|yaml|Dockerfile))\b")
# The workflows and the docs pages (their leading dot and folder are no word boundary).
NAMED_DOTTED = re.compile(r"(?<![\w./-])((?:\.github/workflows|docs)/[\w.-]+\.(?:yml|md))\b")
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, ROOT / "results" / "README.md", *DOCS]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
README_MAX_LINES = 200


def named_in(text: str) -> set[str]:
    return set(NAMED.findall(text)) | set(NAMED_DOTTED.findall(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of every relative link of a page, outside code blocks."""
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page.resolve(), anchor))
    return out


def broken_links(page: Path) -> list[str]:
    bad = []
    for target, anchor in links(page):
        if not target.exists():
            bad.append(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
            bad.append(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}#{anchor}: no such heading")
    return bad


# A section of the README named in prose, not linked: "(README *Exit codes*)".
README_SECTION = re.compile(r"\bREADME\s+\*([^*]+)\*")


def unknown_readme_sections(page: Path) -> list[str]:
    """The README sections a page names in prose that no heading of the README starts with."""
    headings = anchors(README.read_text(encoding="utf-8"))
    named = (" ".join(n.split()) for n in README_SECTION.findall(FENCE.sub("", page.read_text(encoding="utf-8"))))
    return [n for n in named if not any(h.startswith(slug(n)) for h in headings)]


def reachable(start: Path) -> set[Path]:
    seen, todo = set(), [start.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += [target for target, _ in links(page)]
    return seen


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


def test_the_link_checks_can_fail(tmp_path: Path):
    (tmp_path / "a.md").write_text("# A page\n\n## Some `code`: here\n\n[x](b.md) [y](a.md#nowhere) [z](#some-code-here)\n"
                                   "```\n[not a link](c.md)\n```\n[w](https://example.test/)\n")
    (tmp_path / "b.md").write_text("# B\n\n[back](a.md)\n")
    (tmp_path / "lonely.md").write_text("# nobody links here\n")
    assert slug("Models in object storage (`s3://`)") == "models-in-object-storage-s3"
    assert anchors((tmp_path / "a.md").read_text()) == {"a-page", "some-code-here"}
    assert broken_links(tmp_path / "a.md") == [f"{tmp_path / 'a.md'}#nowhere: no such heading"]
    assert reachable(tmp_path / "a.md") == {(tmp_path / "a.md").resolve(), (tmp_path / "b.md").resolve()}


def test_every_link_of_the_readme_and_the_docs_resolves():
    bad = {str(page.relative_to(ROOT)): broken for page in [README, *DOCS] if (broken := broken_links(page))}
    assert bad == {}


def test_every_readme_section_the_docs_name_in_prose_is_a_heading_of_it(tmp_path: Path):
    bad = {str(page.relative_to(ROOT)): unknown for page in DOCS if (unknown := unknown_readme_sections(page))}
    assert bad == {}
    (tmp_path / "p.md").write_text("see README *Exit codes*, README *A matrix* and (README\n  *Which version\n  broke it*)\n")
    assert unknown_readme_sections(tmp_path / "p.md") == ["Which version broke it"]


def test_every_docs_page_is_reachable_from_the_readme():
    unreached = sorted(str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in reachable(README))
    assert unreached == []


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    # .ci/run runs the README's test command; the smoke command is the other one of the two.
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    commands = re.search(r"## Two commands on a fresh machine\n\n```sh\n(.*?)```", text, re.S)
    assert commands, "the README's two commands"
    assert [line.split()[0] for line in commands.group(1).splitlines()] == ["scripts/smoke.sh", "scripts/test.sh"]
    for heading in ("## Exit codes", "## How to read a result", "## Where to go next"):
        assert heading in text


def test_the_generated_tables_are_in_the_docs_page_their_scripts_write():
    faults = (ROOT / "docs" / "faults.md").read_text(encoding="utf-8")
    for name in ("fault-table", "false-alarm-table", "detection-table"):
        assert f"<!-- {name}:begin -->" in faults and f"<!-- {name}:end -->" in faults
        assert f"<!-- {name}:begin -->" not in README.read_text(encoding="utf-8")
    assert "<!-- matrix-reference:begin -->" in (ROOT / "docs" / "matrix.md").read_text(encoding="utf-8")


def test_the_release_map_in_the_readme_and_in_the_measurements_agree():
    def table(text: str) -> str:
        return text[text.index("| releases | outcome |"):].split("\n\n", 1)[0]
    assert table(README.read_text(encoding="utf-8")) == table((ROOT / "docs" / "measurements.md").read_text(encoding="utf-8"))


def test_the_architecture_map_names_every_module():
    """docs/architecture.md's map (its first fenced block): every package of bench/ has an entry,
    and every module of it is named there, by its path or, in its package's entry, by its name."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = FENCE.search(text).group(0)
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines()[1:-1]:
        head = line[:22].strip(" │")
        if head:
            current = head
        entries[current] = entries.get(current, "") + " " + line[22:]
    missing = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py") or rel in entries:
            continue
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        if package not in entries or not re.search(rf"\b{path.stem}\b", entries[package]):
            missing.append(rel)
    assert missing == [], f"not named in docs/architecture.md's map: {missing}"
