/*
 * test_lease: the lease lifecycle of the real redlockd binary against three
 * real redis-server nodes (suite "integration").
 *
 * Each test starts fresh nodes and daemon(s) and checks behaviour a client
 * can observe over the wire and on the Redis nodes:
 *   - renewal: a ttl=1000 lease outlives its ttl for as long as its session
 *     lives (PTTL stays positive on every node, others get BUSY), and is
 *     free soon after the holder disconnects;
 *   - renew=0: the lease ends with EVENT LOST reason=expired after its ttl,
 *     and a later UNLOCK answers ERR LOST;
 *   - waiting: five waiters are granted in arrival order; a waiter is woken
 *     promptly by a release on a second daemon (pub/sub, the delay is
 *     printed) and by the expiry of a plain SET NX key; ERR TIMEOUT on
 *     time; a waiter that disconnects is dropped and leaves no key; a
 *     waiting LOCK delays only its own connection and keeps reply order;
 *   - lock_delay_ms: a dropped holder's lock stays taken for the delay, an
 *     UNLOCK or QUIT frees it at once;
 *   - HELLO keepalive: silence ends the session and frees its locks, PINGs
 *     keep it alive.
 *
 * Timing bounds are generous (shared CI machines are noisy) and stretched
 * when the daemon runs under REDLOCKD_TEST_WRAPPER (valgrind).
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "harness.h"

#define NNODES 3

/* Its nodes (started before each test), daemons 0 and 1 and the clients
 * (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;

/* ---- helpers ----------------------------------------------------------- */

/* An upper time bound for an assertion: valgrind slows the daemon down a
 * lot, so bounds on how soon it reacts are relaxed then. Lower bounds
 * (how long it must wait) are never stretched. */
static long long T(long long ms)
{
    return h_slow() ? ms * 3 : ms;
}

static long long status_waiters(struct h_client *c, const char *res)
{
    json_t *o = h_ok_json(c, "STATUS %s", res);
    long long w = h_json_int(o, "waiters");

    json_decref(o);
    return w;
}

/* Poll STATUS until `want` requests wait for `res` on that daemon: this is
 * how the tests know a LOCK ... wait= has arrived before they go on. */
static void wait_waiters(struct h_client *mon, const char *res, long long want)
{
    uint64_t t0 = h_now_ms();
    long long w;

    while ((w = status_waiters(mon, res)) != want) {
        ck_assert_msg(h_since(t0) < T(3000), "STATUS %s: %lld waiters, want %lld",
                      res, w, want);
        h_sleep_ms(10);
    }
}

/* The token lock:<res> holds on node i (the value's first word: a holder
 * label follows it), or "" when there is none. */
static void node_get(int i, const char *res, char *out, size_t size)
{
    char *s = NULL;
    long long rc = h_redis_cmd(&N[i], &s, "GET lock:%s", res);

    ck_assert_msg(rc == 0 || rc == -2, "GET lock:%s on node %d: %s", res, i,
                  s ? s : "?");
    snprintf(out, size, "%s", s ? s : "");
    out[strcspn(out, " ")] = '\0';
    free(s);
}

/* Assert every node holds `token` under lock:<res> ("" = no key at all). */
static void assert_keys(const char *res, const char *token)
{
    for (int i = 0; i < NNODES; i++) {
        char v[512];

        node_get(i, res, v, sizeof(v));
        ck_assert_msg(strcmp(v, token) == 0, "node %d: lock:%s is \"%s\", want \"%s\"",
                      i, res, v, token);
    }
}

/* LOCK <res> (wait=0) every `every_ms` until OK; returns the ms it took or
 * -1 when `timeout_ms` ran out. Anything but OK or BUSY fails. */
static long long lock_until_ok(struct h_client *c, const char *res, int every_ms,
                               long long timeout_ms)
{
    uint64_t t0 = h_now_ms();

    for (;;) {
        char *line = h_cmd(c, "LOCK %s", res);

        if (h_starts(line, "OK resource="))
            return h_since(t0);
        ck_assert_msg(h_starts(line, "ERR BUSY "), "LOCK %s answered \"%s\"", res, line);
        if (h_since(t0) >= timeout_ms)
            return -1;
        h_sleep_ms(every_ms);
    }
}

/* ---- renewal ------------------------------------------------------------ */

START_TEST(renewal_outlives_ttl)
{
    const char *res = "lease:renew";
    struct h_client *a, *b;
    uint64_t t0;
    long long took;
    int polls = 0;
    json_t *o, *locks, *l;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    h_expect(a, "OK resource=lease:renew ", "LOCK %s ttl=1000", res);
    /* Four ttls: without renewal the keys would be gone after one. */
    t0 = h_now_ms();
    while (h_since(t0) < 4000) {
        h_expect(b, "ERR BUSY ", "LOCK %s", res);
        for (int i = 0; i < NNODES; i++) {
            long long pttl = h_redis_cmd(&N[i], NULL, "PTTL lock:%s", res);

            ck_assert_msg(pttl > 0 && pttl <= 1000,
                          "%lld ms after LOCK ttl=1000: PTTL lock:%s on node %d is %lld",
                          h_since(t0), res, i, pttl);
        }
        polls++;
        h_sleep_ms(250);
    }
    ck_assert_msg(!h_expect_event(a, "EVENT", 1),
                  "unexpected event while renewing: %s", a->line);
    o = h_ok_json(a, "LOCKS");
    locks = json_object_get(o, "locks");
    ck_assert_msg(json_array_size(locks) == 1, "LOCKS: %zu locks, want 1",
                  json_array_size(locks));
    l = json_array_get(locks, 0);
    ck_assert_str_eq(json_string_value(json_object_get(l, "resource")), res);
    ck_assert_msg(h_json_int(l, "renewals") > 0, "LOCKS shows no renewals after 4 s");
    ck_assert_msg(h_json_int(l, "validity") > 0, "LOCKS shows no validity left");
    json_decref(o);
    fprintf(stderr, "renewal: %d BUSY polls over 4 s\n", polls);

    /* The holder goes away without a word: the lock is free at once. */
    h_close(a);
    took = lock_until_ok(b, res, 50, T(3000));
    ck_assert_msg(took >= 0 && took <= T(1000),
                  "lock not free %lld ms after the holder disconnected", took);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(renew0_expires_with_event)
{
    const char *res = "lease:once";
    struct h_client *a, *b;
    char fence[32];
    char *line;
    uint64_t t0;
    long long dt, took;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    line = h_expect(a, "OK resource=lease:once ", "LOCK %s ttl=500 renew=0", res);
    t0 = h_now_ms();
    h_kv_copy(line, "fence", fence, sizeof(fence));
    long long validity = atoll(h_kv(line, "validity"));
    line = h_expect_event(a, "EVENT LOST resource=lease:once ", 3000);
    dt = h_since(t0);
    ck_assert_msg(line, "no EVENT LOST for a renew=0 lease with ttl=500");
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    ck_assert_str_eq(h_kv(line, "reason"), "expired");
    fprintf(stderr, "renew=0 ttl=500 validity=%lld: EVENT LOST after %lld "
            "ms\n", validity, dt);
    /* The lease is given up before its validity ends (by a margin of at
     * most ttl/4 = 125 ms), never after the keys could expire. */
    ck_assert_msg(dt <= validity + T(50) && dt >= (validity - 125) / 2,
                  "EVENT LOST arrived %lld ms after the grant; validity was "
                  "%lld", dt, validity);
    h_expect(a, "ERR LOST ", "UNLOCK %s", res);
    /* The session really let go: the resource is free for others once the
     * keys expire by their ttl (a lost lease's keys are not deleted). */
    took = lock_until_ok(b, res, 10, T(2000));
    ck_assert_msg(took >= 0 && took <= T(500), "lost lease not free after %lld ms",
                  took);
    h_cluster_stop(&K);
}
END_TEST

/* ---- waiting ------------------------------------------------------------ */

START_TEST(waiters_fifo)
{
    const char *res = "lease:fifo";
    struct h_client *h, *mon, *w[5];
    int order[5];
    unsigned long long last_fence = 0;
    char got[64] = "";

    h_cluster_daemon(&K, 0, NULL, T(5000));
    h = h_cluster_client(&K, 0, 0);
    mon = h_cluster_client(&K, 6, 0);
    for (int i = 0; i < 5; i++)
        w[i] = h_cluster_client(&K, 1 + i, 0);
    h_expect(h, "OK resource=lease:fifo ", "LOCK %s", res);
    /* One after another: each is queued before the next is sent. */
    for (int i = 0; i < 5; i++) {
        h_sendf(w[i], "LOCK %s wait=10000\n", res);
        wait_waiters(mon, res, i + 1);
    }
    h_expect(h, "OK resource=lease:fifo ", "UNLOCK %s", res);
    for (int round = 0; round < 5; round++) {
        char *line = NULL;
        int i = h_wait_any_line(w, 5, T(5000), &line);
        int other;

        ck_assert_msg(i >= 0, "round %d: no waiter was granted %s (order so far: %s)",
                      round, res, got);
        ck_assert_msg(h_starts(line, "OK resource=lease:fifo "),
                      "waiter %d answered \"%s\"", i, line);
        ck_assert_msg(strtoull(h_kv(line, "fence"), NULL, 10) > last_fence,
                      "fence did not increase: %s", line);
        last_fence = strtoull(h_kv(line, "fence"), NULL, 10);
        order[round] = i;
        snprintf(got + strlen(got), sizeof(got) - strlen(got), "%d ", i + 1);
        /* Exclusive: nobody else may be granted while this one holds it. */
        other = h_wait_any_line(w, 5, 100, &line);
        ck_assert_msg(other < 0, "waiter %d got \"%s\" while waiter %d held %s",
                      other + 1, other >= 0 ? line : "", i + 1, res);
        h_expect(w[i], "OK resource=lease:fifo ", "UNLOCK %s", res);
    }
    fprintf(stderr, "grant order: %s\n", got);
    for (int round = 0; round < 5; round++)
        ck_assert_msg(order[round] == round, "grant order %s, want 1 2 3 4 5", got);
    ck_assert_int_eq(status_waiters(mon, res), 0);
    h_cluster_stop(&K);
}
END_TEST

/* The holder is on another daemon: only the release notification (Redis
 * pub/sub) can wake the waiter quickly, since its fallback retry is set
 * to 5 s (jittered to 2.5..7.5 s). */
START_TEST(wake_from_second_daemon)
{
    const char *res = "lease:wake";
    struct h_client *h, *w, *mon;
    char *line;
    uint64_t t0, t1;
    long long delay;

    h_cluster_daemon(&K, 0, "{\"locks\":{\"retry_ms\":5000}}", T(5000));
    h_cluster_daemon(&K, 1, NULL, T(5000));
    h = h_cluster_client(&K, 0, 1);
    w = h_cluster_client(&K, 1, 0);
    mon = h_cluster_client(&K, 2, 0);
    h_expect(h, "OK resource=lease:wake ", "LOCK %s", res);
    h_sendf(w, "LOCK %s wait=8000\n", res);
    wait_waiters(mon, res, 1);
    /* Let its first attempt fail and the retry timer start. */
    h_sleep_ms(300);
    ck_assert_msg(!h_recv_line(w, 1), "waiter answered early: %s", w->line);
    h_sendf(h, "UNLOCK %s\n", res);
    line = h_recv_line(h, 5000);
    t0 = h_now_ms();
    ck_assert_msg(h_starts(line, "OK resource=lease:wake "), "UNLOCK on daemon 2 answered %s",
                  line ? line : "nothing");
    line = h_recv_line(w, 9000);
    t1 = h_now_ms();
    ck_assert_msg(h_starts(line, "OK resource=lease:wake "), "waiter on daemon 1 answered %s",
                  line ? line : "nothing");
    delay = t1 > t0 ? (long long)(t1 - t0) : 0;
    fprintf(stderr, "wake delay: %llu ms\n", (unsigned long long)delay);
    ck_assert_msg(delay < T(1000), "waiter woken %lld ms after the release", delay);
    ck_assert_msg(h_stats_int(mon, "wakeups_notified") >= 1,
                  "daemon 1 STATS counts no notified wake-up");
    h_cluster_stop(&K);
}
END_TEST

/* The holder is a plain SET NX client that never releases: the waiter is
 * woken by the key's expiry (its PTTL), not by the 5 s fallback retry. */
START_TEST(wake_on_expiry)
{
    const char *res = "lease:exp";
    struct h_client *w;
    uint64_t t0;
    long long dt;
    char *line;

    h_cluster_daemon(&K, 0, "{\"locks\":{\"retry_ms\":5000}}", T(5000));
    w = h_cluster_client(&K, 0, 0);
    t0 = h_now_ms();
    for (int i = 0; i < NNODES; i++) {
        char *s = NULL;
        long long rc = h_redis_cmd(&N[i], &s, "SET lock:%s x NX PX 800", res);

        ck_assert_msg(rc == 0 && s && strcmp(s, "OK") == 0,
                      "SET NX PX on node %d: %s", i, s ? s : "?");
        free(s);
    }
    line = h_cmd(w, "LOCK %s wait=3000", res);
    dt = h_since(t0);
    ck_assert_msg(h_starts(line, "OK resource=lease:exp "), "LOCK wait=3000 answered %s", line);
    fprintf(stderr, "expiry wake: granted %lld ms after SET PX 800\n", dt);
    ck_assert_msg(dt >= 700 && dt <= 800 + T(700),
                  "granted %lld ms after the 800 ms key was set", dt);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(wait_timeout)
{
    struct h_client *h, *w;
    uint64_t t0;
    long long dt;
    char *line;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    h = h_cluster_client(&K, 0, 0);
    w = h_cluster_client(&K, 1, 0);
    /* Held by a session of this daemon. */
    h_expect(h, "OK resource=lease:to ", "LOCK lease:to");
    t0 = h_now_ms();
    line = h_cmd(w, "LOCK lease:to wait=300");
    dt = h_since(t0);
    ck_assert_msg(h_starts(line, "ERR TIMEOUT "), "LOCK wait=300 answered %s", line);
    ck_assert_msg(dt >= 280 && dt <= 300 + T(500), "ERR TIMEOUT after %lld ms", dt);
    /* Held by someone the daemon only sees on the Redis nodes. */
    for (int i = 0; i < NNODES; i++)
        h_redis_cmd(&N[i], NULL, "SET lock:lease:to2 other PX 10000");
    t0 = h_now_ms();
    line = h_cmd(w, "LOCK lease:to2 wait=300");
    dt = h_since(t0);
    ck_assert_msg(h_starts(line, "ERR TIMEOUT "), "LOCK wait=300 answered %s", line);
    ck_assert_msg(dt >= 280 && dt <= 300 + T(500), "ERR TIMEOUT after %lld ms", dt);
    assert_keys("lease:to2", "other");
    /* The timed-out waiter holds nothing and waits for nothing. */
    ck_assert_int_eq(status_waiters(w, "lease:to"), 0);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(waiter_disconnect)
{
    const char *res = "lease:gone";
    struct h_client *h, *mon, *w1, *w2, *w3;
    struct h_client *rest[2];
    char tok2[64];
    char *line = NULL;
    int i;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    h = h_cluster_client(&K, 0, 0);
    mon = h_cluster_client(&K, 1, 0);
    w1 = h_cluster_client(&K, 2, 0);
    w2 = h_cluster_client(&K, 3, 0);
    w3 = h_cluster_client(&K, 4, 0);
    h_expect(h, "OK resource=lease:gone ", "LOCK %s", res);
    h_sendf(w1, "LOCK %s wait=10000\n", res);
    wait_waiters(mon, res, 1);
    h_sendf(w2, "LOCK %s wait=10000\n", res);
    wait_waiters(mon, res, 2);
    h_sendf(w3, "LOCK %s wait=10000\n", res);
    wait_waiters(mon, res, 3);

    /* The first waiter hangs up while queued: it is dropped... */
    h_close(w1);
    wait_waiters(mon, res, 2);
    /* ...and the release goes to the next one in line. */
    h_expect(h, "OK resource=lease:gone ", "UNLOCK %s", res);
    rest[0] = w2;
    rest[1] = w3;
    i = h_wait_any_line(rest, 2, T(2000), &line);
    ck_assert_msg(i == 0, "after the release: waiter %d answered %s, want waiter 2",
                  i + 2, i >= 0 ? line : "nothing");
    ck_assert_msg(h_starts(line, "OK resource=lease:gone "), "waiter 2 answered %s", line);
    /* Fences count grants: the closed waiter was never granted one. */
    ck_assert_str_eq(h_kv(line, "fence"), "2");
    h_kv_copy(line, "token", tok2, sizeof(tok2));
    assert_keys(res, tok2);
    ck_assert_int_eq(status_waiters(mon, res), 1);
    h_expect(w2, "OK resource=lease:gone ", "UNLOCK %s", res);
    line = h_recv_line(w3, 3000);
    ck_assert_msg(h_starts(line, "OK resource=lease:gone "), "waiter 3 answered %s",
                  line ? line : "nothing");
    h_cluster_stop(&K);
}
END_TEST

/* A waiter that hangs up just as the lock comes free, its acquisition
 * possibly already in flight: whatever it got is given back, the next
 * waiter is served and no key keeps the dead session's token. */
START_TEST(waiter_disconnect_at_release)
{
    const char *res = "lease:gone2";
    struct h_client *h, *mon, *w1, *w2;
    char tok[64];
    char *line;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    h = h_cluster_client(&K, 0, 0);
    mon = h_cluster_client(&K, 1, 0);
    w1 = h_cluster_client(&K, 2, 0);
    w2 = h_cluster_client(&K, 3, 0);
    h_expect(h, "OK resource=lease:gone2 ", "LOCK %s", res);
    h_sendf(w1, "LOCK %s wait=10000\n", res);
    wait_waiters(mon, res, 1);
    h_sendf(w2, "LOCK %s wait=10000\n", res);
    wait_waiters(mon, res, 2);
    h_sendf(h, "UNLOCK %s\n", res);
    h_close(w1);
    line = h_recv_line(h, 5000);
    ck_assert_msg(h_starts(line, "OK resource=lease:gone2 "), "UNLOCK answered %s",
                  line ? line : "nothing");
    line = h_recv_line(w2, 4000);
    ck_assert_msg(h_starts(line, "OK resource=lease:gone2 "), "last waiter answered %s",
                  line ? line : "nothing");
    h_kv_copy(line, "token", tok, sizeof(tok));
    assert_keys(res, tok);
    ck_assert_int_eq(status_waiters(mon, res), 0);
    h_expect(w2, "OK resource=lease:gone2 ", "UNLOCK %s", res);
    assert_keys(res, "");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(waiting_blocks_only_its_connection)
{
    const char *res = "lease:pipe";
    struct h_client *h, *w, *o;
    uint64_t t0;
    char *line;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    h = h_cluster_client(&K, 0, 0);
    w = h_cluster_client(&K, 1, 0);
    o = h_cluster_client(&K, 2, 0);
    h_expect(h, "OK resource=lease:pipe ", "LOCK %s", res);
    /* Pipelined: the PING must wait for the LOCK's reply. */
    h_sendf(w, "LOCK %s wait=5000\nPING after\n", res);
    wait_waiters(o, res, 1);
    t0 = h_now_ms();
    ck_assert_str_eq(h_cmd(o, "PING other"), "PONG other");
    ck_assert_msg(h_since(t0) < T(500), "another connection's PING took %lld ms",
                  h_since(t0));
    line = h_recv_line(w, 300);
    ck_assert_msg(!line, "waiting connection answered \"%s\" before its LOCK",
                  line);
    h_expect(h, "OK resource=lease:pipe ", "UNLOCK %s", res);
    line = h_recv_line(w, 3000);
    ck_assert_msg(h_starts(line, "OK resource=lease:pipe "), "first reply: %s",
                  line ? line : "nothing");
    line = h_recv_line(w, 3000);
    ck_assert_msg(line && strcmp(line, "PONG after") == 0, "second reply: %s",
                  line ? line : "nothing");
    h_cluster_stop(&K);
}
END_TEST

/* ---- lock_delay --------------------------------------------------------- */

/* LOCK at about t0 + at_ms: BUSY, unless the reply came so late (a very
 * slow machine) that the delay may really have passed. */
static void busy_at(struct h_client *c, const char *res, uint64_t t0, int at_ms)
{
    char *line;

    while (h_since(t0) < at_ms)
        h_sleep_ms(5);
    line = h_cmd(c, "LOCK %s", res);
    ck_assert_msg(h_starts(line, "ERR BUSY ") || h_since(t0) >= 1500,
                  "LOCK %lld ms after the holder dropped (lock_delay_ms=1500) "
                  "answered %s", h_since(t0), line);
}

START_TEST(lock_delay_after_drop)
{
    struct h_client *a, *b, *q;
    uint64_t t0;
    long long took;

    h_cluster_daemon(&K, 0, "{\"locks\":{\"lock_delay_ms\":1500}}", T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    h_expect(a, "OK resource=lease:delay ", "LOCK lease:delay");
    h_close(a);
    t0 = h_now_ms();
    busy_at(b, "lease:delay", t0, 200);
    busy_at(b, "lease:delay", t0, 1000);
    took = lock_until_ok(b, "lease:delay", 50, T(4000));
    took = took < 0 ? -1 : h_since(t0);
    fprintf(stderr, "lock_delay_ms=1500: free %lld ms after the drop\n", took);
    /* The keys were kept for 1500 ms from a moment after t0. */
    ck_assert_msg(took >= 1450 && took <= 1500 + T(1000),
                  "free %lld ms after the drop, want 1500..%lld", took,
                  1500 + T(1000));

    /* UNLOCK: no delay. */
    a = h_cluster_client(&K, 0, 0);
    h_expect(a, "OK resource=lease:d2 ", "LOCK lease:d2");
    h_expect(a, "OK resource=lease:d2 ", "UNLOCK lease:d2");
    h_expect(b, "OK resource=lease:d2 ", "LOCK lease:d2");

    /* QUIT: released after the reply, without the delay. */
    q = h_cluster_client(&K, 2, 0);
    h_expect(q, "OK resource=lease:d3 ", "LOCK lease:d3");
    ck_assert_str_eq(h_cmd(q, "QUIT"), "OK bye");
    ck_assert_msg(h_wait_eof(q, 2000), "connection open after QUIT");
    h_close(q);
    took = lock_until_ok(b, "lease:d3", 10, T(3000));
    ck_assert_msg(took >= 0 && took <= T(300), "free %lld ms after QUIT", took);
    h_cluster_stop(&K);
}
END_TEST

/* ---- keepalive ---------------------------------------------------------- */

START_TEST(keepalive_expiry_releases)
{
    struct h_client *a, *b, *k;
    uint64_t t0;
    long long dt, took;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    h_expect(a, "OK proto=1 ", "HELLO keepalive=500");
    /* The keepalive counts from the line's arrival, not from its reply
     * (a slow LOCK uses up part of it): time it from the sending. */
    t0 = h_now_ms();
    h_expect(a, "OK resource=lease:ka ", "LOCK lease:ka");
    ck_assert_msg(h_wait_eof(a, 3000), "silent keepalive=500 connection still open");
    dt = h_since(t0);
    fprintf(stderr, "keepalive=500: closed %lld ms after the last line\n", dt);
    ck_assert_msg(dt >= 480 && dt <= T(1500), "closed %lld ms after the last line", dt);
    took = lock_until_ok(b, "lease:ka", 20, T(3000));
    ck_assert_msg(took >= 0 && took <= T(1000),
                  "lock not free %lld ms after the keepalive ran out", took);

    /* PINGs every 200 ms keep the session and its lock for 2 s. */
    k = h_cluster_client(&K, 2, 0);
    h_expect(k, "OK proto=1 ", "HELLO keepalive=500");
    h_expect(k, "OK resource=lease:ka2 ", "LOCK lease:ka2");
    t0 = h_now_ms();
    while (h_since(t0) < 2000) {
        h_sleep_ms(200);
        ck_assert_str_eq(h_cmd(k, "PING"), "PONG");
    }
    h_expect(b, "ERR BUSY ", "LOCK lease:ka2");
    h_expect(k, "OK resource=lease:ka2 ", "UNLOCK lease:ka2");
    h_cluster_stop(&K);
}
END_TEST

/* The calls= of one command in INFO commandstats text, 0 when absent. */
static long long cmd_calls(const char *info, const char *cmd)
{
    char key[64];
    const char *p;

    snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
    p = info ? strstr(info, key) : NULL;
    return p ? atoll(p + strlen(key)) : 0;
}

/* Renewals due together go to each node as one script (issue 11): 300
 * leases renewing every 300 ms would be some 1,500 script calls per node
 * in 1.5 s one by one; batched they are a few dozen, and every lease is
 * still renewed and none is lost. */
START_TEST(renewals_batched)
{
    enum { NLOCKS = 300 };
    struct h_client *a;
    char *info = NULL;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    for (int i = 0; i < NLOCKS; i++)
        h_expect(a, "OK resource=batch:", "LOCK batch:%d ttl=900", i);
    h_sleep_ms(300);
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_ne(h_redis_cmd(&N[i], NULL, "CONFIG RESETSTAT"), -3);
    h_sleep_ms(1500);
    for (int i = 0; i < NNODES; i++) {
        ck_assert_int_ne(h_redis_cmd(&N[i], &info, "INFO commandstats"), -3);
        long long calls = cmd_calls(info, "evalsha") + cmd_calls(info, "eval");
        free(info);
        info = NULL;
        fprintf(stderr, "node %d: %lld script calls in 1.5 s for %d leases\n",
                i, calls, NLOCKS);
        ck_assert_msg(calls < 150, "node %d: %lld script calls in 1.5 s: the "
                      "renewals of %d leases were not batched", i, calls,
                      NLOCKS);
    }
    ck_assert_msg(!h_expect_event(a, "EVENT", 1),
                  "unexpected event while renewing: %s", a->line);
    json_t *o = h_ok_json(a, "LOCKS"), *l;
    json_t *locks = json_object_get(o, "locks");
    size_t i;
    ck_assert_uint_eq(json_array_size(locks), NLOCKS);
    json_array_foreach(locks, i, l)
        ck_assert_msg(h_json_int(l, "renewals") >= 3, "%s renewed %lld times",
                      h_json_str(l, "resource"),
                      (long long)h_json_int(l, "renewals"));
    json_decref(o);
    h_cluster_stop(&K);
}
END_TEST

/* One key of a batch that its script cannot handle (a hash where the
 * lock was) fails that key's renewal alone: its lease is lost, the lease
 * renewed in the same batch is not. */
START_TEST(batch_error_is_one_keys)
{
    struct h_client *a;

    h_cluster_daemon(&K, 0, NULL, T(5000));
    a = h_cluster_client(&K, 0, 0);
    h_expect(a, "OK resources=2 ", "LOCK bad:a bad:b ttl=900");
    h_expect(a, "OK resource=bad:c ", "LOCK bad:c ttl=900");
    for (int i = 0; i < NNODES; i++) {
        ck_assert_int_ne(h_redis_cmd(&N[i], NULL, "DEL lock:bad:c"), -3);
        ck_assert_int_ne(h_redis_cmd(&N[i], NULL, "HSET lock:bad:c f v"), -3);
    }
    ck_assert_msg(h_expect_event(a, "EVENT LOST resource=bad:c ", T(3000)),
                  "the broken lease was not lost");
    h_sleep_ms(1500);
    ck_assert_msg(!h_expect_event(a, "EVENT", 1), "another lease went too: %s",
                  a->line);
    json_t *o = h_ok_json(a, "LOCKS");
    ck_assert_uint_eq(json_array_size(json_object_get(o, "locks")), 2);
    json_decref(o);
    h_cluster_stop(&K);
}
END_TEST

static Suite *lease_suite(void)
{
    Suite *s = suite_create("lease");
    TCase *tc = tcase_create("lease");

    /* The teardown runs after a test that passed. A failed one exits at
     * once (check's fork mode); the harness's guardians and PDEATHSIG
     * clean up then, and print the daemon log. */
    h_cluster_fixture(tc, &K, NNODES, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, renewal_outlives_ttl);
    tcase_add_test(tc, renew0_expires_with_event);
    tcase_add_test(tc, waiters_fifo);
    tcase_add_test(tc, wake_from_second_daemon);
    tcase_add_test(tc, wake_on_expiry);
    tcase_add_test(tc, wait_timeout);
    tcase_add_test(tc, waiter_disconnect);
    tcase_add_test(tc, waiter_disconnect_at_release);
    tcase_add_test(tc, waiting_blocks_only_its_connection);
    tcase_add_test(tc, lock_delay_after_drop);
    tcase_add_test(tc, keepalive_expiry_releases);
    tcase_add_test(tc, renewals_batched);
    tcase_add_test(tc, batch_error_is_one_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(lease_suite());
}
