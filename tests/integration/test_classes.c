/*
 * test_classes: wait and hold times per resource class
 * (metrics.resource_classes, metrics.max_classes), STATUS's waiters and
 * TOP, against the real redlockd binary and a real redis-server node.
 *
 * Covered, against docs/metrics.md ("Classes") and docs/protocol.md:
 *   - classes by the first ':' (a name without one is "other"), in STATS
 *     "classes" and as class= labels on /metrics; every grant observed,
 *     one granted at once in the lowest bucket, and the grants of all
 *     classes add up to acquisitions ok;
 *   - 10,000 distinct names (5,000 prefixes, 5,000 names without ':'):
 *     32 classes named, everything else in "other", and /metrics has
 *     exactly 33 class label values and the series that makes;
 *   - a listed set of prefixes (the longest wins), then a SIGHUP back to
 *     "prefix": the new classes, their histograms from zero;
 *   - a wait that ends in ERR TIMEOUT under result="timeout", with its
 *     time; holds observed at UNLOCK and at a loss (renew=0 running out);
 *   - STATUS "waiting": this daemon's waiters in queue order, their
 *     waited_ms growing between two STATUS, the old fields unchanged;
 *   - TOP: the longest wait first, its limit, the total, ERR ARG beyond
 *     100; with auth.users, TOP and STATS's classes show a user only what
 *     its prefixes overlap.
 * Every test ends with a SIGTERM stop asserted to exit 0.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static struct h_cluster K;
static struct h_daemon *const D = &K.daemons[0];
static int mport;               /* this test's metrics port */

/* ---- helpers ------------------------------------------------------------- */

/* Start the daemon with metrics on a free port and `extra` (a JSON
 * object's members, or "") merged in. */
static void start(const char *extra)
{
    char json[1024];

    mport = h_free_port();
    snprintf(json, sizeof(json), "{\"metrics\":{\"listen\":\"127.0.0.1:%d\"}"
             "%s%s}", mport, extra[0] ? "," : "", extra);
    h_cluster_daemon(&K, 0, json, h_scale(5000));
}

/* GET /metrics: the body (malloc'd). */
static char *scrape(void)
{
    struct sockaddr_in sin = { .sin_family = AF_INET };
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap), *body;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ssize_t n;

    ck_assert_ptr_nonnull(buf);
    sin.sin_port = htons((uint16_t)mport);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0,
                  "connect to metrics: %s", strerror(errno));
    ck_assert_int_eq(send(fd, req, sizeof(req) - 1, 0), sizeof(req) - 1);
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };

        ck_assert_msg(poll(&p, 1, h_scale(5000)) == 1, "/metrics timed out");
        if (len + 65536 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        n = recv(fd, buf + len, cap - len - 1, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%.300s", buf);
    body = strstr(buf, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* The value of the sample `series` in an exposition, or -1. */
static double sample(const char *body, const char *series)
{
    size_t n = strlen(series);

    for (const char *p = body; p && *p; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    }
    return -1;
}

/* How many distinct class="..." values the exposition has, and how many
 * sample lines of the per-class families. */
static int class_values(const char *body, int *series)
{
    static char seen[64][256];
    int n = 0;

    *series = 0;
    for (const char *p = body; p && *p; p = strchr(p, '\n')) {
        const char *c, *q;

        if (*p == '\n')
            p++;
        if (strncmp(p, "redlockd_lock_wait_seconds", 26) != 0 &&
            strncmp(p, "redlockd_lock_hold_seconds", 26) != 0)
            continue;
        ++*series;
        c = strstr(p, "{class=\"");
        ck_assert_msg(c && c < strchr(p, '\n'), "no class label: %.120s", p);
        c += 8;
        q = strchr(c, '"');
        bool known = false;
        for (int i = 0; i < n && !known; i++)
            known = strncmp(seen[i], c, (size_t)(q - c)) == 0 &&
                    seen[i][q - c] == '\0';
        if (!known) {
            ck_assert_int_lt(n, 64);
            snprintf(seen[n++], sizeof(seen[0]), "%.*s", (int)(q - c), c);
        }
    }
    return n;
}

/* STATS "classes" (a new reference). */
static json_t *classes(struct h_client *c)
{
    json_t *st = h_ok_json(c, "STATS");
    json_t *cl = json_incref(json_object_get(st, "classes"));

    json_decref(st);
    ck_assert_msg(json_is_object(cl), "STATS has no \"classes\" object");
    return cl;
}

/* One class's histogram: "wait" granted/timeout or "hold". */
static json_t *hist(json_t *cl, const char *cls, const char *row,
                    const char *result)
{
    json_t *h = json_object_get(json_object_get(cl, cls), row);

    if (result)
        h = json_object_get(h, result);
    ck_assert_msg(json_is_object(h), "classes[%s].%s%s%s missing", cls, row,
                  result ? "." : "", result ? result : "");
    return h;
}

static json_int_t count_of(json_t *cl, const char *cls, const char *row,
                           const char *result)
{
    return h_json_int(hist(cl, cls, row, result), "count");
}

static double sum_of(json_t *cl, const char *cls, const char *row,
                     const char *result)
{
    return json_number_value(json_object_get(hist(cl, cls, row, result),
                                             "sum"));
}

/* LOCK res on c and UNLOCK it at once. */
static void lock_unlock(struct h_client *c, const char *res)
{
    h_expect(c, "OK ", "LOCK %s", res);
    h_expect(c, "OK ", "UNLOCK %s", res);
}

/* ---- classes by prefix --------------------------------------------------- */

START_TEST(classes_by_prefix)
{
    struct h_client *c;
    json_t *cl, *st;
    json_int_t granted = 0;
    const char *name;
    json_t *v;
    char *body;

    start("");
    c = h_cluster_client(&K, 0, 0);
    lock_unlock(c, "job:1");
    lock_unlock(c, "job:2");
    lock_unlock(c, "invoice:7");
    lock_unlock(c, "plain");
    cl = classes(c);
    ck_assert_int_eq(json_object_size(cl), 3);
    ck_assert_int_eq(count_of(cl, "job:", "wait_seconds", "granted"), 2);
    ck_assert_int_eq(count_of(cl, "invoice:", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "other", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "job:", "wait_seconds", "timeout"), 0);
    ck_assert_int_eq(count_of(cl, "job:", "hold_seconds", NULL), 2);
    ck_assert_int_eq(count_of(cl, "other", "hold_seconds", NULL), 1);
    /* Granted at once: about 0 s (a round trip; bucket 3 is le 0.5). */
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(
        hist(cl, "job:", "wait_seconds", "granted"), "buckets"), 3)), 2);
    ck_assert(sum_of(cl, "job:", "wait_seconds", "granted") < 0.5);
    /* Every grant is in one class. */
    json_object_foreach(cl, name, v)
        granted += count_of(cl, name, "wait_seconds", "granted");
    st = h_ok_json(c, "STATS");
    ck_assert_int_eq(granted, h_json_int(json_object_get(st, "acquisitions"),
                                         "ok"));
    json_decref(st);
    json_decref(cl);

    body = scrape();
    ck_assert_msg(sample(body, "redlockd_lock_wait_seconds_count"
                         "{class=\"job:\",result=\"granted\"}") == 2,
                  "%s", body);
    ck_assert_msg(sample(body, "redlockd_lock_wait_seconds_bucket"
                         "{class=\"invoice:\",result=\"granted\",le=\"+Inf\"}")
                  == 1, "%s", body);
    ck_assert_msg(sample(body, "redlockd_lock_hold_seconds_count"
                         "{class=\"other\"}") == 1, "%s", body);
    ck_assert_msg(sample(body, "redlockd_lock_wait_seconds_count"
                         "{class=\"other\",result=\"timeout\"}") == 0,
                  "%s", body);
    free(body);
}
END_TEST

/* 10,000 distinct names: 5,000 with prefixes of their own, 5,000 without
 * ':', locked 250 at a time. The series stay bounded by max_classes. */
START_TEST(classes_bounded_under_10000_names)
{
    static char line[8192];
    struct h_client *c;
    json_int_t granted = 0, held = 0;
    int nclasses, series;
    const char *name;
    json_t *cl, *v;
    char *body;

    start("\"locks\":{\"max_multi\":250}");
    c = h_cluster_client(&K, 0, 0);
    for (int batch = 0; batch < 40; batch++) {
        size_t len = 0;

        for (int k = 0; k < 250; k++) {
            int i = batch * 250 + k;
            len += (size_t)snprintf(line + len, sizeof(line) - len,
                                    i % 2 ? " n%d" : " c%d:r", i);
        }
        h_expect(c, "OK resources=250 ", "LOCK%s", line);
        h_expect(c, "OK resources=250 ", "UNLOCK%s", line);
    }
    cl = classes(c);
    ck_assert_int_eq(json_object_size(cl), 33);
    ck_assert_int_eq(count_of(cl, "c0:", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "c62:", "wait_seconds", "granted"), 1);
    ck_assert_ptr_null(json_object_get(cl, "c64:"));    /* the 33rd */
    ck_assert_int_eq(count_of(cl, "other", "wait_seconds", "granted"),
                     10000 - 32);
    json_object_foreach(cl, name, v) {
        granted += count_of(cl, name, "wait_seconds", "granted");
        held += count_of(cl, name, "hold_seconds", NULL);
    }
    ck_assert_int_eq(granted, 10000);
    ck_assert_int_eq(held, 10000);
    json_decref(cl);

    body = scrape();
    nclasses = class_values(body, &series);
    ck_assert_int_eq(nclasses, 33);
    /* Per class: two wait histograms and one hold histogram, each 16
     * bounds, +Inf, _sum and _count. */
    ck_assert_int_eq(series, 33 * 3 * 19);
    ck_assert_msg(sample(body, "redlockd_lock_hold_seconds_count"
                         "{class=\"other\"}") == 10000 - 32, "other holds");
    free(body);
}
END_TEST

/* Rewrite the daemon's config with `metrics` members, SIGHUP it, and wait
 * for the reload's summary line. */
static void reload_with(const char *metrics)
{
    char patch[512];
    json_error_t err;
    json_t *conf = json_load_file(D->conf_path, 0, &err), *p;
    const char *needle = "change(s) applied";

    snprintf(patch, sizeof(patch), "{\"metrics\":{%s}}", metrics);
    p = json_loads(patch, 0, &err);
    ck_assert_msg(conf && p, "%s", err.text);
    json_object_update_recursive(conf, p);
    ck_assert_int_eq(json_dump_file(conf, D->conf_path, JSON_INDENT(2)), 0);
    json_decref(conf);
    json_decref(p);
    kill(D->pid, SIGHUP);
    ck_assert_msg(h_log_waits_for(D, needle, h_scale(3000)),
                  "no reload:\n%s", h_daemon_log(D));
}

START_TEST(classes_listed_then_reloaded)
{
    struct h_client *c;
    json_t *cl;

    start("\"metrics\":{\"resource_classes\":[\"invoice:\",\"job:\","
          "\"job:urgent:\"],\"max_classes\":4}");
    c = h_cluster_client(&K, 0, 0);
    lock_unlock(c, "job:urgent:1");
    lock_unlock(c, "job:urgent");           /* job:, not job:urgent: */
    lock_unlock(c, "invoice:1");
    lock_unlock(c, "mail:1");
    cl = classes(c);
    ck_assert_int_eq(json_object_size(cl), 4);      /* named up front */
    ck_assert_int_eq(count_of(cl, "job:urgent:", "wait_seconds", "granted"),
                     1);
    ck_assert_int_eq(count_of(cl, "job:", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "invoice:", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "other", "wait_seconds", "granted"), 1);
    json_decref(cl);

    reload_with("\"resource_classes\":\"prefix\"");
    ck_assert_msg(strstr(h_daemon_log(D), "reload: metrics.resource_classes "
                         "[3 prefixes] -> prefix"), "%s", h_daemon_log(D));
    lock_unlock(c, "mail:2");
    cl = classes(c);
    /* Counted afresh under the new classes. */
    ck_assert_int_eq(json_object_size(cl), 2);
    ck_assert_int_eq(count_of(cl, "mail:", "wait_seconds", "granted"), 1);
    ck_assert_int_eq(count_of(cl, "other", "wait_seconds", "granted"), 0);
    ck_assert_ptr_null(json_object_get(cl, "invoice:"));
    json_decref(cl);
}
END_TEST

/* ---- what is observed ---------------------------------------------------- */

START_TEST(timeout_observed)
{
    struct h_client *a, *b;
    json_t *cl;
    double s;

    start("");
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    h_expect(a, "OK ", "LOCK t:1");
    h_expect(b, "ERR TIMEOUT", "LOCK t:1 wait=300");
    h_expect(b, "ERR BUSY", "LOCK t:1");    /* not a wait: not observed */
    cl = classes(a);
    ck_assert_int_eq(count_of(cl, "t:", "wait_seconds", "timeout"), 1);
    ck_assert_int_eq(count_of(cl, "t:", "wait_seconds", "granted"), 1);
    s = sum_of(cl, "t:", "wait_seconds", "timeout");
    ck_assert_msg(s >= 0.29 && s < 2, "timeout waited %g s", s);
    json_decref(cl);
}
END_TEST

START_TEST(holds_on_unlock_and_loss)
{
    struct h_client *a;
    json_t *cl;
    double s;

    start("");
    a = h_cluster_client(&K, 0, 0);
    h_expect(a, "OK ", "LOCK h:1");
    h_sleep_ms(200);
    h_expect(a, "OK ", "UNLOCK h:1");
    cl = classes(a);
    ck_assert_int_eq(count_of(cl, "h:", "hold_seconds", NULL), 1);
    s = sum_of(cl, "h:", "hold_seconds", NULL);
    ck_assert_msg(s >= 0.19 && s < 2, "held %g s until UNLOCK", s);
    json_decref(cl);

    /* renew=0: lost when its validity runs out, about 220 ms in. */
    h_expect(a, "OK ", "LOCK h:2 ttl=300 renew=0");
    ck_assert_ptr_nonnull(h_expect_event(a, "EVENT LOST resource=h:2",
                                         h_scale(3000)));
    cl = classes(a);
    ck_assert_int_eq(count_of(cl, "h:", "hold_seconds", NULL), 2);
    s = sum_of(cl, "h:", "hold_seconds", NULL);
    ck_assert_msg(s >= 0.19 + 0.15 && s < 4, "held %g s in all", s);
    json_decref(cl);
}
END_TEST

/* ---- STATUS's waiters ---------------------------------------------------- */

START_TEST(status_lists_waiters)
{
    struct h_client *a, *b, *c, *d;
    json_t *st, *w;
    json_int_t first, later;

    start("");
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    c = h_cluster_client(&K, 2, 0);
    d = h_cluster_client(&K, 3, 0);
    h_expect(a, "OK ", "LOCK w:1");
    h_expect(c, "OK ", "HELLO name=second");
    h_sendf(b, "LOCK w:1 wait=20000\n");
    h_sleep_ms(100);
    h_sendf(c, "LOCK w:1 wait=20000\n");
    h_sleep_ms(50);

    st = h_ok_json(d, "STATUS w:1");
    ck_assert_int_eq(h_json_int(st, "waiters"), 2);
    ck_assert(json_is_object(json_object_get(st, "holder")));
    w = json_object_get(st, "waiting");
    ck_assert_int_eq(json_array_size(w), 2);
    first = h_json_int(json_array_get(w, 0), "waited_ms");
    ck_assert_msg(first >= 150 && first < 2000, "waited %lld ms",
                  (long long)first);
    ck_assert_msg(h_json_int(json_array_get(w, 1), "waited_ms") < first,
                  "the second waits longer than the first");
    ck_assert_str_eq(h_json_str(json_array_get(w, 1), "name"), "second");
    ck_assert_str_eq(h_json_str(json_array_get(w, 0), "mode"), "exclusive");
    json_decref(st);

    h_sleep_ms(300);
    st = h_ok_json(d, "STATUS w:1");
    later = h_json_int(json_array_get(json_object_get(st, "waiting"), 0),
                       "waited_ms");
    ck_assert_msg(later >= first + 290 && later < first + 3000,
                  "waited %lld ms, then %lld", (long long)first,
                  (long long)later);
    json_decref(st);
    h_expect(a, "OK ", "UNLOCK w:1");
    ck_assert_ptr_nonnull(h_recv_line(b, h_scale(3000)));
}
END_TEST

/* ---- TOP ----------------------------------------------------------------- */

START_TEST(top_json)
{
    struct h_client *a, *b, *c, *d;
    json_t *top, *r;

    start("");
    a = h_cluster_client(&K, 0, 0);
    b = h_cluster_client(&K, 1, 0);
    c = h_cluster_client(&K, 2, 0);
    d = h_cluster_client(&K, 3, 0);
    h_expect(a, "OK ", "HELLO name=holder");
    h_expect(a, "OK ", "LOCK top:a");
    h_expect(a, "OK ", "LOCK top:b");
    h_expect(a, "OK ", "LOCK top:c");
    h_sendf(b, "LOCK top:b wait=20000\n");
    h_sleep_ms(200);
    h_sendf(c, "LOCK top:a wait=20000\n");
    h_sleep_ms(50);

    top = h_ok_json(d, "TOP");
    ck_assert_int_eq(h_json_int(top, "total"), 3);
    ck_assert(json_is_string(json_object_get(top, "daemon")));
    r = json_object_get(top, "resources");
    ck_assert_int_eq(json_array_size(r), 3);
    ck_assert_str_eq(h_json_str(json_array_get(r, 0), "resource"), "top:b");
    ck_assert_str_eq(h_json_str(json_array_get(r, 1), "resource"), "top:a");
    ck_assert_str_eq(h_json_str(json_array_get(r, 2), "resource"), "top:c");
    ck_assert_int_eq(h_json_int(json_array_get(r, 0), "waiters"), 1);
    ck_assert_int_eq(h_json_int(json_array_get(r, 0), "holders"), 1);
    ck_assert_msg(h_json_int(json_array_get(r, 0), "waited_ms") >
                  h_json_int(json_array_get(r, 1), "waited_ms"),
                  "not the longest wait first");
    ck_assert_int_eq(h_json_int(json_array_get(r, 2), "waiters"), 0);
    ck_assert_str_eq(h_json_str(json_object_get(json_array_get(r, 0),
                                                "holder"), "name"), "holder");
    ck_assert(h_json_int(json_object_get(json_array_get(r, 2), "holder"),
                         "held_ms") >= 250);
    json_decref(top);

    top = h_ok_json(d, "TOP limit=1");
    ck_assert_int_eq(h_json_int(top, "total"), 3);
    r = json_object_get(top, "resources");
    ck_assert_int_eq(json_array_size(r), 1);
    ck_assert_str_eq(h_json_str(json_array_get(r, 0), "resource"), "top:b");
    json_decref(top);
    h_expect(d, "ERR ARG limit must be between 1 and 100", "TOP limit=101");
    h_expect(d, "ERR ARG", "TOP top:a");
}
END_TEST

#define USERS "\"auth\":{\"users\":["                                       \
    "{\"name\":\"alice\",\"password\":\"pa\",\"prefixes\":[\"a:\"]},"       \
    "{\"name\":\"bob\",\"password\":\"pb\",\"prefixes\":[\"b:x\"]}]}"

START_TEST(users_see_their_own)
{
    struct h_client *alice, *bob;
    json_t *top, *cl;

    h_cluster_daemon_start(&K, 0, "{" USERS "}");
    h_sleep_ms(300);    /* the node connects (STATS needs a login here) */
    alice = &K.clients[0];
    bob = &K.clients[1];
    h_connect_tcp_ok(alice, D->port);
    h_connect_tcp_ok(bob, D->port);
    h_expect(alice, "OK", "AUTH alice pa");
    h_expect(bob, "OK", "AUTH bob pb");
    h_expect(alice, "OK ", "LOCK a:1");
    h_expect(bob, "OK ", "LOCK b:x1");
    h_expect(bob, "OK ", "LOCK b:x2");

    top = h_ok_json(alice, "TOP");
    ck_assert_int_eq(h_json_int(top, "total"), 1);
    ck_assert_str_eq(h_json_str(json_array_get(json_object_get(top,
                     "resources"), 0), "resource"), "a:1");
    json_decref(top);
    top = h_ok_json(bob, "TOP");
    ck_assert_int_eq(h_json_int(top, "total"), 2);
    json_decref(top);

    /* Classes: "other" and those a user's prefixes overlap. */
    cl = classes(alice);
    ck_assert_ptr_nonnull(json_object_get(cl, "a:"));
    ck_assert_ptr_nonnull(json_object_get(cl, "other"));
    ck_assert_ptr_null(json_object_get(cl, "b:"));
    json_decref(cl);
    cl = classes(bob);
    ck_assert_ptr_nonnull(json_object_get(cl, "b:"));   /* b:x starts so */
    ck_assert_ptr_null(json_object_get(cl, "a:"));
    json_decref(cl);
}
END_TEST

static Suite *classes_suite(void)
{
    Suite *s = suite_create("classes");
    TCase *tc = tcase_create("classes");

    h_cluster_fixture(tc, &K, 1, true);
    tcase_set_timeout(tc, h_scale(60));
    tcase_add_test(tc, classes_by_prefix);
    tcase_add_test(tc, classes_bounded_under_10000_names);
    tcase_add_test(tc, classes_listed_then_reloaded);
    tcase_add_test(tc, timeout_observed);
    tcase_add_test(tc, holds_on_unlock_and_loss);
    tcase_add_test(tc, status_lists_waiters);
    tcase_add_test(tc, top_json);
    tcase_add_test(tc, users_see_their_own);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(classes_suite());
}
