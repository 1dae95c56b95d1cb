/*
 * session: one client connection and everything it owns.
 *
 * The I/O half (conn.c, conn.h: reading, line framing, the bounded output
 * buffer, closing) and the protocol half (session.c: auth, keepalive, the
 * in-order request queue, commands) share this one struct because they
 * share one lifetime: a session lives from accept until its handle is
 * closed and the last reference to it is gone (refs == 0). Its locks are
 * lockmgr's, reached through the embedded lockmgr_owner.
 *
 * A session that asked for HELLO detach= outlives its connection: when
 * the connection ends without QUIT, its leases move to a detached record
 * (session.c, "detached sessions") that keeps them, renewed, for up to
 * detach ms, and a HELLO resume= with its id and secret on a new
 * connection moves them back (protocol.md, "Detachable sessions").
 */
#ifndef REDLOCKD_SESSION_H
#define REDLOCKD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "conn.h"
#include "list.h"
#include "lockmgr.h"
#include "proto.h"
#include "sbuf.h"
#include "timer.h"

/* A request line read ahead of its turn. */
struct line {
    struct list link;       /* in session->queue */
    bool toolong;           /* placeholder: answer ERR TOOLONG, then close */
    size_t len;
    char data[];            /* len bytes + room for a NUL */
};

struct lost_lease {         /* a resource whose lease was lost (ERR LOST) */
    struct list link;
    char resource[];
};

/* "s<n>.<start>": n counts this daemon's sessions, start is the daemon's
 * start time (ms since the epoch, base 36), so ids stay unique across
 * restarts: "s42.mifc7b9k". */
#define SESSION_ID_LEN 40

struct session {
    /* ---- I/O (conn.c) ---- */
    union conn_stream h;
    char peer[80];
    char ip[64];            /* the peer's address without the port; "" for
                               unix */
    bool trusted;           /* loopback or unix socket peer */
    char *rbuf;             /* bytes read, not yet framed */
    size_t rlen, rcap;
    struct sbuf out;        /* replies not yet handed to the kernel */
    struct sbuf wbuf;       /* bytes in the uv_write in flight */
    uv_write_t wreq;
    bool writing;
    bool reading;
    bool closing;           /* close started: no more requests */
    const char *close_why;  /* close once answered and flushed (QUIT,
                               TOOLONG, EOF, rejected); NULL = stay open */
    const char *close_event;    /* EVENT CLOSING reason= to send last */
    bool died;              /* ends without QUIT (for lock_delay) */
    bool dropped;           /* ended without QUIT, shutdown or not */
    bool eof;               /* the client sends no more: no waiting */

    /* ---- requests (session.c) ---- */
    struct list queue;      /* struct line, in arrival order */
    size_t qlen;
    struct line *cur;       /* the request being served asynchronously */
    bool busy;              /* cur is waiting for an async answer */
    uint64_t lock_started_ns;   /* uv_hrtime() of the LOCK in cur */
    bool lock_waited;           /* that LOCK allowed a wait */
    bool in_process;        /* guards session_process re-entry */

    /* ---- session state ---- */
    uint64_t id;
    char idstr[SESSION_ID_LEN];     /* "s42" */
    char name[PROTO_MAX_NAME_LEN + 1];
    bool authed;
    bool admin;             /* AUTH with auth.admin_password */
    unsigned auth_failures;
    struct timer auth_timer;    /* the answer to a wrong AUTH, delayed */
    bool got_line;          /* a first full line arrived (handshake) */
    uint32_t keepalive_ms;
    uint64_t created_at;
    uint64_t last_line_at;
    struct timer idle_timer;    /* handshake / idle / keepalive */
    struct lockmgr_owner owner; /* leases and the pending LOCK */
    uint32_t detach_ms;         /* HELLO detach=: outlive the connection */
    char secret[PROTO_SECRET_LEN + 1];  /* with detach_ms: what resumes it */
    bool resumed_away;          /* another connection took it over */
    struct detached *resume_lost;   /* (ref) the detached record resumed:
                                       its lost leases are told after the
                                       reply, then it is let go */
    struct list lost;           /* struct lost_lease */
    size_t nlost;
    char *unlock_lost;          /* (owned) UNLOCK of several in flight: the
                                   lost one its answer names, or NULL */
    int refs;
    struct list link;           /* all live sessions */
};

struct conf;

/* Before the first session: the config sessions read (live). */
void session_init(const struct conf *conf);
struct session *session_create(void);
void session_ref(struct session *s);
void session_unref(struct session *s);
/* A complete line arrived (len bytes, no LF) or a too-long one. */
void session_push_line(struct session *s, const char *data, size_t len,
                       bool toolong);
/* Any request line still queued? */
bool session_has_queued(const struct session *s);
/* Serve queued requests in order until one must wait. */
void session_process(struct session *s);
/* The client sent EOF: cut any wait short; queued requests still run. */
void session_on_eof(struct session *s);
/* The connection is closing: release everything (called once, by conn). */
void session_end(struct session *s);

/* Session table / stats. */
size_t session_count(void);
/* Detached sessions waiting for a resume now. */
size_t session_detached_count(void);
/* The daemon exits: every lease a session still holds is left on the
 * nodes to expire (lockmgr_owner_abandon), and the session is closed with
 * EVENT CLOSING reason=shutdown. Returns the leases left; *until as in
 * lockmgr_owner_abandon. */
size_t session_abandon_all(uint64_t *until);
/* Live sessions whose peer has this address (limits.max_clients_per_ip). */
size_t session_count_ip(const char *ip);
json_t *session_list_json(void);
/* Shutdown: take no new locks (session_set_shutdown); tell every client,
 * answer waiting LOCKs ERR SHUTDOWN, close the sessions that hold nothing
 * (session_shutdown_all); at the end, leave what is still held to expire
 * (session_abandon_all) and close whatever is left (session_close_all). */
void session_set_shutdown(void);
bool session_shutting_down(void);
void session_shutdown_all(void);
void session_close_all(const char *why);

#endif
