/*
 * httpd: the daemon's tiny HTTP/1.x server, for the metrics endpoint.
 *
 * Serving only: accept, read a request head, answer it, close. What is
 * served is the owner's: a table of routes (an exact path and a function
 * that fills the reply), so nothing here knows /metrics or stats
 * (metrics.c holds both the routes and the exposition). It runs on the
 * daemon's libuv loop and is meant for a Prometheus scraper and a load
 * balancer's health check, not for browsers:
 *
 *   - one request per connection (every response says "Connection:
 *     close"), GET or HEAD (HEAD: the GET response without its body, same
 *     headers, Content-Length included);
 *   - a request head of at most HTTPD_HEAD_MAX bytes, HTTPD_TIMEOUT_MS to
 *     send it (and as long again to read the response), at most
 *     HTTPD_MAX_CONNS connections at once (more are accepted and closed);
 *   - anything else gets 404 (no route's path), 405 (not GET or HEAD),
 *     400 (not HTTP/1.x), 431 (head too large) or 408 (head too slow).
 *
 * Heads are read by libhttp-parser (httpd_request_*), which needs no
 * socket, so the fuzzer (tests/fuzz/fuzz_http.c) and the unit tests drive
 * the same reader the server uses.
 */
#ifndef REDLOCKD_HTTPD_H
#define REDLOCKD_HTTPD_H

#include <stdbool.h>
#include <stddef.h>

#include <http_parser.h>
#include <uv.h>

#include "sbuf.h"

/* The longest request head served; a longer one is answered 431. */
#define HTTPD_HEAD_MAX 8192
/* To send a request head, and then to read the response. */
#define HTTPD_TIMEOUT_MS 5000
#define HTTPD_MAX_CONNS 64

/* ---- routes ------------------------------------------------------------ */

/* What a route answers. The server sets status "200 OK", a plain text
 * content type and empty buffers before calling the route. */
struct httpd_reply {
    const char *status;         /* the status line's code and reason */
    const char *ctype;          /* Content-Type */
    struct sbuf headers;        /* more header lines, each ending "\r\n" */
    struct sbuf body;           /* (HEAD too: its length is sent) */
};

typedef void httpd_serve_fn(struct httpd_reply *reply);

struct httpd_route {
    const char *path;           /* matched exactly, query and fragment
                                 * left out */
    httpd_serve_fn *serve;
};

/* ---- the request reader ------------------------------------------------ */

/* What a request is answered with, once its head is read. */
enum httpd_answer {
    HTTPD_ANSWER_NONE,          /* the head is not complete yet */
    HTTPD_ANSWER_ROUTE,         /* GET or HEAD of routes[route].path */
    HTTPD_ANSWER_NOT_FOUND,     /* 404 */
    HTTPD_ANSWER_BAD_METHOD,    /* 405 */
    HTTPD_ANSWER_BAD_REQUEST,   /* 400 */
    HTTPD_ANSWER_TOO_LARGE,     /* 431 */
};

/* One request head being read. Embedded in a connection (or a fuzzer's
 * frame); no heap, no socket. */
struct httpd_request {
    http_parser parser;
    const struct httpd_route *routes;   /* (not owned) */
    size_t nroutes;
    size_t route;                   /* which, when answer is ROUTE */
    size_t head_len;                /* bytes taken, at most HEAD_MAX */
    bool headers_done;              /* the parser reached the empty line */
    enum httpd_answer answer;       /* set once the head is decided */
    size_t url_len;
    char url[HTTPD_HEAD_MAX];       /* the request target, in pieces as it
                                     * came; it is part of the head */
};

void httpd_request_init(struct httpd_request *r,
                        const struct httpd_route *routes, size_t nroutes);
/* Read the next len bytes of a connection. Returns how many belong to the
 * head (the rest, a body or a next request, is the caller's to drop), and
 * sets r->answer once the head is complete or cannot be: then later calls
 * take nothing. */
size_t httpd_request_feed(struct httpd_request *r, const char *data,
                          size_t len);
/* HEAD: the response goes out without its body. */
bool httpd_request_is_head(const struct httpd_request *r);

/* A complete response: status line, headers (Content-Type, Content-Length
 * of body, Cache-Control, extra_headers, Connection: close), then the body
 * unless head_only. */
void httpd_format_response(struct sbuf *out, const char *status,
                           const char *ctype, const char *extra_headers,
                           const char *body, size_t bodylen, bool head_only);

/* ---- the server -------------------------------------------------------- */

struct httpd;

/*
 * Serve routes (kept, not copied: they must outlive the server) on a TCP
 * listener bound to sa. name starts the server's log lines. Returns 0 and
 * the server in *out, or the libuv error of the bind or the listen: then
 * nothing stays open once the loop has run the close callbacks.
 */
int httpd_create(struct httpd **out, uv_loop_t *loop,
                 const struct sockaddr *sa, const char *name,
                 const struct httpd_route *routes, size_t nroutes);
/* Close the listener and every open connection. Memory is freed by the
 * close callbacks, so the loop must run afterwards. */
void httpd_destroy(struct httpd *h);

#endif
