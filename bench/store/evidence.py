"""The I/O edge of diagnosis: gather, per failing cell, what bench.core.diagnosis reasons over —
its server logs (read here, facts taken by bench.core.logfacts), the pre-flight, fingerprints and
the matrix contrast — and run the signature library over it."""

from __future__ import annotations

from pathlib import Path

from bench.core.conditions import CellEvidence
from bench.core.config import Config
from bench.core.contrast import contrast
from bench.core.diagnosis import Diagnosis, diagnose, load_signatures
from bench.core.judge import without_benign_episodes
from bench.core.logfacts import log_facts
from bench.core.matrix import Cell, expand, matrix_image
from bench.core.records import Fingerprint, PreflightRecord, RequestRecord, RunRecord, Summary
from bench.store.results import read_log_bytes

LOG_BYTES = 512 * 1024  # per run: the end of a longer log (where loading and failures are)


def _log(results_path: Path, run: RunRecord) -> str:
    """The end of a run's server log, without what the judge knows to be the noise of a normal
    shutdown (bench.core.judge.is_benign, over the episodes after the stop request): it is not
    evidence of anything, whether or not a passing cell's server happened to print it too. Before
    the stop request nothing is dropped: an EngineDeadError while the server was serving is its
    engine dying."""
    path = (results_path / run.server.log_path).resolve()
    if not path.is_relative_to(results_path.resolve()) or not path.is_file():
        return ""
    size = path.stat().st_size
    start = max(0, size - LOG_BYTES)
    stop = run.server.stop_requested_at_byte
    cut = size if stop is None else min(size, max(start, stop))
    before = read_log_bytes(path, start, cut - start).decode("utf-8", errors="replace")
    after = read_log_bytes(path, cut, size - cut).decode("utf-8", errors="replace")
    return before + without_benign_episodes(after)


def _after_stop(results_path: Path, run: RunRecord, lines: int = 5) -> list[str]:
    """The last lines a server printed after the stop request (a server that had to be killed:
    what it was doing instead of exiting), less the noise of a normal shutdown."""
    path = (results_path / run.server.log_path).resolve()
    stop = run.server.stop_requested_at_byte
    if stop is None or not path.is_relative_to(results_path.resolve()) or not path.is_file():
        return []
    size = path.stat().st_size
    start = max(stop, size - 64 * 1024)
    text = without_benign_episodes(read_log_bytes(path, start, size - start).decode("utf-8", errors="replace"))
    return [line.strip()[:240] for line in text.splitlines() if line.strip()][-lines:]


def _healthy_logs(results_path: Path, summary: Summary, runs: list[RunRecord], most: int = 8) -> list[str]:
    """Whole logs of the passing cells' runs (at most `most` of them): what a healthy server prints."""
    passing = {c.cell_id for c in summary.cells if not c.verdict.failing}
    out: list[str] = []
    for r in runs:
        path = (results_path / r.server.log_path).resolve()
        if r.cell_id in passing and path.is_relative_to(results_path.resolve()) and path.is_file() and len(out) < most:
            size = path.stat().st_size
            start = max(0, size - LOG_BYTES)
            out.append(read_log_bytes(path, start, size - start).decode("utf-8", errors="replace"))
    return out


def gather(
    results_path: Path, config: Config, summary: Summary, runs: list[RunRecord], requests: list[RequestRecord],
    fingerprints: list[Fingerprint],
) -> list[CellEvidence]:
    cells = {c.id: c for c in expand(config)}
    contrasts = {c.cell_id: c for c in contrast(summary.cells, fingerprints)}
    prints = {f.image: f for f in fingerprints}  # an image's last fingerprint wins
    preflights: list[PreflightRecord] = summary.preflight
    healthy = _healthy_logs(results_path, summary, runs)
    healthy_facts = [log_facts(t) for t in healthy]
    out = []
    for s in summary.cells:
        cell = cells.get(s.cell_id)
        if cell is None or not s.verdict.failing:
            continue
        judged = sorted((r for r in runs if r.cell_id == s.cell_id and not r.interrupted), key=lambda r: r.repeat)
        texts = [_log(results_path, r) for r in judged]
        profile = cell.profile
        env = {**profile.env, **cell.server.env, **cell.image.env, **cell.load_format.env,
               **(cell.knob.env if cell.knob else {})}
        short = [q.finish_reason or "" for q in requests if q.cell_id == s.cell_id and q.completion_tokens is not None
                 and q.completion_tokens < cell.workload.min_tokens]
        out.append(CellEvidence(
            cell=s, vllm_load_format=cell.load_format.vllm_format, env=env, contrast=contrasts.get(s.cell_id),
            logs=[log_facts(t) for t in texts], log_text="\n".join(texts),
            healthy_logs=healthy_facts, healthy_log_text="\n".join(healthy),
            prefix_cache_hits=[r.perf.metrics.prefix_cache_hits if r.perf and r.perf.metrics else None for r in judged],
            shutdown_timeout_s=cell.server.shutdown_timeout_s,
            after_stop={r.repeat: _after_stop(results_path, r) for r in judged if r.server.killed},
            fingerprint=prints.get(matrix_image(cell.image.name)),
            inspect=next((p for p in preflights if p.kind == "inspect" and p.model == cell.model.name), None),
            audit=next((p for p in preflights if p.kind == "audit" and p.model == cell.model.name
                        and p.image == matrix_image(cell.image.name) and p.load_format == cell.load_format.name), None),
            short_finish_reasons=short, stream_twins=_stream_twins(cell, [q for q in requests if q.cell_id == s.cell_id]),
            findings=[f for r in s.run_results for f in r.findings],  # as the verdict found them
            command_vars={"model": cell.model.path, "python": cell.image.python,
                          "pythonpath": " ".join(cell.image.pythonpath) or "''", "cell": cell.id,
                          "where": _audit_where(cell)},
        ))
    return out


def diagnose_results(
    results_path: Path, config: Config, summary: Summary, runs: list[RunRecord], requests: list[RequestRecord],
    fingerprints: list[Fingerprint],
) -> Diagnosis:
    evidence = gather(results_path, config, summary, runs, requests, fingerprints)
    return diagnose(evidence, load_signatures(*(Path(d) for d in config.signatures)))


def _stream_twins(cell: Cell, requests: list[RequestRecord]) -> dict[str, list[str]]:
    """Each prompt the cell's requests streamed (a knob may have turned that around): the prompts
    of the same request (Prompt.content) it sent whole."""
    content = {p.id: p.content() for p in cell.workload.prompts}
    whole = {q.prompt_id for q in requests if not q.stream}
    return {p: sorted(w for w in whole if content.get(w) is not None and content.get(w) == content.get(p))
            for p in sorted({q.prompt_id for q in requests if q.stream})}


def _audit_where(cell: Cell) -> str:
    """Where `regbench audit` reproduces a cell's loading: in a container of its image, or with
    the image's Python and overlay on this host."""
    if cell.image.ref is not None:
        return f"--image {cell.image.ref}"
    return f"--python {cell.image.python}" + (f" --pythonpath {' '.join(cell.image.pythonpath)}"
                                               if cell.image.pythonpath else "")
