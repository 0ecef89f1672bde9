"""Requests: the workload sent through the official openai SDK, one RequestRecord per request.

The bench uses the same client users' applications use, so it sees what they would see.
Retries are off (a retry would hide the very failure being measured) and every time-out is
explicit. vLLM-specific sampling fields (min_tokens, ignore_eos, return_token_ids) travel as
extra body fields. Nothing raised by a request escapes: it becomes the record's error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from bench.core.config import Prompt, Workload
from bench.core.records import ErrorKind, RequestRecord

CONNECT_TIMEOUT_S = 5.0


def _token_ids(choice: Any) -> list[int] | None:
    extra = getattr(choice, "model_extra", None) or {}
    ids = extra.get("token_ids")
    return list(ids) if isinstance(ids, list) else None


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


class _Result:
    """Accumulates one answer, whether it arrived whole or in chunks."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.choices_seen = False

    def add_choice(self, choice: Any, chat: bool, streamed: bool) -> None:
        self.choices_seen = True
        if chat:
            part = choice.delta.content if streamed else choice.message.content
        else:
            part = choice.text
        self.text.append(part or "")
        ids = _token_ids(choice)
        if ids is not None:
            self.token_ids = (self.token_ids or []) + ids
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason

    def add_usage(self, usage: Any) -> None:
        if usage is not None:
            self.prompt_tokens = usage.prompt_tokens
            self.completion_tokens = usage.completion_tokens


async def _send(client: openai.AsyncOpenAI, model: str, prompt: Prompt, workload: Workload) -> _Result:
    body: dict[str, Any] = {"min_tokens": workload.min_tokens, "ignore_eos": workload.ignore_eos,
                            "return_token_ids": True}
    common: dict[str, Any] = dict(
        model=model, max_tokens=workload.max_tokens, temperature=workload.temperature,
        seed=workload.seed, extra_body=body,
    )
    if prompt.stream:
        common.update(stream=True, stream_options={"include_usage": True})
    chat = prompt.kind == "chat"
    # Any: the SDK's overloads are chosen by a literal `stream`, which the keyword dict hides.
    response: Any
    if chat:
        messages: Any = [m.model_dump() for m in prompt.messages or []]
        response = await client.chat.completions.create(messages=messages, **common)
    else:
        response = await client.completions.create(prompt=prompt.prompt or "", **common)

    result = _Result()
    if prompt.stream:
        async for chunk in response:
            for choice in chunk.choices:
                result.add_choice(choice, chat, streamed=True)
            result.add_usage(chunk.usage)
    else:
        for choice in response.choices[:1]:
            result.add_choice(choice, chat, streamed=False)
        result.add_usage(response.usage)
    # A stream cut short parses fine chunk by chunk; only its missing end gives it away.
    if not result.choices_seen:
        raise ProtocolError("the response had no choices")
    if result.finish_reason is None:
        raise ProtocolError(f"the response ended without a finish_reason after {len(''.join(result.text))} characters")
    if result.completion_tokens is None:
        raise ProtocolError("the response carried no usage")
    return result


async def run_workload(
    base_url: str,
    model: str,
    workload: Workload,
    *,
    cell_id: str,
    repeat: int,
    on_record: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """Sends every prompt once, at most `concurrency` at a time; returns records in prompt order."""
    # The SDK's own Timeout type: it brings its own HTTP client, not the httpx the bench uses.
    timeout = openai.Timeout(workload.request_timeout_s, connect=CONNECT_TIMEOUT_S)
    semaphore = asyncio.Semaphore(workload.concurrency)

    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="regbench", max_retries=0, timeout=timeout
    ) as client:

        async def one(prompt: Prompt) -> RequestRecord:
            async with semaphore:
                started = time.time()
                t0 = time.perf_counter()
                fields: dict[str, Any] = {}
                try:
                    # The SDK's timeout bounds each read; this bounds a stream that never ends.
                    r = await asyncio.wait_for(
                        _send(client, model, prompt, workload), workload.request_timeout_s
                    )
                    fields = dict(
                        status=200, text="".join(r.text), token_ids=r.token_ids,
                        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                        finish_reason=r.finish_reason,
                    )
                except Exception as exc:
                    kind, status = _classify(exc)
                    fields = dict(status=status, error_kind=kind, error=f"{type(exc).__name__}: {exc}"[:2000])
                record = RequestRecord(
                    cell_id=cell_id, repeat=repeat, prompt_id=prompt.id, api=prompt.kind,
                    stream=prompt.stream, started_at=started, latency_s=time.perf_counter() - t0, **fields,
                )
                on_record(record)
                return record

        return list(await asyncio.gather(*(one(p) for p in workload.prompts)))
