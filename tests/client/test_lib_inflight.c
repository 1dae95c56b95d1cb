/*
 * test_lib_inflight: several requests in flight on one libredlockd handle
 * (redlockd_submit_*, redlockd_complete; issue 29 point 3), against the
 * real redlockd and real redis-server nodes.
 *
 * What is checked:
 *   - many at once: 300 LOCKs submitted on one handle before any answer is
 *     read, all granted (keys on the nodes, leases HELD in the table, one
 *     session), then 300 UNLOCKs the same way (keys gone, table empty);
 *   - out of order: a LOCK waiting for another handle's lease does not
 *     hold up a LOCK on another resource submitted after it, nor a
 *     blocking call made meanwhile (a PING, a refresh, a blocking LOCK);
 *     it is granted once the other handle lets go;
 *   - same-resource order: LOCK, UNLOCK, LOCK of one resource submitted
 *     back to back are answered in that order (fences rise);
 *   - refusals: BUSY, NOTHELD and LOST (keys deleted behind the daemon)
 *     come back in their redlockd_done with the code and a message, the
 *     table follows them (LOST marks the lease lost), and the handle stays
 *     usable; bad arguments fail the submission itself (INVALID, nothing
 *     sent); redlockd_complete with nothing in flight returns 0 at once;
 *   - a broken connection: every request in flight is answered with
 *     REDLOCKD_E_IO "outcome unknown", nothing is left in flight, and
 *     the next submission reconnects (a daemon restarted on the same port).
 */
#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "redlockd.h"

#define HANDLES_MAX 4
#define MANY 300

static struct h_cluster K;
static struct h_redis *const R = K.nodes;
static struct h_daemon *const D = &K.daemons[0];
static struct redlockd *H[HANDLES_MAX];
static int nh;
static char addr[64];

static void setup(void)
{
    h_cluster_init(&K);
    memset(H, 0, sizeof(H));
    nh = 0;
}

static void teardown(void)
{
    h_cluster_continue(&K);
    for (int i = 0; i < nh; i++)
        redlockd_close(H[i]);
    nh = 0;
    h_cluster_teardown(&K);
}

/* Three nodes and the daemon, every node voting. */
static void start(void)
{
    h_cluster_start(&K, 3, 1, NULL, h_scale(5000));
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", D->port);
}

static struct redlockd *open_handle(const char *name, int reconnect_max_ms)
{
    struct redlockd_opts o = { .server = addr, .name = name,
                               .reconnect_max_ms = reconnect_max_ms };
    struct redlockd_error err;
    struct redlockd *h = NULL;
    int rc;

    ck_assert_int_lt(nh, HANDLES_MAX);
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == 0 && h, "connect to %s: %d %s", addr, rc,
                  rc < 0 ? err.msg : "");
    H[nh++] = h;
    return h;
}

static uint64_t submit_lock(struct redlockd *h, const char *res,
                            uint32_t wait_ms)
{
    struct redlockd_lock_opts o = { .wait_ms = wait_ms, .ttl_ms = 10000 };
    uint64_t id = 0;
    int rc = redlockd_submit_lock(h, &res, 1, &o, &id);

    ck_assert_msg(rc == 0, "submit LOCK %s: %d %s", res, rc,
                  redlockd_last_error(h)->msg);
    ck_assert_msg(id != 0, "submit LOCK %s: id 0", res);
    return id;
}

static uint64_t submit_unlock(struct redlockd *h, const char *res)
{
    uint64_t id = 0;
    int rc = redlockd_submit_unlock(h, res, &id);

    ck_assert_msg(rc == 0, "submit UNLOCK %s: %d %s", res, rc,
                  redlockd_last_error(h)->msg);
    return id;
}

/* The next answer, within timeout_ms (asserted to come). */
static void next_done(struct redlockd *h, int timeout_ms,
                      struct redlockd_done *d)
{
    int rc = redlockd_complete(h, h_scale(timeout_ms), d);

    ck_assert_msg(rc == 1, "redlockd_complete: %d (%s), %zu in flight", rc,
                  redlockd_last_error(h)->msg, redlockd_inflight(h));
}

/* Nothing more comes within ms. */
static void assert_quiet(struct redlockd *h, int ms)
{
    struct redlockd_done d;
    int rc = redlockd_complete(h, ms, &d);

    ck_assert_msg(rc == 0, "an answer came (%d): id %" PRIu64 " rc %d %s", rc,
                  d.id, d.rc, d.err.msg);
}

static bool key_exists(int i, const char *res)
{
    long long v = h_redis_cmd(&R[i], NULL, "EXISTS lock:%s", res);

    ck_assert_msg(v >= 0, "EXISTS lock:%s on node %d failed", res, i);
    return v == 1;
}

/* ---- many at once ---- */

START_TEST(many_in_flight)
{
    static uint64_t ids[MANY];
    static bool seen[MANY];
    struct redlockd *h;
    struct redlockd_done d;
    char res[32];
    char *text = NULL;
    json_t *o;

    start();
    h = open_handle("many", 0);
    for (int i = 0; i < MANY; i++) {
        snprintf(res, sizeof(res), "many:%d", i);
        ids[i] = submit_lock(h, res, 0);
    }
    ck_assert_uint_eq(redlockd_inflight(h), MANY);
    for (int n = 0; n < MANY; n++) {
        int i;

        next_done(h, 10000, &d);
        ck_assert_int_eq(d.op, REDLOCKD_OP_LOCK);
        ck_assert_msg(d.rc == 0, "LOCK %s: %d %s", d.resource, d.rc,
                      d.err.msg);
        ck_assert_int_eq(sscanf(d.resource, "many:%d", &i), 1);
        ck_assert_msg(i >= 0 && i < MANY && !seen[i], "answer for %s",
                      d.resource);
        ck_assert_uint_eq(d.id, ids[i]);
        seen[i] = true;
        ck_assert_str_eq(d.grant.lease.resource, d.resource);
        ck_assert_msg(d.grant.lease.fence > 0 && d.grant.lease.validity > 0,
                      "grant of %s: fence %" PRIu64 " validity %" PRId64,
                      d.resource, d.grant.lease.fence,
                      d.grant.lease.validity);
        ck_assert_int_eq(redlockd_lease_state(h, d.resource),
                         REDLOCKD_LEASE_HELD);
    }
    ck_assert_uint_eq(redlockd_inflight(h), 0);
    for (int i = 0; i < K.nnodes; i++)
        ck_assert(key_exists(i, "many:0") && key_exists(i, "many:299"));

    /* One session holds them all. */
    ck_assert_int_eq(redlockd_locks(h, &text), 0);
    o = json_loads(text, 0, NULL);
    free(text);
    ck_assert_uint_eq(json_array_size(json_object_get(o, "locks")), MANY);
    json_decref(o);

    for (int i = 0; i < MANY; i++) {
        snprintf(res, sizeof(res), "many:%d", i);
        ids[i] = submit_unlock(h, res);
    }
    for (int n = 0; n < MANY; n++) {
        next_done(h, 10000, &d);
        ck_assert_int_eq(d.op, REDLOCKD_OP_UNLOCK);
        ck_assert_msg(d.rc == 0, "UNLOCK %s: %d %s", d.resource, d.rc,
                      d.err.msg);
        ck_assert_int_eq(redlockd_lease_state(h, d.resource),
                         REDLOCKD_LEASE_NONE);
    }
    for (int i = 0; i < K.nnodes; i++)
        ck_assert(!key_exists(i, "many:0") && !key_exists(i, "many:299"));
    assert_quiet(h, 0);
}
END_TEST

/* ---- order ---- */

START_TEST(waiting_lock_holds_up_nothing_else)
{
    struct redlockd *a, *b;
    struct redlockd_done d;
    struct redlockd_lease l;
    uint64_t waiting, other;
    uint64_t t0;

    start();
    a = open_handle("ooo-a", 0);
    b = open_handle("ooo-b", 0);
    ck_assert_int_eq(redlockd_lock(b, "ooo:x", 10000, 0, 1, NULL), 0);

    waiting = submit_lock(a, "ooo:x", 8000);
    other = submit_lock(a, "ooo:y", 0);
    next_done(a, 3000, &d);
    ck_assert_uint_eq(d.id, other);
    ck_assert_int_eq(d.rc, 0);

    /* Blocking calls go tagged meanwhile: none waits for ooo:x. */
    t0 = h_now_ms();
    ck_assert_int_eq(redlockd_ping(a), 0);
    ck_assert_int_eq(redlockd_refresh(a), 0);
    ck_assert_int_eq(redlockd_lock(a, "ooo:z", 10000, 0, 1, &l), 0);
    ck_assert_msg(h_since(t0) < 1500, "blocking calls took %lld ms behind a "
                  "waiting LOCK", h_since(t0));
    ck_assert_int_eq(redlockd_lease_state(a, "ooo:y"), REDLOCKD_LEASE_HELD);
    ck_assert_uint_eq(redlockd_inflight(a), 1);
    assert_quiet(a, 200);

    ck_assert_int_eq(redlockd_unlock(b, "ooo:x"), 0);
    next_done(a, 5000, &d);
    ck_assert_uint_eq(d.id, waiting);
    ck_assert_msg(d.rc == 0, "the waiting LOCK: %d %s", d.rc, d.err.msg);
    ck_assert_str_eq(d.resource, "ooo:x");
    ck_assert_int_eq(redlockd_lease_state(a, "ooo:x"), REDLOCKD_LEASE_HELD);
}
END_TEST

START_TEST(same_resource_in_order)
{
    struct redlockd *h;
    struct redlockd_done d1, d2, d3;
    uint64_t i1, i2, i3;

    start();
    h = open_handle("order", 0);
    i1 = submit_lock(h, "ord:r", 0);
    i2 = submit_unlock(h, "ord:r");
    i3 = submit_lock(h, "ord:r", 0);
    next_done(h, 5000, &d1);
    next_done(h, 5000, &d2);
    next_done(h, 5000, &d3);
    ck_assert_uint_eq(d1.id, i1);
    ck_assert_uint_eq(d2.id, i2);
    ck_assert_uint_eq(d3.id, i3);
    ck_assert_msg(d1.rc == 0 && d2.rc == 0 && d3.rc == 0,
                  "rc %d %d %d (%s / %s / %s)", d1.rc, d2.rc, d3.rc,
                  d1.err.msg, d2.err.msg, d3.err.msg);
    ck_assert_uint_gt(d3.grant.lease.fence, d1.grant.lease.fence);
    ck_assert_int_eq(redlockd_lease_state(h, "ord:r"), REDLOCKD_LEASE_HELD);
}
END_TEST

/* ---- refusals and bad arguments ---- */

START_TEST(refusals)
{
    struct redlockd *a, *b;
    struct redlockd_done d;
    const char *empty = "";
    uint64_t id = 7;
    int rc;

    start();
    a = open_handle("ref-a", 0);
    b = open_handle("ref-b", 0);
    ck_assert_int_eq(redlockd_complete(a, 5000, &d), 0);   /* at once */

    ck_assert_int_eq(redlockd_lock(b, "ref:busy", 10000, 0, 1, NULL), 0);
    submit_lock(a, "ref:busy", 0);
    next_done(a, 3000, &d);
    ck_assert_int_eq(d.rc, -REDLOCKD_E_BUSY);
    ck_assert_int_eq(d.err.code, REDLOCKD_E_BUSY);
    ck_assert_msg(d.err.msg[0] != '\0', "BUSY without a message");
    ck_assert_int_eq(redlockd_last_error(a)->code, 0);

    submit_unlock(a, "ref:none");
    next_done(a, 3000, &d);
    ck_assert_int_eq(d.rc, -REDLOCKD_E_NOTHELD);

    /* LOST: the keys go behind the daemon's back. */
    ck_assert_int_eq(redlockd_lock(a, "ref:gone", 10000, 0, 0, NULL), 0);
    for (int i = 0; i < K.nnodes; i++)
        h_redis_cmd(&R[i], NULL, "DEL lock:ref:gone");
    ck_assert_int_eq(redlockd_submit_extend(a, "ref:gone", 20000, &id), 0);
    next_done(a, 3000, &d);
    ck_assert_int_eq(d.op, REDLOCKD_OP_EXTEND);
    ck_assert_msg(d.rc == -REDLOCKD_E_LOST, "EXTEND of deleted keys: %d %s",
                  d.rc, d.err.msg);
    ck_assert_int_eq(redlockd_lost(a, "ref:gone"), 1);

    /* An EXTEND that works moves the deadline and says the validity. */
    ck_assert_int_eq(redlockd_lock(a, "ref:ext", 5000, 0, 0, NULL), 0);
    ck_assert_int_eq(redlockd_submit_extend(a, "ref:ext", 20000, &id), 0);
    next_done(a, 3000, &d);
    ck_assert_int_eq(d.rc, 0);
    ck_assert_msg(d.validity > 10000, "validity %" PRId64, d.validity);

    /* Refused before anything is sent. */
    rc = redlockd_submit_extend(a, "ref:ext", 0, &id);
    ck_assert_int_eq(rc, -REDLOCKD_E_INVALID);
    ck_assert_uint_eq(id, 0);
    rc = redlockd_submit_lock(a, &empty, 1, NULL, &id);
    ck_assert_int_eq(rc, -REDLOCKD_E_INVALID);
    rc = redlockd_submit_lock(a, NULL, 0, NULL, &id);
    ck_assert_int_eq(rc, -REDLOCKD_E_INVALID);
    ck_assert_uint_eq(redlockd_inflight(a), 0);
    ck_assert_int_eq(redlockd_ping(a), 0);
}
END_TEST

/* ---- a broken connection ---- */

START_TEST(broken_connection)
{
    struct redlockd *a, *b;
    struct redlockd_done d;
    int failed = 0;

    start();
    a = open_handle("broken-a", 0);
    b = open_handle("broken-b", -1);
    ck_assert_int_eq(redlockd_lock(b, "brk:x", 30000, 0, 1, NULL), 0);
    submit_lock(a, "brk:x", 20000);
    submit_lock(a, "brk:x2", 20000);
    submit_unlock(a, "brk:x2");     /* waits behind the LOCK of brk:x2 */
    /* brk:x2 was granted at once: its UNLOCK then too. Wait for both. */
    next_done(a, 3000, &d);
    next_done(a, 3000, &d);
    ck_assert_uint_eq(redlockd_inflight(a), 1);

    h_daemon_kill(D);
    while (redlockd_inflight(a) > 0) {
        next_done(a, 5000, &d);
        ck_assert_int_eq(d.rc, -REDLOCKD_E_IO);
        ck_assert_msg(strstr(d.err.msg, "outcome is unknown"), "message: %s",
                      d.err.msg);
        ck_assert_str_eq(d.resource, "brk:x");
        failed++;
    }
    ck_assert_int_eq(failed, 1);

    /* The next submission reconnects to the daemon, back on its port. */
    h_daemon_restart(D);
    h_wait_voting(D, K.nnodes, h_scale(5000));
    submit_lock(a, "brk:y", 0);
    next_done(a, 5000, &d);
    ck_assert_msg(d.rc == 0, "after the restart: %d %s", d.rc, d.err.msg);
}
END_TEST

static Suite *inflight_suite(void)
{
    Suite *s = suite_create("lib_inflight");
    TCase *tc = tcase_create("inflight");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, many_in_flight);
    tcase_add_test(tc, waiting_lock_holds_up_nothing_else);
    tcase_add_test(tc, same_resource_in_order);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, broken_connection);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(inflight_suite());
}
