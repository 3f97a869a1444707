"""Prefill speed, tandem against llama.cpp on the same GGUF file: one prompt of N tokens, time to its first token.

Both engines in processes of their own (``bench_quant.TandemArm``, ``bench_quant.LlamaCpp``: the peer's venv made
by ``benchmarks/peers/setup_llamacpp.sh``), 2 threads, the same token ids (HumanEval text repeated to N tokens),
arms taking turns, best of ``--repeats``. tandem: the default engine (GGUF blocks, its default activations),
prefix caching off and the whole prompt in one step; llama.cpp: its C API, ``n_batch`` 512 (its default
micro-batch), the prompt's KV cleared before each repeat.

    python benchmarks/bench_prefill.py --lengths 128 512 2048 --json benchmarks/results/prefill_vs_llamacpp.json \\
        --plot benchmarks/results/prefill_vs_llamacpp.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import MODEL, LlamaCpp, TandemArm  # noqa: E402
from common import environment, finish_json, grouped_bars, humaneval  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tandem.model.loader import load_tokenizer, resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", type=int, default=[128, 512, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llamacpp-python", default=".venv-llamacpp/bin/python")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ns = ap.parse_args()
    tok = load_tokenizer(MODEL)
    text = [t for p in humaneval(32) for t in tok.encode(p)]
    longest = max(ns.lengths)
    tandem = TandemArm({"max_num_seqs": 1, "max_model_len": max(2048, longest + 16), "max_num_batched_tokens": longest,
                        "enable_prefix_caching": False})
    peer = LlamaCpp(ns.llamacpp_python, resolve_model(MODEL), 1)
    out: dict[str, Any] = {"environment": environment(), "args": vars(ns),
                           "llamacpp_system_info": peer.info.get("system_info"), "results": []}
    for n in ns.lengths:
        ids = (text * (n // len(text) + 1))[:n]
        rates: dict[str, list[float]] = {"tandem": [], "llama.cpp": []}
        for rep in tqdm(range(ns.repeats), desc=f"prefill {n}"):
            for arm in ("tandem", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "tandem"):
                if arm == "tandem":
                    s = tandem.ask(cmd="prefill", ids=ids)["prefill_s"]
                else:
                    s = peer.ask(cmd="generate", prompts=[ids], max_tokens=1)["prefill_s"]
                rates[arm].append(n / s)
        row = {"prompt_tokens": n, **{f"{a}_tok_s": max(v) for a, v in rates.items()}}
        row["ratio"] = row["tandem_tok_s"] / row["llama.cpp_tok_s"]
        out["results"].append(row)
        print(f"prefill {n:<5} tandem {row['tandem_tok_s']:8.1f} tok/s  llama.cpp {row['llama.cpp_tok_s']:8.1f} tok/s  "
              f"{row['ratio']:5.2f}x", flush=True)
    tandem.close()
    peer.close()
    finish_json(ns.json, out)
    if ns.plot:
        groups = [f"{r['prompt_tokens']} tokens" for r in out["results"]]
        grouped_bars(ns.plot, groups, {a: [r[f"{a}_tok_s"] for r in out["results"]] for a in ("tandem", "llama.cpp")},
                     "prefill tok/s", "prefill: tandem vs llama.cpp (same GGUF file, 2 threads)")


if __name__ == "__main__":
    main()
