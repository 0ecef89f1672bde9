"""The local launcher, the built-in default: `vllm serve` from the image's Python on this host.

Each server runs as its own process group on 127.0.0.1 and a free port, with a per-run TMPDIR
and VLLM_CACHE_ROOT (removed afterwards; only vLLM's model-class inspection cache is kept, per
image), its whole output in the run's log file; its processes carry the labels bench.serve.reap
finds leftovers by.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from bench.core.config import Config, Image, Platform
from bench.core.config import ServerSettings as ServerConfig
from bench.core.matrix import Cell
from bench.core.records import Devices, Fingerprint
from bench.core.redact import Redactor, redactor_for
from bench.core.stop import StopToken
from bench.serve.errors import NotRunnable, StartError
from bench.serve.fingerprint import fingerprint, host_cpu, host_cpu_flags
from bench.serve.launch import device_env, image_env, knob_not_runnable, serve_args, server_env
from bench.serve.launchers import register
from bench.serve.lifecycle import Server
from bench.serve.memory import gpu_bytes, pids_of_tree, rss_of_tree
from bench.serve.ports import foreign_port_holder, free_port
from bench.serve.protocols import AuditSite, Cleaned
from bench.serve.reap import OWNER_VAR, RUN_LABEL, owner_tag, reap_local


def vllm_argv(cell: Cell, server: ServerConfig, port: int) -> list[str]:
    """The local command line: the image's Python runs vLLM's CLI module (the `vllm` script
    looks up a distribution named `vllm`, which CPU builds are not called)."""
    return [cell.image.python, "-m", "vllm.entrypoints.cli.main", *serve_args(cell, server, port, cell.model.path)]


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


def model_info_folder(image: Image, env: Mapping[str, str]) -> Path:
    """Where the servers of one image share vLLM's `modelinfos` cache. One folder per interpreter
    (its real path) and overlay set: vLLM checks an entry against the model file's hash, not
    against its own version, and an overlay may carry other model code."""
    key = json.dumps([os.path.realpath(image.python or ""), list(image.pythonpath)])
    root = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "~").expanduser() / ".cache")
    return root / "regbench" / "modelinfos" / hashlib.sha256(key.encode()).hexdigest()[:16]


def share_model_infos(scratch: Path, folder: Path) -> None:
    """Links the server's VLLM_CACHE_ROOT/modelinfos to the image's shared folder. Where that
    folder cannot be made (a read-only home), the server keeps a cold cache of its own, as it
    would without the option: slower by one interpreter start, judged the same."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    (scratch / "cache").mkdir(parents=True, exist_ok=True)
    (scratch / "cache" / "modelinfos").symlink_to(folder, target_is_directory=True)


def inductor_header_folder(env: Mapping[str, str]) -> Path:
    """Where the servers share torch inductor's precompiled C++ headers: one folder for every
    interpreter, since torch names each header by a hash of the compiler, its flags and the
    header's preprocessed text."""
    root = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "~").expanduser() / ".cache")
    return root / "regbench" / "inductor-headers"


def torch_user(env: Mapping[str, str]) -> str:
    """The user name in torch inductor's temp folder (`torchinductor_<user>`), found as
    `getpass.getuser()` finds it in the server's environment, and sanitised as torch does."""
    name = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)), None)
    if name is None:
        import pwd

        try:
            name = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def share_inductor_headers(scratch: Path, folder: Path, user: str) -> None:
    """Links the server's `$TMPDIR/torchinductor_<user>/precompiled_headers` to the shared folder.
    torch means them to outlive the process, in a temp folder the bench makes new at each start:
    without the link every server builds them again with g++ at its first compiled CPU kernel
    (the sampler's, at the first sampled or logprobs request). A folder that cannot be made
    leaves the server to build its own."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    inductor = scratch / "tmp" / f"torchinductor_{user}"
    inductor.mkdir(parents=True, exist_ok=True)
    (inductor / "precompiled_headers").symlink_to(folder, target_is_directory=True)


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


# The image's Python runs the server: the one field every image has (it defaults to python3).
@register("local", needs=("python",))
class LocalBackend:
    """bench.serve.protocols.Backend for `launcher: local`."""

    audit_in: AuditSite = "local"  # as LocalLauncher

    def open(self, config: Config, run_id: str) -> LocalLauncher:
        return LocalLauncher(config)

    def leftovers(self, run_id: str | None = None, results: Path | None = None, only_gone: bool = False) -> Cleaned:
        return reap_local(run_id, results, only_gone)


class LocalLauncher:
    """The built-in default: `vllm serve` from the image's Python on this host."""

    audit_in: AuditSite = "local"

    def __init__(self, config: Config, base_env: dict[str, str] | None = None):
        self.config = config
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.redactor = redactor_for(config.server.env_passthrough, self.base_env)
        self.owner = owner_tag()

    def fingerprint(self, image: Image) -> Fingerprint:
        return fingerprint(image, image_env(image, self.base_env))

    def resolve_images(self, images: Iterable[Image], earlier: Mapping[str, str] | None = None) -> dict[str, Image]:
        return {}  # a local image is an interpreter on this host: nothing to pull or pin

    def not_here(self) -> dict[str, str]:
        return {}

    def server(self, cell: Cell, repeat: int, run_dir: Path, devices: Devices | None = None,
               stop: StopToken | None = None) -> Server:
        port = free_port()
        server = cell.server  # the matrix's, or an invariance knob's variant of it
        argv = device_argv(devices, vllm_argv(cell, server, port))
        log_path = run_dir / "server.log"

        def start() -> ProcessGroup:
            reason = knob_not_runnable(cell, host_cpu_flags(), host_cpu())
            if reason is not None:
                raise NotRunnable(reason)
            # vLLM binds ZMQ ipc sockets in TMPDIR and a socket path may not exceed 107 bytes,
            # so the scratch space is a short path of its own, not a folder under the results.
            scratch = Path(tempfile.mkdtemp(prefix="regbench-"))
            env = vllm_env(cell, server, scratch, self.base_env, cell.profile)
            if server.model_info_cache:
                share_model_infos(scratch, model_info_folder(cell.image, self.base_env))
            if server.inductor_header_cache:
                share_inductor_headers(scratch, inductor_header_folder(self.base_env), torch_user(env))
            env.update(device_env(devices))
            # Labels every process of the server inherits, so leftovers can be found by them.
            env[RUN_LABEL] = str(run_dir)
            env[OWNER_VAR] = self.owner
            return ProcessGroup(argv, env, run_dir, log_path, scratch, self.redactor)

        return Server(start, argv, port, log_path, server.boot_timeout_s, server.shutdown_timeout_s,
                      devices=devices, stop=stop)
