"""The qualification workflows cannot run here (no GPU runners): validate them against the GitHub
Actions workflow schema (action-validator, installed by scripts/setup.sh from npm) and check they
consume what `regbench plan --format github-matrix` prints, create the venv with a pinned
Python >= 3.11 whatever the runner's python3 is, and run a nightly per shipped GPU platform."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.core.matrix import expand
from bench.core.slicing import github_matrix
from bench.store.matrixfile import load_config

from .support import needs

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "qualify.yml"
NIGHTLY = WORKFLOWS / "nightly.yml"
PROFILES = ROOT / "bench" / "profiles"
VALIDATOR = ROOT / ".cache" / "node" / "node_modules" / ".bin" / "action-validator"


needs_validator = needs(VALIDATOR, "the Actions workflow validator (.cache/node, from npm)")


@needs_validator
@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.yml")))
def test_workflow_validates_against_the_schema(name):
    out = subprocess.run([str(VALIDATOR), str(WORKFLOWS / name)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_validator
def test_the_validator_does_reject_a_broken_workflow(tmp_path):
    broken = yaml.safe_load(WORKFLOW.read_text())
    broken["jobs"]["run"]["runs-onn"] = broken["jobs"]["run"].pop("runs-on")
    f = tmp_path / "broken.yml"
    f.write_text(yaml.safe_dump(broken))
    assert subprocess.run([str(VALIDATOR), str(f)], capture_output=True, timeout=60).returncode != 0


def test_workflow_consumes_the_plan_output():
    flow = yaml.safe_load(WORKFLOW.read_text())
    run = flow["jobs"]["run"]
    assert run["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert run["runs-on"] == "${{ matrix.runs-on }}"
    script = "\n".join(step.get("run", "") for step in run["steps"])
    assert '--platform "$PLATFORM"' in script and '--shard "$SHARD"' in script and '--run-id "$RUN_ID"' in script
    config = load_config(ROOT / "configs" / "h200.yaml")
    entry = json.loads(github_matrix(config, expand(config), 2))["include"][0]
    assert set(entry) == {"platform", "shard", "runs-on"}  # exactly the keys the job reads
    merge = "\n".join(step.get("run", "") for step in flow["jobs"]["merge"]["steps"])
    assert "regbench merge" in merge and "GITHUB_STEP_SUMMARY" in merge


def _on(flow: dict) -> dict:
    return flow.get("on", flow.get(True))  # PyYAML reads the bare key `on` as True


def test_every_venv_is_made_with_a_pinned_python_of_at_least_3_11():
    """A stock Ubuntu 22.04 GPU host's python3 is 3.10: no job may create the venv with it."""
    flow = yaml.safe_load(WORKFLOW.read_text())
    version = flow["env"]["PYTHON_VERSION"]
    assert isinstance(version, str) and tuple(map(int, version.split("."))) >= (3, 11)
    for name, job in flow["jobs"].items():
        steps = job["steps"]
        installs = [i for i, step in enumerate(steps) if "-m venv" in step.get("run", "")]
        assert installs, f"job {name} makes no venv"
        for i in installs:
            (setup,) = [s for s in steps[:i] if str(s.get("uses", "")).startswith("actions/setup-python@")]
            assert setup["with"]["python-version"] == "${{ env.PYTHON_VERSION }}"
            interpreter = "${{ steps." + setup["id"] + ".outputs.python-path }}"
            assert steps[i]["run"].startswith(f'"{interpreter}" -m venv .venv')
        assert not any("python3 -m venv" in step.get("run", "") for step in steps)


def test_one_run_id_per_matrix_file_so_calls_in_one_workflow_run_never_mix():
    flow = yaml.safe_load(WORKFLOW.read_text())
    plan, run, merge = (flow["jobs"][j] for j in ("plan", "run", "merge"))
    (step,) = [s for s in plan["steps"] if s.get("id") == "plan"]
    assert 'run_id=qualify-$(basename "$CONFIG" .yaml)-$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT' in step["run"]
    assert run["env"]["RUN_ID"] == merge["env"]["RUN_ID"] == "${{ needs.plan.outputs.run_id }}"
    assert "plan" in merge["needs"]
    (upload,) = [s for s in run["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    (download,) = [s for s in merge["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@")]
    assert upload["with"]["name"].startswith("slice-${{ needs.plan.outputs.run_id }}-")
    assert download["with"]["pattern"] == "slice-${{ needs.plan.outputs.run_id }}-*"


def test_a_nightly_per_shipped_gpu_platform_each_on_its_own_runners():
    gpu = sorted(p.stem for p in PROFILES.glob("*.yaml") if yaml.safe_load(p.read_text()).get("gpu_name"))
    assert gpu == ["agx-thor", "dgx-spark", "h200"]
    nightly = yaml.safe_load(NIGHTLY.read_text())
    assert _on(nightly)["schedule"] and "schedule" not in _on(yaml.safe_load(WORKFLOW.read_text()))
    (job,) = nightly["jobs"].values()
    assert job["uses"] == "./.github/workflows/qualify.yml" and job["secrets"] == "inherit"
    assert job["with"]["config"] == "${{ matrix.config }}" and job["strategy"]["fail-fast"] is False
    entries = job["strategy"]["matrix"]["include"]
    assert sorted(e["platform"] for e in entries) == gpu
    labels = []
    for e in entries:
        config = load_config(ROOT / e["config"])
        assert config.platforms == [e["platform"]], e
        (slice_,) = json.loads(github_matrix(config, expand(config), 1))["include"]
        assert e["platform"] in slice_["runs-on"] and "self-hosted" in slice_["runs-on"]
        labels.append(tuple(slice_["runs-on"]))
    assert len(set(labels)) == len(labels)  # no two platforms share runners
    called = _on(yaml.safe_load(WORKFLOW.read_text()))["workflow_call"]
    assert called["inputs"]["config"]["required"] is True
    assert set(called["secrets"]) == {"HF_TOKEN", "REGISTRY_USERNAME", "REGISTRY_PASSWORD", "REGBENCH_HISTORY_URL"}


def test_the_merged_run_goes_into_the_history_and_its_trend_page_is_published():
    """After the merge: `regbench history ingest` of the merged run, into the database the
    REGBENCH_HISTORY_URL secret names (else the default SQLite beside the merged run), then the
    trend page of that same database, uploaded; a history out of reach does not fail the verdict."""
    flow = yaml.safe_load(WORKFLOW.read_text())
    steps = flow["jobs"]["merge"]["steps"]
    (i,) = [i for i, s in enumerate(steps) if s.get("id") == "history"]
    step = steps[i]
    merge = next(j for j, s in enumerate(steps) if s.get("id") == "merge")
    assert merge < i and step["continue-on-error"] is True
    assert step["if"] == "always() && steps.merge.outcome == 'success'"
    assert step["env"]["REGBENCH_HISTORY_URL"] == "${{ secrets.REGBENCH_HISTORY_URL }}"
    script = step["run"]
    assert 'if [ -n "$REGBENCH_HISTORY_URL" ]; then history=(--history "$REGBENCH_HISTORY_URL"); fi' in script
    assert '.venv/bin/regbench history ingest "merged/$RUN_ID" "${history[@]}"' in script
    # The view reads the same database: the URL, or merged/history.sqlite (ingest's default for merged/RUN_ID).
    assert '.venv/bin/regbench history --results merged "${history[@]}" --html "trend/history-$RUN_ID.html"' in script
    (upload,) = [s for s in steps[i + 1:] if s.get("with", {}).get("path") == "trend/"]
    assert str(upload["uses"]).startswith("actions/upload-artifact@")
    assert upload["if"] == "always() && steps.history.outcome == 'success'"
    assert upload["with"]["name"] == "history-${{ env.RUN_ID }}"
    # The flags the step passes are the command's own.
    from bench.cli import parser

    for argv in (["history", "ingest", "merged/r", "--history", "sqlite:///x"],
                 ["history", "--results", "merged", "--history", "sqlite:///x", "--html", "trend/h.html"]):
        parser().parse_args(argv)
