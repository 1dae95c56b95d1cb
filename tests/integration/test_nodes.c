/*
 * test_nodes: what redlockd makes of its Redis nodes' histories (suite
 * "fault"), with the real binary and three real redis-server nodes.
 *
 *   - a daemon started after two nodes restarted empty does not grant a
 *     lock another client still holds on the surviving node of a quorum:
 *     the data loss is read from the nodes (no recovery marker), not from
 *     the memory of a daemon that saw the old run;
 *   - two of three nodes restarted empty recover on their own (no quorum of
 *     voting nodes to read the fence counter from): STATS says why and
 *     until when meanwhile, and fences keep growing, on a second daemon
 *     too;
 *   - two of three nodes frozen (SIGSTOP) with no client traffic: /healthz
 *     answers 503 within probe_interval_ms + command_timeout_ms (+ slack),
 *     with the reason in a header, and STATS shows them down;
 *   - a node restarted, or flushed, while nobody locks is seen by the
 *     probes;
 *   - a restarted node that refuses CONFIG makes no appendfsync promise,
 *     whatever its previous instance made;
 *   - a waiting LOCK against a lock held on a bare quorum (plain SET NX by
 *     the test) makes few Redis calls: undoing a partial acquisition does
 *     not announce a release the daemon would wake on;
 *   - ending a recovery deliberately (SIGUSR1, the hook until the admin
 *     command exists) repairs the node and lets it vote;
 *   - start-up warnings: nodes without appendfsync always under a long
 *     max_ttl_ms, and an eviction policy that can drop lock keys;
 *   - a node flushed between two probes fails its next vote (the scripts
 *     check the recovery marker) and starts recovering on that answer;
 *   - the restart wait covers the longest lease alive: after a SIGHUP
 *     that raised max_ttl_ms, and on a daemon whose own max_ttl_ms is
 *     shorter than another's (it reads the nodes' longest-ttl record).
 *
 * Upper time bounds are stretched under REDLOCKD_TEST_WRAPPER (valgrind);
 * lower bounds never are.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "harness.h"

#define NNODES 3

/* Its nodes, daemons 0 and 1 (D1 and D2 below) and the clients
 * (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_daemon *const D1 = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];

/* ---- helpers ----------------------------------------------------------- */

static long long T(long long ms)
{
    return h_slow() ? ms * 3 : ms;
}

/* Poll until every node is up on d (voting or not). */
static void wait_up(struct h_client *c, int timeout_ms)
{
    uint64_t t0 = h_now_ms();

    for (;;) {
        int up = 0;

        for (int i = 0; i < NNODES; i++)
            up += h_stats_node(c, i).up;
        if (up == NNODES)
            return;
        ck_assert_msg(h_since(t0) < timeout_ms, "only %d nodes up after %d ms",
                      up, timeout_ms);
        h_sleep_ms(20);
    }
}

/* Every node i in `mask` restarted empty (no persistence). */
static void restart_empty(unsigned mask)
{
    for (int i = 0; i < NNODES; i++)
        if (mask & (1u << i))
            h_redis_kill(&N[i]);
    for (int i = 0; i < NNODES; i++)
        if (mask & (1u << i))
            h_redis_restart(&N[i]);
}

static bool log_has(const struct h_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "r");
    char line[4096];
    bool found = false;

    if (f == NULL)
        return false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void wait_log(const struct h_daemon *d, const char *needle, int ms)
{
    uint64_t t0 = h_now_ms();

    while (!log_has(d, needle)) {
        if (h_since(t0) >= ms) {
            h_daemon_dump_log(d);
            ck_abort_msg("no \"%s\" in the daemon log after %d ms", needle, ms);
        }
        h_sleep_ms(20);
    }
}

/* Total commands a node has run (INFO commandstats). */
static long long node_calls(int i)
{
    char *s = NULL;
    long long total = 0;

    ck_assert_int_eq(h_redis_cmd(&N[i], &s, "INFO commandstats"), 0);
    ck_assert_ptr_nonnull(s);
    for (const char *p = s; (p = strstr(p, ":calls=")) != NULL; p += 7)
        total += atoll(p + 7);
    free(s);
    return total;
}

/* GET path from 127.0.0.1:port; the status code, the raw response in buf. */
static int http_get(int port, const char *path, char *buf, size_t size)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    char req[256];
    size_t len = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ge(fd, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0,
                  "connect to metrics: %s", strerror(errno));
    snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        ssize_t n;

        ck_assert_msg(poll(&p, 1, 2000) == 1, "metrics endpoint silent");
        n = read(fd, buf + len, size - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len + 1 >= size)
            break;
    }
    buf[len] = '\0';
    close(fd);
    ck_assert_msg(strncmp(buf, "HTTP/1.", 7) == 0, "not HTTP: %s", buf);
    return atoi(buf + 9);
}

/* ---- item 4: a new daemon does not trust nodes that lost their data ----- */

START_TEST(new_daemon_after_two_restarts)
{
    const char *res = "nodes:late";
    struct h_client *a, *b;
    char *line;
    uint64_t t0;
    int refused = 0;

    h_cluster_start(&K, NNODES, 1, "{\"redis\":{\"reconnect_max_ms\":200}}", T(5000));
    a = h_cluster_client(&K, 0, 0);
    /* Node 2 down: the lock lives on nodes 0 and 1 only. */
    h_redis_kill(&N[2]);
    line = h_expect(a, "OK resource=nodes:late ", "LOCK %s ttl=20000", res);
    ck_assert_int_eq(h_redis_cmd(&N[0], NULL, "EXISTS lock:%s", res), 1);
    ck_assert_int_eq(h_redis_cmd(&N[1], NULL, "EXISTS lock:%s", res), 1);
    /* Nodes 1 and 2 come back empty; only node 0 still has the key. */
    restart_empty(0x6);
    ck_assert_int_eq(h_redis_cmd(&N[1], NULL, "EXISTS lock:%s", res), 0);

    /* A daemon that never saw the nodes before. */
    h_cluster_daemon_start(&K, 1, "{\"redis\":{\"reconnect_max_ms\":200}}");
    b = h_cluster_client(&K, 1, 1);
    wait_up(b, T(5000));
    t0 = h_now_ms();
    while (h_since(t0) < 1500) {
        line = h_cmd(b, "LOCK %s ttl=5000", res);
        ck_assert_msg(!h_starts(line, "OK "), "a daemon started after nodes 1 "
                      "and 2 restarted empty granted %s, held by another "
                      "client on node 0: %s", res, line);
        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE ") ||
                      h_starts(line, "ERR BUSY "), "LOCK answered %s", line);
        refused++;
        h_sleep_ms(100);
    }
    for (int i = 1; i < NNODES; i++) {
        struct h_node_view v = h_stats_node(b, i);

        ck_assert_msg(!v.voting && v.recovering && v.has_until,
                      "new daemon: node %d voting=%d recovering=%d (%s)", i,
                      v.voting, v.recovering, v.why);
        ck_assert_msg(strstr(v.why, "recovering") != NULL, "why: %s", v.why);
    }
    ck_assert(h_stats_node(b, 0).voting);
    fprintf(stderr, "new daemon after two restarts: %d refusals; node 1: %s\n",
            refused, h_stats_node(b, 1).why);
    h_cluster_stop(&K);
}
END_TEST

/* ---- item 5: two of three restarted nodes recover ------------------------ */

static unsigned long long lock_fence(struct h_client *c, const char *res)
{
    char *line = h_expect(c, "OK resource=", "LOCK %s ttl=1000", res);
    unsigned long long f = strtoull(h_kv(line, "fence"), NULL, 10);

    h_expect(c, "OK resource=", "UNLOCK %s", res);
    return f;
}

START_TEST(two_restarted_recover)
{
    /* A restarted node waits max_ttl_ms (2000) plus drift (22). */
    const char *conf = "{\"locks\":{\"max_ttl_ms\":2000,\"default_ttl_ms\":1000},"
                       "\"redis\":{\"reconnect_max_ms\":200}}";
    const char *res = "nodes:two";
    struct h_client *a, *b;
    unsigned long long before = 0, after = 0, later;
    long long ok_at = -1;
    bool saw_why = false;
    uint64_t t_r;
    char *line;

    h_cluster_start(&K, NNODES, 1, conf, T(5000));
    a = h_cluster_client(&K, 0, 0);
    for (int i = 0; i < 3; i++)
        before = lock_fence(a, res);
    restart_empty(0x6);
    t_r = h_now_ms();
    while (ok_at < 0) {
        line = h_cmd(a, "LOCK %s ttl=1000", res);
        if (h_starts(line, "OK ")) {
            ok_at = h_since(t_r);
            after = strtoull(h_kv(line, "fence"), NULL, 10);
            h_expect(a, "OK resource=", "UNLOCK %s", res);
            break;
        }
        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE "), "LOCK: %s", line);
        struct h_node_view v = h_stats_node(a, 1);
        if (v.recovering && strstr(v.why, "until") != NULL && v.has_until)
            saw_why = true;
        ck_assert_msg(h_since(t_r) < 2022 + T(4000), "two restarted nodes "
                      "not voting %lld ms after their restart (node 1: %s)",
                      h_since(t_r), v.why);
        h_sleep_ms(100);
    }
    fprintf(stderr, "two restarted: LOCK OK %lld ms after the restart, fence "
            "%llu -> %llu\n", ok_at, before, after);
    ck_assert_msg(ok_at >= 1900, "voting again %lld ms after the restart, "
                  "max_ttl_ms is 2000", ok_at);
    ck_assert_msg(saw_why, "STATS never said node 1 recovers, and until when");
    ck_assert_msg(after > before, "fence went from %llu to %llu", before, after);
    /* The first grant needs a quorum; the last node's repair may finish a
     * moment later. */
    for (int i = 0; i < NNODES; i++) {
        uint64_t until = h_now_ms() + (uint64_t)T(3000);
        while (!h_stats_node(a, i).voting && h_now_ms() < until)
            h_sleep_ms(50);
        ck_assert_msg(h_stats_node(a, i).voting, "node %d not voting", i);
    }

    /* A daemon started now trusts the repaired nodes, and continues the
     * fences. */
    h_cluster_daemon(&K, 1, conf, T(5000));
    b = h_cluster_client(&K, 1, 1);
    later = lock_fence(b, res);
    ck_assert_msg(later > after, "second daemon's fence %llu after %llu",
                  later, after);
    unsigned long long last = lock_fence(a, res);
    ck_assert_msg(last > later, "fence %llu not above %llu", last, later);
    h_cluster_stop(&K);
}
END_TEST

/* ---- item 8: frozen nodes without traffic ------------------------------- */

START_TEST(frozen_nodes_without_traffic)
{
    const int probe = 300, timeout = 100;
    char json[256], buf[4096];
    int mport = h_free_port(), status = 0;
    struct h_client *a;
    uint64_t t0, t_stop;
    long long unhealthy = -1, down = -1;

    snprintf(json, sizeof(json), "{\"metrics\":{\"listen\":\"127.0.0.1:%d\"},"
             "\"redis\":{\"probe_interval_ms\":%d,\"command_timeout_ms\":%d}}",
             mport, probe, timeout);
    h_cluster_start(&K, NNODES, 1, json, T(5000));
    a = h_cluster_client(&K, 0, 0);
    /* Healthy, and it stays so while idle for several probe periods. */
    t0 = h_now_ms();
    while (h_since(t0) < 4 * probe) {
        status = http_get(mport, "/healthz", buf, sizeof(buf));
        ck_assert_msg(status == 200, "idle and healthy: %s", buf);
        h_sleep_ms(50);
    }
    h_redis_pause(&N[1]);
    h_redis_pause(&N[2]);
    t_stop = h_now_ms();
    while (unhealthy < 0 && h_since(t_stop) < T(5000)) {
        status = http_get(mport, "/healthz", buf, sizeof(buf));
        if (status == 503)
            unhealthy = h_since(t_stop);
        else
            h_sleep_ms(10);
    }
    fprintf(stderr, "frozen nodes: /healthz 503 %lld ms after SIGSTOP\n",
            unhealthy);
    ck_assert_msg(unhealthy >= 0, "/healthz still 200 5 s after two of three "
                  "nodes froze");
    ck_assert_msg(unhealthy <= probe + timeout + T(300), "/healthz 503 only "
                  "%lld ms after the freeze (probe %d + timeout %d)", unhealthy,
                  probe, timeout);
    ck_assert_msg(strstr(buf, "\r\nX-Redlockd-Why: ") != NULL,
                  "no reason header: %s", buf);
    ck_assert_msg(strstr(buf, "\r\n\r\nno quorum\n") != NULL, "%s", buf);
    while (down < 0 && h_since(t_stop) < T(5000)) {
        if (!h_stats_node(a, 1).up && !h_stats_node(a, 2).up)
            down = h_since(t_stop);
        else
            h_sleep_ms(10);
    }
    fprintf(stderr, "frozen nodes: STATS down %lld ms after SIGSTOP\n", down);
    ck_assert_msg(down >= 0 && down <= 2 * probe + timeout + T(500),
                  "frozen nodes shown down after %lld ms", down);
    ck_assert_int_le(h_stats_int(a, "nodes_voting"), 1);
    h_redis_resume(&N[1]);
    h_redis_resume(&N[2]);
    h_wait_voting(D1, NNODES, T(5000));
    t0 = h_now_ms();
    while ((status = http_get(mport, "/healthz", buf, sizeof(buf))) != 200) {
        ck_assert_msg(h_since(t0) < T(3000), "not healthy again: %s", buf);
        h_sleep_ms(20);
    }
    h_cluster_stop(&K);
}
END_TEST

/* ---- restarts and flushes seen without traffic -------------------------- */

START_TEST(idle_restart_and_flush_seen)
{
    struct h_client *a;
    struct h_node_view v;
    uint64_t t0;

    h_cluster_start(&K, NNODES, 1, "{\"locks\":{\"max_ttl_ms\":60000},"
                                   "\"redis\":{\"reconnect_max_ms\":200,"
                                   "\"probe_interval_ms\":200}}", T(5000));
    a = h_cluster_client(&K, 0, 0);
    /* Nobody locks. Node 0 restarts empty. */
    restart_empty(0x1);
    t0 = h_now_ms();
    while (!((v = h_stats_node(a, 0)).restarts >= 1 && v.recovering && !v.voting)) {
        ck_assert_msg(h_since(t0) < T(3000), "idle restart of node 0 not seen "
                      "(restarts %lld, %s)", v.restarts, v.why);
        h_sleep_ms(20);
    }
    fprintf(stderr, "idle restart seen after %lld ms: %s\n", h_since(t0), v.why);
    /* Node 1 loses its data without a restart. */
    ck_assert_int_eq(h_redis_cmd(&N[1], NULL, "FLUSHALL"), 0);
    t0 = h_now_ms();
    while (!((v = h_stats_node(a, 1)).recovering && !v.voting)) {
        ck_assert_msg(h_since(t0) < T(2000), "FLUSHALL on idle node 1 not "
                      "seen (%s)", v.why);
        h_sleep_ms(20);
    }
    fprintf(stderr, "flush seen after %lld ms: %s\n", h_since(t0), v.why);
    ck_assert_int_eq(h_stats_node(a, 1).restarts, 0);
    h_cluster_stop(&K);
}
END_TEST

/* ---- item 9: appendfsync always is not carried over --------------------- */

START_TEST(config_refused_resets_aof)
{
    const char *aof = "--appendonly yes --appendfsync always";
    struct h_client *a;
    struct h_node_view v;
    uint64_t t0;

    h_cluster_nodes_first(&K, NNODES, aof);
    h_cluster_daemon(&K, 0, "{\"locks\":{\"max_ttl_ms\":4000,\"default_ttl_ms\":2000},"
                            "\"redis\":{\"reconnect_max_ms\":200}}", T(5000));
    a = h_cluster_client(&K, 0, 0);
    ck_assert_msg(h_stats_node(a, 0).aof_always, "node 0 runs appendfsync always");
    /* The same data, but CONFIG is hidden now: no promise can be read. */
    snprintf(N[0].extra, sizeof(N[0].extra), "%s --rename-command CONFIG "
             "hidden-config-w2", aof);
    h_redis_kill(&N[0]);
    h_redis_restart(&N[0]);
    t0 = h_now_ms();
    while (!((v = h_stats_node(a, 0)).up && v.restarts >= 1 && !v.voting &&
             v.recovering)) {
        ck_assert_msg(!v.voting || v.restarts < 1, "node 0 votes right after "
                      "a restart although its CONFIG is refused");
        ck_assert_msg(h_since(t0) < T(3000), "node 0 not seen recovering (%s)",
                      v.why);
        h_sleep_ms(20);
    }
    ck_assert_msg(!v.aof_always, "aof_always carried over to an instance "
                  "that refuses CONFIG");
    /* It may not vote before max_ttl_ms has passed since its start. */
    while (h_since(t0) < 2500) {
        v = h_stats_node(a, 0);
        ck_assert_msg(!v.voting, "node 0 voting %lld ms after the restart",
                      h_since(t0));
        h_sleep_ms(100);
    }
    h_cluster_stop(&K);
}
END_TEST

/* ---- item 7: no wake-ups on our own undo -------------------------------- */

START_TEST(own_undo_is_quiet)
{
    const char *res = "nodes:quiet";
    struct h_client *a;
    long long before[NNODES], calls;
    uint64_t t0;
    char *s;
    char *line;

    h_cluster_start(&K, NNODES, 1, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    /* Another Redlock client holds it on a bare quorum, nodes 0 and 1. */
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(h_redis_cmd(&N[i], &s, "SET lock:%s x NX PX 20000", res), 0);
        free(s);
    }
    for (int i = 0; i < NNODES; i++)
        before[i] = node_calls(i);
    t0 = h_now_ms();
    line = h_cmd(a, "LOCK %s wait=3000", res);
    ck_assert_msg(h_starts(line, "ERR TIMEOUT "), "LOCK answered %s", line);
    long long ms = h_since(t0);
    for (int i = 0; i < NNODES; i++) {
        calls = node_calls(i) - before[i];
        fprintf(stderr, "waiting LOCK against a bare quorum: node %d ran %lld "
                "commands in %lld ms\n", i, calls, ms);
        ck_assert_msg(calls * 1000 / ms < 200, "node %d ran %lld commands in "
                      "%lld ms for one waiting LOCK", i, calls, ms);
    }
    /* The undo left the foreign keys alone and removed ours. */
    ck_assert_int_eq(h_redis_cmd(&N[2], NULL, "EXISTS lock:%s", res), 0);
    h_cluster_stop(&K);
}
END_TEST

/* ---- operations: ending a recovery deliberately ------------------------- */

START_TEST(end_recovery_by_operator)
{
    /* A ten-minute wait the operator cuts short. */
    const char *conf = "{\"locks\":{\"max_ttl_ms\":600000,\"default_ttl_ms\":1000},"
                       "\"redis\":{\"reconnect_max_ms\":200}}";
    const char *res = "nodes:end";
    struct h_client *a;
    struct h_node_view v;
    unsigned long long f1, f2;
    uint64_t t0;

    h_cluster_start(&K, NNODES, 1, conf, T(5000));
    a = h_cluster_client(&K, 0, 0);
    f1 = lock_fence(a, res);
    restart_empty(0x1);
    t0 = h_now_ms();
    while (!((v = h_stats_node(a, 0)).up && v.recovering)) {
        ck_assert_msg(h_since(t0) < T(3000), "node 0 not recovering (%s)", v.why);
        h_sleep_ms(20);
    }
    ck_assert_msg(v.has_until && strstr(v.why, "until") != NULL, "%s", v.why);
    ck_assert_int_eq(kill(D1->pid, SIGUSR1), 0);
    t0 = h_now_ms();
    while (!(v = h_stats_node(a, 0)).voting) {
        ck_assert_msg(h_since(t0) < T(3000), "node 0 not voting after its "
                      "recovery was ended (%s)", v.why);
        h_sleep_ms(20);
    }
    wait_log(D1, "recovery ended by the operator", T(1000));
    /* It votes with a repaired counter: with node 1 frozen, nodes 0 and 2
     * make the quorum, and the fence is above f1. */
    h_redis_pause(&N[1]);
    t0 = h_now_ms();
    for (;;) {
        char *line = h_cmd(a, "LOCK %s ttl=1000", res);

        if (h_starts(line, "OK ")) {
            f2 = strtoull(h_kv(line, "fence"), NULL, 10);
            break;
        }
        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK: %s", line);
        ck_assert_msg(h_since(t0) < T(3000), "no quorum of nodes 0 and 2");
        h_sleep_ms(50);
    }
    ck_assert_msg(f2 > f1, "fence %llu after %llu", f2, f1);
    h_redis_resume(&N[1]);
    h_cluster_stop(&K);
}
END_TEST

/* ---- start-up warnings --------------------------------------------------- */

START_TEST(startup_warnings)
{
    h_cluster_nodes_first(&K, NNODES, "--maxmemory 100mb "
                                      "--maxmemory-policy allkeys-lru");
    /* The default max_ttl_ms (24 h) and no appendfsync always anywhere. */
    h_cluster_daemon(&K, 0, NULL, T(5000));
    wait_log(D1, "not running appendonly yes with appendfsync always", T(2000));
    wait_log(D1, "maxmemory-policy allkeys-lru may evict any key", T(2000));
    h_cluster_stop(&K);
}
END_TEST

/* ---- safety round 3: data lost between probes, longer leases ------------ */

/*
 * Node 0 is flushed while it votes, long before the next probe (60 s):
 * client a holds x on nodes 0 and 2 (its key on node 1 is removed by hand,
 * as a write lost on the way), and a LOCK x on another daemon would find
 * x free on nodes 0 and 1. The scripts' guard (the recovery marker checked
 * inside each vote) makes node 0 fail the vote at once, and its recovery
 * starts on that answer.
 */
START_TEST(flush_between_probes)
{
    const char *conf = "{\"redis\":{\"probe_interval_ms\":60000,"
                       "\"reconnect_max_ms\":200}}";
    struct h_client *a, *b;
    char *line;

    h_cluster_start(&K, NNODES, 2, conf, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 1);
    line = h_expect(a, "OK resource=fl ", "LOCK fl ttl=20000");
    ck_assert_int_eq(h_redis_cmd(&N[1], NULL, "DEL lock:fl"), 1);
    ck_assert_int_eq(h_redis_cmd(&N[0], NULL, "FLUSHALL"), 0);
    line = h_cmd(b, "LOCK fl ttl=5000");
    ck_assert_msg(!h_starts(line, "OK "), "granted fl while client a holds "
                  "it on node 2, with node 0 flushed: %s", line);
    ck_assert_msg(h_starts(line, "ERR BUSY ") ||
                  h_starts(line, "ERR UNAVAILABLE "), "LOCK: %s", line);
    /* The daemon that asked knows at once: node 0 stops voting. */
    struct h_node_view v = h_stats_node(b, 0);
    ck_assert_msg(!v.voting, "node 0 still votes after answering LOSTDATA "
                  "(%s)", v.why);
    wait_log(D2, "LOSTDATA", T(1000));
    /* Its check (sent at once, not at the next probe) finds no marker. */
    uint64_t t0 = h_now_ms();
    while (!(v = h_stats_node(b, 0)).recovering && h_since(t0) < T(1000))
        h_sleep_ms(20);
    ck_assert_msg(v.recovering && !v.voting, "node 0 after its check: "
                  "voting=%d recovering=%d (%s)", v.voting, v.recovering,
                  v.why);
    /* The holder is untouched: still renewing on nodes 0 (its data gone)
     * and 2 would lose it, but node 2 and the rest keep a quorum once
     * node 0 recovers; its LOCKS still lists it now. */
    h_expect(a, "OK {", "LOCKS");
    h_cluster_stop(&K);
}
END_TEST

/* Rewrite d's config file with locks.max_ttl_ms = ms, and SIGHUP it. */
static void reload_max_ttl(struct h_daemon *d, long long ms)
{
    json_error_t err;
    json_t *root = json_load_file(d->conf_path, 0, &err);
    json_t *locks;

    ck_assert_msg(root, "%s: %s", d->conf_path, err.text);
    locks = json_object_get(root, "locks");
    if (!locks) {
        locks = json_object();
        json_object_set_new(root, "locks", locks);
    }
    json_object_set_new(locks, "max_ttl_ms", json_integer(ms));
    ck_assert_int_eq(json_dump_file(root, d->conf_path, JSON_INDENT(2)), 0);
    json_decref(root);
    ck_assert_int_eq(kill(d->pid, SIGHUP), 0);
    wait_log(d, "locks.max_ttl_ms", T(2000));
}

/* Two of three nodes restarted empty while a lease of 60 s lives on the
 * third: no LOCK of it may be granted for (most of) that minute. */
static void assert_refused_for(struct h_client *c, const char *res, int ms)
{
    uint64_t t0 = h_now_ms();
    int refused = 0;

    while (h_since(t0) < ms) {
        char *line = h_cmd(c, "LOCK %s ttl=1000", res);
        ck_assert_msg(!h_starts(line, "OK "), "granted %s %lld ms after two "
                      "nodes restarted empty, while a 60 s lease of it "
                      "lives: %s", res, h_since(t0), line);
        refused++;
        h_sleep_ms(200);
    }
    ck_assert_int_gt(refused, 0);
}

/* Nodes 1 and 2, as d's STATS says: recovering for at least min_ms more. */
static void assert_recovering_for(struct h_client *c, long long min_ms)
{
    json_t *o = h_ok_json(c, "STATS");

    for (int i = 1; i < NNODES; i++) {
        json_t *n = json_array_get(json_object_get(o, "nodes"), (size_t)i);
        json_t *in = json_object_get(n, "rejoin_in_ms");
        ck_assert_msg(json_is_integer(in) &&
                      json_integer_value(in) >= min_ms,
                      "node %d rejoins in %lld ms, want >= %lld (%s)", i,
                      json_is_integer(in) ? (long long)json_integer_value(in)
                      : -1LL, min_ms, h_json_str(n, "why"));
    }
    json_decref(o);
}

/* A client of D1 takes res for 60 s (renew=0); nodes 1 and 2 restart
 * empty; D2 must refuse res for the next 6 s and show the two nodes
 * recovering for most of the minute. */
static void lease_outlives_two_restarts(const char *res)
{
    struct h_client *a = h_cluster_client(&K, 0, 0), *b = h_cluster_client(&K, 1, 1);

    h_expect(a, "OK resource=", "LOCK %s ttl=60000 renew=0", res);
    restart_empty(0x6);
    assert_refused_for(b, res, 6000);
    assert_recovering_for(b, 45000);
    h_cluster_stop(&K);
}

/* Two daemons started with max_ttl_ms 3000, reloaded to 60000: the
 * restart wait is the longer one (it was fixed at start). */
START_TEST(reload_raises_max_ttl)
{
    const char *conf = "{\"locks\":{\"max_ttl_ms\":3000,"
                       "\"default_ttl_ms\":1000},"
                       "\"redis\":{\"reconnect_max_ms\":200}}";

    h_cluster_start(&K, NNODES, 2, conf, T(5000));
    reload_max_ttl(D1, 60000);
    reload_max_ttl(D2, 60000);
    lease_outlives_two_restarts("long");
}
END_TEST

/* Two daemons with different max_ttl_ms: the short one reads the longest
 * ttl granted from the node that kept its data, and waits that long. */
START_TEST(daemons_with_different_max_ttl)
{
    h_cluster_nodes(&K, NNODES, NULL);
    h_cluster_daemon(&K, 0, "{\"locks\":{\"max_ttl_ms\":60000},"
                            "\"redis\":{\"reconnect_max_ms\":200}}", T(5000));
    h_cluster_daemon(&K, 1, "{\"locks\":{\"max_ttl_ms\":3000,\"default_ttl_ms\":1000},"
                            "\"redis\":{\"reconnect_max_ms\":200}}", T(5000));
    lease_outlives_two_restarts("long2");
}
END_TEST

static Suite *nodes_suite(void)
{
    Suite *s = suite_create("nodes");
    TCase *tc = tcase_create("nodes");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, new_daemon_after_two_restarts);
    tcase_add_test(tc, two_restarted_recover);
    tcase_add_test(tc, frozen_nodes_without_traffic);
    tcase_add_test(tc, idle_restart_and_flush_seen);
    tcase_add_test(tc, config_refused_resets_aof);
    tcase_add_test(tc, own_undo_is_quiet);
    tcase_add_test(tc, end_recovery_by_operator);
    tcase_add_test(tc, startup_warnings);
    tcase_add_test(tc, flush_between_probes);
    tcase_add_test(tc, reload_raises_max_ttl);
    tcase_add_test(tc, daemons_with_different_max_ttl);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(nodes_suite());
}
