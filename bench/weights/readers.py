"""Reader back-ends by name, each registered once by its module ``bench/weights/audit_<name>.py``
(bench.serve.registry): the names are a launcher's ``audit_in`` (bench.serve.protocols.AuditSite).
A back-end registers a function that takes a ReaderSpec and returns the reader as a context
manager not yet entered; the docker SDK is imported only when a container is asked for."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from bench.serve.registry import Registry
from bench.weights.protocols import Reader, ReaderSpec

Start = Callable[[ReaderSpec], AbstractContextManager[Reader]]

READERS: Registry[Start] = Registry("bench.weights", "audit_", first="local")
register = READERS.register


def start(name: str, spec: ReaderSpec) -> AbstractContextManager[Reader]:
    return READERS.entry(name).make(spec)


def needs(name: str) -> tuple[str, ...]:
    """The image fields the back-end cannot run the reader without."""
    return READERS.entry(name).needs
