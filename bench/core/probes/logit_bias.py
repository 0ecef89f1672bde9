"""Banned tokens: an id the prompt biased by -100 (`logit_bias`) is never generated (`banned_token`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from bench.core.evidence import BannedToken
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord

# logit_bias is added to a logit; OpenAI documents -100 as "effectively bans the token".
BAN = -100.0


class LogitBiasFields(Strict):
    logit_bias: dict[int, float] | None = Field(
        default=None, description="OpenAI `logit_bias` by token id (-100 to 100): an id biased by -100 must never "
                                  "appear (`banned_token`); +100 on EOS with `min_tokens` checks that the server "
                                  "still holds EOS back until then (`short_output`)")


@register
class LogitBias(ContractProbe):
    name = "logit_bias"
    fields = LogitBiasFields
    reason = Reason.BANNED_TOKEN
    evidence = BannedToken
    signature = "logit-bias-ignored"
    reweights = True
    description = "a token id the prompt biased by -100 (`logit_bias`) was generated; the evidence has the id and its position"

    def asked(self, prompt: Prompt) -> bool:
        return bool(prompt.logit_bias)

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.logit_bias and not all(-100 <= b <= 100 for b in prompt.logit_bias.values()):
            return "`logit_bias` values go from -100 to 100"
        return None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in prompt.logit_bias.items()}

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[BannedToken]:
        ids = req.token_ids or []
        return [BannedToken(token=token, position=ids.index(token), count=ids.count(token), bias=bias)
                for token, bias in (prompt.logit_bias or {}).items() if bias <= BAN and token in ids]
