"""The Slurm executor's pieces without a cluster: the batch script, sbatch's arguments, and
reading scontrol's one-line job records. The real cluster: tests/test_e2e_slurm.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.core.matrix import expand
from bench.slurm import SlurmJob, SlurmOptions, job_script, parse_scontrol, sbatch_args
from bench.store.matrixfile import load_config

from .support import SMOKE, needs_canary

SCONTROL = ("JobId=42 JobName=regbench-r1 UserId=root(0) GroupId=root(0) Priority=1 Account=(null) "
            "JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:15 "
            "RunTime=00:01:00 TimeLimit=00:01:00 NodeList=n2 BatchHost=n2 NumNodes=1 Comment=r1")


def cells():
    return expand(load_config(SMOKE))


def test_scontrol_records_are_read_by_key():
    fields = parse_scontrol(SCONTROL)
    assert (fields["JobState"], fields["Reason"], fields["ExitCode"], fields["NodeList"]) == \
        ("TIMEOUT", "TimeLimit", "0:15", "n2")


@needs_canary
def test_the_batch_script_runs_one_cell_into_its_slice_and_keeps_slurms_devices(tmp_path):
    cell = cells()[1]
    script = job_script(cell, Path("/shared/m.yaml"), "r1", tmp_path / "slices" / "001", python="/venv/bin/python")
    assert f"--cell {cell.id} --run-id r1" in script and "--devices none" in script
    assert "cuda_visible_devices=${CUDA_VISIBLE_DEVICES:-}" in script
    # A failing cell is a job that did its work; the bench not running is a failed job.
    for rc, job_rc in ((0, 0), (1, 0), (2, 2), (130, 130)):
        tail = script.split("\n", 2)[2].replace("/venv/bin/python -m bench", f"(exit {rc}) #")
        assert subprocess.run(["bash", "-c", tail], capture_output=True).returncode == job_rc


@needs_canary
def test_sbatch_arguments_name_the_run_and_ask_for_the_cells_gpus(tmp_path):
    cell = cells()[0]
    args = sbatch_args(cell, "r1", tmp_path, SlurmOptions(partition="gpu", time_limit="30", extra=["--qos=high"]), True)
    assert "--job-name=regbench-r1" in args and "--comment=r1" in args
    assert f"--gres=gpu:{cell.model.tensor_parallel_size}" in args
    assert "--partition=gpu" in args and "--time=30" in args and args[-1] == "--qos=high"
    assert not [a for a in sbatch_args(cell, "r1", tmp_path, SlurmOptions(), False) if a.startswith("--gres")]
    assert "--gres=gpu:2" in sbatch_args(cell, "r1", tmp_path, SlurmOptions(gpus_per_job=2), False)


def test_a_job_is_done_once_slurm_says_it_is_over():
    job = SlurmJob(cell_id="c", job_id="1", slice_dir="/x", submitted_at=0.0)
    assert not job.done
    assert all(job.model_copy(update={"state": s}).done for s in ("COMPLETED", "TIMEOUT", "NODE_FAIL", "CANCELLED"))


def test_a_resubmitted_cells_attempts_share_one_slice_and_it_is_merged_once(tmp_path):
    from bench.slurm import collect

    from . import synth

    # Attempt 1 hit its time limit after one repeat; attempt 2 continued the same slice.
    results = synth.healthy(tmp_path / "slices" / "000", "r1", repeats=2)
    first = SlurmJob(cell_id="m__safetensors__cpu__img", job_id="1", slice_dir=str(tmp_path / "slices" / "000"),
                     submitted_at=0.0, state="TIMEOUT")
    second = first.model_copy(update={"job_id": "2", "attempt": 2, "state": "COMPLETED"})
    merged = collect([first, second], "r1", tmp_path / "out", results.config())
    assert [j.job_id for j in merged.jobs()] == ["1", "2"]
    assert len(merged.runs()) == len(results.runs()) == 4


def test_the_reports_show_every_job_and_flag_the_ones_that_did_not_complete(tmp_path):
    from bench.slurm import collect
    from bench.store.publish import regenerate

    from . import synth

    done = synth.healthy(tmp_path / "slices" / "000", "r1", repeats=1)
    jobs = [SlurmJob(cell_id="m__safetensors__cpu__img", job_id="7", slice_dir=str(tmp_path / "slices" / "000"),
                     submitted_at=0.0, state="COMPLETED", node="n1", exit_code="0:0", cuda_visible_devices="0",
                     restarts=1),
            SlurmJob(cell_id="m__runai_streamer__cpu__img", job_id="8", slice_dir=str(tmp_path / "slices" / "001"),
                     submitted_at=0.0, state="TIMEOUT", node="n2", reason="TimeLimit", exit_code="0:15")]
    merged = collect(jobs, "r1", tmp_path / "out", done.config())
    regenerate(merged.path)
    md = (merged.path / "summary.md").read_text()
    assert "| `m__safetensors__cpu__img` | 7 | 1 | 1 | n1 | COMPLETED |" in md
    assert "| `m__runai_streamer__cpu__img` | 8 | 1 | 0 | n2 | **TIMEOUT** | TimeLimit | 0:15 |" in md
    html = (merged.path / "report.html").read_text()
    assert "1 of 2 job(s) did not complete" in html
    row = html[html.index('<tr class="r-fail">'):]
    assert "m__runai_streamer__cpu__img" in row[:row.index("</tr>")] and "<strong>TIMEOUT</strong>" in row


@needs_canary
def test_a_platform_profiles_slurm_block_gives_the_defaults_and_flags_win():
    import pytest
    from pydantic import ValidationError

    from bench.core.config import Platform

    lab = Platform.model_validate({"name": "lab", "slurm": {"partition": "h200", "account": "qa", "time_limit": "2:00:00",
                                                            "mem": "64G", "sbatch_args": ["--qos=release"]}})
    cell = cells()[0]
    args = sbatch_args(cell, "r1", Path("/s"), SlurmOptions(time_limit="30", extra=["--qos=high"]).over(lab.slurm), True)
    assert {"--partition=h200", "--account=qa", "--time=30", "--mem=64G"} <= set(args)
    assert args.index("--qos=release") < args.index("--qos=high")  # sbatch takes the later one
    assert "--partition=x" in sbatch_args(cell, "r1", Path("/s"), SlurmOptions(partition="x").over(lab.slurm), True)
    with pytest.raises(ValidationError, match="partiton"):
        Platform.model_validate({"name": "lab", "slurm": {"partiton": "h200"}})


def _fake_slurm(tmp_path):
    """sbatch keeping each job's script and answering a job id; scontrol saying it completed."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/bash\nn=$(ls {scripts} | wc -l)\ncat > {scripts}/job-$((n + 1)).sh\n'
                                 'echo $((n + 1))\n')
    (fake / "scontrol").write_text('#!/bin/bash\necho "JobId=$4 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n1"\n')
    (fake / "squeue").write_text("#!/bin/bash\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    return dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}"), scripts


@needs_canary
def test_container_images_are_pinned_once_at_submission_for_every_job(tmp_path):
    """Under Slurm each job is a bench of its own: the images are pinned when the run is
    submitted (here: to the local image's id, which the engine reports), so a tag that moves
    between two jobs' starts cannot split the run between builds."""
    import shlex
    import sys

    import docker

    from .support import ROOT, setup_missing

    try:  # the engine reports the ids the images are pinned to
        engine = docker.from_env(timeout=30)
    except docker.errors.DockerException as exc:
        setup_missing(f"no Docker engine answers (scripts/setup-docker.sh): {exc}")
    env, scripts = _fake_slurm(tmp_path)
    config = ROOT / "configs" / "cpu-smoke-docker.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(config), "--executor", "slurm", "--results", str(tmp_path / "r"),
         "--run-id", "r1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "submitted job" in done.stderr, done.stdout + done.stderr
    want = {i.name: engine.images.get(i.ref).id for i in load_config(config).images}
    for script in scripts.iterdir():
        line = next(shlex.split(x) for x in script.read_text().splitlines() if "--run-id" in x)
        ran = load_config(Path(line[line.index("run") + 1]))
        assert {i.name: i.ref for i in ran.images} == want
        assert {i.pull for i in ran.images} == {"if-missing"}
    assert "pinned to sha256:" in done.stderr


@needs_canary
def test_jobs_run_the_matrix_the_submitting_command_resolved_image_overrides_included(tmp_path):
    """`run --image` under Slurm: each job's script runs a config file holding the overridden
    reference, written once into the run's state folder, and never the matrix file given."""
    import shlex
    import sys

    from .support import ROOT

    env, scripts = _fake_slurm(tmp_path)
    cell = next(c for c in cells() if c.image.name == "streamer-0.16.0")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(SMOKE), "--executor", "slurm", "--cell", cell.id,
         "--image", "streamer-0.16.0=registry.example/vllm:0.16.0", "--results", str(tmp_path / "r"), "--run-id", "r1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "submitted job 1" in done.stderr, done.stdout + done.stderr
    (script,) = [p.read_text() for p in scripts.iterdir()]
    assert str(SMOKE) not in script
    fresh = next(shlex.split(line) for line in script.splitlines() if "--run-id" in line)
    ran = Path(fresh[fresh.index("run") + 1])
    assert ran == tmp_path / "r" / ".slurm-r1" / "config.yaml"
    refs = {i.name: i.ref for i in load_config(ran).images}
    assert refs == {"streamer-0.16.0": "registry.example/vllm:0.16.0", "streamer-0.17.0": None}
    # The cell the job runs is the one submitted, in the file it is given.
    assert cell.id in [c.id for c in expand(load_config(ran))]


@needs_canary
def test_a_submitting_host_without_an_engine_says_how_to_pin_every_job_to_one_build(monkeypatch):
    """Each job then resolves its images itself: a tag that moves between two jobs' starts gives
    two builds, which the merge at the end refuses; the submitter is told before any job."""
    import bench.slurm
    from bench.serve.launch_docker import DockerUnavailable

    from .support import ROOT

    def no_engine(config, run_id):
        raise DockerUnavailable("no Docker engine answers")

    monkeypatch.setattr(bench.slurm, "open_launcher", no_engine)
    config = load_config(ROOT / "configs" / "cpu-smoke-docker.yaml")
    said: list[str] = []
    assert bench.slurm.pin_for_jobs(config, expand(config), "r1", said.append) is config
    [line] = said
    assert "images not pinned at submission (no Docker engine answers)" in line
    assert "--image NAME=REPO@sha256:" in line and "regbench plan CONFIG --format pins" in line
