/* The decode step's work besides the matrix-vector products: norms, RoPE,
   attention, SwiGLU, residual adds, argmax (step_ops.c; AVX2). Values are
   rounded to bf16 where the book's bf16 model rounds; the float32 sums
   inside run in their own order. The tests compare each with its first,
   plain form (tests/fast/csrc/step_reference.c) bit for bit. */
#ifndef QWEN3_STEP_OPS_H
#define QWEN3_STEP_OPS_H

#include <math.h>

#include "bf16.h"

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

/* q . k over d (% 8 == 0) entries, k in bf16: one 8-lane accumulator over
   the head, then hsum */
static inline float dot_bf16(const float *q, const uint16_t *k, long d) {
    __m256 a = _mm256_setzero_ps();
    for (long i = 0; i < d; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), bf16x8_natural(k + i), a);
    return hsum(a);
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
