"""The orchestrator with a stand-in launcher: what it writes, skips and resumes. The servers are
the tests' fake OpenAI wire server: what is under test is the bench's bookkeeping, not vLLM."""

from __future__ import annotations

import pytest

from bench.core.config import parse_config
from bench.core.matrix import expand
from bench.core.records import Finding, Reason, RunRecord, ServerOutcome
from bench.runner import run_matrix
from bench.serve.errors import BootError
from bench.store.results import ResultsDir

from .support import Live, ScriptedLauncher


def config(minimal, **changes):
    minimal["exclude"] = [{"load_format": "runai_streamer"}]
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    minimal.update(changes)
    return parse_config(minimal)


def test_a_run_writes_every_record_and_a_summary(tmp_path, minimal):
    cfg = config(minimal, repeats=2)
    results = ResultsDir.create(tmp_path, "r", cfg)
    launcher = ScriptedLauncher(["ok", "empty"])
    summary = run_matrix(cfg, expand(cfg), results, launcher=launcher).summary
    assert launcher.started == [("m__safetensors__cpu__img", 1), ("m__safetensors__cpu__img", 2)]
    assert len(results.runs()) == 2 and len(results.requests()) == 2
    (cell,) = summary.cells
    assert (cell.verdict, cell.failures, cell.runs) == ("flaky", 1, 2)
    assert {"summary.json", "summary.md", "junit.xml", "report.html"} <= {p.name for p in results.path.iterdir()}


def test_early_stop_skips_repeats_once_the_verdict_is_settled(tmp_path, minimal):
    cfg = config(minimal, repeats=6, early_stop=True)
    results = ResultsDir.create(tmp_path, "r", cfg)
    launcher = ScriptedLauncher(["ok", "empty", "ok", "ok", "ok", "ok"])
    summary = run_matrix(cfg, expand(cfg), results, launcher=launcher).summary
    assert [r for _, r in launcher.started] == [1, 2]  # flaky after two: nothing can change that
    assert summary.cells[0].verdict == "flaky"


def test_without_early_stop_every_repeat_runs(tmp_path, minimal):
    cfg = config(minimal, repeats=3)
    launcher = ScriptedLauncher(["ok", "empty", "ok"])
    run_matrix(cfg, expand(cfg), ResultsDir.create(tmp_path, "r", cfg), launcher=launcher)
    assert [r for _, r in launcher.started] == [1, 2, 3]


def test_auto_repeats_come_from_the_rate_to_detect(minimal):
    cfg = config(minimal, repeats="auto", detect={"rate": 0.3, "confidence": 0.95})
    assert [c.repeats for c in expand(cfg)] == [9]


def test_resume_runs_only_what_is_not_done(tmp_path, minimal):
    cfg = config(minimal, repeats=3)
    results = ResultsDir.create(tmp_path, "r", cfg)
    run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"] * 3))
    lines = (results.path / "runs.jsonl").read_text().splitlines()
    (results.path / "runs.jsonl").write_text("\n".join(lines[:1]) + "\n")  # as if killed after #1
    again = ResultsDir(results.path)
    done = again.prepare_resume()
    launcher = ScriptedLauncher(["ok"] * 3)
    summary = run_matrix(cfg, expand(cfg), again, launcher=launcher, done=frozenset(done)).summary
    assert [r for _, r in launcher.started] == [2, 3]
    assert summary.cells[0].runs == 3 and len(again.requests()) == 3


def test_a_resumed_run_keeps_the_time_it_started(tmp_path, minimal):
    # `regbench run --resume` of a finished (or killed) run: its summary, report and history entry
    # still date it from its first start, not from the resume's.
    cfg = config(minimal, repeats=2)
    results = ResultsDir.create(tmp_path, "r", cfg)
    first = run_matrix(cfg, expand(cfg), results, launcher=ScriptedLauncher(["ok"] * 2)).summary
    again = ResultsDir(results.path)
    done = again.prepare_resume()
    launcher = ScriptedLauncher(["ok"] * 2)
    summary = run_matrix(cfg, expand(cfg), again, launcher=launcher, done=frozenset(done)).summary
    assert launcher.started == []
    assert summary.started_at == first.started_at and summary.finished_at >= first.finished_at


class Recorded:
    def __init__(self):
        self.done = []

    def start(self, total_runs): ...
    def status(self, text): ...

    def run_done(self, record, findings, divergence):
        self.done.append((record.cell_id.split("__")[1], record.repeat, divergence))


def test_progress_never_calls_a_run_clean_that_its_cell_verdict_fails(tmp_path, minimal):
    # A run without findings of its own still diverges from the baseline: the progress line is
    # told so (the baseline ran first), never a bare pass that the table then contradicts.
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    cfg = parse_config({**minimal, "repeats": 1})
    results = ResultsDir.create(tmp_path, "r", cfg)
    progress = Recorded()
    summary = run_matrix(cfg, expand(cfg), results, progress=progress,
                         launcher=ScriptedLauncher(["ok"], by_format={"runai_streamer": ["shifted"]})).summary
    (base, other) = progress.done
    assert base == ("safetensors", 1, [])
    assert other[:2] == ("runai_streamer", 1) and [d.position for d in other[2]] == [0]
    assert {c.load_format: c.verdict for c in summary.cells} == {"safetensors": "pass", "runai_streamer": "fail"}


def test_progress_says_pending_while_the_baseline_has_no_clean_run(tmp_path, minimal):
    minimal["workload"]["min_tokens"] = minimal["workload"]["max_tokens"] = 16
    cfg = parse_config({**minimal, "repeats": 1})
    progress = Recorded()
    run_matrix(cfg, expand(cfg), ResultsDir.create(tmp_path, "r", cfg), progress=progress,
               launcher=ScriptedLauncher(["empty"], by_format={"runai_streamer": ["ok"]}))
    assert [d for *_, d in progress.done] == [[], None]


def test_the_progress_line_marks_pass_pending_and_divergence():
    from bench.console import run_line
    from bench.core.records import RunRecord, TokenDiff

    record = RunRecord(cell_id="c", repeat=1, server=ServerOutcome(
        command=["x"], port=1, log_path="l", started_at=0.0, boot_s=3.0))
    assert run_line(record, [], []).startswith("[green]✓")
    assert "✓" not in run_line(record, [], None) and "baseline" in run_line(record, [], None)
    line = run_line(record, [], [TokenDiff(prompt_id="p", repeat=1, position=5)])
    assert line.startswith("[red]✗") and "token 5 (p)" in line
    # A missed known answer alone is not yet a failure: the baseline may miss it too.
    from bench.core.evidence import ExpectationMissed
    from bench.core.verdicts import Finding

    missed = Finding(reason="expectation_failed", prompt_id="france",
                     evidence=ExpectationMissed(expected="contains 'Paris'", answer="L'Étoile"))
    line = run_line(record, [missed], [])
    assert line.startswith("[yellow]?") and "missed france" in line
    line = run_line(record, [missed, Finding(reason="empty_text", detail="x")], [])
    assert line.startswith("[red]✗") and "empty_text, expectation_failed" in line


def test_the_schedule_hands_out_runs_in_order_and_stops_a_settled_cell(minimal):
    from bench.core.stop import StopToken
    from bench.runner import Schedule

    cfg = config(minimal, repeats=4, early_stop=True)
    (cell,) = expand(cfg)
    said: list[str] = []
    schedule = Schedule(cfg, [cell], frozenset({(cell.id, 1)}), [], said.append)
    stop = StopToken()
    assert schedule.total == 3 and schedule.next(stop) == (cell, 2)
    for repeat, failed in ((2, False), (3, True)):  # #2 passed, #3 failed: flaky for good
        schedule.record(RunRecord(cell_id=cell.id, repeat=repeat, server=ServerOutcome(
            command=["x"], port=1, log_path="l", started_at=0.0)),
            [Finding(reason=Reason.EXIT_CODE, detail="x")] if failed else [])
    assert schedule.next(stop) is None and said and "settled" in said[0]


def test_a_stopped_schedule_hands_out_nothing(minimal):
    from bench.core.stop import Stopped, StopToken
    from bench.runner import Schedule

    cfg = config(minimal, repeats=2)
    schedule = Schedule(cfg, expand(cfg), frozenset(), [], lambda s: None)
    stop = StopToken()
    stop.stop("test")
    assert schedule.next(stop) is None
    with pytest.raises(Stopped, match="test"):
        stop.check()


class SignalledToo(Live):
    """A server that, like every process of a Slurm job at its time limit, is signalled along with
    the bench: the stop comes while it boots or while it stops, and its exit shows it."""

    during = "shutdown"

    def __enter__(self):
        if self.during == "boot":
            self.stop.stop("interrupted")
            self.outcome = self.outcome.model_copy(update={"exited_early_code": -15})
            raise BootError("exited while booting")
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.stop.stop("interrupted")
        self.outcome = self.outcome.model_copy(update={"exit_code": 143})


@pytest.mark.parametrize("during", ["boot", "shutdown"])
def test_a_stop_while_the_server_boots_or_stops_interrupts_the_run_rather_than_failing_it(tmp_path, minimal, during):
    from bench.core.stop import StopToken
    from bench.runner import run_one

    cfg = config(minimal, repeats=1)
    results = ResultsDir.create(tmp_path, "r", cfg)
    (cell,) = expand(cfg)
    launcher = ScriptedLauncher(["ok"])
    server = SignalledToo("ok", results.run_dir(cell.id, 1), None, launcher, StopToken())
    server.during = during
    launcher.server = lambda *_: server
    record = run_one(cfg, cell, 1, launcher, results, status=lambda _: None, stop=server.stop)
    assert record.interrupted and record.findings == []
    assert [r.interrupted for r in results.runs()] == [True]


def test_a_cell_whose_image_cannot_run_here_is_said_once_not_per_repeat(minimal):
    from bench.core.stop import StopToken
    from bench.runner import Schedule

    cfg = config(minimal, repeats=3, exclude=[])  # two cells
    cells = expand(cfg)
    said: list[str] = []
    schedule = Schedule(cfg, cells, frozenset(), [], said.append)
    stop = StopToken()
    first = schedule.next(stop)
    assert first == (cells[0], 1)
    schedule.record(RunRecord(cell_id=cells[0].id, repeat=1, server=ServerOutcome(
        command=["x"], port=1, log_path="l", started_at=0.0)),
        [Finding(reason=Reason.NOT_RUNNABLE, detail="not runnable on this host: image is linux/arm64")])
    handed = []
    while (job := schedule.next(stop)) is not None:
        handed.append((job[0].id, job[1]))
    assert handed == [(cells[1].id, r) for r in (1, 2, 3)]
    assert said == [f"{cells[0].id}: not runnable on this host, skipping #2",
                    f"{cells[0].id}: not runnable on this host, skipping #3"]


def test_a_run_that_only_missed_a_known_answer_settles_nothing(minimal):
    # Whether such a miss counts depends on the baseline, judged later: early stop must not call
    # the cell flaky on it and skip the repeats that would tell.
    from bench.core.evidence import ExpectationMissed
    from bench.core.stop import StopToken
    from bench.runner import Schedule

    cfg = config(minimal, repeats=4, early_stop=True)
    (cell,) = expand(cfg)
    schedule = Schedule(cfg, [cell], frozenset(), [], lambda s: None)
    stop = StopToken()
    missed = Finding(reason=Reason.EXPECTATION_FAILED, prompt_id="p",
                     evidence=ExpectationMissed(expected="contains 'Paris'", answer="Lyon"))
    for repeat, findings in ((1, []), (2, [missed])):
        assert schedule.next(stop) == (cell, repeat)
        schedule.record(RunRecord(cell_id=cell.id, repeat=repeat, server=ServerOutcome(
            command=["x"], port=1, log_path="l", started_at=0.0)), findings)
    assert schedule.next(stop) == (cell, 3)  # not settled as flaky


def test_an_image_a_launcher_does_not_pin_keeps_its_cells_for_the_pre_flight(minimal, tmp_path):
    """A local image with a reference (an `--image NAME=REF` override records one) is not pinned
    by the local launcher: its cells stay, so the pre-flight audits them. Only an image the
    launcher says it has no build of for this host is left out."""
    from bench.runner import pin_images

    minimal["images"][0]["ref"] = "regbench.test/vllm:0.16.0"
    cfg = parse_config(minimal)
    cells = expand(cfg)
    results = ResultsDir.create(tmp_path, "r", cfg)
    said: list[str] = []
    assert pin_images(cells, results, ScriptedLauncher(["ok"]), said.append) == cells

    class NoBuildHere(ScriptedLauncher):
        def not_here(self):
            return {"img": "not runnable on this host: image regbench.test/vllm:0.16.0 is not published"}

    assert pin_images(cells, results, NoBuildHere(["ok"]), said.append) == []
    assert said[-1] == "image img: not runnable on this host: image regbench.test/vllm:0.16.0 is not published"
