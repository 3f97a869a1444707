"""The draft head shared by EAGLE, EAGLE-3 and MTP: input fusion, one decoder layer, a (draft) LM head.

One module serves training and inference, so the two cannot drift apart; only attention differs (dense
over whole sequences when training, paged over the head's own KV cache when drafting), and it is passed in.
Per method, a row at position q takes the token ``t[q+1]`` and a feature ``f`` (the target's at q on the
first step, the head's own output at q-1 on chained steps):

| method | layer input | residual | logits |
|---|---|---|---|
| eagle | ``x = fc([emb(t), f])`` (attention input normed only if the head has ``input_layernorm``) | x | ``lm_head(h)`` |
| eagle3 | ``[in_norm(emb(t)), hidden_norm(g)]`` (2H) with ``g = fc([target layers])`` or the head's output | g | ``lm_head_d(norm(h))`` |
| mtp | ``x = eh_proj([enorm(emb(t)), hnorm(f)])``, then ``input_layernorm`` | x | ``head(norm(h))`` |

q/k projection rows are stored interleaved for tandem's complex RoPE (see ``tandem.model.rope``); the
checkpoint I/O converts from and to the Hugging Face layout. The embedding and LM head may be the target's
own tensors (shared by reference, never copied); drafting may use only the first ``draft_vocab_size`` rows of
a shared LM head (a view) or a draft vocabulary with a draft→target id map.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from tandem.model.block_quant import BlockQuantWeight, embedding
from tandem.model.linear import LinearKernels, create_linear_kernels
from tandem.model.quant import Int8Weight
from tandem.model.rope import (
    apply_rope,
    interleave_heads,
    interleave_permutation,
    rope_inv_freq,
    rotation_table,
)
from tandem.sample.argmax import argmax_last
from tandem.spec_decode.eagle_checkpoint import HeadConfig

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# ``weight_dtype`` int8: the decoder layer's matrices in int8, ``fc`` (the input fusion) in bf16. Measured on
# the shipped EAGLE head, 32 HumanEval prompts, k = 3: mean acceptance length 1.961 with every matrix bf16,
# 1.949 with these (and the head's own LM head) int8, 1.928 with ``fc`` int8 too — the fusion of the token
# embedding and the feature is where the rounding costs acceptance.
INT8_MATRICES = frozenset({"qkv", "o_proj", "gate_up", "down"})

_OPTIONAL_VECTORS = ("fc.bias", "input_layernorm.weight", "hidden_norm.weight", "enorm.weight", "hnorm.weight")


class DraftHead(nn.Module):
    def __init__(
        self,
        cfg: HeadConfig,
        tensors: Mapping[str, torch.Tensor],
        *,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        draft_map: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        trainable: bool = False,
        linear: LinearKernels | None = None,
        weight_dtype: torch.dtype | None = None,
        q8_activations: str | None = None,
    ) -> None:
        """``tensors``: canonical names, HF layout (see eagle_checkpoint). ``embed`` [V, H] and
        ``lm_head`` [Vd, H] are used as given (pass the target's tensors, or views of them, to share).
        ``draft_map`` [Vd]: target id of each draft id (None = identity). ``weight_dtype``: the dtype of
        the head's own matrices (fc, attention, MLP; default ``dtype``) — bf16 under a float32 target
        halves the bytes a draft pass streams, int8 (:class:`Int8Weight`, a scale per output feature;
        the matrices of :data:`INT8_MATRICES`, the rest bf16) quarters them; activations, norms and the KV stay in ``dtype``, and ``linear`` must accept the
        mixed product (:attr:`LinearKernels.mixed_bf16`). int8 heads are for inference only.
        ``q8_activations`` (with int8): those matrices in GGUF Q8_0 blocks instead (a scale per 32 weights,
        :meth:`BlockQuantWeight.quantize_q8_0`), multiplied by the block kernels with these activations (the
        target's ``quant_activations``): the interleaved VNNI kernels take a few rows at a fraction of the
        per-feature int8 product's time; ``fc`` too (a scale per 32 weights keeps the fusion's acceptance,
        where one per output feature lost some: BENCHMARKS.md section 7); a matrix whose input width is not
        a multiple of 32 stays per-feature int8 (``fc``: bf16)."""
        super().__init__()
        self.cfg = cfg
        self.linear = linear or create_linear_kernels("torch")
        hd = cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.scale = hd**-0.5
        self._dtype = dtype
        wdtype = weight_dtype or dtype
        if wdtype != dtype and not getattr(self.linear, "mixed_bf16", False):
            raise ValueError(
                f"draft head weights in {wdtype} under {dtype} activations need the native CPU kernels "
                f"(linear kernels {self.linear.name!r} cannot mix dtypes)"
            )
        if wdtype == torch.int8 and (trainable or dtype != torch.float32):
            raise ValueError("int8 draft head weights: inference only, under float32 activations")

        def p(t: torch.Tensor, as_dtype: torch.dtype = dtype) -> nn.Parameter:
            return nn.Parameter(t.to(device=device, dtype=as_dtype).contiguous().clone(), requires_grad=trainable)

        def matrix(t: torch.Tensor, name: str) -> nn.Parameter | Int8Weight | BlockQuantWeight:
            if wdtype != torch.int8:
                return p(t, wdtype)
            if q8_activations is not None and t.shape[1] % 32 == 0 and (name in INT8_MATRICES or name == "fc"):
                return BlockQuantWeight.quantize_q8_0(t, name, q8_activations)
            if name not in INT8_MATRICES:
                return p(t, torch.bfloat16)
            return Int8Weight.quantize(t.to(device))

        get = tensors.__getitem__
        q = interleave_heads(get("self_attn.q_proj.weight").float(), self.heads, hd)
        k = interleave_heads(get("self_attn.k_proj.weight").float(), self.kv_heads, hd)
        gate_up = torch.cat([get("mlp.gate_proj.weight").float(), get("mlp.up_proj.weight").float()])
        self.fc = matrix(get("fc.weight"), "fc")
        self.qkv = matrix(torch.cat([q, k, get("self_attn.v_proj.weight").float()]), "qkv")
        self.o_proj = matrix(get("self_attn.o_proj.weight"), "o_proj")
        self.post_norm = p(get("post_attention_layernorm.weight"))
        self.gate_up = matrix(gate_up, "gate_up")
        self.down = matrix(get("mlp.down_proj.weight"), "down")
        # int8: the unquantized gate/up, for the native layer to fold the norm's gain in before rounding.
        self.gate_up_source = gate_up.to(device) if isinstance(self.gate_up, Int8Weight) else None
        self.intermediate = cfg.intermediate_size
        self.norm = p(get("norm.weight")) if "norm.weight" in tensors else None
        self.optional = nn.ParameterDict(
            {n.replace(".", "_"): p(tensors[n]) for n in _OPTIONAL_VECTORS if n in tensors}
        )
        # The same parameters by canonical name (None where the checkpoint has none): one dict lookup a step.
        self.vectors: dict[str, nn.Parameter | None] = {n: self._opt(n) for n in _OPTIONAL_VECTORS}
        # Shared tensors are attributes, not parameters: never trained, saved or copied by the head.
        self.embed = embed
        self.lm_head = lm_head
        self.draft_map = None if draft_map is None else draft_map.to(device=device, dtype=torch.int64)
        inv = rope_inv_freq(hd, cfg.rope_theta, cfg.rope_scaling)
        self.rope_table: torch.Tensor
        self.register_buffer(
            "rope_table", rotation_table(inv, cfg.max_position_embeddings).to(device), persistent=False
        )

    def _opt(self, name: str) -> nn.Parameter | None:
        key = name.replace(".", "_")
        return self.optional[key] if key in self.optional else None

    @property
    def device(self) -> torch.device:
        return self.post_norm.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the target's); the matrices may be :attr:`weight_dtype`."""
        return self._dtype

    @property
    def weight_dtype(self) -> torch.dtype:
        ws = (self.fc, self.qkv, self.o_proj, self.gate_up, self.down)
        return torch.int8 if any(isinstance(w, (Int8Weight, BlockQuantWeight)) for w in ws) else self.qkv.dtype

    # -- pieces ------------------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.cfg.rms_norm_eps)

    def fuse_target(self, x: torch.Tensor) -> torch.Tensor:
        """EAGLE-3: the concatenated target layers through ``fc``; the others take the feature as is."""
        return self.linear.linear(x, self.fc) if self.cfg.method == "eagle3" else x

    def target_feature(
        self, hidden: Mapping[int, torch.Tensor], aux_layers: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """The first step's feature from the target's hidden states (key -1: final normed output;
        EAGLE-3: the residual streams of ``aux_layers``, tandem indices)."""
        if self.cfg.method != "eagle3":
            return hidden[-1]
        return self.fuse_target(torch.cat([hidden[i] for i in aux_layers], dim=-1))

    def forward(
        self,
        ids: torch.Tensor,  # [N] tokens t[q+1]
        feat: torch.Tensor,  # [N, H]
        positions: torch.Tensor,  # [N]
        attend: Attend,
    ) -> torch.Tensor:
        """The head's output hidden state ``[N, H]`` (before any final norm) for each row."""
        residual, attn_in = self.layer_input(ids, feat)
        return self.layer(residual, attn_in, positions, attend)

    def layer_input(self, ids: torch.Tensor, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer's residual stream ``[N, H]`` and its (normed) attention input ``[N, H or
        2H]``: the method's fusion of the tokens' embeddings and the features (table above)."""
        method, mm = self.cfg.method, self.linear
        emb = embedding(ids, self.embed, self._dtype, kernel=self.linear.quant)
        if method == "eagle":
            residual = mm.linear(torch.cat([emb, feat], dim=-1), self.fc, self.vectors["fc.bias"])
            w = self.vectors["input_layernorm.weight"]
            attn_in = residual if w is None else self._rms(residual, w)
        elif method == "mtp":
            fused = torch.cat([self._rms(emb, self.vectors["enorm.weight"]), self._rms(feat, self.vectors["hnorm.weight"])], -1)  # type: ignore[arg-type]
            residual = mm.linear(fused, self.fc)
            attn_in = self._rms(residual, self.vectors["input_layernorm.weight"])  # type: ignore[arg-type]
        else:
            residual = feat
            attn_in = torch.cat(
                [self._rms(emb, self.vectors["input_layernorm.weight"]), self._rms(feat, self.vectors["hidden_norm.weight"])],  # type: ignore[arg-type]
                dim=-1,
            )
        return residual, attn_in

    def layer(
        self, residual: torch.Tensor, attn_in: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """The decoder layer (torch ops: the reference of ``native_head.NativeHeadLayer``)."""
        mm = self.linear
        n, heads, kvh, hd = attn_in.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = mm.linear(attn_in, self.qkv)
        qk = apply_rope(qkv[:, : (heads + kvh) * hd].reshape(n, heads + kvh, hd), self.rope_table[positions].unsqueeze(1))
        v = qkv[:, (heads + kvh) * hd :].reshape(n, kvh, hd)
        attn = attend(qk[:, :heads], qk[:, heads:], v).reshape(n, heads * hd)
        x = mm.linear_add(residual, attn, self.o_proj)
        gate_up = mm.linear(self._rms(x, self.post_norm), self.gate_up)
        act = F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
        return mm.linear_add(x, act, self.down)

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the (draft) LM head reads: the output, through the final norm when the head has one."""
        return h if self.norm is None else self._rms(h, self.norm)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[N, Vd]``."""
        return self.linear.linear(self.head_input(h), self.lm_head)

    def draft_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy drafts as target token ids ``[N]``: the argmax of :meth:`logits`."""
        best = argmax_last(self.linear.linear(h if self.norm is None else self._rms(h, self.norm), self.lm_head))
        return best if self.draft_map is None else self.draft_map[best]

    # -- back to the checkpoint layout -----------------------------------------------------------------
    def canonical_tensors(self) -> dict[str, torch.Tensor]:
        """The trainable tensors under canonical names in the HF layout (inverse of ``__init__``)."""
        if self.weight_dtype == torch.int8:
            raise ValueError("an int8 draft head is for inference; save the head it was quantized from")
        heads, kvh, hd = self.heads, self.kv_heads, self.head_dim
        inv = torch.argsort(interleave_permutation(hd))
        w = self.qkv.detach().float()
        q, k, v = w[: heads * hd], w[heads * hd : (heads + kvh) * hd], w[(heads + kvh) * hd :]

        def unperm(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.reshape(n, hd, -1)[:, inv.to(t.device)].reshape(t.shape)

        gu = self.gate_up.detach().float()
        out = {
            "fc.weight": self.fc.detach().float(),
            "self_attn.q_proj.weight": unperm(q, heads),
            "self_attn.k_proj.weight": unperm(k, kvh),
            "self_attn.v_proj.weight": v,
            "self_attn.o_proj.weight": self.o_proj.detach().float(),
            "post_attention_layernorm.weight": self.post_norm.detach().float(),
            "mlp.gate_proj.weight": gu[: self.intermediate],
            "mlp.up_proj.weight": gu[self.intermediate :],
            "mlp.down_proj.weight": self.down.detach().float(),
        }
        if self.norm is not None:
            out["norm.weight"] = self.norm.detach().float()
        for key, t in self.optional.items():
            name = next(n for n in _OPTIONAL_VECTORS if n.replace(".", "_") == key)
            out[name] = t.detach().float()
        return {n: t.cpu().contiguous() for n, t in out.items()}
