/*
 * node: what a Redis node's history means for Redlock.
 *
 * The pool below says when a node comes up and when it fails (struct
 * pool_hooks); node turns that into the view redlock works with:
 *
 * - up/down: it logs a node going down once, and "still down" after that,
 *   until the node is up again;
 * - voting: a node's answers count only while it is up and not recovering;
 * - restarts: a run_id that differs from the last one seen means the node
 *   may have lost its keys and its fence counter. It stays connected (it
 *   receives every write, so it catches up) but does not vote until
 *   max_ttl_ms plus drift has passed (not at all if it runs appendonly with
 *   appendfsync always) and its fence counter has been raised to the
 *   largest read from a quorum of the others, or, with too few others, to
 *   the largest fence this daemon has seen (redlock reports each grant);
 * - owed releases: an owner-checked release that could not reach a node
 *   (it was down, or an acquisition's undo failed there) is kept, bounded,
 *   and sent when the node is next up, since it may still run requests
 *   buffered before it stopped;
 * - the per-node STATS objects.
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

#include <jansson.h>
#include <uv.h>

#include "conf.h"
#include "pool.h"

/* The Redlock rules node applies to restarted nodes. */
struct node_rules {
    int quorum;             /* counters a fence repair must read */
    uint64_t readmit_ms;    /* a restarted node's wait before it votes,
                               unless it runs AOF with appendfsync always */
};
/* Copied; may come before node_init (redlock_init calls it). */
void node_set_rules(const struct node_rules *rules);

/* Set up every node's state, then pool_init (on_release goes to the pool's
 * subscriber links). Returns pool_init's status. */
int node_init(uv_loop_t *loop, const struct conf *conf,
              pool_release_cb on_release);
/* Stop the repair timers and refuse new owed releases; pool_shutdown. */
void node_shutdown(void);
/* Free the nodes and what they were still owed; pool_free. */
void node_free(void);

/* May this node's answer count as a vote right now? */
bool node_votes(int node);
/* How many nodes vote right now. */
int node_nvoting(void);

/* Send an owner-checked release of key with token to this node when it is
 * next up. Both are copied. */
void node_release_later(int node, const char *key, size_t keylen,
                        const char *token);
/* Remember the largest fence granted (repairing a restarted node uses it
 * when too few other nodes are there to read the counter from). */
void node_note_fence(uint64_t fence);

/* Per-node state for STATS: an array of objects, one per node. */
json_t *node_stats_json(void);

#endif
