/*
 * test_proxy: the fault proxy (tests/tools/faultproxy.c) with real
 * redis-server nodes, and redlockd behind proxies (suite "fault").
 *
 * The proxy itself, a hiredis client talking through it:
 *   - it forwards: PING, a value four times the per-flow hold cap both ways,
 *     and a pipeline sent under a long delay is not overtaken by one sent
 *     after the delay was lowered (the node sees the commands in order);
 *   - `delay` holds each direction (a PING takes two delays, `delay-up`
 *     and `delay-down` one each), `pass` makes it fast again;
 *   - `blackhole` makes a PING time out, also on a connection opened
 *     during it, and `pass` restores; `blackhole hold` delivers what it held
 *     once passed, `blackhole drop` loses it and the stream goes on; a
 *     flood into a blackhole is held only up to the per-flow cap;
 *   - `reset` breaks an open connection and reconnecting works; `refuse`
 *     breaks new connections only;
 *   - bad control lines get ERR, a target off 127.0.0.1 is refused, and
 *     SIGTERM exits 0 (under ASan also: no leaks).
 *
 * The daemon behind three proxies (today's behaviour, which the fault
 * suite builds on):
 *   - one node slower than redis.command_timeout_ms: LOCK still succeeds
 *     on the other two, and STATS counts that node's timeouts;
 *   - two nodes whose replies come in time for the command timeout but
 *     after the ttl has run out: ERR UNAVAILABLE, never an OK with a
 *     validity that is already used up;
 *   - FORCEUNLOCK with one node slow: the holder on the same daemon is
 *     told at once, not after the slowest node answered;
 *   - LOCK and EXTEND with one node slow are answered as soon as the two
 *     fast nodes decided, not after the slow one; an UNLOCK right after
 *     the LOCK deletes the key everywhere (nodes=3), the slow node
 *     included, which ran the acquisition first.
 *
 * Lower time bounds (how long the proxy must hold) are exact, the proxy
 * never lets a chunk leave early; upper bounds are generous.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "harness.h"

#define NNODES 3
#define NCONTEXTS 4
#define HOLD_CAP_BYTES (256 * 1024)     /* faultproxy.c FLOW_HOLD_MAX */
#define BIG_VALUE_BYTES (4 * HOLD_CAP_BYTES)
#define FLOOD_BYTES (8 * HOLD_CAP_BYTES)
#define ORDER_BATCH 50

/* Its nodes, a proxy X[i] before each node i, daemon D, its client C and
 * a raw client for proxies (harness.h). */
static struct h_cluster K = { .nnodes = NNODES };
static struct h_redis *const N = K.nodes;
static struct h_proxy *const X = K.proxies;
static struct h_daemon *const D = &K.daemons[0];
static struct h_client *const C = &K.clients[0];
static struct h_client *const raw = &K.clients[1];
static redisContext *R[NCONTEXTS];

/* ---- helpers ----------------------------------------------------------- */

static void teardown(void)
{
    for (int i = 0; i < NCONTEXTS; i++) {
        if (R[i])
            redisFree(R[i]);
        R[i] = NULL;
    }
    h_cluster_cleanup(&K);
}

/* A hiredis connection to 127.0.0.1:port kept in R[slot] (freed by the
 * teardown); it may have failed (c->err), which some tests expect. */
static redisContext *rconnect(int slot, int port, int timeout_ms)
{
    struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
    redisContext *c;

    if (R[slot])
        redisFree(R[slot]);
    c = redisConnectWithTimeout("127.0.0.1", port, tv);
    ck_assert_msg(c, "hiredis: out of memory");
    if (c->err == 0)
        redisSetTimeout(c, tv);
    R[slot] = c;
    return c;
}

/* PING on c: true for PONG; the time it took goes to *ms when not NULL. */
static bool ping(redisContext *c, long long *ms)
{
    uint64_t t0 = h_now_ms();
    redisReply *r = c->err == 0 ? redisCommand(c, "PING") : NULL;
    bool ok = r && r->type == REDIS_REPLY_STATUS &&
              strcmp(r->str, "PONG") == 0;

    if (ms)
        *ms = h_since(t0);
    if (r)
        freeReplyObject(r);
    return ok;
}

/* The round trip of a PING that must succeed. */
static long long ping_ms(redisContext *c)
{
    long long ms;

    ck_assert_msg(ping(c, &ms), "PING through the proxy failed: %s",
                  c->err != 0 ? c->errstr : "bad reply");
    return ms;
}

/* One numeric field of the proxy's stats line. */
static long long proxy_stat(struct h_proxy *p, const char *key)
{
    const char *line = h_proxy_ctl(p, "stats");
    const char *v = h_kv(line, key);

    ck_assert_msg(v, "no %s= in \"%s\"", key, line);
    return atoll(v);
}

/* Write everything hiredis has buffered (pipelined commands) now. */
static void rflush(redisContext *c)
{
    int done = 0;

    while (!done)
        ck_assert_msg(redisBufferWrite(c, &done) == REDIS_OK, "write: %s",
                      c->errstr);
}

/* Send up to `bytes` of PINGs without blocking: as much as the kernel
 * takes (the far side may have stopped reading). */
static void flood(struct h_client *c, size_t bytes)
{
    static const char ping_line[] = "PING\r\n";
    char buf[6 * 1024];
    size_t sent = 0;

    for (size_t i = 0; i + sizeof(ping_line) - 1 <= sizeof(buf); i += sizeof(ping_line) - 1)
        memcpy(buf + i, ping_line, sizeof(ping_line) - 1);
    while (sent < bytes) {
        ssize_t n = send(c->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        ck_assert_msg(n > 0, "flood: %s", strerror(errno));
        sent += (size_t)n;
    }
}

static void start_one(void)
{
    h_cluster_nodes(&K, 1, NULL);
    h_cluster_proxy(&K, 0, 0);
}

/* ---- the proxy itself -------------------------------------------------- */

START_TEST(forwards_in_order)
{
    char *big = malloc(BIG_VALUE_BYTES);
    redisContext *c, *direct;
    redisReply *r;

    ck_assert_ptr_nonnull(big);
    for (size_t i = 0; i < BIG_VALUE_BYTES; i++)
        big[i] = (char)('a' + i % 23);
    start_one();
    c = rconnect(0, X[0].port, 5000);
    ck_assert_msg(c->err == 0, "connect through the proxy: %s", c->errstr);
    ping_ms(c);

    /* More than the cap each way: back-pressure, not loss. */
    r = redisCommand(c, "SET big %b", big, (size_t)BIG_VALUE_BYTES);
    ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "SET big failed");
    freeReplyObject(r);
    r = redisCommand(c, "GET big");
    ck_assert_msg(r && r->type == REDIS_REPLY_STRING &&
                  r->len == BIG_VALUE_BYTES &&
                  memcmp(r->str, big, BIG_VALUE_BYTES) == 0,
                  "GET big did not return the value");
    freeReplyObject(r);
    free(big);
    ck_assert_int_ge(proxy_stat(&X[0], "up_bytes"), BIG_VALUE_BYTES);
    ck_assert_int_ge(proxy_stat(&X[0], "down_bytes"), BIG_VALUE_BYTES);
    ck_assert_int_eq(proxy_stat(&X[0], "open"), 1);

    /* A batch sent under 200 ms, then one under 0 ms: FIFO per flow. */
    h_proxy_ctl(&X[0], "delay 200");
    for (int i = 0; i < ORDER_BATCH; i++)
        redisAppendCommand(c, "RPUSH order %d", i);
    rflush(c);
    h_proxy_ctl(&X[0], "delay 0");
    for (int i = ORDER_BATCH; i < 2 * ORDER_BATCH; i++)
        redisAppendCommand(c, "RPUSH order %d", i);
    rflush(c);
    for (int i = 0; i < 2 * ORDER_BATCH; i++) {
        void *reply = NULL;

        ck_assert_msg(redisGetReply(c, &reply) == REDIS_OK, "RPUSH %d: %s", i,
                      c->errstr);
        freeReplyObject(reply);
    }
    direct = h_redis_connect(&N[0]);
    r = redisCommand(direct, "LRANGE order 0 -1");
    ck_assert_msg(r && r->type == REDIS_REPLY_ARRAY &&
                  r->elements == 2 * ORDER_BATCH, "LRANGE order");
    for (int i = 0; i < 2 * ORDER_BATCH; i++)
        ck_assert_msg(atoi(r->element[i]->str) == i,
                      "the node saw command %s at position %d (overtaken)",
                      r->element[i]->str, i);
    freeReplyObject(r);
    redisFree(direct);

    ck_assert_int_eq(h_proxy_stop(&X[0]), 0);
}
END_TEST

START_TEST(control_errors)
{
    static const char *const bad[] = {
        "", "bogus", "delay", "delay -1", "delay 1.5", "delay 10s",
        "delay 3600001", "delay 99999999999", "delay-up", "blackhole sideways",
        "pass now", "delay 1 2 3",
    };
    char out[1024], line[400];
    char target[] = "10.1.2.3:6379";
    char *argv[] = { (char *)h_proxy_bin(), "-l", "0", "-t", target, "-c",
                     "/nonexistent/ctl", NULL };

    start_one();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *reply = h_proxy_try(&X[0], "%s", bad[i]);

        ck_assert_msg(h_starts(reply, "ERR "), "\"%s\" answered \"%s\"", bad[i],
                      reply);
    }
    ck_assert_msg(strstr(h_proxy_ctl(&X[0], "help"), " blackhole"),
                  "help lists no blackhole");
    ck_assert_str_eq(h_proxy_ctl(&X[0], "DELAY 5"),
                     "OK blackhole=off refuse=0 delay_up=5 delay_down=5");
    ck_assert_str_eq(h_proxy_ctl(&X[0], "blackhole drop"),
                     "OK blackhole=drop refuse=0 delay_up=5 delay_down=5");
    ck_assert_str_eq(h_proxy_ctl(&X[0], "pass"),
                     "OK blackhole=off refuse=0 delay_up=0 delay_down=0");

    /* An overlong line: one ERR, then the control connection closes. */
    memset(line, 'x', sizeof(line) - 1);
    line[sizeof(line) - 1] = '\0';
    h_connect_unix_ok(raw, X[0].ctl);
    h_sendf(raw, "%s\n", line);
    ck_assert_str_eq(h_recv_line(raw, 2000), "ERR line too long");
    ck_assert_msg(h_wait_eof(raw, 2000), "control stayed open after ERR");
    h_close(raw);
    /* Several commands on one connection, pipelined. */
    h_connect_unix_ok(raw, X[0].ctl);
    h_sendf(raw, "delay-up 7\r\ndelay-down 9\nstats\n");
    ck_assert(h_starts(h_recv_line(raw, 2000), "OK "));
    ck_assert(h_starts(h_recv_line(raw, 2000), "OK "));
    ck_assert_str_eq(h_kv(h_recv_line(raw, 2000), "delay_down"), "9");
    h_close(raw);

    /* Loopback only, for the target as for the listener. */
    ck_assert_int_eq(h_run(argv, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "only 127.0.0.1"), "output: %s", out);
    snprintf(target, sizeof(target), "127.0.0.2:1");
    ck_assert_int_eq(h_run(argv, out, sizeof(out)), 2);
    argv[4] = "6379x";
    ck_assert_int_eq(h_run(argv, out, sizeof(out)), 2);

    ck_assert_int_eq(h_proxy_stop(&X[0]), 0);
}
END_TEST

START_TEST(delays)
{
    redisContext *c;
    long long ms;

    start_one();
    c = rconnect(0, X[0].port, 5000);
    ck_assert_msg(c->err == 0, "connect through the proxy: %s", c->errstr);
    ping_ms(c);

    h_proxy_ctl(&X[0], "delay 300");
    ms = ping_ms(c);
    ck_assert_msg(ms >= 600, "delay 300 (both ways): PING took %lld ms", ms);
    ck_assert_msg(ms < 3000, "delay 300: PING took %lld ms", ms);

    h_proxy_ctl(&X[0], "pass");
    h_proxy_ctl(&X[0], "delay-up 300");
    ms = ping_ms(c);
    ck_assert_msg(ms >= 300 && ms < 2000, "delay-up 300: PING took %lld ms", ms);

    h_proxy_ctl(&X[0], "delay-up 0");
    h_proxy_ctl(&X[0], "delay-down 200");
    ms = ping_ms(c);
    ck_assert_msg(ms >= 200 && ms < 2000, "delay-down 200: PING took %lld ms", ms);

    h_proxy_ctl(&X[0], "pass");
    ms = ping_ms(c);
    ck_assert_msg(ms < 250, "after pass: PING took %lld ms", ms);
    ck_assert_int_eq(h_proxy_stop(&X[0]), 0);
}
END_TEST

START_TEST(blackhole)
{
    redisContext *before, *during;
    long long ms, held;
    char *line;

    start_one();
    before = rconnect(0, X[0].port, 500);
    ck_assert_msg(before->err == 0, "connect through the proxy: %s", before->errstr);
    ping_ms(before);

    h_proxy_ctl(&X[0], "blackhole");
    ck_assert_msg(!ping(before, &ms), "PING answered through a blackhole");
    ck_assert_msg(ms >= 450, "the blackholed PING failed after only %lld ms", ms);
    /* The kernel completes the handshake, so connecting still works; the
     * connection is silent. */
    during = rconnect(1, X[0].port, 500);
    ck_assert_msg(during->err == 0, "connect during blackhole: %s", during->errstr);
    ck_assert_msg(!ping(during, NULL), "PING answered through a blackhole");
    h_proxy_ctl(&X[0], "pass");
    ping_ms(rconnect(2, X[0].port, 2000));

    /* hold: what was sent meanwhile arrives once passed. */
    h_connect_tcp_ok(raw, X[0].port);
    h_proxy_ctl(&X[0], "blackhole hold");
    h_sendf(raw, "PING\r\n");
    ck_assert_ptr_null(h_recv_line(raw, 300));
    ck_assert_int_gt(proxy_stat(&X[0], "held_up"), 0);
    h_proxy_ctl(&X[0], "pass");
    line = h_recv_line(raw, 2000);
    ck_assert_msg(h_starts(line, "+PONG"), "held PING answered \"%s\"",
                  line ? line : "(nothing)");

    /* drop: it is lost, and the connection carries on. */
    h_proxy_ctl(&X[0], "blackhole drop");
    h_sendf(raw, "PING\r\n");
    ck_assert_ptr_null(h_recv_line(raw, 300));
    h_proxy_ctl(&X[0], "pass");
    ck_assert_ptr_null(h_recv_line(raw, 300));
    ck_assert_int_ge(proxy_stat(&X[0], "dropped_up"), 6);
    h_sendf(raw, "PING\r\n");
    line = h_recv_line(raw, 2000);
    ck_assert_msg(h_starts(line, "+PONG"), "PING after drop answered \"%s\"",
                  line ? line : "(nothing)");

    /* The hold is capped: past it the proxy stops reading (the sender's
     * kernel buffers fill), it does not grow. */
    h_proxy_ctl(&X[0], "blackhole hold");
    flood(raw, FLOOD_BYTES);
    h_sleep_ms(200);
    held = proxy_stat(&X[0], "held_up");
    ck_assert_msg(held > HOLD_CAP_BYTES / 4 && held <= HOLD_CAP_BYTES,
                  "held_up=%lld under a flood, cap %d", held, HOLD_CAP_BYTES);
    h_close(raw);
    ck_assert_int_eq(h_proxy_stop(&X[0]), 0);
}
END_TEST

START_TEST(reset_and_refuse)
{
    redisContext *c, *kept, *late;
    const char *reply;

    start_one();
    c = rconnect(0, X[0].port, 2000);
    ck_assert_msg(c->err == 0, "connect through the proxy: %s", c->errstr);
    ping_ms(c);
    reply = h_proxy_ctl(&X[0], "reset");
    ck_assert_msg(strcmp(h_kv(reply, "reset"), "1") == 0, "reset: %s", reply);
    ck_assert_msg(!ping(c, NULL), "PING worked on a reset connection");
    ping_ms(rconnect(0, X[0].port, 2000));

    /* refuse: new connections are reset, open ones carry on. */
    kept = rconnect(1, X[0].port, 2000);
    ck_assert_msg(kept->err == 0, "connect through the proxy: %s", kept->errstr);
    h_proxy_ctl(&X[0], "refuse");
    late = rconnect(2, X[0].port, 2000);
    ck_assert_msg(late->err != 0 || !ping(late, NULL),
                  "a connection made under refuse works");
    ping_ms(kept);
    ck_assert_int_ge(proxy_stat(&X[0], "refused"), 1);
    h_proxy_ctl(&X[0], "pass");
    ping_ms(rconnect(2, X[0].port, 2000));
    ck_assert_int_eq(proxy_stat(&X[0], "resets"), 1);
    ck_assert_int_eq(h_proxy_stop(&X[0]), 0);
}
END_TEST

/* ---- redlockd behind proxies -------------------------------------------- */

/* Three nodes, a proxy before each, a daemon that sees only the proxies. */
static void start_daemon(const char *extra_json)
{
    h_cluster_nodes(&K, NNODES, NULL);
    h_cluster_proxy_all(&K, 0);
    h_cluster_daemon(&K, 0, extra_json, h_scale(5000));
    h_cluster_client(&K, 0, 0);
}

/* STATS nodes[i] (asserted to be proxy i), one field as an integer or
 * boolean (0/1). */
static long long node_stat(int i, const char *key)
{
    json_t *o = h_ok_json(C, "STATS");
    json_t *n = json_array_get(json_object_get(o, "nodes"), (size_t)i);
    char want[32];
    json_t *v;
    long long r;

    ck_assert_msg(json_is_object(n), "STATS has no nodes[%d]", i);
    snprintf(want, sizeof(want), "127.0.0.1:%d", X[i].port);
    ck_assert_str_eq(h_json_str(n, "node"), want);
    v = json_object_get(n, key);
    ck_assert_msg(json_is_integer(v) || json_is_boolean(v),
                  "STATS nodes[%d].%s is not a number", i, key);
    r = json_is_integer(v) ? (long long)json_integer_value(v) : json_is_true(v);
    json_decref(o);
    return r;
}

static long long acquisitions(const char *key)
{
    json_t *o = h_ok_json(C, "STATS");
    json_t *acq = json_object_get(o, "acquisitions");
    long long v;

    ck_assert_msg(json_is_object(acq), "STATS has no acquisitions");
    v = h_json_int(acq, key);
    json_decref(o);
    return v;
}

/* LOCK that must succeed; returns its validity, checked to be in (0, max]. */
static long long lock_ok(const char *res, long long ttl, long long max)
{
    char *line = h_expect(C, "OK ", "LOCK %s ttl=%lld", res, ttl);
    const char *v = h_kv(line, "validity");
    long long validity;

    ck_assert_msg(v, "LOCK %s: no validity in \"%s\"", res, line);
    validity = atoll(v);
    ck_assert_msg(validity > 0 && validity <= max,
                  "LOCK %s ttl=%lld: validity %lld, want 1..%lld", res, ttl,
                  validity, max);
    return validity;
}

START_TEST(daemon_slow_node_times_out)
{
    const int timeout_ms = 100;
    long long before, timeouts = 0;
    uint64_t t0;
    char json[160];

    snprintf(json, sizeof(json),
             "{\"redis\":{\"command_timeout_ms\":%d,\"reconnect_max_ms\":200}}",
             timeout_ms);
    start_daemon(json);
    before = node_stat(0, "timeouts");
    h_proxy_ctl(&X[0], "delay %d", 3 * timeout_ms);

    /* The first LOCK still finds node 0 up and waits out its timeout; the
     * later ones find it down or reconnecting. All succeed on 1 and 2. */
    for (int i = 0; i < 4; i++) {
        char res[32];

        snprintf(res, sizeof(res), "slow:%d", i);
        lock_ok(res, 10000, 10000);
        h_expect(C, "OK ", "UNLOCK %s", res);
    }
    t0 = h_now_ms();
    while (h_since(t0) < h_scale(3000)) {
        timeouts = node_stat(0, "timeouts");
        if (timeouts > before)
            break;
        h_sleep_ms(20);
    }
    ck_assert_msg(timeouts > before, "node 0 timeouts stayed at %lld", before);
    ck_assert_msg(node_stat(1, "voting") && node_stat(2, "voting"),
                  "the fast nodes stopped voting");

    /* Healed: the node votes again and LOCK uses it. */
    h_proxy_ctl(&X[0], "pass");
    h_wait_voting(D, NNODES, h_scale(5000));
    lock_ok("slow:healed", 10000, 10000);
    ck_assert_int_eq(h_daemon_finish(D), 0);
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_eq(h_proxy_stop(&X[i]), 0);
}
END_TEST

START_TEST(daemon_slow_quorum_unavailable)
{
    /* Replies from nodes 0 and 1 come back >= 300 ms after the request:
     * well inside command_timeout_ms, so they are votes, but after every
     * ttl tried here has run out. */
    static const char *const faults[] = { "delay 150", "delay-down 300" };
    static const int ttls[] = { 100, 150, 200, 250, 290 };
    const int rtt_ms = 300;
    long long unavailable = 0;

    start_daemon("{\"redis\":{\"command_timeout_ms\":2000}}");
    for (size_t f = 0; f < sizeof(faults) / sizeof(faults[0]); f++) {
        h_proxy_ctl(&X[0], "pass");
        h_proxy_ctl(&X[1], "pass");
        h_proxy_ctl(&X[0], "%s", faults[f]);
        h_proxy_ctl(&X[1], "%s", faults[f]);
        for (size_t i = 0; i < sizeof(ttls) / sizeof(ttls[0]); i++) {
            char *line = h_cmd(C, "LOCK late:%zu:%zu ttl=%d", f, i, ttls[i]);

            ck_assert_msg(!h_starts(line, "OK"),
                          "%s on 2 of 3 nodes, ttl=%d: \"%s\" (validity used up)",
                          faults[f], ttls[i], line);
            ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"),
                          "%s on 2 of 3 nodes, ttl=%d: \"%s\"", faults[f],
                          ttls[i], line);
            unavailable++;
        }
    }
    ck_assert_int_eq(acquisitions("unavailable"), unavailable);
    ck_assert_int_eq(acquisitions("ok"), 0);
    if (!h_slow()) {
        /* Votes that came late, not votes that timed out. */
        ck_assert_int_eq(node_stat(0, "timeouts"), 0);
        ck_assert_int_eq(node_stat(1, "timeouts"), 0);
    }

    /* A ttl that outlasts the slow round trip: OK, the time taken off. */
    lock_ok("late:ok", 5000, 5000 - rtt_ms);
    h_expect(C, "OK ", "UNLOCK late:ok");
    ck_assert_int_eq(h_daemon_finish(D), 0);
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_eq(h_proxy_stop(&X[i]), 0);
}
END_TEST

/* FORCEUNLOCK with one node 300 ms away each way: the holder on the same
 * daemon hears EVENT LOST before the slow node has even received the
 * delete, not after the slowest node answered (the waiter on another
 * daemon can be granted as soon as a quorum deleted). */
START_TEST(forceunlock_tells_local_holder_first)
{
    struct h_client *adm;
    const char *line;
    uint64_t t0;
    long long lost_ms, ok_ms;

    start_daemon("{\"redis\":{\"command_timeout_ms\":3000},"
                 "\"auth\":{\"admin_password\":\"adm\"}}");
    adm = h_cluster_client(&K, 2, 0);
    h_expect(adm, "OK", "AUTH adm");
    h_expect(C, "OK resource=fx ", "LOCK fx ttl=20000");
    h_proxy_ctl(&X[0], "delay 300");
    t0 = h_now_ms();
    h_sendf(adm, "FORCEUNLOCK fx\n");
    ck_assert_msg(h_expect_event(C, "EVENT LOST resource=fx ", 5000),
                  "the holder was not told");
    lost_ms = h_since(t0);
    line = h_recv_line(adm, 5000);
    ok_ms = h_since(t0);
    ck_assert_msg(line && h_starts(line, "OK resource=fx nodes=3"),
                  "FORCEUNLOCK fx: \"%s\"", line ? line : "(nothing)");
    ck_assert_msg(ok_ms >= 600, "FORCEUNLOCK answered after %lld ms: the "
                  "slow node was not slow", ok_ms);
    ck_assert_msg(lost_ms < 300, "the holder heard EVENT LOST %lld ms after "
                  "FORCEUNLOCK (the answer came after %lld ms)", lost_ms,
                  ok_ms);
    h_proxy_ctl(&X[0], "pass");
    h_close(adm);
    ck_assert_int_eq(h_daemon_finish(D), 0);
}
END_TEST

/* Node 0 300 ms away each way: a grant and an EXTEND need only the two
 * fast nodes; an UNLOCK right after the grant, while the slow node's vote
 * is still out, goes there behind the acquisition, and deletes the key
 * everywhere. */
START_TEST(answers_at_quorum)
{
    const int slow = 300;
    uint64_t t0;
    long long ms;
    char *line;

    start_daemon("{\"redis\":{\"command_timeout_ms\":3000}}");
    h_proxy_ctl(&X[0], "delay %d", slow);

    t0 = h_now_ms();
    lock_ok("q:1", 10000, 10000);
    ms = h_since(t0);
    ck_assert_msg(ms < slow, "LOCK took %lld ms: it waited for the slow "
                  "node", ms);
    line = h_expect(C, "OK resource=q:1 ", "UNLOCK q:1");
    ms = h_since(t0);
    ck_assert_msg(h_starts(line, "OK resource=q:1 nodes=3"),
                  "UNLOCK q:1 right after LOCK: \"%s\"", line);
    ck_assert_msg(ms >= 2 * slow, "LOCK + UNLOCK took %lld ms: UNLOCK did "
                  "not wait for the slow node's release", ms);
    ck_assert_int_eq(h_redis_cmd(&N[0], NULL, "EXISTS lock:q:1"), 0);

    lock_ok("q:2", 10000, 10000);
    h_sleep_ms(3 * slow);       /* the slow node's vote is in */
    t0 = h_now_ms();
    line = h_expect(C, "OK resource=q:2 ", "EXTEND q:2 ttl=20000");
    ms = h_since(t0);
    ck_assert_msg(ms < slow, "EXTEND took %lld ms: it waited for the slow "
                  "node (%s)", ms, line);
    h_expect(C, "OK resource=q:2 nodes=3", "UNLOCK q:2");
    ck_assert_int_eq(h_redis_cmd(&N[0], NULL, "EXISTS lock:q:2"), 0);
    h_proxy_ctl(&X[0], "pass");
    ck_assert_int_eq(h_daemon_finish(D), 0);
}
END_TEST

static Suite *proxy_suite(void)
{
    Suite *s = suite_create("proxy");
    TCase *tc = tcase_create("proxy");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, forwards_in_order);
    tcase_add_test(tc, control_errors);
    tcase_add_test(tc, delays);
    tcase_add_test(tc, blackhole);
    tcase_add_test(tc, reset_and_refuse);
    tcase_add_test(tc, daemon_slow_node_times_out);
    tcase_add_test(tc, daemon_slow_quorum_unavailable);
    tcase_add_test(tc, forceunlock_tells_local_holder_first);
    tcase_add_test(tc, answers_at_quorum);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(proxy_suite());
}
