/*
 * session: one client connection and everything it owns.
 *
 * The I/O half (conn.c: reading, line framing, the bounded output buffer,
 * closing) and the protocol half (session.c: auth, keepalive, the in-order
 * request queue, commands, leases) share this one struct because they share
 * one lifetime: a session lives from accept until its handle is closed and
 * the last async operation referring to it has finished (refs == 0).
 */
#ifndef REDLOCKD_SESSION_H
#define REDLOCKD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "lockmgr.h"
#include "proto.h"
#include "sbuf.h"
#include "timer.h"

struct conf;

/* A request line read ahead of its turn. */
struct line {
    struct line *next;
    bool toolong;           /* placeholder: answer ERR TOOLONG, then close */
    size_t len;
    char data[];            /* len bytes + room for a NUL */
};

struct lost_lease {         /* a resource whose lease was lost (ERR LOST) */
    struct lost_lease *next;
    char resource[];
};

struct session {
    /* ---- I/O (conn.c) ---- */
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    char peer[80];
    bool trusted;           /* loopback or unix socket peer */
    char *rbuf;             /* bytes read, not yet framed */
    size_t rlen, rcap;
    struct sbuf out;        /* replies not yet handed to libuv */
    struct sbuf wbuf;       /* bytes in the uv_write in flight */
    uv_write_t wreq;
    bool writing;
    bool reading;
    bool closing;           /* close started: no more requests */
    bool close_after_write; /* QUIT, TOOLONG, EOF: answer what was read,
                               flush, then close */
    bool quit;              /* QUIT, TOOLONG: nothing more is read or run */
    bool died;              /* ended without QUIT (for lock_delay) */
    bool eof;               /* the client sends no more: no waiting */

    /* ---- requests (session.c) ---- */
    struct line *qhead, *qtail;
    size_t qlen;
    struct line *cur;       /* the request being served asynchronously */
    bool busy;              /* cur is waiting for an async answer */
    bool in_process;        /* guards session_process re-entry */

    /* ---- session state ---- */
    uint64_t id;
    char idstr[24];         /* "s42" */
    char name[PROTO_MAX_NAME_LEN + 1];
    bool authed;
    bool got_line;          /* a first full line arrived (handshake) */
    uint32_t keepalive_ms;
    uint64_t created_at;
    uint64_t last_line_at;
    struct timer idle_timer;    /* handshake / idle / keepalive */
    struct lease *leases;       /* list via s_next */
    size_t nleases;
    struct lockreq *lockreq;    /* (lockmgr's) a LOCK queued or in flight */
    struct lost_lease *lost;
    size_t nlost;
    int refs;
    struct session *prev, *next;    /* all sessions */
};

/* ---- conn.c: I/O ---- */
/* Start reading a freshly accepted stream (h already initialised). */
void conn_start(struct session *s);
/* Queue one complete reply line; closes a client that does not read. */
void conn_send(struct session *s, const char *data, size_t len);
void conn_send_buf(struct session *s, struct sbuf *b);
/* Hand queued output to libuv. */
void conn_flush(struct session *s);
/* Queue lines still waiting in rbuf (read ahead of the pipeline limit);
 * true if any were queued. */
bool conn_refill(struct session *s);
/* Stop reading when the request queue is full; resume when it drains. */
void conn_update_reading(struct session *s);
/* Close now; `died` says whether this is a drop (for lock_delay). */
void conn_close(struct session *s, bool died, const char *why);

/* ---- session.c ---- */
struct session *session_create(const struct conf *conf);
void session_ref(struct session *s);
void session_unref(struct session *s);
/* A complete line arrived (len bytes, no LF) or a too-long one. */
void session_push_line(struct session *s, const char *data, size_t len,
                       bool toolong);
/* Serve queued requests in order until one must wait. */
void session_process(struct session *s);
/* The client sent EOF: cut any wait short; queued requests still run. */
void session_on_eof(struct session *s);
/* The connection is closing: release everything (called once, by conn). */
void session_end(struct session *s);
/* Send EVENT SHUTDOWN and stop taking new locks. */
void session_shutdown_notice(struct session *s);

/* Answers from lockmgr. */
void session_lock_done(struct session *s, struct lease *l, enum proto_err err,
                       const char *msg);
void session_unlock_done(struct session *s, const char *resource, int nodes,
                         enum proto_err err);
void session_extend_done(struct session *s, struct lease *l,
                         enum proto_err err, int64_t validity);
void session_status_done(struct session *s, json_t *status);
void session_lease_lost(struct session *s, struct lease *l,
                        enum lockmgr_lost_reason why);
/* Lease list maintenance (lockmgr). */
void session_add_lease(struct session *s, struct lease *l);
void session_remove_lease(struct session *s, struct lease *l);

/* Session table / stats. */
size_t session_count(void);
json_t *session_list_json(void);
void session_close_all(const char *why);
void session_set_shutdown(void);
bool session_shutting_down(void);

#endif
