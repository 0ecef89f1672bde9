"""The history database (bench/store/history.py) and `regbench history`, against SQLite and a real
PostgreSQL server alike: ingest is idempotent by run id, concurrent writers neither lose nor
duplicate a run, a run's rows land whole or not at all, the schema is versioned and migrated once,
and the history names the run where a passing cell broke and the last good one before it.

Results folders are synthetic (tests/synth.py: the bench's own records, no server); the verdicts
stored are the bench's judge's. PostgreSQL is a cluster of the tests' own (tests/pgserver.py),
started once for the session and stopped at its end; without it these tests skip, or under
CI=true fail."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest

from bench.cli import main as regbench
from bench.core.history import CellPoint, regressions
from bench.core.judge import judge
from bench.core.matrix import expand
from bench.core.results import RunPlan
from bench.core.verdicts import Verdict
from bench.store.history import HistoryError, entry_from_folder, open_history
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

    rc, out, _ = cli(capsys, "history", "--history", db, "--json")
    assert rc == 0
    view = json.loads(out)
    assert view["schema_version"] == 1
    cells = {c["cell_id"]: c for c in view["cells"]}
    streamer = cells[STREAMER_CELL]
    assert [p["run_id"] for p in streamer["points"]] == ["c-nightly-1", "a-nightly-2", "b-nightly-3"]
    assert [p["verdict"] for p in streamer["points"]] == ["pass", "fail", "pass"]
    assert [(p["failures"], p["runs"]) for p in streamer["points"]] == [(0, 2), (2, 2), (0, 2)]
    assert streamer["points"][1]["interval"][0] > 0.3 and streamer["points"][1]["reasons"]["empty_text"] == 2
    assert streamer["regressions"] == [{
        "first_bad": "a-nightly-2", "verdict": "fail", "last_good": "c-nightly-1", "fixed_in": "b-nightly-3",
        "changed": {"runai_model_streamer": ["0.17.0", "0.16.0"]},
    }]
    assert cells[BASELINE_CELL]["regressions"] == []

    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    assert rc == 0
    assert "first FAIL in a-nightly-2, last good c-nightly-1" in " ".join(out.split())
    assert "passes again from b-nightly-3" in " ".join(out.split())
    assert BASELINE_CELL not in out


def test_a_cell_failing_from_its_first_run_has_no_last_good_run(db, tmp_path, capsys):
    root = tmp_path / "results"
    started(synth.streamer_bug(root, "run-1"), 1_000_000)
    started(synth.streamer_bug(root, "run-2", failing=(1,)), 2_000_000)  # flaky: still broken
    rc, _, _ = cli(capsys, "history", "ingest", str(root / "run-1"), str(root / "run-2"), "--history", db)
    assert rc == 0
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL, "--json")
    (cell,) = json.loads(out)["cells"]
    assert [p["verdict"] for p in cell["points"]] == ["fail", "flaky"]
    assert cell["regressions"] == [{"first_bad": "run-1", "verdict": "fail", "last_good": None, "fixed_in": None,
                                    "changed": {}}]
    rc, out, _ = cli(capsys, "history", "--history", db, "--cell", STREAMER_CELL)
    assert "first FAIL in run-1, no good run before it in the history" in " ".join(out.split())


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


def test_the_schema_version_is_recorded_and_reopening_does_not_migrate_again(db):
    first = open_history(db)
    try:
        assert first.migrated == [1]
        assert first.schema_version() == 1
    finally:
        first.close()
    again = open_history(db)
    try:
        assert again.migrated == []
        assert [(v, bool(when)) for v, _, when in again.migrations()] == [(1, True)]
    finally:
        again.close()


def test_two_processes_opening_a_new_database_at_once_migrate_it_once(db):
    assert at_once(open_at_once, (db,), (db,)) == [MIGRATED, NOTHING_TO_DO]
    history = open_history(db)
    try:
        assert [v for v, _, _ in history.migrations()] == [1]
    finally:
        history.close()


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
    from .pgserver import _free_port

    rc, _, err = cli(capsys, "history", "--history", f"postgresql+psycopg://nobody@127.0.0.1:{_free_port()}/x")
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
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}], "request_timeout_s": 10},
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
    shown = subprocess.run([sys.executable, "-m", "bench", "history", "--results", str(root), "--json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert '"first"' in shown.stdout and '"quiet"' not in shown.stdout and '"slice"' not in shown.stdout
