"""Greedy outputs of 32 HumanEval prompts for every speculation method and async mode, saved as JSON, so
two commits can be compared token for token (issue 21: "behaviour unchanged").

    python benchmarks/greedy_tokens.py --out before.json            # on the old commit
    python benchmarks/greedy_tokens.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import humaneval  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402

METHODS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "eagle3": {"method": "eagle3", "num_speculative_tokens": 3},
    "mtp": {"method": "mtp", "num_speculative_tokens": 3},
}


def run(n: int, max_tokens: int) -> dict[str, list[list[int]]]:
    prompts = humaneval(n)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    results: dict[str, list[list[int]]] = {}
    for method, spec in METHODS.items():
        for async_scheduling in (False, True):
            t0 = time.perf_counter()
            llm = LLM(max_num_seqs=n, async_scheduling=async_scheduling, speculative_config=spec)
            outs = llm.generate(prompts, params, use_tqdm=False)
            llm.shutdown()
            key = f"{method}/async={int(async_scheduling)}"
            results[key] = [list(o.outputs[0].token_ids) for o in outs]
            print(f"{key}: {sum(map(len, results[key]))} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="a JSON written by an earlier run: every list must be equal")
    args = ap.parse_args()
    results = run(args.n, args.max_tokens)
    Path(args.out).write_text(json.dumps(results))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        bad = [k for k in results if before.get(k) != results[k]]
        print("identical" if not bad else f"DIFFERENT: {bad}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
