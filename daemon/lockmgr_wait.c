/*
 * lockmgr, LOCK requests (lockmgr_priv.h): a request in the FIFO of each
 * resource it names, who may talk to Redis when, the attempts (a
 * semaphore's slot by slot), sleeping and waking (a release announced),
 * and the grant. Above the leases (a grant makes them) and the core; the
 * leases tell it that a holder is gone through lm.kick (lm_entry_kick,
 * installed by lockmgr_init), never by name.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mem.h"

static bool req_attempt(struct lockreq *q);
static void req_give_up(struct lockreq *q);

/* ---- who may talk to Redis ---------------------------------------------- */

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
        const struct lockreq *w = lm_pos_of(p)->q;
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
        struct lockreq *q = lm_pos_of(p)->q;
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
    lm_entry_maybe_free(e);
}

/* ---- lock requests ------------------------------------------------------ */

static void req_free(struct lockreq *q)
{
    list_remove(&q->hlink);         /* a no-op unless held back */
    timer_stop(&q->timer);
    free(q);
}

/* Take q out of its entries and free it; the waiters after it get their
 * turn. */
void lm_req_drop(struct lockreq *q)
{
    struct lock_entry *es[CONF_MAX_MULTI];
    size_t n = q->n;

    for (size_t i = 0; i < n; i++) {
        es[i] = q->pos[i].e;
        lm_entry_remove(&q->pos[i]);
    }
    req_free(q);
    for (size_t i = 0; i < n; i++)
        lm_entry_kick(es[i]);
}

void lm_req_disown(struct lockreq *q)
{
    struct lockmgr_owner *o = q->o;

    list_remove(&q->olink);
    o->nwaits--;
    q->o = NULL;
    lm_owner_unref(o);     /* the request's reference */
}

/* Answer q with a refusal and drop it. */
static void req_fail(struct lockreq *q, const struct lockmgr_refusal *no)
{
    struct lockmgr_owner *o = q->o;

    if (o) {
        lm_notice_refused(N_LOCKED, o, o->gen, q->ask, NULL, no);
        lm_req_disown(q);
    }
    lm_req_drop(q);
}

void lm_req_refuse(struct lockreq *q, enum lockmgr_no why)
{
    const struct lockmgr_refusal no = { .why = why };

    req_fail(q, &no);
}

static void req_give_up(struct lockreq *q)
{
    struct lockmgr_refusal no = {
        .resource = q->pos[0].e->resource, .count = q->n,
        .limit = q->limit,
    };
    char why[512];

    if (q->cut) {
        lm.c.acquire_timeout++;
        no.why = LOCKMGR_NO_CUT;
    } else if (q->last == REDLOCK_UNAVAILABLE) {
        /* Say why when the nodes know (one recovering until when, one
         * down and why): "could not be reached" is wrong for nodes that
         * answer but may not vote yet. */
        size_t n = lm.rl->why_unavailable ? lm.rl->why_unavailable(why,
                                                                  sizeof(why))
                                         : 0;
        lm.c.acquire_unavailable++;
        no.why = LOCKMGR_NO_UNAVAILABLE;
        no.quorum = lm.rl->quorum();
        no.nodes = lm.rl->nnodes();
        no.detail = n ? why : NULL;
    } else if (q->deadline) {
        lm.c.acquire_timeout++;
        lm_observe_waited(q, false);
        no.why = LOCKMGR_NO_TIMEOUT;
    } else {
        lm.c.acquire_busy++;
        no.why = LOCKMGR_NO_BUSY;
    }
    req_fail(q, &no);
}

/* Seeded per process from the OS, so daemons do not share a sequence. */
static uint64_t rng_below(uint64_t n)
{
    lm.rng ^= lm.rng >> 12;
    lm.rng ^= lm.rng << 25;
    lm.rng ^= lm.rng >> 27;
    return n ? (lm.rng * 0x2545f4914f6cdd1dULL >> 11) % n : 0;
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
    uint64_t delay = jitter(lm.conf->locks.retry_ms);

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
        uint32_t s = (uint32_t)((lm.spread + q->visited++) % e->limit);
        if (!e->slots[s])
            return s;
    }
    return -1;
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
        const char *key = lm_req_key(q, i, &keylen);
        lm.rl->release(key, keylen, q->token, NULL, NULL);
    }
}

static void req_granted(struct lockreq *q, const struct redlock_result *res)
{
    struct lockmgr_owner *o = q->o;
    struct lease *first = NULL;
    struct notice *n = NULL;

    for (size_t i = 0; i < q->n; i++) {
        struct lease *l = lm_lease_create(q, i, res->fence, res->validity);
        if (!first) {
            first = l;
            n = lm_notice_new(N_LOCKED, o, o->gen, q->ask, l->resource);
            n->fence = l->fence;
            n->ttl = l->ttl;
            n->validity = lm_lease_validity(l);
            n->nres = q->n;
            n->mode = q->mode;
            n->limit = q->limit;
            n->slot = q->limit ? (uint32_t)q->slot : 0;
            memcpy(n->token, l->token, sizeof(n->token));
        } else {
            list_push_tail(&first->glink, &l->glink);
        }
        lm_lease_attach(l, o);
        lm_audit(l, o, "grant", l->renew ? "renewed while the session lives"
                                      : "renew=0");
        lm_changed(l->entry);
    }
    lm.c.acquire_ok++;
    lm_observe_waited(q, true);
    lm_req_disown(q);
    lm_req_drop(q);        /* the slot, if any, is the lease's now */
}

static bool req_try(struct lockreq *q);

static void attempt_done(void *ud, const struct redlock_result *res)
{
    struct lockreq *q = ud;
    struct lock_entry *e = q->pos[0].e;

    lm_enter();
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
        lm_req_drop(q);
    } else if (q->shutdown) {
        if (res->status == REDLOCK_OK) {
            req_give_back(q);
            if (q->limit)
                slot_give(e, q->slot);
        }
        lm_req_refuse(q, LOCKMGR_NO_SHUTDOWN);
    } else if (res->status == REDLOCK_OK) {
        req_granted(q, res);
    } else {
        int64_t pttl = res->status == REDLOCK_BUSY ? res->pttl : -1;
        if (q->limit && pttl >= 0 &&
            (q->pass_pttl < 0 || pttl < q->pass_pttl))
            q->pass_pttl = pttl;
        /* That slot is taken elsewhere: on to the next. */
        if (q->limit && res->status == REDLOCK_BUSY && req_try(q)) {
            lm_leave();
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
    lm_leave();
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
        keys[0] = lm_entry_slot_key(e, (uint32_t)slot, &lens[0]);
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
    if (lm.rl->token(q->token) != 0) {
        /* Answer from the timer, never from inside our caller: it may be
         * about to touch the entry this request's answer could free. */
        q->no_token = true;
        timer_start(&q->timer, 0);
        return true;
    }
    if (q->limit)
        lm_slot_take(q->pos[0].e, q->slot);
    q->attempting = true;
    lm.rl->acquire(&lk, q->token, q->ttl, attempt_done, q);
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
    lm_enter();
    if (q->no_token) {
        log_error("getrandom failed: cannot make a lock token");
        q->last = REDLOCK_UNAVAILABLE;
        lm_req_refuse(q, LOCKMGR_NO_RANDOM);
    } else if (timer_now() >= q->deadline) {
        req_give_up(q);
    } else if (req_may_start(q, true)) {
        if (q->woken)
            lm.c.wakeups_notified++;
        else
            lm.c.wakeups_retry++;
        if (!req_attempt(q))
            timer_start_at(&q->timer, q->deadline);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
    lm_leave();
}

/* A LOCK whose limit disagrees with what is held or waited for here:
 * the refusal in *no (its resource lives as long as the entry). */
static bool req_conflict(const struct lockmgr_req *r,
                         struct lockmgr_refusal *no)
{
    for (size_t i = 0; i < r->n; i++) {
        struct lock_entry *e = lm_entry_find(r->res[i], r->len[i]);
        if (!e || e->limit == r->limit)
            continue;
        *no = (struct lockmgr_refusal){
            .why = LOCKMGR_NO_KIND, .resource = e->resource,
            .here = e->limit, .limit = r->limit,
        };
        return true;
    }
    return false;
}

/* A new request q, queued on its entries: ask Redis now, wait its turn,
 * or answer BUSY or LIMIT. */
static void req_begin(struct lockreq *q)
{
    bool wait = q->deadline != 0;
    size_t crowded = 0;

    for (size_t i = 0; i < q->n; i++)
        if (q->pos[i].e->nwait > q->pos[crowded].e->nwait)
            crowded = i;
    size_t max_waiters = lm.conf->limits.max_waiters_per_resource;
    if (req_may_start(q, true)) {
        if (!req_attempt(q))    /* cannot be: a slot is free; as busy */
            timer_start_at(&q->timer, q->deadline);
    } else if (req_may_start(q, false)) {
        /* Only holders whose keys are being deleted right now (an UNLOCK
         * by another owner, or a lost lease being cleaned up) stand in the
         * way: that ends within a round trip, and release_done (through
         * lm.kick) kicks this request, so even a wait=0 LOCK waits for it
         * instead of seeing a stale BUSY. A wait=0 one gives up if that
         * takes more than two command timeouts. */
        if (!wait)
            timer_start(&q->timer,
                        2 * (uint64_t)lm.conf->redis.command_timeout_ms + 1);
        else
            timer_start_at(&q->timer, q->deadline);
    } else if (!wait && req_only_asked(q)) {
        /* Others are asking for it, nobody holds it here: their outcome
         * decides (lm_entry_kick), within two command timeouts. */
        timer_start(&q->timer,
                    2 * (uint64_t)lm.conf->redis.command_timeout_ms + 1);
    } else if (!wait) {
        /* Held here, or others wait first: first come, first served. */
        req_give_up(q);
    } else if (max_waiters && q->pos[crowded].e->nwait > max_waiters) {
        const struct lockmgr_refusal no = {
            .why = LOCKMGR_NO_WAITERS, .resource = q->pos[crowded].e->resource,
            .count = q->pos[crowded].e->nwait - 1,
        };
        req_fail(q, &no);
    } else {
        timer_start_at(&q->timer, q->deadline);
    }
}

void lockmgr_lock_req(struct lockmgr_owner *o, const struct lockmgr_req *r,
                      void *ask)
{
    struct lockmgr_refusal no;
    struct lockreq *q;

    lm_enter();
    if (req_conflict(r, &no)) {
        lm_notice_refused(N_LOCKED, o, o->gen, ask, NULL, &no);
        lm_leave();
        return;
    }
    size_t labellen = lm_label_put(o, r->limit, r->value, NULL);
    size_t valuelen = r->value ? strlen(r->value) + 1 : 0;
    q = mem_alloc(sizeof(*q) + r->n * sizeof(q->pos[0]) + labellen + 1 +
                  valuelen);
    q->n = r->n;
    list_init(&q->hlink);
    lm_label_put(o, r->limit, r->value, (char *)&q->pos[r->n]);
    q->label = (char *)&q->pos[r->n];
    q->labellen = labellen;
    if (r->value) {
        char *v = (char *)&q->pos[r->n] + labellen + 1;
        memcpy(v, r->value, valuelen);
        q->value = v;
    }
    q->o = o;
    q->ask = ask;
    lm_owner_ref(o);
    list_push_tail(&o->waits, &q->olink);
    o->nwaits++;
    q->mode = r->mode;
    q->limit = r->limit;
    q->slot = -1;
    q->hint = -1;
    q->ttl = r->ttl;
    q->renew = r->renew;
    q->last = REDLOCK_BUSY;
    q->asked_at = timer_now();
    q->deadline = r->wait ? q->asked_at + r->wait : 0;
    timer_init(&q->timer, req_timer_cb, q);
    for (size_t i = 0; i < r->n; i++) {
        q->pos[i].q = q;
        q->pos[i].e = lm_entry_get(r->res[i], r->len[i], r->limit);
        lm_entry_push(&q->pos[i]);
    }
    if (r->wait)
        lm.c.waits++;
    if (lm.starting) {
        /* Until then a wait that runs out is for lack of nodes. */
        q->last = REDLOCK_UNAVAILABLE;
        list_push_tail(&lm.held_back, &q->hlink);
        if (q->deadline)
            timer_start_at(&q->timer, q->deadline);
    } else {
        req_begin(q);
    }
    lm_leave();
}

/* Start-up is over: the LOCKs held back begin, in order. */
void lm_req_send_held(void)
{
    struct list *link;

    while ((link = list_first(&lm.held_back))) {
        struct lockreq *q = list_entry(link, struct lockreq, hlink);
        list_remove(link);
        q->last = REDLOCK_BUSY;
        req_begin(q);
    }
}

void lockmgr_lock(struct lockmgr_owner *o, const char *resource, size_t len,
                  uint32_t ttl, uint32_t wait, bool renew, void *ask)
{
    const char *res[] = { resource };
    size_t lens[] = { len };
    struct lockmgr_req r = {
        .n = 1, .res = res, .len = lens, .mode = LOCKMGR_EXCLUSIVE,
        .ttl = ttl, .wait = wait, .renew = renew,
    };
    lockmgr_lock_req(o, &r, ask);
}

/* ---- cut short, woken --------------------------------------------------- */

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
            req_give_up(q);
    }
    lm_leave();
}

/* A release of one of e's keys was announced: the waiters that may talk
 * to Redis now do so soon (slot: the semaphore slot released, or -1). */
static void entry_wake(struct lock_entry *e, int64_t slot)
{
    struct list *p;

    list_foreach(p, &e->waiters) {
        struct lockreq *q = lm_pos_of(p)->q;
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

    if (len < lm.prefixlen ||
        memcmp(key, lm.conf->locks.key_prefix, lm.prefixlen) != 0)
        return;
    /* A name may also be another's derived key: every reading wakes its
     * entry; a wake-up that finds the lock still taken costs one try. */
    if ((e = lm_entry_lookup(key, len)) && !e->limit)
        entry_wake(e, -1);
    if (len > lm.prefixlen + LOCKMGR_SHARED_SUFFIX_LEN &&
        memcmp(key + len - LOCKMGR_SHARED_SUFFIX_LEN, LOCKMGR_SHARED_SUFFIX,
               LOCKMGR_SHARED_SUFFIX_LEN) == 0 &&
        (e = lm_entry_lookup(key, len - LOCKMGR_SHARED_SUFFIX_LEN)) &&
        !e->limit)
        entry_wake(e, -1);
    if ((slot = key_slot(key, len, &base)) >= 0 && base > lm.prefixlen &&
        (e = lm_entry_lookup(key, base)) && e->limit)
        entry_wake(e, slot < (int64_t)e->limit ? slot : -1);
}
