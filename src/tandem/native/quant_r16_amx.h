/* The int8-activation product of several rows on AMX tiles (included by quant_r16_i8.h inside its VNNI path).
 *
 * Why: on the VNNI path every row of x costs one vpdpbusd per 4 inputs x 16 outputs per level, so a verify of
 * k + 1 rows or a batch costs k + 1 times the multiplies of a decode (measured: a 4-row SmolLM2 forward 1.8x a
 * 1-row one). An AMX tile product multiplies up to 16 rows of int8 (here: rows x levels) by a block's weights
 * of 16 outputs in one instruction.
 *
 * Per 32-input block of a 16-row group: the weights' integers form tile B (8 rows of 64 bytes: row dw holds
 * the 4 weights of dword dw of all 16 outputs; Q8_0's int8 straight from the interleaved layout, the Q4 types
 * unpacked from their nibbles into a buffer), the prepared activations tile A (one row per (row of x, level):
 * the block's 32 int8 in the same dword order), and C = A B holds the same exact integer sums the VNNI path
 * forms (Q8_0 signed x signed here, so no +128 offset and no correction; Q4 signed x unsigned). Each row of x
 * then ends the block in i8_finish, the VNNI path's epilogue: a row gives the same bits on either path, so
 * the path may follow the row count (AMX_MIN_ROWS) without breaking batch invariance (tested).
 *
 * Availability: built where the compiler targets AMX-TILE and AMX-INT8 (-march=native on such a CPU), used
 * where the kernel grants the process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once) and
 * tandem_quant_use_amx has not turned it off; otherwise the VNNI path runs.
 */
#ifndef TANDEM_QUANT_R16_AMX_H
#define TANDEM_QUANT_R16_AMX_H
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define AMX_MIN_ROWS 12 /* below: the VNNI path (measured faster at 2-8 rows: a tile product per block has fixed costs) */
#define AMX_PASS 8      /* rows of x per tile product: 8 rows x 2 levels = the tile's 16 rows */

long syscall(long number, ...);

static int amx_state = -1;  /* -1 unknown, 0 off, 1 on */
static int amx_allowed = 1; /* tandem_quant_use_amx */

static inline int amx_enabled(void) {
    if (!amx_allowed) return 0;
    if (amx_state < 0) { /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18), SYS_arch_prctl 158 */
        int ok;
#pragma omp critical(tandem_amx)
        ok = syscall(158, 0x1023, 18) == 0;
        amx_state = ok;
    }
    return amx_state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) AmxConfig;

/* tmm0-3: C of four blocks in flight (m rows x 16 int32), tmm4-5: A (m rows x 32 int8), tmm6-7: B (8 rows x
 * 64 bytes). Four blocks in flight: a tile product's latency is long, and each block's C must be stored and
 * read back before its epilogue, so one block at a time left the tile unit idle most of the time. */
static inline void amx_configure(int m) {
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.rows[t] = (uint8_t)m, c.colsb[t] = 64;
    for (int t = 4; t < 6; t++) c.rows[t] = (uint8_t)m, c.colsb[t] = 32;
    for (int t = 6; t < 8; t++) c.rows[t] = 8, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* A tiles of every pass of ``pass`` rows and every block: a[((p * nb + b) * mp + r * levels + l) * 32 + k] =
 * row p * pass + r's level l byte k of block b (zero rows past the last row of x); mp = pass * levels. */
static void amx_tiles_a(const I8Block *xp, int64_t rows, int64_t nb, int levels, int64_t pass, int8_t *a) {
    const int64_t passes = (rows + pass - 1) / pass, mp = pass * levels;
    memset(a, 0, (size_t)(passes * nb * mp * 32));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < levels; l++)
                memcpy(a + (((r / pass) * nb + b) * mp + (r % pass) * levels + l) * 32, xp[r * nb + b].q[l], 32);
}

/* The weights' integers of one group-block as tile B's rows: Q8_0's bytes in place, Q4's nibbles unpacked
 * into buf (chunk c: dword 2c the low nibbles, 2c + 1 the high ones). */
static inline const uint8_t *amx_weights(int64_t base, const uint8_t *q, uint8_t *buf) {
    if (base == GT_Q8_0) return q;
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
        _mm512_store_si512((void *)(buf + 128 * c), _mm512_and_si512(v, m4));
        _mm512_store_si512((void *)(buf + 128 * c + 64), _mm512_and_si512(_mm512_srli_epi32(v, 4), m4));
    }
    return buf;
}

/* C tile T of block j (of up to four in flight) = A (pass p) x B, stored to cbuf[j]. */
#define AMX_BLOCK(T, AT, BT, j)                                                                             \
    if (j < nj) {                                                                                           \
        _tile_zero(T);                                                                                      \
        _tile_loadd(BT, w[j], 64);                                                                          \
        _tile_loadd(AT, a + (p * nb + b0 + j) * mp * 32, 32);                                              \
        if (base == GT_Q8_0)                                                                                \
            _tile_dpbssd(T, AT, BT);                                                                        \
        else                                                                                                \
            _tile_dpbsud(T, AT, BT);                                                                        \
    }

/* One group of 16 outputs times every row of x; acc: rows x 16 floats of scratch. */
static void amx_group(int64_t base, const uint8_t *g, int64_t nb, const I8Block *xp, const int8_t *a,
                      int64_t rows, int levels, int64_t pass, float *acc, float *y, int64_t ldy) {
    int64_t bytes;
    q_block(base, &bytes);
    const int64_t hdr = r16_header(base), gb = R16 * bytes, mp = pass * levels;
    const int64_t passes = (rows + pass - 1) / pass;
    uint8_t wbuf[4][8 * 64] __attribute__((aligned(64)));
    int32_t cbuf[4][16 * 16] __attribute__((aligned(64)));
    for (int64_t r = 0; r < rows; r++) _mm512_storeu_ps(acc + r * 16, _mm512_setzero_ps());
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int nj = (int)(nb - b0 < 4 ? nb - b0 : 4);
        const uint8_t *w[4];
        for (int j = 0; j < nj; j++) {
            const uint8_t *blk = g + (b0 + j) * gb;
            for (int64_t l = 0; l < gb; l += 64) _mm_prefetch((const char *)(blk + R16_PREFETCH + l), _MM_HINT_T0);
            w[j] = amx_weights(base, blk + hdr, wbuf[j]);
        }
        for (int64_t p = 0; p < passes; p++) {
            AMX_BLOCK(0, 4, 6, 0)
            AMX_BLOCK(1, 5, 7, 1)
            AMX_BLOCK(2, 4, 6, 2)
            AMX_BLOCK(3, 5, 7, 3)
            _tile_stored(0, cbuf[0], 64);
            if (nj > 1) _tile_stored(1, cbuf[1], 64);
            if (nj > 2) _tile_stored(2, cbuf[2], 64);
            if (nj > 3) _tile_stored(3, cbuf[3], 64);
            const int64_t n = rows - p * pass < pass ? rows - p * pass : pass;
            for (int j = 0; j < nj; j++) { /* blocks in sequence: each row's sum order is the VNNI path's */
                const uint8_t *blk = g + (b0 + j) * gb;
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
                const __m512 m = base == GT_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))) : d;
                for (int64_t r = 0; r < n; r++) {
                    const int64_t row = p * pass + r;
                    const __m512i t1 = _mm512_load_si512((const void *)(cbuf[j] + (r * levels) * 16));
                    const __m512i t2 = levels > 1 ? _mm512_load_si512((const void *)(cbuf[j] + (r * levels + 1) * 16)) : t1;
                    float *ar = acc + row * 16;
                    _mm512_storeu_ps(ar, i8_finish(base, t1, t2, xp + row * nb + b0 + j, levels, d, m,
                                                   _mm512_loadu_ps(ar), base == GT_Q4_0));
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) memcpy(y + r * ldy, acc + r * 16, 16 * sizeof(float));
}

static int amx_gemv(int64_t base, int levels, int64_t prow, int64_t rb, const uint8_t *data, const I8Block *xp,
                    int64_t rows, int64_t nb, float *y, int64_t ldy, int num_threads) {
    /* passes of up to AMX_PASS rows; fewer rows take a smaller tile (a tile product's time follows its rows) */
    const int64_t pass = rows < AMX_PASS ? rows : AMX_PASS;
    const int64_t groups = prow / R16, passes = (rows + pass - 1) / pass, mp = pass * levels;
    int8_t *a = malloc((size_t)(passes * nb * mp * 32));
    float *acc = malloc((size_t)(num_threads > 0 ? num_threads : 1) * (size_t)rows * 16 * sizeof(float));
    if (!a || !acc) {
        free(a);
        free(acc);
        return -2;
    }
    amx_tiles_a(xp, rows, nb, levels, pass, a);
#pragma omp parallel num_threads(num_threads)
    {
        float *mine = acc + (int64_t)omp_get_thread_num() * rows * 16;
        amx_configure((int)mp);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < groups; t++)
            amx_group(base, data + t * R16 * rb, nb, xp, a, rows, levels, pass, mine, y + t * R16, ldy);
        _tile_release();
    }
    free(a);
    free(acc);
    return 0;
}
#else
#define AMX_MIN_ROWS (1 << 30)
static int amx_allowed = 0;
static inline int amx_enabled(void) { return 0; }
static int amx_gemv(int64_t base, int levels, int64_t prow, int64_t rb, const uint8_t *data, const I8Block *xp,
                    int64_t rows, int64_t nb, float *y, int64_t ldy, int num_threads) {
    (void)base, (void)levels, (void)prow, (void)rb, (void)data, (void)xp, (void)rows, (void)nb, (void)y, (void)ldy;
    (void)num_threads;
    return -3;
}
#endif

#endif
