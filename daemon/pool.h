/*
 * pool: async connections to the N independent Redis nodes.
 *
 * Each node gets `pool_size` hiredis connections attached to the libuv loop
 * plus one subscriber connection for release notifications. hiredis 0.14 has
 * no timeouts, so connect and per-request deadlines are daemon timers: a
 * request not answered within command_timeout_ms marks the node down, which
 * drops its connections (hiredis then fails every pending request with a
 * NULL reply) and reconnects with capped exponential backoff.
 *
 * A node whose run_id changed since we last saw it may have lost its keys
 * and fence counter: it is connected but does not vote until it has been
 * repaired (fence counter raised to the quorum maximum) and, unless it runs
 * AOF with appendfsync always, max_ttl plus drift has passed (the Redlock
 * paper's delayed restart, applied by the daemon).
 */
#ifndef REDLOCKD_POOL_H
#define REDLOCKD_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <uv.h>

#include "conf.h"

/* The most words one request may carry (a script's keys and arguments, or a
 * command with its name); acquire's 2 keys and 2 arguments are the most
 * any caller sends. pool_script and pool_command refuse more. */
#define POOL_MAX_ARGS 8
/* Room for any 64-bit integer in decimal, sign and NUL included. */
#define POOL_NUM_SIZE sizeof("-9223372036854775808")
/* The longest run_id kept (Redis's is 40 hex chars), and an error's room. */
#define POOL_RUN_ID_MAX 47
#define POOL_ERR_SIZE 128

enum pool_script {
    POOL_SCRIPT_ACQUIRE,    /* KEYS lock,fence ARGV token,ttl -> {1,fence}|{0,pttl} */
    POOL_SCRIPT_RELEASE,    /* KEYS lock ARGV token,channel -> 1|0 */
    POOL_SCRIPT_EXTEND,     /* KEYS lock ARGV token,ttl -> 1|0 */
    POOL_SCRIPT_RAISE,      /* KEYS fence ARGV value -> 1 */
    POOL_SCRIPT_COUNT
};

/* Called once per request: r is the reply, or NULL when the node failed,
 * timed out or is shutting down. r lives only during the call. */
typedef void (*pool_reply_cb)(void *ud, int node, redisReply *r);
/* Called for each release notification: the key that was released. */
typedef void (*pool_release_cb)(const char *key, size_t len);

int pool_init(uv_loop_t *loop, const struct conf *conf, pool_release_cb on_release);
/* Drop every connection and stop reconnecting; pending requests fail. */
void pool_shutdown(void);
/* Free the nodes (after pool_shutdown, once no operation is left). */
void pool_free(void);

int pool_nnodes(void);
/* Are requests still waiting for replies? (shutdown drains them) */
bool pool_busy(void);
int pool_quorum(void);
/* May this node's answer count as a vote right now? */
bool pool_node_votes(int node);
bool pool_node_up(int node);
const char *pool_node_name(int node);
int pool_nodes_voting(void);

/*
 * Send one script or command to a node. Arguments are copied. Returns 0 when
 * sent (cb will be called exactly once, later) or -1 when the node has no
 * usable connection or the request has more than POOL_MAX_ARGS words (cb is
 * not called: count it as a failed vote).
 */
int pool_script(int node, enum pool_script s, int nkeys, int nargs,
                const char **argv, const size_t *lens,
                pool_reply_cb cb, void *ud);
int pool_command(int node, int argc, const char **argv, const size_t *lens,
                 pool_reply_cb cb, void *ud);

/* Send an owner-checked release of key to this node when it is next up
 * (it was down when the release, or the undo of a failed acquisition, was
 * due, and may still run requests buffered before it stopped). */
void pool_release_later(int node, const char *key, size_t keylen,
                        const char *token);
/* Remember the largest fence seen (repairing a restarted node uses it when
 * too few other nodes are there to read the counter from). */
void pool_note_fence(uint64_t fence);

/* Per-node state for STATS/STATUS: an array of objects. */
json_t *pool_stats_json(void);

#endif
