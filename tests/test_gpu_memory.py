"""GPU memory per server and settling between servers on unified-memory hosts, with stand-ins: an
nvidia-smi that prints nvidia-smi's CSV (tests/data/gpu-standin/nvidia-smi, first on PATH) and a
/proc/meminfo-format file. The per-container part on a real engine: tests/test_gpu_standin.py."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import psutil
import pytest

from bench.core.perf import METRICS, cell_perf, run_values, slowdowns
from bench.core.records import CellSummary, RunPerf, RunRecord, ServerOutcome
from bench.report.perf import perf_markdown
from bench.runner import _settle
from bench.serve import memory
from bench.serve.memory import Settler, gpu_bytes, listed_without_figure, mem_available, parse_compute_apps, settle_memory

STANDIN_BIN = Path(__file__).resolve().parent / "data" / "gpu-standin"
GIB = 2**30


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """The stand-in nvidia-smi first on PATH; write its compute-apps CSV to the returned file."""
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}:{os.environ['PATH']}")
    apps = tmp_path / "apps.csv"
    apps.write_text("")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_APPS", str(apps))
    return apps


def meminfo(path: Path, available_kib: int) -> None:
    """A /proc/meminfo stand-in, replaced whole (a reader never sees it half written)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(f"MemTotal:       131072000 kB\nMemFree:         1000000 kB\n"
                   f"MemAvailable:   {available_kib:>9} kB\nBuffers:           1000 kB\n")
    os.replace(tmp, path)


def test_unified_memory_rows_are_told_apart_from_figures():
    text = "4242, 70312\n4243, [N/A]\n4244, N/A\n9, 10\n"
    assert parse_compute_apps(text, {4242, 4243, 4244}) == 70312 * 2**20
    assert listed_without_figure(text, {4242, 4243, 4244, 9}) == {4243, 4244}


def test_gpu_memory_of_a_process_from_the_standin_nvidia_smi(smi):
    me = os.getpid()
    smi.write_text(f"1, 900\n{me}, 2048\n{me}, 1024\n")  # two GPUs, another server's process first
    assert gpu_bytes({me}) == 3072 * 2**20
    # GB10: [N/A] for the process; its resident memory counts as the GPU's.
    smi.write_text(f"{me}, [N/A]\n")
    got = gpu_bytes({me})
    rss = psutil.Process(me).memory_info().rss
    assert got is not None and 0.5 * rss < got < 2 * rss
    assert gpu_bytes({me}, lambda pids: 7 * GIB) == 7 * GIB  # a container's cgroup memory instead
    smi.write_text("No running processes found\n")
    assert gpu_bytes({me}) is None


def test_peak_gpu_memory_is_in_the_performance_table_and_compared():
    def run(repeat: int, gpu: float) -> RunRecord:
        outcome = ServerOutcome(command=["vllm"], port=1, log_path="x", started_at=0.0, boot_s=30.0)
        return RunRecord(cell_id="c", repeat=repeat, server=outcome,
                         perf=RunPerf(boot_s=30.0, peak_rss_bytes=GIB, peak_gpu_bytes=int(gpu * GIB)))

    a = [run(r, g) for r, g in ((1, 70.0), (2, 70.1), (3, 70.2))]
    b = [run(r, g) for r, g in ((1, 90.0), (2, 90.1), (3, 90.2))]
    perf = cell_perf(a, [])
    cell = CellSummary(cell_id="c", model="m", load_format="f", platform="p", image="i", baseline_id=None,
                       runs=3, failures=0, verdict="pass", reasons={}, perf=perf)
    text = "\n".join(perf_markdown([cell]))
    assert "peak GPU memory" in text and "70.10 GiB" in text
    checks = {c.metric: c for c in slowdowns(run_values(a, []), run_values(b, []))}
    assert checks["peak_gpu_bytes"].verdict == "slower" and METRICS["peak_gpu_bytes"].threshold == 1.1
    # Without nvidia-smi no column: the CPU table stays as it was.
    no_gpu = cell_perf([r.model_copy(update={"perf": r.perf.model_copy(update={"peak_gpu_bytes": None})}) for r in a], [])
    assert "peak GPU memory" not in "\n".join(perf_markdown([cell.model_copy(update={"perf": no_gpu})]))


def test_settling_waits_until_memory_is_back_near_its_level(tmp_path):
    info = tmp_path / "meminfo"
    meminfo(info, 100 * 2**20)  # 100 GiB before the previous boot
    assert mem_available(str(info)) == 100 * GIB
    meminfo(info, 60 * 2**20)  # the previous server's memory not yet given back
    calls = []

    def wait(s: float) -> None:  # the host gives it back while the bench waits
        calls.append(s)
        if len(calls) == 3:
            meminfo(info, 97 * 2**20)

    done = settle_memory(100 * GIB, meminfo=str(info), wait=wait, timeout_s=60)
    assert done.settled and len(calls) == 3 and done.available_bytes == 97 * GIB
    assert "back near 95.0 GiB" in done.text()


def test_settling_gives_up_at_its_bound_and_says_so(tmp_path):
    info = tmp_path / "meminfo"
    meminfo(info, 50 * 2**20)
    now = [0.0]
    done = settle_memory(100 * GIB, meminfo=str(info), timeout_s=10, poll_s=1,
                         clock=lambda: now[0], wait=lambda s: now.__setitem__(0, now[0] + s))
    assert not done.settled and done.waited_s == 10 and "NOT back" in done.text()


def test_caches_are_dropped_only_when_configured_and_root(tmp_path, monkeypatch):
    info, drop = tmp_path / "meminfo", tmp_path / "drop_caches"
    meminfo(info, 100 * 2**20)
    drop.write_text("0\n")
    done = settle_memory(100 * GIB, meminfo=str(info), drop=True, drop_path=str(drop))
    assert done.dropped_caches == (os.geteuid() == 0)
    assert drop.read_text() == ("3\n" if os.geteuid() == 0 else "0\n")
    monkeypatch.setattr(memory.os, "geteuid", lambda: 1000)
    drop.write_text("0\n")
    assert not settle_memory(100 * GIB, meminfo=str(info), drop=True, drop_path=str(drop)).dropped_caches
    assert drop.read_text() == "0\n"


def test_the_runner_settles_between_fresh_servers_and_records_the_wait(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    meminfo(info, 100 * 2**20)
    monkeypatch.setenv("REGBENCH_MEMINFO", str(info))
    monkeypatch.setenv("REGBENCH_SETTLE_TIMEOUT_S", "30")

    class Launcher:  # what the runner keys its settler by: one per bench run
        pass

    launcher, said = Launcher(), []
    _settle(launcher, tmp_path / "run1", said.append)  # the first server: nothing to wait for
    assert said == [] and not (tmp_path / "run1" / "memory-settle.json").exists()
    meminfo(info, 50 * 2**20)  # the first server's memory still held
    released = threading.Event()

    def give_back() -> None:
        released.wait(30)
        meminfo(info, 99 * 2**20)

    t = threading.Thread(target=give_back)
    t.start()
    original = memory.mem_available

    def watched(path: str = memory.MEMINFO) -> int | None:
        value = original(path)
        if value is not None and value < 90 * GIB:
            released.set()  # the bench is waiting: now the host gives the memory back
        return value

    monkeypatch.setattr(memory, "mem_available", watched)
    _settle(launcher, tmp_path / "run2", said.append)
    t.join(30)
    record = json.loads((tmp_path / "run2" / "memory-settle.json").read_text())
    assert record["settled"] and record["available_bytes"] == 99 * GIB and record["target_bytes"] == 95 * GIB
    assert said and said[0].startswith("memory settle: MemAvailable back")
    assert isinstance(Settler().timeout_s, float)
