"""The matrix file on disk: read, validated (bench.core.config's schema), its platform names
resolved to profiles (the matrix's platforms/ folder, else those shipped in bench/profiles/) and
its local paths made absolute. The one place a matrix is read from a file; the schema itself is
pure."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from bench.core.config import Config, ConfigError, Platform, format_error, parse_config


def _read_yaml_mapping(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data


# Profiles shipped with regbench, used when the config's folder has no platforms/ of its own.
# Package data (bench/profiles/), so that an installed regbench resolves them too.
SHIPPED_PLATFORMS = Path(__file__).resolve().parent.parent / "profiles"


def load_platform(name: str, base: Path) -> Platform:
    for folder in (base / "platforms", SHIPPED_PLATFORMS):
        path = folder / f"{name}.yaml"
        if path.exists():
            data = _read_yaml_mapping(path)
            try:
                profile = Platform.model_validate(data)
            except ValidationError as exc:
                lines = [format_error(e) for e in exc.errors(include_url=False)]
                raise ConfigError(f"{path}: invalid platform profile\n  " + "\n  ".join(lines)) from None
            if profile.name != name:
                raise ConfigError(f"{path}: names platform {profile.name!r}, expected {name!r}")
            return profile
    raise ConfigError(f"unknown platform {name!r}: no {name}.yaml in {base / 'platforms'} or {SHIPPED_PLATFORMS}")


def load_config(path: str | Path) -> Config:
    """Reads and validates a matrix file; relative paths in it are resolved against its folder,
    and each platform name is resolved to its profile."""
    path = Path(path)
    data = _read_yaml_mapping(path)
    config = parse_config(data, str(path))
    base = Path(os.path.abspath(path)).parent
    if not config.profiles:
        config = config.model_copy(update={"profiles": [load_platform(n, base) for n in config.platforms]})
    return resolve_paths(config, base, str(path))


def _command(value: str, base: Path) -> str:
    # A bare name ("python3") is looked up on PATH when the server starts, like a shell would.
    # normpath, not resolve(): a venv's python is a symlink that must not be followed.
    return value if "/" not in value else os.path.normpath(base / value)


def resolve_paths(config: Config, base: Path, source: str = "<config>") -> Config:
    """Makes local paths absolute (models, signatures, interpreters, overlays, the hub cache). A
    model path that does not exist locally is kept as a hub id (org/name), unless it looks local
    (./, ../, /, ~): then it is a config error naming the key, not a hub id that vLLM would try
    to fetch."""

    def model_path(i: int, p: str) -> str:
        local = Path(os.path.normpath(base / os.path.expanduser(p)))
        if local.exists():
            return str(local)
        if p.startswith((".", "/", "~")):
            raise ConfigError(f"{source}: models.{i}.path: {p!r} looks like a local path, and {local} does not exist "
                              "(a hub id has the form org/name)")
        return p

    hub_cache = config.server.hub_cache and os.path.normpath(base / config.server.hub_cache)
    return config.model_copy(
        update={
            "models": [m.model_copy(update={"path": model_path(i, m.path)}) for i, m in enumerate(config.models)],
            "signatures": [os.path.normpath(base / d) for d in config.signatures],
            # `~` is expanded by the schema; the folder the hub download and the containers' mount share.
            "server": config.server.model_copy(update={"hub_cache": hub_cache}),
            "images": [
                i.model_copy(
                    update={
                        "python": _command(i.python, base),
                        "pythonpath": [os.path.normpath(base / p) for p in i.pythonpath],
                    }
                )
                for i in config.images
            ],
        }
    )
