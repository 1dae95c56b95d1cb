/*
 * test_checker: the mutual-exclusion checker of tests/integration/
 * test_mutex.c, fed by hand, so that a green fault run means "no overlap
 * was recorded" and not "the checker cannot see one".
 */
#include <check.h>
#include <stdlib.h>

#include "mutex_checker.h"

#define MAXIV 8

/* {res, holder, kind, fence, start, end} in us */
struct checker_case {
    const char *name;
    struct mc_interval iv[MAXIV];
    size_t n;
    size_t overlaps, fences, intervals, empty;
};

#define R MC_REDLOCKD
#define P MC_PLAIN
/* Designated, so a row names only what it sets. */
#define IV(r, h, k, f, s, e, ...) { .res = (r), .holder = (h), .kind = (k), \
    .fence = (f), .start = (s), .end = (e), __VA_ARGS__ }
#define SH .mode = MC_SHARED
#define SEM(k, s) .limit = (k), .slot = (s)

static const struct checker_case cases[] = {
    { "nothing", { { 0 } }, 0, 0, 0, 0, 0 },
    { "disjoint, increasing fences",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 6, 150, 200), IV(0, 1, R, 9, 300, 400) },
      3, 0, 0, 3, 0 },
    { "touching is not overlapping",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 6, 100, 200) }, 2, 0, 0, 2, 0 },
    { "overlap by one us",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 6, 99, 200) }, 2, 1, 0, 2, 0 },
    { "input order does not matter",
      { IV(0, 2, R, 6, 99, 200), IV(0, 1, R, 5, 0, 100) }, 2, 1, 0, 2, 0 },
    { "nested in a long one, and the one after it",
      { IV(0, 1, R, 5, 0, 1000), IV(0, 2, R, 6, 100, 200), IV(0, 3, R, 7, 300, 400) },
      3, 2, 0, 3, 0 },
    { "other resources do not overlap",
      { IV(0, 1, R, 5, 0, 100), IV(1, 2, R, 3, 50, 150), IV(2, 3, P, 0, 60, 70) },
      3, 0, 0, 3, 0 },
    { "plain against redlockd",
      { IV(3, 1, R, 5, 0, 100), IV(3, 9, P, 0, 50, 150) }, 2, 1, 0, 2, 0 },
    { "plain against plain",
      { IV(3, 8, P, 0, 0, 100), IV(3, 9, P, 0, 50, 150) }, 2, 1, 0, 2, 0 },
    { "equal fence",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 5, 200, 300) }, 2, 0, 1, 2, 0 },
    { "decreasing fence",
      { IV(0, 1, R, 7, 0, 100), IV(0, 2, R, 6, 200, 300), IV(0, 3, R, 8, 400, 500) },
      3, 0, 1, 3, 0 },
    { "fences compared in start order, not input order",
      { IV(0, 3, R, 8, 400, 500), IV(0, 1, R, 6, 0, 100), IV(0, 2, R, 7, 200, 300) },
      3, 0, 0, 3, 0 },
    { "plain intervals have no fence",
      { IV(0, 1, R, 7, 0, 100), IV(0, 9, P, 0, 150, 180), IV(0, 2, R, 8, 200, 300) },
      3, 0, 0, 3, 0 },
    { "fences are per resource",
      { IV(0, 1, R, 7, 0, 100), IV(1, 2, R, 3, 200, 300), IV(0, 3, R, 8, 400, 500) },
      3, 0, 0, 3, 0 },
    { "empty grants take part in neither check",
      { IV(0, 1, R, 9, 0, 100), IV(0, 2, R, 4, 50, 50), IV(0, 3, R, 3, 80, 20),
        IV(0, 4, R, 10, 100, 200) },
      4, 0, 0, 2, 2 },
    { "an overlap that also reorders fences counts as both",
      { IV(0, 1, R, 9, 0, 100), IV(0, 2, R, 4, 50, 150) }, 2, 1, 1, 2, 0 },
    /* modes */
    { "shared holds overlap freely, fences in any order",
      { IV(0, 1, R, 5, 0, 100, SH), IV(0, 2, R, 4, 50, 150, SH),
        IV(0, 3, R, 6, 60, 70, SH) }, 3, 0, 0, 3, 0 },
    { "a writer among readers",
      { IV(0, 1, R, 5, 0, 100, SH), IV(0, 2, R, 6, 50, 150) }, 2, 1, 0, 2, 0 },
    { "a reader under a writer",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 6, 50, 60, SH) }, 2, 1, 0, 2, 0 },
    { "a writer after readers: above all of them",
      { IV(0, 1, R, 5, 0, 100, SH), IV(0, 2, R, 9, 10, 120, SH),
        IV(0, 3, R, 7, 200, 300) }, 3, 0, 1, 3, 0 },
    { "a reader after a writer: above it",
      { IV(0, 1, R, 5, 0, 100), IV(0, 2, R, 4, 200, 300, SH) }, 2, 0, 1, 2, 0 },
    { "readers, writer, readers in order",
      { IV(0, 1, R, 5, 0, 100, SH), IV(0, 2, R, 3, 10, 90, SH),
        IV(0, 3, R, 6, 100, 200), IV(0, 4, R, 8, 210, 300, SH),
        IV(0, 5, R, 7, 220, 310, SH) }, 5, 0, 0, 5, 0 },
    { "plain against a reader",
      { IV(0, 1, R, 5, 0, 100, SH), IV(0, 9, P, 0, 50, 60) }, 2, 1, 0, 2, 0 },
    /* semaphores */
    { "K holders of K on their slots",
      { IV(2, 1, R, 5, 0, 100, SEM(3, 0)), IV(2, 2, R, 1, 10, 100, SEM(3, 1)),
        IV(2, 3, R, 2, 20, 100, SEM(3, 2)) }, 3, 0, 0, 3, 0 },
    { "K+1 holders (the third on a held slot, below its fence too)",
      { IV(2, 1, R, 5, 0, 100, SEM(2, 0)), IV(2, 2, R, 1, 10, 100, SEM(2, 1)),
        IV(2, 3, R, 2, 20, 100, SEM(2, 0)) }, 3, 1, 1, 3, 0 },
    { "K+1 holders, even on slots that look free",
      { IV(2, 1, R, 5, 0, 100, SEM(2, 0)), IV(2, 2, R, 1, 10, 100, SEM(2, 1)),
        IV(2, 3, R, 2, 20, 100, SEM(2, 2)) }, 3, 1, 0, 3, 0 },
    { "a slot held twice",
      { IV(2, 1, R, 5, 0, 100, SEM(3, 1)), IV(2, 2, R, 6, 10, 100, SEM(3, 1)) },
      2, 1, 0, 2, 0 },
    { "fences per slot",
      { IV(2, 1, R, 5, 0, 100, SEM(3, 1)), IV(2, 2, R, 3, 10, 100, SEM(3, 0)),
        IV(2, 3, R, 4, 100, 200, SEM(3, 0)), IV(2, 4, R, 5, 150, 200, SEM(3, 1)) },
      4, 0, 1, 4, 0 },
};

START_TEST(checker_table)
{
    const struct checker_case *c = &cases[_i];
    struct mc_log log;
    struct mc_report rep;

    mc_log_init(&log);
    for (size_t k = 0; k < c->n; k++)
        ck_assert_int_eq(mc_log_add(&log, &c->iv[k]), 0);
    ck_assert_int_eq(mc_check(&log, &rep), 0);
    ck_assert_msg(rep.overlaps == c->overlaps, "%s: %zu overlaps, want %zu\n%s",
                  c->name, rep.overlaps, c->overlaps, rep.msg);
    ck_assert_msg(rep.fence_violations == c->fences,
                  "%s: %zu fence violations, want %zu\n%s", c->name,
                  rep.fence_violations, c->fences, rep.msg);
    ck_assert_msg(rep.intervals == c->intervals && rep.empty == c->empty,
                  "%s: %zu intervals and %zu empty, want %zu and %zu", c->name,
                  rep.intervals, rep.empty, c->intervals, c->empty);
    ck_assert_msg((rep.overlaps + rep.fence_violations == 0) == (rep.msg[0] == '\0'),
                  "%s: a violation without a description, or the reverse: %s",
                  c->name, rep.msg);
    mc_log_deinit(&log);
}
END_TEST

/* Many intervals (the log grows past its first allocation), then one
 * overlap planted among them; the message stays bounded. */
START_TEST(checker_many)
{
    struct mc_log log;
    struct mc_report rep;
    struct mc_interval iv = { .kind = MC_REDLOCKD };

    mc_log_init(&log);
    for (int i = 0; i < 5000; i++) {
        iv.res = i % 4;
        iv.holder = i % 16;
        iv.fence = (uint64_t)i + 1;
        iv.start = (int64_t)i * 100;
        iv.end = iv.start + 90;
        ck_assert_int_eq(mc_log_add(&log, &iv), 0);
    }
    ck_assert_int_eq(mc_check(&log, &rep), 0);
    ck_assert_uint_eq(rep.overlaps, 0);
    ck_assert_uint_eq(rep.fence_violations, 0);
    ck_assert_uint_eq(rep.intervals, 5000);
    /* Every resource-0 interval after the first overlaps this one. */
    iv.res = 0;
    iv.fence = 1;
    iv.start = 95;
    iv.end = 1000000;
    ck_assert_int_eq(mc_log_add(&log, &iv), 0);
    ck_assert_int_eq(mc_check(&log, &rep), 0);
    ck_assert_uint_eq(rep.overlaps, 1249);
    ck_assert_uint_eq(rep.fence_violations, 1);
    ck_assert(rep.msg[MC_MSG_SIZE - 1] == '\0');
    mc_log_deinit(&log);
}
END_TEST

static Suite *checker_suite(void)
{
    Suite *s = suite_create("checker");
    TCase *tc = tcase_create("checker");

    tcase_add_loop_test(tc, checker_table, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_test(tc, checker_many);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(checker_suite());
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
