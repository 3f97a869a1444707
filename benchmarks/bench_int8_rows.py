"""The interleaved block products (``native/quant_r16.h``, ``native/quant_r16_i8.h``) by row count and
activation format: float32, int8x2 (two int8 levels, the default where the kernels have VNNI or AVX2) and int8
(one level), on the default model's shapes and block types.

Matrices (random blocks, interleaved as the engine loads them): ``gate_up`` (Q4_1, 3072 x 576), ``down`` (Q4_1,
576 x 1536) and ``lm_head`` (Q8_0, 49152 x 576: the tied embedding, 30 MB, so it streams from memory). Each row
count runs the formats in turn, the order reversed every repeat, so the machine's drift hits all of them;
medians of ``--repeats`` calls. A decode step is 1 row a stream, a verify of k drafts k + 1 rows.

    python benchmarks/bench_int8_rows.py --json benchmarks/results/int8_rows_avx2.json \\
        --plot benchmarks/results/int8_rows_avx2.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import environment  # noqa: E402

from tandem.native.quant_linear import quant_linear_kernel  # noqa: E402
from tests.quant_blocks import Q, block_weight  # noqa: E402

SHAPES = {"gate_up": (Q.Q4_1, 3072, 576), "down": (Q.Q4_1, 576, 1536), "lm_head": (Q.Q8_0, 49152, 576)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 32, 64])
    p.add_argument("--activations", nargs="+", default=["float32", "int8x2", "int8"])
    p.add_argument("--repeats", type=int, default=24, help="calls per format and row count (lm_head: a third)")
    p.add_argument("--isa", default="native", help="the library variant (native, avx2, portable)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    ns = p.parse_args(argv)
    torch.set_num_threads(2)
    kernel = quant_linear_kernel(ns.isa)
    if kernel is None:
        p.error("native kernels unavailable")
    print(f"library {ns.isa}: compiled {kernel.compiled_isa}, int8 activations on {kernel.int8_path}")
    weights = {name: block_weight(q, o, i, seed=n).repacked() for n, (name, (q, o, i)) in enumerate(SHAPES.items())}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for rows in tqdm(ns.rows, desc="row counts"):
        for name, w in weights.items():
            arms = {a: w.with_activations(a) for a in ns.activations}
            x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows))
            for a in arms.values():
                kernel(x, a)  # warm: page in, build
            times: dict[str, list[float]] = {a: [] for a in arms}
            n = ns.repeats if name != "lm_head" else max(3, ns.repeats // 3)
            for i in range(n):
                for a in ns.activations if i % 2 else ns.activations[::-1]:
                    t = time.perf_counter()
                    kernel(x, arms[a])
                    times[a].append(time.perf_counter() - t)
            med = {a: sorted(v)[len(v) // 2] * 1e3 for a, v in times.items()}
            results.setdefault(str(rows), {})[name] = med
            tqdm.write(f"{rows:>3} rows {name:<8} " + "  ".join(
                f"{a} {m:.3f} ms ({med['float32'] / m:.2f}x)" if "float32" in med else f"{a} {m:.3f} ms"
                for a, m in med.items()))
    if ns.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(SHAPES), figsize=(5 * len(SHAPES), 4))
        for ax, name in zip(axes, SHAPES):
            for a in ns.activations:
                ax.plot(ns.rows, [results[str(r)][name][a] / r for r in ns.rows], marker="o", label=a)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("rows")
            ax.set_ylabel("ms per row")
            ax.set_title(f"{name} ({SHAPES[name][0].name}, {SHAPES[name][1]} x {SHAPES[name][2]})")
            ax.legend()
        fig.suptitle(f"interleaved block products by activation format ({kernel.compiled_isa}, "
                     f"int8 on {kernel.int8_path})")
        fig.tight_layout()
        fig.savefig(ns.plot, dpi=100)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"environment": environment(), "args": vars(ns),
                                             "compiled": kernel.compiled_isa, "int8_path": kernel.int8_path,
                                             "median_ms": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
