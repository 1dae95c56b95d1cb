/*
 * conn: the I/O half of a session (see session.h).
 *
 * Reading: bytes are split into lines at LF (a partial line waits in the
 * session's rbuf for the rest); each line is
 * queued on the session (read-ahead up to max_pipeline, then reading stops
 * until the queue drains). A line longer than max_line becomes a TOOLONG
 * placeholder; reading stops for good since the connection closes after
 * answering it. After EOF the requests already read are answered (LOCKs
 * without waiting), then the session ends and its locks are released.
 *
 * Writing: replies accumulate in `out` and go to the kernel in one uv_write
 * at a time. A client whose unsent output has reached max_output_bytes is
 * not reading its replies; it is disconnected rather than allowed to grow
 * our memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "stats.h"

#define CONN_READ_SIZE 65536

/* Reads land in one loop-wide buffer; a session keeps its own buffer only
 * for an unfinished line, so an idle connection costs no read memory. */
static char conn_rdbuf[CONN_READ_SIZE];

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
    const struct conf *c = server.conf;
    size_t start = 0;

    while (!s->quit && !s->closing &&
           s->qlen < c->limits.max_pipeline) {
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
    } else {
        size_t used = conn_frame(s, data, len);
        if (used < len && !s->quit && conn_keep(s, data + used,
                                                             len - used) != 0)
            return -1;
    }
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
        s->reading = false;
        uv_read_stop(&s->h.stream);
        s->eof = true;
        s->died = true;
        s->close_after_write = true;
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
    const struct conf *c = server.conf;
    /* Read more only when the queue has room and rbuf holds at most an
     * unfinished line, so one client's read-ahead stays bounded. */
    bool want = !s->closing && !s->close_after_write &&
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

static void conn_on_write(uv_write_t *req, int status)
{
    struct session *s = req->data;

    s->writing = false;
    sbuf_deinit(&s->wbuf);  /* an idle session keeps no write memory */
    if (status < 0) {
        if (!s->closing)
            conn_close(s, true, uv_strerror(status));
        session_unref(s);
        return;
    }
    conn_flush(s);
    session_unref(s);
}

void conn_flush(struct session *s)
{
    if (s->closing || s->writing)
        return;
    if (s->out.len == 0) {
        if (s->close_after_write && !s->busy && !s->qhead)
            conn_close(s, s->died, "done");
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

void conn_send(struct session *s, const char *data, size_t len)
{
    const struct conf *c = server.conf;

    if (s->closing)
        return;
    if (s->out.len + s->wbuf.len >= c->limits.max_output_bytes) {
        stats.output_overflows++;
        log_warn("%s (%s): %zu bytes of replies unread: disconnecting "
                 "(limits.max_output_bytes)", s->idstr, s->peer,
                 s->out.len + s->wbuf.len);
        conn_close(s, true, "output buffer limit");
        return;
    }
    sbuf_append(&s->out, data, len);
}

void conn_send_buf(struct session *s, struct sbuf *b)
{
    conn_send(s, b->data, b->len);
}

static void conn_on_close(uv_handle_t *h)
{
    session_unref(h->data);
}

void conn_close(struct session *s, bool died, const char *why)
{
    if (s->closing)
        return;
    s->closing = true;
    /* At shutdown every session ends by our doing: no lock-delay. */
    s->died = died && !session_shutting_down();
    if (s->reading)
        uv_read_stop(&s->h.stream);
    s->reading = false;
    log_debug("%s (%s) closed: %s", s->idstr, s->peer, why);
    session_end(s);
    uv_close(&s->h.handle, conn_on_close);
}
