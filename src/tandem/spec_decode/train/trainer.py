"""``train-drafter``: self-distil an EAGLE / EAGLE-3 / MTP head for a target, on this machine's CPU.

1. data (``data.py``): prompts (``prompts.py``: standard-library docstrings and/or the code tasks of
   ``tasks.py``; never HumanEval), the target's greedy responses, its hidden states; plus,
   with ``corpus_tokens``, teacher-forced standard-library source (``corpus.py``) with the target's
   features and greedy predictions at every position (held-out samples are generated responses only);
2. a head shaped like one target decoder layer, initialised from the target's last layer (fc passing the
   feature through), embedding and LM head shared with the target and frozen (EAGLE-3: its own draft-vocab
   head, initialised from the target's rows of the most frequently predicted tokens);
3. training over the unrolled chain (``unroll.py``): token loss (cross-entropy on the draft vocabulary
   against the target's greedy token) at every unrolled step, weighted ``decay**(s-1)``, plus, for EAGLE
   and MTP, a feature loss (smooth L1 between what the head feeds its LM head and the target's feature);
4. a checkpoint after every epoch (head, optimiser, schedule, RNG; a rerun resumes from it), a held-out
   acceptance estimate after every epoch, and the final head written in its public layout.
Seeded end to end: prompts, split, batch order and initialisation follow ``seed``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from tandem.model.loader import load_checkpoint
from tandem.spec_decode.eagle_checkpoint import (
    HeadConfig,
    check_eagle3_layer_ids,
    default_eagle3_layer_ids,
)
from tandem.spec_decode.head import DraftHead
from tandem.spec_decode.head_writer import mtp_config_keys, mtp_file_tensors, save_eagle_head
from tandem.spec_decode.train.corpus import stdlib_source_chunks
from tandem.spec_decode.train.data import (
    CorpusSpec,
    Dataset,
    DataSpec,
    build_corpus,
    build_dataset,
    select_draft_vocab,
)
from tandem.spec_decode.train.init_head import init_tensors
from tandem.spec_decode.train.prompts import training_prompts
from tandem.spec_decode.train.unroll import Batch, LossWeights, acceptance, losses, unrolled_forward

FEATURE_WEIGHT = {"eagle": 0.5, "eagle3": 0.0, "mtp": 0.1}
EVAL_STEPS = 3


@dataclass(frozen=True)
class TrainConfig:
    method: str
    out: str
    target: str = "smollm2-135m-instruct"
    work_dir: str | None = None  # data and checkpoints; default: <out>.work
    num_prompts: int = 512
    prompts: str = "mixed"  # prompts.PROMPT_SETS
    max_new_tokens: int = 128
    corpus_tokens: int = 0  # teacher-forced standard-library source tokens added to the data
    corpus_chunk: int = 256
    epochs: int = 8
    lr: float = 1e-3
    batch_tokens: int = 4096
    unroll_steps: int = 3
    draft_vocab_size: int = 8192
    # Which target ids the draft vocabulary holds: "frequency" (the ids the target predicts most often on the
    # training data, with a d2t map) or "leading" (the first ids, no map).
    draft_vocab: str = "frequency"
    eagle3_layer_ids: tuple[int, ...] | None = None
    seed: int = 0
    val_fraction: float = 0.06
    feature_weight: float | None = None  # None: per-method default
    step_decay: float = 0.8
    threads: int | None = None
    ship_dir: str | None = None  # also write the small shipped form here
    max_steps: int | None = None  # testing: stop after this many optimiser steps in all

    def __post_init__(self) -> None:
        if self.draft_vocab not in ("frequency", "leading"):
            raise ValueError(f"--draft-vocab must be 'frequency' or 'leading', got {self.draft_vocab!r}")

    def key(self) -> str:
        """Identity of a training run (what a resumable checkpoint must match)."""
        d = asdict(self)
        for k in ("out", "work_dir", "threads", "ship_dir", "epochs", "max_steps"):
            d.pop(k)
        if d["draft_vocab"] == ("frequency" if self.method == "eagle3" else "leading"):
            d.pop("draft_vocab")  # what runs before the option did: their checkpoints keep their keys
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class TrainResult:
    out: Path
    log: dict[str, Any] = field(default_factory=dict)


# -- batches ---------------------------------------------------------------------------------------
def make_batch(
    data: Dataset, idx: list[int], method: str, vocab_index: torch.Tensor
) -> Batch:
    lens = [data.offsets[i + 1] - data.offsets[i] - 1 for i in idx]
    b, t = len(idx), max(lens)
    feat_dim = data.aux.shape[1] if method == "eagle3" else data.final.shape[1]
    ids = torch.zeros(b, t, dtype=torch.int64)
    feat = torch.zeros(b, t, feat_dim)
    target = torch.zeros(b, t, data.final.shape[1])
    labels = torch.full((b, t), -100, dtype=torch.int64)
    valid = torch.zeros(b, t, dtype=torch.bool)
    eval_rows = torch.zeros(b, t, dtype=torch.bool)
    for r, (i, n) in enumerate(zip(idx, lens)):
        s = data.offsets[i]
        ids[r, :n] = data.tokens[s + 1 : s + 1 + n]
        src = data.aux if method == "eagle3" else data.final
        feat[r, :n] = src[s : s + n].float()
        target[r, :n] = data.final[s + 1 : s + 1 + n].float()
        labels[r, :n] = vocab_index[data.argmax[s + 1 : s + 1 + n]]
        valid[r, :n] = True
        eval_rows[r, max(data.prompt_lens[i] - 1, 0) : n] = True
    positions = torch.arange(t).expand(b, t)
    return Batch(ids, feat, positions, target, labels, valid, eval_rows)


def plan_batches(lengths: list[int], idx: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches of at most ``batch_tokens`` padded rows, in a seeded order."""
    order = sorted(idx, key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[j] for j in [*cur, i]) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


# -- the run ---------------------------------------------------------------------------------------
def train_drafter(cfg: TrainConfig, progress: bool = True) -> TrainResult:
    if cfg.method not in ("eagle", "eagle3", "mtp"):
        raise ValueError(f"--method must be eagle, eagle3 or mtp, got {cfg.method!r}")
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    work = Path(cfg.work_dir) if cfg.work_dir else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    ckpt = load_checkpoint(cfg.target, torch.float32)
    args = ckpt.args
    aux_ids = tuple(cfg.eagle3_layer_ids or default_eagle3_layer_ids(args.num_hidden_layers))
    check_eagle3_layer_ids(aux_ids, args.num_hidden_layers)
    log: dict[str, Any] = {"config": asdict(cfg), "epochs": []}

    # 1. data
    t0 = time.time()
    prompts = training_prompts(cfg.prompts, cfg.num_prompts, cfg.seed)
    spec = DataSpec(cfg.target, len(prompts), cfg.max_new_tokens, cfg.seed, aux_ids, cfg.prompts)
    corpus_files: list[Path] = []
    if cfg.corpus_tokens > 0:
        from tandem.model.loader import load_tokenizer

        tok = load_tokenizer(cfg.target)
        # The BOS the tokenizer starts every text with (Gemma), if any, starts every chunk (corpus.py).
        bos = [tok.bos_token_id] if tok.encode("x")[:1] == [tok.bos_token_id] else []
        chunks = stdlib_source_chunks(lambda text: tok.encode(text, add_special_tokens=False), cfg.corpus_tokens,
                                      cfg.corpus_chunk, cfg.seed, prefix=bos)
        cspec = CorpusSpec(cfg.target, cfg.corpus_tokens, cfg.corpus_chunk, cfg.seed, aux_ids)
        corpus_files = build_corpus(cspec, work, chunks)
    data = build_dataset(spec, work, prompts, corpus_files)
    gen_end = data.offsets[data.num_generated]
    log["data"] = {
        "samples": data.num_samples,
        "generated_samples": data.num_generated,
        "tokens": int(data.tokens.numel()),
        "response_tokens": int(data.response_tokens().numel()),
        "corpus_tokens": int(data.tokens.numel()) - gen_end,
        "seconds": round(time.time() - t0, 1),
    }

    # 2. head
    vd = min(cfg.draft_vocab_size, args.vocab_size)
    hcfg = HeadConfig.for_target(cfg.method, args, vd, aux_ids if cfg.method == "eagle3" else None)
    embed = ckpt.tensors["model.embed_tokens.weight"].float()
    full_head = ckpt.tensors.get("lm_head.weight", embed).float()
    frequency = cfg.draft_vocab == "frequency" and vd < args.vocab_size
    draft_ids = select_draft_vocab(data, vd, args.vocab_size) if frequency else torch.arange(vd)
    vocab_index = torch.full((args.vocab_size,), -100, dtype=torch.int64)
    vocab_index[draft_ids] = torch.arange(vd)
    resp = data.argmax[torch.cat([torch.arange(data.offsets[i] + data.prompt_lens[i] - 1, data.offsets[i + 1] - 1)
                                  for i in range(data.num_samples)])]
    log["draft_vocab_coverage"] = round(float((vocab_index[resp] >= 0).float().mean()), 4)
    tensors = init_tensors(hcfg, ckpt.tensors, args, cfg.seed)
    if cfg.method == "eagle3":
        lm_head: torch.Tensor = nn.Parameter(full_head[draft_ids].clone())
        draft_map: torch.Tensor | None = draft_ids
    elif frequency:  # EAGLE / MTP: the target's LM head rows of the draft ids, frozen
        lm_head, draft_map = full_head[draft_ids], draft_ids
    else:
        lm_head, draft_map = full_head[:vd], None
    head = DraftHead(hcfg, tensors, embed=embed, lm_head=lm_head, draft_map=draft_map, trainable=True)
    params = [p for p in head.parameters() if p.requires_grad]
    log["trainable_parameters"] = sum(p.numel() for p in params)

    # 3. split, schedule, resume
    rng = random.Random(cfg.seed)
    # Held out: generated responses only, so the acceptance estimate is the inference chain's.
    samples = list(range(data.num_generated))
    rng.shuffle(samples)
    n_val = max(1, int(len(samples) * cfg.val_fraction))
    val_idx = sorted(samples[:n_val])
    train_idx = samples[n_val:] + list(range(data.num_generated, data.num_samples))
    lengths = [data.offsets[i + 1] - data.offsets[i] - 1 for i in range(data.num_samples)]
    steps_per_epoch = len(plan_batches(lengths, train_idx, cfg.batch_tokens, random.Random(0)))
    total_steps = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, total_steps // 30)

    def lr_at(step: int) -> float:
        if step < warmup:
            return cfg.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, total_steps - warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    weights = LossWeights(1.0, cfg.feature_weight if cfg.feature_weight is not None else FEATURE_WEIGHT[cfg.method],
                          cfg.step_decay)
    state_path = work / f"{cfg.method}-{cfg.key()}.pt"
    start_epoch, step = 0, 0
    if state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        head.load_state_dict(st["head"], strict=False)
        if cfg.method == "eagle3":
            lm_head.data.copy_(st["lm_head"])
        opt.load_state_dict(st["opt"])
        start_epoch, step = st["epoch"], st["step"]
        log["epochs"] = st["log_epochs"]
        random.setstate(st["py_rng"])
        torch.set_rng_state(st["torch_rng"])
        log["resumed_from_epoch"] = start_epoch

    def evaluate() -> dict[str, Any]:
        head.eval()
        k = max(cfg.unroll_steps, EVAL_STEPS)  # acceptance of k drafts, however many steps are trained
        hist = torch.zeros(k + 1, dtype=torch.int64)
        chains, ce_sum, n = 0, 0.0, 0
        with torch.no_grad():
            for bidx in plan_batches(lengths, val_idx, cfg.batch_tokens, random.Random(0)):
                batch = make_batch(data, bidx, cfg.method, vocab_index)
                outs = unrolled_forward(head, batch, k)
                _, stats = losses(outs, batch, weights)
                h, c = acceptance(outs, batch)
                hist += h
                chains += c
                ce_sum += stats["ce1"]
                n += 1
        head.train()
        at_least = [int(hist[j:].sum()) for j in range(1, k + 1)]
        return {
            "val_ce1": round(ce_sum / max(n, 1), 4),
            "val_acceptance_length": round(1 + sum(at_least) / max(chains, 1), 4),
            "val_accept_per_pos": [round(a / max(chains, 1), 4) for a in at_least],
            "val_chains": chains,
        }

    # 4. train
    head.train()
    stop = False
    for epoch in range(start_epoch, cfg.epochs):
        batches = plan_batches(lengths, train_idx, cfg.batch_tokens, random.Random(cfg.seed * 1000 + epoch))
        bar = tqdm(batches, desc=f"train {cfg.method} epoch {epoch + 1}/{cfg.epochs}", disable=not progress)
        run: dict[str, float] = {}
        t_ep = time.time()
        for bidx in bar:
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            batch = make_batch(data, bidx, cfg.method, vocab_index)
            outs = unrolled_forward(head, batch, cfg.unroll_steps)
            loss, stats = losses(outs, batch, weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            for k, v in stats.items():
                run[k] = 0.9 * run.get(k, v) + 0.1 * v
            bar.set_postfix(loss=f"{run['loss']:.3f}", ce1=f"{run['ce1']:.3f}")
            if cfg.max_steps is not None and step >= cfg.max_steps:
                stop = True
                break
        entry = {"epoch": epoch + 1, "step": step, "seconds": round(time.time() - t_ep, 1),
                 **{f"train_{k}": round(v, 4) for k, v in run.items()}, **evaluate()}
        log["epochs"].append(entry)
        if progress:
            tqdm.write(json.dumps(entry))
        st = {"head": head.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1, "step": step,
              "log_epochs": log["epochs"], "py_rng": random.getstate(), "torch_rng": torch.get_rng_state()}
        if cfg.method == "eagle3":
            st["lm_head"] = lm_head.detach().clone()
        tmp = state_path.with_suffix(".tmp")
        torch.save(st, tmp)
        os.replace(tmp, state_path)
        if stop:
            break

    # 5. write
    final = head.canonical_tensors()
    if cfg.method == "eagle3":
        final["lm_head.weight"] = lm_head.detach().float().clone()
    if frequency:  # the map (EAGLE / MTP: no LM head of their own; the target's rows are gathered at load)
        final["d2t"] = (draft_ids - torch.arange(vd)).long()
        t2d = torch.zeros(args.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        final["t2d"] = t2d
    log["seconds_total"] = round(time.time() - t_start, 1)
    out_path = write_outputs(cfg, hcfg, final, out, log)
    if cfg.ship_dir:
        write_shipped(cfg, hcfg, final, Path(cfg.ship_dir), log)
    return TrainResult(out_path, log)


def write_outputs(cfg: TrainConfig, hcfg: HeadConfig, tensors: dict[str, torch.Tensor], out: Path,
                  log: dict[str, Any]) -> Path:
    """EAGLE / EAGLE-3: the head directory (fp32). MTP: the target checkpoint with the MTP layer."""
    from tandem.model.loader.model_info import load_model_args
    from tandem.spec_decode.shipped import assemble_mtp_checkpoint

    if out.exists():
        shutil.rmtree(out)
    if cfg.method == "mtp":
        args = load_model_args(cfg.target)
        assemble_mtp_checkpoint(cfg.target, mtp_file_tensors(hcfg, tensors, args, torch.float32),
                                mtp_config_keys(hcfg), out)
    else:
        save_eagle_head(out, hcfg, tensors, torch.float32)
    (out / "training_log.json").write_text(json.dumps(log, indent=2))
    return out


def write_shipped(cfg: TrainConfig, hcfg: HeadConfig, tensors: dict[str, torch.Tensor], ship: Path,
                  log: dict[str, Any]) -> Path:
    """The small, fp16 form committed under ``spec_decode/shipped/`` (see its ``__init__``)."""
    from tandem.model.loader.model_info import load_model_args
    from tandem.spec_decode.shipped import MTP_CONFIG_FILE, MTP_LAYER_FILE

    if ship.exists():
        shutil.rmtree(ship)
    if cfg.method == "mtp":
        args = load_model_args(cfg.target)
        ship.mkdir(parents=True)
        save_file(mtp_file_tensors(hcfg, tensors, args, torch.float16), str(ship / MTP_LAYER_FILE),
                  metadata={"format": "pt"})
        (ship / MTP_CONFIG_FILE).write_text(json.dumps(mtp_config_keys(hcfg), indent=2))
    else:
        save_eagle_head(ship, hcfg, tensors, torch.float16)
    summary = {k: log[k] for k in ("data", "draft_vocab_coverage", "trainable_parameters", "seconds_total")}
    summary["last_epoch"] = log["epochs"][-1] if log["epochs"] else None
    (ship / "training_summary.json").write_text(json.dumps(summary, indent=2))
    return ship
