/* Rows of the paged KV cache moved in place: a tree step's accepted branch, written at its nodes' slots,
 * copied to the sequence's next positions in every layer's K and V (model/forward_batch.py, KVCache.move_rows).
 *
 * One call for all layers instead of an index_select + index_copy_ pair per tensor (60 pairs for a 30-layer
 * model, ~0.5 ms of operator overhead a tree step on a two-core CPU; the bytes moved are a few kB). Per
 * tensor every source row is read before any destination row is written, so sources and destinations may
 * overlap, as in the torch reference. Nothing is written unless every slot is in range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int tandem_kv_rows_abi(void) { return 2; }

/* bases[t]: tensor t's first byte (n_rows rows of row_bytes each); src[i] -> dst[i] for i < n.
 * Returns 0; -1 when a slot is out of range (nothing written); -2 when no scratch memory. */
int tandem_kv_move_rows(void *const *bases, int64_t n_tensors, int64_t n_rows, int64_t row_bytes,
                        const int64_t *src, const int64_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= n_rows || dst[i] < 0 || dst[i] >= n_rows) return -1;
    int64_t moved = 0;
    for (int64_t i = 0; i < n; i++) moved += src[i] != dst[i];
    if (!moved) return 0;
    char *scratch = malloc((size_t)(n * row_bytes));
    if (!scratch) return -2;
    for (int64_t t = 0; t < n_tensors; t++) {
        char *base = (char *)bases[t];
        for (int64_t i = 0; i < n; i++)
            memcpy(scratch + i * row_bytes, base + src[i] * row_bytes, (size_t)row_bytes);
        for (int64_t i = 0; i < n; i++)
            if (src[i] != dst[i]) memcpy(base + dst[i] * row_bytes, scratch + i * row_bytes, (size_t)row_bytes);
    }
    free(scratch);
    return 0;
}

/* A tree step's accepted branches: request b (row rows[b] of the block tables [n_tables, bt_stride], clamped
 * into them) accepted nodes nodes[b][0 .. D) (-1 padded), written at keys root[b] + node; they move to keys
 * root[b] + 1 + i. The
 * slots come through the block table (a block index past the table reads its last column, a pair past the
 * accepted count copies a row onto itself), then as tandem_kv_move_rows. Returns as that, -2 also when no
 * scratch memory. */
int tandem_kv_move_branches(void *const *bases, int64_t n_tensors, int64_t n_rows, int64_t row_bytes,
                            int64_t block_size, const int64_t *tables, int64_t n_tables, int64_t bt_stride,
                            const int64_t *rows, const int64_t *root, const int64_t *nodes, int64_t B, int64_t D) {
    int64_t *slots = malloc((size_t)(2 * B * D + 1) * sizeof(int64_t));
    if (!slots) return -2;
    int64_t *src = slots, *dst = slots + B * D;
    for (int64_t b = 0; b < B; b++) {
        const int64_t row = rows[b] < 0 ? 0 : (rows[b] >= n_tables ? n_tables - 1 : rows[b]);
        const int64_t *table = tables + row * bt_stride;
        for (int64_t i = 0; i < D; i++) {
            const int64_t node = nodes[b * D + i], to = root[b] + 1 + i, from = node >= 0 ? root[b] + node : to;
            int64_t bf = from < 0 ? -1 : from / block_size, bt = to < 0 ? -1 : to / block_size;
            bf = bf >= bt_stride ? bt_stride - 1 : bf;
            bt = bt >= bt_stride ? bt_stride - 1 : bt;
            src[b * D + i] = bf < 0 ? -1 : table[bf] * block_size + from % block_size;
            dst[b * D + i] = bt < 0 ? -1 : table[bt] * block_size + to % block_size;
        }
    }
    const int rc = tandem_kv_move_rows(bases, n_tensors, n_rows, row_bytes, src, dst, B * D);
    free(slots);
    return rc;
}
