/*
 * node: what a Redis node's history means for Redlock.
 *
 * The pool below says when a node comes up and when it fails (struct
 * pool_hooks); node turns that into the view redlock works with:
 *
 * - up/down: it logs a node going down once, and "still down" after that,
 *   until the node is up again;
 * - voting: a node's answers count only while it is up and its data is
 *   known to be intact (NODE_OK below);
 * - checks: right after it comes up, and every redis.probe_interval_ms,
 *   node reads the node's INFO (run_id, uptime), its recovery marker and
 *   whether it has a fence counter. The marker (key `<fence_key>:admitted`)
 *   holds the run_id under which the node was last admitted: a node whose
 *   marker names its current run_id kept everything since; a stale marker
 *   means it restarted from a snapshot or AOF (fine with appendfsync
 *   always, else it may have lost recent keys); no marker means it lost
 *   its data (restarted empty, flushed) or was never used. Any daemon,
 *   whenever it starts, reaches the same verdict from what the node says;
 * - recovery: a node that may have lost keys does not vote until keys it
 *   may have lost have expired everywhere (the longest lease that may
 *   live, plus drift, after its start, for a stale marker; after the loss
 *   was first noticed, for a missing one), then its fence counter is
 *   repaired, the marker is
 *   written, and it votes. The repair reads every reachable node's counter
 *   and takes the largest, and the largest fence this daemon granted; when
 *   fewer than a quorum of voting nodes are there to read from (two of
 *   three restarted), it also raises the counter to a clock epoch in the
 *   high bits, so fences stay monotonic without that quorum;
 * - the longest lease: a lease may be as long as the largest max_ttl_ms
 *   this daemon has had since it started, or the largest longest-ttl
 *   record (`<fence_key>:maxttl`, written by the grant and renewal
 *   scripts) read from any node, which covers leases of other daemons;
 * - the guard: voting scripts carry the run_id each node was admitted
 *   under and fail on a node whose marker no longer names it (lost data
 *   between two checks); node_lost_data starts its check at once;
 * - bootstrap: when every configured node answers and none has a marker or
 *   a fence counter, the cluster is new: node admits them all, logged;
 * - owed releases: an owner-checked release that could not reach a node
 *   (it was down, or an acquisition's undo failed there) is kept, bounded,
 *   and sent when the node is next up, since it may still run requests
 *   buffered before it stopped;
 * - the per-node report (struct node_report: what STATS and /metrics say
 *   of each node, copied by stats_glue.c field by field), and the sentence
 *   saying why nodes do not vote (for ERR UNAVAILABLE, STATS and
 *   /healthz).
 *
 * node_init starts the pool with node's hooks; main stops and frees both
 * through node_shutdown and node_free. The Redlock numbers node applies are
 * redlock's, handed down by redlock_init (node_set_rules), so that node
 * needs nothing from the module above it.
 */
#ifndef REDLOCKD_NODE_H
#define REDLOCKD_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "conf.h"
#include "pool.h"
#include "timer.h"

/* The Redlock rules node applies to restarted nodes. */
struct node_rules {
    int quorum;             /* counters a fence repair must read */
    /* The clock drift allowed on a lease of ttl ms: a node that may have
     * lost keys waits the longest ttl that may live plus this before it
     * votes, unless it runs AOF with appendfsync always. */
    int64_t (*drift_ms)(uint32_t ttl);
};
/* Copied; may come before node_init (redlock_init calls it). */
void node_set_rules(const struct node_rules *rules);

/* Set up every node's state, then pool_init (on_release and on_watch go
 * to the pool's subscriber links). Returns pool_init's status. */
int node_init(uv_loop_t *loop, const struct conf *conf,
              pool_release_cb on_release, pool_release_cb on_watch);
/* Stop the repair timers and refuse new owed releases; pool_shutdown. */
void node_shutdown(void);
/* Free the nodes and what they were still owed; pool_free. */
void node_free(void);

/* May this node's answer count as a vote right now? */
bool node_votes(int node);
/* Moves on whenever the node goes up or down or is admitted: an answer
 * counts as a vote only if the node votes and this has not moved since the
 * request was sent (a request sent before the node was admitted went out
 * without the guard). */
uint64_t node_vote_gen(int node);
/* The SCRIPT_GUARD_WORDS words that end a voting script's arguments for
 * this node (script.h): pointers into node's own strings, valid until the
 * next loop turn. */
void node_guard(int node, const char **words, size_t *lens);
/* The node answered LOSTDATA (its marker is not what it was admitted
 * under): it stops voting at once and is checked; the check starts its
 * recovery. why is logged. */
void node_lost_data(int node, const char *why);
/* After a SIGHUP: a raised locks.max_ttl_ms lengthens recovery waits (a
 * lowered one shortens none). */
void node_reloaded(void);
/* How many nodes vote right now. */
int node_nvoting(void);

/* Send an owner-checked release of key with token to this node when it is
 * next up. Both are copied. */
void node_release_later(int node, const char *key, size_t keylen,
                        const char *token);
/* Undo a failed acquisition: owner-checked delete of key on every node,
 * without announcing a release (nobody waits for keys that never made a
 * lock). Nodes it cannot reach are owed it. Both are copied. */
void node_undo(const char *key, size_t keylen, const char *token);
/* Remember the largest fence granted (repairs never go below it). */
void node_note_fence(uint64_t fence);

/*
 * One line saying why the nodes that do not vote right now do not, for
 * ERR UNAVAILABLE and the log, e.g. "node 127.0.0.1:6380 is recovering from
 * a restart until 2026-12-02T10:00:00Z (in 86399 s); 127.0.0.1:6381 is
 * down: connection refused". Printable ASCII only; "" when every node
 * votes. Returns the length it wanted (snprintf style).
 */
size_t node_why_unavailable(char *buf, size_t size);

/*
 * End recoveries deliberately (an operator who knows no lock outlived the
 * loss): for the node named as in redis.nodes, or every node for "all",
 * that is recovering or waiting for a bootstrap, repair its fence counter
 * at once (monotonic, as any repair) and then let it vote; a node that is
 * down is repaired as soon as it is back. Logged at notice. msg gets one
 * line for the operator. Returns how many recoveries it ended (0: none
 * was recovering), or -1 when the name matches no node.
 */
int node_end_recovery(const char *node_name_or_all, char *msg, size_t len);

/* Room for one node's explanation (node_report's why), NUL included. */
#define NODE_WHY_SIZE 320

/*
 * What node says of one node, for STATS and /metrics. The names of its
 * numbers are the rows of STATS_NODE_CODEC (stats.h), which stats_glue.c
 * copies from here row by row: a row without its field here fails to
 * compile. Pointers are into node's and the pool's own storage, valid
 * until the next loop turn.
 */
struct node_report {
    const char *name;           /* HOST:PORT, as in redis.nodes */
    const char *state;          /* "voting", "checking", ..., or "down" */
    bool up;                    /* a connection to it is up */
    bool voting;                /* node_votes() */
    bool answered_recently;     /* within probe_interval_ms +
                                   command_timeout_ms */
    bool recovering;            /* may have lost keys; not voting yet */
    bool aof_always;            /* appendfsync always, as it last said */
    uint64_t requests, calls, errors, timeouts, reconnects; /* the pool's */
    uint64_t restarts;          /* came back with a new run_id */
    double latency_ms;          /* moving average */
    double latency_max_ms;
    double rejoin_in_ms;        /* until it may vote again; NaN when it
                                   is not waiting to */
    char until[TIMER_UTC_SIZE]; /* the same as a UTC time, or "" */
    char why[NODE_WHY_SIZE];    /* why it does not vote, or "" */
    const char *run_id;         /* "" if never seen */
    const char *last_error;     /* the pool's, "" if none yet */
};

/* How many nodes there are (redis.nodes), and the report on one of them,
 * 0 <= node < node_count(). */
int node_count(void);
void node_report(int node, struct node_report *r);

#endif
