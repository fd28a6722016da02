/* One whole decode step in one call (see utils/fast/native.py): embedding,
   every layer (RMSNorm, grouped q/k/v, qk-norm, split-halves RoPE, cache
   write, grouped-query attention over the filled slots, output
   projection, SwiGLU) and the head, for one row or several. Values are
   rounded to bf16 wherever the book's bf16 model rounds (every linear
   output, norm, RoPE, score, softmax, SiLU, product and residual add);
   the float32 sums inside the small operations (step_ops.c) run in their
   own order, so results are close to the eager step's, not bit-equal. The
   matrix-vector products run the kernels the caller names (dispatch.c;
   chosen by utils/fast/dispatch.py). Built with -ffp-contract=off: a*b +
   c*d is two rounded products and a rounded sum, as in torch. The pointer
   table's layout is in step_layout.h.

   Several rows (qwen3_decode_rows: a batch, each row its own sequence at
   its own position with its own cache) compute what each row computes
   alone, bit for bit: the products of several rows run kernels that give
   every row the bits of the one-row kernel (int8: the int8_mm class; bf16:
   the one-row kernel itself, called per row on weights still in cache,
   rows_multi), and everything else is done per row by the same functions.

   The whole step is one parallel region: starting the threads costs
   several times what a barrier does, and a step has over a hundred
   products. The vector work between the products (norms, residual adds,
   the rounding of x) is short, so every thread does all of it on its own
   copy of the residual streams, the same operations on the same values and
   so the same bits; only the products, the attention's (row, kv group)
   pairs and SwiGLU are shared out, each followed by a barrier. */

#include <stdlib.h>

#include "step_layout.h"
#include "step_ops.h"
#include "team.h"

#ifdef _OPENMP
int omp_get_thread_num(void); /* from omp.h */
int omp_get_num_threads(void);
#endif

typedef struct {
    const kernel *bf16, *int8, *int8_mm; /* the kernels the products run */
    team tm;     /* this thread of the step's team */
    float *xbuf; /* this thread's x rows prepared for the bf16 kernel, or
                    int16 x rows (int8; see mm_x) */
    long m;      /* rows */
} mv_ctx;

/* Weight bytes a call of the one-row kernel covers before the next row of
   x: they stay in L1/L2 while every row takes them */
#define MULTI_BYTES (16L * 1024)

/* Passes [j0, j1) for every row of x (a multi_x), a few passes at a time:
   each weight row is read from memory once for all rows of x, and each
   (weight row, row of x) is computed by the one-row kernel, as alone */
static void rows_multi(const float *xv, const void *w, const float *s, void *y,
                       int y_f32, long lo, long hi, long k, long j0, long j1) {
    const multi_x *mx = (const multi_x *)xv;
    const long row_bytes = k * (s ? 1 : 2) * 4; /* up to 4 sections a pass */
    const long step = MULTI_BYTES / row_bytes > 1 ? MULTI_BYTES / row_bytes : 1;
    const size_t esize = y_f32 ? 4 : 2;
    for (long j = j0; j < j1; j += step) {
        const long e = j + step < j1 ? j + step : j1;
        for (long r = 0; r < mx->m; ++r)
            mx->inner(mx->x + r * mx->ldx, w, s, (char *)y + (size_t)(r * mx->ldy) * esize,
                      y_f32, lo, hi, k, j, e);
    }
}

/* y rows (bf16, sum n each, ldy apart) = stacked bf16 weights @ x rows
   (float32, k, ldx apart) */
static void mv_bf16(mv_ctx *c, const float *x, long ldx, long k, const group *g,
                    uint16_t *y, long ldy) {
    const kernel *v = kernel_fitting(c->bf16, k);
    const long ldp = k + 32;
#ifdef QWEN3_AVX512
    /* rows_exact_512_xb's sums with each weight row read once for all */
    const int split = c->m > 1 && v->rows.fn == rows_exact_512_xb;
#else
    const int split = 0;
#endif
    const prep_fn prep = split ? x_split : v->prep;
    if (prep) {
        for (long r = 0; r < c->m; ++r) prep(x + r * ldx, k, c->xbuf + r * ldp);
        x = c->xbuf, ldx = ldp;
    }
    if (c->m == 1) {
        team_product(&v->rows, x, g, y, 0, k, &c->tm);
        return;
    }
    const multi_x mx = {x, v->rows.fn, c->m, ldx, ldy};
    row_kernel rk = {rows_multi, v->rows.sections};
#ifdef QWEN3_AVX512
    if (split) rk.fn = rows_exact_512_mm;
#endif
    team_product(&rk, (const float *)&mx, g, y, 0, k, &c->tm);
}

/* The same with int8 weights times their row scales: one row as
   team_int8_group, several with the int8_mm kernel (each row's bits as
   alone) and a row holding inf or NaN apart, as alone */
static void mv_int8(mv_ctx *c, const float *x, long ldx, long k, const group *g,
                    uint16_t *y, long ldy) {
    if (c->m == 1) {
        const kernel *v = kernel_fitting(c->int8, k);
        team_int8_group(x, g, y, 0, k, (int16_t *)c->xbuf, &v->rows, &c->tm);
        return;
    }
    static const row_kernel ROWS_I8 = {rows_i8, 4};
    const long ldq = k + 32; /* k int16, the scale, 64-byte steps */
    int16_t *q = (int16_t *)c->xbuf;
    float *xs = (float *)(q + c->m * ldq);
    unsigned char *ok = (unsigned char *)(xs + c->m);
    for (long r = 0; r < c->m; ++r) {
        ok[r] = (unsigned char)quantize_x(x + r * ldx, k, q + r * ldq);
        if (ok[r]) memcpy(&xs[r], q + r * ldq + k, 4);
    }
    const mm_x mx = {q, xs, ok, c->m, ldq, ldy};
    team_product(&kernel_fitting(c->int8_mm, k)->rows, (const float *)&mx, g, y,
                 0, k, &c->tm);
    for (long r = 0; r < c->m; ++r) /* the same on every thread: same bits */
        if (!ok[r]) team_product(&ROWS_I8, x + r * ldx, g, y + r * ldy, 0, k, &c->tm);
}

/* y rows (bf16, sum n) = stacked weights @ x rows (float32, k, ldx
   apart): bf16 weights when s is NULL, else int8 weights times their row
   scales s[i] */
static void mv(mv_ctx *c, const float *x, long ldx, long k, int count,
               const void *const *w, const float *const *s, const long *n,
               uint16_t *y, long ldy) {
    const group g = {count, w, s, n};
    if (s) mv_int8(c, x, ldx, k, &g, y, ldy);
    else mv_bf16(c, x, ldx, k, &g, y, ldy);
}

/* y = w @ x for one matrix (s: its int8 scales, NULL for bf16) */
static void mv1(mv_ctx *c, const float *x, long ldx, long k, const void *w,
                const float *s, long n, uint16_t *y, long ldy) {
    const void *ws[1] = {w};
    const float *ss[1] = {s};
    const long ns[1] = {n};
    mv(c, x, ldx, k, 1, ws, s ? ss : NULL, ns, y, ldy);
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

/* The rows of a step: row r's token, position, the slots of its cache
   and its caches (keys of layer l at cache[2 * l], values at
   cache[2 * l + 1], L * 2 pointers a row); its scores' place in att */
typedef struct {
    long m;
    const int64_t *token, *pos;
    const long *slots;
    const void *const *cache;
    long *att_at;
    const unsigned char *want; /* rows whose logits are wanted (NULL: all) */
    int shared;                /* some rows share a cache (a prompt's rows) */
} step_rows;

/* 0 when every row's token, position and cache are usable (a position
   inside its cache and the RoPE table, dims[D_CACHE] rows), else 1; notes
   whether rows share a cache (then each row's keys and values are written
   before any row attends) */
static int check_rows(const step_dims *d, step_rows *rw) {
    if (rw->m < 1) return 1;
    rw->shared = 0;
    for (long r = 0; r < rw->m; ++r) {
        if (r && rw->cache[r * 2 * d->L] == rw->cache[(r - 1) * 2 * d->L])
            rw->shared = 1;
        const long tok = (long)rw->token[r], pos = (long)rw->pos[r];
        if (tok < 0 || tok >= d->V || pos < 0 || pos >= rw->slots[r]
            || pos >= d->C)
            return 1;
        for (long i = 0; i < 2 * d->L; ++i)
            if (!rw->cache[r * 2 * d->L + i]) return 1;
    }
    return 0;
}

/* c's kernels from kernels[0] (bf16: the exact or the fast class),
   kernels[1] (int8) and, for several rows, kernels[2] (int8_mm): 0, 1 for
   an unknown or misplaced one, 3 when the CPU cannot run one */
static int read_kernels(const int *kernels, long m, mv_ctx *c) {
    int a, b, e = 0;
    c->bf16 = kernel_for(kernels[0], -1, &a);
    c->int8 = kernel_for(kernels[1], CLASS_INT8, &b);
    c->int8_mm = m > 1 ? kernel_for(kernels[2], CLASS_INT8_MM, &e) : NULL;
    if (a == 1 || b == 1 || e == 1) return 1;
    if (a || b || e) return 3;
    return c->bf16->cls != CLASS_EXACT && c->bf16->cls != CLASS_FAST;
}

/* The memory the team shares (one allocation with every thread's lane).
   Each product writes the y the one before it did not, so a thread still
   reading a product's result is never overwritten by a faster one
   already at the next product. */
typedef struct {
    float *qf, *ctx, *scratch, *att, *act; /* float32, per row */
    uint16_t *y[2];                  /* bf16 results of mv, per row */
    passes_left *left;               /* the team's words (see team) */
    float *lanes;                    /* every thread's lane */
    const float *cos, *sin;          /* the RoPE table, D floats a position */
    const step_rows *rw;
} step_buf;

/* One thread's own memory: the rows' residual streams x, a norm's
   outputs hin, and its mv context */
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

/* The floats of one lane for m rows: x, hin and xbuf (m rows of k_max +
   32, then the int8 rows' scales and flags) */
static long lane_floats(const step_dims *d, long m) {
    return m * (d->E + 2 * k_max(d) + 34) + 16;
}

/* The floats the rows' scores take: H * (position + 1) a row */
static long att_floats(const step_dims *d, const step_rows *rw) {
    long n = 0;
    for (long r = 0; r < rw->m; ++r) {
        rw->att_at[r] = n;
        n += d->H * (rw->pos[r] + 1);
    }
    return n;
}

/* Allocates b's buffers for up to `threads` lanes; returns the block to
   free (NULL: out of memory; then nothing is left allocated) */
static float *alloc_buf(const step_dims *d, const void *const *p,
                        const step_rows *rw, int threads, step_buf *b) {
    const long m = rw->m, HD = d->H * d->D, Y = y_max(d);
    const size_t floats = (size_t)(m * (2 * HD + 2 * d->G * d->D + d->F + Y)
                                   + att_floats(d, rw)
                                   + threads * lane_floats(d, m));
    float *mem = malloc(floats * 4);
    b->left = team_words((size_t)threads * TEAM_COUNT + TEAM_SYNC); /* sync first */
    if (!mem || !b->left) {
        free(mem), free(b->left);
        return NULL;
    }
    b->qf = mem, b->ctx = b->qf + m * HD;
    b->scratch = b->ctx + m * HD; /* 2 * D per row and kv group */
    b->act = b->scratch + m * 2 * d->G * d->D;
    b->lanes = b->act + m * d->F;
    b->att = b->lanes + threads * lane_floats(d, m);
    b->y[0] = (uint16_t *)(b->att + att_floats(d, rw));
    b->y[1] = b->y[0] + m * Y;
    b->cos = (const float *)p[G_COS];
    b->sin = (const float *)p[G_SIN];
    b->rw = rw;
    return mem;
}

/* The calling thread's lane of b, its kernels those of c */
static lane lane_of(const step_dims *d, const step_buf *b, const mv_ctx *c) {
    lane ln;
    const long m = b->rw->m;
    ln.mc = *c;
    ln.mc.m = m;
#ifdef _OPENMP
    ln.mc.tm.t = omp_get_thread_num(), ln.mc.tm.nt = omp_get_num_threads();
#else
    ln.mc.tm.t = 0, ln.mc.tm.nt = 1;
#endif
    ln.mc.tm.sync = b->left, ln.mc.tm.left = b->left + TEAM_SYNC, ln.mc.tm.seq = 0;
    ln.x = b->lanes + ln.mc.tm.t * lane_floats(d, m);
    ln.hin = ln.x + m * d->E;
    ln.mc.xbuf = ln.hin + m * k_max(d);
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
   share an input) */
static void mv_qkv(const step_dims *d, const void *const *q, mv_ctx *c,
                   const float *x, uint16_t *y) {
    const void *w[3] = {q[L_WQ], q[L_WK], q[L_WV]};
    const float *s[3] = {q[L_SQ], q[L_SK], q[L_SV]};
    const long n[3] = {d->H * d->D, d->G * d->D, d->G * d->D};
    mv(c, x, k_max(d), d->E, 3, w, s[0] ? s : NULL, n, y, y_max(d));
}

static void mv_gate_up(const step_dims *d, const void *const *q,
                       mv_ctx *c, const float *x, uint16_t *y) {
    const void *w[2] = {q[L_W1], q[L_W2]};
    const float *s[2] = {q[L_S1], q[L_S2]};
    const long n[2] = {d->F, d->F};
    mv(c, x, k_max(d), d->E, 2, w, s[0] ? s : NULL, n, y, y_max(d));
}

/* Row r's keys and values of layer l, kv group g (C slots a group) */
static uint16_t *group_cache(const step_dims *d, const step_rows *rw, long r,
                             long l, long g, int values) {
    const long C = rw->slots[r];
    return (uint16_t *)rw->cache[(r * d->L + l) * 2 + values] + g * C * d->D;
}

/* Kv group g of layer l for row r: its query heads normed and rotated,
   its new key (normed, rotated) and value written into the row's caches
   at its position */
static void write_kv_group(const step_dims *d, const void *const *q, long l,
                           const step_buf *b, long r, long g) {
    const step_rows *rw = b->rw;
    const long H = d->H, G = d->G, D = d->D, rr = H / G, pos = (long)rw->pos[r];
    const uint16_t *y = b->y[0] + r * y_max(d);
    const float *cos = b->cos + pos * D, *sin = b->sin + pos * D;
    float *t = b->scratch + (r * G + g) * 2 * D, *key = t + D;
    float *qf = b->qf + r * H * D;
    for (long h = g * rr; h < (g + 1) * rr; ++h)
        norm_rope(y + h * D, D, q[L_QNORM], d->eps, cos, sin, t, qf + h * D);
    norm_rope(y + (H + g) * D, D, q[L_KNORM], d->eps, cos, sin, t, key);
    uint16_t *kc = group_cache(d, rw, r, l, g, 0), *vc = group_cache(d, rw, r, l, g, 1);
    for (long i = 0; i < D; ++i) kc[pos * D + i] = to_bf16(key[i]);
    memcpy(vc + pos * D, y + (H + G + g) * D, (size_t)D * 2);
}

/* Row r's attention of kv group g over its filled slots (the next group's
   keys and values fetched meanwhile when `more`: the thread attends it
   next) */
static void attend_kv_group(const step_dims *d, long l, const step_buf *b,
                            long r, long g, int more) {
    const step_rows *rw = b->rw;
    const long H = d->H, D = d->D, rr = H / d->G, len = (long)rw->pos[r] + 1;
    const long C = rw->slots[r];
    const uint16_t *kc = group_cache(d, rw, r, l, g, 0), *vc = group_cache(d, rw, r, l, g, 1);
    attend_group(b->qf + (r * H + g * rr) * D, kc, vc, len, D, rr,
                 b->att + rw->att_at[r] + g * rr * len, b->ctx + (r * H + g * rr) * D,
                 more ? kc + C * D : NULL, more ? vc + C * D : NULL);
}

/* x += attention(norm1(x)) for layer l (q: its pointers), every row's key
   and value written into its caches; the (row, kv group) pairs (their
   RoPE too) shared out among the team once the rows attend over 4,096
   values or more (below that, one thread is quicker than a split) */
static void attention(const step_dims *d, const void *const *q, long l,
                      const step_buf *b, lane *ln) {
    const long E = d->E, H = d->H, G = d->G, D = d->D, m = ln->mc.m;
    for (long r = 0; r < m; ++r)
        rmsnorm(ln->x + r * E, E, q[L_NORM1], d->eps, ln->hin + r * k_max(d));
    mv_qkv(d, q, &ln->mc, ln->hin, b->y[0]);
    long work = 0;
    for (long r = 0; r < m; ++r) work += (b->rw->pos[r] + 1) * H * D;
    const long t = ln->mc.tm.t, nt = ln->mc.tm.nt, P = m * G;
    const int shared = nt > 1 && work >= (1L << 12);
    const long p0 = shared ? P * t / nt : (t ? P : 0);
    const long p1 = shared ? P * (t + 1) / nt : P;
    hook_stall(ln->mc.tm.t, ln->mc.tm.nt);
    for (long pr = p0; pr < p1; ++pr) {
        write_kv_group(d, q, l, b, pr / G, pr % G);
        if (!b->rw->shared)
            attend_kv_group(d, l, b, pr / G, pr % G, pr + 1 < p1 && (pr + 1) % G);
    }
    if (b->rw->shared) { /* every key written before a row of the prompt attends */
        team_barrier(&ln->mc.tm);
        for (long pr = p0; pr < p1; ++pr)
            attend_kv_group(d, l, b, pr / G, pr % G, pr + 1 < p1 && (pr + 1) % G);
    }
    team_barrier(&ln->mc.tm);
    mv1(&ln->mc, b->ctx, H * D, H * D, q[L_WO], q[L_SO], E, b->y[1], y_max(d));
    for (long r = 0; r < m; ++r)
        add_residual(ln->x + r * E, b->y[1] + r * y_max(d), E);
}

/* x += SwiGLU feed-forward(norm2(x)) for layer q; the SwiGLU shared out
   in blocks of 8 of every row */
static void feed_forward(const step_dims *d, const void *const *q,
                         const step_buf *b, lane *ln) {
    const long E = d->E, F = d->F, t = ln->mc.tm.t, nt = ln->mc.tm.nt;
    const long m = ln->mc.m, Y = y_max(d);
    for (long r = 0; r < m; ++r)
        rmsnorm(ln->x + r * E, E, q[L_NORM2], d->eps, ln->hin + r * k_max(d));
    mv_gate_up(d, q, &ln->mc, ln->hin, b->y[0]);
    hook_stall(t, nt);
    const long blocks = m * (F / 8), i0 = blocks * t / nt, i1 = blocks * (t + 1) / nt;
    for (long i = i0; i < i1;) { /* block i: row i / (F / 8) */
        const long r = i / (F / 8), e = (r + 1) * (F / 8) < i1 ? (r + 1) * (F / 8) : i1;
        const uint16_t *y = b->y[0] + r * Y;
        swiglu(y, y + F, (i - r * (F / 8)) * 8, (e - r * (F / 8)) * 8, b->act + r * F);
        i = e;
    }
    team_barrier(&ln->mc.tm);
    mv1(&ln->mc, b->act, F, F, q[L_W3], q[L_S3], E, b->y[1], Y);
    for (long r = 0; r < m; ++r) add_residual(ln->x + r * E, b->y[1] + r * Y, E);
}

/* One thread's part of the step, from the embeddings to the logits */
static void step_thread(const step_dims *d, const void *const *p,
                        const step_buf *b, const mv_ctx *c, uint16_t *logits) {
    lane ln = lane_of(d, b, c);
    const long E = d->E, m = ln.mc.m;
    for (long r = 0; r < m; ++r) embed(d, p, (long)b->rw->token[r], ln.x + r * E);
    for (long l = 0; l < d->L; ++l) {
        const void *const *q = p + G_COUNT + l * L_COUNT;
        attention(d, q, l, b, &ln);
        feed_forward(d, q, b, &ln);
    }
    long k = 0; /* the wanted rows, normed, to the front of hin */
    for (long r = 0; r < m; ++r)
        if (!b->rw->want || b->rw->want[r])
            rmsnorm(ln.x + r * E, E, p[G_FINAL_NORM], d->eps, ln.hin + k++ * k_max(d));
    ln.mc.m = k;
    if (k) mv1(&ln.mc, ln.hin, k_max(d), E, p[G_HEAD], p[G_HEAD_SCALE], d->V, logits, d->V);
}

/* The rows whose logits a step computes */
static long wanted(const step_rows *rw) {
    long k = 0;
    for (long r = 0; r < rw->m; ++r) k += !rw->want || rw->want[r];
    return k;
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

/* The step for the rows rw (see qwen3_decode_rows) */
static int decode_rows(const step_dims *d, const void *const *p, step_rows *rw,
                       const int *kernels, uint16_t *logits, long *next,
                       int threads) {
    step_buf b;
    mv_ctx c;
    if (check_rows(d, rw)) return 1;
    const int bad = read_kernels(kernels, rw->m, &c);
    if (bad) return bad;
    threads = team_size(threads);
    float *mem = alloc_buf(d, p, rw, threads, &b);
    if (!mem) return 2;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
#endif
    step_thread(d, p, &b, &c, logits);
    for (long r = 0; r < wanted(rw); ++r) next[r] = argmax_bf16(logits + r * d->V, d->V);
    free(b.left);
    free(mem);
    return 0;
}

/* Logits (bf16, vocab) for the token *token at position *pos and their
   argmax in *next; its key and value are written into the caches the
   table names first (token and pos are read where the caller's tensors
   hold them: reading them in Python costs two torch calls). The bf16
   products run kernel kernels[0], the int8 ones kernels[1] (indices of
   qwen3_kernels). 0 on success, 1 for bad arguments, 2 when out of
   memory, 3 when the CPU cannot run a kernel named. */
int qwen3_decode_step(const long *dims, double eps_d, const void *const *p,
                      const int64_t *token_at, const int64_t *pos_at,
                      const int *kernels, uint16_t *logits, long *next,
                      int threads) {
    step_dims d;
    if (read_sizes(dims, eps_d, &d) || d.C < 1) return 1;
    const void **cache = malloc((size_t)d.L * 2 * sizeof(void *));
    if (!cache) return 2;
    for (long l = 0; l < d.L; ++l) {
        cache[2 * l] = p[G_COUNT + l * L_COUNT + L_KC];
        cache[2 * l + 1] = p[G_COUNT + l * L_COUNT + L_VC];
    }
    long att_at[1];
    step_rows rw = {1, token_at, pos_at, &d.C, cache, att_at, NULL, 0};
    const int rc = decode_rows(&d, p, &rw, kernels, logits, next, threads);
    free(cache);
    return rc;
}

/* Logits (bf16, rows of vocab) for m rows at once and their argmaxes:
   row r's token tokens[r] at position pos[r] of its cache (slots[r]
   slots; caches[(r * layers + l) * 2] its keys of layer l, + 1 its
   values), each row's bits those it gets alone. Rows of one sequence (a
   prompt: consecutive rows naming the same cache, positions in order) see
   each other's keys, each row then the bits of the decode step that
   would take its token. want: the rows whose logits and argmax are
   computed, in that order (NULL: every row). dims[D_CACHE]: the rows of
   the table's RoPE cos/sin. kernels[2]: the int8_mm kernel. Codes as
   qwen3_decode_step's. */
int qwen3_decode_rows(const long *dims, double eps_d, const void *const *p,
                      long m, const int64_t *tokens, const int64_t *pos,
                      const void *const *caches, const long *slots,
                      const unsigned char *want, const int *kernels,
                      uint16_t *logits, long *next, int threads) {
    step_dims d;
    if (read_sizes(dims, eps_d, &d) || m < 1) return 1;
    long *att_at = malloc((size_t)m * sizeof(long));
    if (!att_at) return 2;
    step_rows rw = {m, tokens, pos, slots, caches, att_at, want, 0};
    const int rc = decode_rows(&d, p, &rw, kernels, logits, next, threads);
    free(att_at);
    return rc;
}

/* The table layout of step_layout.h as text, for the loader:
   "global:EMB,...;layer:NORM1,...;dims:LAYERS,..." (each name ends in ',') */
#define QWEN3_NAME(name) #name ","
const char *qwen3_step_layout(void) {
    return "global:" QWEN3_GLOBAL_SLOTS(QWEN3_NAME)
           ";layer:" QWEN3_LAYER_SLOTS(QWEN3_NAME)
           ";dims:" QWEN3_DIMS(QWEN3_NAME);
}
