"""The pre-flight audit streams as the cell's servers will: with the variables they get (the
object store's endpoint and credentials among them) and the streamer variables vLLM's loader sets
from the load format's `model_loader_extra_config`."""

from __future__ import annotations

import pytest
import yaml

from bench.core.matrix import expand
from bench.store.matrixfile import load_config
from bench.weights.preflight import audit_env, preflight

from .support import needs_canary, one_cell_config

pytestmark = needs_canary


def _config(tmp_path, extra: dict):
    path = one_cell_config(tmp_path, include=[{"load_format": "runai_streamer", "image": "streamer-0.16.0"}])
    data = yaml.safe_load(path.read_text())
    data["load_formats"] = [{"name": "safetensors"},
                            {"name": "runai_streamer", "model_loader_extra_config": extra, "env": {"FROM_FORMAT": "1"}}]
    data["server"]["env"] = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    (cell,) = expand(config)
    return config, cell


def test_the_audit_gets_the_servers_variables_and_the_loaders_extra_config(tmp_path):
    config, cell = _config(tmp_path, {"concurrency": 4, "memory_limit": 0, "distributed": False})
    env = audit_env(config, cell)
    assert env["RUNAI_STREAMER_CONCURRENCY"] == "4" and env["RUNAI_STREAMER_MEMORY_LIMIT"] == "0"
    assert env["FROM_FORMAT"] == "1" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert "distributed" not in " ".join(env)


@pytest.mark.slow
def test_memory_limit_0_in_the_extra_config_reaches_the_audit(tmp_path):
    # Measured: streamer 0.16.0 with RUNAI_STREAMER_MEMORY_LIMIT=0 and an empty shard raises
    # "max() arg is an empty sequence"; the load format says so only through its extra config.
    config, cell = _config(tmp_path, {"memory_limit": 0})
    (audit,) = [r for r in preflight(config, [cell]) if r.kind == "audit"]
    assert not audit.ok and audit.skipped is False
    assert any("max() arg is an empty sequence" in p for p in audit.problems), audit.problems
