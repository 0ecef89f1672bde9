"""Launcher back-ends by name: what `launcher:` in a matrix selects.

A back-end (bench.serve.protocols.Backend) opens a ``Launcher`` for a run (servers and
fingerprints for cells) and finds and removes what a killed bench left behind. Everything that
differs between back-ends lives behind those protocols, in the back-end's own module; nothing
outside the launcher modules switches on a back-end's name.

To add a back-end: a module ``bench/serve/launch_<name>.py`` whose ``Backend`` class carries
``@register("<name>", needs=(...))``, the image fields it cannot run without; and its name in the
schema's ``LauncherName`` and ``IMAGE_FIELDS_NEEDED`` (bench.core.config, which cannot import
this layer; tests/test_launch.py checks that the two agree).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bench.serve.registry import Registry

if TYPE_CHECKING:
    from bench.core.config import Config
    from bench.serve.protocols import Backend, Cleaned, Launcher

BACKENDS: Registry[type[Backend]] = Registry("bench.serve", "launch_", first="local")
register = BACKENDS.register


def backend(name: str) -> Backend:
    instance: Backend = BACKENDS.entry(name).make()
    return instance


def needs(name: str) -> tuple[str, ...]:
    """The image fields the back-end cannot run without."""
    return BACKENDS.entry(name).needs


def open_launcher(config: Config, run_id: str) -> Launcher:
    return backend(config.launcher).open(config, run_id)


def remove_leftovers(run_id: str | None = None, results: Path | None = None,
                     names: list[str] | None = None, only_gone: bool = False) -> dict[str, Cleaned]:
    """Every back-end's (or the named ones') leftovers removed: {back-end: what was removed, kept}."""
    return {name: backend(name).leftovers(run_id, results, only_gone) for name in (names or BACKENDS.names())}
