/*
 * redlockctl run, elect and lock: the commands that take a lock and hold
 * it. run takes the lock (sending the LOCK again through the next daemon
 * when its own stops or dies under it), forks the keeper that holds it for
 * the command's process group from then on (see "run: the keeper" below)
 * and relays signals to it; the keeper runs the command, follows the lease
 * across connections and daemons ("run: failover"), stops the group when
 * the lease is lost, releases the lock as soon as the group is empty and
 * exits with the command's status. elect is run for a leader (a campaign
 * without a time limit, with --value); lock holds a lock without a
 * command until told to let go. The lock kinds (--shared, --limit, -r,
 * --value) are taken with redlockd_lockv.
 */
#include <err.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "keeper.h"

#define CTL_EXIT_LOST 70            /* the lease was lost, command stopped */
/*
 * run: the keeper (issue 28). The lock is the command's process group's:
 * held while any process of the group lives, whether or not it kept the
 * lock connection (a worker started with close_fds does not), even after
 * redlockctl itself is killed with SIGKILL. So once the lock is taken,
 * redlockctl forks a keeper (client/keeper.c): in a process group of its
 * own (a terminal's SIGINT or SIGTSTP to the foreground group, where
 * redlockctl is, never reaches it), the subreaper of the command's
 * orphans, the only owner of the lock's handle (this process forgets its
 * copy without a word: redlockd_forget). The keeper runs the command and
 * everything below (refreshes, failover, deadlines, --on-lost), looks
 * with kill(-pgid, 0) whether the group is empty once the command itself
 * has exited, and then releases the lock at once (UNLOCK, QUIT). The
 * visible redlockctl only forwards SIGINT, SIGTERM and SIGHUP to the
 * keeper and exits with its status; SIGKILLed, it leaves the keeper
 * running, unaffected. Processes that leave the group (setsid, setpgid)
 * are not waited for.
 *
 * The keeper also hands the lock connection down to the command (not
 * close-on-exec, its number in REDLOCKD_LOCK_FD), for the case where the
 * keeper itself is killed: the daemon then sees the connection close only
 * when the last process holding that socket exits; the session detaches,
 * and the lock is released when its detach time (--detach) runs out.
 * After a failover the session is on a connection of the keeper's own,
 * which the command does not have (the library shut the inherited one
 * down): a SIGKILLed keeper then keeps the lock for the detach time only.
 * For the same reason `run` asks for no HELLO keepalive: once the keeper
 * is gone nobody would send the lines that keep such a session alive.
 *
 * It confirms the lease every third of its ttl (the daemon's renewal
 * period), which leaves each confirmation two thirds of a ttl to arrive
 * before the deadline of the one before; sooner when the validity left is
 * short, never more often than every CTL_REFRESH_MIN_MS and never less
 * often than every CTL_REFRESH_MAX_MS.
 *
 * Unconfirmed, the command is stopped a little before the lease deadline:
 * the keys outlive the deadline only by the daemon's drift margin (22 ms
 * for a 2 s ttl), and stopping takes time (our wake-up, the signal, the
 * command's exit). The daemon keeps the same twentieth of the ttl for its
 * clients to act on EVENT LOST.
 */
#define CTL_REFRESH_MAX_MS 15000
#define CTL_REFRESH_MIN_MS 50
#define CTL_STOP_EARLY_MAX_MS 1000
/* The environment variable that names the inherited lock connection. */
#define CTL_LOCK_FD_ENV "REDLOCKD_LOCK_FD"
/*
 * run: failover. The session asks for HELLO detach= of the ttl, at least
 * CTL_DETACH_MIN_MS and at most CTL_DETACH_MAX_MS (the daemon's default
 * limits.max_detach_ms), unless --detach says otherwise: so a broken
 * connection costs nothing while the library resumes the session, and a
 * daemon restarted or lost costs nothing while it adopts the lease on
 * another. While the handle is not connected, redlockctl gives it slices
 * of at most CTL_RECONNECT_SLICE_MS to reconnect in, so that signals and
 * the command's exit are not left waiting, and looks again after
 * CTL_RECONNECT_POLL_MS. Before the grant, a LOCK refused by a daemon that
 * is stopping, or cut off by a broken connection, is sent again through
 * the next daemon (ctl_lock_again), within what is left of --wait.
 */
#define CTL_DETACH_MIN_MS 30000
#define CTL_DETACH_MAX_MS 60000
#define CTL_RECONNECT_POLL_MS 20

/* elect without --wait campaigns in LOCKs that wait this long each, again
 * and again: within the daemon's locks.max_wait_ms (an hour by default),
 * and short enough that a daemon that stalls is noticed. */
#define CTL_CAMPAIGN_ROUND_MS 60000

/* ---- run: lock kinds ------------------------------------------------------
 * --shared, --limit K, -r R (several resources) and --value: taken with
 * redlockd_lockv, released with redlockd_unlockv. */

/* Does this run use a kind that redlockd_lock cannot ask for? */
static bool ctl_kinds(const struct ctl *c)
{
    return c->shared || c->limit || c->nresources > 1 || c->value;
}

/* Is resource one this run holds? */
static bool ctl_holds(const struct ctl *c, const char *first,
                      const char *resource)
{
    if (strcmp(first, resource) == 0)
        return true;
    for (size_t i = 0; i < c->nresources; i++)
        if (strcmp(c->resources[i], resource) == 0)
            return true;
    return false;
}

static int ctl_lockv(const struct ctl *c, struct redlockd *h,
                     uint32_t wait_ms, struct redlockd_lease *lease)
{
    struct redlockd_lock_opts o = {
        .ttl_ms = c->ttl_ms, .wait_ms = wait_ms,
        .mode = c->shared ? REDLOCKD_SHARED : REDLOCKD_EXCLUSIVE,
        .limit = c->limit, .value = c->value,
    };
    struct redlockd_grant g;
    char slot[16];
    int rc;

    rc = redlockd_lockv(h, c->resources, c->nresources, &o, &g);
    if (rc < 0)
        return rc;
    *lease = g.lease;
    /* For the command (the parent's environment is the child's). */
    if (c->limit) {
        snprintf(slot, sizeof(slot), "%" PRIu32, g.slot);
        setenv("REDLOCKD_SLOT", slot, 1);
    }
    if (c->shared)
        setenv("REDLOCKD_MODE", "shared", 1);
    if (c->nresources > 1) {
        size_t len = 0;
        for (size_t i = 0; i < c->nresources; i++)
            len += strlen(c->resources[i]) + 1;
        char *all = malloc(len);
        if (all) {
            all[0] = '\0';
            for (size_t i = 0; i < c->nresources; i++) {
                if (i)
                    strcat(all, " ");
                strcat(all, c->resources[i]);
            }
            setenv("REDLOCKD_RESOURCES", all, 1);
            free(all);
        }
    }
    return 0;
}

static int ctl_unlockv(const struct ctl *c, struct redlockd *h)
{
    return redlockd_unlockv(h, c->resources, c->nresources);
}

/* ---- run ---------------------------------------------------------------- */

struct ctl_run {
    struct ctl *c;
    const char *resource;
    struct redlockd *h;
    /* Our own close-on-exec duplicate of the lock connection: once the
     * library gave the connection up, shutdown() on it ends it for the
     * command's copies too. -1: none. */
    int conn;
    struct keeper_group g;      /* the command and its process group */
    int lost;                   /* set by ctl_on_lost, or the deadline */
    int lost_noticed;           /* acted on (message, SIGTERM) */
    char lost_reason[160];
    double refresh_every;       /* ttl/3 within the CTL_REFRESH_* bounds */
    double next_refresh;
    double stop_early;          /* how long before the deadline to stop */
    bool not_taken;             /* the lock was busy or refused */
    /* When the work the lock guarded ended (the command's group was seen
     * empty; lock: told to stop), and the earliest deadline of the leases
     * then (-1: none known): a loss the release reports afterwards is
     * judged against these, not against when the release came back. */
    int64_t ended_ms;
    int64_t covered_until;
};

/* The library's own reasons for a lost lease, for the message. */
static const char *ctl_lost_why(const char *reason)
{
    if (strcmp(reason, "deadline") == 0)
        return "it was not confirmed again before its deadline";
    if (strcmp(reason, "adopt") == 0)
        return "no daemon could take it over after the connection was lost";
    if (strcmp(reason, "disconnected") == 0)
        return "the session ended with the connection";
    return "the daemon could not keep the lease";
}

static void ctl_on_lost(const char *resource, uint64_t fence,
                        const char *reason, void *ud)
{
    struct ctl_run *r = ud;

    (void)fence;
    /* The library gave the connection up for good (a handle that does
     * not reconnect; one that does shuts a lost connection down itself):
     * the command's inherited copies must not keep the daemon's session,
     * and with it the lease, alive. */
    if (!resource && r->conn >= 0)
        (void)shutdown(r->conn, SHUT_RDWR);
    if (r->lost)
        return;
    if (!resource)
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "the connection to the daemon was lost");
    else if (ctl_holds(r->c, r->resource, resource))
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "%s%s%s (%s)", ctl_lost_why(reason),
                 r->c->nresources > 1 ? ", on " : "",
                 r->c->nresources > 1 ? resource : "", reason);
    else
        return;
    r->lost = 1;
}

/* In the child: hand the lock connection down to the command. Its number
 * goes into REDLOCKD_LOCK_FD; one of 0-2 (redlockctl started with stdio
 * closed) is moved up first, the command's stdio is not the place for it.
 * -1 on failure. */
static int ctl_child_lock_fd(int fd)
{
    char num[16];

    if (fd < 3) {
        fd = fcntl(fd, F_DUPFD, 3);
        if (fd < 0)
            return -1;
    } else if (fcntl(fd, F_SETFD, 0) < 0) {
        return -1;
    }
    snprintf(num, sizeof(num), "%d", fd);
    return setenv(CTL_LOCK_FD_ENV, num, 1);
}

/* What the command inherits, set in the child before exec. */
struct ctl_child {
    const struct redlockd_lease *lease;
    const char *value;          /* --value, or NULL */
    int lock_fd;
};

static int ctl_child_setup(void *ud)
{
    const struct ctl_child *ch = ud;
    char fence[24];

    snprintf(fence, sizeof(fence), "%" PRIu64, ch->lease->fence);
    if (setenv("REDLOCKD_RESOURCE", ch->lease->resource, 1) < 0
        || setenv("REDLOCKD_TOKEN", ch->lease->token, 1) < 0
        || setenv("REDLOCKD_FENCE", fence, 1) < 0
        || (ch->value && setenv("REDLOCKD_VALUE", ch->value, 1) < 0)) {
        warn("setenv");
        return -1;
    }
    if (ctl_child_lock_fd(ch->lock_fd) < 0) {
        warn("cannot pass the lock connection on");
        return -1;
    }
    return 0;
}

/* In the keeper: the command, in a process group of its own. No
 * parent-death signal: the command outlives us (even our SIGKILL), and
 * keeps the lock through the connection it inherits. */
static int ctl_spawn(struct ctl_run *r, const struct redlockd_lease *lease,
                     char **argv)
{
    struct ctl_child ch = { .lease = lease, .value = r->c->value,
                            .lock_fd = redlockd_fd(r->h) };

    if (ch.lock_fd < 0) {
        warnx("lost the connection to the daemon before the command started");
        return -1;
    }
    r->conn = fcntl(ch.lock_fd, F_DUPFD_CLOEXEC, 3);
    if (r->conn < 0) {
        warn("dup");
        return -1;
    }
    if (keeper_spawn(&r->g, argv, ctl_child_setup, &ch) < 0) {
        warn("fork");
        return -1;
    }
    return 0;
}

/* Is there more to wait for? The command itself, then the rest of its
 * process group: the lock is the group's while any of it runs (a
 * background job the command left, a worker that closed its
 * descriptors). After a lost lease there is nothing to keep; with
 * --on-lost kill, SIGTERM went to all of the group and each process has
 * --kill-after to finish before SIGKILL. */
static bool ctl_waiting(struct ctl_run *r)
{
    if (!r->g.exited)
        return true;
    if (r->lost_noticed && (!r->c->kill_on_lost || r->g.killed))
        return false;
    if (r->lost && !r->lost_noticed)
        return false;
    return keeper_group_left(&r->g);
}

static void ctl_handle_signals(struct ctl_run *r)
{
    int sig;

    /* To the command's group for as long as the lock is held for it:
     * while the command runs, and after it exited while others of its
     * group run on (keeper_kill sends nothing once the group is gone). */
    while ((sig = keeper_signal_next()) > 0) {
        if (sig == SIGCHLD)
            keeper_reap(&r->g);
        else
            keeper_kill(&r->g, sig);
    }
}

/* The lease is gone: the command no longer has the right to run. */
static void ctl_notice_lost(struct ctl_run *r)
{
    const struct redlockd_error *e = redlockd_last_error(r->h);

    /* The command itself may have exited already while others of its
     * group run on: they are told too. */
    if (!r->lost || r->lost_noticed || !keeper_group_left(&r->g))
        return;
    r->lost_noticed = 1;
    if (!r->c->kill_on_lost) {
        warnx("lost the lock on %s: %s%s%s; --on-lost ignore: the command "
              "goes on", r->resource, r->lost_reason, e->code ? ": " : "",
              e->msg);
        return;
    }
    warnx("lost the lock on %s: %s%s%s; stopping the command's process "
          "group (SIGTERM, SIGKILL after %u s)", r->resource, r->lost_reason,
          e->code ? ": " : "", e->msg, r->c->kill_after_s);
    keeper_stop(&r->g, (int64_t)r->c->kill_after_s * 1000);
}

/* Failures reach us through ctl_on_lost; a lost connection leaves the
 * handle unconnected, and ctl_timers reconnects. (A daemon shutting down
 * is not left before it closes the connection: closing it ourselves then
 * would release the lock.) */
static void ctl_handle_daemon(struct ctl_run *r)
{
    (void)redlockd_poll_events(r->h, 0);
    ctl_notice_lost(r);
}

/* When the command must have been told to stop, unless the lease is
 * confirmed again: stop_early before its deadline. false once the lease is
 * not held any more. */
static bool ctl_stop_at(const struct ctl_run *r, double *at)
{
    int64_t deadline;

    if (redlockd_lease_deadline(r->h, r->resource, &deadline) != 0)
        return false;
    *at = (double)deadline - r->stop_early;
    return true;
}

/* The next confirmation: refresh_every after `sent`, or halfway to the
 * stop time when that comes first. */
static void ctl_schedule_refresh(struct ctl_run *r, double sent)
{
    double every = r->refresh_every, stop;

    if (ctl_stop_at(r, &stop) && (stop - sent) / 2 < every)
        every = (stop - sent) / 2;
    r->next_refresh = sent + (every > CTL_REFRESH_MIN_MS ? every
                                                         : CTL_REFRESH_MIN_MS);
}

/* Confirm the lease, or (not connected) reconnect: not waiting past the
 * stop time, and while reconnecting not past a slice of it either. A lost
 * lease reaches us through ctl_on_lost. */
static void ctl_refresh(struct ctl_run *r)
{
    double sent = ctl_now_ms(), stop, within;

    if (!ctl_stop_at(r, &stop) || stop <= sent)
        return;
    within = stop - sent;
    if (redlockd_fd(r->h) < 0 && within > CTL_RECONNECT_SLICE_MS)
        within = CTL_RECONNECT_SLICE_MS;
    if (redlockd_refresh_within(r->h, (int)within) == -REDLOCKD_E_IO_TIMEOUT)
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "the daemon did not confirm the lease");
    ctl_schedule_refresh(r, sent);
}

/* The stop time came without a confirmation (a daemon that stalls says
 * nothing): soon another holder may have the lock. */
static void ctl_check_deadline(struct ctl_run *r)
{
    double stop, left;

    if (r->lost || !ctl_stop_at(r, &stop) || ctl_now_ms() < stop)
        return;
    left = stop + r->stop_early - ctl_now_ms();
    snprintf(r->lost_reason, sizeof(r->lost_reason),
             "the daemon did not confirm the lease in time (its deadline %s "
             "%.0f ms %s)", left >= 0 ? "is" : "passed",
             left >= 0 ? left : -left, left >= 0 ? "away" : "ago");
    r->lost = 1;
}

/* The lease's own timers: its deadline, its refresh (or a reconnection).
 * A deadline passed while we were not looking (the keeper itself was
 * stopped) is not undone by a refresh: the command ran unconfirmed. */
static void ctl_lease_timers(struct ctl_run *r)
{
    double now = ctl_now_ms();

    ctl_check_deadline(r);
    if (!r->lost && (now >= r->next_refresh || redlockd_fd(r->h) < 0))
        ctl_refresh(r);
    ctl_check_deadline(r);
}

static void ctl_timers(struct ctl_run *r)
{
    keeper_timers(&r->g);
    ctl_lease_timers(r);
    ctl_notice_lost(r);
}

static int ctl_poll_timeout(const struct ctl_run *r)
{
    double now = ctl_now_ms(), next = -1, stop;

    if (!r->lost) {
        next = r->next_refresh;
        if (ctl_stop_at(r, &stop) && stop < next)
            next = stop;
    }
    /* Reconnecting: the library paces the attempts. */
    if (!r->lost && redlockd_fd(r->h) < 0
        && (next < 0 || now + CTL_RECONNECT_POLL_MS < next))
        next = now + CTL_RECONNECT_POLL_MS;
    /* SIGKILL due, processes of the group that are not our children. */
    return keeper_timeout(&r->g, next < 0 ? -1
                                 : next <= now ? 0 : (int)(next - now) + 1);
}

/* From the grant on: when to confirm the lease, and how early to give up
 * on it (see CTL_REFRESH_MAX_MS). */
static void ctl_follow(struct ctl_run *r, uint32_t ttl)
{
    r->refresh_every = ttl / 3.0;
    if (r->refresh_every > CTL_REFRESH_MAX_MS)
        r->refresh_every = CTL_REFRESH_MAX_MS;
    r->stop_early = ttl / 20.0;
    if (r->stop_early > CTL_STOP_EARLY_MAX_MS)
        r->stop_early = CTL_STOP_EARLY_MAX_MS;
    ctl_schedule_refresh(r, ctl_now_ms());
}

static void ctl_wait_child(struct ctl_run *r, uint32_t ttl)
{
    struct pollfd p[2];
    nfds_t n;

    ctl_follow(r, ttl);
    while (ctl_waiting(r)) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(r->h);
        p[1].events = POLLIN;
        n = r->lost ? 1 : 2;
        if (poll(p, n, ctl_poll_timeout(r)) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0)
            ctl_handle_signals(r);
        if (n == 2 && p[1].revents != 0)
            ctl_handle_daemon(r);
        ctl_timers(r);
    }
}

/* The work the lock guarded is over: its time, and how long the leases
 * were sure to be ours then (see struct ctl_run). */
static void ctl_work_ended(struct ctl_run *r)
{
    int64_t deadline;

    r->ended_ms = keeper_now_ms();
    r->covered_until = -1;
    for (size_t i = 0; i < r->c->nresources; i++) {
        if (redlockd_lease_deadline(r->h, r->c->resources[i], &deadline)
            != 0) {
            r->covered_until = -1;
            return;
        }
        if (r->covered_until < 0 || deadline < r->covered_until)
            r->covered_until = deadline;
    }
}

/* Release the lock, after ctl_work_ended; false when it turned out lost
 * before the work ended (said so, as having happened before `when`). A
 * loss found only after that (a release answered late, past the deadline
 * that still covered the work's end) cost the work nothing: said, not
 * counted. A release that fails otherwise is said, and left to the
 * daemon. */
static bool ctl_unlock(struct ctl_run *r, const char *when)
{
    int rc = ctl_kinds(r->c) ? ctl_unlockv(r->c, r->h)
                             : redlockd_unlock(r->h, r->resource);

    if (rc == -REDLOCKD_E_LOST && r->ended_ms < r->covered_until) {
        warnx("the lease on %s ran out before its release reached the "
              "daemon, but only after %s (%" PRId64 " ms before its "
              "deadline)", r->resource, when,
              r->covered_until - r->ended_ms);
        return true;
    }
    if (rc == -REDLOCKD_E_LOST) {
        warnx("the lease on %s was lost before %s", r->resource, when);
        return false;
    }
    if (rc < 0)
        warnx("could not release %s (the daemon releases it as the "
              "session ends%s): %s", r->resource,
              redlockd_fd(r->h) < 0 ? ", when its detach time runs out" : "",
              redlockd_last_error(r->h)->msg);
    return true;
}

/* After the command: release the lock and pick the exit status. */
static int ctl_finish(struct ctl_run *r)
{
    int lost = r->lost, status = keeper_exit_status(r->g.status);

    if (!lost) {
        ctl_work_ended(r);
        lost = !ctl_unlock(r, "the command ended");
    } else if (!r->lost_noticed) {
        warnx("lost the lock on %s as the command ended: %s", r->resource,
              r->lost_reason);
    }
    if (lost && r->c->kill_on_lost) {
        /* Anything the command left behind in its group goes too (after a
         * lease lost while it ran, what --kill-after left of it). */
        keeper_kill(&r->g, SIGKILL);
        return CTL_EXIT_LOST;
    }
    return status;
}

/* One LOCK, waiting up to wait_ms. */
static int ctl_take(const struct ctl_run *r, uint32_t wait_ms,
                    struct redlockd_lease *lease)
{
    const struct ctl *c = r->c;

    return ctl_kinds(c) ? ctl_lockv(c, r->h, wait_ms, lease)
                        : redlockd_lock(r->h, r->resource, c->ttl_ms, wait_ms,
                                        1, lease);
}

/* The daemons the handle may go to: -s, else $REDLOCKD_SERVER's list (as
 * the library reads them). */
static size_t ctl_nservers(const struct ctl *c)
{
    const char *env = getenv(REDLOCKD_SERVER_ENV);
    size_t n = 1;

    if (c->nservers > 0)
        return c->nservers;
    for (; env && *env != '\0'; env++)
        n += *env == ',';
    return n;
}

/*
 * A LOCK that its daemon could not answer for good, worth sending again
 * through the next daemon when there is one: refused because the daemon
 * is stopping (SHUTDOWN: the handle leaves it now rather than wait for it
 * to close the connection), or cut off by a broken connection (IO: its
 * outcome unknown; a grant that did happen stays with the old session,
 * which the resume releases or its daemon ends), once the handle is
 * connected again.
 */
static bool ctl_lock_again(const struct ctl_run *r, int rc)
{
    if (ctl_nservers(r->c) < 2)
        return false;
    if (rc == -REDLOCKD_E_SHUTDOWN)
        return redlockd_reconnect(r->h) == 0;
    return rc == -REDLOCKD_E_IO && redlockd_fd(r->h) >= 0;
}

/* ctl_take, sent again through the next daemon (ctl_lock_again) within
 * what is left of wait_ms: once that has run out, no more often than
 * there are daemons. */
static int ctl_take_failover(const struct ctl_run *r, uint32_t wait_ms,
                             struct redlockd_lease *lease)
{
    int64_t until = keeper_now_ms() + wait_ms, left = wait_ms;
    size_t late = 0;
    int rc;

    for (;;) {
        rc = ctl_take(r, left > 0 ? (uint32_t)left : 0, lease);
        if (rc == 0 || !ctl_lock_again(r, rc))
            return rc;
        left = until - keeper_now_ms();
        if (left <= 0 && ++late > ctl_nservers(r->c))
            return rc;
    }
}

/* elect without --wait: LOCKs waiting CTL_CAMPAIGN_ROUND_MS each until one
 * is granted. A LOCK cut off by a broken connection (its outcome unknown:
 * a grant that did happen is released by a resume, else with the old
 * session) is sent again once the handle is back. */
static int ctl_campaign(const struct ctl_run *r, struct redlockd_lease *lease)
{
    int rc;

    do {
        rc = ctl_take_failover(r, CTL_CAMPAIGN_ROUND_MS, lease);
    } while (rc == -REDLOCKD_E_TIMEOUT
             || (rc == -REDLOCKD_E_IO && redlockd_fd(r->h) >= 0));
    return rc;
}

static int ctl_lock_status(struct ctl_run *r, struct redlockd_lease *lease)
{
    const struct ctl *c = r->c;
    int rc;

    rc = c->campaign ? ctl_campaign(r, lease)
                     : ctl_take_failover(r, c->wait_ms, lease);
    if (rc == 0)
        return 0;
    r->not_taken = true;
    if (rc == -REDLOCKD_E_BUSY || rc == -REDLOCKD_E_TIMEOUT) {
        if (!c->quiet && rc == -REDLOCKD_E_BUSY)
            warnx("%s is locked by someone else", r->resource);
        else if (!c->quiet)
            warnx("%s is still locked after waiting %" PRIu32 " ms",
                  r->resource, c->wait_ms);
        return c->conflict_exit;
    }
    return ctl_report("lock", rc, redlockd_last_error(r->h)->msg);
}

/* Take the lock: true when taken, else false with the exit status in
 * *status (the conflict status may be 0 with -E 0, so it cannot double as
 * the "taken" signal). */
static bool ctl_lock(struct ctl_run *r, struct redlockd_lease *lease,
                     int *status)
{
    *status = ctl_lock_status(r, lease);
    return !r->not_taken;
}

/* The visible redlockctl, once the keeper runs: its exit status is ours
 * (the command's, or 70...), so that shells and scripts see what they
 * would without a keeper. A keeper killed by a signal (an operator's
 * SIGKILL, the OOM killer) leaves the command to the connection it
 * inherited, which keeps the lock while some process holds it. */
static int ctl_relay(pid_t keeper)
{
    int st = keeper_relay(keeper);

    if (WIFSIGNALED(st)) {
        warnx("the keeper (pid %ld) that held the lock was killed by signal "
              "%d (%s); the command's processes that inherited the lock "
              "connection keep the lock while they run, and --detach after",
              (long)keeper, WTERMSIG(st), strsignal(WTERMSIG(st)));
    }
    return keeper_exit_status(st);
}

/* HELLO detach= for run (see CTL_DETACH_MIN_MS); negative: off. */
static int ctl_detach(const struct ctl *c)
{
    uint32_t ttl = c->ttl_ms ? c->ttl_ms : CTL_DETACH_MIN_MS;

    if (c->detach_set)
        return c->detach_ms == 0 ? -1
             : c->detach_ms > INT32_MAX ? INT32_MAX : (int)c->detach_ms;
    if (ttl < CTL_DETACH_MIN_MS)
        return CTL_DETACH_MIN_MS;
    return ttl > CTL_DETACH_MAX_MS ? CTL_DETACH_MAX_MS : (int)ttl;
}

/*
 * The resources of run, elect (both take COMMAND) and lock: RESOURCE, or
 * those -r gave, all in c->resources; the first into *first. -1 after a
 * usage error (said).
 */
static int ctl_resources(struct ctl *c, const char *cmd,
                         const struct ctl_args *a, bool takes_cmd,
                         const char **first)
{
    if (a->nwords == 0 && c->nresources == 0) {
        warnx(a->dashdash ? "%s: missing RESOURCE before -- (try --help)"
              : a->cmd || !takes_cmd ? "%s: missing RESOURCE (try --help)"
              : "%s: missing RESOURCE and COMMAND (try --help)", cmd);
        return -1;
    }
    if (a->nwords > 0 && c->nresources > 0) {
        warnx("%s: give the resources either as RESOURCE or with -r, "
              "not both (\"%s\")", cmd, a->words[0]);
        return -1;
    }
    /* (run and elect take the word after RESOURCE for COMMAND) */
    if (a->nwords > 1) {
        warnx("%s: expected one RESOURCE, got %d words (\"%s\" ...)", cmd,
              a->nwords, a->words[0]);
        return -1;
    }
    if (takes_cmd && !a->cmd) {
        warnx("%s: missing COMMAND after %s (try --help)", cmd,
              c->nresources > 0 ? "the resources" : "RESOURCE");
        return -1;
    }
    if (c->nresources == 0)
        c->resources[c->nresources++] = a->words[0];
    *first = c->resources[0];
    return 0;
}

/*
 * How run, elect (cmd; both take COMMAND) and lock (cmd "lock") start:
 * their resources (ctl_resources), a handle connected with o, the lock.
 * True when taken, else false with the exit status in *status and no
 * handle left open (as ctl_lock).
 */
static bool ctl_begin(struct ctl_run *r, const char *cmd,
                      const struct ctl_args *a, bool takes_cmd,
                      struct redlockd_opts *o, struct redlockd_lease *lease,
                      int *status)
{
    if (ctl_resources(r->c, cmd, a, takes_cmd, &r->resource) < 0) {
        *status = EX_USAGE;
        return false;
    }
    *status = ctl_connect(r->c, o, &r->h);
    if (*status != 0)
        return false;
    if (!ctl_lock(r, lease, status)) {
        redlockd_close(r->h);
        return false;
    }
    return true;
}

/* run and elect (cmd). a: RESOURCE (unless -r gave the resources), then
 * COMMAND [ARGS...]. */
int ctl_run(struct ctl *c, const char *cmd, const struct ctl_args *a)
{
    struct ctl_run r = { .c = c, .conn = -1 };
    /* No keepalive: the command keeps the connection after us (see
     * CTL_REFRESH_MAX_MS). */
    struct redlockd_opts o = { .on_lost = ctl_on_lost, .ud = &r,
                               .detach_ms = ctl_detach(c) };
    struct redlockd_lease lease;
    int rc;

    if (!ctl_begin(&r, cmd, a, true, &o, &lease, &rc))
        return rc;
    if (r.lost) {
        warnx("lost the lock on %s right after taking it: %s", r.resource,
              r.lost_reason);
        rc = CTL_EXIT_LOST;
    }
    if (rc == 0) {
        /* From here on the keeper holds the lock; we only relay signals to
         * it and report how it ended (see "run: the keeper" above). */
        pid_t keeper = keeper_fork(true);

        if (keeper > 0) {
            redlockd_forget(r.h);
            return ctl_relay(keeper);
        }
        if (keeper < 0) {
            warn("fork");
            rc = EX_OSERR;
        }
    }
    if (rc == 0 && ctl_spawn(&r, &lease, a->cmd) < 0)
        rc = EX_OSERR;
    if (rc == 0) {
        ctl_wait_child(&r, lease.ttl);
        rc = ctl_finish(&r);
    }
    redlockd_close(r.h);
    /* The command's processes still holding the connection (the lock was
     * released, or lost) keep no session open. */
    if (r.conn >= 0) {
        (void)shutdown(r.conn, SHUT_RDWR);
        close(r.conn);
    }
    return rc;
}

/* ---- lock: a lock held until told to let go ----------------------------- */

/* What lock prints once it holds the lock, flushed for a pipe. */
static void ctl_print_grant(const struct ctl *c,
                            const struct redlockd_lease *l)
{
    json_t *o;
    char *text;

    if (!c->json) {
        printf("resource=%s fence=%" PRIu64 " token=%s\n", l->resource,
               l->fence, l->token);
    } else {
        o = json_pack("{s:s, s:I, s:s}", "resource", l->resource, "fence",
                      (json_int_t)l->fence, "token", l->token);
        text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!text)
            errx(EX_OSERR, "out of memory");
        printf("%s\n", text);
        free(text);
        json_decref(o);
    }
    fflush(stdout);
}

/* Follow the lease as the keeper does (events, refreshes, reconnection)
 * until a signal says stop or the lease is lost. */
static void ctl_hold_wait(struct ctl_run *r, uint32_t ttl)
{
    struct pollfd p[2];
    bool stop = false;

    ctl_follow(r, ttl);
    while (!stop && !r->lost) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(r->h);        /* -1: poll() skips it */
        p[1].events = POLLIN;
        if (poll(p, 2, ctl_poll_timeout(r)) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0)
            stop = ctl_told_to_stop();
        if (p[1].revents != 0)
            (void)redlockd_poll_events(r->h, 0);
        ctl_lease_timers(r);
    }
}

/* lock: RESOURCE (or -r's), no command. Signals are caught from the grant
 * on; before it, they end us as they would any program, and the daemon
 * drops a waiting LOCK with its connection. */
int ctl_hold(struct ctl *c, const struct ctl_args *a)
{
    struct ctl_run r = { .c = c, .conn = -1 };
    struct redlockd_opts o = { .on_lost = ctl_on_lost, .ud = &r,
                               .detach_ms = ctl_detach(c) };
    const struct redlockd_error *e;
    struct redlockd_lease lease;
    int rc;

    if (!ctl_begin(&r, "lock", a, false, &o, &lease, &rc))
        return rc;
    if (keeper_catch_signals() < 0)
        err(EX_OSERR, "pipe");
    ctl_print_grant(c, &lease);
    ctl_hold_wait(&r, lease.ttl);
    e = redlockd_last_error(r.h);
    if (r.lost) {
        warnx("lost the lock on %s: %s%s%s", r.resource, r.lost_reason,
              e->code ? ": " : "", e->msg);
        rc = CTL_EXIT_LOST;
    } else {
        ctl_work_ended(&r);
        rc = ctl_unlock(&r, "the signal to let it go") ? 0 : CTL_EXIT_LOST;
    }
    redlockd_close(r.h);
    return rc;
}

/* ---- elect -------------------------------------------------------------- */

/* elect: run with a value, waiting as long as it takes unless --wait. */
int ctl_elect(struct ctl *c, const struct ctl_args *a)
{
    if (!c->value) {
        warnx("elect: missing --value TEXT (what leader and watch show of "
              "the leader; try --help)");
        return EX_USAGE;
    }
    c->campaign = !c->wait_set;
    return ctl_run(c, "elect", a);
}
