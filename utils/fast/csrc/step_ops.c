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

/* The sum of squares in double (each square exact): blocks of 8 values
   into two sets of eight lane sums, block b into set b % 2, so that
   independent chains of adds overlap; then lane l of
   (s0 + s1) added to lane l + 4 (l < 4), and those four as
   (v0 + v2) + (v1 + v3). */
static double sum_squares(const float *x, long n) {
    double s[2][8] = {{0}};
    for (long i = 0; i < n; i += 8) {
        double *t = s[i / 8 % 2];
        for (int l = 0; l < 8; ++l) t[l] += (double)x[i + l] * (double)x[i + l];
    }
    double v[4];
    for (int l = 0; l < 4; ++l)
        v[l] = (s[0][l] + s[1][l]) + (s[0][l + 4] + s[1][l + 4]);
    return (v[0] + v[2]) + (v[1] + v[3]);
}

void rmsnorm(const float *x, long n, const float *scale,
             float eps, float *out) {
    const double ss = sum_squares(x, n);
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const f8 rv = f8_set1(r);
    for (long i = 0; i < n; i += 8)  /* (x * r) * scale, as in torch */
        f8_store(out + i, rb8(f8_mul(f8_mul(f8_load(x + i), rv), f8_load(scale + i))));
}

/* RoPE per 8 lanes: t*cos + rot*sin, two rounded products and one add */
void norm_rope(const uint16_t *h, long d, const float *scale,
               float eps, const float *cos, const float *sin,
               float *t, float *out) {
    for (long i = 0; i < d; i += 8) f8_store(t + i, bf16x8(h + i));
    if (scale) rmsnorm(t, d, scale, eps, t);
    const long half = d / 2;
    for (long i = 0; i < d; i += 8) {
        const f8 rot = i < half ? f8_neg(f8_load(t + i + half)) : f8_load(t + i - half);
        const f8 a = f8_mul(f8_load(t + i), f8_load(cos + i));
        const f8 b = f8_mul(rot, f8_load(sin + i));
        f8_store(out + i, rb8(f8_add(a, b)));
    }
}

/* softmax of one head's scores in place: the maximum, exp8 per 8 (expf
   for the rest), the sum in slot order, then each divided and rounded
   (f8_div and rb8 give scalar division's and rb's bits) */
static void softmax(float *w, long len) {
    float mx = -INFINITY;
    long j;
    for (j = 0; j < len; ++j) mx = w[j] > mx ? w[j] : mx;
    for (j = 0; j + 8 <= len; j += 8)
        f8_store(w + j, exp8(f8_sub(f8_load(w + j), f8_set1(mx))));
    for (; j < len; ++j) w[j] = expf(w[j] - mx);
    float sum = 0.0f;
    for (j = 0; j < len; ++j) sum += w[j];
    const f8 sv = f8_set1(sum);
    for (j = 0; j + 8 <= len; j += 8) f8_store(w + j, rb8(f8_div(f8_load(w + j), sv)));
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
        f8 a[4];
        for (int u = 0; u < 4; ++u) a[u] = f8_zero();
        for (long i = 0; i < d; i += 8) {
            const f8 qv = f8_load(q + i);
            for (int u = 0; u < 4; ++u)
                a[u] = f8_fma(qv, bf16x8(kc + (j + u) * d + i), a[u]);
        }
        for (int u = 0; u < 4; ++u) w[j + u] = rb(rb(f8_hsum(a[u])) * inv);
    }
    for (; j < len; ++j) w[j] = rb(rb(dot_bf16(q, kc + j * d, d)) * inv);
    softmax(w, len);
    for (long i0 = 0; i0 < d; i0 += 64) {
        const int nb = (int)((d - i0) / 8 < 8 ? (d - i0) / 8 : 8);
        f8 a[8];
        for (int b = 0; b < nb; ++b) a[b] = f8_zero();
        for (j = 0; j < len; ++j) {
            const f8 wj = f8_set1(w[j]);
            for (int b = 0; b < nb; ++b)
                a[b] = f8_fma(wj, bf16x8(vc + j * d + i0 + 8 * b), a[b]);
        }
        for (int b = 0; b < nb; ++b) f8_store(out + i0 + 8 * b, rb8(a[b]));
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
                prefetch((const char *)(nx.kc + j * d) + b, 1);
                prefetch((const char *)(nx.vc + j * d) + b, 1);
                continue;
            }
            if (j + ahead + 4 <= len)
                prefetch((const char *)(kc + (j + ahead) * d) + b, 0);
            prefetch((const char *)(vc + j * d) + b, 1);
        }
        f8 a[2][4];
        for (int h = 0; h < 2; ++h)
            for (int u = 0; u < 4; ++u) a[h][u] = f8_zero();
        for (long i = 0; i < d; i += 8) {
            const f8 q0 = f8_load(q + i), q1 = f8_load(q + d + i);
            for (int u = 0; u < 4; ++u) {
                const f8 kv = bf16x8(kc + (j + u) * d + i);
                a[0][u] = f8_fma(q0, kv, a[0][u]);
                a[1][u] = f8_fma(q1, kv, a[1][u]);
            }
        }
        for (int h = 0; h < 2; ++h)
            for (int u = 0; u < 4; ++u) w[h * len + j + u] = rb(rb(f8_hsum(a[h][u])) * inv);
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
    uint64_t acc = 0, word;
    for (long i = 0; i < n; i += 32) {
        memcpy(&word, p + i, 8);
        acc |= word;
    }
    __asm__ volatile("" : : "r"(acc));
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
    f8 a[2][4];
    for (int h = 0; h < 2; ++h)
        for (int b = 0; b < 4; ++b)
            a[h][b] = j0 ? f8_load(out + h * d + i0 + 8 * b) : f8_zero();
    for (long j = j0; j < j1; ++j) {
        const f8 w0 = f8_set1(w[j]), w1 = f8_set1(w[len + j]);
        for (int b = 0; b < 4; ++b) {
            const f8 v = bf16x8(vc + j * d + i0 + 8 * b);
            a[0][b] = f8_fma(w0, v, a[0][b]);
            a[1][b] = f8_fma(w1, v, a[1][b]);
        }
    }
    for (int h = 0; h < 2; ++h)
        for (int b = 0; b < 4; ++b)
            f8_store(out + h * d + i0 + 8 * b, j1 == len ? rb8(a[h][b]) : a[h][b]);
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
    const f8 one = f8_set1(1.0f);
    for (long i = i0; i < n; i += 8) {
        const f8 g = bf16x8(gate + i);
        const f8 e = exp8(f8_sub(f8_zero(), g));
        const f8 act = rb8(f8_div(g, f8_add(one, e)));
        f8_store(out + i, rb8(f8_mul(act, bf16x8(up + i))));
    }
}

void add_residual(float *x, const uint16_t *y, long n) {
    for (long i = 0; i < n; i += 8)
        f8_store(x + i, rb8(f8_add(f8_load(x + i), bf16x8(y + i))));
}

/* The maximum eight lanes at a time until a block holds a NaN; then the
   first NaN, else the first index equal to the maximum (all -inf: 0). */
long argmax_bf16(const uint16_t *v, long n) {
    long i = 0;
    f8 m = f8_set1(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        const f8 f = bf16x8(v + i);
        if (m8_any(f8_nan(f))) break;
        m = f8_max(m, f);
    }
    float mx = -INFINITY, lanes[8];
    f8_store(lanes, m);
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (long t = i; t < n; ++t) { /* the block with a NaN, or the tail */
        const float f = from_bf16(v[t]);
        if (f != f) return t;
        mx = f > mx ? f : mx;
    }
    const f8 mv = f8_set1(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = m8_bits(f8_eq(bf16x8(v + i), mv));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; ++i)
        if (from_bf16(v[i]) == mx) return i;
    return 0;
}
