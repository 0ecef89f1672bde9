"""End to end with models where users keep them: a hub id served from the hub cache, and a hub
cache snapshot booted in a container. The cache is built here from the tiny canary
(tests/hubcache.py); nothing is fetched from a hub.

Slow tier: one vLLM boot per test (~40 s each); the container test needs the Docker engine and
images (scripts/setup-docker.sh, run by scripts/setup.sh).
"""

from __future__ import annotations

import os

import docker
import pytest
import yaml

from bench.core.records import PreflightRecord, RunRecord, Summary
from bench.serve.launch_docker import LABEL

from .hubcache import hub_cache
from .support import CANARY, ROOT, one_cell_config, processes_labelled, regbench

pytestmark = pytest.mark.slow
REPO = "regbench-test/tiny-canary"
DOCKER_SMOKE = ROOT / "configs" / "cpu-smoke-docker.yaml"


def records(run_dir, name, model):
    return [model.model_validate_json(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory):
    """One cell whose model is a hub id, with the network off: runai_streamer under streamer 0.16.0."""
    tmp = tmp_path_factory.mktemp("hub")
    snap = hub_cache(tmp / "cache", REPO, CANARY)
    config = one_cell_config(
        tmp, models=[{"name": "tiny-canary", "path": REPO, "served_name": "tiny"}],
        include=[{"load_format": "runai_streamer", "image": "streamer-0.16.0"}],
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp / "cache"))
    p = regbench("run", str(config), "--results", str(tmp / "results"), "--run-id", "hub", env=env)
    output, _ = p.communicate(timeout=900)
    return p.returncode, output, tmp / "results" / "hub", snap


def test_a_hub_id_gets_inspect_and_audit_from_the_cache_offline(hub_run):
    code, output, run_dir, snap = hub_run
    fetch, inspect, audit = records(run_dir, "preflight.jsonl", PreflightRecord)
    assert code == 1, output
    assert (fetch.kind, fetch.notes[0]) == ("fetch", f"hub id {REPO} at main: commit {snap.commit}")
    assert fetch.notes[1] == f"snapshot {snap.path}"
    assert (inspect.kind, inspect.ok) == ("inspect", True)
    assert any("stream_stop_risk" in n for n in inspect.notes)
    # The audit streamed the snapshot's links through streamer 0.16.0 and saw #157.
    assert (audit.kind, audit.image, audit.load_format, audit.ok) == ("audit", "streamer-0.16.0", "runai_streamer", False)
    assert audit.lost > 0 and not audit.skipped
    (cell,) = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    assert cell.verdict == "fail" and {"weights_lost", "empty_text"} <= set(cell.reasons), cell.reasons
    md = (run_dir / "summary.md").read_text()
    assert f"- fetch `tiny-canary`: ok\n  - hub id {REPO} at main: commit {snap.commit}" in md


def test_the_server_of_a_hub_id_reads_the_snapshot(hub_run):
    code, output, run_dir, snap = hub_run
    (run,) = records(run_dir, "runs.jsonl", RunRecord)
    assert code == 1, output
    assert str(snap.path) in run.server.command
    assert run.server.boot_s is not None and run.perf.checkpoint_bytes == sum(
        f.stat().st_size for f in CANARY.glob("*.safetensors"))
    assert processes_labelled(run_dir) == []


def test_a_hub_cache_snapshot_boots_in_a_container_and_its_audit_reads_the_same_files(tmp_path):
    engine = docker.from_env()
    snap = hub_cache(tmp_path / "cache", REPO, CANARY)
    data = yaml.safe_load(DOCKER_SMOKE.read_text())
    data.update(repeats=1, include=[{"load_format": "runai_streamer", "image": "streamer-0.17.0"}])
    data["models"][0]["path"] = str(snap.path)
    config = tmp_path / "one.yaml"
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "results"), "--run-id", "hubsnap")
    output, _ = p.communicate(timeout=900)
    run_dir = tmp_path / "results" / "hubsnap"
    left = engine.containers.list(all=True, filters={"label": f"{LABEL}.run=hubsnap"}, ignore_removed=True)
    preflights = records(run_dir, "preflight.jsonl", PreflightRecord)
    runs = records(run_dir, "runs.jsonl", RunRecord)
    assert p.returncode == 0, output
    inspect, audit = preflights
    assert (inspect.kind, audit.kind, audit.ok, audit.lost, audit.skipped) == ("inspect", "audit", True, 0, False), audit
    (run,) = runs
    # The server read the snapshot at its own path, its links resolved through the mounted blobs.
    assert os.path.realpath(snap.path) in run.server.command and run.server.boot_s is not None
    (cell,) = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    assert (cell.verdict, cell.runs) == ("pass", 1), (cell.reasons, output)
    assert left == []
