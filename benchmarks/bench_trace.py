"""Tracer cost: the same decode workload with the tracer off (NullTracer) and on, interleaved.

Drives the engine with ``LLM.add_request`` / ``LLM.step`` so the timed region excludes writing the
trace file. Reports output tok/s per arm (median of repeats) and the on/off ratio. Because this VM's
speed drifts by more than the tracer could cost, it also measures the cost of one span directly
(Tracer vs NullTracer, a million spans) and multiplies it by the spans recorded per step.

    python benchmarks/bench_trace.py --json benchmarks/results/trace_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval, median  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402


def _run(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[float, int]:
    llm.engine.tracer.clear()
    t0 = time.perf_counter()
    ids = [llm.add_request(p, params) for p in prompts]
    done, tokens = set(), 0
    while len(done) < len(ids):
        for fr in llm.step():
            if fr.finished:
                done.add(fr.req_id)
                tokens += len(fr.token_ids)
    return time.perf_counter() - t0, tokens


def span_cost_ns(n: int = 200_000) -> dict[str, float]:
    from tandem.trace.tracer import NULL_TRACER, Tracer

    out = {}
    for name, tracer in (("off", NULL_TRACER), ("on", Tracer())):
        t0 = time.perf_counter_ns()
        for i in range(n):
            with tracer.span("forward", track="device", step=i) as sp:
                sp.args["tokens"] = 8
        out[name] = (time.perf_counter_ns() - t0) / n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--spec", default='{"method": "ngram", "num_speculative_tokens": 3}')
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens, ignore_eos=True)
    out = {"environment": environment(), "args": vars(ns), "results": []}
    tmp = tempfile.mkdtemp()
    bar = tqdm(total=len(ns.concurrency) * 2 * ns.repeats, desc="bench_trace")
    for c in ns.concurrency:
        prompts = humaneval(c)
        llms = {
            "off": LLM(max_num_seqs=c, speculative_config=ns.spec),
            "on": LLM(max_num_seqs=c, speculative_config=ns.spec, trace_file=f"{tmp}/t{c}.json"),
        }
        times = {k: [] for k in llms}
        spans = 0
        for _ in range(ns.repeats):
            for name, llm in llms.items():
                dt, tokens = _run(llm, prompts, params)
                times[name].append(dt)
                if name == "on":
                    spans = len(llm.engine.tracer.spans)
                    steps = sum(1 for sp in llm.engine.tracer.spans if sp.name == "execute")
                bar.update(1)
        for llm in llms.values():
            llm.shutdown()
        off, on = median(times["off"]), median(times["on"])
        out["results"].append({
            "concurrency": c, "tokens": tokens, "off_tok_s": tokens / off, "on_tok_s": tokens / on,
            "cost_pct": 100 * (on / off - 1), "spans_per_run": spans, "steps_per_run": steps,
            "off_runs_s": times["off"], "on_runs_s": times["on"],
        })
    bar.close()
    per_span = span_cost_ns()
    out["span_cost_ns"] = per_span
    for r in out["results"]:
        per_step = r["spans_per_run"] / max(1, r["steps_per_run"])
        step_ns = 1e9 * median(r["on_runs_s"]) / max(1, r["steps_per_run"])
        r["spans_per_step"] = per_step
        r["span_overhead_pct_per_step"] = 100 * per_step * (per_span["on"] - per_span["off"]) / step_ns
    print(f"span cost: off {per_span['off']:.0f} ns, on {per_span['on']:.0f} ns")
    for r in out["results"]:
        print(f"concurrency {r['concurrency']}: tracing adds {r['span_overhead_pct_per_step']:.4f} % "
              f"of a step ({r['spans_per_step']:.1f} spans per step)")
    print(f"\n{'conc':>5}{'off tok/s':>11}{'on tok/s':>10}{'cost %':>9}{'spans/run':>11}")
    for r in out["results"]:
        print(f"{r['concurrency']:>5}{r['off_tok_s']:>11.1f}{r['on_tok_s']:>10.1f}"
              f"{r['cost_pct']:>9.2f}{r['spans_per_run']:>11}")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
