/* The matrix-vector row kernels and their table (dispatch.c).

   A row kernel computes rows of y = w x for one matrix. Kernels come in
   four classes; every kernel of a class computes what its first kernel
   (kernels_v8.c: AVX2 or NEON) does: bit for bit for "exact" (ATen's
   summation order) and "int8", within float32's error bound for "fast".
   The fourth, "int8_mm" (kernels_mm.c), takes several rows of x at once
   and gives each the bits the int8 class gives it alone.
   Which kernel of a class runs is chosen by CPU features (dispatch.c's
   table, best first). */
#ifndef QWEN3_KERNELS_H
#define QWEN3_KERNELS_H

#include "api.h"
#include "bf16.h"

/* A row kernel: passes [j0, j1) over rows [lo, hi) of y = w x for one
   matrix (k columns); x is prepared as the kernel expects, scale is the
   int8 row scales (NULL for bf16 weights). The rows are cut into S
   sections of per = (hi - lo) / S rows (S: the kernel's sections); pass
   j < per reads row lo + q * per + j of every section q at once (S
   far-apart streams), pass per + i the leftover row lo + S * per + i. So
   every row is computed the same way whichever call takes its pass. */
typedef void (*rows_fn)(const float *, const void *, const float *, void *,
                        int, long, long, long, long, long);

typedef struct {
    rows_fn fn;
    int sections; /* S */
} row_kernel;

/* The number of passes of `rows` rows in S sections */
static inline long pass_count(long rows, int S) { return rows / S + rows % S; }

/* The full passes of a call, and its leftover rows (see rows_fn) */
#define FULL_PASSES(j, j0, j1, per) \
    for (long j = (j0); j < ((j1) < (per) ? (j1) : (per)); ++j)
#define LEFTOVER_ROWS(n, j0, j1, per, lo, S)                          \
    for (long n = (lo) + (S) * (per) + ((j0) > (per) ? (j0) - (per) : 0); \
         n < (lo) + (S) * (per) + (j1) - (per); ++n)

/* One group of matrices sharing x: count weights (n[i], k) stacked into one
   output of sum(n) rows; scales[i] per matrix for int8 (else NULL). */
typedef struct {
    int count;
    const void *const *w;
    const float *const *scales;
    const long *n;
} group;

/* The int8 kernels add int32 products over this many columns before
   converting to float32 (no int32 sum can overflow before). */
#define I16_CHUNK 1024

#define ROW_KERNEL(name)                                                   \
    void name(const float *x, const void *w, const float *s, void *y,     \
              int y_f32, long lo, long hi, long k, long j0, long j1)

/* The first kernels (kernels_v8.c; AVX2 or NEON): bf16 fast order (x from permute16), bf16 in
   ATen's order, int8 times x in 16-bit fixed point (x from quantize_x),
   int8 times float32 x (for an x holding inf or NaN) */
ROW_KERNEL(rows_bf16);
ROW_KERNEL(rows_bf16_exact);
ROW_KERNEL(rows_i8q);
ROW_KERNEL(rows_i8);
/* x (k values, bf16 or float32) as float32 */
void load_x(const void *x, int x_f32, long k, float *out);
/* x reordered for rows_bf16 */
void permute16(const float *xn, long k, float *xp);
/* x rounded to 16-bit fixed point: k int16 in qx, then the scale as one
   float; 0 (qx untouched) if x holds an inf or NaN. k % 8 == 0. */
int quantize_x(const float *x, long k, int16_t *qx);

/* AVX-512 (kernels_avx512.c, built for any x86-64 CPU through target
   attributes, run only where the CPU has the instructions) */
ROW_KERNEL(rows_exact_512_xb);
ROW_KERNEL(rows_i8q_vnni_s2);
/* x as bf16 for rows_exact_512_xb (exact where x holds bf16 values) */
void x_to_bf16(const float *xn, long k, float *xp);
/* Whether x holds a value bf16 cannot represent (then x_to_bf16 rounds) */
int needs_float_x(const float *xn, long k);
/* The m rows of x as the multi-row int8 kernels read them: row r's k
   int16 (quantize_x's) at q + r * ldq, its scale in xs[r], ok[r] = 0 for
   a row computed apart (inf or NaN); y's rows ldy values apart */
typedef struct {
    const int16_t *q;
    const float *xs;
    const unsigned char *ok;
    long m, ldq, ldy;
} mm_x;
/* Several rows of x for a one-row kernel (decode_step.c's rows_multi) or
   rows_exact_512_mm: m rows of prepared x, ldx floats apart (inner: the
   one-row kernel); row r of y ldy values after row 0 */
typedef struct {
    const float *x;
    rows_fn inner;
    long m, ldx, ldy;
} multi_x;
/* rows_exact_512_xb's sums for every row of x (a multi_x of rows from
   x_split), each weight row read once for all of them */
ROW_KERNEL(rows_exact_512_mm);
/* x for rows_exact_512_mm: per 32 columns the 16 even ones, then the 16
   odd ones (exact where x holds bf16 values, as the step's x does) */
void x_split(const float *xn, long k, float *xp);
/* The multi-row int8 kernels (kernels_mm.c; class "int8_mm"): x is an
   mm_x there, never a float vector; the vec8 form and AVX512_VNNI's */
ROW_KERNEL(rows_i8mm);
ROW_KERNEL(rows_i8mm_vnni);
/* Whether the compiler built the AVX-512 kernels (x86-64; gcc >= 10,
   clang >= 9) */
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define QWEN3_AVX512 1
#endif

/* ---- the table (dispatch.c) ------------------------------------------ */

/* Instruction sets a kernel may need (bits of cpu_features(); names in
   dispatch.c). CPU_BASE is what the first kernels need: AVX2 with FMA,
   or NEON (every AArch64 CPU). */
enum { CPU_BASE = 1, CPU_AVX512 = 2, CPU_AVX512_BF16 = 4, CPU_AVX512_VNNI = 8 };
enum { CLASS_EXACT, CLASS_FAST, CLASS_INT8, CLASS_INT8_MM, CLASS_COUNT };

/* x for a row kernel from float32 x (k values; xp: k floats + 16) */
typedef void (*prep_fn)(const float *xn, long k, float *xp);

typedef struct {
    const char *name;
    row_kernel rows;
    prep_fn prep; /* NULL: x as it is (int8: quantize_x, in int8_group) */
    int cls, needs, kmul; /* kmul: k must be a multiple of it */
} kernel;

/* What this CPU (and OS) can run */
int cpu_features(void);
/* Kernel i where it exists, is of class cls (any class: -1) and runs on
   this CPU; else NULL, with *why 1 (no such kernel, other class) or 3
   (the CPU lacks its instructions) */
const kernel *kernel_for(int i, int cls, int *why);
/* The kernel a call with k columns runs: v, or its class's reference
   (kernels_v8.c) when k is not a multiple of v's kmul (bf16: the fast
   class's) */
const kernel *kernel_fitting(const kernel *v, long k);
/* y (m, sum n) = x (m rows of k) times a group's int8 weights transposed
   with the multi-row kernel v (kernels_mm.c): each row of y has the bits
   the int8 class's reference gives that row alone. 0, or 2 when out of
   memory */
int int8_matmul(const kernel *v, const void *x, int x_f32, long m,
                const group *g, void *y, int y_f32, long k, int threads);

#endif
