"""The weight audit's errors, raised by the audit and by every reader back-end."""

from __future__ import annotations

from bench.core.errors import RegbenchError


class AuditError(RegbenchError, ValueError):
    """An audit that cannot be run as asked: unknown order or loader, nothing to stream."""


class ReaderError(RegbenchError, RuntimeError):
    """The reader could not run: no such Python, the streamer does not import, it crashed at once."""
