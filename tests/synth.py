"""Synthetic results folders, written with the bench's own ResultsDir and record models, for
tests of what is derived from them (reports, comparisons). No server is involved."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from bench.core.config import parse_config
from bench.core.records import Finding, Fingerprint, RequestRecord, RunPerf, RunRecord, ServerOutcome
from bench.store.results import ResultsDir

GOOD_IDS = list(range(100, 228))  # 128 distinct ids: no request-level finding
PROMPTS = ("code", "prose")


def matrix(images: tuple[str, ...] = ("img",), repeats: int = 2, prompts: tuple[str, ...] = PROMPTS) -> dict:
    return {
        "name": "t",
        "models": [{"name": "m", "path": "/models/m"}],
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer"}],
        "images": [{"name": i, "python": sys.executable} for i in images],
        "baseline": "safetensors",
        "repeats": repeats,
        "workload": {"prompts": [{"id": p, "prompt": f"Write some {p}"} for p in prompts]},
    }


def create(root: Path, run_id: str, spec: dict) -> ResultsDir:
    return ResultsDir.create(root, run_id, parse_config(copy.deepcopy(spec)))


def add_run(
    results: ResultsDir,
    cell_id: str,
    repeat: int,
    *,
    prompts: tuple[str, ...] = PROMPTS,
    ids: list[int] | dict[str, list[int]] | None = None,
    text: str = "def f(x):\n    return x",
    log: str | bytes | None = None,
    boot_s: float | None = 40.0,
    latency_s: float = 0.5,
    stop_at: int | None = None,
    **outcome,
) -> RunRecord:
    """One run of a cell as the runner records it: a request per prompt (unless it never booted;
    `ids`: every request's token ids, or by prompt),
    its run record, its log. What is wrong with it, the judge finds there (`findings` are never
    recorded); `outcome`: ServerOutcome fields, e.g. exit_code=1, killed=True."""
    run_dir = results.run_dir(cell_id, repeat)
    log_path = run_dir / "server.log"
    data = log if log is not None else "INFO started\nINFO serving\n"
    log_path.write_bytes(data.encode() if isinstance(data, str) else data)
    if boot_s is not None:
        for i, prompt in enumerate(prompts):
            given = ids.get(prompt) if isinstance(ids, dict) else ids
            token_ids = list(GOOD_IDS if given is None else given)
            results.add_request(RequestRecord(
                cell_id=cell_id, repeat=repeat, prompt_id=prompt, api="completion", stream=False,
                started_at=1000.0 + repeat, latency_s=latency_s + 0.1 * i, status=200, text=text,
                token_ids=token_ids, completion_tokens=len(token_ids), finish_reason="length",
            ))
    server = ServerOutcome(
        command=["vllm", "serve"], port=8000, log_path=str(log_path.relative_to(results.path)),
        started_at=1000.0 + repeat * 60, boot_s=boot_s,
        stop_requested_at_byte=stop_at, shutdown_s=2.0, **{"exit_code": 0 if boot_s is not None else 1, **outcome},
    )
    record = RunRecord(cell_id=cell_id, repeat=repeat, server=server, requests_s=1.5 if boot_s else None)
    results.add_run(record)
    return record


def fingerprint(results: ResultsDir, image: str, **versions) -> None:
    base = dict(python="3.11.7", vllm="0.32.0", runai_model_streamer="0.17.0", torch="2.9.0", arch="x86_64",
                cpu="Test CPU")
    base.update(versions)
    results.add_fingerprint(Fingerprint(image=image, **base))


def healthy(root: Path, run_id: str, images: tuple[str, ...] = ("img",), repeats: int = 2,
            streamer: str = "0.17.0") -> ResultsDir:
    """Every cell passes: both load formats return the same token ids."""
    results = create(root, run_id, matrix(images, repeats))
    for image in images:
        fingerprint(results, image, runai_model_streamer=streamer)
        for fmt in ("safetensors", "runai_streamer"):
            for repeat in range(1, repeats + 1):
                add_run(results, f"m__{fmt}__cpu__{image}", repeat)
    return results


# What the judge finds in such a run first (a finding for tests of what reads findings).
EMPTY = Finding(reason="empty_text", detail="code: empty text (128 tokens, finish_reason length)", prompt_id="code")


def streamer_bug(root: Path, run_id: str, images: tuple[str, ...] = ("img",), repeats: int = 2,
                 failing: tuple[int, ...] | None = None, streamer: str = "0.16.0") -> ResultsDir:
    """The seed bug: runai_streamer runs return 128 copies of one id with empty text."""
    results = create(root, run_id, matrix(images, repeats))
    failing = tuple(range(1, repeats + 1)) if failing is None else failing
    for image in images:
        fingerprint(results, image, runai_model_streamer=streamer)
        for repeat in range(1, repeats + 1):
            add_run(results, f"m__safetensors__cpu__{image}", repeat)
            if repeat in failing:
                add_run(results, f"m__runai_streamer__cpu__{image}", repeat, ids=[0] * 128, text="")
            else:
                add_run(results, f"m__runai_streamer__cpu__{image}", repeat)
    return results


class _WithPerf:
    """A ResultsDir whose run records get the performance figures given (add_run writes none)."""

    def __init__(self, results: ResultsDir, perf: RunPerf):
        self._results, self._perf = results, perf

    def __getattr__(self, name: str):
        return getattr(self._results, name)

    def add_run(self, record: RunRecord) -> None:
        self._results.add_run(record.model_copy(update={"perf": self._perf}))


JITTER = (0.98, 1.0, 1.02)  # repeat to repeat, as fresh servers differ


def timed(root: Path, run_id: str, repeats: int = 3, slower: float = 1.0, streamer: str = "0.17.0") -> ResultsDir:
    """Every cell passes, every fresh server with the figures bench.core.perf reads: boot time and
    throughput (its RunPerf) and request latency, all `slower` times slower (throughput and
    tokens/s as many times lower), each repeat a little off the others (JITTER)."""
    results = create(root, run_id, matrix(repeats=repeats))
    fingerprint(results, "img", runai_model_streamer=streamer)
    for fmt in ("safetensors", "runai_streamer"):
        for repeat in range(1, repeats + 1):
            f = slower * JITTER[(repeat - 1) % len(JITTER)]
            tokens = len(PROMPTS) * len(GOOD_IDS)
            perf = RunPerf(boot_s=40.0 * f, output_tokens=tokens, throughput_tok_s=tokens / (1.5 * f))
            add_run(_WithPerf(results, perf), f"m__{fmt}__cpu__img", repeat, boot_s=40.0 * f, latency_s=0.5 * f)
    return results


def releases(root: Path, run_id: str, images: dict[str, str], failing: tuple[str, ...] = (), repeats: int = 2,
             knobs: tuple[str, ...] = (), streamer: str = "0.17.0") -> ResultsDir:
    """One image per vLLM release in one run (image name -> the vLLM version its fingerprint
    reports), as a release manager's matrix has them. The runai_streamer cell of each image in
    `failing` returns the seed bug's output; the others pass. `knobs`: an invariance block with
    them (on the baseline cells, safetensors), each knob's cell answering as its original."""
    spec = matrix(tuple(images), repeats)
    if knobs:
        spec["invariance"] = [{"knobs": list(knobs)}]
    results = create(root, run_id, spec)
    for image, vllm in images.items():
        fingerprint(results, image, vllm=vllm, runai_model_streamer=streamer)
        cells = [f"m__safetensors__cpu__{image}", f"m__runai_streamer__cpu__{image}",
                 *(f"m__safetensors__cpu__{image}+{k}" for k in knobs)]
        for cell in cells:
            for repeat in range(1, repeats + 1):
                if image in failing and "__runai_streamer__" in cell:
                    add_run(results, cell, repeat, ids=[0] * 128, text="")
                else:
                    add_run(results, cell, repeat)
    return results
