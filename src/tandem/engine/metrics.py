"""vLLM-style metric objects read from a live engine (names prefixed ``tandem:``)."""

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


def collect_metrics(engine: Engine) -> list[Metric]:
    sched = engine.core.scheduler
    c = sched.counters
    pool = sched.kv.pool
    spec = c.spec
    d = engine.plan.decision
    metrics = [
        Metric("tandem:num_requests_running", sched.num_running()),
        Metric("tandem:num_requests_waiting", sched.num_waiting()),
        Metric("tandem:kv_cache_usage_perc", sched.kv.usage),
        Metric("tandem:prefix_cache_queries", pool.stats.queries, "counter"),
        Metric("tandem:prefix_cache_hits", pool.stats.hits, "counter"),
        Metric("tandem:num_preemptions", c.num_preemptions, "counter"),
        Metric("tandem:prompt_tokens", c.num_prompt_tokens, "counter"),
        Metric("tandem:generation_tokens", c.num_generation_tokens, "counter"),
        Metric("tandem:spec_decode_num_drafts", spec.num_drafts, "counter"),
        Metric("tandem:spec_decode_num_draft_tokens", spec.num_draft_tokens, "counter"),
        Metric("tandem:spec_decode_num_accepted_tokens", spec.num_accepted_tokens, "counter"),
        Metric(
            "tandem:spec_decode_num_invalid_spec_tokens", spec.num_invalid_spec_tokens, "counter"
        ),
        Metric(
            "tandem:spec_decode_num_accepted_tokens_per_pos",
            float(sum(spec.accepted_per_pos)),
            "vector",
            values=tuple(float(v) for v in spec.accepted_per_pos),
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
    return metrics
