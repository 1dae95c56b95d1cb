/*
 * pool: see pool.h.
 *
 * Ownership: pool_init allocates the nodes and their links, pool_free frees
 * them; the pool owns every pool_req from send until its reply callback has
 * run. hiredis owns the redisAsyncContext; we drop our pointer to it (l->ac =
 * NULL, ac->data = NULL) *before* asking hiredis to free it, so callbacks
 * hiredis runs while freeing (NULL replies, onDisconnect) never reach a link
 * through a context that is going away.
 */
#include "pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <hiredis/async.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "num.h"
#include "redis_uv.h"
#include "script.h"
#include "timer.h"

#define POOL_BACKOFF_MIN_MS 100
#define POOL_SHA_LEN 40         /* hex chars of a script's SHA1 (SCRIPT LOAD) */
#define POOL_EVAL_WORDS 3       /* EVALSHA sha numkeys, before a script's words */
#define POOL_HS_STEP_MAX 32     /* "SCRIPT LOAD: " and the like, before an error */
#define POOL_HS_ARGS_MAX 8      /* the words of a handshake command */
#define POOL_KEEPALIVE_S 15     /* TCP keepalive idle time on node links */
#define POOL_LINK_FILL 64       /* requests out on a link before the next
                                   takes some (pool_node_pick) */
#define POOL_PROBE_SUFFIX ":probe:" /* probe channel: release channel, this,
                                       the instance id */
#define POOL_WATCH_SUFFIX ":watch"  /* watch channel: release channel, this */

enum link_state { LINK_DOWN, LINK_CONNECTING, LINK_UP };

struct pool_link;

struct pool_req {
    struct list queue;              /* in link->queue, send order */
    struct pool_link *link;
    uint64_t deadline;              /* uv_now ms */
    uint64_t sent_ns;
    pool_reply_cb cb;
    void *ud;
    bool retried;                   /* NOSCRIPT fallback already used */
    struct script_words w;          /* its words, copied into this
                                       allocation (argv, lens) */
};

struct pool_node;

struct pool_link {
    struct pool_node *node;
    redisAsyncContext *ac;          /* (hiredis-owned) NULL when down */
    enum link_state state;
    bool subscriber;
    struct list queue;              /* pool_reqs awaiting a reply */
    unsigned nqueue;                /* of them */
    struct list pending;            /* pool_reqs gathered this loop turn,
                                       not yet sent ("Group commit") */
    struct list pend_link;          /* in pool.pended while some are */
    uint64_t connect_deadline;
    uint64_t last_progress;         /* last reply, or first send into an
                                       empty queue (uv_now ms) */
    bool graced;                    /* got one extra period since then */
    struct timer timer;             /* earliest deadline of this link */
    struct timer probe_timer;       /* probe_interval_ms after last_send
                                       (data) or last_recv (subscriber) */
    uint64_t last_send;             /* data: last request written (uv_now) */
    bool fsync_always, aof_on;      /* data: what this handshake read */
    /* Subscriber only: */
    uint64_t last_recv;             /* last message or subscribe reply */
    uint64_t probe_seq;             /* the probe message awaited */
    uint64_t probe_deadline;        /* by when it must arrive, 0 if none */
    bool probe_refused;             /* PUBLISH not allowed: not probed */
};

struct pool_node {
    int idx;
    const struct conf_addr *addr;
    struct pool_link *links;        /* pool_size data links */
    struct pool_link sub;           /* release notifications */
    unsigned nup;                   /* data links in LINK_UP */
    bool failed;                    /* between pool_node_fail and reconnect */
    bool identified;                /* came up with a run_id: connecting
                                       again counts as a reconnect */
    unsigned backoff_ms;
    struct timer reconnect_timer;
    uint64_t probe_seq;             /* last probe message number sent */

    struct pool_node_stats st;
};

static struct {
    uv_loop_t *loop;
    const struct conf *conf;
    struct pool_hooks hooks;            /* the user's, copied at init */
    struct pool_node *nodes;
    int nnodes;
    bool stopping;
    uint64_t inflight;                  /* requests awaiting replies */
    char sha[SCRIPT_COUNT][POOL_SHA_LEN + 1]; /* "" until loaded */
    char instance_id[POOL_INSTANCE_ID_LEN + 1];
    char *probe_channel;                /* (owned) see POOL_PROBE_SUFFIX */
    char *watch_channel;                /* (owned) see POOL_WATCH_SUFFIX */
    char *cmd;                          /* (owned) resp_format's buffer */
    size_t cmdcap;
    struct list pended;                 /* links with pending requests */
} pool;

/* Outside pool: pool_init keeps it. */
static pool_reply_time_fn *reply_observer;

void pool_set_reply_observer(pool_reply_time_fn *fn)
{
    reply_observer = fn;
}

static void link_connect(struct pool_link *l);
static void pool_node_fail(struct pool_node *n, const char *why);

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
        uint64_t quiet = l->last_progress + pool.conf->redis.command_timeout_ms;
        if (quiet > d)
            d = quiet;
        if (d < due)
            due = d;
    }
    if (l->probe_deadline && l->probe_deadline < due)
        due = l->probe_deadline;
    if (due == UINT64_MAX)
        timer_stop(&l->timer);
    else
        timer_start_at(&l->timer, due);
}

/* A copy of the call's words, or NULL (logged) when it has more than
 * link_send has room for. */
static struct pool_req *req_create(const struct script_words *w)
{
    size_t bytes = 0;
    int argc = w->argc;
    int max = w->script == SCRIPT_GROUP ? SCRIPT_MAX_WORDS_GROUP
                                        : SCRIPT_MAX_WORDS;

    if (argc > max) {
        log_error("a redis request of %d words (at most %d): not sent", argc,
                  max);
        return NULL;
    }
    for (int i = 0; i < argc; i++)
        bytes += w->lens[i] + 1;
    size_t size = sizeof(struct pool_req) + (size_t)argc * (sizeof(char *) +
                  sizeof(size_t)) + bytes;
    struct pool_req *q = mem_alloc(size);
    char **argv = (char **)(void *)(q + 1);
    size_t *lens = (size_t *)(void *)(argv + argc);
    char *p = (char *)(lens + argc);
    for (int i = 0; i < argc; i++) {
        memcpy(p, w->argv[i], w->lens[i]);
        p[w->lens[i]] = '\0';
        argv[i] = p;
        lens[i] = w->lens[i];
        p += w->lens[i] + 1;
    }
    list_init(&q->queue);
    q->w = *w;
    q->w.argv = (const char *const *)argv;
    q->w.lens = lens;
    return q;
}

/* A plain command's request (no script). */
static struct pool_req *req_command(int argc, const char *const *argv,
                                    const size_t *lens)
{
    const struct script_words w = {
        .script = SCRIPT_COMMAND, .argc = argc, .argv = argv, .lens = lens,
    };

    return req_create(&w);
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* One RESP bulk string at p; past it. */
static char *put_bulk(char *p, const char *s, size_t len)
{
    *p++ = '$';
    p = proto_write_u64(p, len);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* q as a RESP array in pool.cmd, the bytes redisAsyncCommandArgv would
 * write: hiredis formats with its own printf (sdscatfmt), which was the
 * daemon's biggest user-space cost. Returns the length. */
static size_t resp_format(const struct pool_req *q, bool by_sha)
{
    /* Around each word "$", its length's digits and two CRLFs (the
     * array's "*<n>" CRLF is shorter). */
    const size_t over = 1 + PROTO_U64_DIGITS + 4;
    const char *script = NULL;
    size_t scriptlen = 0, need = over;
    const struct script_words *w = &q->w;
    int words = w->argc;
    char nkeys[PROTO_U64_DIGITS];
    size_t nkeyslen = 0;

    if (w->script >= 0) {
        script = by_sha ? pool.sha[w->script] : script_lua[w->script];
        scriptlen = strlen(script);
        nkeyslen = (size_t)(proto_write_u64(nkeys, (uint64_t)w->nkeys) -
                            nkeys);
        need += 3 * over + 7 + scriptlen + nkeyslen;
        words += POOL_EVAL_WORDS;
    }
    for (int i = 0; i < w->argc; i++)
        need += over + w->lens[i];
    if (need > pool.cmdcap) {
        pool.cmd = mem_realloc(pool.cmd, need);
        pool.cmdcap = need;
    }

    char *p = pool.cmd;
    *p++ = '*';
    p = proto_write_u64(p, (uint64_t)words);
    *p++ = '\r';
    *p++ = '\n';
    if (script) {
        p = by_sha ? put_bulk(p, "EVALSHA", 7) : put_bulk(p, "EVAL", 4);
        p = put_bulk(p, script, scriptlen);
        p = put_bulk(p, nkeys, nkeyslen);
    }
    for (int i = 0; i < w->argc; i++)
        p = put_bulk(p, w->argv[i], w->lens[i]);
    return (size_t)(p - pool.cmd);
}

/* Hand q to hiredis on l; 0, or -1 with q still owned by the caller. */
static int link_send(struct pool_link *l, struct pool_req *q)
{
    bool by_sha = q->w.script >= 0 && !q->retried &&
                  pool.sha[q->w.script][0];

    if (!l->ac)
        return -1;
    size_t len = resp_format(q, by_sha);
    if (redisAsyncFormattedCommand(l->ac, link_on_reply, q, pool.cmd,
                                   len) != REDIS_OK)
        return -1;
    q->sent_ns = uv_hrtime();
    l->last_send = timer_now();
    q->deadline = timer_now() + pool.conf->redis.command_timeout_ms;
    if (l->state == LINK_CONNECTING && q->deadline < l->connect_deadline)
        q->deadline = l->connect_deadline;
    if (list_empty(&l->queue)) {
        l->last_progress = timer_now();
        l->graced = false;
    }
    q->link = l;
    list_push_tail(&l->queue, &q->queue);
    l->nqueue++;
    link_arm(l);
    l->node->st.requests++;
    l->node->st.calls++;
    pool.inflight++;
    return 0;
}

static void pool_node_note_latency(struct pool_node *n, uint64_t sent_ns)
{
    double ms = (double)(uv_hrtime() - sent_ns) / 1e6;
    n->st.latency_ms = n->st.latency_ms == 0 ? ms : n->st.latency_ms * 0.9 + ms * 0.1;
    if (ms > n->st.latency_max_ms)
        n->st.latency_max_ms = ms;
    if (reply_observer)
        reply_observer(n->idx, ms / 1000);
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct pool_req *q = privdata;
    struct pool_link *l = q->link;
    struct pool_node *n = l->node;
    redisReply *r = reply;

    list_remove(&q->queue);
    l->nqueue--;
    pool.inflight--;
    if (!r) {
        /* The connection failed (or we are dropping it): fail the node once,
         * unless this context was already detached by pool_node_fail. */
        if (l->ac == ac)
            pool_node_fail(n, ac->errstr[0] ? ac->errstr : "connection lost");
    } else {
        l->last_progress = timer_now();
        l->graced = false;
        n->st.last_answer_ms = timer_now();
        link_arm(l);
        pool_node_note_latency(n, q->sent_ns);
        if (r->type == REDIS_REPLY_ERROR) {
            if (q->w.script >= 0 && !q->retried &&
                strncmp(r->str, "NOSCRIPT", 8) == 0 && l->ac == ac) {
                /* A restarted or flushed node lost its script cache. */
                log_info("redis %s: NOSCRIPT, falling back to EVAL",
                         n->addr->text);
                q->retried = true;
                if (link_send(l, q) == 0)
                    return;
            }
            n->st.errors++;
            snprintf(n->st.last_error, sizeof(n->st.last_error), "%s", r->str);
        }
    }
    q->cb(q->ud, n->idx, r);
    free(q);
}

/* ---- group commit --------------------------------------------------------
 *
 * With redis.group_max above 1, what the pool's users send to a link during
 * one loop turn is not handed to hiredis at once but gathered on the link
 * (l->pending, in order) and handed over at the end of the turn, from
 * redis_uv's flush hook, just before the write that would have carried it
 * anyway: nothing waits longer than it did, and nothing waits at all when
 * a node is idle. There each run of consecutive ACQUIRE, ACQUIRE_SHARED,
 * ACQUIRE_MULTI, RELEASE and EXTEND requests that agree on the words they
 * share (the fence key, the guard, the release channel) becomes one GROUP
 * call of at most group_max of them (lua/group.lua), which answers each as
 * its own script would, in order; a run of one, and any other request, goes
 * out as it is. A node then parses, looks up and runs one script where it
 * ran many, and reads the guard, the fence counter and the longest-ttl
 * record once for all of them. The order of requests on a link is kept
 * (pool.h: a release goes behind its acquisition).
 */

/* A GROUP call in flight (its ud): the requests it answers. */
struct pool_group {
    unsigned n;
    struct pool_req *m[CONF_GROUP_MAX];
};

/* Fail q, which never reached the node: its callback, with NULL. */
static void req_fail(struct pool_req *q, int node)
{
    q->cb(q->ud, node, NULL);
    free(q);
}

static void group_on_reply(void *ud, int node, redisReply *r)
{
    /* What a request of the group is told when the answer is not one
     * element per request: it was not decided (never a vote). */
    static char odd_msg[] = "ERR GROUP answered something else than one "
                            "answer per request";
    static redisReply odd = { .type = REDIS_REPLY_ERROR, .str = odd_msg,
                              .len = sizeof(odd_msg) - 1 };
    struct pool_group *g = ud;
    struct pool_node *n = &pool.nodes[node];
    bool each = r && r->type == REDIS_REPLY_ARRAY && r->elements == g->n;

    if (r && !each && r->type != REDIS_REPLY_ERROR)
        r = &odd;
    for (unsigned i = 0; i < g->n; i++) {
        struct pool_req *q = g->m[i];
        redisReply *e = each ? r->element[i] : r;
        if (each && e->type == REDIS_REPLY_ERROR) {
            n->st.errors++;
            snprintf(n->st.last_error, sizeof(n->st.last_error), "%s",
                     e->str);
        }
        q->cb(q->ud, node, e);
        free(q);
    }
    free(g);
}

/* Send the gathered run on l: as the request itself when it is one,
 * else as one GROUP call (script_group_call). g and sg are used up. */
static void group_send(struct pool_link *l, struct pool_group *g,
                       const struct script_group *sg)
{
    static struct script_call c;    /* large; the loop has one thread */
    int node = l->node->idx;

    if (g->n == 1) {
        if (link_send(l, g->m[0]) != 0)
            req_fail(g->m[0], node);
        return;
    }
    script_group_call(sg, &c);
    struct pool_req *gq = req_create(&c.w);
    struct pool_group *sent = NULL;
    if (gq) {
        sent = mem_alloc(sizeof(*sent));
        *sent = *g;
        gq->cb = group_on_reply;
        gq->ud = sent;
    }
    if (!gq || link_send(l, gq) != 0) {
        free(gq);
        free(sent);
        for (unsigned i = 0; i < g->n; i++)
            req_fail(g->m[i], node);
        return;
    }
    l->node->st.requests += g->n - 1;
}

/* Hand l's pending requests to hiredis, in order, runs grouped. */
static void link_flush(struct pool_link *l)
{
    struct pool_group g = { 0 };
    struct script_group sg = { 0 };
    unsigned max = pool.conf->redis.group_max;
    struct list *p;

    while ((p = list_first(&l->pending))) {
        struct pool_req *q = list_entry(p, struct pool_req, queue);
        bool fits = script_group_fits(&sg, &q->w, max);
        list_remove(p);
        pool.inflight--;
        if (g.n && !fits) {
            group_send(l, &g, &sg);
            g = (struct pool_group){ 0 };
            sg = (struct script_group){ 0 };
            fits = script_group_fits(&sg, &q->w, max);
        }
        if (fits) {
            script_group_add(&sg, &q->w);
            g.m[g.n++] = q;
        } else if (link_send(l, q) != 0) {
            req_fail(q, l->node->idx);
        }
    }
    if (g.n)
        group_send(l, &g, &sg);
}

/* redis_uv's hook, at the end of a loop turn (see above). */
static void pool_flush(void)
{
    struct list *p;

    while ((p = list_first(&pool.pended))) {
        struct pool_link *l = container_of(p, struct pool_link, pend_link);
        list_remove(p);
        link_flush(l);
    }
}

/* Gather q on l for the end of the turn. */
static void link_pend(struct pool_link *l, struct pool_req *q)
{
    list_push_tail(&l->pending, &q->queue);
    pool.inflight++;
    if (!list_linked(&l->pend_link)) {
        list_push_tail(&pool.pended, &l->pend_link);
        redis_uv_want_flush();
    }
}

/* A dropped link's gathered requests fail as its sent ones do. When the
 * link is dropped from inside one of its reply callbacks (a read error:
 * hiredis then fails the sent requests one by one, and the first failure
 * drops the link), these fail before the sent ones still to be failed:
 * failures are not told in the order of sending. No caller relies on that
 * order: each counts a node's failed answer on its own. */
static void link_fail_pending(struct pool_link *l)
{
    struct list *p;

    if (list_linked(&l->pend_link))
        list_remove(&l->pend_link);
    while ((p = list_first(&l->pending))) {
        list_remove(p);
        pool.inflight--;
        req_fail(list_entry(p, struct pool_req, queue), l->node->idx);
    }
}

/* ---- connection lifecycle ---------------------------------------------- */

static void link_drop(struct pool_link *l)
{
    redisAsyncContext *ac = l->ac;

    if (l->state == LINK_UP && !l->subscriber)
        l->node->nup--;
    l->state = LINK_DOWN;
    l->ac = NULL;
    l->probe_deadline = 0;
    timer_stop(&l->timer);
    timer_stop(&l->probe_timer);
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac);     /* runs pending callbacks with NULL */
    }
    link_fail_pending(l);       /* then those gathered after them */
}

static void pool_node_reconnect_cb(struct timer *t)
{
    struct pool_node *n = t->data;

    if (pool.stopping)
        return;
    n->failed = false;
    if (n->identified)
        n->st.reconnects++;
    for (unsigned i = 0; i < pool.conf->redis.pool_size; i++)
        link_connect(&n->links[i]);
    link_connect(&n->sub);
}

static void pool_node_fail(struct pool_node *n, const char *why)
{
    if (n->failed)
        return;
    n->failed = true;
    snprintf(n->st.last_error, sizeof(n->st.last_error), "%s", why);
    if (pool.hooks.on_down)
        pool.hooks.on_down(n->idx, why);
    for (unsigned i = 0; i < pool.conf->redis.pool_size; i++)
        link_drop(&n->links[i]);
    link_drop(&n->sub);
    if (pool.stopping)
        return;
    timer_start(&n->reconnect_timer, n->backoff_ms);
    n->backoff_ms *= 2;
    if (n->backoff_ms > pool.conf->redis.reconnect_max_ms)
        n->backoff_ms = pool.conf->redis.reconnect_max_ms;
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
    uint64_t period = pool.conf->redis.command_timeout_ms;
    bool unsent = l->ac && l->ac->c.obuf && l->ac->c.obuf[0];

    if (l->graced || (!unsent && now < l->timer.due + period / 2))
        return false;
    l->graced = true;
    uv_update_time(pool.loop);
    l->last_progress = timer_now();
    if (l->probe_deadline)
        l->probe_deadline = timer_now() + period;
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
        pool_node_fail(n, "connect timeout");
    } else if (l->subscriber) {
        n->st.timeouts++;
        pool_node_fail(n, "probe timeout (subscriber connection)");
    } else {
        n->st.timeouts++;
        pool_node_fail(n, "command timeout");
    }
}

static void link_ready(struct pool_link *l, const char *run_id)
{
    struct pool_node *n = l->node;

    l->state = LINK_UP;
    l->last_recv = timer_now();
    link_arm(l);
    timer_start(&l->probe_timer, pool.conf->redis.probe_interval_ms);
    if (l->subscriber || n->nup++ > 0)
        return;
    n->backoff_ms = POOL_BACKOFF_MIN_MS;
    n->identified = run_id[0] != '\0';
    if (pool.hooks.on_up)
        pool.hooks.on_up(n->idx, run_id, l->fsync_always && l->aof_on);
}

/*
 * Handshake replies. `node` says whose reply it is; ud is NULL, or for
 * SCRIPT LOAD the SHA slot of the script it loaded, or for INFO (the last
 * step) the link. Any error fails the node.
 */
static bool hs_check(int node, redisReply *r, const char *what)
{
    struct pool_node *n = &pool.nodes[node];

    if (!r)
        return false;   /* the node already failed */
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[POOL_HS_STEP_MAX + POOL_ERR_SIZE];
        snprintf(msg, sizeof(msg), "%s: %s", what, r->str);
        log_error("redis %s: %s", n->addr->text, msg);
        pool_node_fail(n, msg);
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
    char *sha = ud;     /* pool.sha[] of the script this link loaded */

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

/* Both start false at every handshake: a node whose CONFIG is refused
 * makes no AOF promise, whatever its previous instance said. */
static void hs_config_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    const char *v = hs_config_value(r);
    (void)node;
    l->fsync_always = v && strcmp(v, "always") == 0;
}

static void hs_config_aof_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    const char *v = hs_config_value(r);
    (void)node;
    l->aof_on = v && strcmp(v, "yes") == 0;
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
    size_t lens[POOL_HS_ARGS_MAX];
    if (argc > POOL_HS_ARGS_MAX)
        return -1;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct pool_req *q = req_command(argc, argv, lens);
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

/* A release notification: "<key> <instance id>". Ours is dropped (our
 * own waiters hear of our releases directly); one without an id is a key
 * published by an older daemon. */
static void sub_on_release(const char *msg, size_t len)
{
    const size_t idlen = POOL_INSTANCE_ID_LEN;

    if (len > idlen + 1 && msg[len - idlen - 1] == ' ' &&
        strspn(msg + len - idlen, "0123456789abcdef") == idlen) {
        if (memcmp(msg + len - idlen, pool.instance_id, idlen) == 0)
            return;
        len -= idlen + 1;
    }
    if (pool.hooks.on_release)
        pool.hooks.on_release(msg, len);
}

/* A watch message (watch.c's words); every node carries it, and the
 * receiver takes repeats in its stride. */
static void sub_on_watch(const char *msg, size_t len)
{
    if (pool.hooks.on_watch)
        pool.hooks.on_watch(msg, len);
}

/* The subscriber heard its probe: it and its node are alive. */
static void sub_on_probe(struct pool_link *l, const redisReply *m)
{
    if (strtoull(m->str, NULL, 10) != l->probe_seq || !l->probe_deadline)
        return;
    l->probe_deadline = 0;
    l->graced = false;
    link_arm(l);
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
    l->last_recv = timer_now();
    l->node->st.last_answer_ms = l->last_recv;
    if (strcmp(r->element[0]->str, "subscribe") == 0) {
        if (l->state == LINK_CONNECTING)
            link_ready(l, "");
        return;
    }
    if (strcmp(r->element[0]->str, "message") != 0 ||
        r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(r->element[1]->str, pool.probe_channel) == 0)
        sub_on_probe(l, r->element[2]);
    else if (strcmp(r->element[1]->str, pool.watch_channel) == 0)
        sub_on_watch(r->element[2]->str, r->element[2]->len);
    else
        sub_on_release(r->element[2]->str, r->element[2]->len);
}

static void link_handshake(struct pool_link *l)
{
    const struct conf *c = pool.conf;
    int rc = 0;

    if (c->redis.password) {
        const char *argv[] = { "AUTH", c->redis.username, c->redis.password };
        if (c->redis.username)
            rc |= hs_send(l, hs_auth_cb, NULL, 3, argv);
        else {
            argv[1] = c->redis.password;
            rc |= hs_send(l, hs_auth_cb, NULL, 2, argv);
        }
    }
    if (l->subscriber) {
        const char *argv[] = { "SUBSCRIBE", c->locks.release_channel,
                               pool.probe_channel, pool.watch_channel };
        size_t lens[] = { 9, strlen(argv[1]), strlen(argv[2]),
                          strlen(argv[3]) };
        l->probe_refused = false;
        if (rc == 0 && redisAsyncCommandArgv(l->ac, sub_on_message, l, 4,
                                             argv, lens) != REDIS_OK)
            rc = -1;
    } else {
        char db[SCRIPT_NUM_SIZE];
        snprintf(db, sizeof(db), "%d", c->redis.db);
        const char *sel[] = { "SELECT", db };
        if (c->redis.db != 0)
            rc |= hs_send(l, hs_select_cb, NULL, 2, sel);
        for (int s = 0; s < SCRIPT_COUNT; s++) {
            const char *argv[] = { "SCRIPT", "LOAD", script_lua[s] };
            rc |= hs_send(l, hs_script_cb, pool.sha[s], 3, argv);
        }
        const char *cfg[] = { "CONFIG", "GET", "appendfsync" };
        const char *aof[] = { "CONFIG", "GET", "appendonly" };
        const char *info[] = { "INFO", "server" };
        l->fsync_always = l->aof_on = false;
        rc |= hs_send(l, hs_config_cb, l, 3, cfg);
        rc |= hs_send(l, hs_config_aof_cb, l, 3, aof);
        rc |= hs_send(l, hs_info_cb, l, 2, info);
    }
    if (rc != 0)
        pool_node_fail(l->node, "could not queue the handshake");
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
        pool_node_fail(l->node, why[0] ? why : "connect failed");
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
    pool_node_fail(l->node, why);
}

/* Kernel keepalive: idle POOL_KEEPALIVE_S, then 3 probes a third of that
 * apart. Set on the socket directly: hiredis's own helper would record a
 * failure as a context error. Best effort. */
static void link_keepalive(int fd)
{
    int on = 1, idle = POOL_KEEPALIVE_S, intvl = POOL_KEEPALIVE_S / 3, cnt = 3;

    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0)
        return;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
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
        pool_node_fail(l->node, "out of memory");
        return;
    }
    if (ac->err) {
        char why[POOL_ERR_SIZE];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        pool_node_fail(l->node, why);
        return;
    }
    /* A peer that vanished without a FIN is found by the probes; keepalive
     * also lets the kernel notice it. */
    if (a->kind == CONF_ADDR_TCP)
        link_keepalive(ac->c.fd);
    if (redis_uv_attach(ac, pool.loop) != 0) {
        redisAsyncFree(ac);
        pool_node_fail(l->node, "cannot attach to the event loop");
        return;
    }
    ac->data = l;
    redisAsyncSetConnectCallback(ac, link_on_connect);
    redisAsyncSetDisconnectCallback(ac, link_on_disconnect);
    l->ac = ac;
    l->state = LINK_CONNECTING;
    l->connect_deadline = timer_now() + pool.conf->redis.connect_timeout_ms;
    link_arm(l);
    link_handshake(l);
}

/* ---- probes ------------------------------------------------------------ */

static struct pool_link *pool_node_pick(struct pool_node *n);

static void probe_ping_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;    /* its deadline and the reply's arrival did the work */
}

static void probe_published_cb(void *ud, int node, redisReply *r)
{
    struct pool_node *n = &pool.nodes[node];
    struct pool_link *sub = &n->sub;
    (void)ud;

    if (!r || sub->state != LINK_UP || !sub->probe_deadline)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        /* An ACL without this channel: the data links are still probed. */
        log_warn("redis %s: PUBLISH to %s refused (%s); its subscriber "
                 "connection is not probed", n->addr->text, pool.probe_channel,
                 r->str);
        sub->probe_refused = true;
        sub->probe_deadline = 0;
        link_arm(sub);
    } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
        /* Nobody is subscribed there although our link says it is. */
        pool_node_fail(n, "subscriber connection lost its subscription");
    }
}

/* PING a data link; the request's deadline fails a node that froze. */
static void link_probe_data(struct pool_link *l)
{
    const char *argv[] = { "PING" };
    size_t lens[] = { 4 };
    struct pool_req *q = req_command(1, argv, lens);

    if (!q)
        return;
    q->cb = probe_ping_cb;
    if (link_send(l, q) != 0)
        free(q);
}

/* Send the subscriber a message on its own channel through a data link;
 * it must arrive within command_timeout_ms. */
static void link_probe_sub(struct pool_link *l)
{
    struct pool_node *n = l->node;
    struct pool_link *via = pool_node_pick(n);
    char seq[SCRIPT_NUM_SIZE];

    if (!via)
        return;
    snprintf(seq, sizeof(seq), "%" PRIu64, ++n->probe_seq);
    const char *argv[] = { "PUBLISH", pool.probe_channel, seq };
    size_t lens[] = { 7, strlen(pool.probe_channel), strlen(seq) };
    struct pool_req *q = req_command(3, argv, lens);
    if (!q)
        return;
    q->cb = probe_published_cb;
    if (link_send(via, q) != 0) {
        free(q);
        return;
    }
    l->probe_seq = n->probe_seq;
    l->probe_deadline = timer_now() + pool.conf->redis.command_timeout_ms;
    link_arm(l);
}

/* Runs probe_interval_ms after a link's last request (data) or last
 * message (subscriber): probe it if that is still the latest. */
static void link_probe_cb(struct timer *t)
{
    struct pool_link *l = t->data;
    uint64_t every = pool.conf->redis.probe_interval_ms;
    uint64_t now = timer_now();
    uint64_t last;

    if (pool.stopping || l->state != LINK_UP || l->node->failed)
        return;
    if (l->subscriber) {
        if (!l->probe_deadline && !l->probe_refused &&
            now >= l->last_recv + every)
            link_probe_sub(l);
        last = l->probe_deadline ? now : l->last_recv;
    } else {
        if (now >= l->last_send + every)
            link_probe_data(l);
        last = l->last_send;
    }
    if (l->state != LINK_UP)
        return;     /* the probe failed the node */
    timer_start_at(&l->probe_timer, last + every > now ? last + every
                                                       : now + every);
}

/* ---- public ------------------------------------------------------------ */

static void link_init(struct pool_link *l, struct pool_node *n, bool sub)
{
    l->node = n;
    l->subscriber = sub;
    l->state = LINK_DOWN;
    list_init(&l->queue);
    list_init(&l->pending);
    list_init(&l->pend_link);
    timer_init(&l->timer, link_timeout_cb, l);
    timer_init(&l->probe_timer, link_probe_cb, l);
}

/* 64 random bits as hex; the clock and pid if the OS has no randomness
 * to give (the id only has to differ between daemons). */
static void pool_draw_instance_id(void)
{
    uint64_t v = 0;
    ssize_t k;

    do {
        k = getrandom(&v, sizeof(v), 0);
    } while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof(v))
        v = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
    snprintf(pool.instance_id, sizeof(pool.instance_id), "%016" PRIx64, v);
}

int pool_init(uv_loop_t *loop, const struct conf *conf,
              const struct pool_hooks *hooks)
{
    pool.loop = loop;
    pool.conf = conf;
    pool.hooks = *hooks;
    pool.nnodes = (int)conf->redis.nnodes;
    list_init(&pool.pended);
    redis_uv_before_flush(pool_flush);
    pool_draw_instance_id();
    size_t chlen = strlen(conf->locks.release_channel) +
                   strlen(POOL_PROBE_SUFFIX) + POOL_INSTANCE_ID_LEN + 1;
    pool.probe_channel = mem_alloc(chlen);
    pool.watch_channel = mem_alloc(strlen(conf->locks.release_channel) +
                                   sizeof(POOL_WATCH_SUFFIX));
    sprintf(pool.watch_channel, "%s%s", conf->locks.release_channel,
            POOL_WATCH_SUFFIX);
    snprintf(pool.probe_channel, chlen, "%s%s%s", conf->locks.release_channel,
             POOL_PROBE_SUFFIX, pool.instance_id);
    pool.nodes = mem_alloc(sizeof(struct pool_node) * (size_t)pool.nnodes);
    for (int i = 0; i < pool.nnodes; i++) {
        struct pool_node *n = &pool.nodes[i];
        n->idx = i;
        n->addr = &conf->redis.nodes[i];
        n->backoff_ms = POOL_BACKOFF_MIN_MS;
        n->links = mem_alloc(sizeof(struct pool_link) * conf->redis.pool_size);
        for (unsigned k = 0; k < conf->redis.pool_size; k++)
            link_init(&n->links[k], n, false);
        link_init(&n->sub, n, true);
        timer_init(&n->reconnect_timer, pool_node_reconnect_cb, n);
    }
    for (int i = 0; i < pool.nnodes; i++)
        pool_node_reconnect_cb(&pool.nodes[i].reconnect_timer);
    return 0;
}

void pool_shutdown(void)
{
    if (!pool.nodes || pool.stopping)
        return;
    pool.stopping = true;
    for (int i = 0; i < pool.nnodes; i++) {
        struct pool_node *n = &pool.nodes[i];
        n->failed = true;
        for (unsigned k = 0; k < pool.conf->redis.pool_size; k++)
            link_drop(&n->links[k]);
        link_drop(&n->sub);
    }
    /* Only now: dropping a link runs callbacks that may touch any node. */
    for (int i = 0; i < pool.nnodes; i++)
        timer_stop(&pool.nodes[i].reconnect_timer);
}

void pool_free(void)
{
    if (!pool.nodes)
        return;
    for (int i = 0; i < pool.nnodes; i++)
        free(pool.nodes[i].links);
    free(pool.nodes);
    pool.nodes = NULL;
    free(pool.probe_channel);
    pool.probe_channel = NULL;
    free(pool.watch_channel);
    pool.watch_channel = NULL;
    free(pool.cmd);
    pool.cmd = NULL;
    pool.cmdcap = 0;
}

bool pool_busy(void)
{
    return pool.inflight > 0;
}

int pool_nnodes(void)
{
    return pool.nnodes;
}

bool pool_node_up(int node)
{
    const struct pool_node *n = &pool.nodes[node];
    return !n->failed && n->nup > 0;
}

const char *pool_node_name(int node)
{
    return pool.nodes[node].addr->text;
}

const char *pool_instance_id(void)
{
    return pool.instance_id;
}

/* The first link that is up and has fewer than POOL_LINK_FILL requests
 * out, else the up link with the fewest. Filling one link first rather
 * than taking turns lets hiredis write more requests per system call and
 * the node answer more per read; the others take the overflow, and the
 * traffic when the first is down. Requests gathered in this loop turn
 * (l->pending) do not count: a turn's requests all go to one link, which
 * makes its groups as large as they can be, and the spread to other
 * links happens from turn to turn. */
static struct pool_link *pool_node_pick(struct pool_node *n)
{
    unsigned size = pool.conf->redis.pool_size;
    struct pool_link *best = NULL;

    for (unsigned i = 0; i < size; i++) {
        struct pool_link *l = &n->links[i];
        if (l->state != LINK_UP || !l->ac)
            continue;
        if (l->nqueue < POOL_LINK_FILL)
            return l;
        if (!best || l->nqueue < best->nqueue)
            best = l;
    }
    return best;
}

/* Send q on node's link *link when it is 0 or more (that link must be up:
 * a request sent there is still unanswered), else on the link
 * pool_node_pick chooses, stored in *link when link is not NULL. */
static int pool_node_send(int node, int *link, struct pool_req *q)
{
    struct pool_node *n = &pool.nodes[node];
    struct pool_link *l = NULL;

    if (!pool.stopping && pool_node_up(node)) {
        if (link && *link >= 0) {
            if ((unsigned)*link < pool.conf->redis.pool_size &&
                n->links[*link].state == LINK_UP)
                l = &n->links[*link];
        } else {
            l = pool_node_pick(n);
        }
    }
    if (l && pool.conf->redis.group_max > 1) {
        link_pend(l, q);
    } else if (!l || link_send(l, q) != 0) {
        free(q);
        return -1;
    }
    if (link)
        *link = (int)(l - n->links);
    return 0;
}

int pool_call(int node, int *link, const struct script_words *w,
              pool_reply_cb cb, void *ud)
{
    struct pool_req *q = req_create(w);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return pool_node_send(node, link, q);
}

static void publish_done(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;
}

void pool_publish_watch(const char *msg, size_t len)
{
    const char *argv[] = { "PUBLISH", pool.watch_channel, msg };
    size_t lens[] = { 7, strlen(pool.watch_channel), len };

    for (int i = 0; i < pool.nnodes; i++) {
        if (pool_node_up(i))
            (void)pool_command(i, 3, argv, lens, publish_done, NULL);
    }
}

int pool_command(int node, int argc, const char **argv, const size_t *lens,
                 pool_reply_cb cb, void *ud)
{
    struct pool_req *q = req_command(argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return pool_node_send(node, NULL, q);
}

const struct pool_node_stats *pool_node_stats(int node)
{
    return &pool.nodes[node].st;
}
