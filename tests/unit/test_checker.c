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

static const struct checker_case cases[] = {
    { "nothing", { { 0 } }, 0, 0, 0, 0, 0 },
    { "disjoint, increasing fences",
      { { 0, 1, R, 5, 0, 100 }, { 0, 2, R, 6, 150, 200 }, { 0, 1, R, 9, 300, 400 } },
      3, 0, 0, 3, 0 },
    { "touching is not overlapping",
      { { 0, 1, R, 5, 0, 100 }, { 0, 2, R, 6, 100, 200 } }, 2, 0, 0, 2, 0 },
    { "overlap by one us",
      { { 0, 1, R, 5, 0, 100 }, { 0, 2, R, 6, 99, 200 } }, 2, 1, 0, 2, 0 },
    { "input order does not matter",
      { { 0, 2, R, 6, 99, 200 }, { 0, 1, R, 5, 0, 100 } }, 2, 1, 0, 2, 0 },
    { "nested in a long one, and the one after it",
      { { 0, 1, R, 5, 0, 1000 }, { 0, 2, R, 6, 100, 200 }, { 0, 3, R, 7, 300, 400 } },
      3, 2, 0, 3, 0 },
    { "other resources do not overlap",
      { { 0, 1, R, 5, 0, 100 }, { 1, 2, R, 3, 50, 150 }, { 2, 3, P, 0, 60, 70 } },
      3, 0, 0, 3, 0 },
    { "plain against redlockd",
      { { 3, 1, R, 5, 0, 100 }, { 3, 9, P, 0, 50, 150 } }, 2, 1, 0, 2, 0 },
    { "plain against plain",
      { { 3, 8, P, 0, 0, 100 }, { 3, 9, P, 0, 50, 150 } }, 2, 1, 0, 2, 0 },
    { "equal fence",
      { { 0, 1, R, 5, 0, 100 }, { 0, 2, R, 5, 200, 300 } }, 2, 0, 1, 2, 0 },
    { "decreasing fence",
      { { 0, 1, R, 7, 0, 100 }, { 0, 2, R, 6, 200, 300 }, { 0, 3, R, 8, 400, 500 } },
      3, 0, 1, 3, 0 },
    { "fences compared in start order, not input order",
      { { 0, 3, R, 8, 400, 500 }, { 0, 1, R, 6, 0, 100 }, { 0, 2, R, 7, 200, 300 } },
      3, 0, 0, 3, 0 },
    { "plain intervals have no fence",
      { { 0, 1, R, 7, 0, 100 }, { 0, 9, P, 0, 150, 180 }, { 0, 2, R, 8, 200, 300 } },
      3, 0, 0, 3, 0 },
    { "fences are per resource",
      { { 0, 1, R, 7, 0, 100 }, { 1, 2, R, 3, 200, 300 }, { 0, 3, R, 8, 400, 500 } },
      3, 0, 0, 3, 0 },
    { "empty grants take part in neither check",
      { { 0, 1, R, 9, 0, 100 }, { 0, 2, R, 4, 50, 50 }, { 0, 3, R, 3, 80, 20 },
        { 0, 4, R, 10, 100, 200 } },
      4, 0, 0, 2, 2 },
    { "an overlap that also reorders fences counts as both",
      { { 0, 1, R, 9, 0, 100 }, { 0, 2, R, 4, 50, 150 } }, 2, 1, 1, 2, 0 },
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
