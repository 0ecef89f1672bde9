"""A Slurm job's bench under `launcher: docker`, up to its server's container and no further, for
tests/test_e2e_slurm.py. The batch script bench.slurm.job_script writes starts it in the bench's
place (`python -m bench run CONFIG --cell ID --run-id RUN --results SLICE --devices LIST`, LIST
expanded by the script from the job's environment). It takes the devices as `regbench run
--devices` does (with_devices, the runner's device pool), starts the cell's server through the
docker launcher on the engine DOCKER_HOST names (the stand-in GPU engine, whose image prints its
environment and exits where vLLM would boot), and writes what the job and its container saw to
SLICE/seen.json.

Before taking its devices each job waits, bounded, until every job of the run has started: the
jobs hold their GPUs at the same time, so Slurm cannot have handed one GPU to both in turn.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.core.config import with_devices
from bench.core.matrix import expand
from bench.runner import device_pools
from bench.serve.launch import BootError
from bench.serve.launch_docker import run_options
from bench.serve.launchers import open_launcher
from bench.store.matrixfile import load_config

ALL_STARTED_S = 120.0


def main(argv: list[str]) -> int:
    if argv[:3] != ["-m", "bench", "run"] or "--resume" in argv:
        print(f"slurm_gpu_job: not a first run of one cell: {argv}", file=sys.stderr)
        return 3
    config_path, options = argv[3], dict(zip(argv[4::2], argv[5::2], strict=True))
    slice_dir, run_id, spec = Path(options["--results"]), options["--run-id"], options["--devices"]
    config = with_devices(load_config(config_path), spec)
    cells = expand(config)
    slices = slice_dir.parent
    (slices / f"started-{os.environ['SLURM_JOB_ID']}").touch()
    deadline = time.monotonic() + ALL_STARTED_S
    while len(started := sorted(p.name.removeprefix("started-") for p in slices.glob("started-*"))) < len(cells):
        if time.monotonic() > deadline:
            print(f"slurm_gpu_job: only {started} of {len(cells)} jobs started in {ALL_STARTED_S:g} s", file=sys.stderr)
            return 3
        time.sleep(0.2)
    [cell] = [c for c in cells if c.id == options["--cell"]]
    # The node's lock folder, as benches on one host share it (both jobs run on n1).
    pool = device_pools(config, [cell], locks=slices / "locks")[cell.platform]
    devices = pool.acquire(cell.model.tensor_parallel_size)
    run_dir = slice_dir / run_id / "server"
    run_dir.mkdir(parents=True)
    try:
        [request] = run_options(config.profile(cell.platform), devices)["device_requests"]
        server = open_launcher(config, run_id).server(cell, 1, run_dir, devices)
        try:
            with server:
                pass
            boot = "healthy"
        except BootError as exc:
            boot = str(exc)
    finally:
        pool.release(devices)
    printed = dict(line.split("=", 1) for line in (run_dir / "server.log").read_text().splitlines() if "=" in line)
    seen = {
        "job_id": os.environ["SLURM_JOB_ID"], "node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job_gpus": os.environ.get("SLURM_JOB_GPUS"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices_arg": spec, "started": started, "device_ids": request["DeviceIDs"],
        "container_nvidia_visible_devices": printed.get("NVIDIA_VISIBLE_DEVICES"), "boot": boot,
    }
    (slice_dir / "seen.json").write_text(json.dumps(seen, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
