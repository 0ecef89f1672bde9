from __future__ import annotations

import pytest

from bench.core.config import ConfigError, Platform, parse_config
from bench.core.matrix import expand
from bench.serve.platforms import HostFacts, matches, select
from bench.store.matrixfile import load_config

CPU_HOST = HostFacts(arch="x86_64", gpus=[])
H200_HOST = HostFacts(arch="x86_64", gpus=["NVIDIA H200"] * 8)
SPARK_HOST = HostFacts(arch="aarch64", gpus=["NVIDIA GB10"])


@pytest.mark.parametrize(
    "profile, host, expected",
    [
        ({"name": "cpu"}, CPU_HOST, True),
        ({"name": "cpu"}, SPARK_HOST, True),
        ({"name": "h200", "arch": "x86_64", "gpu_name": "H200"}, H200_HOST, True),
        ({"name": "h200", "arch": "x86_64", "gpu_name": "H200"}, CPU_HOST, False),
        ({"name": "spark", "arch": "aarch64", "gpu_name": "GB10"}, H200_HOST, False),
        ({"name": "spark", "arch": "aarch64", "gpu_name": "GB10"}, SPARK_HOST, True),
    ],
)
def test_profile_matches_host(profile, host, expected):
    assert matches(Platform.model_validate(profile), host) is expected


def test_shipped_profiles_load_and_gpu_configs_select_nothing_on_a_cpu_host():
    for name in ("h200", "dgx-spark", "agx-thor"):
        config = load_config(f"configs/{name}.yaml")
        (profile,) = config.profiles
        assert profile.name == name and profile.gpu_name
        cells = expand(config)
        with pytest.raises(ConfigError, match="--platform"):
            select(cells, config, CPU_HOST, None)
        assert select(cells, config, CPU_HOST, name) == cells  # forced
    assert load_config("configs/agx-thor.yaml").profiles[0].docker.runtime == "nvidia"


def test_select_runs_only_matching_platforms(minimal):
    minimal["platforms"] = ["cpu", "h200"]
    minimal["profiles"] = [{"name": "cpu"}, {"name": "h200", "arch": "x86_64", "gpu_name": "H200"}]
    config = parse_config(minimal)
    cells = expand(config)
    assert {c.platform for c in select(cells, config, CPU_HOST, None)} == {"cpu"}
    assert {c.platform for c in select(cells, config, H200_HOST, None)} == {"cpu", "h200"}
    with pytest.raises(ConfigError, match="not in the matrix"):
        select(cells, config, CPU_HOST, "agx-thor")


def test_unknown_platform_is_a_config_error(tmp_path, minimal):
    import yaml

    minimal["platforms"] = ["b300"]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(minimal))
    with pytest.raises(ConfigError, match="unknown platform 'b300'"):
        load_config(f)
