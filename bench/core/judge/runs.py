"""One run's own findings, made afresh from its record, its requests and its server log, before
any baseline. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from bench.core.config import ReferenceText, Workload
from bench.core.evidence import ReferenceLikelihood
from bench.core.judge.requests import judge_request
from bench.core.judge.server import judge_reference, judge_server, judge_server_counters
from bench.core.judge.twins import judge_twins
from bench.core.matrix import Cell
from bench.core.records import (
    ReferenceScore,
    RequestRecord,
    RunRecord,
    RunResult,
    ServerLog,
    ServerMetrics,
    ServerOutcome,
)
from bench.core.results import Results
from bench.core.tokens import EXACT, Comparator
from bench.core.verdicts import Finding, Reason


def judge_run(
    outcome: ServerOutcome, requests: Iterable[RequestRecord], workload: Workload, shutdown_log: str, log_tail: str,
    reference: ReferenceScore | None = None, reference_text: ReferenceText | None = None,
    metrics: ServerMetrics | None = None, comparator: Comparator = EXACT, tolerance: float = 0.05,
) -> list[Finding]:
    """One run's own findings, from what was observed of it (no baseline): every per-run rule."""
    requests = list(requests)
    findings = judge_server(outcome, shutdown_log, log_tail)
    order = {p.id: i for i, p in enumerate(workload.prompts)}  # the workload's order, as reports list prompts
    for req in sorted(requests, key=lambda r: (order.get(r.prompt_id, len(order)), r.prompt_id)):
        findings.extend(judge_request(req, workload))
    findings.extend(judge_twins(requests, workload, comparator, tolerance))
    findings.extend(judge_server_counters(metrics, requests))
    if reference_text is not None:
        findings.extend(judge_reference(reference, reference_text))
    return findings


# What only a run's server log can tell: where the log is gone, these findings stand as a
# regbench that judged at the end of each run recorded them (RunRecord.findings).
LOG_ONLY_REASONS = frozenset({Reason.EXIT_EXCEPTION})


def run_findings(cell: Cell, run: RunRecord, requests: Iterable[RequestRecord], log: ServerLog | None,
                 comparator: Comparator) -> list[Finding]:
    """A finished run's own findings, made afresh from its record, its requests and its server
    log: a rule added after the folder was written applies to it, and a comparator given to
    judge the folder again applies to its twins."""
    metrics = run.perf.metrics if run.perf is not None else None
    found = judge_run(run.server, [q for q in requests if q.repeat == run.repeat], cell.workload,
                      log.shutdown if log else "", log.tail if log else "", run.reference, cell.reference_text,
                      metrics, comparator, cell.comparison.logprob_tolerance)
    if log is None:
        found = [f for f in found if f.reason not in LOG_ONLY_REASONS] + \
                [f for f in run.findings if f.reason in LOG_ONLY_REASONS]
    return found


def own_findings(result: RunResult) -> list[Finding]:
    """A judged run's own findings: without those that compare it with its baseline (divergence,
    a knob's broken invariance, an answer that ran on where the baseline's ended, a reference
    score drifted from the baseline's)."""
    return [f for f in result.findings if f.reason not in (Reason.DIVERGENCE, Reason.INVARIANCE_BROKEN, Reason.NEVER_STOPS)
            and not (isinstance(f.evidence, ReferenceLikelihood) and f.evidence.baseline_nll is not None)]


def observed(results: Results, cell: Cell, run: RunRecord) -> list[Finding]:
    """One finished run's own findings under its cell's rule, before any baseline: what the
    progress line and early stop go by as each run ends."""
    if run.interrupted:
        return []
    return run_findings(cell, run, results.requests_of(cell.id), results.log_of(run), cell.comparator)
