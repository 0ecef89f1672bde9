"""`regbench report-bug`: a synthetic results folder of the seed bug whose model is the real tiny
canary and whose image is the real streamer 0.16.0 overlay, so that the report's audit command,
run here, reproduces the loss it reports, and the collect_env it runs is the real vLLM's (~5 s:
the tests that are not about it pass --no-collect-env)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import docker
import docker.errors
import pytest

from bench.bugreport.collect_env import CollectEnvError, run_collect_env_local
from bench.bugreport.gather import one_cell_config
from bench.bugreport.render import trim_lines
from bench.cli import main
from bench.core.config import parse_config
from bench.core.matrix import expand
from bench.core.records import RequestRecord, RunRecord, ServerOutcome
from bench.serve.launch_docker import LABEL
from bench.serve.launch_local import vllm_argv
from bench.store.matrixfile import load_config
from tests import synth
from tests.support import CANARY, ROOT, STREAMERS, VLLM_PYTHON, needs_canary, needs_vllm, setup_missing, wait_until

CELL = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"
DOCKER_IMAGE = "regbench/vllm-cpu:0.32.0-streamer-0.16.0"  # built by scripts/setup-docker.sh
BASE = "tiny-canary__safetensors__cpu__streamer-0.16.0"
STREAM_STOP_LOG = ROOT / "tests" / "data" / "logs" / "vllm-0.32-runai-0.16.0-stream-stop.log"
# Planted where a run leaves text: the server's environment in the matrix, a log line, an exception.
MATRIX_SECRET = "mirror-key-value-42"
# CUDA_DEPLOY_KEY: collect_env prints every CUDA* variable whose name does not say secret, token,
# api, access or password, so this one's value reaches its output.
ENV_SECRETS = {"HF_TOKEN": "hf_secretvalue", "DEPLOY_KEY": "deploykeyvalue77", "CUDA_DEPLOY_KEY": "cudakeyvalue55"}


def _spec(python: str = str(VLLM_PYTHON)) -> dict:
    spec = synth.matrix(images=("streamer-0.16.0",), repeats=2)
    spec.update(
        models=[{"name": "tiny-canary", "path": str(CANARY)}],
        images=[{"name": "streamer-0.16.0", "python": python, "pythonpath": [str(STREAMERS / "0.16.0")]}],
        server={"args": ["--max-model-len", "512", "--dtype", "float32"], "env": {"MIRROR_KEY": MATRIX_SECRET}},
    )
    spec["workload"]["prompts"] = [
        {"id": "code", "prompt": "def main():"},
        {"id": "chat", "kind": "chat", "messages": [{"role": "user", "content": "Sort a list."}]},
    ]
    return spec


def _run(results, cell, repeat: int, ids: list[int], text: str, log: str, stop_at: int | None = None) -> RunRecord:
    """One run as the local launcher records it: its real command line, a request per prompt,
    its server log (`stop_at`: where the stop request was made in it)."""
    log_path = results.run_dir(cell.id, repeat) / "server.log"
    log_path.write_text(log)
    for prompt in cell.workload.prompts:
        results.add_request(RequestRecord(
            cell_id=cell.id, repeat=repeat, prompt_id=prompt.id, api=prompt.kind, stream=False, started_at=1000.0,
            latency_s=0.5, status=200, text=text, token_ids=ids, completion_tokens=len(ids), finish_reason="length"))
    record = RunRecord(cell_id=cell.id, repeat=repeat, requests_s=1.0, server=ServerOutcome(
        command=vllm_argv(cell, cell.server, 8100 + repeat), port=8100 + repeat,
        log_path=str(log_path.relative_to(results.path)), started_at=1000.0 + repeat * 60, boot_s=40.0, exit_code=0,
        shutdown_s=2.0, stop_requested_at_byte=stop_at))
    results.add_run(record)
    return record


@pytest.fixture
def seed_bug(tmp_path):
    return _seed(tmp_path, _spec())


def _seed(tmp_path, spec: dict, **fingerprint):
    """The seed bug's results: safetensors healthy, runai_streamer 128 copies of id 0 with empty
    text in both runs, and secrets in the log and in an exit-time exception of run 2."""
    results = synth.create(tmp_path, "bug", spec)
    synth.fingerprint(results, "streamer-0.16.0", runai_model_streamer="0.16.0", **fingerprint)
    cells = {c.id: c for c in expand(results.config())}
    leak = " ".join(ENV_SECRETS.values())
    log = STREAM_STOP_LOG.read_text() + f"WARNING 11-30 12:43:09 [config.py:1] falling back to float32 ({leak})\n"
    at_exit = f"Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: auth failed for {leak}\n"
    for repeat in (1, 2):
        _run(results, cells[BASE], repeat, synth.GOOD_IDS, "def f(x):\n    return x", "INFO serving\n")
        # Run 2's server printed an exception after the stop request, with the secrets in it.
        _run(results, cells[CELL], repeat, [0] * 128, "", log + (at_exit if repeat == 2 else ""),
             stop_at=len(log.encode()) if repeat == 2 else None)
    return results.path


def _report(path, monkeypatch, capsys, collect_env: bool = False) -> str:
    return _report_and_stderr(path, monkeypatch, capsys, *([] if collect_env else ["--no-collect-env"]))[0]


def _report_and_stderr(path, monkeypatch, capsys, *flags: str) -> tuple[str, str]:
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    assert main(["report-bug", str(path), "--cell", CELL, *flags]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(path / f"bug-{CELL}.md")
    return (path / f"bug-{CELL}.md").read_text(), captured.err


def _block_after(text: str, heading: str) -> str:
    """The first fenced block after a line containing `heading`."""
    rest = text[text.index(heading):]
    return re.search(r"```\w*\n(.*?)\n```", rest, re.S)[1]


def test_the_report_names_the_cause_rate_and_evidence(seed_bug, monkeypatch, capsys):
    text = _report(seed_bug, monkeypatch, capsys)
    # The streamer's issue: its signature comes first; vLLM's form's sections all the same.
    assert "An issue for run-ai/runai-model-streamer" in text
    assert text.splitlines()[2].startswith("# runai-model-streamer 0.16.0: runai-model-streamer stops at an empty")
    for section in ("### Your current environment", "### 🐛 Describe the bug", "### Before submitting a new issue..."):
        assert section in text
    assert "`runai-empty-shard-stream-stop`" in text
    assert "2/2 runs failed (failure rate 34–100 %, Wilson 95 % interval)" in text
    assert "`divergence` (2/2)" in text and "`empty_text` (2/2)" in text
    assert "code: empty text (128 tokens, finish_reason length)" in text
    assert "differs from baseline at token 0: (id 0) vs baseline (id 100) (logprobs top-5)" in text
    assert "weights loader 'Runai Model Streamer' stopped at 0/21" in text  # the recorded log's bar
    assert "Exception printed at exit: `RuntimeError: auth failed for [REDACTED] [REDACTED] [REDACTED]`" in text
    assert "runai-model-streamer #157" in text and "Upgrade runai-model-streamer to 0.16.1" in text
    env = _block_after(text, "<summary>")
    assert "runai-model-streamer : 0.16.0" in env and "vLLM                 : 0.32.0" in env


def test_no_secret_reaches_the_report_or_the_matrix(seed_bug, monkeypatch, capsys):
    text = _report(seed_bug, monkeypatch, capsys)
    matrix = (seed_bug / f"bug-{CELL}.yaml").read_text()
    # The run wrote the matrix's value as it was; the report must not carry it on.
    assert MATRIX_SECRET in (seed_bug / "config.yaml").read_text()
    for secret in (MATRIX_SECRET, *ENV_SECRETS.values()):
        assert secret not in text and secret not in matrix
    assert 'MIRROR_KEY="$MIRROR_KEY"' in text  # referred to by name in the serve command


@needs_canary
def test_the_one_cell_matrix_loads_with_its_baseline(seed_bug, monkeypatch, capsys):
    _report(seed_bug, monkeypatch, capsys)
    config = load_config(seed_bug / f"bug-{CELL}.yaml")
    cells = {c.id: c for c in expand(config)}
    assert set(cells) == {CELL, BASE} and cells[CELL].baseline_id == BASE
    assert cells[CELL].image.pythonpath == [str(STREAMERS / "0.16.0")]
    assert config.server.env["MIRROR_KEY"] == "[REDACTED]"


def test_the_serve_and_curl_commands_are_the_runs(seed_bug, monkeypatch, capsys):
    text = _report(seed_bug, monkeypatch, capsys)
    runs = [RunRecord.model_validate_json(line) for line in (seed_bug / "runs.jsonl").read_text().splitlines()]
    first = next(r for r in runs if r.cell_id == CELL and r.repeat == 1)
    serve = _block_after(text, "The server exactly as")
    assert serve.endswith(shlex.join(first.server.command))
    assert f"PYTHONPATH={STREAMERS / '0.16.0'}" in serve and "HF_HUB_OFFLINE=1" in serve
    argv = shlex.split(_block_after(text, "One request of the workload"))
    assert argv[:3] == ["curl", "-sS", "http://127.0.0.1:8101/v1/completions"]
    body = json.loads(argv[argv.index("-d") + 1])
    assert body == {"model": "tiny-canary", "prompt": "def main():", "max_tokens": 128, "temperature": 0.0, "seed": 0,
                    "min_tokens": 128, "ignore_eos": True, "return_token_ids": True,
                    # the default comparison is by logprobs, top 5: the client asks for them by token id
                    "logprobs": 5, "return_tokens_as_token_ids": True}
    assert f"regbench run {seed_bug / f'bug-{CELL}.yaml'}" in text


@needs_vllm
@needs_canary
def test_the_audit_command_reproduces_the_loss(seed_bug, monkeypatch, capsys):
    text = _report(seed_bug, monkeypatch, capsys)
    argv = shlex.split(_block_after(text, "Without a server"))
    assert argv[:2] == ["regbench", "audit"]
    # The report's `regbench` is this checkout's.
    done = subprocess.run([sys.executable, "-m", "bench", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr  # tensors lost, as the finding says
    assert "0/21 tensors delivered" in done.stdout + done.stderr


def test_a_passing_or_unknown_cell_is_a_usage_error(seed_bug, capsys):
    assert main(["report-bug", str(seed_bug), "--cell", BASE]) == 2
    assert "PASS" in capsys.readouterr().err
    assert main(["report-bug", str(seed_bug), "--cell", "no__such__cell__x"]) == 2
    assert "no such cell" in capsys.readouterr().err
    assert not list(seed_bug.glob("bug-*"))


def test_a_knobs_cell_keeps_the_cells_it_is_compared_with():
    spec = synth.matrix(images=("a", "b"))
    spec.update(baseline={"image": "a"}, invariance={"knobs": ["serial"], "cells": [{"load_format": "runai_streamer"}]})
    config = parse_config(spec)
    cells = {c.id: c for c in expand(config)}
    reduced = one_cell_config(config, cells, cells["m__runai_streamer__cpu__b+serial"])
    assert [(c.id, c.baseline_id) for c in expand(reduced)] == [
        ("m__runai_streamer__cpu__a", None), ("m__runai_streamer__cpu__b", "m__runai_streamer__cpu__a"),
        ("m__runai_streamer__cpu__b+serial", "m__runai_streamer__cpu__b")]


def _collect_env_section(text: str) -> str:
    return text[text.index("### Your current environment"):text.index("### 🐛 Describe the bug")]


@needs_vllm
def test_the_report_has_collect_envs_output_from_the_cells_python(seed_bug, monkeypatch, capsys):
    text, err = _report_and_stderr(seed_bug, monkeypatch, capsys)
    assert err == ""
    version = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, check=True, timeout=120).stdout.strip()
    output = _block_after(text, "<summary>The output of <code>python -m vllm.collect_env</code>")
    assert re.search(rf"^vLLM Version\s*: {re.escape(version)}$", output, re.M), output
    assert re.search(r"^PyTorch version\s*: \S", output, re.M), output
    assert "lines cut" not in _collect_env_section(text)
    command = _block_after(text, "It was run as:")
    assert command == f"PYTHONPATH={STREAMERS / '0.16.0'} {VLLM_PYTHON} -m vllm.collect_env"
    # collect_env printed the planted variable, the report's redactor masked its value.
    assert "CUDA_DEPLOY_KEY=[REDACTED]" in output
    for secret in (MATRIX_SECRET, *ENV_SECRETS.values()):
        assert secret not in text


def test_a_python_that_is_not_there_is_said_and_the_command_given(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    text, err = _report_and_stderr(_seed(tmp_path, _spec(str(missing))), monkeypatch, capsys)
    section = _collect_env_section(text)
    assert f"could not be run here: `cannot run {missing}: No such file or directory`" in section
    assert _block_after(section, "in the failing cell's environment:") == \
        f"PYTHONPATH={STREAMERS / '0.16.0'} {missing} -m vllm.collect_env"
    assert f"regbench: warning: vLLM's collect_env could not be run here (cannot run {missing}" in err


def _stub_python(tmp_path, body: str):
    """A stand-in for an image's Python that leaves a mark when it runs."""
    stub = tmp_path / "stub-python"
    stub.write_text(f"#!/bin/sh\necho ran >> {tmp_path / 'ran'}\n{body}\n")
    stub.chmod(0o755)
    return stub


def test_a_failing_collect_env_is_said_with_its_last_words(tmp_path, monkeypatch, capsys):
    stub = _stub_python(tmp_path, f"echo 'ModuleNotFoundError: No module named vllm {ENV_SECRETS['DEPLOY_KEY']}' >&2; "
                                  "exit 3")
    text, err = _report_and_stderr(_seed(tmp_path, _spec(str(stub))), monkeypatch, capsys)
    assert (tmp_path / "ran").read_text() == "ran\n"
    why = f"`{stub} -m vllm.collect_env exited with code 3: ModuleNotFoundError: No module named vllm [REDACTED]`"
    assert f"could not be run here: {why}" in text
    assert "exited with code 3" in err and ENV_SECRETS["DEPLOY_KEY"] not in err  # the warning is redacted too


def test_no_collect_env_runs_nothing_and_still_gives_the_command(tmp_path, monkeypatch, capsys):
    stub = _stub_python(tmp_path, "exit 0")
    text, err = _report_and_stderr(_seed(tmp_path, _spec(str(stub))), monkeypatch, capsys, "--no-collect-env")
    assert not (tmp_path / "ran").exists() and err == ""
    section = _collect_env_section(text)
    assert "vLLM's `collect_env` was not run (`--no-collect-env`)." in section
    assert _block_after(section, "in the failing cell's environment:").endswith(f"{stub} -m vllm.collect_env")


def test_a_collect_env_that_hangs_is_killed_with_its_children(tmp_path):
    stub = _stub_python(tmp_path, f"sleep 60 & echo $! > {tmp_path / 'child'}; wait")
    cell = expand(parse_config(_spec(str(stub))))[0]
    started = time.monotonic()
    with pytest.raises(CollectEnvError, match=r"timed out after 0\.5 s"):
        run_collect_env_local(cell, dict(os.environ), timeout_s=0.5)
    assert time.monotonic() - started < 10
    child = Path(f"/proc/{int((tmp_path / 'child').read_text())}/stat")
    # Gone, or a zombie of an init here that does not reap orphans: killed either way.
    wait_until(lambda: not child.exists() or _state(child) == "Z", 5, "the hung collect_env's child to be killed")


def _state(stat: Path) -> str:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"  # gone between the two looks


def test_an_unreachable_docker_engine_is_said_and_the_command_given(tmp_path, monkeypatch, capsys):
    spec = _spec()
    spec.update(launcher="docker", images=[{"name": "streamer-0.16.0", "ref": "regbench/vllm-cpu:0.32.0-streamer-0.16.0"}])
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    text, err = _report_and_stderr(_seed(tmp_path, spec), monkeypatch, capsys)
    section = _collect_env_section(text)
    assert "could not be run here: `no Docker engine answers" in section
    assert _block_after(section, "in the failing cell's environment:") == \
        "docker run --rm --network host --entrypoint python3 regbench/vllm-cpu:0.32.0-streamer-0.16.0 -m vllm.collect_env"
    assert "regbench: warning: vLLM's collect_env could not be run here (no Docker engine answers" in err


@pytest.mark.slow
def test_collect_env_runs_in_a_container_of_the_pinned_image_and_is_removed(tmp_path, monkeypatch, capsys):
    try:
        engine = docker.from_env()
        image = engine.images.get(DOCKER_IMAGE)
    except docker.errors.DockerException as exc:
        setup_missing(f"the Docker engine with {DOCKER_IMAGE} (scripts/setup-docker.sh): {exc}")
    spec = _spec()
    # A tag that does not exist: only the pin the run recorded can have run.
    spec.update(launcher="docker", images=[{"name": "streamer-0.16.0", "ref": "regbench/no-such-image:moved",
                                            "env": {"NCCL_REGBENCH_MARK": "from-the-matrix"}}])
    path = _seed(tmp_path, spec, image_ref="regbench/no-such-image:moved", image_pin=image.id)
    text, err = _report_and_stderr(path, monkeypatch, capsys)
    assert err == ""
    output = _block_after(text, "<summary>The output of <code>python -m vllm.collect_env</code>")
    assert re.search(r"^vLLM Version\s*: 0\.32\.0$", output, re.M) and "PyTorch version" in output, output
    assert "NCCL_REGBENCH_MARK=from-the-matrix" in output  # the image's variables from the matrix
    assert _block_after(text, "It was run as:") == ("docker run --rm --network host -e NCCL_REGBENCH_MARK=from-the-matrix "
                                                    f"--entrypoint python3 {image.id} -m vllm.collect_env")
    left = engine.containers.list(all=True, filters={"label": [f"{LABEL}.run=bug", f"{LABEL}.cell=collect-env"]})
    assert left == []


def test_a_huge_collect_env_output_keeps_its_head_and_tail():
    many = "\n".join(f"line {i}" for i in range(1000)) + "\n" + "x" * 5000
    text, cut = trim_lines(many, head=3, tail=2, chars=10_000, width=10)
    assert cut == 996
    assert text.splitlines() == ["line 0", "line 1", "line 2", "[… 996 lines cut by regbench …]", "line 999",
                                 "xxxxxxxxxx […]"]
    # Long lines: cut by characters before the line counts are reached.
    text, cut = trim_lines("\n".join(f"{i:03d}" + "y" * 96 for i in range(100)), chars=3_000)
    kept = text.splitlines()
    assert cut == 70 and kept[19].startswith("019") and kept[20] == "[… 70 lines cut by regbench …]"
    assert kept[21].startswith("090") and kept[-1].startswith("099") and len(text) <= 3_000 + len(kept[20])
    assert trim_lines("a\nb\n") == ("a\nb", 0)


def test_a_knobs_report_shows_the_divergence_its_verdict_found(tmp_path):
    """A knob's cell is compared with the cell without the knob as that cell answered, even when
    that cell failed (here: every run exited with code 1). The report's first divergence is the
    verdict's own, found against that answer."""
    from bench.bugreport.gather import gather_bug_report

    spec = synth.matrix(repeats=2)
    spec["invariance"] = [{"knobs": ["serial"]}]
    results = synth.create(tmp_path, "knob", spec)
    synth.fingerprint(results, "img")
    base, knob = "m__safetensors__cpu__img", "m__safetensors__cpu__img+serial"
    batched = [*synth.GOOD_IDS[:7], 5, *synth.GOOD_IDS[8:]]
    for repeat in (1, 2):
        synth.add_run(results, base, repeat, ids=batched, exit_code=1)
        synth.add_run(results, "m__runai_streamer__cpu__img", repeat, ids=batched)
        synth.add_run(results, knob, repeat)
    assert main(["report", str(results.path)]) == 1
    cells = {c["cell_id"]: c for c in json.loads((results.path / "summary.json").read_text())["cells"]}
    assert cells[base]["reasons"] == {"exit_code": 2}
    # Both prompts of both runs differ at token 7.
    assert cells[knob]["reasons"] == {"invariance_broken": 2} and cells[knob]["divergence_positions"] == [7] * 4
    report, _, _ = gather_bug_report(results.path, knob, "matrix.yaml", collect_env=False)
    assert report.divergence is not None
    assert (report.divergence.position, report.divergence.token, report.divergence.baseline_token) == (7, 107, 5)
