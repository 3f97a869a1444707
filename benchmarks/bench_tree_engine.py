"""Draft trees in the engine vs the chain vs no speculation: decode speed and acceptance (issue 25).

Every arm is an engine in its own process (``bench_quant.TandemArm``: two engines in one process share one
OpenMP runtime and both slow down), and the arms take turns batch by batch, the order rotating. Prompts: the
report split (HumanEval problems 100-163, never used to train or choose a head), greedy, ``--max-tokens``
tokens each (no stop: every arm computes the same tokens, and the outputs are checked against no
speculation), ``policy: fixed`` (every step verifies: the shapes themselves are compared). At each
concurrency c the prompts go in batches of c (``max_num_seqs`` c). Speed-ups are reported over all rounds and
over the rounds within one placement of the vCPUs (``near`` / ``far``: common.placement_of), which can change
mid-run on a VM and moves a decode step by up to ~1.3x (BENCHMARKS.md §13).

    python benchmarks/bench_tree_engine.py --method eagle3 --trees 2,4 2,6 4,16 --concurrency 1 4 \\
        --json benchmarks/results/tree_engine.json --plot benchmarks/results/tree_engine.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import TandemArm  # noqa: E402
from common import PLACEMENTS, PlacementTally, environment, grouped_bars, humaneval  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tandem.model.loader import load_tokenizer  # noqa: E402

REPORT_SPLIT = range(100, 164)


def arm_config(name: str, method: str, k: int, c: int) -> dict[str, Any]:
    """Arms: ``none``, ``chain``, ``TOP_K,MAX_NODES`` (trees; policy fixed), ``adaptive:TOP_K,MAX_NODES`` (trees
    configured, the adaptive policy choosing per step between no drafts, chains and trees). A suffix ``@K``
    gives the arm its own ``num_speculative_tokens`` (the chain's length, the tree's depth) instead of ``--k``:
    ``chain@2``, ``2,3@2``."""
    spec: dict[str, Any] | None = None
    name, _, own_k = name.partition("@")
    k = int(own_k) if own_k else k
    if name != "none":
        adaptive, _, shape = name.rpartition(":")
        spec = {"method": method, "num_speculative_tokens": k, "policy": "adaptive" if adaptive else "fixed"}
        if shape != "chain":
            top_k, max_nodes = (int(x) for x in shape.split(","))
            spec["tree"] = {"top_k": top_k, "max_nodes": max_nodes}
    return {"max_num_seqs": c, "speculative_config": spec, "max_model_len": 2048}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="eagle3", choices=["eagle", "eagle3", "mtp"])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens: the chain's length, the trees' depth")
    ap.add_argument("--trees", nargs="+", default=["2,4", "2,6", "4,16", "adaptive:4,16"],
                    help="top_k,max_nodes (policy fixed), or adaptive:top_k,max_nodes; a suffix @K sets that "
                         "arm's depth (chain@K: a chain of K)")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--prompts", type=int, default=16, help="first N prompts of the report split")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts at each concurrency")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ns = ap.parse_args()
    texts = [humaneval(max(REPORT_SPLIT) + 1)[i] for i in REPORT_SPLIT][: ns.prompts]
    tok = load_tokenizer("smollm2-135m-instruct")
    ids = [tok.encode(t) for t in texts]
    names = ["none", "chain", *ns.trees]
    out: dict[str, Any] = {"environment": environment(), "args": vars(ns), "results": []}
    for c in ns.concurrency:
        arms = {n: TandemArm(arm_config(n, ns.method, ns.k, c)) for n in tqdm(names, desc=f"c={c} load")}
        tally = PlacementTally(names)
        tokens: dict[str, list[list[int]]] = {n: [] for n in names}
        batches = [ids[i : i + c] for i in range(0, len(ids), c)]
        for b, batch in enumerate(tqdm(batches * ns.repeats, desc=f"c={c}")):
            order = names[b % len(names):] + names[: b % len(names)]
            answers = tally.round(order, lambda n, batch=batch: arms[n].ask(cmd="generate", prompts=batch,
                                                                           max_tokens=ns.max_tokens))
            for n, ans in answers.items():
                tokens[n] += ans["tokens"]
        stats = {n: arms[n].ask(cmd="stats")["stats"] for n in names if n != "none"}
        for a in arms.values():
            a.close()
        base = tally.rate("all", "none")
        for n in names:
            rate = tally.rate("all", n)
            row = {"concurrency": c, "arm": n, "decode_tok_s": rate, "speedup_vs_none": rate / base,
                   "identical_to_none": tokens[n] == tokens["none"],
                   "mean_acceptance_length": stats.get(n, {}).get("mean_acceptance_length")}
            for where in PLACEMENTS[1:]:  # the rounds within one placement of the vCPUs (common.placement_of)
                if tally.rounds[where]:
                    row[f"{where}_rounds"] = tally.rounds[where]
                    row[f"{where}_speedup_vs_none"] = tally.rate(where, n) / tally.rate(where, "none")
            out["results"].append(row)
            acc = row["mean_acceptance_length"]
            by = "  ".join(f"{w} {row[f'{w}_speedup_vs_none']:5.2f}x ({row[f'{w}_rounds']})" for w in PLACEMENTS[1:]
                           if f"{w}_rounds" in row)
            print(f"c={c:<3} {n:<7} {rate:8.1f} tok/s  {row['speedup_vs_none']:5.2f}x  acceptance "
                  f"{acc if acc is None else round(acc, 3)}  identical {row['identical_to_none']}  {by}", flush=True)
    out["environment_after"] = environment()
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=1))
    if ns.plot:
        groups = [f"c={c}" for c in ns.concurrency]
        series = {n: [r["speedup_vs_none"] for r in out["results"] if r["arm"] == n] for n in names[1:]}
        grouped_bars(ns.plot, groups, {(n if n.startswith("chain") or ":" in n else "tree " + n): v
                                       for n, v in series.items()},
                     "decode speed-up vs no speculation", f"{ns.method}: draft trees vs the chain (engine)")


if __name__ == "__main__":
    main()
