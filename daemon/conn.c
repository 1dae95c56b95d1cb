/*
 * conn: the I/O half of a session (see session.h).
 *
 * Reading: bytes go into rbuf and are split into lines at LF; each line is
 * queued on the session (read-ahead up to max_pipeline, then reading stops
 * until the queue drains). A line longer than max_line becomes a TOOLONG
 * placeholder; reading stops for good since the connection closes after
 * answering it. EOF ends the session at once: requests still queued are
 * dropped, pending waits cancelled, locks released.
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

#define CONN_READ_CHUNK 4096

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct session *s = h->data;
    (void)suggested;

    if (s->rcap - s->rlen < CONN_READ_CHUNK) {
        size_t ncap = s->rcap ? s->rcap * 2 : CONN_READ_CHUNK * 2;
        while (ncap - s->rlen < CONN_READ_CHUNK)
            ncap *= 2;
        char *n = realloc(s->rbuf, ncap);
        if (!n) {
            buf->base = NULL;
            buf->len = 0;
            return;
        }
        s->rbuf = n;
        s->rcap = ncap;
    }
    buf->base = s->rbuf + s->rlen;
    buf->len = s->rcap - s->rlen;
}

/* Split complete lines out of rbuf into the session's queue. */
static void conn_frame(struct session *s)
{
    const struct conf *c = server.conf;
    size_t start = 0;

    while (!s->close_after_write && !s->closing) {
        char *lf = memchr(s->rbuf + start, '\n', s->rlen - start);
        size_t len = lf ? (size_t)(lf - (s->rbuf + start)) : s->rlen - start;
        if (len > c->limits.max_line) {
            session_push_line(s, NULL, 0, true);
            s->rlen = 0;
            return;
        }
        if (!lf)
            break;
        session_push_line(s, s->rbuf + start, len, false);
        start += len + 1;
    }
    if (start > 0) {
        memmove(s->rbuf, s->rbuf + start, s->rlen - start);
        s->rlen -= start;
    }
}

static void conn_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct session *s = st->data;
    (void)buf;

    if (nread > 0) {
        s->rlen += (size_t)nread;
        conn_frame(s);
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
        /* The connection is gone (a half-closed socket looks the same):
         * end the session now, as Redis does, so a dropped waiter is not
         * served and its locks are released at once. */
        conn_close(s, true, "client closed the connection");
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
    bool want = !s->closing && !s->close_after_write &&
                s->qlen < c->limits.max_pipeline;

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
    sbuf_reset(&s->wbuf);
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
    s->died = died;
    if (s->reading)
        uv_read_stop(&s->h.stream);
    s->reading = false;
    log_debug("%s (%s) closed: %s", s->idstr, s->peer, why);
    session_end(s);
    uv_close(&s->h.handle, conn_on_close);
}
