"""Performance figures and slowdown checks: the statistics on made-up per-run values, the boot
phases on recorded real vLLM logs, the server counters on recorded real /metrics text, the
memory sampler on a real process tree, and the reports."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.core.judge import judge_server_counters
from bench.core.logfacts import log_facts
from bench.core.perf import (
    METRICS,
    MIN_RUNS,
    bootstrap_median_ci,
    bootstrap_ratio_ci,
    cell_perf,
    percentile,
    run_perf,
    run_values,
    slowdown,
)
from bench.core.records import RequestRecord, RunPerf, RunRecord, ServerMetrics, ServerOutcome
from bench.core.verdicts import Reason
from bench.report.perf import perf_markdown, strip_svg
from bench.serve.memory import PeakSampler, parse_compute_apps, rss_of_tree
from bench.serve.metrics import delta, parse

DATA = Path(__file__).parent / "data"
LOGS = DATA / "logs"


def test_percentiles_interpolate_like_numpy():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([10], 0.9) == 10
    assert percentile([1, 2, 3, 4, 5], 0.9) == pytest.approx(4.6)


def test_bootstrap_intervals_are_reproducible_and_bracket_the_estimate():
    xs = [10.0, 11.0, 9.5, 10.4, 10.2]
    lo, hi = bootstrap_median_ci(xs)
    assert lo <= statistics.median(xs) <= hi and bootstrap_median_ci(xs) == (lo, hi)
    assert bootstrap_median_ci([1.0]) is None
    rlo, rhi = bootstrap_ratio_ci(xs, [2 * x for x in xs])
    assert 1.7 < rlo <= 2.0 <= rhi < 2.3


@pytest.mark.parametrize(("a", "b", "verdict"), [
    ([30.0, 31.0, 29.5, 30.5], [45.0, 46.0, 44.0, 47.0], "slower"),  # ×1.5, tight
    ([30.0, 31.0, 29.5, 30.5], [30.2, 30.9, 29.8, 30.1], "same"),
    ([30.0, 31.0, 29.5, 30.5], [20.0, 19.0, 21.0, 20.5], "faster"),
    ([30.0, 31.0, 29.5, 30.5], [25.0, 45.0, 30.0, 41.0], "cannot tell"),  # wide: straddles ×1.2
    ([30.0, 31.0], [60.0, 61.0], "cannot tell"),  # too few runs, however clear
])
def test_the_slowdown_rule(a, b, verdict):
    check = slowdown("boot_s", a, b)
    assert check is not None and check.verdict == verdict
    if verdict == "cannot tell":
        assert "not enough repeats to tell" in check.text()
    if len(a) < MIN_RUNS:
        assert f"{MIN_RUNS} needed" in check.text()


def test_a_rate_is_worse_when_it_falls():
    check = slowdown("throughput_tok_s", [600.0, 610.0, 605.0], [300.0, 310.0, 305.0])
    assert check is not None and check.verdict == "slower" and check.ratio == pytest.approx(605 / 305)
    assert slowdown("throughput_tok_s", [600.0, 610.0, 605.0], [600.0, 611.0, 604.0]).verdict == "same"


def test_a_threshold_can_be_given_per_metric():
    a, b = [30.0, 31.0, 29.5, 30.5], [36.0, 36.5, 35.5, 36.2]  # ×1.19
    assert slowdown("boot_s", a, b).verdict != "slower"
    assert slowdown("boot_s", a, b, threshold=1.1).verdict == "slower"


def request(repeat: int, prompt: str, latency: float, ttft: float | None = None, itl=None, tokens: int = 4) -> RequestRecord:
    return RequestRecord(cell_id="c", repeat=repeat, prompt_id=prompt, api="completion", stream=ttft is not None,
                         started_at=0.0, latency_s=latency, status=200, text="x", token_ids=list(range(tokens)),
                         completion_tokens=tokens, finish_reason="length", ttft_s=ttft, itl_s=itl)


def run(repeat: int, boot: float, throughput: float = 100.0) -> RunRecord:
    outcome = ServerOutcome(command=["vllm"], port=1, log_path="x", started_at=0.0, boot_s=boot)
    return RunRecord(cell_id="c", repeat=repeat, server=outcome,
                     perf=RunPerf(boot_s=boot, throughput_tok_s=throughput, peak_rss_bytes=2**30))


def test_request_metrics_count_per_run_and_pool_for_percentiles():
    runs = [run(1, 30.0), run(2, 32.0), run(3, 31.0)]
    reqs = [request(r, p, lat, ttft=lat / 10, itl=[0.01, 0.02]) for r in (1, 2, 3)
            for p, lat in (("a", 1.0 * r), ("b", 3.0 * r))]
    values = run_values(runs, reqs)
    assert values["latency_s"] == [2.0, 4.0, 6.0]  # one median per run
    assert values["boot_s"] == [30.0, 32.0, 31.0]
    perf = cell_perf(runs, reqs)
    assert perf["latency_s"].samples == 6 and perf["latency_s"].runs == 3
    assert perf["itl_s"].samples == 12 and perf["itl_s"].p50 == pytest.approx(0.015)
    assert perf["boot_s"].run_median == 31.0 and perf["boot_s"].run_median_ci is not None
    text = "\n".join(perf_markdown([_cell(perf)]))
    assert "## Performance" in text and "31.0 s" in text and "1.00 GiB" in text


def _cell(perf):
    from bench.core.records import CellSummary
    return CellSummary(cell_id="c", model="m", load_format="f", platform="p", image="i", baseline_id=None,
                       runs=3, failures=0, verdict="pass", reasons={}, perf=perf)


def test_boot_phases_and_load_time_from_recorded_logs():
    safetensors = log_facts((LOGS / "vllm-0.32-safetensors-healthy.log").read_text())
    phases = safetensors.phases
    assert list(phases) == ["engine_start", "load_start", "weights_loaded", "kv_cache", "engine_ready", "server_ready"]
    assert all(a <= b for a, b in zip(phases.values(), list(phases.values())[1:]))
    outcome = ServerOutcome(command=["v"], port=1, log_path="x", started_at=0.0, boot_s=40.0, peak_memory_bytes=5)
    perf = run_perf(outcome, safetensors, [request(1, "a", 1.0, tokens=128)], 2.0, None, 2_000_000_000)
    assert perf.weights_load_s == safetensors.weights_load_s == 0.01 and perf.load_gb_s == pytest.approx(200.0)
    assert perf.throughput_tok_s == 64.0 and perf.peak_rss_bytes == 5
    # runai_streamer logs no "Loading weights took": the streamer's bar (272 tensors at 211.70 it/s) gives it.
    runai = log_facts((LOGS / "vllm-0.32-runai-0.17.0-healthy.log").read_text())
    assert runai.weights_load_s is None
    assert run_perf(outcome, runai, [], None, None, None).weights_load_s == pytest.approx(272 / 211.70)


def test_server_counters_from_recorded_metrics_text():
    before = parse((DATA / "metrics" / "vllm-0.32-before.txt").read_text())
    after = parse((DATA / "metrics" / "vllm-0.32-after.txt").read_text())
    counters = delta(before, after)
    # The recording: two completions of 16 and 8 forced tokens (min_tokens = max_tokens).
    assert counters.generation_tokens == 24 and counters.requests == 2
    assert counters.prompt_tokens is not None and counters.prompt_tokens > 0
    assert counters.preemptions == 0


def test_a_counter_mismatch_is_a_finding_only_when_every_request_was_answered():
    reqs = [request(1, "a", 1.0, tokens=128), request(1, "b", 1.0, tokens=128)]
    assert judge_server_counters(ServerMetrics(generation_tokens=256), reqs) == []
    [finding] = judge_server_counters(ServerMetrics(generation_tokens=300), reqs)
    assert finding.reason == Reason.TOKEN_COUNT_MISMATCH
    assert "300 generated tokens over 2 requests, the client received 256" in finding.evidence.text()
    failed = reqs[0].model_copy(update={"error_kind": "timeout", "token_ids": None})
    assert judge_server_counters(ServerMetrics(generation_tokens=300), [failed, reqs[1]]) == []
    assert judge_server_counters(ServerMetrics(error="ConnectError"), reqs) == []


def test_gpu_memory_of_the_servers_processes_from_nvidia_smi_csv():
    # `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`: GPU hosts only.
    text = "4242, 70312\n4243, 1024\n999, 500\n"
    assert parse_compute_apps(text, {4242, 4243}) == (70312 + 1024) * 2**20
    assert parse_compute_apps(text, {1}) is None
    assert parse_compute_apps("No running processes found\n", {4242}) is None


def test_peak_memory_of_a_real_process_tree():
    # A parent that starts a child holding ~64 MiB: the tree's resident memory includes it.
    child = "import time; b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time; "
                             f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"],
                            start_new_session=True)
    try:
        sampler = PeakSampler(lambda: (rss_of_tree(proc.pid), None)).start()
        deadline = time.monotonic() + 20
        while (sampler.peak_host or 0) < 64 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.1)
        sampler.stop()
        assert sampler.peak_host is not None and sampler.peak_host >= 64 * 2**20
    finally:
        import os
        import signal
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_strip_plots_have_a_row_per_cell_and_a_dot_per_sample():
    svg = strip_svg("TTFT", "s", [("cell-a", [0.05, 0.06, 0.07]), ("cell-b", [0.2])])
    assert svg.count("<circle") == 4 and "cell-a" in svg and "median" in svg
    assert strip_svg("TTFT", "s", []) == ""
    assert set(METRICS) >= {"boot_s", "ttft_s", "itl_s", "throughput_tok_s", "peak_rss_bytes"}


def test_strip_plot_labels_keep_the_axes_that_tell_cells_apart():
    from bench.report.perf import LABEL_CHARS, short_labels

    ids = ["tiny-canary__runai_streamer__cpu__streamer-0.16.0", "tiny-canary__safetensors__cpu__streamer-0.16.0",
           "smollm2-135m-instruct__runai_streamer__cpu__streamer-0.17.0-with-a-long-tag"]
    labels = short_labels(ids)
    # The platform is the same on every row: left out. What is left fits, whole where it can.
    assert labels[:2] == ["tiny-canary · runai_streamer · streamer-0.16.0", "tiny-canary · safetensors · streamer-0.16.0"]
    assert len(set(labels)) == 3 and all(len(x) <= LABEL_CHARS for x in labels)
    assert "runai_streamer" in labels[2] and labels[2].startswith("smollm")
    assert short_labels(["m__a__cpu__i", "m__b__cpu__i"]) == ["a", "b"]
    assert short_labels(["only__one"]) == ["only · one"]
    svg = strip_svg("TTFT", "s", [(ids[0], [0.1]), (ids[2], [0.2])])
    assert f"<title>{ids[0]}</title>" in svg
