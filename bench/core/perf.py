"""Performance figures per cell and slowdown checks between two runs. Pure: records in, figures out.

Each repeat of a cell is a fresh server, so the unit of evidence is the run: a request-level
metric (TTFT, inter-token latency, end-to-end latency, tokens/s) enters the statistics as each
run's median, and a run-level one (boot time, weight loading, throughput, peak memory) as is.
The figures shown pool every sample (percentiles over all requests); the confidence intervals
resample runs, never requests, because requests on one server share its fate.

A slowdown check compares one metric of two matched cells by the ratio of their medians, oriented
so that > 1 is worse (B/A for times and memory, A/B for rates), with a bootstrap 95 % interval
over the runs of both sides:

    slower       the whole interval lies above the metric's threshold: a regression
    faster       the whole interval lies below 1/threshold
    same         the whole interval lies between 1/threshold and the threshold
    cannot tell  the interval straddles a threshold (too few or too noisy repeats), or a side has
                 fewer than MIN_RUNS runs with the metric: "not enough repeats to tell"

The percentile bootstrap is too narrow with very few runs, hence MIN_RUNS.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from bench.core.config import ConfigError
from bench.core.logfacts import LogFacts
from bench.core.records import MetricSummary, Record, RequestRecord, RunPerf, RunRecord, ServerMetrics, ServerOutcome

MIN_RUNS = 3
BOOTSTRAP = 2000
SEED = 0


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str  # "s", "GB/s", "tok/s", "bytes"
    worse: Literal["higher", "lower"]
    threshold: float  # default slowdown threshold (ratio, > 1)
    per_run: Callable[[RunRecord, list[RequestRecord]], list[float]]  # the samples one run gives


def _ok(reqs: list[RequestRecord]) -> list[RequestRecord]:
    return [q for q in reqs if q.error_kind is None]


def _perf(attr: str) -> Callable[[RunRecord, list[RequestRecord]], list[float]]:
    def get(run: RunRecord, reqs: list[RequestRecord]) -> list[float]:
        value = getattr(run.perf, attr, None) if run.perf is not None else None
        return [] if value is None else [float(value)]
    return get


METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("boot_s", "boot", "s", "higher", 1.2, _perf("boot_s")),
    Metric("weights_load_s", "weights load", "s", "higher", 1.25, _perf("weights_load_s")),
    Metric("load_gb_s", "load throughput", "GB/s", "lower", 1.25, _perf("load_gb_s")),
    Metric("engine_init_s", "engine init", "s", "higher", 1.25, _perf("engine_init_s")),
    Metric("ttft_s", "TTFT", "s", "higher", 1.2,
           lambda run, reqs: [q.ttft_s for q in _ok(reqs) if q.ttft_s is not None]),
    Metric("itl_s", "ITL", "s", "higher", 1.2,
           lambda run, reqs: [gap for q in _ok(reqs) for gap in q.itl_s or []]),
    Metric("latency_s", "latency", "s", "higher", 1.2, lambda run, reqs: [q.latency_s for q in _ok(reqs)]),
    Metric("tokens_per_s", "tok/s per request", "tok/s", "lower", 1.2,
           lambda run, reqs: [q.tokens_per_s for q in _ok(reqs) if q.tokens_per_s is not None]),
    Metric("throughput_tok_s", "throughput", "tok/s", "lower", 1.2, _perf("throughput_tok_s")),
    Metric("peak_rss_bytes", "peak RSS", "bytes", "higher", 1.1, _perf("peak_rss_bytes")),
    # nvidia-smi's used memory of the server's processes (container pids from the engine); on
    # unified-memory hosts, where it says [N/A], their host memory (bench.serve.memory).
    Metric("peak_gpu_bytes", "peak GPU memory", "bytes", "higher", 1.1, _perf("peak_gpu_bytes")),
]}



def parse_thresholds(pairs: Iterable[str]) -> dict[str, float]:
    """`--threshold METRIC=RATIO` as `regbench compare` and `regbench history` take it: a metric
    of METRICS and a finite ratio above 1 (at 1 or below, noise or a faster run would be called
    slower). A metric given twice takes its last ratio."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            ratio = float(value)
        except ValueError:
            ratio = math.nan
        if not sep or not math.isfinite(ratio) or ratio <= 1:
            raise ConfigError(f"--threshold {pair!r}: expected METRIC=RATIO with RATIO > 1, e.g. ttft_s=1.5")
        if name not in METRICS:
            raise ConfigError(f"--threshold {pair!r}: no metric {name!r}; metrics: {', '.join(METRICS)}")
        out[name] = ratio
    return out


def thresholds_in_effect(thresholds: dict[str, float] | None = None) -> dict[str, float]:
    """Every metric's threshold, the given ones over the defaults."""
    return {name: (thresholds or {}).get(name, m.threshold) for name, m in METRICS.items()}


def threshold_list(thresholds: dict[str, float] | None = None) -> str:
    """`boot_s ×1.2, …`: every metric's threshold in effect."""
    return ", ".join(f"{name} ×{limit:g}" for name, limit in thresholds_in_effect(thresholds).items())

class SlowdownCheck(Record):
    metric: str
    a: float  # median of A's per-run values
    b: float
    ratio: float  # oriented: > 1 is worse in B
    ci: tuple[float, float] | None
    threshold: float
    runs: tuple[int, int]
    verdict: Literal["slower", "faster", "same", "cannot tell"]

    def text(self) -> str:
        m = METRICS[self.metric]
        ci = f" (95 % CI {self.ci[0]:.2f}–{self.ci[1]:.2f})" if self.ci else ""
        why = ""
        if self.verdict == "cannot tell":
            why = (f": not enough repeats to tell ({self.runs[0]} and {self.runs[1]} runs; {MIN_RUNS} needed)"
                   if min(self.runs) < MIN_RUNS else ": not enough repeats to tell (the interval straddles the threshold)")
        return (f"{m.label} {self.verdict}{why}: {fmt(self.a, m.unit)} → {fmt(self.b, m.unit)}, "
                f"×{self.ratio:.2f} worse{ci}, threshold ×{self.threshold:.2f}")


def fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
    return f"{value:.2f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _resample(rng: random.Random, xs: list[float]) -> list[float]:
    return [xs[rng.randrange(len(xs))] for _ in xs]


def bootstrap_median_ci(xs: list[float], n: int = BOOTSTRAP, seed: int = SEED) -> tuple[float, float] | None:
    if len(xs) < 2:
        return None
    rng = random.Random(seed)
    meds = [statistics.median(_resample(rng, xs)) for _ in range(n)]
    return percentile(meds, 0.025), percentile(meds, 0.975)


def bootstrap_ratio_ci(a: list[float], b: list[float], n: int = BOOTSTRAP, seed: int = SEED) -> tuple[float, float] | None:
    """95 % interval of median(b)/median(a), runs of each side resampled independently."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        ma = statistics.median(_resample(rng, a))
        if ma > 0:
            ratios.append(statistics.median(_resample(rng, b)) / ma)
    if not ratios:
        return None
    return percentile(ratios, 0.025), percentile(ratios, 0.975)


def run_values(runs: list[RunRecord], requests: list[RequestRecord]) -> dict[str, list[float]]:
    """Per metric, one value per run that has it (a request-level metric: that run's median)."""
    by_run: dict[int, list[RequestRecord]] = defaultdict(list)
    for q in requests:
        by_run[q.repeat].append(q)
    out: dict[str, list[float]] = {}
    for name, m in METRICS.items():
        values = []
        for run in sorted(runs, key=lambda r: r.repeat):
            if run.interrupted:
                continue
            samples = m.per_run(run, by_run.get(run.repeat, []))
            if samples:
                values.append(statistics.median(samples))
        if values:
            out[name] = values
    return out


def cell_perf(runs: list[RunRecord], requests: list[RequestRecord]) -> dict[str, MetricSummary]:
    by_run: dict[int, list[RequestRecord]] = defaultdict(list)
    for q in requests:
        by_run[q.repeat].append(q)
    per_run = run_values(runs, requests)
    out = {}
    for name, m in METRICS.items():
        pooled = [x for run in runs if not run.interrupted for x in m.per_run(run, by_run.get(run.repeat, []))]
        if not pooled or name not in per_run:
            continue
        values = per_run[name]
        out[name] = MetricSummary(samples=len(pooled), runs=len(values), p50=percentile(pooled, 0.5),
                                  p90=percentile(pooled, 0.9), run_median=statistics.median(values),
                                  run_median_ci=bootstrap_median_ci(values))
    return out


def slowdown(metric: str, a: list[float], b: list[float], threshold: float | None = None) -> SlowdownCheck | None:
    """The check of one metric between two matched cells' per-run values (see the module docstring)."""
    m = METRICS[metric]
    limit = threshold if threshold is not None else m.threshold
    if not a or not b:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    if ma <= 0 or mb <= 0:
        return None
    ci = bootstrap_ratio_ci(a, b)
    if m.worse == "lower":  # a rate: worse is smaller, so A/B
        ratio = ma / mb
        ci = (1 / ci[1], 1 / ci[0]) if ci else None
    else:
        ratio = mb / ma
    if min(len(a), len(b)) < MIN_RUNS or ci is None:
        verdict: Literal["slower", "faster", "same", "cannot tell"] = "cannot tell"
    elif ci[0] > limit:
        verdict = "slower"
    elif ci[1] < 1 / limit:
        verdict = "faster"
    elif ci[0] >= 1 / limit and ci[1] <= limit:
        verdict = "same"
    else:
        verdict = "cannot tell"
    return SlowdownCheck(metric=metric, a=ma, b=mb, ratio=ratio, ci=ci, threshold=limit,
                         runs=(len(a), len(b)), verdict=verdict)


def slowdowns(a: dict[str, list[float]], b: dict[str, list[float]],
              thresholds: dict[str, float] | None = None) -> list[SlowdownCheck]:
    out = []
    for name in METRICS:
        check = slowdown(name, a.get(name, []), b.get(name, []), (thresholds or {}).get(name))
        if check is not None:
            out.append(check)
    return out


def run_perf(outcome: ServerOutcome, facts: LogFacts | None, requests: list[RequestRecord], requests_s: float | None,
             metrics: ServerMetrics | None, checkpoint_bytes: int | None) -> RunPerf:
    """One run's figures from what the runner measured and what the server's log says."""
    load_s = None
    if facts is not None:
        load_s = facts.weights_load_s
        if load_s is None:  # the runai_streamer path logs no "Loading weights took": its bar's time
            load_s = next((p.seconds for p in facts.loaders if not p.short and p.seconds), None)
    tokens = sum(len(q.token_ids or []) for q in requests if q.error_kind is None)
    return RunPerf(
        boot_s=outcome.boot_s, phases=facts.phases if facts else {}, weights_load_s=load_s,
        engine_init_s=facts.engine_init_s if facts else None, checkpoint_bytes=checkpoint_bytes,
        output_tokens=tokens, throughput_tok_s=tokens / requests_s if requests_s and tokens else None,
        metrics=metrics, peak_rss_bytes=outcome.peak_memory_bytes, peak_gpu_bytes=outcome.peak_gpu_bytes,
        memory_source=outcome.memory_source,
    )
