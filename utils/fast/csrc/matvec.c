/* Matrix-vector kernels for single-token decoding (see utils/fast/kernels.py).

   Built by utils/fast/build.py with the system C compiler, together with
   the other files of csrc/: cc -O3 -mavx2 -mfma -ffp-contract=off
   [-fopenmp] -shared. These are the AVX2 kernels every x86-64 CPU with
   AVX2 runs, and the first (default) variant of each class in variants.c.
   Each thread streams 4 far-apart rows at once, prefetching PREFETCH_BYTES
   ahead (bf16.h). The *_multi entry points take several weights that
   share one input (q, k, v; gate and up) and fill one output: one call,
   one parallel region, rows split evenly over the threads across all the
   matrices, and a thread that finishes first takes what the other has
   left from the back of its share (see run).

   A new kernel variant is a row kernel (rows_fn, see matvec.h) and a line
   in the table of variants.c; the tuner (utils/fast/tuner.py) then times
   it against the others of its class. */

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "matvec.h"

#ifdef _OPENMP
/* from omp.h, declared here so no OpenMP headers are needed */
int omp_get_thread_num(void);
int omp_get_num_threads(void);
#endif

QWEN3_INTERNAL void load_x(const void *x, int x_f32, long k, float *out) {
    if (x_f32) { memcpy(out, x, (size_t)k * 4); return; }
    for (long i = 0; i < k; ++i) out[i] = from_bf16(((const uint16_t *)x)[i]);
}

/* Unpacking 16 bf16 values (one 256-bit load) interleaves the two 128-bit
   lanes: the low unpack holds elements 0-3 and 8-11, the high one 4-7 and
   12-15. Reordering x the same way once is cheaper than reordering w. */
QWEN3_INTERNAL void permute16(const float *xn, long k, float *xp) {
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
QWEN3_INTERNAL void rows_bf16(const float *xp, const void *wv,
                              const float *unused, void *y, int y_f32,
                              long lo, long hi, long k, long j0, long j1) {
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

static void rows_i8(const float *xn, const void *wv, const float *scale,
                    void *y, int y_f32, long lo, long hi, long k, long j0,
                    long j1) {
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
   I16_CHUNK is in matvec.h. */

static inline __m256i i16_madd(const int8_t *p, __m256i xq) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_madd_epi16(w, xq);
}

QWEN3_INTERNAL void rows_i8q(const float *qxv, const void *wv,
                             const float *scale, void *y, int y_f32, long lo,
                             long hi, long k, long j0, long j1) {
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

/* rows_bf16_exact's body; prefetch is a constant, so each caller gets its
   own loop with or without the software prefetch. */
static inline __attribute__((always_inline)) void
exact_rows(const float *xn, const uint16_t *w, void *y, int y_f32, long lo,
           long hi, long k, long j0, long j1, const int prefetch) {
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
                if (prefetch) { PF(r[q] + i); PF(r[q] + i + 32); }
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

QWEN3_INTERNAL void rows_bf16_exact(const float *xn, const void *wv,
                                    const float *unused, void *y, int y_f32,
                                    long lo, long hi, long k, long j0,
                                    long j1) {
    (void)unused;
    exact_rows(xn, (const uint16_t *)wv, y, y_f32, lo, hi, k, j0, j1, 1);
}

/* The same sums without the software prefetch (the hardware prefetchers
   alone may stream faster; the tuner decides). */
QWEN3_INTERNAL void rows_bf16_exact_np(const float *xn, const void *wv,
                                       const float *unused, void *y,
                                       int y_f32, long lo, long hi, long k,
                                       long j0, long j1) {
    (void)unused;
    exact_rows(xn, (const uint16_t *)wv, y, y_f32, lo, hi, k, j0, j1, 0);
}

/* the kernels of the entry points below */
static const row_kernel ROWS_BF16 = {rows_bf16, 4},
                        ROWS_BF16_EXACT = {rows_bf16_exact, 4},
                        ROWS_I8Q = {rows_i8q, 4}, ROWS_I8 = {rows_i8, 4};

/* A product split over threads: thread u owns the stacked rows
   [n*u/T, n*(u+1)/T), a piece of each matrix they touch. The passes of a
   piece not yet taken are [front, back), one 64-bit word on its own cache
   line: the owner takes `claim` passes at a time from the front, so its
   sections stream on; a thread with nothing left of its own takes half of
   what remains (at least `claim`) from the back of the others' pieces. A
   core slowed by its neighbours then no longer holds up the other at the
   end of each product. Every pass is computed by one call, the same way
   whoever makes it (see rows_fn), so the results are the same bits. */
typedef struct {
    const row_kernel *rk;
    const float *x;
    const group *g;
    void *y;
    int y_f32, threads;
    long k, n, claim;
    passes_left *left; /* [threads][stride], matrix i of piece u at u*stride+i */
    int stride;
} product;

/* How much of the owner's work a whole product reads per take */
#define CLAIM_BYTES (128L * 1024)

static long stolen_passes; /* for the tests: passes taken from the back */
static int stall_us;       /* for the tests: the last thread starts late */

/* Rows [*a, *b) of matrix i that thread u owns, and the row of the stacked
   output where matrix i starts; 0 when u owns none of it */
static int piece(const product *p, int u, int i, long *a, long *b,
                 long *base) {
    *base = 0;
    for (int m = 0; m < i; ++m) *base += p->g->n[m];
    const long lo = p->n * u / p->threads, hi = p->n * (u + 1) / p->threads;
    *a = lo > *base ? lo - *base : 0;
    *b = hi - *base < p->g->n[i] ? hi - *base : p->g->n[i];
    return *a < *b;
}

#ifdef _OPENMP
/* Takes passes of a piece: up to `want` from the front, or (back) half of
   what is left but at least `want`; their count (0: none left), the first
   in *j0 */
static long take(uint64_t *left, long want, int back, long *j0) {
    uint64_t old = __atomic_load_n(left, __ATOMIC_RELAXED), now;
    long m;
    do {
        const long f = (long)(old >> 32), b = (long)(old & 0xffffffffu);
        if (f >= b) return 0;
        m = back && (b - f) / 2 > want ? (b - f) / 2 : want;
        m = m < b - f ? m : b - f;
        *j0 = back ? b - m : f;
        now = back ? (old & ~0xffffffffull) | (uint64_t)(b - m)
                   : (uint64_t)(f + m) << 32 | (uint64_t)b;
    } while (!__atomic_compare_exchange_n(left, &old, now, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    if (back) __atomic_fetch_add(&stolen_passes, m, __ATOMIC_RELAXED);
    return m;
}

/* Everything left of thread u's piece of matrix i (back: taken from the
   back, by a thread that finished its own) */
static void work(const product *p, int u, int i, int back) {
    long a, b, base, j0, m;
    if (!piece(p, u, i, &a, &b, &base)) return;
    const group *g = p->g;
    char *y = (char *)p->y + (size_t)base * (p->y_f32 ? 4 : 2);
    uint64_t *left = &p->left[u * p->stride + i].left;
    while ((m = take(left, p->claim, back, &j0)))
        p->rk->fn(p->x, g->w[i], g->scales ? g->scales[i] : NULL, y, p->y_f32,
                  a, b, p->k, j0, j0 + m);
}

static void stall(void) {
    const struct timespec ts = {stall_us / 1000000, stall_us % 1000000 * 1000L};
    nanosleep(&ts, NULL);
}

/* Thread t of nt: its own pieces front to back, then the others' from
   their backs */
static void share(const product *p, int t, int nt) {
    const int count = p->g->count;
    for (int u = t; u < p->threads; u += nt)
        for (int i = 0; i < count; ++i) work(p, u, i, 0);
    for (int v = 1; v < p->threads; ++v)
        for (int i = count - 1; i >= 0; --i)
            work(p, (t + v) % p->threads, i, 1);
}
#endif

/* Piece u's passes-left words: every piece whole */
static void fill(const product *p, int u) {
    for (int i = 0; i < p->g->count; ++i) {
        long a, b, base;
        const int any = piece(p, u, i, &a, &b, &base);
        __atomic_store_n(&p->left[u * p->stride + i].left,
                         any ? (uint64_t)pass_count(b - a, p->rk->sections) : 0,
                         __ATOMIC_RELAXED);
    }
}

/* How many passes the owner takes at a time (see CLAIM_BYTES) */
static long claim_passes(const product *p) {
    const long row_bytes = p->k * (p->g->scales ? 1 : 2) * p->rk->sections;
    return CLAIM_BYTES / row_bytes > 1 ? CLAIM_BYTES / row_bytes : 1;
}

/* p's passes-left words, all pieces whole; 0 when out of memory */
static int split(product *p) {
    p->stride = p->g->count;
    p->left = team_words((size_t)p->threads * p->stride);
    if (!p->left) return 0;
    for (int u = 0; u < p->threads; ++u) fill(p, u);
    p->claim = claim_passes(p);
    return 1;
}

QWEN3_INTERNAL passes_left *team_words(size_t words) {
    passes_left *w = aligned_alloc(64, sizeof(passes_left) * words);
    if (w) memset(w, 0, sizeof(passes_left) * words);
    return w;
}

/* Every row of a group on the calling thread */
static void alone(const row_kernel *rk, const float *xv, const group *g,
                  void *y, int y_f32, long k) {
    const size_t esize = y_f32 ? 4 : 2;
    char *out = y;
    for (int i = 0; i < g->count; out += (size_t)g->n[i] * esize, ++i)
        rk->fn(xv, g->w[i], g->scales ? g->scales[i] : NULL, out, y_f32, 0,
               g->n[i], k, 0, pass_count(g->n[i], rk->sections));
}

/* Too small to be worth a second thread, or too many rows for the
   passes-left words */
static int one_thread(long n, long k) { return n * k < (1L << 16) || n >= (1L << 31); }

QWEN3_INTERNAL int run(const row_kernel *rk, const float *xv, const group *g,
                       void *y, int y_f32, long k, int threads) {
    product p = {rk, xv, g, y, y_f32, threads, k, 0, 0, NULL, 0};
    for (int i = 0; i < g->count; ++i) p.n += g->n[i];
    if (threads < 1 || one_thread(p.n, k)) p.threads = 1;
#ifndef _OPENMP
    p.threads = 1; /* built without OpenMP: one thread */
#endif
    if (p.threads > 1 && !split(&p)) p.threads = 1;
    if (p.threads == 1) {
        alone(rk, xv, g, y, y_f32, k);
        return 0;
    }
#ifdef _OPENMP
    #pragma omp parallel num_threads(p.threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (stall_us && nt > 1 && t == nt - 1) stall();
        share(&p, t, nt);
    }
#endif
    free(p.left);
    return 0;
}

QWEN3_INTERNAL void team_barrier(void) {
#ifdef _OPENMP
    #pragma omp barrier
#endif
}

QWEN3_INTERNAL void timed_barrier(long long *clock, int slot) {
    const long long start = clock ? clock_ns() : 0;
    team_barrier();
    if (clock) clock[slot] += clock_ns() - start;
}

QWEN3_INTERNAL void team_stall(const team *tm) {
#ifdef _OPENMP
    if (stall_us && tm->nt > 1 && tm->t == tm->nt - 1) stall();
#else
    (void)tm;
#endif
}

#ifdef _OPENMP
/* The first thread of the team to reach product number seq fills every
   piece's words, then marks them ready; the others wait for that (a
   fill takes well under a microsecond), so none starts on words not yet
   filled, which would only cost balance: until filled, a piece's words
   are used up (every product uses up all of them, and the step zeroes
   them first), so a thread that reads them takes nothing. A thread that
   arrives late finds its piece already being taken from the back. */
static void fill_once(const product *p, passes_left *sync, long seq) {
    uint64_t *claimed = &sync[0].left, *ready = &sync[1].left;
    uint64_t c = __atomic_load_n(claimed, __ATOMIC_RELAXED);
    if (c < (uint64_t)seq
        && __atomic_compare_exchange_n(claimed, &c, (uint64_t)seq, 0,
                                       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        for (int u = 0; u < p->threads; ++u) fill(p, u);
        __atomic_store_n(ready, (uint64_t)seq, __ATOMIC_RELEASE);
        return;
    }
    while (__atomic_load_n(ready, __ATOMIC_ACQUIRE) < (uint64_t)seq)
        _mm_pause();
}
#endif

/* Inside the caller's parallel region: thread tm->t of the team does its
   share of the product (its own piece first, then the others' backs, as
   in run), then waits for the team. Every thread counts its products in
   tm->seq, so all agree which product is which. */
QWEN3_INTERNAL void team_product(const row_kernel *rk, const float *xv,
                                 const group *g, void *y, int y_f32, long k,
                                 team *tm) {
    product p = {rk, xv, g, y, y_f32, tm->nt, k, 0, 0, tm->left, TEAM_COUNT};
    for (int i = 0; i < g->count; ++i) p.n += g->n[i];
    ++tm->seq;
    if (tm->nt == 1 || one_thread(p.n, k)) {
        if (tm->t == 0) alone(rk, xv, g, y, y_f32, k);
    } else {
#ifdef _OPENMP
        fill_once(&p, tm->sync, tm->seq);
        p.claim = claim_passes(&p);
        share(&p, tm->t, tm->nt);
#endif
    }
    timed_barrier(tm->clock, CLOCK_PRODUCT_WAIT);
    team_stall(tm); /* late to read y and to the next product */
}

/* For the tests: the passes taken from the back of another thread's
   share since the last call. With us > 0 the last thread sleeps us
   microseconds: at the start of every product of run, and in a step's
   team after every product and before its share of the attention and of
   the SwiGLU (team_stall); 0: no delay. */
long qwen3_stolen_passes(int us) {
    stall_us = us;
    return __atomic_exchange_n(&stolen_passes, 0, __ATOMIC_RELAXED);
}

QWEN3_INTERNAL int bad_group(int count, const long *n) {
    if (count < 1) return 1;
    for (int i = 0; i < count; ++i)
        if (n[i] < 0) return 1;
    return 0;
}

/* x ~= xs * qx with xs = max|x| / 32767: each x * (32767 / max|x|)
   rounded to nearest even (cvtps, as cvtss) and clamped to +-32767, eight
   at a time; the plain loop it replaced is quantize_x_reference in
   step_reference.c (the tests compare their bits). */
QWEN3_INTERNAL int quantize_x(const float *x, long k, int16_t *qx) {
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

/* The int8 product of one group for float32 x: x rounded to 16-bit fixed
   point into qx (k int16 + one float) for `rows` (rows_i8q or a variant
   with its bits), or, if x holds an inf or NaN, the float32 kernel
   rows_i8, so they propagate as in float. */
QWEN3_INTERNAL void int8_group(const float *xn, const group *g, void *y,
                               int y_f32, long k, int threads, int16_t *qx,
                               const row_kernel *rows) {
    if (quantize_x(xn, k, qx)) run(rows, (const float *)qx, g, y, y_f32, k, threads);
    else run(&ROWS_I8, xn, g, y, y_f32, k, threads);
}

/* int8_group inside a team (see team_product): every thread rounds x into
   its own qx, the same bits, so all take the same kernel */
QWEN3_INTERNAL void team_int8_group(const float *xn, const group *g, void *y,
                                    int y_f32, long k, int16_t *qx,
                                    const row_kernel *rows, team *tm) {
    if (quantize_x(xn, k, qx)) team_product(rows, (const float *)qx, g, y, y_f32, k, tm);
    else team_product(&ROWS_I8, xn, g, y, y_f32, k, tm);
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
    run(&ROWS_BF16, xn + k, &g, y, y_f32, k, threads);
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
    run(&ROWS_BF16_EXACT, xn, &g, y, y_f32, k, threads);
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
    int8_group(xn, &g, y, y_f32, k, threads, (int16_t *)(xn + k), &ROWS_I8Q);
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

/* Lets the loader check that it opened the library it built (bit 0: built
   with OpenMP). */
int qwen3_matvec_abi(void) {
#ifdef _OPENMP
    return 0x80001;
#else
    return 0x80000;
#endif
}
