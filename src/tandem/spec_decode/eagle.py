"""EAGLE, EAGLE-3 and MTP proposers: one device-native implementation over a :class:`DraftHead`.

Each step (the "padded drafter batch"):
1. The head runs over *every* row of the target's step — prefill chunks, decodes and all k+1 verify rows —
   with the target's features of those rows and, as tokens, the token one position later read from the
   device token history (which already holds this step's accepted and bonus tokens). It writes its own KV
   (one layer, indexed by the target's block tables) at the same positions as the target. Rows past a
   request's accepted drafts compute garbage that is overwritten later: KV is written by absolute position,
   so rollback is free and the head's valid frontier is always the target's.
2. From each sampling request's last *accepted* row (chosen on the device: first sample row + accepted
   count, accepted = (sampled >= 0).sum(1) - 1), the head's output gives draft 1; k - 1 chained one-row
   steps (batched over requests) each feed the previous draft and the head's own output hidden state.
   Chained rows write KV past the target's frontier (lookahead slots the scheduler reserves); a chained row
   a request does not need (its draft cap is reached) writes to a trash block instead.
Nothing here reads the host mirror of the step's results, so drafting works with async scheduling and
deferred reconciliation. Drafts are greedy: the rejection sampler verifies them exactly (q one-hot).
Steps with prompt chunks (even where no request samples) run step 1 so the head's KV covers prompts; a
decode-only step for which the speculation policy asks no drafts does not run the head at all (the runner
skips it, and the target's feature capture): the head's KV keeps a gap at those positions, which later drafts
attend over. Outputs never depend on it (drafts are verified); acceptance after a gap may be lower, and the
adaptive policy learns the acceptance it really gets. While the policy has settled on no drafts
(``SchedulerOutput.drafter_prefill`` False) prompt chunks skip the head too, and the policy never drafts for
those requests (``Request.drafter_gap``).
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from tandem.config import SpeculativeConfig
from tandem.model.attention import AttentionBackend
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.forward_batch import ForwardBatch, KVCache
from tandem.model.loader import Checkpoint
from tandem.model.model_args import ModelArgs
from tandem.model.quant import Int8Weight
from tandem.model.transformer import CausalLM
from tandem.spec_decode.eagle_checkpoint import HeadConfig, check_against_target, load_eagle_head
from tandem.spec_decode.head import Attend, DraftHead
from tandem.spec_decode.native_head import NativeHeadLayer
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.speculative_config import resolve_draft_weights

log = logging.getLogger(__name__)


def _same(a: torch.Tensor, b: torch.Tensor | BlockQuantWeight) -> bool:
    """Whether ``a`` holds exactly ``b``'s values (a block-quantized ``b``: its dequantized values)."""
    if a.shape != b.shape:
        return False
    if isinstance(b, BlockQuantWeight):
        return torch.equal(a.to(torch.float32), b.dequantize(torch.float32))
    return torch.equal(a.to(device=b.device, dtype=b.dtype), b)


def shared_head_tensors(
    cfg: HeadConfig,
    tensors: dict[str, torch.Tensor],
    target: CausalLM,
    share_always: bool = False,
    target_vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(embedding, draft LM head [Vd, H], draft→target map) by the sharing rules: the head's own tensors
    when it has them and they differ from the target's, else the target's very tensors (views for a
    leading slice). ``share_always`` (MTP): the target's, whatever the checkpoint holds. Pops the
    embedding / LM head / maps out of ``tensors``."""
    dtype, device, vd = target.dtype, target.device, cfg.draft_vocab_size
    # The target's whole-vocabulary embedding and LM head (``target_vocab``: gathered under TP).
    target_embed, target_head = target_vocab or (target.embed_tokens, target.lm_head)  # may be block-quantized
    own_embed = tensors.pop("embed_tokens.weight", None)
    own_head = tensors.pop("lm_head.weight", None)
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    if share_always:
        own_embed = own_head = None
    embed = target_embed
    if own_embed is not None and not _same(own_embed, target_embed):
        embed = own_embed.to(device=device, dtype=dtype).contiguous()
    draft_map = None
    if d2t is not None:
        draft_map = torch.arange(vd) + d2t.long()
        if torch.equal(draft_map, torch.arange(vd)):
            draft_map = None  # a leading slice of the vocabulary
    if own_head is not None and own_head.shape[0] == cfg.vocab_size and _same(own_head, target_head):
        own_head = None
    source = target_head if own_head is None else own_head.to(device=device, dtype=dtype).contiguous()
    if source.shape[0] == vd:
        lm_head = source
    elif isinstance(source, BlockQuantWeight):  # the target's blocks, rows selected (never requantized)
        lm_head = source.take_rows(torch.arange(vd) if draft_map is None else draft_map)
    elif draft_map is None:
        lm_head = source[:vd]  # a view: same storage
    else:  # a scattered draft vocabulary over a full-vocabulary head: its rows (a copy)
        lm_head = source.index_select(0, draft_map.to(source.device))
    return embed, lm_head, draft_map


def _shares_storage(a: torch.Tensor | BlockQuantWeight, b: torch.Tensor | BlockQuantWeight) -> bool:
    """Whether the draft LM head ``a`` is (a view of) the target's ``b``; rows of a block-quantized target
    head count as shared: they keep the target's blocks instead of being quantized again."""
    if isinstance(a, BlockQuantWeight) or isinstance(b, BlockQuantWeight):
        return isinstance(a, BlockQuantWeight)
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _takes_mixed_weights(target: CausalLM) -> bool:
    """Whether the target runs float32 activations on the native CPU kernels that take bf16 / int8 weights."""
    return target.dtype == torch.float32 and getattr(target.linear, "mixed_bf16", False)


def head_weight_dtype(config: SpeculativeConfig, target: CausalLM) -> torch.dtype:
    """The dtype of a draft head's matrices (``speculative_config.draft_dtype``).

    ``None`` / ``"auto"``: int8 under a float32 target where the native CPU kernels take the mixed
    product (the decoder layer's matrices and the head's own LM head weight-only int8 with a scale per
    output feature, ``fc`` bf16: head.INT8_MATRICES) — a draft pass is a few one-row products, bound by
    the bytes they stream, and drafts only propose (the target verifies every token exactly), so fewer
    bytes cost at most a little acceptance (measured, BENCHMARKS.md section 7: mean acceptance length on
    HumanEval eagle 1.96 -> 1.95, eagle3 2.02 -> 2.01, mtp 2.07 -> 2.07 against bf16, decode 1-2 % faster)
    — else the target's dtype. An explicit dtype must be the target's, or bf16 / int8 / q8_0 under a
    float32 target with those kernels. Whether int8 matrices go into Q8_0 blocks: :func:`head_q8_activations`."""
    from tandem.worker.worker import DTYPES  # the dtype names (as draft_model reads them)

    want = config.draft_dtype
    mixed = _takes_mixed_weights(target)
    if want in (None, "auto"):
        return torch.int8 if mixed else target.dtype
    dtype = torch.int8 if want in ("int8", "q8_0") else DTYPES[want]
    if dtype == target.dtype or (dtype in (torch.bfloat16, torch.int8) and mixed):
        return dtype
    raise ValueError(
        f"speculative_config.draft_dtype {want!r} for method {config.method!r}: a draft head's weights take "
        f"the target's dtype ({target.dtype}), or bfloat16 or int8 under a float32 target on the native "
        "CPU kernels"
    )


def head_q8_activations(config: SpeculativeConfig, target: CausalLM, wdtype: torch.dtype) -> str | None:
    """Where a head's int8 matrices go into GGUF Q8_0 blocks, the activations their products take (the
    target's ``quant_activations``), else ``None`` (a scale per output feature, :class:`Int8Weight`).

    ``q8_0`` asked: always (the target's activations where it has blocks, else float32). ``auto``: where the
    target's own products take int8 activations (a GGUF target on a CPU with VNNI): the interleaved kernels
    then run a pass of 1-12 rows 2.5-4x faster than the per-feature int8 product (BENCHMARKS.md section 7),
    with a finer scale (one per 32 weights)."""
    qkv = target.layers[0].qkv if target.num_layers else None
    acts = qkv.activations if isinstance(qkv, BlockQuantWeight) and qkv.all_interleaved else None
    mixed = _takes_mixed_weights(target)
    if wdtype != torch.int8 or resolve_draft_weights(config.draft_dtype, mixed, acts) != "q8_0":
        return None
    return acts or "float32"


class DraftHeadProposer(Proposer):
    """Shared implementation; subclasses differ only in how they find and load their head."""

    SUPPORTS_ASYNC_SCHEDULING = True
    device_native = True
    needs_lookahead_slots = True
    needs_prefill_steps: ClassVar[bool] = True

    def __init__(
        self,
        num_speculative_tokens: int,
        head: DraftHead,
        kv_cache: KVCache,
        backend: AttentionBackend,
        aux_hidden_layers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(num_speculative_tokens)
        self.head = head
        self.kv_cache = kv_cache  # one layer; its last block is a trash block
        self.block_size = kv_cache.block_size
        self.trash_slot = (kv_cache.num_blocks - 1) * self.block_size
        self.backend = backend
        self.aux_hidden_layers = aux_hidden_layers  # tandem indices: output of layer j
        self.native = NativeHeadLayer.create(head, kv_cache)  # the layer in one call (short CPU steps)

    @classmethod
    def kv_bytes_per_block(
        cls, config: SpeculativeConfig, target: Path, args: ModelArgs, block_size: int, dtype: torch.dtype
    ) -> int:
        """The head's one layer, in the target's KV shape (an MTP layer is one of the target's)."""
        return KVCache.bytes_per_block(1, block_size, args.num_key_value_heads, args.head_dim, dtype)

    @classmethod
    def from_head(
        cls,
        config: SpeculativeConfig,
        cfg: HeadConfig,
        tensors: dict[str, torch.Tensor],
        target: CausalLM,
        num_kv_blocks: int,
        block_size: int,
    ) -> DraftHeadProposer:
        # Under tensor parallelism drafts are replicated: every rank runs the whole head, so it gets
        # the whole vocabulary (gathered from the target's shards once; every rank builds this).
        comm = getattr(target, "comm", None)
        full = target.full_vocab_tensors() if comm is not None and comm.world_size > 1 else None
        embed, lm_head, draft_map = shared_head_tensors(
            cfg, tensors, target, share_always=cfg.method == "mtp", target_vocab=full
        )
        wdtype = head_weight_dtype(config, target)
        q8 = head_q8_activations(config, target, wdtype)
        if wdtype != target.dtype and not _shares_storage(lm_head, target.lm_head):
            # the head's own (or gathered) rows; a shared view stays shared
            if q8 is not None and lm_head.shape[1] % 32 == 0:
                lm_head = BlockQuantWeight.quantize_q8_0(lm_head, "lm_head", q8)
            else:
                lm_head = Int8Weight.quantize(lm_head) if wdtype == torch.int8 else lm_head.to(wdtype)
        head = DraftHead(
            cfg, tensors, embed=embed, lm_head=lm_head, draft_map=draft_map, dtype=target.dtype,
            device=target.device, linear=target.linear, weight_dtype=wdtype, q8_activations=q8,
        )
        kv = KVCache.allocate(
            1, num_kv_blocks + 1, block_size, cfg.num_key_value_heads, cfg.head_dim, target.dtype, target.device
        )
        aux = tuple(i - 1 for i in cfg.aux_layer_ids) if cfg.method == "eagle3" else ()
        proposer = cls(config.num_speculative_tokens, head, kv, target.attn_backend, aux)
        log.info(
            "%s head: weights %s (draft_dtype %s), draft vocabulary %d%s, native layer %s", cfg.method,
            f"q8_0 ({q8} activations)" if q8 else str(wdtype).removeprefix("torch."), config.draft_dtype or "auto",
            cfg.draft_vocab_size,
            " (mapped)" if draft_map is not None else "", proposer.native is not None,
        )
        return proposer

    # -- drafting ----------------------------------------------------------------------------------------
    def _attend(self, metadata: Any) -> Attend:
        k_cache, v_cache, scale = self.kv_cache.k[0], self.kv_cache.v[0], self.head.scale

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.backend.forward(q, k, v, k_cache, v_cache, metadata, scale)

        return attend

    def _head(self, ids: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor, metadata: Any) -> torch.Tensor:
        """The head's output for these rows: the native layer (and input fusion) where it applies, else the
        torch one."""
        native = self.native
        if native is not None and native.applies(ids.shape[0], metadata):
            out = native(*native.layer_input(ids, feat), positions, metadata)
            assert out is not None
            return out
        residual, attn_in = self.head.layer_input(ids, feat)
        return self.head.layer(residual, attn_in, positions, self._attend(metadata))

    def _draft_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy drafts (target ids) from the head's outputs: one native call where it applies."""
        return self.head.draft_tokens(h) if self.native is None else self.native.draft_tokens(h)

    def _segments(self, inp: ProposeInput) -> tuple[list[int], list[int]]:
        """Device-state slot of every request (segment) of the target batch, and the segment of each
        sampling request; the other segments are the prefill chunks, in batch order."""
        qsl = inp.batch.query_start_loc
        seg_slot = [-1] * inp.batch.num_reqs
        seg_of_req = []
        for st, rows in zip(inp.states, inp.sample_rows):
            seg = bisect_right(qsl, rows[0]) - 1
            seg_slot[seg] = st.slot
            seg_of_req.append(seg)
        rest = iter(inp.prefill_states)
        for seg in range(len(seg_slot)):
            if seg_slot[seg] < 0:
                seg_slot[seg] = next(rest).slot
        return seg_slot, seg_of_req

    def propose(self, inp: ProposeInput) -> torch.Tensor:
        batch, dev, k = inp.batch, inp.input_batch, self.k
        device = batch.input_ids.device
        n_req = len(inp.states)
        seg_slot, seg_of_req = self._segments(inp)
        qsl = batch.query_start_loc
        row_slot = torch.tensor(
            [seg_slot[s] for s in range(batch.num_reqs) for _ in range(qsl[s + 1] - qsl[s])], device=device
        )
        # 1. Every row: (token at position + 1, target feature at position).
        ids = dev.tokens[row_slot, (batch.positions + 1).clamp(max=dev.trash)]
        feat = self.head.target_feature(inp.hidden_states, self.aux_hidden_layers)
        hidden = self._head(ids, feat, batch.positions, batch.attn_metadata)
        if n_req == 0 or inp.num_drafts == 0:  # only the head's KV kept current
            return torch.full((n_req, k), -1, dtype=torch.int64, device=device)
        # 2. Chain from the last accepted row of each sampling request.
        accepted = (inp.sampled >= 0).sum(dim=1) - 1
        rows = torch.tensor([r[0] for r in inp.sample_rows], device=device) + accepted
        h = hidden.index_select(0, rows)
        tok = self._draft_tokens(h)
        out = torch.full((n_req, k), -1, dtype=torch.int64, device=device)
        out[:, 0] = tok
        if inp.num_drafts > 1:
            pos0 = batch.positions.index_select(0, rows)
            tables = dev.block_table.index_select(0, inp.slots)
            # Host upper bound of each start row's position + 1 (exact unless the step is unreconciled).
            upper = [batch.seq_lens[s] for s in seg_of_req]
            chain = self._chain_slots(pos0, tables, max(upper) + k - 1, inp.max_drafts)
            for j in range(1, inp.num_drafts):
                cb = ForwardBatch(
                    input_ids=tok,
                    positions=chain.positions[j - 1],
                    slot_mapping=chain.slots[j - 1],
                    block_tables=chain.tables,
                    query_start_loc=list(range(n_req + 1)),
                    seq_lens=[u + j for u in upper],
                    seq_lens_dev=chain.positions[j - 1] + 1,
                )
                metadata = self.backend.build_metadata(cb, self.block_size)
                h = self._head(tok, h, cb.positions, metadata)
                tok = self._draft_tokens(h)
                out[:, j] = tok
        keep = torch.arange(k, device=device) < inp.max_drafts.unsqueeze(1)
        return out.masked_fill_(~keep, -1)

    def _chain_slots(
        self, pos0: torch.Tensor, tables: torch.Tensor, max_len: int, max_drafts: torch.Tensor
    ) -> _ChainSlots:
        """Positions and KV slots of the k - 1 chained rows of every request (``[k - 1, n]``, row j - 1
        for chained step j), from each request's start position ``pos0`` on the device; ``max_len``: a
        host upper bound of every chained row's position + 1. A row past a request's draft cap (not
        needed) writes its KV to the trash block."""
        bs, k = self.block_size, self.k
        width = min(tables.shape[1], -(-max_len // bs))
        t = tables[:, :width]
        step = torch.arange(1, k, device=pos0.device).unsqueeze(1)  # [k - 1, 1]
        pos = pos0.unsqueeze(0) + step  # [k - 1, n]
        block = t.gather(1, torch.div(pos, bs, rounding_mode="floor").clamp(max=width - 1).T).T
        slots = torch.where(step < max_drafts.unsqueeze(0), block * bs + pos % bs, self.trash_slot)
        return _ChainSlots(pos.contiguous(), slots.contiguous(), t)


@dataclass(frozen=True)
class _ChainSlots:
    positions: torch.Tensor  # [k - 1, n] int64
    slots: torch.Tensor  # [k - 1, n] int64
    tables: torch.Tensor  # [n, W] the requests' block tables, cut to the chained rows' width


def resolve_head_path(config: SpeculativeConfig, target_checkpoint: Checkpoint | Path | None) -> Path:
    """The head directory: ``speculative_config.model`` (a path or a shipped name), else the head shipped
    for the target."""
    from tandem.spec_decode.shipped import shipped_head, shipped_head_for_target

    if config.model:
        return shipped_head(config.model, config.method) or Path(config.model)
    found = shipped_head_for_target(target_checkpoint, config.method)
    if found is None:
        src = target_checkpoint.source if target_checkpoint is not None else "this target"
        raise ValueError(
            f"speculative method {config.method!r}: no head is shipped for {src}; pass the head's "
            "directory as speculative_config.model (train one with `tandem train-drafter`)"
        )
    return found


class EagleProposer(DraftHeadProposer):
    method = "eagle"

    @classmethod
    def kv_bytes_per_block(
        cls, config: SpeculativeConfig, target: Path, args: ModelArgs, block_size: int, dtype: torch.dtype
    ) -> int:
        """The head's one layer, in its config.json's KV shape (the target's where it gives none)."""
        try:
            head = json.loads((resolve_head_path(config, target) / "config.json").read_text())
        except (OSError, ValueError):
            head = {}  # build() says what is wrong with the head
        kv_heads = int(head.get("num_key_value_heads") or args.num_key_value_heads)
        head_dim = int(head.get("head_dim") or args.head_dim)
        return KVCache.bytes_per_block(1, block_size, kv_heads, head_dim, dtype)

    @classmethod
    def build(
        cls,
        config: SpeculativeConfig,
        *,
        target: CausalLM,
        target_checkpoint: Checkpoint | None = None,
        num_kv_blocks: int,
        block_size: int,
        **_: Any,
    ) -> DraftHeadProposer:
        if cls.method == "eagle" and config.eagle3_layer_ids is not None:
            raise ValueError("speculative_config.eagle3_layer_ids applies to method 'eagle3' only")
        path = resolve_head_path(config, target_checkpoint)
        cfg, tensors = load_eagle_head(path, cls.method, target.num_layers, config.eagle3_layer_ids)
        check_against_target(cfg, target.args, path)
        return cls.from_head(config, cfg, tensors, target, num_kv_blocks, block_size)


class Eagle3Proposer(EagleProposer):
    method = "eagle3"
