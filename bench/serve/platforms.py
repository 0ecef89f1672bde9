"""Which platforms this host is: its arch and GPUs against each profile (the match is pure)."""

from __future__ import annotations

import platform as _platform
import re
import shutil
import subprocess

from pydantic import BaseModel, ConfigDict

from bench.core.config import Config, ConfigError, Platform
from bench.core.matrix import Cell


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
