"""How much memory a server holds, sampled while it runs: resident memory of a local server's
processes, a container's memory as its cgroup counts it, and GPU memory where nvidia-smi exists.

The GPU part runs where `nvidia-smi` is on PATH: the tests put a stand-in first on PATH
(tests/data/gpu-standin/nvidia-smi) that prints nvidia-smi's CSV, so the call, the parsing and
the mapping to the server's processes are exercised here; real figures only on GPU hosts.

Unified memory (GB10 / DGX Spark, Jetson Thor): nvidia-smi lists the server's processes with
`[N/A]` used memory, since GPU allocations are host memory. The host memory of the processes it
lists (their resident memory, or a container's cgroup memory) then counts as the GPU's.

Between fresh servers on unified-memory hosts the bench settles (settle_memory): it waits, bounded,
until MemAvailable (/proc/meminfo) is back near its level before the previous boot, dropping the
page cache first where allowed (root, and the bench configured to), and says how long it waited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

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


NOT_AVAILABLE = ("N/A", "[N/A]", "[Not Supported]", "Not Supported")


def parse_compute_apps(text: str, pids: Iterable[int]) -> int | None:
    """Bytes of GPU memory used by `pids`, from `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` (one "pid, MiB" line per process and GPU); None: none of them
    with a figure (see listed_without_figure for `[N/A]`)."""
    wanted = set(pids)
    total, seen = 0, False
    for pid, mib in _compute_apps(text):
        if pid in wanted and mib is not None:
            total += int(mib * 2**20)
            seen = True
    return total if seen else None


def listed_without_figure(text: str, pids: Iterable[int]) -> set[int]:
    """Those of `pids` that nvidia-smi lists with no used memory (`[N/A]`: unified memory)."""
    wanted = set(pids)
    return {pid for pid, mib in _compute_apps(text) if pid in wanted and mib is None}


def _compute_apps(text: str) -> list[tuple[int, float | None]]:
    out: list[tuple[int, float | None]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if parts[1].replace(".", "", 1).isdigit():
            out.append((int(parts[0]), float(parts[1])))
        elif parts[1] in NOT_AVAILABLE:
            out.append((int(parts[0]), None))
    return out


def compute_apps_text() -> str | None:
    """nvidia-smi's per-process memory CSV, or None where there is no nvidia-smi (or it fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpu_bytes(pids: set[int], host_bytes: Callable[[set[int]], int | None] | None = None) -> int | None:
    """GPU memory of these processes, or None where there is no nvidia-smi (or it fails, or lists
    none of them). Processes listed with `[N/A]` (unified memory) count with their host memory:
    `host_bytes(listed pids)`, by default their resident memory."""
    if not pids:
        return None
    text = compute_apps_text()
    if text is None:
        return None
    figure = parse_compute_apps(text, pids)
    unified = listed_without_figure(text, pids)
    if not unified:
        return figure
    host = (host_bytes or _rss_of)(unified)
    if host is None:
        return figure
    return (figure or 0) + host


def _rss_of(pids: set[int]) -> int | None:
    total, seen = 0, False
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
            seen = True
        except psutil.Error:
            continue
    return total if seen else None


MEMINFO = "/proc/meminfo"
DROP_CACHES = "/proc/sys/vm/drop_caches"


def mem_available(meminfo: str = MEMINFO) -> int | None:
    """MemAvailable in bytes, from a /proc/meminfo-format file."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                fields = line.split()
                return int(fields[1]) * (1024 if fields[2:3] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Settled:
    """How one settle went: the level it waited for, what it found, how long it took."""

    target_bytes: int
    available_bytes: int | None
    waited_s: float
    settled: bool
    dropped_caches: bool

    def text(self) -> str:
        gib = 2**30
        found = "unknown" if self.available_bytes is None else f"{self.available_bytes / gib:.1f} GiB"
        how = "back" if self.settled else "NOT back (gave up)"
        return (f"memory settle: MemAvailable {how} near {self.target_bytes / gib:.1f} GiB after "
                f"{self.waited_s:.1f} s (now {found})" + (", page cache dropped" if self.dropped_caches else ""))


def drop_caches(path: str = DROP_CACHES) -> bool:
    """Writes 3 to drop_caches (page cache, dentries, inodes): only as root; True when done."""
    if os.geteuid() != 0:
        return False
    try:
        os.sync()
        Path(path).write_text("3\n")
        return True
    except OSError:
        return False


def settle_memory(baseline: int, tolerance: float = 0.05, timeout_s: float = 120.0, poll_s: float = 0.5,
                  meminfo: str = MEMINFO, drop: bool = False, drop_path: str = DROP_CACHES,
                  clock: Callable[[], float] = time.monotonic,
                  wait: Callable[[float], object] = time.sleep) -> Settled:
    """Waits until MemAvailable is at least (1 - tolerance) × `baseline` (its level before the
    previous server booted), at most `timeout_s`; drops caches first when `drop` (and root).
    Never raises: a host whose memory does not come back is said in the result."""
    target = int(baseline * (1 - tolerance))
    dropped = drop_caches(drop_path) if drop else False
    t0 = clock()
    while True:
        now = mem_available(meminfo)
        if now is not None and now >= target:
            return Settled(target, now, clock() - t0, True, dropped)
        if now is None or clock() - t0 >= timeout_s:
            return Settled(target, now, clock() - t0, False, dropped)
        wait(poll_s)


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


SETTLE_ENV = {  # how the bench settles memory between fresh servers on unified-memory hosts
    "meminfo": "REGBENCH_MEMINFO",  # a /proc/meminfo-format file (default /proc/meminfo; tests: a stand-in)
    "timeout": "REGBENCH_SETTLE_TIMEOUT_S",  # how long to wait at most (default 120)
    "drop": "REGBENCH_DROP_CACHES",  # 1: drop the page cache first (only as root)
}


class Settler:
    """Between fresh servers of one bench on a unified-memory host: before each boot, waits
    (settle_memory) until MemAvailable is back near its level before the previous boot, then
    notes the level before this one. Thread-safe; the first boot does not wait."""

    def __init__(self, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        self.meminfo = env.get(SETTLE_ENV["meminfo"]) or MEMINFO
        self.timeout_s = float(env.get(SETTLE_ENV["timeout"]) or 120.0)
        self.drop = env.get(SETTLE_ENV["drop"]) == "1"
        self._lock = threading.Lock()
        self._before_last: int | None = None

    def before_boot(self, **kw) -> Settled | None:
        with self._lock:
            done = None
            if self._before_last is not None:
                done = settle_memory(self._before_last, timeout_s=self.timeout_s, meminfo=self.meminfo,
                                     drop=self.drop, **kw)
            self._before_last = mem_available(self.meminfo)
            return done
