"""What each run sends: the prompts, with the contract probes' fields (bench.core.probes), and the workload around them. Pure."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from bench.core.probes import PROBES
from bench.core.probes.allowed_token_ids import AllowedTokenIdsFields
from bench.core.probes.bad_words import BadWordsFields
from bench.core.probes.choices import ChoicesFields
from bench.core.probes.chunks import ChunksPairedFields
from bench.core.probes.decoded import TextDecodedFields
from bench.core.probes.finish_reason import FinishReasonFields
from bench.core.probes.logit_bias import LogitBiasFields
from bench.core.probes.prompt_repeated import DecodesToFields
from bench.core.probes.sampling import SamplingFields
from bench.core.probes.sampling_honoured import SamplingHonouredFields
from bench.core.probes.schema import SchemaFields
from bench.core.probes.stop import StopFields
from bench.core.probes.stop_token_ids import StopTokenIdsFields
from bench.core.probes.tools import ToolsFields
from bench.core.probes.top_logprobs import TopLogprobsFields
from bench.core.schema import Name, Strict


class Message(Strict):
    role: Literal["system", "user", "assistant"] = Field(description="who says it")
    content: str = Field(description="what is said")


class Expect(Strict):
    """What a healthy model's answer to a prompt holds, judged without any baseline: a model that
    lost part of its weights talks fluently and wrongly. Exactly one of the three."""

    contains: str | None = Field(default=None, description="the answer contains this text")
    regex: str | None = Field(default=None, description="the answer matches this regular expression (searched)")
    one_of: list[str] | None = Field(
        default=None, min_length=1, description="the answer contains one of these texts")
    ignore_case: bool = Field(default=False, description="compare without regard to case")

    @model_validator(mode="after")
    def _one_rule(self) -> Expect:
        if sum(x is not None for x in (self.contains, self.regex, self.one_of)) != 1:
            raise ValueError("give exactly one of `contains`, `regex`, `one_of`")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r}: {exc}") from None
        return self

    def describe(self) -> str:
        case = " (any case)" if self.ignore_case else ""
        if self.contains is not None:
            return f"contains {self.contains!r}{case}"
        if self.regex is not None:
            return f"matches /{self.regex}/{case}"
        return f"contains one of {self.one_of!r}{case}"

    def holds(self, text: str) -> bool:
        if self.regex is not None:
            return re.search(self.regex, text, re.IGNORECASE if self.ignore_case else 0) is not None
        wanted = [self.contains] if self.contains is not None else list(self.one_of or [])
        if self.ignore_case:
            text, wanted = text.lower(), [w.lower() for w in wanted]
        return any(w in text for w in wanted)


# The prompt's own fields that make two requests twins (the probes say which of theirs do).
CORE_CONTENT = frozenset({"kind", "prompt", "prompt_ids", "messages", "min_tokens", "max_tokens", "ignore_eos",
                          "stop_token_ids"})


class PromptCore(Strict):
    """A prompt's own fields; those of the contract probes come from bench.core.probes."""

    id: Name = Field(description="the prompt's name in records and reports")
    kind: Literal["completion", "chat"] = Field(
        default="completion", description="`completion` (needs `prompt`) or `chat` (needs `messages`)")
    prompt: str | None = Field(default=None, description="the text of a completion request")
    prompt_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1,
        description="a completion request's prompt as token ids instead of text: ids that end inside a UTF-8 "
                    "character check that a stream does not repeat the prompt (vllm#48853; write it streamed and "
                    "not, `inconsistent_output`)")
    messages: list[Message] | None = Field(default=None, description="the messages of a chat request")
    stream: bool = Field(default=False, description="stream the answer (gives time to first token and "
                                                     "inter-token latency)")
    expect: Expect | None = Field(
        default=None, description="a known answer, judged without a baseline (`expectation_failed`); exactly one "
                                  "of `contains`, `regex`, `one_of`")
    min_tokens: int | None = Field(
        default=None, ge=0, le=1_000_000, description="this prompt's `min_tokens` instead of the workload's (a "
                                                      "shorter answer is `short_output`)")
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000,
                                   description="this prompt's `max_tokens` instead of the workload's")
    ignore_eos: bool | None = Field(default=None, description="this prompt's `ignore_eos` instead of the workload's")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="this prompt's `stop_token_ids` instead of the workload's (`[]`: none)")


class Prompt(ToolsFields, TopLogprobsFields, SchemaFields, ChoicesFields, AllowedTokenIdsFields, BadWordsFields,
             LogitBiasFields, StopFields, DecodesToFields, SamplingFields, SamplingHonouredFields, FinishReasonFields,
             StopTokenIdsFields, ChunksPairedFields, TextDecodedFields, PromptCore):
    """One request of the workload. The keys after `stop_token_ids` ask for contract probes
    (docs/judged.md, "Contract probes"), each key declared by its probe's module in
    bench/core/probes/."""

    @model_validator(mode="after")
    def _shape(self) -> Prompt:
        if self.kind == "completion" and ((self.prompt is None) == (self.prompt_ids is None)
                                          or self.messages is not None):
            raise ValueError("a completion prompt needs `prompt` or `prompt_ids` (one of them) and no `messages`")
        if self.kind == "chat" and (not self.messages or self.prompt is not None or self.prompt_ids is not None):
            raise ValueError("a chat prompt needs `messages` and no `prompt` or `prompt_ids`")
        for probe in PROBES:
            if (problem := probe.problem(self)) is not None:
                raise ValueError(problem)
        return self

    def probes(self) -> list[str]:
        """The contract probes this prompt's request asks for that a server may lack (their names)."""
        return [p.name for p in PROBES if p.optional_feature and p.asked(self)]

    def content(self) -> str:
        """What its request asks and how it is sampled, whatever its id, whether it streams and
        what is expected of it: two prompts of one content are twins."""
        fields = CORE_CONTENT.union(*(p.content_fields() for p in PROBES))
        return self.model_dump_json(include=set(fields))

    def request(self, workload: Workload) -> RequestShape:
        """The token limits this prompt's request is sent with: its own where it gives them, as
        its contract probes need them."""
        shape = RequestShape(min_tokens=workload.min_tokens if self.min_tokens is None else self.min_tokens,
                             max_tokens=workload.max_tokens if self.max_tokens is None else self.max_tokens,
                             ignore_eos=workload.ignore_eos if self.ignore_eos is None else self.ignore_eos,
                             stop_token_ids=tuple(workload.stop_token_ids if self.stop_token_ids is None
                                                  else self.stop_token_ids))
        for probe in PROBES:
            shape = probe.shape(self, shape)
        return shape


class RequestShape(Strict):
    """A prompt's token limits and stop token ids as sent (Prompt.request): the client sends them,
    the judge holds the answer to them."""

    min_tokens: int
    max_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...] = ()


class Workload(Strict):
    prompts: list[Prompt] = Field(min_length=1, description="the requests each run sends, in order")
    min_tokens: int = Field(default=128, ge=1, le=1_000_000, description="vLLM's `min_tokens` for every request")
    max_tokens: int = Field(default=128, ge=1, le=1_000_000, description="`max_tokens` for every request")
    ignore_eos: bool = Field(default=True, description="vLLM's `ignore_eos`: generate `max_tokens` whatever the model "
                                                       "says")
    # A healthy server masks these, like EOS, until min_tokens: with min_tokens == max_tokens a
    # token the model does pick then shows a server that lets it through early (vllm#15967).
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default=[], description="vLLM's `stop_token_ids`: token ids that end an answer, like EOS, once `min_tokens` "
                                "are out (a server that stops on them earlier is `short_output`)")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="sampling temperature (0: greedy)")
    seed: int = Field(default=0, ge=0, lt=2**63, description="the sampling seed of every request")
    concurrency: int = Field(default=1, ge=1, le=1024, description="requests in flight at once")
    request_timeout_s: float = Field(default=120.0, gt=0, le=86_400,
                                     description="seconds before a request is a `timeout`")

    @model_validator(mode="after")
    def _tokens(self) -> Workload:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) > max_tokens ({self.max_tokens})")
        for p in self.prompts:
            for probe in PROBES:
                if (problem := probe.workload_problem(p, self)) is not None:
                    raise ValueError(problem)
            shape = p.request(self)
            if shape.min_tokens > shape.max_tokens:
                raise ValueError(f"prompt {p.id}: min_tokens ({shape.min_tokens}) > max_tokens ({shape.max_tokens})")
        ids = [p.id for p in self.prompts]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate prompt ids: {sorted({i for i in ids if ids.count(i) > 1})}")
        return self
