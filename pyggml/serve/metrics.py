"""/metrics: the engine's counters in Prometheus' text format (prometheus_client), with llama-server's names.

Counters (`llamacpp:<name>_total`): prompt_tokens (evaluated, the cached ones apart), prompt_tokens_cached,
prompt_seconds (the slots' seconds from taking a request to its prompt's end), tokens_predicted,
tokens_predicted_seconds (from a prompt's end to its request's), n_decode (decode steps). Gauges:
prompt_tokens_seconds and predicted_tokens_seconds (tokens/s over the window since the previous scrape, as
llama-server averages them), requests_processing (busy slots), requests_deferred (waiting for a slot),
n_busy_slots_per_decode, and n_tokens_max (the largest prompt + answer seen; llama-server types it a counter
without the `_total` a Prometheus counter's name takes, so it is a gauge here, under its name).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "llamacpp:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # llama-server's (the Prometheus text format)


class EngineCollector(Collector):
    """A prometheus_client collector reading an `Engine`'s counters at each scrape."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.lock = threading.Lock()  # the window of the throughput gauges moves once per scrape
        self.window = self._totals()

    def _totals(self) -> tuple[int, float, int, float]:
        e = self.engine
        return e.prompt_tokens, e.prompt_seconds, e.predicted_tokens, e.predicted_seconds

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        with self.lock:
            now = self._totals()
            prompt_rate = _rate(now[0] - self.window[0], now[1] - self.window[1])
            predicted_rate = _rate(now[2] - self.window[2], now[3] - self.window[3])
            self.window = now
        counters = (
            ("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", e.prompt_tokens),
            ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", e.prompt_tokens_cached),
            ("prompt_seconds", "Total time spent processing prompts", e.prompt_seconds),
            ("tokens_predicted", "Number of generation tokens processed", e.predicted_tokens),
            ("tokens_predicted_seconds", "Total time spent generating tokens", e.predicted_seconds),
            ("n_decode", "Total number of decode steps", e.n_steps),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(PREFIX + name, text, value=float(value))
        busy = e.busy_slots()
        gauges = (
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", e.n_tokens_max),
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", prompt_rate),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s", predicted_rate),
            ("requests_processing", "Number of requests processing", busy),
            ("requests_deferred", "Number of requests deferred", e.waiting()),
            ("n_busy_slots_per_decode", "Average number of busy slots per decode step",
             e.busy_slot_steps / max(e.n_steps, 1)),
        )
        for name, text, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, text, value=float(value))


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


class Metrics:
    """The registry /metrics renders: the engine's collector alone."""

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
