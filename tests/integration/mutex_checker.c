/*
 * mutex_checker: overlap and fence-order checks over recorded intervals
 * (see mutex_checker.h). Sorting by (resource, start) turns both checks
 * into one pass: the intervals an interval can overlap are those of its
 * resource that started before it and have not ended when it starts (the
 * active set, kept as the sweep goes).
 */
#include "mutex_checker.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_MSG_MAX 6        /* violations described in rep->msg */

void mc_log_init(struct mc_log *log)
{
    log->v = NULL;
    log->n = log->cap = 0;
}

void mc_log_deinit(struct mc_log *log)
{
    free(log->v);
    mc_log_init(log);
}

int mc_log_add(struct mc_log *log, const struct mc_interval *iv)
{
    if (log->n == log->cap) {
        size_t cap = log->cap ? log->cap * 2 : 256;
        struct mc_interval *v = realloc(log->v, cap * sizeof(*v));

        if (v == NULL)
            return -1;
        log->v = v;
        log->cap = cap;
    }
    log->v[log->n++] = *iv;
    return 0;
}

static int mc_cmp(const void *a, const void *b)
{
    const struct mc_interval *x = a, *y = b;

    if (x->res != y->res)
        return x->res < y->res ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static const char *mc_kind_name(enum mc_kind k)
{
    return k == MC_PLAIN ? "plain" : "redlockd";
}

static void mc_note(struct mc_report *rep, size_t *noted, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void mc_note(struct mc_report *rep, size_t *noted, const char *fmt, ...)
{
    size_t len = strlen(rep->msg);
    va_list ap;

    if (++*noted > MC_MSG_MAX || len + 1 >= sizeof(rep->msg))
        return;
    va_start(ap, fmt);
    vsnprintf(rep->msg + len, sizeof(rep->msg) - len, fmt, ap);
    va_end(ap);
}

/* "holder 3 (redlockd shared fence 17) [1200.345, 1300.000] ms" */
static void mc_describe(char *buf, size_t size, const struct mc_interval *iv)
{
    char fence[48] = "", how[32] = "";

    if (iv->kind == MC_REDLOCKD)
        snprintf(fence, sizeof(fence), " fence %" PRIu64, iv->fence);
    if (iv->limit > 1)
        snprintf(how, sizeof(how), " slot %d of %d", iv->slot, iv->limit);
    else if (iv->mode == MC_SHARED)
        snprintf(how, sizeof(how), " shared");
    snprintf(buf, size, "holder %d (%s%s%s) [%.3f, %.3f] ms", iv->holder,
             mc_kind_name(iv->kind), how, fence, (double)iv->start / 1000.0,
             (double)iv->end / 1000.0);
}

static bool mc_semaphore(const struct mc_interval *iv)
{
    return iv->limit > 1;
}

/* May a and b hold one resource at the same time? */
static bool mc_compatible(const struct mc_interval *a,
                          const struct mc_interval *b)
{
    if (mc_semaphore(a) != mc_semaphore(b))
        return false;
    if (mc_semaphore(a))
        return a->slot != b->slot;
    return a->mode == MC_SHARED && b->mode == MC_SHARED;
}

/* The fence b must be above, given a before it: exclusive holds follow
 * every hold, shared ones every exclusive one, slots their own slot. */
static bool mc_orders(const struct mc_interval *a, const struct mc_interval *b)
{
    if (a->kind != MC_REDLOCKD || mc_semaphore(a) != mc_semaphore(b))
        return false;
    if (mc_semaphore(a))
        return a->slot == b->slot;
    return a->mode == MC_EXCLUSIVE || b->mode == MC_EXCLUSIVE;
}

int mc_check(const struct mc_log *log, struct mc_report *rep)
{
    struct mc_interval *v;
    size_t *active, nactive = 0, first = 0;
    size_t noted = 0;
    char a[160], b[160];

    memset(rep, 0, sizeof(*rep));
    if (log->n == 0)
        return 0;
    v = malloc(log->n * sizeof(*v));
    active = malloc(log->n * sizeof(*active));
    if (v == NULL || active == NULL) {
        free(v);
        free(active);
        return -1;
    }
    memcpy(v, log->v, log->n * sizeof(*v));
    qsort(v, log->n, sizeof(*v), mc_cmp);
    for (size_t i = 0; i < log->n; i++) {
        const struct mc_interval *iv = &v[i];
        const struct mc_interval *clash = NULL, *before = NULL;
        int same = 0;

        if (iv->end <= iv->start) {
            rep->empty++;
            continue;
        }
        /* Sorted by resource first: a new one starts afresh. */
        if (i > 0 && v[first].res != iv->res) {
            nactive = 0;
            first = i;
        }
        rep->intervals++;
        for (size_t k = 0; k < nactive;) {
            if (v[active[k]].end <= iv->start) {
                active[k] = active[--nactive];
                continue;
            }
            if (!clash && !mc_compatible(&v[active[k]], iv))
                clash = &v[active[k]];
            same += mc_semaphore(&v[active[k]]) && mc_semaphore(iv);
            k++;
        }
        if (clash || (mc_semaphore(iv) && same + 1 > iv->limit)) {
            rep->overlaps++;
            if (clash) {
                mc_describe(a, sizeof(a), clash);
                mc_describe(b, sizeof(b), iv);
                mc_note(rep, &noted, "overlap on resource %d: %s and %s\n",
                        iv->res, a, b);
            } else {
                mc_describe(b, sizeof(b), iv);
                mc_note(rep, &noted, "resource %d: %s makes %d holders of a "
                        "semaphore of %d\n", iv->res, b, same + 1, iv->limit);
            }
        }
        /* The fence: above that of every earlier hold it must follow (the
         * latest-starting one with the largest fence is reported). */
        if (iv->kind == MC_REDLOCKD) {
            for (size_t k = first; k < i; k++) {
                const struct mc_interval *e = &v[k];
                if (e->end <= e->start || !mc_orders(e, iv))
                    continue;
                if (!before || e->fence >= before->fence)
                    before = e;
            }
            if (before && iv->fence <= before->fence) {
                rep->fence_violations++;
                mc_describe(a, sizeof(a), before);
                mc_describe(b, sizeof(b), iv);
                mc_note(rep, &noted, "fence not increasing on resource %d: "
                        "%s then %s\n", iv->res, a, b);
            }
        }
        active[nactive++] = i;
    }
    if (noted > MC_MSG_MAX) {
        size_t len = strlen(rep->msg);

        snprintf(rep->msg + len, sizeof(rep->msg) - len,
                 "... and %zu more\n", noted - MC_MSG_MAX);
    }
    free(active);
    free(v);
    return 0;
}
