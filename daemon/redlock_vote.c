/*
 * redlock, the votes (redlock_priv.h): what a node's reply to an op's
 * round says. For an acquisition and its raise round, a vote with the
 * fence counter the node left while the key held our token (the fence
 * plan in redlock.c decides on the votes); for ADOPT, whether the
 * token's key was rotated there, what it held (ADOPT_ONE: the key, a
 * shared hold or a slot) and the holder value it carried; for release
 * and extend, whether our key was there. An answer counts as a vote only
 * from a node that votes now and did when the request went out (its
 * guard's generation).
 *
 * A reply that is no vote (an error reply, or one of a shape the script
 * never returns) is logged with the node, rate-limited: one node
 * repeating one reason (OOM on every request while it is full) is logged
 * once per REDLOCK_ERRLOG_MS, with a count of what was left out.
 */
#include "redlock_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "label.h"
#include "log.h"
#include "node.h"
#include "num.h"
#include "pool.h"

/* Error replies: each (node, reason) is logged at most once per
 * REDLOCK_ERRLOG_MS. The table remembers that many pairs; past it the
 * oldest is forgotten. */
#define REDLOCK_ERRLOG_MS 5000
#define REDLOCK_ERRLOG_SLOTS 32
#define REDLOCK_ERRLOG_REASON 24    /* the error's first word, NUL included */
#define REDLOCK_ERRLOG_TEXT 200     /* of the message, once sanitized */

/* rl_fence_seen (redlock_priv.h). */
static uint64_t fence_seen;

static struct errlog {
    int node;               /* -1: free */
    char reason[REDLOCK_ERRLOG_REASON];
    uint64_t logged_at;     /* timer_now() ms */
    uint64_t quiet;         /* errors not logged since */
} errlog[REDLOCK_ERRLOG_SLOTS];

void rl_vote_init(void)
{
    for (size_t i = 0; i < REDLOCK_ERRLOG_SLOTS; i++)
        errlog[i].node = -1;
}

uint64_t rl_fence_seen(void)
{
    return fence_seen;
}

void rl_fence_saw(uint64_t f)
{
    if (f > fence_seen)
        fence_seen = f;
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

/* ---- votes --------------------------------------------------------------- */

/* May node's answer to o count as a vote? Only if it votes now and did
 * when the request (and its guard) went out. */
static bool op_votes(const struct op *o, int node)
{
    return node_votes(node) && o->gens[node] == node_vote_gen(node);
}

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

bool rl_vote_held(const redisReply *r, uint64_t *c)
{
    long long owned;

    return fence_reply(r, &owned) && owned == 1 &&
           counter_parse(r->element[1], c) == 0;
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
        rl_fence_saw(c);
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

void rl_vote_count(struct op *o, int node, const redisReply *r)
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
