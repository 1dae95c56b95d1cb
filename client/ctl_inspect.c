/*
 * redlockctl, the commands that ask the daemon and print what it says:
 * status and sessions (one JSON answer each, as a table or raw), ping
 * (PING for the round trip, then STATS for the quorum), stats (two STATS a
 * second apart: rates and quantiles), locks (every lease that SESSIONS
 * lists), watch (a line per EVENT HOLDER, through failovers) and leader
 * (STATUS's holder); and the operator's release --force (FORCEUNLOCK).
 */
#include <err.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include <jansson.h>

#include "ctl.h"
#include "keeper.h"

/* leader: the exit status when nobody leads (no exclusive holder with a
 * value). */
#define CTL_EXIT_NO_LEADER 1

/* ---- status and sessions ------------------------------------------------ */

static void ctl_print_holder(json_t *root)
{
    json_t *holder = json_object_get(root, "holder");
    json_t *name = json_object_get(holder, "name");
    json_t *daemon = json_object_get(holder, "daemon");
    json_t *value = json_object_get(holder, "value");
    char fence[32], held[32], session[64];

    if (!json_is_true(json_object_get(root, "held")))
        return;
    if (json_is_true(json_object_get(holder, "foreign"))) {
        printf("holder    another Redlock client (not a redlockd)\n");
        return;
    }
    if (!json_is_object(holder)) {
        printf("holder    unknown (no one token on a quorum of nodes)\n");
        return;
    }
    printf("holder    session %s",
           ctl_text(holder, "session", session, sizeof(session)));
    if (json_is_string(name))
        printf(" (%s)", json_string_value(name));
    if (json_is_string(daemon))
        printf(" on %s", json_string_value(daemon));
    if (ctl_field(holder, "fence", fence, sizeof(fence)))
        printf(", fence %s", fence);
    if (ctl_duration(json_object_get(holder, "held_ms"), held,
                     sizeof(held)))
        printf(", held for %s", held);
    if (json_is_string(value))
        printf(", value %s", json_string_value(value));
    putchar('\n');
}

static const char *ctl_pttl(json_t *v, char *buf, size_t sz)
{
    if (!json_is_integer(v))
        return NULL;
    if (json_integer_value(v) == -2)
        return "no key";
    if (json_integer_value(v) == -1)
        return "no expiry";
    snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " ms", json_integer_value(v));
    return buf;
}

/* This daemon's waiters, as STATUS lists them, in the order they are
 * served: "waiting   s9.x (report-3) for 2.1 s", the others under it. */
static void ctl_print_waiting(json_t *waiting)
{
    char who[256], waited[64];
    json_t *w;
    size_t i;

    json_array_foreach(waiting, i, w) {
        printf("%-10s%s", i ? "" : "waiting", ctl_session_name(w, who,
                                                               sizeof(who)));
        if (ctl_duration(json_object_get(w, "waited_ms"), waited,
                         sizeof(waited)))
            printf(" for %s", waited);
        putchar('\n');
    }
}

static void ctl_print_status(json_t *root)
{
    struct ctl_table t = { .ncols = 3, .right = 1u << 2 };
    char b1[64], b2[64];
    json_t *node;
    size_t i;

    printf("resource  %s\n", ctl_text(root, "resource", b1, sizeof(b1)));
    printf("key       %s\n", ctl_text(root, "key", b1, sizeof(b1)));
    printf("held      %s\n",
           json_is_true(json_object_get(root, "held")) ? "yes" : "no");
    ctl_print_holder(root);
    if (ctl_field(root, "waiters", b1, sizeof(b1)))
        printf("waiters   %s\n", b1);
    ctl_print_waiting(json_object_get(root, "waiting"));
    if (json_array_size(json_object_get(root, "nodes")) == 0)
        return;
    putchar('\n');
    ctl_table_add(&t, (const char *const[]){ "NODE", "UP", "PTTL" });
    json_array_foreach(json_object_get(root, "nodes"), i, node) {
        const char *row[3] = {
            ctl_field(node, "node", b1, sizeof(b1)),
            json_is_true(json_object_get(node, "up")) ? "yes" : "no",
            ctl_pttl(json_object_get(node, "pttl"), b2, sizeof(b2)),
        };
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

static void ctl_print_sessions(json_t *root)
{
    struct ctl_table t = { .ncols = 6,
                           .right = (1u << 3) | (1u << 4) | (1u << 5) };
    char b[6][64];
    json_t *s;
    size_t i;

    ctl_table_add(&t, (const char *const[]){ "ID", "NAME", "PEER", "LOCKS",
                                             "WAITS", "IDLE" });
    json_array_foreach(json_object_get(root, "sessions"), i, s) {
        const char *row[6] = {
            ctl_field(s, "id", b[0], sizeof(b[0])),
            ctl_field(s, "name", b[1], sizeof(b[1])),
            ctl_field(s, "peer", b[2], sizeof(b[2])),
            ctl_field(s, "locks", b[3], sizeof(b[3])),
            ctl_field(s, "waits", b[4], sizeof(b[4])),
            ctl_duration(json_object_get(s, "idle_ms"), b[5], sizeof(b[5])),
        };
        if (json_is_null(json_object_get(s, "name")))
            row[1] = "-";
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

/* ---- inspection commands ------------------------------------------------ */

static int ctl_show(struct ctl *c, const char *json, void (*print)(json_t *))
{
    json_t *root;

    if (c->json) {
        printf("%s\n", json);
        return 0;
    }
    root = ctl_parse_json(json);
    if (!root)
        return EX_UNAVAILABLE;
    print(root);
    json_decref(root);
    return 0;
}

static int ctl_fetch_status(struct redlockd *h, const char *resource,
                            char **json)
{
    return redlockd_status(h, resource, json);
}

static int ctl_fetch_sessions(struct redlockd *h, const char *resource,
                              char **json)
{
    (void)resource;
    return redlockd_sessions(h, json);
}

/* The commands that print one JSON answer of the daemon. */
static const struct ctl_inspector ctl_inspectors[] = {
    { "status", 1, ctl_fetch_status, ctl_print_status },
    { "sessions", 0, ctl_fetch_sessions, ctl_print_sessions },
};

const struct ctl_inspector *ctl_inspector_find(const char *cmd)
{
    size_t i;

    for (i = 0; i < sizeof(ctl_inspectors) / sizeof(ctl_inspectors[0]); i++) {
        if (strcmp(ctl_inspectors[i].cmd, cmd) == 0)
            return &ctl_inspectors[i];
    }
    return NULL;
}

int ctl_inspect(struct ctl *c, const struct ctl_inspector *in,
                const char *resource)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    char *json = NULL;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = in->fetch(h, resource, &json);
    if (rc < 0)
        rc = ctl_report(in->cmd, rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_show(c, json, in->print);
    free(json);
    redlockd_close(h);
    return rc;
}

/* ---- ping --------------------------------------------------------------- */

/* What STATS says of the Redis nodes: ping's quorum check. */
struct ctl_votes {
    json_int_t voting;
    json_int_t quorum;
};

static int ctl_read_votes(struct redlockd *h, struct ctl_votes *v)
{
    char *json = NULL;
    json_t *root, *voting, *quorum;
    int rc;

    rc = redlockd_stats(h, &json);
    if (rc < 0)
        return ctl_report("ping: STATS", rc, redlockd_last_error(h)->msg);
    root = ctl_parse_json(json);
    free(json);
    if (!root)
        return EX_UNAVAILABLE;
    voting = json_object_get(root, "nodes_voting");
    quorum = json_object_get(root, "quorum");
    rc = 0;
    if (!json_is_integer(voting) || !json_is_integer(quorum)) {
        warnx("ping: STATS has no nodes_voting and quorum");
        rc = EX_UNAVAILABLE;
    } else {
        v->voting = json_integer_value(voting);
        v->quorum = json_integer_value(quorum);
    }
    json_decref(root);
    return rc;
}

static void ctl_ping_json(const struct redlockd_info *info,
                          const struct ctl_votes *v, double rtt)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:f}",
                          "server", info->server, "session", info->session,
                          "nodes", (json_int_t)info->nodes,
                          "quorum", v->quorum, "nodes_voting", v->voting,
                          "quorum_ok", v->voting >= v->quorum, "rtt_ms", rtt);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* PING for the round trip, then STATS: a daemon without a quorum of Redis
 * nodes answers, but can grant no lock, and a health check must say so. */
int ctl_ping(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    const struct redlockd_info *info;
    struct ctl_votes v = { 0, 0 };
    struct redlockd *h;
    double t0, rtt;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    t0 = ctl_now_ms();
    rc = redlockd_ping(h);
    rtt = ctl_now_ms() - t0;
    if (rc < 0)
        rc = ctl_report("ping", rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_read_votes(h, &v);
    if (rc != 0) {
        redlockd_close(h);
        return rc;
    }
    info = redlockd_info(h);
    if (c->json)
        ctl_ping_json(info, &v, rtt);
    else
        printf("PONG from %s: session %s, %u Redis node%s, %" JSON_INTEGER_FORMAT
               " voting (quorum %" JSON_INTEGER_FORMAT "), %.3f ms\n",
               info->server, info->session, info->nodes,
               info->nodes == 1 ? "" : "s", v.voting, v.quorum, rtt);
    if (v.voting < v.quorum) {
        warnx("ping: no quorum: %" JSON_INTEGER_FORMAT " of %u Redis nodes "
              "voting, %" JSON_INTEGER_FORMAT " needed; no lock can be "
              "granted", v.voting, info->nodes, v.quorum);
        rc = EX_UNAVAILABLE;
    }
    redlockd_close(h);
    return rc;
}

static const char *ctl_json_str(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

static void ctl_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- stats: the short table --------------------------------------------- */

/*
 * `stats` shows what an operator looks at first, as `consul info` or
 * `etcdctl endpoint status -w table` do: the nodes with their state and
 * latency, sessions, locks held and waiting, grants and losses per second
 * (between two STATS CTL_STATS_SAMPLE_MS apart) and acquire latency
 * quantiles (from the daemon's histogram since it started). --json prints
 * the first STATS answer whole, at once.
 */
#define CTL_STATS_SAMPLE_MS 1000

/* Seconds as "850 us", "3.4 ms", "1.25 s". */
static const char *ctl_seconds(double s, char *buf, size_t sz)
{
    if (s < 0.001)
        snprintf(buf, sz, "%.0f us", s * 1e6);
    else if (s < 1.0)
        snprintf(buf, sz, "%.3g ms", s * 1e3);
    else
        snprintf(buf, sz, "%.3g s", s);
    return buf;
}

/*
 * The q-quantile of a STATS histogram ({"count", "le": [bounds],
 * "buckets": [cumulative counts, the last one +Inf]}), interpolated within
 * its bucket as Prometheus's histogram_quantile() does. Its text in buf,
 * "> 10 s" beyond the last bound; NULL when the histogram is empty or
 * unreadable.
 */
static const char *ctl_quantile(json_t *h, double q, char *buf, size_t sz)
{
    json_t *le = json_object_get(h, "le"), *b = json_object_get(h, "buckets");
    size_t n = json_array_size(le), i;
    double rank, prev = 0, lo = 0, cum, hi, v;
    char num[32];

    if (n == 0 || json_array_size(b) != n + 1 || ctl_int(h, "count") <= 0)
        return NULL;
    rank = q * (double)ctl_int(h, "count");
    for (i = 0; i < n; i++) {
        cum = (double)json_integer_value(json_array_get(b, i));
        hi = json_number_value(json_array_get(le, i));
        if (cum >= rank && cum > prev) {
            v = lo + (hi - lo) * (rank - prev) / (cum - prev);
            return ctl_seconds(v, buf, sz);
        }
        prev = cum;
        lo = hi;
    }
    snprintf(buf, sz, "> %s", ctl_seconds(lo, num, sizeof(num)));
    return buf;
}

static void ctl_print_stat_nodes(json_t *root)
{
    struct ctl_table t = { .ncols = 5, .right = (1u << 2) | (1u << 3) };
    char b[4][64];
    json_t *node;
    size_t i;

    ctl_table_add(&t, (const char *const[]){ "NODE", "STATE", "LATENCY",
                                             "MAX", "" });
    json_array_foreach(json_object_get(root, "nodes"), i, node) {
        const char *why = ctl_json_str(node, "why");
        const char *err = ctl_json_str(node, "last_error");
        const char *row[5] = {
            ctl_field(node, "node", b[0], sizeof(b[0])),
            ctl_field(node, "state", b[1], sizeof(b[1])),
            ctl_seconds(json_number_value(json_object_get(node, "latency_ms"))
                        / 1e3, b[2], sizeof(b[2])),
            ctl_seconds(json_number_value(json_object_get(node,
                        "latency_max_ms")) / 1e3, b[3], sizeof(b[3])),
            /* Why it does not vote, or what went wrong last. */
            why && *why ? why : err && *err ? err : "",
        };
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

/* One "grants  12.5/s over 1.0 s (340 since start)" line. */
static void ctl_print_rate(const char *what, json_int_t before,
                           json_int_t after, double secs)
{
    printf("%-14s%.1f/s over %.1f s (%" JSON_INTEGER_FORMAT
           " since start)\n", what,
           secs > 0 ? (double)(after - before) / secs : 0.0, secs, after);
}

static void ctl_print_stats(json_t *before, json_t *root, double secs)
{
    json_t *acq = json_object_get(root, "acquisitions");
    json_t *hist = json_object_get(root, "acquire_seconds");
    json_int_t conns = ctl_int(root, "connections");
    static const double qs[] = { 0.5, 0.9, 0.99 };
    static const char *const qnames[] = { "p50", "p90", "p99" };
    char b[64], up[64];
    size_t i;

    printf("%-14sredlockd %s, up %s\n", "daemon",
           ctl_text(root, "version", b, sizeof(b)),
           ctl_duration(json_object_get(root, "uptime_ms"), up, sizeof(up))
               ? up : "-");
    printf("%-14s%" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT
           " voting, quorum %" JSON_INTEGER_FORMAT "\n", "nodes",
           ctl_int(root, "nodes_voting"), ctl_int(root, "nodes_total"),
           ctl_int(root, "quorum"));
    printf("%-14s%" JSON_INTEGER_FORMAT " (%" JSON_INTEGER_FORMAT
           " detached), %" JSON_INTEGER_FORMAT " connection%s\n", "sessions",
           ctl_int(root, "sessions"), ctl_int(root, "sessions_detached"),
           conns, conns == 1 ? "" : "s");
    printf("%-14s%" JSON_INTEGER_FORMAT " held, %" JSON_INTEGER_FORMAT
           " waiting\n", "locks", ctl_int(root, "locks_held"),
           ctl_int(root, "waiters"));
    ctl_print_rate("grants", ctl_int(json_object_get(before, "acquisitions"),
                                     "ok"), ctl_int(acq, "ok"), secs);
    ctl_print_rate("losses", ctl_int(before, "leases_lost"),
                   ctl_int(root, "leases_lost"), secs);
    printf("%-14s", "acquire");
    if (!ctl_quantile(hist, 0.5, b, sizeof(b))) {
        printf("no acquisitions yet\n");
    } else {
        for (i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
            printf("%s %s%s", qnames[i], ctl_quantile(hist, qs[i], b,
                                                      sizeof(b)),
                   i + 1 < sizeof(qs) / sizeof(qs[0]) ? ", " : "");
        printf(" (of %" JSON_INTEGER_FORMAT " since start)\n",
               ctl_int(hist, "count"));
    }
    if (json_array_size(json_object_get(root, "nodes")) > 0) {
        putchar('\n');
        ctl_print_stat_nodes(root);
    }
}

static int ctl_fetch_json(struct redlockd *h, json_t **root)
{
    char *json = NULL;
    int rc = redlockd_stats(h, &json);

    if (rc < 0)
        return ctl_report("stats", rc, redlockd_last_error(h)->msg);
    *root = ctl_parse_json(json);
    free(json);
    return *root ? 0 : EX_UNAVAILABLE;
}

int ctl_stats(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    json_t *before = NULL, *after = NULL;
    char *json = NULL;
    double t0 = 0, t1 = 0;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    if (c->json) {
        rc = redlockd_stats(h, &json);
        if (rc < 0)
            rc = ctl_report("stats", rc, redlockd_last_error(h)->msg);
        else
            printf("%s\n", json);
        rc = rc < 0 ? rc : 0;
        free(json);
        redlockd_close(h);
        return rc;
    }
    t0 = ctl_now_ms();
    rc = ctl_fetch_json(h, &before);
    if (rc == 0) {
        ctl_sleep_ms(CTL_STATS_SAMPLE_MS);
        t1 = ctl_now_ms();
        rc = ctl_fetch_json(h, &after);
    }
    if (rc == 0)
        ctl_print_stats(before, after, (t1 - t0) / 1000.0);
    json_decref(before);
    json_decref(after);
    redlockd_close(h);
    return rc;
}

/* ---- locks: every lock of every session --------------------------------- */

/* By resource, then by session (shared holders of one resource). */
static int ctl_row_cmp(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *rx = ctl_json_str(x, "resource"), *ry = ctl_json_str(y, "resource");
    const char *sx = ctl_json_str(x, "session"), *sy = ctl_json_str(y, "session");
    int d = strcmp(rx ? rx : "", ry ? ry : "");

    return d != 0 ? d : strcmp(sx ? sx : "", sy ? sy : "");
}

/* One row: the held lock with its session's id, name and peer. */
static json_t *ctl_lock_row(json_t *sess, json_t *lock)
{
    json_t *mode = json_object_get(lock, "mode");
    json_t *name = json_object_get(sess, "name");
    json_t *row = json_object();

    json_object_set(row, "resource", json_object_get(lock, "resource"));
    json_object_set(row, "fence", json_object_get(lock, "fence"));
    json_object_set_new(row, "mode", json_is_string(mode) ? json_copy(mode)
                                     : json_string("exclusive"));
    json_object_set(row, "session", json_object_get(sess, "id"));
    json_object_set_new(row, "name", json_is_string(name) ? json_copy(name)
                                     : json_null());
    json_object_set(row, "peer", json_object_get(sess, "peer"));
    json_object_set(row, "held_ms", json_object_get(lock, "held_ms"));
    json_object_set(row, "validity", json_object_get(lock, "validity"));
    return row;
}

/* The rows of SESSIONS, sorted; NULL (said why) when it lists no locks. */
static json_t *ctl_lock_rows(json_t *root)
{
    json_t *sessions = json_object_get(root, "sessions"), *sess, *lock;
    json_t **rows = NULL, *out;
    size_t i, j, n = 0, cap = 0;

    if (!json_is_array(sessions)) {
        warnx("locks: SESSIONS has no \"sessions\" array");
        return NULL;
    }
    /* Our own session is always there, so a daemon that lists held locks
     * shows it with an empty "held". */
    json_array_foreach(sessions, i, sess) {
        json_t *held = json_object_get(sess, "held");

        if (!json_is_array(held)) {
            warnx("locks: this daemon's SESSIONS does not list held locks; "
                  "upgrade redlockd");
            for (j = 0; j < n; j++)
                json_decref(rows[j]);
            free(rows);
            return NULL;
        }
        json_array_foreach(held, j, lock) {
            if (n == cap) {
                json_t **grown;

                cap = cap ? 2 * cap : 16;
                grown = realloc(rows, cap * sizeof(*rows));
                if (!grown)
                    errx(EX_OSERR, "out of memory");
                rows = grown;
            }
            rows[n++] = ctl_lock_row(sess, lock);
        }
    }
    if (n > 0)
        qsort(rows, n, sizeof(*rows), ctl_row_cmp);
    out = json_array();
    for (i = 0; i < n; i++)
        json_array_append_new(out, rows[i]);
    free(rows);
    return out;
}

static void ctl_print_locks(json_t *rows)
{
    struct ctl_table t = { .ncols = 8,
                           .right = (1u << 1) | (1u << 6) | (1u << 7) };
    static const char *const keys[8] = { "resource", "fence", "mode",
                                         "session", "name", "peer",
                                         "held_ms", "validity" };
    char b[8][64];
    json_t *row;
    size_t i, k;

    ctl_table_add(&t, (const char *const[]){ "RESOURCE", "FENCE", "MODE",
                                             "SESSION", "NAME", "PEER",
                                             "HELD_MS", "VALIDITY" });
    json_array_foreach(rows, i, row) {
        const char *cells[8];

        for (k = 0; k < 8; k++) {
            cells[k] = ctl_field(row, keys[k], b[k], sizeof(b[k]));
            if (json_is_null(json_object_get(row, keys[k])))
                cells[k] = "-";
        }
        ctl_table_add(&t, cells);
    }
    ctl_table_print(&t);
}

int ctl_locks(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    json_t *root = NULL, *rows = NULL;
    char *json = NULL, *text;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_sessions(h, &json);
    if (rc < 0)
        rc = ctl_report("locks: SESSIONS", rc, redlockd_last_error(h)->msg);
    else if (!(root = ctl_parse_json(json)) || !(rows = ctl_lock_rows(root)))
        rc = EX_UNAVAILABLE;
    else if (c->json) {
        text = json_dumps(rows, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!text)
            errx(EX_OSERR, "out of memory");
        printf("%s\n", text);
        free(text);
    } else {
        ctl_print_locks(rows);
    }
    json_decref(rows);
    json_decref(root);
    free(json);
    redlockd_close(h);
    return rc;
}

/* ---- release --force: FORCEUNLOCK --------------------------------------- */

#define CTL_ADMIN_PASSWORD_ENV "REDLOCKD_ADMIN_PASSWORD"

static int ctl_admin_password(struct ctl *c)
{
    const char *env = getenv(CTL_ADMIN_PASSWORD_ENV);

    if (c->admin_password_file)
        return ctl_read_secret(c->admin_password_file, "admin password",
                               c->admin_password, sizeof(c->admin_password));
    if (env && *env != '\0') {
        if (strlen(env) >= sizeof(c->admin_password)
            || strpbrk(env, " \t\r\n")) {
            warnx("$%s is not one word of at most %zu bytes",
                  CTL_ADMIN_PASSWORD_ENV, sizeof(c->admin_password) - 1);
            return -1;
        }
        strcpy(c->admin_password, env);
    }
    /* None: FORCEUNLOCK goes out anyway, and the daemon's NOAUTH says
     * why it is refused. */
    return 0;
}

int ctl_release(struct ctl *c, int argc, char **argv)
{
    struct redlockd_opts o = { 0 };
    const struct redlockd_error *e;
    struct redlockd *h;
    int rc;

    if (!c->force) {
        warnx("release: a lock lives as long as the session that took it "
              "(run releases its lock when the command exits); to delete "
              "someone else's lock as an operator: release --force RESOURCE");
        return EX_USAGE;
    }
    if (argc != 1) {
        warnx("release: expected one RESOURCE");
        return EX_USAGE;
    }
    /* An admin user (--user) needs no admin password, unless one is
     * named outright. */
    if ((!ctl_user(c) || c->admin_password_file) && ctl_admin_password(c) < 0)
        return EX_USAGE;
    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_force_unlock(h, argv[0]);
    e = redlockd_last_error(h);
    if (rc == -REDLOCKD_E_NOAUTH) {
        warnx("release: not an operator: the daemon needs "
              "auth.admin_password and this command the same password "
              "(--admin-password-file or $%s): %s (NOAUTH)",
              CTL_ADMIN_PASSWORD_ENV, e->msg);
        rc = EX_UNAVAILABLE;
    } else if (rc < 0) {
        rc = ctl_report("release", rc, e->msg);
    } else {
        if (c->json) {
            json_t *j = json_pack("{s:s, s:i}", "resource", argv[0],
                                  "nodes", rc);
            char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER)
                           : NULL;

            if (!text)
                errx(EX_OSERR, "out of memory");
            printf("%s\n", text);
            free(text);
            json_decref(j);
        } else
            printf("released %s on %d node(s)\n", argv[0], rc);
        rc = 0;
    }
    redlockd_close(h);
    return rc;
}

/* ---- watch and leader: who holds a resource ----------------------------- */

/* A holder as the daemon's words, after EVENT HOLDER resource=<r>. */
static void ctl_holder_words(FILE *out, const struct redlockd_holder *hd)
{
    fprintf(out, "held=%u", hd->held);
    if (hd->foreign)
        fputs(" foreign=1", out);
    else if (hd->held > 0 && hd->limit > 0)
        fprintf(out, " mode=semaphore limit=%" PRIu32, hd->limit);
    else if (hd->held > 0 && hd->mode == REDLOCKD_SHARED)
        fputs(" mode=shared", out);
    else if (hd->held > 0)
        fprintf(out, " mode=exclusive fence=%" PRIu64 " name=%s daemon=%s%s%s",
                hd->fence, hd->name, hd->daemon, hd->value[0] ? " value=" : "",
                hd->value);
}

/* The same as a JSON object (time: when it was heard, or NULL). */
static json_t *ctl_holder_json(const struct redlockd_holder *hd,
                               const char *time)
{
    json_t *o = json_object();

    if (time)
        json_object_set_new(o, "time", json_string(time));
    json_object_set_new(o, "resource", json_string(hd->resource));
    json_object_set_new(o, "held", json_integer(hd->held));
    if (hd->foreign) {
        json_object_set_new(o, "foreign", json_true());
    } else if (hd->held > 0 && hd->limit > 0) {
        json_object_set_new(o, "mode", json_string("semaphore"));
        json_object_set_new(o, "limit", json_integer(hd->limit));
    } else if (hd->held > 0 && hd->mode == REDLOCKD_SHARED) {
        json_object_set_new(o, "mode", json_string("shared"));
    } else if (hd->held > 0) {
        json_object_set_new(o, "mode", json_string("exclusive"));
        json_object_set_new(o, "fence", json_integer((json_int_t)hd->fence));
        json_object_set_new(o, "name", hd->name[0] ? json_string(hd->name)
                                                   : json_null());
        json_object_set_new(o, "daemon", json_string(hd->daemon));
        if (hd->value[0])
            json_object_set_new(o, "value", json_string(hd->value));
    }
    return o;
}

static void ctl_print_json(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

    if (!text)
        errx(EX_OSERR, "out of memory");
    printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* Now as "2026-01-31T14:05:09.123+0100": local time, to the millisecond,
 * one word. */
static const char *ctl_timestamp(char *buf, size_t sz)
{
    struct timespec ts;
    struct tm tm;
    char zone[8];
    size_t len;

    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    len = strftime(buf, sz, "%Y-%m-%dT%H:%M:%S", &tm);
    if (strftime(zone, sizeof(zone), "%z", &tm) == 0)
        zone[0] = '\0';
    snprintf(buf + len, sz - len, ".%03ld%s", ts.tv_nsec / 1000000, zone);
    return buf;
}

/* on_holder of watch: one line per event, flushed at once (into a pipe
 * too). ud is the struct ctl. */
static void ctl_on_holder(const struct redlockd_holder *hd, void *ud)
{
    const struct ctl *c = ud;
    char when[64];

    ctl_timestamp(when, sizeof(when));
    if (c->json) {
        ctl_print_json(ctl_holder_json(hd, when));
    } else {
        printf("%s %s ", when, hd->resource);
        ctl_holder_words(stdout, hd);
        putchar('\n');
    }
    fflush(stdout);
}

/* Events until SIGINT, SIGTERM or SIGHUP (0). A lost connection is taken
 * up again, for as long as it takes, in slices that leave the signals
 * their turn (the library watches again on a new session, and the daemon
 * tells the states then), saying so on stderr once each way. */
static int ctl_watch_wait(struct redlockd *h)
{
    struct pollfd p[2];
    bool away = false;
    int rc;

    for (;;) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(h);
        p[1].events = POLLIN;
        if (poll(p, 2, away ? 0 : -1) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0 && ctl_told_to_stop())
            return 0;
        rc = redlockd_poll_events(h, away ? CTL_RECONNECT_SLICE_MS : 0);
        if (rc < 0 && !away)
            warnx("watch: lost the connection to %s; reconnecting",
                  redlockd_server(h));
        else if (rc >= 0 && away)
            warnx("watch: watching again through %s", redlockd_server(h));
        away = rc < 0 || redlockd_fd(h) < 0;
    }
}

int ctl_watch(struct ctl *c, const struct ctl_args *a)
{
    struct redlockd_opts o = { .on_holder = ctl_on_holder, .ud = c };
    struct redlockd *h;
    int rc;

    if (a->nwords == 0) {
        warnx("watch: missing RESOURCE (try --help)");
        return EX_USAGE;
    }
    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    if (keeper_catch_signals() < 0)
        err(EX_OSERR, "pipe");
    rc = redlockd_watch(h, (const char *const *)a->words, (size_t)a->nwords);
    if (rc < 0)
        rc = ctl_report("watch", rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_watch_wait(h);
    redlockd_close(h);
    return rc;
}

/* leader: the value of an exclusive holder that has one; nothing, and
 * CTL_EXIT_NO_LEADER, otherwise. */
int ctl_leader(struct ctl *c, const char *resource)
{
    struct redlockd_opts o = { 0 };
    struct redlockd_holder hd;
    struct redlockd *h;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_holder(h, resource, &hd);
    if (rc < 0)
        rc = ctl_report("leader", rc, redlockd_last_error(h)->msg);
    else if (hd.held != 1 || hd.foreign || hd.limit > 0
             || hd.mode != REDLOCKD_EXCLUSIVE || hd.value[0] == '\0')
        rc = CTL_EXIT_NO_LEADER;
    else if (c->json)
        ctl_print_json(ctl_holder_json(&hd, NULL));
    else
        printf("%s\n", hd.value);
    redlockd_close(h);
    return rc;
}
