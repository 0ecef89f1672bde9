"""How cells are compared: which cells, against which baseline, by which rule, and the reference text. Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from bench.core.schema import Name, Strict
from bench.core.tokens import Comparator, comparator_for


class CellFilter(Strict):
    """Matches cells whose axes equal every given value; unset axes match anything."""

    model: Name | None = Field(default=None, description="a model's name")
    load_format: Name | None = Field(default=None, description="a load format's name")
    platform: Name | None = Field(default=None, description="a platform's name")
    image: Name | None = Field(default=None, description="an image's name")

    @model_validator(mode="after")
    def _not_empty(self) -> CellFilter:
        if not any((self.model, self.load_format, self.platform, self.image)):
            raise ValueError("a filter must name at least one axis")
        return self


class BaselineRule(Strict):
    """Which cell each cell is compared with token by token: the cell with these axes set to these
    values and its other axes its own. `baseline: safetensors` is short for
    `{load_format: safetensors}`; `{image: vllm-0.32.0}` compares every image with that one (a
    release against the previous), `{model: m-bf16}` a checkpoint variant with another. The cells
    the rule maps onto themselves are the baselines."""

    model: Name | None = Field(default=None, description="the baseline's model (default: each cell's own)")
    load_format: Name | None = Field(default=None, description="the baseline's load format (default: each cell's own)")
    platform: Name | None = Field(default=None, description="the baseline's platform (default: each cell's own)")
    image: Name | None = Field(default=None, description="the baseline's image (default: each cell's own)")

    @model_validator(mode="after")
    def _not_empty(self) -> BaselineRule:
        if not self.axes():
            raise ValueError("a baseline must name at least one axis")
        return self

    def axes(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Comparison(Strict):
    """How outputs are compared for divergence and nondeterminism (bench.core.tokens).

    The default, `logprobs` with k = 5, is what a GPU user wants: bf16 kernels, batching and
    another release legitimately change a token here and there (vLLM promises no bit-identical
    outputs), and its own model tests accept a difference when each side's token is in the
    other's top 5. `exact` is right only where the numerics are bit-reproducible (float32 on
    CPU). Both catch a server that lost its weights."""

    mode: Literal["exact", "logprobs"] = Field(
        default="logprobs",
        description="`logprobs`: at the first differing token each side's token must be in the other's top k "
                    "(vLLM's `check_logprobs_close`); `exact`: token ids equal")
    top_k: int = Field(
        default=5, ge=1, le=20,
        description="k of the `logprobs` rule")  # vLLM serves at most 20 logprobs by default
    logprob_tolerance: float = Field(
        default=0.05, ge=0.0, le=10.0,
        description="nats two answers' logprobs of the same token may differ by where a rule compares values "
                    "(`logprobs_vary_with_k`); batches of other sizes move bf16 values a little")

    @property
    def comparator(self) -> Comparator:
        """The rule as a comparator: the one place one is made (a cell's is Cell.comparator)."""
        return comparator_for(self.mode, self.top_k)


# Written here for regbench: plain English prose, so that any model trained on English text
# finds it likely. Not from any dataset.
DEFAULT_PASSAGE = (
    "The town library opens at nine in the morning and closes at six in the evening. "
    "On weekdays, children come after school to read books and do their homework, while older "
    "visitors sit by the windows with newspapers. Every Saturday, a volunteer reads stories aloud "
    "to the youngest readers, and the room is full of laughter. The librarian knows most visitors "
    "by name and is always happy to help them find what they are looking for."
)


class ReferenceText(Strict):
    """The reference text: after the workload, each run scores a fixed passage (its prompt
    logprobs) as mean negative log-likelihood per token, in nats. A trained model scores a few
    nats on plain English (SmolLM2-135M: 3.1); one without its weights scores near ln(vocab)
    (10.8 for a 49,152-token vocabulary) or not a number at all. No baseline needed for the
    ceiling; against the baseline cell's score the tolerance catches smaller losses."""

    enabled: bool = Field(default=True, description="score the passage after each run's workload; turn it off "
                                                     "for a random test model (it scores near ln(vocab) anyway)")
    passage: str = Field(default=DEFAULT_PASSAGE, min_length=20,
                         description="the text scored (default: a built-in paragraph of plain English)")
    # Far above any trained model on plain English, far below a model without weights. A random
    # test model (like the tiny canary) scores near ln(vocab) with or without its weights: turn
    # the reference text off for it.
    max_mean_nll: float | None = Field(
        default=6.0, gt=0,
        description="ceiling on the mean negative log-likelihood, nats per token, no baseline needed; "
                    "`null`: no ceiling")
    # Healthy numerics (bf16 vs float32, batching, releases) moved it by < 0.01 here.
    tolerance: float = Field(default=0.5, ge=0,
                             description="how far above the baseline cell's score a run may be, nats per token")
