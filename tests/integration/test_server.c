/*
 * test_server: the connection layer of the real redlockd binary.
 *
 * One redis-server node and one daemon per test (fresh processes from a
 * checked fixture), driven over TCP and the unix socket with raw lines:
 * the non-lock part of the protocol, pipelining, abuse (over-long lines,
 * NUL bytes, half lines, hundreds of clients), AUTH gating, max_clients,
 * shutdown with clients attached, and --check-config. Locks are covered
 * by test_locks.c once the Redlock work lands.
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* Its node (started before each test) and daemon D (harness.h). Every
 * test ends with a clean SIGTERM stop (the fixture's teardown), so under
 * the valgrind wrapper each scenario is also checked for leaks (exit
 * status 99). */
static struct h_cluster K;
static struct h_daemon *const D = &K.daemons[0];

/* The daemon, not waited for until its node votes. */
static void start(const char *extra_json)
{
    h_cluster_daemon_start(&K, 0, extra_json);
}

/* Start the daemon and connect a client that sends `req` as it is: bytes
 * h_cmd would not send in one piece (several lines, CRLF, NUL). */
static void raw_client(struct h_client *c, const char *req, size_t len)
{
    start(NULL);
    h_connect_tcp_ok(c, D->port);
    h_send(c, req, len);
}

/* The non-lock lines of protocol.md's telnet example. */
static void telnet_example(struct h_client *c)
{
    char *line = h_expect(c, "OK proto=1 session=s", "HELLO name=alice");

    ck_assert_str_eq(h_kv(line, "server"), "redlockd/" REDLOCKD_VERSION);
    ck_assert_str_eq(h_kv(line, "nodes"), "1");
    ck_assert_str_eq(h_kv(line, "quorum"), "1");
    ck_assert_str_eq(h_cmd(c, "PING"), "PONG");
    ck_assert_str_eq(h_cmd(c, "PING hi"), "PONG hi");
    ck_assert_str_eq(h_cmd(c, "QUIT"), "OK bye");
    ck_assert_msg(h_wait_eof(c, 2000), "connection still open after QUIT");
    h_close(c);
}

START_TEST(telnet_tcp)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    telnet_example(&c);
}
END_TEST

START_TEST(telnet_unix)
{
    struct h_client c;

    start(NULL);
    h_connect_unix_ok(&c, D->sock_path);
    telnet_example(&c);
}
END_TEST

/* nc -C and telnet end lines with CRLF; replies stay plain LF. */
START_TEST(crlf_lines)
{
    static const char req[] = "HELLO name=bob\r\nPING\r\nPING x\r\n\r\n";
    struct h_client c;
    char *line;

    raw_client(&c, req, sizeof(req) - 1);
    line = h_recv_line(&c, 5000);
    ck_assert_msg(h_starts(line, "OK proto=1 "), "HELLO answered %s", line);
    ck_assert_ptr_null(strchr(line, '\r'));
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG");
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG x");
    ck_assert_str_eq(h_cmd(&c, "PING y\r"), "PONG y");
}
END_TEST

START_TEST(case_insensitive)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(h_cmd(&c, "ping"), "PONG");
    ck_assert_str_eq(h_cmd(&c, "PiNg Hi"), "PONG Hi");
    h_expect(&c, "OK proto=1 ", "hello name=carol");
    h_expect(&c, "OK ", "help");
    ck_assert_str_eq(h_cmd(&c, "quit"), "OK bye");
    ck_assert(h_wait_eof(&c, 2000));
}
END_TEST

/* 100 requests in one write: 100 replies, in order. */
START_TEST(pipeline_100)
{
    struct h_client c;
    char req[2048];
    size_t len = 0;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    for (int i = 1; i <= 100; i++)
        len += (size_t)snprintf(req + len, sizeof(req) - len, "PING %d\n", i);
    h_send(&c, req, len);
    for (int i = 1; i <= 100; i++) {
        char want[32];
        char *line = h_recv_line(&c, 5000);

        snprintf(want, sizeof(want), "PONG %d", i);
        ck_assert_msg(line, "no reply %d of 100", i);
        ck_assert_str_eq(line, want);
    }
}
END_TEST

START_TEST(toolong_line)
{
    struct h_client c;
    char req[256], want[256];
    char *line;

    start("{\"limits\":{\"max_line\":128}}");
    h_connect_tcp_ok(&c, D->port);
    /* Well under the limit still works. */
    memset(req, 'x', sizeof(req));
    memcpy(req, "PING ", 5);
    req[100] = '\0';
    snprintf(want, sizeof(want), "PONG %s", req + 5);
    ck_assert_str_eq(h_cmd(&c, "%s", req), want);
    /* 200 bytes + LF: TOOLONG, then the daemon hangs up. */
    memset(req, 'x', sizeof(req));
    memcpy(req, "PING ", 5);
    req[200] = '\n';
    h_send(&c, req, 201);
    line = h_recv_line(&c, 5000);
    ck_assert_msg(h_starts(line, "ERR TOOLONG "), "over-long line answered %s", line);
    ck_assert_msg(h_wait_eof(&c, 2000), "connection still open after TOOLONG");
}
END_TEST

START_TEST(nul_byte)
{
    static const char req[] = "PING a\0b\n";
    struct h_client c;
    char *line;

    raw_client(&c, req, sizeof(req) - 1);
    line = h_recv_line(&c, 5000);
    ck_assert_msg(h_starts(line, "ERR ARG "), "NUL byte answered %s", line);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_expect(&c, "ERR ARG ", "PING \x01");
    ck_assert_str_eq(h_cmd(&c, "PING after"), "PONG after");
}
END_TEST

START_TEST(unknown_command)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR UNKNOWN ", "FROBNICATE x");
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
}
END_TEST

/* Hundreds of clients connected at once, all answered. */
START_TEST(many_clients)
{
    enum { N = 500 };
    struct h_client *c = calloc(N, sizeof(*c));

    ck_assert_ptr_nonnull(c);
    h_raise_nofile(N + 200);
    start(NULL);
    for (int i = 0; i < N; i++)
        h_connect_tcp_ok(&c[i], D->port);
    for (int i = 0; i < N; i++)
        h_sendf(&c[i], "PING c%d\n", i);
    for (int i = 0; i < N; i++) {
        char want[32];
        char *line = h_recv_line(&c[i], 10000);

        snprintf(want, sizeof(want), "PONG c%d", i);
        ck_assert_msg(line, "client %d of %d got no reply", i, N);
        ck_assert_str_eq(line, want);
    }
    for (int i = 0; i < N; i++)
        h_close(&c[i]);
    free(c);
}
END_TEST

/* Half a line and a hang-up must not disturb anyone else. */
START_TEST(partial_line_disconnect)
{
    struct h_client a, b;

    start(NULL);
    h_connect_tcp_ok(&a, D->port);
    h_send(&a, "PIN", 3);
    h_connect_tcp_ok(&b, D->port);
    ck_assert_str_eq(h_cmd(&b, "PING"), "PONG");
    h_sleep_ms(50);
    h_close(&a);
    h_sleep_ms(50);
    ck_assert_str_eq(h_cmd(&b, "PING"), "PONG");
    h_close(&b);
    h_connect_tcp_ok(&a, D->port);
    ck_assert_str_eq(h_cmd(&a, "PING again"), "PONG again");
}
END_TEST

/* A client that half-closes after its last line (nc -q1, nc -N) still
 * gets every reply, then the daemon closes. */
START_TEST(half_close_after_pipeline)
{
    static const char req[] = "PING 1\nHELLO name=half\nPING 2\nQUIT\n";
    struct h_client c;

    raw_client(&c, req, sizeof(req) - 1);
    h_shutdown_write(&c);
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG 1");
    ck_assert(h_starts(h_recv_line(&c, 5000), "OK proto=1 "));
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG 2");
    ck_assert_str_eq(h_recv_line(&c, 5000), "OK bye");
    ck_assert(h_wait_eof(&c, 2000));
}
END_TEST

/* The same without QUIT: EOF alone ends the session after the replies. */
START_TEST(half_close_without_quit)
{
    static const char req[] = "PING 1\nPING 2\n";
    struct h_client c;

    raw_client(&c, req, sizeof(req) - 1);
    h_shutdown_write(&c);
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG 1");
    ck_assert_str_eq(h_recv_line(&c, 5000), "PONG 2");
    ck_assert(h_wait_eof(&c, 2000));
}
END_TEST

/* `printf 'LOCK x\n...' | nc -N` must work: after EOF the requests already
 * read are still answered, LOCK included, only without waiting. */
START_TEST(half_close_with_locks)
{
    static const char req[] = "LOCK hc:1\nUNLOCK hc:1\nLOCK hc:2 wait=5000\n"
                              "QUIT\n";
    struct h_client c;

    start(NULL);
    h_wait_voting(D, 1, 5000);
    h_connect_tcp_ok(&c, D->port);
    h_send(&c, req, sizeof(req) - 1);
    h_shutdown_write(&c);
    ck_assert(h_starts(h_recv_line(&c, 5000), "OK resource=hc:1 token="));
    ck_assert_str_eq(h_recv_line(&c, 5000), "OK resource=hc:1 nodes=1");
    ck_assert(h_starts(h_recv_line(&c, 5000), "OK resource=hc:2 token="));
    ck_assert_str_eq(h_recv_line(&c, 5000), "OK bye");
    ck_assert(h_wait_eof(&c, 2000));
}
END_TEST

/* A waiter whose client goes away leaves the queue at once (its half-closed
 * socket still hears why), and holds nothing afterwards. */
START_TEST(half_close_while_waiting)
{
    struct h_client holder, waiter;

    start(NULL);
    h_wait_voting(D, 1, 5000);
    h_connect_tcp_ok(&holder, D->port);
    ck_assert(h_starts(h_cmd(&holder, "LOCK hw:1"), "OK "));
    h_connect_tcp_ok(&waiter, D->port);
    h_sendf(&waiter, "LOCK hw:1 wait=10000\n");
    h_sleep_ms(100);
    json_t *st = h_ok_json(&holder, "STATUS hw:1");
    ck_assert_int_eq(h_json_int(st, "waiters"), 1);
    json_decref(st);
    uint64_t t0 = h_now_ms();
    h_shutdown_write(&waiter);
    char *line = h_recv_line(&waiter, 5000);
    ck_assert_msg(line && h_starts(line, "ERR TIMEOUT "), "waiter got %s",
                  line ? line : "(nothing)");
    ck_assert_msg(h_now_ms() - t0 < 2000, "the wait was not cut short");
    ck_assert(h_wait_eof(&waiter, 2000));
    st = h_ok_json(&holder, "STATUS hw:1");
    ck_assert_int_eq(h_json_int(st, "waiters"), 0);
    json_decref(st);
    ck_assert(h_starts(h_cmd(&holder, "UNLOCK hw:1"), "OK resource=hw:1 nodes=1"));
    h_close(&holder);
    h_close(&waiter);
}
END_TEST

START_TEST(auth_gating)
{
    struct h_client c;
    json_t *stats;

    start("{\"auth\":{\"password\":\"s3cret\"}}");
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR NOAUTH", "LOCK x");
    h_expect(&c, "ERR NOAUTH", "STATS");
    h_expect(&c, "ERR NOAUTH", "SESSIONS");
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_expect(&c, "OK ", "HELP");
    h_expect(&c, "OK proto=1 ", "HELLO name=gated");
    h_expect(&c, "ERR AUTH", "AUTH wrong");
    h_expect(&c, "ERR NOAUTH", "STATS");
    ck_assert_str_eq(h_cmd(&c, "AUTH s3cret"), "OK");
    stats = h_ok_json(&c, "STATS");
    json_decref(stats);
    ck_assert_str_eq(h_cmd(&c, "QUIT"), "OK bye");
}
END_TEST

/* The 4th client is told ERR LIMIT and closed; a freed slot is reusable. */
START_TEST(max_clients)
{
    struct h_client c[3], extra;
    char *line = NULL;
    bool accepted = false;

    start("{\"limits\":{\"max_clients\":3}}");
    for (int i = 0; i < 3; i++) {
        h_connect_tcp_ok(&c[i], D->port);
        ck_assert_str_eq(h_cmd(&c[i], "PING"), "PONG");
    }
    h_connect_tcp_ok(&extra, D->port);
    line = h_recv_line(&extra, 5000);
    ck_assert_msg(h_starts(line, "ERR LIMIT"), "4th client got %s", line);
    ck_assert_msg(h_wait_eof(&extra, 2000), "4th client not closed");
    h_close(&extra);

    h_close(&c[0]);
    /* The daemon notices the close asynchronously: retry for a while. A
     * refusal comes unasked, so listen first; a PING sent into a closing
     * socket could turn the refusal into a reset. */
    for (int tries = 0; tries < 50 && !accepted; tries++) {
        h_connect_tcp_ok(&extra, D->port);
        line = h_recv_line(&extra, 100);
        if (!line) {
            line = h_cmd(&extra, "PING");
            accepted = strcmp(line, "PONG") == 0;
            ck_assert_msg(accepted, "PING on a freed slot got %s", line);
        } else {
            ck_assert_msg(h_starts(line, "ERR LIMIT"), "retry got %s", line);
            h_close(&extra);
            h_sleep_ms(20);
        }
    }
    ck_assert_msg(accepted, "no slot freed after a client left");
    ck_assert_str_eq(h_cmd(&c[1], "PING"), "PONG");
    ck_assert_str_eq(h_cmd(&c[2], "PING"), "PONG");
}
END_TEST

START_TEST(sigterm_with_clients)
{
    struct h_client a, b, u;

    start(NULL);
    h_connect_tcp_ok(&a, D->port);
    h_expect(&a, "OK proto=1 ", "HELLO name=stays");
    h_connect_tcp_ok(&b, D->port);
    h_send(&b, "PIN", 3);
    h_connect_unix_ok(&u, D->sock_path);
    ck_assert_str_eq(h_cmd(&u, "PING"), "PONG");
    ck_assert_int_eq(h_daemon_stop(D), 0);
    ck_assert(h_wait_eof(&a, 1000));
    ck_assert(h_wait_eof(&b, 1000));
    ck_assert(h_wait_eof(&u, 1000));
}
END_TEST

START_TEST(help_line)
{
    struct h_client c;
    char *line;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    line = h_expect(&c, "OK ", "HELP");
    ck_assert_msg(strstr(line, "LOCK"), "HELP lacks LOCK: %s", line);
    ck_assert_msg(strstr(line, "PING"), "HELP lacks PING: %s", line);
}
END_TEST

static bool has_session_named(json_t *sessions, const char *name)
{
    size_t i;
    json_t *s;

    json_array_foreach(sessions, i, s) {
        const char *n = json_string_value(json_object_get(s, "name"));

        if (n && strcmp(n, name) == 0)
            return true;
    }
    return false;
}

START_TEST(stats_and_sessions_json)
{
    struct h_client alice, obs;
    json_t *obj;

    start(NULL);
    h_connect_tcp_ok(&alice, D->port);
    h_expect(&alice, "OK proto=1 ", "HELLO name=alice");
    h_connect_unix_ok(&obs, D->sock_path);
    obj = h_ok_json(&obs, "STATS");
    json_decref(obj);
    obj = h_ok_json(&obs, "SESSIONS");
    ck_assert_msg(json_is_array(json_object_get(obj, "sessions")),
                  "SESSIONS has no \"sessions\" array");
    ck_assert_msg(has_session_named(json_object_get(obj, "sessions"), "alice"),
                  "SESSIONS does not list alice");
    json_decref(obj);
}
END_TEST

/* ---- redlockd --check-config ---- */

static int count_lines(const char *s)
{
    int n = 0;

    for (const char *p = s; *p != '\0'; p++)
        n += *p == '\n';
    return n + (*s != '\0' && s[strlen(s) - 1] != '\n');
}

START_TEST(check_config_default)
{
    const char *src = getenv("REDLOCKD_SRCDIR");
    char path[1024], out[4096];
    char *argv[] = { (char *)h_daemon_bin(), "--check-config", "-c", path, NULL };
    int rc;

    ck_assert_msg(src, "REDLOCKD_SRCDIR is not set (run via meson test)");
    snprintf(path, sizeof(path), "%s/conf/redlockd.json", src);
    rc = h_run(argv, out, sizeof(out));
    ck_assert_msg(rc == 0, "--check-config %s exited %d: %s", path, rc, out);
}
END_TEST

START_TEST(check_config_bad)
{
    static const char bad[] = "{\"limits\":{\"max_line\":\"x\"}}\n";
    char path[] = "/tmp/redlockd-badconf.XXXXXX";
    char out[4096];
    char *argv[] = { (char *)h_daemon_bin(), "--check-config", "-c", path, NULL };
    int fd = mkstemp(path), rc;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, bad, sizeof(bad) - 1), (ssize_t)sizeof(bad) - 1);
    close(fd);
    rc = h_run(argv, out, sizeof(out));
    unlink(path);
    ck_assert_msg(rc != 0, "a bad config passed --check-config: %s", out);
    ck_assert_msg(strstr(out, "limits.max_line"),
                  "error does not name limits.max_line: %s", out);
    ck_assert_msg(count_lines(out) == 1, "want one line, got: %s", out);
}
END_TEST

/* A connection that never completes a first line is closed after
 * handshake_timeout_ms; one that spoke is not (idle_timeout_ms is 0). */
START_TEST(handshake_timeout)
{
    struct h_client silent, talker;

    start("{\"limits\":{\"handshake_timeout_ms\":300}}");
    h_connect_tcp_ok(&silent, D->port);
    h_connect_tcp_ok(&talker, D->port);
    ck_assert_str_eq(h_cmd(&talker, "PING"), "PONG");
    uint64_t t0 = h_now_ms();
    ck_assert_msg(h_wait_eof(&silent, 3000), "silent connection still open");
    ck_assert_msg(h_now_ms() - t0 >= 200, "closed too early");
    h_sleep_ms(400);
    ck_assert_str_eq(h_cmd(&talker, "PING"), "PONG");
    h_close(&talker);
    h_close(&silent);
}
END_TEST

START_TEST(idle_timeout)
{
    struct h_client c;

    start("{\"limits\":{\"idle_timeout_ms\":400}}");
    h_connect_tcp_ok(&c, D->port);
    for (int i = 0; i < 4; i++) {      /* activity keeps it open */
        ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
        h_sleep_ms(200);
    }
    uint64_t t0 = h_now_ms();
    ck_assert_msg(h_wait_eof(&c, 3000), "idle connection still open");
    ck_assert_msg(h_now_ms() - t0 >= 150, "closed too early");
    h_close(&c);
}
END_TEST

static Suite *server_suite(void)
{
    Suite *s = suite_create("server");
    TCase *tc = tcase_create("server");
    TCase *conf = tcase_create("check-config");
    int timeout = h_slow() ? 150 : 30;

    h_cluster_fixture(tc, &K, 1, true);
    tcase_set_timeout(tc, timeout);
    tcase_add_test(tc, telnet_tcp);
    tcase_add_test(tc, telnet_unix);
    tcase_add_test(tc, crlf_lines);
    tcase_add_test(tc, case_insensitive);
    tcase_add_test(tc, pipeline_100);
    tcase_add_test(tc, toolong_line);
    tcase_add_test(tc, nul_byte);
    tcase_add_test(tc, unknown_command);
    tcase_add_test(tc, many_clients);
    tcase_add_test(tc, partial_line_disconnect);
    tcase_add_test(tc, half_close_after_pipeline);
    tcase_add_test(tc, half_close_without_quit);
    tcase_add_test(tc, half_close_with_locks);
    tcase_add_test(tc, half_close_while_waiting);
    tcase_add_test(tc, auth_gating);
    tcase_add_test(tc, max_clients);
    tcase_add_test(tc, sigterm_with_clients);
    tcase_add_test(tc, help_line);
    tcase_add_test(tc, stats_and_sessions_json);
    tcase_add_test(tc, handshake_timeout);
    tcase_add_test(tc, idle_timeout);
    suite_add_tcase(s, tc);

    tcase_set_timeout(conf, timeout);
    tcase_add_test(conf, check_config_default);
    tcase_add_test(conf, check_config_bad);
    suite_add_tcase(s, conf);
    return s;
}

int main(void)
{
    return h_run_suite(server_suite());
}
