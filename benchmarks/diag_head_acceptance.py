"""Where a drafter loses acceptance: the trainer's exact offline estimate (teacher-forced chains over the
target's own greedy responses, ``train/unroll.py``) per prompt, on HumanEval and on training-style prompts of
another seed, and the response of the first prompts with every missed first draft marked ``[target|draft]``.

    python benchmarks/diag_head_acceptance.py --method eagle3 --prompts 16 --show 3

The estimate is over *every* position of a response; it needs no engine run per head, so candidate heads can
be compared in minutes. The engine drafts only where a step starts — after a miss more often than not, and a
position after a miss is a harder one — so it measures less on the same responses. ``--engine`` shows where
the difference comes from: the engine's own first drafts (the head at a fixed k, one stream, synchronous,
traced), their acceptance against the estimate's at the very positions the engine drafted from, and the share
of those positions whose target token the draft vocabulary does not hold.

    python benchmarks/diag_head_acceptance.py --method eagle3 --prompts 16 --show 0 --engine --k 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import humaneval  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402
from tandem.model.loader import load_tokenizer  # noqa: E402
from tandem.spec_decode.eagle import shared_head_tensors  # noqa: E402
from tandem.spec_decode.eagle_checkpoint import load_eagle_head, load_mtp_layer  # noqa: E402
from tandem.spec_decode.head import DraftHead  # noqa: E402
from tandem.spec_decode.shipped import SHIPPED_DIR  # noqa: E402
from tandem.spec_decode.train.data import Dataset, _capture_model, capture  # noqa: E402
from tandem.spec_decode.train.tasks import task_prompts  # noqa: E402
from tandem.spec_decode.train.trainer import make_batch  # noqa: E402
from tandem.spec_decode.train.unroll import acceptance, unrolled_forward  # noqa: E402

TARGET = "smollm2-135m-instruct"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="eagle3", choices=["eagle", "eagle3", "mtp"])
    p.add_argument("--head", default=None,
                   help="head directory (mtp: a directory with the MTP layer); default: shipped")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--show", type=int, default=2, help="HumanEval responses to print with misses marked")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--engine", action="store_true",
                   help="also run the engine (fixed k, one stream) on the HumanEval prompts and compare its first "
                        "drafts with the estimate at the positions it drafted from")
    ns = p.parse_args()
    tok = load_tokenizer(TARGET)
    if ns.engine and ns.method == "mtp":
        p.error("--engine: eagle or eagle3 (an mtp head is served inside its target checkpoint)")
    if ns.method == "mtp" and not ns.head:
        p.error("--head: the mtp target checkpoint directory (train-drafter --out)")
    path = Path(ns.head or SHIPPED_DIR / f"{TARGET}-{ns.method}")
    model, _ = _capture_model(TARGET, ())
    n_layers = model.args.num_hidden_layers
    if ns.method == "mtp":
        cfg, tensors = load_mtp_layer(path, model.args)
    else:
        cfg, tensors = load_eagle_head(path, ns.method, n_layers)
    aux = tuple(i - 1 for i in cfg.aux_layer_ids) if ns.method == "eagle3" else ()
    embed, lm_head, dmap = shared_head_tensors(cfg, tensors, model, share_always=ns.method == "mtp")
    head = DraftHead(cfg, tensors, embed=embed, lm_head=lm_head, draft_map=dmap).eval()
    vd = cfg.draft_vocab_size
    draft_ids = dmap if dmap is not None else torch.arange(vd)
    vocab_index = torch.full((cfg.vocab_size,), -100, dtype=torch.int64)
    vocab_index[draft_ids] = torch.arange(vd)

    llm = LLM(TARGET, max_num_seqs=16, async_scheduling=False)
    sets = {"humaneval": humaneval(ns.prompts),
            "tasks (seed 9: same families, new prompts)": task_prompts(ns.prompts, seed=9)}
    for name, prompts in sets.items():
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=ns.max_tokens), use_tqdm=False)
        seqs = [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs]
        plens = [len(o.prompt_token_ids) for o in outs]
        final, aux_h, argmax = capture(model, seqs, aux or (0, 0, 0))
        offsets = [0]
        for s in seqs:
            offsets.append(offsets[-1] + len(s))
        data = Dataset(torch.tensor([t for s in seqs for t in s]), offsets, plens, final, aux_h, argmax.long())
        total, chains, per_prompt = torch.zeros(ns.k + 1, dtype=torch.int64), 0, []
        first_hits: list[dict[int, bool]] = []  # per prompt: position q -> the first draft after q + 1 was right
        with torch.no_grad():
            for i in range(len(seqs)):
                batch = make_batch(data, [i], ns.method, vocab_index)
                steps = unrolled_forward(head, batch, ns.k)
                hist, n = acceptance(steps, batch)
                total += hist
                chains += n
                per_prompt.append(1 + sum(int(hist[j:].sum()) for j in range(1, ns.k + 1)) / max(n, 1))
                pred, lab = steps[0].logits.argmax(-1)[0], batch.labels[0]
                if name == "humaneval" and ns.engine:
                    first_hits.append({q: int(lab[q]) >= 0 and int(pred[q]) == int(lab[q])
                                       for q in range(plens[i] - 1, len(seqs[i]) - 1)})
                if name == "humaneval" and i < ns.show:
                    marks = []
                    for q in range(plens[i] - 1, len(seqs[i]) - 1):
                        want = int(data.argmax[offsets[i] + q + 1])
                        hit = int(lab[q]) >= 0 and int(pred[q]) == int(lab[q])
                        got = tok.decode([int(draft_ids[pred[q]])])
                        marks.append(tok.decode([want]) if hit else f"[{tok.decode([want])}|{got}]")
                    print(f"--- humaneval {i}:", "".join(marks).replace("\n", "\\n"))
        at = [int(total[j:].sum()) for j in range(1, ns.k + 1)]
        print(f"{name}: acceptance length {1 + sum(at) / chains:.3f}, per position "
              f"{[round(a / chains, 3) for a in at]}, {chains} chains")
        print("  per prompt:", [round(x, 2) for x in per_prompt])
        if name == "humaneval":
            humaneval_run = (prompts, seqs, plens, first_hits)
    llm.shutdown()
    if ns.engine:
        compare_engine(ns, *humaneval_run, covered=set(draft_ids.tolist()))


def engine_drafts(ns: argparse.Namespace, prompts: list[str], seqs: list[list[int]],
                  plens: list[int]) -> tuple[list[list[tuple[int, int]]], float]:
    """Per prompt, the engine's verify steps as (context length at drafting, drafts accepted): the method's
    head at a fixed ``--k``, one stream, synchronous, from the trace's scheduled tokens and committed counts;
    and the engine's mean acceptance length over the run."""
    spec = {"method": ns.method, "num_speculative_tokens": ns.k, "policy": "fixed"}
    if ns.head:
        spec["model"] = ns.head
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        llm = LLM(TARGET, max_num_seqs=1, async_scheduling=False, speculative_config=spec, trace_file=str(trace))
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=ns.max_tokens), use_tqdm=False)
        length = float(llm.spec_decode_stats()["mean_acceptance_length"])  # type: ignore[arg-type]
        llm.shutdown()
        events = json.loads(trace.read_text())
    for o, s in zip(outs, seqs):  # speculation keeps greedy outputs: the same responses
        assert list(o.prompt_token_ids) + list(o.outputs[0].token_ids) == s, "engine output differs from greedy"
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps: dict[int, dict[str, int]] = {}
    for e in events:
        a = e.get("args", {})
        if e.get("ph") == "X" and "step" in a and e["name"] in ("schedule", "update"):
            keys = ("tokens", "drafts", "accepted")
            steps.setdefault(int(a["step"]), {}).update({k: int(a[k]) for k in keys if k in a})
    per: list[list[tuple[int, int]]] = []
    context = None  # the current request's length while it decodes (None: its prompt is being prefilled)
    for _, st in sorted(steps.items()):
        tokens, drafts = st.get("tokens", 0), st.get("drafts", 0)
        if tokens != drafts + 1:  # a prompt chunk: one request at a time, so a new request's after a decode
            if context is not None or not per:
                per.append([])
                context = None
            continue
        if context is None:
            context = plens[len(per) - 1] + 1  # the prompt and the token its prefill sampled
        if drafts:
            per[-1].append((context, st.get("accepted", 0)))
        context += st.get("accepted", 0) + 1
    return per, length


def compare_engine(ns: argparse.Namespace, prompts: list[str], seqs: list[list[int]], plens: list[int],
                   first_hits: list[dict[int, bool]], covered: set[int]) -> None:
    """The engine's first-draft acceptance against the estimate's, at its positions and at every position."""
    per, length = engine_drafts(ns, prompts, seqs, plens)
    n = accepted = estimate = differ = uncovered = 0
    for s, hits, steps in zip(seqs, first_hits, per):
        for context, acc in steps:
            q = context - 2  # the estimate's row: features through q, token q + 1, predicting token q + 2
            if q not in hits:
                continue
            n += 1
            accepted += acc >= 1
            estimate += hits[q]
            differ += (acc >= 1) != hits[q]
            uncovered += context < len(s) and s[context] not in covered
    every = [h for hits in first_hits for h in hits.values()]
    every_unc = [s[q + 2] not in covered for s, hits in zip(seqs, first_hits) for q in hits if q + 2 < len(s)]
    print(f"engine ({ns.method}, fixed k = {ns.k}, one stream): mean acceptance length {length:.3f}; "
          f"first draft accepted {accepted / n:.3f} of {n} "
          f"steps; the estimate at those positions {estimate / n:.3f} ({differ} positions differ), at every "
          f"position {sum(every) / len(every):.3f} of {len(every)}; target token outside the draft vocabulary at "
          f"the engine's positions {uncovered / n:.3f}, at every position {sum(every_unc) / len(every_unc):.3f}")


if __name__ == "__main__":
    main()
