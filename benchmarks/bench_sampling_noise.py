"""The sampler's exponential noise: torch's ``exponential_``, the same numbers drawn as float64 uniforms and
transformed vectorized (``tandem.sample.rng``'s torch source), and the native counter-based streams
(``native/sample_noise.c``; every sampled row's source on the CPU by default), alone and in whole decodes.

``--mode draw``: the draw of ``[rows, V]`` noise (V = the default model's 49,152), a source a row (every row its
own key, as the engine's rows) and one batched unseeded draw, best of ``--repeats``; it checks that torch's
``exponential_`` and the vectorized float64 draw give the same bits.
``--mode decode``: no speculation, temperature 0.7, HumanEval prompts x 64 tokens at ``--concurrency``
streams, each arm an engine in its own process, arms taking turns, ``--repeats`` times each: ``torch`` (torch's
``exponential_`` patched back in for every row), ``float64`` (seeded generators and the vectorized float64
draw: the engine configured with ``sampling_noise="torch"``, the default before the native streams) and
``native`` (as shipped). Each run records the vCPUs' placement (near / far, BENCHMARKS.md §13) over it.

    python benchmarks/bench_sampling_noise.py --json benchmarks/results/sampling_noise.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import core_round_trip_ns, environment, placement_of  # noqa: E402

VOCAB = 49_152
ARMS = ("torch", "float64", "native")
LABELS = {"torch": "torch exponential_", "float64": "float64 uniforms, vectorized", "native": "native stream"}


def draw(rows: int, repeats: int) -> dict[str, float]:
    import torch

    from tandem.sample import rng
    from tandem.sample.rng import exponential_noise, make_generator

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    cpu = torch.device("cpu")
    gens = lambda: [make_generator(1000 + i, "cpu") for i in range(rows)]  # noqa: E731
    a = exponential_noise(rows, VOCAB, gens(), cpu)
    b = torch.stack([torch.empty(VOCAB).exponential_(generator=g) for g in gens()]).clamp_min_(1.1754944e-38)
    assert torch.equal(a, b), "the two draws differ"
    streams = lambda: [rng.RowStream(1000 + i) for i in range(rows)]  # noqa: E731
    out = {
        "seeded_torch_ms": best(lambda: [torch.empty(VOCAB).exponential_(generator=g) for g in gens()]),
        "seeded_float64_ms": best(lambda: exponential_noise(rows, VOCAB, gens(), cpu)),
        "seeded_native_ms": best(lambda: exponential_noise(rows, VOCAB, streams(), cpu)),
        "unseeded_torch_ms": best(lambda: torch.empty(rows, VOCAB).exponential_()),
        "unseeded_float64_ms": best(lambda: rng._exponential_(torch.empty(rows, VOCAB), None)),
        "unseeded_native_ms": best(lambda: exponential_noise(rows, VOCAB, [None] * rows, cpu)),
    }
    out["unseeded_source"] = rng.noise_source(cpu)
    return out


def decode_worker(arm: str, concurrency: int) -> None:
    import tandem.sample.rng as rng

    if arm == "torch":
        rng._exponential_ = lambda t, g: t.exponential_(generator=g)
    if arm != "native":
        rng.configure_noise("torch")
    from tandem import LLM, SamplingParams
    from tandem.bench.workloads import humaneval_requests

    prompts = [r.prompt for r in humaneval_requests(concurrency, 64, 0)]
    llm = LLM(max_num_seqs=max(concurrency, 1))
    params = SamplingParams(temperature=0.7, max_tokens=64, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    before = core_round_trip_ns()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    seconds = time.perf_counter() - t0
    print(json.dumps({"tok_s": tokens / seconds, "placement": placement_of(before, core_round_trip_ns())}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["draw", "decode", "both"], default="both")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="a PNG of the decode arms' tok/s")
    p.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        decode_worker(ns.worker[0], int(ns.worker[1]))
        return 0
    result: dict = {"environment": environment(), "draw": {}, "decode": {}}
    if ns.mode in ("draw", "both"):
        for rows in ns.rows:
            r = result["draw"][rows] = draw(rows, ns.repeats)
            print(f"draw {rows} rows: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in r.items()), flush=True)
    if ns.mode in ("decode", "both"):
        for c in ns.concurrency:
            runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
            where: dict[str, list[str]] = {arm: [] for arm in ARMS}
            for rep in range(ns.repeats):
                for arm in (ARMS if rep % 2 == 0 else ARMS[::-1]):
                    out = subprocess.run([sys.executable, __file__, "--worker", arm, str(c)], check=True,
                                         capture_output=True, text=True).stdout
                    doc = json.loads(out.strip().splitlines()[-1])
                    runs[arm].append(doc["tok_s"])
                    where[arm].append(doc["placement"])
                    print(f"decode c={c} {arm} [{rep + 1}/{ns.repeats}]: {doc['tok_s']:.1f} tok/s "
                          f"({doc['placement']})", flush=True)
            result["decode"][c] = {arm: {"runs": v, "placement": where[arm], "mean": sum(v) / len(v)}
                                   for arm, v in runs.items()}
            d = result["decode"][c]
            print(f"decode c={c}: native / float64 = {d['native']['mean'] / d['float64']['mean']:.2f}x, "
                  f"native / torch = {d['native']['mean'] / d['torch']['mean']:.2f}x", flush=True)
    result["environment"]["load_average_end"] = list(__import__("os").getloadavg())
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))
    if ns.plot and result["decode"]:
        plot(result["decode"], ns.plot)
    return 0


def plot(decode: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = sorted(decode)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(ARMS):
        ax.bar([j + 0.27 * i for j in range(len(cs))], [decode[c][arm]["mean"] for c in cs], width=0.27,
               label=LABELS[arm])
    ax.set_xticks([j + 0.27 for j in range(len(cs))], [f"{c} streams" for c in cs])
    ax.set_ylabel("output tok/s (T 0.7, no speculation)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
