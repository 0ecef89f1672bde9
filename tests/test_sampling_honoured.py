"""Sampling honoured (bench.core.probes.sampling_honoured): a sampled answer that is greedy decoding,
or n choices alike, is a finding only where its own logprobs bound that chance below 1e-6."""

from __future__ import annotations

import math
import random

import pytest

from bench.core.config import Workload
from bench.core.evidence import SampledAsGreedy
from bench.core.judge.requests import judge_request
from bench.core.probes.sampling_honoured import LOG10_BOUND, NEUTRAL, TOP_K, SamplingHonoured, chance
from bench.core.records import Choice, RequestRecord
from bench.core.request import request_body
from bench.core.tokens import TokenLogprobs
from bench.core.verdicts import Reason

PROBE = SamplingHonoured()


def _workload(**prompt) -> Workload:
    fields = {"id": "p", "prompt": "Once upon a time", "sampling": {"temperature": 0.8, "seed": 7}, "min_tokens": 0,
              **prompt}
    return Workload(prompts=[fields], min_tokens=32, max_tokens=32, ignore_eos=True)


def _position(logprobs: list[float], pick: int) -> TokenLogprobs:
    """A position whose token ids are 100 + rank, best first; `pick` the rank generated."""
    top = [(100 + r, lp) for r, lp in enumerate(logprobs[:TOP_K])]
    return TokenLogprobs(logprob=logprobs[pick], top=top)


def _answer(positions: list[TokenLogprobs], ids: list[int], choices: list[list[int]] | None = None) -> RequestRecord:
    return RequestRecord(
        cell_id="c", repeat=0, prompt_id="p", api="completion", stream=False, started_at=0.0, latency_s=1.0,
        text="x" * len(ids), token_ids=ids, completion_tokens=len(ids) * (1 + len(choices or [])),
        choice_tokens=[len(ids)] * (1 + len(choices or [])), finish_reason="length", logprobs=positions,
        choices=[Choice(index=i + 1, text="x" * len(c), token_ids=c, finish_reason="length")
                 for i, c in enumerate(choices or [])] or None)


# A random model's spread: the best of five alternatives barely ahead of the rest.
FLAT = [-10.30, -10.31, -10.32, -10.33, -10.34]
# A trained model sure of each token: greedy is what a temperature of 0.8 samples too, mostly.
PEAKED = [-0.001, -7.5, -8.0, -8.5, -9.0]


def _findings(req: RequestRecord, workload: Workload) -> list[SampledAsGreedy]:
    return [f.evidence for f in judge_request(req, workload)
            if f.reason == Reason.SAMPLING_IGNORED and isinstance(f.evidence, SampledAsGreedy)]


def test_a_greedy_answer_where_the_logprobs_are_spread_is_sampling_ignored():
    req = _answer([_position(FLAT, 0) for _ in range(32)], [100] * 32)
    [found] = _findings(req, _workload())
    assert found.pattern == "greedy" and found.tokens == 32 and found.log10_chance < LOG10_BOUND
    assert "temperature 0.8" in found.text()


def test_a_greedy_answer_that_sampling_makes_likely_is_not_a_finding():
    req = _answer([_position(PEAKED, 0) for _ in range(32)], [100] * 32)
    assert _findings(req, _workload()) == []
    bound = chance(req, 0.8, 0, tied=True)
    assert bound is not None and bound[0] > -0.1  # nearly certain: greedy is what sampling gives here


def test_one_token_off_the_greedy_path_is_not_greedy():
    positions = [_position(FLAT, 0) for _ in range(32)]
    positions[17] = _position(FLAT, 3)
    ids = [100] * 32
    ids[17] = 103
    assert _findings(_answer(positions, ids), _workload()) == []


def test_n_choices_all_alike_are_sampling_ignored_and_two_that_differ_are_not():
    positions = [_position(FLAT, i % 5) for i in range(32)]
    ids = [100 + i % 5 for i in range(32)]
    [found] = _findings(_answer(positions, ids, choices=[ids, ids]), _workload(n=3))
    assert found.pattern == "identical choices" and found.choices == 3
    other = [*ids[:-1], 104 if ids[-1] != 104 else 103]
    assert _findings(_answer(positions, ids, choices=[ids, other]), _workload(n=3)) == []


def test_a_request_that_reshapes_the_distribution_is_not_judged():
    # A bias or a grammar is applied after the raw logprobs: their chance bounds nothing.
    req = _answer([_position(FLAT, 0) for _ in range(32)], [100] * 32)
    assert _findings(req, _workload(logit_bias={5: -100})) == []
    assert _findings(req, _workload(json_schema={"enum": ["a", "b"]})) == []


def test_tokens_under_min_tokens_are_not_counted():
    # vLLM masks EOS and the stop ids until min_tokens: the top k's sum bounds nothing there.
    workload = _workload(min_tokens=30)
    req = _answer([_position(FLAT, 0) for _ in range(32)], [100] * 32)
    assert workload.prompts[0].request(workload).min_tokens == 30
    assert _findings(req, workload) == []  # two tokens cannot go under 1e-6
    assert _findings(_answer([_position(FLAT, 0) for _ in range(40)], [100] * 40), workload)


def test_the_request_sends_neutral_sampling_and_asks_for_logprobs():
    workload = _workload()
    prompt = workload.prompts[0]
    body = request_body(prompt, workload, "m", None)
    assert {k: body[k] for k in NEUTRAL} == NEUTRAL and body["logprobs"] == TOP_K and body["temperature"] == 0.8
    assert request_body(prompt, workload, "m", 20)["logprobs"] == 20  # the comparison's k is kept
    greedy = Workload(prompts=[{"id": "g", "prompt": "x"}])
    assert not set(NEUTRAL) & set(request_body(greedy.prompts[0], greedy, "m", None))
    kept = Workload(prompts=[{"id": "s", "prompt": "x", "sampling": {"temperature": 0.8, "seed": 7}}], min_tokens=32)
    assert kept.prompts[0].request(kept).min_tokens == 32  # the request's own length, judged after it


@pytest.mark.parametrize("temperature", [0.3, 0.8, 1.0, 1.7])
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_the_bound_is_never_below_the_true_chance(temperature: float, mode: str):
    """Sampled honestly from a known distribution over 60 tokens, with only the top 5 reported:
    the bound is at least the true chance of the answer (and of greedy's), in both logprobs modes."""
    rng = random.Random(f"{temperature}-{mode}")
    for _ in range(200):
        positions, ids, true_log10, greedy_log10, greedy = [], [], 0.0, 0.0, True
        for _ in range(8):
            logits = [rng.gauss(0, rng.choice([0.5, 3.0, 8.0])) for _ in range(60)]
            raw = _log_softmax(logits)
            sampled = _log_softmax([x / temperature for x in logits])
            token = rng.choices(range(60), weights=[math.exp(x) for x in sampled])[0]
            reported = raw if mode == "raw_logprobs" else sampled
            order = sorted(range(60), key=lambda i: -reported[i])
            positions.append(TokenLogprobs(logprob=reported[token], top=[(i, reported[i]) for i in order[:5]]))
            ids.append(token)
            true_log10 += sampled[token] / math.log(10)
            best = max(range(60), key=lambda i: logits[i])
            greedy_log10 += sampled[best] / math.log(10)
            greedy = greedy and token == best
        req = _answer(positions, ids)
        bound = chance(req, temperature, 0, tied=False)
        assert bound is not None and bound[0] >= true_log10 - 1e-9
        if greedy:
            tied = chance(req, temperature, 0, tied=True)
            assert tied is not None and tied[0] >= greedy_log10 - 1e-9


def _log_softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    total = math.log(sum(math.exp(x - top) for x in xs)) + top
    return [x - total for x in xs]
