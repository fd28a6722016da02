/* One whole decode step in one call (batch 1; see utils/fast/native.py):
   embedding, every layer (RMSNorm, grouped q/k/v, qk-norm, split-halves
   RoPE, cache write, grouped-query attention over the filled slots, output
   projection, SwiGLU) and the head. Values are rounded to bf16 wherever the
   book's bf16 model rounds (every linear output, norm, RoPE, score, softmax,
   SiLU, product and residual add); the float32 sums inside the small
   operations run in their own order, so results are close to the eager
   step's, not bit-equal. Built with -ffp-contract=off: a*b + c*d is two
   rounded products and a rounded sum, as in torch. The pointer table's
   layout is in step_layout.h. */

#include <math.h>
#include <stdlib.h>

#include "matvec.h"
#include "step_layout.h"

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

/* e^x on 8 floats, within about 1 ulp of expf (range reduction by ln 2
   and a degree-6 polynomial; the classic Cephes coefficients): 0 below
   the smallest subnormal, inf above ln(FLT_MAX), NaN stays NaN. torch's own
   vectorised exp is not glibc's expf either; results round to bf16. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-103.972f), hi = _mm256_set1_ps(88.7228f);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* times 2^n as 2^a * 2^b, a = n >> 1, b = n - a: both factors normal
       for n in [-150, 128], so results near overflow or in the subnormal
       range come out right */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 ea = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    const __m256 eb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, ea), eb);

    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline __m256 load_bf16x8(const uint16_t *p) { return bf16x8_natural(p); }

typedef struct {
    int exact, threads;
    float *xbuf;   /* permuted x (bf16 fast kernel) or int16 x (int8) */
} mv_ctx;

/* y (bf16, sum n) = stacked weights @ x (float32, k): bf16 weights when
   s is NULL (the torch-order kernel with exact and k % 64 == 0), else int8
   weights times their row scales s[i]. */
static void mv(const mv_ctx *c, const float *x, long k, int count,
               const void *const *w, const float *const *s, const long *n,
               uint16_t *y) {
    const group g = {count, w, s, n};
    if (s) {
        int8_group(x, &g, y, 0, k, c->threads, (int16_t *)c->xbuf);
    } else if (c->exact && k % 64 == 0) {
        run(rows_bf16_exact, x, &g, y, 0, k, c->threads);
    } else {
        permute16(x, k, c->xbuf);
        run(rows_bf16, c->xbuf, &g, y, 0, k, c->threads);
    }
}

/* The book's RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * scale
   (n % 8 == 0). */
static void rmsnorm(const float *x, long n, const float *scale, float eps,
                    float *out) {
    double ss = 0.0;
    for (long i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (long i = 0; i < n; i += 8)  /* (x * r) * scale, as in torch */
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(
            _mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(scale + i))));
}

/* One head (bf16 values in h, d entries): optional qk-norm, then RoPE at
   the row of cos/sin given; the result rounded to bf16 in out (t: d floats
   of scratch). */
static void norm_rope(const uint16_t *h, long d, const float *scale,
                      float eps, const float *cos, const float *sin,
                      float *t, float *out) {
    for (long i = 0; i < d; ++i) t[i] = from_bf16(h[i]);
    if (scale) rmsnorm(t, d, scale, eps, t);
    const long half = d / 2;
    for (long i = 0; i < d; ++i) {
        const float rot = i < half ? -t[i + half] : t[i - half];
        out[i] = rb(t[i] * cos[i] + rot * sin[i]);
    }
}

static inline float dot_bf16(const float *q, const uint16_t *k, long d) {
    __m256 a = _mm256_setzero_ps();
    for (long i = 0; i < d; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), bf16x8_natural(k + i), a);
    return hsum(a);
}

/* Attention of query head h over cache slots 0..len-1 of its kv group:
   bf16 scores, scaled, softmax, then the weighted sum of the values. */
static void attend_head(const float *q, const uint16_t *kc,
                        const uint16_t *vc, long len, long d, float *w,
                        float *out) {
    const float inv = 1.0f / (float)sqrt((double)d);
    float mx = -INFINITY;
    for (long j = 0; j < len; ++j) {
        w[j] = rb(rb(dot_bf16(q, kc + j * d, d)) * inv);
        mx = w[j] > mx ? w[j] : mx;
    }
    float sum = 0.0f;
    long j = 0;
    for (; j + 8 <= len; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(w + j),
                                            _mm256_set1_ps(mx)));
        _mm256_storeu_ps(w + j, e);
    }
    for (; j < len; ++j) w[j] = expf(w[j] - mx);
    for (j = 0; j < len; ++j) sum += w[j];
    for (j = 0; j < len; ++j) w[j] = rb(w[j] / sum);
    for (long i = 0; i < d; i += 8) {
        __m256 a = _mm256_setzero_ps();
        for (long j = 0; j < len; ++j)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]),
                                bf16x8_natural(vc + j * d + i), a);
        _mm256_storeu_ps(out + i, rb8(a));
    }
}

/* out = bf16(bf16(silu(gate)) * up) on bf16 inputs, n % 8 == 0 */
static void swiglu(const uint16_t *gate, const uint16_t *up, long n,
                   float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long i = 0; i < n; i += 8) {
        const __m256 g = load_bf16x8(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 act = rb8(_mm256_div_ps(g, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, rb8(_mm256_mul_ps(act, load_bf16x8(up + i))));
    }
}

/* x = bf16(x + y) for n (% 8 == 0) bf16 values y */
static void add_residual(float *x, const uint16_t *y, long n) {
    for (long i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, rb8(_mm256_add_ps(_mm256_loadu_ps(x + i),
                                                  load_bf16x8(y + i))));
}

/* torch.argmax over n bf16 values: the first largest, or the first NaN */
static long argmax_bf16(const uint16_t *v, long n) {
    long best = 0;
    float mx = from_bf16(v[0]);
    if (mx != mx) return 0;
    for (long i = 1; i < n; ++i) {
        const float f = from_bf16(v[i]);
        if (f != f) return i;
        if (f > mx) { mx = f; best = i; }
    }
    return best;
}

/* For the tests: y = rb8(x) (op 0) or exp8(x) (op 1) over n % 8 == 0
   floats; 1 for a bad op or n. */
int qwen3_vector_op(int op, const float *x, float *y, long n) {
    if (n % 8 || op < 0 || op > 1) return 1;
    for (long i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, op ? exp8(v) : rb8(v));
    }
    return 0;
}

/* The sizes a step works with (from the dims array) */
typedef struct {
    long L, E, H, G, D, F, V, C;
    float eps;
} step_dims;

/* 0 when the sizes, the token and the position are usable, else 1 */
static int read_dims(const long *dims, double eps_d, long token, long pos,
                     step_dims *d) {
    d->L = dims[D_LAYERS], d->E = dims[D_EMB], d->H = dims[D_HEADS];
    d->G = dims[D_KV], d->D = dims[D_HEAD_DIM], d->F = dims[D_HIDDEN];
    d->V = dims[D_VOCAB], d->C = dims[D_CACHE];
    d->eps = (float)eps_d;
    const long E = d->E, F = d->F, D = d->D, H = d->H, G = d->G;
    return d->L < 1 || E < 16 || E % 16 || F < 16 || F % 16 || D < 16
           || D % 16 || H < 1 || G < 1 || H % G || (H * D) % 16 || d->V < 1
           || d->C < 1 || pos < 0 || pos >= d->C || token < 0
           || token >= d->V;
}

/* The step's scratch memory (one allocation) and this position's RoPE rows */
typedef struct {
    float *x, *hin, *qf, *ctx, *tmp, *att; /* float32 */
    uint16_t *y;                           /* bf16 results of mv */
    mv_ctx mc;
    const float *cos, *sin;
    long pos;
} step_buf;

/* Allocates b's buffers; returns the block to free (NULL: out of memory) */
static float *alloc_buf(const step_dims *d, const void *const *p, long pos,
                        int exact, int threads, step_buf *b) {
    const long E = d->E, F = d->F, H = d->H, G = d->G, D = d->D;
    const long QKV = (H + 2 * G) * D, K_MAX = E > F ? (E > H * D ? E : H * D)
                                                    : (F > H * D ? F : H * D);
    const long Y_MAX = QKV > 2 * F ? QKV : 2 * F;
    const size_t floats = (size_t)(E + K_MAX + 2 * H * D + K_MAX + 16 + D
                                   + H * (pos + 1));
    float *mem = malloc(floats * 4 + (size_t)Y_MAX * 2);
    if (!mem) return NULL;
    b->x = mem, b->hin = b->x + E, b->qf = b->hin + K_MAX;
    b->ctx = b->qf + H * D;
    float *xbuf = b->ctx + H * D;
    b->tmp = xbuf + K_MAX + 16, b->att = b->tmp + D;
    b->y = (uint16_t *)(b->att + H * (pos + 1));
    b->mc = (mv_ctx){exact, threads, xbuf};
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

/* y = w @ x for one matrix (s: its int8 scales, NULL for bf16) */
static void mv1(const mv_ctx *c, const float *x, long k, const void *w,
                const float *s, long n, uint16_t *y) {
    const void *ws[1] = {w};
    const float *ss[1] = {s};
    const long ns[1] = {n};
    mv(c, x, k, 1, ws, s ? ss : NULL, ns, y);
}

/* x += attention(norm1(x)) for layer q, its key and value written into
   the caches at b->pos */
static void attention(const step_dims *d, const void *const *q,
                      step_buf *b) {
    const long E = d->E, H = d->H, G = d->G, D = d->D, C = d->C;
    const long pos = b->pos, r = H / G, len = pos + 1;
    const float *qn = q[L_QNORM], *kn = q[L_KNORM];
    uint16_t *kc = (uint16_t *)q[L_KC], *vc = (uint16_t *)q[L_VC];
    uint16_t *y = b->y;
    rmsnorm(b->x, E, q[L_NORM1], d->eps, b->hin);
    {
        const void *w[3] = {q[L_WQ], q[L_WK], q[L_WV]};
        const float *s[3] = {q[L_SQ], q[L_SK], q[L_SV]};
        const long n[3] = {H * D, G * D, G * D};
        mv(&b->mc, b->hin, E, 3, w, s[0] ? s : NULL, n, y);
    }
    for (long h = 0; h < H; ++h)
        norm_rope(y + h * D, D, qn, d->eps, b->cos, b->sin, b->tmp,
                  b->qf + h * D);
    for (long g = 0; g < G; ++g) {
        norm_rope(y + (H + g) * D, D, kn, d->eps, b->cos, b->sin, b->tmp,
                  b->ctx);
        uint16_t *kslot = kc + (g * C + pos) * D;
        for (long i = 0; i < D; ++i) kslot[i] = to_bf16(b->ctx[i]);
        memcpy(vc + (g * C + pos) * D, y + (H + G + g) * D, (size_t)D * 2);
    }
    const int threads = b->mc.threads;
#ifdef _OPENMP
    #pragma omp parallel for num_threads(threads) schedule(static) \
        if (threads > 1 && len * H * D >= (1L << 16))
#else
    (void)threads;
#endif
    for (long h = 0; h < H; ++h)
        attend_head(b->qf + h * D, kc + (h / r) * C * D,
                    vc + (h / r) * C * D, len, D, b->att + h * len,
                    b->ctx + h * D);
    mv1(&b->mc, b->ctx, H * D, q[L_WO], q[L_SO], E, y);
    add_residual(b->x, y, E);
}

/* x += SwiGLU feed-forward(norm2(x)) for layer q */
static void feed_forward(const step_dims *d, const void *const *q,
                         step_buf *b) {
    const long E = d->E, F = d->F;
    rmsnorm(b->x, E, q[L_NORM2], d->eps, b->hin);
    {
        const void *w[2] = {q[L_W1], q[L_W2]};
        const float *s[2] = {q[L_S1], q[L_S2]};
        const long n[2] = {F, F};
        mv(&b->mc, b->hin, E, 2, w, s[0] ? s : NULL, n, b->y);
    }
    swiglu(b->y, b->y + F, F, b->hin);
    mv1(&b->mc, b->hin, F, q[L_W3], q[L_S3], E, b->y);
    add_residual(b->x, b->y, E);
}

/* Logits (bf16, vocab) for `token` at position `pos` and their argmax in
   *next; its key and value are written into the caches first. 0 on
   success, 1 for bad arguments, 2 when out of memory. */
int qwen3_decode_step(const long *dims, double eps_d, const void *const *p,
                      long token, long pos, int exact, uint16_t *logits,
                      long *next, int threads) {
    step_dims d;
    step_buf b;
    if (read_dims(dims, eps_d, token, pos, &d)) return 1;
    float *mem = alloc_buf(&d, p, pos, exact, threads, &b);
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

/* The table layout of step_layout.h as text, for the loader:
   "global:EMB,...;layer:NORM1,...;dims:LAYERS,..." (each name ends in ',') */
#define QWEN3_NAME(name) #name ","
const char *qwen3_step_layout(void) {
    return "global:" QWEN3_GLOBAL_SLOTS(QWEN3_NAME)
           ";layer:" QWEN3_LAYER_SLOTS(QWEN3_NAME)
           ";dims:" QWEN3_DIMS(QWEN3_NAME);
}
