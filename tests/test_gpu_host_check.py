"""A GPU profile's facts against the host before any server starts (bench.serve.platforms.check_host):
the GPUs it lists that the host lacks are dropped with a warning, a cell that cannot get its
tensor_parallel_size from the rest is not_runnable (never a boot failure), a host without
nvidia-smi says so, the memory kind is checked, and the one GPU of a unified-memory host is taken
by a lock like any other. The host is the stand-in nvidia-smi (tests/data/gpu-standin/nvidia-smi)
answering `--query-gpu=index,uuid,name,memory.total --format=csv,noheader` from the lines written
here, in the format of real outputs (the sources are in the stand-in's header)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from bench.core.config import parse_config
from bench.core.judge import judge
from bench.core.matrix import expand
from bench.core.stop import Stopped, StopToken
from bench.core.verdicts import Reason
from bench.runner import device_pools, run_matrix
from bench.serve.platforms import HostGpu, check_host, parse_gpus
from bench.serve.slots import SlotPool
from bench.store.results import ResultsDir

from .support import ROOT, ScriptedLauncher

STANDIN_BIN = ROOT / "tests" / "data" / "gpu-standin"
UUIDS = ["GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5", "GPU-8f639255-9bdd-d28c-78be-e05a47c7049e"]
TWO_H200 = "".join(f"{i}, {u}, NVIDIA H200, 143771 MiB\n" for i, u in enumerate(UUIDS))
ONE_GB10 = f"0, {UUIDS[0]}, NVIDIA GB10, [N/A]\n"


def profile(name: str) -> dict:
    data = yaml.safe_load((ROOT / "bench" / "profiles" / f"{name}.yaml").read_text())
    data.pop("knobs", None)
    return data


def gpu_matrix(minimal: dict, platform: str, tp: dict[str, int]) -> dict:
    minimal["models"] = [{"name": n, "path": "/m", "tensor_parallel_size": size} for n, size in tp.items()]
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    minimal["platforms"] = [platform]
    minimal["profiles"] = [profile(platform)]
    minimal["preflight"] = False
    return minimal


@pytest.fixture
def host(tmp_path, monkeypatch):
    """host(lines): this host's GPUs are those lines, as the stand-in nvidia-smi prints them."""
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    table = tmp_path / "gpus.csv"

    def set_gpus(lines: str) -> None:
        table.write_text(lines)
        monkeypatch.setenv("NVIDIA_SMI_STANDIN_GPU_TABLE", str(table))

    return set_gpus


class Said:
    def __init__(self):
        self.lines: list[str] = []

    def start(self, total_runs):
        pass

    def status(self, text):
        self.lines.append(text)

    def run_done(self, record, findings, divergence):
        pass


def test_the_h200_profile_on_a_two_gpu_host_runs_on_0_and_1_and_a_tp4_cell_is_not_runnable(tmp_path, minimal, host):
    host(TWO_H200)
    cfg = parse_config(gpu_matrix(minimal, "h200", {"m1": 1, "big": 4}))
    results = ResultsDir.create(tmp_path, "r", cfg)
    launcher = ScriptedLauncher(["ok"])
    said = Said()
    summary = run_matrix(cfg, expand(cfg), results, launcher=launcher, progress=said, locks=tmp_path / "l").summary
    assert [w for w in said.lines if w.startswith("warning:")] == [
        "warning: platform h200: this host has no GPU 2, 3, 4, 5, 6, 7 (nvidia-smi lists 0 (NVIDIA H200), "
        "1 (NVIDIA H200)); its cells run on 0, 1 only"]
    runs = results.runs()
    served = [r for r in runs if r.cell_id.startswith("m1")]
    assert served and {d for r in served for d in r.server.devices.ids} <= {"0", "1"}
    # The TP=4 cells: one run each, said not runnable, no server asked for, no devices taken.
    big = [r for r in runs if r.cell_id.startswith("big")]
    assert {r.cell_id for r in big} == {c.id for c in expand(cfg) if c.model.name == "big"}
    assert all(r.server.devices is None and r.server.boot_s is None for r in big)
    assert not any(cell.startswith("big") for cell, _ in launcher.started)
    verdicts = {c.cell_id: c for c in summary.cells}
    for r in big:
        assert verdicts[r.cell_id].reasons == {"not_runnable": 1}, verdicts[r.cell_id]  # not boot_failed
        assert "needs 4 GPUs (tensor_parallel_size) and this host has 2 of platform h200's: 0, 1" \
            in r.server.start_error
    [finding] = [f for c in judge(results.data).cells if c.cell_id == big[0].cell_id
                 for rr in c.run_results for f in rr.findings]
    assert finding.reason == Reason.NOT_RUNNABLE
    assert all(verdicts[r.cell_id].verdict == "pass" for r in served)


def test_a_gpu_profile_on_a_host_without_nvidia_smi_is_not_runnable_and_starts_nothing(tmp_path, minimal):
    cfg = parse_config(gpu_matrix(minimal, "h200", {"m1": 1}))
    cells = expand(cfg)
    empty = tmp_path / "bin"
    empty.mkdir()
    check = check_host(cfg, cells, env={"PATH": str(empty)})
    reason = check.refused(cells[0])
    assert reason == ("not runnable on this host: platform h200 needs an NVIDIA GPU and this host has no "
                      "nvidia-smi on PATH (no NVIDIA driver)")
    results = ResultsDir.create(tmp_path, "r", cfg)
    launcher = ScriptedLauncher(["ok"])
    summary = run_matrix(cfg, cells, results, launcher=launcher, locks=tmp_path / "l", host=check).summary
    assert launcher.started == []
    assert [c.reasons for c in summary.cells] == [{"not_runnable": 1}] * len(cells)
    assert not (tmp_path / "l").exists() or not list((tmp_path / "l").iterdir())  # no device locked
    # A CPU platform asks nothing of nvidia-smi.
    minimal["platforms"], minimal["profiles"] = ["cpu"], [{"name": "cpu", "device_kind": "cpu"}]
    cpu = parse_config(minimal)
    assert check_host(cpu, expand(cpu), env={"PATH": str(empty)}).platforms == {}


def test_the_unified_memory_profile_takes_gpu0_and_a_second_bench_waits_for_it(tmp_path, minimal, host):
    host(ONE_GB10)
    cfg = parse_config(gpu_matrix(minimal, "dgx-spark", {"m1": 1}))
    cells = expand(cfg)
    check = check_host(cfg, cells)
    assert check.warnings == [] and check.refused(cells[0]) is None
    locks = tmp_path / "locks"
    pool = device_pools(cfg, cells, locks, check)["dgx-spark"]
    held = pool.acquire(1)
    assert held.ids == ("0",) and (locks / "gpu0.lock").read_text().strip() == str(os.getpid())
    # A second slot set on the same lock folder (another bench's) cannot take it: it waits.
    other = SlotPool("gpu", ["0"], locks, poll_s=0.05)
    stop = StopToken()
    threading.Timer(0.5, stop.stop, args=("test",)).start()
    with pytest.raises(Stopped):
        other.acquire(1, stop)
    pool.release(held)
    other.release(other.acquire(1))
    # The same GPU named by its UUID is the same lock.
    by_uuid = gpu_matrix(minimal, "dgx-spark", {"m1": 1})
    by_uuid["profiles"][0]["devices"] = [UUIDS[0]]
    cfg = parse_config(by_uuid)
    check = check_host(cfg, expand(cfg))
    pool = device_pools(cfg, expand(cfg), locks, check)["dgx-spark"]
    held = pool.acquire(1)
    assert held.ids == (UUIDS[0],)
    with pytest.raises(Stopped):
        stop = StopToken()
        stop.stop("at once")
        SlotPool("gpu", ["0"], locks).acquire(1, stop)
    pool.release(held)


def test_the_memory_kind_is_checked(tmp_path, minimal, host):
    host(ONE_GB10)
    cfg = parse_config(gpu_matrix(dict(minimal), "h200", {"m1": 1}))
    reason = check_host(cfg, expand(cfg)).refused(expand(cfg)[0])
    assert reason is not None and reason.startswith("not runnable on this host: platform h200 is for GPUs with "
                                                    "memory of their own")
    assert "GPU 0 (NVIDIA GB10) has none (nvidia-smi memory.total [N/A])" in reason
    host(TWO_H200)
    cfg = parse_config(gpu_matrix(dict(minimal), "dgx-spark", {"m1": 1}))
    check = check_host(cfg, expand(cfg))
    assert check.refused(expand(cfg)[0]) is None
    assert check.warnings == ["platform dgx-spark is for unified memory and this host's GPU 0 (NVIDIA H200) has "
                              "143771 MiB of its own: each fresh server waits for host memory it does not need"]


def test_nvidia_smi_lines_are_read_as_printed():
    assert parse_gpus(TWO_H200 + ONE_GB10 + "\nNo devices were found\n") == [
        HostGpu("0", UUIDS[0], "NVIDIA H200", "143771 MiB"), HostGpu("1", UUIDS[1], "NVIDIA H200", "143771 MiB"),
        HostGpu("0", UUIDS[0], "NVIDIA GB10", "[N/A]")]
    assert [g.unified for g in parse_gpus(TWO_H200 + ONE_GB10)] == [False, False, True]
    assert HostGpu("3", UUIDS[1], "x", "[N/A]").is_(UUIDS[1].lower()) and HostGpu("3", "u", "x", "1 MiB").is_("3")


def test_inside_a_slurm_job_the_jobs_gpu_numbers_are_not_checked(tmp_path, minimal, host, monkeypatch):
    # The job's nvidia-smi lists only the job's GPUs; the node's indices it was given need not be theirs.
    host("0, " + UUIDS[0] + ", NVIDIA H200, 143771 MiB\n")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    data = gpu_matrix(minimal, "h200", {"m1": 1})
    data["profiles"][0]["devices"] = ["3"]
    cfg = parse_config(data)
    check = check_host(cfg, expand(cfg))
    assert check.refused(expand(cfg)[0]) is None and check.devices(cfg.profile("h200")) == ["3"]


def test_the_shipped_one_gpu_profiles_take_their_gpu():
    for name in ("dgx-spark", "agx-thor"):
        data = profile(name)
        assert data["devices"] == ["0"] and data["device_kind"] == "gpu" and data["unified_memory"] is True


def test_devices_may_be_named_by_gpu_uuid(minimal):
    from bench.core.config import parse_devices

    assert parse_devices(f"0,{UUIDS[1]}") == ["0", UUIDS[1]]
    data = gpu_matrix(minimal, "h200", {"m1": 1})
    data["profiles"][0]["devices"] = [UUIDS[0], "1"]
    assert parse_config(data).profile("h200").devices == [UUIDS[0], "1"]
    assert Path(STANDIN_BIN / "nvidia-smi").stat().st_mode & 0o111


def test_regbench_run_says_what_the_host_lacks_before_any_server(tmp_path, minimal, host, capsys):
    # The command line as a user runs it: the local launcher, the h200 profile, a two-GPU host and a
    # TP=4 model. The warning is printed (not a status line the progress bar overwrites), the cells
    # are recorded not_runnable, nothing booted, no traceback.
    from bench.cli import main

    host(TWO_H200)
    (tmp_path / "m").mkdir()
    data = gpu_matrix(minimal, "h200", {"big": 4})
    data["models"][0]["path"] = str(tmp_path / "m")
    data["load_formats"] = [{"name": "safetensors"}]
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["run", str(path), "--platform", "h200", "--results", str(tmp_path / "r"), "--run-id", "r",
                 "--no-history"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "regbench: warning: platform h200: this host has no GPU 2, 3, 4, 5, 6, 7" in err
    runs = ResultsDir(tmp_path / "r" / "r").runs()
    assert len(runs) == 1 and runs[0].server.start_error.startswith("not runnable on this host: big__")
    assert not (tmp_path / "r" / "r" / "cells" / runs[0].cell_id / "run-1" / "server.log").exists()
    assert "boot_failed" not in out and code != 1, out + err  # not a failure of vLLM
