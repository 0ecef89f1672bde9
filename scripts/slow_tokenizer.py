"""A slow (pure Python) tokenizer built the way Kimi K2's is (its tokenization_kimi.py,
TikTokenTokenizer): a `PreTrainedTokenizer` subclass that a checkpoint ships as remote code
(`auto_map`), over a tiktoken BPE read from `tiktoken.model`, its token strings byte-level
(GPT-2's bytes_to_unicode), with its added tokens as tiktoken's special tokens. Kimi's
`<think>` and `</think>` are added tokens that are not special (ids 163606 and 163607,
`special: false` in its tokenizer_config.json; vllm#33457), and so are ours.
scripts/make_slow_tokenizer_model.py writes the BPE and copies this file beside a checkpoint as
tokenization_regbench.py; vLLM loads it with --trust-remote-code. Like Kimi's:
- `decode` without options is tiktoken's own, which writes an added token as it is;
- the vocabulary file's name says tiktoken, which is how xgrammar (vLLM's structured outputs)
  knows how to read the vocabulary.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

# GPT-2's pre-tokenizer, the one the source BPE was trained behind (tokenizers' ByteLevel).
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class RegbenchSlowTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, added_tokens_decoder: dict | None = None, **kwargs: Any) -> None:
        self.vocab_file = vocab_file
        added = {int(i): str(getattr(t, "content", t)) for i, t in (added_tokens_decoder or {}).items()}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=PATTERN,
                                       mergeable_ranks=load_tiktoken_bpe(vocab_file),
                                       special_tokens={content: i for i, content in added.items()})
        to_char = bytes_to_unicode()
        self.byte_of = {c: b for b, c in to_char.items()}
        self.token_of = {i: "".join(to_char[b] for b in self.model.decode_single_token_bytes(i))
                         for i in range(self.model.n_vocab) if i not in added}
        self.token_of.update(added)
        self.id_of = {t: i for i, t in self.token_of.items()}
        super().__init__(added_tokens_decoder=added_tokens_decoder, **kwargs)

    def encode(self, text: str, **kwargs: Any) -> list[int]:  # type: ignore[override]
        if kwargs:  # transformers' own handles options (special tokens, truncation, ...)
            return super().encode(text, **kwargs)
        return self.model.encode(text, allowed_special="all")

    def decode(self, token_ids: int | list[int], **kwargs: Any) -> str:  # type: ignore[override]
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.id_of)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self.token_of[i] for i in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token: str) -> int:
        return self.id_of.get(token, self.unk_token_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.token_of.get(index, "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(self.byte_of[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(path) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, path)
        return (path,)
