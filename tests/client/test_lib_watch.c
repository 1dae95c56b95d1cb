/*
 * test_lib_watch: holders' values and watching through libredlockd
 * (redlockd_lock_opts.value, redlockd_set_value, redlockd_holder,
 * redlockd_watch and on_holder; issue 32 point 3), against two real
 * redlockd daemons on the same real redis-server nodes.
 *
 * What is checked:
 *   - a value set with a lock (redlockd_lockv, and a submission) is seen
 *     by redlockd_holder through the other daemon with the holder's
 *     fence, name and daemon; redlockd_set_value replaces it, keeping the
 *     token and fence and confirming the lease; shared holds and
 *     semaphores are counted and take no value (ERR ARG), a malformed
 *     value fails before anything is sent (INVALID), a free resource has
 *     no holder;
 *   - on_holder hears the state at once, then each change made through the
 *     other daemon: a grant with its value, a new value, shared holders,
 *     a release; nothing more after UNWATCH; a request from inside
 *     on_holder fails with INVALID;
 *   - a resumed session (redlockd_reconnect) hears its watches' states
 *     again and goes on hearing changes;
 *   - failover: the daemon dies, the handle goes to the other one with a
 *     new session, WATCHes again, and hears the state there and the
 *     changes after.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "redlockd.h"

#define HANDLES_MAX 4
#define EVENTS_MAX 256

static struct h_cluster K;
static struct h_daemon *const D = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];
static struct redlockd *H[HANDLES_MAX];
static int nh;
static char addr[64], addr2[64];

/* What on_holder heard, in order; `next` is where next_event reads on. */
struct ev_log {
    struct redlockd *h;
    struct redlockd_holder ev[EVENTS_MAX];
    int n, next;
    int request_rc;         /* a PING from inside the callback */
};

static struct ev_log L;

static void setup(void)
{
    h_cluster_init(&K);
    memset(H, 0, sizeof(H));
    memset(&L, 0, sizeof(L));
    nh = 0;
}

static void teardown(void)
{
    for (int i = 0; i < nh; i++)
        redlockd_close(H[i]);
    nh = 0;
    h_cluster_teardown(&K);
}

/* Three nodes, D and D2 over them, every node voting on both. */
static void start(void)
{
    h_cluster_start(&K, 3, 2, NULL, h_scale(5000));
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", D->port);
    snprintf(addr2, sizeof(addr2), "127.0.0.1:%d", D2->port);
}

static void on_holder(const struct redlockd_holder *hd, void *ud)
{
    struct ev_log *log = ud;

    ck_assert_int_lt(log->n, EVENTS_MAX);
    log->ev[log->n++] = *hd;
    log->request_rc = redlockd_ping(log->h);
}

static struct redlockd *open_opts(struct redlockd_opts *o, const char *name)
{
    struct redlockd_error err;
    struct redlockd *h = NULL;
    int rc;

    ck_assert_int_lt(nh, HANDLES_MAX);
    o->name = name;
    rc = redlockd_connect(&h, o, &err);
    ck_assert_msg(rc == 0 && h, "connect %s: %d %s", name, rc,
                  rc < 0 ? err.msg : "");
    H[nh++] = h;
    return h;
}

static struct redlockd *open_at(const char *server, const char *name)
{
    struct redlockd_opts o = { .server = server };

    return open_opts(&o, name);
}

/* A watcher logging into L, over servers (one or two). */
static struct redlockd *open_watcher(const char *const *servers, size_t n)
{
    struct redlockd_opts o = { .servers = servers, .nservers = n,
                               .on_holder = on_holder, .ud = &L };

    L.h = open_opts(&o, "watcher");
    return L.h;
}

static void lock_value(struct redlockd *h, const char *res, const char *value,
                       struct redlockd_grant *g)
{
    struct redlockd_lock_opts o = { .ttl_ms = 10000, .value = value };
    int rc = redlockd_lockv(h, &res, 1, &o, g);

    ck_assert_msg(rc == 0, "LOCK %s value=%s: %d %s", res, value, rc,
                  redlockd_last_error(h)->msg);
}

static struct redlockd_holder holder_of(struct redlockd *h, const char *res)
{
    struct redlockd_holder hd;
    int rc = redlockd_holder(h, res, &hd);

    ck_assert_msg(rc == 0, "holder of %s: %d %s", res, rc,
                  redlockd_last_error(h)->msg);
    ck_assert_str_eq(hd.resource, res);
    return hd;
}

/* The next event for res that L has heard or hears within timeout_ms
 * (asserted); events of other resources are skipped. */
static const struct redlockd_holder *next_event(const char *res,
                                                int timeout_ms)
{
    uint64_t t0 = h_now_ms();

    for (;;) {
        while (L.next < L.n) {
            const struct redlockd_holder *e = &L.ev[L.next++];
            if (strcmp(e->resource, res) == 0)
                return e;
        }
        ck_assert_msg(h_since(t0) < h_scale(timeout_ms), "no EVENT HOLDER "
                      "for %s within %d ms (%s)", res, timeout_ms,
                      redlockd_last_error(L.h)->msg);
        (void)redlockd_poll_events(L.h, 50);
    }
}

/* The first event for res that shows `held` holders (a grant through the
 * other daemon may show after a state from before it). */
static const struct redlockd_holder *event_held(const char *res,
                                                unsigned held)
{
    const struct redlockd_holder *e;

    do {
        e = next_event(res, 2000);
    } while (e->held != held);
    return e;
}

static void assert_quiet(const char *res, int ms)
{
    uint64_t t0 = h_now_ms();

    while (h_since(t0) < ms)
        (void)redlockd_poll_events(L.h, 50);
    for (; L.next < L.n; L.next++)
        ck_assert_msg(strcmp(L.ev[L.next].resource, res) != 0, "an event "
                      "for %s (held %u) after UNWATCH", res,
                      L.ev[L.next].held);
}

/* ---- values ---- */

START_TEST(value_set_shown_replaced)
{
    static const char *sh = "val:sh", *sem = "val:sem", *sub = "val:sub";
    struct redlockd_lock_opts shared = { .mode = REDLOCKD_SHARED };
    struct redlockd_lock_opts bad = { .mode = REDLOCKD_SHARED, .value = "x" };
    struct redlockd_lock_opts slots = { .limit = 3 };
    struct redlockd_lock_opts valued = { .value = "submitted" };
    struct redlockd_lease before, after;
    struct redlockd_holder hd;
    struct redlockd_grant g;
    struct redlockd_done d;
    struct redlockd *a, *b;
    int64_t dl0, dl1;

    start();
    a = open_at(addr, "leader-a");
    b = open_at(addr2, "observer");
    lock_value(a, "val:1", "http://10.0.0.7:8080/?a=b", &g);
    hd = holder_of(b, "val:1");
    ck_assert_uint_eq(hd.held, 1);
    ck_assert_int_eq(hd.mode, REDLOCKD_EXCLUSIVE);
    ck_assert_int_eq(hd.foreign, 0);
    ck_assert_uint_eq(hd.limit, 0);
    ck_assert_uint_eq(hd.fence, g.lease.fence);
    ck_assert_str_eq(hd.name, "leader-a");
    ck_assert_msg(hd.daemon[0] != '\0', "no daemon named");
    ck_assert_str_eq(hd.value, "http://10.0.0.7:8080/?a=b");

    /* Replaced in place: the same lease, confirmed again. */
    ck_assert_int_eq(redlockd_lease_info(a, "val:1", &before), 0);
    ck_assert_int_eq(redlockd_lease_deadline(a, "val:1", &dl0), 0);
    h_sleep_ms(20);
    ck_assert_int_eq(redlockd_set_value(a, "val:1", "10.0.0.8:8080"), 0);
    ck_assert_int_eq(redlockd_lease_deadline(a, "val:1", &dl1), 0);
    ck_assert_msg(dl1 > dl0, "the deadline did not move (%lld, %lld)",
                  (long long)dl0, (long long)dl1);
    ck_assert_int_eq(redlockd_lease_info(a, "val:1", &after), 0);
    ck_assert_str_eq(after.token, before.token);
    ck_assert_uint_eq(after.ttl, 10000);
    hd = holder_of(b, "val:1");
    ck_assert_str_eq(hd.value, "10.0.0.8:8080");
    ck_assert_uint_eq(hd.fence, g.lease.fence);

    /* Refused: before sending, by the daemon, or not held. */
    ck_assert_int_eq(redlockd_set_value(a, "val:1", "two words"),
                     -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_set_value(a, "val:1", ""), -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_set_value(a, "val:1", NULL),
                     -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_set_value(a, "val:none", "x"),
                     -REDLOCKD_E_NOTHELD);
    ck_assert_int_eq(redlockd_lockv(a, &sh, 1, &bad, NULL), -REDLOCKD_E_ARG);

    /* Shared holders and semaphore slots are counted. */
    ck_assert_int_eq(redlockd_lockv(a, &sh, 1, &shared, NULL), 0);
    ck_assert_int_eq(redlockd_set_value(a, sh, "x"), -REDLOCKD_E_ARG);
    hd = holder_of(b, sh);
    ck_assert_uint_eq(hd.held, 1);
    ck_assert_int_eq(hd.mode, REDLOCKD_SHARED);
    ck_assert_str_eq(hd.value, "");
    ck_assert_int_eq(redlockd_lockv(a, &sem, 1, &slots, NULL), 0);
    hd = holder_of(a, sem);
    ck_assert_uint_eq(hd.limit, 3);
    ck_assert_uint_eq(hd.held, 1);

    /* A submission carries it too. */
    ck_assert_int_eq(redlockd_submit_lock(a, &sub, 1, &valued, NULL), 0);
    ck_assert_int_eq(redlockd_complete(a, h_scale(5000), &d), 1);
    ck_assert_msg(d.rc == 0, "submitted LOCK: %d %s", d.rc, d.err.msg);
    ck_assert_str_eq(holder_of(b, sub).value, "submitted");

    /* Released: no holder. */
    ck_assert_int_eq(redlockd_unlock(a, "val:1"), 0);
    hd = holder_of(b, "val:1");
    ck_assert_uint_eq(hd.held, 0);
    ck_assert_str_eq(hd.value, "");
    ck_assert_uint_eq(hd.fence, 0);
}
END_TEST

/* ---- watching ---- */

START_TEST(watch_changes_through_the_other_daemon)
{
    static const char *both[] = { "w:1", "w:2" };
    const char *servers[] = { addr };
    struct redlockd_lock_opts shared = { .mode = REDLOCKD_SHARED };
    const struct redlockd_holder *e;
    struct redlockd_grant g;
    struct redlockd *w, *a;

    start();
    w = open_watcher(servers, 1);
    a = open_at(addr2, "leader-a");
    ck_assert_int_eq(redlockd_watch(w, both, 2), 2);
    ck_assert_int_eq(redlockd_watch(w, both, 1), 2);    /* again: the same */
    ck_assert_uint_eq(event_held("w:1", 0)->held, 0);
    ck_assert_uint_eq(event_held("w:2", 0)->held, 0);

    lock_value(a, "w:1", "10.0.0.9:80", &g);
    e = event_held("w:1", 1);
    ck_assert_int_eq(e->mode, REDLOCKD_EXCLUSIVE);
    ck_assert_uint_eq(e->fence, g.lease.fence);
    ck_assert_str_eq(e->name, "leader-a");
    ck_assert_str_eq(e->value, "10.0.0.9:80");
    ck_assert_msg(e->daemon[0] != '\0', "no daemon named");
    ck_assert_int_eq(L.request_rc, -REDLOCKD_E_INVALID);

    ck_assert_int_eq(redlockd_set_value(a, "w:1", "10.0.0.9:81"), 0);
    e = next_event("w:1", 2000);
    ck_assert_str_eq(e->value, "10.0.0.9:81");
    ck_assert_uint_eq(e->fence, g.lease.fence);

    ck_assert_int_eq(redlockd_lockv(a, &both[1], 1, &shared, NULL), 0);
    e = event_held("w:2", 1);
    ck_assert_int_eq(e->mode, REDLOCKD_SHARED);
    ck_assert_str_eq(e->value, "");

    ck_assert_int_eq(redlockd_unlock(a, "w:1"), 0);
    e = next_event("w:1", 2000);
    ck_assert_uint_eq(e->held, 0);
    ck_assert_str_eq(e->value, "");

    ck_assert_int_eq(redlockd_unwatch(w, both, 1), 1);
    lock_value(a, "w:1", "unseen", &g);
    assert_quiet("w:1", 500);
}
END_TEST

/* The same session on the same daemon: its watches are the daemon's. */
START_TEST(watch_survives_resume)
{
    static const char *res = "w:r";
    const char *servers[] = { addr };
    const struct redlockd_holder *e;
    struct redlockd_grant g;
    struct redlockd *w, *a;
    char session[64];

    start();
    w = open_watcher(servers, 1);
    a = open_at(addr2, "leader-a");
    ck_assert_int_eq(redlockd_watch(w, &res, 1), 1);
    event_held(res, 0);
    snprintf(session, sizeof(session), "%s", redlockd_info(w)->session);
    ck_assert_int_eq(redlockd_reconnect(w), 0);
    ck_assert_str_eq(redlockd_info(w)->session, session);
    /* Told again after the resume. */
    ck_assert_uint_eq(next_event(res, 2000)->held, 0);
    lock_value(a, res, "after-resume", &g);
    e = event_held(res, 1);
    ck_assert_str_eq(e->value, "after-resume");
}
END_TEST

/* A new session on the other daemon watches again. */
START_TEST(watch_follows_failover)
{
    static const char *res = "w:f";
    const char *servers[] = { addr, addr2 };
    const struct redlockd_holder *e;
    struct redlockd_grant g;
    struct redlockd *w, *a;
    char session[64];

    start();
    w = open_watcher(servers, 2);
    a = open_at(addr2, "leader-a");
    ck_assert_int_eq(redlockd_watch(w, &res, 1), 1);
    event_held(res, 0);
    snprintf(session, sizeof(session), "%s", redlockd_info(w)->session);

    h_daemon_kill(D);
    lock_value(a, res, "on-d2", &g);
    e = event_held(res, 1);
    ck_assert_str_eq(e->value, "on-d2");
    ck_assert_str_eq(redlockd_server(w), addr2);
    ck_assert_str_ne(redlockd_info(w)->session, session);
    ck_assert_int_eq(redlockd_unlock(a, res), 0);
    ck_assert_uint_eq(next_event(res, 2000)->held, 0);
}
END_TEST

static Suite *watch_suite(void)
{
    Suite *s = suite_create("lib_watch");
    TCase *tc = tcase_create("watch");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, value_set_shown_replaced);
    tcase_add_test(tc, watch_changes_through_the_other_daemon);
    tcase_add_test(tc, watch_survives_resume);
    tcase_add_test(tc, watch_follows_failover);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(watch_suite());
}
