"""The native paged-attention kernel alone: one request's short queries over every layer's cache.

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head size 64, 30 layers, block size 16) with
random float32 caches on shuffled blocks; ``q_len`` 1 (a decode) and 4 (a k = 3 verify) at several
context lengths. Reports the median time of the 30 calls (one step's attention).

    python benchmarks/bench_paged_kernel.py --json benchmarks/results/paged_kernel.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report  # noqa: E402

from tandem.native.paged_attention import paged_attention_kernel  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--q-lens", default="1,4")
    p.add_argument("--contexts", default="64,128,256,512,1024")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    kernel = paged_attention_kernel()
    if kernel is None:
        raise SystemExit("the native paged-attention kernel is unavailable here")
    bs, heads, kvh, hd, layers = 16, 9, 3, 64, 30
    contexts = [int(c) for c in args.contexts.split(",")]
    nb = -(-(max(contexts) + 8) // bs) + 1
    gen = torch.Generator().manual_seed(0)
    kc = [torch.randn(nb, bs, kvh, hd, generator=gen) for _ in range(layers)]
    vc = [torch.randn(nb, bs, kvh, hd, generator=gen) for _ in range(layers)]
    results = []
    cases = [(int(ql), c) for ql in args.q_lens.split(",") for c in contexts]
    for ql, ctx in tqdm(cases, unit="case"):
        n = ctx + ql
        table = torch.randperm(nb, generator=gen)[: -(-n // bs)].view(1, -1).contiguous()
        i64 = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        ix = kernel.indices(table, i64(n), i64(0), i64(0), i64(ql), ql)
        q = torch.randn(ql, heads, hd, generator=gen)
        out = torch.empty_like(q)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for layer in range(layers):
                kernel(q, out, kc[layer], vc[layer], ix, hd**-0.5)
            times.append(time.perf_counter() - t0)
        results.append({"q_len": ql, "context": ctx, "ms": statistics.median(times) * 1e3})
    report(results, [("q_len", "q_len", ""), ("context", "context", ""), ("ms", "ms (30 layers)", ".3f")], args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
