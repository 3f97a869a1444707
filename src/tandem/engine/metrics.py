"""Metric objects read from a live engine: vLLM's names (``vllm:``) where vLLM has the metric, so its dashboards
and alerts read tandem's; ``tandem:`` for tandem's own (the async decision, grammar-cut drafts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.engine.builder import Engine


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    kind: str = "gauge"  # gauge | counter | vector
    labels: dict[str, str] = field(default_factory=dict)
    values: tuple[float, ...] = ()  # for vector metrics (per position)


# vLLM's reader classes (``vllm.v1.metrics.reader``; here also ``tandem.v1.metrics.reader``): scripts test
# ``isinstance(metric, Counter)`` and read ``.value`` / ``.values``.
@dataclass(frozen=True)
class Counter(Metric):
    kind: str = "counter"


@dataclass(frozen=True)
class Gauge(Metric):
    kind: str = "gauge"


@dataclass(frozen=True)
class Vector(Metric):
    kind: str = "vector"


@dataclass(frozen=True)
class Histogram(Metric):
    """Observations of the values 0, 1, 2, ...: ``values[i]`` counts value i; ``value`` is the count."""

    kind: str = "histogram"

    @property
    def count(self) -> int:
        return int(self.value)

    @property
    def sum(self) -> float:
        return float(sum(i * c for i, c in enumerate(self.values)))

    @property
    def buckets(self) -> dict[str, int]:
        """Cumulative counts by upper bound, as vLLM's reader gives them."""
        out, total = {}, 0.0
        for i, c in enumerate(self.values):
            total += c
            out[str(i)] = int(total)
        return out


_CLASSES = {"counter": Counter, "gauge": Gauge, "vector": Vector, "histogram": Histogram}


def collect_metrics(engine: Engine) -> list[Metric]:
    sched = engine.core.scheduler
    c = sched.counters
    pool = sched.kv.pool
    spec = c.spec
    d = engine.plan.decision
    metrics = [
        Metric("vllm:num_requests_running", sched.num_running()),
        Metric("vllm:num_requests_waiting", sched.num_waiting()),
        Metric("vllm:kv_cache_usage_perc", sched.kv.usage),
        Metric("vllm:prefix_cache_queries", pool.stats.queries, "counter"),
        Metric("vllm:prefix_cache_hits", pool.stats.hits, "counter"),
        Metric("vllm:num_preemptions", c.num_preemptions, "counter"),
        Metric("vllm:prompt_tokens", c.num_prompt_tokens, "counter"),
        Metric("vllm:generation_tokens", c.num_generation_tokens, "counter"),
        Metric("vllm:spec_decode_num_drafts", spec.num_drafts, "counter"),
        Metric("vllm:spec_decode_num_draft_tokens", spec.num_draft_tokens, "counter"),
        Metric("vllm:spec_decode_num_accepted_tokens", spec.num_accepted_tokens, "counter"),
        Metric(
            "tandem:spec_decode_num_invalid_spec_tokens", spec.num_invalid_spec_tokens, "counter"
        ),
        Metric(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            float(sum(spec.accepted_per_pos)),
            "vector",
            values=tuple(float(v) for v in spec.accepted_per_pos),
        ),
        Metric(  # what the speculation policy's choices came to: drafts verified per decode step of a request
            "tandem:spec_decode_verified_drafts_per_step",
            float(sum(sched.spec_policy.verified_k)),
            "histogram",
            values=tuple(float(v) for v in sched.spec_policy.verified_k),
        ),
        Metric(
            "vllm:cache_config_info",
            1.0,
            "gauge",
            labels={
                "block_size": str(engine.plan.config.cache.block_size),
                "num_gpu_blocks": str(engine.plan.num_kv_blocks),  # vLLM's label name, whatever the device
                "num_cpu_blocks": "0",
                "enable_prefix_caching": str(engine.plan.config.cache.enable_prefix_caching),
                "cache_dtype": engine.plan.config.model.resolved_dtype(),
            },
        ),
        Metric(
            "tandem:async_scheduling_info",
            1.0,
            "gauge",
            labels={
                "requested": str(d.requested),
                "resolved": str(d.resolved),
                "reason": d.reason.value,
            },
        ),
    ]
    return [_CLASSES[m.kind](m.name, m.value, m.kind, m.labels, m.values) for m in metrics]
