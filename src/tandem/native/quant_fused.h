/* The AVX-512 products of Q4_0, Q4_1 and Q8_0 rows straight from their blocks (quant.h uses them). */
#ifndef TANDEM_QUANT_FUSED_H
#define TANDEM_QUANT_FUSED_H
#include "quant_blocks.h"

/* ---- AVX-512: 32-weight types without a buffer ---------------------------------------------------------
 * Q4_0, Q4_1 and Q8_0 rows are multiplied straight from their blocks: each block's 16 (or 2 x 16) bytes are
 * broadcast to the four 128-bit lanes of a zmm register and every 32-bit lane shifts out its own byte (or
 * nibble) with a per-lane shift — no cross-lane shuffles, which would all queue on one port — so lane i
 * holds element 4 * (i % 4) + i / 4 of its 16; x is permuted to match once per call (x_perm). The block's
 * scale multiplies the block's partial sum, and Q4_1's offset m enters as m * sum(x over the block)
 * (block sums computed once per call). Each output still sums in a fixed order (blocks in sequence, lanes
 * reduced at the end), whatever the row count. */
#if defined(__AVX512F__)
#define Q_FUSED 1
static inline int q_fused_type(int64_t type) { return type == GT_Q4_0 || type == GT_Q4_1 || type == GT_Q8_0; }

/* xp[r][b * 32 + h * 16 + i] = x[r][b * 32 + h * 16 + 4 * (i % 4) + i / 4]; xs[r][b] = sum of block b. */
static void x_perm(const float *x, int64_t rows, int64_t in, float *xp, float *xs) {
    const int64_t nb = in / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *src = x + r * in + b * 32;
            float *dst = xp + r * in + b * 32, sum = 0.0f;
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 16; i++) dst[h * 16 + i] = src[h * 16 + 4 * (i % 4) + i / 4];
            for (int i = 0; i < 32; i++) sum += src[i];
            xs[r * nb + b] = sum;
        }
}

#define FUSED_ROWS 8
/* The q0 / q1 halves (elements in x_perm's order) and the scale d and offset m of one block. */
static inline void q_fused_block(int64_t type, const uint8_t *blk, __m512 *q0, __m512 *q1, float *d, float *m) {
    const __m512i lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i sh = _mm512_slli_epi32(lane, 3), m4 = _mm512_set1_epi32(15);
    *d = q_f16(blk);
    if (type == GT_Q8_0) {
        const __m512i up = _mm512_sub_epi32(_mm512_set1_epi32(24), sh);
        const __m512i v0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 2)));
        const __m512i v1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 18)));
        *q0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(v0, up), 24));
        *q1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(v1, up), 24));
        *m = 0.0f;
    } else {
        const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + (type == GT_Q4_1 ? 4 : 2))));
        *q0 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, sh), m4));
        *q1 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(_mm512_srli_epi32(v, 4), sh), m4));
        *m = type == GT_Q4_1 ? q_f16(blk + 2) : -8.0f * *d; /* Q4_0: d * (q - 8) */
    }
}

static inline int64_t q_fused_bytes(int64_t type) { return type == GT_Q8_0 ? 34 : (type == GT_Q4_1 ? 20 : 18); }

/* out[r * NJ + j] = row_j . x[r] for r < R rows and j < NJ consecutive rows of W (stride rb), one instance per
 * (R, NJ) so the R x NJ accumulators stay in registers; several outputs in flight hide the FMA latency of each
 * output's chain over its blocks. */
#define DEFINE_FUSED(R, NJ)                                                                               \
    static void q_fused_##R##x##NJ(int64_t type, const uint8_t *row, int64_t rb, int64_t nb, const float *xp, \
                                   const float *xs, int64_t in, float *out) {                            \
        __m512 acc[R * NJ];                                                                               \
        float macc[R * NJ];                                                                               \
        for (int k = 0; k < R * NJ; k++) {                                                                \
            acc[k] = _mm512_setzero_ps();                                                                 \
            macc[k] = 0.0f;                                                                               \
        }                                                                                                 \
        const int64_t bytes = q_fused_bytes(type);                                                        \
        for (int64_t b = 0; b < nb; b++) {                                                                \
            for (int j = 0; j < NJ; j++) {                                                                \
                __m512 q0, q1;                                                                            \
                float d, m;                                                                               \
                q_fused_block(type, row + j * rb + b * bytes, &q0, &q1, &d, &m);                          \
                const __m512 dv = _mm512_set1_ps(d);                                                      \
                for (int r = 0; r < R; r++) {                                                             \
                    const float *xr = xp + r * in + b * 32;                                               \
                    const __m512 part =                                                                   \
                        _mm512_fmadd_ps(_mm512_loadu_ps(xr), q0, _mm512_mul_ps(_mm512_loadu_ps(xr + 16), q1)); \
                    acc[r * NJ + j] = _mm512_fmadd_ps(dv, part, acc[r * NJ + j]);                         \
                    macc[r * NJ + j] += m * xs[r * nb + b];                                               \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int k = 0; k < R * NJ; k++) out[k] = _mm512_reduce_add_ps(acc[k]) + macc[k];                \
    }
DEFINE_FUSED(1, 4)
DEFINE_FUSED(2, 4)
DEFINE_FUSED(3, 2)
DEFINE_FUSED(4, 2)
DEFINE_FUSED(1, 1)
DEFINE_FUSED(2, 1)
DEFINE_FUSED(3, 1)
DEFINE_FUSED(4, 1)
DEFINE_FUSED(5, 1)
DEFINE_FUSED(6, 1)
DEFINE_FUSED(7, 1)
DEFINE_FUSED(8, 1)

/* R rows of x against nj rows of W: the (R, 4) / (R, 2) instances for a whole tile, else one output at a
 * time. */
static void q_fused_rows(int64_t type, const uint8_t *row, int64_t rb, int nj, int64_t nb, const float *xp,
                         const float *xs, int64_t in, int64_t rows, float *out) {
    if (nj == 4 && rows <= 2) {
        (rows == 1 ? q_fused_1x4 : q_fused_2x4)(type, row, rb, nb, xp, xs, in, out);
        return;
    }
    if (nj == 2 && (rows == 3 || rows == 4)) {
        (rows == 3 ? q_fused_3x2 : q_fused_4x2)(type, row, rb, nb, xp, xs, in, out);
        return;
    }
    static void (*const one[FUSED_ROWS])(int64_t, const uint8_t *, int64_t, int64_t, const float *, const float *,
                                         int64_t, float *) = {q_fused_1x1, q_fused_2x1, q_fused_3x1, q_fused_4x1,
                                                              q_fused_5x1, q_fused_6x1, q_fused_7x1, q_fused_8x1};
    float res[FUSED_ROWS];
    for (int j = 0; j < nj; j++) {
        one[rows - 1](type, row + j * rb, rb, nb, xp, xs, in, res);
        for (int64_t r = 0; r < rows; r++) out[r * nj + j] = res[r];
    }
}

/* One part of q_gemv on the fused path. Returns 0 or -2. */
static int q_gemv_fused(int64_t type, int64_t prow, int64_t rb, const uint8_t *data, const float *x, int64_t rows,
                        int64_t in, float *yp, int64_t ldy, int num_threads) {
    const int64_t nb = in / 32;
    float *xp = malloc((size_t)(rows * in + rows * nb) * sizeof(float));
    if (!xp) return -2;
    float *xs = xp + rows * in;
    x_perm(x, rows, in, xp, xs);
    /* 1-2 rows: tiles of 4 outputs, 3-4 rows: of 2; more rows: one output at a time, 8 rows in flight */
    const int ot = rows <= 2 ? 4 : (rows <= 4 ? 2 : 1);
    const int64_t group = FUSED_ROWS / ot, tiles = (prow + ot - 1) / ot;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        float res[FUSED_ROWS];
        const int64_t o = t * ot;
        const int nj = (int)(prow - o < ot ? prow - o : ot);
        for (int64_t r0 = 0; r0 < rows; r0 += group) {
            const int64_t n = rows - r0 < group ? rows - r0 : group;
            q_fused_rows(type, data + o * rb, rb, nj, nb, xp + r0 * in, xs + r0 * nb, in, n, res);
            for (int64_t r = 0; r < n; r++)
                for (int j = 0; j < nj; j++) yp[(r0 + r) * ldy + o + j] = res[r * nj + j];
        }
    }
    free(xp);
    return 0;
}
#else
#define Q_FUSED 0
static inline int q_fused_type(int64_t type) { (void)type; return 0; }
static int q_gemv_fused(int64_t type, int64_t prow, int64_t rb, const uint8_t *data, const float *x, int64_t rows,
                        int64_t in, float *yp, int64_t ldy, int num_threads) {
    (void)type, (void)prow, (void)rb, (void)data, (void)x, (void)rows, (void)in, (void)yp, (void)ldy, (void)num_threads;
    return -3;
}
#endif

#endif
