/* What the decode step (decode_step.c) uses of the matrix-vector kernels
   (matvec.c). The entry points Python calls are listed in
   utils/fast/build.py with their argument types. */
#ifndef QWEN3_MATVEC_H
#define QWEN3_MATVEC_H

#include "bf16.h"

/* A row kernel: rows [lo, hi) of y = w x for one matrix (n rows, k
   columns); x is prepared as the kernel expects (see matvec.c), scale is
   the int8 row scales (NULL for bf16 weights). */
typedef void (*rows_fn)(const float *, const void *, const float *, void *,
                        int, long, long, long);

/* One group of matrices sharing x: count weights (n[i], k) stacked into one
   output of sum(n) rows; scales[i] per matrix for int8 (else NULL). */
typedef struct {
    int count;
    const void *const *w;
    const float *const *scales;
    const long *n;
} group;

/* the row kernels: bf16 fast order (x permuted by permute16), bf16 in
   torch's AVX2 order */
QWEN3_INTERNAL void rows_bf16(const float *xp, const void *wv,
                              const float *unused, void *y, int y_f32,
                              long lo, long hi, long k);
QWEN3_INTERNAL void rows_bf16_exact(const float *xn, const void *wv,
                                    const float *unused, void *y, int y_f32,
                                    long lo, long hi, long k);
/* x reordered for rows_bf16 */
QWEN3_INTERNAL void permute16(const float *xn, long k, float *xp);
/* all rows of a group, split over `threads` threads */
QWEN3_INTERNAL int run(rows_fn fn, const float *xv, const group *g, void *y,
                       int y_f32, long k, int threads);
/* the int8 product of a group (qx: scratch of k int16 + one float) */
QWEN3_INTERNAL void int8_group(const float *xn, const group *g, void *y,
                               int y_f32, long k, int threads, int16_t *qx);

#endif
