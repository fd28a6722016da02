/* Threads and scheduling for the products (see team.h).

   A product split over threads: thread u owns the stacked rows
   [n*u/T, n*(u+1)/T), a piece of each matrix they touch. The passes of a
   piece not yet taken are [front, back), one 64-bit word on its own cache
   line: the owner takes `claim` passes at a time from the front, so its
   sections stream on; a thread with nothing left of its own takes half of
   what remains (at least `claim`) from the back of the others' pieces. A
   core slowed by its neighbours then no longer holds up the other at the
   end of each product. Every pass is computed by one call, the same way
   whoever makes it (see rows_fn), so the results are the same bits. */

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "team.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef _OPENMP
/* from omp.h, declared here so no OpenMP headers are needed */
int omp_get_thread_num(void);
int omp_get_num_threads(void);
#endif

typedef struct {
    const row_kernel *rk;
    const float *x;
    const group *g;
    void *y;
    int y_f32, threads;
    long k, n, claim;
    passes_left *left; /* [threads][stride], matrix i of piece u at u*stride+i */
    int stride;
} product;

/* How much of the owner's work a whole product reads per take */
#define CLAIM_BYTES (128L * 1024)

/* Rows [*a, *b) of matrix i that thread u owns, and the row of the stacked
   output where matrix i starts; 0 when u owns none of it */
static int piece(const product *p, int u, int i, long *a, long *b,
                 long *base) {
    *base = 0;
    for (int m = 0; m < i; ++m) *base += p->g->n[m];
    const long lo = p->n * u / p->threads, hi = p->n * (u + 1) / p->threads;
    *a = lo > *base ? lo - *base : 0;
    *b = hi - *base < p->g->n[i] ? hi - *base : p->g->n[i];
    return *a < *b;
}

#ifdef _OPENMP
/* Takes passes of a piece: up to `want` from the front, or (back) half of
   what is left but at least `want`; their count (0: none left), the first
   in *j0 */
static long take(uint64_t *left, long want, int back, long *j0) {
    uint64_t old = __atomic_load_n(left, __ATOMIC_RELAXED), now;
    long m;
    do {
        const long f = (long)(old >> 32), b = (long)(old & 0xffffffffu);
        if (f >= b) return 0;
        m = back && (b - f) / 2 > want ? (b - f) / 2 : want;
        m = m < b - f ? m : b - f;
        *j0 = back ? b - m : f;
        now = back ? (old & ~0xffffffffull) | (uint64_t)(b - m)
                   : (uint64_t)(f + m) << 32 | (uint64_t)b;
    } while (!__atomic_compare_exchange_n(left, &old, now, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    if (back) hook_count_stolen(m);
    return m;
}

/* Everything left of thread u's piece of matrix i (back: taken from the
   back, by a thread that finished its own) */
static void work(const product *p, int u, int i, int back) {
    long a, b, base, j0, m;
    if (!piece(p, u, i, &a, &b, &base)) return;
    const group *g = p->g;
    char *y = (char *)p->y + (size_t)base * (p->y_f32 ? 4 : 2);
    uint64_t *left = &p->left[u * p->stride + i].left;
    while ((m = take(left, p->claim, back, &j0)))
        p->rk->fn(p->x, g->w[i], g->scales ? g->scales[i] : NULL, y, p->y_f32,
                  a, b, p->k, j0, j0 + m);
}

/* Thread t of nt: its own pieces front to back, then the others' from
   their backs */
static void share(const product *p, int t, int nt) {
    const int count = p->g->count;
    for (int u = t; u < p->threads; u += nt)
        for (int i = 0; i < count; ++i) work(p, u, i, 0);
    for (int v = 1; v < p->threads; ++v)
        for (int i = count - 1; i >= 0; --i)
            work(p, (t + v) % p->threads, i, 1);
}
#endif

/* Piece u's passes-left words: every piece whole */
static void fill(const product *p, int u) {
    for (int i = 0; i < p->g->count; ++i) {
        long a, b, base;
        const int any = piece(p, u, i, &a, &b, &base);
        __atomic_store_n(&p->left[u * p->stride + i].left,
                         any ? (uint64_t)pass_count(b - a, p->rk->sections) : 0,
                         __ATOMIC_RELAXED);
    }
}

/* How many passes the owner takes at a time (see CLAIM_BYTES) */
static long claim_passes(const product *p) {
    const long row_bytes = p->k * (p->g->scales ? 1 : 2) * p->rk->sections;
    return CLAIM_BYTES / row_bytes > 1 ? CLAIM_BYTES / row_bytes : 1;
}

/* p's passes-left words, all pieces whole; 0 when out of memory */
static int split(product *p) {
    p->stride = p->g->count;
    p->left = team_words((size_t)p->threads * p->stride);
    if (!p->left) return 0;
    for (int u = 0; u < p->threads; ++u) fill(p, u);
    p->claim = claim_passes(p);
    return 1;
}

passes_left *team_words(size_t words) {
    passes_left *w = aligned_alloc(64, sizeof(passes_left) * words);
    if (w) memset(w, 0, sizeof(passes_left) * words);
    return w;
}

int bad_group(int count, const long *n) {
    if (count < 1) return 1;
    for (int i = 0; i < count; ++i)
        if (n[i] < 0) return 1;
    return 0;
}

/* Every row of a group on the calling thread */
static void alone(const row_kernel *rk, const float *xv, const group *g,
                  void *y, int y_f32, long k) {
    const size_t esize = y_f32 ? 4 : 2;
    char *out = y;
    for (int i = 0; i < g->count; out += (size_t)g->n[i] * esize, ++i)
        rk->fn(xv, g->w[i], g->scales ? g->scales[i] : NULL, out, y_f32, 0,
               g->n[i], k, 0, pass_count(g->n[i], rk->sections));
}

/* Too small to be worth a second thread, or too many rows for the
   passes-left words */
static int one_thread(long n, long k) { return n * k < (1L << 16) || n >= (1L << 31); }

int run(const row_kernel *rk, const float *xv, const group *g, void *y,
        int y_f32, long k, int threads) {
    product p = {rk, xv, g, y, y_f32, threads, k, 0, 0, NULL, 0};
    for (int i = 0; i < g->count; ++i) p.n += g->n[i];
    if (threads < 1 || one_thread(p.n, k)) p.threads = 1;
#ifndef _OPENMP
    p.threads = 1; /* built without OpenMP: one thread */
#endif
    if (p.threads > 1 && !split(&p)) p.threads = 1;
    if (p.threads == 1) {
        alone(rk, xv, g, y, y_f32, k);
        return 0;
    }
#ifdef _OPENMP
    #pragma omp parallel num_threads(p.threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        hook_stall(t, nt);
        share(&p, t, nt);
    }
#endif
    free(p.left);
    return 0;
}

/* A waiting thread spins this long, then sleeps: far above a wait when
   every thread has a core, far below the OS's time slice, which a spinning
   thread would keep from a descheduled peer */
#define SPIN_NS 50000L

/* Whether *w still equals v after spinning SPIN_NS (the clock read every
   64 pauses: a pause's length differs between CPUs) */
static int still_after_spin(const uint32_t *w, uint32_t v) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 1;; ++i, cpu_relax()) {
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) != v) return 0;
        if (i % 64) continue;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec > SPIN_NS)
            return 1;
    }
}

/* A generation barrier over the words sync[2] (threads arrived), sync[3]
   (the generation: a futex on Linux, elsewhere a yield) and sync[4]
   (threads asleep). The last to arrive resets the count, then moves the
   generation on. Sleepers and generation are read and written in one
   total order (seq_cst): the last thread sees a sleeper and wakes it, or
   the sleeper sees the new generation and does not sleep. */
void team_barrier(team *tm) {
    if (tm->nt < 2) return;
    uint64_t *arrived = &tm->sync[2].left, *sleepers = &tm->sync[4].left;
    uint32_t *gen = (uint32_t *)(void *)&tm->sync[3].left;
    const uint32_t g = __atomic_load_n(gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(arrived, 1, __ATOMIC_ACQ_REL) == (uint64_t)tm->nt) {
        __atomic_store_n(arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(gen, g + 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
        if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
    } else if (still_after_spin(gen, g)) {
        __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(gen, __ATOMIC_SEQ_CST) == g)
#ifdef __linux__
            syscall(SYS_futex, gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
#else
            sched_yield();
#endif
        __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    }
}

#ifdef _OPENMP
/* The first thread of the team to reach product number seq fills every
   piece's words, then marks them ready; the others wait for that (a
   fill takes well under a microsecond), so none starts on words not yet
   filled, which would only cost balance: until filled, a piece's words
   are used up (every product uses up all of them, and the step zeroes
   them first), so a thread that reads them takes nothing. A thread that
   arrives late finds its piece already being taken from the back. */
static void fill_once(const product *p, passes_left *sync, long seq) {
    uint64_t *claimed = &sync[0].left, *ready = &sync[1].left;
    uint64_t c = __atomic_load_n(claimed, __ATOMIC_RELAXED);
    if (c < (uint64_t)seq
        && __atomic_compare_exchange_n(claimed, &c, (uint64_t)seq, 0,
                                       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        for (int u = 0; u < p->threads; ++u) fill(p, u);
        __atomic_store_n(ready, (uint64_t)seq, __ATOMIC_RELEASE);
        return;
    }
    /* the filler may be descheduled inside its sub-microsecond fill: then
       this thread gives its core up now and then */
    for (long i = 1; __atomic_load_n(ready, __ATOMIC_ACQUIRE) < (uint64_t)seq; ++i)
        if (i % 1024) cpu_relax();
        else sched_yield();
}
#endif

/* Every thread counts its products in tm->seq, so all agree which product
   is which; a thread late to the next product (hook_stall) is still
   inside the barrier's guarantees */
void team_product(const row_kernel *rk, const float *xv, const group *g,
                  void *y, int y_f32, long k, team *tm) {
    product p = {rk, xv, g, y, y_f32, tm->nt, k, 0, 0, tm->left, TEAM_COUNT};
    for (int i = 0; i < g->count; ++i) p.n += g->n[i];
    ++tm->seq;
    if (tm->nt == 1 || one_thread(p.n, k)) {
        if (tm->t == 0) alone(rk, xv, g, y, y_f32, k);
    } else {
#ifdef _OPENMP
        fill_once(&p, tm->sync, tm->seq);
        p.claim = claim_passes(&p);
        share(&p, tm->t, tm->nt);
#endif
    }
    team_barrier(tm);
    hook_stall(tm->t, tm->nt); /* late to read y and to the next product */
}

void int8_group(const float *xn, const group *g, void *y, int y_f32, long k,
                int threads, int16_t *qx, const row_kernel *rows) {
    static const row_kernel ROWS_I8 = {rows_i8, 4};
    if (quantize_x(xn, k, qx)) run(rows, (const float *)qx, g, y, y_f32, k, threads);
    else run(&ROWS_I8, xn, g, y, y_f32, k, threads);
}

/* every thread rounds x into its own qx, the same bits, so all take the
   same kernel */
void team_int8_group(const float *xn, const group *g, void *y, int y_f32,
                     long k, int16_t *qx, const row_kernel *rows, team *tm) {
    static const row_kernel ROWS_I8 = {rows_i8, 4};
    if (quantize_x(xn, k, qx)) team_product(rows, (const float *)qx, g, y, y_f32, k, tm);
    else team_product(&ROWS_I8, xn, g, y, y_f32, k, tm);
}
