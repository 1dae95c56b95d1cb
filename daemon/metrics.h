/*
 * metrics: the optional HTTP endpoint for monitoring (metrics.listen).
 *
 * A deliberately tiny HTTP/1.x server on the daemon's libuv loop, meant
 * for a Prometheus scraper and a load balancer's health check, not for
 * browsers: one request per connection (the response says
 * "Connection: close"), a request head of at most 8 KiB, 5 s to send it,
 * and at most 64 connections at once.
 *
 *   GET /metrics  Prometheus text format 0.0.4, built from the stats codec
 *   GET /healthz  200 "ok" while a quorum of Redis nodes votes, else 503
 *
 * Anything else gets 404 (unknown path), 405 (not GET), 400 (not HTTP),
 * 431 (head too large) or 408 (head too slow).
 */
#ifndef REDLOCKD_METRICS_H
#define REDLOCKD_METRICS_H

#include <uv.h>

#include "sbuf.h"
#include "stats.h"

struct conf_addr;

/* One set of values for the rows of a table: the struct at base, and the
 * value of the table's instance label (the node's name for the per-node
 * table). */
struct metrics_instance {
    const void *base;
    const char *label_value;
};

/* The families of t: per row, # HELP and # TYPE, then the row's samples
 * for every instance, labelled label="..." when label is not NULL. */
void metrics_format_table(struct sbuf *b, const struct stats_table *t,
                          const char *label,
                          const struct metrics_instance *inst, size_t n);
/* The /metrics body for one report's values. */
void metrics_format(struct sbuf *b, const struct stats_values *v);

/* Listen on addr (a TCP address). Returns 0, or -1 after logging why; on
 * -1 nothing stays open once the loop has run the close callbacks. */
int metrics_start(uv_loop_t *loop, const struct conf_addr *addr);
/* Close the listener and every open metrics connection (also safe when
 * metrics_start was never called or failed). Memory is freed by the close
 * callbacks, so the loop must run afterwards. */
void metrics_stop(void);

#endif
