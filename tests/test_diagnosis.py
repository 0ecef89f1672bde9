"""Diagnosis, fast tier: log patterns on recorded real vLLM logs (tests/data/logs/), the matrix
contrast, and each shipped signature against evidence it must match and evidence it must not.
The slow tier checks the whole chain on real runs (tests/test_e2e_vllm.py, test_e2e_diagnose.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.core.conditions import (
    CONDITIONS,
    AllCondition,
    AnyCondition,
    EmptyShardsCondition,
    KilledCondition,
    KnobCondition,
    ReleaseCondition,
    parse_condition,
)
from bench.core.config import ConfigError
from bench.core.contrast import contrast
from bench.core.diagnosis import SHIPPED_SIGNATURES, CellEvidence, Signature, diagnose_cell, load_signatures
from bench.core.evidence import FinishReasonWrong, RepeatedToken, ServerExit, TwinsDiffer
from bench.core.logfacts import log_facts
from bench.core.probes import PROBES
from bench.core.records import CellSummary, Fingerprint, PreflightRecord
from bench.core.verdicts import Finding, Verdict

LOGS = Path(__file__).parent / "data" / "logs"
SIGNATURES = {s.id: s for s in load_signatures()}


def log(name: str) -> str:
    return (LOGS / name).read_text()


def cell(load_format: str, image: str, verdict: str = "pass", reasons: dict | None = None, model: str = "m",
         platform: str = "cpu") -> CellSummary:
    return CellSummary(cell_id=f"{model}__{load_format}__{platform}__{image}", model=model, load_format=load_format,
                       platform=platform, image=image, baseline_id=None, runs=2, failures=2 if verdict == "fail" else 0,
                       verdict=Verdict(verdict), reasons=reasons or {})


# ---- facts from real logs ----------------------------------------------------------------

def test_the_streamers_progress_bar_stopping_short_is_the_count_never_received():
    facts = log_facts(log("vllm-0.32-runai-0.16.0-stream-stop.log"))
    (bar,) = facts.loaders
    assert (bar.loader, bar.done, bar.total, bar.short) == ("Runai Model Streamer", 0, 21, True)
    assert facts.weights_load_s is None  # the runai loader never logs a finished load here
    assert facts.kv_cache_tokens == 1_048_576


def test_a_healthy_load_completes_its_bar_and_logs_its_time():
    runai = log_facts(log("vllm-0.32-runai-0.17.0-healthy.log"))
    assert [(p.done, p.total, p.short) for p in runai.loaders] == [(272, 272, False)]
    plain = log_facts(log("vllm-0.32-safetensors-healthy.log"))
    assert [(p.loader, p.short) for p in plain.loaders] == [("safetensors checkpoint shards", False)]
    assert plain.weights_load_s is not None and plain.engine_init_s is not None
    assert plain.warnings == []  # the CPU backend's start-up notice is not a warning that matters


def test_boot_errors_and_the_innermost_frames_of_a_traceback():
    kv = log_facts(log("vllm-0.32-boot-kv-cache-too-small.log"))
    assert any(e.startswith("ValueError: To serve at least one request") for e in kv.errors), kv.errors
    shutdown = log_facts(log("vllm-0.32-shutdown-engine-dead.log"))
    (tb,) = [t for t in shutdown.tracebacks if "EngineDeadError" in t.exception]
    assert tb.frames[-1].startswith("vllm/v1/engine/core_client.py:") and tb.frames[-1].endswith("in get_output_async")


# ---- contrast ----------------------------------------------------------------------------

BUG = {"empty_text": 2, "degenerate": 2}


def smoke_like() -> list[CellSummary]:
    return [cell("safetensors", "s16"), cell("runai_streamer", "s16", "fail", BUG),
            cell("safetensors", "s17"), cell("runai_streamer", "s17")]


def test_the_contrast_names_the_smallest_separating_axis_values_and_the_passing_neighbours():
    prints = [Fingerprint(image="s16", runai_model_streamer="0.16.0", vllm="0.32.0"),
              Fingerprint(image="s17", runai_model_streamer="0.17.0", vllm="0.32.0")]
    (c,) = contrast(smoke_like(), prints)
    assert c.only_with == {"load_format": "runai_streamer", "image": "s16"}
    assert {(n.axis, n.value) for n in c.passing_neighbours} == {("load_format", "safetensors"), ("image", "s17")}
    assert [(f.field, f.failing, f.passing) for f in c.fingerprint] == [("runai_model_streamer", ["0.16.0"], ["0.17.0"])]
    assert c.describe().startswith("fails only with load_format=runai_streamer and image=s16; passes with ")


def test_no_contrast_when_nothing_passes_and_none_for_passing_cells():
    all_fail = [cell("safetensors", "s16", "fail", BUG), cell("runai_streamer", "s16", "fail", BUG)]
    assert [c.only_with for c in contrast(all_fail)] == [{}, {}]
    assert contrast(all_fail)[0].describe() == "no contrast: nothing in the matrix passes to compare with"
    assert contrast([cell("safetensors", "s16")]) == []


# ---- signatures: each against a case it must match and one it must not ---------------------

INSPECT_RISK = PreflightRecord(kind="inspect", model="m", ok=True, notes=[
    "stream_stop_risk: listing order: stream stops at empty shard model-00001-of-00010 (first); lost 21/21 tensors"],
    stream_stop_shards=["model-00001-of-00010.safetensors"])
AUDIT_LOST = PreflightRecord(kind="audit", model="m", image="s16", load_format="runai_streamer", ok=False, lost=42,
                             problems=["order=sorted loader=streamer: 0/21 tensors delivered; stream stops at empty shard"])


def evidence(c: CellSummary, load_format: str, logs: list[str] = (), **kw) -> CellEvidence:  # type: ignore[assignment]
    texts = [log(n) for n in logs]
    return CellEvidence(cell=c, vllm_load_format=load_format, logs=[log_facts(t) for t in texts],
                        log_text="\n".join(texts), **kw)


def first(ev: CellEvidence) -> str | None:
    d = diagnose_cell(ev, list(SIGNATURES.values()))
    return d.matches[0].signature if d.matches else None


def test_empty_shard_stream_stop_matches_the_smoke_bug_from_contrast_log_and_fingerprint_alone():
    bug = smoke_like()[1]
    (c,) = contrast(smoke_like())
    ev = evidence(bug, "runai_streamer", ["vllm-0.32-runai-0.16.0-stream-stop.log"], contrast=c,
                  fingerprint=Fingerprint(image="s16", runai_model_streamer="0.16.0"))
    d = diagnose_cell(ev, list(SIGNATURES.values()))
    m = d.matches[0]
    assert m.signature == "runai-empty-shard-stream-stop" and m.contradicts == []
    assert {e.condition.split(":")[0] for e in m.unknown} == {"empty_shards", "audit_lost"}  # no pre-flight here
    assert "the server's Runai Model Streamer loader stopped at 0/21" in [e.says for e in m.supports]
    with_preflight = evidence(bug, "runai_streamer", ["vllm-0.32-runai-0.16.0-stream-stop.log"], contrast=c,
                              fingerprint=Fingerprint(image="s16", runai_model_streamer="0.16.0"),
                              inspect=INSPECT_RISK, audit=AUDIT_LOST)
    assert diagnose_cell(with_preflight, list(SIGNATURES.values())).matches[0].score == m.score + 2


def test_empty_shard_stream_stop_does_not_match_a_healthy_streamer_or_another_loader():
    healthy = evidence(cell("runai_streamer", "s17", "fail", {"expectation_failed": 1}), "runai_streamer",
                       ["vllm-0.32-runai-0.17.0-healthy.log"],
                       fingerprint=Fingerprint(image="s17", runai_model_streamer="0.17.0"))
    d = diagnose_cell(healthy, [SIGNATURES["runai-empty-shard-stream-stop"]])
    # It can still be named, but everything specific speaks against it.
    (m,) = d.matches
    assert m.score <= 0 and {e.says for e in m.contradicts} >= {
        "the server's Runai Model Streamer loader completed 272/272", "runai_model_streamer 0.17.0 (fixed in 0.16.1 and later)"}
    plain = evidence(cell("safetensors", "s16", "fail", BUG), "safetensors", ["vllm-0.32-safetensors-healthy.log"])
    assert first(plain) is None


def test_a_failure_no_signature_knows_gets_its_evidence_and_no_cause():
    odd = evidence(cell("safetensors", "s16", "fail", {"server_died": 1}), "safetensors", ["vllm-0.32-safetensors-healthy.log"])
    d = diagnose_cell(odd, list(SIGNATURES.values()))
    assert d.matches == [] and not d.known
    assert d.log_evidence and d.contrast == "no contrast"


@pytest.mark.parametrize("name", ["vllm-0.32-boot-kv-cache-too-small.log", "vllm-0.32-boot-cpu-memory-utilization.log"])
def test_kv_cache_that_does_not_fit_matches_real_boot_failures(name):
    ev = evidence(cell("safetensors", "s16", "fail", {"boot_failed": 2}), "safetensors", [name])
    assert first(ev) == "kv-cache-does-not-fit"


def test_kv_cache_does_not_match_a_boot_failure_of_another_kind():
    ev = evidence(cell("safetensors", "s16", "fail", {"boot_failed": 2}), "safetensors", ["vllm-0.32-runai-0.17.0-healthy.log"])
    assert "kv-cache-does-not-fit" not in [m.signature for m in diagnose_cell(ev, list(SIGNATURES.values())).matches]


def test_min_tokens_not_honoured_needs_short_outputs_that_stopped():
    short = cell("safetensors", "s16", "fail", {"short_output": 2})
    assert first(evidence(short, "safetensors", short_finish_reasons=["stop", "stop"])) == "min-tokens-not-honoured"
    assert first(evidence(short, "safetensors", short_finish_reasons=["length"])) is None  # cut by max_tokens, not ignored


def test_buffer_reuse_needs_the_audit_to_see_bytes_differ():
    c = cell("runai_streamer", "s16", "fail", {"weights_lost": 1})
    reused = PreflightRecord(kind="audit", model="m", image="s16", load_format="runai_streamer", ok=False, lost=0,
                             problems=["order=sorted loader=vllm: 21/21 tensors delivered, 3 differ from the files"])
    assert first(evidence(c, "runai_streamer", audit=reused)) == "yielded-tensor-buffer-reuse"
    assert "yielded-tensor-buffer-reuse" not in [
        m.signature for m in diagnose_cell(evidence(c, "runai_streamer", audit=AUDIT_LOST), list(SIGNATURES.values())).matches]


def test_unicode_decode_error_at_exit_is_named_a_symptom_and_ranked_after_a_cause():
    text = log("vllm-0.32-runai-0.16.0-stream-stop.log") + (
        "\nException ignored in atexit callback: <function _clear_torch_ops_cache>\nTraceback (most recent call last):\n"
        '  File "/x/site-packages/torch/library.py", line 99, in _clear_torch_ops_cache\n'
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte\n")
    c = cell("runai_streamer", "s16", "fail", {**BUG, "exit_exception": 1})
    ev = CellEvidence(cell=c, vllm_load_format="runai_streamer", logs=[log_facts(text)], log_text=text)
    d = diagnose_cell(ev, list(SIGNATURES.values()))
    assert [m.signature for m in d.matches][:2] == ["runai-empty-shard-stream-stop", "exit-unicode-decode-error"]
    assert d.matches[1].symptom_only and not d.matches[0].symptom_only
    clean_exit = evidence(cell("safetensors", "s16", "fail", {"exit_exception": 1}), "safetensors",
                          ["vllm-0.32-shutdown-engine-dead.log"])
    assert first(clean_exit) is None


def test_memory_limit_zero_matches_the_loud_failure_not_the_silent_one():
    booted = evidence(cell("runai_streamer", "s16", "fail", {"boot_failed": 2}), "runai_streamer",
                      ["vllm-0.32-runai-0.16.0-memory-limit-0.log"], env={"RUNAI_STREAMER_MEMORY_LIMIT": "0"})
    assert first(booted) == "runai-memory-limit-zero"
    loud = evidence(cell("runai_streamer", "s16", "fail", {"weights_lost": 1}), "runai_streamer",
                    env={"RUNAI_STREAMER_MEMORY_LIMIT": "0"},
                    audit=AUDIT_LOST.model_copy(
                        update={"problems": ["loader raised ValueError: max() arg is an empty sequence"]}))
    assert first(loud) in ("runai-memory-limit-zero", "runai-empty-shard-stream-stop")
    assert "runai-memory-limit-zero" in [m.signature for m in diagnose_cell(loud, list(SIGNATURES.values())).matches]
    silent = evidence(cell("runai_streamer", "s16", "fail", BUG), "runai_streamer", ["vllm-0.32-runai-0.16.0-stream-stop.log"])
    assert "runai-memory-limit-zero" not in [m.signature for m in diagnose_cell(silent, list(SIGNATURES.values())).matches]


def test_empty_shards_reads_the_inspects_stream_stop_shards_never_its_notes():
    sig = SIGNATURES["runai-empty-shard-stream-stop"]
    (condition,) = [c for c in sig.support if isinstance(c, EmptyShardsCondition)]
    bug = evidence(cell("runai_streamer", "s16", "fail", BUG), "runai_streamer")
    assert condition.check(bug.model_copy(update={"inspect": INSPECT_RISK})) == (
        True, "inspect: the stream stops at empty shard model-00001-of-00010")
    two = INSPECT_RISK.model_copy(update={"stream_stop_shards": ["a.safetensors", "b.safetensors"]})
    assert condition.check(bug.model_copy(update={"inspect": two})) == (
        True, "inspect: the stream stops at empty shards a, b")
    clean = PreflightRecord(kind="inspect", model="m", ok=True, stream_stop_shards=[])
    assert condition.check(bug.model_copy(update={"inspect": clean})) == (False, "inspect found no empty shard")
    # A record made before the field: its notes still say "empty shard", and are not read.
    older = PreflightRecord.model_validate_json(INSPECT_RISK.model_dump_json(exclude={"stream_stop_shards"}))
    assert older.stream_stop_shards is None and "empty shard" in older.notes[0]
    holds, says = condition.check(bug.model_copy(update={"inspect": older}))
    assert holds is None and "older regbench" in says
    assert condition.check(bug) == (None, "no pre-flight inspect")


def test_each_condition_key_is_one_registered_class_and_reads_back_as_written():
    assert all(list(cls.model_fields) == [key] and cls.key == key for key, cls in CONDITIONS.items())
    written = [c for path in SHIPPED_SIGNATURES.glob("*.yaml")
               for part in ("require", "support") for c in yaml.safe_load(path.read_text()).get(part, [])]
    parsed = [parse_condition(c) for c in written]
    assert {type(p) for p in parsed} <= set(CONDITIONS.values())
    assert [p.text() for p in parsed] == [f"{k}: {v}" for c in written for k, v in c.items()]
    # Conditions inside `any` and `all` are the same classes, and a `release` inside either needs releases.
    nested = parse_condition({"any": [{"knob": "serial"}, {"all": [{"release": "silent"}, {"killed": True}]}]})
    assert [type(c) for c in nested.walk()] == [AnyCondition, KnobCondition, AllCondition, ReleaseCondition,
                                                 KilledCondition]
    with pytest.raises(ValueError, match="needs the signature's `releases`"):
        Signature.model_validate({"id": "x", "title": "x", "explanation": "x", "fixes": ["x"],
                                  "require": [{"reason": ["degenerate"]}], "support": [nested.model_dump()]})


def test_every_shipped_signature_is_tested_here_and_a_users_own_replaces_a_shipped_one(tmp_path):
    source = Path(__file__).read_text()
    # A contract probe's signature is tested through the registry (OWN_SIGNATURES).
    untested = sorted(s for s in SIGNATURES if f'"{s}"' not in source and s not in {sig for _, sig in OWN_SIGNATURES})
    assert untested == []
    (tmp_path / "mine.yaml").write_text(
        "id: kv-cache-does-not-fit\ntitle: ours\nrequire: [{reason: [boot_failed]}]\nexplanation: x\nfixes: [y]\n")
    mine = {s.id: s for s in load_signatures(tmp_path)}
    assert mine["kv-cache-does-not-fit"].title == "ours" and len(mine) == len(SIGNATURES)
    assert isinstance(mine["kv-cache-does-not-fit"], Signature)


def test_a_signature_naming_a_finding_the_taxonomy_lacks_fails_at_load_with_its_file_and_key(tmp_path):
    # A typo used to load and never match: the signature silently explained nothing.
    (tmp_path / "typo.yaml").write_text(
        "id: typo\ntitle: t\nrequire: [{reason: [tool_call_invlaid]}]\nexplanation: x\nfixes: [y]\n")
    with pytest.raises(ConfigError) as refused:
        load_signatures(tmp_path)
    said = str(refused.value)
    assert str(tmp_path / "typo.yaml") in said and "require.0.reason.0" in said and "tool_call_invlaid" in said
    (tmp_path / "typo.yaml").write_text(
        "id: typo\ntitle: t\nrequire: [{without_reason: [divergance]}]\nexplanation: x\nfixes: [y]\n")
    with pytest.raises(ConfigError, match="without_reason"):
        load_signatures(tmp_path)
    # A key no condition has, at the top or inside `any`: named with where it is.
    for written, where in (("{reasn: [degenerate]}", "require.0.reasn"), ("{any: [{lgo: x}]}", "require.0.any.0.lgo")):
        (tmp_path / "typo.yaml").write_text(f"id: typo\ntitle: t\nrequire: [{written}]\nexplanation: x\nfixes: [y]\n")
        with pytest.raises(ConfigError) as refused:
            load_signatures(tmp_path)
        said = str(refused.value)
        assert str(tmp_path / "typo.yaml") in said and where in said and "no condition" in said, said
    (tmp_path / "typo.yaml").write_text(
        "id: typo\ntitle: t\nrequire: [{log: x, knob: serial}]\nexplanation: x\nfixes: [y]\n")
    with pytest.raises(ConfigError, match="exactly one key"):
        load_signatures(tmp_path)


def test_a_quantization_the_platform_lacks_matches_fp8_on_the_cpu_backend_not_a_kv_failure():
    fp8 = evidence(cell("safetensors", "s16", "fail", {"boot_failed": 2}), "safetensors", ["vllm-0.32-boot-fp8-on-cpu.log"])
    assert first(fp8) == "dtype-or-quantization-unsupported"
    # An fp8 KV cache on a CPU without AVX-512 (the fp8-kv-cache knob on an AVX2 host).
    kv_fp8 = evidence(cell("safetensors", "s16", "fail", {"boot_failed": 1}), "safetensors",
                      ["vllm-0.32-boot-fp8-kv-cache-avx2.log"])
    assert first(kv_fp8) == "dtype-or-quantization-unsupported"
    kv = evidence(cell("safetensors", "s16", "fail", {"boot_failed": 2}), "safetensors",
                  ["vllm-0.32-boot-kv-cache-too-small.log"])
    assert "dtype-or-quantization-unsupported" not in [m.signature for m in diagnose_cell(kv, list(SIGNATURES.values())).matches]


def test_a_missing_cxx_compiler_matches_the_container_that_died_on_prompt_logprobs():
    died = evidence(cell("safetensors", "s17", "fail", {"server_died": 1, "reference_nll": 1}), "safetensors",
                    ["vllm-0.32-container-no-cxx-compiler.log"])
    assert first(died) == "inductor-no-cxx-compiler"
    # With g++ but no Python.h: the first request asking for generated-token logprobs.
    headers = evidence(cell("safetensors", "s17", "fail", {"server_died": 1, "http_error": 1}), "safetensors",
                       ["vllm-0.32-container-no-python-headers.log"])
    assert first(headers) == "inductor-no-cxx-compiler"
    healthy = evidence(cell("safetensors", "s17", "fail", {"server_died": 1}), "safetensors",
                       ["vllm-0.32-safetensors-healthy.log"])
    assert "inductor-no-cxx-compiler" not in [m.signature for m in diagnose_cell(healthy, list(SIGNATURES.values())).matches]


def test_the_noise_of_a_normal_shutdown_is_not_evidence_but_the_same_error_while_serving_is(tmp_path):
    """The EngineDeadError vLLM prints at some SIGTERMs (bench.core.judge.is_benign) is left out of
    the diagnosis's server-log evidence, also when the passing cell's server did not print it that
    time; before the stop request it is the engine dying, and kept. The logs as vLLM wrote them:
    the failing cell's is the recorded shutdown (its traceback's lines end in CR LF, which an
    episode's text rejoined with LF is not found in), the passing cell's the recorded healthy
    server that stopped without the traceback."""
    import json

    from bench.store.publish import regenerate

    from . import synth

    data = (LOGS / "vllm-0.32-shutdown-engine-dead.log").read_bytes()
    baseline = (LOGS / "vllm-0.32-safetensors-healthy.log").read_bytes()
    assert b"EngineDeadError" not in baseline
    stop_at = data.index(b"(APIServer pid=9789) INFO 11-30 12:28:45 [launcher.py:254] [shutdown]")
    assert b"[async_llm.py:906] Traceback (most recent call last):\r\n" in data[stop_at:]
    for run_id, at in (("stopped", stop_at), ("died", None)):
        results = synth.create(tmp_path, run_id, synth.matrix(repeats=1))
        synth.fingerprint(results, "img", runai_model_streamer="0.16.0")
        synth.add_run(results, "m__safetensors__cpu__img", 1, log=baseline, stop_at=baseline.index(b"[shutdown]"))
        synth.add_run(results, "m__runai_streamer__cpu__img", 1, ids=[0] * 128, text="", log=data, stop_at=at)
        regenerate(results.path)
        (d,) = json.loads((results.path / "diagnosis.json").read_text())["cells"]
        assert d["verdict"] == "fail"
        dead = [line for line in d["log_evidence"] if "EngineDeadError" in line]
        if at is None:
            assert dead, d["log_evidence"]
        else:
            assert dead == [], d["log_evidence"]
            for shown in ("summary.md", "report.html"):
                assert "EngineDeadError" not in (results.path / shown).read_text(), shown


def test_the_benign_episodes_leave_the_log_line_by_line_with_its_line_ends():
    from bench.core.judge import unexpected_exit_episodes, without_benign_episodes

    data = (LOGS / "vllm-0.32-shutdown-engine-dead.log").read_bytes().decode()
    after = data[data.index("[shutdown] API server: shutdown triggered"):]
    kept = without_benign_episodes(after)
    assert "EngineDeadError" not in kept and "output_handler" not in kept
    # What is not benign stays, as written.
    unicode_at_exit = "Exception ignored in: <function _clear at 0x1>\r\nTraceback (most recent call last):\r\n" \
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff\r\n"
    both = without_benign_episodes(after + unicode_at_exit)
    assert both.endswith(unicode_at_exit) and "EngineDeadError" not in both
    assert unexpected_exit_episodes(both) == unexpected_exit_episodes(after + unicode_at_exit)


def release_map() -> list[tuple[str, str, str]]:
    """(first, last, outcome) of each row of the README's measured release map."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme[readme.index("| releases | outcome |"):].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        releases, outcome = (c.strip() for c in line.strip("|").split("|", 1))
        first, _, last = (r.strip() for r in releases.partition("–"))
        rows.append((first, last or first, outcome))
    return rows


def test_the_stream_stops_releases_are_written_once_and_agree_with_the_measured_map():
    sig = SIGNATURES["runai-empty-shard-stream-stop"]
    releases = sig.releases
    assert releases is not None
    regime = {"loses weights silently": "silent", "passes": "fixed"}
    rows = release_map()
    assert len(rows) == 5
    for first, last, outcome in rows:
        want = regime.get(outcome, "loud" if outcome.startswith("fails loudly") else outcome)
        assert (releases.regime(first), releases.regime(last)) == (want, want), (first, last, outcome)
    # The texts are derived from it: the explanation, the first fix, README's first paragraph.
    assert releases.describe() in sig.explanation and "{releases}" not in sig.explanation
    assert sig.fixes[0].startswith(f"Upgrade runai-model-streamer to {releases.fixed_in} or later")
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    first_paragraph = " ".join(next(p for p in readme.split("\n\n") if p.startswith("The motivating case")).split())
    assert f"runai-model-streamer ({releases.silent_text()}, its #157; fixed in {releases.fixed_in})" in first_paragraph
    assert f"release by release, see *Which version broke it*: {releases.describe()}" in " ".join(readme.split())


@pytest.mark.parametrize(("version", "holds", "says"), [
    ("0.13.3", True, "loses data silently in 0.13.3 and 0.15.0–0.16.0"),
    ("0.16.0", True, "loses data silently in 0.13.3 and 0.15.0–0.16.0"),
    ("0.14.0", False, "fails loudly in 0.13.0–0.13.2 and 0.13.4–0.14.0"),
    ("0.17.0", False, "fixed in 0.16.1 and later"),
    ("0.12.0", None, "older than every release measured"),
])
def test_the_release_condition_reads_the_signatures_own_ranges(version, holds, says):
    sig = SIGNATURES["runai-empty-shard-stream-stop"]
    (condition,) = [c for c in sig.support if isinstance(c, ReleaseCondition)]
    ev = evidence(cell("runai_streamer", "s", "fail", BUG), "runai_streamer", [],
                  fingerprint=Fingerprint(image="s", runai_model_streamer=version))
    assert condition.check(ev, sig.releases) == (holds, f"runai_model_streamer {version} ({says})")


def test_a_release_condition_needs_the_signatures_releases():
    base = {"id": "x", "title": "x", "explanation": "x", "fixes": ["x"], "require": [{"release": "silent"}]}
    with pytest.raises(ValueError, match="needs the signature's `releases`"):
        Signature.model_validate(base)
    with pytest.raises(ValueError, match="not a release or a range"):
        Signature.model_validate({**base, "releases": {"package": "vllm", "silent": ["0.1..0.2"], "fixed_in": "0.3"}})


# ---- the signatures of faults injected into real vLLM (faults/, docs/faults.md) -----------------

def _degenerate(token_id: int) -> Finding:
    return Finding(reason="degenerate", prompt_id="p", evidence=RepeatedToken(count=128, token_id=token_id))


def _twins(text: bool) -> Finding:
    return Finding(reason="inconsistent_output", prompt_id="p-again", evidence=TwinsDiffer(
        other_prompt_id="p", position=3, token=None if text else 99, other_token=None if text else 3,
        streamed=text, other_streamed=False, this_text="def main():\n" if text else None,
        other_text="\n" if text else None))


def names(ev: CellEvidence) -> list[str]:
    return [m.signature for m in diagnose_cell(ev, list(SIGNATURES.values())).matches]


def test_nan_logits_is_one_repeated_id_0_with_no_weights_lost():
    nan = cell("safetensors", "s16", "fail", {"degenerate": 2, "empty_text": 2, "divergence": 2})
    assert first(evidence(nan, "safetensors", findings=[_degenerate(0)])) == "nan-logits"
    assert first(evidence(cell("safetensors", "s16", "fail", {"non_finite_output": 2}), "safetensors")) == "nan-logits"
    assert "nan-logits" not in names(evidence(nan, "safetensors", findings=[_degenerate(7)]))
    # Lost weights give id 0 too: with the audit's loss it is not NaN logits.
    lost = cell("runai_streamer", "s16", "fail", {**BUG, "weights_lost": 1})
    assert "nan-logits" not in names(evidence(lost, "runai_streamer", findings=[_degenerate(0)], audit=AUDIT_LOST))
    # The smoke bug without a pre-flight: the stream stop still comes first.
    (c,) = contrast(smoke_like())
    bug = evidence(smoke_like()[1], "runai_streamer", ["vllm-0.32-runai-0.16.0-stream-stop.log"], contrast=c,
                   fingerprint=Fingerprint(image="s16", runai_model_streamer="0.16.0"), findings=[_degenerate(0)])
    assert names(bug)[0] == "runai-empty-shard-stream-stop" and "nan-logits" in names(bug)


def test_a_knob_that_breaks_names_its_cause_and_twins_of_other_tokens_name_both():
    def knob_cell(knob: str) -> CellSummary:
        return cell("safetensors", f"s16+{knob}", "fail", {"invariance_broken": 2}).model_copy(update={"knob": knob})

    assert names(evidence(knob_cell("serial"), "safetensors")) == ["batch-dependent-output"]
    assert names(evidence(knob_cell("no-prefix-caching"), "safetensors")) == ["prefix-cache-corruption"]
    assert names(evidence(knob_cell("chunked-prefill"), "safetensors")) == []
    twins = cell("safetensors", "s16", "fail", {"inconsistent_output": 2, "divergence": 2})
    assert sorted(names(evidence(twins, "safetensors", findings=[_twins(text=False)]))) == [
        "batch-dependent-output", "prefix-cache-corruption"]


def test_the_same_tokens_told_as_other_text_is_the_streaming_detokenizer():
    told = cell("safetensors", "s16", "fail", {"inconsistent_output": 2})
    assert names(evidence(told, "safetensors", findings=[_twins(text=True)])) == ["stream-text-differs"]
    assert "stream-text-differs" not in names(evidence(told, "safetensors", findings=[_twins(text=False)]))



def test_the_same_tokens_told_otherwise_by_a_tool_parser_is_the_parser_not_the_detokenizer():
    # vllm#53255 streamed beside whole: the stream's parser held back a call the stop string cut
    # ("" and `stop`), the whole answer kept it as content and said `tool_calls`.
    told = cell("safetensors", "s16", "fail", {"inconsistent_output": 1, "finish_reason_mismatch": 1})
    parsed = _twins(text=True).model_copy(update={"evidence": _twins(text=True).evidence.model_copy(
        update={"parsed": True, "this_text": "<finish_reason stop>", "other_text": "<tool_call>{"})})
    wrong = Finding(reason="finish_reason_mismatch", prompt_id="p", evidence=FinishReasonWrong(
        problem="`tool_calls`, but no tool call came back", finish_reason="tool_calls", tokens=20, max_tokens=48))
    assert sorted(names(evidence(told, "safetensors", findings=[parsed, wrong]))) == [
        "finish-reason-wrong", "stream-tool-parse-differs"]
    assert "stream-tool-parse-differs" not in names(evidence(told, "safetensors", findings=[_twins(text=True)]))


def test_empty_text_for_the_baselines_tokens_is_the_text_lost_not_the_model():
    empty = cell("safetensors", "s16", "fail", {"empty_text": 2, "usage_text_mismatch": 2})
    assert first(evidence(empty, "safetensors")) == "empty-text-normal-tokens"
    assert "empty-text-normal-tokens" not in names(evidence(cell("runai_streamer", "s16", "fail", BUG), "runai_streamer"))


# ---- what the diagnosis leaves out and what it rules out ------------------------------------------

def test_a_line_a_passing_cells_log_shows_too_is_no_evidence_but_the_cells_own_are():
    """vLLM prints EngineDeadError at every SIGTERM: the healthy baseline's log holds it too, so it
    says nothing about a length off by one; the cell's own lines stay."""
    shutdown = log("vllm-0.32-shutdown-engine-dead.log")
    short = cell("safetensors", "s16", "fail", {"short_output": 1})
    alone = diagnose_cell(evidence(short, "safetensors", ["vllm-0.32-shutdown-engine-dead.log"]), [])
    assert any("EngineDeadError" in line for line in alone.log_evidence), alone.log_evidence  # nothing to compare with
    beside = evidence(short, "safetensors", ["vllm-0.32-shutdown-engine-dead.log"],
                      healthy_logs=[log_facts(shutdown)], healthy_log_text=shutdown)
    d = diagnose_cell(beside, [])
    assert not any("EngineDeadError" in line for line in d.log_evidence + d.log_context), d.log_evidence
    assert any(line.startswith("KV cache") for line in d.log_context)  # what the log says of loading: context
    # A signature's log pattern that a healthy log matches too is not evidence for it either.
    sig = Signature.model_validate({"id": "x", "title": "x", "explanation": "x", "fixes": ["x"],
                                    "require": [{"reason": ["short_output"]}], "support": [{"log": "EngineDeadError"}]})
    (m,) = diagnose_cell(beside, [sig]).matches
    assert [e.condition for e in m.unknown] == ["log: EngineDeadError"] and "shows it too" in m.unknown[0].says
    (m,) = diagnose_cell(evidence(short, "safetensors", ["vllm-0.32-shutdown-engine-dead.log"]), [sig]).matches
    assert [e.condition for e in m.supports] == ["reason: ['short_output']", "log: EngineDeadError"]


def test_what_every_healthy_server_logs_too_is_context_apart_from_the_evidence():
    """The KV cache and the load time are in every server's log, the passing cells' too: context,
    shown apart, never a reason. The recorded runai-model-streamer 0.16.0 stream stop beside the
    recorded healthy safetensors server: the loader stopping at 0/21 is the cell's own."""
    from bench.core.diagnosis import Diagnosis
    from bench.report.summary import diagnosis_markdown

    stop = cell("runai_streamer", "s16", "fail", BUG)
    healthy = [log_facts(log("vllm-0.32-safetensors-healthy.log")), log_facts(log("vllm-0.32-runai-0.17.0-healthy.log"))]
    beside = evidence(stop, "runai_streamer", ["vllm-0.32-runai-0.16.0-stream-stop.log"], healthy_logs=healthy)
    d = diagnose_cell(beside, [])
    assert d.log_evidence == ["weights loader 'Runai Model Streamer' stopped at 0/21: 21 never reached the server"]
    assert d.log_context == ["KV cache 1,048,576 tokens"]
    # The same line is the cell's own where no passing cell printed one of its shape.
    assert "KV cache 1,048,576 tokens" in diagnose_cell(evidence(stop, "runai_streamer",
                                                                 ["vllm-0.32-runai-0.16.0-stream-stop.log"]), []).log_evidence
    # A figure that differs is the same fact: its shape is shared.
    weights = CellEvidence(cell=cell("safetensors", "s16", "fail", {"short_output": 1}), vllm_load_format="safetensors",
                           logs=[log_facts("INFO Loading weights took 0.35 seconds\nWARNING casting to float32\n")],
                           healthy_logs=healthy)
    w = diagnose_cell(weights, [])
    assert (w.log_evidence, w.log_context) == (["warning: WARNING casting to float32"], ["weights loaded in 0.35 s"])
    md = "\n".join(diagnosis_markdown(Diagnosis(cells=[d])))
    assert "- Server log: KV cache" not in md and "- Context, the passing cells' logs show it too: KV cache 1,048,576" in md


def test_lines_that_differ_only_in_a_figure_are_one_line_with_the_range():
    runs = ["INFO Loading weights took 0.02 seconds\nINFO KV cache size: 1,024 tokens\n",
            "INFO Loading weights took 0.01 seconds\nINFO KV cache size: 1,024 tokens\n",
            "INFO Loading weights took 0.35 seconds\nINFO KV cache size: 1,024 tokens\nWARNING casting to float32\n"]
    ev = CellEvidence(cell=cell("safetensors", "s16", "flaky", {"short_output": 1}), vllm_load_format="safetensors",
                      logs=[log_facts(t) for t in runs])
    assert diagnose_cell(ev, []).log_evidence == [
        "weights loaded in 0.01–0.35 s", "KV cache 1,024 tokens", "run 3 of 3: warning: WARNING casting to float32"]


def test_prefix_cache_corruption_is_ruled_out_when_the_cache_served_nothing():
    """Twins of other tokens: batching or the prefix cache. The run's own counter of prefix-cache
    hits tells them apart: none means no request was served from cached blocks."""
    twins = cell("safetensors", "s16", "fail", {"inconsistent_output": 2})
    assert names(evidence(twins, "safetensors", findings=[_twins(text=False)], prefix_cache_hits=[0.0, 0.0])) == [
        "batch-dependent-output"]
    hit = evidence(twins, "safetensors", findings=[_twins(text=False)], prefix_cache_hits=[0.0, 256.0])
    assert sorted(names(hit)) == ["batch-dependent-output", "prefix-cache-corruption"]
    matches = {m.signature: m for m in diagnose_cell(hit, list(SIGNATURES.values())).matches}
    m = matches["prefix-cache-corruption"]
    assert any("256 prefix-cache hits in the workloads of 2 servers" in e.says for e in m.supports)
    # The counter is a precondition, not more evidence: twins alone cannot tell batching from the
    # cache, so neither cause outscores the other (the knobs tell them apart).
    assert m.score == matches["batch-dependent-output"].score
    # The knob's own cell runs without the cache: its zero hits rule nothing out.
    knob = cell("safetensors", "s16+no-prefix-caching", "fail", {"invariance_broken": 1}).model_copy(
        update={"knob": "no-prefix-caching"})
    assert names(evidence(knob, "safetensors", prefix_cache_hits=[0.0])) == ["prefix-cache-corruption"]


def test_a_server_killed_after_sigterm_is_named_with_its_last_lines():
    killed = Finding(reason="exit_code", evidence=ServerExit(phase="shutdown", exit_code=-9, killed=True))
    deaf = evidence(cell("safetensors", "s16", "fail", {"exit_code": 1}), "safetensors",
                    ["vllm-0.32-safetensors-healthy.log"], findings=[killed], shutdown_timeout_s=10.0,
                    after_stop={1: ["INFO:     Shutting down", "INFO:     Waiting for background tasks to complete."]})
    d = diagnose_cell(deaf, list(SIGNATURES.values()))
    assert d.matches[0].signature == "server-ignored-stop"
    assert "1 of 1 servers did not exit within 10 s after SIGTERM and were killed (SIGKILL)" in [
        e.says for e in d.matches[0].supports]
    assert d.log_evidence[-1] == ("run 1, last lines after the stop request: INFO:     Shutting down ⏎ "
                                  "INFO:     Waiting for background tasks to complete.")
    exited = Finding(reason="exit_code", evidence=ServerExit(phase="shutdown", exit_code=1))
    assert "server-ignored-stop" not in names(evidence(cell("safetensors", "s16", "fail", {"exit_code": 1}),
                                                       "safetensors", findings=[exited]))


def test_seeded_twins_that_differ_are_named_a_seed_not_reproducible_and_no_twins_signature():
    """Sampled twins with one seed that differ are no evidence for what greedy twins tell
    (prefix cache, batch, stream text): only seed-not-reproducible names them."""
    seeded = Finding(reason="seed_not_reproducible", prompt_id="sampled-again", evidence=TwinsDiffer(
        other_prompt_id="sampled", position=0, token=1791, other_token=343, streamed=False, other_streamed=False,
        seed=7, temperature=0.8))
    c = cell("safetensors", "s17", "fail", {"seed_not_reproducible": 1, "divergence": 1})
    matched = names(evidence(c, "safetensors", findings=[seeded], prefix_cache_hits=[0.0, 256.0]))
    assert matched[0] == "seed-not-reproducible"
    assert not {"prefix-cache-corruption", "batch-dependent-output", "stream-text-differs"} & set(matched)


# Each contract probe's own (the registry's), and never_stops', which a probe's answer shows too.
OWN_SIGNATURES = [(p.reason.value, p.signature) for p in PROBES] + [("never_stops", "never-reaches-eos")]


@pytest.mark.parametrize(("reason", "signature"), OWN_SIGNATURES)
def test_each_contract_probe_finding_names_its_own_signature_first(reason, signature):
    c = cell("safetensors", "s17", "fail", {reason: 1, "divergence": 1})
    matched = names(evidence(c, "safetensors"))
    assert matched[0] == signature
    # And no other probe's.
    others = {s for _, s in OWN_SIGNATURES} - {signature}
    assert not others & set(matched)


def test_a_promise_broken_only_by_a_later_choice_is_named_n_choices_lose_request():
    """vllm#17975's family: the first choice keeps the stop, the second runs past it."""
    from bench.core.evidence import StopPassed

    later = Finding(reason="stop_ignored", prompt_id="two-choices-stop", choice=1, evidence=StopPassed(
        stop="e", position=3, finish_reason="length", around="once e"))
    c = cell("safetensors", "s18", "fail", {"stop_ignored": 1})
    assert first(evidence(c, "safetensors", findings=[later])) == "n-choices-lose-request"
    # The same finding on the first choice too: the stop is lost for every choice, not this family.
    both = [later, later.model_copy(update={"choice": None})]
    matched = names(evidence(c, "safetensors", findings=both))
    assert "n-choices-lose-request" not in matched and matched[0] == "stop-string-ignored"


# ---- causes once misnamed (issue #46): a usage undercount, a stream-only failure, a knob-only one ------

def test_a_usage_that_undercounts_the_tokens_sent_is_its_own_cause_not_empty_text():
    from bench.core.evidence import UsageMismatch

    under = Finding(reason="usage_text_mismatch", prompt_id="p", evidence=UsageMismatch(
        usage_tokens=12, token_ids=16, text_chars=40))
    c = cell("safetensors", "s16", "fail", {"usage_text_mismatch": 2})
    matched = names(evidence(c, "safetensors", findings=[under]))
    assert matched[0] == "usage-undercount" and "empty-text-normal-tokens" not in matched
    (m,) = [m for m in diagnose_cell(evidence(c, "safetensors", findings=[under]), list(SIGNATURES.values())).matches
            if m.signature == "usage-undercount"]
    assert "p: 16 token ids, usage says 12" in [e.says for e in m.supports]
    # Usage above the ids is no undercount; empty text for counted tokens is still the text lost.
    over = under.model_copy(update={"evidence": UsageMismatch(usage_tokens=20, token_ids=16, text_chars=40)})
    assert "usage-undercount" not in names(evidence(c, "safetensors", findings=[over]))
    lost = Finding(reason="usage_text_mismatch", prompt_id="p", evidence=UsageMismatch(
        usage_tokens=16, token_ids=16, text_chars=0))
    empty = cell("safetensors", "s16", "fail", {"empty_text": 2, "usage_text_mismatch": 2})
    matched = names(evidence(empty, "safetensors", findings=[lost]))
    assert matched[0] == "empty-text-normal-tokens" and "usage-undercount" not in matched


def _schema_miss(prompt: str) -> Finding:
    from bench.core.evidence import SchemaMiss

    return Finding(reason="schema_violated", prompt_id=prompt, evidence=SchemaMiss(
        error="Expecting value", parsed=False, finish_reason="length", answer="Once upon"))


def test_a_schema_broken_only_in_streamed_answers_is_named_so_not_batching():
    """The streamed answer breaks its schema, its whole twin keeps it; the two differ by tokens.
    The prefix-cache counter counted hits, so neither batching nor the cache is ruled out by it."""
    streamed = TwinsDiffer(other_prompt_id="schema", position=0, token=99, other_token=3, streamed=True,
                           other_streamed=False)
    twins = Finding(reason="inconsistent_output", prompt_id="schema-stream", evidence=streamed)
    c = cell("safetensors", "s16", "fail", {"schema_violated": 1, "inconsistent_output": 1, "divergence": 1})
    kw = {"stream_twins": {"schema-stream": ["schema"]}, "prefix_cache_hits": [256.0]}
    matched = names(evidence(c, "safetensors", findings=[_schema_miss("schema-stream"), twins], **kw))
    assert matched[0] == "broken-only-when-streamed", matched
    assert not {"batch-dependent-output", "prefix-cache-corruption"} & set(matched)
    # Broken whole as well: not the stream's doing.
    both = [_schema_miss("schema-stream"), _schema_miss("schema"), twins]
    assert "broken-only-when-streamed" not in names(evidence(c, "safetensors", findings=both, **kw))
    # A streamed answer with no whole twin cannot tell.
    alone = names(evidence(c, "safetensors", findings=[_schema_miss("schema-stream"), twins],
                           stream_twins={"schema-stream": []}))
    assert "broken-only-when-streamed" not in alone
    # Twins of other tokens that were both answered whole are still batching's or the cache's.
    whole = Finding(reason="inconsistent_output", prompt_id="p-again", evidence=TwinsDiffer(
        other_prompt_id="p", position=2, token=5, other_token=6, streamed=False, other_streamed=False))
    matched = names(evidence(c, "safetensors", findings=[_schema_miss("schema-stream"), twins, whole], **kw))
    assert matched[0] == "batch-dependent-output" and "broken-only-when-streamed" in matched
    # Request by request: another request's promise broken whole (a second fault on the same
    # server) leaves this one's stream-only break what it is.
    other = Finding(reason="stop_ignored", prompt_id="stop-e", evidence=_schema_miss("stop-e").evidence)
    matched = names(evidence(c, "safetensors", findings=[_schema_miss("schema-stream"), twins, other], **kw))
    assert "broken-only-when-streamed" in matched, matched


def test_a_fault_only_under_one_knob_is_named_so():
    base = cell("safetensors", "s16").model_copy(update={"baseline_id": None})

    def knobbed(knob: str) -> CellSummary:
        return cell("safetensors", f"s16+{knob}", "fail", {"invariance_broken": 2}).model_copy(
            update={"knob": knob, "baseline_id": base.cell_id})

    compiled = knobbed("compiled")
    (c,) = contrast([base, compiled])
    assert c.only_under_knob == "compiled"
    assert c.describe().startswith("fails only under knob compiled: the same cell without it passes")
    d = diagnose_cell(evidence(compiled, "safetensors", contrast=c), list(SIGNATURES.values()))
    assert [m.signature for m in d.matches] == ["fails-only-under-knob"]
    assert d.matches[0].supports[0].says == "fails only under knob compiled: the same cell without it passes"
    # A model compiled wrong breaks what any wrong model breaks, and says more for those
    # symptoms' signatures: the knob that alone breaks the cell is still named first.
    # (Measured: stream-text-differs scored 3 in such a cell, the knob's 1.)
    broken = compiled.model_copy(update={"reasons": {"invariance_broken": 2, "inconsistent_output": 2,
                                                     "schema_violated": 2}})
    told = Finding(reason="inconsistent_output", prompt_id="code-stream", evidence=TwinsDiffer(
        other_prompt_id="code", position=3, streamed=True, other_streamed=False, this_text="ab\ufffd", other_text="abc"))
    d = diagnose_cell(evidence(broken, "safetensors", contrast=c, findings=[told]), list(SIGNATURES.values()))
    scores = {m.signature: m.score for m in d.matches}
    assert scores["stream-text-differs"] > scores["fails-only-under-knob"], scores
    assert d.matches[0].signature == "fails-only-under-knob", scores
    # The cell without the knob fails too: the knob is not what breaks it.
    failing = base.model_copy(update={"verdict": Verdict.FAIL, "failures": 2, "reasons": {"divergence": 2}})
    (c,) = [x for x in contrast([failing, compiled]) if x.cell_id == compiled.cell_id]
    assert c.only_under_knob is None
    assert "fails-only-under-knob" not in names(evidence(compiled, "safetensors", contrast=c))
    # A knob with a cause of its own (serial: batching) is named by it first.
    serial = knobbed("serial")
    (c,) = contrast([base, serial])
    assert names(evidence(serial, "safetensors", contrast=c)) == ["batch-dependent-output", "fails-only-under-knob"]


def test_the_stream_twins_are_the_prompts_of_the_same_request_the_cell_sent_whole():
    from bench.core.config import parse_config
    from bench.core.matrix import expand
    from bench.core.records import RequestRecord
    from bench.store.evidence import _stream_twins

    from . import synth

    spec = synth.matrix()
    spec["workload"]["prompts"] = [{"id": "schema", "prompt": "p", "json_schema": {"enum": ["yes", "no"]}},
                                   {"id": "schema-stream", "prompt": "p", "json_schema": {"enum": ["yes", "no"]},
                                    "stream": True},
                                   {"id": "plain-stream", "prompt": "p", "stream": True}]
    (c, *_) = expand(parse_config(spec))
    sent = [RequestRecord(cell_id=c.id, repeat=1, prompt_id=p.id, api="completion", stream=p.stream, started_at=0.0,
                          latency_s=0.1) for p in c.workload.prompts]
    assert _stream_twins(c, sent) == {"plain-stream": [], "schema-stream": ["schema"]}
