"""Which platforms this host is: its arch and GPUs against each profile (the match is pure), and
what a profile says of the host's GPUs checked against what nvidia-smi lists, before any server.

A GPU profile (one that names a GPU, or lists GPU devices) is checked against the host's GPUs as
`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader` lists them:

- devices it lists that the host lacks (by index or GPU UUID) are dropped from its slots, with a
  warning naming them; a cell that cannot get its tensor_parallel_size from what is left is
  not_runnable, said before any server, never a boot failure;
- its memory kind: nvidia-smi reports no memory.total ("[N/A]") for a GPU without memory of its
  own (GB10, Jetson Thor). A profile for discrete memory on such a GPU would skip the wait for the
  previous server's memory (bench.serve.memory.Settler), so its fresh servers would fail for memory
  still held: its cells are not_runnable. A unified-memory profile on a discrete GPU only waits
  where it need not: a warning;
- no nvidia-smi, or one that fails: its cells are not_runnable, with what nvidia-smi said.

Inside a Slurm job the device ids are the job's (SLURM_JOB_GPUS: the node's indices), which the
job's nvidia-smi need not list under those numbers (a job constrained to its GPUs sees only them),
so there they are not checked; the rest is.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from bench.core.config import Config, ConfigError, Platform
from bench.core.matrix import Cell
from bench.core.verdicts import NOT_RUNNABLE
from bench.serve.errors import NotRunnable
from bench.serve.lifecycle import Server


class HostFacts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str
    gpus: list[str]

    def describe(self) -> str:
        return f"{self.arch}, " + (", ".join(self.gpus) if self.gpus else "no GPU")


def host_facts() -> HostFacts:
    gpus: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30)
            gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return HostFacts(arch=_platform.machine(), gpus=gpus)


def matches(profile: Platform, host: HostFacts) -> bool:
    if profile.arch is not None and profile.arch != host.arch:
        return False
    if profile.gpu_name is None:
        return True
    return any(re.search(profile.gpu_name, g) for g in host.gpus)


def select(cells: list[Cell], config: Config, host: HostFacts, platform: str | None) -> list[Cell]:
    """The cells to run here: those of `platform` if given, else of every profile the host matches."""
    if platform is not None:
        if platform not in config.platforms:
            raise ConfigError(f"--platform {platform!r} is not in the matrix (it has {config.platforms})")
        chosen = [c for c in cells if c.platform == platform]
    else:
        ok = {p.name for p in config.profiles if matches(p, host)}
        chosen = [c for c in cells if c.platform in ok]
    if not chosen:
        raise ConfigError(
            f"no cell of {config.name} runs on this host ({host.describe()}); its platforms are "
            f"{config.platforms}: pass --platform NAME to run one anyway"
        )
    return chosen


GPU_QUERY = ["--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader"]


@dataclass(frozen=True)
class HostGpu:
    """One GPU as nvidia-smi lists it (GPU_QUERY)."""

    index: str
    uuid: str
    name: str
    memory: str  # memory.total as printed: "143771 MiB"; "[N/A]" for a GPU without memory of its own

    @property
    def unified(self) -> bool:
        return not re.match(r"^\d", self.memory)

    def is_(self, device: str) -> bool:
        return device == self.index or device.upper() == self.uuid.upper()


def parse_gpus(text: str) -> list[HostGpu]:
    """GPU_QUERY's output; lines that are not four fields are left out."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit():
            gpus.append(HostGpu(*fields))
    return gpus


def host_gpus(env: Mapping[str, str] | None = None) -> list[HostGpu] | str:
    """This host's GPUs, or why they cannot be known (no nvidia-smi, or it failed)."""
    env = os.environ if env is None else env
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return "this host has no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        out = subprocess.run([smi, *GPU_QUERY], capture_output=True, text=True, timeout=60, env=dict(env))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi could not be run: {exc}"
    if out.returncode != 0:
        said = (out.stdout + out.stderr).strip().splitlines()
        return f"nvidia-smi failed (exit {out.returncode}): {said[-1] if said else 'no output'}"
    return parse_gpus(out.stdout)


def needs_gpu(profile: Platform) -> bool:
    return profile.gpu_name is not None or (profile.device_kind == "gpu" and bool(profile.devices))


@dataclass
class PlatformOnHost:
    """One profile against this host: the devices it keeps, each with the name of its lock (the
    host's index, whichever way the profile spells it), why none of its cells can run, warnings."""

    devices: list[str]
    locks: dict[str, str] = field(default_factory=dict)
    refused: str | None = None
    warnings: list[str] = field(default_factory=list)


def check_platform(profile: Platform, gpus: list[HostGpu] | str, in_job: bool = False) -> PlatformOnHost:
    """The profile's GPU facts against the host's GPUs (pure)."""
    here = PlatformOnHost(devices=list(profile.devices))
    if not needs_gpu(profile):
        return here
    if isinstance(gpus, str):
        here.refused = f"{NOT_RUNNABLE}: platform {profile.name} needs an NVIDIA GPU and {gpus}"
        return here
    listed = ", ".join(f"{g.index} ({g.name})" for g in gpus) or "none"
    if not gpus:
        here.refused = f"{NOT_RUNNABLE}: platform {profile.name} needs an NVIDIA GPU and nvidia-smi lists none"
        return here
    used = gpus
    if profile.devices and not in_job:
        found = {d: next((g for g in gpus if g.is_(d)), None) for d in profile.devices}
        missing = [d for d, g in found.items() if g is None]
        here.devices = [d for d, g in found.items() if g is not None]
        here.locks = {d: g.index for d, g in found.items() if g is not None}
        used = [g for g in found.values() if g is not None]
        if not here.devices:
            here.refused = (f"{NOT_RUNNABLE}: platform {profile.name} lists GPUs {', '.join(profile.devices)} and this "
                            f"host has none of them (nvidia-smi lists {listed}); `--devices` names the ones to use")
            return here
        if missing:
            here.warnings.append(
                f"platform {profile.name}: this host has no GPU {', '.join(missing)} (nvidia-smi lists {listed}); "
                f"its cells run on {', '.join(here.devices)} only")
    unified = [g for g in used if g.unified]
    if unified and not profile.unified_memory:
        g = unified[0]
        here.refused = (
            f"{NOT_RUNNABLE}: platform {profile.name} is for GPUs with memory of their own (unified_memory: false) and "
            f"this host's GPU {g.index} ({g.name}) has none (nvidia-smi memory.total {g.memory}): without the wait for "
            f"memory a unified-memory host needs, fresh servers would fail for memory still held. Run a "
            f"unified-memory profile here (--platform)")
    elif profile.unified_memory and used and not unified:
        g = used[0]
        here.warnings.append(
            f"platform {profile.name} is for unified memory and this host's GPU {g.index} ({g.name}) has "
            f"{g.memory} of its own: each fresh server waits for host memory it does not need")
    return here


@dataclass
class HostCheck:
    """Every platform of a run's cells against this host (check_host)."""

    platforms: dict[str, PlatformOnHost] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        return [w for p in self.platforms.values() for w in p.warnings]

    def devices(self, profile: Platform) -> list[str]:
        here = self.platforms.get(profile.name)
        return profile.devices if here is None else here.devices

    def locks(self, profile: Platform) -> dict[str, str]:
        here = self.platforms.get(profile.name)
        return {} if here is None else here.locks

    def refused(self, cell: Cell) -> str | None:
        """Why `cell` cannot run on this host (starting with NOT_RUNNABLE), None where it can."""
        here = self.platforms.get(cell.platform)
        if here is None:
            return None
        if here.refused is not None:
            return here.refused
        need = cell.model.tensor_parallel_size
        if here.devices and need > len(here.devices):
            return (f"{NOT_RUNNABLE}: {cell.id} needs {need} GPUs (tensor_parallel_size) and this host has "
                    f"{len(here.devices)} of platform {cell.platform}'s: {', '.join(here.devices)}")
        return None


def check_host(config: Config, cells: list[Cell], env: Mapping[str, str] | None = None) -> HostCheck:
    """The GPU profiles of `cells` against this host; nvidia-smi is asked once, and only when one
    of them needs a GPU."""
    env = os.environ if env is None else env
    profiles = {c.platform: config.profile(c.platform) for c in cells}
    check = HostCheck()
    gpus: list[HostGpu] | str | None = None
    for name, profile in profiles.items():
        if not needs_gpu(profile):
            continue
        if gpus is None:
            gpus = host_gpus(env)
        check.platforms[name] = check_platform(profile, gpus, in_job=bool(env.get("SLURM_JOB_ID")))
    return check


def not_runnable_server(reason: str, run_dir: Path) -> Server:
    """A server that is not started, for a run that cannot be had here: its outcome says why."""

    def refuse():
        raise NotRunnable(reason)

    return Server(refuse, [], 0, run_dir / "server.log", 0, 0)
