"""Statistics over a cell's repeats: failure rates with their uncertainty, and how many repeats
it takes to see a rare failure. Pure functions, no I/O.

Each repeat is a fresh server, so the repeats of a cell are independent Bernoulli trials of
"this server start fails". The failures this bench exists for are nondeterministic (the seed bug
failed 7 of 8 starts), so a verdict is only as good as the number of starts behind it.
"""

from __future__ import annotations

import math

from bench.core.verdicts import Verdict

Z_95 = 1.96


def _check_counts(failures: int, runs: int) -> None:
    if runs < 0 or failures < 0 or failures > runs:
        raise ValueError(f"need 0 <= failures <= runs, got {failures}/{runs}")


def verdict(failures: int, runs: int) -> Verdict:
    """The cell rule (documented in bench.core.verdicts): pass = no run failed, fail = every run
    failed, flaky in between; no judged run at all is not run."""
    _check_counts(failures, runs)
    if runs == 0:
        return Verdict.NOT_RUN
    if failures == 0:
        return Verdict.PASS
    if failures == runs:
        return Verdict.FAIL
    return Verdict.FLAKY


def wilson_interval(failures: int, runs: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of the failure rate (95 % with the default z).

    Chosen over the textbook normal interval because that one collapses to [0, 0] for
    0 failures, which is exactly the case a release sign-off is about: 0/20 gives 0–16 %.
    With no run the rate is unknown: (0, 1).
    """
    _check_counts(failures, runs)
    if z <= 0:
        raise ValueError(f"z must be > 0, got {z}")
    if runs == 0:
        return 0.0, 1.0
    p = failures / runs
    z2 = z * z
    denom = 1 + z2 / runs
    center = (p + z2 / (2 * runs)) / denom
    margin = z * math.sqrt(p * (1 - p) / runs + z2 / (4 * runs * runs)) / denom
    # The closed forms are exactly 0 and 1 at the edges; rounding must not move them.
    low = 0.0 if failures == 0 else max(0.0, center - margin)
    high = 1.0 if failures == runs else min(1.0, center + margin)
    return low, high


def detection_probability(p: float, runs: int) -> float:
    """Probability that `runs` independent starts show at least one failure of rate p."""
    _check_rate(p)
    if runs < 0:
        raise ValueError(f"runs must be >= 0, got {runs}")
    return 1.0 - (1.0 - p) ** runs


def _check_rate(p: float) -> None:
    if not 0.0 < p <= 1.0:
        raise ValueError(f"failure rate must be in (0, 1], got {p}")


def repeats_needed(p: float, confidence: float) -> int:
    """Fresh starts needed to see at least one failure of rate p with probability `confidence`:
    the smallest n with 1 - (1 - p)^n >= confidence, i.e. n = ceil(log(1 - C) / log(1 - p))."""
    _check_rate(p)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if p == 1.0:
        return 1
    n = max(1, math.ceil(math.log(1.0 - confidence) / math.log(1.0 - p)))
    # The quotient of two logs can land a hair above an exact integer (p=0.5, C=0.75 gives
    # 2.0000000000000004); step back while the smaller n already reaches the confidence.
    while n > 1 and detection_probability(p, n - 1) >= confidence - 1e-12:
        n -= 1
    return n


def verdict_settled(failures: int, runs: int, max_runs: int) -> bool:
    """True once the remaining max_runs - runs repeats can no longer change the verdict.

    A cell that has both failed and passed is flaky for good. All-pass or all-fail so far can
    still turn flaky while repeats remain, so those settle only when every repeat has run.
    """
    _check_counts(failures, runs)
    if max_runs < runs:
        raise ValueError(f"runs ({runs}) > max_runs ({max_runs})")
    if runs == max_runs:
        return True
    return 0 < failures < runs


def percent_range(low: float, high: float) -> str:
    """"0–16 %": the form the reports use for an interval."""
    return f"{low * 100:.0f}–{high * 100:.0f} %"


def rate_text(failures: int, runs: int) -> str:
    """"0/20 (0–16 %)": failures over runs with the Wilson 95 % interval of the failure rate."""
    if runs == 0:
        return "0/0"
    return f"{failures}/{runs} ({percent_range(*wilson_interval(failures, runs))})"
