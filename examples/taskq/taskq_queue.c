/*
 * redlockd-taskq, the queue's store in Redis: the connection and its
 * commands, the keys, and the Lua scripts that change a task's state,
 * behind a function each (taskq_shared.h lists the files). It calls only
 * taskq_base.c and hiredis.
 *
 * Layout in Redis, every key under "taskq:<QUEUE>:" (README.md):
 *   seq           counter for task ids
 *   pending       list of ids; LPUSH adds, BLMOVE RIGHT->LEFT takes (FIFO)
 *   processing    list of ids taken by a worker
 *   delayed       sorted set of ids waiting out a retry backoff, score = due ms
 *   completed     list of completed ids, newest first
 *   dead          list of ids that failed max-attempts times
 *   task:<id>     hash: payload state worker pid fence attempts created
 *                 claimed started heartbeat finished progress last_error
 *   done          hash id -> fence of the run that completed it
 *   completions   hash id -> number of completions (1, by construction)
 *
 * Every change of a task's state after it was taken is one Lua script that
 * checks the task's recorded owner (worker name and fence) first, so a
 * worker whose lease was lost and whose task went to someone else can not
 * complete, fail or requeue it any more. See README.md, "Exactly once".
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "taskq_shared.h"

/* ---- the connection ---- */

static redisContext *rc;

/*
 * A worker treats a Redis failure as fatal (the queue store is gone: a
 * supervisor restarts the worker, and its task is recovered). The monitor
 * must outlive it and answer 503 instead: with redis_soft set, a failure
 * is noted in redis_error, the command answers nil, and the caller looks
 * at redis_error once it is done; the connection is then dropped and made
 * again for the next request.
 */
static bool redis_soft;
static char redis_error[256];

static void redis_fail(int code, const char *what)
{
    if (!redis_soft)
        die(code, "redis: %s", what);
    if (redis_error[0] == '\0')
        snprintf(redis_error, sizeof(redis_error), "redis: %.240s", what);
}

/* 0, or -1 (soft: the reason in redis_error). */
int queue_connect(const struct cfg *c)
{
    struct timeval tv = { 2, 0 };
    char what[300];

    rc = redisConnectWithTimeout(c->redis_host, c->redis_port, tv);
    if (rc && !rc->err) {
        /* The monitor's requests must not hang on a stopped Redis. (A
         * worker's BLMOVE blocks for --poll, longer than this.) */
        if (redis_soft)
            redisSetTimeout(rc, tv);
        return 0;
    }
    snprintf(what, sizeof(what), "%.100s:%d: %.120s", c->redis_host,
             c->redis_port, rc ? rc->errstr : "out of memory");
    if (!redis_soft)
        die(EXIT_UNAVAILABLE, "redis %s", what);
    redisFree(rc);
    rc = NULL;
    redis_fail(EXIT_UNAVAILABLE, what);
    return -1;
}

void queue_close(void)
{
    redisFree(rc);
    rc = NULL;
}

bool queue_connected(void)
{
    return rc != NULL;
}

void queue_set_soft(bool soft)
{
    redis_soft = soft;
}

const char *queue_error(void)
{
    return redis_error[0] != '\0' ? redis_error : NULL;
}

void queue_error_clear(void)
{
    redis_error[0] = '\0';
}

/* A failed command in soft mode: a nil reply, so callers go on. */
static redisReply *redis_nil(void)
{
    redisReply *r = calloc(1, sizeof(*r));

    if (!r)
        die(EXIT_SOFTWARE, "out of memory");
    r->type = REDIS_REPLY_NIL;
    return r;
}

/* Run a command; a transport error or an error reply is fatal, or (soft)
 * noted (see redis_soft). */
redisReply *queue_cmd(const char *fmt, ...)
{
    va_list ap;
    redisReply *r;

    if (!rc) {
        redis_fail(EXIT_UNAVAILABLE, "not connected");
        return redis_nil();
    }
    va_start(ap, fmt);
    r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (!r) {
        redis_fail(EXIT_UNAVAILABLE, rc->errstr);
        return redis_nil();
    }
    if (r->type == REDIS_REPLY_ERROR) {
        redis_fail(EXIT_SOFTWARE, r->str);
        freeReplyObject(r);
        return redis_nil();
    }
    return r;
}

long long queue_cmd_int(const char *fmt, ...)
{
    va_list ap;
    redisReply *r;
    long long v = 0;

    if (!rc) {
        redis_fail(EXIT_UNAVAILABLE, "not connected");
        return 0;
    }
    va_start(ap, fmt);
    r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (!r) {
        redis_fail(EXIT_UNAVAILABLE, rc->errstr);
        return 0;
    }
    if (r->type == REDIS_REPLY_ERROR)
        redis_fail(EXIT_SOFTWARE, r->str);
    else if (r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

/* The key "taskq:<queue>:<suffix>" in one of a few rotating buffers. */
const char *queue_key(const struct cfg *c, const char *suffix)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];

    snprintf(b, sizeof(bufs[0]), "taskq:%s:%s", c->queue, suffix);
    return b;
}

const char *queue_task_key(const struct cfg *c, const char *id)
{
    char s[300];

    snprintf(s, sizeof(s), "task:%s", id);
    return queue_key(c, s);
}

/* ---- the scripts ---- */

/* KEYS: seq pending; ARGV: prefix now payload */
static const char LUA_PUSH[] =
    "local id = tostring(redis.call('INCR', KEYS[1]))\n"
    "redis.call('HSET', ARGV[1] .. 'task:' .. id, 'payload', ARGV[3],"
    " 'state', 'pending', 'attempts', 0, 'created', ARGV[2])\n"
    "redis.call('LPUSH', KEYS[2], id)\n"
    "return id\n";

/* Take a task that was moved to processing. KEYS: processing task;
 * ARGV: id worker fence now pid. 0: not in processing (someone requeued
 * it meanwhile), -1: already finished, else the attempt number. */
static const char LUA_CLAIM[] =
    "if not redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end\n"
    "local st = redis.call('HGET', KEYS[2], 'state')\n"
    "if st == 'completed' or st == 'dead' then\n"
    "  redis.call('LREM', KEYS[1], 0, ARGV[1]) return -1 end\n"
    "local a = redis.call('HINCRBY', KEYS[2], 'attempts', 1)\n"
    "redis.call('HSET', KEYS[2], 'state', 'running', 'worker', ARGV[2],"
    " 'fence', ARGV[3], 'started', ARGV[4], 'heartbeat', ARGV[4],"
    " 'pid', ARGV[5])\n"
    "redis.call('HDEL', KEYS[2], 'progress', 'suspect')\n"
    "return a\n";

/* The owner check every later step starts with. */
#define LUA_OWNER \
    "if redis.call('HGET', KEYS[2], 'state') ~= 'running'" \
    " or redis.call('HGET', KEYS[2], 'worker') ~= ARGV[2]" \
    " or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[3] then return 0 end\n"

/* KEYS: processing task completed done completions; ARGV: id worker fence now */
static const char LUA_COMPLETE[] =
    LUA_OWNER
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end\n"
    "redis.call('LPUSH', KEYS[3], ARGV[1])\n"
    "redis.call('HSET', KEYS[2], 'state', 'completed', 'finished', ARGV[4])\n"
    "redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])\n"
    "redis.call('HINCRBY', KEYS[5], ARGV[1], 1)\n"
    "return 1\n";

/* KEYS: processing task delayed dead; ARGV: id worker fence now error max
 * backoff backoff_max. 1: retry later, 2: dead, 0: not ours. */
static const char LUA_FAIL[] =
    LUA_OWNER
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end\n"
    "local a = tonumber(redis.call('HGET', KEYS[2], 'attempts'))\n"
    "redis.call('HSET', KEYS[2], 'last_error', ARGV[5])\n"
    "if a >= tonumber(ARGV[6]) then\n"
    "  redis.call('LPUSH', KEYS[4], ARGV[1])\n"
    "  redis.call('HSET', KEYS[2], 'state', 'dead', 'finished', ARGV[4])\n"
    "  return 2 end\n"
    "local d = tonumber(ARGV[7]) * 2 ^ (a - 1)\n"
    "if d > tonumber(ARGV[8]) then d = tonumber(ARGV[8]) end\n"
    "local due = tonumber(ARGV[4]) + d\n"
    "redis.call('ZADD', KEYS[3], due, ARGV[1])\n"
    "redis.call('HSET', KEYS[2], 'state', 'retry', 'retry_at', due)\n"
    "return 1\n";

/* KEYS: processing task; ARGV: id worker fence field value */
static const char LUA_NOTE[] =
    LUA_OWNER
    "redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])\n"
    "return 1\n";

/* Stale work, run while holding the task's lock (so nobody else does).
 * KEYS: processing task pending dead; ARGV: id now grace reason max.
 * 1: requeued, 2: dead, 0: left alone. */
static const char LUA_REQUEUE[] =
    "local c = tonumber(redis.call('HGET', KEYS[2], 'claimed') or '0')\n"
    "if tonumber(ARGV[2]) - c < tonumber(ARGV[3]) then return 0 end\n"
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end\n"
    "local a = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')\n"
    "redis.call('HSET', KEYS[2], 'last_error', ARGV[4])\n"
    "if a >= tonumber(ARGV[5]) then\n"
    "  redis.call('LPUSH', KEYS[4], ARGV[1])\n"
    "  redis.call('HSET', KEYS[2], 'state', 'dead', 'finished', ARGV[2])\n"
    "  return 2 end\n"
    "redis.call('RPUSH', KEYS[3], ARGV[1])\n"
    "redis.call('HSET', KEYS[2], 'state', 'pending')\n"
    "return 1\n";

/* Move due retries to pending. KEYS: delayed pending; ARGV: prefix now */
static const char LUA_PROMOTE[] =
    "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2],"
    " 'LIMIT', 0, 100)\n"
    "for _, id in ipairs(ids) do\n"
    "  redis.call('ZREM', KEYS[1], id)\n"
    "  redis.call('LPUSH', KEYS[2], id)\n"
    "  redis.call('HSET', ARGV[1] .. 'task:' .. id, 'state', 'pending')\n"
    "end\n"
    "return #ids\n";

/* A fence as the scripts' ARGV take it (a static buffer: one a command). */
static char *owner_args_fence(uint64_t fence)
{
    static char b[32];

    snprintf(b, sizeof(b), "%llu", (unsigned long long)fence);
    return b;
}

/* ---- the changes of a task's state ---- */

void queue_push(const struct cfg *c, const char *payload, char *id,
                size_t size)
{
    char prefix[300];
    redisReply *r;

    snprintf(prefix, sizeof(prefix), "taskq:%s:", c->queue);
    r = queue_cmd("EVAL %s 2 %s %s %s %lld %s", LUA_PUSH,
                  queue_key(c, "seq"), queue_key(c, "pending"), prefix,
                  (long long)wall_ms(), payload);
    snprintf(id, size, "%s", r->type == REDIS_REPLY_STRING ? r->str : "?");
    freeReplyObject(r);
}

void queue_promote(const struct cfg *c)
{
    char prefix[300];

    snprintf(prefix, sizeof(prefix), "taskq:%s:", c->queue);
    freeReplyObject(queue_cmd("EVAL %s 2 %s %s %s %lld", LUA_PROMOTE,
                              queue_key(c, "delayed"), queue_key(c, "pending"),
                              prefix, (long long)wall_ms()));
}

int queue_requeue(const struct cfg *c, const char *id, const char *reason)
{
    redisReply *q = queue_cmd("EVAL %s 4 %s %s %s %s %s %lld %d %s %d",
                              LUA_REQUEUE, queue_key(c, "processing"),
                              queue_task_key(c, id), queue_key(c, "pending"),
                              queue_key(c, "dead"), id, (long long)wall_ms(),
                              c->claim_grace_ms, reason, c->max_attempts);
    int rv = q->type == REDIS_REPLY_INTEGER ? (int)q->integer : 0;

    freeReplyObject(q);
    return rv;
}

int queue_claim(const struct cfg *c, const char *id, uint64_t fence,
                const char *now)
{
    redisReply *r = queue_cmd("EVAL %s 2 %s %s %s %s %s %s %ld", LUA_CLAIM,
                              queue_key(c, "processing"), queue_task_key(c, id),
                              id, c->name, owner_args_fence(fence), now,
                              (long)getpid());
    int attempt = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;

    freeReplyObject(r);
    return attempt;
}

void queue_note(const struct cfg *c, const char *id, uint64_t fence,
                const char *field, const char *value)
{
    freeReplyObject(queue_cmd("EVAL %s 2 %s %s %s %s %s %s %s", LUA_NOTE,
                              queue_key(c, "processing"), queue_task_key(c, id),
                              id, c->name, owner_args_fence(fence), field,
                              value));
}

int queue_complete(const struct cfg *c, const char *id, uint64_t fence,
                   const char *now)
{
    redisReply *r = queue_cmd("EVAL %s 5 %s %s %s %s %s %s %s %s %s",
                              LUA_COMPLETE, queue_key(c, "processing"),
                              queue_task_key(c, id), queue_key(c, "completed"),
                              queue_key(c, "done"), queue_key(c, "completions"),
                              id, c->name, owner_args_fence(fence), now);
    int rv = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;

    freeReplyObject(r);
    return rv;
}

int queue_fail(const struct cfg *c, const char *id, uint64_t fence,
               const char *now, const char *error)
{
    redisReply *r = queue_cmd("EVAL %s 4 %s %s %s %s %s %s %s %s %s %d %d %d",
                              LUA_FAIL, queue_key(c, "processing"),
                              queue_task_key(c, id), queue_key(c, "delayed"),
                              queue_key(c, "dead"), id, c->name,
                              owner_args_fence(fence), now, error,
                              c->max_attempts, c->backoff_ms,
                              c->backoff_max_ms);
    int rv = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;

    freeReplyObject(r);
    return rv;
}
