"""Twins: requests of one run with the same content must get the same answer. Pure.

Each request is held to the first of its kind in workload order: by the cell's comparator, and
the same tokens must be told alike (inconsistent_output); where a contract probe judges a pair
instead (a seed, another number of logprobs), by that probe (bench.core.probes)."""

from __future__ import annotations

from bench.core.config import Workload
from bench.core.evidence import TwinsDiffer
from bench.core.probes import PROBES
from bench.core.records import RequestRecord
from bench.core.tokens import EXACT, Comparator, Output
from bench.core.verdicts import Finding, Reason


def told(req: RequestRecord) -> str:
    """What an answer told its client: its text, then what its contract probes add (tool calls, why
    it ended)."""
    return (req.text or "") + "".join(p.told(req) for p in PROBES)


def _first_text_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def judge_twins(requests: list[RequestRecord], workload: Workload, comparator: Comparator = EXACT,
                tolerance: float = 0.05) -> list[Finding]:
    """Requests of one run with the same content must get the same tokens (inconsistent_output),
    or keep the promise of the contract probe that judges them (seed_not_reproducible,
    logprobs_vary_with_k): each against the first of its kind in workload order."""
    prompts = {p.id: p for p in workload.prompts}
    content = {p.id: p.content() for p in workload.prompts}
    first: dict[str, RequestRecord] = {}
    out = []
    order = {p.id: i for i, p in enumerate(workload.prompts)}
    for req in sorted(requests, key=lambda r: order.get(r.prompt_id, len(order))):
        key = content.get(req.prompt_id)
        mine = req.output
        if key is None or mine is None:
            continue
        ref = first.setdefault(key, req)
        theirs = ref.output
        if ref is req or theirs is None:
            continue
        prompt, other = prompts[req.prompt_id], prompts[ref.prompt_id]
        judge = next((p for p in PROBES if p.judges_twins(prompt, other)), None)
        if judge is not None:
            evidence = judge.check_twins(req, ref, prompt, other, comparator, tolerance)
            if evidence is not None:
                out.append(Finding(reason=judge.reason, prompt_id=req.prompt_id, evidence=evidence))
            continue
        if (found := _inconsistent(req, ref, mine, theirs, comparator)) is not None:
            out.append(found)
    return out


def _inconsistent(req: RequestRecord, ref: RequestRecord, mine: Output, theirs: Output,
                  comparator: Comparator) -> Finding | None:
    pos = comparator.first_difference(mine, theirs)
    if pos is None and mine.ids == theirs.ids and (this := told(req)) != (other := told(ref)):
        # The same tokens told as other text or other tool calls: the answer was made wrong after
        # generation (a detokenizer or a stream that repeats the prompt, vllm#48853; a stream
        # that drops a call's arguments, vllm#47901). Only for ids that are equal: where the
        # tolerant rule let a token difference pass, the texts differ from there on as they must.
        pos = _first_text_difference(this, other)
        return Finding(reason=Reason.INCONSISTENT_OUTPUT, prompt_id=req.prompt_id, evidence=TwinsDiffer(
            other_prompt_id=ref.prompt_id, position=pos, streamed=req.stream, other_streamed=ref.stream,
            this_text=this[max(0, pos - 20):pos + 40], other_text=other[max(0, pos - 20):pos + 40],
            parsed=req.tool_calls is not None))
    if pos is None:
        return None
    return Finding(reason=Reason.INCONSISTENT_OUTPUT, prompt_id=req.prompt_id, evidence=TwinsDiffer(
        other_prompt_id=ref.prompt_id, position=pos, token=mine.ids[pos] if pos < len(mine.ids) else None,
        other_token=theirs.ids[pos] if pos < len(theirs.ids) else None, streamed=req.stream,
        other_streamed=ref.stream))



