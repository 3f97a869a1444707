/* One task of the paged-attention kernel (paged_attention.c, which schedules them): a request's chunk of
 * keys for one KV head — its query rows scored against the chunk's key rows, the softmax numerators and
 * the weighted sum of values, written out or kept as a partial result for the merge. Three
 * implementations: portable C for any head size; AVX-512 for head sizes 64 and 128; AVX2 for multiples of
 * 8 up to 256 (paged_attention.c's comment says what each computes and why the bits agree). */
#ifndef TANDEM_PAGED_ATTENTION_TASK_H
#define TANDEM_PAGED_ATTENTION_TASK_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

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
#endif
