"""What a cell is compared with, and the findings set aside as unconfirmed (not counted): the
misses the baseline shares, and the contract probes the server refuses. Pure.

Contract probes the server lacks: a probe request answered HTTP 400 (the server refuses the
feature: no structured-output backend, a parameter it does not know) is skipped where the
baseline cell refuses it too, and said so as unconfirmed; where the baseline served it, the
http_error stands, but in a knob's cell: a setting that cannot have a feature and says so
(vLLM's speculative decoding refuses logit_bias) is no silent change, which is what an
invariance knob looks for.

Absolute checks shared with the baseline: a known answer (`expect`) and the reference-text
ceiling judge a server against a fixed expectation, not against the baseline. They are only as
good as the model's answer under the numerics at hand: measured, a healthy bf16 SmolLM2-135M
misses "Paris" on a CPU with AMX-BF16 and gets it elsewhere, and a random model never meets a
reference ceiling. So a miss that the baseline cell shares, with nothing else corroborating it in
that run, is not evidence against a cell: it is set aside as *unconfirmed*
(CellSummary.unconfirmed) and reported on its own, and the verdict is decided by the rest.
Corroboration:
  - a known answer on prompt P: a divergence from the baseline on P, or a reference-text finding
    that stands, in the same run;
  - the reference ceiling: any other finding in the same run (a known-answer miss, a drift from
    the baseline's score, a reference error, ...).
For the baseline cell itself "shared" holds trivially. Cells with no baseline keep every
finding. A miss the baseline does not share is always counted."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.core.evidence import ReferenceLikelihood, RequestFailed
from bench.core.records import (
    RequestRecord,
    RunRecord,
    UnconfirmedNote,
)
from bench.core.tokens import Output
from bench.core.verdicts import Finding, Reason


@dataclass(frozen=True)
class Baseline:
    """What a cell is compared with: its baseline cell's first clean run."""

    outputs: dict[str, Output] = field(default_factory=dict)  # per prompt
    mean_nll: float | None = None  # its reference-text score
    # What any of its judged runs missed that a cell may share (set_aside_key).
    missed: frozenset[tuple[Reason, str | None]] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.outputs) or self.mean_nll is not None or bool(self.missed)


def _clean_baseline_run(r: RunRecord, own: dict[int, list[Finding]]) -> bool:
    """A baseline run fit to compare with: not interrupted, and nothing against it but the
    findings set aside as unconfirmed for a baseline (set_aside_unconfirmed). `own`: each run's
    own findings, by repeat."""
    return not r.interrupted and not set_aside_unconfirmed(list(own.get(r.repeat, [])), None)[0]


def reference_outputs(runs: list[RunRecord], requests: list[RequestRecord], own: dict[int, list[Finding]],
                      as_answered: bool = False) -> dict[str, Output]:
    """Per prompt, the output of the first clean run of a baseline cell. `as_answered`: when no
    run is clean, of its first judged run: a knob's cell is compared with the cell without the
    knob as that cell answered, right or wrong (its own verdict says which), since the question
    is only whether the knob changes the answer."""
    clean = {r.repeat for r in runs if _clean_baseline_run(r, own)}
    if not clean and as_answered:
        clean = {min((r.repeat for r in runs if not r.interrupted), default=0)}
    ref: dict[str, Output] = {}
    for req in sorted(requests, key=lambda r: r.repeat):
        out = req.output
        if req.repeat in clean and out is not None:
            ref.setdefault(req.prompt_id, out)
    return ref


def baseline_of(runs: list[RunRecord], requests: list[RequestRecord], own: dict[int, list[Finding]],
                as_answered: bool = False) -> Baseline:
    """What a baseline cell's runs give the cells compared with it; `own`: each run's own
    findings, by repeat."""
    clean = sorted((r for r in runs if _clean_baseline_run(r, own)), key=lambda r: r.repeat)
    nll = next((r.reference.mean_nll for r in clean if r.reference is not None and r.reference.mean_nll is not None), None)
    missed = frozenset(k for r in runs if not r.interrupted for f in own.get(r.repeat, [])
                       if (k := set_aside_key(f)) is not None)
    return Baseline(outputs=reference_outputs(runs, requests, own, as_answered), mean_nll=nll, missed=missed)


def refused_probe(f: Finding) -> bool:
    """A contract probe's request the server refused as a bad request: it lacks the feature."""
    return f.reason == Reason.HTTP_ERROR and isinstance(f.evidence, RequestFailed) \
        and bool(f.evidence.probe) and f.evidence.status == 400


def set_aside_key(f: Finding) -> tuple[Reason, str | None] | None:
    """What a finding may be set aside as, where the baseline shares it: a miss of an absolute
    check (a known answer on a prompt, or the reference-text ceiling), or a contract probe the
    server refuses (on a prompt); None for every other finding."""
    if f.reason == Reason.EXPECTATION_FAILED or refused_probe(f):
        return (f.reason, f.prompt_id)
    if f.reason == Reason.REFERENCE_NLL and isinstance(f.evidence, ReferenceLikelihood) \
            and f.evidence.max_mean_nll is not None and f.evidence.error is None:
        return (f.reason, None)
    return None


def set_aside_unconfirmed(findings: list[Finding], shared: frozenset[tuple[Reason, str | None]] | None,
                          knob: bool = False) -> tuple[list[Finding], list[Finding]]:
    """(kept, set aside) of one run's findings: the absolute-check misses and refused contract
    probes that the baseline shares (`shared`; None for the baseline cell itself, where every miss
    is shared) and nothing else in the run corroborates; in a knob's cell (`knob`), also every
    contract probe its server refuses.
    The rule is in this module's docstring."""
    def is_shared(f: Finding) -> bool:
        key = set_aside_key(f)
        return key is not None and (shared is None or key in shared)

    ceilings = [f for f in findings if is_shared(f) and f.reason == Reason.REFERENCE_NLL]
    # A known-answer miss beside a ceiling miss corroborates it (and so the other way round).
    others = [f for f in findings if f not in ceilings]
    aside = set(map(id, ceilings)) if ceilings and not others else set()
    reference_stands = any(f.reason == Reason.REFERENCE_NLL and id(f) not in aside for f in findings)
    diverged = {f.prompt_id for f in findings if f.reason in (Reason.DIVERGENCE, Reason.INVARIANCE_BROKEN)}
    for f in findings:
        if is_shared(f) and f.reason == Reason.EXPECTATION_FAILED and not reference_stands \
                and f.prompt_id not in diverged:
            aside.add(id(f))
        elif refused_probe(f) and (is_shared(f) or knob):
            # Nothing to corroborate: the feature is missing on both sides, or the knob's setting
            # cannot have it (vLLM's n-gram speculative decoding refuses logit_bias), and the
            # server says so: an invariance knob asks whether a setting changes answers.
            aside.add(id(f))
    return [f for f in findings if id(f) not in aside], [f for f in findings if id(f) in aside]


def unconfirmed_notes(set_aside: dict[int, list[Finding]], is_baseline: bool, knob: str | None = None,
                      shared: frozenset[tuple[Reason, str | None]] = frozenset()) -> list[UnconfirmedNote]:
    """The findings set aside in a cell's runs, one note per check or contract probe, each saying
    why it is not evidence against the cell."""
    by_key: dict[tuple[Reason, str | None], list[Finding]] = {}
    for fs in set_aside.values():
        for f in fs:
            by_key.setdefault(set_aside_key(f) or (f.reason, f.prompt_id), []).append(f)
    why = ("this is the baseline and nothing else in the run is wrong (no other finding, a normal "
           "reference score): the check does not hold for this model and numerics, or everything in "
           "this image answers wrongly") if is_baseline else (
           "the baseline misses it too and this run does not diverge from the baseline's answer nor "
           "score worse on the reference text: the check does not hold for this model and numerics, "
           "or the baseline answers wrongly as well")
    refused = ("the server refuses this contract probe's feature (HTTP 400), and so does the baseline: the "
               "probe is skipped on this server") if not is_baseline else (
               "the server refuses this contract probe's feature (HTTP 400): the probe is skipped on this server")
    under_knob = (f"the server refuses this contract probe's feature (HTTP 400) under the knob {knob!r}, "
                  "which the cell without it serves: the setting lacks the feature and the server says so; the "
                  "probe is skipped on this cell")

    def why_of(reason: Reason, prompt: str | None) -> str:
        if reason != Reason.HTTP_ERROR:
            return why
        return under_knob if knob is not None and (reason, prompt) not in shared else refused

    return [UnconfirmedNote(reason=reason, prompt_id=prompt, runs=len(fs), detail=fs[0].detail, why=why_of(reason, prompt))
            for (reason, prompt), fs in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
