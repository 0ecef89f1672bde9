"""How every server is started: `vllm serve` arguments, environment, time-outs, process layout, containers, Slurm. Pure."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from bench.core.schema import ServerArgs, Strict, check_env

Topology = Literal["default", "in_process"]
# What each topology sets in a server's environment (bench.serve.launch.server_env).
TOPOLOGY_ENV: dict[str, dict[str, str]] = {"default": {}, "in_process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


class ServerSettings(Strict):
    host: Literal["127.0.0.1"] = Field(default="127.0.0.1", description="the address servers bind (only this one)")
    args: ServerArgs = Field(default=[], description="extra `vllm serve` arguments for every server "
                                                    "(not `--tensor-parallel-size`)")
    env: dict[str, str] = Field(default={}, description="environment variables for every server")
    # Names of the bench's environment variables handed to containers (HF_TOKEN, ...). Only the
    # names are configuration; values are read at launch and never written anywhere.
    env_passthrough: list[str] = Field(
        default=[], description="names of the bench's environment variables handed to containers (`HF_TOKEN`); "
                                "their values are masked in every file the bench writes")
    hub_cache: str | None = Field(
        default=None, description="host folder of the Hugging Face cache (`~` expanded; a relative path is relative "
                                  "to the matrix file): hub ids resolve into its `hub/`, and containers mount it "
                                  "read-only")

    @field_validator("hub_cache")
    @classmethod
    def _hub_cache_expanded(cls, v: str | None) -> str | None:
        # Expanded once, here, so that the download (bench.weights.hub) and the containers' mount
        # (bench.serve.launch_docker.mounts) name one folder: Docker takes `~/x` literally and a
        # bare `x` for a named volume. A relative path is made absolute against the matrix file's
        # folder with the file's other paths (bench.store.matrixfile.resolve_paths).
        return None if v is None else os.path.expanduser(v)
    boot_timeout_s: float = Field(default=600.0, gt=0, le=86_400,
                                  description="seconds from start to `/health` before `boot_timeout`")
    shutdown_timeout_s: float = Field(default=30.0, gt=0, le=3_600,
                                      description="seconds between SIGTERM and SIGKILL at a server's stop")
    # vLLM on CPU spawns three interpreters per server (API server, engine core, model worker), each
    # importing torch and vLLM; `in_process` keeps the worker inside the engine core. Only a CPU
    # option: a GPU server with one device already runs its worker there (docs/launchers.md).
    topology: Topology = Field(
        default="default", description="vLLM's process layout: `default` as vLLM chooses, or `in_process` "
                                       "(CPU platforms only, tensor-parallel size 1): the model worker inside the "
                                       "engine-core process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), one interpreter "
                                       "fewer to boot")
    # vLLM inspects a model's class in a fresh interpreter (importing torch and vLLM: about 10 s
    # on CPU) unless VLLM_CACHE_ROOT/modelinfos holds the answer; a server's own cache root is new
    # at every start, so it never does (docs/launchers.md).
    model_info_cache: bool = Field(
        default=True, description="local launcher: keep vLLM's model-class inspection cache (`modelinfos`, "
                                  "keyed by the model file's hash) per image across fresh starts, in "
                                  "`$XDG_CACHE_HOME/regbench/modelinfos`, as a host's `~/.cache/vllm` would; "
                                  "the rest of VLLM_CACHE_ROOT stays per server. `false`: a cold cache every start")
    # torch inductor keeps the C++ headers it precompiles in $TMPDIR, meant to outlive the
    # process; a server's TMPDIR is new at every start, so g++ builds them again at its first
    # compiled CPU kernel (docs/launchers.md).
    inductor_header_cache: bool = Field(
        default=True, description="local launcher: keep torch inductor's precompiled C++ headers (named by a hash "
                                  "of the compiler, its flags and the headers) across fresh starts, in "
                                  "`$XDG_CACHE_HOME/regbench/inductor-headers`, as a host's "
                                  "`/tmp/torchinductor_<user>` would; the rest of TMPDIR stays per server. "
                                  "`false`: built again at every start")

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))

    @field_validator("env_passthrough")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        check_env(dict.fromkeys(v, ""))
        return v


class Ulimit(Strict):
    name: Literal["memlock", "stack", "nofile", "core"] = Field(description="the limit's name")
    soft: int = Field(description="the soft limit")
    hard: int = Field(description="the hard limit")


class DockerOptions(Strict):
    """How a platform's containers get at its accelerators and shared memory."""

    gpus: Literal["all", "none"] | int = Field(
        default="none", description="a device request like `docker run --gpus`, used when no device set was given "
                                    "to the server")
    runtime: str | None = Field(
        default=None, description="the container runtime: `nvidia` on Jetson (AGX Thor), where `--gpus` is not "
                                  "used")
    ipc_host: bool = Field(default=False, description="`--ipc=host`")
    shm_size: str = Field(default="1g", pattern=r"^[0-9]+[bkmg]?$",
                          description="shared memory size (vLLM's engine dies with docker's 64m)")
    ulimits: list[Ulimit] = Field(default=[], description="ulimits of the containers")


class SlurmProfile(Strict):
    """How a platform's cells are submitted under `regbench run --executor slurm` (bench.slurm):
    the site's partition, account and limits for that kind of node. A flag given on the command
    line wins over the profile; `sbatch_args` come first, the command line's after them."""

    partition: str | None = Field(default=None, description="sbatch `--partition`")
    account: str | None = Field(default=None, description="sbatch `--account`")
    time_limit: str | None = Field(
        default=None, description="sbatch `--time`, per job: `30`, `1:00:00`, `1-0`")
    cpus_per_job: int | None = Field(default=None, ge=1, description="sbatch `--cpus-per-task`")
    mem: str | None = Field(default=None, pattern=r"^[0-9]+[KMGT]?$", description="sbatch `--mem`")
    sbatch_args: list[str] = Field(default=[], description="more sbatch options, before the command line's")
