/*
 * test_stats: the stats codec (daemon/stats.h) and its two views, the
 * STATS JSON (stats.c) and the Prometheus text (metrics.c).
 *
 * The daemon's own lists are checked against the STATS keys tools read
 * today, written out here by hand on purpose: a renamed row must fail
 * this test. A small list of the test's own, built with the same
 * generators, covers what the daemon does not use yet: a counter with a
 * label and a histogram. (The endpoint's HTTP server is test_httpd.c.)
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "metrics.h"
#include "sbuf.h"
#include "stats.h"
#include "timer.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- a codec of the test's own ----------------------------------------- */

#define TEST_COLOR_LABELS(V) V(red) V(blue)
#define TEST_SHAPE_LABELS(V) V(round) V(square)

#define TEST_LABEL_ENUM(value) TEST_##value,
enum { TEST_COLOR_LABELS(TEST_LABEL_ENUM) TEST_COLOR_N };
enum { TEST_SHAPE_LABELS(TEST_LABEL_ENUM) TEST_SHAPE_N };
#define TEST_LABEL_VALUE(value) #value,
static const char *const color_values[] = {
    TEST_COLOR_LABELS(TEST_LABEL_VALUE)
};
static const char *const shape_values[] = {
    TEST_SHAPE_LABELS(TEST_LABEL_VALUE)
};
/* The same values three ways in STATS: an object, flat keys, a sum. */
static const struct stats_labels color_labels = {
    "color", TEST_COLOR_N, color_values, STATS_JSON_OBJECT,
};
static const struct stats_labels shape_labels = {
    "shape", TEST_SHAPE_N, shape_values, STATS_JSON_FLAT,
};
static const struct stats_labels tone_labels = {
    "tone", TEST_COLOR_N, color_values, STATS_JSON_SUM,
};

/* Binary fractions, so sums and bounds print exactly. */
static const double tiny_le[] = { 0.015625, 0.125, 1 };
static const struct stats_buckets tiny_buckets = { NELEM(tiny_le), tiny_le };

#define STATS_CELLS_COLOR(type, field) type field[TEST_COLOR_N];
#define STATS_LABELS_COLOR (&color_labels)
#define STATS_BUCKETS_COLOR NULL
#define STATS_CELLS_SHAPE(type, field) type field[TEST_SHAPE_N];
#define STATS_LABELS_SHAPE (&shape_labels)
#define STATS_BUCKETS_SHAPE NULL
#define STATS_CELLS_TONE(type, field) type field[TEST_COLOR_N];
#define STATS_LABELS_TONE (&tone_labels)
#define STATS_BUCKETS_TONE NULL
#define STATS_CELLS_TINY(type, field) type field;
#define STATS_LABELS_TINY NULL
#define STATS_BUCKETS_TINY (&tiny_buckets)

#define TEST_CODEC(X)                                                        \
    X(hits, COUNTER, ONE, COLOR, "hits", "Hits, by color.")                  \
    X(wait, HISTOGRAM, SECONDS, TINY, "wait_seconds", "Time spent waiting.") \
    X(level_ms, GAUGE, MS, NONE, "level_seconds", "A level.")                \
    X(busy_ms, COUNTER, MS, NONE, "busy_seconds", "Time busy, a \\ and a\nline.") \
    X(shapes, COUNTER, ONE, SHAPE, "shapes", "Shapes, by shape.")            \
    X(tones, COUNTER, ONE, TONE, "tones", "Tones, by tone.")

struct test_values {
    TEST_CODEC(STATS_ROW_FIELD)
};

#define STATS_ROW_STRUCT struct test_values
static const struct stats_desc test_rows[] = { TEST_CODEC(STATS_ROW_DESC) };
#undef STATS_ROW_STRUCT
static const struct stats_table test_table = {
    "redlockd_", test_rows, NELEM(test_rows),
};

static struct test_values test_sample(void)
{
    struct test_values v = { .level_ms = 1500, .busy_ms = 2250 };

    v.hits[TEST_red] = 3;
    v.hits[TEST_blue] = 4;
    v.shapes[TEST_round] = 1;
    v.tones[TEST_red] = 5;
    v.tones[TEST_blue] = 6;
    stats_hist_observe(&v.wait, &tiny_buckets, 0.0078125);
    stats_hist_observe(&v.wait, &tiny_buckets, 0.5);
    stats_hist_observe(&v.wait, &tiny_buckets, 2);
    return v;
}

static void setup(void)
{
    timer_sys_init(uv_default_loop());
    stats_init();
}

static void teardown(void)
{
    timer_sys_deinit();
    uv_run(uv_default_loop(), UV_RUN_DEFAULT);
}

/* ---- Prometheus text ---------------------------------------------------- */

START_TEST(prometheus_labelled_counter_and_histogram)
{
    static const char expect[] =
        "# HELP redlockd_hits_total Hits, by color.\n"
        "# TYPE redlockd_hits_total counter\n"
        "redlockd_hits_total{color=\"red\"} 3\n"
        "redlockd_hits_total{color=\"blue\"} 4\n"
        "# HELP redlockd_wait_seconds Time spent waiting.\n"
        "# TYPE redlockd_wait_seconds histogram\n"
        "redlockd_wait_seconds_bucket{le=\"0.015625\"} 1\n"
        "redlockd_wait_seconds_bucket{le=\"0.125\"} 1\n"
        "redlockd_wait_seconds_bucket{le=\"1\"} 2\n"
        "redlockd_wait_seconds_bucket{le=\"+Inf\"} 3\n"
        "redlockd_wait_seconds_sum 2.5078125\n"
        "redlockd_wait_seconds_count 3\n"
        "# HELP redlockd_level_seconds A level.\n"
        "# TYPE redlockd_level_seconds gauge\n"
        "redlockd_level_seconds 1.5\n"
        "# HELP redlockd_busy_seconds_total Time busy, a \\\\ and a\\nline.\n"
        "# TYPE redlockd_busy_seconds_total counter\n"
        "redlockd_busy_seconds_total 2.25\n"
        "# HELP redlockd_shapes_total Shapes, by shape.\n"
        "# TYPE redlockd_shapes_total counter\n"
        "redlockd_shapes_total{shape=\"round\"} 1\n"
        "redlockd_shapes_total{shape=\"square\"} 0\n"
        "# HELP redlockd_tones_total Tones, by tone.\n"
        "# TYPE redlockd_tones_total counter\n"
        "redlockd_tones_total{tone=\"red\"} 5\n"
        "redlockd_tones_total{tone=\"blue\"} 6\n";
    struct test_values v = test_sample();
    struct metrics_instance one = { &v, NULL };
    struct sbuf b = SBUF_INIT;

    metrics_format_table(&b, &test_table, NULL, &one, 1);
    ck_assert_str_eq(sbuf_cstr(&b), expect);
    sbuf_deinit(&b);
}
END_TEST

/* With an instance label (the node's), every sample carries it first, and
 * an instance's NaN gauge has no sample. */
START_TEST(prometheus_instance_label)
{
    static const char expect[] =
        "# HELP redlockd_hits_total Hits, by color.\n"
        "# TYPE redlockd_hits_total counter\n"
        "redlockd_hits_total{node=\"a\",color=\"red\"} 3\n"
        "redlockd_hits_total{node=\"a\",color=\"blue\"} 4\n"
        "redlockd_hits_total{node=\"q\\\"\\\\\\n\",color=\"red\"} 0\n"
        "redlockd_hits_total{node=\"q\\\"\\\\\\n\",color=\"blue\"} 0\n"
        "# HELP redlockd_wait_seconds Time spent waiting.\n"
        "# TYPE redlockd_wait_seconds histogram\n"
        "redlockd_wait_seconds_bucket{node=\"a\",le=\"0.015625\"} 1\n";
    struct test_values v[2] = { test_sample(), { .level_ms = NAN } };
    struct metrics_instance inst[2] = { { &v[0], "a" }, { &v[1], "q\"\\\n" } };
    struct sbuf b = SBUF_INIT;
    const char *text;

    metrics_format_table(&b, &test_table, "node", inst, 2);
    text = sbuf_cstr(&b);
    ck_assert_msg(strncmp(text, expect, strlen(expect)) == 0, "got:\n%s", text);
    ck_assert_msg(strstr(text, "redlockd_wait_seconds_count{node=\"a\"} 3\n")
                  != NULL, "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_level_seconds{node=\"a\"} 1.5\n")
                  != NULL, "got:\n%s", text);
    ck_assert_msg(!strstr(text, "level_seconds{node=\"q"),
                  "a NaN gauge was exported:\n%s", text);
    sbuf_deinit(&b);
}
END_TEST

/* Buckets are upper bounds, inclusive; beyond the last is +Inf. */
START_TEST(histogram_buckets)
{
    static const struct { double seconds; size_t bucket; } cases[] = {
        { 0, 0 }, { 0.015625, 0 }, { 0.016, 1 }, { 0.125, 1 }, { 1, 2 },
        { 1.5, 3 }, { 1e9, 3 },
    };

    for (size_t i = 0; i < NELEM(cases); i++) {
        struct stats_hist h = { 0 };

        stats_hist_observe(&h, &tiny_buckets, cases[i].seconds);
        ck_assert_msg(h.in[cases[i].bucket] == 1 && h.count == 1,
                      "%g s not in bucket %zu", cases[i].seconds,
                      cases[i].bucket);
        ck_assert(h.sum == cases[i].seconds);
    }
}
END_TEST

/* ---- JSON --------------------------------------------------------------- */

START_TEST(json_labelled_and_histogram)
{
    struct test_values v = test_sample();
    json_t *o = json_object();
    char *text;

    stats_table_json(&test_table, &v, o);
    text = json_dumps(o, JSON_COMPACT);
    ck_assert_str_eq(text, "{\"hits\":{\"red\":3,\"blue\":4},"
                     "\"wait\":{\"count\":3,\"sum\":2.5078125,"
                     "\"le\":[0.015625,0.125,1.0],"
                     "\"buckets\":[1,1,2,3]},\"level_ms\":1500,"
                     "\"busy_ms\":2250,\"shapes_round\":1,"
                     "\"shapes_square\":0,\"tones\":11}");
    free(text);
    json_decref(o);
}
END_TEST

/* The STATS keys tools read today, in order, then the ones added since
 * (at the end, so the old order holds). */
static const char *const stats_keys[] = {
    "version", "uptime_ms", "connections", "connections_total",
    "connections_rejected", "sessions", "commands", "errors", "locks_held",
    "waiters", "acquisitions", "releases", "extends", "renewals",
    "renewal_failures", "leases_lost", "waits", "wakeups_notified",
    "wakeups_retry", "output_overflows", "nodes_total", "nodes_voting",
    "quorum", "sessions_detached", "adopts", "adopts_left",
    "acquire_seconds", "wait_seconds", "hold_seconds", "tls_handshakes",
    "tls_handshake_failures", "nodes", "process", "classes",
};
static const char *const acquisition_keys[] = {
    "ok", "busy", "timeout", "unavailable",
};
static const char *const histogram_keys[] = {
    "acquire_seconds", "wait_seconds", "hold_seconds",
};
static const char *const process_keys[] = {
    "start_time_ms", "cpu_ms", "resident_memory_bytes",
    "virtual_memory_bytes", "open_fds", "max_fds",
};

static bool is_one_of(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0)
            return true;
    return false;
}

/* Counts as stats_glue.c copies them from the modules that own them
 * (sessions: commands and errors; server: connections accepted). */
struct counts {
    uint64_t other, lock, busy, lost, accepted;
};

static void provide_counts(struct stats_values *v, void *ud)
{
    const struct counts *c = ud;

    v->commands[PROTO_CMD_NONE] = c->other;
    v->commands[PROTO_CMD_LOCK] = c->lock;
    v->errors[PROTO_ERR_BUSY] = c->busy;
    v->errors[PROTO_ERR_LOST] = c->lost;
    v->connections_total = c->accepted;
}

static void provide(struct stats_values *v, void *ud)
{
    struct stats_node *n = stats_nodes_alloc(v, 1);

    v->acquisitions[STATS_RESULT_busy] = *(uint64_t *)ud;
    v->wakeups[STATS_CAUSE_retry] = 2;
    v->nodes_voting = 1;
    stats_node_set_name(n, "127.0.0.1:6379");
    stats_node_set_why(n, "down: connection refused");
    n->requests = 9;
    n->latency_ms = 0.25;
    stats_hist_observe(&n->request_seconds, &stats_buckets_latency, 0.0003);
    v->nodes_json = json_pack("[{s:s}]", "node", "127.0.0.1:6379");
}

START_TEST(stats_json_shape)
{
    uint64_t busy = 7;
    json_t *o, *v;
    const char *key;
    size_t i = 0;
    struct counts counts = { .other = 5, .lock = 1, .busy = 1, .lost = 1 };

    ck_assert_int_eq(stats_provider_add(provide_counts, &counts), 0);
    ck_assert_int_eq(stats_provider_add(provide, &busy), 0);
    o = stats_json();
    json_object_foreach(o, key, v) {
        ck_assert_msg(i < NELEM(stats_keys), "extra STATS key %s", key);
        ck_assert_str_eq(key, stats_keys[i]);
        if (strcmp(key, "version") == 0)
            ck_assert(json_is_string(v));
        else if (strcmp(key, "nodes") == 0)
            ck_assert_int_eq(json_array_size(v), 1);
        else if (is_one_of(key, histogram_keys, NELEM(histogram_keys)))
            ck_assert(json_is_integer(json_object_get(v, "count")));
        else if (strcmp(key, "process") == 0)
            ck_assert_int_eq(json_object_size(v), NELEM(process_keys));
        else if (strcmp(key, "classes") == 0)
            ck_assert(json_is_object(v));
        else if (strcmp(key, "tls_handshake_failures") == 0)
            ck_assert_int_eq(json_object_size(v), STATS_TLSFAIL_N);
        else if (strcmp(key, "acquisitions") != 0)
            ck_assert_msg(json_is_integer(v), "%s not an integer", key);
        i++;
    }
    ck_assert_int_eq(i, NELEM(stats_keys));
    v = json_object_get(o, "acquisitions");
    ck_assert_int_eq(json_object_size(v), NELEM(acquisition_keys));
    for (i = 0; i < NELEM(acquisition_keys); i++)
        ck_assert(json_is_integer(json_object_get(v, acquisition_keys[i])));
    ck_assert_int_eq(json_integer_value(json_object_get(v, "busy")), 7);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "commands")), 6);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "errors")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "wakeups_retry")),
                     2);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "nodes_voting")), 1);
    v = json_object_get(o, "process");
    for (i = 0; i < NELEM(process_keys); i++)
        ck_assert_msg(json_is_integer(json_object_get(v, process_keys[i])),
                      "process %s not an integer", process_keys[i]);
    json_decref(o);
}
END_TEST

/* The daemon's codec in Prometheus: one family per row with its label,
 * node rows carry the node label, MS values become seconds, and the
 * process's families have their standard names. */
START_TEST(daemon_prometheus)
{
    uint64_t busy = 7;
    struct stats_values v;
    struct sbuf b = SBUF_INIT;
    const char *text;
    struct counts counts = { .other = 2, .lock = 2, .busy = 1,
                             .accepted = 2 };

    stats_provider_add(provide_counts, &counts);
    stats_provider_add(provide, &busy);
    stats_collect(&v);
    metrics_format(&b, &v);
    stats_values_deinit(&v);
    text = sbuf_cstr(&b);
    ck_assert_msg(strstr(text,
        "# TYPE redlockd_acquisitions_total counter\n"
        "redlockd_acquisitions_total{result=\"ok\"} 0\n"
        "redlockd_acquisitions_total{result=\"busy\"} 7\n"
        "redlockd_acquisitions_total{result=\"timeout\"} 0\n"
        "redlockd_acquisitions_total{result=\"unavailable\"} 0\n"),
        "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "# TYPE redlockd_wakeups_total counter\n"
        "redlockd_wakeups_total{cause=\"notified\"} 0\n"
        "redlockd_wakeups_total{cause=\"retry\"} 2\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "# TYPE redlockd_commands_total counter\n"
        "redlockd_commands_total{command=\"other\"} 2\n"
        "redlockd_commands_total{command=\"PING\"} 0\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "\nredlockd_commands_total{command=\"LOCK\"} 2\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "\nredlockd_commands_total{command=\"QUIT\"} 0\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "\nredlockd_errors_total{code=\"BUSY\"} 1\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "\nredlockd_errors_total{code=\"SHUTDOWN\"} 0\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_connections_total 2\n"),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_node_requests_total"
                         "{node=\"127.0.0.1:6379\"} 9\n"),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_node_latency_seconds"
                         "{node=\"127.0.0.1:6379\"} 0.00025\n"),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text,
        "# TYPE redlockd_node_request_seconds histogram\n"
        "redlockd_node_request_seconds_bucket"
        "{node=\"127.0.0.1:6379\",le=\"0.0001\"} 0\n"
        "redlockd_node_request_seconds_bucket"
        "{node=\"127.0.0.1:6379\",le=\"0.00025\"} 0\n"
        "redlockd_node_request_seconds_bucket"
        "{node=\"127.0.0.1:6379\",le=\"0.0005\"} 1\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text, "# TYPE redlockd_acquire_seconds histogram\n"
                         "redlockd_acquire_seconds_bucket{le=\"0.0001\"} 0\n"),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text, "# TYPE redlockd_hold_seconds histogram\n"
                         "redlockd_hold_seconds_bucket{le=\"0.001\"} 0\n"),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text, "\n# TYPE process_cpu_seconds_total counter\n"
                         "process_cpu_seconds_total "), "got:\n%s", text);
    ck_assert_msg(strstr(text, "\n# TYPE process_start_time_seconds gauge\n"
                         "process_start_time_seconds "), "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nprocess_resident_memory_bytes "),
                  "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nprocess_open_fds "), "got:\n%s", text);
    ck_assert_msg(!strstr(text, "rejoin_in"), "got:\n%s", text);
    ck_assert_msg(!strstr(text, "untyped"), "got:\n%s", text);
    ck_assert_msg(!strstr(text, "acquisitions_ok"), "got:\n%s", text);
    sbuf_deinit(&b);
}
END_TEST

/* The observation points fill the codec's histograms: a LOCK without a
 * wait counts in acquire_seconds, one with a wait in wait_seconds; hold
 * times and per-node reply times have their own. */
START_TEST(observation_points)
{
    const struct stats_hist *h;
    struct stats_values v;

    ck_assert_ptr_null(stats_node_request_hist(0));
    stats_observe_lock(false, 0.0004);
    stats_observe_lock(true, 12);
    stats_observe_lock(true, -1);           /* a clock step: 0 */
    stats_observe_hold(90);
    stats_observe_node_request(2, 0.002);
    stats_observe_node_request(-1, 0.002);  /* ignored */
    stats_collect(&v);
    ck_assert_uint_eq(v.acquire_seconds.count, 1);
    ck_assert(v.acquire_seconds.sum == 0.0004);
    ck_assert_uint_eq(v.acquire_seconds.in[2], 1);      /* le 0.0005 */
    ck_assert_uint_eq(v.wait_seconds.count, 2);
    ck_assert(v.wait_seconds.sum == 12);
    ck_assert_uint_eq(v.wait_seconds.in[0], 1);         /* the 0 */
    ck_assert_uint_eq(v.wait_seconds.in[8], 1);         /* le 30 */
    ck_assert_uint_eq(v.hold_seconds.in[10], 1);        /* le 300 */
    stats_values_deinit(&v);
    ck_assert_ptr_null(stats_node_request_hist(3));
    ck_assert_uint_eq(stats_node_request_hist(0)->count, 0);
    h = stats_node_request_hist(2);
    ck_assert(h && h->count == 1 && h->in[4] == 1);     /* le 0.0025 */
    stats_init();
    ck_assert_ptr_null(stats_node_request_hist(2));
}
END_TEST

/* Three classes named, as stats_glue names them from rclass. */
static void provide_classes(struct stats_values *v, void *ud)
{
    static const char *const names[] = { "other", "job:", "a\"b\\" };
    struct stats_class *c = stats_classes_alloc(v, NELEM(names));

    (void)ud;
    for (size_t i = 0; i < NELEM(names); i++)
        c[i].name = names[i];
}

/* Per class: waits by result and holds, in STATS under "classes" and in
 * /metrics with a class label (escaped), every named class from the
 * start; a reset starts them over. */
START_TEST(class_histograms)
{
    struct sbuf b = SBUF_INIT;
    struct stats_values v;
    json_t *o, *job, *w;
    const char *text;

    stats_provider_add(provide_classes, NULL);
    stats_observe_class_wait(1, true, 0.0005);
    stats_observe_class_wait(1, true, 0.25);
    stats_observe_class_wait(1, false, 5);
    stats_observe_class_hold(0, 2);
    stats_observe_class_hold(7, 1);          /* no name: not reported */
    o = stats_json();
    job = json_object_get(json_object_get(o, "classes"), "job:");
    w = json_object_get(job, "wait_seconds");
    ck_assert_int_eq(json_integer_value(json_object_get(
        json_object_get(w, "granted"), "count")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(
        json_object_get(w, "timeout"), "count")), 1);
    ck_assert(json_real_value(json_object_get(json_object_get(w, "timeout"),
                                              "sum")) == 5);
    ck_assert_int_eq(json_integer_value(json_object_get(
        json_object_get(job, "hold_seconds"), "count")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(
        json_object_get(json_object_get(o, "classes"), "other"),
        "hold_seconds"), "count")), 1);
    ck_assert_int_eq(json_object_size(json_object_get(o, "classes")), 3);
    json_decref(o);

    stats_collect(&v);
    metrics_format(&b, &v);
    stats_values_deinit(&v);
    text = sbuf_cstr(&b);
    ck_assert_msg(strstr(text,
        "# TYPE redlockd_lock_wait_seconds histogram\n"
        "redlockd_lock_wait_seconds_bucket"
        "{class=\"other\",result=\"granted\",le=\"0.001\"} 0\n"),
        "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_lock_wait_seconds_bucket"
        "{class=\"job:\",result=\"granted\",le=\"0.001\"} 1\n"
        "redlockd_lock_wait_seconds_bucket"
        "{class=\"job:\",result=\"granted\",le=\"0.01\"} 1\n"), "got:\n%s",
        text);
    ck_assert_msg(strstr(text, "\nredlockd_lock_wait_seconds_count"
        "{class=\"job:\",result=\"timeout\"} 1\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_lock_hold_seconds_count"
        "{class=\"other\"} 1\n"), "got:\n%s", text);
    ck_assert_msg(strstr(text, "\nredlockd_lock_hold_seconds_count"
        "{class=\"a\\\"b\\\\\"} 0\n"), "got:\n%s", text);
    sbuf_deinit(&b);

    stats_classes_reset();
    stats_collect(&v);
    ck_assert_uint_eq(v.nclasses, 3);
    ck_assert_uint_eq(v.classes[1].wait_seconds[STATS_WAITED_granted].count,
                      0);
    stats_values_deinit(&v);
}
END_TEST

/* The process's numbers are this process's, and plausible. */
START_TEST(process_numbers)
{
    struct stats_values v;
    struct timespec now;
    double now_ms;
    int fd = dup(0);

    clock_gettime(CLOCK_REALTIME, &now);
    now_ms = (double)now.tv_sec * 1000;
    stats_collect(&v);
    ck_assert_msg(v.process.start_time_ms <= now_ms + 1000 &&
                  v.process.start_time_ms > now_ms - 86400000.0,
                  "start %f, now %f", v.process.start_time_ms, now_ms);
    ck_assert(v.process.resident_memory_bytes > 1024 * 1024);
    ck_assert(v.process.virtual_memory_bytes >= v.process.resident_memory_bytes);
    ck_assert_msg(v.process.open_fds >= 4 && v.process.open_fds < 1000,
                  "open fds %f", v.process.open_fds);
    ck_assert(v.process.max_fds >= v.process.open_fds || isnan(v.process.max_fds));
    stats_values_deinit(&v);
    close(fd);
    stats_collect(&v);
    ck_assert(v.process.open_fds >= 3);
    stats_values_deinit(&v);
}
END_TEST

static void count_calls(struct stats_values *v, void *ud)
{
    (void)v;
    (*(int *)ud)++;
}

START_TEST(providers_bounded_and_reset)
{
    struct stats_values v;
    int calls = 0;

    for (int i = 0; i < STATS_PROVIDERS_MAX; i++)
        ck_assert_int_eq(stats_provider_add(count_calls, &calls), 0);
    ck_assert_int_eq(stats_provider_add(count_calls, &calls), -1);
    stats_collect(&v);
    stats_values_deinit(&v);
    ck_assert_int_eq(calls, STATS_PROVIDERS_MAX);
    stats_init();
    stats_collect(&v);
    stats_values_deinit(&v);
    ck_assert_int_eq(calls, STATS_PROVIDERS_MAX);
}
END_TEST

static Suite *stats_suite(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("codec");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, prometheus_labelled_counter_and_histogram);
    tcase_add_test(tc, prometheus_instance_label);
    tcase_add_test(tc, histogram_buckets);
    tcase_add_test(tc, json_labelled_and_histogram);
    tcase_add_test(tc, stats_json_shape);
    tcase_add_test(tc, daemon_prometheus);
    tcase_add_test(tc, observation_points);
    tcase_add_test(tc, class_histograms);
    tcase_add_test(tc, process_numbers);
    tcase_add_test(tc, providers_bounded_and_reset);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(stats_suite());
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
