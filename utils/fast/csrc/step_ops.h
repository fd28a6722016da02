/* The decode step's work besides the matrix-vector products: norms, RoPE,
   attention, SwiGLU, residual adds, argmax (step_ops.c, on vec8.h's lanes). Values are
   rounded to bf16 where the book's bf16 model rounds; the float32 sums
   inside run in their own order. The tests compare each with its first,
   plain form (their step_reference.c) bit for bit. */
#ifndef QWEN3_STEP_OPS_H
#define QWEN3_STEP_OPS_H

#include <math.h>

#include "bf16.h"

/* e^x on 8 floats, within about 1 ulp of expf (range reduction by ln 2
   and a degree-6 polynomial; the classic Cephes coefficients): 0 below
   the smallest subnormal, inf above ln(FLT_MAX), NaN stays NaN. torch's own
   vectorised exp is not glibc's expf either; results round to bf16. */
static inline f8 exp8(f8 x) {
    const f8 lo = f8_set1(-103.972f), hi = f8_set1(88.7228f);
    const f8 xc = f8_min(f8_max(x, lo), hi);
    const f8 n = f8_round(f8_mul(xc, f8_set1(1.44269504f)));
    f8 r = f8_fms(n, f8_set1(0.693359375f), xc);
    r = f8_fms(n, f8_set1(-2.12194440e-4f), r);
    f8 p = f8_set1(1.9875691500e-4f);
    p = f8_fma(p, r, f8_set1(1.3981999507e-3f));
    p = f8_fma(p, r, f8_set1(8.3334519073e-3f));
    p = f8_fma(p, r, f8_set1(4.1665795894e-2f));
    p = f8_fma(p, r, f8_set1(1.6666665459e-1f));
    p = f8_fma(p, r, f8_set1(5.0000001201e-1f));
    p = f8_fma(f8_mul(p, r), r, f8_add(r, f8_set1(1.0f)));
    /* times 2^n as 2^a * 2^b, a = n >> 1, b = n - a: both factors normal
       for n in [-150, 128], so results near overflow or in the subnormal
       range come out right */
    const i8v ni = f8_int(n), bias = i8_set1(127);
    const i8v a = i8_sar(ni, 1), b = i8_sub(ni, a);
    const f8 ea = i8_bits(i8_shl(i8_add(a, bias), 23));
    const f8 eb = i8_bits(i8_shl(i8_add(b, bias), 23));
    f8 y = f8_mul(f8_mul(p, ea), eb);

    y = sel(f8_lt(x, lo), y, f8_zero());
    y = sel(f8_gt(x, hi), y, f8_set1(INFINITY));
    return sel(f8_nan(x), y, x);
}

/* q . k over d (% 8 == 0) entries, k in bf16: one 8-lane accumulator over
   the head, then f8_hsum */
static inline float dot_bf16(const float *q, const uint16_t *k, long d) {
    f8 a = f8_zero();
    for (long i = 0; i < d; i += 8) a = f8_fma(f8_load(q + i), bf16x8(k + i), a);
    return f8_hsum(a);
}

/* The book's RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * scale
   (n % 8 == 0), rounded to bf16 */
void rmsnorm(const float *x, long n, const float *scale,
             float eps, float *out);
/* One head (bf16 values in h, d % 16 == 0 entries): optional qk-norm, then
   RoPE with the row of cos/sin given, rounded to bf16 (t: d floats of
   scratch) */
void norm_rope(const uint16_t *h, long d, const float *scale,
               float eps, const float *cos, const float *sin,
               float *t, float *out);
/* Attention of the r query heads of one kv group (q: r*d floats, d % 8 ==
   0) over cache slots 0..len-1: bf16 scores, scaled, softmax, then the
   weighted sum of the values (w: r*len floats of scratch, out: r*d).
   next_kc, next_vc: the keys and values of the group the caller attends
   next (len slots; NULL: none), fetched into L2 while this one computes */
void attend_group(const float *q, const uint16_t *kc,
                  const uint16_t *vc, long len, long d, long r,
                  float *w, float *out, const uint16_t *next_kc,
                  const uint16_t *next_vc);
/* out = bf16(bf16(silu(gate)) * up) on bf16 inputs, entries [i0, n)
   (both % 8 == 0) */
void swiglu(const uint16_t *gate, const uint16_t *up, long i0,
            long n, float *out);
/* x = bf16(x + y) for n (% 8 == 0) bf16 values y */
void add_residual(float *x, const uint16_t *y, long n);
/* torch.argmax over n >= 1 bf16 values: the first largest, or the first NaN */
long argmax_bf16(const uint16_t *v, long n);

#endif
