"""Decode speed of a known model: tandem (its default execution) vs transformers vs llama.cpp on the same GGUF file.

  python benchmarks/bench_models.py --model gemma-3-270m --prompts 4 --max-tokens 128 \
      --json benchmarks/results/models_gemma3.json --plot benchmarks/results/models_gemma3.png

Every engine runs in its own process (bench_quant.TandemArm says why), all loaded at once and idle while another
runs; they take turns prompt by prompt, the order rotating. Each gets the same token ids (tandem's tokenizer,
equal to transformers' for these files) and decodes greedily for ``--max-tokens`` tokens without stopping, with 2
threads. Single stream: ``--prompts`` HumanEval prompts one at a time; 16-way: the same prompts cycled to 16,
decoded together (tandem ``max_num_seqs=16``; transformers ``generate`` on the left-padded batch; llama.cpp's C
API batch of 16 sequences, as ``llama-server -np 16``). Decode tok/s = tokens after the first / time from the
first to the last token (transformers: ``generate`` minus a one-token ``generate`` of the same batch).
transformers loads the file with ``gguf_file=`` (dequantized to float32: it has no quantized CPU execution).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import LlamaCpp, Worker, arm_worker
from common import environment, humaneval

from tandem.model.loader import load_tokenizer, resolve_model


class Arm(Worker):
    """``--arm tandem|transformers`` of this script in its own process."""

    def __init__(self, kind: str, model: str, n_seq: int) -> None:
        super().__init__([sys.executable, __file__, "--arm", kind, "--model", model, "--n-seq", str(n_seq)])


def tandem_arm(model: str, n_seq: int) -> None:
    """bench_quant's arm worker on ``model``: tandem's defaults, ``n_seq`` sequences at a time."""
    arm_worker({"max_num_seqs": n_seq, "max_model_len": 2048, "async_scheduling": False}, model)


def transformers_arm(model: str) -> None:
    import transformers

    torch.set_num_threads(2)
    path = resolve_model(model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    print(json.dumps({"weight_bytes": sum(p.numel() * 4 for p in hf.parameters())}), flush=True)

    def generate(prompts: list[list[int]], n: int) -> tuple[float, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=pad)
        return time.perf_counter() - t0, out[:, width:]

    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        first_s, _ = generate(msg["prompts"], 1)
        total_s, toks = generate(msg["prompts"], msg["max_tokens"])
        print(json.dumps({"tokens": toks.tolist(), "decode_s": total_s - first_s,
                          "decode_tokens": len(msg["prompts"]) * (msg["max_tokens"] - 1)}), flush=True)


def run(ns: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model(ns.model)
    tok = load_tokenizer(ns.model)
    ids = [tok.encode(p) for p in humaneval(ns.prompts)]
    result: dict[str, Any] = {"model": ns.model, "file": path.name, "max_tokens": ns.max_tokens}
    for label, n_seq, batches in (
        ("single_stream", 1, [[p] for p in ids]),
        ("batch16", 16, [[ids[i % len(ids)] for i in range(16)]] * ns.repeats),
    ):
        arms: dict[str, Worker] = {}
        for kind in tqdm(("tandem", "transformers"), desc=f"{label}: load"):
            arms[kind] = Arm(kind, ns.model, n_seq)
        if ns.llamacpp_python:
            arms["llama.cpp"] = LlamaCpp(ns.llamacpp_python, path, 16)
        names = list(arms)
        rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        outputs: dict[str, list[list[list[int]]]] = {n: [] for n in names}
        bar = tqdm(total=len(names) * len(batches), desc=label)
        for i, batch in enumerate(batches):
            k = i % len(names)
            for n in names[k:] + names[:k]:
                r = arms[n].ask(cmd="generate", prompts=batch, max_tokens=ns.max_tokens)
                rows[n].append({"decode_s": r["decode_s"], "decode_tokens": r["decode_tokens"]})
                outputs[n].append(r["tokens"])
                bar.update(1)
        bar.close()
        res = []
        for n in names:
            rate = sum(r["decode_tokens"] for r in rows[n]) / sum(r["decode_s"] for r in rows[n])
            same = sum(a == b for out_a, out_b in zip(outputs[n], outputs["tandem"]) for a, b in zip(out_a, out_b))
            res.append({"arm": n, "decode_tok_s": rate, "sequences_equal_to_tandem": same,
                        "sequences": sum(len(b) for b in batches), "info": arms[n].info if n != "llama.cpp" else None})
        for r in res:
            for peer in ("transformers", "llama.cpp"):
                other = next((x for x in res if x["arm"] == peer), None)
                if other:
                    r[f"vs_{peer}"] = r["decode_tok_s"] / other["decode_tok_s"]
        result[label] = res
        for w in arms.values():
            w.close()
    return result


def plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, label in zip(axes, ("single_stream", "batch16")):
        rows = res[label]
        ax.bar([r["arm"] for r in rows], [r["decode_tok_s"] for r in rows], color=["C0", "C1", "C2"][: len(rows)])
        for i, r in enumerate(rows):
            ax.text(i, r["decode_tok_s"], f"{r['decode_tok_s']:.1f}", ha="center", va="bottom")
        ax.set_title(f"{res['model']}: {label.replace('_', ' ')}")
        ax.set_ylabel("decode tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="16-way rounds per engine")
    ap.add_argument("--llamacpp-python", default=".venv-llamacpp/bin/python",
                    help="the peer's venv python ('' to skip llama.cpp)")
    ap.add_argument("--arm", choices=["tandem", "transformers"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n-seq", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ns = ap.parse_args(argv)
    if ns.arm == "tandem":
        tandem_arm(ns.model, ns.n_seq)
        return 0
    if ns.arm == "transformers":
        transformers_arm(ns.model)
        return 0
    res = {"environment": environment(), **run(ns), "command": " ".join(["python", *sys.argv])}
    text = json.dumps(res, indent=2)
    print(text)
    if ns.json:
        Path(ns.json).write_text(text + "\n")
    if ns.plot:
        plot(res, ns.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
