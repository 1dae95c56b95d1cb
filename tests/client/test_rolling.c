/*
 * test_rolling: a rolling restart under load (issue 18). Three real
 * redis-server nodes, two redlockd daemons, NCLIENTS handles of the C
 * library (each its own thread, both daemons in its server list, failover
 * on), locking NRES resources in a loop while each daemon in turn is
 * restarted (SIGTERM, then started again on its port) ROUNDS times.
 *
 * Each holder records the interval during which it may work under the
 * careful-client rule: from the LOCK reply to the earlier of its UNLOCK
 * and its lease's deadline (redlockd_lease_deadline, which ADOPT and
 * refreshes move on), and checks the lease (redlockd_lease_check) before
 * each step of its work. Asserted: no two intervals of a resource overlap
 * and fences increase in the order the holders started
 * (tests/integration/mutex_checker.c); no lease was lost, since the other
 * daemon could always be reached in time; some leases were adopted (their
 * token changed under the same fence); every daemon exits 0 on each
 * SIGTERM.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "mutex_checker.h"
#include "redlockd.h"

#define NNODES 3
#define NCLIENTS 16
#define NRES 8
#define ROUNDS 5
#define TTL_MS 3000
#define STEP_MS 20
#define REFRESH_MS (TTL_MS / 4)

/* Its nodes and daemons D[0] and D[1] (harness.h). */
static struct h_cluster K;
static struct h_daemon *const D = K.daemons;
static char addr[2][64];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct mc_log ivlog;
static atomic_bool stopping;
static atomic_int grants, refused, lost, adopted, errors;
static char lost_msg[512];

static void on_lost(const char *resource, uint64_t fence, const char *reason,
                    void *ud)
{
    int id = (int)(intptr_t)ud;

    atomic_fetch_add(&lost, 1);
    pthread_mutex_lock(&mu);
    if (!lost_msg[0])
        snprintf(lost_msg, sizeof(lost_msg), "client %d lost %s (fence %"
                 PRIu64 "): %s", id, resource ? resource : "(all)", fence,
                 reason);
    pthread_mutex_unlock(&mu);
}

static void record(int res, int id, uint64_t fence, int64_t start,
                   int64_t end)
{
    struct mc_interval iv = {
        .res = res, .holder = id, .kind = MC_REDLOCKD, .fence = fence,
        .start = start, .end = end, .mode = MC_EXCLUSIVE,
    };

    pthread_mutex_lock(&mu);
    if (mc_log_add(&ivlog, &iv) != 0)
        atomic_fetch_add(&errors, 1);
    pthread_mutex_unlock(&mu);
}

/* Hold res until hold_until (us) or until the lease may no longer be
 * relied on; returns when the holder stopped working (us). */
static int64_t hold(struct redlockd *h, const char *name, int64_t hold_until)
{
    int64_t refreshed = h_now_us(), t;

    while ((t = h_now_us()) < hold_until) {
        if (redlockd_lease_check(h, name) != 0)
            return t;
        if (t - refreshed >= REFRESH_MS * 1000) {
            refreshed = t;
            (void)redlockd_refresh(h);  /* reconnects, resumes or adopts */
            continue;
        }
        h_sleep_ms(STEP_MS);
    }
    return t;
}

static void *client_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    const char *servers[2] = { addr[id % 2], addr[(id + 1) % 2] };
    struct redlockd_opts o = {
        .servers = servers, .nservers = 2, .name = "rolling",
        .on_lost = on_lost, .ud = arg,
    };
    struct redlockd_error err;
    struct redlockd *h;
    unsigned seed = (unsigned)id * 7919u + 1;

    if (redlockd_connect(&h, &o, &err) < 0) {
        atomic_fetch_add(&errors, 1);
        return NULL;
    }
    while (!atomic_load(&stopping)) {
        char name[32];
        int res = (int)(rand_r(&seed) % NRES);
        struct redlockd_lease l, now;
        int64_t start, end, deadline_ms;

        snprintf(name, sizeof(name), "roll:%d", res);
        if (redlockd_lock(h, name, TTL_MS, 0, 1, &l) != 0) {
            atomic_fetch_add(&refused, 1);
            h_sleep_ms(50 + (int)(rand_r(&seed) % 100));
            continue;
        }
        start = h_now_us();
        atomic_fetch_add(&grants, 1);
        /* Many holds outlast a daemon's shutdown window (500 ms): those
         * are left on the nodes and adopted. */
        end = hold(h, name, start +
                   (int64_t)(100 + rand_r(&seed) % 2400) * 1000);
        /* The careful-client rule: no work past the deadline. */
        if (redlockd_lease_deadline(h, name, &deadline_ms) == 0 &&
            deadline_ms * 1000 < end)
            end = deadline_ms * 1000;
        record(res, id, l.fence, start, end);
        if (redlockd_lease_info(h, name, &now) == 0 &&
            strcmp(now.token, l.token) != 0) {
            atomic_fetch_add(&adopted, 1);
            if (now.fence != l.fence)
                atomic_fetch_add(&errors, 1);
        }
        (void)redlockd_unlock(h, name);
    }
    redlockd_close(h);
    return NULL;
}

START_TEST(rolling_restart)
{
    static const char *conf = "{\"shutdown_timeout_ms\":500}";
    pthread_t th[NCLIENTS];
    struct mc_report rep;
    int restarts = 0;

    mc_log_init(&ivlog);
    h_cluster_nodes(&K, NNODES, "--appendonly yes --appendfsync always");
    for (int i = 0; i < 2; i++) {
        h_cluster_daemon(&K, i, conf, h_scale(5000));
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", D[i].port);
    }
    for (int i = 0; i < NCLIENTS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, client_main,
                                        (void *)(intptr_t)i), 0);
    h_sleep_ms(1000);
    for (int round = 0; round < ROUNDS; round++) {
        for (int d = 0; d < 2; d++) {
            int st = h_daemon_stop(&D[d]);
            ck_assert_msg(st == 0, "daemon %d exited %d on SIGTERM", d, st);
            h_daemon_restart(&D[d]);
            h_wait_voting(&D[d], NNODES, h_scale(5000));
            restarts++;
            h_sleep_ms(700);
        }
    }
    h_sleep_ms(1000);
    atomic_store(&stopping, true);
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(mc_check(&ivlog, &rep), 0);
    fprintf(stderr, "rolling: %d restarts, %d grants, %zu intervals, %d "
            "refused, %d adopted, %d lost, overlaps %zu, fence errors %zu\n",
            restarts, atomic_load(&grants), rep.intervals,
            atomic_load(&refused), atomic_load(&adopted), atomic_load(&lost),
            rep.overlaps, rep.fence_violations);
    ck_assert_msg(rep.overlaps == 0 && rep.fence_violations == 0,
                  "%zu overlaps, %zu fence errors:\n%s", rep.overlaps,
                  rep.fence_violations, rep.msg);
    ck_assert_msg(atomic_load(&lost) == 0, "%d leases lost with the other "
                  "daemon up: %s", atomic_load(&lost), lost_msg);
    ck_assert_int_eq(atomic_load(&errors), 0);
    ck_assert_msg(atomic_load(&grants) >= 40, "only %d grants",
                  atomic_load(&grants));
    ck_assert_msg(atomic_load(&adopted) > 0, "no lease was adopted across "
                  "%d restarts", restarts);
    mc_log_deinit(&ivlog);
    h_cluster_stop(&K);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rolling");
    TCase *tc = tcase_create("rolling");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_set_timeout(tc, h_slow() ? 600 : 120);
    tcase_add_test(tc, rolling_restart);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
