"""The errors of starting servers, shared by the lifecycle and every launcher back-end."""

from __future__ import annotations

from bench.core.errors import RegbenchError


class StartError(Exception):
    """The server could not even be started (no such interpreter, no such image ...)."""


class BootError(Exception):
    """The server did not become healthy; the outcome says how."""


class LauncherUnavailable(RegbenchError):
    """The back-end cannot run servers here (no engine answering, ...); the message says how to fix it."""
