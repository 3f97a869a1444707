/* bfloat16 <-> float32 (scalar and, with AVX2, 8 at a time) and index clamping, shared by the native
 * kernels (included, not linked). */
#ifndef TANDEM_BF16_H
#define TANDEM_BF16_H
#include <stdint.h>
#include <string.h>

static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

/* Element i of a float32 or bf16 array, as float32. */
static inline float load_elem(const void *base, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* Elements elem .. elem + 7 as float32: loaded, or bf16 widened by a shift into the high half. */
static inline __m256 load8_f32(const void *base, int64_t elem) { return _mm256_loadu_ps((const float *)base + elem); }

static inline __m256 load8_bf16(const void *base, int64_t elem) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + elem));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

static inline __m256 load8(const void *base, int64_t elem, int is_bf16) {
    return is_bf16 ? load8_bf16(base, elem) : load8_f32(base, elem);
}
#endif
#endif
