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
 * How the other parts run: Q4_0 / Q4_1 / Q8_0 under AVX-512 straight from the blocks (quant_fused.h); every
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
