/*
 * redlockd-taskq work: the worker's loop (cmd_work), recovering stale
 * work, and one task's run as the worker sees it: the claim, the lock on
 * a session of the task's own, the task's keeper forked to hold it
 * (taskq_keeper.c), progress lines and heartbeats, and the owner-checked
 * result (taskq_shared.h lists the files).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "keeper.h"
#include "redlockd.h"
#include "taskq_shared.h"

/* Look at every task in processing once: one whose lock nobody holds is
 * taken back (under the lock, so no two workers do it at once); one held
 * for longer than suspect_factor * expected_ms is marked suspect. */
static void recover(const struct cfg *c)
{
    redisReply *r;
    char res[600];
    int64_t suspect_ms = (int64_t)(c->suspect_factor * c->expected_ms);

    queue_promote(c);
    r = queue_cmd("LRANGE %s 0 999", queue_key(c, "processing"));
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const char *id = r->element[i]->str;
        json_t *st;
        bool held;
        int rv;

        if (!id)
            continue;
        lock_resource(c, id, res, sizeof(res));
        st = lock_status(res);
        if (!st)
            continue;   /* the daemon can not say: leave it */
        held = json_is_true(json_object_get(st, "held"));
        if (held) {
            json_t *holder = json_object_get(st, "holder");
            json_int_t held_ms = json_integer_value(
                json_object_get(holder, "held_ms"));

            if (suspect_ms > 0 && held_ms > suspect_ms) {
                freeReplyObject(queue_cmd("HSET %s suspect %lld",
                                          queue_task_key(c, id),
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
        rv = queue_requeue(c, id, "stale: lock not held");
        redlockd_unlock(lk, res);
        if (rv == 1)
            logmsg(c, "stale task %s moved back to pending", id);
        else if (rv == 2)
            logmsg(c, "stale task %s moved to dead (attempts used up)", id);
    }
    freeReplyObject(r);
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
            queue_note(c, id, fence, "progress", buf);
            *blen -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, *blen + 1);
        }
        if (*blen == size - 1) {
            queue_note(c, id, fence, "progress", buf);
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
    int pfd[2], sv[2];
    char buf[4096], kbuf[256];
    size_t blen = 0, kblen = 0;
    int64_t last_beat = keeper_now_ms();

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
        /* The worker's connections are the worker's: our copies go,
         * without a word (the worker goes on using them). */
        redlockd_forget(lk);
        lk = NULL;
        queue_close();
        tk_main(c, id, payload, attempt, lease, h, sv[1], pfd[1]);
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
        now = keeper_now_ms();
        if (now - last_beat >= 1000 && !out.lease_lost) {
            char t[32];

            last_beat = now;
            snprintf(t, sizeof(t), "%lld", (long long)wall_ms());
            queue_note(c, id, lease->fence, "heartbeat", t);
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
    freeReplyObject(queue_cmd("HSET %s claimed %s", queue_task_key(c, id), t));
    lock_resource(c, id, res, sizeof(res));
    /* The task's own session, for its keeper to own (taskq_shared.h, "the
     * task's keeper"). */
    if (lock_open(c, &h, &lerr) < 0) {
        logmsg(c, "task %s: redlockd: %s", id, lerr.msg);
        usleep(200000);
        return;
    }
    /* The lock may still be the last attempt's: its worker records the
     * outcome (the task back in pending or delayed, from where this worker
     * took it) before its keeper releases the lock, so wait that out, as
     * a recovering worker's short hold. Without the wait the task stayed
     * in processing and recover() moved it back as "stale", over its real
     * last_error. */
    rv = redlockd_lock(h, res, (uint32_t)c->ttl_ms, TASK_LOCK_WAIT_MS, 1,
                       &lease);
    if (rv < 0) {
        /* TIMEOUT: someone else is at it for longer; anything else: the
         * task stays in processing and is recovered after the grace. */
        logmsg(c, "task %s: lock: %s", id, redlockd_last_error(h)->msg);
        redlockd_close(h);
        if (rv != -REDLOCKD_E_TIMEOUT)
            usleep(200000);
        return;
    }
    attempt = queue_claim(c, id, lease.fence, t);
    if (attempt <= 0) {
        redlockd_unlock(h, res);
        redlockd_close(h);
        return;
    }
    r = queue_cmd("HGET %s payload", queue_task_key(c, id));
    payload = strdup(r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    logmsg(c, "task %s attempt %d fence %llu", id, attempt,
           (unsigned long long)lease.fence);

    rr = run_task(c, id, payload, attempt, &lease, h);
    free(payload);

    if (rr.lease_lost) {
        /* Recorded if still ours (it is not, usually); recover() of some
         * worker moves the task back once the lock is free. */
        queue_note(c, id, lease.fence, "last_error",
                   "lease lost while running");
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
        rv = queue_complete(c, id, lease.fence, t);
        logmsg(c, "task %s %s", id, rv == 1 ? "completed" : "not ours any more");
    } else {
        if (rr.interrupted)
            snprintf(err, sizeof(err), "interrupted (worker stopping)");
        else if (rr.status > 128)
            snprintf(err, sizeof(err), "killed by signal %d", rr.status - 128);
        else
            snprintf(err, sizeof(err), "exit status %d", rr.status);
        rv = queue_fail(c, id, lease.fence, t, err);
        logmsg(c, "task %s failed (%s): %s", id, err,
               rv == 2 ? "dead" : rv == 1 ? "retry later" : "not ours any more");
    }
    task_release(&rr);
}

int cmd_work(struct cfg *c)
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
    queue_connect(c);
    lock_connect(c);
    while (!stop_flag && (c->max_tasks == 0 || done < c->max_tasks)) {
        redisReply *r;
        char tmo[32];

        if (keeper_now_ms() - last_recover >= c->recover_ms) {
            recover(c);
            last_recover = keeper_now_ms();
        }
        if (redlockd_ping(lk) < 0) {
            /* Lost the session (a lease ran out, the daemon restarted):
             * start a new one, or exit when the daemon is not there. */
            logmsg(c, "redlockd: %s; reconnecting", redlockd_last_error(lk)->msg);
            redlockd_close(lk);
            lock_connect(c);
        }
        snprintf(tmo, sizeof(tmo), "%.3f", c->poll_ms / 1000.0);
        r = queue_cmd("BLMOVE %s %s RIGHT LEFT %s", queue_key(c, "pending"),
                      queue_key(c, "processing"), tmo);
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
    queue_close();
    return 0;
}
