/*
 * metrics: see metrics.h.
 *
 * Each connection reads one request head into a fixed 8 KiB buffer, answers
 * it with a complete response (Content-Length and "Connection: close"), then
 * half-closes and discards whatever the client still sends until it closes
 * too, for at most METRICS_LINGER_MS. Closing at once with unread input in
 * the kernel would send an RST, and an RST can destroy the response before
 * the client has read it (the case of an oversized head answered with 431).
 *
 * A connection owns two handles, the socket and a uv_timer_t (the head
 * deadline, then the write and linger deadline); it is freed when the second
 * close callback has run.
 *
 * The exposition is built from stats_json() through two tables, so names,
 * types and help texts are written down in one place; a top-level STATS
 * number the tables do not know yet is still exported, as "untyped".
 */
#include "metrics.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "conf.h"
#include "log.h"
#include "mem.h"
#include "pool.h"
#include "sbuf.h"
#include "stats.h"

#define METRICS_HEAD_MAX 8192
#define METRICS_MAX_CONNS 64
#define METRICS_HEAD_TIMEOUT_MS 5000
#define METRICS_LINGER_MS 1000
#define METRICS_BACKLOG 64

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
    size_t len;             /* bytes of head[] filled */
    char head[METRICS_HEAD_MAX];
    struct mconn *prev, *next;
};

static struct {
    uv_loop_t *loop;
    uv_tcp_t *listener;     /* (owned) freed in its close callback */
    struct mconn *conns;    /* open connections, for metrics_stop */
    unsigned nconns;
} M;

/* ---- exposition -------------------------------------------------------- */

enum metric_type { METRIC_COUNTER, METRIC_GAUGE };

struct metric_def {
    const char *key;        /* STATS key; "a.b" is member b of object a */
    const char *name;       /* after "redlockd_"; counters get "_total" */
    enum metric_type type;
    double scale;           /* 0.001 turns the milliseconds of STATS into the
                             * seconds Prometheus expects */
    const char *help;
};

static const struct metric_def metrics_global[] = {
    { "uptime_ms", "uptime_seconds", METRIC_GAUGE, 0.001,
      "Seconds since the daemon started." },
    { "connections", "connections", METRIC_GAUGE, 1,
      "Client connections open now." },
    { "connections_total", "connections", METRIC_COUNTER, 1,
      "Client connections accepted." },
    { "connections_rejected", "connections_rejected", METRIC_COUNTER, 1,
      "Connections refused (max_clients, protected mode, shutting down)." },
    { "sessions", "sessions", METRIC_GAUGE, 1,
      "Client sessions alive now." },
    { "commands", "commands", METRIC_COUNTER, 1,
      "Requests processed." },
    { "errors", "errors", METRIC_COUNTER, 1,
      "ERR replies sent." },
    { "locks_held", "locks_held", METRIC_GAUGE, 1,
      "Locks held by sessions of this daemon now." },
    { "waiters", "waiters", METRIC_GAUGE, 1,
      "LOCK requests waiting for a resource now." },
    { "acquisitions.ok", "acquisitions_ok", METRIC_COUNTER, 1,
      "LOCK requests granted." },
    { "acquisitions.busy", "acquisitions_busy", METRIC_COUNTER, 1,
      "LOCK requests answered ERR BUSY." },
    { "acquisitions.timeout", "acquisitions_timeout", METRIC_COUNTER, 1,
      "LOCK requests answered ERR TIMEOUT." },
    { "acquisitions.unavailable", "acquisitions_unavailable", METRIC_COUNTER, 1,
      "LOCK requests answered ERR UNAVAILABLE (no quorum)." },
    { "releases", "releases", METRIC_COUNTER, 1,
      "Locks released (UNLOCK, QUIT, disconnects)." },
    { "extends", "extends", METRIC_COUNTER, 1,
      "EXTEND requests that succeeded." },
    { "renewals", "renewals", METRIC_COUNTER, 1,
      "Automatic lease renewals that succeeded." },
    { "renewal_failures", "renewal_failures", METRIC_COUNTER, 1,
      "Automatic lease renewals that failed." },
    { "leases_lost", "leases_lost", METRIC_COUNTER, 1,
      "Leases that could not be kept (EVENT LOST)." },
    { "waits", "waits", METRIC_COUNTER, 1,
      "LOCK requests that had to wait." },
    { "wakeups_notified", "wakeups_notified", METRIC_COUNTER, 1,
      "Waiters woken by a release notification." },
    { "wakeups_retry", "wakeups_retry", METRIC_COUNTER, 1,
      "Waiters woken by the fallback retry timer." },
    { "output_overflows", "output_overflows", METRIC_COUNTER, 1,
      "Clients disconnected for not reading their replies." },
    /* A gauge must not end in _total, which scrapers read as a counter. */
    { "nodes_total", "nodes_configured", METRIC_GAUGE, 1,
      "Redis nodes configured." },
    { "nodes_voting", "nodes_voting", METRIC_GAUGE, 1,
      "Redis nodes whose answers count as votes now." },
    { "quorum", "quorum", METRIC_GAUGE, 1,
      "Votes needed for a lock." },
};

/* Members of each object in the STATS "nodes" array, labelled node="...". */
static const struct metric_def metrics_node[] = {
    { "up", "node_up", METRIC_GAUGE, 1,
      "1 while the daemon is connected to this Redis node." },
    { "voting", "node_voting", METRIC_GAUGE, 1,
      "1 while this node's answers count as votes." },
    { "recovering", "node_recovering", METRIC_GAUGE, 1,
      "1 while a restarted node waits before it may vote again." },
    { "requests", "node_requests", METRIC_COUNTER, 1,
      "Requests sent to this node." },
    { "errors", "node_errors", METRIC_COUNTER, 1,
      "Error replies and connection errors from this node." },
    { "timeouts", "node_timeouts", METRIC_COUNTER, 1,
      "Requests to this node that exceeded command_timeout_ms." },
    { "reconnects", "node_reconnects", METRIC_COUNTER, 1,
      "Reconnections to this node." },
    { "restarts", "node_restarts", METRIC_COUNTER, 1,
      "Times this node came back with a new run_id." },
    { "latency_ms", "node_latency_seconds", METRIC_GAUGE, 0.001,
      "Moving average of the request latency to this node." },
    { "latency_max_ms", "node_latency_max_seconds", METRIC_GAUGE, 0.001,
      "Largest request latency seen from this node." },
    { "rejoin_in_ms", "node_rejoin_in_seconds", METRIC_GAUGE, 0.001,
      "Seconds until a recovering node may vote again." },
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The value at "a" or "a.b" in obj, or NULL. */
static json_t *metrics_lookup(json_t *obj, const char *key)
{
    const char *dot = strchr(key, '.');
    char first[64];

    if (dot == NULL)
        return json_object_get(obj, key);
    snprintf(first, sizeof(first), "%.*s", (int)(dot - key), key);
    return json_object_get(json_object_get(obj, first), dot + 1);
}

static bool metrics_is_number(const json_t *v)
{
    return json_is_number(v) || json_is_boolean(v);
}

static void metrics_put_value(struct sbuf *b, const json_t *v, double scale)
{
    double d;

    if (json_is_boolean(v)) {
        sbuf_puts(b, json_is_true(v) ? "1" : "0");
        return;
    }
    if (json_is_integer(v) && scale == 1) {
        sbuf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return;
    }
    d = json_number_value(v) * scale;
    if (isnan(d))
        sbuf_puts(b, "NaN");
    else if (isinf(d))
        sbuf_puts(b, d > 0 ? "+Inf" : "-Inf");
    else
        sbuf_printf(b, "%.9g", d);
}

/* Label values may hold any UTF-8; these three must be escaped. */
static void metrics_put_label(struct sbuf *b, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            sbuf_puts(b, "\\\\");
        else if (*s == '"')
            sbuf_puts(b, "\\\"");
        else if (*s == '\n')
            sbuf_puts(b, "\\n");
        else
            sbuf_putc(b, *s);
    }
}

static void metrics_put_header(struct sbuf *b, const struct metric_def *m)
{
    const char *suffix = m->type == METRIC_COUNTER ? "_total" : "";

    sbuf_printf(b, "# HELP redlockd_%s%s %s\n", m->name, suffix, m->help);
    sbuf_printf(b, "# TYPE redlockd_%s%s %s\n", m->name, suffix,
                m->type == METRIC_COUNTER ? "counter" : "gauge");
}

static void metrics_put_global(struct sbuf *b, json_t *st)
{
    for (size_t i = 0; i < NELEM(metrics_global); i++) {
        const struct metric_def *m = &metrics_global[i];
        json_t *v = metrics_lookup(st, m->key);

        if (!metrics_is_number(v))
            continue;
        metrics_put_header(b, m);
        sbuf_printf(b, "redlockd_%s%s ", m->name,
                    m->type == METRIC_COUNTER ? "_total" : "");
        metrics_put_value(b, v, m->scale);
        sbuf_putc(b, '\n');
    }
}

/* One family at a time, every node's sample under it: the text format
 * wants the lines of a family together. */
static void metrics_put_nodes(struct sbuf *b, json_t *nodes)
{
    for (size_t i = 0; i < NELEM(metrics_node); i++) {
        const struct metric_def *m = &metrics_node[i];
        bool header = false;
        size_t k;
        json_t *node;

        json_array_foreach(nodes, k, node) {
            json_t *v = json_object_get(node, m->key);
            const char *name = json_string_value(json_object_get(node, "node"));

            if (!metrics_is_number(v) || name == NULL)
                continue;
            if (!header) {
                metrics_put_header(b, m);
                header = true;
            }
            sbuf_printf(b, "redlockd_%s%s{node=\"", m->name,
                        m->type == METRIC_COUNTER ? "_total" : "");
            metrics_put_label(b, name);
            sbuf_puts(b, "\"} ");
            metrics_put_value(b, v, m->scale);
            sbuf_putc(b, '\n');
        }
    }
}

/* A STATS key as a metric name: [a-zA-Z0-9_] only. */
static void metrics_put_name(struct sbuf *b, const char *key)
{
    for (const char *p = key; *p != '\0'; p++)
        sbuf_putc(b, (isalnum((unsigned char)*p) || *p == '_') ? *p : '_');
}

static bool metrics_known(const char *key)
{
    size_t n = strlen(key);

    if (strcmp(key, "nodes") == 0 || strcmp(key, "version") == 0)
        return true;
    for (size_t i = 0; i < NELEM(metrics_global); i++) {
        const char *k = metrics_global[i].key;
        if (strncmp(k, key, n) == 0 && (k[n] == '\0' || k[n] == '.'))
            return true;
    }
    return false;
}

/* STATS keys added after this table was written still reach the scraper;
 * their type is unknown here, so they say so. */
static void metrics_put_untyped(struct sbuf *b, json_t *st)
{
    const char *key;
    json_t *v;

    json_object_foreach(st, key, v) {
        if (!metrics_is_number(v) || metrics_known(key))
            continue;
        sbuf_puts(b, "# TYPE redlockd_");
        metrics_put_name(b, key);
        sbuf_puts(b, " untyped\nredlockd_");
        metrics_put_name(b, key);
        sbuf_putc(b, ' ');
        metrics_put_value(b, v, 1);
        sbuf_putc(b, '\n');
    }
}

static void metrics_render(struct sbuf *b)
{
    json_t *st = stats_json();
    const char *version = json_string_value(json_object_get(st, "version"));

    sbuf_puts(b, "# HELP redlockd_build_info The running redlockd version.\n"
                 "# TYPE redlockd_build_info gauge\n"
                 "redlockd_build_info{version=\"");
    metrics_put_label(b, version != NULL ? version : "");
    sbuf_puts(b, "\"} 1\n");
    metrics_put_global(b, st);
    metrics_put_nodes(b, json_object_get(st, "nodes"));
    metrics_put_untyped(b, st);
    json_decref(st);
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
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        M.conns = c->next;
    if (c->next != NULL)
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

    sbuf_printf(&c->out, "HTTP/1.1 %s\r\n"
                "Content-Type: %s\r\n"
                "Content-Length: %zu\r\n"
                "Cache-Control: no-store\r\n"
                "%s"
                "Connection: close\r\n"
                "\r\n", status, ctype, bodylen, extra_headers);
    sbuf_append(&c->out, body, bodylen);
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

    metrics_render(&body);
    mconn_respond(c, "200 OK", METRICS_CTYPE_PROM, "", body.data, body.len);
    sbuf_deinit(&body);
}

static void mconn_serve_health(struct mconn *c)
{
    if (pool_nodes_voting() >= pool_quorum())
        mconn_respond_text(c, "200 OK", "", "ok\n");
    else
        mconn_respond_text(c, "503 Service Unavailable", "", "no quorum\n");
}

/* Where the head ends (after the empty line), or 0 when it has not yet.
 * Bare LF line ends are accepted as well as CRLF. */
static size_t mconn_head_end(const struct mconn *c)
{
    for (size_t i = 0; i < c->len; i++) {
        size_t j = i + 1;

        if (c->head[i] != '\n')
            continue;
        if (j < c->len && c->head[j] == '\r')
            j++;
        if (j < c->len && c->head[j] == '\n')
            return j + 1;
    }
    return 0;
}

/* Only the request line matters: "METHOD SP TARGET SP HTTP/1.x". Header
 * fields are read (to find the end of the head) and ignored. */
static void mconn_dispatch(struct mconn *c)
{
    char *line = c->head;
    char *eol = memchr(line, '\n', c->len);
    char *method, *target, *version, *q;

    *eol = '\0';
    if (eol > line && eol[-1] == '\r')
        eol[-1] = '\0';
    method = line;
    target = strchr(method, ' ');
    version = target != NULL ? strchr(target + 1, ' ') : NULL;
    if (target == NULL || version == NULL || target == method ||
        strncmp(version + 1, "HTTP/1.", 7) != 0 || target[1] != '/') {
        mconn_respond_text(c, "400 Bad Request", "", "bad request\n");
        return;
    }
    *target++ = '\0';
    *version = '\0';
    q = strchr(target, '?');
    if (q != NULL)
        *q = '\0';
    if (strcmp(method, "GET") != 0)
        mconn_respond_text(c, "405 Method Not Allowed", "Allow: GET\r\n",
                           "method not allowed\n");
    else if (strcmp(target, "/metrics") == 0)
        mconn_serve_metrics(c);
    else if (strcmp(target, "/healthz") == 0)
        mconn_serve_health(c);
    else
        mconn_respond_text(c, "404 Not Found", "", "not found\n");
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
    /* Input after the head is only read to be thrown away; one shared
     * buffer does for every connection since the loop has one thread. */
    static char discard[4096];
    struct mconn *c = h->data;
    (void)suggested;

    if (c->state == MCONN_READING)
        *buf = uv_buf_init(c->head + c->len,
                           (unsigned)(sizeof(c->head) - c->len));
    else
        *buf = uv_buf_init(discard, sizeof(discard));
}

static void mconn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct mconn *c = st->data;
    (void)buf;

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
        /* mconn_alloc always has room: a full head is answered (431)
         * before the next read. Not expected; do not loop on it. */
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
    c->len += (size_t)nread;
    if (mconn_head_end(c) > 0)
        mconn_dispatch(c);
    else if (c->len == sizeof(c->head))
        mconn_respond_text(c, "431 Request Header Fields Too Large", "",
                           "request head over 8 KiB\n");
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
    c->next = M.conns;
    if (M.conns != NULL)
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
    v6 = strchr(addr->host, ':') != NULL;
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
    if (M.listener != NULL) {
        uv_close((uv_handle_t *)M.listener, metrics_on_close_free);
        M.listener = NULL;
    }
    while (M.conns != NULL)
        mconn_close(M.conns);
}
