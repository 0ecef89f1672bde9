"""The one way a run is stopped: a StopToken handed down from the orchestrator to every place
that waits (a server's boot, a workload, a wait for devices).

Ctrl-C and SIGTERM reach the bench's main thread as KeyboardInterrupt; the orchestrator turns
that into ``token.stop()`` in one place, and so does a worker's fatal error. Whatever is waiting
sees the token and unwinds: a blocking wait raises ``Stopped`` (so that a context manager's exit
takes the server down), and the caller records the run as interrupted. Nothing else travels as
an exception.
"""

from __future__ import annotations

import threading


class Stopped(Exception):
    """A wait was given up because the run's StopToken was set."""


class StopToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleeps up to `timeout` seconds, less if the token is set; returns whether it is."""
        return self._event.wait(timeout)

    def check(self) -> None:
        """Raises Stopped once the token is set: for the waits that must unwind."""
        if self._event.is_set():
            raise Stopped(self.reason)
