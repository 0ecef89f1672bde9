"""The matrix file as a whole, and its one parse: every failure a ConfigError naming the key path. Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from bench.core.config.comparison import BaselineRule, CellFilter, Comparison, ReferenceText
from bench.core.config.knobs import Invariance
from bench.core.config.platform import Budget, Detect, Platform
from bench.core.config.served import Image, LoadFormat, Model
from bench.core.config.server import ServerSettings
from bench.core.config.workload import Workload
from bench.core.schema import ConfigError, Name, Strict, unique_names

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
    reference_text: ReferenceText = Field(default=ReferenceText(), description="the reference text each run scores")
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
        unique_names(self.models, "model")
        unique_names(self.load_formats, "load format")
        unique_names(self.images, "image")
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
