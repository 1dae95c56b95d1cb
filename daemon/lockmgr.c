/*
 * lockmgr: see lockmgr.h.
 *
 * Ownership:
 * - An entry lives while it has a holder or waiters (entry_maybe_free).
 * - A lockreq (one LOCK request) is owned by its entry's FIFO; it holds an
 *   owner reference until it has answered. When its owner ends first,
 *   req->o becomes NULL and the request is dropped, or, if an acquisition is
 *   in flight, dropped when it completes (releasing the keys if it won).
 * - A lease is owned by lockmgr. While held it is on its owner's list and
 *   is its entry's holder; on release or loss it leaves the owner at once
 *   but stays the entry's holder until its keys are gone from Redis (so no
 *   local waiter races the release), then is freed when no op refers to it.
 *
 * Answers to owners are notices: queued (with an owner reference) while
 * lockmgr works, delivered by leave() when the outermost entry point is
 * done and every structure is consistent again. Every entry point (the
 * public functions, redlock callbacks, timer callbacks) runs between
 * enter() and leave().
 */
#include "lockmgr.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"
#include "hmap.h"
#include "log.h"
#include "mem.h"
#include "timer.h"

struct lockreq {
    struct list link;               /* in entry->waiters */
    struct lock_entry *e;
    struct lockmgr_owner *o;        /* (ref) NULL once cancelled */
    uint32_t ttl;
    bool renew;
    uint64_t deadline;              /* timer_now ms; 0 = do not wait */
    bool attempting;                /* a redlock acquire is in flight */
    bool no_token;                  /* the OS random source failed */
    bool cut;                       /* the client stopped waiting (EOF) */
    bool woken;                     /* its timer is a notified wake-up */
    bool shutdown;                  /* the daemon stops: no grant */
    enum redlock_status last;
    struct timer timer;
    char token[REDLOCK_TOKEN_LEN + 1];
};

struct lock_entry {
    struct hmap_node node;
    struct lease *holder;           /* this daemon's holder, or NULL */
    bool releasing;                 /* the holder's keys are going away */
    bool notified;                  /* a release was announced meanwhile */
    struct list waiters;            /* struct lockreq, FIFO */
    size_t nwait;
    size_t keylen;
    const char *resource;           /* inside key, after the prefix */
    char key[];                     /* key_prefix + resource */
};

struct lease {
    struct list olink;              /* in owner->leases while held */
    struct lockmgr_owner *owner;    /* NULL once released or lost */
    struct lock_entry *entry;       /* NULL once its keys are gone */
    char token[REDLOCK_TOKEN_LEN + 1];
    uint64_t fence;
    uint32_t ttl;                   /* current lease on Redis (ms) */
    bool renew;
    bool gone;                      /* released or lost: free when idle */
    bool extending;                 /* a renewal or EXTEND is in flight */
    bool renew_due;                 /* a renewal fell due meanwhile */
    struct extend_ctx *queued;      /* an EXTEND waiting for that one */
    int ops;                        /* redlock ops in flight for it */
    uint64_t acquired_at;           /* timer_now ms */
    uint64_t valid_until;           /* timer_now ms the validity runs out */
    uint64_t renewals;
    struct timer timer;             /* next renewal */
    struct timer deadline;          /* LOST, op in flight or not */
    char resource[];
};

struct extend_ctx {
    struct lease *l;
    struct lockmgr_owner *o;        /* (ref) */
    uint32_t ttl;
};

enum notice_kind { N_LOCKED, N_UNLOCKED, N_EXTENDED, N_LOST, N_STATUS };

/* One answer waiting to be delivered to its owner. */
struct notice {
    struct list link;
    enum notice_kind kind;
    struct lockmgr_owner *o;        /* (ref) */
    enum proto_err err;
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;
    int nodes;
    enum lockmgr_lost_reason why;
    json_t *json;                   /* N_STATUS, owned until delivered */
    char token[REDLOCK_TOKEN_LEN + 1];
    const char *msg;                /* inside text, or NULL */
    char text[];                    /* resource NUL [msg NUL] */
};

static struct {
    const struct conf *conf;
    const struct redlock_ops *rl;
    struct hmap table;
    size_t prefixlen;
    char *keybuf;                   /* key_prefix + the longest resource */
    size_t keycap;
    size_t held;
    size_t waiters;
    struct lockmgr_counters c;
    struct list notices;
    int depth;                      /* entry points on the stack */
    bool flushing;
    uint64_t rng;                   /* xorshift64* state, never 0 */
} M;

/* How long a waiter woken by a release announcement waits before asking:
 * up to this many ms, at random, so waiters on several daemons that hear
 * the same announcement do not all ask in the same millisecond. */
#define LOCKMGR_WAKE_JITTER_MS 4

static void req_attempt(struct lockreq *q);

/* ---- owners and notices ------------------------------------------------ */

static void owner_ref(struct lockmgr_owner *o)
{
    o->ops->ref(o);
}

/* Must not call back into lockmgr (a session only frees memory here). */
static void owner_unref(struct lockmgr_owner *o)
{
    o->ops->unref(o);
}

static struct notice *notice_new(enum notice_kind kind,
                                 struct lockmgr_owner *o,
                                 const char *resource, const char *msg)
{
    size_t rlen = resource ? strlen(resource) : 0;
    size_t mlen = msg ? strlen(msg) + 1 : 0;
    struct notice *n = mem_alloc(sizeof(*n) + rlen + 1 + mlen);

    n->kind = kind;
    n->o = o;
    owner_ref(o);
    if (rlen)
        memcpy(n->text, resource, rlen);
    if (msg) {
        memcpy(n->text + rlen + 1, msg, mlen);
        n->msg = n->text + rlen + 1;
    }
    list_push_tail(&M.notices, &n->link);
    return n;
}

static void notice_deliver(struct notice *n)
{
    struct lockmgr_owner *o = n->o;
    const struct lockmgr_owner_ops *ops = o->ops;

    if (o->ended) {
        json_decref(n->json);
        return;
    }
    switch (n->kind) {
    case N_LOCKED:
        if (n->err == PROTO_ERR_NONE) {
            struct lockmgr_grant g = {
                .resource = n->text, .token = n->token, .fence = n->fence,
                .ttl = n->ttl, .validity = n->validity,
            };
            ops->locked(o, &g, PROTO_ERR_NONE, NULL);
        } else {
            ops->locked(o, NULL, n->err, n->msg);
        }
        break;
    case N_UNLOCKED:
        ops->unlocked(o, n->text, n->nodes, n->err);
        break;
    case N_EXTENDED:
        ops->extended(o, n->text, n->ttl, n->validity, n->err);
        break;
    case N_LOST:
        ops->lost(o, n->text, n->fence, n->why);
        break;
    case N_STATUS:
        ops->status(o, n->json);
        break;
    }
}

static void notices_flush(void)
{
    struct list *link;

    if (M.flushing)
        return;     /* an owner called back in: the loop below goes on */
    M.flushing = true;
    while ((link = list_first(&M.notices))) {
        struct notice *n = list_entry(link, struct notice, link);
        list_remove(link);
        notice_deliver(n);
        owner_unref(n->o);
        free(n);
    }
    M.flushing = false;
}

static void enter(void)
{
    M.depth++;
}

static void leave(void)
{
    if (--M.depth == 0)
        notices_flush();
}

/* ---- set-up ------------------------------------------------------------ */

static lockmgr_hold_fn *hold_observer;     /* outside M: init keeps it */

void lockmgr_set_hold_observer(lockmgr_hold_fn *fn)
{
    hold_observer = fn;
}

void lockmgr_init(const struct conf *conf, const struct redlock_ops *rl)
{
    memset(&M, 0, sizeof(M));
    M.conf = conf;
    M.rl = rl;
    hmap_init(&M.table);
    list_init(&M.notices);
    if (getrandom(&M.rng, sizeof(M.rng), GRND_NONBLOCK) != sizeof(M.rng))
        M.rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    M.rng |= 1;
    M.prefixlen = strlen(conf->locks.key_prefix);
    M.keycap = M.prefixlen + conf->locks.max_resource_len + 1;
    M.keybuf = mem_alloc(M.keycap);
    memcpy(M.keybuf, conf->locks.key_prefix, M.prefixlen);
}

void lockmgr_deinit(void)
{
    /* Owners are ended and ops drained before this; anything left is a
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
    free(M.keybuf);
    M.keybuf = NULL;
}

void lockmgr_owner_init(struct lockmgr_owner *o,
                        const struct lockmgr_owner_ops *ops,
                        const char *id, const char *name, const char *peer)
{
    memset(o, 0, sizeof(*o));
    o->ops = ops;
    o->id = id;
    o->name = name;
    o->peer = peer;
    list_init(&o->leases);
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

size_t lockmgr_waiter_count(void)
{
    return M.waiters;
}

const struct lockmgr_counters *lockmgr_counters(void)
{
    return &M.c;
}

static int64_t lease_validity(const struct lease *l)
{
    uint64_t now = timer_now();
    return l->valid_until > now ? (int64_t)(l->valid_until - now) : 0;
}

/* ---- the audit trail ------------------------------------------------------
 * One info line per grant, release and loss (a warning for a loss the
 * holder did not choose), naming the session, its client name and peer. */

#define AUDIT_FMT "%s fence=%" PRIu64 " %s %s (name=%s peer=%s)"
#define AUDIT_ARGS(what, l, o) what, (l)->fence, (l)->resource, (o)->id, \
    (o)->name[0] ? (o)->name : "-", (o)->peer ? (o)->peer : "-"

static void audit(const struct lease *l, const struct lockmgr_owner *o,
                  const char *what, const char *why)
{
    if (o)
        log_info(AUDIT_FMT ": %s", AUDIT_ARGS(what, l, o), why);
    else
        log_info("%s fence=%" PRIu64 " %s: %s", what, l->fence, l->resource,
                 why);
}

/* ---- entries ------------------------------------------------------------ */

/* key_prefix + res in M.keybuf (valid until the next call). The buffer is
 * sized for max_resource_len and grows if a longer name ever comes. */
static const char *entry_key(const char *res, size_t len, size_t *keylen)
{
    if (M.prefixlen + len + 1 > M.keycap) {
        M.keycap = M.prefixlen + len + 1;
        M.keybuf = mem_realloc(M.keybuf, M.keycap);
    }
    memcpy(M.keybuf + M.prefixlen, res, len);
    M.keybuf[M.prefixlen + len] = '\0';
    *keylen = M.prefixlen + len;
    return M.keybuf;
}

static struct lock_entry *entry_find(const char *res, size_t len)
{
    size_t keylen;
    const char *key = entry_key(res, len, &keylen);
    struct hmap_node *n = hmap_get(&M.table, key, keylen);
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
    list_init(&e->waiters);
    hmap_put(&M.table, &e->node, e->key, e->keylen);
    return e;
}

static struct lockreq *entry_head(const struct lock_entry *e)
{
    return list_entry(list_first(&e->waiters), struct lockreq, link);
}

static void entry_maybe_free(struct lock_entry *e)
{
    if (e->holder || !list_empty(&e->waiters))
        return;
    hmap_del(&M.table, &e->node);
    free(e);
}

static void entry_push(struct lock_entry *e, struct lockreq *q)
{
    q->e = e;
    list_push_tail(&e->waiters, &q->link);
    e->nwait++;
    M.waiters++;
}

static void entry_remove(struct lock_entry *e, struct lockreq *q)
{
    list_remove(&q->link);
    e->nwait--;
    M.waiters--;
}

/* Let the first waiter try, unless a holder here makes that pointless (it
 * is woken when that holder's keys are gone). */
static void entry_kick(struct lock_entry *e)
{
    struct lockreq *q = entry_head(e);

    if (!q || q->attempting || e->holder)
        return;
    req_attempt(q);
}

/* ---- leases ------------------------------------------------------------- */

static void lease_timer_cb(struct timer *t);
static void lease_deadline_cb(struct timer *t);
static void extend_start(struct extend_ctx *x);
static void extend_answer(struct extend_ctx *x, enum proto_err err,
                          int64_t validity);

static void lease_put(struct lease *l)
{
    if (l->gone && l->ops == 0) {
        timer_stop(&l->timer);
        timer_stop(&l->deadline);
        free(l);
    }
}

/*
 * How long before its validity runs out a lease is given up. A renewal
 * that takes longer than command_timeout_ms counts as failed only after
 * that (and a loop that was itself late gives the node one more period),
 * so an answer can be due that long after the validity it would extend;
 * the client also needs time to hear EVENT LOST and stop. So: twice the
 * command timeout plus a twentieth of the ttl, at most a quarter of it.
 */
static uint64_t lease_margin(const struct lease *l)
{
    uint64_t m = 2 * (uint64_t)M.conf->redis.command_timeout_ms +
                 l->ttl / 20;
    return m < l->ttl / 4 ? m : l->ttl / 4;
}

static uint64_t lease_deadline(const struct lease *l)
{
    uint64_t m = lease_margin(l);
    return l->valid_until > m ? l->valid_until - m : 0;
}

static uint64_t lease_renew_interval(const struct lease *l)
{
    uint64_t iv = l->ttl / 3;
    return iv ? iv : 1;
}

/* The validity changed: move the hard deadline, and (unless told not to)
 * schedule the next renewal from now. */
static void lease_arm(struct lease *l, bool renewal)
{
    timer_start_at(&l->deadline, lease_deadline(l));
    if (renewal && l->renew)
        timer_start(&l->timer, lease_renew_interval(l));
}

/* Nodes may hold the key for less than we thought (a failed EXTEND to a
 * shorter ttl ran on some of them): never claim more than `until`. */
static void lease_cap(struct lease *l, uint64_t until)
{
    if (until < l->valid_until) {
        l->valid_until = until;
        lease_arm(l, false);
    }
}

static struct lease *lease_create(struct lockreq *q, uint64_t fence,
                                  int64_t validity)
{
    struct lock_entry *e = q->e;
    size_t len = e->keylen - M.prefixlen;
    struct lease *l = mem_alloc(sizeof(*l) + len + 1);

    memcpy(l->resource, e->resource, len);
    l->resource[len] = '\0';
    list_init(&l->olink);
    l->entry = e;
    memcpy(l->token, q->token, sizeof(l->token));
    l->fence = fence;
    l->ttl = q->ttl;
    l->renew = q->renew;
    l->acquired_at = timer_now();
    l->valid_until = l->acquired_at + (uint64_t)(validity > 0 ? validity : 0);
    timer_init(&l->timer, lease_timer_cb, l);
    timer_init(&l->deadline, lease_deadline_cb, l);
    lease_arm(l, true);
    return l;
}

static void lease_attach(struct lease *l, struct lockmgr_owner *o)
{
    l->owner = o;
    list_push_tail(&o->leases, &l->olink);
    o->nleases++;
}

/* The lease stops being held: off its owner, no more timers, and an
 * EXTEND still waiting for its turn is answered LOST. */
static void lease_end(struct lease *l)
{
    struct extend_ctx *x = l->queued;

    if (l->owner) {
        list_remove(&l->olink);
        l->owner->nleases--;
        l->owner = NULL;
    }
    timer_stop(&l->timer);
    timer_stop(&l->deadline);
    l->gone = true;
    M.held--;
    if (hold_observer)
        hold_observer(timer_now() - l->acquired_at);
    if (x) {
        l->queued = NULL;
        extend_answer(x, PROTO_ERR_LOST, 0);
    }
}

static void release_done(void *ud, const struct redlock_result *res);

/*
 * The lease leaves its owner now; its keys are deleted (or kept for
 * delay_ms, owner-checked) and the entry is free for others once that is
 * done. `unlocker` is the owner waiting for an UNLOCK answer, if any.
 */
struct release_ctx {
    struct lease *l;
    struct lockmgr_owner *unlocker;     /* (ref) or NULL */
};

static void lease_release(struct lease *l, uint32_t delay_ms,
                          struct lockmgr_owner *unlocker, const char *why)
{
    struct lock_entry *e = l->entry;
    struct release_ctx *x = mem_alloc(sizeof(*x));

    audit(l, l->owner, "release", why);
    lease_end(l);
    e->releasing = true;
    M.c.releases++;
    x->l = l;
    x->unlocker = unlocker;
    if (unlocker)
        owner_ref(unlocker);
    l->ops++;
    if (delay_ms > 0)
        M.rl->extend(e->key, e->keylen, l->token, delay_ms, release_done, x);
    else
        M.rl->release(e->key, e->keylen, l->token, release_done, x);
}

/* The entry no longer has l as its holder: the first waiter may try. */
static void entry_drop_holder(struct lock_entry *e, struct lease *l)
{
    if (!e || e->holder != l)
        return;
    struct lockreq *head = entry_head(e);
    e->holder = NULL;
    e->releasing = false;
    if (head && !head->attempting)
        M.c.wakeups_notified++;
    entry_kick(e);
    entry_maybe_free(e);
}

static void release_done(void *ud, const struct redlock_result *res)
{
    struct release_ctx *x = ud;
    struct lease *l = x->l;
    struct lock_entry *e = l->entry;
    struct lockmgr_owner *o = x->unlocker;

    enter();
    free(x);
    l->entry = NULL;
    l->ops--;
    if (o) {
        struct notice *n = notice_new(N_UNLOCKED, o, l->resource, NULL);
        n->nodes = res->deleted;
        /* So many nodes had no key of ours that no quorum can have held
         * it: the lock had been lost before this UNLOCK. */
        if (res->busy > M.rl->nnodes() - M.rl->quorum())
            n->err = PROTO_ERR_LOST;
        owner_unref(o);
    }
    entry_drop_holder(e, l);
    lease_put(l);
    leave();
}

/*
 * The lease could not be kept: tell its owner and drop it. When the nodes
 * said the key is gone or not ours (LOST_NODE), whatever is still ours is
 * removed. Otherwise (no quorum answered in time, or a renew=0 lease ran
 * out) the keys may still be held on the nodes: they are left to expire
 * by their ttl, since deleting them and announcing a release would let a
 * competitor in before the lease's time is really up.
 */
static void lease_lose(struct lease *l, enum lockmgr_lost_reason why)
{
    static const char *const what[] = {
        [LOST_EXPIRED] = "its validity ran out (renew=0)",
        [LOST_QUORUM] = ("no quorum renewed it in time; its keys expire "
                         "by their ttl"),
        [LOST_NODE] = "the nodes no longer hold its key",
    };

    M.c.leases_lost++;
    if (l->owner) {
        struct notice *n = notice_new(N_LOST, l->owner, l->resource, NULL);
        n->fence = l->fence;
        n->why = why;
        /* A renew=0 lease running out is what its holder asked for. */
        if (why == LOST_EXPIRED)
            log_info(AUDIT_FMT ": %s", AUDIT_ARGS("lost", l, l->owner),
                     what[why]);
        else
            log_warn(AUDIT_FMT ": %s", AUDIT_ARGS("lost", l, l->owner),
                     what[why]);
    }
    if (why == LOST_NODE) {
        lease_release(l, 0, NULL, "removing what is left of a lost lease");
        return;
    }
    struct lock_entry *e = l->entry;
    lease_end(l);
    l->entry = NULL;
    entry_drop_holder(e, l);
    lease_put(l);
}

/* A renewal retry is worth sending only if its answer (command timeout,
 * plus the grace a late loop gets) can come before the hard deadline. */
static bool lease_can_retry(const struct lease *l, uint64_t at)
{
    return at + 2 * (uint64_t)M.conf->redis.command_timeout_ms <=
           lease_deadline(l);
}

/* After an op of l ends: an EXTEND that waited for it goes out now. */
static void renew_start(struct lease *l);

static void lease_next_op(struct lease *l)
{
    struct extend_ctx *x = l->queued;

    l->extending = false;
    if (l->gone)
        return;
    if (x) {
        l->queued = NULL;
        extend_start(x);
    } else if (l->renew_due) {
        renew_start(l);
    }
}

static void renew_done(void *ud, const struct redlock_result *res)
{
    struct lease *l = ud;
    uint64_t now = timer_now();

    enter();
    l->ops--;
    if (l->gone) {
        lease_put(l);       /* lost meanwhile: the answer is too late */
        leave();
        return;
    }
    if (res->status == REDLOCK_OK) {
        l->valid_until = now + (uint64_t)(res->validity > 0 ? res->validity
                                                             : 0);
        l->renewals++;
        M.c.renewals++;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        M.c.renewal_failures++;
        lease_lose(l, LOST_NODE);
    } else {
        /* Not enough nodes answered: try again soon, while a retry can
         * still finish before the deadline; the deadline decides. */
        uint64_t retry = l->ttl / 10;
        if (retry < 20)
            retry = 20;
        if (retry > 1000)
            retry = 1000;
        M.c.renewal_failures++;
        lease_cap(l, now + (uint64_t)(res->validity > 0 ? res->validity : 0));
        if (lease_can_retry(l, now + retry)) {
            log_info("renewal of %s reached %d nodes; retrying in %" PRIu64
                     " ms (%" PRIu64 " ms of validity left)", l->resource,
                     res->ok, retry, l->valid_until - now);
            timer_start(&l->timer, retry);
        }
    }
    lease_next_op(l);
    leave();
}

static void renew_start(struct lease *l)
{
    l->renew_due = false;
    l->extending = true;
    l->ops++;
    M.rl->extend(l->entry->key, l->entry->keylen, l->token, l->ttl,
                 renew_done, l);
}

static void lease_timer_cb(struct timer *t)
{
    struct lease *l = t->data;

    if (l->gone)
        return;
    if (l->extending) {
        l->renew_due = true;    /* sent when the EXTEND out is answered */
        return;
    }
    enter();
    renew_start(l);
    leave();
}

static void lease_deadline_cb(struct timer *t)
{
    struct lease *l = t->data;

    if (l->gone)
        return;
    enter();
    lease_lose(l, l->renew ? LOST_QUORUM : LOST_EXPIRED);
    leave();
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
    bool was_head = entry_head(e) == q;

    entry_remove(e, q);
    req_free(q);
    if (was_head)
        entry_kick(e);
    entry_maybe_free(e);
}

/* Answer q with an error and drop it. */
static void req_fail(struct lockreq *q, enum proto_err err, const char *msg)
{
    struct lockmgr_owner *o = q->o;

    if (o) {
        struct notice *n = notice_new(N_LOCKED, o, NULL, msg);
        n->err = err;
        o->pending = NULL;
    }
    req_drop(q);
    if (o)
        owner_unref(o);
}

static void req_give_up(struct lockreq *q)
{
    char msg[PROTO_MAX_ERRMSG];

    if (q->last == REDLOCK_UNAVAILABLE) {
        M.c.acquire_unavailable++;
        snprintf(msg, sizeof(msg), "could not reach a quorum of %d of %d "
                 "redis nodes in time", M.rl->quorum(), M.rl->nnodes());
        req_fail(q, PROTO_ERR_UNAVAILABLE, msg);
    } else if (q->deadline || q->cut) {
        M.c.acquire_timeout++;
        if (q->cut)
            snprintf(msg, sizeof(msg), "the client closed the connection "
                     "while waiting for %s", q->e->resource);
        else
            snprintf(msg, sizeof(msg), "%s is still held by someone else",
                     q->e->resource);
        req_fail(q, PROTO_ERR_TIMEOUT, msg);
    } else {
        M.c.acquire_busy++;
        snprintf(msg, sizeof(msg), "%s is held by someone else",
                 q->e->resource);
        req_fail(q, PROTO_ERR_BUSY, msg);
    }
}

/* Seeded per process from the OS, so daemons do not share a sequence. */
static uint64_t rng_below(uint64_t n)
{
    M.rng ^= M.rng >> 12;
    M.rng ^= M.rng << 25;
    M.rng ^= M.rng >> 27;
    return n ? (M.rng * 0x2545f4914f6cdd1dULL >> 11) % n : 0;
}

static uint64_t jitter(uint64_t ms)
{
    /* Spread retries over [ms/2, 3ms/2) so waiters on many daemons do not
     * poll in step. */
    if (ms < 2)
        return 1;
    return ms / 2 + rng_below(ms);
}

static void req_sleep(struct lockreq *q, int64_t pttl)
{
    uint64_t now = timer_now();
    uint64_t delay = jitter(M.conf->locks.retry_ms);

    /* The key expires before that: ask just after, a little spread too. */
    if (pttl >= 0 && (uint64_t)pttl + 1 < delay)
        delay = (uint64_t)pttl + 1 + rng_below(LOCKMGR_WAKE_JITTER_MS + 1);
    uint64_t due = now + delay;
    if (due > q->deadline)
        due = q->deadline;
    timer_start_at(&q->timer, due);
}

static void req_granted(struct lockreq *q, const struct redlock_result *res)
{
    struct lock_entry *e = q->e;
    struct lockmgr_owner *o = q->o;
    struct lease *l = lease_create(q, res->fence, res->validity);
    struct notice *n = notice_new(N_LOCKED, o, l->resource, NULL);

    n->fence = l->fence;
    n->ttl = l->ttl;
    n->validity = lease_validity(l);
    memcpy(n->token, l->token, sizeof(n->token));
    e->holder = l;
    lease_attach(l, o);
    audit(l, o, "grant", l->renew ? "renewed while the session lives"
                                  : "renew=0");
    M.held++;
    M.c.acquire_ok++;
    entry_remove(e, q);
    req_free(q);
    o->pending = NULL;
    owner_unref(o);
}

static void attempt_done(void *ud, const struct redlock_result *res)
{
    struct lockreq *q = ud;
    struct lock_entry *e = q->e;

    enter();
    q->attempting = false;
    if (!q->o) {
        /* The owner ended while we were acquiring. */
        if (res->status == REDLOCK_OK)
            M.rl->release(e->key, e->keylen, q->token, NULL, NULL);
        req_drop(q);
    } else if (q->shutdown) {
        if (res->status == REDLOCK_OK)
            M.rl->release(e->key, e->keylen, q->token, NULL, NULL);
        req_fail(q, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
    } else if (res->status == REDLOCK_OK) {
        req_granted(q, res);
    } else {
        bool notified = e->notified;
        q->last = res->status;
        e->notified = false;
        if (!q->deadline || timer_now() >= q->deadline)
            req_give_up(q);
        else if (notified && res->status == REDLOCK_BUSY)
            req_attempt(q);     /* released while we asked: ask again */
        else
            req_sleep(q, res->status == REDLOCK_BUSY ? res->pttl : -1);
    }
    leave();
}

static void req_attempt(struct lockreq *q)
{
    timer_stop(&q->timer);
    q->woken = false;
    if (M.rl->token(q->token) != 0) {
        /* Answer from the timer, never from inside our caller: it may be
         * about to touch the entry this request's answer could free. */
        q->no_token = true;
        timer_start(&q->timer, 0);
        return;
    }
    q->attempting = true;
    q->e->notified = false;
    M.rl->acquire(q->e->key, q->e->keylen, q->token, q->ttl, attempt_done,
                  q);
}

static void req_timer_cb(struct timer *t)
{
    struct lockreq *q = t->data;
    struct lock_entry *e = q->e;

    if (q->attempting)
        return;
    enter();
    if (q->no_token) {
        log_error("getrandom failed: cannot make a lock token");
        q->last = REDLOCK_UNAVAILABLE;
        req_fail(q, PROTO_ERR_UNAVAILABLE, "no random source for a token");
    } else if (timer_now() >= q->deadline) {
        req_give_up(q);
    } else if (entry_head(e) == q && !e->holder) {
        if (q->woken)
            M.c.wakeups_notified++;
        else
            M.c.wakeups_retry++;
        req_attempt(q);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
    leave();
}

void lockmgr_lock(struct lockmgr_owner *o, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew)
{
    struct lock_entry *e;
    struct lockreq *q = mem_alloc(sizeof(*q));

    enter();
    e = entry_get(resource, len);
    q->o = o;
    owner_ref(o);
    o->pending = q;
    q->ttl = ttl;
    q->renew = renew;
    q->last = REDLOCK_BUSY;
    q->deadline = wait ? timer_now() + wait : 0;
    timer_init(&q->timer, req_timer_cb, q);
    entry_push(e, q);
    if (wait)
        M.c.waits++;

    if (entry_head(e) == q && !e->holder) {
        req_attempt(q);
    } else if (entry_head(e) == q && e->releasing) {
        /* The last holder's keys are being deleted right now (UNLOCK by
         * another owner, or a lost lease being cleaned up): that ends
         * within a round trip, and release_done() kicks this request, so
         * even a wait=0 LOCK waits for it instead of seeing a stale BUSY. */
    } else if (!wait) {
        /* Held here, or others wait first: first come, first served. */
        req_give_up(q);
    } else if (M.conf->limits.max_waiters_per_resource &&
               e->nwait > M.conf->limits.max_waiters_per_resource) {
        char msg[PROTO_MAX_ERRMSG];
        snprintf(msg, sizeof(msg), "%zu requests already wait for %s "
                 "(limits.max_waiters_per_resource)", e->nwait - 1,
                 e->resource);
        req_fail(q, PROTO_ERR_LIMIT, msg);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
    leave();
}

/* ---- owner-facing operations ------------------------------------------- */

struct lease *lockmgr_held(const struct lockmgr_owner *o,
                           const char *resource, size_t len)
{
    struct lock_entry *e = entry_find(resource, len);
    if (!e || !e->holder || e->holder->gone || e->holder->owner != o)
        return NULL;
    return e->holder;
}

void lockmgr_unlock(struct lockmgr_owner *o, struct lease *l)
{
    enter();
    lease_release(l, 0, o, "UNLOCK");
    leave();
}

static void extend_answer(struct extend_ctx *x, enum proto_err err,
                          int64_t validity)
{
    struct lease *l = x->l;
    struct notice *n = notice_new(N_EXTENDED, x->o, l->resource, NULL);

    n->err = err;
    n->ttl = l->ttl;
    n->validity = validity;
    owner_unref(x->o);
    free(x);
    l->ops--;
}

static void extend_done(void *ud, const struct redlock_result *res)
{
    struct extend_ctx *x = ud;
    struct lease *l = x->l;
    uint64_t now = timer_now();
    int64_t validity = res->validity > 0 ? res->validity : 0;
    enum proto_err err = PROTO_ERR_NONE;

    enter();
    M.c.extends++;
    if (l->gone) {
        err = PROTO_ERR_LOST;
    } else if (res->status == REDLOCK_OK) {
        l->ttl = x->ttl;
        l->valid_until = now + (uint64_t)validity;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        err = PROTO_ERR_LOST;
        M.c.leases_lost++;
        lease_release(l, 0, NULL, "EXTEND found it lost");
    } else {
        /* Some nodes may have taken the new ttl: if it was shorter, the
         * lease now ends with it. */
        err = PROTO_ERR_UNAVAILABLE;
        lease_cap(l, now + (uint64_t)validity);
        if (!l->gone && lease_deadline(l) <= now)
            lease_lose(l, LOST_QUORUM);
    }
    extend_answer(x, err, res->validity);
    lease_next_op(l);
    lease_put(l);
    leave();
}

static void extend_start(struct extend_ctx *x)
{
    struct lease *l = x->l;

    l->extending = true;
    M.rl->extend(l->entry->key, l->entry->keylen, l->token, x->ttl,
                 extend_done, x);
}

void lockmgr_extend(struct lockmgr_owner *o, struct lease *l, uint32_t ttl)
{
    struct extend_ctx *x = mem_alloc(sizeof(*x));

    enter();
    x->l = l;
    x->o = o;
    x->ttl = ttl;
    owner_ref(o);
    l->ops++;
    if (l->extending)
        l->queued = x;      /* after the renewal in flight */
    else
        extend_start(x);
    leave();
}

void lockmgr_cut_wait(struct lockmgr_owner *o)
{
    struct lockreq *q = o->pending;

    if (!q || !q->deadline)
        return;     /* wait=0 requests end on their own, soon */
    enter();
    q->deadline = 0;
    q->cut = true;
    if (!q->attempting) {
        M.c.acquire_timeout++;
        req_fail(q, PROTO_ERR_TIMEOUT, "the client closed the connection "
                 "while waiting");
    }
    leave();
}

void lockmgr_owner_shutdown(struct lockmgr_owner *o)
{
    struct lockreq *q = o->pending;
    struct list *link;

    enter();
    if (q) {
        q->shutdown = true;
        if (!q->attempting)
            req_fail(q, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
    }
    while ((link = list_first(&o->leases)))
        lease_release(list_entry(link, struct lease, olink), 0, NULL,
                      "the daemon is shutting down");
    leave();
}

void lockmgr_owner_end(struct lockmgr_owner *o, bool died)
{
    struct lockreq *q = o->pending;
    uint32_t delay = died ? M.conf->locks.lock_delay_ms : 0;
    struct list *link;

    enter();
    o->ended = true;
    if (q) {
        o->pending = NULL;
        q->o = NULL;
        if (!q->attempting)
            req_drop(q);
        owner_unref(o);     /* the request's reference */
    }
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        lease_release(l, delay, NULL, delay ? "the connection dropped; "
                      "keys kept for locks.lock_delay_ms" : "the session "
                      "ended");
    }
    leave();
}

void lockmgr_on_release(const char *key, size_t len)
{
    struct hmap_node *n;
    struct lock_entry *e;
    struct lockreq *q;

    if (len < M.prefixlen ||
        memcmp(key, M.conf->locks.key_prefix, M.prefixlen) != 0)
        return;
    n = hmap_get(&M.table, key, len);
    if (!n)
        return;
    e = container_of(n, struct lock_entry, node);
    q = entry_head(e);
    if (!q || e->holder)
        return;
    if (q->attempting) {
        e->notified = true;
        return;
    }
    if (q->woken)
        return;     /* the same release, heard from another node */
    q->woken = true;
    timer_start(&q->timer, rng_below(LOCKMGR_WAKE_JITTER_MS + 1));
}

/* ---- FORCEUNLOCK --------------------------------------------------------- */

struct force_ctx {
    struct lockmgr_owner *o;    /* (ref) the operator */
    size_t len;
    char resource[];
};

static void force_done(void *ud, const struct redlock_result *res)
{
    struct force_ctx *x = ud;
    struct lock_entry *e;
    struct notice *n;

    enter();
    log_notice("forced release of %s by %s (name=%s peer=%s): deleted on "
               "%d of %d nodes", x->resource, x->o->id,
               x->o->name[0] ? x->o->name : "-", x->o->peer ? x->o->peer
               : "-", res->deleted, M.rl->nnodes());
    /* A holder here learns now what one elsewhere learns at its next
     * renewal: the nodes no longer hold its key. */
    e = entry_find(x->resource, x->len);
    if (e && e->holder && !e->holder->gone)
        lease_lose(e->holder, LOST_NODE);
    n = notice_new(N_UNLOCKED, x->o, x->resource, NULL);
    n->nodes = res->deleted;
    owner_unref(x->o);
    free(x);
    leave();
}

void lockmgr_force_release(struct lockmgr_owner *o, const char *resource,
                           size_t len)
{
    struct force_ctx *x = mem_alloc(sizeof(*x) + len + 1);
    size_t keylen;
    const char *key;

    enter();
    x->o = o;
    owner_ref(o);
    x->len = len;
    memcpy(x->resource, resource, len);
    x->resource[len] = '\0';
    key = entry_key(resource, len, &keylen);
    M.rl->force_release(key, keylen, force_done, x);
    leave();
}

/* ---- inspection --------------------------------------------------------- */

static json_t *lease_json(const struct lease *l)
{
    uint64_t now = timer_now();
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:b, s:I}",
                     "resource", l->resource,
                     "fence", (json_int_t)l->fence,
                     "ttl", (json_int_t)l->ttl,
                     "validity", (json_int_t)lease_validity(l),
                     "held_ms", (json_int_t)(now - l->acquired_at),
                     "renew", l->renew,
                     "renewals", (json_int_t)l->renewals);
}

json_t *lockmgr_owner_leases_json(const struct lockmgr_owner *o)
{
    json_t *arr = json_array();
    const struct list *link;

    list_foreach(link, &o->leases)
        json_array_append_new(arr, lease_json(
            list_entry(link, const struct lease, olink)));
    return arr;
}

struct status_ctx {
    struct lockmgr_owner *o;    /* (ref) */
    size_t len;
    char resource[];
};

static json_t *status_holder(const struct lock_entry *e)
{
    const struct lease *l = e ? e->holder : NULL;

    if (!l || l->gone || !l->owner)
        return json_null();
    return json_pack("{s:s, s:s?, s:I, s:I, s:I}",
                     "session", l->owner->id,
                     "name", l->owner->name[0] ? l->owner->name : NULL,
                     "fence", (json_int_t)l->fence,
                     "held_ms", (json_int_t)(timer_now() - l->acquired_at),
                     "validity", (json_int_t)lease_validity(l));
}

static void status_done(void *ud, const struct redlock_node_view *v, int n)
{
    struct status_ctx *x = ud;
    struct lock_entry *e;
    json_t *nodes = json_array();
    json_t *holder;
    int present = 0;
    size_t keylen;

    enter();
    e = entry_find(x->resource, x->len);
    for (int i = 0; i < n; i++) {
        json_t *pttl = v[i].answered ? json_integer(v[i].pttl) : json_null();
        if (v[i].answered && v[i].pttl != -2)
            present++;
        json_array_append_new(nodes, json_pack("{s:s, s:b, s:b, s:o}",
                              "node", v[i].name, "up", v[i].up,
                              "voting", v[i].voting, "pttl", pttl));
    }
    holder = status_holder(e);
    bool held = !json_is_null(holder) || present >= M.rl->quorum();
    const char *key = entry_key(x->resource, x->len, &keylen);
    struct notice *no = notice_new(N_STATUS, x->o, NULL, NULL);
    no->json = json_pack("{s:s, s:s, s:b, s:o, s:I, s:o}",
                         "resource", x->resource, "key", key, "held", held,
                         "holder", holder,
                         "waiters", (json_int_t)(e ? e->nwait : 0),
                         "nodes", nodes);
    owner_unref(x->o);
    free(x);
    leave();
}

void lockmgr_status(struct lockmgr_owner *o, const char *resource,
                    size_t len)
{
    struct status_ctx *x = mem_alloc(sizeof(*x) + len + 1);
    size_t keylen;
    const char *key;

    enter();
    x->o = o;
    owner_ref(o);
    x->len = len;
    memcpy(x->resource, resource, len);
    x->resource[len] = '\0';
    key = entry_key(resource, len, &keylen);
    M.rl->inspect(key, keylen, status_done, x);
    leave();
}
