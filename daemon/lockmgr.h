/*
 * lockmgr: the lock table. resource -> this daemon's holders (leases of
 * owners: one exclusive, or any number shared, or up to K slots of a
 * semaphore) and a FIFO of waiting LOCK requests of every mode. A LOCK of
 * several resources waits in the FIFO of each, is granted all of them at
 * once (one atomic script per node) and then becomes one lease per
 * resource, each renewed, extended, lost and released alone.
 *
 * It turns an owner's requests into redlock operations and owns the lease
 * lifecycle: renewal while the owner lives, LOST when a lease cannot be
 * kept, release (or lock-delay) when the owner ends, and waking waiters
 * when a resource is released here, on another daemon (Redis pub/sub) or by
 * key expiry, with a jittered retry as the fallback.
 *
 * lockmgr is a leaf: it knows owners only as a struct lockmgr_owner (which
 * the session embeds) and a table of callbacks, and Redis only through a
 * struct redlock_ops. Answers to an owner are never made from inside a call
 * into lockmgr's state: they are queued with a reference on the owner and
 * delivered once lockmgr has finished what it was doing, so an owner's
 * callback may freely call lockmgr again, or end the owner.
 */
#ifndef REDLOCKD_LOCKMGR_H
#define REDLOCKD_LOCKMGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "redlock.h"

struct conf;
struct lease;
struct lockreq;
struct lockmgr_owner;

enum lockmgr_lost_reason { LOST_EXPIRED, LOST_QUORUM, LOST_NODE };

enum lockmgr_mode { LOCKMGR_EXCLUSIVE, LOCKMGR_SHARED };

/* One LOCK request. Names are copied. */
struct lockmgr_req {
    size_t n;                       /* resources, 1..CONF_MAX_MULTI */
    const char *const *res;
    const size_t *len;
    enum lockmgr_mode mode;         /* SHARED: one resource, no limit */
    uint32_t limit;                 /* K: one slot of a semaphore (one
                                       resource), or 0 */
    uint32_t ttl;
    uint32_t wait;
    bool renew;
    const char *value;              /* the holder's value= (exclusive), NUL-
                                       terminated, or NULL */
};

/* ADOPT: exclusive leases (one resource, or the resources of one grant)
 * whose keys hold `token`, taken over with a new token (protocol.md). */
struct lockmgr_adopt_req {
    size_t n;                       /* resources, 1..CONF_MAX_MULTI */
    const char *const *res;
    const size_t *len;
    const char *token;              /* the lease's token now */
    uint32_t ttl;
    bool renew;
};

/*
 * Why lockmgr refused a request, with the facts its sentence needs:
 * lockmgr decides, the session words it for the client (wording.h), so
 * nothing below the session knows the protocol.
 */
enum lockmgr_no {
    LOCKMGR_NO_BUSY,        /* held by someone else, no wait asked:
                               resource (the first named), count (named),
                               limit (a semaphore's K: all slots held) */
    LOCKMGR_NO_TIMEOUT,     /* still held when the wait ran out: as BUSY */
    LOCKMGR_NO_CUT,         /* the client closed its connection while the
                               request waited: resource, count */
    LOCKMGR_NO_UNAVAILABLE, /* no quorum of nodes voted in time: quorum,
                               nodes, detail (the nodes' own why, or
                               NULL) */
    LOCKMGR_NO_RANDOM,      /* the system's random source failed */
    LOCKMGR_NO_SHUTDOWN,    /* the daemon is shutting down */
    LOCKMGR_NO_WAITERS,     /* limits.max_waiters_per_resource: resource,
                               count (requests waiting for it) */
    LOCKMGR_NO_LOCKS,       /* limits.max_locks_per_session: count (the
                               limit) */
    LOCKMGR_NO_HELD,        /* the owner holds resource already */
    LOCKMGR_NO_KIND,        /* resource is locked here otherwise: here (its
                               K, 0: not a semaphore), limit (the K asked
                               for or found on the nodes, 0: none) */
    LOCKMGR_NO_MULTI_KIND,  /* one resource of a multi-resource grant is a
                               semaphore here: resource, here */
    LOCKMGR_NO_TOO_LARGE,   /* ADOPT: the nodes hold a slot of a semaphore
                               larger than locks.max_limit: resource,
                               limit, count (locks.max_limit) */
    LOCKMGR_NO_NO_SIZE,     /* ADOPT: a slot whose semaphore's size is not
                               stored on the nodes: resource, slot */
    LOCKMGR_NO_GONE,        /* ADOPT: the token holds on too few nodes;
                               UNLOCK, EXTEND: the lease was lost */
};

/* A refusal. Strings live only during the call that hands it over. */
struct lockmgr_refusal {
    enum lockmgr_no why;
    const char *resource;           /* or NULL */
    size_t count;
    uint32_t limit, here, slot;
    int quorum, nodes;
    const char *detail;             /* or NULL */
};

/* What lockmgr tells an owner. Strings live only during the call. */
struct lockmgr_grant {
    const char *resource;   /* the first of the request's */
    size_t nresources;      /* how many it named */
    const char *token;
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;       /* ms left when the answer was made */
    enum lockmgr_mode mode;
    uint32_t limit;         /* a semaphore's K, or 0 */
    uint32_t slot;          /* limit > 0: the slot held */
};

struct lockmgr_status;

/*
 * An owner may have many requests under way at once. Each request carries
 * the asker's `ask` (any pointer: lockmgr only hands it back), and its
 * answer comes with it, once, unless the owner cancelled or ended first.
 */
struct lockmgr_owner_ops {
    void (*ref)(struct lockmgr_owner *o);
    void (*unref)(struct lockmgr_owner *o);
    /* The LOCK or ADOPT succeeded (g) or was refused (no). */
    void (*locked)(struct lockmgr_owner *o, void *ask,
                   const struct lockmgr_grant *g,
                   const struct lockmgr_refusal *no);
    /* UNLOCK or FORCEUNLOCK of nres resources (the first named) done: keys
     * deleted on `nodes` nodes (the fewest of any of them), or no (GONE:
     * the lease had been lost). */
    void (*unlocked)(struct lockmgr_owner *o, void *ask, const char *resource,
                     size_t nres, int nodes,
                     const struct lockmgr_refusal *no);
    /* EXTEND done: the new lease (ttl, validity), or no (GONE,
     * UNAVAILABLE). */
    void (*extended)(struct lockmgr_owner *o, void *ask, const char *resource,
                     uint32_t ttl, int64_t validity,
                     const struct lockmgr_refusal *no);
    /* A lease was lost; the owner no longer holds it. */
    void (*lost)(struct lockmgr_owner *o, const char *resource,
                 uint64_t fence, enum lockmgr_lost_reason why);
    /* STATUS: what lockmgr found, for the owner to present (status.c);
     * it lives only during the call. */
    void (*status)(struct lockmgr_owner *o, void *ask,
                   const struct lockmgr_status *st);
};

/* Embedded in whoever holds locks (a session). Fields are lockmgr's except
 * ops, id and name, which the owner sets with lockmgr_owner_init. */
struct lockmgr_owner {
    const struct lockmgr_owner_ops *ops;
    const char *id;             /* "s42.mifc7b9k": logs, STATUS (owner's storage) */
    const char *name;           /* client name or "" (owner's storage) */
    const char *peer;           /* where its client connects from (the
                                   session's copy, kept across
                                   connections), for the log */
    struct list leases;         /* held leases */
    size_t nleases;
    struct list waits;          /* its LOCKs queued or in flight (struct
                                   lockreq), in the order asked */
    size_t nwaits;
    unsigned gen;               /* requests made before the last
                                   lockmgr_owner_cancel are not answered */
    bool ended;
    /* Set by the owner: a session detached from its connection (STATUS
     * says so), and since when (timer_now ms). */
    bool detached;
    uint64_t detached_at;
};

/*
 * lockmgr's own counters, which only grow: X(field, row, cell).
 *
 *   field  the member of struct lockmgr_counters
 *   row    the STATS_CODEC row (stats.h) that reports it
 *   cell   for a labelled row, the cell as an index in brackets; else empty
 *
 * lockmgr uses only `field`: it is a leaf and never includes stats.h. The
 * row and cell are stats' names, spelt out here so that this one list is
 * the whole mapping; they are expanded only in stats_glue.c, so a name
 * misspelt on either side fails to compile instead of reporting 0.
 */
#define LOCKMGR_COUNTERS(X)                                                  \
    X(acquire_ok, acquisitions, [STATS_RESULT_ok])                          \
    X(acquire_busy, acquisitions, [STATS_RESULT_busy])                      \
    X(acquire_timeout, acquisitions, [STATS_RESULT_timeout])                \
    X(acquire_unavailable, acquisitions, [STATS_RESULT_unavailable])        \
    X(releases, releases, )                                                 \
    X(extends, extends, )                                                   \
    X(renewals, renewals, )                                                 \
    X(renewal_failures, renewal_failures, )                                 \
    X(leases_lost, leases_lost, )                                           \
    X(adopts, adopts, )                 /* ADOPTs granted */                \
    X(adopts_left, adopts_left, )       /* rotated, left to expire */       \
    X(waits, waits, )                                                       \
    /* A waiter retried: told of a release (pub/sub or local), or by its   \
     * fallback timer. */                                                   \
    X(wakeups_notified, wakeups, [STATS_CAUSE_notified])                    \
    X(wakeups_retry, wakeups, [STATS_CAUSE_retry])

#define LOCKMGR_COUNTER_FIELD(field, row, cell) uint64_t field;
struct lockmgr_counters {
    LOCKMGR_COUNTERS(LOCKMGR_COUNTER_FIELD)
};
#undef LOCKMGR_COUNTER_FIELD

/* rl is the Redis side: &redlock_ops_default, or a test's fake. */
void lockmgr_init(const struct conf *conf, const struct redlock_ops *rl);
void lockmgr_deinit(void);

/* Start-up: until lockmgr_ready(), a LOCK is held back instead of asking
 * nodes that are not connected or checked yet (it would fail UNAVAILABLE
 * at once: a socket-activated daemon's first client). A waiting LOCK whose
 * wait runs out first answers ERR UNAVAILABLE. main.c calls lockmgr_ready
 * once a quorum votes or redis.connect_timeout_ms has passed. */
void lockmgr_starting(void);
void lockmgr_ready(void);

void lockmgr_owner_init(struct lockmgr_owner *o,
                        const struct lockmgr_owner_ops *ops,
                        const char *id, const char *name, const char *peer);
/* The daemon is stopping: every LOCK of o that waits is refused SHUTDOWN
 * (one talking to Redis after that try, a grant given back). What o holds
 * stays held (renewed) until its client releases it. */
void lockmgr_owner_shutdown(struct lockmgr_owner *o);
/* Leave every lease o holds on the nodes, to expire by its ttl: neither
 * released nor renewed any more, and no longer o's (a later
 * lockmgr_owner_end has nothing to release). Returns how many; *until is
 * raised to the latest uv_now ms at which one of their keys may still
 * exist. For the daemon's exit: a holder that may still be working must
 * never see its lock deleted under it. */
size_t lockmgr_owner_abandon(struct lockmgr_owner *o, uint64_t *until);
/* ADOPT: answered through ops->locked as a LOCK is: the grant (new
 * token, the lease's fence, the ttl, the validity of this round), or
 * HELD, LOCKS, GONE (the token holds on too few nodes), UNAVAILABLE, or a
 * kind this daemon cannot hold beside its own. A lease of this daemon's
 * with the old token (another session's) is lost by its owner once the
 * new one holds. */
void lockmgr_adopt(struct lockmgr_owner *o, const struct lockmgr_adopt_req *r,
                   void *ask);
/* Whoever asked o's requests so far is gone, but o lives on (a session
 * whose connection ended, detached, or was taken over by another): o's
 * LOCKs queued or in flight are withdrawn (a grant that arrives is given
 * back, as after lockmgr_owner_end), an ADOPT in flight still makes its
 * lease o's (its token was o's lease), and no answer to a request made
 * before reaches o (the operations themselves complete). What o holds
 * stays o's, renewed, and its losses still reach o (->lost); requests
 * made afterwards are answered. */
void lockmgr_owner_cancel(struct lockmgr_owner *o);
/* The owner is ending: cancel its pending LOCKs and release all it holds
 * (keeping keys for lock_delay_ms when `died` and the delay is set). No
 * callback reaches o after this returns. */
void lockmgr_owner_end(struct lockmgr_owner *o, bool died);

/* Acquire what r names for o, which must hold none of it (the caller
 * checks HELD, names given twice and limits first). A limit that
 * disagrees with what this daemon holds or waits for on the resource
 * (another K, or a semaphore where plain locks are held, or the reverse)
 * is refused KIND. Answers through ->locked, with ask. */
void lockmgr_lock_req(struct lockmgr_owner *o, const struct lockmgr_req *r,
                      void *ask);
/* The same for one resource, exclusive. */
void lockmgr_lock(struct lockmgr_owner *o, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew, void *ask);
/* The lease o holds on resource, or NULL. */
struct lease *lockmgr_held(const struct lockmgr_owner *o,
                           const char *resource, size_t len);
/* UNLOCK: answers through ->unlocked. */
void lockmgr_unlock(struct lockmgr_owner *o, struct lease *l, void *ask);
/* UNLOCK of n leases of o at once (n >= 1): one answer. */
void lockmgr_unlock_many(struct lockmgr_owner *o, struct lease *const *l,
                         size_t n, void *ask);
/* EXTEND: answers through ->extended. */
void lockmgr_extend(struct lockmgr_owner *o, struct lease *l, uint32_t ttl,
                    void *ask);
/* EXTEND value=: the same, and the holder's value on the nodes replaced by
 * value (NUL-terminated) without giving up the lock; ttl 0: the lease's
 * own. An exclusive lease's only (the caller checks). */
void lockmgr_extend_value(struct lockmgr_owner *o, struct lease *l,
                          uint32_t ttl, const char *value, void *ask);
/* The holder's value of an exclusive lease taken here with value= (or
 * set by EXTEND), or NULL. */
const char *lockmgr_lease_value(const struct lease *l);
/* What kind of lease l is: its mode, and a semaphore's K (else 0). */
void lockmgr_lease_kind(const struct lease *l, enum lockmgr_mode *mode,
                        uint32_t *limit);
/* The client will not wait any longer (EOF): o's LOCKs sleeping in their
 * queues are refused CUT now; those talking to Redis after that try,
 * without sleeping again. */
void lockmgr_cut_wait(struct lockmgr_owner *o);
/* FORCEUNLOCK (an operator's): delete the resource's keys on every node
 * whoever holds them; answers through ->unlocked. A holder on this daemon
 * is told at once (->lost, reason node). */
void lockmgr_force_release(struct lockmgr_owner *o, const char *resource,
                           size_t len, void *ask);
/* STATUS: answers through ->status. limit: the semaphore's K whose slots
 * to look at, or 0 for what this daemon knows of it, else what the
 * nodes' slot labels say (LOCKMGR_SLOT_PROBE). */
void lockmgr_status(struct lockmgr_owner *o, const char *resource,
                    size_t len, uint32_t limit, void *ask);
/* One of o's leases, as LOCKS and SESSIONS show it (status.c). The token
 * is a bearer credential for ADOPT: shown to o's own session only. */
struct lockmgr_lease_view {
    const char *resource;
    const char *token;
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;
    uint64_t held_ms;
    bool renew;
    uint64_t renewals;
    enum lockmgr_mode mode;
    uint32_t limit;             /* semaphore: K, else 0 */
    int64_t slot;               /* semaphore: the slot, else -1 */
    const char *value;          /* the holder's value, or NULL */
};
typedef void lockmgr_lease_fn(void *ud, const struct lockmgr_lease_view *l);
/* fn for each lease o holds, in the order they were granted. */
void lockmgr_owner_leases(const struct lockmgr_owner *o, lockmgr_lease_fn *fn,
                          void *ud);
const char *lockmgr_mode_name(enum lockmgr_mode m);     /* "shared"... */

/* STATUS lists at most this many holders here (its reply must stay far
 * below limits.max_output_bytes); holders_here counts them all. */
#define LOCKMGR_STATUS_HOLDERS 64
/* STATUS (and a watch's read) of a semaphore this daemon does not know
 * looks for its slots among the first this many (lockmgr_peek). */
#define LOCKMGR_SLOT_PROBE 16

/* A holder on this daemon, as STATUS shows it. */
struct lockmgr_holder_view {
    const char *session;
    const char *name;           /* "" for none */
    uint64_t fence;
    uint64_t held_ms;
    int64_t validity;
    enum lockmgr_mode mode;
    int64_t slot;               /* semaphore: the slot, else -1 */
    const char *value;          /* the holder's value, or NULL */
    bool attached;              /* its session has a connection */
    uint64_t detached_ms;
};

/* STATUS lists at most this many of this daemon's LOCKs waiting for the
 * resource, the first in the queue; waiters counts them all. */
#define LOCKMGR_STATUS_WAITERS 64

/* A LOCK waiting here, as STATUS shows it. */
struct lockmgr_waiter_view {
    const char *session;
    const char *name;           /* "" for none */
    uint64_t waited_ms;         /* since the LOCK was asked */
    enum lockmgr_mode mode;
    uint32_t limit;             /* semaphore: K, else 0 */
    size_t nresources;          /* the resources the LOCK names */
};

/* STATUS's decisions from what the nodes answered (pure: unit-tested on
 * tables). */
struct lockmgr_status_plan {
    int present;                /* nodes with the exclusive key */
    int with_shared;            /* nodes with a live shared holder */
    int64_t shared_holders;     /* the most any voting node counts (at
                                   least those here) */
    uint32_t slots_held;        /* semaphore slots on a quorum */
    const char *mode;           /* "exclusive", "shared" or NULL */
    bool held;
    bool remote_token;          /* no holder here, but a quorum of voting
                                   nodes holds one token */
    int remote;                 /* then the node whose label names the
                                   holder, or -1 (a foreign client's) */
    uint64_t remote_fence;      /* the fence stored with that label */
    bool remote_fence_agreed;   /* ... by a quorum of the voting nodes */
};
void lockmgr_status_plan(const struct redlock_node_view *v, int n, int quorum,
                         uint32_t limit, size_t nexcl_here,
                         size_t nshared_here, bool holder_here,
                         struct lockmgr_status_plan *p);

/* What a STATUS found, as ->status gets it. */
struct lockmgr_status {
    const char *resource;
    const char *key;            /* on the nodes */
    const char *daemon;         /* this daemon's id (config `id`) */
    const struct lockmgr_status_plan *plan;
    const struct lockmgr_holder_view *holders;
    size_t nholders;            /* at most LOCKMGR_STATUS_HOLDERS */
    size_t holders_here;        /* all of them */
    size_t waiters;
    const struct lockmgr_waiter_view *waiting;
    size_t nwaiting;            /* at most LOCKMGR_STATUS_WAITERS */
    uint32_t limit;             /* semaphore slots looked at, or 0 */
    const struct redlock_node_view *nodes;
    int nnodes;
};

/* STATUS without a session (the watchers, watch.c): what the nodes and
 * this daemon hold of resource now, handed to fn (st lives during the
 * call only). limit: the semaphore slots to look at, or 0 for what this
 * daemon knows. Never answers inside the call. */
typedef void lockmgr_peek_fn(void *ud, const struct lockmgr_status *st);
void lockmgr_peek(const char *resource, size_t len, uint32_t limit,
                  lockmgr_peek_fn *fn, void *ud);

/* Told each time a grant, a release, a new value or an ADOPT changed who
 * holds resource here, once the nodes show it (len bytes; limit: a
 * semaphore's K, else 0). Kept across lockmgr_init; NULL for none. */
typedef void lockmgr_change_fn(const char *resource, size_t len,
                               uint32_t limit);
void lockmgr_set_change_observer(lockmgr_change_fn *fn);

/* TOP lists at most LOCKMGR_TOP_MAX resources (its reply must stay far
 * below limits.max_output_bytes), LOCKMGR_TOP_DEFAULT unless told. */
#define LOCKMGR_TOP_MAX 100
#define LOCKMGR_TOP_DEFAULT 20

/* A resource held or waited for here, as TOP shows it. */
struct lockmgr_top_view {
    const char *resource;
    enum lockmgr_mode mode;     /* of the longest hold, else the longest
                                   wait */
    uint32_t limit;             /* semaphore: K, else 0 */
    size_t holders;             /* sessions of this daemon holding it */
    const char *session;        /* the one holding it longest, or NULL */
    const char *name;           /* its client name, "" for none */
    uint64_t held_ms;           /* that hold so far; 0: none */
    size_t waiters;             /* LOCKs of this daemon waiting for it */
    uint64_t waited_ms;         /* the longest of their waits so far */
};
/* Which resources the asker may see (a user's prefixes). */
typedef bool lockmgr_visible_fn(void *ud, const char *resource, size_t len);
/* TOP: of the resources held or waited for here that visible accepts (all
 * when NULL), the first max in out (*n of them): the longest wait first,
 * then the longest hold, then by name. Returns how many there are in all.
 * The strings live until lockmgr is next called. */
size_t lockmgr_top(struct lockmgr_top_view *out, size_t max, size_t *n,
                   lockmgr_visible_fn *visible, void *ud);

/* A release notification for a Redis key (pub/sub). */
void lockmgr_on_release(const char *key, size_t len);

/*
 * What the wait and hold histograms are made of (stats_glue, above
 * lockmgr, watches; lockmgr knows no stats): a LOCK was answered, granted
 * (at once or after a wait) or ERR TIMEOUT, waited_ms after it was asked,
 * told once for each resource it named; a lease stopped being held
 * (released, lost, or its owner ended) after held_ms.
 */
struct lockmgr_observer {
    void (*waited)(const char *resource, size_t len, bool granted,
                   uint64_t waited_ms);
    void (*held)(const char *resource, size_t len, uint64_t held_ms);
};
/* Kept across lockmgr_init; NULL for none. */
void lockmgr_set_observer(const struct lockmgr_observer *ob);

const char *lockmgr_lost_reason_name(enum lockmgr_lost_reason r);
const struct lockmgr_counters *lockmgr_counters(void);
size_t lockmgr_held_count(void);
size_t lockmgr_waiter_count(void);
/* Operations in flight or answers not yet delivered (shutdown waits). */
bool lockmgr_busy(void);

#endif
