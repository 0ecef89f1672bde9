"""An allow-list: every token of every choice is one the request allowed (`token_not_allowed`;
n > 1 choices losing it, vllm#17975's family; `bad_words` that ban every allowed id answered
with token 0, vllm#57986)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from bench.core.evidence import TokenNotAllowed
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class AllowedTokenIdsFields(Strict):
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, max_length=4096,
        description="vLLM's `allowed_token_ids`: every token of every choice must be one of them "
                    "(`token_not_allowed`); EOS too is masked unless listed")


@register
class AllowedTokenIds(ContractProbe):
    name = "allowed_token_ids"
    fields = AllowedTokenIdsFields
    reason = Reason.TOKEN_NOT_ALLOWED
    evidence = TokenNotAllowed
    signature = "allowed-token-ids-ignored"
    reweights = True
    description = ("an answer holds a token id outside the prompt's `allowed_token_ids`: the server sampled from "
                   "more than the allow-list. Judged for every choice (n > 1 children losing the request's "
                   "parameters: vllm#17975's family) and whatever else the request asks (`bad_words` that ban "
                   "every allowed id leave a row of -inf, answered with token 0: vllm#57986); the evidence has "
                   "the first such id, where it came, how many and the list's size")

    def asked(self, prompt: Prompt) -> bool:
        return bool(prompt.allowed_token_ids)

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.allowed_token_ids:
            body["allowed_token_ids"] = list(prompt.allowed_token_ids)

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[TokenNotAllowed]:
        allowed = set(prompt.allowed_token_ids or [])
        ids = req.token_ids or []
        outside = [i for i, token in enumerate(ids) if token not in allowed]
        if not allowed or not outside:
            return []
        first = outside[0]
        return [TokenNotAllowed(token=ids[first], position=first, count=len(outside), allowed=len(allowed))]
