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

int tandem_kv_rows_abi(void) { return 1; }

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
