/*
 * lockmgr, what operators and STATUS see (lockmgr_priv.h): FORCEUNLOCK,
 * STATUS (the pure plan and the round), the lease views of LOCKS and
 * SESSIONS, and TOP.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "label.h"
#include "log.h"
#include "mem.h"

/* ---- FORCEUNLOCK --------------------------------------------------------- */

/* FORCEUNLOCK's and STATUS's context: who asked, about what. */
struct owner_ask {
    struct lockmgr_owner *o;    /* (ref) */
    void *ask;                  /* o's */
    unsigned gen;               /* o->gen when asked */
    size_t len;
    char resource[];
};

static struct owner_ask *owner_ask_new(struct lockmgr_owner *o, void *ask,
                                       const char *resource, size_t len)
{
    struct owner_ask *x = mem_alloc(sizeof(*x) + len + 1);

    x->o = o;
    x->gen = o->gen;
    x->ask = ask;
    lm_owner_ref(o);
    x->len = len;
    memcpy(x->resource, resource, len);
    x->resource[len] = '\0';
    return x;
}

static void force_done(void *ud, const struct redlock_result *res)
{
    struct owner_ask *x = ud;
    struct notice *n;

    lm_enter();
    log_notice("forced release of %s by %s (name=%s peer=%s): deleted on "
               "%d of %d nodes", x->resource, x->o->id,
               x->o->name[0] ? x->o->name : "-", x->o->peer ? x->o->peer
               : "-", res->deleted, lm.rl->nnodes());
    n = lm_notice_new(N_UNLOCKED, x->o, x->gen, x->ask, x->resource);
    n->nodes = res->deleted;
    lm_owner_unref(x->o);
    free(x);
    lm_leave();
}

/* The holders here of a resource being forced: told before the first
 * node deletes (their notices go out at lm_leave(), before any node can
 * answer), so none of them works on while a waiter elsewhere is granted
 * on the nodes that answered first. One elsewhere learns it at its next
 * renewal. */
static void force_lose_local(const char *resource, size_t len)
{
    struct lock_entry *e = lm_entry_find(resource, len);
    struct list *p, *tmp;

    if (!e)
        return;
    e->pins++;
    list_foreach_safe(p, tmp, &e->holders) {
        struct lease *l = list_entry(p, struct lease, elink);
        if (!l->gone)
            lm_lease_lose(l, LOST_NODE);
    }
    e->pins--;
    lm_entry_maybe_free(e);
}

void lockmgr_force_release(struct lockmgr_owner *o, const char *resource,
                           size_t len, void *ask)
{
    struct owner_ask *x;
    struct redlock_probe pr;
    char *buf;

    lm_enter();
    force_lose_local(resource, len);
    x = owner_ask_new(o, ask, resource, len);
    /* Slots too: as many as a semaphore here has, else as many as one
     * may have. */
    lm_probe_make(resource, len, 0, &pr, &buf);
    if (!pr.limit)
        pr.limit = lm.conf->locks.max_limit;
    lm.rl->force_release(&pr, force_done, x);
    free(buf);
    lm_leave();
}

/* ---- inspection --------------------------------------------------------- */

void lockmgr_owner_leases(const struct lockmgr_owner *o,
                          lockmgr_lease_fn *fn, void *ud)
{
    uint64_t now = timer_now();
    const struct list *link;

    list_foreach(link, &o->leases) {
        const struct lease *l = list_entry(link, const struct lease, olink);
        const struct lockmgr_lease_view v = {
            .resource = l->resource, .token = l->token, .fence = l->fence,
            .ttl = l->ttl, .validity = lm_lease_validity(l),
            .held_ms = now - l->acquired_at, .renew = l->renew,
            .renewals = l->renewals, .mode = l->mode, .limit = l->limit,
            .slot = l->limit ? l->slot : -1, .value = l->value,
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
        .validity = lm_lease_validity(l), .mode = l->mode,
        .slot = l->limit ? l->slot : -1, .value = l->value,
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

/* The first LOCKMGR_STATUS_WAITERS LOCKs waiting for e, in queue order
 * (a withdrawn one, which only finishes its round, is nobody's). */
static size_t status_waiters(const struct lock_entry *e,
                             struct lockmgr_waiter_view *w)
{
    uint64_t now = timer_now();
    const struct list *p;
    size_t n = 0;

    if (!e)
        return 0;
    list_foreach(p, &e->waiters) {
        const struct lockreq *q = list_entry(p, struct req_pos, link)->q;
        if (!q->o)
            continue;
        if (n == LOCKMGR_STATUS_WAITERS)
            break;
        w[n++] = (struct lockmgr_waiter_view){
            .session = q->o->id, .name = q->o->name,
            .waited_ms = now - q->asked_at, .mode = q->mode,
            .limit = q->limit, .nresources = q->n,
        };
    }
    return n;
}

/* How many voting nodes hold token with a label and this fence. */
static int fence_count(const struct redlock_node_view *v, int n,
                       const char *token, uint64_t fence)
{
    int k = 0;

    for (int i = 0; i < n; i++)
        k += v[i].voting && v[i].token && v[i].label &&
             strcmp(v[i].token, token) == 0 && v[i].fence == fence;
    return k;
}

/* The node whose value names the exclusive key's holder when a quorum of
 * voting nodes holds one token, or -1 (then p->remote_token says whether
 * a quorum holds some token all the same: a foreign Redlock client's).
 * Its fence is the one a quorum of them stores: the grant's (a node that
 * answered after the quorum may keep a larger one of its own counter
 * until the grant's set_fence reaches it). While no fence has a quorum
 * (the grant's raise round under way), the highest, and
 * p->remote_fence_agreed is false. */
static void plan_remote(const struct redlock_node_view *v, int n, int quorum,
                        struct lockmgr_status_plan *p)
{
    p->remote = -1;
    p->remote_token = false;
    p->remote_fence_agreed = false;
    for (int i = 0; i < n; i++) {
        if (!v[i].token)
            continue;
        int k = 0, with = -1, agree = 0;
        uint64_t fence = 0;
        for (int j = 0; j < n; j++) {
            if (!v[j].voting || !v[j].token ||
                strcmp(v[j].token, v[i].token) != 0)
                continue;
            k++;
            if (!v[j].label)
                continue;
            int same = fence_count(v, n, v[i].token, v[j].fence);
            if (with < 0 || same > agree ||
                (same == agree && v[j].fence > fence))
                with = j, fence = v[j].fence, agree = same;
        }
        if (k < quorum)
            continue;
        p->remote_token = true;
        p->remote = with;
        p->remote_fence = fence;
        p->remote_fence_agreed = with >= 0 && agree >= quorum;
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

/* What the nodes answered about resource (limit slots looked at), with
 * what this daemon holds of it, handed to fn at once, not as a notice (the
 * views live only during this call); lm_leave() has delivered what was
 * queued before it. */
static void status_report(const char *resource, size_t len, uint32_t limit,
                          const struct redlock_node_view *v, int n,
                          lockmgr_peek_fn *fn, void *ud)
{
    struct lockmgr_holder_view holders[LOCKMGR_STATUS_HOLDERS];
    struct lockmgr_waiter_view waiting[LOCKMGR_STATUS_WAITERS];
    struct lockmgr_status_plan plan;
    struct lock_entry *e;
    size_t nheld, nshared, nexcl, nwaiting, keylen;

    lm_enter();
    e = lm_entry_find(resource, len);
    nheld = status_holders(e, holders, &nshared, &nexcl);
    nwaiting = status_waiters(e, waiting);
    lockmgr_status_plan(v, n, lm.rl->quorum(), limit, nexcl, nshared,
                        nheld > 0, &plan);
    const char *k = lm_entry_key(resource, len, &keylen);
    char *key = mem_alloc(keylen + 1);
    memcpy(key, k, keylen);
    key[keylen] = '\0';
    const struct lockmgr_status st = {
        .resource = resource, .key = key, .daemon = lm.conf->id,
        .plan = &plan, .holders = holders, .nholders = nheld,
        .holders_here = e ? e->nheld - e->ngone : 0,
        .waiters = e ? e->nwait : 0, .waiting = waiting,
        .nwaiting = nwaiting, .limit = limit, .nodes = v, .nnodes = n,
    };
    lm_leave();
    fn(ud, &st);
    free(key);
}

/* STATUS's answer, to its owner if it is still the one that asked. */
static void status_answer(void *ud, const struct lockmgr_status *st)
{
    struct owner_ask *x = ud;
    struct lockmgr_owner *o = x->o;

    if (!o->ended && x->gen == o->gen)
        o->ops->status(o, x->ask, st);
    lm_owner_unref(o);
    free(x);
}

/* A look at one resource, until its rounds are back. */
struct peek {
    lockmgr_peek_fn *fn;
    void *ud;
    uint32_t limit;             /* the slots looked at */
    bool discover;              /* they are LOCKMGR_SLOT_PROBE, to find a
                                   semaphore nobody here knows */
    size_t len;
    char resource[];
};

/* The size of the semaphore whose slot key a node has, as the slot's label
 * says ("limit"), or 0 when none was found. */
static uint32_t slot_label_limit(const struct redlock_node_view *v, int n)
{
    for (int i = 0; i < n; i++) {
        json_t *h = label_holder(v[i].slot_label);
        json_int_t k = json_integer_value(json_object_get(h, "limit"));

        json_decref(h);
        if (k > 0 && k <= (json_int_t)CONF_MAX_LIMIT)
            return (uint32_t)k;
    }
    return 0;
}

static void peek_done(void *ud, const struct redlock_node_view *v, int n);

/* One INSPECT round for p: the slots asked for, else those this daemon
 * knows, else the first LOCKMGR_SLOT_PROBE (a semaphore held only through
 * other daemons: slots are taken lowest first, and a slot's label names
 * its size). */
static void peek_send(struct peek *p)
{
    struct redlock_probe pr;
    char *buf;

    lm_probe_make(p->resource, p->len, p->limit, &pr, &buf);
    if (!pr.limit) {
        pr.limit = LOCKMGR_SLOT_PROBE;
        p->discover = true;
    }
    p->limit = pr.limit;
    lm.rl->inspect(&pr, peek_done, p);
    free(buf);
}

static void peek_done(void *ud, const struct redlock_node_view *v, int n)
{
    struct peek *p = ud;

    if (p->discover) {
        uint32_t k = slot_label_limit(v, n);

        p->discover = false;
        if (k && k != p->limit) {
            /* A semaphore of another size: look at its slots. */
            p->limit = k;
            lm_enter();
            peek_send(p);
            lm_leave();
            return;
        }
        p->limit = k;
    }
    status_report(p->resource, p->len, p->limit, v, n, p->fn, p->ud);
    free(p);
}

void lockmgr_peek(const char *resource, size_t len, uint32_t limit,
                  lockmgr_peek_fn *fn, void *ud)
{
    struct peek *p = mem_alloc(sizeof(*p) + len + 1);

    lm_enter();
    p->fn = fn;
    p->ud = ud;
    p->limit = limit;
    p->len = len;
    memcpy(p->resource, resource, len);
    peek_send(p);
    lm_leave();
}

void lockmgr_status(struct lockmgr_owner *o, const char *resource,
                    size_t len, uint32_t limit, void *ask)
{
    lm_enter();
    lockmgr_peek(resource, len, limit, status_answer,
                 owner_ask_new(o, ask, resource, len));
    lm_leave();
}

/* ---- TOP ------------------------------------------------------------------ */

/* e's holders and waiters here, or false when it has none left. */
static bool top_view(const struct lock_entry *e, uint64_t now,
                     struct lockmgr_top_view *t)
{
    const struct list *p;

    *t = (struct lockmgr_top_view){
        .resource = e->resource, .limit = e->limit,
    };
    list_foreach(p, &e->holders) {
        const struct lease *l = list_entry(p, const struct lease, elink);
        uint64_t held = now - l->acquired_at;
        if (l->gone || !l->owner)
            continue;
        if (!t->holders++ || held > t->held_ms) {
            t->session = l->owner->id;
            t->name = l->owner->name;
            t->held_ms = held;
            t->mode = l->mode;
        }
    }
    list_foreach(p, &e->waiters) {
        const struct lockreq *q = list_entry(p, struct req_pos, link)->q;
        uint64_t waited = now - q->asked_at;
        if (!q->o)
            continue;
        if (!t->waiters++ || waited > t->waited_ms) {
            t->waited_ms = waited;
            if (!t->holders)
                t->mode = q->mode;
        }
    }
    return t->holders || t->waiters;
}

/* Does a come before b in TOP: a longer wait, a longer hold, the name? */
static bool top_before(const struct lockmgr_top_view *a,
                       const struct lockmgr_top_view *b)
{
    if (a->waited_ms != b->waited_ms)
        return a->waited_ms > b->waited_ms;
    if (a->held_ms != b->held_ms)
        return a->held_ms > b->held_ms;
    return strcmp(a->resource, b->resource) < 0;
}

static int top_cmp(const void *x, const void *y)
{
    return top_before(x, y) ? -1 : top_before(y, x) ? 1 : 0;
}

/* h[0..n) is a heap with the one that comes last at the top: put t in
 * it, instead of that one when full (n == max). */
static void top_heap_put(struct lockmgr_top_view *h, size_t *n, size_t max,
                         const struct lockmgr_top_view *t)
{
    size_t i;

    if (*n < max) {
        for (i = (*n)++; i > 0 && top_before(&h[(i - 1) / 2], t);
             i = (i - 1) / 2)
            h[i] = h[(i - 1) / 2];
        h[i] = *t;
        return;
    }
    if (!max || !top_before(t, &h[0]))
        return;
    for (i = 0;;) {
        size_t c = 2 * i + 1;
        if (c >= max)
            break;
        if (c + 1 < max && top_before(&h[c], &h[c + 1]))
            c++;
        if (!top_before(t, &h[c]))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = *t;
}

size_t lockmgr_top(struct lockmgr_top_view *out, size_t max, size_t *n,
                   lockmgr_visible_fn *visible, void *ud)
{
    uint64_t now = timer_now();
    struct lockmgr_top_view t;
    struct hmap_iter it;
    struct hmap_node *node;
    size_t total = 0;

    *n = 0;
    hmap_iter_init(&it, &lm.table);
    while ((node = hmap_iter_next(&it))) {
        const struct lock_entry *e = container_of(node, struct lock_entry,
                                                  node);
        if (!top_view(e, now, &t) ||
            (visible && !visible(ud, e->resource, e->keylen - lm.prefixlen)))
            continue;
        total++;
        top_heap_put(out, n, max, &t);
    }
    qsort(out, *n, sizeof(*out), top_cmp);
    return total;
}
