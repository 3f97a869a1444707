"""The reference tree-speculation loop: one request, greedy, a target and its draft head (EAGLE, EAGLE-3, MTP).

Each step drafts a tree (:mod:`tree_draft`), verifies root + nodes in one target forward under the tree mask
(``ForwardBatch.tree_masks``), keeps the longest path the target's argmax agrees with plus one more token
(:func:`~tandem.sample.tree_rejection.greedy_tree_verify`), moves the accepted nodes' K/V rows to the
sequence's next positions (``KVCache.move_rows``) and runs the head over the accepted rows (root and accepted
nodes, with the target's features of those rows), which writes the head's KV there and gives the next tree's
root output. A chain is the tree of ``top_k`` 1; ``shape`` None is plain greedy decoding through the same
model calls.

It is the reference the engine's tree steps are built against (the same outputs as plain greedy decoding,
tested) and the driver of the acceptance measurement (``benchmarks/bench_tree_acceptance.py``). It owns its
caches; sliding-window models are refused (tree steps do not support windows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tandem.model.attention.base import slots_for_positions
from tandem.model.forward_batch import KVCache
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.transformer import CausalLM
from tandem.sample.tree_rejection import greedy_tree_verify
from tandem.spec_decode.eagle import DraftHeadProposer
from tandem.spec_decode.tree_draft import DraftTree, TreeDrafter, TreeShape


@dataclass
class TreeRun:
    tokens: list[int]  # the generated tokens (max_tokens of them)
    accepted_lengths: list[int] = field(default_factory=list)  # tokens each verify step emitted

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.accepted_lengths) / len(self.accepted_lengths) if self.accepted_lengths else float("nan")


@torch.inference_mode()
def generate(model: CausalLM, proposer: DraftHeadProposer, prompt: list[int], max_tokens: int,
             shape: TreeShape | None, block_size: int = 16,
             oracle: Callable[[list[int]], DraftTree] | None = None,
             stop_token_ids: frozenset[int] = frozenset()) -> TreeRun:
    """``max_tokens`` greedy tokens after ``prompt``, drafting trees of ``shape`` with ``proposer``'s head
    (its weights; the caches are this call's own). ``oracle`` (tests): the tree to verify given the tokens so
    far, instead of the head's (the head still runs, as it would). Generation ends after a token of
    ``stop_token_ids`` (EOS)."""
    if any(layer.sliding for layer in model.layers):
        raise ValueError("tree speculation does not support sliding-window layers")
    head, bs = proposer.head, block_size
    reserve = 2 + (0 if shape is None else max(shape.max_nodes, shape.expansions))
    n_blocks = -(-(len(prompt) + max_tokens + reserve) // bs) + 1
    table = list(range(n_blocks))
    a = model.args
    kv = KVCache.allocate(model.num_layers, n_blocks, bs, a.num_key_value_heads, a.head_dim, model.dtype, model.device)
    head_kv = KVCache.allocate(1, n_blocks + 1, bs, head.cfg.num_key_value_heads, head.cfg.head_dim, model.dtype,
                               model.device)
    prop = DraftHeadProposer(shape.depth if shape else 1, head, head_kv, model.attn_backend,
                             proposer.aux_hidden_layers)
    aux = prop.aux_hidden_layers
    tables = torch.tensor([table], dtype=torch.int64, device=model.device)

    def features(out, rows: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
        hidden = {-1: out.hidden_states, **dict(zip(aux, out.aux_hidden_states))}
        if rows is not None:
            hidden = {key: h.index_select(0, rows) for key, h in hidden.items()}
        return head.target_feature(hidden, aux)

    def head_pass(ids: list[int], feats: torch.Tensor, start: int) -> torch.Tensor:
        batch = build_forward_batch([PagedRequest(ids, start, table)], bs, model.device)
        return prop._head(batch.input_ids, feats, batch.positions, prop.backend.build_metadata(batch, bs))

    def slots(positions: list[int]) -> torch.Tensor:
        return slots_for_positions(tables, torch.tensor(positions, device=model.device), bs).view(-1)

    out = model(build_forward_batch([PagedRequest(prompt, 0, table)], bs, model.device), kv,
                aux_hidden_layers=aux if shape else ())
    x = int(model.compute_logits(out.hidden_states[-1:]).argmax(-1))
    run = TreeRun([x])
    root = len(prompt)  # x's position: its K/V is not in the cache yet
    drafter = None if shape is None else TreeDrafter(prop, shape)
    h_root = head_pass(prompt[1:] + [x], features(out), 0)[-1:] if drafter else None
    while len(run.tokens) < max_tokens and not stop_token_ids.intersection(run.tokens[-1:]):
        if drafter is None:
            out = model(build_forward_batch([PagedRequest([x], root, table)], bs, model.device), kv)
            x = int(model.compute_logits(out.hidden_states).argmax(-1))
            run.tokens.append(x)
            root += 1
            continue
        assert h_root is not None
        base = torch.tensor([root], device=model.device)
        tree = drafter.draft(h_root, tables, base, base, [root])
        if oracle is not None:
            tree = oracle(prompt + run.tokens)
        batch = build_forward_batch([PagedRequest([x, *tree.tokens[0].tolist()], root, table,
                                                  parents=tree.parents[0].tolist())], bs, model.device)
        out = model(batch, kv, aux_hidden_layers=aux)
        target_ids = model.compute_logits(out.hidden_states).argmax(-1)
        verdict = greedy_tree_verify(target_ids.unsqueeze(0), tree.tokens, tree.parents)
        m = int(verdict.num_accepted[0])
        nodes = verdict.accepted_nodes[0, :m]
        emitted = verdict.output_token_ids[0, : m + 1].tolist()
        if m:
            kv.move_rows(slots([root + n for n in nodes.tolist()]), slots(list(range(root + 1, root + m + 1))))
        rows = torch.cat([torch.zeros(1, dtype=torch.int64, device=nodes.device), nodes])
        h_root = head_pass(emitted, features(out, rows), root)[-1:]
        stop = next((i for i, t in enumerate(emitted) if t in stop_token_ids), None)
        run.tokens.extend(emitted if stop is None else emitted[: stop + 1])
        run.accepted_lengths.append(m + 1)
        if stop is not None:
            break
        root += m + 1
        x = emitted[-1]
    run.tokens = run.tokens[:max_tokens]
    return run
