"""Stop strings: the text never holds one of the prompt's `stop` strings (`stop_ignored`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from bench.core.evidence import StopPassed
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class StopFields(Strict):
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=8,
        description="stop strings: the text must never contain one (`stop_ignored`). vLLM looks for them only "
                    "once `min_tokens` are out, so such a prompt asks for none unless it says otherwise; a common "
                    "letter (`e`) is hit by any model. With its own `min_tokens`, the answer must still reach them "
                    "(`short_output`, vllm#21987), and the text is not searched (the first tokens may hold one)")


@register
class Stop(ContractProbe):
    name = "stop"
    fields = StopFields
    reason = Reason.STOP_IGNORED
    evidence = StopPassed
    signature = "stop-string-ignored"
    description = ("the text contains one of the prompt's stop strings: the server did not stop there (vLLM looks "
                   "for them once min_tokens are out, and a stop probe asks for none unless it gives its own: then "
                   "the text is not searched, and an answer the stop string ended before min_tokens is "
                   "`short_output`, vllm#21987). The evidence has the string, where it is, and the finish_reason")

    def asked(self, prompt: Prompt) -> bool:
        return bool(prompt.stop)

    def shape(self, prompt: Prompt, shape: RequestShape) -> RequestShape:
        # vLLM looks for stop strings only once min_tokens are out.
        if prompt.stop and prompt.min_tokens is None:
            return shape.model_copy(update={"min_tokens": 0})
        return shape

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.stop:
            body["stop"] = list(prompt.stop)

    def exempts(self, req: RequestRecord, prompt: Prompt | None) -> frozenset[Reason]:
        # An answer the stop ended may be short, even empty: the first token can hold the string.
        if prompt is not None and prompt.stop and req.finish_reason == "stop":
            return frozenset({Reason.EMPTY_TEXT})
        return frozenset()

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[StopPassed]:
        if shape.min_tokens:
            # vLLM looks for stop strings from the text of token min_tokens on, which the client
            # cannot place: those first tokens may hold one. The answer's length holds the promise
            # that they came at all (short_output, vllm#21987).
            return []
        text = req.text or ""
        found = [(text.find(s), s) for s in prompt.stop or [] if s in text]
        if not found:
            return []
        at, stop = min(found)
        return [StopPassed(stop=stop, position=at, finish_reason=req.finish_reason, around=text[max(0, at - 20):at + 20])]
