/*
 * redlock: see redlock.h.
 *
 * An op is heap-allocated, owned by itself: it counts the node requests it
 * has outstanding and frees itself after the last reply and its final
 * callback. Nothing else points at it, so nothing can outlive it.
 */
#include "redlock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <uv.h>

#include "conf.h"
#include "log.h"
#include "mem.h"
#include "node.h"
#include "pool.h"
#include "timer.h"

enum op_kind { OP_ACQUIRE, OP_RAISE, OP_RELEASE, OP_EXTEND };

/* The most words an op's script takes: acquire's lock and fence keys, its
 * token and its ttl. */
#define OP_MAX_WORDS 4

struct op {
    enum op_kind kind;
    int pending;            /* node requests outstanding (+1 while sending) */
    struct redlock_result res;
    uint64_t start_ns;
    uint64_t max_fence;
    uint32_t ttl;
    struct timer defer;     /* completes an op no node could take */
    redlock_cb cb;
    void *ud;
    size_t keylen;
    char token[REDLOCK_TOKEN_LEN + 1];
    char key[];             /* keylen bytes + NUL */
};

static const struct conf *RC;
static size_t live;         /* ops and inspections not finished yet */

size_t redlock_live(void)
{
    return live;
}

static void op_reply(void *ud, int node, redisReply *r);

static void op_deferred(struct timer *t)
{
    op_reply(t->data, -1, NULL);
}

void redlock_init(const struct conf *conf)
{
    /* A restarted node may have lost keys that lived up to max_ttl_ms:
     * it waits that long, plus drift, before voting again (the Redlock
     * paper's delayed restart); its fence repair must read a quorum. */
    const struct node_rules rules = {
        .quorum = redlock_quorum((int)conf->redis.nnodes),
        .readmit_ms = conf->locks.max_ttl_ms + (uint64_t)redlock_drift_ms(
            conf->locks.max_ttl_ms, conf->locks.drift_factor),
    };

    RC = conf;
    node_set_rules(&rules);
}

/* ---- pure parts --------------------------------------------------------- */

int redlock_quorum(int nnodes)
{
    return nnodes / 2 + 1;
}

int64_t redlock_drift_ms(uint32_t ttl, double factor)
{
    return (int64_t)((double)ttl * factor) + REDLOCK_DRIFT_MIN_MS;
}

int64_t redlock_validity(uint32_t ttl, uint64_t elapsed_ms, double drift)
{
    return (int64_t)ttl - (int64_t)elapsed_ms - redlock_drift_ms(ttl, drift);
}

enum redlock_status redlock_decide(int nnodes, int ok, int busy, int failed,
                                   int64_t validity)
{
    int quorum = redlock_quorum(nnodes);

    if (ok >= quorum && validity > 0)
        return REDLOCK_OK;
    /* So many nodes hold another value that no quorum was possible even
     * had every failed node said yes: the resource is taken. */
    if (busy > nnodes - quorum)
        return REDLOCK_BUSY;
    if (ok >= quorum || failed > 0)
        return REDLOCK_UNAVAILABLE;
    return REDLOCK_BUSY;
}

int redlock_token(char out[REDLOCK_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[REDLOCK_TOKEN_LEN / 2];
    size_t got = 0;

    while (got < sizeof(raw)) {
        ssize_t k = getrandom(raw + got, sizeof(raw) - got, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[REDLOCK_TOKEN_LEN] = '\0';
    return 0;
}

/* ---- ops ---------------------------------------------------------------- */

static struct op *op_create(enum op_kind kind, const char *key, size_t keylen,
                            const char *token, uint32_t ttl, redlock_cb cb,
                            void *ud)
{
    struct op *o = mem_alloc(sizeof(*o) + keylen + 1);
    o->kind = kind;
    o->ttl = ttl;
    o->cb = cb;
    o->ud = ud;
    o->keylen = keylen;
    memcpy(o->key, key, keylen);
    if (token)
        snprintf(o->token, sizeof(o->token), "%s", token);
    o->start_ns = uv_hrtime();
    o->res.pttl = -1;
    live++;
    timer_init(&o->defer, op_deferred, o);
    return o;
}

static uint64_t op_elapsed_ms(const struct op *o)
{
    return (uv_hrtime() - o->start_ns) / 1000000u;
}


/* Send this op's script to every node; a node that cannot take it counts
 * as failed at once. The extra pending count keeps the op alive until the
 * loop is done even if every request fails synchronously. */
static void op_fan_out(struct op *o)
{
    const char *argv[OP_MAX_WORDS];
    size_t lens[OP_MAX_WORDS];
    char num[POOL_NUM_SIZE];
    int nkeys = 1, nargs = 2;
    enum pool_script s;

    argv[0] = o->key;
    lens[0] = o->keylen;
    switch (o->kind) {
    case OP_ACQUIRE:
        s = POOL_SCRIPT_ACQUIRE;
        nkeys = 2;
        argv[1] = RC->locks.fence_key;
        argv[2] = o->token;
        snprintf(num, sizeof(num), "%" PRIu32, o->ttl);
        argv[3] = num;
        break;
    case OP_RAISE:
        s = POOL_SCRIPT_RAISE;
        nargs = 1;
        argv[0] = RC->locks.fence_key;
        lens[0] = strlen(argv[0]);
        snprintf(num, sizeof(num), "%" PRIu64, o->res.fence);
        argv[1] = num;
        break;
    case OP_RELEASE:
        s = POOL_SCRIPT_RELEASE;
        argv[1] = o->token;
        argv[2] = RC->locks.release_channel;
        break;
    case OP_EXTEND:
    default:
        s = POOL_SCRIPT_EXTEND;
        argv[1] = o->token;
        snprintf(num, sizeof(num), "%" PRIu32, o->ttl);
        argv[2] = num;
        break;
    }
    for (int i = 1; i < nkeys + nargs; i++)
        lens[i] = strlen(argv[i]);

    o->pending = 1;
    for (int i = 0; i < pool_nnodes(); i++) {
        o->pending++;
        if (pool_script(i, s, nkeys, nargs, argv, lens, op_reply, o) != 0) {
            o->pending--;
            o->res.failed++;
            if (o->kind == OP_RELEASE)
                node_release_later(i, o->key, o->keylen, o->token);
        }
    }
    /* Never answer from inside the caller's call: when no node could take
     * the request, finish on the next loop turn. */
    if (o->pending == 1)
        timer_start(&o->defer, 0);
    else
        op_reply(o, -1, NULL);
}

static void op_finish(struct op *o)
{
    o->res.elapsed_ms = op_elapsed_ms(o);
    if (o->cb)
        o->cb(o->ud, &o->res);
    free(o);
    live--;
}

static void acquire_done(struct op *o);
static void raise_done(struct op *o);

static void op_count(struct op *o, int node, redisReply *r)
{
    bool votes = node_votes(node);

    if (!r || r->type == REDIS_REPLY_ERROR) {
        o->res.failed++;
        if (o->kind == OP_RELEASE)
            node_release_later(node, o->key, o->keylen, o->token);
        return;
    }
    switch (o->kind) {
    case OP_ACQUIRE:
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[0]->type == REDIS_REPLY_INTEGER) {
            redisReply *v = r->element[1];
            if (r->element[0]->integer == 1) {
                uint64_t f = v->type == REDIS_REPLY_STRING ?
                             strtoull(v->str, NULL, 10) : 0;
                if (!votes) {
                    o->res.failed++;
                    return;
                }
                o->res.ok++;
                if (f > o->max_fence)
                    o->max_fence = f;
            } else {
                o->res.busy++;
                if (v->type == REDIS_REPLY_INTEGER && v->integer >= 0 &&
                    (o->res.pttl < 0 || v->integer < o->res.pttl))
                    o->res.pttl = v->integer;
            }
            return;
        }
        o->res.failed++;
        return;
    case OP_RAISE:
        if (votes)
            o->res.ok++;
        else
            o->res.failed++;
        return;
    case OP_RELEASE:
    case OP_EXTEND:
        if (r->type != REDIS_REPLY_INTEGER) {
            o->res.failed++;
        } else if (r->integer == 1) {
            o->res.deleted++;
            if (votes)
                o->res.ok++;
            else
                o->res.failed++;
        } else {
            o->res.busy++;
        }
        return;
    }
}

static void op_reply(void *ud, int node, redisReply *r)
{
    struct op *o = ud;

    if (node >= 0)
        op_count(o, node, r);
    if (--o->pending > 0)
        return;

    int64_t validity = redlock_validity(o->ttl, op_elapsed_ms(o),
                                        RC->locks.drift_factor);
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
    case OP_RELEASE:
        o->res.status = REDLOCK_OK;
        break;
    }
    op_finish(o);
}

/* Remove a failed acquisition's partial keys everywhere, owner-checked. */
static void acquire_undo(const struct op *o)
{
    node_undo(o->key, o->keylen, o->token);
}

static void acquire_done(struct op *o)
{
    o->res.status = redlock_decide(pool_nnodes(), o->res.ok, o->res.busy,
                                   o->res.failed, o->res.validity);
    if (o->res.status != REDLOCK_OK) {
        if (o->res.ok > 0 || o->res.failed > 0)
            acquire_undo(o);
        op_finish(o);
        return;
    }
    /* A quorum of nodes granted the key: now make the fence durable on a
     * quorum before anyone is told, so the next holder reads a larger one. */
    o->kind = OP_RAISE;
    o->res.fence = o->max_fence + 1;
    o->res.ok = o->res.busy = o->res.failed = 0;
    op_fan_out(o);
}

static void raise_done(struct op *o)
{
    /* Validity is re-checked after the second round: a grant never leaves
     * with no time left on it. */
    if (o->res.ok >= redlock_nquorum() && o->res.validity > 0) {
        o->res.status = REDLOCK_OK;
        node_note_fence(o->res.fence);
    } else {
        log_warn("fence raise reached %d of %d nodes (validity %" PRId64
                 " ms): giving the lock back", o->res.ok, pool_nnodes(),
                 o->res.validity);
        o->res.status = REDLOCK_UNAVAILABLE;
        acquire_undo(o);
    }
    op_finish(o);
}

void redlock_acquire(const char *key, size_t keylen, const char *token,
                     uint32_t ttl, redlock_cb cb, void *ud)
{
    op_fan_out(op_create(OP_ACQUIRE, key, keylen, token, ttl, cb, ud));
}

void redlock_release(const char *key, size_t keylen, const char *token,
                     redlock_cb cb, void *ud)
{
    op_fan_out(op_create(OP_RELEASE, key, keylen, token, 0, cb, ud));
}

void redlock_extend(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud)
{
    op_fan_out(op_create(OP_EXTEND, key, keylen, token, ttl, cb, ud));
}

/* ---- inspect ------------------------------------------------------------ */

struct inspect {
    int pending;
    redlock_inspect_cb cb;
    void *ud;
    struct redlock_node_view *views;
    struct timer defer;
};

static void inspect_step(struct inspect *in)
{
    if (--in->pending > 0)
        return;
    in->cb(in->ud, in->views, pool_nnodes());
    free(in->views);
    free(in);
    live--;
}

static void inspect_reply(void *ud, int node, redisReply *r)
{
    struct inspect *in = ud;
    struct redlock_node_view *v = &in->views[node];

    if (r && r->type == REDIS_REPLY_INTEGER) {
        v->answered = true;
        v->pttl = r->integer;
    }
    inspect_step(in);
}

static void inspect_deferred(struct timer *t)
{
    inspect_step(t->data);
}

void redlock_inspect(const char *key, size_t keylen, redlock_inspect_cb cb,
                     void *ud)
{
    int n = pool_nnodes();
    struct inspect *in = mem_alloc(sizeof(*in));
    struct redlock_node_view *views = mem_alloc((size_t)n * sizeof(*views));
    in->cb = cb;
    in->ud = ud;
    in->views = views;
    live++;
    in->pending = 1;
    timer_init(&in->defer, inspect_deferred, in);
    for (int i = 0; i < n; i++) {
        const char *pttl[] = { "PTTL", key };
        size_t lens[] = { 4, keylen };
        views[i].name = pool_node_name(i);
        views[i].up = pool_node_up(i);
        views[i].voting = node_votes(i);
        views[i].pttl = -2;
        in->pending++;
        if (pool_command(i, 2, pttl, lens, inspect_reply, in) != 0)
            in->pending--;
    }
    if (in->pending == 1)
        timer_start(&in->defer, 0);
    else
        inspect_step(in);
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
    .extend = redlock_extend, .inspect = redlock_inspect,
    .token = redlock_token,
    .nnodes = redlock_nnodes, .quorum = redlock_nquorum,
};
