/* The first kernel of each class (see kernels.h), written once on eight
   float32 lanes (vec8.h): built for AVX2 with FMA on x86-64, where every
   such CPU runs it, and for NEON on AArch64, with the same bits.

   Each thread streams four far-apart rows at once, prefetching
   PREFETCH_BYTES ahead (bf16.h). bf16 weights are widened to float32 and
   multiplied in float32; int8 weights are multiplied with x rounded to
   16-bit fixed point, in exact int32 sums (rows_i8q). */

#include <math.h>

#include "kernels.h"

void load_x(const void *x, int x_f32, long k, float *out) {
    if (x_f32) { memcpy(out, x, (size_t)k * 4); return; }
    for (long i = 0; i < k; ++i) out[i] = from_bf16(((const uint16_t *)x)[i]);
}

/* x in the order bf16x16_fast widens 16 weights (vec8.h's FAST_ORDER):
   reordering x once is cheaper than reordering w. */
void permute16(const float *xn, long k, float *xp) {
    static const int order[16] = FAST_ORDER;
    for (long b = 0; b < k; b += 16)
        for (int i = 0; i < 16; ++i) xp[b + i] = xn[b + order[i]];
}

static inline void bf16_fma(const uint16_t *p, f8 xl, f8 xh, f8 *a, f8 *b) {
    f8 wl, wh;
    bf16x16_fast(p, &wl, &wh);
    *a = f8_fma(wl, xl, *a);
    *b = f8_fma(wh, xh, *b);
}

static inline void i8_fma(const int8_t *p, f8 x0, f8 x1, f8 *a, f8 *b) {
    f8 lo, hi;
    i8x16_float(p, &lo, &hi);
    *a = f8_fma(lo, x0, *a);
    *b = f8_fma(hi, x1, *b);
}

/* y = w x in four sections (see rows_fn). */
void rows_bf16(const float *xp, const void *wv, const float *unused, void *y,
               int y_f32, long lo, long hi, long k, long j0, long j1) {
    const uint16_t *w = (const uint16_t *)wv;
    (void)unused;
    const long per = (hi - lo) / 4;
    FULL_PASSES(j, j0, j1, per) {
        const uint16_t *r0 = w + (lo + j) * k, *r1 = w + (lo + per + j) * k;
        const uint16_t *r2 = w + (lo + 2 * per + j) * k;
        const uint16_t *r3 = w + (lo + 3 * per + j) * k;
        f8 a0 = f8_zero(), b0 = a0, a1 = a0, b1 = a0;
        f8 a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        for (long i = 0; i < k; i += 16) {
            const f8 xl = f8_load(xp + i);
            const f8 xh = f8_load(xp + i + 8);
            PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
            bf16_fma(r0 + i, xl, xh, &a0, &b0);
            bf16_fma(r1 + i, xl, xh, &a1, &b1);
            bf16_fma(r2 + i, xl, xh, &a2, &b2);
            bf16_fma(r3 + i, xl, xh, &a3, &b3);
        }
        store(y, y_f32, lo + j, f8_hsum(f8_add(a0, b0)));
        store(y, y_f32, lo + per + j, f8_hsum(f8_add(a1, b1)));
        store(y, y_f32, lo + 2 * per + j, f8_hsum(f8_add(a2, b2)));
        store(y, y_f32, lo + 3 * per + j, f8_hsum(f8_add(a3, b3)));
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 4) {
        const uint16_t *r = w + n * k;
        f8 a = f8_zero(), b = a;
        for (long i = 0; i < k; i += 16)
            bf16_fma(r + i, f8_load(xp + i),
                     f8_load(xp + i + 8), &a, &b);
        store(y, y_f32, n, f8_hsum(f8_add(a, b)));
    }
}

/* int8 weights times float32 x, for an x holding inf or NaN (they then
   propagate as in float) */
void rows_i8(const float *xn, const void *wv, const float *scale, void *y,
             int y_f32, long lo, long hi, long k, long j0, long j1) {
    const int8_t *w = (const int8_t *)wv;
    const long per = (hi - lo) / 4;
    FULL_PASSES(j, j0, j1, per) {
        const long n0 = lo + j, n1 = n0 + per, n2 = n1 + per, n3 = n2 + per;
        const int8_t *r0 = w + n0 * k, *r1 = w + n1 * k;
        const int8_t *r2 = w + n2 * k, *r3 = w + n3 * k;
        f8 a0 = f8_zero(), b0 = a0, a1 = a0, b1 = a0;
        f8 a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        for (long i = 0; i < k; i += 16) {
            const f8 x0 = f8_load(xn + i);
            const f8 x1 = f8_load(xn + i + 8);
            PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
            i8_fma(r0 + i, x0, x1, &a0, &b0);
            i8_fma(r1 + i, x0, x1, &a1, &b1);
            i8_fma(r2 + i, x0, x1, &a2, &b2);
            i8_fma(r3 + i, x0, x1, &a3, &b3);
        }
        store(y, y_f32, n0, f8_hsum(f8_add(a0, b0)) * scale[n0]);
        store(y, y_f32, n1, f8_hsum(f8_add(a1, b1)) * scale[n1]);
        store(y, y_f32, n2, f8_hsum(f8_add(a2, b2)) * scale[n2]);
        store(y, y_f32, n3, f8_hsum(f8_add(a3, b3)) * scale[n3]);
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 4) {
        const int8_t *r = w + n * k;
        f8 a = f8_zero(), b = a;
        for (long i = 0; i < k; i += 16)
            i8_fma(r + i, f8_load(xn + i),
                   f8_load(xn + i + 8), &a, &b);
        store(y, y_f32, n, f8_hsum(f8_add(a, b)) * scale[n]);
    }
}

/* int8 weights times x rounded to 16-bit fixed point: x ~= xs * qx with
   xs = max|x| / 32767 (one scale per call), so each 16 columns cost one
   sign extension, one multiply-add of int16 pairs (madd_i8) and one int32
   add. Lane j of a row's accumulator adds columns 16b+2j and 16b+2j+1 of
   every 16-column block b exactly in int32; every 1024 columns (before any
   int32 could overflow) the 8 lanes are converted to float32 and added to
   float32 lanes, which are summed as in hsum and multiplied by xs, then by
   the row's scale. qx must hold xs as its last float (see quantize_x);
   I16_CHUNK is in kernels.h. */

void rows_i8q(const float *qxv, const void *wv, const float *scale, void *y,
              int y_f32, long lo, long hi, long k, long j0, long j1) {
    const int8_t *w = (const int8_t *)wv;
    const int16_t *qx = (const int16_t *)qxv;
    float xs;
    memcpy(&xs, qx + k, 4);
    const long per = (hi - lo) / 4;
    for (long j = j0; j < j1; ++j) {
        /* four far-apart rows per pass, then the leftover rows one by one */
        const int four = j < per;
        long n[4];
        for (int q = 0; q < 4; ++q)
            n[q] = four ? lo + q * per + j : lo + 4 * per + (j - per);
        f8 f[4];
        for (int q = 0; q < 4; ++q) f[q] = f8_zero();
        for (long c = 0; c < k; c += I16_CHUNK) {
            const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
            i8v a[4];
            for (int q = 0; q < 4; ++q) a[q] = i8_zero();
            if (four) {
                const int8_t *r0 = w + n[0] * k, *r1 = w + n[1] * k;
                const int8_t *r2 = w + n[2] * k, *r3 = w + n[3] * k;
                for (long i = c; i < end; i += 16) {
                    const q16 xq = q16_load(qx + i);
                    PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
                    a[0] = i8_add(a[0], madd_i8(r0 + i, xq));
                    a[1] = i8_add(a[1], madd_i8(r1 + i, xq));
                    a[2] = i8_add(a[2], madd_i8(r2 + i, xq));
                    a[3] = i8_add(a[3], madd_i8(r3 + i, xq));
                }
            } else {
                const int8_t *r = w + n[0] * k;
                for (long i = c; i < end; i += 16) {
                    const q16 xq = q16_load(qx + i);
                    a[0] = i8_add(a[0], madd_i8(r + i, xq));
                }
            }
            for (int q = 0; q < 4; ++q)
                f[q] = f8_add(f[q], i8_float(a[q]));
        }
        for (int q = 0; q < (four ? 4 : 1); ++q)
            store(y, y_f32, n[q], f8_hsum(f[q]) * xs * scale[n[q]]);
    }
}

/* Same sums, in the same order, as ATen's own bf16 matrix-vector product
   (its AVX2 dot with float32 arithmetic, which torch also runs at the
   AVX-512 capability; see utils/fast/kernels.py for when torch takes it
   rather than oneDNN): per row, eight 8-lane
   float32 accumulators over blocks of 64 columns, accumulator 2p+h taking
   columns 16p+8h .. 16p+8h+7 of each block; then accumulators summed
   pairwise (i += i+4, i += i+2, i += i+1) and the lanes as
   ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)). The result is bit-identical to
   F.linear wherever torch runs that dot. */
static inline float reduce_like_aten(f8 *s) {
    for (int i = 0; i < 4; ++i) s[i] = f8_add(s[i], s[i + 4]);
    for (int i = 0; i < 2; ++i) s[i] = f8_add(s[i], s[i + 2]);
    return f8_hsum(f8_add(s[0], s[1])); /* the lanes' order above */
}

static inline void exact_block(const float *x, const uint16_t *r, f8 *s) {
    for (int p = 0; p < 8; ++p)
        s[p] = f8_fma(f8_load(x + 8 * p), bf16x8(r + 8 * p), s[p]);
}

void rows_bf16_exact(const float *xn, const void *wv, const float *unused,
                     void *y, int y_f32, long lo, long hi, long k, long j0,
                     long j1) {
    const uint16_t *w = (const uint16_t *)wv;
    (void)unused;
    const long per = (hi - lo) / 4;
    FULL_PASSES(j, j0, j1, per) {
        const uint16_t *r[4];
        f8 s[4][8];
        for (int q = 0; q < 4; ++q) {
            r[q] = w + (lo + q * per + j) * k;
            for (int p = 0; p < 8; ++p) s[q][p] = f8_zero();
        }
        for (long i = 0; i < k; i += 64)
            for (int q = 0; q < 4; ++q) {
                PF(r[q] + i);
                PF(r[q] + i + 32);
                exact_block(xn + i, r[q] + i, s[q]);
            }
        for (int q = 0; q < 4; ++q)
            store(y, y_f32, lo + q * per + j, reduce_like_aten(s[q]));
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 4) {
        f8 s[8];
        for (int p = 0; p < 8; ++p) s[p] = f8_zero();
        for (long i = 0; i < k; i += 64) exact_block(xn + i, w + n * k + i, s);
        store(y, y_f32, n, reduce_like_aten(s));
    }
}

/* x ~= xs * qx with xs = max|x| / 32767: each x * (32767 / max|x|)
   rounded to nearest even and clamped to +-32767, eight
   at a time; the tests compare its bits with the plain loop it replaced
   (quantize_x_reference). */
int quantize_x(const float *x, long k, int16_t *qx) {
    const f8 big = f8_set1(3.4028235e38f);
    f8 m = f8_zero();
    m8 bad = m8_zero();
    for (long i = 0; i < k; i += 8) {
        const f8 a = f8_abs(f8_load(x + i));
        bad = m8_or(bad, m8_or(f8_gt(a, big), f8_nan(a))); /* inf, NaN */
        m = f8_max(m, a);
    }
    if (m8_any(bad)) return 0;
    float lanes[8], amax = 0.0f;
    f8_store(lanes, m);
    for (int l = 0; l < 8; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, xs = amax / 32767.0f;
    const f8 iv = f8_set1(inv);
    const i8v hi = i8_set1(32767), lo = i8_set1(-32767);
    for (long i = 0; i < k; i += 8)
        i8_store16(qx + i, i8_max(i8_min(f8_int(f8_mul(f8_load(x + i), iv)), hi), lo));
    memcpy(qx + k, &xs, 4);
    return 1;
}
