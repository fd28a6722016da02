/* The pointer table and the dimensions of qwen3_decode_step, defined once.

   The X-macros below list the slots in order; C gets the enums G_*, L_*
   and D_* from them, and qwen3_step_layout() reports the same names as
   text, so the Python loader (utils/fast/native.py) builds the table by
   name and refuses a library whose layout it does not know. To add a
   slot, add it here (and fill it in native.py). */
#ifndef QWEN3_STEP_LAYOUT_H
#define QWEN3_STEP_LAYOUT_H

/* pointers before the layers' */
#define QWEN3_GLOBAL_SLOTS(X) \
    X(EMB) X(EMB_SCALE) X(FINAL_NORM) X(HEAD) X(HEAD_SCALE) X(COS) X(SIN)

/* pointers per layer, in this order (scales NULL for bf16 weights) */
#define QWEN3_LAYER_SLOTS(X)                                          \
    X(NORM1) X(NORM2) X(QNORM) X(KNORM) X(WQ) X(SQ) X(WK) X(SK) X(WV) \
    X(SV) X(WO) X(SO) X(W1) X(S1) X(W2) X(S2) X(W3) X(S3) X(KC) X(VC)

/* the dims array: sizes of the model and the cache length */
#define QWEN3_DIMS(X) \
    X(LAYERS) X(EMB) X(HEADS) X(KV) X(HEAD_DIM) X(HIDDEN) X(VOCAB) X(CACHE)

#define QWEN3_ENUM_G(name) G_##name,
#define QWEN3_ENUM_L(name) L_##name,
#define QWEN3_ENUM_D(name) D_##name,
enum { QWEN3_GLOBAL_SLOTS(QWEN3_ENUM_G) G_COUNT };
enum { QWEN3_LAYER_SLOTS(QWEN3_ENUM_L) L_COUNT };
enum { QWEN3_DIMS(QWEN3_ENUM_D) D_COUNT };

#endif
