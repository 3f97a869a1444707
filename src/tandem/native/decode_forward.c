/* The decoder stack for short steps on the CPU, in one call: every layer of a forward whose batch holds at
 * most MAX_ROWS query rows, all of them short queries (decodes, speculative verify rows).
 *
 * Why: at one to a few rows a layer is four weight-streaming products and ~20 small element-wise kernels
 * (norms, RoPE, the KV write, SiLU, residual adds) whose dispatch costs, as torch ops, far more than their
 * arithmetic; at SmolLM2's size that is most of a step beyond the weight read. Here the small work runs
 * inline on float32 scratch rows between the products (gemv.h), and attention is the paged kernel
 * (paged_attention.c, compiled into this library).
 *
 * Semantics: the same layer as tandem/model/layers.py (the reference): RMSNorm gains already folded into
 * the q/k/v and gate/up weights (weights.py), so a norm is x / hypot(|x|, eps_root); optional q/k/v and
 * o biases (Qwen2) and per-head q/k RMSNorm (Qwen3, Gemma 3); RoPE on interleaved pairs; K/V written at the
 * step's slots before attention; a gated MLP with SiLU or GELU-tanh (act); optional norms after attention
 * and after the MLP (Gemma 3's sandwich: x + unit_rms(y) * gain). Gemma 3's sliding-window layers: each
 * layer names its KV cache group, whose block table, slots and window its attention follows (groups
 * below, core/kv_cache_manager.py), and whether it takes the local RoPE rotations. Values are rounded to
 * the model dtype wherever the reference stores a tensor (after each product, norm, RoPE and activation),
 * so a bf16 model sees the reference's roundings.
 *
 * Memory: decode_forward.py checks every shape, dtype and layout; slots and table entries are clamped.
 */
#include <math.h>

#include "gemv.h"
#include "paged_attention.c"
#include "quant.h"

#define TANDEM_DECODE_FORWARD_ABI 7
#define MAX_ROWS 256 /* short steps: decode rows and verify rows; the products take them QMAX_ROWS /
                       * GEMV_MAX_ROWS at a time (layer_product), and Python decides how many a model's stack
                       * takes (native_decode.py: stack_rows) */
#define PAR_ROWS 4  /* the element-wise work between the products is split over the threads from this many rows */
#define LAYER_PTRS 21 /* qkv, qkv_bias, qk_norm, o_proj, o_bias, gate_up, down, k_cache, v_cache, then the
                        * int8 weights' scales (qkv, o_proj, gate_up, down; 0 otherwise), then the
                        * block-quantized matrices' descriptors (quant.h; same order; 0 otherwise), then
                        * post_attn_norm, post_ffn_norm (0: none), the layer's KV cache group, and 1 where
                        * it takes the local RoPE rotations */
#define GROUP_FIELDS 10 /* per KV cache group: block_tables, bt_stride, seq_lens, req, q_start, q_len,
                         * num_reqs, slots, window, tree_masks (0: causal): the attention indices of
                         * tandem_paged_attention */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

typedef struct {
    int is_bf16; /* activations, KV cache and roundings */
    int wdt;     /* weights (gemv.h W_F32 / W_BF16): the activations' dtype, or bf16 under float32
                  * activations (a draft head, tandem_head_layer); a matrix whose scale pointer is set is
                  * int8 whatever this says */
    int64_t rows, hidden, heads, kv_heads, head_dim, inter;
    float eps_root, qk_eps, scale;
    int threads;
    int act; /* ACT_SILU or ACT_GELU_TANH */
} Shape;

/* The dtype of the matrix whose scale pointer is ``scale``: int8 where it has scales, else the layer's. */
static inline int matrix_dtype(const Shape *s, int64_t scale) { return scale ? W_INT8 : s->wdt; }

/* y[r * ldy + o] = x[r] . W_m[o] for the layer's matrix m (0 qkv, 1 o_proj, 2 gate_up, 3 down): a GGUF
 * block-quantized matrix where it has a descriptor (its input gain applied by q_gemv), else gemv_rows in the
 * matrix's dtype; in slices of as many rows as those kernels take (each row's result is the same in any
 * slice: block_quant_linear.py's _in_slices runs the torch layers' wide products so). Returns 0 or a
 * negative error. */
static int layer_product(const Shape *s, const int64_t *lp, int m, const float *x, int64_t in, int64_t out,
                         float *y, int64_t ldy) {
    static const int weight_slot[4] = {0, 3, 5, 6};
    const int64_t slice = lp[13 + m] ? QMAX_ROWS : GEMV_MAX_ROWS;
    for (int64_t r0 = 0; r0 < s->rows; r0 += slice) {
        const int64_t n = s->rows - r0 < slice ? s->rows - r0 : slice;
        const int rc = lp[13 + m] ? q_gemv((const int64_t *)lp[13 + m], x + r0 * in, n, y + r0 * ldy, ldy, s->threads)
                                  : gemv_rows(x + r0 * in, n, in, (const void *)lp[weight_slot[m]],
                                              (const float *)lp[9 + m], out, matrix_dtype(s, lp[9 + m]),
                                              y + r0 * ldy, ldy, s->threads);
        if (rc) return rc;
    }
    return 0;
}

static inline void store_elem(void *base, int64_t i, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(v);
    else
        ((float *)base)[i] = v;
}

/* dst[r] = x[r] / hypot(|x[r]|, eps_root), rounded to the model dtype (the reference's unit_rms). */
static void unit_rms_rows(const Shape *s, const float *x, float *dst) {
#pragma omp parallel for num_threads(s->threads) schedule(static) if (s->rows >= PAR_ROWS)
    for (int64_t r = 0; r < s->rows; r++) {
        const float *xr = x + r * s->hidden;
        double ss = 0.0;
        for (int64_t i = 0; i < s->hidden; i++) ss += (double)xr[i] * xr[i];
        const float norm = round_to(sqrtf((float)ss), s->is_bf16);
        const float denom = round_to(hypotf(norm, s->eps_root), s->is_bf16);
        for (int64_t i = 0; i < s->hidden; i++) dst[r * s->hidden + i] = round_to(xr[i] / denom, s->is_bf16);
    }
}

/* q, k, v of every row from the layer's (normed) input hin [rows, in_width]: product (+ bias), per-head
 * norm, RoPE; q to q_out, k and v to their slots. */
static int attention_inputs(const Shape *s, const int64_t *lp, const float *hin, int64_t in_width,
                             float *qkv, const float *rot, const int64_t *slots, int64_t num_slots,
                             void *q_out) {
    const int bf = s->is_bf16;
    const int64_t hd = s->head_dim, nqk = s->heads + s->kv_heads, width = (nqk + s->kv_heads) * hd;
    const void *bias = (const void *)lp[1], *qk_norm = (const void *)lp[2];
    void *k_cache = (void *)lp[7], *v_cache = (void *)lp[8];
    if (layer_product(s, lp, 0, hin, in_width, width, qkv, width)) return -2;
#pragma omp parallel for num_threads(s->threads) schedule(static) if (s->rows >= PAR_ROWS)
    for (int64_t r = 0; r < s->rows; r++) {
        float *row = qkv + r * width;
        for (int64_t j = 0; j < width; j++)
            row[j] = round_to(row[j] + (bias ? load_elem(bias, j, bf) : 0.0f), bf);
        const int64_t slot = clamp64(slots[r], 0, num_slots - 1);
        for (int64_t h = 0; h < nqk; h++) {
            float *v = row + h * hd;
            if (qk_norm) {
                double ss = 0.0;
                for (int64_t d = 0; d < hd; d++) ss += (double)v[d] * v[d];
                const float inv = 1.0f / sqrtf((float)(ss / hd) + s->qk_eps);
                for (int64_t d = 0; d < hd; d++) v[d] = round_to(round_to(v[d] * inv, bf) * load_elem(qk_norm, h * hd + d, bf), bf);
            }
            const float *c = rot + r * hd; /* [hd / 2] (cos, sin) pairs of this row's position */
            for (int64_t d = 0; d < hd; d += 2) {
                const float a = v[d], b = v[d + 1], cs = c[d], sn = c[d + 1];
                v[d] = round_to(a * cs - b * sn, bf);
                v[d + 1] = round_to(a * sn + b * cs, bf);
            }
            if (h < s->heads) {
                for (int64_t d = 0; d < hd; d++) store_elem(q_out, (r * s->heads + h) * hd + d, v[d], bf);
            } else {
                const int64_t at = (slot * s->kv_heads + (h - s->heads)) * hd;
                for (int64_t d = 0; d < hd; d++) store_elem(k_cache, at + d, v[d], bf);
            }
        }
        const float *vv = row + nqk * hd;
        for (int64_t j = 0; j < s->kv_heads * hd; j++) store_elem(v_cache, slot * s->kv_heads * hd + j, vv[j], bf);
    }
    return 0;
}

/* x[r] += y[r] (+ bias), or with a post-norm gain (Gemma 3) x[r] += unit_rms(y[r]) * gain; y is a product's
 * float32 output [rows, hidden], rounded here as the reference stores it. */
static void residual_add(const Shape *s, float *x, float *y, float *tmp, const void *bias, const void *post_norm) {
    const int bf = s->is_bf16;
    const int64_t h = s->hidden;
    if (post_norm) {
        for (int64_t i = 0; i < s->rows * h; i++) y[i] = round_to(y[i] + (bias ? load_elem(bias, i % h, bf) : 0.0f), bf);
        unit_rms_rows(s, y, tmp);
#pragma omp parallel for num_threads(s->threads) schedule(static) if (s->rows >= PAR_ROWS)
        for (int64_t r = 0; r < s->rows; r++)
            for (int64_t i = 0; i < h; i++)
                x[r * h + i] = round_to(x[r * h + i] + tmp[r * h + i] * load_elem(post_norm, i, bf), bf);
        return;
    }
#pragma omp parallel for num_threads(s->threads) schedule(static) if (s->rows >= PAR_ROWS)
    for (int64_t r = 0; r < s->rows; r++)
        for (int64_t i = 0; i < h; i++)
            x[r * h + i] = round_to(x[r * h + i] + y[r * h + i] + (bias ? load_elem(bias, i, bf) : 0.0f), bf);
}

/* The gate's activation, as torch computes it in float32: SiLU, or GELU with the tanh approximation. */
static inline float activation(float g, int act) {
    if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}

/* x += o_proj(attn) (+ o bias | post-attention norm); x += down(act(gate) * up)(norm(x)) (| post-MLP norm).
 * x is float32 holding dtype-rounded values. */
static int mlp_block(const Shape *s, const int64_t *lp, float *x, const void *attn, float *abuf,
                      float *hbuf, float *gu, float *act) {
    const int bf = s->is_bf16;
    const int64_t h = s->hidden, a = s->heads * s->head_dim, inter = s->inter;
    for (int64_t i = 0; i < s->rows * a; i++) abuf[i] = load_elem(attn, i, bf);
    if (layer_product(s, lp, 1, abuf, a, h, hbuf, h)) return -2;
    residual_add(s, x, hbuf, abuf, (const void *)lp[4], (const void *)lp[17]);
    unit_rms_rows(s, x, hbuf);
    if (layer_product(s, lp, 2, hbuf, h, 2 * inter, gu, 2 * inter)) return -2;
#pragma omp parallel for num_threads(s->threads) schedule(static) if (s->rows >= PAR_ROWS)
    for (int64_t r = 0; r < s->rows; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        for (int64_t i = 0; i < inter; i++) {
            const float ai = round_to(activation(round_to(g[i], bf), s->act), bf);
            act[r * inter + i] = round_to(ai * round_to(u[i], bf), bf);
        }
    }
    if (layer_product(s, lp, 3, act, inter, h, hbuf, h)) return -2;
    residual_add(s, x, hbuf, abuf, 0, (const void *)lp[18]);
    return 0;
}

int tandem_decode_forward_abi(void) { return TANDEM_DECODE_FORWARD_ABI; }
int tandem_decode_forward_max_rows(void) { return MAX_ROWS; }

/* x: [rows, hidden] dense, the embedded tokens in, the residual stream after the last layer out.
 * layer_ptrs: [num_layers, LAYER_PTRS] addresses (0 for an absent bias / norm). rot, rot_local: [rows,
 * head_dim] float32 (cos, sin) pairs of the global and the sliding-window layers (the same pointer where
 * the model has one RoPE base). groups: [num_groups, GROUP_FIELDS], each KV cache group's attention indices
 * as tandem_paged_attention takes them, and its slots. aux: [num_layers] addresses of [rows, hidden] outputs
 * for the residual stream after that layer, or 0. Returns 0, -1 for rows outside 1..MAX_ROWS, -2 when out of
 * memory. */
int tandem_decode_forward(
    int is_bf16, int act, int64_t num_layers, const int64_t *layer_ptrs, void *x, int64_t rows, int64_t hidden,
    int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter, float eps_root, float qk_eps,
    const float *rot, const float *rot_local, int64_t num_blocks, int64_t block_size, const int64_t *groups,
    int64_t num_groups, float scale, const int64_t *aux, int num_threads) {
    if (rows < 1 || rows > MAX_ROWS || num_groups < 1) return -1;
    const Shape s = {is_bf16, is_bf16 ? W_BF16 : W_F32, rows, hidden, heads, kv_heads, head_dim, inter, eps_root,
                     qk_eps, scale, num_threads, act};
    const int64_t a = heads * head_dim, width = (heads + 2 * kv_heads) * head_dim;
    const int64_t wide = hidden > a ? hidden : a;
    const size_t floats = (size_t)(rows * (hidden + 2 * wide + width + 3 * inter));
    const size_t elem = is_bf16 ? 2 : 4;
    char *mem = malloc(floats * sizeof(float) + 2 * (size_t)(rows * a) * elem);
    if (!mem) return -2;
    float *xf = (float *)mem, *hbuf = xf + rows * hidden, *abuf = hbuf + rows * wide;
    float *qkv = abuf + rows * wide, *gu = qkv + rows * width, *act_buf = gu + rows * 2 * inter;
    void *q = act_buf + rows * inter, *attn = (char *)q + (size_t)(rows * a) * elem;
    for (int64_t i = 0; i < rows * hidden; i++) xf[i] = load_elem(x, i, is_bf16);
    int rc = 0;
    for (int64_t l = 0; l < num_layers && rc == 0; l++) {
        const int64_t *lp = layer_ptrs + l * LAYER_PTRS;
        const int64_t *g = groups + clamp64(lp[19], 0, num_groups - 1) * GROUP_FIELDS;
        unit_rms_rows(&s, xf, hbuf);
        rc = attention_inputs(&s, lp, hbuf, hidden, qkv, lp[20] ? rot_local : rot, (const int64_t *)g[7],
                              num_blocks * block_size, q);
        if (rc != 0) break;
        rc = tandem_paged_attention(is_bf16, q, a, attn, a, (const void *)lp[7], (const void *)lp[8],
                                    num_blocks, block_size, (const int64_t *)g[0], g[1], (const int64_t *)g[2],
                                    (const int64_t *)g[3], (const int64_t *)g[4], (const int64_t *)g[5], g[6],
                                    heads, kv_heads, head_dim, scale, g[8], (const int64_t *)g[9], num_threads);
        if (rc != 0) break;
        rc = mlp_block(&s, lp, xf, attn, abuf, hbuf, gu, act_buf);
        if (aux && aux[l])
            for (int64_t i = 0; i < rows * hidden; i++) store_elem((void *)aux[l], i, xf[i], is_bf16);
    }
    for (int64_t i = 0; i < rows * hidden; i++) store_elem(x, i, xf[i], is_bf16);
    free(mem);
    return rc == 0 ? 0 : -2;
}

/* One decoder layer whose attention input is given: a draft head's layer (EAGLE, EAGLE-3, MTP), where the
 * input is a fusion of the token's embedding and a feature rather than the norm of the residual stream; a
 * Llama layer (SwiGLU, pre-norms only: its table's post-norm entries are 0).
 * x: [rows, hidden] the residual stream (float32 or bf16, is_bf16), updated in place; attn_in:
 * [rows, in_width] float32 or bf16 like x, the layer's attention input (the head computed and normed it);
 * the weights (wdt, gemv.h W_F32 / W_BF16: the activations' dtype, or bf16 under float32 activations;
 * any matrix with scales int8) as in tandem_decode_forward, the gate/up gain folded in; one layer's pointers;
 * tree_masks as tandem_paged_attention takes them (a draft tree's level), or NULL. Returns as
 * tandem_decode_forward. */
int tandem_head_layer(
    int is_bf16, int wdt, const int64_t *layer_ptrs, void *x, const void *attn_in, int64_t in_width,
    int64_t rows, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter,
    float eps_root, const float *rot, const int64_t *slots, int64_t num_blocks, int64_t block_size,
    const int64_t *block_tables, int64_t bt_stride, const int64_t *seq_lens, const int64_t *req,
    const int64_t *q_start, const int64_t *q_len, int64_t num_reqs, float scale, const int64_t *tree_masks,
    int num_threads) {
    if (rows < 1 || rows > MAX_ROWS) return -1;
    const Shape s = {is_bf16, wdt, rows, hidden, heads, kv_heads, head_dim, inter, eps_root, 0.0f, scale, num_threads,
                     ACT_SILU};
    const int64_t a = heads * head_dim, width = (heads + 2 * kv_heads) * head_dim;
    const int64_t wide = hidden > a ? hidden : a;
    const size_t floats = (size_t)(rows * (hidden + 2 * wide + in_width + width + 3 * inter));
    const size_t elem = is_bf16 ? 2 : 4;
    char *mem = malloc(floats * sizeof(float) + 2 * (size_t)(rows * a) * elem);
    if (!mem) return -2;
    float *xf = (float *)mem, *hbuf = xf + rows * hidden, *abuf = hbuf + rows * wide;
    float *hin = abuf + rows * wide, *qkv = hin + rows * in_width, *gu = qkv + rows * width;
    float *act = gu + rows * 2 * inter;
    void *q = act + rows * inter, *attn = (char *)q + (size_t)(rows * a) * elem;
    for (int64_t i = 0; i < rows * hidden; i++) xf[i] = load_elem(x, i, is_bf16);
    for (int64_t i = 0; i < rows * in_width; i++) hin[i] = load_elem(attn_in, i, is_bf16);
    int rc = attention_inputs(&s, layer_ptrs, hin, in_width, qkv, rot, slots, num_blocks * block_size, q);
    if (rc == 0)
        rc = tandem_paged_attention(is_bf16, q, a, attn, a, (const void *)layer_ptrs[7], (const void *)layer_ptrs[8],
                                    num_blocks, block_size, block_tables, bt_stride, seq_lens, req, q_start,
                                    q_len, num_reqs, heads, kv_heads, head_dim, scale, 0, tree_masks, num_threads);
    if (rc == 0) rc = mlp_block(&s, layer_ptrs, xf, attn, abuf, hbuf, gu, act);
    if (rc == 0)
        for (int64_t i = 0; i < rows * hidden; i++) store_elem(x, i, xf[i], is_bf16);
    free(mem);
    return rc == 0 ? 0 : -2;
}

/* torch's F.rms_norm of one float32 row: x * rsqrt(mean(x^2) + eps) * w (w NULL: no gain). */
static void rms_row(const float *x, int64_t n, const float *w, float eps, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

/* EAGLE-3's attention input (spec_decode/head.py, DraftHead.layer_input): out [rows, 2 * hidden] holds, per
 * row, rms_norm(a[r]) * wa beside rms_norm(b[r]) * wb (a: the token's embedding, b: the feature; float32). */
void tandem_head_rms_pair(const float *a, const float *b, int64_t rows, int64_t hidden, const float *wa,
                          const float *wb, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        rms_row(a + r * hidden, hidden, wa, eps, out + r * 2 * hidden);
        rms_row(b + r * hidden, hidden, wb, eps, out + r * 2 * hidden + hidden);
    }
}

/* A draft head's drafts from its outputs h [rows, hidden] (float32): each row through the final norm (norm_w,
 * or NULL where the head has none) and the draft LM head (lm_w [vd, hidden] in wdt, gemv.h; int8 with lm_scale
 * [vd]; or GGUF blocks, quant.h's descriptor lm_desc, where that is not NULL), then
 * - out_lp NULL (DraftHead.draft_tokens): the first maximal logit, mapped to a target id by draft_map [vd]
 *   (NULL: the identity), into out_ids [rows];
 * - out_lp given (a draft tree's level, TreeDrafter): the top_k largest logits, best first (equal logits: the
 *   lower id first), their draft ids (mapped where draft_map is given) into out_ids [rows, top_k] and their
 *   log-probabilities (logit - log-sum-exp of the row) into out_lp [rows, top_k].
 * Drafts only propose: a NaN logit, which the fast-math build does not look for, can cost acceptance and
 * nothing else. logits_out [rows, vd]: the logits too, or NULL. Returns 0, -1 for rows outside
 * 1..GEMV_MAX_ROWS or top_k outside 1..vd, -2 when out of memory. */
int tandem_head_tokens(const float *h, int64_t rows, int64_t hidden, const float *norm_w, float eps,
                       const void *lm_w, const float *lm_scale, int wdt, const int64_t *lm_desc, int64_t vd,
                       const int64_t *draft_map, int64_t top_k, int64_t *out_ids, float *out_lp,
                       float *logits_out, int num_threads) {
    if (rows < 1 || rows > GEMV_MAX_ROWS || top_k < 1 || top_k > vd) return -1;
    float *xn = malloc((size_t)(rows * hidden) * sizeof(float));
    float *logits = logits_out ? logits_out : malloc((size_t)(rows * vd) * sizeof(float));
    int rc = xn && logits ? 0 : -2;
    if (rc == 0) {
        for (int64_t r = 0; r < rows; r++) {
            if (norm_w)
                rms_row(h + r * hidden, hidden, norm_w, eps, xn + r * hidden);
            else
                memcpy(xn + r * hidden, h + r * hidden, (size_t)hidden * sizeof(float));
        }
        rc = lm_desc ? q_gemv(lm_desc, xn, rows, logits, vd, num_threads)
                     : gemv_rows(xn, rows, hidden, lm_w, lm_scale, vd, wdt, logits, vd, num_threads);
    }
    for (int64_t r = 0; rc == 0 && r < rows; r++) {
        const float *l = logits + r * vd;
        if (!out_lp) {
            int64_t best = 0;
            for (int64_t i = 1; i < vd; i++)
                if (l[i] > l[best]) best = i;
            out_ids[r] = draft_map ? draft_map[best] : best;
            continue;
        }
        int64_t *ids = out_ids + r * top_k;
        int64_t n = 0; /* ids[0 .. n): the best so far, best first; a later equal logit ranks after */
        float top = l[0];
        for (int64_t i = 0; i < vd; i++) {
            top = l[i] > top ? l[i] : top;
            if (n == top_k && !(l[i] > l[ids[n - 1]])) continue;
            int64_t j = n < top_k ? n++ : top_k - 1;
            while (j > 0 && l[i] > l[ids[j - 1]]) ids[j] = ids[j - 1], j--;
            ids[j] = i;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < vd; i++) sum += exp((double)(l[i] - top));
        const float lse = top + (float)log(sum);
        for (int64_t j = 0; j < top_k; j++) {
            out_lp[r * top_k + j] = l[ids[j]] - lse;
            if (draft_map) ids[j] = draft_map[ids[j]];
        }
    }
    free(xn);
    if (!logits_out) free(logits);
    return rc;
}
