/* The multi-row int8 kernels (class "int8_mm"): y = x w^T for m rows of x
   at once (a prompt's prefill), each row with the bits rows_i8q gives it
   alone. Per row of x, as there: x rounded to 16-bit fixed point once
   (quantize_x: its own scale xs), exact int32 sums of int8 w times int16
   x, lane j of a weight row's sum holding columns 16b+2j and 16b+2j+1 of
   every 16-column block b; every I16_CHUNK columns the eight lanes are
   converted to float32 and added to float32 lanes; at the end the lanes'
   f8_hsum, times xs, times the weight row's scale.

   What changes is the order of the work, never a sum: a tile of R weight
   rows and MR rows of x is added up in registers, so each weight byte
   read from memory serves MR rows of x, and each x value R weight rows.
   The rows of w are shared out between the team's threads as for one
   row (team.c: `run`), the rows of x travel in an `mm_x` passed where a
   row kernel takes x. A row of x holding an inf or NaN takes the float32
   kernel alone, as it would as one row. */

#include <stdlib.h>

#include "team.h"

#define MM_R 4   /* weight rows per tile: the kernels' sections */
#define V8_MR 2  /* rows of x per tile, vec8 form (16 registers on AVX2) */

/* Where row r of x writes, as a row kernel's y */
static inline void *y_row(void *y, int y_f32, long r, long ldy) {
    return (char *)y + (size_t)(r * ldy) * (y_f32 ? 4 : 2);
}

/* The weight rows of pass j (see rows_fn): MM_R far-apart ones, or a
   leftover one repeated (its copies' sums are computed and dropped) */
static int pass_rows(long lo, long hi, long j, long *n) {
    const long per = (hi - lo) / MM_R;
    const int full = j < per;
    for (int q = 0; q < MM_R; ++q)
        n[q] = full ? lo + q * per + j : lo + MM_R * per + (j - per);
    return full ? MM_R : 1;
}

/* Rows r0.. of a tile of `mr` rows: a row past the end (or computed
   apart) reads row r0 again, its sums dropped */
static void tile_x(const mm_x *x, long r0, int mr, const int16_t **qr) {
    for (int i = 0; i < mr; ++i) {
        const long r = r0 + i < x->m ? r0 + i : r0;
        qr[i] = x->q + r * x->ldq;
    }
}

/* The tile's results: f[q][i] the float32 lanes of weight row n[q] and
   row r0 + i of x */
static void tile_store(const mm_x *x, const float *scale, void *y, int y_f32,
                       const long *n, int nr, long r0, int mr,
                       f8 (*f)[8]) {
    for (int i = 0; i < mr && r0 + i < x->m; ++i) {
        if (!x->ok[r0 + i]) continue;
        void *yr = y_row(y, y_f32, r0 + i, x->ldy);
        for (int q = 0; q < nr; ++q)
            store(yr, y_f32, n[q], f8_hsum(f[q][i]) * x->xs[r0 + i] * scale[n[q]]);
    }
}

/* vec8 form: MM_R weight rows times V8_MR rows of x per 16 columns */
static inline void v8_tile(const int8_t *const *wr, const int16_t *const *qr,
                           long k, f8 (*f)[8]) {
    for (int q = 0; q < MM_R; ++q)
        for (int i = 0; i < V8_MR; ++i) f[q][i] = f8_zero();
    for (long c = 0; c < k; c += I16_CHUNK) {
        const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
        i8v a[MM_R][V8_MR];
        for (int q = 0; q < MM_R; ++q)
            for (int i = 0; i < V8_MR; ++i) a[q][i] = i8_zero();
        for (long col = c; col < end; col += 16) {
            q16 xq[V8_MR];
            for (int i = 0; i < V8_MR; ++i) xq[i] = q16_load(qr[i] + col);
            for (int q = 0; q < MM_R; ++q)
                for (int i = 0; i < V8_MR; ++i)
                    a[q][i] = i8_add(a[q][i], madd_i8(wr[q] + col, xq[i]));
        }
        for (int q = 0; q < MM_R; ++q)
            for (int i = 0; i < V8_MR; ++i)
                f[q][i] = f8_add(f[q][i], i8_float(a[q][i]));
    }
}

/* A tile's sums: f[q][i] for weight row wr[q] and row qr[i] of x, i < mr */
typedef void (*tile_fn)(const int8_t *const *wr, const int16_t *const *qr,
                        long k, int mr, f8 (*f)[8]);

/* Passes [j0, j1) over weight rows [lo, hi) for every row of x (an mm_x),
   in tiles of at most `most` rows of x (at most 8; `even`: the rows
   shared out evenly between the fewest tiles, e.g. 8 rows as 4 + 4, else
   every tile `most` rows): each tile of x (in L1) meets every pass of the
   call (a take of the team: about 128 KB of weights, in L2), so x comes
   from L2 once per take */
static void mm_passes(tile_fn tile, int most, int even, const float *xv,
                      const void *wv, const float *scale, void *y, int y_f32,
                      long lo, long hi, long k, long j0, long j1) {
    const mm_x *x = (const mm_x *)xv;
    const int8_t *w = (const int8_t *)wv;
    const long tiles = (x->m + most - 1) / most;
    f8 f[MM_R][8];
    for (long t = 0, r0 = 0, mr; t < tiles; ++t, r0 += mr) {
        mr = even ? x->m / tiles + (t < x->m % tiles) : most;
        const int16_t *qr[8];
        tile_x(x, r0, (int)mr, qr);
        for (long j = j0; j < j1; ++j) {
            long n[MM_R];
            const int nr = pass_rows(lo, hi, j, n);
            const int8_t *wr[MM_R];
            for (int q = 0; q < MM_R; ++q) wr[q] = w + n[q] * k;
            tile(wr, qr, k, (int)mr, f);
            tile_store(x, scale, y, y_f32, n, nr, r0, (int)mr, f);
        }
    }
}

static void v8_tile_fn(const int8_t *const *wr, const int16_t *const *qr,
                       long k, int mr, f8 (*f)[8]) {
    (void)mr; /* always V8_MR rows */
    v8_tile(wr, qr, k, f);
}

ROW_KERNEL(rows_i8mm) {
    mm_passes(v8_tile_fn, V8_MR, 0, x, w, s, y, y_f32, lo, hi, k, j0, j1);
}

#ifdef QWEN3_AVX512
#define T512VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define VNNI_MR 6 /* rows of x per tile: 24 accumulators of 32 registers */

/* AVX512_VNNI form: per 32 columns one sign extension per weight row and
   one vpdpwssd per (weight row, row of x). Lane j < 8 holds columns
   32b+2j, 32b+2j+1 and lane j+8 columns 32b+16+2j, 32b+17+2j: the two
   256-bit halves added are the vec8 lane j's int32 sum for the chunk
   (integers: the same value), converted and added as there. */
T512VNNI static inline __attribute__((always_inline)) void vnni_tile(
    const int8_t *const *wr, const int16_t *const *qr, long k, int mr,
    f8 (*f)[8]) {
    for (int q = 0; q < MM_R; ++q)
        for (int i = 0; i < mr; ++i) f[q][i] = f8_zero();
    for (long c = 0; c < k; c += I16_CHUNK) {
        const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
        __m512i a[MM_R][VNNI_MR];
        for (int q = 0; q < MM_R; ++q)
            for (int i = 0; i < mr; ++i) a[q][i] = _mm512_setzero_si512();
        for (long col = c; col < end; col += 32) {
            __m512i wq[MM_R];
            for (int q = 0; q < MM_R; ++q)
                wq[q] = _mm512_cvtepi8_epi16(
                    _mm256_loadu_si256((const __m256i *)(wr[q] + col)));
            for (int i = 0; i < mr; ++i) {
                const __m512i xq = _mm512_loadu_si512(qr[i] + col);
                for (int q = 0; q < MM_R; ++q)
                    a[q][i] = _mm512_dpwssd_epi32(a[q][i], wq[q], xq);
            }
        }
        for (int q = 0; q < MM_R; ++q)
            for (int i = 0; i < mr; ++i) {
                const __m512i v = a[q][i];
                const __m256i l = _mm256_add_epi32(_mm512_castsi512_si256(v),
                                                   _mm512_extracti64x4_epi64(v, 1));
                f[q][i] = f8_add(f[q][i], _mm256_cvtepi32_ps(l));
            }
    }
}

/* vnni_tile with mr a constant the compiler unrolls */
T512VNNI static void vnni_tile_fn(const int8_t *const *wr,
                                  const int16_t *const *qr, long k, int mr,
                                  f8 (*f)[8]) {
    switch (mr) {
    case 6: vnni_tile(wr, qr, k, 6, f); break;
    case 5: vnni_tile(wr, qr, k, 5, f); break;
    case 4: vnni_tile(wr, qr, k, 4, f); break;
    case 3: vnni_tile(wr, qr, k, 3, f); break;
    case 2: vnni_tile(wr, qr, k, 2, f); break;
    default: vnni_tile(wr, qr, k, 1, f); break;
    }
}

ROW_KERNEL(rows_i8mm_vnni) {
    mm_passes(vnni_tile_fn, VNNI_MR, 1, x, w, s, y, y_f32, lo, hi, k, j0, j1);
}
#endif

/* Rows of x rounded to 16-bit fixed point (in q, scales in xs); ok[r] = 0
   for a row holding inf or NaN */
static void quantize_rows(const void *x, int x_f32, long m, long k, float *xn,
                          int16_t *q, long ldq, float *xs, unsigned char *ok) {
    const size_t row_bytes = (size_t)k * (x_f32 ? 4 : 2);
    for (long r = 0; r < m; ++r) {
        load_x((const char *)x + r * row_bytes, x_f32, k, xn);
        int16_t *qr = q + r * ldq;
        ok[r] = (unsigned char)quantize_x(xn, k, qr);
        if (ok[r]) memcpy(&xs[r], qr + k, 4);
    }
}

/* The rows computed apart, one by one as by qwen3_matvec */
static void rows_apart(const mm_x *mx, const void *x, int x_f32, const group *g,
                       void *y, int y_f32, long k, int threads, float *xn,
                       int16_t *scratch) {
    static const row_kernel ROWS_I8Q = {rows_i8q, 4};
    const size_t row_bytes = (size_t)k * (x_f32 ? 4 : 2);
    for (long r = 0; r < mx->m; ++r) {
        if (mx->ok[r]) continue;
        load_x((const char *)x + r * row_bytes, x_f32, k, xn);
        int8_group(xn, g, y_row(y, y_f32, r, mx->ldy), y_f32, k, threads, scratch,
                   &ROWS_I8Q);
    }
}

int int8_matmul(const kernel *v, const void *x, int x_f32, long m,
                const group *g, void *y, int y_f32, long k, int threads) {
    long ldy = 0;
    for (int i = 0; i < g->count; ++i) ldy += g->n[i];
    const long ldq = k + 32; /* k int16, the scale, 64-byte steps */
    int16_t *q = malloc((size_t)(m + 1) * ldq * 2);
    float *f = malloc((size_t)(m + k) * 4 + 64);
    unsigned char *ok = malloc((size_t)m);
    if (!q || !f || !ok) {
        free(q), free(f), free(ok);
        return 2;
    }
    float *xs = f + k; /* f: k floats of one row's x, then the m scales */
    quantize_rows(x, x_f32, m, k, f, q, ldq, xs, ok);
    const mm_x mx = {q, xs, ok, m, ldq, ldy};
    run(&v->rows, (const float *)&mx, g, y, y_f32, k, threads);
    rows_apart(&mx, x, x_f32, g, y, y_f32, k, threads, f, q + m * ldq);
    free(q), free(f), free(ok);
    return 0;
}
