/*
 * test_adopt: ADOPT, a lease taken over by its token on another daemon of
 * the same nodes, or on the same daemon after a restart (protocol.md,
 * "Adopting a lease"), with three real redis-server nodes and two daemons.
 *
 *   - ADOPT on the other daemon: a new token on every node, the same
 *     fence; the old holder's next renewal finds nothing of its own
 *     (EVENT LOST reason=node) and its release deletes nothing; others get
 *     ERR BUSY until the adopter unlocks;
 *   - the old daemon SIGSTOPped (a partition) while its client adopts
 *     elsewhere, then SIGCONTed: its renewals and its release at session
 *     end change nothing, nobody else is granted;
 *   - a daemon restarted under a held lock (SIGTERM leaves the lease): the
 *     client adopts on the restarted daemon within its validity;
 *   - the resources of one multi-resource grant together; a shared hold
 *     (the member's token rotated, its fence kept) and a semaphore slot
 *     (found by the token, the reply says its limit and slot);
 *   - another session of the same daemon holding the lease: the adopter
 *     gets it, the old holder hears EVENT LOST;
 *   - a wrong token answers ERR LOST, a held resource ERR HELD, a missing
 *     or malformed token ERR ARG.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NNODES 3

/* Its nodes, daemons D1 and D2, and clients A (on D1), B (on D2) and C
 * (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_daemon *const D1 = &K.daemons[0];
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];
static struct h_client *const C = &K.clients[2];

static void start(void)
{
    h_cluster_start(&K, NNODES, 2, NULL, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);
}

/* Every node's key of res holds token (as the first word). */
static void assert_keys(const char *res, const char *token)
{
    for (int i = 0; i < NNODES; i++) {
        char *v = NULL;
        h_redis_cmd(&N[i], &v, "GET lock:%s", res);
        ck_assert_msg(v && h_holds_token(v, token), "node %d: lock:%s is "
                      "%s, want token %s", i, res, v ? v : "(none)", token);
        free(v);
    }
}

/* LOCK on c: its token and fence. */
static void lock(struct h_client *c, const char *what, char *token,
                 char *fence)
{
    char *line = h_expect(c, "OK ", "LOCK %s", what);

    h_kv_copy(line, "token", token, 64);
    h_kv_copy(line, "fence", fence, 32);
}

START_TEST(adopt_elsewhere)
{
    char token[64], fence[32], *line;

    start();
    lock(A, "ad ttl=1500", token, fence);
    line = h_expect(B, "OK resource=ad ", "ADOPT ad token=%s ttl=1500",
                    token);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    ck_assert_str_ne(h_kv(line, "token"), token);
    char fresh[64];
    h_kv_copy(line, "token", fresh, sizeof(fresh));
    assert_keys("ad", fresh);
    ck_assert_int_eq(h_stats_int(B, "adopts"), 1);
    /* The old holder learns at its next renewal (ttl/3). */
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=ad ",
                                 h_scale(3000)), "the old holder was not told");
    h_expect(A, "ERR ", "UNLOCK ad");
    assert_keys("ad", fresh);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR BUSY ", "LOCK ad");
    /* Renewed by its new daemon past the ttl. */
    h_sleep_ms(2000);
    assert_keys("ad", fresh);
    h_expect(B, "OK resource=ad nodes=3", "UNLOCK ad");
    h_expect(C, "OK resource=ad ", "LOCK ad");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_while_old_daemon_stopped)
{
    char token[64], fence[32], fresh[64], *line;

    start();
    lock(A, "st ttl=1500", token, fence);
    kill(D1->pid, SIGSTOP);
    line = h_expect(B, "OK resource=st ", "ADOPT st token=%s ttl=1500",
                    token);
    h_kv_copy(line, "token", fresh, sizeof(fresh));
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    h_sleep_ms(2000);
    kill(D1->pid, SIGCONT);
    /* Its renewals run and fail; its client then drops: the release at
     * session end is owner-checked with the old token. */
    h_expect_event(A, "EVENT LOST resource=st ", h_scale(3000));
    h_close(A);
    h_sleep_ms(300);
    assert_keys("st", fresh);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR BUSY ", "LOCK st");
    h_close(C);
    h_cluster_client(&K, 2, 1);
    h_expect(C, "ERR BUSY ", "LOCK st");
    h_expect(B, "OK resource=st nodes=3", "UNLOCK st");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_after_restart)
{
    char token[64], fence[32];
    const char *line;
    int port;

    start();
    lock(A, "rs ttl=10000", token, fence);
    port = D1->port;
    ck_assert_int_eq(h_daemon_stop(D1), 0);
    h_close(A);
    assert_keys("rs", token);
    h_expect(B, "ERR BUSY ", "LOCK rs");
    /* Back on the same port and config, as systemctl restart does. */
    h_daemon_restart(D1);
    ck_assert_int_eq(D1->port, port);
    /* At once, before its nodes are checked: the ADOPT is held back until
     * they vote (as a LOCK is), then answered; never UNAVAILABLE, which
     * would send the client round again. */
    h_cluster_client(&K, 0, 0);
    line = h_cmd(A, "ADOPT rs token=%s", token);
    ck_assert_msg(h_starts(line, "OK resource=rs "), "ADOPT on the restarted "
                  "daemon: %s", line);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    h_expect(B, "ERR BUSY ", "LOCK rs");
    /* A node that did not vote yet when ADOPT went out was not asked: it
     * keeps the old token until its ttl, so the release deletes on the
     * two or three that took the new one. */
    line = h_expect(A, "OK resource=rs nodes=", "UNLOCK rs");
    ck_assert_int_ge(atoi(h_kv(line, "nodes")), 2);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_multi)
{
    char token[64], fence[32], fresh[64], *line;

    start();
    lock(A, "m1 m2", token, fence);
    line = h_expect(B, "OK resources=2 ", "ADOPT m1 m2 token=%s", token);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    h_kv_copy(line, "token", fresh, sizeof(fresh));
    assert_keys("m1", fresh);
    assert_keys("m2", fresh);
    h_expect(B, "OK resource=m1 ", "UNLOCK m1");
    h_expect(B, "OK resource=m2 ", "UNLOCK m2");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_same_daemon)
{
    char token[64], fence[32], *line;

    start();
    lock(A, "sd", token, fence);
    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK resource=sd ", "ADOPT sd token=%s", token);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=sd ",
                                 h_scale(2000)), "the old holder was not told");
    h_expect(B, "ERR BUSY ", "LOCK sd");
    h_expect(C, "OK resource=sd nodes=3", "UNLOCK sd");
    h_cluster_stop(&K);
}
END_TEST

/* Every node has token as a live member of res's shared holders' set, and
 * not gone (the old token no member). */
static void assert_member(const char *res, const char *token, bool want)
{
    for (int i = 0; i < NNODES; i++) {
        char *v = NULL;
        h_redis_cmd(&N[i], &v, "ZSCORE lock:%s:shared %s", res, token);
        ck_assert_msg((v != NULL) == want, "node %d: %s is %sa member of "
                      "lock:%s:shared", i, token, v ? "" : "not ", res);
        free(v);
    }
}

START_TEST(adopt_shared)
{
    char token[64], fence[32], fresh[64], *line;

    start();
    lock(A, "sh mode=shared ttl=1500", token, fence);
    line = h_expect(B, "OK resource=sh ", "ADOPT sh token=%s ttl=1500",
                    token);
    ck_assert_str_eq(h_kv(line, "mode"), "shared");
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    h_kv_copy(line, "token", fresh, sizeof(fresh));
    ck_assert_str_ne(fresh, token);
    assert_member("sh", fresh, true);
    assert_member("sh", token, false);
    line = h_expect(B, "OK ", "LOCKS");
    ck_assert_msg(strstr(line, "\"mode\":\"shared\""), "LOCKS: %s", line);
    /* The old holder's renewal finds nothing; its release at the end of
     * its session removes nothing. */
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=sh ",
                                 h_scale(3000)), "the old holder was not told");
    h_close(A);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR BUSY ", "LOCK sh");
    /* Renewed by its new daemon past the ttl. */
    h_sleep_ms(2000);
    assert_member("sh", fresh, true);
    h_expect(C, "ERR BUSY ", "LOCK sh");
    h_expect(B, "OK resource=sh nodes=3", "UNLOCK sh");
    h_expect(C, "OK resource=sh ", "LOCK sh");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_slot)
{
    char token[64], fence[32], fresh[64], slot[16], *line;

    start();
    line = h_expect(A, "OK ", "LOCK se limit=2 ttl=1500");
    h_kv_copy(line, "token", token, sizeof(token));
    h_kv_copy(line, "fence", fence, sizeof(fence));
    h_kv_copy(line, "slot", slot, sizeof(slot));
    line = h_expect(B, "OK resource=se ", "ADOPT se token=%s ttl=1500",
                    token);
    ck_assert_str_eq(h_kv(line, "limit"), "2");
    ck_assert_str_eq(h_kv(line, "slot"), slot);
    ck_assert_str_eq(h_kv(line, "fence"), fence);
    h_kv_copy(line, "token", fresh, sizeof(fresh));
    char res[32];
    snprintf(res, sizeof(res), "se#%s", slot);
    assert_keys(res, fresh);
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=se ",
                                 h_scale(3000)), "the old holder was not told");
    /* Two slots: the adopted one and C's; A finds none free, even after
     * the adopted lease's first ttl. */
    h_cluster_client(&K, 2, 0);
    h_expect(C, "OK resource=se ", "LOCK se limit=2");
    h_sleep_ms(2000);
    h_expect(A, "ERR BUSY ", "LOCK se limit=2");
    assert_keys(res, fresh);
    h_expect(B, "OK resource=se nodes=3", "UNLOCK se");
    h_expect(A, "OK resource=se ", "LOCK se limit=2");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(adopt_errors)
{
    char token[64], fence[32];

    start();
    lock(A, "er", token, fence);
    h_expect(B, "ERR LOST ", "ADOPT er token=0123456789abcdef0123456789abcdef");
    h_expect(B, "ERR ARG ", "ADOPT er");
    h_expect(B, "ERR ARG ", "ADOPT er token=xyz");
    h_expect(B, "ERR ARG ", "ADOPT token=%s", token);
    h_expect(A, "ERR HELD ", "ADOPT er token=%s", token);
    h_expect(B, "ERR LOST ", "ADOPT nothing token=%s", token);
    /* After all that the holder still holds it, untouched. */
    assert_keys("er", token);
    h_expect(A, "OK resource=er nodes=3", "UNLOCK er");
    h_cluster_stop(&K);
}
END_TEST

/* ---- an ADOPT whose asker is gone before the answer -------------------- */

/* How long the proxies in front of D2's nodes hold each chunk: an ADOPT
 * round on D2 takes two of them, time enough to withdraw it. */
#define SLOW_MS 300
#define WD_TTL 4000

/* D1 direct, D2 through a proxy in front of every node (no delay yet). */
static void start_slow_d2(void)
{
    h_cluster_nodes(&K, NNODES, NULL);
    h_cluster_proxy_all(&K, 1);
    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    /* Its nodes may take SLOW_MS each way without failing. */
    h_cluster_daemon(&K, 1, "{\"redis\":{\"command_timeout_ms\":2000}}",
                     h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);
}

static void slow_d2(int ms)
{
    for (int i = 0; i < NNODES; i++) {
        if (ms)
            h_proxy_ctl(&K.proxies[i], "delay %d", ms);
        else
            h_proxy_ctl(&K.proxies[i], "pass");
    }
}

/* A holds res on D1 (ttl WD_TTL), D1 is stopped (a partition), D2's nodes
 * are slow, and B waits for res on D2. Returns A's token in token. */
static void withdrawn_setup(const char *res, char *token)
{
    char fence[32];

    start_slow_d2();
    h_expect(B, "OK ", "HELLO name=waiter");
    lock(A, res, token, fence);
    kill(D1->pid, SIGSTOP);
    slow_d2(SLOW_MS);
    /* B queues behind the key (a busy answer, then it sleeps on the key's
     * PTTL or a release announcement). */
    h_sendf(B, "LOCK %.*s wait=%d\n", (int)strcspn(res, " "), res,
            h_scale(20000));
    h_sleep_ms(2 * SLOW_MS + 100);
}

/* B's grant must come after the adopter's deadline: the ADOPT sent at t0
 * rotated the key with ttl WD_TTL, so nobody may have it before then
 * (the adopter's validity is less than WD_TTL, counted from t0). Waits
 * for B's answer until t0 + WD_TTL + 3 s; returns when it came. */
static long long waiter_granted_after(uint64_t t0)
{
    char *line = h_recv_line(B, WD_TTL + h_scale(3000));
    long long at = h_since(t0);

    ck_assert_msg(line, "the waiter was never answered");
    ck_assert_msg(h_starts(line, "OK resource="), "the waiter: %s", line);
    ck_assert_msg(at >= WD_TTL - 200, "the waiter was granted %lld ms after "
                  "the ADOPT was sent, before the adopter's deadline "
                  "(ttl %d)", at, WD_TTL);
    return at;
}

/* Nothing from B (no grant) within ms. */
static void waiter_still_waits(int ms)
{
    char *line = h_recv_line(B, ms);

    ck_assert_msg(!line, "the waiter was answered: %s", line ? line : "");
}

/* The adopter's connection is reset right after the ADOPT: its session
 * ends, the rotated keys are left to expire at the ADOPT's ttl. (A plain
 * close is EOF: the daemon answers what it read before ending the
 * session, which then releases the adopted lease as its own.) */
START_TEST(adopt_withdrawn_reset)
{
    char token[64];

    withdrawn_setup("wr ttl=4000", token);
    h_cluster_client(&K, 2, 1);
    uint64_t t0 = h_now_ms();
    h_sendf(C, "ADOPT wr token=%s ttl=%d\n", token, WD_TTL);
    h_sleep_ms(50);
    h_reset(C);
    waiter_granted_after(t0);
    h_cluster_continue(&K);
    h_cluster_stop(&K);
}
END_TEST

/* A session with detach= loses its connection while its ADOPT is out: the
 * adopted lease is the session's, found when it resumes. */
START_TEST(adopt_withdrawn_detach)
{
    char token[64], sid[64], secret[64], *line;

    withdrawn_setup("wd ttl=4000", token);
    h_cluster_client(&K, 2, 1);
    line = h_expect(C, "OK ", "HELLO detach=10000");
    h_kv_copy(line, "session", sid, sizeof(sid));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_sendf(C, "ADOPT wd token=%s ttl=%d\n", token, WD_TTL);
    h_sleep_ms(50);
    h_reset(C);
    /* The round completes meanwhile (two delayed legs). */
    waiter_still_waits(4 * SLOW_MS + 400);
    slow_d2(0);
    h_cluster_client(&K, 2, 1);
    line = h_expect(C, "OK ", "HELLO resume=%s secret=%s", sid, secret);
    ck_assert_str_eq(h_kv(line, "resumed"), "1");
    line = h_expect(C, "OK {", "LOCKS");
    ck_assert_msg(strstr(line, "\"resource\":\"wd\""), "LOCKS: %s", line);
    ck_assert_msg(!strstr(line, token), "LOCKS shows the old token: %s",
                  line);
    /* Held and renewed: the waiter still waits, past the ADOPT's ttl. */
    waiter_still_waits(WD_TTL);
    h_expect(C, "OK resource=wd nodes=3", "UNLOCK wd");
    line = h_recv_line(B, h_scale(3000));
    ck_assert_msg(line && h_starts(line, "OK resource=wd "), "the waiter "
                  "after UNLOCK: %s", line ? line : "(nothing)");
    h_cluster_continue(&K);
    h_cluster_stop(&K);
}
END_TEST

/* A second connection resumes the session while its ADOPT is out on the
 * first (a takeover): the adopted lease is the session's. */
START_TEST(adopt_withdrawn_takeover)
{
    char token[64], sid[64], secret[64], *line;
    struct h_client *const E = &K.clients[3];

    withdrawn_setup("wt ttl=4000", token);
    h_cluster_client(&K, 2, 1);
    line = h_expect(C, "OK ", "HELLO detach=10000");
    h_kv_copy(line, "session", sid, sizeof(sid));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_sendf(C, "ADOPT wt token=%s ttl=%d\n", token, WD_TTL);
    h_sleep_ms(50);
    h_cluster_client(&K, 3, 1);
    h_expect(E, "OK ", "HELLO resume=%s secret=%s", sid, secret);
    waiter_still_waits(4 * SLOW_MS + 400);
    line = h_expect(E, "OK {", "LOCKS");
    ck_assert_msg(strstr(line, "\"resource\":\"wt\""), "LOCKS: %s", line);
    waiter_still_waits(WD_TTL);
    slow_d2(0);
    h_expect(E, "OK resource=wt nodes=3", "UNLOCK wt");
    line = h_recv_line(B, h_scale(3000));
    ck_assert_msg(line && h_starts(line, "OK resource=wt "), "the waiter "
                  "after UNLOCK: %s", line ? line : "(nothing)");
    h_cluster_continue(&K);
    h_cluster_stop(&K);
}
END_TEST

/* An ADOPT refused after its round (the resource is a semaphore on this
 * daemon, the nodes hold an exclusive lease): ERR ARG, and the rotated
 * keys are left to expire, never deleted. The waiter is on D1, behind
 * the old holder, whose renewal fails once the token is rotated. */
START_TEST(adopt_refused_after_round)
{
    char token[64], fence[32], *line;
    struct h_client *const W = &K.clients[3];

    start();
    lock(A, "rr ttl=4000", token, fence);
    h_cluster_client(&K, 3, 0);
    h_sendf(W, "LOCK rr wait=20000\n");
    h_expect(B, "OK resource=rr ", "LOCK rr limit=2");
    h_cluster_client(&K, 2, 1);
    uint64_t t0 = h_now_ms();
    line = h_cmd(C, "ADOPT rr token=%s ttl=%d", token, WD_TTL);
    ck_assert_msg(h_starts(line, "ERR ARG "), "ADOPT: %s", line);
    line = h_recv_line(W, WD_TTL + h_scale(3000));
    long long at = h_since(t0);
    ck_assert_msg(line && h_starts(line, "OK resource=rr "), "the waiter: %s",
                  line ? line : "(nothing)");
    ck_assert_msg(at >= WD_TTL - 200, "the waiter was granted %lld ms after "
                  "the refused ADOPT, before its keys' ttl (%d)", at, WD_TTL);
    h_cluster_stop(&K);
}
END_TEST

static Suite *adopt_suite(void)
{
    Suite *s = suite_create("adopt");
    TCase *tc = tcase_create("adopt");

    /* A daemon left stopped is continued, then killed. */
    h_cluster_fixture(tc, &K, 0, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, adopt_elsewhere);
    tcase_add_test(tc, adopt_while_old_daemon_stopped);
    tcase_add_test(tc, adopt_after_restart);
    tcase_add_test(tc, adopt_multi);
    tcase_add_test(tc, adopt_shared);
    tcase_add_test(tc, adopt_slot);
    tcase_add_test(tc, adopt_same_daemon);
    tcase_add_test(tc, adopt_errors);
    tcase_add_test(tc, adopt_withdrawn_reset);
    tcase_add_test(tc, adopt_withdrawn_detach);
    tcase_add_test(tc, adopt_withdrawn_takeover);
    tcase_add_test(tc, adopt_refused_after_round);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(adopt_suite());
}
