"""Logprobs by k: two requests alike but for how many logprobs they ask for get the same tokens
with the same logprobs (`logprobs_vary_with_k`, vllm#44319)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from bench.core.evidence import LogprobsByK
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt
    from bench.core.records import RequestRecord
    from bench.core.tokens import Comparator


class TopLogprobsFields(Strict):
    top_logprobs: int | None = Field(
        default=None, ge=1, le=20,
        description="ask for this many logprobs per token instead of the comparison's k; two prompts alike but for "
                    "it (twins) must get the same tokens with the same logprobs (`logprobs_vary_with_k`, "
                    "vllm#44319)")


@register
class TopLogprobs(ContractProbe):
    name = "top_logprobs"
    fields = TopLogprobsFields
    content = frozenset()  # twins that differ in it are what the probe compares
    reason = Reason.LOGPROBS_VARY_WITH_K
    evidence = LogprobsByK
    signature = "logprobs-vary-with-k"
    description = ("two requests of one run alike but for how many logprobs they asked for (a prompt's "
                   "`top_logprobs`, k = 1 against 20) got other tokens (as the cell's comparator sees them), or the "
                   "same token with logprobs further apart than the comparison's `logprob_tolerance` (vllm#44319): "
                   "how many alternatives are shown must not change what was chosen, nor its value. The evidence "
                   "has both k, the position and both values")

    def asked(self, prompt: Prompt) -> bool:
        return prompt.top_logprobs is not None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        # Instead of the comparison's k, which the request builder asked for.
        if prompt.top_logprobs is not None:
            body["return_tokens_as_token_ids"] = True
            body.update({"logprobs": True, "top_logprobs": prompt.top_logprobs} if prompt.kind == "chat"
                        else {"logprobs": prompt.top_logprobs})

    def judges_twins(self, prompt: Prompt, other: Prompt) -> bool:
        return prompt.top_logprobs != other.top_logprobs

    def check_twins(self, req: RequestRecord, ref: RequestRecord, prompt: Prompt, other: Prompt,
                    comparator: Comparator, tolerance: float) -> LogprobsByK | None:
        """The same tokens, as the comparator sees them, with the same logprob for each, within
        the tolerance."""
        mine, theirs = req.output, ref.output
        if mine is None or theirs is None:
            return None
        differ = comparator.first_difference(mine, theirs)
        agree = min(len(mine.ids), len(theirs.ids)) if differ is None else differ
        moved = next((i for i in range(agree) if (a := mine.at(i)) is not None and (b := theirs.at(i)) is not None
                      and a.logprob is not None and b.logprob is not None and abs(a.logprob - b.logprob) > tolerance),
                     None)
        at = moved if moved is not None else differ
        if at is None:
            return None
        mine_lp, theirs_lp = mine.at(at), theirs.at(at)
        return LogprobsByK(
            other_prompt_id=ref.prompt_id, k=prompt.top_logprobs, other_k=other.top_logprobs, position=at,
            token_differs=moved is None, token=mine.ids[at] if at < len(mine.ids) else None,
            other_token=theirs.ids[at] if at < len(theirs.ids) else None,
            logprob=mine_lp.logprob if mine_lp else None, other_logprob=theirs_lp.logprob if theirs_lp else None,
            tolerance=tolerance)
