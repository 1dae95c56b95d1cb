/*
 * redlock, the ops (redlock.h; redlock_priv.h for how its files share the
 * work): each operation lockmgr asks for (acquire, adopt, release,
 * extend, relabel; batched renewals and releases), fanned out to every
 * node, its replies counted as votes (redlock_vote.c) and decided by the
 * rules (redlock.c); set-up, and the table lockmgr calls through (struct
 * redlock_ops), which hands STATUS and FORCEUNLOCK to redlock_probe.c.
 * The top of redlock's files.
 *
 * An op is heap-allocated, owned by itself: it counts the node requests it
 * has outstanding and frees itself after the last reply and its final
 * callback. Nothing else points at it, so nothing can outlive it. An
 * acquisition owns one vote per node (votes[]), which its raise round,
 * the same op with kind OP_RAISE, updates in place. An op keeps copies of
 * its keys: for an acquisition, the n exclusive keys and, when given, the
 * n shared holders' sets after them.
 *
 * Answers at a quorum: a grant or a renewal is answered as soon as the
 * nodes that replied decide it, as a Redlock library does, not after the
 * slowest node (on a loaded host, the last of three nodes to be scheduled
 * was a quarter to a half of every request's time). The op then lives on,
 * answered, until its last reply, which still counts for node health and
 * the largest fence seen. A release or extend with the token of such an
 * acquisition goes to a node still to answer it on the same connection,
 * behind it (op_fan_out; a batched one waits for the last reply,
 * op_follow), so that it can never run first there and leave the key
 * behind; a late holder that was ahead gets the grant's fence set on its
 * keys (op_align).
 */
#include "redlock_priv.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "conf.h"
#include "hmap.h"
#include "list.h"
#include "log.h"
#include "mem.h"
#include "node.h"
#include "pool.h"
#include "script.h"
#include "timer.h"

/* The daemon's config, read live (a SIGHUP reload changes it in place). */
static const struct conf *redlock_conf;
/* The call being sent (large: one for the module; the loop has one
 * thread, and pool_call copies what it sends). */
static struct script_call redlock_call;
static size_t live;         /* ops not finished yet */
/* Acquisitions answered and still waiting for a node, by token. */
static struct hmap early;

size_t redlock_live(void)
{
    return live + rl_probe_live();
}

static void op_reply(void *ud, int node, redisReply *r);

static void op_deferred(struct timer *t)
{
    op_reply(t->data, -1, NULL);
}

/*
 * Requests nobody hurries for, gathered for REDLOCK_BATCH_MS and then sent
 * SCRIPT_BATCH_MAX at a time as one script per node: renewals (EXTEND_MANY)
 * and the releases of sessions that ended (RELEASE_MANY). Not 0 ms: timers
 * started while timers run fire in the same run when due, so the flush
 * would come right after the first request, before the others due at the
 * same time (lockmgr brings renewals due together, lease_renew_due).
 *
 * What is due goes out at once, however many batches that makes: a
 * renewal waits for the nodes, never for other renewals, so renewals keep
 * up with any rate the nodes can answer, however far away they are (keys
 * out = rate x round trip). Only redis.batch_keys_in_flight bounds a
 * queue's keys out (a batch stops counting once a quorum answered), so
 * that a burst far beyond any renewal load (a hundred thousand sessions'
 * releases at once) waits here in the ops rather than as request copies
 * and hiredis output buffers on every node. A fixed number of batches
 * out was a cliff: 4 x 128 keys per round trip of the quorum's slowest
 * node, 2,500 renewals a second at 200 ms (issue 19).
 */
#define REDLOCK_BATCH_MS 1
/* After a burst of this many batched requests, free memory goes back to
 * the system (malloc_trim) once the queue is empty. */
#define REDLOCK_TRIM_AFTER 4096

enum { BQ_EXTEND, BQ_RELEASE, BQ_COUNT };

struct batch_queue {
    struct list ops;        /* struct op (blink) */
    size_t n;
    size_t keys_out;        /* keys of the batches out, until a quorum of
                               nodes answered each */
    size_t burst;           /* requests since the queue was last empty */
    enum op_kind kind;
    struct timer flush;
};
static struct batch_queue BQ[BQ_COUNT];

static void batch_flush_cb(struct timer *t);
static void batch_add(struct batch_queue *q, struct op *o);
static bool op_follow(struct op *o, struct batch_queue *q);

static int64_t rules_drift_ms(uint32_t ttl)
{
    return redlock_drift_ms(ttl, redlock_conf->locks.drift_factor);
}

void redlock_init(const struct conf *conf)
{
    /* A restarted node may have lost keys that live up to the longest
     * ttl: it waits that long, plus drift, before voting again (the
     * Redlock paper's delayed restart); its fence repair must read a
     * quorum. */
    const struct node_rules rules = {
        .quorum = redlock_quorum((int)conf->redis.nnodes),
        .drift_ms = rules_drift_ms,
    };

    redlock_conf = conf;
    for (int i = 0; i < BQ_COUNT; i++) {
        struct batch_queue *q = &BQ[i];
        list_init(&q->ops);
        q->n = 0;
        q->keys_out = 0;
        q->burst = 0;
        q->kind = i == BQ_EXTEND ? OP_EXTEND : OP_RELEASE;
        timer_init(&q->flush, batch_flush_cb, q);
    }
    node_set_rules(&rules);
    hmap_init(&early);
    rl_vote_init();
    rl_probe_init(conf);
}

void redlock_deinit(void)
{
    hmap_deinit(&early);
}


/* ---- ops ---------------------------------------------------------------- */

/* An op over nkeys keys (copied), token (copied unless NULL). */
static struct op *op_create(enum op_kind kind, int nkeys,
                            const char *const *keys, const size_t *lens,
                            const char *token, uint32_t ttl, redlock_cb cb,
                            void *ud)
{
    size_t bytes = 0;

    for (int i = 0; i < nkeys; i++)
        bytes += lens[i] + 1;
    size_t gens = (size_t)pool_nnodes() * sizeof(uint64_t);
    size_t arrays = gens + (size_t)nkeys * (sizeof(char *) + sizeof(size_t));
    struct op *o = mem_alloc(sizeof(*o) + arrays + bytes);
    char *p = o->buf + arrays;

    o->gens = (uint64_t *)(void *)o->buf;
    o->keys = (const char **)(void *)(o->buf + gens);
    o->lens = (size_t *)(void *)(o->keys + nkeys);
    for (int i = 0; i < nkeys; i++) {
        memcpy(p, keys[i], lens[i]);
        p[lens[i]] = '\0';
        o->keys[i] = p;
        o->lens[i] = lens[i];
        p += lens[i] + 1;
    }
    o->key = o->keys[0];
    o->keylen = o->lens[0];
    o->kind = kind;
    o->nres = 1;
    o->ttl = ttl;
    o->cb = cb;
    o->ud = ud;
    if (token)
        snprintf(o->token, sizeof(o->token), "%s", token);
    if (kind == OP_ACQUIRE) {
        size_t n = (size_t)pool_nnodes();
        o->votes = mem_alloc(n * (sizeof(*o->votes) + sizeof(int)));
        o->links = (int *)(void *)(o->votes + n);
    }
    o->start_ns = uv_hrtime();
    o->res.pttl = -1;
    list_init(&o->followers);
    live++;
    timer_init(&o->defer, op_deferred, o);
    return o;
}

static uint64_t op_elapsed_ms(const struct op *o)
{
    return (uv_hrtime() - o->start_ns) / 1000000u;
}

/* Does this round go to node i? A raise goes to the holders below F. */
static bool op_targets(const struct op *o, int i)
{
    /* A rotation on a node whose answer cannot count would still take the
     * old token away there: a client retrying its ADOPT (it never saw the
     * new token) would find the key no longer its own. */
    if (o->kind == OP_ADOPT)
        return node_votes(i);
    if (o->kind != OP_RAISE)
        return true;
    return o->votes[i].vote == REDLOCK_VOTE_HELD &&
           o->votes[i].counter < o->res.fence;
}

/* The shared set of resource i of an acquisition, or NULL. */
static const char *op_shared(const struct op *o, int i, size_t *len)
{
    if (!o->with_shared)
        return NULL;
    *len = o->lens[o->nres + i];
    return o->keys[o->nres + i];
}

/* The script call of o's round, in c (script.h lays the words out). */
static void op_call(const struct op *o, struct script_call *c)
{
    const char *fence = redlock_conf->locks.fence_key;
    size_t slen = 0;
    /* A grant of several resources always checks their shared sets. */
    const char *shared = op_shared(o, 0, &slen);

    switch (o->kind) {
    case OP_ACQUIRE: {
        const struct script_acquire a = {
            .n = o->nres, .keys = o->keys, .lens = o->lens,
            .shared = o->with_shared ? o->keys + o->nres : NULL,
            .sharedlens = o->lens + o->nres,
            .mode_shared = o->mode == REDLOCK_SHARED, .fence = fence,
            .token = o->token, .ttl = o->ttl, .seen = rl_fence_seen(),
            .label = o->label, .wait = o->wait,
        };
        script_acquire(c, &a);
        return;
    }
    case OP_RAISE:
        /* F, the value to raise to; a shared grant's owner-checked on its
         * member. */
        if (o->mode == REDLOCK_SHARED)
            script_raise_shared(c, shared, slen, fence, o->token,
                                o->res.fence);
        else
            script_raise_held(c, o->nres, o->keys, o->lens, fence, o->token,
                              o->res.fence);
        return;
    case OP_ADOPT:
        if (o->adopt_one) {
            /* op_create's copies (adopt_one): key, shared set, old
             * token, label, slot prefix. */
            const struct script_resource r = {
                .key = o->keys[0], .keylen = o->lens[0],
                .shared = o->keys[1], .sharedlen = o->lens[1],
                .slots = o->keys[4], .slotslen = o->lens[4],
                .limit = o->nslots,
            };
            script_adopt_one(c, &r, o->keys[2], o->token, o->ttl, o->label);
        } else {
            /* the keys, then the old token (redlock_adopt) */
            script_adopt(c, o->nres, o->keys, o->lens, o->keys[o->nres],
                         o->token, o->ttl, o->label);
        }
        return;
    case OP_RELEASE:
        script_release(c, o->key, o->keylen, o->token,
                       redlock_conf->locks.release_channel,
                       pool_instance_id());
        return;
    case OP_EXTEND:
    default:
        if (o->label)
            script_relabel(c, o->key, o->keylen, o->token, o->label,
                           o->lens[1], o->ttl);
        else
            script_extend(c, o->key, o->keylen, o->token, o->ttl);
        return;
    }
}

/* Set node's guard words in c (when its script has them), and note which
 * of the node's votes the answer may be. */
static void guard_words(struct op *const *ops, int nops, int node,
                        struct script_call *c)
{
    const char *words[SCRIPT_GUARD_WORDS];
    size_t lens[SCRIPT_GUARD_WORDS];

    if (!script_guarded(&c->w))
        return;
    node_guard(node, words, lens);
    script_set_guard(c, words, lens);
    for (int i = 0; i < nops; i++)
        ops[i]->gens[node] = node_vote_gen(node);
}

/* Node i could not take o's request: a failed vote, and a release owed
 * to it for when it is back. */
static void op_unsent(struct op *o, int i)
{
    o->res.failed++;
    if (o->votes)
        o->votes[i].vote = REDLOCK_VOTE_FAILED;
    if (o->kind == OP_RELEASE)
        node_release_later(i, o->key, o->keylen, o->token);
}

/* o's requests are out (pending counts them, plus the one its sender
 * holds): drop the sender's count. Never answer from inside the caller's
 * call: when no node could take the request, finish on the next loop
 * turn. */
static void op_sent(struct op *o)
{
    if (o->pending == 1)
        timer_start(&o->defer, 0);
    else
        op_reply(o, -1, NULL);
}

/* Send c, o's call, to node i, on pool connection `link` (-1: any); a
 * node that cannot take it counts as failed at once. The caller holds a
 * pending count of its own. */
static void op_send(struct op *o, int i, int link, struct script_call *c)
{
    guard_words(&o, 1, i, c);
    o->pending++;
    if (pool_call(i, &link, &c->w, op_reply, o) != 0) {
        o->pending--;
        op_unsent(o, i);
        return;
    }
    o->awaiting |= (uint64_t)1 << i;
    if (o->links)
        o->links[i] = link;
}

/* The acquisition answered early with this token and still waiting for
 * some nodes, or NULL. */
static struct op *op_early(const char *token)
{
    struct hmap_node *n;

    if (early.count == 0)
        return NULL;
    n = hmap_get(&early, token, strlen(token));
    return n ? container_of(n, struct op, tnode) : NULL;
}

/* Send this op's script to every node it goes to; a node that cannot take
 * it counts as failed at once. The extra pending count keeps the op alive
 * until the loop is done even if every request fails synchronously. A
 * release or an extend of an acquisition answered early goes, on each node
 * still to answer it, on the same pool connection, so that it runs after
 * the acquisition there: sent on another connection it could overtake it,
 * find nothing, and leave the key behind. */
static void op_fan_out(struct op *o)
{
    const struct op *a = NULL;

    op_call(o, &redlock_call);

    if (o->kind == OP_RELEASE || o->kind == OP_EXTEND)
        a = op_early(o->token);
    o->pending = 1;
    o->awaiting = 0;
    for (int i = 0; i < pool_nnodes(); i++) {
        if (!op_targets(o, i)) {
            if (o->kind == OP_ADOPT)
                o->res.failed++;    /* not asked: no vote */
            continue;
        }
        int link = a && (a->awaiting & ((uint64_t)1 << i)) ? a->links[i] : -1;
        op_send(o, i, link, &redlock_call);
    }
    op_sent(o);
}

/*
 * A batched release or extend (one script over many keys, to every node)
 * of an acquisition answered early and still waiting for some nodes waits
 * for its last reply, then joins its queue: it cannot go on the
 * acquisition's connection alone. Returns whether o waits.
 */
static bool op_follow(struct op *o, struct batch_queue *q)
{
    struct op *a = op_early(o->token);

    if (!a)
        return false;
    o->bq = q;
    list_push_tail(&a->followers, &o->blink);
    return true;
}

static void op_free(struct op *o)
{
    struct list *p;

    if (o->in_early)
        hmap_del(&early, &o->tnode);
    while ((p = list_first(&o->followers))) {
        struct op *f = container_of(p, struct op, blink);
        list_remove(p);
        batch_add(f->bq, f);
    }
    free(o->votes);
    free(o->adopted_value);
    free(o);
    live--;
}

/* The answer. An op still waiting for nodes is freed by its last reply;
 * an acquisition is found by its token until then (op_follow). */
static void op_finish(struct op *o)
{
    o->res.elapsed_ms = op_elapsed_ms(o);
    if (o->pending > 0) {
        o->answered = true;
        if (o->kind == OP_ACQUIRE || o->kind == OP_RAISE) {
            o->in_early = true;
            hmap_put(&early, &o->tnode, o->token, strlen(o->token));
        }
    }
    if (o->cb)
        o->cb(o->ud, &o->res);
    if (o->pending == 0)
        op_free(o);
}

/* ---- replies: each counted, then the verdict ----------------------------- */

static void acquire_done(struct op *o);
static void raise_done(struct op *o);
static void acquire_end(struct op *o, const struct redlock_fence_plan *p);

static void align_done(void *ud, int node, redisReply *r)
{
    (void)ud;
    if (r && r->type == REDIS_REPLY_ERROR)
        log_info("redis %s: setting a late holder's fence failed: %s",
                 pool_node_name(node), r->str);
}

/*
 * A reply after the grant was answered: a holder whose counter was ahead
 * of the quorum's keeps the grant's keys with its own, larger counter as
 * their fence. ADOPT takes the largest fence the keys carry and STATUS
 * shows it: have them carry the grant's fence there too. (A shared hold's
 * member carries none.)
 */
static void op_align(struct op *o, int node, const redisReply *r)
{
    uint64_t c;

    if (!r || !rl_vote_held(r, &c) || c <= o->res.fence)
        return;
    if (o->mode == REDLOCK_SHARED) {
        /* The member's fence is a field of the set's fences hash. */
        size_t len = 0;
        const char *shared = op_shared(o, 0, &len);
        script_set_fence(&redlock_call, 1, &shared, &len, o->token,
                         o->res.fence);
    } else {
        script_set_fence(&redlock_call, o->nres, o->keys, o->lens, o->token,
                         o->res.fence);
    }
    log_debug("%.*s: node %s answered after the grant with counter %" PRIu64
              " above its fence %" PRIu64 ": setting the fence its keys "
              "carry", (int)o->keylen, o->key, pool_node_name(node), c,
              o->res.fence);
    (void)pool_call(node, NULL, &redlock_call.w, align_done, NULL);
}

/* Before the last reply: do the replies so far decide o? Then answer. */
static void op_try_early(struct op *o)
{
    int64_t validity = redlock_validity(o->ttl, op_elapsed_ms(o),
                                        redlock_conf->locks.drift_factor);
    struct redlock_fence_plan p;

    switch (o->kind) {
    case OP_ACQUIRE:
    case OP_RAISE:
        /* The nodes yet to answer count as failed: a grant on the votes
         * in is a grant by the rule (docs/design.md, "Fences"); F is the
         * largest counter among the holders that answered, and a quorum
         * of them is at F. */
        redlock_fence_plan(o->votes, pool_nnodes(), o->kind == OP_RAISE ?
                           o->res.fence : 0, validity, false, &p, NULL);
        if (p.step != REDLOCK_STEP_GRANT)
            return;
        o->res.validity = validity;
        if (o->kind == OP_ACQUIRE)
            o->res.rounds = 1;
        acquire_end(o, &p);
        return;
    case OP_EXTEND:
        if (o->res.ok < redlock_quorum(pool_nnodes()) || validity <= 0)
            return;
        o->res.validity = validity;
        o->res.status = REDLOCK_OK;
        op_finish(o);
        return;
    default:
        /* A release is answered with the nodes that deleted the key, and
         * its lease frees its entry only once the key is gone everywhere;
         * an ADOPT's rotation is rare. Both wait for every node. */
        return;
    }
}

static void op_reply(void *ud, int node, redisReply *r)
{
    struct op *o = ud;

    if (node >= 0) {
        o->awaiting &= ~((uint64_t)1 << node);
        rl_vote_count(o, node, r);
        /* Only the first round's late replies: a raise sets a holder's
         * value to the fence itself. */
        if (o->answered && o->kind == OP_ACQUIRE &&
            o->res.status == REDLOCK_OK)
            op_align(o, node, r);
    }
    if (--o->pending > 0) {
        if (node >= 0 && !o->answered)
            op_try_early(o);
        return;
    }
    if (o->answered) {
        op_free(o);
        return;
    }

    int64_t validity = redlock_validity(o->ttl, op_elapsed_ms(o),
                                        redlock_conf->locks.drift_factor);
    switch (o->kind) {
    case OP_ACQUIRE:
        o->res.validity = validity;
        acquire_done(o);
        return;
    case OP_RAISE:
        o->res.validity = validity;
        raise_done(o);
        return;
    case OP_EXTEND:
        o->res.validity = validity;
        o->res.status = redlock_decide(pool_nnodes(), o->res.ok, o->res.busy,
                                       o->res.failed, validity);
        if (o->res.status == REDLOCK_BUSY)
            o->res.status = REDLOCK_LOST;
        break;
    case OP_ADOPT:
        o->res.validity = validity;
        o->res.status = redlock_decide(pool_nnodes(), o->res.ok, o->res.busy,
                                       o->res.failed, validity);
        break;
    case OP_RELEASE:
        o->res.status = REDLOCK_OK;
        break;
    }
    op_finish(o);
}

/* Remove a failed acquisition's partial keys everywhere, owner-checked. */
static void acquire_undo(const struct op *o)
{
    size_t len = 0;
    const char *shared = op_shared(o, 0, &len);

    if (o->mode == REDLOCK_SHARED) {
        redlock_release(shared, len, o->token, NULL, NULL);
        return;
    }
    /* Without an announcement: our own waiter would hear it and ask again
     * at once, behind a holder that is still there. */
    for (int i = 0; i < o->nres; i++)
        node_undo(o->keys[i], o->lens[i], o->token);
}

/* The plan's verdict: grant, or give the keys back. */
static void acquire_end(struct op *o, const struct redlock_fence_plan *p)
{
    o->res.ok = p->held;
    o->res.busy = p->busy;
    o->res.failed = p->failed;
    o->res.status = p->status;
    if (p->step == REDLOCK_STEP_GRANT) {
        o->res.fence = p->fence;
        rl_fence_saw(p->fence);
        node_note_fence(p->fence);
    } else {
        o->res.fence = 0;
        if (o->undo)
            acquire_undo(o);
    }
    op_finish(o);
}

static void acquire_done(struct op *o)
{
    struct redlock_fence_plan p;

    redlock_fence_plan(o->votes, pool_nnodes(), 0, o->res.validity, true, &p,
                       NULL);
    /* Any node that did not say no may hold our key. */
    o->undo = p.held > 0 || p.failed > 0;
    o->res.rounds = 1;
    if (p.step != REDLOCK_STEP_RAISE) {
        acquire_end(o, &p);
        return;
    }
    /* The counters differ and too few holders have F: raise the others,
     * owner-checked (a shared grant's on its live member), before anyone
     * is told. */
    log_debug("%.*s: fence raise round: %d of %d holders at fence %" PRIu64,
              (int)o->keylen, o->key, p.reached, p.held, p.fence);
    o->kind = OP_RAISE;
    o->res.fence = p.fence;
    o->res.rounds = 2;
    op_fan_out(o);
}

static void raise_done(struct op *o)
{
    struct redlock_fence_plan p;

    /* Validity is checked again after the second round: a grant never
     * leaves with no time left on it. */
    redlock_fence_plan(o->votes, pool_nnodes(), o->res.fence, o->res.validity,
                       false, &p, NULL);
    if (p.step != REDLOCK_STEP_GRANT)
        log_warn("%.*s: fence %" PRIu64 " reached %d of the %d holders "
                 "(validity %" PRId64 " ms): giving the lock back",
                 (int)o->keylen, o->key, p.fence, p.reached, p.held,
                 o->res.validity);
    acquire_end(o, &p);
}

/* ---- the operations ----------------------------------------------------- */

void redlock_acquire(const struct redlock_lock *lk, const char *token,
                     uint32_t ttl, redlock_cb cb, void *ud)
{
    const char *keys[2 * CONF_MAX_MULTI + 1];
    size_t lens[2 * CONF_MAX_MULTI + 1];
    int n = lk->n, k = 0;

    for (int i = 0; i < n; i++)
        keys[k] = lk->keys[i], lens[k++] = lk->lens[i];
    if (lk->shared)
        for (int i = 0; i < n; i++)
            keys[k] = lk->shared[i], lens[k++] = lk->shared_lens[i];
    /* The label rides along as the last "key", copied with them. */
    keys[k] = lk->label ? lk->label : "";
    lens[k] = lk->label ? lk->labellen : 0;
    struct op *o = op_create(OP_ACQUIRE, k + 1, keys, lens, token, ttl, cb,
                             ud);
    o->label = o->keys[k];
    o->wait = lk->wait;
    o->mode = lk->mode;
    o->nres = n;
    o->with_shared = lk->shared != NULL;
    op_fan_out(o);
}

/* One resource held in any way: the key, the shared set, the old token,
 * the label and the slot prefix ride as the op's keys (ADOPT_ONE). */
static void adopt_one(const struct redlock_adopt *a, redlock_cb cb, void *ud)
{
    const struct redlock_probe *p = a->one;
    const char *keys[] = {
        p->key, p->shared, a->old_token, a->label ? a->label : "", p->slots,
    };
    const size_t lens[] = {
        p->keylen, p->sharedlen, strlen(a->old_token),
        a->label ? a->labellen : 0, p->slotslen,
    };
    struct op *o = op_create(OP_ADOPT, 5, keys, lens, a->token, a->ttl, cb,
                             ud);
    o->adopt_one = true;
    o->nslots = p->limit;
    o->label = o->keys[3];
    o->res.fence = 0;
    op_fan_out(o);
}

void redlock_adopt(const struct redlock_adopt *a, redlock_cb cb, void *ud)
{
    const char *keys[CONF_MAX_MULTI + 2];
    size_t lens[CONF_MAX_MULTI + 2];
    int n = a->n;

    if (a->one) {
        adopt_one(a, cb, ud);
        return;
    }
    for (int i = 0; i < n; i++)
        keys[i] = a->keys[i], lens[i] = a->lens[i];
    /* The old token and the label ride along as the last "keys". */
    keys[n] = a->old_token;
    lens[n] = strlen(a->old_token);
    keys[n + 1] = a->label ? a->label : "";
    lens[n + 1] = a->label ? a->labellen : 0;
    struct op *o = op_create(OP_ADOPT, n + 2, keys, lens, a->token, a->ttl,
                             cb, ud);
    o->nres = n;
    o->label = o->keys[n + 1];
    o->res.fence = 0;
    op_fan_out(o);
}

void redlock_release(const char *key, size_t keylen, const char *token,
                     redlock_cb cb, void *ud)
{
    op_fan_out(op_create(OP_RELEASE, 1, &key, &keylen, token, 0, cb, ud));
}

/* ---- batches ------------------------------------------------------------ */

/* Up to SCRIPT_BATCH_MAX ops sent together: each node's one reply is an
 * array with every op's answer, given to each op as its own reply. */
struct batch {
    struct batch_queue *q;
    int refs;               /* node requests outstanding, +1 while sending */
    int answered;           /* nodes that replied */
    bool out;               /* counted in q->keys_out */
    int n;
    struct op *ops[];
};

/* b no longer holds up its queue: the next batch may go. That is once a
 * quorum of nodes answered, so that a slow node (not yet given up on)
 * does not stall every renewal and release behind it. */
static void batch_let_go(struct batch *b)
{
    struct batch_queue *q = b->q;

    if (!b->out)
        return;
    b->out = false;
    q->keys_out -= (size_t)b->n;
    if (q->n > 0 && !q->flush.slot)
        timer_start(&q->flush, 0);
}

static void batch_put(struct batch *b)
{
    struct batch_queue *q = b->q;

    if (--b->refs > 0)
        return;
    batch_let_go(b);
    free(b);
    if (q->n == 0 && q->keys_out == 0) {
#ifdef __GLIBC__
        if (q->burst >= REDLOCK_TRIM_AFTER)
            malloc_trim(0);
#endif
        q->burst = 0;
    }
}

static void batch_reply(void *ud, int node, redisReply *r)
{
    struct batch *b = ud;
    bool each = r && r->type == REDIS_REPLY_ARRAY &&
                r->elements == (size_t)b->n;

    if (r && !each && r->type != REDIS_REPLY_ERROR) {
        log_warn("redis %s: a batch of %d requests answered a reply of "
                 "type %d: counted as failed", pool_node_name(node), b->n,
                 r->type);
        r = NULL;
    }
    for (int i = 0; i < b->n; i++)
        op_reply(b->ops[i], node, each ? r->element[i] : r);
    if (++b->answered >= redlock_quorum(pool_nnodes()))
        batch_let_go(b);
    batch_put(b);
}

/* The call of a batch: EXTEND_MANY (the keys, a token and a ttl each) or
 * RELEASE_MANY (the keys, the channel, the instance id, the tokens). */
static void batch_call(const struct batch *b, struct script_call *c)
{
    const char *keys[SCRIPT_BATCH_MAX], *tokens[SCRIPT_BATCH_MAX];
    size_t lens[SCRIPT_BATCH_MAX];
    uint32_t ttls[SCRIPT_BATCH_MAX];
    int n = b->n;

    for (int i = 0; i < n; i++) {
        keys[i] = b->ops[i]->key;
        lens[i] = b->ops[i]->keylen;
        tokens[i] = b->ops[i]->token;
        ttls[i] = b->ops[i]->ttl;
    }
    if (b->q->kind == OP_EXTEND)
        script_extend_many(c, n, keys, lens, tokens, ttls);
    else
        script_release_many(c, n, keys, lens, tokens,
                            redlock_conf->locks.release_channel,
                            pool_instance_id());
}

/* Send the first SCRIPT_BATCH_MAX ops of q (there are some); as
 * op_fan_out, a node that cannot take them fails each at once. */
static void batch_send(struct batch_queue *q)
{
    int n = q->n < SCRIPT_BATCH_MAX ? (int)q->n : SCRIPT_BATCH_MAX;
    struct batch *b = mem_alloc(sizeof(*b) + (size_t)n * sizeof(b->ops[0]));

    for (int i = 0; i < n; i++) {
        struct list *first = list_first(&q->ops);
        list_remove(first);
        b->ops[i] = container_of(first, struct op, blink);
        b->ops[i]->pending = 1;
    }
    q->n -= (size_t)n;
    q->keys_out += (size_t)n;
    b->out = true;
    b->q = q;
    b->n = n;
    b->refs = 1;
    batch_call(b, &redlock_call);
    for (int node = 0; node < pool_nnodes(); node++) {
        guard_words(b->ops, n, node, &redlock_call);
        b->refs++;
        for (int i = 0; i < n; i++)
            b->ops[i]->pending++;
        if (pool_call(node, NULL, &redlock_call.w, batch_reply, b) != 0) {
            b->refs--;
            for (int i = 0; i < n; i++) {
                b->ops[i]->pending--;
                op_unsent(b->ops[i], node);
            }
        }
    }
    for (int i = 0; i < n; i++)
        op_sent(b->ops[i]);
    batch_put(b);
}

static void batch_flush_cb(struct timer *t)
{
    struct batch_queue *q = t->data;

    /* Read live: a SIGHUP may change it. */
    while (q->n > 0 && q->keys_out < redlock_conf->redis.batch_keys_in_flight)
        batch_send(q);
}

static void batch_add(struct batch_queue *q, struct op *o)
{
    if (o->bq != q && op_follow(o, q))
        return;
    o->bq = NULL;
    list_push_tail(&q->ops, &o->blink);
    q->n++;
    q->burst++;
    if (!q->flush.slot)
        timer_start(&q->flush, REDLOCK_BATCH_MS);
}

void redlock_extend_batched(const char *key, size_t keylen, const char *token,
                            uint32_t ttl, redlock_cb cb, void *ud)
{
    batch_add(&BQ[BQ_EXTEND], op_create(OP_EXTEND, 1, &key, &keylen, token,
                                        ttl, cb, ud));
}

void redlock_release_batched(const char *key, size_t keylen,
                             const char *token, redlock_cb cb, void *ud)
{
    batch_add(&BQ[BQ_RELEASE], op_create(OP_RELEASE, 1, &key, &keylen, token,
                                         0, cb, ud));
}

void redlock_extend(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud)
{
    op_fan_out(op_create(OP_EXTEND, 1, &key, &keylen, token, ttl, cb, ud));
}

void redlock_relabel(const char *key, size_t keylen, const char *token,
                     uint32_t ttl, const char *label, size_t labellen,
                     redlock_cb cb, void *ud)
{
    /* The label rides along as the second "key", copied with it. */
    const char *keys[] = { key, label };
    const size_t lens[] = { keylen, labellen };
    struct op *o = op_create(OP_EXTEND, 2, keys, lens, token, ttl, cb, ud);

    o->label = o->keys[1];
    op_fan_out(o);
}


/* ---- the table lockmgr uses ---------------------------------------------- */

int redlock_nnodes(void)
{
    return pool_nnodes();
}

int redlock_nquorum(void)
{
    return redlock_quorum(pool_nnodes());
}

const struct redlock_ops redlock_ops_default = {
    .acquire = redlock_acquire, .release = redlock_release,
    .extend = redlock_extend, .extend_batched = redlock_extend_batched,
    .relabel = redlock_relabel,
    .release_batched = redlock_release_batched, .inspect = redlock_inspect,
    .force_release = redlock_force_release, .adopt = redlock_adopt,
    .token = redlock_token,
    .nnodes = redlock_nnodes, .quorum = redlock_nquorum,
    .why_unavailable = node_why_unavailable,
};

