/*
 * metrics: see metrics.h.
 *
 * Each connection feeds what it reads to a struct metrics_request, which
 * runs libhttp-parser over the head (at most METRICS_HEAD_MAX bytes) and
 * keeps only the request target; the connection then answers with a
 * complete response (Content-Length and "Connection: close"), half-closes
 * and discards whatever the client still sends until it closes too, for at
 * most METRICS_LINGER_MS. Closing at once with unread input in the kernel
 * would send an RST, and an RST can destroy the response before the client
 * has read it (the case of an oversized head answered with 431).
 *
 * A connection owns two handles, the socket and a uv_timer_t (the head
 * deadline, then the write and linger deadline); it is freed when the second
 * close callback has run.
 *
 * The exposition is a walk over the stats codec's tables (stats.h): each
 * row is a family whose name, type and help come from the row, so nothing
 * here knows a STATS key and nothing is exported as "untyped". /healthz
 * asks metrics_healthy(), which reads the node rows voting and
 * answered_recently, and quorum, from the same values.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "mem.h"
#include "sbuf.h"
#include "stats.h"

#define METRICS_MAX_CONNS 64
#define METRICS_HEAD_TIMEOUT_MS 5000
#define METRICS_LINGER_MS 1000
#define METRICS_BACKLOG 64
#define METRICS_WHY_MAX 1024            /* the /healthz reason header's value */
#define METRICS_WHY_HEADER "X-Redlockd-Why: "
/* One read's worth: heads are copied out of it (the target only), and
 * what follows a head is read into it to be dropped. */
#define METRICS_READ_SIZE 4096

#define METRICS_CTYPE_PROM "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_CTYPE_TEXT "text/plain; charset=utf-8"

enum mconn_state {
    MCONN_READING,      /* collecting the request head */
    MCONN_WRITING,      /* the response is being written */
    MCONN_DRAINING,     /* response sent, FIN sent: discard input until EOF */
    MCONN_CLOSING,      /* uv_close called on both handles */
};

struct mconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    enum mconn_state state;
    int open_handles;       /* close callbacks still to come */
    bool peer_eof;          /* the client half-closed before we answered */
    struct sbuf out;        /* (owned) the response, alive until written */
    struct metrics_request req;
    struct mconn *prev, *next;
};

static struct {
    uv_loop_t *loop;
    uv_tcp_t *listener;     /* (owned) freed in its close callback */
    struct mconn *conns;    /* open connections, for metrics_stop */
    unsigned nconns;
} M;

/* ---- exposition -------------------------------------------------------- */

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* One family of the exposition: a codec row, named with its table's
 * prefix. Its # HELP and # TYPE go out before its first sample. */
struct metrics_family {
    const char *prefix;
    const struct stats_desc *d;
    bool header_done;
};

static void metrics_put_name(struct sbuf *b, const struct metrics_family *f,
                             const char *suffix)
{
    sbuf_printf(b, "%s%s", f->prefix, f->d->metric);
    if (f->d->kind == STATS_COUNTER)
        sbuf_puts(b, "_total");
    sbuf_puts(b, suffix);
}

/* Backslash and line feed escaped, and with quote the double quote too:
 * # HELP text escapes the first two, label values (any UTF-8) all three. */
static void metrics_put_escaped(struct sbuf *b, const char *s, bool quote)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            sbuf_puts(b, "\\\\");
        else if (*s == '\n')
            sbuf_puts(b, "\\n");
        else if (quote && *s == '"')
            sbuf_puts(b, "\\\"");
        else
            sbuf_putc(b, *s);
    }
}

static void metrics_put_header(struct sbuf *b, struct metrics_family *f)
{
    static const char *const types[] = {
        [STATS_COUNTER] = "counter",
        [STATS_GAUGE] = "gauge",
        [STATS_HISTOGRAM] = "histogram",
    };

    if (f->header_done)
        return;
    f->header_done = true;
    sbuf_puts(b, "# HELP ");
    metrics_put_name(b, f, " ");
    metrics_put_escaped(b, f->d->help, false);
    sbuf_puts(b, "\n# TYPE ");
    metrics_put_name(b, f, " ");
    sbuf_printf(b, "%s\n", types[f->d->kind]);
}

/* The shortest of 15 or 17 significant digits that reads back as d: a
 * Unix time in seconds keeps its milliseconds, 0.00025 stays 0.00025. */
static void metrics_put_shortest(struct sbuf *b, double d)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%.15g", d);
    if (strtod(buf, NULL) != d)
        snprintf(buf, sizeof(buf), "%.17g", d);
    sbuf_puts(b, buf);
}

static void metrics_put_number(struct sbuf *b, double d)
{
    if (isnan(d))
        sbuf_puts(b, "NaN");
    else if (isinf(d))
        sbuf_puts(b, d > 0 ? "+Inf" : "-Inf");
    else if (d == floor(d) && fabs(d) < 1e15)
        sbuf_printf(b, "%.0f", d);
    else
        metrics_put_shortest(b, d);
}

/* A sample's labels, in order; a pair whose value is NULL is left out. */
struct metrics_labels {
    const char *name[3];
    const char *value[3];
};

static void metrics_put_labels(struct sbuf *b, const struct metrics_labels *l)
{
    char sep = '{';

    for (size_t i = 0; i < NELEM(l->name); i++) {
        if (!l->value[i])
            continue;
        sbuf_printf(b, "%c%s=\"", sep, l->name[i]);
        metrics_put_escaped(b, l->value[i], true);
        sbuf_putc(b, '"');
        sep = ',';
    }
    if (sep == ',')
        sbuf_putc(b, '}');
}

/* A histogram cell: cumulative buckets up to +Inf, then _sum and _count.
 * l->value[2] is the slot for le. */
static void metrics_put_hist(struct sbuf *b, const struct metrics_family *f,
                             struct metrics_labels *l,
                             const struct stats_hist *h)
{
    const struct stats_buckets *bk = f->d->buckets;
    uint64_t cum = 0;
    char le[32];

    l->name[2] = "le";
    for (size_t i = 0; i <= bk->n; i++) {
        cum += h->in[i];
        if (i < bk->n)
            snprintf(le, sizeof(le), "%.9g", bk->le[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        l->value[2] = le;
        metrics_put_name(b, f, "_bucket");
        metrics_put_labels(b, l);
        sbuf_printf(b, " %" PRIu64 "\n", cum);
    }
    l->value[2] = NULL;
    metrics_put_name(b, f, "_sum");
    metrics_put_labels(b, l);
    sbuf_putc(b, ' ');
    metrics_put_number(b, h->sum);
    sbuf_putc(b, '\n');
    metrics_put_name(b, f, "_count");
    metrics_put_labels(b, l);
    sbuf_printf(b, " %" PRIu64 "\n", h->count);
}

/* Cell k of f's row at base, under the labels l; a gauge that is not
 * reported (NaN) has no sample. */
static void metrics_put_cell(struct sbuf *b, struct metrics_family *f,
                             struct metrics_labels *l, const void *base,
                             size_t k)
{
    const char *p = (const char *)base + f->d->offset;
    double g;

    if (f->d->kind == STATS_GAUGE && isnan(((const double *)p)[k]))
        return;
    metrics_put_header(b, f);
    if (f->d->kind == STATS_HISTOGRAM) {
        metrics_put_hist(b, f, l, &((const struct stats_hist *)p)[k]);
        return;
    }
    metrics_put_name(b, f, "");
    metrics_put_labels(b, l);
    sbuf_putc(b, ' ');
    if (f->d->kind == STATS_COUNTER && f->d->unit != STATS_UNIT_MS) {
        sbuf_printf(b, "%" PRIu64, ((const uint64_t *)p)[k]);
    } else {
        g = f->d->kind == STATS_COUNTER ? (double)((const uint64_t *)p)[k]
                                        : ((const double *)p)[k];
        /* Base units: milliseconds go out as seconds. */
        metrics_put_number(b, f->d->unit == STATS_UNIT_MS ? g / 1000 : g);
    }
    sbuf_putc(b, '\n');
}

/* Every sample of one family, instance by instance: the text format wants
 * the lines of a family together. */
static void metrics_put_family(struct sbuf *b, struct metrics_family *f,
                               const char *label,
                               const struct metrics_instance *inst, size_t n)
{
    const struct stats_labels *ls = f->d->labels;
    struct metrics_labels l = { { label, NULL, NULL }, { NULL, NULL, NULL } };

    for (size_t i = 0; i < n; i++) {
        l.value[0] = label ? inst[i].label_value : NULL;
        if (!ls) {
            metrics_put_cell(b, f, &l, inst[i].base, 0);
        } else {
            l.name[1] = ls->name;
            for (size_t k = 0; k < ls->n; k++) {
                l.value[1] = ls->values[k];
                metrics_put_cell(b, f, &l, inst[i].base, k);
            }
            l.value[1] = NULL;
        }
    }
}

void metrics_format_table(struct sbuf *b, const struct stats_table *t,
                          const char *label,
                          const struct metrics_instance *inst, size_t n)
{
    for (size_t i = 0; i < t->n; i++) {
        struct metrics_family f = { t->prefix, &t->rows[i], false };

        metrics_put_family(b, &f, label, inst, n);
    }
}

void metrics_format(struct sbuf *b, const struct stats_values *v)
{
    struct metrics_instance global = { v, NULL };
    struct metrics_instance *nodes = mem_alloc((v->nnodes + 1) *
                                               sizeof(*nodes));

    sbuf_puts(b, "# HELP redlockd_build_info The running redlockd version, "
                 "as a label; the value is always 1.\n"
                 "# TYPE redlockd_build_info gauge\n"
                 "redlockd_build_info{version=\"");
    metrics_put_escaped(b, REDLOCKD_VERSION, true);
    sbuf_puts(b, "\"} 1\n");
    metrics_format_table(b, &stats_table, NULL, &global, 1);
    for (size_t i = 0; i < v->nnodes; i++) {
        nodes[i].base = &v->nodes[i];
        nodes[i].label_value = v->nodes[i].name;
    }
    metrics_format_table(b, &stats_node_table, "node", nodes, v->nnodes);
    free(nodes);
    global.base = &v->process;
    metrics_format_table(b, &stats_process_table, NULL, &global, 1);
}

static void metrics_render(struct sbuf *b)
{
    struct stats_values v;

    stats_collect(&v);
    metrics_format(b, &v);
    stats_values_deinit(&v);
}

/*
 * Healthy while a quorum of nodes vote and answered recently (within
 * redis.probe_interval_ms + command_timeout_ms, as node reports it): a node
 * that froze without traffic counts as gone at once, before its probe's
 * deadline fails it. When not, `why` gets the nodes' own explanations
 * (STATS "why"), one line, for a response header.
 */
static bool metrics_healthy(char *why, size_t size)
{
    struct stats_values v;
    size_t len = 0;
    int fresh = 0;

    stats_collect(&v);
    for (size_t i = 0; i < v.nnodes; i++)
        fresh += v.nodes[i].voting == 1 && v.nodes[i].answered_recently == 1;
    bool ok = fresh >= v.quorum;
    why[0] = '\0';
    for (size_t i = 0; i < v.nnodes && !ok && len < size; i++) {
        const struct stats_node *n = &v.nodes[i];

        if (!n->why || !*n->why)
            continue;
        int k = snprintf(why + len, size - len, "%s%s is %s", len ? "; " : "",
                         n->name, n->why);
        if (k > 0)
            len += (size_t)k;
    }
    for (char *p = why; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            *p = '?';
    stats_values_deinit(&v);
    return ok;
}

/* ---- the request reader ------------------------------------------------ */

static int metrics_on_url(http_parser *p, const char *at, size_t len)
{
    struct metrics_request *r = p->data;

    /* The target is part of the head, which feed caps at url's size. */
    if (len > sizeof(r->url) - r->url_len)
        return 1;
    memcpy(r->url + r->url_len, at, len);
    r->url_len += len;
    return 0;
}

/* The head ends here: stop, whatever body the request announces. */
static int metrics_on_headers_complete(http_parser *p)
{
    struct metrics_request *r = p->data;

    r->headers_done = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings metrics_parser_settings = {
    .on_url = metrics_on_url,
    .on_headers_complete = metrics_on_headers_complete,
};

/* The path of the target (origin form "/metrics?x" or absolute form
 * "http://host/metrics"), or false when the target is not a URL. */
static bool metrics_request_path(const struct metrics_request *r,
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

static bool metrics_path_is(const char *path, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(path, want, len) == 0;
}

/* A complete head: what its request line asks for. Header fields are
 * parsed (to find the end of the head) and ignored. */
static enum metrics_answer metrics_request_route(const struct metrics_request *r)
{
    const char *path;
    size_t len;

    if (r->parser.http_major != 1 || !metrics_request_path(r, &path, &len))
        return METRICS_ANSWER_BAD_REQUEST;
    if (r->parser.method != HTTP_GET && r->parser.method != HTTP_HEAD)
        return METRICS_ANSWER_BAD_METHOD;
    if (metrics_path_is(path, len, "/metrics"))
        return METRICS_ANSWER_METRICS;
    if (metrics_path_is(path, len, "/healthz"))
        return METRICS_ANSWER_HEALTHZ;
    return METRICS_ANSWER_NOT_FOUND;
}

void metrics_request_init(struct metrics_request *r)
{
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
    r->head_len = 0;
    r->headers_done = false;
    r->answer = METRICS_ANSWER_NONE;
    r->url_len = 0;
}

size_t metrics_request_feed(struct metrics_request *r, const char *data,
                            size_t len)
{
    size_t room = METRICS_HEAD_MAX - r->head_len;
    size_t n = len < room ? len : room;
    size_t used;

    /* A length of 0 would tell the parser the stream ended. */
    if (r->answer != METRICS_ANSWER_NONE || n == 0)
        return 0;
    used = http_parser_execute(&r->parser, &metrics_parser_settings, data, n);
    r->head_len += used;
    if (r->headers_done)
        r->answer = metrics_request_route(r);
    else if (HTTP_PARSER_ERRNO(&r->parser) != HPE_OK)
        r->answer = METRICS_ANSWER_BAD_REQUEST;
    else if (r->head_len == METRICS_HEAD_MAX)
        r->answer = METRICS_ANSWER_TOO_LARGE;
    return used;
}

bool metrics_request_is_head(const struct metrics_request *r)
{
    return r->headers_done && r->parser.method == HTTP_HEAD;
}

void metrics_format_response(struct sbuf *out, const char *status,
                             const char *ctype, const char *extra_headers,
                             const char *body, size_t bodylen,
                             bool head_only)
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

static void mconn_on_close(uv_handle_t *h)
{
    struct mconn *c = h->data;

    if (--c->open_handles > 0)
        return;
    sbuf_deinit(&c->out);
    free(c);
}

static void mconn_close(struct mconn *c)
{
    if (c->state == MCONN_CLOSING)
        return;
    c->state = MCONN_CLOSING;
    if (c->prev)
        c->prev->next = c->next;
    else
        M.conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    M.nconns--;
    /* A write or shutdown still pending is cancelled by the close; its
     * callback runs before the close callbacks, so c is still there. */
    uv_close((uv_handle_t *)&c->timer, mconn_on_close);
    uv_close((uv_handle_t *)&c->tcp, mconn_on_close);
}

static void mconn_on_timer(uv_timer_t *t);

static void mconn_on_shutdown(uv_shutdown_t *req, int status)
{
    struct mconn *c = req->data;

    if (status < 0)
        mconn_close(c);     /* no-op when the close cancelled it */
}

static void mconn_on_write(uv_write_t *req, int status)
{
    struct mconn *c = req->data;

    if (c->state == MCONN_CLOSING)
        return;
    if (status < 0 || c->peer_eof) {
        mconn_close(c);
        return;
    }
    c->state = MCONN_DRAINING;
    uv_timer_start(&c->timer, mconn_on_timer, METRICS_LINGER_MS, 0);
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, mconn_on_shutdown) != 0)
        mconn_close(c);
}

static void mconn_respond(struct mconn *c, const char *status,
                          const char *ctype, const char *extra_headers,
                          const char *body, size_t bodylen)
{
    uv_buf_t buf;

    metrics_format_response(&c->out, status, ctype, extra_headers, body,
                            bodylen, metrics_request_is_head(&c->req));
    c->state = MCONN_WRITING;
    /* The same deadline again, now for a client that does not read. */
    uv_timer_start(&c->timer, mconn_on_timer, METRICS_HEAD_TIMEOUT_MS, 0);
    buf = uv_buf_init(c->out.data, (unsigned)c->out.len);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &buf, 1, mconn_on_write) != 0)
        mconn_close(c);
}

static void mconn_respond_text(struct mconn *c, const char *status,
                               const char *extra_headers, const char *body)
{
    mconn_respond(c, status, METRICS_CTYPE_TEXT, extra_headers, body,
                  strlen(body));
}

static void mconn_serve_metrics(struct mconn *c)
{
    struct sbuf body = SBUF_INIT;

    /* HEAD too: its Content-Length is the body's it does not get. */
    metrics_render(&body);
    mconn_respond(c, "200 OK", METRICS_CTYPE_PROM, "", body.data, body.len);
    sbuf_deinit(&body);
}

static void mconn_serve_health(struct mconn *c)
{
    char why[METRICS_WHY_MAX];
    char header[sizeof(METRICS_WHY_HEADER) + METRICS_WHY_MAX + 2];

    if (metrics_healthy(why, sizeof(why))) {
        mconn_respond_text(c, "200 OK", "", "ok\n");
        return;
    }
    /* The body stays "no quorum" for checks that compare it; the reason
     * (a node recovering until when, or down and why) goes in a header. */
    snprintf(header, sizeof(header), "%s%s\r\n", METRICS_WHY_HEADER,
             why[0] ? why : "too few nodes answered recently");
    mconn_respond_text(c, "503 Service Unavailable", header, "no quorum\n");
}

static void mconn_dispatch(struct mconn *c)
{
    switch (c->req.answer) {
    case METRICS_ANSWER_METRICS:
        mconn_serve_metrics(c);
        break;
    case METRICS_ANSWER_HEALTHZ:
        mconn_serve_health(c);
        break;
    case METRICS_ANSWER_NOT_FOUND:
        mconn_respond_text(c, "404 Not Found", "", "not found\n");
        break;
    case METRICS_ANSWER_BAD_METHOD:
        mconn_respond_text(c, "405 Method Not Allowed",
                           "Allow: GET, HEAD\r\n", "method not allowed\n");
        break;
    case METRICS_ANSWER_TOO_LARGE:
        mconn_respond_text(c, "431 Request Header Fields Too Large", "",
                           "request head over 8 KiB\n");
        break;
    case METRICS_ANSWER_BAD_REQUEST:
    case METRICS_ANSWER_NONE:
        mconn_respond_text(c, "400 Bad Request", "", "bad request\n");
        break;
    }
}

static void mconn_on_timer(uv_timer_t *t)
{
    struct mconn *c = t->data;

    if (c->state == MCONN_READING)
        mconn_respond_text(c, "408 Request Timeout", "",
                           "request head not received in time\n");
    else
        mconn_close(c);
}

static void mconn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    /* The reader copies what it keeps, so one buffer does for every
     * connection: the loop has one thread and each read is consumed
     * before the next. */
    static char in[METRICS_READ_SIZE];
    (void)h;
    (void)suggested;

    *buf = uv_buf_init(in, sizeof(in));
}

static void mconn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct mconn *c = st->data;

    if (nread == 0)
        return;             /* EAGAIN: nothing this time */
    if (nread == UV_EOF) {
        if (c->state == MCONN_WRITING) {
            /* `nc -N` style: the request, then a half-close; the answer
             * still goes out. */
            c->peer_eof = true;
            uv_read_stop(st);
        } else {
            mconn_close(c); /* gave up before a full head, or drained */
        }
        return;
    }
    if (nread == UV_ENOBUFS) {
        /* mconn_alloc always has a buffer. Not expected; do not loop. */
        log_warn("metrics: read buffer unavailable; closing");
        mconn_close(c);
        return;
    }
    if (nread < 0) {
        log_debug("metrics: read: %s", uv_strerror((int)nread));
        mconn_close(c);
        return;
    }
    if (c->state != MCONN_READING)
        return;             /* drained */
    metrics_request_feed(&c->req, buf->base, (size_t)nread);
    if (c->req.answer != METRICS_ANSWER_NONE)
        mconn_dispatch(c);
}

static void metrics_on_close_free(uv_handle_t *h)
{
    free(h);
}

/* Over the limit: accept (so the backlog does not fill) and close. */
static void metrics_refuse(uv_stream_t *ls)
{
    uv_tcp_t *t = mem_alloc(sizeof(*t));

    uv_tcp_init(M.loop, t);
    if (uv_accept(ls, (uv_stream_t *)t) == 0)
        log_debug("metrics: over %d connections, closing one",
                  METRICS_MAX_CONNS);
    uv_close((uv_handle_t *)t, metrics_on_close_free);
}

static void metrics_on_connection(uv_stream_t *ls, int status)
{
    struct mconn *c;

    if (status < 0) {
        log_warn("metrics: accept: %s", uv_strerror(status));
        return;
    }
    if (M.nconns >= METRICS_MAX_CONNS) {
        metrics_refuse(ls);
        return;
    }
    c = mem_alloc(sizeof(*c));
    sbuf_init(&c->out);
    uv_tcp_init(M.loop, &c->tcp);
    uv_timer_init(M.loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->state = MCONN_READING;
    metrics_request_init(&c->req);
    c->next = M.conns;
    if (M.conns)
        M.conns->prev = c;
    M.conns = c;
    M.nconns++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        mconn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_start(&c->timer, mconn_on_timer, METRICS_HEAD_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, mconn_alloc, mconn_on_read) != 0)
        mconn_close(c);
}

/* ---- start and stop ---------------------------------------------------- */

int metrics_start(uv_loop_t *loop, const struct conf_addr *addr)
{
    struct sockaddr_storage ss;
    bool v6;
    int rc;

    if (addr->kind != CONF_ADDR_TCP) {
        log_error("metrics.listen: %s: must be a TCP HOST:PORT", addr->text);
        return -1;
    }
    M.loop = loop;
    v6 = strchr(addr->host, ':');
    rc = v6 ? uv_ip6_addr(addr->host, addr->port, (struct sockaddr_in6 *)&ss)
            : uv_ip4_addr(addr->host, addr->port, (struct sockaddr_in *)&ss);
    if (rc != 0) {
        log_error("metrics.listen: %s: %s", addr->text, uv_strerror(rc));
        return -1;
    }
    M.listener = mem_alloc(sizeof(*M.listener));
    uv_tcp_init(loop, M.listener);
    rc = uv_tcp_bind(M.listener, (const struct sockaddr *)&ss,
                     v6 ? UV_TCP_IPV6ONLY : 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)M.listener, METRICS_BACKLOG,
                       metrics_on_connection);
    if (rc != 0) {
        log_error("metrics.listen: cannot listen on %s: %s", addr->text,
                  uv_strerror(rc));
        uv_close((uv_handle_t *)M.listener, metrics_on_close_free);
        M.listener = NULL;
        return -1;
    }
    log_notice("metrics on http://%s/metrics", addr->text);
    return 0;
}

void metrics_stop(void)
{
    if (M.listener) {
        uv_close((uv_handle_t *)M.listener, metrics_on_close_free);
        M.listener = NULL;
    }
    while (M.conns)
        mconn_close(M.conns);
}
