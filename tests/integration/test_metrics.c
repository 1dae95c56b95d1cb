/*
 * test_metrics: the HTTP endpoint of metrics.listen, against the real
 * redlockd binary and three real redis-server nodes.
 *
 * Requests go over raw sockets, written by hand, so the test sees exactly
 * what a scraper or a load balancer would: the status line, the headers,
 * a body that ends where the server closes. Covered: /metrics in the
 * Prometheus text format with counters that move after a LOCK and
 * per-node samples, /healthz flipping to 503 when two of three nodes are
 * gone, HEAD answered as GET without a body, a head sent in pieces, 404,
 * 405, 400, a 10 KiB head answered 431, a slow one 408, a request
 * followed by a half-close, and the cap of 64 connections. Against the stats codec
 * (daemon/stats.h): every family has # HELP and a known # TYPE, every row
 * (the per-class ones included) is a STATS key and a /metrics family, and
 * counters agree between the two.
 *
 * Every test ends with a SIGTERM stop asserted to exit 0, so under
 * REDLOCKD_TEST_WRAPPER=valgrind each scenario is also a leak check.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "harness.h"

/* The codec's lists only (STATS_CODEC and friends): the rows say which
 * keys STATS must have and which families /metrics must export. */
#include "daemon/stats.h"

#define NNODES 3
#define MAX_CONNS 64            /* the daemon's cap, httpd.h */

/* Its nodes, daemon D and client C (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_daemon *const D = &K.daemons[0];
static struct h_client *const C = &K.clients[0];
static int mport;               /* the metrics port of this test */

/* Upper time bounds stretch under valgrind; nothing here has a lower one. */
static int T(int ms)
{
    return h_slow() ? ms * 10 : ms;
}

/* ---- a minimal HTTP client ----------------------------------------------- */

struct http_reply {
    int status;             /* 0 when no status line came */
    char *raw;              /* (owned) everything received */
    size_t len;
    const char *body;       /* into raw, after the empty line, or NULL */
};

/* A connected socket, or -errno. */
static int http_try_connect(void)
{
    struct sockaddr_in sin = { .sin_family = AF_INET };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    sin.sin_port = htons((uint16_t)mport);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        int e = errno;

        close(fd);
        return -e;
    }
    return fd;
}

static int http_connect(void)
{
    int fd = http_try_connect();

    ck_assert_msg(fd >= 0, "connect to metrics port %d: %s", mport,
                  strerror(-fd));
    return fd;
}

static void http_send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);

        ck_assert_msg(n > 0, "send: %s", strerror(errno));
        data += n;
        len -= (size_t)n;
    }
}

/* Read until the server closes (the response says Connection: close) or
 * timeout_ms passes; true when it closed. ECONNRESET also counts as
 * closed, with what arrived before it kept. */
static bool http_read_all(int fd, struct http_reply *r, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    size_t cap = 4096;

    r->raw = malloc(cap);
    r->len = 0;
    ck_assert_ptr_nonnull(r->raw);
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        uint64_t now = h_now_ms();
        ssize_t n;

        if (now >= deadline)
            return false;
        if (poll(&p, 1, (int)(deadline - now)) <= 0)
            continue;
        if (r->len + 1024 >= cap) {
            cap *= 2;
            r->raw = realloc(r->raw, cap);
            ck_assert_ptr_nonnull(r->raw);
        }
        n = recv(fd, r->raw + r->len, cap - r->len - 1, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            break;
        if (n < 0 && errno != EINTR && errno != EAGAIN)
            break;
        if (n > 0)
            r->len += (size_t)n;
    }
    r->raw[r->len] = '\0';
    return true;
}

static void http_parse(struct http_reply *r)
{
    char *end = strstr(r->raw, "\r\n\r\n");

    r->status = 0;
    if (strncmp(r->raw, "HTTP/1.", 7) == 0 && r->len >= 12)
        r->status = atoi(r->raw + 9);
    r->body = end ? end + 4 : NULL;
}

/* Send `request` as is and return the parsed reply (status 0 when the
 * server closed without one). */
static void http_raw(const char *request, size_t len, struct http_reply *r)
{
    int fd = http_connect();

    http_send_all(fd, request, len);
    ck_assert_msg(http_read_all(fd, r, T(5000)),
                  "metrics server did not close after answering");
    close(fd);
    http_parse(r);
}

static void http_get(const char *path, struct http_reply *r)
{
    char req[512];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "User-Agent: test_metrics\r\nAccept: */*\r\n\r\n", path);

    http_raw(req, (size_t)n, r);
}

static void http_free(struct http_reply *r)
{
    free(r->raw);
    r->raw = NULL;
}

/* The value of the sample line starting with `series ` in an exposition,
 * or -1 when there is none. */
static double sample(const char *body, const char *series)
{
    size_t n = strlen(series);

    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

static double get_metric(const char *series)
{
    struct http_reply r;
    double v;

    http_get("/metrics", &r);
    ck_assert_msg(r.status == 200, "GET /metrics: %.1500s", r.raw);
    v = sample(r.body, series);
    http_free(&r);
    return v;
}

/* The daemon's client port is open before the metrics listener and the
 * Redis connections are (noticeably so under valgrind): wait for both, so
 * tests start from "all nodes up". */
static void wait_healthy(void)
{
    uint64_t deadline = h_now_ms() + (uint64_t)T(5000);
    struct http_reply r;
    int fd;

    while (h_now_ms() < deadline) {
        fd = http_try_connect();
        if (fd < 0) {
            h_sleep_ms(20);
            continue;
        }
        http_send_all(fd, "GET /healthz HTTP/1.1\r\n\r\n", 25);
        http_read_all(fd, &r, T(2000));
        close(fd);
        http_parse(&r);
        http_free(&r);
        if (r.status == 200 && get_metric("redlockd_nodes_voting") == NNODES)
            return;
        h_sleep_ms(20);
    }
    h_daemon_dump_log(D);
    ck_abort_msg("metrics endpoint not healthy with all nodes within %d ms",
                 T(5000));
}

static void setup(void)
{
    char extra[256];

    mport = h_free_port();
    snprintf(extra, sizeof(extra),
             "{\"metrics\":{\"listen\":\"127.0.0.1:%d\"},"
             "\"redis\":{\"command_timeout_ms\":100}}", mport);
    h_cluster_daemon_start(&K, 0, extra);
    wait_healthy();
}


/* ---- the stats codec against STATS and /metrics -------------------------- */

/* What each `dim` a row may have means here: its label name, its label
 * values, and how STATS shows the cells (stats.h, enum stats_json_view).
 * A new label set needs its lines here (the build fails until it has
 * them). Written out from the codec's and the protocol's lists, not read
 * from the daemon's tables, so that a change to those shows here. */
enum t_view { T_ONE, T_OBJECT, T_FLAT, T_SUM };
#define T_LABEL_VALUE(value) #value,
static const char *const result_values[] = {
    STATS_RESULT_LABELS(T_LABEL_VALUE) NULL
};
static const char *const cause_values[] = {
    STATS_CAUSE_LABELS(T_LABEL_VALUE) NULL
};
static const char *const waited_values[] = {
    STATS_WAITED_LABELS(T_LABEL_VALUE) NULL
};
static const char *const tlsfail_values[] = {
    STATS_TLSFAIL_LABELS(T_LABEL_VALUE) NULL
};
#define T_COMMAND_WORD(name, word, usage) word,
static const char *const command_values[] = {
    "other", PROTO_COMMANDS(T_COMMAND_WORD) NULL
};
#define T_ERROR_WORD(name, word, msg) word,
static const char *const error_values[] = {
    "other", PROTO_ERRORS(T_ERROR_WORD) NULL
};
#define T_DIM_NONE NULL, NULL, T_ONE
#define T_DIM_LATENCY NULL, NULL, T_ONE
#define T_DIM_DURATION NULL, NULL, T_ONE
#define T_DIM_RESULT "result", result_values, T_OBJECT
#define T_DIM_WAITED "result", waited_values, T_OBJECT
#define T_DIM_CAUSE "cause", cause_values, T_FLAT
#define T_DIM_TLSFAIL "reason", tlsfail_values, T_OBJECT
#define T_DIM_COMMAND "command", command_values, T_SUM
#define T_DIM_ERROR "code", error_values, T_SUM

struct codec_row {
    const char *key;
    const char *metric;
    enum stats_kind kind;
    const char *label;          /* NULL: one cell */
    const char *const *values;
    enum t_view view;
};

#define T_ROW(field, kind, unit, dim, metric, help) \
    { #field, metric, STATS_##kind, T_DIM_##dim },
static const struct codec_row global_rows[] = { STATS_CODEC(T_ROW) };
static const struct codec_row process_rows[] = { STATS_PROCESS_CODEC(T_ROW) };
#define T_NODE_ROW(field, kind, unit, metric, help) \
    T_ROW(field, kind, unit, NONE, metric, help)
static const struct codec_row node_rows[] = { STATS_NODE_CODEC(T_NODE_ROW) };
#undef T_NODE_ROW
static const struct codec_row class_rows[] = { STATS_CLASS_CODEC(T_ROW) };
#undef T_ROW

/* A table of rows: its Prometheus prefix. */
struct codec_table {
    const char *prefix;
    const struct codec_row *rows;
    size_t n;
};

#define NROWS(a) (sizeof(a) / sizeof((a)[0]))
static const struct codec_table tables[] = {
    { "redlockd_", global_rows, NROWS(global_rows) },
    { "process_", process_rows, NROWS(process_rows) },
};
#define FAMILY_MAX 128                  /* a family's name */
#define SERIES_MAX (FAMILY_MAX + 128)   /* with a node="HOST:PORT" label */
#define FAMILIES_MAX 256                /* in one exposition */

/* The family name /metrics gives r: counters end in _total. */
static void family_name(char *buf, size_t size, const char *prefix,
                        const struct codec_row *r)
{
    snprintf(buf, size, "%s%s%s", prefix, r->metric,
             r->kind == STATS_COUNTER ? "_total" : "");
}

/* The series of r's cell `value` (NULL for a row of one cell) in family
 * fam: "fam" or "fam{label="value"}"; a histogram's by its _count. */
static void series_name(char *buf, size_t size, const char *fam,
                        const struct codec_row *r, const char *value)
{
    const char *count = r->kind == STATS_HISTOGRAM ? "_count" : "";

    if (value)
        snprintf(buf, size, "%s%s{%s=\"%s\"}", fam, count, r->label, value);
    else
        snprintf(buf, size, "%s%s", fam, count);
}

/* Where STATS has r's cell `value` in the object obj (the top level, or
 * "process"): a member, a member of a member, or a flat key; a SUM row
 * has only its total, under its key. */
static json_t *stats_cell(json_t *obj, const struct codec_row *r,
                          const char *value)
{
    char key[FAMILY_MAX];

    switch (r->view) {
    case T_OBJECT:
        return json_object_get(json_object_get(obj, r->key), value);
    case T_FLAT:
        snprintf(key, sizeof(key), "%s_%s", r->key, value);
        return json_object_get(obj, key);
    case T_ONE:
    case T_SUM:
        break;
    }
    return json_object_get(obj, r->key);
}

/* The STATS object a table's rows live in. */
static json_t *table_object(json_t *st, const struct codec_table *t)
{
    return strcmp(t->prefix, "process_") == 0 ? json_object_get(st, "process")
                                              : st;
}

/* A node's gauge that is only reported in some states. */
static bool node_key_optional(const char *key)
{
    return strcmp(key, "rejoin_in_ms") == 0;    /* only while recovering */
}

/* The line after "# <what> <name> " for family `name`, or NULL. */
static const char *meta_line(const char *body, const char *what,
                             const char *name)
{
    char head[FAMILY_MAX + 16];
    const char *p;

    snprintf(head, sizeof(head), "# %s %s ", what, name);
    for (p = body; p != NULL && *p != '\0'; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, head, strlen(head)) == 0)
            return p + strlen(head);
    }
    return NULL;
}

static bool known_type(const char *t)
{
    return strncmp(t, "counter\n", 8) == 0 || strncmp(t, "gauge\n", 6) == 0 ||
           strncmp(t, "histogram\n", 10) == 0;
}

/* The family of a sample's metric name: the name itself, or for the
 * _bucket, _sum and _count series of a histogram its base name. */
static void sample_family(const char *body, const char *name, char *fam,
                          size_t size)
{
    static const char *const suffixes[] = { "_bucket", "_sum", "_count" };
    size_t n = strlen(name);

    snprintf(fam, size, "%s", name);
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(suffixes[i]);
        const char *type;

        if (n <= k || strcmp(name + n - k, suffixes[i]) != 0)
            continue;
        snprintf(fam, size, "%.*s", (int)(n - k), name);
        type = meta_line(body, "TYPE", fam);
        if (type && strncmp(type, "histogram\n", 10) == 0)
            return;
        snprintf(fam, size, "%s", name);
    }
}

/* ---- tests --------------------------------------------------------------- */

#define ACQ_OK "redlockd_acquisitions_total{result=\"ok\"}"

START_TEST(metrics_format_and_counters)
{
    struct http_reply r;
    char series[128];
    double before, after;
    char *line;

    http_get("/metrics", &r);
    ck_assert_msg(r.status == 200, "GET /metrics: %.1500s", r.raw);
    ck_assert_msg(strstr(r.raw, "\r\nContent-Type: text/plain; version=0.0.4")
                  != NULL, "no 0.0.4 content type: %.1500s", r.raw);
    ck_assert_msg(strstr(r.raw, "\r\nConnection: close\r\n"),
                  "no Connection: close: %.1500s", r.raw);
    ck_assert_ptr_nonnull(r.body);
    ck_assert_msg(strstr(r.body, "# TYPE redlockd_acquisitions_total counter\n")
                  != NULL, "no counter TYPE line:\n%.1500s", r.body);
    ck_assert_msg(strstr(r.body, "# TYPE redlockd_locks_held gauge\n"),
                  "no gauge TYPE line:\n%.1500s", r.body);
    /* Every node appears under its own label, up and voting. */
    for (int i = 0; i < NNODES; i++) {
        snprintf(series, sizeof(series),
                 "redlockd_node_up{node=\"127.0.0.1:%d\"}", N[i].port);
        ck_assert_msg(sample(r.body, series) == 1, "%s not 1:\n%.1500s", series,
                      r.body);
        snprintf(series, sizeof(series),
                 "redlockd_node_latency_seconds{node=\"127.0.0.1:%d\"}",
                 N[i].port);
        ck_assert_msg(sample(r.body, series) >= 0, "no %s:\n%.1500s", series,
                      r.body);
    }
    ck_assert_msg(sample(r.body, "redlockd_quorum") == 2, "quorum:\n%.1500s", r.body);
    before = sample(r.body, ACQ_OK);
    ck_assert_msg(before >= 0, "no " ACQ_OK ":\n%.1500s", r.body);
    http_free(&r);

    h_cluster_client(&K, 0, 0);
    line = h_cmd(C, "LOCK metrics:1 ttl=10000");
    ck_assert_msg(h_starts(line, "OK "), "LOCK: %s", line);
    after = get_metric(ACQ_OK);
    ck_assert_msg(after == before + 1, "acquisitions_ok %g -> %g", before, after);
    ck_assert_msg(get_metric("redlockd_locks_held") == 1, "locks_held not 1");
    line = h_cmd(C, "UNLOCK metrics:1");
    ck_assert_msg(h_starts(line, "OK "), "UNLOCK: %s", line);
    ck_assert_msg(get_metric("redlockd_releases_total") >= 1, "releases");
    ck_assert_msg(get_metric("redlockd_locks_held") == 0, "locks_held not 0");
}
END_TEST

START_TEST(healthz_follows_quorum)
{
    struct http_reply r;
    uint64_t deadline;
    bool down = false;

    http_get("/healthz", &r);
    ck_assert_msg(r.status == 200, "GET /healthz with 3 nodes: %.1500s", r.raw);
    ck_assert_str_eq(r.body, "ok\n");
    http_free(&r);

    h_redis_stop(&N[1]);
    h_redis_stop(&N[2]);
    h_cluster_client(&K, 0, 0);
    /* A LOCK makes the daemon talk to the nodes, so it notices them gone
     * even if the dropped connections had not told it yet. */
    deadline = h_now_ms() + (uint64_t)T(5000);
    while (!down && h_now_ms() < deadline) {
        char *line = h_cmd(C, "LOCK metrics:health ttl=1000");

        if (h_starts(line, "OK "))
            h_cmd(C, "UNLOCK metrics:health");
        http_get("/healthz", &r);
        down = r.status == 503;
        if (down)
            ck_assert_str_eq(r.body, "no quorum\n");
        else
            ck_assert_msg(r.status == 200, "GET /healthz: %.1500s", r.raw);
        http_free(&r);
        if (!down)
            h_sleep_ms(50);
    }
    ck_assert_msg(down, "/healthz still 200 with 2 of 3 nodes stopped");
    ck_assert_msg(get_metric("redlockd_nodes_voting") < 2, "nodes_voting");
}
END_TEST

START_TEST(errors_404_405_400)
{
    static const char post[] = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    static const char junk[] = "hello there\r\n\r\n";
    static const char bare_lf[] = "GET /healthz?probe=1 HTTP/1.0\n\n";
    static const char absolute[] =
        "GET http://127.0.0.1/healthz HTTP/1.1\r\n\r\n";
    static const char http2[] = "GET /healthz HTTP/2.0\r\n\r\n";
    static const char unknown_method[] = "FROB /metrics HTTP/1.1\r\n\r\n";
    struct http_reply r;

    http_get("/nope", &r);
    ck_assert_msg(r.status == 404, "GET /nope: %.1500s", r.raw);
    http_free(&r);

    http_raw(post, sizeof(post) - 1, &r);
    ck_assert_msg(r.status == 405, "POST /metrics: %.1500s", r.raw);
    ck_assert_msg(strstr(r.raw, "\r\nAllow: GET, HEAD\r\n"), "no Allow: %s",
                  r.raw);
    http_free(&r);

    http_raw(junk, sizeof(junk) - 1, &r);
    ck_assert_msg(r.status == 400, "junk request: %.1500s", r.raw);
    http_free(&r);

    /* HTTP/1.0, bare LF line ends and a query string are all fine. */
    http_raw(bare_lf, sizeof(bare_lf) - 1, &r);
    ck_assert_msg(r.status == 200, "bare-LF /healthz: %.1500s", r.raw);
    http_free(&r);

    /* So is the absolute form of the target. */
    http_raw(absolute, sizeof(absolute) - 1, &r);
    ck_assert_msg(r.status == 200, "absolute-form /healthz: %.1500s", r.raw);
    http_free(&r);

    /* Not HTTP/1.x, or a method word the parser does not know: 400. */
    http_raw(http2, sizeof(http2) - 1, &r);
    ck_assert_msg(r.status == 400, "HTTP/2.0: %.1500s", r.raw);
    http_free(&r);
    http_raw(unknown_method, sizeof(unknown_method) - 1, &r);
    ck_assert_msg(r.status == 400, "FROB: %.1500s", r.raw);
    http_free(&r);
}
END_TEST

/* The headers of a reply, up to the empty line, or NULL. */
static const char *header(const struct http_reply *r, const char *name,
                          char *value, size_t size)
{
    char key[64];
    const char *p;
    size_t n;

    snprintf(key, sizeof(key), "\r\n%s: ", name);
    p = strstr(r->raw, key);
    if (!p || !r->body || p > r->body)
        return NULL;
    p += strlen(key);
    n = strcspn(p, "\r");
    snprintf(value, size, "%.*s", (int)n, p);
    return value;
}

/* HEAD is GET without the body: same status and headers, Content-Length
 * included, and nothing after the empty line. */
START_TEST(head_like_get)
{
    static const char head_metrics[] = "HEAD /metrics HTTP/1.1\r\n\r\n";
    static const char head_health[] = "HEAD /healthz HTTP/1.1\r\n\r\n";
    static const char head_nope[] = "HEAD /nope HTTP/1.1\r\n\r\n";
    struct http_reply get, r;
    char len[32], ctype[128], get_ctype[128];
    long n;

    http_get("/metrics", &get);
    ck_assert_msg(get.status == 200, "GET /metrics: %.1500s", get.raw);
    ck_assert_ptr_nonnull(header(&get, "Content-Type", get_ctype,
                                 sizeof(get_ctype)));
    http_raw(head_metrics, sizeof(head_metrics) - 1, &r);
    ck_assert_msg(r.status == 200, "HEAD /metrics: %.1500s", r.raw);
    ck_assert_msg(r.body && *r.body == '\0', "HEAD /metrics has a body: "
                  "%.1500s", r.raw);
    ck_assert_msg(header(&r, "Content-Length", len, sizeof(len)),
                  "HEAD /metrics without Content-Length: %.1500s", r.raw);
    /* The values move between the two requests, the families do not:
     * the lengths are close. */
    n = strtol(len, NULL, 10);
    ck_assert_msg(labs(n - (long)strlen(get.body)) < 512,
                  "HEAD Content-Length %ld, GET body %zu", n,
                  strlen(get.body));
    ck_assert_msg(header(&r, "Content-Type", ctype, sizeof(ctype)) &&
                  strcmp(ctype, get_ctype) == 0,
                  "HEAD Content-Type differs: %.1500s", r.raw);
    ck_assert_msg(strstr(r.raw, "\r\nConnection: close\r\n"),
                  "no Connection: close: %.1500s", r.raw);
    http_free(&r);
    http_free(&get);

    http_raw(head_health, sizeof(head_health) - 1, &r);
    ck_assert_msg(r.status == 200, "HEAD /healthz: %.1500s", r.raw);
    ck_assert_msg(header(&r, "Content-Length", len, sizeof(len)) &&
                  strcmp(len, "3") == 0 && *r.body == '\0',
                  "HEAD /healthz: %.1500s", r.raw);
    http_free(&r);

    http_raw(head_nope, sizeof(head_nope) - 1, &r);
    ck_assert_msg(r.status == 404 && r.body && *r.body == '\0',
                  "HEAD /nope: %.1500s", r.raw);
    http_free(&r);
}
END_TEST

/* A head that arrives a few bytes at a time is read as one. */
START_TEST(head_in_pieces)
{
    static const char *const pieces[] = {
        "GE", "T /hea", "lthz HT", "TP/1.1\r", "\nHost: x\r\n", "\r", "\n",
    };
    struct http_reply r;
    int fd = http_connect();

    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        http_send_all(fd, pieces[i], strlen(pieces[i]));
        h_sleep_ms(20);
    }
    ck_assert(http_read_all(fd, &r, T(5000)));
    close(fd);
    http_parse(&r);
    ck_assert_msg(r.status == 200, "head in pieces: %.1500s", r.raw);
    ck_assert_str_eq(r.body, "ok\n");
    http_free(&r);
}
END_TEST

START_TEST(head_too_large_431)
{
    const size_t size = 10 * 1024;
    char *req = malloc(size + 64);
    struct http_reply r;
    size_t n;

    ck_assert_ptr_nonnull(req);
    n = (size_t)sprintf(req, "GET /metrics HTTP/1.1\r\nX-Filler: ");
    while (n < size)
        req[n++] = 'a';
    memcpy(req + n, "\r\n\r\n", 4);
    http_raw(req, n + 4, &r);
    free(req);
    ck_assert_msg(r.status == 431, "10 KiB head: %.200s", r.raw);
    http_free(&r);

    /* The daemon is still serving afterwards. */
    http_get("/healthz", &r);
    ck_assert_msg(r.status == 200, "after 431: %.1500s", r.raw);
    http_free(&r);
}
END_TEST

/* A head not complete within 5 s (httpd.h) is answered 408. */
START_TEST(slow_head_408)
{
    static const char part[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    struct http_reply r;
    uint64_t t0 = h_now_ms();
    int fd = http_connect();

    http_send_all(fd, part, sizeof(part) - 1);
    ck_assert(http_read_all(fd, &r, T(10000)));
    close(fd);
    http_parse(&r);
    ck_assert_msg(r.status == 408, "slow head: %.1500s", r.raw);
    ck_assert_msg(h_now_ms() - t0 >= 4500, "408 after only %llu ms",
                  (unsigned long long)(h_now_ms() - t0));
    http_free(&r);
}
END_TEST

START_TEST(half_close_after_request)
{
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    struct http_reply r;
    int fd = http_connect();

    http_send_all(fd, req, sizeof(req) - 1);
    shutdown(fd, SHUT_WR);
    ck_assert(http_read_all(fd, &r, T(5000)));
    close(fd);
    http_parse(&r);
    ck_assert_msg(r.status == 200, "after half-close: %.1500s", r.raw);
    ck_assert_msg(sample(r.body, "redlockd_commands_total"
                         "{command=\"other\"}") >= 0,
                  "no body after half-close:\n%.1500s", r.raw);
    http_free(&r);
}
END_TEST

START_TEST(connection_cap)
{
    int fds[MAX_CONNS];
    struct http_reply r;
    int extra;

    for (int i = 0; i < MAX_CONNS; i++)
        fds[i] = http_connect();
    /* Let the daemon accept the 64 before the next one arrives. */
    h_sleep_ms(T(200));
    extra = http_connect();
    ck_assert_msg(http_read_all(extra, &r, T(3000)),
                  "the 65th metrics connection was not closed");
    ck_assert_msg(r.len == 0, "the 65th connection got data: %.1500s", r.raw);
    http_free(&r);
    close(extra);

    /* Those that were admitted are served. */
    http_send_all(fds[0], "GET /healthz HTTP/1.1\r\n\r\n", 25);
    ck_assert(http_read_all(fds[0], &r, T(5000)));
    http_parse(&r);
    ck_assert_msg(r.status == 200, "admitted connection: %.1500s", r.raw);
    http_free(&r);
    for (int i = 0; i < MAX_CONNS; i++)
        close(fds[i]);

    /* Once they are gone there is room again. */
    {
        uint64_t deadline = h_now_ms() + (uint64_t)T(3000);
        bool served = false;

        while (!served && h_now_ms() < deadline) {
            http_get("/healthz", &r);
            served = r.status == 200;
            http_free(&r);
            if (!served)
                h_sleep_ms(50);
        }
        ck_assert_msg(served, "no room after the 64 connections closed");
    }
}
END_TEST

/* Every sample belongs to a family announced by # HELP (with text) and
 * # TYPE (counter, gauge or histogram), and a family's lines are
 * together. */
START_TEST(metrics_every_family_typed)
{
    struct http_reply r;
    char name[FAMILY_MAX], fam[FAMILY_MAX], prev[FAMILY_MAX] = "";
    const char *p, *help, *type;
    int nfamilies = 0;
    static char seen[FAMILIES_MAX][FAMILY_MAX];     /* families so far */
    size_t nseen = 0;

    http_get("/metrics", &r);
    ck_assert_msg(r.status == 200, "GET /metrics: %.1500s", r.raw);
    p = strstr(r.body, " untyped\n");
    ck_assert_msg(!p, "an untyped family: %.200s",
                  p - (p - r.body > 100 ? 100 : p - r.body));
    for (p = r.body; *p != '\0'; p = strchr(p, '\n') + 1) {
        size_t n;

        ck_assert_msg(strchr(p, '\n'), "unterminated line: %s", p);
        if (strncmp(p, "# TYPE ", 7) == 0) {
            n = strcspn(p + 7, " \n");
            snprintf(name, sizeof(name), "%.*s", (int)n, p + 7);
            ck_assert_msg(p[7 + n] == ' ' && known_type(p + 7 + n + 1),
                          "unknown type: %.200s", p);
            ck_assert_msg(meta_line(r.body, "HELP", name),
                          "# TYPE %s without # HELP", name);
            nfamilies++;
        }
        if (*p == '#')
            continue;
        n = strcspn(p, "{ \n");
        snprintf(name, sizeof(name), "%.*s", (int)n, p);
        sample_family(r.body, name, fam, sizeof(fam));
        help = meta_line(r.body, "HELP", fam);
        type = meta_line(r.body, "TYPE", fam);
        ck_assert_msg(help && *help != '\n', "%s: no # HELP text", fam);
        ck_assert_msg(type && known_type(type), "%s: no known # TYPE",
                      fam);
        if (strcmp(fam, prev) != 0) {
            /* A new family: it must not have had samples before. */
            for (size_t k = 0; k < nseen; k++)
                ck_assert_msg(strcmp(seen[k], fam) != 0,
                              "the samples of %s are not together", fam);
            ck_assert_msg(nseen < FAMILIES_MAX, "over %d families",
                          FAMILIES_MAX);
            snprintf(seen[nseen++], FAMILY_MAX, "%s", fam);
            snprintf(prev, sizeof(prev), "%s", fam);
        }
    }
    ck_assert_msg(nfamilies > 20, "only %d families", nfamilies);
    http_free(&r);
}
END_TEST

/* Every row of the codec is in STATS (with its nesting) and a family in
 * /metrics, every cell of a labelled row a series of it; per-node rows in
 * every node object and under every node; per-class rows in the object
 * of the class "other" (there from the start) and under class="other". */
START_TEST(codec_rows_in_stats_and_metrics)
{
    struct http_reply r;
    char fam[FAMILY_MAX], series[SERIES_MAX];
    json_t *st, *nodes, *node;
    size_t i;

    h_cluster_client(&K, 0, 0);
    st = h_ok_json(C, "STATS");
    http_get("/metrics", &r);
    ck_assert_msg(r.status == 200, "GET /metrics: %.1500s", r.raw);
    for (size_t t = 0; t < NROWS(tables); t++) {
        json_t *obj = table_object(st, &tables[t]);

        ck_assert_msg(json_is_object(obj), "STATS has no object for %s",
                      tables[t].prefix);
        for (i = 0; i < tables[t].n; i++) {
            const struct codec_row *row = &tables[t].rows[i];
            const char *const *values = row->values;
            const char *none[] = { NULL };

            family_name(fam, sizeof(fam), tables[t].prefix, row);
            ck_assert_msg(meta_line(r.body, "TYPE", fam),
                          "/metrics has no %s", fam);
            for (const char *const *v = values ? values : none;
                 v == none || *v; v++) {
                json_t *cell = stats_cell(obj, row, *v);

                /* A histogram is an object with its count, sum and
                 * buckets. */
                if (row->kind == STATS_HISTOGRAM)
                    cell = json_object_get(cell, "count");
                ck_assert_msg(json_is_integer(cell), "STATS has no integer "
                              "\"%s\" \"%s\"", row->key, *v ? *v : "");
                series_name(series, sizeof(series), fam, row, *v);
                ck_assert_msg(sample(r.body, series) >= 0,
                              "/metrics has no %s", series);
                if (v == none)
                    break;
            }
        }
    }
    nodes = json_object_get(st, "nodes");
    ck_assert_int_eq(json_array_size(nodes), NNODES);
    json_array_foreach(nodes, i, node) {
        for (size_t k = 0; k < NROWS(node_rows); k++) {
            const struct codec_row *row = &node_rows[k];
            const char *count = row->kind == STATS_HISTOGRAM ? "_count" : "";

            if (node_key_optional(row->key))
                continue;
            ck_assert_msg(json_object_get(node, row->key),
                          "STATS node has no \"%s\"", row->key);
            family_name(fam, sizeof(fam), "redlockd_", row);
            snprintf(series, sizeof(series), "%s%s{node=\"%s\"}", fam, count,
                     h_json_str(node, "node"));
            ck_assert_msg(sample(r.body, series) >= 0, "/metrics has no %s",
                          series);
        }
    }
    node = json_object_get(json_object_get(st, "classes"), "other");
    ck_assert_msg(json_is_object(node), "STATS has no class \"other\"");
    for (size_t k = 0; k < NROWS(class_rows); k++) {
        const struct codec_row *row = &class_rows[k];

        family_name(fam, sizeof(fam), "redlockd_", row);
        for (const char *const *v = row->values; v && *v; v++) {
            ck_assert_msg(json_is_integer(json_object_get(
                              stats_cell(node, row, *v), "count")),
                          "STATS class other has no %s %s", row->key, *v);
            snprintf(series, sizeof(series), "%s_count{class=\"other\","
                     "%s=\"%s\"}", fam, row->label, *v);
            ck_assert_msg(sample(r.body, series) >= 0, "/metrics has no %s",
                          series);
        }
        if (row->values)
            continue;
        ck_assert_msg(json_is_integer(json_object_get(json_object_get(
                          node, row->key), "count")),
                      "STATS class other has no %s", row->key);
        snprintf(series, sizeof(series), "%s_count{class=\"other\"}", fam);
        ck_assert_msg(sample(r.body, series) >= 0, "/metrics has no %s",
                      series);
    }
    json_decref(st);
    http_free(&r);
}
END_TEST

/* Each counter of the codec has the same value in STATS and /metrics when
 * nothing happens in between (STATS itself counts as a command before it
 * answers, and an HTTP request is not one). */
START_TEST(counters_agree)
{
    struct http_reply r;
    char fam[FAMILY_MAX], series[SERIES_MAX];
    json_t *st;
    char *line;
    int checked = 0;

    h_cluster_client(&K, 0, 0);
    line = h_cmd(C, "LOCK metrics:agree ttl=10000");
    ck_assert_msg(h_starts(line, "OK "), "LOCK: %s", line);
    line = h_cmd(C, "UNLOCK metrics:agree");
    ck_assert_msg(h_starts(line, "OK "), "UNLOCK: %s", line);
    st = h_ok_json(C, "STATS");
    http_get("/metrics", &r);
    ck_assert_msg(r.status == 200, "GET /metrics: %.1500s", r.raw);
    for (size_t i = 0; i < NROWS(global_rows); i++) {
        const struct codec_row *row = &global_rows[i];
        const char *const *values = row->values;
        const char *none[] = { NULL };
        double sum = 0;

        if (row->kind != STATS_COUNTER)
            continue;
        family_name(fam, sizeof(fam), "redlockd_", row);
        for (const char *const *v = values ? values : none;
             v == none || *v; v++) {
            json_t *cell = stats_cell(st, row, *v);
            double m;

            series_name(series, sizeof(series), fam, row, *v);
            m = sample(r.body, series);
            ck_assert_msg(m >= 0, "/metrics has no %s", series);
            sum += m;
            if (row->view != T_SUM)
                ck_assert_msg(json_is_integer(cell) &&
                              m == (double)json_integer_value(cell),
                              "%s is %g, STATS %s %s is %lld", series, m,
                              row->key, *v ? *v : "",
                              (long long)json_integer_value(cell));
            checked++;
            if (v == none)
                break;
        }
        /* A SUM row: STATS has the total of the family's series. */
        if (row->view == T_SUM)
            ck_assert_msg(sum == (double)h_json_int(st, row->key),
                          "%s sums to %g, STATS %s is %lld", fam, sum,
                          row->key, (long long)h_json_int(st, row->key));
    }
    ck_assert_msg(checked > 10, "only %d counters compared", checked);
    ck_assert_msg(h_json_int(json_object_get(st, "acquisitions"), "ok") >= 1,
                  "no acquisition counted");
    json_decref(st);
    http_free(&r);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("metrics");

    h_cluster_fixture(tc, &K, NNODES, true);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, h_slow() ? 150 : 30);
    tcase_add_test(tc, metrics_format_and_counters);
    tcase_add_test(tc, healthz_follows_quorum);
    tcase_add_test(tc, errors_404_405_400);
    tcase_add_test(tc, head_like_get);
    tcase_add_test(tc, head_in_pieces);
    tcase_add_test(tc, head_too_large_431);
    tcase_add_test(tc, slow_head_408);
    tcase_add_test(tc, half_close_after_request);
    tcase_add_test(tc, connection_cap);
    tcase_add_test(tc, metrics_every_family_typed);
    tcase_add_test(tc, codec_rows_in_stats_and_metrics);
    tcase_add_test(tc, counters_agree);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(metrics_suite());
}
