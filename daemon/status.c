/*
 * status: see status.h.
 */
#include "status.h"

#include <string.h>

#include "label.h"

struct leases {
    json_t *arr;
    bool tokens;
};

static void lease_one(void *ud, const struct lockmgr_lease_view *l)
{
    const struct leases *x = ud;
    json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:I, s:b, s:I, s:s}",
                          "resource", l->resource,
                          "fence", (json_int_t)l->fence,
                          "ttl", (json_int_t)l->ttl,
                          "validity", (json_int_t)l->validity,
                          "held_ms", (json_int_t)l->held_ms,
                          "renew", l->renew,
                          "renewals", (json_int_t)l->renewals,
                          "mode", lockmgr_mode_name(l->mode));

    if (l->limit) {
        json_object_set_new(j, "limit", json_integer(l->limit));
        json_object_set_new(j, "slot", json_integer(l->slot));
    }
    if (l->value)
        json_object_set_new(j, "value", json_string(l->value));
    if (x->tokens)
        json_object_set_new(j, "token", json_string(l->token));
    json_array_append_new(x->arr, j);
}

json_t *status_leases_json(const struct lockmgr_owner *o, bool tokens)
{
    struct leases x = { json_array(), tokens };

    lockmgr_owner_leases(o, lease_one, &x);
    return x.arr;
}

static json_t *holder_json(const char *daemon,
                           const struct lockmgr_holder_view *h)
{
    json_t *j = json_pack("{s:s?, s:s, s:s?, s:I, s:I, s:I, s:s}",
                          "daemon", daemon,
                          "session", h->session,
                          "name", h->name[0] ? h->name : NULL,
                          "fence", (json_int_t)h->fence,
                          "held_ms", (json_int_t)h->held_ms,
                          "validity", (json_int_t)h->validity,
                          "mode", lockmgr_mode_name(h->mode));

    if (h->slot >= 0)
        json_object_set_new(j, "slot", json_integer(h->slot));
    if (h->value)
        json_object_set_new(j, "value", json_string(h->value));
    json_object_set_new(j, "attached", json_boolean(h->attached));
    if (!h->attached)
        json_object_set_new(j, "detached_ms",
                            json_integer((json_int_t)h->detached_ms));
    return j;
}

/* The holder the nodes record when none is here: what the label of the
 * node lockmgr picked says, with the fence stored with it, or
 * {"foreign":true} for a token no redlockd label goes with. NULL when no
 * token is on a quorum. */
static json_t *remote_holder_json(const struct lockmgr_status *st)
{
    const struct lockmgr_status_plan *p = st->plan;
    json_t *h;

    if (!p->remote_token)
        return NULL;
    h = p->remote >= 0 ? label_holder(st->nodes[p->remote].label) : NULL;
    if (!h)
        return json_pack("{s:b}", "foreign", 1);
    json_object_set_new(h, "fence", json_integer((json_int_t)p->remote_fence));
    return h;
}

static json_t *node_json(const struct redlock_node_view *v, uint32_t limit)
{
    json_t *pttl = v->answered ? json_integer(v->pttl) : json_null();
    json_t *node = json_pack("{s:s, s:b, s:b, s:o}", "node", v->name,
                             "up", v->up, "voting", v->voting, "pttl", pttl);

    if (v->answered) {
        json_object_set_new(node, "shared", json_integer(v->shared));
        if (limit) {
            json_int_t k = 0;
            for (const char *c = v->slots; c && *c; c++)
                k += *c == '1';
            json_object_set_new(node, "slots", json_integer(k));
        }
    }
    return node;
}

static json_t *waiter_json(const struct lockmgr_waiter_view *w)
{
    json_t *j = json_pack("{s:s, s:s?, s:I, s:s}",
                          "session", w->session,
                          "name", w->name[0] ? w->name : NULL,
                          "waited_ms", (json_int_t)w->waited_ms,
                          "mode", lockmgr_mode_name(w->mode));

    if (w->limit)
        json_object_set_new(j, "limit", json_integer(w->limit));
    if (w->nresources > 1)
        json_object_set_new(j, "resources",
                            json_integer((json_int_t)w->nresources));
    return j;
}

json_t *status_json(const struct lockmgr_status *st)
{
    const struct lockmgr_status_plan *p = st->plan;
    json_t *nodes = json_array(), *holders = json_array(), *first, *j;
    json_t *waiting = json_array();

    for (int i = 0; i < st->nnodes; i++)
        json_array_append_new(nodes, node_json(&st->nodes[i], st->limit));
    for (size_t i = 0; i < st->nholders; i++)
        json_array_append_new(holders, holder_json(st->daemon,
                                                   &st->holders[i]));
    first = st->nholders ? holder_json(st->daemon, &st->holders[0])
                         : remote_holder_json(st);
    j = json_pack("{s:s, s:s, s:b, s:s?, s:o, s:o, s:I, s:I, s:I, s:o}",
                  "resource", st->resource, "key", st->key,
                  "held", p->held || first != NULL, "mode", p->mode,
                  "holder", first ? first : json_null(),
                  "holders", holders,
                  "holders_here", (json_int_t)st->holders_here,
                  "shared_holders", (json_int_t)p->shared_holders,
                  "waiters", (json_int_t)st->waiters,
                  "nodes", nodes);
    if (st->limit) {
        json_object_set_new(j, "limit", json_integer(st->limit));
        json_object_set_new(j, "slots_held", json_integer(p->slots_held));
    }
    for (size_t i = 0; i < st->nwaiting; i++)
        json_array_append_new(waiting, waiter_json(&st->waiting[i]));
    json_object_set_new(j, "waiting", waiting);
    return j;
}

static json_t *top_one_json(const struct lockmgr_top_view *t)
{
    json_t *holder = t->session
        ? json_pack("{s:s, s:s?, s:I}", "session", t->session,
                    "name", t->name[0] ? t->name : NULL,
                    "held_ms", (json_int_t)t->held_ms)
        : json_null();
    json_t *j = json_pack("{s:s, s:s}", "resource", t->resource,
                          "mode", lockmgr_mode_name(t->mode));

    if (t->limit)
        json_object_set_new(j, "limit", json_integer(t->limit));
    json_object_set_new(j, "holders", json_integer((json_int_t)t->holders));
    json_object_set_new(j, "holder", holder);
    json_object_set_new(j, "waiters", json_integer((json_int_t)t->waiters));
    json_object_set_new(j, "waited_ms", json_integer((json_int_t)t->waited_ms));
    return j;
}

json_t *status_top_json(const char *daemon, const struct lockmgr_top_view *t,
                        size_t n, size_t total)
{
    json_t *arr = json_array();

    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, top_one_json(&t[i]));
    return json_pack("{s:s?, s:I, s:o}", "daemon", daemon,
                     "total", (json_int_t)total, "resources", arr);
}
