/*
 * test_bench_smoke: the load generator still runs against a real daemon.
 *
 * Not a benchmark: it asserts no figure, only that redlockd-bench completes
 * (every connection set up, cycles done, every reply back: --strict) and
 * that it saw no mutual-exclusion failure in contend mode (a grant while
 * another connection holds the lock, or a fence that did not increase).
 * The daemon runs against three redis-server nodes, as in scripts/bench,
 * and listens on tls:// as well (certificates from tests/tools/mkcerts.sh),
 * so that the tool's TLS mode runs once too.
 */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static struct h_redis R[3];
static struct h_daemon D;

static void setup(void)
{
    char extra[1024];

    snprintf(extra, sizeof(extra),
             "{\"tls\": {\"cert_file\": \"%s/server.crt\", "
             "\"key_file\": \"%s/server.key\"}}", h_certs_dir(), h_certs_dir());
    h_redis_start_all(R, 3, NULL);
    h_daemon_start(&D, R, 3, extra);
    ck_assert_int_gt(D.tls_port, 0);
    h_wait_voting(&D, 3, h_scale(5000));
}

static void teardown(void)
{
    int rc = h_daemon_finish(&D);

    h_daemon_cleanup(&D);
    h_redis_cleanup_all(R, 3);
    ck_assert_msg(rc == 0, "redlockd exited with status %d on SIGTERM", rc);
}

static const char *bench_bin(void)
{
    const char *b = getenv("REDLOCKD_BENCH_BIN");

    ck_assert_msg(b && *b, "REDLOCKD_BENCH_BIN is not set (meson sets it)");
    return b;
}

/* Run redlockd-bench against D (its tls:// port with `tls`) with the
 * given mode and options; returns its output (static), asserting exit
 * status 0. */
static const char *run_bench_on(bool tls, const char *mode,
                                const char *const *opts)
{
    static char out[1 << 16];
    char server[64], pid[32];
    char *argv[32];
    int argc = 0, rc;

    snprintf(server, sizeof(server), "%s127.0.0.1:%d", tls ? "tls://" : "",
             tls ? D.tls_port : D.port);
    snprintf(pid, sizeof(pid), "%d", (int)D.pid);
    argv[argc++] = (char *)bench_bin();
    argv[argc++] = "-s";
    argv[argc++] = server;
    argv[argc++] = "--pid";
    argv[argc++] = pid;
    argv[argc++] = "--strict";
    for (; *opts && argc < 30; opts++)
        argv[argc++] = (char *)*opts;
    argv[argc++] = (char *)mode;
    argv[argc] = NULL;
    rc = h_run(argv, out, sizeof(out));
    fprintf(stderr, "%s\n", out);
    if (rc != 0)
        h_daemon_dump_log(&D);
    ck_assert_msg(rc != 4, "redlockd-bench %s saw a mutual-exclusion violation",
                  mode);
    ck_assert_msg(rc == 0, "redlockd-bench %s exited %d (5: did not complete)",
                  mode, rc);
    ck_assert_msg(strstr(out, "complete:          yes") != NULL,
                  "redlockd-bench %s did not report completion", mode);
    return out;
}

static const char *run_bench(const char *mode, const char *const *opts)
{
    return run_bench_on(false, mode, opts);
}

/* 16 connections queue on one resource for 2 s, each holding it 1 ms. */
START_TEST(contended_two_seconds)
{
    char wait[32];
    const char *opts[] = { "-c", "16", "-d", "2", "--hold-ms", "1", "-w", wait,
                           NULL };
    const char *out;

    snprintf(wait, sizeof(wait), "%d", h_scale(10000));
    out = run_bench("contend", opts);
    ck_assert_msg(strstr(out, "mutual exclusion:  0 violations, 0 fences") != NULL,
                  "no clean mutual-exclusion line in the output");
}
END_TEST

/* The uncontended loop the benchmark mostly runs: one resource per
 * connection, LOCK+UNLOCK. */
START_TEST(uncontended_one_second)
{
    const char *opts[] = { "-c", "16", "-d", "1", "--fixed", NULL };

    run_bench("lock", opts);
}
END_TEST

/* The same over TLS, the server checked against the test CA: the
 * handshakes while connecting, then SSL_read/SSL_write on the epoll loop;
 * pipelined pairs, so that replies queue in OpenSSL's buffer too. */
START_TEST(uncontended_tls)
{
    char ca[300];
    const char *opts[] = { "-c", "8", "-d", "1", "-P", "4", "--fixed",
                           "--tls-ca", ca, NULL };
    const char *out;

    snprintf(ca, sizeof(ca), "%s", h_cert("ca.crt"));
    out = run_bench_on(true, "lock", opts);
    ck_assert_msg(strstr(out, "TLS:               TLSv1.") != NULL,
                  "no TLS line in the output");
}
END_TEST

static Suite *bench_smoke_suite(void)
{
    Suite *s = suite_create("bench_smoke");
    TCase *tc = tcase_create("bench_smoke");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, contended_two_seconds);
    tcase_add_test(tc, uncontended_one_second);
    tcase_add_test(tc, uncontended_tls);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr;
    int failed;

    h_certs_make();
    sr = srunner_create(bench_smoke_suite());
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    h_certs_remove();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
