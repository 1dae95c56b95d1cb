/*
 * mutex_checker: overlap and fence-order checks over recorded intervals
 * (see mutex_checker.h). Sorting by (resource, start) turns both checks
 * into one pass: an interval overlaps an earlier one exactly when it
 * starts before the furthest end seen so far for its resource.
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

/* "holder 3 (redlockd fence 17) [1200.345, 1300.000] ms" */
static void mc_describe(char *buf, size_t size, const struct mc_interval *iv)
{
    char fence[48] = "";

    if (iv->kind == MC_REDLOCKD)
        snprintf(fence, sizeof(fence), " fence %" PRIu64, iv->fence);
    snprintf(buf, size, "holder %d (%s%s) [%.3f, %.3f] ms", iv->holder,
             mc_kind_name(iv->kind), fence, (double)iv->start / 1000.0,
             (double)iv->end / 1000.0);
}

int mc_check(const struct mc_log *log, struct mc_report *rep)
{
    struct mc_interval *v;
    const struct mc_interval *reach = NULL, *last_fenced = NULL;
    size_t noted = 0;
    char a[160], b[160];

    memset(rep, 0, sizeof(*rep));
    if (log->n == 0)
        return 0;
    v = malloc(log->n * sizeof(*v));
    if (v == NULL)
        return -1;
    memcpy(v, log->v, log->n * sizeof(*v));
    qsort(v, log->n, sizeof(*v), mc_cmp);
    for (size_t i = 0; i < log->n; i++) {
        const struct mc_interval *iv = &v[i];

        if (iv->end <= iv->start) {
            rep->empty++;
            continue;
        }
        /* Sorted by resource first: a new one starts afresh. */
        if (reach != NULL && reach->res != iv->res) {
            reach = NULL;
            last_fenced = NULL;
        }
        rep->intervals++;
        if (reach != NULL && iv->start < reach->end) {
            rep->overlaps++;
            mc_describe(a, sizeof(a), reach);
            mc_describe(b, sizeof(b), iv);
            mc_note(rep, &noted, "overlap on resource %d: %s and %s\n",
                    iv->res, a, b);
        }
        if (iv->kind == MC_REDLOCKD) {
            if (last_fenced != NULL && iv->fence <= last_fenced->fence) {
                rep->fence_violations++;
                mc_describe(a, sizeof(a), last_fenced);
                mc_describe(b, sizeof(b), iv);
                mc_note(rep, &noted, "fence not increasing on resource %d: "
                        "%s then %s\n", iv->res, a, b);
            }
            last_fenced = iv;
        }
        if (reach == NULL || iv->end > reach->end)
            reach = iv;
    }
    if (noted > MC_MSG_MAX) {
        size_t len = strlen(rep->msg);

        snprintf(rep->msg + len, sizeof(rep->msg) - len,
                 "... and %zu more\n", noted - MC_MSG_MAX);
    }
    free(v);
    return 0;
}
