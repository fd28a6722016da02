/* What the test build of the library exports besides api.h: hooks into
   the scheduler, a lower CPU feature limit, and the step's pieces in their
   vectorised and first forms. The same format as api.h (one prototype per
   line, starting with QWEN3_API): utils/fast/build.py reads both. */
#ifndef QWEN3_TESTING_H
#define QWEN3_TESTING_H

#include "api.h"

/* Act as if the CPU had only the features in mask (-1: all it has; a
   limit never adds any); returns the features then in effect */
QWEN3_API int qwen3_test_limit_cpu_features(int mask);
/* The passes taken from the back of another thread's share since the last
   call; us > 0: from now on the last thread of a product or a step's team
   sleeps us microseconds at the start of each product, after each product
   and before its part of the attention and the SwiGLU (0: no delay) */
QWEN3_API long qwen3_test_stolen_passes(int us);
/* The r query heads of one kv group: w (r*len), out (r*d); reference 1:
   the first form; 2: the step's form told that another group comes next,
   whose keys are vc and values kc */
QWEN3_API int qwen3_test_attend(int reference, const float *q, const uint16_t *kc, const uint16_t *vc, long len, long d, long r, float *w, float *out);
/* One head's qk-norm (scale NULL: none) and RoPE */
QWEN3_API int qwen3_test_norm_rope(int reference, const uint16_t *h, long d, const float *scale, double eps, const float *cos, const float *sin, float *out);
/* torch.argmax of n bf16 values; -1 for n < 1 */
QWEN3_API long qwen3_test_argmax(int reference, const uint16_t *v, long n);
/* x rounded to 16-bit fixed point (qx: k int16, then the scale as 4
   bytes); whether x was finite, -1 for bad sizes */
QWEN3_API int qwen3_test_quantize(int reference, const float *x, long k, int16_t *qx);
/* y = rb8(x) (op 0) or exp8(x) (op 1) over n % 8 == 0 floats; 1 for a bad
   op or n */
QWEN3_API int qwen3_test_vector_op(int op, const float *x, float *y, long n);

#endif
