/* Paged attention for short queries (decodes, speculative verify rows) on the CPU.
 *
 * Reads K and V straight from the paged cache through each request's block table: no gathered copy of the
 * context, no padding to the batch's longest sequence, one call per layer for every short query in the
 * batch. One task is (request, chunk of keys, KV heads): for each of its KV heads, the G = heads / kv_heads
 * query heads times q_len query rows are scored against each key row of the chunk. Where the batch has a
 * chunk for every thread a task takes every KV head of its chunk, asking for the chunk's keys (all heads:
 * adjacent in the cache) towards L2 in address order first; one head each otherwise. At
 * four requests of 300 keys this read the cache at ~16 GB/s against ~12 with a head a task (a head's third
 * of each key, 768 bytes apart, which the hardware prefetchers follow late). Keys are cut into chunks of
 * KEY_CHUNK at fixed positions (0, KEY_CHUNK, 2 * KEY_CHUNK, ...); a request with more than one chunk has its
 * chunks' partial results (unnormalised sums, the running max and the softmax denominator) merged after all
 * tasks ran. Which task computes a head changes no bits.
 *
 * Semantics (the same as the torch backends, tandem/model/attention/base.py): query j of a request with
 * q_len queries and seq_len keys sits at position seq_len - q_len + j and sees keys 0 .. that position; with
 * a sliding window w > 0 only keys position - w + 1 .. position; in a tree step (tree_masks) a query sees,
 * of the 64 keys up to its own, those whose bits its mask sets (bit b: the key b before its own; its
 * ancestors, itself and the context), and every key before them; its chunks are cut at its keys' positions
 * (tree_chunk_start), so a tree row's result is the same bits as a decode of its branch. Chunks wholly before query 0's window are
 * not run at all (a decode at any length reads at most ceil(w / KEY_CHUNK) + 1 chunks), and a chunk a query
 * sees nothing of adds nothing to its merge, so the bits stay those of the query attended alone.
 * Scores, softmax and the weighted sum accumulate in float32 for both storage dtypes; a bf16 result is
 * rounded to nearest-even once at the end. The chunk boundaries depend on key positions only — not on the
 * batch, the query count or the thread count — so a query's result is the same bits whether it is a
 * decode, a verify row or part of any batch.
 *
 * Three implementations of a task (paged_attention_task.h): portable C for any head size; an AVX-512 one
 * for head sizes 64 and 128 (scores of 16 keys reduced together, accumulators in registers, rows prefetched
 * 16 keys ahead); an AVX2 one for head sizes that are multiples of 8 up to 256 (scores of 8 keys reduced
 * together, value accumulators in L1), for CPUs without AVX-512 and the head sizes the AVX-512 task does not
 * cover. This file schedules the tasks and merges the chunks.
 *
 * Memory safety: every index read from the tables is clamped to the tensors' bounds (a malformed table
 * can give a wrong answer, never an out-of-bounds read); the Python wrapper checks the query rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define TANDEM_PAGED_ATTENTION_ABI 4
#include "paged_attention_task.h"

int tandem_paged_attention_abi(void) { return TANDEM_PAGED_ATTENTION_ABI; }

/* Key positions in a tree step. A tree row's keys are its ancestors, which sit at later key indices than
 * their positions (a node at depth d of a tree fed at index ctx is at position ctx + d, index ctx + j >= ctx + d),
 * so chunks are cut by position: the chunk of positions [B, B + KEY_CHUNK) holds the context keys of those
 * positions and the tree rows whose depth puts them there. Row j's depth is the count of the request's rows
 * it sees (bits 0 .. j) minus itself, kept at most one past the row before's and never behind it: rows
 * numbered by depth (tandem's trees, tandem/worker/tree_step.py) get their depths exactly, so each chunk is a
 * run of consecutive key indices and a row sees in each chunk exactly the keys a decode at its position sees
 * there, in the same order, with the same bits out. ``bits``: the request's ``ql`` <= 64 rows' masks. */
static int64_t tree_depth(const int64_t *bits, int64_t j, int64_t before) {
    const int64_t d = __builtin_popcountll((uint64_t)bits[j] & ((2ULL << j) - 1)) - 1;
    return d < before ? before : (d > before + 1 ? before + 1 : d);
}

/* The first key index of the chunk starting at position b: ``ctx`` keys of context, then ``ql`` tree rows. */
static int64_t tree_chunk_start(const int64_t *bits, int64_t ctx, int64_t ql, int64_t b) {
    if (b <= ctx) return b;
    int64_t d = 0;
    for (int64_t j = 0; j < ql; j++) {
        d = tree_depth(bits, j, d);
        if (ctx + d >= b) return ctx + j;
    }
    return ctx + ql;
}

/* The key count of a tree step's request by position (context + its deepest row + 1). */
static int64_t tree_positions(const int64_t *bits, int64_t ctx, int64_t ql) {
    int64_t d = 0;
    for (int64_t j = 0; j < ql; j++) d = tree_depth(bits, j, d);
    return ctx + d + 1;
}

/* Which task head_dim takes in this build (for tests and diagnostics): 2 the AVX-512 one, 1 the AVX2 one,
 * 0 the portable one. */
int tandem_paged_attention_fast_path(int64_t head_dim) {
    if (HAVE_AVX512_TASKS && (head_dim == 64 || head_dim == 128)) return 2;
    if (HAVE_AVX2_TASK && head_dim % 8 == 0 && head_dim <= 256) return 1;
    return 0;
}

/* q: [.., q_row_stride] rows; head h of row t starts at q + t * q_row_stride + h * head_dim.
 * out: same addressing with out_row_stride. k_cache / v_cache: [num_blocks, block_size, kv_heads, head_dim].
 * For group request r: batch row req[r] of block_tables ([*, bt_stride]) and seq_lens, query rows
 * q_start[r] .. q_start[r] + q_len[r]. tree_masks: NULL, or [query rows] each row's visible keys among the 64
 * up to its own as bits (a tree step: bit b, the key b before the row's own). window: 0, or the sliding window. Returns 0, or -1 when scratch memory
 * could not be allocated. */
int tandem_paged_attention(
    int is_bf16, const void *q, int64_t q_row_stride, void *out, int64_t out_row_stride,
    const void *k_cache, const void *v_cache, int64_t num_blocks, int64_t block_size,
    const int64_t *block_tables, int64_t bt_stride, const int64_t *seq_lens,
    const int64_t *req, const int64_t *q_start, const int64_t *q_len, int64_t num_reqs,
    int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, int64_t window, const int64_t *tree_masks,
    int num_threads) {
    const Problem pb = {is_bf16, q, k_cache, v_cache, out, q_row_stride, out_row_stride,
                        head_dim, heads / kv_heads, scale};
    const int64_t max_keys = bt_stride * block_size, group = pb.group, stride = head_dim + 2;
    const int fast = tandem_paged_attention_fast_path(head_dim);
    /* Per request: its keys, chunks run, first task, the offset of its partial results (split ones only) and
     * its first chunk (past 0 only under a window). */
    int64_t *plan = malloc((size_t)(6 * num_reqs + 1) * sizeof(int64_t));
    if (!plan) return -1;
    int64_t *lens = plan, *nchunks = lens + num_reqs, *poff = nchunks + num_reqs, *chunk0 = poff + num_reqs;
    int64_t *tree_req = chunk0 + num_reqs, *first = tree_req + num_reqs;
    int64_t tasks = 0, partial_floats = 0;
    /* A task takes KV heads_per_task heads of a chunk: all of them where there is a chunk for every thread
     * (the chunk's keys are then read once, in address order: each key's heads are adjacent in the cache),
     * one each otherwise (a short decode: its heads keep the threads busy). Which task computes a head
     * changes no bits. */
    int64_t all_chunks = 0;
    for (int64_t r = 0; r < num_reqs; r++) all_chunks += seq_lens[req[r]] / KEY_CHUNK + 1;
    const int64_t heads_per_task = all_chunks >= (int64_t)num_threads ? kv_heads : 1;
    const int64_t head_tasks = kv_heads / heads_per_task;
    for (int64_t r = 0; r < num_reqs; r++) {
        lens[r] = clamp64(seq_lens[req[r]], 0, max_keys);
        const int64_t start = window > 0 ? lens[r] - q_len[r] - window + 1 : 0; /* query 0's first key */
        /* a tree step's request (never under a window): chunks by position, see tree_chunk_start */
        tree_req[r] = tree_masks && !window && q_len[r] <= 64 && q_len[r] > 0 && lens[r] >= q_len[r];
        const int64_t keys = tree_req[r] ? tree_positions(tree_masks + q_start[r], lens[r] - q_len[r], q_len[r])
                                         : lens[r];
        chunk0[r] = start > 0 ? start / KEY_CHUNK : 0;
        nchunks[r] = (keys > KEY_CHUNK ? (keys + KEY_CHUNK - 1) / KEY_CHUNK : 1) - chunk0[r];
        if (nchunks[r] < 1) nchunks[r] = 1, chunk0[r] = 0; /* malformed lengths: one chunk, as without */
        first[r] = tasks;
        tasks += head_tasks * nchunks[r];
        poff[r] = partial_floats;
        if (nchunks[r] > 1) partial_floats += kv_heads * nchunks[r] * q_len[r] * group * stride;
    }
    first[num_reqs] = tasks;
    float *partial = partial_floats ? malloc((size_t)partial_floats * sizeof(float)) : NULL;
    if (partial_floats && !partial) {
        free(plan);
        return -1;
    }
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t r = 0, hi = num_reqs; /* the request: first[r] <= task < first[r + 1] */
            while (hi - r > 1) {
                const int64_t mid = (r + hi) / 2;
                if (first[mid] <= task) r = mid; else hi = mid;
            }
            const int64_t local = task - first[r], nch = nchunks[r], row = req[r];
            const int64_t kvh0 = (local / nch) * heads_per_task, c = local % nch;
            int64_t k0 = (chunk0[r] + c) * KEY_CHUNK, k1 = c + 1 < nch ? k0 + KEY_CHUNK : lens[r]; /* one: all */
            if (tree_req[r]) {
                const int64_t *bits = tree_masks + q_start[r], ctx = lens[r] - q_len[r];
                k0 = tree_chunk_start(bits, ctx, q_len[r], k0);
                if (c + 1 < nch) k1 = tree_chunk_start(bits, ctx, q_len[r], k1);
            }
            const int64_t len = k1 - k0;
            const int64_t lo0 = window > 0 ? lens[r] - q_len[r] - window + 1 - k0 : INT64_MIN / 4;
            Task t = {kvh0, q_start[r], q_len[r], len, (len + 15) / 16 * 16, lens[r] - q_len[r] - k0,
                      lo0, 0, 0, 0, 0, 0, 0, 0};
            if (tree_masks) t.tree = tree_masks + q_start[r];
            const int64_t nq = t.ql * group;
            const size_t floats = (size_t)(nq * head_dim * 2 + head_dim + 2 * nq + nq * t.len16);
            char *scratch = malloc(floats * sizeof(float) + (size_t)len * sizeof(int64_t));
            if (!scratch) {
                failed = 1;
                continue;
            }
            int64_t *rows = (int64_t *)scratch;
            t.rows = rows;
            t.qf = (float *)(scratch + (size_t)len * sizeof(int64_t));
            float *acc = t.qf + nq * head_dim, *row_buf = acc + nq * head_dim;
            t.mx = row_buf + head_dim;
            t.sum = t.mx + nq;
            t.p = t.sum + nq;
            const int64_t *table = block_tables + row * bt_stride;
            const int64_t elem_bytes = is_bf16 ? 2 : 4, key_bytes = kv_heads * head_dim * elem_bytes;
            for (int64_t j = 0; j < len; j++) {
                const int64_t pos = k0 + j, block = clamp64(table[pos / block_size], 0, num_blocks - 1);
                rows[j] = ((block * block_size + pos % block_size) * kv_heads + kvh0) * head_dim;
                if (heads_per_task > 1) /* every head of the key, in address order, towards L2 */
                    for (int64_t off = 0; off < key_bytes; off += 64) {
                        __builtin_prefetch((const char *)k_cache + rows[j] * elem_bytes + off, 0, 2);
                        __builtin_prefetch((const char *)v_cache + rows[j] * elem_bytes + off, 0, 2);
                    }
            }
            for (int64_t h = 0; h < heads_per_task; h++) {
                if (h > 0)
                    for (int64_t j = 0; j < len; j++) rows[j] += head_dim;
                t.kvh = kvh0 + h;
                if (nch > 1) t.partial = partial + poff[r] + (t.kvh * nch + c) * nq * stride;
                for (int64_t i = 0; i < nq; i++) { /* pre-scaled float32 queries */
                    float *qi = t.qf + i * head_dim;
                    load_row(q, query_elem(&pb, &t, i, q_row_stride), head_dim, is_bf16, qi);
                    for (int64_t d = 0; d < head_dim; d++) qi[d] *= scale;
                }
#if HAVE_AVX512_TASKS
                if (fast == 2 && head_dim == 64)
                    task_avx512_4(&pb, &t, nq);
                else if (fast == 2 && head_dim == 128)
                    task_avx512_8(&pb, &t, nq);
                else
#endif
#if HAVE_AVX2_TASK
                if (fast == 1)
                    task_avx2(&pb, &t, nq, acc);
                else
#endif
                    task_generic(&pb, &t, nq, row_buf, acc);
            }
            free(scratch);
        }
        /* (the implicit barrier of the loop above: every chunk is done) */
        if (partial) { /* the same branch in every thread (the loop inside is a worksharing one) */
            float *acc = malloc((size_t)head_dim * sizeof(float));
            if (!acc) failed = 1;
#pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < num_reqs * kv_heads; pair++) {
                const int64_t r = pair / kv_heads, kvh = pair % kv_heads, nch = nchunks[r];
                if (nch == 1 || !acc) continue;
                const Task t = {kvh, q_start[r], q_len[r], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
                const int64_t nq = q_len[r] * group;
                const float *base = partial + poff[r] + kvh * nch * nq * stride;
                for (int64_t i = 0; i < nq; i++)
                    merge_chunks(&pb, &t, i, base + i * stride, nch, nq * stride, acc);
            }
            free(acc);
        }
    }
    (void)fast;
    free(partial);
    free(plan);
    return failed ? -1 : 0;
}
