"""Benchmark (not a test): the weight audit's baseline hashing against `sha256sum`.

The audit hashes every tensor of a checkpoint before it can compare what the loader delivered,
so on a real model (tens to hundreds of GB) the baseline must not be the slow part. This writes
a checkpoint of random bytes (U8 and F32 tensors in several shards, headers written by hand, no
torch) into a temporary directory, then alternates, --rounds times each:
  A) bench.checkpoint: inspect_checkpoint + hash_tensors (per-tensor sha256, threads);
  B) `sha256sum` over the same files (one process, whole files);
and prints the best throughput of each (MB/s, 10^6 bytes, counting the bytes each one hashed)
and the ratio A/B. Target: >= 1.5 on 2 cores. Both read from the page cache: the files were
just written, and the warm-up pass reads them once more. The directory is deleted at the end.

Run:  .venv/bin/python scripts/bench_audit.py [--size-gb 2] [--shards 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.checkpoint import hash_tensors, inspect_checkpoint, shard_header  # noqa: E402

BLOCK = 16 * 1024 * 1024


def write_checkpoint(root: Path, size: int, shards: int) -> list[Path]:
    """Shards of about size/shards bytes each: one large U8 tensor (a packed-FP4-like weight),
    two mid-sized F32 tensors and a few small ones, so units of every size get hashed."""
    per_shard = size // shards
    files = []
    for i in range(1, shards + 1):
        big = per_shard // 2
        mid = (per_shard - big) // 2 // 4 * 4
        entries = [(f"layers.{i}.mlp.weight", "U8", [big], big)]
        entries += [(f"layers.{i}.attn.{p}.weight", "F32", [mid // 4], mid) for p in ("q", "k")]
        entries += [(f"layers.{i}.norm{j}.weight", "F32", [1024], 4096) for j in range(4)]
        path = root / f"model-{i:05d}-of-{shards:05d}.safetensors"
        with path.open("wb") as f:
            f.write(shard_header(entries))
            remaining = sum(e[3] for e in entries)
            while remaining:
                n = min(BLOCK, remaining)
                f.write(os.urandom(n))
                remaining -= n
        files.append(path)
    return files


def ours(root: Path, workers: int | None) -> tuple[float, int]:
    started = time.perf_counter()
    report = inspect_checkpoint(root)
    hashes = hash_tensors(root, report.shards, workers)
    return time.perf_counter() - started, sum(h.nbytes for h in hashes)


def sha256sum(files: list[Path]) -> tuple[float, int]:
    started = time.perf_counter()
    subprocess.run(["sha256sum", *map(str, files)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, sum(f.stat().st_size for f in files)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="checkpoint size in GB (10^9 bytes)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="hashing threads (default: one per core)")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary checkpoint (default: $TMPDIR)")
    args = parser.parse_args(argv)
    if shutil.which("sha256sum") is None:
        print("sha256sum is not on PATH", file=sys.stderr)
        return 2

    root = Path(tempfile.mkdtemp(prefix="regbench-bench-audit-", dir=args.dir))
    try:
        started = time.perf_counter()
        files = write_checkpoint(root, int(args.size_gb * 1e9), args.shards)
        total = sum(f.stat().st_size for f in files)
        print(f"wrote {total / 1e9:.2f} GB in {len(files)} shards under {root} ({time.perf_counter() - started:.1f} s); "
              f"{os.cpu_count()} cores")
        for f in files:  # warm-up: both sides read from the page cache
            with f.open("rb") as fh:
                while fh.read(BLOCK):
                    pass
        best_ours = best_sum = float("inf")
        hashed_ours = hashed_sum = 0
        for r in range(1, args.rounds + 1):
            seconds, hashed_ours = ours(root, args.workers)
            best_ours = min(best_ours, seconds)
            print(f"round {r}: bench.checkpoint {hashed_ours / seconds / 1e6:7.0f} MB/s ({seconds:.2f} s)")
            seconds, hashed_sum = sha256sum(files)
            best_sum = min(best_sum, seconds)
            print(f"round {r}: sha256sum        {hashed_sum / seconds / 1e6:7.0f} MB/s ({seconds:.2f} s)")
        mine, theirs = hashed_ours / best_ours / 1e6, hashed_sum / best_sum / 1e6
        print(f"best: bench.checkpoint {mine:.0f} MB/s, sha256sum {theirs:.0f} MB/s, ratio {mine / theirs:.2f}x "
              f"(target >= 1.5x)")
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
