/*
 * session: a client's session, the object its leases belong to.
 *
 * A session is created for each accepted connection (conn.h), which serves
 * it through struct conn_ops: the connection frames the lines, the session
 * says what they mean (auth, commands, keepalive) and answers through
 * conn's reply calls. Its locks are lockmgr's, reached through the
 * embedded lockmgr_owner, and stay with the session object whatever
 * happens to its connection.
 *
 * States (protocol.md, "Detachable sessions"):
 *
 *   ATTACHED --(conn ends: QUIT, or no detach=)-----------------> ENDED
 *   ATTACHED --(conn ends without QUIT, HELLO detach= asked)----> DETACHED
 *   DETACHED --(HELLO resume= with its id and secret)-----------> ATTACHED
 *   DETACHED --(detach ms run out; shutdown)--------------------> ENDED
 *   ATTACHED --(HELLO resume= on another conn: takeover)--------> ATTACHED
 *                                   (the old conn is closed, unbound)
 *
 * Attached, s->conn is its connection and the connection's data is s.
 * Detached, s->conn is NULL; lockmgr renews its leases as any others, a
 * lease lost meanwhile is kept to be told after the resume reply, and a
 * timer ends it after detach ms. Whenever a connection leaves a session
 * (detach, takeover) what that connection asked is withdrawn
 * (lockmgr_owner_cancel): a new connection never hears another's answers.
 * Ended, it has released (or, at shutdown, abandoned) everything; it is
 * freed when the last reference goes.
 *
 * References (session_ref/unref): one for the state, held while attached
 * (the connection's binding) or detached (the detached table), dropped
 * when the session ends; one per lockmgr notice or request in flight
 * (the owner ops); short ones around calls that may end it. The session
 * holds no reference on its conn: conn tells it (ops->closed) before the
 * conn can go away, and the session forgets it then.
 *
 * Counting: the sessions count request lines by command and their ERR
 * answers by code in struct session_counters, and tell how long a LOCK
 * took to their observer; stats_glue.c reads the one and is the other.
 */
#ifndef REDLOCKD_SESSION_H
#define REDLOCKD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "hmap.h"
#include "list.h"
#include "lockmgr.h"
#include "proto.h"
#include "timer.h"
#include "users.h"
#include "watch.h"

struct conf;
struct conn;

enum session_state {
    SESSION_ATTACHED,       /* a connection serves it */
    SESSION_DETACHED,       /* its connection is gone; leases kept */
    SESSION_ENDED,          /* released; waits for its last reference */
};

/* "s<n>.<start>": n counts this daemon's sessions, start is the daemon's
 * start time (ms since the epoch, base 36), so ids stay unique across
 * restarts: "s42.mifc7b9k". */
#define SESSION_ID_LEN 40

struct session_ops;

struct session {
    const struct session_ops *ops;  /* what serves it (session_priv.h) */
    enum session_state state;
    struct conn *conn;      /* attached: its connection; else NULL */
    struct list link;       /* attached or detached: in that table */
    int refs;

    /* ---- the session: kept across connections ---- */
    uint64_t id;
    char idstr[SESSION_ID_LEN];     /* "s42.mifc7b9k" */
    char name[PROTO_MAX_NAME_LEN + 1];
    char peer[80];          /* its (last) connection's, for logs */
    bool authed;
    bool admin;             /* AUTH with auth.admin_password */
    char user[USERS_NAME_MAX + 1];  /* logged in as this auth.users entry
                               (looked up by name at each check, so a
                               reload applies); "": no user, unrestricted */
    uint32_t denied_told;   /* 1 << PROTO_CMD_*: ERR DENIED of that command
                               audited at notice already */
    struct lockmgr_owner owner; /* leases and the pending LOCK */
    uint32_t detach_ms;     /* HELLO detach=: outlive the connection */
    char secret[PROTO_SECRET_LEN + 1];  /* with detach_ms: what resumes it */
    struct timer detach_timer;  /* detached: detach_ms runs out */
    struct list untold;     /* struct session_lost: lost while detached,
                               told after the resume reply */
    size_t nuntold;
    struct watch_client watch;  /* WATCH: what it watches (watch.h) */

    /* ---- its current connection's: reset when another attaches ---- */
    unsigned auth_failures; /* wrong AUTH or resume= on this connection */
    struct timer auth_timer;    /* the answer to a wrong AUTH, delayed */
    struct sreq *auth_q;        /* that AUTH, waiting for it */
    struct list lost;       /* struct session_lost: leases lost and told,
                               so UNLOCK/EXTEND answer LOST, not NOTHELD */
    size_t nlost;
    /* Its requests not answered yet (session_req.c): struct sreq, in the
     * order read. Tagged ones run at once unless an earlier one names
     * the same resource; an untagged one runs alone. */
    struct list reqs;
    size_t ntagged;         /* tagged ones among them */
    struct list ready;      /* struct sreq whose turn came, to start */
    bool starting;          /* the loop that starts them runs */
    bool paused;            /* we paused the connection's lines */
    struct hmap *order;     /* (owned) resource -> its requests in order;
                               NULL until a tagged request names one */
    struct hmap *tags;      /* (owned) tag -> its request, or NULL */
};

/* What the sessions count (for STATS and /metrics, through stats_glue.c). */
struct session_counters {
    uint64_t commands[PROTO_CMD_COUNT]; /* request lines parsed (empty ones
                                           not), by command; PROTO_CMD_NONE:
                                           the first word is no command */
    uint64_t errors[PROTO_ERR_COUNT];   /* ERR answers, by code */
};

const struct session_counters *session_counters(void);

/* Who times the answers to LOCK (stats_glue.c: the acquire and wait
 * histograms). */
struct session_observer {
    /* A LOCK (or an ADOPT, answered as a LOCK is) was answered, granted
     * or not, `seconds` after it started to run; waited: it allowed a
     * wait (wait= above 0). */
    void (*lock_answered)(bool waited, double seconds);
};

/* NULL: nobody. */
void session_set_observer(const struct session_observer *ob);

/* Before the first session: the config sessions read (live). */
void session_init(const struct conf *conf);
/* A new session, attached to c (which it binds; c serves it from now).
 * Once c has a verified client certificate (c->cert_cn, after its TLS
 * handshake) whose subject CN names a configured user, the session is
 * logged in as that user with its first line. */
struct session *session_create(struct conn *c);

/* Session table / stats. */
size_t session_count(void);
/* Detached sessions waiting for a resume now. */
size_t session_detached_count(void);
/* The daemon exits: every lease a session still holds is left on the
 * nodes to expire (lockmgr_owner_abandon), and the session is closed with
 * EVENT CLOSING reason=shutdown. Returns the leases left; *until as in
 * lockmgr_owner_abandon. */
size_t session_abandon_all(uint64_t *until);
/* Attached sessions whose peer has this address
 * (limits.max_clients_per_ip). */
size_t session_count_ip(const char *ip);
json_t *session_list_json(void);
/* Shutdown: take no new locks (session_set_shutdown); tell every client,
 * answer waiting LOCKs ERR SHUTDOWN, close the sessions that hold nothing
 * and abandon the detached ones (session_shutdown_all); at the end, leave
 * what is still held to expire (session_abandon_all) and close whatever is
 * left (session_close_all). */
void session_set_shutdown(void);
/* The one record that the daemon is stopping (main, server and the
 * sessions all ask here). */
bool session_shutting_down(void);
bool session_shutting_down(void);
void session_shutdown_all(void);
void session_close_all(const char *why);

#endif
