/*
 * pool: the transport to the N Redis nodes: links, requests, deadlines.
 *
 * Each node gets `pool_size` hiredis connections (links) attached to the
 * libuv loop plus one subscriber link for release notifications. A link
 * carries requests once its handshake is done: AUTH, SELECT, SCRIPT LOAD of
 * every script (script.h), CONFIG GET of the AOF settings and INFO server (the
 * subscriber: AUTH and SUBSCRIBE). hiredis 0.14 has no timeouts, so connect
 * and per-request deadlines are daemon timers: a request not answered within
 * command_timeout_ms fails the node, which drops its links (hiredis then
 * fails every pending request with a NULL reply) and reconnects with capped
 * exponential backoff. Scripts (script.h) go out as EVALSHA, and as EVAL
 * after a NOSCRIPT (a restarted node has an empty script cache). The pool
 * moves a call's words; what they mean is script.h's.
 *
 * Probes: every redis.probe_interval_ms each data link that sent nothing
 * meanwhile sends a PING, and the subscriber link, when it heard nothing,
 * is sent a message on its own probe channel (PUBLISH on a data link). A
 * probe has the deadline of any request, so a node that froze is failed
 * within probe_interval_ms + command_timeout_ms even without traffic. TCP
 * links also get kernel keepalive. (A PING on the subscriber itself does
 * not work with hiredis 0.14: it files the callback where an array reply
 * never reaches it and looks the "pong" up as a pattern subscription.)
 *
 * Release notifications are "<key> <instance id>": the release script
 * publishes this daemon's random instance id (drawn at pool_init) with the
 * key, and notifications carrying our own id are dropped, so a daemon is
 * never woken by its own announcement. A message without an id (an older
 * daemon) is taken as a bare key.
 *
 * The pool knows whether a node is reachable, not what that means for
 * Redlock. It tells its user through struct pool_hooks when a node comes up
 * (with the run_id and AOF settings its handshake read) and when it fails;
 * node.c, above it, turns that into voting, restart detection, fence repair
 * and owed releases. It counts per node (pool_node_stats) and tells each
 * reply's time to an observer (pool_set_reply_observer); it knows no
 * stats.
 */
#ifndef REDLOCKD_POOL_H
#define REDLOCKD_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <uv.h>

#include "conf.h"
#include "script.h"

/* The longest run_id kept (Redis's is 40 hex chars), and an error's room. */
#define POOL_RUN_ID_MAX 47
#define POOL_ERR_SIZE 128
/* Hex chars of the instance id (64 random bits). */
#define POOL_INSTANCE_ID_LEN 16

/* Called once per request: r is the reply, or NULL when the node failed,
 * timed out or is shutting down. r lives only during the call. */
typedef void (*pool_reply_cb)(void *ud, int node, redisReply *r);
/* Called for each release notification from another daemon: the key that
 * was released. */
typedef void (*pool_release_cb)(const char *key, size_t len);

/* What the pool tells its user; any of them may be NULL. */
struct pool_hooks {
    /* The node's first data link finished its handshake: it takes requests
     * now. run_id is what INFO said ("" if nothing), aof_always whether it
     * runs appendonly yes with appendfsync always, as this handshake read
     * them (false when CONFIG is refused). */
    void (*on_up)(int node, const char *run_id, bool aof_always);
    /* The node failed: once per connection attempt, which the reconnect
     * backoff then repeats (why: the reason, also its STATS last_error).
     * Called before its links are dropped, so the failed requests'
     * callbacks come after it. pool_shutdown drops links without it. */
    void (*on_down)(int node, const char *why);
    pool_release_cb on_release;
    /* A message on the watch channel (watch.c), from any daemon. */
    pool_release_cb on_watch;
};

/* Start connecting to every node; hooks are copied. May call on_down before
 * it returns (a node that cannot even be attempted). */
int pool_init(uv_loop_t *loop, const struct conf *conf,
              const struct pool_hooks *hooks);
/* Drop every connection and stop reconnecting; pending requests fail. */
void pool_shutdown(void);
/* Free the nodes (after pool_shutdown, once no operation is left). */
void pool_free(void);

int pool_nnodes(void);
/* Are requests still waiting for replies? (shutdown drains them) */
bool pool_busy(void);
/* Connected, handshake done, not failed: requests can be sent. */
bool pool_node_up(int node);
const char *pool_node_name(int node);
/* This daemon's instance id (POOL_INSTANCE_ID_LEN hex chars), valid from
 * pool_init on. */
const char *pool_instance_id(void);

/* The transport's counters of one node, for STATS. last_error points into
 * the pool (valid until pool_free; a later failure rewrites it). */
struct pool_node_stats {
    uint64_t requests;              /* each request of a group counts */
    uint64_t calls;                 /* sent to the node: a group is one */
    uint64_t errors, timeouts, reconnects;
    double latency_ms;              /* moving average */
    double latency_max_ms;
    uint64_t last_answer_ms;        /* uv_now of its last reply or message
                                       on any link, 0 if never */
    char last_error[POOL_ERR_SIZE]; /* "" if none yet */
};
const struct pool_node_stats *pool_node_stats(int node);

/* Who watches the nodes' reply times (stats_glue.c: the per-node reply
 * histograms): node (its index) replied `seconds` after the request was
 * sent. NULL: nobody. Kept across pool_init. */
typedef void pool_reply_time_fn(int node, double seconds);
void pool_set_reply_observer(pool_reply_time_fn *fn);

/*
 * Send a script call (script.h builds its words) or a plain command to a
 * node. The words are copied. Returns 0 when sent (cb will be called
 * exactly once, later) or -1 when the node has no usable connection or the
 * call has more words than script.h allows (cb is not called: count it as
 * a failed vote).
 *
 * pool_call's link: NULL or *link < 0, on the connection the pool picks
 * (its number goes to *link when link is not NULL); *link >= 0, on that
 * connection of the node (-1 when it is not up). A request sent on the
 * link of an unanswered one runs after it on the node: replies and
 * requests on one connection keep their order, and a connection is never
 * switched under its requests (one that fails fails them all).
 *
 * Group commit: with redis.group_max above 1, what is sent to a link
 * during one loop turn is gathered and handed to hiredis at the end of the
 * turn (redis_uv's flush hook), where each run of calls that can go
 * together becomes one GROUP call (script_group_*); the callbacks still
 * get one answer each. Nothing above the pool knows groups exist.
 */
int pool_call(int node, int *link, const struct script_words *w,
              pool_reply_cb cb, void *ud);
int pool_command(int node, int argc, const char **argv, const size_t *lens,
                 pool_reply_cb cb, void *ud);
/* PUBLISH msg on the watch channel of every node that is up (the
 * subscribers of every daemon hear it; nobody waits for the answer). */
void pool_publish_watch(const char *msg, size_t len);

#endif
