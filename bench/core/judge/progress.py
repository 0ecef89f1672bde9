"""How a run stands as soon as it ends, for the progress line and early stop. Pure."""

from __future__ import annotations

from enum import StrEnum

from bench.core.judge.baseline import set_aside_key
from bench.core.records import (
    RunRecord,
    TokenDiff,
)
from bench.core.verdicts import (
    Finding,
    Reason,
)


def run_counts(findings: list[Finding]) -> bool | None:
    """Whether a finished run counts as a failure of its cell now, by its own findings
    (observed), for early stop; None when it cannot be known yet: a known answer or the
    reference ceiling missed alone counts only where the baseline meets it (set_aside_unconfirmed),
    and so does a contract probe the server refuses: that is judged at the end."""
    if findings and all(set_aside_key(f) is not None for f in findings):
        return None
    return bool(findings)


class RunMark(StrEnum):
    """A finished run as the progress line shows it, before the cell's verdict."""

    PASSED = "passed"  # nothing against it that the cell's verdict could contradict
    FAILED = "failed"
    PENDING = "pending"  # only what the baseline decides: a check it may miss too, or no reference yet
    INTERRUPTED = "interrupted"
    NOT_RUNNABLE = "not runnable"  # no server could be started on this host: nothing said of vLLM


def run_mark(record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> tuple[RunMark, list[str]]:
    """How one run stands as soon as it ends, and what is against it: its own findings' reasons
    (`findings`, observed), its divergence from the baseline, then what the baseline may share
    (the checks it missed, the contract probes refused).
    `divergence`: as judge() found it (RunResult.divergence), None while the baseline has no
    clean run to compare with."""
    if record.interrupted:
        return RunMark.INTERRUPTED, []
    unrunnable = [f.detail for f in findings if f.reason == Reason.NOT_RUNNABLE]
    if unrunnable:
        return RunMark.NOT_RUNNABLE, unrunnable
    undecided = [f for f in findings if set_aside_key(f) is not None]
    reasons = sorted({str(f.reason) for f in findings if set_aside_key(f) is None})
    if divergence:
        first = min(divergence, key=lambda d: d.position)
        reasons.append(f"divergence from baseline at token {first.position} ({first.prompt_id})")
    if reasons:
        return RunMark.FAILED, reasons + sorted({str(f.reason) for f in undecided})
    if undecided:
        return RunMark.PENDING, sorted({f.prompt_id or "reference text" for f in undecided})
    if divergence is None:
        return RunMark.PENDING, []
    return RunMark.PASSED, []
