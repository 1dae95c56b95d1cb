/*
 * keeper: the process that keeps a lock for a command's process group,
 * shared by `redlockctl run` and `redlockd-taskq work` (issue 28).
 *
 * A lock taken for a command is the command's process group's: it stays
 * held while any process of that group lives, whether or not the process
 * kept the lock connection (a worker started with close_fds, as Python's
 * subprocess does by default, does not), and even after the program that
 * took the lock is killed with SIGKILL. So that program, once it holds the
 * lock, forks a keeper (keeper_fork) and leaves the lock's handle to it
 * (redlockd_forget on its own copy). The keeper is in a process group of
 * its own (terminal signals to the foreground group never reach it; it
 * stays in the terminal's session, as the command does), is the subreaper
 * of the command's orphans, forks the command into a group of its own
 * (keeper_spawn), and, once the command itself has exited, looks whether
 * any process of the group is left (keeper_group_left) before it lets the
 * lock go. Following the lease (refreshes, reconnects, losses) is the
 * caller's loop: redlockctl's and taskq's differ; what a group is and how
 * it is watched, signalled and stopped is here, once.
 *
 * What the group does not cover: a process that leaves it (setsid, or
 * setpgid into another group, as a daemon's double fork does) is not
 * waited for.
 *
 * Signals: a process has one self-pipe, written by the handler of SIGCHLD
 * and of the forwarded signals (SIGINT, SIGTERM, SIGHUP; those ignored
 * when keeper_save_signals ran stay ignored) and read with
 * keeper_signal_next. The command gets the dispositions and the signal
 * mask the program had when keeper_save_signals ran (a signal ignored
 * under nohup stays ignored), not the keeper's.
 */
#ifndef REDLOCKD_KEEPER_H
#define REDLOCKD_KEEPER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Once the command itself has exited while the rest of its group runs:
 * how often to look whether the group is empty (its members are not all
 * our children, so SIGCHLD need not tell us). */
#define KEEPER_GROUP_POLL_MS 20

/* The command's process group, as its keeper sees it. */
struct keeper_group {
    pid_t pgid;             /* the command, leader of its group; 0: none */
    int status;             /* its wait status, once exited */
    bool exited;            /* the command itself was reaped */
    bool gone;              /* no process of the group is left */
    int64_t kill_at;        /* when SIGKILL is due (keeper_now_ms); 0: not */
    bool killed;            /* the group got that SIGKILL */
};

/* CLOCK_MONOTONIC in ms, the clock of kill_at. */
int64_t keeper_now_ms(void);

/* Remember the signal dispositions and mask the command is to get: call
 * before the program installs any handler (keeper_fork does it when it
 * was not called). */
void keeper_save_signals(void);

/*
 * Fork the keeper. Returns as fork(): the keeper's pid in the parent, 0 in
 * the keeper, -1 (errno set) when it failed. The keeper is made the leader
 * of a group of its own and the subreaper of its descendants, ignores
 * SIGPIPE (what it writes to a parent or a terminal that has gone must not
 * kill it, and with it the lock) and SIGTTOU (its messages reach a terminal
 * whose foreground group it is not in), and has its self-pipe. With relay,
 * the parent gets a self-pipe too, for keeper_relay; without, its signal
 * handling is left as it was. Signals are blocked across the fork, so none
 * is lost on either side.
 */
pid_t keeper_fork(bool relay);

/*
 * In the parent: forward SIGINT, SIGTERM and SIGHUP to the keeper (which
 * passes them to the command's group) until it exits, and return its wait
 * status.
 */
int keeper_relay(pid_t keeper);

/*
 * Catch SIGINT, SIGTERM, SIGHUP (those not ignored when keeper_save_signals
 * ran) and SIGCHLD into a self-pipe of this process's own, without a
 * keeper: for a program that holds a lock or watches one itself and waits
 * for those signals with poll() (redlockctl lock and watch). 0, or -1
 * (errno set).
 */
int keeper_catch_signals(void);

/* The read end of this process's self-pipe, for poll(); -1 without one. */
int keeper_signal_fd(void);
/* The next signal caught, 0 when none is left. */
int keeper_signal_next(void);

/*
 * In the keeper: fork argv into a process group of its own, with the
 * saved dispositions and mask; setup(ud), when not NULL, runs in the child
 * first (its environment, the descriptors it inherits) and fails it with
 * 126 by returning -1. A command that cannot be run exits 127 (not found)
 * or 126, after one line on stderr. 0, or -1 (errno set).
 */
int keeper_spawn(struct keeper_group *g, char *const *argv,
                 int (*setup)(void *ud), void *ud);

/* Reap the command and any orphan of its group (we are their subreaper),
 * at once, so that a group whose processes have all exited is seen empty,
 * not kept alive by zombies: call on SIGCHLD. */
void keeper_reap(struct keeper_group *g);

/* A signal to the whole group, while any of it may be left. */
void keeper_kill(struct keeper_group *g, int sig);

/* Is any process of the group left? Once the command itself was reaped,
 * kill(-pgid, 0) says; true while the command runs. */
bool keeper_group_left(struct keeper_group *g);

/* Stop the group: SIGTERM (and SIGCONT, for a stopped one) now, SIGKILL
 * kill_after_ms later (keeper_timers). */
void keeper_stop(struct keeper_group *g, int64_t kill_after_ms);

/* SIGKILL once it is due. */
void keeper_timers(struct keeper_group *g);

/* The poll() timeout that keeps keeper_timers and keeper_group_left on
 * time: timeout_ms (negative: none) shortened as needed. */
int keeper_timeout(const struct keeper_group *g, int timeout_ms);

/* The command's exit status as a shell reports it: its code, or 128+N for
 * a death by signal N. */
int keeper_exit_status(int wait_status);

#endif
