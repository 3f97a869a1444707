"""Exact verification of a draft *tree*: the multi-candidate rule of SpecInfer (Miao et al., 2024) and
EAGLE-2 (Li et al., 2024), for candidates chosen without looking at the target.

A request's tree has nodes ``1..N``; node 0 is the root (the last confirmed token). ``parent[n] < n`` is the
node's parent (0: the root), ``d[n]`` its token (``-1``: no node). Siblings are tried in node order (the
drafter lists them most probable first). ``p[n]`` is the target distribution of the token after node n's
path (the target's logits at node n's row of the tree-masked verify forward; row 0 is the root's).

The walk starts at the root. At the current node c, with children x_1..x_m in order:

- greedy: move to the first child whose token is ``argmax p_c``; if none, emit ``argmax p_c`` (the
  *recovered* token, or the *bonus* token where c has no children) and stop;
- random: the candidates are the drafter's top choices, each a point mass (q = one-hot, as in the chain
  sampler without draft probabilities). Accept x_1 with probability ``p_c(x_1)``; on rejection remove its
  mass, ``p_c <- normalise(p_c with x_1 set to 0)``, and try x_2 against that residual, and so on. An
  accepted child becomes the current node with its own fresh ``p``; when every child is rejected (or there
  are none) the emitted token is drawn from the residual.

Exactness: at each node the emitted (or accepted) token follows p_c: P(x_1) = p_c(x_1), P(x_2 | not x_1)
= p_c(x_2) / (1 - p_c(x_1)), ..., and the residual draw gives every other token its share; by induction
along the path the emitted sequence follows the target's joint distribution, whatever the tree's shape.
Residual all zero (every token with mass was a rejected candidate: probability zero in exact
arithmetic): the final token is drawn from the fresh ``p_c``.

Because ``parent[n] < n`` and siblings come in node order, one pass over ``n = 1..N`` walks every
request's tree at once: node n is a candidate exactly when its parent is the current node (a node below a
rejected sibling, or beside an accepted one, never is).

Randomness, like the chain sampler's: per random row, ``V`` exponentials for the final token first, then
``N`` uniforms (one per node, used only when the node is tried), from that row's generator; a chain tree
(``parent[n] = n - 1``) therefore reproduces :func:`~tandem.sample.rejection.rejection_sample` without draft
probabilities draw for draw (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from tandem.sample.argmax import argmax_last
from tandem.sample.rejection import PLACEHOLDER
from tandem.sample.rng import RowRng, exponential_noise, race_sample, uniform_noise


class TreeVerdict(NamedTuple):
    output_token_ids: torch.Tensor  # [B, D + 1] int64: the accepted path's tokens, then one more; -1 padded
    accepted_nodes: torch.Tensor  # [B, D] int64: the accepted path's node indices (1..N), root first; -1 padded
    num_accepted: torch.Tensor  # [B] int64: accepted nodes (emitted tokens - 1)


def tree_depths(parent: torch.Tensor) -> torch.Tensor:
    """Depth of every node ``[B, N]`` (the root's children: 1), from ``parent`` ``[B, N]`` (0 = root)."""
    batch, n = parent.shape
    depth = torch.zeros(batch, n + 1, dtype=torch.int64, device=parent.device)
    for i in range(1, n + 1):
        depth[:, i] = depth.gather(1, parent[:, i - 1 : i].clamp(min=0)).squeeze(1) + 1
    return depth[:, 1:]


def greedy_tree_verify(target_ids: torch.Tensor, draft_token_ids: torch.Tensor, parent: torch.Tensor,
                       max_depth: int | None = None) -> TreeVerdict:
    """The greedy rule on ids alone: ``target_ids`` ``[B, N + 1]`` = argmax p_n of every row. ``max_depth``: the
    trees' depth bound when the caller knows it (the verdict's width; else measured, a read of the device)."""
    return _walk(target_ids, None, draft_token_ids, parent, None, torch.ones(target_ids.shape[0], dtype=torch.bool,
                                                                            device=target_ids.device), max_depth)


def greedy_tree_verify_rows(target_ids: Sequence[Sequence[int]], draft_token_ids: Sequence[Sequence[int]],
                            parent: Sequence[Sequence[int]], max_depth: int) -> TreeVerdict:
    """:func:`greedy_tree_verify` on host lists (``target_ids[b][c]`` the argmax of request b's row of node c,
    the root 0; ``draft_token_ids`` / ``parent`` ``[B][N]``): on the CPU a verify's ids are a handful of
    numbers, and the tensor walk costs a dozen small operations a node. The same walk (tested equal)."""
    paths, nodes, nums = [], [], []
    for tid, d, par in zip(target_ids, draft_token_ids, parent):
        cur, path, on = 0, [], []
        for i in range(1, len(d) + 1):
            tok = d[i - 1]
            if tok >= 0 and par[i - 1] == cur and tok == tid[cur]:
                path.append(tok)
                on.append(i)
                cur = i
        nums.append(len(path))
        paths.append([*path, tid[cur], *[PLACEHOLDER] * (max_depth - len(path))])
        nodes.append([*on, *[PLACEHOLDER] * (max_depth - len(on))])
    i64 = torch.int64
    return TreeVerdict(torch.tensor(paths, dtype=i64), torch.tensor(nodes, dtype=i64).view(len(nodes), max_depth),
                       torch.tensor(nums, dtype=i64))


def tree_rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parent: torch.Tensor,
    generators: Sequence[RowRng | None] | None,
    greedy_mask: torch.Tensor,
    max_depth: int | None = None,
) -> TreeVerdict:
    """Verify draft trees against the target.

    ``target_probs`` ``[B, N + 1, V]`` (processed, normalised; row 0 the root's), ``draft_token_ids``
    ``[B, N]`` int64 (-1: no node), ``parent`` ``[B, N]`` int64 with ``parent[b, n - 1] < n`` (0: the root),
    ``generators`` one per row or None (the default generator), ``greedy_mask`` ``[B]`` bool."""
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [B, N+1, V], got shape {tuple(target_probs.shape)}")
    return _walk(argmax_last(target_probs), target_probs, draft_token_ids, parent, generators, greedy_mask, max_depth)


def _check(target_ids: torch.Tensor, d: torch.Tensor, parent: torch.Tensor, gens: object, greedy: torch.Tensor) -> None:
    batch, n = target_ids.shape[0], target_ids.shape[1] - 1
    for name, t in (("draft_token_ids", d), ("parent", parent)):
        if tuple(t.shape) != (batch, n) or t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64 of shape ({batch}, {n}), got {t.dtype} {tuple(t.shape)}")
    if n and not bool((parent < torch.arange(1, n + 1, device=parent.device)).all()):
        raise ValueError("parent: every node's parent must come before it (parent[b, n - 1] < n; 0 is the root)")
    if gens is not None and len(gens) != batch:  # type: ignore[arg-type]
        raise ValueError(f"generators: expected {batch} entries, got {len(gens)}")  # type: ignore[arg-type]
    if tuple(greedy.shape) != (batch,) or greedy.dtype != torch.bool:
        raise ValueError(f"greedy_mask must be bool of shape ({batch},)")


def _walk(
    target_ids: torch.Tensor,
    p: torch.Tensor | None,
    d: torch.Tensor,
    parent: torch.Tensor,
    generators: Sequence[RowRng | None] | None,
    greedy_mask: torch.Tensor,
    max_depth: int | None = None,
) -> TreeVerdict:
    _check(target_ids, d, parent, generators, greedy_mask)
    batch, n = d.shape
    device = d.device
    rows = torch.arange(batch, device=device)
    if max_depth is None:
        max_depth = int(tree_depths(parent).max()) if n else 0
    cur = torch.zeros(batch, dtype=torch.int64, device=device)  # the current node (0: the root)
    num = torch.zeros(batch, dtype=torch.int64, device=device)  # accepted so far
    path = torch.full((batch, max_depth + 1), PLACEHOLDER, dtype=torch.int64, device=device)
    nodes = torch.full((batch, max_depth + 1), PLACEHOLDER, dtype=torch.int64, device=device)
    random = p is not None and not bool(greedy_mask.all())
    if random:
        assert p is not None
        gens = list(generators) if generators is not None else [None] * batch
        noise = exponential_noise(batch, p.shape[2], gens, device)  # drawn first: see the module doc
        u = uniform_noise(batch, n, gens, device)
        residual = p[:, 0].clone()  # the current node's p with its rejected candidates' mass removed
        mass = torch.ones(batch, dtype=p.dtype, device=device)  # its sum (rows are normalised)
    for i in range(1, n + 1):
        tok = d[:, i - 1]
        candidate = (tok >= 0) & (parent[:, i - 1] == cur)
        safe = tok.clamp(min=0)
        accept = candidate & (tok == target_ids[rows, cur])  # greedy
        if random:
            p_tok = residual[rows, safe]
            accept_random = candidate & (p_tok > 0) & (u[:, i - 1] * mass < p_tok)
            accept = torch.where(greedy_mask, accept, accept_random)
            rejected = candidate & ~accept
            mass = torch.where(rejected, mass - p_tok, mass)
            residual[rows, safe] = torch.where(rejected, 0.0, p_tok)
            residual = torch.where(accept.unsqueeze(1), p[:, i], residual)  # type: ignore[index]
            mass = torch.where(accept, torch.ones_like(mass), mass)
        path[rows, num] = torch.where(accept, tok, path[rows, num])
        nodes[rows, num] = torch.where(accept, i, nodes[rows, num])
        cur = torch.where(accept, i, cur)
        num = num + accept.to(torch.int64)
    final = target_ids[rows, cur]
    if random:
        assert p is not None
        dist = torch.where((residual.sum(dim=1, keepdim=True) > 0), residual, p[rows, cur])
        final = torch.where(greedy_mask, final, race_sample(dist, noise))
    path[rows, num] = final
    return TreeVerdict(path, nodes[:, :max_depth], num)
