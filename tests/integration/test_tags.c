/*
 * test_tags: tagged requests (protocol.md, "Tagged requests"): many
 * requests in flight on one session, against real redis-server nodes.
 *
 *   - a tagged request on another resource is answered while a tagged
 *     LOCK waits (replies in the order the requests finish);
 *   - requests naming the same resource take effect in the order read;
 *   - an untagged request is a barrier both ways;
 *   - a tag in use is refused, HELLO/AUTH/QUIT are never tagged, a
 *     malformed tag is answered untagged;
 *   - limits.max_inflight stops reading the connection, and no request
 *     is lost;
 *   - a connection closed with requests in flight frees what they took,
 *     as a dropped session does;
 *   - requests read in one write reach the nodes together (group commit);
 *   - a session holding and waiting on hundreds of resources at once.
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
static struct h_client *const C = &K.clients[2];

static void start(const char *extra_json)
{
    h_cluster_start(&K, NNODES, 1, extra_json, h_scale(5000));
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 0);
}

/* The next line from c that is not an EVENT, within ms (asserted). */
static char *next_reply(struct h_client *c, int ms)
{
    uint64_t until = h_now_ms() + (uint64_t)ms;

    for (;;) {
        long long left = (long long)(until - h_now_ms());
        char *line = h_recv_line(c, left > 0 ? (int)left : 0);
        ck_assert_msg(line, "no reply within %d ms", ms);
        if (!h_starts(line, "EVENT "))
            return line;
    }
}

/* The reply's tag ("" when untagged), into tag. */
static void tag_of(const char *line, char *tag, size_t size)
{
    size_t n = 0;

    if (line[0] == '#')
        n = strcspn(line + 1, " ");
    snprintf(tag, size, "%.*s", (int)n, line + 1);
    if (line[0] != '#')
        tag[0] = '\0';
}

/* The reply after its tag. */
static const char *body(const char *line)
{
    return line[0] == '#' ? strchr(line, ' ') + 1 : line;
}

/* The next reply, asserted to carry tag and start with prefix; returns
 * its body. */
static const char *expect_tagged(struct h_client *c, const char *tag,
                                 const char *prefix)
{
    char got[64];
    char *line = next_reply(c, h_scale(5000));

    tag_of(line, got, sizeof(got));
    ck_assert_msg(strcmp(got, tag) == 0 && h_starts(body(line), prefix),
                  "want #%s %s..., got \"%s\"", tag, prefix, line);
    return body(line);
}

/* Nothing at all from c within ms. */
static void expect_silence(struct h_client *c, int ms)
{
    char *line = h_recv_line(c, ms);

    ck_assert_msg(!line, "unexpected: \"%s\"", line ? line : "");
}

START_TEST(other_resource_while_lock_waits)
{
    start(NULL);
    h_expect(B, "OK resource=x ", "LOCK x");
    h_sendf(A, "#a1 LOCK x wait=5000\n#a2 LOCK y\n#a3 PING\n");
    /* a2 and a3 in the order they finish (a3 at once, a2 after a round
     * to the nodes). */
    expect_tagged(A, "a3", "PONG");
    expect_tagged(A, "a2", "OK resource=y ");
    expect_silence(A, 300);
    h_expect(B, "OK resource=x ", "UNLOCK x");
    expect_tagged(A, "a1", "OK resource=x ");
    h_cluster_stop(&K);
}
END_TEST

/* LOCK x (waiting), UNLOCK x, LOCK x again, STATUS x: in that order. */
START_TEST(same_resource_in_order)
{
    char f1[32], f2[32];

    start(NULL);
    h_expect(B, "OK resource=x ", "LOCK x");
    h_sendf(A, "#l1 LOCK x wait=5000\n#u UNLOCK x\n#l2 LOCK x\n"
            "#l3 LOCK x\n#e EXTEND x ttl=9000\n#p PING\n");
    expect_tagged(A, "p", "PONG");
    expect_silence(A, 300);
    h_expect(B, "OK resource=x ", "UNLOCK x");
    h_kv_copy(expect_tagged(A, "l1", "OK resource=x "), "fence", f1,
              sizeof(f1));
    expect_tagged(A, "u", "OK resource=x nodes=3");
    h_kv_copy(expect_tagged(A, "l2", "OK resource=x "), "fence", f2,
              sizeof(f2));
    ck_assert_msg(strtoull(f2, NULL, 10) > strtoull(f1, NULL, 10),
                  "fences %s then %s", f1, f2);
    expect_tagged(A, "l3", "ERR HELD ");
    expect_tagged(A, "e", "OK resource=x ttl=9000 ");
    h_cluster_stop(&K);
}
END_TEST

/* An untagged request starts after every request read before it was
 * answered, and those read after it start after its answer. */
START_TEST(untagged_is_a_barrier)
{
    start(NULL);
    h_expect(B, "OK resource=x ", "LOCK x");
    h_sendf(A, "#a LOCK x wait=5000\nPING one\n#b LOCK y\nPING two\n");
    expect_silence(A, 400);
    h_expect(B, "OK resource=x ", "UNLOCK x");
    expect_tagged(A, "a", "OK resource=x ");
    expect_tagged(A, "", "PONG one");
    expect_tagged(A, "b", "OK resource=y ");
    expect_tagged(A, "", "PONG two");
    h_cluster_stop(&K);
}
END_TEST

START_TEST(tags_refused)
{
    start(NULL);
    h_expect(B, "OK resource=x ", "LOCK x");
    h_sendf(A, "#t LOCK x wait=3000\n#t PING\n");
    expect_tagged(A, "t", "ERR ARG tag in use");
    h_sendf(A, "#h HELLO name=a\n#a AUTH pw\n#q QUIT\n");
    expect_tagged(A, "h", "ERR ARG ");
    expect_tagged(A, "a", "ERR ARG ");
    expect_tagged(A, "q", "ERR ARG ");
    /* Malformed tags: answered untagged. */
    h_sendf(A, "#\n#toolong_toolong_toolong_toolong_x PING\n#a/b PING\n"
            "#alone\n");
    for (int i = 0; i < 4; i++)
        expect_tagged(A, "", "ERR ARG ");
    /* A request's own error carries its tag. */
    h_sendf(A, "#f FROB\n#g LOCK\n");
    expect_tagged(A, "f", "ERR UNKNOWN ");
    expect_tagged(A, "g", "ERR ARG ");
    h_expect(B, "OK resource=x ", "UNLOCK x");
    expect_tagged(A, "t", "OK resource=x ");
    /* Answered: the tag is free again, and the session still open. */
    h_sendf(A, "#t PING\n");
    expect_tagged(A, "t", "PONG");
    h_expect(A, "OK proto=1 ", "HELLO name=still");
    h_cluster_stop(&K);
}
END_TEST

/* With max_inflight 4, the fifth tagged request is not read until one of
 * the four is answered; nothing is refused or lost. */
START_TEST(max_inflight_back_pressure)
{
    char res[16], tag[16];
    json_t *j, *sessions, *s;
    size_t i;
    int seen = 0, pong = 0;

    start("{\"limits\":{\"max_inflight\":4}}");
    for (int k = 0; k < 10; k++)
        h_expect(B, "OK ", "LOCK r%d", k);
    for (int k = 0; k < 10; k++)
        h_sendf(A, "#w%d LOCK r%d wait=20000\n", k, k);
    h_sendf(A, "#p PING\n");
    expect_silence(A, 400);
    h_cluster_client(&K, 2, 0);
    j = h_ok_json(C, "SESSIONS");
    sessions = json_object_get(j, "sessions");
    json_array_foreach(sessions, i, s) {
        if (json_integer_value(json_object_get(s, "inflight")) == 4)
            seen++;
    }
    json_decref(j);
    ck_assert_msg(seen == 1, "no session shows 4 requests in flight");
    for (int k = 0; k < 10; k++)
        h_expect(B, "OK ", "UNLOCK r%d", k);
    for (int k = 0; k < 11; k++) {
        char *line = next_reply(A, h_scale(5000));
        tag_of(line, tag, sizeof(tag));
        if (strcmp(tag, "p") == 0) {
            pong++;
            continue;
        }
        ck_assert_msg(h_starts(body(line), "OK resource=r"), "%s", line);
        snprintf(res, sizeof(res), "r%s", tag + 1);
        ck_assert_str_eq(h_kv(body(line), "resource"), res);
    }
    ck_assert_int_eq(pong, 1);
    expect_silence(A, 200);
    h_cluster_stop(&K);
}
END_TEST

/* A connection closed with a grant held and a LOCK waiting: the grant is
 * released, the wait withdrawn (never granted to the dead session). */
START_TEST(close_with_requests_in_flight)
{
    start(NULL);
    h_expect(B, "OK resource=y ", "LOCK y");
    h_sendf(A, "#a LOCK x\n#b LOCK y wait=20000\n");
    expect_tagged(A, "a", "OK resource=x ");
    h_reset(A);
    h_cluster_client(&K, 2, 0);
    h_expect(C, "OK resource=x ", "LOCK x wait=3000");
    h_expect(B, "OK resource=y ", "UNLOCK y");
    h_expect(C, "OK resource=y ", "LOCK y wait=3000");
    h_cluster_stop(&K);
}
END_TEST

/* 32 LOCKs written at once on one connection reach each node in fewer
 * calls than requests (one loop turn starts them all). */
START_TEST(one_write_one_group)
{
    char buf[32 * 40];
    size_t len = 0;
    json_t *j, *nodes, *n;
    size_t i;

    start(NULL);
    for (int k = 0; k < 32; k++)
        len += (size_t)snprintf(buf + len, sizeof(buf) - len,
                                "#g%d LOCK g%d\n", k, k);
    long long before = 0, calls_before = 0;
    j = h_ok_json(B, "STATS");
    json_array_foreach(json_object_get(j, "nodes"), i, n) {
        before += json_integer_value(json_object_get(n, "requests"));
        calls_before += json_integer_value(json_object_get(n, "calls"));
    }
    json_decref(j);
    h_send(A, buf, len);
    for (int k = 0; k < 32; k++)
        ck_assert(h_starts(body(next_reply(A, h_scale(5000))), "OK "));
    j = h_ok_json(B, "STATS");
    nodes = json_object_get(j, "nodes");
    long long reqs = 0, calls = 0;
    json_array_foreach(nodes, i, n) {
        reqs += json_integer_value(json_object_get(n, "requests"));
        calls += json_integer_value(json_object_get(n, "calls"));
    }
    json_decref(j);
    reqs -= before;
    calls -= calls_before;
    ck_assert_msg(reqs >= 32 * NNODES && calls < reqs / 4, "%lld requests "
                  "in %lld calls", reqs, calls);
    h_cluster_stop(&K);
}
END_TEST

/* One session holds 300 resources and waits for 200 more at once, all
 * through tags; each grant is answered once, with its own resource. */
START_TEST(hundreds_at_once)
{
    enum { HELD = 300, WAIT = 200 };
    static char sent[(HELD + WAIT) * 48];
    static bool got[HELD + WAIT];
    size_t len = 0;
    char tag[16];

    start(NULL);
    for (int k = 0; k < WAIT; k++)
        h_expect(B, "OK ", "LOCK w%d", k);
    for (int k = 0; k < HELD; k++)
        len += (size_t)snprintf(sent + len, sizeof(sent) - len,
                                "#h%d LOCK h%d\n", k, k);
    for (int k = 0; k < WAIT; k++)
        len += (size_t)snprintf(sent + len, sizeof(sent) - len,
                                "#w%d LOCK w%d wait=30000\n", k, k);
    h_send(A, sent, len);
    for (int k = 0; k < HELD; k++) {
        char *line = next_reply(A, h_scale(10000));
        tag_of(line, tag, sizeof(tag));
        ck_assert_msg(tag[0] == 'h' && h_starts(body(line), "OK "), "%s",
                      line);
        int n = atoi(tag + 1);
        ck_assert(!got[n]);
        got[n] = true;
    }
    expect_silence(A, 300);
    /* Released in reverse: the grants come as they may. */
    for (int k = WAIT - 1; k >= 0; k--)
        h_sendf(B, "UNLOCK w%d\n", k);
    for (int k = 0; k < WAIT; k++)
        ck_assert(h_starts(next_reply(B, h_scale(5000)), "OK "));
    for (int k = 0; k < WAIT; k++) {
        char *line = next_reply(A, h_scale(10000));
        tag_of(line, tag, sizeof(tag));
        ck_assert_msg(tag[0] == 'w' && h_starts(body(line), "OK resource=w"),
                      "%s", line);
        int n = atoi(tag + 1);
        ck_assert(!got[HELD + n]);
        got[HELD + n] = true;
    }
    ck_assert_int_eq(h_stats_int(B, "locks_held"), HELD + WAIT);
    h_cluster_stop(&K);
}
END_TEST

static Suite *tags_suite(void)
{
    Suite *s = suite_create("tags");
    TCase *tc = tcase_create("tags");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, other_resource_while_lock_waits);
    tcase_add_test(tc, same_resource_in_order);
    tcase_add_test(tc, untagged_is_a_barrier);
    tcase_add_test(tc, tags_refused);
    tcase_add_test(tc, max_inflight_back_pressure);
    tcase_add_test(tc, close_with_requests_in_flight);
    tcase_add_test(tc, one_write_one_group);
    tcase_add_test(tc, hundreds_at_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(tags_suite());
}
