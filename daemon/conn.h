/*
 * conn: one client connection, and nothing of what its lines mean.
 *
 * It owns the stream, the peer's address, the read buffer and the line
 * framing, the in-order queue of request lines, the bounded output buffer
 * and its writes, the quiet-connection timer (handshake, idle, keepalive)
 * and closing with a reason. Whoever the lines are for (a session) binds
 * itself with conn_bind and is reached only through struct conn_ops, so
 * conn knows no session: a session may outlive its connection (detached)
 * and move to another one (resume), conn never notices.
 *
 * Reading: bytes are split into lines at LF and queued (read-ahead up to
 * max_pipeline, then reading stops until the queue drains). Each line goes
 * to ops->line in order, as soon as it is read, unless the binder paused
 * the connection (conn_pause: it takes no more lines for now, e.g. while
 * a request that must run alone is answered); conn_resume goes on. What a
 * line means, and when it is answered, is the binder's. Writing: the
 * binder formats each reply or event into the buffer conn_reply hands out
 * (proto's formatters); everything written during one loop turn is handed
 * to the kernel at its end, in as few writes as it takes. A client whose
 * unsent output reaches max_output_bytes is not reading its replies and is
 * disconnected.
 *
 * Closing is one decision with one reason: conn_close_after_reply (answer
 * what is queued, flush, then close) or conn_close (now). ops->closed is
 * the last call conn makes to its binder.
 *
 * Lifetime: a conn is freed when its handle's close callback has run and
 * no write or caller holds a reference any more (conn_ref/conn_unref). The
 * binder holds no reference: ops->closed comes before the handle closes,
 * and after it the binder forgets the conn.
 *
 * Counting: what happens to connections (opened, overflowed, TLS
 * handshakes and their failures, ERR TOOLONG) is counted here, in struct
 * conn_counters, which stats_glue.c reads; conn knows no stats.
 */
#ifndef REDLOCKD_CONN_H
#define REDLOCKD_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "list.h"
#include "proto.h"
#include "sbuf.h"
#include "timer.h"
#include "tls.h"

struct conf;
struct conn;

/* A client connection or a listener: a TCP or a unix stream. */
union conn_stream {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
};

/* What a conn tells the one it serves (data: conn_bind's). */
struct conn_ops {
    /* Serve one request line: len bytes without the LF, NUL-terminated
     * (line is the callee's to parse in place until it returns; it keeps
     * a copy of what it needs later). */
    void (*line)(struct conn *c, void *data, char *line, size_t len);
    /* Does the binder still owe answers to lines it was given? A close
     * after the replies (EOF, QUIT) waits for them. NULL: never. */
    bool (*busy)(struct conn *c, void *data);
    /* The client sends no more (EOF): cut any wait short. The lines read
     * before it are still served. */
    void (*eof)(struct conn *c, void *data);
    /* The connection is closing (c->died: without QUIT): let go of it. No
     * ops call follows; c's fields stay readable during this call. */
    void (*closed)(struct conn *c, void *data);
};

/* A request line read ahead of its turn. */
struct conn_line {
    struct list link;       /* in conn->queue */
    bool toolong;           /* placeholder: answer ERR TOOLONG, then close */
    size_t len;
    char data[];            /* len bytes + room for a NUL */
};

/* Room for the binder's name in log lines ("s42.mifc7b9k"). */
#define CONN_NAME_LEN 48

/* Fields are conn.c's. The server sets up h, peer, ip and trusted before
 * conn_start; others only read peer, ip, trusted, cert_cn, name, eof,
 * died, created_at and last_line_at. */
struct conn {
    union conn_stream h;
    char peer[80];
    char ip[64];            /* the peer's address without the port; "" for
                               unix */
    bool trusted;           /* loopback or unix socket peer */
    char cert_cn[64];       /* subject CN of a verified client certificate;
                               "" if none */
    const struct conn_ops *ops;     /* NULL: bound to nobody */
    void *data;
    char name[CONN_NAME_LEN];       /* the binder's, for log lines */

    /* ---- reading and the request queue ---- */
    char *rbuf;             /* bytes read, not yet framed */
    size_t rlen, rcap;
    bool reading;
    bool eof;               /* the client sends no more: no waiting */
    struct list queue;      /* struct conn_line, in arrival order */
    size_t qlen;
    bool paused;            /* the binder takes no lines now (conn_pause) */
    bool in_process;        /* guards conn_process re-entry */

    /* ---- quiet connections: handshake, idle, keepalive ---- */
    uint64_t created_at;
    uint64_t last_line_at;
    bool got_line;          /* a first full line arrived (handshake) */
    uint32_t keepalive_ms;
    struct timer idle_timer;

    /* ---- TLS (tls:// listeners; see tls.h) ---- */
    struct tls_conn *tls;   /* NULL: plain text */
    struct sbuf tls_out;    /* sealed bytes not yet handed to the kernel */
    bool tls_ready;         /* the handshake finished */
    bool tls_failed;        /* no more TLS: what is sealed goes, then close */
    bool tls_bye;           /* close_notify queued */
    bool got_bytes;         /* anything arrived (a plain port's TLS check) */

    /* ---- writing ---- */
    struct sbuf out;        /* replies not yet handed to the kernel (with
                               TLS: not yet sealed) */
    struct sbuf wbuf;       /* bytes in the uv_write in flight */
    uv_write_t wreq;
    bool writing;
    struct list flush_link; /* in the turn's flush list (a reference) */
    bool overflow;          /* unread output over the limit: closes at the
                               end of the turn */

    /* ---- closing ---- */
    bool closing;           /* close started: no more requests */
    const char *close_why;  /* close once answered and flushed (QUIT,
                               TOOLONG, EOF, rejected); NULL = stay open */
    const char *close_event;    /* EVENT CLOSING reason= to send last */
    bool died;              /* ends without QUIT (a drop) */
    int refs;
};

/* What conn counts (for STATS and /metrics, through stats_glue.c). */
struct conn_counters {
    size_t open;                    /* made and not closed yet */
    uint64_t output_overflows;      /* closed for not reading their output
                                       (limits.max_output_bytes) */
    uint64_t toolong;               /* ERR TOOLONG sent (limits.max_line) */
    uint64_t tls_handshakes;        /* TLS handshakes completed */
    uint64_t tls_failures[TLS_FAIL_N];  /* closed before a TLS handshake
                                           completed, by reason */
};

const struct conn_counters *conn_counters(void);

/* The limits conn applies are read from conf at each use (a reload
 * changes them in place); loop runs the end-of-turn flush, whose handle
 * conn_deinit closes. */
void conn_init(uv_loop_t *loop, const struct conf *conf);
void conn_deinit(void);
/* A new connection's handle on loop (a pipe or a TCP stream), ready for
 * uv_accept; NULL (and *rc) when libuv refuses. Its handshake timer runs
 * from now. */
struct conn *conn_create(uv_loop_t *loop, bool is_unix, int *rc);
void conn_ref(struct conn *c);
void conn_unref(struct conn *c);
/* Serve ops/data from now on (NULL: nobody; then lines are not served and
 * closing tells nobody). name labels the connection in log lines. */
void conn_bind(struct conn *c, const struct conn_ops *ops, void *data,
               const char *name);
/* Speak TLS on this accepted stream (a tls:// listener's), before
 * conn_start: 0, or -1 when no TLS state could be made. */
int conn_use_tls(struct conn *c);
/* Start reading a freshly accepted stream. */
void conn_start(struct conn *c);
/* The client's HELLO keepalive= (0: none): close after that long quiet. */
void conn_set_keepalive(struct conn *c, uint32_t ms);

/* ---- serving requests ---- */
/* Serve queued lines in order until the binder pauses. */
void conn_process(struct conn *c);
/* The binder takes no more lines for now. */
void conn_pause(struct conn *c);
/* It does again: serve what is queued. */
void conn_resume(struct conn *c);

/* ---- replies ---- */
/* The buffer to append one or more complete lines to (proto's
 * formatters), written at the end of this loop turn; NULL when the
 * connection is closing or its client stopped reading (then it is being
 * closed: drop the reply). */
struct sbuf *conn_reply(struct conn *c);

/* Hand queued output to the kernel (a direct write first, libuv for the
 * rest); closes the connection once a close-after-reply is due. */
void conn_flush(struct conn *c);
/* Read no more; close once the queued requests are answered and the
 * output is written. `died` says whether this counts as a drop (for
 * lock_delay and detaching). The first reason given is kept, but a later
 * one that is no drop (a QUIT run after the client's EOF) makes it none. */
void conn_close_after_reply(struct conn *c, const char *why, bool died);
/* As conn_close_after_reply, and the lines already read are dropped
 * unanswered: nothing after QUIT (or a too-long line) is served. */
void conn_stop(struct conn *c, const char *why, bool died);
/* The daemon closes this connection on its own (reason: handshake, idle,
 * keepalive, output, auth, shutdown, resumed): the client hears one
 * "EVENT CLOSING reason=..." line first, when it can. _announced closes
 * after the replies already due, _now_announced at once. Either counts as
 * a drop. */
void conn_close_announced(struct conn *c, const char *reason,
                          const char *why);
void conn_close_now_announced(struct conn *c, const char *reason,
                              const char *why);
/* Close now. */
void conn_close(struct conn *c, bool died, const char *why);

#endif
