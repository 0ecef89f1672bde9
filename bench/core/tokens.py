"""Comparing generated outputs: the one place that says whether two outputs for the same prompt
differ and where. judge (divergence, nondeterminism), report and compare all go through it.

A ``Comparator`` answers with the first position at which two outputs are taken as different,
or None when it takes them as the same. Two rules:

``exact``     token ids equal, lengths equal. Right where the numerics are bit-reproducible
              (float32 on CPU, as measured here); on GPUs and in bf16 it fails healthy servers.
``logprobs``  vLLM's own rule for its model tests (``check_logprobs_close`` in vLLM's tests):
              walk both outputs; at the first position where the tokens differ, each side's
              token must be among the other side's top-k alternatives there, and comparing
              stops (the contexts differ after it). A token outside the other side's top-k is a
              difference. Needs the top-k logprobs of every generated token; an output recorded
              without them is compared exactly. k comes from the comparator; outputs recorded
              with more alternatives are cut to k, with fewer use what they have.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

CompareMode = Literal["exact", "logprobs"]


class TokenLogprobs(BaseModel):
    """One generated position as the server scored it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    logprob: float | None  # the generated token's; None when not a number (NaN weights)
    # The alternatives by rank, best first: (token id, logprob). May hold the generated token
    # one past k (vLLM adds it when it is not among the top k).
    top: list[tuple[int, float | None]]
    text: str | None = None  # the token's text, where the API tells it


class Output(BaseModel):
    """What a comparator compares: one request's generated token ids, with their logprobs when
    they were asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ids: list[int]
    logprobs: list[TokenLogprobs] | None = None
    # Whether the answer ended by itself (EOS, a stop token or string) rather than at max_tokens;
    # None where not known. Not compared: the judge asks it of a baseline (never_stops).
    ended: bool | None = None

    def at(self, i: int) -> TokenLogprobs | None:
        return self.logprobs[i] if self.logprobs is not None and i < len(self.logprobs) else None


def _rank_key(pair: tuple[int, float | None]) -> float:
    lp = pair[1]
    return -math.inf if lp is None or math.isnan(lp) else lp


def top_ids(position: TokenLogprobs | None, k: int) -> list[int] | None:
    """The k best token ids at a position, or None when it has no alternatives recorded."""
    if position is None or not position.top:
        return None
    return [i for i, _ in sorted(position.top, key=_rank_key, reverse=True)[:k]]


def rank_in(token: int | None, position: TokenLogprobs | None, k: int) -> int | None:
    """1-based rank of `token` among the position's top k, None when it is not among them."""
    ids = top_ids(position, k)
    if token is None or ids is None or token not in ids:
        return None
    return ids.index(token) + 1


class Comparator(Protocol):
    name: str

    def first_difference(self, output: Output, reference: Output) -> int | None:
        """Index of the first token taken as different (a length difference counts), or None."""
        ...


def _first_unequal(a: list[int], b: list[int]) -> int | None:
    if a == b:  # runs in C; the loop below only for the rare unequal pair
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class Exact:
    name = "exact"

    def first_difference(self, output: Output, reference: Output) -> int | None:
        return _first_unequal(output.ids, reference.ids)


class Logprobs:
    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"logprobs top-{k}"

    def tolerated(self, output: Output, reference: Output, i: int) -> bool:
        """At position i, where the tokens differ: is each side's token in the other's top k?"""
        mine = output.ids[i] if i < len(output.ids) else None
        theirs = reference.ids[i] if i < len(reference.ids) else None
        return (rank_in(mine, reference.at(i), self.k) is not None
                and rank_in(theirs, output.at(i), self.k) is not None)

    def first_difference(self, output: Output, reference: Output) -> int | None:
        i = _first_unequal(output.ids, reference.ids)
        if i is None or self.tolerated(output, reference, i):
            return None
        return i


EXACT = Exact()
DEFAULT_TOP_K = 5


def comparator_for(mode: CompareMode, top_k: int = DEFAULT_TOP_K) -> Comparator:
    return EXACT if mode == "exact" else Logprobs(top_k)
