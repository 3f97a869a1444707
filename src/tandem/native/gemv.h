/* Shared pieces of the native few-row matrix products (small_linear.c, decode_forward.c): bf16
 * conversion, and y = x @ W^T for 1..GEMV_MAX_ROWS float32 rows of x against a float32 or bf16 weight, with
 * every row's partial sums in registers while each weight tile streams from memory once.
 *
 * Semantics: products and sums accumulate in float32 in a fixed order per output (the same result
 * whatever the thread count). Included, not linked: every library gets its own static copy.
 */
#ifndef TANDEM_GEMV_H
#define TANDEM_GEMV_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__) && defined(__FMA__)
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

#define GEMV_MAX_ROWS 64 /* gemv_rows' limit */
#define PF_BYTES 4096    /* software prefetch distance along a weight stream (measured best, 2-16 KB) */

/* Weight dtypes of gemv_rows: float32, bf16, or int8 with one float32 scale per output feature
 * (w[o][i] = scale[o] * q[o][i]: a drafter's weights, speculative_config.draft_dtype "int8"). */
#define W_F32 0
#define W_BF16 1
#define W_INT8 2

static inline float load_weight(const void *w, int64_t i, int wdt) {
    return wdt == W_INT8 ? (float)((const int8_t *)w)[i] : load_elem(w, i, wdt == W_BF16);
}

/* acc[r * ot + j] = sum_i x[r][i] * w[o + j][i] for the tile's nj <= ot features (ot: the tile width);
 * int8: the sum over the quantized values (the caller applies the scale). */
static void tile_portable(const float *xf, int64_t rows, int64_t in, const void *w, int64_t o,
                          int64_t nj, int64_t ot, int wdt, float *acc) {
    for (int64_t j = 0; j < nj; j++) {
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xf + r * in;
            float s = 0.0f;
            for (int64_t i = 0; i < in; i++) s += xr[i] * load_weight(w, (o + j) * in + i, wdt);
            acc[r * ot + j] = s;
        }
    }
}

#if HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ROWS x OT accumulators in registers (with the OT weight chunks and one x chunk: at most 16 ymm), one
 * instantiation per weight dtype so the hot loop has no branch. */
#define DEFINE_TILE_AVX2(ROWS, OT, DT)                                                                    \
    static void tile_avx2_##DT##_##ROWS##x##OT(const float *xf, int64_t in, const void *w, int64_t o,  \
                                               float *acc) {                                            \
        __m256 a[ROWS][OT];                                                                             \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) a[r][j] = _mm256_setzero_ps();                                 \
        for (int64_t i = 0; i < in; i += 8) {                                                           \
            __m256 wv[OT];                                                                              \
            for (int j = 0; j < OT; j++) {                                                              \
                if ((i & 15) == 0)                                                            \
                    _mm_prefetch((const char *)w + ((o + j) * in + i) * sizeof(float) + PF_BYTES, _MM_HINT_T0); \
                wv[j] = load8_##DT(w, (o + j) * in + i);                                                \
            }                                                                                           \
            for (int r = 0; r < ROWS; r++) {                                                            \
                const __m256 xv = _mm256_loadu_ps(xf + r * in + i);                                     \
                for (int j = 0; j < OT; j++) a[r][j] = _mm256_fmadd_ps(xv, wv[j], a[r][j]);             \
            }                                                                                           \
        }                                                                                               \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) acc[r * OT + j] = hsum8(a[r][j]);                              \
    }
#define DEFINE_TILES_AVX2(DT)                                                                           \
    DEFINE_TILE_AVX2(1, 4, DT)                                                                          \
    DEFINE_TILE_AVX2(1, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(2, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(3, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(4, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(5, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(6, 2, DT)                                                                          \
    DEFINE_TILE_AVX2(4, 3, DT)                                                                          \
    /* Two or more rows: six (then the rest) at a time over the same weight tile, still in L1. */       \
    static void tile_avx2_##DT(const float *xf, int64_t rows, int64_t in, const void *w, int64_t o,    \
                               float *acc) {                                                            \
        if (rows == 1) {                                                                                \
            tile_avx2_##DT##_1x4(xf, in, w, o, acc);                                                    \
            return;                                                                                     \
        }                                                                                               \
        float part[6 * 2];                                                                              \
        for (int64_t r0 = 0; r0 < rows; r0 += 6) {                                                      \
            const int64_t n = rows - r0 < 6 ? rows - r0 : 6;                                            \
            const float *x0 = xf + r0 * in;                                                             \
            switch (n) {                                                                                \
                case 1: tile_avx2_##DT##_1x2(x0, in, w, o, part); break;                                \
                case 2: tile_avx2_##DT##_2x2(x0, in, w, o, part); break;                                \
                case 3: tile_avx2_##DT##_3x2(x0, in, w, o, part); break;                                \
                case 4: tile_avx2_##DT##_4x2(x0, in, w, o, part); break;                                \
                case 5: tile_avx2_##DT##_5x2(x0, in, w, o, part); break;                                \
                default: tile_avx2_##DT##_6x2(x0, in, w, o, part); break;                               \
            }                                                                                           \
            memcpy(acc + r0 * 2, part, (size_t)(n * 2) * sizeof(float));                                \
        }                                                                                               \
    }
DEFINE_TILES_AVX2(f32)

/* bf16 weights, 16 at a time: one 32-byte load holds 8 (even, odd) pairs; a shift left by 16 gives the
 * even elements as float32 and a mask the odd ones, two integer ops instead of a widening conversion.
 * x is pre-split to match (split_pairs): each 16-block as its 8 even then its 8 odd elements. Each
 * (row, feature) sums into two accumulators (even, odd), so no FMA chain waits on the other. */
#define DEFINE_TILE_BF16(ROWS, OT)                                                                      \
    static void tile_bf16_##ROWS##x##OT(const float *xp, int64_t in, const void *w, int64_t o,         \
                                        float *acc) {                                                   \
        const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);                                         \
        __m256 ae[ROWS][OT], ao[ROWS][OT];                                                              \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) ae[r][j] = ao[r][j] = _mm256_setzero_ps();                     \
        for (int64_t i = 0; i < in; i += 16) {                                                          \
            for (int j = 0; j < OT; j++) {                                                              \
                const uint16_t *src = (const uint16_t *)w + (o + j) * in + i;                           \
                _mm_prefetch((const char *)src + PF_BYTES, _MM_HINT_T0);                                \
                const __m256i v = _mm256_loadu_si256((const __m256i *)src);                             \
                const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                        \
                const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));                         \
                for (int r = 0; r < ROWS; r++) {                                                        \
                    ae[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + r * in + i), we, ae[r][j]);         \
                    ao[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + r * in + i + 8), wo, ao[r][j]);     \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) acc[r * OT + j] = hsum8(_mm256_add_ps(ae[r][j], ao[r][j]));    \
    }
DEFINE_TILE_BF16(1, 4)
DEFINE_TILE_BF16(1, 2)
DEFINE_TILE_BF16(2, 2)
DEFINE_TILE_BF16(3, 2)

/* Rows r0 .. rows of a 2-feature tile, three at a time (then two or one), with PREFIX's 1x2 / 2x2 / 3x2
 * tiles: the bf16 and int8 products' row groups (accumulators for more rows would not fit 16 ymm). */
#define DEFINE_GROUPS_OF_3(PREFIX)                                                                      \
    static void PREFIX##_groups(const float *xf, int64_t r0, int64_t rows, int64_t in, const void *w,   \
                                int64_t o, float *acc) {                                                \
        float part[3 * 2];                                                                              \
        for (; r0 < rows; r0 += 3) {                                                                    \
            const int64_t n = rows - r0 < 3 ? rows - r0 : 3;                                            \
            const float *x0 = xf + r0 * in;                                                             \
            if (n == 1)                                                                                 \
                PREFIX##_1x2(x0, in, w, o, part);                                                       \
            else if (n == 2)                                                                            \
                PREFIX##_2x2(x0, in, w, o, part);                                                       \
            else                                                                                        \
                PREFIX##_3x2(x0, in, w, o, part);                                                       \
            memcpy(acc + r0 * 2, part, (size_t)(n * 2) * sizeof(float));                               \
        }                                                                                               \
    }
DEFINE_GROUPS_OF_3(tile_bf16)

static void tile_avx2_bf16(const float *xp, int64_t rows, int64_t in, const void *w, int64_t o, float *acc) {
    if (rows == 1)
        tile_bf16_1x4(xp, in, w, o, acc);
    else
        tile_bf16_groups(xp, 0, rows, in, w, o, acc);
}

/* int8 weights, 16 at a time: sign-extended to int32 and converted to float32 in registers, 8 per half;
 * each (row, feature) sums into two accumulators (low, high half). */
#define DEFINE_TILE_I8(ROWS, OT)                                                                        \
    static void tile_i8_##ROWS##x##OT(const float *xf, int64_t in, const void *w, int64_t o, float *acc) { \
        __m256 al[ROWS][OT], ah[ROWS][OT];                                                              \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) al[r][j] = ah[r][j] = _mm256_setzero_ps();                     \
        for (int64_t i = 0; i < in; i += 16) {                                                          \
            for (int j = 0; j < OT; j++) {                                                              \
                const int8_t *src = (const int8_t *)w + (o + j) * in + i;                               \
                _mm_prefetch((const char *)src + PF_BYTES, _MM_HINT_T0);                                \
                const __m128i v = _mm_loadu_si128((const __m128i *)src);                                \
                const __m256 wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));                          \
                const __m256 wh = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));       \
                for (int r = 0; r < ROWS; r++) {                                                        \
                    al[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + r * in + i), wl, al[r][j]);         \
                    ah[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + r * in + i + 8), wh, ah[r][j]);     \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int j = 0; j < OT; j++) acc[r * OT + j] = hsum8(_mm256_add_ps(al[r][j], ah[r][j]));    \
    }
DEFINE_TILE_I8(1, 4)
DEFINE_TILE_I8(1, 2)
DEFINE_TILE_I8(2, 2)
DEFINE_TILE_I8(3, 2)
DEFINE_TILE_I8(4, 1)
DEFINE_GROUPS_OF_3(tile_i8)

/* Row groups: four at a time one feature per pass (each int8 vector converted once for four rows), then
 * the rest (1-3 rows) two features per pass. */
static void tile_avx2_i8(const float *xf, int64_t rows, int64_t in, const void *w, int64_t o, float *acc) {
    if (rows == 1) {
        tile_i8_1x4(xf, in, w, o, acc);
        return;
    }
    float part[4 * 2];
    int64_t r0 = 0;
    for (; rows - r0 >= 4; r0 += 4) {
        float one[4];
        for (int j = 0; j < 2; j++) {
            tile_i8_4x1(xf + r0 * in, in, w, o + j, one);
            for (int r = 0; r < 4; r++) part[r * 2 + j] = one[r];
        }
        memcpy(acc + r0 * 2, part, 8 * sizeof(float));
    }
    tile_i8_groups(xf, r0, rows, in, w, o, acc);
}

/* dst: each 16-element block of each row of x as its 8 even then its 8 odd elements (in % 16 == 0). */
static void split_pairs(const float *x, int64_t rows, int64_t in, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < in; b += 16)
            for (int k = 0; k < 8; k++) {
                dst[r * in + b + k] = x[r * in + b + 2 * k];
                dst[r * in + b + 8 + k] = x[r * in + b + 2 * k + 1];
            }
}
#endif

/* Output features one tile computes for a product of ``rows`` rows of ``in`` inputs (weight dtype wdt).
 * Four float32 rows of 1024+ inputs (a verify's down projection) take three features per tile: their x rows
 * no longer sit in L1 beside the weight stream, so fewer passes over x per weight byte win there (SmolLM2's
 * 576 x 1536 down: 0.20 -> 0.17 ms), while at 576 inputs two per tile stay faster (the LM head: 5.35 vs
 * 5.68 ms; benchmarks/bench_gemv.py). */
static inline int64_t tile_width(int64_t rows, int64_t in, int wdt) {
    if (rows == 1) return 4;
    return rows == 4 && wdt == W_F32 && in >= 1024 ? 3 : 2;
}

/* Round a float32 value to the storage dtype's precision (bf16: nearest-even) and back. */
static inline float round_to(float v, int is_bf16) {
    if (!is_bf16) return v;
    return bf16_to_f32(f32_to_bf16(v));
}

/* yf[r * ldy + o] = sum_i xf[r * in + i] * w[o * in + i] for r < rows <= GEMV_MAX_ROWS, o < out; the
 * weight in dtype wdt (W_F32, W_BF16, or W_INT8 with scale[out]: the sum over q times scale[o]).
 * bf16 weights are widened in registers for every row group (tile_avx2_bf16). Widening each tile once
 * into a float32 buffer and running the float32 tiles over it was slower at every row count 3-64 on
 * this AVX2 CPU (benchmarks/bench_gemv.py; BENCHMARKS.md section 12), so there is no such path.
 * Returns 0, or -2 when scratch memory could not be allocated. */
static int gemv_rows(const float *xf, int64_t rows, int64_t in, const void *w, const float *scale,
                     int64_t out, int wdt, float *yf, int64_t ldy, int num_threads) {
    const int64_t ot = tile_width(rows, in, wdt), tiles = (out + ot - 1) / ot;
    const int vec = HAVE_AVX2 && in % (wdt == W_F32 ? 8 : 16) == 0;
    const float *xv = xf;
    float *split = NULL;
#if HAVE_AVX2
    if (vec && wdt == W_BF16) {
        split = malloc((size_t)(rows * in) * sizeof(float));
        if (!split) return -2;
        split_pairs(xf, rows, in, split);
        xv = split;
    }
#endif
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t o = t * ot, nj = out - o < ot ? out - o : ot;
        float acc[GEMV_MAX_ROWS * 4];
#if HAVE_AVX2
        if (vec && nj == ot && ot == 3)
            tile_avx2_f32_4x3(xv, in, w, o, acc);
        else if (vec && nj == ot && wdt == W_BF16)
            tile_avx2_bf16(xv, rows, in, w, o, acc);
        else if (vec && nj == ot && wdt == W_INT8)
            tile_avx2_i8(xv, rows, in, w, o, acc);
        else if (vec && nj == ot)
            tile_avx2_f32(xv, rows, in, w, o, acc);
        else
#endif
            tile_portable(xf, rows, in, w, o, nj, ot, wdt, acc);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < nj; j++)
                yf[r * ldy + o + j] = wdt == W_INT8 ? acc[r * ot + j] * scale[o + j] : acc[r * ot + j];
    }
    free(split);
    return 0;
}
#endif
