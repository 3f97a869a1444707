"""vLLM's ``vllm.v1.metrics.reader``: the classes of ``LLM.get_metrics()``'s items."""

from tandem.engine.metrics import Counter, Gauge, Histogram, Metric, Vector

__all__ = ["Counter", "Gauge", "Histogram", "Metric", "Vector"]
