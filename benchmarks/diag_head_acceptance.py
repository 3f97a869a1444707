"""Where a drafter loses acceptance: the trainer's exact offline estimate (teacher-forced chains over the
target's own greedy responses, ``train/unroll.py``) per prompt, on HumanEval and on training-style prompts of
another seed, and the response of the first prompts with every missed first draft marked ``[target|draft]``.

    python benchmarks/diag_head_acceptance.py --method eagle3 --prompts 16 --show 3

The estimate equals what the engine measures on the same responses when each draft is verified at once
(single stream, k = 3); it needs no engine run per head, so candidate heads can be compared in minutes.
"""

from __future__ import annotations

import argparse
import sys
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
    p.add_argument("--head", default=None, help="head directory (mtp: a directory with the MTP layer); default: shipped")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--show", type=int, default=2, help="HumanEval responses to print with misses marked")
    p.add_argument("--k", type=int, default=3)
    ns = p.parse_args()
    tok = load_tokenizer(TARGET)
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
    sets = {"humaneval": humaneval(ns.prompts), "tasks (seed 9: same families, new prompts)": task_prompts(ns.prompts, seed=9)}
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
        with torch.no_grad():
            for i in range(len(seqs)):
                batch = make_batch(data, [i], ns.method, vocab_index)
                steps = unrolled_forward(head, batch, ns.k)
                hist, n = acceptance(steps, batch)
                total += hist
                chains += n
                per_prompt.append(1 + sum(int(hist[j:].sum()) for j in range(1, ns.k + 1)) / max(n, 1))
                if name == "humaneval" and i < ns.show:
                    pred, lab = steps[0].logits.argmax(-1)[0], batch.labels[0]
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
    llm.shutdown()


if __name__ == "__main__":
    main()
