"""Where a speculative step's time goes: the median duration of each traced span per step, per arm.

Each arm (no-spec and each drafter, k = 3, greedy unless ``--temperature``, single stream, async off unless
``--async-scheduling``) generates on a few HumanEval prompts with ``trace_file`` set; the spans of the decode
steps (prefill steps left out) are grouped by name and their per-step medians printed side by side, with the
median step (``execute``) and the extra time per step over no-spec. This is the breakdown that says which part
of a verify step costs what (the target's forward, the proposer, the rejection sampler).

    python benchmarks/spec_step_spans.py --json benchmarks/results/spec_step_spans.json
    python benchmarks/spec_step_spans.py --methods none eagle3 --k 2 --policy fixed   # every step drafts 2
    python benchmarks/spec_step_spans.py --methods eagle3 --k 2 --policy fixed --tree 2,2 --first 100 --prompts 6
        # each method also with a draft tree (top_k 2, 2 nodes): ``eagle3+tree``, HumanEval problems 100-105
    python benchmarks/spec_step_spans.py --methods none ngram --temperature 1.0 --async-scheduling
        # sampled (unseeded: a seeded sampled request always verifies every draft), async scheduling on
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402

SPANS = ("execute", "forward", "propose", "rejection_sample", "sample", "prepare_inputs")


def step_spans(trace: Path) -> dict[str, list[float]]:
    """Per-step duration (ms) of each span name, decode / verify steps only (forward of at most 8 rows)."""
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tokens: dict[int, int] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("ph") != "X" or "step" not in args:
            continue
        steps[args["step"]][e["name"]] += e["dur"] / 1000
        if e["name"] == "forward":
            tokens[args["step"]] = int(args.get("tokens") or 0)
    out: dict[str, list[float]] = defaultdict(list)
    for s, spans in steps.items():
        if not 1 <= tokens.get(s, 0) <= 8:
            continue
        for name in SPANS:
            if name in spans:
                out[name].append(spans[name])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["none", "eagle", "eagle3", "mtp"])
    p.add_argument("--prompts", type=int, default=4, help="HumanEval prompts FIRST.. (FIRST + N)")
    p.add_argument("--first", type=int, default=2, help="the first HumanEval problem (default 2)")
    p.add_argument("--tree", default=None, metavar="TOP_K,MAX_NODES",
                   help="also run each method with this draft tree (arm <method>+tree)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    p.add_argument("--policy", default=None, choices=["adaptive", "fixed"],
                   help="speculative_config.policy (default: adaptive; fixed drafts k every step)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default greedy)")
    p.add_argument("--async-scheduling", action="store_true", help="async scheduling on (default off)")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    prompts = humaneval(ns.first + ns.prompts)[ns.first:]
    arms = [a for m in ns.methods for a in ([m, f"{m}+tree"] if ns.tree and m != "none" else [m])]
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in tqdm(arms, desc="arms"):
            trace = Path(tmp) / f"{m}.json"
            method = m.removesuffix("+tree")
            spec = None if m == "none" else {"method": method, "num_speculative_tokens": ns.k}
            if spec is not None and ns.policy:
                spec["policy"] = ns.policy
            if spec is not None and m.endswith("+tree"):
                top_k, max_nodes = (int(x) for x in ns.tree.split(","))
                spec["tree"] = {"top_k": top_k, "max_nodes": max_nodes}
            llm = LLM(max_num_seqs=1, async_scheduling=ns.async_scheduling, speculative_config=spec, max_model_len=2048,
                      num_kv_blocks=160, trace_file=str(trace))
            llm.generate(prompts, params, use_tqdm=False)  # one call (the trace holds the last); one at a time
            stats = llm.spec_decode_stats() if spec else {}
            llm.shutdown()
            spans = step_spans(trace)
            results[m] = {
                "steps": len(spans["execute"]),
                "median_ms": {k: round(statistics.median(v), 3) for k, v in spans.items() if v},
                "mean_acceptance_length": stats.get("mean_acceptance_length"),
            }
    base = results.get("none", {}).get("median_ms", {}).get("execute")
    print(f"\n{'arm':<12}{'steps':>6}{'acceptance':>11}" + "".join(f"{s:>18}" for s in SPANS)
          + f"{'extra vs none':>15}")
    for m, r in results.items():
        med = r["median_ms"]
        extra = f"{med['execute'] - base:+.2f}" if base is not None else "-"
        acc = f"{r['mean_acceptance_length']:.3f}" if r["mean_acceptance_length"] else "-"
        print(f"{m:<12}{r['steps']:>6}{acc:>11}" + "".join(f"{med.get(s, float('nan')):>18.2f}" for s in SPANS)
              + f"{extra:>15}")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"environment": environment(), "args": vars(ns),
                                             "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
