"""n choices: a prompt that asks for `n` gets exactly that many (`wrong_choice_count`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from bench.core.evidence import ChoiceCount
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape, Workload
    from bench.core.records import RequestRecord


class ChoicesFields(Strict):
    n: int = Field(default=1, ge=1, le=16, description="how many choices to ask for: exactly that many must come "
                                                         "back (`wrong_choice_count`); the first is the one judged")


@register
class Choices(ContractProbe):
    name = "n"
    fields = ChoicesFields
    reason = Reason.WRONG_CHOICE_COUNT
    evidence = ChoiceCount
    signature = "n-not-honoured"
    description = "the prompt asked for `n` choices and another number came back"

    def asked(self, prompt: Prompt) -> bool:
        return prompt.n > 1

    def workload_problem(self, prompt: Prompt, workload: Workload) -> str | None:
        if prompt.n > 1 and prompt.sampling is None and workload.temperature == 0:
            return (f"prompt {prompt.id}: n > 1 needs sampling (vLLM refuses n > 1 with greedy decoding): give it "
                    "`sampling`")
        return None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.n > 1:
            body["n"] = prompt.n

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[ChoiceCount]:
        if req.choice_tokens is not None and len(req.choice_tokens) != prompt.n:
            return [ChoiceCount(asked=prompt.n, got=len(req.choice_tokens))]
        return []
