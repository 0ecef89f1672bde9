"""Text decoded: an answer's text is what the server's own tokenizer decodes its token ids to, in
the prompt's context (`decode_mismatch`). vLLM makes the text incrementally, and for a tokenizer
that is not a `tokenizers` one (a slow, Python tokenizer: Kimi K2's tiktoken one, any
`--tokenizer-mode slow`) it joins the text around every added token with a space, special or not
(`spaces_between_special_tokens`, on by default): `<think>ok</think>1` comes out as
` <think> ok </think> 1`, which the tokenizer itself never writes (vllm#33457, still in 0.32.0).

The client asks the server's /detokenize for the prompt's ids and for the prompt's ids followed by
the answer's (the ids vLLM returns with `return_token_ids`): the text the prompt's ids leave is what
the answer's ids decode to there, each word's leading space as the model wrote it
(RequestRecord.decoded). What a healthy answer may still tell otherwise is let pass:

- a special token (`<s>`, `<|im_end|>`, `[INST]`): the text leaves them out (skip_special_tokens),
  the decode writes them; each may be there or not;
- text after a stop string: the text ends where the stop string begins (or after it, with
  `include_stop_str_in_output`), the ids go on to the token that completed it;
- bytes that are no whole character: each run of U+FFFD stands for any run of them (the decode and
  an incremental detokenizer may count them otherwise), and the decode's trailing ones may be held
  back;
- transformers' clean-up of spaces before punctuation (`clean_up_tokenization_spaces`), which a
  tokenizer's decode may apply and an incremental detokenizer does not: applied to both.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import Field

from bench.core.evidence import DecodeMismatch
from bench.core.probes.base import ContractProbe, register
from bench.core.probes.chunks import SPECIAL
from bench.core.schema import Strict
from bench.core.verdicts import Reason

if TYPE_CHECKING:
    from bench.core.config import Prompt, RequestShape
    from bench.core.records import RequestRecord


class TextDecodedFields(Strict):
    text_decoded: bool = Field(
        default=False, description="the answer's text must be what the server's own tokenizer decodes its token "
                                   "ids to, after the prompt's (`decode_mismatch`, vllm#33457); the client asks the "
                                   "server's /detokenize")


# transformers' PreTrainedTokenizerBase.clean_up_tokenization, in its order.
_CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]
_BAD_BYTES = re.compile("\ufffd+")
_CONTEXT = 20  # characters of both texts shown before where they part


def _normal(text: str) -> str:
    for a, b in _CLEAN_UP:
        text = text.replace(a, b)
    return _BAD_BYTES.sub("\ufffd", text)


@register
class TextDecoded(ContractProbe):
    name = "text_decoded"
    fields = TextDecodedFields
    content = frozenset[str]()  # asks nothing of the server: twins with or without it
    reason = Reason.DECODE_MISMATCH
    evidence = DecodeMismatch
    signature = "text-differs-from-decode"
    description = ("the answer's text is not what the server's own tokenizer decodes its token ids to after the "
                   "prompt's (/detokenize): vllm#33457, spaces written around added tokens by vLLM's slow-tokenizer "
                   "detokenizer. Judged on prompts that ask `text_decoded`, every choice, whole and streamed; special "
                   "tokens, text past a stop string, bytes that are no whole character and clean-up spaces before "
                   "punctuation are let pass; the evidence has where the two part and both texts from there")
    optional_feature = False  # nothing is asked of the server beyond the answer

    def asked(self, prompt: Prompt) -> bool:
        return prompt.text_decoded

    def problem(self, prompt: Prompt) -> str | None:
        if prompt.text_decoded and prompt.tools is not None:
            return (f"prompt {prompt.id}: `text_decoded` holds the text to its ids, and a tool call's ids are told "
                    "as calls, not text: ask it of a prompt without `tools`")
        return None

    def check(self, req: RequestRecord, prompt: Prompt, shape: RequestShape) -> list[DecodeMismatch]:
        if not prompt.text_decoded or req.decoded is None or req.text is None or req.text == req.decoded:
            return []
        if req.token_texts is None:
            return []  # the ids' own texts were not told: whether a special token explains it is unknown
        specials = {req.token_texts[i] for i in req.token_ids or [] if SPECIAL.search(req.token_texts.get(i, ""))}
        stopped = req.finish_reason == "stop" and isinstance(req.stop_reason, str)
        if decodes_as(req.text, req.decoded, specials, stopped):
            return []
        at = next((k for k, (a, b) in enumerate(zip(req.text, req.decoded, strict=False)) if a != b),
                  min(len(req.text), len(req.decoded)))
        start = max(0, at - _CONTEXT)
        return [DecodeMismatch(at=at, answer=req.text[start:start + 60], decoded=req.decoded[start:start + 60])]


def decodes_as(text: str, decoded: str, specials: set[str], stopped: bool) -> bool:
    """Whether `text` is `decoded` with some of its special tokens left out, each run of U+FFFD in
    it standing for any run (or, at its end, none); with `stopped`, any beginning of that. Both
    as transformers' clean-up leaves them."""
    text, decoded = _normal(text), _normal(decoded)
    pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    parts = [p for p in re.split(f"({pattern}|\ufffd)" if pattern else "(\ufffd)", decoded) if p]
    at = {0}  # where in the text each way of reading the decode so far has got to
    for part in parts:
        optional = part in specials or part == "\ufffd"
        after = set(at) if optional else set()
        for k in at:
            if text.startswith(part, k):
                after.add(k + len(part))
            elif stopped and part.startswith(text[k:]):
                after.add(len(text))  # the text ends inside this part: cut at a stop string
        at = after
        if not at:
            return False
    return len(text) in at
