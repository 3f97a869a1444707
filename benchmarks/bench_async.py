"""Async scheduling on vs off: decode throughput at 1, 8 and 32 concurrent requests, same run.

For each executor and concurrency c, c HumanEval prompts generate N tokens each (greedy, EOS ignored)
with async off and on; arms interleave and repeat, medians are reported with the ratio on/off.
A traced sync run measures h, the share of a sync step spent outside the forward pass (host work:
scheduling, input preparation, sampling, output processing). Perfect overlap would hide the host part of
h; the target is on/off >= 1 + 0.8 h. A traced async run gives the overlap analysis, which shows from
timestamps what was hidden and what was not.

    python benchmarks/bench_async.py --json benchmarks/results/async.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval, median  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402
from tandem.trace.analyze import analyze_spans  # noqa: E402


def _run(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def _host_share(spans, wall_s: float) -> dict:
    device = {"forward": 0, "sample": 0, "rejection_sample": 0, "propose": 0, "prepare_inputs": 0}
    for s in spans:
        if s.name in device:
            device[s.name] += s.dur_ns
    forward_s = device["forward"] / 1e9
    return {
        "h": 1.0 - forward_s / wall_s,
        "forward_s": forward_s,
        "sample_s": (device["sample"] + device["rejection_sample"]) / 1e9,
        "prepare_inputs_s": device["prepare_inputs"] / 1e9,
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--executors", nargs="+", default=["uni", "mp"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker-threads", type=int, default=None)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens, ignore_eos=True)
    out = {"environment": environment(), "args": vars(ns), "results": []}
    total = len(ns.executors) * len(ns.concurrency) * (2 * ns.repeats + 2)
    bar = tqdm(total=total, desc="bench_async")
    for backend in ns.executors:
        for c in ns.concurrency:
            prompts = humaneval(c)
            llms = {
                a: LLM(max_num_seqs=c, async_scheduling=a, executor_backend=backend,
                       worker_threads=ns.worker_threads)
                for a in (False, True)
            }
            times: dict[bool, list[float]] = {False: [], True: []}
            tokens = 0
            _run(llms[False], prompts[:1], SamplingParams(max_tokens=2))  # warm-up
            _run(llms[True], prompts[:1], SamplingParams(max_tokens=2))
            for _ in range(ns.repeats):
                for a in (False, True):
                    dt, tokens = _run(llms[a], prompts, params)
                    times[a].append(dt)
                    bar.update(1)
            for llm in llms.values():
                llm.shutdown()
            traced = {}
            for a in (False, True):
                llm = LLM(max_num_seqs=c, async_scheduling=a, executor_backend=backend,
                          worker_threads=ns.worker_threads, trace_file="/dev/null")
                dt, _ = _run(llm, prompts, params)
                spans = llm.engine.tracer.spans
                traced[a] = {
                    "host": _host_share(spans, dt),
                    "analysis": analyze_spans(spans, steady_reqs=c).summary,
                }
                llm.shutdown()
                bar.update(1)
            off, on = median(times[False]), median(times[True])
            h = traced[False]["host"]["h"]
            out["results"].append(
                {
                    "executor": backend,
                    "concurrency": c,
                    "tokens": tokens,
                    "off_tok_s": tokens / off,
                    "on_tok_s": tokens / on,
                    "ratio_on_off": off / on,
                    "h": h,
                    "target": 1 + 0.8 * h,
                    "off_runs_s": times[False],
                    "on_runs_s": times[True],
                    "sync_trace": traced[False],
                    "async_trace": traced[True],
                }
            )
    bar.close()
    print(f"\n{'exec':<5}{'conc':>5}{'off tok/s':>11}{'on tok/s':>10}{'on/off':>8}{'h':>8}"
          f"{'target':>8}{'overlap':>9}{'gap off ms':>11}{'gap on ms':>10}")
    for r in out["results"]:
        a, s = r["async_trace"]["analysis"], r["sync_trace"]["analysis"]
        print(
            f"{r['executor']:<5}{r['concurrency']:>5}{r['off_tok_s']:>11.1f}{r['on_tok_s']:>10.1f}"
            f"{r['ratio_on_off']:>8.3f}{r['h']:>8.3f}{r['target']:>8.3f}"
            f"{a['share_steps_overlapped']:>9.0%}{s['device_idle_gap_ms_p50']:>11.2f}"
            f"{a['device_idle_gap_ms_p50']:>10.2f}"
        )
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
