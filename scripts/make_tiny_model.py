"""Writes a tiny random Llama checkpoint with a locally trained tokenizer. Nothing is downloaded.

Run it with the Python of the vLLM environment (it needs torch, transformers, tokenizers,
safetensors):  .venv-vllm/bin/python scripts/make_tiny_model.py OUT [--canary]

--canary re-shards the weights into 10 files of which 4 hold no tensor (a legal 40-byte
safetensors file), placed so that the first file in directory-listing order *and* the first
in sorted order are empty. That is the layout on which runai-model-streamer 0.14.0-0.16.0
silently stops streaming (its #157): vLLM's runai_streamer loader lists shards with an
unsorted glob, so listing order is what decides. The index names only the data shards, which
is why vLLM's default loader is unaffected.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from pathlib import Path

from reshard import reshard  # scripts/, beside this file

SHARDS = 10
EMPTY = 4
VOCAB = 2048
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    # Python's own standard library: local, plentiful, and code-like like the prompts.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = ["argparse.py", "json/decoder.py", "json/encoder.py", "pathlib.py", "textwrap.py",
             "string.py", "shlex.py", "csv.py", "difflib.py", "heapq.py"]
    return [(stdlib / n).read_text(encoding="utf-8") for n in names if (stdlib / n).exists()]


def train_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # CPU attention accepts only some head dims; 32 is one
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, max_shard_size="300KB", safe_serialization=True)


def reshard_canary(out: Path) -> None:
    """Rewrites the weights as 10 shards with 4 empty ones, the first listed one empty (and the
    first in sorted order, so that every order a loader may use starts with an empty shard)."""
    def choose(listed: list[str], names: list[str]) -> list[str]:
        empty = list(dict.fromkeys([listed[0], names[0]]))
        empty += [n for n in listed[1:] if n not in empty][: EMPTY - len(empty)]
        return empty

    reshard(out, SHARDS, choose)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--canary", action="store_true", help="empty shards first in listing order")
    args = parser.parse_args(argv)
    out: Path = args.out
    stamp = out / ("regbench-canary.json" if args.canary else "config.json")
    if stamp.exists():
        print(f"{out}: exists, kept")
        return 0
    tmp = out.with_name(out.name + ".partial")
    for leftover in (tmp, out):  # an interrupted earlier attempt
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    tokenizer = train_tokenizer(tmp)
    make_model(tmp, tokenizer)
    tmp.rename(out)  # the listing order is a property of the final directory: reshard there
    if args.canary:
        reshard_canary(out)
    print(f"{out}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
