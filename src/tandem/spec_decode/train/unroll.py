"""The head's training forward: the inference chain, unrolled over whole sequences ("training-time test").

Rows are target positions q of a padded batch [B, T]; row q takes token ``t[q+1]`` and predicts the
target's next prediction (token ``argmax[q+1]``, feature ``final[q+1]``). Step 1 feeds the target's
features and attends causally — exactly the head's KV at inference. Step s > 1 is what a chained draft
sees: row q feeds the head's own output of step s-1 at row q-1, and attends to step-1 keys up to
``q-s+1`` (the last exact row of a chain that started there) plus one key of each step 2..s on the
diagonal (the chain's own rows). So the output of step s at row q is *the* s-th draft of a chain whose
last accepted row is ``e = q-s+1``, given that drafts 1..s-1 were right — which also makes the offline
acceptance estimate exact: drafts are compared with the target's own greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.spec_decode.head import DraftHead


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] token t[q+1] of row q (0 past the end)
    feat: torch.Tensor  # [B, T, F] step-1 input feature of row q (target final or aux, float)
    positions: torch.Tensor  # [B, T]
    target_feat: torch.Tensor  # [B, T, H] final[q+1]
    labels: torch.Tensor  # [B, T] draft-vocab index of argmax[q+1]; -100 = none / outside
    valid: torch.Tensor  # [B, T] bool: row q has a target (q + 1 < n)
    eval_rows: torch.Tensor  # [B, T] bool: rows that may start a chain (in the response)


@dataclass
class StepOutput:
    logits: torch.Tensor  # [B, T, Vd]
    head_in: torch.Tensor  # [B, T, H]
    row_ok: torch.Tensor  # [B, T] rows where step s is defined (q >= s - 1) and has a target


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def unrolled_forward(head: DraftHead, batch: Batch, steps: int) -> list[StepOutput]:
    """Step outputs 1..``steps``; gradients flow through the whole unroll."""
    b, t = batch.ids.shape
    heads, kvh, hd, scale = head.heads, head.kv_heads, head.head_dim, head.scale
    groups = heads // kvh
    ids = batch.ids.reshape(-1)
    pos = batch.positions.reshape(-1)
    keys: list[torch.Tensor] = []  # per step: [B, heads, T, hd] (kv expanded)
    values: list[torch.Tensor] = []
    outs: list[StepOutput] = []
    q_idx = torch.arange(t, device=ids.device)
    feat = head.fuse_target(batch.feat.reshape(b * t, -1))
    for s in range(1, steps + 1):

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: int = s) -> torch.Tensor:
            qh = q.reshape(b, t, heads, hd).transpose(1, 2)
            kh = _expand_kv(k.reshape(b, t, kvh, hd).transpose(1, 2), groups)
            vh = _expand_kv(v.reshape(b, t, kvh, hd).transpose(1, 2), groups)
            keys.append(kh)
            values.append(vh)
            if s == 1:
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
                return o.transpose(1, 2).reshape(b * t, heads, hd)
            # Step-1 keys up to q - s + 1 (at least key 0, so no row is all -inf), then the diagonal.
            limit = (q_idx - (s - 1)).clamp(min=0)
            main = torch.matmul(qh, keys[0].transpose(-1, -2)) * scale
            main = main.masked_fill(q_idx.view(1, t) > limit.view(t, 1), float("-inf"))
            diag = []
            diag_v = []
            for sp in range(2, s + 1):
                shift = s - sp
                kk, vv = keys[sp - 1], values[sp - 1]
                if shift:
                    kk = F.pad(kk, (0, 0, shift, 0))[:, :, :t]
                    vv = F.pad(vv, (0, 0, shift, 0))[:, :, :t]
                diag.append((qh * kk).sum(-1, keepdim=True) * scale)
                diag_v.append(vv)
            probs = torch.softmax(torch.cat([main, *diag], dim=-1), dim=-1)
            o = torch.matmul(probs[..., :t], values[0])
            for j, vv in enumerate(diag_v):
                o = o + probs[..., t + j : t + j + 1] * vv
            return o.transpose(1, 2).reshape(b * t, heads, hd)

        h = head(ids, feat, pos, attend)  # [B*T, H]
        hb = h.reshape(b, t, -1)
        row_ok = batch.valid & (q_idx >= s - 1).view(1, t)
        outs.append(StepOutput(head.logits(h).reshape(b, t, -1), head.head_input(h).reshape(b, t, -1), row_ok))
        # The next step's row q feeds this step's output at row q - 1.
        feat = F.pad(hb, (0, 0, 1, 0))[:, :t].reshape(b * t, -1)
    return outs


@dataclass
class LossWeights:
    token: float = 1.0
    feature: float = 0.0
    step_decay: float = 0.8


def losses(outs: list[StepOutput], batch: Batch, w: LossWeights) -> tuple[torch.Tensor, dict[str, float]]:
    total = torch.zeros((), device=batch.ids.device)
    stats: dict[str, float] = {}
    for s, o in enumerate(outs, start=1):
        weight = w.step_decay ** (s - 1)
        labels = torch.where(o.row_ok, batch.labels, torch.full_like(batch.labels, -100))
        ce = F.cross_entropy(o.logits.reshape(-1, o.logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
        total = total + weight * w.token * ce
        stats[f"ce{s}"] = float(ce.detach())
        if w.feature:
            m = o.row_ok.unsqueeze(-1)
            fl = F.smooth_l1_loss(o.head_in.float() * m, batch.target_feat * m, reduction="sum") / (
                m.sum() * o.head_in.shape[-1]).clamp(min=1)
            total = total + weight * w.feature * fl
            stats[f"feat{s}"] = float(fl.detach())
    stats["loss"] = float(total.detach())
    return total, stats


@torch.no_grad()
def acceptance(outs: list[StepOutput], batch: Batch) -> tuple[torch.Tensor, int]:
    """Per chain start row e (eligible: in the response, all k targets present): accepted drafts count
    [k+1] histogram, and the number of chains. Draft s of the chain at e is step s at row e + s - 1."""
    k = len(outs)
    b, t = batch.ids.shape
    correct = []
    for s, o in enumerate(outs, start=1):
        hit = (o.logits.argmax(-1) == batch.labels) & (batch.labels >= 0)
        # shift so column e holds the draft of the chain starting at e
        hit = hit[:, s - 1 :]
        correct.append(F.pad(hit, (0, s - 1), value=False))
    c = torch.stack(correct, dim=-1)  # [B, T, k]
    eligible = torch.zeros_like(batch.valid)
    if t - k + 1 > 0:
        eligible[:, : t - k + 1] = batch.eval_rows[:, : t - k + 1] & batch.valid[:, k - 1 :]
    run = torch.cumprod(c.long(), dim=-1).sum(-1)  # leading correct drafts
    hist = torch.bincount(run[eligible], minlength=k + 1)
    return hist, int(eligible.sum())
