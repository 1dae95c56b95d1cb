/*
 * The inside of a libredlockd handle, shared by the library's files and
 * by nothing else (not installed, not exported: client/redlockd.map lists
 * the public symbols). The library is split by concern, in layers, top
 * down: a file calls only files listed below it, never one above (the
 * connection layer hands what it reads back through struct rl_conn_hooks,
 * which the handle sets):
 *
 *   redlockd_handle.c    the handle: made, connected, closed, forgotten,
 *                        and what it tells; wires the connection to the
 *                        layers above it (the hooks) and frees what each
 *                        of them owns
 *   redlockd_inflight.c  several requests in flight: submissions, their
 *                        tags, their answers handed out in turn
 *   redlockd_calls.c     the blocking commands of redlockd.h (LOCK,
 *                        UNLOCK, EXTEND, the inspections, watching...):
 *                        the start and end of a call, its request line,
 *                        what its answer means for the lease table
 *   redlockd_failover.c  the options and servers, the handshake (HELLO
 *                        detach=, AUTH), what a dropped connection means
 *                        for the session, reconnecting: resume on the same
 *                        daemon or ADOPT every lease on another
 *   redlockd_lease.c     the table of leases, their deadlines and states,
 *                        EVENT LOST and the application's on_lost, the
 *                        LOCKS refresh that moves the deadlines on
 *   redlockd_watch.c     watching: the resources watched, EVENT HOLDER,
 *                        WATCH again on a new session, STATUS's holder
 *                        (beside the leases: neither calls the other)
 *   redlockd_conn.c      one connection: addresses, connecting, the input
 *                        buffer, sending a request and reading its reply,
 *                        the connection's own events (SHUTDOWN, CLOSING)
 *   redlockd_tls.c       TLS under a connection to a tls:// server: the
 *                        settings, the handshake, reads and writes
 *   redlockd_base.c      errors and the codes' texts, clocks, the poll()
 *                        wait, small readers
 *
 * Every time here is CLOCK_MONOTONIC milliseconds; a deadline of -1 means
 * none.
 */
#ifndef REDLOCKD_CLIENT_PRIV_H
#define REDLOCKD_CLIENT_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"
#include "redlockd.h"
#include "redlockd_internal.h"

#define RL_CONNECT_TIMEOUT_MS 5000
#define RL_IO_TIMEOUT_MS 10000
#define RL_DETACH_MS 30000
#define RL_RECONNECT_MIN_MS 50
#define RL_RECONNECT_MAX_MS 1000
#define RL_PASSWORD_MAX 1024
/* The longest request line: LOCK with a resource of the longest size, the
 * longest value and every other option (AUTH's password and a resuming
 * HELLO are shorter). */
#define RL_REQ_MAX (REDLOCKD_RESOURCE_MAX + REDLOCKD_VALUE_MAX + 128)

/* Room for "#<id> " in front of a request line. */
#define RL_TAG_ROOM 24

/* A submitted request (redlockd_inflight.c). */
struct rl_sub;

/* OpenSSL's types, without its headers (only redlockd_tls.c needs them). */
struct ssl_st;
struct ssl_ctx_st;
struct bio_method_st;

/* What our socket BIO (redlockd_tls.c) reads and writes. */
struct rl_tls_link {
    int fd;
    size_t rx;                  /* bytes received: 0 in a handshake that
                                   fails means no TLS answer at all */
};

/*
 * A lease of the handle: held from LOCK (or lockv) to UNLOCK, or reported
 * lost and kept, so that redlockd_lost() can say so, until the resource is
 * taken again. Its session may change under it: a resumed session keeps
 * it as it is, a new one takes it over with ADOPT (a new token).
 */
struct rl_lease {
    char *resource;
    char token[REDLOCKD_TOKEN_LEN + 1]; /* the leases of one multi-resource
                                           grant share it: one ADOPT each */
    uint64_t fence;             /* 0 when only an ERR LOST named it */
    uint32_t ttl;
    int64_t validity;           /* as the last confirmation reported it */
    /* The send time of the request that last confirmed the lease plus the
     * validity its reply reported (and no more than the session is sure
     * to outlive a lost connection: rl_lease_confirm). */
    int64_t deadline;
    bool renew;
    bool lost;                  /* EVENT LOST, ERR LOST, NOTHELD, missing
                                   from LOCKS, deadline passed unconfirmed,
                                   ADOPT refused */
    bool confirmed;             /* by the current connection */
    bool attached;              /* held by the current session (a fresh
                                   session holds nothing until ADOPT) */
    bool releasing;             /* an UNLOCK of it is under way */
};

/*
 * What the connection layer (redlockd_conn.c) hands back to the layers
 * above it, none of which it calls by name: one table for every handle,
 * set when the handle is made (redlockd_handle.c).
 */
struct rl_conn_hooks {
    /* An EVENT line that is not the connection's own (SHUTDOWN, CLOSING):
     * LOST, HOLDER, or one for newer clients. 0, or -code (the connection
     * then dropped). */
    int (*event)(struct redlockd *h, const struct proto_reply *ev);
    /* A tagged line ("#<id> ..."): the answer to a submission, taken (1),
     * or the blocking request's own (0); -code when no request has that
     * tag (the connection then dropped). */
    int (*tagged)(struct redlockd *h, char *line, size_t len);
    /* The line to send for the blocking request in b: b itself, or, while
     * submissions are in flight, b tagged (h->call_id its tag). NULL when
     * out of memory (h->err set). */
    const struct sbuf *(*call_line)(struct redlockd *h, const struct sbuf *b);
    /* The connection just closed (rl_drop): what that means for the
     * requests in flight, the session and its leases. */
    void (*dropped)(struct redlockd *h);
};

struct redlockd {
    int fd;                     /* -1 while not connected */
    const struct rl_conn_hooks *hooks;  /* (static) the layers above the
                                           connection, for redlockd_conn.c */
    struct ssl_st *ssl;         /* the TLS of fd (a tls:// server); else
                                   NULL */
    int io_timeout_ms;          /* negative: none */
    int connect_timeout_ms;     /* negative: none */
    void (*on_lost)(const char *resource, uint64_t fence, const char *reason,
                    void *ud);
    void *ud;
    void (*on_holder)(const struct redlockd_holder *holder, void *ud);
    int in_callback;            /* inside on_lost or on_holder: no
                                   requests */
    int shutdown_seen;          /* EVENT SHUTDOWN on this connection */
    bool closing;               /* EVENT CLOSING: the daemon hangs up */
    bool closing_kept;          /* EVENT CLOSING reason=shutdown: the
                                   daemon left our leases on the nodes */
    unsigned long nevents;      /* events handled so far */

    /* Bytes read, lines not yet taken: [in_start, in_len) of in. */
    char *in;
    size_t in_start, in_len, in_cap;
    size_t in_scan;             /* no LF in [in_start, in_scan) */

    /* The last reply line, copied out of `in` so the events behind it can
     * be read before the caller is done with it. */
    char *reply;
    size_t reply_cap;

    struct rl_lease *leases;
    size_t nleases, leases_cap;
    int64_t sent_ms;            /* when the last request went out */

    /* The request line being built, and the one the failover builds while
     * a caller's request waits to be sent again. Reserved for RL_REQ_MAX
     * bytes when the handle is made, so building a request never allocates
     * (sbuf aborts when it cannot; a library must not). */
    struct sbuf req;
    struct sbuf freq;

    /* ---- failover (redlockd_failover.c) ---- */
    struct redlockd_addr *servers;
    size_t nservers;            /* 0: made by redlockd_open_fd, never
                                   reconnects */
    size_t cur;                 /* the server in use, or to try next */
    char *name, *password;      /* for each HELLO / AUTH */
    char *user;                 /* AUTH <user> <password>, or NULL */
    unsigned keepalive_ms;
    int detach_ms;              /* asked for; 0: not asked */
    int reconnect_min_ms, reconnect_max_ms; /* max < 0: never reconnect */
    bool detachable;            /* the daemon granted detach= */
    char secret[PROTO_SECRET_LEN + 1];  /* "" when no session to resume */
    size_t session_server;      /* where the session lives */
    bool resumed;               /* the connection resumed the session: its
                                   leases want a LOCKS before use */
    bool settled;               /* connected, and every lease confirmed or
                                   lost: requests may go out */
    int backoff_ms;             /* the next pause between rounds */
    int64_t next_round_ms;      /* no round of attempts before this */
    unsigned seed;              /* jitter of the pauses */

    /* ---- TLS (redlockd_tls.c): made when a tls:// server is listed ---- */
    struct ssl_ctx_st *tls_ctx;         /* CA, client certificate */
    struct bio_method_st *tls_bio;      /* our socket BIO's methods */
    char *tls_name;                     /* tls_server_name, or NULL */
    struct rl_tls_link tls_link;        /* the BIO's data, for ssl */
    char tls_peer[PROTO_ADDR_HOST_MAX + 1]; /* the name checked */
    char tls_err[sizeof(((struct redlockd_error *)0)->msg)]; /* why the
                                           last TLS call failed */

    /* ---- several requests in flight (redlockd_inflight.c) ---- */
    struct rl_sub **subs;       /* sent, not answered yet */
    size_t nsubs, subs_cap;
    struct rl_sub *done_head, *done_tail;   /* answered, not handed out */
    size_t ndone;
    unsigned long nsettled;     /* answers taken so far */
    uint64_t next_id;           /* the next tag (and submission id) */
    uint64_t call_id;           /* the tag of the blocking request waiting
                                   for its reply; 0: it went untagged */
    struct sbuf treq;           /* a request line with its tag */

    /* ---- watching (redlockd_watch.c) ---- */
    char **watches;             /* the resources watched (owned copies) */
    size_t nwatches, watches_cap;
    size_t watch_line_max;      /* the longest WATCH line a daemon took:
                                   the lines that WATCH again are no
                                   longer */
    bool rewatch;               /* a new session, which watches nothing
                                   yet: WATCH them again (rl_settle) */

    struct redlockd_info info;
    struct redlockd_error err;
    char dead[sizeof(((struct redlockd_error *)0)->msg)]; /* why fd is -1 */
};

/* ---- redlockd_base.c ---------------------------------------------------- */

int rl_seterr(struct redlockd_error *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failure of a call on h: its code and message become the last error. */
#define rl_fail(h, code, ...) rl_seterr(&(h)->err, (code), __VA_ARGS__)

int64_t rl_now_ms(void);
int64_t rl_deadline(int timeout_ms);
int64_t rl_earlier(int64_t a, int64_t b);   /* of two deadlines, -1 none */
int rl_remaining(int64_t deadline);
int rl_wait(int fd, short events, int64_t deadline);
void rl_quote(char *dst, size_t sz, const char *line, size_t len);
size_t rl_len(const char *s);
/* 1..max bytes of visible ASCII: client names, passwords, values. */
int rl_visible_word(const char *s, size_t max);

/* ---- redlockd_tls.c ----------------------------------------------------- */

/* The TLS settings of o (CA, client certificate, server name; each else
 * its $REDLOCKD_TLS_* variable) when h lists a tls:// server: 0, or -code
 * with err set (REDLOCKD_E_INVALID for a file that does not load). */
int rl_tls_setup(struct redlockd *h, const struct redlockd_opts *o,
                 struct redlockd_error *err);
void rl_tls_teardown(struct redlockd *h);
/* The handshake on fd, connected to a, by deadline: h->ssl set, or
 * -code with err set (the reason in the message) and h->ssl NULL. fd
 * stays the caller's. */
int rl_tls_connect(struct redlockd *h, const struct redlockd_addr *a, int fd,
                   int64_t deadline, struct redlockd_error *err);
void rl_tls_free(struct redlockd *h);
/* recv and send through h->ssl: n > 0; 0 at EOF (read); or -1 with errno:
 * EAGAIN (wait for *events: a TLS read may want POLLOUT, a write POLLIN),
 * EINTR, EPROTO (TLS failed: the reason in h->tls_err) or the socket's. */
ssize_t rl_tls_read(struct redlockd *h, char *buf, size_t len, short *events);
ssize_t rl_tls_write(struct redlockd *h, const char *buf, size_t len,
                     short *events);
/* Has OpenSSL read bytes it has not handed out yet (h->ssl NULL: no)? */
bool rl_tls_pending(const struct redlockd *h);

/* ---- redlockd_conn.c ---------------------------------------------------- */

/* A transport failure: the reply stream can not be trusted any more, so
 * the connection closes after the error is set (rl_drop). */
#define rl_fatal(h, code, ...) \
    rl_drop_rc((h), rl_fail((h), (code), __VA_ARGS__))
int rl_drop_rc(struct redlockd *h, int rc);
/* Is rc a failure that cost the connection (or found it gone)? */
bool rl_transport_failed(const struct redlockd *h, int rc);
/* Does this handle reconnect when its connection is lost? */
bool rl_can_reconnect(const struct redlockd *h);

/* Connect h to a (with the TLS handshake for tls://, by the same
 * deadline) and attach the connection: 0, or -code with h->err set. */
int rl_connect(struct redlockd *h, const struct redlockd_addr *a,
               int64_t deadline);
/* A new connection for h (fresh input buffer, no events seen yet). */
void rl_attach_fd(struct redlockd *h, int fd);
/* Close the connection without QUIT (shut down first: copies of the
 * socket in other processes must not keep the session attached). */
void rl_close_fd(struct redlockd *h);

/* Start a request line in b: its command word, from the table. */
struct sbuf *rl_req(struct sbuf *b, enum proto_cmd cmd);
/* Send b and read its reply into r, giving up at deadline: 0, -code (ERR
 * replies become their code; a transport failure dropped the connection),
 * or 1 when no reply came in time (the connection still open). */
int rl_exchange(struct redlockd *h, const struct sbuf *b, int64_t deadline,
                struct proto_reply *r);
/* The I/O timeout from now, lengthened by extra_ms; -1: none. */
int64_t rl_io_deadline(const struct redlockd *h, uint32_t extra_ms);
int rl_expect(struct redlockd *h, const struct proto_reply *r,
              enum proto_reply_kind kind, enum proto_cmd cmd);
/* Handle every complete EVENT line already read. */
int rl_drain_events(struct redlockd *h);
/* Read events until one comes or deadline: the number handled, 0 on the
 * deadline, or -code. */
int rl_read_events(struct redlockd *h, int64_t deadline);
/* Read and handle lines (events, answers to submissions) until *count
 * moves or deadline: as rl_read_events. */
int rl_read_until(struct redlockd *h, int64_t deadline,
                  const unsigned long *count);
/* Send a whole line by deadline: 0 or -code (the connection dropped). */
int rl_send_all(struct redlockd *h, const char *buf, size_t len,
                int64_t deadline);
/* The code and message of an ERR reply into e: -code. */
int rl_reply_error(const struct proto_reply *r, struct redlockd_error *e);
/* Before a request: read what has come in meanwhile, so that a
 * connection the daemon closed is found (and dropped) before anything is
 * sent into it. */
void rl_peek(struct redlockd *h);
/* Send QUIT and wait briefly for the daemon to close its end. */
void rl_quit(struct redlockd *h);

/* ---- redlockd_lease.c --------------------------------------------------- */

/* Calls into the application's on_lost (resource NULL: everything). */
void rl_tell_lost(struct redlockd *h, const char *resource, uint64_t fence,
                  const char *reason);
struct rl_lease *rl_lease_find(const struct redlockd *h, const char *resource);
struct rl_lease *rl_lease_get(struct redlockd *h, const char *resource);
void rl_lease_del(struct redlockd *h, const char *resource);
int rl_lease_lose(struct redlockd *h, const char *resource, uint64_t fence);
/* Lost for a reason the library found (on_lost with that reason). */
void rl_lease_lost_by(struct redlockd *h, struct rl_lease *l,
                      const char *reason);
void rl_lease_confirm(struct redlockd *h, struct rl_lease *l,
                      int64_t validity_ms);
/* A grant (LOCK, lockv, ADOPT reply) into the table. */
int rl_lease_taken(struct redlockd *h, const struct redlockd_lease *ls,
                   bool renew);
/* Every unconfirmed lease whose deadline has passed is lost ("deadline"),
 * or forgotten when it was being released. */
void rl_lease_expire(struct redlockd *h);
/* The earliest deadline of a lease not lost, or -1. */
int64_t rl_lease_earliest(const struct redlockd *h);
/* The connection is gone: nothing is confirmed any more, and what the
 * daemon releases with it is lost ("disconnected"): everything, unless the
 * session is detachable and the daemon was not shutting down, or it said
 * it left the leases on the nodes. */
void rl_lease_unconfirm(struct redlockd *h);
void rl_lease_free_all(struct redlockd *h);
/* EVENT LOST: the lease is lost, and on_lost told (unless it was told
 * already); -code (the connection then dropped) when it names nothing. */
int rl_event_lost(struct redlockd *h, const struct proto_reply *ev);

/* The LOCKS round in b, waiting no longer than until (and, with watch,
 * than the earliest deadline ahead): the deadlines move on. With adopt,
 * after a resume: what the session holds and we do not (a LOCK whose
 * answer was lost, a lease given up) is released. 1: no answer in time
 * (the connection then closed; by a lease's deadline, that lease lost). */
int rl_locks_round(struct redlockd *h, struct sbuf *b, int64_t until,
                   bool watch, bool after_resume);

/* ---- redlockd_watch.c --------------------------------------------------- */

/* EVENT HOLDER: on_holder with what it says; -code (the connection then
 * dropped) when it makes no sense. */
int rl_event_holder(struct redlockd *h, const struct proto_reply *ev);
/* A WATCH (cmd WATCH) or UNWATCH of res[] was answered OK; the line sent
 * was line_len bytes long. The list of watches follows: -code when out
 * of memory. */
int rl_watch_noted(struct redlockd *h, enum proto_cmd cmd,
                   const char *const *res, size_t n, size_t line_len);
/* A new session (h->rewatch): WATCH every resource of the list again, by
 * until, in lines no longer than a daemon took before. 0 (a refusal of
 * some is not an error: they stay unwatched), or -code when the
 * connection failed. */
int rl_watch_again(struct redlockd *h, int64_t until);
/* STATUS's JSON object (of resource) as a holder: 0, or -code. */
int rl_holder_from_status(struct redlockd *h, const char *json,
                          const char *resource, struct redlockd_holder *out);
void rl_watch_free(struct redlockd *h);

/* ---- redlockd_failover.c ------------------------------------------------ */

/* The options a handle keeps for its handshakes; -code on failure. */
int rl_keep_opts(struct redlockd *h, const struct redlockd_opts *o);
void rl_free_opts(struct redlockd *h);
/* The servers the options name, checked. */
int rl_check_servers(const struct redlockd_opts *o, struct redlockd_error *err);
/* The servers the options name, kept by h (to connect to in turn). */
int rl_keep_servers(struct redlockd *h, const struct redlockd_opts *o,
                    struct redlockd_error *err);
/* The connection just closed (rl_drop): what that means for the session
 * and its leases. */
void rl_after_drop(struct redlockd *h);
/* HELLO (and AUTH) on a connection just made, by deadline. */
int rl_handshake(struct redlockd *h, int64_t deadline);
/* The first connection: each server once, in order, until one answers
 * (a daemon's refusal ends it): 0, or -code with h->err set. */
int rl_connect_first(struct redlockd *h);
/* Reconnect (resume, or a new session and ADOPT) and settle every lease,
 * giving up at caller_until (-1: none), at the I/O timeout and at the
 * earliest lease deadline. 0, or -code with h->err set. */
int rl_recover(struct redlockd *h, int64_t caller_until);

/* ---- redlockd_calls.c --------------------------------------------------- */

/* The start of every call: not from on_lost, and a clean last error. */
int rl_begin_plain(struct redlockd *h);
/* A usable connection (reconnecting first when it was lost). */
int rl_begin(struct redlockd *h);
/* The request lines of LOCK (several resources, opts), UNLOCK and
 * EXTEND in h->req, each after the start of a call: 0 or -code. */
int rl_lock_line(struct redlockd *h, const char *const *resources, size_t n,
                 const struct redlockd_lock_opts *o);
int rl_unlock_line(struct redlockd *h, const char *resource);
int rl_extend_line(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                   const char *value);
/* What their answers mean for the lease table, given the call's result
 * rc (0: r is the reply); the result. A grant counts from h->sent_ms; an
 * EXTEND's ttl_ms 0 (value= alone) leaves the lease's ttl as it was. */
int rl_lock_granted(struct redlockd *h, const struct proto_reply *r,
                    const char *const *resources, size_t n, bool renew,
                    struct redlockd_grant *g);
int rl_unlock_answered(struct redlockd *h, const char *resource, int rc);
int rl_extend_answered(struct redlockd *h, const struct proto_reply *r, int rc,
                       const char *resource, uint32_t ttl_ms,
                       int64_t *validity_ms);

/* ---- redlockd_inflight.c ------------------------------------------------ */

/* A tagged line that is not an event: the answer to a submission, taken
 * (1), or the blocking request's own (0); -code when no request has that
 * tag (the connection then dropped). The hooks' tagged. */
int rl_inflight_line(struct redlockd *h, char *line, size_t len);
/* The connection dropped: every submission in flight is answered with
 * the failure. */
void rl_inflight_broke(struct redlockd *h);
/* The line to send for the blocking request in b: b itself, or, while
 * submissions are in flight, b tagged in h->treq (h->call_id its tag).
 * NULL when out of memory (h->err set). The hooks' call_line. */
const struct sbuf *rl_inflight_call(struct redlockd *h, const struct sbuf *b);
void rl_inflight_free(struct redlockd *h);

#endif
