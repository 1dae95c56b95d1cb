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
 *
 * WATCH:
 *   - the first EVENT HOLDER describes the resource now, then each change
 *     made through the other daemon arrives within a second: exclusive
 *     (fence, name, daemon, value, a new value), shared (counted), a
 *     semaphore held before the watch began (its size found on the
 *     nodes), the resources of a multi-resource grant, and a release;
 *   - a foreign Redlock client's SET NX key and its expiry are seen within
 *     locks.watch_poll_ms (and a second);
 *   - under a burst of 1,000 grants and releases the fences a watcher sees
 *     never go back and its last line is the final state;
 *   - a resumed session hears its watches' states again;
 *   - limits.max_watches (ERR LIMIT, all or none), UNWATCH, users'
 *     prefixes (ERR DENIED);
 *   - a watcher that never reads is closed by limits.max_output_bytes, and
 *     the other watcher and the lockers go on as before.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "harness.h"

#define NNODES 3

static struct h_cluster K;
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];
static struct h_client *const C = &K.clients[2];

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


/* ---- WATCH ---- */

/* The next EVENT HOLDER for res on c within ms (asserted); other lines
 * (replies to pipelined requests, other resources' events) are skipped. */
static char *holder(struct h_client *c, const char *res, int ms)
{
    uint64_t until = h_now_ms() + (uint64_t)h_scale(ms);
    char want[160];

    snprintf(want, sizeof(want), "EVENT HOLDER resource=%s ", res);
    for (;;) {
        long long left = (long long)(until - h_now_ms());
        char *line = h_recv_line(c, left > 0 ? (int)left : 0);

        ck_assert_msg(line, "no EVENT HOLDER for %s within %d ms", res, ms);
        if (h_starts(line, want))
            return line;
    }
}

/* The kv of an event line as a number (-1 when missing). */
static long long kv_num(const char *line, const char *key)
{
    const char *v = h_kv(line, key);

    return v ? strtoll(v, NULL, 10) : -1;
}

static void assert_kv(const char *line, const char *key, const char *want)
{
    const char *v = h_kv(line, key);

    ck_assert_msg(v && strcmp(v, want) == 0, "%s: %s=%s, want %s", line, key,
                  v ? v : "(none)", want);
}

START_TEST(watch_exclusive_through_the_other_daemon)
{
    char *line;
    long long fence;

    start(NULL);
    h_expect(A, "OK watching=1", "WATCH w:1");
    line = holder(A, "w:1", 2000);
    ck_assert_int_eq(kv_num(line, "held"), 0);
    ck_assert_ptr_null(h_kv(line, "mode"));

    h_expect(B, "OK ", "HELLO name=bob");
    line = h_expect(B, "OK resource=w:1 ", "LOCK w:1 value=10.0.0.9:80");
    fence = kv_num(line, "fence");
    line = holder(A, "w:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    assert_kv(line, "mode", "exclusive");
    ck_assert_int_eq(kv_num(line, "fence"), fence);
    assert_kv(line, "name", "bob");
    assert_kv(line, "value", "10.0.0.9:80");
    ck_assert_ptr_nonnull(h_kv(line, "daemon"));

    h_expect(B, "OK resource=w:1 ", "EXTEND w:1 value=10.0.0.9:81");
    line = holder(A, "w:1", 1000);
    assert_kv(line, "value", "10.0.0.9:81");
    ck_assert_int_eq(kv_num(line, "fence"), fence);

    h_expect(B, "OK resource=w:1 ", "UNLOCK w:1");
    line = holder(A, "w:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 0);

    /* Through this daemon too, and nothing more once unwatched. */
    h_cluster_client(&K, 2, 0);
    h_expect(C, "OK resource=w:1 ", "LOCK w:1");
    line = holder(A, "w:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    h_expect(A, "OK watching=0", "UNWATCH w:1");
    h_expect(C, "OK resource=w:1 ", "UNLOCK w:1");
    ck_assert_ptr_null(h_recv_line(A, h_scale(300)));
}
END_TEST

START_TEST(watch_shared_semaphore_multi)
{
    char *line;

    start(NULL);
    h_cluster_client(&K, 2, 1);
    /* A semaphore held through the other daemon before the watch: its
     * size is read off the nodes. */
    h_expect(B, "OK resource=sem:1 ", "LOCK sem:1 limit=3");
    h_expect(C, "OK resource=sem:1 ", "LOCK sem:1 limit=3");
    h_expect(A, "OK watching=4", "WATCH sem:1 doc:1 m:1 m:2");
    line = holder(A, "sem:1", 2000);
    ck_assert_int_eq(kv_num(line, "held"), 2);
    assert_kv(line, "mode", "semaphore");
    ck_assert_int_eq(kv_num(line, "limit"), 3);
    h_expect(C, "OK resource=sem:1 ", "UNLOCK sem:1");
    line = holder(A, "sem:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    /* STATUS here finds it too, with no limit= given. */
    json_t *st = h_ok_json(A, "STATUS sem:1");
    ck_assert(json_is_true(json_object_get(st, "held")));
    ck_assert_int_eq(h_json_int(st, "limit"), 3);
    ck_assert_int_eq(h_json_int(st, "slots_held"), 1);
    json_decref(st);

    h_expect(B, "OK resource=doc:1 ", "LOCK doc:1 mode=shared");
    line = holder(A, "doc:1", 1000);
    while (kv_num(line, "held") == 0)
        line = holder(A, "doc:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    assert_kv(line, "mode", "shared");
    h_expect(C, "OK resource=doc:1 ", "LOCK doc:1 mode=shared");
    line = holder(A, "doc:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 2);

    line = h_expect(B, "OK resources=2 ", "LOCK m:1 m:2");
    long long fence = kv_num(line, "fence");
    for (int i = 0; i < 2; i++) {
        const char *res = i ? "m:2" : "m:1";
        line = holder(A, res, 1000);
        while (kv_num(line, "held") == 0)
            line = holder(A, res, 1000);
        ck_assert_int_eq(kv_num(line, "fence"), fence);
    }
}
END_TEST

START_TEST(watch_foreign_client)
{
    char *line;

    start("{\"locks\":{\"watch_poll_ms\":200}}");
    h_expect(A, "OK watching=1", "WATCH f:1");
    line = holder(A, "f:1", 2000);
    ck_assert_int_eq(kv_num(line, "held"), 0);
    /* A plain Redlock client's key on every node. */
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_ge(h_redis_cmd(&K.nodes[i], NULL, "SET lock:f:1 "
                                     "0123456789abcdef NX PX 1200"), 0);
    line = holder(A, "f:1", 1200);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    assert_kv(line, "foreign", "1");
    /* Its expiry. */
    line = holder(A, "f:1", 2400);
    ck_assert_int_eq(kv_num(line, "held"), 0);
}
END_TEST

/* Everything c was sent has been answered (its replies skipped). */
static void drain(struct h_client *c)
{
    char *line;

    h_sendf(c, "PING\n");
    do {
        line = h_recv_line(c, h_scale(10000));
        ck_assert_msg(line, "no PONG");
    } while (strcmp(line, "PONG") != 0);
}

/* A burst of 1,000 grants and releases through both daemons: the fences
 * a watcher sees never go back, and it ends on the final state. */
START_TEST(watch_burst_order)
{
    long long last = 0, n = 0, held = -1;
    char *line, prev[512] = "";

    start(NULL);
    h_cluster_client(&K, 2, 0);
    h_expect(A, "OK watching=1", "WATCH b:1");
    holder(A, "b:1", 2000);
    for (int i = 0; i < 500; i++) {
        h_sendf(B, "LOCK b:1 wait=5000\nUNLOCK b:1\n");
        h_sendf(C, "LOCK b:1 wait=5000\nUNLOCK b:1\n");
        if (i % 25 == 24) {
            drain(B);
            drain(C);
        }
    }
    drain(B);
    drain(C);
    while ((line = h_recv_line(A, h_scale(1500)))) {
        if (!h_starts(line, "EVENT HOLDER resource=b:1 "))
            continue;
        n++;
        held = kv_num(line, "held");
        if (held == 1) {
            ck_assert_msg(kv_num(line, "fence") > last, "fence %lld after "
                          "%lld: '%s' after '%s'", kv_num(line, "fence"),
                          last, line, prev);
            last = kv_num(line, "fence");
        }
        snprintf(prev, sizeof prev, "%s", line);
    }
    ck_assert_msg(n >= 2 && last > 0, "%lld events in the burst", n);
    ck_assert_msg(held == 0, "the last state told holds %lld", held);
}
END_TEST

/* A resumed session hears the state of what it watches again. */
START_TEST(watch_survives_resume)
{
    char session[64], secret[64], *line;

    start(NULL);
    line = h_expect(A, "OK proto=1 ", "HELLO detach=5000");
    h_kv_copy(line, "session", session, sizeof(session));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_expect(A, "OK watching=1", "WATCH r:1");
    line = holder(A, "r:1", 2000);
    ck_assert_int_eq(kv_num(line, "held"), 0);
    h_reset(A);
    /* Changed while detached: the resume tells the state now. */
    h_expect(B, "OK resource=r:1 ", "LOCK r:1 value=while-away");
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK proto=1 ", "HELLO resume=%s secret=%s", session, secret);
    line = holder(A, "r:1", 2000);
    ck_assert_int_eq(kv_num(line, "held"), 1);
    assert_kv(line, "value", "while-away");
    h_expect(B, "OK resource=r:1 ", "UNLOCK r:1");
    line = holder(A, "r:1", 1000);
    ck_assert_int_eq(kv_num(line, "held"), 0);
}
END_TEST

START_TEST(watch_limits)
{
    start("{\"limits\":{\"max_watches\":2}}");
    h_expect(A, "ERR LIMIT ", "WATCH l:1 l:2 l:3");
    h_expect(A, "OK watching=2", "WATCH l:1 l:2");
    h_expect(A, "OK watching=2", "WATCH l:2 l:1");    /* again: no more */
    h_expect(A, "ERR LIMIT this session watches 2", "WATCH l:3");
    h_expect(A, "OK watching=1", "UNWATCH l:1 l:9");
    h_expect(A, "OK watching=2", "WATCH l:3");
    h_expect(A, "ERR ARG WATCH needs a resource name", "WATCH");
    h_expect(A, "ERR ARG resource 'l:3' named twice", "UNWATCH l:3 l:3");
}
END_TEST

#define WATCH_USERS "{\"auth\":{\"users\":[{\"name\":\"carol\"," \
    "\"password\":\"Carol-Secret-5\",\"prefixes\":[\"job:\"]}]}}"

START_TEST(watch_within_prefixes)
{
    h_cluster_nodes(&K, NNODES, NULL);
    h_cluster_daemon_start(&K, 0, WATCH_USERS);
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK", "AUTH carol Carol-Secret-5");
    h_expect(A, "ERR DENIED user carol may not WATCH invoice:1",
             "WATCH job:1 invoice:1");
    h_expect(A, "OK watching=1", "WATCH job:1");
    ck_assert_ptr_nonnull(holder(A, "job:1", 2000));
}
END_TEST

/* A watcher that never reads is closed by its output limit; the other
 * watcher hears every change, and the lockers are not slowed. */
START_TEST(watch_reader_that_never_reads)
{
    int small = 4096, free_seen = 0;
    char names[256] = "", fill[241];
    bool freed[16] = { false };
    uint64_t t0;
    char *line;

    memset(fill, 'v', sizeof(fill) - 1);
    fill[sizeof(fill) - 1] = '\0';
    for (int i = 0; i < 16; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names),
                 "%ss:%d", i ? " " : "", i);
    start("{\"limits\":{\"max_output_bytes\":4096}}");
    h_cluster_client(&K, 2, 0);
    /* A small window, so the kernel does not take it all in for A. */
    ck_assert_int_eq(setsockopt(A->fd, SOL_SOCKET, SO_RCVBUF, &small,
                                sizeof(small)), 0);
    h_expect(A, "OK watching=16", "WATCH %s", names);  /* then never reads */
    h_expect(C, "OK watching=16", "WATCH %s", names);
    t0 = h_now_ms();
    for (int i = 0; i < 200; i++) {
        h_expect(B, "OK resources=16 ", "LOCK %s value=%d-%s", names, i, fill);
        h_expect(B, "OK ", "UNLOCK %s", names);
    }
    ck_assert_msg(h_since(t0) < h_scale(10000), "200 cycles took %lld ms",
                  h_since(t0));
    /* C ends on every resource free. */
    while (free_seen < 16 && (line = h_recv_line(C, h_scale(2000)))) {
        int i;
        if (sscanf(line, "EVENT HOLDER resource=s:%d ", &i) != 1)
            continue;
        if (kv_num(line, "held") == 0 && !freed[i]) {
            freed[i] = true;
            free_seen++;
        } else if (kv_num(line, "held") != 0 && freed[i]) {
            freed[i] = false;
            free_seen--;
        }
    }
    ck_assert_int_eq(free_seen, 16);
    ck_assert_msg(h_wait_eof(A, h_scale(3000)), "the watcher that never "
                  "reads was not closed");
}
END_TEST

/* Two daemons on the same nodes with the same id are warned about (their
 * holders could not be told apart); a daemon alone hears only itself. */
START_TEST(same_id_warned)
{
    h_cluster_nodes(&K, NNODES, NULL);
    h_cluster_daemon(&K, 0, "{\"id\":\"twin\"}", h_scale(5000));
    ck_assert_msg(!h_log_waits_for(&K.daemons[0], "has this daemon's id",
                                   h_scale(1500)),
                  "a daemon alone warned about itself");
    h_cluster_daemon(&K, 1, "{\"id\":\"twin\"}", h_scale(5000));
    ck_assert_msg(h_log_waits_for(&K.daemons[0], "has this daemon's id "
                                  "\"twin\"", h_scale(8000)),
                  "no warning of the other daemon with the same id");
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
    tcase_add_test(tc, watch_exclusive_through_the_other_daemon);
    tcase_add_test(tc, watch_shared_semaphore_multi);
    tcase_add_test(tc, watch_foreign_client);
    tcase_add_test(tc, watch_burst_order);
    tcase_add_test(tc, watch_survives_resume);
    tcase_add_test(tc, watch_limits);
    tcase_add_test(tc, watch_within_prefixes);
    tcase_add_test(tc, watch_reader_that_never_reads);
    tcase_add_test(tc, same_id_warned);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(watch_suite());
}
