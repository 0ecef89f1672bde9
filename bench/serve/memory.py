"""How much memory a server holds, sampled while it runs: resident memory of a local server's
processes, a container's memory as its cgroup counts it, and GPU memory where nvidia-smi exists.

The GPU part runs only on hosts with `nvidia-smi` (not on the CPU machines the tests run on):
its parsing is tested on nvidia-smi's documented CSV output, the call itself only on GPU hosts.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable

import psutil

SAMPLE_S = 0.5
NVIDIA_SMI_TIMEOUT_S = 10.0


def rss_of_tree(pid: int) -> int | None:
    """Resident bytes of a process and all its descendants (vLLM's API server, engine core and
    workers); None once it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue  # exited between the listing and the read
    return total


def pids_of_tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def parse_compute_apps(text: str, pids: Iterable[int]) -> int | None:
    """Bytes of GPU memory used by `pids`, from `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` (one "pid, MiB" line per process and GPU); None: none of them."""
    wanted = set(pids)
    total, seen = 0, False
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if int(parts[0]) in wanted and parts[1].replace(".", "", 1).isdigit():
            total += int(float(parts[1]) * 2**20)
            seen = True
    return total if seen else None


def gpu_bytes(pids: set[int]) -> int | None:
    """GPU memory of these processes, or None where there is no nvidia-smi (or it fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not pids:
        return None
    try:
        done = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_apps(done.stdout, pids) if done.returncode == 0 else None


class PeakSampler:
    """Samples `measure()` -> (host bytes, GPU bytes) every SAMPLE_S in a thread; keeps the peaks."""

    def __init__(self, measure: Callable[[], tuple[int | None, int | None]]):
        self.measure = measure
        self.peak_host: int | None = None
        self.peak_gpu: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regbench-memory", daemon=True)

    def start(self) -> PeakSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.sample()
            if self._done.wait(SAMPLE_S):
                return

    def sample(self) -> None:
        try:
            host, gpu = self.measure()
        except Exception:
            return  # a server on its way out: the peak so far stands
        if host is not None:
            self.peak_host = max(self.peak_host or 0, host)
        if gpu is not None:
            self.peak_gpu = max(self.peak_gpu or 0, gpu)

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
