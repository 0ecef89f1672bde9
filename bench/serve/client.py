"""Requests: the workload sent through the official openai SDK, one RequestRecord per request.

The bench uses the same client users' applications use, so it sees what they would see.
Retries are off (a retry would hide the very failure being measured) and every time-out is
explicit. vLLM-specific sampling fields (min_tokens, ignore_eos, return_token_ids) travel as
extra body fields. Nothing raised by a request escapes: it becomes the record's error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import httpx
import openai

from bench.core.config import Prompt, Workload
from bench.core.probes.bad_words import banned_sequences
from bench.core.records import Choice, ErrorKind, ReferenceScore, RequestRecord, ToolCall
from bench.core.request import request_body, sdk_arguments
from bench.core.tokens import TokenLogprobs

CONNECT_TIMEOUT_S = 5.0


def _token_ids(choice: Any) -> list[int] | None:
    extra = getattr(choice, "model_extra", None) or {}
    ids = extra.get("token_ids")
    return list(ids) if isinstance(ids, list) else None


def _number(value: Any) -> float | None:
    """A logprob, or None for NaN and infinities (weights that are not numbers; JSON has no
    spelling for them either)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


_TOKEN_ID = "token_id:"  # how vLLM names a token with return_tokens_as_token_ids


def _id(token: str) -> int:
    if not token.startswith(_TOKEN_ID):
        raise ProtocolError(f"a logprobs token {token[:40]!r} is not {_TOKEN_ID}N although token ids were asked for")
    return int(token[len(_TOKEN_ID):])


def _completion_logprobs(logprobs: Any, texts: list[str] | None) -> list[TokenLogprobs]:
    """Completions: parallel lists; top_logprobs maps "token_id:N" to a logprob."""
    out = []
    for i, (lp, top) in enumerate(zip(logprobs.token_logprobs or [], logprobs.top_logprobs or [], strict=False)):
        pairs = sorted(((_id(t), _number(v)) for t, v in (top or {}).items()),
                       key=lambda p: -math.inf if p[1] is None else p[1], reverse=True)
        out.append(TokenLogprobs(logprob=_number(lp), top=pairs, text=texts[i] if texts and i < len(texts) else None))
    return out


def _chat_logprobs(logprobs: Any) -> list[TokenLogprobs]:
    """Chat: one entry per token; its `bytes` are the generated token's own (the alternatives'
    bytes spell "token_id:N")."""
    out = []
    for entry in logprobs.content or []:
        text = bytes(entry.bytes).decode("utf-8", errors="replace") if entry.bytes is not None else None
        pairs = [(_id(t.token), _number(t.logprob)) for t in entry.top_logprobs or []]
        out.append(TokenLogprobs(logprob=_number(entry.logprob), top=pairs, text=text))
    return out


def _classify(exc: BaseException) -> tuple[ErrorKind, int | None]:
    if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException | asyncio.TimeoutError):
        return ErrorKind.TIMEOUT, None
    if isinstance(exc, openai.APIStatusError):
        return ErrorKind.HTTP, exc.status_code
    if isinstance(exc, openai.APIConnectionError | httpx.TransportError):
        return ErrorKind.CONNECTION, None
    return ErrorKind.PROTOCOL, None


class ProtocolError(Exception):
    """A 2xx answer that breaks the API's promises."""


class _Choice:
    """One choice of an answer as it arrives, whole or in deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.text_given = False
        self.token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.tool_calls: dict[int, ToolCall] = {}  # by their index
        # Streamed: (ids, characters) per chunk up to the one that ended it (a prompt's chunks_paired).
        self.chunks: list[tuple[int, int]] = []
        # Some of its ids were told outside its text (a tool call's deltas, a reasoning parser's
        # reasoning): their chunks cannot be held to the text.
        self.told_elsewhere = False
        self.decoded: str | None = None  # a prompt's text_decoded: the server's decode of its ids

    def add_tool_calls(self, calls: Any, streamed: bool) -> None:
        """Whole calls, or a stream's deltas: a name first, then the arguments in pieces."""
        for position, call in enumerate(calls or []):
            index = getattr(call, "index", None) if streamed else position
            got = self.tool_calls.setdefault(index if index is not None else position, ToolCall())
            function = getattr(call, "function", None)
            if function is None:
                continue
            if function.name:
                got.name = (got.name or "") + function.name if streamed else function.name
            got.arguments += function.arguments or ""

    def add(self, choice: Any, chat: bool, streamed: bool) -> str | None:
        """Adds a choice or a delta of it; returns its text part."""
        if chat:
            message = choice.delta if streamed else choice.message
            part = message.content
            self.add_tool_calls(getattr(message, "tool_calls", None), streamed)
            extra = getattr(message, "model_extra", None) or {}
            self.told_elsewhere = self.told_elsewhere or bool(
                getattr(message, "tool_calls", None) or extra.get("reasoning_content") or extra.get("reasoning"))
        else:
            part = choice.text
        self.text.append(part or "")
        # null on every delta is not "": the API left the text out (empty_text says which).
        self.text_given = self.text_given or part is not None
        ids = _token_ids(choice)
        if ids is not None:
            self.token_ids = (self.token_ids or []) + ids
        if streamed and self.finish_reason is None:
            self.chunks.append((len(ids or []), len(part or "")))
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
            # vLLM's extra field: the stop string or stop token id that ended the answer.
            reason = (getattr(choice, "model_extra", None) or {}).get("stop_reason")
            self.stop_reason = reason if isinstance(reason, str | int) else None
        return part

    def calls(self) -> list[ToolCall]:
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]

    def record(self, index: int, tools: bool, chunks: bool) -> Choice:
        return Choice(index=index, text="".join(self.text) if self.text_given else None, token_ids=self.token_ids,
                      finish_reason=self.finish_reason, stop_reason=self.stop_reason,
                      tool_calls=self.calls() if tools else None,
                      chunks=self.chunks if chunks and not self.told_elsewhere else None,
                      decoded=None if self.told_elsewhere else self.decoded)


class _Result:
    """Accumulates one answer, whether it arrived whole or in chunks: every choice, each whole."""

    def __init__(self, t0: float = 0.0) -> None:
        self.t0 = t0  # perf_counter() when the request was sent
        self.token_times: list[float] = []  # streamed: perf_counter() of each chunk that carried tokens
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.logprobs: list[TokenLogprobs] | None = None  # the first choice's
        self.choices_seen = False
        self.choices: dict[int, _Choice] = {}
        self.choice_ids: dict[int, int] = {}  # token ids received per choice
        self.prompt_ids: list[int] | None = None  # as the server tokenized the prompt (return_token_ids)

    def add_prompt_ids(self, part: Any) -> None:
        """vLLM's `prompt_token_ids`: on a completion's choice, on a chat answer (its first chunk)."""
        ids = (getattr(part, "model_extra", None) or {}).get("prompt_token_ids")
        if self.prompt_ids is None and isinstance(ids, list):
            self.prompt_ids = ids

    @property
    def first(self) -> _Choice:
        return self.choices.setdefault(0, _Choice())

    def add_choice(self, choice: Any, chat: bool, streamed: bool) -> None:
        self.choices_seen = True
        index = getattr(choice, "index", 0) or 0
        self.add_prompt_ids(choice)
        self.choice_ids[index] = self.choice_ids.get(index, 0) + len(_token_ids(choice) or [])
        part = self.choices.setdefault(index, _Choice()).add(choice, chat, streamed)
        if index != 0:
            return  # timings and logprobs are the first choice's
        if streamed and (_token_ids(choice) or part):
            self.token_times.append(time.perf_counter())
        if getattr(choice, "logprobs", None) is not None:
            if chat:
                got = _chat_logprobs(choice.logprobs)
            else:
                # A streamed completion chunk carries one token, so its text is that token's.
                got = _completion_logprobs(choice.logprobs, [part or ""] if streamed else None)
            self.logprobs = (self.logprobs or []) + got

    def later(self, tools: bool, chunks: bool) -> list[Choice] | None:
        """The choices after the first, whole; None when only one came back."""
        if len(self.choices) < 2:
            return None
        return [self.choices[i].record(i, tools, chunks) for i in sorted(self.choices) if i != 0]

    def decode_differs(self) -> bool:
        """Whether some choice's text is not its decode as it stands: only there can a special
        token's text explain it, so only there are the ids' own texts asked for (one request an id)."""
        return any(c.decoded is not None and c.decoded != "".join(c.text) for c in self.choices.values())

    def ids(self) -> set[int]:
        return {i for c in self.choices.values() for i in c.token_ids or []}

    def timings(self) -> dict[str, Any]:
        """Time to first token and the gaps between token-carrying chunks (vLLM streams one token a
        chunk, now and then two: a gap per chunk, as vLLM's own benchmark counts inter-token
        latency), for streamed answers; a whole answer has neither."""
        if not self.token_times:
            return {}
        times = self.token_times
        return {"ttft_s": times[0] - self.t0, "itl_s": [b - a for a, b in pairwise(times)]}

    def add_usage(self, usage: Any) -> None:
        if usage is not None:
            self.prompt_tokens = usage.prompt_tokens
            self.completion_tokens = usage.completion_tokens


async def _send(
    client: openai.AsyncOpenAI, model: str, prompt: Prompt, workload: Workload, top_k: int | None, t0: float,
) -> _Result:
    chat = prompt.kind == "chat"
    args = sdk_arguments(request_body(prompt, workload, model, top_k))
    # Any: the SDK's overloads are chosen by a literal `stream`, which the keyword dict hides.
    response: Any
    if chat:
        response = await client.chat.completions.create(**args)
    else:
        response = await client.completions.create(**args)

    result = _Result(t0)
    if prompt.stream:
        async for chunk in response:
            result.add_prompt_ids(chunk)
            for choice in chunk.choices:
                result.add_choice(choice, chat, streamed=True)
            result.add_usage(chunk.usage)
    else:
        result.add_prompt_ids(response)
        for choice in response.choices:
            result.add_choice(choice, chat, streamed=False)
        result.add_usage(response.usage)
    # A stream cut short parses fine chunk by chunk; only its missing end gives it away.
    if not result.choices_seen:
        raise ProtocolError("the response had no choices")
    if result.first.finish_reason is None:
        raise ProtocolError(
            f"the response ended without a finish_reason after {len(''.join(result.first.text))} characters")
    if result.completion_tokens is None:
        raise ProtocolError("the response carried no usage")
    if top_k is not None and result.logprobs is None:
        raise ProtocolError("logprobs were asked for and the response carried none")
    return result


async def score_reference(
    base_url: str, model: str, passage: str, timeout_s: float,
) -> ReferenceScore:
    """The reference text's score: the passage's own tokens scored by the server (completions with
    `echo` and `logprobs`), as mean negative log-likelihood per token. Never raises."""
    try:
        async with _client(base_url, timeout_s) as c:
            response: Any = await asyncio.wait_for(c.completions.create(
                model=model, prompt=passage, max_tokens=1, echo=True, logprobs=0, temperature=0.0,
            ), timeout_s)
        choice = response.choices[0]
        prompt_tokens = response.usage.prompt_tokens
        # The first token has no context, so no logprob; the last one is the generated token.
        scored = list(choice.logprobs.token_logprobs or [])[1:prompt_tokens]
        if not scored:
            raise ProtocolError("the echoed passage came back without prompt logprobs")
        values = [_number(v) for v in scored]
        if any(v is None for v in values):
            return ReferenceScore(mean_nll=None, tokens=len(values))
        return ReferenceScore(mean_nll=-sum(v for v in values if v is not None) / len(values), tokens=len(values))
    except Exception as exc:
        return ReferenceScore(error=f"{type(exc).__name__}: {exc}"[:2000])


async def _context_length(client: openai.AsyncOpenAI, model: str, timeout_s: float) -> int | None:
    """The served model's context length as its /v1/models entry says it (vLLM's `max_model_len`),
    which caps an answer's tokens with its prompt's; None where the server does not say."""
    try:
        page = await asyncio.wait_for(client.models.list(), timeout_s)
        entry = next((m for m in page.data if m.id == model), None)
        value = (entry.model_extra or {}).get("max_model_len") if entry is not None else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    except Exception:
        return None


async def _bad_words_ids(base_url: str, model: str, workload: Workload, timeout_s: float) -> dict[str, list[list[int]]]:
    """The id sequences the server bans for each of the workload's bad_words, by its own tokenizer
    (vLLM's /tokenize, as SamplingParams.update_from_tokenizer spells them); a word it would not
    tokenize is left out (not judged)."""
    words = sorted({w for p in workload.prompts for w in p.bad_words or []})
    out: dict[str, list[list[int]]] = {}
    if not words:
        return out
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:

        async def ids(text: str) -> list[int]:
            r = await http.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
            r.raise_for_status()
            return [int(t) for t in r.json()["tokens"]]

        for word in words:
            try:
                sequences = banned_sequences(await ids(word.lstrip()), await ids(" " + word.lstrip()))
            except (httpx.HTTPError, KeyError, TypeError, ValueError):
                continue
            if sequences:
                out[word] = sequences
    return out


async def _token_texts(base_url: str, model: str, ids: set[int], timeout_s: float) -> dict[int, str] | None:
    """What each id spells alone, by the server's own tokenizer (vLLM's /detokenize); None where
    it would not say (the chunks are then not judged)."""
    out: dict[int, str] = {}
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
            for token in sorted(ids):
                r = await http.post("/detokenize", json={"model": model, "tokens": [token]})
                r.raise_for_status()
                text = r.json()["prompt"]
                if not isinstance(text, str):
                    return None
                out[token] = text
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None
    return out


async def _decode_answers(base_url: str, model: str, result: _Result, timeout_s: float) -> None:
    """Sets each choice's `decoded`: the server's /detokenize of the prompt's ids and the choice's,
    less its decode of the prompt's alone. Left None where the server gave no prompt ids, would not
    say, or the prompt's decode is not where the whole's begins (nothing can be told then)."""
    if result.prompt_ids is None:
        return
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
            async def decode(ids: list[int]) -> str:
                r = await http.post("/detokenize", json={"model": model, "tokens": ids})
                r.raise_for_status()
                text = r.json()["prompt"]
                if not isinstance(text, str):
                    raise TypeError(f"/detokenize answered {text!r}")
                return text

            head = await decode(result.prompt_ids)
            for choice in result.choices.values():
                if choice.token_ids is not None:
                    whole = await decode(result.prompt_ids + choice.token_ids)
                    choice.decoded = whole[len(head):] if whole.startswith(head) else None
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        for choice in result.choices.values():
            choice.decoded = None


def _client(base_url: str, timeout_s: float) -> openai.AsyncOpenAI:
    # The SDK's own Timeout type: it brings its own HTTP client, not the httpx the bench uses.
    timeout = openai.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="regbench", max_retries=0, timeout=timeout)


async def run_workload(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    cell_id: str,
    repeat: int,
    top_k: int | None = None,
    on_record: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """Sends every prompt once, at most `concurrency` at a time; returns records in prompt order.
    With `top_k`, each generated token's top-k logprobs are asked for and recorded."""
    semaphore = asyncio.Semaphore(workload.concurrency)

    async with _client(base_url, workload.request_timeout_s) as client:
        context = await _context_length(client, model, workload.request_timeout_s)
        banned = await _bad_words_ids(base_url, model, workload, workload.request_timeout_s)

        async def one(prompt: Prompt) -> RequestRecord:
            async with semaphore:
                started = time.time()
                t0 = time.perf_counter()
                fields: dict[str, Any] = {}
                latency: float | None = None
                try:
                    # The SDK's timeout bounds each read; this bounds a stream that never ends.
                    r = await asyncio.wait_for(
                        _send(client, model, prompt, workload, top_k, t0), workload.request_timeout_s
                    )
                    latency = time.perf_counter() - t0  # the answer's, not what is asked of the server after
                    tools, chunks = prompt.tools is not None, prompt.chunks_paired and prompt.stream
                    if prompt.text_decoded:
                        await _decode_answers(base_url, model, r, workload.request_timeout_s)
                    first = r.first.record(0, tools, chunks)
                    fields = dict(
                        status=200, text=first.text, token_ids=first.token_ids, prompt_tokens=r.prompt_tokens,
                        completion_tokens=r.completion_tokens, finish_reason=first.finish_reason,
                        stop_reason=first.stop_reason, choice_tokens=[r.choice_ids[i] for i in sorted(r.choice_ids)],
                        logprobs=r.logprobs, **r.timings(), tool_calls=first.tool_calls, choices=r.later(tools, chunks),
                        chunks=first.chunks,
                        token_texts=await _token_texts(base_url, model, r.ids(), workload.request_timeout_s)
                        if chunks or r.decode_differs() else None,
                        decoded=first.decoded,
                        max_model_len=context,
                        bad_words_ids={w: banned[w] for w in prompt.bad_words if w in banned} or None
                        if prompt.bad_words else None,
                    )
                except Exception as exc:
                    kind, status = _classify(exc)
                    fields = dict(status=status, error_kind=kind, error=f"{type(exc).__name__}: {exc}"[:2000])
                record = RequestRecord(
                    cell_id=cell_id, repeat=repeat, prompt_id=prompt.id, api=prompt.kind,
                    stream=prompt.stream, started_at=started,
                    latency_s=time.perf_counter() - t0 if latency is None else latency, **fields,
                )
                on_record(record)
                return record

        return list(await asyncio.gather(*(one(p) for p in workload.prompts)))
