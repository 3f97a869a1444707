"""``tandem bench ab``: arms A (async off), B (async on), C (async on + deferred reconciliation) on one
fixed contract (docs/SEMANTICS.md §6), interleaved and repeated, with a report a person can read.

Each arm is one engine built from the same flags except the arm's own; every repeat runs the arms in
turn on the same workload. Per run: traced steps (proposed / accepted / rejected per step, overlap, idle
gaps, exposed waits, step wall time), per-request latencies (TTFT, TPOT, ITL), throughput, preemptions,
errors, placeholders back to zero, and each request's tokens (the output-identity check across arms).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.bench.contract import build_contract
from tandem.bench.workloads import DATASETS, BenchRequest, load_workload
from tandem.config import DEFAULT_MODEL

ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "A": ("async off", {"async_scheduling": False}),
    "B": ("async on", {"async_scheduling": True}),
    "C": ("async on + deferred reconciliation", {"async_scheduling": True,
                                                 "deferred_reconciliation": True}),
}


@dataclass
class RunResult:
    arm: str
    repeat: int
    duration_s: float
    output_tokens: int
    tokens: dict[str, list[int]]
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    errors: int = 0
    preemptions: int = 0
    placeholders_left: int = 0
    analysis: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0


def _arrivals(n: int, rate: float, seed: int) -> list[float]:
    if rate == float("inf"):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def run_once(llm: Any, requests: list[BenchRequest], params: Any, concurrency: int, rate: float,
             seed: int, arm: str, repeat: int, trace_path: Path | None = None) -> RunResult:
    """Drive one engine through the workload; arrivals follow ``rate`` (Poisson) under ``concurrency``."""
    from tandem.trace.analyze import analyze_spans

    tracer = llm.engine.tracer
    tracer.clear()
    arrivals = _arrivals(len(requests), rate, seed)
    pending = list(range(len(requests)))
    live: dict[str, int] = {}
    done: dict[int, Any] = {}
    t0 = time.monotonic()
    while pending or live:
        now = time.monotonic() - t0
        while pending and len(live) < concurrency and arrivals[pending[0]] <= now:
            i = pending.pop(0)
            r = requests[i]
            prompt = {"prompt_token_ids": r.prompt} if isinstance(r.prompt, list) else r.prompt
            rid = llm.add_request(prompt, params.clone(max_tokens=r.output_len))
            live[rid] = i
        if not live:
            time.sleep(min(0.01, max(0.0, arrivals[pending[0]] - now)))
            continue
        for fr in llm.step():
            if fr.finished and fr.req_id in live:
                done[live.pop(fr.req_id)] = fr
    duration = time.monotonic() - t0
    core = llm.engine.core
    res = RunResult(arm, repeat, duration, sum(len(f.token_ids) for f in done.values()),
                    {str(i): list(f.token_ids) for i, f in sorted(done.items())})
    for f in done.values():
        m = f.metrics
        if f.finish_reason == "error":
            res.errors += 1
        if m.ttft is not None:
            res.ttft_s.append(m.ttft)
        if m.tpot is not None:
            res.tpot_s.append(m.tpot)
        times = [m.first_token_time, *m.token_times[1:]] if m.token_times else []
        res.itl_s.extend(b - a for a, b in zip(times, times[1:]) if a is not None)
    res.preemptions = core.scheduler.counters.num_preemptions
    res.placeholders_left = sum(r.num_output_placeholders for r in core.scheduler.requests.values())
    spans = tracer.take()
    if trace_path is not None:
        from tandem.trace.tracer import Tracer

        keep = Tracer("tandem bench ab")
        keep.extend(spans)
        keep.save(trace_path)
    analysis = analyze_spans(spans)
    res.analysis = analysis.summary
    res.steps = [
        {"step": s.step, "reqs": s.reqs, "drafts": s.drafts, "accepted": s.accepted,
         "verifies": s.verifies,
         "rejected": s.rejected, "execute_ms": s.execute_ms, "overlap": s.schedule_overlap,
         "device_gap_ms": s.device_gap_ms}
        for s in analysis.steps
    ]
    return res


def run_ab(ns: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from tandem.engine.llm import LLM
    from tandem.sampling_params import SamplingParams

    requests = load_workload(
        ns.dataset_name, ns.num_prompts, input_len=ns.random_input_len, output_len=ns.output_len,
        seed=ns.seed, tokenizer=ns.model,
    )
    params = SamplingParams(temperature=ns.temperature, top_p=ns.top_p, seed=ns.sampling_seed,
                            ignore_eos=ns.ignore_eos)
    out_dir = Path(ns.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    common = dict(dtype=ns.dtype, max_num_seqs=ns.max_concurrency, executor_backend=ns.executor_backend,
                  speculative_config=ns.speculative_config, seed=ns.seed)
    # Tracing is on for every arm alike (its cost is measured separately, see BENCHMARKS.md); the
    # last repeat's trace of each arm is kept for Perfetto.
    llms = {
        arm: LLM(ns.model, **common, **ARMS[arm][1], trace_file=str(out_dir / f"trace_{arm}.json"))
        for arm in ns.arms
    }
    warm = SamplingParams(max_tokens=4)
    for llm in llms.values():
        llm.generate(requests[0].prompt if isinstance(requests[0].prompt, str)
                     else {"prompt_token_ids": requests[0].prompt}, warm, use_tqdm=False)
    runs: list[RunResult] = []
    rate = float("inf") if ns.request_rate in (None, "inf") else float(ns.request_rate)
    with tqdm(total=ns.repeats * len(ns.arms), desc="bench ab", unit="run") as bar:
        for rep in range(ns.repeats):
            for arm in ns.arms:  # interleaved: drift hits every arm alike
                last = rep == ns.repeats - 1
                trace = out_dir / f"trace_{arm}.json" if last else None
                runs.append(run_once(llms[arm], requests, params, ns.max_concurrency, rate,
                                     ns.seed + rep, arm, rep, trace))
                bar.set_postfix(arm=arm, tok_s=f"{runs[-1].throughput:.1f}")
                bar.update(1)
    contract = build_contract(ns, llms[ns.arms[0]], requests, params)
    for llm in llms.values():
        llm.shutdown()
    return {"contract": contract, "runs": runs}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ab", help="A/B/C: async off, async on, async on + deferred reconciliation")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--executor-backend", default="uni", choices=["uni", "mp"])
    p.add_argument("--speculative-config", default=None, help="JSON, vLLM's keys")
    p.add_argument("--dataset-name", default="humaneval", choices=DATASETS)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--request-rate", default="inf", help="requests/s (Poisson) or inf")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--sampling-seed", type=int, default=None, help="per-request seed (random arms)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", required=True, help="directory for report.json, report.md, plots")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=_main)


def _main(ns: argparse.Namespace) -> int:
    from tandem.bench.report import write_report

    result = run_ab(ns)
    out = write_report(result, Path(ns.out), ARMS, plots=not ns.no_plots)
    print(out.read_text() if out.suffix == ".md" else json.dumps(result["contract"], indent=2))
    return 0
