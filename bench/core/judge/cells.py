"""A cell over its repeats: its runs against the baseline (divergence, a knob's broken
invariance, a drifted reference score), its verdict, and the checks of the cell as a whole. Pure.

Each repeat is a fresh server, because the failures this bench exists for happen at
weight-loading time and a warm server would hide them. Interrupted runs are not judged.
A run *failed* when it has a finding of its own or diverges from the baseline.
Verdict              PASS when no judged run failed, FAIL when every judged run failed,
                     FLAKY in between, NOT_RUN with no judged run (bench.core.stats.verdict;
                     verdict_settled says when more repeats can no longer change it);
                     NOT_RUNNABLE when its only runs could not start on this host
                     (not_runnable). Exit code: 0 when every other cell passes, 2 when no
                     cell could run here at all, else 1
failures/runs        with the Wilson 95 % interval of the failure rate: "0/20 (0–16 %)"
nondeterminism       token ids of a prompt differ between repeats of the same cell (each
                     repeat against the cell's first clean run, or its first run if none is
                     clean), with the first differing position. Flagged on its own: it does
                     not change the verdict, since a failing run differs anyway and a
                     passing one may legitimately vary (temperature > 0, batch effects).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from bench.core.config import ReferenceText
from bench.core.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS, EXIT_USAGE
from bench.core.evidence import RanOn, ReferenceLikelihood, TokenDivergence
from bench.core.judge.baseline import Baseline, set_aside_unconfirmed, unconfirmed_notes
from bench.core.matrix import Cell
from bench.core.perf import cell_perf
from bench.core.records import (
    CellSummary,
    PreflightRecord,
    RequestRecord,
    RunRecord,
    RunResult,
    TokenDiff,
)
from bench.core.stats import verdict, wilson_interval
from bench.core.tokens import EXACT, Comparator, Output, rank_in
from bench.core.verdicts import Finding, Reason, Verdict


def _divergence_evidence(out: Output, ref: Output, pos: int, comparator: Comparator) -> TokenDivergence:
    mine = out.ids[pos] if pos < len(out.ids) else None
    theirs = ref.ids[pos] if pos < len(ref.ids) else None
    a, b = out.at(pos), ref.at(pos)
    k = getattr(comparator, "k", None)
    return TokenDivergence(
        position=pos, token=mine, baseline_token=theirs, comparator=comparator.name,
        token_text=a.text if a else None, baseline_text=b.text if b else None,
        token_logprob=a.logprob if a else None, baseline_logprob=b.logprob if b else None,
        token_rank_in_baseline=rank_in(mine, b, k) if k else None,
        baseline_rank_in_run=rank_in(theirs, a, k) if k else None,
    )


def divergence(
    requests: Iterable[RequestRecord], reference: dict[str, Output], comparator: Comparator = EXACT,
    sampled: frozenset[str] = frozenset(),
) -> list[tuple[int, int, Finding]]:
    """(repeat, position, finding) for every request whose output differs from the baseline's.
    The `sampled` prompts' tokens are compared only exactly: under a tolerant comparator the
    numerics may differ, and a draw from probabilities that moved a little may land anywhere in
    them (measured: a healthy fp8 KV cache's sampled answer left the baseline's top 5 at token
    10). Their own promises are held within the cell (seed twins, `n` choices)."""
    out = []
    for req in requests:
        ref, mine = reference.get(req.prompt_id), req.output
        if ref is None or mine is None:
            continue
        pos = comparator.first_difference(mine, ref) if comparator is EXACT or req.prompt_id not in sampled else None
        if pos is not None:
            evidence = _divergence_evidence(mine, ref, pos, comparator)
            out.append((req.repeat, pos, Finding(reason=Reason.DIVERGENCE, evidence=evidence, prompt_id=req.prompt_id)))
        if ref.ended and mine.ended is False and len(mine.ids) > len(ref.ids):
            # Only an answer that may end (ignore_eos false) can end by itself: the baseline's did.
            out.append((req.repeat, len(ref.ids), Finding(reason=Reason.NEVER_STOPS, prompt_id=req.prompt_id,
                                                          evidence=RanOn(tokens=len(mine.ids),
                                                                         baseline_tokens=len(ref.ids)))))
    return out


def reference_drift(runs: list[RunRecord], baseline_nll: float | None,
                    reference_text: ReferenceText) -> list[tuple[int, Finding]]:
    """(repeat, finding) for every run whose reference-text score rose beyond the tolerance over
    the baseline's."""
    if baseline_nll is None or not reference_text.enabled:
        return []
    out = []
    for r in runs:
        score = r.reference
        if score is not None and score.mean_nll is not None and score.mean_nll - baseline_nll > reference_text.tolerance:
            out.append((r.repeat, Finding(reason=Reason.REFERENCE_NLL, evidence=ReferenceLikelihood(
                mean_nll=score.mean_nll, tokens=score.tokens, baseline_nll=baseline_nll, tolerance=reference_text.tolerance))))
    return out


def judge_cell(
    cell: Cell,
    runs: list[RunRecord],
    requests: list[RequestRecord],
    own: dict[int, list[Finding]],
    baseline: Baseline | None,
    comparator: Comparator = EXACT,
    reference_text: ReferenceText | None = None,
) -> CellSummary:
    """A cell's verdict over its runs: `own`, each run's own findings by repeat (run_findings),
    with its divergence from the baseline, a knob's broken invariance and a reference score's
    drift added, and set aside as unconfirmed: the misses the baseline shares, and the contract
    probes the server refuses."""
    judged = sorted((r for r in runs if not r.interrupted), key=lambda r: r.repeat)
    per_run: dict[int, list[Finding]] = {r.repeat: list(own.get(r.repeat, [])) for r in judged}
    # In the workload's order within a run, not the order answers came back in (concurrency): the
    # first finding named for the cell is then the same every time.
    order = {p.id: i for i, p in enumerate(cell.workload.prompts)}
    judged_requests = sorted((q for q in requests if q.repeat in per_run),
                             key=lambda q: (q.repeat, order.get(q.prompt_id, len(order))))
    positions, diverged = _against_baseline(cell, judged, judged_requests, per_run, baseline, comparator, reference_text)
    set_aside = _set_aside(cell, per_run, baseline)
    pending = cell.baseline_id is not None and (baseline is None or not baseline.outputs)
    run_reasons = {repeat: sorted({f.reason for f in fs}) for repeat, fs in per_run.items()}
    # A run that could not be started on this host says nothing of vLLM: not a failing run.
    unrunnable = {repeat for repeat, rs in run_reasons.items() if Reason.NOT_RUNNABLE in rs}
    counted = len(judged) - len(unrunnable)
    failures = sum(1 for repeat, rs in run_reasons.items() if rs and repeat not in unrunnable)
    example = next((fs[0].detail for fs in per_run.values() if fs), None)
    clean = {repeat for repeat, rs in run_reasons.items() if not rs}
    return CellSummary(
        perf=cell_perf(judged, judged_requests),
        cell_id=cell.id,
        model=cell.model.name,
        load_format=cell.load_format.name,
        platform=cell.platform,
        image=cell.image.name,
        baseline_id=cell.baseline_id,
        runs=counted,
        failures=failures,
        verdict=Verdict.NOT_RUNNABLE if unrunnable and not counted else verdict(failures, counted),
        reasons=dict(sorted(Counter(reason for rs in run_reasons.values() for reason in rs).items())),
        divergence_positions=positions,
        example=example.splitlines()[0][:200] if example else None,
        failure_rate_interval=wilson_interval(failures, counted) if counted else None,
        nondeterminism=_nondeterminism(judged_requests, clean, comparator),
        unconfirmed=unconfirmed_notes(set_aside, cell.is_baseline, cell.knob.name if cell.knob else None,
                                      baseline.missed if baseline is not None else frozenset()),
        comparator=comparator.name,
        knob=cell.knob.name if cell.knob else None,
        knob_changes=cell.knob.describe() if cell.knob else None,
        invariance_broken=next((f.detail for fs in per_run.values() for f in fs
                                if f.reason == Reason.INVARIANCE_BROKEN), None),
        reference_nll=[r.reference.mean_nll for r in judged if r.reference is not None],
        run_results=[
            RunResult(repeat=repeat, reasons=rs, findings=per_run[repeat], divergence=diverged.get(repeat, []),
                      baseline_pending=pending)
            for repeat, rs in run_reasons.items()
        ],
    )


def _set_aside(cell: Cell, per_run: dict[int, list[Finding]], baseline: Baseline | None) -> dict[int, list[Finding]]:
    """Takes out of `per_run` what is set aside as unconfirmed (bench.core.judge.baseline), and
    returns it by repeat; a cell whose baseline is not judged yet keeps everything."""
    set_aside: dict[int, list[Finding]] = {}
    if cell.is_baseline or (cell.baseline_id is not None and baseline is not None):
        shared = None if cell.is_baseline else (baseline.missed if baseline is not None else frozenset())
        for repeat in per_run:
            per_run[repeat], set_aside[repeat] = set_aside_unconfirmed(per_run[repeat], shared, knob=cell.knob is not None)
    return set_aside


def _against_baseline(cell: Cell, judged: list[RunRecord], requests: list[RequestRecord],
                      per_run: dict[int, list[Finding]], baseline: Baseline | None, comparator: Comparator,
                      reference_text: ReferenceText | None) -> tuple[list[int], dict[int, list[TokenDiff]]]:
    """Adds to `per_run` each run's findings against the baseline (divergence, or a knob's broken
    invariance; an answer that ran on; a drifted reference score), and returns where the runs
    diverged: every position, and each run's differences."""
    positions: list[int] = []
    diverged: dict[int, list[TokenDiff]] = {}
    if not baseline:
        return positions, diverged
    sampled = frozenset(p.id for p in cell.workload.prompts if p.sampling is not None)
    for repeat, pos, f in divergence(requests, baseline.outputs, comparator, sampled):
        if f.reason == Reason.NEVER_STOPS:
            per_run[repeat].append(f)
            continue
        if cell.knob is not None:
            # The one thing that differs from the cell it is compared with is the knob.
            f = Finding(reason=Reason.INVARIANCE_BROKEN, prompt_id=f.prompt_id,
                        evidence=f.evidence.model_copy(update={"knob": cell.knob.name}))
        per_run[repeat].append(f)
        positions.append(pos)
        diverged.setdefault(repeat, []).append(TokenDiff(prompt_id=f.prompt_id, repeat=repeat, position=pos))
    if reference_text is not None:
        for repeat, f in reference_drift(judged, baseline.mean_nll, reference_text):
            per_run[repeat].append(f)
    return positions, diverged


def _nondeterminism(requests: list[RequestRecord], clean: set[int], comparator: Comparator) -> list[TokenDiff]:
    """Where each repeat's tokens of a prompt differ from the cell's own reference for it: the
    first clean run's output, else the first run's."""
    own_ref: dict[str, RequestRecord] = {}
    with_ids = [q for q in requests if q.token_ids is not None]
    for q in with_ids:
        if q.repeat in clean:
            own_ref.setdefault(q.prompt_id, q)
    for q in with_ids:
        own_ref.setdefault(q.prompt_id, q)
    out = []
    for q in with_ids:
        ref = own_ref[q.prompt_id]
        mine, theirs = q.output, ref.output
        if ref.repeat == q.repeat or mine is None or theirs is None:
            continue
        differs_at = comparator.first_difference(mine, theirs)
        if differs_at is not None:
            out.append(TokenDiff(prompt_id=q.prompt_id, repeat=q.repeat, position=differs_at,
                                 reference_repeat=ref.repeat))
    return out


def apply_cell_checks(summary: CellSummary, runs: list[RunRecord], audit: PreflightRecord | None) -> CellSummary:
    """Adds the cell-level findings that are not about one run: lost weights and image drift."""
    reasons = dict(summary.reasons)
    verdict = summary.verdict
    example = summary.example
    if audit is not None and not audit.ok:
        reasons[Reason.WEIGHTS_LOST] = max(1, summary.runs)
        verdict = Verdict.FAIL
        lost = f"pre-flight audit: {audit.lost} tensor deliveries lost"
        example = f"{lost}: {audit.problems[0]}" if audit.problems else lost
    images = {r.server.image_id for r in runs if r.server.image_id is not None and not r.interrupted}
    if len(images) > 1:
        reasons[Reason.FINGERPRINT_CHANGED] = len(images)
        if verdict == Verdict.PASS:
            verdict = Verdict.FLAKY
        example = example or f"repeats ran {len(images)} different images: {sorted(images)}"
    return summary.model_copy(update={"reasons": dict(sorted(reasons.items())), "verdict": verdict, "example": example})


def exit_code(cells: list[CellSummary], interrupted: bool) -> int:
    """0 when every cell that could run here passed (the others are named, not failed); 2 when
    no cell could run on this host at all (nothing was tested); 1 otherwise."""
    if interrupted:
        return EXIT_INTERRUPTED
    runnable = [c for c in cells if c.verdict != Verdict.NOT_RUNNABLE]
    if cells and not runnable:
        return EXIT_USAGE
    return EXIT_PASS if all(c.verdict == Verdict.PASS for c in runnable) else EXIT_FAIL
