/*
 * stats: see stats.h.
 *
 * This file holds the descriptor tables generated from the codec, the
 * providers, and the JSON view (STATS). The Prometheus view is metrics.c.
 */
#include "stats.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "timer.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- label and bucket sets --------------------------------------------- */

#define STATS_LABEL_VALUE(value, help) #value,
#define STATS_LABEL_HELP(value, help) help,
static const char *const result_values[] = {
    STATS_RESULT_LABELS(STATS_LABEL_VALUE)
};
static const char *const result_help[] = {
    STATS_RESULT_LABELS(STATS_LABEL_HELP)
};
#undef STATS_LABEL_VALUE
#undef STATS_LABEL_HELP

const struct stats_labels stats_labels_result = {
    "result", STATS_RESULT_N, result_values, result_help, true,
};

static const double latency_le[] = { STATS_LATENCY_BOUNDS };
static_assert(NELEM(latency_le) < STATS_HIST_MAX,
              "STATS_HIST_MAX too small for STATS_LATENCY_BOUNDS");

const struct stats_buckets stats_buckets_latency = {
    NELEM(latency_le), latency_le,
};

/* ---- descriptor tables ------------------------------------------------- */

#define STATS_ROW_STRUCT struct stats_values
static const struct stats_desc global_rows[] = {
    STATS_CODEC(STATS_ROW_DESC)
};
#undef STATS_ROW_STRUCT

#define STATS_ROW_STRUCT struct stats_node
static const struct stats_desc node_rows[] = {
    STATS_NODE_CODEC(STATS_NODE_ROW_DESC)
};
#undef STATS_ROW_STRUCT

const struct stats_table stats_table = { global_rows, NELEM(global_rows) };
const struct stats_table stats_node_table = { node_rows, NELEM(node_rows) };

/* ---- values and providers ---------------------------------------------- */

struct stats_values stats;

static struct {
    uint64_t started_at;            /* timer_now() ms */
    size_t nproviders;
    struct {
        stats_collect_fn *collect;
        void *ud;
    } providers[STATS_PROVIDERS_MAX];
} S;

void stats_init(void)
{
    stats = (struct stats_values){ 0 };
    S.nproviders = 0;
    S.started_at = timer_now();
}

int stats_provider_add(stats_collect_fn *collect, void *ud)
{
    if (S.nproviders == STATS_PROVIDERS_MAX)
        return -1;
    S.providers[S.nproviders].collect = collect;
    S.providers[S.nproviders].ud = ud;
    S.nproviders++;
    return 0;
}

void stats_collect(struct stats_values *v)
{
    *v = stats;
    v->nodes = NULL;
    v->nnodes = 0;
    v->nodes_json = NULL;
    v->uptime_ms = (double)(timer_now() - S.started_at);
    for (size_t i = 0; i < S.nproviders; i++)
        S.providers[i].collect(v, S.providers[i].ud);
}

void stats_values_deinit(struct stats_values *v)
{
    for (size_t i = 0; i < v->nnodes; i++)
        free(v->nodes[i].name);
    free(v->nodes);
    json_decref(v->nodes_json);
    v->nodes = NULL;
    v->nnodes = 0;
    v->nodes_json = NULL;
}

/* Every gauge of the row table t at base to NaN ("not reported"). */
static void stats_table_clear_gauges(const struct stats_table *t, void *base)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct stats_desc *d = &t->rows[i];
        size_t ncells = d->labels ? d->labels->n : 1;
        double *cell = (double *)((char *)base + d->offset);

        if (d->kind != STATS_GAUGE)
            continue;
        for (size_t k = 0; k < ncells; k++)
            cell[k] = NAN;
    }
}

struct stats_node *stats_nodes_alloc(struct stats_values *v, size_t n)
{
    v->nodes = mem_alloc(n * sizeof(*v->nodes));
    v->nnodes = n;
    for (size_t i = 0; i < n; i++)
        stats_table_clear_gauges(&stats_node_table, &v->nodes[i]);
    return v->nodes;
}

void stats_node_set_name(struct stats_node *n, const char *name)
{
    size_t len = strlen(name);

    free(n->name);
    n->name = mem_alloc(len + 1);
    memcpy(n->name, name, len + 1);
}

void stats_hist_observe(struct stats_hist *h, const struct stats_buckets *b,
                        double seconds)
{
    size_t i = 0;

    while (i < b->n && seconds > b->le[i])
        i++;
    h->in[i]++;
    h->count++;
    h->sum += seconds;
}

/* ---- JSON view --------------------------------------------------------- */

/* Whole numbers as JSON integers, so readers that want an integer (most
 * gauges are counts) get one. */
static json_t *stats_gauge_json(double v)
{
    if (v == floor(v) && fabs(v) < 9007199254740992.0)     /* 2^53 */
        return json_integer((json_int_t)v);
    return json_real(v);
}

static json_t *stats_hist_json(const struct stats_hist *h,
                               const struct stats_buckets *b)
{
    json_t *le = json_array();
    json_t *cum = json_array();
    uint64_t sum = 0;

    for (size_t i = 0; i <= b->n; i++) {
        sum += h->in[i];
        if (i < b->n)
            json_array_append_new(le, json_real(b->le[i]));
        json_array_append_new(cum, json_integer((json_int_t)sum));
    }
    return json_pack("{s:I, s:f, s:o, s:o}", "count", (json_int_t)h->count,
                     "sum", h->sum, "le", le, "buckets", cum);
}

/* Cell k of row d at base, or NULL for a gauge that is not reported. */
static json_t *stats_cell_json(const struct stats_desc *d, const void *base,
                               size_t k)
{
    const char *p = (const char *)base + d->offset;

    switch (d->kind) {
    case STATS_COUNTER:
        return json_integer((json_int_t)((const uint64_t *)p)[k]);
    case STATS_GAUGE:
        if (isnan(((const double *)p)[k]))
            return NULL;
        return stats_gauge_json(((const double *)p)[k]);
    case STATS_HISTOGRAM:
        return stats_hist_json(&((const struct stats_hist *)p)[k], d->buckets);
    }
    return NULL;
}

static void stats_set_cell(json_t *obj, const char *key, json_t *v)
{
    if (v)
        json_object_set_new(obj, key, v);
}

void stats_table_json(const struct stats_table *t, const void *base,
                      json_t *obj)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct stats_desc *d = &t->rows[i];
        json_t *sub;

        if (!d->labels) {
            stats_set_cell(obj, d->key, stats_cell_json(d, base, 0));
            continue;
        }
        sub = json_object();
        for (size_t k = 0; k < d->labels->n; k++)
            stats_set_cell(sub, d->labels->values[k],
                           stats_cell_json(d, base, k));
        json_object_set_new(obj, d->key, sub);
    }
}

static void stats_cell_read(const struct stats_desc *d, const json_t *v,
                            void *base, size_t k)
{
    char *p = (char *)base + d->offset;

    if (d->kind == STATS_COUNTER)
        ((uint64_t *)p)[k] = json_is_integer(v) && json_integer_value(v) > 0
                             ? (uint64_t)json_integer_value(v) : 0;
    else if (d->kind == STATS_GAUGE && json_is_boolean(v))
        ((double *)p)[k] = json_is_true(v) ? 1 : 0;
    else if (d->kind == STATS_GAUGE)
        ((double *)p)[k] = json_is_number(v) ? json_number_value(v) : NAN;
}

void stats_table_read_json(const struct stats_table *t, const json_t *obj,
                           void *base)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct stats_desc *d = &t->rows[i];
        const json_t *v = json_object_get(obj, d->key);

        if (!d->labels) {
            stats_cell_read(d, v, base, 0);
            continue;
        }
        for (size_t k = 0; k < d->labels->n; k++)
            stats_cell_read(d, json_object_get(v, d->labels->values[k]),
                            base, k);
    }
}

json_t *stats_values_json(const struct stats_values *v)
{
    json_t *o = json_object();

    json_object_set_new(o, "version", json_string(REDLOCKD_VERSION));
    stats_table_json(&stats_table, v, o);
    json_object_set_new(o, "nodes", v->nodes_json
                        ? json_incref(v->nodes_json) : json_array());
    return o;
}

json_t *stats_json(void)
{
    struct stats_values v;
    json_t *o;

    stats_collect(&v);
    o = stats_values_json(&v);
    stats_values_deinit(&v);
    return o;
}
