"""The I/O edge of reporting: read a results folder's records (and a few KB of server logs around
findings), derive the summary, render every report file, write them.

The JSONL files stay the source of truth; everything written here can be regenerated from them
with `regbench report DIR`. The runner calls write_reports at the end of a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bench.core.compare import Side, side_from_records
from bench.core.config import Comparison
from bench.core.diagnosis import Diagnosis
from bench.core.judge import Reason, judge, unexpected_exit_episodes
from bench.core.records import LogExcerpt, RunRecord, Summary
from bench.report.model import Report
from bench.report.summary import render_all
from bench.store.evidence import diagnose_results
from bench.store.results import ResultsDir, ResultsError, read_log_bytes

# Run-level findings whose evidence is in the server log.
_LOG_REASONS = {Reason.BOOT_FAILED, Reason.BOOT_TIMEOUT, Reason.SERVER_DIED, Reason.EXIT_EXCEPTION, Reason.EXIT_CODE}
EXCERPTS_PER_CELL = 5
BEFORE_BYTES, AFTER_BYTES = 1024, 3072  # what is embedded: at most 4 KB per run
SEARCH_BYTES = 256 * 1024  # how much of the shutdown phase is searched for the episode


def _trim_to_lines(data: bytes, cut_head: bool, cut_tail: bool) -> tuple[bytes, int]:
    """The window without the half lines (and half UTF-8 characters) a cut leaves; and how many
    bytes came off its head."""
    head = 0
    if cut_head and b"\n" in data:
        head = data.index(b"\n") + 1
        data = data[head:]
    if cut_tail and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data, head


def log_excerpt(results_path: Path, run: RunRecord, reasons: set[Reason]) -> LogExcerpt | None:
    """A few KB of the run's server.log around its first log-evidenced finding, or None;
    `reasons`: the run's, as judged."""
    if not reasons & _LOG_REASONS:
        return None
    path = (results_path / run.server.log_path).resolve()
    # The path comes from a record; never read outside the results folder because of one.
    if not path.is_relative_to(results_path.resolve()) or not path.is_file():
        return None
    size = path.stat().st_size
    start: int | None = None
    end = size
    at_byte: int | None = None
    why = ""
    if Reason.EXIT_EXCEPTION in reasons:
        stop = run.server.stop_requested_at_byte or 0
        data = read_log_bytes(path, stop, SEARCH_BYTES)
        # surrogateescape keeps a character index convertible back into an exact byte offset.
        text = data.decode("utf-8", errors="surrogateescape")
        episodes = unexpected_exit_episodes(text)
        if episodes:
            # The episode's first two lines (the message before a traceback, and its opener) are
            # specific enough to find it again; one line alone may be a repeated log line.
            head_lines = episodes[0].splitlines()
            at = text.find("\n".join(head_lines[:2]))
            if at < 0:
                at = text.find(head_lines[0])
            if at >= 0:
                at_byte = stop + len(text[:at].encode("utf-8", errors="surrogateescape"))
                start, end = max(0, at_byte - BEFORE_BYTES), min(size, at_byte + AFTER_BYTES)
                why = "first unexpected exit-time episode"
    if start is None:
        # Boot failures, deaths and exit codes: the evidence is where the log stops.
        start, end = max(0, size - BEFORE_BYTES - AFTER_BYTES), size
        why = "end of the log"
    data, head = _trim_to_lines(read_log_bytes(path, start, end - start), cut_head=start > 0, cut_tail=end < size)
    first = start + head
    focus = None
    if at_byte is not None and first <= at_byte <= first + len(data):
        # at_byte is a line start, so the prefix decodes on its own.
        focus = len(data[: at_byte - first].decode("utf-8", errors="replace"))
    return LogExcerpt(
        cell_id=run.cell_id, repeat=run.repeat, log_path=run.server.log_path, start_byte=first,
        end_byte=first + len(data), text=data.decode("utf-8", errors="replace"), why=why, focus=focus,
    )


def log_excerpts(results_path: Path, runs: list[RunRecord], summary: Summary) -> list[LogExcerpt]:
    judged = {(c.cell_id, r.repeat): set(r.reasons) for c in summary.cells for r in c.run_results}
    out: list[LogExcerpt] = []
    per_cell: dict[str, int] = {}
    for run in sorted(runs, key=lambda r: (r.cell_id, r.repeat)):
        if per_cell.get(run.cell_id, 0) >= EXCERPTS_PER_CELL:
            continue
        excerpt = log_excerpt(results_path, run, judged.get((run.cell_id, run.repeat), set()))
        if excerpt is not None:
            out.append(excerpt)
            per_cell[run.cell_id] = per_cell.get(run.cell_id, 0) + 1
    return out


def _write_atomic(path: Path, text: str) -> None:
    # A CI step reading the folder while a report is regenerated sees the old file or the new one.
    # open() rather than mkstemp: the file gets the umask's mode (mkstemp's is 0600).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Published:
    """What reporting derived from a results folder and wrote: the verdicts, the diagnosis of the
    failing cells, and the files."""

    summary: Summary
    diagnosis: Diagnosis
    files: dict[str, Path]


def write_reports(results: ResultsDir, summary: Summary) -> Published:
    """Writes summary.json, summary.md, junit.xml, report.html and diagnosis.json from the folder
    as loaded (ResultsDir.load) and its summary."""
    data = results.data
    diagnosis = diagnose_results(results.path, data.config, summary, data.runs, data.requests, data.fingerprints)
    files = render_all(Report.of(summary, data.runs, data.requests, data.fingerprints,
                                 log_excerpts(results.path, data.runs, summary), diagnosis, data.jobs))
    written = {}
    for name, text in files.items():
        # The records and logs are redacted already; this covers what a report adds of its own.
        _write_atomic(results.path / name, results.redactor.text(text))
        written[name] = results.path / name
    return Published(summary=summary, diagnosis=diagnosis, files=written)


def open_results(path: Path) -> ResultsDir:
    results = ResultsDir(path)
    if not (results.path / "config.yaml").is_file():
        raise ResultsError(f"{results.path}: not a regbench results directory (no config.yaml)")
    return results


def regenerate(path: Path, comparison: Comparison | None = None) -> Published:
    """`regbench report DIR`: judge the folder again and rewrite every report file;
    `comparison`: a rule to judge by instead of each cell's own."""
    results = open_results(path)
    return write_reports(results, judge(results.load(), comparison))


def load_side(path: Path, comparison: Comparison | None = None) -> Side:
    """One results folder, re-judged from its records, as one side of `regbench compare`."""
    data = open_results(path).load()
    summary = judge(data, comparison)
    rule = comparison or data.config.comparison
    sampled = frozenset(p.id for p in data.config.workload.prompts if p.sampling is not None) \
        if rule.mode != "exact" else frozenset()
    return side_from_records(str(path), summary.cells, data.runs, data.requests, data.fingerprints, sampled)
