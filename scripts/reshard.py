"""Re-shards a safetensors checkpoint so that some shards hold no tensor, at chosen places in the
folder's directory-listing order: the layouts on which runai-model-streamer 0.16.0 and earlier
silently stop streaming (its #157; see README.md, "The motivating case"). Used by make_tiny_model.py
and make_real_model.py, with the Python of the vLLM environment (torch, safetensors).

The listing order is a property of the final folder (it is hash order on ext4), so the shard
files are created first, their order read back with os.listdir, and only then filled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

INDEX = "model.safetensors.index.json"
STAMP = "regbench-canary.json"


def reshard(out: Path, shards: int, choose_empty: Callable[[list[str], list[str]], list[str]],
            contiguous: bool = False) -> dict:
    """Rewrites out/*.safetensors as `shards` files; `choose_empty(listed, names)` picks the
    empty ones from the listing order and the sorted names. Tensors go to the data shards
    round-robin by name, or with `contiguous` in runs of the sorted names as save_pretrained
    writes them (a lost shard is then a block of the model, not a sprinkling of every layer).
    The index names the data shards only, as a checkpoint tool would. Returns the stamp."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(f))
        f.unlink()
    (out / INDEX).unlink(missing_ok=True)

    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for n in names:
        (out / n).touch()
    listed = [n for n in os.listdir(out) if n in names]  # the order glob() will see
    empty = choose_empty(listed, names)
    data_files = [n for n in names if n not in empty]

    keys = sorted(tensors)
    weight_map = {}
    per = -(-len(keys) // len(data_files))
    for i, n in enumerate(data_files):
        part = keys[i * per : (i + 1) * per] if contiguous else keys[i :: len(data_files)]
        save_file({k: tensors[k].contiguous() for k in part}, out / n, metadata={"format": "pt"})
        weight_map.update({k: n for k in part})
    for n in empty:
        save_file({}, out / n, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2)
    )
    stamp = {"listing_order": listed, "empty": empty, "tensors": len(keys)}
    (out / STAMP).write_text(json.dumps(stamp, indent=2))
    return stamp
