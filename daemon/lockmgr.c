/*
 * lockmgr: see lockmgr.h; the structures and the split into files in
 * lockmgr_priv.h. This file: owners and the answers they get (notices),
 * set-up, the audit trail, the entries of the lock table, and what ends
 * or cancels an owner.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"

struct lockmgr_state lm;

/* ---- owners and notices ------------------------------------------------ */

void lm_owner_ref(struct lockmgr_owner *o)
{
    o->ops->ref(o);
}

/* Must not call back into lockmgr (a session only frees memory here). */
void lm_owner_unref(struct lockmgr_owner *o)
{
    o->ops->unref(o);
}

/* A notice for o (with a reference on it), its strings copied: the
 * resource, and a refusal's. */
static struct notice *notice_make(enum notice_kind kind,
                                  struct lockmgr_owner *o, unsigned gen,
                                  void *ask, const char *resource,
                                  const struct lockmgr_refusal *no)
{
    size_t rlen = resource ? strlen(resource) : 0;
    size_t nlen = no && no->resource ? strlen(no->resource) + 1 : 0;
    size_t dlen = no && no->detail ? strlen(no->detail) + 1 : 0;
    struct notice *n = mem_alloc(sizeof(*n) + rlen + 1 + nlen + dlen);
    char *at = n->text + rlen + 1;

    n->kind = kind;
    n->o = o;
    n->gen = gen;
    n->ask = ask;
    n->nres = 1;
    lm_owner_ref(o);
    if (rlen)
        memcpy(n->text, resource, rlen);
    if (no) {
        n->refused = true;
        n->no = *no;
        if (nlen) {
            memcpy(at, no->resource, nlen);
            n->no.resource = at;
            at += nlen;
        }
        if (dlen) {
            memcpy(at, no->detail, dlen);
            n->no.detail = at;
        }
    }
    list_push_tail(&lm.notices, &n->link);
    return n;
}

struct notice *lm_notice_new(enum notice_kind kind,
                             struct lockmgr_owner *o, unsigned gen,
                             void *ask, const char *resource)
{
    return notice_make(kind, o, gen, ask, resource, NULL);
}

struct notice *lm_notice_refused(enum notice_kind kind,
                                 struct lockmgr_owner *o, unsigned gen,
                                 void *ask, const char *resource,
                                 const struct lockmgr_refusal *no)
{
    return notice_make(kind, o, gen, ask, resource, no);
}

static void notice_deliver(struct notice *n)
{
    struct lockmgr_owner *o = n->o;
    const struct lockmgr_owner_ops *ops = o->ops;
    const struct lockmgr_refusal *no = n->refused ? &n->no : NULL;

    /* An answer for a requester that went away (lockmgr_owner_cancel)
     * is dropped; a loss is the owner's whoever asks for it. */
    if (o->ended || (n->kind != N_LOST && n->gen != o->gen))
        return;
    switch (n->kind) {
    case N_LOCKED:
        if (!no) {
            struct lockmgr_grant g = {
                .resource = n->text, .nresources = n->nres,
                .token = n->token, .fence = n->fence, .ttl = n->ttl,
                .validity = n->validity, .mode = n->mode,
                .limit = n->limit, .slot = n->slot,
            };
            ops->locked(o, n->ask, &g, NULL);
        } else {
            ops->locked(o, n->ask, NULL, no);
        }
        break;
    case N_UNLOCKED:
        ops->unlocked(o, n->ask, n->text, n->nres, n->nodes, no);
        break;
    case N_EXTENDED:
        ops->extended(o, n->ask, n->text, n->ttl, n->validity, no);
        break;
    case N_LOST:
        ops->lost(o, n->text, n->fence, n->why);
        break;
    }
}

static void notices_flush(void)
{
    struct list *link;

    if (lm.flushing)
        return;     /* an owner called back in: the loop below goes on */
    lm.flushing = true;
    while ((link = list_first(&lm.notices))) {
        struct notice *n = list_entry(link, struct notice, link);
        list_remove(link);
        notice_deliver(n);
        lm_owner_unref(n->o);
        free(n);
    }
    lm.flushing = false;
}

void lm_enter(void)
{
    lm.depth++;
}

void lm_leave(void)
{
    if (--lm.depth == 0)
        notices_flush();
}

/* ---- set-up ------------------------------------------------------------ */

static lockmgr_change_fn *change_observer; /* outside lm: init keeps it */

void lockmgr_set_change_observer(lockmgr_change_fn *fn)
{
    change_observer = fn;
}

void lm_changed(const struct lock_entry *e)
{
    if (change_observer)
        change_observer(e->resource, e->keylen - lm.prefixlen, e->limit);
}

/* Outside lm: lockmgr_init keeps it. */
static const struct lockmgr_observer *observer;

void lockmgr_set_observer(const struct lockmgr_observer *ob)
{
    observer = ob;
}

void lm_observe_held(const struct lease *l)
{
    if (observer)
        observer->held(l->resource, strlen(l->resource),
                       timer_now() - l->acquired_at);
}

void lm_observe_waited(const struct lockreq *q, bool granted)
{
    uint64_t waited = timer_now() - q->asked_at;

    for (size_t i = 0; observer && i < q->n; i++) {
        const struct lock_entry *e = q->pos[i].e;
        observer->waited(e->resource, e->keylen - lm.prefixlen, granted,
                         waited);
    }
}

void lockmgr_init(const struct conf *conf, const struct redlock_ops *rl)
{
    memset(&lm, 0, sizeof(lm));
    lm.conf = conf;
    lm.rl = rl;
    hmap_init(&lm.table);
    list_init(&lm.notices);
    list_init(&lm.held_back);
    list_init(&lm.adopts_held);
    if (getrandom(&lm.rng, sizeof(lm.rng), GRND_NONBLOCK) != sizeof(lm.rng))
        lm.rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    lm.rng |= 1;
    /* Daemons with different ids start at different slots, so two of them
     * do not both ask for slot 0 first. */
    if (conf->id)
        lm.spread = hmap_hash(conf->id, strlen(conf->id));
    lm.prefixlen = strlen(conf->locks.key_prefix);
    lm.keycap = lm.prefixlen + conf->locks.max_resource_len +
               LOCKMGR_SLOT_SUFFIX_SIZE;
    lm.keybuf = mem_alloc(lm.keycap);
    memcpy(lm.keybuf, conf->locks.key_prefix, lm.prefixlen);
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
    hmap_iter_init(&it, &lm.table);
    while ((n = hmap_iter_next(&it))) {
        struct lock_entry *e = container_of(n, struct lock_entry, node);
        hmap_del(&lm.table, n);
        entry_free(e);
    }
    hmap_deinit(&lm.table);
    free(lm.keybuf);
    lm.keybuf = NULL;
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
    list_init(&o->waits);
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
    return lm.held;
}

size_t lockmgr_waiter_count(void)
{
    return lm.waiters;
}

const struct lockmgr_counters *lockmgr_counters(void)
{
    return &lm.c;
}

int64_t lm_lease_validity(const struct lease *l)
{
    uint64_t now = timer_now();
    return l->valid_until > now ? (int64_t)(l->valid_until - now) : 0;
}

const char *lockmgr_mode_name(enum lockmgr_mode m)
{
    return m == LOCKMGR_SHARED ? "shared" : "exclusive";
}

/* ---- the audit trail ------------------------------------------------------
 * One info line per grant, release and loss (a warning for a loss the
 * holder did not choose), naming the session, its client name and peer. */

/* " (shared)", " (slot 3 of 5)" or "" for the audit line. */
const char *lm_lease_kind(const struct lease *l)
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

void lm_audit(const struct lease *l, const struct lockmgr_owner *o,
              const char *what, const char *why)
{
    if (o)
        log_info(AUDIT_FMT ": %s", AUDIT_ARGS(what, l, o), why);
    else
        log_info("%s fence=%" PRIu64 " %s%s: %s", what, l->fence,
                 l->resource, lm_lease_kind(l), why);
}

/* ---- entries ------------------------------------------------------------ */

/* key_prefix + res in lm.keybuf (valid until the next call). The buffer is
 * sized for max_resource_len and a slot's suffix, and grows if a longer
 * name ever comes. */
const char *lm_entry_key(const char *res, size_t len, size_t *keylen)
{
    if (lm.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE > lm.keycap) {
        lm.keycap = lm.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE;
        lm.keybuf = mem_realloc(lm.keybuf, lm.keycap);
    }
    memcpy(lm.keybuf + lm.prefixlen, res, len);
    lm.keybuf[lm.prefixlen + len] = '\0';
    *keylen = lm.prefixlen + len;
    return lm.keybuf;
}

/* The key of slot `slot` of e in lm.keybuf (valid until the next call). */
const char *lm_entry_slot_key(const struct lock_entry *e, uint32_t slot,
                              size_t *keylen)
{
    size_t len = e->keylen - lm.prefixlen;
    lm_entry_key(e->resource, len, keylen);
    *keylen += (size_t)snprintf(lm.keybuf + *keylen, LOCKMGR_SLOT_SUFFIX_SIZE,
                                "%c%" PRIu32, LOCKMGR_SLOT_SEP, slot);
    return lm.keybuf;
}

static struct lock_entry *entry_lookup(const char *key, size_t keylen)
{
    struct hmap_node *n = hmap_get(&lm.table, key, keylen);
    return n ? container_of(n, struct lock_entry, node) : NULL;
}

struct lock_entry *lm_entry_find(const char *res, size_t len)
{
    size_t keylen;
    const char *key = lm_entry_key(res, len, &keylen);
    return entry_lookup(key, keylen);
}

/* The entry of res, made for a request of that limit if there is none. */
struct lock_entry *lm_entry_get(const char *res, size_t len,
                                uint32_t limit)
{
    struct lock_entry *e = lm_entry_find(res, len);
    if (e)
        return e;
    size_t keylen = lm.prefixlen + len;
    e = mem_alloc(sizeof(*e) + keylen + 1 + keylen +
                  LOCKMGR_SHARED_SUFFIX_LEN + 1);
    memcpy(e->key, lm.conf->locks.key_prefix, lm.prefixlen);
    memcpy(e->key + lm.prefixlen, res, len);
    e->keylen = keylen;
    e->key[keylen] = '\0';
    e->resource = e->key + lm.prefixlen;
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
    hmap_put(&lm.table, &e->node, e->key, e->keylen);
    return e;
}

static struct req_pos *pos_of(const struct list *link)
{
    return list_entry(link, struct req_pos, link);
}

struct lockreq *lm_entry_head(const struct lock_entry *e)
{
    struct req_pos *p = pos_of(list_first(&e->waiters));
    return p ? p->q : NULL;
}

void lm_entry_maybe_free(struct lock_entry *e)
{
    if (e->nheld || !list_empty(&e->waiters) || e->pins)
        return;
    hmap_del(&lm.table, &e->node);
    entry_free(e);
}

void lm_entry_push(struct req_pos *p)
{
    list_push_tail(&p->e->waiters, &p->link);
    p->e->nwait++;
    lm.waiters++;
}

void lm_entry_remove(struct req_pos *p)
{
    list_remove(&p->link);
    p->e->nwait--;
    lm.waiters--;
}

static bool req_exclusive(const struct lockreq *q)
{
    return q->mode == LOCKMGR_EXCLUSIVE && !q->limit;
}

/* Is everything ahead of q in e's queue talking to Redis already? With
 * the counts of those (ahead) and of the exclusive ones among them. */
static bool ahead_asking(const struct lock_entry *e, const struct lockreq *q,
                         size_t *ahead, size_t *excl)
{
    const struct list *p;

    *ahead = *excl = 0;
    list_foreach(p, &e->waiters) {
        const struct lockreq *w = pos_of(p)->q;
        if (w == q)
            break;
        if (!w->attempting)
            return false;
        ++*ahead;
        *excl += req_exclusive(w);
    }
    return true;
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
    size_t ahead, excl;

    if (!ahead_asking(e, q, &ahead, &excl))
        return false;
    if (q->limit)
        return e->nused - (count_gone ? 0 : e->ngone_slots) < e->limit;
    if (q->mode == LOCKMGR_SHARED)
        return excl == 0 && e->nexcl - (count_gone ? 0 : e->ngone_excl) == 0;
    return ahead == 0 && e->nheld - (count_gone ? 0 : e->ngone) == 0;
}

bool lm_req_may_start(const struct lockreq *q, bool count_gone)
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
bool lm_req_only_asked(const struct lockreq *q)
{
    if (q->limit)
        return false;
    for (size_t i = 0; i < q->n; i++) {
        const struct lock_entry *e = q->pos[i].e;
        size_t ahead, excl;
        if (!ahead_asking(e, q, &ahead, &excl))
            return false;
        if (q->mode == LOCKMGR_SHARED ? e->nexcl > e->ngone_excl
                                      : e->nheld > e->ngone)
            return false;
    }
    return true;
}


/* Let every waiter that may talk to Redis now do so, in queue order,
 * stopping at the first that may not: nobody behind it overtakes it. A
 * LOCK without wait= that waited for others' outcome and now finds the
 * resource held is answered at once. */
void lm_entry_kick(struct lock_entry *e)
{
    struct list *p, *tmp;

    e->pins++;
    list_foreach_safe(p, tmp, &e->waiters) {
        struct lockreq *q = pos_of(p)->q;
        if (q->attempting)
            continue;
        if (lm_req_may_start(q, true)) {
            lm_req_attempt(q);
            continue;
        }
        if (q->deadline || q->o == NULL || list_linked(&q->hlink) ||
            lm_req_may_start(q, false) || lm_req_only_asked(q))
            break;
        lm_req_give_up(q);
        break;
    }
    e->pins--;
    lm_entry_maybe_free(e);
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

void lockmgr_cut_wait(struct lockmgr_owner *o)
{
    struct list *p, *tmp;

    lm_enter();
    list_foreach_safe(p, tmp, &o->waits) {
        struct lockreq *q = list_entry(p, struct lockreq, olink);
        if (!q->deadline)
            continue;   /* wait=0 requests end on their own, soon */
        q->deadline = 0;
        q->cut = true;
        if (!q->attempting)
            lm_req_give_up(q);
    }
    lm_leave();
}

void lockmgr_owner_shutdown(struct lockmgr_owner *o)
{
    struct list *p, *tmp;

    lm_enter();
    list_foreach_safe(p, tmp, &o->waits) {
        struct lockreq *q = list_entry(p, struct lockreq, olink);
        q->shutdown = true;
        if (!q->attempting)
            lm_req_refuse(q, LOCKMGR_NO_SHUTDOWN);
    }
    lm_adopt_unhold(o, true);
    lm_leave();
}

size_t lockmgr_owner_abandon(struct lockmgr_owner *o, uint64_t *until)
{
    struct list *link;
    size_t n = 0;

    lm_enter();
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        /* The keys last as long as the last renewal's ttl: at most the
         * validity plus what was taken off it (drift, the round). */
        uint64_t end = l->valid_until + lm.conf->redis.command_timeout_ms +
                       (uint64_t)((double)l->ttl * lm.conf->locks.drift_factor)
                       + 2;
        if (end > *until)
            *until = end;
        log_info(AUDIT_FMT ": left on the nodes to expire by its ttl",
                 AUDIT_ARGS("abandoned", l, o));
        lm_lease_leave_keys(l);
        n++;
    }
    lm_leave();
    return n;
}

/* o's LOCKs are no longer o's: each dropped now, or, with an attempt in
 * flight, when it completes (a grant then given back). */
static void owner_drop_waits(struct lockmgr_owner *o)
{
    struct list *link;

    while ((link = list_first(&o->waits))) {
        struct lockreq *q = list_entry(link, struct lockreq, olink);
        lm_req_disown(q);
        if (!q->attempting)
            lm_req_drop(q);
    }
}

void lockmgr_owner_cancel(struct lockmgr_owner *o)
{
    lm_enter();
    o->gen++;
    owner_drop_waits(o);
    lm_adopt_unhold(o, false);
    lm_leave();
}

void lockmgr_owner_end(struct lockmgr_owner *o, bool died)
{
    uint32_t delay = died ? lm.conf->locks.lock_delay_ms : 0;
    struct list *link;

    lm_enter();
    o->ended = true;
    lm_adopt_unhold(o, false);
    owner_drop_waits(o);
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        lm_lease_release(l, delay, NULL, delay ? "the connection dropped; "
                      "keys kept for locks.lock_delay_ms" : "the session "
                      "ended");
    }
    lm_leave();
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
        if (!lm_req_may_start(q, true))
            break;
        if (q->woken)
            break;      /* the same release, heard from another node */
        q->woken = true;
        timer_start(&q->timer, lm_rng_below(LOCKMGR_WAKE_JITTER_MS + 1));
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

    if (len < lm.prefixlen ||
        memcmp(key, lm.conf->locks.key_prefix, lm.prefixlen) != 0)
        return;
    /* A name may also be another's derived key: every reading wakes its
     * entry; a wake-up that finds the lock still taken costs one try. */
    if ((e = entry_lookup(key, len)) && !e->limit)
        entry_wake(e, -1);
    if (len > lm.prefixlen + LOCKMGR_SHARED_SUFFIX_LEN &&
        memcmp(key + len - LOCKMGR_SHARED_SUFFIX_LEN, LOCKMGR_SHARED_SUFFIX,
               LOCKMGR_SHARED_SUFFIX_LEN) == 0 &&
        (e = entry_lookup(key, len - LOCKMGR_SHARED_SUFFIX_LEN)) &&
        !e->limit)
        entry_wake(e, -1);
    if ((slot = key_slot(key, len, &base)) >= 0 && base > lm.prefixlen &&
        (e = entry_lookup(key, base)) && e->limit)
        entry_wake(e, slot < (int64_t)e->limit ? slot : -1);
}
