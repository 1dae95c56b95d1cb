/*
 * node: see node.h.
 *
 * Ownership: node_init allocates one struct node per configured node and
 * node_free frees them. An owed_release belongs to its node's `owed` list
 * from node_release_later until it is handed to the pool (or node_free).
 * Fence-repair requests carry their struct node as callback data; the
 * nodes outlive every request, since node_free comes after the pool has
 * failed them all. node_shutdown sets `stopping` before the pool drops its
 * links, so the callbacks that run then start no timer.
 *
 * The two Redlock numbers node applies (the quorum a repair must read, and
 * a restarted node's wait) come from redlock through node_set_rules: node
 * sits below redlock and does not include it.
 */
#include "node.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "timer.h"

#define NODE_REPAIR_RETRY_MS 1000
#define NODE_MAX_OWED 65536     /* owed releases kept per node */

/* An owner-checked release to send when a node is back: it may still
 * execute requests that were buffered on its old connection when it
 * stopped answering. */
struct owed_release {
    struct list link;           /* in node->owed, oldest first */
    size_t keylen;
    const char *token;          /* NUL-terminated, after the key */
    char key[];                 /* keylen bytes + NUL, then the token */
};

struct node {
    int idx;
    bool down_logged;           /* warned once since it was last up */
    char run_id[POOL_RUN_ID_MAX + 1]; /* last run_id seen, "" if never */
    bool aof_always;            /* as its last handshake said */
    bool recovering;            /* restarted: not voting yet */
    uint64_t recover_at;        /* earliest readmission (uv_now ms) */
    struct timer recover_timer;
    int repair_wait;            /* GET replies outstanding */
    int repair_ok;              /* counters read */
    uint64_t repair_max;        /* largest counter read */
    struct list owed;           /* owed_releases to send once it is up */
    size_t nowed;
    uint64_t restarts;
};

static struct {
    const struct conf *conf;
    struct node_rules rules;    /* from node_set_rules */
    struct node *nodes;
    int nnodes;
    bool stopping;
    uint64_t max_fence;         /* largest fence granted */
} N;

static const char *node_name(const struct node *n)
{
    return pool_node_name(n->idx);
}

/* ---- owed releases ------------------------------------------------------ */

static void owed_reply(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;
}

void node_release_later(int node, const char *key, size_t keylen,
                        const char *token)
{
    struct node *n = &N.nodes[node];

    if (N.stopping)
        return;
    if (n->nowed >= NODE_MAX_OWED) {
        log_warn("redis %s: too many releases held back; %.*s will expire "
                 "by its ttl there", node_name(n), (int)keylen, key);
        return;
    }
    size_t toklen = strlen(token);
    struct owed_release *o = mem_alloc(sizeof(*o) + keylen + 1 + toklen + 1);
    memcpy(o->key, key, keylen);
    o->keylen = keylen;
    memcpy(o->key + keylen + 1, token, toklen);
    o->token = o->key + keylen + 1;
    list_push_tail(&n->owed, &o->link);
    n->nowed++;
}

/* Send what this node is owed, oldest first; one the pool cannot take
 * stays owed (sending never calls back into this list). */
static void node_send_owed(struct node *n)
{
    struct list *pos, *tmp;
    size_t sent = 0;

    list_foreach_safe(pos, tmp, &n->owed) {
        struct owed_release *o = list_entry(pos, struct owed_release, link);
        const char *argv[] = { o->key, o->token, N.conf->locks.release_channel };
        size_t lens[] = { o->keylen, strlen(o->token), strlen(argv[2]) };
        if (pool_script(n->idx, POOL_SCRIPT_RELEASE, 1, 2, argv, lens,
                        owed_reply, NULL) != 0)
            continue;
        list_remove(pos);
        n->nowed--;
        free(o);
        sent++;
    }
    if (sent)
        log_info("redis %s: sent %zu owner-checked releases held back while "
                 "it was down", node_name(n), sent);
}

void node_note_fence(uint64_t fence)
{
    if (fence > N.max_fence)
        N.max_fence = fence;
}

/* ---- repair of a restarted node ---------------------------------------- */

static void repair_raise_cb(void *ud, int node, redisReply *r)
{
    struct node *n = ud;
    (void)node;

    if (N.stopping)
        return;
    if (r && r->type == REDIS_REPLY_INTEGER) {
        n->recovering = false;
        log_notice("redis %s: rejoined after restart (fence counter raised "
                   "to %" PRIu64 ")", node_name(n), n->repair_max);
        return;
    }
    timer_start(&n->recover_timer, NODE_REPAIR_RETRY_MS);
}

static void repair_read_cb(void *ud, int node, redisReply *r)
{
    struct node *n = ud;
    int quorum = N.rules.quorum;
    (void)node;

    if (N.stopping)
        return;     /* no timers once the pool is going away */
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL)) {
        uint64_t v = r->type == REDIS_REPLY_STRING ?
                     strtoull(r->str, NULL, 10) : 0;
        if (v > n->repair_max)
            n->repair_max = v;
        n->repair_ok++;
    }
    if (--n->repair_wait > 0)
        return;
    if (!pool_node_up(n->idx)) {
        timer_start(&n->recover_timer, NODE_REPAIR_RETRY_MS);
        return;
    }
    if (n->repair_ok < quorum) {
        /* With one or two nodes the others can never make a quorum; fall
         * back on the largest fence this daemon has seen, and say that the
         * fence guarantee now rests on it. */
        if (N.nnodes - 1 >= quorum || n->aof_always) {
            log_info("redis %s: fence repair read %d of the %d counters it "
                     "needs; retrying", node_name(n), n->repair_ok, quorum);
            timer_start(&n->recover_timer, NODE_REPAIR_RETRY_MS);
            return;
        }
        log_warn("redis %s: too few nodes to read the fence counter from; "
                 "raising it to the largest fence this daemon has seen "
                 "(%" PRIu64 "). Fences stay monotonic only for locks taken "
                 "through daemons that saw it.", node_name(n), N.max_fence);
    }
    if (N.max_fence > n->repair_max)
        n->repair_max = N.max_fence;
    char val[POOL_NUM_SIZE];
    snprintf(val, sizeof(val), "%" PRIu64, n->repair_max);
    const char *argv[] = { N.conf->locks.fence_key, val };
    size_t lens[] = { strlen(argv[0]), strlen(val) };
    if (pool_script(n->idx, POOL_SCRIPT_RAISE, 1, 1, argv, lens,
                    repair_raise_cb, n) != 0)
        timer_start(&n->recover_timer, NODE_REPAIR_RETRY_MS);
}

/* Read the fence counter from every node that can be trusted with it (the
 * voting ones, and this one too if its AOF loses nothing); once a quorum
 * answered, raise this node's counter to their maximum, then let it vote. */
static void node_repair(struct node *n)
{
    const char *argv[] = { "GET", N.conf->locks.fence_key };
    size_t lens[] = { 3, strlen(N.conf->locks.fence_key) };

    n->repair_wait = 1;     /* held until every request is out */
    n->repair_ok = 0;
    n->repair_max = 0;
    for (int i = 0; i < N.nnodes; i++) {
        if (!node_votes(i) && !(i == n->idx && n->aof_always))
            continue;
        n->repair_wait++;
        if (pool_command(i, 2, argv, lens, repair_read_cb, n) != 0)
            n->repair_wait--;
    }
    repair_read_cb(n, -1, NULL);
}

static void node_recover_cb(struct timer *t)
{
    struct node *n = t->data;

    if (!n->recovering || N.stopping)
        return;
    if (!pool_node_up(n->idx)) {
        timer_start(&n->recover_timer, NODE_REPAIR_RETRY_MS);
        return;
    }
    node_repair(n);
}

/* ---- the pool's hooks ---------------------------------------------------- */

/* A new run_id: keep the node from voting until keys it may have lost have
 * expired everywhere (no wait with an AOF that loses nothing) and its fence
 * counter is repaired. */
static void node_restarted(struct node *n, const char *run_id)
{
    uint64_t delay = n->aof_always ? 0 : N.rules.readmit_ms;

    n->restarts++;
    n->recovering = true;
    n->recover_at = timer_now() + delay;
    timer_start(&n->recover_timer, delay);
    log_warn("redis %s: restarted (run_id %s -> %s); not voting for "
             "%" PRIu64 " ms, until keys it may have lost have expired "
             "and its fence counter is repaired",
             node_name(n), n->run_id, run_id, delay);
}

static void node_on_up(int node, const char *run_id, bool aof_always)
{
    struct node *n = &N.nodes[node];

    n->down_logged = false;
    n->aof_always = aof_always;
    if (n->run_id[0] && strcmp(n->run_id, run_id) != 0)
        node_restarted(n, run_id);
    else
        log_notice("redis %s: up%s", node_name(n),
                   n->recovering ? " (still recovering from a restart)" : "");
    snprintf(n->run_id, sizeof(n->run_id), "%s", run_id);
    node_send_owed(n);
}

static void node_on_down(int node, const char *why)
{
    struct node *n = &N.nodes[node];

    if (!n->down_logged && !N.stopping)
        log_warn("redis %s: down (%s)", node_name(n), why);
    else
        log_debug("redis %s: still down (%s)", node_name(n), why);
    n->down_logged = true;
}

/* ---- public ------------------------------------------------------------ */

void node_set_rules(const struct node_rules *rules)
{
    N.rules = *rules;
}

int node_init(uv_loop_t *loop, const struct conf *conf,
              pool_release_cb on_release)
{
    const struct pool_hooks hooks = {
        .on_up = node_on_up,
        .on_down = node_on_down,
        .on_release = on_release,
    };

    N.conf = conf;
    N.nnodes = (int)conf->redis.nnodes;
    N.nodes = mem_alloc(sizeof(struct node) * (size_t)N.nnodes);
    for (int i = 0; i < N.nnodes; i++) {
        struct node *n = &N.nodes[i];
        n->idx = i;
        list_init(&n->owed);
        timer_init(&n->recover_timer, node_recover_cb, n);
    }
    return pool_init(loop, conf, &hooks);
}

void node_shutdown(void)
{
    if (!N.nodes || N.stopping)
        return;
    N.stopping = true;
    pool_shutdown();
    /* Only now: dropping the links runs callbacks that may touch any node. */
    for (int i = 0; i < N.nnodes; i++)
        timer_stop(&N.nodes[i].recover_timer);
}

void node_free(void)
{
    if (!N.nodes)
        return;
    for (int i = 0; i < N.nnodes; i++) {
        struct list *pos, *tmp;
        list_foreach_safe(pos, tmp, &N.nodes[i].owed)
            free(list_entry(pos, struct owed_release, link));
    }
    free(N.nodes);
    N.nodes = NULL;
    pool_free();
}

bool node_votes(int node)
{
    return pool_node_up(node) && !N.nodes[node].recovering;
}

int node_nvoting(void)
{
    int k = 0;
    for (int i = 0; i < N.nnodes; i++)
        k += node_votes(i);
    return k;
}

json_t *node_stats_json(void)
{
    json_t *arr = json_array();
    uint64_t now = timer_now();

    for (int i = 0; i < N.nnodes; i++) {
        const struct node *n = &N.nodes[i];
        const struct pool_node_stats *s = pool_node_stats(i);
        json_t *o = json_pack("{s:s, s:b, s:b, s:b, s:I, s:I, s:I, s:I, s:I,"
                              " s:f, s:f, s:s, s:s}",
            "node", node_name(n),
            "up", pool_node_up(i),
            "voting", node_votes(i),
            "recovering", n->recovering,
            "requests", (json_int_t)s->requests,
            "errors", (json_int_t)s->errors,
            "timeouts", (json_int_t)s->timeouts,
            "reconnects", (json_int_t)s->reconnects,
            "restarts", (json_int_t)n->restarts,
            "latency_ms", s->latency_ms,
            "latency_max_ms", s->latency_max_ms,
            "run_id", n->run_id,
            "last_error", s->last_error);
        if (n->recovering)
            json_object_set_new(o, "rejoin_in_ms", json_integer(
                n->recover_at > now ? (json_int_t)(n->recover_at - now) : 0));
        json_array_append_new(arr, o);
    }
    return arr;
}
