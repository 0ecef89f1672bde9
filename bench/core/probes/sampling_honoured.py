"""Sampling honoured: a sampled answer that is greedy decoding, or n sampled choices all alike, is
`sampling_ignored` where the answer's own logprobs bound the chance of that below 1e-6 (vllm#15241:
a temperature that changed nothing).

The bound is the chance under the request's own sampling, from what the server returned. vLLM
returns raw logprobs by default (`--logprobs-mode raw_logprobs`: before temperature, masks and
truncation), and the top k of them: at temperature T a token's sampling probability is
p^(1/T) / sum over the vocabulary of p_j^(1/T), which the top k's sum can only overstate. Taken
the larger of that and the logprobs read as already processed (`processed_logprobs`; logits
modes give the same numbers up to a constant), the bound holds in every mode. It holds only where
nothing else reshapes the distribution: the probe sends top_p 1, top_k off, min_p 0 and
repetition_penalty 1 (a model's generation config would otherwise set them), judges no prompt
with a bias, a grammar or tools, and no token before min_tokens (vLLM masks EOS and the stop ids
there, whose ids the client does not know): a prompt gives itself `min_tokens: 0` to be judged
whole.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from bench.core.evidence import SampledAsGreedy
from bench.core.probes.base import PROBES, ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord
    from bench.core.tokens import TokenLogprobs

# How unlikely, by the answer's own logprobs, a greedy or repeated answer must be to be a finding:
# a healthy server shows one at most once in a million such answers.
LOG10_BOUND = -6.0
# The logprobs asked for where the comparison asks none: the more alternatives, the tighter the bound.
TOP_K = 5
# Logprobs this close to the best count as tied with it (bf16 logits tie often).
_TIE = 1e-6
# Below this temperature vLLM decodes greedily by design (its _SAMPLING_EPS).
_GREEDY_BELOW = 1e-5
# What the probe sends so that a model's generation config cannot narrow the sampling (vLLM
# applies `--generation-config auto` defaults only to fields a request leaves out).
NEUTRAL = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


class SamplingHonouredFields(Strict):
    """No field: every prompt with `sampling` is held to it."""


def _share(position: TokenLogprobs, token: int, temperature: float, tied: bool) -> float | None:
    """An upper bound on the chance that sampling at `position` picked `token` (with `tied`: any
    token tied with the best), from the top-k logprobs; None where a logprob is not a number."""
    ranked = {i: lp for i, lp in position.top}
    ranked[token] = position.logprob
    if any(lp is None or not math.isfinite(lp) for lp in ranked.values()):
        return None
    values: dict[int, float] = {i: float(lp) for i, lp in ranked.items() if lp is not None}
    best = max(values.values())
    picked = [i for i, lp in values.items() if lp >= best - _TIE] if tied else [token]
    bounds = []
    for scale in (1.0 / temperature, 1.0):
        weights = {i: math.exp((lp - best) * scale) for i, lp in values.items()}
        bounds.append(sum(weights[i] for i in picked) / sum(weights.values()))
    return min(1.0, max(bounds))


def _is_best(position: TokenLogprobs, token: int) -> bool:
    best = max((lp for _, lp in position.top if lp is not None), default=None)
    return position.logprob is not None and (best is None or position.logprob >= best - _TIE)


def chance(req: RequestRecord, temperature: float, start: int, tied: bool) -> tuple[float, int] | None:
    """(log10 of the bound on the chance of the answer's tokens from `start` on, how many were
    bounded): with `tied`, of every one being greedy's; else of these very tokens. None: the
    answer's logprobs cannot tell."""
    ids, logprobs = req.token_ids, req.logprobs
    if ids is None or logprobs is None or len(logprobs) != len(ids) or start >= len(ids):
        return None
    total, counted = 0.0, 0
    for token, position in list(zip(ids, logprobs, strict=True))[start:]:
        share = _share(position, token, temperature, tied)
        if share is not None and share > 0:
            total += math.log10(share)
            counted += 1
    return (total, counted) if counted else None


@register
class SamplingHonoured(ContractProbe):
    name = "temperature"
    fields = SamplingHonouredFields
    reason = Reason.SAMPLING_IGNORED
    evidence = SampledAsGreedy
    signature = "sampling-ignored"
    description = ("a prompt sampled at a temperature (`sampling`) got greedy decoding (every token the most "
                   "likely one), or its n choices all alike, where the answer's own logprobs bound the chance of "
                   "that below 1e-6 (vllm#15241: a temperature that changed nothing). The bound takes the "
                   "returned logprobs as raw or as processed, whichever gives the larger chance, so it holds in "
                   "every `--logprobs-mode`; the probe sends top_p 1, top_k off, min_p 0 and repetition_penalty 1 "
                   "so that no generation config narrows the sampling, asks for 5 logprobs where the comparison "
                   "asks none, judges no prompt with a bias, a grammar or tools and no token before min_tokens (a "
                   "prompt sets `min_tokens: 0` to be judged whole). Judged under every comparison rule; the "
                   "evidence has the chance and the tokens it covers")
    optional_feature = False  # every server samples

    def asked(self, prompt: Prompt) -> bool:
        return prompt.sampling is not None and prompt.sampling.temperature >= _GREEDY_BELOW

    def judged(self, prompt: Prompt) -> bool:
        """Whether nothing else in the request reshapes the distribution it samples from."""
        return self.asked(prompt) and not any(p.reweights and p.asked(prompt) for p in PROBES)

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if not self.asked(prompt):
            return
        body.update(NEUTRAL)
        if "logprobs" not in body:
            body["return_tokens_as_token_ids"] = True
            body.update({"logprobs": True, "top_logprobs": TOP_K} if prompt.kind == "chat" else {"logprobs": TOP_K})

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[SampledAsGreedy]:
        if not self.judged(prompt) or prompt.sampling is None:
            return []
        temperature, start = prompt.sampling.temperature, shape.min_tokens
        ids = req.token_ids or []
        if req.choices and all(c.token_ids == ids for c in req.choices) and ids:
            # Each later choice is drawn apart (its own seed): each repeats the first with the
            # first's own chance.
            found = chance(req, temperature, start, tied=False)
            if found is not None and found[0] * len(req.choices) < LOG10_BOUND:
                return [SampledAsGreedy(pattern="identical choices", temperature=temperature, tokens=found[1],
                                        choices=len(req.choices) + 1, log10_chance=found[0] * len(req.choices),
                                        log10_bound=LOG10_BOUND)]
        logprobs = req.logprobs or []
        if ids and len(logprobs) == len(ids) and all(_is_best(p, t) for t, p in list(zip(ids, logprobs))[start:]):
            found = chance(req, temperature, start, tied=True)
            if found is not None and found[0] < LOG10_BOUND:
                return [SampledAsGreedy(pattern="greedy", temperature=temperature, tokens=found[1],
                                        choices=1 + len(req.choices or []), log10_chance=found[0],
                                        log10_bound=LOG10_BOUND)]
        return []
