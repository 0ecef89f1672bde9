"""Launcher back-ends by name: what `launcher:` in a matrix selects.

A back-end knows how to open a ``Launcher`` for a run (bench.serve.launch.Launcher: servers and
fingerprints for cells) and how to find and remove what a killed bench left behind. Everything
that differs between back-ends lives behind these two protocols, in the back-end's own module;
nothing outside the launcher modules switches on a back-end's name. A back-end's module is
imported only when it is used (the docker SDK only for `launcher: docker`).

To add a back-end: a module with a class satisfying ``Backend`` and a ``Launcher``, one line in
``BACKENDS`` and its name in the schema's ``launcher`` choices (bench.core.config).
"""

from __future__ import annotations

import importlib
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

import psutil

if TYPE_CHECKING:
    from bench.core.config import Config
    from bench.serve.launch import Launcher


# Where the pre-flight audit streams an image's weights (bench.weights.preflight): "here", with the
# image's Python on this host; "container", in a container of the image (`ref`).
AuditSite = Literal["here", "container"]


# Every server and container a bench starts carries its owner: the host, the bench's pid and
# that process's start time (a pid alone is reused). `regbench clean` removes by default only
# what belongs to benches that are gone, so that on a shared host it never takes down another
# bench's live servers (device slots exist for benches side by side).
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


class Cleaned(NamedTuple):
    removed: list[str]  # what was stopped and removed, described
    kept: list[str]  # what was found but left, with why


class LauncherUnavailable(Exception):
    """The back-end cannot run servers here (no engine answering, ...); the message says how to fix it."""


class Backend(Protocol):
    name: str
    audit_in: AuditSite  # where its images' loaders can be audited (bench.serve.launch.Launcher)

    def open(self, config: Config, run_id: str) -> Launcher:
        """A launcher for one run; raises LauncherUnavailable."""
        ...

    def leftovers(self, run_id: str | None = None, results: Path | None = None, only_gone: bool = False) -> Cleaned:
        """Stops and removes the servers a killed bench left (of one results folder, of one run
        id, or all of regbench's). `only_gone`: only those whose owning bench is gone (owner_gone);
        the others are kept and said. Without an engine to ask, there is nothing: empty lists."""
        ...


# name -> "module:class", imported on first use.
BACKENDS = {
    "local": "bench.serve.launch:LocalBackend",
    "docker": "bench.serve.launch_docker:DockerBackend",
}


def backend(name: str) -> Backend:
    module, attr = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), attr)
    instance: Backend = cls()
    return instance


def open_launcher(config: Config, run_id: str) -> Launcher:
    return backend(config.launcher).open(config, run_id)


def remove_leftovers(run_id: str | None = None, results: Path | None = None,
                     names: list[str] | None = None, only_gone: bool = False) -> dict[str, Cleaned]:
    """Every back-end's (or the named ones') leftovers removed: {back-end: what was removed, kept}."""
    return {name: backend(name).leftovers(run_id, results, only_gone) for name in (names or list(BACKENDS))}
