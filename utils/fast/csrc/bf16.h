/* bf16 <-> float32 and the helpers shared by the kernels and the decode
   step (static inline: every file that includes this gets its own copy,
   so nothing here is a symbol of the library). */
#ifndef QWEN3_BF16_H
#define QWEN3_BF16_H

#include <stdint.h>
#include <string.h>

#include "vec8.h"

#define PREFETCH_BYTES 512
#define PF(p) prefetch((const char *)(p) + PREFETCH_BYTES, 0)

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

/* f rounded to bf16 and back */
static inline float rb(float f) { return from_bf16(to_bf16(f)); }

/* rb on 8 floats (same bits as to_bf16, NaN kept quiet) */
static inline f8 rb8(f8 v) {
    const i8v u = f8_bits(v), hi = i8_set1(-65536);
    const i8v lsb = i8_and(i8_shr(u, 16), i8_set1(1));
    const i8v r = i8_and(i8_add(u, i8_add(i8_set1(0x7fff), lsb)), hi);
    const i8v q = i8_or(i8_and(u, hi), i8_set1(0x400000));
    return sel(f8_nan(v), i8_bits(r), i8_bits(q));
}

/* y[n] = v, as float32 or rounded to bf16 */
static inline void store(void *y, int y_f32, long n, float v) {
    if (y_f32) ((float *)y)[n] = v;
    else ((uint16_t *)y)[n] = to_bf16(v);
}

#endif
