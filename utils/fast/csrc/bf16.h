/* bf16 <-> float32 and small AVX2 helpers shared by the x86 kernels and
   the decode step (static inline: every file that includes this gets its
   own copy, so nothing here is a symbol of the library). */
#ifndef QWEN3_BF16_H
#define QWEN3_BF16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PREFETCH_BYTES 512
#define PF(p) _mm_prefetch((const char *)(p) + PREFETCH_BYTES, _MM_HINT_T0)

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16, round to nearest even (NaN stays NaN) */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* 8 bf16 values in memory order -> 8 float32 lanes */
static inline __m256 bf16x8_natural(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* f rounded to bf16 and back */
static inline float rb(float f) { return from_bf16(to_bf16(f)); }

/* rb on 8 floats (same bits as to_bf16, NaN kept quiet) */
static inline __m256 rb8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_set1_epi32(-65536);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                         _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     lsb));
    r = _mm256_and_si256(r, hi);
    const __m256i q = _mm256_or_si256(_mm256_and_si256(u, hi),
                                      _mm256_set1_epi32(0x400000));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q),
                            _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* y[n] = v, as float32 or rounded to bf16 */
static inline void store(void *y, int y_f32, long n, float v) {
    if (y_f32) ((float *)y)[n] = v;
    else ((uint16_t *)y)[n] = to_bf16(v);
}

#endif
