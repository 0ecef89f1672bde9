"""Object storage before the servers, on a real S3-compatible server (moto_server on 127.0.0.1):
inspect over s3:// reads only the headers (two ranged reads per shard) and says what the local
inspect of the same files says; the audit streams the canary through the streamer's own S3
back-end and loses every tensor under 0.16.0, none under 0.17.0 (runai-model-streamer #157 from
object storage)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.weights.audit import audit_checkpoint
from bench.weights.checkpoint import inspect_checkpoint, read_shard, safetensors_bytes
from bench.weights.objstore import ObjectFiles

from .s3server import SECRET_KEY, s3_server
from .support import CANARY, ROOT, STREAMERS, VLLM_PYTHON, needs_canary

pytestmark = needs_canary


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        server.uri = server.upload(CANARY, "models", "tiny-canary")
        yield server


def test_inspect_over_s3_says_what_the_local_inspect_says(s3):
    remote, local = inspect_checkpoint(s3.uri, s3.env), inspect_checkpoint(CANARY)
    assert remote.path == "s3://models/tiny-canary"
    assert [s.model_dump() for s in remote.shards] == [s.model_dump() for s in local.shards]
    assert remote.index == local.index and remote.dtypes == local.dtypes
    # An object store lists keys sorted: that is the order the streamer's S3 glob hands over.
    assert remote.listing_order == sorted(local.listing_order)
    assert remote.stream_stops[0] == local.stream_stops[0] and remote.stream_stops[0].risk
    assert [p.kind for p in remote.problems] == [p.kind for p in local.problems if p.kind != "stream_stop_risk"] + [
        "stream_stop_risk"] * sum(s.risk for s in remote.stream_stops)
    assert safetensors_bytes(s3.uri, s3.env) == safetensors_bytes(str(CANARY)) > 3_000_000


def test_a_shard_header_costs_two_ranged_reads_not_the_file(s3):
    files = ObjectFiles(s3.uri, s3.env)
    fetched: list[int] = []
    files.client.meta.events.register("after-call.s3.GetObject",
                                      lambda parsed, **_: fetched.append(parsed["ContentLength"]))
    name = "model-00002-of-00010.safetensors"
    shard = read_shard(files, name)
    assert len(shard.tensors) == 4 and shard.error is None
    header = fetched[1]
    assert fetched == [8, header] and 8 + header < files.size(name) // 100


def test_regbench_inspect_takes_an_s3_uri_and_names_what_it_cannot_read(s3):
    env = {**os.environ, **s3.env}
    ok = subprocess.run([sys.executable, "-m", "bench", "inspect", s3.uri], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 1, ok.stderr  # exit 1: the canary's layout is a #157 risk, as inspected locally
    assert "s3://models/tiny-canary: 10 shard(s) (4 empty), 21 tensors" in ok.stdout
    assert "stream stops at empty shard model-00001-of-00010" in ok.stdout
    missing = subprocess.run([sys.executable, "-m", "bench", "inspect", "s3://models/no-such-model"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "s3://models/no-such-model: no objects under this prefix" in missing.stderr
    gone = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "RUNAI_STREAMER_S3_ENDPOINT": "http://127.0.0.1:9"}
    down = subprocess.run([sys.executable, "-m", "bench", "inspect", s3.uri], cwd=ROOT, env=gone,
                          capture_output=True, text=True, timeout=300)
    assert down.returncode == 2 and "cannot list" in down.stderr and "127.0.0.1:9" in down.stderr
    assert SECRET_KEY not in ok.stdout + ok.stderr + missing.stderr + down.stderr


@pytest.mark.slow
@pytest.mark.parametrize("version, lost", [("0.16.0", 42), ("0.17.0", 0)])
def test_the_audit_streams_s3_through_the_streamers_own_back_end(s3, version, lost):
    report = audit_checkpoint(s3.uri, str(VLLM_PYTHON), [str(STREAMERS / version)], s3.env,
                              orders=("sorted", "listing"), loaders=("streamer",), timeout_s=600)
    assert report.streamer_version == version and report.path == s3.uri
    assert report.baseline_tensors == 21 and report.lost == lost  # 21 per order under 0.16.0
    if lost:
        assert all(r.delivered == 0 and r.stop is not None and r.stop.files[r.stop.stop_at] == "model-00001-of-00010.safetensors"
                   for r in report.runs)


@pytest.mark.slow
def test_the_audit_in_a_container_streams_s3_over_the_hosts_network(s3):
    """Under the docker launcher the audit runs in a container of the cell's image: for object
    storage nothing is mounted for the checkpoint and the container shares the host's network to
    reach the endpoint, as the launcher's servers do. The image's own streamer is 0.17.0; the
    0.16.0 overlay (with its S3 back-end) is mounted as the launcher mounts it."""
    import docker

    from bench.serve.launch_docker import LABEL

    engine = docker.from_env()
    lost = {}
    for version in ("0.16.0", "0.17.0"):
        report = audit_checkpoint(s3.uri, "/opt/venv/bin/python", [], s3.env, orders=("sorted",),
                                  loaders=("streamer",), timeout_s=600, image_ref="regbench/vllm-cpu:0.32.0",
                                  pull="never", overlays=[str(STREAMERS / version)], run_id="s3-audit-test")
        assert report.streamer_version == version and report.image == "regbench/vllm-cpu:0.32.0"
        lost[version] = report.lost
    assert lost == {"0.16.0": 21, "0.17.0": 0}
    # Each probe container removed; other workers' containers may come and go meanwhile.
    left = engine.containers.list(all=True, filters={"label": f"{LABEL}.run=s3-audit-test"}, ignore_removed=True)
    assert left == []
