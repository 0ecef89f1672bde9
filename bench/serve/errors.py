"""The errors of starting servers, shared by the lifecycle and every launcher back-end."""

from __future__ import annotations

from bench.core.errors import RegbenchError
from bench.core.schema import ConfigError


class StartError(Exception):
    """The server could not even be started (no such interpreter, no such image ...)."""


class NotRunnable(StartError):
    """The cell cannot run on this host, so no server was started: its image's architecture or
    CUDA requirement, a refusal of NVIDIA's container toolkit, a tag with no build for this host,
    GPUs the host lacks, memory vLLM would refuse, a knob's CPU flag. Nothing is said of vLLM: the
    judge names it not_runnable, never a failure. The message says why (it starts with
    bench.core.verdicts.NOT_RUNNABLE, for people reading it)."""


class BootError(Exception):
    """The server did not become healthy; the outcome says how."""


class LauncherUnavailable(RegbenchError):
    """The back-end cannot run servers here (no engine answering, ...); the message says how to fix it."""


class ImageUnavailable(ConfigError):
    """Images that cannot be had before the cells (a registry that could not answer or refused
    the credentials, an image absent under `pull: never`): the message names each ref and the
    answer. Raised by bench.serve.images; here so that catching it imports no Docker SDK."""
