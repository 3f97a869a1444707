"""Draft-model proposer: a separate small checkpoint (same tokenizer), its own weights and its own KV
cache, indexed by the target's block tables. It shares nothing with the target. Without
``speculative_config.model`` it takes the draft shipped for its target (``make_draft.SHIPPED_DRAFTS``: the
target's first layers), found by the target's known model name.

Per request the drafter keeps how many leading positions of its KV are valid. Each step it
1. catches up: feeds the tokens it has not seen (the prompt at first, then the bonus / recovered token and
   any accepted drafts it did not feed itself) in one batched forward, whose last row predicts d1;
2. feeds d1 .. d(k-1) one position at a time (batched across requests) to get d2 .. dk.
Drafts are greedy (argmax), so their distribution q is one-hot and the rejection sampler runs without
draft probabilities — exact for every sampling setting. After verification, the positions of accepted
drafts that the drafter fed itself stay valid (same tokens); the rest are overwritten next catch-up.
Positions beyond the target's are written into lookahead slots the scheduler reserves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tandem.config import SpeculativeConfig
from tandem.model.forward_batch import KVCache
from tandem.model.loader import Checkpoint, load_checkpoint
from tandem.model.model_args import ModelArgs
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.transformer import CausalLM
from tandem.sample.argmax import argmax_last
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.worker.request_state import RequestState

_VALID = "draft_valid"  # positions of the draft KV that hold the request's real tokens
_BASE = "draft_base"  # num_tokens when drafts were last proposed
_FED = "draft_fed"  # drafts fed into the draft KV at positions base, base+1, ...


class DraftModelProposer(Proposer):
    method = "draft_model"
    SUPPORTS_ASYNC_SCHEDULING = True
    device_native = False  # catch-up lengths depend on the accepted counts: host shapes
    needs_lookahead_slots = True

    def __init__(self, num_speculative_tokens: int, draft: CausalLM, kv_cache: KVCache) -> None:
        super().__init__(num_speculative_tokens)
        self.draft = draft
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size

    @classmethod
    def kv_bytes_per_block(
        cls, config: SpeculativeConfig, target: Path, args: ModelArgs, block_size: int, dtype: torch.dtype
    ) -> int:
        from tandem.model.loader.model_info import load_model_args
        from tandem.spec_decode.make_draft import SHIPPED_DRAFTS, shipped_draft_for_target
        from tandem.worker.worker import DTYPES

        name = config.model or shipped_draft_for_target(target)
        if name is None:
            return 0  # build() says why there is no draft
        if name.lower() in SHIPPED_DRAFTS:  # the target's first layers
            layers, kv_heads, head_dim = SHIPPED_DRAFTS[name.lower()][1], args.num_key_value_heads, args.head_dim
        else:
            d = load_model_args(name)
            layers, kv_heads, head_dim = d.num_hidden_layers, d.num_key_value_heads, d.head_dim
        draft_dtype = DTYPES[config.draft_dtype] if config.draft_dtype not in (None, "auto") else dtype
        return KVCache.bytes_per_block(layers, block_size, kv_heads, head_dim, draft_dtype)

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
    ) -> DraftModelProposer:
        from tandem.spec_decode.make_draft import resolve_shipped_draft, shipped_draft_for_target
        from tandem.worker.worker import DTYPES

        name = config.model or shipped_draft_for_target(target_checkpoint)
        if name is None:
            src = target_checkpoint.source if target_checkpoint is not None else "this target"
            raise ValueError(
                f"speculative method 'draft_model': no draft model is shipped for {src}; pass one with "
                "the target's tokenizer as speculative_config.model (`tandem make-draft` exports one)"
            )
        path = resolve_shipped_draft(name) or name
        dtype = DTYPES[config.draft_dtype] if config.draft_dtype not in (None, "auto") else target.dtype
        ckpt = load_checkpoint(path, dtype)
        if ckpt.args.vocab_size != target.args.vocab_size:
            raise ValueError(
                f"draft model {name!r} has a vocabulary of {ckpt.args.vocab_size} tokens, "
                f"the target {target.args.vocab_size}: a draft model must share the target's tokenizer"
            )
        if target_checkpoint is not None:
            t_tok, d_tok = target_checkpoint.tokenizer, ckpt.tokenizer
            probe = [t_tok.convert_ids_to_tokens(i) for i in (0, 1, 2, t_tok.vocab_size - 1)]
            if probe != [d_tok.convert_ids_to_tokens(i) for i in (0, 1, 2, t_tok.vocab_size - 1)]:
                raise ValueError(f"draft model {name!r} uses another tokenizer than the target")
        draft = CausalLM.from_tensors(ckpt.args, ckpt.tensors, dtype, target.device)
        a = ckpt.args
        kv = KVCache.allocate(
            a.num_hidden_layers, num_kv_blocks, block_size, a.num_key_value_heads, a.head_dim,
            dtype, target.device,
        )
        return cls(config.num_speculative_tokens, draft, kv)

    # -- drafting ----------------------------------------------------------------------------------------
    def _valid_positions(self, st: RequestState, num_accepted: int | None) -> int:
        ps = st.proposer_state
        if _BASE not in ps:
            return int(ps.get(_VALID, 0))
        if num_accepted is None:
            return int(ps[_BASE])
        return int(ps[_BASE]) + min(num_accepted, int(ps[_FED]))

    def _forward(self, reqs: list[PagedRequest]) -> torch.Tensor:
        batch = build_forward_batch(reqs, self.block_size, self.draft.device, last_token_logits_only=True)
        out = self.draft(batch, self.kv_cache)
        assert batch.logits_indices is not None
        return argmax_last(self.draft.compute_logits(out.hidden_states[batch.logits_indices]))

    @torch.inference_mode()
    def propose(self, inp: ProposeInput) -> list[list[int]]:
        assert inp.num_accepted is not None and inp.max_drafts_host is not None
        num_accepted, max_drafts = inp.num_accepted, inp.max_drafts_host
        # 1. Catch up: prefill-chunk requests up to the runner's frontier, sampling ones up to their last
        #    token (whose logits give d1).
        catch: list[PagedRequest] = []
        owners: list[int] = []  # index into inp.states, or -1 for a prefill-only request
        for st in inp.prefill_states:
            valid = self._valid_positions(st, None)
            end = st.num_computed_tokens
            if end > valid:
                catch.append(PagedRequest(st.tokens(valid, end), valid, st.block_ids))
                owners.append(-1)
            st.proposer_state.update({_VALID: end})
            st.proposer_state.pop(_BASE, None)
        for i, st in enumerate(inp.states):
            valid = min(self._valid_positions(st, num_accepted[i]), st.num_tokens - 1)
            catch.append(PagedRequest(st.tokens(valid, st.num_tokens), valid, st.block_ids))
            owners.append(i)
        drafts: list[list[int]] = [[] for _ in inp.states]
        if not catch:
            return drafts
        first = self._forward(catch).tolist()
        for owner, tok in zip(owners, first):
            if owner >= 0 and max_drafts[owner] > 0:
                drafts[owner].append(tok)
        # 2. Chain: feed d_j at position num_tokens + j - 1 to get d_(j+1).
        for j in range(1, self.k):
            active = [i for i in range(len(inp.states)) if len(drafts[i]) == j < max_drafts[i]]
            if not active:
                break
            reqs = [
                PagedRequest([drafts[i][-1]], inp.states[i].num_tokens + j - 1, inp.states[i].block_ids)
                for i in active
            ]
            for i, tok in zip(active, self._forward(reqs).tolist()):
                drafts[i].append(tok)
        for st, d in zip(inp.states, drafts):
            st.proposer_state.update({_VALID: st.num_tokens, _BASE: st.num_tokens, _FED: max(len(d) - 1, 0)})
        return drafts
