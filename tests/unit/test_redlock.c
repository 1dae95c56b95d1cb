/*
 * Unit tests for the pure Redlock arithmetic (daemon/redlock.c): quorum,
 * clock drift, validity, the outcome of a round of votes, and tokens.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

START_TEST(test_quorum)
{
    static const int want[] = { 0, 1, 2, 2, 3, 3, 4, 4 };
    for (int n = 1; n <= 7; n++)
        ck_assert_int_eq(redlock_quorum(n), want[n]);
}
END_TEST

static const struct {
    uint32_t ttl;
    double factor;
    int64_t want;
} drift_cases[] = {
    { 30000, 0.01, 300 + 2 },
    { 100, 0.01, 1 + 2 },                   /* truncated, not rounded */
    { 199, 0.01, 1 + 2 },
    { 1000, 0.0, 2 },                       /* no factor: only the 2 ms */
    { 86400000, 0.01, 864000 + 2 },         /* max_ttl_ms's default */
    { 4294967295u, 0.49, 2104533974 + 2 },   /* largest ttl and factor */
};

START_TEST(test_drift)
{
    for (size_t i = 0; i < sizeof(drift_cases) / sizeof(drift_cases[0]); i++) {
        int64_t got = redlock_drift_ms(drift_cases[i].ttl,
                                       drift_cases[i].factor);
        ck_assert_msg(got == drift_cases[i].want,
                      "case %zu: ttl=%u factor=%g: got %ld want %ld", i,
                      drift_cases[i].ttl, drift_cases[i].factor, (long)got,
                      (long)drift_cases[i].want);
        /* Validity takes exactly that drift off the ttl. */
        ck_assert_int_eq(redlock_validity(drift_cases[i].ttl, 0,
                                          drift_cases[i].factor),
                         (int64_t)drift_cases[i].ttl - got);
    }
}
END_TEST

static const struct {
    uint32_t ttl;
    uint64_t elapsed;
    double drift;
    int64_t want;
} validity_cases[] = {
    { 30000, 0, 0.01, 30000 - 300 - 2 },
    { 30000, 100, 0.01, 30000 - 100 - 302 },
    { 10000, 120, 0.01, 10000 - 120 - 102 },
    { 100, 0, 0.01, 100 - 1 - 2 },          /* drift truncates: 1 ms */
    { 100, 97, 0.01, 0 },                   /* exactly used up */
    { 100, 98, 0.01, -1 },                  /* past it */
    { 1000, 0, 0.0, 998 },                  /* no drift: only the 2 ms */
    { 1000, 5000, 0.01, 1000 - 5000 - 12 }, /* slow node: negative */
    { 86400000, 3, 0.01, 86400000 - 3 - 864002 },
    { 4294967295u, 0, 0.01, 4294967295LL - 42949672 - 2 },
};

START_TEST(test_validity)
{
    for (size_t i = 0; i < sizeof(validity_cases) / sizeof(validity_cases[0]); i++) {
        int64_t got = redlock_validity(validity_cases[i].ttl,
                                       validity_cases[i].elapsed,
                                       validity_cases[i].drift);
        ck_assert_msg(got == validity_cases[i].want,
                      "case %zu: ttl=%u elapsed=%lu: got %ld want %ld", i,
                      validity_cases[i].ttl,
                      (unsigned long)validity_cases[i].elapsed, (long)got,
                      (long)validity_cases[i].want);
    }
}
END_TEST

static const struct {
    int n, ok, busy, failed;
    int64_t validity;
    enum redlock_status want;
} decide_cases[] = {
    { 1, 1, 0, 0, 10, REDLOCK_OK },
    { 1, 0, 1, 0, 10, REDLOCK_BUSY },
    { 1, 0, 0, 1, 10, REDLOCK_UNAVAILABLE },
    { 1, 1, 0, 0, 0, REDLOCK_UNAVAILABLE },     /* validity must be > 0 */
    { 3, 3, 0, 0, 10, REDLOCK_OK },
    { 3, 2, 1, 0, 10, REDLOCK_OK },
    { 3, 2, 0, 1, 10, REDLOCK_OK },             /* one node down is fine */
    { 3, 2, 0, 1, -5, REDLOCK_UNAVAILABLE },    /* too slow */
    { 3, 1, 2, 0, 10, REDLOCK_BUSY },
    { 3, 0, 3, 0, 10, REDLOCK_BUSY },
    { 3, 1, 0, 2, 10, REDLOCK_UNAVAILABLE },    /* two nodes stopped */
    { 3, 0, 0, 3, 10, REDLOCK_UNAVAILABLE },
    { 3, 1, 1, 1, 10, REDLOCK_UNAVAILABLE },    /* could have been ours */
    { 3, 0, 2, 1, 10, REDLOCK_BUSY },           /* held on a majority */
    { 5, 3, 2, 0, 10, REDLOCK_OK },
    { 5, 2, 3, 0, 10, REDLOCK_BUSY },
    { 5, 2, 2, 1, 10, REDLOCK_UNAVAILABLE },
    { 5, 0, 3, 2, 10, REDLOCK_BUSY },
    { 7, 4, 0, 3, 1, REDLOCK_OK },
    { 7, 3, 0, 4, 1, REDLOCK_UNAVAILABLE },
    { 2, 1, 1, 0, 10, REDLOCK_BUSY },           /* even N: quorum 2 */
    { 2, 2, 0, 0, 10, REDLOCK_OK },
};

START_TEST(test_decide)
{
    for (size_t i = 0; i < sizeof(decide_cases) / sizeof(decide_cases[0]); i++) {
        enum redlock_status got = redlock_decide(decide_cases[i].n,
            decide_cases[i].ok, decide_cases[i].busy, decide_cases[i].failed,
            decide_cases[i].validity);
        ck_assert_msg(got == decide_cases[i].want, "case %zu: got %d want %d",
                      i, got, decide_cases[i].want);
    }
}
END_TEST

START_TEST(test_token)
{
    char a[REDLOCK_TOKEN_LEN + 1], b[REDLOCK_TOKEN_LEN + 1];

    ck_assert_int_eq(redlock_token(a), 0);
    ck_assert_int_eq(redlock_token(b), 0);
    ck_assert_uint_eq(strlen(a), 32);
    ck_assert_uint_eq(strspn(a, "0123456789abcdef"), 32);
    ck_assert_str_ne(a, b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("redlock");
    TCase *tc = tcase_create("pure");
    tcase_add_test(tc, test_quorum);
    tcase_add_test(tc, test_drift);
    tcase_add_test(tc, test_validity);
    tcase_add_test(tc, test_decide);
    tcase_add_test(tc, test_token);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
