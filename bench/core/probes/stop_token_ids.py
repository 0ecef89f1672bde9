"""Stop token ids: an answer holds one of its request's `stop_token_ids` only as its last token
(`stop_token_ignored`). vLLM masks them until min_tokens are out and ends the answer on the first
one after (`check_stop`), so anywhere else one shows a server that let it through. It holds for
every answer whose request named any (the workload's or the prompt's own), every choice included."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.core.evidence import StopTokenPassed
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class StopTokenIdsFields(Strict):
    """No field of its own: the prompt's and the workload's `stop_token_ids` are the core's."""


@register
class StopTokenIds(ContractProbe):
    name = "stop_token_ids"
    fields = StopTokenIdsFields
    reason = Reason.STOP_TOKEN_IGNORED
    evidence = StopTokenPassed
    signature = "stop-token-ignored"
    description = ("an answer holds one of its request's `stop_token_ids` before its last token: the server "
                   "generated it and went on (vLLM masks them until min_tokens and stops on the first one after). "
                   "Judged for every choice (vllm#17975, #28861: n > 1 losing `stop_token_ids` for all but one "
                   "choice); the evidence has the id, where it came and the answer's length")
    optional_feature = False  # every server takes stop token ids

    def asked(self, prompt: Prompt) -> bool:
        return True

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[StopTokenPassed]:
        ids = req.token_ids or []
        stops = set(shape.stop_token_ids)
        at = next((i for i, token in enumerate(ids[:-1]) if token in stops), None)
        if at is None:
            return []
        return [StopTokenPassed(token=ids[at], position=at, tokens=len(ids), finish_reason=req.finish_reason)]
