from __future__ import annotations

import math

import pytest

from bench.cli import main
from bench.core.stats import (
    detection_probability,
    rate_text,
    repeats_needed,
    verdict,
    verdict_settled,
    wilson_interval,
)


@pytest.mark.parametrize("p, c, n", [(0.3, 0.95, 9), (0.5, 0.75, 2), (0.5, 0.5, 1), (1.0, 0.99, 1),
                                     (0.01, 0.95, 299), (0.875, 0.999, 4)])
def test_repeats_needed_known_values(p, c, n):
    assert repeats_needed(p, c) == n


@pytest.mark.parametrize("p", [0.001, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.5, 0.8, 0.9, 0.95, 0.99])
def test_repeats_needed_is_the_smallest_sufficient_n(p, c):
    n = repeats_needed(p, c)
    assert detection_probability(p, n) >= c - 1e-12
    assert n == 1 or detection_probability(p, n - 1) < c - 1e-12


@pytest.mark.parametrize("p, c", [(0, 0.95), (-0.1, 0.95), (1.1, 0.95), (0.3, 1.0), (0.3, 0.0), (math.nan, 0.9)])
def test_repeats_needed_rejects_impossible_inputs(p, c):
    with pytest.raises(ValueError):
        repeats_needed(p, c)


def test_wilson_interval_known_values():
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)  # "0/20: 0–16 %"
    assert wilson_interval(7, 8) == pytest.approx((0.5291, 0.9776), abs=1e-4)  # the seed bug's 7 of 8
    assert wilson_interval(2, 2) == pytest.approx((0.3424, 1.0), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("f, n", [(0, 1), (1, 3), (3, 7), (10, 10), (1, 1000)])
def test_wilson_interval_is_symmetric_and_contains_the_rate(f, n):
    low, high = wilson_interval(f, n)
    assert 0.0 <= low <= f / n <= high <= 1.0
    assert wilson_interval(n - f, n) == pytest.approx((1 - high, 1 - low))


def test_wilson_narrows_with_more_runs():
    widths = [h - lo for lo, h in (wilson_interval(0, n) for n in (5, 20, 100))]
    assert widths == sorted(widths, reverse=True)


@pytest.mark.parametrize("f, n", [(-1, 2), (3, 2), (0, -1)])
def test_wilson_rejects_bad_counts(f, n):
    with pytest.raises(ValueError):
        wilson_interval(f, n)


def test_rate_text():
    assert rate_text(0, 20) == "0/20 (0–16 %)"
    assert rate_text(7, 8) == "7/8 (53–98 %)"
    assert rate_text(0, 0) == "0/0"


def test_verdict_rule():
    assert [verdict(f, n) for f, n in ((0, 0), (0, 3), (1, 3), (3, 3))] == ["not run", "pass", "flaky", "fail"]


@pytest.mark.parametrize(
    "failures, runs, max_runs, settled",
    [
        (0, 0, 5, False),  # nothing seen yet
        (0, 4, 5, False),  # all pass so far: one failure would make it flaky
        (4, 4, 5, False),  # all fail so far: one pass would make it flaky
        (1, 2, 5, True),  # failed and passed: flaky whatever comes
        (0, 5, 5, True),  # every run done
        (5, 5, 5, True),
        (0, 0, 0, True),  # nothing to run: "not run" for good
    ],
)
def test_verdict_settled(failures, runs, max_runs, settled):
    assert verdict_settled(failures, runs, max_runs) is settled


def test_verdict_settled_agrees_with_every_possible_continuation():
    # Exhaustive: settled exactly when all ways the remaining runs could go give one verdict.
    max_runs = 6
    for runs in range(max_runs + 1):
        for failures in range(runs + 1):
            remaining = max_runs - runs
            finals = {verdict(failures + extra, max_runs) for extra in range(remaining + 1)}
            assert verdict_settled(failures, runs, max_runs) is (len(finals) == 1), (failures, runs)


def test_verdict_settled_rejects_more_runs_than_allowed():
    with pytest.raises(ValueError):
        verdict_settled(0, 3, 2)


def test_plan_prints_the_repeats_needed(tmp_path, minimal, capsys):
    import yaml

    minimal["models"][0]["path"] = str(tmp_path)  # a local model path must exist
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(minimal))
    assert main(["plan", str(path), "--detect", "0.3", "--confidence", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "9 repeats per cell (2 cells × 9 = 18 fresh servers)" in out
    assert "repeats: 1, which sees it with 30% probability" in out
    assert main(["plan", str(path), "--detect", "0"]) == 2
    assert main(["plan", str(path), "--confidence", "0.9"]) == 2
