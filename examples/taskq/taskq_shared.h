/*
 * redlockd-taskq's own header: what its files share (not installed). The
 * program is split by concern, in layers; calls go down only, a file
 * calls the files below it and never one above:
 *
 *   taskq.c          main: the options, usage and the dispatch; the small
 *                    subcommands push and progress
 *   taskq_status.c   status (counts, ages, locks and holders) and monitor
 *                    (the same JSON over HTTP, GET /status)
 *   taskq_work.c     work: the worker's loop, recovering stale work, and
 *                    one task's run as the worker sees it (claim, lock,
 *                    progress, heartbeats, the owner-checked result)
 *   taskq_keeper.c   the task's keeper: the process that owns a task's
 *                    lock and runs its command (client/keeper.c)
 *   taskq_queue.c    the queue's store in Redis: the connection, the keys,
 *                    and the Lua scripts that change a task's state
 *   taskq_lock.c     the session on redlockd and a task's resource there
 *   taskq_base.c     what every file uses: messages, the wall clock, stopping
 *
 * Times are milliseconds: wall_ms() for what is stored in Redis,
 * keeper_now_ms() (client/keeper.h) for intervals.
 */
#ifndef REDLOCKD_TASKQ_SHARED_H
#define REDLOCKD_TASKQ_SHARED_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "redlockd.h"

#define EXIT_USAGE 64
#define EXIT_UNAVAILABLE 69
#define EXIT_SOFTWARE 70

/* The options, filled in by main (taskq.c); work names the worker. */
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

/* ---- the subcommands (each returns the exit status) ---- */

/* taskq_status.c */
int cmd_status(struct cfg *c);
int cmd_monitor(struct cfg *c);

/* taskq_work.c */
int cmd_work(struct cfg *c);

/* ---- taskq_keeper.c: the task's keeper ----
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

/* How often the worker and the keeper look around while a task runs. */
#define TASK_POLL_MS 50
/* How long a worker waits for a task's lock that is still held (the last
 * attempt's keeper releasing it, a recovering worker moving it). */
#define TASK_LOCK_WAIT_MS 2000

/* The keeper's life, in the child of keeper_fork (the worker's own
 * connections already let go): run c->cmd for the task, with the
 * TASKQ_* and REDLOCKD_* variables and progress (the pipe's write end,
 * closed here once the command has it) as TASKQ_PROGRESS_FD; keep h's
 * lease on lease->resource while the group lives; talk with the worker on
 * chan; then UNLOCK, close h and exit(0). */
void tk_main(const struct cfg *c, const char *id, const char *payload,
             int attempt, const struct redlockd_lease *lease,
             struct redlockd *h, int chan, int progress)
    __attribute__((noreturn));

/* ---- taskq_queue.c: the queue's store in Redis ----
 *
 * One connection per process. A failure (no connection, a transport
 * error, an error reply) is fatal: a worker's supervisor restarts it and
 * its task is recovered. In soft mode (the monitor's) it is noted
 * instead, for queue_error, and the command answers a nil reply (0 for
 * queue_cmd_int), so callers go on.
 */

/* 0, or -1 (soft mode: the reason noted). */
int queue_connect(const struct cfg *c);
/* Drop the connection, without a word to Redis (a forked child's copy
 * goes so too); no-op when there is none. */
void queue_close(void);
bool queue_connected(void);
void queue_set_soft(bool soft);
/* The failure noted since queue_error_clear (soft mode), or NULL. */
const char *queue_error(void);
void queue_error_clear(void);

/* A command (hiredis' format); the reply is the caller's to free. */
redisReply *queue_cmd(const char *fmt, ...);
/* A command whose answer is a number (an integer, or a string of one);
 * 0 for any other answer. */
long long queue_cmd_int(const char *fmt, ...);

/* The key "taskq:<queue>:<suffix>", and a task's hash "...:task:<id>",
 * in one of 8 rotating buffers: enough for the keys of one command. */
const char *queue_key(const struct cfg *c, const char *suffix);
const char *queue_task_key(const struct cfg *c, const char *id);

/* The changes of a task's state, one Lua script each (their KEYS and ARGV
 * at their definitions). Those after the claim are the owner's (c->name
 * and fence): they do nothing to a task that is not its any more. `now`
 * is wall_ms() as text. */

/* Add a task; its id (or "?") goes to id. */
void queue_push(const struct cfg *c, const char *payload, char *id,
                size_t size);
/* Move the retries that are due to pending. */
void queue_promote(const struct cfg *c);
/* Stale work, with its lock held: back to pending (1), or to dead once
 * its attempts are used up (2); 0: left alone (taken within the claim
 * grace, or no longer in processing). */
int queue_requeue(const struct cfg *c, const char *id, const char *reason);
/* Take a task that was moved to processing, as this process's run under
 * fence: the attempt number; 0: not in processing (someone requeued it
 * meanwhile), -1: already finished. */
int queue_claim(const struct cfg *c, const char *id, uint64_t fence,
                const char *now);
/* Record field = value in the task's hash, if the task is still ours. */
void queue_note(const struct cfg *c, const char *id, uint64_t fence,
                const char *field, const char *value);
/* 1: completed, 0: not ours. */
int queue_complete(const struct cfg *c, const char *id, uint64_t fence,
                   const char *now);
/* A failed run: 1: retry after the backoff, 2: dead, 0: not ours. */
int queue_fail(const struct cfg *c, const char *id, uint64_t fence,
               const char *now, const char *error);

/* ---- taskq_lock.c: the session on redlockd ---- */

/* This process's session: the worker's (recovery; a task's lock is on a
 * session of the task's own), or that of status and the monitor (NULL
 * while the daemon does not answer them). */
extern struct redlockd *lk;

/* A session under c's name, with the worker's ttl as its detach time:
 * lk, or one of a task's. */
int lock_open(const struct cfg *c, struct redlockd **h,
              struct redlockd_error *err);
/* lk = lock_open, or exit when the daemon is not there. */
void lock_connect(const struct cfg *c);
/* STATUS of a resource on lk as JSON (caller decrefs), NULL on failure. */
json_t *lock_status(const char *res);
/* The redlockd resource of a task: "taskq:<queue>:<id>". */
void lock_resource(const struct cfg *c, const char *id, char *out,
                   size_t size);

/* ---- taskq_base.c: messages, the wall clock, stopping ---- */

/* Set by on_stop (installed for SIGTERM and SIGINT by work and monitor):
 * they finish what they are doing and return. */
extern volatile sig_atomic_t stop_flag;
void on_stop(int sig);

/* "taskq: ..." on stderr, and exit(code). */
void die(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
/* "taskq[NAME]: ..." on stderr. */
void logmsg(const struct cfg *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int64_t wall_ms(void);

#endif
