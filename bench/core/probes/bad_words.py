"""Bad words: no choice holds a word the request banned, as the server's own tokenizer spells it
(`bad_word_generated`; n > 1 choices losing it, vllm#17975's family and PR #29313).

vLLM bans each of `bad_words` as token id sequences: the word's own tokens, and those of the word
with a leading space where they are as many and start otherwise (SamplingParams.
update_from_tokenizer); it masks a sequence's last token wherever the tokens before it were just
generated. The text alone cannot tell (a word can be spelt by other tokens), so the client asks
the server's tokenizer (`/tokenize`) for the sequences once per run and records them with each
answer; an answer without them is not judged."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from bench.core.evidence import BadWordGenerated
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class BadWordsFields(Strict):
    bad_words: list[str] | None = Field(
        default=None, min_length=1, max_length=16,
        description="vLLM's `bad_words`: no choice may hold one, as the server's tokenizer spells it "
                    "(`bad_word_generated`; the client asks `/tokenize`)")


def banned_sequences(word_ids: list[int], spaced_ids: list[int]) -> list[list[int]]:
    """The id sequences vLLM bans for a word, from the server tokenizer's ids for the word (its
    leading spaces stripped) and for it after one space, both without special tokens."""
    if not word_ids:
        return []
    if spaced_ids and spaced_ids[0] != word_ids[0] and len(spaced_ids) == len(word_ids):
        return [word_ids, spaced_ids]
    return [word_ids]


@register
class BadWords(ContractProbe):
    name = "bad_words"
    fields = BadWordsFields
    reason = Reason.BAD_WORD_GENERATED
    evidence = BadWordGenerated
    signature = "bad-words-ignored"
    reweights = True
    description = ("an answer holds one of the prompt's `bad_words` as the token ids the server's own tokenizer "
                   "gives it (its `/tokenize`, by vLLM's rule: the word, and the word after a space): vLLM masks "
                   "such a sequence's last token. Judged for every choice (n > 1 children losing the request's "
                   "parameters: vllm#17975's family); the text alone is not judged, since a word can be spelt by "
                   "other tokens. The evidence has the word, its ids and where they came")

    def asked(self, prompt: Prompt) -> bool:
        return bool(prompt.bad_words)

    def add_to_body(self, prompt: Prompt, body: dict[str, Any]) -> None:
        if prompt.bad_words:
            body["bad_words"] = list(prompt.bad_words)

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[BadWordGenerated]:
        ids = req.token_ids or []
        found = []
        for word, sequences in (req.bad_words_ids or {}).items():
            at = [(i, seq) for seq in sequences for i in range(len(ids) - len(seq) + 1) if ids[i:i + len(seq)] == seq]
            if at:
                position, seq = min(at)
                found.append(BadWordGenerated(word=word, token_ids=seq, position=position))
        return found
