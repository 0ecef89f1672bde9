"""A signature's conditions on where a cell's findings stand: which way an answer's usage was
wrong, a promise broken only by streamed answers, a failure only under one invariance knob.
Pure; registered with bench.core.conditions' others (that module imports this one), so a
signature's key finds its class wherever conditions are read."""

from __future__ import annotations

from typing import ClassVar, Literal

from bench.core.conditions import CellEvidence, Check, Condition, Releases, condition
from bench.core.evidence import TwinsDiffer, UsageMismatch
from bench.core.verdicts import Finding, Reason

# The promises an answer keeps on its own, each a contract probe's finding about one answer: what
# a streamed answer may break while the same request answered whole keeps it.
ANSWER_PROMISES = (Reason.SCHEMA_VIOLATED, Reason.TOOL_CALL_INVALID, Reason.STOP_IGNORED, Reason.STOP_TOKEN_IGNORED,
                   Reason.BANNED_TOKEN, Reason.FINISH_REASON_MISMATCH)


def _usage_ways(e: UsageMismatch) -> set[str]:
    ways = set()
    if e.usage_tokens > 0 and e.text_chars == 0:
        ways.add("empty_text")
    if e.token_ids is not None and e.usage_tokens != e.token_ids:
        ways.add("under" if e.usage_tokens < e.token_ids else "over")
    return ways


@condition
class UsageCountCondition(Condition):
    """An answer's usage disagreed with what it sent (`usage_text_mismatch`) this way: `under`,
    usage.completion_tokens below the token ids that came back; `over`, above them; `empty_text`,
    tokens counted and no text."""

    usage_count: Literal["under", "over", "empty_text"]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        found = [(f, f.evidence) for f in ev.findings if isinstance(f.evidence, UsageMismatch)]
        if not found:
            return False, "no answer's usage disagrees with what it sent"
        finding, usage = next(((f, e) for f, e in found if self.usage_count in _usage_ways(e)), found[0])
        return self.usage_count in _usage_ways(usage), finding.detail


def _stream_only(ev: CellEvidence, reasons: list[Reason]) -> tuple[bool | None, list[Finding], str]:
    """Whether some streamed answer broke one of these promises while every whole twin of its
    request kept it, request by request (a cell of several faults breaks others whole as well):
    the answer (None where the streamed answers that broke one have no whole twin to tell), the
    streamed answers' findings that hold it (all the findings where none does), and in words."""
    found = [f for f in ev.findings if f.reason in reasons and f.prompt_id is not None]
    if not found:
        return False, [], f"none of the findings {', '.join(reasons)}"
    broken = {(f.reason, f.prompt_id) for f in found}
    streamed = [f for f in found if f.prompt_id in ev.stream_twins]
    only = [f for f in streamed if ev.stream_twins[f.prompt_id or ""]
            and not any((f.reason, twin) in broken for twin in ev.stream_twins[f.prompt_id or ""])]
    if only:
        f = only[0]
        twins = ", ".join(ev.stream_twins[f.prompt_id or ""])
        return True, only, f"{f.reason} only on streamed answers: {f.prompt_id}, where its whole twin {twins} keeps it"
    alone = sorted({f.prompt_id or "" for f in streamed if not ev.stream_twins[f.prompt_id or ""]})
    if alone:
        return None, found, f"{streamed[0].reason} on the streamed {alone[0]}, which no whole twin of its request shows"
    whole = sorted({f"{f.reason} on {f.prompt_id}" for f in found if f.prompt_id not in ev.stream_twins})
    return False, found, f"{whole[0]}, answered whole"


@condition
class StreamOnlyCondition(Condition):
    """A streamed answer broke one of these promises and every twin of its request sent whole (not
    streamed) kept it."""

    stream_only: list[Reason]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        holds, _, says = _stream_only(ev, self.stream_only)
        return holds, says


@condition
class StreamExplainsTwinsCondition(Condition):
    """Every pair of twins that differ by tokens is a streamed answer that broke a promise
    (ANSWER_PROMISES) beside its whole twin, which kept it: the stream's doing, not the batch's or
    the cache's, which change whole answers as well."""

    stream_explains_twins: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        pairs = [f for f in ev.findings if f.reason == Reason.INCONSISTENT_OUTPUT and isinstance(f.evidence, TwinsDiffer)
                 and f.evidence.this_text is None]
        if not pairs:
            return None, "no two requests of the same content differ by tokens"
        holds, found, _ = _stream_only(ev, list(ANSWER_PROMISES))
        broken = {f.prompt_id for f in found} if holds else set()
        unexplained = [f for f in pairs if not _explained(f, broken)]
        if unexplained:
            return not self.stream_explains_twins, f"not by streaming alone: {unexplained[0].detail}"
        return self.stream_explains_twins, f"twins differ only where a streamed answer broke a promise its whole " \
            f"twin kept ({', '.join(sorted(p or '' for p in broken))})"


def _explained(f: Finding, broken: set[str | None]) -> bool:
    e = f.evidence
    assert isinstance(e, TwinsDiffer)
    streamed = f.prompt_id if e.streamed else e.other_prompt_id
    return e.streamed != e.other_streamed and streamed in broken


@condition
class OnlyUnderKnobCondition(Condition):
    """The cell is an invariance knob's cell and the same cell without the knob passes: it fails
    only under the knob."""

    only_under_knob: bool
    names_the_knob: ClassVar[bool] = True

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if ev.cell.knob is None:
            return not self.only_under_knob, "not a knob's cell"
        if ev.contrast is None:
            return None, "no contrast"
        knob = ev.contrast.only_under_knob
        said = f"fails only under knob {knob}: the same cell without it passes" if knob else \
            f"the same cell without knob {ev.cell.knob} fails too"
        return (knob is not None) == self.only_under_knob, said
