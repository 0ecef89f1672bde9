"""The judge: pure functions from records to findings and verdicts. No I/O here.

What it can find, and the evidence each finding carries, is the taxonomy (bench.core.taxonomy,
docs/judged.md). One module per step, in the order of the data: an answer (requests), its twins
(twins), its server (server, exit_scan), a run (runs, progress), the baseline a cell is compared
with (baseline), a cell over its repeats (cells), and every cell of a results folder (summary:
judge, the one place findings and verdicts are made).
"""

from bench.core.judge.baseline import Baseline, baseline_of, reference_outputs, set_aside_key, set_aside_unconfirmed
from bench.core.judge.cells import apply_cell_checks, divergence, exit_code, judge_cell, reference_drift
from bench.core.judge.exit_scan import (
    BENIGN_SHUTDOWN_NOISE,
    exit_time_episodes,
    is_benign,
    unexpected_exit_episodes,
    without_benign_episodes,
)
from bench.core.judge.progress import RunMark, run_counts, run_mark
from bench.core.judge.requests import judge_request, stream_text_differs
from bench.core.judge.runs import LOG_ONLY_REASONS, judge_run, observed, own_findings, run_findings
from bench.core.judge.server import judge_reference, judge_server, judge_server_counters
from bench.core.judge.summary import judge
from bench.core.judge.twins import judge_twins
from bench.core.verdicts import Finding, Reason

__all__ = [
    "BENIGN_SHUTDOWN_NOISE", "LOG_ONLY_REASONS", "Baseline", "Finding", "Reason", "RunMark", "apply_cell_checks",
    "baseline_of", "divergence", "exit_code", "exit_time_episodes", "is_benign", "judge", "judge_cell",
    "judge_reference", "judge_request", "judge_run", "judge_server", "judge_server_counters", "judge_twins",
    "observed", "own_findings", "reference_drift", "reference_outputs", "run_counts", "run_findings",
    "run_mark", "set_aside_key", "set_aside_unconfirmed", "stream_text_differs", "unexpected_exit_episodes",
    "without_benign_episodes",
]
