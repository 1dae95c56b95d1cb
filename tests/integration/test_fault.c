/*
 * test_fault: redlockd's leases when Redis nodes or clients misbehave
 * (suite "fault"), with the real binary and three real redis-server nodes.
 *
 *   - two of three nodes stopped (SIGSTOP) under a held lock: EVENT LOST
 *     before the lease's validity has run out, ERR UNAVAILABLE for new
 *     locks, and the resource free again once the nodes continue;
 *   - fences: 500 acquisitions from two daemons while one node (appendonly,
 *     appendfsync always) is killed and restarted come out strictly
 *     increasing in grant order;
 *   - a node killed and restarted empty (no persistence) while a lock is
 *     held: it does not vote until max_ttl has passed (STATS), no second
 *     holder is granted while the first still holds the lock, also when
 *     the restarted node's vote would have made the difference, and the
 *     node votes again afterwards;
 *   - a client process frozen with SIGSTOP while holding a lock with
 *     HELLO keepalive: its lock is released after the keepalive, and once
 *     it continues it learns of the loss (EOF, EVENT LOST or ERR LOST),
 *     never a silent OK.
 *
 * Timing bounds are generous (shared CI machines are noisy) and stretched
 * when the daemon runs under REDLOCKD_TEST_WRAPPER (valgrind).
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NNODES 3

/* Its nodes, daemons 0 and 1 and the clients (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static pid_t child_pid;

/* ---- helpers ----------------------------------------------------------- */

/* An upper time bound for an assertion: valgrind slows the daemon down a
 * lot, so bounds on how soon it reacts are relaxed then. Lower bounds
 * (how long it must wait) are never stretched. */
static long long T(long long ms)
{
    return h_slow() ? ms * 3 : ms;
}

/* Runs after a test that passed, before the cluster's cleanup (check runs
 * teardowns in reverse order). A failed one exits at once (check's fork
 * mode); the harness's guardians and PDEATHSIG clean up then, and print
 * the daemon log. */
static void teardown(void)
{
    if (child_pid > 0) {
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, 0);
        child_pid = 0;
    }
}

/* ---- two of three nodes stopped ---------------------------------------- */

START_TEST(two_nodes_paused)
{
    const char *res = "fault:pause";
    struct h_client *a, *b;
    char fence[32];
    char *line;
    json_t *o, *l;
    long long validity = 0, lost_after, since_locks;
    uint64_t t_locks, t_pause, t0;
    bool ok = false;
    int busy = 0;

    h_cluster_start(&K, NNODES, 1, "{\"redis\":{\"command_timeout_ms\":100,"
                                   "\"reconnect_max_ms\":200}}", T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    line = h_expect(a, "OK resource=fault:pause ", "LOCK %s ttl=2000", res);
    h_kv_copy(line, "fence", fence, sizeof(fence));
    /* Pause after a renewal, so its validity is what is being tested. */
    t0 = h_now_ms();
    for (;;) {
        o = h_ok_json(a, "LOCKS");
        l = json_array_get(json_object_get(o, "locks"), 0);
        ck_assert_msg(json_is_object(l), "LOCKS lost the lock");
        if (h_json_int(l, "renewals") >= 1) {
            validity = h_json_int(l, "validity");
            json_decref(o);
            break;
        }
        json_decref(o);
        ck_assert_msg(h_since(t0) < T(3000), "no renewal of a ttl=2000 lease in 3 s");
        h_sleep_ms(20);
    }
    t_locks = h_now_ms();
    h_redis_pause(&N[1]);
    h_redis_pause(&N[2]);
    t_pause = h_now_ms();

    line = h_expect_event(a, "EVENT LOST resource=fault:pause ", 5000);
    lost_after = h_since(t_pause);
    since_locks = h_since(t_locks);
    ck_assert_msg(line, "no EVENT LOST with two of three nodes stopped");
    fprintf(stderr, "two nodes paused: EVENT LOST %lld ms after the pause "
            "(validity was %lld ms)\n", lost_after, validity);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    ck_assert_msg(strcmp(h_kv(line, "reason"), "quorum") == 0 ||
                  strcmp(h_kv(line, "reason"), "node") == 0, "%s", line);
    /* The lease may not be reported past its validity. */
    ck_assert_msg(lost_after <= 2000 + T(500),
                  "EVENT LOST %lld ms after the pause, ttl is 2000", lost_after);
    ck_assert_msg(since_locks <= validity + T(500),
                  "EVENT LOST %lld ms after LOCKS showed %lld ms of validity",
                  since_locks, validity);
    h_expect(a, "ERR LOST ", "UNLOCK %s", res);
    /* With a quorum unreachable, nobody can be granted it: UNAVAILABLE.
     * Right after the loss the daemon may still say BUSY while its own
     * release of the lost keys is in flight (to the stopped nodes); that
     * is tolerated for a moment, not for good. */
    t0 = h_now_ms();
    for (;;) {
        line = h_cmd(b, "LOCK %s", res);
        if (h_starts(line, "ERR UNAVAILABLE "))
            break;
        ck_assert_msg(h_starts(line, "ERR BUSY ") && h_since(t0) < T(1500),
                      "LOCK %lld ms after EVENT LOST, with two of three nodes "
                      "stopped, answered \"%s\", want ERR UNAVAILABLE",
                      h_since(t0), line);
        busy++;
        h_sleep_ms(50);
    }
    fprintf(stderr, "two nodes paused: ERR UNAVAILABLE %lld ms after EVENT LOST "
            "(%d BUSY answers before)\n", h_since(t0), busy);

    h_redis_resume(&N[1]);
    h_redis_resume(&N[2]);
    t0 = h_now_ms();
    while (!ok && h_since(t0) < T(5000)) {
        line = h_cmd(b, "LOCK %s", res);
        ok = h_starts(line, "OK resource=fault:pause ");
        ck_assert_msg(ok || h_starts(line, "ERR UNAVAILABLE ") ||
                      h_starts(line, "ERR BUSY "), "LOCK answered %s", line);
        if (!ok)
            h_sleep_ms(200);
    }
    ck_assert_msg(ok, "resource not free %lld ms after the nodes continued",
                  h_since(t0));
    fprintf(stderr, "two nodes paused: LOCK OK %lld ms after SIGCONT\n", h_since(t0));
    h_cluster_stop(&K);
}
END_TEST

/* ---- a LOCK at start-up ------------------------------------------------ */

/* A daemon listens before its nodes are checked (systemd socket activation
 * hands it the first client at once). A LOCK that comes then waits for a
 * quorum to vote, up to redis.connect_timeout_ms, and is not failed
 * UNAVAILABLE for nodes that are merely not checked yet. */
START_TEST(lock_at_start_waits_for_quorum)
{
    struct h_client *a, *b;
    char *line;
    uint64_t t0;

    h_cluster_nodes(&K, NNODES, NULL);
    h_redis_pause(&N[1]);
    h_redis_pause(&N[2]);
    h_cluster_daemon_start(&K, 0, "{\"redis\":{\"command_timeout_ms\":100,"
                           "\"connect_timeout_ms\":20000,\"reconnect_max_ms\":200}}");
    h_cluster_daemon_start(&K, 1, "{\"redis\":{\"command_timeout_ms\":100,"
                           "\"connect_timeout_ms\":300,\"reconnect_max_ms\":200}}");
    t0 = h_now_ms();
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 1);
    h_sendf(a, "LOCK fault:start ttl=5000\n");
    h_sendf(b, "LOCK fault:start2 ttl=5000\n");

    /* D2's start-up ends at its connect timeout without a quorum. */
    line = h_recv_line(b, (int)T(5000));
    ck_assert_msg(line && h_starts(line, "ERR UNAVAILABLE "),
                  "LOCK on a daemon that started without a quorum: %s",
                  line ? line : "(nothing)");
    ck_assert_msg(h_since(t0) >= 250, "ERR UNAVAILABLE after %lld ms, before "
                  "connect_timeout_ms=300", h_since(t0));

    /* D1 still waits: nothing, and certainly no UNAVAILABLE, meanwhile. */
    line = h_recv_line(a, 500);
    ck_assert_msg(!line, "LOCK during start-up answered \"%s\" before a "
                  "quorum could vote", line);
    h_redis_resume(&N[1]);
    h_redis_resume(&N[2]);
    t0 = h_now_ms();
    line = h_recv_line(a, (int)T(5000));
    ck_assert_msg(line && h_starts(line, "OK resource=fault:start "),
                  "LOCK held back at start-up answered %s once the nodes "
                  "continued", line ? line : "(nothing in 5 s)");
    fprintf(stderr, "start-up: LOCK OK %lld ms after SIGCONT\n", h_since(t0));
    h_expect(a, "OK resource=fault:start ", "UNLOCK fault:start");
    h_cluster_stop(&K);
}
END_TEST

/* ---- fences across a node crash ---------------------------------------- */

/* Wait until both daemons (STATS on mon[0], mon[1]) show node 0 voting
 * or not, after at least `restarts` restarts seen. */
static void wait_node0(struct h_client **mon, bool voting, long long restarts)
{
    for (int d = 0; d < 2; d++) {
        uint64_t t0 = h_now_ms();
        struct h_node_view v;

        while ((v = h_stats_node(mon[d], 0)).voting != voting || v.restarts < restarts) {
            ck_assert_msg(h_since(t0) < T(10000), "daemon %d: node 0 voting=%d "
                          "restarts=%lld after 10 s, want voting=%d restarts>=%lld",
                          d + 1, (int)v.voting, v.restarts, (int)voting, restarts);
            h_sleep_ms(20);
        }
    }
}

#define FENCE_GOAL 500
#define FENCE_MAX (FENCE_GOAL + 16)

enum { F_LOCKING, F_UNLOCKING, F_DONE };

START_TEST(fences_across_node_crash)
{
    const char *res = "fault:fence";
    const char *conf = "{\"redis\":{\"reconnect_max_ms\":300}}";
    static unsigned long long fences[FENCE_MAX];
    struct h_client *cs[4];
    struct h_client *mon[2];
    int state[4];
    int nf = 0, timeouts = 0, unavailable = 0, done = 0;
    bool killed = false, restarted = false;
    uint64_t t0;

    /* Node 0 persists every write before acknowledging it, from the start,
     * so its fence counter survives the kill. */
    h_cluster_nodes_first(&K, NNODES, "--appendonly yes --appendfsync always");
    h_cluster_daemon(&K, 0, conf, T(5000));
    h_cluster_daemon(&K, 1, conf, T(5000));
    mon[0] = h_cluster_client(&K, 4, 0);
    mon[1] = h_cluster_client(&K, 5, 1);
    /* Two sessions per daemon, each looping LOCK wait= / UNLOCK. */
    for (int i = 0; i < 4; i++) {
        cs[i] = h_cluster_client(&K, i, i < 2 ? 0 : 1);
        h_sendf(cs[i], "LOCK %s wait=2000\n", res);
        state[i] = F_LOCKING;
    }
    t0 = h_now_ms();
    while (done < 4) {
        char *line = NULL;
        int i = h_wait_any_line(cs, 4, T(10000), &line);

        ck_assert_msg(i >= 0, "no progress for 10 s after %d acquisitions", nf);
        ck_assert_msg(h_since(t0) < T(60000), "only %d acquisitions in 60 s", nf);
        ck_assert_msg(!h_starts(line, "EVENT "), "session %d: %s", i, line);
        if (state[i] == F_LOCKING) {
            if (h_starts(line, "OK resource=fault:fence ")) {
                /* The lock is exclusive and its next grant needs the
                 * UNLOCK sent below: receive order is grant order. */
                ck_assert_int_lt(nf, FENCE_MAX);
                fences[nf++] = strtoull(h_kv(line, "fence"), NULL, 10);
                /* Phases: all nodes; node 0 dead; node 0 back, voting
                 * again on both daemons. Waits meanwhile may time out. */
                if (nf == FENCE_GOAL * 3 / 10 && !killed) {
                    h_redis_kill(&N[0]);
                    wait_node0(mon, false, 0);
                    killed = true;
                }
                if (nf == FENCE_GOAL * 6 / 10 && !restarted) {
                    h_redis_restart(&N[0]);
                    wait_node0(mon, true, 1);
                    restarted = true;
                }
                h_sendf(cs[i], "UNLOCK %s\n", res);
                state[i] = F_UNLOCKING;
                continue;
            }
            /* Losing a wait race to the other daemon is fine; retry. */
            if (h_starts(line, "ERR TIMEOUT "))
                timeouts++;
            else if (h_starts(line, "ERR UNAVAILABLE "))
                unavailable++;
            else
                ck_abort_msg("session %d: LOCK answered %s", i, line);
        } else {
            ck_assert_msg(h_starts(line, "OK resource=fault:fence "),
                          "session %d: UNLOCK answered %s", i, line);
        }
        if (nf >= FENCE_GOAL) {
            state[i] = F_DONE;
            done++;
        } else {
            h_sendf(cs[i], "LOCK %s wait=2000\n", res);
            state[i] = F_LOCKING;
        }
    }
    fprintf(stderr, "fences: %d acquisitions in %lld ms, fence %llu..%llu, "
            "%d timeouts, %d unavailable; node 0 killed after %d, restarted "
            "after %d\n", nf, h_since(t0), fences[0], fences[nf - 1], timeouts,
            unavailable, FENCE_GOAL * 3 / 10, FENCE_GOAL * 6 / 10);
    ck_assert_int_ge(nf, FENCE_GOAL);
    ck_assert_msg(fences[0] > 0, "first fence is 0");
    for (int i = 1; i < nf; i++)
        ck_assert_msg(fences[i] > fences[i - 1],
                      "fence not increasing at acquisition %d: %llu after %llu",
                      i, fences[i], fences[i - 1]);

    h_cluster_stop(&K);
}
END_TEST

/* ---- a node restarted without persistence ------------------------------ */

/* max_ttl_ms 3000: a restarted node without appendfsync always is kept
 * from voting for 3000 ms + drift. */
static const char *restart_conf =
    "{\"locks\":{\"max_ttl_ms\":3000,\"default_ttl_ms\":2000},"
    "\"redis\":{\"reconnect_max_ms\":200}}";

START_TEST(node_restart_empty_keeps_holder)
{
    const char *res = "fault:rs";
    struct h_client *a, *b, *s1, *s2;
    struct h_client *mons[2];
    long long seen_recovering[2] = { -1, -1 }, voting_again[2] = { -1, -1 };
    int busy = 0;
    uint64_t t_r;

    h_cluster_start(&K, NNODES, 2, restart_conf, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 1);     /* on the other daemon: its answer comes from Redis */
    s1 = h_cluster_client(&K, 2, 0);
    s2 = h_cluster_client(&K, 3, 1);
    mons[0] = s1;
    mons[1] = s2;
    h_expect(a, "OK resource=fault:rs ", "LOCK %s ttl=2000", res);
    h_expect(b, "ERR BUSY ", "LOCK %s", res);

    h_redis_kill(&N[0]);
    h_redis_restart(&N[0]);
    t_r = h_now_ms();
    ck_assert_msg(h_redis_cmd(&N[0], NULL, "EXISTS lock:%s", res) == 0,
                  "node 0 kept its keys over a restart without persistence");

    /* Until node 0 votes again on both daemons, and a little beyond. */
    while (voting_again[0] < 0 || voting_again[1] < 0 ||
           h_since(t_r) < voting_again[0] + 500) {
        char *line = h_cmd(b, "LOCK %s", res);

        ck_assert_msg(h_starts(line, "ERR BUSY "), "%lld ms after node 0 restarted, "
                      "another daemon's LOCK answered \"%s\" while the lock is held",
                      h_since(t_r), line);
        busy++;
        ck_assert_msg(!h_expect_event(a, "EVENT LOST", 1),
                      "the holder lost its lock: %s", a->line);
        for (int d = 0; d < 2; d++) {
            struct h_node_view v = h_stats_node(mons[d], 0);

            if (!v.voting && v.recovering && seen_recovering[d] < 0)
                seen_recovering[d] = h_since(t_r);
            if (v.voting && seen_recovering[d] >= 0 && voting_again[d] < 0)
                voting_again[d] = h_since(t_r);
        }
        ck_assert_msg(h_since(t_r) < 3032 + T(3000),
                      "node 0 not voting again %lld ms after its restart "
                      "(recovering seen at %lld/%lld ms)", h_since(t_r),
                      seen_recovering[0], seen_recovering[1]);
        h_sleep_ms(150);
    }
    fprintf(stderr, "node restart: recovering seen at %lld/%lld ms, voting "
            "again at %lld/%lld ms, %d BUSY answers meanwhile\n",
            seen_recovering[0], seen_recovering[1], voting_again[0],
            voting_again[1], busy);
    for (int d = 0; d < 2; d++) {
        ck_assert_msg(seen_recovering[d] >= 0 && seen_recovering[d] < T(1500),
                      "daemon %d: node 0 not shown recovering soon after its "
                      "restart (%lld)", d + 1, seen_recovering[d]);
        /* Not voting for max_ttl_ms (3000) + drift since the restart. */
        ck_assert_msg(voting_again[d] >= 2700,
                      "daemon %d: node 0 voting again %lld ms after its restart",
                      d + 1, voting_again[d]);
        ck_assert_int_ge(h_stats_node(mons[d], 0).restarts, 1);
    }
    /* The first holder held it throughout, and still does. */
    h_expect(a, "OK resource=fault:rs ", "UNLOCK %s", res);
    h_expect(b, "OK resource=fault:rs ", "LOCK %s", res);
    h_cluster_stop(&K);
}
END_TEST

/*
 * The case the delayed restart exists for: the holder's key is on nodes 0
 * and 1 only (node 2 missed the write; the test deletes it there), and
 * node 0 comes back empty. Had it voted at once, nodes 0 and 2 would grant
 * a second holder while the first still held a valid lease.
 */
START_TEST(node_restart_empty_no_overlap)
{
    const char *res = "fault:mw";
    struct h_client *a, *b;
    char fence_a[32];
    char *line;
    uint64_t t_r;
    long long granted = -1;
    int refused = 0;

    h_cluster_start(&K, NNODES, 2, restart_conf, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 1);
    line = h_expect(a, "OK resource=fault:mw ", "LOCK %s ttl=2000", res);
    h_kv_copy(line, "fence", fence_a, sizeof(fence_a));
    ck_assert_int_eq(h_redis_cmd(&N[2], NULL, "DEL lock:%s", res), 1);

    h_redis_kill(&N[0]);
    h_redis_restart(&N[0]);
    t_r = h_now_ms();
    while (granted < 0) {
        line = h_cmd(b, "LOCK %s ttl=2000", res);
        if (h_starts(line, "OK resource=fault:mw ")) {
            granted = h_since(t_r);
            break;
        }
        ck_assert_msg(h_starts(line, "ERR BUSY ") || h_starts(line, "ERR UNAVAILABLE "),
                      "LOCK answered %s", line);
        refused++;
        ck_assert_msg(h_since(t_r) < T(10000),
                      "no second holder 10 s after the restart");
        h_sleep_ms(100);
    }
    /* The first lease cannot be renewed on a quorum (node 0 does not vote
     * yet, node 2 lacks the key), so it must have been lost first. */
    ck_assert_msg(h_starts(line, "OK resource=fault:mw "), "%s", line);
    ck_assert_msg(strtoull(h_kv(line, "fence"), NULL, 10) > strtoull(fence_a, NULL, 10),
                  "second holder's fence %s is not above the first's %s",
                  h_kv(line, "fence"), fence_a);
    line = h_expect_event(a, "EVENT LOST resource=fault:mw ", 200);
    fprintf(stderr, "node restart, missed write: second holder granted %lld ms "
            "after the restart (%d refusals before)\n", granted, refused);
    ck_assert_msg(line, "a second holder was granted %s %lld ms after "
                  "node 0 restarted, while the first had not been told it lost it",
                  res, granted);
    h_expect(a, "ERR LOST ", "UNLOCK %s", res);
    h_cluster_stop(&K);
}
END_TEST

/* ---- a client frozen with SIGSTOP -------------------------------------- */

static void report(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(int fd, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n > (int)sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    if (write(fd, buf, (size_t)n) < 0)
        _exit(2);
}

/*
 * The client that gets frozen, in its own process. It talks plain lines
 * and reports every line it reads to the parent through `rep`. It PINGs
 * every 100 ms, as a live client with keepalive does, until the parent
 * writes to `go` (after it was stopped and continued); then it sends
 * UNLOCK and reports what comes back. Never returns.
 */
static void frozen_client(int port, int rep, int go)
{
    static struct h_client c;
    char *line;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (h_connect_tcp(&c, port) != 0) {
        report(rep, "CONNECT failed");
        _exit(1);
    }
    h_sendf(&c, "HELLO keepalive=500\n");
    line = h_recv_line(&c, 3000);
    report(rep, "HELLO %s", line ? line : "EOF");
    h_sendf(&c, "LOCK fault:stop\n");
    line = h_recv_line(&c, 3000);
    report(rep, "LOCK %s", line ? line : "EOF");
    for (;;) {
        struct pollfd p = { .fd = go, .events = POLLIN };

        if (poll(&p, 1, 100) > 0)
            break;
        h_sendf(&c, "PING\n");
        line = h_recv_line(&c, 2000);
        if (!line) {
            report(rep, "PING %s", h_wait_eof(&c, 1) ? "EOF" : "TIMEOUT");
            report(rep, "END");
            _exit(0);
        }
        if (strcmp(line, "PONG") != 0)
            report(rep, "PING %s", line);
    }
    h_sendf(&c, "UNLOCK fault:stop\n");
    while ((line = h_recv_line(&c, 3000))) {
        report(rep, "UNLOCK %s", line);
        if (!h_starts(line, "EVENT "))
            break;
    }
    if (!line)
        report(rep, "UNLOCK %s", h_wait_eof(&c, 1) ? "EOF" : "TIMEOUT");
    report(rep, "END");
    _exit(0);
}

/* One report line from the frozen client, or NULL after timeout_ms. */
static char *read_report(int fd, char *buf, size_t size, long long timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    size_t len = 0;

    while (len + 1 < size) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        uint64_t now = h_now_ms();
        ssize_t n;

        if (now >= end || poll(&p, 1, (int)(end - now)) <= 0)
            return NULL;
        n = read(fd, buf + len, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        if (buf[len] == '\n') {
            buf[len] = '\0';
            return buf;
        }
        len++;
    }
    buf[len] = '\0';
    return buf;
}

START_TEST(client_sigstop)
{
    const char *res = "fault:stop";
    int rep[2], go[2], status;
    char buf[1200], outcome[4096] = "";
    struct h_client *b;
    char *r;
    uint64_t t_s;
    long long took = -1;
    bool told = false, silent_ok = false;

    h_cluster_start(&K, NNODES, 1, NULL, T(5000));
    /* Fork before the parent opens any client socket, so the child holds
     * no copy of one (the daemon would not see that socket close). */
    ck_assert_int_eq(pipe(rep), 0);
    ck_assert_int_eq(pipe(go), 0);
    child_pid = fork();
    ck_assert_msg(child_pid >= 0, "fork: %s", strerror(errno));
    if (child_pid == 0) {
        close(rep[0]);
        close(go[1]);
        frozen_client(K.daemons[0].port, rep[1], go[0]);
    }
    close(rep[1]);
    close(go[0]);

    r = read_report(rep[0], buf, sizeof(buf), T(5000));
    ck_assert_msg(h_starts(r, "HELLO OK proto=1 "), "child: %s", r ? r : "nothing");
    r = read_report(rep[0], buf, sizeof(buf), T(5000));
    ck_assert_msg(h_starts(r, "LOCK OK resource=fault:stop "), "child: %s",
                  r ? r : "nothing");
    b = h_cluster_client(&K, 0, 0);
    /* Alive and PINGing, the child keeps its lock past the keepalive. */
    h_sleep_ms(800);
    h_expect(b, "ERR BUSY ", "LOCK %s", res);

    ck_assert_int_eq(kill(child_pid, SIGSTOP), 0);
    ck_assert_int_eq(waitpid(child_pid, &status, WUNTRACED), child_pid);
    ck_assert(WIFSTOPPED(status));
    t_s = h_now_ms();
    while (took < 0 && h_since(t_s) < T(3000)) {
        char *line = h_cmd(b, "LOCK %s", res);

        if (h_starts(line, "OK resource=fault:stop "))
            took = h_since(t_s);
        else
            ck_assert_msg(h_starts(line, "ERR BUSY "), "LOCK answered %s", line);
        h_sleep_ms(20);
    }
    fprintf(stderr, "client SIGSTOP with keepalive=500: lock free %lld ms after "
            "the stop\n", took);
    ck_assert_msg(took >= 0 && took <= T(1500),
                  "lock of the stopped client not free after %lld ms", took);
    /* Its last PING was at most ~100 ms before the stop. */
    ck_assert_msg(took >= 250, "lock freed %lld ms after the stop, keepalive is 500",
                  took);

    ck_assert_int_eq(write(go[1], "g", 1), 1);
    ck_assert_int_eq(kill(child_pid, SIGCONT), 0);
    while ((r = read_report(rep[0], buf, sizeof(buf), T(8000))) &&
           strcmp(r, "END") != 0) {
        snprintf(outcome + strlen(outcome), sizeof(outcome) - strlen(outcome),
                 "[%s] ", r);
        if (h_starts(r, "UNLOCK OK"))
            silent_ok = true;
        if (strcmp(r, "PING EOF") == 0 || strcmp(r, "UNLOCK EOF") == 0 ||
            strstr(r, "EVENT LOST resource=fault:stop ") ||
            h_starts(r, "UNLOCK ERR LOST "))
            told = true;
    }
    fprintf(stderr, "client SIGSTOP: after SIGCONT the child saw %s\n", outcome);
    ck_assert_msg(r, "child did not finish; it saw %s", outcome);
    ck_assert_msg(!silent_ok, "the resumed client's UNLOCK was answered OK: %s", outcome);
    ck_assert_msg(told, "the resumed client was not told it lost the lock: %s", outcome);
    ck_assert_int_eq(waitpid(child_pid, &status, 0), child_pid);
    child_pid = 0;
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child exit status %d", status);
    close(rep[0]);
    close(go[1]);
    h_cluster_stop(&K);
}
END_TEST

static Suite *fault_suite(void)
{
    Suite *s = suite_create("fault");
    TCase *tc = tcase_create("fault");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, h_slow() ? 300 : 90);
    tcase_add_test(tc, two_nodes_paused);
    tcase_add_test(tc, lock_at_start_waits_for_quorum);
    tcase_add_test(tc, fences_across_node_crash);
    tcase_add_test(tc, node_restart_empty_keeps_holder);
    tcase_add_test(tc, node_restart_empty_no_overlap);
    tcase_add_test(tc, client_sigstop);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(fault_suite());
}
