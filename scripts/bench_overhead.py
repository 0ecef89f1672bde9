"""Benchmark (not a test): regbench's own overhead over a bare vLLM server doing the same work.

For one cell of the smoke matrix it alternates, N times each:
  A) `regbench run` of that cell with 1 repeat (the whole command: start-up, fingerprint,
     boot, requests, shutdown, judging, reports);
  B) the same `vllm serve` command and environment started by hand: poll /health, send the
     same requests with plain httpx, SIGTERM, wait.
and prints the wall times side by side and the ratios A/B (whole command, and the cell's own
boot + requests + shutdown from its run record). Target: ≤ 1.03.

Run after scripts/setup.sh:  .venv/bin/python scripts/bench_overhead.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.matrix import expand  # noqa: E402
from bench.core.records import RunRecord  # noqa: E402
from bench.serve.launch_local import vllm_argv, vllm_env  # noqa: E402
from bench.serve.ports import free_port  # noqa: E402
from bench.store.matrixfile import load_config  # noqa: E402

CELL = {"load_format": "safetensors", "image": "streamer-0.17.0"}


def one_cell_config(tmp: Path) -> Path:
    smoke = ROOT / "configs" / "cpu-smoke.yaml"
    data = yaml.safe_load(smoke.read_text())
    data.update(repeats=1, include=[CELL])
    out = ROOT / "configs" / f".overhead-{os.getpid()}.yaml"  # beside the smoke file: same relative paths
    out.write_text(yaml.safe_dump(data))
    return out


def with_regbench(config: Path, results: Path, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run([str(ROOT / ".venv" / "bin" / "regbench"), "run", str(config), "--results", str(results),
                    "--run-id", f"r{n}"], check=False, capture_output=True)
    whole = time.perf_counter() - t0
    (line,) = (results / f"r{n}" / "runs.jsonl").read_text().splitlines()
    run = RunRecord.model_validate_json(line)
    cell = (run.server.boot_s or 0) + (run.requests_s or 0) + (run.server.shutdown_s or 0)
    return whole, cell


def send_bare_requests(base: str, cell, w, proc: subprocess.Popen) -> None:
    with httpx.Client(timeout=60) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the bare server exited with {proc.returncode}; see its server.log")
            try:
                if client.get(f"{base}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        for p in w.prompts:
            body = {"model": cell.model.served, "max_tokens": w.max_tokens, "min_tokens": w.min_tokens,
                    "ignore_eos": w.ignore_eos, "temperature": w.temperature, "seed": w.seed,
                    "return_token_ids": True, "stream": p.stream}
            if p.kind == "chat":
                body["messages"] = [m.model_dump() for m in p.messages or []]
                url = f"{base}/v1/chat/completions"
            else:
                body["prompt"] = p.prompt
                url = f"{base}/v1/completions"
            client.post(url, json=body).raise_for_status()


def bare(config_path: Path, scratch: Path) -> float:
    config = load_config(config_path)
    cell = expand(config)[0]
    port = free_port()
    for d in ("tmp", "cache"):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    w = config.workload
    t0 = time.perf_counter()
    with open(scratch / "server.log", "wb") as log:
        proc = subprocess.Popen(vllm_argv(cell, config.server, port),
                                env=vllm_env(cell, config.server, scratch, dict(os.environ),
                                             config.profile(cell.platform)),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        send_bare_requests(base, cell, w, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rb-overhead-") as tmp:
        tmp = Path(tmp)
        config = one_cell_config(tmp)
        try:
            wholes, cells, bares = [], [], []
            for n in range(args.rounds):
                whole, cell = with_regbench(config, tmp / "results", n)
                b = bare(config, tmp / f"bare{n}")
                wholes.append(whole)
                cells.append(cell)
                bares.append(b)
                print(f"round {n + 1}: regbench {whole:6.1f} s (cell {cell:5.1f} s)   bare server {b:6.1f} s",
                      flush=True)
        finally:
            config.unlink()
    b = statistics.median(bares)
    print(json.dumps({
        "rounds": args.rounds,
        "bare_s": round(b, 2),
        "regbench_whole_s": round(statistics.median(wholes), 2),
        "regbench_cell_s": round(statistics.median(cells), 2),
        "ratio_whole": round(statistics.median(wholes) / b, 3),
        "ratio_cell": round(statistics.median(cells) / b, 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
