"""Leftovers: what a killed bench left running, found by the labels every server carries.

Every server and container a bench starts carries its owner: the host, the bench's pid and that
process's start time (a pid alone is reused). `regbench clean` removes by default only what
belongs to benches that are gone, so that on a shared host it never takes down another bench's
live servers (device slots exist for benches side by side). A local server's processes carry
the owner and their run's folder in their environment (OWNER_VAR, RUN_LABEL); containers carry
them as labels (bench.serve.launch_docker).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import psutil

from bench.serve.protocols import Cleaned

RUN_LABEL = "REGBENCH_RUN_DIR"
OWNER_VAR = "REGBENCH_OWNER"  # a local server's environment; containers: the label LABEL.owner


def owner_tag() -> str:
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time():.2f}"


def owner_gone(tag: str | None) -> tuple[bool, str]:
    """(whether the bench that started it is gone, why it is kept when not)."""
    if not tag:
        return False, "it names no owner (started by an older regbench?)"
    host, _, rest = tag.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname():
        return False, f"its bench ran on host {host}: whether it still runs cannot be told from here"
    try:
        pid, start = int(pid_text), float(started)
        alive = abs(psutil.Process(pid).create_time() - start) < 0.05
    except (ValueError, psutil.Error):
        return True, ""
    return (False, f"its bench (pid {pid} on this host) is still running") if alive else (True, "")


def labelled_processes(run_id: str | None = None, run_dir: Path | None = None) -> list[int]:
    """Pids of live local servers started by regbench (of one results folder, of any run with
    that id, or of any), found by the label their environment carries: what a killed bench
    left behind. Linux /proc only."""
    def ours(value: str) -> bool:
        if run_dir is not None:
            return value.startswith(f"{run_dir}/cells/")
        return run_id is None or f"/{run_id}/cells/" in value

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        label = next((v for v in environ if v.startswith(RUN_LABEL.encode() + b"=")), None)
        if label is not None and state != "Z" and ours(label.decode(errors="replace").split("=", 1)[1]):
            found.append(int(entry.name))
    return found


def _environ_value(pid: int, name: str) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = next((v for v in environ if v.startswith(name.encode() + b"=")), None)
    return found.decode(errors="replace").split("=", 1)[1] if found is not None else None


def reap_local(run_id: str | None = None, run_dir: Path | None = None, only_gone: bool = False) -> Cleaned:
    """SIGKILLs the process groups of leftover local servers (with `only_gone`, only those whose
    bench is gone); says what it killed and what it kept."""
    removed, kept = [], []
    for pid in labelled_processes(run_id, run_dir):
        gone, why = owner_gone(_environ_value(pid, OWNER_VAR)) if only_gone else (True, "")
        if not gone:
            kept.append(f"local server process {pid}: {why}")
            continue
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        removed.append(f"local server process {pid}")
    return Cleaned(removed, kept)
