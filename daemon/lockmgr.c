/*
 * lockmgr: see lockmgr.h.
 *
 * Ownership:
 * - An entry lives while it has a holder or waiters (entry_maybe_free).
 * - A lockreq (one LOCK request) is owned by its entry's FIFO; it holds a
 *   session reference until it has answered. When its session ends first,
 *   req->s becomes NULL and the request is dropped, or, if an acquisition is
 *   in flight, dropped when it completes (releasing the keys if it won).
 * - A lease is owned by lockmgr. While held it is on its session's list and
 *   is its entry's holder; on release or loss it leaves the session at once
 *   but stays the entry's holder until its keys are gone from Redis (so no
 *   local waiter races the release), then is freed when no op refers to it.
 *
 * Calls into session code (session_*_done, session_lease_lost) come last in
 * each function: they may run further requests, and even end the session.
 */
#include "lockmgr.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "hmap.h"
#include "log.h"
#include "mem.h"
#include "pool.h"
#include "session.h"
#include "stats.h"

struct lockreq {
    struct lockreq *prev, *next;    /* in entry FIFO */
    struct lock_entry *e;
    struct session *s;              /* (ref) NULL once cancelled */
    uint32_t ttl;
    bool renew;
    uint64_t deadline;              /* uv_now ms; 0 = do not wait */
    bool attempting;                /* a redlock acquire is in flight */
    bool no_token;                  /* the OS random source failed */
    enum redlock_status last;
    struct timer timer;
    char token[REDLOCK_TOKEN_LEN + 1];
};

struct lock_entry {
    struct hmap_node node;
    struct lease *holder;           /* this daemon's holder, or NULL */
    bool releasing;                 /* the holder's keys are going away */
    bool notified;                  /* a release was announced meanwhile */
    struct lockreq *whead, *wtail;
    size_t nwait;
    size_t keylen;
    const char *resource;           /* inside key, after the prefix */
    char key[];                     /* key_prefix + resource */
};

/* Owned copy of the lease's resource follows struct lease. */
struct lease_box {
    struct lease l;
    char resource[];
};

static struct {
    const struct conf *conf;
    struct hmap table;
    size_t prefixlen;
    size_t held;
    size_t waiters;
    struct lockmgr_counters c;
} M;

static void req_attempt(struct lockreq *q);

void lockmgr_init(const struct conf *conf)
{
    M.conf = conf;
    hmap_init(&M.table);
    M.prefixlen = strlen(conf->locks.key_prefix);
}

void lockmgr_deinit(void)
{
    /* Sessions are closed and ops drained before this; anything left is a
     * lease whose release did not complete before the shutdown timeout. */
    struct hmap_iter it;
    struct hmap_node *n;
    hmap_iter_init(&it, &M.table);
    while ((n = hmap_iter_next(&it))) {
        struct lock_entry *e = container_of(n, struct lock_entry, node);
        hmap_del(&M.table, n);
        free(e);
    }
    hmap_deinit(&M.table);
}

const char *lockmgr_lost_reason_name(enum lockmgr_lost_reason r)
{
    switch (r) {
    case LOST_EXPIRED: return "expired";
    case LOST_QUORUM:  return "quorum";
    case LOST_NODE:    return "node";
    }
    return "unknown";
}

size_t lockmgr_held_count(void)
{
    return M.held;
}

const struct lockmgr_counters *lockmgr_counters(void)
{
    return &M.c;
}

size_t lockmgr_waiter_count(void)
{
    return M.waiters;
}

const char *lockmgr_lease_resource(const struct lease *l)
{
    return ((const struct lease_box *)(const void *)l)->resource;
}

int64_t lockmgr_lease_validity(const struct lease *l)
{
    uint64_t now = timer_now();
    return l->valid_until > now ? (int64_t)(l->valid_until - now) : 0;
}

/* ---- entries ------------------------------------------------------------ */

static struct lock_entry *entry_find(const char *res, size_t len)
{
    char key[2048];
    if (M.prefixlen + len > sizeof(key))
        return NULL;
    memcpy(key, M.conf->locks.key_prefix, M.prefixlen);
    memcpy(key + M.prefixlen, res, len);
    struct hmap_node *n = hmap_get(&M.table, key, M.prefixlen + len);
    return n ? container_of(n, struct lock_entry, node) : NULL;
}

static struct lock_entry *entry_get(const char *res, size_t len)
{
    struct lock_entry *e = entry_find(res, len);
    if (e)
        return e;
    e = mem_alloc(sizeof(*e) + M.prefixlen + len + 1);
    memcpy(e->key, M.conf->locks.key_prefix, M.prefixlen);
    memcpy(e->key + M.prefixlen, res, len);
    e->keylen = M.prefixlen + len;
    e->key[e->keylen] = '\0';
    e->resource = e->key + M.prefixlen;
    hmap_put(&M.table, &e->node, e->key, e->keylen);
    return e;
}

static void entry_maybe_free(struct lock_entry *e)
{
    if (e->holder || e->whead)
        return;
    hmap_del(&M.table, &e->node);
    free(e);
}

static void entry_push(struct lock_entry *e, struct lockreq *q)
{
    q->e = e;
    q->next = NULL;
    q->prev = e->wtail;
    if (e->wtail)
        e->wtail->next = q;
    else
        e->whead = q;
    e->wtail = q;
    e->nwait++;
    M.waiters++;
}

static void entry_remove(struct lock_entry *e, struct lockreq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        e->whead = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        e->wtail = q->prev;
    q->prev = q->next = NULL;
    e->nwait--;
    M.waiters--;
}

/* Let the first waiter try, unless a holder here makes that pointless (it
 * is woken when that holder's keys are gone). */
static void entry_kick(struct lock_entry *e)
{
    struct lockreq *q = e->whead;

    if (!q || q->attempting || e->holder)
        return;
    req_attempt(q);
}

/* ---- leases ------------------------------------------------------------- */

static void lease_timer_cb(struct timer *t);

static void lease_put(struct lease *l)
{
    if (l->gone && l->ops == 0) {
        timer_stop(&l->timer);
        free(l);
    }
}

static uint64_t lease_renew_interval(const struct lease *l)
{
    uint64_t iv = l->ttl / 3;
    return iv ? iv : 1;
}

static void lease_arm(struct lease *l)
{
    if (l->renew)
        timer_start(&l->timer, lease_renew_interval(l));
    else
        timer_start_at(&l->timer, l->valid_until);
}

static struct lease *lease_create(struct lockreq *q, uint64_t fence,
                                  int64_t validity)
{
    struct lock_entry *e = q->e;
    size_t len = e->keylen - M.prefixlen;
    struct lease_box *b = mem_alloc(sizeof(*b) + len + 1);
    struct lease *l = &b->l;

    memcpy(b->resource, e->resource, len);
    b->resource[len] = '\0';
    l->entry = e;
    memcpy(l->token, q->token, sizeof(l->token));
    l->fence = fence;
    l->ttl = q->ttl;
    l->renew = q->renew;
    l->acquired_at = timer_now();
    l->valid_until = l->acquired_at + (uint64_t)(validity > 0 ? validity : 0);
    timer_init(&l->timer, lease_timer_cb, l);
    lease_arm(l);
    return l;
}

static void release_done(void *ud, const struct redlock_result *res);

/*
 * The lease leaves its session now; its keys are deleted (or kept for
 * delay_ms, owner-checked) and the entry is free for others once that is
 * done. `unlocker` is the session waiting for an UNLOCK answer, if any.
 */
struct release_ctx {
    struct lease *l;
    struct session *unlocker;   /* (ref) or NULL */
};

static void lease_release(struct lease *l, uint32_t delay_ms,
                          struct session *unlocker)
{
    struct lock_entry *e = l->entry;
    struct release_ctx *x = mem_alloc(sizeof(*x));

    if (l->session) {
        session_remove_lease(l->session, l);
        l->session = NULL;
    }
    timer_stop(&l->timer);
    l->gone = true;
    e->releasing = true;
    M.held--;
    M.c.releases++;
    x->l = l;
    x->unlocker = unlocker;
    if (unlocker)
        session_ref(unlocker);
    l->ops++;
    if (delay_ms > 0)
        redlock_extend(e->key, e->keylen, l->token, delay_ms, release_done, x);
    else
        redlock_release(e->key, e->keylen, l->token, release_done, x);
}

static void release_done(void *ud, const struct redlock_result *res)
{
    struct release_ctx *x = ud;
    struct lease *l = x->l;
    struct lock_entry *e = l->entry;
    struct session *s = x->unlocker;
    char resource[1100];

    free(x);
    snprintf(resource, sizeof(resource), "%s", lockmgr_lease_resource(l));
    l->entry = NULL;
    l->ops--;
    if (e && e->holder == l) {
        e->holder = NULL;
        e->releasing = false;
        if (e->whead && !e->whead->attempting)
            M.c.wakeups_notified++;
        entry_kick(e);
        entry_maybe_free(e);
    }
    lease_put(l);
    if (s) {
        enum proto_err err = PROTO_ERR_NONE;
        if (res->deleted == 0 && res->busy >= pool_quorum())
            err = PROTO_ERR_LOST;
        session_unlock_done(s, resource, res->deleted, err);
        session_unref(s);
    }
}

/* The lease could not be kept: tell its session, drop it, and remove its
 * keys wherever they are still ours. */
static void lease_lose(struct lease *l, enum lockmgr_lost_reason why)
{
    struct session *s = l->session;

    M.c.leases_lost++;
    l->ops++;   /* keep l for the event below */
    lease_release(l, 0, NULL);
    if (s)
        session_lease_lost(s, l, why);
    l->ops--;
    lease_put(l);
}

static void renew_done(void *ud, const struct redlock_result *res)
{
    struct lease *l = ud;
    uint64_t now = timer_now();

    l->ops--;
    if (l->gone) {
        lease_put(l);
        return;
    }
    if (res->status == REDLOCK_OK) {
        l->valid_until = now + (uint64_t)res->validity;
        l->renewals++;
        M.c.renewals++;
        lease_arm(l);
        return;
    }
    M.c.renewal_failures++;
    if (res->status == REDLOCK_LOST) {
        lease_lose(l, LOST_NODE);
        return;
    }
    if (now >= l->valid_until) {
        lease_lose(l, LOST_QUORUM);
        return;
    }
    /* Not enough nodes answered: try again soon, until validity ends. */
    uint64_t retry = l->ttl / 10;
    if (retry < 20)
        retry = 20;
    if (retry > 1000)
        retry = 1000;
    log_info("renewal of %s reached %d nodes; retrying in %" PRIu64 " ms "
             "(%" PRIu64 " ms of validity left)", lockmgr_lease_resource(l),
             res->ok, retry, l->valid_until - now);
    uint64_t next = now + retry;
    timer_start_at(&l->timer, next < l->valid_until ? next : l->valid_until);
}

static void lease_timer_cb(struct timer *t)
{
    struct lease *l = t->data;
    uint64_t now = timer_now();

    if (l->gone)
        return;
    if (now >= l->valid_until) {
        lease_lose(l, l->renew ? LOST_QUORUM : LOST_EXPIRED);
        return;
    }
    if (!l->renew) {
        timer_start_at(&l->timer, l->valid_until);
        return;
    }
    l->ops++;
    redlock_extend(l->entry->key, l->entry->keylen, l->token, l->ttl,
                   renew_done, l);
}

/* ---- lock requests ------------------------------------------------------ */

static void req_free(struct lockreq *q)
{
    timer_stop(&q->timer);
    free(q);
}

/* Take q out of its entry and free it; the next waiter gets its turn. */
static void req_drop(struct lockreq *q)
{
    struct lock_entry *e = q->e;
    bool was_head = e->whead == q;

    entry_remove(e, q);
    req_free(q);
    if (was_head)
        entry_kick(e);
    entry_maybe_free(e);
}

/* Answer q with an error and drop it. */
static void req_fail(struct lockreq *q, enum proto_err err, const char *msg)
{
    struct session *s = q->s;

    req_drop(q);
    if (s) {
        s->lockreq = NULL;
        session_lock_done(s, NULL, err, msg);
        session_unref(s);
    }
}

static void req_give_up(struct lockreq *q)
{
    char msg[PROTO_MAX_ERRMSG];

    switch (q->last) {
    case REDLOCK_UNAVAILABLE:
        M.c.acquire_unavailable++;
        snprintf(msg, sizeof(msg), "could not reach a quorum of %d of %d "
                 "redis nodes in time", pool_quorum(), pool_nnodes());
        req_fail(q, PROTO_ERR_UNAVAILABLE, msg);
        return;
    default:
        if (q->deadline) {
            M.c.acquire_timeout++;
            snprintf(msg, sizeof(msg), "%s is still held by someone else",
                     q->e->resource);
            req_fail(q, PROTO_ERR_TIMEOUT, msg);
        } else {
            M.c.acquire_busy++;
            snprintf(msg, sizeof(msg), "%s is held by someone else",
                     q->e->resource);
            req_fail(q, PROTO_ERR_BUSY, msg);
        }
        return;
    }
}

static uint64_t jitter(uint64_t ms)
{
    /* Spread retries over [ms/2, 3ms/2) so waiters on many daemons do not
     * poll in step. */
    if (ms < 2)
        return 1;
    return ms / 2 + (uint64_t)random() % ms;
}

static void req_sleep(struct lockreq *q, int64_t pttl)
{
    uint64_t now = timer_now();
    uint64_t delay = jitter(M.conf->locks.retry_ms);

    if (pttl >= 0 && (uint64_t)pttl + 1 < delay)
        delay = (uint64_t)pttl + 1;     /* the key expires before that */
    uint64_t due = now + delay;
    if (due > q->deadline)
        due = q->deadline;
    timer_start_at(&q->timer, due);
}

static void attempt_done(void *ud, const struct redlock_result *res)
{
    struct lockreq *q = ud;
    struct lock_entry *e = q->e;
    struct session *s = q->s;

    q->attempting = false;
    if (!s) {
        /* The session ended while we were acquiring. */
        if (res->status == REDLOCK_OK)
            redlock_release(e->key, e->keylen, q->token, NULL, NULL);
        req_drop(q);
        return;
    }
    if (res->status == REDLOCK_OK) {
        struct lease *l = lease_create(q, res->fence, res->validity);
        e->holder = l;
        l->session = s;
        session_add_lease(s, l);
        M.held++;
        M.c.acquire_ok++;
        entry_remove(e, q);
        req_free(q);
        s->lockreq = NULL;
        session_lock_done(s, l, PROTO_ERR_NONE, NULL);
        session_unref(s);
        return;
    }
    q->last = res->status;
    bool notified = e->notified;
    e->notified = false;
    if (!q->deadline || timer_now() >= q->deadline) {
        req_give_up(q);
        return;
    }
    if (notified && res->status == REDLOCK_BUSY) {
        /* The holder released while we were asking: ask again now. */
        req_attempt(q);
        return;
    }
    req_sleep(q, res->status == REDLOCK_BUSY ? res->pttl : -1);
}

static void req_attempt(struct lockreq *q)
{
    timer_stop(&q->timer);
    if (redlock_token(q->token) != 0) {
        /* Answer from the timer, never from inside our caller: it may be
         * about to touch the entry this request's answer could free. */
        q->no_token = true;
        timer_start(&q->timer, 0);
        return;
    }
    q->attempting = true;
    q->e->notified = false;
    redlock_acquire(q->e->key, q->e->keylen, q->token, q->ttl, attempt_done, q);
}

static void req_timer_cb(struct timer *t)
{
    struct lockreq *q = t->data;
    struct lock_entry *e = q->e;

    if (q->attempting)
        return;
    if (q->no_token) {
        log_error("getrandom failed: cannot make a lock token");
        q->last = REDLOCK_UNAVAILABLE;
        req_fail(q, PROTO_ERR_UNAVAILABLE, "no random source for a token");
        return;
    }
    if (timer_now() >= q->deadline) {
        req_give_up(q);
        return;
    }
    if (e->whead == q && !e->holder) {
        M.c.wakeups_retry++;
        req_attempt(q);
        return;
    }
    timer_start_at(&q->timer, q->deadline);
}

void lockmgr_lock(struct session *s, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew)
{
    struct lock_entry *e = entry_get(resource, len);
    struct lockreq *q = mem_alloc(sizeof(*q));

    q->s = s;
    session_ref(s);
    s->lockreq = q;
    q->ttl = ttl;
    q->renew = renew;
    q->last = REDLOCK_BUSY;
    q->deadline = wait ? timer_now() + wait : 0;
    timer_init(&q->timer, req_timer_cb, q);
    entry_push(e, q);
    if (wait)
        M.c.waits++;

    if (e->whead == q && !e->holder) {
        req_attempt(q);
        return;
    }
    if (e->whead == q && e->releasing) {
        /* The last holder's keys are being deleted right now (UNLOCK on
         * another session, or a lost lease being cleaned up): that ends
         * within a round trip, and release_done() kicks this request, so
         * even a wait=0 LOCK waits for it instead of seeing a stale BUSY. */
        return;
    }
    /* Held here, or others wait first: first come, first served. */
    if (!wait) {
        req_give_up(q);
        return;
    }
    timer_start_at(&q->timer, q->deadline);
}

/* ---- session-facing operations ----------------------------------------- */

struct lease *lockmgr_held(const struct session *s, const char *resource,
                           size_t len)
{
    struct lock_entry *e = entry_find(resource, len);
    if (!e || !e->holder || e->holder->gone || e->holder->session != s)
        return NULL;
    return e->holder;
}

void lockmgr_unlock(struct session *s, struct lease *l)
{
    lease_release(l, 0, s);
}

struct extend_ctx {
    struct lease *l;
    struct session *s;      /* (ref) */
    uint32_t ttl;
};

static void extend_done(void *ud, const struct redlock_result *res)
{
    struct extend_ctx *x = ud;
    struct lease *l = x->l;
    struct session *s = x->s;
    uint32_t ttl = x->ttl;
    enum proto_err err = PROTO_ERR_NONE;

    free(x);
    M.c.extends++;
    if (l->gone) {
        err = PROTO_ERR_LOST;
    } else if (res->status == REDLOCK_OK) {
        l->ttl = ttl;
        l->valid_until = timer_now() + (uint64_t)res->validity;
        lease_arm(l);
    } else if (res->status == REDLOCK_LOST) {
        err = PROTO_ERR_LOST;
        M.c.leases_lost++;
        lease_release(l, 0, NULL);
    } else {
        err = PROTO_ERR_UNAVAILABLE;
    }
    session_extend_done(s, l, err, res->validity);
    session_unref(s);
    l->ops--;
    lease_put(l);
}

void lockmgr_extend(struct session *s, struct lease *l, uint32_t ttl)
{
    struct extend_ctx *x = mem_alloc(sizeof(*x));

    x->l = l;
    x->s = s;
    x->ttl = ttl;
    session_ref(s);
    l->ops++;
    redlock_extend(l->entry->key, l->entry->keylen, l->token, ttl,
                   extend_done, x);
}

void lockmgr_cut_wait(struct session *s)
{
    struct lockreq *q = s->lockreq;

    if (!q || !q->deadline)
        return;     /* wait=0 requests end on their own, soon */
    q->deadline = 0;
    if (q->attempting)
        return;
    M.c.acquire_timeout++;
    req_fail(q, PROTO_ERR_TIMEOUT, "the client closed the connection while "
             "waiting");
}

void lockmgr_session_end(struct session *s, bool died)
{
    struct lockreq *q = s->lockreq;

    if (q) {
        s->lockreq = NULL;
        q->s = NULL;
        if (!q->attempting)
            req_drop(q);
        session_unref(s);   /* the request's reference */
    }
    uint32_t delay = died ? M.conf->locks.lock_delay_ms : 0;
    while (s->leases) {
        struct lease *l = s->leases;
        if (delay)
            log_info("%s: keeping %s for lock_delay_ms=%u after the "
                     "connection dropped", s->idstr,
                     lockmgr_lease_resource(l), delay);
        lease_release(l, delay, NULL);
    }
}

void lockmgr_on_release(const char *key, size_t len)
{
    if (len < M.prefixlen ||
        memcmp(key, M.conf->locks.key_prefix, M.prefixlen) != 0)
        return;
    struct hmap_node *n = hmap_get(&M.table, key, len);
    if (!n)
        return;
    struct lock_entry *e = container_of(n, struct lock_entry, node);
    struct lockreq *q = e->whead;
    if (!q || e->holder)
        return;
    if (q->attempting) {
        e->notified = true;
        return;
    }
    M.c.wakeups_notified++;
    req_attempt(q);
}

/* ---- STATUS ------------------------------------------------------------- */

struct status_ctx {
    struct session *s;      /* (ref) */
    size_t len;
    char resource[];
};

static void status_done(void *ud, const struct redlock_node_view *v, int n)
{
    struct status_ctx *x = ud;
    struct lock_entry *e = entry_find(x->resource, x->len);
    json_t *nodes = json_array();
    json_t *holder = json_null();
    int present = 0;

    for (int i = 0; i < n; i++) {
        json_t *pttl = v[i].answered ? json_integer(v[i].pttl) : json_null();
        if (v[i].answered && v[i].pttl != -2)
            present++;
        json_array_append_new(nodes, json_pack("{s:s, s:b, s:b, s:o}",
                              "node", v[i].name, "up", v[i].up,
                              "voting", v[i].voting, "pttl", pttl));
    }
    if (e && e->holder && !e->holder->gone && e->holder->session) {
        const struct lease *l = e->holder;
        const struct session *hs = l->session;
        holder = json_pack("{s:s, s:s?, s:I, s:I, s:I}",
                           "session", hs->idstr,
                           "name", hs->name[0] ? hs->name : NULL,
                           "fence", (json_int_t)l->fence,
                           "held_ms", (json_int_t)(timer_now() - l->acquired_at),
                           "validity", (json_int_t)lockmgr_lease_validity(l));
    }
    bool held = !json_is_null(holder) || present >= pool_quorum();
    char key[2048];
    snprintf(key, sizeof(key), "%s%s", M.conf->locks.key_prefix, x->resource);
    json_t *o = json_pack("{s:s, s:s, s:b, s:o, s:I, s:o}",
                          "resource", x->resource, "key", key, "held", held,
                          "holder", holder,
                          "waiters", (json_int_t)(e ? e->nwait : 0),
                          "nodes", nodes);
    struct session *s = x->s;
    free(x);
    session_status_done(s, o);
    session_unref(s);
}

void lockmgr_status(struct session *s, const char *resource, size_t len)
{
    struct status_ctx *x = mem_alloc(sizeof(*x) + len + 1);
    char key[2048];

    x->s = s;
    session_ref(s);
    x->len = len;
    memcpy(x->resource, resource, len);
    x->resource[len] = '\0';
    int k = snprintf(key, sizeof(key), "%s%s", M.conf->locks.key_prefix,
                     x->resource);
    redlock_inspect(key, (size_t)k, status_done, x);
}
