/* Kernel variants: other row kernels for the same products, chosen at run
   time by what the CPU can execute and by measuring (utils/fast/tuner.py).

   Three classes, each with the kernel of matvec.c first (the reference,
   the default, and what an AVX2-only CPU keeps unless timing says
   otherwise):
   - exact: the sums of rows_bf16_exact (ATen's order), bit for bit;
   - fast: bf16 in a free order, within float32's bound of the exact dot
     product (rows_bf16 and the AVX512_BF16 form);
   - int8: the bits of rows_i8q.
   The AVX-512 functions carry target attributes, so the library is still
   built with -mavx2 -mfma and runs on any AVX2 CPU: they are only called
   where cpu_features() (cpuid, and whether the OS saves the AVX-512
   registers) reports the instructions; every entry point checks. A
   compiler too old for the AVX512_BF16 intrinsics builds the AVX2 ones
   alone. */

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>

#include "matvec.h"

#if defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10
#define QWEN3_AVX512 1
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define T512BF16 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define T512VNNI \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))
#endif

/* Keeps a loaded vector in a register: without it gcc folds the load into
   both the shift and the mask below and reads every weight line twice. */
#define KEEP(v) __asm__("" : "+x"(v))
#define KEEP512(v) __asm__("" : "+v"(v))

/* ---- what the CPU runs ------------------------------------------------- */

static int detect_features(void) {
    unsigned a, b, c, d, xcr0, xcr0_hi;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx || __get_cpuid_max(0, NULL) < 7) return 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0 & 0x6) != 0x6) return 0; /* the OS saves xmm and ymm */
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned subleaves = a;
    int f = 0;
    if (fma && ((b >> 5) & 1)) f |= CPU_AVX2;
    /* AVX512 F (bit 16), DQ (17), BW (30), VL (31); the OS saves the
       opmask and zmm registers (XCR0 bits 5-7) */
    const unsigned fdbv = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    if (!(f & CPU_AVX2) || (b & fdbv) != fdbv || (xcr0 & 0xe6) != 0xe6) return f;
    f |= CPU_AVX512;
    if ((c >> 11) & 1) f |= CPU_AVX512_VNNI;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 5) & 1) f |= CPU_AVX512_BF16;
    }
    return f;
}

static int detected = -1, limit = -1;

QWEN3_INTERNAL int cpu_features(void) {
    if (detected < 0) detected = detect_features();
    return detected & limit;
}

/* ---- x preparations ------------------------------------------------------- */

/* Per block of 2*half columns: the even columns, then the odd ones */
static void evenodd(const float *xn, long k, int half, float *xp) {
    for (long b = 0; b < k; b += 2 * half)
        for (int i = 0; i < half; ++i) {
            xp[b + i] = xn[b + 2 * i];
            xp[b + half + i] = xn[b + 2 * i + 1];
        }
}

static void evenodd8(const float *xn, long k, float *xp) { evenodd(xn, k, 8, xp); }

/* ---- exact class, AVX2: one 256-bit load per 16 columns ----------------- */

/* ATen's last steps on the even/odd halves of a folded 8-column block: e
   holds columns 0,2,4,6, o columns 1,3,5,7; the result is
   ((c0+c4)+(c2+c6))+((c1+c5)+(c3+c7)), as reduce_like_aten's lanes. */
static inline float evenodd_finish(__m128 e, __m128 o) {
    e = _mm_add_ps(e, _mm_movehl_ps(e, e));
    o = _mm_add_ps(o, _mm_movehl_ps(o, o));
    const float u0 = _mm_cvtss_f32(_mm_add_ss(e, _mm_shuffle_ps(e, e, 1)));
    const float u1 = _mm_cvtss_f32(_mm_add_ss(o, _mm_shuffle_ps(o, o, 1)));
    return u0 + u1;
}

/* R (1 or 2) rows; per 64 columns four 256-bit loads: a 32-bit lane's low
   half shifted up is column 2i, its masked high half column 2i+1 (x from
   evenodd8). e[q][j] lane i holds column 16j+2i of every block, o[q][j]
   column 16j+2i+1; ATen's stages (c + c+32, c + c+16, c + c+8) become
   (j + j+2), (j + j+1), (low + high 128 bits). */
static inline void eo2_rows(const float *xp, const uint16_t *const *r, int R,
                            long k, float *out, long ahead) {
    const __m256i mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 e[2][4], o[2][4];
    for (int q = 0; q < R; ++q)
        for (int j = 0; j < 4; ++j) e[q][j] = o[q][j] = _mm256_setzero_ps();
    for (long i = 0; i < k; i += 64)
        for (int q = 0; q < R; ++q) {
            if (ahead) { /* this block's two lines, `ahead` bytes on */
                const char *p = (const char *)(r[q] + i) + ahead;
                _mm_prefetch(p, _MM_HINT_NTA);
                _mm_prefetch(p + 64, _MM_HINT_NTA);
            }
            for (int j = 0; j < 4; ++j) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(r[q] + i + 16 * j));
                KEEP(v);
                const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
                e[q][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 16 * j), lo, e[q][j]);
                o[q][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 16 * j + 8), hi, o[q][j]);
            }
        }
    for (int q = 0; q < R; ++q) {
        const __m256 E = _mm256_add_ps(_mm256_add_ps(e[q][0], e[q][2]),
                                       _mm256_add_ps(e[q][1], e[q][3]));
        const __m256 O = _mm256_add_ps(_mm256_add_ps(o[q][0], o[q][2]),
                                       _mm256_add_ps(o[q][1], o[q][3]));
        out[q] = evenodd_finish(
            _mm_add_ps(_mm256_castps256_ps128(E), _mm256_extractf128_ps(E, 1)),
            _mm_add_ps(_mm256_castps256_ps128(O), _mm256_extractf128_ps(O, 1)));
    }
}

/* The sums of rows_bf16_exact in two sections (see rows_fn), each row's
   lines fetched `ahead` rows early where ahead > 0 */
static inline void eo_sections(const float *xp, const void *wv, void *y,
                               int y_f32, long lo, long hi, long k, long j0,
                               long j1, long ahead) {
    const uint16_t *w = (const uint16_t *)wv;
    const long per = (hi - lo) / 2, bytes = ahead * k * 2;
    float out[2];
    FULL_PASSES(j, j0, j1, per) {
        const uint16_t *r[2] = {w + (lo + j) * k, w + (lo + per + j) * k};
        eo2_rows(xp, r, 2, k, out, bytes);
        store(y, y_f32, lo + j, out[0]);
        store(y, y_f32, lo + per + j, out[1]);
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 2) {
        const uint16_t *r[1] = {w + n * k};
        eo2_rows(xp, r, 1, k, out, 0);
        store(y, y_f32, n, out[0]);
    }
}

static void rows_exact_eo(const float *xp, const void *wv, const float *unused,
                          void *y, int y_f32, long lo, long hi, long k,
                          long j0, long j1) {
    (void)unused;
    eo_sections(xp, wv, y, y_f32, lo, hi, k, j0, j1, 0);
}

/* The same, each line prefetched two rows (one pass per row) early with
   the non-temporal hint: on a 2-core Zen 5 VM whole bf16 steps then read at
   0.99-1.02 of torch.sum at 51-55 GB/s, against 0.92-0.94 without */
static void rows_exact_eo_nta(const float *xp, const void *wv,
                              const float *unused, void *y, int y_f32,
                              long lo, long hi, long k, long j0, long j1) {
    (void)unused;
    eo_sections(xp, wv, y, y_f32, lo, hi, k, j0, j1, 2);
}

#ifdef QWEN3_AVX512

static void evenodd16(const float *xn, long k, float *xp) { evenodd(xn, k, 16, xp); }

/* x as bf16 for vdpbf16ps (exact where x holds bf16 values, as in the step) */
static void x_to_bf16(const float *xn, long k, float *xp) {
    uint16_t *h = (uint16_t *)xp;
    for (long i = 0; i < k; ++i) h[i] = to_bf16(xn[i]);
}

/* ---- exact class, AVX-512 ------------------------------------------------ */

/* A row's sum from its even and odd accumulators (e[j] lane i: column
   32j+2i of every block, o[j]: 32j+2i+1) in ATen's stages: (j0 + j1),
   (low + high 256 bits), (low + high 128 bits), then evenodd_finish */
T512 INLINE float eo5_finish(const __m512 *e, const __m512 *o) {
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

/* R (1 to 4) rows; per 64 columns two 512-bit loads per row: e[q][j] lane
   i holds column 32j+2i, o[q][j] column 32j+2i+1. x is float32 from
   evenodd16 (four loads per 64 columns) or, with xb, bf16 from x_to_bf16
   split like the weights (two loads; exact where x holds bf16 values, as
   in the step): the same products land in the same lanes in the same
   order either way. ATen's stages: eo5_finish. */
T512 INLINE void eo5_body(int xb, const void *xv, const uint16_t *const *r,
                          int R, long k, float *out) {
    __m512 e[4][2], o[4][2];
    for (int q = 0; q < R; ++q)
        for (int j = 0; j < 2; ++j) e[q][j] = o[q][j] = _mm512_setzero_ps();
    for (long i = 0; i < k; i += 64) {
        __m512 xe[2], xo[2];
        for (int j = 0; j < 2; ++j) {
            if (xb) {
                split_bf16((const uint16_t *)xv + i + 32 * j, &xe[j], &xo[j]);
            } else {
                xe[j] = _mm512_loadu_ps((const float *)xv + i + 32 * j);
                xo[j] = _mm512_loadu_ps((const float *)xv + i + 32 * j + 16);
            }
        }
        for (int q = 0; q < R; ++q)
            for (int j = 0; j < 2; ++j) {
                __m512 lo, hi;
                split_bf16(r[q] + i + 32 * j, &lo, &hi);
                e[q][j] = _mm512_fmadd_ps(xe[j], lo, e[q][j]);
                o[q][j] = _mm512_fmadd_ps(xo[j], hi, o[q][j]);
            }
    }
    for (int q = 0; q < R; ++q) out[q] = eo5_finish(e[q], o[q]);
}

T512 INLINE void eo5_rows(const void *xv, const uint16_t *const *r, int R,
                          long k, float *out) {
    eo5_body(0, xv, r, R, k, out);
}

/* eo5_body with x as bf16. With one row per pass (one stream per thread)
   a 2-core Zen 4 VM's products then kept up with torch.sum's 50-60 GB/s
   (0.94 of it), where float32 x read at 0.52 with one row and 0.73-0.80
   with four (the load queue, not the arithmetic, is the limit:
   measurements in the README) */
T512 INLINE void xb_rows(const void *xv, const uint16_t *const *r, int R,
                         long k, float *out) {
    eo5_body(1, xv, r, R, k, out);
}

/* R rows' sums of a bf16 matrix (x prepared for the body) */
typedef void (*bf16_body)(const void *x, const uint16_t *const *r, int R,
                          long k, float *out);

/* Passes [j0, j1) of rows [lo, hi) in S (1 to 4) sections with `body`
   (see rows_fn; inlined with constant S and body: one loop per kernel) */
T512 INLINE void bf16_sections(int S, bf16_body body, const void *x,
                               const uint16_t *w, void *y, int y_f32, long lo,
                               long hi, long k, long j0, long j1) {
    const long per = (hi - lo) / S;
    float out[4];
    FULL_PASSES(j, j0, j1, per) {
        const uint16_t *r[4];
        for (int q = 0; q < S; ++q) r[q] = w + (lo + q * per + j) * k;
        body(x, r, S, k, out);
        for (int q = 0; q < S; ++q) store(y, y_f32, lo + q * per + j, out[q]);
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, S) {
        const uint16_t *r[1] = {w + n * k};
        body(x, r, 1, k, out);
        store(y, y_f32, n, out[0]);
    }
}

/* The sums of rows_bf16_exact, four far-apart rows per pass. */
T512 static void rows_exact_512(const float *xp, const void *wv,
                                const float *unused, void *y, int y_f32,
                                long lo, long hi, long k, long j0, long j1) {
    (void)unused;
    bf16_sections(4, eo5_rows, xp, (const uint16_t *)wv, y, y_f32, lo, hi, k,
                  j0, j1);
}

/* The same sums with x as bf16 (xb_rows), one row per pass */
T512 static void rows_exact_512_xb(const float *xp, const void *wv,
                                   const float *unused, void *y, int y_f32,
                                   long lo, long hi, long k, long j0,
                                   long j1) {
    (void)unused;
    bf16_sections(1, xb_rows, xp, (const uint16_t *)wv, y, y_f32, lo, hi, k,
                  j0, j1);
}

/* xb_rows, two far-apart rows per pass */
T512 static void rows_exact_512_xb_s2(const float *xp, const void *wv,
                                      const float *unused, void *y,
                                      int y_f32, long lo, long hi, long k,
                                      long j0, long j1) {
    (void)unused;
    bf16_sections(2, xb_rows, xp, (const uint16_t *)wv, y, y_f32, lo, hi, k,
                  j0, j1);
}

/* ---- fast class, AVX512_BF16 ------------------------------------------- */

/* vdpbf16ps: 32 bf16 products per instruction, added pairwise into float32
   lanes (denormal inputs and results read as zero). R (1 to 4) rows, two
   accumulators each; x from x_to_bf16. */
T512BF16 INLINE void dp_rows(const void *xv, const uint16_t *const *r,
                             int R, long k, float *out) {
    const uint16_t *x = (const uint16_t *)xv;
    __m512 a[4], b[4];
    for (int q = 0; q < R; ++q) a[q] = b[q] = _mm512_setzero_ps();
    for (long i = 0; i < k; i += 64) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x + i);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(x + i + 32);
        for (int q = 0; q < R; ++q) {
            const __m512i w0 = _mm512_loadu_si512(r[q] + i);
            const __m512i w1 = _mm512_loadu_si512(r[q] + i + 32);
            a[q] = _mm512_dpbf16_ps(a[q], (__m512bh)w0, x0);
            b[q] = _mm512_dpbf16_ps(b[q], (__m512bh)w1, x1);
        }
    }
    for (int q = 0; q < R; ++q)
        out[q] = _mm512_reduce_add_ps(_mm512_add_ps(a[q], b[q]));
}

T512BF16 static void rows_fast_bf16dp(const float *xp, const void *wv,
                                      const float *unused, void *y, int y_f32,
                                      long lo, long hi, long k, long j0,
                                      long j1) {
    (void)unused;
    bf16_sections(4, dp_rows, xp, (const uint16_t *)wv, y, y_f32, lo, hi, k,
                  j0, j1);
}

/* ---- int8 class, AVX2 ----------------------------------------------------- */

/* R (1 to 2) rows as rows_i8q adds them: per 16 columns one sign extension
   and one vpmaddwd into an int32 lane sum, converted per I16_CHUNK; each
   64-byte line fetched `ahead` bytes early (non-temporal) where ahead > 0 */
static inline void i8_rows(const int16_t *qx, const int8_t *const *r, int R,
                           long k, __m256 *f, long ahead) {
    for (int q = 0; q < R; ++q) f[q] = _mm256_setzero_ps();
    for (long c = 0; c < k; c += I16_CHUNK) {
        const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
        __m256i a[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (long i = c; i < end; i += 16) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(qx + i));
            for (int q = 0; q < R; ++q) {
                if (ahead && !(i & 63))
                    _mm_prefetch((const char *)(r[q] + i) + ahead, _MM_HINT_NTA);
                const __m128i v = _mm_loadu_si128((const __m128i *)(r[q] + i));
                const __m256i w = _mm256_cvtepi8_epi16(v);
                a[q] = _mm256_add_epi32(a[q], _mm256_madd_epi16(w, xq));
            }
        }
        for (int q = 0; q < R; ++q)
            f[q] = _mm256_add_ps(f[q], _mm256_cvtepi32_ps(a[q]));
    }
}

/* rows_i8q's sums, two far-apart rows per pass (two streams per thread),
   lines fetched `ahead` rows early where ahead > 0 */
static inline void i8_sections(const float *qxv, const void *wv,
                               const float *scale, void *y, int y_f32,
                               long lo, long hi, long k, long j0, long j1,
                               long ahead) {
    const int8_t *w = (const int8_t *)wv;
    const int16_t *qx = (const int16_t *)qxv;
    float xs;
    memcpy(&xs, qx + k, 4);
    const long per = (hi - lo) / 2;
    __m256 f[2];
    FULL_PASSES(j, j0, j1, per) {
        const long n0 = lo + j, n1 = lo + per + j;
        const int8_t *r[2] = {w + n0 * k, w + n1 * k};
        i8_rows(qx, r, 2, k, f, ahead * k);
        store(y, y_f32, n0, hsum(f[0]) * xs * scale[n0]);
        store(y, y_f32, n1, hsum(f[1]) * xs * scale[n1]);
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, 2) {
        const int8_t *r[1] = {w + n * k};
        i8_rows(qx, r, 1, k, f, 0);
        store(y, y_f32, n, hsum(f[0]) * xs * scale[n]);
    }
}

static void rows_i8q_s2(const float *qx, const void *w, const float *scale,
                        void *y, int y_f32, long lo, long hi, long k, long j0,
                        long j1) {
    i8_sections(qx, w, scale, y, y_f32, lo, hi, k, j0, j1, 0);
}

static void rows_i8q_s2_nta(const float *qx, const void *w,
                            const float *scale, void *y, int y_f32, long lo,
                            long hi, long k, long j0, long j1) {
    i8_sections(qx, w, scale, y, y_f32, lo, hi, k, j0, j1, 2);
}

/* ---- int8 class, AVX512_VNNI --------------------------------------------- */

/* R (1 to 4) rows, per 64 columns two sign extensions and two vpdpwssd. A
   lane j < 8 holds columns 32b+2j and 32b+2j+1, lane j+8 columns
   32b+16+2j and 32b+17+2j: the two 256-bit halves added are rows_i8q's
   int32 lane j for the chunk (integer sums: the same values), converted
   and added as there. */
T512VNNI INLINE void vnni_rows(const int16_t *qx, const int8_t *const *r,
                               int R, long k, __m256 *f, long ahead) {
    for (int q = 0; q < R; ++q) f[q] = _mm256_setzero_ps();
    for (long c = 0; c < k; c += I16_CHUNK) {
        const long end = c + I16_CHUNK < k ? c + I16_CHUNK : k;
        __m512i a[4], b[4];
        for (int q = 0; q < R; ++q) a[q] = b[q] = _mm512_setzero_si512();
        for (long i = c; i < end; i += 64) {
            const __m512i x0 = _mm512_loadu_si512(qx + i);
            const __m512i x1 = _mm512_loadu_si512(qx + i + 32);
            for (int q = 0; q < R; ++q) {
                const __m256i *p = (const __m256i *)(r[q] + i);
                if (ahead) /* this line, `ahead` bytes on (non-temporal) */
                    _mm_prefetch((const char *)p + ahead, _MM_HINT_NTA);
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

/* Passes [j0, j1) of rows [lo, hi) in S far-apart sections (1 to 4; see
   rows_fn): S rows per pass, each section one stream through memory, its
   lines fetched `ahead` rows early where ahead > 0 */
T512VNNI INLINE void vnni_sections(int S, long ahead, const float *qxv,
                                   const void *wv, const float *scale,
                                   void *y, int y_f32, long lo, long hi,
                                   long k, long j0, long j1) {
    const int8_t *w = (const int8_t *)wv;
    const int16_t *qx = (const int16_t *)qxv;
    float xs;
    memcpy(&xs, qx + k, 4);
    const long per = (hi - lo) / S;
    __m256 f[4];
    FULL_PASSES(j, j0, j1, per) {
        const int8_t *r[4];
        for (int q = 0; q < S; ++q) r[q] = w + (lo + q * per + j) * k;
        vnni_rows(qx, r, S, k, f, ahead * k);
        for (int q = 0; q < S; ++q) {
            const long n = lo + q * per + j;
            store(y, y_f32, n, hsum(f[q]) * xs * scale[n]);
        }
    }
    LEFTOVER_ROWS(n, j0, j1, per, lo, S) {
        const int8_t *r[1] = {w + n * k};
        vnni_rows(qx, r, 1, k, f, 0);
        store(y, y_f32, n, hsum(f[0]) * xs * scale[n]);
    }
}

T512VNNI static void rows_i8q_vnni(const float *qx, const void *w,
                                   const float *scale, void *y, int y_f32,
                                   long lo, long hi, long k, long j0,
                                   long j1) {
    vnni_sections(4, 0, qx, w, scale, y, y_f32, lo, hi, k, j0, j1);
}

/* Two sections: on a 2-core Zen 5 VM whole int8 steps read at 0.80 of
   torch.sum at 57-59 GB/s where four sections read at 0.71 */
T512VNNI static void rows_i8q_vnni_s2(const float *qx, const void *w,
                                      const float *scale, void *y, int y_f32,
                                      long lo, long hi, long k, long j0,
                                      long j1) {
    vnni_sections(2, 0, qx, w, scale, y, y_f32, lo, hi, k, j0, j1);
}

/* Two sections, each line prefetched two rows early (non-temporal): there
   0.90 against 0.85-0.87 without, at 52-60 GB/s */
T512VNNI static void rows_i8q_vnni_s2_nta(const float *qx, const void *w,
                                          const float *scale, void *y,
                                          int y_f32, long lo, long hi, long k,
                                          long j0, long j1) {
    vnni_sections(2, 2, qx, w, scale, y, y_f32, lo, hi, k, j0, j1);
}

#endif /* QWEN3_AVX512 */

/* ---- the table ------------------------------------------------------------ */

/* Per class the kernel of matvec.c first: the reference and the default */
static const kernel_variant VARIANTS[] = {
    {"bf16_exact_avx2", {rows_bf16_exact, 4}, NULL, CLASS_EXACT, CPU_AVX2, 64},
    {"bf16_exact_avx2_np", {rows_bf16_exact_np, 4}, NULL, CLASS_EXACT,
     CPU_AVX2, 64},
    {"bf16_exact_avx2_eo", {rows_exact_eo, 2}, evenodd8, CLASS_EXACT, CPU_AVX2,
     64},
    {"bf16_exact_avx2_eo_nta", {rows_exact_eo_nta, 2}, evenodd8, CLASS_EXACT,
     CPU_AVX2, 64},
#ifdef QWEN3_AVX512
    {"bf16_exact_avx512", {rows_exact_512, 4}, evenodd16, CLASS_EXACT,
     CPU_AVX2 | CPU_AVX512, 64},
    {"bf16_exact_avx512_xb", {rows_exact_512_xb, 1}, x_to_bf16, CLASS_EXACT,
     CPU_AVX2 | CPU_AVX512, 64},
    {"bf16_exact_avx512_xb_s2", {rows_exact_512_xb_s2, 2}, x_to_bf16,
     CLASS_EXACT, CPU_AVX2 | CPU_AVX512, 64},
#endif
    {"bf16_fast_avx2", {rows_bf16, 4}, permute16, CLASS_FAST, CPU_AVX2, 16},
#ifdef QWEN3_AVX512
    {"bf16_fast_avx512bf16", {rows_fast_bf16dp, 4}, x_to_bf16, CLASS_FAST,
     CPU_AVX2 | CPU_AVX512 | CPU_AVX512_BF16, 64},
#endif
    {"int8_avx2", {rows_i8q, 4}, NULL, CLASS_INT8, CPU_AVX2, 16},
    {"int8_avx2_s2", {rows_i8q_s2, 2}, NULL, CLASS_INT8, CPU_AVX2, 16},
    {"int8_avx2_s2_nta", {rows_i8q_s2_nta, 2}, NULL, CLASS_INT8, CPU_AVX2, 16},
#ifdef QWEN3_AVX512
    {"int8_avx512vnni", {rows_i8q_vnni, 4}, NULL, CLASS_INT8,
     CPU_AVX2 | CPU_AVX512 | CPU_AVX512_VNNI, 64},
    {"int8_avx512vnni_s2", {rows_i8q_vnni_s2, 2}, NULL, CLASS_INT8,
     CPU_AVX2 | CPU_AVX512 | CPU_AVX512_VNNI, 64},
    {"int8_avx512vnni_s2_nta", {rows_i8q_vnni_s2_nta, 2}, NULL, CLASS_INT8,
     CPU_AVX2 | CPU_AVX512 | CPU_AVX512_VNNI, 64},
#endif
};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static const char *const CLASS_NAMES[CLASS_COUNT] = {"exact", "fast", "int8"};

QWEN3_INTERNAL int variant_status(int i, int cls) {
    if (i < 0 || i >= N_VARIANTS || (cls >= 0 && VARIANTS[i].cls != cls)) return 1;
    return VARIANTS[i].needs & ~cpu_features() ? 3 : 0;
}

QWEN3_INTERNAL const kernel_variant *variant_for(int i, int cls) {
    return variant_status(i, cls) ? NULL : &VARIANTS[i];
}

static const kernel_variant *first_of(int cls) {
    for (int i = 0; i < N_VARIANTS; ++i)
        if (VARIANTS[i].cls == cls) return &VARIANTS[i];
    return NULL; /* not reached: every class has its default */
}

QWEN3_INTERNAL const kernel_variant *variant_fitting(const kernel_variant *v,
                                                     long k) {
    if (k % v->kmul == 0) return v;
    return first_of(v->cls == CLASS_INT8 ? CLASS_INT8 : CLASS_FAST);
}

/* ---- entry points ----------------------------------------------------------- */

/* The names of cpu_features()'s bits, in bit order ("avx512": F, BW, DQ
   and VL together) */
const char *qwen3_cpu_feature_names(void) {
    return "avx2,avx512,avx512_bf16,avx512_vnni";
}

/* What this CPU runs (bits, see qwen3_cpu_feature_names) */
int qwen3_cpu_features(void) { return cpu_features(); }

/* For the tests: act as if the CPU had only the features in mask (-1:
   all it has; a limit never adds any); returns cpu_features(). */
int qwen3_limit_cpu_features(int mask) {
    limit = mask;
    return cpu_features();
}

/* "name:class:needs:kmul;" per variant, in table order (the index Python
   passes back); needs is a bit mask as cpu_features() */
const char *qwen3_variant_table(void) {
    static char text[2048];
    if (!text[0]) {
        size_t used = 0;
        for (int i = 0; i < N_VARIANTS; ++i) {
            const kernel_variant *v = &VARIANTS[i];
            used += (size_t)snprintf(text + used, sizeof text - used,
                                     "%s:%s:%d:%d;", v->name,
                                     CLASS_NAMES[v->cls], v->needs, v->kmul);
        }
    }
    return text;
}

/* 0 when variant i can run here with k columns (and scales given exactly
   for the int8 class), 1 for bad arguments, 3 when the CPU lacks its
   instructions */
static int variant_usable(int i, long k, const void *scales) {
    if (i < 0 || i >= N_VARIANTS) return 1;
    const kernel_variant *v = &VARIANTS[i];
    if (k % v->kmul || (v->cls == CLASS_INT8) != (scales != NULL)) return 1;
    return variant_status(i, -1);
}

/* Whether an exact variant would round x (it takes x as bf16: x_to_bf16)
   while x holds a value bf16 cannot represent; the step's x never does */
static int rounds_x(const kernel_variant *v, const float *xn, long k) {
#ifdef QWEN3_AVX512
    if (v->cls != CLASS_EXACT || v->prep != x_to_bf16) return 0;
    for (long i = 0; i < k; ++i) {
        uint32_t u;
        memcpy(&u, xn + i, 4);
        if (u & 0xffffu) return 1;
    }
#else
    (void)v, (void)xn, (void)k;
#endif
    return 0;
}

/* As the *_multi entry points, with variant i (no fallback: k must fit;
   1 also for an x that variant i would round, see rounds_x). */
int qwen3_matvec_variant(int i, const void *x, int x_f32, int count,
                         const void *const *w, const float *const *scales,
                         const long *n, void *y, int y_f32, long k,
                         int threads) {
    const int bad = variant_usable(i, k, scales);
    if (bad || bad_group(count, n)) return bad ? bad : 1;
    const kernel_variant *v = &VARIANTS[i];
    float *xn = malloc((size_t)k * 8 + 64);
    if (!xn) return 2;
    load_x(x, x_f32, k, xn);
    if (rounds_x(v, xn, k)) {
        free(xn);
        return 1;
    }
    float *xp = xn + k;
    const group g = {count, w, scales, n};
    if (v->cls == CLASS_INT8) {
        int8_group(xn, &g, y, y_f32, k, threads, (int16_t *)xp, &v->rows);
    } else {
        if (v->prep) v->prep(xn, k, xp);
        run(&v->rows, v->prep ? xp : xn, &g, y, y_f32, k, threads);
    }
    free(xn);
    return 0;
}

/* For the tuner: `reps` products of one (n, k) matrix with variant i on
   this thread (float32 x and y; for int8 x must be finite): a
   cache-resident matrix measures the kernel's own speed. */
int qwen3_variant_hot(int i, const float *x, const void *w,
                      const float *scales, long n, long k, int reps,
                      float *y) {
    const int bad = variant_usable(i, k, scales);
    if (bad || n < 1) return bad ? bad : 1;
    const kernel_variant *v = &VARIANTS[i];
    float *xp = malloc((size_t)k * 4 + 64);
    if (!xp) return 2;
    if (v->cls == CLASS_INT8 && !quantize_x(x, k, (int16_t *)xp)) {
        free(xp);
        return 1;
    }
    if (v->cls != CLASS_INT8) {
        if (v->prep) v->prep(x, k, xp);
        else memcpy(xp, x, (size_t)k * 4);
    }
    const long passes = pass_count(n, v->rows.sections);
    for (int r = 0; r < reps; ++r)
        v->rows.fn(xp, w, scales, y, 1, 0, n, k, 0, passes);
    free(xp);
    return 0;
}
