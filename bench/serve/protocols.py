"""What a launcher back-end is to the rest of the bench: the protocols every back-end meets.

A ``Backend`` (registered by name in bench.serve.launchers) opens a ``Launcher`` for a run and
removes what a killed bench left behind; a ``Launcher`` turns a cell into a ``LaunchedServer``, a
context manager that has booted once entered and is gone once left (bench.serve.lifecycle.Server,
the one kind there is, drives one through a ``Handle``: a process group, a container).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from bench.core.config import Config, Image
    from bench.core.matrix import Cell
    from bench.core.records import Devices, Fingerprint, ServerOutcome
    from bench.core.stop import StopToken


# Which reader back-end (bench.weights.readers) the pre-flight streams an image's weights with:
# "local", the image's Python on this host; "docker", a container of the image (`ref`).
AuditSite = Literal["local", "docker"]


class Cleaned(NamedTuple):
    removed: list[str]  # what was stopped and removed, described
    kept: list[str]  # what was found but left, with why


class Handle(Protocol):
    """A started server, whatever it runs in."""

    def poll(self) -> int | None: ...  # exit code once it has exited
    def signal(self, sig: signal.Signals) -> bool: ...  # to all of the server; False: it was gone
    def wait(self, timeout: float | None) -> int | None: ...  # exit code, None on time-out
    def log_size(self) -> int: ...  # bytes of log captured so far
    def identity(self) -> str | None: ...  # the image id a container runs; None for processes
    # Another program holding the server's port, described; None when the server holds it or
    # the handle cannot tell (a server on another host: then nothing proves ownership).
    def foreign_port_holder(self, port: int) -> str | None: ...
    def cleanup(self) -> None: ...  # reap stragglers, remove what was created; idempotent
    # Memory the server holds now: (host bytes, GPU bytes), None where it cannot be told; and
    # how host memory is counted (bench.serve.memory).
    def memory(self) -> tuple[int | None, int | None]: ...
    memory_source: str


class LaunchedServer(Protocol):
    """One server of one repeat: healthy once entered (else BootError), stopped and removed once
    left, whatever happened; ``outcome`` is complete after the exit."""

    outcome: ServerOutcome

    @property
    def base_url(self) -> str: ...
    def __enter__(self) -> LaunchedServer: ...
    def __exit__(self, *exc: object) -> None: ...


class Launcher(Protocol):
    """Servers for the cells of one run (bench.serve.launchers opens one by the matrix's `launcher`)."""

    # The audit back-end the pre-flight runs an image's loader with (AuditSite).
    audit_in: AuditSite

    def server(self, cell: Cell, repeat: int, run_dir: Path, devices: Devices | None = None,
               stop: StopToken | None = None) -> LaunchedServer: ...
    def fingerprint(self, image: Image) -> Fingerprint: ...
    def resolve_images(self, images: Iterable[Image], earlier: Mapping[str, str] | None = None) -> dict[str, Image]:
        """The images this launcher pulls, resolved once for the run and pinned (name → image as
        pinned; `earlier`: the pins a resumed run recorded); {} for a launcher that pulls nothing.
        Raises ConfigError when an image cannot be had."""
        ...
    def not_here(self) -> dict[str, str]:
        """After resolve_images: the images (by name) of which there is no build for this host,
        and why; their cells are not runnable. {} for a launcher that pulls nothing."""
        ...


class Backend(Protocol):
    audit_in: AuditSite  # as its launchers'

    def open(self, config: Config, run_id: str) -> Launcher:
        """A launcher for one run; raises LauncherUnavailable."""
        ...

    def leftovers(self, run_id: str | None = None, results: Path | None = None, only_gone: bool = False) -> Cleaned:
        """Stops and removes the servers a killed bench left (of one results folder, of one run
        id, or all of regbench's). `only_gone`: only those whose owning bench is gone
        (bench.serve.reap.owner_gone); the others are kept and said. Without an engine to ask,
        there is nothing: empty lists."""
        ...
