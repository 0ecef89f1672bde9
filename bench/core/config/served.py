"""What a cell serves: the model, its load format and the image (or local environment) that runs it. Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from bench.core.schema import Name, ServerArgs, Strict, check_env


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

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))

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

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
