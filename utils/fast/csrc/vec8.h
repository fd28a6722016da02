/* Eight float32 lanes, written once for two instruction sets: AVX2 with
   FMA (x86-64) and NEON (AArch64's Advanced SIMD, two 4-lane registers).

   The kernels and the decode step are written against these operations,
   so one algorithm runs on both. Every operation is lane by lane with
   IEEE float32 rounding (fma: one rounding), and f8_hsum adds the lanes in
   one fixed order, so a kernel gives the same bits on both machines.
   Masks are what the comparisons return; sel(m, a, b) takes b where m is
   set. */
#ifndef QWEN3_VEC8_H
#define QWEN3_VEC8_H

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

typedef __m256 f8;   /* 8 float32 */
typedef __m256i i8v; /* 8 int32 */
typedef __m256 m8;   /* 8 lanes of all ones or zeros */
typedef __m256i q16; /* 16 int16 */
#define VEC8_ISA "avx2"

static inline f8 f8_zero(void) { return _mm256_setzero_ps(); }
static inline f8 f8_set1(float v) { return _mm256_set1_ps(v); }
static inline f8 f8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void f8_store(float *p, f8 v) { _mm256_storeu_ps(p, v); }
static inline f8 f8_add(f8 a, f8 b) { return _mm256_add_ps(a, b); }
static inline f8 f8_sub(f8 a, f8 b) { return _mm256_sub_ps(a, b); }
static inline f8 f8_mul(f8 a, f8 b) { return _mm256_mul_ps(a, b); }
static inline f8 f8_div(f8 a, f8 b) { return _mm256_div_ps(a, b); }
static inline f8 f8_min(f8 a, f8 b) { return _mm256_min_ps(a, b); }
static inline f8 f8_max(f8 a, f8 b) { return _mm256_max_ps(a, b); }
/* a * b + c and c - a * b, each rounded once */
static inline f8 f8_fma(f8 a, f8 b, f8 c) { return _mm256_fmadd_ps(a, b, c); }
static inline f8 f8_fms(f8 a, f8 b, f8 c) { return _mm256_fnmadd_ps(a, b, c); }
static inline f8 f8_neg(f8 a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
static inline f8 f8_round(f8 a) { /* to the nearest integer, ties even */
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float f8_hsum(f8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline m8 f8_lt(f8 a, f8 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline m8 f8_gt(f8 a, f8 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
static inline m8 f8_eq(f8 a, f8 b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
static inline m8 f8_nan(f8 a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
static inline m8 m8_or(m8 a, m8 b) { return _mm256_or_ps(a, b); }
static inline m8 m8_zero(void) { return _mm256_setzero_ps(); }
static inline int m8_bits(m8 m) { return _mm256_movemask_ps(m); } /* lane i: bit i */
static inline f8 sel(m8 m, f8 a, f8 b) { return _mm256_blendv_ps(a, b, m); }

static inline i8v i8_set1(int v) { return _mm256_set1_epi32(v); }
static inline i8v i8_zero(void) { return _mm256_setzero_si256(); }
static inline i8v i8_add(i8v a, i8v b) { return _mm256_add_epi32(a, b); }
static inline i8v i8_sub(i8v a, i8v b) { return _mm256_sub_epi32(a, b); }
static inline i8v i8_and(i8v a, i8v b) { return _mm256_and_si256(a, b); }
static inline i8v i8_or(i8v a, i8v b) { return _mm256_or_si256(a, b); }
static inline i8v i8_min(i8v a, i8v b) { return _mm256_min_epi32(a, b); }
static inline i8v i8_max(i8v a, i8v b) { return _mm256_max_epi32(a, b); }
static inline i8v i8_shl(i8v a, int n) { return _mm256_slli_epi32(a, n); }
static inline i8v i8_shr(i8v a, int n) { return _mm256_srli_epi32(a, n); }
static inline i8v i8_sar(i8v a, int n) { return _mm256_srai_epi32(a, n); }
static inline i8v f8_bits(f8 a) { return _mm256_castps_si256(a); }
static inline f8 i8_bits(i8v a) { return _mm256_castsi256_ps(a); }
static inline f8 i8_float(i8v a) { return _mm256_cvtepi32_ps(a); }
/* to the nearest int32, ties even */
static inline i8v f8_int(f8 a) { return _mm256_cvtps_epi32(a); }
/* the lanes (all within int16) as 8 int16 at p */
static inline void i8_store16(int16_t *p, i8v v) {
    _mm_storeu_si128((__m128i *)p, _mm_packs_epi32(_mm256_castsi256_si128(v),
                                                   _mm256_extracti128_si256(v, 1)));
}

/* 8 bf16 values in memory order -> 8 float32 lanes */
static inline f8 bf16x8(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void bf16x16_fast(const uint16_t *p, f8 *a, f8 *b) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}
/* 16 int8 values as float32: 0-7 in *a, 8-15 in *b */
static inline void i8x16_float(const int8_t *p, f8 *a, f8 *b) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    *a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    *b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v)));
}
static inline q16 q16_load(const int16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* 16 int8 weights times 16 int16 x: lane j = w[2j] x[2j] + w[2j+1] x[2j+1] */
static inline i8v madd_i8(const int8_t *p, q16 x) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_madd_epi16(w, x);
}
static inline void prefetch(const void *p, int far) {
    if (far) _mm_prefetch((const char *)p, _MM_HINT_T1);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}
static inline void cpu_relax(void) { _mm_pause(); }

#elif defined(__aarch64__)
#include <arm_neon.h>

typedef struct { float32x4_t lo, hi; } f8;
typedef struct { int32x4_t lo, hi; } i8v;
typedef struct { uint32x4_t lo, hi; } m8;
typedef int16x8x2_t q16;
#define VEC8_ISA "neon"

/* one NEON operation on both halves */
#define HALVES(T, op, a, b) ((T){op((a).lo, (b).lo), op((a).hi, (b).hi)})
#define HALF1(T, op, a) ((T){op((a).lo), op((a).hi)})

static inline f8 f8_zero(void) { return (f8){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
static inline f8 f8_set1(float v) { return (f8){vdupq_n_f32(v), vdupq_n_f32(v)}; }
static inline f8 f8_load(const float *p) { return (f8){vld1q_f32(p), vld1q_f32(p + 4)}; }
static inline void f8_store(float *p, f8 v) { vst1q_f32(p, v.lo); vst1q_f32(p + 4, v.hi); }
static inline f8 f8_add(f8 a, f8 b) { return HALVES(f8, vaddq_f32, a, b); }
static inline f8 f8_sub(f8 a, f8 b) { return HALVES(f8, vsubq_f32, a, b); }
static inline f8 f8_mul(f8 a, f8 b) { return HALVES(f8, vmulq_f32, a, b); }
static inline f8 f8_div(f8 a, f8 b) { return HALVES(f8, vdivq_f32, a, b); }
/* NaN handling as x86's minps/maxps: the second operand unless a < b
   (resp. a > b), so a NaN in either gives b */
static inline f8 f8_min(f8 a, f8 b) {
    return (f8){vbslq_f32(vcltq_f32(a.lo, b.lo), a.lo, b.lo),
                vbslq_f32(vcltq_f32(a.hi, b.hi), a.hi, b.hi)};
}
static inline f8 f8_max(f8 a, f8 b) {
    return (f8){vbslq_f32(vcgtq_f32(a.lo, b.lo), a.lo, b.lo),
                vbslq_f32(vcgtq_f32(a.hi, b.hi), a.hi, b.hi)};
}
static inline f8 f8_fma(f8 a, f8 b, f8 c) {
    return (f8){vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}
static inline f8 f8_fms(f8 a, f8 b, f8 c) {
    return (f8){vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)};
}
static inline f8 f8_neg(f8 a) { return HALF1(f8, vnegq_f32, a); }
static inline f8 f8_round(f8 a) { return HALF1(f8, vrndnq_f32, a); }
static inline float f8_hsum(f8 v) {
    const float32x4_t s = vaddq_f32(v.lo, v.hi);
    const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

static inline m8 f8_lt(f8 a, f8 b) { return HALVES(m8, vcltq_f32, a, b); }
static inline m8 f8_gt(f8 a, f8 b) { return HALVES(m8, vcgtq_f32, a, b); }
static inline m8 f8_eq(f8 a, f8 b) { return HALVES(m8, vceqq_f32, a, b); }
static inline m8 f8_nan(f8 a) {
    return (m8){vmvnq_u32(vceqq_f32(a.lo, a.lo)), vmvnq_u32(vceqq_f32(a.hi, a.hi))};
}
static inline m8 m8_or(m8 a, m8 b) { return HALVES(m8, vorrq_u32, a, b); }
static inline m8 m8_zero(void) { return (m8){vdupq_n_u32(0), vdupq_n_u32(0)}; }
static inline int m8_bits(m8 m) {
    static const uint32_t lo[4] = {1, 2, 4, 8}, hi[4] = {16, 32, 64, 128};
    return (int)(vaddvq_u32(vandq_u32(m.lo, vld1q_u32(lo)))
                 + vaddvq_u32(vandq_u32(m.hi, vld1q_u32(hi))));
}
static inline f8 sel(m8 m, f8 a, f8 b) {
    return (f8){vbslq_f32(m.lo, b.lo, a.lo), vbslq_f32(m.hi, b.hi, a.hi)};
}

static inline i8v i8_set1(int v) { return (i8v){vdupq_n_s32(v), vdupq_n_s32(v)}; }
static inline i8v i8_zero(void) { return i8_set1(0); }
static inline i8v i8_add(i8v a, i8v b) { return HALVES(i8v, vaddq_s32, a, b); }
static inline i8v i8_sub(i8v a, i8v b) { return HALVES(i8v, vsubq_s32, a, b); }
static inline i8v i8_and(i8v a, i8v b) { return HALVES(i8v, vandq_s32, a, b); }
static inline i8v i8_or(i8v a, i8v b) { return HALVES(i8v, vorrq_s32, a, b); }
static inline i8v i8_min(i8v a, i8v b) { return HALVES(i8v, vminq_s32, a, b); }
static inline i8v i8_max(i8v a, i8v b) { return HALVES(i8v, vmaxq_s32, a, b); }
static inline i8v i8_shl(i8v a, int n) {
    return (i8v){vshlq_s32(a.lo, vdupq_n_s32(n)), vshlq_s32(a.hi, vdupq_n_s32(n))};
}
static inline i8v i8_sar(i8v a, int n) { return i8_shl(a, -n); }
static inline i8v i8_shr(i8v a, int n) {
    const int32x4_t s = vdupq_n_s32(-n);
    return (i8v){vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a.lo), s)),
                 vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a.hi), s))};
}
static inline i8v f8_bits(f8 a) { return HALF1(i8v, vreinterpretq_s32_f32, a); }
static inline f8 i8_bits(i8v a) { return HALF1(f8, vreinterpretq_f32_s32, a); }
static inline f8 i8_float(i8v a) { return HALF1(f8, vcvtq_f32_s32, a); }
static inline i8v f8_int(f8 a) { return HALF1(i8v, vcvtnq_s32_f32, a); }
static inline void i8_store16(int16_t *p, i8v v) {
    vst1q_s16(p, vcombine_s16(vmovn_s32(v.lo), vmovn_s32(v.hi)));
}

static inline float32x4_t bf16x4(uint16x4_t h) {
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}
static inline f8 bf16x8(const uint16_t *p) {
    const uint16x8_t h = vld1q_u16(p);
    return (f8){bf16x4(vget_low_u16(h)), bf16x4(vget_high_u16(h))};
}
static inline void bf16x16_fast(const uint16_t *p, f8 *a, f8 *b) {
    const uint16x8_t h0 = vld1q_u16(p), h1 = vld1q_u16(p + 8);
    *a = (f8){bf16x4(vget_low_u16(h0)), bf16x4(vget_low_u16(h1))};
    *b = (f8){bf16x4(vget_high_u16(h0)), bf16x4(vget_high_u16(h1))};
}
static inline void i8x16_float(const int8_t *p, f8 *a, f8 *b) {
    const int8x16_t v = vld1q_s8(p);
    const int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
    *a = (f8){vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), vcvtq_f32_s32(vmovl_high_s16(l))};
    *b = (f8){vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))};
}
static inline q16 q16_load(const int16_t *p) { return (q16){{vld1q_s16(p), vld1q_s16(p + 8)}}; }
static inline i8v madd_i8(const int8_t *p, q16 x) {
    const int8x16_t v = vld1q_s8(p);
    const int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
    const int32x4_t p0 = vmull_s16(vget_low_s16(l), vget_low_s16(x.val[0]));
    const int32x4_t p1 = vmull_high_s16(l, x.val[0]);
    const int32x4_t p2 = vmull_s16(vget_low_s16(h), vget_low_s16(x.val[1]));
    const int32x4_t p3 = vmull_high_s16(h, x.val[1]);
    return (i8v){vpaddq_s32(p0, p1), vpaddq_s32(p2, p3)};
}
static inline void prefetch(const void *p, int far) {
    if (far) __builtin_prefetch(p, 0, 2);
    else __builtin_prefetch(p, 0, 3);
}
static inline void cpu_relax(void) { __asm__ volatile("yield"); }

#else
#error "the kernels need x86-64 (AVX2) or AArch64 (NEON)"
#endif

/* bf16x16_fast: 16 bf16 values as two f8, lane l of *a holding value
   FAST_ORDER[l] and of *b FAST_ORDER[8 + l] (AVX2's unpacking of one
   256-bit load interleaves its two 128-bit halves; NEON does the same) */
#define FAST_ORDER {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15}

/* Any lane of m set */
static inline int m8_any(m8 m) { return m8_bits(m) != 0; }
/* |a| */
static inline f8 f8_abs(f8 a) { return i8_bits(i8_and(f8_bits(a), i8_set1(0x7fffffff))); }

#endif
