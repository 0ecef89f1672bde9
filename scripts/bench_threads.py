"""Benchmark (not a test): vLLM servers sharing cores, with vLLM's default OpenMP threads against one
thread per server, as ratios.

The test suite runs two servers at a time on 2 cores (two pytest-xdist workers). Each round here
starts two `regbench run`s of the same two smoke cells at once (the `safetensors` baseline under
streamer 0.17.0 and the `runai_streamer` cell under 0.16.0, which loses its weights:
runai-model-streamer #157), first with one setting, then with the other, alternating which goes
first. Prints per setting the median boot and request phase of a server (the bench's own clocks
in runs.jsonl), the wall time of the pair of runs, each as a ratio to vLLM's default, and whether
every run caught the seed bug and kept the baseline's token ids: a faster setting is only of use
if it finds the same.

Run after scripts/setup.sh:  .venv/bin/python scripts/bench_threads.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.records import RunRecord, Summary  # noqa: E402

BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"
BASELINE = "tiny-canary__safetensors__cpu__streamer-0.17.0"
# setting -> OMP_NUM_THREADS for the servers (None: vLLM's default, a thread per core)
SETTINGS: dict[str, str | None] = {"default": None, "one-thread": "1"}


def matrix() -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-smoke.yaml").read_text())
    data["repeats"] = 1
    data["include"] = [{"load_format": "runai_streamer", "image": "streamer-0.16.0"},
                       {"load_format": "safetensors", "image": "streamer-0.17.0"}]
    data["baseline"] = {"load_format": "safetensors", "image": "streamer-0.17.0"}
    out = ROOT / "configs" / f".threads-{os.getpid()}.yaml"  # beside the smoke file: same paths
    out.write_text(yaml.safe_dump(data))
    return out


def env_for(threads: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return env if threads is None else {**env, "OMP_NUM_THREADS": threads}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs per setting (four boots each)")


def main(args: argparse.Namespace) -> int:
    config = matrix()
    boots: dict[str, list[float]] = {s: [] for s in SETTINGS}
    requests: dict[str, list[float]] = {s: [] for s in SETTINGS}
    walls: dict[str, list[float]] = {s: [] for s in SETTINGS}
    kept: dict[str, list[bool]] = {s: [] for s in SETTINGS}
    try:
        with tempfile.TemporaryDirectory(prefix="regbench-threads-") as tmp:
            for r in range(args.rounds):
                order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
                for setting in order:
                    started = time.monotonic()
                    runs = [subprocess.Popen(
                        [sys.executable, "-m", "bench", "run", str(config), "--results", f"{tmp}/{setting}-{r}-{i}",
                         "--run-id", "t"], cwd=ROOT, env=env_for(SETTINGS[setting]),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in (0, 1)]
                    for p in runs:
                        p.wait(timeout=1800)
                    walls[setting].append(time.monotonic() - started)
                    for i in (0, 1):
                        run_dir = Path(tmp) / f"{setting}-{r}-{i}" / "t"
                        for line in (run_dir / "runs.jsonl").read_text().splitlines():
                            record = RunRecord.model_validate_json(line)
                            if record.server.boot_s is not None:
                                boots[setting].append(record.server.boot_s)
                            if record.requests_s is not None:
                                requests[setting].append(record.requests_s)
                        cells = {c.cell_id: c for c in Summary.model_validate_json(
                            (run_dir / "summary.json").read_text()).cells}
                        kept[setting].append(cells[BUG].verdict == "fail" and cells[BASELINE].verdict == "pass")
                    print(f"round {r + 1} {setting}: pair of runs {walls[setting][-1]:.0f} s", flush=True)
    finally:
        config.unlink(missing_ok=True)
    base = {"boot": statistics.median(boots["default"]), "requests": statistics.median(requests["default"]),
            "wall": statistics.median(walls["default"])}
    print(f"\n{'setting':12} {'servers':>7} {'boot s':>7} {'ratio':>6} {'requests s':>10} {'ratio':>6} "
          f"{'pair wall s':>11} {'ratio':>6}  findings kept")
    for s in SETTINGS:
        b, q, w = statistics.median(boots[s]), statistics.median(requests[s]), statistics.median(walls[s])
        print(f"{s:12} {len(boots[s]):>7} {b:>7.1f} {b / base['boot']:>6.2f} {q:>10.1f} {q / base['requests']:>6.2f} "
              f"{w:>11.1f} {w / base['wall']:>6.2f}  {sum(kept[s])}/{len(kept[s])} runs")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
