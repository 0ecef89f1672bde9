"""Launch: start one vLLM server for one repeat of one cell, and always take it down again.

A launcher is anything with ``server(cell, run_dir)`` returning a ``Server`` context manager
(the ``Launcher`` protocol). The local launcher runs ``vllm serve`` as its own process group on
127.0.0.1 and a free port, with a per-run TMPDIR and VLLM_CACHE_ROOT (removed afterwards), its whole output in a
log file. ``__exit__`` (and a half-finished ``__enter__``) sends SIGTERM to the group, waits,
then SIGKILLs it, so nothing is left running whatever happened — Ctrl-C included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

import httpx

from bench.config import Image
from bench.config import Server as ServerConfig
from bench.matrix import Cell
from bench.records import ServerOutcome

HOST = "127.0.0.1"
RUN_LABEL = "REGBENCH_RUN_DIR"
_POLL_S = 0.5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def vllm_argv(cell: Cell, server: ServerConfig, port: int) -> list[str]:
    """The `vllm serve` command line of a cell (pure)."""
    argv = [
        cell.image.python, "-m", "vllm.entrypoints.cli.main", "serve", cell.model.path,
        "--host", HOST, "--port", str(port),
        "--served-model-name", cell.model.served,
        "--load-format", cell.load_format.vllm_format,
    ]
    if cell.load_format.model_loader_extra_config:
        argv += ["--model-loader-extra-config", json.dumps(cell.load_format.model_loader_extra_config)]
    return argv + list(server.args) + list(cell.model.server_args)


def image_env(image: Image, base: dict[str, str]) -> dict[str, str]:
    """The environment an image's Python runs with (pure): its variables and overlay on top."""
    env = dict(base)
    env.update(image.env)
    if image.pythonpath:
        # The overlay must win over the venv's own packages: that is how one vLLM install runs
        # several runai-model-streamer versions side by side.
        rest = [base["PYTHONPATH"]] if base.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join(list(image.pythonpath) + rest)
    return env


def vllm_env(cell: Cell, server: ServerConfig, scratch: Path, base: dict[str, str]) -> dict[str, str]:
    """The server's environment (pure): per-run temp and cache dirs; the more specific wins."""
    env = dict(base)
    env.update(
        TMPDIR=str(scratch / "tmp"),
        VLLM_CACHE_ROOT=str(scratch / "cache"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        # vLLM picks an interface address for its internal message queues otherwise; the bench
        # keeps all of a server's traffic on loopback.
        VLLM_HOST_IP=HOST,
    )
    env.update(server.env)
    env = image_env(cell.image, env)
    env.update(cell.load_format.env)
    return env


class BootError(Exception):
    """The server did not become healthy; the outcome says how."""


class ServerProcess:
    """One server process group: started in __enter__, reaped in __exit__ whatever happened.

    ``outcome`` is filled in as the life goes on and is complete once the context exits.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        run_dir: Path,
        scratch: Path,
        port: int,
        boot_timeout_s: float,
        shutdown_timeout_s: float,
        health_path: str = "/health",
    ):
        self.argv = argv
        self.env = env
        self.run_dir = run_dir
        self.scratch = scratch
        self.port = port
        self.boot_timeout_s = boot_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.health_url = f"http://{HOST}:{port}{health_path}"
        self.log_path = run_dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.outcome = ServerOutcome(
            command=argv, port=port, log_path=str(self.log_path), started_at=time.time()
        )

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> ServerProcess:
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
        (self.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        (self.scratch / "cache").mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                # Its own session, so the terminal's Ctrl-C reaches only the bench, which then
                # stops the whole group in order; and so that killpg reaches the engine's children.
                self.proc = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    cwd=self.run_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:  # e.g. the image's python does not exist
                self.outcome = self.outcome.model_copy(update={"start_error": f"cannot start {self.argv[0]}: {exc}"})
                raise BootError(self.outcome.start_error) from None
        self.outcome = self.outcome.model_copy(update={"started_at": time.time()})

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        start = time.monotonic()
        deadline = start + self.boot_timeout_s
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.outcome = self.outcome.model_copy(
                        update={"exited_early_code": code, "boot_error": f"exited with code {code} during boot"}
                    )
                    raise BootError(self.outcome.boot_error)
                try:
                    if client.get(self.health_url).status_code == 200:
                        self.outcome = self.outcome.model_copy(update={"boot_s": time.monotonic() - start})
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    msg = f"not healthy after {self.boot_timeout_s:g} s"
                    self.outcome = self.outcome.model_copy(update={"boot_error": msg})
                    raise BootError(msg)
                time.sleep(_POLL_S)

    def _stop(self) -> None:
        # A second Ctrl-C must not cut the clean-up short: hold signals until the group is reaped.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._reap()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _reap(self) -> None:
        proc = self.proc
        if proc is None or self.outcome.exit_code is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            return
        early = proc.poll()
        update: dict = {}
        if early is not None and self.outcome.exited_early_code is None:
            update["exited_early_code"] = early
        update["stop_requested_at_byte"] = self.log_path.stat().st_size if self.log_path.exists() else 0
        start = time.monotonic()
        killed = False
        if early is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.shutdown_timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # The leader may be gone while children linger (an engine core, a resource tracker).
        _signal_group(proc.pid, signal.SIGKILL)
        update.update(exit_code=proc.returncode, killed=killed, shutdown_s=time.monotonic() - start)
        self.outcome = self.outcome.model_copy(update=update)
        # Sockets and compile caches are per run and worthless afterwards; the log stays.
        shutil.rmtree(self.scratch, ignore_errors=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class Launcher(Protocol):
    def server(self, cell: Cell, run_dir: Path) -> ServerProcess: ...


class LocalLauncher:
    """The built-in default: `vllm serve` from the image's Python on this host."""

    def __init__(self, server: ServerConfig, base_env: dict[str, str] | None = None):
        self.config = server
        self.base_env = dict(os.environ if base_env is None else base_env)

    def server(self, cell: Cell, run_dir: Path) -> ServerProcess:
        port = free_port()
        # vLLM binds ZMQ ipc sockets in TMPDIR and a socket path may not exceed 107 bytes, so the
        # scratch space is a short path of its own rather than a folder under the results.
        scratch = Path(tempfile.mkdtemp(prefix="regbench-"))
        env = vllm_env(cell, self.config, scratch, self.base_env)
        # A label every process of the server inherits, so leftovers can be found by it.
        env[RUN_LABEL] = str(run_dir)
        return ServerProcess(
            argv=vllm_argv(cell, self.config, port),
            env=env,
            run_dir=run_dir,
            scratch=scratch,
            port=port,
            boot_timeout_s=self.config.boot_timeout_s,
            shutdown_timeout_s=self.config.shutdown_timeout_s,
        )
