"""vLLM's collect_env in a container of a cell's image, for `regbench report-bug` (bench.bugreport.gather).
Apart from it so that the docker SDK is imported only when a report is about a container."""

from __future__ import annotations

import secrets

import docker
import docker.errors
import requests.exceptions

from bench.bugreport.collect_env import COLLECT_ENV, COLLECT_ENV_TIMEOUT_S, SECRET_LOOKING, CollectEnvError, last_line
from bench.core.matrix import Cell
from bench.core.redact import Redactor
from bench.serve.launch import image_env
from bench.serve.launch_docker import OVERLAY_ROOT, DockerUnavailable, client, labels, run_options

API_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def _explain(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc).replace("\n", " ")


def run_collect_env_docker(cell: Cell, ref: str, run_id: str, warnings: list[str],
                           timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> str:
    """collect_env's output from a container of `ref` as the launcher starts the cell's servers
    (its platform's options, host networking, the overlay mounted first on PYTHONPATH). Raises
    CollectEnvError; a container it could not remove is added to `warnings`."""
    try:
        engine = client()
    except DockerUnavailable as exc:
        raise CollectEnvError(str(exc)) from None
    name = f"regbench-{run_id}-collect-env-{secrets.token_hex(4)}"
    container = None
    try:
        try:
            img = engine.images.get(ref)
        except docker.errors.ImageNotFound:
            raise CollectEnvError(f"image {ref} is not on this host (a report pulls nothing)") from None
        baked = dict(v.partition("=")[::2] for v in (img.attrs.get("Config") or {}).get("Env") or [])
        overlays = [f"{OVERLAY_ROOT}/{i}" for i in range(len(cell.image.pythonpath))]
        container = engine.containers.create(
            str(img.id), entrypoint=[cell.image.python, *COLLECT_ENV], detach=True, name=name,
            # As the launcher's servers: the matrix's variables of the image on top of those the image
            # sets (the engine merges them), the overlay alone on PYTHONPATH.
            environment=image_env(cell.image.model_copy(update={"pythonpath": overlays}), {}),
            volumes={p: {"bind": o, "mode": "ro"} for p, o in zip(cell.image.pythonpath, overlays, strict=True)},
            # Labelled like the launcher's containers: `regbench clean` finds one a killed report left.
            labels=labels(run_id, "collect-env", None), **run_options(cell.profile))
        container.start()
        try:
            status = container.wait(timeout=timeout_s)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            raise CollectEnvError(f"its container of {ref} timed out after {timeout_s:g} s") from None
        code = int(status["StatusCode"])
        if code != 0:
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            raise CollectEnvError(f"{cell.image.python} -m vllm.collect_env in a container of {ref} exited with "
                                  f"code {code}" + last_line(err))
        out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        # The variables the image sets are not in the report's redactor, and collect_env prints some.
        return Redactor(v for n, v in baked.items() if SECRET_LOOKING.search(n)).text(out)
    except API_ERRORS as exc:
        raise CollectEnvError(f"cannot run collect_env in a container of {ref}: {_explain(exc)}") from None
    finally:
        try:
            # By name when create() failed after the engine had made it (a time-out, Ctrl-C).
            (container or engine.containers.get(name)).remove(force=True)
        except docker.errors.NotFound:
            pass
        except API_ERRORS as exc:
            warnings.append(f"cannot remove the container {name} ({_explain(exc)}); `regbench clean` removes it")
        finally:
            engine.close()
