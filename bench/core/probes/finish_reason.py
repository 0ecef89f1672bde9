"""finish_reason as what happened: `length` only where the answer reached its max_tokens (or the
server's context), `tool_calls` only with a call and not for one cut at that limit, a stop string named only if the request gave
it (`finish_reason_mismatch`). It holds for every answer: no prompt field asks for it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bench.core.evidence import FinishReasonWrong
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class FinishReasonFields(Strict):
    """No field: every answer has a finish_reason to hold to what happened."""


@register
class FinishReason(ContractProbe):
    name = "finish_reason"
    fields = FinishReasonFields
    reason = Reason.FINISH_REASON_MISMATCH
    evidence = FinishReasonWrong
    signature = "finish-reason-wrong"
    description = ("an answer's finish_reason says what did not happen: `length` before the answer reached its "
                   "max_tokens (or the server's context, `max_model_len` less the prompt), `tool_calls` without a "
                   "call (vllm#53255), or `stop` naming a stop string the request did not give. Judged for every "
                   "choice of an answer; the evidence has both reasons, the tokens and the limit. Twins that "
                   "end for other reasons (a streamed answer and the same one whole) are `inconsistent_output`")
    optional_feature = False  # every server says why an answer ended

    def asked(self, prompt: Prompt) -> bool:
        return True

    def told(self, req: RequestRecord) -> str:
        # Twins (a streamed answer and the same one whole) must end for the same reason.
        return f"<finish_reason {req.finish_reason}>"

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[FinishReasonWrong]:
        tokens = _tokens(req)
        limit = shape.max_tokens
        if req.max_model_len is not None and req.prompt_tokens is not None:
            limit = min(limit, req.max_model_len - req.prompt_tokens)
        problem = None
        if req.finish_reason == "length" and tokens is not None and req.max_model_len is not None and tokens < limit:
            problem = "`length`, but the answer is shorter than its limit"
        elif req.finish_reason == "tool_calls" and not req.tool_calls:
            problem = "`tool_calls`, but no tool call came back"
        elif req.finish_reason == "tool_calls" and tokens is not None and tokens >= limit \
                and any(not _parses(c.arguments) for c in req.tool_calls or []):
            # An answer ended by the model at the very limit would end its call too: arguments
            # that do not parse there were cut by it.
            problem = "`tool_calls` on a call cut at the token limit (its arguments do not parse): `length`"
        elif req.finish_reason == "stop" and isinstance(req.stop_reason, str) and req.stop_reason not in (prompt.stop or []):
            problem = "`stop` on a stop string the request did not give"
        if problem is None:
            return []
        return [FinishReasonWrong(problem=problem, finish_reason=req.finish_reason, stop_reason=req.stop_reason,
                                  tokens=tokens, max_tokens=limit)]


def _parses(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


def _tokens(req: RequestRecord) -> int | None:
    """The answer's own completion tokens: its ids where they came back; its usage only where it
    is the one choice (usage counts every choice's)."""
    if req.token_ids is not None:
        return len(req.token_ids)
    return req.completion_tokens if not req.choice_tokens or len(req.choice_tokens) == 1 else None
