"""Findings about a server process (boot, life, exit) and what it reported of itself: its
reference-text score and its generated-token counter. Pure."""

from __future__ import annotations

from bench.core.config import ReferenceText
from bench.core.evidence import CounterMismatch, ReferenceLikelihood, ServerExit
from bench.core.judge.exit_scan import episodes, exit_episode, is_benign
from bench.core.records import (
    ReferenceScore,
    RequestRecord,
    ServerMetrics,
    ServerOutcome,
)
from bench.core.verdicts import Finding, Reason


def judge_server(outcome: ServerOutcome, shutdown_log: str, log_tail: str) -> list[Finding]:
    """Findings about the server process itself: boot, life, and exit."""
    last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "(empty log)")
    if outcome.boot_s is None:
        if outcome.port_taken_by is not None:
            return [Finding(reason=Reason.PORT_TAKEN, evidence=ServerExit(
                phase="boot", message=outcome.boot_error, log_tail=log_tail))]
        if outcome.start_error is not None:
            reason = Reason.NOT_RUNNABLE if outcome.not_runnable else Reason.BOOT_FAILED
            return [Finding(reason=reason, evidence=ServerExit(phase="start", message=outcome.start_error))]
        if outcome.exited_early_code is not None:
            return [Finding(reason=Reason.BOOT_FAILED, evidence=ServerExit(
                phase="boot", exit_code=outcome.exited_early_code, last_line=last, log_tail=log_tail))]
        return [Finding(reason=Reason.BOOT_TIMEOUT, evidence=ServerExit(
            phase="boot", message=outcome.boot_error, last_line=last, log_tail=log_tail))]

    out: list[Finding] = []
    if outcome.exited_early_code is not None:
        out.append(Finding(reason=Reason.SERVER_DIED, evidence=ServerExit(
            phase="serving", exit_code=outcome.exited_early_code, last_line=last, log_tail=log_tail)))
    else:
        for first, episode in episodes(shutdown_log):
            if not is_benign(episode):
                out.append(Finding(reason=Reason.EXIT_EXCEPTION, evidence=exit_episode(first, episode)))
        if outcome.killed or outcome.exit_code not in (0, None):
            out.append(Finding(reason=Reason.EXIT_CODE, evidence=ServerExit(
                phase="shutdown", exit_code=outcome.exit_code, killed=outcome.killed)))
    return out


def judge_reference(score: ReferenceScore | None, reference_text: ReferenceText) -> list[Finding]:
    """A run's reference-text score against its absolute ceiling (no baseline needed)."""
    if score is None or not reference_text.enabled:
        return []

    def finding(**extra) -> list[Finding]:
        return [Finding(reason=Reason.REFERENCE_NLL, evidence=ReferenceLikelihood(
            mean_nll=score.mean_nll, tokens=score.tokens, error=score.error, **extra))]

    if score.error is not None or score.mean_nll is None:
        return finding()
    if reference_text.max_mean_nll is not None and score.mean_nll > reference_text.max_mean_nll:
        return finding(max_mean_nll=reference_text.max_mean_nll)
    return []


def judge_server_counters(metrics: ServerMetrics | None, requests: list[RequestRecord]) -> list[Finding]:
    """The engine's generated-token count against the token ids that arrived. Only when every
    request was answered: a request cut off by a time-out may have generated tokens no one got."""
    if metrics is None or metrics.generation_tokens is None or not requests:
        return []
    if any(q.error_kind is not None or q.token_ids is None for q in requests):
        return []
    received = sum(sum(q.choice_tokens) if q.choice_tokens else len(q.token_ids or []) for q in requests)
    if metrics.generation_tokens == received:
        return []
    return [Finding(reason=Reason.TOKEN_COUNT_MISMATCH, evidence=CounterMismatch(
        server_tokens=metrics.generation_tokens, client_tokens=received, requests=len(requests)))]
