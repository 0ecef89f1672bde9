"""Benchmark (not a test): vLLM's process topologies on CPU, booted side by side, as ratios; with
`--compare model-info-cache`, the `in_process` topology with a cold model-class inspection cache at
every start against one shared across starts (`server.model_info_cache`); with `--compare
inductor-headers`, torch inductor's precompiled C++ headers built again at every start against
kept across starts (`server.inductor_header_cache`), under the `logprobs` rule, whose first
request makes every server compile the sampler's kernels.

Each round runs two cells of the smoke matrix (the `safetensors` baseline under streamer 0.17.0
and the `runai_streamer` cell under 0.16.0, which loses its weights: runai-model-streamer #157)
once under every variant, one `regbench run` each, in alternating order so that a machine
slowing down or speeding up weighs on both alike. Prints per topology the boots, the median
boot (process start → /health 200, the bench's own clock), the median shutdown, the whole
run's wall time, each as a ratio to vLLM's default topology, and whether each run caught the
seed bug and kept the baseline's token ids: a faster topology is only of use if it finds the same.

Run after scripts/setup.sh:
  .venv/bin/python scripts/bench_topology.py [--rounds 3] [--compare topology|model-info-cache|inductor-headers]
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

from bench.core.records import Summary  # noqa: E402
from bench.store.results import ResultsDir  # noqa: E402

BUG = "tiny-canary__runai_streamer__cpu__streamer-0.16.0"
BASELINE = "tiny-canary__safetensors__cpu__streamer-0.17.0"


# What each comparison varies in the matrix's `server` block; the first variant is the reference.
VARIANTS = {
    "topology": {"default": {"topology": "default"}, "in_process": {"topology": "in_process"}},
    "model-info-cache": {"cold": {"topology": "in_process", "model_info_cache": False},
                         "shared": {"topology": "in_process", "model_info_cache": True}},
    "inductor-headers": {"rebuilt": {"topology": "in_process", "inductor_header_cache": False},
                         "shared": {"topology": "in_process", "inductor_header_cache": True}},
}
# What each comparison needs of the rest of the matrix.
MATRIX = {"inductor-headers": {"comparison": {"mode": "logprobs"}}}


def matrix(name: str, server: dict, extra: dict) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-smoke.yaml").read_text())
    data.update(extra)
    data["repeats"] = 1
    data["server"].update(server)
    data["include"] = [{"load_format": "runai_streamer", "image": "streamer-0.16.0"},
                       {"load_format": "safetensors", "image": "streamer-0.17.0"}]
    data["baseline"] = {"load_format": "safetensors", "image": "streamer-0.17.0"}
    out = ROOT / "configs" / f".topology-{name}-{os.getpid()}.yaml"  # beside the smoke file: same paths
    out.write_text(yaml.safe_dump(data))
    return out


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant (two boots each)")
    parser.add_argument("--compare", choices=list(VARIANTS), default="topology",
                        help="what to vary: vLLM's process layout, the shared model-info cache, or the "
                             "shared precompiled headers")


def main(args: argparse.Namespace) -> int:
    variants = VARIANTS[args.compare]
    topologies = list(variants)
    configs = {t: matrix(t, variants[t], MATRIX.get(args.compare, {})) for t in topologies}
    boots: dict[str, list[float]] = {t: [] for t in topologies}
    stops: dict[str, list[float]] = {t: [] for t in topologies}
    walls: dict[str, list[float]] = {t: [] for t in topologies}
    caught: dict[str, list[bool]] = {t: [] for t in topologies}
    try:
        with tempfile.TemporaryDirectory(prefix="regbench-topology-") as tmp:
            for n in range(args.rounds):
                order = topologies if n % 2 == 0 else topologies[::-1]
                for topology in order:
                    run_id = f"{topology}-{n}"
                    t0 = time.perf_counter()
                    subprocess.run([str(ROOT / ".venv" / "bin" / "regbench"), "run", str(configs[topology]),
                                    "--results", tmp, "--run-id", run_id, "--no-history"],
                                   check=False, capture_output=True)
                    walls[topology].append(time.perf_counter() - t0)
                    results = ResultsDir(Path(tmp) / run_id)
                    for r in results.runs():
                        if r.server.boot_s is not None:
                            boots[topology].append(r.server.boot_s)
                        if r.server.shutdown_s is not None:
                            stops[topology].append(r.server.shutdown_s)
                    cells = {c.cell_id: c for c in
                             Summary.model_validate_json((results.path / "summary.json").read_text()).cells}
                    ok = cells[BUG].verdict == "fail" and "empty_text" in cells[BUG].reasons \
                        and cells[BASELINE].verdict == "pass"
                    caught[topology].append(ok)
                    print(f"round {n + 1} {topology:<10} wall {walls[topology][-1]:6.1f} s  "
                          f"boots {', '.join(f'{b:.1f}' for b in boots[topology][-2:])} s  "
                          f"seed bug caught, baseline passed: {ok}", flush=True)
    finally:
        for c in configs.values():
            c.unlink()
    first = topologies[0]
    print(f"\n{'variant':<11} {'boots':>5} {'boot s (median)':>16} {'ratio':>6} {'shutdown s':>10} "
          f"{'run wall s':>10} {'ratio':>6}  findings kept")
    for t in topologies:
        boot, wall = statistics.median(boots[t]), statistics.median(walls[t])
        print(f"{t:<11} {len(boots[t]):>5} {boot:>16.1f} {boot / statistics.median(boots[first]):>6.2f} "
              f"{statistics.median(stops[t]):>10.2f} {wall:>10.1f} {wall / statistics.median(walls[first]):>6.2f}  "
              f"{sum(caught[t])}/{len(caught[t])} runs")
    return 0 if all(all(v) for v in caught.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
