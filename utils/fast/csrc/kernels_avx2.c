/* The AVX2 kernels: the first kernel of each class (see kernels.h), which
   every x86-64 CPU with AVX2 and FMA runs.

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

/* Unpacking 16 bf16 values (one 256-bit load) interleaves the two 128-bit
   lanes: the low unpack holds elements 0-3 and 8-11, the high one 4-7 and
   12-15. Reordering x the same way once is cheaper than reordering w. */
void permute16(const float *xn, long k, float *xp) {
    static const int order[16] = {0, 1, 2, 3, 8, 9, 10, 11,
                                  4, 5, 6, 7, 12, 13, 14, 15};
    for (long b = 0; b < k; b += 16)
        for (int i = 0; i < 16; ++i) xp[b + i] = xn[b + order[i]];
}

static inline void bf16_fma(const uint16_t *p, __m256 xl, __m256 xh,
                            __m256 *a, __m256 *b) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m256i z = _mm256_setzero_si256();
    *a = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)), xl, *a);
    *b = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v)), xh, *b);
}

static inline void i8_fma(const int8_t *p, __m256 x0, __m256 x1,
                          __m256 *a, __m256 *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m256i lo = _mm256_cvtepi8_epi32(v);
    const __m256i hi = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v));
    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), x0, *a);
    *b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), x1, *b);
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
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;
        __m256 a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        for (long i = 0; i < k; i += 16) {
            const __m256 xl = _mm256_loadu_ps(xp + i);
            const __m256 xh = _mm256_loadu_ps(xp + i + 8);
            PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
            bf16_fma(r0 + i, xl, xh, &a0, &b0);
            bf16_fma(r1 + i, xl, xh, &a1, &b1);
            bf16_fma(r2 + i, xl, xh, &a2, &b2);
            bf16_fma(r3 + i, xl, xh, &a3, &b3);
        }
        store(y, y_f32, lo + j, hsum(_mm256_add_ps(a0, b0)));
        store(y, y_f32, lo + per + j, hsum(_mm256_add_ps(a1, b1)));
        store(y, y_f32, lo + 2 * per + j, hsum(_mm256_add_ps(a2, b2)));
        store(y, y_f32, lo + 3 * per + j, hsum(_mm256_add_ps(a3, b3)));
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 4) {
        const uint16_t *r = w + n * k;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (long i = 0; i < k; i += 16)
            bf16_fma(r + i, _mm256_loadu_ps(xp + i),
                     _mm256_loadu_ps(xp + i + 8), &a, &b);
        store(y, y_f32, n, hsum(_mm256_add_ps(a, b)));
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
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;
        __m256 a2 = a0, b2 = a0, a3 = a0, b3 = a0;
        for (long i = 0; i < k; i += 16) {
            const __m256 x0 = _mm256_loadu_ps(xn + i);
            const __m256 x1 = _mm256_loadu_ps(xn + i + 8);
            PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
            i8_fma(r0 + i, x0, x1, &a0, &b0);
            i8_fma(r1 + i, x0, x1, &a1, &b1);
            i8_fma(r2 + i, x0, x1, &a2, &b2);
            i8_fma(r3 + i, x0, x1, &a3, &b3);
        }
        store(y, y_f32, n0, hsum(_mm256_add_ps(a0, b0)) * scale[n0]);
        store(y, y_f32, n1, hsum(_mm256_add_ps(a1, b1)) * scale[n1]);
        store(y, y_f32, n2, hsum(_mm256_add_ps(a2, b2)) * scale[n2]);
        store(y, y_f32, n3, hsum(_mm256_add_ps(a3, b3)) * scale[n3]);
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 4) {
        const int8_t *r = w + n * k;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (long i = 0; i < k; i += 16)
            i8_fma(r + i, _mm256_loadu_ps(xn + i),
                   _mm256_loadu_ps(xn + i + 8), &a, &b);
        store(y, y_f32, n, hsum(_mm256_add_ps(a, b)) * scale[n]);
    }
}

/* int8 weights times x rounded to 16-bit fixed point: x ~= xs * qx with
   xs = max|x| / 32767 (one scale per call), so each 16 columns cost one
   sign extension, one multiply-add of int16 pairs (vpmaddwd) and one int32
   add. Lane j of a row's accumulator adds columns 16b+2j and 16b+2j+1 of
   every 16-column block b exactly in int32; every 1024 columns (before any
   int32 could overflow) the 8 lanes are converted to float32 and added to
   float32 lanes, which are summed as in hsum and multiplied by xs, then by
   the row's scale. qx must hold xs as its last float (see quantize_x);
   I16_CHUNK is in kernels.h. */

static inline __m256i i16_madd(const int8_t *p, __m256i xq) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_madd_epi16(w, xq);
}

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
        __m256 f[4];
        for (int q = 0; q < 4; ++q) f[q] = _mm256_setzero_ps();
        for (long c = 0; c < k; c += I16_CHUNK) {
            const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
            __m256i a[4];
            for (int q = 0; q < 4; ++q) a[q] = _mm256_setzero_si256();
            if (four) {
                const int8_t *r0 = w + n[0] * k, *r1 = w + n[1] * k;
                const int8_t *r2 = w + n[2] * k, *r3 = w + n[3] * k;
                for (long i = c; i < end; i += 16) {
                    const __m256i xq = _mm256_loadu_si256((const __m256i *)(qx + i));
                    PF(r0 + i); PF(r1 + i); PF(r2 + i); PF(r3 + i);
                    a[0] = _mm256_add_epi32(a[0], i16_madd(r0 + i, xq));
                    a[1] = _mm256_add_epi32(a[1], i16_madd(r1 + i, xq));
                    a[2] = _mm256_add_epi32(a[2], i16_madd(r2 + i, xq));
                    a[3] = _mm256_add_epi32(a[3], i16_madd(r3 + i, xq));
                }
            } else {
                const int8_t *r = w + n[0] * k;
                for (long i = c; i < end; i += 16) {
                    const __m256i xq = _mm256_loadu_si256((const __m256i *)(qx + i));
                    a[0] = _mm256_add_epi32(a[0], i16_madd(r + i, xq));
                }
            }
            for (int q = 0; q < 4; ++q)
                f[q] = _mm256_add_ps(f[q], _mm256_cvtepi32_ps(a[q]));
        }
        for (int q = 0; q < (four ? 4 : 1); ++q)
            store(y, y_f32, n[q], hsum(f[q]) * xs * scale[n[q]]);
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
static inline float reduce_like_aten(__m256 *s) {
    for (int i = 0; i < 4; ++i) s[i] = _mm256_add_ps(s[i], s[i + 4]);
    for (int i = 0; i < 2; ++i) s[i] = _mm256_add_ps(s[i], s[i + 2]);
    __m256 v = _mm256_add_ps(s[0], s[1]);
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
}

static inline void exact_block(const float *x, const uint16_t *r, __m256 *s) {
    for (int p = 0; p < 8; ++p)
        s[p] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * p),
                               bf16x8_natural(r + 8 * p), s[p]);
}

void rows_bf16_exact(const float *xn, const void *wv, const float *unused,
                     void *y, int y_f32, long lo, long hi, long k, long j0,
                     long j1) {
    const uint16_t *w = (const uint16_t *)wv;
    (void)unused;
    const long per = (hi - lo) / 4;
    FULL_PASSES(j, j0, j1, per) {
        const uint16_t *r[4];
        __m256 s[4][8];
        for (int q = 0; q < 4; ++q) {
            r[q] = w + (lo + q * per + j) * k;
            for (int p = 0; p < 8; ++p) s[q][p] = _mm256_setzero_ps();
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
        __m256 s[8];
        for (int p = 0; p < 8; ++p) s[p] = _mm256_setzero_ps();
        for (long i = 0; i < k; i += 64) exact_block(xn + i, w + n * k + i, s);
        store(y, y_f32, n, reduce_like_aten(s));
    }
}

/* x ~= xs * qx with xs = max|x| / 32767: each x * (32767 / max|x|)
   rounded to nearest even (cvtps, as cvtss) and clamped to +-32767, eight
   at a time; the plain loop it replaced is quantize_x_reference in
   tests/fast/csrc/step_reference.c (the tests compare their bits). */
int quantize_x(const float *x, long k, int16_t *qx) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(3.4028235e38f);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (long i = 0; i < k; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* inf, NaN */
        m = _mm256_max_ps(m, a);
    }
    if (_mm256_movemask_ps(bad)) return 0;
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, xs = amax / 32767.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    const __m256i hi = _mm256_set1_epi32(32767), lo = _mm256_set1_epi32(-32767);
    for (long i = 0; i < k; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
        v = _mm256_max_epi32(_mm256_min_epi32(v, hi), lo);
        const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(v),
                                          _mm256_extracti128_si256(v, 1));
        _mm_storeu_si128((__m128i *)(qx + i), p);
    }
    memcpy(qx + k, &xs, 4);
    return 1;
}
