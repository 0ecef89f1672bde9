"""How much memory a server holds, sampled while it runs: resident memory of a local server's
processes, a container's memory as its cgroup counts it, and GPU memory where nvidia-smi exists.

The GPU part runs where `nvidia-smi` is on PATH: the tests put a stand-in first on PATH
(tests/data/gpu-standin/nvidia-smi) that prints nvidia-smi's CSV, so the call, the parsing and
the mapping to the server's processes are exercised here; real figures only on GPU hosts.

Unified memory (GB10 / DGX Spark, Jetson Thor): nvidia-smi lists the server's processes with
`[N/A]` used memory, since GPU allocations are host memory. The host memory of the processes it
lists (their resident memory, or a container's cgroup memory) then counts as the GPU's.

Between fresh servers on unified-memory hosts the bench settles (settle_memory): it waits, bounded,
until MemAvailable (/proc/meminfo) is back near its level before the previous boot, and until it
is at least what the server will ask for, dropping the page cache first where allowed (root, and
the bench configured to), and says how long it waited.

MemAvailable is what vLLM itself reads as the free memory of an integrated GPU: on such a device
cudaMemGetInfo's free is the kernel's MemFree, which counts the page cache as used (the CUDA
driver API's cuMemGetInfo "free according to the OS", and NVIDIA's CUDA for Tegra app note,
"Estimating total allocatable device memory on an integrated GPU device"; measured on GB10:
cuda_free tracked MemFree exactly while a 60 GiB file went through the page cache, unsloth pull
request 10704), so vLLM's MemorySnapshot.measure (vllm/utils/mem_utils.py) replaces it with
psutil.virtual_memory().available, which psutil reads from /proc/meminfo's MemAvailable
(psutil/_pslinux.py): first for the compute capabilities of Orin, Thor and Spark (8.7, 11.0,
12.1), since vLLM pull request 35356 for every device whose `is_integrated` is set. vLLM's start-up
check (request_memory, vllm/v1/worker/utils.py) refuses to start when that free memory is below
--gpu-memory-utilization × the device's total ("Free memory on device cuda:0 (55.87/119.56 GiB) on
startup is less than desired GPU memory utilization", vLLM issue 48140: GB10, vLLM 0.24.0, the
55.87 GiB being MemAvailable while MemFree was 26.5 GiB). So the bench waits for, and checks
before each boot, MemAvailable against the utilization × MemTotal (cudaMemGetInfo's total on GB10
is MemTotal, 121.69 GiB, or a little less, 119.56 GiB, in the logs quoted there: the check errs
by at most that towards holding a boot back). A server that would be refused is not started: its
run is `not_runnable`, naming the shortfall and the fix (boot_room).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.core.verdicts import NOT_RUNNABLE

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


def read_meminfo(meminfo: str = MEMINFO) -> dict[str, int]:
    """The fields of a /proc/meminfo-format file in bytes ("MemTotal:  131072000 kB", the kernel's
    format: Documentation/filesystems/proc.rst, "meminfo"); {} when it cannot be read."""
    fields: dict[str, int] = {}
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return fields


def mem_available(meminfo: str = MEMINFO) -> int | None:
    """MemAvailable in bytes, from a /proc/meminfo-format file: what vLLM reads as an integrated
    GPU's free memory (psutil.virtual_memory().available)."""
    return read_meminfo(meminfo).get("MemAvailable")


VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's CacheConfig.gpu_memory_utilization default (vllm/config/cache.py)


def gpu_memory_utilization(argv: Sequence[str]) -> float:
    """The --gpu-memory-utilization a server is started with (pure): the last one given wins, as in
    argparse, written `--gpu-memory-utilization X`, `=X`, or with underscores (vLLM's parser takes
    both); vLLM's default where none is given, or where the value is no number (vLLM refuses it)."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, given = arg.partition("=")
        if name.replace("_", "-") != "--gpu-memory-utilization":
            continue
        if eq:
            value = given
        elif i + 1 < len(argv):
            value = argv[i + 1]
    try:
        return float(value) if value is not None else VLLM_DEFAULT_UTILIZATION
    except ValueError:
        return VLLM_DEFAULT_UTILIZATION


@dataclass
class Room:
    """Memory before a boot on unified memory, as vLLM will weigh it: MemAvailable against the
    utilization × MemTotal (see the module's docstring), with MemFree and the page cache beside."""

    utilization: float
    total_bytes: int
    needed_bytes: int
    available_bytes: int
    free_bytes: int | None
    cache_bytes: int | None  # Cached + Buffers: the page cache

    @property
    def short(self) -> bool:
        return self.available_bytes < self.needed_bytes

    def reason(self, waited_s: float) -> str:
        """Why the server is not started: the shortfall and the fix, as a not-runnable reason."""
        gib = 2**30
        cache = "" if self.cache_bytes is None else f", the page cache {self.cache_bytes / gib:.1f} GiB"
        return (f"{NOT_RUNNABLE} now: vLLM would refuse to start (free memory on device below desired GPU memory "
                f"utilization): on unified memory it reads MemAvailable (/proc/meminfo), "
                f"{self.available_bytes / gib:.1f} GiB after {waited_s:.0f} s, and needs --gpu-memory-utilization "
                f"{self.utilization:g} × {self.total_bytes / gib:.1f} GiB = {self.needed_bytes / gib:.1f} GiB "
                f"(MemFree {_gib(self.free_bytes)}{cache}). Free memory on this host: stop what holds it, or drop "
                "the page cache (as root: sync; echo 3 > /proc/sys/vm/drop_caches; the bench does it itself only "
                "as root with REGBENCH_DROP_CACHES=1), or lower --gpu-memory-utilization; no server was started")


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"


def boot_room(utilization: float, meminfo: str = MEMINFO) -> Room | None:
    """What a server started now with this utilization would find; None where /proc/meminfo says
    no MemTotal or MemAvailable (the check is then not made)."""
    info = read_meminfo(meminfo)
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if total is None or available is None:
        return None
    cache = info.get("Cached", 0) + info.get("Buffers", 0) if "Cached" in info else None
    return Room(utilization=utilization, total_bytes=total, needed_bytes=int(utilization * total),
                available_bytes=available, free_bytes=info.get("MemFree"), cache_bytes=cache)


@dataclass
class Settled:
    """How one settle went: the level it waited for, what it found, how long it took."""

    target_bytes: int
    available_bytes: int | None
    waited_s: float
    settled: bool
    dropped_caches: bool
    needed_bytes: int | None = None  # what the next server asks for (Room.needed_bytes)
    refused: str | None = None  # not enough for it after the wait: the not-runnable reason

    def text(self) -> str:
        if self.refused is not None:
            return f"memory settle: {self.refused}"
        gib = 2**30
        found = "unknown" if self.available_bytes is None else f"{self.available_bytes / gib:.1f} GiB"
        how = "back" if self.settled else "NOT back (gave up)"
        need = "" if self.needed_bytes is None else f", the server needs {self.needed_bytes / gib:.1f} GiB"
        return (f"memory settle: MemAvailable {how} near {self.target_bytes / gib:.1f} GiB after "
                f"{self.waited_s:.1f} s (now {found}{need})" + (", page cache dropped" if self.dropped_caches else ""))


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
                  wait: Callable[[float], object] = time.sleep, utilization: float | None = None) -> Settled:
    """Waits until MemAvailable is at least (1 - tolerance) × `baseline` (its level before the
    previous server booted) and, given the next server's `utilization`, at least what it will ask
    for (boot_room), at most `timeout_s`; drops caches first when `drop` (and root). Never raises:
    a host whose memory does not come back is said in the result, and one that stays short of
    what the server asks for gives the reason not to start it (`refused`)."""
    target = int(baseline * (1 - tolerance))
    dropped = drop_caches(drop_path) if drop else False
    t0 = clock()
    while True:
        now = mem_available(meminfo)
        room = boot_room(utilization, meminfo) if utilization is not None else None
        enough = room is None or not room.short
        needed = None if room is None else room.needed_bytes
        waited = clock() - t0
        if now is not None and now >= target and enough:
            return Settled(target, now, waited, True, dropped, needed)
        if now is None or waited >= timeout_s:
            refused = room.reason(waited) if room is not None and room.short else None
            return Settled(target, now, waited, now is not None and now >= target, dropped, needed, refused)
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
    (settle_memory) until MemAvailable is back near its level before the previous boot and at
    least what this server asks for, then notes the level before this one. Thread-safe; the
    first boot waits only when memory is short of what it asks for."""

    def __init__(self, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        self.meminfo = env.get(SETTLE_ENV["meminfo"]) or MEMINFO
        self.timeout_s = float(env.get(SETTLE_ENV["timeout"]) or 120.0)
        self.drop = env.get(SETTLE_ENV["drop"]) == "1"
        self._lock = threading.Lock()
        self._before_last: int | None = None

    def before_boot(self, utilization: float | None = None, **kw) -> Settled | None:
        """None where there was nothing to wait for; `utilization`: the server's
        --gpu-memory-utilization (gpu_memory_utilization), checked against what is free."""
        with self._lock:
            done = None
            room = boot_room(utilization, self.meminfo) if utilization is not None else None
            if self._before_last is not None or (room is not None and room.short):
                done = settle_memory(self._before_last or 0, timeout_s=self.timeout_s, meminfo=self.meminfo,
                                     drop=self.drop, utilization=utilization, **kw)
            self._before_last = mem_available(self.meminfo)
            return done
