"""judge_cell over repeats: counts, interval, per-run results, and nondeterminism between repeats."""

from __future__ import annotations

import pytest

from bench.core.config import parse_config
from bench.core.judge import Baseline, judge_cell
from bench.core.matrix import expand
from bench.core.records import Finding, RequestRecord, RunRecord, ServerOutcome
from bench.core.tokens import Output

IDS = list(range(128))


def req(repeat: int, prompt: str = "p", ids: list[int] | None = None, **kw) -> RequestRecord:
    ids = IDS if ids is None else ids
    base = dict(cell_id="c", repeat=repeat, prompt_id=prompt, api="completion", stream=False, started_at=0.0,
                latency_s=0.1, status=200, text="x" * 300, token_ids=ids, completion_tokens=len(ids),
                finish_reason="length")
    base.update(kw)
    return RequestRecord(**base)


def run(repeat: int, interrupted=False) -> RunRecord:
    outcome = ServerOutcome(command=["v"], port=1, log_path="l", started_at=0.0, boot_s=1.0, exit_code=0)
    return RunRecord(cell_id="c", repeat=repeat, server=outcome, interrupted=interrupted)

# judge_cell's `own` argument: each run's own findings by repeat, as judge() makes them.


@pytest.fixture
def cells(minimal):
    return expand(parse_config(minimal))


def test_counts_interval_and_per_run_results(cells):
    base = cells[0]
    bad = Finding(reason="empty_text", detail="p: empty")
    s = judge_cell(base, [run(1), run(2), run(3), run(4, interrupted=True)],
                   [req(1), req(2, ids=[5] * 128, text=""), req(3)], {2: [bad], 4: [bad]}, None)
    assert (s.verdict, s.failures, s.runs) == ("flaky", 1, 3)
    assert s.failure_rate_interval == pytest.approx((0.0615, 0.7923), abs=1e-4)
    assert [(r.repeat, r.reasons) for r in s.run_results] == [(1, []), (2, ["empty_text"]), (3, [])]


def test_divergence_from_the_baseline_is_in_the_run_results(cells):
    cell = cells[1]
    s = judge_cell(cell, [run(1), run(2)], [req(1), req(2, ids=IDS[:10] + [9] * 118)], {},
                   Baseline(outputs={"p": Output(ids=IDS)}))
    (r1, r2) = s.run_results
    assert r1.reasons == [] and r2.reasons == ["divergence"]
    assert [(d.prompt_id, d.position) for d in r2.divergence] == [("p", 10)]


def test_nondeterminism_between_repeats_is_flagged_apart_from_the_verdict(cells):
    base = cells[0]  # no baseline to diverge from: only the repeats can disagree
    changed = [*IDS[:37], 999, *IDS[38:]]
    s = judge_cell(base, [run(1), run(2), run(3)],
                   [req(1), req(1, "q"), req(2, ids=changed), req(2, "q"), req(3), req(3, "q")], {}, None)
    assert s.verdict == "pass"  # every run is clean on its own
    assert s.nondeterministic
    assert [(d.prompt_id, d.repeat, d.reference_repeat, d.position) for d in s.nondeterminism] == [("p", 2, 1, 37)]


def test_identical_repeats_are_not_nondeterministic(cells):
    s = judge_cell(cells[0], [run(1), run(2)], [req(1), req(2)], {}, None)
    assert not s.nondeterministic and s.nondeterminism == []


def test_the_reference_for_nondeterminism_is_the_first_clean_run(cells):
    bad = Finding(reason="exit_code", detail="x")
    # Repeat 1 failed (at exit) and emitted other ids; repeats 2 and 3 agree with each other.
    s = judge_cell(cells[0], [run(1), run(2), run(3)], [req(1, ids=[7, *IDS[1:]]), req(2), req(3)], {1: [bad]}, None)
    assert [(d.repeat, d.reference_repeat, d.position) for d in s.nondeterminism] == [(1, 2, 0)]


def test_interrupted_runs_do_not_count_for_nondeterminism(cells):
    s = judge_cell(cells[0], [run(1), run(2, interrupted=True)], [req(1), req(2, ids=[1, 2, 3])], {}, None)
    assert s.nondeterminism == [] and s.runs == 1
