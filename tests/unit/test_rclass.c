/*
 * Unit tests for daemon/rclass.c: classes by the first ':' and by a list
 * of prefixes (the longest wins), names without ':', the bound of
 * max_classes (everything past it is "other", however many names come),
 * the names and indexes handed out, and rclass_same for a reload. Tables
 * where inputs vary.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rclass.h"

#define ROWS(t) ((int)(sizeof(t) / sizeof((t)[0])))

/* The name of res's class under rc. */
static const char *class_of(struct rclass *rc, const char *res)
{
    return rclass_name(rc, rclass_of(rc, res, strlen(res)));
}

static const struct { const char *res, *want; } prefix_rows[] = {
    { "job:42", "job:" },
    { "job:", "job:" },
    { "job:a:b", "job:" },          /* the first ':' */
    { "invoice:2024:7", "invoice:" },
    { ":x", ":" },
    { "job", "other" },             /* no ':' at all */
    { "jobs", "other" },
    { "Job:1", "Job:" },            /* byte for byte */
};

START_TEST(test_prefix_mode)
{
    struct rclass *rc = rclass_create(NULL, 0, 32);

    ck_assert_str_eq(class_of(rc, prefix_rows[_i].res), prefix_rows[_i].want);
    rclass_destroy(rc);
}
END_TEST

START_TEST(test_prefix_indexes)
{
    struct rclass *rc = rclass_create(NULL, 0, 32);

    ck_assert_uint_eq(rclass_count(rc), 1);
    ck_assert_str_eq(rclass_name(rc, RCLASS_OTHER), "other");
    ck_assert_uint_eq(rclass_of(rc, "plain", 5), RCLASS_OTHER);
    ck_assert_uint_eq(rclass_count(rc), 1);      /* "other" names nothing */
    ck_assert_uint_eq(rclass_of(rc, "job:1", 5), 1);
    ck_assert_uint_eq(rclass_of(rc, "mail:1", 6), 2);
    ck_assert_uint_eq(rclass_of(rc, "job:2", 5), 1);    /* met before */
    ck_assert_uint_eq(rclass_count(rc), 3);
    ck_assert_str_eq(rclass_name(rc, 2), "mail:");
    /* Only len bytes count: "job:1" cut before its ':' has none. */
    ck_assert_uint_eq(rclass_of(rc, "job:1", 3), RCLASS_OTHER);
    rclass_destroy(rc);
}
END_TEST

static const char *const listed[] = { "invoice:", "job:", "job:urgent:", "x" };

static const struct { const char *res, *want; } list_rows[] = {
    { "invoice:1", "invoice:" },
    { "job:42", "job:" },
    { "job:urgent:7", "job:urgent:" },  /* the longest listed prefix */
    { "job:urgent", "job:" },
    { "xylophone", "x" },               /* a prefix need not end in ':' */
    { "x", "x" },
    { "mail:1", "other" },              /* no listed prefix */
    { "jo", "other" },
    { "invoice", "other" },
    { "plain", "other" },
};

START_TEST(test_list_mode)
{
    struct rclass *rc = rclass_create(listed, 4, 32);

    ck_assert_str_eq(class_of(rc, list_rows[_i].res), list_rows[_i].want);
    /* A list names its classes up front, in its order, and no others. */
    ck_assert_uint_eq(rclass_count(rc), 5);
    ck_assert_str_eq(rclass_name(rc, 1), "invoice:");
    ck_assert_str_eq(rclass_name(rc, 4), "x");
    rclass_destroy(rc);
}
END_TEST

START_TEST(test_list_empty)
{
    struct rclass *rc = rclass_create(listed, 0, 32);

    ck_assert_str_eq(class_of(rc, "job:1"), "other");
    ck_assert_uint_eq(rclass_count(rc), 1);
    rclass_destroy(rc);
}
END_TEST

/* max_classes: the first ones met are named, every later one is "other",
 * for as many names as clients send; the known ones stay theirs. */
START_TEST(test_overflow_other)
{
    struct rclass *rc = rclass_create(NULL, 0, 3);
    char name[32];

    for (int i = 0; i < 10000; i++) {
        size_t k;

        snprintf(name, sizeof(name), "p%d:%d", i, i);
        k = rclass_of(rc, name, strlen(name));
        ck_assert_uint_eq(k, i < 3 ? (size_t)i + 1 : RCLASS_OTHER);
    }
    ck_assert_uint_eq(rclass_count(rc), 4);
    ck_assert_str_eq(class_of(rc, "p1:x"), "p1:");
    ck_assert_str_eq(class_of(rc, "p3:x"), "other");
    ck_assert_str_eq(class_of(rc, "nocolon"), "other");
    rclass_destroy(rc);
}
END_TEST

START_TEST(test_max_zero)
{
    struct rclass *rc = rclass_create(NULL, 0, 0);

    ck_assert_str_eq(class_of(rc, "job:1"), "other");
    ck_assert_uint_eq(rclass_count(rc), 1);
    rclass_destroy(rc);
}
END_TEST

START_TEST(test_same)
{
    static const char *const two[] = { "invoice:", "job:" };
    static const char *const swapped[] = { "job:", "invoice:" };
    struct rclass *byprefix = rclass_create(NULL, 0, 32);
    struct rclass *bylist = rclass_create(two, 2, 32);

    ck_assert(rclass_same(byprefix, NULL, 0, 32));
    ck_assert(!rclass_same(byprefix, NULL, 0, 33));
    ck_assert(!rclass_same(byprefix, two, 2, 32));
    ck_assert(rclass_same(bylist, two, 2, 32));
    ck_assert(!rclass_same(bylist, two, 1, 32));
    ck_assert(!rclass_same(bylist, swapped, 2, 32));
    ck_assert(!rclass_same(bylist, NULL, 0, 32));
    ck_assert(!rclass_same(bylist, two, 2, 8));
    /* Classes met by "prefix" change nothing: the settings are the same. */
    rclass_of(byprefix, "job:1", 5);
    ck_assert(rclass_same(byprefix, NULL, 0, 32));
    rclass_destroy(byprefix);
    rclass_destroy(bylist);
    rclass_destroy(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rclass");
    TCase *tc = tcase_create("rclass");
    SRunner *sr;
    int failed;

    tcase_add_loop_test(tc, test_prefix_mode, 0, ROWS(prefix_rows));
    tcase_add_test(tc, test_prefix_indexes);
    tcase_add_loop_test(tc, test_list_mode, 0, ROWS(list_rows));
    tcase_add_test(tc, test_list_empty);
    tcase_add_test(tc, test_overflow_other);
    tcase_add_test(tc, test_max_zero);
    tcase_add_test(tc, test_same);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
