"""Speculative decoding: no-spec vs ngram vs draft_model, async off and on, single-stream and 8-way,
on HumanEval prompts (greedy, natural EOS), same run. Reports output tok/s, mean acceptance length,
acceptance rate and speedup over no-spec in the same async mode; checks outputs are identical.

    python benchmarks/bench_spec.py --json benchmarks/results/spec.json
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

METHODS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--single-prompts", type=int, default=4, help="prompts run one at a time")
    p.add_argument("--batch-prompts", type=int, default=16, help="prompts run 8 at a time")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens)
    workloads = {
        "single": (1, humaneval(ns.single_prompts)),
        "8-way": (8, humaneval(ns.batch_prompts)),
    }
    out = {"environment": environment(), "args": vars(ns), "results": []}
    bar = tqdm(total=len(workloads) * len(ns.methods) * 2 * ns.repeats, desc="bench_spec")
    for wname, (conc, prompts) in workloads.items():
        llms = {
            (m, a): LLM(max_num_seqs=conc, async_scheduling=a, speculative_config=METHODS[m])
            for m in ns.methods
            for a in (False, True)
        }
        times: dict = {k: [] for k in llms}
        stats: dict = {}
        tokens: dict = {}
        for _ in range(ns.repeats):
            for key, llm in llms.items():  # interleaved arms
                llm.reset_spec_decode_stats()
                t0 = time.perf_counter()
                if conc == 1:
                    outs = [llm.generate(p_, params, use_tqdm=False)[0] for p_ in prompts]
                else:
                    outs = llm.generate(prompts, params, use_tqdm=False)
                times[key].append(time.perf_counter() - t0)
                tokens[key] = [o.outputs[0].token_ids for o in outs]
                stats[key] = llm.spec_decode_stats()
                bar.update(1)
        for llm in llms.values():
            llm.shutdown()
        for (m, a), ts in times.items():
            base = median(times[("none", a)]) if ("none", a) in times else float("nan")
            n_tok = sum(len(t) for t in tokens[(m, a)])
            out["results"].append(
                {
                    "workload": wname,
                    "method": m,
                    "async": a,
                    "tok_s": n_tok / median(ts),
                    "speedup_vs_none": base / median(ts),
                    "mean_acceptance_length": stats[(m, a)]["mean_acceptance_length"],
                    "acceptance_rate": stats[(m, a)]["acceptance_rate"],
                    "accepted_per_pos": stats[(m, a)]["accepted_per_pos"],
                    "identical_to_no_spec": tokens[(m, a)] == tokens.get(("none", a)),
                    "runs_s": ts,
                }
            )
    bar.close()
    print(f"\n{'workload':<9}{'method':<13}{'async':<7}{'tok/s':>8}{'speedup':>9}{'acc.len':>9}"
          f"{'acc.rate':>10}{'same':>6}")
    for r in out["results"]:
        print(f"{r['workload']:<9}{r['method']:<13}{str(r['async']):<7}{r['tok_s']:>8.1f}"
              f"{r['speedup_vs_none']:>8.2f}x{r['mean_acceptance_length']:>9.2f}"
              f"{r['acceptance_rate']:>10.2f}{str(r['identical_to_no_spec']):>6}")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
