/*
 * keeper: the process that keeps a lock for a command's process group
 * (keeper.h says what and why). Linked into redlockctl and redlockd-taskq,
 * never into libredlockd: it installs signal handlers and keeps the
 * self-pipe they write to in globals, which a library must not.
 */
#include "keeper.h"

#include <err.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

/* The signals passed on to the command's group (by the keeper) and to the
 * keeper (by a relaying parent). */
static const int keeper_forwarded[] = { SIGINT, SIGTERM, SIGHUP };

/* Every signal whose disposition a keeper or its parent changes: what
 * the command gets back. */
static const int keeper_touched[] = { SIGINT, SIGTERM, SIGHUP, SIGCHLD,
                                      SIGPIPE, SIGTTOU };

#define KEEPER_NFORWARDED (sizeof(keeper_forwarded) / sizeof(int))
#define KEEPER_NTOUCHED (sizeof(keeper_touched) / sizeof(int))

/* Globals because a signal handler has no other way in, and the command
 * must get what the program had before any handler was installed. */
static int keeper_pipe[2] = { -1, -1 };
static bool keeper_saved;
static bool keeper_ignored[KEEPER_NTOUCHED];    /* SIG_IGN when saved */
static sigset_t keeper_mask;

int64_t keeper_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void keeper_save_signals(void)
{
    struct sigaction old;
    size_t i;

    for (i = 0; i < KEEPER_NTOUCHED; i++)
        keeper_ignored[i] = sigaction(keeper_touched[i], NULL, &old) == 0
                            && old.sa_handler == SIG_IGN;
    sigprocmask(SIG_SETMASK, NULL, &keeper_mask);
    keeper_saved = true;
}

static bool keeper_was_ignored(int sig)
{
    size_t i;

    for (i = 0; i < KEEPER_NTOUCHED; i++)
        if (keeper_touched[i] == sig)
            return keeper_ignored[i];
    return false;
}

/* ---- the self-pipe ------------------------------------------------------ */

static void keeper_on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;

    if (write(keeper_pipe[1], &b, 1) < 0) {
        /* Full pipe: enough wake-ups are queued already. */
    }
    errno = saved;
}

/* A self-pipe of this process's own (a forked process closes the one it
 * inherited: both ends would otherwise be shared with its parent) and the
 * handlers that write to it. */
static int keeper_pipe_init(void)
{
    struct sigaction sa;
    size_t i;

    if (keeper_pipe[0] >= 0) {
        close(keeper_pipe[0]);
        close(keeper_pipe[1]);
    }
    if (pipe2(keeper_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        keeper_pipe[0] = keeper_pipe[1] = -1;
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = keeper_on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    /* A signal ignored by our parent (nohup) stays ignored for the
     * command too, as a shell would do. */
    for (i = 0; i < KEEPER_NFORWARDED; i++)
        if (!keeper_was_ignored(keeper_forwarded[i]))
            sigaction(keeper_forwarded[i], &sa, NULL);
    return 0;
}

int keeper_catch_signals(void)
{
    if (!keeper_saved)
        keeper_save_signals();
    return keeper_pipe_init();
}

int keeper_signal_fd(void)
{
    return keeper_pipe[0];
}

int keeper_signal_next(void)
{
    unsigned char b;
    ssize_t n;

    do {
        n = keeper_pipe[0] >= 0 ? read(keeper_pipe[0], &b, 1) : -1;
    } while (n < 0 && errno == EINTR);
    return n == 1 ? b : 0;
}

/* ---- the keeper process ------------------------------------------------- */

/* What makes the child a keeper (keeper.h, keeper_fork). */
static int keeper_become(void)
{
    setpgid(0, 0);
    /* The command's orphans come to us; without it (old kernels) they go
     * to init, and only kill(-pgid, 0) sees them. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTTOU, SIG_IGN);
    return keeper_pipe_init();
}

pid_t keeper_fork(bool relay)
{
    sigset_t block, old;
    pid_t pid;
    size_t i;
    int rc = 0, e;

    if (!keeper_saved)
        keeper_save_signals();
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    for (i = 0; i < KEEPER_NFORWARDED; i++)
        sigaddset(&block, keeper_forwarded[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    pid = fork();
    e = errno;
    if (pid == 0)
        rc = keeper_become();
    else if (pid > 0) {
        /* Both sides set the group, so nothing sent to it can miss it. */
        setpgid(pid, pid);
        if (relay)
            rc = keeper_pipe_init();
    }
    if (rc < 0)
        err(EX_OSERR, "pipe");
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return pid;
}

int keeper_relay(pid_t keeper)
{
    struct pollfd p = { .fd = keeper_pipe[0], .events = POLLIN };
    int st, sig;

    for (;;) {
        if (waitpid(keeper, &st, WNOHANG) == keeper)
            return st;
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        while ((sig = keeper_signal_next()) > 0) {
            if (sig != SIGCHLD)
                kill(keeper, sig);
        }
    }
}

/* ---- the command's group ------------------------------------------------ */

/* In the child: the dispositions and mask the program had, then exec. */
static void keeper_exec(char *const *argv, int (*setup)(void *ud), void *ud)
{
    size_t i;
    int e;

    setpgid(0, 0);
    for (i = 0; i < KEEPER_NTOUCHED; i++)
        signal(keeper_touched[i], keeper_ignored[i] ? SIG_IGN : SIG_DFL);
    sigprocmask(SIG_SETMASK, &keeper_mask, NULL);
    if (setup && setup(ud) < 0)
        _exit(126);
    execvp(argv[0], argv);
    e = errno;
    warn("cannot run %s", argv[0]);
    _exit(e == ENOENT ? 127 : 126);
}

int keeper_spawn(struct keeper_group *g, char *const *argv,
                 int (*setup)(void *ud), void *ud)
{
    pid_t pid;

    memset(g, 0, sizeof(*g));
    fflush(NULL);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0)
        keeper_exec(argv, setup, ud);
    /* Both sides set the group, so no forwarded signal can miss it. */
    setpgid(pid, pid);
    g->pgid = pid;
    return 0;
}

void keeper_reap(struct keeper_group *g)
{
    pid_t pid;
    int st;

    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (pid == g->pgid && !g->exited) {
            g->exited = true;
            g->status = st;
        }
    }
}

/* Once the command itself was reaped, its pid stays reserved only as long
 * as the group has members; after that it may name someone else's group,
 * so nothing is sent once the group was seen gone. (Between the last
 * member's exit and our next look the number could be reused: that would
 * take the whole pid space in KEEPER_GROUP_POLL_MS, and would only keep
 * the lock longer.) EPERM (a member that changed its uid) is a member. */
void keeper_kill(struct keeper_group *g, int sig)
{
    if (g->gone || g->pgid <= 0)
        return;
    if (kill(-g->pgid, sig) < 0 && errno == ESRCH && g->exited)
        g->gone = true;
}

bool keeper_group_left(struct keeper_group *g)
{
    if (g->exited)
        keeper_kill(g, 0);
    return !g->gone;
}

void keeper_stop(struct keeper_group *g, int64_t kill_after_ms)
{
    keeper_kill(g, SIGTERM);
    keeper_kill(g, SIGCONT);
    g->kill_at = keeper_now_ms() + kill_after_ms;
}

void keeper_timers(struct keeper_group *g)
{
    if (g->kill_at > 0 && keeper_now_ms() >= g->kill_at) {
        keeper_kill(g, SIGKILL);
        g->kill_at = 0;
        g->killed = true;
    }
}

int keeper_timeout(const struct keeper_group *g, int timeout_ms)
{
    int64_t now = keeper_now_ms(), next = -1;

    if (timeout_ms >= 0)
        next = now + timeout_ms;
    if (g->kill_at > 0 && (next < 0 || g->kill_at < next))
        next = g->kill_at;
    if (g->exited && !g->gone && (next < 0 || now + KEEPER_GROUP_POLL_MS < next))
        next = now + KEEPER_GROUP_POLL_MS;
    if (next < 0)
        return -1;
    return next <= now ? 0 : (int)(next - now);
}

int keeper_exit_status(int wait_status)
{
    if (WIFEXITED(wait_status))
        return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status))
        return 128 + WTERMSIG(wait_status);
    return EX_SOFTWARE;
}
