/* One whole decode step in one call (batch 1; see utils/fast/native.py):
   embedding, every layer (RMSNorm, grouped q/k/v, qk-norm, split-halves
   RoPE, cache write, grouped-query attention over the filled slots, output
   projection, SwiGLU) and the head. Values are rounded to bf16 wherever the
   book's bf16 model rounds (every linear output, norm, RoPE, score, softmax,
   SiLU, product and residual add); the float32 sums inside the small
   operations (step_ops.c) run in their own order, so results are close to
   the eager step's, not bit-equal. The matrix-vector products run the
   kernel variants the caller names (variants.c; chosen by
   utils/fast/tuner.py). Built with -ffp-contract=off: a*b + c*d is two
   rounded products and a rounded sum, as in torch. The pointer table's
   layout is in step_layout.h. */

#include <stdlib.h>

#include "matvec.h"
#include "step_layout.h"
#include "step_ops.h"

typedef struct {
    const kernel_variant *bf16, *int8; /* the variants the products run */
    int threads;
    float *xbuf; /* x prepared for the bf16 variant, or int16 x (int8) */
} mv_ctx;

/* y (bf16, sum n) = stacked weights @ x (float32, k): bf16 weights when
   s is NULL, else int8 weights times their row scales s[i]. */
static void mv(const mv_ctx *c, const float *x, long k, int count,
               const void *const *w, const float *const *s, const long *n,
               uint16_t *y) {
    const group g = {count, w, s, n};
    const kernel_variant *v = variant_fitting(s ? c->int8 : c->bf16, k);
    if (s) {
        int8_group(x, &g, y, 0, k, c->threads, (int16_t *)c->xbuf, &v->rows);
        return;
    }
    if (v->prep) {
        v->prep(x, k, c->xbuf);
        x = c->xbuf;
    }
    run(&v->rows, x, &g, y, 0, k, c->threads);
}

/* y = w @ x for one matrix (s: its int8 scales, NULL for bf16) */
static void mv1(const mv_ctx *c, const float *x, long k, const void *w,
                const float *s, long n, uint16_t *y) {
    const void *ws[1] = {w};
    const float *ss[1] = {s};
    const long ns[1] = {n};
    mv(c, x, k, 1, ws, s ? ss : NULL, ns, y);
}

/* The sizes a step works with (from the dims array) */
typedef struct {
    long L, E, H, G, D, F, V, C;
    float eps;
} step_dims;

/* 0 when the model's sizes are usable, else 1 */
static int read_sizes(const long *dims, double eps_d, step_dims *d) {
    d->L = dims[D_LAYERS], d->E = dims[D_EMB], d->H = dims[D_HEADS];
    d->G = dims[D_KV], d->D = dims[D_HEAD_DIM], d->F = dims[D_HIDDEN];
    d->V = dims[D_VOCAB], d->C = dims[D_CACHE];
    d->eps = (float)eps_d;
    const long E = d->E, F = d->F, D = d->D, H = d->H, G = d->G;
    return d->L < 1 || E < 16 || E % 16 || F < 16 || F % 16 || D < 16
           || D % 16 || H < 1 || G < 1 || H % G || (H * D) % 16 || d->V < 1;
}

/* 0 when the sizes, the token and the position are usable, else 1 */
static int read_dims(const long *dims, double eps_d, long token, long pos,
                     step_dims *d) {
    return read_sizes(dims, eps_d, d) || d->C < 1 || pos < 0 || pos >= d->C
           || token < 0 || token >= d->V;
}

/* c's variants from variants[0] (bf16: the exact or the fast class) and
   variants[1] (int8): 0, 1 for an unknown or misplaced one, 3 when the CPU
   cannot run one */
static int read_variants(const int *variants, mv_ctx *c) {
    const int a = variant_status(variants[0], -1);
    const int b = variant_status(variants[1], CLASS_INT8);
    if (a == 1 || b == 1) return 1;
    if (a || b) return 3;
    c->bf16 = variant_for(variants[0], -1);
    c->int8 = variant_for(variants[1], CLASS_INT8);
    return c->bf16->cls == CLASS_INT8;
}

/* The step's scratch memory (one allocation) and this position's RoPE rows */
typedef struct {
    float *x, *hin, *qf, *ctx, *scratch, *att; /* float32 */
    uint16_t *y;                           /* bf16 results of mv */
    mv_ctx mc;
    const float *cos, *sin;
    long pos;
} step_buf;

/* The longest input and output of the step's products */
static long k_max(const step_dims *d) {
    const long E = d->E, F = d->F, HD = d->H * d->D;
    return E > F ? (E > HD ? E : HD) : (F > HD ? F : HD);
}

static long y_max(const step_dims *d) {
    const long QKV = (d->H + 2 * d->G) * d->D, most = QKV > 2 * d->F ? QKV : 2 * d->F;
    return most > d->E ? most : d->E; /* W_O and W_3 write E */
}

/* Allocates b's buffers (b->mc's variants set by the caller); returns the
   block to free (NULL: out of memory) */
static float *alloc_buf(const step_dims *d, const void *const *p, long pos,
                        int threads, step_buf *b) {
    const long E = d->E, H = d->H, D = d->D, K_MAX = k_max(d);
    const size_t floats = (size_t)(E + K_MAX + 2 * H * D + K_MAX + 16
                                   + 2 * d->G * D + H * (pos + 1));
    float *mem = malloc(floats * 4 + (size_t)y_max(d) * 2);
    if (!mem) return NULL;
    b->x = mem, b->hin = b->x + E, b->qf = b->hin + K_MAX;
    b->ctx = b->qf + H * D;
    float *xbuf = b->ctx + H * D;
    b->scratch = xbuf + K_MAX + 16; /* 2 * D per kv group */
    b->att = b->scratch + 2 * d->G * D;
    b->y = (uint16_t *)(b->att + H * (pos + 1));
    b->mc.threads = threads, b->mc.xbuf = xbuf;
    b->cos = (const float *)p[G_COS] + pos * D;
    b->sin = (const float *)p[G_SIN] + pos * D;
    b->pos = pos;
    return mem;
}

/* x = the token's embedding row (an int8 table: the row times its scale) */
static void embed(const step_dims *d, const void *const *p, long token,
                  float *x) {
    const long E = d->E;
    if (p[G_EMB_SCALE]) {
        const int8_t *row = (const int8_t *)p[G_EMB] + token * E;
        const float sc = ((const float *)p[G_EMB_SCALE])[token];
        for (long i = 0; i < E; ++i) x[i] = rb((float)row[i] * sc);
    } else {
        const uint16_t *row = (const uint16_t *)p[G_EMB] + token * E;
        for (long i = 0; i < E; ++i) x[i] = from_bf16(row[i]);
    }
}

/* The grouped products of layer q (the q/k/v and the gate/up weights
   share an input); the step and qwen3_step_products both call these */
static void mv_qkv(const step_dims *d, const void *const *q, const mv_ctx *c,
                   const float *x, uint16_t *y) {
    const void *w[3] = {q[L_WQ], q[L_WK], q[L_WV]};
    const float *s[3] = {q[L_SQ], q[L_SK], q[L_SV]};
    const long n[3] = {d->H * d->D, d->G * d->D, d->G * d->D};
    mv(c, x, d->E, 3, w, s[0] ? s : NULL, n, y);
}

static void mv_gate_up(const step_dims *d, const void *const *q,
                       const mv_ctx *c, const float *x, uint16_t *y) {
    const void *w[2] = {q[L_W1], q[L_W2]};
    const float *s[2] = {q[L_S1], q[L_S2]};
    const long n[2] = {d->F, d->F};
    mv(c, x, d->E, 2, w, s[0] ? s : NULL, n, y);
}

/* Kv group g of layer q at slot b->pos: its query heads normed and
   rotated, its new key (normed, rotated) and value written into the
   caches, then its attention over the len filled slots */
static void attend_kv_group(const step_dims *d, const void *const *q,
                            step_buf *b, long g, long len) {
    const long H = d->H, G = d->G, D = d->D, C = d->C, r = H / G;
    float *t = b->scratch + g * 2 * D, *key = t + D;
    for (long h = g * r; h < (g + 1) * r; ++h)
        norm_rope(b->y + h * D, D, q[L_QNORM], d->eps, b->cos, b->sin, t,
                  b->qf + h * D);
    norm_rope(b->y + (H + g) * D, D, q[L_KNORM], d->eps, b->cos, b->sin, t,
              key);
    uint16_t *kc = (uint16_t *)q[L_KC] + g * C * D;
    uint16_t *vc = (uint16_t *)q[L_VC] + g * C * D;
    for (long i = 0; i < D; ++i) kc[b->pos * D + i] = to_bf16(key[i]);
    memcpy(vc + b->pos * D, b->y + (H + G + g) * D, (size_t)D * 2);
    attend_group(b->qf + g * r * D, kc, vc, len, D, r, b->att + g * r * len,
                 b->ctx + g * r * D);
}

/* x += attention(norm1(x)) for layer q, its key and value written into
   the caches at b->pos; the kv groups (their RoPE too) split over the
   threads */
static void attention(const step_dims *d, const void *const *q,
                      step_buf *b) {
    const long E = d->E, H = d->H, G = d->G, D = d->D, len = b->pos + 1;
    rmsnorm(b->x, E, q[L_NORM1], d->eps, b->hin);
    mv_qkv(d, q, &b->mc, b->hin, b->y);
    const int threads = b->mc.threads;
    /* split from two slots on: at position 20 one core took about 24 us
       per layer for the 8 groups, two about half that (a parallel region
       costs under a microsecond) */
#ifdef _OPENMP
    #pragma omp parallel for num_threads(threads) schedule(static) \
        if (threads > 1 && len * H * D >= (1L << 12))
#else
    (void)threads;
#endif
    for (long g = 0; g < G; ++g) attend_kv_group(d, q, b, g, len);
    mv1(&b->mc, b->ctx, H * D, q[L_WO], q[L_SO], E, b->y);
    add_residual(b->x, b->y, E);
}

/* x += SwiGLU feed-forward(norm2(x)) for layer q */
static void feed_forward(const step_dims *d, const void *const *q,
                         step_buf *b) {
    const long E = d->E, F = d->F;
    rmsnorm(b->x, E, q[L_NORM2], d->eps, b->hin);
    mv_gate_up(d, q, &b->mc, b->hin, b->y);
    swiglu(b->y, b->y + F, F, b->hin);
    mv1(&b->mc, b->hin, F, q[L_W3], q[L_S3], E, b->y);
    add_residual(b->x, b->y, E);
}

/* Logits (bf16, vocab) for `token` at position `pos` and their argmax in
   *next; its key and value are written into the caches first. The bf16
   products run variant variants[0], the int8 ones variants[1] (indices
   of qwen3_variant_table). 0 on success, 1 for bad arguments, 2 when out
   of memory, 3 when the CPU cannot run a variant named. */
int qwen3_decode_step(const long *dims, double eps_d, const void *const *p,
                      long token, long pos, const int *variants,
                      uint16_t *logits, long *next, int threads) {
    step_dims d;
    step_buf b;
    if (read_dims(dims, eps_d, token, pos, &d)) return 1;
    const int bad = read_variants(variants, &b.mc);
    if (bad) return bad;
    float *mem = alloc_buf(&d, p, pos, threads, &b);
    if (!mem) return 2;
    embed(&d, p, token, b.x);
    for (long l = 0; l < d.L; ++l) {
        const void *const *q = p + G_COUNT + l * L_COUNT;
        attention(&d, q, &b);
        feed_forward(&d, q, &b);
    }
    rmsnorm(b.x, d.E, p[G_FINAL_NORM], d.eps, b.hin);
    mv1(&b.mc, b.hin, d.E, p[G_HEAD], p[G_HEAD_SCALE], d.V, logits);
    *next = argmax_bf16(logits, d.V);
    free(mem);
    return 0;
}

/* The step's matrix-vector products alone, in its order and grouping,
   every weight of the table read once, on a fixed bf16-valued x (the
   tuner times these; the cache, cos and sin slots are not read). Return
   codes as qwen3_decode_step. */
int qwen3_step_products(const long *dims, const void *const *p,
                        const int *variants, int threads) {
    step_dims d;
    mv_ctx c;
    if (read_sizes(dims, 1e-6, &d)) return 1;
    const int bad = read_variants(variants, &c);
    if (bad) return bad;
    const long K_MAX = k_max(&d), Y = y_max(&d) > d.V ? y_max(&d) : d.V;
    float *x = malloc((size_t)(2 * K_MAX + 16) * 4 + (size_t)Y * 2);
    if (!x) return 2;
    for (long i = 0; i < K_MAX; ++i) x[i] = rb((float)(i % 17 - 8) / 16.0f);
    c.threads = threads, c.xbuf = x + K_MAX;
    uint16_t *y = (uint16_t *)(x + 2 * K_MAX + 16);
    for (long l = 0; l < d.L; ++l) {
        const void *const *q = p + G_COUNT + l * L_COUNT;
        mv_qkv(&d, q, &c, x, y);
        mv1(&c, x, d.H * d.D, q[L_WO], q[L_SO], d.E, y);
        mv_gate_up(&d, q, &c, x, y);
        mv1(&c, x, d.F, q[L_W3], q[L_S3], d.E, y);
    }
    mv1(&c, x, d.E, p[G_HEAD], p[G_HEAD_SCALE], d.V, y);
    free(x);
    return 0;
}

/* The table layout of step_layout.h as text, for the loader:
   "global:EMB,...;layer:NORM1,...;dims:LAYERS,..." (each name ends in ',') */
#define QWEN3_NAME(name) #name ","
const char *qwen3_step_layout(void) {
    return "global:" QWEN3_GLOBAL_SLOTS(QWEN3_NAME)
           ";layer:" QWEN3_LAYER_SLOTS(QWEN3_NAME)
           ";dims:" QWEN3_DIMS(QWEN3_NAME);
}
