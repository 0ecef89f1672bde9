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
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from bench.core.config import Config
    from bench.serve.launch import Launcher


# Where the pre-flight audit streams an image's weights (bench.weights.preflight): "here", with the
# image's Python on this host; "container", in a container of the image (`ref`).
AuditSite = Literal["here", "container"]


class LauncherUnavailable(Exception):
    """The back-end cannot run servers here (no engine answering, ...); the message says how to fix it."""


class Backend(Protocol):
    name: str
    audit_in: AuditSite  # where its images' loaders can be audited (bench.serve.launch.Launcher)

    def open(self, config: Config, run_id: str) -> Launcher:
        """A launcher for one run; raises LauncherUnavailable."""
        ...

    def leftovers(self, run_id: str | None = None, results: Path | None = None) -> list[str]:
        """Stops and removes the servers a killed bench left (of one results folder, of one run
        id, or all of regbench's); returns what was removed, described. Without an engine to ask,
        there is nothing of this back-end to remove: []."""
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
                     names: list[str] | None = None) -> dict[str, list[str]]:
    """Every back-end's (or the named ones') leftovers removed: {back-end: what was removed}."""
    return {name: backend(name).leftovers(run_id, results) for name in (names or list(BACKENDS))}
