/*
 * metrics: the optional HTTP endpoint for monitoring (metrics.listen).
 *
 * A deliberately tiny HTTP/1.x server on the daemon's libuv loop, meant
 * for a Prometheus scraper and a load balancer's health check, not for
 * browsers: one request per connection (the response says
 * "Connection: close"), a request head of at most 8 KiB, 5 s to send it,
 * and at most 64 connections at once. Heads are read by libhttp-parser
 * (metrics_request_*), which needs no socket, so the fuzzer drives the same
 * reader the daemon uses.
 *
 *   GET /metrics  Prometheus text format 0.0.4, built from the stats codec
 *   GET /healthz  200 "ok" while metrics_healthy() says so, else 503
 *   HEAD          the GET response without its body (same headers,
 *                 Content-Length included)
 *
 * Anything else gets 404 (unknown path), 405 (not GET or HEAD), 400 (not
 * HTTP/1.x), 431 (head too large) or 408 (head too slow).
 */
#ifndef REDLOCKD_METRICS_H
#define REDLOCKD_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include <http_parser.h>
#include <uv.h>

#include "sbuf.h"
#include "stats.h"

struct conf_addr;

/* ---- the request reader ------------------------------------------------ */

/* The longest request head served; a longer one is answered 431. */
#define METRICS_HEAD_MAX 8192

/* What a request is answered with, once its head is read. */
enum metrics_answer {
    METRICS_ANSWER_NONE,            /* the head is not complete yet */
    METRICS_ANSWER_METRICS,         /* 200, the exposition */
    METRICS_ANSWER_HEALTHZ,         /* 200 or 503, metrics_healthy() */
    METRICS_ANSWER_NOT_FOUND,       /* 404 */
    METRICS_ANSWER_BAD_METHOD,      /* 405 */
    METRICS_ANSWER_BAD_REQUEST,     /* 400 */
    METRICS_ANSWER_TOO_LARGE,       /* 431 */
};

/* One request head being read. Embedded in a connection (or a fuzzer's
 * frame); no heap, no socket. */
struct metrics_request {
    http_parser parser;
    size_t head_len;                /* bytes taken, at most HEAD_MAX */
    bool headers_done;              /* the parser reached the empty line */
    enum metrics_answer answer;     /* set once the head is decided */
    size_t url_len;
    char url[METRICS_HEAD_MAX];     /* the request target, in pieces as it
                                     * came; it is part of the head */
};

void metrics_request_init(struct metrics_request *r);
/* Read the next len bytes of a connection. Returns how many belong to the
 * head (the rest, a body or a next request, is the caller's to drop), and
 * sets r->answer once the head is complete or cannot be: then later calls
 * take nothing. */
size_t metrics_request_feed(struct metrics_request *r, const char *data,
                            size_t len);
/* HEAD: the response goes out without its body. */
bool metrics_request_is_head(const struct metrics_request *r);

/* A complete response: status line, headers (Content-Type, Content-Length
 * of body, Cache-Control, extra_headers, Connection: close), then the body
 * unless head_only. */
void metrics_format_response(struct sbuf *out, const char *status,
                             const char *ctype, const char *extra_headers,
                             const char *body, size_t bodylen,
                             bool head_only);

/* ---- the exposition ---------------------------------------------------- */

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

/* ---- the server -------------------------------------------------------- */

/* Listen on addr (a TCP address). Returns 0, or -1 after logging why; on
 * -1 nothing stays open once the loop has run the close callbacks. */
int metrics_start(uv_loop_t *loop, const struct conf_addr *addr);
/* Close the listener and every open metrics connection (also safe when
 * metrics_start was never called or failed). Memory is freed by the close
 * callbacks, so the loop must run afterwards. */
void metrics_stop(void);

#endif
