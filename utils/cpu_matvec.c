/* Matrix-vector kernels for single-token decoding (see cpu_matvec.py).

   Built by utils/cpu_matvec.py with the system C compiler:
   cc -O3 -mavx2 -mfma [-fopenmp] -shared -fPIC cpu_matvec.c
   Rows per group each thread streams at once: 4, prefetching 512 bytes
   ahead (on a 2-core AVX2 EPYC VM: 1 row ~10 GB/s, 4 rows ~17.5 GB/s).
   The *_multi entry points take several weights that share one input
   (q, k, v; gate and up) and fill one output: one call, one parallel
   region, rows split evenly over the threads across all the matrices. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
/* from omp.h, declared here so no OpenMP headers are needed */
int omp_get_thread_num(void);
int omp_get_num_threads(void);
#endif

#define PREFETCH_BYTES 512

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16, round to nearest even (NaN stays NaN) */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void store(void *y, int y_f32, long n, float v) {
    if (y_f32) ((float *)y)[n] = v;
    else ((uint16_t *)y)[n] = to_bf16(v);
}

static void load_x(const void *x, int x_f32, long k, float *out) {
    if (x_f32) { memcpy(out, x, (size_t)k * 4); return; }
    for (long i = 0; i < k; ++i) out[i] = from_bf16(((const uint16_t *)x)[i]);
}

/* Unpacking 16 bf16 values (one 256-bit load) interleaves the two 128-bit
   lanes: the low unpack holds elements 0-3 and 8-11, the high one 4-7 and
   12-15. Reordering x the same way once is cheaper than reordering w. */
static void permute16(const float *xn, long k, float *xp) {
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

#define PF(p) _mm_prefetch((const char *)(p) + PREFETCH_BYTES, _MM_HINT_T0)

/* Rows [lo, hi) of y = w x, four far-apart rows at a time. */
static void rows_bf16(const float *xp, const void *wv, const float *unused,
                      void *y, int y_f32, long lo, long hi, long k) {
    const uint16_t *w = (const uint16_t *)wv;
    (void)unused;
    const long per = (hi - lo) / 4;
    for (long j = 0; j < per; ++j) {
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
    for (long n = lo + 4 * per; n < hi; ++n) {
        const uint16_t *r = w + n * k;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (long i = 0; i < k; i += 16)
            bf16_fma(r + i, _mm256_loadu_ps(xp + i),
                     _mm256_loadu_ps(xp + i + 8), &a, &b);
        store(y, y_f32, n, hsum(_mm256_add_ps(a, b)));
    }
}

static void rows_i8(const float *xn, const void *wv, const float *scale,
                    void *y, int y_f32, long lo, long hi, long k) {
    const int8_t *w = (const int8_t *)wv;
    const long per = (hi - lo) / 4;
    for (long j = 0; j < per; ++j) {
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
    for (long n = lo + 4 * per; n < hi; ++n) {
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
   the row's scale. qx must hold xs as its last float (see qwen3_matvec_int8). */
#define I16_CHUNK 1024

static inline __m256i i16_madd(const int8_t *p, __m256i xq) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_madd_epi16(w, xq);
}

static void rows_i8q(const float *qxv, const void *wv, const float *scale,
                     void *y, int y_f32, long lo, long hi, long k) {
    const int8_t *w = (const int8_t *)wv;
    const int16_t *qx = (const int16_t *)qxv;
    float xs;
    memcpy(&xs, qx + k, 4);
    const long per = (hi - lo) / 4;
    for (long j = 0; j < per + (hi - lo) % 4; ++j) {
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

/* Same sums, in the same order, as torch's bf16 matrix-vector product on
   AVX2 CPUs (ATen's dot with float32 arithmetic): per row, eight 8-lane
   float32 accumulators over blocks of 64 columns, accumulator 2p+h taking
   columns 16p+8h .. 16p+8h+7 of each block; then accumulators summed
   pairwise (i += i+4, i += i+2, i += i+1) and the lanes as
   ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)). The result is bit-identical to
   F.linear there, which keeps greedy decoding token-for-token with the book. */
static inline __m256 bf16x8_natural(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

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

static void rows_bf16_exact(const float *xn, const void *wv,
                            const float *unused, void *y, int y_f32, long lo,
                            long hi, long k) {
    const uint16_t *w = (const uint16_t *)wv;
    (void)unused;
    const long per = (hi - lo) / 4;
    for (long j = 0; j < per; ++j) {
        const uint16_t *r[4];
        __m256 s[4][8];
        for (int q = 0; q < 4; ++q) {
            r[q] = w + (lo + q * per + j) * k;
            for (int p = 0; p < 8; ++p) s[q][p] = _mm256_setzero_ps();
        }
        for (long i = 0; i < k; i += 64)
            for (int q = 0; q < 4; ++q) {
                PF(r[q] + i); PF(r[q] + i + 32);
                exact_block(xn + i, r[q] + i, s[q]);
            }
        for (int q = 0; q < 4; ++q)
            store(y, y_f32, lo + q * per + j, reduce_like_aten(s[q]));
    }
    for (long n = lo + 4 * per; n < hi; ++n) {
        __m256 s[8];
        for (int p = 0; p < 8; ++p) s[p] = _mm256_setzero_ps();
        for (long i = 0; i < k; i += 64) exact_block(xn + i, w + n * k + i, s);
        store(y, y_f32, n, reduce_like_aten(s));
    }
}

typedef void (*rows_fn)(const float *, const void *, const float *, void *,
                        int, long, long, long);

/* One group of matrices sharing x: count weights (n[i], k) stacked into one
   output of sum(n) rows; scales[i] per matrix for int8 (else NULL). */
typedef struct {
    int count;
    const void *const *w;
    const float *const *scales;
    const long *n;
} group;

static long group_rows(const group *g) {
    long total = 0;
    for (int i = 0; i < g->count; ++i) total += g->n[i];
    return total;
}

/* Rows [lo, hi) of the stacked output, matrix by matrix. */
static void group_range(rows_fn fn, const float *xv, const group *g, void *y,
                        int y_f32, long lo, long hi, long k) {
    long base = 0;
    const size_t esize = y_f32 ? 4 : 2;
    for (int i = 0; i < g->count && base < hi; base += g->n[i], ++i) {
        const long a = lo > base ? lo - base : 0;
        const long b = hi - base < g->n[i] ? hi - base : g->n[i];
        if (a >= b) continue;
        fn(xv, g->w[i], g->scales ? g->scales[i] : NULL,
           (char *)y + (size_t)base * esize, y_f32, a, b, k);
    }
}

static int run(rows_fn fn, const float *xv, const group *g, void *y,
               int y_f32, long k, int threads) {
    const long n = group_rows(g);
    /* small matrices are not worth waking the other threads */
    if (threads < 1 || n * k < (1L << 16)) threads = 1;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        group_range(fn, xv, g, y, y_f32, n * t / nt, n * (t + 1) / nt, k);
    }
#else
    (void)threads; /* built without OpenMP: one thread */
    group_range(fn, xv, g, y, y_f32, 0, n, k);
#endif
    return 0;
}

static int bad_group(int count, const long *n) {
    if (count < 1) return 1;
    for (int i = 0; i < count; ++i)
        if (n[i] < 0) return 1;
    return 0;
}

/* The int8 product of one group for float32 x: x rounded to 16-bit fixed
   point into qx (k int16 + one float; rows_i8q), or, if x holds an inf or
   NaN, the float32 kernel rows_i8, so they propagate as in float. */
static void int8_group(const float *xn, const group *g, void *y, int y_f32,
                       long k, int threads, int16_t *qx) {
    float amax = 0.0f;
    int finite = 1;
    for (long i = 0; i < k; ++i) {
        const float a = fabsf(xn[i]);
        finite &= a <= 3.4028235e38f; /* false for inf and NaN */
        amax = a > amax ? a : amax;
    }
    if (!finite) {
        run(rows_i8, xn, g, y, y_f32, k, threads);
        return;
    }
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    const float xs = amax / 32767.0f;
    for (long i = 0; i < k; ++i) {  /* round to nearest even */
        int v = _mm_cvtss_si32(_mm_set_ss(xn[i] * inv));
        qx[i] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
    }
    memcpy(qx + k, &xs, 4);
    run(rows_i8q, (const float *)qx, g, y, y_f32, k, threads);
}

/* y (sum n) = [w_0; w_1; ...] (n_i, k) @ x (k); k % 16 == 0. 0 on success. */
int qwen3_matvec_bf16_multi(const void *x, int x_f32, int count,
                            const void *const *w, const long *n, void *y,
                            int y_f32, long k, int threads) {
    if (k % 16 || bad_group(count, n)) return 1;
    float *xn = malloc((size_t)k * 8);
    if (!xn) return 2;
    load_x(x, x_f32, k, xn);
    permute16(xn, k, xn + k);
    const group g = {count, w, NULL, n};
    run(rows_bf16, xn + k, &g, y, y_f32, k, threads);
    free(xn);
    return 0;
}

/* As qwen3_matvec_bf16_multi, rounding exactly like torch; k % 64 == 0. */
int qwen3_matvec_bf16_exact_multi(const void *x, int x_f32, int count,
                                  const void *const *w, const long *n,
                                  void *y, int y_f32, long k, int threads) {
    if (k % 64 || bad_group(count, n)) return 1;
    float *xn = malloc((size_t)k * 4);
    if (!xn) return 2;
    load_x(x, x_f32, k, xn);
    const group g = {count, w, NULL, n};
    run(rows_bf16_exact, xn, &g, y, y_f32, k, threads);
    free(xn);
    return 0;
}

/* y = stacked (w_i (n_i, k) @ x) * scales_i: int8 w, float32 scales. x is
   rounded to 16-bit fixed point (rows_i8q); if x holds an inf or NaN, the
   float32 kernel rows_i8 runs instead, so they propagate as in float. */
int qwen3_matvec_int8_multi(const void *x, int x_f32, int count,
                            const void *const *w, const float *const *scales,
                            const long *n, void *y, int y_f32, long k,
                            int threads) {
    if (k % 16 || bad_group(count, n)) return 1;
    float *xn = malloc((size_t)k * 4 + (size_t)k * 2 + 4);
    if (!xn) return 2;
    load_x(x, x_f32, k, xn);
    const group g = {count, w, scales, n};
    int8_group(xn, &g, y, y_f32, k, threads, (int16_t *)(xn + k));
    free(xn);
    return 0;
}

/* Single-matrix forms of the three entry points. */
int qwen3_matvec_bf16(const void *x, int x_f32, const void *w, void *y,
                      int y_f32, long n, long k, int threads) {
    return qwen3_matvec_bf16_multi(x, x_f32, 1, &w, &n, y, y_f32, k, threads);
}

int qwen3_matvec_bf16_exact(const void *x, int x_f32, const void *w, void *y,
                            int y_f32, long n, long k, int threads) {
    return qwen3_matvec_bf16_exact_multi(x, x_f32, 1, &w, &n, y, y_f32, k,
                                         threads);
}

int qwen3_matvec_int8(const void *x, int x_f32, const void *w,
                      const float *scale, void *y, int y_f32, long n, long k,
                      int threads) {
    return qwen3_matvec_int8_multi(x, x_f32, 1, &w, &scale, &n, y, y_f32, k,
                                   threads);
}

/* ------------------------------------------------------------------------
   One whole decode step in one call (batch 1; see utils/native_step.py):
   embedding, every layer (RMSNorm, grouped q/k/v, qk-norm, split-halves
   RoPE, cache write, grouped-query attention over the filled slots, output
   projection, SwiGLU) and the head. Values are rounded to bf16 wherever the
   book's bf16 model rounds (every linear output, norm, RoPE, score, softmax,
   SiLU, product and residual add); the float32 sums inside the small
   operations run in their own order, so results are close to the eager
   step's, not bit-equal. Built with -ffp-contract=off: a*b + c*d is two
   rounded products and a rounded sum, as in torch. */

/* pointers per layer, in this order (scales NULL for bf16 weights) */
enum { L_NORM1, L_NORM2, L_QNORM, L_KNORM, L_WQ, L_SQ, L_WK, L_SK, L_WV,
       L_SV, L_WO, L_SO, L_W1, L_S1, L_W2, L_S2, L_W3, L_S3, L_KC, L_VC,
       L_COUNT };
/* pointers before the layers' */
enum { G_EMB, G_EMB_SCALE, G_FINAL_NORM, G_HEAD, G_HEAD_SCALE, G_COS, G_SIN,
       G_COUNT };
/* dims: layers, emb, heads, kv_groups, head_dim, hidden, vocab, cache_len */
enum { D_LAYERS, D_EMB, D_HEADS, D_KV, D_HEAD_DIM, D_HIDDEN, D_VOCAB,
       D_CACHE, D_COUNT };

static inline float rb(float f) { return from_bf16(to_bf16(f)); }

/* rb on 8 floats (same bits as to_bf16, NaN kept quiet) */
static inline __m256 rb8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_set1_epi32(-65536);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                         _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     lsb));
    r = _mm256_and_si256(r, hi);
    const __m256i q = _mm256_or_si256(_mm256_and_si256(u, hi),
                                      _mm256_set1_epi32(0x400000));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q),
                            _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* e^x on 8 floats, within about 1 ulp of expf (range reduction by ln 2
   and a degree-6 polynomial; the classic Cephes coefficients): 0 below
   the smallest subnormal, inf above ln(FLT_MAX), NaN stays NaN. torch's own
   vectorised exp is not glibc's expf either; results round to bf16. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-103.972f), hi = _mm256_set1_ps(88.7228f);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* times 2^n as 2^a * 2^b, a = n >> 1, b = n - a: both factors normal
       for n in [-150, 128], so results near overflow or in the subnormal
       range come out right */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 ea = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    const __m256 eb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, ea), eb);

    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline __m256 load_bf16x8(const uint16_t *p) { return bf16x8_natural(p); }

typedef struct {
    int exact, threads;
    float *xbuf;   /* permuted x (bf16 fast kernel) or int16 x (int8) */
} mv_ctx;

/* y (bf16, sum n) = stacked weights @ x (float32, k): bf16 weights when
   s is NULL (the torch-order kernel with exact and k % 64 == 0), else int8
   weights times their row scales s[i]. */
static void mv(const mv_ctx *c, const float *x, long k, int count,
               const void *const *w, const float *const *s, const long *n,
               uint16_t *y) {
    const group g = {count, w, s, n};
    if (s) {
        int8_group(x, &g, y, 0, k, c->threads, (int16_t *)c->xbuf);
    } else if (c->exact && k % 64 == 0) {
        run(rows_bf16_exact, x, &g, y, 0, k, c->threads);
    } else {
        permute16(x, k, c->xbuf);
        run(rows_bf16, c->xbuf, &g, y, 0, k, c->threads);
    }
}

/* The book's RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * scale
   (n % 8 == 0). */
static void rmsnorm(const float *x, long n, const float *scale, float eps,
                    float *out) {
    double ss = 0.0;
    for (long i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (long i = 0; i < n; i += 8)  /* (x * r) * scale, as in torch */
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(
            _mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(scale + i))));
}

/* One head (bf16 values in h, d entries): optional qk-norm, then RoPE at
   the row of cos/sin given; the result rounded to bf16 in out (t: d floats
   of scratch). */
static void norm_rope(const uint16_t *h, long d, const float *scale,
                      float eps, const float *cos, const float *sin,
                      float *t, float *out) {
    for (long i = 0; i < d; ++i) t[i] = from_bf16(h[i]);
    if (scale) rmsnorm(t, d, scale, eps, t);
    const long half = d / 2;
    for (long i = 0; i < d; ++i) {
        const float rot = i < half ? -t[i + half] : t[i - half];
        out[i] = rb(t[i] * cos[i] + rot * sin[i]);
    }
}

static inline float dot_bf16(const float *q, const uint16_t *k, long d) {
    __m256 a = _mm256_setzero_ps();
    for (long i = 0; i < d; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), bf16x8_natural(k + i), a);
    return hsum(a);
}

/* Attention of query head h over cache slots 0..len-1 of its kv group:
   bf16 scores, scaled, softmax, then the weighted sum of the values. */
static void attend_head(const float *q, const uint16_t *kc,
                        const uint16_t *vc, long len, long d, float *w,
                        float *out) {
    const float inv = 1.0f / (float)sqrt((double)d);
    float mx = -INFINITY;
    for (long j = 0; j < len; ++j) {
        w[j] = rb(rb(dot_bf16(q, kc + j * d, d)) * inv);
        mx = w[j] > mx ? w[j] : mx;
    }
    float sum = 0.0f;
    long j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(w + j),
                                            _mm256_set1_ps(mx)));
        _mm256_storeu_ps(w + j, e);
    }
    for (; j < len; ++j) w[j] = expf(w[j] - mx);
    for (j = 0; j < len; ++j) sum += w[j];
    for (j = 0; j < len; ++j) w[j] = rb(w[j] / sum);
    for (long i = 0; i < d; i += 8) {
        __m256 a = _mm256_setzero_ps();
        for (long j = 0; j < len; ++j)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]),
                                bf16x8_natural(vc + j * d + i), a);
        _mm256_storeu_ps(out + i, rb8(a));
    }
}

/* out = bf16(bf16(silu(gate)) * up) on bf16 inputs, n % 8 == 0 */
static void swiglu(const uint16_t *gate, const uint16_t *up, long n,
                   float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long i = 0; i < n; i += 8) {
        const __m256 g = load_bf16x8(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 act = rb8(_mm256_div_ps(g, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(act, load_bf16x8(up + i))));
    }
}

/* x = bf16(x + y) for n (% 8 == 0) bf16 values y */
static void add_residual(float *x, const uint16_t *y, long n) {
    for (long i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, rb8(_mm256_add_ps(_mm256_loadu_ps(x + i),
                                                  load_bf16x8(y + i))));
}

/* torch.argmax over n bf16 values: the first largest, or the first NaN */
static long argmax_bf16(const uint16_t *v, long n) {
    long best = 0;
    float mx = from_bf16(v[0]);
    if (mx != mx) return 0;
    for (long i = 1; i < n; ++i) {
        const float f = from_bf16(v[i]);
        if (f != f) return i;
        if (f > mx) { mx = f; best = i; }
    }
    return best;
}

/* For the tests: y = rb8(x) (op 0) or exp8(x) (op 1) over n % 8 == 0
   floats; 1 for a bad op or n. */
int qwen3_vector_op(int op, const float *x, float *y, long n) {
    if (n % 8 || op < 0 || op > 1) return 1;
    for (long i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, op ? exp8(v) : rb8(v));
    }
    return 0;
}

/* Logits (bf16, vocab) for `token` at position `pos` and their argmax in
   *next; its key and value are written into the caches first. 0 on
   success, 1 for bad arguments, 2 when out of memory. */
int qwen3_decode_step(const long *dims, double eps_d, const void *const *p,
                      long token, long pos, int exact, uint16_t *logits,
                      long *next, int threads) {
    const long L = dims[D_LAYERS], E = dims[D_EMB], H = dims[D_HEADS];
    const long G = dims[D_KV], D = dims[D_HEAD_DIM], F = dims[D_HIDDEN];
    const long V = dims[D_VOCAB], C = dims[D_CACHE];
    const float eps = (float)eps_d;
    if (L < 1 || E < 16 || E % 16 || F < 16 || F % 16 || D < 16 || D % 16
        || H < 1 || G < 1 || H % G || (H * D) % 16 || V < 1 || C < 1
        || pos < 0 || pos >= C || token < 0 || token >= V)
        return 1;
    const long QKV = (H + 2 * G) * D, K_MAX = E > F ? (E > H * D ? E : H * D)
                                                    : (F > H * D ? F : H * D);
    const long Y_MAX = QKV > 2 * F ? QKV : 2 * F;
    const size_t floats = (size_t)(E + K_MAX + 2 * H * D + K_MAX + 16 + D
                                   + H * (pos + 1));
    float *mem = malloc(floats * 4 + (size_t)Y_MAX * 2);
    if (!mem) return 2;
    float *x = mem, *hin = x + E, *qf = hin + K_MAX, *ctx = qf + H * D;
    float *xbuf = ctx + H * D, *tmp = xbuf + K_MAX + 16, *att = tmp + D;
    uint16_t *y = (uint16_t *)(att + H * (pos + 1));
    const mv_ctx mc = {exact, threads, xbuf};
    const float *cos = (const float *)p[G_COS] + pos * D;
    const float *sin = (const float *)p[G_SIN] + pos * D;

    if (p[G_EMB_SCALE]) {  /* int8 table: row times its scale */
        const int8_t *row = (const int8_t *)p[G_EMB] + token * E;
        const float sc = ((const float *)p[G_EMB_SCALE])[token];
        for (long i = 0; i < E; ++i) x[i] = rb((float)row[i] * sc);
    } else {
        const uint16_t *row = (const uint16_t *)p[G_EMB] + token * E;
        for (long i = 0; i < E; ++i) x[i] = from_bf16(row[i]);
    }

    for (long l = 0; l < L; ++l) {
        const void *const *q = p + G_COUNT + l * L_COUNT;
        const float *qn = q[L_QNORM], *kn = q[L_KNORM];
        uint16_t *kc = (uint16_t *)q[L_KC], *vc = (uint16_t *)q[L_VC];
        /* attention */
        rmsnorm(x, E, q[L_NORM1], eps, hin);
        {
            const void *w[3] = {q[L_WQ], q[L_WK], q[L_WV]};
            const float *s[3] = {q[L_SQ], q[L_SK], q[L_SV]};
            const long n[3] = {H * D, G * D, G * D};
            mv(&mc, hin, E, 3, w, s[0] ? s : NULL, n, y);
        }
        for (long h = 0; h < H; ++h)
            norm_rope(y + h * D, D, qn, eps, cos, sin, tmp, qf + h * D);
        for (long g = 0; g < G; ++g) {
            norm_rope(y + (H + g) * D, D, kn, eps, cos, sin, tmp, ctx);
            uint16_t *kslot = kc + (g * C + pos) * D;
            for (long i = 0; i < D; ++i) kslot[i] = to_bf16(ctx[i]);
            memcpy(vc + (g * C + pos) * D, y + (H + G + g) * D,
                   (size_t)D * 2);
        }
        const long r = H / G, len = pos + 1;
#ifdef _OPENMP
        #pragma omp parallel for num_threads(threads) schedule(static) \
            if (threads > 1 && len * H * D >= (1L << 16))
#endif
        for (long h = 0; h < H; ++h)
            attend_head(qf + h * D, kc + (h / r) * C * D,
                        vc + (h / r) * C * D, len, D, att + h * len,
                        ctx + h * D);
        {
            const void *w[1] = {q[L_WO]};
            const float *s[1] = {q[L_SO]};
            const long n[1] = {E};
            mv(&mc, ctx, H * D, 1, w, s[0] ? s : NULL, n, y);
        }
        add_residual(x, y, E);
        /* feed-forward */
        rmsnorm(x, E, q[L_NORM2], eps, hin);
        {
            const void *w[2] = {q[L_W1], q[L_W2]};
            const float *s[2] = {q[L_S1], q[L_S2]};
            const long n[2] = {F, F};
            mv(&mc, hin, E, 2, w, s[0] ? s : NULL, n, y);
        }
        swiglu(y, y + F, F, hin);
        {
            const void *w[1] = {q[L_W3]};
            const float *s[1] = {q[L_S3]};
            const long n[1] = {E};
            mv(&mc, hin, F, 1, w, s[0] ? s : NULL, n, y);
        }
        add_residual(x, y, E);
    }
    rmsnorm(x, E, p[G_FINAL_NORM], eps, hin);
    {
        const void *w[1] = {p[G_HEAD]};
        const float *s[1] = {p[G_HEAD_SCALE]};
        const long n[1] = {V};
        mv(&mc, hin, E, 1, w, s[0] ? s : NULL, n, logits);
    }
    *next = argmax_bf16(logits, V);
    free(mem);
    return 0;
}

/* Lets the loader check that it opened the library it built. */
int qwen3_matvec_abi(void) {
#ifdef _OPENMP
    return 0x40001;
#else
    return 0x40000;
#endif
}
