"""Launch: start one vLLM server for one repeat of one cell, and always take it down again.

A launcher (the ``Launcher`` protocol) turns a cell into a ``Server``: a context manager whose
``__enter__`` starts the server and waits for ``/health`` against a deadline while watching that
it is alive, and whose ``__exit__`` — also run when ``__enter__`` fails half-way — sends SIGTERM,
waits the grace period, SIGKILLs, records the exit code and removes whatever was started, so
nothing is left running whatever happened, Ctrl-C included. ``Server`` drives the life; a
``Handle`` is the thing being driven: a process group here (the local launcher, the built-in
default), a container in ``bench.serve.launch_docker``.

The local launcher runs ``vllm serve`` from the image's Python as its own process group on
127.0.0.1 and a free port, with a per-run TMPDIR and VLLM_CACHE_ROOT (removed afterwards), its
whole output in the run's log file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from bench.core.config import Config, Image, LoadFormat, Platform
from bench.core.config import Server as ServerConfig
from bench.core.matrix import Cell
from bench.core.records import Devices, Fingerprint, ServerOutcome
from bench.core.redact import Redactor, redactor_for
from bench.core.stop import Stopped, StopToken
from bench.serve.fingerprint import fingerprint
from bench.serve.launchers import OWNER_VAR, AuditSite, Cleaned, owner_gone, owner_tag
from bench.serve.memory import PeakSampler, gpu_bytes, pids_of_tree, rss_of_tree

HOST = "127.0.0.1"
RUN_LABEL = "REGBENCH_RUN_DIR"
_POLL_S = 0.5
_DYING_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def serve_args(cell: Cell, server: ServerConfig, port: int, model_path: str) -> list[str]:
    """The arguments of `vllm serve` for a cell (pure)."""
    args = [
        "serve", model_path,
        "--host", HOST, "--port", str(port),
        "--served-model-name", cell.model.served,
        "--load-format", cell.load_format.vllm_format,
    ]
    if cell.load_format.model_loader_extra_config:
        args += ["--model-loader-extra-config", json.dumps(cell.load_format.model_loader_extra_config)]
    if cell.model.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(cell.model.tensor_parallel_size)]
    return args + list(server.args) + list(cell.model.server_args)


def vllm_argv(cell: Cell, server: ServerConfig, port: int) -> list[str]:
    """The local command line: the image's Python runs vLLM's CLI module (the `vllm` script
    looks up a distribution named `vllm`, which CPU builds are not called)."""
    return [cell.image.python, "-m", "vllm.entrypoints.cli.main", *serve_args(cell, server, port, cell.model.path)]


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


def loader_env(load_format: LoadFormat) -> dict[str, str]:
    """The streamer variables vLLM's runai_streamer loader sets from the load format's
    `model_loader_extra_config` (vLLM 0.32: `concurrency`, `memory_limit`) (pure): what the weight
    audit needs to stream as the server will."""
    extra = load_format.model_loader_extra_config
    names = {"concurrency": "RUNAI_STREAMER_CONCURRENCY", "memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT"}
    return {var: str(extra[key]) for key, var in names.items() if key in extra}


def server_env(cell: Cell, server: ServerConfig, platform: Platform) -> dict[str, str]:
    """Variables every server of a cell gets, wherever it runs (pure); the more specific wins."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # vLLM otherwise picks an interface address for its internal message queues; the bench
        # keeps all of a server's traffic on loopback.
        "VLLM_HOST_IP": HOST,
    }
    env.update(platform.env)
    env.update(server.env)
    env.update(cell.image.env)
    env.update(cell.load_format.env)
    return env


def device_env(devices: Devices | None) -> dict[str, str]:
    """What binds a local server to its devices (pure). GPUs: CUDA numbers them from the
    visible set. CPUs: vLLM's CPU backend pins each tensor-parallel rank's OpenMP threads to
    its own list ('|' between ranks); the process as a whole is pinned by `device_argv`."""
    if devices is None:
        return {}
    if devices.kind == "gpu":
        return {"CUDA_VISIBLE_DEVICES": ",".join(devices.ids)}
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(devices.ids)}


def device_argv(devices: Devices | None, argv: list[str]) -> list[str]:
    """The command pinned to its CPUs, so that the API server and engine processes stay off
    the CPUs of other servers too, not only the OpenMP threads (pure)."""
    if devices is None or devices.kind != "cpu":
        return argv
    return ["taskset", "--cpu-list", ",".join(devices.ids), *argv]


def vllm_env(
    cell: Cell, server: ServerConfig, scratch: Path, base: dict[str, str], platform: Platform | None = None
) -> dict[str, str]:
    """The local server's environment (pure): the bench's own, per-run temp and cache dirs."""
    env = dict(base)
    # VLLM_ASSETS_CACHE: where vLLM pulls an object-store model's config and tokenizer files
    # (default ~/.cache/vllm/assets, left behind after every run).
    env.update(TMPDIR=str(scratch / "tmp"), VLLM_CACHE_ROOT=str(scratch / "cache"),
               VLLM_ASSETS_CACHE=str(scratch / "assets"))
    env.update(server_env(cell, server, platform or Platform(name=cell.platform)))
    return image_env(cell.image, env)


def port_listener(port: int) -> int | None:
    """The pid of the process listening on TCP `port` of this host, or None when there is no
    listener or /proc cannot tell (Linux only). Host-networked containers' sockets show too."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
        except OSError:
            continue  # gone, or not ours to look into
    return None


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def foreign_port_holder(port: int, owns: Callable[[int], bool]) -> str | None:
    """Who else holds a TCP port of this host, described ("pid 12 (nc)"), or None when nobody
    or the server itself (`owns`) does. For handles whose server runs on this host, in its
    network namespace (a local process group, a host-networked container)."""
    owner = port_listener(port)
    if owner is None or owns(owner):
        return None
    return f"pid {owner} ({process_name(owner)})"


class BootError(Exception):
    """The server did not become healthy; the outcome says how."""


class Handle(Protocol):
    """A started server, whatever it runs in."""

    def poll(self) -> int | None: ...  # exit code once it has exited
    def signal(self, sig: signal.Signals) -> bool: ...  # to all of the server; False: it was gone
    def wait(self, timeout: float | None) -> int | None: ...  # exit code, None on time-out
    def log_size(self) -> int: ...  # bytes of log captured so far
    def identity(self) -> str | None: ...  # the image id a container runs; None for processes
    # Another program holding the server's port, described; None when the server holds it or
    # the handle cannot tell (a server on another host: then nothing proves ownership).
    def foreign_port_holder(self, port: int) -> str | None: ...
    def cleanup(self) -> None: ...  # reap stragglers, remove what was created; idempotent
    # Memory the server holds now: (host bytes, GPU bytes), None where it cannot be told; and
    # how host memory is counted (bench.serve.memory).
    def memory(self) -> tuple[int | None, int | None]: ...
    memory_source: str


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
            self._update(start_error=str(exc))
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


class StartError(Exception):
    """The server could not even be started (no such interpreter, no such image ...)."""


class LogPump:
    """Copies a server's output into its log file line by line, redacted, flushed per line
    (the server inherits the bench's environment, secrets included, and may print them)."""

    def __init__(self, source, log_path: Path, redactor: Redactor):
        self.log_path = log_path
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._copy, args=(source, redactor), daemon=True)
        self._thread.start()

    def _copy(self, source, redactor: Redactor) -> None:
        # A log that cannot be written (disk full) must not stop the server: the pipe is drained
        # to its end whatever happens, or a server blocked on a full pipe would hang.
        with source:
            try:
                with open(self.log_path, "ab") as log:
                    for line in iter(source.readline, b""):
                        log.write(redactor.line(line))
                        log.flush()
            except OSError as exc:
                self.error = exc
                for _ in iter(source.readline, b""):
                    pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class ProcessGroup:
    """A Handle on a local process started in its own session, and its scratch folder."""

    memory_source = "resident memory of the server's processes"

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, scratch: Path,
                 redactor: Redactor | None = None):
        self.log_path = log_path
        self.scratch = scratch
        for d in ("tmp", "cache"):
            (scratch / d).mkdir(parents=True, exist_ok=True)
        log_path.touch()
        try:
            # Its own session, so the terminal's Ctrl-C reaches only the bench, which then
            # stops the whole group in order, and killpg reaches the engine's children too.
            self.proc = subprocess.Popen(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise StartError(f"cannot start {argv[0]}: {exc}") from None
        self.pump = LogPump(self.proc.stdout, log_path, redactor or Redactor())

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: signal.Signals) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def identity(self) -> str | None:
        return None

    def owns(self, pid: int) -> bool:
        try:
            return os.getpgid(pid) == self.proc.pid
        except ProcessLookupError:
            return False

    def foreign_port_holder(self, port: int) -> str | None:
        return foreign_port_holder(port, self.owns)

    def memory(self) -> tuple[int | None, int | None]:
        return rss_of_tree(self.proc.pid), gpu_bytes(pids_of_tree(self.proc.pid))

    def cleanup(self) -> None:
        # The leader may be gone while children linger (an engine core, a resource tracker).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()
        # Everything printed is in the pipe once the group is dead; a straggler that left the
        # group and kept the pipe open must not hold the bench up.
        self.pump.join(10)
        # Sockets and compile caches are per run and worthless afterwards; the log stays.
        shutil.rmtree(self.scratch, ignore_errors=True)


def labelled_processes(run_id: str | None = None, run_dir: Path | None = None) -> list[int]:
    """Pids of live local servers started by regbench (of one results folder, of any run with
    that id, or of any), found by the label their environment carries: what a killed bench
    left behind. Linux /proc only."""
    def ours(value: str) -> bool:
        if run_dir is not None:
            return value.startswith(f"{run_dir}/cells/")
        return run_id is None or f"/{run_id}/cells/" in value

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        label = next((v for v in environ if v.startswith(RUN_LABEL.encode() + b"=")), None)
        if label is not None and state != "Z" and ours(label.decode(errors="replace").split("=", 1)[1]):
            found.append(int(entry.name))
    return found


def _environ_value(pid: int, name: str) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = next((v for v in environ if v.startswith(name.encode() + b"=")), None)
    return found.decode(errors="replace").split("=", 1)[1] if found is not None else None


def reap_local(run_id: str | None = None, run_dir: Path | None = None, only_gone: bool = False) -> Cleaned:
    """SIGKILLs the process groups of leftover local servers (with `only_gone`, only those whose
    bench is gone); says what it killed and what it kept."""
    removed, kept = [], []
    for pid in labelled_processes(run_id, run_dir):
        gone, why = owner_gone(_environ_value(pid, OWNER_VAR)) if only_gone else (True, "")
        if not gone:
            kept.append(f"local server process {pid}: {why}")
            continue
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        removed.append(f"local server process {pid}")
    return Cleaned(removed, kept)


class Launcher(Protocol):
    """Servers for the cells of one run (bench.serve.launchers opens one by the matrix's `launcher`)."""

    # Where the pre-flight audit runs an image's loader: with the image's Python on this host, or
    # in a container of the image (bench.serve.launchers.AuditSite).
    audit_in: AuditSite

    def server(self, cell: Cell, repeat: int, run_dir: Path, devices: Devices | None = None,
               stop: StopToken | None = None) -> Server: ...
    def fingerprint(self, image: Image) -> Fingerprint: ...


class LocalBackend:
    """bench.serve.launchers.Backend for `launcher: local`."""

    name = "local"
    audit_in: AuditSite = "here"  # as LocalLauncher

    def open(self, config: Config, run_id: str) -> LocalLauncher:
        return LocalLauncher(config)

    def leftovers(self, run_id: str | None = None, results: Path | None = None, only_gone: bool = False) -> Cleaned:
        return reap_local(run_id, results, only_gone)


class LocalLauncher:
    """The built-in default: `vllm serve` from the image's Python on this host."""

    audit_in: AuditSite = "here"

    def __init__(self, config: Config, base_env: dict[str, str] | None = None):
        self.config = config
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.redactor = redactor_for(config.server.env_passthrough, self.base_env)
        self.owner = owner_tag()

    def fingerprint(self, image: Image) -> Fingerprint:
        return fingerprint(image, image_env(image, self.base_env))

    def server(self, cell: Cell, repeat: int, run_dir: Path, devices: Devices | None = None,
               stop: StopToken | None = None) -> Server:
        port = free_port()
        server = self.config.server
        argv = device_argv(devices, vllm_argv(cell, server, port))
        log_path = run_dir / "server.log"

        def start() -> ProcessGroup:
            # vLLM binds ZMQ ipc sockets in TMPDIR and a socket path may not exceed 107 bytes,
            # so the scratch space is a short path of its own, not a folder under the results.
            scratch = Path(tempfile.mkdtemp(prefix="regbench-"))
            env = vllm_env(cell, server, scratch, self.base_env, self.config.profile(cell.platform))
            env.update(device_env(devices))
            # Labels every process of the server inherits, so leftovers can be found by them.
            env[RUN_LABEL] = str(run_dir)
            env[OWNER_VAR] = self.owner
            return ProcessGroup(argv, env, run_dir, log_path, scratch, self.redactor)

        return Server(start, argv, port, log_path, server.boot_timeout_s, server.shutdown_timeout_s,
                      devices=devices, stop=stop)
