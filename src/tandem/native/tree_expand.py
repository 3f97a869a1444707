"""Python side of ``tree_expand.c``: a draft tree's bookkeeping between the head's levels, on CPU tensors, for
:func:`tandem.spec_decode.tree_draft.expand_tree` (whose torch ops are the reference and the path elsewhere).

:class:`TreeState` holds the tree being built (the reference's tensors); the kernel's calls select a level's
nodes, compute their head rows for the attention, record their children, number the verified nodes and give
the stored trees' masks. The C code trusts shapes and types: the state allocates every tensor itself, and the
calls check what comes from outside (the head's top-k, the tables, the trees)."""

from __future__ import annotations

import ctypes
import functools

import torch

from tandem import native

_ABI = 2
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


def _p(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class TreeState:
    """One step's trees under construction: ``batch`` requests, ``created`` nodes each, ``slots`` expansion
    slots each (tensors as in the reference, ``anc`` as int64 bits)."""

    def __init__(self, batch: int, created: int, slots: int) -> None:
        self.batch, self.created, self.slots = batch, created, slots
        # The integer arrays in one buffer, each filled as the reference's starts.
        ints = torch.tensor([-1, -1, 0, 0, -1], dtype=torch.int64).repeat_interleave(batch * created)
        self.tok, self.parent, self.depth, self.anc, self.slot_of = ints.view(5, batch, created).unbind(0)
        self.score = torch.full((batch, created), float("-inf"), dtype=torch.float32)


class TreeExpandKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.tandem_tree_expand_abi.restype = ctypes.c_int
        if lib.tandem_tree_expand_abi() != _ABI:
            raise RuntimeError("tree_expand library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self._select = lib.tandem_tree_select
        self._select.argtypes = [_i64] * 7 + [_ptr] * 11
        self._select.restype = None
        self._record = lib.tandem_tree_record
        self._record.argtypes = [_i64] * 5 + [_ptr] * 4 + [_i64] * 2 + [_ptr] * 6
        self._record.restype = None
        self._finish = lib.tandem_tree_finish
        self._finish.argtypes = [_i64] * 3 + [_ptr] * 7
        self._finish.restype = ctypes.c_int
        self._rows = lib.tandem_tree_rows
        self._rows.argtypes = [_i64] * 3 + [_ptr, _i64, _i64] + [_ptr] * 4 + [_i64] * 2 + [_ptr] * 5
        self._rows.restype = None
        self._head_rows = lib.tandem_tree_head_rows
        self._head_rows.argtypes = [_i64, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr,
                                    _i64, _i64] + [_ptr] * 5
        self._head_rows.restype = ctypes.c_int
        self._bits = lib.tandem_tree_bits
        self._bits.argtypes = [_i64, _i64, _ptr, _ptr, _ptr]
        self._bits.restype = None

    def select(self, st: TreeState, lo: int, hi: int, e: int, slot0: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``e`` best nodes of creation range ``lo .. hi`` per request, given slots ``slot0 ..``: their
        indices, tokens, depths, parents' head rows (in a ``[B * (1 + slots)]`` table: row 0 of a request the
        root's output, 1 + s slot s's) and ancestor bits (their own slot's included), each ``[B, e]``."""
        if not 1 <= e <= hi - lo or not 0 <= lo < hi <= st.created or slot0 + e > st.slots or st.slots > 63:
            raise ValueError(f"tree select: {e} of nodes {lo}..{hi} at slot {slot0} ({st.created} nodes, "
                             f"{st.slots} slots)")
        x, ids, depths, src, anc = torch.empty(5, st.batch, e, dtype=torch.int64).unbind(0)
        self._select(st.batch, st.created, st.slots, lo, hi, e, slot0, st.score.data_ptr(), st.tok.data_ptr(),
                     st.parent.data_ptr(), st.depth.data_ptr(), st.anc.data_ptr(), st.slot_of.data_ptr(),
                     x.data_ptr(), ids.data_ptr(), depths.data_ptr(), src.data_ptr(), anc.data_ptr())
        return x, ids, depths, src, anc

    def record(self, st: TreeState, created: int, x: torch.Tensor | None, lv: torch.Tensor, li: torch.Tensor,
               draft_map: torch.Tensor | None, level: int, anc_rows: torch.Tensor | None) -> None:
        """The children of expanded nodes ``x`` ``[B, e]`` (None: the root) from the head's top-k ``lv`` /
        ``li`` ``[B * e, k]`` (log-probabilities, draft ids; ids outside ``draft_map`` are clamped into it), at
        creation index ``created`` on."""
        e = 1 if x is None else x.shape[1]
        k = lv.shape[-1]
        rows_ok = all(t is None or (t.dtype == torch.int64 and t.is_contiguous() and tuple(t.shape) == (st.batch, e))
                      for t in (x, anc_rows))
        if (lv.dtype != torch.float32 or li.dtype != torch.int64 or tuple(lv.shape) != (st.batch * e, k)
                or li.shape != lv.shape or created + e * k > st.created or not rows_ok):
            raise ValueError(f"tree record: top-k {lv.dtype} {tuple(lv.shape)} / {li.dtype} {tuple(li.shape)} "
                             f"for {st.batch} x {e} nodes from {created} of {st.created}")
        if draft_map is not None and (draft_map.dtype != torch.int64 or not draft_map.is_contiguous()):
            raise ValueError("tree record: the draft map must be contiguous int64")
        lv, li = lv.contiguous(), li.contiguous()
        self._record(st.batch, st.created, created, e, k, _p(x), lv.data_ptr(), li.data_ptr(), _p(draft_map),
                     0 if draft_map is None else draft_map.numel(), level, _p(anc_rows), st.tok.data_ptr(),
                     st.score.data_ptr(), st.parent.data_ptr(), st.depth.data_ptr(), st.anc.data_ptr())

    def finish(self, st: TreeState, max_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verified nodes' tokens, parents' numbers and depths ``[B, max_nodes]``."""
        if not 1 <= max_nodes <= st.created:
            raise ValueError(f"tree finish: {max_nodes} of {st.created} nodes")
        tok, par, dep = torch.empty(3, st.batch, max_nodes, dtype=torch.int64).unbind(0)
        rc = self._finish(st.batch, st.created, max_nodes, st.score.data_ptr(), st.tok.data_ptr(),
                          st.parent.data_ptr(), st.depth.data_ptr(), tok.data_ptr(), par.data_ptr(),
                          dep.data_ptr())
        if rc != 0:
            raise MemoryError("tree finish: no scratch memory")
        return tok, par, dep

    def rows(self, tables: torch.Tensor, base: torch.Tensor, root_pos: torch.Tensor, depths: torch.Tensor,
             anc_rows: torch.Tensor, slot0: int, block_size: int, limit: int | None, trash: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A level's head rows (``[B, e]`` depths and ancestor bits, slots ``slot0 ..``) for the attention:
        positions, slots, sequence lengths and tree masks ``[B * e]`` and each row's block table
        ``[B * e, W]`` (``TreeDrafter.head_step``'s torch ops are the reference)."""
        batch, e = depths.shape
        ok = (tables.dim() == 2 and tables.shape[0] == batch and tuple(base.shape) == tuple(root_pos.shape) == (batch,)
              and anc_rows.shape == depths.shape and 0 <= slot0 and slot0 + e <= 63 and block_size > 0
              and all(t.dtype == torch.int64 and t.device.type == "cpu" for t in (tables, base, root_pos, depths, anc_rows)))
        if not ok:
            raise ValueError(f"tree rows: {tuple(depths.shape)} rows at slot {slot0} with tables "
                             f"{tuple(tables.shape)}, bases {tuple(base.shape)}")
        tables, base, root_pos, depths, anc_rows = (t.contiguous() for t in (tables, base, root_pos, depths, anc_rows))
        positions, slot_map, seq_lens, bits = torch.empty(4, batch * e, dtype=torch.int64).unbind(0)
        out_tables = torch.empty(batch * e, tables.shape[1], dtype=torch.int64)
        self._rows(batch, e, slot0, tables.data_ptr(), tables.shape[1], block_size, base.data_ptr(),
                   root_pos.data_ptr(), depths.data_ptr(), anc_rows.data_ptr(), -1 if limit is None else limit, trash,
                   positions.data_ptr(), slot_map.data_ptr(), seq_lens.data_ptr(), bits.data_ptr(),
                   out_tables.data_ptr())
        return positions, slot_map, seq_lens, bits, out_tables

    def head_rows(self, meta: list[list[int]], base: torch.Tensor, batch_positions: torch.Tensor,
                  nodes: torch.Tensor | None, tokens: torch.Tensor, table: torch.Tensor, block_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head pass's rows over a tree step (``tree_propose.head_rows`` is the reference): ``meta`` five
        lists over the rows (slot, target row, offset, index among the verdict's rows or -1, plan); ``base``
        ``[P]`` the plans' frontiers, ``batch_positions`` the target rows', ``nodes`` the verdict's accepted
        nodes ``[Bv, D]``, ``tokens`` / ``table`` the persistent batch's. Returns positions, ids, slot mapping
        and feature rows ``[R]`` and each plan's sequence length ``[P]``."""
        m = torch.tensor(meta, dtype=torch.int64)
        if m.dim() != 2 or m.shape[0] != 5:
            raise ValueError(f"tree head rows: meta must be five lists of rows, got shape {tuple(m.shape)}")
        r, p = m.shape[1], base.shape[0]
        nd = nodes if nodes is not None and nodes.dim() == 2 and nodes.shape[1] else None
        ts = (base, batch_positions, tokens, table) + (() if nd is None else (nd,))
        if (any(t.dtype != torch.int64 or t.device.type != "cpu" for t in ts) or tokens.dim() != 2
                or table.dim() != 2 or not tokens.is_contiguous() or not table.is_contiguous() or block_size < 1):
            raise ValueError("tree head rows: bases, positions, nodes, tokens and tables must be int64 CPU tensors "
                             "(tokens and tables 2-D, contiguous)")
        base, batch_positions = base.contiguous(), batch_positions.contiguous()
        nd = None if nd is None else nd.contiguous()
        out = torch.empty(4 * r + p, dtype=torch.int64)
        positions, ids, slot_map, feat_rows = out[: 4 * r].view(4, r).unbind(0)
        seq_lens = out[4 * r :]
        rc = self._head_rows(r, m.data_ptr(), p, base.data_ptr(), batch_positions.shape[0], batch_positions.data_ptr(),
                             _p(nd), 0 if nd is None else nd.shape[0], 0 if nd is None else nd.shape[1],
                             tokens.data_ptr(), tokens.shape[0], tokens.shape[1], table.data_ptr(), table.shape[1],
                             block_size, positions.data_ptr(), ids.data_ptr(), slot_map.data_ptr(),
                             feat_rows.data_ptr(), seq_lens.data_ptr())
        if rc != 0:
            raise ValueError("tree head rows: a row's slot, target row, plan, verdict row, position or node is "
                             "outside its array")
        return positions, ids, slot_map, feat_rows, seq_lens

    def bits(self, parents: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """Every tree row's tree mask ``[B, N + 1]`` from the nodes' ``parents`` and ``depths`` ``[B, N]``
        (``worker/tree_step.py``'s ``tree_bits`` is the reference). At most 63 nodes."""
        if (parents.shape != depths.shape or parents.dim() != 2 or parents.shape[1] > 63
                or any(t.dtype != torch.int64 or t.device.type != "cpu" for t in (parents, depths))):
            raise ValueError(f"tree bits: parents {tuple(parents.shape)} and depths {tuple(depths.shape)} must be "
                             "int64 CPU [B, N <= 63]")
        parents, depths = parents.contiguous(), depths.contiguous()
        out = torch.empty(parents.shape[0], parents.shape[1] + 1, dtype=torch.int64)
        self._bits(parents.shape[0], parents.shape[1], parents.data_ptr(), depths.data_ptr(), out.data_ptr())
        return out


@functools.cache
def _kernel() -> TreeExpandKernel | None:
    lib = native.load("tree_expand")
    return None if lib is None else TreeExpandKernel(lib)


def tree_expand_kernel() -> TreeExpandKernel | None:
    """The compiled kernel, or ``None`` where native kernels are unavailable (see :mod:`tandem.native`)."""
    return _kernel() if native.enabled() else None
