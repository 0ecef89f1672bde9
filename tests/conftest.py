from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def minimal() -> dict:
    """The smallest valid matrix, as parsed YAML."""
    return {
        "name": "t",
        "models": [{"name": "m", "path": "/models/m"}],
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer"}],
        "images": [{"name": "img", "python": sys.executable}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }


# The fault ledger: every test marked `@pytest.mark.fault("kind")` adds a row with its outcome and
# what it measured (through the `fault` fixture); the session writes them to FAULT_LEDGER, from
# which scripts/fault_table.py makes the table in docs/faults.md. A row is never written by hand.
FAULT_LEDGER = ROOT / "results" / "faults.json"
_fault_rows: list[dict] = []


@pytest.fixture
def fault(request):
    """fault(verdict, records_lost=…, processes_left=…, cases=…): what the bench did about it."""
    measured: dict = {}
    request.node.fault_measured = measured

    def record(verdict: str, *, records_lost: int | None = None, processes_left: int = 0, cases: int = 1) -> None:
        measured.update(verdict=verdict, records_lost=records_lost, processes_left=processes_left, cases=cases)

    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("fault")
    if marker is None or report.when != "call":
        return
    measured = getattr(item, "fault_measured", {})
    # Carried on the report, so that under pytest-xdist the row reaches the controller, which
    # alone writes the ledger.
    report.user_properties.append(("fault_row", {
        "kind": marker.args[0], "test": item.nodeid, "survived": report.passed and bool(measured), **measured,
    }))


def pytest_runtest_logreport(report):
    _fault_rows.extend(value for name, value in report.user_properties if name == "fault_row")


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its rows went to the controller with its reports
    if _fault_rows:
        FAULT_LEDGER.parent.mkdir(exist_ok=True)
        FAULT_LEDGER.write_text(json.dumps(sorted(_fault_rows, key=lambda r: (r["kind"], r["test"])), indent=1))


# --- tiers and the order of the test files ----------------------------------------------------------
# The landing tier (scripts/test.sh, what CI runs) leaves out the tests marked `full`: the big
# tables measured in full (scripts/test.sh --full), whose recorded ledgers in docs/data/ the
# landing tier re-checks instead. They are deselected, not skipped: nothing of them runs.
DURATIONS = ROOT / "tests" / "durations.json"


def pytest_configure(config):
    from . import costs

    config.pluginmanager.register(costs, "regbench-costs")
    # Two pytest-xdist workers run two vLLM servers at once, and a CPU server takes every core it
    # is allowed: two of them spinning their OpenMP threads on the same two cores ran the real
    # model five times slower than one alone (measured: a SmolLM2 workload of 26 s took 128 s).
    # So each worker, and every process it starts, is allowed one core of its own, as
    # `regbench run --devices` gives each device slot one: gw0 core 0, gw1 core 1. vLLM sizes
    # its threads by the allowed cores in either process layout; a server given devices of its
    # own (`--devices`) is still moved to them by taskset.
    worker = getattr(config, "workerinput", {}).get("workerid", "")
    cpus = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="the full tier: also the tests marked `full`")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--full"):
        left = [i for i in items if i.get_closest_marker("full") is not None]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [i for i in items if i.get_closest_marker("full") is None]
    # The longest files first (their measured seconds, tests/durations.json), so that pytest-xdist
    # (--dist loadfile --no-loadscope-reorder) hands them out longest first and the two workers
    # finish together; a file never measured counts as quick.
    costs = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda i: -costs.get(i.location[0], {}).get("seconds", 0.0))
