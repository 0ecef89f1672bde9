"""The key reference of docs/matrix.md, made from the config models (bench/core/config/): every
field of the matrix file and of a platform profile, its type, default and `Field(description=...)`.
Never edited by hand: change a description in the models, then --write.

  .venv/bin/python scripts/matrix_reference.py           print the reference
  .venv/bin/python scripts/matrix_reference.py --write   put it into docs/matrix.md between the markers
  .venv/bin/python scripts/matrix_reference.py --check   exit 1 if docs/matrix.md differs from the
                                                         models, or a field has no description
                                                         (scripts/lint.sh, tests/test_matrix_reference.py)
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core import config, schema  # noqa: E402

PAGE = ROOT / "docs" / "matrix.md"
SECTION = "matrix-reference"  # the page's markers
# The files a user writes, each the root of its own tables; a root met inside another is not expanded there.
ROOTS: list[tuple[type[BaseModel], str, str]] = [
    (config.Config, "The matrix file", ""),
    (config.Platform, "A platform profile",
     "What a host looks like and how to run on it: a file `platforms/NAME.yaml` beside the matrix, or one "
     "shipped in `bench/profiles/`."),
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _constraints(metadata: list) -> list[str]:
    said = []
    for m in metadata:
        if isinstance(m, FieldInfo):  # Annotated[str, Field(pattern=...)] inside a list
            said += _constraints(m.metadata)
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                said.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, annotated_types.MinLen):
            said.append(f"length ≥ {m.min_length}")
        if isinstance(m, annotated_types.MaxLen):
            said.append(f"length ≤ {m.max_length}")
        if getattr(m, "pattern", None):
            said.append(f"matching `{m.pattern}`")
    return said


def _is_name(metadata: tuple | list) -> bool:
    return any(isinstance(m, AfterValidator) and m.func is schema._check_name for m in metadata)


def kind(tp: object, metadata: tuple | list = ()) -> str:
    """A type as a reader of YAML sees it."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        said = _constraints(list(meta))
        text = kind(base, meta)
        return f"{text} ({', '.join(said)})" if said else text
    if _is_name(metadata):
        return "name"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [kind(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or `null`" if type(None) in args else "")
    if origin is list:
        return f"list of {kind(args[0])}"
    if origin is dict:
        return f"map of {kind(args[0])} to {kind(args[1])}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, str(tp))  # type: ignore[call-overload]


def default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, str) and len(value) > 40:
        return f"built-in ({len(value)} characters)"
    if value is None:
        return "`null`"
    if value == "":
        return '`""`'
    if isinstance(value, (bool, list, dict)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def nested(tp: object) -> tuple[type[BaseModel], str] | None:
    """The model a field holds, and the suffix of its key path (`[]` inside a list)."""
    if typing.get_origin(tp) is typing.Annotated:
        return nested(typing.get_args(tp)[0])
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp, ""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        inner = nested(args[0])
        return (inner[0], "[]" + inner[1]) if inner else None
    if origin in (typing.Union, types.UnionType):
        found = [n for a in args if (n := nested(a))]
        return found[0] if found else None
    return None


def walk(root: type[BaseModel]) -> list[tuple[type[BaseModel], list[str]]]:
    """Every model under `root`, in the order a reader meets them, with the key paths that hold it."""
    found: dict[type[BaseModel], list[str]] = {root: [""]}
    order = [root]

    def visit(model: type[BaseModel], path: str) -> None:
        for name, field in model.model_fields.items():
            inner = nested(field.annotation)
            if inner is None or inner[0] in {r for r, _, _ in ROOTS}:
                continue
            sub = f"{path}{'.' if path else ''}{name}{inner[1]}"
            if inner[0] not in found:
                found[inner[0]] = []
                order.append(inner[0])
            if sub not in found[inner[0]]:
                found[inner[0]].append(sub)
                visit(inner[0], sub)

    visit(root, "")
    return [(m, found[m]) for m in order]


def doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(own).split()) if own else ""


def missing_descriptions() -> list[str]:
    out = []
    for root, _, _ in ROOTS:
        for model, _ in walk(root):
            out += [f"{model.__name__}.{n}" for n, f in model.model_fields.items() if not f.description]
    return sorted(set(out))


def reference() -> str:
    parts = []
    for root, title, where in ROOTS:
        parts.append(f"### {title}")
        if where:
            parts.append(where)
        for model, paths in walk(root):
            if model is not root:
                parts.append(f"#### {', '.join(f'`{p}`' for p in paths)}")
            if doc(model) and not (model is root and where):  # a root's `where` says it for the reader
                parts.append(doc(model))
            rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
            for name, field in model.model_fields.items():
                inner = nested(field.annotation)
                key = name + (inner[1] if inner else "")
                what = field.description or ""
                if inner and model is root and inner[0] is not root and inner[0] in {r for r, _, _ in ROOTS}:
                    what += f" (see *{next(t for r, t, _ in ROOTS if r is inner[0])}*)"
                elif inner:
                    sub = f"{paths[0]}{'.' if paths[0] else ''}{key}"
                    what += f" (see `{sub}` below)"
                rows.append(f"| `{key}` | {_cell(kind(field.annotation, field.metadata))}"
                            f"{_cell(' (' + ', '.join(c) + ')') if (c := _constraints(field.metadata)) else ''} "
                            f"| {_cell(default(field))} | {_cell(what)} |")
            parts.append("\n".join(rows))
    return "\n\n".join(parts)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_table

    args = readme_table.arguments(__doc__.splitlines()[0], PAGE)
    bad = [f"{name}: no Field(description=...)" for name in missing_descriptions()]
    return readme_table.generated(args, SECTION, reference(), "the models", "scripts/matrix_reference.py",
                                  "matrix reference", "docs/matrix.md matches the config models", bad)


if __name__ == "__main__":
    sys.exit(main())
