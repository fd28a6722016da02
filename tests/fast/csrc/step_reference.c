/* The first, plain forms of the decode step's attention, RoPE, argmax and
   int8 input quantisation (test build only): the vectorised forms in
   utils/fast/csrc (step_ops.c, kernels_v8.c's quantize_x) must give
   exactly these bits, and the tests compare the two through testing.c. */

#include <stdlib.h>

#include "step_reference.h"

void norm_rope_reference(const uint16_t *h, long d, const float *scale,
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

void attend_head_reference(const float *q, const uint16_t *kc,
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
        f8_store(w + j, exp8(f8_sub(f8_load(w + j), f8_set1(mx))));
    }
    for (; j < len; ++j) w[j] = expf(w[j] - mx);
    for (j = 0; j < len; ++j) sum += w[j];
    for (j = 0; j < len; ++j) w[j] = rb(w[j] / sum);
    for (long i = 0; i < d; i += 8) {
        f8 a = f8_zero();
        for (long s = 0; s < len; ++s) a = f8_fma(f8_set1(w[s]), bf16x8(vc + s * d + i), a);
        f8_store(out + i, rb8(a));
    }
}

long argmax_bf16_reference(const uint16_t *v, long n) {
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

int quantize_x_reference(const float *x, long k, int16_t *qx) {
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
        const long v = lrintf(x[i] * inv);
        qx[i] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
    }
    memcpy(qx + k, &xs, 4);
    return 1;
}
