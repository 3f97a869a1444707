"""What a draft head's pass over prompt chunks costs while the speculation policy drafts (almost) nothing, and
what skipping it once the policy has settled saves (``SchedulerOutput.drafter_prefill``, core/spec_policy.py).

Each arm is an engine in its own process, the arms alternating: ``skip`` (the default) and ``keep`` (the
policy's ``QUIET`` set out of reach, so the head runs over every prompt chunk as before). Per run: wall time
and output tok/s over the prompts (after a warm-up batch), the drafts verified, the time spent in the proposer
on steps that draft nothing (the head's prompt passes) and the number of such calls.

    python benchmarks/head_prompt_cost.py --method eagle3 --temperature 0.7 --concurrency 4 --prompts 48 \
        --output-len 128 --rounds 2 --json benchmarks/results/head_prompt_cost.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval  # noqa: E402


def child(arm: str, method: str, temperature: float, concurrency: int, prompts: int, output_len: int) -> None:
    import tandem.core.spec_policy as spec_policy
    from tandem import LLM, SamplingParams

    if arm == "keep":
        spec_policy.QUIET = 10**9  # never settled: the head runs over every prompt chunk
    texts = humaneval(prompts)
    llm = LLM(max_num_seqs=concurrency, speculative_config={"method": method, "num_speculative_tokens": 3})
    runner = llm.engine.core.executor.runner
    idle = {"s": 0.0, "n": 0}
    propose = runner.proposer.propose

    def timed(inp):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return propose(inp)
        finally:
            if inp.num_drafts == 0:
                idle["s"] += time.perf_counter() - t0
                idle["n"] += 1

    runner.proposer.propose = timed
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True)
    llm.generate(texts[: 2 * concurrency], params, use_tqdm=False)  # warm-up: kernels, caches, the policy's line
    idle["s"], idle["n"] = 0.0, 0
    drafts0 = llm.engine.core.scheduler.counters.spec.num_draft_tokens
    t0 = time.perf_counter()
    outs = llm.generate(texts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"arm": arm, "wall_s": wall, "tok_s": tokens / wall,
                      "drafts": llm.engine.core.scheduler.counters.spec.num_draft_tokens - drafts0,
                      "idle_propose_s": idle["s"], "idle_propose_calls": idle["n"]}))
    llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="eagle3", choices=["eagle", "eagle3", "mtp"])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="each arm's runs (the arms alternate)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.method, a.temperature, a.concurrency, a.prompts, a.output_len)
        return
    runs = []
    order = [arm for _ in range(a.rounds) for arm in ("skip", "keep")]
    for i, arm in enumerate(order, 1):
        cmd = [sys.executable, __file__, "--child", arm, "--method", a.method, "--temperature", str(a.temperature),
               "--concurrency", str(a.concurrency), "--prompts", str(a.prompts), "--output-len", str(a.output_len)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        run = json.loads(out)
        runs.append(run)
        print(f"[{i}/{len(order)}] {arm}: {run['tok_s']:.1f} tok/s, wall {run['wall_s']:.2f} s, "
              f"drafts {run['drafts']}, head on steps drafting nothing {run['idle_propose_s']:.3f} s "
              f"({run['idle_propose_calls']} calls)",
              flush=True)
    print("| arm | tok/s (mean) | wall s (mean) | head s on steps drafting nothing | calls | drafts |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for arm in ("skip", "keep"):
        mine = [r for r in runs if r["arm"] == arm]
        s = {k: sum(r[k] for r in mine) / len(mine) for k in ("tok_s", "wall_s", "idle_propose_s",
                                                                 "idle_propose_calls", "drafts")}
        summary[arm] = s
        print(f"| {arm} | {s['tok_s']:.1f} | {s['wall_s']:.2f} | {s['idle_propose_s']:.3f} | "
              f"{s['idle_propose_calls']:.0f} | {s['drafts']:.0f} |")
    print(f"skip / keep tok/s: {summary['skip']['tok_s'] / summary['keep']['tok_s']:.3f}")
    if a.json:
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)}, "environment": environment(),
                                      "runs": runs, "summary": summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
