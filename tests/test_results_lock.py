"""One bench writes a results folder at a time (bench.store.results.writer_lock): a second one
fails at once, or waits for the first to end however it ends (SIGKILL included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from bench.store.results import FolderBusy, writer_lock

from . import synth
from .support import regbench

HOLD = "import sys; from pathlib import Path; from bench.store.results import writer_lock\n" \
       "with writer_lock(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()"


@pytest.fixture
def holder(tmp_path):
    results = synth.healthy(tmp_path, "r1")
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(results.path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    yield results.path, p
    p.kill()
    p.wait()


def test_a_second_writer_is_refused_and_told_who_holds_the_folder(holder):
    path, p = holder
    with pytest.raises(FolderBusy, match=f"pid {p.pid} on "), writer_lock(path):
        pass


def test_a_waiting_writer_goes_on_once_the_holder_is_killed(holder):
    path, p = holder
    got = threading.Event()

    def wait():
        with writer_lock(path, wait_s=120):
            got.set()

    t = threading.Thread(target=wait)
    t.start()
    assert not got.wait(1.0)  # still held
    os.kill(p.pid, signal.SIGKILL)
    t.join(timeout=130)
    assert got.is_set()


def test_resuming_a_folder_another_bench_writes_fails_before_touching_it(holder):
    path, _p = holder
    before = (path / "runs.jsonl").read_bytes()
    bench = regbench("run", "--resume", str(path))
    out, _ = bench.communicate(timeout=120)
    assert bench.returncode == 2, out
    assert "being written by another regbench" in out
    assert (path / "runs.jsonl").read_bytes() == before
