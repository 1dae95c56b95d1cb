/*
 * lockmgr, ADOPT (lockmgr_priv.h): a lease taken over by its token on
 * this daemon; why a rotated key is never given back is in
 * docs/design.md ("A withdrawn ADOPT never frees the lease").
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mem.h"

/* ---- ADOPT --------------------------------------------------------------- */

struct adopt_ctx {
    struct lockmgr_owner *o;        /* (ref) */
    struct list hlink;              /* in lm.adopts_held (start-up) */
    void *ask;
    unsigned gen;                   /* o->gen when asked */
    uint32_t ttl;
    bool renew;
    char old[REDLOCK_TOKEN_LEN + 1];
    char token[REDLOCK_TOKEN_LEN + 1];
    size_t n;
    struct lock_entry *e[];         /* pinned while the round runs */
};

static void adopt_refused(struct lockmgr_owner *o, unsigned gen, void *ask,
                          const struct lockmgr_refusal *no)
{
    lm_notice_refused(N_LOCKED, o, gen, ask, NULL, no);
}

/* A lease here that still has the old token (another session's, or a
 * detached one's): its keys are the adopter's now. */
static void adopt_drop_old(struct lock_entry *e, const char *old)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &e->holders) {
        struct lease *l = list_entry(p, struct lease, elink);
        if (!l->gone && strcmp(l->token, old) == 0)
            lm_lease_lose(l, LOST_NODE);
    }
}


/* Can e take the lease one resource's ADOPT found (its kind is known only
 * from the nodes' answers)? A semaphore here of another size, or a
 * semaphore found where this daemon locks the resource otherwise (or the
 * other way round), cannot: *no says why. */
static bool adopt_fits(struct lock_entry *e, const struct redlock_result *res,
                       struct lockmgr_refusal *no)
{
    uint32_t limit = res->adopted_limit;

    *no = (struct lockmgr_refusal){
        .why = LOCKMGR_NO_KIND, .resource = e->resource, .here = e->limit,
    };
    if (res->adopted != REDLOCK_HELD_SLOT)
        return !e->limit;
    if (!limit)
        limit = e->limit;       /* stored by a daemon that did not say */
    no->limit = limit;
    if (limit > lm.conf->locks.max_limit) {
        no->why = LOCKMGR_NO_TOO_LARGE;
        no->count = lm.conf->locks.max_limit;
        return false;
    }
    if (!limit || res->adopted_slot >= limit) {
        no->why = LOCKMGR_NO_NO_SIZE;
        no->slot = res->adopted_slot;
        return false;
    }
    if (e->limit == limit)
        return true;
    if (e->limit || e->nheld || e->nwait)
        return false;
    e->limit = limit;           /* the entry was made by this ADOPT */
    e->slots = mem_alloc(limit);
    return true;
}

/* The keys of a multi-resource grant are exclusive locks: none of them may
 * have become a semaphore here meanwhile (another ADOPT of one of them,
 * which found a slot). */
static bool adopt_fits_multi(const struct adopt_ctx *x,
                             struct lockmgr_refusal *no)
{
    for (size_t i = 0; i < x->n; i++) {
        if (x->e[i]->limit) {
            *no = (struct lockmgr_refusal){
                .why = LOCKMGR_NO_MULTI_KIND, .resource = x->e[i]->resource,
                .here = x->e[i]->limit,
            };
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
        return lm_entry_slot_key(e, res->adopted_slot, keylen);
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
        .validity = res->validity, .value = res->adopted_value,
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
         * lm_lease_new copies it. */
        const char *key = adopt_key(x, res, i, &keylen);
        struct lease *l = lm_lease_new(e, key, keylen, &in);
        if (in.limit)
            lm_slot_take(e, in.slot);
        if (!first) {
            struct notice *n = lm_notice_new(N_LOCKED, o, x->gen, x->ask,
                                             l->resource);
            first = l;
            n->fence = l->fence;
            n->ttl = l->ttl;
            n->validity = lm_lease_validity(l);
            n->nres = x->n;
            n->mode = in.mode;
            n->limit = in.limit;
            n->slot = in.limit ? (uint32_t)in.slot : 0;
            memcpy(n->token, l->token, sizeof(n->token));
        } else {
            list_push_tail(&first->glink, &l->glink);
        }
        lm_lease_attach(l, o);
        lm_audit(l, o, "adopt", "token rotated on a quorum");
        lm_changed(e);
    }
    lm.c.adopts++;
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
    lm.c.adopts_left++;
    log_notice("ADOPT of %s%s: token rotated on a quorum, but %s: its keys "
               "are left to expire in %" PRIu32 " ms", x->e[0]->resource,
               x->n > 1 ? " (and the rest of its grant)" : "", why, x->ttl);
}

static void adopt_done(void *ud, const struct redlock_result *res)
{
    struct adopt_ctx *x = ud;
    struct lockmgr_owner *o = x->o;
    struct lockmgr_refusal no = { .why = LOCKMGR_NO_GONE };
    char why[512];

    lm_enter();
    if (res->status == REDLOCK_OK && o->ended) {
        adopt_leave(x, "its session has ended");
    } else if (res->status == REDLOCK_OK &&
               (x->n > 1 ? adopt_fits_multi(x, &no)
                         : adopt_fits(x->e[0], res, &no))) {
        /* Also when the connection that asked has left the session
         * (detached, or taken over by a resume): the lease is the
         * session's, and only the answer goes nowhere (x->gen). */
        adopt_grant(x, res);
    } else if (res->status == REDLOCK_OK) {
        /* Ours on the nodes, but not a lease this daemon can keep beside
         * what it holds: the client hears why (its lease is gone). */
        adopt_leave(x, "it cannot be held here");
        adopt_refused(o, x->gen, x->ask, &no);
    } else if (res->status == REDLOCK_BUSY) {
        adopt_refused(o, x->gen, x->ask, &no);
    } else {
        size_t k = lm.rl->why_unavailable ? lm.rl->why_unavailable(why,
                                                                  sizeof(why))
                                         : 0;
        no = (struct lockmgr_refusal){
            .why = LOCKMGR_NO_UNAVAILABLE, .quorum = lm.rl->quorum(),
            .nodes = lm.rl->nnodes(), .detail = k ? why : NULL,
        };
        adopt_refused(o, x->gen, x->ask, &no);
    }
    for (size_t i = 0; i < x->n; i++) {
        x->e[i]->pins--;
        lm_entry_maybe_free(x->e[i]);
    }
    lm_owner_unref(o);
    free(x);
    lm_leave();
}

/* Why this ADOPT cannot start, in *no (answered by the caller): true
 * when it cannot. */
static bool adopt_refuse(const struct lockmgr_owner *o,
                         const struct lockmgr_adopt_req *r,
                         struct lockmgr_refusal *no)
{
    if (o->nleases + r->n > lm.conf->limits.max_locks_per_session) {
        *no = (struct lockmgr_refusal){
            .why = LOCKMGR_NO_LOCKS,
            .count = lm.conf->limits.max_locks_per_session,
        };
        return true;
    }
    for (size_t i = 0; i < r->n; i++) {
        const struct lock_entry *e = lm_entry_find(r->res[i], r->len[i]);
        const struct lease *l = lockmgr_held(o, r->res[i], r->len[i]);
        if (l) {
            *no = (struct lockmgr_refusal){
                .why = LOCKMGR_NO_HELD, .resource = l->resource,
            };
            return true;
        }
        if (r->n > 1 && e && e->limit) {
            *no = (struct lockmgr_refusal){
                .why = LOCKMGR_NO_MULTI_KIND, .resource = e->resource,
                .here = e->limit,
            };
            return true;
        }
    }
    return false;
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
        lm_probe_make(x->e[0]->resource, x->e[0]->keylen - lm.prefixlen,
                   lm.conf->locks.max_limit, &one, &names);
    /* Without a value: the scripts carry the holder's over from the old
     * label (lua/lib/value_of.lua). */
    size_t labellen = lm_label_put(x->o, 0, NULL, NULL);
    char *label = mem_alloc(labellen + 1);
    lm_label_put(x->o, 0, NULL, label);
    const struct redlock_adopt a = {
        .n = x->n > 1 ? (int)x->n : 0, .one = x->n == 1 ? &one : NULL,
        .keys = keys, .lens = lens, .old_token = x->old, .token = x->token,
        .label = label, .labellen = labellen, .ttl = x->ttl,
    };
    lm.rl->adopt(&a, adopt_done, x);
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
        lm_entry_maybe_free(x->e[i]);
    }
    lm_owner_unref(x->o);
    free(x);
}

/* o's ADOPTs held back at start-up given up (refused SHUTDOWN when the
 * daemon stops; else their owner left). */
void lm_adopt_unhold(struct lockmgr_owner *o, bool shutdown)
{
    static const struct lockmgr_refusal no = { .why = LOCKMGR_NO_SHUTDOWN };
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &lm.adopts_held) {
        struct adopt_ctx *x = list_entry(p, struct adopt_ctx, hlink);
        if (x->o != o)
            continue;
        if (shutdown)
            adopt_refused(o, x->gen, x->ask, &no);
        adopt_drop(x);
    }
}

/* Start-up is over: the ADOPTs held back go out, in order. */
void lm_adopt_send_held(void)
{
    struct list *link;

    while ((link = list_first(&lm.adopts_held))) {
        struct adopt_ctx *x = list_entry(link, struct adopt_ctx, hlink);
        list_remove(link);
        adopt_send(x);
    }
}

void lockmgr_adopt(struct lockmgr_owner *o, const struct lockmgr_adopt_req *r,
                   void *ask)
{
    struct lockmgr_refusal no;
    struct adopt_ctx *x;

    lm_enter();
    if (adopt_refuse(o, r, &no)) {
        adopt_refused(o, o->gen, ask, &no);
        lm_leave();
        return;
    }
    x = mem_alloc(sizeof(*x) + r->n * sizeof(x->e[0]));
    if (lm.rl->token(x->token) != 0) {
        free(x);
        no = (struct lockmgr_refusal){ .why = LOCKMGR_NO_RANDOM };
        adopt_refused(o, o->gen, ask, &no);
        lm_leave();
        return;
    }
    x->o = o;
    x->ask = ask;
    x->gen = o->gen;
    lm_owner_ref(o);
    list_init(&x->hlink);
    x->ttl = r->ttl;
    x->renew = r->renew;
    snprintf(x->old, sizeof(x->old), "%s", r->token);
    x->n = r->n;
    for (size_t i = 0; i < r->n; i++) {
        x->e[i] = lm_entry_get(r->res[i], r->len[i], 0);
        x->e[i]->pins++;
    }
    /* As a LOCK is: until the nodes are checked, an answer could only be
     * UNAVAILABLE (and the client would have to try again). */
    if (lm.starting)
        list_push_tail(&lm.adopts_held, &x->hlink);
    else
        adopt_send(x);
    lm_leave();
}
