/* A draft tree's bookkeeping between the head's levels (spec_decode/tree_draft.py, expand_tree; its torch
 * code is the reference and the path off the CPU): which nodes a level expands, what their head rows take,
 * the children the head's top candidates make, and the verified nodes' numbering at the end.
 *
 * One call per piece instead of a dozen small tensor ops each (~250 operator calls a step for a 2-wide tree
 * of depth 3, ~1 ms on a two-core CPU; the data are a few hundred numbers). The state is the reference's:
 * per request b and created node c (row-major [B, C]) its target token, score (the draft's cumulative
 * log-probability of its path, float32), parent (creation index, -1 the root), depth, expanded ancestors'
 * slots (int64 bits: bit 62 - s for slot s) and its own expansion slot (-1: not expanded).
 *
 * Order and ties: a level expands its nodes best score first; equal scores go to the lower creation index,
 * as do equal ranks when the verified nodes are chosen. Float operations are the reference's: a child's
 * score is its parent's plus its log-probability, a node's rank score - 1e-4 * depth. */
#include <stdint.h>
#include <stdlib.h>

int tandem_tree_expand_abi(void) { return 2; }

/* Whether node a ranks before node b by value (higher first; equal values: lower index first). */
static inline int before(float va, int64_t a, float vb, int64_t b) { return va > vb || (va == vb && a < b); }

/* The n best of v[lo .. hi) into out[0 .. n), best first (n <= hi - lo; a selection, n is small). */
static void best_of(const float *v, int64_t lo, int64_t hi, int64_t n, int64_t *out) {
    if (n < 1) return;
    int64_t m = 0;
    for (int64_t c = lo; c < hi; c++) {
        int64_t j = m < n ? m++ : n;
        if (j == n && !before(v[c], c, v[out[n - 1]], out[n - 1])) continue;
        if (j == n) j = n - 1;
        while (j > 0 && before(v[c], c, v[out[j - 1]], out[j - 1])) out[j] = out[j - 1], j--;
        out[j] = c;
    }
}

/* Level expansion: the e best nodes of [lo, hi) of each request get slots slot0 .. slot0 + e - 1. Writes x
 * [B, e] (their creation indices), ids and depths (their tokens and depths), src (the row of the head output
 * their parent's row left in a [B, 1 + S] table: b * (1 + S) + 0 for the root, + 1 + s for slot s) and
 * anc_rows (their ancestors' slots and their own), and records the slots in slot_of. */
void tandem_tree_select(int64_t B, int64_t C, int64_t S, int64_t lo, int64_t hi, int64_t e, int64_t slot0,
                        const float *score, const int64_t *tok, const int64_t *parent, const int64_t *depth,
                        const int64_t *anc, int64_t *slot_of, int64_t *x, int64_t *ids, int64_t *depths,
                        int64_t *src, int64_t *anc_rows) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = b * C;
        int64_t *xb = x + b * e;
        best_of(score + o, lo, hi, e, xb);
        for (int64_t j = 0; j < e; j++) {
            const int64_t c = xb[j], p = parent[o + c], slot = slot0 + j;
            ids[b * e + j] = tok[o + c];
            depths[b * e + j] = depth[o + c];
            src[b * e + j] = b * (1 + S) + (p < 0 ? 0 : 1 + slot_of[o + p]);
            anc_rows[b * e + j] = anc[o + c] | (int64_t)1 << (62 - slot);
            slot_of[o + c] = slot;
        }
    }
}

/* The children of the e expanded nodes x [B, e] (NULL: the root, score 0, no ancestors): node j's k
 * candidates lv / li [B * e, k] (log-probabilities, draft ids; draft_map [n_map]: their target ids, NULL the
 * identity; an id outside it is clamped into it) become nodes created + j * k + c at depth ``level``. */
void tandem_tree_record(int64_t B, int64_t C, int64_t created, int64_t e, int64_t k, const int64_t *x,
                        const float *lv, const int64_t *li, const int64_t *draft_map, int64_t n_map, int64_t level,
                        const int64_t *anc_rows, int64_t *tok, float *score, int64_t *parent, int64_t *depth,
                        int64_t *anc) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = b * C;
        for (int64_t j = 0; j < e; j++) {
            const int64_t p = x ? x[b * e + j] : -1;
            const float base = p < 0 ? 0.0f : score[o + p];
            for (int64_t c = 0; c < k; c++) {
                const int64_t n = o + created + j * k + c, r = (b * e + j) * k + c;
                const int64_t d = li[r] < 0 ? 0 : (li[r] >= n_map ? n_map - 1 : li[r]);
                tok[n] = draft_map ? draft_map[d] : li[r];
                score[n] = p < 0 ? lv[r] : base + lv[r];
                parent[n] = p;
                depth[n] = level;
                anc[n] = anc_rows ? anc_rows[b * e + j] : 0;
            }
        }
    }
}

/* The verified nodes: the m best ranks (score - 1e-4 * depth) of each request's C nodes, numbered 1 .. m by
 * depth, then creation; out_parents their parents' numbers (0: the root). Returns 0, or -2 without scratch. */
int tandem_tree_finish(int64_t B, int64_t C, int64_t m, const float *score, const int64_t *tok,
                       const int64_t *parent, const int64_t *depth, int64_t *out_tokens, int64_t *out_parents,
                       int64_t *out_depths) {
    float *rank = malloc((size_t)C * sizeof(float));
    int64_t *keep = malloc((size_t)(m + C) * sizeof(int64_t)), *number = keep + m;
    if (!rank || !keep) {
        free(rank);
        free(keep);
        return -2;
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t o = b * C;
        for (int64_t c = 0; c < C; c++) rank[c] = score[o + c] - (float)depth[o + c] * 1e-4f;
        best_of(rank, 0, C, m, keep);
        for (int64_t i = 1; i < m; i++) { /* by depth, then creation: an insertion sort of m nodes */
            const int64_t c = keep[i];
            int64_t j = i;
            while (j > 0 && (depth[o + keep[j - 1]] > depth[o + c] ||
                             (depth[o + keep[j - 1]] == depth[o + c] && keep[j - 1] > c)))
                keep[j] = keep[j - 1], j--;
            keep[j] = c;
        }
        for (int64_t c = 0; c < C; c++) number[c] = 0;
        for (int64_t i = 0; i < m; i++) number[keep[i]] = i + 1;
        for (int64_t i = 0; i < m; i++) {
            const int64_t c = keep[i], p = parent[o + c];
            out_tokens[b * m + i] = tok[o + c];
            out_parents[b * m + i] = p < 0 ? 0 : number[p];
            out_depths[b * m + i] = depth[o + c];
        }
    }
    free(rank);
    free(keep);
    return 0;
}

/* A level's head rows as the attention takes them (TreeDrafter.head_step; one attention request a row):
 * row (b, j), slot s = slot0 + j, is written at key base[b] + s through request b's block table (tables
 * [B, W], a block index past it reads its last column; keys at or past ``limit`` >= 0 go to ``trash``),
 * sits at position root_pos[b] + depth - 1, sees keys up to its own (seq_lens) and, of the last 64, its
 * ancestors' slots and its own (anc_rows' bits, shifted to the tree mask's: bit s - a for slot a) and the
 * context before base[b]. out_tables [B * e, W]: each row's request's table. */
void tandem_tree_rows(int64_t B, int64_t e, int64_t slot0, const int64_t *tables, int64_t W, int64_t block_size,
                      const int64_t *base, const int64_t *root_pos, const int64_t *depths, const int64_t *anc_rows,
                      int64_t limit, int64_t trash, int64_t *positions, int64_t *slot_map, int64_t *seq_lens,
                      int64_t *bits, int64_t *out_tables) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < e; j++) {
            const int64_t r = b * e + j, s = slot0 + j, key = base[b] + s;
            int64_t blk = key / block_size;
            blk = blk >= W ? W - 1 : (blk < 0 ? 0 : blk);
            slot_map[r] = limit >= 0 && key >= limit ? trash : tables[b * W + blk] * block_size + key % block_size;
            positions[r] = root_pos[b] + depths[r] - 1;
            seq_lens[r] = key + 1;
            bits[r] = (anc_rows[r] >> (62 - s)) | (int64_t)(~(uint64_t)0 << (s + 1));
            for (int64_t w = 0; w < W; w++) out_tables[r * W + w] = tables[b * W + w];
        }
}

/* Every tree row's tree mask (worker/tree_step.py, tree_bits: the reference): bits [B, N + 1] from the
 * nodes' parents and depths [B, N]; row 0 (the root) every bit, row j its parent p's shifted by j - p, and
 * bit 0 (itself). Levels in order from 1, a level's rows from the masks the level before left, stopping at
 * the first level past 1 that no request has; a row never reached keeps every bit. */
void tandem_tree_bits(int64_t B, int64_t N, const int64_t *parents, const int64_t *depths, int64_t *bits) {
    for (int64_t i = 0; i < B * (N + 1); i++) bits[i] = -1;
    int64_t next[64];
    for (int64_t level = 1; level <= N; level++) {
        int any = 0;
        for (int64_t i = 0; i < B * N && !any; i++) any = depths[i] == level;
        if (level > 1 && !any) break;
        for (int64_t b = 0; b < B; b++) {
            int64_t *row = bits + b * (N + 1);
            for (int64_t j = 1; j <= N; j++) {
                const int64_t p = parents[b * N + j - 1], shift = j - p;
                const uint64_t from = p < 0 || p > N || shift < 0 || shift > 63 ? 0 : (uint64_t)row[p] << shift;
                next[j] = depths[b * N + j - 1] == level ? (int64_t)(from | 1) : row[j];
            }
            for (int64_t j = 1; j <= N; j++) row[j] = next[j];
        }
    }
}

/* The head's pass over a tree step's rows (spec_decode/tree_propose.py, head_rows: the reference). Row r
 * (meta [5, R]: its request's slot, its target row, its offset, its request's index among the verdict's rows
 * (-1: not a verify's accepted path) and its plan) sits at base[plan] + offset on an accepted path, else at the
 * target row's position; its feature is the target row's, on an accepted path the accepted node's at depth
 * offset (nodes [Bv, D], -1 padded; NULL or D = 0: none); its token the one after its position in tokens [S, L]
 * (the last column: the trash); its K/V slot through table [S, W]; seq_lens[plan] its plan's last row's
 * position + 1. Returns 0, or -1 for an index outside its array (nothing is read there). */
int tandem_tree_head_rows(int64_t R, const int64_t *meta, int64_t P, const int64_t *base, int64_t T,
                          const int64_t *batch_pos, const int64_t *nodes, int64_t Bv, int64_t D,
                          const int64_t *tokens, int64_t S, int64_t L, const int64_t *table, int64_t W,
                          int64_t block_size, int64_t *positions, int64_t *ids, int64_t *slot_map,
                          int64_t *feat_rows, int64_t *seq_lens) {
    const int64_t *slot = meta, *target = meta + R, *offset = meta + 2 * R, *tree_b = meta + 3 * R,
                  *plan = meta + 4 * R;
    for (int64_t r = 0; r < R; r++) {
        const int64_t s = slot[r], t = target[r], p = plan[r], b = tree_b[r];
        if (s < 0 || s >= S || t < 0 || t >= T || p < 0 || p >= P || (nodes && D > 0 && b >= Bv)) return -1;
        const int64_t pos = b >= 0 ? base[p] + offset[r] : batch_pos[t];
        int64_t feat = t;
        if (b >= 0 && offset[r] > 0 && nodes && D > 0) {
            const int64_t d = offset[r] - 1 < D ? offset[r] - 1 : D - 1, node = nodes[b * D + d];
            if (node > 0) feat += node;
        }
        const int64_t blk = pos / block_size;
        if (pos < 0 || blk >= W || feat >= T) return -1;
        positions[r] = pos;
        ids[r] = tokens[s * L + (pos + 1 < L - 1 ? pos + 1 : L - 1)];
        slot_map[r] = table[s * W + blk] * block_size + pos % block_size;
        feat_rows[r] = feat;
        seq_lens[p] = pos + 1;
    }
    return 0;
}
