/*
 * lockmgr: the lock table. resource -> this daemon's holder (a lease of one
 * session) and a FIFO of waiting LOCK requests.
 *
 * It turns session requests into redlock operations and owns the lease
 * lifecycle: renewal while the session lives, EVENT LOST when a lease cannot
 * be kept, release (or lock-delay) when the session ends, and waking waiters
 * when a resource is released here, on another daemon (Redis pub/sub) or by
 * key expiry, with a jittered retry as the fallback.
 *
 * Results go back to the session through session_*_done() calls. Every
 * session pointer held across an async operation carries a reference
 * (session_ref/unref), so a reply for a session that has gone finds it
 * marked closed, never freed.
 */
#ifndef REDLOCKD_LOCKMGR_H
#define REDLOCKD_LOCKMGR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "redlock.h"
#include "timer.h"

struct conf;
struct session;
struct lock_entry;

/* One lock held by one session. Owned by lockmgr; listed in its session. */
struct lease {
    struct lease *s_prev, *s_next;  /* session's list of leases */
    struct session *session;        /* NULL once detached from it */
    struct lock_entry *entry;
    char token[REDLOCK_TOKEN_LEN + 1];
    uint64_t fence;
    uint32_t ttl;                   /* current lease on Redis (ms) */
    bool renew;
    bool gone;                      /* released or lost: free when idle */
    int ops;                        /* redlock ops in flight for it */
    uint64_t acquired_at;           /* uv_now ms */
    uint64_t valid_until;           /* uv_now ms the validity runs out */
    uint64_t renewals;
    struct timer timer;             /* next renewal, or expiry */
};

enum lockmgr_lost_reason { LOST_EXPIRED, LOST_QUORUM, LOST_NODE };

void lockmgr_init(const struct conf *conf);
void lockmgr_deinit(void);

/*
 * Acquire resource for s (which must not hold it; the session checks HELD
 * and limits first). Answers later, or synchronously when every node is
 * down, through session_lock_done().
 */
void lockmgr_lock(struct session *s, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew);
/* The lease s holds on resource, or NULL. */
struct lease *lockmgr_held(const struct session *s, const char *resource,
                           size_t len);
/* UNLOCK: answers through session_unlock_done(). */
void lockmgr_unlock(struct session *s, struct lease *l);
/* EXTEND: answers through session_extend_done(). */
void lockmgr_extend(struct session *s, struct lease *l, uint32_t ttl);
/* The client will not wait any longer (EOF): a LOCK of s sleeping in the
 * queue answers ERR TIMEOUT now; one talking to Redis answers after that
 * try, without sleeping again. */
void lockmgr_cut_wait(struct session *s);
/* The session is ending: cancel its pending LOCK and release all it holds
 * (keeping keys for lock_delay_ms when `died` and the delay is set). */
void lockmgr_session_end(struct session *s, bool died);
/* STATUS: answers through session_status_done(s, json). */
void lockmgr_status(struct session *s, const char *resource, size_t len);

/* A release notification for a Redis key (pub/sub). */
void lockmgr_on_release(const char *key, size_t len);

/* lockmgr's own counters (it is a leaf: whoever reports them reads them
 * here). They only grow. */
struct lockmgr_counters {
    uint64_t acquire_ok;
    uint64_t acquire_busy;
    uint64_t acquire_timeout;
    uint64_t acquire_unavailable;
    uint64_t releases;
    uint64_t extends;
    uint64_t renewals;
    uint64_t renewal_failures;
    uint64_t leases_lost;
    uint64_t waits;
    uint64_t wakeups_notified;      /* pub/sub or local release */
    uint64_t wakeups_retry;         /* fallback timer */
};
const struct lockmgr_counters *lockmgr_counters(void);

const char *lockmgr_lease_resource(const struct lease *l);
int64_t lockmgr_lease_validity(const struct lease *l);
const char *lockmgr_lost_reason_name(enum lockmgr_lost_reason r);
size_t lockmgr_held_count(void);
size_t lockmgr_waiter_count(void);

#endif
