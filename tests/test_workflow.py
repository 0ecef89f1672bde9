"""The qualification workflows cannot run here (no GPU runners): validate them against the GitHub
Actions workflow schema (action-validator, installed by scripts/setup.sh from npm) and check they
consume what `regbench plan --format github-matrix` prints, create the venv with a pinned
Python >= 3.11 whatever the runner's python3 is, and run a nightly per shipped GPU platform; and
that they hold what zizmor audits (pinned actions, least permissions, no inherited secrets, no
persisted token), a Docker client config per job and one slice per platform and shard at a time."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.core.config import with_image_refs
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
            # The path reaches the shell through the environment, never spliced into the script.
            assert steps[i]["env"]["INTERPRETER"] == "${{ steps." + setup["id"] + ".outputs.python-path }}"
            assert steps[i]["run"].startswith('"$INTERPRETER" -m venv .venv')
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
    assert job["uses"] == "./.github/workflows/qualify.yml"
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
    # Each passed by name, none inherited: the called workflow gets only the secrets it declares.
    assert job["secrets"] == {name: "${{ secrets." + name + " }}" for name in called["secrets"]}


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


# What zizmor (a static analyser of GitHub Actions workflows) audits, checked here as well so that
# each rule's reason stays beside the workflows: the tool's verdict follows at the end.
SHA_PIN = re.compile(r"[^@\s]+@[0-9a-f]{40}")
TAG_COMMENT = re.compile(r"uses: ([^@\s]+)@([0-9a-f]{40}) # (v\d+\.\d+\.\d+)$")
FLOWS = sorted(WORKFLOWS.glob("*.yml"))


def _jobs() -> list[tuple[str, str, dict]]:
    return [(p.name, name, job) for p in FLOWS for name, job in yaml.safe_load(p.read_text())["jobs"].items()]


def _steps_using(prefix: str) -> list[dict]:
    return [s for _, _, job in _jobs() for s in job.get("steps", []) if str(s.get("uses", "")).startswith(prefix)]


def test_every_action_is_pinned_to_a_commit_with_its_release_in_a_comment():
    """A tag can be moved to other code; a commit cannot. The release it was cut from is kept
    beside it (read from the action's repository: `git rev-parse vX.Y.Z^{commit}`)."""
    uses = [s["uses"] for _, _, job in _jobs() for s in job.get("steps", []) if "uses" in s]
    assert uses and [u for u in uses if not SHA_PIN.fullmatch(u)] == []
    lines = [line.strip() for p in FLOWS for line in p.read_text().splitlines() if line.strip().startswith("- uses: ")]
    assert len(lines) == len(uses) and all(TAG_COMMENT.search(line) for line in lines), lines
    # One action, one commit: a second pin of the same action would be a second version of it.
    commits = {m.group(1): set() for m in map(TAG_COMMENT.search, lines) if m}
    for m in map(TAG_COMMENT.search, lines):
        commits[m.group(1)].add((m.group(2), m.group(3)))
    assert all(len(pins) == 1 for pins in commits.values()), commits


def test_no_checkout_leaves_the_token_in_the_work_tree():
    checkouts = _steps_using("actions/checkout@")
    assert len(checkouts) == 3 and all(s["with"]["persist-credentials"] is False for s in checkouts)


def test_no_token_permission_beyond_what_each_job_uses():
    for p in FLOWS:
        assert yaml.safe_load(p.read_text())["permissions"] == {}, p.name
    granted = {(f, name): job.get("permissions") for f, name, job in _jobs()}
    assert granted == {
        ("nightly.yml", "qualify"): {"contents": "read", "checks": "write"},
        ("qualify.yml", "plan"): {"contents": "read"},
        ("qualify.yml", "run"): {"contents": "read"},
        ("qualify.yml", "merge"): {"contents": "read", "checks": "write"},  # the JUnit check run
    }
    # What the caller grants bounds the called workflow's jobs: it grants their union.
    (caller,) = [perms for (f, _), perms in granted.items() if f == "nightly.yml"]
    called = [perms for (f, _), perms in granted.items() if f == "qualify.yml"]
    union: dict[str, str] = {}
    for perms in called:
        for scope, level in perms.items():
            union[scope] = "write" if "write" in (level, union.get(scope)) else level
    assert caller == union


def test_no_secret_is_inherited():
    assert [name for f, name, job in _jobs() if job.get("secrets") == "inherit"] == []
    assert "secrets: inherit" not in "".join(p.read_text() for p in FLOWS)


def test_a_gpu_slice_has_a_concurrency_group_of_its_platform_and_shard_and_is_never_cancelled():
    """Across workflow runs (the nightly and a dispatch), one job per platform slice at a time: a
    second run's slice waits; it never cancels the one holding the GPUs."""
    run = yaml.safe_load(WORKFLOW.read_text())["jobs"]["run"]
    assert run["concurrency"] == {"group": "regbench-gpu-${{ matrix.platform }}-shard-${{ matrix.shard }}",
                                  "cancel-in-progress": False}
    # The group's keys are those of the plan's matrix entries.
    config = load_config(ROOT / "configs" / "h200.yaml")
    entries = json.loads(github_matrix(config, expand(config), 2))["include"]
    groups = {f"regbench-gpu-{e['platform']}-shard-{e['shard']}" for e in entries}
    assert len(groups) == len(entries) == 2


DOCKER = re.compile(r"(^|[\s;|&(])(docker\s|\.venv/bin/regbench (run|clean)\s|\.venv/bin/regbench plan .*--format pins)", re.M)


def test_every_job_that_talks_to_docker_has_a_client_config_of_its_own():
    """Jobs of several runners on one host share ~/.docker/config.json: one job's `docker logout`
    there would drop another's login before its pulls. Each such job points DOCKER_CONFIG at its
    runner's temp folder, before its first Docker step."""
    using = []
    for f, name, job in _jobs():
        steps = job.get("steps", [])
        first = next((i for i, s in enumerate(steps) if DOCKER.search(s.get("run", ""))), None)
        if first is None:
            continue
        using.append((f, name))
        sets = [i for i, s in enumerate(steps)
                if 'echo "DOCKER_CONFIG=$RUNNER_TEMP/docker-config" >> "$GITHUB_ENV"' in s.get("run", "")]
        assert sets and sets[0] < first, (f, name)
        assert 'mkdir -p "$RUNNER_TEMP/docker-config"' in steps[sets[0]]["run"]
        assert "DOCKER_CONFIG" not in job.get("env", {})  # runner.temp is not there at job level
    assert using == [("qualify.yml", "plan"), ("qualify.yml", "run")]
    assert DOCKER.search("x\ndocker login -u u") and not DOCKER.search(".venv/bin/regbench plan c")
    assert DOCKER.search('p=$(.venv/bin/regbench plan "$CONFIG" --format pins)')


def _step_index(steps: list[dict], text: str) -> int:
    (i,) = [i for i, s in enumerate(steps) if text in s.get("run", "")]
    return i


def _pins_and_slice_scripts() -> tuple[str, str]:
    """The plan job's pins step and the slice step, once checked that they are wired together."""
    flow = yaml.safe_load(WORKFLOW.read_text())
    plan, run = flow["jobs"]["plan"], flow["jobs"]["run"]
    assert plan["outputs"]["pins"] == "${{ steps.pins.outputs.pins }}"
    assert {k: plan["env"][k] for k in ("REGISTRY", "REGISTRY_USERNAME")} == \
        {k: run["env"][k] for k in ("REGISTRY", "REGISTRY_USERNAME")}
    steps = plan["steps"]
    (pins,) = [s for s in steps if s.get("id") == "pins"]
    assert '.venv/bin/regbench plan "$CONFIG" "${args[@]}" --format pins' in pins["run"]
    assert 'for pair in $IMAGES; do args+=(--image "$pair"); done' in pins["run"]
    config_dir = _step_index(steps, 'echo "DOCKER_CONFIG=$RUNNER_TEMP/docker-config" >> "$GITHUB_ENV"')
    login = _step_index(steps, "docker login")
    logout = _step_index(steps, "docker logout")
    assert config_dir < login < steps.index(pins) < logout
    # The plan job logs in and out as the slice job does, with the same secret on stdin.
    for i, j in ((login, _step_index(run["steps"], "docker login")), (logout, _step_index(run["steps"], "docker logout"))):
        assert {k: steps[i].get(k) for k in ("if", "env", "run")} == {k: run["steps"][j].get(k) for k in ("if", "env", "run")}
    assert steps[login]["env"] == {"REGISTRY_PASSWORD": "${{ secrets.REGISTRY_PASSWORD }}"}
    # The slice: the pins through the environment, after the inputs' tags.
    (slice_,) = [s for s in run["steps"] if "regbench run" in s.get("run", "")]
    assert slice_["env"]["PINS"] == "${{ needs.plan.outputs.pins }}"
    assert slice_["env"]["PIN_COUNT"] == "${{ needs.plan.outputs.pin_count }}"
    assert plan["outputs"]["pin_count"] == "${{ steps.pins.outputs.count }}"
    return pins["run"], slice_["run"]


def test_every_slice_runs_the_builds_the_plan_job_resolved_once():
    """Slices started hours apart would each resolve a moving tag themselves and could run two
    builds, which `regbench merge` refuses. The plan job, logged in to the registry as a slice
    job is, resolves every tag once (`regbench plan --format pins`) and each slice passes those
    pins as --image after the workflow's own image input, so that the pins win."""
    _pins_and_slice_scripts()


# A stand-in for the venv's regbench: `plan --format pins` prints $PLANNED (the shape of
# bench/commands/plan.py's line), anything else records its arguments, one a line, in $ARGV.
STUB = """#!/bin/sh
case "$*" in *"--format pins"*) echo "$PLANNED"; exit 0;; esac
printf '%s\\n' "$@" > "$ARGV"
"""


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # As GitHub runs a `run:` step on Linux: bash -e.
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=30)


def test_the_slices_get_the_plan_jobs_pins_and_refuse_to_start_without_them(tmp_path):
    """The pins step's output, through the job outputs, into the slice step: `regbench run` gets
    each pin as the last --image of its name, so it runs that build whatever the image input
    said. An output GitHub dropped (it held a secret's value) stops the slice, loudly."""
    pins_script, slice_script = _pins_and_slice_scripts()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    stub = tmp_path / ".venv" / "bin" / "regbench"
    stub.write_text(STUB)
    stub.chmod(0o755)
    digest = "sha256:" + "a" * 64
    planned = f"v0.18.2=vllm/vllm-openai@{digest} cu130-nightly=vllm/vllm-openai@{digest}"
    images = "cu130-nightly=vllm/vllm-openai:cu130-nightly"
    output = tmp_path / "output"
    done = _bash(pins_script, tmp_path, {"CONFIG": "configs/h200.yaml", "IMAGES": images, "PLANNED": planned,
                                         "GITHUB_OUTPUT": str(output)})
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert outputs == {"pins": planned, "count": "2"}
    argv = tmp_path / "argv"
    env = {"CONFIG": "configs/h200.yaml", "IMAGES": images, "PLATFORM": "h200", "SHARD": "1/1", "RUN_ID": "r",
           "ARGV": str(argv)}
    done = _bash(slice_script, tmp_path, {**env, "PINS": outputs["pins"], "PIN_COUNT": outputs["count"]})
    assert done.returncode == 0, done.stderr
    from bench.cli import parser

    args = parser().parse_args(argv.read_text().splitlines())
    assert args.image == [images, *planned.split()]
    refs = {i.name: i.ref for i in with_image_refs(load_config(ROOT / "configs" / "h200.yaml"), args.image).images}
    assert refs == {"v0.18.2": f"vllm/vllm-openai@{digest}", "cu130-nightly": f"vllm/vllm-openai@{digest}",
                    "v0.23.1rc1-nightly": "vllm/vllm-openai:v0.23.1rc1"}
    # A matrix of digests only: no pins, and the slice starts.
    argv.unlink()
    assert _bash(slice_script, tmp_path, {**env, "PINS": "", "PIN_COUNT": "0"}).returncode == 0 and argv.exists()
    # GitHub skipped the output: `needs.plan.outputs.pins` reads empty, the count does not.
    argv.unlink()
    done = _bash(slice_script, tmp_path, {**env, "PINS": "", "PIN_COUNT": "2"})
    assert done.returncode == 2 and "pins did not arrive (0 of 2)" in done.stdout and not argv.exists()


ZIZMOR = ROOT / ".venv" / "bin" / "zizmor"


needs_zizmor = needs(ZIZMOR, "zizmor in .venv (the test extra)")


def _zizmor(path: Path) -> subprocess.CompletedProcess:
    # Offline: the audits that ask GitHub's API are left out (no token, no network). Strict: a
    # workflow zizmor cannot read is an error, not a file it skips with a warning.
    return subprocess.run([str(ZIZMOR), "--offline", "--strict-collection", "--no-progress", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120)


@needs_zizmor
def test_zizmor_finds_nothing_in_the_workflows():
    out = _zizmor(WORKFLOWS)
    assert (out.returncode, json.loads(out.stdout)) == (0, []), out.stdout + out.stderr


@needs_zizmor
def test_zizmor_does_report_an_unpinned_action_and_an_unreadable_workflow(tmp_path):
    pinned = "actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0"
    assert pinned in WORKFLOW.read_text()
    (tmp_path / "flow.yml").write_text(WORKFLOW.read_text().replace(pinned, "actions/checkout@v4", 1))
    out = _zizmor(tmp_path / "flow.yml")
    assert out.returncode != 0 and "unpinned-uses" in {f["ident"] for f in json.loads(out.stdout)}
    (tmp_path / "flow.yml").write_text(WORKFLOW.read_text().replace("runs-on:", "runs-onn:", 1))
    out = _zizmor(tmp_path / "flow.yml")
    assert out.returncode != 0 and "flow.yml" in out.stderr
