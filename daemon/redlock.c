/*
 * redlock: see redlock.h.
 *
 * An op is heap-allocated, owned by itself: it counts the node requests it
 * has outstanding and frees itself after the last reply and its final
 * callback. Nothing else points at it, so nothing can outlive it. An
 * acquisition owns one vote per node (votes[]), which its raise round,
 * the same op with kind OP_RAISE, updates in place. An op keeps copies of its keys: for an acquisition, the n
 * exclusive keys and, when given, the n shared holders' sets after them.
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
#include "redlock.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <uv.h>

#include "conf.h"
#include "hmap.h"
#include "label.h"
#include "list.h"
#include "log.h"
#include "mem.h"
#include "node.h"
#include "num.h"
#include "pool.h"
#include "script.h"
#include "timer.h"

enum op_kind { OP_ACQUIRE, OP_RAISE, OP_RELEASE, OP_EXTEND, OP_ADOPT };

/* Error replies: one node repeating one reason (OOM on every request while
 * it is full) is logged once per REDLOCK_ERRLOG_MS, with a count of what
 * was left out. The table remembers that many (node, reason) pairs; past
 * it the oldest is forgotten. */
#define REDLOCK_ERRLOG_MS 5000
#define REDLOCK_ERRLOG_SLOTS 32
#define REDLOCK_ERRLOG_REASON 24    /* the error's first word, NUL included */
#define REDLOCK_ERRLOG_TEXT 200     /* of the message, once sanitized */

struct op {
    enum op_kind kind;
    enum redlock_mode mode; /* acquire: what it takes */
    int nres;               /* acquire: resources */
    bool with_shared;       /* acquire: their shared sets follow the keys */
    int pending;            /* node requests outstanding (+1 while sending) */
    bool answered;          /* cb ran before the last reply (a quorum
                               decided); the op lives on until then */
    bool in_early;          /* an answered acquisition: in `early` */
    uint64_t awaiting;      /* nodes whose reply to this round is out */
    struct redlock_result res;
    uint64_t start_ns;
    uint32_t ttl;
    bool undo;              /* acquire: some node may hold our key */
    bool wait;              /* acquire: will wait (struct redlock_lock) */
    bool adopt_one;         /* adopt: keys are key, shared set, old token,
                               label, slot prefix (ADOPT_ONE) */
    uint32_t nslots;        /* adopt_one: slots to look at */
    bool adopted;           /* adopt_one: res.adopted_* set by a node */
    char *adopted_value;    /* (owned) adopt: res.adopted_value */
    struct redlock_node_vote *votes;    /* (owned) acquire: one per node */
    int *links;             /* (with votes) acquire: per node, the pool
                               connection its request went on */
    uint64_t *gens;         /* (in this allocation) per node, its
                               node_vote_gen when the request was sent */
    struct timer defer;     /* completes an op no node could take */
    redlock_cb cb;
    void *ud;
    const char **keys;      /* (in this allocation) nres keys, then nres
                               shared sets when with_shared */
    size_t *lens;
    const char *key;        /* keys[0], for logs and one-key ops */
    size_t keylen;
    const char *label;      /* acquire: the holder label ("" for none), in
                               this allocation after the keys */
    struct list blink;      /* batched: in its queue (struct batch_queue),
                               or waiting in an acquisition's followers */
    struct batch_queue *bq; /* waiting: the queue it joins then, or NULL */
    /* An acquisition answered before its last reply: in `early` by token,
     * with the batched releases and extends of that token waiting for
     * it. */
    struct hmap_node tnode;
    struct list followers;
    char token[REDLOCK_TOKEN_LEN + 1];
    _Alignas(uint64_t) char buf[];  /* gens, the key pointers and lengths,
                                       then the keys' bytes, each
                                       NUL-terminated */
};

/* The daemon's config, read live (a SIGHUP reload changes it in place). */
static const struct conf *redlock_conf;
/* The call being sent (large: one for the module; the loop has one
 * thread, and pool_call copies what it sends). */
static struct script_call redlock_call;
static size_t live;         /* ops and inspections not finished yet */
/* Acquisitions answered and still waiting for a node, by token. */
static struct hmap early;
/* The largest fence counter this daemon has seen a voting node hold for one
 * of its keys, or granted. Every acquisition sends it: a node behind it
 * moves up to it, so the nodes' counters converge and the normal grant is
 * one round. Only an optimisation: the proof needs nothing from it. */
static uint64_t fence_seen;

static struct errlog {
    int node;               /* -1: free */
    char reason[REDLOCK_ERRLOG_REASON];
    uint64_t logged_at;     /* timer_now() ms */
    uint64_t quiet;         /* errors not logged since */
} errlog[REDLOCK_ERRLOG_SLOTS];

size_t redlock_live(void)
{
    return live;
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
    for (size_t i = 0; i < REDLOCK_ERRLOG_SLOTS; i++)
        errlog[i].node = -1;
}

void redlock_deinit(void)
{
    hmap_deinit(&early);
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

void redlock_fence_plan(const struct redlock_node_vote *v, int n,
                        uint64_t fence, int64_t validity, bool may_raise,
                        struct redlock_fence_plan *plan, bool *raise)
{
    int quorum = redlock_quorum(n);

    memset(plan, 0, sizeof(*plan));
    for (int i = 0; i < n; i++) {
        switch (v[i].vote) {
        case REDLOCK_VOTE_HELD:
            plan->held++;
            if (fence == 0 && v[i].counter > plan->fence)
                plan->fence = v[i].counter;
            break;
        case REDLOCK_VOTE_BUSY:
            plan->busy++;
            break;
        case REDLOCK_VOTE_FAILED:
        default:
            plan->failed++;
            break;
        }
    }
    if (fence != 0)
        plan->fence = fence;
    for (int i = 0; i < n; i++) {
        bool holds = v[i].vote == REDLOCK_VOTE_HELD;
        if (holds && v[i].counter >= plan->fence)
            plan->reached++;
        if (raise)
            raise[i] = holds && v[i].counter < plan->fence;
    }

    if (plan->held < quorum || validity <= 0) {
        plan->step = REDLOCK_STEP_FAIL;
        plan->status = redlock_decide(n, plan->held, plan->busy, plan->failed,
                                      validity);
    } else if (plan->reached >= quorum) {
        plan->step = REDLOCK_STEP_GRANT;
        plan->status = REDLOCK_OK;
    } else if (may_raise) {
        plan->step = REDLOCK_STEP_RAISE;
        plan->status = REDLOCK_OK;
    } else {
        /* A quorum holds the key, but the fence did not reach one. */
        plan->step = REDLOCK_STEP_FAIL;
        plan->status = REDLOCK_UNAVAILABLE;
    }
}

/* Tokens come from the OS random source, read a block at a time: one
 * getrandom per 256 tokens instead of one per LOCK. A block is used once,
 * front to back, and wiped as it is used. */
#define REDLOCK_RANDOM_BLOCK 4096

int redlock_token(char out[REDLOCK_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    static unsigned char pool[REDLOCK_RANDOM_BLOCK];
    static size_t avail;
    enum { RAW = REDLOCK_TOKEN_LEN / 2 };

    if (avail < RAW) {
        size_t got = 0;
        while (got < sizeof(pool)) {
            ssize_t k = getrandom(pool + got, sizeof(pool) - got, 0);
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                avail = 0;
                return -1;
            }
            got += (size_t)k;
        }
        avail = sizeof(pool);
    }
    unsigned char *raw = pool + sizeof(pool) - avail;
    for (size_t i = 0; i < RAW; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    memset(raw, 0, RAW);
    avail -= RAW;
    out[REDLOCK_TOKEN_LEN] = '\0';
    return 0;
}

/* ---- error replies ------------------------------------------------------ */

/* The slot of (node, reason): the one it had, else a free one, else the
 * oldest. *fresh says whether it is new to the table. */
static struct errlog *errlog_slot(int node, const char *reason, bool *fresh)
{
    struct errlog *oldest = &errlog[0];

    for (size_t i = 0; i < REDLOCK_ERRLOG_SLOTS; i++) {
        struct errlog *e = &errlog[i];
        if (e->node == node && strcmp(e->reason, reason) == 0) {
            *fresh = false;
            return e;
        }
        if (oldest->node >= 0 && (e->node < 0 ||
                                  e->logged_at < oldest->logged_at))
            oldest = e;
    }
    *fresh = true;
    oldest->node = node;
    snprintf(oldest->reason, sizeof(oldest->reason), "%s", reason);
    oldest->quiet = 0;
    return oldest;
}

/*
 * A reply that is no vote: an error reply (its first word is the reason,
 * as Redis writes them: OOM, NOAUTH, READONLY, WRONGTYPE, ERR...) or one
 * of a shape the script never returns. Logged with the node, rate-limited.
 */
static void op_log_reply(const struct op *o, int node, const redisReply *r)
{
    static const char *const what[] = {
        [OP_ACQUIRE] = "acquire", [OP_RAISE] = "fence raise",
        [OP_RELEASE] = "release", [OP_EXTEND] = "extend",
        [OP_ADOPT] = "adopt",
    };
    char reason[REDLOCK_ERRLOG_REASON] = "reply";
    char text[REDLOCK_ERRLOG_TEXT] = "a reply of an unexpected shape";
    uint64_t now = timer_now();
    bool fresh;

    if (r->type == REDIS_REPLY_ERROR && r->str) {
        /* Redis's own words, but printable before they reach the log. */
        size_t k, w = strcspn(r->str, " ");
        for (k = 0; k + 1 < sizeof(text) && k < r->len; k++) {
            unsigned char ch = (unsigned char)r->str[k];
            text[k] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
        }
        text[k] = '\0';
        if (w > 0) {
            for (k = 0; k + 1 < sizeof(reason) && k < w && text[k]; k++)
                reason[k] = text[k];
            reason[k] = '\0';
        }
    }
    struct errlog *e = errlog_slot(node, reason, &fresh);
    if (!fresh && now - e->logged_at < REDLOCK_ERRLOG_MS) {
        e->quiet++;
        return;
    }
    if (e->quiet)
        log_warn("redis %s: %s of %.*s failed: %s (and %" PRIu64 " more "
                 "%s errors from it in %" PRIu64 " ms)", pool_node_name(node),
                 what[o->kind], (int)o->keylen, o->key, text, e->quiet,
                 e->reason, now - e->logged_at);
    else
        log_warn("redis %s: %s of %.*s failed: %s (a failed vote; this "
                 "node's %s errors are logged at most every %d s)",
                 pool_node_name(node), what[o->kind], (int)o->keylen, o->key,
                 text, e->reason, REDLOCK_ERRLOG_MS / 1000);
    e->logged_at = now;
    e->quiet = 0;
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
            .token = o->token, .ttl = o->ttl, .seen = fence_seen,
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

/* May node's answer to o count as a vote? Only if it votes now and did
 * when the request (and its guard) went out. */
static bool op_votes(const struct op *o, int node)
{
    return node_votes(node) && o->gens[node] == node_vote_gen(node);
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

static void acquire_done(struct op *o);
static void raise_done(struct op *o);
static void acquire_end(struct op *o, const struct redlock_fence_plan *p);

/* A fence counter as the scripts return it: a decimal string. */
static int counter_parse(const redisReply *r, uint64_t *out)
{
    if (r->type != REDIS_REPLY_STRING)
        return -1;
    return proto_parse_u64(r->str, r->len, out);
}

/* A reply of the fence scripts: {1|0, x}, where x is the counter when
 * the key is ours and, for acquire, the PTTL when it is not. */
static bool fence_reply(const redisReply *r, long long *owned)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        return false;
    *owned = r->element[0]->integer;
    return true;
}

/* One node's answer to the acquire or the raise script, as its vote. */
static void fence_count(struct op *o, int node, const redisReply *r)
{
    struct redlock_node_vote *v = &o->votes[node];
    long long owned;
    uint64_t c;

    v->vote = REDLOCK_VOTE_FAILED;
    if (!fence_reply(r, &owned) || (owned != 0 && owned != 1)) {
        op_log_reply(o, node, r);
        return;
    }
    if (owned == 1) {
        /* Ours there; the key stays for the undo to find if it cannot
         * count. */
        if (counter_parse(r->element[1], &c) != 0) {
            op_log_reply(o, node, r);
            return;
        }
        if (!op_votes(o, node))
            return;
        v->vote = REDLOCK_VOTE_HELD;
        v->counter = c;
        if (c > fence_seen)
            fence_seen = c;
        return;
    }
    v->vote = REDLOCK_VOTE_BUSY;
    if (o->kind == OP_ACQUIRE) {
        const redisReply *p = r->element[1];
        if (p->type == REDIS_REPLY_INTEGER && p->integer >= 0 &&
            (o->res.pttl < 0 || p->integer < o->res.pttl))
            o->res.pttl = p->integer;
    }
}

/* A string element of a reply as a number, or -1 (none, empty, bad). */
static int64_t reply_num(const redisReply *r, size_t i)
{
    uint64_t v = 0;

    if (i >= r->elements || counter_parse(r->element[i], &v) != 0 ||
        v > INT64_MAX)
        return -1;
    return (int64_t)v;
}

/* What ADOPT_ONE found the token holding ({1, "fence", kind[, "slot",
 * "limit"]}): false when the answer is malformed or names another lease
 * than an earlier node's (a token names one lease: such a node's answer
 * is not counted). */
static bool adopt_kind(struct op *o, const redisReply *r)
{
    const redisReply *k = r->elements >= 3 ? r->element[2] : NULL;
    enum redlock_held held = REDLOCK_HELD_KEY;
    int64_t slot = 0, limit = -1;

    if (!k || k->type != REDIS_REPLY_STRING)
        return false;
    if (strcmp(k->str, "shared") == 0) {
        held = REDLOCK_HELD_SHARED;
    } else if (strcmp(k->str, "slot") == 0) {
        held = REDLOCK_HELD_SLOT;
        if ((slot = reply_num(r, 3)) < 0 || slot >= UINT32_MAX)
            return false;
        limit = reply_num(r, 4);
    } else if (strcmp(k->str, "exclusive") != 0) {
        return false;
    }
    if (o->adopted && (o->res.adopted != held ||
                       o->res.adopted_slot != (uint32_t)slot))
        return false;
    o->adopted = true;
    o->res.adopted = held;
    o->res.adopted_slot = (uint32_t)slot;
    if (limit > slot && limit <= UINT32_MAX &&
        (uint32_t)limit > o->res.adopted_limit)
        o->res.adopted_limit = (uint32_t)limit;
    return true;
}

/* The holder value an exclusive ADOPT carried over (lua/lib/value_of.lua's
 * field, after the fence, or after the kind for ADOPT_ONE): the first
 * voting node's that has one. */
static void adopt_value(struct op *o, const redisReply *r)
{
    size_t at = o->adopt_one ? 3 : 2;
    const redisReply *v = r->elements > at ? r->element[at] : NULL;

    if (o->adopted_value || !v || v->type != REDIS_REPLY_STRING ||
        (o->adopt_one && o->res.adopted != REDLOCK_HELD_KEY))
        return;
    o->adopted_value = label_value_of(v->str, v->len);
    o->res.adopted_value = o->adopted_value;
}

/* One node's answer to ADOPT: {1, "fence"...} rotated, {0} not ours. */
static void adopt_count(struct op *o, int node, const redisReply *r)
{
    long long owned = -1;
    uint64_t f = 0;

    if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
        r->element[0]->type == REDIS_REPLY_INTEGER)
        owned = r->element[0]->integer;
    if (owned == 0) {
        o->res.busy++;
        return;
    }
    if (owned != 1 || r->elements < 2 ||
        (o->adopt_one && !adopt_kind(o, r))) {
        op_log_reply(o, node, r);
        o->res.failed++;
        return;
    }
    o->res.deleted++;       /* nodes rotated, counted or not */
    if (!op_votes(o, node)) {
        o->res.failed++;
        return;
    }
    o->res.ok++;
    if (counter_parse(r->element[1], &f) == 0 && f > o->res.fence)
        o->res.fence = f;
    adopt_value(o, r);
}

static void op_count(struct op *o, int node, redisReply *r)
{
    bool votes = op_votes(o, node);

    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r && strncmp(r->str, "LOSTDATA", 8) == 0)
            node_lost_data(node, "its recovery marker is not the one it was "
                           "admitted under (a vote's guard answered "
                           "LOSTDATA): it lost its data");
        if (r)
            op_log_reply(o, node, r);
        if (o->votes)
            o->votes[node].vote = REDLOCK_VOTE_FAILED;
        o->res.failed++;
        if (o->kind == OP_RELEASE)
            node_release_later(node, o->key, o->keylen, o->token);
        return;
    }
    switch (o->kind) {
    case OP_ACQUIRE:
    case OP_RAISE:
        fence_count(o, node, r);
        return;
    case OP_ADOPT:
        adopt_count(o, node, r);
        return;
    case OP_RELEASE:
    case OP_EXTEND:
        if (r->type != REDIS_REPLY_INTEGER) {
            op_log_reply(o, node, r);
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
    long long owned;
    uint64_t c;

    if (!r || !fence_reply(r, &owned) || owned != 1 ||
        counter_parse(r->element[1], &c) != 0 || c <= o->res.fence)
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
        op_count(o, node, r);
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
        if (p->fence > fence_seen)
            fence_seen = p->fence;
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

/* ---- plain rounds: STATUS and FORCEUNLOCK --------------------------------
 * One script to every node, done when the last reply is in; like an op it
 * never completes inside the call that starts it. */

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
    live--;
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
    live++;
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
        script_force(&redlock_call, &res,
                     redlock_conf->locks.release_channel);
    else
        script_inspect(&redlock_call, &res);
    round_begin(r, done);
    round_send(r, &redlock_call, reply, r);
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
