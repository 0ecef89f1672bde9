"""Benchmark (not a test): the 4-cell smoke matrix (1 repeat each) on 1 device slot, then on 2.

On this CPU host a slot is a CPU: with `--devices 0` the four servers run one after another on
CPU 0; with `--devices 0,1` two at a time, each pinned to its own CPU. Prints both wall times,
their ratio, each run's device and span, and checks from the recorded timestamps that no two
servers ever shared a device and that both runs reach the same verdicts.

Run after scripts/setup.sh:  .venv/bin/python scripts/bench_slots.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.records import Summary  # noqa: E402
from bench.serve.slots import shared_devices  # noqa: E402
from bench.store.results import ResultsDir  # noqa: E402


def four_cell_config() -> Path:
    data = yaml.safe_load((ROOT / "configs" / "cpu-smoke.yaml").read_text())
    data.update(repeats=1)
    out = ROOT / "configs" / f".slots-{os.getpid()}.yaml"  # beside the smoke file: same relative paths
    out.write_text(yaml.safe_dump(data))
    return out


def run(config: Path, results: Path, devices: str) -> tuple[float, ResultsDir]:
    run_id = f"devices-{devices.replace(',', '-')}"
    t0 = time.perf_counter()
    subprocess.run([str(ROOT / ".venv" / "bin" / "regbench"), "run", str(config), "--results", str(results),
                    "--run-id", run_id, "--devices", devices], check=False, capture_output=True)
    return time.perf_counter() - t0, ResultsDir(results / run_id)


def main() -> int:
    config = four_cell_config()
    try:
        with tempfile.TemporaryDirectory(prefix="regbench-slots-") as tmp:
            timings = {}
            for devices in ("0", "0,1"):
                wall, results = run(config, Path(tmp), devices)
                runs = results.runs()
                summary = Summary.model_validate_json((results.path / "summary.json").read_text())
                timings[devices] = wall
                t0 = min(r.server.started_at for r in runs)
                print(f"--devices {devices}: {wall:.1f} s for {len(runs)} servers")
                for r in sorted(runs, key=lambda r: r.server.started_at):
                    s = r.server
                    print(f"  {s.devices.kind}{','.join(s.devices.ids)}  {s.started_at - t0:6.1f} → "
                          f"{s.ended_at - t0:6.1f} s  boot {s.boot_s or 0:5.1f} s  {r.cell_id}")
                print(f"  verdicts: {sorted((c.cell_id, c.verdict) for c in summary.cells)}")
                clashes = shared_devices(runs)
                print(f"  servers sharing a device: {clashes or 'none'}")
                if clashes or len(runs) != 4:
                    return 1
            print(f"wall time, 2 slots / 1 slot: {timings['0,1'] / timings['0']:.3f}")
    finally:
        config.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
