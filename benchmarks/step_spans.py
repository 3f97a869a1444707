"""Where a decode step's time goes outside the forward: the tracer's spans per step (schedule, prepare_inputs,
sample, update, forward) at N-way greedy decode of the default model, after one warm-up run.

    python benchmarks/step_spans.py 32 1     # 32 streams, async scheduling on
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from tandem import LLM, SamplingParams
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import humaneval
n = int(sys.argv[1]); async_ = sys.argv[2] == "1"
llm = LLM(max_num_seqs=n, async_scheduling=async_, trace_file=str(__import__("tempfile").gettempdir() + "/step_spans.json"))
prompts = humaneval(n)
sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
llm.generate(prompts, sp, use_tqdm=False)
llm.engine.tracer.clear()
t = time.perf_counter(); outs = llm.generate(prompts, sp, use_tqdm=False); dt = time.perf_counter() - t
spans = llm.engine.tracer.spans
by = defaultdict(list)
for s in spans: by[s.name].append(s.dur_ns / 1e6)
steps = len(by["forward"])
print(f"n={n} async={async_} tok/s={n*64/dt:.1f} steps={steps} step_ms={dt*1e3/steps:.2f}")
for k, v in sorted(by.items()):
    print(f"  {k:24s} count={len(v):5d} mean_ms={statistics.mean(v):.3f} total_ms_per_step={sum(v)/steps:.3f}")
llm.shutdown()
