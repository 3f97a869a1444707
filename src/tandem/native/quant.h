/* GGUF block-quantized weights on the CPU: row dequantizers for the GGML block types, and the few-row
 * product y = x @ W^T against a matrix that stays in its blocks (quant_linear.c, decode_forward.c).
 *
 * A matrix is described by a plain int64 array (model/block_quant.py builds it):
 *   [in, n_parts, gain, out, then n_parts x (ggml type, rows, row bytes, data address)]
 * Parts stack their rows (a fused qkv whose q, k and v were stored in different types); each row of a part
 * is ``row bytes`` of consecutive blocks. ``gain`` (0 or the address of in float32 values) multiplies the
 * input columns: (x * gain) @ W^T, the RMSNorm gain that float32 weights have folded in (weights.py).
 *
 * How the product runs: a tile of output features is dequantized a chunk of QCHUNK inputs at a time into
 * a float32 buffer that stays in L1, and every row of x is multiplied against it with float32 FMAs (the
 * activations stay float32: outputs equal the dequantized model's up to summation order). The per-output
 * sum order depends only on the input length, never on the row count, the tile or the thread count, so a
 * row gives the same bits alone, in a verify of k + 1 rows or in a batch.
 *
 * ISA: the dequantizers are plain C that the compiler vectorizes for the flags the library is built with
 * (native/__init__.py builds one library per ISA: native, avx2, portable); the dot products use AVX-512F,
 * AVX2+FMA or scalar code by the same flags. Block layouts are GGML's (gguf-py's gguf.quants is the
 * reference the tests compare against).
 */
#ifndef TANDEM_QUANT_H
#define TANDEM_QUANT_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* GGML type ids (ggml.h) */
#define GT_F32 0
#define GT_F16 1
#define GT_Q4_0 2
#define GT_Q4_1 3
#define GT_Q5_0 6
#define GT_Q5_1 7
#define GT_Q8_0 8
#define GT_Q4_K 12
#define GT_Q5_K 13
#define GT_Q6_K 14
#define GT_BF16 30

#define QDESC_HEAD 4
#define QDESC_PART 4
#define QCHUNK 512      /* inputs per dequantized chunk: a multiple of every block length (256) */
#define QTILE 4         /* output features per tile */
#define QMAX_ROWS 64    /* rows of x per product */

#if defined(__AVX512F__)
#define QUANT_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define QUANT_ISA "avx2"
#else
#define QUANT_ISA "portable"
#endif

static inline float q_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* Weights per block and bytes per block of a type; 0 for a type without a dequantizer here. */
static inline int q_block(int64_t type, int64_t *bytes) {
    switch (type) {
        case GT_F32: *bytes = 4; return 1;
        case GT_F16: *bytes = 2; return 1;
        case GT_BF16: *bytes = 2; return 1;
        case GT_Q8_0: *bytes = 34; return 32;
        case GT_Q4_0: *bytes = 18; return 32;
        case GT_Q4_1: *bytes = 20; return 32;
        case GT_Q5_0: *bytes = 22; return 32;
        case GT_Q5_1: *bytes = 24; return 32;
        case GT_Q4_K: *bytes = 144; return 256;
        case GT_Q5_K: *bytes = 176; return 256;
        case GT_Q6_K: *bytes = 210; return 256;
        default: *bytes = 0; return 0;
    }
}

/* ---- dequantizers: nb blocks at b into y ------------------------------------------------------------ */
static void deq_f32(const uint8_t *restrict b, int64_t nb, float *restrict y) { memcpy(y, b, (size_t)nb * 4); }

static void deq_f16(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++) y[i] = q_f16(b + 2 * i);
}

static void deq_bf16(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        const uint32_t bits = (uint32_t)h << 16;
        memcpy(y + i, &bits, 4);
    }
}

static void deq_q8_0(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = q_f16(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int l = 0; l < 32; l++) y[l] = d * (float)q[l];
    }
}

/* 4-bit types: byte l holds element l (low nibble) and element l + 16 (high nibble). */
static void deq_q4_0(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = q_f16(b);
        const uint8_t *q = b + 2;
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)((int)(q[l] & 15) - 8);
            y[l + 16] = d * (float)((int)(q[l] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = q_f16(b), m = q_f16(b + 2);
        const uint8_t *q = b + 4;
        for (int l = 0; l < 16; l++) {
            y[l] = d * (float)(q[l] & 15) + m;
            y[l + 16] = d * (float)(q[l] >> 4) + m;
        }
    }
}

/* 5-bit types: the fifth bit of element l is bit l of the 32-bit qh (little-endian). */
static void deq_q5_0(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = q_f16(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const uint8_t *q = b + 6;
        for (int l = 0; l < 16; l++) {
            const int lo = (q[l] & 15) | (int)(((qh >> l) & 1u) << 4);
            const int hi = (q[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
            y[l] = d * (float)(lo - 16);
            y[l + 16] = d * (float)(hi - 16);
        }
    }
}

static void deq_q5_1(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = q_f16(b), m = q_f16(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const uint8_t *q = b + 8;
        for (int l = 0; l < 16; l++) {
            const int lo = (q[l] & 15) | (int)(((qh >> l) & 1u) << 4);
            const int hi = (q[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
            y[l] = d * (float)lo + m;
            y[l + 16] = d * (float)hi + m;
        }
    }
}

/* K-quants: 256 weights in 8 sub-blocks of 32; Q4_K / Q5_K pack each sub-block's 6-bit scale and min in
 * 12 bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7 in the
 * nibbles of bytes 8-11, with their top two bits in the top bits of bytes 0-3 (scale) and 4-7 (min). */
static inline void k_scale_min(int j, const uint8_t *s, float *sc, float *mn) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *mn = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *mn = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]; each 32 bytes of qs hold two sub-blocks (low, then high nibbles). */
static void deq_q4_k(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = q_f16(b), dmin = q_f16(b + 2);
        const uint8_t *s = b + 4, *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            float sc0, m0, sc1, m1;
            k_scale_min(j, s, &sc0, &m0);
            k_scale_min(j + 1, s, &sc1, &m1);
            const float d0 = d * sc0, n0 = dmin * m0, d1 = d * sc1, n1 = dmin * m1;
            for (int l = 0; l < 32; l++) {
                y[l] = d0 * (float)(q[l] & 15) - n0;
                y[l + 32] = d1 * (float)(q[l] >> 4) - n1;
            }
        }
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of sub-block j's element l is bit j of qh[l]. */
static void deq_q5_k(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = q_f16(b), dmin = q_f16(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *q = b + 48;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            float sc0, m0, sc1, m1;
            k_scale_min(j, s, &sc0, &m0);
            k_scale_min(j + 1, s, &sc1, &m1);
            const float d0 = d * sc0, n0 = dmin * m0, d1 = d * sc1, n1 = dmin * m1;
            for (int l = 0; l < 32; l++) {
                const int lo = (q[l] & 15) | (((qh[l] >> j) & 1) << 4);
                const int hi = (q[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4);
                y[l] = d0 * (float)lo - n0;
                y[l + 32] = d1 * (float)hi - n1;
            }
        }
    }
}

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 weights), d. Each half of
 * 128 weights uses 64 bytes of ql and 32 of qh: element l + 32 * k of the half (k = 0..3) takes ql's low
 * (k even) or high (k odd) nibble of byte l + 32 * (k & 1) and bits 2k, 2k + 1 of qh[l]. */
static void deq_q6_k(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = q_f16(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* SIMD dequantizers: each block's weights are first formed as 32 bytes in a ymm register (nibbles split,
 * high bits merged, offsets subtracted), then widened to float32 and scaled: 16 lanes at a time under
 * AVX-512F, 8 under AVX2. The scalar functions above are the portable path (and what these are tested
 * against, through gguf-py's reference). */
#if defined(__AVX512F__)
static inline void st16(__m128i b16, int is_signed, float d, float m, float *y) {
    const __m512i v = is_signed ? _mm512_cvtepi8_epi32(b16) : _mm512_cvtepu8_epi32(b16);
    _mm512_storeu_ps(y, _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(d), _mm512_set1_ps(m)));
}
#else
static inline void st8(__m128i b8, int is_signed, __m256 d, __m256 m, float *y) {
    const __m256i v = is_signed ? _mm256_cvtepi8_epi32(b8) : _mm256_cvtepu8_epi32(b8);
    _mm256_storeu_ps(y, _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m));
}
static inline void st16(__m128i b16, int is_signed, float d, float m, float *y) {
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    st8(b16, is_signed, dv, mv, y);
    st8(_mm_srli_si128(b16, 8), is_signed, dv, mv, y + 8);
}
#endif
/* y[0..31] = d * q + m for 32 bytes q; y[0..15] and y[16..31] may take their own scale (d0, d1). */
static inline void st32(__m256i q, int is_signed, float d0, float d1, float m, float *y) {
    st16(_mm256_castsi256_si128(q), is_signed, d0, m, y);
    st16(_mm256_extracti128_si256(q, 1), is_signed, d1, m, y + 16);
}

static inline __m256i nibbles16(const uint8_t *q) { /* 16 bytes -> 32: low nibbles, then high nibbles */
    const __m128i v = _mm_loadu_si128((const __m128i *)q), lo4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), _mm_and_si128(v, lo4));
}

static inline __m256i bits32(uint32_t qh) { /* bit l of qh -> byte l as 0x10 or 0 */
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static void deq_q8_0_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = q_f16(b);
        st32(_mm256_loadu_si256((const __m256i *)(b + 2)), 1, d, d, 0.0f, y);
    }
}

static void deq_q4_0_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = q_f16(b);
        st32(_mm256_sub_epi8(nibbles16(b + 2), _mm256_set1_epi8(8)), 1, d, d, 0.0f, y);
    }
}

static void deq_q4_1_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = q_f16(b);
        st32(nibbles16(b + 4), 0, d, d, q_f16(b + 2), y);
    }
}

static void deq_q5_0_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = q_f16(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m256i q = _mm256_or_si256(nibbles16(b + 6), bits32(qh));
        st32(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), 1, d, d, 0.0f, y);
    }
}

static void deq_q5_1_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = q_f16(b);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        st32(_mm256_or_si256(nibbles16(b + 8), bits32(qh)), 0, d, d, q_f16(b + 2), y);
    }
}

static void deq_q4_k_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    const __m256i lo4 = _mm256_set1_epi8(15);
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = q_f16(b), dmin = q_f16(b + 2);
        const uint8_t *s = b + 4, *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            float sc0, m0, sc1, m1;
            k_scale_min(j, s, &sc0, &m0);
            k_scale_min(j + 1, s, &sc1, &m1);
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            st32(_mm256_and_si256(v, lo4), 0, d * sc0, d * sc0, -dmin * m0, y);
            st32(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), 0, d * sc1, d * sc1, -dmin * m1, y + 32);
        }
    }
}

static void deq_q5_k_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    const __m256i lo4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = q_f16(b), dmin = q_f16(b + 2);
        const uint8_t *s = b + 4, *q = b + 48;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            float sc0, m0, sc1, m1;
            k_scale_min(j, s, &sc0, &m0);
            k_scale_min(j + 1, s, &sc1, &m1);
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            const __m128i sh0 = _mm_cvtsi32_si128(j), sh1 = _mm_cvtsi32_si128(j + 1);
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh0), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh1), one), 4);
            st32(_mm256_or_si256(_mm256_and_si256(v, lo4), h0), 0, d * sc0, d * sc0, -dmin * m0, y);
            st32(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), h1), 0, d * sc1, d * sc1,
                 -dmin * m1, y + 32);
        }
    }
}

static void deq_q6_k_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    const __m256i lo4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = q_f16(b + 208);
        const uint8_t *ql = b, *qhp = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qhp += 32, sc += 8, y += 128) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i c = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qhp);
            const __m256i lows[4] = {_mm256_and_si256(a, lo4), _mm256_and_si256(c, lo4),
                                     _mm256_and_si256(_mm256_srli_epi16(a, 4), lo4),
                                     _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4)};
            for (int k = 0; k < 4; k++) {
                const __m256i hk = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * k)), three);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[k], _mm256_slli_epi16(hk, 4)), off);
                st32(q, 1, d * (float)sc[2 * k], d * (float)sc[2 * k + 1], 0.0f, y + 32 * k);
            }
        }
    }
}
#define SIMD(name) name##_simd
#else
#define SIMD(name) name
#endif

typedef void (*deq_fn)(const uint8_t *restrict, int64_t, float *restrict);

static inline deq_fn q_dequantizer(int64_t type) {
    switch (type) {
        case GT_F32: return deq_f32;
        case GT_F16: return deq_f16;
        case GT_BF16: return deq_bf16;
        case GT_Q8_0: return SIMD(deq_q8_0);
        case GT_Q4_0: return SIMD(deq_q4_0);
        case GT_Q4_1: return SIMD(deq_q4_1);
        case GT_Q5_0: return SIMD(deq_q5_0);
        case GT_Q5_1: return SIMD(deq_q5_1);
        case GT_Q4_K: return SIMD(deq_q4_k);
        case GT_Q5_K: return SIMD(deq_q5_k);
        case GT_Q6_K: return SIMD(deq_q6_k);
        default: return NULL;
    }
}

/* ---- dot products: acc[j] += x . w[j] over n inputs, for nj <= QTILE rows of w (stride QCHUNK) -------- */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
typedef __m512 qvec; /* one vector of float32 lanes, by the ISA the library is built for */
#define QV_LANES 16
#define QV_ZERO _mm512_setzero_ps
#define QV_LOADU _mm512_loadu_ps
#define QV_LOAD _mm512_load_ps
#define QV_FMA _mm512_fmadd_ps
#define QV_SUM _mm512_reduce_add_ps
#else
static inline float q_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
typedef __m256 qvec;
#define QV_LANES 8
#define QV_ZERO _mm256_setzero_ps
#define QV_LOADU _mm256_loadu_ps
#define QV_LOAD _mm256_load_ps
#define QV_FMA _mm256_fmadd_ps
#define QV_SUM q_hsum8
#endif
static inline void q_dots(const float *x, const float *w, int nj, int64_t n, float *acc) {
    qvec a0 = QV_ZERO(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + QV_LANES <= n; i += QV_LANES) {
        const qvec xv = QV_LOADU(x + i);
        a0 = QV_FMA(xv, QV_LOAD(w + i), a0);
        if (nj > 1) a1 = QV_FMA(xv, QV_LOAD(w + QCHUNK + i), a1);
        if (nj > 2) a2 = QV_FMA(xv, QV_LOAD(w + 2 * QCHUNK + i), a2);
        if (nj > 3) a3 = QV_FMA(xv, QV_LOAD(w + 3 * QCHUNK + i), a3);
    }
    float s[QTILE] = {QV_SUM(a0), QV_SUM(a1), QV_SUM(a2), QV_SUM(a3)};
    for (; i < n; i++)
        for (int j = 0; j < nj; j++) s[j] += x[i] * w[j * QCHUNK + i];
    for (int j = 0; j < nj; j++) acc[j] += s[j];
}
#else
static inline void q_dots(const float *x, const float *w, int nj, int64_t n, float *acc) {
    for (int j = 0; j < nj; j++) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f; /* four chains, a fixed order */
        const float *wj = w + j * QCHUNK;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            s0 += x[i] * wj[i];
            s1 += x[i + 1] * wj[i + 1];
            s2 += x[i + 2] * wj[i + 2];
            s3 += x[i + 3] * wj[i + 3];
        }
        for (; i < n; i++) s0 += x[i] * wj[i];
        acc[j] += (s0 + s1) + (s2 + s3);
    }
}
#endif

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

/* ---- the matrix -------------------------------------------------------------------------------------- */
typedef struct {
    int64_t in, n_parts, out;
    const float *gain;
    const int64_t *parts; /* n_parts x (type, rows, row_bytes, data) */
} QMatrix;

static inline QMatrix q_matrix(const int64_t *desc) {
    QMatrix m = {desc[0], desc[1], desc[3], (const float *)desc[2], desc + QDESC_HEAD};
    return m;
}

/* Dequantize row ``row`` of the matrix (without the gain) into dst[in]. Returns 0, or -3 for a type
 * without a dequantizer (the wrapper never lets one through). */
static int q_row(const QMatrix *m, int64_t row, float *dst) {
    for (int64_t p = 0; p < m->n_parts; p++) {
        const int64_t *pt = m->parts + p * QDESC_PART;
        if (row < pt[1]) {
            int64_t bytes;
            const int per = q_block(pt[0], &bytes);
            const deq_fn deq = q_dequantizer(pt[0]);
            if (!deq || per == 0) return -3;
            deq((const uint8_t *)pt[3] + row * pt[2], m->in / per, dst);
            return 0;
        }
        row -= pt[1];
    }
    return 0;
}

/* y[r * ldy + o] = sum_i (x[r][i] * gain[i]) * w[o][i] for r < rows <= QMAX_ROWS, o < out. x is dense
 * [rows, in]. Returns 0, -2 when scratch memory could not be allocated, -3 for a type without a kernel. */
static int q_gemv(const int64_t *desc, const float *x, int64_t rows, float *y, int64_t ldy, int num_threads) {
    const QMatrix m = q_matrix(desc);
    const int64_t in = m.in;
    float *xg = NULL;
    if (m.gain) {
        xg = malloc((size_t)(rows * in) * sizeof(float));
        if (!xg) return -2;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < in; i++) xg[r * in + i] = x[r * in + i] * m.gain[i];
        x = xg;
    }
    int rc = 0;
    int64_t base = 0;
    for (int64_t p = 0; p < m.n_parts; p++) {
        const int64_t *pt = m.parts + p * QDESC_PART;
        const int64_t type = pt[0], prow = pt[1], rb = pt[2];
        const uint8_t *data = (const uint8_t *)pt[3];
        int64_t bytes;
        const int per = q_block(type, &bytes);
        const deq_fn deq = q_dequantizer(type);
        if (!deq || per == 0) {
            rc = -3;
            break;
        }
        float *yp = y + base;
        if (q_fused_type(type)) { /* every row count: a row gives the same bits in any batch */
            rc = q_gemv_fused(type, prow, rb, data, x, rows, in, yp, ldy, num_threads);
            if (rc != 0) break;
            base += prow;
            continue;
        }
        const int64_t tiles = (prow + QTILE - 1) / QTILE;
#pragma omp parallel for num_threads(num_threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            float buf[QTILE * QCHUNK] __attribute__((aligned(64)));
            float acc[QMAX_ROWS * QTILE];
            const int64_t o = t * QTILE;
            const int nj = (int)(prow - o < QTILE ? prow - o : QTILE);
            memset(acc, 0, sizeof(float) * (size_t)(rows * QTILE));
            for (int64_t c = 0; c < in; c += QCHUNK) {
                const int64_t len = in - c < QCHUNK ? in - c : QCHUNK;
                for (int j = 0; j < nj; j++) {
                    const uint8_t *src = data + (o + j) * rb + (c / per) * bytes;
                    __builtin_prefetch(src + rb * QTILE, 0, 0);
                    deq(src, len / per, buf + j * QCHUNK);
                }
                for (int64_t r = 0; r < rows; r++) q_dots(x + r * in + c, buf, nj, len, acc + r * QTILE);
            }
            for (int64_t r = 0; r < rows; r++)
                for (int j = 0; j < nj; j++) yp[r * ldy + o + j] = acc[r * QTILE + j];
        }
        base += prow;
    }
    free(xg);
    return rc;
}
#endif
