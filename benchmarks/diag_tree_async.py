"""Where tree verifies part between async scheduling off and on: each arm (an engine in its own process, run one
after the other) records every decode step's verify per request — drafts verified, drafts accepted, whether a
tree, the request's output length then — and the requests whose records differ are listed with the first step
where they do.

    python benchmarks/diag_tree_async.py --prompts 16

Outputs are checked equal; only the speculation statistics may differ.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import humaneval  # noqa: E402


def arm(async_scheduling: bool, prompts: int, method: str, max_tokens: int) -> dict:
    """One engine: the per-request verify records, the outputs and the totals (JSON on stdout)."""
    from tandem import LLM, SamplingParams

    llm = LLM(max_num_seqs=8, async_scheduling=async_scheduling,
              speculative_config={"method": method, "num_speculative_tokens": 3, "policy": "fixed",
                                  "tree": {"top_k": 2, "max_nodes": 6}})
    policy = llm.engine.core.scheduler.spec_policy
    records: dict[str, list] = collections.defaultdict(list)
    observe = policy.observe_drafts

    def recording(req, num_valid, num_accepted, tree=False, num_slots=None):  # noqa: ANN001, ANN202
        records[req.request_id].append((num_valid, num_accepted, int(tree), req.num_output_tokens))
        return observe(req, num_valid, num_accepted, tree, num_slots)

    policy.observe_drafts = recording
    outs = llm.generate(humaneval(prompts), SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    stats = {k: v for k, v in llm.spec_decode_stats().items() if k != "policy"}
    llm.shutdown()
    return {"records": [records[o.request_id] for o in outs], "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "finish": [o.outputs[0].finish_reason for o in outs], "stats": stats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--method", default="eagle")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--arm", choices=["off", "on"], help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.arm:
        print(json.dumps(arm(ns.arm == "on", ns.prompts, ns.method, ns.max_tokens)))
        return 0
    runs = {}
    for mode in ("off", "on"):
        print(f"async {mode} ...", flush=True)
        out = subprocess.run([sys.executable, __file__, "--arm", mode, "--prompts", str(ns.prompts), "--method",
                              ns.method, "--max-tokens", str(ns.max_tokens)], check=True, capture_output=True,
                             text=True).stdout
        runs[mode] = json.loads(out.strip().splitlines()[-1])
    off, on = runs["off"], runs["on"]
    print("outputs equal:", off["tokens"] == on["tokens"])
    for mode in ("off", "on"):
        s = runs[mode]["stats"]
        print(f"async {mode}: {s['num_drafts']} verifies, {s['num_accepted_tokens']} accepted")
    print("request | finish | output tokens | first differing verify: off / on | (num_valid, num_accepted, tree, "
          "output tokens before)")
    for i, (a, b) in enumerate(zip(off["records"], on["records"])):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"{i} | {off['finish'][i]} | {len(off['tokens'][i])} | verify {j} of {len(a)} / {len(b)}: "
                  f"{a[j:j + 2]} / {b[j:j + 2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
