"""Chain vs tree acceptance of the shipped draft heads on the report split (issue 25).

For every shipped head of the default model (EAGLE, EAGLE-3, MTP) and every shape — the chain of 3 drafts the
engine runs today and draft trees (``top_k`` x ``depth`` -> ``max_nodes`` verified) — the reference tree loop
(``tandem/spec_decode/tree_reference.py``: one stream, greedy, natural EOS) generates up to 128 tokens for
each HumanEval prompt of the report split (problems 100-163: never used to train the heads nor to choose
them), and the mean acceptance length (tokens per target step) is reported, with the outputs checked
against plain greedy decoding through the same loop. Time per token is that of the reference loop (Python,
host round trips), not the engine's: acceptance is the measure here.

    python benchmarks/bench_tree_acceptance.py --json benchmarks/results/tree_acceptance.json \\
        --plot benchmarks/results/tree_acceptance.png

``--methods eagle --model DIR`` measures another head of one method (a retrained one, say) instead of the
shipped head.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, grouped_bars, humaneval  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402
from tandem.spec_decode.tree_draft import TreeShape  # noqa: E402
from tandem.spec_decode.tree_reference import generate  # noqa: E402

REPORT_SPLIT = range(100, 164)  # HumanEval problems never used to train or choose a head


def verify_ms(model, rows: int, context: int = 256, repeats: int = 15) -> float:  # type: ignore[no-untyped-def]
    """Median time of one target forward (+ logits) of ``rows`` query rows after ``context`` cached tokens,
    single request: what a verify step of a tree of ``rows - 1`` nodes costs the target (a chain's rows
    cost the same as a tree's of as many nodes)."""
    import statistics

    import torch

    from tandem.model.forward_batch import KVCache
    from tandem.model.paged_batch import PagedRequest, build_forward_batch

    a, bs = model.args, 16
    blocks = list(range(-(-(context + rows) // bs)))
    kv = KVCache.allocate(model.num_layers, len(blocks), bs, a.num_key_value_heads, a.head_dim, model.dtype, "cpu")
    with torch.inference_mode():
        model(build_forward_batch([PagedRequest([1] * context, 0, blocks)], bs), kv)
        times = []
        for _ in range(repeats):
            batch = build_forward_batch([PagedRequest([2] * rows, context, blocks, parents=list(range(rows - 1)))], bs)
            t = time.perf_counter()
            model.compute_logits(model(batch, kv).hidden_states)
            times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def parse_shape(text: str) -> TreeShape:
    k, d, n = (int(x) for x in text.split(","))
    return TreeShape(k, d, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["eagle", "eagle3", "mtp"])
    ap.add_argument("--shapes", nargs="+", default=["1,3,3", "2,3,6", "3,4,12", "4,4,16"],
                    help="top_k,depth,max_nodes (1,k,k: the chain)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None, help="first N prompts of the split only")
    ap.add_argument("--model", default=None,
                    help="a head directory to measure instead of the shipped one (one method only)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    if args.model and len(args.methods) != 1:
        ap.error("--model names one head: give exactly one method")
    texts = [humaneval(max(REPORT_SPLIT) + 1)[i] for i in REPORT_SPLIT][: args.limit]
    shapes = [parse_shape(s) for s in args.shapes]
    results = []
    for method in args.methods:
        sc = {"method": method, "num_speculative_tokens": 3}
        if args.model:
            sc["model"] = args.model
        llm = LLM(speculative_config=sc)
        runner = llm.engine.core.executor.runner
        model, proposer = runner.model, runner.proposer
        # Everything runs on the engine's worker thread: torch's OpenMP team belongs to the thread that built the
        # model, and a second team on this thread would oversubscribe the cores.
        pool = llm.engine.core.executor._pool

        def on_worker(fn, *a, **kw):  # type: ignore[no-untyped-def]
            return pool.submit(fn, *a, **kw).result()

        tok = llm.get_tokenizer()
        eos = frozenset(getattr(tok, "eos_token_ids", None) or {tok.eos_token_id})
        prompts = [list(o.prompt_token_ids) for o in
                   llm.generate(texts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)]
        plain = [on_worker(generate, model, proposer, p, args.max_tokens, None, stop_token_ids=eos).tokens
                 for p in tqdm(prompts, desc=f"{method} plain greedy")]
        one_row = on_worker(verify_ms, model, 1)
        for shape in shapes:
            lengths: list[int] = []
            mismatches, tokens = 0, 0
            start = time.perf_counter()
            for p, want in zip(tqdm(prompts, desc=f"{method} {shape.top_k}x{shape.depth}->{shape.max_nodes}"), plain):
                run = on_worker(generate, model, proposer, p, args.max_tokens, shape, stop_token_ids=eos)
                lengths += run.accepted_lengths
                tokens += len(run.tokens)
                mismatches += run.tokens != want
            elapsed = time.perf_counter() - start
            verify = on_worker(verify_ms, model, shape.max_nodes + 1)
            results.append({
                "method": method, "top_k": shape.top_k, "depth": shape.depth, "max_nodes": shape.max_nodes,
                "chain": shape.top_k == 1, "steps": len(lengths), "tokens": tokens,
                "mean_acceptance_length": sum(lengths) / len(lengths), "outputs_differing": mismatches,
                "reference_loop_ms_per_token": 1e3 * elapsed / tokens,
                "decode_step_ms": one_row, "verify_step_ms": verify,
                # tokens per target step over the step's cost relative to a decode step: the speed-up over plain
                # decoding if drafting were free (an upper bound)
                "target_bound_speedup": (sum(lengths) / len(lengths)) * one_row / verify,
            })
            print(json.dumps(results[-1]), flush=True)
        llm.shutdown()
    print("\n| head | shape (top_k x depth -> nodes) | mean acceptance length | vs chain | verify step ms (decode ms) "
          "| bound on speed-up (drafting free) | outputs differing from greedy |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        chain = next((c for c in results if c["method"] == r["method"] and c["chain"]), None)
        ratio = r["mean_acceptance_length"] / chain["mean_acceptance_length"] if chain else float("nan")
        name = "chain" if r["chain"] else "tree"
        print(f"| {r['method']} | {name} {r['top_k']}x{r['depth']} -> {r['max_nodes']} | "
              f"{r['mean_acceptance_length']:.2f} | {ratio:.2f}x | {r['verify_step_ms']:.1f} ({r['decode_step_ms']:.1f}) | "
              f"{r['target_bound_speedup']:.2f}x | {r['outputs_differing']} / {len(texts)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "args": vars(args),
                                               "split": f"HumanEval problems {min(REPORT_SPLIT)}-{max(REPORT_SPLIT)}",
                                               "results": results}, indent=1))
    if args.plot:
        series = {}
        for shape in shapes:
            label = "chain k=3" if shape.top_k == 1 else f"tree {shape.top_k}x{shape.depth} -> {shape.max_nodes}"
            series[label] = [next(r["mean_acceptance_length"] for r in results if r["method"] == m
                                  and (r["top_k"], r["depth"], r["max_nodes"]) == (shape.top_k, shape.depth, shape.max_nodes))
                             for m in args.methods]
        grouped_bars(args.plot, args.methods, series, "mean acceptance length (tokens / step)",
                     "SmolLM2-135M heads, HumanEval 100-163, greedy, 128 tokens: chain vs tree")

if __name__ == "__main__":
    main()
