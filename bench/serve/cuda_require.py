"""What an image asks of the host's NVIDIA driver, read by the rules of NVIDIA's container toolkit.

The toolkit (NVIDIA/nvidia-container-toolkit: internal/config/image/cuda_image.go
`GetRequirements`, internal/requirements/constraints/factory.go `newConstraintFromRequirement`
and `parse`, logical.go, property.go; libnvidia-container's `--require` check is the same
grammar) enforces it when a GPU container starts:
  - every NVIDIA_REQUIRE_* variable of the image except NVIDIA_REQUIRE_JETPACK is one requirement,
    and all of them must hold; an image with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA (a legacy
    image) requires `cuda>=MAJOR.MINOR` of it; NVIDIA_DISABLE_REQUIRE set true waives them all;
  - within a requirement, space-separated terms are ORed and the comma-separated factors of a
    term ANDed: `cuda>=12.9 brand=tesla,driver>=570,driver<571` runs on a driver whose CUDA is
    12.9 or newer, or on a Tesla-brand GPU under an R570 driver (CUDA forward compatibility);
  - a factor is PROPERTY OPERATOR VALUE, the operator the first of != <= >= = < > it starts
    with; `cuda`, `driver` and `arch` compare as versions, `brand` as a string; a factor naming
    another property is skipped, and a term left without factors dropped.

regbench knows the driver's version and the newest CUDA it runs (nvidia-smi). It does not know
what only the toolkit sees, the GPU's brand and compute capability (`arch`), nor whether the
image's compatibility libraries apply: a factor on those is UNKNOWN, and a requirement that only
the toolkit can settle is left to it (the container is started; its refusal is reported in its
own words, see images.toolkit_refusal). Only a requirement that fails whatever the
unknowns are makes a cell not runnable before any container.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

# Tried in this order, as the toolkit's parse() does: "<=" before "<", ">=" before "=".
_OPERATORS = ("!=", "<=", ">=", "=", "<", ">")
_KNOWN = frozenset({"cuda", "driver", "arch", "brand"})
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool


class Truth(Enum):
    HOLDS = "holds"
    FAILS = "fails"
    UNKNOWN = "unknown"  # only the toolkit can tell: it depends on the brand, arch or compat libraries


@dataclass(frozen=True)
class Driver:
    """What this host's NVIDIA driver says of itself (nvidia-smi): its version, the newest CUDA
    it runs; None where it does not say."""

    version: str | None
    cuda: str | None

    def describe(self) -> str:
        parts = [f"driver {self.version}" if self.version else "a driver of unknown version"]
        if self.cuda:
            parts.append(f"CUDA {self.cuda} at most")
        return ", ".join(parts)


def _version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION.match(text.strip())
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def _factor(factor: str, driver: Driver) -> Truth | None:
    """One PROPERTY OP VALUE; None for a factor the toolkit skips (an unknown property)."""
    if not factor.strip():
        return None
    end = next((i for i, ch in enumerate(factor) if ch in "<>=!"), -1)
    if end == -1:
        return Truth.UNKNOWN  # the toolkit refuses it at start ("invalid constraint"): its words then
    prop, rest = factor[:end], factor[end:]
    if prop not in _KNOWN:
        return None
    op = next((o for o in _OPERATORS if rest.startswith(o)), "")
    value = rest[len(op):]
    have = {"cuda": driver.cuda, "driver": driver.version}.get(prop)
    if have is None:  # brand, arch, or what nvidia-smi did not say
        return Truth.UNKNOWN
    mine, theirs = _version(have), _version(value)
    if mine is None or theirs is None:
        return Truth.UNKNOWN
    cmp = (mine > theirs) - (mine < theirs)
    ok = {"!=": cmp != 0, "<=": cmp <= 0, ">=": cmp >= 0, "=": cmp == 0, "<": cmp < 0, ">": cmp > 0}.get(op)
    if ok is None:
        return Truth.UNKNOWN  # no operator: the toolkit errors out at start
    return Truth.HOLDS if ok else Truth.FAILS


def _all(truths: list[Truth]) -> Truth:
    if Truth.FAILS in truths:
        return Truth.FAILS
    return Truth.UNKNOWN if Truth.UNKNOWN in truths else Truth.HOLDS


def _any(truths: list[Truth]) -> Truth:
    if Truth.HOLDS in truths:
        return Truth.HOLDS
    return Truth.UNKNOWN if Truth.UNKNOWN in truths else Truth.FAILS


def evaluate(requirement: str, driver: Driver) -> Truth:
    """One requirement string against this host's driver (pure)."""
    terms = []
    for term in requirement.split(" "):
        factors = [t for t in (_factor(f, driver) for f in term.split(",")) if t is not None]
        if factors:
            terms.append(_all(factors))
    return _any(terms) if terms else Truth.HOLDS


def requirements(env: Mapping[str, str]) -> dict[str, str]:
    """The image's requirements by the variable they came from (pure), as the toolkit gathers
    them; {} when the image waives them or states none."""
    if env.get("NVIDIA_DISABLE_REQUIRE", "").strip() in _TRUE:
        return {}
    out = {name: value for name, value in env.items()
           if name.startswith("NVIDIA_REQUIRE_") and not name.startswith("NVIDIA_REQUIRE_JETPACK")}
    if "NVIDIA_REQUIRE_CUDA" not in out and env.get("CUDA_VERSION"):
        v = _version(env["CUDA_VERSION"])
        if v is not None:
            out["CUDA_VERSION"] = f"cuda>={v[0]}.{v[1]}"
    return out


def image_env(attrs: Mapping) -> dict[str, str]:
    """An image's environment from `docker image inspect` (pure)."""
    return dict(v.partition("=")[::2] for v in (attrs.get("Config") or {}).get("Env") or [])


def unmet(attrs: Mapping, driver: Driver) -> str | None:
    """Why this host's driver cannot run the image whatever the toolkit knows beyond it (pure),
    or None: it runs, or only the toolkit can tell."""
    for name, requirement in requirements(image_env(attrs)).items():
        if evaluate(requirement, driver) is Truth.FAILS:
            terms = requirement.split(" ")
            shown = " or ".join(terms[:3]) + (f" or one of {len(terms) - 3} more" if len(terms) > 3 else "")
            return f"needs {shown} ({name}); this host has {driver.describe()} (nvidia-smi), which meets none"
    return None
