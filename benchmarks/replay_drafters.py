"""Replay model-free drafters over recorded greedy outputs: how many tokens a step each would commit on the
code-editing workload of ``bench_suffix.py``, without running the model again.

The greedy outputs of the edit prompts are generated once (no speculation; ``--outputs`` caches them). A greedy
verify accepts exactly the drafts that match the recorded continuation, so replaying a drafter over each
request's prompt + output, step by step (drafts up to ``--k``, all verified, the accepted prefix plus one token
committed), gives the tokens a step it would reach with the fixed policy — and a change to a drafter can be judged
in seconds. ``tok/ms`` prices a step with a line ``--step-ms + --row-ms`` x drafts (one stream on this machine:
~5 ms and ~0.75 ms a verify row, BENCHMARKS.md §20), a rough guide; the engine's adaptive policy verifies
fewer drafts than are made. ``oracle tok/ms`` prices the same steps as if only the drafts that were accepted had
been verified — what a policy that knew where each draft fails would reach with the drafter's candidates (its
steps and accepted tokens as they are). Suffix decoding runs the engine's own code (``SuffixProposer.draft``) with its
global index fed each finished request's output in turn, as the server's would be; ngram runs
``propose_ngram``.

    python benchmarks/replay_drafters.py --prompts 40 --k 8
    python benchmarks/replay_drafters.py --own-weight 1 4   # suffix with each weight of the request's own index
    python benchmarks/replay_drafters.py --first 60 --prompts 60 --k 24 --outputs /tmp/edit_60.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_suffix import edit_prompts  # noqa: E402

from tandem.spec_decode import suffix  # noqa: E402
from tandem.spec_decode.ngram import propose_ngram  # noqa: E402
from tandem.spec_decode.suffix import SuffixIndex, SuffixProposer  # noqa: E402


def record(n: int, path: Path, first: int = 0) -> list[dict[str, list[int]]]:
    """The greedy outputs of ``n`` edit prompts from HumanEval function ``first`` on (192 new tokens at most),
    cached in ``path``."""
    if path.exists():
        return json.loads(path.read_text())
    from tandem import LLM, SamplingParams

    llm = LLM(max_num_seqs=8)
    outs = llm.chat(edit_prompts(n, first), SamplingParams(max_tokens=192, temperature=0), use_tqdm=True)
    data = [{"prompt": list(o.prompt_token_ids), "out": list(o.outputs[0].token_ids)} for o in outs]
    path.write_text(json.dumps(data))
    return data


def replay(data: list[dict[str, list[int]]], draft, k: int, step_ms: float, row_ms: float,
           finish=None) -> dict[str, float]:
    """``draft(tokens, limit, own_index_state)`` -> drafts; ``finish(tokens, num_prompt)``: a request left."""
    steps = tokens = drafted = accepted = 0
    ms = oracle_ms = 0.0
    for item in data:
        prompt, full = item["prompt"], item["prompt"] + item["out"]
        state: dict = {}
        p = len(prompt) + 1  # the first output token comes from the prefill
        while p < len(full):
            d = draft(full[:p], min(k, len(full) - p), state)
            a = 0
            while a < len(d) and full[p + a] == d[a]:
                a += 1
            steps, drafted, accepted, p = steps + 1, drafted + len(d), accepted + a, p + a + 1
            ms += step_ms + row_ms * len(d)
            oracle_ms += step_ms + row_ms * a
        tokens += len(full) - len(prompt) - 1
        if finish is not None:
            finish(full, len(prompt))
    return {"tokens_per_step": tokens / steps, "steps": steps, "drafted": drafted,
            "acceptance_rate": accepted / max(drafted, 1), "tok_per_ms": tokens / ms,
            "oracle_tok_per_ms": tokens / oracle_ms}


def ngram_drafter(min_n: int = 1, max_n: int = 4):
    def draft(tokens: list[int], limit: int, _state: dict) -> list[int]:
        t = torch.tensor([tokens])
        out = propose_ngram(t, torch.tensor([len(tokens)]), min_n, max_n, torch.tensor([limit]), limit)[0]
        return [x for x in out.tolist() if x >= 0]
    return draft, None


def suffix_drafter(k: int):
    prop = SuffixProposer(k, 24, 256, 1.0, 0.1)  # the engine's defaults

    def draft(tokens: list[int], limit: int, state: dict) -> list[int]:
        index = state.setdefault("index", SuffixIndex(prop.depth))
        index.add(tokens, state.get("done", 0))
        state["done"] = len(tokens)
        return prop.draft(index, tokens, limit)

    def finish(tokens: list[int], num_prompt: int) -> None:
        prop.global_index.add(tokens, num_prompt)
    return draft, finish


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--first", type=int, default=0, help="the first HumanEval function (bench_suffix.py: 0 ..)")
    ap.add_argument("--k", type=int, default=8, help="drafts a step at most (all verified)")
    ap.add_argument("--own-weight", type=int, nargs="+", default=[1, suffix.OWN_WEIGHT],
                    help="suffix.OWN_WEIGHT values to replay (1: both indexes counted alike)")
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--row-ms", type=float, default=0.75)
    ap.add_argument("--outputs", default="/tmp/tandem_edit_outputs.json", help="cache of the greedy outputs")
    ns = ap.parse_args()
    data = record(ns.prompts, Path(ns.outputs), ns.first)
    print(f"{len(data)} requests, {sum(len(d['out']) for d in data)} output tokens, k = {ns.k}")
    d, _ = ngram_drafter()
    rows = [(f"ngram (1-4), k = {ns.k}", replay(data, d, ns.k, ns.step_ms, ns.row_ms))]
    if ns.k != 8:  # ngram's better k in the engine (BENCHMARKS.md §20); its drafter keeps no state
        rows.insert(0, ("ngram (1-4), k = 8", replay(data, d, 8, ns.step_ms, ns.row_ms)))
    for w in ns.own_weight:
        suffix.OWN_WEIGHT = w
        d, fin = suffix_drafter(ns.k)
        rows.append((f"suffix, own weight {w}", replay(data, d, ns.k, ns.step_ms, ns.row_ms, fin)))
    print("| drafter | tokens a step | steps | drafted | acceptance rate | tok/ms (line) | x ngram | oracle tok/ms |")
    print("|---|---|---|---|---|---|---|---|")
    base = rows[0][1]["tok_per_ms"]
    for name, r in rows:
        print(f"| {name} | {r['tokens_per_step']:.3f} | {r['steps']} | {r['drafted']} | {r['acceptance_rate']:.2f} "
              f"| {r['tok_per_ms']:.4f} | {r['tok_per_ms'] / base:.3f} | {r['oracle_tok_per_ms']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
