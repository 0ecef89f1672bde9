"""The Slurm executor: one matrix run as Slurm jobs, one job per cell, merged into one results folder.

matrix → cells → one `sbatch` per cell (the one-slice `regbench run --cell ID --run-id RUN` into
a slice folder on a path every node shares) → followed with squeue/scontrol → slices merged
(bench.store.merge) → one report. The jobs run the matrix the submitting command resolved
(`--image` overrides included), written once as `.slurm-RUN/config.yaml` beside the results:
never the matrix file again, which may have changed or be read differently by then.

Why Slurm's own commands and no client library: sbatch, squeue, scontrol and scancel are the
interface every Slurm site keeps stable and documents, and they are what a user debugging a stuck
job types too; the Python bindings (pyslurm) must match the cluster's exact Slurm release and be
built against its headers. A job is named `regbench-RUN` and carries `--comment RUN`, so that a
second bench on the same cluster never touches this run's jobs (scancel by id, never by user).

Inside a job the local launcher's bench runs with `--devices none`: Slurm has already bound the
job to its GPUs (CUDA_VISIBLE_DEVICES, set by its GRES plugin), and the launcher then leaves that
variable as Slurm set it rather than binding devices of the platform profile again. Containers are
started by the Docker engine, outside the job's cgroup and environment, so under `launcher:
docker` the job's bench is given the job's GPUs as its devices (`--devices $SLURM_JOB_GPUS`, their
indices in the node's gres.conf, else CUDA_VISIBLE_DEVICES): each container then gets exactly those ids in its
device request, never the profile's `gpus: all` (see JOB_DEVICES).

Stopping (Ctrl-C, SIGTERM, a worker error) cancels every job of the run and waits until none is
queued or running. A job that failed, hit its time limit, was cancelled or whose node went down
is recorded as such (slurm.jsonl in the merged folder, and on the console); what its slice wrote
before is kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from bench.core.config import Config, SlurmProfile, parse_config
from bench.core.diagnosis import Diagnosis
from bench.core.errors import RegbenchError
from bench.core.matrix import Cell, expand
from bench.core.records import JOB_DONE_STATES, JobRecord, Summary
from bench.core.stop import StopToken
from bench.serve.errors import LauncherUnavailable
from bench.serve.launchers import backend, open_launcher
from bench.store.matrixfile import load_config
from bench.store.merge import merge
from bench.store.publish import regenerate
from bench.store.results import ResultsDir, write_config

POLL_S = 2.0
CANCEL_WAIT_S = 120.0
FOLDER_WAIT_S = 900  # a time-limited job's bench has KillWait (30 s by default) to stop; room for more
DONE_STATES = JOB_DONE_STATES


class SlurmError(RegbenchError, RuntimeError):
    """Slurm's commands are missing or refused the run: no job of it is left queued."""


SlurmJob = JobRecord  # the record is typed in bench.core.records: reports read it too


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # sbatch --time
    gpus_per_job: int | None = None  # None: the cell's tensor_parallel_size on a GPU platform, else 0
    cpus_per_job: int | None = None
    mem: str | None = None
    extra: list[str] = field(default_factory=list)  # further sbatch arguments, as given

    def over(self, profile: SlurmProfile) -> SlurmOptions:
        """These options (the command line's) over a platform profile's: a value given here wins,
        and extra arguments follow the profile's, so that sbatch takes the later one."""
        return SlurmOptions(
            **{name: getattr(self, name) if getattr(self, name) is not None else getattr(profile, name, None)
               for name in ("partition", "account", "time_limit", "cpus_per_job", "mem")},
            gpus_per_job=self.gpus_per_job, extra=[*profile.sbatch_args, *self.extra])


def _run(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found; is this a Slurm submit host?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:2])} did not answer in {timeout:.0f} s") from None


# The job's GPUs as a --devices list, in the job's shell: Slurm's SLURM_JOB_GPUS holds their indices
# in the node's gres.conf (nvidia-smi's indices, what a container's device request names, when
# gres.conf lists /dev/nvidia0, 1, ... in order); CUDA_VISIBLE_DEVICES when it is not set.
JOB_DEVICES = '${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-none}}'


def job_script(cell: Cell, config_path: Path, run_id: str, slice_dir: Path, python: str = sys.executable,
               job_gpus: bool = False) -> str:
    """The batch script of one cell: prints where it ran, then the one-slice run. A cell that
    failed (the bench's exit 1) is a job that did its work: the job fails only when the bench
    could not run (2), write (3) or was stopped (130). `job_gpus` (containers on a GPU platform):
    the bench's devices are the job's GPUs (JOB_DEVICES), else none."""
    fresh = [python, "-m", "bench", "run", str(config_path), "--cell", cell.id, "--run-id", run_id,
             "--results", str(slice_dir)]
    # A job run again (resubmitted, or requeued by Slurm) continues its slice: finished repeats stay.
    # Slurm reports the last attempt ended while its bench may still be stopping: wait for it.
    again = [python, "-m", "bench", "run", "--resume", str(slice_dir / run_id), "--cell", cell.id,
             "--wait-for-folder", str(FOLDER_WAIT_S)]
    devices = ' --devices "$devices"' if job_gpus else " --devices none"
    return ("#!/bin/bash\n"
            'echo "regbench-job node=${SLURMD_NODENAME:-} cuda_visible_devices=${CUDA_VISIBLE_DEVICES:-}'
            ' job_gpus=${SLURM_JOB_GPUS:-}"\n'
            f'devices="{JOB_DEVICES}"\n'
            f"if [ -f {shlex.quote(str(slice_dir / run_id / 'config.yaml'))} ]; then\n"
            f"  {shlex.join(again)}{devices}\nelse\n  {shlex.join(fresh)}{devices}\nfi\n"
            'rc=$?\necho "regbench-exit $rc"\n[ "$rc" -le 1 ] && exit 0\nexit "$rc"\n')


def sbatch_args(cell: Cell, run_id: str, slice_dir: Path, options: SlurmOptions, gpu_platform: bool) -> list[str]:
    gpus = options.gpus_per_job if options.gpus_per_job is not None else (
        cell.model.tensor_parallel_size if gpu_platform else 0)
    args = ["sbatch", "--parsable", f"--job-name=regbench-{run_id}", f"--comment={run_id}",
            f"--output={slice_dir / 'slurm-%j.out'}", f"--chdir={os.getcwd()}", "--export=ALL"]
    if gpus:
        args.append(f"--gres=gpu:{gpus}")
    for flag, value in (("--partition", options.partition), ("--account", options.account),
                        ("--time", options.time_limit), ("--cpus-per-task", options.cpus_per_job),
                        ("--mem", options.mem)):
        if value is not None:
            args.append(f"{flag}={value}")
    return args + list(options.extra)


def submit(cell: Cell, config_path: Path, run_id: str, root: Path, index: int, options: SlurmOptions,
           gpu_platform: bool, attempt: int = 1, job_gpus: bool = False) -> SlurmJob:
    slice_dir = root / "slices" / f"{index:03d}"
    slice_dir.mkdir(parents=True, exist_ok=True)
    argv = sbatch_args(cell, run_id, slice_dir, options, gpu_platform)
    try:
        script = job_script(cell, config_path, run_id, slice_dir, job_gpus=job_gpus)
        done = subprocess.run(argv, input=script, capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError("sbatch: not found; is this a Slurm submit host?") from None
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        raise SlurmError(f"sbatch refused {cell.id}: {(done.stderr or done.stdout).strip()}")
    return SlurmJob(cell_id=cell.id, job_id=job_id, slice_dir=str(slice_dir), submitted_at=time.time(), attempt=attempt)


_FIELD = re.compile(r"(\w+)=(\S*)")


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`: one line of Key=Value pairs."""
    return dict(_FIELD.findall(text))


def _first_line(job: SlurmJob) -> str | None:
    out = Path(job.slice_dir) / f"slurm-{job.job_id}.out"
    try:
        with out.open(encoding="utf-8", errors="replace") as f:
            line = f.readline()
    except OSError:
        return None
    m = re.search(r"cuda_visible_devices=(\S*)", line)
    return m.group(1) if m else None


def refresh(jobs: list[SlurmJob]) -> list[SlurmJob]:
    """Each job's state from scontrol (it keeps finished jobs for MinJobAge); a job it no longer
    knows and squeue does not list is over, as far as anyone can tell: state UNKNOWN."""
    out = []
    for job in jobs:
        if job.done:
            out.append(job)
            continue
        shown = _run(["scontrol", "show", "job", "-o", job.job_id])
        fields = parse_scontrol(shown.stdout) if shown.returncode == 0 else {}
        state = fields.get("JobState", "UNKNOWN" if shown.returncode != 0 else job.state)
        update: dict = {"state": state}
        if fields.get("NodeList") and fields["NodeList"] != "(null)":
            update["node"] = fields["NodeList"]
        if fields.get("Restarts", "").isdigit():
            update["restarts"] = int(fields["Restarts"])
        if state == "UNKNOWN" or state in DONE_STATES:
            update.update(exit_code=fields.get("ExitCode"), ended_at=time.time(),
                          reason=None if state == "COMPLETED" else fields.get("Reason"))
            if state == "UNKNOWN":
                update["state"] = "UNKNOWN"
        if job.cuda_visible_devices is None:
            update["cuda_visible_devices"] = _first_line(job)
        out.append(job.model_copy(update=update))
    return out


def cancel(jobs: Sequence[SlurmJob]) -> None:
    live = [j.job_id for j in jobs if not j.done]
    if not live:
        return
    _run(["scancel", *live])
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        queued = _run(["squeue", "-h", "-o", "%i", "-j", ",".join(live)])
        if not set(queued.stdout.split()) & set(live):
            return
        time.sleep(0.5)


def follow(jobs: list[SlurmJob], stop: StopToken, status: Callable[[str], None],
           save: Callable[[list[SlurmJob]], None] = lambda jobs: None) -> list[SlurmJob]:
    """Until every job is over, or `stop` is set (then every job still queued or running is
    cancelled, and waited for). `save` gets the jobs after every look: a killed bench's jobs can
    be found again by `--resume`."""
    seen = {j.job_id: (j.state, j.node, j.restarts) for j in jobs}
    try:
        while not all(j.done for j in jobs):
            if stop.wait(POLL_S):
                break
            jobs = refresh(jobs)
            save(jobs)
            for j in jobs:
                if seen.get(j.job_id) != (j.state, j.node, j.restarts):
                    requeued = j.restarts > seen.get(j.job_id, ("", None, 0))[2]
                    seen[j.job_id] = (j.state, j.node, j.restarts)
                    where = f" on {j.node}" if j.node else ""
                    if requeued:
                        status(f"job {j.job_id} {j.cell_id}: requeued by Slurm (restart {j.restarts})")
                    devices = f" (CUDA_VISIBLE_DEVICES={j.cuda_visible_devices})" if j.cuda_visible_devices else ""
                    status(f"job {j.job_id} {j.cell_id}: {j.state}{where}{devices}")
    except KeyboardInterrupt:
        stop.stop("interrupted")
    if stop.stopped:
        status(f"stopping: cancelling {sum(not j.done for j in jobs)} job(s)")
        cancel(jobs)
        jobs = [j if j.done else j.model_copy(update={"state": "CANCELLED", "reason": stop.reason,
                                                      "ended_at": time.time()}) for j in jobs]
    jobs = refresh(jobs)
    save(jobs)
    return jobs


def collect(jobs: list[SlurmJob], run_id: str, out: Path, config: Config) -> ResultsDir:
    """Merges the slices that wrote anything into out/RUN and records every job there. With no
    slice at all (every job ended before its bench started) the folder holds the matrix and the
    jobs alone: every cell is then "not run", and the jobs say why."""
    # A resubmitted cell's attempts share one slice (each continues it): merge it once.
    slices = list(dict.fromkeys(Path(j.slice_dir) / run_id for j in jobs
                                if (Path(j.slice_dir) / run_id / "config.yaml").is_file()))
    target = out / run_id
    if (target / "slurm.jsonl").is_file():
        shutil.rmtree(target)  # the merge of an earlier attempt: derived from the slices, made again
    merged = merge(slices, out) if slices else ResultsDir.create(out, run_id, config)
    # The run planned every job's cell, whether or not its bench got to write a plan of its own.
    plan = merged.plan(config, [])
    ran = plan.cells if slices else []
    merged.write_plan(plan.model_copy(update={
        "cells": list(dict.fromkeys([*ran, *(j.cell_id for j in jobs)])), "started_at": plan.started_at or time.time()}))
    with (merged.path / "slurm.jsonl").open("w", encoding="utf-8") as f:
        for j in jobs:
            f.write(j.model_dump_json() + "\n")
    return merged


# --- the run's own state, beside its slices: what --resume reads -----------------------------------


class Submission(BaseModel):
    """What a Slurm run was asked to do: enough to resubmit its unfinished cells."""

    model_config = ConfigDict(extra="forbid")

    config: str  # the matrix as the submitting command resolved it (state dir's config.yaml): what every job runs
    run_id: str
    results: str
    options: dict
    cells: list[str]


def state_dir(results: Path, run_id: str) -> Path:
    return results / f".slurm-{run_id}"


def save_state(root: Path, jobs: Sequence[SlurmJob]) -> None:
    tmp = root / ".jobs.jsonl.tmp"
    tmp.write_text("".join(j.model_dump_json() + "\n" for j in jobs), encoding="utf-8")
    os.replace(tmp, root / "jobs.jsonl")


def load_state(root: Path) -> tuple[Submission, list[SlurmJob]]:
    try:
        submission = Submission.model_validate_json((root / "submission.json").read_text())
        jobs = [SlurmJob.model_validate_json(x) for x in (root / "jobs.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError) as exc:
        raise SlurmError(f"{root}: not the state of a Slurm run ({exc})") from None
    return submission, jobs


def save_submission(root: Path, submission: Submission) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "submission.json").write_text(json.dumps(submission.model_dump(), indent=1), encoding="utf-8")


# --- one run on Slurm, start to merged report: what `regbench run --executor slurm` does --------------


@dataclass
class SlurmRun:
    """What a run on Slurm came to: the merged folder and its summary, whether the bench was
    stopped, and the jobs that did not complete (their cells have the runs they made before)."""

    results: ResultsDir
    summary: Summary
    diagnosis: Diagnosis
    stopped: bool
    incomplete: list[SlurmJob]


Status = Callable[[str], None]


def pin_for_jobs(config: Config, cells: Sequence[Cell], run_id: str, status: Status) -> Config:
    """The config with its images pinned once, at submission, where a launcher pulls images (the
    docker launcher: `repo@sha256:…`, or the image id of one that only exists here): every job of
    the run, baseline and test cells alike, then runs the same build even if a tag moves between
    the jobs' starts. A submitting host without a container engine leaves it to each job (said);
    an image that cannot be had is an error before any job (the launcher's ConfigError)."""
    images = list({c.image.name: c.image for c in cells if c.image.ref}.values())
    if not images:
        return config
    try:
        launcher = open_launcher(config, run_id)
    except LauncherUnavailable as exc:
        status(f"images not pinned at submission ({exc}): each job resolves its own, and jobs that ran two "
               "builds of a tag are not merged; to run one, give --image NAME=REPO@sha256:… (`regbench plan "
               "CONFIG --format pins` prints them on a host with an engine)")
        return config
    pinned = launcher.resolve_images(images)
    if not pinned:
        return config
    data = config.model_dump(mode="json")
    for image in data["images"]:
        if image["name"] in pinned:
            status(f"image {image['name']}: {image['ref']} pinned to {pinned[image['name']].ref} for every job")
            # A digest or an id names one build: fetching it again can only fetch that build.
            image.update(ref=pinned[image["name"]].ref, pull="if-missing")
    return parse_config(data, "the submitted matrix")


def start(config: Config, cells: Sequence[Cell], run_id: str, results: Path, options: SlurmOptions,
          status: Status) -> SlurmRun:
    """One job per cell, followed, merged into results/RUN. `config` is the matrix as the
    submitting command resolved it (--image overrides, profiles, absolute paths): it is written
    once into the run's state folder on the shared path, and every job, first or resubmitted,
    runs that file, never the matrix file it came from."""
    results = results.resolve()
    root = state_dir(results, run_id)
    if (results / run_id).exists() or root.exists():
        raise SlurmError(f"results directory {results / run_id} exists already")
    config = pin_for_jobs(config, cells, run_id, status)
    root.mkdir(parents=True)
    matrix = root / "config.yaml"
    write_config(matrix, config)
    save_submission(root, Submission(config=str(matrix), run_id=run_id, results=str(results),
                                     options=dataclasses.asdict(options), cells=[c.id for c in cells]))
    return _submit_and_follow(config, matrix, [(c, i, 1) for i, c in enumerate(cells)], [], root, run_id, results,
                              options, status)


def resume(path: Path, again: SlurmOptions, status: Status) -> SlurmRun:
    """Jobs still queued or running are followed, cells whose job did not complete are submitted
    again into their slice (whose finished repeats stay), the rest is kept; then everything is
    merged again. What is given again in `again` overrides what the run was submitted with (a
    longer time limit, say)."""
    path = path.resolve()
    results, run_id = path.parent, path.name
    root = state_dir(results, run_id)
    try:
        submission, jobs = load_state(root)
        jobs = refresh(jobs)
    except SlurmError as exc:
        raise SlurmError(f"cannot resume {path} on Slurm: {exc}") from None
    config = load_config(submission.config)
    cells = {c.id: c for c in expand(config)}
    options = SlurmOptions(**submission.options)
    for name in ("partition", "account", "time_limit", "gpus_per_job", "cpus_per_job", "mem"):
        if getattr(again, name) is not None:
            setattr(options, name, getattr(again, name))
    if again.extra:
        options.extra = list(again.extra)
    latest = {j.cell_id: j for j in jobs}  # the last attempt of each cell
    todo = []
    for i, cell_id in enumerate(submission.cells):
        job = latest.get(cell_id)
        if job is None or (job.done and job.state != "COMPLETED"):
            attempt = job.attempt + 1 if job else 1
            index = int(Path(job.slice_dir).name) if job else i
            todo.append((cells[cell_id], index, attempt))
    status(f"resuming {run_id}: {len(todo)} cell(s) to submit again, "
           f"{sum(not j.done for j in latest.values())} job(s) still queued or running")
    return _submit_and_follow(config, Path(submission.config), todo, list(latest.values()), root, run_id, results,
                              options, status)


def devices_from_job(config: Config) -> bool:
    """Whether the matrix's launcher needs a job's GPUs as devices (its back-end says: containers
    do, a local server inherits the job's binding)."""
    return bool(getattr(backend(config.launcher), "devices_from_job", False))


def _submit_and_follow(config: Config, matrix: Path, todo: list[tuple[Cell, int, int]], jobs: list[SlurmJob],
                       root: Path, run_id: str, results: Path, options: SlurmOptions, status: Status) -> SlurmRun:
    stop = StopToken()
    resubmitted = {c.id for c, _, _ in todo}
    jobs = [j for j in jobs if j.cell_id not in resubmitted]

    def save(js: list[SlurmJob]) -> None:
        save_state(root, js)

    try:
        for cell, index, attempt in todo:
            profile = cell.profile
            jobs.append(submit(cell, matrix, run_id, root, index, options.over(profile.slurm),
                               profile.device_kind == "gpu", attempt,
                               job_gpus=profile.device_kind == "gpu" and devices_from_job(config)))
            save(jobs)
            status(f"submitted job {jobs[-1].job_id}: {cell.id}" + (f" (attempt {attempt})" if attempt > 1 else ""))
        jobs = follow(jobs, stop, status, save)
    except KeyboardInterrupt:
        stop.stop("interrupted")
        jobs = follow(jobs, stop, status, save)
    except SlurmError as exc:
        stop.stop(str(exc))
        follow(jobs, stop, status, save)
        raise
    incomplete = [j for j in jobs if j.state != "COMPLETED"]
    for j in incomplete:
        status(f"job {j.job_id} {j.cell_id}: {j.state}" + (f" ({j.reason})" if j.reason else "")
               + (f" on {j.node}" if j.node else ""))
    merged = collect(jobs, run_id, results, config)
    report = regenerate(merged.path)
    return SlurmRun(results=merged, summary=report.summary, diagnosis=report.diagnosis, stopped=stop.stopped,
                    incomplete=incomplete)
