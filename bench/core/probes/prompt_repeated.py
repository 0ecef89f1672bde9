"""A prompt of token ids is not told again: an answer to `prompt_ids` does not start with the text
they decode to (`prompt_repeated`, vllm#48853)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from bench.core.evidence import PromptRepeated
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class DecodesToFields(Strict):
    decodes_to: str | None = Field(
        default=None, min_length=1,
        description="with `prompt_ids`: the text they decode to, up to their last whole character (the model's "
                    "tokenizer, `decode`). An answer whose text starts with it repeats the prompt "
                    "(`prompt_repeated`, vllm#48853: a prompt that ends inside a UTF-8 character)")


@register
class DecodesTo(ContractProbe):
    name = "decodes_to"
    fields = DecodesToFields
    content = frozenset()  # what is expected of the answer, not what is asked
    reason = Reason.PROMPT_REPEATED
    evidence = PromptRepeated
    signature = "prompt-repeated"
    description = ("the text of an answer to token ids (`prompt_ids`) starts with what the ids decode to (the "
                   "prompt's `decodes_to`): the detokenizer told the prompt again, as vLLM does for a prompt that "
                   "ends inside a UTF-8 character (vllm#48853). Streamed or not; the evidence has both texts")
    optional_feature = False  # token-id prompts are the completions API's own

    def asked(self, prompt: Prompt) -> bool:
        return prompt.decodes_to is not None

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.decodes_to is not None and prompt.prompt_ids is None:
            return "`decodes_to` is the text of `prompt_ids`: give both"
        return None

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[PromptRepeated]:
        text = req.text or ""
        if prompt.decodes_to is None or not text.startswith(prompt.decodes_to):
            return []
        return [PromptRepeated(prompt_text=prompt.decodes_to, streamed=prompt.stream,
                               answer=text[:len(prompt.decodes_to) + 40])]
