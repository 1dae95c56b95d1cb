/*
 * conn: see conn.h.
 *
 * Reading: a partial line waits in the session's rbuf for the rest; a line
 * longer than max_line becomes a TOOLONG placeholder and the rest of what
 * was read is dropped, since the connection closes after answering it.
 * After EOF the requests already read are answered (LOCKs without
 * waiting), then the session ends and its locks are released.
 *
 * Writing: replies accumulate in `out`. conn_flush first tries a direct
 * write (most replies fit in the socket buffer at once, which saves the
 * uv_write round through the loop); whatever is left goes out in one
 * uv_write at a time from wbuf while `out` keeps collecting.
 */
#include "conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "session.h"
#include "stats.h"

#define CONN_READ_SIZE 65536

/* Reads land in one loop-wide buffer; a session keeps its own buffer only
 * for an unfinished line, so an idle connection costs no read memory. */
static char conn_rdbuf[CONN_READ_SIZE];

static const struct conf *conn_conf;     /* limits.*: read live */

void conn_init(const struct conf *conf)
{
    conn_conf = conf;
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = conn_rdbuf;
    buf->len = sizeof(conn_rdbuf);
}

static int conn_keep(struct session *s, const char *p, size_t n)
{
    if (s->rcap - s->rlen < n) {
        size_t ncap = s->rcap ? s->rcap : 256;
        while (ncap - s->rlen < n)
            ncap *= 2;
        char *nb = realloc(s->rbuf, ncap);
        if (!nb)
            return -1;
        s->rbuf = nb;
        s->rcap = ncap;
    }
    memcpy(s->rbuf + s->rlen, p, n);
    s->rlen += n;
    return 0;
}

/* Split complete lines out of buf[0..len) into the session's queue;
 * returns how many bytes were consumed. */
static size_t conn_frame(struct session *s, const char *buf, size_t len)
{
    const struct conf *c = conn_conf;
    size_t start = 0;

    while (!s->closing && s->qlen < c->limits.max_pipeline) {
        const char *lf = memchr(buf + start, '\n', len - start);
        size_t n = lf ? (size_t)(lf - (buf + start)) : len - start;
        if (n > c->limits.max_line) {
            session_push_line(s, NULL, 0, true);
            return len;
        }
        if (!lf)
            break;
        session_push_line(s, buf + start, n, false);
        start += n + 1;
    }
    return start;
}

static void conn_release_rbuf(struct session *s)
{
    if (s->rlen == 0 && s->rcap > 0) {
        free(s->rbuf);
        s->rbuf = NULL;
        s->rcap = 0;
    }
}

bool conn_refill(struct session *s)
{
    if (s->rlen == 0)
        return false;
    size_t used = conn_frame(s, s->rbuf, s->rlen);
    memmove(s->rbuf, s->rbuf + used, s->rlen - used);
    s->rlen -= used;
    conn_release_rbuf(s);
    return used > 0;
}

/* Frame what arrived, with any unfinished line kept from before. Lines
 * beyond the read-ahead limit wait, unframed, in rbuf. */
static int conn_take(struct session *s, const char *data, size_t len)
{
    if (s->rlen > 0) {
        if (conn_keep(s, data, len) != 0)
            return -1;
        conn_refill(s);
        return 0;
    }
    size_t used = conn_frame(s, data, len);
    if (used < len && conn_keep(s, data + used, len - used) != 0)
        return -1;
    conn_release_rbuf(s);
    return 0;
}

static void conn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct session *s = st->data;

    if (nread > 0) {
        if (conn_take(s, buf->base, (size_t)nread) != 0) {
            conn_close(s, true, "out of memory for the read buffer");
            return;
        }
        session_process(s);
        conn_update_reading(s);
        return;
    }
    if (nread == 0)         /* EAGAIN: nothing to do */
        return;
    if (nread == UV_ENOBUFS) {
        conn_close(s, true, "out of memory for the read buffer");
        return;
    }
    if (nread == UV_EOF) {
        /* A client that closed and one that only shut down its sending
         * side (`nc -N`, `printf ... | nc -q1`) look the same. Answer what
         * was read, without waiting for any lock, then end the session: a
         * vanished waiter leaves its queue at once, a half-closed one still
         * gets its replies. */
        s->eof = true;
        conn_close_after_reply(s, "end of input", true);
        session_on_eof(s);
        if (!s->closing)
            conn_flush(s);
        return;
    }
    conn_close(s, true, uv_strerror((int)nread));
}

void conn_start(struct session *s)
{
    s->h.handle.data = s;
    s->reading = false;
    conn_update_reading(s);
}

void conn_update_reading(struct session *s)
{
    const struct conf *c = conn_conf;
    /* Read more only when the queue has room and rbuf holds at most an
     * unfinished line, so one client's read-ahead stays bounded. */
    bool want = !s->closing && !s->close_why &&
                s->qlen < c->limits.max_pipeline &&
                s->rlen <= c->limits.max_line;

    if (want && !s->reading) {
        if (uv_read_start(&s->h.stream, conn_alloc, conn_on_read) == 0)
            s->reading = true;
    } else if (!want && s->reading) {
        uv_read_stop(&s->h.stream);
        s->reading = false;
    }
}

static bool conn_write_now(struct session *s);

void conn_close_after_reply(struct session *s, const char *why, bool died)
{
    if (s->close_why)
        return;
    s->close_why = why;
    s->died = died;
    conn_update_reading(s);
}

void conn_close_announced(struct session *s, const char *reason,
                          const char *why)
{
    if (s->closing)
        return;
    /* Said last, whether or not a close after the replies was due. */
    s->close_event = reason;
    conn_close_after_reply(s, why, true);   /* keeps a reason given before */
}

void conn_close_now_announced(struct session *s, const char *reason,
                              const char *why)
{
    if (s->closing)
        return;
    proto_format_event_closing(&s->out, reason);
    if (conn_write_now(s))
        conn_close(s, true, why);
}

/* ---- writing ------------------------------------------------------------ */

static void conn_on_write(uv_write_t *req, int status)
{
    struct session *s = req->data;

    s->writing = false;
    sbuf_deinit(&s->wbuf);  /* an idle session keeps no write memory */
    if (status < 0) {
        if (!s->closing)
            conn_close(s, true, uv_strerror(status));
    } else {
        conn_flush(s);
    }
    session_unref(s);
}

/* Hand what fits to the kernel now; false if the connection failed. */
static bool conn_write_now(struct session *s)
{
    uv_buf_t ub;
    int k;

    if (s->writing || s->out.len == 0)
        return true;
    ub = uv_buf_init(s->out.data, (unsigned)s->out.len);
    k = uv_try_write(&s->h.stream, &ub, 1);
    if (k > 0)
        sbuf_consume(&s->out, (size_t)k);
    else if (k < 0 && k != UV_EAGAIN && k != UV_ENOSYS) {
        conn_close(s, true, uv_strerror(k));
        return false;
    }
    return true;
}

void conn_flush(struct session *s)
{
    if (s->closing || s->writing)
        return;
    if (!conn_write_now(s))
        return;
    if (s->out.len == 0) {
        sbuf_reset(&s->out);
        if (!s->close_why || s->busy || session_has_queued(s))
            return;
        if (s->close_event) {
            /* The last line: why we close (see conn_close_after_reply). */
            proto_format_event_closing(&s->out, s->close_event);
            s->close_event = NULL;
            conn_flush(s);
            return;
        }
        conn_close(s, s->died, s->close_why);
        return;
    }
    /* Swap buffers: `out` keeps collecting while wbuf is in flight. */
    struct sbuf tmp = s->wbuf;
    s->wbuf = s->out;
    s->out = tmp;
    sbuf_reset(&s->out);

    uv_buf_t b = uv_buf_init(s->wbuf.data, (unsigned)s->wbuf.len);
    s->wreq.data = s;
    int rc = uv_write(&s->wreq, &s->h.stream, &b, 1, conn_on_write);
    if (rc != 0) {
        conn_close(s, true, uv_strerror(rc));
        return;
    }
    s->writing = true;
    session_ref(s);
}

/* The output buffer for one more line, or NULL when the session is
 * closing or has stopped reading its replies (then it is closed). */
static struct sbuf *conn_out(struct session *s)
{
    const struct conf *c = conn_conf;

    if (s->closing)
        return NULL;
    if (s->out.len + s->wbuf.len >= c->limits.max_output_bytes) {
        stats.output_overflows++;
        log_warn("%s (%s): %zu bytes of replies unread: disconnecting "
                 "(limits.max_output_bytes)", s->idstr, s->peer,
                 s->out.len + s->wbuf.len);
        conn_close_now_announced(s, "output", "output buffer limit");
        return NULL;
    }
    return &s->out;
}

/* The line being built by conn_ok_begin, if it was begun. */
static struct sbuf *conn_cont(struct session *s)
{
    return s->closing ? NULL : &s->out;
}

void conn_ok(struct session *s)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_ok(b);
}

void conn_ok_begin(struct session *s)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_ok_begin(b);
}

void conn_kv_str(struct session *s, const char *key, const char *val)
{
    struct sbuf *b = conn_cont(s);
    if (b)
        proto_format_kv_str(b, key, val);
}

void conn_kv_u64(struct session *s, const char *key, uint64_t val)
{
    struct sbuf *b = conn_cont(s);
    if (b)
        proto_format_kv_u64(b, key, val);
}

void conn_kv_i64(struct session *s, const char *key, int64_t val)
{
    struct sbuf *b = conn_cont(s);
    if (b)
        proto_format_kv_i64(b, key, val);
}

void conn_word(struct session *s, const char *word)
{
    struct sbuf *b = conn_cont(s);
    if (b)
        proto_format_word(b, word);
}

void conn_end(struct session *s)
{
    struct sbuf *b = conn_cont(s);
    if (b)
        proto_format_end(b);
}

void conn_json(struct session *s, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    struct sbuf *b;

    json_decref(j);
    if (!text) {
        conn_err(s, PROTO_ERR_LIMIT, "out of memory building the reply");
        return;
    }
    b = conn_out(s);
    if (b)
        proto_format_ok_json(b, text);
    free(text);
}

void conn_pong(struct session *s, const char *word, size_t len)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_pong(b, word, len);
}

void conn_help(struct session *s)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_help(b);
}

void conn_usage(struct session *s, enum proto_cmd cmd)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_usage(b, cmd);
}

void conn_err(struct session *s, enum proto_err code, const char *msg)
{
    struct sbuf *b = conn_out(s);

    stats_count_error(code);
    if (b)
        proto_format_err(b, code, msg);
}

void conn_errf(struct session *s, enum proto_err code, const char *fmt, ...)
{
    struct sbuf msg = SBUF_INIT;
    va_list ap;

    va_start(ap, fmt);
    sbuf_vprintf(&msg, fmt, ap);
    va_end(ap);
    conn_err(s, code, msg.data);
    sbuf_deinit(&msg);
}

void conn_event_lost(struct session *s, const char *resource, uint64_t fence,
                     const char *reason)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_event_lost(b, resource, fence, reason);
}

void conn_event_shutdown(struct session *s)
{
    struct sbuf *b = conn_out(s);
    if (b)
        proto_format_event_shutdown(b);
}

/* ---- closing ------------------------------------------------------------ */

static void conn_on_close(uv_handle_t *h)
{
    stats.connections--;
    session_unref(h->data);
}

void conn_close(struct session *s, bool died, const char *why)
{
    if (s->closing)
        return;
    s->closing = true;
    s->dropped = died;
    /* At shutdown every session ends by our doing: no lock-delay. */
    s->died = died && !session_shutting_down();
    if (s->reading)
        uv_read_stop(&s->h.stream);
    s->reading = false;
    log_debug("%s (%s) closed: %s", s->idstr, s->peer, why);
    session_end(s);
    uv_close(&s->h.handle, conn_on_close);
}
