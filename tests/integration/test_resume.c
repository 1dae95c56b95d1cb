/*
 * test_resume: sessions that outlive their connection (HELLO detach=,
 * HELLO resume=; protocol.md "Detachable sessions"), with one real
 * redis-server and the real binary.
 *
 *   - a detached session keeps its lease while its connection is gone
 *     (another session gets ERR BUSY), and a resume with its id and
 *     secret on a new connection gets it back (resumed=1, same session
 *     id, UNLOCK works);
 *   - not resumed within detach ms: the session ends as a dropped one
 *     does, its lease is released (a waiter gets it);
 *   - QUIT still ends the session and releases at once;
 *   - a wrong secret or an unknown id: ERR NOSESSION, counted as a wrong
 *     password (limits.max_auth_failures closes the connection);
 *   - a session still attached elsewhere is taken over: the old
 *     connection gets EVENT CLOSING reason=resumed and is closed, the
 *     lease stays held throughout;
 *   - the same session detaches and is resumed twice over;
 *   - a takeover withdraws what the old connection asked: its waiting
 *     LOCK is not granted to the session afterwards;
 *   - a lease lost while detached is told on resume (EVENT LOST after the
 *     reply), and UNLOCK of it answers ERR LOST;
 *   - detach= above limits.max_detach_ms, or with it 0: ERR ARG; resume=
 *     without secret=: ERR ARG;
 *   - SESSIONS and STATUS show a detached session ("attached":false,
 *     "detached_ms"), and the secret appears in neither, nor in the log;
 *   - a detached session's lease at shutdown is left on the node to
 *     expire.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Its node R (started before each test), daemon D and clients A, B and C
 * (harness.h). */
static struct h_cluster K;
static struct h_redis *const R = &K.nodes[0];
static struct h_daemon *const D = &K.daemons[0];
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];
static struct h_client *const C = &K.clients[2];

static void start(const char *extra_json)
{
    h_cluster_daemon(&K, 0, extra_json, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 0);
}

/* HELLO detach=ms on c: its session id and secret. */
static void detachable(struct h_client *c, int ms, char *id, char *secret)
{
    char *line = h_expect(c, "OK proto=1 ", "HELLO detach=%d", ms);

    h_kv_copy(line, "session", id, 64);
    h_kv_copy(line, "secret", secret, 64);
    ck_assert_int_eq((int)strlen(secret), 32);
}

START_TEST(detach_and_resume)
{
    char id[64], secret[64], *line;

    char token[64];

    start(NULL);
    detachable(A, 5000, id, secret);
    line = h_expect(A, "OK resource=dr ", "LOCK dr ttl=2000");
    h_kv_copy(line, "token", token, sizeof(token));
    h_close(A);
    /* Past the ttl: the lease is renewed while nobody is attached. */
    h_sleep_ms(2500);
    h_expect(B, "ERR BUSY ", "LOCK dr");
    ck_assert_int_eq(h_stats_int(B, "sessions_detached"), 1);
    json_t *o = h_ok_json(B, "SESSIONS");
    char *text = json_dumps(o, JSON_COMPACT);
    ck_assert_msg(strstr(text, "\"attached\":false") &&
                  strstr(text, "\"detached_ms\""), "SESSIONS: %s", text);
    ck_assert_msg(!strstr(text, secret), "SESSIONS shows the secret");
    ck_assert_msg(!strstr(text, token), "SESSIONS shows a lease's token");
    free(text);
    json_decref(o);
    o = h_ok_json(B, "STATUS dr");
    json_t *holder = json_object_get(o, "holder");
    ck_assert_msg(json_is_false(json_object_get(holder, "attached")),
                  "STATUS holder of a detached session: attached not false");
    json_decref(o);

    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    ck_assert_str_eq(h_kv(line, "session"), id);
    ck_assert_str_eq(h_kv(line, "resumed"), "1");
    ck_assert_ptr_null(h_kv(line, "secret"));
    ck_assert_int_eq(h_stats_int(B, "sessions_detached"), 0);
    line = h_expect(C, "OK {", "LOCKS");
    ck_assert_msg(strstr(line, token), "its own LOCKS lacks the token: %s",
                  line);
    h_expect(C, "OK resource=dr nodes=1", "UNLOCK dr");
    h_expect(B, "OK resource=dr ", "LOCK dr");
    ck_assert_msg(!strstr(h_daemon_log(D), secret), "the log shows the secret");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(not_resumed_in_time)
{
    char id[64], secret[64];
    uint64_t t0;
    long long ms;

    start(NULL);
    detachable(A, 400, id, secret);
    h_expect(A, "OK resource=nr ", "LOCK nr");
    h_close(A);
    t0 = h_now_ms();
    h_expect(B, "OK resource=nr ", "LOCK nr wait=5000");
    ms = h_since(t0);
    ck_assert_msg(ms >= 300, "released %lld ms after the drop, before "
                  "detach=400 ran out", ms);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, secret);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(quit_releases)
{
    char id[64], secret[64];

    start(NULL);
    detachable(A, 5000, id, secret);
    h_expect(A, "OK resource=qr ", "LOCK qr");
    h_expect(A, "OK bye", "QUIT");
    h_expect(B, "OK resource=qr ", "LOCK qr wait=1000");
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, secret);
    h_cluster_stop(&K);
}
END_TEST

/* A QUIT read behind a request in flight, its connection half-closed
 * before the QUIT's turn comes (nc -q1 does that): still a QUIT, which
 * releases, not a dropped connection, which would detach the session
 * with its leases. */
START_TEST(quit_after_eof_releases)
{
    char id[64], secret[64];

    start(NULL);
    detachable(A, 30000, id, secret);
    h_sendf(A, "#1 LOCK qe\nQUIT\n");
    h_shutdown_write(A);
    ck_assert(h_starts(h_recv_line(A, h_scale(3000)), "#1 OK resource=qe "));
    ck_assert_str_eq(h_recv_line(A, h_scale(3000)), "OK bye");
    h_expect(B, "OK resource=qe ", "LOCK qe wait=1000");
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, secret);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(wrong_secret)
{
    char id[64], secret[64], bad[64];

    start("{\"limits\":{\"max_auth_failures\":3}}");
    detachable(A, 5000, id, secret);
    h_expect(A, "OK resource=ws ", "LOCK ws");
    h_close(A);
    snprintf(bad, sizeof(bad), "%s", secret);
    bad[0] = bad[0] == '0' ? '1' : '0';
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, bad);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=s999.x secret=%s", secret);
    h_expect(C, "ERR ARG ", "HELLO resume=%s", id);
    h_expect(C, "ERR ARG ", "HELLO resume=%s secret=abc", id);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, bad);
    ck_assert_str_eq(h_recv_line(C, h_scale(2000)),
                     "EVENT CLOSING reason=auth");
    ck_assert(h_wait_eof(C, h_scale(2000)));
    /* The real one still works, and the lease was kept. */
    h_close(C);
    h_expect(B, "ERR BUSY ", "LOCK ws");
    h_cluster_client(&K, 2, 0);
    h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    h_cluster_stop(&K);
}
END_TEST

START_TEST(takeover)
{
    char id[64], secret[64], *line;

    start(NULL);
    detachable(A, 5000, id, secret);
    h_expect(A, "OK resource=to ", "LOCK to");
    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s name=new",
                    id, secret);
    ck_assert_str_eq(h_kv(line, "resumed"), "1");
    ck_assert_str_eq(h_recv_line(A, h_scale(2000)),
                     "EVENT CLOSING reason=resumed");
    ck_assert(h_wait_eof(A, h_scale(2000)));
    h_expect(B, "ERR BUSY ", "LOCK to");
    h_expect(C, "OK resource=to nodes=1", "UNLOCK to");
    h_cluster_stop(&K);
}
END_TEST

/* The same session detaches, is resumed, detaches again and is resumed
 * again: one lease, one id throughout. */
START_TEST(resume_twice)
{
    char id[64], secret[64], *line;

    start(NULL);
    detachable(A, 5000, id, secret);
    h_expect(A, "OK resource=rt ", "LOCK rt");
    h_close(A);
    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    ck_assert_str_eq(h_kv(line, "resumed"), "1");
    h_close(C);
    h_sleep_ms(100);
    ck_assert_int_eq(h_stats_int(B, "sessions_detached"), 1);
    h_expect(B, "ERR BUSY ", "LOCK rt");
    h_cluster_client(&K, 0, 0);
    line = h_expect(A, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    ck_assert_str_eq(h_kv(line, "session"), id);
    ck_assert_str_eq(h_kv(line, "resumed"), "1");
    h_expect(A, "OK resource=rt nodes=1", "UNLOCK rt");
    h_expect(A, "OK bye", "QUIT");
    h_cluster_client(&K, 2, 0);
    h_expect(C, "ERR NOSESSION ", "HELLO resume=%s secret=%s", id, secret);
    h_cluster_stop(&K);
}
END_TEST

/* What the old connection asked is withdrawn when another takes the
 * session over: its waiting LOCK is neither answered there nor granted
 * to the session later. */
START_TEST(takeover_withdraws_wait)
{
    char id[64], secret[64], *line;

    start(NULL);
    detachable(A, 5000, id, secret);
    h_expect(B, "OK resource=tw ", "LOCK tw");
    h_sendf(A, "LOCK tw wait=%d\n", h_scale(5000));
    h_sleep_ms(100);
    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    ck_assert_str_eq(h_kv(line, "resumed"), "0");
    ck_assert_str_eq(h_recv_line(A, h_scale(2000)),
                     "EVENT CLOSING reason=resumed");
    ck_assert(h_wait_eof(A, h_scale(2000)));
    h_expect(B, "OK resource=tw nodes=1", "UNLOCK tw");
    h_sleep_ms(300);
    line = h_expect(C, "OK {", "LOCKS");
    ck_assert_msg(!strstr(line, "\"tw\""), "the withdrawn LOCK was granted: "
                  "%s", line);
    h_expect(B, "OK resource=tw ", "LOCK tw");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(lost_while_detached)
{
    char id[64], secret[64], *line;

    start(NULL);
    detachable(A, 5000, id, secret);
    h_expect(A, "OK resource=lw ", "LOCK lw ttl=300 renew=0");
    h_close(A);
    h_sleep_ms(700);
    h_cluster_client(&K, 2, 0);
    line = h_expect(C, "OK proto=1 ", "HELLO resume=%s secret=%s", id, secret);
    ck_assert_str_eq(h_kv(line, "resumed"), "0");
    line = h_recv_line(C, h_scale(2000));
    ck_assert_msg(line && h_starts(line, "EVENT LOST resource=lw ") &&
                  strstr(line, "reason=expired"), "after resume: %s",
                  line ? line : "(nothing)");
    h_expect(C, "ERR LOST ", "UNLOCK lw");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(limits)
{
    h_cluster_daemon(&K, 0, "{\"limits\":{\"max_detach_ms\":1000}}",
                     h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_expect(A, "ERR ARG ", "HELLO detach=1001");
    h_expect(A, "OK proto=1 ", "HELLO detach=1000");
    h_expect(A, "ERR ARG ", "HELLO detach=500 resume=s1.x "
             "secret=0123456789abcdef0123456789abcdef");
    ck_assert_int_eq(h_daemon_finish(D), 0);
    h_daemon_cleanup(D);
    h_close(A);
    h_cluster_daemon(&K, 0, "{\"limits\":{\"max_detach_ms\":0}}", h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_expect(A, "ERR ARG detach is off", "HELLO detach=100");
    h_expect(A, "OK proto=1 ", "HELLO detach=0");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(detached_at_shutdown)
{
    char id[64], secret[64], *val = NULL;

    start(NULL);
    detachable(A, 20000, id, secret);
    h_expect(A, "OK resource=ds ", "LOCK ds ttl=20000");
    h_close(A);
    h_sleep_ms(100);
    ck_assert_int_eq(h_daemon_stop(D), 0);
    (void)h_redis_cmd(R, &val, "GET lock:ds");
    ck_assert_msg(val != NULL, "a detached session's lease was deleted at "
                  "shutdown");
    free(val);
    ck_assert_msg(strstr(h_daemon_log(D), "stopped: 1 lease left"), "%s",
                  h_daemon_log(D));
}
END_TEST

/* During the shutdown window a detachable session's connection drops:
 * that is no release (it would have detached), so its lease is left on
 * the node to expire, like one still held at the end. */
START_TEST(drop_during_shutdown)
{
    char id[64], secret[64], *val = NULL;

    start("{\"shutdown_timeout_ms\":3000}");
    detachable(A, 20000, id, secret);
    h_expect(A, "OK resource=dd ", "LOCK dd ttl=20000");
    kill(D->pid, SIGTERM);
    ck_assert_str_eq(h_recv_line(A, h_scale(2000)), "EVENT SHUTDOWN");
    h_close(A);
    ck_assert_int_eq(h_daemon_wait(D, 10000), 0);
    (void)h_redis_cmd(R, &val, "GET lock:dd");
    ck_assert_msg(val != NULL, "a detachable session's lease was deleted "
                  "when its connection dropped during shutdown");
    free(val);
    ck_assert_msg(strstr(h_daemon_log(D), "stopped: 1 lease left"), "%s",
                  h_daemon_log(D));
}
END_TEST

/* A resume whose reply overflows the output limit (the client queued big
 * PINGs before it and reads nothing): the connection is closed while the
 * HELLO is answered, and the session detaches again with its losses still
 * untold; the daemon goes on (it crashed there, review F1), and a later
 * resume tells them. */
START_TEST(resume_reply_overflows)
{
    char id[64], secret[64], big[2001];

    start("{\"limits\": {\"max_output_bytes\": 4096}}");
    detachable(A, 30000, id, secret);
    h_expect(A, "OK resource=ov ", "LOCK ov ttl=300 renew=0");
    h_close(A);
    h_sleep_ms(800);            /* expires while detached: untold */
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    h_sendf(B, "PING %s\nPING %s\nPING %s\nHELLO resume=%s secret=%s\n",
            big, big, big, id, secret);
    h_sleep_ms(500);
    h_close(B);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "OK proto=1 session=", "HELLO resume=%s secret=%s", id,
             secret);
    ck_assert_msg(h_expect_event(C, "EVENT LOST resource=ov ", 2000),
                  "the lease lost while detached was never told");
    h_expect(C, "PONG", "PING");
    h_cluster_stop(&K);
}
END_TEST

static Suite *resume_suite(void)
{
    Suite *s = suite_create("resume");
    TCase *tc = tcase_create("resume");

    h_cluster_fixture(tc, &K, 1, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, detach_and_resume);
    tcase_add_test(tc, not_resumed_in_time);
    tcase_add_test(tc, quit_releases);
    tcase_add_test(tc, quit_after_eof_releases);
    tcase_add_test(tc, wrong_secret);
    tcase_add_test(tc, takeover);
    tcase_add_test(tc, resume_twice);
    tcase_add_test(tc, takeover_withdraws_wait);
    tcase_add_test(tc, lost_while_detached);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, detached_at_shutdown);
    tcase_add_test(tc, drop_during_shutdown);
    tcase_add_test(tc, resume_reply_overflows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(resume_suite());
}
