/*
 * redlock, the plain rounds (redlock_priv.h): STATUS (INSPECT: each
 * node's view of one resource, its exclusive key, shared holders and
 * semaphore slots) and FORCEUNLOCK (FORCE: every key of the resource
 * deleted, whatever it holds, and announced). One script to every node,
 * done when the last reply is in, whatever the nodes say: no vote, no
 * quorum, no fence. Like an op, a round never completes inside the call
 * that starts it.
 */
#include "redlock_priv.h"

#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "label.h"
#include "mem.h"
#include "node.h"
#include "pool.h"
#include "script.h"

/* The daemon's config, read live (a SIGHUP reload changes it in place). */
static const struct conf *probe_conf;
/* The call being sent (pool_call copies what it sends). */
static struct script_call probe_call;
static size_t probes_live;  /* rounds not finished yet */

void rl_probe_init(const struct conf *conf)
{
    probe_conf = conf;
}

size_t rl_probe_live(void)
{
    return probes_live;
}

struct round {
    int pending;            /* replies outstanding (+1 while sending) */
    struct timer defer;
    void (*done)(struct round *r);
};

static void round_step(struct round *r)
{
    if (--r->pending > 0)
        return;
    r->done(r);
    probes_live--;
}

static void round_deferred(struct timer *t)
{
    round_step(t->data);
}

static void round_begin(struct round *r, void (*done)(struct round *))
{
    r->pending = 1;
    r->done = done;
    timer_init(&r->defer, round_deferred, r);
    probes_live++;
}

/* Send c to every node; replies go to cb(ud == the struct embedding r). */
static void round_send(struct round *r, const struct script_call *c,
                       pool_reply_cb cb, void *ud)
{
    for (int i = 0; i < pool_nnodes(); i++) {
        r->pending++;
        if (pool_call(i, NULL, &c->w, cb, ud) != 0)
            r->pending--;
    }
    if (r->pending == 1)
        timer_start(&r->defer, 0);
    else
        round_step(r);
}

struct inspect {
    struct round r;         /* first */
    redlock_inspect_cb cb;
    void *ud;
    struct redlock_node_view *views;
    char **slots;           /* (owned) per node, or NULL */
};

static void inspect_done(struct round *r)
{
    struct inspect *in = (struct inspect *)(void *)r;
    int n = pool_nnodes();

    in->cb(in->ud, in->views, n);
    for (int i = 0; i < n; i++)
        free(in->slots[i]);
    free(in->slots);
    free(in->views);
    free(in);
}

/* The exclusive key's value, b (len bytes, NUL-terminated, a copy), as
 * v's token, label and fence (label.h). */
static void inspect_value(struct redlock_node_view *v, char *b, size_t len)
{
    if (len == 0)
        return;
    v->token = b;
    if (!label_split(b, len, &v->label, &v->fence))
        v->label = NULL;
}

/* {pttl, live shared holders, "0110...", value, first slot's value} */
static void inspect_reply(void *ud, int node, redisReply *r)
{
    struct inspect *in = ud;
    struct redlock_node_view *v = &in->views[node];

    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 5 &&
        r->element[0]->type == REDIS_REPLY_INTEGER &&
        r->element[1]->type == REDIS_REPLY_INTEGER &&
        r->element[2]->type == REDIS_REPLY_STRING &&
        r->element[3]->type == REDIS_REPLY_STRING &&
        r->element[4]->type == REDIS_REPLY_STRING) {
        const redisReply *bits = r->element[2], *val = r->element[3];
        const redisReply *slot = r->element[4];
        /* One allocation: the slot bits, the value, the slot's value,
         * each NUL-terminated. */
        char *b = mem_alloc(bits->len + val->len + slot->len + 3);
        char *vb = b + bits->len + 1, *sb = vb + val->len + 1;
        uint64_t fence;
        memcpy(b, bits->str, bits->len);
        memcpy(vb, val->str, val->len);
        memcpy(sb, slot->str, slot->len);
        in->slots[node] = b;
        v->answered = true;
        v->pttl = r->element[0]->integer;
        v->shared = r->element[1]->integer;
        v->slots = b;
        inspect_value(v, vb, val->len);
        if (slot->len && !label_split(sb, slot->len, &v->slot_label, &fence))
            v->slot_label = NULL;
    }
    round_step(&in->r);
}

/* Run INSPECT (force: FORCE) for p on every node: r is the first member
 * of the struct its replies (reply, with ud == r) and done fill in. */
static void probe_round(struct round *r, const struct redlock_probe *p,
                        bool force, void (*done)(struct round *),
                        pool_reply_cb reply)
{
    const struct script_resource res = {
        .key = p->key, .keylen = p->keylen, .shared = p->shared,
        .sharedlen = p->sharedlen, .slots = p->slots,
        .slotslen = p->slotslen, .limit = p->limit,
    };

    if (force)
        script_force(&probe_call, &res,
                     probe_conf->locks.release_channel);
    else
        script_inspect(&probe_call, &res);
    round_begin(r, done);
    round_send(r, &probe_call, reply, r);
}

void redlock_inspect(const struct redlock_probe *p, redlock_inspect_cb cb,
                     void *ud)
{
    int n = pool_nnodes();
    struct inspect *in = mem_alloc(sizeof(*in));

    in->cb = cb;
    in->ud = ud;
    in->views = mem_alloc((size_t)n * sizeof(*in->views));
    in->slots = mem_alloc((size_t)n * sizeof(*in->slots));
    for (int i = 0; i < n; i++) {
        in->views[i].name = pool_node_name(i);
        in->views[i].up = pool_node_up(i);
        in->views[i].voting = node_votes(i);
        in->views[i].pttl = -2;
    }
    probe_round(&in->r, p, false, inspect_done, inspect_reply);
}

struct force {
    struct round r;         /* first */
    redlock_cb cb;
    void *ud;
    struct redlock_result res;
};

static void force_done(struct round *r)
{
    struct force *f = (struct force *)(void *)r;

    f->res.status = REDLOCK_OK;
    f->cb(f->ud, &f->res);
    free(f);
}

static void force_reply(void *ud, int node, redisReply *r)
{
    struct force *f = ud;
    (void)node;

    if (!r || r->type == REDIS_REPLY_ERROR)
        f->res.failed++;
    else if (r->type == REDIS_REPLY_INTEGER && r->integer > 0)
        f->res.deleted++;
    round_step(&f->r);
}

void redlock_force_release(const struct redlock_probe *p, redlock_cb cb,
                           void *ud)
{
    struct force *f = mem_alloc(sizeof(*f));

    f->cb = cb;
    f->ud = ud;
    probe_round(&f->r, p, true, force_done, force_reply);
}
