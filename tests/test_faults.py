"""Faults about the bench's own handling, injected through the whole `regbench run` with real
processes: the wire (a stand-in server speaking the OpenAI API badly, started by the real local
launcher in place of vLLM), the port, the results folder, secrets. Faults about what vLLM does
are injected into real vLLM in test_e2e_vllm.py. Each test is a row of the fault table in docs/faults.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.core.judge import judge_server
from bench.core.records import RequestRecord, RunRecord
from bench.serve.errors import BootError
from bench.serve.launch_local import ProcessGroup
from bench.serve.lifecycle import Server
from bench.store.matrixfile import load_config
from bench.store.results import read_jsonl, write_config

from .fakeserver import FakeServer
from .support import only_cell, processes_labelled, reasons, wait_for_line

ROOT = Path(__file__).resolve().parent.parent
FAKEVLLM = Path(__file__).parent / "data" / "fakevllm"
FAKEPROC = Path(__file__).parent / "fakeproc.py"
RUN_ID = "r"


def matrix(tmp_path: Path, prompts: int = 2, top: dict | None = None, **workload) -> Path:
    data = {
        "name": "faults",
        "models": [{"name": "m", "path": str(tmp_path)}],
        "load_formats": [{"name": "safetensors"}],
        "images": [{"name": "fake", "python": sys.executable, "pythonpath": [str(FAKEVLLM)]}],
        "workload": {
            "prompts": [{"id": f"p{i}", "prompt": "hi", "stream": i % 2 == 1} for i in range(prompts)],
            "request_timeout_s": 3,
            **workload,
        },
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5},
        "preflight": False,
        **(top or {}),
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def regbench(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def answered(count_file: Path) -> int:
    return len(count_file.read_text().splitlines()) if count_file.exists() else 0


def on_disk(run_dir: Path) -> list[RequestRecord]:
    return read_jsonl(run_dir / "requests.jsonl", RequestRecord)[0]


@pytest.mark.parametrize("mode, reason", [
    pytest.param("http500", "http_error", marks=pytest.mark.fault("HTTP 500 from the server")),
    pytest.param("http503", "http_error", marks=pytest.mark.fault("HTTP 503 from the server")),
    pytest.param("badjson", "protocol_error", marks=pytest.mark.fault("malformed JSON answer")),
    pytest.param("truncated", "protocol_error", marks=pytest.mark.fault("stream cut short")),
    pytest.param("hang", "timeout", marks=pytest.mark.fault("answer that never ends")),
])
def test_a_fault_on_the_wire_is_a_verdict_naming_it(tmp_path, fault, mode, reason):
    count = tmp_path / "answered"
    p = regbench("run", str(matrix(tmp_path)), "--results", str(tmp_path / "results"), "--run-id", RUN_ID,
                 env={"FAKE_VLLM_MODE": mode, "FAKE_VLLM_COUNT": str(count)})
    run_dir = tmp_path / "results" / RUN_ID
    # Counted first and recorded as counted, then asserted on: a leak is a figure in the table.
    left = processes_labelled(run_dir)
    kept = on_disk(run_dir)
    lost = max(0, answered(count) - len(kept))  # answers sent that are not on disk
    cell = only_cell(run_dir)
    fault(reasons(cell), records_lost=lost, processes_left=len(left))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert cell is not None and reason in cell.reasons and cell.verdict == "fail", cell
    assert len(kept) == 2 and lost == 0 and left == []


@pytest.mark.fault("port taken by another program")
def test_a_port_taken_by_another_program_is_never_sent_the_workload(tmp_path, fault):
    # Another program answers on the port the bench picked before the server could bind it:
    # it must not be mistaken for the server (the server itself fails to bind and exits).
    run_dir = tmp_path / "run"
    with FakeServer("ok") as stranger:
        port = stranger.httpd.server_address[1]
        log = tmp_path / "server.log"
        argv = [sys.executable, str(FAKEPROC), str(port), "ok"]
        env = {**os.environ, "REGBENCH_RUN_DIR": str(run_dir)}  # the bench's label: its processes are counted by it
        server = Server(lambda: ProcessGroup(argv, env, tmp_path, log, tmp_path / "s"), argv, port, log, 20, 5)
        with pytest.raises(BootError, match=f"port {port} is held by pid {os.getpid()}"):
            server.__enter__()
        sent = list(stranger.requests)
    left = processes_labelled(run_dir)
    findings = judge_server(server.outcome, "", log.read_text())
    fault(", ".join(f.reason for f in findings), processes_left=len(left))
    assert sent == []
    assert [f.reason for f in findings] == ["port_taken"]
    assert server.handle.poll() is not None and left == []  # our own server was stopped


def mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


@pytest.fixture
def tiny_fs(tmp_path):
    """A folder on a 512 KiB tmpfs (needs root, as the CI machines run)."""
    mounts = []

    def make(name: str, options: str = "size=512k") -> Path:
        path = tmp_path / name
        mount_tmpfs(path, options)
        mounts.append(path)
        return path

    yield make
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.fault("results folder fills up (disk full)")
def test_a_full_disk_stops_the_run_cleanly_and_resume_finishes_it(tmp_path, tiny_fs, fault):
    results = tiny_fs("full")
    filler = results / "filler"
    count = tmp_path / "answered"
    # 40 answers of 128 token ids each (no logprobs): about 2.5 KB per record, more than is left.
    config = matrix(tmp_path, prompts=40, top={"comparison": {"mode": "exact"}})
    # tmpfs counts whole 4 KiB pages. Before the first answer the run writes config.yaml (its
    # size measured here: it grows with every prompt field), and a page each for plan.json, the
    # lock, the fingerprint and the server log; then 24 KiB are left, room for a few answers.
    write_config(tmp_path / "as-run.yaml", load_config(config))
    pages = -(-(tmp_path / "as-run.yaml").stat().st_size // 4096) + 4
    filler.write_bytes(b"\0" * (512 * 1024 - pages * 4096 - 24 * 1024))
    env = {"FAKE_VLLM_COUNT": str(count)}
    p = regbench("run", str(config), "--results", str(results), "--run-id", RUN_ID, env=env)
    run_dir = results / RUN_ID
    left_after_full = processes_labelled(run_dir)
    verdict = "exit 3, servers stopped; --resume completes"
    fault(verdict, processes_left=len(left_after_full))  # what is counted so far; the resume's added below
    assert p.returncode == 3, p.stdout + p.stderr
    assert "No space left on device" in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert left_after_full == []
    written = on_disk(run_dir)  # readable: at most a half-written last line, dropped
    assert 0 < len(written) < 40
    unwritten = answered(count) - len(written)
    assert unwritten <= 1  # only the record whose write hit the full disk
    # Space again: --resume redoes the unfinished run; every finished request is then on disk once.
    filler.unlink()
    again = regbench("run", "--resume", str(run_dir), env=env)
    left = processes_labelled(run_dir)
    final = on_disk(run_dir)
    lost = 40 - len({r.prompt_id for r in final})  # each prompt answered once: 40 records, one each
    fault(verdict, records_lost=lost, processes_left=len(left_after_full) + len(left))
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(final) == 40 and lost == 0 and left == []


@pytest.mark.fault("results folder not writable")
def test_a_read_only_results_folder_is_refused_before_any_server_starts(tmp_path, tiny_fs, fault):
    results = tiny_fs("ro", "size=64k,ro")
    count = tmp_path / "answered"
    p = regbench("run", str(matrix(tmp_path)), "--results", str(results), "--run-id", RUN_ID,
                 env={"FAKE_VLLM_COUNT": str(count)})
    left = processes_labelled(results)
    fault("exit 2 before any server", processes_left=len(left))
    assert p.returncode == 2 and "Read-only file system" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not count.exists() and left == []


SECRETS = {
    "HF_TOKEN": "hf_" + "Qx7" * 12,  # passed through by name
    "MY_SERVICE_TOKEN": "svc-9f8e7d6c5b4a3210",  # a secret by its name only
}
SHAPED = [
    "sk-" + "A1b2" * 8, "AKIAABCDEFGHIJKLMNOP", "glpat-" + "z" * 24,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]


@pytest.mark.fault("secrets in the environment and in server output")
def test_no_secret_reaches_any_file_of_a_run(tmp_path, fault):
    config = matrix(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["server"]["env_passthrough"] = ["HF_TOKEN"]
    data["server"]["env"] = {"SOME_KEY_IN_THE_MATRIX": SHAPED[0]}
    config.write_text(yaml.safe_dump(data))
    printed = "|".join([
        "loading with token $HF_TOKEN", "service $MY_SERVICE_TOKEN", f"aws {SHAPED[1]}",
        f"Authorization: Bearer {SHAPED[2]}", f"session {SHAPED[3]}", f"key {SHAPED[0]}",
    ])
    p = regbench("run", str(config), "--results", str(tmp_path / "results"), "--run-id", RUN_ID,
                 env={**SECRETS, "FAKE_VLLM_PRINT": printed})
    run_dir = tmp_path / "results" / RUN_ID
    left = processes_labelled(run_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    assert regbench("report", str(run_dir)).returncode == 0  # regenerated reports too
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    assert {"server.log", "config.yaml", "runs.jsonl", "requests.jsonl", "summary.json", "summary.md",
            "junit.xml", "report.html"} <= {f.name for f in files}
    secrets = [*SECRETS.values(), *SHAPED]
    leaks = [(f.name, s) for f in files for s in secrets if s.encode() in f.read_bytes()]
    fault(f"{len(leaks)} of {len(secrets)} secrets in {len(files)} files", processes_left=len(left),
          cases=len(secrets) * len(files))
    log = next(f for f in files if f.name == "server.log").read_text()
    assert log.count("[REDACTED]") >= 6 and "loading with token [REDACTED]" in log  # the lines are kept
    assert leaks == [] and left == []
    assert p.stdout.count(SECRETS["HF_TOKEN"]) == 0


@pytest.mark.fault("bench receives SIGINT mid-request")
def test_ctrl_c_while_a_request_hangs_stops_the_server_and_records_the_run(tmp_path, fault):
    results = tmp_path / "results"
    p = subprocess.Popen([sys.executable, "-m", "bench", "run", str(matrix(tmp_path, request_timeout_s=60)),
                          "--results", str(results), "--run-id", RUN_ID], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "FAKE_VLLM_MODE": "hang"})
    log = results / RUN_ID / "cells" / "m__safetensors__cpu__fake" / "run-1" / "server.log"
    # In "hang" mode a received request is never answered: once the line is there, one is in flight.
    wait_for_line(log, r"request received", 60, p)
    p.send_signal(signal.SIGINT)
    output, _ = p.communicate(timeout=60)
    left = processes_labelled(results)
    fault("run recorded as interrupted, server stopped, exit 130", processes_left=len(left))
    assert p.returncode == 130, output
    (run,) = [RunRecord.model_validate_json(x) for x in (results / RUN_ID / "runs.jsonl").read_text().splitlines()]
    assert run.interrupted and run.server.exit_code == 0  # stopped with SIGTERM, not abandoned
    assert "shutting down" in log.read_text()
    assert left == []


def test_the_fault_table_shows_a_leak_as_a_figure_and_its_check_fails(tmp_path):
    # scripts/fault_table.py on a ledger of three rows: one clean, one that counted a process left
    # and a record lost (its test then failed), one whose test failed before it counted anything.
    ledger = tmp_path / "faults.json"
    row = {"kind": "server leaves children running", "verdict": "v", "records_lost": 0, "processes_left": 0, "cases": 1}
    ledger.write_text(json.dumps([
        {**row, "test": "t::clean", "survived": True},
        {**row, "test": "t::leak", "survived": False, "records_lost": 2, "processes_left": 1},
        {"kind": "stream cut short", "test": "t::early", "survived": False},
    ]))
    script = [sys.executable, str(ROOT / "scripts" / "fault_table.py"), "--ledger", str(ledger)]
    shown = subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    assert "| server leaves children running | 1/2 | 2 | v | 2 | 1 |" in shown
    assert "| stream cut short | 0/1 | 0 | (no result) | — (1 not counted) | — (1 not counted) |" in shown
    assert shown[-1].endswith("| **2** (1 not counted) | **1** (1 not counted) |")
    check = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert check.returncode == 1
    assert "fault table: t::leak: survived False, records lost 2, processes left 1" in check.stdout
    assert "fault table: t::early: failed before it counted" in check.stdout
    assert "t::clean" not in check.stdout  # a clean row is no problem
