/*
 * redlockd-taskq, the task's keeper: the process that owns a task's
 * session on redlockd while the task's command runs, keeps its lease, and
 * stops the command's process group the moment the lease is lost; the
 * worker (taskq_work.c) forks it per task (taskq_shared.h, "the task's
 * keeper", says how they talk). It calls only taskq_base.c, client/keeper.c
 * and libredlockd.
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
#include <unistd.h>

#include "keeper.h"
#include "redlockd.h"
#include "taskq_shared.h"

#define TASK_STOP_KILL_AFTER_MS 5000

/* The keeper's state: one process, one task. */
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
    int64_t now = keeper_now_ms();

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
    int64_t now = keeper_now_ms(), next = now + TASK_POLL_MS, deadline;

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
void tk_main(const struct cfg *c, const char *id, const char *payload,
             int attempt, const struct redlockd_lease *lease,
             struct redlockd *h, int chan, int progress)
{
    struct task_keeper tk = { .c = c, .id = id, .payload = payload,
                              .attempt = attempt, .lease = lease, .h = h,
                              .chan = chan, .progress = progress };
    struct task_keeper *k = &tk;
    int sig;

    fcntl(k->chan, F_SETFL, O_NONBLOCK);
    /* A refresh every ttl/3, and often enough to keep a session with a
     * HELLO keepalive alive: nobody else sends on this one. */
    k->period = k->c->ttl_ms / 3;
    if (k->c->keepalive_ms > 0 && k->c->keepalive_ms / 3 < k->period)
        k->period = k->c->keepalive_ms / 3;
    if (k->period < 1)
        k->period = 1;
    k->next_refresh = keeper_now_ms() + k->period;
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
