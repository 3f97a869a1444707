"""A draft head's decoder layer in one native call (``tandem_head_layer`` in ``native/decode_forward.c``).

A draft pass is a handful of one-row products and ~25 small torch kernels; on a CPU the kernels'
dispatch costs about as much as the products. :class:`NativeHeadLayer` runs the layer — q/k/v, RoPE,
the head's KV write, paged attention, the output projection, the post-attention norm and the MLP — as
one call, the way the target's short steps run (``model/native_decode.py``). The input fusion (the
method-specific part: embedding, norms, ``fc``) and the draft LM head stay in :class:`DraftHead`, whose
torch layer (:meth:`DraftHead.layer`) is the reference the tests compare with.

Applies to short steps on the CPU paged attention backend (at most the kernel's row limit: decodes,
verify rows, the chained draft rows); prefill chunks take the torch layer. The weights it reads are the
head's own (float32, bf16 or int8, see ``speculative_config.draft_dtype``), with the post-attention norm's
gain (times sqrt(hidden)) folded into a copy of gate/up, as the target's layers fold theirs (int8: the
folded float matrix quantized afresh, not the head's quantized one rescaled).
``TANDEM_NATIVE_DECODE=0`` (or ``TANDEM_NATIVE=0``) turns it off.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.model.attention.paged_cpu import PagedCpuMetadata
from tandem.model.block_quant import BlockQuantWeight, embedding
from tandem.model.forward_batch import KVCache
from tandem.model.linear import NATIVE_FEW_ROWS
from tandem.model.native_decode import native_decode_enabled
from tandem.model.quant import Int8Weight
from tandem.native.decode_forward import (
    DTYPES,
    DecodeForwardKernel,
    StackShape,
    decode_forward_kernel,
)
from tandem.spec_decode.head import DraftHead


class NativeHeadLayer:
    def __init__(self, head: DraftHead, kv_cache: KVCache, kernel: DecodeForwardKernel) -> None:
        cfg, hidden = head.cfg, head.cfg.hidden_size
        self.head, self.kernel = head, kernel
        # Int8 weights or bf16 ones under float32 activations: any count the kernel takes (256 rows; its
        # products in slices of the few-row kernels' 64, as the torch layer runs Q8_0 blocks on VNNI, while
        # its int8 and bf16 products past 64 rows are torch's — a draft's bits may differ between the two
        # paths there, never an output); else the dense limit, where the torch layer's products are the same.
        mixed = head.weight_dtype != head.dtype  # int8, or bf16 under float32
        self.max_rows = kernel.max_rows if mixed else min(kernel.max_rows, NATIVE_FEW_ROWS)
        self.shape = StackShape(
            hidden=hidden,
            heads=head.heads,
            kv_heads=head.kv_heads,
            head_dim=head.head_dim,
            inter=head.intermediate,
            eps_root=float(torch.tensor((hidden * cfg.rms_norm_eps) ** 0.5, dtype=head.dtype)),
            qk_eps=0.0,
            scale=float(head.scale),
        )
        with torch.no_grad():
            gain = head.post_norm.float() * hidden**0.5
            if isinstance(head.gate_up, BlockQuantWeight):  # the blocks take the gain on their input: exact
                self.gate_up: torch.Tensor | Int8Weight | BlockQuantWeight = head.gate_up.with_gain(gain.contiguous())
            elif isinstance(head.gate_up, Int8Weight):
                assert head.gate_up_source is not None
                self.gate_up = Int8Weight.quantize(head.gate_up_source * gain)
            else:
                self.gate_up = (head.gate_up.float() * gain).to(head.gate_up.dtype).contiguous()

        def weight(w: torch.Tensor | Int8Weight | BlockQuantWeight) -> torch.Tensor | Int8Weight | BlockQuantWeight:
            return w if isinstance(w, (Int8Weight, BlockQuantWeight)) else w.detach()

        layer = {
            "qkv": weight(head.qkv), "qkv_bias": None, "qk_norm": None, "o_proj": weight(head.o_proj),
            "o_bias": None, "gate_up": self.gate_up, "down": weight(head.down),
        }  # fmt: skip
        # (cos, sin) pairs of every position as float32 rows: one gather per call.
        table = head.rope_table
        self.rot_table = torch.view_as_real(table).reshape(table.shape[0], head.head_dim).contiguous()
        # The input fusion and the drafts' last steps in one call each where the head's tensors allow it.
        vec = head.vectors
        self.fast_inputs = head.dtype == torch.float32 and all(
            vec[n] is not None and vec[n].dtype == torch.float32  # type: ignore[union-attr]
            for n in ("input_layernorm.weight", "hidden_norm.weight")
        )
        lm = head.lm_head
        self.fast_tokens = head.dtype == torch.float32 and (head.norm is None or head.norm.dtype == torch.float32) and (
            isinstance(lm, (Int8Weight, BlockQuantWeight))
            or (isinstance(lm, torch.Tensor) and lm.dtype in DTYPES and lm.is_contiguous())
        )
        self.table = kernel.layer_table(
            self.shape, [layer], kv_cache.k, kv_cache.v, in_width=head.qkv.shape[1]
        )

    @classmethod
    def create(cls, head: DraftHead, kv_cache: KVCache) -> NativeHeadLayer | None:
        """The native layer for ``head``, or ``None`` where it cannot apply (not the CPU, another dtype,
        switched off, no compiler, a head with biases or per-head norms this kernel does not take)."""
        if not native_decode_enabled() or head.device.type != "cpu" or head.dtype not in DTYPES:
            return None
        if head.weight_dtype not in (*DTYPES, torch.int8) or kv_cache.k[0].dtype != head.dtype:
            return None
        kernel = decode_forward_kernel()
        return None if kernel is None else cls(head, kv_cache, kernel)

    def applies(self, rows: int, metadata: Any) -> bool:
        """Whether the native kernels take this step: the CPU paged backend's short queries, 1 .. max rows."""
        return (isinstance(metadata, PagedCpuMetadata) and not metadata.long_queries and metadata.short is not None
                and 1 <= rows <= self.max_rows)

    def layer_input(self, ids: torch.Tensor, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`DraftHead.layer_input`, EAGLE-3's two norms side by side in one native call (float32
        activations); the other methods' fusions (an ``fc`` product first) are the head's own."""
        head = self.head
        if head.cfg.method != "eagle3" or not self.fast_inputs or feat.dtype != torch.float32:
            return head.layer_input(ids, feat)
        emb = embedding(ids, head.embed, head.dtype, kernel=head.linear.quant)
        feat = feat.contiguous()
        w_in, w_hid = head.vectors["input_layernorm.weight"], head.vectors["hidden_norm.weight"]
        return feat, self.kernel.head_rms_pair(emb.contiguous(), feat, w_in, w_hid, head.cfg.rms_norm_eps)  # type: ignore[arg-type]

    def draft_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """:meth:`DraftHead.draft_tokens` in one native call (final norm, draft LM head, argmax, id map) where
        the draft LM head is a float32, bf16 or int8 matrix or GGUF blocks (the head's own, or rows of the
        target's, any gain they carry applied as the torch path applies it), the rows float32, at most 64."""
        head = self.head
        if not self._takes_tokens(h):
            return head.draft_tokens(h)
        return self.kernel.head_tokens(h.contiguous(), head.norm, head.cfg.rms_norm_eps, head.lm_head, head.draft_map)

    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A tree level's candidates in one native call: the ``k`` largest draft-vocabulary log-probabilities
        of each row of ``h`` and their draft ids (``torch.log_softmax(head.logits(h)).topk(k)``), or None
        where :meth:`draft_tokens` would take the torch path."""
        head = self.head
        if not self._takes_tokens(h):
            return None
        return self.kernel.head_top_k(h.contiguous(), head.norm, head.cfg.rms_norm_eps, head.lm_head, k)

    def _takes_tokens(self, h: torch.Tensor) -> bool:
        """Whether the draft LM head's native call takes these head outputs: float32, 1 .. 64 rows."""
        return self.fast_tokens and h.dtype == torch.float32 and 1 <= h.shape[0] <= 64

    def __call__(
        self, residual: torch.Tensor, attn_in: torch.Tensor, positions: torch.Tensor, metadata: Any
    ) -> torch.Tensor | None:
        """The layer's output ``[N, H]`` (a new tensor; ``residual`` is not modified), or ``None`` for a step
        the native kernels do not take (:meth:`applies`)."""
        if not self.applies(residual.shape[0], metadata):
            return None
        x = residual.clone(memory_format=torch.contiguous_format)
        rot = self.rot_table.index_select(0, positions)
        self.kernel.head_layer(
            self.shape, self.table, x, attn_in.contiguous(), rot, metadata.slot_mapping, metadata.short
        )
        return x
