"""The results model: a folder read once into memory, appended to as records are written, its
plan a record of its own; and the one judge over it."""

from __future__ import annotations

import json
import sys

from bench.core.judge import judge
from bench.core.matrix import expand
from bench.core.results import plan_for
from bench.store.merge import merge
from bench.store.publish import regenerate
from bench.store.results import ResultsDir
from tests import synth

BASE = "m__safetensors__cpu__img"
BAD = "m__runai_streamer__cpu__img"


def test_records_written_after_loading_are_in_memory_too(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=2))
    data = results.load()
    assert data.runs == [] and data.requests == []
    synth.add_run(results, BASE, 1)
    synth.add_run(results, BAD, 1, ids=[5] * 128)
    # What the runner's progress line judges: the folder in memory, nothing read back.
    assert [r.cell_id for r in data.runs] == [BASE, BAD] and len(data.requests_of(BAD)) == 2
    assert data.runs == ResultsDir(results.path).load().runs  # and the same as on disk
    verdicts = {c.cell_id: c.verdict for c in judge(data).cells}
    assert verdicts == {BASE: "pass", BAD: "fail"}


def test_the_plan_decides_which_cells_are_judged_not_a_derived_file(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=1))
    config = results.config()
    results.write_plan(plan_for("r", config, [c for c in expand(config) if c.id == BAD], 10.0))
    synth.add_run(results, BAD, 1)
    (results.path / "summary.json").write_text("not json: a derived file is never read back")
    summary = regenerate(results.path).summary
    assert [c.cell_id for c in summary.cells] == [BAD]
    plan = json.loads((results.path / "plan.json").read_text())
    assert plan["cells"] == [BAD] and plan["started_at"] == 10.0 and plan["finished_at"] is None
    # A killed bench never wrote its end: the run ends with its last server.
    assert summary.started_at == 10.0 and summary.finished_at > 1000.0


def test_a_planned_cell_that_never_ran_is_not_run(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=1))
    config = results.config()
    results.write_plan(plan_for("r", config, expand(config), 0.0))
    synth.add_run(results, BASE, 1)
    assert {c.cell_id: c.verdict for c in regenerate(results.path).summary.cells} == {BASE: "pass", BAD: "not run"}


def test_merged_slices_plan_what_their_slices_planned(tmp_path):
    spec = synth.matrix(repeats=1)
    parts = []
    for i, cell in enumerate((BASE, BAD)):
        s = synth.create(tmp_path / f"s{i}", "run", spec)
        config = s.config()
        s.write_plan(plan_for("run", config, [c for c in expand(config) if c.id == cell], 100.0 + i)
                     .model_copy(update={"finished_at": 200.0 + i}))
        if cell == BASE:
            synth.add_run(s, cell, 1)
        parts.append(s.path)
    merged = merge(parts, tmp_path / "out")
    plan = json.loads((merged.path / "plan.json").read_text())
    assert (plan["cells"], plan["started_at"], plan["finished_at"]) == ([BASE, BAD], 100.0, 201.0)
    summary = regenerate(merged.path).summary
    assert {c.cell_id: c.verdict for c in summary.cells} == {BASE: "pass", BAD: "not run"}


def test_verdicts_are_derived_in_the_judge_module_only():
    # The judge is the one place: no other module of the bench calls judge_cell or its checks.
    import subprocess

    out = subprocess.run(["git", "grep", "-l", "-E", r"judge_cell\(|apply_cell_checks\(|set_aside_unconfirmed\(",
                          "--", "bench"], capture_output=True, text=True, check=False).stdout.split()
    assert out and all(path.startswith("bench/core/judge/") for path in out), out
    assert sys.modules.get("bench.report.summary") is None or not hasattr(
        sys.modules["bench.report.summary"], "summarize_cells")


def test_a_cell_this_host_cannot_run_is_named_and_never_a_failure(tmp_path):
    """A run that could not start here (its start error says not runnable: an image's
    architecture, CUDA requirement or registry, devices the host lacks, a knob's CPU flag) says
    nothing of vLLM: the cell is NOT RUNNABLE, counts no failing run, fails no exit code and no
    JUnit case; a run where nothing at all could run exits 2, not 1."""
    results = synth.create(tmp_path, "r", synth.matrix(repeats=2))
    why = "not runnable on this host: image vllm/vllm-openai:v0.16.0 is linux/amd64, this host is arm64 (aarch64)"
    synth.add_run(results, BASE, 1)
    synth.add_run(results, BASE, 2)
    synth.add_run(results, BAD, 1, boot_s=None, start_error=why)
    summary = regenerate(results.path).summary
    cells = {c.cell_id: c for c in summary.cells}
    assert (cells[BAD].verdict, cells[BAD].runs, cells[BAD].failures) == ("not runnable", 0, 0)
    assert cells[BAD].reasons == {"not_runnable": 1} and cells[BAD].failure_rate_interval is None
    assert summary.exit_code == 0
    md = (results.path / "summary.md").read_text()
    assert "all runnable cells pass (1 not runnable on this host)" in md and "NOT RUNNABLE" in md
    junit = (results.path / "junit.xml").read_text()
    assert 'failures="0"' in junit and 'skipped="1"' in junit and "is linux/amd64, this host is arm64" in junit

    nothing = synth.create(tmp_path, "n", synth.matrix(repeats=1))
    for cell in (BASE, BAD):
        synth.add_run(nothing, cell, 1, boot_s=None, start_error=why)
    summary = regenerate(nothing.path).summary
    assert summary.exit_code == 2
    assert "NO CELL RUNNABLE ON THIS HOST" in (nothing.path / "summary.md").read_text()
