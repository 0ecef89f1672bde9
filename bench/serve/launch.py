"""What every launcher starts: the arguments and environment of `vllm serve` for a cell (pure).

The back-ends (bench.serve.launch_local, bench.serve.launch_docker) build their servers' command
lines and environments from these, so a cell is served the same way wherever it runs; the
pre-flight audit streams under the same variables.
"""

from __future__ import annotations

import json
import os

from bench.core.config import TOPOLOGY_ENV, Image, LoadFormat, Platform
from bench.core.config import ServerSettings as ServerConfig
from bench.core.matrix import Cell
from bench.core.records import Devices
from bench.core.verdicts import NOT_RUNNABLE

# The runner takes these from here; their home is bench.serve.errors and bench.serve.protocols.
from bench.serve.errors import BootError as BootError
from bench.serve.protocols import Launcher as Launcher

HOST = "127.0.0.1"
# Where a container sees a local image's PYTHONPATH overlays (the i-th at OVERLAY_ROOT/i, read-only):
# the docker launcher mounts them there, and what reproduces a container's run names them there.
OVERLAY_ROOT = "/opt/regbench/overlay"


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
    # A knob's arguments last, so that they win over the matrix's and the model's.
    return args + list(server.args) + list(cell.model.server_args) + list(cell.knob.server_args if cell.knob else ())


def knob_not_runnable(cell: Cell, host_flags: frozenset[str] | None, host_cpu: str | None = None) -> str | None:
    """Why a knob's cell cannot run on this host (pure): the knob needs one of its `cpu_flags`
    and the host's CPU has none of them. Said before any server starts, as a start error the
    judge reads as not_runnable. None where it can run, or where the flags cannot be read."""
    knob = cell.knob
    if knob is None or not knob.cpu_flags or host_flags is None or host_flags.intersection(knob.cpu_flags):
        return None
    need = knob.cpu_flags
    return (f"{NOT_RUNNABLE}: knob {knob.name!r} needs a CPU with {' or '.join(need)}, and this host's "
            f"({host_cpu or 'unnamed CPU'}) has none of them")


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
        # vLLM's GPU worker otherwise posts a usage report to vLLM's stats server from every
        # fresh start (vllm.usage.usage_lib), which a bench's hundreds of starts would skew, from
        # hosts that may not reach it. A matrix's `server.env` may set it back to 0.
        "VLLM_NO_USAGE_STATS": "1",
    }
    env.update(TOPOLOGY_ENV[server.topology])
    env.update(platform.env)
    env.update(server.env)
    env.update(cell.image.env)
    env.update(cell.load_format.env)
    if cell.knob is not None:
        env.update(cell.knob.env)
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
