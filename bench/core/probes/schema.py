"""Structured output: an answer to a `json_schema` parses as JSON and validates against it
(`schema_violated`), in whichever request field the prompt sends it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from bench.core.evidence import SchemaMiss
from bench.core.probes.base import ContractProbe, register
from bench.core.probes.validate import schema_miss
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class SchemaFields(Strict):
    json_schema: dict | None = Field(
        default=None, description="structured output: sent as `response_format` json_schema; the text must parse "
                                  "as JSON and validate against it (`schema_violated`). Ask for `ignore_eos: false` "
                                  "and `min_tokens: 0` so that the answer can end where the JSON does")
    schema_field: Literal["response_format", "structured_outputs", "guided_json"] = Field(
        default="response_format",
        description="the request field `json_schema` is sent in: OpenAI's `response_format` (json_schema), vLLM's "
                    "own `structured_outputs` (`{json: ...}`) or its legacy `guided_json`, which clients written for "
                    "older releases still send (vllm#53975: ignored with HTTP 200)")


@register
class Schema(ContractProbe):
    name = "json_schema"
    fields = SchemaFields
    reason = Reason.SCHEMA_VIOLATED
    evidence = SchemaMiss
    signature = "structured-output-not-enforced"
    reweights = True
    description = ("a structured-output answer (`json_schema`, sent in the prompt's `schema_field`) does not parse "
                   "as JSON or does not validate against the schema; the evidence has the field, the error, the "
                   "finish_reason and the text's start. An answer cut at max_tokens counts: size a probe's schema so "
                   "that a healthy server ends it well within")

    def asked(self, prompt: Prompt) -> bool:
        return prompt.json_schema is not None

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.schema_field != "response_format" and prompt.json_schema is None:
            return "`schema_field` names where `json_schema` is sent: give both"
        if prompt.json_schema is not None:
            import jsonschema  # only a matrix that has the probe pays for the import

            try:
                jsonschema.Draft202012Validator.check_schema(prompt.json_schema)
            except jsonschema.SchemaError as exc:
                return f"`json_schema` is not a JSON schema: {exc.message}"
        return None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.json_schema is None:
            return
        if prompt.schema_field == "structured_outputs":
            body["structured_outputs"] = {"json": prompt.json_schema}
        elif prompt.schema_field == "guided_json":
            body["guided_json"] = prompt.json_schema
        else:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": prompt.id.replace(".", "_"), "schema": prompt.json_schema}}

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[SchemaMiss]:
        if prompt.json_schema is None:
            return []
        text = req.text or ""
        miss = schema_miss(text, prompt.json_schema)
        if miss is None:
            return []
        error, parsed = miss
        return [SchemaMiss(error=error[:300], parsed=parsed, finish_reason=req.finish_reason, answer=text[:200],
                           field=prompt.schema_field)]
