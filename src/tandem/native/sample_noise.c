/* The sampler's random numbers on the CPU (sample/rng.py), counter-based and vectorized: each sampled row's Exp(1)
 * noise for the exponential race and its uniforms for the acceptance tests.
 *
 * Every sampled row draws one exponential per vocabulary entry (49,152 for the default model) each step. torch's
 * CPU generator (a Mersenne twister) makes its uniforms one at a time, ~4.5 ns each: ~0.25 ms a row and step,
 * ~10 % of a sampled four-stream step (BENCHMARKS.md §22); here a row costs ~0.04 ms on one thread.
 *
 * A row's numbers are the splitmix64 stream at its key (rng.position_key of its seed and output position):
 * element n is the 64-bit mix of key + (n + 1) * 0x9E3779B97F4A7C15 (rng.splitmix64 of key + n * that
 * constant); a row reads the elements from an offset on (the noise first, the uniforms after it, as a torch
 * generator would hand them out). The top 23 bits k of an element give
 * u = (2k + 1) / 2^24, exact in float32 and inside (0, 1) — never 0 or 1, so E = -log(u) is never 0 (a token's
 * p / E never infinite) and at most 16.6 — and E = -log(u) in float32 (a Cephes-style polynomial, within a
 * few ulp of the exact value). Nothing depends on the thread count or the ISA: every variant computes the same
 * bits.
 *
 * The loop is plain C that the compiler vectorizes for each ISA variant (native/__init__.py); the reference
 * is rng.stream_noise_reference (Python integers and float64 logarithms).
 */
#include <stdint.h>
#include <string.h>

/* No fused multiply-adds (the baseline x86-64 variant has none) and no reassociation (the library is built with
 * -ffast-math, under which a vectorized loop body and its scalar tail rounded differently): with both off every
 * variant, and every element whatever its place in a vector, computes the same bits. */
#pragma GCC optimize("fp-contract=off", "no-associative-math", "no-reciprocal-math")

#define TANDEM_SAMPLE_NOISE_ABI 2
#define NOISE_EXPONENTIAL 0
#define NOISE_UNIFORM 1
#define GOLDEN 0x9E3779B97F4A7C15ull
#define CHUNK 4096 /* elements a task: a multiple of every vector width, large enough to amortize a task */

int tandem_sample_noise_abi(void) { return TANDEM_SAMPLE_NOISE_ABI; }

/* -log(u) for u in (0, 1), normal: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), log(u) = e log 2 + log(m), log(m)
 * as x - x^2 / 2 + x^3 P(x) with x = m - 1 and log 2 split in two parts (Cephes' logf). */
static inline float neg_log_unit(float u) {
    int32_t bits;
    memcpy(&bits, &u, 4);
    int32_t e = (bits >> 23) - 126; /* u = m * 2^e, m in [0.5, 1) */
    const int32_t mbits = (bits & 0x007fffff) | 0x3f000000;
    float m;
    memcpy(&m, &mbits, 4);
    const int32_t low = m < 0.70710678f;
    e -= low;
    const float x = low ? m + m - 1.0f : m - 1.0f;
    const float z = x * x;
    float p = 7.0376836292e-2f;
    p = p * x - 1.1514610310e-1f;
    p = p * x + 1.1676998740e-1f;
    p = p * x - 1.2420140846e-1f;
    p = p * x + 1.4249322787e-1f;
    p = p * x - 1.6668057665e-1f;
    p = p * x + 2.0000714765e-1f;
    p = p * x - 2.4999993993e-1f;
    p = p * x + 3.3333331174e-1f;
    const float fe = (float)e;
    const float y = p * x * z - 2.12194440e-4f * fe - 0.5f * z;
    return -(x + y + 0.693359375f * fe);
}

/* Element n of the stream at key: 23 random bits k, u = (2k + 1) / 2^24. */
static inline float stream_unit(uint64_t key, int64_t n) {
    uint64_t z = key + (uint64_t)(n + 1) * GOLDEN;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(2 * (int32_t)(z >> 41) + 1) * 0x1p-24f;
}

static void fill(float *restrict out, int64_t begin, int64_t end, uint64_t key, int64_t offset, int kind) {
    if (kind == NOISE_UNIFORM)
        for (int64_t j = begin; j < end; j++) out[j] = stream_unit(key, offset + j);
    else
        for (int64_t j = begin; j < end; j++) out[j] = neg_log_unit(stream_unit(key, offset + j));
}

/* out: [rows, cols] dense; row r holds elements offsets[r] .. offsets[r] + cols - 1 of the stream at keys[r], as
 * Exp(1) numbers (kind NOISE_EXPONENTIAL) or as the uniforms u themselves (NOISE_UNIFORM). */
void tandem_stream_noise(float *out, int64_t rows, int64_t cols, const uint64_t *keys, const int64_t *offsets,
                         int kind, int num_threads) {
    const int64_t per_row = (cols + CHUNK - 1) / CHUNK, tasks = rows * per_row;
    if (tasks <= 1 || num_threads <= 1) {
        for (int64_t r = 0; r < rows; r++) fill(out + r * cols, 0, cols, keys[r], offsets[r], kind);
        return;
    }
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t r = t / per_row, begin = (t % per_row) * CHUNK;
        fill(out + r * cols, begin, begin + CHUNK < cols ? begin + CHUNK : cols, keys[r], offsets[r], kind);
    }
}
