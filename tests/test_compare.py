"""`regbench compare`: two results folders, built synthetically with the bench's own records."""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.core.compare import compare
from bench.core.config import ConfigError
from bench.store.publish import load_side
from tests import synth

CELL = "m__runai_streamer__cpu__img"


def test_healthy_then_failing_is_a_regression(tmp_path, capsys):
    a = synth.healthy(tmp_path, "a")
    b = synth.streamer_bug(tmp_path, "b")
    assert main(["compare", str(a.path), str(b.path)]) == 1
    out = capsys.readouterr().out
    assert "cells matched by cell id" in out
    assert f"REGRESSION  {CELL}: PASS 0/2 (0–66 %) → FAIL 2/2 (34–100 %)" in out
    assert "verdict pass → fail" in out
    assert "new failure reasons: degenerate, divergence, empty_text, usage_text_mismatch" in out
    assert "runai_model_streamer 0.17.0 → 0.16.0" in out
    assert "1 regression in 2 matched cells" in out


def test_two_healthy_runs_are_exit_0(tmp_path, capsys):
    a, b = synth.healthy(tmp_path, "a"), synth.healthy(tmp_path, "b")
    assert main(["compare", str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "0 regressions in 2 matched cells" in out
    assert "outputs the same (2 prompts, first clean runs)" in out
    assert "environment: no fingerprint change" in out


def test_a_fix_is_an_improvement_not_a_regression(tmp_path, capsys):
    a, b = synth.streamer_bug(tmp_path, "a"), synth.healthy(tmp_path, "b")
    assert main(["compare", str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    assert f"improved    {CELL}: FAIL 2/2 (34–100 %) → PASS 0/2 (0–66 %)" in out
    assert "reasons gone: degenerate, divergence, empty_text, usage_text_mismatch" in out


def test_pass_to_flaky_is_a_regression(tmp_path):
    a = synth.healthy(tmp_path, "a", repeats=4)
    b = synth.streamer_bug(tmp_path, "b", repeats=4, failing=(3,))
    result = compare(load_side(a.path), load_side(b.path))
    (reg,) = result.regressions
    assert (reg.a_verdict, reg.b_verdict, reg.b_rate) == ("pass", "flaky", "1/4 (5–70 %)")


def test_new_failure_reason_on_an_already_failing_cell_is_a_regression(tmp_path):
    a = synth.streamer_bug(tmp_path, "a")
    # Same verdict, but B also crashed at exit in one run: a reason A never showed.
    b2 = synth.create(tmp_path, "b2", synth.matrix(repeats=2))
    for repeat in (1, 2):
        synth.add_run(b2, "m__safetensors__cpu__img", repeat)
        # Repeat 2's server log: an exception after the stop request (the bytes before it: serving).
        serving = "INFO started\nINFO serving\n"
        log = serving + ("Traceback (most recent call last):\n  File \"x\"\nRuntimeError: at exit\n" if repeat == 2 else "")
        synth.add_run(b2, CELL, repeat, ids=[0] * 128, text="", log=log, stop_at=len(serving))
    result = compare(load_side(a.path), load_side(b2.path))
    (reg,) = result.regressions
    assert reg.new_reasons == ["exit_exception"] and reg.a_verdict == reg.b_verdict == "fail"


def test_image_tags_n_minus_1_and_n_are_matched_automatically(tmp_path, capsys):
    a = synth.healthy(tmp_path, "a", images=("vllm-0.31",), streamer="0.17.0")
    b = synth.streamer_bug(tmp_path, "b", images=("vllm-0.32",), streamer="0.16.0")
    assert main(["compare", str(a.path), str(b.path)]) == 1
    out = capsys.readouterr().out
    assert "cells matched by model × load_format × platform, image ignored (no cell id is common to both runs)" in out
    assert "REGRESSION  m__runai_streamer__cpu__vllm-0.31→vllm-0.32: PASS" in out
    assert "vllm-0.31 → vllm-0.32: runai_model_streamer 0.17.0 → 0.16.0" in out


def test_match_ignore_image_explicitly(tmp_path):
    a = synth.healthy(tmp_path, "a", images=("tag1",))
    b = synth.healthy(tmp_path, "b", images=("tag1", "tag2"))
    # By id, tag1 matches tag1 and tag2 is new; ignoring the image, B is ambiguous.
    by_id = compare(load_side(a.path), load_side(b.path))
    assert len(by_id.cells) == 2 and by_id.only_b == ["m__safetensors__cpu__tag2", "m__runai_streamer__cpu__tag2"]
    assert main(["compare", "--match-ignore", "image", str(a.path), str(b.path)]) == 2


def test_output_divergence_per_prompt_is_reported(tmp_path):
    a = synth.healthy(tmp_path, "a")
    b = synth.create(tmp_path, "b", synth.matrix(repeats=1))
    changed = [*synth.GOOD_IDS[:5], 1, *synth.GOOD_IDS[6:]]
    synth.add_run(b, "m__safetensors__cpu__img", 1, ids={"code": changed})
    synth.add_run(b, CELL, 1, ids={"code": changed})
    result = compare(load_side(a.path), load_side(b.path))
    assert not result.regressions  # numerics may change with an image; the verdicts did not
    outputs = {(c.a_id, o.prompt_id): (o.status, o.position) for c in result.cells for o in c.outputs}
    assert outputs[(CELL, "code")] == ("differs", 5)
    assert outputs[(CELL, "prose")] == ("same", None)


def test_a_failing_run_has_no_clean_output_to_compare(tmp_path):
    a, b = synth.healthy(tmp_path, "a"), synth.streamer_bug(tmp_path, "b")
    result = compare(load_side(a.path), load_side(b.path))
    cell = next(c for c in result.cells if c.a_id == CELL)
    assert {o.status for o in cell.outputs} == {"no clean run in B"}


def test_image_digest_changes_are_reported(tmp_path):
    a = synth.create(tmp_path, "a", synth.matrix())
    b = synth.create(tmp_path, "b", synth.matrix())
    for results, digest, torch in ((a, "sha256:aaa", "2.9.0"), (b, "sha256:bbb", "2.9.1")):
        synth.fingerprint(results, "img", image_digest=digest, torch=torch)
        for fmt in ("safetensors", "runai_streamer"):
            synth.add_run(results, f"m__{fmt}__cpu__img", 1)
    result = compare(load_side(a.path), load_side(b.path))
    assert {(f.field, f.a, f.b) for f in result.fingerprint_changes} == {
        ("torch", "2.9.0", "2.9.1"), ("image_digest", "sha256:aaa", "sha256:bbb")}


def test_json_output(tmp_path, capsys):
    a, b = synth.healthy(tmp_path, "a"), synth.streamer_bug(tmp_path, "b")
    assert main(["compare", "--format", "json", str(a.path), str(b.path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [c["a_id"] for c in data["cells"] if c["regression"]] == [CELL]


def test_json_the_old_spelling_prints_the_same_and_says_the_new_one(tmp_path, capsys):
    """Scripts written for `compare --json` keep working: the same JSON and exit code, and one line
    on stderr naming `--format json`."""
    a, b = synth.healthy(tmp_path, "a"), synth.streamer_bug(tmp_path, "b")
    assert main(["compare", str(a.path), str(b.path), "--format", "json"]) == 1
    new = capsys.readouterr()
    assert main(["compare", "--json", str(a.path), str(b.path)]) == 1
    old = capsys.readouterr()
    assert old.out == new.out and json.loads(old.out)["cells"]
    assert new.err == "" and old.err == "regbench: --json is deprecated; use --format json\n"


def test_usage_errors_are_exit_2(tmp_path, capsys):
    a = synth.healthy(tmp_path, "a")
    assert main(["compare", str(a.path), str(tmp_path / "nope")]) == 2
    assert "not a regbench results directory" in capsys.readouterr().err
    other = synth.create(tmp_path, "other", {**synth.matrix(), "models": [{"name": "x", "path": "/x"}]})
    assert main(["compare", str(a.path), str(other.path)]) == 2
    assert "no cell of A" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--match-ignore", "colour", str(a.path), str(a.path)])
    assert exc.value.code == 2


def test_ignoring_every_axis_is_refused(tmp_path):
    a = load_side(synth.healthy(tmp_path, "a").path)
    with pytest.raises(ConfigError):
        compare(a, a, ignore=frozenset({"model", "load_format", "platform", "image"}))


def test_a_threshold_per_metric_sets_what_counts_as_slower(tmp_path, capsys):
    """B's servers are all ×1.5 slower: slower at the defaults (exit 1); with every timed metric's
    threshold at 2 the same runs are the same (exit 0)."""
    a, b = synth.timed(tmp_path, "a"), synth.timed(tmp_path, "b", slower=1.5)
    assert main(["compare", str(a.path), str(b.path)]) == 1
    assert "boot slower" in capsys.readouterr().out
    relaxed = [arg for m in ("boot_s", "latency_s", "throughput_tok_s", "tokens_per_s") for arg in ("--threshold", f"{m}=2")]
    assert main(["compare", "--format", "json", *relaxed, str(a.path), str(b.path)]) == 0
    checks = [s for c in json.loads(capsys.readouterr().out)["cells"] for s in c["slowdowns"]]
    assert checks and {s["verdict"] for s in checks} == {"same"} and {s["threshold"] for s in checks} == {2.0}


@pytest.mark.parametrize("pair", ["boot_s=0.9", "nosuch=2", "boot_s", "boot_s=nan", "=2"])
def test_a_bad_threshold_is_exit_2_naming_it(tmp_path, capsys, pair):
    a = synth.timed(tmp_path, "a")
    assert main(["compare", "--threshold", pair, str(a.path), str(a.path)]) == 2
    assert f"--threshold {pair!r}:" in " ".join(capsys.readouterr().err.split())


def test_a_sampled_prompt_is_left_out_of_the_outputs_compared(tmp_path):
    """As in the judge: under a tolerant rule a sampled prompt's answer is not held to the other
    run's tokens (a draw from probabilities that moved a little may land anywhere in them)."""
    from bench.core.compare import side_from_records
    from bench.core.judge import judge

    data = synth.healthy(tmp_path, "a").load()
    cells = judge(data).cells
    whole = side_from_records("a", cells, data.runs, data.requests, data.fingerprints)
    side = side_from_records("a", cells, data.runs, data.requests, data.fingerprints, frozenset({"code"}))
    assert all({"code", "prose"} <= set(outs) for outs in whole.outputs.values())
    assert all("code" not in outs and "prose" in outs for outs in side.outputs.values())
    assert side.perf == whole.perf  # its timings still count
