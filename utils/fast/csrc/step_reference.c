/* The first, plain forms of the decode step's attention, RoPE, argmax and
   int8 input quantisation, kept as references: the tests call both forms
   through the qwen3_piece_* entry points below and compare their bits
   (step_ops.c and matvec.c's quantize_x must give exactly these). The
   step itself never calls them. */

#include <stdlib.h>

#include "matvec.h"
#include "step_ops.h"

QWEN3_INTERNAL void norm_rope_reference(const uint16_t *h, long d,
                                        const float *scale, float eps,
                                        const float *cos, const float *sin,
                                        float *t, float *out) {
    for (long i = 0; i < d; ++i) t[i] = from_bf16(h[i]);
    if (scale) rmsnorm(t, d, scale, eps, t);
    const long half = d / 2;
    for (long i = 0; i < d; ++i) {
        const float rot = i < half ? -t[i + half] : t[i - half];
        out[i] = rb(t[i] * cos[i] + rot * sin[i]);
    }
}

QWEN3_INTERNAL void attend_head_reference(const float *q, const uint16_t *kc,
                                          const uint16_t *vc, long len, long d,
                                          float *w, float *out) {
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
        for (long s = 0; s < len; ++s)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[s]),
                                bf16x8_natural(vc + s * d + i), a);
        _mm256_storeu_ps(out + i, rb8(a));
    }
}

QWEN3_INTERNAL long argmax_bf16_reference(const uint16_t *v, long n) {
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

QWEN3_INTERNAL int quantize_x_reference(const float *x, long k, int16_t *qx) {
    float amax = 0.0f;
    int finite = 1;
    for (long i = 0; i < k; ++i) {
        const float a = fabsf(x[i]);
        finite &= a <= 3.4028235e38f; /* false for inf and NaN */
        amax = a > amax ? a : amax;
    }
    if (!finite) return 0;
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    const float xs = amax / 32767.0f;
    for (long i = 0; i < k; ++i) { /* round to nearest even */
        int v = _mm_cvtss_si32(_mm_set_ss(x[i] * inv));
        qx[i] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
    }
    memcpy(qx + k, &xs, 4);
    return 1;
}

/* ---- entry points for the tests (reference: 1 the plain form, 0 the
   step's); 1 (or -1) for bad sizes ---------------------------------------- */

/* The r query heads of one kv group: w (r*len), out (r*d); reference 2:
   the step's form told that another group comes next, whose keys are vc
   and values kc (other values than its own, fetched while it computes) */
int qwen3_piece_attend(int reference, const float *q, const uint16_t *kc,
                       const uint16_t *vc, long len, long d, long r, float *w,
                       float *out) {
    if (len < 1 || d < 8 || d % 8 || r < 1) return 1;
    if (reference != 1) {
        attend_group(q, kc, vc, len, d, r, w, out, reference ? vc : NULL,
                     reference ? kc : NULL);
        return 0;
    }
    for (long h = 0; h < r; ++h)
        attend_head_reference(q + h * d, kc, vc, len, d, w + h * len, out + h * d);
    return 0;
}

/* scale NULL: no qk-norm */
int qwen3_piece_norm_rope(int reference, const uint16_t *h, long d,
                          const float *scale, double eps, const float *cos,
                          const float *sin, float *out) {
    if (d < 16 || d % 16) return 1;
    float *t = malloc((size_t)d * 4);
    if (!t) return 2;
    (reference ? norm_rope_reference : norm_rope)(h, d, scale, (float)eps, cos,
                                                  sin, t, out);
    free(t);
    return 0;
}

long qwen3_piece_argmax(int reference, const uint16_t *v, long n) {
    if (n < 1) return -1;
    return reference ? argmax_bf16_reference(v, n) : argmax_bf16(v, n);
}

/* qx: k int16 and the scale (4 bytes); returns whether x was finite, -1
   for bad sizes */
int qwen3_piece_quantize(int reference, const float *x, long k, int16_t *qx) {
    if (k < 8 || k % 8) return -1;
    return reference ? quantize_x_reference(x, k, qx) : quantize_x(x, k, qx);
}

/* y = rb8(x) (op 0) or exp8(x) (op 1) over n % 8 == 0 floats; 1 for a bad
   op or n. */
int qwen3_vector_op(int op, const float *x, float *y, long n) {
    if (n % 8 || op < 0 || op > 1) return 1;
    for (long i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, op ? exp8(v) : rb8(v));
    }
    return 0;
}
