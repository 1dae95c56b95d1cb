/*
 * test_kinds: shared locks, semaphores and several resources at once, on
 * the real redlockd binary with three real redis-server nodes and (where
 * it matters) two daemons on them (ids d0 and d1), against protocol.md's
 * "Additions" and what the nodes themselves hold:
 *   - many readers on both daemons hold together while a writer waits, and
 *     the writer gets in, promptly, when the last one leaves; a reader
 *     that comes after the writer waits for it; fences go up;
 *   - a plain SET NX client holding lock:<r> keeps shared and exclusive
 *     grants out, and they get in once it is gone;
 *   - shared leases are renewed, extended, released on a dropped
 *     connection (or kept for lock_delay_ms), and lost when their member
 *     goes; STATUS shows mode and holders;
 *   - a semaphore of K across two daemons: distinct slots, BUSY past K,
 *     a waiter woken by any slot's release, STATUS slots_held;
 *   - several resources: one grant, then one lease each (EXTEND, UNLOCK,
 *     EVENT LOST alone); UNLOCK of several; two sessions locking {a,b}
 *     and {b,a} over and over never deadlock and never both hold b;
 *   - FORCEUNLOCK removes readers and slots too, and tells their holders;
 *   - every new error: limit above locks.max_limit, more names than
 *     locks.max_multi, a name twice, a conflicting K, shared with several
 *     names or with limit=, HELD, NOTHELD for UNLOCK of several.
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NNODES 3
#define NDAEMONS 2

/* Its nodes (started before each test) and daemons (harness.h); nd of
 * them started. */
static struct h_cluster K;
static struct h_redis *const R = K.nodes;
static int nd;

static void setup(void)
{
    nd = 0;
}

/* Daemon i (id d<i>), with `extra` (JSON members, may be "") merged in. */
static struct h_daemon *start_daemon(const char *extra)
{
    char json[512];

    ck_assert_int_lt(nd, NDAEMONS);
    snprintf(json, sizeof(json), "{\"id\":\"d%d\"%s%s}", nd,
             extra && *extra ? "," : "", extra ? extra : "");
    return h_cluster_daemon(&K, nd++, json, h_scale(5000));
}

static unsigned long long fence_of(const char *line)
{
    const char *f = h_kv(line, "fence");
    ck_assert_msg(f, "no fence= in \"%s\"", line);
    return strtoull(f, NULL, 10);
}

/* The next line of c that is not an EVENT, within ms; NULL if none. */
static char *reply_within(struct h_client *c, int ms)
{
    uint64_t t0 = h_now_ms();
    for (;;) {
        long long left = ms - h_since(t0);
        char *line = h_recv_line(c, left > 0 ? (int)left : 0);
        if (!line || !h_starts(line, "EVENT "))
            return line;
    }
}

/* A reply is due now: assert it comes (within 5 s) and starts so. */
static char *reply_expect(struct h_client *c, const char *prefix)
{
    char *line = reply_within(c, h_scale(5000));
    ck_assert_msg(line, "no reply, want \"%s...\"", prefix);
    ck_assert_msg(h_starts(line, prefix), "got \"%s\", want \"%s...\"", line,
                  prefix);
    return line;
}

/* Members of lock:<res>:shared on node i. */
static long long readers_on(int i, const char *res)
{
    return h_redis_cmd(&R[i], NULL, "ZCARD lock:%s:shared", res);
}

/* ---- shared locks -------------------------------------------------------- */

START_TEST(readers_together_writer_waits)
{
    struct h_client rd[4], w, late;
    unsigned long long maxf = 0;
    struct h_daemon *d0 = start_daemon(""), *d1 = start_daemon("");

    for (int i = 0; i < 4; i++) {
        h_connect_tcp_ok(&rd[i], (i % 2 ? d1 : d0)->port);
        char *l = h_expect(&rd[i], "OK resource=doc ", "LOCK doc mode=shared");
        ck_assert_str_eq(h_kv(l, "mode"), "shared");
        unsigned long long f = fence_of(l);
        ck_assert_msg(f > maxf, "fences of readers in order: %llu", f);
        maxf = f;
    }
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_eq(readers_on(i, "doc"), 4);
    /* No plain key: other Redlock clients see none, by design. */
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:doc"), 0);

    h_connect_tcp_ok(&w, d0->port);
    h_connect_tcp_ok(&late, d0->port);
    h_expect(&w, "ERR BUSY", "LOCK doc");
    h_sendf(&w, "LOCK doc wait=%d\n", h_scale(10000));
    h_sleep_ms(50);
    /* A reader after the writer on its daemon waits for the writer. */
    h_sendf(&late, "LOCK doc mode=shared wait=%d\n", h_scale(10000));
    ck_assert_ptr_null(reply_within(&w, 200));
    ck_assert_ptr_null(reply_within(&late, 10));

    json_t *st = h_ok_json(&rd[0], "STATUS doc");
    ck_assert_str_eq(h_json_str(st, "mode"), "shared");
    ck_assert_int_eq(h_json_int(st, "shared_holders"), 4);
    ck_assert_int_eq(h_json_int(st, "holders_here"), 2);
    ck_assert_int_eq(h_json_int(st, "waiters"), 2);
    ck_assert(json_is_true(json_object_get(st, "held")));
    json_decref(st);

    /* Readers leave, the one on the other daemon last. */
    for (int i = 0; i < 3; i++) {
        int k = i < 2 ? 2 * i : 1;      /* 0, 2 on d0, then 1 on d1 */
        h_expect(&rd[k], "OK resource=doc nodes=3", "UNLOCK doc");
        ck_assert_ptr_null(reply_within(&w, 30));
    }
    uint64_t t0 = h_now_ms();
    h_expect(&rd[3], "OK resource=doc nodes=3", "UNLOCK doc");
    char *l = reply_expect(&w, "OK resource=doc ");
    long long took = h_since(t0);
    ck_assert_msg(h_kv(l, "mode") == NULL, "exclusive grant: %s", l);
    ck_assert_msg(fence_of(l) > maxf, "writer's fence %llu not above %llu",
                  fence_of(l), maxf);
    maxf = fence_of(l);
    /* Woken by the release announcement, not by a retry timer. */
    ck_assert_msg(took < h_scale(400), "writer got in %lld ms after the "
                  "last reader left", took);
    ck_assert_ptr_null(reply_within(&late, 100));
    h_expect(&w, "OK resource=doc", "UNLOCK doc");
    l = reply_expect(&late, "OK resource=doc ");
    ck_assert_msg(fence_of(l) > maxf, "late reader's fence");
    h_expect(&late, "OK", "UNLOCK doc");
    for (int i = 0; i < 4; i++)
        h_close(&rd[i]);
    h_close(&w);
    h_close(&late);
}
END_TEST

START_TEST(plain_setnx_blocks_both_modes)
{
    struct h_client a, b;
    struct h_daemon *d0 = start_daemon("");

    for (int i = 0; i < NNODES; i++)
        ck_assert_int_ge(h_redis_cmd(&R[i], NULL, "SET lock:pl foreign NX "
                                     "PX 800"), 0);
    h_connect_tcp_ok(&a, d0->port);
    h_connect_tcp_ok(&b, d0->port);
    h_expect(&a, "ERR BUSY", "LOCK pl mode=shared");
    h_expect(&a, "ERR BUSY", "LOCK pl");
    h_expect(&a, "ERR BUSY", "LOCK pl other");
    /* The waiters get in once it expires (the foreign client announces
     * nothing: the key's PTTL wakes them). */
    uint64_t t0 = h_now_ms();
    h_expect(&a, "OK resource=pl ", "LOCK pl mode=shared wait=%d",
             h_scale(5000));
    ck_assert_msg(h_since(t0) >= 500, "shared grant %lld ms into an 800 ms "
                  "foreign key", h_since(t0));
    /* A redlockd writer sees the readers (a foreign SET NX client does
     * not look at their set: docs/design.md). */
    h_expect(&b, "ERR BUSY", "LOCK pl");
    h_expect(&a, "OK", "UNLOCK pl");
    h_expect(&b, "OK resource=pl ", "LOCK pl");
    h_close(&a);
    h_close(&b);
}
END_TEST

START_TEST(shared_lease_life)
{
    struct h_client a, b, c;
    struct h_daemon *d0 = start_daemon("");
    struct h_daemon *d1 = start_daemon("\"locks\":{\"lock_delay_ms\":800}");

    h_connect_tcp_ok(&a, d0->port);
    h_connect_tcp_ok(&b, d1->port);
    h_connect_tcp_ok(&c, d0->port);
    /* Renewed: a 600 ms lease outlives several of its ttls. */
    h_expect(&a, "OK resource=sl ", "LOCK sl mode=shared ttl=600");
    h_sleep_ms(1500);
    json_t *locks = h_ok_json(&a, "LOCKS");
    json_t *l0 = json_array_get(json_object_get(locks, "locks"), 0);
    ck_assert_str_eq(h_json_str(l0, "mode"), "shared");
    ck_assert_int_gt(h_json_int(l0, "validity"), 0);
    ck_assert_int_gt(h_json_int(l0, "renewals"), 1);
    json_decref(locks);
    ck_assert_int_eq(readers_on(0, "sl"), 1);
    h_expect(&a, "OK resource=sl ttl=5000 ", "EXTEND sl ttl=5000");
    long long pttl = h_redis_cmd(&R[1], NULL, "PTTL lock:sl:shared");
    ck_assert_msg(pttl > 4000, "set PTTL %lld after EXTEND", pttl);
    h_expect(&c, "ERR BUSY", "LOCK sl");

    /* Dropped connection: released at once, the writer gets in. */
    h_close(&a);
    h_expect(&c, "OK resource=sl ", "LOCK sl wait=%d", h_scale(3000));
    h_expect(&c, "OK", "UNLOCK sl");

    /* With lock_delay_ms on d1: the member stays 800 ms. */
    h_expect(&b, "OK resource=sl ", "LOCK sl mode=shared");
    h_close(&b);
    uint64_t t0 = h_now_ms();
    h_expect(&c, "OK resource=sl ", "LOCK sl wait=%d", h_scale(3000));
    ck_assert_msg(h_since(t0) >= 600, "lock delay kept it only %lld ms",
                  h_since(t0));
    h_expect(&c, "OK", "UNLOCK sl");

    /* The member deleted under a holder: EVENT LOST at the next renewal,
     * only for that holder. */
    h_connect_tcp_ok(&a, d0->port);
    h_connect_tcp_ok(&b, d0->port);
    char *l = h_expect(&a, "OK ", "LOCK sl mode=shared ttl=600");
    char tok[64];
    h_kv_copy(l, "token", tok, sizeof(tok));
    h_expect(&b, "OK ", "LOCK sl mode=shared ttl=600");
    for (int i = 0; i < NNODES; i++)
        h_redis_cmd(&R[i], NULL, "ZREM lock:sl:shared %s", tok);
    ck_assert_ptr_nonnull(h_expect_event(&a, "EVENT LOST resource=sl ",
                                         h_scale(2000)));
    ck_assert_ptr_null(h_expect_event(&b, "EVENT LOST", 400));
    h_expect(&a, "ERR LOST", "UNLOCK sl");
    h_expect(&b, "OK resource=sl nodes=3", "UNLOCK sl");
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:sl:shared"), 0);
    h_close(&a);
    h_close(&b);
    h_close(&c);
}
END_TEST

/* ---- semaphores ---------------------------------------------------------- */

START_TEST(semaphore_two_daemons)
{
    struct h_client c[4];
    struct h_daemon *d0 = start_daemon(""), *d1 = start_daemon("");
    int seen = 0;

    for (int i = 0; i < 4; i++)
        h_connect_tcp_ok(&c[i], (i % 2 ? d1 : d0)->port);
    for (int i = 0; i < 3; i++) {
        char *l = h_expect(&c[i], "OK resource=sem ", "LOCK sem limit=3");
        ck_assert_str_eq(h_kv(l, "limit"), "3");
        int slot = atoi(h_kv(l, "slot"));
        ck_assert_msg(slot >= 0 && slot < 3 && !(seen & (1 << slot)),
                      "slot %d twice", slot);
        seen |= 1 << slot;
        ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:sem#%d", slot),
                         1);
    }
    h_expect(&c[3], "ERR BUSY all 3 slots", "LOCK sem limit=3");
    /* Another K where this daemon holds the semaphore: ERR ARG. */
    h_expect(&c[3], "ERR ARG", "LOCK sem limit=4");
    h_expect(&c[3], "ERR ARG", "LOCK sem");
    json_t *st = h_ok_json(&c[3], "STATUS sem");
    ck_assert_int_eq(h_json_int(st, "limit"), 3);
    ck_assert_int_eq(h_json_int(st, "slots_held"), 3);
    json_decref(st);

    /* A waiter on d1 wakes when a slot goes on d0. */
    h_sendf(&c[3], "LOCK sem limit=3 wait=%d\n", h_scale(5000));
    ck_assert_ptr_null(reply_within(&c[3], 100));
    uint64_t t0 = h_now_ms();
    h_expect(&c[2], "OK resource=sem nodes=3", "UNLOCK sem");
    reply_expect(&c[3], "OK resource=sem ");
    ck_assert_msg(h_since(t0) < h_scale(400), "slot waiter took %lld ms",
                  h_since(t0));
    for (int i = 0; i < 4; i++)
        h_close(&c[i]);
}
END_TEST

/* ---- several resources --------------------------------------------------- */

START_TEST(multi_then_single_leases)
{
    struct h_client a, b;
    struct h_daemon *d0 = start_daemon(""), *d1 = start_daemon("");

    h_connect_tcp_ok(&a, d0->port);
    h_connect_tcp_ok(&b, d1->port);
    char *l = h_expect(&a, "OK resources=3 ", "LOCK m1 m2 m3 ttl=2000");
    char tok[64];
    h_kv_copy(l, "token", tok, sizeof(tok));
    for (int i = 0; i < NNODES; i++)
        for (int k = 1; k <= 3; k++) {
            char *v = NULL;
            h_redis_cmd(&R[i], &v, "GET lock:m%d", k);
            ck_assert_msg(h_holds_token(v, tok), "node %d m%d holds %s", i,
                          k, v ? v : "nothing");
            free(v);
        }
    h_expect(&b, "ERR BUSY", "LOCK m2");
    h_expect(&b, "ERR BUSY", "LOCK m3 m9");
    /* Nothing of a refused set was left behind. */
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:m9"), 0);
    h_expect(&a, "ERR HELD", "LOCK m3 m9");
    json_t *locks = h_ok_json(&a, "LOCKS");
    ck_assert_uint_eq(json_array_size(json_object_get(locks, "locks")), 3);
    json_decref(locks);
    h_expect(&a, "OK resource=m2 ttl=9000 ", "EXTEND m2 ttl=9000");
    h_expect(&a, "OK resource=m1 nodes=3", "UNLOCK m1");
    h_expect(&b, "OK resource=m1 ", "LOCK m1");
    /* m3 deleted under it: LOST for m3 only. */
    for (int i = 0; i < NNODES; i++)
        h_redis_cmd(&R[i], NULL, "DEL lock:m3");
    ck_assert_ptr_nonnull(h_expect_event(&a, "EVENT LOST resource=m3 ",
                                         h_scale(2000)));
    h_expect(&a, "ERR NOTHELD", "UNLOCK m2 m1");
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:m2"), 1);
    h_expect(&a, "ERR LOST the lease on m3 was lost; the others are "
             "released", "UNLOCK m2 m3");
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:m2"), 0);
    h_expect(&b, "OK resources=2 ", "LOCK m2 m3");
    h_expect(&b, "OK resources=3 nodes=3", "UNLOCK m3 m1 m2");
    h_close(&a);
    h_close(&b);
}
END_TEST

START_TEST(multi_opposite_orders_no_deadlock)
{
    struct h_client c[2];
    struct h_client *cs[2] = { &c[0], &c[1] };
    struct h_daemon *d0 = start_daemon(""), *d1 = start_daemon("");
    const char *req[2] = { "LOCK ab:a ab:b", "LOCK ab:b ab:a" };
    int rounds = 0, grants[2] = { 0, 0 };

    h_connect_tcp_ok(&c[0], d0->port);
    h_connect_tcp_ok(&c[1], d1->port);
    uint64_t t0 = h_now_ms();
    while (h_since(t0) < 2000) {
        for (int i = 0; i < 2; i++)
            h_sendf(&c[i], "%s ttl=3000 wait=%d\n", req[i], h_scale(3000));
        /* Whoever is granted holds b alone: the other's answer comes only
         * after the holder's UNLOCK. */
        for (int got = 0; got < 2; got++) {
            char *line;
            int i = h_wait_any_line(cs, 2, h_scale(3000), &line);
            ck_assert_msg(i >= 0, "round %d: no grant within 3 s (deadlock?)",
                          rounds);
            ck_assert_msg(h_starts(line, "OK resources=2 "), "round %d: %s",
                          rounds, line);
            grants[i]++;
            json_t *st = h_ok_json(&c[i], "STATUS ab:b");
            ck_assert_int_eq(h_json_int(st, "holders_here"), 1);
            json_decref(st);
            if (got == 0)
                ck_assert_ptr_null(reply_within(&c[1 - i], 5));
            /* nodes=2 when the other took one node first */
            h_expect(&c[i], "OK resources=2 nodes=", "UNLOCK ab:b ab:a");
        }
        rounds++;
    }
    ck_assert_int_gt(rounds, 10);
    ck_assert_int_eq(grants[0], rounds);
    ck_assert_int_eq(grants[1], rounds);
    h_close(&c[0]);
    h_close(&c[1]);
}
END_TEST

START_TEST(forceunlock_every_key)
{
    struct h_client r1, r2, sem, adm;
    struct h_daemon *d0 = start_daemon("\"auth\":{\"admin_password\":"
                                       "\"adm1n\"}");

    h_connect_tcp_ok(&r1, d0->port);
    h_connect_tcp_ok(&r2, d0->port);
    h_connect_tcp_ok(&sem, d0->port);
    h_connect_tcp_ok(&adm, d0->port);
    h_expect(&r1, "OK ", "LOCK fu mode=shared");
    h_expect(&r2, "OK ", "LOCK fu mode=shared");
    h_expect(&sem, "OK ", "LOCK fs limit=2");
    h_expect(&adm, "OK", "AUTH adm1n");
    h_expect(&adm, "OK resource=fu nodes=3", "FORCEUNLOCK fu");
    ck_assert_ptr_nonnull(h_expect_event(&r1, "EVENT LOST resource=fu ",
                                         h_scale(2000)));
    ck_assert_ptr_nonnull(h_expect_event(&r2, "EVENT LOST resource=fu ",
                                         h_scale(2000)));
    for (int i = 0; i < NNODES; i++)
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "EXISTS lock:fu:shared"),
                         0);
    h_expect(&adm, "OK resource=fs nodes=3", "FORCEUNLOCK fs");
    ck_assert_ptr_nonnull(h_expect_event(&sem, "EVENT LOST resource=fs ",
                                         h_scale(2000)));
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:fs#0 lock:fs#1"),
                     0);
    h_expect(&adm, "OK resource=fu ", "LOCK fu");
    h_close(&r1);
    h_close(&r2);
    h_close(&sem);
    h_close(&adm);
}
END_TEST

/* ---- errors -------------------------------------------------------------- */

START_TEST(new_error_paths)
{
    struct h_client a, b;
    struct h_daemon *d0 = start_daemon(
        "\"locks\":{\"max_limit\":8,\"max_multi\":4}");

    h_connect_tcp_ok(&a, d0->port);
    h_connect_tcp_ok(&b, d0->port);
    h_expect(&a, "ERR ARG limit must be between 1 and 8 (locks.max_limit)",
             "LOCK e limit=9");
    h_expect(&a, "ERR ARG limit must be", "LOCK e limit=0");
    h_expect(&a, "ERR ARG at most 4 resources in one LOCK (locks.max_multi)",
             "LOCK e1 e2 e3 e4 e5");
    h_expect(&a, "ERR ARG resource 'e2' named twice", "LOCK e1 e2 e2");
    h_expect(&a, "ERR ARG resource 'e1' named twice", "UNLOCK e1 e1");
    h_expect(&a, "ERR ARG several resources are locked in exclusive mode",
             "LOCK e1 e2 mode=shared");
    h_expect(&a, "ERR ARG limit= takes one resource", "LOCK e1 e2 limit=2");
    h_expect(&a, "ERR ARG limit= and mode=shared", "LOCK e1 limit=2 "
             "mode=shared");
    h_expect(&a, "ERR ARG mode must be shared or exclusive", "LOCK e mode=x");
    h_expect(&a, "OK resource=k ", "LOCK k limit=2");
    h_expect(&b, "ERR ARG k is a semaphore of limit=2 here, not 3",
             "LOCK k limit=3");
    h_expect(&b, "ERR ARG k is a semaphore here (limit=2)", "LOCK k");
    h_expect(&a, "OK resource=p ", "LOCK p mode=shared");
    h_expect(&b, "ERR ARG p is locked here without limit=", "LOCK p limit=2");
    h_expect(&a, "ERR HELD this session already holds p", "LOCK q p");
    h_expect(&a, "ERR HELD", "LOCK p mode=shared");
    h_expect(&a, "ERR NOTHELD this session does not hold zz (nothing was "
             "released)", "UNLOCK p zz");
    h_expect(&a, "OK resources=2 nodes=3", "UNLOCK p k");
    h_expect(&a, "ERR ARG limit must be between 1 and 8", "STATUS k "
             "limit=9");
    h_close(&a);
    h_close(&b);
}
END_TEST

static Suite *kinds_suite(void)
{
    Suite *s = suite_create("kinds");
    TCase *tc = tcase_create("kinds");

    h_cluster_fixture(tc, &K, NNODES, true);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, h_slow() ? 300 : 60);
    tcase_add_test(tc, readers_together_writer_waits);
    tcase_add_test(tc, plain_setnx_blocks_both_modes);
    tcase_add_test(tc, shared_lease_life);
    tcase_add_test(tc, semaphore_two_daemons);
    tcase_add_test(tc, multi_then_single_leases);
    tcase_add_test(tc, multi_opposite_orders_no_deadlock);
    tcase_add_test(tc, new_error_paths);
    tcase_add_test(tc, forceunlock_every_key);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(kinds_suite());
}
