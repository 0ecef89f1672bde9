"""Every choice of an answer recorded whole and held to the request as the first is (n > 1), for
every variant of the API (completion and chat, whole and streamed); and an answer's finish_reason
held to what happened (finish_reason_mismatch)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from bench.core.config import Workload
from bench.core.judge import judge_request
from bench.core.records import Choice, RequestRecord, ToolCall
from bench.core.verdicts import Reason
from bench.serve import client
from bench.serve.launch import HOST

# Per choice: its text in pieces, its ids, how it ended.
ANSWERS = [
    (["ab", "c"], [1, 2, 3], "length", None),
    (["x"], [4], "stop", "e"),
    (["", "yz"], [5, 6], "length", None),
]


def _whole(chat: bool, n: int) -> dict:
    choices = []
    for i, (pieces, ids, finish, stop) in enumerate(ANSWERS[:n]):
        text = "".join(pieces)
        body = {"index": i, "finish_reason": finish, "stop_reason": stop, "token_ids": ids}
        body.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        choices.append(body)
    return {"id": "x", "object": "chat.completion" if chat else "text_completion", "created": 0, "model": "m",
            "choices": choices, "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}


def _streamed(chat: bool, n: int) -> bytes:
    # The choices' deltas interleaved, as vLLM sends them: one chunk per delta, the finish last.
    events = []
    for step in range(2):
        for i, (pieces, ids, finish, stop) in enumerate(ANSWERS[:n]):
            if step >= len(pieces):
                continue
            last = step == len(pieces) - 1
            part = {"index": i, "finish_reason": finish if last else None, "stop_reason": stop if last else None,
                    "token_ids": ids[step:] if last else ids[step:step + 1]}
            part.update({"delta": {"content": pieces[step]}} if chat else {"text": pieces[step]})
            events.append({"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                           "model": "m", "choices": [part]})
    events.append({"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                   "model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6,
                                                          "total_tokens": 10}})
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _send(monkeypatch, prompt: dict, context: int | None = 2048) -> RequestRecord:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            card = {"id": "m", "object": "model", "created": 0, "owned_by": "vllm"}
            if context is not None:
                card["max_model_len"] = context
            return httpx.Response(200, json={"object": "list", "data": [card]})
        body = json.loads(request.content)
        chat = "messages" in body
        if body.get("stream"):
            return httpx.Response(200, content=_streamed(chat, body.get("n", 1)),
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=_whole(chat, body.get("n", 1)))

    transport = httpx.MockTransport(handler)
    monkeypatch.setattr(client, "_client", lambda url, t: openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="k", max_retries=0, http_client=httpx.AsyncClient(transport=transport)))
    w = Workload(prompts=[prompt], min_tokens=1, max_tokens=8)
    (record,) = asyncio.run(client.run_workload(f"http://{HOST}:9", "m", w, cell_id="c", repeat=0))
    assert record.error is None, record.error
    return record


VARIANTS = [pytest.param(chat, stream, id=f"{'chat' if chat else 'completion'}-{'streamed' if stream else 'whole'}")
            for chat in (False, True) for stream in (False, True)]


@pytest.mark.parametrize(("chat", "stream"), VARIANTS)
def test_every_choice_is_recorded_whole(monkeypatch, chat, stream):
    shape = {"kind": "chat", "messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    r = _send(monkeypatch, {"id": "p", **shape, "stream": stream, "n": 3, "stop": ["e"],
                            "sampling": {"temperature": 1.0, "seed": 1}})
    assert (r.text, r.token_ids, r.finish_reason, r.stop_reason) == ("abc", [1, 2, 3], "length", None)
    assert r.choices == [Choice(index=1, text="x", token_ids=[4], finish_reason="stop", stop_reason="e"),
                         Choice(index=2, text="yz", token_ids=[5, 6], finish_reason="length")]
    assert r.choice_tokens == [3, 1, 2] and r.max_model_len == 2048


def test_one_choice_records_no_later_ones_and_a_server_without_a_context_length_none(monkeypatch):
    r = _send(monkeypatch, {"id": "p", "prompt": "hi"}, context=None)
    assert r.choices is None and r.max_model_len is None and r.text == "abc"


def answer(**kw) -> RequestRecord:
    base = dict(cell_id="c", repeat=0, prompt_id="p", api="completion", stream=False, started_at=0.0, latency_s=0.1,
                status=200, text="abcd", token_ids=[1, 2, 3, 4], completion_tokens=4, finish_reason="length",
                prompt_tokens=4, max_model_len=2048)
    base.update(kw)
    return RequestRecord(**base)


def found(w: Workload, r: RequestRecord) -> list[tuple[str, int | None]]:
    return [(f.reason.value, f.choice) for f in judge_request(r, w)]


SAMPLED = {"temperature": 1.0, "seed": 1}


def test_a_later_choice_is_held_to_the_request_as_the_first_and_named():
    w = Workload(prompts=[{"id": "p", "prompt": "x", "n": 3, "stop": ["e"], "sampling": SAMPLED}],
                 min_tokens=4, max_tokens=4)
    r = answer(text="abcd", finish_reason="stop", stop_reason="e", choice_tokens=[4, 4, 4], completion_tokens=12,
               choices=[Choice(index=1, text="abcd", token_ids=[5, 6, 7, 8], finish_reason="length"),
                        Choice(index=2, text="abed", token_ids=[5, 6, 7, 9], finish_reason="length")])
    assert found(w, r) == [("stop_ignored", 2)]
    (f,) = judge_request(r, w)
    assert f.detail.startswith("choice 2: the text holds the stop string 'e'")
    # Each choice also gets its own lengths: a later one cut short is short_output, named.
    w = Workload(prompts=[{"id": "p", "prompt": "x", "n": 2, "sampling": SAMPLED}], min_tokens=4, max_tokens=4)
    r = answer(choice_tokens=[4, 2], completion_tokens=6,
               choices=[Choice(index=1, text="ab", token_ids=[5, 6], finish_reason="stop")])
    assert found(w, r) == [("short_output", 1)]


def test_length_before_the_limit_is_finish_reason_mismatch_and_at_it_is_not():
    w = Workload(prompts=[{"id": "p", "prompt": "x", "stop": ["e"], "max_tokens": 48}], min_tokens=1, max_tokens=48)
    # vllm's fault of issue #46: the stop string hit and the text cut, and finish_reason says length.
    (f,) = judge_request(answer(text="abc", token_ids=[1, 2, 3], completion_tokens=3), w)
    assert f.reason == Reason.FINISH_REASON_MISMATCH and f.evidence.tokens == 3 and f.evidence.max_tokens == 48
    assert "`length`, but the answer is shorter than its limit" in f.detail
    ids = list(range(48))
    assert found(w, answer(token_ids=ids, completion_tokens=48)) == []
    # The server's context caps an answer with its prompt: vLLM then says length, rightly.
    assert found(w, answer(token_ids=[1, 2, 3], completion_tokens=3, prompt_tokens=2045)) == []
    # A server that does not say its context length: nothing can be told.
    assert found(w, answer(token_ids=[1, 2, 3], completion_tokens=3, max_model_len=None)) == []


def test_tool_calls_without_a_call_and_a_stop_string_not_asked_for_are_findings():
    tools = [{"name": "f", "parameters": {"type": "object"}}]
    w = Workload(prompts=[{"id": "p", "kind": "chat", "messages": [{"role": "user", "content": "x"}], "tools": tools,
                           "tool_choice": "auto"}], min_tokens=1, max_tokens=4)
    r = answer(api="chat", text="", token_ids=[1, 2], completion_tokens=2, finish_reason="tool_calls", tool_calls=[])
    assert ("finish_reason_mismatch", None) in found(w, r)
    ok = r.model_copy(update={"tool_calls": [ToolCall(name="f", arguments="{}")]})
    assert found(w, ok) == []
    w = Workload(prompts=[{"id": "p", "prompt": "x", "stop": ["e"]}], min_tokens=1, max_tokens=4)
    assert found(w, answer(text="ab", token_ids=[1, 2], finish_reason="stop", stop_reason="e",
                           completion_tokens=2)) == []
    assert found(w, answer(text="ab", token_ids=[1, 2], finish_reason="stop", stop_reason="q",
                           completion_tokens=2)) == [("finish_reason_mismatch", None)]


def test_a_streamed_twin_that_ends_for_another_reason_is_inconsistent_output():
    from bench.core.judge import judge_twins

    w = Workload(prompts=[{"id": "p", "prompt": "x", "stop": ["e"]}, {"id": "q", "prompt": "x", "stop": ["e"],
                                                                     "stream": True}], min_tokens=1, max_tokens=4)
    whole = answer(text="ab", token_ids=[1, 2], completion_tokens=2, finish_reason="stop", stop_reason="e")
    streamed = whole.model_copy(update={"prompt_id": "q", "stream": True})
    assert judge_twins([whole, streamed], w) == []
    (f,) = judge_twins([whole, streamed.model_copy(update={"finish_reason": "length", "stop_reason": None})], w)
    assert f.reason == Reason.INCONSISTENT_OUTPUT and "finish_reason length" in f.evidence.this_text
    assert "finish_reason stop" in f.evidence.other_text


def test_a_stop_token_id_anywhere_but_last_is_stop_token_ignored_on_every_choice():
    w = Workload(prompts=[{"id": "p", "prompt": "x", "n": 2, "sampling": SAMPLED}], min_tokens=1, max_tokens=4,
                 stop_token_ids=[9])
    ended = answer(token_ids=[1, 2, 9], completion_tokens=7, finish_reason="stop", stop_reason=9, choice_tokens=[3, 4],
                   choices=[Choice(index=1, text="abcd", token_ids=[3, 4, 5, 6], finish_reason="length")])
    assert found(w, ended.model_copy(update={"token_ids": [1, 2, 3, 9]})) == []
    # vllm#17975's family: the second choice lost the request's stop token ids and ran on past one.
    ran_on = ended.model_copy(update={"token_ids": [1, 2, 3, 9], "completion_tokens": 8, "choice_tokens": [4, 4],
                                      "choices": [Choice(index=1, text="abcd", token_ids=[3, 9, 4, 5],
                                                         finish_reason="length")]})
    (f,) = judge_request(ran_on, w)
    assert (f.reason, f.choice, f.evidence.token, f.evidence.position) == (Reason.STOP_TOKEN_IGNORED, 1, 9, 1)
    # A prompt's own stop_token_ids replace the workload's ([] : none).
    w = Workload(prompts=[{"id": "p", "prompt": "x", "stop_token_ids": []}], min_tokens=1, max_tokens=4,
                 stop_token_ids=[9])
    assert found(w, answer(token_ids=[9, 9, 1, 2])) == []
