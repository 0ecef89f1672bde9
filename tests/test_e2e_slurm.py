"""The Slurm executor on a real Slurm: munge, slurmctld and two slurmd nodes (n1 with two fake
GPUs, n2 with one), started on this machine by scripts/slurm.sh for this module and stopped after
it; the local launcher and the tiny canary inside the jobs, or, for containers, the docker launcher
on the stand-in GPU engine (tests/gpu_docker.py) up to the server's container.

Slow tier: the smoke matrix's two streamer cells as two jobs (two servers at once, one per node),
two jobs on one node whose containers get disjoint GPUs, a run interrupted while its jobs run, and
a node set down under a job (NODE_FAIL, then --resume). The full tier (scripts/test.sh --full)
adds the same recovery through other doors, each a few minutes of mostly waiting on Slurm: a job
over its time limit (TIMEOUT, the finished repeat kept) and a job Slurm requeues by itself.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import slurm as executor
from bench.core.matrix import expand
from bench.core.records import RunRecord, Summary
from bench.slurm import SlurmJob, SlurmOptions
from bench.store.matrixfile import load_config

from .gpu_docker import IMAGE, StandinEngine, available
from .support import ROOT, one_cell_config, setup_missing, wait_until

pytestmark = pytest.mark.slow
STREAMER_BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    munged_before = munged()
    up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm.sh"), "up", str(folder)], capture_output=True, text=True)
    assert up.returncode == 0, up.stdout + up.stderr
    env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"))
    yield env
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm.sh"), "down", str(folder)], capture_output=True)
    # Nothing the tests start may outlive them: munged too, unless it ran before them.
    assert munged() in ([], munged_before), f"munged still running: {munged()}"


def munged() -> list[str]:
    return subprocess.run(["pgrep", "-x", "munged"], capture_output=True, text=True).stdout.split()


def squeue(env: dict, run_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", f"regbench-{run_id}", "-o", "%i %T %N"], capture_output=True,
                         text=True, env=env, check=True)
    return out.stdout.split("\n")[:-1]


def bench(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_smoke_matrix_as_slurm_jobs_gives_the_local_verdicts_on_both_nodes(slurm, tmp_path):
    # The smoke matrix's streamer cells, the failing one and its fixed twin, one fresh start each:
    # a job per cell, one on each node (the local smoke run, tests/test_e2e_vllm.py, runs all four).
    # An --image override (the local launcher records the reference and runs the image's venv):
    # the jobs must run the matrix as the submitting command resolved it, not the file again.
    # Two CPUs per job: one job per node, as many servers at once as this machine's two cores carry
    # (n1's two GPUs would let a second job onto it).
    config = one_cell_config(tmp_path, repeats=1, include=[{"load_format": "runai_streamer"}])
    p = bench("run", str(config), "--executor", "slurm", "--gpus-per-job", "1", "--cpus-per-job", "2",
              "--results", str(tmp_path), "--run-id", "slurm-smoke",
              "--image", "streamer-0.16.0=regbench.test/vllm:0.16.0", env=slurm)
    output, _ = p.communicate(timeout=1800)
    assert p.returncode == 1, output  # the streamer bug's cell fails, as in a local run
    run_dir = tmp_path / "slurm-smoke"
    slices = tmp_path / ".slurm-slurm-smoke" / "slices"
    ran = [yaml.safe_load(f.read_text()) for f in sorted(slices.glob("*/slurm-smoke/config.yaml"))]
    assert len(ran) == 2
    assert all({i["name"]: i["ref"] for i in c["images"]}["streamer-0.16.0"] == "regbench.test/vllm:0.16.0" for c in ran)
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    assert set(cells) == {STREAMER_BUG, STREAMER_BUG.replace("0.16.0", "0.17.0")}
    assert (cells[STREAMER_BUG].verdict, cells[STREAMER_BUG].runs) == ("fail", 1)
    assert {"empty_text", "weights_lost"} <= set(cells[STREAMER_BUG].reasons), cells[STREAMER_BUG].reasons
    assert all((c.verdict, c.runs) == ("pass", 1) for i, c in cells.items() if i != STREAMER_BUG), cells
    jobs = [SlurmJob.model_validate_json(x) for x in (run_dir / "slurm.jsonl").read_text().splitlines()]
    assert len(jobs) == 2 and all(j.state == "COMPLETED" and j.exit_code == "0:0" for j in jobs), jobs
    assert {j.node for j in jobs} == {"n1", "n2"}
    # Each job got one of its node's GPUs from Slurm (their indices on the node: n1 0 and 1, n2 0),
    # and the bench left it as Slurm set it.
    assert all(j.cuda_visible_devices in {"n1": {"0", "1"}, "n2": {"0"}}[j.node] for j in jobs), jobs
    # Jobs on both nodes at once: two servers' lives overlap.
    runs = [RunRecord.model_validate_json(x) for x in (run_dir / "runs.jsonl").read_text().splitlines()]
    spans = sorted((r.server.started_at, r.server.ended_at) for r in runs)
    assert any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans)), "never two servers at once"
    assert squeue(slurm, "slurm-smoke") == []
    assert "Performance" in (run_dir / "summary.md").read_text()


GPU_JOB = ROOT / "tests" / "slurm_gpu_job.py"


def gpu_matrix(tmp_path: Path) -> Path:
    """Two cells of one GPU each (tensor_parallel_size 1) in containers of the stand-in image, on
    an h200 profile whose jobs go to n1."""
    model = tmp_path / "model"
    model.mkdir()
    profile = yaml.safe_load((ROOT / "bench" / "profiles" / "h200.yaml").read_text())
    # This sandbox refuses to raise the memlock/stack ulimits (runc: "error setting rlimits"), as
    # in tests/test_gpu_standin.py; GPU hosts allow them.
    del profile["docker"]["ulimits"]
    profile["slurm"] = {"sbatch_args": ["--nodelist=n1"], "time_limit": "5"}
    (tmp_path / "platforms").mkdir()
    (tmp_path / "platforms" / "h200.yaml").write_text(yaml.safe_dump(profile))
    data = {
        "name": "gpu", "launcher": "docker", "platforms": ["h200"],
        "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer"}],
        "images": [{"name": "img", "ref": IMAGE, "pull": "never"}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }
    f = tmp_path / "gpu.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_two_jobs_on_one_node_give_their_containers_disjoint_gpus(slurm, tmp_path, monkeypatch):
    # The executor as `regbench run --executor slurm` drives it (pinning, sbatch with --gres from
    # the cell, following, merging); in each job the bench's own batch script, its python replaced
    # by tests/slurm_gpu_job.py, which goes as far as the server's container and no vLLM boot.
    why_not = available()
    if why_not is not None:
        setup_missing(f"stand-in GPU engine: {why_not}")
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/bin/sh\nexec {sys.executable} {GPU_JOB} "$@"\n')
    stand_in.chmod(0o755)
    script = executor.job_script
    monkeypatch.setattr(executor, "job_script", lambda *a, **k: script(*a, **k, python=str(stand_in)))
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    engine = StandinEngine()
    try:
        engine.start()
        # The executor pins the image there, and every job's launcher finds the engine there.
        monkeypatch.setenv("DOCKER_HOST", engine.url)
        config = load_config(gpu_matrix(tmp_path))
        said: list[str] = []
        run = executor.start(config, expand(config), "gpus", tmp_path / "r", SlurmOptions(), said.append)
        left = engine.client.containers.list(all=True)
        specs = [json.loads(p.read_text()) for p in engine.records.glob("*.config.json")]
    finally:
        engine.stop()
    jobs = jobs_of(run.results.path)
    outputs = "\n".join(f"{j.job_id}: " + Path(j.slice_dir, f"slurm-{j.job_id}.out").read_text() for j in jobs)
    assert run.incomplete == [] and squeue(slurm, "gpus") == [], said
    assert len(jobs) == 2 and all(j.node == "n1" for j in jobs), jobs
    assert left == [], "the launcher left containers"
    seen = [json.loads(Path(j.slice_dir, "seen.json").read_text()) for j in jobs if Path(j.slice_dir, "seen.json").exists()]
    assert len(seen) == 2, outputs
    # They ran at once: each took its devices only once both had started.
    assert all(sorted(s["started"]) == sorted(j.job_id for j in jobs) for s in seen), seen
    given = []
    for s in seen:
        gpus = s["slurm_job_gpus"].split(",") if s["slurm_job_gpus"] else []
        assert gpus and s["devices_arg"] == s["slurm_job_gpus"], s
        assert s["device_ids"] == gpus, s
        # The container was created with a device request of exactly the job's GPUs, and the
        # engine's NVIDIA driver put those ids, not "all", into its environment.
        assert "exited with code 0 during boot" in s["boot"], s
        assert s["container_nvidia_visible_devices"] not in (None, "", "all"), s
        assert sorted(s["container_nvidia_visible_devices"].split(",")) == sorted(gpus), s
        given.append(set(gpus))
    assert not given[0] & given[1] and given[0] | given[1] <= {"0", "1"}, seen
    # The NVIDIA hook ran for both containers, with those environments.
    hooked = {e.split("=", 1)[1] for s in specs for e in s["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")}
    assert hooked == {s["container_nvidia_visible_devices"] for s in seen}, hooked
    assert {j.cuda_visible_devices for j in jobs} == {s["cuda_visible_devices"] for s in seen}


def test_ctrl_c_on_the_bench_cancels_its_jobs_and_resume_completes_the_run(slurm, tmp_path):
    cells = [{"load_format": "safetensors", "image": "streamer-0.17.0"},
             {"load_format": "runai_streamer", "image": "streamer-0.17.0"}]
    p = bench("run", str(one_cell_config(tmp_path, repeats=1, include=cells)), "--executor", "slurm",
              "--gpus-per-job", "1", "--results", str(tmp_path / "r"), "--run-id", "slurm-stop", env=slurm)
    wait_until(lambda: sum(" RUNNING " in f" {line} " for line in squeue(slurm, "slurm-stop")) >= 1, 120,
               "a job running")
    os.killpg(p.pid, signal.SIGINT)
    output, _ = p.communicate(timeout=300)
    assert p.returncode == 130, output
    assert squeue(slurm, "slurm-stop") == [], "jobs left queued or running"
    assert "cancelling" in output
    run_dir = tmp_path / "r" / "slurm-stop"
    jobs = jobs_of(run_dir)
    assert len(jobs) == 2 and {j.state for j in jobs} == {"CANCELLED"}, jobs
    assert "**CANCELLED**" in (run_dir / "summary.md").read_text()
    p = bench("run", "--resume", str(run_dir), "--executor", "slurm", env=slurm)
    output, _ = p.communicate(timeout=900)
    assert p.returncode == 0, output
    assert [(j.state, j.attempt) for j in jobs_of(run_dir)] == [("COMPLETED", 2)] * 2
    summary = Summary.model_validate_json((run_dir / "summary.json").read_text())
    assert [(c.verdict, c.runs) for c in summary.cells] == [("pass", 1)] * 2
    assert squeue(slurm, "slurm-stop") == []


def one_cell(tmp_path: Path) -> Path:
    return one_cell_config(tmp_path, repeats=2)


def jobs_of(run_dir: Path) -> list[SlurmJob]:
    return [SlurmJob.model_validate_json(x) for x in (run_dir / "slurm.jsonl").read_text().splitlines()]


def job_bench(slices: Path) -> int | None:
    """The pid of the bench a job runs into a slice under `slices`, if one runs."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"bench" in argv and b"--cell" in argv and any(str(slices).encode() in a for a in argv):
            return int(entry.name)
    return None


@pytest.mark.full
def test_a_job_over_its_time_limit_shows_as_such_and_resume_completes_its_cell(slurm, tmp_path):
    # The limit comes from the platform profile's slurm block; the resume's --time-limit overrides
    # it. So that the job is over its limit on a machine of any speed, its bench is held (SIGSTOP)
    # once its first repeat is recorded: a run that takes longer than the job was given. Slurm
    # continues and signals it at the limit, as it does a job's every process.
    profile = yaml.safe_load((ROOT / "bench" / "profiles" / "cpu.yaml").read_text())
    (tmp_path / "platforms").mkdir()
    (tmp_path / "platforms" / "cpu.yaml").write_text(yaml.safe_dump({**profile, "slurm": {"time_limit": "2"}}))
    p = bench("run", str(one_cell(tmp_path)), "--executor", "slurm", "--results",
              str(tmp_path / "r"), "--run-id", "limit", env=slurm)
    slices = tmp_path / "r" / ".slurm-limit" / "slices"

    def first_repeat_recorded() -> bool:
        return any(line and not RunRecord.model_validate_json(line).interrupted
                   for f in slices.glob("*/limit/runs.jsonl") for line in f.read_text().splitlines())

    wait_until(first_repeat_recorded, 300, "the job's first repeat recorded")
    pid = job_bench(slices)
    assert pid is not None, "the job's bench is not running"
    os.kill(pid, signal.SIGSTOP)
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 1, output
    run_dir = tmp_path / "r" / "limit"
    [job] = jobs_of(run_dir)
    assert job.state == "TIMEOUT" and job.attempt == 1, job
    assert "**TIMEOUT**" in (run_dir / "summary.md").read_text()
    assert "--resume" in output and squeue(slurm, "limit") == []
    before = [r for r in map(RunRecord.model_validate_json, (run_dir / "runs.jsonl").read_text().splitlines())
              if not r.interrupted]
    assert [r.repeat for r in before] == [1]
    p = bench("run", "--resume", str(run_dir), "--executor", "slurm", "--time-limit", "10", env=slurm)
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 0, output
    [job] = jobs_of(run_dir)
    assert (job.state, job.attempt) == ("COMPLETED", 2)
    runs = [RunRecord.model_validate_json(x) for x in (run_dir / "runs.jsonl").read_text().splitlines()]
    done = [r for r in runs if not r.interrupted]
    assert sorted(r.repeat for r in done) == [1, 2]
    # The repeat that finished before the limit was kept, not run again.
    assert {(r.repeat, r.server.started_at) for r in before} <= {(r.repeat, r.server.started_at) for r in done}
    cells = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    assert [(c.verdict, c.runs) for c in cells] == [("pass", 2)]


def node_down_mid_run(slurm: dict, p: subprocess.Popen, results: Path, run_id: str,
                     timeout: float) -> tuple[str, str]:
    """Sets the node of run ``run_id``'s job down once the bench in it has started its slice, and
    waits for the bench ``p`` to end; returns its output and the node. The node is back in service
    after, whatever happened."""
    running: list[str] = []

    def on_a_node() -> bool:
        running[:] = [line for line in squeue(slurm, run_id) if " RUNNING " in f" {line} "]
        return bool(running)

    wait_until(on_a_node, 120, "the job running")
    node = running[0].split()[2]
    wait_until(lambda: any((results / f".slurm-{run_id}" / "slices").glob(f"*/{run_id}/preflight.jsonl")), 120,
               "the job's bench started")
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=regbench-test"], env=slurm,
                   check=True)
    try:
        output, _ = p.communicate(timeout=timeout)
    finally:
        # ReturnToService=2 may have done it already, once its slurmd answered.
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=slurm)
    return output, node


def test_a_node_set_down_mid_run_shows_as_such_and_resume_completes_its_cell(slurm, tmp_path):
    p = bench("run", str(one_cell_config(tmp_path)), "--executor", "slurm", "--sbatch-arg=--no-requeue", "--results",
              str(tmp_path / "r"), "--run-id", "down", env=slurm)
    output, node = node_down_mid_run(slurm, p, tmp_path / "r", "down", timeout=600)
    assert p.returncode == 1, output
    run_dir = tmp_path / "r" / "down"
    [job] = jobs_of(run_dir)
    assert job.state == "NODE_FAIL" and job.node == node, job
    assert "**NODE_FAIL**" in (run_dir / "summary.md").read_text()
    assert squeue(slurm, "down") == []
    p = bench("run", "--resume", str(run_dir), "--executor", "slurm", env=slurm)
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 0, output
    [job] = jobs_of(run_dir)
    assert (job.state, job.attempt) == ("COMPLETED", 2)
    cells = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    assert [(c.verdict, c.runs) for c in cells] == [("pass", 1)]


@pytest.mark.full
def test_a_job_slurm_requeues_after_its_node_went_down_completes_its_cell_by_itself(slurm, tmp_path):
    # Slurm's own recovery (requeue is on by default): the same job runs again, later, and its
    # bench continues the slice; no --resume needed, and the job records that it was requeued.
    p = bench("run", str(one_cell_config(tmp_path, repeats=1)), "--executor", "slurm", "--results",
              str(tmp_path / "r"), "--run-id", "requeue", env=slurm)
    output, _ = node_down_mid_run(slurm, p, tmp_path / "r", "requeue", timeout=900)
    assert p.returncode == 0, output
    assert "requeued by Slurm" in output
    run_dir = tmp_path / "r" / "requeue"
    [job] = jobs_of(run_dir)
    assert (job.state, job.attempt, job.restarts) == ("COMPLETED", 1, 1), job
    cells = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    assert [(c.verdict, c.runs) for c in cells] == [("pass", 1)]
    assert f"| {job.job_id} | 1 | 1 |" in (run_dir / "summary.md").read_text()
    assert squeue(slurm, "requeue") == []
