/* Suffix decoding's index (spec_decode/suffix.py) in C: context hash -> {next token: count}, and the drafting
 * loop over a request's own index and the global one. The Python reference (``SuffixIndex``,
 * ``SuffixProposer.draft``) defines the results; this file computes the same ones (tests/native/
 * test_suffix_index.py compares them draft by draft) without an interpreter step per dictionary operation —
 * the index takes ~24 updates a committed token, which cost ~5 % of a step at 4 streams in Python.
 *
 * Hashes: tokens t[end-n .. end-1] hash to sum_{i=1..n} (t[end-i] + 1) * BASE^(i-1) mod 2^61 - 1, shortest
 * context first, as ``_context_hashes``.
 * Table: open addressing (linear probing) over 64-bit keys; a slot's head is EMPTY (never used), NONE (a key
 * whose continuations were all removed) or the first node of its continuation list. Nodes (token, count, next)
 * live in one pool with a free list. Keys are never deleted one by one: when used slots pass 70 % of the
 * table it is rebuilt from the keys that still have continuations (doubling only if they need it), so an
 * index that keeps evicting (the global one) stays bounded.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SX_MOD ((1ULL << 61) - 1)
#define SX_BASE 1000003ULL
#define SX_EMPTY (-2)
#define SX_NONE (-1)
#define SX_ABI 1

typedef struct {
    int depth;
    int bits;          /* cap = 1 << bits */
    int64_t cap, used, live;
    uint64_t *keys;
    int32_t *heads;
    int32_t *ntok, *ncnt, *nnext;
    int64_t ncap, nused;
    int32_t nfree;
} sx_index;

int sx_abi(void) { return SX_ABI; }

static inline uint64_t mulmod(uint64_t a, uint64_t b) {
    __uint128_t p = (__uint128_t)a * b;
    uint64_t r = (uint64_t)(p & SX_MOD) + (uint64_t)(p >> 61);
    return r >= SX_MOD ? r - SX_MOD : r;
}

static inline uint64_t addmod(uint64_t a, uint64_t b) {
    uint64_t r = a + b;
    return r >= SX_MOD ? r - SX_MOD : r;
}

/* hs[n-1] = hash of t[end-n .. end-1], n = 1 .. min(depth, end); returns that count. */
static int context_hashes(const int32_t *t, int64_t end, int depth, uint64_t *hs) {
    uint64_t h = 0, power = 1;
    int n = 0;
    for (int64_t i = end - 1; i >= 0 && n < depth; i--) {
        h = addmod(h, mulmod((uint64_t)((int64_t)t[i] + 1), power));
        power = mulmod(power, SX_BASE);
        hs[n++] = h;
    }
    return n;
}

static inline uint64_t slot_of(uint64_t key, int bits) {
    return (key * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
}

static int alloc_table(sx_index *ix, int bits) {
    int64_t cap = (int64_t)1 << bits;
    uint64_t *keys = malloc((size_t)cap * sizeof *keys);
    int32_t *heads = malloc((size_t)cap * sizeof *heads);
    if (!keys || !heads) {
        free(keys);
        free(heads);
        return -1;
    }
    for (int64_t i = 0; i < cap; i++) heads[i] = SX_EMPTY;
    ix->keys = keys;
    ix->heads = heads;
    ix->bits = bits;
    ix->cap = cap;
    ix->used = 0;
    return 0;
}

void *sx_new(int depth) {
    sx_index *ix = calloc(1, sizeof *ix);
    if (!ix) return NULL;
    ix->depth = depth;
    ix->nfree = -1;
    if (alloc_table(ix, 10) != 0) {
        free(ix);
        return NULL;
    }
    return ix;
}

void sx_free(void *p) {
    sx_index *ix = p;
    if (!ix) return;
    free(ix->keys);
    free(ix->heads);
    free(ix->ntok);
    free(ix->ncnt);
    free(ix->nnext);
    free(ix);
}

int64_t sx_live(const void *p) { return ((const sx_index *)p)->live; }

int64_t sx_slots(const void *p) { return ((const sx_index *)p)->cap; }

static int64_t find(const sx_index *ix, uint64_t key) {
    uint64_t mask = (uint64_t)ix->cap - 1;
    for (uint64_t i = slot_of(key, ix->bits);; i = (i + 1) & mask) {
        if (ix->heads[i] == SX_EMPTY) return -1;
        if (ix->keys[i] == key) return (int64_t)i;
    }
}

static int rebuild(sx_index *ix) {
    int bits = ix->bits;
    while ((ix->live + 1) * 2 > ((int64_t)1 << bits)) bits++;  /* live keys at most half the new table */
    uint64_t *keys = ix->keys;
    int32_t *heads = ix->heads;
    int64_t cap = ix->cap;
    if (alloc_table(ix, bits) != 0) {
        ix->keys = keys;
        ix->heads = heads;
        return -1;
    }
    uint64_t mask = (uint64_t)ix->cap - 1;
    for (int64_t j = 0; j < cap; j++) {
        if (heads[j] < 0) continue;
        uint64_t i = slot_of(keys[j], ix->bits);
        while (ix->heads[i] != SX_EMPTY) i = (i + 1) & mask;
        ix->keys[i] = keys[j];
        ix->heads[i] = heads[j];
        ix->used++;
    }
    free(keys);
    free(heads);
    return 0;
}

/* The slot of ``key``, made (with no continuation) if absent; -1 when out of memory. */
static int64_t slot_for(sx_index *ix, uint64_t key) {
    if ((ix->used + 1) * 10 > ix->cap * 7 && rebuild(ix) != 0) return -1;
    uint64_t mask = (uint64_t)ix->cap - 1;
    uint64_t i = slot_of(key, ix->bits);
    for (; ix->heads[i] != SX_EMPTY; i = (i + 1) & mask)
        if (ix->keys[i] == key) return (int64_t)i;
    ix->keys[i] = key;
    ix->heads[i] = SX_NONE;
    ix->used++;
    return (int64_t)i;
}

static int32_t node_new(sx_index *ix, int32_t tok, int32_t next) {
    int32_t n = ix->nfree;
    if (n >= 0) {
        ix->nfree = ix->nnext[n];
    } else {
        if (ix->nused == ix->ncap) {
            int64_t cap = ix->ncap ? ix->ncap * 2 : 1024;
            if (cap > INT32_MAX) return -1;
            int32_t *a = realloc(ix->ntok, (size_t)cap * sizeof *a);
            if (!a) return -1;
            ix->ntok = a;
            a = realloc(ix->ncnt, (size_t)cap * sizeof *a);
            if (!a) return -1;
            ix->ncnt = a;
            a = realloc(ix->nnext, (size_t)cap * sizeof *a);
            if (!a) return -1;
            ix->nnext = a;
            ix->ncap = cap;
        }
        n = (int32_t)ix->nused++;
    }
    ix->ntok[n] = tok;
    ix->ncnt[n] = 1;
    ix->nnext[n] = next;
    return n;
}

static int count(sx_index *ix, uint64_t key, int32_t tok) {
    int64_t i = slot_for(ix, key);
    if (i < 0) return -1;
    for (int32_t n = ix->heads[i]; n >= 0; n = ix->nnext[n])
        if (ix->ntok[n] == tok) {
            ix->ncnt[n]++;
            return 0;
        }
    int32_t head = ix->heads[i];
    int32_t n = node_new(ix, tok, head >= 0 ? head : -1);
    if (n < 0) return -1;
    if (head < 0) ix->live++;
    ix->heads[i] = n;
    return 0;
}

static void uncount(sx_index *ix, uint64_t key, int32_t tok) {
    int64_t i = find(ix, key);
    if (i < 0) return;
    int32_t prev = -1;
    for (int32_t n = ix->heads[i]; n >= 0; prev = n, n = ix->nnext[n]) {
        if (ix->ntok[n] != tok) continue;
        if (--ix->ncnt[n] > 0) return;
        if (prev >= 0)
            ix->nnext[prev] = ix->nnext[n];
        else
            ix->heads[i] = ix->nnext[n] >= 0 ? ix->nnext[n] : SX_NONE;
        ix->nnext[n] = ix->nfree;
        ix->nfree = n;
        if (ix->heads[i] == SX_NONE) ix->live--;
        return;
    }
}

/* Count (sign > 0) or uncount the tokens t[start ..] after each of their contexts (t[0 .. n-1]); 0, or -1
 * when out of memory (the index then holds part of the additions). */
int sx_add(void *p, const int32_t *t, int64_t n, int64_t start, int sign) {
    sx_index *ix = p;
    uint64_t *hs = malloc((size_t)ix->depth * sizeof *hs);  /* the depth is the user's: not on the stack */
    if (!hs) return -1;
    for (int64_t pos = start > 1 ? start : 1; pos < n; pos++) {
        int m = context_hashes(t, pos, ix->depth, hs);
        for (int j = 0; j < m; j++) {
            if (sign > 0) {
                if (count(ix, hs[j], t[pos]) != 0) {
                    free(hs);
                    return -1;
                }
            } else {
                uncount(ix, hs[j], t[pos]);
            }
        }
    }
    free(hs);
    return 0;
}

/* The continuations of ``key``: up to ``cap`` (token, count) pairs; returns how many there are. */
int64_t sx_counts(const void *p, uint64_t key, int32_t *toks, int32_t *cnts, int64_t cap) {
    const sx_index *ix = p;
    int64_t i = find(ix, key), k = 0;
    if (i < 0) return 0;
    for (int32_t n = ix->heads[i]; n >= 0; n = ix->nnext[n], k++)
        if (k < cap) {
            toks[k] = ix->ntok[n];
            cnts[k] = ix->ncnt[n];
        }
    return k;
}

static int32_t head_of(const sx_index *ix, uint64_t key) {
    int64_t i = find(ix, key);
    return i < 0 ? SX_NONE : ix->heads[i];
}

/* Up to ``limit`` drafts continuing t[0 .. n-1] from ``own`` (counted ``own_weight`` times) and ``glob``
 * (may be NULL), as ``SuffixProposer.draft``: the longest context either has seen, the most frequent
 * continuation (ties: the smallest id), a running score of the chosen shares, stopping at the limit,
 * ``factor`` x the first match's length, or a score below ``min_prob``. Returns the number of drafts, or -1
 * when out of memory. Plain IEEE arithmetic for the score (no fast-math), as Python's floats. */
__attribute__((optimize("no-fast-math", "fp-contract=off")))
int sx_draft(const void *own_p, const void *glob_p, const int32_t *t, int64_t n, int limit, int own_weight,
             double factor, double min_prob, int32_t *out) {
    const sx_index *own = own_p, *glob = glob_p;
    int depth = own->depth;
    int64_t keep = n < depth ? n : depth;
    int32_t *ctx = malloc((size_t)(keep + (limit > 0 ? limit : 0) + 1) * sizeof *ctx);
    uint64_t *hs = malloc((size_t)depth * sizeof *hs);
    int64_t mcap = 64;
    int32_t *mt = malloc((size_t)mcap * sizeof *mt);
    int64_t *mc = malloc((size_t)mcap * sizeof *mc);
    int nd = -1;
    if (!ctx || !hs || !mt || !mc) goto done;
    memcpy(ctx, t + (n - keep), (size_t)keep * sizeof *ctx);
    int64_t len = keep;
    double score = 1.0;
    nd = 0;
    while (nd < limit) {
        int m = context_hashes(ctx, len, depth, hs), match = 0;
        int32_t ho = SX_NONE, hg = SX_NONE;
        for (int j = m; j >= 1; j--) {
            ho = head_of(own, hs[j - 1]);
            hg = glob ? head_of(glob, hs[j - 1]) : SX_NONE;
            if (ho >= 0 || hg >= 0) {
                match = j;
                break;
            }
        }
        if (!match) break;
        int64_t k = 0;
        for (int pass = 0; pass < 2; pass++) {
            const sx_index *ix = pass ? glob : own;
            int64_t w = pass ? 1 : own_weight;
            for (int32_t x = pass ? hg : ho; x >= 0; x = ix->nnext[x]) {
                int64_t c = w * ix->ncnt[x], f = 0;
                if (pass)
                    for (; f < k && mt[f] != ix->ntok[x]; f++) {}
                else
                    f = k;
                if (f < k) {
                    mc[f] += c;
                    continue;
                }
                if (k == mcap) {
                    mcap *= 2;
                    int32_t *a = realloc(mt, (size_t)mcap * sizeof *mt);
                    if (!a) { nd = -1; goto done; }
                    mt = a;
                    int64_t *b = realloc(mc, (size_t)mcap * sizeof *mc);
                    if (!b) { nd = -1; goto done; }
                    mc = b;
                }
                mt[k] = ix->ntok[x];
                mc[k++] = c;
            }
        }
        int64_t best = 0, total = 0;
        for (int64_t f = 0; f < k; f++) {
            total += mc[f];
            if (mc[f] > mc[best] || (mc[f] == mc[best] && mt[f] < mt[best])) best = f;
        }
        if (nd == 0) {
            int cap = (int)(factor * (double)match);
            if (cap < 1) cap = 1;
            if (cap < limit) limit = cap;
        }
        score *= (double)mc[best] / (double)total;
        if (score < min_prob) break;
        out[nd++] = mt[best];
        ctx[len++] = mt[best];
    }
done:
    free(ctx);
    free(hs);
    free(mt);
    free(mc);
    return nd;
}
