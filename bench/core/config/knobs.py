"""Invariance knobs: settings that must not change a greedy server's answers, the built-in ones, and their blocks. Pure."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from bench.core.config.comparison import CellFilter, Comparison
from bench.core.config.platform import CpuFlags, Platform
from bench.core.schema import ConfigError, Name, ServerArgs, Strict, check_env, unique_names


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

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))

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
        min_length=1, description=f"a built-in knob's name ({', '.join(f'`{k}`' for k in BUILTIN_KNOBS)}) or a knob "
                                  "of your own (`{name, server_args, env, concurrency, stream}`)")
    cells: list[CellFilter] = Field(
        default=[], description="the cells the knobs are applied to; default: the baseline cells (every cell "
                                "without a baseline rule)")
    comparison: Comparison | None = Field(
        default=None, description="how a knob's cell is compared with its original; default: the matrix's "
                                  "`comparison` (itself tolerant by default: `logprobs`, k = 5); the originals are "
                                  "asked for the logprobs it needs")

    @model_validator(mode="after")
    def _unique(self) -> Invariance:
        unique_names(self.knobs, "knob")
        return self
