"""The set-up scripts' pure parts, without network or root: scripts/debian-mirror.sh finds the
Debian mirror for debootstrap in fake apt configurations (deb822 and classic formats), and no
package host is written into the repository (the mirror and wheel sources are the machine's)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIRROR_SCRIPT = ROOT / "scripts" / "debian-mirror.sh"
VAR = "REGBENCH_DEBIAN_MIRROR"

# Hosts under reserved names (RFC 2606 / 6761): never a real mirror.
MAIN = "http://main.mirror.test/debian"
OTHER = "https://other.mirror.test/debian"
SECURITY = "http://security.mirror.test/debian-security"

DEB822 = f"""\
Types: deb
# a comment inside a stanza: {OTHER}
URIs: {SECURITY}
Suites: bookworm-security
Components: main

Types: deb-src
URIs: {OTHER}
Suites: bookworm
Components: main

Types: deb
URIs: {OTHER}
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: {MAIN}
  {OTHER}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

CLASSIC = f"""\
# deb {OTHER} bookworm main
deb-src {OTHER} bookworm main
deb {SECURITY} bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MAIN} bookworm main contrib
deb {OTHER} bookworm main
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / "etc" / "apt" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def mirror(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REGBENCH_DEBIAN_")}
    environ.update(env)
    return subprocess.run(["bash", str(MIRROR_SCRIPT), str(root)], capture_output=True, text=True,
                          env=environ, timeout=30)


def test_deb822_only(tmp_path: Path) -> None:
    # A disabled file sorts first and names another mirror: apt ignores it, and so must we.
    write(tmp_path, "sources.list.d/0-other.sources.disabled", f"Types: deb\nURIs: {OTHER}\nSuites: bookworm\n")
    write(tmp_path, "sources.list.d/debian.sources", DEB822)
    out = mirror(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == MAIN + "\n"


def test_deb822_field_names_are_case_insensitive_and_tabs_separate(tmp_path: Path) -> None:
    write(tmp_path, "sources.list.d/debian.sources", f"types:\tdeb\nuris:\t{MAIN}\nsuites:\tbookworm\n")
    assert mirror(tmp_path).stdout == MAIN + "\n"


def test_classic_only(tmp_path: Path) -> None:
    write(tmp_path, "sources.list", CLASSIC)
    out = mirror(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == MAIN + "\n"


def test_classic_in_sources_list_d(tmp_path: Path) -> None:
    write(tmp_path, "sources.list.d/debian.list", CLASSIC)
    write(tmp_path, "sources.list.d/zz.list.save", f"deb {OTHER} bookworm main\n")
    assert mirror(tmp_path).stdout == MAIN + "\n"


def test_both_formats_in_apts_reading_order(tmp_path: Path) -> None:
    # apt reads sources.list first, then sources.list.d/ in name order.
    write(tmp_path, "sources.list", f"deb {OTHER} bookworm main\n")
    write(tmp_path, "sources.list.d/debian.sources", DEB822)
    assert mirror(tmp_path).stdout == OTHER + "\n"
    # sources.list has no bookworm line: the first file in sources.list.d that has one.
    write(tmp_path, "sources.list", f"deb {SECURITY} bookworm-security main\n")
    write(tmp_path, "sources.list.d/a-other.list", f"deb {OTHER} trixie main\n")
    write(tmp_path, "sources.list.d/z-more.list", f"deb {OTHER} bookworm main\n")
    assert mirror(tmp_path).stdout == MAIN + "\n"


@pytest.mark.parametrize("layout", ["empty", "no-apt-dir", "security-and-updates-only"])
def test_none_found_fails_naming_the_variable(tmp_path: Path, layout: str) -> None:
    if layout == "empty":
        (tmp_path / "etc" / "apt" / "sources.list.d").mkdir(parents=True)
    elif layout == "security-and-updates-only":
        write(tmp_path, "sources.list", f"deb {SECURITY} bookworm-security main\n")
        write(tmp_path, "sources.list.d/debian.sources",
              f"Types: deb\nURIs: {OTHER}\nSuites: bookworm-updates bookworm-backports\n")
    out = mirror(tmp_path)
    assert out.returncode != 0
    assert out.stdout == ""
    assert VAR in out.stderr


def test_the_variable_wins(tmp_path: Path) -> None:
    write(tmp_path, "sources.list.d/debian.sources", DEB822)
    write(tmp_path, "sources.list", CLASSIC)
    out = mirror(tmp_path, **{VAR: "file:///srv/debian"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "file:///srv/debian\n"
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert mirror(empty, **{VAR: "file:///srv/debian"}).stdout == "file:///srv/debian\n"


# Hosts a URL in the repository may name: this machine, one filled in at run time (a template
# or variable), reserved test names, and the CI-runner registration placeholder in the README.
ALLOWED_HOST = re.compile(r"(127\.0\.0\.1|localhost)(:.*)?$|.*[{$%<]|.*\.(test|invalid|example)$|github\.com$")
# Object-store URIs (s3://, gs://, az://) name a bucket, not a host.
URL = re.compile(r"\b(?!(?:s3|gs|az)://)[a-z][a-z0-9+.-]*://([^/\s\"'`<>)\]]*)")


def test_no_package_host_is_named_in_the_repository() -> None:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for rel in filter(None, listed.split("\0")):
        path = ROOT / rel
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for m in URL.finditer(text):
            host = m.group(1).rsplit("@", 1)[-1]
            if host and not ALLOWED_HOST.match(host):
                found.append(f"{rel}: {m.group(0)}")
    assert not found, "a host is named in the repository (take it from the machine's configuration):\n" + "\n".join(found)
