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
 * Three implementations of a task: portable C for any head size; an AVX-512 one for head sizes 64 and
 * 128 (scores of 16 keys reduced together, accumulators in registers, rows prefetched 16 keys ahead); an
 * AVX2 one for head sizes that are multiples of 8 up to 256 (scores of 8 keys reduced together, value
 * accumulators in L1), for CPUs without AVX-512 and the head sizes the AVX-512 task does not cover.
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
#define KEY_CHUNK 64 /* keys per task (a multiple of 16) */

typedef struct {
    int is_bf16;
    const void *q, *k_cache, *v_cache;
    void *out;
    int64_t q_row_stride, out_row_stride, head_dim, group;
    float scale;
} Problem;

typedef struct {
    int64_t kvh, q_start, ql, len, len16; /* the chunk's keys; len16: len rounded up to 16, p's row stride */
    int64_t vis0;                         /* keys of the chunk query row 0 sees, minus 1 (may be < 0) */
    int64_t lo0;                          /* the first key of the chunk query row 0 sees (window; may be < 0) */
    const int64_t *rows;                  /* element offset of this head's K/V row for each key of the chunk */
    float *qf, *p, *mx, *sum;             /* [nq, head_dim] scaled queries, [nq, len16] scores, [nq] x 2 */
    float *partial;                       /* NULL: write the output; else [nq, head_dim + 2] partial results */
    const int64_t *tree;                  /* NULL; or a tree step: query row j's visible last 64 keys as bits */
} Task;

static inline void load_row(const void *restrict base, int64_t elem, int64_t n, int is_bf16,
                            float *restrict dst) {
    if (is_bf16) {
        const uint16_t *restrict src = (const uint16_t *)base + elem;
        for (int64_t d = 0; d < n; d++) dst[d] = bf16_to_f32(src[d]);
    } else {
        memcpy(dst, (const float *)base + elem, (size_t)n * sizeof(float));
    }
}

/* Query i = j * group + g is head kvh * group + g of query row j. */
static inline int64_t query_elem(const Problem *pb, const Task *t, int64_t i, int64_t row_stride) {
    const int64_t j = i / pb->group, h = t->kvh * pb->group + i % pb->group;
    return (t->q_start + j) * row_stride + h * pb->head_dim;
}

/* Softmax numerators of pi[lo .. visible) (the rest of the row gets 0); the row's max and denominator. */
__attribute__((noinline)) /* one compiled body for decodes and tree rows: the same bits */
static void softmax_row(float *pi, int64_t lo, int64_t visible, int64_t len16, float *mx, float *den) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t pos = lo; pos < visible; pos++) m = pi[pos] > m ? pi[pos] : m;
    if (m == -INFINITY) { /* nothing of this chunk visible to the query */
        for (int64_t pos = 0; pos < len16; pos++) pi[pos] = 0.0f;
        *mx = m;
        *den = 0.0f;
        return;
    }
    for (int64_t pos = 0; pos < lo; pos++) pi[pos] = 0.0f;
    for (int64_t pos = lo; pos < visible; pos++) {
        pi[pos] = expf(pi[pos] - m);
        sum += pi[pos];
    }
    for (int64_t pos = visible; pos < len16; pos++) pi[pos] = 0.0f;
    *mx = m;
    *den = sum;
}

/* Softmax numerators of each query's scores over the chunk's keys it sees (query j of the request sees its
 * context + j + 1 keys, from its window's start); the rest get 0. Keeps each query's max and denominator for
 * the merge. A tree row's visible scores are first packed to the row's front in key order — exactly the
 * scores a decode at its position has in this chunk (its chunks are cut by position) — so the same code,
 * on the same values at the same places, gives the same bits; then they go back to their keys. */
static void softmax_rows(const Problem *pb, Task *t, int64_t nq) {
    for (int64_t i = 0; i < nq; i++) {
        const int64_t visible = clamp64(t->vis0 + i / pb->group + 1, 0, t->len);
        const int64_t lo = clamp64(t->lo0 + i / pb->group, 0, visible);
        float *pi = t->p + i * t->len16;
        if (!t->tree) {
            softmax_row(pi, lo, visible, t->len16, t->mx + i, t->sum + i);
            continue;
        }
        /* keys up to the query's own (chunk-relative; it may lie past this chunk): of its last 64, those its
         * bits set; every one before — those stay where they are (keys lo .. first), only the last 64 are
         * packed behind them. A row sees one key a position, so at most KEY_CHUNK here. */
        const uint64_t bits = (uint64_t)t->tree[i / pb->group];
        const int64_t own = t->vis0 + i / pb->group;
        const int64_t first = clamp64(own - 63, lo, visible);
        int64_t keep[KEY_CHUNK], n = 0;
        float w[KEY_CHUNK];
        for (int64_t pos = first; pos < visible && first - lo + n < KEY_CHUNK; pos++)
            if ((bits >> (own - pos)) & 1) keep[n] = pos, pi[first + n++] = pi[pos];
        softmax_row(pi, lo, first + n, t->len16, t->mx + i, t->sum + i);
        memcpy(w, pi + first, (size_t)n * sizeof(float));
        for (int64_t pos = first; pos < first + n; pos++) pi[pos] = 0.0f;
        for (int64_t k = 0; k < n; k++) pi[keep[k]] = w[k];
    }
}

static inline void write_out(const Problem *pb, const Task *t, int64_t i, const float *acc, float inv) {
    const int64_t base = query_elem(pb, t, i, pb->out_row_stride);
    if (pb->is_bf16) {
        uint16_t *o = (uint16_t *)pb->out + base;
        for (int64_t d = 0; d < pb->head_dim; d++) o[d] = f32_to_bf16(acc[d] * inv);
    } else {
        float *o = (float *)pb->out + base;
        for (int64_t d = 0; d < pb->head_dim; d++) o[d] = acc[d] * inv;
    }
}

/* Query i's weighted sum of values over the chunk: the output (one chunk), or a partial result. */
static inline void store_out(const Problem *pb, const Task *t, int64_t i, const float *acc) {
    const int64_t hd = pb->head_dim;
    if (t->partial) {
        float *dst = t->partial + i * (hd + 2);
        memcpy(dst, acc, (size_t)hd * sizeof(float));
        dst[hd] = t->mx[i];
        dst[hd + 1] = t->sum[i];
        return;
    }
    write_out(pb, t, i, acc, t->sum[i] > 0.0f ? 1.0f / t->sum[i] : 0.0f);
}

/* The output of query i from its request's nch chunk partials (chunk c at part + c * stride): each rescaled
 * by exp(max_c - max), summed, divided by the rescaled denominators' sum. */
static void merge_chunks(const Problem *pb, const Task *t, int64_t i, const float *part, int64_t nch,
                         int64_t stride, float *acc) {
    const int64_t hd = pb->head_dim;
    float m = -INFINITY, den = 0.0f;
    for (int64_t c = 0; c < nch; c++) m = part[c * stride + hd] > m ? part[c * stride + hd] : m;
    memset(acc, 0, (size_t)hd * sizeof(float));
    for (int64_t c = 0; c < nch; c++) {
        const float *pc = part + c * stride;
        if (pc[hd + 1] <= 0.0f) continue; /* no key of this chunk visible to the query */
        const float w = expf(pc[hd] - m);
        den += w * pc[hd + 1];
        for (int64_t d = 0; d < hd; d++) acc[d] += w * pc[d];
    }
    write_out(pb, t, i, acc, den > 0.0f ? 1.0f / den : 0.0f);
}

/* Portable task: any head size. ``row`` and ``acc`` are head_dim and nq * head_dim floats of scratch. */
static void task_generic(const Problem *pb, Task *t, int64_t nq, float *row, float *acc) {
    const int64_t hd = pb->head_dim;
    for (int64_t pos = 0; pos < t->len; pos++) {
        load_row(pb->k_cache, t->rows[pos], hd, pb->is_bf16, row);
        for (int64_t i = 0; i < nq; i++) {
            const float *qi = t->qf + i * hd;
            float s = 0.0f;
            for (int64_t d = 0; d < hd; d++) s += qi[d] * row[d];
            t->p[i * t->len16 + pos] = s;
        }
    }
    softmax_rows(pb, t, nq);
    memset(acc, 0, (size_t)(nq * hd) * sizeof(float));
    for (int64_t pos = 0; pos < t->len; pos++) {
        load_row(pb->v_cache, t->rows[pos], hd, pb->is_bf16, row);
        for (int64_t i = 0; i < nq; i++) {
            const float w = t->p[i * t->len16 + pos];
            float *ai = acc + i * hd;
            for (int64_t d = 0; d < hd; d++) ai[d] += w * row[d];
        }
    }
    for (int64_t i = 0; i < nq; i++) store_out(pb, t, i, acc + i * hd);
}

#if defined(__AVX512F__)
static inline __m512 load16(const void *base, int64_t elem, int is_bf16) {
    if (is_bf16) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + elem));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    return _mm512_loadu_ps((const float *)base + elem);
}

/* Blocks sit at random addresses, so the hardware prefetcher cannot run ahead across a block boundary. */
static inline void prefetch_row(const char *row, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
}

/* Lane sums of 16 vectors, x[k] holding key 4 * (k % 4) + k / 4: lane j of the result is key j's sum. */
static inline __m512 reduce16(const __m512 *x) {
    __m512 y[8], z[4], w[2];
    for (int k = 0; k < 8; k++)
        y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++)
        z[k] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * k], y[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(y[2 * k], y[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * k], z[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * k], z[2 * k + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

/* AVX-512 task for head_dim = 16 * NCH; queries are handled QG at a time with accumulators in registers. */
#define DEFINE_TASK_AVX512(NCH, QG)                                                                        \
    static void task_avx512_##NCH(const Problem *pb, Task *t, int64_t nq) {                                \
        const int bf = pb->is_bf16;                                                                        \
        const int64_t row_bytes = 16 * NCH * (bf ? 2 : 4);                                                 \
        for (int64_t i0 = 0; i0 < nq; i0 += QG) {                                                          \
            const int64_t qg = nq - i0 < QG ? nq - i0 : QG;                                                \
            for (int64_t c0 = 0; c0 < t->len; c0 += 16) {                                                  \
                __m512 part[QG][16];                                                                       \
                for (int64_t k = 0; k < 16; k++) {                                                         \
                    const int64_t pos = c0 + 4 * (k % 4) + k / 4;                                          \
                    if (pos >= t->len) {                                                                   \
                        for (int qi = 0; qi < QG; qi++) part[qi][k] = _mm512_setzero_ps();                 \
                        continue;                                                                          \
                    }                                                                                      \
                    if (i0 == 0 && pos + 16 < t->len)                                                      \
                        prefetch_row((const char *)pb->k_cache + t->rows[pos + 16] * (bf ? 2 : 4), row_bytes);  \
                    __m512 kv[NCH];                                                                        \
                    for (int c = 0; c < NCH; c++) kv[c] = load16(pb->k_cache, t->rows[pos] + 16 * c, bf); \
                    for (int qi = 0; qi < QG; qi++) {                                                      \
                        if (qi >= qg) break;                                                               \
                        const float *qv = t->qf + (i0 + qi) * 16 * NCH;                                    \
                        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qv), kv[0]);                              \
                        for (int c = 1; c < NCH; c++) s = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * c), kv[c], s); \
                        part[qi][k] = s;                                                                   \
                    }                                                                                      \
                }                                                                                          \
                for (int qi = 0; qi < QG && qi < qg; qi++)                                                 \
                    _mm512_storeu_ps(t->p + (i0 + qi) * t->len16 + c0, reduce16(part[qi]));               \
            }                                                                                              \
        }                                                                                                  \
        softmax_rows(pb, t, nq);                                                                           \
        for (int64_t i0 = 0; i0 < nq; i0 += QG) {                                                          \
            const int64_t qg = nq - i0 < QG ? nq - i0 : QG;                                                \
            __m512 acc[QG][NCH];                                                                           \
            for (int qi = 0; qi < QG; qi++)                                                                \
                for (int c = 0; c < NCH; c++) acc[qi][c] = _mm512_setzero_ps();                            \
            for (int64_t pos = 0; pos < t->len; pos++) {                                                   \
                if (i0 == 0 && pos + 16 < t->len)                                                          \
                    prefetch_row((const char *)pb->v_cache + t->rows[pos + 16] * (bf ? 2 : 4), row_bytes); \
                __m512 vv[NCH];                                                                            \
                for (int c = 0; c < NCH; c++) vv[c] = load16(pb->v_cache, t->rows[pos] + 16 * c, bf);     \
                for (int qi = 0; qi < QG; qi++) {                                                          \
                    if (qi >= qg) break;                                                                   \
                    const __m512 w = _mm512_set1_ps(t->p[(i0 + qi) * t->len16 + pos]);                     \
                    for (int c = 0; c < NCH; c++) acc[qi][c] = _mm512_fmadd_ps(w, vv[c], acc[qi][c]);      \
                }                                                                                          \
            }                                                                                              \
            for (int qi = 0; qi < QG && qi < qg; qi++) {                                                   \
                float tmp[16 * NCH];                                                                       \
                for (int c = 0; c < NCH; c++) _mm512_storeu_ps(tmp + 16 * c, acc[qi][c]);                  \
                store_out(pb, t, i0 + qi, tmp);                                                            \
            }                                                                                              \
        }                                                                                                  \
    }
DEFINE_TASK_AVX512(4, 4)
DEFINE_TASK_AVX512(8, 2)
#define HAVE_AVX512_TASKS 1
#else
#define HAVE_AVX512_TASKS 0
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Lane j of the result is the sum of the lanes of x[j]. */
static inline __m256 reduce8(const __m256 *x) {
    const __m256 b0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
    const __m256 b1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

static inline void prefetch_kv_row(const void *base, int64_t elem, int64_t bytes, int is_bf16) {
    const char *row = (const char *)base + elem * (is_bf16 ? 2 : 4);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
}

/* AVX2 task for head_dim = 8 * nch: ``acc`` is nq * head_dim floats of scratch. */
static void task_avx2(const Problem *pb, Task *t, int64_t nq, float *acc) {
    const int bf = pb->is_bf16;
    const int64_t hd = pb->head_dim, nch = hd / 8, row_bytes = hd * (bf ? 2 : 4);
    for (int64_t c0 = 0; c0 < t->len; c0 += 8) {
        const int64_t nk = t->len - c0 < 8 ? t->len - c0 : 8;
        for (int64_t k = 0; k < 8 && c0 + 8 + k < t->len; k++)
            prefetch_kv_row(pb->k_cache, t->rows[c0 + 8 + k], row_bytes, bf);
        for (int64_t i = 0; i < nq; i++) {
            const float *qv = t->qf + i * hd;
            __m256 part[8];
            for (int64_t k = 0; k < 8; k++) {
                if (k >= nk) {
                    part[k] = _mm256_setzero_ps();
                    continue;
                }
                const int64_t row = t->rows[c0 + k];
                __m256 s = _mm256_mul_ps(_mm256_loadu_ps(qv), load8(pb->k_cache, row, bf));
                for (int64_t c = 1; c < nch; c++)
                    s = _mm256_fmadd_ps(_mm256_loadu_ps(qv + 8 * c), load8(pb->k_cache, row + 8 * c, bf), s);
                part[k] = s;
            }
            /* c0 + 8 <= len rounded up to 8 <= len16: the store stays inside this query's scores. */
            _mm256_storeu_ps(t->p + i * t->len16 + c0, reduce8(part));
        }
    }
    softmax_rows(pb, t, nq);
    /* Weighted sum of values: the chunk's V rows (at most KEY_CHUNK of them, in L1 after the first query)
     * against each query's weights with its accumulators in registers, up to 64 dimensions at a time. */
    for (int64_t pos = 0; pos < t->len; pos++) prefetch_kv_row(pb->v_cache, t->rows[pos], row_bytes, bf);
    for (int64_t c0 = 0; c0 < nch; c0 += 8) {
        const int64_t nc = nch - c0 < 8 ? nch - c0 : 8;
        for (int64_t i = 0; i < nq; i++) {
            const float *pi = t->p + i * t->len16;
            __m256 a[8];
            for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
            for (int64_t pos = 0; pos < t->len; pos++) {
                const __m256 w = _mm256_set1_ps(pi[pos]);
                const int64_t row = t->rows[pos] + 8 * c0;
                for (int c = 0; c < 8; c++)
                    if (c < nc) a[c] = _mm256_fmadd_ps(w, load8(pb->v_cache, row + 8 * c, bf), a[c]);
            }
            for (int c = 0; c < 8; c++)
                if (c < nc) _mm256_storeu_ps(acc + i * hd + 8 * (c0 + c), a[c]);
        }
    }
    for (int64_t i = 0; i < nq; i++) store_out(pb, t, i, acc + i * hd);
}
#define HAVE_AVX2_TASK 1
#else
#define HAVE_AVX2_TASK 0
#endif

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
