/*
 * test_label: the holder label (daemon/label.h), written, split out of a
 * key's value and read back, on tables.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "label.h"

#define TOKEN "0123456789abcdef0123456789abcdef"

static char *written(const struct label *l)
{
    static char buf[512];
    size_t n = label_write(l, NULL);

    ck_assert_uint_lt(n, sizeof(buf));
    ck_assert_uint_eq(label_write(l, buf), n);
    ck_assert_uint_eq(strlen(buf), n);
    return buf;
}

START_TEST(write_forms)
{
    static const struct {
        struct label l;
        const char *want;
    } rows[] = {
        { { "host-a", "s1.x", NULL, NULL, 0 },
          "{\"daemon\":\"host-a\",\"session\":\"s1.x\"}" },
        { { "host-a", "s1.x", "", "", 0 },
          "{\"daemon\":\"host-a\",\"session\":\"s1.x\"}" },
        { { "host-a", "s1.x", "backup 3", NULL, 0 },
          "{\"daemon\":\"host-a\",\"session\":\"s1.x\",\"name\":\"backup 3\"}" },
        { { "h", "s", "n", NULL, 5 },
          "{\"daemon\":\"h\",\"session\":\"s\",\"name\":\"n\",\"limit\":5}" },
        { { NULL, "s", NULL, NULL, 0 }, "{\"daemon\":\"\",\"session\":\"s\"}" },
        /* Quotes and backslashes escaped; control bytes never stored. */
        { { "h", "s", "a\"b\\c\td", NULL, 0 },
          "{\"daemon\":\"h\",\"session\":\"s\",\"name\":\"a\\\"b\\\\cd\"}" },
        /* The holder's value last (before a slot's limit, never with it). */
        { { "h", "s", "n", "10.0.0.7:80", 0 },
          "{\"daemon\":\"h\",\"session\":\"s\",\"name\":\"n\",\"value\":\"10.0.0.7:80\"}" },
        { { "h", "s", NULL, "a,\"value\":\"b", 0 },
          "{\"daemon\":\"h\",\"session\":\"s\",\"value\":\"a,\\\"value\\\":\\\"b\"}" },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        ck_assert_str_eq(written(&rows[i].l), rows[i].want);
}
END_TEST

START_TEST(write_read_back)
{
    const struct label l = { "host-a", "s9.y", "x\",\"daemon\":\"evil",
                             "v\"=1", 7 };
    json_t *h = label_holder(written(&l));

    ck_assert_ptr_nonnull(h);
    ck_assert_str_eq(json_string_value(json_object_get(h, "daemon")),
                     "host-a");
    ck_assert_str_eq(json_string_value(json_object_get(h, "session")),
                     "s9.y");
    ck_assert_str_eq(json_string_value(json_object_get(h, "name")),
                     "x\",\"daemon\":\"evil");
    ck_assert_str_eq(json_string_value(json_object_get(h, "value")), "v\"=1");
    ck_assert_int_eq(json_integer_value(json_object_get(h, "limit")), 7);
    json_decref(h);
    /* Not a label of ours: a foreign client's value. */
    ck_assert_ptr_null(label_holder("{\"daemon\":1,\"session\":\"s\"}"));
    ck_assert_ptr_null(label_holder("[1]"));
    ck_assert_ptr_null(label_holder("not json"));
    ck_assert_ptr_null(label_holder(NULL));
}
END_TEST

START_TEST(split_values)
{
    static const struct {
        const char *value;
        bool ours;
        const char *label;
        uint64_t fence;
    } rows[] = {
        { TOKEN " {\"daemon\":\"h\",\"session\":\"s\"} 42", true,
          "{\"daemon\":\"h\",\"session\":\"s\"}", 42 },
        /* A name with spaces: the value splits at its first and last. */
        { TOKEN " {\"name\":\"a b c\"} 7", true, "{\"name\":\"a b c\"}", 7 },
        { TOKEN, false, NULL, 0 },                 /* a bare token */
        { "foreign-value", false, NULL, 0 },
        { TOKEN " {} x", false, NULL, 0 },         /* no fence */
        { TOKEN "  1", false, NULL, 0 },           /* no label */
        { "0123456789ABCDEF0123456789abcdef {} 1", false, NULL, 0 },
        { TOKEN " {} 99999999999999999999", false, NULL, 0 },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char *v = strdup(rows[i].value);
        const char *label = NULL;
        uint64_t fence = 0;
        bool ours = label_split(v, strlen(v), &label, &fence);

        ck_assert_msg(ours == rows[i].ours, "row %zu", i);
        if (ours) {
            ck_assert_str_eq(v, TOKEN);
            ck_assert_str_eq(label, rows[i].label);
            ck_assert_uint_eq(fence, rows[i].fence);
        } else {
            ck_assert_str_eq(v, rows[i].value);     /* untouched */
        }
        free(v);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("label");
    TCase *tc = tcase_create("label");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, write_forms);
    tcase_add_test(tc, write_read_back);
    tcase_add_test(tc, split_values);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
