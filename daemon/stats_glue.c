/*
 * stats_glue: see stats_glue.h.
 */
#include "stats_glue.h"

#include <assert.h>
#include <stdint.h>

#include "lockmgr.h"
#include "node.h"
#include "redlock.h"
#include "session.h"
#include "stats.h"

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

/* Sessions that serve requests; `connections` (kept by server and conn)
 * also counts sockets still being flushed or refused. */
static void glue_sessions(struct stats_values *v, void *ud)
{
    (void)ud;
    v->sessions = (double)session_count();
    v->sessions_detached = (double)session_detached_count();
}

/*
 * STATS shows node's per-node objects as they are, and the per-node
 * numbers for /metrics are read back from them by the node codec's own
 * keys, so the two views cannot disagree. The reply-time histogram is
 * stats' own (stats_observe_node_request, by the pool's node index, which
 * is the index in node's array); it joins each object under its key.
 */
static void glue_nodes(struct stats_values *v, void *ud)
{
    json_t *arr = node_stats_json();
    struct stats_node *nodes = stats_nodes_alloc(v, json_array_size(arr));
    size_t i;
    json_t *o;
    (void)ud;

    v->nodes_total = redlock_nnodes();
    v->nodes_voting = node_nvoting();
    v->quorum = redlock_nquorum();
    v->nodes_json = arr;
    json_array_foreach(arr, i, o) {
        const char *name = json_string_value(json_object_get(o, "node"));

        const struct stats_hist *h = stats_node_request_hist((int)i);

        stats_node_set_name(&nodes[i], name ? name : "");
        stats_table_read_json(&stats_node_table, o, &nodes[i]);
        if (h)
            nodes[i].request_seconds = *h;
        json_object_set_new(o, "request_seconds", stats_hist_json(
            &nodes[i].request_seconds, &stats_buckets_latency));
    }
}

void stats_glue_lease_ended(uint64_t held_ms)
{
    stats_observe_hold((double)held_ms / 1000);
}

int stats_glue_register(void)
{
    lockmgr_set_hold_observer(stats_glue_lease_ended);
    if (stats_provider_add(glue_lockmgr, NULL) != 0 ||
        stats_provider_add(glue_sessions, NULL) != 0 ||
        stats_provider_add(glue_nodes, NULL) != 0)
        return -1;
    return 0;
}
