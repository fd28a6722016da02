/* One whole decode step in one call (batch 1; see utils/fast/native.py):
   embedding, every layer (RMSNorm, grouped q/k/v, qk-norm, split-halves
   RoPE, cache write, grouped-query attention over the filled slots, output
   projection, SwiGLU) and the head. Values are rounded to bf16 wherever the
   book's bf16 model rounds (every linear output, norm, RoPE, score, softmax,
   SiLU, product and residual add); the float32 sums inside the small
   operations (step_ops.c) run in their own order, so results are close to
   the eager step's, not bit-equal. The matrix-vector products run the
   kernels the caller names (dispatch.c; chosen by utils/fast/dispatch.py).
   Built with -ffp-contract=off: a*b + c*d is two rounded products and a
   rounded sum, as in torch. The pointer table's layout is in
   step_layout.h.

   The whole step is one parallel region: starting the threads costs
   several times what a barrier does, and a step has over a hundred
   products. The vector work between the products (norms, residual adds,
   SwiGLU, the rounding of x) is short, so every thread does all of it on
   its own copy of the residual stream, the same operations on the same
   values and so the same bits; only the products and the attention's kv
   groups are shared out, each followed by a barrier. */

#include <stdlib.h>

#include "step_layout.h"
#include "step_ops.h"
#include "team.h"

#ifdef _OPENMP
int omp_get_thread_num(void); /* from omp.h */
int omp_get_num_threads(void);
#endif

typedef struct {
    const kernel *bf16, *int8; /* the kernels the products run */
    team tm;     /* this thread of the step's team */
    float *xbuf; /* this thread's x prepared for the bf16 kernel, or int16
                    x (int8) */
} mv_ctx;

/* y (bf16, sum n) = stacked weights @ x (float32, k): bf16 weights when
   s is NULL, else int8 weights times their row scales s[i]. */
static void mv(mv_ctx *c, const float *x, long k, int count,
               const void *const *w, const float *const *s, const long *n,
               uint16_t *y) {
    const group g = {count, w, s, n};
    const kernel *v = kernel_fitting(s ? c->int8 : c->bf16, k);
    if (s) {
        team_int8_group(x, &g, y, 0, k, (int16_t *)c->xbuf, &v->rows, &c->tm);
    } else {
        if (v->prep) {
            v->prep(x, k, c->xbuf);
            x = c->xbuf;
        }
        team_product(&v->rows, x, &g, y, 0, k, &c->tm);
    }
}

/* y = w @ x for one matrix (s: its int8 scales, NULL for bf16) */
static void mv1(mv_ctx *c, const float *x, long k, const void *w,
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

/* c's kernels from kernels[0] (bf16: the exact or the fast class) and
   kernels[1] (int8): 0, 1 for an unknown or misplaced one, 3 when the CPU
   cannot run one */
static int read_kernels(const int *kernels, mv_ctx *c) {
    int a, b;
    c->bf16 = kernel_for(kernels[0], -1, &a);
    c->int8 = kernel_for(kernels[1], CLASS_INT8, &b);
    if (a == 1 || b == 1) return 1;
    if (a || b) return 3;
    return c->bf16->cls != CLASS_EXACT && c->bf16->cls != CLASS_FAST;
}

/* The memory the team shares (one allocation with every thread's lane)
   and this position's RoPE rows. Each product writes the y the one before
   it did not, so a thread still reading a product's result is never
   overwritten by a faster one already at the next product. */
typedef struct {
    float *qf, *ctx, *scratch, *att, *act; /* float32 */
    uint16_t *y[2];                  /* bf16 results of mv */
    passes_left *left;               /* the team's words (see team) */
    float *lanes;                    /* every thread's lane */
    const float *cos, *sin;
    long pos;
} step_buf;

/* One thread's own memory: the residual stream x, a norm's output hin,
   and its mv context */
typedef struct {
    float *x, *hin;
    mv_ctx mc;
} lane;

/* The longest input and output of the step's products */
static long k_max(const step_dims *d) {
    const long E = d->E, F = d->F, HD = d->H * d->D;
    return E > F ? (E > HD ? E : HD) : (F > HD ? F : HD);
}

static long y_max(const step_dims *d) {
    const long QKV = (d->H + 2 * d->G) * d->D, most = QKV > 2 * d->F ? QKV : 2 * d->F;
    return most > d->E ? most : d->E; /* W_O and W_3 write E */
}

/* The floats of one lane: x, hin and xbuf */
static long lane_floats(const step_dims *d) { return d->E + 2 * k_max(d) + 16; }

/* Allocates b's buffers for up to `threads` lanes; returns the block to
   free (NULL: out of memory; then nothing is left allocated) */
static float *alloc_buf(const step_dims *d, const void *const *p, long pos,
                        int threads, step_buf *b) {
    const long H = d->H, D = d->D, Y = y_max(d);
    const size_t floats = (size_t)(2 * H * D + 2 * d->G * D + H * (pos + 1)
                                   + d->F + threads * lane_floats(d) + Y);
    float *mem = malloc(floats * 4);
    b->left = team_words((size_t)threads * TEAM_COUNT + TEAM_SYNC); /* sync first */
    if (!mem || !b->left) {
        free(mem), free(b->left);
        return NULL;
    }
    b->qf = mem, b->ctx = b->qf + H * D;
    b->scratch = b->ctx + H * D; /* 2 * D per kv group */
    b->att = b->scratch + 2 * d->G * D;
    b->act = b->att + H * (pos + 1);
    b->lanes = b->act + d->F;
    b->y[0] = (uint16_t *)(b->lanes + threads * lane_floats(d));
    b->y[1] = b->y[0] + Y;
    b->cos = (const float *)p[G_COS] + pos * D;
    b->sin = (const float *)p[G_SIN] + pos * D;
    b->pos = pos;
    return mem;
}

/* The calling thread's lane of b, its kernels those of c */
static lane lane_of(const step_dims *d, const step_buf *b, const mv_ctx *c) {
    lane ln;
    ln.mc = *c;
#ifdef _OPENMP
    ln.mc.tm.t = omp_get_thread_num(), ln.mc.tm.nt = omp_get_num_threads();
#else
    ln.mc.tm.t = 0, ln.mc.tm.nt = 1;
#endif
    ln.mc.tm.sync = b->left, ln.mc.tm.left = b->left + TEAM_SYNC, ln.mc.tm.seq = 0;
    ln.x = b->lanes + ln.mc.tm.t * lane_floats(d);
    ln.hin = ln.x + d->E;
    ln.mc.xbuf = ln.hin + k_max(d);
    return ln;
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
static void mv_qkv(const step_dims *d, const void *const *q, mv_ctx *c,
                   const float *x, uint16_t *y) {
    const void *w[3] = {q[L_WQ], q[L_WK], q[L_WV]};
    const float *s[3] = {q[L_SQ], q[L_SK], q[L_SV]};
    const long n[3] = {d->H * d->D, d->G * d->D, d->G * d->D};
    mv(c, x, d->E, 3, w, s[0] ? s : NULL, n, y);
}

static void mv_gate_up(const step_dims *d, const void *const *q,
                       mv_ctx *c, const float *x, uint16_t *y) {
    const void *w[2] = {q[L_W1], q[L_W2]};
    const float *s[2] = {q[L_S1], q[L_S2]};
    const long n[2] = {d->F, d->F};
    mv(c, x, d->E, 2, w, s[0] ? s : NULL, n, y);
}

/* Kv group g of layer q at slot b->pos: its query heads normed and
   rotated, its new key (normed, rotated) and value written into the
   caches, then its attention over the len filled slots (group g + 1's
   keys and values fetched meanwhile when `more`: the thread attends it
   next) */
static void attend_kv_group(const step_dims *d, const void *const *q,
                            const step_buf *b, const uint16_t *y, long g,
                            long len, int more) {
    const long H = d->H, G = d->G, D = d->D, C = d->C, r = H / G;
    float *t = b->scratch + g * 2 * D, *key = t + D;
    for (long h = g * r; h < (g + 1) * r; ++h)
        norm_rope(y + h * D, D, q[L_QNORM], d->eps, b->cos, b->sin, t,
                  b->qf + h * D);
    norm_rope(y + (H + g) * D, D, q[L_KNORM], d->eps, b->cos, b->sin, t, key);
    uint16_t *kc = (uint16_t *)q[L_KC] + g * C * D;
    uint16_t *vc = (uint16_t *)q[L_VC] + g * C * D;
    for (long i = 0; i < D; ++i) kc[b->pos * D + i] = to_bf16(key[i]);
    memcpy(vc + b->pos * D, y + (H + G + g) * D, (size_t)D * 2);
    attend_group(b->qf + g * r * D, kc, vc, len, D, r, b->att + g * r * len,
                 b->ctx + g * r * D, more ? kc + C * D : NULL,
                 more ? vc + C * D : NULL);
}

/* x += attention(norm1(x)) for layer q, its key and value written into
   the caches at b->pos; the kv groups (their RoPE too) shared out among
   the team from two slots on (below that, one thread is quicker than a
   split) */
static void attention(const step_dims *d, const void *const *q,
                      const step_buf *b, lane *ln) {
    const long E = d->E, H = d->H, G = d->G, D = d->D, len = b->pos + 1;
    rmsnorm(ln->x, E, q[L_NORM1], d->eps, ln->hin);
    mv_qkv(d, q, &ln->mc, ln->hin, b->y[0]);
    const long t = ln->mc.tm.t, nt = ln->mc.tm.nt;
    const int shared = nt > 1 && len * H * D >= (1L << 12);
    const long g0 = shared ? G * t / nt : (t ? G : 0);
    const long g1 = shared ? G * (t + 1) / nt : G;
    hook_stall(ln->mc.tm.t, ln->mc.tm.nt);
    for (long g = g0; g < g1; ++g)
        attend_kv_group(d, q, b, b->y[0], g, len, g + 1 < g1);
    team_barrier(&ln->mc.tm);
    mv1(&ln->mc, b->ctx, H * D, q[L_WO], q[L_SO], E, b->y[1]);
    add_residual(ln->x, b->y[1], E);
}

/* x += SwiGLU feed-forward(norm2(x)) for layer q; the SwiGLU shared out
   in blocks of 8 */
static void feed_forward(const step_dims *d, const void *const *q,
                         const step_buf *b, lane *ln) {
    const long E = d->E, F = d->F, t = ln->mc.tm.t, nt = ln->mc.tm.nt;
    rmsnorm(ln->x, E, q[L_NORM2], d->eps, ln->hin);
    mv_gate_up(d, q, &ln->mc, ln->hin, b->y[0]);
    hook_stall(t, nt);
    swiglu(b->y[0], b->y[0] + F, F / 8 * t / nt * 8, F / 8 * (t + 1) / nt * 8,
           b->act);
    team_barrier(&ln->mc.tm);
    mv1(&ln->mc, b->act, F, q[L_W3], q[L_S3], E, b->y[1]);
    add_residual(ln->x, b->y[1], E);
}

/* One thread's part of the step, from the embedding to the logits */
static void step_thread(const step_dims *d, const void *const *p,
                        long token, const step_buf *b, const mv_ctx *c,
                        uint16_t *logits) {
    lane ln = lane_of(d, b, c);
    embed(d, p, token, ln.x);
    for (long l = 0; l < d->L; ++l) {
        const void *const *q = p + G_COUNT + l * L_COUNT;
        attention(d, q, b, &ln);
        feed_forward(d, q, b, &ln);
    }
    rmsnorm(ln.x, d->E, p[G_FINAL_NORM], d->eps, ln.hin);
    mv1(&ln.mc, ln.hin, d->E, p[G_HEAD], p[G_HEAD_SCALE], d->V, logits);
}

/* The threads a step's team asks for: 1 without OpenMP */
static int team_size(int threads) {
#ifdef _OPENMP
    return threads > 1 ? threads : 1;
#else
    (void)threads;
    return 1;
#endif
}

/* Logits (bf16, vocab) for the token *token at position *pos and their
   argmax in *next; its key and value are written into the caches first
   (token and pos are read where the caller's tensors hold them: reading
   them in Python costs two torch calls). The bf16 products run kernel
   kernels[0], the int8 ones kernels[1] (indices of qwen3_kernels). 0 on
   success, 1 for bad arguments, 2 when out of memory, 3 when the CPU
   cannot run a kernel named. */
int qwen3_decode_step(const long *dims, double eps_d, const void *const *p,
                      const int64_t *token_at, const int64_t *pos_at,
                      const int *kernels, uint16_t *logits, long *next,
                      int threads) {
    step_dims d;
    step_buf b;
    mv_ctx c;
    const long token = (long)*token_at, pos = (long)*pos_at;
    if (read_dims(dims, eps_d, token, pos, &d)) return 1;
    const int bad = read_kernels(kernels, &c);
    if (bad) return bad;
    threads = team_size(threads);
    float *mem = alloc_buf(&d, p, pos, threads, &b);
    if (!mem) return 2;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
#endif
    step_thread(&d, p, token, &b, &c, logits);
    *next = argmax_bf16(logits, d.V);
    free(b.left);
    free(mem);
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
