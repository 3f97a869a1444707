"""Prometheus metrics of one server (its own registry: two servers in one process never share one).

Two sources:
- engine state and totals (requests running / waiting, KV usage, prefix-cache queries and hits,
  preemptions, token counters, speculative-decoding counters, the async-scheduling decision) are
  read at scrape time from the engine loop's last snapshot
  (``tandem.engine.metrics.collect_metrics``) by a custom collector, so they can never drift
  from the engine's own counters;
- per-request latencies (TTFT, TPOT, inter-token latency, end-to-end) are histograms observed when a
  request finishes, on the engine thread (prometheus-client is thread-safe).

Names and labels are vLLM's (``vllm:``, ``model_name``) where vLLM has the metric; tandem's own keep a
``tandem:`` prefix (the async decision, grammar-cut drafts, engine health). Counters get the ``_total`` suffix on
exposition. An aborted request (a client that went away) counts as ``finished_reason="abort"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.engine.async_llm import AsyncLLM
from tandem.engine.output_processor import FrontRequest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_HELP = {
    "vllm:num_requests_running": "Requests in the running batch.",
    "vllm:num_requests_waiting": "Requests waiting to be scheduled (new or preempted).",
    "vllm:kv_cache_usage_perc": "Fraction of KV cache blocks in use (0 to 1).",
    "vllm:prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "vllm:prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "vllm:num_preemptions": "Requests preempted (their KV cache freed and recomputed later).",
    "vllm:prompt_tokens": "Prompt tokens of requests added.",
    "vllm:generation_tokens": "Output tokens committed.",
    "vllm:spec_decode_num_drafts": "Verify steps that carried drafts.",
    "vllm:spec_decode_num_draft_tokens": "Draft tokens verified.",
    "vllm:spec_decode_num_accepted_tokens": "Draft tokens accepted.",
    "tandem:spec_decode_num_invalid_spec_tokens": "Draft tokens cut by a structured-output grammar.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Draft tokens accepted, by draft position.",
    "tandem:spec_decode_verified_drafts_per_step": "Drafts verified per decode step of a request (the speculation policy's choice, as filled).",
    "tandem:async_scheduling_info": "The async scheduling decision: requested, resolved, reason.",
    "vllm:cache_config_info": "The KV cache's configuration, as labels.",
}


class _EngineCollector(Collector):
    def __init__(self, engine: AsyncLLM, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        for m in self.engine.metrics():
            doc = _HELP.get(m.name, m.name)
            names = ["model_name", *m.labels]
            values = [self.model_name, *m.labels.values()]
            if m.kind == "vector":  # one sample per draft position
                vec = CounterMetricFamily(m.name, doc, labels=[*names, "position"])
                for pos, value in enumerate(m.values):
                    vec.add_metric([*values, str(pos)], value)
                yield vec
            elif m.kind == "histogram":  # the values 0, 1, ... counted
                hist = HistogramMetricFamily(m.name, doc, labels=names)
                cumulative = [(str(float(i)), float(c)) for i, c in getattr(m, "buckets").items()]
                hist.add_metric(values, [*cumulative, ("+Inf", m.value)], getattr(m, "sum"))
                yield hist
            elif m.kind == "counter":
                counter = CounterMetricFamily(m.name, doc, labels=names)
                counter.add_metric(values, m.value)
                yield counter
            else:
                gauge = GaugeMetricFamily(m.name, doc, labels=names)
                gauge.add_metric(values, m.value)
                yield gauge
        health = GaugeMetricFamily(
            "tandem:engine_healthy", "1 while the engine runs.", labels=["model_name"]
        )
        health.add_metric([self.model_name], 1.0 if self.engine.healthy else 0.0)
        yield health


def _histogram(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...], model: str
) -> Any:
    return Histogram(
        name, doc, labelnames=["model_name"], buckets=buckets, registry=registry
    ).labels(model)


class ServerMetrics:
    def __init__(self, engine: AsyncLLM, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine, model_name))
        self.model_name = model_name
        r = self.registry
        self.ttft = _histogram(
            r, "vllm:time_to_first_token_seconds", "Time to the first output token.",
            _LATENCY_BUCKETS, model_name,
        )  # fmt: skip
        self.tpot = _histogram(
            r, "vllm:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.", _TOKEN_BUCKETS, model_name,
        )  # fmt: skip
        self.itl = _histogram(
            r, "vllm:inter_token_latency_seconds",
            "Time between consecutive deliveries of output (one speculative step delivers "
            "several tokens).", _TOKEN_BUCKETS, model_name,
        )  # fmt: skip
        self.e2e = _histogram(
            r, "vllm:e2e_request_latency_seconds", "Arrival to last token.", _LATENCY_BUCKETS,
            model_name,
        )  # fmt: skip
        # The request's phases, as vLLM names them (RequestMetrics: queue, prefill, decode, inference).
        self.phases = {
            phase: _histogram(r, f"vllm:request_{phase}_time_seconds", doc, _LATENCY_BUCKETS, model_name)
            for phase, doc in (
                ("queue", "Arrival to the first admission by the scheduler."),
                ("prefill", "First admission to the first output token."),
                ("decode", "First to last output token."),
                ("inference", "First admission to the last output token."),
            )
        }
        self.success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason.",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )
        engine.finish_listeners.append(self.observe_finished)

    def observe_finished(self, fr: FrontRequest) -> None:
        m = fr.metrics
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.tpot is not None:
            self.tpot.observe(m.tpot)
        for earlier, later in zip(m.token_times, m.token_times[1:]):
            self.itl.observe(later - earlier)
        if m.finished_time is not None:
            self.e2e.observe(m.finished_time - m.arrival_time)
        for phase, hist in self.phases.items():
            value = getattr(m, f"{phase}_time")
            if value is not None:
                hist.observe(value)
        self.success.labels(self.model_name, fr.finish_reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
