"""Seeds: two requests of one run sampled alike with the same seed get the same tokens
(`seed_not_reproducible`, vllm#21310)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from bench.core.evidence import TwinsDiffer
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.tokens import EXACT
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt
    from bench.core.records import RequestRecord
    from bench.core.tokens import Comparator


class Sampling(Strict):
    """A prompt sampled rather than greedy, with a seed. vLLM promises that a request with a seed
    is reproducible, so two such requests of one run (twins: the same content and the same
    sampling) must get the same tokens, whatever the model (random weights included)."""

    temperature: float = Field(gt=0.0, le=2.0, description="the sampling temperature (above 0)")
    seed: int = Field(ge=0, lt=2**63, description="the request's `seed`")


class SamplingFields(Strict):
    sampling: Sampling | None = Field(
        default=None, description="sample this prompt at `temperature` with `seed` instead of the workload's; "
                                  "write it twice (twins) to check that a seed reproduces (`seed_not_reproducible`); "
                                  "its answer is held to being sampled (`sampling_ignored`, from its `min_tokens` on)")


@register
class Seeded(ContractProbe):
    name = "sampling"
    fields = SamplingFields
    reason = Reason.SEED_NOT_REPRODUCIBLE
    evidence = TwinsDiffer
    signature = "seed-not-reproducible"
    description = ("two requests of one run with the same content, sampled at the same temperature with the same "
                   "seed (a prompt's `sampling`), got different token ids: vLLM promises that a seeded request is "
                   "reproducible (vllm#21310). Compared token by token whatever the cell's comparator (a sampled "
                   "token is often in the other side's top k); the evidence is the twins', with the seed and "
                   "temperature")
    optional_feature = False  # every server samples

    def asked(self, prompt: Prompt) -> bool:
        return prompt.sampling is not None

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.sampling is not None:
            body.update(temperature=prompt.sampling.temperature, seed=prompt.sampling.seed)

    def judges_twins(self, prompt: Prompt, other: Prompt) -> bool:
        return prompt.sampling is not None

    def check_twins(self, req: RequestRecord, ref: RequestRecord, prompt: Prompt, other: Prompt,
                    comparator: Comparator, tolerance: float) -> TwinsDiffer | None:
        # A seed reproduces the very tokens: a sampled token is often in the other's top k, so
        # no comparator's tolerance applies.
        mine, theirs = req.output, ref.output
        if mine is None or theirs is None or prompt.sampling is None:
            return None
        pos = EXACT.first_difference(mine, theirs)
        if pos is None:
            return None
        return TwinsDiffer(
            other_prompt_id=ref.prompt_id, position=pos, token=mine.ids[pos] if pos < len(mine.ids) else None,
            other_token=theirs.ids[pos] if pos < len(theirs.ids) else None, streamed=req.stream,
            other_streamed=ref.stream, seed=prompt.sampling.seed, temperature=prompt.sampling.temperature)
