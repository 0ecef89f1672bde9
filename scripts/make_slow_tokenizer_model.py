"""Writes a copy of a checkpoint whose tokenizer is a slow one with added tokens that are not
special, as Kimi K2's is (scripts/slow_tokenizer.py): the tokenizer vLLM detokenizes on its slow
path, where vllm#33457 joins the text around added tokens with spaces. The weights are hard links
to the source's; the BPE keeps its vocabulary but its last two merges, whose ids become `<think>`
and `</think>` (the embedding's size is unchanged). Nothing is downloaded.

Run it with the Python of the vLLM environment:
  .venv-vllm/bin/python scripts/make_slow_tokenizer_model.py SRC OUT
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
from pathlib import Path

ADDED = ["<think>", "</think>"]  # Kimi K2's reasoning markers: added, not special
MODULE = "tokenization_regbench"
CLASS = "RegbenchSlowTokenizer"


def tiktoken_ranks(tokenizer_json: dict, added: int) -> tuple[str, list[int]]:
    """The BPE as a tiktoken.model file (each token's bytes in base64, then its rank, which is its
    id), less its last `added` merges, whose ids are given back for the added tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    specials = {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    vocab = {i: t for t, i in tokenizer_json["model"]["vocab"].items() if i not in specials}
    freed = sorted(vocab)[-added:]
    lines = [f"{base64.b64encode(bytes(byte_of[c] for c in vocab[i])).decode()} {i}"
             for i in sorted(vocab) if i not in freed]
    return "\n".join(lines) + "\n", freed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    src, out = args.src, args.out
    stamp = out / f"{MODULE}.py"
    if stamp.exists():
        print(f"{out}: exists, kept")
        return 0
    tmp = out.with_name(out.name + ".partial")
    for leftover in (tmp, out):
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors" or f.name == "model.safetensors.index.json":
            os.link(f, tmp / f.name)
        elif f.name in ("config.json", "generation_config.json", "chat_template.jinja"):
            shutil.copy2(f, tmp / f.name)
    tokenizer_json = json.loads((src / "tokenizer.json").read_text())
    ranks, freed = tiktoken_ranks(tokenizer_json, len(ADDED))
    (tmp / "tiktoken.model").write_text(ranks)
    src_config = json.loads((src / "tokenizer_config.json").read_text())
    specials = {t["id"]: t["content"] for t in tokenizer_json.get("added_tokens", []) if t.get("special")}

    def entry(content: str, special: bool) -> dict:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": special}

    config = {
        "tokenizer_class": CLASS,
        "auto_map": {"AutoTokenizer": [f"{MODULE}.{CLASS}", None]},
        **{k: src_config[k] for k in ("bos_token", "eos_token", "unk_token") if k in src_config},
        "added_tokens_decoder": {
            **{str(i): entry(c, True) for i, c in specials.items()},
            **{str(i): entry(c, False) for i, c in zip(freed, ADDED)},
        },
        "model_max_length": src_config.get("model_max_length", 512),
    }
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy2(Path(__file__).with_name("slow_tokenizer.py"), tmp / f"{MODULE}.py")
    tmp.rename(out)
    print(f"{out}: written ({', '.join(f'{c}={i}' for i, c in zip(freed, ADDED))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
