"""The matrix schema's building blocks, shared by the config models and the contract probes
(bench.core.probes), which declare their own prompt fields: strict models, names, `vllm serve`
arguments and environment variables as a matrix may write them. Pure."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)

from bench.core.errors import RegbenchError

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


def check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"not an environment variable name: {key!r}")
    return env


def unique_names(items: list, what: str) -> None:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate {what} names: {dupes}")
