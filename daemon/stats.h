/*
 * stats: the daemon's counters, gauges and histograms, as one codec.
 *
 * Every number the daemon reports is one row of STATS_CODEC below (or of
 * STATS_NODE_CODEC, for the per-node numbers). The rows generate the
 * struct that holds the values and a table of descriptors; the STATS JSON
 * (stats.c) and the Prometheus exposition (metrics.c) are both walks over
 * that table, so a key, its type and its help text cannot drift apart.
 *
 * Where the values come from: modules below stats on the module map
 * (server, session, conn) count directly in the global `stats`. Numbers
 * owned by modules that must not know stats (lockmgr, pool) are filled in
 * by providers, callbacks registered at start (stats_glue.c) and run on a
 * copy of `stats` before every report. stats.c itself includes nothing
 * above it.
 */
#ifndef REDLOCKD_STATS_H
#define REDLOCKD_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/*
 * A row: X(field, kind, unit, dim, metric, help)
 *
 *   field   the member of struct stats_values, and its STATS JSON key
 *   kind    COUNTER (uint64_t, only grows), GAUGE (double, a level now;
 *           NaN means "not reported", the key is left out), HISTOGRAM
 *           (struct stats_hist)
 *   unit    ONE (a count), MS (kept and shown in STATS as milliseconds,
 *           exported to Prometheus in seconds), SECONDS (histograms)
 *   dim     NONE, a label set (the row is an array, one cell per label
 *           value: an object in STATS), or for a histogram its bucket set
 *   metric  the Prometheus name after "redlockd_"; counters get "_total"
 *   help    what the number is, for # HELP
 *
 * STATS keys are an interface (tools and tests read them): rename a field
 * only together with its readers. Order here is the order in STATS and
 * in /metrics.
 */
#define STATS_CODEC(X)                                                       \
    X(uptime_ms, GAUGE, MS, NONE, "uptime_seconds", "Seconds since the daemon started.") \
    X(connections, GAUGE, ONE, NONE, "connections", "Client connections open now.") \
    X(connections_total, COUNTER, ONE, NONE, "connections", "Client connections accepted, the refused ones included.") \
    X(connections_rejected, COUNTER, ONE, NONE, "connections_rejected", "Client connections refused with an ERR line (max_clients, protected mode, shutting down).") \
    X(sessions, GAUGE, ONE, NONE, "sessions", "Client sessions alive now (one per open connection).") \
    X(commands, COUNTER, ONE, NONE, "commands", "Request lines received, malformed ones included (empty lines not).") \
    X(errors, COUNTER, ONE, NONE, "errors", "ERR replies sent.") \
    X(locks_held, GAUGE, ONE, NONE, "locks_held", "Locks held by sessions of this daemon now.") \
    X(waiters, GAUGE, ONE, NONE, "waiters", "LOCK requests not answered yet: queued for a resource or being tried on Redis now.") \
    X(acquisitions, COUNTER, ONE, RESULT, "acquisitions", "LOCK requests answered, by result.") \
    X(releases, COUNTER, ONE, NONE, "releases", "Leases released: UNLOCK, the end of a session, or a lost lease's keys removed.") \
    X(extends, COUNTER, ONE, NONE, "extends", "EXTEND requests answered, granted or not (OK, ERR LOST, ERR UNAVAILABLE).") \
    X(renewals, COUNTER, ONE, NONE, "renewals", "Automatic lease renewals that reached a quorum.") \
    X(renewal_failures, COUNTER, ONE, NONE, "renewal_failures", "Automatic lease renewals that did not reach a quorum (retried while the lease is valid).") \
    X(leases_lost, COUNTER, ONE, NONE, "leases_lost", "Leases lost: a renewal or EXTEND found them gone, or their validity ran out.") \
    X(waits, COUNTER, ONE, NONE, "waits", "LOCK requests that allowed a wait (wait= above 0).") \
    X(wakeups_notified, COUNTER, ONE, NONE, "wakeups_notified", "Queued LOCK requests retried because the holder released (a release notice or a local release).") \
    X(wakeups_retry, COUNTER, ONE, NONE, "wakeups_retry", "Queued LOCK requests retried by the fallback timer (locks.retry_ms).") \
    X(output_overflows, COUNTER, ONE, NONE, "output_overflows", "Clients disconnected for not reading their replies (limits.max_output_bytes).") \
    /* A gauge must not end in _total, which scrapers read as a counter. */ \
    X(nodes_total, GAUGE, ONE, NONE, "nodes_configured", "Redis nodes configured.") \
    X(nodes_voting, GAUGE, ONE, NONE, "nodes_voting", "Redis nodes whose answers count as votes now.") \
    X(quorum, GAUGE, ONE, NONE, "quorum", "Votes needed to grant a lock.")

/*
 * Per Redis node, exported with a node="HOST:PORT" label. The fields are
 * the keys of the node objects in STATS "nodes" (which the pool writes;
 * see stats_glue.c).
 */
#define STATS_NODE_CODEC(X)                                                  \
    X(up, GAUGE, ONE, "node_up", "1 while at least one connection to this Redis node is up, else 0.") \
    X(voting, GAUGE, ONE, "node_voting", "1 while this node's answers count as votes, else 0.") \
    X(answered_recently, GAUGE, ONE, "node_answered_recently", "1 while this node answered within redis.probe_interval_ms + redis.command_timeout_ms, else 0.") \
    X(recovering, GAUGE, ONE, "node_recovering", "1 while a node that may have lost keys (restarted, flushed, new) does not vote yet, else 0.") \
    X(requests, COUNTER, ONE, "node_requests", "Requests sent to this node.") \
    X(errors, COUNTER, ONE, "node_errors", "Error replies from this node.") \
    X(timeouts, COUNTER, ONE, "node_timeouts", "Requests to this node unanswered within redis.command_timeout_ms.") \
    X(reconnects, COUNTER, ONE, "node_reconnects", "Reconnection attempts to this node after it was lost.") \
    X(restarts, COUNTER, ONE, "node_restarts", "Times this node came back with a new run_id (it restarted).") \
    X(latency_ms, GAUGE, MS, "node_latency_seconds", "Moving average of this node's reply time (each reply weighs 0.1).") \
    X(latency_max_ms, GAUGE, MS, "node_latency_max_seconds", "Longest reply time seen from this node.") \
    X(rejoin_in_ms, GAUGE, MS, "node_rejoin_in_seconds", "Seconds until this recovering node may vote again.")

/* ---- label sets and bucket sets ---------------------------------------- */

/*
 * A label set RESULT: STATS_RESULT_LABELS(V) lists V(value, help), where
 * help describes the cell alone. The cells of a row with dim RESULT are
 * indexed by STATS_RESULT_<value>. `split` exposes the row as one family
 * per value (redlockd_acquisitions_ok_total, the names /metrics has always
 * had) instead of one family with a result="..." label.
 */
#define STATS_RESULT_LABELS(V)                                               \
    V(ok, "LOCK requests granted.")                                          \
    V(busy, "LOCK requests answered ERR BUSY (held elsewhere, no wait).")    \
    V(timeout, "LOCK requests answered ERR TIMEOUT (still held when the "    \
               "wait ended).")                                               \
    V(unavailable, "LOCK requests answered ERR UNAVAILABLE (no quorum of "   \
                   "Redis nodes).")

/*
 * A bucket set: the upper bounds of a histogram's buckets, in seconds,
 * ascending (+Inf is implied). LATENCY is for request-sized durations.
 */
#define STATS_LATENCY_BOUNDS                                                 \
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  \
    0.25, 0.5, 1, 2.5, 5, 10

/* What a `dim` name stands for, three ways: the member's array suffix, its
 * label set and its bucket set. A new label or bucket set adds its three
 * lines here (and its tables in stats.c). */
#define STATS_DIM_NONE
#define STATS_LABELS_NONE NULL
#define STATS_BUCKETS_NONE NULL
#define STATS_DIM_RESULT [STATS_RESULT_N]
#define STATS_LABELS_RESULT (&stats_labels_result)
#define STATS_BUCKETS_RESULT NULL
#define STATS_DIM_LATENCY
#define STATS_LABELS_LATENCY NULL
#define STATS_BUCKETS_LATENCY (&stats_buckets_latency)

#define STATS_LABEL_ENUM(value, help) STATS_RESULT_##value,
enum stats_result { STATS_RESULT_LABELS(STATS_LABEL_ENUM) STATS_RESULT_N };
#undef STATS_LABEL_ENUM

struct stats_labels {
    const char *name;               /* the Prometheus label name */
    size_t n;
    const char *const *values;      /* the STATS keys and label values */
    const char *const *help;        /* per value, for `split` families */
    bool split;
};

/* The most buckets any bucket set has, +Inf included. */
#define STATS_HIST_MAX 20

struct stats_buckets {
    size_t n;                       /* bounds, +Inf not included */
    const double *le;
};

struct stats_hist {
    uint64_t count;
    double sum;                     /* seconds */
    uint64_t in[STATS_HIST_MAX];    /* per bucket, not cumulative; the last
                                     * used one is +Inf */
};

extern const struct stats_labels stats_labels_result;
extern const struct stats_buckets stats_buckets_latency;

/* ---- the generated struct and descriptors ------------------------------ */

enum stats_kind { STATS_COUNTER, STATS_GAUGE, STATS_HISTOGRAM };
enum stats_unit { STATS_UNIT_ONE, STATS_UNIT_MS, STATS_UNIT_SECONDS };

#define STATS_CTYPE_COUNTER uint64_t
#define STATS_CTYPE_GAUGE double
#define STATS_CTYPE_HISTOGRAM struct stats_hist

/* Generators, for STATS_CODEC-shaped lists. STATS_ROW_DESC needs
 * STATS_ROW_STRUCT defined as the struct the list's fields live in. */
#define STATS_ROW_FIELD(field, kind, unit, dim, metric, help)                \
    STATS_CTYPE_##kind field STATS_DIM_##dim;
#define STATS_ROW_DESC(field, kind, unit, dim, metric, help)                 \
    { #field, metric, help, STATS_##kind, STATS_UNIT_##unit,                 \
      STATS_LABELS_##dim, STATS_BUCKETS_##dim,                               \
      offsetof(STATS_ROW_STRUCT, field) },
/* Node rows have no dim: one number per node, the node is the label. */
#define STATS_NODE_ROW_FIELD(field, kind, unit, metric, help)               \
    STATS_ROW_FIELD(field, kind, unit, NONE, metric, help)
#define STATS_NODE_ROW_DESC(field, kind, unit, metric, help)                \
    STATS_ROW_DESC(field, kind, unit, NONE, metric, help)

struct stats_desc {
    const char *key;
    const char *metric;
    const char *help;
    enum stats_kind kind;
    enum stats_unit unit;
    const struct stats_labels *labels;      /* NULL: one cell */
    const struct stats_buckets *buckets;    /* histograms only */
    size_t offset;                          /* of the cell(s) in the struct */
};

struct stats_table {
    const struct stats_desc *rows;
    size_t n;
};

struct stats_node {
    char *name;                     /* (owned) HOST:PORT, the node label */
    STATS_NODE_CODEC(STATS_NODE_ROW_FIELD)
};

struct stats_values {
    STATS_CODEC(STATS_ROW_FIELD)
    /* Set by a provider for each report; NULL and 0 in `stats` itself. */
    struct stats_node *nodes;       /* (owned) nnodes of them */
    size_t nnodes;
    json_t *nodes_json;             /* (owned ref) STATS "nodes" as is */
};

extern const struct stats_table stats_table;        /* STATS_CODEC */
extern const struct stats_table stats_node_table;   /* STATS_NODE_CODEC */

/* What server, session and conn count directly. Fields that providers
 * fill stay 0 here: a report overwrites them on its copy. */
extern struct stats_values stats;

/* ---- collecting and reporting ------------------------------------------ */

typedef void stats_collect_fn(struct stats_values *v, void *ud);

/* The most providers that can be registered. */
#define STATS_PROVIDERS_MAX 8

/* Zero the counters, forget the providers, start the uptime clock. */
void stats_init(void);
/* Run collect(v, ud) on every report's copy, in the order added. Returns
 * 0, or -1 when STATS_PROVIDERS_MAX are registered already. */
int stats_provider_add(stats_collect_fn *collect, void *ud);
/* A report's values: a copy of `stats`, the uptime, then every provider.
 * Free with stats_values_deinit. */
void stats_collect(struct stats_values *v);
void stats_values_deinit(struct stats_values *v);
/* For providers: v->nodes as n zeroed nodes (gauges NaN), names unset. */
struct stats_node *stats_nodes_alloc(struct stats_values *v, size_t n);
void stats_node_set_name(struct stats_node *n, const char *name);

void stats_hist_observe(struct stats_hist *h, const struct stats_buckets *b,
                        double seconds);

/* The STATS reply object: "version", every STATS_CODEC row, "nodes". */
json_t *stats_json(void);
json_t *stats_values_json(const struct stats_values *v);
/* The rows of t at base as JSON members of obj. */
void stats_table_json(const struct stats_table *t, const void *base,
                      json_t *obj);
/* The reverse, for glue that gets its numbers as JSON: the rows of t from
 * the members of obj (histograms are not read; a missing gauge is NaN, a
 * missing counter 0). */
void stats_table_read_json(const struct stats_table *t, const json_t *obj,
                           void *base);

#endif
