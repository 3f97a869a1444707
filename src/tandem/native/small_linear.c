/* Matrix products of few rows on the CPU: y = x @ W^T (+ bias) (+ residual), for 1..GEMV_MAX_ROWS rows of x.
 *
 * At decode (one row per request) and speculative verify (k + 1 rows) a projection is a pass over the
 * weight: it reads every weight once and does 2 * rows flops per element, so its speed is the speed at
 * which the weight streams from memory. Library GEMV/GEMM kernels reach that on some CPUs and not on
 * others (float32 `mv` ran at 11.5 GB/s on an AVX2 EPYC where a plain sum runs at 28 GB/s; oneDNN's bf16
 * path needs AVX-512 or AVX-NE-CONVERT). This kernel streams each thread's contiguous slice of output
 * features once, converts bf16 weights with a shift, and keeps every row's partial sums in registers.
 *
 * Semantics: inputs, bias, residual and output share one dtype (float32 or bf16); the weight has that dtype,
 * or under float32 inputs bf16 or int8 with a float32 scale per output feature (a drafter's weights under a
 * float32 target: half or a quarter of the bytes to stream); products and sums accumulate in float32 in a fixed order (the same result whatever the thread
 * count); the bias and residual are added in float32 and a bf16 result is rounded to nearest-even once.
 *
 * Memory: the wrapper (small_linear.py) checks shapes, strides and dtypes; the C code trusts them.
 */
#include "gemv.h"

#define TANDEM_SMALL_LINEAR_ABI 3

int tandem_small_linear_abi(void) { return TANDEM_SMALL_LINEAR_ABI; }
int tandem_small_linear_max_rows(void) { return GEMV_MAX_ROWS; }
int tandem_small_linear_vectorized(void) { return HAVE_AVX2; }

/* is_bf16: the dtype of x, bias, residual and y; wdt: the weight's (W_F32, W_BF16, W_INT8 with scale
 * [out]; see gemv.h). x: [rows, in] with row stride x_stride; w: [out, in] dense; bias: [out] or NULL; residual: [rows, out]
 * with row stride res_stride, or NULL; y: [rows, out] with row stride y_stride. Returns 0, -1 when rows
 * is outside 1..GEMV_MAX_ROWS, -2 when scratch memory could not be allocated. */
int tandem_small_linear(int is_bf16, int wdt, const void *x, int64_t x_stride, int64_t rows, const void *w,
                        const float *scale, int64_t out, int64_t in, const void *bias, const void *residual,
                        int64_t res_stride, void *y, int64_t y_stride, int num_threads) {
    if (rows < 1 || rows > GEMV_MAX_ROWS) return -1;
    float *xf = malloc((size_t)(rows * in + rows * out) * sizeof(float));
    if (!xf) return -2;
    float *yf = xf + rows * in;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < in; i++) xf[r * in + i] = load_elem(x, r * x_stride + i, is_bf16);
    if (gemv_rows(xf, rows, in, w, scale, out, wdt, yf, out, num_threads) != 0) {
        free(xf);
        return -2;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t o = 0; o < out; o++) {
            float v = yf[r * out + o];
            if (bias) v += load_elem(bias, o, is_bf16);
            if (residual) v += load_elem(residual, r * res_stride + o, is_bf16);
            if (is_bf16)
                ((uint16_t *)y)[r * y_stride + o] = f32_to_bf16(v);
            else
                ((float *)y)[r * y_stride + o] = v;
        }
    }
    free(xf);
    return 0;
}
