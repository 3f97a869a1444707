"""The native few-row products (``native/gemv.h``, the small-linear kernel) by row count and weight dtype.

Each arm multiplies ``rows`` float32 rows by each of ``--matrices`` distinct weight matrices of one shape
(more bytes than the last-level cache, so every weight streams from memory, as in a decode step) and reports
the median time per matrix and the bytes streamed per second. Shapes default to SmolLM2-135M's MLP
products: gate/up ``3072 x 576`` and down ``576 x 1536``.

    python benchmarks/bench_gemv.py --json benchmarks/results/gemv.json
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

from tandem.model.linear import create_linear_kernels  # noqa: E402
from tandem.model.quant import Int8Weight  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="3072x576,576x1536", help="out x in, comma separated")
    p.add_argument("--rows", default="1,2,3,4,6,8,16,32")
    p.add_argument("--dtypes", default="float32,bfloat16,int8", help="int8: weight-only, a scale per row")
    p.add_argument("--matrices", type=int, default=40)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    lin = create_linear_kernels("native")  # (its kernel: the one every few-row product of the engine takes)
    rows_list = [int(r) for r in args.rows.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    kernel = lin._kernel
    assert kernel is not None, "the native kernels did not build"
    results = []
    bar = tqdm(total=len(shapes) * len(dtypes) * len(rows_list), unit="arm")
    for out, inp in shapes:
        base = [torch.randn(out, inp) for _ in range(args.matrices)]
        for dtype in dtypes:
            if dtype == torch.int8:
                quant = [Int8Weight.quantize(w) for w in base]
                weights = [qw.q for qw in quant]
                scales = [qw.scale for qw in quant]
            else:
                weights = [w.to(dtype) for w in base]
                scales = [None] * len(weights)
            mb = weights[0].numel() * weights[0].element_size() / 1e6
            for rows in rows_list:
                x = torch.randn(rows, inp)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for w, sc in zip(weights, scales):
                        kernel(x, w, scale=sc)
                    times.append((time.perf_counter() - t0) / len(weights))
                med = statistics.median(times)
                results.append({"shape": f"{out}x{inp}", "dtype": str(dtype).removeprefix("torch."),
                                "rows": rows, "ms": med * 1e3, "gb_s": mb / med / 1e3})
                bar.set_postfix_str(f"{out}x{inp} {dtype} rows {rows}")
                bar.update()
    bar.close()
    report(results, [("shape", "shape", ""), ("dtype", "dtype", ""), ("rows", "rows", ""),
                     ("ms", "ms / matrix", ".3f"), ("gb_s", "GB/s", ".1f")], args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
