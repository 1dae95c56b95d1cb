/*
 * metrics: the optional monitoring endpoint (metrics.listen): what it
 * serves, and the Prometheus exposition.
 *
 *   GET /metrics  Prometheus text format 0.0.4, built from the stats codec
 *   GET /healthz  200 "ok" while metrics_healthy() says so, else 503
 *                 "no quorum" with the nodes' reasons in an
 *                 X-Redlockd-Why header
 *
 * The serving (accept, the request reader, HEAD, limits, timeouts, the
 * other status codes) is httpd's (httpd.h): metrics hands it these two
 * routes, and builds their bodies from one report's values.
 */
#ifndef REDLOCKD_METRICS_H
#define REDLOCKD_METRICS_H

#include <stddef.h>

#include <uv.h>

#include "sbuf.h"
#include "stats.h"

struct conf_addr;

/* ---- the exposition ---------------------------------------------------- */

/* One set of values for the rows of a table: the struct at base, and the
 * value of the table's instance label (the node's name for the per-node
 * table, the class for the per-class one). */
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

/* ---- the endpoint ------------------------------------------------------ */

/* Serve the routes on addr (a TCP address). Returns 0, or -1 after logging
 * why; on -1 nothing stays open once the loop has run the close
 * callbacks. */
int metrics_start(uv_loop_t *loop, const struct conf_addr *addr);
/* Close the listener and every open metrics connection (also safe when
 * metrics_start was never called or failed). Memory is freed by the close
 * callbacks, so the loop must run afterwards. */
void metrics_stop(void);

#endif
