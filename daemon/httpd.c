/*
 * httpd: see httpd.h.
 *
 * Each connection feeds what it reads to a struct httpd_request, which
 * runs libhttp-parser over the head (at most HTTPD_HEAD_MAX bytes) and
 * keeps only the request target; the connection then answers with a
 * complete response (Content-Length and "Connection: close"), half-closes
 * and discards whatever the client still sends until it closes too, for at
 * most HTTPD_LINGER_MS. Closing at once with unread input in the kernel
 * would send an RST, and an RST can destroy the response before the client
 * has read it (the case of an oversized head answered with 431).
 *
 * A connection (struct hconn) owns one handle, its socket, and one
 * deadline, a struct timer (the head's, then the write's and the
 * linger's); it is on its server's list until it starts closing and is
 * freed in the socket's close callback. The server is freed in its
 * listener's close callback; a connection never reaches its server once
 * it is closing, so the two may close in any order.
 */
#include "httpd.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "timer.h"

#define HTTPD_LINGER_MS 1000
#define HTTPD_BACKLOG 64
/* One read's worth: heads are copied out of it (the target only), and
 * what follows a head is read into it to be dropped. */
#define HTTPD_READ_SIZE 4096

#define HTTPD_CTYPE_TEXT "text/plain; charset=utf-8"

/* The 431 body names the limit. */
static_assert(HTTPD_HEAD_MAX == 8 * 1024, "the 431 body says 8 KiB");

struct httpd {
    uv_tcp_t listener;
    const char *name;               /* for the log */
    const struct httpd_route *routes;
    size_t nroutes;
    struct list conns;              /* struct hconn (link), open ones */
    unsigned nconns;
};

enum hconn_state {
    HCONN_READING,      /* collecting the request head */
    HCONN_WRITING,      /* the response is being written */
    HCONN_DRAINING,     /* response sent, FIN sent: discard input until EOF */
    HCONN_CLOSING,      /* uv_close called */
};

struct hconn {
    uv_tcp_t tcp;
    struct timer timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    struct httpd *srv;      /* only while not closing */
    struct list link;       /* in srv->conns */
    enum hconn_state state;
    bool peer_eof;          /* the client half-closed before we answered */
    struct sbuf out;        /* (owned) the response, alive until written */
    struct httpd_request req;
};

/* ---- the request reader ------------------------------------------------ */

static int httpd_on_url(http_parser *p, const char *at, size_t len)
{
    struct httpd_request *r = p->data;

    /* The target is part of the head, which feed caps at url's size. */
    if (len > sizeof(r->url) - r->url_len)
        return 1;
    memcpy(r->url + r->url_len, at, len);
    r->url_len += len;
    return 0;
}

/* The head ends here: stop, whatever body the request announces. */
static int httpd_on_headers_complete(http_parser *p)
{
    struct httpd_request *r = p->data;

    r->headers_done = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings httpd_parser_settings = {
    .on_url = httpd_on_url,
    .on_headers_complete = httpd_on_headers_complete,
};

/* The path of the target (origin form "/metrics?x" or absolute form
 * "http://host/metrics"), or false when the target is not a URL. */
static bool httpd_request_path(const struct httpd_request *r,
                               const char **path, size_t *len)
{
    struct http_parser_url u;

    http_parser_url_init(&u);
    if (http_parser_parse_url(r->url, r->url_len, 0, &u) != 0 ||
        !(u.field_set & (1u << UF_PATH)))
        return false;
    *path = r->url + u.field_data[UF_PATH].off;
    *len = u.field_data[UF_PATH].len;
    return true;
}

/* A complete head: what its request line asks for. Header fields are
 * parsed (to find the end of the head) and ignored. */
static enum httpd_answer httpd_request_route(struct httpd_request *r)
{
    const char *path;
    size_t len;

    if (r->parser.http_major != 1 || !httpd_request_path(r, &path, &len))
        return HTTPD_ANSWER_BAD_REQUEST;
    if (r->parser.method != HTTP_GET && r->parser.method != HTTP_HEAD)
        return HTTPD_ANSWER_BAD_METHOD;
    for (size_t i = 0; i < r->nroutes; i++) {
        const char *want = r->routes[i].path;

        if (len == strlen(want) && memcmp(path, want, len) == 0) {
            r->route = i;
            return HTTPD_ANSWER_ROUTE;
        }
    }
    return HTTPD_ANSWER_NOT_FOUND;
}

void httpd_request_init(struct httpd_request *r,
                        const struct httpd_route *routes, size_t nroutes)
{
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
    r->routes = routes;
    r->nroutes = nroutes;
    r->route = 0;
    r->head_len = 0;
    r->headers_done = false;
    r->answer = HTTPD_ANSWER_NONE;
    r->url_len = 0;
}

size_t httpd_request_feed(struct httpd_request *r, const char *data,
                          size_t len)
{
    size_t room = HTTPD_HEAD_MAX - r->head_len;
    size_t n = len < room ? len : room;
    size_t used;

    /* A length of 0 would tell the parser the stream ended. */
    if (r->answer != HTTPD_ANSWER_NONE || n == 0)
        return 0;
    used = http_parser_execute(&r->parser, &httpd_parser_settings, data, n);
    r->head_len += used;
    if (r->headers_done)
        r->answer = httpd_request_route(r);
    else if (HTTP_PARSER_ERRNO(&r->parser) != HPE_OK)
        r->answer = HTTPD_ANSWER_BAD_REQUEST;
    else if (r->head_len == HTTPD_HEAD_MAX)
        r->answer = HTTPD_ANSWER_TOO_LARGE;
    return used;
}

bool httpd_request_is_head(const struct httpd_request *r)
{
    return r->headers_done && r->parser.method == HTTP_HEAD;
}

void httpd_format_response(struct sbuf *out, const char *status,
                           const char *ctype, const char *extra_headers,
                           const char *body, size_t bodylen, bool head_only)
{
    sbuf_printf(out, "HTTP/1.1 %s\r\n"
                "Content-Type: %s\r\n"
                "Content-Length: %zu\r\n"
                "Cache-Control: no-store\r\n"
                "%s"
                "Connection: close\r\n"
                "\r\n", status, ctype, bodylen, extra_headers);
    if (!head_only)
        sbuf_append(out, body, bodylen);
}

/* ---- connections ------------------------------------------------------- */

static void hconn_on_close(uv_handle_t *h)
{
    struct hconn *c = h->data;

    sbuf_deinit(&c->out);
    free(c);
}

static void hconn_close(struct hconn *c)
{
    if (c->state == HCONN_CLOSING)
        return;
    c->state = HCONN_CLOSING;
    list_remove(&c->link);
    c->srv->nconns--;
    c->srv = NULL;
    timer_stop(&c->timer);
    /* A write or shutdown still pending is cancelled by the close; its
     * callback runs before the close callback, so c is still there. */
    uv_close((uv_handle_t *)&c->tcp, hconn_on_close);
}

static void hconn_on_shutdown(uv_shutdown_t *req, int status)
{
    struct hconn *c = req->data;

    if (status < 0)
        hconn_close(c);     /* no-op when the close cancelled it */
}

static void hconn_on_write(uv_write_t *req, int status)
{
    struct hconn *c = req->data;

    if (c->state == HCONN_CLOSING)
        return;
    if (status < 0 || c->peer_eof) {
        hconn_close(c);
        return;
    }
    c->state = HCONN_DRAINING;
    timer_start(&c->timer, HTTPD_LINGER_MS);
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, hconn_on_shutdown) != 0)
        hconn_close(c);
}

static void hconn_respond(struct hconn *c, const char *status,
                          const char *ctype, const char *extra_headers,
                          const char *body, size_t bodylen)
{
    uv_buf_t buf;

    httpd_format_response(&c->out, status, ctype, extra_headers, body,
                          bodylen, httpd_request_is_head(&c->req));
    c->state = HCONN_WRITING;
    /* The same deadline again, now for a client that does not read. */
    timer_start(&c->timer, HTTPD_TIMEOUT_MS);
    buf = uv_buf_init(c->out.data, (unsigned)c->out.len);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &buf, 1,
                 hconn_on_write) != 0)
        hconn_close(c);
}

static void hconn_respond_text(struct hconn *c, const char *status,
                               const char *extra_headers, const char *body)
{
    hconn_respond(c, status, HTTPD_CTYPE_TEXT, extra_headers, body,
                  strlen(body));
}

static void hconn_serve(struct hconn *c, const struct httpd_route *route)
{
    struct httpd_reply reply = {
        "200 OK", HTTPD_CTYPE_TEXT, SBUF_INIT, SBUF_INIT,
    };

    route->serve(&reply);
    hconn_respond(c, reply.status, reply.ctype, sbuf_cstr(&reply.headers),
                  sbuf_cstr(&reply.body), reply.body.len);
    sbuf_deinit(&reply.headers);
    sbuf_deinit(&reply.body);
}

static void hconn_dispatch(struct hconn *c)
{
    switch (c->req.answer) {
    case HTTPD_ANSWER_ROUTE:
        hconn_serve(c, &c->req.routes[c->req.route]);
        break;
    case HTTPD_ANSWER_NOT_FOUND:
        hconn_respond_text(c, "404 Not Found", "", "not found\n");
        break;
    case HTTPD_ANSWER_BAD_METHOD:
        hconn_respond_text(c, "405 Method Not Allowed",
                           "Allow: GET, HEAD\r\n", "method not allowed\n");
        break;
    case HTTPD_ANSWER_TOO_LARGE:
        hconn_respond_text(c, "431 Request Header Fields Too Large", "",
                           "request head over 8 KiB\n");
        break;
    case HTTPD_ANSWER_BAD_REQUEST:
    case HTTPD_ANSWER_NONE:
        hconn_respond_text(c, "400 Bad Request", "", "bad request\n");
        break;
    }
}

static void hconn_on_timer(struct timer *t)
{
    struct hconn *c = t->data;

    if (c->state == HCONN_READING)
        hconn_respond_text(c, "408 Request Timeout", "",
                           "request head not received in time\n");
    else
        hconn_close(c);
}

static void hconn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    /* The reader copies what it keeps, so one buffer does for every
     * connection: the loop has one thread and each read is consumed
     * before the next. */
    static char in[HTTPD_READ_SIZE];
    (void)h;
    (void)suggested;

    *buf = uv_buf_init(in, sizeof(in));
}

static void hconn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct hconn *c = st->data;

    if (nread == 0)
        return;             /* EAGAIN: nothing this time */
    if (nread == UV_EOF) {
        if (c->state == HCONN_WRITING) {
            /* `nc -N` style: the request, then a half-close; the answer
             * still goes out. */
            c->peer_eof = true;
            uv_read_stop(st);
        } else {
            hconn_close(c); /* gave up before a full head, or drained */
        }
        return;
    }
    if (nread == UV_ENOBUFS) {
        /* hconn_alloc always has a buffer. Not expected; do not loop. */
        log_warn("%s: read buffer unavailable; closing", c->srv->name);
        hconn_close(c);
        return;
    }
    if (nread < 0) {
        log_debug("%s: read: %s", c->srv->name, uv_strerror((int)nread));
        hconn_close(c);
        return;
    }
    if (c->state != HCONN_READING)
        return;             /* drained */
    httpd_request_feed(&c->req, buf->base, (size_t)nread);
    if (c->req.answer != HTTPD_ANSWER_NONE)
        hconn_dispatch(c);
}

/* ---- the listener ------------------------------------------------------ */

static void httpd_on_close_free(uv_handle_t *h)
{
    free(h);
}

static void httpd_on_listener_close(uv_handle_t *l)
{
    free(l->data);
}

/* Over the limit: accept (so the backlog does not fill) and close. */
static void httpd_refuse(struct httpd *h)
{
    uv_tcp_t *t = mem_alloc(sizeof(*t));

    uv_tcp_init(h->listener.loop, t);
    if (uv_accept((uv_stream_t *)&h->listener, (uv_stream_t *)t) == 0)
        log_debug("%s: over %d connections, closing one", h->name,
                  HTTPD_MAX_CONNS);
    uv_close((uv_handle_t *)t, httpd_on_close_free);
}

static void httpd_on_connection(uv_stream_t *ls, int status)
{
    struct httpd *h = ls->data;
    struct hconn *c;

    if (status < 0) {
        log_warn("%s: accept: %s", h->name, uv_strerror(status));
        return;
    }
    if (h->nconns >= HTTPD_MAX_CONNS) {
        httpd_refuse(h);
        return;
    }
    c = mem_alloc(sizeof(*c));
    sbuf_init(&c->out);
    uv_tcp_init(ls->loop, &c->tcp);
    c->tcp.data = c;
    timer_init(&c->timer, hconn_on_timer, c);
    c->srv = h;
    c->state = HCONN_READING;
    httpd_request_init(&c->req, h->routes, h->nroutes);
    list_push_head(&h->conns, &c->link);
    h->nconns++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        hconn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    timer_start(&c->timer, HTTPD_TIMEOUT_MS);
    if (uv_read_start((uv_stream_t *)&c->tcp, hconn_alloc, hconn_on_read) != 0)
        hconn_close(c);
}

/* ---- create and destroy ------------------------------------------------ */

int httpd_create(struct httpd **out, uv_loop_t *loop,
                 const struct sockaddr *sa, const char *name,
                 const struct httpd_route *routes, size_t nroutes)
{
    struct httpd *h = mem_alloc(sizeof(*h));
    int rc;

    h->name = name;
    h->routes = routes;
    h->nroutes = nroutes;
    list_init(&h->conns);
    uv_tcp_init(loop, &h->listener);
    h->listener.data = h;
    rc = uv_tcp_bind(&h->listener, sa,
                     sa->sa_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, HTTPD_BACKLOG,
                       httpd_on_connection);
    if (rc != 0) {
        uv_close((uv_handle_t *)&h->listener, httpd_on_listener_close);
        *out = NULL;
        return rc;
    }
    *out = h;
    return 0;
}

void httpd_destroy(struct httpd *h)
{
    struct list *link;

    while ((link = list_first(&h->conns)))
        hconn_close(list_entry(link, struct hconn, link));
    uv_close((uv_handle_t *)&h->listener, httpd_on_listener_close);
}
