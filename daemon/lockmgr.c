/*
 * lockmgr: see lockmgr.h.
 *
 * Ownership:
 * - An entry lives while it has holders or waiters (entry_maybe_free), and
 *   while a kick walks its queue (pins).
 * - A lockreq (one LOCK request) is owned by the FIFOs it waits in (one
 *   per resource it names, all entered at once, so any two requests are in
 *   the same order in every queue they share); it holds an owner reference
 *   until it has answered. When its owner ends (or cancels) first,
 *   req->o becomes NULL and the request is dropped, or, if an acquisition
 *   is in flight, dropped when it completes (releasing the keys if it
 *   won).
 * - A lease is owned by lockmgr. While held it is on its owner's list and
 *   among its entry's holders; on release or loss it leaves the owner at
 *   once but stays among the holders until its keys are gone from Redis
 *   (so no local waiter races the release), then is freed when no op
 *   refers to it. The leases of one grant of several resources are
 *   siblings (glink), renewed together.
 *
 * Who may talk to Redis: a waiter whose every predecessor in each of its
 * queues is talking to Redis already, and that nothing held or asked for
 * ahead of it rules out: an exclusive request needs its entries empty and
 * itself first; a shared one, no exclusive holder or request ahead; a
 * semaphore's, a slot that no holder or request here has. So readers go
 * together, a writer waits for the readers before it and keeps the readers
 * after it waiting, and only one request at a time asks for a key.
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

/* Where a request waits: one per resource it names. */
struct req_pos {
    struct list link;               /* in entry->waiters */
    struct lock_entry *e;
    struct lockreq *q;
};

struct lockreq {
    struct lockmgr_owner *o;        /* (ref) NULL once cancelled */
    enum lockmgr_mode mode;
    uint32_t limit;                 /* semaphore: K; 0 otherwise */
    int64_t slot;                   /* semaphore: the slot asked for, or -1 */
    uint32_t visited;               /* semaphore: slots considered this pass */
    int64_t hint;                   /* semaphore: a slot announced free, -1 */
    int64_t pass_pttl;              /* semaphore: least PTTL this pass */
    uint32_t ttl;
    bool renew;
    uint64_t deadline;              /* timer_now ms; 0 = do not wait */
    bool attempting;                /* a redlock acquire is in flight */
    bool no_token;                  /* the OS random source failed */
    bool cut;                       /* the client stopped waiting (EOF) */
    bool woken;                     /* its timer is a notified wake-up */
    bool notified;                  /* a release was announced meanwhile */
    bool shutdown;                  /* the daemon stops: no grant */
    struct list hlink;              /* in mgr.held_back (start-up) */
    enum redlock_status last;
    struct timer timer;
    char token[REDLOCK_TOKEN_LEN + 1];
    const char *label;              /* stored with the token (label_put):
                                       in this allocation, after pos */
    size_t labellen;
    size_t n;
    struct req_pos pos[];           /* n */
};

struct lock_entry {
    struct hmap_node node;
    struct list holders;            /* struct lease (elink): this daemon's,
                                       those whose keys are going away too */
    size_t nheld;                   /* holders */
    size_t nexcl;                   /* of them exclusive */
    size_t ngone;                   /* of them released or lost */
    size_t ngone_excl;              /* of those exclusive */
    struct list waiters;            /* struct req_pos, FIFO */
    size_t nwait;
    uint32_t limit;                 /* a semaphore of this many slots, or 0 */
    uint8_t *slots;                 /* (owned) semaphore: for each slot,
                                       the holders and requests here (2
                                       only while an ADOPT moves a lease
                                       from one session to another) */
    uint32_t nused;                 /* their sum */
    uint32_t ngone_slots;           /* of them by holders going away */
    int pins;                       /* kicks walking its queue */
    size_t keylen;
    const char *resource;           /* inside key, after the prefix */
    const char *shared;             /* key + ":shared", after key */
    size_t sharedlen;
    char key[];                     /* key_prefix + resource, NUL, shared */
};

struct lease {
    struct list olink;              /* in owner->leases while held */
    struct list elink;              /* in entry->holders while entry */
    struct list glink;              /* siblings: one grant's other leases */
    struct lockmgr_owner *owner;    /* NULL once released or lost */
    struct lock_entry *entry;       /* NULL once its keys are gone */
    enum lockmgr_mode mode;
    uint32_t limit;                 /* semaphore: K, or 0 */
    int64_t slot;                   /* semaphore: its slot, or -1 */
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
    size_t keylen;
    const char *key;                /* what it holds in Redis: the key, the
                                       shared set or the slot's key (in this
                                       allocation, after resource) */
    char resource[];
};

struct extend_ctx {
    struct lease *l;
    struct lockmgr_owner *o;        /* (ref) */
    unsigned gen;                   /* o->gen when asked */
    uint32_t ttl;
};

/* One UNLOCK of one or more leases: answered once all are released. */
struct unlock_ctx {
    struct lockmgr_owner *o;        /* (ref) */
    unsigned gen;                   /* o->gen when asked */
    size_t n;                       /* leases */
    size_t left;                    /* releases not done yet */
    int nodes;                      /* the fewest deletions of any */
    bool lost;                      /* one had been lost before */
    char resource[];                /* the first lease's */
};

enum notice_kind { N_LOCKED, N_UNLOCKED, N_EXTENDED, N_LOST };

/* One answer waiting to be delivered to its owner. */
struct notice {
    struct list link;
    enum notice_kind kind;
    struct lockmgr_owner *o;        /* (ref) */
    unsigned gen;                   /* answers: the asker's o->gen */
    enum proto_err err;
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;
    int nodes;
    size_t nres;
    enum lockmgr_mode mode;
    uint32_t limit, slot;
    enum lockmgr_lost_reason why;
    char token[REDLOCK_TOKEN_LEN + 1];
    const char *msg;                /* inside text, or NULL */
    char text[];                    /* resource NUL [msg NUL] */
};

static struct {
    const struct conf *conf;
    const struct redlock_ops *rl;
    struct hmap table;
    size_t prefixlen;
    char *keybuf;                   /* key_prefix + the longest resource,
                                       and room for a slot's suffix */
    size_t keycap;
    size_t held;
    size_t waiters;
    struct lockmgr_counters c;
    struct list notices;
    int depth;                      /* entry points on the stack */
    bool flushing;
    bool starting;                  /* until lockmgr_ready() */
    struct list held_back;          /* struct lockreq (hlink), in order */
    struct list adopts_held;        /* struct adopt_ctx (hlink), in order */
    uint64_t rng;                   /* xorshift64* state, never 0 */
    uint64_t spread;                /* where this daemon starts in a
                                       semaphore's slots: hash of its id */
} mgr;

/* How long a waiter woken by a release announcement waits before asking:
 * up to this many ms, at random, so waiters on several daemons that hear
 * the same announcement do not all ask in the same millisecond. */
#define LOCKMGR_WAKE_JITTER_MS 4
/* Renewals fall due on multiples of this many ms (lease_renew_due). */
#define LOCKMGR_RENEW_GRAIN_MS 100

/* The shared holders' set of resource r is key_prefix + r + this; slot i
 * of a semaphore r is key_prefix + r + "#" + i. */
#define LOCKMGR_SHARED_SUFFIX CONF_SHARED_SUFFIX
#define LOCKMGR_SHARED_SUFFIX_LEN (sizeof(LOCKMGR_SHARED_SUFFIX) - 1)
#define LOCKMGR_SLOT_SEP CONF_SLOT_SEP
/* "#" and a slot number below CONF_MAX_LIMIT, NUL included. */
#define LOCKMGR_SLOT_SUFFIX_SIZE sizeof("#65535")

static bool req_attempt(struct lockreq *q);
static void entry_kick(struct lock_entry *e);

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
    n->gen = o->gen;
    n->nres = 1;
    owner_ref(o);
    if (rlen)
        memcpy(n->text, resource, rlen);
    if (msg) {
        memcpy(n->text + rlen + 1, msg, mlen);
        n->msg = n->text + rlen + 1;
    }
    list_push_tail(&mgr.notices, &n->link);
    return n;
}

static void notice_deliver(struct notice *n)
{
    struct lockmgr_owner *o = n->o;
    const struct lockmgr_owner_ops *ops = o->ops;

    /* An answer for a requester that went away (lockmgr_owner_cancel)
     * is dropped; a loss is the owner's whoever asks for it. */
    if (o->ended || (n->kind != N_LOST && n->gen != o->gen))
        return;
    switch (n->kind) {
    case N_LOCKED:
        if (n->err == PROTO_ERR_NONE) {
            struct lockmgr_grant g = {
                .resource = n->text, .nresources = n->nres,
                .token = n->token, .fence = n->fence, .ttl = n->ttl,
                .validity = n->validity, .mode = n->mode,
                .limit = n->limit, .slot = n->slot,
            };
            ops->locked(o, &g, PROTO_ERR_NONE, NULL);
        } else {
            ops->locked(o, NULL, n->err, n->msg);
        }
        break;
    case N_UNLOCKED:
        ops->unlocked(o, n->text, n->nres, n->nodes, n->err);
        break;
    case N_EXTENDED:
        ops->extended(o, n->text, n->ttl, n->validity, n->err);
        break;
    case N_LOST:
        ops->lost(o, n->text, n->fence, n->why);
        break;
    }
}

static void notices_flush(void)
{
    struct list *link;

    if (mgr.flushing)
        return;     /* an owner called back in: the loop below goes on */
    mgr.flushing = true;
    while ((link = list_first(&mgr.notices))) {
        struct notice *n = list_entry(link, struct notice, link);
        list_remove(link);
        notice_deliver(n);
        owner_unref(n->o);
        free(n);
    }
    mgr.flushing = false;
}

static void enter(void)
{
    mgr.depth++;
}

static void leave(void)
{
    if (--mgr.depth == 0)
        notices_flush();
}

/* ---- set-up ------------------------------------------------------------ */

static lockmgr_hold_fn *hold_observer;     /* outside mgr: init keeps it */

void lockmgr_set_hold_observer(lockmgr_hold_fn *fn)
{
    hold_observer = fn;
}

void lockmgr_init(const struct conf *conf, const struct redlock_ops *rl)
{
    memset(&mgr, 0, sizeof(mgr));
    mgr.conf = conf;
    mgr.rl = rl;
    hmap_init(&mgr.table);
    list_init(&mgr.notices);
    list_init(&mgr.held_back);
    list_init(&mgr.adopts_held);
    if (getrandom(&mgr.rng, sizeof(mgr.rng), GRND_NONBLOCK) != sizeof(mgr.rng))
        mgr.rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    mgr.rng |= 1;
    /* Daemons with different ids start at different slots, so two of them
     * do not both ask for slot 0 first. */
    if (conf->id)
        mgr.spread = hmap_hash(conf->id, strlen(conf->id));
    mgr.prefixlen = strlen(conf->locks.key_prefix);
    mgr.keycap = mgr.prefixlen + conf->locks.max_resource_len +
               LOCKMGR_SLOT_SUFFIX_SIZE;
    mgr.keybuf = mem_alloc(mgr.keycap);
    memcpy(mgr.keybuf, conf->locks.key_prefix, mgr.prefixlen);
}

static void entry_free(struct lock_entry *e)
{
    free(e->slots);
    free(e);
}

void lockmgr_deinit(void)
{
    /* Owners are ended and ops drained before this; anything left is a
     * lease whose release did not complete before the shutdown timeout. */
    struct hmap_iter it;
    struct hmap_node *n;
    hmap_iter_init(&it, &mgr.table);
    while ((n = hmap_iter_next(&it))) {
        struct lock_entry *e = container_of(n, struct lock_entry, node);
        hmap_del(&mgr.table, n);
        entry_free(e);
    }
    hmap_deinit(&mgr.table);
    free(mgr.keybuf);
    mgr.keybuf = NULL;
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
    return mgr.held;
}

size_t lockmgr_waiter_count(void)
{
    return mgr.waiters;
}

const struct lockmgr_counters *lockmgr_counters(void)
{
    return &mgr.c;
}

static int64_t lease_validity(const struct lease *l)
{
    uint64_t now = timer_now();
    return l->valid_until > now ? (int64_t)(l->valid_until - now) : 0;
}

static const char *mode_name(enum lockmgr_mode m)
{
    return m == LOCKMGR_SHARED ? "shared" : "exclusive";
}

/* ---- the audit trail ------------------------------------------------------
 * One info line per grant, release and loss (a warning for a loss the
 * holder did not choose), naming the session, its client name and peer. */

#define AUDIT_FMT "%s fence=%" PRIu64 " %s%s %s (name=%s peer=%s)"
#define AUDIT_ARGS(what, l, o) what, (l)->fence, (l)->resource, \
    lease_kind(l), (o)->id, (o)->name[0] ? (o)->name : "-", \
    (o)->peer ? (o)->peer : "-"

/* " (shared)", " (slot 3 of 5)" or "" for the audit line. */
static const char *lease_kind(const struct lease *l)
{
    static char buf[64];

    if (l->mode == LOCKMGR_SHARED)
        return " (shared)";
    if (!l->limit)
        return "";
    snprintf(buf, sizeof(buf), " (slot %" PRId64 " of %" PRIu32 ")", l->slot,
             l->limit);
    return buf;
}

static void audit(const struct lease *l, const struct lockmgr_owner *o,
                  const char *what, const char *why)
{
    if (o)
        log_info(AUDIT_FMT ": %s", AUDIT_ARGS(what, l, o), why);
    else
        log_info("%s fence=%" PRIu64 " %s%s: %s", what, l->fence,
                 l->resource, lease_kind(l), why);
}

/* ---- entries ------------------------------------------------------------ */

/* key_prefix + res in mgr.keybuf (valid until the next call). The buffer is
 * sized for max_resource_len and a slot's suffix, and grows if a longer
 * name ever comes. */
static const char *entry_key(const char *res, size_t len, size_t *keylen)
{
    if (mgr.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE > mgr.keycap) {
        mgr.keycap = mgr.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE;
        mgr.keybuf = mem_realloc(mgr.keybuf, mgr.keycap);
    }
    memcpy(mgr.keybuf + mgr.prefixlen, res, len);
    mgr.keybuf[mgr.prefixlen + len] = '\0';
    *keylen = mgr.prefixlen + len;
    return mgr.keybuf;
}

/* The key of slot `slot` of e in mgr.keybuf (valid until the next call). */
static const char *entry_slot_key(const struct lock_entry *e, uint32_t slot,
                                  size_t *keylen)
{
    size_t len = e->keylen - mgr.prefixlen;
    entry_key(e->resource, len, keylen);
    *keylen += (size_t)snprintf(mgr.keybuf + *keylen, LOCKMGR_SLOT_SUFFIX_SIZE,
                                "%c%" PRIu32, LOCKMGR_SLOT_SEP, slot);
    return mgr.keybuf;
}

static struct lock_entry *entry_lookup(const char *key, size_t keylen)
{
    struct hmap_node *n = hmap_get(&mgr.table, key, keylen);
    return n ? container_of(n, struct lock_entry, node) : NULL;
}

static struct lock_entry *entry_find(const char *res, size_t len)
{
    size_t keylen;
    const char *key = entry_key(res, len, &keylen);
    return entry_lookup(key, keylen);
}

/* The entry of res, made for a request of that limit if there is none. */
static struct lock_entry *entry_get(const char *res, size_t len,
                                    uint32_t limit)
{
    struct lock_entry *e = entry_find(res, len);
    if (e)
        return e;
    size_t keylen = mgr.prefixlen + len;
    e = mem_alloc(sizeof(*e) + keylen + 1 + keylen +
                  LOCKMGR_SHARED_SUFFIX_LEN + 1);
    memcpy(e->key, mgr.conf->locks.key_prefix, mgr.prefixlen);
    memcpy(e->key + mgr.prefixlen, res, len);
    e->keylen = keylen;
    e->key[keylen] = '\0';
    e->resource = e->key + mgr.prefixlen;
    char *sh = e->key + keylen + 1;
    memcpy(sh, e->key, keylen);
    memcpy(sh + keylen, LOCKMGR_SHARED_SUFFIX, LOCKMGR_SHARED_SUFFIX_LEN + 1);
    e->shared = sh;
    e->sharedlen = keylen + LOCKMGR_SHARED_SUFFIX_LEN;
    list_init(&e->holders);
    list_init(&e->waiters);
    e->limit = limit;
    if (limit)
        e->slots = mem_alloc(limit);
    hmap_put(&mgr.table, &e->node, e->key, e->keylen);
    return e;
}

static struct req_pos *pos_of(const struct list *link)
{
    return list_entry(link, struct req_pos, link);
}

static struct lockreq *entry_head(const struct lock_entry *e)
{
    struct req_pos *p = pos_of(list_first(&e->waiters));
    return p ? p->q : NULL;
}

static void entry_maybe_free(struct lock_entry *e)
{
    if (e->nheld || !list_empty(&e->waiters) || e->pins)
        return;
    hmap_del(&mgr.table, &e->node);
    entry_free(e);
}

static void entry_push(struct req_pos *p)
{
    list_push_tail(&p->e->waiters, &p->link);
    p->e->nwait++;
    mgr.waiters++;
}

static void entry_remove(struct req_pos *p)
{
    list_remove(&p->link);
    p->e->nwait--;
    mgr.waiters--;
}

static bool req_exclusive(const struct lockreq *q)
{
    return q->mode == LOCKMGR_EXCLUSIVE && !q->limit;
}

/*
 * May q talk to Redis now, as far as e is concerned? Everything ahead of
 * it in e's queue must be talking to Redis already (first come, first
 * served), and nothing held or asked for here may rule it out. With
 * count_gone false, holders whose keys are going away count as gone.
 */
static bool entry_admits(const struct lock_entry *e, const struct lockreq *q,
                         bool count_gone)
{
    size_t ahead = 0, excl = 0;
    const struct list *p;

    list_foreach(p, &e->waiters) {
        const struct lockreq *w = pos_of(p)->q;
        if (w == q)
            break;
        if (!w->attempting)
            return false;
        ahead++;
        excl += req_exclusive(w);
    }
    if (q->limit)
        return e->nused - (count_gone ? 0 : e->ngone_slots) < e->limit;
    if (q->mode == LOCKMGR_SHARED)
        return excl == 0 && e->nexcl - (count_gone ? 0 : e->ngone_excl) == 0;
    return ahead == 0 && e->nheld - (count_gone ? 0 : e->ngone) == 0;
}

static bool req_may_start(const struct lockreq *q, bool count_gone)
{
    if (list_linked(&q->hlink))     /* held back until lockmgr_ready */
        return false;
    for (size_t i = 0; i < q->n; i++)
        if (!entry_admits(q->pos[i].e, q, count_gone))
            return false;
    return true;
}

/*
 * Is all that keeps q (exclusive or shared, not a semaphore) from asking
 * Redis now either requests ahead of it already asking, or holders whose
 * keys are going away? Then no one holds what it wants yet: a LOCK
 * without wait= waits for their outcome rather than hearing that the
 * resource is held.
 */
static bool req_only_asked(const struct lockreq *q)
{
    if (q->limit)
        return false;
    for (size_t i = 0; i < q->n; i++) {
        const struct lock_entry *e = q->pos[i].e;
        const struct list *p;
        list_foreach(p, &e->waiters) {
            const struct lockreq *w = pos_of(p)->q;
            if (w == q)
                break;
            if (!w->attempting)
                return false;
        }
        if (q->mode == LOCKMGR_SHARED ? e->nexcl > e->ngone_excl
                                      : e->nheld > e->ngone)
            return false;
    }
    return true;
}

static void req_give_up(struct lockreq *q);

/* Let every waiter that may talk to Redis now do so, in queue order,
 * stopping at the first that may not: nobody behind it overtakes it. A
 * LOCK without wait= that waited for others' outcome and now finds the
 * resource held is answered at once. */
static void entry_kick(struct lock_entry *e)
{
    struct list *p, *tmp;

    e->pins++;
    list_foreach_safe(p, tmp, &e->waiters) {
        struct lockreq *q = pos_of(p)->q;
        if (q->attempting)
            continue;
        if (req_may_start(q, true)) {
            req_attempt(q);
            continue;
        }
        if (q->deadline || q->o == NULL || list_linked(&q->hlink) ||
            req_may_start(q, false) || req_only_asked(q))
            break;
        req_give_up(q);
        break;
    }
    e->pins--;
    entry_maybe_free(e);
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
        list_remove(&l->glink);
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
    uint64_t m = 2 * (uint64_t)mgr.conf->redis.command_timeout_ms +
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

/* When l renews next: a renewal interval from now, brought forward to a
 * multiple of LOCKMGR_RENEW_GRAIN_MS (at most an eighth of the interval),
 * so that renewals fall due together and redlock sends them to each node
 * as one script (redlock_extend_batched). */
static uint64_t lease_renew_due(const struct lease *l)
{
    uint64_t iv = lease_renew_interval(l);
    uint64_t grain = iv / 8 < LOCKMGR_RENEW_GRAIN_MS ? iv / 8
                                                     : LOCKMGR_RENEW_GRAIN_MS;
    uint64_t due = timer_now() + iv;

    return grain ? due - due % grain : due;
}

/* The validity changed: move the hard deadline, and (unless told not to)
 * schedule the next renewal. */
static void lease_arm(struct lease *l, bool renewal)
{
    timer_start_at(&l->deadline, lease_deadline(l));
    if (renewal && l->renew)
        timer_start_at(&l->timer, lease_renew_due(l));
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

/* The key q's grant holds on its i-th resource: the exclusive key, the
 * shared holders' set or the slot's key (keybuf for a slot). */
static const char *req_key(const struct lockreq *q, size_t i, size_t *keylen)
{
    const struct lock_entry *e = q->pos[i].e;

    if (q->limit)
        return entry_slot_key(e, (uint32_t)q->slot, keylen);
    if (q->mode == LOCKMGR_SHARED) {
        *keylen = e->sharedlen;
        return e->shared;
    }
    *keylen = e->keylen;
    return e->key;
}

/* What a new lease is, beside its entry and key. */
struct lease_init {
    enum lockmgr_mode mode;
    uint32_t limit;
    int64_t slot;
    const char *token;
    uint64_t fence;
    uint32_t ttl;
    bool renew;
    int64_t validity;
};

/* A lease on e's key (or slot, or set) `key`, renewals armed; the caller
 * attaches it to its owner. */
static struct lease *lease_new(struct lock_entry *e, const char *key,
                               size_t keylen, const struct lease_init *in)
{
    size_t len = e->keylen - mgr.prefixlen;
    struct lease *l = mem_alloc(sizeof(*l) + len + 1 + keylen + 1);
    memcpy(l->resource, e->resource, len);
    l->resource[len] = '\0';
    char *k = l->resource + len + 1;
    memcpy(k, key, keylen);
    k[keylen] = '\0';
    l->key = k;
    l->keylen = keylen;
    list_init(&l->olink);
    list_init(&l->elink);
    list_init(&l->glink);
    l->entry = e;
    l->mode = in->mode;
    l->limit = in->limit;
    l->slot = in->limit ? in->slot : -1;
    snprintf(l->token, sizeof(l->token), "%s", in->token);
    l->fence = in->fence;
    l->ttl = in->ttl;
    l->renew = in->renew;
    l->acquired_at = timer_now();
    l->valid_until = l->acquired_at + (uint64_t)(in->validity > 0
                                                 ? in->validity : 0);
    timer_init(&l->timer, lease_timer_cb, l);
    timer_init(&l->deadline, lease_deadline_cb, l);
    lease_arm(l, true);
    return l;
}

/* The lease of q's grant on its i-th resource. */
static struct lease *lease_create(struct lockreq *q, size_t i, uint64_t fence,
                                  int64_t validity)
{
    size_t keylen;
    const char *key = req_key(q, i, &keylen);
    const struct lease_init in = {
        .mode = q->mode, .limit = q->limit, .slot = q->slot,
        .token = q->token, .fence = fence, .ttl = q->ttl, .renew = q->renew,
        .validity = validity,
    };

    return lease_new(q->pos[i].e, key, keylen, &in);
}

static void lease_attach(struct lease *l, struct lockmgr_owner *o)
{
    struct lock_entry *e = l->entry;

    l->owner = o;
    list_push_tail(&o->leases, &l->olink);
    o->nleases++;
    list_push_tail(&e->holders, &l->elink);
    e->nheld++;
    if (l->mode == LOCKMGR_EXCLUSIVE && !l->limit)
        e->nexcl++;
    mgr.held++;
}

/* The lease stops being held: off its owner, no more timers, and an
 * EXTEND still waiting for its turn is answered LOST. Its entry counts it
 * as going away until entry_drop_holder. */
static void lease_end(struct lease *l)
{
    struct extend_ctx *x = l->queued;
    struct lock_entry *e = l->entry;

    if (l->owner) {
        list_remove(&l->olink);
        l->owner->nleases--;
        l->owner = NULL;
    }
    timer_stop(&l->timer);
    timer_stop(&l->deadline);
    l->gone = true;
    mgr.held--;
    if (hold_observer)
        hold_observer(timer_now() - l->acquired_at);
    if (e) {
        e->ngone++;
        if (l->mode == LOCKMGR_EXCLUSIVE && !l->limit)
            e->ngone_excl++;
        if (l->limit)
            e->ngone_slots++;
    }
    if (x) {
        l->queued = NULL;
        extend_answer(x, PROTO_ERR_LOST, 0);
    }
}

/* The entry no longer counts l among its holders: waiters may try. */
static void entry_drop_holder(struct lock_entry *e, struct lease *l)
{
    if (!e || !list_linked(&l->elink))
        return;
    list_remove(&l->elink);
    e->nheld--;
    e->ngone--;
    if (l->mode == LOCKMGR_EXCLUSIVE && !l->limit) {
        e->nexcl--;
        e->ngone_excl--;
    }
    if (l->limit) {
        e->slots[l->slot]--;
        e->nused--;
        e->ngone_slots--;
    }
    struct lockreq *head = entry_head(e);
    if (head && !head->attempting)
        mgr.c.wakeups_notified++;
    entry_kick(e);
}

static void release_done(void *ud, const struct redlock_result *res);

/*
 * The lease leaves its owner now; its keys are deleted (or kept for
 * delay_ms, owner-checked) and the entry is free for others once that is
 * done. `u` is the UNLOCK waiting for the answer, if any.
 */
struct release_ctx {
    struct lease *l;
    struct unlock_ctx *u;
};

static void lease_release(struct lease *l, uint32_t delay_ms,
                          struct unlock_ctx *u, const char *why)
{
    struct release_ctx *x = mem_alloc(sizeof(*x));

    audit(l, l->owner, "release", why);
    lease_end(l);
    mgr.c.releases++;
    x->l = l;
    x->u = u;
    l->ops++;
    /* With no UNLOCK waiting for it, it can go with others. */
    if (delay_ms > 0)
        (u ? mgr.rl->extend : mgr.rl->extend_batched)(l->key, l->keylen,
                                                  l->token, delay_ms,
                                                  release_done, x);
    else
        (u ? mgr.rl->release : mgr.rl->release_batched)(l->key, l->keylen,
                                                    l->token, release_done,
                                                    x);
}

static void unlock_step(struct unlock_ctx *u, const struct redlock_result *res)
{
    if (res->deleted < u->nodes)
        u->nodes = res->deleted;
    /* So many nodes had no key of ours that no quorum can have held it:
     * the lock had been lost before this UNLOCK. */
    if (res->busy > mgr.rl->nnodes() - mgr.rl->quorum())
        u->lost = true;
    if (--u->left > 0)
        return;
    struct notice *n = notice_new(N_UNLOCKED, u->o, u->resource, NULL);
    n->gen = u->gen;
    n->nodes = u->nodes;
    n->nres = u->n;
    if (u->lost)
        n->err = PROTO_ERR_LOST;
    owner_unref(u->o);
    free(u);
}

static void release_done(void *ud, const struct redlock_result *res)
{
    struct release_ctx *x = ud;
    struct lease *l = x->l;
    struct lock_entry *e = l->entry;

    enter();
    if (x->u)
        unlock_step(x->u, res);
    free(x);
    l->entry = NULL;
    l->ops--;
    entry_drop_holder(e, l);
    lease_put(l);
    leave();
}

/* The lease stops being held here and its keys are left on the nodes to
 * expire by their ttl: nothing is released or announced. */
static void lease_leave_keys(struct lease *l)
{
    struct lock_entry *e = l->entry;

    lease_end(l);
    l->entry = NULL;
    entry_drop_holder(e, l);
    lease_put(l);
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

    mgr.c.leases_lost++;
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
    lease_leave_keys(l);
}

/* A renewal retry is worth sending only if its answer (command timeout,
 * plus the grace a late loop gets) can come before the hard deadline. */
static bool lease_can_retry(const struct lease *l, uint64_t at)
{
    return at + 2 * (uint64_t)mgr.conf->redis.command_timeout_ms <=
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
        mgr.c.renewals++;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        mgr.c.renewal_failures++;
        lease_lose(l, LOST_NODE);
    } else {
        /* Not enough nodes answered: try again soon, while a retry can
         * still finish before the deadline; the deadline decides. */
        uint64_t retry = l->ttl / 10;
        if (retry < 20)
            retry = 20;
        if (retry > 1000)
            retry = 1000;
        mgr.c.renewal_failures++;
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
    mgr.rl->extend_batched(l->key, l->keylen, l->token, l->ttl, renew_done, l);
}

/* Renew l now, or when the op in flight for it is answered. */
static void lease_renew_now(struct lease *l)
{
    if (l->extending)
        l->renew_due = true;    /* sent when the EXTEND out is answered */
    else
        renew_start(l);
}

static void lease_timer_cb(struct timer *t)
{
    struct lease *l = t->data;
    struct list *p;

    if (l->gone)
        return;
    enter();
    lease_renew_now(l);
    /* The leases of one grant of several resources renew together, so
     * that their renewals share each node's write: a sibling due within
     * a quarter of its interval goes now too. */
    for (p = l->glink.next; p != &l->glink; p = p->next) {
        struct lease *s = container_of(p, struct lease, glink);
        if (s->gone || !s->renew || !s->timer.slot)
            continue;
        if (s->timer.due <= timer_now() + lease_renew_interval(s) / 4) {
            timer_stop(&s->timer);
            lease_renew_now(s);
        }
    }
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

/* s as the inside of a JSON string at out + at (when out is not NULL);
 * returns the new end. Labels are made of visible ASCII (conf's id,
 * session ids, proto's client names), so '"' and '\\' are all there is to
 * escape; anything else below ' ' is dropped, never stored. */
static size_t json_put_str(char *out, size_t at, const char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s < ' ')
            continue;
        if (*s == '"' || *s == '\\') {
            if (out)
                out[at] = '\\';
            at++;
        }
        if (out)
            out[at] = *s;
        at++;
    }
    return at;
}

static size_t put_lit(char *out, size_t at, const char *lit)
{
    size_t n = strlen(lit);

    if (out)
        memcpy(out + at, lit, n);
    return at + n;
}

/* The holder label an acquisition stores after its token, so that STATUS
 * on any daemon of these nodes can name the holder:
 * {"daemon":"<id>","session":"<id>"[,"name":"<name>"][,"limit":K]},
 * compact (no space: the value is "token label fence"). A semaphore
 * slot's says its semaphore's size, which ADOPT finds there. Writes it and
 * a NUL to out unless out is NULL; returns its length. */
static size_t label_put(const struct lockmgr_owner *o, uint32_t limit,
                        char *out)
{
    size_t at = put_lit(out, 0, "{\"daemon\":\"");

    at = json_put_str(out, at, mgr.conf->id ? mgr.conf->id : "");
    at = put_lit(out, at, "\",\"session\":\"");
    at = json_put_str(out, at, o->id);
    if (o->name && o->name[0]) {
        at = put_lit(out, at, "\",\"name\":\"");
        at = json_put_str(out, at, o->name);
    }
    at = put_lit(out, at, "\"");
    if (limit) {
        char num[sizeof(",\"limit\":4294967295")];
        snprintf(num, sizeof(num), ",\"limit\":%" PRIu32, limit);
        at = put_lit(out, at, num);
    }
    at = put_lit(out, at, "}");
    if (out)
        out[at] = '\0';
    return at;
}

static void req_free(struct lockreq *q)
{
    list_remove(&q->hlink);         /* a no-op unless held back */
    timer_stop(&q->timer);
    free(q);
}

/* Take q out of its entries and free it; the waiters after it get their
 * turn. */
static void req_drop(struct lockreq *q)
{
    struct lock_entry *es[CONF_MAX_MULTI];
    size_t n = q->n;

    for (size_t i = 0; i < n; i++) {
        es[i] = q->pos[i].e;
        entry_remove(&q->pos[i]);
    }
    req_free(q);
    for (size_t i = 0; i < n; i++)
        entry_kick(es[i]);
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

/* "job:42", "job:42 and 2 more", for messages. */
static void req_names(const struct lockreq *q, char *buf, size_t size)
{
    if (q->n == 1)
        snprintf(buf, size, "%s", q->pos[0].e->resource);
    else
        snprintf(buf, size, "%s and %zu more", q->pos[0].e->resource,
                 q->n - 1);
}

static void req_give_up(struct lockreq *q)
{
    char msg[PROTO_MAX_ERRMSG], names[PROTO_MAX_ERRMSG / 2];
    const char *what = q->n > 1 ? "are" : "is";

    req_names(q, names, sizeof(names));
    if (q->last == REDLOCK_UNAVAILABLE) {
        /* Say why when the nodes know (one recovering until when, one
         * down and why): "could not be reached" is wrong for nodes that
         * answer but may not vote yet. */
        char why[512], full[PROTO_MAX_ERRMSG + sizeof(why)];
        size_t n = mgr.rl->why_unavailable ? mgr.rl->why_unavailable(why,
                                                                  sizeof(why))
                                         : 0;
        mgr.c.acquire_unavailable++;
        snprintf(full, sizeof(full), "no quorum of %d of %d redis nodes "
                 "voted in time%s%s", mgr.rl->quorum(), mgr.rl->nnodes(),
                 n ? ": " : "", n ? why : "");
        req_fail(q, PROTO_ERR_UNAVAILABLE, full);
    } else if (q->deadline || q->cut) {
        mgr.c.acquire_timeout++;
        if (q->cut)
            snprintf(msg, sizeof(msg), "the client closed the connection "
                     "while waiting for %s", names);
        else if (q->limit)
            snprintf(msg, sizeof(msg), "all %" PRIu32 " slots of %s are "
                     "still held", q->limit, names);
        else
            snprintf(msg, sizeof(msg), "%s %s still held by someone else",
                     names, what);
        req_fail(q, PROTO_ERR_TIMEOUT, msg);
    } else {
        mgr.c.acquire_busy++;
        if (q->limit)
            snprintf(msg, sizeof(msg), "all %" PRIu32 " slots of %s are "
                     "held", q->limit, names);
        else
            snprintf(msg, sizeof(msg), "%s %s held by someone else", names,
                     what);
        req_fail(q, PROTO_ERR_BUSY, msg);
    }
}

/* Seeded per process from the OS, so daemons do not share a sequence. */
static uint64_t rng_below(uint64_t n)
{
    mgr.rng ^= mgr.rng >> 12;
    mgr.rng ^= mgr.rng << 25;
    mgr.rng ^= mgr.rng >> 27;
    return n ? (mgr.rng * 0x2545f4914f6cdd1dULL >> 11) % n : 0;
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
    uint64_t delay = jitter(mgr.conf->locks.retry_ms);

    /* The key expires before that: ask just after, a little spread too. */
    if (pttl >= 0 && (uint64_t)pttl + 1 < delay)
        delay = (uint64_t)pttl + 1 + rng_below(LOCKMGR_WAKE_JITTER_MS + 1);
    uint64_t due = now + delay;
    if (due > q->deadline)
        due = q->deadline;
    timer_start_at(&q->timer, due);
}

/* The semaphore slot q asks for next in this pass over the slots, or -1
 * when it has considered them all: one announced free first, then from
 * this daemon's starting point on, skipping those held or asked for
 * here. */
static int64_t req_next_slot(struct lockreq *q)
{
    struct lock_entry *e = q->pos[0].e;
    int64_t hint = q->hint;

    q->hint = -1;
    if (hint >= 0 && hint < (int64_t)e->limit && !e->slots[hint])
        return hint;
    while (q->visited < e->limit) {
        uint32_t s = (uint32_t)((mgr.spread + q->visited++) % e->limit);
        if (!e->slots[s])
            return s;
    }
    return -1;
}

static void slot_take(struct lock_entry *e, int64_t slot)
{
    e->slots[slot]++;
    e->nused++;
}

static void slot_give(struct lock_entry *e, int64_t slot)
{
    e->slots[slot]--;
    e->nused--;
}

/* Whatever a grant that nobody wants any more holds, given back. */
static void req_give_back(struct lockreq *q)
{
    for (size_t i = 0; i < q->n; i++) {
        size_t keylen;
        const char *key = req_key(q, i, &keylen);
        mgr.rl->release(key, keylen, q->token, NULL, NULL);
    }
}

static void req_granted(struct lockreq *q, const struct redlock_result *res)
{
    struct lockmgr_owner *o = q->o;
    struct lease *first = NULL;
    struct notice *n = NULL;

    for (size_t i = 0; i < q->n; i++) {
        struct lease *l = lease_create(q, i, res->fence, res->validity);
        if (!first) {
            first = l;
            n = notice_new(N_LOCKED, o, l->resource, NULL);
            n->fence = l->fence;
            n->ttl = l->ttl;
            n->validity = lease_validity(l);
            n->nres = q->n;
            n->mode = q->mode;
            n->limit = q->limit;
            n->slot = q->limit ? (uint32_t)q->slot : 0;
            memcpy(n->token, l->token, sizeof(n->token));
        } else {
            list_push_tail(&first->glink, &l->glink);
        }
        lease_attach(l, o);
        audit(l, o, "grant", l->renew ? "renewed while the session lives"
                                      : "renew=0");
    }
    mgr.c.acquire_ok++;
    o->pending = NULL;
    req_drop(q);        /* the slot, if any, is the lease's now */
    owner_unref(o);
}

static bool req_try(struct lockreq *q);

static void attempt_done(void *ud, const struct redlock_result *res)
{
    struct lockreq *q = ud;
    struct lock_entry *e = q->pos[0].e;

    enter();
    q->attempting = false;
    if (q->limit && res->status != REDLOCK_OK)
        slot_give(e, q->slot);
    if (!q->o) {
        /* The owner ended while we were acquiring. */
        if (res->status == REDLOCK_OK) {
            req_give_back(q);
            if (q->limit)
                slot_give(e, q->slot);
        }
        req_drop(q);
    } else if (q->shutdown) {
        if (res->status == REDLOCK_OK) {
            req_give_back(q);
            if (q->limit)
                slot_give(e, q->slot);
        }
        req_fail(q, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
    } else if (res->status == REDLOCK_OK) {
        req_granted(q, res);
    } else {
        int64_t pttl = res->status == REDLOCK_BUSY ? res->pttl : -1;
        if (q->limit && pttl >= 0 &&
            (q->pass_pttl < 0 || pttl < q->pass_pttl))
            q->pass_pttl = pttl;
        /* That slot is taken elsewhere: on to the next. */
        if (q->limit && res->status == REDLOCK_BUSY && req_try(q)) {
            leave();
            return;
        }
        if (q->limit)
            pttl = q->pass_pttl;
        bool notified = q->notified;
        q->last = res->status;
        q->notified = false;
        if (!q->deadline || timer_now() >= q->deadline)
            req_give_up(q);
        else if (!(notified && res->status == REDLOCK_BUSY &&
                   req_attempt(q)))     /* released while we asked: again */
            req_sleep(q, pttl);
    }
    leave();
}

/* One acquisition for q: its keys, or (semaphore) the next slot of this
 * pass. False, having sent nothing, when the pass has no slot left. */
static bool req_try(struct lockreq *q)
{
    const char *keys[CONF_MAX_MULTI], *shared[CONF_MAX_MULTI];
    size_t lens[CONF_MAX_MULTI], slens[CONF_MAX_MULTI];
    struct redlock_lock lk = {
        .mode = q->mode == LOCKMGR_SHARED ? REDLOCK_SHARED
                                          : REDLOCK_EXCLUSIVE,
        .n = (int)q->n, .keys = keys, .lens = lens,
        .label = q->label, .labellen = q->labellen,
        .wait = q->deadline != 0,
    };

    if (q->limit) {
        struct lock_entry *e = q->pos[0].e;
        int64_t slot = req_next_slot(q);
        if (slot < 0)
            return false;
        q->slot = slot;
        keys[0] = entry_slot_key(e, (uint32_t)slot, &lens[0]);
    } else {
        for (size_t i = 0; i < q->n; i++) {
            keys[i] = q->pos[i].e->key;
            lens[i] = q->pos[i].e->keylen;
            shared[i] = q->pos[i].e->shared;
            slens[i] = q->pos[i].e->sharedlen;
        }
        lk.shared = shared;
        lk.shared_lens = slens;
    }
    if (mgr.rl->token(q->token) != 0) {
        /* Answer from the timer, never from inside our caller: it may be
         * about to touch the entry this request's answer could free. */
        q->no_token = true;
        timer_start(&q->timer, 0);
        return true;
    }
    if (q->limit)
        slot_take(q->pos[0].e, q->slot);
    q->attempting = true;
    mgr.rl->acquire(&lk, q->token, q->ttl, attempt_done, q);
    return true;
}

/* A new pass: the acquisition, or for a semaphore a pass over its slots.
 * False when no slot is left to ask for (all held or asked for here). */
static bool req_attempt(struct lockreq *q)
{
    timer_stop(&q->timer);
    q->woken = false;
    q->notified = false;
    q->visited = 0;
    q->pass_pttl = -1;
    return req_try(q);
}

static void req_timer_cb(struct timer *t)
{
    struct lockreq *q = t->data;

    if (q->attempting)
        return;
    enter();
    if (q->no_token) {
        log_error("getrandom failed: cannot make a lock token");
        q->last = REDLOCK_UNAVAILABLE;
        req_fail(q, PROTO_ERR_UNAVAILABLE, "no random source for a token");
    } else if (timer_now() >= q->deadline) {
        req_give_up(q);
    } else if (req_may_start(q, true)) {
        if (q->woken)
            mgr.c.wakeups_notified++;
        else
            mgr.c.wakeups_retry++;
        if (!req_attempt(q))
            timer_start_at(&q->timer, q->deadline);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
    leave();
}

/* A LOCK whose limit disagrees with what is held or waited for here. */
static bool req_conflict(const struct lockmgr_req *r, char *msg, size_t size)
{
    for (size_t i = 0; i < r->n; i++) {
        struct lock_entry *e = entry_find(r->res[i], r->len[i]);
        if (!e || e->limit == r->limit)
            continue;
        if (!e->limit)
            snprintf(msg, size, "%s is locked here without limit=, not as "
                     "a semaphore", e->resource);
        else if (!r->limit)
            snprintf(msg, size, "%s is a semaphore here (limit=%" PRIu32
                     "): LOCK it with that limit", e->resource, e->limit);
        else
            snprintf(msg, size, "%s is a semaphore of limit=%" PRIu32
                     " here, not %" PRIu32 ": every holder must use the "
                     "same limit", e->resource, e->limit, r->limit);
        return true;
    }
    return false;
}

/* A new request q, queued on its entries: ask Redis now, wait its turn,
 * or answer BUSY or LIMIT. */
static void req_begin(struct lockreq *q)
{
    char msg[PROTO_MAX_ERRMSG];
    bool wait = q->deadline != 0;
    size_t crowded = 0;

    for (size_t i = 0; i < q->n; i++)
        if (q->pos[i].e->nwait > q->pos[crowded].e->nwait)
            crowded = i;
    size_t max_waiters = mgr.conf->limits.max_waiters_per_resource;
    if (req_may_start(q, true)) {
        if (!req_attempt(q))    /* cannot be: a slot is free; as busy */
            timer_start_at(&q->timer, q->deadline);
    } else if (req_may_start(q, false)) {
        /* Only holders whose keys are being deleted right now (an UNLOCK
         * by another owner, or a lost lease being cleaned up) stand in the
         * way: that ends within a round trip, and release_done() kicks
         * this request, so even a wait=0 LOCK waits for it instead of
         * seeing a stale BUSY. A wait=0 one gives up if that takes more
         * than two command timeouts. */
        if (!wait)
            timer_start(&q->timer,
                        2 * (uint64_t)mgr.conf->redis.command_timeout_ms + 1);
        else
            timer_start_at(&q->timer, q->deadline);
    } else if (!wait && req_only_asked(q)) {
        /* Others are asking for it, nobody holds it here: their outcome
         * decides (entry_kick), within two command timeouts. */
        timer_start(&q->timer,
                    2 * (uint64_t)mgr.conf->redis.command_timeout_ms + 1);
    } else if (!wait) {
        /* Held here, or others wait first: first come, first served. */
        req_give_up(q);
    } else if (max_waiters && q->pos[crowded].e->nwait > max_waiters) {
        snprintf(msg, sizeof(msg), "%zu requests already wait for %s "
                 "(limits.max_waiters_per_resource)",
                 q->pos[crowded].e->nwait - 1,
                 q->pos[crowded].e->resource);
        req_fail(q, PROTO_ERR_LIMIT, msg);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
}

void lockmgr_lock_req(struct lockmgr_owner *o, const struct lockmgr_req *r)
{
    char msg[PROTO_MAX_ERRMSG];
    struct lockreq *q;

    enter();
    if (req_conflict(r, msg, sizeof(msg))) {
        struct notice *n = notice_new(N_LOCKED, o, NULL, msg);
        n->err = PROTO_ERR_ARG;
        leave();
        return;
    }
    size_t labellen = label_put(o, r->limit, NULL);
    q = mem_alloc(sizeof(*q) + r->n * sizeof(q->pos[0]) + labellen + 1);
    q->n = r->n;
    list_init(&q->hlink);
    label_put(o, r->limit, (char *)&q->pos[r->n]);
    q->label = (char *)&q->pos[r->n];
    q->labellen = labellen;
    q->o = o;
    owner_ref(o);
    o->pending = q;
    q->mode = r->mode;
    q->limit = r->limit;
    q->slot = -1;
    q->hint = -1;
    q->ttl = r->ttl;
    q->renew = r->renew;
    q->last = REDLOCK_BUSY;
    q->deadline = r->wait ? timer_now() + r->wait : 0;
    timer_init(&q->timer, req_timer_cb, q);
    for (size_t i = 0; i < r->n; i++) {
        q->pos[i].q = q;
        q->pos[i].e = entry_get(r->res[i], r->len[i], r->limit);
        entry_push(&q->pos[i]);
    }
    if (r->wait)
        mgr.c.waits++;
    if (mgr.starting) {
        /* Until then a wait that runs out is for lack of nodes. */
        q->last = REDLOCK_UNAVAILABLE;
        list_push_tail(&mgr.held_back, &q->hlink);
        if (q->deadline)
            timer_start_at(&q->timer, q->deadline);
    } else {
        req_begin(q);
    }
    leave();
}

static void adopt_send_held(void);
static void adopt_unhold(struct lockmgr_owner *o, enum proto_err err);

/* Held back at start-up; ends with lockmgr_ready(). */
void lockmgr_starting(void)
{
    mgr.starting = true;
}

void lockmgr_ready(void)
{
    struct list *link;

    if (!mgr.starting)
        return;
    enter();
    mgr.starting = false;
    while ((link = list_first(&mgr.held_back))) {
        struct lockreq *q = list_entry(link, struct lockreq, hlink);
        list_remove(link);
        q->last = REDLOCK_BUSY;
        req_begin(q);
    }
    adopt_send_held();
    leave();
}

void lockmgr_lock(struct lockmgr_owner *o, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew)
{
    const char *res[] = { resource };
    size_t lens[] = { len };
    struct lockmgr_req r = {
        .n = 1, .res = res, .len = lens, .mode = LOCKMGR_EXCLUSIVE,
        .ttl = ttl, .wait = wait, .renew = renew,
    };
    lockmgr_lock_req(o, &r);
}

/* ---- owner-facing operations ------------------------------------------- */

struct lease *lockmgr_held(const struct lockmgr_owner *o,
                           const char *resource, size_t len)
{
    const struct list *p;

    list_foreach(p, &o->leases) {
        struct lease *l = list_entry(p, struct lease, olink);
        if (strncmp(l->resource, resource, len) == 0 &&
            l->resource[len] == '\0')
            return l;
    }
    return NULL;
}

void lockmgr_unlock_many(struct lockmgr_owner *o, struct lease *const *l,
                         size_t n)
{
    size_t len = strlen(l[0]->resource);
    struct unlock_ctx *u = mem_alloc(sizeof(*u) + len + 1);

    enter();
    u->o = o;
    u->gen = o->gen;
    owner_ref(o);
    u->n = u->left = n;
    u->nodes = mgr.rl->nnodes();
    memcpy(u->resource, l[0]->resource, len + 1);
    for (size_t i = 0; i < n; i++)
        lease_release(l[i], 0, u, "UNLOCK");
    leave();
}

void lockmgr_unlock(struct lockmgr_owner *o, struct lease *l)
{
    lockmgr_unlock_many(o, &l, 1);
}

static void extend_answer(struct extend_ctx *x, enum proto_err err,
                          int64_t validity)
{
    struct lease *l = x->l;
    struct notice *n = notice_new(N_EXTENDED, x->o, l->resource, NULL);

    n->gen = x->gen;
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
    mgr.c.extends++;
    if (l->gone) {
        err = PROTO_ERR_LOST;
    } else if (res->status == REDLOCK_OK) {
        l->ttl = x->ttl;
        l->valid_until = now + (uint64_t)validity;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        err = PROTO_ERR_LOST;
        mgr.c.leases_lost++;
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
    mgr.rl->extend(l->key, l->keylen, l->token, x->ttl, extend_done, x);
}

void lockmgr_extend(struct lockmgr_owner *o, struct lease *l, uint32_t ttl)
{
    struct extend_ctx *x = mem_alloc(sizeof(*x));

    enter();
    x->l = l;
    x->o = o;
    x->gen = o->gen;
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
        mgr.c.acquire_timeout++;
        req_fail(q, PROTO_ERR_TIMEOUT, "the client closed the connection "
                 "while waiting");
    }
    leave();
}

void lockmgr_owner_shutdown(struct lockmgr_owner *o)
{
    struct lockreq *q = o->pending;

    enter();
    if (q) {
        q->shutdown = true;
        if (!q->attempting)
            req_fail(q, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
    }
    adopt_unhold(o, PROTO_ERR_SHUTDOWN);
    leave();
}

size_t lockmgr_owner_abandon(struct lockmgr_owner *o, uint64_t *until)
{
    struct list *link;
    size_t n = 0;

    enter();
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        /* The keys last as long as the last renewal's ttl: at most the
         * validity plus what was taken off it (drift, the round). */
        uint64_t end = l->valid_until + mgr.conf->redis.command_timeout_ms +
                       (uint64_t)((double)l->ttl * mgr.conf->locks.drift_factor)
                       + 2;
        if (end > *until)
            *until = end;
        log_info(AUDIT_FMT ": left on the nodes to expire by its ttl",
                 AUDIT_ARGS("abandoned", l, o));
        lease_leave_keys(l);
        n++;
    }
    leave();
    return n;
}

/* o's LOCK, if any, is no longer o's: dropped now, or, with an attempt
 * in flight, when it completes (a grant then given back). */
static void owner_drop_pending(struct lockmgr_owner *o)
{
    struct lockreq *q = o->pending;

    if (!q)
        return;
    o->pending = NULL;
    q->o = NULL;
    if (!q->attempting)
        req_drop(q);
    owner_unref(o);     /* the request's reference */
}

void lockmgr_owner_cancel(struct lockmgr_owner *o)
{
    enter();
    o->gen++;
    owner_drop_pending(o);
    adopt_unhold(o, PROTO_ERR_NONE);
    leave();
}

void lockmgr_owner_end(struct lockmgr_owner *o, bool died)
{
    uint32_t delay = died ? mgr.conf->locks.lock_delay_ms : 0;
    struct list *link;

    enter();
    o->ended = true;
    adopt_unhold(o, PROTO_ERR_NONE);
    owner_drop_pending(o);
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        lease_release(l, delay, NULL, delay ? "the connection dropped; "
                      "keys kept for locks.lock_delay_ms" : "the session "
                      "ended");
    }
    leave();
}

/* A release of one of e's keys was announced: the waiters that may talk
 * to Redis now do so soon (slot: the semaphore slot released, or -1). */
static void entry_wake(struct lock_entry *e, int64_t slot)
{
    struct list *p;

    list_foreach(p, &e->waiters) {
        struct lockreq *q = pos_of(p)->q;
        if (q->limit && slot >= 0)
            q->hint = slot;
        if (q->attempting) {
            q->notified = true;
            continue;
        }
        if (!req_may_start(q, true))
            break;
        if (q->woken)
            break;      /* the same release, heard from another node */
        q->woken = true;
        timer_start(&q->timer, rng_below(LOCKMGR_WAKE_JITTER_MS + 1));
        break;
    }
}

/* The slot number of a key ending in "#<digits>", or -1. */
static int64_t key_slot(const char *key, size_t len, size_t *base)
{
    size_t i = len;
    uint64_t slot = 0, mul = 1;

    while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9' && len - i < 6) {
        slot += (uint64_t)(key[i - 1] - '0') * mul;
        mul *= 10;
        i--;
    }
    if (i == len || i == 0 || key[i - 1] != LOCKMGR_SLOT_SEP)
        return -1;
    *base = i - 1;
    return (int64_t)slot;
}

void lockmgr_on_release(const char *key, size_t len)
{
    struct lock_entry *e;
    size_t base;
    int64_t slot;

    if (len < mgr.prefixlen ||
        memcmp(key, mgr.conf->locks.key_prefix, mgr.prefixlen) != 0)
        return;
    /* A name may also be another's derived key: every reading wakes its
     * entry; a wake-up that finds the lock still taken costs one try. */
    if ((e = entry_lookup(key, len)) && !e->limit)
        entry_wake(e, -1);
    if (len > mgr.prefixlen + LOCKMGR_SHARED_SUFFIX_LEN &&
        memcmp(key + len - LOCKMGR_SHARED_SUFFIX_LEN, LOCKMGR_SHARED_SUFFIX,
               LOCKMGR_SHARED_SUFFIX_LEN) == 0 &&
        (e = entry_lookup(key, len - LOCKMGR_SHARED_SUFFIX_LEN)) &&
        !e->limit)
        entry_wake(e, -1);
    if ((slot = key_slot(key, len, &base)) >= 0 && base > mgr.prefixlen &&
        (e = entry_lookup(key, base)) && e->limit)
        entry_wake(e, slot < (int64_t)e->limit ? slot : -1);
}

/* ---- ADOPT --------------------------------------------------------------- */

struct adopt_ctx {
    struct lockmgr_owner *o;        /* (ref) */
    struct list hlink;              /* in mgr.adopts_held (start-up) */
    unsigned gen;                   /* o->gen when asked */
    uint32_t ttl;
    bool renew;
    char old[REDLOCK_TOKEN_LEN + 1];
    char token[REDLOCK_TOKEN_LEN + 1];
    size_t n;
    struct lock_entry *e[];         /* pinned while the round runs */
};

static void adopt_answer(struct lockmgr_owner *o, unsigned gen,
                         enum proto_err err, const char *msg)
{
    struct notice *n = notice_new(N_LOCKED, o, NULL, msg);
    n->gen = gen;
    n->err = err;
}

/* A lease here that still has the old token (another session's, or a
 * detached one's): its keys are the adopter's now. */
static void adopt_drop_old(struct lock_entry *e, const char *old)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &e->holders) {
        struct lease *l = list_entry(p, struct lease, elink);
        if (!l->gone && strcmp(l->token, old) == 0)
            lease_lose(l, LOST_NODE);
    }
}

static void probe_make(const char *res, size_t len, uint32_t limit,
                       struct redlock_probe *pr, char **buf);

/* Can e take the lease one resource's ADOPT found (its kind is known only
 * from the nodes' answers)? A semaphore here of another size, or a
 * semaphore found where this daemon locks the resource otherwise (or the
 * other way round), cannot: msg says why. */
static bool adopt_fits(struct lock_entry *e, const struct redlock_result *res,
                       char *msg, size_t size)
{
    uint32_t limit = res->adopted_limit;

    if (res->adopted != REDLOCK_HELD_SLOT) {
        if (!e->limit)
            return true;
        snprintf(msg, size, "%s is a semaphore here (limit=%" PRIu32 ")",
                 e->resource, e->limit);
        return false;
    }
    if (!limit)
        limit = e->limit;       /* stored by a daemon that did not say */
    if (limit > mgr.conf->locks.max_limit) {
        snprintf(msg, size, "%s is a semaphore of limit=%" PRIu32 " on the "
                 "nodes, more than locks.max_limit (%u) here", e->resource,
                 limit, mgr.conf->locks.max_limit);
        return false;
    }
    if (!limit || res->adopted_slot >= limit) {
        snprintf(msg, size, "slot %" PRIu32 " of %s: its semaphore's size "
                 "is not stored on the nodes", res->adopted_slot,
                 e->resource);
        return false;
    }
    if (e->limit == limit)
        return true;
    if (e->limit || e->nheld || e->nwait) {
        snprintf(msg, size, "%s is locked here %s, not as a semaphore of "
                 "limit=%" PRIu32, e->resource, e->limit ? "with another "
                 "limit=" : "without limit=", limit);
        return false;
    }
    e->limit = limit;           /* the entry was made by this ADOPT */
    e->slots = mem_alloc(limit);
    return true;
}

/* The keys of a multi-resource grant are exclusive locks: none of them may
 * have become a semaphore here meanwhile (another ADOPT of one of them,
 * which found a slot). */
static bool adopt_fits_multi(const struct adopt_ctx *x, char *msg,
                             size_t size)
{
    for (size_t i = 0; i < x->n; i++) {
        if (x->e[i]->limit) {
            snprintf(msg, size, "%s is a semaphore here: the resources of "
                     "one grant are exclusive", x->e[i]->resource);
            return false;
        }
    }
    return true;
}

/* The key of x's i-th entry that the adopted token holds, by the kind the
 * nodes found (one resource) or the exclusive key (a grant's keys). */
static const char *adopt_key(const struct adopt_ctx *x,
                             const struct redlock_result *res, size_t i,
                             size_t *keylen)
{
    const struct lock_entry *e = x->e[i];

    if (x->n == 1 && res->adopted == REDLOCK_HELD_SHARED) {
        *keylen = e->sharedlen;
        return e->shared;
    }
    if (x->n == 1 && res->adopted == REDLOCK_HELD_SLOT)
        return entry_slot_key(e, res->adopted_slot, keylen);
    *keylen = e->keylen;
    return e->key;
}

/* The adopted lease of one resource, or of each key of a multi-resource
 * grant, as a LOCK's grant is answered: to o, with the new token. */
static void adopt_grant(struct adopt_ctx *x, const struct redlock_result *res)
{
    struct lockmgr_owner *o = x->o;
    struct lease *first = NULL;
    struct lease_init in = {
        .mode = LOCKMGR_EXCLUSIVE, .slot = -1, .token = x->token,
        .fence = res->fence, .ttl = x->ttl, .renew = x->renew,
        .validity = res->validity,
    };

    for (size_t i = 0; i < x->n; i++) {
        struct lock_entry *e = x->e[i];
        size_t keylen;
        if (x->n == 1 && res->adopted == REDLOCK_HELD_SHARED) {
            in.mode = LOCKMGR_SHARED;
        } else if (x->n == 1 && res->adopted == REDLOCK_HELD_SLOT) {
            in.limit = e->limit;
            in.slot = res->adopted_slot;
        }
        adopt_drop_old(e, x->old);
        /* A slot's name is in the shared key buffer: made right before
         * lease_new copies it. */
        const char *key = adopt_key(x, res, i, &keylen);
        struct lease *l = lease_new(e, key, keylen, &in);
        if (in.limit)
            slot_take(e, in.slot);
        if (!first) {
            struct notice *n = notice_new(N_LOCKED, o, l->resource, NULL);
            n->gen = x->gen;
            first = l;
            n->fence = l->fence;
            n->ttl = l->ttl;
            n->validity = lease_validity(l);
            n->nres = x->n;
            n->mode = in.mode;
            n->limit = in.limit;
            n->slot = in.limit ? (uint32_t)in.slot : 0;
            memcpy(n->token, l->token, sizeof(n->token));
        } else {
            list_push_tail(&first->glink, &l->glink);
        }
        lease_attach(l, o);
        audit(l, o, "adopt", "token rotated on a quorum");
    }
    mgr.c.adopts++;
}

/*
 * The round rotated the keys, but nobody here will hold them: its owner
 * ended, or this daemon cannot keep the lease beside what it holds. They
 * are left on the nodes to expire at the ADOPT's ttl, never deleted: the
 * token the client proved was its lease, and it may still be working
 * under it (a LOCK's grant is given back instead: nobody held that one
 * before its round). A lease here with the old token is gone all the
 * same (adopt_drop_old).
 */
static void adopt_leave(struct adopt_ctx *x, const char *why)
{
    for (size_t i = 0; i < x->n; i++)
        adopt_drop_old(x->e[i], x->old);
    mgr.c.adopts_left++;
    log_notice("ADOPT of %s%s: token rotated on a quorum, but %s: its keys "
               "are left to expire in %" PRIu32 " ms", x->e[0]->resource,
               x->n > 1 ? " (and the rest of its grant)" : "", why, x->ttl);
}

static void adopt_done(void *ud, const struct redlock_result *res)
{
    struct adopt_ctx *x = ud;
    struct lockmgr_owner *o = x->o;
    char why[PROTO_MAX_ERRMSG];

    enter();
    if (res->status == REDLOCK_OK && o->ended) {
        adopt_leave(x, "its session has ended");
    } else if (res->status == REDLOCK_OK &&
               (x->n > 1 ? adopt_fits_multi(x, why, sizeof(why))
                         : adopt_fits(x->e[0], res, why, sizeof(why)))) {
        /* Also when the connection that asked has left the session
         * (detached, or taken over by a resume): the lease is the
         * session's, and only the answer goes nowhere (x->gen). */
        adopt_grant(x, res);
    } else if (res->status == REDLOCK_OK) {
        /* Ours on the nodes, but not a lease this daemon can keep beside
         * what it holds: the client hears why (its lease is gone). */
        adopt_leave(x, "it cannot be held here");
        adopt_answer(o, x->gen, PROTO_ERR_ARG, why);
    } else if (res->status == REDLOCK_BUSY) {
        adopt_answer(o, x->gen, PROTO_ERR_LOST, "the token holds on too few "
                     "nodes: the lease is gone (or was adopted elsewhere)");
    } else {
        size_t k = mgr.rl->why_unavailable ? mgr.rl->why_unavailable(why,
                                                                  sizeof(why))
                                         : 0;
        adopt_answer(o, x->gen, PROTO_ERR_UNAVAILABLE, k ? why
                     : "no quorum of redis nodes answered in time");
    }
    for (size_t i = 0; i < x->n; i++) {
        x->e[i]->pins--;
        entry_maybe_free(x->e[i]);
    }
    owner_unref(o);
    free(x);
    leave();
}

/* Why this ADOPT cannot start, in msg (answered by the caller), or 0. */
static enum proto_err adopt_refuse(const struct lockmgr_owner *o,
                                   const struct lockmgr_adopt_req *r,
                                   char *msg, size_t size)
{
    if (o->nleases + r->n > mgr.conf->limits.max_locks_per_session) {
        snprintf(msg, size, "this session would hold more than %u locks "
                 "(limits.max_locks_per_session)",
                 mgr.conf->limits.max_locks_per_session);
        return PROTO_ERR_LIMIT;
    }
    for (size_t i = 0; i < r->n; i++) {
        const struct lock_entry *e = entry_find(r->res[i], r->len[i]);
        if (lockmgr_held(o, r->res[i], r->len[i])) {
            snprintf(msg, size, "this session already holds %.*s",
                     (int)r->len[i], r->res[i]);
            return PROTO_ERR_HELD;
        }
        if (r->n > 1 && e && e->limit) {
            snprintf(msg, size, "%.*s is a semaphore here: the resources of "
                     "one grant are exclusive", (int)r->len[i], r->res[i]);
            return PROTO_ERR_ARG;
        }
    }
    return PROTO_ERR_NONE;
}

/* The round of x: one resource may be a shared hold or a slot of a
 * semaphore of any size this daemon allows. */
static void adopt_send(struct adopt_ctx *x)
{
    const char *keys[CONF_MAX_MULTI];
    size_t lens[CONF_MAX_MULTI];
    struct redlock_probe one;
    char *names = NULL;

    for (size_t i = 0; i < x->n; i++) {
        keys[i] = x->e[i]->key;
        lens[i] = x->e[i]->keylen;
    }
    if (x->n == 1)
        probe_make(x->e[0]->resource, x->e[0]->keylen - mgr.prefixlen,
                   mgr.conf->locks.max_limit, &one, &names);
    size_t labellen = label_put(x->o, 0, NULL);
    char *label = mem_alloc(labellen + 1);
    label_put(x->o, 0, label);
    const struct redlock_adopt a = {
        .n = x->n > 1 ? (int)x->n : 0, .one = x->n == 1 ? &one : NULL,
        .keys = keys, .lens = lens, .old_token = x->old, .token = x->token,
        .label = label, .labellen = labellen, .ttl = x->ttl,
    };
    mgr.rl->adopt(&a, adopt_done, x);
    free(label);
    free(names);
}

/* An ADOPT that will not be sent (its owner ended or the daemon shuts
 * down while it was held back). */
static void adopt_drop(struct adopt_ctx *x)
{
    list_remove(&x->hlink);
    for (size_t i = 0; i < x->n; i++) {
        x->e[i]->pins--;
        entry_maybe_free(x->e[i]);
    }
    owner_unref(x->o);
    free(x);
}

/* o's ADOPT held back at start-up, if any, given up (answered err). */
static void adopt_unhold(struct lockmgr_owner *o, enum proto_err err)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &mgr.adopts_held) {
        struct adopt_ctx *x = list_entry(p, struct adopt_ctx, hlink);
        if (x->o != o)
            continue;
        if (err != PROTO_ERR_NONE)
            adopt_answer(o, x->gen, err, "the daemon is shutting down");
        adopt_drop(x);
    }
}

/* Start-up is over: the ADOPTs held back go out, in order. */
static void adopt_send_held(void)
{
    struct list *link;

    while ((link = list_first(&mgr.adopts_held))) {
        struct adopt_ctx *x = list_entry(link, struct adopt_ctx, hlink);
        list_remove(link);
        adopt_send(x);
    }
}

void lockmgr_adopt(struct lockmgr_owner *o, const struct lockmgr_adopt_req *r)
{
    char msg[PROTO_MAX_ERRMSG];
    enum proto_err err;
    struct adopt_ctx *x;

    enter();
    if ((err = adopt_refuse(o, r, msg, sizeof(msg))) != PROTO_ERR_NONE) {
        adopt_answer(o, o->gen, err, msg);
        leave();
        return;
    }
    x = mem_alloc(sizeof(*x) + r->n * sizeof(x->e[0]));
    if (mgr.rl->token(x->token) != 0) {
        free(x);
        adopt_answer(o, o->gen, PROTO_ERR_UNAVAILABLE, "the system's random "
                     "source failed");
        leave();
        return;
    }
    x->o = o;
    x->gen = o->gen;
    owner_ref(o);
    list_init(&x->hlink);
    x->ttl = r->ttl;
    x->renew = r->renew;
    snprintf(x->old, sizeof(x->old), "%s", r->token);
    x->n = r->n;
    for (size_t i = 0; i < r->n; i++) {
        x->e[i] = entry_get(r->res[i], r->len[i], 0);
        x->e[i]->pins++;
    }
    /* As a LOCK is: until the nodes are checked, an answer could only be
     * UNAVAILABLE (and the client would have to try again). */
    if (mgr.starting)
        list_push_tail(&mgr.adopts_held, &x->hlink);
    else
        adopt_send(x);
    leave();
}

/* ---- FORCEUNLOCK --------------------------------------------------------- */

/* FORCEUNLOCK's and STATUS's context: who asked, about what. */
struct owner_ask {
    struct lockmgr_owner *o;    /* (ref) */
    unsigned gen;               /* o->gen when asked */
    size_t len;
    uint32_t limit;             /* STATUS: slots looked at */
    char resource[];
};

static struct owner_ask *owner_ask_new(struct lockmgr_owner *o,
                                       const char *resource, size_t len)
{
    struct owner_ask *x = mem_alloc(sizeof(*x) + len + 1);

    x->o = o;
    x->gen = o->gen;
    owner_ref(o);
    x->len = len;
    memcpy(x->resource, resource, len);
    x->resource[len] = '\0';
    return x;
}

static void force_done(void *ud, const struct redlock_result *res)
{
    struct owner_ask *x = ud;
    struct notice *n;

    enter();
    log_notice("forced release of %s by %s (name=%s peer=%s): deleted on "
               "%d of %d nodes", x->resource, x->o->id,
               x->o->name[0] ? x->o->name : "-", x->o->peer ? x->o->peer
               : "-", res->deleted, mgr.rl->nnodes());
    n = notice_new(N_UNLOCKED, x->o, x->resource, NULL);
    n->gen = x->gen;
    n->nodes = res->deleted;
    owner_unref(x->o);
    free(x);
    leave();
}

/* What STATUS and FORCEUNLOCK look at: the resource's keys, and `limit`
 * slots (or as many as this daemon knows it has). The names stay in
 * *buf (owned by the caller) until the call is made. */
static void probe_make(const char *res, size_t len, uint32_t limit,
                       struct redlock_probe *pr, char **buf)
{
    struct lock_entry *e = entry_find(res, len);
    size_t keylen = mgr.prefixlen + len;
    char *b = mem_alloc(3 * (keylen + LOCKMGR_SHARED_SUFFIX_LEN + 2));

    memcpy(b, mgr.conf->locks.key_prefix, mgr.prefixlen);
    memcpy(b + mgr.prefixlen, res, len);
    b[keylen] = '\0';
    char *sh = b + keylen + 1;
    memcpy(sh, b, keylen);
    memcpy(sh + keylen, LOCKMGR_SHARED_SUFFIX, LOCKMGR_SHARED_SUFFIX_LEN + 1);
    char *sl = sh + keylen + LOCKMGR_SHARED_SUFFIX_LEN + 1;
    memcpy(sl, b, keylen);
    sl[keylen] = LOCKMGR_SLOT_SEP;
    sl[keylen + 1] = '\0';
    pr->key = b;
    pr->keylen = keylen;
    pr->shared = sh;
    pr->sharedlen = keylen + LOCKMGR_SHARED_SUFFIX_LEN;
    pr->slots = sl;
    pr->slotslen = keylen + 1;
    pr->limit = limit ? limit : e ? e->limit : 0;
    *buf = b;
}

/* The holders here of a resource being forced: told before the first
 * node deletes (their notices go out at leave(), before any node can
 * answer), so none of them works on while a waiter elsewhere is granted
 * on the nodes that answered first. One elsewhere learns it at its next
 * renewal. */
static void force_lose_local(const char *resource, size_t len)
{
    struct lock_entry *e = entry_find(resource, len);
    struct list *p, *tmp;

    if (!e)
        return;
    e->pins++;
    list_foreach_safe(p, tmp, &e->holders) {
        struct lease *l = list_entry(p, struct lease, elink);
        if (!l->gone)
            lease_lose(l, LOST_NODE);
    }
    e->pins--;
    entry_maybe_free(e);
}

void lockmgr_force_release(struct lockmgr_owner *o, const char *resource,
                           size_t len)
{
    struct owner_ask *x;
    struct redlock_probe pr;
    char *buf;

    enter();
    force_lose_local(resource, len);
    x = owner_ask_new(o, resource, len);
    /* Slots too: as many as a semaphore here has, else as many as one
     * may have. */
    probe_make(resource, len, 0, &pr, &buf);
    if (!pr.limit)
        pr.limit = mgr.conf->locks.max_limit;
    mgr.rl->force_release(&pr, force_done, x);
    free(buf);
    leave();
}

/* ---- inspection --------------------------------------------------------- */

const char *lockmgr_mode_name(enum lockmgr_mode m)
{
    return mode_name(m);
}

void lockmgr_owner_leases(const struct lockmgr_owner *o,
                          lockmgr_lease_fn *fn, void *ud)
{
    uint64_t now = timer_now();
    const struct list *link;

    list_foreach(link, &o->leases) {
        const struct lease *l = list_entry(link, const struct lease, olink);
        const struct lockmgr_lease_view v = {
            .resource = l->resource, .token = l->token, .fence = l->fence,
            .ttl = l->ttl, .validity = lease_validity(l),
            .held_ms = now - l->acquired_at, .renew = l->renew,
            .renewals = l->renewals, .mode = l->mode, .limit = l->limit,
            .slot = l->limit ? l->slot : -1,
        };
        fn(ud, &v);
    }
}

static void holder_view(const struct lease *l, struct lockmgr_holder_view *h)
{
    uint64_t now = timer_now();

    *h = (struct lockmgr_holder_view){
        .session = l->owner->id, .name = l->owner->name,
        .fence = l->fence, .held_ms = now - l->acquired_at,
        .validity = lease_validity(l), .mode = l->mode,
        .slot = l->limit ? l->slot : -1,
        .attached = !l->owner->detached,
        .detached_ms = l->owner->detached ? now - l->owner->detached_at : 0,
    };
}

/* Held here: the first LOCKMGR_STATUS_HOLDERS holders (the first of them
 * is STATUS's "holder"), and how many shared and exclusive ones. */
static size_t status_holders(const struct lock_entry *e,
                             struct lockmgr_holder_view *h,
                             size_t *nshared, size_t *nexcl)
{
    const struct list *p;
    size_t n = 0;

    *nshared = *nexcl = 0;
    if (!e)
        return 0;
    list_foreach(p, &e->holders) {
        const struct lease *l = list_entry(p, const struct lease, elink);
        if (l->gone || !l->owner)
            continue;
        if (l->mode == LOCKMGR_SHARED)
            ++*nshared;
        else if (!l->limit)
            ++*nexcl;
        if (n < LOCKMGR_STATUS_HOLDERS)
            holder_view(l, &h[n++]);
    }
    return n;
}

/* The node whose value names the exclusive key's holder when a quorum of
 * voting nodes holds one token: the one with a label and the highest
 * fence stored with it, or -1 (then p->remote_token says whether a quorum
 * holds some token all the same: a foreign Redlock client's). */
static void plan_remote(const struct redlock_node_view *v, int n, int quorum,
                        struct lockmgr_status_plan *p)
{
    p->remote = -1;
    p->remote_token = false;
    for (int i = 0; i < n; i++) {
        if (!v[i].token)
            continue;
        int k = 0, with = -1;
        uint64_t fence = 0;
        for (int j = 0; j < n; j++) {
            if (!v[j].voting || !v[j].token ||
                strcmp(v[j].token, v[i].token) != 0)
                continue;
            k++;
            if (v[j].label && (with < 0 || v[j].fence > fence))
                with = j, fence = v[j].fence;
        }
        if (k < quorum)
            continue;
        p->remote_token = true;
        p->remote = with;
        p->remote_fence = fence;
        return;
    }
}

void lockmgr_status_plan(const struct redlock_node_view *v, int n, int quorum,
                         uint32_t limit, size_t nexcl_here,
                         size_t nshared_here, bool holder_here,
                         struct lockmgr_status_plan *p)
{
    memset(p, 0, sizeof(*p));
    for (int i = 0; i < n; i++) {
        if (v[i].answered && v[i].pttl != -2)
            p->present++;
        if (v[i].answered && v[i].shared > 0) {
            p->with_shared++;
            if (v[i].voting && v[i].shared > p->shared_holders)
                p->shared_holders = v[i].shared;
        }
    }
    /* A slot is held where a quorum of nodes has its key. */
    for (uint32_t s = 0; s < limit; s++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            k += v[i].slots && strlen(v[i].slots) > s && v[i].slots[s] == '1';
        p->slots_held += k >= quorum;
    }
    /* The nodes' holder is asked for only when none is here. */
    if (!holder_here)
        plan_remote(v, n, quorum, p);
    else
        p->remote = -1;
    if (nexcl_here || p->present >= quorum)
        p->mode = "exclusive";
    else if (nshared_here || p->with_shared >= quorum)
        p->mode = "shared";
    p->held = holder_here || p->remote_token || p->present >= quorum ||
              p->with_shared >= quorum || p->slots_held > 0;
    if ((size_t)p->shared_holders < nshared_here)
        p->shared_holders = (int64_t)nshared_here;
}

/* STATUS: answered at once, not as a notice (its views live only during
 * this call); leave() has delivered what was queued before it. */
static void status_done(void *ud, const struct redlock_node_view *v, int n)
{
    struct owner_ask *x = ud;
    struct lockmgr_owner *o = x->o;
    struct lockmgr_holder_view holders[LOCKMGR_STATUS_HOLDERS];
    struct lockmgr_status_plan plan;
    struct lock_entry *e;
    size_t nheld, nshared, nexcl, keylen;

    enter();
    e = entry_find(x->resource, x->len);
    nheld = status_holders(e, holders, &nshared, &nexcl);
    lockmgr_status_plan(v, n, mgr.rl->quorum(), x->limit, nexcl, nshared,
                        nheld > 0, &plan);
    const char *k = entry_key(x->resource, x->len, &keylen);
    char *key = mem_alloc(keylen + 1);
    memcpy(key, k, keylen);
    key[keylen] = '\0';
    const struct lockmgr_status st = {
        .resource = x->resource, .key = key, .daemon = mgr.conf->id,
        .plan = &plan, .holders = holders, .nholders = nheld,
        .holders_here = e ? e->nheld - e->ngone : 0,
        .waiters = e ? e->nwait : 0, .limit = x->limit, .nodes = v,
        .nnodes = n,
    };
    leave();
    if (!o->ended && x->gen == o->gen)
        o->ops->status(o, &st);
    owner_unref(o);
    free(key);
    free(x);
}

void lockmgr_status(struct lockmgr_owner *o, const char *resource,
                    size_t len, uint32_t limit)
{
    struct owner_ask *x;
    struct redlock_probe pr;
    char *buf;

    enter();
    x = owner_ask_new(o, resource, len);
    probe_make(resource, len, limit, &pr, &buf);
    x->limit = pr.limit;
    mgr.rl->inspect(&pr, status_done, x);
    free(buf);
    leave();
}
