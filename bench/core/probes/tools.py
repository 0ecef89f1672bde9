"""Tool calls: a chat prompt with `tools` gets an answer that keeps its `tool_choice`
(`tool_call_invalid`): a forced choice makes one call, to that function, with arguments that are
JSON and, for a `strict` tool, valid; `none` makes none."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from bench.core.evidence import ToolCallMiss
from bench.core.probes.base import ContractProbe, register
from bench.core.probes.validate import invalid
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord, ToolCall


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


class ToolsFields(Strict):
    tools: list[Tool] | None = Field(
        default=None, min_length=1, max_length=8,
        description="a chat prompt's functions (`required` is sent with `parallel_tool_calls: false`): with `tool_choice` "
                    "`required` or a tool's name, the answer must call one (that one) with arguments that parse "
                    "as JSON and, for a `strict` tool, validate (unless the answer ended at `length` or at a stop "
                    "string the request gave: cut; a stop string before any call leaves none to judge); with "
                    "`none`, it must call none "
                    "(`tool_call_invalid`). Needs a server with a tool-call parser (`--enable-auto-tool-choice "
                    "--tool-call-parser P`); write it streamed and not (`inconsistent_output` compares the calls)")
    tool_choice: str | None = Field(
        default=None, description="with `tools`: `none`, `auto`, `required`, or the name of one of them (a named "
                                  "choice)")


def forced_tool(prompt: Prompt) -> str | None:
    """The tool a named choice forces, `*` for `required` (any of them), None otherwise."""
    if prompt.tools is None or prompt.tool_choice in (None, "none", "auto"):
        return None
    return "*" if prompt.tool_choice == "required" else prompt.tool_choice


def _arguments(arguments: str) -> str:
    """A call's arguments as what they mean: JSON in one spelling, whatever whitespace or key
    order the server wrote (vLLM's hermes parser re-serialises a whole answer's arguments and
    streams the model's own text: the same tokens, two spellings). Not JSON: as written."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return arguments


@register
class Tools(ContractProbe):
    name = "tools"
    fields = ToolsFields
    reason = Reason.TOOL_CALL_INVALID
    evidence = ToolCallMiss
    signature = "tool-call-invalid"
    reweights = True
    description = ("a chat prompt with `tools` got an answer that breaks its `tool_choice`: a forced choice "
                   "(`required`, or a tool's name) without a call (unless a stop string the request gave ended the "
                   "answer first), a call to another function, arguments that do not parse as JSON or, for a "
                   "`strict` tool, do not validate against its `parameters` (not judged in an answer that ended at "
                   "`length` or at the request's stop string: cut by its own limit); or `none` with a call. The evidence "
                   "has the call, the problem and the finish_reason. Streamed arguments are the deltas put "
                   "together (vllm#47901: arguments dropped when streaming)")

    def asked(self, prompt: Prompt) -> bool:
        return prompt.tools is not None

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.tools is None:
            return "`tool_choice` chooses among `tools`: give both" if prompt.tool_choice is not None else None
        names = [t.name for t in prompt.tools]
        if prompt.kind != "chat":
            return "`tools` are a chat prompt's"
        if prompt.tool_choice not in ("none", "auto", "required", *names):
            return f"`tool_choice` is none, auto, required or one of the tools ({', '.join(names)})"
        if prompt.json_schema is not None:
            return ("a prompt asks for `tools` or a `json_schema`, not both: vLLM lets a forced tool call's schema "
                    "replace the response format")
        return None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.tools is None:
            return
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in prompt.tools]
        choice = prompt.tool_choice
        body["tool_choice"] = choice if choice in ("none", "auto", "required") else \
            {"type": "function", "function": {"name": choice}}
        if choice == "required":
            # One call: a model that may call again and again fills max_tokens with calls (the
            # tiny canary does). A named choice is one call already; asking this of it makes
            # vLLM 0.32 wrap it in the parser's own call format, measured to run the tiny
            # canary's arguments to max_tokens.
            body["parallel_tool_calls"] = False

    def exempts(self, req: RequestRecord, prompt: Prompt | None) -> frozenset[Reason]:
        # A call may come with no text at all. And the parser takes the call's markup out of the
        # content, which the tokens still spell (measured with hermes: content "", tokens
        # "<tool_call>{...}"): the calls are held to the whole answer's by the twins instead.
        return frozenset({Reason.EMPTY_TEXT, Reason.STREAM_TEXT_MISMATCH}) if req.tool_calls else frozenset()

    def told(self, req: RequestRecord) -> str:
        return "".join(f"<call {c.name}: {_arguments(c.arguments)}>" for c in req.tool_calls or [])

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[ToolCallMiss]:
        if prompt.tools is None or (problem := _tool_call_problem(req, prompt)) is None:
            return []
        what, call = problem
        return [ToolCallMiss(problem=what, tool_choice=prompt.tool_choice or "auto", name=call.name if call else None,
                             arguments=call.arguments[:200] if call else None, finish_reason=req.finish_reason,
                             streamed=prompt.stream)]


def _tool_call_problem(req: RequestRecord, prompt: Prompt) -> tuple[str, ToolCall | None] | None:
    """What breaks the prompt's tool_choice, and the call it is about; None when nothing does."""
    calls = req.tool_calls or []
    if prompt.tool_choice == "none":
        return ("a tool was called though tool_choice is none", calls[0]) if calls else None
    forced = forced_tool(prompt)
    # A stop string the request gave ended the answer: a call it cut short, or before it began,
    # is the request's own doing (vllm#53255 is then told by the finish_reason, not the call).
    # (At `length` a missing call is still one: vllm#50399 wrote calls to max_tokens and kept none.)
    stopped = isinstance(req.stop_reason, str) and req.stop_reason in (prompt.stop or [])
    if forced is not None and not calls:
        return None if stopped else ("no tool call came back", None)
    tools = {t.name: t for t in prompt.tools or []}
    for call in calls:
        if forced not in (None, "*") and call.name != forced:
            return f"the call is to {call.name!r}, not the one named", call
        if call.name not in tools:
            return f"the call is to {call.name!r}, which is not among the tools", call
        if req.finish_reason == "length" or stopped:
            continue  # cut by the request's own limit or stop string: its arguments are unfinished
        try:
            value = json.loads(call.arguments)
        except ValueError as exc:
            return f"the arguments are not JSON ({type(exc).__name__}: {exc})", call
        if tools[call.name].strict and (error := invalid(value, tools[call.name].parameters)) is not None:
            return f"the arguments do not validate against the tool's parameters ({error})", call
    return None

