"""The weight audit's reader in a container of the image under test (bench.weights.audit).

Under the docker launcher a cell's weights are loaded by its image: the image's Python, torch and
runai-model-streamer, which this host may not have at all. So the audit runs the same reader in a
container of that image:
  - the reader script and its plan mounted read-only at READER_DIR, the image's ENTRYPOINT (vLLM's
    CLI) replaced by ``python READER PLAN``;
  - the checkpoint folder mounted read-only at the same absolute path as on this host (and the
    folders its shard files link to, at theirs), so that the plan, the reader's messages and the
    report all name the files as the bench does and no path is rewritten;
  - overlay folders (an image's `pythonpath` under the docker launcher) mounted read-only at
    OVERLAY_ROOT/<i>, as the launcher does, and put first on PYTHONPATH;
  - the image's environment with the audit's variables on top (bench.serve.launch.image_env, the
    same rule as on this host);
  - no network, but for a checkpoint in object storage (s3://): then nothing is mounted for it
    and the container shares the host's network, as the launcher's servers do, to reach the
    endpoint; labelled like the launcher's containers, so `regbench clean` finds one that a
    killed bench left.
The container is removed whatever happens: time-out, error, Ctrl-C, or a start that failed half
way. Its stdout (the reader's JSON lines) and stderr are read apart, once it has exited.
Mounts are host paths: the engine must run on this host, as for the launcher's model mounts.
"""

from __future__ import annotations

import secrets
import signal
from pathlib import Path
from types import TracebackType

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container as DockerContainer

from bench.core.config import Image
from bench.serve.errors import StartError
from bench.serve.images import ensure_image
from bench.serve.launch import image_env
from bench.serve.launch_docker import OVERLAY_ROOT, DockerUnavailable, checkpoint_mounts, client, labels
from bench.weights.errors import ReaderError
from bench.weights.protocols import READER, TAIL_LINES, ReaderSpec
from bench.weights.readers import register

READER_DIR = "/opt/regbench/audit"
CELL_LABEL = "audit"  # the label's cell: `regbench clean` finds the container by its run id, or by LABEL=1
KILL_WAIT_S = 30.0
SIGNALS = {s.value for s in signal.Signals}
API_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def _explain(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc)


def volumes(plan: Path, checkpoint: Path | None, files: list[Path], overlays: list[str]) -> dict[str, dict[str, str]]:
    """The container's read-only mounts (pure but for resolving the files' links). `checkpoint`
    None: the files are in object storage, nothing to mount for them."""
    out = {
        str(READER): {"bind": f"{READER_DIR}/{READER.name}", "mode": "ro"},
        str(plan): {"bind": f"{READER_DIR}/plan.json", "mode": "ro"},
    }
    for i, path in enumerate(overlays):
        out[str(Path(path).resolve())] = {"bind": f"{OVERLAY_ROOT}/{i}", "mode": "ro"}
    if checkpoint is None:
        return out
    # A hub cache's snapshot links each file to a blob outside the folder: the link resolves in
    # the container too when the blob's folder is at its own path there as well. The same rule
    # as the docker launcher's servers (checkpoint_mounts), so that both read the same bytes.
    out.update(checkpoint_mounts(str(checkpoint))[1])
    for f in files:
        real = f.resolve()
        if not real.is_relative_to(checkpoint):
            out.setdefault(str(real.parent), {"bind": str(real.parent), "mode": "ro"})
    return out


class ContainerReader:
    """bench.weights.audit's reader as a container of ``image.ref`` (a context manager: see
    bench.weights.protocols.Reader). ``image.python`` and ``image.pythonpath`` are the image's own."""

    def __init__(self, image: Image, plan: Path, checkpoint: Path | None, files: list[Path], overlays: list[str],
                 run_id: str):
        assert image.ref is not None
        self.image = image
        self.volumes = volumes(plan, checkpoint, files, overlays)
        self.network = "none" if checkpoint is not None else "host"
        self.pythonpath = [f"{OVERLAY_ROOT}/{i}" for i in range(len(overlays))] + list(image.pythonpath)
        self.labels = labels(run_id, CELL_LABEL, None)
        self.name = f"regbench-{run_id}-audit-{secrets.token_hex(4)}"
        self.docker: docker.DockerClient | None = None
        self.container: DockerContainer | None = None

    def __enter__(self) -> ContainerReader:
        try:
            self._start()
        except BaseException:
            self._remove(quiet=True)  # whatever was created, even on Ctrl-C between create and start
            raise
        return self

    def _start(self) -> None:
        try:
            self.docker = client()
        except DockerUnavailable as exc:
            raise ReaderError(str(exc)) from None
        ref = self.image.ref
        try:
            img = ensure_image(self.docker, self.image)
            image_vars = {}
            for var in (img.attrs.get("Config") or {}).get("Env") or []:
                name, _, value = var.partition("=")
                image_vars[name] = value
        except StartError as exc:
            raise ReaderError(str(exc)) from None
        except API_ERRORS as exc:
            raise ReaderError(f"image {ref}: {_explain(exc)}") from None
        env = image_env(self.image.model_copy(update={"pythonpath": self.pythonpath}), image_vars)
        try:
            # By the image's id, as the launcher: the tag cannot move between the check and here.
            self.container = self.docker.containers.create(
                str(img.id), entrypoint=[self.image.python, f"{READER_DIR}/{READER.name}", f"{READER_DIR}/plan.json"],
                environment=env, volumes=self.volumes, network_mode=self.network, labels=self.labels, name=self.name,
                detach=True,
            )
            self.container.start()
        except API_ERRORS as exc:
            # Also what a missing `python` in the image looks like (the runtime cannot exec it).
            raise ReaderError(f"cannot run {self.image.python} in a container of {ref}: {_explain(exc)}") from None

    def wait(self, timeout_s: float) -> int | None:
        assert self.container is not None
        try:
            status = self.container.wait(timeout=timeout_s)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            try:
                self.container.kill()
                self.container.wait(timeout=KILL_WAIT_S)
            except API_ERRORS as exc:
                raise ReaderError(f"the reader's container {self.name} timed out and cannot be stopped: "
                                 f"{_explain(exc)}") from None
            return None
        except API_ERRORS as exc:
            raise ReaderError(f"lost the reader's container {self.name}: {_explain(exc)}") from None
        code = int(status["StatusCode"])
        # The engine reports a process killed by signal N as 128 + N; the local reader's exit code
        # says -N: the same words for both (bench.weights.audit._exit_reason).
        return -(code - 128) if code - 128 in SIGNALS else code

    def output(self) -> tuple[str, str]:
        assert self.container is not None
        try:
            out = self.container.logs(stdout=True, stderr=False)
            err = self.container.logs(stdout=False, stderr=True)
        except API_ERRORS as exc:
            raise ReaderError(f"cannot read the output of the reader's container {self.name}: {_explain(exc)}") from None
        tail = err.decode("utf-8", "replace").splitlines()[-TAIL_LINES:]
        return out.decode("utf-8", "replace"), "\n".join(tail)

    def _remove(self, quiet: bool) -> None:
        if self.docker is None:
            return
        try:
            # By name when create() failed after the engine had made it (a time-out, Ctrl-C).
            (self.container or self.docker.containers.get(self.name)).remove(force=True)
        except docker.errors.NotFound:
            pass
        except API_ERRORS as exc:
            if not quiet:
                raise ReaderError(f"cannot remove the reader's container {self.name} ({_explain(exc)}); "
                                 "`regbench clean` removes it") from None
        finally:
            self.docker.close()
            self.docker = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._remove(quiet=exc is not None)  # an error of its own must not hide the one in flight


@register("docker", needs=("ref", "python"))
def start(spec: ReaderSpec) -> ContainerReader:
    return ContainerReader(spec.image, spec.plan, spec.checkpoint, list(spec.files), list(spec.overlays), spec.run_id)
