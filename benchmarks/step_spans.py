"""Where a decode step's time goes outside the forward: the tracer's spans per step (schedule, prepare_inputs,
sample, update, forward) at N-way greedy decode of the default model, after one warm-up run.

    python benchmarks/step_spans.py 32 1     # 32 streams, async scheduling on (0: off)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import humaneval  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402

MAX_TOKENS = 64


def main(n: int, async_scheduling: bool) -> None:
    trace = str(Path(tempfile.gettempdir()) / "step_spans.json")
    llm = LLM(max_num_seqs=n, async_scheduling=async_scheduling, trace_file=trace)
    prompts = humaneval(n)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    llm.engine.tracer.clear()
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    by_name: dict[str, list[float]] = defaultdict(list)
    for span in llm.engine.tracer.spans:
        by_name[span.name].append(span.dur_ns / 1e6)
    steps = len(by_name["forward"])
    print(f"n={n} async={async_scheduling} tok/s={n * MAX_TOKENS / elapsed:.1f} steps={steps} "
          f"step_ms={elapsed * 1e3 / steps:.2f}")
    for name, durations in sorted(by_name.items()):
        print(f"  {name:24s} count={len(durations):5d} mean_ms={statistics.mean(durations):.3f} "
              f"ms_per_step={sum(durations) / steps:.3f}")
    llm.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32, (sys.argv[2] if len(sys.argv) > 2 else "1") == "1")
