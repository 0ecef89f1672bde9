"""JSON Schema as the structured-output and tool-call probes hold an answer to it. Pure."""

from __future__ import annotations

import json


def schema_miss(text: str, schema: dict) -> tuple[str, bool] | None:
    """(what is wrong, whether the text parsed), or None when it parses and validates."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}", False
    error = invalid(value, schema)
    return None if error is None else (error, True)


def invalid(value: object, schema: dict) -> str | None:
    """Where and why a JSON value does not validate against a schema; None when it does."""
    import jsonschema  # only a matrix that has a schema or a tool pays for the import

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top"
    return f"at {where}: {error.message}"
