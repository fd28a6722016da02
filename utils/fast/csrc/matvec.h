/* What the decode step (decode_step.c) and the kernel variants
   (variants.c) use of the matrix-vector kernels (matvec.c). The entry
   points Python calls are listed in utils/fast/build.py with their
   argument types. */
#ifndef QWEN3_MATVEC_H
#define QWEN3_MATVEC_H

#include <time.h>

#include "bf16.h"

/* A row kernel: passes [j0, j1) over rows [lo, hi) of y = w x for one
   matrix (k columns); x is prepared as the kernel expects (see matvec.c),
   scale is the int8 row scales (NULL for bf16 weights). The rows are cut
   into S sections of per = (hi - lo) / S rows (S: the kernel's sections);
   pass j < per reads row lo + q * per + j of every section q at once (S
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

/* the row kernels: bf16 fast order (x permuted by permute16), bf16 in
   torch's AVX2 order (with and without software prefetch), int8 times x
   in 16-bit fixed point (qx: see int8_group) */
#define ROW_KERNEL(name)                                                  \
    QWEN3_INTERNAL void name(const float *x, const void *w, const float *s, \
                             void *y, int y_f32, long lo, long hi, long k,  \
                             long j0, long j1)
ROW_KERNEL(rows_bf16);
ROW_KERNEL(rows_bf16_exact);
ROW_KERNEL(rows_bf16_exact_np);
ROW_KERNEL(rows_i8q);
/* x (k values, bf16 or float32) as float32 */
QWEN3_INTERNAL void load_x(const void *x, int x_f32, long k, float *out);
/* 1 for a group of no matrices or a negative row count */
QWEN3_INTERNAL int bad_group(int count, const long *n);
/* x reordered for rows_bf16 */
QWEN3_INTERNAL void permute16(const float *xn, long k, float *xp);
/* all rows of a group, split over `threads` threads (see run in
   matvec.c: a thread that is done takes passes from the others' ends) */
QWEN3_INTERNAL int run(const row_kernel *rk, const float *xv, const group *g,
                       void *y, int y_f32, long k, int threads);
/* x rounded to 16-bit fixed point: k int16 in qx, then the scale as one
   float; 0 (qx untouched) if x holds an inf or NaN. k % 8 == 0. */
QWEN3_INTERNAL int quantize_x(const float *x, long k, int16_t *qx);
/* the int8 product of a group with the 16-bit row kernel `rows` (qx:
   scratch of k int16 + one float) */
QWEN3_INTERNAL void int8_group(const float *xn, const group *g, void *y,
                               int y_f32, long k, int threads, int16_t *qx,
                               const row_kernel *rows);

/* The passes of one piece of a product not yet taken (see run) */
typedef struct {
    uint64_t left; /* front << 32 | back */
    char pad[56];
} passes_left;

/* A parallel region's threads running a sequence of products together
   (decode_step.c): thread t of nt, the team's shared passes-left words
   (TEAM_COUNT per thread) and two words that say which product they were
   last filled for (sync; all zero before the first), and this thread's
   count of the products it has joined */
#define TEAM_COUNT 3
typedef struct {
    passes_left *left, *sync;
    long long *clock; /* this thread's step clocks (decode_step.c); NULL: off */
    long seq;
    int t, nt;
} team;

/* The step's clocks (qwen3_step_clocks): nanoseconds per thread in */
enum {
    CLOCK_STEP,         /* its whole part of the step */
    CLOCK_PRODUCTS,     /* the products, their barriers included */
    CLOCK_PRODUCT_WAIT, /* the barriers at the ends of the products */
    CLOCK_OTHER_WAIT,   /* the barriers after the attention and the SwiGLU */
    CLOCK_ATTENTION,    /* its kv groups (RoPE, cache write, attention) */
    CLOCK_COUNT
};

/* Nanoseconds on the monotonic clock */
static inline long long clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* `words` passes-left words, 64-byte aligned and zero (every piece used
   up); NULL when out of memory */
QWEN3_INTERNAL passes_left *team_words(size_t words);
/* The calling thread's share of a group's product (count <= TEAM_COUNT),
   then a barrier: every thread of the team calls it with the same
   arguments, and on return y is complete */
QWEN3_INTERNAL void team_product(const row_kernel *rk, const float *xv,
                                 const group *g, void *y, int y_f32, long k,
                                 team *tm);
/* int8_group as a team_product (qx: this thread's own scratch) */
QWEN3_INTERNAL void team_int8_group(const float *xn, const group *g, void *y,
                                    int y_f32, long k, int16_t *qx,
                                    const row_kernel *rows, team *tm);
/* Waits for every thread of the team (none outside a parallel region) */
QWEN3_INTERNAL void team_barrier(void);
/* team_barrier, the wait added to clock[slot] (clock NULL: clocks off) */
QWEN3_INTERNAL void timed_barrier(long long *clock, int slot);
/* For the tests (qwen3_stolen_passes): the team's last thread sleeps
   after each product and before its part of the attention or the SwiGLU */
QWEN3_INTERNAL void team_stall(const team *tm);

/* ---- kernel variants (variants.c) ------------------------------------- */

/* Instruction sets a variant may need (bits of cpu_features()) */
enum { CPU_AVX2 = 1, CPU_AVX512 = 2, CPU_AVX512_BF16 = 4, CPU_AVX512_VNNI = 8 };
/* Variant classes: every variant of a class computes what its first one
   does, bit for bit (exact, int8) or within float32's bound (fast) */
enum { CLASS_EXACT, CLASS_FAST, CLASS_INT8, CLASS_COUNT };

/* x for a row kernel from float32 x (k values; xp: k floats + 16) */
typedef void (*prep_fn)(const float *xn, long k, float *xp);

typedef struct {
    const char *name;
    row_kernel rows;
    prep_fn prep; /* NULL: x as it is (int8: quantize_x, in int8_group) */
    int cls, needs, kmul; /* kmul: k must be a multiple of it */
} kernel_variant;

/* What this CPU (and OS) can run, within the limit a test may set */
QWEN3_INTERNAL int cpu_features(void);
/* 0 when variant i exists, belongs to class cls (any class: -1) and runs
   on this CPU; 1 when it does not exist or is of another class; 3 when
   the CPU lacks its instructions */
QWEN3_INTERNAL int variant_status(int i, int cls);
/* Variant i where variant_status(i, cls) is 0, else NULL */
QWEN3_INTERNAL const kernel_variant *variant_for(int i, int cls);
/* The variant a call with k columns runs: v, or the first variant of the
   fast class (bf16) or of the int8 class when k % v->kmul */
QWEN3_INTERNAL const kernel_variant *variant_fitting(const kernel_variant *v,
                                                     long k);

#endif
