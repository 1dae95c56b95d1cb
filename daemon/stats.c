/*
 * stats: see stats.h.
 *
 * This file holds the descriptor tables generated from the codec, the
 * providers, the observation points, the process's numbers (/proc/self),
 * and the JSON view (STATS). The Prometheus view is metrics.c.
 */
#include "stats.h"

#include <assert.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"
#include "timer.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- label and bucket sets --------------------------------------------- */

#define STATS_LABEL_VALUE(value) #value,
static const char *const result_values[] = {
    STATS_RESULT_LABELS(STATS_LABEL_VALUE)
};
static const char *const waited_values[] = {
    STATS_WAITED_LABELS(STATS_LABEL_VALUE)
};
static const char *const cause_values[] = {
    STATS_CAUSE_LABELS(STATS_LABEL_VALUE)
};
static const char *const tlsfail_values[] = {
    STATS_TLSFAIL_LABELS(STATS_LABEL_VALUE)
};
#undef STATS_LABEL_VALUE

#define STATS_COMMAND_VALUE(name, word, usage) [PROTO_CMD_##name] = word,
static const char *const command_values[STATS_COMMAND_N] = {
    [PROTO_CMD_NONE] = "other",
    PROTO_COMMANDS(STATS_COMMAND_VALUE)
};
#undef STATS_COMMAND_VALUE

#define STATS_ERROR_VALUE(name, word, msg) [PROTO_ERR_##name] = word,
static const char *const error_values[STATS_ERROR_N] = {
    [PROTO_ERR_NONE] = "other",
    PROTO_ERRORS(STATS_ERROR_VALUE)
};
#undef STATS_ERROR_VALUE

const struct stats_labels stats_labels_result = {
    "result", STATS_RESULT_N, result_values, STATS_JSON_OBJECT,
};
const struct stats_labels stats_labels_waited = {
    "result", STATS_WAITED_N, waited_values, STATS_JSON_OBJECT,
};
const struct stats_labels stats_labels_cause = {
    "cause", STATS_CAUSE_N, cause_values, STATS_JSON_FLAT,
};
const struct stats_labels stats_labels_tlsfail = {
    "reason", STATS_TLSFAIL_N, tlsfail_values, STATS_JSON_OBJECT,
};
const struct stats_labels stats_labels_command = {
    "command", STATS_COMMAND_N, command_values, STATS_JSON_SUM,
};
const struct stats_labels stats_labels_error = {
    "code", STATS_ERROR_N, error_values, STATS_JSON_SUM,
};

static const double latency_le[] = { STATS_LATENCY_BOUNDS };
static const double duration_le[] = { STATS_DURATION_BOUNDS };
static_assert(NELEM(latency_le) < STATS_HIST_MAX,
              "STATS_HIST_MAX too small for STATS_LATENCY_BOUNDS");
static_assert(NELEM(duration_le) < STATS_HIST_MAX,
              "STATS_HIST_MAX too small for STATS_DURATION_BOUNDS");

const struct stats_buckets stats_buckets_latency = {
    NELEM(latency_le), latency_le,
};
const struct stats_buckets stats_buckets_duration = {
    NELEM(duration_le), duration_le,
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

#define STATS_ROW_STRUCT struct stats_process
static const struct stats_desc process_rows[] = {
    STATS_PROCESS_CODEC(STATS_ROW_DESC)
};
#undef STATS_ROW_STRUCT

#define STATS_ROW_STRUCT struct stats_class
static const struct stats_desc class_rows[] = {
    STATS_CLASS_CODEC(STATS_ROW_DESC)
};
#undef STATS_ROW_STRUCT

const struct stats_table stats_table = {
    "redlockd_", global_rows, NELEM(global_rows),
};
const struct stats_table stats_node_table = {
    "redlockd_", node_rows, NELEM(node_rows),
};
const struct stats_table stats_process_table = {
    "process_", process_rows, NELEM(process_rows),
};
const struct stats_table stats_class_table = {
    "redlockd_", class_rows, NELEM(class_rows),
};

/* ---- values and providers ---------------------------------------------- */

/* The histograms of STATS_CODEC that the observation points fill; every
 * other field stays 0 here, and the providers fill it on each report's
 * copy. */
static struct stats_values stats;

static struct {
    uint64_t started_at;            /* timer_now() ms */
    double start_time_ms;           /* the process's, Unix ms; NaN unknown */
    size_t nproviders;
    struct {
        stats_collect_fn *collect;
        void *ud;
    } providers[STATS_PROVIDERS_MAX];
    struct stats_hist *node_req;    /* (owned) per node index */
    size_t nnode_req;
    struct stats_class *classes;    /* (owned) per class index, unnamed */
    size_t nclasses;
} reg;

static double stats_process_start_ms(void);

void stats_init(void)
{
    stats = (struct stats_values){ 0 };
    reg.nproviders = 0;
    reg.started_at = timer_now();
    reg.start_time_ms = stats_process_start_ms();
    free(reg.node_req);
    reg.node_req = NULL;
    reg.nnode_req = 0;
    stats_classes_reset();
}

int stats_provider_add(stats_collect_fn *collect, void *ud)
{
    if (reg.nproviders == STATS_PROVIDERS_MAX)
        return -1;
    reg.providers[reg.nproviders].collect = collect;
    reg.providers[reg.nproviders].ud = ud;
    reg.nproviders++;
    return 0;
}

static void stats_process_read(struct stats_process *p);

void stats_collect(struct stats_values *v)
{
    *v = stats;
    v->nodes = NULL;
    v->nnodes = 0;
    v->nodes_json = NULL;
    v->classes = NULL;
    v->nclasses = 0;
    v->uptime_ms = (double)(timer_now() - reg.started_at);
    stats_process_read(&v->process);
    for (size_t i = 0; i < reg.nproviders; i++)
        reg.providers[i].collect(v, reg.providers[i].ud);
}

void stats_values_deinit(struct stats_values *v)
{
    for (size_t i = 0; i < v->nnodes; i++) {
        free(v->nodes[i].name);
        free(v->nodes[i].why);
    }
    free(v->nodes);
    json_decref(v->nodes_json);
    free(v->classes);
    v->nodes = NULL;
    v->nnodes = 0;
    v->nodes_json = NULL;
    v->classes = NULL;
    v->nclasses = 0;
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

static char *stats_strdup(const char *s)
{
    size_t len = strlen(s);
    char *copy = mem_alloc(len + 1);

    memcpy(copy, s, len + 1);
    return copy;
}

void stats_node_set_name(struct stats_node *n, const char *name)
{
    free(n->name);
    n->name = stats_strdup(name);
}

void stats_node_set_why(struct stats_node *n, const char *why)
{
    free(n->why);
    n->why = stats_strdup(why);
}

void stats_hist_observe(struct stats_hist *h, const struct stats_buckets *b,
                        double seconds)
{
    size_t i = 0;

    /* A clock step can make a duration negative; NaN would poison sum. */
    if (!(seconds >= 0))
        seconds = 0;
    while (i < b->n && seconds > b->le[i])
        i++;
    h->in[i]++;
    h->count++;
    h->sum += seconds;
}

/* ---- observation points ------------------------------------------------ */

/* The bucket sets here are the rows' dims in STATS_CODEC. */
void stats_observe_lock(bool waited, double seconds)
{
    if (waited)
        stats_hist_observe(&stats.wait_seconds, &stats_buckets_duration,
                           seconds);
    else
        stats_hist_observe(&stats.acquire_seconds, &stats_buckets_latency,
                           seconds);
}

void stats_observe_hold(double seconds)
{
    stats_hist_observe(&stats.hold_seconds, &stats_buckets_duration, seconds);
}

void stats_observe_node_request(int node, double seconds)
{
    if (node < 0)
        return;
    if ((size_t)node >= reg.nnode_req) {
        size_t n = (size_t)node + 1;

        reg.node_req = mem_realloc(reg.node_req, n * sizeof(*reg.node_req));
        memset(reg.node_req + reg.nnode_req, 0,
               (n - reg.nnode_req) * sizeof(*reg.node_req));
        reg.nnode_req = n;
    }
    stats_hist_observe(&reg.node_req[node], &stats_buckets_latency, seconds);
}

const struct stats_hist *stats_node_request_hist(int node)
{
    if (node < 0 || (size_t)node >= reg.nnode_req)
        return NULL;
    return &reg.node_req[node];
}

/* Class cls's cells, made (zero) up to it: classes are named as locks
 * meet them. */
static struct stats_class *stats_class_at(size_t cls)
{
    if (cls >= reg.nclasses) {
        size_t n = cls + 1;

        reg.classes = mem_realloc(reg.classes, n * sizeof(*reg.classes));
        memset(reg.classes + reg.nclasses, 0,
               (n - reg.nclasses) * sizeof(*reg.classes));
        reg.nclasses = n;
    }
    return &reg.classes[cls];
}

/* The bucket sets here are the rows' dims in STATS_CLASS_CODEC. */
void stats_observe_class_wait(size_t cls, bool granted, double seconds)
{
    stats_hist_observe(&stats_class_at(cls)->wait_seconds[
                           granted ? STATS_WAITED_granted
                                   : STATS_WAITED_timeout],
                       &stats_buckets_duration, seconds);
}

void stats_observe_class_hold(size_t cls, double seconds)
{
    stats_hist_observe(&stats_class_at(cls)->hold_seconds,
                       &stats_buckets_duration, seconds);
}

void stats_classes_reset(void)
{
    free(reg.classes);
    reg.classes = NULL;
    reg.nclasses = 0;
}

struct stats_class *stats_classes_alloc(struct stats_values *v, size_t n)
{
    size_t have = n < reg.nclasses ? n : reg.nclasses;

    v->classes = mem_alloc((n ? n : 1) * sizeof(*v->classes));
    v->nclasses = n;
    if (have)
        memcpy(v->classes, reg.classes, have * sizeof(*v->classes));
    return v->classes;
}

/* ---- the process (/proc/self) ------------------------------------------ */

/* /proc/self/stat is one line: the pid, the command name in parentheses
 * (at most 16 bytes, but it may hold spaces and parentheses), then 50
 * numbers of at most 20 digits. */
#define STATS_PROC_STAT_MAX 2048

/* The fields of /proc/self/stat we read, numbered as in proc(5). */
enum {
    PROC_STAT_UTIME = 14,
    PROC_STAT_STIME = 15,
    PROC_STAT_STARTTIME = 22,
    PROC_STAT_VSIZE = 23,
    PROC_STAT_RSS = 24,
    PROC_STAT_LAST = PROC_STAT_RSS,
};

/* Fields 3..PROC_STAT_LAST of /proc/self/stat into f[3..], or -1. */
static int stats_proc_stat(unsigned long long f[PROC_STAT_LAST + 1])
{
    char buf[STATS_PROC_STAT_MAX];
    FILE *fp = fopen("/proc/self/stat", "r");
    size_t n;
    char *p;

    if (!fp)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    /* Field 3, the state, is a letter; the rest are numbers. */
    while (*p == ' ')
        p++;
    if (*p == '\0')
        return -1;
    p++;
    for (int i = 4; i <= PROC_STAT_LAST; i++) {
        char *end;

        f[i] = strtoull(p, &end, 10);
        if (end == p)
            return -1;
        p = end;
    }
    return 0;
}

/* When the process started, in Unix ms: boot time (/proc/stat btime) plus
 * its start in clock ticks after boot. Now, if /proc cannot say. */
static double stats_process_start_ms(void)
{
    unsigned long long f[PROC_STAT_LAST + 1], btime = 0;
    long ticks = sysconf(_SC_CLK_TCK);
    bool have_btime = false;
    char line[256];
    struct timespec now;
    FILE *fp = fopen("/proc/stat", "r");

    while (fp && !have_btime && fgets(line, sizeof(line), fp))
        have_btime = sscanf(line, "btime %llu", &btime) == 1;
    if (fp)
        fclose(fp);
    if (have_btime && ticks > 0 && stats_proc_stat(f) == 0)
        return (double)btime * 1000 +
               (double)f[PROC_STAT_STARTTIME] * 1000 / (double)ticks;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec * 1000 + (double)(now.tv_nsec / 1000000);
}

/* Open descriptors: the entries of /proc/self/fd, less the one reading
 * it. NaN when it cannot be read. */
static double stats_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    double n = 0;

    if (!d)
        return NAN;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

static void stats_process_read(struct stats_process *p)
{
    unsigned long long f[PROC_STAT_LAST + 1];
    long ticks = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    struct rlimit rl;

    stats_table_clear_gauges(&stats_process_table, p);
    p->cpu_ms = 0;
    p->start_time_ms = reg.start_time_ms;
    p->open_fds = stats_open_fds();
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        p->max_fds = (double)rl.rlim_cur;
    if (stats_proc_stat(f) != 0)
        return;
    if (ticks > 0)
        p->cpu_ms = (f[PROC_STAT_UTIME] + f[PROC_STAT_STIME]) * 1000 /
                    (unsigned long long)ticks;
    p->virtual_memory_bytes = (double)f[PROC_STAT_VSIZE];
    if (page > 0)
        p->resident_memory_bytes = (double)f[PROC_STAT_RSS] * (double)page;
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

json_t *stats_hist_json(const struct stats_hist *h,
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

/* The most a FLAT cell's key takes: the field, "_", the label value. */
#define STATS_KEY_MAX 64

static void stats_flat_key(char *key, const struct stats_desc *d, size_t k)
{
    int n = snprintf(key, STATS_KEY_MAX, "%s_%s", d->key,
                     d->labels->values[k]);

    assert(n > 0 && n < STATS_KEY_MAX);
    (void)n;
}

/* A SUM row: the total of its counter cells. */
static json_t *stats_sum_json(const struct stats_desc *d, const void *base)
{
    const uint64_t *cell = (const uint64_t *)((const char *)base + d->offset);
    uint64_t sum = 0;

    assert(d->kind == STATS_COUNTER);
    for (size_t k = 0; k < d->labels->n; k++)
        sum += cell[k];
    return json_integer((json_int_t)sum);
}

static void stats_row_json(const struct stats_desc *d, const void *base,
                           json_t *obj)
{
    char key[STATS_KEY_MAX];
    json_t *sub;

    if (!d->labels) {
        stats_set_cell(obj, d->key, stats_cell_json(d, base, 0));
        return;
    }
    switch (d->labels->json) {
    case STATS_JSON_OBJECT:
        sub = json_object();
        for (size_t k = 0; k < d->labels->n; k++)
            stats_set_cell(sub, d->labels->values[k],
                           stats_cell_json(d, base, k));
        json_object_set_new(obj, d->key, sub);
        break;
    case STATS_JSON_FLAT:
        for (size_t k = 0; k < d->labels->n; k++) {
            stats_flat_key(key, d, k);
            stats_set_cell(obj, key, stats_cell_json(d, base, k));
        }
        break;
    case STATS_JSON_SUM:
        json_object_set_new(obj, d->key, stats_sum_json(d, base));
        break;
    }
}

void stats_table_json(const struct stats_table *t, const void *base,
                      json_t *obj)
{
    for (size_t i = 0; i < t->n; i++)
        stats_row_json(&t->rows[i], base, obj);
}

/* {"<class>": {every STATS_CLASS_CODEC row}, ...}, in class order. */
static json_t *stats_classes_json(const struct stats_values *v)
{
    json_t *o = json_object();

    for (size_t i = 0; i < v->nclasses; i++) {
        json_t *c = json_object();

        stats_table_json(&stats_class_table, &v->classes[i], c);
        json_object_set_new(o, v->classes[i].name, c);
    }
    return o;
}

json_t *stats_values_json(const struct stats_values *v)
{
    json_t *o = json_object();
    json_t *proc;

    json_object_set_new(o, "version", json_string(REDLOCKD_VERSION));
    stats_table_json(&stats_table, v, o);
    json_object_set_new(o, "nodes", v->nodes_json
                        ? json_incref(v->nodes_json) : json_array());
    proc = json_object();
    stats_table_json(&stats_process_table, &v->process, proc);
    json_object_set_new(o, "process", proc);
    json_object_set_new(o, "classes", stats_classes_json(v));
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
