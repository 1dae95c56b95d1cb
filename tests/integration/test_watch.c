/*
 * test_watch: holder values and watching locks (protocol.md, "Watching a
 * lock"), against real redis-server nodes and two daemons on them.
 *
 * Values:
 *   - LOCK value= is shown by STATUS on the other daemon and by LOCKS; the
 *     key still starts with the token (foreign Redlock clients compare
 *     that); EXTEND value= replaces it without giving up the lock (same
 *     token and fence), with or without ttl=; shared holds and semaphore
 *     slots take no value; an ADOPT on the other daemon carries it over.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NNODES 3

static struct h_cluster K;
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];

/* Nodes and both daemons; A on daemon 0, B on daemon 1. */
static void start(const char *extra_json)
{
    h_cluster_start(&K, NNODES, 2, extra_json, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 1);
}

/* STATUS's "holder" object on c (asserted there); the caller decrefs the
 * whole reply (*root). */
static json_t *status_holder(struct h_client *c, const char *res,
                             json_t **root)
{
    json_t *h;

    *root = h_ok_json(c, "STATUS %s", res);
    h = json_object_get(*root, "holder");
    ck_assert_msg(json_is_object(h), "STATUS %s: no holder", res);
    return h;
}

static void assert_status_value(struct h_client *c, const char *res,
                                const char *want)
{
    json_t *root, *h = status_holder(c, res, &root);
    const char *got = json_string_value(json_object_get(h, "value"));

    ck_assert_msg(got && strcmp(got, want) == 0, "STATUS %s: value %s, want "
                  "%s", res, got ? got : "(none)", want);
    json_decref(root);
}

/* ---- values ---- */

START_TEST(value_shown_replaced_adopted)
{
    char token[64], fence[32], *line, *v = NULL;
    json_t *o, *l;

    start(NULL);
    h_expect(A, "OK ", "HELLO name=alice");
    line = h_expect(A, "OK resource=leader:x ",
                    "LOCK leader:x ttl=20000 value=http://10.0.0.7:8080/a?b=c");
    h_kv_copy(line, "token", token, sizeof(token));
    h_kv_copy(line, "fence", fence, sizeof(fence));

    /* The other daemon reads it off the nodes; LOCKS shows it too. */
    assert_status_value(B, "leader:x", "http://10.0.0.7:8080/a?b=c");
    o = h_ok_json(A, "LOCKS");
    l = json_array_get(json_object_get(o, "locks"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(l, "value")),
                     "http://10.0.0.7:8080/a?b=c");
    json_decref(o);
    /* Foreign clients compare the token at the start of the key. */
    ck_assert_int_ge(h_redis_cmd(&K.nodes[0], &v, "GET lock:leader:x"), 0);
    ck_assert_msg(v && strncmp(v, token, strlen(token)) == 0 &&
                  v[strlen(token)] == ' ', "key value %s", v ? v : "(none)");
    free(v);

    /* Replaced in place: the same token and fence, the ttl as it was. */
    line = h_expect(A, "OK resource=leader:x ", "EXTEND leader:x value=v2");
    ck_assert_ptr_nonnull(h_kv(line, "validity"));
    assert_status_value(B, "leader:x", "v2");
    assert_status_value(A, "leader:x", "v2");
    ck_assert_int_gt(h_redis_cmd(&K.nodes[1], NULL, "PTTL lock:leader:x"),
                     15000);
    line = h_expect(A, "OK resource=leader:x ",
                    "EXTEND leader:x value=v3 ttl=5000");
    ck_assert_int_le(h_redis_cmd(&K.nodes[2], NULL, "PTTL lock:leader:x"),
                     5000);
    o = h_ok_json(B, "STATUS leader:x");
    l = json_object_get(o, "holder");
    ck_assert_str_eq(json_string_value(json_object_get(l, "value")), "v3");
    ck_assert_str_eq(json_string_value(json_object_get(l, "name")), "alice");
    ck_assert_int_eq(json_integer_value(json_object_get(l, "fence")),
                     strtoll(fence, NULL, 10));
    json_decref(o);
    ck_assert_int_gt(h_redis_cmd(&K.nodes[0], &v, "GET lock:leader:x"), -2);
    ck_assert_msg(v && strncmp(v, token, strlen(token)) == 0, "%s", v);
    free(v);

    /* ADOPT on the other daemon: the value comes along. */
    h_expect(B, "OK resource=leader:x ", "ADOPT leader:x token=%s ttl=20000",
             token);
    assert_status_value(B, "leader:x", "v3");
    o = h_ok_json(B, "LOCKS");
    l = json_array_get(json_object_get(o, "locks"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(l, "value")), "v3");
    json_decref(o);
}
END_TEST

START_TEST(value_refused_where_it_means_nothing)
{
    start("{\"locks\":{\"max_value_len\":8}}");
    h_expect(A, "ERR ARG value= is for exclusive locks",
             "LOCK doc:1 mode=shared value=x");
    h_expect(A, "ERR ARG value= is for exclusive locks",
             "LOCK sem:1 limit=2 value=x");
    h_expect(A, "OK resource=doc:1 ", "LOCK doc:1 mode=shared");
    h_expect(A, "ERR ARG value= is for exclusive locks",
             "EXTEND doc:1 value=x");
    h_expect(A, "OK resource=sem:1 ", "LOCK sem:1 limit=2");
    h_expect(A, "ERR ARG value= is for exclusive locks",
             "EXTEND sem:1 value=x");
    h_expect(A, "ERR NOTHELD ", "EXTEND other:1 value=x");
    h_expect(A, "ERR ARG value must be 1 to 8 visible",
             "LOCK v:1 value=123456789");
    h_expect(A, "OK resource=v:1 ", "LOCK v:1 value=12345678");
}
END_TEST

static Suite *watch_suite(void)
{
    Suite *s = suite_create("watch");
    TCase *tc = tcase_create("watch");

    h_cluster_fixture(tc, &K, 0, true);
    tcase_set_timeout(tc, h_scale(60));
    tcase_add_test(tc, value_shown_replaced_adopted);
    tcase_add_test(tc, value_refused_where_it_means_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(watch_suite());
}
