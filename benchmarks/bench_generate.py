"""End-to-end generation: tandem beside transformers `generate`, same model file, same run.

(a) single-stream decode tok/s (one prompt, N new tokens, greedy, EOS ignored);
(b) 16- and 32-way decode-only aggregate tok/s against transformers' static batch of the same size
    (equal-length prompts, so the static batch needs no padding; EOS ignored);
(c) a realistic batch: 64 HumanEval prompts, natural EOS, up to 256 new tokens, 16 at a time —
    tandem's continuous batching against transformers' static batches of 16 (left-padded, each batch
    runs until its longest member stops).
Arms alternate and repeat; the table shows medians and tandem/transformers ratios.

    python benchmarks/bench_generate.py --json benchmarks/results/generate.json
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
from common import DTYPES, environment, humaneval, load_hf_reference, median  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402


def hf_generate(model, tok, prompts: list, max_new: int, natural_eos: bool) -> tuple[float, int]:
    """``prompts``: texts (left-padded batch) or token-id lists of equal length (no padding)."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if isinstance(prompts[0], str):
        enc = tok(prompts, return_tensors="pt", padding=True)
    else:
        ids = torch.tensor(prompts)
        enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    kwargs = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
    if not natural_eos:
        kwargs["min_new_tokens"] = max_new
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**enc, **kwargs)
    dt = time.perf_counter() - t0
    new = out[:, enc["input_ids"].shape[1] :]
    if natural_eos:
        count = 0
        for row in new.tolist():
            n = len(row)
            for i, t in enumerate(row):
                if t == tok.eos_token_id:
                    n = i + 1
                    break
            count += n
    else:
        count = new.numel()
    return dt, count


def tandem_generate(llm: LLM, prompts, max_new: int, natural_eos: bool) -> tuple[float, int]:
    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=not natural_eos)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def run(dtype_name: str, repeats: int, max_new: int, bar: tqdm) -> dict:
    dtype = DTYPES[dtype_name]
    hf, tok = load_hf_reference(dtype)
    results: dict[str, dict] = {}
    single_prompt = humaneval(1)[0]
    # Equal-length prompts for the decode-only comparison (no padding in the static batch).
    base = tok(humaneval(40)[-1])["input_ids"][:31]
    same_len_ids = [base + [1000 + i] for i in range(32)]
    same_len = [{"prompt_token_ids": ids} for ids in same_len_ids]
    engine_dtype = {"fp32": "float32", "bf16": "bfloat16"}[dtype_name]
    llms = {n: LLM(dtype=engine_dtype, max_num_seqs=n) for n in (1, 16, 32)}
    for _ in range(repeats):
        cases = [
            ("a_single_stream", 1, [single_prompt], [single_prompt], max_new, False),
            ("b_decode_16", 16, same_len[:16], same_len_ids[:16], max_new, False),
            ("b_decode_32", 32, same_len, same_len_ids, max_new, False),
            ("c_humaneval_64", 16, humaneval(64), None, 256, True),
        ]
        for name, width, t_prompts, h_prompts, n_new, eos in cases:
            r = results.setdefault(name, {"tandem_s": [], "hf_s": [], "tandem_tokens": 0, "hf_tokens": 0})
            dt, count = tandem_generate(llms[width], t_prompts, n_new, eos)
            r["tandem_s"].append(dt)
            r["tandem_tokens"] = count
            bar.update(1)
            if h_prompts is None:  # static batches of 16
                hp = humaneval(64)
                dts, counts = zip(*(hf_generate(hf, tok, hp[i : i + 16], n_new, eos) for i in range(0, 64, 16)))
                dt, count = sum(dts), sum(counts)
            else:
                dt, count = hf_generate(hf, tok, h_prompts, n_new, eos)
            r["hf_s"].append(dt)
            r["hf_tokens"] = count
            bar.update(1)
    for llm in llms.values():
        llm.shutdown()
    summary = {}
    for name, r in results.items():
        t, h = median(r["tandem_s"]), median(r["hf_s"])
        summary[name] = {
            "tandem_s": t,
            "hf_s": h,
            "tandem_tok_s": r["tandem_tokens"] / t,
            "hf_tok_s": r["hf_tokens"] / h,
            "tandem_tokens": r["tandem_tokens"],
            "hf_tokens": r["hf_tokens"],
            # throughput ratio for (a), (b); end-to-end time ratio for (c)
            "ratio": (h / t) if name.startswith("c_") else (r["tandem_tokens"] / t) / (r["hf_tokens"] / h),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    out = {"environment": environment(), "args": vars(ns), "results": {}}
    with tqdm(total=len(ns.dtypes) * ns.repeats * 8, desc="bench_generate") as bar:
        for d in ns.dtypes:
            out["results"][d] = run(d, ns.repeats, ns.max_new, bar)
    print(f"\n{'case':<18}{'dtype':<6}{'tandem':>12}{'transformers':>14}{'ratio':>8}")
    for d, res in out["results"].items():
        for name, r in res.items():
            unit = "s" if name.startswith("c_") else "tok/s"
            tv = r["tandem_s"] if unit == "s" else r["tandem_tok_s"]
            hv = r["hf_s"] if unit == "s" else r["hf_tok_s"]
            print(f"{name:<18}{d:<6}{tv:>10.2f}{unit:>2}{hv:>12.2f}{unit:>2}{r['ratio']:>7.2f}x")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
