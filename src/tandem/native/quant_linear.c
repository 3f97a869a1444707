/* Products and row lookups on GGUF block-quantized matrices (quant.h), for the torch layers' few-row
 * products (the linear rules of model/linear.py), the LM head and embedding lookups.
 *
 * Semantics: x, bias, residual and y are float32; y = (x * gain) @ W^T (+ bias) (+ residual), each output
 * summed in a fixed order (quant.h). Memory: the wrapper (native/quant_linear.py) checks shapes, strides
 * and types; the C code trusts them.
 */
#include "quant.h"

#define TANDEM_QUANT_LINEAR_ABI 2

int tandem_quant_linear_abi(void) { return TANDEM_QUANT_LINEAR_ABI; }
int tandem_quant_linear_max_rows(void) { return QMAX_ROWS; }
const char *tandem_quant_linear_isa(void) { return QUANT_ISA; }
/* Which path int8 activations run on here: "vnni" (AVX-512 VNNI), "avx2" (vpmaddubsw) or "portable" (scalar C). */
const char *tandem_quant_linear_i8_simd(void) { return I8_SIMD; }


/* Whether ``type`` has a dequantizer here. */
int tandem_quant_supported(int64_t type) { return q_dequantizer(type) != NULL; }

/* x: [rows, in] with row stride x_stride; bias: [out] or NULL; residual: [rows, out] (row stride res_stride)
 * or NULL; y: [rows, out] with row stride y_stride. Returns 0, -1 for rows outside 1..QMAX_ROWS, -2 out of
 * memory, -3 a type without a kernel. */
int tandem_quant_linear(const int64_t *desc, const float *x, int64_t x_stride, int64_t rows, const float *bias,
                        const float *residual, int64_t res_stride, float *y, int64_t y_stride, int num_threads) {
    if (rows < 1 || rows > QMAX_ROWS) return -1;
    const QMatrix m = q_matrix(desc);
    const float *xd = x;
    float *dense = NULL;
    if (x_stride != m.in) {
        dense = malloc((size_t)(rows * m.in) * sizeof(float));
        if (!dense) return -2;
        for (int64_t r = 0; r < rows; r++) memcpy(dense + r * m.in, x + r * x_stride, (size_t)m.in * sizeof(float));
        xd = dense;
    }
    const int rc = q_gemv(desc, xd, rows, y, y_stride, num_threads);
    free(dense);
    if (rc != 0) return rc;
    if (bias || residual)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < m.out; o++)
                y[r * y_stride + o] += (bias ? bias[o] : 0.0f) + (residual ? residual[r * res_stride + o] : 0.0f);
    return 0;
}

/* dst[k] = row idx[k] of the matrix (row0 + k where idx is NULL), float32 without the gain, k < n. Returns 0
 * or -3. Rows are clamped into the matrix. */
int tandem_quant_rows(const int64_t *desc, const int64_t *idx, int64_t row0, int64_t n, float *dst, int num_threads) {
    const QMatrix m = q_matrix(desc);
    int rc = 0;
#pragma omp parallel for num_threads(num_threads) schedule(static) reduction(min : rc)
    for (int64_t k = 0; k < n; k++) {
        int64_t row = idx ? idx[k] : row0 + k;
        row = row < 0 ? 0 : (row >= m.out ? m.out - 1 : row);
        const int r = q_row(&m, row, dst + k * m.in);
        if (r < rc) rc = r;
    }
    return rc;
}
