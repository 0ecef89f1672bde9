"""The matrix as the command line changes it: image references, repeats, devices. Pure."""

from __future__ import annotations

import re

from bench.core.config.matrix import Config, parse_config
from bench.core.config.platform import DEVICE_ID
from bench.core.schema import ConfigError


def with_image_refs(config: Config, pairs: list[str]) -> Config:
    """The config with image references replaced, from NAME=REF pairs (a CI input choosing the
    tags to qualify). Raises ConfigError for an unknown image or a malformed pair."""
    refs = {}
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        if not sep or not ref:
            raise ConfigError(f"--image {pair!r}: use NAME=REF")
        refs[name] = ref
    unknown = sorted(set(refs) - {i.name for i in config.images})
    if unknown:
        raise ConfigError(f"--image: no image named {unknown} in the matrix")
    data = config.model_dump(mode="json")
    for image in data["images"]:
        image["ref"] = refs.get(image["name"], image["ref"])
    return parse_config(data, "--image")


def with_repeats(config: Config, repeats: int | None) -> Config:
    """The config with `repeats` fresh servers per cell instead of the file's (a quick pass over a
    matrix written for qualification); None keeps the file's."""
    if repeats is None:
        return config
    return parse_config({**config.model_dump(mode="json"), "repeats": repeats}, "--repeats")


def parse_devices(spec: str) -> list[str]:
    """'0,1', '4-7', '0,2-3', GPU UUIDs or 'none' → device ids; raises ConfigError."""
    if spec.strip() == "none":
        return []
    out: list[str] = []
    for part in spec.split(","):
        if re.fullmatch(DEVICE_ID, part.strip()) and not part.strip().isdigit():
            out.append(part.strip())  # a GPU UUID, as nvidia-smi -L prints it
            continue
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or (sep and int(last) < int(first)):
            raise ConfigError(f"--devices {spec!r}: use numbers and ranges like 0,1 or 4-7, or none")
        out += [str(n) for n in range(int(first), int(last if sep else first) + 1)]
    if len(out) != len(set(out)) or len(out) > 4096:
        raise ConfigError(f"--devices {spec!r}: a device named twice, or too many")
    return out


def with_devices(config: Config, spec: str) -> Config:
    """The config with every platform profile's devices replaced (`regbench run --devices`):
    the host knows which of its devices a run may take."""
    devices = parse_devices(spec)
    return config.model_copy(
        update={"profiles": [p.model_copy(update={"devices": devices}) for p in config.profiles]}
    )
