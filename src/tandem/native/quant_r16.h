/* The few-row product on Q4_0 / Q4_1 / Q8_0 rows in the interleaved layout (model/block_repack.py): 16 rows
 * at a time, at each block index their scales together and their weights so that one 32-bit lane per row
 * holds that row's weights. quant.h calls it for every part whose descriptor type carries QR16.
 *
 * How a group of 16 output features is computed, per block of 32 inputs:
 *   Q4_x: a 64-byte chunk holds 8 weights of each of the 16 rows (weight 8c + s in bits 4s .. 4s + 3 of the
 *   row's lane), so weight s of all 16 rows is one AND with 0xF << 4s (a shift by 28 for s = 7) and one
 *   int -> float conversion: the value is q * 16^s, exactly, and the input it multiplies was scaled by
 *   16^-s once per call (x_scaled), exactly (a power of two), so the float product is x * q rounded once,
 *   as without the scaling. Then one FMA per 16 weights and row of x.
 *   Q8_0: a 64-byte chunk holds 4 weights of each row (weight 4j + t in byte t of the row's lane): two
 *   shifts (one for t = 3) sign-extend byte t of all 16 lanes, one conversion.
 *   The block's partial sums (4 chains, input i into chain i % 4, added (0 + 1) + (2 + 3)) are multiplied
 *   by the 16 scales d; Q4_1's offset enters as m * sum(x over the block), Q4_0's -8 as d * (-8 * sum).
 * Versus a row at a time on GGML's layout (quant_fused.h) that is ~3 instructions per 16 weights instead
 * of ~10, and a second row of x costs one FMA per 16 weights.
 *
 * Bits: each output's sum order is fixed by the input length alone (blocks in sequence, the four chains,
 * the same instructions whatever the row count: adds are written as FMAs by one so that -ffast-math cannot
 * reassociate them differently in differently unrolled copies), so a row gives the same bits alone, in a
 * verify of k + 1 rows or in a batch, at any thread count. The float results equal the dequantized
 * weights' product up to summation order (tests: tests/native/test_quant_linear.py).
 *
 * ISA: AVX-512F (16 lanes: a group is one register, 4 rows of x per pass), AVX2 + FMA + F16C (8 lanes:
 * a group is two halves, 2 rows per pass) or scalar C (the portable path, the same arithmetic per lane).
 */
#ifndef TANDEM_QUANT_R16_H
#define TANDEM_QUANT_R16_H
#include "quant_blocks.h"

#define QR16 0x100 /* descriptor type flag: block_repack.QDESC_INTERLEAVED */
#define R16 16     /* rows per group */
/* Software prefetch distance, bytes ahead of the group-block being multiplied (into the group's own stream
 * or the next group's). The hardware prefetchers alone kept a decode step's weight stream at ~15 GB/s on
 * the 2-vCPU VMs here; 8 KiB ahead brought SmolLM2's decode forward from 4.3 to 2.75 ms (~27 GB/s, the
 * machine's read bandwidth); 1 KiB gave 3.1-3.4, 4 KiB 2.9, 16 KiB the same as 8. */
#define R16_PREFETCH 8192
/* Rows from which a product's threads prepare its input rows in a static split, each the rows it wrote (the
 * element-wise steps between products split them alike from this many: decode_forward.c's PAR_ROWS);
 * quant_r16_i8.h's i8_gemv says why. */
#define R16_PAR_ROWS 4

#define QTYPE_MASK 0xff /* the GGML type under the flags */

static inline int r16_type(int64_t type) {
    const int64_t base = type & QTYPE_MASK;
    return (type & QR16) && (base == GT_Q4_0 || base == GT_Q4_1 || base == GT_Q8_0);
}

/* Header bytes of a group-block: d[16] (and m[16] for Q4_1) as float16. */
static inline int64_t r16_header(int64_t base) { return base == GT_Q4_1 ? 64 : 32; }

/* Scale of input i for the Q4 types: 16^-(i % 8), except 1 for i % 8 == 7 (that weight is shifted down). */
static inline float r16_xscale(int64_t i) {
    static const float sc[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    return sc[i & 7];
}

/* Row r of x prepared: xq[r][i] = x[r][i] * r16_xscale(i) (Q4 types; Q8_0 uses x as is); xs[r][b] = sum of
 * block b of x[r] (a fixed order), times -8 for Q4_0 (its weights are d * (q - 8)). */
static void r16_prepare(int64_t base, const float *x, int64_t r, int64_t in, float *xq, float *xs) {
    const int64_t nb = in / 32;
    const float *xr = x + r * in;
    if (base != GT_Q8_0)
        for (int64_t i = 0; i < in; i++) xq[r * in + i] = xr[i] * r16_xscale(i);
    for (int64_t b = 0; b < nb; b++) {
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s += xr[b * 32 + i];
        xs[r * nb + b] = base == GT_Q4_0 ? -8.0f * s : s;
    }
}

/* Dequantize row ``row`` of an interleaved part (prow rows, rb bytes a row) into dst[nb * 32]. */
static void r16_row(int64_t base, const uint8_t *data, int64_t rb, int64_t row, int64_t nb, float *dst) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t o = row % R16, hdr = r16_header(base);
    const uint8_t *g = data + (row - o) * rb;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * R16 * bytes, *q = blk + hdr;
        const float d = q_f16(blk + 2 * o);
        float *y = dst + b * 32;
        if (base == GT_Q8_0) {
            for (int i = 0; i < 32; i++) y[i] = d * (float)(int8_t)q[64 * (i / 4) + 4 * o + i % 4];
            continue;
        }
        const float m = base == GT_Q4_1 ? q_f16(blk + 32 + 2 * o) : 0.0f;
        for (int c = 0; c < 4; c++) {
            uint32_t v;
            memcpy(&v, q + 64 * c + 4 * o, 4);
            for (int s = 0; s < 8; s++) {
                const int qv = (int)((v >> (4 * s)) & 15u);
                y[8 * c + s] = base == GT_Q4_1 ? d * (float)qv + m : d * (float)(qv - 8);
            }
        }
    }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#if defined(__AVX512F__)
#define RV_LANES 16
#define RV_ROWS 4
typedef __m512 rv;
typedef __m512i rvi;
#define RV_ZERO() _mm512_setzero_ps()
#define RV_SET1(v) _mm512_set1_ps(v)
#define RV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define RV_LOADI(p) _mm512_loadu_si512((const void *)(p))
#define RV_AND(a, b) _mm512_and_si512(a, b)
#define RV_SRLI28(a) _mm512_srli_epi32(a, 28)
#define RV_SRAI24(a) _mm512_srai_epi32(a, 24)
#define RV_SLLI(a, n) _mm512_slli_epi32(a, n)
#define RV_SET1I(v) _mm512_set1_epi32(v)
#define RV_CVT(a) _mm512_cvtepi32_ps(a)
#define RV_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define RV_STORE(p, v) _mm512_storeu_ps(p, v)
#else
#define RV_LANES 8
#define RV_ROWS 2
typedef __m256 rv;
typedef __m256i rvi;
#define RV_ZERO() _mm256_setzero_ps()
#define RV_SET1(v) _mm256_set1_ps(v)
#define RV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define RV_LOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define RV_AND(a, b) _mm256_and_si256(a, b)
#define RV_SRLI28(a) _mm256_srli_epi32(a, 28)
#define RV_SRAI24(a) _mm256_srai_epi32(a, 24)
#define RV_SLLI(a, n) _mm256_slli_epi32(a, n)
#define RV_SET1I(v) _mm256_set1_epi32(v)
#define RV_CVT(a) _mm256_cvtepi32_ps(a)
#define RV_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define RV_STORE(p, v) _mm256_storeu_ps(p, v)
#endif

/* a + b as one FMA (a * 1 + b: exact, and a builtin -ffast-math does not reassociate) */
static inline rv rv_add(rv a, rv b) { return RV_FMA(a, RV_SET1(1.0f), b); }

/* Lanes lo .. lo + RV_LANES of a group (g: the group's first block) times R rows of x: y[r * ldy + j]. */
static inline __attribute__((always_inline)) void r16_lanes(int64_t base, const uint8_t *g, int64_t nb, int64_t lo,
                                                            const float *x, const float *xs, int64_t in, int R,
                                                            float *y, int64_t ldy) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes;
    rv acc[RV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = RV_ZERO();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * gb, *q = blk + hdr;
        for (int64_t l = 0; l < gb; l += 64) _mm_prefetch((const char *)(blk + R16_PREFETCH + l), _MM_HINT_T0);
        const float *xb = x + b * 32;
        rv p[RV_ROWS][4];
        for (int r = 0; r < R; r++) p[r][0] = p[r][1] = p[r][2] = p[r][3] = RV_ZERO();
        if (base == GT_Q8_0) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const rvi v = RV_LOADI(q + 64 * j + 4 * lo);
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) { /* byte t of every lane, sign-extended */
                    const rv w = RV_CVT(t == 3 ? RV_SRAI24(v) : RV_SRAI24(RV_SLLI(v, 24 - 8 * t)));
                    for (int r = 0; r < R; r++)
                        p[r][t] = RV_FMA(RV_SET1(xb[r * in + 4 * j + t]), w, p[r][t]);
                }
            }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const rvi v = RV_LOADI(q + 64 * c + 4 * lo);
#pragma GCC unroll 8
                for (int s = 0; s < 8; s++) {
                    const rv w = RV_CVT(s == 7 ? RV_SRLI28(v) : RV_AND(v, RV_SET1I(15 << (4 * s))));
                    for (int r = 0; r < R; r++)
                        p[r][s & 3] = RV_FMA(RV_SET1(xb[r * in + 8 * c + s]), w, p[r][s & 3]);
                }
            }
        }
        const rv d = RV_F16(blk + 2 * lo);
        const rv mo = base == GT_Q4_1 ? RV_F16(blk + 32 + 2 * lo) : d;
        for (int r = 0; r < R; r++) {
            const rv part = rv_add(rv_add(p[r][0], p[r][1]), rv_add(p[r][2], p[r][3]));
            acc[r] = RV_FMA(d, part, acc[r]);
            if (base != GT_Q8_0) acc[r] = RV_FMA(mo, RV_SET1(xs[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) RV_STORE(y + r * ldy, acc[r]);
}

#if RV_ROWS == 4
#define R16_MORE_ROWS(BASE)                                                                                  \
    else if (R == 3) r16_lanes(BASE, g, nb, lo, x, xs, in, 3, y, ldy);                                       \
    else r16_lanes(BASE, g, nb, lo, x, xs, in, 4, y, ldy);
#else
#define R16_MORE_ROWS(BASE)
#endif
/* One instance per type, and inside it per row count (the accumulators of R rows stay in registers). */
#define R16_DEFINE(BASE, NAME)                                                                              \
    static void r16_##NAME(const uint8_t *g, int64_t nb, int64_t lo, const float *x, const float *xs, int64_t in, \
                           int R, float *y, int64_t ldy) {                                                    \
        if (R == 1) r16_lanes(BASE, g, nb, lo, x, xs, in, 1, y, ldy);                                         \
        else if (R == 2) r16_lanes(BASE, g, nb, lo, x, xs, in, 2, y, ldy);                                    \
        R16_MORE_ROWS(BASE)                                                                                   \
    }
R16_DEFINE(GT_Q4_0, q4_0)
R16_DEFINE(GT_Q4_1, q4_1)
R16_DEFINE(GT_Q8_0, q8_0)

/* Group g of the part times rows of x (xq: prepared by r16_prepare), 16 outputs into y[r * ldy + 0 .. 16]. */
static void r16_group(int64_t base, const uint8_t *g, int64_t nb, const float *xq, const float *xs, int64_t in,
                      int64_t rows, float *y, int64_t ldy) {
    void (*const fn)(const uint8_t *, int64_t, int64_t, const float *, const float *, int64_t, int, float *, int64_t) =
        base == GT_Q8_0 ? r16_q8_0 : (base == GT_Q4_1 ? r16_q4_1 : r16_q4_0);
    for (int64_t lo = 0; lo < R16; lo += RV_LANES)
        for (int64_t r0 = 0; r0 < rows; r0 += RV_ROWS) {
            const int n = (int)(rows - r0 < RV_ROWS ? rows - r0 : RV_ROWS);
            fn(g, nb, lo, xq + r0 * in, xs + r0 * nb, in, n, y + r0 * ldy + lo, ldy);
        }
}
#else
/* The portable path: the same arithmetic lane by lane (four chains per block, combined (0 + 1) + (2 + 3)). */
static void r16_group(int64_t base, const uint8_t *g, int64_t nb, const float *xq, const float *xs, int64_t in,
                      int64_t rows, float *y, int64_t ldy) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = xq + r * in;
        for (int o = 0; o < R16; o++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + b * gb, *q = blk + hdr;
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (base == GT_Q8_0) {
                    for (int i = 0; i < 32; i++) p[i & 3] += x[b * 32 + i] * (float)(int8_t)q[64 * (i / 4) + 4 * o + i % 4];
                } else {
                    for (int c = 0; c < 4; c++) {
                        uint32_t v;
                        memcpy(&v, q + 64 * c + 4 * o, 4);
                        for (int s = 0; s < 8; s++) {
                            const uint32_t w = s == 7 ? v >> 28 : v & (15u << (4 * s));
                            p[s & 3] += x[b * 32 + 8 * c + s] * (float)w;
                        }
                    }
                }
                const float d = q_f16(blk + 2 * o);
                acc += d * ((p[0] + p[1]) + (p[2] + p[3]));
                if (base == GT_Q4_1) acc += q_f16(blk + 32 + 2 * o) * xs[r * nb + b];
                else if (base == GT_Q4_0) acc += d * xs[r * nb + b];
            }
            y[r * ldy + o] = acc;
        }
    }
}
#endif

/* One interleaved part of q_gemv: y[r * ldy + o] for its prow outputs. Returns 0 or -2 (scratch memory). */
static int r16_gemv(int64_t base, int64_t prow, int64_t rb, const uint8_t *data, const float *x, int64_t rows,
                    int64_t in, float *y, int64_t ldy, int num_threads) {
    const int64_t nb = in / 32, groups = prow / R16;
    float *xs = malloc((size_t)(rows * nb + (base == GT_Q8_0 ? 0 : rows * in)) * sizeof(float));
    if (!xs) return -2;
    float *xq = base == GT_Q8_0 ? (float *)x : xs + rows * nb;
    const int split = rows >= R16_PAR_ROWS; /* fewer rows: prepared before the threads start */
    for (int64_t r = 0; !split && r < rows; r++) r16_prepare(base, x, r, in, xq, xs);
#pragma omp parallel num_threads(num_threads)
    {
        if (split) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) r16_prepare(base, x, r, in, xq, xs);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < groups; t++)
            r16_group(base, data + t * R16 * rb, nb, xq, xs, in, rows, y + t * R16, ldy);
    }
    free(xs);
    return 0;
}
#endif
