"""The native paged-attention kernel: built here, used by the default backend, exact against SDPA, safe on
bad input. (Its agreement with the dense reference on every batch layout is in
tests/model/test_attention.py, which runs every registered backend.)"""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem import native
from tandem.model.attention import PagedCpuBackend, SdpaBackend, default_attention_backend
from tandem.model.attention.paged_cpu import PagedCpuMetadata
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.native.paged_attention import PagedAttentionKernel, paged_attention_kernel
from tests.model.test_attention import LAYOUTS, run_case

needs_cc = pytest.mark.skipif(
    native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler"
)


def _batch(layout: list[tuple[int, int]], block_size: int = 4):
    """A batch over shuffled blocks, with random caches and queries; returns the pieces."""
    gen = torch.Generator().manual_seed(0)
    paged, next_block = [], 0
    for cached, q_len in layout:
        nb = -(-(cached + q_len) // block_size)
        paged.append(PagedRequest([0] * q_len, cached, list(range(next_block, next_block + nb))[::-1]))
        next_block += nb
    batch = build_forward_batch(paged, block_size)
    kv_heads, heads, hd = 2, 6, 16
    shape = (next_block + 2, block_size, kv_heads, hd)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    t = batch.num_tokens
    q = torch.randn(t, heads, hd, generator=gen)
    k, v = torch.randn(t, kv_heads, hd, generator=gen), torch.randn(t, kv_heads, hd, generator=gen)
    return batch, q, k, v, k_cache, v_cache


@needs_cc
def test_kernel_builds_and_is_the_default_backend() -> None:
    assert default_attention_backend() == default_attention_backend("cpu") == "paged_cpu"
    assert default_attention_backend("cuda") == "sdpa"  # paged_cpu would only fall back to it there
    backend = PagedCpuBackend(torch.float32)
    assert backend.kernel is not None, "the native kernel did not build on a machine with a compiler"
    batch, *_ = _batch([(5, 1), (9, 4), (0, 40)])
    meta = backend.build_metadata(batch, 4)
    assert isinstance(meta, PagedCpuMetadata)
    assert meta.short is not None and meta.short.num_reqs == 2 and len(meta.long_queries) == 1


@needs_cc
@pytest.mark.parametrize("window", [0, 70])
@pytest.mark.parametrize("head_dim", [64, 128, 80, 256])
@pytest.mark.parametrize("layout", ["mixed", "decodes", "verifies", "long"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_head_size_matches_dense_reference(
    head_dim: int, layout: str, dtype: torch.dtype, window: int
) -> None:
    """64 and 128 take the AVX-512 task where the CPU has it, else the AVX2 one; 80 and 256 (Gemma 3) the AVX2
    task where the CPU has AVX2 (else the portable one); lengths that are not multiples of 16 exercise the
    partial key chunks; a window of 70 makes the long requests skip whole leading chunks and start others
    part-way."""
    layouts = {**LAYOUTS, "long": [(200, 1), (37, 4), (130, 1), (16, 17), (0, 1)]}
    backend = PagedCpuBackend(dtype, short_query_max=17)
    out, want = run_case(backend, layouts[layout], 8, 2, 16, dtype, seed=3, head_dim=head_dim, window=window)
    diff = (out.double() - want).abs().max().item()
    assert diff < (1e-5 if dtype == torch.float32 else 3e-2), diff


@needs_cc
def test_fast_path_is_taken_where_the_cpu_has_it() -> None:
    import ctypes

    lib = native.load("paged_attention")
    assert lib is not None
    flags = native._cpu_flags().split()
    avx2 = 1 if "avx2" in flags and "fma" in flags else 0
    fast = lib.tandem_paged_attention_fast_path
    fast.argtypes = [ctypes.c_int64]
    assert fast(64) == (2 if "avx512f" in flags else avx2)
    assert fast(80) == avx2 and fast(12) == 0


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_agrees_with_sdpa(dtype: torch.dtype) -> None:
    layout = [(15, 1), (3, 1), (40, 1), (9, 4), (0, 1), (60, 17)]
    batch, q, k, v, k_cache, v_cache = (
        x.to(dtype) if isinstance(x, torch.Tensor) else x for x in _batch(layout)
    )
    outs = []
    for backend in (SdpaBackend(dtype), PagedCpuBackend(dtype)):
        kc, vc = k_cache.clone(), v_cache.clone()
        outs.append(backend.forward(q, k, v, kc, vc, backend.build_metadata(batch, 4), 0.25))
    diff = (outs[0].float() - outs[1].float()).abs().max().item()
    # fp32: summation order only. bf16: both accumulate in fp32 and round once, so they differ by at
    # most an ulp or two of the bf16 result (|out| < 4 here: ulp 2^-6).
    assert diff < (1e-5 if dtype == torch.float32 else 2 * 2**-6), diff


@needs_cc
def test_device_lengths_override_host_upper_bounds() -> None:
    """Deferred reconciliation: the host holds upper bounds, the exact lengths come in seq_lens_dev."""
    batch, q, k, v, k_cache, v_cache = _batch([(12, 4), (7, 4)])
    batch.seq_lens_dev = torch.tensor([14, 9])  # two drafts of each request's last step were rejected
    backend = PagedCpuBackend(torch.float32)
    got = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), backend.build_metadata(batch, 4), 1.0)
    ref_backend = SdpaBackend(torch.float32)
    want = ref_backend.forward(
        q, k, v, k_cache.clone(), v_cache.clone(), ref_backend.build_metadata(batch, 4), 1.0
    )
    assert torch.allclose(got, want, atol=1e-5)


@needs_cc
def test_bad_indices_raise_and_out_of_range_lengths_are_clamped() -> None:
    kernel = paged_attention_kernel()
    assert kernel is not None
    tables = torch.zeros(2, 3, dtype=torch.int64)
    i64 = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    with pytest.raises(ValueError, match="query rows"):
        kernel.indices(tables, i64(4, 4), i64(0, 1), i64(0, 3), i64(1, 2), num_rows=4)
    with pytest.raises(ValueError, match="outside the tables"):
        kernel.indices(tables, i64(4, 4), i64(0, 2), i64(0, 1), i64(1, 1), num_rows=2)
    with pytest.raises(ValueError, match="int64"):
        kernel.indices(tables.int(), i64(4, 4), i64(0, 1), i64(0, 1), i64(1, 1), num_rows=2)
    # A length beyond the table's capacity (3 blocks x 4) and block ids beyond the cache are clamped.
    cache = torch.randn(2, 4, 1, 8)
    ix = kernel.indices(tables + 7, i64(10_000, 5), i64(0, 1), i64(0, 1), i64(1, 1), num_rows=2)
    q, out = torch.randn(2, 2, 8), torch.full((2, 2, 8), float("nan"))
    kernel(q, out, cache, cache.clone(), ix, 1.0)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="dtypes"):
        kernel(q.double(), out.double(), cache, cache, ix, 1.0)


def test_disabled_native_kernels_fall_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_NATIVE", "0")
    monkeypatch.setattr(native, "_loaded", {})
    backend = PagedCpuBackend(torch.float32)
    assert backend.kernel is None
    batch, q, k, v, k_cache, v_cache = _batch([(5, 1), (0, 9)])
    meta = backend.build_metadata(batch, 4)
    assert not isinstance(meta, PagedCpuMetadata)
    want_backend = SdpaBackend(torch.float32)
    want = want_backend.forward(
        q, k, v, k_cache.clone(), v_cache.clone(), want_backend.build_metadata(batch, 4), 0.5
    )
    assert torch.equal(backend.forward(q, k, v, k_cache, v_cache, meta, 0.5), want)


def test_kernel_rejects_a_mismatched_library() -> None:
    class Lib:
        @staticmethod
        def tandem_paged_attention_abi() -> int:
            return 99

    with pytest.raises(RuntimeError, match="ABI"):
        PagedAttentionKernel(Lib())  # type: ignore[arg-type]


@needs_cc
@pytest.mark.parametrize("window", [0, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_gives_the_same_bits_as_decode_verify_row_or_in_any_batch(dtype: torch.dtype, window: int) -> None:
    """Keys are cut into chunks at fixed positions (KEY_CHUNK), never by batch, query count or threads:
    the verify rows of a request (here straddling a chunk boundary, and past two chunks) equal the
    decodes of the same positions bit for bit, alone or beside other requests, at 1 or 2 threads. Under a
    window the verify runs chunks its later rows see nothing of, and a decode alone skips them: same bits."""
    kernel = paged_attention_kernel()
    assert kernel is not None
    gen = torch.Generator().manual_seed(5)
    bs, kvh, heads, hd = 16, 3, 9, 64
    cache_k = torch.randn(40, bs, kvh, hd, generator=gen).to(dtype)
    cache_v = torch.randn(40, bs, kvh, hd, generator=gen).to(dtype)
    table = torch.randperm(40, generator=gen)[:12].view(1, -1).contiguous()
    i64 = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731

    def attend(q: torch.Tensor, lens: list[int], q_lens: list[int], tables: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        starts = [sum(q_lens[:i]) for i in range(len(q_lens))]
        ix = kernel.indices(tables, i64(*lens), i64(*range(len(lens))), i64(*starts), i64(*q_lens), q.shape[0],
                            window)
        kernel(q, out, cache_k, cache_v, ix, hd**-0.5)
        return out

    # rows at keys 63..66 (a chunk boundary); 132..135 (under the window, row 0 still sees key 62 of the first
    # chunk, rows 2 and 3 see none of it); 151..154 (a third chunk)
    for context in (62, 131, 150):
        q = torch.randn(4, heads, hd, generator=gen).to(dtype)
        verify = attend(q, [context + 4], [4], table)
        other = torch.randn(1, heads, hd, generator=gen).to(dtype)
        two_tables = torch.cat([table.flip(1), table]).contiguous()
        prev = torch.get_num_threads()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            try:
                for j in range(4):
                    alone = attend(q[j : j + 1].contiguous(), [context + j + 1], [1], table)
                    batched = attend(torch.cat([other, q[j : j + 1]]), [100, context + j + 1], [1, 1], two_tables)
                    assert torch.equal(alone[0], verify[j]), (context, j, threads)
                    assert torch.equal(batched[1], verify[j]), (context, j, threads)
            finally:
                torch.set_num_threads(prev)


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batch_of_many_chunks_gives_each_request_its_bits_alone(isa: str, dtype: torch.dtype) -> None:
    """With chunks enough for every thread, a task takes all KV heads of a chunk (its keys read once, in
    address order); alone, a short request's task takes one head. Which task computes a head changes no
    bits: every request of a wide batch equals itself attended alone, decodes and verify rows alike."""
    lib = native.load("paged_attention", isa)
    assert lib is not None
    kernel = PagedAttentionKernel(lib)
    gen = torch.Generator().manual_seed(11)
    bs, kvh, heads, hd = 16, 3, 9, 64
    cache_k = torch.randn(120, bs, kvh, hd, generator=gen).to(dtype)
    cache_v = torch.randn(120, bs, kvh, hd, generator=gen).to(dtype)
    i64 = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    lens, q_lens = [300, 45, 129, 200, 66, 250], [1, 1, 4, 1, 3, 1]
    tables = torch.randperm(120, generator=gen)[: 6 * 19].view(6, 19).contiguous()
    q = torch.randn(sum(q_lens), heads, hd, generator=gen).to(dtype)
    starts = [sum(q_lens[:i]) for i in range(6)]

    def attend(qr: torch.Tensor, reqs: list[int]) -> torch.Tensor:
        out = torch.empty_like(qr)
        ql = [q_lens[r] for r in reqs]
        ix = kernel.indices(tables, i64(*lens), i64(*reqs), i64(*[sum(ql[:i]) for i in range(len(reqs))]),
                            i64(*ql), qr.shape[0], 0)
        kernel(qr, out, cache_k, cache_v, ix, hd**-0.5)
        return out

    prev = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            wide = attend(q, list(range(6)))
            for r in range(6):
                rows = slice(starts[r], starts[r] + q_lens[r])
                alone = attend(q[rows].contiguous(), [r])
                assert torch.equal(alone, wide[rows]), (isa, threads, r)
    finally:
        torch.set_num_threads(prev)


@needs_cc
def test_host_list_indices_are_checked_like_tensors() -> None:
    """The batch layout as host lists (the backend's usual call) gets the same checks, in Python."""
    kernel = paged_attention_kernel()
    assert kernel is not None
    tables = torch.zeros(2, 3, dtype=torch.int64)
    lens = torch.tensor([4, 4])
    with pytest.raises(ValueError, match="query rows"):
        kernel.indices(tables, lens, [0, 1], [0, 3], [1, 2], num_rows=4)
    with pytest.raises(ValueError, match="outside the tables"):
        kernel.indices(tables, lens, [0, 2], [0, 1], [1, 1], num_rows=2)
    with pytest.raises(ValueError, match="differ in length"):
        kernel.indices(tables, lens, [0, 1], [0], [1, 1], num_rows=2)
    ix = kernel.indices(tables, lens, [0, 1], [0, 1], [1, 1], num_rows=2)
    assert ix.req.dtype == torch.int64 and ix.q_len.tolist() == [1, 1] and ix.num_reqs == 2


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("head_dim", [64, 80, 256])
def test_every_isa_variant_matches_dense_reference_with_and_without_a_window(isa: str, head_dim: int) -> None:
    """The portable, AVX2 and (where the CPU has it) AVX-512 builds of the kernel, each checked, so a machine
    of any kind tests the variant another kind runs."""
    lib = native.load("paged_attention", isa)
    assert lib is not None
    layout = [(200, 1), (37, 4), (130, 1), (16, 17), (0, 1), (70, 3)]
    for window in (0, 70):
        backend = PagedCpuBackend(torch.float32, short_query_max=17, kernel=PagedAttentionKernel(lib))
        out, want = run_case(backend, layout, 8, 2, 16, torch.float32, seed=4, head_dim=head_dim, window=window)
        assert (out.double() - want).abs().max().item() < 1e-5, (isa, head_dim, window)


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("head_dim", [64, 80])
def test_tree_steps_match_the_naive_reference_on_every_isa_variant(isa: str, head_dim: int) -> None:
    """Tree masks (ForwardBatch.tree_masks) in every build of the kernel: trees after long contexts (several
    key chunks), one whose rows straddle a chunk boundary (keys 61..69), beside a plain decode."""
    from tandem.model.attention import NaiveBackend

    lib = native.load("paged_attention", isa)
    assert lib is not None
    gen = torch.Generator().manual_seed(5)
    block_size, kv_heads, heads = 8, 2, 6
    layout = [(130, [0, 0, 1, 1, 2, 4]), (61, [0, 1, 0, 3, 3, 5, 2, 7]), (20, None)]
    paged, next_block = [], 0
    for cached, parents in layout:
        rows = 1 if parents is None else len(parents) + 1
        nb = -(-(cached + rows) // block_size)
        paged.append(PagedRequest(list(range(rows)), cached, list(range(next_block, next_block + nb))[::-1],
                                  parents=parents))
        next_block += nb
    batch = build_forward_batch(paged, block_size)
    shape = (next_block + 1, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    t = batch.num_tokens
    q = torch.randn(t, heads, head_dim, generator=gen)
    k, v = torch.randn(t, kv_heads, head_dim, generator=gen), torch.randn(t, kv_heads, head_dim, generator=gen)
    outs = []
    for backend in (PagedCpuBackend(torch.float32, kernel=PagedAttentionKernel(lib)), NaiveBackend()):
        kc, vc = k_cache.clone(), v_cache.clone()
        meta = backend.build_metadata(batch, block_size)
        outs.append(backend.forward(q, k, v, kc, vc, meta, head_dim**-0.5))
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5, (isa, head_dim)


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tree_row_gives_the_same_bits_as_a_decode_of_its_branch(isa: str, dtype: torch.dtype) -> None:
    """A tree row's keys are its ancestors, at later key indices than their positions; the kernel cuts its
    chunks by position and runs its visible scores through a decode's code, so each row — off the first child
    at several depths, trees straddling a chunk boundary by index or by position, after several chunks —
    equals bit for bit a decode at its position over its branch written in sequence (greedy speculation with
    trees is then exactly no speculation)."""
    from tandem.worker.tree_step import tree_bits

    kernel = PagedAttentionKernel(native.load("paged_attention", isa))
    gen = torch.Generator().manual_seed(7)
    bs, kvh, heads, hd, blocks = 16, 3, 9, 64, 64
    cache_k = torch.randn(blocks, bs, kvh, hd, generator=gen).to(dtype)
    cache_v = torch.randn(blocks, bs, kvh, hd, generator=gen).to(dtype)
    perm = torch.randperm(blocks, generator=gen)
    tree_table, branch_table = perm[:24].view(1, -1).contiguous(), perm[24:48].view(1, -1).contiguous()
    # nodes numbered by depth (tandem's trees): parent of node j (0: the root); depths 1 1 2 2 2 3 3 4 4 5 5 6
    parents = [0, 0, 2, 1, 2, 3, 5, 7, 6, 9, 8, 11]
    depths = [1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    bits = tree_bits(torch.tensor([parents]), torch.tensor([depths]))[0]
    rows = len(parents) + 1
    i64 = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731

    def slot(table: torch.Tensor, pos: int) -> tuple[int, int]:
        return int(table[0, pos // bs]), pos % bs

    # roots at 60 (rows straddle key 64 by index and by position), 121 (by index only), 250 (several chunks)
    for ctx in (60, 121, 250):
        q = torch.randn(rows, heads, hd, generator=gen).to(dtype)
        out = torch.empty_like(q)
        ix = kernel.indices(tree_table, i64(ctx + rows), [0], [0], [rows], rows, tree_masks=bits.clone())
        kernel(q, out, cache_k, cache_v, ix, hd**-0.5)
        for pos in range(ctx):  # the branch's cache: the same context, then the branch in sequence
            cache_k[slot(branch_table, pos)] = cache_k[slot(tree_table, pos)]
            cache_v[slot(branch_table, pos)] = cache_v[slot(tree_table, pos)]
        for j in range(rows):
            branch, node = [], j
            while node:
                branch.append(node)
                node = parents[node - 1]
            for depth, node in enumerate([0, *reversed(branch)]):
                cache_k[slot(branch_table, ctx + depth)] = cache_k[slot(tree_table, ctx + node)]
                cache_v[slot(branch_table, ctx + depth)] = cache_v[slot(tree_table, ctx + node)]
            decode = torch.empty_like(q[:1])
            dx = kernel.indices(branch_table, i64(ctx + len(branch) + 1), [0], [0], [1], 1)
            kernel(q[j : j + 1].contiguous(), decode, cache_k, cache_v, dx, hd**-0.5)
            assert torch.equal(decode[0], out[j]), (isa, ctx, j)
