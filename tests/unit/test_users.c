/*
 * Unit tests for daemon/users.c: finding a user by name, what a user's
 * prefixes allow, the whole-daemon check, the constant-time compare and
 * the comparison a reload reports with. Tables where inputs vary.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "users.h"

#define ROWS(t) ((int)(sizeof(t) / sizeof((t)[0])))

static char *alice_prefixes[] = { "invoice:", "job:" };
static char *root_prefixes[] = { "" };
static char *alice2_prefixes[] = { "invoice:", "job:x" };

static struct users_user users[] = {
    { .name = "alice", .password = "pa", .prefixes = alice_prefixes,
      .nprefixes = 2 },
    { .name = "bob", .password = "pb", .prefixes = NULL, .nprefixes = 0 },
    { .name = "root", .password = "pr", .prefixes = root_prefixes,
      .nprefixes = 1, .admin = true },
};
#define NUSERS 3

static const struct { const char *name; int want; } find_rows[] = {
    { "alice", 0 }, { "bob", 1 }, { "root", 2 },
    { "alic", -1 }, { "alicex", -1 }, { "Alice", -1 }, { "", -1 },
    { "bo", -1 }, { "roo", -1 },
};

START_TEST(test_find)
{
    const char *n = find_rows[_i].name;
    const struct users_user *u = users_find(users, NUSERS, n, strlen(n));

    if (find_rows[_i].want < 0)
        ck_assert_ptr_null(u);
    else
        ck_assert_ptr_eq(u, &users[find_rows[_i].want]);
}
END_TEST

START_TEST(test_find_none)
{
    ck_assert_ptr_null(users_find(NULL, 0, "alice", 5));
    /* The length counts, not a NUL: "alice" within "alicex". */
    ck_assert_ptr_eq(users_find(users, NUSERS, "alicex", 5), &users[0]);
}
END_TEST

static const struct { int user; const char *res; bool want; } allow_rows[] = {
    { 0, "invoice:1", true }, { 0, "job:42", true }, { 0, "invoice:", true },
    { 0, "job", false }, { 0, "invoice", false }, { 0, "xjob:1", false },
    { 0, "Job:1", false }, { 0, "other", false },
    { 1, "anything", false }, { 1, "invoice:1", false },
    { 2, "anything", true }, { 2, "x", true },
};

START_TEST(test_allows)
{
    const char *r = allow_rows[_i].res;

    ck_assert_msg(users_allows(&users[allow_rows[_i].user], r, strlen(r)) ==
                  allow_rows[_i].want, "row %d: %s", _i, r);
}
END_TEST

START_TEST(test_allows_length)
{
    /* Only len bytes of the resource count. */
    ck_assert(!users_allows(&users[0], "job:1", 3));
    ck_assert(users_allows(&users[0], "job:1", 4));
}
END_TEST

/* alice ("invoice:", "job:"), bob (none), root (""). */
static const struct { int user; const char *prefix; bool want; }
overlap_rows[] = {
    { 0, "job:", true }, { 0, "job", true }, { 0, "jo", true },
    { 0, "job:42:", true }, { 0, "", true }, { 0, "invoice:", true },
    { 0, "jobs:", false }, { 0, "mail:", false }, { 0, "other", false },
    { 0, "Job:", false },
    { 1, "job:", false }, { 1, "", false },
    { 2, "anything:", true }, { 2, "", true },
};

START_TEST(test_overlaps)
{
    const char *p = overlap_rows[_i].prefix;

    ck_assert_msg(users_overlaps(&users[overlap_rows[_i].user], p, strlen(p))
                  == overlap_rows[_i].want, "row %d: %s", _i, p);
}
END_TEST

START_TEST(test_allows_all)
{
    ck_assert(!users_allows_all(&users[0]));
    ck_assert(!users_allows_all(&users[1]));
    ck_assert(users_allows_all(&users[2]));
}
END_TEST

static const struct { const char *a, *b; bool want; } equal_rows[] = {
    { "secret", "secret", true }, { "secret", "secreT", false },
    { "secre", "secret", false }, { "secrets", "secret", false },
    { "", "", true }, { "", "x", false }, { "x", "", false },
};

START_TEST(test_secret_equal)
{
    const char *a = equal_rows[_i].a;

    ck_assert(users_secret_equal(a, strlen(a), equal_rows[_i].b) ==
              equal_rows[_i].want);
}
END_TEST

START_TEST(test_same)
{
    struct users_user copy[NUSERS];

    memcpy(copy, users, sizeof(copy));
    ck_assert(users_same(users, NUSERS, copy, NUSERS));
    ck_assert(!users_same(users, NUSERS, copy, NUSERS - 1));
    ck_assert(users_same(NULL, 0, NULL, 0));
    copy[0].prefixes = alice2_prefixes;
    ck_assert(!users_same(users, NUSERS, copy, NUSERS));
    copy[0].prefixes = alice_prefixes;
    copy[1].password = "other";
    ck_assert(!users_same(users, NUSERS, copy, NUSERS));
    copy[1].password = "pb";
    copy[2].admin = false;
    ck_assert(!users_same(users, NUSERS, copy, NUSERS));
}
END_TEST

START_TEST(test_free)
{
    struct users_user *v = calloc(2, sizeof(*v));

    ck_assert_ptr_nonnull(v);
    v[0].name = strdup("a");
    v[0].password = strdup("p");
    v[0].prefixes = calloc(1, sizeof(char *));
    v[0].prefixes[0] = strdup("x:");
    v[0].nprefixes = 1;
    /* v[1] half-filled, as a load that failed leaves it. */
    v[1].name = strdup("b");
    users_free(v, 2);
    users_free(NULL, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("users");
    TCase *tc = tcase_create("users");
    SRunner *sr;
    int failed;

    tcase_add_loop_test(tc, test_find, 0, ROWS(find_rows));
    tcase_add_test(tc, test_find_none);
    tcase_add_loop_test(tc, test_allows, 0, ROWS(allow_rows));
    tcase_add_test(tc, test_allows_length);
    tcase_add_loop_test(tc, test_overlaps, 0, ROWS(overlap_rows));
    tcase_add_test(tc, test_allows_all);
    tcase_add_loop_test(tc, test_secret_equal, 0, ROWS(equal_rows));
    tcase_add_test(tc, test_same);
    tcase_add_test(tc, test_free);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
