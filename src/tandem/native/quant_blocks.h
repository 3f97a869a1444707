/* GGML block types for the block-quantized kernels (quant.h): type ids, block sizes, float16 scales, and
 * row dequantizers for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (and F32 / F16 / BF16 rows): a scalar
 * C function per type (the portable path) and, where the library is built with AVX2 + FMA, a SIMD one that
 * forms each block's 32 bytes in a ymm register and widens them 16 (AVX-512F) or 8 (AVX2) lanes at a time.
 * Block layouts are GGML's; gguf-py's gguf.quants is the reference the tests compare against. Included, not
 * linked. */
#ifndef TANDEM_QUANT_BLOCKS_H
#define TANDEM_QUANT_BLOCKS_H
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

/* ds[j] = d * scale_j and dm[j] = dmin * min_j for the 8 sub-blocks of the Q4_K / Q5_K block at b. */
static inline void k_scales(const uint8_t *b, float *ds, float *dm) {
    const float d = q_f16(b), dmin = q_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        float sc, mn;
        k_scale_min(j, b + 4, &sc, &mn);
        ds[j] = d * sc;
        dm[j] = dmin * mn;
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]; each 32 bytes of qs hold two sub-blocks (low, then high nibbles). */
static void deq_q4_k(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float ds[8], dm[8];
        k_scales(b, ds, dm);
        const uint8_t *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            for (int l = 0; l < 32; l++) {
                y[l] = ds[j] * (float)(q[l] & 15) - dm[j];
                y[l + 32] = ds[j + 1] * (float)(q[l] >> 4) - dm[j + 1];
            }
        }
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of sub-block j's element l is bit j of qh[l]. */
static void deq_q5_k(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        float ds[8], dm[8];
        k_scales(b, ds, dm);
        const uint8_t *qh = b + 16, *q = b + 48;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            for (int l = 0; l < 32; l++) {
                const int lo = (q[l] & 15) | (((qh[l] >> j) & 1) << 4);
                const int hi = (q[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4);
                y[l] = ds[j] * (float)lo - dm[j];
                y[l + 32] = ds[j + 1] * (float)hi - dm[j + 1];
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
        float ds[8], dm[8];
        k_scales(b, ds, dm);
        const uint8_t *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            st32(_mm256_and_si256(v, lo4), 0, ds[j], ds[j], -dm[j], y);
            st32(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), 0, ds[j + 1], ds[j + 1], -dm[j + 1], y + 32);
        }
    }
}

static void deq_q5_k_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    const __m256i lo4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++, b += 176) {
        float ds[8], dm[8];
        k_scales(b, ds, dm);
        const uint8_t *q = b + 48;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            const __m128i sh0 = _mm_cvtsi32_si128(j), sh1 = _mm_cvtsi32_si128(j + 1);
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh0), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, sh1), one), 4);
            st32(_mm256_or_si256(_mm256_and_si256(v, lo4), h0), 0, ds[j], ds[j], -dm[j], y);
            st32(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), h1), 0, ds[j + 1], ds[j + 1],
                 -dm[j + 1], y + 32);
        }
    }
}

/* Q6_K, one half of a block (64 bytes of ql, 32 of qh): its four groups of 32 weights' low 4 bits, in order */
static inline void q6k_lows(const uint8_t *ql, __m256i lows[4]) {
    const __m256i lo4 = _mm256_set1_epi8(15);
    const __m256i a = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i c = _mm256_loadu_si256((const __m256i *)(ql + 32));
    lows[0] = _mm256_and_si256(a, lo4);
    lows[1] = _mm256_and_si256(c, lo4);
    lows[2] = _mm256_and_si256(_mm256_srli_epi16(a, 4), lo4);
    lows[3] = _mm256_and_si256(_mm256_srli_epi16(c, 4), lo4);
}

/* ... and group k's 32 signed weights q - 32, its 2 high bits from qh (bits 2k, 2k + 1 of each byte) */
static inline __m256i q6k_group(const __m256i lows[4], __m256i qh, int k) {
    const __m256i hk = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lows[k], _mm256_slli_epi16(hk, 4)), _mm256_set1_epi8(32));
}

static void deq_q6_k_simd(const uint8_t *restrict b, int64_t nb, float *restrict y) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = q_f16(b + 208);
        const uint8_t *ql = b, *qhp = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qhp += 32, sc += 8, y += 128) {
            __m256i lows[4];
            q6k_lows(ql, lows);
            const __m256i h = _mm256_loadu_si256((const __m256i *)qhp);
            for (int k = 0; k < 4; k++)
                st32(q6k_group(lows, h, k), 1, d * (float)sc[2 * k], d * (float)sc[2 * k + 1], 0.0f, y + 32 * k);
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

#endif
