"""Evidence: what each finding carries, as types. Pure; no I/O.

One model per kind of evidence (counts, positions, token ids, exit codes, log lines), each
deriving its human text (`text()`), so a program never has to parse prose back; `Evidence` is
their union, told apart by `kind`. The findings themselves, and the reasons they are about:
bench.core.verdicts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


# The same config as bench.core.records.Record, which cannot be the base here: records imports this module.
class _Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def text(self) -> str:
        raise NotImplementedError


class RequestFailed(_Evidence):
    """http_error, timeout, connection_error, protocol_error."""

    kind: Literal["request_failed"] = "request_failed"
    status: int | None = None
    error: str | None = None
    # The contract-probe fields the request asked for (a prompt's `stop`, `json_schema`, ...): a
    # server that refuses the feature itself, as its baseline does, skips the probe.
    probe: list[str] | None = None

    def text(self) -> str:
        return (f"HTTP {self.status}: " if self.status else "") + str(self.error)


class EmptyText(_Evidence):
    kind: Literal["empty_text"] = "empty_text"
    completion_tokens: int | None
    finish_reason: str | None
    absent: bool = False  # the answer had no text at all (null), not even ""

    def text(self) -> str:
        what = "no text (null)" if self.absent else "empty text"
        return f"{what} ({self.completion_tokens} tokens, finish_reason {self.finish_reason})"


class TokenCount(_Evidence):
    """one_token, short_output."""

    kind: Literal["token_count"] = "token_count"
    completion_tokens: int
    min_tokens: int
    # The answer ended on EOS or a stop token id, which is not counted against min_tokens.
    stop_token_last: bool = False

    def text(self) -> str:
        if self.completion_tokens == 1:
            return "1 completion token"
        if self.stop_token_last:
            return (f"{self.completion_tokens - 1} tokens before the stop token that ended it "
                    f"< min_tokens {self.min_tokens}")
        return f"{self.completion_tokens} < min_tokens {self.min_tokens}"


class OverLength(_Evidence):
    """over_max_tokens."""

    kind: Literal["over_length"] = "over_length"
    usage_tokens: int | None
    token_ids: int | None
    max_tokens: int

    def text(self) -> str:
        got = max(n for n in (self.usage_tokens, self.token_ids) if n is not None)
        return f"{got} tokens > max_tokens {self.max_tokens} (usage {self.usage_tokens}, ids {self.token_ids})"


class TwinsDiffer(_Evidence):
    """inconsistent_output, seed_not_reproducible."""

    kind: Literal["twins_differ"] = "twins_differ"
    other_prompt_id: str  # the request it should equal (the finding's prompt_id is the later one)
    position: int  # first differing token, 0-based; or character, when the tokens agree and the text does not
    token: int | None = None  # this request's id there (None: it ended first)
    other_token: int | None = None
    streamed: bool
    other_streamed: bool
    # Set when the token ids agree and the text differs: both texts around `position`.
    this_text: str | None = None
    other_text: str | None = None
    # The request gave tools: a tool parser told the text, the calls and why it ended.
    parsed: bool = False
    # seed_not_reproducible: how both were sampled.
    seed: int | None = None
    temperature: float | None = None

    def text(self) -> str:
        how = "" if self.streamed == self.other_streamed else \
            f" ({'streamed' if self.streamed else 'not streamed'} vs {'streamed' if self.other_streamed else 'not'})"
        if self.seed is not None:
            how += f", both sampled at temperature {self.temperature:g} with seed {self.seed}"
        if self.this_text is not None:
            return (f"the same tokens as {self.other_prompt_id}, the same request, but other text from character "
                    f"{self.position}: {self.this_text!r} vs {self.other_text!r}{how}")
        return (f"differs from {self.other_prompt_id}, the same request, at token {self.position}: "
                f"{self.token} vs {self.other_token}{how}")


class UsageMismatch(_Evidence):
    kind: Literal["usage_mismatch"] = "usage_mismatch"
    usage_tokens: int
    token_ids: int | None = None  # how many ids came back, when they were asked for
    text_chars: int

    def text(self) -> str:
        if self.usage_tokens > 0 and self.text_chars == 0:
            return f"usage counts {self.usage_tokens} tokens, text is empty"
        return f"{self.token_ids} token ids, usage says {self.usage_tokens}"


class StreamTextDiffers(_Evidence):
    """stream_text_mismatch."""

    kind: Literal["stream_text"] = "stream_text"
    position: int  # the first character where the streamed text and the tokens' text differ
    streamed: str  # the streamed text from there (at most 40 characters)
    tokens: str  # the tokens' own text from there

    def text(self) -> str:
        return (f"the streamed text differs from its tokens' own text at character {self.position}: "
                f"{self.streamed!r} vs {self.tokens!r}")


class ChunkUnpaired(_Evidence):
    """chunk_unpaired."""

    kind: Literal["chunk_unpaired"] = "chunk_unpaired"
    chunk: int  # the first chunk (0-based, of the choice's chunks) after which text and ids part
    chunks: int  # the choice's chunks, the one that ended it included
    token_ids: int  # the ids streamed through that chunk
    streamed: str  # the text streamed through it (its last 40 characters)
    tokens: str  # what those ids spell (its last 40 characters; ? where a token alone is no text)

    def text(self) -> str:
        return (f"streamed chunk {self.chunk} of {self.chunks}: through it {self.token_ids} token ids spell "
                f"{self.tokens!r} and the text streamed is {self.streamed!r}")


class DecodeMismatch(_Evidence):
    """decode_mismatch."""

    kind: Literal["decode_mismatch"] = "decode_mismatch"
    at: int  # the first character (0-based) where the text and the decoded ids part
    answer: str  # the answer's text from a little before there (60 characters at most)
    decoded: str  # the server's own decode of the ids, from the same place

    def text(self) -> str:
        return (f"at character {self.at} the text reads {self.answer!r} where the server's tokenizer decodes "
                f"the ids to {self.decoded!r}")


class RepeatedToken(_Evidence):
    """degenerate."""

    kind: Literal["repeated_token"] = "repeated_token"
    count: int
    token_id: int

    def text(self) -> str:
        return f"all {self.count} token ids are {self.token_id}"


class RanOn(_Evidence):
    """never_stops."""

    kind: Literal["ran_on"] = "ran_on"
    tokens: int  # this answer's, to max_tokens
    baseline_tokens: int  # the baseline's, ended by itself

    def text(self) -> str:
        return (f"ran to max_tokens ({self.tokens} tokens) where the baseline's answer ended by itself after "
                f"{self.baseline_tokens}")


class LogprobsByK(_Evidence):
    """logprobs_vary_with_k."""

    kind: Literal["logprobs_by_k"] = "logprobs_by_k"
    other_prompt_id: str
    k: int | None  # the logprobs this request asked for (None: the comparison's)
    other_k: int | None
    position: int
    token_differs: bool  # the tokens differ there; else the same token's logprobs do
    token: int | None = None
    other_token: int | None = None
    logprob: float | None = None
    other_logprob: float | None = None
    tolerance: float

    def text(self) -> str:
        ks = f"k = {self.k or 'default'} vs {self.other_k or 'default'} ({self.other_prompt_id})"
        if self.token_differs:
            return f"other tokens with {ks} at token {self.position}: {self.token} vs {self.other_token}"
        return (f"token {self.token} at {self.position} has logprob {self.logprob:.4f} vs {self.other_logprob:.4f} "
                f"with {ks}, more than {self.tolerance:g} apart")


class StopPassed(_Evidence):
    """stop_ignored."""

    kind: Literal["stop_passed"] = "stop_passed"
    stop: str  # the stop string found in the text
    position: int  # its first character's index in the text
    finish_reason: str | None
    around: str  # the text around it

    def text(self) -> str:
        return (f"the text holds the stop string {self.stop!r} at character {self.position} "
                f"({self.around!r}), finish_reason {self.finish_reason}")


class PromptRepeated(_Evidence):
    """prompt_repeated."""

    kind: Literal["prompt_repeated"] = "prompt_repeated"
    prompt_text: str  # what the prompt's ids decode to
    answer: str  # the answer's text, its start
    streamed: bool

    def text(self) -> str:
        how = "a streamed answer" if self.streamed else "the answer"
        return (f"{how} starts with the prompt's own text {self.prompt_text!r}: {self.answer!r}; its first "
                f"generated text comes after it")


class ToolCallMiss(_Evidence):
    """tool_call_invalid."""

    kind: Literal["tool_call_miss"] = "tool_call_miss"
    problem: str  # what is wrong, in words
    tool_choice: str
    name: str | None = None  # the call's function, where a call came back
    arguments: str | None = None  # its arguments, their first 200 characters
    finish_reason: str | None = None
    streamed: bool = False

    def text(self) -> str:
        call = f"; the call: {self.name}({self.arguments!r})" if self.name is not None or self.arguments else ""
        how = "streamed, " if self.streamed else ""
        return f"tool_choice {self.tool_choice}: {self.problem} ({how}finish_reason {self.finish_reason}){call}"


class FinishReasonWrong(_Evidence):
    """finish_reason_mismatch."""

    kind: Literal["finish_reason"] = "finish_reason"
    problem: str  # what the finish_reason says that did not happen, in words
    finish_reason: str | None
    stop_reason: str | int | None = None
    tokens: int | None  # the choice's completion tokens (its ids where they came back)
    max_tokens: int

    def text(self) -> str:
        stop = f", stop_reason {self.stop_reason!r}" if self.stop_reason is not None else ""
        return (f"finish_reason {self.finish_reason}{stop} after {self.tokens} of max_tokens {self.max_tokens} "
                f"tokens: {self.problem}")


class StopTokenPassed(_Evidence):
    """stop_token_ignored."""

    kind: Literal["stop_token_passed"] = "stop_token_passed"
    token: int  # the stop token id the answer went on past
    position: int  # where it was generated first, 0-based
    tokens: int  # the answer's tokens in all
    finish_reason: str | None

    def text(self) -> str:
        return (f"stop token id {self.token} was generated at token {self.position} and the answer went on to "
                f"{self.tokens} tokens (finish_reason {self.finish_reason})")


class SampledAsGreedy(_Evidence):
    """sampling_ignored."""

    kind: Literal["sampled_as_greedy"] = "sampled_as_greedy"
    # "greedy": every judged token was the most likely one; "identical choices": the n choices
    # all came back the same.
    pattern: Literal["greedy", "identical choices"] = "greedy"
    temperature: float
    tokens: int  # the tokens the chance was bounded over
    choices: int = 1  # the answer's choices (n)
    log10_chance: float  # the bound on how likely that is under the request's sampling, log10
    log10_bound: float  # what counts as too unlikely to be chance

    def text(self) -> str:
        what = ("every one of its first tokens was the most likely one (greedy decoding)" if self.pattern == "greedy"
                else f"all {self.choices} choices came back the same")
        return (f"sampled at temperature {self.temperature:g}, {what} over {self.tokens} tokens: by the answer's own "
                f"logprobs a chance of at most 1e{self.log10_chance:.0f}, under the bound 1e{self.log10_bound:.0f}")


class TokenNotAllowed(_Evidence):
    """token_not_allowed."""

    kind: Literal["token_not_allowed"] = "token_not_allowed"
    token: int  # the first id outside the allow-list
    position: int  # where it came, 0-based
    count: int  # how many of the answer's ids were outside it
    allowed: int  # how many ids the list allowed

    def text(self) -> str:
        return (f"token {self.token} at {self.position} is not among the {self.allowed} allowed ids "
                f"({self.count} of the answer's ids are not)")


class BadWordGenerated(_Evidence):
    """bad_word_generated."""

    kind: Literal["bad_word"] = "bad_word"
    word: str
    token_ids: list[int] = []  # the sequence the server's tokenizer gives it, as it was generated
    position: int  # where the sequence starts, 0-based

    def text(self) -> str:
        return f"bad word {self.word!r} was generated as ids {self.token_ids} at token {self.position}"


class BannedToken(_Evidence):
    """banned_token."""

    kind: Literal["banned_token"] = "banned_token"
    token: int
    position: int  # first place it was generated, 0-based
    count: int  # how many times
    bias: float

    def text(self) -> str:
        return (f"token {self.token}, biased by {self.bias:g}, was generated {self.count} time(s), first at "
                f"token {self.position}")


class ChoiceCount(_Evidence):
    """wrong_choice_count."""

    kind: Literal["choice_count"] = "choice_count"
    asked: int
    got: int

    def text(self) -> str:
        return f"{self.got} choice(s) came back, n = {self.asked} were asked for"


class SchemaMiss(_Evidence):
    """schema_violated."""

    kind: Literal["schema_miss"] = "schema_miss"
    error: str  # the parser's or the validator's words
    parsed: bool  # the text was JSON, and did not validate
    finish_reason: str | None
    answer: str  # the text's first 200 characters
    field: str | None = None  # the request field the schema was sent in (None: written before it was kept)

    def text(self) -> str:
        what = "does not validate against the schema" if self.parsed else "is not JSON"
        sent = f" sent as `{self.field}`" if self.field else ""
        return f"the answer to a schema{sent} {what} ({self.error}; finish_reason {self.finish_reason}): {self.answer!r}"


class ExpectationMissed(_Evidence):
    """expectation_failed."""

    kind: Literal["expectation"] = "expectation"
    expected: str  # the rule, described ("contains 'Paris'")
    answer: str  # the answer's first 200 characters

    def text(self) -> str:
        return f"expected an answer that {self.expected}, got {self.answer!r}"


class ServerExit(_Evidence):
    """boot_failed, boot_timeout, port_taken, server_died, exit_code: what became of the process."""

    kind: Literal["server"] = "server"
    phase: Literal["start", "boot", "serving", "shutdown"]
    exit_code: int | None = None
    killed: bool = False  # needed SIGKILL after the grace period
    message: str | None = None  # the launcher's own words (start error, boot error, port owner)
    last_line: str | None = None  # the log's last non-empty line
    log_tail: str | None = None

    def text(self) -> str:
        if self.phase == "shutdown":
            return "did not exit after SIGTERM; killed" if self.killed else f"exit code {self.exit_code} after SIGTERM"
        if self.phase == "start":
            return str(self.message)
        if self.exit_code is not None:
            during = "during boot" if self.phase == "boot" else "while serving"
            head = f"exited with code {self.exit_code} {during}: {self.last_line}"
        else:
            head = f"{self.message or 'not healthy before the deadline'}" + (
                f": {self.last_line}" if self.last_line is not None else "")
        return f"{head}\nlog tail:\n{self.log_tail}" if self.log_tail is not None else head


class ExitEpisode(_Evidence):
    """exit_exception: one block of the log printed after the stop was requested."""

    kind: Literal["exit_episode"] = "exit_episode"
    episode: str  # its last 2000 characters
    line: int  # its first line, counted from 1 in the log after the stop request
    exception: str | None = None  # the last "SomeError: message" line in it, if any

    def text(self) -> str:
        # Headed by what was raised: the block itself opens with the log line before it.
        return f"{self.exception}\n{self.episode}" if self.exception else self.episode


class TokenDivergence(_Evidence):
    kind: Literal["divergence"] = "divergence"
    position: int  # first differing token, 0 = the very first; a length difference counts
    token: int | None = None  # the run's token there (None: its output ended first)
    baseline_token: int | None = None
    comparator: str = "exact"  # the rule that judged it ("exact", "logprobs top-5")
    token_text: str | None = None  # where the API told it
    baseline_text: str | None = None
    token_logprob: float | None = None
    baseline_logprob: float | None = None
    # Rank of each side's token in the other side's top k there (None: not among them, or no
    # alternatives recorded).
    token_rank_in_baseline: int | None = None
    baseline_rank_in_run: int | None = None
    # invariance_broken: the knob whose cell this is; the "baseline" is the same cell without it.
    knob: str | None = None

    def text(self) -> str:
        other = f"without {self.knob}" if self.knob else "baseline"
        head = (f"with {self.knob} differs from the same cell without it" if self.knob else "differs from baseline") \
            + f" at token {self.position}"
        if self.comparator == "exact" and self.token_logprob is None:
            return head

        def side(token: int | None, text: str | None, lp: float | None) -> str:
            if token is None:
                return "(ended)"
            shown = f"{text!r} " if text is not None else ""
            return f"{shown}(id {token}" + (f", logprob {lp:.2f})" if lp is not None else ")")

        return (f"{head}: {side(self.token, self.token_text, self.token_logprob)} vs {other} "
                f"{side(self.baseline_token, self.baseline_text, self.baseline_logprob)} ({self.comparator})")


class ReferenceLikelihood(_Evidence):
    """reference_nll."""

    kind: Literal["reference"] = "reference"
    mean_nll: float | None  # None: not a number, or not measured (then `error` says why)
    tokens: int
    max_mean_nll: float | None = None  # the ceiling it broke, when that is the finding
    baseline_nll: float | None = None  # the baseline's score, when that comparison is the finding
    tolerance: float | None = None
    error: str | None = None

    def text(self) -> str:
        if self.error is not None:
            return f"reference text not scored: {self.error}"
        if self.mean_nll is None:
            return f"reference text: a prompt logprob of its {self.tokens} tokens is not a number"
        score = f"reference text: mean NLL {self.mean_nll:.3f} nats/token"
        if self.baseline_nll is not None:
            return f"{score}, baseline {self.baseline_nll:.3f} (tolerance {self.tolerance})"
        return f"{score} > ceiling {self.max_mean_nll}"


class CounterMismatch(_Evidence):
    """token_count_mismatch."""

    kind: Literal["counters"] = "counters"
    server_tokens: float  # vllm:generation_tokens_total over the workload
    client_tokens: int  # token ids the client received over the workload
    requests: int

    def text(self) -> str:
        return (f"the server counted {self.server_tokens:.0f} generated tokens over {self.requests} requests, "
                f"the client received {self.client_tokens}")


class Note(_Evidence):
    """Free text: what results folders written before typed evidence hold."""

    kind: Literal["note"] = "note"
    note: str

    def text(self) -> str:
        return self.note


Evidence = Annotated[
    RequestFailed | EmptyText | TokenCount | OverLength | UsageMismatch | StreamTextDiffers | ChunkUnpaired |
    DecodeMismatch | RepeatedToken | ExpectationMissed | TwinsDiffer | ServerExit | ExitEpisode | TokenDivergence |
    ReferenceLikelihood |
    CounterMismatch | StopPassed | PromptRepeated | ToolCallMiss | FinishReasonWrong | StopTokenPassed |
    SampledAsGreedy | TokenNotAllowed | BadWordGenerated |    BannedToken | ChoiceCount | SchemaMiss | LogprobsByK | RanOn | Note,
    Field(discriminator="kind"),
]


# Evidence whose text is shown after the prompt it is about.
PROMPT_PREFIXED = (RequestFailed, EmptyText, TokenCount, OverLength, UsageMismatch, StreamTextDiffers, RepeatedToken,
                   ExpectationMissed, TwinsDiffer, TokenDivergence)
