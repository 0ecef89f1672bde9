"""runai-model-streamer releases side by side: overlays installed on demand, and the release list.

An overlay is one release installed with `pip install --no-deps --target DIR`, put first on a
run's PYTHONPATH (see bench.core.config.Image.pythonpath): the same venv then runs any release
without reinstalling. Each is installed by the system-under-test's own pip, so the wheel fits its
Python and platform, from whatever index the machine's pip configuration names, into a scratch
folder renamed into place when complete: a killed install never leaves a half overlay that looks
installed, and two benches installing the same release do not collide.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from bench.core.errors import RegbenchError

PACKAGE = "runai-model-streamer"
MODULE = "runai_model_streamer"
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
INSTALL_TIMEOUT_S = 600.0


class OverlayError(RegbenchError, RuntimeError):
    """A release that cannot be listed or installed: the index does not have it, pip failed."""


def default_cache(root: Path) -> Path:
    return root / ".cache" / "streamers"


def overlay_path(cache: Path, version: str) -> Path:
    if not VERSION.match(version):
        raise OverlayError(f"{version!r} is not a version")
    return cache / version


def installed(cache: Path, version: str) -> bool:
    return (overlay_path(cache, version) / MODULE).is_dir()


def ensure_overlay(python: str, cache: Path, version: str) -> Path:
    """The overlay folder of `version`, installed first if it is not there yet."""
    target = overlay_path(cache, version)
    if installed(cache, version):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=cache))
    try:
        done = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--target", str(scratch), f"{PACKAGE}=={version}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0 or not (scratch / MODULE).is_dir():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise OverlayError(f"{PACKAGE}=={version} did not install with {python} -m pip:\n{tail}")
        try:
            scratch.rename(target)
        except OSError:
            if not installed(cache, version):  # not another bench that got there first
                raise
    except subprocess.TimeoutExpired:
        raise OverlayError(f"installing {PACKAGE}=={version} took over {INSTALL_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise OverlayError(f"cannot install {PACKAGE}=={version} with {python}: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def available_versions(python: str, package: str = PACKAGE) -> list[str]:
    """Every release of `package` the machine's index has, oldest first (pip's own `index versions`)."""
    try:
        done = subprocess.run([python, "-m", "pip", "index", "versions", "--disable-pip-version-check", package],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OverlayError(f"cannot list {package} releases with {python}: {exc}") from None
    found = re.search(r"^Available versions:\s*(.+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise OverlayError(f"cannot list {package} releases with {python} -m pip index versions:\n"
                           + (done.stderr or done.stdout).strip()[-500:])
    return sort_versions(v.strip() for v in found.group(1).split(","))


def sort_versions(versions) -> list[str]:
    try:
        return sorted(set(versions), key=Version)
    except InvalidVersion as exc:
        raise OverlayError(str(exc)) from None


def select_versions(spec: str, available: list[str] | None, package: str = PACKAGE) -> list[str]:
    """`A..B`: every release from A to B inclusive (`available` must be given), final releases
    only; otherwise a comma-separated list, kept in the order written."""
    if ".." in spec:
        low, _, high = spec.partition("..")
        try:
            lo, hi = Version(low.strip()), Version(high.strip())
        except InvalidVersion as exc:
            raise OverlayError(f"{spec!r}: {exc}") from None
        if available is None:
            raise OverlayError(f"{spec!r}: a range needs the release list")
        out = [v for v in available if lo <= Version(v) <= hi and not Version(v).is_prerelease]
        if not out:
            raise OverlayError(f"no {package} release between {low} and {high}")
        return out
    out = [v.strip() for v in spec.split(",") if v.strip()]
    for v in out:
        overlay_path(Path("."), v)
    if len(set(out)) != len(out) or not out:
        raise OverlayError(f"{spec!r}: give each version once")
    return out
