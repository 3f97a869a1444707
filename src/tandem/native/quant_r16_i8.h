/* The few-row product on interleaved Q4_0 / Q4_1 / Q8_0 rows (model/block_repack.py) with int8 activations:
 * quant.h calls it for a part whose descriptor type carries QR16 and QI8 (one level) or QI8X2 (two).
 *
 * Activations: each row's 32-input block b is quantized as x ~ dx * q1 (q1 = round(x / dx), dx = max|x| /
 * 127: one level, llama.cpp's Q8 activations) or x ~ dx * q1 + dr * q2 (q2 = round(r / dr) of the residual
 * r = x - dx * q1, dr = max|r| / 127: two levels, an error of at most dr / 2 <= max|x| / 508 / 127 per input,
 * which keeps the model's outputs at the float32 model's up to ~1e-5 relative). The integer dot products of
 * a block with the weights' integers are exact, so every rounding happens per block in float32 in a fixed
 * order: a row gives the same bits alone, in a batch and at any thread count, on every ISA path.
 *
 * Per block and row of 16 outputs: S = sum q_w * q_x (int32, exact), corrected by an integer for the
 * weights' offsets (Q4_0: q_w - 8, so S - 8 sum q_x; Q8_0: its int8 weights enter the unsigned operand as
 * q_w + 128 (an XOR), so S - 128 sum q_x), then f = dx * S1 (+ dr * S2), acc += d * f, and Q4_1's offset
 * acc += m * sum(x over the block) with the float32 sum.
 *
 * ISA: AVX-512 VNNI (vpdpbusd: 4 u8 x s8 products of all 16 lanes, one instruction) where the library is
 * built with it; else AVX2 (vpmaddubsw + vpmaddwd, 8 lanes a register; below); otherwise scalar C with the same
 * integers and the same float operations per block (the engine chooses int8 activations by default where one
 * of the two SIMD paths is present: quantization.py). The AVX2 path's bits equal this scalar C's compiled with
 * hardware FMA (checked on an AVX2 machine); the portable build has no FMA, and its fmaf may round twice.
 */
#ifndef TANDEM_QUANT_R16_I8_H
#define TANDEM_QUANT_R16_I8_H
#include <math.h>

#include "quant_r16.h"

#define QI8 0x200   /* descriptor type flag: int8 activations, one level */
#define QI8X2 0x400 /* descriptor type flag: int8 activations, two levels */

/* One row's block b, prepared: the int8 dwords in the order the weights' lanes take them (Q4: dword 2c + h
 * holds inputs 8c + h + 2t, t = 0..3 (the low (h = 0) or high nibbles of chunk c); Q8_0: dword j inputs
 * 4j .. 4j + 3), per level; the float scales; the integer corrections. */
typedef struct {
    int8_t q[2][32];
    float dx, dr, sum; /* sum: float32 sum of the block's inputs (Q4_1's offset) */
    int32_t corr[2];   /* subtracted from the level's integer sum */
} I8Block;

static inline int i8_position(int64_t base, int k) { /* input of byte k of the block's dwords */
    if (base == GT_Q8_0) return k;
    const int dw = k / 4, t = k % 4; /* dword dw = 2c + h */
    return 8 * (dw / 2) + (dw % 2) + 2 * t;
}

/* Row r of x prepared into out[r * nb ..]; with a gain, of x[r][i] * gain[i] (the float products q_gemv's
 * scratch copy held before: the same bits). */
static void i8_prepare(int64_t base, const float *x, const float *gain, int64_t r, int64_t in, int levels,
                       I8Block *out) {
    const int64_t nb = in / 32;
    const int k_corr = base == GT_Q4_0 ? 8 : (base == GT_Q8_0 ? 128 : 0);
    for (int64_t b = 0; b < nb; b++) {
        const float *xr = x + r * in + b * 32;
        float xb[32]; /* a local copy: the loops below vectorize, knowing it aliases nothing they write */
        if (gain)
            for (int i = 0; i < 32; i++) xb[i] = xr[i] * gain[b * 32 + i];
        else
            for (int i = 0; i < 32; i++) xb[i] = xr[i];
        I8Block *o = out + r * nb + b;
        float res[32], amax = 0.0f, sum = 0.0f;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            sum += xb[i];
        }
        o->sum = sum;
        o->dx = amax / 127.0f;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        float rmax = 0.0f;
        int32_t s1 = 0;
        for (int k = 0; k < 32; k++) {
            const int i = i8_position(base, k);
            const int v = (int)nearbyintf(xb[i] * inv);
            const int q = v > 127 ? 127 : (v < -127 ? -127 : v);
            o->q[0][k] = (int8_t)q;
            s1 += q;
            res[k] = xb[i] - o->dx * (float)q;
            rmax = fmaxf(rmax, fabsf(res[k]));
        }
        o->corr[0] = k_corr * s1;
        o->dr = levels > 1 ? rmax / 127.0f : 0.0f;
        const float rinv = levels > 1 && rmax > 0.0f ? 127.0f / rmax : 0.0f;
        int32_t s2 = 0;
        for (int k = 0; k < 32; k++) {
            const int v = (int)nearbyintf(res[k] * rinv);
            const int q = v > 127 ? 127 : (v < -127 ? -127 : v);
            o->q[1][k] = (int8_t)q;
            s2 += q;
        }
        o->corr[1] = k_corr * s2;
    }
}

#define I8_ROWS 4 /* the SIMD paths take a group's rows this many at a time */
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __m512i i8_bcast(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* A block's 16 outputs of one row into acc, from its exact integer sums t1, t2 (one per level): the corrections
 * for the weights' offsets (Q4_1's are 0), the activation scales, the weight scales d, Q4_1's offsets m. */
static inline __attribute__((always_inline)) __m512 i8_finish(int64_t base, __m512i t1, __m512i t2,
                                                              const I8Block *xb, int levels, __m512 d, __m512 m,
                                                              __m512 acc) {
    if (base != GT_Q4_1) {
        t1 = _mm512_sub_epi32(t1, _mm512_set1_epi32(xb->corr[0]));
        t2 = _mm512_sub_epi32(t2, _mm512_set1_epi32(xb->corr[1]));
    }
    __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_set1_ps(xb->dx), _mm512_setzero_ps()); /* rounded once */
    if (levels > 1) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t2), _mm512_set1_ps(xb->dr), f);
    acc = _mm512_fmadd_ps(d, f, acc);
    if (base == GT_Q4_1) acc = _mm512_fmadd_ps(m, _mm512_set1_ps(xb->sum), acc);
    return acc;
}

/* One group (16 lanes: lo is always 0) times R rows of prepared blocks. */
static inline __attribute__((always_inline)) void i8_lanes(int64_t base, const uint8_t *g, int64_t nb, int64_t lo,
                                                           const I8Block *xp, float *y, int64_t ldy, int R,
                                                           int levels) {
    (void)lo;
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes;
    const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[I8_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * gb, *q = blk + hdr;
        for (int64_t l = 0; l < gb; l += 64) _mm_prefetch((const char *)(blk + R16_PREFETCH + l), _MM_HINT_T0); /* quant_r16.h says why */
        __m512i s[I8_ROWS][2];
        for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int dw = 0; dw < 8; dw++) {
            __m512i w;
            if (base == GT_Q8_0) {
                w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(q + 64 * dw)), flip);
            } else {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * (dw / 2)));
                w = _mm512_and_si512(dw % 2 ? _mm512_srli_epi32(v, 4) : v, m4);
            }
            for (int r = 0; r < R; r++) {
                const I8Block *xb = xp + r * nb + b;
                s[r][0] = _mm512_dpbusd_epi32(s[r][0], w, i8_bcast(xb->q[0] + 4 * dw));
                if (levels > 1) s[r][1] = _mm512_dpbusd_epi32(s[r][1], w, i8_bcast(xb->q[1] + 4 * dw));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 m = base == GT_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))) : d;
        for (int r = 0; r < R; r++)
            acc[r] = i8_finish(base, s[r][0], s[r][1], xp + r * nb + b, levels, d, m, acc[r]);
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

#define I8_LANES 16 /* a register holds a group's 16 lanes */
#define I8_SIMD "vnni"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* AVX2 without VNNI: vpmaddubsw multiplies 32 u8 x s8 byte pairs and adds neighbours into 16 bits, exactly while
 * no sum passes 32767. Q4: a weight is 0..15 and an activation |q| <= 127, so a pair is <= 3810 and the block's
 * eight dwords add up in 16 bits (<= 30480) before one vpmaddwd by 1 widens them: the integer sum S the VNNI
 * path forms, with the same offset correction. Q8_0: the int8 weight's magnitude (|-128| = 128 as u8) times the
 * activation carrying the weight's sign (vpsignb) — a pair <= 2 * 128 * 127 = 32512 — widened every dword:
 * S = sum q_w q_x directly, which is what the VNNI path's biased sum less its correction is. The float operations
 * per block are i8_finish's (the bits equal the scalar C's built with hardware FMA). 8 lanes a register: a group
 * is two halves. */
/* Each product added to its row's sum as soon as it is made: without this GCC forms all of a block's products first
 * and adds them as a tree, holding them on the stack (four rows, two levels: 64 products per half-block, sixteen
 * ymm registers): the products ran 1.2-1.45x slower so (BENCHMARKS.md §24). The sums are exact in any order. */
#define I8_KEEP(v) __asm__("" : "+x"(v))
static inline __m256i i8_bcast8(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) __m256 i8_finish8(int64_t base, __m256i t1, __m256i t2,
                                                               const I8Block *xb, int levels, __m256 d, __m256 m,
                                                               __m256 acc) {
    if (base == GT_Q4_0) { /* Q8_0's sums need no correction here; Q4_1 has none */
        t1 = _mm256_sub_epi32(t1, _mm256_set1_epi32(xb->corr[0]));
        t2 = _mm256_sub_epi32(t2, _mm256_set1_epi32(xb->corr[1]));
    }
    __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t1), _mm256_set1_ps(xb->dx), _mm256_setzero_ps()); /* rounded once */
    if (levels > 1) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t2), _mm256_set1_ps(xb->dr), f);
    acc = _mm256_fmadd_ps(d, f, acc);
    if (base == GT_Q4_1) acc = _mm256_fmadd_ps(m, _mm256_set1_ps(xb->sum), acc);
    return acc;
}

/* Lanes lo .. lo + 8 of one group times R rows of prepared blocks. */
static inline __attribute__((always_inline)) void i8_lanes(int64_t base, const uint8_t *g, int64_t nb, int64_t lo,
                                                           const I8Block *xp, float *y, int64_t ldy, int R,
                                                           int levels) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[I8_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + b * gb, *q = blk + hdr;
        if (lo == 0) /* the first half's pass prefetches the group's stream (quant_r16.h says why) */
            for (int64_t l = 0; l < gb; l += 64) _mm_prefetch((const char *)(blk + R16_PREFETCH + l), _MM_HINT_T0);
        __m256i s[I8_ROWS][2];
        for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int dw = 0; dw < 8; dw++) {
            if (base == GT_Q8_0) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(q + 64 * dw + 4 * lo));
                const __m256i aw = _mm256_abs_epi8(w);
                for (int r = 0; r < R; r++) {
                    const I8Block *xb = xp + r * nb + b;
                    for (int l = 0; l < levels; l++) {
                        const __m256i pr = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(i8_bcast8(xb->q[l] + 4 * dw), w));
                        s[r][l] = _mm256_add_epi32(s[r][l], _mm256_madd_epi16(pr, ones));
                        I8_KEEP(s[r][l]);
                    }
                }
            } else {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * (dw / 2) + 4 * lo));
                const __m256i w = _mm256_and_si256(dw % 2 ? _mm256_srli_epi32(v, 4) : v, m4);
                for (int r = 0; r < R; r++) {
                    const I8Block *xb = xp + r * nb + b;
                    for (int l = 0; l < levels; l++) {
                        s[r][l] = _mm256_add_epi16(s[r][l], _mm256_maddubs_epi16(w, i8_bcast8(xb->q[l] + 4 * dw)));
                        I8_KEEP(s[r][l]);
                    }
                }
            }
        }
        if (base != GT_Q8_0)
            for (int r = 0; r < R; r++)
                for (int l = 0; l < levels; l++) s[r][l] = _mm256_madd_epi16(s[r][l], ones);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 2 * lo)));
        const __m256 m = base == GT_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 2 * lo))) : d;
        for (int r = 0; r < R; r++)
            acc[r] = i8_finish8(base, s[r][0], levels > 1 ? s[r][1] : s[r][0], xp + r * nb + b, levels, d, m, acc[r]);
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy, acc[r]);
}

#define I8_LANES 8 /* a register holds half a group: two passes */
#define I8_SIMD "avx2"
#else
/* The weight integers of lane o, in the order of the prepared dwords: byte k multiplies q[.][k]. */
static inline int i8_weight(int64_t base, const uint8_t *q, int o, int k) {
    const int dw = k / 4, t = k % 4;
    if (base == GT_Q8_0) return (int)(int8_t)q[64 * dw + 4 * o + t] + 128;
    uint32_t v;
    memcpy(&v, q + 64 * (dw / 2) + 4 * o, 4);
    return (int)((v >> (8 * t + 4 * (dw % 2))) & 15u);
}

/* The float part of a block for one lane and row: i8_finish's operations, in its order. */
static inline float i8_block_value(const I8Block *xb, int32_t s1, int32_t s2, int levels) {
    const float f = (float)(s1 - xb->corr[0]) * xb->dx;
    return levels > 1 ? fmaf((float)(s2 - xb->corr[1]), xb->dr, f) : f;
}

/* The portable path: the same integers and the same float operations per block, lane by lane. */
static void i8_group(int64_t base, const uint8_t *g, int64_t nb, const I8Block *xp, int64_t rows, int levels,
                     float *y, int64_t ldy) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes;
    for (int64_t r = 0; r < rows; r++)
        for (int o = 0; o < R16; o++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = g + b * gb, *q = blk + hdr;
                const I8Block *xb = xp + r * nb + b;
                int32_t s1 = 0, s2 = 0;
                for (int k = 0; k < 32; k++) {
                    const int w = i8_weight(base, q, o, k);
                    s1 += w * xb->q[0][k];
                    s2 += w * xb->q[1][k];
                }
                acc = fmaf(q_f16(blk + 2 * o), i8_block_value(xb, s1, s2, levels), acc);
                if (base == GT_Q4_1) acc = fmaf(q_f16(blk + 32 + 2 * o), xb->sum, acc);
            }
            y[r * ldy + o] = acc;
        }
}
#define I8_SIMD "portable"
#endif

#ifdef I8_LANES
/* Both SIMD paths: i8_lanes specialised for each row count (1 .. I8_ROWS) and level count, per weight format,
 * and a group's rows taken I8_ROWS at a time, its lanes I8_LANES at a time. */
#define I8_DEFINE(BASE, NAME)                                                                             \
    static void i8_##NAME(const uint8_t *g, int64_t nb, const I8Block *xp, int R, int levels, float *y,    \
                          int64_t ldy, int64_t lo) {                                                      \
        if (levels > 1) {                                                                                 \
            if (R == 1) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 1, 2);                                      \
            else if (R == 2) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 2, 2);                                 \
            else if (R == 3) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 3, 2);                                 \
            else i8_lanes(BASE, g, nb, lo, xp, y, ldy, 4, 2);                                             \
        } else {                                                                                          \
            if (R == 1) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 1, 1);                                      \
            else if (R == 2) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 2, 1);                                 \
            else if (R == 3) i8_lanes(BASE, g, nb, lo, xp, y, ldy, 3, 1);                                 \
            else i8_lanes(BASE, g, nb, lo, xp, y, ldy, 4, 1);                                             \
        }                                                                                                 \
    }
I8_DEFINE(GT_Q4_0, q4_0)
I8_DEFINE(GT_Q4_1, q4_1)
I8_DEFINE(GT_Q8_0, q8_0)

static void i8_group(int64_t base, const uint8_t *g, int64_t nb, const I8Block *xp, int64_t rows, int levels,
                     float *y, int64_t ldy) {
    void (*const fn)(const uint8_t *, int64_t, const I8Block *, int, int, float *, int64_t, int64_t) =
        base == GT_Q8_0 ? i8_q8_0 : (base == GT_Q4_1 ? i8_q4_1 : i8_q4_0);
    for (int64_t r0 = 0; r0 < rows; r0 += I8_ROWS) {
        const int n = (int)(rows - r0 < I8_ROWS ? rows - r0 : I8_ROWS);
        for (int64_t lo = 0; lo < R16; lo += I8_LANES) fn(g, nb, xp + r0 * nb, n, levels, y + r0 * ldy + lo, ldy, lo);
    }
}
#endif

/* One interleaved part with int8 activations (levels 1 or 2): y[r * ldy + o] from x (times gain[i] where set).
 * Returns 0 or -2.
 *
 * Where the rows come from matters on a VM whose two vCPUs sit on different core complexes (a cache line's round
 * trip ~340 ns instead of ~65: native/core_latency.c). Rows prepared by one thread alone had it read the other
 * thread's half of x across cores while that thread spun at the barrier (3.5x as long there, BENCHMARKS.md §13).
 * So from R16_PAR_ROWS rows the threads prepare the rows, split as the element-wise steps between products split
 * them (decode_forward.c: rows in static order), then share out the groups: a thread reads the activation rows
 * it wrote itself. Fewer rows (one stream's decode, a short verify) are prepared by every thread into its own
 * scratch (malloc's per-thread arenas: each thread's, call after call): the work is a few blocks, and no thread
 * writes a line the other has read (each such write waits for the other core's copy to be invalidated). */
static int i8_gemv(int64_t base, int levels, int64_t prow, int64_t rb, const uint8_t *data, const float *x,
                   const float *gain, int64_t rows, int64_t in, float *y, int64_t ldy, int num_threads) {
    const int64_t nb = in / 32, groups = prow / R16;
    if (rows < R16_PAR_ROWS) { /* every thread prepares the few rows itself, into its own scratch */
        int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
        {
            I8Block *own = malloc((size_t)(rows * nb) * sizeof(I8Block));
            failed = !own;
            for (int64_t r = 0; own && r < rows; r++) i8_prepare(base, x, gain, r, in, levels, own);
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < groups; t++)
                if (own) i8_group(base, data + t * R16 * rb, nb, own, rows, levels, y + t * R16, ldy);
            free(own);
        }
        return failed ? -2 : 0;
    }
    I8Block *xp = malloc((size_t)(rows * nb) * sizeof(I8Block));
    if (!xp) return -2;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) i8_prepare(base, x, gain, r, in, levels, xp);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < groups; t++)
            i8_group(base, data + t * R16 * rb, nb, xp, rows, levels, y + t * R16, ldy);
    }
    free(xp);
    return 0;
}
#endif
