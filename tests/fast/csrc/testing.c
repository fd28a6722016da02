/* The test build's entry points (testing.h) and the scheduler's hooks
   (team.h), compiled with -DQWEN3_HOOKS together with the library's own
   sources (tests/conftest.py passes this folder to utils.fast.build). The
   reader's library has none of this. */

#include <stdlib.h>
#include <time.h>

#include "step_reference.h"
#include "team.h"
#include "testing.h"

extern int cpu_feature_limit; /* dispatch.c */

static long stolen;  /* passes taken from the back since the last read */
static int stall_us; /* the last thread's delay */

void hook_count_stolen(long passes) {
    __atomic_fetch_add(&stolen, passes, __ATOMIC_RELAXED);
}

void hook_stall(int t, int nt) {
    if (!stall_us || nt < 2 || t != nt - 1) return;
    const struct timespec ts = {stall_us / 1000000, stall_us % 1000000 * 1000L};
    nanosleep(&ts, NULL);
}

int qwen3_test_limit_cpu_features(int mask) {
    cpu_feature_limit = mask;
    return cpu_features();
}

long qwen3_test_stolen_passes(int us) {
    stall_us = us;
    return __atomic_exchange_n(&stolen, 0, __ATOMIC_RELAXED);
}

int qwen3_test_attend(int reference, const float *q, const uint16_t *kc,
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

int qwen3_test_norm_rope(int reference, const uint16_t *h, long d,
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

long qwen3_test_argmax(int reference, const uint16_t *v, long n) {
    if (n < 1) return -1;
    return reference ? argmax_bf16_reference(v, n) : argmax_bf16(v, n);
}

int qwen3_test_quantize(int reference, const float *x, long k, int16_t *qx) {
    if (k < 8 || k % 8) return -1;
    return reference ? quantize_x_reference(x, k, qx) : quantize_x(x, k, qx);
}

int qwen3_test_vector_op(int op, const float *x, float *y, long n) {
    if (n % 8 || op < 0 || op > 1) return 1;
    for (long i = 0; i < n; i += 8) {
        const f8 v = f8_load(x + i);
        f8_store(y + i, op ? exp8(v) : rb8(v));
    }
    return 0;
}
