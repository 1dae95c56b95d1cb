/*
 * test_lib: libredlockd (redlockd.h) called directly against the real
 * redlockd and real redis-server nodes (issue 5, point 3).
 *
 * Each test starts its own nodes and daemon from a checked fixture that
 * always stops them again and asserts that the daemon exits 0 on SIGTERM.
 * What is checked:
 *   - connecting over TCP (HOST:PORT, tcp://) and the unix socket
 *     (unix:PATH, /PATH), the HELLO information, lock / extend / unlock as
 *     seen in GET and PTTL on every node, ping, and that LOCKS, STATUS,
 *     SESSIONS and STATS return JSON that parses;
 *   - every error the daemon can be made to answer, mapped to its enum:
 *     BUSY, TIMEOUT, HELD, NOTHELD, ARG, LIMIT, NOAUTH, AUTH, LOST (keys
 *     deleted behind the daemon's back), UNAVAILABLE (two of three nodes
 *     stopped), TOOLONG; and those the library finds itself: IO (connection
 *     refused), IO_TIMEOUT (daemon stopped with SIGSTOP), CLOSED (daemon
 *     shut down), INVALID; each with its message and strerror text;
 *   - EVENT LOST after two of three nodes stop under renewed leases, seen
 *     through redlockd_poll_events() and through an ordinary request, with
 *     redlockd_lost() and the on_lost callback (which may not make
 *     requests);
 *   - lease deadlines: LOCK sets one, refreshes move it on while the
 *     daemon renews, and with the daemon stopped a refresh gives up at the
 *     deadline and lease_check says LOST from the deadline on;
 *   - strerror and code names for every code;
 *   - failover (issue 18): a handle given two daemons rides through its
 *     daemon's SIGTERM and restart (the lease adopted on the restarted
 *     daemon: same fence, new token, another handle BUSY throughout), its
 *     daemon's SIGKILL (every grant adopted on the other daemon, the
 *     resources of a multi-resource grant in one ADOPT with one token; a
 *     shared hold and the semaphore slot too; the next LOCK goes to the
 *     new session),
 *     a network blip (the same session resumed on the same daemon, also
 *     on request, and with an UNLOCK in the call that finds it), and a
 *     daemon SIGSTOPped past the lease's deadline (lost, "deadline", and
 *     never adopted).
 * UNKNOWN (the library only sends commands it knows) and SHUTDOWN (the
 * daemon closes every session as it starts stopping) can not be provoked
 * through the library.
 */
#include <check.h>
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "redlockd.h"

#define HANDLES_MAX 8

/* Redis timeouts short enough that stopped nodes are noticed within a
 * couple of seconds (as test_fault does). */
#define FAULT_JSON "{\"redis\":{\"command_timeout_ms\":100," \
                   "\"reconnect_max_ms\":200}}"

/* The nodes (R), the daemon D and a second daemon D2 on the same nodes,
 * for failover (harness.h). */
static struct h_cluster K;
static struct h_redis *const R = K.nodes;
static struct h_daemon *const D = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];
/* Every handle a test opened, closed by the teardown. */
static struct redlockd *H[HANDLES_MAX];
static int nh;
static char tcp_addr[64];
static char tcp_addr2[64];

/* ---- fixture ---- */

static void setup(void)
{
    h_cluster_init(&K);
    memset(H, 0, sizeof(H));
    nh = 0;
    tcp_addr[0] = '\0';
    tcp_addr2[0] = '\0';
}

/* Runs after every passing test; a failing one _exit()s its fork, and then
 * PDEATHSIG and the harness's guardians clean up instead. */
static void teardown(void)
{
    /* A daemon a test left stopped must run again to exit on SIGTERM. */
    h_cluster_continue(&K);
    for (int i = 0; i < nh; i++)
        redlockd_close(H[i]);
    nh = 0;
    h_cluster_teardown(&K);
}

/* ---- helpers ---- */

/* Connect and keep the handle for the teardown. */
static struct redlockd *open_opts(const struct redlockd_opts *o)
{
    struct redlockd_error err;
    struct redlockd *h = NULL;
    int rc;

    ck_assert_int_lt(nh, HANDLES_MAX);
    rc = redlockd_connect(&h, o, &err);
    ck_assert_msg(rc == 0 && h, "connect to %s: %d %s",
                  o->server ? o->server : "(default)", rc,
                  rc < 0 ? err.msg : "");
    H[nh++] = h;
    return h;
}

static struct redlockd *open_at(const char *server, const char *name)
{
    struct redlockd_opts o = { .server = server, .name = name };

    return open_opts(&o);
}

/* Close one handle early (QUIT), and forget it. */
static void close_handle(struct redlockd *h)
{
    for (int i = 0; i < nh; i++) {
        if (H[i] == h) {
            H[i] = H[--nh];
            break;
        }
    }
    redlockd_close(h);
}

/* JSON text from an inspection call, freed here; the caller decrefs. The
 * text comes by pointer: an argument evaluated before the call that
 * fills it would still be NULL. */
static json_t *parse(int rc, char **textp, struct redlockd *h, const char *what)
{
    char *text = *textp;
    json_error_t jerr;
    json_t *o;

    *textp = NULL;
    ck_assert_msg(rc == 0 && text, "%s failed: %d %s", what, rc,
                  redlockd_last_error(h)->msg);
    o = json_loads(text, 0, &jerr);
    ck_assert_msg(json_is_object(o), "%s: not a JSON object (%s): %s", what,
                  jerr.text, text);
    free(text);
    return o;
}

static json_t *stats(struct redlockd *h)
{
    char *text = NULL;

    return parse(redlockd_stats(h, &text), &text, h, "redlockd_stats");
}

/*
 * Start the daemon over the nodes and wait until every node votes: it
 * listens before its Redis connections are up, and a lock taken before
 * then would rightly be refused for a reason these tests are not about.
 */
static void start_daemon_login(const char *extra_json, const char *user,
                               const char *password)
{
    struct redlockd_opts o = { .name = "ready-probe", .password = password,
                               .user = user };
    struct redlockd *h;
    uint64_t t0;
    json_int_t voting = -1;

    h_cluster_daemon_start(&K, 0, extra_json);
    snprintf(tcp_addr, sizeof(tcp_addr), "127.0.0.1:%d", D->port);
    o.server = tcp_addr;
    h = open_opts(&o);
    t0 = h_now_ms();
    while (h_since(t0) < h_scale(5000)) {
        json_t *o = stats(h);

        voting = h_json_int(o, "nodes_voting");
        json_decref(o);
        if (voting == K.nnodes)
            break;
        h_sleep_ms(20);
    }
    close_handle(h);
    if (voting != K.nnodes)
        h_daemon_dump_log(D);
    ck_assert_msg(voting == K.nnodes, "only %lld of %d nodes voting after start",
                  (long long)voting, K.nnodes);
}

static void start_daemon_auth(const char *extra_json, const char *password)
{
    start_daemon_login(extra_json, NULL, password);
}

static void start_daemon(const char *extra_json)
{
    start_daemon_auth(extra_json, NULL);
}

/*
 * A failed call: it returned -want, the handle's last error says want
 * with a message, and the code has a description and a name.
 */
static void assert_code(struct redlockd *h, int rc, int want, const char *what)
{
    const struct redlockd_error *e = redlockd_last_error(h);

    ck_assert_msg(rc == -want, "%s returned %d (%s: %s), want -%d (%s)", what, rc,
                  redlockd_code_name(rc), e->msg, want, redlockd_code_name(want));
    ck_assert_msg(e->code == want, "%s: last error code %d, want %d", what, e->code,
                  want);
    ck_assert_msg(e->msg[0] != '\0', "%s: empty error message", what);
    ck_assert_msg(redlockd_strerror(rc)[0] != '\0', "%s: empty strerror", what);
}

/* The connection survived an error the daemon answered with. */
static void assert_usable(struct redlockd *h, const char *after)
{
    int rc = redlockd_ping(h);

    ck_assert_msg(rc == 0, "ping after %s: %d %s", after, rc,
                  redlockd_last_error(h)->msg);
    ck_assert_int_eq(redlockd_last_error(h)->code, 0);
}

/* GET lock:<res> on node i: malloc'd value, or NULL when there is none. */
static char *key_get(int i, const char *res)
{
    char *s = NULL;
    long long v = h_redis_cmd(&R[i], &s, "GET lock:%s", res);

    ck_assert_msg(v != -3, "GET lock:%s on node %d failed", res, i);
    if (v == -2) {
        free(s);
        return NULL;
    }
    return s;
}

static long long key_pttl(int i, const char *res)
{
    long long v = h_redis_cmd(&R[i], NULL, "PTTL lock:%s", res);

    ck_assert_msg(v != -3, "PTTL lock:%s on node %d failed", res, i);
    return v;
}

/* Every node holds `token` under lock:<res> (NULL: no key anywhere). */
static void assert_keys(const char *res, const char *token)
{
    for (int i = 0; i < K.nnodes; i++) {
        char *v = key_get(i, res);
        bool ok = !token ? !v : h_holds_token(v, token);

        ck_assert_msg(ok, "node %d: lock:%s is %s, want %s", i, res,
                      v ? v : "(no key)", token ? token : "(no key)");
        free(v);
    }
}

/* After an ADOPT: how many nodes hold `token` under lock:<res>. ADOPT
 * asks the voting nodes only, so one that was still being checked (a
 * daemon just restarted) keeps the old token until its ttl. */
static int nodes_holding(const char *res, const char *token)
{
    int n = 0;

    for (int i = 0; i < K.nnodes; i++) {
        char *v = key_get(i, res);
        n += v && h_holds_token(v, token);
        free(v);
    }
    return n;
}

static void check_lease(const struct redlockd_lease *l, const char *res,
                        uint32_t ttl)
{
    ck_assert_str_eq(l->resource, res);
    ck_assert_msg(strlen(l->token) == REDLOCKD_TOKEN_LEN, "token \"%s\"", l->token);
    for (const char *t = l->token; *t != '\0'; t++)
        ck_assert_msg(isxdigit((unsigned char)*t), "token \"%s\" not hex", l->token);
    ck_assert_msg(l->fence > 0, "fence 0");
    ck_assert_uint_eq(l->ttl, ttl);
    ck_assert_msg(l->validity > 0 && l->validity <= ttl, "validity %" PRId64
                  " for ttl %u", l->validity, ttl);
}

/* "node 0: <value> pttl <ms>, ..." of lock:<res>, for failure messages
 * (static buffer). */
static const char *describe_keys(const char *res)
{
    static char out[1024];
    size_t len = 0;

    out[0] = '\0';
    for (int i = 0; i < K.nnodes && len < sizeof(out); i++) {
        char *v = key_get(i, res);

        len += (size_t)snprintf(out + len, sizeof(out) - len,
                                "%snode %d: %s pttl %lld", i > 0 ? ", " : "", i,
                                v ? v : "(no key)", key_pttl(i, res));
        free(v);
    }
    return out;
}

static void lock_ok(struct redlockd *h, const char *res, uint32_t ttl,
                    int renew, struct redlockd_lease *l)
{
    int rc = redlockd_lock(h, res, ttl, 0, renew, l);

    ck_assert_msg(rc == 0, "lock %s: %d %s (keys: %s)", res, rc,
                  redlockd_last_error(h)->msg, describe_keys(res));
}

/* What an on_lost callback was told. */
struct lost_log {
    struct redlockd *h;         /* to try a request from inside */
    int calls;
    int null_calls;             /* resource NULL: the connection is gone */
    char resource[64];
    uint64_t fence;
    char reason[32];
    int request_rc;             /* what a request from inside returned */
};

static void on_lost(const char *resource, uint64_t fence, const char *reason,
                    void *ud)
{
    struct lost_log *l = ud;

    if (!resource) {
        l->null_calls++;
        snprintf(l->reason, sizeof(l->reason), "%s", reason);
        return;
    }
    l->calls++;
    snprintf(l->resource, sizeof(l->resource), "%s", resource);
    snprintf(l->reason, sizeof(l->reason), "%s", reason);
    l->fence = fence;
    if (l->h)
        l->request_rc = redlockd_ping(l->h);
}

static struct redlockd *open_logged(const char *name, struct lost_log *log)
{
    struct redlockd_opts o = { .server = tcp_addr, .name = name,
                               .on_lost = on_lost, .ud = log };

    memset(log, 0, sizeof(*log));
    log->h = open_opts(&o);
    return log->h;
}

/* ---- connect, lock, extend, unlock, inspect ---- */

START_TEST(lock_extend_unlock)
{
    struct redlockd_lease l, l2;
    const struct redlockd_info *info;
    struct redlockd *h, *u;
    char *text = NULL, unix_addr[400];
    int64_t validity = 0;
    json_t *o, *v, *s;
    size_t i;
    bool found = false;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h = open_at(tcp_addr, "lib-basic");
    info = redlockd_info(h);
    ck_assert_msg(info->session[0] != '\0', "no session id");
    ck_assert_msg(h_starts(info->server, "redlockd/"), "server \"%s\"", info->server);
    ck_assert_uint_eq(info->nodes, 3);
    ck_assert_uint_eq(info->quorum, 2);
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_int_ge(redlockd_fd(h), 0);

    lock_ok(h, "lib:a", 10000, 0, &l);
    check_lease(&l, "lib:a", 10000);
    ck_assert_int_eq(redlockd_last_error(h)->code, 0);
    ck_assert_int_eq(redlockd_lost(h, "lib:a"), 0);
    assert_keys("lib:a", l.token);
    for (int i = 0; i < K.nnodes; i++) {
        long long pttl = key_pttl(i, "lib:a");

        ck_assert_msg(pttl > 5000 && pttl <= 10000, "node %d: PTTL %lld after "
                      "lock ttl=10000", i, pttl);
    }

    ck_assert_int_eq(redlockd_extend(h, "lib:a", 60000, &validity), 0);
    ck_assert_msg(validity > 0 && validity <= 60000, "extend validity %" PRId64,
                  validity);
    for (int i = 0; i < K.nnodes; i++) {
        long long pttl = key_pttl(i, "lib:a");

        ck_assert_msg(pttl > 50000 && pttl <= 60000, "node %d: PTTL %lld after "
                      "extend ttl=60000", i, pttl);
    }
    ck_assert_int_eq(redlockd_extend(h, "lib:a", 20000, NULL), 0);
    for (int i = 0; i < K.nnodes; i++) {
        long long pttl = key_pttl(i, "lib:a");

        ck_assert_msg(pttl > 10000 && pttl <= 20000, "node %d: PTTL %lld after "
                      "extend ttl=20000", i, pttl);
    }

    o = parse(redlockd_locks(h, &text), &text, h, "redlockd_locks");
    v = json_array_get(json_object_get(o, "locks"), 0);
    ck_assert_int_eq(json_array_size(json_object_get(o, "locks")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(v, "resource")), "lib:a");
    ck_assert_int_eq(h_json_int(v, "ttl"), 20000);
    ck_assert_int_eq(h_json_int(v, "fence"), (json_int_t)l.fence);
    json_decref(o);

    text = NULL;
    o = parse(redlockd_status(h, "lib:a", &text), &text, h, "redlockd_status");
    ck_assert(json_is_true(json_object_get(o, "held")));
    v = json_object_get(o, "holder");
    ck_assert_str_eq(json_string_value(json_object_get(v, "session")), info->session);
    ck_assert_str_eq(json_string_value(json_object_get(v, "name")), "lib-basic");
    ck_assert_int_eq(json_array_size(json_object_get(o, "nodes")), 3);
    json_decref(o);

    text = NULL;
    o = parse(redlockd_sessions(h, &text), &text, h, "redlockd_sessions");
    json_array_foreach(json_object_get(o, "sessions"), i, s) {
        v = json_object_get(s, "id");
        if (json_is_string(v) && strcmp(json_string_value(v), info->session) == 0)
            found = true;
    }
    ck_assert_msg(found, "SESSIONS lacks our session %s", info->session);
    json_decref(o);

    o = stats(h);
    ck_assert_int_eq(h_json_int(o, "locks_held"), 1);
    json_decref(o);

    ck_assert_int_eq(redlockd_unlock(h, "lib:a"), 0);
    assert_keys("lib:a", NULL);

    /* The other spellings of an address, and the unix socket: the same
     * daemon, the same fences. */
    snprintf(unix_addr, sizeof(unix_addr), "unix:%s", D->sock_path);
    u = open_at(unix_addr, "lib-unix");
    lock_ok(u, "lib:a", 0, 1, &l2);
    /* ttl 0: the daemon's default (30000). */
    check_lease(&l2, "lib:a", 30000);
    ck_assert_msg(l2.fence > l.fence, "fence %" PRIu64 " after %" PRIu64, l2.fence,
                  l.fence);
    assert_keys("lib:a", l2.token);
    ck_assert_int_eq(redlockd_unlock(u, "lib:a"), 0);
    close_handle(u);
    u = open_at(D->sock_path, "lib-path");
    ck_assert_int_eq(redlockd_ping(u), 0);
    close_handle(u);
    snprintf(unix_addr, sizeof(unix_addr), "tcp://127.0.0.1:%d", D->port);
    u = open_at(unix_addr, "lib-tcp-url");
    lock_ok(u, "lib:a", 5000, 0, &l);
    ck_assert_int_eq(redlockd_unlock(u, "lib:a"), 0);
    close_handle(u);
    /* redlockd_close sent QUIT: nothing of them is left. */
    assert_keys("lib:a", NULL);
}
END_TEST

/* ---- the errors the daemon answers ---- */

START_TEST(daemon_errors)
{
    struct redlockd *a, *b;
    struct redlockd_lease l;
    char longname[REDLOCKD_RESOURCE_MAX + 2];
    uint64_t t0;
    long long took;
    int rc;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon("{\"limits\":{\"max_locks_per_session\":1}}");
    a = open_at(tcp_addr, "lib-a");
    b = open_at(tcp_addr, "lib-b");
    lock_ok(a, "lib:e", 30000, 1, &l);

    assert_code(b, redlockd_lock(b, "lib:e", 30000, 0, 1, NULL), REDLOCKD_E_BUSY,
                "lock of a held resource");
    assert_usable(b, "BUSY");

    t0 = h_now_ms();
    rc = redlockd_lock(b, "lib:e", 30000, 300, 1, NULL);
    took = h_since(t0);
    assert_code(b, rc, REDLOCKD_E_TIMEOUT, "lock wait=300 of a held resource");
    ck_assert_msg(took >= 280 && took < h_scale(3000), "TIMEOUT after %lld ms", took);
    assert_usable(b, "TIMEOUT");

    assert_code(a, redlockd_lock(a, "lib:e", 30000, 0, 1, NULL), REDLOCKD_E_HELD,
                "second lock by the holder");
    assert_usable(a, "HELD");

    assert_code(b, redlockd_unlock(b, "lib:e"), REDLOCKD_E_NOTHELD,
                "unlock by another session");
    assert_code(b, redlockd_extend(b, "lib:e", 30000, NULL), REDLOCKD_E_NOTHELD,
                "extend by another session");
    assert_code(a, redlockd_unlock(a, "lib:none"), REDLOCKD_E_NOTHELD,
                "unlock of a resource nobody holds");
    assert_usable(b, "NOTHELD");

    assert_code(b, redlockd_lock(b, "lib:arg", 1, 0, 1, NULL), REDLOCKD_E_ARG,
                "lock ttl=1");
    assert_code(a, redlockd_extend(a, "lib:e", 1, NULL), REDLOCKD_E_ARG,
                "extend ttl=1");
    assert_usable(b, "ARG");

    /* max_locks_per_session is 1 and a holds lib:e. */
    assert_code(a, redlockd_lock(a, "lib:f", 30000, 0, 1, NULL), REDLOCKD_E_LIMIT,
                "a second lock over max_locks_per_session 1");
    assert_usable(a, "LIMIT");

    /* Refused by the library itself, nothing sent. */
    assert_code(a, redlockd_lock(a, "two words", 30000, 0, 1, NULL),
                REDLOCKD_E_INVALID, "lock of a resource with a space");
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_code(a, redlockd_lock(a, longname, 30000, 0, 1, NULL), REDLOCKD_E_INVALID,
                "lock of a resource over REDLOCKD_RESOURCE_MAX");
    assert_usable(a, "INVALID");

    /* a still holds its lock through all of that. */
    ck_assert_int_eq(redlockd_unlock(a, "lib:e"), 0);
    lock_ok(b, "lib:e", 30000, 1, &l);
    ck_assert_int_eq(redlockd_unlock(b, "lib:e"), 0);
}
END_TEST

START_TEST(auth_errors)
{
    struct redlockd_opts o = { .name = "lib-auth" };
    struct redlockd_error err;
    struct redlockd *h = (struct redlockd *)&err;    /* must become NULL */
    int rc;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth("{\"auth\":{\"password\":\"s3cret-pw\"}}", "s3cret-pw");
    o.server = tcp_addr;

    o.password = "wrong-pw";
    memset(&err, 0, sizeof(err));
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_AUTH, "connect with a wrong password: %d %s", rc,
                  err.msg);
    ck_assert_int_eq(err.code, REDLOCKD_E_AUTH);
    ck_assert_msg(err.msg[0] != '\0', "AUTH error without a message");
    ck_assert_ptr_null(h);

    /* Without a password the session opens (HELLO and PING are allowed)
     * but takes no locks. */
    o.password = NULL;
    h = open_opts(&o);
    ck_assert_int_eq(redlockd_ping(h), 0);
    assert_code(h, redlockd_lock(h, "lib:auth", 30000, 0, 1, NULL),
                REDLOCKD_E_NOAUTH, "lock without AUTH");
    assert_usable(h, "NOAUTH");

    o.password = "s3cret-pw";
    h = open_opts(&o);
    ck_assert_int_eq(redlockd_lock(h, "lib:auth", 30000, 0, 1, NULL), 0);
    ck_assert_int_eq(redlockd_unlock(h, "lib:auth"), 0);
}
END_TEST

/* auth.users: opts.user logs in as a user, whose prefixes bound what it
 * may touch (REDLOCKD_E_DENIED); a wrong name is a wrong password. */
START_TEST(user_prefixes)
{
    struct redlockd_opts o = { .name = "lib-user", .user = "alice",
                               .password = "lib-alice-pw" };
    struct redlockd_error err;
    struct redlockd *h;
    char *json = NULL;
    int rc;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_login("{\"auth\":{\"users\":["
                       "{\"name\":\"alice\",\"password\":\"lib-alice-pw\","
                       "\"prefixes\":[\"lib:a:\"]},"
                       "{\"name\":\"ops\",\"password\":\"lib-ops-pw\","
                       "\"prefixes\":[\"\"],\"admin\":true}]}}",
                       "ops", "lib-ops-pw");
    o.server = tcp_addr;
    h = open_opts(&o);
    ck_assert_int_eq(redlockd_lock(h, "lib:a:1", 30000, 0, 1, NULL), 0);
    assert_code(h, redlockd_lock(h, "lib:b:1", 30000, 0, 1, NULL),
                REDLOCKD_E_DENIED, "lock outside the prefixes");
    assert_usable(h, "DENIED");
    assert_code(h, redlockd_status(h, "lib:b:1", &json), REDLOCKD_E_DENIED,
                "status outside the prefixes");
    free(json);
    assert_code(h, redlockd_force_unlock(h, "lib:a:1"), REDLOCKD_E_DENIED,
                "force_unlock by a user that is no admin");
    ck_assert_str_eq(redlockd_code_name(REDLOCKD_E_DENIED), "DENIED");
    ck_assert_int_eq(redlockd_unlock(h, "lib:a:1"), 0);

    /* A wrong name and a wrong password: the same AUTH refusal. */
    o.user = "nobody";
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_AUTH, "unknown user: %d %s", rc, err.msg);
    o.user = "alice";
    o.password = "wrong-pw";
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_AUTH, "wrong password: %d %s", rc,
                  err.msg);
    /* A user needs a password; a name is one word. */
    o.password = NULL;
    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_INVALID);
    o.password = "x";
    o.user = "a b";
    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_INVALID);
}
END_TEST

/* Deleted behind the daemon's back: EXTEND finds the lease gone. */
START_TEST(lost_on_extend)
{
    struct redlockd_lease l;
    struct redlockd *h;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h = open_at(tcp_addr, "lib-lost");
    lock_ok(h, "lib:gone", 30000, 0, &l);
    assert_keys("lib:gone", l.token);
    for (int i = 0; i < K.nnodes; i++)
        ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "DEL lock:lib:gone"), 1);

    assert_code(h, redlockd_extend(h, "lib:gone", 30000, NULL), REDLOCKD_E_LOST,
                "extend after the keys were deleted");
    ck_assert_int_eq(redlockd_lost(h, "lib:gone"), 1);
    ck_assert_int_eq(redlockd_lost(h, "lib:other"), 0);
    assert_usable(h, "LOST");
    /* The session no longer holds it. */
    assert_code(h, redlockd_unlock(h, "lib:gone"), REDLOCKD_E_NOTHELD,
                "unlock after ERR LOST");
    ck_assert_int_eq(redlockd_lost(h, "lib:gone"), 1);
}
END_TEST

/*
 * After ERR LOST nobody holds the resource (no key on any node, and the
 * session was told it lost it), so taking it again must work, and clears
 * the lost mark. Repeated because a wrong answer here has shown up as a
 * race: the daemon's own clean-up of the lost lease still in flight.
 */
START_TEST(relock_after_lost)
{
    struct redlockd_lease l;
    struct redlockd *h;
    char res[32];
    int rc, busy = 0, first_busy = -1;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h = open_at(tcp_addr, "lib-relock");
    for (int round = 0; round < 20; round++) {
        snprintf(res, sizeof(res), "lib:re%d", round);
        lock_ok(h, res, 30000, 0, &l);
        for (int i = 0; i < K.nnodes; i++)
            ck_assert_int_eq(h_redis_cmd(&R[i], NULL, "DEL lock:%s", res), 1);
        assert_code(h, redlockd_extend(h, res, 30000, NULL), REDLOCKD_E_LOST,
                    "extend after the keys were deleted");
        ck_assert_int_eq(redlockd_lost(h, res), 1);
        rc = redlockd_lock(h, res, 30000, 0, 0, &l);
        if (rc == -REDLOCKD_E_BUSY) {
            busy++;
            if (first_busy < 0)
                first_busy = round;
            continue;
        }
        ck_assert_msg(rc == 0, "lock %s after ERR LOST: %d %s (keys: %s)", res, rc,
                      redlockd_last_error(h)->msg, describe_keys(res));
        ck_assert_int_eq(redlockd_lost(h, res), 0);
        ck_assert_int_eq(redlockd_unlock(h, res), 0);
    }
    ck_assert_msg(busy == 0, "lock right after ERR LOST answered BUSY (\"held by "
                  "someone else\") in %d of 20 rounds, first in round %d, though "
                  "no node had the key", busy, first_busy);
}
END_TEST

START_TEST(unavailable)
{
    struct redlockd *h;
    uint64_t t0;
    long long took;
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    h = open_at(tcp_addr, "lib-unavail");
    h_redis_pause(&R[0]);
    h_redis_pause(&R[1]);
    t0 = h_now_ms();
    rc = redlockd_lock(h, "lib:quorum", 30000, 0, 1, NULL);
    took = h_since(t0);
    assert_code(h, rc, REDLOCKD_E_UNAVAILABLE, "lock with two of three nodes stopped");
    ck_assert_msg(took < h_scale(3000), "UNAVAILABLE took %lld ms", took);
    assert_usable(h, "UNAVAILABLE");
    h_redis_resume(&R[0]);
    h_redis_resume(&R[1]);
}
END_TEST

/* A line over limits.max_line: the daemon answers TOOLONG and hangs up. A
 * handle that does not reconnect stays closed. */
START_TEST(toolong_closes)
{
    struct redlockd_opts o = { .name = "lib-long", .reconnect_max_ms = -1 };
    struct redlockd *h;
    char res[101];

    h_cluster_nodes(&K, 1, NULL);
    start_daemon("{\"limits\":{\"max_line\":64}}");
    o.server = tcp_addr;
    h = open_opts(&o);
    memset(res, 'r', sizeof(res) - 1);
    res[sizeof(res) - 1] = '\0';
    assert_code(h, redlockd_lock(h, res, 30000, 0, 1, NULL), REDLOCKD_E_TOOLONG,
                "lock with a 100-byte name over max_line 64");
    ck_assert_int_eq(redlockd_fd(h), -1);
    assert_code(h, redlockd_ping(h), REDLOCKD_E_CLOSED, "ping after TOOLONG");
}
END_TEST

/* ---- the errors the library finds ---- */

START_TEST(transport_errors)
{
    struct redlockd_opts o = { .name = "lib-io" };
    struct redlockd_error err;
    struct redlockd *h = (struct redlockd *)&err;    /* must become NULL */
    char addr[64];
    uint64_t t0;
    long long took;
    int rc, port, fd;

    /* Refused: a transport error. */
    fd = h_refusing_port(&port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    o.server = addr;
    memset(&err, 0, sizeof(err));
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_IO, "connect to a closed port: %d (%s) %s", rc,
                  redlockd_code_name(rc), err.msg);
    ck_assert_int_eq(err.code, REDLOCKD_E_IO);
    ck_assert_msg(err.msg[0] != '\0', "no message for a refused connection");
    ck_assert_ptr_null(h);
    close(fd);
    /* Transport codes sit apart from everything the daemon can answer. */
    ck_assert_int_gt(REDLOCKD_E_IO, REDLOCKD_E_OTHER);

    o.server = "unix:/nonexistent/redlockd-test.sock";
    h = (struct redlockd *)&err;
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_IO, "connect to a missing unix socket: %d %s",
                  rc, err.msg);
    ck_assert_ptr_null(h);

    o.server = "127.0.0.1:notaport";
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_INVALID, "connect to a bad address: %d %s", rc,
                  err.msg);

    /* A daemon that stopped answering (SIGSTOP: its socket still accepts):
     * the I/O timeout fires, on a request and on a connect. The handle
     * does not reconnect, so it stays closed after. */
    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    o.server = tcp_addr;
    o.io_timeout_ms = 300;
    o.reconnect_max_ms = -1;
    h = open_opts(&o);
    ck_assert_int_eq(kill(D->pid, SIGSTOP), 0);
    t0 = h_now_ms();
    rc = redlockd_ping(h);
    took = h_since(t0);
    assert_code(h, rc, REDLOCKD_E_IO_TIMEOUT, "ping to a stopped daemon");
    ck_assert_msg(took >= 250 && took < 3000, "IO_TIMEOUT after %lld ms "
                  "(io_timeout_ms 300)", took);
    ck_assert_int_eq(redlockd_fd(h), -1);
    assert_code(h, redlockd_ping(h), REDLOCKD_E_CLOSED, "ping after IO_TIMEOUT");

    h = (struct redlockd *)&err;
    rc = redlockd_connect(&h, &o, &err);
    ck_assert_msg(rc == -REDLOCKD_E_IO_TIMEOUT, "connect to a stopped daemon: %d %s",
                  rc, err.msg);
    ck_assert_ptr_null(h);
    ck_assert_int_eq(kill(D->pid, SIGCONT), 0);

    h = open_at(tcp_addr, "lib-io-after");
    ck_assert_int_eq(redlockd_ping(h), 0);
}
END_TEST

/* The daemon shuts down under a held lock: EVENT SHUTDOWN, then CLOSED,
 * and for a handle that does not reconnect every lease counts as lost;
 * the key is left on the nodes to expire by its ttl. */
START_TEST(daemon_stop_closes)
{
    struct lost_log log;
    struct redlockd_opts o = { .name = "lib-closed", .on_lost = on_lost,
                               .ud = &log, .reconnect_max_ms = -1 };
    struct redlockd *h;
    struct redlockd_lease l;
    uint64_t t0;
    int rc, stop_rc;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    memset(&log, 0, sizeof(log));
    o.server = tcp_addr;
    h = log.h = open_opts(&o);
    lock_ok(h, "lib:closed", 30000, 1, &l);

    stop_rc = h_daemon_stop(D);
    ck_assert_msg(stop_rc == 0, "redlockd exited with status %d on SIGTERM", stop_rc);
    /* Left on the nodes to expire, not deleted under its holder. */
    assert_keys("lib:closed", l.token);

    /* Read what the daemon sent without sending anything ourselves. */
    t0 = h_now_ms();
    while ((rc = redlockd_poll_events(h, 200)) >= 0)
        ck_assert_msg(h_since(t0) < h_scale(5000), "no EOF from a stopped daemon");
    assert_code(h, rc, REDLOCKD_E_CLOSED, "poll_events after the daemon stopped");
    ck_assert_int_eq(redlockd_shutting_down(h), 1);
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_lost(h, "lib:closed"), 1);
    ck_assert_int_eq(log.null_calls, 1);
    ck_assert_str_eq(log.reason, "disconnected");
    ck_assert_int_eq(log.calls, 0);

    assert_code(h, redlockd_ping(h), REDLOCKD_E_CLOSED, "ping after the daemon stopped");
    assert_code(h, redlockd_lock(h, "lib:x", 30000, 0, 1, NULL), REDLOCKD_E_CLOSED,
                "lock after the daemon stopped");
    ck_assert_int_eq(log.null_calls, 1);
}
END_TEST

/* ---- EVENT LOST ---- */

static void assert_lost_log(const struct lost_log *log, const char *res,
                            const struct redlockd_lease *l)
{
    ck_assert_msg(log->calls == 1, "on_lost called %d times for %s", log->calls, res);
    ck_assert_str_eq(log->resource, res);
    ck_assert_msg(log->fence == l->fence, "on_lost fence %" PRIu64 ", lease fence %"
                  PRIu64, log->fence, l->fence);
    ck_assert_msg(strcmp(log->reason, "expired") == 0 ||
                  strcmp(log->reason, "quorum") == 0 ||
                  strcmp(log->reason, "node") == 0,
                  "on_lost reason \"%s\"", log->reason);
    ck_assert_msg(log->request_rc == -REDLOCKD_E_INVALID,
                  "a request from inside on_lost returned %d, want -INVALID",
                  log->request_rc);
    ck_assert_int_eq(log->null_calls, 0);
}

/*
 * Two renewed leases of ttl 1500 on two handles; then two of three nodes
 * stop, so no renewal can reach a quorum. One handle learns of the loss
 * through redlockd_poll_events() while idle, the other through the
 * replies to its pings.
 */
START_TEST(event_lost)
{
    struct lost_log log1, log2;
    struct redlockd *h1, *h2;
    struct redlockd_lease l1, l2;
    uint64_t t0;
    long long took;
    int polled = 0, rc;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    h1 = open_logged("lib-poll", &log1);
    h2 = open_logged("lib-ping", &log2);
    lock_ok(h1, "lib:l1", 1500, 1, &l1);
    lock_ok(h2, "lib:l2", 1500, 1, &l2);
    /* Renewal keeps them past their ttl while the nodes run. */
    h_sleep_ms(2000);
    ck_assert_int_eq(redlockd_poll_events(h1, 0), 0);
    ck_assert_int_eq(redlockd_ping(h2), 0);
    ck_assert_int_eq(redlockd_lost(h1, "lib:l1") + redlockd_lost(h2, "lib:l2"), 0);

    h_redis_pause(&R[1]);
    h_redis_pause(&R[2]);
    t0 = h_now_ms();
    while (!redlockd_lost(h1, "lib:l1") || !redlockd_lost(h2, "lib:l2")) {
        ck_assert_msg(h_since(t0) < h_scale(8000),
                      "no EVENT LOST within 8 s (handle 1: %d, handle 2: %d)",
                      redlockd_lost(h1, "lib:l1"), redlockd_lost(h2, "lib:l2"));
        if (!redlockd_lost(h1, "lib:l1")) {
            rc = redlockd_poll_events(h1, 50);
            ck_assert_msg(rc >= 0, "poll_events: %d %s", rc,
                          redlockd_last_error(h1)->msg);
            polled += rc;
        }
        if (!redlockd_lost(h2, "lib:l2")) {
            rc = redlockd_ping(h2);
            ck_assert_msg(rc == 0, "ping: %d %s", rc, redlockd_last_error(h2)->msg);
            h_sleep_ms(20);
        }
    }
    took = h_since(t0);
    fprintf(stderr, "event_lost: both leases reported lost %lld ms after the "
            "pause\n", took);
    ck_assert_msg(polled >= 1, "poll_events reported no event");
    assert_lost_log(&log1, "lib:l1", &l1);
    assert_lost_log(&log2, "lib:l2", &l2);
    /* Each handle knows only its own leases. */
    ck_assert_int_eq(redlockd_lost(h1, "lib:l2"), 0);
    ck_assert_int_eq(redlockd_lost(h2, "lib:l1"), 0);
    /* The connections live on. */
    assert_usable(h1, "EVENT LOST");
    ck_assert_int_ne(redlockd_fd(h1), -1);

    h_redis_resume(&R[1]);
    h_redis_resume(&R[2]);
    /* The session no longer holds it; the mark stays until it is retaken. */
    rc = redlockd_unlock(h1, "lib:l1");
    ck_assert_msg(rc == -REDLOCKD_E_LOST || rc == -REDLOCKD_E_NOTHELD,
                  "unlock after EVENT LOST: %d %s", rc, redlockd_last_error(h1)->msg);
    ck_assert_int_eq(redlockd_lost(h1, "lib:l1"), 1);
    t0 = h_now_ms();
    while ((rc = redlockd_lock(h1, "lib:l1", 1500, 0, 1, &l1)) != 0) {
        ck_assert_msg(rc == -REDLOCKD_E_UNAVAILABLE || rc == -REDLOCKD_E_BUSY,
                      "lock after the nodes resumed: %d %s", rc,
                      redlockd_last_error(h1)->msg);
        ck_assert_msg(h_since(t0) < h_scale(5000), "lock still failing 5 s after the "
                      "nodes resumed: %s", redlockd_last_error(h1)->msg);
        h_sleep_ms(50);
    }
    ck_assert_int_eq(redlockd_lost(h1, "lib:l1"), 0);
    ck_assert_int_eq(redlockd_unlock(h1, "lib:l1"), 0);
}
END_TEST

/* ---- lease deadlines ---- */

/* CLOCK_MONOTONIC ms, the clock of redlockd_lease_deadline(). */
static int64_t mono_ms(void)
{
    return (int64_t)h_now_ms();
}

static int64_t deadline_of(struct redlockd *h, const char *res)
{
    int64_t d = 0;
    int rc = redlockd_lease_deadline(h, res, &d);

    ck_assert_msg(rc == 0, "lease_deadline %s: %d (%s)", res, rc, redlockd_code_name(rc));
    return d;
}

/*
 * Safety issue 6, the library's part. A lease's deadline is the send time of
 * its last confirmation plus the validity reported: refreshes move it on
 * while the daemon renews; once the daemon is stopped, a refresh waits no
 * longer than the deadline, and lease_check says LOST from the deadline on.
 */
START_TEST(lease_deadline)
{
    struct redlockd_opts o = { .name = "lib-deadline", .io_timeout_ms = 5000 };
    struct redlockd *h, *h2;
    struct redlockd_lease l, l2;
    int64_t before, d, prev, d2, now;
    int rc;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    o.server = tcp_addr;
    h = open_opts(&o);
    h2 = open_opts(&o);
    ck_assert_int_eq(redlockd_lease_check(h, "lib:dl"), -REDLOCKD_E_NOTHELD);

    before = mono_ms();
    lock_ok(h, "lib:dl", 1500, 1, &l);
    d = deadline_of(h, "lib:dl");
    ck_assert_msg(d >= before + l.validity && d <= mono_ms() + l.validity,
                  "deadline %lld ms ahead after LOCK, validity %" PRId64,
                  (long long)(d - mono_ms()), l.validity);
    ck_assert_int_eq(redlockd_lease_check(h, "lib:dl"), 0);
    /* The daemon renews every ttl/3; each refresh sees a newer renewal. */
    for (int i = 0; i < 4; i++) {
        prev = d;
        h_sleep_ms(600);
        rc = redlockd_refresh(h);
        ck_assert_msg(rc == 0, "refresh: %d %s", rc, redlockd_last_error(h)->msg);
        d = deadline_of(h, "lib:dl");
        now = mono_ms();
        ck_assert_msg(d > prev, "refresh %d: the deadline went from %lld to %lld", i,
                      (long long)prev, (long long)d);
        ck_assert_msg(d > now && d <= now + 1500, "refresh %d: deadline %lld ms ahead "
                      "for ttl 1500", i, (long long)(d - now));
        ck_assert_int_eq(redlockd_lease_check(h, "lib:dl"), 0);
    }
    /* A longer lease on the other handle, so its deadline comes later. */
    lock_ok(h2, "lib:dl2", 3000, 1, &l2);
    d2 = deadline_of(h2, "lib:dl2");
    ck_assert_int_eq(redlockd_refresh(h), 0);
    d = deadline_of(h, "lib:dl");
    ck_assert_msg(d < d2, "deadlines %lld and %lld", (long long)d, (long long)d2);

    ck_assert_int_eq(kill(D->pid, SIGSTOP), 0);
    ck_assert_int_eq(redlockd_lease_check(h, "lib:dl"), 0);
    /* No answer: the refresh gives up at the deadline, not the 5 s timeout. */
    rc = redlockd_refresh(h);
    now = mono_ms();
    fprintf(stderr, "lease_deadline: refresh to a stopped daemon returned %lld ms "
            "after the deadline\n", (long long)(now - d));
    assert_code(h, rc, REDLOCKD_E_IO_TIMEOUT, "refresh to a stopped daemon");
    ck_assert_msg(now >= d - 1 && now <= d + 100, "refresh returned %lld ms after "
                  "the deadline", (long long)(now - d));
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_lease_check(h, "lib:dl"), -REDLOCKD_E_LOST);
    ck_assert_int_eq(redlockd_lost(h, "lib:dl"), 1);

    /* The other handle asks nothing: its check turns at its deadline. */
    while ((rc = redlockd_lease_check(h2, "lib:dl2")) == 0) {
        ck_assert_msg(mono_ms() < d2 + 1, "check still 0 %lld ms after the deadline",
                      (long long)(mono_ms() - d2));
        h_sleep_ms(1);
    }
    now = mono_ms();
    ck_assert_int_eq(rc, -REDLOCKD_E_LOST);
    ck_assert_msg(now >= d2 && now <= d2 + 20, "check said LOST %lld ms after the "
                  "deadline", (long long)(now - d2));
    ck_assert_int_eq(redlockd_lease_deadline(h2, "lib:dl2", &d), 0);
    ck_assert(d == d2);
    /* What the daemon said is another matter: it said nothing. */
    ck_assert_int_eq(redlockd_lost(h2, "lib:dl2"), 0);
    ck_assert_int_eq(kill(D->pid, SIGCONT), 0);
}
END_TEST

/* ---- failover ---- */

/* A daemon that shuts down quickly when told to (a lease still held
 * delays its exit by shutdown_timeout_ms). */
#define FAILOVER_JSON "{\"shutdown_timeout_ms\":300}"

/* D (tcp_addr) and D2 (tcp_addr2) on the same nodes, every node voting
 * on both. */
static void start_two_daemons(void)
{
    start_daemon(FAILOVER_JSON);
    h_cluster_daemon(&K, 1, FAILOVER_JSON, h_scale(5000));
    snprintf(tcp_addr2, sizeof(tcp_addr2), "127.0.0.1:%d", D2->port);
}

/* A handle over both daemons, D first, logging on_lost into log. */
static struct redlockd *open_failover(const char *name, struct lost_log *log,
                                      struct redlockd_opts *o)
{
    static const char *servers[2];

    servers[0] = tcp_addr;
    servers[1] = tcp_addr2;
    memset(log, 0, sizeof(*log));
    o->servers = servers;
    o->nservers = 2;
    o->name = name;
    o->on_lost = on_lost;
    o->ud = log;
    log->h = open_opts(o);
    return log->h;
}

static void assert_busy(struct redlockd *other, const char *res,
                        const char *when)
{
    int rc = redlockd_lock(other, res, 30000, 0, 1, NULL);

    ck_assert_msg(rc == -REDLOCKD_E_BUSY, "another handle's LOCK %s %s: %d "
                  "(%s: %s), want BUSY", res, when, rc, redlockd_code_name(rc),
                  redlockd_last_error(other)->msg);
}

/* Has process pid exited (a zombie not yet reaped counts)? */
static bool exited(pid_t pid)
{
    char path[64], buf[512];
    const char *paren;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    f = fopen(path, "r");
    if (!f)
        return true;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    paren = strrchr(buf, ')');
    return paren && (paren[2] == 'Z' || paren[2] == 'X');
}

/* SIGTERM to d, asking `other` for res every 20 ms until d has exited:
 * it must be BUSY throughout. */
static void stop_watching(struct h_daemon *d, struct redlockd *other,
                          const char *res)
{
    uint64_t t0 = h_now_ms();
    int checks = 0;

    ck_assert_int_eq(kill(d->pid, SIGTERM), 0);
    while (!exited(d->pid)) {
        assert_busy(other, res, "while its holder's daemon stops");
        checks++;
        ck_assert_msg(h_since(t0) < h_scale(5000), "redlockd still running "
                      "5 s after SIGTERM");
        h_sleep_ms(20);
    }
    ck_assert_int_eq(h_daemon_wait(d, 5000), 0);
    fprintf(stderr, "failover: daemon stopped %lld ms after SIGTERM, %d BUSY "
            "checks meanwhile\n", h_since(t0), checks);
}

/* The lease came back: held, the same fence, a token other than `old`
 * (NULL: the same as before) that every node holds. */
static void assert_back(struct redlockd *h, const char *res,
                        const struct redlockd_lease *before, bool new_token)
{
    struct redlockd_lease now;
    int rc = redlockd_lease_info(h, res, &now);

    ck_assert_msg(rc == 0, "lease_info %s: %d", res, rc);
    ck_assert_int_eq(redlockd_lease_state(h, res), REDLOCKD_LEASE_HELD);
    ck_assert_int_eq(redlockd_lease_check(h, res), 0);
    ck_assert_int_eq(redlockd_lost(h, res), 0);
    ck_assert_msg(now.fence == before->fence, "%s: fence %" PRIu64 " after "
                  "failover, %" PRIu64 " before", res, now.fence, before->fence);
    if (new_token)
        ck_assert_msg(strcmp(now.token, before->token) != 0, "%s: the token "
                      "did not change (%s)", res, now.token);
    else
        ck_assert_str_eq(now.token, before->token);
    ck_assert_msg(nodes_holding(res, now.token) >= K.nnodes / 2 + 1, "%s: only %d "
                  "nodes hold the token %s", res, nodes_holding(res, now.token),
                  now.token);
}

/*
 * The handle's daemon is stopped (SIGTERM: it leaves the lease on the
 * nodes) and started again; the handle, asked nothing meanwhile, finds its
 * connection closed, its session unknown to the new process, and adopts
 * the lease there: the same fence, a new token, another handle BUSY all
 * along; then UNLOCK releases it for real.
 */
START_TEST(failover_restart)
{
    struct redlockd_opts o = { 0 };
    struct redlockd_lease l;
    struct lost_log log;
    struct redlockd *h, *other;
    char session[64];
    uint64_t t0;
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons();
    h = open_failover("fo-restart", &log, &o);
    other = open_at(tcp_addr2, "fo-other");
    lock_ok(h, "fo:r", 30000, 1, &l);
    snprintf(session, sizeof(session), "%s", redlockd_info(h)->session);
    assert_busy(other, "fo:r", "before the stop");

    stop_watching(D, other, "fo:r");
    assert_keys("fo:r", l.token);
    h_daemon_restart(D);
    assert_busy(other, "fo:r", "after the restart");

    t0 = h_now_ms();
    rc = redlockd_refresh(h);
    fprintf(stderr, "failover_restart: back in %lld ms on %s\n", h_since(t0),
            redlockd_server(h));
    ck_assert_msg(rc == 0, "refresh after the restart: %d %s", rc,
                  redlockd_last_error(h)->msg);
    ck_assert_str_eq(redlockd_server(h), tcp_addr);
    ck_assert_str_ne(redlockd_info(h)->session, session);
    assert_back(h, "fo:r", &l, true);
    ck_assert_int_eq(log.calls + log.null_calls, 0);
    assert_busy(other, "fo:r", "after the adopt");
    struct redlockd_lease fresh;
    ck_assert_int_eq(redlockd_lease_info(h, "fo:r", &fresh), 0);
    ck_assert_int_eq(redlockd_unlock(h, "fo:r"), 0);
    ck_assert_int_eq(redlockd_lease_state(h, "fo:r"), REDLOCKD_LEASE_NONE);
    ck_assert_int_eq(nodes_holding("fo:r", fresh.token), 0);
    /* A node not asked keeps the old token until its ttl: the lock is
     * free on a quorum. */
    ck_assert_int_le(nodes_holding("fo:r", l.token), K.nnodes - (K.nnodes / 2 + 1));
    lock_ok(other, "fo:r", 30000, 1, &l);
}
END_TEST

/*
 * The handle's daemon is killed (SIGKILL) and stays down: the handle
 * adopts every grant on the other daemon, one ADOPT per grant (the two
 * resources of one LOCK keep sharing one token), a shared hold and a
 * semaphore slot included.
 */
START_TEST(failover_kill)
{
    struct redlockd_opts o = { 0 };
    struct redlockd_lock_opts shared = { .mode = REDLOCKD_SHARED };
    struct redlockd_lock_opts sem = { .limit = 2 };
    const char *ab[] = { "fo:a", "fo:b" }, *sh[] = { "fo:sh" };
    const char *se[] = { "fo:se" };
    struct redlockd_lease l, la, lb, na, nb, ls, lse, now;
    struct redlockd_grant g;
    struct lost_log log;
    struct redlockd *h, *other;
    json_t *st;
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons();
    h = open_failover("fo-kill", &log, &o);
    other = open_at(tcp_addr2, "fo-other");
    lock_ok(h, "fo:k", 30000, 1, &l);
    ck_assert_int_eq(redlockd_lockv(h, ab, 2, NULL, &g), 0);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:a", &la), 0);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:b", &lb), 0);
    ck_assert_int_eq(redlockd_lockv(h, sh, 1, &shared, NULL), 0);
    ck_assert_int_eq(redlockd_lockv(h, se, 1, &sem, NULL), 0);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:sh", &ls), 0);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:se", &lse), 0);

    h_daemon_kill(D);
    assert_busy(other, "fo:k", "after its holder's daemon died");
    /* The first call after finds the connection closed before it sends
     * anything: a LOCK goes to the new session, not into the old one. */
    rc = redlockd_lock(h, "fo:new", 30000, 0, 1, NULL);
    ck_assert_msg(rc == 0, "lock after the kill: %d %s", rc,
                  redlockd_last_error(h)->msg);
    ck_assert_str_eq(redlockd_server(h), tcp_addr2);
    assert_back(h, "fo:k", &l, true);
    assert_back(h, "fo:a", &la, true);
    assert_back(h, "fo:b", &lb, true);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:a", &na), 0);
    ck_assert_int_eq(redlockd_lease_info(h, "fo:b", &nb), 0);
    ck_assert_str_eq(na.token, nb.token);
    /* The shared hold and the slot too: same fence, a new token. */
    ck_assert_int_eq(log.calls, 0);
    for (int i = 0; i < 2; i++) {
        const struct redlockd_lease *was = i ? &lse : &ls;
        ck_assert_int_eq(redlockd_lease_info(h, was->resource, &now), 0);
        ck_assert_int_eq(redlockd_lease_state(h, was->resource),
                         REDLOCKD_LEASE_HELD);
        ck_assert_uint_eq(now.fence, was->fence);
        ck_assert_str_ne(now.token, was->token);
    }
    assert_busy(other, "fo:sh", "after the adopt of its shared hold");
    st = stats(h);
    ck_assert_int_eq(h_json_int(st, "adopts"), 4);
    json_decref(st);
    assert_busy(other, "fo:k", "after the adopt");
    assert_busy(other, "fo:a", "after the adopt");
    ck_assert_int_eq(redlockd_unlock(h, "fo:k"), 0);
    ck_assert_int_eq(redlockd_unlock(h, "fo:new"), 0);
    ck_assert_int_eq(redlockd_unlockv(h, ab, 2), 0);
    ck_assert_int_eq(redlockd_unlock(h, "fo:sh"), 0);
    ck_assert_int_eq(redlockd_unlock(h, "fo:se"), 0);
    lock_ok(other, "fo:sh", 30000, 1, &l);
    lock_ok(other, "fo:k", 30000, 1, &l);
    lock_ok(other, "fo:b", 30000, 1, &l);
}
END_TEST

/*
 * A network blip: the handle's socket is shut down under it. The next
 * call resumes the same session on the same daemon: same id, same token,
 * nothing adopted, nothing lost; the daemon saw the session detach and
 * come back.
 */
START_TEST(failover_blip)
{
    struct redlockd_opts o = { 0 };
    struct redlockd_lease l;
    struct lost_log log;
    struct redlockd *h, *other;
    char session[64], *text = NULL;
    json_t *st, *s, *sessions;
    size_t i;
    int found = 0;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons();
    h = open_failover("fo-blip", &log, &o);
    other = open_at(tcp_addr, "fo-other");
    lock_ok(h, "fo:blip", 30000, 1, &l);
    snprintf(session, sizeof(session), "%s", redlockd_info(h)->session);

    ck_assert_int_eq(shutdown(redlockd_fd(h), SHUT_RDWR), 0);
    assert_busy(other, "fo:blip", "after the blip");
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_str_eq(redlockd_server(h), tcp_addr);
    ck_assert_str_eq(redlockd_info(h)->session, session);
    assert_back(h, "fo:blip", &l, false);
    ck_assert_int_eq(log.calls + log.null_calls, 0);
    st = stats(h);
    ck_assert_int_eq(h_json_int(st, "adopts"), 0);
    json_decref(st);
    /* One session of that id, attached again. */
    sessions = parse(redlockd_sessions(other, &text), &text, other, "sessions");
    json_array_foreach(json_object_get(sessions, "sessions"), i, s) {
        if (strcmp(h_json_str(s, "id"), session) == 0) {
            found++;
            ck_assert(json_is_true(json_object_get(s, "attached")));
        }
    }
    json_decref(sessions);
    ck_assert_int_eq(found, 1);
    /* On request: the same again. */
    ck_assert_int_eq(redlockd_reconnect(h), 0);
    ck_assert_str_eq(redlockd_info(h)->session, session);
    assert_back(h, "fo:blip", &l, false);
    /* Once more, with the unlock in the call that finds it broken. */
    ck_assert_int_eq(shutdown(redlockd_fd(h), SHUT_RDWR), 0);
    ck_assert_int_eq(redlockd_unlock(h, "fo:blip"), 0);
    ck_assert_str_eq(redlockd_info(h)->session, session);
    assert_keys("fo:blip", NULL);
    lock_ok(other, "fo:blip", 30000, 1, &l);
}
END_TEST

/*
 * The handle's daemon is SIGSTOPped and the handle asks nothing until its
 * lease's deadline has passed: the lease is lost ("deadline") and not
 * adopted, though the other daemon is there to take it; the handle itself
 * goes on there, and the resource is had by another once its keys expire.
 */
START_TEST(failover_deadline)
{
    struct redlockd_opts o = { .connect_timeout_ms = 300, .io_timeout_ms = 500 };
    struct redlockd_lease l;
    struct lost_log log;
    struct redlockd *h, *other;
    int64_t deadline;
    uint64_t t0;
    json_t *st;
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons();
    h = open_failover("fo-stall", &log, &o);
    other = open_at(tcp_addr2, "fo-other");
    lock_ok(h, "fo:stall", 1500, 1, &l);
    ck_assert_int_eq(redlockd_lease_deadline(h, "fo:stall", &deadline), 0);
    ck_assert_int_eq(kill(D->pid, SIGSTOP), 0);
    while (mono_ms() < deadline + 100)
        h_sleep_ms(10);
    ck_assert_int_eq(redlockd_lease_check(h, "fo:stall"), -REDLOCKD_E_LOST);

    /* The first call finds the connection dead; a later one (the stopped
     * daemon takes the first's time) is on the other daemon. */
    t0 = h_now_ms();
    while ((rc = redlockd_ping(h)) != 0)
        ck_assert_msg(h_since(t0) < h_scale(5000), "not reconnected: %d %s", rc,
                      redlockd_last_error(h)->msg);
    ck_assert_str_eq(redlockd_server(h), tcp_addr2);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.resource, "fo:stall");
    ck_assert_str_eq(log.reason, "deadline");
    ck_assert_int_eq(redlockd_lease_state(h, "fo:stall"), REDLOCKD_LEASE_LOST);
    ck_assert_int_eq(redlockd_lost(h, "fo:stall"), 1);
    st = stats(h);
    ck_assert_int_eq(h_json_int(st, "adopts"), 0);
    json_decref(st);
    t0 = h_now_ms();
    while ((rc = redlockd_lock(other, "fo:stall", 30000, 0, 1, NULL)) != 0) {
        ck_assert_msg(rc == -REDLOCKD_E_BUSY, "lock: %d", rc);
        ck_assert_msg(h_since(t0) < h_scale(3000), "still BUSY");
        h_sleep_ms(20);
    }
    ck_assert_int_eq(kill(D->pid, SIGCONT), 0);
}
END_TEST

/* ---- codes ---- */

/* redlockd_lockv / redlockd_unlockv: a mode, a limit, several resources. */
START_TEST(lock_kinds)
{
    struct redlockd *a, *b;
    struct redlockd_grant g, g2;
    struct redlockd_lock_opts shared = { .mode = REDLOCKD_SHARED };
    struct redlockd_lock_opts sem = { .limit = 2, .ttl_ms = 5000 };
    const char *doc[] = { "lk:doc" };
    const char *s[] = { "lk:sem" };
    const char *ab[] = { "lk:a", "lk:b" }, *ba[] = { "lk:b", "lk:a" };
    const char *twice[] = { "lk:a", "lk:a" };
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    a = open_at(tcp_addr, "kinds-a");
    b = open_at(tcp_addr, "kinds-b");

    ck_assert_int_eq(redlockd_lockv(a, doc, 1, &shared, &g), 0);
    ck_assert_int_eq(g.mode, REDLOCKD_SHARED);
    ck_assert_uint_eq(g.nresources, 1);
    ck_assert_str_eq(g.lease.resource, "lk:doc");
    ck_assert_int_eq(redlockd_lockv(b, doc, 1, &shared, &g2), 0);
    ck_assert_uint_gt(g2.lease.fence, g.lease.fence);
    rc = redlockd_lock(a, "lk:doc", 0, 0, 1, NULL);
    assert_code(a, rc, REDLOCKD_E_HELD, "a second LOCK of a shared hold");
    ck_assert_int_eq(redlockd_unlockv(a, doc, 1), 0);
    rc = redlockd_lockv(a, doc, 1, NULL, NULL);
    assert_code(a, rc, REDLOCKD_E_BUSY, "exclusive under a reader");
    ck_assert_int_eq(redlockd_unlock(b, "lk:doc"), 0);

    ck_assert_int_eq(redlockd_lockv(a, s, 1, &sem, &g), 0);
    ck_assert_uint_eq(g.limit, 2);
    ck_assert_int_eq(redlockd_lockv(b, s, 1, &sem, &g2), 0);
    ck_assert_uint_ne(g.slot, g2.slot);
    ck_assert_uint_lt(g.slot, 2);
    sem.limit = 3;
    rc = redlockd_lockv(b, doc, 1, &sem, NULL);
    ck_assert_int_eq(rc, 0);    /* another resource: any K */
    ck_assert_int_eq(redlockd_unlock(b, "lk:doc"), 0);
    rc = redlockd_lockv(a, s, 1, &sem, NULL);
    assert_code(a, rc, REDLOCKD_E_HELD, "a second slot");

    ck_assert_int_eq(redlockd_lockv(a, ab, 2, NULL, &g), 0);
    ck_assert_uint_eq(g.nresources, 2);
    ck_assert_str_eq(g.lease.resource, "lk:a");
    assert_keys("lk:b", g.lease.token);
    struct redlockd_lock_opts wait = { .wait_ms = 200 };
    rc = redlockd_lockv(b, ba, 2, &wait, NULL);
    assert_code(b, rc, REDLOCKD_E_TIMEOUT, "{b,a} while {a,b} is held");
    rc = redlockd_lockv(b, twice, 2, NULL, NULL);
    assert_code(b, rc, REDLOCKD_E_ARG, "a name twice");
    ck_assert_int_eq(redlockd_extend(a, "lk:b", 9000, NULL), 0);
    ck_assert_int_eq(redlockd_unlockv(a, ba, 2), 0);
    ck_assert_int_eq(redlockd_lockv(b, ba, 2, NULL, NULL), 0);
    rc = redlockd_unlockv(b, twice, 2);
    assert_code(b, rc, REDLOCKD_E_ARG, "UNLOCK of a name twice");
    rc = redlockd_lockv(b, ab, 0, NULL, NULL);
    assert_code(b, rc, REDLOCKD_E_INVALID, "no resource");
    assert_usable(b, "INVALID");
}
END_TEST

START_TEST(strerror_all_codes)
{
    static const char *const words[] = {
        [REDLOCKD_E_ARG] = "ARG", [REDLOCKD_E_UNKNOWN] = "UNKNOWN",
        [REDLOCKD_E_TOOLONG] = "TOOLONG", [REDLOCKD_E_NOAUTH] = "NOAUTH",
        [REDLOCKD_E_AUTH] = "AUTH", [REDLOCKD_E_BUSY] = "BUSY",
        [REDLOCKD_E_TIMEOUT] = "TIMEOUT", [REDLOCKD_E_HELD] = "HELD",
        [REDLOCKD_E_NOTHELD] = "NOTHELD", [REDLOCKD_E_LOST] = "LOST",
        [REDLOCKD_E_UNAVAILABLE] = "UNAVAILABLE", [REDLOCKD_E_LIMIT] = "LIMIT",
        [REDLOCKD_E_SHUTDOWN] = "SHUTDOWN",
    };

    for (int c = 0; c < REDLOCKD_CODE_COUNT; c++) {
        const char *s = redlockd_strerror(c), *n = redlockd_code_name(c);

        ck_assert_msg(s && s[0] != '\0', "strerror(%d) is empty", c);
        ck_assert_msg(redlockd_strerror(-c) == s ||
                      strcmp(redlockd_strerror(-c), s) == 0,
                      "strerror(%d) differs from strerror(%d)", -c, c);
        ck_assert_msg(n && n[0] != '\0' && strcmp(n, "?") != 0,
                      "code_name(%d) is \"%s\"", c, n ? n : "(null)");
        for (int d = 0; d < c; d++)
            ck_assert_msg(strcmp(redlockd_code_name(d), n) != 0,
                          "codes %d and %d are both named %s", d, c, n);
        if (c < (int)(sizeof(words) / sizeof(words[0])) && words[c])
            ck_assert_str_eq(n, words[c]);
    }
    ck_assert_str_eq(redlockd_code_name(REDLOCKD_OK), "OK");
    ck_assert_str_eq(redlockd_code_name(-REDLOCKD_E_BUSY), "BUSY");
    ck_assert_msg(redlockd_strerror(9999)[0] != '\0', "strerror(9999) is empty");
}
END_TEST

static Suite *lib_suite(void)
{
    Suite *s = suite_create("lib");
    TCase *tc = tcase_create("lib");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, lock_extend_unlock);
    tcase_add_test(tc, daemon_errors);
    tcase_add_test(tc, auth_errors);
    tcase_add_test(tc, user_prefixes);
    tcase_add_test(tc, lost_on_extend);
    tcase_add_test(tc, relock_after_lost);
    tcase_add_test(tc, unavailable);
    tcase_add_test(tc, toolong_closes);
    tcase_add_test(tc, transport_errors);
    tcase_add_test(tc, daemon_stop_closes);
    tcase_add_test(tc, event_lost);
    tcase_add_test(tc, lease_deadline);
    tcase_add_test(tc, strerror_all_codes);
    tcase_add_test(tc, lock_kinds);
    tcase_add_test(tc, failover_restart);
    tcase_add_test(tc, failover_kill);
    tcase_add_test(tc, failover_blip);
    tcase_add_test(tc, failover_deadline);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(lib_suite());
}
