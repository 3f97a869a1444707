"""How wide a step the native decoder stack should take: the engine's decode and verify steps with the
stack limited to ``--narrow`` rows (8: its first limit; 64: its limit before wider steps took the products in
slices; wider steps run the torch layers) against the default limit (``NativeDecode.max_rows``: 256 rows on
the default model's interleaved blocks with int8 activations, 64 otherwise), arms interleaved.

Each case starts N greedy streams of the default model (SmolLM2-135M-Instruct, Q4_1 blocks), steps past the
prefills, then times every step until the streams finish; rounds alternate the arms, so drift in the
machine's speed hits both. A case ``N`` is N-way decode (N rows a step); ``N:eagle3`` adds EAGLE-3 with 3
drafts every step (fixed policy: 4N rows a verify step), ``N:eagle3:K`` with K drafts ((K + 1) N rows).

    python benchmarks/bench_stack_rows.py --json benchmarks/results/stack_rows.json \
        --plot benchmarks/results/stack_rows.png
    python benchmarks/bench_stack_rows.py --narrow 64 --cases 64 32:eagle3:1 64:eagle3:1 32:eagle3 \
        --json benchmarks/results/stack_rows_wide.json --plot benchmarks/results/stack_rows_wide.png

``--forward BxQ ...`` times the model's forward alone instead (logits of every row included, as a verify takes
them): B requests of Q rows after 256 cached tokens, the stack against the torch layers (same weights, int8x2
activations), alternating step by step, 24 steps each (medians of the last 22) — the engine's steps above also
carry sampling, drafting and the host's work, whose spread hides a few per cent:

    python benchmarks/bench_stack_rows.py --forward 16x4 32x2 32x4 64x2 48x4 64x4 \
        --json benchmarks/results/stack_rows_forward.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, grouped_bars  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402
from tandem.model.native_decode import NativeDecode  # noqa: E402


def stack_of(llm: LLM) -> NativeDecode:
    model = llm.engine.core.executor.runner.model
    nd = model._native_decode()
    if nd is None:
        raise SystemExit("the native decoder stack is off here (no compiler, TANDEM_NATIVE_DECODE=0 or not the CPU)")
    return nd


def run_case(n: int, spec: str | None, k: int, rounds: int, max_tokens: int, narrow: int) -> dict[str, object]:
    sc = None if spec is None else {"method": spec, "num_speculative_tokens": k, "policy": "fixed"}
    llm = LLM(max_num_seqs=n, speculative_config=sc)
    nd = stack_of(llm)
    wide = nd.max_rows
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    times: dict[str, list[float]] = {"narrow": [], "wide": []}
    for rnd in range(rounds):
        arms = (("narrow", narrow), ("wide", wide))
        for arm, limit in arms if rnd % 2 == 0 else arms[::-1]:
            nd.max_rows = limit
            for i in range(n):
                llm.add_request(f"def function_{rnd}_{i}(values):\n    ", params)
            for _ in range(8):  # the prefills and the first decode steps
                llm.step()
            steps, start = 0, time.perf_counter()
            while llm.has_unfinished_requests():
                llm.step()
                steps += 1
            times[arm].append((time.perf_counter() - start) * 1e3 / steps)
            print(f"  n={n} spec={spec} round {rnd + 1}/{rounds} {arm} (<= {limit} rows): "
                  f"{times[arm][-1]:.1f} ms/step", flush=True)
    nd.max_rows = wide
    llm.shutdown()
    narrow_ms, wide_ms = statistics.median(times["narrow"]), statistics.median(times["wide"])
    rows = n * (1 if spec is None else k + 1)
    return {"n": n, "spec": spec or "none", "k": k, "rows": rows, "wide_limit": wide, "narrow_limit": narrow,
            "narrow_ms": narrow_ms,
            "wide_ms": wide_ms, "speedup": narrow_ms / wide_ms, "runs": times}


def run_forward(shapes: list[str], steps: int = 24, context: int = 256) -> list[dict[str, object]]:
    """The forward alone, the stack against the torch layers (``--forward``)."""
    import torch
    from bench_native_decode import steps_for

    from tandem.model import CausalLM
    from tandem.model.loader import DEFAULT_MODEL, load_checkpoint

    ckpt = load_checkpoint(DEFAULT_MODEL, keep_quantized=True)

    def build(stack: bool) -> CausalLM:
        m = CausalLM.from_tensors(ckpt.args, ckpt.tensors, torch.float32, "cpu", quant_activations="int8x2")
        if not stack:
            m._native, m._native_resolved = None, True  # the torch layers
        return m

    ms, ml = build(True), build(False)
    limit = ms._native_decode().max_rows  # type: ignore[union-attr]
    out = []
    for shape in shapes:
        b, q = map(int, shape.split("x"))
        arms = {"stack": (steps_for(ms, b, q, context, steps), []), "layers": (steps_for(ml, b, q, context, steps), [])}
        for i in range(steps):
            for name in ("stack", "layers") if i % 2 == 0 else ("layers", "stack"):
                fns, times = arms[name]
                start = time.perf_counter()
                fns[i]()
                times.append((time.perf_counter() - start) * 1e3)
        stack_ms, layers_ms = (statistics.median(arms[a][1][2:]) for a in ("stack", "layers"))
        row = {"shape": shape, "rows": b * q, "stack_limit": limit, "stack_ms": stack_ms, "layers_ms": layers_ms,
               "layers_over_stack": layers_ms / stack_ms}
        print(f"{shape} ({b * q} rows): stack {stack_ms:.1f} ms, torch layers {layers_ms:.1f} ms, "
              f"{layers_ms / stack_ms:.3f}x" + ("" if b * q <= limit else " (past the stack's limit: both torch)"),
              flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["16", "32", "64", "4:eagle3", "16:eagle3"],
                    help="N (N-way decode), N:METHOD (fixed 3 drafts) or N:METHOD:K")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per case, arms alternating (default 4)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--narrow", type=int, default=8, help="the narrow arm's row limit (default 8)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--forward", nargs="+", metavar="BxQ", help="time the forward alone at these shapes")
    args = ap.parse_args()
    if args.forward:
        rows = run_forward(args.forward)
        if args.json:
            Path(args.json).write_text(json.dumps({"environment": environment(), "args": vars(args),
                                                   "results": rows}, indent=1))
        return
    results = []
    for case in args.cases:
        n, spec, k = (case.split(":") + ["", ""])[:3]
        results.append(run_case(int(n), spec or None, int(k or 3), args.rounds, args.max_tokens, args.narrow))
    print(f"\n| case | rows a step | stack <= {args.narrow} rows ms | stack <= limit ms | speed-up |")
    print("|---|---|---|---|---|")
    for r in results:
        name = f"{r['n']}-way" + ("" if r["spec"] == "none" else f" + {r['spec']} k={r['k']}")
        print(f"| {name} | {r['rows']} | {r['narrow_ms']:.1f} | {r['wide_ms']:.1f} | {r['speedup']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "args": vars(args),
                                               "results": results}, indent=1))
    if args.plot:
        groups = [f"{r['n']}" + ("" if r["spec"] == "none" else f"+{r['spec']} k={r['k']}") + f"\n{r['rows']} rows"
                  for r in results]
        grouped_bars(args.plot, groups, {f"stack <= {args.narrow} rows, torch layers above":
                                         [r["narrow_ms"] for r in results],
                                         "stack <= its limit": [r["wide_ms"] for r in results]},
                     "ms per step (median)", "SmolLM2-135M Q4_1 decode/verify steps: native stack width")

if __name__ == "__main__":
    main()
