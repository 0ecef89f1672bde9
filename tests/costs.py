"""What each test file costs, in seconds and in vLLM boots: a pytest plugin (tests/conftest.py
registers it).

A thread in each pytest process looks at the machine's processes once a second and counts every
vLLM API server (`vllm.entrypoints.cli.main serve` that loads torch: the stand-in vllm package of
the fast tests never does) that this process started: a descendant of it (local servers, the
bench's or a test's own), one whose run folder (the bench's REGBENCH_RUN_DIR label) lies under
this process's temporary folder (Slurm jobs, started by slurmd), or a container whose bench (its
`org.regbench.owner` label) descends from it. A boot lasts tens of seconds, so a poll a second
misses none. The counts go to the controller with the reports (pytest-xdist) and are printed per
file at the end, beside the slowest tests, with the seconds of each file's tests (setup and
teardown included), and written to results/test-costs.json. tests/durations.json is such a
file, recorded from a whole run: the order in which tests/conftest.py hands the files out.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from pathlib import Path

import psutil
import pytest

_SERVE = ("vllm.entrypoints.cli.main", "serve")
_CONTAINER = re.compile(r"/docker[/-]([0-9a-f]{64})")
_PROPERTY = "vllm_boots"


def _is_server(cmdline: list[str]) -> bool:
    return _SERVE[0] in cmdline and _SERVE[1] in cmdline


class BootCounter:
    def __init__(self, basetemp: Path):
        self.me = os.getpid()
        self.basetemp = str(basetemp)
        self.current: str | None = None
        self.counts: Counter[str] = Counter()
        self._seen: set[tuple[int, float]] = set()
        self._pending: dict[tuple[int, float], str] = {}  # ours, not yet seen to load torch: file
        self._owners: dict[str, bool] = {}
        self._lock = threading.Lock()  # the watcher's polls and the end-of-test poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="boot-counter")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def take(self, file: str) -> int:
        with self._lock:
            return self.counts.pop(file, 0)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        current = self.current
        if current is None:
            return
        for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
            key = (p.info["pid"], p.info["create_time"] or 0.0)
            if key in self._seen or not _is_server(p.info["cmdline"] or []):
                continue
            self._seen.add(key)
            try:
                if self._ours(p):
                    self._pending[key] = current
            except psutil.Error:
                pass
        for key, file in list(self._pending.items()):
            try:
                maps = Path(f"/proc/{key[0]}/maps").read_text()
            except OSError:
                del self._pending[key]  # gone before it loaded torch: no vLLM boot
                continue
            if "libtorch" in maps:
                self.counts[file] += 1
                del self._pending[key]

    def _descends(self, p: psutil.Process) -> bool:
        return any(a.pid == self.me for a in p.parents())

    def _ours(self, p: psutil.Process) -> bool:
        if self._descends(p):
            return True
        run_dir = p.environ().get("REGBENCH_RUN_DIR", "")
        if run_dir.startswith(self.basetemp):
            return True
        match = _CONTAINER.search(Path(f"/proc/{p.pid}/cgroup").read_text())
        return match is not None and self._container_ours(match.group(1))

    def _container_ours(self, container_id: str) -> bool:
        if container_id not in self._owners:
            import docker

            try:
                labels = docker.from_env().containers.get(container_id).labels or {}
                owner = int(labels.get("org.regbench.owner", "::").split(":")[1])
                self._owners[container_id] = self._descends(psutil.Process(owner))
            except (docker.errors.DockerException, ValueError, psutil.Error):
                self._owners[container_id] = False
        return self._owners[container_id]


_counter: BootCounter | None = None
_boots: Counter[str] = Counter()
_seconds: Counter[str] = Counter()
COSTS = Path(__file__).resolve().parent.parent / "results" / "test-costs.json"


def pytest_sessionstart(session: pytest.Session) -> None:
    global _counter
    _counter = BootCounter(session.config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _counter is not None:
        _counter.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _counter is not None:
        _counter.current = item.location[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if _counter is not None and report.when == "teardown":
        _counter.poll()  # a server that lived less than a poll's interval is still seen
        report.user_properties.append((_PROPERTY, _counter.take(item.location[0])))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file = report.nodeid.split("::")[0]
    _seconds[file] += report.duration
    for name, value in report.user_properties:
        if name == _PROPERTY:
            _boots[file] += value


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if hasattr(config, "workerinput") or not _seconds:
        return
    costs = {f: {"seconds": round(_seconds[f], 1), "boots": _boots[f]}
             for f in sorted(_seconds, key=lambda f: -_seconds[f])}
    terminalreporter.section(f"cost per test file: {sum(_boots.values())} vLLM boots, "
                             f"{sum(_seconds.values()) / 60:.1f} min of tests")
    terminalreporter.write_line(f"{'seconds':>8} {'boots':>5}  file")
    for file, c in costs.items():
        if c["seconds"] >= 5 or c["boots"]:
            terminalreporter.write_line(f"{c['seconds']:8.1f} {c['boots']:5d}  {file}")
    COSTS.parent.mkdir(exist_ok=True)
    COSTS.write_text(json.dumps(costs, indent=1))
