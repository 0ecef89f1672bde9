"""Benchmark (not a test): the weight audit, its baseline hashing against `sha256sum`, the whole
audit, and the whole audit's time to flag the canary.

1. Baseline hashing. The audit hashes every tensor of a checkpoint before it can compare what
   the loader delivered, so on a real model (tens to hundreds of GB) the baseline must not be the
   slow part. This writes a checkpoint of random bytes (U8 and F32 tensors in several shards,
   headers written by hand, no torch) into a temporary directory, then alternates, --rounds
   times each: A) bench.weights.checkpoint: inspect_checkpoint + hash_tensors (per-tensor sha256,
   threads); B) `sha256sum` over the same files (one process, whole files); and prints the best
   throughput of each (MB/s, 10^6 bytes, counting the bytes each one hashed) and the ratio A/B.
   Target: >= 1.5 on 2 cores. Both read from the page cache.
2. The whole audit of that checkpoint, what a user waits for: `regbench audit CKPT --format json` run as
   a command, end to end (the bench's start-up, inspect, baseline, the reader importing torch and
   the streamer, streaming every order through every loader while hashing what arrives), with the
   default orders and loaders. Wall time, and where it went (from the report's own timings).
3. Time to flag the canary (--canary, default .cache/models/tiny-canary, with the 0.16.0 overlay
   from .cache/streamers): `regbench audit CANARY --pythonpath OVERLAY` with the default options
   against `--loaders streamer`, alternating, --canary-rounds times each; every run must exit 1
   (weights lost). Target: < 5 s with the default options on 2 cores.

--bench DIR times another copy of the bench package (the folder that holds `bench/`), e.g. the
last commit's, for a before/after comparison: `git archive HEAD bench | tar -x -C DIR`.
Nothing is cached between runs: every audit is a fresh process that imports and streams again.
The temporary checkpoint is deleted at the end.

Run:  .venv/bin/python scripts/bench_audit.py [--size-gb 2] [--shards 8] [--rounds 2]
      [--canary-rounds 5] [--skip-hashing] [--skip-whole] [--bench DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.weights.checkpoint import hash_tensors, inspect_checkpoint, shard_header  # noqa: E402

BLOCK = 16 * 1024 * 1024
CANARY = ROOT / ".cache" / "models" / "tiny-canary"
CANARY_OVERLAY = ROOT / ".cache" / "streamers" / "0.16.0"
SUT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


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


def regbench_audit(bench: Path, ckpt: Path, *options: str) -> tuple[float, int, dict]:
    """`regbench audit CKPT --format json OPTIONS` as a user runs it: wall time, exit code, the report."""
    env = dict(os.environ, PYTHONPATH=str(bench))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bench", "audit", str(ckpt), "--format", "json", *options],
                          capture_output=True, text=True, env=env, cwd=bench)
    seconds = time.perf_counter() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"regbench audit exited {done.returncode} without a report:\n{done.stderr[-2000:]}") from None
    return seconds, done.returncode, report


def reader_figure(report: dict, figure: str) -> float | None:
    """The reader's `figure` (seconds, import_seconds, ...): a bench older than the reader's name
    (--bench DIR) writes it as probe_<figure>."""
    value = report.get(f"reader_{figure}")
    return report.get(f"probe_{figure}") if value is None else value


def breakdown(report: dict) -> str:
    """Where an audit's time went, from the report's own timings (older reports have fewer)."""
    runs = report["runs"]
    parts = [f"baseline {report['baseline_seconds']:.2f} s"]
    if (seconds := reader_figure(report, "seconds")) is not None:
        parts.append(f"reader {seconds:.2f} s")
    if (seconds := reader_figure(report, "import_seconds")) is not None:
        parts.append(f"of which torch+streamer import {seconds:.2f} s")
    if (seconds := reader_figure(report, "vllm_seconds")) is not None:
        parts.append(f"vLLM's iterator {seconds:.2f} s")
    parts.append(f"{len(runs)} run(s) streaming {sum(r['seconds'] or 0 for r in runs):.2f} s")
    return ", ".join(parts)


def bench_hashing(root: Path, files: list[Path], rounds: int, workers: int | None) -> None:
    best_ours = best_sum = float("inf")
    hashed_ours = hashed_sum = 0
    for r in range(1, rounds + 1):
        seconds, hashed_ours = ours(root, workers)
        best_ours = min(best_ours, seconds)
        print(f"round {r}: bench.weights.checkpoint {hashed_ours / seconds / 1e6:7.0f} MB/s ({seconds:.2f} s)")
        seconds, hashed_sum = sha256sum(files)
        best_sum = min(best_sum, seconds)
        print(f"round {r}: sha256sum        {hashed_sum / seconds / 1e6:7.0f} MB/s ({seconds:.2f} s)")
    mine, theirs = hashed_ours / best_ours / 1e6, hashed_sum / best_sum / 1e6
    print(f"baseline hashing, best: bench.weights.checkpoint {mine:.0f} MB/s, sha256sum {theirs:.0f} MB/s, "
          f"ratio {mine / theirs:.2f}x (target >= 1.5x)")


def bench_whole(bench: Path, root: Path, python: str, pythonpath: list[str]) -> None:
    options = ["--python", python] + (["--pythonpath", *pythonpath] if pythonpath else [])
    seconds, code, report = regbench_audit(bench, root, *options)
    runs = report["runs"]
    streamed = report["baseline_bytes"] * len(runs)
    print(f"whole audit (`regbench audit CKPT`, default options: {len(runs)} runs = "
          f"{len({r['order'] for r in runs})} orders x {len({r['loader'] for r in runs})} loaders, "
          f"streamer {report['streamer_version']}): {seconds:.2f} s wall, exit {code}; "
          f"{streamed / 1e9:.2f} GB streamed and hashed, {streamed / seconds / 1e6:.0f} MB/s over the wall time")
    print(f"  {breakdown(report)}")
    if code != 0:
        print(f"  the audit found problems: {report['problems'][:3]}")


def bench_canary(bench: Path, canary: Path, overlay: Path, python: str, rounds: int) -> None:
    variants = {"default options": [], "--loaders streamer": ["--loaders", "streamer"]}
    times: dict[str, list[float]] = {name: [] for name in variants}
    last: dict[str, dict] = {}
    for r in range(1, rounds + 1):
        for name, extra in variants.items():
            seconds, code, report = regbench_audit(bench, canary, "--python", python, "--pythonpath", str(overlay), *extra)
            lost = sum(len(run["missing"]) for run in report["runs"])
            if code != 1 or not lost:
                raise SystemExit(f"{name}: the canary was not flagged (exit {code}, {lost} tensors lost)")
            times[name].append(seconds)
            last[name] = report
            print(f"round {r}: {name:18} {seconds:6.2f} s to flag the canary ({len(report['runs'])} runs, "
                  f"{lost} tensor deliveries lost)")
    for name, values in times.items():
        print(f"time to flag the canary, {name}: best {min(values):.2f} s, median {statistics.median(values):.2f} s "
              f"over {len(values)} round(s)" + (" (target < 5 s)" if name == "default options" else ""))
        print(f"  last round: {breakdown(last[name])}")
        if last[name].get("vllm_iterator"):
            print(f"  loader=vllm: {last[name]['vllm_iterator']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="checkpoint size in GB (10^9 bytes)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the hashing comparison")
    parser.add_argument("--workers", type=int, default=None, help="hashing threads (default: one per core)")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary checkpoint (default: $TMPDIR)")
    parser.add_argument("--python", default=str(SUT_PYTHON), help="the system-under-test Python for the audits")
    parser.add_argument("--pythonpath", nargs="*", default=[], metavar="DIR",
                        help="overlay for the whole audit of the written checkpoint (default: the venv's own streamer)")
    parser.add_argument("--canary", type=Path, default=CANARY)
    parser.add_argument("--canary-overlay", type=Path, default=CANARY_OVERLAY, help="a streamer that loses the canary")
    parser.add_argument("--canary-rounds", type=int, default=3)
    parser.add_argument("--bench", type=Path, default=ROOT, help="the folder holding the bench package to time")
    parser.add_argument("--skip-hashing", action="store_true", help="skip part 1")
    parser.add_argument("--skip-whole", action="store_true", help="skip parts 1 and 2 (no checkpoint is written)")
    parser.add_argument("--skip-canary", action="store_true", help="skip part 3")
    args = parser.parse_args(argv)
    if shutil.which("sha256sum") is None and not (args.skip_hashing or args.skip_whole):
        print("sha256sum is not on PATH", file=sys.stderr)
        return 2
    bench = args.bench.resolve()
    if not ((bench / "bench" / "audit.py").exists() or (bench / "bench" / "weights" / "audit.py").exists()):
        print(f"--bench {bench}: no bench package there", file=sys.stderr)
        return 2
    print(f"{os.cpu_count()} cores; timing the bench package in {bench}; system under test {args.python}")

    if not args.skip_whole:
        root = Path(tempfile.mkdtemp(prefix="regbench-bench-audit-", dir=args.dir))
        try:
            started = time.perf_counter()
            files = write_checkpoint(root, int(args.size_gb * 1e9), args.shards)
            total = sum(f.stat().st_size for f in files)
            print(f"wrote {total / 1e9:.2f} GB in {len(files)} shards under {root} ({time.perf_counter() - started:.1f} s)")
            for f in files:  # warm-up: every side reads from the page cache
                with f.open("rb") as fh:
                    while fh.read(BLOCK):
                        pass
            if not args.skip_hashing:
                bench_hashing(root, files, args.rounds, args.workers)
            bench_whole(bench, root, args.python, args.pythonpath)
        finally:
            shutil.rmtree(root)
    if not args.skip_canary:
        if not (args.canary / "regbench-canary.json").exists() or not args.canary_overlay.is_dir():
            print(f"no canary at {args.canary} or no overlay at {args.canary_overlay}: run scripts/setup.sh",
                  file=sys.stderr)
            return 2
        bench_canary(bench, args.canary.resolve(), args.canary_overlay.resolve(), args.python, args.canary_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
