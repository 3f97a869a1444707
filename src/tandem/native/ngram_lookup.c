/* N-gram prompt lookup (spec_decode/ngram.py, propose_ngram; its torch ops are the reference and the path off
 * the CPU): per request, the tokens that followed the most recent earlier occurrence of the context's longest
 * suffix n-gram, n from max_n down to min_n.
 *
 * One call instead of ~30 small tensor ops (~0.3 ms a step at four requests on a two-core CPU, where the search
 * itself is a few thousand integer compares). The reference's window: a row is searched within its last
 * `width` tokens (width >= its length: the host's upper bound on the contexts); an n-gram is tried only where
 * n < width and the row is longer than n; a match starts at token index i, with max(0, length - width) <= i <=
 * length - n - 1 (the suffix itself excluded), the latest such i wins, and its continuation is tokens i + n ..
 * of the row, cut at the row's length, at max_drafts[b] and at k; -1 fills the rest. */
#include <stdint.h>

int tandem_ngram_lookup_abi(void) { return 1; }

/* tokens: the batch's token table, row r at tokens + r * row_stride, rows_total rows of row_width columns;
 * num_tokens [rows_total] each row's length; slots / max_drafts [B]; out [B, k]. Returns 0, or 1 where a slot
 * or a row's length is outside the table or past width (out is then undefined). */
int tandem_ngram_lookup(int64_t B, const int64_t *tokens, int64_t row_stride, int64_t rows_total, int64_t row_width,
                        const int64_t *num_tokens, const int64_t *slots, int64_t width, int64_t min_n,
                        int64_t max_n, const int64_t *max_drafts, int64_t k, int64_t *out) {
    for (int64_t b = 0; b < B; b++) {
        int64_t *o = out + b * k;
        for (int64_t j = 0; j < k; j++) o[j] = -1;
        int64_t slot = slots[b];
        if (slot < 0 || slot >= rows_total) return 1;
        int64_t len = num_tokens[slot];
        if (len < 0 || len > width || len > row_width) return 1;
        const int64_t *t = tokens + slot * row_stride;
        int64_t lo = len - width > 0 ? len - width : 0;
        int64_t found = -1;  /* the continuation's first token index */
        for (int64_t n = max_n; n >= min_n && found < 0; n--) {
            if (n >= width || len <= n) continue;
            const int64_t *suffix = t + len - n;
            for (int64_t i = len - n - 1; i >= lo; i--) {
                int64_t m = 0;
                while (m < n && t[i + m] == suffix[m]) m++;
                if (m == n) {
                    found = i + n;
                    break;
                }
            }
        }
        if (found < 0) continue;
        int64_t cap = max_drafts[b] < k ? max_drafts[b] : k;
        for (int64_t j = 0; j < cap && found + j < len; j++) o[j] = t[found + j];
    }
    return 0;
}
