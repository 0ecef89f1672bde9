"""Slurm's GPUs reach the containers: a job's bench takes the job's GPUs as its devices under
`launcher: docker` (the engine starts containers outside the job's cgroup and environment), so
two jobs on one node never both ask for `gpus: all`. Without a cluster: the batch script run by
bash under the variables Slurm's GRES plugin sets, with a stand-in python that records the bench's
arguments; then those arguments taken as the bench takes them, down to the container's device
request, for jobs of several GPUs each. On the real Slurm of scripts/slurm.sh, whose node n1 has two
fake GPUs, two one-GPU jobs running at once on n1 give their containers (on the stand-in GPU
engine) disjoint NVIDIA_VISIBLE_DEVICES, each the job's SLURM_JOB_GPUS: tests/test_e2e_slurm.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import docker.types
import yaml

from bench.core.config import with_devices
from bench.core.matrix import expand
from bench.serve.launch_docker import run_options
from bench.serve.slots import SlotPool
from bench.slurm import devices_from_job, job_script
from bench.store.matrixfile import load_config


def config_file(tmp_path: Path, launcher: str) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    data = {
        "name": "gpu", "launcher": launcher, "platforms": ["h200"],
        "models": [{"name": "m", "path": str(tmp_path / "model")}],
        "load_formats": [{"name": "safetensors"}],
        "images": [{"name": "img", "ref": "vllm/vllm-openai:v0.18.2"} if launcher == "docker"
                   else {"name": "img", "python": "/usr/bin/python3"}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }
    f = tmp_path / f"{launcher}.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def bench_args(tmp_path: Path, script: str, env: dict[str, str]) -> list[str]:
    """The arguments the job's bench was started with: the script run by bash, its python a
    stand-in that writes them one a line."""
    fake = tmp_path / "python"
    record = tmp_path / "argv"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"]}
    done = subprocess.run(["bash", "-c", script.replace("/venv/bin/python", str(fake))], env={**base, **env},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return record.read_text().splitlines()


def devices_arg(argv: list[str]) -> str:
    return argv[argv.index("--devices") + 1]


def test_each_jobs_bench_gets_the_jobs_gpus_and_its_containers_ask_for_them(tmp_path):
    config = load_config(config_file(tmp_path, "docker"))
    assert devices_from_job(config)
    cell = expand(config)[0]
    script = job_script(cell, Path("/shared/m.yaml"), "r1", tmp_path / "slices" / "001", python="/venv/bin/python",
                        job_gpus=True)
    # Two jobs on one node with GPU GRES: Slurm gives each its own GPUs (SLURM_JOB_GPUS, the node's
    # indices) and a CUDA_VISIBLE_DEVICES of its own.
    jobs = [{"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"},
            {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}]
    asked = []
    for i, env in enumerate(jobs):
        spec = devices_arg(bench_args(tmp_path, script, env))
        assert spec == env["SLURM_JOB_GPUS"]
        # The job's bench: its profile's devices are the job's, one slot pool of them, the container
        # asks for exactly the ids it was given (tensor_parallel_size 1: one of them per server).
        profile = with_devices(config, spec).profile("h200")
        pool = SlotPool("gpu", profile.devices, locks=tmp_path / f"locks{i}")
        devices = pool.acquire(cell.model.tensor_parallel_size)
        [request] = run_options(profile, devices)["device_requests"]
        assert isinstance(request, docker.types.DeviceRequest)
        assert request["Count"] == 0 and request["Capabilities"] == [["gpu"]]
        asked.append(set(request["DeviceIDs"]))
        assert asked[-1] <= set(env["SLURM_JOB_GPUS"].split(","))
    assert not asked[0] & asked[1], asked
    # Without Slurm's GPU list the job's CUDA_VISIBLE_DEVICES; without either, none (the profile's).
    assert devices_arg(bench_args(tmp_path, script, {"CUDA_VISIBLE_DEVICES": "3"})) == "3"
    assert devices_arg(bench_args(tmp_path, script, {})) == "none"


def test_the_profiles_gpus_all_is_what_a_bench_without_devices_asks_for(tmp_path):
    # What the job's bench asked for before: --devices none, so every container `gpus: all`.
    config = with_devices(load_config(config_file(tmp_path, "docker")), "none")
    [request] = run_options(config.profile("h200"))["device_requests"]
    assert request["Count"] == -1 and not request.get("DeviceIDs")


def test_the_local_launchers_job_keeps_slurms_cuda_visible_devices(tmp_path):
    # Locally the server is a process of the job: Slurm's binding (and cgroup) applies as it is.
    config = load_config(config_file(tmp_path, "local"))
    assert not devices_from_job(config)
    script = job_script(expand(config)[0], Path("/shared/m.yaml"), "r1", tmp_path / "s", python="/venv/bin/python")
    assert devices_arg(bench_args(tmp_path, script, {"SLURM_JOB_GPUS": "2,3"})) == "none"
