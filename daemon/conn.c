/*
 * conn: see conn.h.
 *
 * Reading: a partial line waits in rbuf for the rest; a line longer than
 * max_line becomes a TOOLONG placeholder and the rest of what was read is
 * dropped, since the connection closes after answering it. After EOF the
 * requests already read are answered (LOCKs without waiting), then the
 * connection closes and its binder is told (ops->closed).
 *
 * Writing: replies accumulate in `out` (conn_reply hands it to the
 * binder, which formats with proto's formatters). They are written once
 * per loop turn, from one uv_prepare handle, for every connection that got
 * output during the turn: so the replies of many requests answered in one
 * turn (tagged requests, a node's answer to a group) leave in one write.
 * conn_flush first tries a direct write (most replies fit in the socket
 * buffer at once, which saves the uv_write round through the loop);
 * whatever is left goes out in one uv_write at a time from wbuf while
 * `out` keeps collecting.
 */
#include "conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "mem.h"
#include "tls.h"

#define CONN_READ_SIZE 65536

/* Reads land in one loop-wide buffer; a connection keeps its own buffer
 * only for an unfinished line, so an idle connection costs no read
 * memory. */
static char conn_rdbuf[CONN_READ_SIZE];

static const struct conf *conn_conf;     /* limits.*: read live */
static struct conn_counters counters;

/* Connections with output written this turn, flushed at its end. */
static struct {
    uv_prepare_t prepare;
    bool ready;
    struct list due;        /* struct conn (flush_link) */
} conn_turn = { .due = LIST_INIT(conn_turn.due) };

static void conn_turn_cb(uv_prepare_t *h)
{
    struct list *p;

    while ((p = list_first(&conn_turn.due))) {
        struct conn *c = container_of(p, struct conn, flush_link);
        list_remove(p);
        if (c->overflow)
            conn_close_now_announced(c, "output", "output buffer limit");
        else
            conn_flush(c);
        conn_unref(c);
    }
    uv_prepare_stop(h);
}

void conn_init(uv_loop_t *loop, const struct conf *conf)
{
    conn_conf = conf;
    if (!conn_turn.ready && uv_prepare_init(loop, &conn_turn.prepare) == 0)
        conn_turn.ready = true;
}

void conn_deinit(void)
{
    if (conn_turn.ready)
        uv_close((uv_handle_t *)&conn_turn.prepare, NULL);
    conn_turn.ready = false;
}

/* Flush c at the end of this loop turn. */
static void conn_want_flush(struct conn *c)
{
    if (!conn_turn.ready) {
        conn_flush(c);
        return;
    }
    if (list_linked(&c->flush_link))
        return;
    conn_ref(c);
    list_push_tail(&conn_turn.due, &c->flush_link);
    uv_prepare_start(&conn_turn.prepare, conn_turn_cb);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = conn_rdbuf;
    buf->len = sizeof(conn_rdbuf);
}

/* ---- a connection's life ------------------------------------------------ */

static void conn_idle_cb(struct timer *t);
static void conn_arm_idle(struct conn *c);

struct conn *conn_create(uv_loop_t *loop, bool is_unix, int *rc)
{
    struct conn *c = mem_alloc(sizeof(*c));

    *rc = is_unix ? uv_pipe_init(loop, &c->h.pipe, 0)
                  : uv_tcp_init(loop, &c->h.tcp);
    if (*rc != 0) {
        free(c);        /* no handle was made: nothing to close */
        return NULL;
    }
    c->h.handle.data = c;
    c->refs = 1;        /* the handle's; dropped by its close callback */
    snprintf(c->name, sizeof(c->name), "conn");
    sbuf_init(&c->out);
    sbuf_init(&c->wbuf);
    list_init(&c->queue);
    list_init(&c->flush_link);
    c->created_at = c->last_line_at = timer_now();
    timer_init(&c->idle_timer, conn_idle_cb, c);
    conn_arm_idle(c);   /* handshake_timeout_ms */
    counters.open++;        /* until conn_on_close */
    return c;
}

static void conn_queue_free(struct conn *c)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &c->queue) {
        list_remove(p);
        free(list_entry(p, struct conn_line, link));
    }
    c->qlen = 0;
}

static void conn_free(struct conn *c)
{
    timer_stop(&c->idle_timer);
    conn_queue_free(c);
    free(c->rbuf);
    sbuf_deinit(&c->out);
    sbuf_deinit(&c->wbuf);
    sbuf_deinit(&c->tls_out);
    tls_conn_free(c->tls);
    free(c);
}

void conn_ref(struct conn *c)
{
    c->refs++;
}

void conn_unref(struct conn *c)
{
    if (--c->refs == 0)
        conn_free(c);
}

void conn_bind(struct conn *c, const struct conn_ops *ops, void *data,
               const char *name)
{
    c->ops = ops;
    c->data = data;
    snprintf(c->name, sizeof(c->name), "%s", name);
}

/* ---- idle / handshake / keepalive -------------------------------------- */

/* Why a quiet connection is closed: the EVENT CLOSING reason and the log's
 * words. */
struct conn_idle_rule {
    const char *reason;
    const char *why;
};

static const struct conn_idle_rule idle_handshake = {
    "handshake", "no request within limits.handshake_timeout_ms" };
static const struct conn_idle_rule idle_idle = {
    "idle", "idle for limits.idle_timeout_ms" };
static const struct conn_idle_rule idle_keepalive = {
    "keepalive", "no line within the session's keepalive" };

/* How long c may stay quiet, and which rule says so (0: forever). */
static uint64_t conn_idle_limit(const struct conn *c,
                                const struct conn_idle_rule **rule)
{
    const struct conf *cf = conn_conf;
    uint64_t limit = 0;

    if (!c->got_line) {
        *rule = &idle_handshake;
        return cf->limits.handshake_timeout_ms;
    }
    if (cf->limits.idle_timeout_ms) {
        limit = cf->limits.idle_timeout_ms;
        *rule = &idle_idle;
    }
    if (c->keepalive_ms && (!limit || c->keepalive_ms < limit)) {
        limit = c->keepalive_ms;
        *rule = &idle_keepalive;
    }
    return limit;
}

static void conn_arm_idle(struct conn *c)
{
    const struct conn_idle_rule *rule = NULL;
    uint64_t limit = conn_idle_limit(c, &rule);

    if (!limit || c->closing)
        timer_stop(&c->idle_timer);
    else
        timer_start_at(&c->idle_timer, c->last_line_at + limit);
}

static void conn_idle_cb(struct timer *t)
{
    struct conn *c = t->data;
    const struct conn_idle_rule *rule = NULL;
    uint64_t limit = conn_idle_limit(c, &rule);

    if (!limit || c->closing)
        return;
    /* Lines reset last_line_at without touching the timer; check again. */
    if (timer_now() < c->last_line_at + limit) {
        timer_start_at(&c->idle_timer, c->last_line_at + limit);
        return;
    }
    if (c->tls && !c->tls_ready) {
        counters.tls_failures[TLS_FAIL_timeout]++;
        log_info("%s (%s): no TLS handshake within "
                 "limits.handshake_timeout_ms, closing", c->name, c->peer);
        conn_close(c, true, "TLS handshake timeout");
        return;
    }
    log_info("%s (%s): %s, closing", c->name, c->peer, rule->why);
    conn_close_now_announced(c, rule->reason, rule->why);
}

void conn_set_keepalive(struct conn *c, uint32_t ms)
{
    c->keepalive_ms = ms;
    conn_arm_idle(c);
}

/* ---- reading ------------------------------------------------------------ */

static int conn_keep(struct conn *c, const char *p, size_t n)
{
    if (c->rcap - c->rlen < n) {
        size_t ncap = c->rcap ? c->rcap : 256;
        while (ncap - c->rlen < n)
            ncap *= 2;
        char *nb = realloc(c->rbuf, ncap);
        if (!nb)
            return -1;
        c->rbuf = nb;
        c->rcap = ncap;
    }
    memcpy(c->rbuf + c->rlen, p, n);
    c->rlen += n;
    return 0;
}

/* A complete line arrived (len bytes, no LF) or a too-long one. */
static void conn_push_line(struct conn *c, const char *data, size_t len,
                           bool toolong)
{
    struct conn_line *ln = mem_alloc(sizeof(*ln) + len + 1);

    ln->toolong = toolong;
    ln->len = len;
    if (len)
        memcpy(ln->data, data, len);
    ln->data[len] = '\0';
    list_push_tail(&c->queue, &ln->link);
    c->qlen++;

    c->last_line_at = timer_now();
    if (!c->got_line) {
        c->got_line = true;
        conn_arm_idle(c);
    }
}

/* Split complete lines out of buf[0..len) into the queue; returns how
 * many bytes were consumed. */
static size_t conn_frame(struct conn *c, const char *buf, size_t len)
{
    const struct conf *cf = conn_conf;
    size_t start = 0;

    while (!c->closing && c->qlen < cf->limits.max_pipeline) {
        const char *lf = memchr(buf + start, '\n', len - start);
        size_t n = lf ? (size_t)(lf - (buf + start)) : len - start;
        if (n > cf->limits.max_line) {
            conn_push_line(c, NULL, 0, true);
            return len;
        }
        if (!lf)
            break;
        conn_push_line(c, buf + start, n, false);
        start += n + 1;
    }
    return start;
}

static void conn_release_rbuf(struct conn *c)
{
    if (c->rlen == 0 && c->rcap > 0) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
    }
}

/* Queue lines still waiting in the read buffer (read ahead of the
 * pipeline limit); true if any were queued. */
static bool conn_refill(struct conn *c)
{
    if (c->rlen == 0)
        return false;
    size_t used = conn_frame(c, c->rbuf, c->rlen);
    memmove(c->rbuf, c->rbuf + used, c->rlen - used);
    c->rlen -= used;
    conn_release_rbuf(c);
    return used > 0;
}

/* Frame what arrived, with any unfinished line kept from before. Lines
 * beyond the read-ahead limit wait, unframed, in rbuf. */
static int conn_take(struct conn *c, const char *data, size_t len)
{
    if (c->rlen > 0) {
        if (conn_keep(c, data, len) != 0)
            return -1;
        conn_refill(c);
        return 0;
    }
    size_t used = conn_frame(c, data, len);
    if (used < len && conn_keep(c, data + used, len - used) != 0)
        return -1;
    conn_release_rbuf(c);
    return 0;
}

static void conn_update_reading(struct conn *c);

/* A client that closed and one that only shut down its sending side (`nc
 * -N`, `printf ... | nc -q1`) look the same. Answer what was read, without
 * waiting for any lock, then close: a vanished waiter leaves its queue at
 * once, a half-closed one still gets its replies. */
static void conn_on_eof(struct conn *c)
{
    if (c->tls && !c->tls_ready && !c->tls_failed) {
        counters.tls_failures[TLS_FAIL_eof]++;
        log_info("%s (%s): closed before the TLS handshake finished",
                 c->name, c->peer);
    }
    conn_ref(c);
    c->eof = true;
    conn_close_after_reply(c, "end of input", true);
    if (c->ops)
        c->ops->eof(c, c->data);    /* may answer, and run the queue */
    if (!c->closing)
        conn_process(c);
    conn_unref(c);
}

/* ---- TLS: bytes in, lines out ------------------------------------------- */

static int conn_take_plain(void *ud, const char *data, size_t len)
{
    return conn_take(ud, data, len);
}

/* The handshake finished: count it, say so, and take the client
 * certificate's CN. */
static void conn_tls_ready(struct conn *c)
{
    char how[96];

    c->tls_ready = true;
    counters.tls_handshakes++;
    snprintf(c->cert_cn, sizeof(c->cert_cn), "%s",
             tls_conn_peer_cn(c->tls));
    tls_conn_describe(c->tls, how, sizeof(how));
    log_debug("%s (%s): TLS %s%s%s", c->name, c->peer, how,
              c->cert_cn[0] ? ", client certificate CN=" : "", c->cert_cn);
}

static bool conn_write_now(struct conn *c);

/* TLS failed: one log line, counted when the handshake never finished.
 * What TLS still has to say (an alert) goes to the kernel if it takes it
 * now, and the connection closes at once: nothing more can be read or
 * written in it, and a request waiting in it ends as a vanished client's
 * does. */
static void conn_tls_failed(struct conn *c)
{
    enum tls_fail why = tls_conn_failure(c->tls);

    if (c->tls_failed || c->closing)
        return;
    c->tls_failed = true;
    if (!c->tls_ready)
        counters.tls_failures[why]++;
    log_info("%s (%s): TLS %s: %s, closing", c->name, c->peer,
             c->tls_ready ? "error" : "handshake failed",
             tls_conn_detail(c->tls));
    /* Someone typing on the TLS port reads why in their terminal. */
    if (why == TLS_FAIL_plaintext)
        sbuf_puts(&c->tls_out, "ERR ARG this port speaks TLS: connect "
                  "with tls:// and a TLS client\n");
    sbuf_reset(&c->out);
    tls_conn_seal(c->tls, &c->out, &c->tls_out);       /* the alert */
    conn_write_now(c);
    conn_close(c, true, "TLS failure");
}

static void conn_seal(struct conn *c);

/* After TLS input: what OpenSSL wrote on its own (handshake messages, key
 * updates, alerts) joins the bytes to send, and counts against
 * limits.max_output_bytes like replies do: a client that makes the daemon
 * talk without reading is disconnected. */
static int conn_tls_backlog(struct conn *c)
{
    size_t unsent;

    conn_seal(c);
    if (c->closing)
        return -1;
    unsent = c->tls_out.len + c->wbuf.len;
    if (unsent < conn_conf->limits.max_output_bytes)
        return 0;
    counters.output_overflows++;
    log_warn("%s (%s): %zu bytes of TLS records unread: disconnecting "
             "(limits.max_output_bytes)", c->name, c->peer, unsent);
    conn_close(c, true, "output buffer limit");
    return -1;
}

/* Bytes from the socket into lines: as they are, or through TLS. Non-zero
 * when the connection is closing because of them. */
static int conn_input(struct conn *c, const char *data, size_t len)
{
    bool first = !c->got_bytes;

    c->got_bytes = true;
    if (!c->tls) {
        if (first && tls_looks_like_handshake(data, len)) {
            counters.tls_failures[TLS_FAIL_plain_port]++;
            log_info("%s (%s): a TLS handshake on a plain-text port, "
                     "closing", c->name, c->peer);
            conn_close(c, true, "TLS on a plain port");
            return -1;
        }
        if (conn_take(c, data, len) != 0) {
            conn_close(c, true, "out of memory for the read buffer");
            return -1;
        }
        return 0;
    }
    enum tls_io r = tls_conn_input(c->tls, data, len, conn_take_plain, c);
    /* The handshake may finish in the same bytes that end the connection. */
    if (!c->tls_ready && tls_conn_established(c->tls))
        conn_tls_ready(c);
    switch (r) {
    case TLS_IO_OK:
        return conn_tls_backlog(c);
    case TLS_IO_CLOSED:
        conn_on_eof(c);
        return -1;
    case TLS_IO_FAILED:
    default:
        conn_tls_failed(c);
        return -1;
    }
}

int conn_use_tls(struct conn *c)
{
    c->tls = tls_conn_new();
    return c->tls ? 0 : -1;
}

static void conn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = st->data;

    if (nread > 0) {
        if (conn_input(c, buf->base, (size_t)nread) != 0)
            return;
        conn_process(c);
        conn_update_reading(c);
        if (c->tls)
            conn_flush(c);  /* handshake messages, session tickets */
        return;
    }
    if (nread == 0)         /* EAGAIN: nothing to do */
        return;
    if (nread == UV_ENOBUFS) {
        conn_close(c, true, "out of memory for the read buffer");
        return;
    }
    if (nread == UV_EOF) {
        conn_on_eof(c);
        return;
    }
    conn_close(c, true, uv_strerror((int)nread));
}

void conn_start(struct conn *c)
{
    c->reading = false;
    conn_update_reading(c);
}

/* Stop reading when the request queue is full; resume when it drains. */
static void conn_update_reading(struct conn *c)
{
    const struct conf *cf = conn_conf;
    /* Read more only when the queue has room and rbuf holds at most an
     * unfinished line, so one client's read-ahead stays bounded. */
    bool want = !c->closing && !c->close_why && !c->overflow &&
                c->qlen < cf->limits.max_pipeline &&
                c->rlen <= cf->limits.max_line;

    if (want && !c->reading) {
        if (uv_read_start(&c->h.stream, conn_alloc, conn_on_read) == 0)
            c->reading = true;
    } else if (!want && c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = false;
    }
}

/* ---- serving requests, in order ---------------------------------------- */

static struct conn_line *conn_pop(struct conn *c)
{
    struct list *p = list_first(&c->queue);

    if (!p)
        return NULL;
    list_remove(p);
    c->qlen--;
    return list_entry(p, struct conn_line, link);
}

/* A line over max_line: answered in its turn, then nothing more is. */
static void conn_toolong(struct conn *c)
{
    struct sbuf *b = conn_reply(c);

    counters.toolong++;
    if (b)
        proto_format_errf(b, PROTO_ERR_TOOLONG, "request line longer than "
                          "%u bytes (limits.max_line); closing",
                          conn_conf->limits.max_line);
    conn_stop(c, "request line too long", true);
}

void conn_process(struct conn *c)
{
    if (c->in_process)
        return;     /* an answer arrived synchronously; the loop goes on */
    c->in_process = true;
    conn_ref(c);
    while (!c->closing && !c->paused && c->ops) {
        struct conn_line *ln = conn_pop(c);
        if (!ln) {
            if (!conn_refill(c))
                break;
            continue;
        }
        if (ln->toolong) {
            free(ln);
            conn_toolong(c);
            break;
        }
        c->ops->line(c, c->data, ln->data, ln->len);
        free(ln);
    }
    c->in_process = false;
    if (!c->closing) {
        conn_want_flush(c);
        conn_update_reading(c);
    }
    conn_unref(c);
}

void conn_pause(struct conn *c)
{
    c->paused = true;
}

void conn_resume(struct conn *c)
{
    if (!c->paused)
        return;
    c->paused = false;
    conn_process(c);
}

void conn_stop(struct conn *c, const char *why, bool died)
{
    conn_queue_free(c);
    free(c->rbuf);
    c->rbuf = NULL;
    c->rlen = c->rcap = 0;
    conn_close_after_reply(c, why, died);
}

/* ---- closing with a reason -------------------------------------------- */

void conn_close_after_reply(struct conn *c, const char *why, bool died)
{
    if (c->close_why) {
        /* A QUIT read before the client's EOF and run after it (behind a
         * request in flight) is still a QUIT: the end is the client's,
         * not a dropped connection's. */
        if (!died)
            c->died = false;
        return;
    }
    c->close_why = why;
    c->died = died;
    conn_update_reading(c);
}

void conn_close_announced(struct conn *c, const char *reason,
                          const char *why)
{
    if (c->closing)
        return;
    /* Said last, whether or not a close after the replies was due. */
    c->close_event = reason;
    conn_close_after_reply(c, why, true);   /* keeps a reason given before */
}

void conn_close_now_announced(struct conn *c, const char *reason,
                              const char *why)
{
    if (c->closing)
        return;
    proto_format_event_closing(&c->out, reason);
    if (conn_write_now(c))
        conn_close(c, true, why);
}

/* ---- writing ------------------------------------------------------------ */

static void conn_on_write(uv_write_t *req, int status)
{
    struct conn *c = req->data;

    c->writing = false;
    sbuf_deinit(&c->wbuf);  /* an idle connection keeps no write memory */
    if (status < 0) {
        if (!c->closing)
            conn_close(c, true, uv_strerror(status));
    } else {
        conn_flush(c);
    }
    conn_unref(c);
}

/* The bytes that go to the socket as they are: the replies themselves, or
 * with TLS the records sealed from them. */
static struct sbuf *conn_wire(struct conn *c)
{
    return c->tls ? &c->tls_out : &c->out;
}

/* TLS: seal the replies into records (once the handshake is done; after
 * our goodbye, close_notify, nothing more may be said and they are
 * dropped). */
static void conn_seal(struct conn *c)
{
    if (c->tls_failed || c->closing)
        return;
    if (c->tls_bye)
        sbuf_reset(&c->out);
    if (tls_conn_seal(c->tls, &c->out, &c->tls_out) != 0)
        conn_tls_failed(c);
}

/* Hand what fits to the kernel now; false if the connection failed. */
static bool conn_write_now(struct conn *c)
{
    struct sbuf *w = conn_wire(c);
    uv_buf_t ub;
    int k;

    if (c->writing)
        return true;
    if (c->tls)
        conn_seal(c);
    if (c->closing)
        return false;
    if (w->len == 0)
        return true;
    ub = uv_buf_init(w->data, (unsigned)w->len);
    k = uv_try_write(&c->h.stream, &ub, 1);
    if (k > 0)
        sbuf_consume(w, (size_t)k);
    else if (k < 0 && k != UV_EAGAIN && k != UV_ENOSYS) {
        conn_close(c, true, uv_strerror(k));
        return false;
    }
    return true;
}

/* Everything is written and the connection is to close: TLS says goodbye
 * first (close_notify) when it can. True if that put bytes to send. */
static bool conn_tls_goodbye(struct conn *c)
{
    if (!c->tls || !c->tls_ready || c->tls_failed || c->tls_bye)
        return false;
    c->tls_bye = true;
    tls_conn_close_notify(c->tls);
    return true;
}

void conn_flush(struct conn *c)
{
    struct sbuf *w = conn_wire(c);

    if (c->closing || c->writing)
        return;
    if (!conn_write_now(c))
        return;
    if (w->len == 0) {
        sbuf_reset(w);
        if (c->out.len > 0) {
            /* TLS: the replies wait for the handshake, which needs
             * reading; a connection that stopped reading before it had
             * one (refused at accept, EOF) has nothing to say them in. */
            if (c->close_why && !c->tls_ready)
                conn_close(c, c->died, c->close_why);
            return;
        }
        if (!c->close_why || !list_empty(&c->queue) ||
            (c->ops && c->ops->busy && c->ops->busy(c, c->data)))
            return;
        if (c->close_event && c->tls && !c->tls_ready) {
            conn_close(c, c->died, c->close_why);   /* nothing to say it in */
            return;
        }
        if (c->close_event) {
            /* The last line: why we close (see conn_close_after_reply). */
            proto_format_event_closing(&c->out, c->close_event);
            c->close_event = NULL;
            conn_flush(c);
            return;
        }
        if (conn_tls_goodbye(c)) {
            conn_flush(c);
            return;
        }
        conn_close(c, c->died, c->close_why);
        return;
    }
    /* Swap buffers: `out` (or tls_out) keeps collecting while wbuf is in
     * flight. */
    struct sbuf tmp = c->wbuf;
    c->wbuf = *w;
    *w = tmp;
    sbuf_reset(w);

    uv_buf_t b = uv_buf_init(c->wbuf.data, (unsigned)c->wbuf.len);
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, &c->h.stream, &b, 1, conn_on_write);
    if (rc != 0) {
        conn_close(c, true, uv_strerror(rc));
        return;
    }
    c->writing = true;
    conn_ref(c);
}

const struct conn_counters *conn_counters(void)
{
    return &counters;
}

struct sbuf *conn_reply(struct conn *c)
{
    if (c->closing || c->overflow)
        return NULL;
    size_t unsent = c->out.len + c->wbuf.len + c->tls_out.len;

    if (unsent >= conn_conf->limits.max_output_bytes) {
        /* Closed at the end of the turn, not now: the caller is in the
         * middle of answering, and must not be told "closed" under it. */
        counters.output_overflows++;
        log_warn("%s (%s): %zu bytes of replies unread: disconnecting "
                 "(limits.max_output_bytes)", c->name, c->peer, unsent);
        c->overflow = true;
        conn_update_reading(c);
        conn_want_flush(c);
        return NULL;
    }
    conn_want_flush(c);
    return &c->out;
}

/* ---- closing now -------------------------------------------------------- */

static void conn_on_close(uv_handle_t *h)
{
    counters.open--;
    conn_unref(h->data);
}

void conn_close(struct conn *c, bool died, const char *why)
{
    const struct conn_ops *ops = c->ops;
    void *data = c->data;

    if (c->closing)
        return;
    c->closing = true;
    c->died = died;
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    timer_stop(&c->idle_timer);
    conn_queue_free(c);
    if (list_linked(&c->flush_link)) {
        list_remove(&c->flush_link);
        conn_unref(c);      /* its place in the turn's flush */
    }
    log_debug("%s (%s) closed: %s", c->name, c->peer, why);
    c->ops = NULL;
    c->data = NULL;
    if (ops)
        ops->closed(c, data);
    uv_close(&c->h.handle, conn_on_close);
}
