"""Slots: a host's devices, handed to concurrent cells so that no two servers ever share one.

A platform profile lists the host's devices (``devices:``: GPU indices as CUDA numbers them, or
CPU numbers for the CPU platform) and their kind; a cell takes as many as its model's
``tensor_parallel_size``. Inside one bench a ``SlotPool`` hands disjoint sets to the runner's
workers. Across bench invocations on one host an exclusive ``flock`` per device, on a file in
the lock folder, keeps a second bench off devices the first one holds: the kernel drops such a
lock when its holder dies, so a SIGKILLed bench can never leave a device locked.

The lock folder is ``$REGBENCH_LOCK_DIR``, else ``/run/lock/regbench`` (every user's bench on
the host must see the same one), else the temp folder. Benches of several users share it: whoever
creates the folder makes it world-writable and sticky (1777, like /tmp), and each lock file
world-writable (0666), so that another uid can open them; a folder or file that still cannot be
opened is a LockFolderError naming it and REGBENCH_LOCK_DIR.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Literal

from bench.core.errors import RegbenchError
from bench.core.records import Devices, RunRecord
from bench.core.stop import Stopped, StopToken

LOCK_DIR_ENV = "REGBENCH_LOCK_DIR"


class LockFolderError(RegbenchError):
    """The lock folder or a lock file in it cannot be created or opened by this user."""


def _cannot(path: Path, exc: OSError) -> LockFolderError:
    return LockFolderError(
        f"cannot use the device lock {path} ({exc.strerror or exc}): another user's bench made it without "
        f"write access for others. Make it writable to every user of this host (chmod 1777 on the folder, "
        f"0666 on its files), or give every bench here one writable folder as {LOCK_DIR_ENV}"
    )


def _shared_folder(path: Path) -> None:
    """The folder, created if need be, writable by every user (1777); the umask applies to mkdir,
    hence the chmod. Only its owner can chmod it: another user's folder is left as it is."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot(path, exc) from None
    try:
        if path.stat().st_uid == os.geteuid() and stat.S_IMODE(path.stat().st_mode) != 0o1777:
            path.chmod(0o1777)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            raise _cannot(path, exc) from None


def lock_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(LOCK_DIR_ENV):
        return Path(env[LOCK_DIR_ENV])
    if os.access("/run/lock", os.W_OK):
        return Path("/run/lock/regbench")
    return Path(tempfile.gettempdir()) / "regbench-locks"


class SlotPool:
    """Disjoint device sets for concurrent servers, locked host-wide while held."""

    def __init__(self, kind: Literal["gpu", "cpu"], ids: list[str], locks: Path | None = None,
                 poll_s: float = 1.0, lock_names: Mapping[str, str] | None = None):
        self.kind = kind
        self.ids = list(ids)
        # A device's lock by the host's own number for it, so that benches naming one GPU by its
        # index and by its UUID take the same lock (bench.serve.platforms.check_host).
        self.lock_names = dict(lock_names or {})
        self.locks = locks or lock_dir()
        _shared_folder(self.locks)
        self.poll_s = poll_s
        self._cond = threading.Condition()
        self._held: dict[str, int] = {}  # device id -> fd of its lock file

    def _lock_path(self, device: str) -> Path:
        return self.locks / f"{self.kind}{self.lock_names.get(device, device)}.lock"

    def _try_lock(self, device: str) -> int | None:
        path = self._lock_path(device)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError as exc:
            raise _cannot(path, exc) from None
        # World-writable so that benches of different users on one host share the locks: the
        # umask took bits off the mode asked for, and only the file's owner may put them back.
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o666)
        except PermissionError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        # Who holds it, for the message another bench prints while it waits.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def holder(self, device: str) -> str | None:
        """The pid written by the bench that holds a device's lock (best effort)."""
        try:
            return self._lock_path(device).read_text().strip() or None
        except OSError:
            return None

    def acquire(self, count: int, stop: StopToken | None = None,
                waiting: Callable[[str], None] = lambda _: None) -> Devices:
        """Blocks until `count` devices are free here and unlocked on the host; lowest ids
        first. Raises bench.core.stop.Stopped once `stop` is set."""
        if count > len(self.ids):
            raise ValueError(f"{count} devices asked for, {len(self.ids)} in the pool")
        told = False
        with self._cond:
            while True:
                if stop is not None and stop.stopped:
                    raise Stopped(stop.reason)
                taken: list[tuple[str, int]] = []
                for device in self.ids:
                    if len(taken) == count:
                        break
                    if device in self._held:
                        continue
                    fd = self._try_lock(device)
                    if fd is not None:
                        taken.append((device, fd))
                if len(taken) == count:
                    self._held.update(taken)
                    return Devices(kind=self.kind, ids=tuple(d for d, _ in taken))
                for _, fd in taken:
                    os.close(fd)  # closing the last descriptor drops the flock
                free_here = [d for d in self.ids if d not in self._held]
                others = sorted({h for d in free_here if (h := self.holder(d))} - {str(os.getpid())})
                if others and not told:
                    waiting(f"waiting for {self.kind} devices held by another regbench (pid {', '.join(others)})")
                    told = True
                # Woken by a release here; polled for a release by another bench.
                self._cond.wait(self.poll_s)

    def release(self, devices: Devices) -> None:
        with self._cond:
            for device in devices.ids:
                fd = self._held.pop(device, None)
                if fd is not None:
                    os.close(fd)
            self._cond.notify_all()



def shared_devices(runs: list[RunRecord]) -> list[tuple[str, str, str]]:
    """Pairs of runs whose servers were alive on one device at the same time, by their recorded
    start and end: (device, run, run). Empty when the schedule kept every device to one server."""
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for r in runs:
        s = r.server
        if s.devices is None or s.ended_at is None:
            continue
        for device in s.devices.ids:
            spans.setdefault(f"{s.devices.kind}{device}", []).append(
                (s.started_at, s.ended_at, f"{r.cell_id}#{r.repeat}")
            )
    clashes = []
    for device, items in sorted(spans.items()):
        items.sort()
        for (_, end, a), (start, _, b) in pairwise(items):
            if start < end:
                clashes.append((device, a, b))
    return clashes
