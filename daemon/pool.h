/*
 * pool: the transport to the N Redis nodes: links, requests, deadlines.
 *
 * Each node gets `pool_size` hiredis connections (links) attached to the
 * libuv loop plus one subscriber link for release notifications. A link
 * carries requests once its handshake is done: AUTH, SELECT, SCRIPT LOAD of
 * the scripts below, CONFIG GET of the AOF settings and INFO server (the
 * subscriber: AUTH and SUBSCRIBE). hiredis 0.14 has no timeouts, so connect
 * and per-request deadlines are daemon timers: a request not answered within
 * command_timeout_ms fails the node, which drops its links (hiredis then
 * fails every pending request with a NULL reply) and reconnects with capped
 * exponential backoff. Scripts go out as EVALSHA, and as EVAL after a
 * NOSCRIPT (a restarted node has an empty script cache).
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
 * and owed releases.
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
 * command with its name): a LOCK of locks.max_multi resources sends the
 * fence key, two keys per resource, five arguments and the three words of
 * the guard; a batch of renewals, two words per key and the guard.
 * pool_script and pool_command refuse more. */
#define POOL_GUARD_WORDS 3
#define POOL_MAX_ARGS_LOCK (2 * CONF_MAX_MULTI + 6 + POOL_GUARD_WORDS)
/* The most keys one EXTEND_MANY or RELEASE_MANY takes (at most three
 * words each). */
#define POOL_BATCH_MAX 128
#define POOL_MAX_ARGS_BATCH (3 * POOL_BATCH_MAX + POOL_GUARD_WORDS)
#define POOL_MAX_ARGS (POOL_MAX_ARGS_BATCH > POOL_MAX_ARGS_LOCK \
                       ? POOL_MAX_ARGS_BATCH : POOL_MAX_ARGS_LOCK)
/* A GROUP call's words (lua/group.lua): the fence key, the kinds, the
 * channel and the instance id, then room for 7 per request (an ACQUIRE's
 * two keys and five arguments; a LOCK of several resources takes more,
 * and one too large for the room left goes alone), and the guard. The
 * pool builds these itself; callers' requests stay within POOL_MAX_ARGS. */
#define POOL_MAX_ARGS_GROUP (4 + 7 * CONF_GROUP_MAX + POOL_GUARD_WORDS)
/* Room for any 64-bit integer in decimal, sign and NUL included. */
#define POOL_NUM_SIZE sizeof("-9223372036854775808")
/* The longest run_id kept (Redis's is 40 hex chars), and an error's room. */
#define POOL_RUN_ID_MAX 47
#define POOL_ERR_SIZE 128
/* Hex chars of the instance id (64 random bits). */
#define POOL_INSTANCE_ID_LEN 16

/*
 * The scripts (daemon/lua/ has their text, one file each, with its keys,
 * arguments and replies; pool_lua.h). The fence scripts are the halves
 * of a grant's fence (docs/design.md, "Fences"): the ACQUIRE scripts set
 * the counter to max(counter, seen) + 1 atomically with a successful grant
 * and return it; RAISE_HELD raises the counter to a value only while the
 * keys hold our token, RAISE_SHARED only while our shared member is live;
 * each returns the counter it leaves (as decimal strings). They answer an
 * error, having written nothing that matters, when the counter is not a
 * decimal below 10^18 or a lock's key is not of its type. RAISE is node's
 * repair of a restarted node, which owns no key.
 *
 * The scripts whose answers are votes (ACQUIRE*, EXTEND*, RAISE_HELD,
 * RAISE_SHARED) take POOL_GUARD_WORDS more arguments after those listed
 * below: the longest-ttl record's key, the recovery marker's key, and the
 * run_id under which the node was admitted ("" for no check). A node whose
 * marker does not name that run answers an error starting "LOSTDATA"
 * before writing anything (daemon/lua/lib/guard.lua).
 *
 * A resource's exclusive key is a plain string holding the token, or
 * "token label fence" when the acquisition gave a label (the owner checks
 * accept both); its shared holders are the members of a sorted set (the
 * tokens, scored by their expiry on the node's clock) and their fences the
 * fields of a hash beside it (daemon/lua/lib/shared_put.lua). RELEASE and
 * EXTEND take either.
 */
enum pool_script {
    POOL_SCRIPT_ACQUIRE,    /* KEYS lock,fence[,shared] ARGV token,ttl,seen,
                               label,wait -> {1,"counter"} | {0,pttl} */
    POOL_SCRIPT_RELEASE,    /* KEYS lock|shared ARGV token,channel,
                               pool_instance_id() -> 1|0 */
    POOL_SCRIPT_EXTEND,     /* KEYS lock|shared ARGV token,ttl -> 1|0 */
    POOL_SCRIPT_RAISE,      /* KEYS fence ARGV value -> 1 */
    POOL_SCRIPT_RAISE_HELD, /* KEYS lock,fence[,lock...] ARGV token,value
                               -> {1,"counter"} ours | {0,"counter"} not */
    POOL_SCRIPT_UNDO,       /* KEYS lock ARGV token -> 1|0 (no PUBLISH) */
    POOL_SCRIPT_ACQUIRE_SHARED, /* KEYS lock,fence,shared ARGV token,ttl,seen,
                                   label (unused),wait
                                   -> {1,"counter"} | {0,pttl} */
    POOL_SCRIPT_ACQUIRE_MULTI,  /* KEYS fence,lock1,shared1,... ARGV token,
                                   ttl,seen,label,wait -> {1,"counter"} |
                                   {0,pttl} */
    POOL_SCRIPT_RAISE_SHARED,   /* KEYS shared,fence ARGV token,value
                                   -> {1,"counter"} | {0,"counter"} */
    POOL_SCRIPT_INSPECT,    /* KEYS lock,shared ARGV slot-prefix,K
                               -> {pttl, live shared, "0110...", value} */
    POOL_SCRIPT_FORCE,      /* KEYS lock,shared ARGV slot-prefix,K,channel
                               -> keys deleted */
    POOL_SCRIPT_EXTEND_MANY,    /* KEYS lock|shared... ARGV token,ttl,...
                                   (a pair per key) -> {1|0, ...} */
    POOL_SCRIPT_ADOPT,      /* KEYS lock... ARGV old token,new token,ttl,
                               label -> {1,"fence"} all ours, rotated |
                               {0} */
    POOL_SCRIPT_ADOPT_ONE,  /* KEYS lock,shared ARGV old token,new token,
                               ttl,label,slot-prefix,K -> {1,"fence",kind
                               [,"slot","limit"]} | {0} */
    POOL_SCRIPT_RELEASE_MANY,   /* KEYS lock|shared... ARGV channel,
                                   instance id,token... -> {1|0, ...} */
    POOL_SCRIPT_SET_FENCE,  /* KEYS lock... ARGV token,fence -> keys
                               rewritten: where a key holds the token, the
                               fence its value carries becomes ARGV[2] (ttl
                               kept). For a node that answered a grant
                               after the quorum had decided it, with a
                               counter above the grant's fence (redlock.c,
                               op_align) */
    POOL_SCRIPT_GROUP,      /* KEYS fence,keys... ARGV kinds,channel,
                               instance id,words... -> {answer, ...}:
                               ACQUIRE*, RELEASE and EXTEND requests
                               sent together (pool.c, "Group commit") */
    POOL_SCRIPT_COUNT
};

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
/* pool_script on a chosen connection: with *link 0 or more, on the
 * node's link *link (-1 when that one is not up), else on the one the
 * pool picks, whose number goes to *link. A request sent on the link of
 * an unanswered one runs after it on the node: replies and requests on
 * one connection keep their order, and a connection is never switched
 * under its requests (one that fails fails them all). */
int pool_script_at(int node, int *link, enum pool_script s, int nkeys,
                   int nargs, const char **argv, const size_t *lens,
                   pool_reply_cb cb, void *ud);

#endif
