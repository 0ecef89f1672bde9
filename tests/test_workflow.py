"""The qualification workflow cannot run here (no GPU runners): validate it against the GitHub
Actions workflow schema (action-validator, installed by scripts/setup.sh from npm) and check it
consumes what `regbench plan --format github-matrix` prints."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from bench.core.config import load_config
from bench.core.matrix import expand
from bench.core.slicing import github_matrix

from .support import needs

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "qualify.yml"
VALIDATOR = ROOT / ".cache" / "node" / "node_modules" / ".bin" / "action-validator"


needs_validator = needs(VALIDATOR, "the Actions workflow validator (.cache/node, from npm)")


@needs_validator
def test_workflow_validates_against_the_schema():
    out = subprocess.run([str(VALIDATOR), str(WORKFLOW)], capture_output=True, text=True, timeout=60)
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
