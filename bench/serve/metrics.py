"""The server's own view: its Prometheus /metrics, scraped around the workload.

vLLM's counters say what the engine did (tokens generated, requests finished, preemptions); the
client's records say what arrived. The seed issue's engine generated its ~128 tokens per request
while every text was empty, so the two must be read side by side (the judge's `token_count_mismatch`).
Parsed with prometheus_client's own text parser; counters of every label set (model, engine,
finished_reason) are summed.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.core.records import ServerMetrics

TIMEOUT_S = 10.0
# name as the parser reports the family (counters lose "_total") -> ServerMetrics field
COUNTERS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:request_success": "requests",
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}
GAUGES = {"vllm:kv_cache_usage_perc": "kv_cache_usage"}


class ScrapeError(RuntimeError):
    pass


def parse(text: str) -> dict[str, float]:
    """Summed counter totals and gauge values by ServerMetrics field."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        field = COUNTERS.get(family.name) if family.type == "counter" else GAUGES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # the _created timestamps
            out[field] = out.get(field, 0.0) + sample.value
    return out


def scrape(base_url: str) -> dict[str, float]:
    try:
        response = httpx.get(f"{base_url}/metrics", timeout=TIMEOUT_S)
        response.raise_for_status()
        return parse(response.text)
    except (httpx.HTTPError, ValueError) as exc:
        raise ScrapeError(f"{type(exc).__name__}: {exc}") from None


def delta(before: dict[str, float], after: dict[str, float]) -> ServerMetrics:
    fields: dict[str, float | None] = {}
    for field in COUNTERS.values():
        fields[field] = after[field] - before.get(field, 0.0) if field in after else None
    for field in GAUGES.values():
        fields[field] = after.get(field)
    return ServerMetrics(**fields)
