"""Benchmark (not a test): judging and reporting time over many request records.

Writes synthetic results folders (in a temp directory) of 10k, 50k and 100k requests: 8 cells
(2 models × 2 load formats × 2 images), 25 prompts of 128 token ids each, as many repeats as
that takes; one cell fails in most runs (empty text, one repeated id), one is flaky with an
exception at exit (and a server log to excerpt), one is nondeterministic. Then times what
`regbench report DIR` does: read the JSONL, judge every cell, render and write summary.json,
summary.md, junit.xml and report.html. Prints seconds per phase and per record; linear growth
shows as a flat µs/record column. Target: 100k requests in under 10 s.

    .venv/bin/python scripts/bench_report_scale.py [--sizes 10000 50000 100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.config import parse_config  # noqa: E402
from bench.core.judge import judge  # noqa: E402
from bench.core.records import RequestRecord, RunRecord, ServerOutcome  # noqa: E402
from bench.store.publish import write_reports  # noqa: E402
from bench.store.results import ResultsDir  # noqa: E402

PROMPTS = [f"p{i:02d}" for i in range(25)]
MODELS, FORMATS, IMAGES = ("llama", "qwen"), ("safetensors", "runai_streamer"), ("tag-n1", "tag-n")
CELLS = [(m, f, i) for m in MODELS for i in IMAGES for f in FORMATS]
GOOD = list(range(1000, 1128))
LOG = ("INFO serving\n" * 400 + "INFO stop requested\n"
       + "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: boom\n" + "INFO bye\n" * 50)
STOP_AT = len("INFO serving\n" * 400)


def config(repeats: int):
    return parse_config({
        "name": "scale",
        "models": [{"name": m, "path": f"/models/{m}"} for m in MODELS],
        "load_formats": [{"name": f} for f in FORMATS],
        "images": [{"name": i, "python": sys.executable} for i in IMAGES],
        "baseline": "safetensors",
        "repeats": repeats,
        "workload": {"prompts": [{"id": p, "prompt": "x"} for p in PROMPTS]},
    })


def generate(root: Path, n_requests: int) -> ResultsDir:
    repeats = max(1, n_requests // (len(CELLS) * len(PROMPTS)))
    results = ResultsDir.create(root, f"scale-{n_requests}", config(repeats))
    # Written in bulk, not with ResultsDir.add_*: one fsync per line would time the disk, not us.
    with open(results.path / "requests.jsonl", "w") as reqs, open(results.path / "runs.jsonl", "w") as runs:
        for model, fmt, image in CELLS:
            cell = f"{model}__{fmt}__cpu__{image}"
            broken = (model, fmt, image) == ("llama", "runai_streamer", "tag-n")
            crashy = (model, fmt, image) == ("qwen", "runai_streamer", "tag-n")
            drifting = (model, fmt, image) == ("qwen", "safetensors", "tag-n1")
            for repeat in range(1, repeats + 1):
                bad = broken and repeat % 8 != 0
                log_path = "server.log"  # none there: the judge reads no log for the run
                if crashy and repeat % 5 == 0:  # an exception at exit in the server log
                    run_dir = results.run_dir(cell, repeat)
                    (run_dir / "server.log").write_text(LOG)
                    log_path = str((run_dir / "server.log").relative_to(results.path))
                for k, prompt in enumerate(PROMPTS):
                    ids = [7] * 128 if bad else list(GOOD)
                    if drifting and repeat % 3 == 0:
                        ids[100] = 5
                    reqs.write(RequestRecord(
                        cell_id=cell, repeat=repeat, prompt_id=prompt, api="completion", stream=False,
                        started_at=float(repeat), latency_s=0.2 + 0.01 * k, status=200, text="" if bad else "ok",
                        token_ids=ids, completion_tokens=128, finish_reason="length",
                    ).model_dump_json() + "\n")
                outcome = ServerOutcome(command=["vllm", "serve"], port=8000, log_path=log_path,
                                        started_at=repeat * 70.0, boot_s=60.0 + repeat % 7, exit_code=0,
                                        stop_requested_at_byte=STOP_AT, shutdown_s=2.0)
                runs.write(RunRecord(cell_id=cell, repeat=repeat, server=outcome,
                                     requests_s=5.0).model_dump_json() + "\n")
    return results


def measure(root: Path, n: int) -> dict:
    results = generate(root, n)
    t0 = time.perf_counter()
    data = results.load()
    runs, requests = data.runs, data.requests
    t1 = time.perf_counter()
    summary = judge(data)
    t2 = time.perf_counter()
    write_reports(results, summary)
    t3 = time.perf_counter()
    sizes = {p.name: p.stat().st_size for p in results.path.iterdir() if p.is_file()}
    return dict(n=len(requests), runs=len(runs), read=t1 - t0, judge=t2 - t1, render=t3 - t2, total=t3 - t0,
                html_kb=sizes["report.html"] / 1024, junit_kb=sizes["junit.xml"] / 1024)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="regbench-scale-") as tmp:
        for n in args.sizes:
            rows.append(measure(Path(tmp), n))
    base = rows[0]["total"] / rows[0]["n"]
    print(f"{'requests':>9} {'runs':>6} {'read s':>7} {'judge s':>8} {'render+write s':>15} {'total s':>8} "
          f"{'µs/record':>10} {'vs first':>9} {'html KB':>8} {'junit KB':>9}")
    for r in rows:
        per = r["total"] / r["n"]
        print(f"{r['n']:>9} {r['runs']:>6} {r['read']:>7.2f} {r['judge']:>8.2f} {r['render']:>15.2f} "
              f"{r['total']:>8.2f} {per * 1e6:>10.1f} {per / base:>8.2f}× {r['html_kb']:>8.0f} {r['junit_kb']:>9.0f}")


if __name__ == "__main__":
    main()
