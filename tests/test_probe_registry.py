"""Every registered contract probe is whole: the pieces a probe declares, and the places that go
over the registry, are held to one another here instead of in hand-kept lists."""

from __future__ import annotations

import typing

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter

from bench.core.config import Prompt, Workload
from bench.core.config.workload import CORE_CONTENT, PromptCore
from bench.core.diagnosis import SHIPPED_SIGNATURES, load_signatures
from bench.core.evidence import Evidence
from bench.core.judge import judge_request, judge_twins
from bench.core.probes import PROBES, ContractProbe
from bench.core.records import RequestRecord
from bench.core.request import request_body
from bench.core.taxonomy import taxonomy
from bench.core.verdicts import Finding, Reason

IDS = [p.name for p in PROBES]
# A prompt that asks for each probe (and nothing else the probe's check would flag on its own).
ASKING: dict[str, dict] = {
    "stop": {"stop": ["e"]},
    "logit_bias": {"logit_bias": {7: -100}},
    "allowed_token_ids": {"allowed_token_ids": [5, 6, 7]},
    "bad_words": {"bad_words": ["hello"]},
    "decodes_to": {"prompt_ids": [5, 6], "decodes_to": "ab"},
    "tools": {"kind": "chat", "messages": [{"role": "user", "content": "x"}],
              "tools": [{"name": "f", "parameters": {"type": "object"}}], "tool_choice": "required"},
    "n": {"n": 2, "sampling": {"temperature": 1.0, "seed": 1}},
    "json_schema": {"json_schema": {"enum": ["a"]}},
    "top_logprobs": {"top_logprobs": 3},
    "sampling": {"sampling": {"temperature": 1.0, "seed": 1}},
    "temperature": {"sampling": {"temperature": 0.7, "seed": 1}},  # a sampled prompt is held to its sampling
    "finish_reason": {},  # every answer: no field asks for it
    "stop_token_ids": {},  # every answer whose request named stop token ids (a core field)
    "chunks_paired": {"stream": True, "chunks_paired": True},  # asks the client, of a stream
    "text_decoded": {"text_decoded": True},  # asks the client
}


def _prompt(name: str, **extra) -> Prompt:
    fields = {"id": "p", "prompt": "hello", **ASKING[name], **extra}
    if "messages" in fields or "prompt_ids" in fields:
        fields.pop("prompt")
    return Workload(prompts=[fields]).prompts[0]


def test_every_prompt_field_is_the_cores_or_exactly_one_probes():
    owners: dict[str, list[str]] = {name: ["core"] for name in PromptCore.model_fields}
    for probe in PROBES:
        for name in probe.fields.model_fields:
            owners.setdefault(name, []).append(probe.name)
    assert set(Prompt.model_fields) == set(owners), "a probe's fields class is missing from Prompt's bases"
    assert {name: who for name, who in owners.items() if len(who) != 1} == {}
    for probe in PROBES:
        assert issubclass(Prompt, probe.fields), probe.name
        assert probe.content_fields() <= set(probe.fields.model_fields), probe.name
    assert set(PromptCore.model_fields) >= CORE_CONTENT


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_each_probe_declares_what_it_finds_once(probe: ContractProbe):
    assert [p.reason for p in PROBES].count(probe.reason) == 1
    assert probe.name in ASKING, f"add a prompt that asks for {probe.name!r} to this test"
    entry = next(e for e in taxonomy() if e.reason == probe.reason)
    assert entry.text == probe.description and len(probe.description) > 40
    assert entry.function == type(probe).__module__
    members = typing.get_args(typing.get_args(Evidence)[0])
    assert probe.evidence in members, f"{probe.evidence.__name__} is not in bench.core.evidence.Evidence"


def test_the_taxonomy_names_every_reason_once_with_a_description():
    reasons = [e.reason for e in taxonomy()]
    assert sorted(reasons) == sorted(Reason)
    assert all(e.text.strip() and e.found and e.function.startswith("bench.core.") for e in taxonomy())


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_each_probes_signature_is_shipped_and_requires_its_reason(probe: ContractProbe):
    path = SHIPPED_SIGNATURES / f"{probe.signature}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    required = {r for c in data["require"] for r in c.get("reason", [])}
    assert probe.reason.value in required, f"{path.name} does not require {probe.reason}"
    assert probe.signature in {s.id for s in load_signatures()}


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_each_probes_evidence_round_trips_through_json_as_a_finding(probe: ContractProbe):
    required = {name: f for name, f in probe.evidence.model_fields.items() if f.is_required()}
    samples = {int: 3, str: "x", bool: True, float: 0.5}
    values = {}
    for name, f in required.items():
        kind = next(t for t in (bool, int, float, str) if t == f.annotation or t in typing.get_args(f.annotation))
        values[name] = samples[kind]
    evidence = probe.evidence(**values)
    finding = Finding(reason=probe.reason, evidence=evidence, prompt_id="p")
    again = TypeAdapter(Finding).validate_json(finding.model_dump_json())
    assert again == finding and type(again.evidence) is probe.evidence
    assert evidence.text()  # type: ignore[attr-defined]


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_a_prompt_that_asks_for_a_probe_is_seen_asking_and_sent_with_it(probe: ContractProbe):
    prompt = _prompt(probe.name)
    assert probe.asked(prompt)
    plain = Workload(prompts=[{"id": "q", "prompt": "hello"}]).prompts[0]
    # A probe without fields holds every answer, or those that ask for another probe's fields.
    assert probe.asked(plain) == (not probe.fields.model_fields and not ASKING[probe.name])
    assert (probe.name in prompt.probes()) == probe.optional_feature
    workload = Workload(prompts=[prompt])
    body, without = request_body(prompt, workload, "m", None), request_body(plain, workload, "m", None)
    sent = {k: v for k, v in body.items() if without.get(k) != v}
    # What the probe asks for reaches the server: a token-id prompt's ids are the core's, and
    # text_decoded asks the server's /detokenize after the answer, not the request.
    asks = probe.fields.model_fields.keys() - {"decodes_to", "text_decoded"}
    asks_by_another = not probe.fields.model_fields and bool(ASKING[probe.name])  # another probe's fields
    assert bool(sent.keys() - {"prompt", "messages", "min_tokens"}) == bool(asks or asks_by_another), sent


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_twins_differ_in_a_probes_content_fields_only_as_it_declares(probe: ContractProbe):
    a = _prompt(probe.name)
    b = a.model_copy(update={"id": "q"})
    assert a.content() == b.content()
    for name in probe.fields.model_fields:
        changed = Prompt.model_fields[name].default if getattr(a, name) != Prompt.model_fields[name].default \
            else ASKING[probe.name].get(name)
        other = a.model_copy(update={name: changed})
        same = a.content() == other.content()
        assert same == (name not in probe.content_fields()), (probe.name, name)


def test_a_probe_found_on_one_answer_is_judged_in_registration_order():
    # One answer that breaks two probes at once: their findings come in the registry's order.
    w = Workload(prompts=[{"id": "p", "prompt": "x", "stop": ["e"], "logit_bias": {7: -100},
                           "json_schema": {"enum": ["a"]}, "ignore_eos": False, "min_tokens": None}])
    req = RequestRecord(prompt_id="p", repeat=0, api="completion", stream=False, cell_id="c", started_at=0.0,
                        latency_s=0.1, text="hello", token_ids=[7, 8], completion_tokens=2, finish_reason="length")
    reasons = [f.reason for f in judge_request(req, w) if f.reason in {p.reason for p in PROBES}]
    order = [p.reason for p in PROBES]
    assert reasons == sorted(reasons, key=order.index) and len(reasons) == 3


def test_the_first_probe_that_judges_twins_judges_them():
    # Sampled twins asking other numbers of logprobs: the logprobs-k probe judges them, not the seed.
    w = Workload(prompts=[
        {"id": "a", "prompt": "x", "sampling": {"temperature": 1.0, "seed": 1}, "top_logprobs": 1},
        {"id": "b", "prompt": "x", "sampling": {"temperature": 1.0, "seed": 1}, "top_logprobs": 5}])

    def answer(pid: str, ids: list[int]) -> RequestRecord:
        return RequestRecord(prompt_id=pid, repeat=0, api="completion", stream=False, cell_id="c", started_at=0.0,
                             latency_s=0.1, text="t", token_ids=ids, completion_tokens=len(ids), finish_reason="length")

    found = judge_twins([answer("a", [1, 2]), answer("b", [1, 3])], w)
    assert [f.reason for f in found] == [Reason.LOGPROBS_VARY_WITH_K]


def test_every_probe_module_registers_a_probe():
    # A module left out of bench/core/probes/__init__.py's imports would never be registered.
    import importlib
    import pkgutil

    import bench.core.probes as package

    helpers = {"base", "validate"}
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - helpers
    registered = {type(p).__module__.rsplit(".", 1)[1] for p in PROBES}
    assert modules == registered
    for name in modules:
        module = importlib.import_module(f"bench.core.probes.{name}")
        assert any(isinstance(v, type) and issubclass(v, ContractProbe) and v is not ContractProbe
                   for v in vars(module).values()), name


def test_every_fields_class_is_a_strict_model():
    for probe in PROBES:
        assert issubclass(probe.fields, BaseModel) and probe.fields.model_config.get("extra") == "forbid"
