"""Two versions of tandem's source side by side: decode speed of a git revision against the working tree.

Each arm is an engine in its own process (``bench_quant.TandemArm``'s worker, one OpenMP runtime each) whose
``tandem`` is imported from that arm's source: the base arm from a temporary ``git worktree`` of
``--base`` (its ``src`` first on ``PYTHONPATH``), the other from this checkout. Both arms run the same engine
arguments (the default model, greedy, no stop, ``--max-tokens`` tokens each); at each concurrency c the
prompts (HumanEval, as token ids) go in batches of c (``max_num_seqs`` c) and the arms take turns batch by
batch, the order alternating, so drift in the machine's speed hits both. Reports decode tok/s per arm, the
ratio, and whether the outputs are identical (a change that should not move any bits must keep them).

    python benchmarks/bench_source_ab.py --base HEAD~1 --concurrency 1 4 16 \\
        --json benchmarks/results/source_ab.json --plot benchmarks/results/source_ab.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import Worker  # noqa: E402
from common import PLACEMENTS, PlacementTally, environment, finish_json, grouped_bars, humaneval  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tandem.model.loader import load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "bench_quant.py"


class SourceArm(Worker):
    """An engine whose ``tandem`` comes from ``src`` (None: this checkout)."""

    def __init__(self, kwargs: dict[str, Any], src: Path | None) -> None:
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, str(WORKER), "--arm-worker", json.dumps(kwargs)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._read()


def prefill_rows(ns: argparse.Namespace, names: dict[str, str], tree: Path, text_ids: list[int]) -> list[dict[str, Any]]:
    """Prefill tok/s of each ``--prefill`` length per arm (best of the repeats, arms alternating)."""
    longest = max(ns.prefill)
    kw = {"max_num_seqs": 1, "max_model_len": max(2048, longest + 16), "max_num_batched_tokens": longest,
          "enable_prefix_caching": False, **json.loads(ns.engine)}
    arms = {n: SourceArm(kw, tree / "src" if k == "base" else None) for n, k in tqdm(names.items(), desc="prefill load")}
    order, rows = list(arms), []
    for n_tok in ns.prefill:
        prompt = (text_ids * (n_tok // max(1, len(text_ids)) + 1))[:n_tok]
        rates: dict[str, list[float]] = {n: [] for n in order}
        for rep in tqdm(range(ns.prefill_repeats), desc=f"prefill {n_tok}"):
            for n in order if rep % 2 == 0 else order[::-1]:
                rates[n].append(n_tok / arms[n].ask(cmd="prefill", ids=prompt)["prefill_s"])
        best = {n: max(v) for n, v in rates.items()}
        base_name, head_name = order
        row = {"prefill_tokens": n_tok, **{f"{names[n]}_tok_s": r for n, r in best.items()},
               "ratio": best[head_name] / best[base_name]}
        rows.append(row)
        print(f"prefill {n_tok:<5} base {best[base_name]:8.1f} tok/s  working tree {best[head_name]:8.1f} tok/s  "
              f"{row['ratio']:5.3f}x", flush=True)
    for a in arms.values():
        a.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~1", help="git revision of the base arm")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known model (both arms)")
    ap.add_argument("--concurrency", nargs="*", type=int, default=[1, 4, 16])
    ap.add_argument("--prefill", nargs="*", type=int, default=[], help="prompt lengths whose prefill is timed")
    ap.add_argument("--prefill-repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16, help="HumanEval prompts (the first N)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts at each concurrency")
    ap.add_argument("--engine", default="{}", help="JSON of extra engine arguments, both arms")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ns = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", ns.base], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tok = load_tokenizer(ns.model)
    ids = [tok.encode(t) for t in humaneval(ns.prompts)]
    names = {f"base {rev}": "base", "working tree": "head"}
    out: dict[str, Any] = {"environment": environment(), "args": vars(ns), "base_commit": rev, "results": []}
    with tempfile.TemporaryDirectory(prefix="tandem-ab-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), ns.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for c in ns.concurrency:
                kw = {"model": ns.model, "max_num_seqs": c, "max_model_len": 2048, **json.loads(ns.engine)}
                arms = {n: SourceArm(kw, tree / "src" if k == "base" else None)
                        for n, k in tqdm(names.items(), desc=f"c={c} load")}
                order = list(arms)
                tally = PlacementTally(order)
                tokens: dict[str, list[list[int]]] = {n: [] for n in order}
                batches = [ids[i : i + c] for i in range(0, len(ids), c)]
                for b, batch in enumerate(tqdm(batches * max(1, ns.repeats, 4 // len(batches)), desc=f"c={c}")):
                    answers = tally.round(order if b % 2 == 0 else order[::-1], lambda n, batch=batch: arms[n].ask(
                        cmd="generate", prompts=batch, max_tokens=ns.max_tokens))
                    for n, ans in answers.items():
                        tokens[n] += ans["tokens"]
                for a in arms.values():
                    a.close()
                base_name, head_name = order
                row: dict[str, Any] = {"concurrency": c, "identical": tokens[head_name] == tokens[base_name]}
                for where in PLACEMENTS:
                    base_rate, head_rate = tally.rate(where, base_name), tally.rate(where, head_name)
                    if base_rate is None or head_rate is None:
                        continue
                    key = "" if where == "all" else f"{where}_"
                    row.update({f"{key}{names[base_name]}_tok_s": base_rate,
                                f"{key}{names[head_name]}_tok_s": head_rate,
                                f"{key}ratio": head_rate / base_rate, f"{key}turns": tally.rounds[where]})
                    print(f"c={c:<3} {where:<5} base {base_rate:8.1f} tok/s  working tree {head_rate:8.1f} tok/s  "
                          f"{row[f'{key}ratio']:5.3f}x  ({tally.rounds[where]} turns each)"
                          + (f"  identical {row['identical']}" if where == "all" else ""), flush=True)
                out["results"].append(row)
            if ns.prefill:
                out["prefill"] = prefill_rows(ns, names, tree, [t for p in ids for t in p])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False,
                           capture_output=True)
    finish_json(ns.json, out)
    if ns.plot:
        groups = [f"decode c={r['concurrency']}" for r in out["results"]]
        groups += [f"prefill {r['prefill_tokens']}" for r in out.get("prefill", [])]
        ratios = [r["ratio"] for r in out["results"]] + [r["ratio"] for r in out.get("prefill", [])]
        series = {f"base {rev}": [1.0] * len(groups), "working tree": ratios}
        for where in ("near", "far"):  # decode turns within one placement of the vCPUs (0: none seen)
            if any(f"{where}_ratio" in r for r in out["results"]):
                series[f"working tree, {where}"] = [r.get(f"{where}_ratio", 0.0) for r in out["results"]]
                series[f"working tree, {where}"] += [0.0] * len(out.get("prefill", []))
        grouped_bars(ns.plot, groups, series, "tok/s vs the base", f"working tree vs {rev}")


if __name__ == "__main__":
    main()
