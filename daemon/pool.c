/*
 * pool: see pool.h.
 *
 * Ownership: pool_init allocates the nodes and their links, pool_free frees
 * them; the pool owns every pool_req from send until its reply callback has
 * run, and every pool_cleanup from pool_release_later until it is sent (or
 * pool_free).
 * hiredis owns the redisAsyncContext; we drop our pointer to it (l->ac =
 * NULL, ac->data = NULL) *before* asking hiredis to free it, so callbacks
 * hiredis runs while freeing (NULL replies, onDisconnect) never reach a link
 * through a context that is going away.
 */
#include "pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/async.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "redis_uv.h"
#include "timer.h"

#define POOL_BACKOFF_MIN_MS 100
#define POOL_REPAIR_RETRY_MS 1000
#define POOL_SHA_LEN 40         /* hex chars of a script's SHA1 (SCRIPT LOAD) */
#define POOL_EVAL_WORDS 3       /* EVALSHA sha numkeys, before a script's words */
#define POOL_HS_STEP_MAX 32     /* "SCRIPT LOAD: " and the like, before an error */

static const char *const pool_lua[POOL_SCRIPT_COUNT] = {
    [POOL_SCRIPT_ACQUIRE] =
        "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
        "  return {1, redis.call('GET', KEYS[2]) or '0'}\n"
        "end\n"
        "return {0, redis.call('PTTL', KEYS[1])}\n",
    [POOL_SCRIPT_RELEASE] =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
        "  redis.call('DEL', KEYS[1])\n"
        "  redis.call('PUBLISH', ARGV[2], KEYS[1])\n"
        "  return 1\n"
        "end\n"
        "return 0\n",
    [POOL_SCRIPT_EXTEND] =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
        "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
        "  return 1\n"
        "end\n"
        "return 0\n",
    [POOL_SCRIPT_RAISE] =
        "local c = tonumber(redis.call('GET', KEYS[1]) or '0')\n"
        "if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end\n"
        "return 1\n",
};

enum link_state { LINK_DOWN, LINK_CONNECTING, LINK_UP };

struct pool_link;

struct pool_req {
    struct list queue;              /* in link->queue, send order */
    struct pool_link *link;
    uint64_t deadline;              /* uv_now ms */
    uint64_t sent_ns;
    pool_reply_cb cb;
    void *ud;
    int script;                     /* enum pool_script, or -1 */
    int nkeys;
    int argc;                       /* words in argv */
    bool retried;                   /* NOSCRIPT fallback already used */
    char **argv;                    /* (owned) points into this allocation */
    size_t *lens;
};

struct pool_node;

/* A release to send when a node is back: it may still execute requests
 * that were buffered on its old connection when it stopped answering. */
struct pool_cleanup {
    struct list link;               /* in node->cleanups, oldest first */
    size_t keylen;
    char token[41];
    char key[];
};

#define POOL_MAX_CLEANUPS 65536

struct pool_link {
    struct pool_node *node;
    redisAsyncContext *ac;          /* (hiredis-owned) NULL when down */
    enum link_state state;
    bool subscriber;
    struct list queue;              /* pool_reqs awaiting a reply */
    uint64_t connect_deadline;
    uint64_t last_progress;         /* last reply, or first send into an
                                       empty queue (uv_now ms) */
    bool graced;                    /* got one extra period since then */
    struct timer timer;             /* earliest deadline of this link */
};

struct pool_node {
    int idx;
    const struct conf_addr *addr;
    struct pool_link *links;        /* pool_size data links */
    struct pool_link sub;           /* release notifications */
    unsigned nup;                   /* data links in LINK_UP */
    unsigned rr;                    /* round-robin cursor */
    bool failed;                    /* between node_fail and reconnect */
    bool down_logged;               /* warned once since it was last up */
    unsigned backoff_ms;
    struct timer reconnect_timer;

    char run_id[POOL_RUN_ID_MAX + 1]; /* last run_id seen, "" if never */
    bool aof_always;
    bool recovering;                /* restarted: not voting yet */
    uint64_t recover_at;            /* earliest readmission (uv_now ms) */
    struct timer recover_timer;
    int repair_wait;                /* GET replies outstanding */
    int repair_ok;
    uint64_t repair_max;

    struct list cleanups;           /* pool_cleanups owed once it is up */
    size_t ncleanups;

    uint64_t requests, errors, timeouts, reconnects, restarts;
    double latency_ms;              /* moving average */
    double latency_max_ms;
    char last_error[POOL_ERR_SIZE];
};

static struct {
    uv_loop_t *loop;
    const struct conf *conf;
    pool_release_cb on_release;
    struct pool_node *nodes;
    int nnodes;
    bool stopping;
    uint64_t inflight;                  /* requests awaiting replies */
    uint64_t max_fence;                 /* largest fence seen or issued */
    char sha[POOL_SCRIPT_COUNT][POOL_SHA_LEN + 1]; /* "" until loaded */
} P;

static void link_connect(struct pool_link *l);
static void node_fail(struct pool_node *n, const char *why);
static void node_repair(struct pool_node *n);

/* ---- request queue of a link ------------------------------------------ */

static void link_arm(struct pool_link *l)
{
    uint64_t due = UINT64_MAX;
    if (l->state == LINK_CONNECTING)
        due = l->connect_deadline;
    struct pool_req *oldest = list_entry(list_first(&l->queue),
                                         struct pool_req, queue);
    if (oldest) {
        /* A node that keeps answering is alive even when a burst queues a
         * request behind thousands of others: time out only when the
         * oldest request is overdue *and* nothing came back meanwhile. */
        uint64_t d = oldest->deadline;
        uint64_t quiet = l->last_progress + P.conf->redis.command_timeout_ms;
        if (quiet > d)
            d = quiet;
        if (d < due)
            due = d;
    }
    if (due == UINT64_MAX)
        timer_stop(&l->timer);
    else
        timer_start_at(&l->timer, due);
}

/* A copy of the request, or NULL (logged) when it has more words than
 * link_send has room for. */
static struct pool_req *req_create(int script, int nkeys, int argc,
                                   const char **argv, const size_t *lens)
{
    size_t bytes = 0;

    if (argc > POOL_MAX_ARGS) {
        log_error("a redis request of %d words (at most %d): not sent", argc,
                  POOL_MAX_ARGS);
        return NULL;
    }
    for (int i = 0; i < argc; i++)
        bytes += lens[i] + 1;
    size_t size = sizeof(struct pool_req) + (size_t)argc * (sizeof(char *) +
                  sizeof(size_t)) + bytes;
    struct pool_req *q = mem_alloc(size);
    q->argv = (char **)(void *)(q + 1);
    q->lens = (size_t *)(void *)(q->argv + argc);
    char *p = (char *)(q->lens + argc);
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        p[lens[i]] = '\0';
        q->argv[i] = p;
        q->lens[i] = lens[i];
        p += lens[i] + 1;
    }
    list_init(&q->queue);
    q->script = script;
    q->nkeys = nkeys;
    q->argc = argc;
    return q;
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* Hand q to hiredis on l; 0, or -1 with q still owned by the caller. */
static int link_send(struct pool_link *l, struct pool_req *q)
{
    const char *argv[POOL_EVAL_WORDS + POOL_MAX_ARGS];
    size_t lens[POOL_EVAL_WORDS + POOL_MAX_ARGS];
    char nkeys[POOL_NUM_SIZE];
    int argc = 0;

    /* req_create admits at most POOL_MAX_ARGS words, so argv has room. */
    if (q->script >= 0) {
        bool by_sha = !q->retried && P.sha[q->script][0];
        argv[argc] = by_sha ? "EVALSHA" : "EVAL";
        lens[argc++] = by_sha ? 7 : 4;
        argv[argc] = by_sha ? P.sha[q->script] : pool_lua[q->script];
        lens[argc] = strlen(argv[argc]);
        argc++;
        snprintf(nkeys, sizeof(nkeys), "%d", q->nkeys);
        argv[argc] = nkeys;
        lens[argc++] = strlen(nkeys);
    }
    for (int i = 0; i < q->argc; i++) {
        argv[argc] = q->argv[i];
        lens[argc++] = q->lens[i];
    }
    if (!l->ac || redisAsyncCommandArgv(l->ac, link_on_reply, q, argc, argv,
                                        lens) != REDIS_OK)
        return -1;
    q->sent_ns = uv_hrtime();
    q->deadline = timer_now() + P.conf->redis.command_timeout_ms;
    if (l->state == LINK_CONNECTING && q->deadline < l->connect_deadline)
        q->deadline = l->connect_deadline;
    if (list_empty(&l->queue)) {
        l->last_progress = timer_now();
        l->graced = false;
    }
    q->link = l;
    list_push_tail(&l->queue, &q->queue);
    link_arm(l);
    l->node->requests++;
    P.inflight++;
    return 0;
}

static void node_note_latency(struct pool_node *n, uint64_t sent_ns)
{
    double ms = (double)(uv_hrtime() - sent_ns) / 1e6;
    n->latency_ms = n->latency_ms == 0 ? ms : n->latency_ms * 0.9 + ms * 0.1;
    if (ms > n->latency_max_ms)
        n->latency_max_ms = ms;
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct pool_req *q = privdata;
    struct pool_link *l = q->link;
    struct pool_node *n = l->node;
    redisReply *r = reply;

    list_remove(&q->queue);
    P.inflight--;
    if (!r) {
        /* The connection failed (or we are dropping it): fail the node once,
         * unless this context was already detached by node_fail. */
        if (l->ac == ac)
            node_fail(n, ac->errstr[0] ? ac->errstr : "connection lost");
    } else {
        l->last_progress = timer_now();
        l->graced = false;
        link_arm(l);
        node_note_latency(n, q->sent_ns);
        if (r->type == REDIS_REPLY_ERROR) {
            if (q->script >= 0 && !q->retried &&
                strncmp(r->str, "NOSCRIPT", 8) == 0 && l->ac == ac) {
                /* A restarted or flushed node lost its script cache. */
                log_info("redis %s: NOSCRIPT, falling back to EVAL",
                         n->addr->text);
                q->retried = true;
                if (link_send(l, q) == 0)
                    return;
            }
            n->errors++;
            snprintf(n->last_error, sizeof(n->last_error), "%s", r->str);
        }
    }
    q->cb(q->ud, n->idx, r);
    free(q);
}

/* ---- connection lifecycle ---------------------------------------------- */

static void link_drop(struct pool_link *l)
{
    redisAsyncContext *ac = l->ac;

    if (l->state == LINK_UP && !l->subscriber)
        l->node->nup--;
    l->state = LINK_DOWN;
    l->ac = NULL;
    timer_stop(&l->timer);
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac);     /* runs pending callbacks with NULL */
    }
}

static void node_reconnect_cb(struct timer *t)
{
    struct pool_node *n = t->data;

    if (P.stopping)
        return;
    n->failed = false;
    if (n->run_id[0])
        n->reconnects++;
    for (unsigned i = 0; i < P.conf->redis.pool_size; i++)
        link_connect(&n->links[i]);
    link_connect(&n->sub);
}

static void node_fail(struct pool_node *n, const char *why)
{
    if (n->failed)
        return;
    n->failed = true;
    snprintf(n->last_error, sizeof(n->last_error), "%s", why);
    if (!n->down_logged && !P.stopping)
        log_warn("redis %s: down (%s)", n->addr->text, why);
    else
        log_debug("redis %s: still down (%s)", n->addr->text, why);
    n->down_logged = true;
    for (unsigned i = 0; i < P.conf->redis.pool_size; i++)
        link_drop(&n->links[i]);
    link_drop(&n->sub);
    if (P.stopping)
        return;
    timer_start(&n->reconnect_timer, n->backoff_ms);
    n->backoff_ms *= 2;
    if (n->backoff_ms > P.conf->redis.reconnect_max_ms)
        n->backoff_ms = P.conf->redis.reconnect_max_ms;
}

/*
 * Was the deadline missed because this loop was busy rather than because
 * the node was silent? libuv runs timers before polling, with a clock read
 * at the start of the iteration: after a long pass (closing 10000 sessions
 * at once, say) a deadline can expire before our requests were even
 * written, or before replies already in the socket were read. Then give
 * the node one more period, once per stall.
 */
static bool link_loop_was_late(struct pool_link *l)
{
    uint64_t now = uv_hrtime() / 1000000u;
    uint64_t period = P.conf->redis.command_timeout_ms;
    bool unsent = l->ac && l->ac->c.obuf && l->ac->c.obuf[0];

    if (l->graced || (!unsent && now < l->timer.due + period / 2))
        return false;
    l->graced = true;
    uv_update_time(P.loop);
    l->last_progress = timer_now();
    link_arm(l);
    return true;
}

static void link_timeout_cb(struct timer *t)
{
    struct pool_link *l = t->data;
    struct pool_node *n = l->node;

    if (link_loop_was_late(l))
        return;
    if (l->state == LINK_CONNECTING) {
        node_fail(n, "connect timeout");
    } else {
        n->timeouts++;
        node_fail(n, "command timeout");
    }
}

static void cleanup_reply(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;
}

/* Send what this node is owed, oldest first; one the pool cannot take
 * stays owed (sending never calls back into this list). */
static void node_send_cleanups(struct pool_node *n)
{
    struct list *pos, *tmp;
    size_t sent = 0;

    list_foreach_safe(pos, tmp, &n->cleanups) {
        struct pool_cleanup *c = list_entry(pos, struct pool_cleanup, link);
        const char *argv[3] = { c->key, c->token, P.conf->locks.release_channel };
        size_t lens[3] = { c->keylen, strlen(c->token), strlen(argv[2]) };
        if (pool_script(n->idx, POOL_SCRIPT_RELEASE, 1, 2, argv, lens,
                        cleanup_reply, NULL) != 0)
            continue;
        list_remove(pos);
        n->ncleanups--;
        free(c);
        sent++;
    }
    if (sent)
        log_info("redis %s: sent %zu owner-checked releases held back while "
                 "it was down", n->addr->text, sent);
}

void pool_release_later(int node, const char *key, size_t keylen,
                        const char *token)
{
    struct pool_node *n = &P.nodes[node];

    if (P.stopping)
        return;
    if (n->ncleanups >= POOL_MAX_CLEANUPS) {
        log_warn("redis %s: too many releases held back; %.*s will expire "
                 "by its ttl there", n->addr->text, (int)keylen, key);
        return;
    }
    struct pool_cleanup *c = mem_alloc(sizeof(*c) + keylen + 1);
    memcpy(c->key, key, keylen);
    c->keylen = keylen;
    snprintf(c->token, sizeof(c->token), "%s", token);
    list_push_tail(&n->cleanups, &c->link);
    n->ncleanups++;
}

void pool_note_fence(uint64_t fence)
{
    if (fence > P.max_fence)
        P.max_fence = fence;
}

static void node_came_up(struct pool_node *n, const char *run_id)
{
    n->backoff_ms = POOL_BACKOFF_MIN_MS;
    n->down_logged = false;
    if (n->run_id[0] && strcmp(n->run_id, run_id) != 0) {
        uint64_t delay = 0;
        if (!n->aof_always) {
            const struct conf *c = P.conf;
            delay = c->locks.max_ttl_ms +
                    (uint64_t)(c->locks.max_ttl_ms * c->locks.drift_factor) + 2;
        }
        n->restarts++;
        n->recovering = true;
        n->recover_at = timer_now() + delay;
        timer_start(&n->recover_timer, delay);
        log_warn("redis %s: restarted (run_id %s -> %s); not voting for "
                 "%" PRIu64 " ms, until keys it may have lost have expired "
                 "and its fence counter is repaired",
                 n->addr->text, n->run_id, run_id, delay);
    } else {
        log_notice("redis %s: up%s", n->addr->text,
                   n->recovering ? " (still recovering from a restart)" : "");
    }
    snprintf(n->run_id, sizeof(n->run_id), "%s", run_id);
    node_send_cleanups(n);
}

static void link_ready(struct pool_link *l, const char *run_id)
{
    struct pool_node *n = l->node;

    l->state = LINK_UP;
    link_arm(l);
    if (l->subscriber)
        return;
    if (n->nup++ == 0)
        node_came_up(n, run_id);
}

/*
 * Handshake replies. `node` says whose reply it is; ud is NULL, or for
 * SCRIPT LOAD the SHA slot of the script it loaded, or for INFO (the last
 * step) the link. Any error fails the node.
 */
static bool hs_check(int node, redisReply *r, const char *what)
{
    struct pool_node *n = &P.nodes[node];

    if (!r)
        return false;   /* the node already failed */
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[POOL_HS_STEP_MAX + POOL_ERR_SIZE];
        snprintf(msg, sizeof(msg), "%s: %s", what, r->str);
        log_error("redis %s: %s", n->addr->text, msg);
        node_fail(n, msg);
        return false;
    }
    return true;
}

static void hs_auth_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    hs_check(node, r, "AUTH");
}

static void hs_select_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    hs_check(node, r, "SELECT");
}

static void hs_script_cb(void *ud, int node, redisReply *r)
{
    char *sha = ud;     /* P.sha[] of the script this link loaded */

    if (!hs_check(node, r, "SCRIPT LOAD"))
        return;
    if (r->type != REDIS_REPLY_STRING || r->len != POOL_SHA_LEN)
        return;
    if (!sha[0]) {
        memcpy(sha, r->str, POOL_SHA_LEN);
        sha[POOL_SHA_LEN] = '\0';
    }
}

/* "CONFIG GET x" answers {x, value}: the value, or NULL when CONFIG is
 * renamed or forbidden. */
static const char *hs_config_value(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return NULL;
    return r->element[1]->str;
}

static void hs_config_cb(void *ud, int node, redisReply *r)
{
    const char *v = hs_config_value(r);
    (void)ud;
    /* Without an answer the last one stands (at first: no AOF guarantee). */
    if (v)
        P.nodes[node].aof_always = strcmp(v, "always") == 0;
}

static void hs_config_aof_cb(void *ud, int node, redisReply *r)
{
    const char *v = hs_config_value(r);
    (void)ud;
    if (v && strcmp(v, "yes") != 0)
        P.nodes[node].aof_always = false;
}

static void hs_info_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    char run_id[POOL_RUN_ID_MAX + 1] = "";

    if (!hs_check(node, r, "INFO"))
        return;
    if (l->state != LINK_CONNECTING)
        return;
    if (r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "run_id:");
        if (p) {
            p += 7;
            size_t k = strcspn(p, "\r\n");
            if (k >= sizeof(run_id))
                k = sizeof(run_id) - 1;
            memcpy(run_id, p, k);
            run_id[k] = '\0';
        }
    }
    link_ready(l, run_id);
}

static int hs_send(struct pool_link *l, pool_reply_cb cb, void *ud, int argc,
                   const char **argv)
{
    size_t lens[POOL_MAX_ARGS];
    for (int i = 0; i < argc && i < POOL_MAX_ARGS; i++)
        lens[i] = strlen(argv[i]);
    struct pool_req *q = req_create(-1, 0, argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    if (link_send(l, q) != 0) {
        free(q);
        return -1;
    }
    return 0;
}

static void sub_on_message(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct pool_link *l = privdata;
    redisReply *r = reply;
    (void)ac;

    if (!r || l->ac != ac)
        return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(r->element[0]->str, "subscribe") == 0) {
        if (l->state == LINK_CONNECTING)
            link_ready(l, "");
        return;
    }
    if (strcmp(r->element[0]->str, "message") == 0 &&
        r->element[2]->type == REDIS_REPLY_STRING && P.on_release)
        P.on_release(r->element[2]->str, r->element[2]->len);
}

static void link_handshake(struct pool_link *l)
{
    const struct conf *c = P.conf;
    int rc = 0;

    if (c->redis.password) {
        const char *argv[3] = { "AUTH", c->redis.username, c->redis.password };
        if (c->redis.username)
            rc |= hs_send(l, hs_auth_cb, NULL, 3, argv);
        else {
            argv[1] = c->redis.password;
            rc |= hs_send(l, hs_auth_cb, NULL, 2, argv);
        }
    }
    if (l->subscriber) {
        const char *argv[2] = { "SUBSCRIBE", c->locks.release_channel };
        size_t lens[2] = { 9, strlen(c->locks.release_channel) };
        if (rc == 0 && redisAsyncCommandArgv(l->ac, sub_on_message, l, 2,
                                             argv, lens) != REDIS_OK)
            rc = -1;
    } else {
        char db[POOL_NUM_SIZE];
        snprintf(db, sizeof(db), "%d", c->redis.db);
        const char *sel[2] = { "SELECT", db };
        if (c->redis.db != 0)
            rc |= hs_send(l, hs_select_cb, NULL, 2, sel);
        for (int s = 0; s < POOL_SCRIPT_COUNT; s++) {
            const char *argv[3] = { "SCRIPT", "LOAD", pool_lua[s] };
            rc |= hs_send(l, hs_script_cb, P.sha[s], 3, argv);
        }
        const char *cfg[3] = { "CONFIG", "GET", "appendfsync" };
        const char *aof[3] = { "CONFIG", "GET", "appendonly" };
        const char *info[2] = { "INFO", "server" };
        rc |= hs_send(l, hs_config_cb, NULL, 3, cfg);
        rc |= hs_send(l, hs_config_aof_cb, NULL, 3, aof);
        rc |= hs_send(l, hs_info_cb, l, 2, info);
    }
    if (rc != 0)
        node_fail(l->node, "could not queue the handshake");
}

static void link_on_connect(const redisAsyncContext *ac, int status)
{
    struct pool_link *l = ac->data;

    if (!l || l->ac != ac)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback returns. */
        char why[POOL_ERR_SIZE];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        l->ac = NULL;
        ((redisAsyncContext *)ac)->data = NULL;
        node_fail(l->node, why[0] ? why : "connect failed");
    }
}

static void link_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct pool_link *l = ac->data;
    (void)status;

    if (!l || l->ac != ac)
        return;
    char why[POOL_ERR_SIZE];
    snprintf(why, sizeof(why), "%s", ac->errstr[0] ? ac->errstr :
             "connection closed");
    l->ac = NULL;   /* hiredis frees it after this callback */
    node_fail(l->node, why);
}

static void link_connect(struct pool_link *l)
{
    const struct conf_addr *a = l->node->addr;
    redisAsyncContext *ac;

    if (l->node->failed)
        return;
    if (a->kind == CONF_ADDR_UNIX)
        ac = redisAsyncConnectUnix(a->path);
    else
        ac = redisAsyncConnect(a->host, a->port);
    if (!ac) {
        node_fail(l->node, "out of memory");
        return;
    }
    if (ac->err) {
        char why[POOL_ERR_SIZE];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        node_fail(l->node, why);
        return;
    }
    if (redis_uv_attach(ac, P.loop) != 0) {
        redisAsyncFree(ac);
        node_fail(l->node, "cannot attach to the event loop");
        return;
    }
    ac->data = l;
    redisAsyncSetConnectCallback(ac, link_on_connect);
    redisAsyncSetDisconnectCallback(ac, link_on_disconnect);
    l->ac = ac;
    l->state = LINK_CONNECTING;
    l->connect_deadline = timer_now() + P.conf->redis.connect_timeout_ms;
    link_arm(l);
    link_handshake(l);
}

/* ---- repair of a restarted node ---------------------------------------- */

static void repair_raise_cb(void *ud, int node, redisReply *r)
{
    struct pool_node *n = ud;
    (void)node;

    if (P.stopping)
        return;
    if (r && r->type == REDIS_REPLY_INTEGER) {
        n->recovering = false;
        log_notice("redis %s: rejoined after restart (fence counter raised "
                   "to %" PRIu64 ")", n->addr->text, n->repair_max);
        return;
    }
    timer_start(&n->recover_timer, POOL_REPAIR_RETRY_MS);
}

static void repair_read_cb(void *ud, int node, redisReply *r)
{
    struct pool_node *n = ud;

    if (P.stopping)
        return;     /* no timers once the pool is going away */
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL)) {
        uint64_t v = r->type == REDIS_REPLY_STRING ?
                     strtoull(r->str, NULL, 10) : 0;
        if (v > n->repair_max)
            n->repair_max = v;
        n->repair_ok++;
    }
    (void)node;
    if (--n->repair_wait > 0)
        return;
    if (!pool_node_up(n->idx)) {
        timer_start(&n->recover_timer, POOL_REPAIR_RETRY_MS);
        return;
    }
    if (n->repair_ok < pool_quorum()) {
        /* With one or two nodes the others can never make a quorum; fall
         * back on the largest fence this daemon has seen, and say that the
         * fence guarantee now rests on it. */
        if (P.nnodes - 1 >= pool_quorum() || n->aof_always) {
            log_info("redis %s: fence repair read %d of the %d counters it "
                     "needs; retrying", n->addr->text, n->repair_ok,
                     pool_quorum());
            timer_start(&n->recover_timer, POOL_REPAIR_RETRY_MS);
            return;
        }
        log_warn("redis %s: too few nodes to read the fence counter from; "
                 "raising it to the largest fence this daemon has seen "
                 "(%" PRIu64 "). Fences stay monotonic only for locks taken "
                 "through daemons that saw it.", n->addr->text, P.max_fence);
    }
    if (P.max_fence > n->repair_max)
        n->repair_max = P.max_fence;
    char val[POOL_NUM_SIZE];
    snprintf(val, sizeof(val), "%" PRIu64, n->repair_max);
    const char *argv[2] = { P.conf->locks.fence_key, val };
    size_t lens[2] = { strlen(argv[0]), strlen(val) };
    if (pool_script(n->idx, POOL_SCRIPT_RAISE, 1, 1, argv, lens,
                    repair_raise_cb, n) != 0)
        timer_start(&n->recover_timer, POOL_REPAIR_RETRY_MS);
}

/* Read the fence counter from every node that can be trusted with it (the
 * voting ones, and this one too if its AOF loses nothing); once a quorum
 * answered, raise this node's counter to their maximum, then let it vote. */
static void node_repair(struct pool_node *n)
{
    const char *argv[2] = { "GET", P.conf->locks.fence_key };
    size_t lens[2] = { 3, strlen(P.conf->locks.fence_key) };

    n->repair_wait = 1;     /* held until every request is out */
    n->repair_ok = 0;
    n->repair_max = 0;
    for (int i = 0; i < P.nnodes; i++) {
        if (!pool_node_votes(i) && !(i == n->idx && n->aof_always))
            continue;
        n->repair_wait++;
        if (pool_command(i, 2, argv, lens, repair_read_cb, n) != 0)
            n->repair_wait--;
    }
    repair_read_cb(n, -1, NULL);
}

static void node_recover_cb(struct timer *t)
{
    struct pool_node *n = t->data;

    if (!n->recovering || P.stopping)
        return;
    if (!pool_node_up(n->idx)) {
        timer_start(&n->recover_timer, POOL_REPAIR_RETRY_MS);
        return;
    }
    node_repair(n);
}

/* ---- public ------------------------------------------------------------ */

static void link_init(struct pool_link *l, struct pool_node *n, bool sub)
{
    l->node = n;
    l->subscriber = sub;
    l->state = LINK_DOWN;
    list_init(&l->queue);
    timer_init(&l->timer, link_timeout_cb, l);
}

int pool_init(uv_loop_t *loop, const struct conf *conf,
              pool_release_cb on_release)
{
    P.loop = loop;
    P.conf = conf;
    P.on_release = on_release;
    P.nnodes = (int)conf->redis.nnodes;
    P.nodes = mem_alloc(sizeof(struct pool_node) * (size_t)P.nnodes);
    for (int i = 0; i < P.nnodes; i++) {
        struct pool_node *n = &P.nodes[i];
        n->idx = i;
        n->addr = &conf->redis.nodes[i];
        n->backoff_ms = POOL_BACKOFF_MIN_MS;
        list_init(&n->cleanups);
        n->links = mem_alloc(sizeof(struct pool_link) * conf->redis.pool_size);
        for (unsigned k = 0; k < conf->redis.pool_size; k++)
            link_init(&n->links[k], n, false);
        link_init(&n->sub, n, true);
        timer_init(&n->reconnect_timer, node_reconnect_cb, n);
        timer_init(&n->recover_timer, node_recover_cb, n);
    }
    for (int i = 0; i < P.nnodes; i++)
        node_reconnect_cb(&P.nodes[i].reconnect_timer);
    return 0;
}

void pool_shutdown(void)
{
    if (!P.nodes || P.stopping)
        return;
    P.stopping = true;
    for (int i = 0; i < P.nnodes; i++) {
        struct pool_node *n = &P.nodes[i];
        n->failed = true;
        for (unsigned k = 0; k < P.conf->redis.pool_size; k++)
            link_drop(&n->links[k]);
        link_drop(&n->sub);
    }
    /* Only now: dropping a link runs callbacks that may touch any node. */
    for (int i = 0; i < P.nnodes; i++) {
        timer_stop(&P.nodes[i].reconnect_timer);
        timer_stop(&P.nodes[i].recover_timer);
    }
}

void pool_free(void)
{
    if (!P.nodes)
        return;
    for (int i = 0; i < P.nnodes; i++) {
        struct list *pos, *tmp;
        list_foreach_safe(pos, tmp, &P.nodes[i].cleanups)
            free(list_entry(pos, struct pool_cleanup, link));
        free(P.nodes[i].links);
    }
    free(P.nodes);
    P.nodes = NULL;
}

bool pool_busy(void)
{
    return P.inflight > 0;
}

int pool_nnodes(void)
{
    return P.nnodes;
}

int pool_quorum(void)
{
    return P.nnodes / 2 + 1;
}

bool pool_node_up(int node)
{
    const struct pool_node *n = &P.nodes[node];
    return !n->failed && n->nup > 0;
}

bool pool_node_votes(int node)
{
    return pool_node_up(node) && !P.nodes[node].recovering;
}

int pool_nodes_voting(void)
{
    int k = 0;
    for (int i = 0; i < P.nnodes; i++)
        k += pool_node_votes(i);
    return k;
}

const char *pool_node_name(int node)
{
    return P.nodes[node].addr->text;
}

static struct pool_link *node_pick(struct pool_node *n)
{
    unsigned size = P.conf->redis.pool_size;
    for (unsigned i = 0; i < size; i++) {
        struct pool_link *l = &n->links[(n->rr + i) % size];
        if (l->state == LINK_UP && l->ac) {
            n->rr = (n->rr + i + 1) % size;
            return l;
        }
    }
    return NULL;
}

static int node_send(int node, struct pool_req *q)
{
    struct pool_node *n = &P.nodes[node];
    struct pool_link *l = NULL;

    if (!P.stopping && pool_node_up(node))
        l = node_pick(n);
    if (!l || link_send(l, q) != 0) {
        free(q);
        return -1;
    }
    return 0;
}

int pool_script(int node, enum pool_script s, int nkeys, int nargs,
                const char **argv, const size_t *lens,
                pool_reply_cb cb, void *ud)
{
    struct pool_req *q = req_create((int)s, nkeys, nkeys + nargs, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return node_send(node, q);
}

int pool_command(int node, int argc, const char **argv, const size_t *lens,
                 pool_reply_cb cb, void *ud)
{
    struct pool_req *q = req_create(-1, 0, argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return node_send(node, q);
}

json_t *pool_stats_json(void)
{
    json_t *arr = json_array();
    uint64_t now = timer_now();

    for (int i = 0; i < P.nnodes; i++) {
        const struct pool_node *n = &P.nodes[i];
        json_t *o = json_pack("{s:s, s:b, s:b, s:b, s:I, s:I, s:I, s:I, s:I,"
                              " s:f, s:f, s:s, s:s}",
            "node", n->addr->text,
            "up", pool_node_up(i),
            "voting", pool_node_votes(i),
            "recovering", n->recovering,
            "requests", (json_int_t)n->requests,
            "errors", (json_int_t)n->errors,
            "timeouts", (json_int_t)n->timeouts,
            "reconnects", (json_int_t)n->reconnects,
            "restarts", (json_int_t)n->restarts,
            "latency_ms", n->latency_ms,
            "latency_max_ms", n->latency_max_ms,
            "run_id", n->run_id,
            "last_error", n->last_error);
        if (n->recovering)
            json_object_set_new(o, "rejoin_in_ms", json_integer(
                n->recover_at > now ? (json_int_t)(n->recover_at - now) : 0));
        json_array_append_new(arr, o);
    }
    return arr;
}
