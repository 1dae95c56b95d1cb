/*
 * libredlockd: a small blocking C client for the redlockd lock service.
 *
 * A handle is one daemon session, over one connection at a time: the locks
 * taken through it are held for as long as the session lives (the daemon
 * renews their leases), and released when the handle is closed. The
 * handle does not die with its connection: given one or more servers
 * (redlockd_opts.servers), it reconnects when the connection breaks or its
 * daemon restarts or goes away, resuming the session on the same daemon or
 * adopting every lease on another, with the same fence (see "Failover"
 * below). Build with `pkg-config --cflags --libs redlockd`. The wire
 * protocol is described in docs/protocol.md.
 *
 *     struct redlockd *h;
 *     struct redlockd_lease lease;
 *     struct redlockd_error err;
 *
 *     if (redlockd_connect(&h, NULL, &err) < 0)
 *         die(err.msg);
 *     if (redlockd_lock(h, "job:42", 0, 5000, 1, &lease) == 0) {
 *         // every ttl/3 or sooner: redlockd_refresh(h), and before each
 *         // step: redlockd_lease_check(h, "job:42") == 0 (see below)
 *         do_work(lease.fence);
 *         redlockd_unlock(h, "job:42");
 *     }
 *     redlockd_close(h);
 *
 * Return values: every function that can fail returns 0 (or a count) on
 * success and the negated code, -REDLOCKD_E_*, on failure. The failing
 * call's code and message are then kept in the handle: see
 * redlockd_last_error() (the queries on a const handle, redlockd_lost()
 * and redlockd_lease_*, leave it alone). redlockd_strerror() accepts the
 * code with either sign.
 *
 * Threads and concurrency: the library has no global state. A handle must
 * be used by one thread at a time; different handles may be used from
 * different threads freely. One thread may keep many requests in flight on
 * one handle, one session (redlockd_submit_*, redlockd_complete: "several
 * requests in flight" below), which is how an event loop or a pool of
 * tasks shares one session.
 *
 * Transport errors (REDLOCKD_E_IO, _IO_TIMEOUT, _CLOSED, _PROTO, and
 * _NOMEM while reading) close the connection, as does REDLOCKD_E_TOOLONG;
 * redlockd_fd() is then -1 until the handle has reconnected. Other errors
 * the daemon answers with (REDLOCKD_E_BUSY and friends) and
 * REDLOCKD_E_INVALID leave the connection usable.
 *
 * Failover. The handle asks for a detachable session (HELLO detach=), which
 * the daemon keeps, with its leases renewed, for detach_ms after the
 * connection is lost. The next blocking call (any request,
 * redlockd_refresh, redlockd_poll_events with a timeout, redlockd_reconnect)
 * reconnects, pausing between rounds from reconnect_min_ms up to
 * reconnect_max_ms: first to the same daemon with HELLO resume= (the same
 * session and leases, confirmed by a refresh), else (ERR NOSESSION: a
 * restarted daemon; or that daemon can not be reached) to the servers in
 * turn, with a new session and one ADOPT per grant (the resources of one
 * multi-resource LOCK together): the same lease and fence, a new token
 * (redlockd_lease_info). Meanwhile a lease is UNCONFIRMED
 * (redlockd_lease_state) and its deadline still holds; one whose deadline
 * passes first is not adopted but lost (on_lost reason "deadline"), as is
 * one that ADOPT refuses ("adopt": it is gone). Every kind of lease is
 * adopted: exclusive, shared, a semaphore slot (the same slot). A call reconnects for no
 * longer than the I/O timeout, the earliest lease deadline and its own
 * timeout; if that is not enough it fails with the transport error and the
 * next call goes on. Requests that were in flight: a LOCK fails with
 * REDLOCKD_E_IO (it may or may not have been granted: a grant that did
 * happen is released with the old session, when its detach time runs out,
 * or at once by the resume); UNLOCK, EXTEND, PING, FORCEUNLOCK and the
 * inspection commands are sent again on the new connection (an UNLOCK of
 * a lease found gone counts as done).
 *
 * A daemon that is shutting down (EVENT SHUTDOWN) keeps the connection
 * until its shutdown_timeout_ms, then leaves the leases on the nodes and
 * says so (EVENT CLOSING reason=shutdown): the handle adopts them
 * elsewhere, or on the daemon once it is back. The handle does not leave
 * such a daemon sooner, but a detachable session's connection lost during
 * the shutdown window is no release either: the daemon leaves those leases
 * on the nodes too, and they are adopted the same way.
 *
 * A daemon that refuses detach= (older than it, or limits.max_detach_ms 0
 * or below detach_ms) gets a plain HELLO: the handle still reconnects, but
 * the daemon releases the leases of a session whose connection ends, so
 * they are lost then ("disconnected") unless the daemon said it left them
 * on the nodes (EVENT CLOSING reason=shutdown), in which case they are
 * adopted. reconnect_max_ms < 0 turns all of this off: the handle then
 * dies with its connection, as every handle did before failover (every
 * lease lost, on_lost(NULL, 0, "disconnected"), later calls fail with
 * REDLOCKD_E_CLOSED; no detach= either).
 */
#ifndef REDLOCKD_CLIENT_H
#define REDLOCKD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REDLOCKD_DEFAULT_SERVER "127.0.0.1:7390"
#define REDLOCKD_SERVER_ENV "REDLOCKD_SERVER"
/* The TLS options' defaults (redlockd_opts.tls_*). */
#define REDLOCKD_TLS_CA_ENV "REDLOCKD_TLS_CA"
#define REDLOCKD_TLS_CERT_ENV "REDLOCKD_TLS_CERT"
#define REDLOCKD_TLS_KEY_ENV "REDLOCKD_TLS_KEY"
/* The longest resource name the library accepts: the most any daemon's
 * locks.max_resource_len may allow. The daemon's own limit (by default
 * REDLOCKD_RESOURCE_DEFAULT_MAX) applies too, and it answers ERR ARG above
 * it. */
#define REDLOCKD_RESOURCE_MAX 1024
#define REDLOCKD_RESOURCE_DEFAULT_MAX 200
#define REDLOCKD_TOKEN_LEN 32
/* The longest user name (redlockd_opts.user). */
#define REDLOCKD_USER_MAX 64
/* The longest client name (redlockd_opts.name) and daemon id
 * (redlockd.id), as struct redlockd_holder carries them. */
#define REDLOCKD_NAME_MAX 64
/* The longest holder's value (redlockd_lock_opts.value): the most any
 * daemon's locks.max_value_len may allow. The daemon's own limit (by
 * default REDLOCKD_VALUE_DEFAULT_MAX) applies too, and it answers ERR ARG
 * above it. */
#define REDLOCKD_VALUE_MAX 4096
#define REDLOCKD_VALUE_DEFAULT_MAX 256
/* The most servers one handle takes. */
#define REDLOCKD_SERVERS_MAX 16

enum redlockd_code {
    REDLOCKD_OK = 0,
    /* Answered by the daemon (ERR <CODE>); the connection stays usable
     * except after TOOLONG. One per protocol error code. */
    REDLOCKD_E_ARG,         /* malformed request */
    REDLOCKD_E_UNKNOWN,     /* unknown command */
    REDLOCKD_E_TOOLONG,     /* request line too long (daemon closes) */
    REDLOCKD_E_NOAUTH,      /* a password is required */
    REDLOCKD_E_AUTH,        /* wrong password */
    REDLOCKD_E_BUSY,        /* held by someone else, wait was 0 */
    REDLOCKD_E_TIMEOUT,     /* wait ran out before the lock could be had */
    REDLOCKD_E_HELD,        /* this session already holds the resource */
    REDLOCKD_E_NOTHELD,     /* this session does not hold the resource */
    REDLOCKD_E_LOST,        /* the lease was lost */
    REDLOCKD_E_UNAVAILABLE, /* no quorum of Redis nodes */
    REDLOCKD_E_LIMIT,       /* a configured limit was hit */
    REDLOCKD_E_SHUTDOWN,    /* the daemon is stopping */
    REDLOCKD_E_OTHER,       /* an ERR code this library does not know */
    /* Found by the library. */
    REDLOCKD_E_IO,          /* connect, send or receive failed (errno text) */
    REDLOCKD_E_IO_TIMEOUT,  /* connect or I/O timeout ran out */
    REDLOCKD_E_CLOSED,      /* the connection is closed (by the daemon, or
                               after an earlier transport error) */
    REDLOCKD_E_PROTO,       /* the daemon sent something unparseable */
    REDLOCKD_E_NOMEM,       /* out of memory */
    REDLOCKD_E_INVALID,     /* bad argument to the library; nothing sent */
    /* Added later, kept after the others so no earlier value moves: */
    REDLOCKD_E_NOSESSION,   /* no such session to resume, or a wrong secret */
    REDLOCKD_E_DENIED,      /* this user may not touch that resource */
    REDLOCKD_CODE_COUNT
};

/* Who holds a watched resource: "Watching" below. */
struct redlockd_holder;

struct redlockd_error {
    int code;               /* enum redlockd_code, positive; 0 = no error */
    char msg[256];          /* the daemon's message, or errno text */
};

/*
 * Connection options. Zero-initialise and set what you need: every zero or
 * NULL field means "the default". Fields are only ever added at the end;
 * this is a 0.x library, so a program built against an older redlockd.h
 * must be rebuilt against this one (the library reads the whole struct).
 */
struct redlockd_opts {
    /*
     * "tcp://HOST:PORT" or "HOST:PORT", "[IPV6]:PORT", "tls://HOST:PORT"
     * or "tls://[IPV6]:PORT" (TLS: see "TLS" below), "unix:/PATH",
     * "unix:///PATH" (the URL spelling of the same path) or a path starting
     * with '/'. HOST is an IPv4 address or a host name of letters, digits,
     * '.' and '-' (not digits and dots alone, as "1.2.3"); brackets hold an
     * IPv6 address and nothing else, with an optional "%zone"; PORT is 1 to
     * 65535 in at most 5 digits and defaults to 7390. docs/protocol.md has
     * the grammar. A malformed address fails redlockd_connect with
     * REDLOCKD_E_INVALID before anything is resolved. NULL:
     * $REDLOCKD_SERVER (one address, or several separated by commas), else
     * REDLOCKD_DEFAULT_SERVER. Ignored when servers is set.
     */
    const char *server;
    int connect_timeout_ms;     /* 0: 5000; negative: none */
    /* How long to wait for each reply (LOCK adds its wait to it).
     * 0: 10000; negative: none. */
    int io_timeout_ms;
    const char *name;           /* HELLO name=, shown by SESSIONS */
    /* HELLO keepalive=: the daemon ends the session when nothing has
     * arrived for this long, so call redlockd_ping() more often. 0: off. */
    unsigned keepalive_ms;
    const char *password;       /* sent with AUTH when not NULL */
    /*
     * Called from inside library calls (any request, redlockd_poll_events)
     * when the daemon reports EVENT LOST, with that event's fields, or when
     * the library finds a lease lost itself: a refresh does not find it
     * (reason "missing"), its deadline passed while the handle was
     * reconnecting ("deadline"), ADOPT refused it ("adopt"), or its session
     * was not detachable and the connection ended ("disconnected"). A
     * handle that does not reconnect (reconnect_max_ms < 0) calls it once
     * with resource NULL, fence 0 and reason "disconnected" when the
     * connection is lost, which means every lease of the handle is gone.
     * It must not make requests on the same handle (they fail with
     * REDLOCKD_E_INVALID); redlockd_lost() and the redlockd_lease_*
     * queries are fine.
     */
    void (*on_lost)(const char *resource, uint64_t fence, const char *reason,
                    void *ud);
    void *ud;

    /* ---- failover (0.5); see "Failover" above ---- */
    /* Several servers (each as `server`), tried in turn; wins over server
     * and $REDLOCKD_SERVER when nservers > 0. At most
     * REDLOCKD_SERVERS_MAX. redlockd_connect takes the first that
     * answers. */
    const char *const *servers;
    size_t nservers;
    /* HELLO detach=: how long the daemon keeps the session after its
     * connection is lost. 0: 30000; negative: not asked for (a lost
     * connection then costs every lease). A lease's deadline is never more
     * than this (less 1%) after its confirmation, so refresh more often
     * than that with a longer ttl. */
    int detach_ms;
    /* The pause between rounds of reconnection attempts, doubling from
     * min to max (less up to half of it, at random). 0: 50 and 1000;
     * reconnect_max_ms negative: never reconnect. */
    int reconnect_min_ms;
    int reconnect_max_ms;

    /*
     * ---- TLS (0.6), for the tls:// servers ----
     * A tls:// server's connection is TLS 1.2 or later, and its
     * certificate must be signed by a CA that tls_ca_file (or else the
     * system's store) holds, be valid now, and name the host of the
     * address: a host name as a DNS name (which also goes out as SNI), an
     * IP address as an IP address (tls_server_name checks another name).
     * A handshake that fails costs that server (the next one is tried)
     * and says why in the message: "unknown CA", "name mismatch",
     * "expired", "the server does not speak TLS", "the server requires a
     * client certificate". The handshake counts against
     * connect_timeout_ms. The other way round, a plain address of a
     * daemon's TLS port fails with REDLOCKD_E_ARG and the daemon's line,
     * "this port speaks TLS: connect with tls:// and a TLS client". Reconnection, resume and ADOPT work as over
     * plain TCP. Unused when no server is tls://.
     */
    /* PEM file of the CAs to trust. NULL: $REDLOCKD_TLS_CA, else the
     * system's store (OpenSSL's default paths). */
    const char *tls_ca_file;
    /* PEM client certificate (its chain may follow), for daemons that
     * ask for one (tls.verify_clients). NULL: $REDLOCKD_TLS_CERT, else
     * none. */
    const char *tls_cert_file;
    /* PEM private key of tls_cert_file. NULL: $REDLOCKD_TLS_KEY, else
     * the key is in tls_cert_file. */
    const char *tls_key_file;
    /* The name the server's certificate must carry (and the SNI), instead
     * of the address's host: for an address that is an IP while the
     * certificate names the host. NULL: the host. */
    const char *tls_server_name;
    /* ---- users (0.6) ---- */
    /* With password: AUTH <user> <password>, logging in as that entry of
     * the daemon's auth.users (1 to REDLOCKD_USER_MAX visible ASCII
     * characters). NULL: AUTH <password>. A user may lock only resources
     * within its prefixes; others answer REDLOCKD_E_DENIED. */
    const char *user;
    /* ---- watching (0.6): see "Watching" below ---- */
    /*
     * Called from inside library calls (any request, redlockd_poll_events)
     * with each EVENT HOLDER of a resource the handle watches
     * (redlockd_watch): who holds it now. *holder lives for the call
     * only. As for on_lost, it must not make requests on the same handle
     * (they fail with REDLOCKD_E_INVALID). ud is the same as on_lost's.
     */
    void (*on_holder)(const struct redlockd_holder *holder, void *ud);
};

struct redlockd_lease {
    char resource[REDLOCKD_RESOURCE_MAX + 1];
    char token[REDLOCKD_TOKEN_LEN + 1]; /* the random value in Redis */
    uint64_t fence;     /* fencing token: pass it to the guarded storage */
    uint32_t ttl;       /* lease on Redis, ms */
    int64_t validity;   /* ms the lock was certainly valid for when granted */
};

/* What the daemon said to HELLO. */
struct redlockd_info {
    char session[64];   /* "s7" */
    char server[64];    /* "redlockd/0.1.0" */
    unsigned nodes;     /* Redis nodes configured */
    unsigned quorum;
};

struct redlockd;

/*
 * Connect to the first server that answers, send HELLO (proto=1, name,
 * keepalive, detach) and AUTH when a password is given. opts may be NULL.
 * On failure *out is NULL and err (if not NULL) says why (a transport
 * failure: the last server's).
 */
int redlockd_connect(struct redlockd **out, const struct redlockd_opts *opts,
                     struct redlockd_error *err);

/* Send QUIT (so the daemon releases the locks at once, without
 * lock_delay_ms), close and free. NULL is fine. A handle that is not
 * connected at the time leaves its detached session (and its leases) to
 * the daemon, which ends it when detach_ms runs out. */
void redlockd_close(struct redlockd *h);

/*
 * Free the handle without a word to the daemon: its copy of the
 * connection is closed (no QUIT, no TLS close_notify) and the session and
 * its leases are left as they are. For a process that forked while the
 * handle was connected and leaves the session to the other process, which
 * goes on using its copy of the handle (only one of them may use it: the
 * two copies share one connection). NULL is fine. Without another copy,
 * the session ends as for a lost connection (a detachable one detaches).
 */
void redlockd_forget(struct redlockd *h);

/*
 * LOCK: ttl_ms 0 = the daemon's default; wait_ms 0 = fail with
 * REDLOCKD_E_BUSY at once, else wait up to that long (REDLOCKD_E_TIMEOUT);
 * renew 1 = the daemon keeps the lease alive while connected. lease may be
 * NULL. The lease's first deadline (below) counts from when LOCK was sent;
 * when the wait for the grant used up half its validity or more, the call
 * confirms the lease with a refresh before it returns, and a failure of
 * that refresh (the connection then closed) is its result. A waiting LOCK
 * keeps the handle busy past the deadlines of its other leases: wait on
 * a handle of its own.
 */
int redlockd_lock(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                  uint32_t wait_ms, int renew, struct redlockd_lease *lease);
int redlockd_unlock(struct redlockd *h, const char *resource);
/* EXTEND: set the lease to ttl_ms; validity_ms may be NULL. Success moves
 * the deadline; an ERR UNAVAILABLE to a shorter ttl may have shortened the
 * lease on some nodes, so its deadline drops to when the EXTEND was sent
 * until a refresh confirms how long it is. */
int redlockd_extend(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                    int64_t *validity_ms);
int redlockd_ping(struct redlockd *h);

/* Inspection: *json gets the daemon's JSON object as a malloc'd string,
 * to be released with free(). */
int redlockd_locks(struct redlockd *h, char **json);
int redlockd_status(struct redlockd *h, const char *resource, char **json);
int redlockd_sessions(struct redlockd *h, char **json);
int redlockd_stats(struct redlockd *h, char **json);
/* TOP: the resources the daemon's sessions hold or wait for, the longest
 * wait first, at most limit of them (0: the daemon's default, 20; it takes
 * up to 100). */
int redlockd_top(struct redlockd *h, uint32_t limit, char **json);

/*
 * 1 if the lease on resource taken through this handle was lost (EVENT LOST
 * arrived, UNLOCK/EXTEND answered ERR LOST, a refresh did not find it, the
 * handle could not take it over after a lost connection, or the connection
 * is gone on a handle that does not reconnect), else 0. Taking the
 * resource again clears it. Only events already read count: call
 * redlockd_poll_events() while idle.
 * This is what the daemon said; whether the lease may still be relied on
 * now is redlockd_lease_check()'s answer.
 */
int redlockd_lost(const struct redlockd *h, const char *resource);

/*
 * Lease deadlines. The daemon renews a renew=1 lease on Redis for as long
 * as the connection lives, but a daemon that stalls (stopped, swapping,
 * cut off from the client) renews nothing and says nothing: its keys
 * expire after ttl, and another daemon on the same nodes may then grant
 * the lock. So the client keeps its own bound, the lease's deadline: the
 * time it sent the request that last confirmed the lease, plus the
 * validity that request's reply reported (docs/protocol.md, "Writing a
 * client: the lease deadline rule"). Until the deadline the lock is
 * certainly still ours; after it, it may not be.
 *
 * LOCK and EXTEND set the deadline; redlockd_refresh() moves it on for
 * every lease of the handle. Call it at least every ttl/3, and stop
 * working under a lease (stop writing to what it guards) once
 * redlockd_lease_check() no longer answers 0.
 *
 * Deadlines are milliseconds of CLOCK_MONOTONIC, as
 * clock_gettime(CLOCK_MONOTONIC) tv_sec * 1000 + tv_nsec / 1000000.
 */

/*
 * One LOCKS request: each lease the daemon still lists gets the deadline
 * "time LOCKS was sent + the validity reported for it now" (a lease the
 * daemon could not keep has validity 0); one it does not list, or lists as
 * lost, becomes lost (on_lost, reason "missing"). The answer is awaited
 * until the I/O timeout, and never past the earliest deadline still
 * ahead, so that a caller waiting here can stop its work on time: no
 * answer by then fails with REDLOCKD_E_IO_TIMEOUT and closes the
 * connection (a late answer can not be told from the next one); the lease
 * whose deadline that was is lost ("deadline"), the others are
 * unconfirmed until the handle reconnects (a handle that does not
 * reconnect: every lease counts as lost). A handle whose connection was
 * lost reconnects first; one that loses it here reconnects before the
 * call returns, unless that earliest deadline has come. Any line keeps
 * the session alive, so this also serves as the keepalive ping.
 */
int redlockd_refresh(struct redlockd *h);
/* The same, waiting for the answer no longer than timeout_ms either
 * (negative: only the bounds above), for a caller that must stop its work
 * some time before the deadline. */
int redlockd_refresh_within(struct redlockd *h, int timeout_ms);

/*
 * The deadline of the lease on resource into *deadline_ms (may be NULL):
 * 0 while the handle holds the lease, even when the deadline has passed,
 * and while it is unconfirmed (the handle reconnects); -REDLOCKD_E_LOST
 * once it was reported lost (as redlockd_lost()) or the connection is gone
 * on a handle that does not reconnect; -REDLOCKD_E_NOTHELD if the handle
 * never took it or released it. *deadline_ms is set only with 0.
 */
int redlockd_lease_deadline(const struct redlockd *h, const char *resource,
                            int64_t *deadline_ms);

/*
 * May the caller still act under the lease? 0 while its deadline is
 * ahead, confirmed or not (an unconfirmed lease's keys outlive its
 * deadline on the nodes); -REDLOCKD_E_LOST once the deadline has passed,
 * or as redlockd_lease_deadline() says; -REDLOCKD_E_NOTHELD likewise. A
 * passed deadline is moved on again by a refresh that finds the lease
 * still valid: the daemon kept it all along, only the confirmation was
 * late. An unconfirmed lease whose deadline passed is never confirmed
 * again.
 */
int redlockd_lease_check(const struct redlockd *h, const char *resource);

/* Where a lease stands (docs: "Failover" above). */
enum redlockd_lease_state {
    REDLOCKD_LEASE_NONE = 0,        /* never taken here, or released */
    REDLOCKD_LEASE_HELD,            /* confirmed on the current connection
                                       (its deadline is lease_check's) */
    REDLOCKD_LEASE_UNCONFIRMED,     /* the connection was lost: being
                                       resumed or adopted, deadline ahead */
    REDLOCKD_LEASE_LOST,            /* as redlockd_lost(), or unconfirmed
                                       past its deadline (on_lost follows
                                       at the next call) */
};

/* enum redlockd_lease_state of the lease on resource. A query: it sends
 * nothing and never reconnects. */
int redlockd_lease_state(const struct redlockd *h, const char *resource);

/*
 * The lease on resource as the handle holds it now into *lease (may be
 * NULL): its token changes when a new daemon adopts it, its fence never;
 * validity is the last one reported. 0 while held or unconfirmed,
 * -REDLOCKD_E_LOST (*lease filled all the same) once lost,
 * -REDLOCKD_E_NOTHELD as redlockd_lease_deadline().
 */
int redlockd_lease_info(const struct redlockd *h, const char *resource,
                        struct redlockd_lease *lease);

/*
 * Reconnect now: drop the connection (without QUIT, so a detachable
 * session detaches; one that is not loses its leases) and resume or adopt
 * as after a lost one, for no longer than the I/O timeout and the earliest
 * lease deadline. For a client that knows its network changed, and for
 * tests. REDLOCKD_E_INVALID on a handle that does not reconnect.
 */
int redlockd_reconnect(struct redlockd *h);

/* The server the handle is connected to, or will try next ("HOST:PORT",
 * "tls://HOST:PORT", "unix:/PATH"): canonical text, owned by the handle. */
const char *redlockd_server(const struct redlockd *h);

/*
 * FORCEUNLOCK (operators): delete the resource's keys on every node,
 * whoever holds them; the holder hears EVENT LOST. Needs a connection
 * authenticated with the daemon's auth.admin_password (opts.password);
 * anyone else gets REDLOCKD_E_NOAUTH. Returns the number of nodes where
 * a key was deleted (0: it was not held).
 */
int redlockd_force_unlock(struct redlockd *h, const char *resource);

/*
 * Read EVENT lines that have arrived, without sending anything. Waits up to
 * timeout_ms for at least one (0: do not wait, negative: forever). Returns
 * the number of events handled, or a negative code (connection closed...).
 * A lost connection is reconnected within timeout_ms (and the bounds of
 * "Failover" above): with 0 it is not, and the call fails with the
 * transport error; the next blocking call reconnects.
 */
int redlockd_poll_events(struct redlockd *h, int timeout_ms);

/* The socket, to wait for readability with poll() alongside other work,
 * then call redlockd_poll_events(h, 0). -1 while not connected; it changes
 * when the handle reconnects. */
int redlockd_fd(const struct redlockd *h);

/* 1 once the daemon has sent EVENT SHUTDOWN. */
int redlockd_shutting_down(const struct redlockd *h);

const struct redlockd_info *redlockd_info(const struct redlockd *h);
/* The last failure on this handle (code 0 if the last call succeeded). */
const struct redlockd_error *redlockd_last_error(const struct redlockd *h);
/* A fixed description of a code, for either sign; never NULL. */
const char *redlockd_strerror(int code);
/* "BUSY" for REDLOCKD_E_BUSY, "IO" for REDLOCKD_E_IO...; never NULL. */
const char *redlockd_code_name(int code);

/* ---- lock kinds: shared, semaphores, several resources ------------------
 * (docs/protocol.md, "Additions"). New calls beside redlockd_lock, which
 * keeps its meaning. */

enum redlockd_mode {
    REDLOCKD_EXCLUSIVE = 0,     /* the default */
    REDLOCKD_SHARED = 1,        /* any number of shared holders at once */
};

/* Zero-initialise and set what you need: every zero means the default. */
struct redlockd_lock_opts {
    uint32_t ttl_ms;            /* 0: the daemon's default */
    uint32_t wait_ms;           /* 0: REDLOCKD_E_BUSY at once */
    int no_renew;               /* 1: renew=0 (the lease just expires) */
    enum redlockd_mode mode;    /* SHARED: one resource, no limit */
    uint32_t limit;             /* K > 0: one of K slots of a semaphore
                                   (one resource; every holder the same K) */
    /* (0.6) Exclusive locks: the holder's value, 1 to the daemon's
     * locks.max_value_len (at most REDLOCKD_VALUE_MAX) visible ASCII
     * characters, stored with the lock on the nodes so that STATUS and
     * WATCH show it on every daemon (a leader's address). NULL: none.
     * redlockd_set_value replaces it. */
    const char *value;
};

/* What a redlockd_lockv grant is. */
struct redlockd_grant {
    struct redlockd_lease lease;    /* resource: the first name */
    unsigned nresources;            /* names granted (all of them) */
    enum redlockd_mode mode;
    uint32_t limit;                 /* K, or 0 */
    uint32_t slot;                  /* limit > 0: the slot held */
};

/*
 * LOCK n resources (1 to the daemon's locks.max_multi, none twice), all or
 * none, with opts (NULL: all defaults). Several resources are exclusive
 * only and share one token and fence; afterwards each is held on its own
 * (redlockd_unlock, redlockd_extend, redlockd_lost name one). grant may be
 * NULL. Errors as redlockd_lock, and REDLOCKD_E_ARG for a mode, limit or
 * number of names the daemon refuses (a K that disagrees with the one its
 * other holders use).
 */
int redlockd_lockv(struct redlockd *h, const char *const *resources, size_t n,
                   const struct redlockd_lock_opts *opts,
                   struct redlockd_grant *grant);
/* UNLOCK n resources at once; REDLOCKD_E_NOTHELD (nothing released) when
 * one is not held, REDLOCKD_E_LOST when one had been lost (the others are
 * released). */
int redlockd_unlockv(struct redlockd *h, const char *const *resources,
                     size_t n);

/* ---- several requests in flight (0.6) ------------------------------------
 *
 * One handle, one session, many requests at once: a program with many
 * concurrent tasks shares one connection instead of opening one per task.
 * A submitted request goes out at once as a tagged request
 * (docs/protocol.md, "Tagged requests") and the call returns without
 * waiting; redlockd_complete hands out the answers in the order they come,
 * which is the order the requests finish. The daemon runs them
 * concurrently, except that requests naming the same resource take effect
 * in the order they were submitted (UNLOCK x right after LOCK x wait=...
 * answers after that LOCK).
 *
 * Everything else stays as it is: a grant goes into the handle's lease
 * table (redlockd_lost, redlockd_lease_*, refreshes, failover), and the
 * blocking calls may be made between submissions. While requests are in
 * flight, blocking calls are tagged too, so they do not wait for them (a
 * submitted LOCK waiting 30 s holds up nothing but its own resource), and
 * answers that come in meanwhile are kept for redlockd_complete.
 *
 * A lease granted through a submission counts its deadline from when the
 * LOCK was sent; unlike redlockd_lock, no refresh follows a long wait.
 *
 * When the connection breaks, every request in flight finishes with
 * REDLOCKD_E_IO ("outcome unknown"): nothing is sent again. A LOCK that
 * was granted all the same is released when the handle resumes its
 * session (or when the daemon ends it); an UNLOCK that did not happen
 * leaves the lease in the table, held, to be released again. The next
 * call (a submission, or any blocking call) reconnects as usual.
 *
 * One thread at a time per handle, as for every call here.
 */

/* The most requests one handle keeps in flight; beyond, submitting fails
 * with REDLOCKD_E_LIMIT until redlockd_complete has handed some out. The
 * daemon's limits.max_inflight (default 1024) may be lower: it then stops
 * reading until some finish, which costs time, not requests. */
#define REDLOCKD_INFLIGHT_MAX 4096

enum redlockd_op {
    REDLOCKD_OP_LOCK = 1,
    REDLOCKD_OP_UNLOCK,
    REDLOCKD_OP_EXTEND,
};

/* A finished request, as redlockd_complete hands it out. */
struct redlockd_done {
    uint64_t id;                /* what its submission returned */
    enum redlockd_op op;
    int rc;                     /* 0, or -code as the blocking call's */
    char resource[REDLOCKD_RESOURCE_MAX + 1];   /* the (first) one named */
    struct redlockd_grant grant;    /* LOCK, rc 0: as redlockd_lockv's */
    int64_t validity;           /* EXTEND, rc 0: as redlockd_extend's */
    struct redlockd_error err;  /* rc < 0: why */
};

/*
 * Send LOCK (as redlockd_lockv: 1 to the daemon's locks.max_multi
 * resources, opts may be NULL) without waiting for its answer. *id (may be
 * NULL) names it in the redlockd_done that redlockd_complete hands out.
 * 0, or -code when it was not sent: REDLOCKD_E_INVALID (arguments),
 * REDLOCKD_E_LIMIT (REDLOCKD_INFLIGHT_MAX in flight), or a transport
 * failure.
 */
int redlockd_submit_lock(struct redlockd *h, const char *const *resources,
                         size_t n, const struct redlockd_lock_opts *opts,
                         uint64_t *id);
/* UNLOCK one resource, without waiting; as redlockd_submit_lock. */
int redlockd_submit_unlock(struct redlockd *h, const char *resource,
                           uint64_t *id);
/* EXTEND one lease to ttl_ms (above 0), without waiting. */
int redlockd_submit_extend(struct redlockd *h, const char *resource,
                           uint32_t ttl_ms, uint64_t *id);
/*
 * Hand out one finished request: 1 with *done filled, 0 when none
 * finished within timeout_ms (0: do not wait, negative: forever; with
 * nothing in flight, 0 at once), or -code when the call itself failed
 * (from on_lost: REDLOCKD_E_INVALID). Reads and handles events too. Any
 * call on the handle may read answers ahead of time, so to wait alongside
 * other work, call this with 0 until it returns 0, then poll
 * redlockd_fd() for input, and so on.
 */
int redlockd_complete(struct redlockd *h, int timeout_ms,
                      struct redlockd_done *done);
/* Requests submitted and not yet handed out by redlockd_complete. */
size_t redlockd_inflight(const struct redlockd *h);

/* ---- values and watching (0.6) -------------------------------------------
 *
 * Leader election and its observers (docs/protocol.md, "Watching a
 * lock"): a leader takes an exclusive lock with a value
 * (redlockd_lock_opts.value: its address, say), which every daemon on the
 * same nodes shows with the holder; redlockd_set_value replaces it
 * without giving the lock up. redlockd_holder says who holds a resource
 * now, and redlockd_watch has the daemon tell each change: the handle
 * calls opts.on_holder with the state at once, then again whenever it
 * changes, through any daemon on the same nodes (within about a round
 * trip) or by another Redlock client (within the daemon's
 * locks.watch_poll_ms). States that change faster than they are read may
 * be merged, never an older one last. Call redlockd_poll_events (or poll
 * redlockd_fd) while idle, so that they are read.
 *
 * Watches belong to the session and follow it: a resumed session keeps
 * them and the daemon tells their states again; on a new session (after a
 * failover) the handle sends WATCH again for every resource, and on_holder
 * hears their states from the new daemon. A resource that daemon refuses
 * (a lower limits.max_watches, say) stays unwatched until redlockd_watch
 * names it again.
 */

/* Who holds a resource: an EVENT HOLDER, or STATUS (redlockd_holder). */
struct redlockd_holder {
    char resource[REDLOCKD_RESOURCE_MAX + 1];
    unsigned held;              /* 0: free; 1: an exclusive holder; else
                                   shared holders or semaphore slots */
    int foreign;                /* 1: a key set by another Redlock client
                                   (held 1, nothing more known) */
    enum redlockd_mode mode;    /* SHARED: held counts shared holders */
    uint32_t limit;             /* a semaphore's K (held counts its slots
                                   in use), or 0 */
    /* An exclusive holder (held 1, limit 0, not foreign): */
    uint64_t fence;             /* its grant's fence (0: unknown) */
    char name[REDLOCKD_NAME_MAX + 1];   /* its client name, or "" */
    char daemon[REDLOCKD_NAME_MAX + 1]; /* the daemon it holds it through
                                           (redlockd.id), or "" */
    char value[REDLOCKD_VALUE_MAX + 1]; /* its value, or "" for none */
};

/*
 * EXTEND value=: replace the value of a lease this handle holds, without
 * giving the lock up (the same token and fence; its ttl stays as it is).
 * Watchers hear the new value. Success confirms the lease (its deadline
 * moves on, as redlockd_extend's). Errors as redlockd_extend, and
 * REDLOCKD_E_ARG for a lease that takes no value (shared, a semaphore
 * slot) or a value over the daemon's locks.max_value_len.
 */
int redlockd_set_value(struct redlockd *h, const char *resource,
                       const char *value);

/*
 * STATUS: who holds resource now, as this daemon and the nodes see it,
 * into *holder. A holder on another daemon of the same nodes is named
 * too, with its value. 0, or -code.
 */
int redlockd_holder(struct redlockd *h, const char *resource,
                    struct redlockd_holder *holder);

/*
 * WATCH n resources (1 to 256; the daemon's limits.max_watches counts
 * them all, and with auth.users they must be within the user's prefixes:
 * REDLOCKD_E_DENIED): opts.on_holder hears the state of each now, then
 * each change. Watching one again changes nothing. Returns how many
 * resources the handle watches now, or -code (REDLOCKD_E_LIMIT: none of
 * them is watched).
 */
int redlockd_watch(struct redlockd *h, const char *const *resources,
                   size_t n);
/* UNWATCH: no more events for them (one not watched is fine). Returns how
 * many resources the handle watches now, or -code. */
int redlockd_unwatch(struct redlockd *h, const char *const *resources,
                     size_t n);

#ifdef __cplusplus
}
#endif

#endif
