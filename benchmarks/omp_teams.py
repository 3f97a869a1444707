"""A second OpenMP team in the process: what it costs the engine, and what releasing it (native/omp.py) gives back.

The engine's forward runs on its worker thread. Arms, each a fresh process, alternating by repeat:
- ``alone``: the caller runs no parallel op of its own (``alone, kept``: nor does the engine release anything);
- ``caller team, kept``: the thread that calls ``LLM.generate`` has run a parallel torch op first (a 512 x 512
  matmul, as a test computing a reference or a notebook cell would), and the engine does not release its idle
  team (``release_idle_team`` replaced by a no-op): libgomp then manages more threads than CPUs and throttles
  its spinning;
- ``caller team, released``: the same op, with the engine as shipped (the caller's idle team released before
  each step).
Each arm generates the same greedy requests (the first N HumanEval prompts, one at a time, ``max_tokens``
tokens each, default model, no speculation) and reports decode tok/s (tokens after the first over the time
from the first to the last). The probe ``region_us`` is one parallel torch op timed on the worker thread
(median of 2,000), the cost the throttling adds to every region.

    python benchmarks/omp_teams.py --json benchmarks/results/omp_teams.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval  # noqa: E402

ARMS = ("alone", "alone, kept", "caller team, kept", "caller team, released")


def _region_us(torch) -> float:  # type: ignore[no-untyped-def]
    a, b, ts = torch.randn(200_000), torch.randn(200_000), []
    for _ in range(2000):
        t = time.perf_counter()
        torch.add(a, b)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def worker(arm: str, prompts: int, max_tokens: int) -> dict[str, object]:
    import torch

    import tandem.engine.llm as llm_mod
    from tandem import LLM, SamplingParams

    if arm.endswith(", kept"):
        llm_mod.release_idle_team = lambda: False
    llm = LLM()
    texts = humaneval(164)[:prompts]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(texts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm
    rates = []
    for text in texts:
        if arm.startswith("caller team"):
            x = torch.randn(512, 512)
            x @ x  # a parallel op on this thread: its team now exists
        out = llm.generate([text], params, use_tqdm=False)[0]
        m = out.metrics
        rates.append((len(out.outputs[0].token_ids) - 1) / (m.last_token_time - m.first_token_time))
    pool = llm.engine.core.executor._pool  # the engine's worker thread
    if arm.startswith("caller team"):
        x = torch.randn(512, 512)
        x @ x
        if not arm.endswith(", kept"):
            llm_mod.release_idle_team()
    region = pool.submit(_region_us, torch).result()
    tasks = len(os.listdir("/proc/self/task"))
    llm.shutdown()
    return {"arm": arm, "decode_tok_s": statistics.mean(rates), "region_us": region, "threads": tasks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arm-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.arm_worker:
        print(json.dumps(worker(args.arm_worker, args.prompts, args.max_tokens)))
        return 0
    runs: dict[str, list[dict[str, object]]] = {a: [] for a in ARMS}
    for rep in range(args.repeats):
        order = ARMS if rep % 2 == 0 else tuple(reversed(ARMS))
        for arm in order:
            cmd = [sys.executable, __file__, "--arm-worker", arm, "--prompts", str(args.prompts),
                   "--max-tokens", str(args.max_tokens)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs[arm].append(json.loads(out))
            print(f"repeat {rep + 1}/{args.repeats}  {arm:24s} {runs[arm][-1]}", flush=True)
    rows = []
    base = statistics.median(float(r["decode_tok_s"]) for r in runs["alone"])
    print("\n| arm | decode tok/s (median of repeats) | x alone | one parallel op on the worker, us | threads |")
    print("|---|---|---|---|---|")
    for arm in ARMS:
        rate = statistics.median(float(r["decode_tok_s"]) for r in runs[arm])
        region = statistics.median(float(r["region_us"]) for r in runs[arm])
        rows.append({"arm": arm, "decode_tok_s": rate, "vs_alone": rate / base, "region_us": region,
                     "runs": runs[arm]})
        print(f"| {arm} | {rate:.1f} | {rate / base:.2f}x | {region:.1f} | {runs[arm][-1]['threads']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "args": vars(args), "results": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
