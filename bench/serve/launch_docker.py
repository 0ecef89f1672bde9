"""Launch in containers: the same Server life as the local launcher, on the docker SDK.

On GPU hosts vLLM runs from images (`vllm/vllm-openai:<tag>`, nightlies, NGC); the image axis
of the matrix only means something if the bench starts exactly that image and records exactly
what ran. Each server is one container:
  - host networking, the server bound to 127.0.0.1 on a free port (no traffic to any bridge);
  - the platform profile's accelerator access (a `--gpus`-style device request, or the
    `nvidia` runtime on Jetson), ipc=host, shm size (vLLM's engine dies with docker's 64 MiB
    default), ulimits;
  - the model folder mounted read-only (a hub cache snapshot with the blobs its links point
    to, each at its own path: checkpoint_mounts), the image's overlay folders mounted read-only
    and put first on PYTHONPATH, an optional hub cache;
  - environment variables passed by name from the bench's environment: their values go into
    the container and nowhere else (not the outcome, not the log, not the results);
  - labels with the run id and cell id, so `regbench clean` can find leftovers;
  - the container's whole output streamed to the run's log from the first line, through the
    shutdown, because exit-time errors only show there;
  - SIGTERM, the grace period, SIGKILL; the exit code read, then the container removed.
Creating and starting are separate steps so that a container that failed to start is removed
too.

Every container of a run is created from its image's pin, resolved once before the first cell
(``DockerLauncher.resolve_images``, called by the runner's ``prepare``); pulling, pinning and
checking an image against this host are bench.serve.images.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

import docker
import docker.errors
import docker.types
import requests.exceptions
from docker.models.containers import Container as DockerContainer

from bench.core.config import Config, ConfigError, Image, Platform
from bench.core.matrix import KNOB_SEP, Cell, matrix_image
from bench.core.records import Devices, Fingerprint
from bench.core.redact import Redactor, redactor_for
from bench.core.stop import StopToken
from bench.serve.cuda_require import Driver
from bench.serve.errors import LauncherUnavailable, NotRunnable, StartError
from bench.serve.fingerprint import FINGERPRINT_SCRIPT, host_cpu, host_cpu_flags, host_driver, host_gpu, parse_fingerprint
from bench.serve.images import ImageNotHere, ImageUnavailable, Resolved, not_runnable, resolve, toolkit_refusal
from bench.serve.launch import OVERLAY_ROOT, device_env, knob_not_runnable, serve_args, server_env
from bench.serve.launchers import register
from bench.serve.lifecycle import Server
from bench.serve.memory import gpu_bytes
from bench.serve.ports import foreign_port_holder, free_port
from bench.serve.protocols import AuditSite, Cleaned
from bench.serve.reap import owner_gone, owner_tag

LABEL = "org.regbench"  # every container: LABEL=1, LABEL.run=<run id>, LABEL.cell=<cell id>
MODEL_ROOT = "/models"
# server.hub_cache is mounted read-only at a fixed path that no container user's home decides, and
# the container's Hugging Face variables point there (hub_env); what the libraries write goes to a
# folder of the container's own, so that concurrent containers never write into the host's cache.
HUB_CACHE = "/regbench/hub-cache"
HF_HOME_IN_CONTAINER = "/tmp/regbench-hf-home"  # /tmp: writable whatever user the image runs as
ENTRYPOINT = ["python3", "-m", "vllm.entrypoints.cli.main"]


class DockerUnavailable(LauncherUnavailable):
    """No engine answers; the message says how to start one."""


def client() -> docker.DockerClient:
    try:
        c = docker.from_env(timeout=120)
        c.ping()
        return c
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(
            f"no Docker engine answers ({exc}); start one (scripts/setup-docker.sh does it here)"
        ) from None


def linked_folders(folder: str) -> list[str]:
    """The folders outside `folder` (a real path) that the links in it point into, as real paths,
    none inside another or inside `folder`. A Hugging Face cache snapshot
    (models--org--name/snapshots/<commit>/) links every file into ../../blobs/."""
    found: set[str] = set()
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            entry = os.path.join(root, name)
            if not os.path.islink(entry):
                continue
            target = os.path.realpath(entry)
            where = target if os.path.isdir(target) else os.path.dirname(target)
            if os.path.commonpath([where, folder]) != folder:
                found.add(where)
    kept = sorted(found, key=len)
    return [f for i, f in enumerate(kept) if not any(os.path.commonpath([f, k]) == k for k in kept[:i])]


def checkpoint_mounts(path: str, bind: str | None = None) -> tuple[str, dict[str, dict[str, str]]]:
    """Where a local model folder is seen in a container, and the read-only mounts that show it
    there; the docker launcher's servers and the pre-flight audit's container both use this, so
    that they read the same bytes. A folder whose links point outside it (a hub cache snapshot)
    is mounted at its own real path, and each folder its links point into at its own: relative
    links (../../blobs/<hash>) then resolve in the container as on this host. Any other folder
    at `bind` (default: its own path)."""
    real = os.path.realpath(path)
    outside = linked_folders(real)
    if not outside and bind is not None:
        return bind, {path: {"bind": bind, "mode": "ro"}}
    volumes = {real: {"bind": real, "mode": "ro"}}
    for folder in outside:
        volumes[folder] = {"bind": folder, "mode": "ro"}
    return real, volumes


def container_model_path(cell: Cell) -> str:
    """Where the model is seen inside the container: a local folder is mounted (a hub cache
    snapshot at its own path, see checkpoint_mounts), a hub id is not."""
    if not os.path.isdir(cell.model.path):
        return cell.model.path
    return checkpoint_mounts(cell.model.path, f"{MODEL_ROOT}/{cell.model.name}")[0]


def mounts(cell: Cell, hub_cache: str | None) -> dict[str, dict[str, str]]:
    """A container's mounts, all read-only: the model folder, the overlay, the hub cache."""
    volumes = {}
    if os.path.isdir(cell.model.path):
        volumes.update(checkpoint_mounts(cell.model.path, f"{MODEL_ROOT}/{cell.model.name}")[1])
    for i, path in enumerate(cell.image.pythonpath):
        volumes[path] = {"bind": f"{OVERLAY_ROOT}/{i}", "mode": "ro"}
    if hub_cache:
        # Docker reads a source that is not an absolute path as a named volume (a bare `x`) or
        # refuses it (`~/x`): the matrix loader makes it absolute; anything else is refused here.
        if not os.path.isabs(hub_cache):
            raise ConfigError(f"server.hub_cache: {hub_cache!r} is not an absolute path (a matrix read from a file "
                              "has it made absolute against the file's folder)")
        # Read-only: the models were resolved into it on the host before the cells (bench.weights.hub).
        volumes[hub_cache] = {"bind": HUB_CACHE, "mode": "ro"}
    return volumes


def hub_env() -> dict[str, str]:
    """The Hugging Face variables of a container that mounts the hub cache (pure). huggingface_hub
    reads its cache from HF_HUB_CACHE, else HF_HOME/hub, and keeps tokens, xet chunks and assets
    under HF_HOME (huggingface_hub/constants.py); transformers copies --trust-remote-code modules
    into HF_MODULES_CACHE, else HF_HOME/modules (transformers/utils/hub.py), and its legacy
    TRANSFORMERS_CACHE defaults to HF_HUB_CACHE. So the cache is the mount, and HF_HOME, with the
    modules in it, a folder of the container's own."""
    return {
        "HF_HUB_CACHE": f"{HUB_CACHE}/hub",
        "HF_HOME": HF_HOME_IN_CONTAINER,
        "HF_MODULES_CACHE": f"{HF_HOME_IN_CONTAINER}/modules",
    }


def container_env(
    cell: Cell, config: Config, host_env: dict[str, str], devices: Devices | None = None
) -> dict[str, str]:
    """The container's environment (pure): the cell's variables, the overlay, the devices it was
    given, and the values of the passed-through names that are set on the host."""
    platform = cell.profile
    env = server_env(cell, cell.server, platform)
    if devices is not None and devices.kind == "cpu":
        env.update(device_env(devices))  # CPU numbers are the host's inside a cpuset too
    elif devices is not None and platform.docker.runtime:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(devices.ids)
    if cell.image.pythonpath:
        env["PYTHONPATH"] = ":".join(f"{OVERLAY_ROOT}/{i}" for i in range(len(cell.image.pythonpath)))
    for name in config.server.env_passthrough:
        if name in host_env:
            env[name] = host_env[name]
    if config.server.hub_cache:
        env.update(hub_env())  # last: a host's HF_HOME means nothing in the container
    return env


def run_options(platform: Platform, devices: Devices | None = None) -> dict:
    """docker-py `containers.create` options of a platform profile, for a server given
    `devices` (pure). Devices given replace the profile's `gpus` count: the container sees
    exactly its own (by device id, or through NVIDIA_VISIBLE_DEVICES with the nvidia runtime),
    or is confined to its CPUs."""
    d = platform.docker
    opts: dict = {"network_mode": "host", "shm_size": d.shm_size}
    if d.ipc_host:
        opts["ipc_mode"] = "host"
    if d.runtime:
        opts["runtime"] = d.runtime
    if devices is not None and devices.kind == "cpu":
        opts["cpuset_cpus"] = ",".join(devices.ids)
    elif devices is not None and d.runtime:
        pass  # the nvidia runtime picks devices from NVIDIA_VISIBLE_DEVICES: see container_env
    elif devices is not None:
        opts["device_requests"] = [
            docker.types.DeviceRequest(device_ids=list(devices.ids), capabilities=[["gpu"]])
        ]
    elif d.gpus != "none":
        count = -1 if d.gpus == "all" else int(d.gpus)
        opts["device_requests"] = [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]
    if d.ulimits:
        opts["ulimits"] = [docker.types.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in d.ulimits]
    return opts


def container_name(run_id: str, cell_id: str, repeat: int) -> str:
    """Readable in `docker ps`; unique per run, and a resumed run removes its leftovers first
    (pure). Docker allows no "+": a knob's cell gets a fifth "__"-joined part, which no cell of
    the matrix has."""
    return f"regbench-{run_id}-{cell_id.replace(KNOB_SEP, '__')}-{repeat}"


def labels(run_id: str, cell_id: str, repeat: int | None) -> dict[str, str]:
    out = {LABEL: "1", f"{LABEL}.run": run_id, f"{LABEL}.cell": cell_id, f"{LABEL}.owner": owner_tag()}
    if repeat is not None:
        out[f"{LABEL}.repeat"] = str(repeat)
    return out


class Container:
    """A Handle on one running container, its output streamed to the log file."""

    memory_source = "container memory as its cgroup counts it, page cache excluded"

    def __init__(self, c: docker.DockerClient, ref: str, command: list[str], create: dict, log_path: Path,
                 redactor: Redactor | None = None):
        self.log_path = log_path
        self.redactor = redactor or Redactor()
        created = None
        try:
            created = c.containers.create(ref, command=command, entrypoint=ENTRYPOINT, detach=True, **create)
            created.start()
        except docker.errors.APIError as exc:
            if created is not None:
                _remove(created)
            said = str(exc.explanation or exc)
            refused = toolkit_refusal(ref, said)
            if refused is not None:
                raise NotRunnable(refused) from None
            raise StartError(f"cannot start a container of {ref}: {said}") from None
        self.container: DockerContainer = created
        self._log_thread = threading.Thread(target=self._stream_logs, daemon=True)
        self._log_thread.start()

    def _stream_logs(self) -> None:
        # Redacted whole lines at a time: a secret must not escape by straddling two chunks.
        pending = b""
        with open(self.log_path, "ab") as f:
            try:
                for chunk in self.container.logs(stream=True, follow=True):
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for line in lines:
                        f.write(self.redactor.line(line + b"\n"))
                    f.flush()
            except (docker.errors.APIError, requests.exceptions.RequestException):
                pass  # the container is gone; everything it printed was written
            if pending:
                f.write(self.redactor.line(pending))

    def poll(self) -> int | None:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -1
        if self.container.status in ("exited", "dead"):
            return int(self.container.attrs["State"]["ExitCode"])
        return None

    def signal(self, sig: signal.Signals) -> bool:
        try:
            self.container.kill(signal=sig.name)
        except docker.errors.APIError:
            return False  # not running any more
        return True

    def wait(self, timeout: float | None) -> int | None:
        try:
            return int(self.container.wait(timeout=timeout)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def identity(self) -> str | None:
        image = self.container.image
        return image.id if image is not None else None

    def owns(self, pid: int) -> bool:
        # A container's processes are host processes in the container's cgroup, named by its id.
        try:
            return str(self.container.id) in Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False

    def foreign_port_holder(self, port: int) -> str | None:
        # Host networking: the container's sockets are this host's, /proc tells who holds them.
        return foreign_port_holder(port, self.owns)

    def memory(self) -> tuple[int | None, int | None]:
        try:
            stats = self.container.stats(stream=False, one_shot=True)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return None, None
        if not isinstance(stats, dict):  # stream=False returns one dict
            return None, None
        mem = stats.get("memory_stats") or {}
        usage = mem.get("usage")
        if usage is None:
            return None, None
        # As `docker stats` shows it: the cgroup's usage less its inactive page cache.
        inactive = (mem.get("stats") or {}).get("inactive_file", 0)
        host = int(usage) - int(inactive)
        # GPU memory: nvidia-smi on the host sees the container's processes as host pids; where it
        # lists them with [N/A] (unified memory) the container's memory is the GPU's.
        return host, gpu_bytes(self.pids(), lambda _: host)

    def pids(self) -> set[int]:
        """The container's processes as host pids (the engine's `top`), empty once it is gone."""
        try:
            top = self.container.top()
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return set()
        titles = top.get("Titles") or []
        if "PID" not in titles:
            return set()
        i = titles.index("PID")
        return {int(row[i]) for row in top.get("Processes") or [] if str(row[i]).isdigit()}

    def cleanup(self) -> None:
        _remove(self.container)
        self._log_thread.join(timeout=10)


def _remove(container: DockerContainer) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


# Its servers are containers of the image's reference.
@register("docker", needs=("ref",))
class DockerBackend:
    """bench.serve.protocols.Backend for `launcher: docker`."""

    audit_in: AuditSite = "docker"  # as DockerLauncher
    # Its servers are started by the engine, outside a Slurm job's cgroup and environment: they
    # get the job's GPUs only when given them as devices (bench.slurm.job_script).
    devices_from_job = True

    def open(self, config: Config, run_id: str) -> DockerLauncher:
        return DockerLauncher(config, run_id)

    def leftovers(self, run_id: str | None = None, results: Path | None = None, only_gone: bool = False) -> Cleaned:
        # Containers carry the run id, not the results folder: a resumed run removes its id's.
        try:
            c = client()
        except DockerUnavailable:
            return Cleaned([], [])  # no engine, no containers
        return clean(c, run_id, only_gone)


class DockerLauncher:
    # The image's loader is the one to audit: the pre-flight runs the reader in a container of it.
    audit_in: AuditSite = "docker"

    def __init__(self, config: Config, run_id: str, docker_client: docker.DockerClient | None = None,
                 host_env: dict[str, str] | None = None):
        self.config = config
        self.run_id = run_id
        self.docker = docker_client or client()
        self.host_env = dict(os.environ if host_env is None else host_env)
        self.redactor = redactor_for(config.server.env_passthrough, self.host_env)
        self.pins: dict[tuple[str, str | None], Resolved] = {}  # (image name, ref) -> resolved once
        self.unavailable: dict[tuple[str, str | None], str] = {}  # (image name, ref) -> why no build is here
        self._resolving = threading.Lock()
        self._runnable: dict[str, str | None] = {}  # pin -> why it cannot run here (None: it can)

    def resolve_images(self, images: Iterable[Image], earlier: Mapping[str, str] | None = None) -> dict[str, Image]:
        """Each image resolved once for the run, before the cells (`earlier`: image name -> the
        pin a resumed run recorded). Returns each image as pinned (`ref` the pin, `pull: never`)
        for what runs its own containers (the pre-flight audit). Raises one ImageUnavailable
        naming every image that cannot be had. An image the registry has no build of for this
        host (ImageNotHere) is left out: its cells are not runnable, each saying why."""
        earlier = earlier or {}
        pinned, failures = {}, []
        for image in images:
            if image.ref is None:
                continue
            try:
                r = self._resolved(image, earlier.get(image.name))
            except ImageUnavailable as exc:
                failures.append(str(exc))
                continue
            except ImageNotHere:
                continue
            pinned[image.name] = image.model_copy(update={"ref": r.pin, "pull": "never"})
        if failures:
            raise ImageUnavailable("; ".join(failures) + " (before any cell: nothing was run)")
        return pinned

    def not_here(self) -> dict[str, str]:
        return {name: reason for (name, _), reason in self.unavailable.items()}

    def _resolved(self, image: Image, earlier: str | None = None) -> Resolved:
        with self._resolving:  # workers start servers at once: one pull, one pin
            key = (matrix_image(image.name), image.ref)
            if key in self.unavailable:
                raise ImageNotHere(self.unavailable[key])
            if key not in self.pins:
                try:
                    self.pins[key] = resolve(self.docker, image, earlier)
                except ImageNotHere as exc:
                    self.unavailable[key] = str(exc)
                    raise
            return self.pins[key]

    @functools.cached_property
    def driver(self) -> Driver | None:
        """This host's NVIDIA driver (None: no driver here), read once."""
        return host_driver()

    def not_runnable(self, pin: str, ref: str) -> str | None:
        """An image checked once against this host (not_runnable), before any container of it."""
        with self._resolving:
            if pin not in self._runnable:
                try:
                    attrs = self.docker.images.get(pin).attrs
                except docker.errors.DockerException:
                    attrs = {}  # not inspectable: the start says why
                self._runnable[pin] = not_runnable(ref, attrs, driver=self.driver)
            return self._runnable[pin]

    def server(self, cell: Cell, repeat: int, run_dir: Path, devices: Devices | None = None,
               stop: StopToken | None = None) -> Server:
        port = free_port()
        command = serve_args(cell, cell.server, port, container_model_path(cell))
        log_path = run_dir / "server.log"
        create = dict(
            run_options(cell.profile, devices),
            environment=container_env(cell, self.config, self.host_env, devices),
            volumes=mounts(cell, self.config.server.hub_cache),
            labels=labels(self.run_id, cell.id, repeat),
            name=container_name(self.run_id, cell.id, repeat),
        )

        def start() -> Container:
            # The run's pin (resolved before the cells; here only for a server asked for without).
            try:
                pin = self._resolved(cell.image).pin
            except ImageUnavailable as exc:
                raise StartError(str(exc)) from None
            except ImageNotHere as exc:
                raise NotRunnable(str(exc)) from None
            reason = self.not_runnable(pin, cell.image.ref or pin) or knob_not_runnable(
                cell, host_cpu_flags(), host_cpu())  # a container runs on this host's CPU
            if reason is not None:
                raise NotRunnable(reason)
            return Container(self.docker, pin, command, create, log_path, self.redactor)

        return Server(start, [cell.image.ref or "", *command], port, log_path,
                      cell.server.boot_timeout_s, cell.server.shutdown_timeout_s,
                      devices=devices, stop=stop)

    def fingerprint(self, image: Image) -> Fingerprint:
        """The fingerprint script run inside the image, with the image's overlay; a failure is recorded."""
        host = dict(image=image.name, cpu=host_cpu(), gpu=host_gpu())
        container = None
        try:
            try:
                r = self._resolved(image)
            except ImageNotHere as exc:
                return Fingerprint(**host, error=str(exc))  # said here once, and by each run
            host.update(image_ref=image.ref, image_id=r.image_id, image_digest=r.digest, image_pin=r.pin)
            reason = self.not_runnable(r.pin, image.ref or r.pin)
            if reason is not None:
                return Fingerprint(**host, error=reason)  # said here once, and by each run
            env = dict(image.env)
            if image.pythonpath:
                env["PYTHONPATH"] = ":".join(f"{OVERLAY_ROOT}/{i}" for i in range(len(image.pythonpath)))
            volumes = {p: {"bind": f"{OVERLAY_ROOT}/{i}", "mode": "ro"} for i, p in enumerate(image.pythonpath)}
            container = self.docker.containers.create(
                r.pin, entrypoint=["python3", "-c", FINGERPRINT_SCRIPT], environment=env, volumes=volumes,
                network_mode="host", labels=labels(self.run_id, f"fingerprint-{image.name}", None),
            )
            container.start()
            container.wait(timeout=120)
            out = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return parse_fingerprint(out, host)
        except (ImageUnavailable, docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            return Fingerprint(**host, error=f"fingerprint script failed: {exc}")
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass


def clean(docker_client: docker.DockerClient, run_id: str | None = None, only_gone: bool = False) -> Cleaned:
    """Removes regbench's containers (of one run, or all; with `only_gone` only those whose bench
    is gone, bench.serve.reap.owner_gone); says what it removed and what it kept."""
    label = f"{LABEL}.run={run_id}" if run_id else f"{LABEL}=1"
    removed, kept = [], []
    # A container may go between the listing and its removal (its bench removing it as it ends):
    # gone is what was asked for, and it is not counted as ours.
    for c in docker_client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
        gone, why = owner_gone((c.labels or {}).get(f"{LABEL}.owner")) if only_gone else (True, "")
        if not gone:
            kept.append(f"container {c.name}: {why}")
            continue
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            continue
        removed.append(f"container {c.name}")
    return Cleaned(removed, kept)
