/*
 * lockmgr, leases (lockmgr_priv.h): a grant's lease, its renewals, its
 * hard deadline and loss, its release (UNLOCK, or the end of its owner),
 * EXTEND, and an owner's lease on a resource (lockmgr_held). Above the
 * core only: when a holder's keys are gone the waiters get their turn
 * through lm.kick, not by naming the requests' file.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mem.h"

/* ---- leases ------------------------------------------------------------- */

static void lease_timer_cb(struct timer *t);
static void lease_deadline_cb(struct timer *t);
static void extend_start(struct extend_ctx *x);
static void extend_answer(struct extend_ctx *x, enum lockmgr_no *why,
                          int64_t validity);

static void lease_put(struct lease *l)
{
    if (l->gone && l->ops == 0) {
        timer_stop(&l->timer);
        timer_stop(&l->deadline);
        list_remove(&l->glink);
        free(l->value);
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
    uint64_t m = 2 * (uint64_t)lm.conf->redis.command_timeout_ms +
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
const char *lm_req_key(const struct lockreq *q, size_t i, size_t *keylen)
{
    const struct lock_entry *e = q->pos[i].e;

    if (q->limit)
        return lm_entry_slot_key(e, (uint32_t)q->slot, keylen);
    if (q->mode == LOCKMGR_SHARED) {
        *keylen = e->sharedlen;
        return e->shared;
    }
    *keylen = e->keylen;
    return e->key;
}

/* A lease on e's key (or slot, or set) `key`, renewals armed; the caller
 * attaches it to its owner. */
struct lease *lm_lease_new(struct lock_entry *e, const char *key,
                           size_t keylen, const struct lease_init *in)
{
    size_t len = e->keylen - lm.prefixlen;
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
    l->value = in->value ? mem_strdup(in->value) : NULL;
    l->acquired_at = timer_now();
    l->valid_until = l->acquired_at + (uint64_t)(in->validity > 0
                                                 ? in->validity : 0);
    timer_init(&l->timer, lease_timer_cb, l);
    timer_init(&l->deadline, lease_deadline_cb, l);
    lease_arm(l, true);
    return l;
}

/* The lease of q's grant on its i-th resource. */
struct lease *lm_lease_create(struct lockreq *q, size_t i, uint64_t fence,
                              int64_t validity)
{
    size_t keylen;
    const char *key = lm_req_key(q, i, &keylen);
    const struct lease_init in = {
        .mode = q->mode, .limit = q->limit, .slot = q->slot,
        .token = q->token, .fence = fence, .ttl = q->ttl, .renew = q->renew,
        .validity = validity, .value = q->value,
    };

    return lm_lease_new(q->pos[i].e, key, keylen, &in);
}

void lm_lease_attach(struct lease *l, struct lockmgr_owner *o)
{
    struct lock_entry *e = l->entry;

    l->owner = o;
    list_push_tail(&o->leases, &l->olink);
    o->nleases++;
    list_push_tail(&e->holders, &l->elink);
    e->nheld++;
    if (l->mode == LOCKMGR_EXCLUSIVE && !l->limit)
        e->nexcl++;
    lm.held++;
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
    lm.held--;
    lm_observe_held(l);
    if (e) {
        e->ngone++;
        if (l->mode == LOCKMGR_EXCLUSIVE && !l->limit)
            e->ngone_excl++;
        if (l->limit)
            e->ngone_slots++;
    }
    if (x) {
        l->queued = NULL;
        extend_answer(x, &(enum lockmgr_no){ LOCKMGR_NO_GONE }, 0);
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
    struct lockreq *head = lm_entry_head(e);
    if (head && !head->attempting)
        lm.c.wakeups_notified++;
    lm_changed(e);
    lm.kick(e);     /* lm_entry_kick: the waiters' turn */
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

void lm_lease_release(struct lease *l, uint32_t delay_ms,
                      struct unlock_ctx *u, const char *why)
{
    struct release_ctx *x = mem_alloc(sizeof(*x));

    lm_audit(l, l->owner, "release", why);
    lease_end(l);
    lm.c.releases++;
    x->l = l;
    x->u = u;
    l->ops++;
    /* With no UNLOCK waiting for it, it can go with others. */
    if (delay_ms > 0)
        (u ? lm.rl->extend : lm.rl->extend_batched)(l->key, l->keylen,
                                                  l->token, delay_ms,
                                                  release_done, x);
    else
        (u ? lm.rl->release : lm.rl->release_batched)(l->key, l->keylen,
                                                    l->token, release_done,
                                                    x);
}

static void unlock_step(struct unlock_ctx *u, const struct redlock_result *res)
{
    if (res->deleted < u->nodes)
        u->nodes = res->deleted;
    /* So many nodes had no key of ours that no quorum can have held it:
     * the lock had been lost before this UNLOCK. */
    if (res->busy > lm.rl->nnodes() - lm.rl->quorum())
        u->lost = true;
    if (--u->left > 0)
        return;
    static const struct lockmgr_refusal gone = { .why = LOCKMGR_NO_GONE };
    struct notice *n = lm_notice_refused(N_UNLOCKED, u->o, u->gen, u->ask,
                                         u->resource, u->lost ? &gone : NULL);
    n->nodes = u->nodes;
    n->nres = u->n;
    lm_owner_unref(u->o);
    free(u);
}

static void release_done(void *ud, const struct redlock_result *res)
{
    struct release_ctx *x = ud;
    struct lease *l = x->l;
    struct lock_entry *e = l->entry;

    lm_enter();
    if (x->u)
        unlock_step(x->u, res);
    free(x);
    l->entry = NULL;
    l->ops--;
    entry_drop_holder(e, l);
    lease_put(l);
    lm_leave();
}

/* The lease stops being held here and its keys are left on the nodes to
 * expire by their ttl: nothing is released or announced. */
void lm_lease_leave_keys(struct lease *l)
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
void lm_lease_lose(struct lease *l, enum lockmgr_lost_reason why)
{
    static const char *const what[] = {
        [LOST_EXPIRED] = "its validity ran out (renew=0)",
        [LOST_QUORUM] = ("no quorum renewed it in time; its keys expire "
                         "by their ttl"),
        [LOST_NODE] = "the nodes no longer hold its key",
    };

    lm.c.leases_lost++;
    if (l->owner) {
        struct notice *n = lm_notice_new(N_LOST, l->owner, l->owner->gen,
                                         NULL, l->resource);
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
        lm_lease_release(l, 0, NULL, "removing what is left of a lost lease");
        return;
    }
    lm_lease_leave_keys(l);
}

/* A renewal retry is worth sending only if its answer (command timeout,
 * plus the grace a late loop gets) can come before the hard deadline. */
static bool lease_can_retry(const struct lease *l, uint64_t at)
{
    return at + 2 * (uint64_t)lm.conf->redis.command_timeout_ms <=
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

    lm_enter();
    l->ops--;
    if (l->gone) {
        lease_put(l);       /* lost meanwhile: the answer is too late */
        lm_leave();
        return;
    }
    if (res->status == REDLOCK_OK) {
        l->valid_until = now + (uint64_t)(res->validity > 0 ? res->validity
                                                             : 0);
        l->renewals++;
        lm.c.renewals++;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        lm.c.renewal_failures++;
        lm_lease_lose(l, LOST_NODE);
    } else {
        /* Not enough nodes answered: try again soon, while a retry can
         * still finish before the deadline; the deadline decides. */
        uint64_t retry = l->ttl / 10;
        if (retry < 20)
            retry = 20;
        if (retry > 1000)
            retry = 1000;
        lm.c.renewal_failures++;
        lease_cap(l, now + (uint64_t)(res->validity > 0 ? res->validity : 0));
        if (lease_can_retry(l, now + retry)) {
            log_info("renewal of %s reached %d nodes; retrying in %" PRIu64
                     " ms (%" PRIu64 " ms of validity left)", l->resource,
                     res->ok, retry, l->valid_until - now);
            timer_start(&l->timer, retry);
        }
    }
    lease_next_op(l);
    lm_leave();
}

static void renew_start(struct lease *l)
{
    l->renew_due = false;
    l->extending = true;
    l->ops++;
    lm.rl->extend_batched(l->key, l->keylen, l->token, l->ttl, renew_done, l);
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
    lm_enter();
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
    lm_leave();
}

static void lease_deadline_cb(struct timer *t)
{
    struct lease *l = t->data;

    if (l->gone)
        return;
    lm_enter();
    lm_lease_lose(l, l->renew ? LOST_QUORUM : LOST_EXPIRED);
    lm_leave();
}

void lockmgr_unlock_many(struct lockmgr_owner *o, struct lease *const *l,
                         size_t n, void *ask)
{
    size_t len = strlen(l[0]->resource);
    struct unlock_ctx *u = mem_alloc(sizeof(*u) + len + 1);

    lm_enter();
    u->o = o;
    u->ask = ask;
    u->gen = o->gen;
    lm_owner_ref(o);
    u->n = u->left = n;
    u->nodes = lm.rl->nnodes();
    memcpy(u->resource, l[0]->resource, len + 1);
    for (size_t i = 0; i < n; i++)
        lm_lease_release(l[i], 0, u, "UNLOCK");
    lm_leave();
}

void lockmgr_unlock(struct lockmgr_owner *o, struct lease *l, void *ask)
{
    lockmgr_unlock_many(o, &l, 1, ask);
}

/* why: NULL for OK, else GONE or UNAVAILABLE. */
static void extend_answer(struct extend_ctx *x, enum lockmgr_no *why,
                          int64_t validity)
{
    struct lease *l = x->l;
    const struct lockmgr_refusal no = {
        .why = why ? *why : LOCKMGR_NO_GONE, .resource = l->resource,
        .quorum = lm.rl->quorum(), .nodes = lm.rl->nnodes(),
    };
    struct notice *n = lm_notice_refused(N_EXTENDED, x->o, x->gen, x->ask,
                                         l->resource, why ? &no : NULL);

    n->ttl = l->ttl;
    n->validity = validity;
    lm_owner_unref(x->o);
    free(x->value);
    free(x);
    l->ops--;
}

static void extend_done(void *ud, const struct redlock_result *res)
{
    struct extend_ctx *x = ud;
    struct lease *l = x->l;
    uint64_t now = timer_now();
    int64_t validity = res->validity > 0 ? res->validity : 0;
    enum lockmgr_no no, *why = NULL;

    lm_enter();
    lm.c.extends++;
    if (l->gone) {
        no = LOCKMGR_NO_GONE;
        why = &no;
    } else if (res->status == REDLOCK_OK) {
        l->ttl = x->ttl;
        if (x->value) {
            free(l->value);
            l->value = x->value;
            x->value = NULL;
            lm_changed(l->entry);
        }
        l->valid_until = now + (uint64_t)validity;
        lease_arm(l, true);
    } else if (res->status == REDLOCK_LOST) {
        no = LOCKMGR_NO_GONE;
        why = &no;
        lm.c.leases_lost++;
        lm_lease_release(l, 0, NULL, "EXTEND found it lost");
    } else {
        /* Some nodes may have taken the new ttl: if it was shorter, the
         * lease now ends with it. */
        no = LOCKMGR_NO_UNAVAILABLE;
        why = &no;
        lease_cap(l, now + (uint64_t)validity);
        if (!l->gone && lease_deadline(l) <= now)
            lm_lease_lose(l, LOST_QUORUM);
    }
    extend_answer(x, why, res->validity);
    lease_next_op(l);
    lease_put(l);
    lm_leave();
}

static void extend_start(struct extend_ctx *x)
{
    struct lease *l = x->l;
    size_t labellen;
    char *label;

    l->extending = true;
    if (!x->value) {
        lm.rl->extend(l->key, l->keylen, l->token, x->ttl, extend_done, x);
        return;
    }
    labellen = lm_label_put(x->o, 0, x->value, NULL);
    label = mem_alloc(labellen + 1);
    lm_label_put(x->o, 0, x->value, label);
    lm.rl->relabel(l->key, l->keylen, l->token, x->ttl, label, labellen,
                   extend_done, x);
    free(label);
}

void lockmgr_extend(struct lockmgr_owner *o, struct lease *l, uint32_t ttl,
                    void *ask)
{
    lockmgr_extend_value(o, l, ttl, NULL, ask);
}

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

const char *lockmgr_lease_value(const struct lease *l)
{
    return l->value;
}

void lockmgr_lease_kind(const struct lease *l, enum lockmgr_mode *mode,
                        uint32_t *limit)
{
    *mode = l->mode;
    *limit = l->limit;
}

void lockmgr_extend_value(struct lockmgr_owner *o, struct lease *l,
                          uint32_t ttl, const char *value, void *ask)
{
    struct extend_ctx *x = mem_alloc(sizeof(*x));

    lm_enter();
    x->l = l;
    x->o = o;
    x->ask = ask;
    x->gen = o->gen;
    x->ttl = ttl ? ttl : l->ttl;
    x->value = value ? mem_strdup(value) : NULL;
    lm_owner_ref(o);
    l->ops++;
    if (l->extending)
        l->queued = x;      /* after the renewal in flight */
    else
        extend_start(x);
    lm_leave();
}
