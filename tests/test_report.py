from __future__ import annotations

import json

import pytest
import yaml

from bench.cli import main
from bench.core.config import parse_config, with_repeats
from bench.core.records import RequestRecord, RunRecord, ServerOutcome
from bench.store.results import ResultsDir, log_tail, read_log


def outcome() -> ServerOutcome:
    return ServerOutcome(command=["x"], port=1, log_path="l", started_at=0.0, boot_s=1.0, exit_code=0)


def test_report_is_derived_from_the_jsonl_alone(tmp_path, minimal):
    minimal["repeats"] = 2
    config = parse_config(minimal)
    results = ResultsDir.create(tmp_path, "run1", config)
    base, cell = "m__safetensors__cpu__img", "m__runai_streamer__cpu__img"
    for repeat in (1, 2):
        # Repeat 1 of the cell: the seed bug's empty text; repeat 2: text, but another first token.
        broken = ([5] * 128, "") if repeat == 1 else ([5, *range(1, 128)], "x" * 300)
        for cid, (ids, text) in ((base, (list(range(128)), "x" * 300)), (cell, broken)):
            results.add_request(RequestRecord(
                cell_id=cid, repeat=repeat, prompt_id="p", api="completion", stream=False, started_at=0,
                latency_s=0.1, status=200, text=text, token_ids=ids, completion_tokens=128, finish_reason="length"))
        results.add_run(RunRecord(cell_id=base, repeat=repeat, server=outcome()))
        results.add_run(RunRecord(cell_id=cell, repeat=repeat, server=outcome()))

    assert main(["report", str(results.path)]) == 1
    summary = json.loads((results.path / "summary.json").read_text())
    verdicts = {c["cell_id"]: (c["verdict"], c["failures"], c["runs"]) for c in summary["cells"]}
    # Repeat 2 had no run-level finding but diverges from the baseline at token 0: still a failure.
    assert verdicts == {base: ("pass", 0, 2), cell: ("fail", 2, 2)}
    md = (results.path / "summary.md").read_text()
    # failures/runs with the Wilson 95 % interval of the failure rate.
    assert (f"| `{cell}` | **FAIL** | 2/2 | 34–100 % | degenerate (1/2), divergence (2/2), empty_text (1/2), "
            "usage_text_mismatch (1/2), first divergence at token 0 |") in md
    assert f"| `{base}` | **PASS** | 0/2 | 0–66 % | - | - | (is baseline) |" in md


def test_report_on_a_folder_that_is_not_results_is_exit_2(tmp_path):
    assert main(["report", str(tmp_path)]) == 2


def test_config_as_run_round_trips(tmp_path, minimal):
    config = parse_config(minimal)
    results = ResultsDir.create(tmp_path, "r", config)
    assert results.config() == config
    assert yaml.safe_load((results.path / "config.yaml").read_text())["name"] == "t"


def test_logs_are_read_leniently_from_an_offset(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"before\n" + b"\xff\xfe after\n" + b"line\n" * 50)
    assert read_log(log, 7).startswith("\ufffd\ufffd after")
    assert log_tail(log, 3) == "line\nline\nline"
    assert read_log(tmp_path / "missing") == ""


def _request(cell: str, repeat: int) -> RequestRecord:
    return RequestRecord(cell_id=cell, repeat=repeat, prompt_id="p", api="completion", stream=False, started_at=0,
                         latency_s=0.1, status=200, text="x", token_ids=[1], completion_tokens=1, finish_reason="length")


@pytest.mark.fault("half-written last line in the results")
def test_a_half_written_last_line_is_dropped_with_a_warning(tmp_path, minimal, fault):
    results = ResultsDir.create(tmp_path, "r", parse_config(minimal))
    results.add_request(_request("c", 1))
    with open(results.path / "requests.jsonl", "a") as f:
        f.write('{"type": "request", "cell_id": "c", "rep')  # the writer was killed here
    assert [q.cell_id for q in results.requests()] == ["c"]
    assert results.warnings and "half-written" in results.warnings[0]
    fault("dropped with a warning; the finished record is read", records_lost=1 - len(results.requests()))


def test_a_damaged_line_in_the_middle_is_an_error_not_a_guess(tmp_path, minimal):
    import pytest

    from bench.store.results import ResultsError

    results = ResultsDir.create(tmp_path, "r", parse_config(minimal))
    (results.path / "runs.jsonl").write_text('{"garbage": 1}\n')
    with pytest.raises(ResultsError, match=r"runs\.jsonl:1"):
        results.runs()


def test_resume_keeps_finished_runs_and_forgets_unfinished_ones(tmp_path, minimal):
    results = ResultsDir.create(tmp_path, "r", parse_config(minimal))
    for repeat in (1, 2, 3):
        results.add_request(_request("c", repeat))
    results.add_run(RunRecord(cell_id="c", repeat=1, server=outcome()))
    results.add_run(RunRecord(cell_id="c", repeat=2, server=outcome(), interrupted=True))
    with open(results.path / "runs.jsonl", "a") as f:
        f.write('{"type": "run", "cell_')  # repeat 3 was being recorded when the bench died
    log_dir = results.run_dir("c", 3)
    (log_dir / "server.log").write_text("first attempt\n")

    done = ResultsDir(results.path).prepare_resume()
    assert done == {("c", 1)}
    again = ResultsDir(results.path)
    assert [(r.cell_id, r.repeat) for r in again.runs()] == [("c", 1)]
    assert [(q.cell_id, q.repeat) for q in again.requests()] == [("c", 1)]  # no duplicates later
    assert again.warnings == []  # the half line was repaired away
    results.run_dir("c", 3)  # the repeat starts over, its old log kept aside
    assert (log_dir / "server.log.attempt-1").read_text() == "first attempt\n"
    assert not (log_dir / "server.log").exists()


def test_resume_of_a_folder_that_is_not_results_is_exit_2(tmp_path):
    assert main(["run", "--resume", str(tmp_path)]) == 2


def test_repeats_from_the_command_line_replace_the_matrixs_and_are_checked_at_parse_time(tmp_path, minimal, capsys):
    config = parse_config({**minimal, "repeats": "auto", "detect": {"rate": 0.1, "confidence": 0.95}})
    assert config.repeat_count > 1
    assert with_repeats(config, 1).repeat_count == 1 and with_repeats(config, None) == config
    matrix = tmp_path / "m.yaml"
    matrix.write_text(yaml.safe_dump(minimal))
    for bad in ("0", "x", "10001", "-1"):
        with pytest.raises(SystemExit) as exit_:
            main(["run", str(matrix), "--repeats", bad])
        assert exit_.value.code == 2
        assert "fresh servers, 1..10000" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path), "--repeats", "1"]) == 2
    assert "keeps the repeats it started with" in capsys.readouterr().err
