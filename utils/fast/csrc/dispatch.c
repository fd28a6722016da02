/* What the CPU runs, the kernel table, and the product entry point.

   Kernels are chosen at run time, never from compile-time guesses: on
   x86-64 cpuid says which instructions the CPU has and xgetbv whether the
   OS saves their registers; on AArch64 the OS says (Linux: HWCAP, macOS:
   sysctl). A kernel whose instructions are missing is refused here (an
   error code, never an illegal instruction). Which kernel of a class
   runs follows from these features and the table below. */

#include <stdio.h>
#include <stdlib.h>

#include "team.h"

#if defined(__x86_64__)
#include <cpuid.h>

#define FEATURE_NAMES "avx2,avx512,avx512_bf16,avx512_vnni" /* "avx512": F, BW, DQ, VL */

static int detect_features(void) {
    unsigned a, b, c, d, xcr0, xcr0_hi;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx || __get_cpuid_max(0, NULL) < 7) return 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0 & 0x6) != 0x6) return 0; /* the OS saves xmm and ymm */
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned subleaves = a;
    int f = 0;
    if (fma && ((b >> 5) & 1)) f |= CPU_BASE;
    /* AVX512 F (bit 16), DQ (17), BW (30), VL (31); the OS saves the
       opmask and zmm registers (XCR0 bits 5-7) */
    const unsigned fdbv = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    if (!(f & CPU_BASE) || (b & fdbv) != fdbv || (xcr0 & 0xe6) != 0xe6) return f;
    f |= CPU_AVX512;
    if ((c >> 11) & 1) f |= CPU_AVX512_VNNI;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 5) & 1) f |= CPU_AVX512_BF16;
    }
    return f;
}

#else /* AArch64: NEON (asimd) is in every such CPU; the others are named
         for rules to come (bits 2-8 mean these here, not AVX-512) */
#define FEATURE_NAMES "asimd,asimddp,bf16,i8mm"
#if defined(__APPLE__)
#include <sys/sysctl.h>

static int has(const char *name) {
    int v = 0;
    size_t size = sizeof v;
    return sysctlbyname(name, &v, &size, NULL, 0) == 0 && v;
}

static int detect_features(void) {
    return CPU_BASE | (has("hw.optional.arm.FEAT_DotProd") ? 2 : 0)
           | (has("hw.optional.arm.FEAT_BF16") ? 4 : 0)
           | (has("hw.optional.arm.FEAT_I8MM") ? 8 : 0);
}
#else
#include <sys/auxv.h>

static int detect_features(void) {
    const unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    /* HWCAP_ASIMD, HWCAP_ASIMDDP; HWCAP2_BF16, HWCAP2_I8MM */
    return ((h >> 1) & 1 ? CPU_BASE : 0) | ((h >> 20) & 1 ? 2 : 0)
           | ((h2 >> 14) & 1 ? 4 : 0) | ((h2 >> 13) & 1 ? 8 : 0);
}
#endif
#endif

#ifdef QWEN3_HOOKS
int cpu_feature_limit = -1; /* a hooks' source may lower it (team.h) */
#else
#define cpu_feature_limit (-1)
#endif

int cpu_features(void) {
    static int detected = -1;
    if (detected < 0) detected = detect_features();
    return detected & cpu_feature_limit;
}

/* Per class best first: a class runs its first kernel whose features the
   CPU has (utils/fast/dispatch.py reads this table); its last, the
   kernels_v8.c kernel, is its reference and runs wherever no other can */
static const kernel KERNELS[] = {
#ifdef QWEN3_AVX512
    {"bf16_exact_avx512_xb", {rows_exact_512_xb, 1}, x_to_bf16, CLASS_EXACT,
     CPU_BASE | CPU_AVX512, 64},
#endif
    {"bf16_exact_" VEC8_ISA, {rows_bf16_exact, 4}, NULL, CLASS_EXACT, CPU_BASE, 64},
    {"bf16_fast_" VEC8_ISA, {rows_bf16, 4}, permute16, CLASS_FAST, CPU_BASE, 16},
#ifdef QWEN3_AVX512
    {"int8_avx512vnni_s2", {rows_i8q_vnni_s2, 2}, NULL, CLASS_INT8,
     CPU_BASE | CPU_AVX512 | CPU_AVX512_VNNI, 64},
#endif
    {"int8_" VEC8_ISA, {rows_i8q, 4}, NULL, CLASS_INT8, CPU_BASE, 16},
#ifdef QWEN3_AVX512
    {"int8_mm_avx512vnni", {rows_i8mm_vnni, 4}, NULL, CLASS_INT8_MM,
     CPU_BASE | CPU_AVX512 | CPU_AVX512_VNNI, 32},
#endif
    {"int8_mm_" VEC8_ISA, {rows_i8mm, 4}, NULL, CLASS_INT8_MM, CPU_BASE, 16},
};
#define N_KERNELS ((int)(sizeof KERNELS / sizeof KERNELS[0]))

static const char *const CLASS_NAMES[CLASS_COUNT] = {"exact", "fast", "int8", "int8_mm"};

const kernel *kernel_for(int i, int cls, int *why) {
    if (i < 0 || i >= N_KERNELS || (cls >= 0 && KERNELS[i].cls != cls)) {
        *why = 1;
        return NULL;
    }
    if (KERNELS[i].needs & ~cpu_features()) {
        *why = 3;
        return NULL;
    }
    *why = 0;
    return &KERNELS[i];
}

static const kernel *reference_of(int cls) {
    for (int i = N_KERNELS - 1; i >= 0; --i)
        if (KERNELS[i].cls == cls) return &KERNELS[i];
    return NULL; /* not reached: every class has its kernels_v8.c kernel */
}

const kernel *kernel_fitting(const kernel *v, long k) {
    if (k % v->kmul == 0) return v;
    return reference_of(v->cls == CLASS_EXACT ? CLASS_FAST : v->cls);
}

/* ---- entry points (api.h) ------------------------------------------- */

int qwen3_abi(void) {
#ifdef _OPENMP
    return QWEN3_ABI | 1;
#else
    return QWEN3_ABI;
#endif
}

const char *qwen3_cpu_feature_names(void) {
    return FEATURE_NAMES;
}

int qwen3_cpu_features(void) { return cpu_features(); }

const char *qwen3_kernels(void) {
    static char text[1024];
    if (!text[0]) {
        size_t used = 0;
        for (int i = 0; i < N_KERNELS; ++i) {
            const kernel *v = &KERNELS[i];
            used += (size_t)snprintf(text + used, sizeof text - used,
                                     "%s:%s:%d:%d;", v->name,
                                     CLASS_NAMES[v->cls], v->needs, v->kmul);
        }
    }
    return text;
}

/* A kernel that takes x as bf16 refuses an x bf16 cannot hold (it would
   round it); the step's x always holds bf16 values */
int qwen3_matvec(int kernel_index, const void *x, int x_f32, int count,
                 const void *const *w, const float *const *scales,
                 const long *n, void *y, int y_f32, long k, int threads) {
    int why;
    const kernel *v = kernel_for(kernel_index, -1, &why);
    if (!v) return why;
    if (k < 1 || k % v->kmul || bad_group(count, n) || v->cls == CLASS_INT8_MM
        || (v->cls == CLASS_INT8) != (scales != NULL))
        return 1;
    float *xn = malloc((size_t)k * 8 + 64); /* x, then x prepared */
    if (!xn) return 2;
    load_x(x, x_f32, k, xn);
    float *xp = xn + k;
    const group g = {count, w, scales, n};
    int rc = 0;
    if (v->cls == CLASS_INT8) {
        int8_group(xn, &g, y, y_f32, k, threads, (int16_t *)xp, &v->rows);
    } else if (v->prep == x_to_bf16 && needs_float_x(xn, k)) {
        rc = 1;
    } else {
        if (v->prep) v->prep(xn, k, xp);
        run(&v->rows, v->prep ? xp : xn, &g, y, y_f32, k, threads);
    }
    free(xn);
    return rc;
}

/* The multi-row form: m rows of x at once (int8 weights) */
int qwen3_matmul(int kernel_index, const void *x, int x_f32, long m, int count,
                 const void *const *w, const float *const *scales,
                 const long *n, void *y, int y_f32, long k, int threads) {
    int why;
    const kernel *v = kernel_for(kernel_index, CLASS_INT8_MM, &why);
    if (!v) return why;
    if (k < 1 || k % v->kmul || m < 1 || bad_group(count, n) || !scales) return 1;
    const group g = {count, w, scales, n};
    return int8_matmul(v, x, x_f32, m, &g, y, y_f32, k, threads);
}
