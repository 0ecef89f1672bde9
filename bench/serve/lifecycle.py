"""One server's life, whatever it runs in: started, healthy against a deadline, always taken down.

A ``Server`` is a context manager whose ``__enter__`` starts the server through its back-end's
``Handle`` (a process group in bench.serve.launch_local, a container in bench.serve.launch_docker)
and waits for ``/health`` against a deadline while watching that it is alive, and whose
``__exit__`` — also run when ``__enter__`` fails half-way — sends SIGTERM, waits the grace
period, SIGKILLs, records the exit code and removes whatever was started, so nothing is left
running whatever happened, Ctrl-C included.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.core.records import Devices, ServerOutcome
from bench.core.stop import Stopped, StopToken
from bench.serve.errors import BootError, NotRunnable, StartError
from bench.serve.launch import HOST
from bench.serve.memory import PeakSampler
from bench.serve.protocols import Handle

_POLL_S = 0.5
_DYING_S = 5.0


class Server:
    """Drives one server's life through a Handle; ``outcome`` is complete once the context exits."""

    def __init__(
        self,
        start: Callable[[], Handle],
        command: list[str],
        port: int,
        log_path: Path,
        boot_timeout_s: float,
        shutdown_timeout_s: float,
        health_path: str = "/health",
        devices: Devices | None = None,
        stop: StopToken | None = None,
        host: str = HOST,
    ):
        self._start_handle = start
        self.host = host
        self.port = port
        self.log_path = log_path
        self.boot_timeout_s = boot_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.health_url = f"http://{host}:{port}{health_path}"
        self.handle: Handle | None = None
        self.sampler: PeakSampler | None = None
        # Looked at while booting, so that stopping a run does not wait out a boot.
        self.stop = stop or StopToken()
        self.outcome = ServerOutcome(
            command=command, port=port, log_path=str(log_path), started_at=time.time(), devices=devices
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _update(self, **fields) -> None:
        self.outcome = self.outcome.model_copy(update=fields)

    def __enter__(self) -> Server:
        try:
            self._start()
            self._wait_healthy()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        try:
            self.handle = self._start_handle()
        except StartError as exc:
            self._update(start_error=str(exc), not_runnable=isinstance(exc, NotRunnable))
            raise BootError(str(exc)) from None
        self._update(started_at=time.time(), image_id=self.handle.identity())
        self.sampler = PeakSampler(self.handle.memory).start()

    def _wait_healthy(self) -> None:
        assert self.handle is not None
        start = time.monotonic()
        deadline = start + self.boot_timeout_s
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while True:
                code = self.handle.poll()
                if code is not None:
                    self._update(exited_early_code=code, boot_error=f"exited with code {code} during boot")
                    raise BootError(self.outcome.boot_error)
                try:
                    healthy = client.get(self.health_url).status_code == 200
                except httpx.HTTPError:
                    healthy = False
                if healthy:
                    self._check_port_owner()
                    self._update(boot_s=time.monotonic() - start)
                    return
                if time.monotonic() >= deadline:
                    self._update(boot_error=f"not healthy after {self.boot_timeout_s:g} s")
                    raise BootError(self.outcome.boot_error)
                if self.stop.wait(_POLL_S):
                    raise Stopped(self.stop.reason)

    def _check_port_owner(self) -> None:
        # Whatever answers /health on our port may not be our server: another program can take a
        # free port between our pick and the server's bind, and would then get the whole
        # workload. Nothing is sent to a port the server does not hold.
        assert self.handle is not None
        taken = self.handle.foreign_port_holder(self.port)
        if taken is not None:
            self._update(port_taken_by=taken, boot_error=f"port {self.port} is held by {taken}, not by the server")
            raise BootError(self.outcome.boot_error)

    def _answers_health(self) -> bool:
        try:
            return httpx.get(self.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _stop(self) -> None:
        # A second Ctrl-C must not cut the clean-up short: hold signals until the server is gone.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            if self.sampler is not None:
                # Until the stop is asked for: what a server holds while it shuts down is not its load.
                self.sampler.stop()
                if self.handle is not None:
                    self._update(peak_memory_bytes=self.sampler.peak_host, peak_gpu_bytes=self.sampler.peak_gpu,
                                 memory_source=self.handle.memory_source)
                self.sampler = None
            self._reap()
        finally:
            if self.outcome.ended_at is None:
                self._update(ended_at=time.time())
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _reap(self) -> None:
        handle = self.handle
        if handle is None or self.outcome.exit_code is not None:
            return
        try:
            early = handle.poll()
            if early is None and self.outcome.boot_s is not None and not self._answers_health():
                # Not answering any more: give a dying server a moment to be seen dead, so that a
                # crash while serving is not mistaken for a bad exit after our SIGTERM.
                early = handle.wait(_DYING_S)
            if early is not None and self.outcome.exited_early_code is None:
                self._update(exited_early_code=early)
            self._update(stop_requested_at_byte=handle.log_size())
            start = time.monotonic()
            killed = False
            code = early
            if early is None:
                delivered = handle.signal(signal.SIGTERM)
                code = handle.wait(self.shutdown_timeout_s)
                if not delivered and code is not None:
                    # It died between the last look and the stop: a death while serving.
                    self._update(exited_early_code=code)
                if code is None:
                    killed = True
                    handle.signal(signal.SIGKILL)
                    code = handle.wait(None)
            self._update(exit_code=code, killed=killed, shutdown_s=time.monotonic() - start)
        finally:
            handle.cleanup()
