/*
 * stats: the daemon's counters, gauges and histograms, as one codec.
 *
 * Every number the daemon reports is one row of STATS_CODEC below (or of
 * STATS_NODE_CODEC, for the per-node numbers, or STATS_PROCESS_CODEC, for
 * the standard process_* ones). The rows generate the struct that holds
 * the values and a table of descriptors; the STATS JSON (stats.c) and the
 * Prometheus exposition (metrics.c) are both walks over those tables, so
 * a key, its type, its labels and its help text cannot drift apart.
 *
 * Where the values come from, one way for every module: a module counts
 * what happens in it in counters of its own, a struct it hands out
 * read-only (conn_counters, server_counters, session_counters,
 * lockmgr_counters with its LOCKMGR_COUNTERS list, pool_node_stats and
 * node's struct node_report), and tells how long things took to an
 * observer it declares (lockmgr_observer: waits and holds per resource;
 * session_observer: LOCK answers; pool_set_reply_observer: node replies).
 * No module counts through this file: a counter stays a plain increment
 * in the module that owns it. stats_glue.c, above them all, is the one
 * place that maps those numbers into the codec: its providers
 * (stats_provider_add) fill each report's values from the counters by
 * name, so a name that does not match fails to compile, and its observers
 * feed the histograms this file keeps, through the observation points
 * below. The process's numbers are read from /proc/self for each report.
 * Besides stats_glue.c, this file is included by those that read a report
 * (metrics.c for /metrics, session_inspect.c for the STATS reply) and by
 * main.c, which starts it. stats.c itself includes nothing above it.
 */
#ifndef REDLOCKD_STATS_H
#define REDLOCKD_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* By its path from the top, so that the tests that read the codec's lists
 * from outside the daemon (tests/integration/test_metrics.c) find it. */
#include "proto/proto.h"

/*
 * A row: X(field, kind, unit, dim, metric, help)
 *
 *   field   the member of struct stats_values, and its STATS JSON key
 *   kind    COUNTER (uint64_t, only grows), GAUGE (double, a level now;
 *           NaN means "not reported", the key is left out), HISTOGRAM
 *           (struct stats_hist)
 *   unit    ONE (a count, or bytes), MS (kept and shown in STATS as
 *           milliseconds, exported to Prometheus in seconds), SECONDS
 *           (histograms)
 *   dim     NONE, a label set (the row is an array, one cell per label
 *           value, and one family with that label in /metrics), or for a
 *           histogram its bucket set
 *   metric  the Prometheus name after the table's prefix ("redlockd_");
 *           counters get "_total"
 *   help    what the number is, for # HELP
 *
 * STATS keys are an interface (tools and tests read them): rename a field
 * only together with its readers. How a labelled row shows in STATS is
 * its label set's (stats_labels.json). Order here is the order in STATS
 * and in /metrics; new rows go at the end.
 */
#define STATS_CODEC(X)                                                       \
    X(uptime_ms, GAUGE, MS, NONE, "uptime_seconds", "Seconds since the daemon started.") \
    X(connections, GAUGE, ONE, NONE, "connections", "Client connections open now.") \
    X(connections_total, COUNTER, ONE, NONE, "connections", "Client connections accepted, the refused ones included.") \
    X(connections_rejected, COUNTER, ONE, NONE, "connections_rejected", "Client connections refused with an ERR line (max_clients, protected mode, shutting down).") \
    X(sessions, GAUGE, ONE, NONE, "sessions", "Client sessions alive now (one per open connection).") \
    X(commands, COUNTER, ONE, COMMAND, "commands", "Request lines received, malformed ones included (empty lines not), by command; other: the first word is no command.") \
    X(errors, COUNTER, ONE, ERROR, "errors", "ERR replies sent, by code.") \
    X(locks_held, GAUGE, ONE, NONE, "locks_held", "Locks held by sessions of this daemon now.") \
    X(waiters, GAUGE, ONE, NONE, "waiters", "LOCK requests not answered yet: queued for a resource or being tried on Redis now.") \
    X(acquisitions, COUNTER, ONE, RESULT, "acquisitions", "LOCK requests answered, by result: ok (granted), busy (ERR BUSY: held elsewhere, no wait), timeout (ERR TIMEOUT: still held when the wait ended), unavailable (ERR UNAVAILABLE: no quorum of Redis nodes).") \
    X(releases, COUNTER, ONE, NONE, "releases", "Leases released: UNLOCK, the end of a session, or a lost lease's keys removed.") \
    X(extends, COUNTER, ONE, NONE, "extends", "EXTEND requests answered, granted or not (OK, ERR LOST, ERR UNAVAILABLE).") \
    X(renewals, COUNTER, ONE, NONE, "renewals", "Automatic lease renewals that reached a quorum.") \
    X(renewal_failures, COUNTER, ONE, NONE, "renewal_failures", "Automatic lease renewals that did not reach a quorum (retried while the lease is valid).") \
    X(leases_lost, COUNTER, ONE, NONE, "leases_lost", "Leases lost: a renewal or EXTEND found them gone, or their validity ran out.") \
    X(waits, COUNTER, ONE, NONE, "waits", "LOCK requests that allowed a wait (wait= above 0).") \
    X(wakeups, COUNTER, ONE, CAUSE, "wakeups", "Queued LOCK requests retried, by cause: notified (the holder released: a release notice or a local release), retry (the fallback timer, locks.retry_ms).") \
    X(output_overflows, COUNTER, ONE, NONE, "output_overflows", "Clients disconnected for not reading their replies (limits.max_output_bytes).") \
    /* A gauge must not end in _total, which scrapers read as a counter. */ \
    X(nodes_total, GAUGE, ONE, NONE, "nodes_configured", "Redis nodes configured.") \
    X(nodes_voting, GAUGE, ONE, NONE, "nodes_voting", "Redis nodes whose answers count as votes now.") \
    X(quorum, GAUGE, ONE, NONE, "quorum", "Votes needed to grant a lock.") \
    X(sessions_detached, GAUGE, ONE, NONE, "sessions_detached", "Sessions whose connection ended without QUIT after HELLO detach=, holding their locks until a HELLO resume= or detach ms.") \
    X(adopts, COUNTER, ONE, NONE, "adopts", "ADOPTs granted: leases taken over by their token (the token rotated on a quorum).") \
    X(adopts_left, COUNTER, ONE, NONE, "adopts_left", "ADOPTs that rotated the token on a quorum but were not held here (the asking session had ended, or the lease could not be held beside what this daemon holds): the keys were left to expire at the ADOPT's ttl, never deleted.") \
    X(acquire_seconds, HISTOGRAM, SECONDS, LATENCY, "acquire_seconds", "LOCK requests without a wait (wait=0), any answer: seconds from the request to the answer.") \
    X(wait_seconds, HISTOGRAM, SECONDS, DURATION, "wait_seconds", "LOCK requests that allowed a wait (wait= above 0), any answer: seconds from the request to the answer.") \
    X(hold_seconds, HISTOGRAM, SECONDS, DURATION, "hold_seconds", "Leases ended (released, lost, or their session ended): seconds from the grant to the end.") \
    X(tls_handshakes, COUNTER, ONE, NONE, "tls_handshakes", "TLS handshakes completed on tls:// listeners.") \
    X(tls_handshake_failures, COUNTER, ONE, TLSFAIL, "tls_handshake_failures", "Connections closed before a TLS handshake completed, by reason: plaintext (plain text on a tls:// port), plain_port (a TLS handshake on a plain port), timeout (limits.handshake_timeout_ms), eof (the client left), version (no common protocol version), no_client_cert and bad_client_cert (tls.verify_clients), peer_alert (the client refused the handshake, e.g. our certificate), protocol (anything else).")

/*
 * Per Redis node, exported with a node="HOST:PORT" label. The fields are
 * the keys of the node objects in STATS "nodes", and the names of struct
 * node_report's numbers (node.h), which stats_glue.c copies row by row.
 * A node histogram has the LATENCY buckets.
 */
#define STATS_NODE_CODEC(X)                                                  \
    X(up, GAUGE, ONE, "node_up", "1 while at least one connection to this Redis node is up, else 0.") \
    X(voting, GAUGE, ONE, "node_voting", "1 while this node's answers count as votes, else 0.") \
    X(answered_recently, GAUGE, ONE, "node_answered_recently", "1 while this node answered within redis.probe_interval_ms + redis.command_timeout_ms, else 0.") \
    X(recovering, GAUGE, ONE, "node_recovering", "1 while a node that may have lost keys (restarted, flushed, new) does not vote yet, else 0.") \
    X(requests, COUNTER, ONE, "node_requests", "Requests sent to this node.") \
    X(calls, COUNTER, ONE, "node_calls", "Calls sent to this node: one per request, or one for a group commit's requests together.") \
    X(errors, COUNTER, ONE, "node_errors", "Error replies from this node.") \
    X(timeouts, COUNTER, ONE, "node_timeouts", "Requests to this node unanswered within redis.command_timeout_ms.") \
    X(reconnects, COUNTER, ONE, "node_reconnects", "Reconnection attempts to this node after it was lost.") \
    X(restarts, COUNTER, ONE, "node_restarts", "Times this node came back with a new run_id (it restarted).") \
    X(latency_ms, GAUGE, MS, "node_latency_seconds", "Moving average of this node's reply time (each reply weighs 0.1).") \
    X(latency_max_ms, GAUGE, MS, "node_latency_max_seconds", "Longest reply time seen from this node.") \
    X(rejoin_in_ms, GAUGE, MS, "node_rejoin_in_seconds", "Seconds until this recovering node may vote again.") \
    X(request_seconds, HISTOGRAM, SECONDS, "node_request_seconds", "Replies from this node: seconds from sending the request to the reply.")

/*
 * Per resource class (rclass.h; metrics.resource_classes), exported with a
 * class="..." label: at most metrics.max_classes of them and "other". In
 * STATS, the object "classes", one member per class named by it. The
 * wait rows are observed in lockmgr from the LOCK to its answer, once per
 * resource the LOCK names, and only for the answers that say how long a
 * lock was waited for: a grant (at once or after a wait) and ERR TIMEOUT.
 */
#define STATS_CLASS_CODEC(X)                                                 \
    X(wait_seconds, HISTOGRAM, SECONDS, WAITED, "lock_wait_seconds", "LOCK requests answered, per resource they name, by result: granted (at once or after a wait), timeout (ERR TIMEOUT): seconds from the request to the answer.") \
    X(hold_seconds, HISTOGRAM, SECONDS, DURATION, "lock_hold_seconds", "Leases ended (released, lost, or their session ended): seconds from the grant to the end.")

/*
 * The process, as every Prometheus client library exports it (prefix
 * "process_", read from /proc/self). In STATS, the object "process".
 */
#define STATS_PROCESS_CODEC(X)                                               \
    X(start_time_ms, GAUGE, MS, NONE, "start_time_seconds", "Start time of the process since the Unix epoch, in seconds.") \
    X(cpu_ms, COUNTER, MS, NONE, "cpu_seconds", "User and system CPU time spent, in seconds.") \
    X(resident_memory_bytes, GAUGE, ONE, NONE, "resident_memory_bytes", "Resident memory size, in bytes.") \
    X(virtual_memory_bytes, GAUGE, ONE, NONE, "virtual_memory_bytes", "Virtual memory size, in bytes.") \
    X(open_fds, GAUGE, ONE, NONE, "open_fds", "Open file descriptors.") \
    X(max_fds, GAUGE, ONE, NONE, "max_fds", "The most file descriptors the process may open (RLIMIT_NOFILE).")

/* ---- label sets and bucket sets ---------------------------------------- */

/*
 * Label sets of the daemon's own: V(value) lists the label values, which
 * are also the STATS keys of the cells. The cells of a row with dim
 * RESULT are indexed by STATS_RESULT_<value>, those of CAUSE by
 * STATS_CAUSE_<value>.
 */
#define STATS_RESULT_LABELS(V) V(ok) V(busy) V(timeout) V(unavailable)
#define STATS_WAITED_LABELS(V) V(granted) V(timeout)
#define STATS_CAUSE_LABELS(V) V(notified) V(retry)
#define STATS_TLSFAIL_LABELS(V)                                              \
    V(plaintext) V(plain_port) V(timeout) V(eof) V(version)                  \
    V(no_client_cert) V(bad_client_cert) V(peer_alert) V(protocol)

#define STATS_LABEL_ENUM_RESULT(value) STATS_RESULT_##value,
#define STATS_LABEL_ENUM_WAITED(value) STATS_WAITED_##value,
#define STATS_LABEL_ENUM_CAUSE(value) STATS_CAUSE_##value,
#define STATS_LABEL_ENUM_TLSFAIL(value) STATS_TLSFAIL_##value,
enum stats_result { STATS_RESULT_LABELS(STATS_LABEL_ENUM_RESULT) STATS_RESULT_N };
enum stats_waited { STATS_WAITED_LABELS(STATS_LABEL_ENUM_WAITED) STATS_WAITED_N };
enum stats_cause { STATS_CAUSE_LABELS(STATS_LABEL_ENUM_CAUSE) STATS_CAUSE_N };
enum stats_tlsfail {
    STATS_TLSFAIL_LABELS(STATS_LABEL_ENUM_TLSFAIL) STATS_TLSFAIL_N
};
#undef STATS_LABEL_ENUM_RESULT
#undef STATS_LABEL_ENUM_WAITED
#undef STATS_LABEL_ENUM_CAUSE
#undef STATS_LABEL_ENUM_TLSFAIL

/*
 * The protocol's words are label sets too, indexed by enum proto_cmd and
 * enum proto_err: command="LOCK", code="BUSY". Cell 0 (PROTO_*_NONE) is
 * "other": a line whose first word is no command, or an ERR reply whose
 * code stats was not told.
 */
#define STATS_COMMAND_N PROTO_CMD_COUNT
#define STATS_ERROR_N PROTO_ERR_COUNT

/* How a labelled row shows in STATS. */
enum stats_json_view {
    STATS_JSON_OBJECT,      /* "acquisitions": {"ok": 1, "busy": 0, ...} */
    STATS_JSON_FLAT,        /* "wakeups_notified": 1, "wakeups_retry": 0 */
    STATS_JSON_SUM,         /* "commands": 12 (the cells' sum) */
};

struct stats_labels {
    const char *name;               /* the Prometheus label name */
    size_t n;
    const char *const *values;      /* the label values (and STATS keys) */
    enum stats_json_view json;
};

/*
 * A bucket set: the upper bounds of a histogram's buckets, in seconds,
 * ascending (+Inf is implied). LATENCY is for request-sized durations,
 * DURATION for what a client may wait or hold (up to a day).
 */
#define STATS_LATENCY_BOUNDS                                                 \
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  \
    0.25, 0.5, 1, 2.5, 5, 10
#define STATS_DURATION_BOUNDS                                                \
    0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800, 3600,     \
    21600, 86400

/*
 * What a `dim` name stands for, three ways: the cells (the member), the
 * label set and the bucket set. A new label or bucket set adds its three
 * lines here (and its tables in stats.c).
 */
#define STATS_CELLS_NONE(type, field) type field;
#define STATS_LABELS_NONE NULL
#define STATS_BUCKETS_NONE NULL
#define STATS_CELLS_RESULT(type, field) type field[STATS_RESULT_N];
#define STATS_LABELS_RESULT (&stats_labels_result)
#define STATS_BUCKETS_RESULT NULL
#define STATS_CELLS_CAUSE(type, field) type field[STATS_CAUSE_N];
#define STATS_LABELS_CAUSE (&stats_labels_cause)
#define STATS_BUCKETS_CAUSE NULL
#define STATS_CELLS_TLSFAIL(type, field) type field[STATS_TLSFAIL_N];
#define STATS_LABELS_TLSFAIL (&stats_labels_tlsfail)
#define STATS_BUCKETS_TLSFAIL NULL
#define STATS_CELLS_COMMAND(type, field) type field[STATS_COMMAND_N];
#define STATS_LABELS_COMMAND (&stats_labels_command)
#define STATS_BUCKETS_COMMAND NULL
#define STATS_CELLS_ERROR(type, field) type field[STATS_ERROR_N];
#define STATS_LABELS_ERROR (&stats_labels_error)
#define STATS_BUCKETS_ERROR NULL
#define STATS_CELLS_LATENCY(type, field) type field;
#define STATS_LABELS_LATENCY NULL
#define STATS_BUCKETS_LATENCY (&stats_buckets_latency)
#define STATS_CELLS_DURATION(type, field) type field;
#define STATS_LABELS_DURATION NULL
#define STATS_BUCKETS_DURATION (&stats_buckets_duration)
/* Histograms by result, with the DURATION buckets. */
#define STATS_CELLS_WAITED(type, field) type field[STATS_WAITED_N];
#define STATS_LABELS_WAITED (&stats_labels_waited)
#define STATS_BUCKETS_WAITED (&stats_buckets_duration)

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
extern const struct stats_labels stats_labels_waited;
extern const struct stats_labels stats_labels_cause;
extern const struct stats_labels stats_labels_tlsfail;
extern const struct stats_labels stats_labels_command;
extern const struct stats_labels stats_labels_error;
extern const struct stats_buckets stats_buckets_latency;
extern const struct stats_buckets stats_buckets_duration;

/* ---- the generated struct and descriptors ------------------------------ */

enum stats_kind { STATS_COUNTER, STATS_GAUGE, STATS_HISTOGRAM };
enum stats_unit { STATS_UNIT_ONE, STATS_UNIT_MS, STATS_UNIT_SECONDS };

#define STATS_CTYPE_COUNTER uint64_t
#define STATS_CTYPE_GAUGE double
#define STATS_CTYPE_HISTOGRAM struct stats_hist

/* Generators, for STATS_CODEC-shaped lists. STATS_ROW_DESC needs
 * STATS_ROW_STRUCT defined as the struct the list's fields live in. */
#define STATS_ROW_FIELD(field, kind, unit, dim, metric, help)                \
    STATS_CELLS_##dim(STATS_CTYPE_##kind, field)
#define STATS_ROW_DESC(field, kind, unit, dim, metric, help)                 \
    { #field, metric, help, STATS_##kind, STATS_UNIT_##unit,                 \
      STATS_LABELS_##dim, STATS_BUCKETS_##dim,                               \
      offsetof(STATS_ROW_STRUCT, field) },
/* Node rows have no dim: one number per node, the node is the label; a
 * histogram's buckets follow from its kind. The extra step expands
 * STATS_NODE_DIM_<kind> before STATS_ROW_* paste it. */
#define STATS_NODE_DIM_COUNTER NONE
#define STATS_NODE_DIM_GAUGE NONE
#define STATS_NODE_DIM_HISTOGRAM LATENCY
#define STATS_ROW_FIELD_(...) STATS_ROW_FIELD(__VA_ARGS__)
#define STATS_ROW_DESC_(...) STATS_ROW_DESC(__VA_ARGS__)
#define STATS_NODE_ROW_FIELD(field, kind, unit, metric, help)               \
    STATS_ROW_FIELD_(field, kind, unit, STATS_NODE_DIM_##kind, metric, help)
#define STATS_NODE_ROW_DESC(field, kind, unit, metric, help)                \
    STATS_ROW_DESC_(field, kind, unit, STATS_NODE_DIM_##kind, metric, help)

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
    const char *prefix;                     /* of its Prometheus names */
    const struct stats_desc *rows;
    size_t n;
};

struct stats_node {
    char *name;                     /* (owned) HOST:PORT, the node label */
    char *why;                      /* (owned) why it does not vote, or ""
                                     * (NULL when no provider said) */
    STATS_NODE_CODEC(STATS_NODE_ROW_FIELD)
};

struct stats_process {
    STATS_PROCESS_CODEC(STATS_ROW_FIELD)
};

struct stats_class {
    const char *name;               /* the class label (rclass's storage,
                                     * valid during the report) */
    STATS_CLASS_CODEC(STATS_ROW_FIELD)
};

struct stats_values {
    STATS_CODEC(STATS_ROW_FIELD)
    /* Read for each report (stats_collect); zero in `stats` itself. */
    struct stats_process process;
    /* Set by a provider for each report; NULL and 0 in `stats` itself. */
    struct stats_node *nodes;       /* (owned) nnodes of them */
    size_t nnodes;
    json_t *nodes_json;             /* (owned ref) STATS "nodes" as is */
    struct stats_class *classes;    /* (owned) nclasses, by class index */
    size_t nclasses;
};

extern const struct stats_table stats_table;        /* STATS_CODEC */
extern const struct stats_table stats_node_table;   /* STATS_NODE_CODEC */
extern const struct stats_table stats_process_table; /* STATS_PROCESS_CODEC */
extern const struct stats_table stats_class_table;  /* STATS_CLASS_CODEC */

/* ---- observation points ------------------------------------------------ */

/*
 * The histograms stats keeps itself, fed by the observers stats_glue.c
 * installs in the modules where these things happen (no module calls
 * these by name). They take plain numbers and call nothing.
 */

/* A LOCK request was answered, granted or not, `seconds` after its line
 * was read. waited: it allowed a wait (wait= above 0, as `waits` counts),
 * observed in wait_seconds; otherwise in acquire_seconds. */
void stats_observe_lock(bool waited, double seconds);
/* A lease ended (released, lost, or with its session) `seconds` after it
 * was granted. */
void stats_observe_hold(double seconds);
/* A LOCK answered granted or ERR TIMEOUT `seconds` after it was asked,
 * for one resource it named, of class `cls` (an rclass index). */
void stats_observe_class_wait(size_t cls, bool granted, double seconds);
/* A lease on a resource of class `cls` ended `seconds` after its grant. */
void stats_observe_class_hold(size_t cls, double seconds);
/* The classes were made anew (a reload changed them): their histograms
 * start from zero. */
void stats_classes_reset(void);
/* Node `node` (the pool's index, as in pool_node_stats) replied `seconds`
 * after the request was sent. */
void stats_observe_node_request(int node, double seconds);
/* The histogram of node's replies so far, or NULL when none came. */
const struct stats_hist *stats_node_request_hist(int node);

/* ---- collecting and reporting ------------------------------------------ */

typedef void stats_collect_fn(struct stats_values *v, void *ud);

/* The most providers that can be registered. */
#define STATS_PROVIDERS_MAX 8

/* Zero the counters and histograms, forget the providers, start the
 * uptime clock and note the process's start time. */
void stats_init(void);
/* Run collect(v, ud) on every report's copy, in the order added. Returns
 * 0, or -1 when STATS_PROVIDERS_MAX are registered already. */
int stats_provider_add(stats_collect_fn *collect, void *ud);
/* A report's values: a copy of `stats`, the uptime, the process's
 * numbers, then every provider. Free with stats_values_deinit. */
void stats_collect(struct stats_values *v);
void stats_values_deinit(struct stats_values *v);
/* For providers: v->nodes as n zeroed nodes (gauges NaN), names unset. */
struct stats_node *stats_nodes_alloc(struct stats_values *v, size_t n);
void stats_node_set_name(struct stats_node *n, const char *name);
void stats_node_set_why(struct stats_node *n, const char *why);
/* For providers: v->classes as n classes with their histograms so far,
 * names unset. */
struct stats_class *stats_classes_alloc(struct stats_values *v, size_t n);

void stats_hist_observe(struct stats_hist *h, const struct stats_buckets *b,
                        double seconds);

/* The STATS reply object: "version", every STATS_CODEC row, "nodes",
 * "process", "classes". */
json_t *stats_json(void);
json_t *stats_values_json(const struct stats_values *v);
/* The rows of t at base as JSON members of obj. */
void stats_table_json(const struct stats_table *t, const void *base,
                      json_t *obj);
/* One histogram as STATS shows it: {"count", "sum", "le", "buckets"}
 * (cumulative, the last one +Inf). */
json_t *stats_hist_json(const struct stats_hist *h,
                        const struct stats_buckets *b);

#endif
