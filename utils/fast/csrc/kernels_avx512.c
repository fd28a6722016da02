/* The AVX-512 kernels: rows_exact_512_xb (exact class) and the VNNI int8
   kernels. The library is built with -mavx2 -mfma for any x86-64 CPU
   with AVX2; these functions carry target attributes and run only where
   cpu_features() reports the instructions (dispatch.c refuses them
   elsewhere). A compiler too old for them builds the AVX2 kernels alone. */

#include "kernels.h"

/* x as bf16 (exact where x holds bf16 values, as the step's x does) */
void x_to_bf16(const float *xn, long k, float *xp) {
    uint16_t *h = (uint16_t *)xp;
    for (long i = 0; i < k; ++i) h[i] = to_bf16(xn[i]);
}

void x_split(const float *xn, long k, float *xp) {
    for (long b = 0; b < k; b += 32)
        for (int i = 0; i < 16; ++i) xp[b + i] = xn[b + 2 * i], xp[b + 16 + i] = xn[b + 2 * i + 1];
}

int needs_float_x(const float *xn, long k) {
    for (long i = 0; i < k; ++i) {
        uint32_t u;
        memcpy(&u, xn + i, 4);
        if (u & 0xffffu) return 1;
    }
    return 0;
}

#ifdef QWEN3_AVX512

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define T512VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))
/* Keeps a loaded vector in a register: without it gcc folds the load into
   both the shift and the mask below and reads every weight line twice. */
#define KEEP512(v) __asm__("" : "+v"(v))

/* ---- exact class ----------------------------------------------------- */

/* ATen's last steps on the even/odd halves of a folded 8-column block: e
   holds columns 0,2,4,6, o columns 1,3,5,7; the result is
   ((c0+c4)+(c2+c6))+((c1+c5)+(c3+c7)), as rows_bf16_exact's lanes. */
static inline float evenodd_finish(__m128 e, __m128 o) {
    e = _mm_add_ps(e, _mm_movehl_ps(e, e));
    o = _mm_add_ps(o, _mm_movehl_ps(o, o));
    const float u0 = _mm_cvtss_f32(_mm_add_ss(e, _mm_shuffle_ps(e, e, 1)));
    const float u1 = _mm_cvtss_f32(_mm_add_ss(o, _mm_shuffle_ps(o, o, 1)));
    return u0 + u1;
}

/* A row's sum from its even and odd accumulators (e[j] lane i: column
   32j+2i of every block, o[j]: 32j+2i+1) in ATen's stages: (j0 + j1),
   (low + high 256 bits), (low + high 128 bits), then evenodd_finish */
T512 INLINE float eo_finish(const __m512 *e, const __m512 *o) {
    const __m512 E = _mm512_add_ps(e[0], e[1]);
    const __m512 O = _mm512_add_ps(o[0], o[1]);
    const __m256 E2 = _mm256_add_ps(_mm512_castps512_ps256(E),
                                    _mm512_extractf32x8_ps(E, 1));
    const __m256 O2 = _mm256_add_ps(_mm512_castps512_ps256(O),
                                    _mm512_extractf32x8_ps(O, 1));
    return evenodd_finish(
        _mm_add_ps(_mm256_castps256_ps128(E2), _mm256_extractf128_ps(E2, 1)),
        _mm_add_ps(_mm256_castps256_ps128(O2), _mm256_extractf128_ps(O2, 1)));
}

/* A 512-bit load of 32 bf16 columns split into float32 lanes: lane i's
   low half shifted up is column 2i (*even), its masked high half column
   2i+1 (*odd) */
T512 INLINE void split_bf16(const uint16_t *p, __m512 *even, __m512 *odd) {
    __m512i v = _mm512_loadu_si512(p);
    KEEP512(v);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *odd = _mm512_castsi512_ps(
        _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* One row's sum: per 64 columns two 512-bit loads of the row and two of
   x (bf16, split like the row), so one stream through memory per thread
   and as few loads as the load queue allows. e[j] lane i holds column
   32j+2i of every block, o[j] column 32j+2i+1: ATen's reduction tree maps
   onto these lanes (columns c and c+32 are the two loads, c and c+16 the
   two halves, ...), so the sum has rows_bf16_exact's bits. */
T512 INLINE float xb_row(const uint16_t *x, const uint16_t *r, long k) {
    __m512 e[2], o[2];
    for (int j = 0; j < 2; ++j) e[j] = o[j] = _mm512_setzero_ps();
    for (long i = 0; i < k; i += 64) {
        __m512 xe[2], xo[2];
        for (int j = 0; j < 2; ++j) split_bf16(x + i + 32 * j, &xe[j], &xo[j]);
        for (int j = 0; j < 2; ++j) {
            __m512 lo, hi;
            split_bf16(r + i + 32 * j, &lo, &hi);
            e[j] = _mm512_fmadd_ps(xe[j], lo, e[j]);
            o[j] = _mm512_fmadd_ps(xo[j], hi, o[j]);
        }
    }
    return eo_finish(e, o);
}

/* rows_bf16_exact's sums, one row per pass (x from x_to_bf16) */
T512 void rows_exact_512_xb(const float *xp, const void *wv,
                            const float *unused, void *y, int y_f32, long lo,
                            long hi, long k, long j0, long j1) {
    const uint16_t *w = (const uint16_t *)wv, *x = (const uint16_t *)xp;
    (void)unused;
    for (long j = j0; j < j1 && lo + j < hi; ++j)
        store(y, y_f32, lo + j, xb_row(x, w + (lo + j) * k, k));
}

/* Up to XB_MR rows of x (from x_split) times one weight row at a time */
#define XB_MR 5

/* xb_row's sums of weight row r with the mr rows xr (x_split's: per 32
   columns, xb_row's even lanes then its odd ones), the row split once for
   all of them; each sum added in xb_row's order, so with its bits */
T512 INLINE void xb_tile(const uint16_t *r, const float *const *xr, int mr,
                         long k, float *out) {
    __m512 e[XB_MR][2], o[XB_MR][2];
    for (int q = 0; q < mr; ++q)
        for (int j = 0; j < 2; ++j) e[q][j] = o[q][j] = _mm512_setzero_ps();
    for (long i = 0; i < k; i += 64) {
        __m512 lo[2], hi[2];
        for (int j = 0; j < 2; ++j) split_bf16(r + i + 32 * j, &lo[j], &hi[j]);
        for (int q = 0; q < mr; ++q)
            for (int j = 0; j < 2; ++j) {
                const float *x = xr[q] + i + 32 * j;
                e[q][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x), lo[j], e[q][j]);
                o[q][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), hi[j], o[q][j]);
            }
    }
    for (int q = 0; q < mr; ++q) out[q] = eo_finish(e[q], o[q]);
}

/* xb_tile with mr a constant the compiler unrolls */
T512 static void xb_tile_n(const uint16_t *r, const float *const *xr, int mr,
                           long k, float *out) {
    switch (mr) {
    case 5: xb_tile(r, xr, 5, k, out); break;
    case 4: xb_tile(r, xr, 4, k, out); break;
    case 3: xb_tile(r, xr, 3, k, out); break;
    case 2: xb_tile(r, xr, 2, k, out); break;
    default: xb_tile(r, xr, 1, k, out); break;
    }
}

/* rows_exact_512_xb's passes for every row of x (a multi_x), in tiles of
   up to XB_MR rows of x shared out evenly (16 rows as 4 + 4 + 4 + 4): each
   tile (in L1) meets every weight row of the call, read from L2 */
T512 void rows_exact_512_mm(const float *xv, const void *wv,
                            const float *unused, void *y, int y_f32, long lo,
                            long hi, long k, long j0, long j1) {
    const multi_x *mx = (const multi_x *)xv;
    const uint16_t *w = (const uint16_t *)wv;
    const size_t esize = y_f32 ? 4 : 2;
    const long tiles = (mx->m + XB_MR - 1) / XB_MR;
    (void)unused;
    for (long t = 0, r0 = 0, mr; t < tiles; ++t, r0 += mr) {
        mr = mx->m / tiles + (t < mx->m % tiles);
        const float *xr[XB_MR];
        for (int q = 0; q < mr; ++q) xr[q] = mx->x + (r0 + q) * mx->ldx;
        for (long j = j0; j < j1 && lo + j < hi; ++j) {
            float sums[XB_MR];
            xb_tile_n(w + (lo + j) * k, xr, (int)mr, k, sums);
            for (int q = 0; q < mr; ++q)
                store((char *)y + (size_t)((r0 + q) * mx->ldy) * esize, y_f32, lo + j,
                      sums[q]);
        }
    }
}

/* ---- int8 class, AVX512_VNNI ------------------------------------------ */

/* R (1 or 2) rows, per 64 columns two sign extensions and two vpdpwssd. A
   lane j < 8 holds columns 32b+2j and 32b+2j+1, lane j+8 columns
   32b+16+2j and 32b+17+2j: the two 256-bit halves added are rows_i8q's
   int32 lane j for the chunk (integer sums: the same values), converted
   and added as there. */
T512VNNI INLINE void vnni_rows(const int16_t *qx, const int8_t *const *r,
                               int R, long k, __m256 *f) {
    for (int q = 0; q < R; ++q) f[q] = _mm256_setzero_ps();
    for (long c = 0; c < k; c += I16_CHUNK) {
        const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
        __m512i a[2], b[2];
        for (int q = 0; q < R; ++q) a[q] = b[q] = _mm512_setzero_si512();
        for (long i = c; i < end; i += 64) {
            const __m512i x0 = _mm512_loadu_si512(qx + i);
            const __m512i x1 = _mm512_loadu_si512(qx + i + 32);
            for (int q = 0; q < R; ++q) {
                const __m256i *p = (const __m256i *)(r[q] + i);
                const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p));
                const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p + 1));
                a[q] = _mm512_dpwssd_epi32(a[q], w0, x0);
                b[q] = _mm512_dpwssd_epi32(b[q], w1, x1);
            }
        }
        for (int q = 0; q < R; ++q) {
            const __m512i v = _mm512_add_epi32(a[q], b[q]);
            const __m256i l = _mm256_add_epi32(_mm512_castsi512_si256(v),
                                               _mm512_extracti64x4_epi64(v, 1));
            f[q] = _mm256_add_ps(f[q], _mm256_cvtepi32_ps(l));
        }
    }
}

/* Passes [j0, j1) of rows [lo, hi) in two far-apart sections (see
   rows_fn), each one stream through memory */
T512VNNI void rows_i8q_vnni_s2(const float *qxv, const void *wv,
                               const float *scale, void *y, int y_f32,
                               long lo, long hi, long k, long j0, long j1) {
    const int8_t *w = (const int8_t *)wv;
    const int16_t *qx = (const int16_t *)qxv;
    float xs;
    memcpy(&xs, qx + k, 4);
    const long per = (hi - lo) / 2;
    __m256 f[2];
    FULL_PASSES(j, j0, j1, per) {
        const int8_t *r[2] = {w + (lo + j) * k, w + (lo + per + j) * k};
        vnni_rows(qx, r, 2, k, f);
        for (int q = 0; q < 2; ++q) {
            const long n = lo + q * per + j;
            store(y, y_f32, n, f8_hsum(f[q]) * xs * scale[n]);
        }
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 2) {
        const int8_t *r[1] = {w + n * k};
        vnni_rows(qx, r, 1, k, f);
        store(y, y_f32, n, f8_hsum(f[0]) * xs * scale[n]);
    }
}

#endif /* QWEN3_AVX512 */
