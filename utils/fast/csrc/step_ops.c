/* The decode step's work besides the matrix-vector products (see
   step_ops.h). Each function does, element by element, the float
   operations of its first form in step_reference.c, in the same order, so
   the bits are the same; only the loops are arranged so that independent
   chains overlap: four keys per pass, the value sum turned inside out
   (output lanes side by side, each still summed over the slots in order),
   the two query heads of a kv group sharing every converted key and value,
   vectorised argmax, RoPE and softmax division. Built with
   -ffp-contract=off: a*b + c*d is two rounded products and a rounded sum,
   as in torch. */

#include "step_ops.h"

/* The sum of squares in double (each square exact): four 4-lane sums,
   block b of 8 values into pair b % 2, so four chains of adds overlap
   where one sequential sum would wait on each add; then
   (s00 + s10) + (s01 + s11) and its lanes as
   (l0 + l2) + (l1 + l3). */
static double sum_squares(const float *x, long n) {
    __m256d s[2][2] = {{_mm256_setzero_pd(), _mm256_setzero_pd()},
                       {_mm256_setzero_pd(), _mm256_setzero_pd()}};
    for (long i = 0; i < n; i += 8) {
        const int b = (int)(i / 8 % 2);
        const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        s[b][0] = _mm256_add_pd(s[b][0], _mm256_mul_pd(lo, lo));
        s[b][1] = _mm256_add_pd(s[b][1], _mm256_mul_pd(hi, hi));
    }
    const __m256d v = _mm256_add_pd(_mm256_add_pd(s[0][0], s[1][0]),
                                    _mm256_add_pd(s[0][1], s[1][1]));
    double l[4];
    _mm256_storeu_pd(l, v);
    return (l[0] + l[2]) + (l[1] + l[3]);
}

void rmsnorm(const float *x, long n, const float *scale,
             float eps, float *out) {
    const double ss = sum_squares(x, n);
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (long i = 0; i < n; i += 8)  /* (x * r) * scale, as in torch */
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(
            _mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(scale + i))));
}

/* RoPE per 8 lanes: t*cos + rot*sin, two rounded products and one add */
void norm_rope(const uint16_t *h, long d, const float *scale,
               float eps, const float *cos, const float *sin,
               float *t, float *out) {
    for (long i = 0; i < d; i += 8) _mm256_storeu_ps(t + i, bf16x8_natural(h + i));
    if (scale) rmsnorm(t, d, scale, eps, t);
    const long half = d / 2;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long i = 0; i < d; i += 8) {
        const __m256 rot = i < half
            ? _mm256_xor_ps(_mm256_loadu_ps(t + i + half), sign)
            : _mm256_loadu_ps(t + i - half);
        const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(t + i), _mm256_loadu_ps(cos + i));
        const __m256 b = _mm256_mul_ps(rot, _mm256_loadu_ps(sin + i));
        _mm256_storeu_ps(out + i, rb8(_mm256_add_ps(a, b)));
    }
}

/* softmax of one head's scores in place: the maximum, exp8 per 8 (expf
   for the rest), the sum in slot order, then each divided and rounded
   (divps and rb8 give divss's and rb's bits) */
static void softmax(float *w, long len) {
    float mx = -INFINITY;
    long j;
    for (j = 0; j < len; ++j) mx = w[j] > mx ? w[j] : mx;
    for (j = 0; j + 8 <= len; j += 8)
        _mm256_storeu_ps(w + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(w + j),
                                                   _mm256_set1_ps(mx))));
    for (; j < len; ++j) w[j] = expf(w[j] - mx);
    float sum = 0.0f;
    for (j = 0; j < len; ++j) sum += w[j];
    const __m256 sv = _mm256_set1_ps(sum);
    for (j = 0; j + 8 <= len; j += 8)
        _mm256_storeu_ps(w + j, rb8(_mm256_div_ps(_mm256_loadu_ps(w + j), sv)));
    for (; j < len; ++j) w[j] = rb(w[j] / sum);
}

/* One query head: the scores of four keys per pass (each key's sum as
   dot_bf16), softmax, then the values' weighted sum for up to 8 blocks of
   8 columns side by side. */
static void attend_head(const float *q, const uint16_t *kc, const uint16_t *vc,
                        long len, long d, float *w, float *out) {
    const float inv = 1.0f / (float)sqrt((double)d);
    long j = 0;
    for (; j + 4 <= len; j += 4) {
        __m256 a[4];
        for (int u = 0; u < 4; ++u) a[u] = _mm256_setzero_ps();
        for (long i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int u = 0; u < 4; ++u)
                a[u] = _mm256_fmadd_ps(qv, bf16x8_natural(kc + (j + u) * d + i), a[u]);
        }
        for (int u = 0; u < 4; ++u) w[j + u] = rb(rb(hsum(a[u])) * inv);
    }
    for (; j < len; ++j) w[j] = rb(rb(dot_bf16(q, kc + j * d, d)) * inv);
    softmax(w, len);
    for (long i0 = 0; i0 < d; i0 += 64) {
        const int nb = (int)((d - i0) / 8 < 8 ? (d - i0) / 8 : 8);
        __m256 a[8];
        for (int b = 0; b < nb; ++b) a[b] = _mm256_setzero_ps();
        for (j = 0; j < len; ++j) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            for (int b = 0; b < nb; ++b)
                a[b] = _mm256_fmadd_ps(wj, bf16x8_natural(vc + j * d + i0 + 8 * b), a[b]);
        }
        for (int b = 0; b < nb; ++b) _mm256_storeu_ps(out + i0 + 8 * b, rb8(a[b]));
    }
}

/* Where the next group's keys and values are (NULL: none; see
   pair_scores) */
typedef struct {
    const uint16_t *kc, *vc;
} next_group;

/* The scores of two query heads (q: 2*d floats, w: 2*len) sharing each
   converted key, four keys per pass. Per pass, software prefetches of the
   next group's keys and values for the same four slots where nx names
   one (this group's are loaded then), else of this group's keys 16 slots
   ahead and the values of these keys. (The prefetches stay in this loop:
   moved into a function of their own, gcc 12 found that function free of
   side effects and dropped its calls.) */
static void pair_scores(const float *q, const uint16_t *kc, long len, long d,
                        const uint16_t *vc, next_group nx, float *w) {
    const float inv = 1.0f / (float)sqrt((double)d);
    const long ahead = 16;
    long j = 0;
    for (; j + 4 <= len; j += 4) {
        for (long b = 0; b < 4 * d * 2; b += 64) {
            if (nx.kc) {
                _mm_prefetch((const char *)(nx.kc + j * d) + b, _MM_HINT_T1);
                _mm_prefetch((const char *)(nx.vc + j * d) + b, _MM_HINT_T1);
                continue;
            }
            if (j + ahead + 4 <= len)
                _mm_prefetch((const char *)(kc + (j + ahead) * d) + b, _MM_HINT_T0);
            _mm_prefetch((const char *)(vc + j * d) + b, _MM_HINT_T1);
        }
        __m256 a[2][4];
        for (int h = 0; h < 2; ++h)
            for (int u = 0; u < 4; ++u) a[h][u] = _mm256_setzero_ps();
        for (long i = 0; i < d; i += 8) {
            const __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + d + i);
            for (int u = 0; u < 4; ++u) {
                const __m256 kv = bf16x8_natural(kc + (j + u) * d + i);
                a[0][u] = _mm256_fmadd_ps(q0, kv, a[0][u]);
                a[1][u] = _mm256_fmadd_ps(q1, kv, a[1][u]);
            }
        }
        for (int h = 0; h < 2; ++h)
            for (int u = 0; u < 4; ++u) w[h * len + j + u] = rb(rb(hsum(a[h][u])) * inv);
    }
    for (; j < len; ++j)
        for (int h = 0; h < 2; ++h)
            w[h * len + j] = rb(rb(dot_bf16(q + h * d, kc + j * d, d)) * inv);
}

/* Reads n bf16 values (every 64-byte line once) and drops them: after a
   step's weights have streamed through, a layer's keys and values are in
   DRAM, and a plain load loop keeps many misses in flight where the
   attention loops, and software prefetches of the same lines, did not. */
static void warm_lines(const uint16_t *p, long n) {
    __m256i acc = _mm256_setzero_si256();
    for (long i = 0; i < n; i += 32)
        acc = _mm256_or_si256(acc, _mm256_loadu_si256((const __m256i *)(p + i)));
    __asm__ volatile("" : : "x"(acc));
}

/* The group's keys and values are loaded ahead up to this size (both
   together), so that they stay in a core's L2 until they are used */
#define WARM_BYTES (256L * 1024)

/* Values are summed a tile of slots at a time: the tile is loaded by a
   plain loop, then its 32-column blocks in turn (one 64-byte line of each
   slot per block) read it from L1; each output lane still adds the slots
   in order, the partial sums kept unrounded in out between tiles. */
#define VALUE_TILE 64

/* Slots [j0, j1) of the weighted value sums of columns i0..i0+31 of both
   heads (out: 2*d floats; rounded to bf16 after the last slot) */
static void pair_values(const float *w, long len, const uint16_t *vc, long d,
                        long i0, long j0, long j1, float *out) {
    __m256 a[2][4];
    for (int h = 0; h < 2; ++h)
        for (int b = 0; b < 4; ++b)
            a[h][b] = j0 ? _mm256_loadu_ps(out + h * d + i0 + 8 * b)
                         : _mm256_setzero_ps();
    for (long j = j0; j < j1; ++j) {
        const __m256 w0 = _mm256_set1_ps(w[j]), w1 = _mm256_set1_ps(w[len + j]);
        for (int b = 0; b < 4; ++b) {
            const __m256 v = bf16x8_natural(vc + j * d + i0 + 8 * b);
            a[0][b] = _mm256_fmadd_ps(w0, v, a[0][b]);
            a[1][b] = _mm256_fmadd_ps(w1, v, a[1][b]);
        }
    }
    for (int h = 0; h < 2; ++h)
        for (int b = 0; b < 4; ++b)
            _mm256_storeu_ps(out + h * d + i0 + 8 * b,
                             j1 == len ? rb8(a[h][b]) : a[h][b]);
}

/* Two query heads of one kv group (d % 32 == 0): shared scores, then each
   head's softmax, then the values' weighted sums, 32 columns of both
   heads per pass over a tile of slots (see pair_values), each tile
   loaded first unless all the values were (`loaded`). */
static void attend_pair(const float *q, const uint16_t *kc, const uint16_t *vc,
                        long len, long d, int loaded, next_group nx, float *w,
                        float *out) {
    pair_scores(q, kc, len, d, vc, nx, w);
    softmax(w, len);
    softmax(w + len, len);
    for (long j0 = 0; j0 < len; j0 += VALUE_TILE) {
        const long j1 = j0 + VALUE_TILE < len ? j0 + VALUE_TILE : len;
        if (!loaded) warm_lines(vc + j0 * d, (j1 - j0) * d);
        for (long i0 = 0; i0 < d; i0 += 32)
            pair_values(w, len, vc, d, i0, j0, j1, out);
    }
}

void attend_group(const float *q, const uint16_t *kc,
                  const uint16_t *vc, long len, long d, long r,
                  float *w, float *out, const uint16_t *next_kc,
                  const uint16_t *next_vc) {
    long h = 0;
    const int loaded = len * d * 4 <= WARM_BYTES; /* keys and values */
    if (loaded) {
        warm_lines(kc, len * d);
        warm_lines(vc, len * d);
    }
    /* the next group's lines while this one computes, by the first pair
       (where the next group's will be loaded too) */
    next_group nx = {NULL, NULL};
    if (loaded && next_kc) nx.kc = next_kc, nx.vc = next_vc;
    if (d % 32 == 0)
        for (; h + 2 <= r; h += 2, nx.kc = nx.vc = NULL)
            attend_pair(q + h * d, kc, vc, len, d, loaded, nx, w + h * len,
                        out + h * d);
    for (; h < r; ++h)
        attend_head(q + h * d, kc, vc, len, d, w + h * len, out + h * d);
}

void swiglu(const uint16_t *gate, const uint16_t *up, long i0,
            long n, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long i = i0; i < n; i += 8) {
        const __m256 g = bf16x8_natural(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 act = rb8(_mm256_div_ps(g, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(act, bf16x8_natural(up + i))));
    }
}

void add_residual(float *x, const uint16_t *y, long n) {
    for (long i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, rb8(_mm256_add_ps(_mm256_loadu_ps(x + i),
                                                  bf16x8_natural(y + i))));
}

/* The maximum eight lanes at a time until a block holds a NaN; then the
   first NaN, else the first index equal to the maximum (all -inf: 0). */
long argmax_bf16(const uint16_t *v, long n) {
    long i = 0;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        const __m256 f = bf16x8_natural(v + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q))) break;
        m = _mm256_max_ps(m, f);
    }
    float mx = -INFINITY, lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (long t = i; t < n; ++t) { /* the block with a NaN, or the tail */
        const float f = from_bf16(v[t]);
        if (f != f) return t;
        mx = f > mx ? f : mx;
    }
    const __m256 mv = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 f = bf16x8_natural(v + i);
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(f, mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; ++i)
        if (from_bf16(v[i]) == mx) return i;
    return 0;
}
