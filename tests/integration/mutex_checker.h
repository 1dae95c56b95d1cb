/*
 * mutex_checker: the pure half of the mutual-exclusion test (test_mutex.c).
 *
 * The driver records one interval per acquisition: the span during which a
 * holder believed it held a resource, [start, end) on one monotonic clock
 * (microseconds). The checker then says whether any two intervals of one
 * resource overlap where they must not (two shared holds may; up to K
 * holders of a semaphore of K may, each on its own slot), and whether the
 * fences of redlockd grants increase strictly in the order the holders
 * started working (an exclusive hold's above every hold before it, a
 * shared one's above every exclusive one before it, per slot for a
 * semaphore). No sockets, no clock, no globals: tests/unit/test_checker.c
 * feeds it by hand.
 */
#ifndef REDLOCKD_TEST_MUTEX_CHECKER_H
#define REDLOCKD_TEST_MUTEX_CHECKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mc_kind {
    MC_REDLOCKD,        /* granted by a daemon: has a fence */
    MC_PLAIN,           /* a plain Redlock client: no fence */
};

enum mc_mode {
    MC_EXCLUSIVE = 0,   /* excludes every other holder */
    MC_SHARED,          /* excludes exclusive holders only */
};

struct mc_interval {
    int res;            /* resource index */
    int holder;         /* who held it, for messages only */
    enum mc_kind kind;
    uint64_t fence;     /* MC_REDLOCKD only */
    int64_t start;      /* us: the grant was known (OK arrived, quorum seen) */
    int64_t end;        /* us: the holder stopped; end <= start: never held */
    enum mc_mode mode;
    int limit;          /* > 1: one of `limit` slots of a semaphore (mode
                           exclusive); 0 or 1: a plain lock */
    int slot;           /* limit > 1: which */
};

/* A growing array of intervals, owned by the caller. */
struct mc_log {
    struct mc_interval *v;
    size_t n, cap;
};

#define MC_MSG_SIZE 2048    /* the first few violations, described */

struct mc_report {
    size_t intervals;       /* non-empty ones: the holders that worked */
    size_t empty;           /* grants known only after their lease was over */
    size_t overlaps;        /* intervals that start before an earlier one of
                               the same resource has ended, where the two
                               may not hold together (semaphores: on the
                               same slot, or one past `limit` holders) */
    size_t fence_violations;/* redlockd intervals whose fence is not above the
                               fence of an earlier one they must follow */
    char msg[MC_MSG_SIZE];
};

void mc_log_init(struct mc_log *log);
void mc_log_deinit(struct mc_log *log);
/* Returns 0, or -1 when out of memory. */
int mc_log_add(struct mc_log *log, const struct mc_interval *iv);

/*
 * Check every interval of `log` (in any order): overlaps among all kinds,
 * fence order among MC_REDLOCKD ones. Intervals are half-open: one that
 * ends at t and one that starts at t do not overlap. Empty intervals
 * (end <= start) take part in neither check. Returns 0, or -1 when out
 * of memory.
 */
int mc_check(const struct mc_log *log, struct mc_report *rep);

#endif
