"""``tandem make-draft``."""

from __future__ import annotations

import argparse

from tandem.config import DEFAULT_MODEL


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("make-draft", help="export the first N layers of a model as a draft model")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--out", required=True, help="output directory (Hugging Face layout)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.set_defaults(func=_make_draft)


def _make_draft(ns: argparse.Namespace) -> int:
    from tandem.spec_decode.make_draft import DEFAULT_DRAFT_LAYERS, make_draft
    from tandem.worker.worker import DTYPES

    out = make_draft(ns.model, ns.out, ns.num_layers or DEFAULT_DRAFT_LAYERS, DTYPES[ns.dtype])
    print(f"draft written to {out}")
    return 0
