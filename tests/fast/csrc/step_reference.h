/* The first forms of the step's pieces (step_reference.c) */
#ifndef QWEN3_STEP_REFERENCE_H
#define QWEN3_STEP_REFERENCE_H

#include "kernels.h"
#include "step_ops.h"

void norm_rope_reference(const uint16_t *h, long d, const float *scale,
                         float eps, const float *cos, const float *sin,
                         float *t, float *out);
void attend_head_reference(const float *q, const uint16_t *kc,
                           const uint16_t *vc, long len, long d, float *w,
                           float *out);
long argmax_bf16_reference(const uint16_t *v, long n);
int quantize_x_reference(const float *x, long k, int16_t *qx);

#endif
