/*
 * test_fence: fencing tokens across daemons, with counters that have
 * diverged and votes that arrive late (suite "fault"), and Redis error
 * replies as failed votes. Real redis-server nodes, the real binary, and
 * the fault proxy (tests/tools/faultproxy.c) where a vote must be slow.
 *
 *   - counters set to 25, 20, 21 by hand: the first grant gets 26, every
 *     node holding its key is left at 26 or more, and it took one raise
 *     round; the next grant needs none;
 *   - 100 grants alternating between two daemons strictly increase, and
 *     only the first one needed a raise round (the normal case is one
 *     round);
 *   - one acquisition A whose vote on node 1 is held by the proxy across
 *     another acquisition B's whole lease on the other daemon: B's raise
 *     lands (both granted, in order), or B's raise on node 1, a node where
 *     B holds the key, is lost (B may not count nodes where it holds no
 *     key: it fails, and A's fence is still above any granted before);
 *   - a grant answered on the two fast nodes (counters 5 and 5) before
 *     the third, 200 ms away and at 1000, has answered: fence 6; once the
 *     slow node's answer is in, its key carries fence 6 too, not its own
 *     1001, so that ADOPT on another daemon finds the lease's fence;
 *   - a node answering WRONGTYPE (the lock's key is a hash there) or OOM
 *     (maxmemory reached, noeviction): LOCK is granted by the other two,
 *     and the daemon's log names the node and the reason, once for many
 *     requests.
 *
 * Fences are compared in grant order: the order in which the OK replies
 * arrive, each grant of the resource coming after the UNLOCK (or expiry)
 * of the one before.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NNODES 3
#define FENCE_KEY "redlockd:fence"
#define ALTERNATIONS 100
/* The debug line redlock writes when a grant needs a second round. */
#define RAISE_LINE "fence raise round"

/* Its nodes, proxies X[0] and X[1], daemons D1 and D2 and clients A (on
 * D1) and B (on D2) (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_proxy *const X = K.proxies;
static struct h_daemon *const D1 = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];

/* Set node i's fence counter directly, as a diverged history left it,
 * with the admission marker a daemon writes for a node that kept its data
 * (without it the node's counter without a marker reads as data loss, and
 * the node waits out max_ttl_ms before it votes). */
static void set_counter(int i, long long v)
{
    char *s = NULL, *info = NULL, run_id[64] = "";

    h_redis_cmd(&N[i], &s, "SET %s %lld", FENCE_KEY, v);
    ck_assert_msg(s && strcmp(s, "OK") == 0, "SET counter on node %d", i);
    free(s);
    h_redis_cmd(&N[i], &info, "INFO server");
    const char *p = info ? strstr(info, "run_id:") : NULL;
    ck_assert_msg(p, "no run_id from node %d", i);
    sscanf(p + 7, "%63[0-9a-f]", run_id);
    free(info);
    s = NULL;
    h_redis_cmd(&N[i], &s, "SET %s:admitted %s", FENCE_KEY, run_id);
    free(s);
}

static unsigned long long counter(int i)
{
    char *s = NULL;
    unsigned long long v;

    ck_assert_msg(h_redis_cmd(&N[i], &s, "GET %s", FENCE_KEY) != -2 && s != NULL,
                  "node %d has no fence counter", i);
    v = strtoull(s, NULL, 10);
    free(s);
    return v;
}

/* How often `needle` occurs in the daemon's log so far. */
static int log_count(const struct h_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "r");
    char line[4096];
    int n = 0;

    ck_assert_msg(f != NULL, "cannot open %s", d->log_path);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, needle) != NULL)
            n++;
    }
    fclose(f);
    return n;
}

/* Lines of the log holding both strings. */
static int log_count2(const struct h_daemon *d, const char *a, const char *b)
{
    FILE *f = fopen(d->log_path, "r");
    char line[4096];
    int n = 0;

    ck_assert_msg(f != NULL, "cannot open %s", d->log_path);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, a) != NULL && strstr(line, b) != NULL)
            n++;
    }
    fclose(f);
    return n;
}

static unsigned long long fence_of(const char *line)
{
    const char *v = h_kv(line, "fence");

    ck_assert_msg(v != NULL, "no fence in \"%s\"", line);
    return strtoull(v, NULL, 10);
}

/* LOCK that must succeed; returns its fence. */
static unsigned long long lock_fence(struct h_client *c, const char *res)
{
    return fence_of(h_expect(c, "OK resource=", "LOCK %s", res));
}

static void start_plain(void)
{
    h_cluster_nodes(&K, NNODES, NULL);
    set_counter(0, 25);
    set_counter(1, 20);
    set_counter(2, 21);
}

/* ---- diverged counters -------------------------------------------------- */

START_TEST(diverged_first_grant)
{
    unsigned long long f;

    start_plain();
    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);

    f = lock_fence(A, "fence:d");
    ck_assert_msg(f == 26, "counters 25, 20, 21: first fence %llu, want 26", f);
    /* The key is held on all three; each holder is at the fence or above. */
    for (int i = 0; i < NNODES; i++)
        ck_assert_msg(counter(i) >= f, "node %d holds the key with counter "
                      "%llu, below the fence %llu", i, counter(i), f);
    ck_assert_int_eq(log_count(D1, RAISE_LINE), 1);
    h_expect(A, "OK ", "UNLOCK fence:d");

    /* Converged: the next grant is one round. */
    f = lock_fence(A, "fence:d");
    ck_assert_msg(f == 27, "second fence %llu, want 27", f);
    ck_assert_int_eq(log_count(D1, RAISE_LINE), 1);
    ck_assert_int_eq(h_daemon_finish(D1), 0);
}
END_TEST

START_TEST(alternating_daemons)
{
    unsigned long long prev = 0;

    start_plain();
    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    h_cluster_daemon(&K, 1, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);

    for (int i = 0; i < ALTERNATIONS; i++) {
        struct h_client *c = i % 2 == 0 ? A : B;
        unsigned long long f = lock_fence(c, "fence:alt");

        ck_assert_msg(f > prev, "grant %d (daemon %d): fence %llu after %llu",
                      i, i % 2 + 1, f, prev);
        prev = f;
        h_expect(c, "OK ", "UNLOCK fence:alt");
    }
    /* Only the very first grant found the counters apart. */
    ck_assert_int_eq(log_count(D1, RAISE_LINE), 1);
    ck_assert_int_eq(log_count(D2, RAISE_LINE), 0);
    h_cluster_stop(&K);
}
END_TEST

/* ---- a grant answered before a holder that is ahead -------------------- */

START_TEST(late_holder_ahead)
{
    const char *res = "fence:late";
    char token[64], *v = NULL;
    unsigned long long f;
    char *line;

    h_cluster_nodes(&K, NNODES, NULL);
    set_counter(0, 5);
    set_counter(1, 5);
    set_counter(2, 1000);
    h_cluster_proxy(&K, 0, 2);
    h_cluster_route(&K, 0, 2, 0);
    h_cluster_daemon(&K, 0, "{\"redis\":{\"command_timeout_ms\":3000}}",
                     h_scale(5000));
    h_cluster_daemon(&K, 1, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);
    h_proxy_ctl(&X[0], "delay 100");

    line = h_expect(A, "OK resource=", "LOCK %s ttl=20000", res);
    h_kv_copy(line, "token", token, sizeof(token));
    f = fence_of(line);
    ck_assert_msg(f == 6, "counters 5, 5 and 1000 (200 ms away): fence %llu, "
                  "want 6 from the two fast nodes", f);
    /* The slow node's answer, then the fence set on its key. */
    h_sleep_ms(600);
    ck_assert_uint_eq(counter(2), 1001);
    h_redis_cmd(&N[2], &v, "GET lock:%s", res);
    ck_assert_msg(v && h_holds_token(v, token) && strlen(v) > 2 &&
                  strcmp(v + strlen(v) - 2, " 6") == 0,
                  "node 2 holds \"%s\": want the token with fence 6",
                  v ? v : "(nothing)");
    free(v);

    line = h_expect(B, "OK resource=", "ADOPT %s token=%s ttl=20000", res,
                    token);
    ck_assert_msg(fence_of(line) == 6, "ADOPT after the grant: \"%s\", want "
                  "fence 6", line);
    h_expect(B, "OK ", "UNLOCK %s", res);
    h_proxy_ctl(&X[0], "pass");
    h_cluster_stop(&K);
}
END_TEST

/* ---- a vote held across another acquisition's whole lease --------------- */

/*
 * Nodes 0, 1, 2 with counters 25, 20, 21. Daemon 1 reaches node 1 through
 * proxy X[0], daemon 2 through X[1]; nodes 0 and 2 directly.
 *
 *   - B (daemon 2) locks while a foreign key holds node 2: it takes nodes
 *     0 and 1, its reply from node 1 is delayed 400 ms. Its counters there
 *     differ, so it must raise node 1 before it counts.
 *   - As soon as B's key is on node 1, the foreign key goes, and A
 *     (daemon 1) locks: node 0 is B's, node 2 is free at once, and A's
 *     request to node 1 is held 3.5 s by the proxy, past B's whole lease
 *     (B unlocks at once, or its key expires after 2.5 s).
 *   - lose_raise: B's raise to node 1 is held for an hour (B times out
 *     on node 1 after 1.5 s). B holds no key on node 2, so a raise there
 *     counts for nothing; B must not be granted on it.
 *
 * Every grant, in order, must get a larger fence.
 */
static void straddle(bool lose_raise)
{
    const char *res = "fence:s";
    unsigned long long fences[2];
    int nf = 0;
    uint64_t t0;
    char *line;

    start_plain();
    h_cluster_proxy(&K, 0, 1);
    h_cluster_proxy(&K, 1, 1);
    h_cluster_route(&K, 0, 1, 0);
    h_cluster_route(&K, 1, 1, 1);
    h_cluster_daemon(&K, 0, "{\"redis\":{\"command_timeout_ms\":30000}}",
                     h_scale(5000));
    h_cluster_daemon(&K, 1, "{\"redis\":{\"command_timeout_ms\":1500,"
                            "\"reconnect_max_ms\":200}}", h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);

    ck_assert_int_eq(h_redis_cmd(&N[2], NULL, "SET lock:%s foreign PX 60000", res), 0);
    h_proxy_ctl(&X[1], "delay-down 400");
    h_sendf(B, "LOCK %s ttl=2500 renew=0\n", res);
    t0 = h_now_ms();
    while (h_redis_cmd(&N[1], NULL, "EXISTS lock:%s", res) != 1) {
        ck_assert_msg(h_since(t0) < h_scale(2000), "B's key never reached node 1");
        h_sleep_ms(1);
    }
    if (lose_raise)
        h_proxy_ctl(&X[1], "delay-up 3600000");
    ck_assert_int_eq(h_redis_cmd(&N[2], NULL, "DEL lock:%s", res), 1);
    h_proxy_ctl(&X[0], "delay-up 3500");
    h_sendf(A, "LOCK %s ttl=30000\n", res);

    line = h_recv_line(B, h_scale(6000));
    ck_assert_msg(line != NULL, "B got no answer");
    fprintf(stderr, "straddle%s: B answered %s\n", lose_raise ? " (raise lost)" : "",
            line);
    if (h_starts(line, "OK resource=")) {
        fences[nf++] = fence_of(line);
        /* A renew=0 lease granted late may have run out already. */
        line = h_cmd(B, "UNLOCK %s", res);
        ck_assert_msg(h_starts(line, "OK ") || h_starts(line, "ERR LOST "),
                      "B's UNLOCK answered \"%s\"", line);
    } else {
        ck_assert_msg(lose_raise && h_starts(line, "ERR UNAVAILABLE "),
                      "B answered \"%s\"", line);
    }
    line = h_recv_line(A, h_scale(15000));
    ck_assert_msg(line != NULL, "A got no answer");
    fprintf(stderr, "straddle%s: A answered %s\n", lose_raise ? " (raise lost)" : "",
            line);
    ck_assert_msg(h_starts(line, "OK resource="), "A answered \"%s\"", line);
    fences[nf++] = fence_of(line);
    if (nf == 2)
        ck_assert_msg(fences[1] > fences[0], "A was granted fence %llu after "
                      "B's %llu", fences[1], fences[0]);
    if (!lose_raise)
        ck_assert_int_eq(nf, 2);
    h_expect(A, "OK ", "UNLOCK %s", res);
    h_proxy_ctl(&X[0], "pass");
    h_proxy_ctl(&X[1], "pass");
    h_cluster_stop(&K);
}

START_TEST(straddle_raise_lands)
{
    straddle(false);
}
END_TEST

START_TEST(straddle_raise_lost)
{
    straddle(true);
}
END_TEST

/* ---- Redis error replies ------------------------------------------------ */

#define ERR_ROUNDS 10

/* ERR_ROUNDS LOCK/UNLOCK of res, each granted by the two other nodes. */
static void lock_rounds(const char *res)
{
    for (int i = 0; i < ERR_ROUNDS; i++) {
        lock_fence(A, res);
        h_expect(A, "OK resource=", "UNLOCK %s", res);
    }
}

START_TEST(error_wrongtype)
{
    char node[32];

    h_cluster_nodes(&K, NNODES, NULL);
    ck_assert_int_eq(h_redis_cmd(&N[0], NULL, "HSET lock:fence:wt f v"), 1);
    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    lock_rounds("fence:wt");
    snprintf(node, sizeof(node), "127.0.0.1:%d", N[0].port);
    ck_assert_msg(log_count2(D1, node, "WRONGTYPE") == 1,
                  "the log names WRONGTYPE from %s %d times, want once",
                  node, log_count2(D1, node, "WRONGTYPE"));
    ck_assert_int_eq(h_daemon_finish(D1), 0);
}
END_TEST

START_TEST(error_oom)
{
    char node[32];
    char *big = malloc(64 * 1024);
    char *s = NULL;

    ck_assert_ptr_nonnull(big);
    memset(big, 'x', 64 * 1024);
    h_cluster_start(&K, NNODES, 1, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    /* Fill node 2 past 1 MB, then cap it there without eviction. */
    for (int i = 0; i < 64; i++) {
        redisContext *c = h_redis_connect(&N[2]);
        redisReply *r = redisCommand(c, "SET fill:%d %b", i, big, (size_t)64 * 1024);

        ck_assert_ptr_nonnull(r);
        freeReplyObject(r);
        redisFree(c);
    }
    free(big);
    h_redis_cmd(&N[2], &s, "CONFIG SET maxmemory-policy noeviction");
    free(s);
    s = NULL;
    h_redis_cmd(&N[2], &s, "CONFIG SET maxmemory 1mb");
    ck_assert_msg(s != NULL && strcmp(s, "OK") == 0, "CONFIG SET maxmemory");
    free(s);
    s = NULL;
    ck_assert_int_eq(h_redis_cmd(&N[2], &s, "SET probe 1"), -3);
    free(s);

    lock_rounds("fence:oom");
    snprintf(node, sizeof(node), "127.0.0.1:%d", N[2].port);
    ck_assert_msg(log_count2(D1, node, "OOM") == 1,
                  "the log names OOM from %s %d times, want once", node,
                  log_count2(D1, node, "OOM"));
    ck_assert_int_eq(h_daemon_finish(D1), 0);
}
END_TEST

static Suite *fence_suite(void)
{
    Suite *s = suite_create("fence");
    TCase *tc = tcase_create("fence");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, diverged_first_grant);
    tcase_add_test(tc, alternating_daemons);
    tcase_add_test(tc, late_holder_ahead);
    tcase_add_test(tc, straddle_raise_lands);
    tcase_add_test(tc, straddle_raise_lost);
    tcase_add_test(tc, error_wrongtype);
    tcase_add_test(tc, error_oom);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(fence_suite());
}
