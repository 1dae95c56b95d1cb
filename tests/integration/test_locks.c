/*
 * test_locks: the Redlock core of the real redlockd binary (issue 3).
 *
 * Each test starts its own redis-server nodes (1 or 3) and one or two
 * daemons, from a checked fixture that always stops them again, and asserts
 * that every daemon exits 0 on SIGTERM (under the valgrind wrapper that also
 * means no leaks). Covered, against the replies and codes of protocol.md and
 * against what the Redis nodes themselves hold (GET / PTTL on lock:<r>):
 *   - LOCK / BUSY / HELD / NOTHELD / UNLOCK with 1 and 3 nodes, and that
 *     another session can neither UNLOCK nor EXTEND a lock it does not own;
 *   - release when the connection drops (no QUIT), on QUIT, and of an
 *     acquisition still in flight when its client went away;
 *   - two daemons on the same nodes excluding each other;
 *   - quorum with one node SIGSTOPped (granted) and two (ERR UNAVAILABLE in
 *     bounded time, no partial key left behind, also once the nodes resume);
 *   - the NOSCRIPT fallback after SCRIPT FLUSH and after node restarts;
 *   - interoperability with plain `SET NX PX` clients in both directions;
 *   - EXTEND as seen in PTTL, and ERR LOST when the key vanished;
 *   - LOCKS and STATUS JSON, max_locks_per_session, ttl range, and the
 *     acquisition counters of STATS;
 *   - Redis AUTH (password, ACL user + password) and SELECT of the db.
 */
#include <check.h>
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define DAEMONS_MAX 2

/* Small timeouts so a stopped node is noticed fast and comes back fast;
 * the UNAVAILABLE timing bound below is derived from these. */
#define FAULT_REDIS "\"redis\":{\"command_timeout_ms\":100," \
                    "\"connect_timeout_ms\":300,\"reconnect_max_ms\":200}"
#define FAULT_JSON "{" FAULT_REDIS "}"

/* Its nodes (K.nnodes of them, started by the test) and daemons
 * (harness.h). */
static struct h_cluster K;
static struct h_redis *const R = K.nodes;
static struct h_daemon *const D = K.daemons;
static int nd;

/* ---- fixture ---- */

static void setup(void)
{
    nd = 0;
}

/* ---- helpers ---- */

static unsigned all_nodes(void)
{
    return (1u << K.nnodes) - 1;
}

/* One acquisition counter of STATS ("ok", "busy", "unavailable"). */
static json_int_t acquisitions(struct h_client *c, const char *which)
{
    json_t *stats = h_ok_json(c, "STATS");
    json_int_t v = h_json_int(json_object_get(stats, "acquisitions"), which);

    json_decref(stats);
    return v;
}

/* The daemon logs "ready" before its pool has connected: wait until every
 * node votes, so a first LOCK is not refused for a reason the test is not
 * about. */
static struct h_daemon *start_daemon(const char *extra_json)
{
    ck_assert_int_lt(nd, DAEMONS_MAX);
    return h_cluster_daemon(&K, nd++, extra_json, h_scale(5000));
}

/* HELLO; the session id goes to `id`. */
static void hello(struct h_client *c, const char *name, char *id, size_t size)
{
    char *line = h_expect(c, "OK proto=1 ", "HELLO name=%s", name);
    const char *s = h_kv(line, "session");

    ck_assert_msg(s && *s != '\0', "HELLO without session=: %s", line);
    snprintf(id, size, "%s", s);
}

static unsigned long long parse_u64(const char *s, const char *what,
                                    const char *line)
{
    char *end;
    unsigned long long v;

    ck_assert_msg(s && isdigit((unsigned char)s[0]),
                  "%s is not a number in \"%s\"", what, line);
    v = strtoull(s, &end, 10);
    ck_assert_msg(*end == '\0', "%s is not a number in \"%s\"", what, line);
    return v;
}

struct grant {
    char token[64];
    unsigned long long fence;
    unsigned long long validity;
};

/* Check the fields of a LOCK reply for `res` with `ttl`. */
static void check_grant(const char *line, const char *res, unsigned ttl,
                        struct grant *g)
{
    char copy[1024];
    const char *v;

    snprintf(copy, sizeof(copy), "%s", line);
    ck_assert_msg(h_starts(copy, "OK "), "LOCK %s answered \"%s\"", res, copy);
    v = h_kv(copy, "resource");
    ck_assert_msg(v && strcmp(v, res) == 0, "wrong resource= in \"%s\"", copy);
    v = h_kv(copy, "token");
    ck_assert_msg(v && strlen(v) == 32, "token is not 32 chars: \"%s\"", copy);
    for (const char *p = v; *p != '\0'; p++)
        ck_assert_msg(isxdigit((unsigned char)*p), "token not hex: \"%s\"", copy);
    snprintf(g->token, sizeof(g->token), "%s", v);
    g->fence = parse_u64(h_kv(copy, "fence"), "fence", copy);
    ck_assert_msg(g->fence > 0, "fence is 0: \"%s\"", copy);
    ck_assert_msg(parse_u64(h_kv(copy, "ttl"), "ttl", copy) == ttl,
                  "ttl is not %u: \"%s\"", ttl, copy);
    g->validity = parse_u64(h_kv(copy, "validity"), "validity", copy);
    ck_assert_msg(g->validity > 0 && g->validity <= ttl,
                  "validity not in (0, %u]: \"%s\"", ttl, copy);
}

/* LOCK that must be granted; `opts` are extra words (may be ""). */
static void lock_ok(struct h_client *c, const char *res, unsigned ttl,
                    const char *opts, struct grant *g)
{
    char *line = h_expect(c, "OK ", "LOCK %s ttl=%u%s", res, ttl, opts);

    check_grant(line, res, ttl, g);
}

/* GET lock:<res> on a node: the value (malloc'd) or NULL for no key. */
static char *key_get(const struct h_redis *r, const char *res)
{
    char *s = NULL;
    long long v = h_redis_cmd(r, &s, "GET lock:%s", res);

    ck_assert_msg(v != -3, "GET lock:%s on port %d failed: %s", res, r->port,
                  s ? s : "?");
    if (v == -2) {
        free(s);
        return NULL;
    }
    return s;
}

/* LOCK and EXTEND answer at a quorum: the last node may still be applying
 * the request when the reply arrives (under valgrind, visibly), so what
 * every node must hold is waited for, up to a second (stretched). */
#define SETTLE_MS 1000

static long long key_pttl(const struct h_redis *r, const char *res)
{
    long long v = h_redis_cmd(r, NULL, "PTTL lock:%s", res);

    ck_assert_msg(v != -3, "PTTL lock:%s on port %d failed", res, r->port);
    return v;
}

/* key_pttl once it is above lo, or as it is after SETTLE_MS (stretched). */
static long long key_pttl_over(const struct h_redis *r, const char *res,
                               long long lo)
{
    uint64_t t0 = h_now_ms();
    long long v;

    while ((v = key_pttl(r, res)) <= lo && h_since(t0) < h_scale(SETTLE_MS))
        h_sleep_ms(10);
    return v;
}

/* Assert lock:<res> holds token `value` (NULL: does not exist) on the
 * nodes in `mask`, once settled: the value's first word (a holder label
 * follows it). */
static void assert_keys(unsigned mask, const char *res, const char *value)
{
    for (int i = 0; i < K.nnodes; i++) {
        uint64_t t0 = h_now_ms();
        char *v;
        bool ok;

        if ((mask & (1u << i)) == 0)
            continue;
        for (;;) {
            v = key_get(&R[i], res);
            ok = !value ? !v : h_holds_token(v, value);
            if (ok || h_since(t0) >= h_scale(SETTLE_MS))
                break;
            free(v);
            h_sleep_ms(10);
        }
        ck_assert_msg(ok, "node %d: lock:%s is %s, want %s", i, res,
                      v ? v : "(no key)", value ? value : "(no key)");
        free(v);
    }
}

/* Wait up to timeout_ms until no node in `mask` has lock:<res> holding
 * token `value` (NULL: until the key is absent everywhere in `mask`). */
static bool wait_keys_gone(unsigned mask, const char *res, const char *value,
                           int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        bool gone = true;

        for (int i = 0; i < K.nnodes && gone; i++) {
            char *v;

            if ((mask & (1u << i)) == 0)
                continue;
            v = key_get(&R[i], res);
            if (v && (!value || h_holds_token(v, value)))
                gone = false;
            free(v);
        }
        if (gone)
            return true;
        if (h_now_ms() >= end)
            return false;
        h_sleep_ms(10);
    }
}

/* "node 0: <value> pttl <ms>, ..." of lock:<res> on the nodes in `mask`,
 * for failure messages (static buffer). */
static const char *describe_keys(unsigned mask, const char *res)
{
    static char out[1024];
    size_t len = 0;

    out[0] = '\0';
    for (int i = 0; i < K.nnodes && len < sizeof(out); i++) {
        char *v;

        if ((mask & (1u << i)) == 0)
            continue;
        v = key_get(&R[i], res);
        len += (size_t)snprintf(out + len, sizeof(out) - len, "%snode %d: %s pttl %lld",
                                len > 0 ? ", " : "", i, v ? v : "(no key)",
                                key_pttl(&R[i], res));
        free(v);
    }
    return out;
}

/* LOCK retried while it answers BUSY, for at most timeout_ms: a release
 * triggered by a disconnect runs asynchronously to the client's close. */
static void lock_retry(struct h_client *c, const char *res, unsigned ttl,
                       int timeout_ms, struct grant *g)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        char *line = h_cmd(c, "LOCK %s ttl=%u", res, ttl);

        if (h_starts(line, "OK ")) {
            check_grant(line, res, ttl, g);
            return;
        }
        ck_assert_msg(h_starts(line, "ERR BUSY"), "LOCK %s answered \"%s\"", res, line);
        ck_assert_msg(h_now_ms() < end, "LOCK %s still BUSY after %d ms", res,
                      timeout_ms);
        h_sleep_ms(10);
    }
}

/* ---- lock, BUSY, HELD, NOTHELD, UNLOCK, lock again ---- */

static void basic_cycle(int n)
{
    struct h_client a, b;
    struct grant g1, g2;
    char ida[64], idb[64], want[128];
    json_t *st, *holder;

    h_cluster_nodes(&K, n, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    hello(&a, "alice", ida, sizeof(ida));
    hello(&b, "bob", idb, sizeof(idb));
    ck_assert_str_ne(ida, idb);

    lock_ok(&a, "job:42", 10000, "", &g1);
    /* The key is the prefix + name, holds the token, with a PTTL near ttl. */
    assert_keys(all_nodes(), "job:42", g1.token);
    for (int i = 0; i < n; i++) {
        long long pttl = key_pttl(&R[i], "job:42");

        ck_assert_msg(pttl > 8000 && pttl <= 10000,
                      "node %d: PTTL lock:job:42 = %lld, want close to 10000", i, pttl);
    }

    h_expect(&b, "ERR BUSY", "LOCK job:42 ttl=10000");
    h_expect(&a, "ERR HELD", "LOCK job:42");
    h_expect(&a, "ERR HELD", "LOCK job:42 ttl=5000");

    /* Another session can neither release nor extend alice's lock. */
    h_expect(&b, "ERR NOTHELD", "UNLOCK job:42");
    h_expect(&b, "ERR NOTHELD", "EXTEND job:42 ttl=20000");
    assert_keys(all_nodes(), "job:42", g1.token);
    st = h_ok_json(&b, "STATUS job:42");
    ck_assert(json_is_true(json_object_get(st, "held")));
    holder = json_object_get(st, "holder");
    ck_assert_msg(json_is_object(holder), "STATUS holder is not an object");
    ck_assert_str_eq(h_json_str(holder, "session"), ida);
    json_decref(st);

    /* Nothing held at all by anyone. */
    h_expect(&a, "ERR NOTHELD", "UNLOCK job:43");
    h_expect(&b, "ERR NOTHELD", "UNLOCK job:43");

    snprintf(want, sizeof(want), "OK resource=job:42 nodes=%d", n);
    ck_assert_str_eq(h_cmd(&a, "UNLOCK job:42"), want);
    assert_keys(all_nodes(), "job:42", NULL);
    h_expect(&a, "ERR NOTHELD", "UNLOCK job:42");

    /* Free again: bob gets it with a new token and a higher fence. */
    lock_ok(&b, "job:42", 10000, "", &g2);
    ck_assert_str_ne(g1.token, g2.token);
    ck_assert_msg(g2.fence > g1.fence, "fence went from %llu to %llu", g1.fence,
                  g2.fence);
    assert_keys(all_nodes(), "job:42", g2.token);
    h_expect(&a, "ERR BUSY", "LOCK job:42");
    ck_assert_str_eq(h_cmd(&b, "UNLOCK job:42"), want);
    assert_keys(all_nodes(), "job:42", NULL);
    h_close(&a);
    h_close(&b);
}

START_TEST(basic_1node)
{
    basic_cycle(1);
}
END_TEST

START_TEST(basic_3nodes)
{
    basic_cycle(3);
}
END_TEST

/* ---- release when the session ends ---- */

/* Closed without QUIT: both locks are released on every node, and so is an
 * acquisition the client sent and went away from before its answer. */
START_TEST(disconnect_releases)
{
    struct h_client a, b;
    struct grant ga1, ga2, gb;
    char ida[64];

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    hello(&a, "a", ida, sizeof(ida));
    lock_ok(&a, "dc:1", 30000, "", &ga1);
    lock_ok(&a, "dc:2", 30000, "", &ga2);
    h_expect(&b, "ERR BUSY", "LOCK dc:1 ttl=30000");
    h_sendf(&a, "LOCK dc:3 ttl=30000\n");
    h_close(&a);

    /* Released on every node (a quorum alone would let b in with a's key
     * still on the third, its release not there yet). */
    ck_assert_msg(wait_keys_gone(all_nodes(), "dc:1", ga1.token,
                                 h_scale(1000)),
                  "lock:dc:1 of a closed session still on a node after 1 s");
    lock_retry(&b, "dc:1", 30000, h_scale(1000), &gb);
    assert_keys(all_nodes(), "dc:1", gb.token);
    ck_assert_msg(wait_keys_gone(all_nodes(), "dc:2", NULL, h_scale(1000)),
                  "lock:dc:2 of a closed session still on a node after 1 s");
    /* The in-flight LOCK dc:3 may or may not have been granted before the
     * daemon saw the close; either way it must not outlive the session. */
    lock_retry(&b, "dc:3", 30000, h_scale(1000), &gb);
    assert_keys(all_nodes(), "dc:3", gb.token);
    h_close(&b);
}
END_TEST

START_TEST(quit_releases)
{
    struct h_client a, b;
    struct grant ga, gb;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    lock_ok(&a, "q:1", 30000, "", &ga);
    lock_ok(&a, "q:2", 30000, "", &ga);
    ck_assert_str_eq(h_cmd(&a, "QUIT"), "OK bye");
    ck_assert_msg(h_wait_eof(&a, 2000), "connection still open after QUIT");
    h_close(&a);

    ck_assert_msg(wait_keys_gone(all_nodes(), "q:1", NULL, h_scale(1000)),
                  "lock:q:1 still on a node 1 s after QUIT");
    lock_retry(&b, "q:1", 30000, h_scale(1000), &gb);
    assert_keys(all_nodes(), "q:1", gb.token);
    ck_assert_msg(wait_keys_gone(all_nodes(), "q:2", NULL, h_scale(1000)),
                  "lock:q:2 still on a node 1 s after QUIT");
    h_close(&b);
}
END_TEST

/* ---- two daemons over the same nodes ---- */

START_TEST(two_daemons_exclude)
{
    struct h_client c1, c2;
    struct grant g1, g2;
    json_t *st;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&c1, D[0].port);
    h_connect_tcp_ok(&c2, D[1].port);

    lock_ok(&c1, "shared", 10000, "", &g1);
    h_expect(&c2, "ERR BUSY", "LOCK shared ttl=10000");
    h_expect(&c2, "ERR NOTHELD", "UNLOCK shared");
    assert_keys(all_nodes(), "shared", g1.token);

    /* The other daemon sees the keys, no session of its own holds it, and
     * it names daemon 1's holder from the label stored with the token. */
    st = h_ok_json(&c2, "STATUS shared");
    ck_assert_int_eq(h_json_int(st, "holders_here"), 0);
    ck_assert_msg(h_json_int(json_object_get(st, "holder"), "fence") ==
                  (json_int_t)g1.fence,
                  "STATUS on daemon 2 does not name daemon 1's holder");
    for (size_t i = 0; i < json_array_size(json_object_get(st, "nodes")); i++) {
        json_t *node = json_array_get(json_object_get(st, "nodes"), i);

        ck_assert_msg(h_json_int(node, "pttl") > 0,
                      "STATUS on daemon 2: node %zu pttl %lld", i,
                      (long long)h_json_int(node, "pttl"));
    }
    json_decref(st);

    ck_assert_str_eq(h_cmd(&c1, "UNLOCK shared"), "OK resource=shared nodes=3");
    lock_ok(&c2, "shared", 10000, "", &g2);
    ck_assert_msg(g2.fence > g1.fence, "fence across daemons went from %llu to %llu",
                  g1.fence, g2.fence);
    assert_keys(all_nodes(), "shared", g2.token);
    h_expect(&c1, "ERR BUSY", "LOCK shared ttl=10000");
    ck_assert_str_eq(h_cmd(&c2, "UNLOCK shared"), "OK resource=shared nodes=3");
    h_close(&c1);
    h_close(&c2);
}
END_TEST

/* ---- stopped nodes ---- */

/* 2 of 3 still make a quorum. */
START_TEST(one_node_stopped)
{
    struct h_client c;
    struct grant g1, g2;
    uint64_t t0, took;
    unsigned running = 0x6;     /* nodes 1 and 2 */

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    h_connect_tcp_ok(&c, D[0].port);
    h_redis_pause(&R[0]);

    /* The first LOCK waits for node 0 up to command_timeout_ms. */
    t0 = h_now_ms();
    lock_ok(&c, "p:1", 10000, "", &g1);
    took = h_now_ms() - t0;
    ck_assert_msg(took < (uint64_t)h_scale(1500),
                  "LOCK with a stopped node took %llu ms", (unsigned long long)took);
    assert_keys(running, "p:1", g1.token);
    lock_ok(&c, "p:2", 10000, "", &g2);
    assert_keys(running, "p:2", g2.token);
    ck_assert_msg(g2.fence > g1.fence, "fence went from %llu to %llu", g1.fence, g2.fence);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK p:1"), "OK resource=p:1 nodes=2");
    ck_assert_str_eq(h_cmd(&c, "UNLOCK p:2"), "OK resource=p:2 nodes=2");
    assert_keys(running, "p:1", NULL);
    assert_keys(running, "p:2", NULL);
    h_close(&c);
}
END_TEST

/* 1 of 3 is no quorum: ERR UNAVAILABLE in bounded time, the key taken on
 * the running node removed at once, and none left once the others resume
 * (they may execute the buffered acquisition when they wake up). The
 * ttl is far above every wait here, so expiry cannot hide a leftover key. */
START_TEST(two_nodes_stopped)
{
    struct h_client c;
    struct grant g;
    json_int_t unavail0, ok0;
    uint64_t t0, took;
    /* command 100 + connect 300 + margin; valgrind is far slower. */
    uint64_t bound = h_slow() ? 10000 : 2000;
    char *line;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    h_connect_tcp_ok(&c, D[0].port);
    unavail0 = acquisitions(&c, "unavailable");
    ok0 = acquisitions(&c, "ok");
    h_redis_pause(&R[0]);
    h_redis_pause(&R[1]);

    t0 = h_now_ms();
    line = h_cmd(&c, "LOCK u:1 ttl=60000");
    took = h_now_ms() - t0;
    ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK with 2 of 3 nodes stopped "
                  "answered \"%s\"", line);
    ck_assert_msg(took < bound, "ERR UNAVAILABLE took %llu ms",
                  (unsigned long long)took);
    /* Removed "at once": the release is sent when the round fails, but may
     * reach Redis a moment after the client's reply; far below the ttl. */
    ck_assert_msg(wait_keys_gone(0x4, "u:1", NULL, h_scale(100)),
                  "partial key lock:u:1 left on the running node");

    /* Again, now that the nodes are known to be down. */
    t0 = h_now_ms();
    line = h_cmd(&c, "LOCK u:2 ttl=60000");
    took = h_now_ms() - t0;
    ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "second LOCK answered \"%s\"", line);
    ck_assert_msg(took < bound, "second ERR UNAVAILABLE took %llu ms",
                  (unsigned long long)took);
    ck_assert_msg(wait_keys_gone(0x4, "u:2", NULL, h_scale(100)),
                  "partial key lock:u:2 left on the running node");

    ck_assert_int_eq(acquisitions(&c, "unavailable"), unavail0 + 2);
    ck_assert_int_eq(acquisitions(&c, "ok"), ok0);
    h_expect(&c, "ERR NOTHELD", "UNLOCK u:1");

    h_redis_resume(&R[0]);
    h_redis_resume(&R[1]);
    ck_assert_msg(wait_keys_gone(all_nodes(), "u:1", NULL, h_scale(3000)),
                  "a key lock:u:1 of the failed LOCK is left after the nodes "
                  "resumed: %s", describe_keys(all_nodes(), "u:1"));
    ck_assert_msg(wait_keys_gone(all_nodes(), "u:2", NULL, h_scale(3000)),
                  "a key lock:u:2 of the failed LOCK is left after the nodes "
                  "resumed: %s", describe_keys(all_nodes(), "u:2"));

    /* And the daemon recovers: the lock can be had again. */
    {
        uint64_t end = h_now_ms() + (uint64_t)h_scale(3000);

        for (;;) {
            line = h_cmd(&c, "LOCK u:1 ttl=60000");
            if (h_starts(line, "OK "))
                break;
            ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK answered \"%s\"", line);
            ck_assert_msg(h_now_ms() < end, "still UNAVAILABLE 3 s after resume");
            h_sleep_ms(50);
        }
        check_grant(line, "u:1", 60000, &g);
    }
    /* A quorum may form before both resumed nodes are back: at least 2. */
    assert_keys(0x4, "u:1", g.token);
    line = h_expect(&c, "OK resource=u:1 nodes=", "UNLOCK u:1");
    ck_assert_msg(atoi(h_kv(line, "nodes")) >= 2, "UNLOCK answered \"%s\"", line);
    h_close(&c);
}
END_TEST

/* ---- NOSCRIPT fallback ---- */

static void script_flush_all(void)
{
    for (int i = 0; i < K.nnodes; i++) {
        char *s = NULL;
        long long v = h_redis_cmd(&R[i], &s, "SCRIPT FLUSH");

        ck_assert_msg(v == 0 && s && strcmp(s, "OK") == 0,
                      "SCRIPT FLUSH on node %d: %s", i, s ? s : "?");
        free(s);
    }
}

START_TEST(script_flush)
{
    struct h_client a, b;
    struct grant g;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);

    script_flush_all();
    lock_ok(&a, "ns", 10000, "", &g);
    assert_keys(all_nodes(), "ns", g.token);
    script_flush_all();
    h_expect(&a, "OK resource=ns ttl=20000 validity=", "EXTEND ns ttl=20000");
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_gt(key_pttl_over(&R[i], "ns", 15000), 15000);
    script_flush_all();
    ck_assert_str_eq(h_cmd(&a, "UNLOCK ns"), "OK resource=ns nodes=3");
    assert_keys(all_nodes(), "ns", NULL);

    /* The release on disconnect uses the same scripts. */
    lock_ok(&a, "ns", 10000, "", &g);
    script_flush_all();
    h_close(&a);
    lock_retry(&b, "ns", 10000, h_scale(1000), &g);
    script_flush_all();
    ck_assert_str_eq(h_cmd(&b, "UNLOCK ns"), "OK resource=ns nodes=3");
    h_close(&b);
}
END_TEST

/* One of three nodes restarts with an empty script cache and no keys:
 * locks are granted all along (two nodes still vote), and the restarted
 * node is used again afterwards. A short max_ttl_ms keeps its no-voting
 * period (it may have forgotten keys) short. */
START_TEST(restart_one_of_three)
{
    struct h_client c;
    struct grant g;
    char res[64], *v;
    int round = 0;
    bool back = false;
    uint64_t end;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon("{" FAULT_REDIS ",\"locks\":{\"max_ttl_ms\":1000,"
                 "\"default_ttl_ms\":1000}}");
    h_connect_tcp_ok(&c, D[0].port);
    lock_ok(&c, "rs", 1000, "", &g);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK rs"), "OK resource=rs nodes=3");

    h_redis_stop(&R[0]);
    lock_ok(&c, "rs", 1000, "", &g);
    assert_keys(0x6, "rs", g.token);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK rs"), "OK resource=rs nodes=2");
    h_redis_restart(&R[0]);

    /* Granted on every try, until the restarted node votes again and
     * holds the new keys. */
    end = h_now_ms() + (uint64_t)h_scale(3000);
    while (!back) {
        json_t *stats;

        snprintf(res, sizeof(res), "rs:%d", round++);
        lock_ok(&c, res, 1000, "", &g);
        v = key_get(&R[0], res);
        stats = h_ok_json(&c, "STATS");
        back = h_holds_token(v, g.token) &&
               h_json_int(stats, "nodes_voting") == 3;
        json_decref(stats);
        free(v);
        h_expect(&c, "OK resource=", "UNLOCK %s", res);
        ck_assert_msg(back || h_now_ms() < end,
                      "restarted node 0 not voting again after 3 s");
        if (!back)
            h_sleep_ms(50);
    }

    /* Its vote counts: with node 1 stopped, nodes 0 and 2 make the quorum.
     * The first try may still see node 1 as up and wait for it. */
    h_redis_pause(&R[1]);
    end = h_now_ms() + (uint64_t)h_scale(3000);
    for (;;) {
        char *line = h_cmd(&c, "LOCK rs:last ttl=1000");

        if (h_starts(line, "OK ")) {
            check_grant(line, "rs:last", 1000, &g);
            break;
        }
        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK answered \"%s\"", line);
        ck_assert_msg(h_now_ms() < end, "restarted node does not vote after 3 s");
        h_sleep_ms(50);
    }
    assert_keys(0x5, "rs:last", g.token);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK rs:last"), "OK resource=rs:last nodes=2");
    h_redis_resume(&R[1]);
    h_close(&c);
}
END_TEST

/* A single node (durable, so it may vote right after the restart) restarts
 * with an empty script cache: LOCK, EXTEND and UNLOCK work again. */
START_TEST(restart_single_node)
{
    struct h_client c;
    struct grant g;
    uint64_t end;
    char *line;

    h_cluster_nodes(&K, 1, "--appendonly yes --appendfsync always");
    start_daemon(FAULT_JSON);
    h_connect_tcp_ok(&c, D[0].port);
    lock_ok(&c, "one", 10000, "", &g);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK one"), "OK resource=one nodes=1");

    h_redis_stop(&R[0]);
    h_expect(&c, "ERR UNAVAILABLE", "LOCK one ttl=10000");
    h_redis_restart(&R[0]);

    end = h_now_ms() + (uint64_t)h_scale(3000);
    for (;;) {
        line = h_cmd(&c, "LOCK one ttl=10000");
        if (h_starts(line, "OK "))
            break;
        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK answered \"%s\"", line);
        ck_assert_msg(h_now_ms() < end, "no lock 3 s after the node restarted");
        h_sleep_ms(50);
    }
    check_grant(line, "one", 10000, &g);
    assert_keys(all_nodes(), "one", g.token);
    h_expect(&c, "OK resource=one ttl=20000 validity=", "EXTEND one ttl=20000");
    ck_assert_int_gt(key_pttl(&R[0], "one"), 15000);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK one"), "OK resource=one nodes=1");
    assert_keys(all_nodes(), "one", NULL);
    h_close(&c);
}
END_TEST

/* ---- other Redlock / SET NX clients ---- */

START_TEST(interop_set_nx)
{
    struct h_client c;
    struct grant g;
    char *s;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&c, D[0].port);

    /* A foreign lock on a quorum: BUSY, and its keys are left alone. */
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(h_redis_cmd(&R[i], &s, "SET lock:io x NX PX 10000"), 0);
        ck_assert_str_eq(s, "OK");
        free(s);
    }
    h_expect(&c, "ERR BUSY", "LOCK io ttl=10000");
    assert_keys(0x3, "io", "x");
    ck_assert_msg(wait_keys_gone(0x4, "io", NULL, h_scale(100)),
                  "partial key lock:io left on node 2 after BUSY");
    h_expect(&c, "ERR NOTHELD", "UNLOCK io");
    assert_keys(0x3, "io", "x");

    /* On a minority only, the lock is granted on the other two nodes, and
     * UNLOCK deletes only this session's keys. */
    ck_assert_int_eq(h_redis_cmd(&R[1], NULL, "DEL lock:io"), 1);
    lock_ok(&c, "io", 10000, "", &g);
    assert_keys(0x1, "io", "x");
    assert_keys(0x6, "io", g.token);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK io"), "OK resource=io nodes=2");
    assert_keys(0x1, "io", "x");
    assert_keys(0x6, "io", NULL);

    /* The reverse: a redlockd lock makes SET NX fail on every node. */
    lock_ok(&c, "io2", 10000, "", &g);
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "SET lock:io2 y NX PX 10000"), -2);
    assert_keys(all_nodes(), "io2", g.token);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK io2"), "OK resource=io2 nodes=3");
    for (int i = 0; i < K.nnodes; i++) {
        ck_assert_int_eq(h_redis_cmd(&R[i], &s, "SET lock:io2 y NX PX 10000"), 0);
        free(s);
    }
    h_close(&c);
}
END_TEST

/* ---- EXTEND ---- */

START_TEST(extend_pttl_and_lost)
{
    struct h_client c;
    struct grant g;
    char *line;
    const char *v;
    json_t *locks, *arr;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&c, D[0].port);

    lock_ok(&c, "ext", 5000, " renew=0", &g);
    for (int i = 0; i < K.nnodes; i++) {
        long long pttl = key_pttl(&R[i], "ext");

        ck_assert_msg(pttl > 0 && pttl <= 5000, "node %d: PTTL %lld", i, pttl);
    }
    line = h_expect(&c, "OK resource=ext ttl=60000 validity=", "EXTEND ext ttl=60000");
    v = h_kv(line, "validity");
    ck_assert_msg(atoll(v) > 0 && atoll(v) <= 60000, "EXTEND validity %s", v);
    for (int i = 0; i < K.nnodes; i++) {
        long long pttl = key_pttl_over(&R[i], "ext", 50000);

        ck_assert_msg(pttl > 50000 && pttl <= 60000,
                      "node %d: PTTL %lld after EXTEND ttl=60000", i, pttl);
    }
    locks = h_ok_json(&c, "LOCKS");
    arr = json_object_get(locks, "locks");
    ck_assert_int_eq(json_array_size(arr), 1);
    ck_assert_int_eq(h_json_int(json_array_get(arr, 0), "ttl"), 60000);
    json_decref(locks);

    /* Deleted behind the daemon's back: the lease is lost. */
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "DEL lock:ext"), 1);
    h_expect(&c, "ERR LOST", "EXTEND ext ttl=60000");
    h_expect(&c, "ERR NOTHELD", "UNLOCK ext");
    assert_keys(all_nodes(), "ext", NULL);
    locks = h_ok_json(&c, "LOCKS");
    ck_assert_int_eq(json_array_size(json_object_get(locks, "locks")), 0);
    json_decref(locks);
    h_close(&c);
}
END_TEST

/* ---- LOCKS and STATUS ---- */

START_TEST(locks_and_status)
{
    struct h_client a, b;
    struct grant g;
    char id[64], node[64];
    json_t *obj, *arr, *holder;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    hello(&a, "inspector", id, sizeof(id));

    obj = h_ok_json(&a, "LOCKS");
    ck_assert_str_eq(h_json_str(obj, "session"), id);
    ck_assert_int_eq(json_array_size(json_object_get(obj, "locks")), 0);
    json_decref(obj);

    lock_ok(&a, "st:1", 10000, "", &g);
    obj = h_ok_json(&a, "LOCKS");
    ck_assert_str_eq(h_json_str(obj, "session"), id);
    arr = json_object_get(obj, "locks");
    ck_assert_int_eq(json_array_size(arr), 1);
    ck_assert_str_eq(h_json_str(json_array_get(arr, 0), "resource"), "st:1");
    ck_assert_int_eq(h_json_int(json_array_get(arr, 0), "fence"), (json_int_t)g.fence);
    ck_assert_int_eq(h_json_int(json_array_get(arr, 0), "ttl"), 10000);
    json_decref(obj);

    /* Another session's view of it. */
    obj = h_ok_json(&b, "STATUS st:1");
    ck_assert_str_eq(h_json_str(obj, "resource"), "st:1");
    ck_assert_str_eq(h_json_str(obj, "key"), "lock:st:1");
    ck_assert(json_is_true(json_object_get(obj, "held")));
    holder = json_object_get(obj, "holder");
    ck_assert_msg(json_is_object(holder), "STATUS holder is not an object");
    ck_assert_str_eq(h_json_str(holder, "session"), id);
    ck_assert_str_eq(h_json_str(holder, "name"), "inspector");
    ck_assert_int_eq(h_json_int(holder, "fence"), (json_int_t)g.fence);
    arr = json_object_get(obj, "nodes");
    ck_assert_int_eq(json_array_size(arr), 3);
    for (int i = 0; i < K.nnodes; i++) {
        json_t *n = json_array_get(arr, (size_t)i);
        json_int_t pttl = h_json_int(n, "pttl");

        snprintf(node, sizeof(node), "127.0.0.1:%d", R[i].port);
        ck_assert_str_eq(h_json_str(n, "node"), node);
        ck_assert(json_is_true(json_object_get(n, "up")));
        ck_assert_msg(pttl > 0 && pttl <= 10000, "STATUS node %d pttl %lld", i,
                      (long long)pttl);
    }
    json_decref(obj);

    ck_assert_str_eq(h_cmd(&a, "UNLOCK st:1"), "OK resource=st:1 nodes=3");
    obj = h_ok_json(&a, "STATUS st:1");
    ck_assert(json_is_false(json_object_get(obj, "held")));
    ck_assert(json_is_null(json_object_get(obj, "holder")));
    arr = json_object_get(obj, "nodes");
    ck_assert_int_eq(json_array_size(arr), 3);
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_eq(h_json_int(json_array_get(arr, (size_t)i), "pttl"), -2);
    json_decref(obj);
    obj = h_ok_json(&a, "LOCKS");
    ck_assert_int_eq(json_array_size(json_object_get(obj, "locks")), 0);
    json_decref(obj);
    h_close(&a);
    h_close(&b);
}
END_TEST

/* ---- limits and arguments ---- */

START_TEST(max_locks_per_session)
{
    struct h_client a, b;
    struct grant g;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon("{\"limits\":{\"max_locks_per_session\":2}}");
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    lock_ok(&a, "lim:1", 10000, "", &g);
    lock_ok(&a, "lim:2", 10000, "", &g);
    h_expect(&a, "ERR LIMIT", "LOCK lim:3 ttl=10000");
    assert_keys(all_nodes(), "lim:3", NULL);
    /* The limit is per session. */
    lock_ok(&b, "lim:3", 10000, "", &g);
    ck_assert_str_eq(h_cmd(&b, "UNLOCK lim:3"), "OK resource=lim:3 nodes=1");
    /* And counts what is held now, not what was ever taken. */
    ck_assert_str_eq(h_cmd(&a, "UNLOCK lim:1"), "OK resource=lim:1 nodes=1");
    lock_ok(&a, "lim:3", 10000, "", &g);
    h_expect(&a, "ERR LIMIT", "LOCK lim:4 ttl=10000");
    h_close(&a);
    h_close(&b);
}
END_TEST

START_TEST(ttl_out_of_range)
{
    struct h_client c;
    struct grant g;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&c, D[0].port);
    h_expect(&c, "ERR ARG", "LOCK t ttl=1");
    h_expect(&c, "ERR ARG", "LOCK t ttl=99");
    h_expect(&c, "ERR ARG", "LOCK t ttl=86400001");
    h_expect(&c, "ERR ARG", "LOCK t ttl=abc");
    assert_keys(all_nodes(), "t", NULL);
    h_expect(&c, "ERR NOTHELD", "UNLOCK t");
    /* min_ttl_ms itself is fine (left to expire: renew=0). */
    lock_ok(&c, "t", 100, " renew=0", &g);
    /* EXTEND checks the same range, and a refused EXTEND keeps the lease. */
    lock_ok(&c, "t2", 10000, "", &g);
    h_expect(&c, "ERR ARG", "EXTEND t2 ttl=1");
    h_expect(&c, "ERR ARG", "EXTEND t2 ttl=99");
    ck_assert_int_gt(key_pttl(&R[0], "t2"), 5000);
    ck_assert_str_eq(h_cmd(&c, "UNLOCK t2"), "OK resource=t2 nodes=1");
    h_close(&c);
}
END_TEST

/* Durations with units (protocol.md "Numbers"): what the nodes hold and
 * how long a wait lasts follow them; replies keep milliseconds. */
START_TEST(durations_with_units)
{
    struct h_client a, b;
    char *line;
    long long pttl, took;
    uint64_t t0;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    h_expect(&a, "OK proto=1 ", "HELLO keepalive=1m");
    line = h_expect(&a, "OK resource=u ", "LOCK u ttl=1.5m wait=2s renew=0");
    ck_assert_str_eq(h_kv(line, "ttl"), "90000");
    pttl = key_pttl(&R[0], "u");
    ck_assert_msg(pttl > 80000 && pttl <= 90000, "PTTL %lld after ttl=1.5m", pttl);
    line = h_expect(&a, "OK resource=u ttl=120000 ", "EXTEND u ttl=2m");
    pttl = key_pttl(&R[0], "u");
    ck_assert_msg(pttl > 110000 && pttl <= 120000, "PTTL %lld after ttl=2m", pttl);

    t0 = h_now_ms();
    h_expect(&b, "ERR TIMEOUT", "LOCK u wait=0.4s");
    took = h_since(t0);
    ck_assert_msg(took >= 380 && took < h_scale(3000), "wait=0.4s gave up after "
                  "%lld ms", took);

    /* The daemon's own bounds still apply, in ms. */
    h_expect(&b, "ERR ARG ttl must be between 100 and 86400000 ms",
             "LOCK v ttl=50ms");
    h_expect(&b, "ERR ARG ttl must be between 100 and 86400000 ms",
             "LOCK v ttl=25h");
    h_expect(&b, "ERR ARG ttl must be 1 to 4294967295 ms, or a number with ms, "
             "s, m or h: '5d' has an unknown unit (use ms, s, m or h)",
             "LOCK v ttl=5d");
    h_expect(&b, "ERR ARG wait must be 0 to 4294967295 ms, or a number with ms, "
             "s, m or h: '-1s' has a sign", "LOCK v wait=-1s");
    h_expect(&b, "ERR ARG", "LOCK v wait=1.5ms");
    h_expect(&b, "ERR ARG", "LOCK v ttl=1.5");
    assert_keys(all_nodes(), "v", NULL);
    ck_assert_str_eq(h_cmd(&a, "UNLOCK u"), "OK resource=u nodes=1");
    h_close(&a);
    h_close(&b);
}
END_TEST

/* ---- STATS counters ---- */

START_TEST(stats_counters)
{
    struct h_client a, b;
    struct grant g;
    json_int_t ok0, busy0, un0;
    json_t *stats;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(FAULT_JSON);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[0].port);
    ok0 = acquisitions(&a, "ok");
    busy0 = acquisitions(&a, "busy");
    un0 = acquisitions(&a, "unavailable");

    lock_ok(&a, "sc", 10000, "", &g);
    stats = h_ok_json(&a, "STATS");
    ck_assert_int_eq(h_json_int(stats, "locks_held"), 1);
    json_decref(stats);
    ck_assert_int_eq(acquisitions(&a, "ok"), ok0 + 1);
    h_expect(&b, "ERR BUSY", "LOCK sc ttl=10000");
    h_expect(&b, "ERR BUSY", "LOCK sc ttl=10000");
    ck_assert_int_eq(acquisitions(&a, "busy"), busy0 + 2);
    ck_assert_int_eq(acquisitions(&a, "ok"), ok0 + 1);
    ck_assert_str_eq(h_cmd(&a, "UNLOCK sc"), "OK resource=sc nodes=1");
    stats = h_ok_json(&a, "STATS");
    ck_assert_int_eq(h_json_int(stats, "locks_held"), 0);
    ck_assert_int_ge(h_json_int(stats, "releases"), 1);
    json_decref(stats);
    lock_ok(&b, "sc", 10000, "", &g);
    ck_assert_int_eq(acquisitions(&a, "ok"), ok0 + 2);
    ck_assert_str_eq(h_cmd(&b, "UNLOCK sc"), "OK resource=sc nodes=1");

    /* No node at all. */
    h_redis_stop(&R[0]);
    h_expect(&a, "ERR UNAVAILABLE", "LOCK sc ttl=10000");
    ck_assert_int_eq(acquisitions(&a, "unavailable"), un0 + 1);
    ck_assert_int_eq(acquisitions(&a, "ok"), ok0 + 2);
    ck_assert_int_eq(acquisitions(&a, "busy"), busy0 + 2);
    h_close(&a);
    h_close(&b);
}
END_TEST

/* ---- Redis-side authentication and database ---- */

/* A synchronous connection that logs in (user may be NULL) and selects db;
 * the value of lock:<res> there (malloc'd) or NULL. */
static char *auth_get(const struct h_redis *r, const char *user,
                      const char *pass, int db, const char *res)
{
    redisContext *c = h_redis_connect(r);
    redisReply *rep;
    char *val = NULL;

    ck_assert_ptr_nonnull(c);
    rep = user ? redisCommand(c, "AUTH %s %s", user, pass)
               : redisCommand(c, "AUTH %s", pass);
    ck_assert_msg(rep && rep->type == REDIS_REPLY_STATUS, "AUTH failed");
    freeReplyObject(rep);
    rep = redisCommand(c, "SELECT %d", db);
    ck_assert_msg(rep && rep->type == REDIS_REPLY_STATUS, "SELECT failed");
    freeReplyObject(rep);
    rep = redisCommand(c, "GET lock:%s", res);
    ck_assert_ptr_nonnull(rep);
    if (rep->type == REDIS_REPLY_STRING)
        val = strdup(rep->str);
    freeReplyObject(rep);
    redisFree(c);
    return val;
}

START_TEST(redis_password_and_db)
{
    struct grant g;
    struct h_client c;

    h_cluster_nodes(&K, 3, NULL);
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL,
                                     "CONFIG SET requirepass n0deS3cret"), 0);
    struct h_daemon *d = start_daemon("{\"redis\":{\"password\":\"n0deS3cret\","
                                      "\"db\":3}}");
    h_connect_tcp_ok(&c, d->port);
    lock_ok(&c, "auth:1", 10000, "", &g);
    for (int i = 0; i < K.nnodes; i++) {
        char *v = auth_get(&R[i], NULL, "n0deS3cret", 3, "auth:1");
        ck_assert_msg(h_holds_token(v, g.token),
                      "node %d db 3 holds %s, want the token %s", i,
                      v ? v : "(nothing)", g.token);
        free(v);
        v = auth_get(&R[i], NULL, "n0deS3cret", 0, "auth:1");
        ck_assert_msg(!v, "the key leaked into db 0 on node %d", i);
    }
    h_expect(&c, "OK resource=auth:1 nodes=3", "UNLOCK auth:1");
    h_close(&c);
}
END_TEST

START_TEST(redis_acl_user)
{
    struct grant g;
    struct h_client c;

    h_cluster_nodes(&K, 3, NULL);
    for (int i = 0; i < K.nnodes; i++) {
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "ACL SETUSER locker on "
                                     ">pw-1 ~* &* +@all"), 0);
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "ACL SETUSER default off"), 0);
    }
    struct h_daemon *d = start_daemon("{\"redis\":{\"username\":\"locker\","
                                      "\"password\":\"pw-1\"}}");
    h_connect_tcp_ok(&c, d->port);
    lock_ok(&c, "acl:1", 10000, "", &g);
    for (int i = 0; i < K.nnodes; i++) {
        char *v = auth_get(&R[i], "locker", "pw-1", 0, "acl:1");
        ck_assert_msg(h_holds_token(v, g.token), "node %d lacks the key", i);
        free(v);
    }
    h_expect(&c, "OK resource=acl:1 nodes=3", "UNLOCK acl:1");
    h_close(&c);
}
END_TEST

START_TEST(redis_wrong_password)
{
    struct h_client c;

    h_cluster_nodes(&K, 1, NULL);
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "CONFIG SET requirepass right"), 0);
    h_cluster_daemon_start(&K, nd++, "{\"redis\":{\"password\":\"wrong\","
                                     "\"reconnect_max_ms\":200}}");
    h_connect_tcp_ok(&c, D[0].port);
    h_expect(&c, "ERR UNAVAILABLE ", "LOCK pw:1");
    json_t *stats = h_ok_json(&c, "STATS");
    json_t *node = json_array_get(json_object_get(stats, "nodes"), 0);
    const char *err = h_json_str(node, "last_error");
    ck_assert_msg(strstr(err, "AUTH"), "last_error says \"%s\"", err);
    ck_assert(json_is_false(json_object_get(node, "up")));
    json_decref(stats);
    h_close(&c);
}
END_TEST

/* Release announcements only where someone waits (issue 11): an
 * uncontended UNLOCK publishes nothing; a waiter on another daemon, whose
 * busy answer marked the key, is woken by one announcement per node. */
static int announcements(redisContext *sub, int within_ms)
{
    struct timeval tv = { within_ms / 1000, (within_ms % 1000) * 1000 };
    redisReply *r;
    int n = 0;

    redisSetTimeout(sub, tv);
    while (redisGetReply(sub, (void **)&r) == REDIS_OK) {
        n += r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
             strcmp(r->element[0]->str, "message") == 0;
        freeReplyObject(r);
    }
    sub->err = 0;               /* the timeout: read on next time */
    return n;
}

START_TEST(publish_only_when_contended)
{
    struct h_client a, b;
    struct grant g;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    /* Its own retries come too late to pass for the announcement. */
    start_daemon("{\"locks\":{\"retry_ms\":5000}}");
    redisContext *sub = h_redis_connect(&R[0]);
    redisReply *r = redisCommand(sub, "SUBSCRIBE redlockd:released");
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
    h_connect_tcp_ok(&a, D[0].port);
    h_connect_tcp_ok(&b, D[1].port);

    for (int i = 0; i < 20; i++) {
        lock_ok(&a, "quiet", 10000, "", &g);
        h_expect(&a, "OK resource=quiet ", "UNLOCK quiet");
    }
    ck_assert_int_eq(announcements(sub, 300), 0);

    lock_ok(&a, "wanted", 10000, "", &g);
    /* Turned away without waiting: no mark, nothing to announce. */
    h_expect(&b, "ERR BUSY", "LOCK wanted");
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS %s",
                                 "lock:wanted waiting"), 0);
    h_sendf(&b, "LOCK wanted ttl=10000 wait=%d\n", h_scale(8000));
    h_sleep_ms(200);            /* b's busy answer marks the key */
    uint64_t t0 = h_now_ms();
    h_expect(&a, "OK resource=wanted ", "UNLOCK wanted");
    char *line = h_recv_line(&b, h_scale(5000));
    ck_assert_msg(h_starts(line, "OK resource=wanted "), "%s",
                  line ? line : "(nothing)");
    ck_assert_msg(h_since(t0) < 1000, "woken after %lld ms, not by the "
                  "announcement", h_since(t0));
    ck_assert_int_eq(announcements(sub, 300), 1);
    /* The mark went with the announcement. */
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS %s",
                                 "lock:wanted waiting"), 0);
    h_expect(&b, "OK resource=wanted ", "UNLOCK wanted");
    ck_assert_int_eq(announcements(sub, 300), 0);
    redisFree(sub);
    h_close(&a);
    h_close(&b);
}
END_TEST

/* ---- group commit ---- */

/* evalsha calls node i has answered (INFO commandstats). */
static long long evalsha_calls(int i)
{
    char *info = NULL;
    long long n = 0;

    h_redis_cmd(&R[i], &info, "INFO commandstats");
    const char *p = info ? strstr(info, "cmdstat_evalsha:calls=") : NULL;
    if (p)
        n = strtoll(p + strlen("cmdstat_evalsha:calls="), NULL, 10);
    free(info);
    return n;
}

/* The same command from clients 0..n-1 at once, then each reply, which
 * must start with want. */
static void burst_expect(int n, const char *want, const char *cmd)
{
    for (int i = 0; i < n; i++)
        h_sendf(&K.clients[i], "%s\n", cmd);
    for (int i = 0; i < n; i++) {
        char *l = h_recv_line(&K.clients[i], h_scale(5000));
        ck_assert_ptr_nonnull(l);
        ck_assert_msg(h_starts(l, want), "%s: %s", cmd, l);
    }
}

/* Requests that reach the daemon together go to each node as one call
 * (pool.c, "Group commit"), and each client still gets its own answer:
 * bursts of LOCKs from 8 connections, one resource among them a key of a
 * foreign type on every node (its client alone is refused), then bursts of
 * UNLOCKs. Fences all differ; the keys are the holders' and then gone; and
 * node 0 answered fewer calls than it was sent requests. Then the same
 * with shared holds of one resource, and with LOCKs of two resources. */
START_TEST(group_commit_burst)
{
    enum { BURSTS = 6, N = H_CLUSTER_CLIENTS };
    unsigned long long fences[BURSTS * N];
    int nf = 0;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    for (int i = 0; i < N; i++)
        h_cluster_client(&K, i, 0);
    for (int i = 0; i < K.nnodes; i++)
        h_redis_cmd(&R[i], NULL, "HSET lock:gc:0:3 f v");
    long long calls0 = evalsha_calls(0);
    int requests = 0;
    for (int b = 0; b < BURSTS; b++) {
        char res[N][32], tok[N][64];
        for (int i = 0; i < N; i++) {
            snprintf(res[i], sizeof(res[i]), "gc:%d:%d", b, i);
            h_sendf(&K.clients[i], "LOCK %s ttl=30000\n", res[i]);
        }
        for (int i = 0; i < N; i++) {
            char *l = h_recv_line(&K.clients[i], h_scale(5000));
            ck_assert_ptr_nonnull(l);
            if (b == 0 && i == 3) {
                ck_assert_msg(h_starts(l, "ERR "), "LOCK of a hash: %s", l);
                tok[i][0] = '\0';
                continue;
            }
            struct grant g;
            check_grant(l, res[i], 30000, &g);
            snprintf(tok[i], sizeof(tok[i]), "%s", g.token);
            fences[nf++] = g.fence;
            requests++;
        }
        for (int i = 0; i < N; i++)
            if (tok[i][0])
                assert_keys(all_nodes(), res[i], tok[i]);
        for (int i = 0; i < N; i++)
            if (tok[i][0])
                h_sendf(&K.clients[i], "UNLOCK %s\n", res[i]);
        for (int i = 0; i < N; i++) {
            if (!tok[i][0])
                continue;
            char *l = h_recv_line(&K.clients[i], h_scale(5000));
            ck_assert_ptr_nonnull(l);
            ck_assert_msg(h_starts(l, "OK resource="), "UNLOCK: %s", l);
            ck_assert_str_eq(h_kv(l, "nodes"), "3");
            requests++;
        }
        for (int i = 0; i < N; i++)
            if (tok[i][0])
                ck_assert(wait_keys_gone(all_nodes(), res[i], NULL,
                                         h_scale(1000)));
    }
    for (int i = 0; i < nf; i++)
        for (int j = i + 1; j < nf; j++)
            ck_assert_msg(fences[i] != fences[j], "fence %llu granted twice",
                          fences[i]);
    long long calls = evalsha_calls(0) - calls0;
    ck_assert_msg(calls < requests, "node 0 answered %lld calls for %d "
                  "requests: none grouped", calls, requests);

    /* Shared holds of one resource, in bursts: all granted, an exclusive
     * LOCK refused while they live, free again once all are released. */
    for (int b = 0; b < BURSTS; b++) {
        calls0 = evalsha_calls(0);
        burst_expect(N - 1, "OK resource=gs ", "LOCK gs mode=shared ttl=30000");
        h_expect(&K.clients[N - 1], "ERR BUSY", "LOCK gs ttl=30000");
        burst_expect(N - 1, "OK resource=gs ", "UNLOCK gs");
        h_expect(&K.clients[N - 1], "OK resource=gs ", "LOCK gs ttl=30000");
        h_expect(&K.clients[N - 1], "OK resource=gs ", "UNLOCK gs");
        calls = evalsha_calls(0) - calls0;
        ck_assert_msg(calls < 2 * (N - 1) + 3, "node 0 answered %lld calls "
                      "for %d requests: none grouped", calls, 2 * (N - 1) + 3);
    }

    /* LOCKs of two resources each, overlapping pairwise in turn: all or
     * none of each, every key the holder's. */
    for (int b = 0; b < BURSTS; b++) {
        char tok[N][64];
        int granted = 0;
        calls0 = evalsha_calls(0);
        for (int i = 0; i < N; i++)
            h_sendf(&K.clients[i], "LOCK gm:%d:%d gm:%d:%d ttl=30000\n", b,
                    i / 2, b, N + i);
        for (int i = 0; i < N; i++) {
            char *l = h_recv_line(&K.clients[i], h_scale(5000));
            ck_assert_ptr_nonnull(l);
            tok[i][0] = '\0';
            if (h_starts(l, "OK resources=2 ")) {
                h_kv_copy(l, "token", tok[i], sizeof(tok[i]));
                granted++;
            } else {
                ck_assert_msg(h_starts(l, "ERR BUSY"), "LOCK of two: %s", l);
            }
        }
        /* Of each pair after gm:b:(i/2), exactly one. */
        ck_assert_int_eq(granted, N / 2);
        for (int i = 0; i < N; i++) {
            if (!tok[i][0])
                continue;
            char r1[32], r2[32];
            snprintf(r1, sizeof(r1), "gm:%d:%d", b, i / 2);
            snprintf(r2, sizeof(r2), "gm:%d:%d", b, N + i);
            assert_keys(all_nodes(), r1, tok[i]);
            assert_keys(all_nodes(), r2, tok[i]);
            h_expect(&K.clients[i], "OK resources=2 nodes=3", "UNLOCK %s %s",
                     r1, r2);
        }
        calls = evalsha_calls(0) - calls0;
        ck_assert_msg(calls < N + 2 * (N / 2), "node 0 answered %lld calls "
                      "for %d requests: none grouped", calls, N + N);
    }
    /* STATS tells the two apart: each node was sent fewer calls than
     * requests. */
    json_t *stats = h_ok_json(&K.clients[0], "STATS");
    json_t *nodes = json_object_get(stats, "nodes");
    ck_assert_uint_eq(json_array_size(nodes), 3);
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        json_t *node = json_array_get(nodes, i);
        ck_assert_msg(h_json_int(node, "calls") > 0 &&
                      h_json_int(node, "calls") < h_json_int(node, "requests"),
                      "node %zu: %lld calls for %lld requests", i,
                      (long long)h_json_int(node, "calls"),
                      (long long)h_json_int(node, "requests"));
    }
    json_decref(stats);
    h_cluster_stop(&K);
}
END_TEST

static Suite *locks_suite(void)
{
    Suite *s = suite_create("locks");
    TCase *tc = tcase_create("locks");

    /* After every passing test (a failing one _exit()s its fork and the
     * harness's guardians clean up instead), a paused node, which would
     * hold the daemon's shutdown release until shutdown_timeout_ms, is
     * continued first; each daemon's exit status 0 is asserted. */
    h_cluster_fixture(tc, &K, 0, true);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, h_slow() ? 300 : 30);
    tcase_add_test(tc, basic_1node);
    tcase_add_test(tc, basic_3nodes);
    tcase_add_test(tc, disconnect_releases);
    tcase_add_test(tc, quit_releases);
    tcase_add_test(tc, two_daemons_exclude);
    tcase_add_test(tc, one_node_stopped);
    tcase_add_test(tc, two_nodes_stopped);
    tcase_add_test(tc, script_flush);
    tcase_add_test(tc, restart_one_of_three);
    tcase_add_test(tc, restart_single_node);
    tcase_add_test(tc, interop_set_nx);
    tcase_add_test(tc, extend_pttl_and_lost);
    tcase_add_test(tc, locks_and_status);
    tcase_add_test(tc, max_locks_per_session);
    tcase_add_test(tc, ttl_out_of_range);
    tcase_add_test(tc, durations_with_units);
    tcase_add_test(tc, stats_counters);
    tcase_add_test(tc, redis_password_and_db);
    tcase_add_test(tc, redis_acl_user);
    tcase_add_test(tc, redis_wrong_password);
    tcase_add_test(tc, publish_only_when_contended);
    tcase_add_test(tc, group_commit_burst);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(locks_suite());
}
