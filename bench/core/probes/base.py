"""What a contract probe is, and the registry each one joins when its module is imported. Pure.

A contract probe is one promise of the OpenAI API that a prompt can ask its answer to keep,
whatever the model, random weights included: a stop string the text never holds, a banned id
never generated, n choices, JSON that validates. One module per probe declares all of it:

- the prompt fields it owns (`fields`, a model the matrix's Prompt inherits) and which of them
  make two requests twins (`content`);
- the `Reason` it finds, the evidence model that finding carries, the taxonomy's description of
  it, and the known-issue signature that names its cause;
- what it adds to the request body, how it changes the token limits sent, which of the judge's
  general rules its answer is exempt from (a stop may end a text at once), what it adds to
  what an answer told its client;
- its check: of one answer (`check`), or of two twins it judges instead of the comparator
  (`judges_twins` and `check_twins`).

The judge, the request builder, the schema's checks and the twins' content go over the registry
(bench.core.probes.PROBES); tests/test_probe_registry.py holds every probe to this shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel

from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape, Workload
    from bench.core.records import RequestRecord
    from bench.core.tokens import Comparator


class ContractProbe:
    """One contract probe; a subclass registers itself with @register."""

    # How the probe is named where a request that asked for it failed (RequestFailed.probe): the
    # prompt field that asks for it.
    name: ClassVar[str]
    fields: ClassVar[type[BaseModel]]  # the prompt fields it owns, with their descriptions
    # Those of its fields that make two requests twins (the same question); None: all of them.
    content: ClassVar[frozenset[str] | None] = None
    reason: ClassVar[Reason]
    evidence: ClassVar[type[BaseModel]]
    signature: ClassVar[str]  # bench/signatures/<signature>.yaml, which requires `reason`
    description: ClassVar[str]  # the taxonomy's entry for `reason` (docs/judged.md)
    # A server may lack the feature and say so with HTTP 400: set aside where the baseline
    # refuses it too (bench.core.judge.baseline.set_aside_unconfirmed).
    optional_feature: ClassVar[bool] = True
    # Its request reshapes the distribution tokens are sampled from beyond the temperature (a
    # bias, a grammar): a chance bounded from the raw logprobs does not hold for it.
    reweights: ClassVar[bool] = False

    def content_fields(self) -> frozenset[str]:
        return frozenset(self.fields.model_fields) if self.content is None else self.content

    def asked(self, prompt: Prompt) -> bool:
        """Whether the prompt asks for this probe."""
        raise NotImplementedError

    def problem(self, prompt: Prompt) -> str | None:
        """Why the prompt cannot ask for it so (refused when the matrix loads); None: it can."""
        return None

    def workload_problem(self, prompt: Prompt, workload: Workload) -> str | None:
        """The same, against the workload the prompt is sent in."""
        return None

    def shape(self, prompt: Prompt, shape: RequestShape) -> RequestShape:
        """The token limits the prompt's request is sent with, as this probe needs them."""
        return shape

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        """What it adds to the request's JSON body (bench.core.request)."""

    def exempts(self, req: RequestRecord, prompt: Prompt | None) -> frozenset[Reason]:
        """The judge's general rules that this answer is exempt from, since the probe explains it."""
        return frozenset()

    def told(self, req: RequestRecord) -> str:
        """What it adds to what an answer told its client, beyond its text (twins compare it)."""
        return ""

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> Sequence[BaseModel]:
        """The evidence that an answer broke the promise, once per breach; none when it kept it.
        `shape`: the token limits its request was sent with."""
        return []

    def judges_twins(self, prompt: Prompt, other: Prompt) -> bool:
        """Whether this probe, not the cell's comparator, judges two twins."""
        return False

    def check_twins(self, req: RequestRecord, ref: RequestRecord, prompt: Prompt, other: Prompt,
                    comparator: Comparator, tolerance: float) -> BaseModel | None:
        """The evidence that twins it judges broke the promise (`req` the later of them)."""
        return None


# In registration order, which is the order of their findings on one answer.
PROBES: list[ContractProbe] = []


P = TypeVar("P", bound=type[ContractProbe])


def register(cls: P) -> P:
    if any(p.name == cls.name or p.reason == cls.reason for p in PROBES):
        raise ValueError(f"contract probe {cls.name!r} ({cls.reason}) is registered twice")
    PROBES.append(cls())
    return cls
