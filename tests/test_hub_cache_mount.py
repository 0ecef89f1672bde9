"""`server.hub_cache` is one folder for the download on the host and the containers' mount: `~`
expanded and a relative path made absolute against the matrix file's folder when the matrix is
read, mounted read-only at a fixed path, with the container's Hugging Face variables pointing
there and what the libraries write (--trust-remote-code modules) kept in the container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from bench.core.config import ConfigError, parse_config
from bench.core.matrix import expand
from bench.serve.launch_docker import HUB_CACHE, container_env, mounts
from bench.store.matrixfile import load_config
from bench.weights.hub import cache_folder


def docker_matrix(minimal: dict, hub_cache: str) -> dict:
    minimal["launcher"] = "docker"
    minimal["models"] = [{"name": "m", "path": "org/model"}]  # a hub id: resolved into the cache
    minimal["images"] = [{"name": "img", "ref": "vllm/vllm-openai:v0.18.2"}]
    minimal["server"] = {"hub_cache": hub_cache}
    return minimal


def read(minimal: dict, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.yaml").write_text(yaml.safe_dump(minimal))
    config = load_config(folder / "m.yaml")
    return config, expand(config)[0]


def test_a_home_relative_hub_cache_is_one_absolute_folder_for_the_download_and_the_mount(minimal, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config, cell = read(docker_matrix(minimal, "~/hfcache"), tmp_path / "configs")
    home_cache = str(tmp_path / "home" / "hfcache")
    assert config.server.hub_cache == home_cache
    assert cache_folder(config.server.hub_cache, {}) == os.path.join(home_cache, "hub")  # where hub ids resolve
    volumes = mounts(cell, config.server.hub_cache)
    assert volumes[home_cache] == {"bind": HUB_CACHE, "mode": "ro"}
    assert not any(source.startswith("~") for source in volumes)


def test_a_bare_relative_name_is_a_folder_beside_the_matrix_never_a_named_volume(minimal, tmp_path):
    config, cell = read(docker_matrix(minimal, "hfcache"), tmp_path / "configs")
    assert config.server.hub_cache == str(tmp_path / "configs" / "hfcache")
    assert all(os.path.isabs(source) for source in mounts(cell, config.server.hub_cache))
    # A matrix that never went through the loader (built in code) keeps a relative name: refused,
    # by the mount and by the download alike, rather than handed to Docker as a volume name.
    raw = parse_config(docker_matrix(minimal, "hfcache"))
    with pytest.raises(ConfigError, match=r"server\.hub_cache: 'hfcache' is not an absolute path"):
        mounts(expand(raw)[0], raw.server.hub_cache)
    with pytest.raises(ConfigError, match=r"server\.hub_cache"):
        cache_folder(raw.server.hub_cache, {})


def test_the_container_reads_the_cache_read_only_and_writes_its_modules_elsewhere(minimal, tmp_path):
    config, cell = read(docker_matrix(minimal, str(tmp_path / "hf")), tmp_path / "configs")
    assert mounts(cell, config.server.hub_cache)[str(tmp_path / "hf")]["mode"] == "ro"
    # A host HF_HOME handed through means nothing in the container: the mount's paths win.
    config = config.model_copy(update={"server": config.server.model_copy(update={"env_passthrough": ["HF_HOME"]})})
    env = container_env(cell, config, {"HF_HOME": "/home/me/.cache/huggingface"})
    assert env["HF_HUB_CACHE"] == f"{HUB_CACHE}/hub"  # huggingface_hub's cache: the read-only mount
    for written in ("HF_HOME", "HF_MODULES_CACHE"):  # tokens, xet chunks, --trust-remote-code modules
        assert not env[written].startswith(HUB_CACHE) and not env[written].startswith("/root"), written
    assert env["HF_MODULES_CACHE"].startswith(env["HF_HOME"])
    # Without a hub cache nothing is mounted and the image's own defaults stand.
    bare = config.model_copy(update={"server": config.server.model_copy(update={"hub_cache": None})})
    assert "HF_HUB_CACHE" not in container_env(cell, bare, {}) and not mounts(cell, None)
