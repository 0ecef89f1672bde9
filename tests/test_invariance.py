"""The `invariance` block: settings that must not change outputs, each run as cells of its own and
compared with the same cell without it. Expansion and judging are pure; one run end to end on the
fake vLLM (tests/data/fakevllm) checks that a knob's arguments and variables reach its servers
only, and how a broken invariance reads in summary.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.core.config import BUILTIN_KNOBS, ConfigError, parse_config
from bench.core.judge import Baseline, judge_cell, reference_outputs
from bench.core.matrix import expand, matrix_image
from bench.core.records import CellSummary, RequestRecord, RunRecord
from bench.core.tokens import TokenLogprobs, comparator_for
from bench.core.verdicts import Reason
from bench.serve.launch import server_env
from bench.serve.launch_docker import container_name
from bench.serve.launch_local import vllm_argv

from .support import ROOT
from .test_judge import outcome

FAKEVLLM = Path(__file__).parent / "data" / "fakevllm"


def with_knobs(minimal: dict, *knobs, **block) -> dict:
    minimal["workload"]["concurrency"] = 4
    minimal["workload"]["prompts"] = [{"id": "p", "prompt": "hi"}, {"id": "q", "prompt": "yo", "stream": True}]
    minimal["invariance"] = {"knobs": list(knobs), **block}
    return minimal


def test_each_knob_adds_a_cell_per_baseline_cell_compared_with_it(minimal):
    cells = expand(parse_config(with_knobs(minimal, "serial", "stream-inverted", "no-prefix-caching",
                                           {"name": "kv", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}})))
    base, streamer, *knobs = cells
    assert [c.id for c in knobs] == [f"m__safetensors__cpu__img+{k}"
                                     for k in ("serial", "stream-inverted", "no-prefix-caching", "kv")]
    assert all(c.baseline_id == base.id and not c.is_baseline and c.knob is not None for c in knobs)
    assert streamer.knob is None and base.knob is None
    serial, inverted, no_cache, kv = knobs
    assert (serial.workload.concurrency, base.workload.concurrency) == (1, 4)
    assert [p.stream for p in inverted.workload.prompts] == [True, False]
    assert [p.stream for p in base.workload.prompts] == [False, True]
    assert vllm_argv(no_cache, no_cache.server, 1)[-1] == "--no-enable-prefix-caching"
    assert "--no-enable-prefix-caching" not in vllm_argv(base, base.server, 1)
    profile = base.profile
    assert server_env(kv, kv.server, profile)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in server_env(base, base.server, profile)
    # A knob's cell runs its original's image: one pin, one fingerprint, one audit.
    assert {matrix_image(c.image.name) for c in cells} == {"img"}
    # Docker's container names: [a-zA-Z0-9][a-zA-Z0-9_.-]+, and no two cells' alike.
    names = [container_name("r", c.id, 1) for c in cells]
    assert all(re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", n) for n in names) and len(set(names)) == len(names)


def test_the_tolerant_rule_asks_the_originals_for_the_logprobs_it_compares(minimal):
    minimal["comparison"] = {"mode": "exact"}
    cells = expand(parse_config(with_knobs(minimal, "serial", comparison={"mode": "logprobs", "top_k": 3})))
    base, streamer, serial = cells
    assert (base.comparison.mode, base.logprobs_k) == ("exact", 3)
    assert (streamer.comparison.mode, streamer.logprobs_k) == ("exact", None)
    assert (serial.comparison.mode, serial.logprobs_k) == ("logprobs", 3)
    # By default a knob is judged by the matrix's own rule.
    minimal["invariance"].pop("comparison")
    assert expand(parse_config(minimal))[-1].comparison.mode == "exact"


def test_the_cells_a_knob_applies_to_can_be_picked(minimal):
    config = parse_config(with_knobs(minimal, "serial", cells=[{"load_format": "runai_streamer"}]))
    assert [c.id for c in expand(config)][-1] == "m__runai_streamer__cpu__img+serial"
    minimal["invariance"]["cells"] = [{"image": "img", "model": "m", "load_format": "safetensors"}]
    minimal["exclude"] = [{"load_format": "safetensors"}]
    with pytest.raises(ConfigError, match="pick no cell"):
        expand(parse_config(minimal))


def test_blocks_of_knobs_each_for_their_own_cells(minimal):
    minimal["comparison"] = {"mode": "exact"}
    minimal["invariance"] = [
        {"knobs": ["serial"], "cells": [{"load_format": "runai_streamer"}]},
        {"knobs": ["no-prefix-caching"], "cells": [{"load_format": "safetensors"}],
         "comparison": {"mode": "logprobs", "top_k": 4}},
    ]
    cells = expand(parse_config(minimal))
    assert [c.id for c in cells][2:] == ["m__runai_streamer__cpu__img+serial",
                                         "m__safetensors__cpu__img+no-prefix-caching"]
    assert [c.logprobs_k for c in cells] == [4, None, None, 4]
    minimal["invariance"][1]["cells"] = [{"image": "img"}]
    with pytest.raises(ConfigError, match=r"two blocks give a cell the same knob: m__runai_streamer__cpu__img\+serial"):
        minimal["invariance"][1]["knobs"] = ["serial"]
        expand(parse_config(minimal))


@pytest.mark.parametrize("knob, message", [
    ("serail", "unknown knob 'serail'.*serial, no-prefix-caching, chunked-prefill, stream-inverted"),
    ({"name": "nothing"}, "knob 'nothing' changes nothing"),
    ({"name": "tp", "server_args": ["--tensor-parallel-size", "2"]}, "tensor_parallel_size"),
    ({"name": "x", "concurrency": 0}, "greater than or equal to 1"),
])
def test_a_bad_knob_is_a_config_error(minimal, knob, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(with_knobs(minimal, knob))


def test_two_knobs_of_one_name_and_a_filter_naming_no_axis_are_refused(minimal):
    with pytest.raises(ConfigError, match="duplicate knob names"):
        parse_config(with_knobs(minimal, "serial", {"name": "serial", "concurrency": 2}))
    with pytest.raises(ConfigError, match="filter names unknown image 'nope'"):
        parse_config(with_knobs(minimal, "serial", cells=[{"image": "nope"}]))


def test_builtin_knobs_each_change_something_and_are_documented():
    judged = (ROOT / "docs" / "judged.md").read_text()
    for name, knob in BUILTIN_KNOBS.items():
        assert knob.describe() and f"`{name}`" in judged, name


def _req(cell_id: str, ids: list[int], top: int | None = None) -> RequestRecord:
    logprobs = None if top is None else [TokenLogprobs(logprob=-0.1, top=[(i, -0.1), (top, -0.5)]) for i in ids]
    return RequestRecord(cell_id=cell_id, repeat=1, prompt_id="p", api="completion", stream=False, started_at=0.0,
                         latency_s=0.1, status=200, text="w" * len(ids), token_ids=ids, completion_tokens=len(ids),
                         finish_reason="length", logprobs=logprobs)


def _run(cell_id: str) -> RunRecord:
    return RunRecord(cell_id=cell_id, repeat=1, server=outcome())


def test_a_knob_that_changes_a_token_breaks_invariance_with_both_sides_named(minimal):
    minimal["comparison"] = {"mode": "exact"}
    cells = expand(parse_config(with_knobs(minimal, "serial")))
    base, serial = cells[0], cells[-1]
    reference = Baseline(outputs=reference_outputs([_run(base.id)], [_req(base.id, list(range(16)))], {}))
    changed = [_req(serial.id, [0, 1, 2, 99, *range(4, 16)])]
    summary = judge_cell(serial, [_run(serial.id)], changed, {}, reference, comparator_for("exact"))
    assert summary.verdict == "fail" and summary.reasons == {Reason.INVARIANCE_BROKEN: 1}
    assert summary.knob == "serial" and summary.knob_changes == "concurrency 1"
    assert summary.invariance_broken == "p: with serial differs from the same cell without it at token 3"
    same = judge_cell(serial, [_run(serial.id)], [_req(serial.id, list(range(16)))], {}, reference, comparator_for("exact"))
    assert same.verdict == "pass" and same.invariance_broken is None


def test_under_the_tolerant_rule_a_token_in_the_other_sides_top_k_holds(minimal):
    cells = expand(parse_config(with_knobs(minimal, "serial")))
    base, serial = cells[0], cells[-1]
    ids = list(range(16))
    reference = Baseline(outputs=reference_outputs([_run(base.id)], [_req(base.id, ids, top=99)], {}))
    swapped = [_req(serial.id, [0, 1, 2, 99, *range(4, 16)], top=3)]
    assert judge_cell(serial, [_run(serial.id)], swapped, {}, reference, comparator_for("logprobs", 5)).verdict == "pass"
    outside = [_req(serial.id, [0, 1, 2, 98, *range(4, 16)], top=3)]
    broken = judge_cell(serial, [_run(serial.id)], outside, {}, reference, comparator_for("logprobs", 5))
    assert broken.reasons == {Reason.INVARIANCE_BROKEN: 1}
    assert "vs without serial (id 3" in broken.invariance_broken


def run_on_the_fake_vllm(tmp_path: Path, knobs: list, prompts: list[dict], **matrix) -> tuple:
    """`regbench run` of one cell and its knobs' on the fake vLLM: (the process, its results folder)."""
    model = tmp_path / "model"
    model.mkdir()
    spec = {
        "name": "knobs",
        "models": [{"name": "m", "path": str(model)}],
        "load_formats": [{"name": "safetensors"}],
        "images": [{"name": "fake", "python": sys.executable, "pythonpath": [str(FAKEVLLM)]}],
        "comparison": {"mode": "exact"},
        "workload": {"prompts": prompts, "concurrency": 2, "request_timeout_s": 60},
        "server": {"boot_timeout_s": 60, "shutdown_timeout_s": 5},
        "reference_text": {"enabled": False},
        "preflight": False,
        "invariance": {"knobs": knobs},
        **matrix,
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "bench", "run", str(path), "--results", str(tmp_path / "r"),
                           "--run-id", "r"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    return done, tmp_path / "r" / "r"


def test_a_run_with_knobs_on_the_fake_vllm(tmp_path):
    """serial holds; a knob whose variable makes the server answer other token ids breaks; the
    knob's argument reaches its servers only; summary.md says which knob changed what."""
    done, run_dir = run_on_the_fake_vllm(tmp_path, ["serial", {"name": "shifted", "env": {"FAKE_VLLM_MODE": "shifted"},
                                                               "server_args": ["--fake-knob-arg"]}],
                                         prompts=[{"id": "p", "prompt": "hi"}, {"id": "q", "prompt": "yo"}])
    assert done.returncode == 1, done.stdout + done.stderr
    cells = {c["cell_id"]: c for c in json.loads((run_dir / "summary.json").read_text())["cells"]}
    base, serial, shifted = "m__safetensors__cpu__fake", "m__safetensors__cpu__fake+serial", \
        "m__safetensors__cpu__fake+shifted"
    assert list(cells) == [base, serial, shifted]
    assert [cells[c]["verdict"] for c in (base, serial, shifted)] == ["pass", "pass", "fail"]
    assert cells[shifted]["reasons"] == {"invariance_broken": 1} and cells[shifted]["knob"] == "shifted"
    runs = {r["cell_id"]: r for r in map(json.loads, (run_dir / "runs.jsonl").read_text().splitlines())}
    assert "--fake-knob-arg" in runs[shifted]["server"]["command"]
    assert "--fake-knob-arg" not in runs[base]["server"]["command"] + runs[serial]["server"]["command"]
    md = (run_dir / "summary.md").read_text()
    section = md.split("## Invariance: settings that must not change outputs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| serial") or line.startswith("| shifted")]
    assert rows[0] == f"| serial | concurrency 1 | `{base}` | 1/1 | - |", section
    assert rows[1].startswith(f"| shifted | --fake-knob-arg, FAKE_VLLM_MODE=shifted | `{base}` | **0/1** | "
                              "p: with shifted differs from the same cell without it at token 0"), section
    # One fingerprint for the image the three cells share.
    assert [f["image"] for f in map(json.loads, (run_dir / "fingerprint.jsonl").read_text().splitlines())] == ["fake"]


def test_compare_across_image_tags_matches_each_knobs_cell_with_the_same_knobs(minimal):
    from bench.core.compare import Side, compare

    def side(name: str, image: str) -> Side:
        minimal["images"] = [{"name": image, "python": "python3"}]
        config = parse_config(with_knobs(minimal, "serial", "no-prefix-caching"))
        cells = [CellSummary(cell_id=c.id, model=c.model.name, load_format=c.load_format.name, platform=c.platform,
                             image=c.image.name, baseline_id=c.baseline_id, runs=1, failures=0, verdict="pass", reasons={},
                             knob=c.knob.name if c.knob else None) for c in expand(config)]
        return Side(name=name, cells=cells, outputs={}, fingerprints=[])

    result = compare(side("a", "vllm-0.31.0"), side("b", "vllm-0.32.0"))
    assert result.auto_ignored and not result.only_a and not result.only_b
    assert [(c.a_id, c.b_id) for c in result.cells if c.a_id.endswith(("+serial", "+no-prefix-caching"))] == [
        ("m__safetensors__cpu__vllm-0.31.0+serial", "m__safetensors__cpu__vllm-0.32.0+serial"),
        ("m__safetensors__cpu__vllm-0.31.0+no-prefix-caching", "m__safetensors__cpu__vllm-0.32.0+no-prefix-caching")]


def test_a_knob_is_compared_with_the_cell_without_it_as_it_answered_even_when_that_cell_failed(minimal):
    from .test_judge import summarize_cells

    minimal["comparison"] = {"mode": "exact"}
    minimal["workload"].update(min_tokens=16, max_tokens=16)  # what _req answers
    config = parse_config(with_knobs(minimal, "serial"))
    base, _, serial = expand(config)
    failed = _run(base.id).model_copy(update={"server": outcome(exit_code=1)})
    batched = [_req(base.id, [0, 1, 2, 99, *range(4, 16)])]  # what a batch-dependent fault answers batched
    alone = [_req(serial.id, list(range(16)))]
    cells = {c.cell_id: c for c in summarize_cells(config, [failed, _run(serial.id)], batched + alone)}
    assert cells[serial.id].reasons == {Reason.INVARIANCE_BROKEN: 1}
    assert cells[base.id].reasons == {Reason.EXIT_CODE: 1}
    same = [_req(serial.id, [0, 1, 2, 99, *range(4, 16)])]
    cells = {c.cell_id: c for c in summarize_cells(config, [failed, _run(serial.id)], batched + same)}
    assert cells[serial.id].verdict == "pass"


def _on_profile(minimal: dict, knobs: dict, *named, **block) -> list:
    data = with_knobs(minimal, *named, **block)
    data["profiles"] = [{"name": "cpu", "device_kind": "cpu", "knobs": knobs}]
    return expand(parse_config(data))


def test_a_per_platform_knob_takes_its_arguments_from_the_cells_profile(minimal):
    cells = _on_profile(minimal, {"eager": {"server_args": ["--enforce-eager"]},
                                  "fp8-kv-cache": {"server_args": ["--kv-cache-dtype", "fp8_e5m2"]}},
                        "eager", "fp8-kv-cache")
    base, _, eager, fp8 = cells
    assert vllm_argv(eager, eager.server, 1)[-1] == "--enforce-eager"
    assert vllm_argv(fp8, fp8.server, 1)[-2:] == ["--kv-cache-dtype", "fp8_e5m2"]
    assert "--enforce-eager" not in vllm_argv(base, base.server, 1)
    # The knob a cell records is the one that ran: its arguments, as the report shows them.
    assert eager.knob.describe() == "--enforce-eager" and not eager.knob.per_platform
    # fp8 keys move logits a little: its own tolerant rule, whatever the matrix's.
    assert (fp8.comparison.mode, eager.comparison.mode) == ("logprobs", base.comparison.mode)
    assert fp8.logprobs_k == 5


@pytest.mark.parametrize(("knobs", "why"), [
    ({"fp8-kv-cache": {"unavailable": "the CPU backend has no fp8 KV cache"}}, "the CPU backend has no fp8 KV cache"),
    ({}, "its profile gives it no arguments"),
])
def test_a_per_platform_knob_the_platform_cannot_run_is_refused_with_why(minimal, knobs, why):
    with pytest.raises(ConfigError, match=f"knob 'fp8-kv-cache' cannot run on platform 'cpu': {why}"):
        _on_profile(minimal, knobs, "fp8-kv-cache")


def test_a_knob_that_needs_a_cpu_flag_the_host_lacks_is_not_runnable_there(minimal):
    from bench.serve.launch import knob_not_runnable

    base, _, fp8 = _on_profile(minimal, {"fp8-kv-cache": {"server_args": ["--kv-cache-dtype", "fp8"],
                                                         "cpu_flags": ["avx512f", "amx_tile"]}}, "fp8-kv-cache")
    assert fp8.knob.cpu_flags == ["avx512f", "amx_tile"]
    assert fp8.knob.describe() == "--kv-cache-dtype fp8, on a CPU with avx512f or amx_tile"
    avx2 = frozenset({"fpu", "avx2", "fma"})
    why = knob_not_runnable(fp8, avx2, "AMD EPYC")
    assert why == ("not runnable on this host: knob 'fp8-kv-cache' needs a CPU with avx512f or amx_tile, and "
                   "this host's (AMD EPYC) has none of them")
    assert knob_not_runnable(fp8, avx2 | {"amx_tile"}) is None  # one of them is enough
    assert knob_not_runnable(fp8, None) is None  # flags unknown: the boot says
    assert knob_not_runnable(base, avx2) is None  # the cell without the knob needs nothing
    with pytest.raises(ConfigError, match="cpu_flags"):
        _on_profile(minimal, {"fp8-kv-cache": {"server_args": ["--x"], "cpu_flags": ["AVX-512"]}}, "fp8-kv-cache")


def test_a_knob_the_host_cannot_run_starts_no_server_and_says_why_once(tmp_path):
    """On the fake vLLM: a knob needing a flag no CPU has is not_runnable at its first start and
    its second is not tried; one needing a flag this host has runs and holds."""
    from bench.serve.fingerprint import host_cpu_flags

    flags = host_cpu_flags()
    assert flags, "this host's CPU flags cannot be read"
    done, run_dir = run_on_the_fake_vllm(tmp_path, [
        {"name": "absent", "server_args": ["--fake-knob-arg"], "cpu_flags": ["no_such_flag"]},
        {"name": "present", "server_args": ["--fake-knob-arg"], "cpu_flags": ["no_such_flag", min(flags)]},
    ], prompts=[{"id": "p", "prompt": "hi"}], repeats=2, early_stop=False)
    # A cell this host cannot run is named, never a failure: the run passes on what could run.
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all runnable cells pass (1 not runnable on this host)" in (run_dir / "summary.md").read_text()
    cells = {c["cell_id"]: c for c in json.loads((run_dir / "summary.json").read_text())["cells"]}
    absent, present = cells["m__safetensors__cpu__fake+absent"], cells["m__safetensors__cpu__fake+present"]
    assert (absent["verdict"], absent["runs"], absent["failures"], absent["reasons"]) == (
        "not runnable", 0, 0, {"not_runnable": 1})
    assert (present["verdict"], present["runs"]) == ("pass", 2)
    assert "+absent #1 (no boot): not_runnable" in done.stderr and "+absent #2" not in done.stderr
    runs = [r for r in map(json.loads, (run_dir / "runs.jsonl").read_text().splitlines())
            if r["cell_id"] == absent["cell_id"]]
    assert len(runs) == 1 and "needs a CPU with no_such_flag" in runs[0]["server"]["start_error"]
    assert runs[0]["server"]["boot_s"] is None  # no process was started


def test_a_platform_knob_needs_arguments_or_a_reason():
    from bench.core.config import PlatformKnob

    with pytest.raises(ValueError, match="or why it is `unavailable`"):
        PlatformKnob()
    with pytest.raises(ValueError, match="or why it is `unavailable`"):
        PlatformKnob(server_args=["--enforce-eager"], unavailable="no")


def test_a_tensor_parallel_knob_serves_the_model_on_that_many_devices(minimal):
    cells = expand(parse_config(with_knobs(minimal, {"name": "tp2", "tensor_parallel_size": 2})))
    base, _, tp2 = cells
    assert (base.model.tensor_parallel_size, tp2.model.tensor_parallel_size) == (1, 2)
    assert vllm_argv(tp2, tp2.server, 2)[vllm_argv(tp2, tp2.server, 2).index("--tensor-parallel-size") + 1] == "2"
    assert tp2.knob.describe() == "tensor-parallel size 2"


def test_the_shipped_profiles_spell_every_per_platform_knob_or_say_why_not():
    from bench.store.matrixfile import load_platform

    per_platform = [n for n, k in BUILTIN_KNOBS.items() if k.per_platform]
    for name in ("cpu", "h200", "dgx-spark", "agx-thor"):
        profile = load_platform(name, ROOT / "no-such-folder")
        assert sorted(profile.knobs) == sorted(per_platform), name
