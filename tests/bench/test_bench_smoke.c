/*
 * test_bench_smoke: the load generator still runs against a real daemon.
 *
 * Not a benchmark: it asserts no figure, only that redlockd-bench completes
 * (every connection set up, cycles done, every reply back: --strict) and
 * that it saw no mutual-exclusion failure in contend mode (a grant while
 * another connection holds the lock, or a fence that did not increase).
 * The daemon runs against three redis-server nodes, as in scripts/bench.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct h_redis R[3];
static struct h_daemon D;

static void setup(void)
{
    h_redis_start_all(R, 3, NULL);
    h_daemon_start(&D, R, 3, NULL);
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

/* Run redlockd-bench against D with the given mode and options; returns
 * its output (static), asserting exit status 0. */
static const char *run_bench(const char *mode, const char *const *opts)
{
    static char out[1 << 16];
    char server[64], pid[32];
    char *argv[32];
    int argc = 0, rc;

    snprintf(server, sizeof(server), "127.0.0.1:%d", D.port);
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

static Suite *bench_smoke_suite(void)
{
    Suite *s = suite_create("bench_smoke");
    TCase *tc = tcase_create("bench_smoke");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, contended_two_seconds);
    tcase_add_test(tc, uncontended_one_second);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(bench_smoke_suite());
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
