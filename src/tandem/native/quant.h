/* GGUF block-quantized weights on the CPU: the few-row product y = x @ W^T against a matrix that stays in its
 * blocks (quant_linear.c, decode_forward.c). The block types and their dequantizers: quant_blocks.h; the
 * AVX-512 products straight from Q4_0 / Q4_1 / Q8_0 blocks: quant_fused.h.
 *
 * A matrix is described by a plain int64 array (model/block_quant.py builds it):
 *   [in, n_parts, gain, out, then n_parts x (ggml type, rows, row bytes, data address)]
 * Parts stack their rows (a fused qkv whose q, k and v were stored in different types); each row of a part
 * is ``row bytes`` of consecutive blocks. ``gain`` (0 or the address of in float32 values) multiplies the
 * input columns: (x * gain) @ W^T, the RMSNorm gain that float32 weights have folded in (weights.py).
 *
 * A part whose type carries the QR16 flag is in the interleaved layout of model/block_repack.py (Q4_0, Q4_1,
 * Q8_0: 16 rows at a time) and runs quant_r16.h's product, the fast one, on every ISA; with QI8 / QI8X2 as
 * well, quant_r16_i8.h's product on int8 activations (one or two levels).
 *
 * How the other parts run: Q4_0 / Q4_1 / Q8_0 under AVX-512 straight from the blocks (quant_fused.h); Q4_K and
 * Q6_K under AVX2 for up to four rows of x likewise (kf_gemv below, the tile path's bits); every
 * other type and ISA dequantizes a tile of output features a chunk of QCHUNK inputs at a time into a float32
 * buffer that stays in L1 and multiplies every row of x against it with float32 FMAs. The activations stay
 * float32 either way: outputs equal the dequantized model's up to summation order. The per-output
 * sum order depends only on the input length, never on the row count, the tile or the thread count, so a
 * row gives the same bits alone, in a verify of k + 1 rows or in a batch.
 *
 * ISA: by the flags the library is built with (native/__init__.py builds one library per ISA: native, avx2,
 * portable): AVX-512F, AVX2+FMA or scalar code. Block layouts are GGML's (gguf-py's gguf.quants is the
 * reference the tests compare against).
 */
#ifndef TANDEM_QUANT_H
#define TANDEM_QUANT_H
#include "quant_blocks.h"
#include "quant_fused.h"
#include "quant_r16_i8.h"

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

/* ---- AVX2: Q4_K and Q6_K rows without the buffer, for a few rows of x ------------------------------------
 * The tile path below dequantizes a tile into a buffer (deq_q4_k_simd / deq_q6_k_simd: each group of 8 weights
 * w = fma(q, d, m)) and reads it back in q_dots (each output's 8 lanes: a = fma(x, w, a) over a chunk of QCHUNK
 * inputs, then q_hsum8, then added to the output). For up to KF_ROWS rows of x these do the very same operations
 * in the same order with each group of weights kept in a register: the same bits (so a row's outputs are those
 * of any batch, whichever path runs it), without writing 2 KB a tile and chunk and reading it back. Weight-bound
 * one-row products of Gemma 3's Q4_K and Q6_K matrices spent ~35 % of their time in the dequantizer's stores. */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define KF_ROWS 4
static inline int kf_type(int64_t type) { return type == GT_Q4_K || type == GT_Q6_K; }

/* a[r] = fma(x[r * in + 0..7], w, a[r]) for the 8 weights w = fma(q, d, m) of the low 8 bytes of b8 (st8's w) */
static inline __attribute__((always_inline)) void kf8(int R, __m128i b8, int is_signed, __m256 d, __m256 m,
                                                      const float *x, int64_t in, __m256 *a) {
    const __m256i v = is_signed ? _mm256_cvtepi8_epi32(b8) : _mm256_cvtepu8_epi32(b8);
    const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m);
    for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * in), w, a[r]);
}

/* 32 weights from the bytes q: the first 16 scaled by d0, the next 16 by d1, offset m (st32's weights) */
static inline __attribute__((always_inline)) void kf32(int R, __m256i q, int is_signed, float d0, float d1, float m,
                                                       const float *x, int64_t in, __m256 *a) {
    const __m256 dv0 = _mm256_set1_ps(d0), dv1 = _mm256_set1_ps(d1), mv = _mm256_set1_ps(m);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    kf8(R, lo, is_signed, dv0, mv, x, in, a);
    kf8(R, _mm_srli_si128(lo, 8), is_signed, dv0, mv, x + 8, in, a);
    kf8(R, hi, is_signed, dv1, mv, x + 16, in, a);
    kf8(R, _mm_srli_si128(hi, 8), is_signed, dv1, mv, x + 24, in, a);
}

/* One block of 256 weights against x[r * in + 0..255] (deq_q4_k_simd's and deq_q6_k_simd's weights, in order) */
static inline __attribute__((always_inline)) void kf_block(int R, int64_t type, const uint8_t *b, const float *x,
                                                           int64_t in, __m256 *a) {
    if (type == GT_Q4_K) {
        const __m256i lo4 = _mm256_set1_epi8(15);
        float ds[8], dm[8];
        k_scales(b, ds, dm);
        const uint8_t *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32, x += 64) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            kf32(R, _mm256_and_si256(v, lo4), 0, ds[j], ds[j], -dm[j], x, in, a);
            kf32(R, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), 0, ds[j + 1], ds[j + 1], -dm[j + 1], x + 32, in, a);
        }
        return;
    }
    const float d = q_f16(b + 208);
    const uint8_t *ql = b, *qhp = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int half = 0; half < 2; half++, ql += 64, qhp += 32, sc += 8, x += 128) {
        __m256i lows[4];
        q6k_lows(ql, lows);
        const __m256i h = _mm256_loadu_si256((const __m256i *)qhp);
        for (int k = 0; k < 4; k++)
            kf32(R, q6k_group(lows, h, k), 1, d * (float)sc[2 * k], d * (float)sc[2 * k + 1], 0.0f, x + 32 * k, in, a);
    }
}

/* acc[r * QTILE] += row . x[r] for r < R, chunk by chunk as the tile path sums */
static inline __attribute__((always_inline)) void kf_row(int R, int64_t type, const uint8_t *row, const float *x,
                                                         int64_t in, float *acc) {
    const int64_t bytes = type == GT_Q4_K ? 144 : 210;
    for (int64_t c = 0; c < in; c += QCHUNK) {
        const int64_t len = in - c < QCHUNK ? in - c : QCHUNK;
        __m256 a[KF_ROWS];
        for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
        const uint8_t *b = row + (c / 256) * bytes;
        for (int64_t i = 0; i < len; i += 256, b += bytes) kf_block(R, type, b, x + c + i, in, a);
        for (int r = 0; r < R; r++) acc[r * QTILE] += q_hsum8(a[r]);
    }
}

/* One Q4_K / Q6_K part of q_gemv for rows <= KF_ROWS: y[r * ldy + o] for its prow outputs (tiles of QTILE
 * outputs shared out as the tile path's are). */
static void kf_gemv(int64_t type, int64_t prow, int64_t rb, const uint8_t *data, const float *x, int64_t rows,
                    int64_t in, float *yp, int64_t ldy, int num_threads) {
    const int64_t tiles = (prow + QTILE - 1) / QTILE;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        float acc[KF_ROWS * QTILE] = {0};
        const int64_t o = t * QTILE;
        const int nj = (int)(prow - o < QTILE ? prow - o : QTILE);
        for (int j = 0; j < nj; j++) {
            const uint8_t *row = data + (o + j) * rb;
            switch (rows) { /* R a constant in each: its accumulators stay in registers */
                case 1: kf_row(1, type, row, x, in, acc + j); break;
                case 2: kf_row(2, type, row, x, in, acc + j); break;
                case 3: kf_row(3, type, row, x, in, acc + j); break;
                default: kf_row(4, type, row, x, in, acc + j); break;
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < nj; j++) yp[r * ldy + o + j] = acc[r * QTILE + j];
    }
}
#else
#define KF_ROWS 0
static inline int kf_type(int64_t type) { (void)type; return 0; }
static void kf_gemv(int64_t type, int64_t prow, int64_t rb, const uint8_t *data, const float *x, int64_t rows,
                    int64_t in, float *yp, int64_t ldy, int num_threads) {
    (void)type, (void)prow, (void)rb, (void)data, (void)x, (void)rows, (void)in, (void)yp, (void)ldy, (void)num_threads;
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
            if (pt[0] & QR16) {
                if (!r16_type(pt[0])) return -3;
                r16_row(pt[0] & QTYPE_MASK, (const uint8_t *)pt[3], pt[2], row, m->in / 32, dst);
                return 0;
            }
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
    const float *raw = x; /* the int8 path applies the gain as it prepares its rows; the others take x * gain */
    float *xg = NULL;
    int rc = 0;
    int64_t base = 0;
    for (int64_t p = 0; p < m.n_parts; p++) {
        const int64_t *pt = m.parts + p * QDESC_PART;
        const int64_t type = pt[0], prow = pt[1], rb = pt[2];
        const uint8_t *data = (const uint8_t *)pt[3];
        const int levels = type & QR16 ? (type & QI8X2 ? 2 : (type & QI8 ? 1 : 0)) : 0;
        if (m.gain && !levels && !xg) {
            xg = malloc((size_t)(rows * in) * sizeof(float));
            if (!xg) return -2;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < in; i++) xg[r * in + i] = raw[r * in + i] * m.gain[i];
            x = xg;
        }
        if (type & QR16) { /* every row count: a row gives the same bits in any batch */
            if (!r16_type(type)) {
                rc = -3;
                break;
            }
            rc = levels ? i8_gemv(type & QTYPE_MASK, levels, prow, rb, data, raw, m.gain, rows, in, y + base, ldy,
                                  num_threads)
                        : r16_gemv(type & QTYPE_MASK, prow, rb, data, x, rows, in, y + base, ldy, num_threads);
            if (rc != 0) break;
            base += prow;
            continue;
        }
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
        if (kf_type(type) && rows <= KF_ROWS) { /* the same bits as the tiles below */
            kf_gemv(type, prow, rb, data, x, rows, in, yp, ldy, num_threads);
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
