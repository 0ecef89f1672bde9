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

from bench.core.config import parse_config
from bench.core.matrix import expand
from bench.core.perf import METRICS, cell_perf, run_values, slowdowns
from bench.core.records import CellSummary, RunPerf, RunRecord, ServerOutcome
from bench.core.verdicts import NOT_RUNNABLE
from bench.report.perf import perf_markdown
from bench.runner import _settle, run_matrix
from bench.serve import memory
from bench.serve.memory import (
    Settler,
    boot_room,
    gpu_bytes,
    gpu_memory_utilization,
    listed_without_figure,
    mem_available,
    parse_compute_apps,
    read_meminfo,
    settle_memory,
)
from bench.store.results import ResultsDir

from .support import ScriptedLauncher

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


MEMINFO = Path(__file__).resolve().parent / "data" / "meminfo"  # a real layout, GB10 figures: README.md there


def unified_matrix(minimal: dict, utilization: str | None) -> dict:
    minimal["exclude"] = [{"load_format": "runai_streamer"}]
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    minimal["platforms"], minimal["profiles"] = ["uma"], [{"name": "uma", "unified_memory": True}]
    if utilization is not None:
        minimal["server"] = {"args": ["--gpu-memory-utilization", utilization]}
    return minimal


def test_the_utilization_a_server_asks_for_is_read_as_vllms_parser_reads_it():
    assert gpu_memory_utilization(["serve", "m"]) == 0.9  # vLLM's default
    assert gpu_memory_utilization(["--gpu-memory-utilization", "0.7", "--gpu-memory-utilization=0.5"]) == 0.5
    assert gpu_memory_utilization(["--gpu_memory_utilization", "0.6"]) == 0.6
    assert gpu_memory_utilization(["--gpu-memory-utilization", "lots"]) == 0.9


def test_a_real_meminfo_layout_is_read_in_bytes():
    info = read_meminfo(str(MEMINFO / "gb10-refused"))
    assert info["MemTotal"] == 127600748 * 1024 and info["MemAvailable"] == 59063644 * 1024
    assert info["HugePages_Total"] == 0  # a count, no unit
    room = boot_room(0.7, str(MEMINFO / "gb10-refused"))
    assert room is not None and room.short and room.needed_bytes == int(0.7 * 127600748 * 1024)


def _run_unified_with(meminfo: str, tmp_path, minimal, monkeypatch):
    """One run of a unified-memory cell at --gpu-memory-utilization 0.7 on a host whose
    /proc/meminfo is `meminfo` (tests/data/meminfo), no settling wait."""
    monkeypatch.setenv("REGBENCH_MEMINFO", str(MEMINFO / meminfo))
    monkeypatch.setenv("REGBENCH_SETTLE_TIMEOUT_S", "0")
    cfg = parse_config(unified_matrix(minimal, "0.7"))
    results = ResultsDir.create(tmp_path, "r", cfg)
    launcher = ScriptedLauncher(["ok"])
    summary = run_matrix(cfg, expand(cfg), results, launcher=launcher).summary
    (run,) = results.runs()
    return results, launcher, summary, run


def test_a_server_vllm_would_refuse_for_memory_is_not_started_and_is_not_runnable(tmp_path, minimal, monkeypatch):
    # GB10 as vLLM 0.24.0 found it when it refused to start (MemAvailable 56.3 GiB, 32 GiB of it
    # page cache), and the 0.7 of configs/dgx-spark.yaml: 85.2 GiB asked for. Without the check
    # the bench would start the server, and vLLM's refusal would read as a boot failure.
    results, launcher, summary, run = _run_unified_with("gb10-refused", tmp_path, minimal, monkeypatch)
    assert launcher.requests == 0 and run.server.boot_s is None
    error = run.server.start_error or ""
    assert error.startswith(NOT_RUNNABLE) and "MemAvailable" in error and "56.3 GiB" in error
    assert "0.7 × 121.7 GiB = 85.2 GiB" in error and "drop_caches" in error
    assert [c.reasons for c in summary.cells] == [{"not_runnable": 1}]
    settle = json.loads((results.run_dir(run.cell_id, 1) / "memory-settle.json").read_text())
    assert settle["refused"] == error and settle["needed_bytes"] == int(0.7 * 127600748 * 1024)


def test_page_cache_that_vllm_counts_as_free_does_not_hold_a_boot_back(tmp_path, minimal, monkeypatch):
    # 80 GiB of page cache: MemFree (26.5 GiB) is short of the 85.2 GiB, MemAvailable (110 GiB),
    # which vLLM reads on an integrated GPU, is not: the server starts.
    _, launcher, summary, run = _run_unified_with("gb10-page-cache", tmp_path, minimal, monkeypatch)
    assert run.server.start_error is None and launcher.requests > 0
    assert summary.cells[0].verdict == "pass"


def test_a_short_host_is_waited_for_and_the_boot_goes_ahead_once_memory_comes_back(tmp_path):
    info = tmp_path / "meminfo"
    layout = (MEMINFO / "gb10-refused").read_text()
    info.write_text(layout)
    calls = []

    def wait(s: float) -> None:  # what held the memory gives it back while the bench waits
        calls.append(s)
        if len(calls) == 2:
            info.write_text(layout.replace("MemAvailable:   59063644 kB", "MemAvailable:   115343360 kB"))

    settler = Settler({"REGBENCH_MEMINFO": str(info), "REGBENCH_SETTLE_TIMEOUT_S": "60"})
    done = settler.before_boot(0.7, wait=wait)
    assert done is not None and done.refused is None and done.settled and len(calls) == 2
    assert done.needed_bytes == int(0.7 * 127600748 * 1024)
    # Short at the bound: the reason not to start it.
    info.write_text(layout)
    now = [0.0]
    done = settle_memory(0, meminfo=str(info), timeout_s=10, poll_s=1, utilization=0.7,
                         clock=lambda: now[0], wait=lambda s: now.__setitem__(0, now[0] + s))
    assert done.refused is not None and done.waited_s == 10 and done.text().startswith(f"memory settle: {NOT_RUNNABLE}")
