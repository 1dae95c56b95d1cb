/*
 * redlockd-taskq: a task queue in Redis lists, worked on under redlockd locks.
 *
 *   taskq push QUEUE PAYLOAD...          add tasks, print their ids
 *   taskq work QUEUE [opts] -- CMD ARGS  take tasks one at a time and run CMD
 *   taskq status QUEUE [--json]          counts, ages, locks and holders
 *   taskq monitor QUEUE --listen H:P     the same as JSON over HTTP, GET /status
 *                                        (HEAD too; 503 while Redis is down)
 *   taskq progress TEXT...               (inside a task) report progress
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
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "keeper.h"
#include "redlockd.h"

#define EXIT_USAGE 64
#define EXIT_UNAVAILABLE 69
#define EXIT_SOFTWARE 70

struct cfg {
    char redis_host[256];
    int redis_port;
    const char *server;
    const char *queue;
    const char *name;           /* worker name; default taskq-<pid>@<host> */
    int ttl_ms;                 /* lock ttl on Redis */
    int keepalive_ms;           /* HELLO keepalive */
    int max_attempts;
    int backoff_ms;             /* first retry delay, doubled per attempt */
    int backoff_max_ms;
    int expected_ms;            /* expected run time of one task */
    double suspect_factor;      /* held longer than factor * expected: suspect */
    int claim_grace_ms;         /* a task taken this recently is never stale */
    int recover_ms;             /* how often a worker looks for stale work */
    int poll_ms;                /* BLMOVE timeout */
    int max_tasks;              /* exit after this many tasks (0: never) */
    bool json;
    const char *listen;
    char **cmd;                 /* work: the command */
};

static volatile sig_atomic_t stop_flag;

static void on_stop(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void die(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

static void die(int code, const char *fmt, ...)
{
    va_list ap;

    fputs("taskq: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

static void logmsg(const struct cfg *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void logmsg(const struct cfg *c, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "taskq[%s]: ", c->name ? c->name : "-");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- Redis ---- */

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
static int redis_connect(const struct cfg *c)
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
static redisReply *rcmd(const char *fmt, ...)
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

static long long rcmd_int(const char *fmt, ...)
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
static const char *key(const struct cfg *c, const char *suffix)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];

    snprintf(b, sizeof(bufs[0]), "taskq:%s:%s", c->queue, suffix);
    return b;
}

static const char *task_key(const struct cfg *c, const char *id)
{
    char s[300];

    snprintf(s, sizeof(s), "task:%s", id);
    return key(c, s);
}

/* The redlockd resource of a task. */
static void task_resource(const struct cfg *c, const char *id, char *out,
                          size_t size)
{
    snprintf(out, size, "taskq:%s:%s", c->queue, id);
}

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

/* ---- redlockd ---- */

static struct redlockd *lk;

/* A session of the worker's: lk, or one of a task's (work_one). */
static int lk_open(const struct cfg *c, struct redlockd **h,
                   struct redlockd_error *err)
{
    struct redlockd_opts o;

    memset(&o, 0, sizeof(o));
    o.server = c->server;
    o.name = c->name;
    o.keepalive_ms = (unsigned)c->keepalive_ms;
    /* A worker (or a task's keeper) that dies keeps its locks only as
     * long as their ttl (a blip shorter than that is ridden out): its
     * stale work is then recovered by another worker, not the library's
     * default 30 s later. */
    o.detach_ms = c->ttl_ms;
    return redlockd_connect(h, &o, err);
}

static void lk_connect(const struct cfg *c)
{
    struct redlockd_error err;

    if (lk_open(c, &lk, &err) < 0)
        die(EXIT_UNAVAILABLE, "redlockd %s: %s",
            c->server ? c->server : "(default)", err.msg);
}

/* STATUS of a resource as JSON (caller decrefs), NULL on failure. */
static json_t *lk_status(const char *res)
{
    char *txt = NULL;
    json_t *j;

    if (redlockd_status(lk, res, &txt) < 0)
        return NULL;
    j = json_loads(txt, 0, NULL);
    free(txt);
    return j;
}

/* ---- push ---- */

static int cmd_push(struct cfg *c, int argc, char **argv)
{
    char prefix[300];

    if (argc < 1)
        die(EXIT_USAGE, "push: no payload");
    redis_connect(c);
    snprintf(prefix, sizeof(prefix), "taskq:%s:", c->queue);
    for (int i = 0; i < argc; i++) {
        redisReply *r = rcmd("EVAL %s 2 %s %s %s %lld %s", LUA_PUSH,
                             key(c, "seq"), key(c, "pending"), prefix,
                             (long long)wall_ms(), argv[i]);

        printf("%s\n", r->type == REDIS_REPLY_STRING ? r->str : "?");
        freeReplyObject(r);
    }
    redisFree(rc);
    return 0;
}

/* ---- progress helper ---- */

static int cmd_progress(int argc, char **argv)
{
    const char *fd_s = getenv("TASKQ_PROGRESS_FD");
    char line[4096];
    size_t n = 0;
    int fd;

    if (!fd_s)
        die(EXIT_USAGE, "progress: TASKQ_PROGRESS_FD is not set (not in a task)");
    fd = atoi(fd_s);
    line[0] = '\0';
    for (int i = 0; i < argc && n + 2 < sizeof(line); i++)
        n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s",
                              i ? " " : "", argv[i]);
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    if (write(fd, line, n) != (ssize_t)n)
        die(EXIT_SOFTWARE, "progress: %s", strerror(errno));
    return 0;
}

/* ---- work ---- */

static char *owner_args_fence(uint64_t fence)
{
    static char b[32];

    snprintf(b, sizeof(b), "%llu", (unsigned long long)fence);
    return b;
}

/* Look at every task in processing once: one whose lock nobody holds is
 * taken back (under the lock, so no two workers do it at once); one held
 * for longer than suspect_factor * expected_ms is marked suspect. */
static void recover(const struct cfg *c)
{
    redisReply *r;
    char res[600];
    int64_t suspect_ms = (int64_t)(c->suspect_factor * c->expected_ms);
    char prefix[300];

    snprintf(prefix, sizeof(prefix), "taskq:%s:", c->queue);
    freeReplyObject(rcmd("EVAL %s 2 %s %s %s %lld", LUA_PROMOTE,
                         key(c, "delayed"), key(c, "pending"), prefix,
                         (long long)wall_ms()));
    r = rcmd("LRANGE %s 0 999", key(c, "processing"));
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const char *id = r->element[i]->str;
        json_t *st;
        bool held;
        int rv;

        if (!id)
            continue;
        task_resource(c, id, res, sizeof(res));
        st = lk_status(res);
        if (!st)
            continue;   /* the daemon can not say: leave it */
        held = json_is_true(json_object_get(st, "held"));
        if (held) {
            json_t *holder = json_object_get(st, "holder");
            json_int_t held_ms = json_integer_value(
                json_object_get(holder, "held_ms"));

            if (suspect_ms > 0 && held_ms > suspect_ms) {
                freeReplyObject(rcmd("HSET %s suspect %lld", task_key(c, id),
                                     (long long)held_ms));
                logmsg(c, "suspect: task %s held for %lld ms (expected %d)",
                       id, (long long)held_ms, c->expected_ms);
            }
            json_decref(st);
            continue;
        }
        json_decref(st);
        /* Not held: take the lock ourselves, so that the owner can not come
         * back between the check and the move, and nobody else recovers it. */
        if (redlockd_lock(lk, res, (uint32_t)c->ttl_ms, 0, 1, NULL) < 0)
            continue;
        {
            redisReply *q = rcmd("EVAL %s 4 %s %s %s %s %s %lld %d %s %d",
                                 LUA_REQUEUE, key(c, "processing"),
                                 task_key(c, id), key(c, "pending"),
                                 key(c, "dead"), id, (long long)wall_ms(),
                                 c->claim_grace_ms, "stale: lock not held",
                                 c->max_attempts);

            rv = q->type == REDIS_REPLY_INTEGER ? (int)q->integer : 0;
            freeReplyObject(q);
        }
        redlockd_unlock(lk, res);
        if (rv == 1)
            logmsg(c, "stale task %s moved back to pending", id);
        else if (rv == 2)
            logmsg(c, "stale task %s moved to dead (attempts used up)", id);
    }
    freeReplyObject(r);
}

/* Record one progress line, if the task is still ours. */
static void note(const struct cfg *c, const char *id, uint64_t fence,
                 const char *field, const char *value)
{
    freeReplyObject(rcmd("EVAL %s 2 %s %s %s %s %s %s %s", LUA_NOTE,
                         key(c, "processing"), task_key(c, id), id, c->name,
                         owner_args_fence(fence), field, value));
}

/*
 * ---- work: the task's keeper ----
 *
 * A task's lock is its command's process group's (issue 28): held while
 * any process of that group lives, whether or not it kept a descriptor
 * of ours (a worker started with close_fds), and also after the worker
 * itself is SIGKILLed. So per task the worker takes the lock on a session
 * of its own (lk stays for recovery), claims the task, and forks a keeper
 * (client/keeper.c) that owns that session and runs the command: in a
 * process group of its own, subreaper of the command's orphans, it keeps
 * the lease (a refresh every ttl/3; SIGKILL to the whole group the moment
 * redlockd_lease_check fails) and watches the group once the command has
 * exited. The worker keeps what needs the queue's Redis: the claim,
 * progress lines (the command writes them to a pipe whose other end is
 * the worker's), heartbeats, and the owner-checked result. They talk over
 * a socketpair, one line per message:
 *
 *   keeper -> worker   lost            the lease is gone, the group killed
 *                      done STATUS OK  the group is empty: the command's
 *                                      exit status, OK 1 if the lease was
 *                                      confirmed just now, else 0
 *   worker -> keeper   stop            the worker is stopping: SIGTERM to
 *                                      the group, SIGKILL 5 s later
 *                      release         the result is recorded
 *
 * On "release", or once the group is empty with the worker gone (EOF: it
 * was killed), the keeper UNLOCKs and exits: the lock goes at once, and a
 * dead worker's task is recovered by another as stale work. A keeper that
 * is itself killed leaves the session to end as a dropped one, after its
 * detach time (the ttl).
 */

#define TASK_STOP_KILL_AFTER_MS 5000
#define TASK_POLL_MS 50

struct task_keeper {
    const struct cfg *c;
    const char *id;
    const char *payload;
    int attempt;
    const struct redlockd_lease *lease;
    struct redlockd *h;         /* the task's session (owned) */
    struct keeper_group g;
    int chan;                   /* to the worker; -1 once it is gone */
    int progress;               /* the pipe's write end, for the command */
    bool lost, done, release;
    int64_t period, next_refresh;
    char in[64];                /* a partial line from the worker */
    size_t inlen;
};

/* In the command, before exec. The progress pipe goes to the lowest free
 * descriptor above 2: a shell such as dash redirects to single-digit
 * descriptors only (>&"$TASKQ_PROGRESS_FD"), and the keeper's own, which
 * has the worker's numbers, may be above 9. */
static int tk_child_setup(void *ud)
{
    const struct task_keeper *k = ud;
    char n[32];
    int fd = fcntl(k->progress, F_DUPFD, 3);

    if (fd < 0)
        return -1;
    snprintf(n, sizeof(n), "%d", fd);
    setenv("TASKQ_PROGRESS_FD", n, 1);
    setenv("TASKQ_ID", k->id, 1);
    setenv("TASKQ_PAYLOAD", k->payload, 1);
    setenv("TASKQ_QUEUE", k->c->queue, 1);
    snprintf(n, sizeof(n), "%d", k->attempt);
    setenv("TASKQ_ATTEMPT", n, 1);
    snprintf(n, sizeof(n), "%llu", (unsigned long long)k->lease->fence);
    setenv("REDLOCKD_FENCE", n, 1);
    setenv("REDLOCKD_RESOURCE", k->lease->resource, 1);
    return 0;
}

/* A line to the worker; one that is gone is forgotten. */
static void tk_send(struct task_keeper *k, const char *line)
{
    size_t len = strlen(line);

    if (k->chan >= 0 && write(k->chan, line, len) != (ssize_t)len) {
        close(k->chan);
        k->chan = -1;
    }
}

static void tk_command(struct task_keeper *k, const char *line)
{
    if (strcmp(line, "stop") == 0)
        keeper_stop(&k->g, TASK_STOP_KILL_AFTER_MS);
    else if (strcmp(line, "release") == 0)
        k->release = true;
}

static void tk_read(struct task_keeper *k)
{
    ssize_t n;
    char *nl;

    n = read(k->chan, k->in + k->inlen, sizeof(k->in) - 1 - k->inlen);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close(k->chan);
        k->chan = -1;
        return;
    }
    k->inlen += (size_t)n;
    k->in[k->inlen] = '\0';
    while ((nl = strchr(k->in, '\n')) != NULL) {
        *nl = '\0';
        tk_command(k, k->in);
        k->inlen -= (size_t)(nl + 1 - k->in);
        memmove(k->in, nl + 1, k->inlen + 1);
    }
    if (k->inlen == sizeof(k->in) - 1)
        k->inlen = 0;       /* no such line: not ours */
}

/* Confirm the lease every ttl/3; the moment it may no longer be ours,
 * the whole group goes. */
static void tk_lease(struct task_keeper *k)
{
    int64_t now = mono_ms();

    if (k->lost)
        return;
    if (now >= k->next_refresh) {
        k->next_refresh = now + k->period;
        redlockd_refresh_within(k->h, (int)k->period);
    }
    if (redlockd_lease_check(k->h, k->lease->resource) != 0) {
        k->lost = true;
        logmsg(k->c, "task %s: lease lost, killing the command", k->id);
        keeper_kill(&k->g, SIGKILL);
        tk_send(k, "lost\n");
    }
}

/* The group is empty: tell the worker how it ended, with the lease
 * confirmed right before, as the result's script needs it. */
static void tk_done(struct task_keeper *k)
{
    char line[64];
    bool held = false;

    if (!k->lost) {
        redlockd_refresh(k->h);
        held = redlockd_lease_check(k->h, k->lease->resource) == 0;
    }
    snprintf(line, sizeof(line), "done %d %d\n",
             keeper_exit_status(k->g.status), held ? 1 : 0);
    tk_send(k, line);
    k->done = true;
}

/* The next refresh, and the lease's deadline: the group is killed the
 * moment it passes, not up to a poll later. */
static int tk_timeout(const struct task_keeper *k)
{
    int64_t now = mono_ms(), next = now + TASK_POLL_MS, deadline;

    if (!k->lost) {
        if (k->next_refresh < next)
            next = k->next_refresh;
        if (redlockd_lease_deadline(k->h, k->lease->resource, &deadline) == 0
            && deadline + 1 < next)
            next = deadline + 1;
    }
    return keeper_timeout(&k->g, next <= now ? 0 : (int)(next - now));
}

/* The keeper's life: run the command, keep the lease while its group
 * lives, then release the lock. Never returns. */
static void tk_main(struct task_keeper *k)
{
    int sig;

    /* The worker's connections are the worker's: our copies go, without
     * a word (the worker goes on using them). */
    redlockd_forget(lk);
    lk = NULL;
    redisFree(rc);
    rc = NULL;
    fcntl(k->chan, F_SETFL, O_NONBLOCK);
    /* A refresh every ttl/3, and often enough to keep a session with a
     * HELLO keepalive alive: nobody else sends on this one. */
    k->period = k->c->ttl_ms / 3;
    if (k->c->keepalive_ms > 0 && k->c->keepalive_ms / 3 < k->period)
        k->period = k->c->keepalive_ms / 3;
    if (k->period < 1)
        k->period = 1;
    k->next_refresh = mono_ms() + k->period;
    if (keeper_spawn(&k->g, k->c->cmd, tk_child_setup, k) < 0) {
        logmsg(k->c, "task %s: fork: %s", k->id, strerror(errno));
        k->g.exited = k->g.gone = true;
        k->g.status = 127 << 8;
    }
    close(k->progress);
    while (!(k->done && (k->release || k->chan < 0))) {
        struct pollfd p[3] = { { .fd = -1 } };
        int lfd = redlockd_fd(k->h), np = 0, li = -1, ci = -1;

        p[np].fd = keeper_signal_fd();
        p[np++].events = POLLIN;
        if (k->chan >= 0) {
            ci = np;
            p[np].fd = k->chan;
            p[np++].events = POLLIN;
        }
        if (lfd >= 0) {
            li = np;
            p[np].fd = lfd;
            p[np++].events = POLLIN;
        }
        if (poll(p, (nfds_t)np, tk_timeout(k)) < 0 && errno != EINTR)
            die(EXIT_SOFTWARE, "poll: %s", strerror(errno));
        while ((sig = keeper_signal_next()) > 0) {
            if (sig == SIGCHLD)
                keeper_reap(&k->g);
            else if (!k->g.exited || k->lost)
                keeper_kill(&k->g, sig);
        }
        if (ci >= 0 && p[ci].revents != 0)
            tk_read(k);
        if (li >= 0 && p[li].revents != 0)
            redlockd_poll_events(k->h, 0);
        tk_lease(k);
        keeper_timers(&k->g);
        if (!k->done && k->g.exited && !keeper_group_left(&k->g))
            tk_done(k);
    }
    redlockd_unlock(k->h, k->lease->resource);
    redlockd_close(k->h);
    if (k->chan >= 0)
        close(k->chan);
    exit(0);
}

/* How a task's run went, as the worker heard it from the keeper. */
struct run_result {
    pid_t keeper;
    int chan;               /* to the keeper; -1 once it is gone */
    int status;             /* exit status, 128+signal */
    bool done;              /* the keeper said "done" */
    bool held;              /* ... with the lease confirmed */
    bool lease_lost;
    bool interrupted;
};

/* Progress lines from the command, noted as they come; false at EOF. */
static bool progress_read(const struct cfg *c, const char *id, uint64_t fence,
                          int fd, char *buf, size_t size, size_t *blen)
{
    for (;;) {
        ssize_t k = read(fd, buf + *blen, size - 1 - *blen);
        char *nl;

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 && errno == EAGAIN;
        *blen += (size_t)k;
        buf[*blen] = '\0';
        while ((nl = strchr(buf, '\n')) != NULL) {
            *nl = '\0';
            note(c, id, fence, "progress", buf);
            *blen -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, *blen + 1);
        }
        if (*blen == size - 1) {
            note(c, id, fence, "progress", buf);
            *blen = 0;
        }
    }
}

/* One message of the keeper's; false once it has nothing more to say
 * (done, or gone). */
static bool run_keeper_line(struct run_result *out, const char *line)
{
    int status, held;

    if (strcmp(line, "lost") == 0) {
        out->lease_lost = true;
    } else if (sscanf(line, "done %d %d", &status, &held) == 2) {
        out->status = status;
        out->held = held == 1;
        out->done = true;
        return false;
    }
    return true;
}

static bool run_keeper_read(struct run_result *out, char *buf, size_t size,
                        size_t *blen)
{
    ssize_t n = read(out->chan, buf + *blen, size - 1 - *blen);
    bool more = true;
    char *nl;

    if (n < 0 && errno == EINTR)
        return true;
    if (n <= 0)
        return false;       /* the keeper died: its session goes alone */
    *blen += (size_t)n;
    buf[*blen] = '\0';
    while (more && (nl = strchr(buf, '\n')) != NULL) {
        *nl = '\0';
        more = run_keeper_line(out, buf);
        *blen -= (size_t)(nl + 1 - buf);
        memmove(buf, nl + 1, *blen + 1);
    }
    if (*blen == size - 1)
        *blen = 0;
    return more;
}

/* Run the command for one task under a keeper that owns h, the task's
 * session, from now on: until the keeper says the group is empty. No
 * PR_SET_PDEATHSIG for the command (it had one): its group must outlive
 * a worker that is killed, and keeps the lock meanwhile through the
 * keeper; a worker that stops on SIGTERM stops it itself ("stop"). */
static struct run_result run_task(const struct cfg *c, const char *id,
                                  const char *payload, int attempt,
                                  const struct redlockd_lease *lease,
                                  struct redlockd *h)
{
    struct run_result out = { .chan = -1 };
    struct task_keeper k = { .c = c, .id = id, .payload = payload,
                             .attempt = attempt, .lease = lease, .h = h };
    int pfd[2], sv[2];
    char buf[4096], kbuf[256];
    size_t blen = 0, kblen = 0;
    int64_t last_beat = mono_ms();

    if (pipe2(pfd, O_CLOEXEC) < 0)
        die(EXIT_SOFTWARE, "pipe: %s", strerror(errno));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        die(EXIT_SOFTWARE, "socketpair: %s", strerror(errno));
    out.keeper = keeper_fork(false);
    if (out.keeper < 0)
        die(EXIT_SOFTWARE, "fork: %s", strerror(errno));
    if (out.keeper == 0) {
        close(pfd[0]);
        close(sv[0]);
        k.chan = sv[1];
        k.progress = pfd[1];
        tk_main(&k);
    }
    redlockd_forget(h);
    close(pfd[1]);
    close(sv[1]);
    out.chan = sv[0];
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);

    while (!out.done) {
        struct pollfd p[2] = { { .fd = -1 } };
        int np = 0;
        int64_t now;

        if (pfd[0] >= 0) {
            p[np].fd = pfd[0];
            p[np++].events = POLLIN;
        }
        p[np].fd = out.chan;
        p[np++].events = POLLIN;
        poll(p, (nfds_t)np, TASK_POLL_MS);
        if (pfd[0] >= 0 && p[0].revents != 0
            && !progress_read(c, id, lease->fence, pfd[0], buf, sizeof(buf),
                              &blen)) {
            close(pfd[0]);
            pfd[0] = -1;
        }
        if (p[np - 1].revents != 0
            && !run_keeper_read(&out, kbuf, sizeof(kbuf), &kblen))
            break;
        now = mono_ms();
        if (now - last_beat >= 1000 && !out.lease_lost) {
            char t[32];

            last_beat = now;
            snprintf(t, sizeof(t), "%lld", (long long)wall_ms());
            note(c, id, lease->fence, "heartbeat", t);
        }
        if (stop_flag && !out.interrupted) {
            out.interrupted = true;
            if (write(out.chan, "stop\n", 5) != 5)
                break;
        }
    }
    if (!out.done) {
        logmsg(c, "task %s: its keeper (pid %ld) died", id, (long)out.keeper);
        out.lease_lost = true;
    }
    /* What the group wrote before it ended. */
    if (pfd[0] >= 0) {
        progress_read(c, id, lease->fence, pfd[0], buf, sizeof(buf), &blen);
        close(pfd[0]);
    }
    return out;
}

/* The result is recorded (or left alone): the keeper releases the lock. */
static void task_release(struct run_result *rr)
{
    if (write(rr->chan, "release\n", 8) != 8) {
        /* The keeper is gone: nothing to tell. */
    }
    close(rr->chan);
    waitpid(rr->keeper, NULL, 0);
}

static void work_one(const struct cfg *c, const char *id)
{
    char res[600], t[32], err[128];
    struct redlockd_lease lease;
    struct redlockd_error lerr;
    struct run_result rr;
    struct redlockd *h;
    redisReply *r;
    char *payload;
    int attempt, rv;

    snprintf(t, sizeof(t), "%lld", (long long)wall_ms());
    /* The claim time keeps recover() off a task in this window, before
     * the lock is ours. */
    freeReplyObject(rcmd("HSET %s claimed %s", task_key(c, id), t));
    task_resource(c, id, res, sizeof(res));
    /* The task's own session, for its keeper to own (see above). */
    if (lk_open(c, &h, &lerr) < 0) {
        logmsg(c, "task %s: redlockd: %s", id, lerr.msg);
        usleep(200000);
        return;
    }
    rv = redlockd_lock(h, res, (uint32_t)c->ttl_ms, 0, 1, &lease);
    if (rv < 0) {
        /* BUSY: someone else is at it (a recovering worker); anything else:
         * the task stays in processing and is recovered after the grace. */
        logmsg(c, "task %s: lock: %s", id, redlockd_last_error(h)->msg);
        redlockd_close(h);
        if (rv != -REDLOCKD_E_BUSY)
            usleep(200000);
        return;
    }
    r = rcmd("EVAL %s 2 %s %s %s %s %s %s %ld", LUA_CLAIM, key(c, "processing"),
             task_key(c, id), id, c->name, owner_args_fence(lease.fence), t,
             (long)getpid());
    attempt = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
    freeReplyObject(r);
    if (attempt <= 0) {
        redlockd_unlock(h, res);
        redlockd_close(h);
        return;
    }
    r = rcmd("HGET %s payload", task_key(c, id));
    payload = strdup(r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    logmsg(c, "task %s attempt %d fence %llu", id, attempt,
           (unsigned long long)lease.fence);

    rr = run_task(c, id, payload, attempt, &lease, h);
    free(payload);

    if (rr.lease_lost) {
        /* Recorded if still ours (it is not, usually); recover() of some
         * worker moves the task back once the lock is free. */
        note(c, id, lease.fence, "last_error", "lease lost while running");
        task_release(&rr);
        return;
    }
    /* The keeper confirmed the lease right before it said so. */
    if (!rr.held) {
        logmsg(c, "task %s: lease lost after the command ended", id);
        task_release(&rr);
        return;
    }
    snprintf(t, sizeof(t), "%lld", (long long)wall_ms());
    if (rr.status == 0 && !rr.interrupted) {
        r = rcmd("EVAL %s 5 %s %s %s %s %s %s %s %s %s", LUA_COMPLETE,
                 key(c, "processing"), task_key(c, id), key(c, "completed"),
                 key(c, "done"), key(c, "completions"), id, c->name,
                 owner_args_fence(lease.fence), t);
        rv = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
        freeReplyObject(r);
        logmsg(c, "task %s %s", id, rv == 1 ? "completed" : "not ours any more");
    } else {
        if (rr.interrupted)
            snprintf(err, sizeof(err), "interrupted (worker stopping)");
        else if (rr.status > 128)
            snprintf(err, sizeof(err), "killed by signal %d", rr.status - 128);
        else
            snprintf(err, sizeof(err), "exit status %d", rr.status);
        r = rcmd("EVAL %s 4 %s %s %s %s %s %s %s %s %s %d %d %d", LUA_FAIL,
                 key(c, "processing"), task_key(c, id), key(c, "delayed"),
                 key(c, "dead"), id, c->name, owner_args_fence(lease.fence), t,
                 err, c->max_attempts, c->backoff_ms, c->backoff_max_ms);
        rv = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
        freeReplyObject(r);
        logmsg(c, "task %s failed (%s): %s", id, err,
               rv == 2 ? "dead" : rv == 1 ? "retry later" : "not ours any more");
    }
    task_release(&rr);
}

static int cmd_work(struct cfg *c)
{
    static char namebuf[320];
    int64_t last_recover = 0;
    int done = 0;
    struct sigaction sa;
    char host[256];

    if (!c->cmd || !c->cmd[0])
        die(EXIT_USAGE, "work: no command (taskq work QUEUE -- COMMAND [ARGS])");
    if (!c->name) {
        if (gethostname(host, sizeof(host)) < 0)
            snprintf(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = '\0';
        snprintf(namebuf, sizeof(namebuf), "taskq-%ld@%s", (long)getpid(), host);
        c->name = namebuf;
    }
    /* What the tasks' commands get, before our own handlers. */
    keeper_save_signals();
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    redis_connect(c);
    lk_connect(c);
    while (!stop_flag && (c->max_tasks == 0 || done < c->max_tasks)) {
        redisReply *r;
        char tmo[32];

        if (mono_ms() - last_recover >= c->recover_ms) {
            recover(c);
            last_recover = mono_ms();
        }
        if (redlockd_ping(lk) < 0) {
            /* Lost the session (a lease ran out, the daemon restarted):
             * start a new one, or exit when the daemon is not there. */
            logmsg(c, "redlockd: %s; reconnecting", redlockd_last_error(lk)->msg);
            redlockd_close(lk);
            lk_connect(c);
        }
        snprintf(tmo, sizeof(tmo), "%.3f", c->poll_ms / 1000.0);
        r = rcmd("BLMOVE %s %s RIGHT LEFT %s", key(c, "pending"),
                 key(c, "processing"), tmo);
        if (r->type == REDIS_REPLY_STRING) {
            char *id = strdup(r->str);

            freeReplyObject(r);
            work_one(c, id);
            free(id);
            done++;
        } else {
            freeReplyObject(r);
        }
    }
    redlockd_close(lk);
    redisFree(rc);
    return 0;
}

/* ---- status ---- */

static long long hget_ll(redisReply *h, const char *field, long long dflt)
{
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (h->element[i]->str && strcmp(h->element[i]->str, field) == 0 &&
            h->element[i + 1]->str)
            return strtoll(h->element[i + 1]->str, NULL, 10);
    return dflt;
}

/* How long the task's run took: until now while it runs, until it
 * finished once completed or dead (not growing any more); null when it
 * has not run, or waits for another attempt (the last one's end is not
 * recorded). */
static json_t *task_running_ms(redisReply *h, int64_t now)
{
    long long started = hget_ll(h, "started", 0);
    long long finished = hget_ll(h, "finished", 0);
    const char *state = NULL;

    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (h->element[i]->str && strcmp(h->element[i]->str, "state") == 0)
            state = h->element[i + 1]->str;
    if (started <= 0 || !state)
        return json_null();
    if (strcmp(state, "running") == 0)
        return json_integer(now > started ? now - started : 0);
    if (finished >= started)
        return json_integer(finished - started);
    return json_null();
}

/* A task's hash as a JSON object of strings (numbers where they are). */
static json_t *task_json(const struct cfg *c, const char *id, int64_t now)
{
    redisReply *h = rcmd("HGETALL %s", task_key(c, id));
    json_t *o = json_object();
    long long t;

    json_object_set_new(o, "id", json_string(id));
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2) {
        const char *f = h->element[i]->str, *v = h->element[i + 1]->str;
        char *end;
        long long n;

        if (!f || !v)
            continue;
        n = strtoll(v, &end, 10);
        if (*v && *end == '\0' && strcmp(f, "payload") != 0)
            json_object_set_new(o, f, json_integer(n));
        else
            json_object_set_new(o, f, json_string(v));
    }
    if ((t = hget_ll(h, "created", 0)) > 0)
        json_object_set_new(o, "age_ms", json_integer(now - t));
    json_t *ran = task_running_ms(h, now);

    if (json_is_null(ran))
        json_decref(ran);
    else
        json_object_set_new(o, "running_ms", ran);
    freeReplyObject(h);
    return o;
}

/* One list (or the delayed set): count, oldest age and up to `show` tasks. */
static json_t *list_json(const struct cfg *c, const char *name, bool zset,
                         int show, int64_t now, bool with_locks)
{
    json_t *o = json_object(), *arr = json_array();
    long long n = rcmd_int(zset ? "ZCARD %s" : "LLEN %s", key(c, name));
    long long oldest = -1;
    redisReply *r;

    /* Lists grow on the left, so the right end is the oldest. */
    r = zset ? rcmd("ZRANGE %s 0 %d", key(c, name), show - 1)
             : rcmd("LRANGE %s -%d -1", key(c, name), show);
    for (size_t i = r->type == REDIS_REPLY_ARRAY ? r->elements : 0; i-- > 0;) {
        size_t k = zset ? r->elements - 1 - i : i;
        const char *id = r->element[k]->str;
        json_t *t;

        if (!id)
            continue;
        t = task_json(c, id, now);
        if (with_locks) {
            char res[600];
            json_t *st;

            task_resource(c, id, res, sizeof(res));
            st = lk_status(res);
            if (st) {
                json_t *held = json_object_get(st, "held");
                json_t *holder = json_object_get(st, "holder");
                json_int_t hms = json_integer_value(json_object_get(holder, "held_ms"));

                json_object_set(t, "lock_held", held ? held : json_false());
                json_object_set(t, "holder", holder ? holder : json_null());
                json_object_set_new(t, "suspect", json_boolean(
                    hms > (json_int_t)(c->suspect_factor * c->expected_ms)));
                json_decref(st);
            }
        }
        if (json_integer_value(json_object_get(t, "age_ms")) > oldest)
            oldest = json_integer_value(json_object_get(t, "age_ms"));
        json_array_append_new(arr, t);
    }
    freeReplyObject(r);
    json_object_set_new(o, "count", json_integer(n));
    if (oldest >= 0)
        json_object_set_new(o, "oldest_age_ms", json_integer(oldest));
    json_object_set_new(o, "tasks", arr);
    return o;
}

static json_t *status_json(const struct cfg *c)
{
    int64_t now = wall_ms();
    json_t *o = json_object();

    json_object_set_new(o, "queue", json_string(c->queue));
    json_object_set_new(o, "pending", list_json(c, "pending", false, 20, now, false));
    json_object_set_new(o, "processing",
                        list_json(c, "processing", false, 100, now, lk != NULL));
    json_object_set_new(o, "retry", list_json(c, "delayed", true, 20, now, false));
    json_object_set_new(o, "completed", list_json(c, "completed", false, 10, now, false));
    json_object_set_new(o, "dead", list_json(c, "dead", false, 20, now, false));
    json_object_set_new(o, "daemon", json_boolean(lk != NULL));
    return o;
}

static void print_status(const struct cfg *c, json_t *s)
{
    static const char *const lists[] = { "pending", "processing", "retry",
                                         "completed", "dead" };

    printf("queue %s\n", c->queue);
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        json_t *l = json_object_get(s, lists[i]), *t;
        size_t k;

        printf("%-10s %6lld", lists[i],
               (long long)json_integer_value(json_object_get(l, "count")));
        if (json_object_get(l, "oldest_age_ms"))
            printf("  oldest %.1fs", json_integer_value(
                       json_object_get(l, "oldest_age_ms")) / 1000.0);
        putchar('\n');
        if (strcmp(lists[i], "completed") == 0)
            continue;
        json_array_foreach(json_object_get(l, "tasks"), k, t) {
            json_t *holder = json_object_get(t, "holder");

            printf("  %-8s attempts=%lld", json_string_value(json_object_get(t, "id")),
                   (long long)json_integer_value(json_object_get(t, "attempts")));
            if (strcmp(lists[i], "processing") == 0) {
                json_t *ran = json_object_get(t, "running_ms");
                char running[32] = "-";

                if (json_is_integer(ran))
                    snprintf(running, sizeof(running), "%.1fs",
                             json_integer_value(ran) / 1000.0);
                printf(" worker=%s fence=%lld running=%s lock=%s",
                       json_string_value(json_object_get(t, "worker")) ?
                       json_string_value(json_object_get(t, "worker")) : "-",
                       (long long)json_integer_value(json_object_get(t, "fence")),
                       running,
                       json_is_true(json_object_get(t, "lock_held")) ? "held" : "FREE");
                if (json_is_object(holder) && json_object_get(holder, "name"))
                    printf(" holder=%s", json_string_value(json_object_get(holder, "name")));
                if (json_is_true(json_object_get(t, "suspect")))
                    printf(" SUSPECT");
            }
            if (json_object_get(t, "last_error"))
                printf(" last_error=\"%s\"",
                       json_string_value(json_object_get(t, "last_error")));
            putchar('\n');
        }
    }
}

static void status_connect(const struct cfg *c)
{
    struct redlockd_opts o;
    struct redlockd_error err;

    redis_connect(c);
    memset(&o, 0, sizeof(o));
    o.server = c->server;
    o.name = "taskq-status";
    o.connect_timeout_ms = 2000;
    if (redlockd_connect(&lk, &o, &err) < 0) {
        fprintf(stderr, "taskq: redlockd: %s (locks not shown)\n", err.msg);
        lk = NULL;
    }
}

static int cmd_status(struct cfg *c)
{
    json_t *s;

    status_connect(c);
    s = status_json(c);
    if (c->json) {
        char *txt = json_dumps(s, JSON_COMPACT);

        printf("%s\n", txt);
        free(txt);
    } else {
        print_status(c, s);
    }
    json_decref(s);
    redlockd_close(lk);
    redisFree(rc);
    return 0;
}

/* ---- monitor: GET /status ---- */

/* One answer and its head; HEAD gets the head alone (with the length the
 * body would have). */
static void http_reply(int fd, bool head_only, const char *code,
                       const char *ctype, const char *extra, const char *body)
{
    char head[512];
    size_t blen = strlen(body);
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "%sConnection: close\r\n\r\n", code, ctype, blen, extra);

    if (write(fd, head, (size_t)n) == n && !head_only)
        (void)!write(fd, body, blen);
}

/* GET /status: 200 with the status JSON, or 503 with {"queue", "error"}
 * while the queue's Redis does not answer (the connection is made again
 * for the next request). */
static void monitor_status(struct cfg *c, int fd, bool head_only)
{
    json_t *s;
    char *txt;

    redis_error[0] = '\0';
    if (!rc)
        (void)redis_connect(c);
    if (lk && redlockd_ping(lk) < 0) {
        redlockd_close(lk);
        lk = NULL;
    }
    s = rc ? status_json(c) : NULL;
    if (redis_error[0] != '\0') {
        json_decref(s);
        s = json_pack("{s:s, s:s}", "queue", c->queue, "error", redis_error);
        redisFree(rc);
        rc = NULL;
    }
    txt = json_dumps(s, JSON_COMPACT);
    if (!txt)
        die(EXIT_SOFTWARE, "out of memory");
    http_reply(fd, head_only, redis_error[0] ? "503 Service Unavailable"
               : "200 OK", "application/json", "", txt);
    free(txt);
    json_decref(s);
}

/* Read the request head (bounded: 2 s, 2 KiB) and answer it. */
static void monitor_request(struct cfg *c, int fd)
{
    char req[2048], method[16] = "", path[256] = "";
    size_t len = 0;
    bool head;

    while (len < sizeof(req) - 1) {
        struct pollfd q = { fd, POLLIN, 0 };
        ssize_t k;

        if (poll(&q, 1, 2000) <= 0)
            break;
        k = read(fd, req + len, sizeof(req) - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
            break;
    }
    req[len] = '\0';
    if (sscanf(req, "%15s %255[^ ?\r\n]", method, path) != 2) {
        http_reply(fd, false, "400 Bad Request", "text/plain", "",
                   "bad request\n");
        return;
    }
    head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0)
        http_reply(fd, false, "405 Method Not Allowed", "text/plain",
                   "Allow: GET, HEAD\r\n", "GET or HEAD only\n");
    else if (strcmp(path, "/status") == 0)
        monitor_status(c, fd, head);
    else
        http_reply(fd, head, "404 Not Found", "text/plain", "",
                   "not found\n");
}

static int cmd_monitor(struct cfg *c)
{
    char host[256];
    const char *colon;
    struct sockaddr_in sin;
    int ls, one = 1;

    if (!c->listen || !(colon = strrchr(c->listen, ':')))
        die(EXIT_USAGE, "monitor: --listen HOST:PORT is required");
    snprintf(host, sizeof(host), "%.*s", (int)(colon - c->listen), c->listen);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
        die(EXIT_USAGE, "monitor: bad address %s", c->listen);
    ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ls < 0 || bind(ls, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        listen(ls, 16) < 0)
        die(EXIT_UNAVAILABLE, "monitor: %s: %s", c->listen, strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    /* The monitor reports a Redis that is down (503); it does not die. */
    redis_soft = true;
    status_connect(c);
    if (redis_error[0] != '\0')
        fprintf(stderr, "taskq: monitor: %s (answering 503 until it is "
                "back)\n", redis_error);
    fprintf(stderr, "taskq: monitor of %s on http://%s/status\n", c->queue,
            c->listen);
    while (!stop_flag) {
        struct pollfd p = { ls, POLLIN, 0 };
        int fd;

        if (poll(&p, 1, 500) <= 0)
            continue;
        fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        monitor_request(c, fd);
        close(fd);
    }
    close(ls);
    redlockd_close(lk);
    redisFree(rc);
    return 0;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fputs("usage: redlockd-taskq push QUEUE PAYLOAD...\n"
          "       redlockd-taskq work QUEUE [options] -- COMMAND [ARGS]\n"
          "       redlockd-taskq status QUEUE [--json]\n"
          "       redlockd-taskq monitor QUEUE --listen 127.0.0.1:PORT\n"
          "       redlockd-taskq progress TEXT...   (from a task's command)\n"
          "options (every subcommand):\n"
          "  --redis HOST:PORT      the Redis holding the queues (127.0.0.1:6379)\n"
          "  --server ADDR          redlockd ($REDLOCKD_SERVER, else 127.0.0.1:7390)\n"
          "work options:\n"
          "  --name NAME            worker name (taskq-PID@HOST)\n"
          "  --ttl MS               lock ttl on Redis (10000)\n"
          "  --keepalive MS         session keepalive (10000)\n"
          "  --max-attempts N       runs before a task is dead (5)\n"
          "  --backoff MS           first retry delay, doubled each time (1000)\n"
          "  --backoff-max MS       (60000)\n"
          "  --expected MS          expected run time of a task (60000)\n"
          "  --suspect-factor X     held longer than X * expected: suspect (3)\n"
          "  --claim-grace MS       a task taken this recently is not stale (5000)\n"
          "  --recover-interval MS  how often to look for stale work (2000)\n"
          "  --poll MS              BLMOVE timeout (1000)\n"
          "  --max-tasks N          exit after N tasks (0: run until SIGTERM)\n",
          f);
}

static int int_arg(const char *opt, const char *v, int min)
{
    char *end;
    long n;

    errno = 0;
    n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || n < min || n > INT_MAX)
        die(EXIT_USAGE, "%s: bad value \"%s\"", opt, v ? v : "");
    return (int)n;
}

int main(int argc, char **argv)
{
    struct cfg c;
    const char *sub;
    char **rest;
    int nrest = 0;

    memset(&c, 0, sizeof(c));
    snprintf(c.redis_host, sizeof(c.redis_host), "127.0.0.1");
    c.redis_port = 6379;
    c.ttl_ms = 10000;
    c.keepalive_ms = 10000;
    c.max_attempts = 5;
    c.backoff_ms = 1000;
    c.backoff_max_ms = 60000;
    c.expected_ms = 60000;
    c.suspect_factor = 3;
    c.claim_grace_ms = 5000;
    c.recover_ms = 2000;
    c.poll_ms = 1000;

    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    sub = argv[1];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(sub, "progress") == 0)
        return cmd_progress(argc - 2, argv + 2);
    rest = calloc((size_t)argc, sizeof(*rest));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--") == 0) {
            c.cmd = argv + i + 1;
            break;
        }
        if (strncmp(a, "--", 2) != 0) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            c.json = true;
            continue;
        }
        if (!v)
            die(EXIT_USAGE, "%s needs a value", a);
        i++;
        if (strcmp(a, "--redis") == 0) {
            const char *colon = strrchr(v, ':');

            if (!colon || colon == v)
                die(EXIT_USAGE, "--redis: HOST:PORT expected, not \"%s\"", v);
            snprintf(c.redis_host, sizeof(c.redis_host), "%.*s",
                     (int)(colon - v), v);
            c.redis_port = int_arg(a, colon + 1, 1);
        } else if (strcmp(a, "--server") == 0) {
            c.server = v;
        } else if (strcmp(a, "--name") == 0) {
            c.name = v;
        } else if (strcmp(a, "--listen") == 0) {
            c.listen = v;
        } else if (strcmp(a, "--ttl") == 0) {
            c.ttl_ms = int_arg(a, v, 100);
        } else if (strcmp(a, "--keepalive") == 0) {
            c.keepalive_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--max-attempts") == 0) {
            c.max_attempts = int_arg(a, v, 1);
        } else if (strcmp(a, "--backoff") == 0) {
            c.backoff_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--backoff-max") == 0) {
            c.backoff_max_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--expected") == 0) {
            c.expected_ms = int_arg(a, v, 1);
        } else if (strcmp(a, "--suspect-factor") == 0) {
            c.suspect_factor = atof(v);
        } else if (strcmp(a, "--claim-grace") == 0) {
            c.claim_grace_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--recover-interval") == 0) {
            c.recover_ms = int_arg(a, v, 10);
        } else if (strcmp(a, "--poll") == 0) {
            c.poll_ms = int_arg(a, v, 10);
        } else if (strcmp(a, "--max-tasks") == 0) {
            c.max_tasks = int_arg(a, v, 0);
        } else {
            die(EXIT_USAGE, "unknown option %s", a);
        }
    }
    if (nrest < 1)
        die(EXIT_USAGE, "%s: no QUEUE", sub);
    c.queue = rest[0];
    if (nrest > 1 && strcmp(sub, "push") != 0)
        die(EXIT_USAGE, "%s: unexpected argument %s", sub, rest[1]);
    int rc;
    if (strcmp(sub, "push") == 0)
        rc = cmd_push(&c, nrest - 1, rest + 1);
    else if (strcmp(sub, "work") == 0)
        rc = cmd_work(&c);
    else if (strcmp(sub, "status") == 0)
        rc = cmd_status(&c);
    else if (strcmp(sub, "monitor") == 0)
        rc = cmd_monitor(&c);
    else
        die(EXIT_USAGE, "unknown subcommand %s", sub);
    free(rest);
    return rc;
}
