from __future__ import annotations

import asyncio

import pytest

from bench.core.config import parse_config
from bench.core.judge import Reason, judge_request
from bench.core.records import ErrorKind
from bench.serve.client import run_workload

from .fakeserver import FakeServer
from .support import FOUR_SHAPES


@pytest.fixture
def workload(minimal):
    minimal["workload"]["prompts"] = FOUR_SHAPES
    minimal["workload"]["request_timeout_s"] = 2
    minimal["workload"]["concurrency"] = 2
    return parse_config(minimal).workload


def send(server: FakeServer, workload):
    seen = []
    records = asyncio.run(run_workload(server.url, "tiny", workload, cell_id="c", repeat=1, on_record=seen.append))
    assert sorted(r.prompt_id for r in seen) == sorted(r.prompt_id for r in records)  # each reported once
    return {r.prompt_id: r for r in records}


def test_all_four_request_shapes_and_the_vllm_fields(workload):
    with FakeServer("ok") as server:
        records = send(server, workload)
    for r in records.values():
        assert r.error is None and r.status == 200
        assert r.token_ids == list(range(128)) and r.completion_tokens == 128
        assert r.text == "w" * 128 and r.finish_reason == "length"
        assert judge_request(r, workload) == []
    for body in server.requests:
        assert body["min_tokens"] == 128 and body["max_tokens"] == 128
        assert body["ignore_eos"] is True and body["return_token_ids"] is True
        assert body["temperature"] == 0 and body["seed"] == 0
        if body.get("stream"):
            assert body["stream_options"] == {"include_usage": True}
        assert "stop_token_ids" not in body  # none given: vLLM's own default


def test_stop_token_ids_are_sent_with_every_request(minimal):
    minimal["workload"]["stop_token_ids"] = [427, 1379]
    with FakeServer("ok") as server:
        send(server, parse_config(minimal).workload)
    assert server.requests and all(body["stop_token_ids"] == [427, 1379] for body in server.requests)


def test_empty_completions_are_records_not_errors(workload):
    with FakeServer("empty") as server:
        records = send(server, workload)
    for r in records.values():
        assert r.status == 200 and r.text == "" and r.completion_tokens == 128
        assert {f.reason for f in judge_request(r, workload)} >= {Reason.EMPTY_TEXT, Reason.DEGENERATE}


def test_a_null_text_is_recorded_as_absent_and_judged_so(workload):
    # The API left the text out while usage and ids count 128 tokens: not the same as "".
    with FakeServer("nulltext") as server:
        records = send(server, workload)
    for r in records.values():
        assert r.status == 200 and r.text is None and r.completion_tokens == 128
        (empty,) = [f for f in judge_request(r, workload) if f.reason == Reason.EMPTY_TEXT]
        assert empty.evidence.absent and "no text (null)" in empty.detail
        assert Reason.USAGE_TEXT_MISMATCH in {f.reason for f in judge_request(r, workload)}


def test_one_token_more_than_max_tokens_is_a_finding(workload):
    with FakeServer("overlong") as server:
        records = send(server, workload)
    for r in records.values():
        assert r.completion_tokens == 129 and len(r.token_ids) == 129
        (over,) = [f for f in judge_request(r, workload) if f.reason == Reason.OVER_MAX_TOKENS]
        assert "129 tokens > max_tokens 128" in over.detail
    with FakeServer("ok") as server:
        assert all(judge_request(r, workload) == [] for r in send(server, workload).values())


@pytest.mark.parametrize(
    "mode, kind",
    [("http500", ErrorKind.HTTP), ("badjson", ErrorKind.PROTOCOL), ("hang", ErrorKind.TIMEOUT)],
)
def test_faults_on_the_wire_become_error_records(workload, mode, kind):
    with FakeServer(mode) as server:
        records = send(server, workload)
    non_stream = records["c"]
    assert non_stream.error_kind == kind, non_stream.error
    if mode == "http500":
        assert non_stream.status == 500
    assert records["c"].latency_s < 10  # bounded by the request time-out, not hanging


def test_truncated_stream_is_not_taken_for_a_complete_answer(workload):
    with FakeServer("truncated") as server:
        records = send(server, workload)
    r = records["cs"]
    # Either the SDK notices the cut or the record is short: both must be a finding.
    assert judge_request(r, workload)


@pytest.mark.fault("nobody listening on the server's port")
def test_nobody_listening_is_a_connection_error(workload, fault):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    records = asyncio.run(run_workload(f"http://127.0.0.1:{port}", "tiny", workload, cell_id="c", repeat=1))
    assert {r.error_kind for r in records} == {ErrorKind.CONNECTION}
    fault(", ".join(sorted({f.reason for r in records for f in judge_request(r, workload)})),
          records_lost=len(workload.prompts) - len(records))


@pytest.mark.parametrize("mode", ["ok", "notokenize"])
def test_bad_words_are_sent_and_their_ids_asked_of_the_servers_tokenizer(minimal, mode):
    minimal["workload"]["prompts"] = [{"id": "b", "prompt": "x", "bad_words": ["hi", " ok"]}, {"id": "p", "prompt": "x"}]
    w = parse_config(minimal).workload
    with FakeServer(mode) as server:
        records = send(server, w)
    assert [b.get("bad_words") for b in server.requests] in (
        [["hi", " ok"], None], [None, ["hi", " ok"]])
    # The fake spells one id a character: " hi" is longer than "hi", so only "hi" itself is banned
    # (vLLM's rule); a server that will not tokenize leaves the answer unjudged on it.
    expected = {"hi": [[104, 105]], " ok": [[111, 107]]} if mode == "ok" else None
    assert records["b"].bad_words_ids == expected and records["p"].bad_words_ids is None


@pytest.mark.parametrize("mode", ["ok", "lagging", "notokenize"])
def test_a_stream_that_asks_chunks_paired_is_recorded_chunk_by_chunk_with_what_each_id_spells(minimal, mode):
    minimal["workload"]["prompts"] = [{"id": "c", "prompt": "x", "stream": True, "chunks_paired": True},
                                      {"id": "s", "prompt": "x", "stream": True}]
    minimal["workload"]["max_tokens"] = minimal["workload"]["min_tokens"] = 8
    w = parse_config(minimal).workload
    with FakeServer(mode, tokens=8) as server:
        records = send(server, w)
    c, s = records["c"], records["s"]
    assert c.text == s.text == "w" * 8 and s.chunks is None and s.token_texts is None
    if mode == "notokenize":  # a server that will not say what ids spell leaves the chunks unjudged
        assert c.token_texts is None and judge_request(c, w) == []
        return
    assert c.token_texts == {i: "w" for i in range(8)}
    assert c.chunks == ([(1, 1)] * 8 if mode == "ok" else [(1, 0)] * 3 + [(1, 1)] * 4 + [(1, 4)])
    found = judge_request(c, w)
    assert [f.reason for f in found] == ([] if mode == "ok" else [Reason.CHUNK_UNPAIRED])
    if found:
        assert (found[0].evidence.chunk, found[0].evidence.streamed, found[0].evidence.tokens) == (0, "", "w")
    assert judge_request(s, w) == []  # the same lag, not asked for: not judged


def test_a_stream_whose_ids_were_told_as_reasoning_keeps_no_chunks(minimal):
    # A reasoning parser tells some ids outside the text: they cannot be held to it, and are not.
    minimal["workload"]["prompts"] = [{"id": "r", "kind": "chat", "messages": [{"role": "user", "content": "x"}],
                                       "stream": True, "chunks_paired": True}]
    minimal["workload"]["max_tokens"] = minimal["workload"]["min_tokens"] = 8
    w = parse_config(minimal).workload
    with FakeServer("reasoning", tokens=8) as server:
        (r,) = send(server, w).values()
    assert r.text == "w" * 5 and r.chunks is None
    assert Reason.CHUNK_UNPAIRED not in {f.reason for f in judge_request(r, w)}


@pytest.mark.parametrize("mode", ["ok", "spaced", "notokenize"])
@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_that_asks_text_decoded_records_the_servers_decode_of_its_ids_after_the_prompts(
        minimal, mode, kind, stream):
    ask = {"kind": kind, "stream": stream, **({"messages": [{"role": "user", "content": "x"}]} if kind == "chat"
                                              else {"prompt": "x"})}
    minimal["workload"]["prompts"] = [{"id": "d", "text_decoded": True, **ask}, {"id": "p", **ask}]
    minimal["workload"]["max_tokens"] = minimal["workload"]["min_tokens"] = 8
    w = parse_config(minimal).workload
    with FakeServer(mode, tokens=8) as server:
        records = send(server, w)
    d, p = records["d"], records["p"]
    assert p.decoded is None and p.token_texts is None
    if mode == "notokenize":  # a server that will not decode leaves the text unjudged
        assert d.decoded is None and judge_request(d, w) == []
        return
    # The fake decodes every id to "w": the prompt's three ids, then the answer's eight.
    assert d.decoded == "w" * 8 and d.text == ("w" if mode == "ok" else " w") * 8
    # What each id spells is asked only where text and decode differ (a special token may explain it).
    assert d.token_texts == (None if mode == "ok" else {i: "w" for i in range(8)})
    found = judge_request(d, w)
    assert [f.reason for f in found] == ([] if mode == "ok" else [Reason.DECODE_MISMATCH])
    if found:
        assert (found[0].evidence.at, found[0].evidence.answer[:4], found[0].evidence.decoded[:4]) == (0, " w w", "wwww")
