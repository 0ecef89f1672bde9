"""Contract probes: what a prompt's request asks beyond plain generation (`stop`, `logit_bias`,
`n`, `json_schema`, `tools`, a seed, token ids with the text they decode to, another number of
logprobs) and the promise of the OpenAI API its answer is held to. Pure; no I/O.

They hold for any model, random weights included, so they need no baseline: a stop string the
text still holds, a banned id that was generated, a missing choice, JSON that does not parse are
wrong whatever the weights. One module per probe, each registering itself (bench.core.probes.base
says what a probe declares); the order below is the order of their findings on one answer.
"""

from bench.core.probes.base import PROBES, ContractProbe, register

# Registered as imported: this order is their findings' on one answer, and the first probe that
# judges two twins judges them (another number of logprobs before a seed).
# isort: off
from bench.core.probes import stop
from bench.core.probes import logit_bias
from bench.core.probes import allowed_token_ids
from bench.core.probes import bad_words
from bench.core.probes import prompt_repeated
from bench.core.probes import tools
from bench.core.probes import choices
from bench.core.probes import schema
from bench.core.probes import top_logprobs
from bench.core.probes import sampling
from bench.core.probes import sampling_honoured
from bench.core.probes import finish_reason
from bench.core.probes import stop_token_ids
from bench.core.probes import chunks
from bench.core.probes import decoded
# isort: on

__all__ = [
           "PROBES",
           "ContractProbe",
           "allowed_token_ids",
           "bad_words",
           "choices",
           "chunks",
           "decoded",
           "finish_reason",
           "logit_bias",
           "prompt_repeated",
           "register",
           "sampling",
           "sampling_honoured",
           "schema",
           "stop",
           "stop_token_ids",
           "tools",
           "top_logprobs",
]
