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
from bench.core.records import RequestRecord
from bench.core.verdicts import BannedToken, ChoiceCount, Finding, PromptRepeated, Reason, SchemaMiss, StopPassed

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
