/* What the library exports, written once.

   Every source includes this file, so the compiler checks each definition
   against the prototype below; utils/fast/build.py reads the same lines to
   give ctypes their argument and result types (a pointer of any type is a
   c_void_p, `const char *` as a result is text). Keep one prototype per
   line, starting with QWEN3_API. Change QWEN3_ABI with any prototype or
   with the meaning of an argument: a cached library reporting another
   number is rebuilt. Everything not listed here stays inside the library
   (it is built with -fvisibility=hidden). */
#ifndef QWEN3_API_H
#define QWEN3_API_H

#include <stdint.h>

#define QWEN3_ABI 0xc0000
#define QWEN3_API __attribute__((visibility("default")))

/* QWEN3_ABI, plus 1 when built with OpenMP */
QWEN3_API int qwen3_abi(void);
/* The names of qwen3_cpu_features()'s bits, in bit order, comma-separated */
QWEN3_API const char *qwen3_cpu_feature_names(void);
/* What this CPU and its OS can run (bits) */
QWEN3_API int qwen3_cpu_features(void);
/* The kernel table: "name:class:needs:kmul;" per kernel (needs: bits as
   qwen3_cpu_features; k must be a multiple of kmul) */
QWEN3_API const char *qwen3_kernels(void);
/* y (sum n) = stacked [w_0; w_1; ...] (n_i, k) @ x (k) with kernel `kernel`
   of the table; int8 kernels take per-row scales, bf16 ones NULL. 0 on
   success, 1 for bad arguments, 2 out of memory, 3 the CPU lacks the kernel's
   instructions */
QWEN3_API int qwen3_matvec(int kernel, const void *x, int x_f32, int count, const void *const *w, const float *const *scales, const long *n, void *y, int y_f32, long k, int threads);
/* y (m, sum n) = x (m, k) @ stacked int8 [w_0; w_1; ...]^T times the
   per-row scales, with multi-row kernel `kernel` (class int8_mm); each row
   of y the bits qwen3_matvec's int8 reference gives that row. Codes as
   qwen3_matvec's */
QWEN3_API int qwen3_matmul(int kernel, const void *x, int x_f32, long m, int count, const void *const *w, const float *const *scales, const long *n, void *y, int y_f32, long k, int threads);
/* One decode step (decode_step.c); the table's layout, as text */
QWEN3_API int qwen3_decode_step(const long *dims, double eps, const void *const *p, const int64_t *token_at, const int64_t *pos_at, const int *kernels, uint16_t *logits, long *next, int threads);
/* The step for m rows at once, each with its own position and cache
   (several rows of one prompt may share one), each row's bits those it
   gets alone (decode_step.c) */
QWEN3_API int qwen3_decode_rows(const long *dims, double eps, const void *const *p, long m, const int64_t *tokens, const int64_t *pos, const void *const *caches, const long *slots, const unsigned char *want, const int *kernels, uint16_t *logits, long *next, int threads);
QWEN3_API const char *qwen3_step_layout(void);

#endif
