"""``tandem train-drafter``: train an EAGLE / EAGLE-3 / MTP head for a target (see ``trainer.py``)."""

from __future__ import annotations

import argparse
import json

from tandem.config import DEFAULT_MODEL
from tandem.spec_decode.train.prompts import PROMPT_SETS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train-drafter",
        help="self-distil an EAGLE / EAGLE-3 / MTP drafter for a target model (CPU, resumable)",
    )
    p.add_argument("--method", required=True, choices=["eagle", "eagle3", "mtp"])
    p.add_argument("--target", default=DEFAULT_MODEL)
    p.add_argument("--out", required=True,
                   help="output: the head directory (eagle, eagle3) or the target checkpoint with an MTP layer")
    p.add_argument("--work-dir", default=None, help="data and resumable checkpoints (default: OUT.work)")
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--prompts", default="mixed", choices=PROMPT_SETS,
                   help="training prompt set: standard-library docstrings, written code tasks, both (mixed), or mixed "
                        "plus docstrings of tandem's third-party dependencies (wide)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--corpus-tokens", type=int, default=0,
                   help="also train on this many tokens of standard-library source (teacher-forced)")
    p.add_argument("--corpus-chunk", type=int, default=256, help="tokens per corpus sample")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--unroll-steps", type=int, default=3, help="chained steps trained (training-time test)")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--draft-vocab", choices=["frequency", "leading"], default="frequency",
                   help="draft ids: the target's most frequent predictions on the data (with a d2t map), or "
                        "the first ids (no map)")
    p.add_argument("--eagle3-layer-ids", type=int, nargs="+", default=None)
    p.add_argument("--feature-weight", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--ship", default=None, metavar="DIR",
                   help="also write the small fp16 form (as committed under spec_decode/shipped/)")
    p.set_defaults(func=_train)


def _train(ns: argparse.Namespace) -> int:
    from tandem.spec_decode.train.trainer import TrainConfig, train_drafter

    cfg = TrainConfig(
        method=ns.method, out=ns.out, target=ns.target, work_dir=ns.work_dir, num_prompts=ns.num_prompts,
        prompts=ns.prompts,
        max_new_tokens=ns.max_new_tokens, corpus_tokens=ns.corpus_tokens, corpus_chunk=ns.corpus_chunk,
        epochs=ns.epochs, lr=ns.lr, batch_tokens=ns.batch_tokens,
        unroll_steps=ns.unroll_steps, draft_vocab_size=ns.draft_vocab_size, draft_vocab=ns.draft_vocab,
        eagle3_layer_ids=tuple(ns.eagle3_layer_ids) if ns.eagle3_layer_ids else None,
        feature_weight=ns.feature_weight, seed=ns.seed, threads=ns.threads, ship_dir=ns.ship,
    )
    result = train_drafter(cfg)
    last = result.log["epochs"][-1] if result.log["epochs"] else {}
    print(json.dumps({"out": str(result.out), "data": result.log["data"],
                      "seconds_total": result.log["seconds_total"], "last_epoch": last}, indent=2))
    return 0
