/* Threads and scheduling (team.c): a product's rows shared out between
   threads, a thread that finishes early taking passes from the back of
   another's share, and the barriers of a decode step's team. */
#ifndef QWEN3_TEAM_H
#define QWEN3_TEAM_H

#include "kernels.h"

/* The passes of one piece of a product not yet taken: front << 32 | back,
   on a cache line of its own */
typedef struct {
    uint64_t left;
    char pad[56];
} passes_left;

/* A parallel region's threads running a sequence of products together
   (decode_step.c): thread t of nt, the team's shared passes-left words
   (TEAM_COUNT per thread) and TEAM_SYNC words of its own (sync; all zero
   before the first product): two that say which product the passes-left
   words were last filled for, and the barrier's (team_barrier); and this
   thread's count of the products it has joined */
#define TEAM_COUNT 3
#define TEAM_SYNC 5
typedef struct {
    passes_left *left, *sync;
    long seq;
    int t, nt;
} team;

/* `words` passes-left words, 64-byte aligned and zero; NULL when out of
   memory */
passes_left *team_words(size_t words);
/* 1 for a group of no matrices or a negative row count */
int bad_group(int count, const long *n);
/* All rows of a group, split over `threads` threads in a parallel region
   of its own */
int run(const row_kernel *rk, const float *xv, const group *g, void *y,
        int y_f32, long k, int threads);
/* The int8 product of a group with the 16-bit row kernel `rows` (qx:
   scratch of k int16 + one float); float32 rows_i8 if x holds inf or NaN */
void int8_group(const float *xn, const group *g, void *y, int y_f32, long k,
                int threads, int16_t *qx, const row_kernel *rows);
/* Inside a team's parallel region: the calling thread's share of a
   group's product, then a barrier; every thread of the team calls it with
   the same arguments, and on return y is complete */
void team_product(const row_kernel *rk, const float *xv, const group *g,
                  void *y, int y_f32, long k, team *tm);
/* int8_group as a team_product (qx: this thread's own scratch) */
void team_int8_group(const float *xn, const group *g, void *y, int y_f32,
                     long k, int16_t *qx, const row_kernel *rows, team *tm);
/* Waits for every thread of the team (no-op for a team of one). A thread
   that waits spins for a few microseconds, then sleeps until the last one
   arrives: on a machine busy with other work, a peer the OS has
   descheduled then gets the waiting thread's core instead of a spinning
   thread keeping it for a whole time slice. */
void team_barrier(team *tm);

/* The scheduler's hooks in a build with -DQWEN3_HOOKS and a source that
   defines them (utils/fast/build.py's Extra): a count of the passes taken
   from another thread's share, a delay of the last thread; else nothing */
#ifdef QWEN3_HOOKS
void hook_count_stolen(long passes);
void hook_stall(int t, int nt);
#else
#define hook_count_stolen(passes) ((void)0)
#define hook_stall(t, nt) ((void)0)
#endif

#endif
