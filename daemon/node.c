/*
 * node: see node.h.
 *
 * Ownership: node_init allocates one struct node per configured node and
 * node_free frees them. An owed_release belongs to its node's `owed` list
 * from node_owe until it is handed to the pool (or node_free). A struct
 * undo belongs to its outstanding requests and is freed with the last
 * reply. A fence repair's reads carry a small heap struct naming the node
 * being repaired; the nodes outlive every request, since node_free comes
 * after the pool has failed them all. node_shutdown sets `stopping` before
 * the pool drops its links, so the callbacks that run then start nothing.
 *
 * Stale replies: every reply of a check or a repair carries the node's
 * `gen` at the time it was sent, and gen moves on whenever the node goes
 * up or down or is admitted. A reply for an older gen is ignored, so a
 * check that was on its way while the node was repaired cannot undo the
 * repair's verdict.
 *
 * Clocks: every deadline here (the recovery wait, retries, the "answered
 * recently" window) is uv_now(), CLOCK_MONOTONIC. Wall-clock time appears
 * only in messages (the "until" of a recovery) and in the fence epoch of a
 * repair without a quorum, which needs wall clocks that are slewed, never
 * stepped back, and roughly in sync between daemons and nodes. A node's
 * uptime (INFO) is measured by its own clock; stepping that clock
 * misstates when it restarted.
 */
#include "node.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "script.h"
#include "timer.h"

#define NODE_REPAIR_RETRY_MS 1000
#define NODE_MAX_OWED 65536         /* owed releases kept per node */
/* Warn about nodes without appendfsync always when a restart would keep
 * one from voting for longer than this. */
#define NODE_WARN_READMIT_MS 60000
/* A repair without a quorum raises the counter to at least
 * (wall-clock seconds since NODE_EPOCH_ORIGIN) << NODE_EPOCH_SHIFT: above
 * every fence granted before, as long as fewer than 2^21 fences are
 * granted per second and clocks do not go back. Fences must stay below
 * 2^53: the scripts compare them as Lua numbers (doubles), and this layout
 * does until the year 2160. */
#define NODE_EPOCH_SHIFT 21
#define NODE_EPOCH_ORIGIN 1704067200u   /* 2024-01-01T00:00:00Z */
#define NODE_POLICY_MAX 32          /* a maxmemory-policy name kept */

enum node_state {
    NODE_UNCHECKED,         /* up (or down), no verdict since it came up */
    NODE_OK,                /* its data is intact: it votes */
    NODE_NEW,               /* no marker, no counter: waits for bootstrap */
    NODE_WAITING,           /* may have lost keys: waits until recover_at */
    NODE_REPAIRING,         /* its fence counter is being raised */
};

static const char *const node_state_names[] = {
    [NODE_UNCHECKED] = "checking",
    [NODE_OK] = "voting",
    [NODE_NEW] = "new",
    [NODE_WAITING] = "recovering",
    [NODE_REPAIRING] = "repairing",
};

enum node_loss {
    NODE_LOSS_NONE,
    NODE_LOSS_RESTART,      /* restarted from its old data, which may lack
                               recent writes (no appendfsync always) */
    NODE_LOSS_DATA,         /* its marker is gone: restarted empty, flushed,
                               or new to a cluster that is in use */
};

enum node_mark { NODE_MARK_NONE, NODE_MARK_OURS, NODE_MARK_STALE };

/* What one check read; complete when wait reaches 0. */
struct node_check {
    int wait;               /* replies outstanding (+1 while sending) */
    bool failed;            /* one of them failed: no verdict this time */
    char run_id[POOL_RUN_ID_MAX + 1];
    bool have_info;
    uint64_t uptime_ms;
    char marker[POOL_RUN_ID_MAX + 1];
    bool have_marker;
    bool has_fence;
    uint64_t ttl_record;    /* the longest-ttl record, 0 if none */
};

/* An owner-checked delete to send when a node is back: it may still
 * execute requests that were buffered on its old connection when it
 * stopped answering. */
struct owed_release {
    struct list link;           /* in node->owed, oldest first */
    enum script script;         /* RELEASE (announced) or UNDO */
    size_t keylen;
    const char *token;          /* NUL-terminated, after the key */
    char key[];                 /* keylen bytes + NUL, then the token */
};

/* One undo fanned out to every node. */
struct undo {
    int pending;                /* replies outstanding (+1 while sending) */
    size_t keylen;
    const char *token;
    char key[];                 /* keylen bytes + NUL, then the token */
};

/* A fence repair's read from one node, for the node being repaired. */
struct repair_req {
    struct node *n;
    uint64_t gen;
    bool trusted;               /* from a voting node other than n */
};

struct node {
    int idx;
    bool down_logged;           /* warned once since it was last up */
    char run_id[POOL_RUN_ID_MAX + 1]; /* last run_id seen, "" if never */
    bool aof_always;            /* as its last handshake said */
    enum node_state state;
    uint64_t gen;               /* see "Stale replies" above */
    struct node_check chk;
    struct timer check_timer;   /* every probe_interval_ms */
    uint64_t uptime_ms;         /* from its last check */
    bool has_fence;             /* from its last check */

    /* The recovery it owes, kept across reconnects of the same run. */
    enum node_loss loss;
    char loss_run_id[POOL_RUN_ID_MAX + 1];
    uint64_t loss_base;         /* when keys it may have lost were set at
                                   the latest (uv_now ms) */
    uint64_t recover_at;        /* earliest repair: loss_base + readmit */
    bool end_requested;         /* the operator ended it: no more waiting */
    struct timer timer;         /* the wait, then repair retries */

    /* The repair in flight. */
    int repair_wait;            /* reads outstanding (+1 while sending) */
    int repair_trusted;         /* counters read from voting nodes */
    bool repair_epoch;          /* no quorum to read: use the clock epoch */
    uint64_t repair_max;        /* largest counter read */
    uint64_t repair_clock_s;    /* largest TIME read (seconds) */
    uint64_t repair_floor;      /* what the counter is raised to */
    char repair_error[POOL_ERR_SIZE]; /* why the last attempt failed */

    const char *stamp_how;      /* (static) why it votes once stamped */
    bool warned_aof;
    char warned_policy[NODE_POLICY_MAX];
    struct list owed;           /* owed_releases to send once it is up */
    size_t nowed;
    uint64_t restarts;
};

/* The most words of a command node sends itself (INFO, GET, TIME...). */
#define NODE_CMD_ARGS_MAX 8

/* The call being sent (large: one for the module; the loop has one
 * thread, and pool_call copies what it sends). */
static struct script_call node_call;

static struct {
    const struct conf *conf;
    struct node_rules rules;    /* from node_set_rules */
    struct node *nodes;
    int nnodes;
    bool stopping;
    bool cluster_known;         /* some node had a marker: not a new cluster */
    uint64_t max_fence;         /* largest fence granted */
    char *marker_key;           /* (owned) fence_key + CONF_MARKER_SUFFIX */
    char *ttl_key;              /* (owned) fence_key + CONF_MAXTTL_SUFFIX */
    /* The restart wait covers the longest lease any daemon on these nodes
     * may still hold: the largest locks.max_ttl_ms this daemon has had
     * since it started (a reload that lowers it shortens nothing), and the
     * largest longest-ttl record read from any node. */
    uint64_t ttl_cover;
} cluster;

static void node_check(struct node *n, bool first);
static void node_repair(struct node *n);
static void node_decide_cluster(void);

static const char *node_name(const struct node *n)
{
    return pool_node_name(n->idx);
}

/* How long a node that may have lost keys waits, from the time they were
 * set at the latest, before it votes: the longest lease that may still
 * live there, plus drift. */
static uint64_t node_readmit_ms(void)
{
    uint64_t t = cluster.ttl_cover;

    if (cluster.conf && cluster.conf->locks.max_ttl_ms > t)
        t = cluster.conf->locks.max_ttl_ms;
    if (t > UINT32_MAX)
        t = UINT32_MAX;
    return t + (uint64_t)cluster.rules.drift_ms((uint32_t)t);
}

static bool node_recovering(const struct node *n)
{
    return n->loss != NODE_LOSS_NONE || n->state == NODE_NEW ||
           n->state == NODE_WAITING || n->state == NODE_REPAIRING;
}

/* A new generation: replies sent before are ignored from now on. */
static void node_bump(struct node *n)
{
    n->gen++;
    n->stamp_how = NULL;
    memset(&n->chk, 0, sizeof(n->chk));
}

static void *node_gen_ud(const struct node *n)
{
    return (void *)(uintptr_t)n->gen;
}

static bool node_stale(const struct node *n, void *ud)
{
    return cluster.stopping || (uintptr_t)ud != (uintptr_t)n->gen;
}

/* "in 86399 s" and the like: a duration for people. */
static void node_fmt_duration(uint64_t ms, char *buf, size_t size)
{
    uint64_t s = ms / 1000;

    if (s >= 3600)
        snprintf(buf, size, "%" PRIu64 " h %02" PRIu64 " min", s / 3600,
                 s / 60 % 60);
    else if (s >= 60)
        snprintf(buf, size, "%" PRIu64 " min %02" PRIu64 " s", s / 60,
                 s % 60);
    else
        snprintf(buf, size, "%" PRIu64 " ms", ms);
}

/* ---- owed releases ------------------------------------------------------ */

static void owed_reply(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;
}

static void node_owe(int node, enum script script, const char *key,
                     size_t keylen, const char *token)
{
    struct node *n = &cluster.nodes[node];

    if (cluster.stopping)
        return;
    if (n->nowed >= NODE_MAX_OWED) {
        log_warn("redis %s: too many releases held back; %.*s will expire "
                 "by its ttl there", node_name(n), (int)keylen, key);
        return;
    }
    size_t toklen = strlen(token);
    struct owed_release *o = mem_alloc(sizeof(*o) + keylen + 1 + toklen + 1);
    o->script = script;
    memcpy(o->key, key, keylen);
    o->keylen = keylen;
    memcpy(o->key + keylen + 1, token, toklen);
    o->token = o->key + keylen + 1;
    list_push_tail(&n->owed, &o->link);
    n->nowed++;
}

void node_release_later(int node, const char *key, size_t keylen,
                        const char *token)
{
    node_owe(node, SCRIPT_RELEASE, key, keylen, token);
}

/* Send what this node is owed, oldest first; one the pool cannot take
 * stays owed (sending never calls back into this list). */
static void node_send_owed(struct node *n)
{
    struct list *pos, *tmp;
    size_t sent = 0;

    list_foreach_safe(pos, tmp, &n->owed) {
        struct owed_release *o = list_entry(pos, struct owed_release, link);
        if (o->script == SCRIPT_RELEASE)
            script_release(&node_call, o->key, o->keylen, o->token,
                           cluster.conf->locks.release_channel,
                           pool_instance_id());
        else
            script_undo(&node_call, o->key, o->keylen, o->token);
        if (pool_call(n->idx, NULL, &node_call.w, owed_reply, NULL) != 0)
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

static void undo_put(struct undo *u)
{
    if (--u->pending == 0)
        free(u);
}

static void undo_reply(void *ud, int node, redisReply *r)
{
    struct undo *u = ud;

    if (!r || r->type == REDIS_REPLY_ERROR)
        node_owe(node, SCRIPT_UNDO, u->key, u->keylen, u->token);
    undo_put(u);
}

void node_undo(const char *key, size_t keylen, const char *token)
{
    size_t toklen = strlen(token);
    struct undo *u = mem_alloc(sizeof(*u) + keylen + 1 + toklen + 1);

    memcpy(u->key, key, keylen);
    u->keylen = keylen;
    memcpy(u->key + keylen + 1, token, toklen);
    u->token = u->key + keylen + 1;
    u->pending = 1;
    script_undo(&node_call, u->key, keylen, u->token);
    for (int i = 0; i < cluster.nnodes; i++) {
        u->pending++;
        if (pool_call(i, NULL, &node_call.w, undo_reply, u) != 0) {
            u->pending--;
            node_owe(i, SCRIPT_UNDO, key, keylen, token);
        }
    }
    undo_put(u);
}

void node_note_fence(uint64_t fence)
{
    if (fence > cluster.max_fence)
        cluster.max_fence = fence;
}

/* ---- verdicts ------------------------------------------------------------ */

/* It votes from now on. */
static void node_admit(struct node *n, const char *how)
{
    bool was = n->loss != NODE_LOSS_NONE, fresh = n->state == NODE_NEW;

    if (n->state == NODE_OK)
        return;
    node_bump(n);
    timer_stop(&n->timer);
    n->state = NODE_OK;
    n->loss = NODE_LOSS_NONE;
    n->loss_run_id[0] = '\0';
    n->end_requested = false;
    n->repair_error[0] = '\0';
    if (was)
        log_notice("redis %s: votes again: %s", node_name(n), how);
    else if (fresh)
        log_notice("redis %s: votes: %s", node_name(n), how);
    else
        log_debug("redis %s: votes: %s", node_name(n), how);
}

static void stamp_reply(void *ud, int node, redisReply *r)
{
    (void)ud;
    if (!r || r->type == REDIS_REPLY_ERROR)
        log_info("redis %s: could not write its recovery marker (%s)",
                 pool_node_name(node), r ? r->str : "no answer");
}

/* Write the marker naming its current run, for every daemon to read. */
static void node_stamp(struct node *n, pool_reply_cb cb, void *ud)
{
    const char *argv[] = { "SET", cluster.marker_key, n->run_id };
    size_t lens[] = { 3, strlen(cluster.marker_key), strlen(n->run_id) };

    if (pool_command(n->idx, 3, argv, lens, cb, ud) != 0 && cb != stamp_reply)
        cb(ud, n->idx, NULL);
}

static void stamp_admit_reply(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];
    const char *how = n->stamp_how;

    if (node_stale(n, ud))
        return;
    n->stamp_how = NULL;
    if (!r || r->type == REDIS_REPLY_ERROR) {
        log_info("redis %s: could not write its recovery marker (%s); "
                 "checking it again", node_name(n), r ? r->str : "no answer");
        node_bump(n);
        n->state = NODE_UNCHECKED;
        node_check(n, false);
        return;
    }
    node_admit(n, how);
}

/* Write the marker, then let it vote: scripts check the marker (the
 * guard, pool.h), so a vote before the marker is there would fail. Checks
 * in flight are stale from now on, and a verdict is not taken while the
 * marker is on its way (a check could read the node before it lands). */
static void node_stamp_admit(struct node *n, const char *how)
{
    node_bump(n);
    n->stamp_how = how;
    node_stamp(n, stamp_admit_reply, node_gen_ud(n));
}

static void node_recover(struct node *n, enum node_loss loss, uint64_t base);

/* A longest-ttl record read from a node: the restart wait covers it. A
 * wait already set grows with it (never shrinks). */
static void node_cover_ttl(uint64_t ttl)
{
    uint64_t now = timer_now();

    if (ttl <= cluster.ttl_cover)
        return;
    cluster.ttl_cover = ttl;
    for (int i = 0; i < cluster.nnodes; i++) {
        struct node *n = &cluster.nodes[i];
        uint64_t at = n->loss_base + node_readmit_ms();
        if (n->loss == NODE_LOSS_NONE || n->end_requested ||
            at <= n->recover_at)
            continue;
        n->recover_at = at;
        log_warn("redis %s: a lease of up to %" PRIu64 " ms may live on "
                 "these nodes: its recovery wait grows to %" PRIu64 " ms",
                 node_name(n), ttl, at - n->loss_base);
        if (n->state == NODE_REPAIRING && at > now) {
            /* Too early after all: back to waiting. */
            node_bump(n);
            n->state = NODE_WAITING;
        }
        if (n->state == NODE_WAITING)
            timer_start_at(&n->timer, at > now ? at : now);
    }
}

static const char *node_loss_text(enum node_loss loss)
{
    return loss == NODE_LOSS_RESTART
        ? "restarted without appendfsync always, so it may lack recent lock "
          "keys"
        : "lost its data (restarted empty, flushed, or new to this cluster)";
}

/*
 * It may have lost keys set up to `base`: it waits until base plus the
 * readmission wait (unless an earlier verdict on the same run already set
 * the wait, or the operator ended it), then its fence counter is repaired.
 */
static void node_recover(struct node *n, enum node_loss loss, uint64_t base)
{
    uint64_t now = timer_now(), at = base + node_readmit_ms();

    if (n->loss != loss || strcmp(n->loss_run_id, n->run_id) != 0) {
        char until[TIMER_UTC_SIZE], in[32];
        n->loss = loss;
        snprintf(n->loss_run_id, sizeof(n->loss_run_id), "%s", n->run_id);
        n->loss_base = base;
        n->recover_at = at;
        timer_fmt_utc(at, until, sizeof(until));
        node_fmt_duration(at > now ? at - now : 0, in, sizeof(in));
        log_warn("redis %s: %s; not voting until %s (in %s), when keys it "
                 "may have lost have expired (locks.max_ttl_ms plus drift); "
                 "then its fence counter is repaired", node_name(n),
                 node_loss_text(loss), until, in);
    }
    if (n->state == NODE_REPAIRING)
        return;
    n->state = NODE_WAITING;
    if (n->end_requested || n->recover_at <= now)
        node_repair(n);
    else
        timer_start_at(&n->timer, n->recover_at);
}

static void node_saw_restart(struct node *n, const char *run_id)
{
    n->restarts++;
    n->end_requested = false;
    log_warn("redis %s: restarted (run_id %s -> %s)", node_name(n),
             n->run_id, run_id);
}

/* What the check says about the node's data. */
static void node_verdict(struct node *n, const struct node_check *c)
{
    uint64_t now = timer_now();
    enum node_mark mark = !c->have_marker ? NODE_MARK_NONE
        : strcmp(c->marker, c->run_id) == 0 ? NODE_MARK_OURS : NODE_MARK_STALE;
    bool known = cluster.cluster_known;

    if (n->stamp_how)
        return;     /* its marker is being written: stamp_admit_reply decides */
    if (n->run_id[0] && strcmp(n->run_id, c->run_id) != 0)
        node_saw_restart(n, c->run_id);
    snprintf(n->run_id, sizeof(n->run_id), "%s", c->run_id);
    n->uptime_ms = c->uptime_ms;
    n->has_fence = c->has_fence;
    node_cover_ttl(c->ttl_record);
    if (mark != NODE_MARK_NONE)
        cluster.cluster_known = true;

    if (mark == NODE_MARK_OURS) {
        node_admit(n, "its data is intact (recovery marker of this run)");
    } else if (n->state == NODE_REPAIRING) {
        /* the repair decides */
    } else if (mark == NODE_MARK_STALE && n->aof_always) {
        node_stamp_admit(n, "restarted with appendfsync always, kept its "
                         "data");
    } else if (mark == NODE_MARK_STALE) {
        /* Keys it lost were set before it started, with at most max_ttl. */
        uint64_t start = now > c->uptime_ms ? now - c->uptime_ms : 0;
        node_recover(n, NODE_LOSS_RESTART, start);
    } else if (cluster.cluster_known) {
        /* Lost when, we cannot tell: count from now (node_recover keeps
         * the first notice of this run). */
        node_recover(n, NODE_LOSS_DATA, now);
    } else {
        n->state = NODE_NEW;
    }
    if (!known || n->state == NODE_NEW)
        node_decide_cluster();
}

/*
 * No node has shown a marker yet. Once every node has answered a check:
 * none has a fence counter either, this is a new cluster (bootstrap);
 * every one has a counter and has run longer than the readmission wait,
 * they were used by a daemon that wrote no markers (adopt). Anything else
 * is a cluster that lost data on some nodes: they recover. Once some node
 * shows a marker, the nodes still waiting here recover.
 */
static void node_decide_cluster(void)
{
    int nfence = 0, nold = 0;
    const char *what;

    if (!cluster.cluster_known) {
        for (int i = 0; i < cluster.nnodes; i++) {
            const struct node *n = &cluster.nodes[i];
            if (n->state != NODE_NEW || !pool_node_up(i))
                return;     /* wait until every node has answered */
            nfence += n->has_fence;
            nold += n->uptime_ms >= node_readmit_ms();
        }
        if (nfence == 0 || (nfence == cluster.nnodes && nold == cluster.nnodes)) {
            what = nfence == 0
                ? "bootstrap: no node has a fence counter or a recovery "
                  "marker, so this is a new cluster (had every node lost "
                  "its data at once instead, locks granted before that are "
                  "not protected and fences start again from 1)"
                : "adopting nodes used by a daemon that wrote no recovery "
                  "markers: each has a fence counter and has run longer "
                  "than locks.max_ttl_ms";
            log_warn("%s; all %d nodes vote", what, cluster.nnodes);
            cluster.cluster_known = true;
            for (int i = 0; i < cluster.nnodes; i++)
                node_stamp_admit(&cluster.nodes[i], nfence == 0 ? "bootstrap"
                                                          : "adopted");
            return;
        }
        log_warn("no node has a recovery marker, and the nodes are neither "
                 "all empty nor all in use for longer than the readmission "
                 "wait (%d of %d have a fence counter, %d have run that "
                 "long): every node recovers as one that lost its data",
                 nfence, cluster.nnodes, nold);
        cluster.cluster_known = true;
    }
    for (int i = 0; i < cluster.nnodes; i++) {
        struct node *n = &cluster.nodes[i];
        if (n->state == NODE_NEW)
            node_recover(n, NODE_LOSS_DATA, timer_now());
    }
}

/* ---- checks -------------------------------------------------------------- */

/* The value of "field:" in an INFO text, or "" */
static void info_field(const char *info, const char *field, char *out,
                       size_t size)
{
    size_t flen = strlen(field);
    const char *p = info;

    out[0] = '\0';
    while ((p = strstr(p, field)) != NULL) {
        if (p == info || p[-1] == '\n') {
            p += flen;
            size_t k = strcspn(p, "\r\n");
            if (k >= size)
                k = size - 1;
            memcpy(out, p, k);
            out[k] = '\0';
            return;
        }
        p += flen;
    }
}

static void check_step(struct node *n)
{
    if (--n->chk.wait > 0)
        return;
    struct node_check c = n->chk;
    memset(&n->chk, 0, sizeof(n->chk));
    if (c.failed || !c.have_info)
        return;     /* the next check will tell */
    node_verdict(n, &c);
}

static void check_info_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];
    char up[SCRIPT_NUM_SIZE];

    if (node_stale(n, ud))
        return;
    if (r && r->type == REDIS_REPLY_STRING) {
        info_field(r->str, "run_id:", n->chk.run_id, sizeof(n->chk.run_id));
        info_field(r->str, "uptime_in_seconds:", up, sizeof(up));
        n->chk.uptime_ms = strtoull(up, NULL, 10) * 1000;
        n->chk.have_info = up[0] != '\0';
    } else {
        n->chk.failed = true;
    }
    check_step(n);
}

static void check_marker_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];

    if (node_stale(n, ud))
        return;
    if (r && r->type == REDIS_REPLY_STRING) {
        snprintf(n->chk.marker, sizeof(n->chk.marker), "%s", r->str);
        n->chk.have_marker = true;
    } else if (!r || r->type != REDIS_REPLY_NIL) {
        n->chk.failed = true;
    }
    check_step(n);
}

static void check_ttl_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];

    if (node_stale(n, ud))
        return;
    if (r && r->type == REDIS_REPLY_STRING)
        n->chk.ttl_record = strtoull(r->str, NULL, 10);
    else if (!r || r->type != REDIS_REPLY_NIL)
        n->chk.failed = true;
    check_step(n);
}

static void check_fence_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];

    if (node_stale(n, ud))
        return;
    if (r && r->type == REDIS_REPLY_INTEGER)
        n->chk.has_fence = r->integer > 0;
    else
        n->chk.failed = true;
    check_step(n);
}

/* "CONFIG GET maxmemory*": name/value pairs. Eviction can remove lock
 * keys (and under allkeys-* the fence counter and the marker too). */
static void check_memory_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];
    const char *policy = NULL, *limit = "";

    (void)ud;   /* advisory: a reply after a verdict is still worth it */
    if (cluster.stopping || !r || r->type != REDIS_REPLY_ARRAY)
        return;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        if (strcmp(k->str, "maxmemory-policy") == 0)
            policy = v->str;
        else if (strcmp(k->str, "maxmemory") == 0)
            limit = v->str;
    }
    if (!policy || strcmp(policy, "noeviction") == 0 ||
        strcmp(policy, n->warned_policy) == 0)
        return;
    snprintf(n->warned_policy, sizeof(n->warned_policy), "%s", policy);
    bool unlimited = strcmp(limit, "0") == 0;
    const char *what = strncmp(policy, "allkeys-", 8) == 0
        ? "may evict any key under memory pressure: lock keys (a held lock "
          "silently disappears from this node), the fence counter and the "
          "recovery marker"
        : "may evict keys that have a ttl under memory pressure, and lock "
          "keys have one: a held lock can silently disappear from this node";
    if (unlimited)
        log_info("redis %s: maxmemory-policy %s %s; maxmemory is 0, so "
                 "nothing is evicted until a limit is set. Use noeviction",
                 node_name(n), policy, what);
    else
        log_warn("redis %s: maxmemory-policy %s %s. Use noeviction (writes "
                 "then fail instead, which redlockd reports)", node_name(n),
                 policy, what);
}

static int node_send(struct node *n, pool_reply_cb cb, int argc,
                     const char **argv)
{
    size_t lens[NODE_CMD_ARGS_MAX];

    if (argc > NODE_CMD_ARGS_MAX)
        return -1;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    return pool_command(n->idx, argc, argv, lens, cb, node_gen_ud(n));
}

/* Read what tells whether the node kept its data. */
static void node_check(struct node *n, bool first)
{
    const char *info[] = { "INFO", "server" };
    const char *marker[] = { "GET", cluster.marker_key };
    const char *fence[] = { "EXISTS", cluster.conf->locks.fence_key };
    const char *ttl[] = { "GET", cluster.ttl_key };

    if (n->chk.wait > 0 || !pool_node_up(n->idx) || cluster.stopping)
        return;
    memset(&n->chk, 0, sizeof(n->chk));
    n->chk.wait = 1;        /* held until every request is out */
    n->chk.wait++;
    if (node_send(n, check_info_cb, 2, info) != 0) {
        n->chk.wait--;
        n->chk.failed = true;
    }
    n->chk.wait++;
    if (node_send(n, check_marker_cb, 2, marker) != 0) {
        n->chk.wait--;
        n->chk.failed = true;
    }
    n->chk.wait++;
    if (node_send(n, check_fence_cb, 2, fence) != 0) {
        n->chk.wait--;
        n->chk.failed = true;
    }
    n->chk.wait++;
    if (node_send(n, check_ttl_cb, 2, ttl) != 0) {
        n->chk.wait--;
        n->chk.failed = true;
    }
    if (first) {
        const char *mem[] = { "CONFIG", "GET", "maxmemory*" };
        size_t lens[] = { 6, 3, 10 };
        (void)pool_command(n->idx, 3, mem, lens, check_memory_cb, NULL);
    }
    check_step(n);
}

static void node_check_cb(struct timer *t)
{
    struct node *n = t->data;

    if (cluster.stopping)
        return;
    timer_start(t, cluster.conf->redis.probe_interval_ms);
    node_check(n, false);
}

/* ---- repair of a node that may have lost keys --------------------------- */

static void repair_retry(struct node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void repair_retry(struct node *n, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(n->repair_error, sizeof(n->repair_error), fmt, ap);
    va_end(ap);
    log_info("redis %s: fence repair: %s; retrying", node_name(n),
             n->repair_error);
    timer_start(&n->timer, NODE_REPAIR_RETRY_MS);
}

static void repair_stamped_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];
    char how[96];

    if (node_stale(n, ud))
        return;
    if (!r || r->type == REDIS_REPLY_ERROR) {
        repair_retry(n, "writing the recovery marker: %s",
                     r ? r->str : "no answer");
        return;
    }
    snprintf(how, sizeof(how), "fence counter raised to %" PRIu64 "%s",
             n->repair_floor, n->repair_epoch ? " (clock epoch)" : "");
    node_admit(n, how);
}

static void repair_raised_cb(void *ud, int node, redisReply *r)
{
    struct node *n = &cluster.nodes[node];

    if (node_stale(n, ud))
        return;
    if (!r || r->type != REDIS_REPLY_INTEGER) {
        repair_retry(n, "raising its counter: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str : "no answer");
        return;
    }
    node_stamp(n, repair_stamped_cb, node_gen_ud(n));
}

/* The fence floor from the clock, for a repair without a quorum. */
static uint64_t node_epoch_floor(uint64_t node_clock_s)
{
    struct timespec ts;
    uint64_t s;

    clock_gettime(CLOCK_REALTIME, &ts);
    s = ts.tv_sec > 0 ? (uint64_t)ts.tv_sec : 0;
    if (node_clock_s > s)
        s = node_clock_s;
    return s > NODE_EPOCH_ORIGIN ? (s - NODE_EPOCH_ORIGIN) << NODE_EPOCH_SHIFT
                                 : 0;
}

/* Every read is in: raise this node's counter. */
static void repair_raise(struct node *n)
{
    int quorum = cluster.rules.quorum;

    if (!n->repair_epoch && n->repair_trusted < quorum) {
        repair_retry(n, "read %d of the %d counters of voting nodes it "
                     "needs", n->repair_trusted, quorum);
        return;
    }
    n->repair_floor = n->repair_max > cluster.max_fence ? n->repair_max
                                                  : cluster.max_fence;
    if (n->repair_epoch) {
        uint64_t e = node_epoch_floor(n->repair_clock_s);
        if (e > n->repair_floor)
            n->repair_floor = e;
        log_warn("redis %s: only %d of the %d nodes needed to read the "
                 "fence counter from vote; raising it to %" PRIu64 ", above "
                 "the largest counter any node has (%" PRIu64 "), the "
                 "largest fence this daemon granted (%" PRIu64 ") and the "
                 "clock epoch, so that fences stay monotonic", node_name(n),
                 n->repair_trusted, quorum, n->repair_floor, n->repair_max,
                 cluster.max_fence);
    }
    script_raise(&node_call, cluster.conf->locks.fence_key, n->repair_floor);
    if (pool_call(n->idx, NULL, &node_call.w, repair_raised_cb,
                  node_gen_ud(n)) != 0)
        repair_retry(n, "its connection is gone");
}

static void repair_step(struct node *n)
{
    if (--n->repair_wait > 0)
        return;
    if (!pool_node_up(n->idx))
        return;     /* on_up starts over */
    repair_raise(n);
}

/* A repair read's reply is in: the node being repaired, or NULL when the
 * reply is stale (the request is freed either way). */
static struct node *repair_reply_node(void *ud, bool *trusted)
{
    struct repair_req *q = ud;
    struct node *n = q->n;
    bool stale = cluster.stopping || q->gen != n->gen;

    if (trusted)
        *trusted = q->trusted;
    free(q);
    return stale ? NULL : n;
}

static void repair_ttl_cb(void *ud, int node, redisReply *r)
{
    struct node *n = repair_reply_node(ud, NULL);

    (void)node;
    if (!n)
        return;
    if (r && r->type == REDIS_REPLY_STRING)
        node_cover_ttl(strtoull(r->str, NULL, 10));
    if (n->state == NODE_REPAIRING)
        repair_step(n);
}

static void repair_read_cb(void *ud, int node, redisReply *r)
{
    bool trusted;
    struct node *n = repair_reply_node(ud, &trusted);

    (void)node;
    if (!n)
        return;
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_NIL)) {
        uint64_t v = r->type == REDIS_REPLY_STRING ?
                     strtoull(r->str, NULL, 10) : 0;
        if (v > n->repair_max)
            n->repair_max = v;
        n->repair_trusted += trusted;
    }
    repair_step(n);
}

static void repair_time_cb(void *ud, int node, redisReply *r)
{
    struct node *n = repair_reply_node(ud, NULL);

    (void)node;
    if (!n)
        return;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING) {
        uint64_t s = strtoull(r->element[0]->str, NULL, 10);
        if (s > n->repair_clock_s)
            n->repair_clock_s = s;
    }
    repair_step(n);
}

static void repair_send(struct node *n, int i, bool trusted, int argc,
                        const char **argv, pool_reply_cb cb)
{
    size_t lens[2] = { strlen(argv[0]), argc > 1 ? strlen(argv[1]) : 0 };
    struct repair_req *q = mem_alloc(sizeof(*q));

    q->n = n;
    q->gen = n->gen;
    q->trusted = trusted;
    n->repair_wait++;
    if (pool_command(i, argc, argv, lens, cb, q) != 0) {
        n->repair_wait--;
        free(q);
    }
}

/*
 * Read the fence counter of every node that is up (any value read is one
 * some grant reached, so the largest is a safe floor). With a quorum of
 * voting nodes among them, their largest is at least every fence granted
 * (two quorums share a node); without one, the clock epoch is added.
 */
static void node_repair(struct node *n)
{
    const char *get[] = { "GET", cluster.conf->locks.fence_key };
    const char *ttl[] = { "GET", cluster.ttl_key };
    const char *tm[] = { "TIME" };
    int voting = 0;

    timer_stop(&n->timer);
    n->state = NODE_REPAIRING;
    for (int i = 0; i < cluster.nnodes; i++)
        voting += i != n->idx && node_votes(i);
    n->repair_epoch = voting < cluster.rules.quorum;
    n->repair_wait = 1;     /* held until every request is out */
    n->repair_trusted = 0;
    n->repair_max = 0;
    n->repair_clock_s = 0;
    for (int i = 0; i < cluster.nnodes; i++) {
        if (!pool_node_up(i))
            continue;
        repair_send(n, i, i != n->idx && node_votes(i), 2, get,
                    repair_read_cb);
        /* A longer lease than assumed may live: node_cover_ttl sends the
         * node back to waiting, and this repair's replies go stale. */
        repair_send(n, i, false, 2, ttl, repair_ttl_cb);
        if (n->repair_epoch)
            repair_send(n, i, false, 1, tm, repair_time_cb);
    }
    repair_step(n);
}

static void node_timer_cb(struct timer *t)
{
    struct node *n = t->data;

    if (cluster.stopping || !pool_node_up(n->idx))
        return;     /* on_up checks it again */
    if (n->state == NODE_WAITING || n->state == NODE_REPAIRING)
        node_repair(n);
}

/* ---- the pool's hooks ---------------------------------------------------- */

static void node_warn_aof(struct node *n)
{
    char wait[32];

    if (n->aof_always || n->warned_aof ||
        node_readmit_ms() < NODE_WARN_READMIT_MS)
        return;
    n->warned_aof = true;
    node_fmt_duration(node_readmit_ms(), wait, sizeof(wait));
    log_warn("redis %s: not running appendonly yes with appendfsync always "
             "(or CONFIG is refused): after a restart it may not vote for "
             "%s (locks.max_ttl_ms plus drift), and while a quorum of nodes "
             "waits like that LOCK answers ERR UNAVAILABLE. Use appendfsync "
             "always, or a smaller locks.max_ttl_ms", node_name(n), wait);
}

static void node_on_up(int node, const char *run_id, bool aof_always)
{
    struct node *n = &cluster.nodes[node];

    n->down_logged = false;
    n->aof_always = aof_always;
    node_bump(n);
    n->state = NODE_UNCHECKED;
    if (n->run_id[0] && run_id[0] && strcmp(n->run_id, run_id) != 0)
        node_saw_restart(n, run_id);
    else
        log_notice("redis %s: up%s", node_name(n), node_recovering(n) ?
                   " (still recovering)" : "");
    if (run_id[0])
        snprintf(n->run_id, sizeof(n->run_id), "%s", run_id);
    node_warn_aof(n);
    node_check(n, true);
    node_send_owed(n);
}

static void node_on_down(int node, const char *why)
{
    struct node *n = &cluster.nodes[node];

    node_bump(n);
    timer_stop(&n->timer);
    n->state = NODE_UNCHECKED;
    if (!n->down_logged && !cluster.stopping)
        log_warn("redis %s: down (%s)", node_name(n), why);
    else
        log_debug("redis %s: still down (%s)", node_name(n), why);
    n->down_logged = true;
}

/* ---- explanations -------------------------------------------------------- */

/* Keep an explanation printable: error texts come from the nodes. */
static void node_sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

/* Why this node does not vote, or "" when it does. */
static void node_why(const struct node *n, char *buf, size_t size)
{
    const struct pool_node_stats *s = pool_node_stats(n->idx);
    uint64_t now = timer_now();
    char until[TIMER_UTC_SIZE], in[32];

    buf[0] = '\0';
    if (!pool_node_up(n->idx)) {
        snprintf(buf, size, "down: %s", s->last_error[0] ? s->last_error
                 : "not connected yet");
    } else if (n->state == NODE_UNCHECKED) {
        snprintf(buf, size, "connected, checking whether it kept its data");
    } else if (n->state == NODE_NEW) {
        snprintf(buf, size, "empty and new: a new cluster starts once every "
                 "node has answered empty");
    } else if (n->state == NODE_WAITING) {
        timer_fmt_utc(n->recover_at, until, sizeof(until));
        node_fmt_duration(n->recover_at > now ? n->recover_at - now : 0, in,
                          sizeof(in));
        snprintf(buf, size, "recovering from a %s until %s (in %s)",
                 n->loss == NODE_LOSS_RESTART ? "restart" : "loss of its data",
                 until, in);
    } else if (n->state == NODE_REPAIRING) {
        snprintf(buf, size, "recovering: repairing its fence counter%s%s",
                 n->repair_error[0] ? ": " : "", n->repair_error);
    }
    node_sanitize(buf);
}

size_t node_why_unavailable(char *buf, size_t size)
{
    size_t len = 0;
    bool first = true;

    if (size)
        buf[0] = '\0';
    for (int i = 0; i < cluster.nnodes; i++) {
        char why[NODE_WHY_SIZE];
        node_why(&cluster.nodes[i], why, sizeof(why));
        if (!why[0])
            continue;
        int k = snprintf(len < size ? buf + len : NULL,
                         len < size ? size - len : 0, "%s%s%s is %s",
                         first ? "" : "; ", first ? "node " : "",
                         node_name(&cluster.nodes[i]), why);
        if (k > 0)
            len += (size_t)k;
        first = false;
    }
    return len;
}

int node_end_recovery(const char *name, char *msg, size_t len)
{
    bool all = strcmp(name, "all") == 0;
    int matched = 0, ended = 0;
    size_t used = 0;

    if (len)
        msg[0] = '\0';
    if (cluster.stopping) {
        snprintf(msg, len, "shutting down");
        return 0;
    }
    for (int i = 0; i < cluster.nnodes; i++) {
        struct node *n = &cluster.nodes[i];
        char why[NODE_WHY_SIZE];

        if (!all && strcmp(node_name(n), name) != 0)
            continue;
        matched++;
        if (!node_recovering(n))
            continue;
        int k;
        if (!pool_node_up(i)) {
            /* What it lost by the time it is back is not known yet. */
            k = snprintf(used < len ? msg + used : NULL,
                         used < len ? len - used : 0, "%s%s is down: end its "
                         "recovery once it is back", used ? "; " : "",
                         node_name(n));
            if (k > 0)
                used += (size_t)k;
            continue;
        }
        node_why(n, why, sizeof(why));
        log_notice("redis %s: recovery ended by the operator (it was %s); "
                   "its fence counter is repaired now, then it votes",
                   node_name(n), why);
        k = snprintf(used < len ? msg + used : NULL,
                     used < len ? len - used : 0, "%s%s: recovery ended, "
                     "repairing its fence counter, then it votes",
                     used ? "; " : "", node_name(n));
        if (k > 0)
            used += (size_t)k;
        ended++;
        n->end_requested = true;
        cluster.cluster_known = true;     /* no bootstrap after an operator's say */
        if (n->state != NODE_REPAIRING && n->state != NODE_UNCHECKED)
            node_repair(n);
    }
    if (!matched) {
        snprintf(msg, len, "no node %s in redis.nodes", name);
        return -1;
    }
    if (!ended && !used && all)
        snprintf(msg, len, "no node is recovering");
    else if (!ended && !used)
        snprintf(msg, len, "%s is not recovering", name);
    return ended;
}

/* ---- public ------------------------------------------------------------ */

void node_set_rules(const struct node_rules *rules)
{
    cluster.rules = *rules;
}

int node_init(uv_loop_t *loop, const struct conf *conf,
              pool_release_cb on_release, pool_release_cb on_watch)
{
    const struct pool_hooks hooks = {
        .on_up = node_on_up,
        .on_down = node_on_down,
        .on_release = on_release,
        .on_watch = on_watch,
    };
    size_t mlen = strlen(conf->locks.fence_key) + sizeof(CONF_MARKER_SUFFIX);
    size_t tlen = strlen(conf->locks.fence_key) + sizeof(CONF_MAXTTL_SUFFIX);

    cluster.conf = conf;
    cluster.nnodes = (int)conf->redis.nnodes;
    cluster.ttl_cover = conf->locks.max_ttl_ms;
    cluster.marker_key = mem_alloc(mlen);
    snprintf(cluster.marker_key, mlen, "%s%s", conf->locks.fence_key,
             CONF_MARKER_SUFFIX);
    cluster.ttl_key = mem_alloc(tlen);
    snprintf(cluster.ttl_key, tlen, "%s%s", conf->locks.fence_key,
             CONF_MAXTTL_SUFFIX);
    cluster.nodes = mem_alloc(sizeof(struct node) * (size_t)cluster.nnodes);
    for (int i = 0; i < cluster.nnodes; i++) {
        struct node *n = &cluster.nodes[i];
        n->idx = i;
        list_init(&n->owed);
        timer_init(&n->timer, node_timer_cb, n);
        timer_init(&n->check_timer, node_check_cb, n);
        timer_start(&n->check_timer, conf->redis.probe_interval_ms);
    }
    return pool_init(loop, conf, &hooks);
}

void node_shutdown(void)
{
    if (!cluster.nodes || cluster.stopping)
        return;
    cluster.stopping = true;
    pool_shutdown();
    /* Only now: dropping the links runs callbacks that may touch any node. */
    for (int i = 0; i < cluster.nnodes; i++) {
        timer_stop(&cluster.nodes[i].timer);
        timer_stop(&cluster.nodes[i].check_timer);
    }
}

void node_free(void)
{
    if (!cluster.nodes)
        return;
    for (int i = 0; i < cluster.nnodes; i++) {
        struct list *pos, *tmp;
        list_foreach_safe(pos, tmp, &cluster.nodes[i].owed)
            free(list_entry(pos, struct owed_release, link));
    }
    free(cluster.nodes);
    cluster.nodes = NULL;
    free(cluster.marker_key);
    cluster.marker_key = NULL;
    free(cluster.ttl_key);
    cluster.ttl_key = NULL;
    pool_free();
}

bool node_votes(int node)
{
    return pool_node_up(node) && cluster.nodes[node].state == NODE_OK;
}

uint64_t node_vote_gen(int node)
{
    return cluster.nodes[node].gen;
}

void node_guard(int node, const char **words, size_t *lens)
{
    const struct node *n = &cluster.nodes[node];

    words[0] = cluster.ttl_key;
    words[1] = cluster.marker_key;
    words[2] = node_votes(node) ? n->run_id : "";
    for (int i = 0; i < SCRIPT_GUARD_WORDS; i++)
        lens[i] = strlen(words[i]);
}

void node_lost_data(int node, const char *why)
{
    struct node *n = &cluster.nodes[node];

    if (cluster.stopping || n->state != NODE_OK)
        return;
    log_warn("redis %s: %s; it stops voting now and is checked", node_name(n),
             why);
    node_bump(n);
    n->state = NODE_UNCHECKED;
    node_check(n, false);
}

void node_reloaded(void)
{
    node_cover_ttl(cluster.conf->locks.max_ttl_ms);
}

int node_nvoting(void)
{
    int k = 0;
    for (int i = 0; i < cluster.nnodes; i++)
        k += node_votes(i);
    return k;
}

int node_count(void)
{
    return cluster.nnodes;
}

void node_report(int i, struct node_report *r)
{
    const struct node *n = &cluster.nodes[i];
    const struct pool_node_stats *s = pool_node_stats(i);
    uint64_t now = timer_now();
    uint64_t window = (uint64_t)cluster.conf->redis.probe_interval_ms +
                      cluster.conf->redis.command_timeout_ms;

    r->name = node_name(n);
    r->up = pool_node_up(i);
    r->state = r->up ? node_state_names[n->state] : "down";
    r->voting = node_votes(i);
    r->answered_recently = s->last_answer_ms &&
                           now - s->last_answer_ms <= window;
    r->recovering = node_recovering(n);
    r->aof_always = n->aof_always;
    r->requests = s->requests;
    r->calls = s->calls;
    r->errors = s->errors;
    r->timeouts = s->timeouts;
    r->reconnects = s->reconnects;
    r->restarts = n->restarts;
    r->latency_ms = s->latency_ms;
    r->latency_max_ms = s->latency_max_ms;
    r->run_id = n->run_id;
    r->last_error = s->last_error;
    node_why(n, r->why, sizeof(r->why));
    /* Nothing wrong by its state, yet silent: it froze without traffic,
     * and its probe's deadline has not failed it yet. */
    if (!r->why[0] && !r->answered_recently)
        snprintf(r->why, sizeof(r->why), "no answer for %" PRIu64 " ms",
                 now - s->last_answer_ms);
    r->until[0] = '\0';
    r->rejoin_in_ms = NAN;
    if (n->loss != NODE_LOSS_NONE && n->state != NODE_REPAIRING) {
        timer_fmt_utc(n->recover_at, r->until, sizeof(r->until));
        r->rejoin_in_ms = n->recover_at > now
                          ? (double)(n->recover_at - now) : 0;
    }
}
