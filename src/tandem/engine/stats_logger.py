"""vLLM's periodic stats line (``disable_log_stats`` off — the server's default): every ``interval_s`` of
stepping, one INFO line with the prompt and generation throughput since the last line, running / waiting
requests, KV cache use and the prefix-cache hit rate since the last line. Called after each engine step; a
step costs it one clock read."""

from __future__ import annotations

import logging
import time

from tandem.core.scheduler import Scheduler

logger = logging.getLogger("tandem.stats")


class StatsLogger:
    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()
        self._prompt = self._generation = self._queries = self._hits = 0

    def maybe_log(self, sched: Scheduler) -> str | None:
        """The line, when ``interval_s`` has passed since the last (logged and returned); else None."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return None
        elapsed, self._last = now - self._last, now
        c, pool = sched.counters, sched.kv.pool.stats
        prompt, gen = c.num_prompt_tokens - self._prompt, c.num_generation_tokens - self._generation
        queries, hits = pool.queries - self._queries, pool.hits - self._hits
        self._prompt, self._generation = c.num_prompt_tokens, c.num_generation_tokens
        self._queries, self._hits = pool.queries, pool.hits
        line = (
            f"Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, Avg generation throughput: "
            f"{gen / elapsed:.1f} tokens/s, Running: {sched.num_running()} reqs, Waiting: {sched.num_waiting()} "
            f"reqs, KV cache usage: {100 * sched.kv.usage:.1f}%, Prefix cache hit rate: "
            f"{100 * hits / queries if queries else 0.0:.1f}%"
        )
        logger.info(line)
        return line
