/*
 * test_ops: the daemon as an operator runs it, against a real redis-server.
 *
 * Its lifecycle: closing with a reason (EVENT CLOSING), a shutdown that
 * answers queued waits and leaves held leases to expire, SIGHUP reloading the
 * config (good file, bad file, a changed node list), a unix socket another
 * daemon already serves, and config checks that pass but would fail at
 * runtime. Each case was a bug report first.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

/* Its node R (started before each test), daemon D and a second daemon
 * where a test needs one (harness.h). */
static struct h_cluster K;
static struct h_redis *const R = &K.nodes[0];
static struct h_daemon *const D = &K.daemons[0];

static void start(const char *extra_json)
{
    h_cluster_daemon_start(&K, 0, extra_json);
    /* Waiting for the node to vote asks STATS: not where it needs AUTH,
     * nor where the test is about connections closed for quietness. */
    if (!extra_json || (!strstr(extra_json, "password") &&
                        !strstr(extra_json, "timeout_ms")))
        h_wait_voting(D, 1, h_scale(5000));
    else
        h_sleep_ms(300);
}

/* The next line within ms (asserted), EVENT lines included. */
static char *next_line(struct h_client *c, int ms)
{
    char *line = h_recv_line(c, h_scale(ms));

    ck_assert_msg(line, "no line within %d ms", ms);
    return line;
}

/* ---- EVENT CLOSING ------------------------------------------------------ */

START_TEST(closing_handshake)
{
    struct h_client c;

    start("{\"limits\":{\"handshake_timeout_ms\":300}}");
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(next_line(&c, 3000), "EVENT CLOSING reason=handshake");
    ck_assert(h_wait_eof(&c, 2000));
    h_close(&c);
}
END_TEST

START_TEST(closing_idle)
{
    struct h_client c;

    start("{\"limits\":{\"idle_timeout_ms\":300}}");
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    ck_assert_str_eq(next_line(&c, 3000), "EVENT CLOSING reason=idle");
    ck_assert(h_wait_eof(&c, 2000));
    h_close(&c);
}
END_TEST

START_TEST(closing_keepalive)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "OK proto=1 ", "HELLO keepalive=300");
    ck_assert_str_eq(next_line(&c, 3000), "EVENT CLOSING reason=keepalive");
    ck_assert(h_wait_eof(&c, 2000));
    h_close(&c);
}
END_TEST

/* SIGTERM: a queued LOCK wait= is answered ERR SHUTDOWN and its session,
 * holding nothing, is closed; a holder may still UNLOCK (released as
 * usual) for shutdown_timeout_ms, and what it still holds then is left on
 * the nodes to expire by its ttl, never deleted under it; the last log
 * line says so. */
START_TEST(shutdown_leaves_held_leases)
{
    struct h_client holder, waiter;
    char *line, *val = NULL;
    long long pttl;

    start("{\"shutdown_timeout_ms\":600}");
    h_connect_tcp_ok(&holder, D->port);
    h_connect_tcp_ok(&waiter, D->port);
    line = h_expect(&holder, "OK resource=x ", "LOCK x ttl=20000");
    char token[64];
    h_kv_copy(line, "token", token, sizeof(token));
    h_expect(&holder, "OK resource=y ", "LOCK y");
    h_sendf(&waiter, "LOCK x wait=20000\n");
    h_sleep_ms(200);
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:x"), 1);

    kill(D->pid, SIGTERM);
    ck_assert_str_eq(next_line(&waiter, 3000), "EVENT SHUTDOWN");
    line = next_line(&waiter, 3000);
    ck_assert_msg(h_starts(line, "ERR SHUTDOWN "), "waiter got: %s", line);
    ck_assert_str_eq(next_line(&waiter, 3000), "EVENT CLOSING reason=shutdown");
    ck_assert(h_wait_eof(&waiter, 3000));
    ck_assert_str_eq(next_line(&holder, 3000), "EVENT SHUTDOWN");
    /* The holder's own release still works, and deletes. */
    h_expect(&holder, "OK resource=y nodes=1", "UNLOCK y");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:y"), 0);
    ck_assert_str_eq(next_line(&holder, 3000), "EVENT CLOSING reason=shutdown");
    ck_assert(h_wait_eof(&holder, 3000));
    ck_assert_int_eq(h_daemon_wait(D, 10000), 0);
    /* x is still the holder's, with its ttl running out. */
    ck_assert_int_ge(h_redis_cmd(R, &val, "GET lock:x"), -1);
    ck_assert_msg(val && h_holds_token(val, token), "lock:x after the "
                  "daemon stopped: %s", val ? val : "(none)");
    free(val);
    pttl = h_redis_cmd(R, NULL, "PTTL lock:x");
    ck_assert_msg(pttl > 10000 && pttl <= 20000, "lock:x pttl %lld", pttl);
    ck_assert_msg(strstr(h_daemon_log(D), "stopped: 1 lease left on the nodes"),
                  "%s", h_daemon_log(D));
    h_close(&holder);
    h_close(&waiter);
}
END_TEST

/* ---- SIGHUP ------------------------------------------------------------- */

/* Rewrite the daemon's config file: merge `patch` (JSON object text) into
 * what it holds now. */
static void patch_config(const char *patch)
{
    json_error_t err;
    json_t *conf = json_load_file(D->conf_path, 0, &err);
    json_t *p = json_loads(patch, 0, &err);

    ck_assert_msg(conf && p, "patch_config: %s", err.text);
    json_object_update_recursive(conf, p);
    ck_assert_int_eq(json_dump_file(conf, D->conf_path, JSON_INDENT(2)), 0);
    json_decref(conf);
    json_decref(p);
}

START_TEST(reload_good_file)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "OK resource=a ", "LOCK a");
    h_expect(&c, "OK resource=b ", "LOCK b");
    patch_config("{\"limits\":{\"max_locks_per_session\":2},"
                 "\"log\":{\"level\":\"info\"}}");
    kill(D->pid, SIGHUP);
    ck_assert_msg(h_log_waits_for(D, "limits.max_locks_per_session",
                                  h_scale(3000)),
                  "no reload line naming the changed key:\n%s", h_daemon_log(D));
    ck_assert_msg(strstr(h_daemon_log(D), "reload"), "%s", h_daemon_log(D));
    /* Live: the new limit applies, the locks held stay held. */
    h_expect(&c, "ERR LIMIT ", "LOCK c");
    json_t *j = h_ok_json(&c, "LOCKS");
    ck_assert_uint_eq(json_array_size(json_object_get(j, "locks")), 2);
    json_decref(j);
    /* Nothing died: a second reload, then work goes on. */
    kill(D->pid, SIGHUP);
    h_sleep_ms(200);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_close(&c);
}
END_TEST

START_TEST(reload_bad_file_keeps_config)
{
    struct h_client c;
    FILE *f;

    start("{\"limits\":{\"max_locks_per_session\":5}}");
    h_connect_tcp_ok(&c, D->port);
    f = fopen(D->conf_path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{ \"limits\": { \"max_locks_per_session\": 0 ", f);   /* broken */
    fclose(f);
    kill(D->pid, SIGHUP);
    ck_assert_msg(h_log_waits_for(D, "reload rejected", h_scale(3000)), "%s",
                  h_daemon_log(D));
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    for (int i = 0; i < 5; i++)
        h_expect(&c, "OK resource=", "LOCK r%d", i);
    h_expect(&c, "ERR LIMIT ", "LOCK r5");
    h_close(&c);
}
END_TEST

START_TEST(reload_node_change_needs_restart)
{
    struct h_client c;
    char patch[128];

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    snprintf(patch, sizeof(patch), "{\"redis\":{\"nodes\":[\"127.0.0.1:%d\","
             "\"127.0.0.1:1\"]}}", R->port);
    patch_config(patch);
    kill(D->pid, SIGHUP);
    ck_assert_msg(h_log_waits_for(D, "needs a restart", h_scale(3000)), "%s",
                  h_daemon_log(D));
    ck_assert_msg(strstr(h_daemon_log(D), "redis.nodes"), "%s", h_daemon_log(D));
    /* Still the one node it started with. */
    h_expect(&c, "OK proto=1 ", "HELLO");
    ck_assert_str_eq(h_kv(c.line, "nodes"), "1");
    h_expect(&c, "OK resource=a ", "LOCK a");
    h_close(&c);
}
END_TEST

/* Two nodes tolerate no more failures than one: the log says so at
 * start. */
START_TEST(even_node_count_warned)
{
    /* A second node next to R. */
    h_redis_start(&K.nodes[1], NULL);
    K.nnodes = 2;
    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    ck_assert_msg(strstr(h_daemon_log(D), "redis.nodes: 2 nodes need a quorum "
                         "of 2 and tolerate 0 of them down"), "%s",
                  h_daemon_log(D));
    ck_assert_int_eq(h_daemon_finish(D), 0);
}
END_TEST

/* ---- the unix socket ---------------------------------------------------- */

/* Run a second daemon with the given listen list (JSON array text) on the
 * same node; it must exit by itself within 5 s. Returns its status and
 * output. */
static int second_daemon(const char *listen, char *out, size_t outsize)
{
    char path[400], nodes[64];
    snprintf(path, sizeof(path), "%s/second.json", D->dir);
    snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", R->port);
    json_error_t err;
    json_t *l = json_loads(listen, 0, &err);
    ck_assert_ptr_nonnull(l);
    json_t *conf = json_pack("{s:o, s:{s:[s]}}", "listen", l, "redis",
                             "nodes", nodes);
    ck_assert_int_eq(json_dump_file(conf, path, 0), 0);
    json_decref(conf);
    char *argv[] = { "timeout", "-s", "KILL", "5", (char *)h_daemon_bin(),
                     "-c", path, NULL };
    return h_run(argv, out, outsize);
}

START_TEST(unix_socket_in_use)
{
    struct h_client c;
    char listen[600], out[4096];

    start(NULL);
    snprintf(listen, sizeof(listen), "[\"tcp://127.0.0.1:%d\", \"unix:%s\"]",
             h_free_port(), D->sock_path);
    int rc = second_daemon(listen, out, sizeof(out));
    ck_assert_msg(rc != 0 && rc != 137, "second daemon: status %d: %s", rc,
                  out);
    ck_assert_msg(strstr(out, "in use"), "no clear reason: %s", out);
    /* The first daemon's socket still works. */
    h_connect_unix_ok(&c, D->sock_path);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_close(&c);
}
END_TEST

START_TEST(unix_socket_stale_file_replaced)
{
    struct h_client c;
    char sock[400], extra[600];
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    start(NULL);
    /* A socket file nobody listens on: what a crashed daemon leaves. */
    snprintf(sock, sizeof(sock), "%s/stale.sock", D->dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_uint_lt(strlen(sock), sizeof(sa.sun_path));
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    snprintf(extra, sizeof(extra), "{\"listen\":[\"unix:%s\"]}", sock);
    h_cluster_daemon_start(&K, 1, extra);
    /* The harness waits only for its own listeners: wait for this one. */
    int rc = -1;
    for (int i = 0; i < 200 && rc != 0; i++) {
        rc = h_connect_unix(&c, sock);
        if (rc != 0)
            h_sleep_ms(10);
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_close(&c);
    ck_assert_int_eq(h_daemon_stop(&K.daemons[1]), 0);
}
END_TEST

START_TEST(unix_socket_missing_directory)
{
    char listen[600], out[4096];

    start(NULL);
    snprintf(listen, sizeof(listen), "[\"unix:%s/no/such/dir/x.sock\"]",
             D->dir);
    int rc = second_daemon(listen, out, sizeof(out));
    ck_assert_msg(rc != 0 && rc != 137, "status %d: %s", rc, out);
    ck_assert_msg(strstr(out, "no such directory"), "got: %s", out);
}
END_TEST

/* ---- config checks ------------------------------------------------------ */

static int check_config(const char *json, char *out, size_t outsize)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/check.json", D->dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(json, f);
    fclose(f);
    char *argv[] = { (char *)h_daemon_bin(), "--check-config", path, NULL };
    return h_run(argv, out, outsize);
}

START_TEST(config_same_port_twice)
{
    char out[4096];

    start(NULL);
    int rc = check_config("{\"listen\":[\"tcp://127.0.0.1:7399\","
                          "\"tcp://0.0.0.0:7399\"]}", out, sizeof(out));
    ck_assert_msg(rc != 0, "accepted: %s", out);
    ck_assert_msg(strstr(out, "7399"), "%s", out);
}
END_TEST

START_TEST(config_duplicate_nodes)
{
    char out[4096];

    start(NULL);
    int rc = check_config("{\"redis\":{\"nodes\":[\"127.0.0.1:6379\","
                          "\"127.0.0.1:6380\",\"127.0.0.1:6379\"]}}",
                          out, sizeof(out));
    ck_assert_msg(rc != 0, "accepted: %s", out);
    ck_assert_msg(strstr(out, "redis.nodes"), "%s", out);
}
END_TEST

START_TEST(config_open_without_password_warns)
{
    char out[4096];

    start(NULL);
    int rc = check_config("{\"listen\":[\"tcp://0.0.0.0:7399\"]}", out,
                          sizeof(out));
    ck_assert_msg(rc == 0, "refused: %s", out);
    ck_assert_msg(strstr(out, "protected"), "no warning: %s", out);
}
END_TEST


/* ---- operator commands and limits --------------------------------------- */

START_TEST(help_for_one_command)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(h_cmd(&c, "HELP extend"), "OK EXTEND <resource> [ttl=<ms>] [value=<text>] "
                     "(one of them at least)");
    h_expect(&c, "OK LOCK <resource>... [ttl=<ms>] [wait=<ms>] [renew=0|1] "
             "[mode=shared|exclusive] [limit=<n>]", "HELP LOCK");
    h_expect(&c, "ERR ARG no such command: NOPE", "HELP NOPE");
    h_expect(&c, "OK PING HELLO ", "HELP");
    h_close(&c);
}
END_TEST

START_TEST(auth_failures_close_the_connection)
{
    struct h_client c;
    uint64_t t0, t1;

    start("{\"auth\":{\"password\":\"right\"},"
          "\"limits\":{\"max_auth_failures\":3}}");
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR AUTH ", "AUTH wrong1");      /* at once */
    t0 = h_now_ms();
    h_expect(&c, "ERR AUTH ", "AUTH wrong2");      /* after 100 ms */
    t1 = h_now_ms();
    ck_assert_msg(t1 - t0 >= 90, "second failure answered in %llu ms",
                  (unsigned long long)(t1 - t0));
    h_sendf(&c, "AUTH wrong3\n");
    ck_assert(h_starts(next_line(&c, 3000), "ERR AUTH "));
    ck_assert_str_eq(next_line(&c, 3000), "EVENT CLOSING reason=auth");
    ck_assert(h_wait_eof(&c, 2000));
    h_close(&c);
    /* A right password after a wrong one still works. */
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR AUTH ", "AUTH nope");
    h_expect(&c, "OK", "AUTH right");
    h_expect(&c, "OK resource=a ", "LOCK a");
    h_close(&c);
}
END_TEST

START_TEST(admin_password_gates_forceunlock)
{
    struct h_client user, op;

    start("{\"auth\":{\"password\":\"user-pw\",\"admin_password\":"
          "\"admin-pw\"}}");
    h_connect_tcp_ok(&user, D->port);
    h_connect_tcp_ok(&op, D->port);
    h_expect(&user, "OK", "AUTH user-pw");
    h_expect(&user, "ERR NOAUTH ", "FORCEUNLOCK x");
    h_expect(&op, "OK", "AUTH admin-pw");
    h_expect(&op, "OK resource=a ", "LOCK a");  /* an operator may lock too */
    ck_assert_msg(strstr(h_daemon_log(D), "operator"), "%s", h_daemon_log(D));
    /* A lock held by another session, and by a plain SET NX client. */
    h_expect(&user, "OK resource=x ", "LOCK x");
    h_expect(&op, "OK resource=x nodes=1", "FORCEUNLOCK x");
    ck_assert_msg(h_expect_event(&user, "EVENT LOST resource=x ", 2000),
                  "the holder was not told");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:x"), 0);
    ck_assert(h_redis_cmd(R, NULL, "SET lock:y foreign NX PX 60000") != -3);
    h_expect(&op, "OK resource=y nodes=1", "FORCEUNLOCK y");
    h_expect(&user, "OK resource=y ", "LOCK y");
    ck_assert_msg(strstr(h_daemon_log(D), "forced release of x by"), "%s",
                  h_daemon_log(D));
    h_close(&user);
    h_close(&op);
}
END_TEST

START_TEST(forceunlock_disabled_without_admin_password)
{
    struct h_client c;

    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR NOAUTH ", "FORCEUNLOCK x");
    h_close(&c);
}
END_TEST

START_TEST(max_clients_per_ip)
{
    struct h_client a, b, c, u;

    start("{\"limits\":{\"max_clients_per_ip\":2}}");
    h_connect_counted(&a, D->port);
    h_connect_counted(&b, D->port);
    h_connect_tcp_ok(&c, D->port);
    ck_assert(h_starts(next_line(&c, 3000), "ERR LIMIT "));
    ck_assert(h_wait_eof(&c, 2000));
    h_close(&c);
    /* Unix socket peers are not counted. */
    h_connect_unix_ok(&u, D->sock_path);
    ck_assert_str_eq(h_cmd(&u, "PING"), "PONG");
    /* A slot frees when a connection closes. */
    h_close(&a);
    h_sleep_ms(200);
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_close(&b);
    h_close(&c);
    h_close(&u);
}
END_TEST

START_TEST(max_waiters_per_resource)
{
    struct h_client holder, w[3];

    start("{\"limits\":{\"max_waiters_per_resource\":2}}");
    h_connect_tcp_ok(&holder, D->port);
    h_expect(&holder, "OK resource=x ", "LOCK x");
    for (int i = 0; i < 3; i++)
        h_connect_tcp_ok(&w[i], D->port);
    h_sendf(&w[0], "LOCK x wait=10000\n");
    h_sendf(&w[1], "LOCK x wait=10000\n");
    h_sleep_ms(100);
    h_expect(&w[2], "ERR LIMIT ", "LOCK x wait=10000");
    h_expect(&w[2], "ERR BUSY ", "LOCK x");     /* not waiting: not capped */
    h_expect(&holder, "OK resource=x ", "UNLOCK x");
    ck_assert(h_starts(next_line(&w[0], 3000), "OK resource=x "));
    h_close(&holder);
    for (int i = 0; i < 3; i++)
        h_close(&w[i]);
}
END_TEST

/* ---- the log as an audit trail ------------------------------------------ */

START_TEST(audit_lines_and_session_ids)
{
    struct h_client c;
    char session[64], line[256];

    start("{\"log\":{\"level\":\"info\"}}");
    h_connect_tcp_ok(&c, D->port);
    h_kv_copy(h_expect(&c, "OK proto=1 ", "HELLO name=billing-1"), "session",
              session, sizeof(session));
    const char *fence = h_kv(h_expect(&c, "OK resource=job:7 ", "LOCK job:7"),
                             "fence");
    snprintf(line, sizeof(line), "grant fence=%s job:7 %s (name=billing-1 "
             "peer=127.0.0.1:", fence, session);
    ck_assert_msg(h_log_waits_for(D, line, h_scale(2000)),
                  "no \"%s\" in:\n%s", line, h_daemon_log(D));
    h_expect(&c, "OK resource=job:7 ", "UNLOCK job:7");
    snprintf(line, sizeof(line), "release fence=%s job:7 %s (name=billing-1 "
             "peer=127.0.0.1:", fence, session);
    ck_assert_msg(h_log_waits_for(D, line, h_scale(2000)),
                  "no \"%s\" in:\n%s", line, h_daemon_log(D));
    /* Local time with its UTC offset: "2026-12-01 10:00:00.123+0000". */
    const char *log = h_daemon_log(D);
    ck_assert_msg(log[23] == '+' || log[23] == '-', "no offset: %.40s", log);
    h_close(&c);

    /* Session ids are unique across restarts of the daemon. */
    ck_assert_int_eq(h_daemon_stop(D), 0);
    h_sleep_ms(5);
    h_daemon_cleanup(D);
    start(NULL);
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "OK proto=1 ", "HELLO");
    ck_assert_str_ne(h_kv(c.line, "session"), session);
    h_close(&c);
}
END_TEST

/* A restarted node waits out max_ttl_ms: LOCK says why and until when;
 * an operator who knows no lock outlived it ends the wait (READMIT). */
START_TEST(unavailable_says_why_and_readmit)
{
    struct h_client c, op;
    char *line;

    start("{\"locks\":{\"max_ttl_ms\":600000},"
          "\"auth\":{\"admin_password\":\"op-pw\"}}");
    h_wait_voting(D, 1, h_scale(5000));
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "OK resource=a ", "LOCK a");
    h_expect(&c, "OK resource=a ", "UNLOCK a");
    h_redis_kill(R);       /* no persistence: it comes back empty */
    h_redis_restart(R);
    line = NULL;
    for (int i = 0; i < 100; i++) {
        line = h_cmd(&c, "LOCK b");
        if (strstr(line, "recover"))
            break;
        h_sleep_ms(100);
    }
    ck_assert_msg(h_starts(line, "ERR UNAVAILABLE ") && strstr(line, "until"),
                  "LOCK while the node recovers: %s", line);
    h_connect_tcp_ok(&op, D->port);
    h_expect(&op, "ERR NOAUTH ", "READMIT all");
    h_expect(&op, "OK", "AUTH op-pw");
    h_expect(&op, "ERR ARG ", "READMIT 127.0.0.1:1");
    h_expect(&op, "OK readmitted=1", "READMIT all");
    ck_assert_msg(h_log_waits_for(D, "READMIT all", h_scale(2000)), "%s",
                  h_daemon_log(D));
    line = NULL;
    for (int i = 0; i < 50; i++) {
        line = h_cmd(&c, "LOCK b");
        if (h_starts(line, "OK "))
            break;
        h_sleep_ms(100);
    }
    ck_assert_msg(h_starts(line, "OK resource=b "), "after READMIT: %s", line);
    h_close(&c);
    h_close(&op);
}
END_TEST

/* STATUS on one daemon names a holder on another daemon of the same nodes
 * (the label stored after the token), and a key another Redlock client set
 * as foreign. The stored label does not get in the way of the owner-checked
 * scripts: EXTEND and UNLOCK still find the key theirs. */
START_TEST(status_names_holder_on_other_daemon)
{
    struct h_client a, b;
    char token[64], session[128], *val = NULL;

    start("{\"id\":\"alpha\"}");
    h_cluster_daemon(&K, 1, "{\"id\":\"beta\"}", h_scale(5000));
    h_connect_tcp_ok(&a, D->port);
    h_connect_tcp_ok(&b, K.daemons[1].port);
    char *line = h_expect(&a, "OK proto=1 ", "HELLO name=al\"ice\\");
    h_kv_copy(line, "session", session, sizeof(session));
    line = h_expect(&a, "OK resource=x ", "LOCK x ttl=20000");
    h_kv_copy(line, "token", token, sizeof(token));
    long long fence = atoll(h_kv(line, "fence"));
    ck_assert_uint_eq(strlen(token), 32);

    json_t *st = h_ok_json(&b, "STATUS x");
    json_t *holder = json_object_get(st, "holder");
    ck_assert_msg(json_is_object(holder), "no holder: %s",
                  json_dumps(st, 0));
    ck_assert_str_eq(h_json_str(holder, "daemon"), "alpha");
    ck_assert_str_eq(h_json_str(holder, "session"), session);
    ck_assert_str_eq(h_json_str(holder, "name"), "al\"ice\\");
    ck_assert_int_eq(h_json_int(holder, "fence"), fence);
    ck_assert_int_eq(h_json_int(st, "holders_here"), 0);
    json_decref(st);
    /* The holder's own daemon names itself too. */
    st = h_ok_json(&a, "STATUS x");
    holder = json_object_get(st, "holder");
    ck_assert_str_eq(h_json_str(holder, "daemon"), "alpha");
    json_decref(st);

    /* The value starts with the token the client was given. */
    ck_assert(h_redis_cmd(R, &val, "GET lock:x") != -3);
    ck_assert_msg(val && strncmp(val, token, 32) == 0 && val[32] == ' ',
                  "value %s", val ? val : "(nil)");
    free(val);
    h_expect(&a, "OK resource=x ", "EXTEND x ttl=30000");
    ck_assert_int_gt(h_redis_cmd(R, NULL, "PTTL lock:x"), 20000);
    h_expect(&a, "OK resource=x ", "UNLOCK x");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:x"), 0);

    /* Set by another Redlock client: foreign. */
    ck_assert(h_redis_cmd(R, NULL, "SET lock:y 0123456789abcdef0123456789abcdef"
                          " NX PX 60000") != -3);
    st = h_ok_json(&b, "STATUS y");
    holder = json_object_get(st, "holder");
    ck_assert_msg(json_is_true(json_object_get(holder, "foreign")), "%s",
                  json_dumps(st, 0));
    json_decref(st);
    h_close(&a);
    h_close(&b);
    ck_assert_int_eq(h_daemon_stop(&K.daemons[1]), 0);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    int timeout = h_slow() ? 150 : 30;

    h_cluster_fixture(tc, &K, 1, true);
    tcase_set_timeout(tc, timeout);
    tcase_add_test(tc, closing_handshake);
    tcase_add_test(tc, closing_idle);
    tcase_add_test(tc, closing_keepalive);
    tcase_add_test(tc, shutdown_leaves_held_leases);
    tcase_add_test(tc, reload_good_file);
    tcase_add_test(tc, reload_bad_file_keeps_config);
    tcase_add_test(tc, reload_node_change_needs_restart);
    tcase_add_test(tc, even_node_count_warned);
    tcase_add_test(tc, unix_socket_in_use);
    tcase_add_test(tc, unix_socket_stale_file_replaced);
    tcase_add_test(tc, unix_socket_missing_directory);
    tcase_add_test(tc, config_same_port_twice);
    tcase_add_test(tc, config_duplicate_nodes);
    tcase_add_test(tc, config_open_without_password_warns);
    tcase_add_test(tc, help_for_one_command);
    tcase_add_test(tc, auth_failures_close_the_connection);
    tcase_add_test(tc, admin_password_gates_forceunlock);
    tcase_add_test(tc, forceunlock_disabled_without_admin_password);
    tcase_add_test(tc, max_clients_per_ip);
    tcase_add_test(tc, max_waiters_per_resource);
    tcase_add_test(tc, audit_lines_and_session_ids);
    tcase_add_test(tc, unavailable_says_why_and_readmit);
    tcase_add_test(tc, status_names_holder_on_other_daemon);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(ops_suite());
}
