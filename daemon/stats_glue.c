/*
 * stats_glue: see stats_glue.h.
 */
#include "stats_glue.h"

#include <assert.h>
#include <stdint.h>

#include "conf.h"
#include "conn.h"
#include "lockmgr.h"
#include "node.h"
#include "pool.h"
#include "rclass.h"
#include "redlock.h"
#include "server.h"
#include "session.h"
#include "stats.h"
#include "tls.h"

/*
 * lockmgr's counters, copied row by row as LOCKMGR_COUNTERS maps them. The
 * static assertion keeps a counter from landing in a gauge (a double would
 * take it silently).
 */
#define GLUE_COUNTER(field, row, cell)                                       \
    static_assert(_Generic(v->row cell, uint64_t: 1, default: 0),           \
                  "lockmgr counter " #field " feeds no counter cell");      \
    v->row cell = c->field;

static void glue_lockmgr(struct stats_values *v, void *ud)
{
    const struct lockmgr_counters *c = lockmgr_counters();
    (void)ud;

    v->locks_held = (double)lockmgr_held_count();
    v->waiters = (double)lockmgr_waiter_count();
    LOCKMGR_COUNTERS(GLUE_COUNTER)
}
#undef GLUE_COUNTER

/* Sessions that serve requests; `connections` (conn's) also counts
 * sockets still being flushed or refused. */
static void glue_sessions(struct stats_values *v, void *ud)
{
    (void)ud;
    v->sessions = (double)session_count();
    v->sessions_detached = (double)session_detached_count();
}

/*
 * The connections: conn's counters and the server's. The TLS failures go
 * cell by cell by the names of TLS_FAILURES (tls.h), each the
 * STATS_TLSFAIL_LABELS cell of the same name: a reason stats has no cell
 * for fails to compile, and the assertion below catches a cell no reason
 * feeds.
 */
static_assert((int)TLS_FAIL_N == (int)STATS_TLSFAIL_N,
              "TLS_FAILURES and STATS_TLSFAIL_LABELS name the same reasons");
#define GLUE_TLSFAIL(name)                                                   \
    v->tls_handshake_failures[STATS_TLSFAIL_##name] =                        \
        c->tls_failures[TLS_FAIL_##name];

static void glue_connections(struct stats_values *v, void *ud)
{
    const struct conn_counters *c = conn_counters();
    const struct server_counters *s = server_counters();
    (void)ud;

    v->connections = (double)c->open;
    v->connections_total = s->accepted;
    v->connections_rejected = s->rejected;
    v->output_overflows = c->output_overflows;
    v->tls_handshakes = c->tls_handshakes;
    TLS_FAILURES(GLUE_TLSFAIL)
}
#undef GLUE_TLSFAIL

/* Request lines by command (the sessions'), and ERR lines by code from
 * every module that writes some: the sessions' answers, the server's
 * refusals, conn's ERR TOOLONG. */
static void glue_requests(struct stats_values *v, void *ud)
{
    const struct session_counters *ss = session_counters();
    const struct server_counters *sv = server_counters();
    (void)ud;

    for (size_t k = 0; k < STATS_COMMAND_N; k++)
        v->commands[k] = ss->commands[k];
    for (size_t k = 0; k < STATS_ERROR_N; k++)
        v->errors[k] = ss->errors[k] + sv->errors[k];
    v->errors[PROTO_ERR_TOOLONG] += conn_counters()->toolong;
}

/*
 * One node's numbers for /metrics and /healthz: every row of
 * STATS_NODE_CODEC from the report's field of the same name (the
 * histogram is stats' own, by the pool's node index, which is node's
 * index too).
 */
#define GLUE_NODE_COPY_COUNTER(field) s->field = r->field;
#define GLUE_NODE_COPY_GAUGE(field) s->field = r->field;
#define GLUE_NODE_COPY_HISTOGRAM(field)
#define GLUE_NODE_ROW(field, kind, unit, metric, help)                     \
    GLUE_NODE_COPY_##kind(field)

static void glue_node(struct stats_node *s, const struct node_report *r,
                      int i)
{
    const struct stats_hist *h = stats_node_request_hist(i);

    stats_node_set_name(s, r->name);
    stats_node_set_why(s, r->why);
    STATS_NODE_CODEC(GLUE_NODE_ROW)
    if (h)
        s->request_seconds = *h;
}
#undef GLUE_NODE_ROW

/* The same report as a STATS "nodes" object, with the reply-time
 * histogram from s. Keys keep the order tools have seen. */
static json_t *glue_node_json(const struct node_report *r,
                              const struct stats_node *s)
{
    json_t *o = json_pack("{s:s, s:b, s:b, s:b, s:b, s:s, s:s, s:b,"
                          " s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:s}",
        "node", r->name,
        "up", r->up,
        "voting", r->voting,
        "answered_recently", r->answered_recently,
        "recovering", r->recovering,
        "state", r->state,
        "why", r->why,
        "aof_always", r->aof_always,
        "requests", (json_int_t)r->requests,
        "calls", (json_int_t)r->calls,
        "errors", (json_int_t)r->errors,
        "timeouts", (json_int_t)r->timeouts,
        "reconnects", (json_int_t)r->reconnects,
        "restarts", (json_int_t)r->restarts,
        "latency_ms", r->latency_ms,
        "latency_max_ms", r->latency_max_ms,
        "run_id", r->run_id,
        "last_error", r->last_error);

    if (r->until[0]) {
        json_object_set_new(o, "until", json_string(r->until));
        json_object_set_new(o, "rejoin_in_ms",
                            json_integer((json_int_t)r->rejoin_in_ms));
    } else {
        json_object_set_new(o, "until", json_null());
    }
    json_object_set_new(o, "request_seconds", stats_hist_json(
        &s->request_seconds, &stats_buckets_latency));
    return o;
}

static void glue_nodes(struct stats_values *v, void *ud)
{
    int n = node_count();
    struct stats_node *nodes = stats_nodes_alloc(v, (size_t)n);
    struct node_report r;
    (void)ud;

    v->nodes_total = redlock_nnodes();
    v->nodes_voting = node_nvoting();
    v->quorum = redlock_nquorum();
    v->nodes_json = json_array();
    for (int i = 0; i < n; i++) {
        node_report(i, &r);
        glue_node(&nodes[i], &r, i);
        json_array_append_new(v->nodes_json, glue_node_json(&r, &nodes[i]));
    }
}

/* ---- the observers: what the histograms are made of --------------------- */

/* The sessions time each LOCK's answer; the pool each node's reply. */
static void glue_lock_answered(bool waited, double seconds)
{
    stats_observe_lock(waited, seconds);
}

static const struct session_observer glue_session_observer = {
    .lock_answered = glue_lock_answered,
};

static void glue_node_replied(int node, double seconds)
{
    stats_observe_node_request(node, seconds);
}

/* ---- resource classes ------------------------------------------------------
 * lockmgr tells the waits and holds of each resource (its observer); the
 * class of the resource (rclass) picks the histograms. */

static struct rclass *glue_classes;     /* (owned) as configured now */

static void glue_waited(const char *resource, size_t len, bool granted,
                        uint64_t waited_ms)
{
    stats_observe_class_wait(rclass_of(glue_classes, resource, len), granted,
                             (double)waited_ms / 1000);
}

static void glue_held(const char *resource, size_t len, uint64_t held_ms)
{
    stats_observe_hold((double)held_ms / 1000);
    stats_observe_class_hold(rclass_of(glue_classes, resource, len),
                             (double)held_ms / 1000);
}

static const struct lockmgr_observer glue_observer = {
    .waited = glue_waited, .held = glue_held,
};

static void glue_class_report(struct stats_values *v, void *ud)
{
    size_t n = rclass_count(glue_classes);
    struct stats_class *c = stats_classes_alloc(v, n);
    (void)ud;

    for (size_t i = 0; i < n; i++)
        c[i].name = rclass_name(glue_classes, i);
}

void stats_glue_configure(const struct conf *c)
{
    const char *const *prefixes =
        (const char *const *)c->metrics.resource_classes;
    size_t n = c->metrics.nresource_classes, max = c->metrics.max_classes;

    if (glue_classes && rclass_same(glue_classes, prefixes, n, max))
        return;
    /* Other classes: what was counted under the old ones starts over. */
    rclass_destroy(glue_classes);
    glue_classes = rclass_create(prefixes, n, max);
    stats_classes_reset();
}

int stats_glue_register(const struct conf *c)
{
    stats_glue_configure(c);
    lockmgr_set_observer(&glue_observer);
    session_set_observer(&glue_session_observer);
    pool_set_reply_observer(glue_node_replied);
    if (stats_provider_add(glue_lockmgr, NULL) != 0 ||
        stats_provider_add(glue_sessions, NULL) != 0 ||
        stats_provider_add(glue_connections, NULL) != 0 ||
        stats_provider_add(glue_requests, NULL) != 0 ||
        stats_provider_add(glue_nodes, NULL) != 0 ||
        stats_provider_add(glue_class_report, NULL) != 0)
        return -1;
    return 0;
}

void stats_glue_deinit(void)
{
    lockmgr_set_observer(NULL);
    session_set_observer(NULL);
    pool_set_reply_observer(NULL);
    rclass_destroy(glue_classes);
    glue_classes = NULL;
}
