"""The history database (bench/history/store.py) and `regbench history`, against SQLite and a real
PostgreSQL server alike: ingest is idempotent by run id, concurrent writers neither lose nor
duplicate a run, a run's rows land whole or not at all, the schema is versioned and migrated once,
and the history names the run where a passing cell broke and the last good one before it (or,
with --by image|vllm, the release that broke a cell and the last good one).

Results folders are synthetic (tests/synth.py: the bench's own records, no server); the verdicts
stored are the bench's judge's. PostgreSQL is a cluster of the tests' own (tests/pgserver.py),
started once for the session and stopped at its end; without it these tests skip, or under
CI=true fail."""

from __future__ import annotations

import json
import multiprocessing
import re
import shlex
import statistics
import sys
from pathlib import Path

import pytest

from bench.cli import main as regbench
from bench.core.judge import judge
from bench.core.matrix import expand
from bench.core.perf import METRICS
from bench.core.results import RunPlan
from bench.core.verdicts import Verdict
from bench.history.model import CellPoint, regressions
from bench.history.store import HistoryError, entry_from_folder, open_history
from bench.store.publish import open_results
from bench.store.results import ResultsDir, writer_lock

from . import synth
from .pgserver import binaries, pg_server
from .support import setup_missing

STREAMER_CELL = "m__runai_streamer__cpu__img"
BASELINE_CELL = "m__safetensors__cpu__img"
STORED, ALREADY = 10, 11  # a writer process's exit code: it stored the run / found it there
MIGRATED, NOTHING_TO_DO = 12, 13
# spawn, not fork: each writer is a fresh process with its own connections, as two runners are.
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="session")
def postgres():
    bin_dir = binaries()
    if bin_dir is None:
        setup_missing("PostgreSQL (Debian's postgresql package) is not installed")
    with pg_server(bin_dir) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path: Path) -> str:
    """An empty history database's URL: an SQLite file, or a new database on the real server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'history.sqlite'}"
    return request.getfixturevalue("postgres").new_database()


def started(results: ResultsDir, at: float) -> ResultsDir:
    """The run as if it had started at `at` (synth's runs all start at the same time)."""
    cells = [c.id for c in expand(results.config())]
    results.write_plan(RunPlan(run_id=results.path.name, config_name="t", cells=cells, started_at=at,
                               finished_at=at + 600))
    return results


def cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = regbench(list(args))
    captured = capsys.readouterr()
    # The consoles wrap long lines; the messages are checked as words, not as lines.
    return rc, captured.out, " ".join(captured.err.split())


def ingest_at_once(url: str, folder: str, barrier) -> None:
    """A writer process: reads and judges its folder, waits for the other, then stores."""
    entry = entry_from_folder(Path(folder))
    history = open_history(url)
    barrier.wait(timeout=120)
    stored = history.add(entry)
    history.close()
    sys.exit(STORED if stored else ALREADY)


def open_at_once(url: str, barrier) -> None:
    barrier.wait(timeout=120)
    history = open_history(url)
    history.close()
    sys.exit(MIGRATED if history.migrated else NOTHING_TO_DO)


def at_once(target, *args_per_process: tuple) -> list[int]:
    barrier = SPAWN.Barrier(len(args_per_process))
    processes = [SPAWN.Process(target=target, args=(*args, barrier)) for args in args_per_process]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=180)
    codes = [p.exitcode for p in processes]
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    return sorted(c if c is not None else -1 for c in codes)


def test_ingesting_a_folder_twice_stores_one_run(db, tmp_path, capsys):
    folder = synth.healthy(tmp_path / "results", "20260101-000000-t").path
    rc, out, _ = cli(capsys, "history", "ingest", str(folder), "--history", db)
    assert rc == 0 and f"{folder}: ingested (run 20260101-000000-t)" in out
    rc, out, _ = cli(capsys, "history", "--history", db, "ingest", str(folder))
    assert rc == 0 and f"{folder}: already there (run 20260101-000000-t)" in out
    history = open_history(db)
    try:
        assert [r.run_id for r in history.runs()] == ["20260101-000000-t"]
        assert sorted(c.cell_id for c in history.cells()) == sorted([BASELINE_CELL, STREAMER_CELL])
        assert [(f.image, f.runai_model_streamer, f.vllm) for f in history.fingerprints()] == [("img", "0.17.0", "0.32.0")]
        # The medians are the judge's per-run medians, once per cell and metric.
        summary = judge(open_results(folder).load())
        expected = {(c.cell_id, name, m.run_median) for c in summary.cells for name, m in c.perf.items()}
        assert expected and {(p.cell_id, p.metric, p.median) for p in history.perf()} == expected
    finally:
        history.close()


def test_two_writers_of_the_same_run_store_it_once(db, tmp_path):
    folder = synth.streamer_bug(tmp_path / "results", "20260101-000000-t").path
    codes = at_once(ingest_at_once, (db, str(folder)), (db, str(folder)))
    assert codes == [STORED, ALREADY]
    history = open_history(db)
    try:
        assert [r.run_id for r in history.runs()] == ["20260101-000000-t"]
        assert len(history.cells()) == 2
        assert len(history.fingerprints()) == 1
    finally:
        history.close()


def test_two_writers_of_different_runs_both_land(db, tmp_path):
    a = synth.healthy(tmp_path / "results", "20260101-000000-t").path
    b = synth.streamer_bug(tmp_path / "results", "20260102-000000-t").path
    assert at_once(ingest_at_once, (db, str(a)), (db, str(b))) == [STORED, STORED]
    history = open_history(db)
    try:
        assert sorted(r.run_id for r in history.runs()) == ["20260101-000000-t", "20260102-000000-t"]
        assert len(history.cells()) == 4
    finally:
        history.close()


def test_history_names_the_first_failing_run_and_the_last_good_one(db, tmp_path, capsys):
    root = tmp_path / "results"
    # Run ids in another order than time: the history must follow the start times.
    good = started(synth.healthy(root, "c-nightly-1"), 1_000_000).path
    bad = started(synth.streamer_bug(root, "a-nightly-2"), 2_000_000).path
    fixed = started(synth.healthy(root, "b-nightly-3"), 3_000_000).path
    rc, out, _ = cli(capsys, "history", "ingest", str(fixed), str(good), str(bad), "--history", db)
    assert rc == 0 and out.count("ingested") == 3

    rc, out, said = cli(capsys, "history", "--history", db, "--format", "json")
    assert rc == 0 and said == ""
    view = json.loads(out)
    assert view["schema_version"] == 2
    # `--json`, the spelling before `--format json`: scripts written for it read the same view.
    assert cli(capsys, "history", "--history", db, "--json") == (0, out, "regbench: --json is deprecated; use --format json")
    cells = {c["cell_id"]: c for c in view["cells"]}
    streamer = cells[STREAMER_CELL]
    assert [p["run_id"] for p in streamer["points"]] == ["c-nightly-1", "a-nightly-2", "b-nightly-3"]
    assert [p["verdict"] for p in streamer["points"]] == ["pass", "fail", "pass"]
    assert [(p["failures"], p["runs"]) for p in streamer["points"]] == [(0, 2), (2, 2), (0, 2)]
    assert streamer["points"][1]["interval"][0] > 0.3 and streamer["points"][1]["reasons"]["empty_text"] == 2
    command = shlex.join(["regbench", "bisect", "--config", f"{bad}/config.yaml", "--cell", STREAMER_CELL,
                          "--streamer", "0.16.0..0.17.0", "--good", "0.17.0", "--bad", "0.16.0"])
    assert streamer["regressions"] == [{
        "first_bad": "a-nightly-2", "verdict": "fail", "last_good": "c-nightly-1", "fixed_in": "b-nightly-3",
        "changed": {"runai_model_streamer": ["0.17.0", "0.16.0"]},
        "bisect": [{"change": "runai_model_streamer 0.17.0 → 0.16.0", "command": command, "needs": None}],
        # Two passing starts allow up to 66 %; two failing ones show at least 34 %: neither side settles.
        "good_starts": 2, "bad_failures": 2, "bad_starts": 2, "fixed_starts": 2,
        "good_rules_out": False, "fix_rules_out": False,
    }]
    assert cells[BASELINE_CELL]["regressions"] == []

    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    assert rc == 0
    words = " ".join(out.split())
    assert "first FAIL in a-nightly-2, last good c-nightly-1" in words
    assert "passes again from b-nightly-3" in words
    assert f"narrow runai_model_streamer 0.17.0 → 0.16.0: {command}" in words
    assert BASELINE_CELL not in out
    assert_runs_as_far_as_the_trials(command, STREAMER_CELL, tmp_path)


def assert_runs_as_far_as_the_trials(command: str, cell_id: str, tmp_path: Path) -> None:
    """The printed bisect is one the CLI takes as it stands: its parser accepts every flag, the
    matrix it names loads as `regbench bisect` loads it and holds the cell, and both ends are
    among the releases its range selects (from the index's list, as bisect gets it from pip)."""
    import yaml

    from bench.cli import parser
    from bench.store.matrixfile import load_config
    from bench.versions.trial import find_cell
    from bench.weights.overlays import select_versions

    argv = shlex.split(command)
    assert argv[0] == "regbench"
    args = parser().parse_args(argv[1:])
    assert args.command == "bisect" and args.func.__module__ == "bench.versions.command"
    # synth's model path (/models/m) is on no machine, a real run's is: point it at a folder.
    matrix = yaml.safe_load(Path(args.config).read_text())
    (tmp_path / "model").mkdir()
    matrix["models"][0]["path"] = str(tmp_path / "model")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(matrix))
    assert find_cell(load_config(tmp_path / "config.yaml"), args.cell).id == cell_id
    selected = select_versions(args.streamer, ["0.15.0", "0.16.0", "0.16.1", "0.17.0", "0.17.1"])
    assert selected == ["0.16.0", "0.16.1", "0.17.0"] and {args.good, args.bad} <= set(selected)


def test_a_cell_failing_from_its_first_run_has_no_last_good_run(db, tmp_path, capsys):
    root = tmp_path / "results"
    started(synth.streamer_bug(root, "run-1"), 1_000_000)
    started(synth.streamer_bug(root, "run-2", failing=(1,)), 2_000_000)  # flaky: still broken
    rc, _, _ = cli(capsys, "history", "ingest", str(root / "run-1"), str(root / "run-2"), "--history", db)
    assert rc == 0
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL, "--format", "json")
    (cell,) = json.loads(out)["cells"]
    assert [p["verdict"] for p in cell["points"]] == ["fail", "flaky"]
    assert cell["regressions"] == [{"first_bad": "run-1", "verdict": "fail", "last_good": None, "fixed_in": None,
                                    "changed": {}, "bisect": [], "good_starts": 0, "bad_failures": 3, "bad_starts": 4,
                                    "fixed_starts": 0, "good_rules_out": None, "fix_rules_out": None}]
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    assert "first FAIL in run-1, no good run before it in the history" in " ".join(out.split())


def ingest_nights(db: str, tmp_path: Path, capsys, n: int) -> list[str]:
    """Nights 1..n a day apart, ingested; night 5's servers all half as slow again (synth.timed)."""
    root = tmp_path / "results"
    nights = [f"night-{i}" for i in range(1, n + 1)]
    for i, run_id in enumerate(nights):
        started(synth.timed(root, run_id, slower=1.5 if run_id == "night-5" else 1.0), 1_000_000 * (i + 1))
    rc, _, _ = cli(capsys, "history", "ingest", *(str(root / r) for r in nights), "--history", db)
    assert rc == 0
    return nights


def test_a_slowed_run_is_flagged_against_the_window_of_good_runs_and_a_normal_one_is_not(db, tmp_path, capsys):
    """Four good nights, one whose servers are all half as slow again, then a normal one: the slow
    night is flagged on every timed metric by compare's rule, against the four before it; the
    normal night after it is not (and its window leaves the slow night out)."""
    nights = ingest_nights(db, tmp_path, capsys, 6)
    root = tmp_path / "results"

    history = open_history(db)
    try:
        # One value per fresh server and metric; their median is the cell's stored median.
        values = history.run_values(STREAMER_CELL)
        assert {(v.run_id, v.metric) for v in values if v.run_id == "night-1"} == {
            ("night-1", m) for m in ("boot_s", "latency_s", "throughput_tok_s", "tokens_per_s")}
        for m in history.perf(STREAMER_CELL):
            mine = [v.value for v in values if (v.run_id, v.metric) == (m.run_id, m.metric)]
            assert len(mine) == m.runs == 3 and statistics.median(mine) == pytest.approx(m.median)
    finally:
        history.close()

    rc, out, _ = cli(capsys, "history", "--history", db, "--format", "json")
    assert rc == 0
    view = json.loads(out)
    assert view["window"] == 5
    for cell in view["cells"]:
        flagged = {(s["run_id"], s["check"]["metric"]): s for s in cell["slowdowns"]}
        assert set(flagged) == {("night-5", m) for m in ("boot_s", "latency_s", "throughput_tok_s", "tokens_per_s")}
        for s in flagged.values():
            assert s["window"] == nights[:4]
            check = s["check"]
            assert check["verdict"] == "slower" and check["ci"][0] > check["threshold"] and check["runs"] == [12, 3]
        assert cell["regressions"] == [] and cell["too_few_runs"] == []

    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    words = " ".join(out.split())
    assert f"{STREAMER_CELL}: night-5: boot slower: 40.0 s → 60.0 s, ×1.50 worse" in words
    assert "against 4 good run(s) (night-1 … night-4)" in words
    assert "night-6:" not in words and "night-4:" not in words

    # A window of 2: the last two good nights only; and a night with two servers cannot be told.
    started(synth.timed(root, "night-7", slower=1.5, repeats=2), 7_000_000)
    rc, _, _ = cli(capsys, "history", "ingest", str(root / "night-7"), "--history", db)
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL, "--window", "2", "--format", "json")
    (cell,) = json.loads(out)["cells"]
    assert {tuple(s["window"]) for s in cell["slowdowns"]} == {("night-3", "night-4")}
    assert {s["run_id"] for s in cell["slowdowns"]} == {"night-5"}
    assert cell["too_few_runs"] == ["night-7"]
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    assert "1 run(s) had fewer than 3 fresh servers measuring performance" in " ".join(out.split())
    rc, _, err = cli(capsys, "history", "--history", db, "--window", "0")
    assert rc == 2 and "--window 0: must be at least 1" in err


TIMED = ("boot_s", "latency_s", "throughput_tok_s", "tokens_per_s")


def test_a_threshold_above_the_slowdown_stops_flagging_that_metric_only(db, tmp_path, capsys):
    """`--threshold boot_s=1.6`, above the slow night's ×1.5: the night is no longer flagged on boot
    and still is on the other metrics, at their defaults. The JSON and the trend page state every
    metric's threshold in effect; at the defaults (a threshold given at its default too) neither
    states any."""
    ingest_nights(db, tmp_path, capsys, 5)

    rc, out, _ = cli(capsys, "history", "--history", db, "--threshold", "boot_s=1.6", "--format", "json")
    assert rc == 0
    view = json.loads(out)
    assert view["thresholds"] == {**{name: m.threshold for name, m in METRICS.items()}, "boot_s": 1.6}
    assert len(view["cells"]) == 2
    for cell in view["cells"]:
        flagged = {(s["run_id"], s["check"]["metric"]): s["check"] for s in cell["slowdowns"]}
        assert set(flagged) == {("night-5", m) for m in TIMED if m != "boot_s"}
        assert all(check["threshold"] == METRICS[m].threshold for (_, m), check in flagged.items())
    # The same history at the defaults flags boot too, and states no thresholds.
    for defaults in ([], ["--threshold", "boot_s=1.2"]):
        rc, out, _ = cli(capsys, "history", "--history", db, *defaults, "--format", "json")
        view = json.loads(out)
        assert "thresholds" not in view
        assert {s["check"]["metric"] for c in view["cells"] for s in c["slowdowns"]} == set(TIMED)

    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL, "--threshold", "boot_s=1.6")
    words = " ".join(out.split())
    assert "night-5: boot slower" not in words
    assert "night-5: latency slower:" in words and "threshold ×1.20" in words

    page = tmp_path / "trend.html"
    rc, _, _ = cli(capsys, "history", "--history", db, "--threshold", "boot_s=1.6", "--html", str(page))
    html = page.read_text()
    assert rc == 0 and re.search(r'class="threshold changed" data-metric="boot_s">boot ×1\.60 \(default ×1\.20\)<', html)
    assert re.search(r'class="threshold" data-metric="latency_s">latency ×1\.20<', html)
    assert set(re.findall(r'class="slow-line" data-run="night-5" data-metric="(\w+)"', html)) == set(TIMED) - {"boot_s"}
    rc, _, _ = cli(capsys, "history", "--history", db, "--html", str(page))
    assert rc == 0 and 'class="thresholds"' not in page.read_text()


@pytest.mark.parametrize(("pair", "says"), [
    ("boot_s=0.9", "expected METRIC=RATIO with RATIO > 1"),
    ("nosuch=2", "no metric 'nosuch'; metrics: boot_s,"),
    ("boot_s", "expected METRIC=RATIO with RATIO > 1"),
])
def test_a_bad_threshold_is_exit_2_naming_it(tmp_path, capsys, pair, says):
    """Refused as compare refuses it (the same parser), before the database is read."""
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    open_history(url).close()
    rc, _, err = cli(capsys, "history", "--history", url, "--threshold", "latency_s=1.5", "--threshold", pair)
    assert rc == 2 and f"--threshold {pair!r}: {says}" in err


def test_the_check_across_runs_is_compares_rule_and_a_slow_run_stays_out_of_later_windows():
    """The pure rule on made-up values: a run slower than its window is flagged with exactly the
    check bench.core.perf.slowdown gives; one with too few servers of its own is not checked (but
    its servers count in later windows), a failing run is no window run, and the slow run is kept
    out of the next run's window, so a slowdown that stays is flagged again."""
    from bench.core.perf import slowdown
    from bench.history.model import slowdowns_across

    def timed_point(run_id: str, latency: list[float], verdict: Verdict = Verdict.PASS) -> CellPoint:
        return point(run_id, verdict).model_copy(update={"values": {"latency_s": latency}})

    steady = [0.50, 0.51, 0.49]
    slow = [0.80, 0.82, 0.79]
    points = [timed_point("1", steady), timed_point("2", steady), timed_point("3", [0.52, 0.5]),
              timed_point("4", steady, Verdict.FAIL), timed_point("5", slow), timed_point("6", slow),
              timed_point("7", steady)]
    found = slowdowns_across(points, window=5)
    assert [(s.run_id, s.window) for s in found] == [("5", ["1", "2", "3"]), ("6", ["1", "2", "3"])]
    assert found[0].check == slowdown("latency_s", [*steady, *steady, 0.52, 0.5], slow)
    # A window of 2: the last two good runs before it only.
    assert [s.window for s in slowdowns_across(points, window=2)] == [["2", "3"], ["2", "3"]]


def point(run_id: str, verdict: Verdict, streamer: str = "0.17.0") -> CellPoint:
    return CellPoint(run_id=run_id, started_at=0.0, image="img", vllm="0.32.0", runai_model_streamer=streamer,
                     torch=None, image_digest=None, verdict=verdict, failures=0, runs=2, interval=None, reasons={},
                     signature=None, perf={})


def test_flaky_after_passing_is_a_regression_and_not_run_neither_breaks_nor_mends():
    points = [point("1", Verdict.PASS), point("2", Verdict.NOT_RUN), point("3", Verdict.FLAKY, "0.16.0"),
              point("4", Verdict.NOT_RUN), point("5", Verdict.FAIL), point("6", Verdict.PASS), point("7", Verdict.FAIL)]
    found = regressions(points)
    assert [(r.first_bad, r.verdict, r.last_good, r.fixed_in) for r in found] == [
        ("3", Verdict.FLAKY, "1", "6"), ("7", Verdict.FAIL, "6", None)]
    assert found[0].changed == {"runai_model_streamer": ("0.17.0", "0.16.0")}


def test_a_container_or_vllm_change_names_the_image_bisect_and_what_its_matrix_must_hold():
    """A streamer release in a local image is an overlay: that bisect runs as printed. In a
    container, or for vLLM, only another image changes it: the command is the image axis's, with
    the words to fill in named, never images the history cannot know."""
    digests = {"1": "vllm/vllm-openai@sha256:aaa", "2": "vllm/vllm-openai@sha256:bbb"}

    def at(run_id: str, verdict: Verdict, streamer: str, vllm: str, ref: str | None) -> CellPoint:
        return point(run_id, verdict, streamer).model_copy(update={
            "vllm": vllm, "image_ref": ref, "image_digest": digests[run_id] if ref else None, "source": f"/r/{run_id}"})

    cell = "m__runai_streamer__h200__nightly"
    ref = "vllm/vllm-openai:nightly"
    (r,) = regressions([at("1", Verdict.PASS, "0.17.0", "0.32.0", ref), at("2", Verdict.FAIL, "0.16.0", "0.33.0", ref)],
                       cell)
    (hint,) = r.bisect
    assert hint.change == ("vllm 0.32.0 → 0.33.0, runai_model_streamer 0.17.0 → 0.16.0, image_digest "
                           "vllm/vllm-openai@sha256:aaa → vllm/vllm-openai@sha256:bbb")
    assert hint.command == "regbench bisect --config MATRIX --cell CELL --images OLD,…,NEW --good OLD --bad NEW"
    assert hint.needs is not None
    assert "(vllm/vllm-openai@sha256:aaa) to the first bad run's (vllm/vllm-openai@sha256:bbb)" in hint.needs
    assert "m__runai_streamer__h200__ with any of them" in hint.needs
    # Local: the streamer's own bisect as it runs, and the image axis for vLLM.
    (r,) = regressions([at("1", Verdict.PASS, "0.17.0", "0.32.0", None), at("2", Verdict.FLAKY, "0.16.0", "0.33.0", None)],
                       cell)
    assert [h.change for h in r.bisect] == ["runai_model_streamer 0.17.0 → 0.16.0", "vllm 0.32.0 → 0.33.0"]
    assert r.bisect[0].needs is None and r.bisect[0].command.startswith("regbench bisect --config /r/2/config.yaml ")
    # Nothing in the fingerprints changed: nothing to bisect.
    (r,) = regressions([at("1", Verdict.PASS, "0.17.0", "0.32.0", None), at("2", Verdict.FAIL, "0.17.0", "0.32.0", None)],
                       cell)
    assert r.bisect == []


# One image per release in one run, listed out of order, and the latest release's streamer cell
# failing; a later run where it passes. Names chosen so that text order is not release order.
RELEASES = {"vllm-0.31.0": "0.31.0", "vllm-0.10.0": "0.10.0", "vllm-0.32.0": "0.32.0", "vllm-0.9.0": "0.9.0"}
SERIES = "m__runai_streamer__cpu__*"


def ingest_releases(db: str, tmp_path: Path, capsys) -> Path:
    root = tmp_path / "results"
    started(synth.releases(root, "rel-1", RELEASES, failing=("vllm-0.32.0",)), 1_000_000)
    started(synth.releases(root, "rel-2", {"vllm-0.32.0": "0.32.0"}), 2_000_000)
    rc, out, _ = cli(capsys, "history", "ingest", str(root / "rel-2"), str(root / "rel-1"), "--history", db)
    assert rc == 0 and out.count("ingested") == 2
    return root


@pytest.mark.parametrize("by", ["image", "vllm"])
def test_by_image_and_by_vllm_name_the_release_that_broke_the_cell(db, tmp_path, capsys, by):
    """A series is the cell without its image, its points every (run, image) in release order
    (0.9.0 before 0.10.0, not as text sorts), then start time: the break is named by its first bad
    image and the last good one, and its bisect is the images axis between those two, on the bad
    run's own matrix, which holds both."""
    root = ingest_releases(db, tmp_path, capsys)
    rc, out, _ = cli(capsys, "history", "--history", db, "--by", by, "--format", "json")
    assert rc == 0
    view = json.loads(out)
    assert view["by"] == by
    cells = {c["cell_id"]: c for c in view["cells"]}
    assert set(cells) == {SERIES, "m__safetensors__cpu__*"}
    series = cells[SERIES]
    assert [(p["image"], p["run_id"]) for p in series["points"]] == [
        ("vllm-0.9.0", "rel-1"), ("vllm-0.10.0", "rel-1"), ("vllm-0.31.0", "rel-1"), ("vllm-0.32.0", "rel-1"),
        ("vllm-0.32.0", "rel-2")]
    assert [p["verdict"] for p in series["points"]] == ["pass", "pass", "pass", "fail", "pass"]
    assert series["points"][3]["cell_id"] == "m__runai_streamer__cpu__vllm-0.32.0"
    command = shlex.join(["regbench", "bisect", "--config", f"{root / 'rel-1'}/config.yaml",
                          "--cell", "m__runai_streamer__cpu__vllm-0.32.0", "--images", "vllm-0.31.0,vllm-0.32.0",
                          "--good", "vllm-0.31.0", "--bad", "vllm-0.32.0"])
    assert series["regressions"] == [{
        "first_bad": "rel-1", "first_bad_image": "vllm-0.32.0", "verdict": "fail",
        "last_good": "rel-1", "last_good_image": "vllm-0.31.0", "fixed_in": "rel-2", "fixed_in_image": "vllm-0.32.0",
        "changed": {"vllm": ["0.31.0", "0.32.0"]},
        "bisect": [{"change": "image vllm-0.31.0 → vllm-0.32.0, vllm 0.31.0 → 0.32.0", "command": command,
                    "needs": None}],
        # The stretches in release order: three releases passing twice each, one failing twice.
        "good_starts": 6, "bad_failures": 2, "bad_starts": 2, "fixed_starts": 2,
        "good_rules_out": False, "fix_rules_out": False,
    }]
    assert cells["m__safetensors__cpu__*"]["regressions"] == []

    rc, out, _ = cli(capsys, "history", "--history", db, "--by", by, "--cell", SERIES)
    words = " ".join(out.split())
    if by == "image":
        assert ("first FAIL in vllm-0.32.0 (run rel-1), last good vllm-0.31.0 (run rel-1); changed: vllm 0.31.0 → "
                "0.32.0; passes again from vllm-0.32.0 (run rel-2)") in words
        assert f"{SERIES}, by image version" in words
    else:
        assert ("first FAIL in vLLM 0.32.0 (image vllm-0.32.0, run rel-1), last good vLLM 0.31.0 (image vllm-0.31.0, "
                "run rel-1)") in words
        assert f"{SERIES}, by vLLM version" in words
    assert f"narrow image vllm-0.31.0 → vllm-0.32.0, vllm 0.31.0 → 0.32.0: {command}" in words
    assert_images_bisect_runs_as_far_as_the_trials(command, "m__runai_streamer__cpu__vllm-0.32.0", tmp_path)


def assert_images_bisect_runs_as_far_as_the_trials(command: str, cell_id: str, tmp_path: Path) -> None:
    """The printed images bisect as the CLI takes it: every flag parses, the matrix loads and holds
    the cell, and both ends (and every image listed) are images of that matrix."""
    import yaml

    from bench.cli import parser
    from bench.store.matrixfile import load_config
    from bench.versions.trial import find_cell

    args = parser().parse_args(shlex.split(command)[1:])
    assert args.command == "bisect" and args.streamer is None
    matrix = yaml.safe_load(Path(args.config).read_text())
    (tmp_path / "model").mkdir()
    matrix["models"][0]["path"] = str(tmp_path / "model")  # synth's model path is on no machine
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(matrix))
    config = load_config(tmp_path / "config.yaml")
    assert find_cell(config, args.cell).id == cell_id
    images = args.images.split(",")
    assert set(images) <= {i.name for i in config.images} and {args.good, args.bad} <= set(images)


def test_by_time_is_the_view_it_always_was(db, tmp_path, capsys):
    """The default order: one history per cell id, by start time, and the JSON's points and breaks
    with exactly their old keys (the fields naming a point's image are for the other orders)."""
    ingest_releases(db, tmp_path, capsys)
    rc, out, _ = cli(capsys, "history", "--history", db, "--format", "json")
    view = json.loads(out)
    assert rc == 0 and view["by"] == "time"
    cells = {c["cell_id"]: c for c in view["cells"]}
    assert len(cells) == 2 * len(RELEASES)
    bad = cells["m__runai_streamer__cpu__vllm-0.32.0"]
    assert [p["run_id"] for p in bad["points"]] == ["rel-1", "rel-2"]
    assert "cell_id" not in bad["points"][0] and "too_few_images" not in bad
    assert bad["regressions"] == [{"first_bad": "rel-1", "verdict": "fail", "last_good": None, "fixed_in": "rel-2",
                                   "changed": {}, "bisect": [], "good_starts": 0, "bad_failures": 2, "bad_starts": 2,
                                   "fixed_starts": 2, "good_rules_out": None, "fix_rules_out": False}]


def test_by_needs_a_known_order_and_cell_takes_a_series_or_any_of_its_cells(db, tmp_path, capsys):
    ingest_releases(db, tmp_path, capsys)
    with pytest.raises(SystemExit) as exc:
        regbench(["history", "--history", db, "--by", "digest"])
    assert exc.value.code == 2 and "invalid choice: 'digest'" in capsys.readouterr().err
    for name in (SERIES, "m__runai_streamer__cpu__vllm-0.9.0", "m__runai_streamer__cpu__vllm-0.32.0"):
        rc, out, _ = cli(capsys, "history", "--history", db, "--by", "vllm", "--cell", name, "--format", "json")
        (cell,) = json.loads(out)["cells"]
        assert rc == 0 and cell["cell_id"] == SERIES and len(cell["points"]) == 5
    rc, _, err = cli(capsys, "history", "--history", db, "--by", "image", "--cell", "m__nosuch__cpu__*")
    assert rc == 2 and "--cell m__nosuch__cpu__*: no such cell or series" in err and SERIES in err
    # In time order a series is no cell.
    rc, _, err = cli(capsys, "history", "--history", db, "--cell", SERIES)
    assert rc == 2 and f"--cell {SERIES}: no such cell in the history" in err


def test_a_knob_cell_is_a_series_of_its_own(db, tmp_path, capsys):
    root = tmp_path / "results"
    started(synth.releases(root, "knobs", {"vllm-0.10.0": "0.10.0", "vllm-0.9.0": "0.9.0"}, knobs=("serial",)),
            1_000_000)
    rc, _, _ = cli(capsys, "history", "ingest", str(root / "knobs"), "--history", db)
    assert rc == 0
    rc, out, _ = cli(capsys, "history", "--history", db, "--by", "image", "--format", "json")
    series = {c["cell_id"]: [p["image"] for p in c["points"]] for c in json.loads(out)["cells"]}
    assert series == {"m__runai_streamer__cpu__*": ["vllm-0.9.0", "vllm-0.10.0"],
                      "m__safetensors__cpu__*": ["vllm-0.9.0", "vllm-0.10.0"],
                      "m__safetensors__cpu__*+serial": ["vllm-0.9.0+serial", "vllm-0.10.0+serial"]}
    rc, out, _ = cli(capsys, "history", "--history", db, "--by", "image", "--cell", "m__safetensors__cpu__vllm-0.9.0+serial",
                     "--format", "json")
    assert [c["cell_id"] for c in json.loads(out)["cells"]] == ["m__safetensors__cpu__*+serial"]


def test_release_orders_are_version_aware():
    """Image order: the release number in the reference's tag, else in the name, whatever the
    text around it; names without one after, in natural order. vLLM order: PEP 440, then the
    streamer's, an unknown vLLM last."""
    from bench.history.model import order_key, series_of

    def at(image: str, vllm: str | None = None, ref: str | None = None, streamer: str = "0.17.0",
           t: float = 0.0) -> CellPoint:
        return point("r", Verdict.PASS, streamer).model_copy(update={
            "image": image, "vllm": vllm, "image_ref": ref, "started_at": t})

    images = [at("nightly"), at("img-10"), at("vllm-0.32.0"), at("tagged", ref="vllm/vllm-openai:v0.10.0"),
              at("latest-tag-0.31.0rc1", ref="registry:5000/vllm/vllm-openai:latest"), at("vllm-0.9.0"),
              at("img-9"), at("vllm-0.31.0")]
    assert [p.image for p in sorted(images, key=order_key("image"))] == [
        "vllm-0.9.0", "tagged", "latest-tag-0.31.0rc1", "vllm-0.31.0", "vllm-0.32.0", "img-9", "img-10", "nightly"]
    # A knob's image sorts as its original's.
    assert [p.image for p in sorted([at("vllm-0.10.0+serial"), at("vllm-0.9.0+serial")], key=order_key("image"))] == [
        "vllm-0.9.0+serial", "vllm-0.10.0+serial"]

    versions = [at("a", None), at("b", "0.10.0", streamer="0.17.0"), at("c", "0.10.0", streamer="0.16.0"),
                at("d", "0.9.0", t=2.0), at("e", "0.9.0", t=1.0), at("f", "0.10.0rc1"),
                at("g", "0.11.0.dev12+gabc.cpu")]
    assert [p.image for p in sorted(versions, key=order_key("vllm"))] == ["e", "d", "f", "c", "b", "g", "a"]
    assert series_of("m__lf__cpu__vllm-0.9.0") == series_of("m__lf__cpu__*") == "m__lf__cpu__*"
    assert series_of("m__lf__cpu__vllm-0.9.0+serial") == "m__lf__cpu__*+serial"


def test_an_images_bisect_runs_as_printed_only_where_the_bad_runs_matrix_holds_both_ends():
    """Out of time order, a break between two images names them as the bisect's ends. On the bad
    run's own matrix when it held both (the images of the series between them that it held inside);
    else the placeholders, with the two ends named. A break within one image (another run of it)
    is no images bisect: the fingerprints say what changed, as in time order."""
    def at(run_id: str, image: str, verdict: Verdict, vllm: str) -> CellPoint:
        return point(run_id, verdict).model_copy(update={
            "image": image, "vllm": vllm, "source": f"/r/{run_id}", "cell_id": f"m__runai_streamer__cpu__{image}"})

    points = [at("1", "v-0.31.0", Verdict.PASS, "0.31.0"), at("1", "v-0.31.1", Verdict.NOT_RUN, "0.31.1"),
              at("2", "v-0.31.2", Verdict.NOT_RUN, "0.31.2"), at("1", "v-0.32.0", Verdict.FAIL, "0.32.0")]
    (r,) = regressions(points, "m__runai_streamer__cpu__*", "image", {"1": {"v-0.31.0", "v-0.31.1", "v-0.32.0"}})
    assert (r.first_bad, r.first_bad_image, r.last_good, r.last_good_image) == ("1", "v-0.32.0", "1", "v-0.31.0")
    (hint,) = r.bisect
    assert hint.needs is None and hint.command == (
        "regbench bisect --config /r/1/config.yaml --cell m__runai_streamer__cpu__v-0.32.0 "
        "--images v-0.31.0,v-0.31.1,v-0.32.0 --good v-0.31.0 --bad v-0.32.0")
    # The last good image in another run's matrix only.
    (r,) = regressions(points, "m__runai_streamer__cpu__*", "image", {"1": {"v-0.32.0"}})
    (hint,) = r.bisect
    assert hint.command == ("regbench bisect --config MATRIX --cell CELL --images v-0.31.0,…,v-0.32.0 "
                            "--good v-0.31.0 --bad v-0.32.0")
    assert hint.needs is not None and "(the history has v-0.31.1, v-0.31.2)" in hint.needs
    assert "CELL: m__runai_streamer__cpu__* with any of its images for *" in hint.needs
    # One image, two runs: what its fingerprint says changed, not an images bisect.
    same = [at("1", "v-0.32.0", Verdict.PASS, "0.32.0"),
            at("2", "v-0.32.0", Verdict.FAIL, "0.32.0").model_copy(update={"runai_model_streamer": "0.16.0"})]
    (r,) = regressions(same, "m__runai_streamer__cpu__*", "vllm", {"2": {"v-0.32.0"}})
    assert [h.change for h in r.bisect] == ["runai_model_streamer 0.17.0 → 0.16.0"]
    assert r.bisect[0].command.startswith("regbench bisect --config /r/2/config.yaml --cell m__runai_streamer__cpu__v-0.32.0 ")
    assert r.text() == ("first FAIL in vLLM 0.32.0 (image v-0.32.0, run 2), last good vLLM 0.32.0 (image v-0.32.0, run 1); "
                        "changed: runai_model_streamer 0.17.0 → 0.16.0; not passing since (broken: 0/2 fresh starts "
                        "failed (0–66 %); before: 2 passing fresh start(s) (0–66 %), too few to rule it out)")


def test_the_schema_version_is_recorded_and_reopening_does_not_migrate_again(db):
    first = open_history(db)
    try:
        assert first.migrated == [1, 2]
        assert first.schema_version() == 2
    finally:
        first.close()
    again = open_history(db)
    try:
        assert again.migrated == []
        assert [(v, bool(when)) for v, _, when in again.migrations()] == [(1, True), (2, True)]
    finally:
        again.close()


def test_two_processes_opening_a_new_database_at_once_migrate_it_once(db):
    assert at_once(open_at_once, (db,), (db,)) == [MIGRATED, NOTHING_TO_DO]
    history = open_history(db)
    try:
        assert [v for v, _, _ in history.migrations()] == [1, 2]
    finally:
        history.close()


def test_a_version_1_database_migrates_to_2_and_keeps_its_runs(db, tmp_path, capsys, monkeypatch):
    """A database made by the regbench of schema version 1 (its migrations only: released ones
    never change), with a run in it, opened by this one: version 2's table is added, the old run
    reads as before (without per-server values), new runs carry them, and the view takes both."""
    import bench.history.store as store

    root = tmp_path / "results"
    old = started(synth.timed(root, "old"), 1_000_000).path
    new = started(synth.timed(root, "new", slower=1.5), 2_000_000).path
    with monkeypatch.context() as v1:
        v1.setattr(store, "MIGRATIONS", store.MIGRATIONS[:1])
        v1.setattr(store, "SCHEMA_VERSION", 1)
        history = open_history(db)
        try:
            assert history.migrated == [1]
            # What version 1's ingest stored: no per-server values, its table did not exist.
            assert history.add(entry_from_folder(old).model_copy(update={"values": []})) is True
        finally:
            history.close()

    history = open_history(db)
    try:
        assert history.migrated == [2] and history.schema_version() == 2
        assert [r.run_id for r in history.runs()] == ["old"] and len(history.cells()) == 2
        assert {p.run_id for p in history.perf()} == {"old"} and history.run_values() == []
    finally:
        history.close()
    rc, _, _ = cli(capsys, "history", "ingest", str(new), "--history", db)
    assert rc == 0
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL, "--format", "json")
    (cell,) = json.loads(out)["cells"]
    assert [(p["run_id"], sorted(p["values"])) for p in cell["points"]] == [
        ("old", []), ("new", ["boot_s", "latency_s", "throughput_tok_s", "tokens_per_s"])]
    assert cell["slowdowns"] == []  # the old run has no values to be a window with

    with monkeypatch.context() as v1:  # and version 1's regbench, meeting it now, asks for an upgrade
        v1.setattr(store, "MIGRATIONS", store.MIGRATIONS[:1])
        v1.setattr(store, "SCHEMA_VERSION", 1)
        with pytest.raises(HistoryError, match="schema version 2 is newer than this regbench's \\(1\\)"):
            open_history(db)


def test_a_run_is_stored_whole_or_not_at_all(db, tmp_path):
    entry = entry_from_folder(synth.healthy(tmp_path / "results", "20260101-000000-t").path)
    broken = entry.model_copy(update={"cells": [*entry.cells, entry.cells[0]]})  # a cell twice: the insert fails
    history = open_history(db)
    try:
        with pytest.raises(HistoryError, match="cannot store run 20260101-000000-t"):
            history.add(broken)
        assert history.runs() == [] and history.cells() == [] and history.fingerprints() == []
        assert history.add(entry) is True
        assert len(history.cells()) == 2
    finally:
        history.close()


def test_an_unreachable_database_is_a_usage_error(capsys):
    from .support import free_port

    rc, _, err = cli(capsys, "history", "--history", f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/x")
    assert rc == 2
    assert "history database postgresql+psycopg://nobody@127.0.0.1:" in err and "cannot open it" in err
    assert "Traceback" not in err
    rc, _, err = cli(capsys, "history", "--history", "not a url")
    assert rc == 2 and "not a database URL" in err


def test_the_view_of_no_history_and_of_an_unknown_cell_are_usage_errors(tmp_path, capsys):
    rc, _, err = cli(capsys, "history", "--results", str(tmp_path / "results"))
    assert rc == 2 and "no history at" in err and "regbench history ingest" in err
    assert not (tmp_path / "results" / "history.sqlite").exists()
    folder = synth.healthy(tmp_path / "results", "20260101-000000-t").path
    # Without --history: the database beside the run folders.
    rc, _, _ = cli(capsys, "history", "ingest", str(folder))
    assert rc == 0 and (tmp_path / "results" / "history.sqlite").is_file()
    rc, _, err = cli(capsys, "history", "--results", str(tmp_path / "results"), "--cell", "nope")
    assert rc == 2 and "--cell nope: no such cell" in err and STREAMER_CELL in err


def test_a_folder_that_is_no_run_is_reported_and_the_others_still_ingested(tmp_path, capsys):
    root = tmp_path / "results"
    folder = synth.healthy(root, "20260101-000000-t").path
    (root / "stray").mkdir()
    rc, out, err = cli(capsys, "history", "ingest", str(root / "stray"), str(folder))
    assert rc == 2
    assert "stray: not ingested" in err and "not a regbench results directory" in err
    assert f"{folder}: ingested" in out


def test_a_run_still_being_written_is_not_ingested(tmp_path, capsys):
    folder = synth.healthy(tmp_path / "results", "20260101-000000-t").path
    db = f"sqlite:///{tmp_path / 'history.sqlite'}"
    with writer_lock(folder):  # as `regbench run` holds it while the run goes on
        rc, _, err = cli(capsys, "history", "ingest", str(folder), "--history", db)
    assert rc == 2 and "being written by a bench still running" in err
    history = open_history(db)
    try:
        assert history.runs() == []
    finally:
        history.close()
    rc, out, _ = cli(capsys, "history", "ingest", str(folder), "--history", db)
    assert rc == 0 and "ingested" in out


def test_a_finished_run_records_itself_and_a_slice_waits_for_its_merge(tmp_path):
    """`regbench run` on the fake vLLM (tests/data/fakevllm): the whole run lands in the results
    root's history.sqlite by itself; --no-history and a --cell slice do not."""
    import os
    import subprocess
    import sys

    import yaml

    from .support import ROOT

    model = tmp_path / "model"
    model.mkdir()
    matrix = {
        "name": "recorded", "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "safetensors"}],
        "images": [{"name": "fake", "python": sys.executable,
                    "pythonpath": [str(Path(__file__).parent / "data" / "fakevllm")]}],
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}], "request_timeout_s": 60},
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5}, "reference_text": {"enabled": False},
        "preflight": False,
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix))
    root = tmp_path / "r"

    def run(run_id: str, *extra: str) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "bench", "run", str(path), "--results", str(root), "--run-id", run_id,
                            *extra], cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert p.returncode == 0, p.stdout + p.stderr
        return p

    assert "history: recorded in" in run("first").stderr
    run("quiet", "--no-history")
    sliced = run("slice", "--cell", "m__safetensors__cpu__fake")
    assert "history:" not in sliced.stderr
    shown = subprocess.run([sys.executable, "-m", "bench", "history", "--results", str(root), "--format", "json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert '"first"' in shown.stdout and '"quiet"' not in shown.stdout and '"slice"' not in shown.stdout


def test_a_bisect_trial_is_its_one_cell_and_a_knobs_cell_is_refused_by_name(tmp_path):
    """What the printed bisect commands run on: a matrix with an invariance block tries the cell
    alone (no knob cells beside it, whose verdicts would be taken for the cell's); a knob's cell,
    judged against another cell, is refused naming that cell, and the history prints it no bisect."""
    from bench.core.config import parse_config
    from bench.history.model import bisect_hints
    from bench.versions.model import Plan
    from bench.versions.trial import CellTrial, VersionsError, find_cell

    spec = synth.matrix(images=("img",))
    spec.update(invariance={"knobs": ["serial"], "cells": [{"load_format": "runai_streamer"}]})
    config = parse_config(spec)
    cell = find_cell(config, STREAMER_CELL)
    trial = CellTrial(config=config, cell=cell, axis="image", cache=tmp_path)
    tried = expand(trial.trial_config(config.images[0], Plan(rate=0.8, confidence=0.95)))
    assert [c.id for c in tried] == [STREAMER_CELL]
    with pytest.raises(VersionsError, match=rf"judged against {STREAMER_CELL}"):
        find_cell(config, f"{STREAMER_CELL}+serial")
    good = point("g", Verdict.PASS, "0.17.0")
    bad = point("b", Verdict.FAIL, "0.16.0").model_copy(update={"source": str(tmp_path / "b")})
    changed = {"runai_model_streamer": ("0.17.0", "0.16.0")}
    assert bisect_hints(f"{STREAMER_CELL}+serial", good, bad, changed) == []
    assert bisect_hints(STREAMER_CELL, good, bad, changed) != []


def test_a_break_says_whether_the_passes_around_it_rule_its_failure_rate_out():
    """Flaky-aware: a break is read with the intervals of its stretches, not one run each. Twenty
    passing starts before a run failing 5 of 5 rule its rate out (0–16 % against 68–100 %); two
    passing starts do not rule out a flaky 1 in 8 (0–66 % against 2–47 %); runs that did not run
    count for no stretch."""
    def at(run_id: str, verdict: Verdict, failures: int, runs: int) -> CellPoint:
        return point(run_id, verdict).model_copy(update={"failures": failures, "runs": runs})

    [solid] = regressions([at("1", Verdict.PASS, 0, 10), at("2", Verdict.NOT_RUN, 0, 0), at("3", Verdict.PASS, 0, 10),
                           at("4", Verdict.FAIL, 5, 5), at("5", Verdict.FAIL, 3, 3), at("6", Verdict.PASS, 0, 10)])
    assert (solid.good_starts, solid.bad_failures, solid.bad_starts, solid.fixed_starts) == (20, 8, 8, 10)
    assert solid.good_rules_out is True and solid.fix_rules_out is True
    assert "broken: 8/8 fresh starts failed (68–100 %); before: 20 passing fresh start(s) (0–16 %), rule that " \
           "rate out; since the fix: 10 passing fresh start(s) (0–28 %), rule that rate out" in solid.text()

    first, second = regressions([at("1", Verdict.PASS, 0, 2), at("2", Verdict.FLAKY, 1, 8), at("3", Verdict.PASS, 0, 2),
                                 at("4", Verdict.FLAKY, 2, 8)])
    assert (first.good_starts, first.bad_failures, first.bad_starts, first.fixed_starts) == (2, 1, 8, 2)
    assert first.good_rules_out is False and first.fix_rules_out is False
    assert "too few to rule it out" in first.text()
    # The second break: the short passing stretch between them is all it has before it.
    assert (second.good_starts, second.bad_failures, second.bad_starts, second.fixed_in) == (2, 2, 8, None)
    assert second.fix_rules_out is None and "since the fix" not in second.text()
    [never] = regressions([at("1", Verdict.FAIL, 2, 2)])
    assert never.good_rules_out is None and "before:" not in never.text()
