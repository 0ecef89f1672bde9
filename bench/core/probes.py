"""Contract probes: what a prompt's request asked beyond plain generation (`stop`, `logit_bias`,
`n`, `json_schema`, token ids with the text they decode to) and the promise of the OpenAI API its answer is held to. Pure; no I/O.

They hold for any model, random weights included, so they need no baseline: a stop string the
text still holds, a banned id that was generated, a missing choice, JSON that does not parse are
wrong whatever the weights. The findings are documented with the others, at the top of
bench.core.verdicts.
"""

from __future__ import annotations

import json

import jsonschema

from bench.core.config import Prompt
from bench.core.records import RequestRecord, ToolCall
from bench.core.verdicts import BannedToken, ChoiceCount, Finding, PromptRepeated, Reason, SchemaMiss, StopPassed, ToolCallMiss

# logit_bias is added to a logit; OpenAI documents -100 as "effectively bans the token".
BAN = -100.0


def stopped_by_probe(req: RequestRecord, prompt: Prompt | None) -> bool:
    """An answer a stop probe ended: its text may be short, even empty (the first token can hold
    the stop string), and that is what was asked."""
    return prompt is not None and bool(prompt.stop) and req.finish_reason == "stop"


def judge_probes(req: RequestRecord, prompt: Prompt) -> list[Finding]:
    """The answer held to its prompt's contract probes. An answer that failed is judged elsewhere."""
    if req.error_kind is not None:
        return []
    out: list[Finding] = []

    def finding(reason: Reason, evidence) -> None:
        out.append(Finding(reason=reason, evidence=evidence, prompt_id=req.prompt_id))

    text = req.text or ""
    if prompt.stop:
        found = [(text.find(s), s) for s in prompt.stop if s in text]
        if found:
            at, stop = min(found)
            finding(Reason.STOP_IGNORED, StopPassed(stop=stop, position=at, finish_reason=req.finish_reason,
                                                    around=text[max(0, at - 20):at + 20]))
    banned = {t: b for t, b in (prompt.logit_bias or {}).items() if b <= BAN}
    ids = req.token_ids or []
    for token, bias in banned.items():
        if token in ids:
            finding(Reason.BANNED_TOKEN, BannedToken(token=token, position=ids.index(token), count=ids.count(token),
                                                     bias=bias))
    if prompt.decodes_to is not None and text.startswith(prompt.decodes_to):
        finding(Reason.PROMPT_REPEATED, PromptRepeated(prompt_text=prompt.decodes_to, streamed=prompt.stream,
                                                       answer=text[:len(prompt.decodes_to) + 40]))
    if prompt.tools is not None and (problem := _tool_call_problem(req, prompt)) is not None:
        what, call = problem
        finding(Reason.TOOL_CALL_INVALID, ToolCallMiss(
            problem=what, tool_choice=prompt.tool_choice or "auto", name=call.name if call else None,
            arguments=call.arguments[:200] if call else None, finish_reason=req.finish_reason, streamed=prompt.stream))
    if req.choice_tokens is not None and len(req.choice_tokens) != prompt.n:
        finding(Reason.WRONG_CHOICE_COUNT, ChoiceCount(asked=prompt.n, got=len(req.choice_tokens)))
    if prompt.json_schema is not None:
        miss = _schema_miss(text, prompt.json_schema)
        if miss is not None:
            error, parsed = miss
            finding(Reason.SCHEMA_VIOLATED, SchemaMiss(error=error[:300], parsed=parsed,
                                                       finish_reason=req.finish_reason, answer=text[:200],
                                                       field=prompt.schema_field))
    return out


def _tool_call_problem(req: RequestRecord, prompt: Prompt) -> tuple[str, ToolCall | None] | None:
    """What breaks the prompt's tool_choice, and the call it is about; None when nothing does."""
    calls = req.tool_calls or []
    if prompt.tool_choice == "none":
        return ("a tool was called though tool_choice is none", calls[0]) if calls else None
    forced = prompt.forced_tool
    if forced is not None and not calls:
        return "no tool call came back", None
    tools = {t.name: t for t in prompt.tools or []}
    for call in calls:
        if forced not in (None, "*") and call.name != forced:
            return f"the call is to {call.name!r}, not the one named", call
        if call.name not in tools:
            return f"the call is to {call.name!r}, which is not among the tools", call
        try:
            value = json.loads(call.arguments)
        except ValueError as exc:
            return f"the arguments are not JSON ({type(exc).__name__}: {exc})", call
        if tools[call.name].strict:
            error = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(tools[call.name].parameters).iter_errors(value))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "the top"
                return f"the arguments do not validate against the tool's parameters (at {where}: {error.message})", call
    return None


def _schema_miss(text: str, schema: dict) -> tuple[str, bool] | None:
    """(what is wrong, whether the text parsed), or None when it parses and validates."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}", False
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top"
        return f"at {where}: {error.message}", True
    return None
