/*
 * metrics: see metrics.h.
 *
 * The exposition is a walk over the stats codec's tables (stats.h): each
 * row is a family whose name, type and help come from the row, so nothing
 * here knows a STATS key and nothing is exported as "untyped". /healthz
 * asks metrics_healthy(), which reads the node rows voting and
 * answered_recently, each node's why, and quorum, from the same values.
 * Both routes collect one report per request; httpd does the rest.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "httpd.h"
#include "log.h"
#include "mem.h"
#include "sbuf.h"
#include "stats.h"

#define METRICS_WHY_MAX 1024            /* the /healthz reason header's value */
#define METRICS_WHY_HEADER "X-Redlockd-Why: "

#define METRICS_CTYPE_PROM "text/plain; version=0.0.4; charset=utf-8"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static struct httpd *metrics_httpd;    /* (owned) NULL when not serving */

/* ---- exposition -------------------------------------------------------- */

/* One family of the exposition: a codec row, named with its table's
 * prefix. Its # HELP and # TYPE go out before its first sample. */
struct metrics_family {
    const char *prefix;
    const struct stats_desc *d;
    bool header_done;
};

static void metrics_put_name(struct sbuf *b, const struct metrics_family *f,
                             const char *suffix)
{
    sbuf_printf(b, "%s%s", f->prefix, f->d->metric);
    if (f->d->kind == STATS_COUNTER)
        sbuf_puts(b, "_total");
    sbuf_puts(b, suffix);
}

/* Backslash and line feed escaped, and with quote the double quote too:
 * # HELP text escapes the first two, label values (any UTF-8) all three. */
static void metrics_put_escaped(struct sbuf *b, const char *s, bool quote)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            sbuf_puts(b, "\\\\");
        else if (*s == '\n')
            sbuf_puts(b, "\\n");
        else if (quote && *s == '"')
            sbuf_puts(b, "\\\"");
        else
            sbuf_putc(b, *s);
    }
}

static void metrics_put_header(struct sbuf *b, struct metrics_family *f)
{
    static const char *const types[] = {
        [STATS_COUNTER] = "counter",
        [STATS_GAUGE] = "gauge",
        [STATS_HISTOGRAM] = "histogram",
    };

    if (f->header_done)
        return;
    f->header_done = true;
    sbuf_puts(b, "# HELP ");
    metrics_put_name(b, f, " ");
    metrics_put_escaped(b, f->d->help, false);
    sbuf_puts(b, "\n# TYPE ");
    metrics_put_name(b, f, " ");
    sbuf_printf(b, "%s\n", types[f->d->kind]);
}

/* The shortest of 15 or 17 significant digits that reads back as d: a
 * Unix time in seconds keeps its milliseconds, 0.00025 stays 0.00025. */
static void metrics_put_shortest(struct sbuf *b, double d)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%.15g", d);
    if (strtod(buf, NULL) != d)
        snprintf(buf, sizeof(buf), "%.17g", d);
    sbuf_puts(b, buf);
}

static void metrics_put_number(struct sbuf *b, double d)
{
    if (isnan(d))
        sbuf_puts(b, "NaN");
    else if (isinf(d))
        sbuf_puts(b, d > 0 ? "+Inf" : "-Inf");
    else if (d == floor(d) && fabs(d) < 1e15)
        sbuf_printf(b, "%.0f", d);
    else
        metrics_put_shortest(b, d);
}

/* A sample's labels, in order; a pair whose value is NULL is left out. */
struct metrics_labels {
    const char *name[3];
    const char *value[3];
};

static void metrics_put_labels(struct sbuf *b, const struct metrics_labels *l)
{
    char sep = '{';

    for (size_t i = 0; i < NELEM(l->name); i++) {
        if (!l->value[i])
            continue;
        sbuf_printf(b, "%c%s=\"", sep, l->name[i]);
        metrics_put_escaped(b, l->value[i], true);
        sbuf_putc(b, '"');
        sep = ',';
    }
    if (sep == ',')
        sbuf_putc(b, '}');
}

/* A histogram cell: cumulative buckets up to +Inf, then _sum and _count.
 * l->value[2] is the slot for le. */
static void metrics_put_hist(struct sbuf *b, const struct metrics_family *f,
                             struct metrics_labels *l,
                             const struct stats_hist *h)
{
    const struct stats_buckets *bk = f->d->buckets;
    uint64_t cum = 0;
    char le[32];

    l->name[2] = "le";
    for (size_t i = 0; i <= bk->n; i++) {
        cum += h->in[i];
        if (i < bk->n)
            snprintf(le, sizeof(le), "%.9g", bk->le[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        l->value[2] = le;
        metrics_put_name(b, f, "_bucket");
        metrics_put_labels(b, l);
        sbuf_printf(b, " %" PRIu64 "\n", cum);
    }
    l->value[2] = NULL;
    metrics_put_name(b, f, "_sum");
    metrics_put_labels(b, l);
    sbuf_putc(b, ' ');
    metrics_put_number(b, h->sum);
    sbuf_putc(b, '\n');
    metrics_put_name(b, f, "_count");
    metrics_put_labels(b, l);
    sbuf_printf(b, " %" PRIu64 "\n", h->count);
}

/* Cell k of f's row at base, under the labels l; a gauge that is not
 * reported (NaN) has no sample. */
static void metrics_put_cell(struct sbuf *b, struct metrics_family *f,
                             struct metrics_labels *l, const void *base,
                             size_t k)
{
    const char *p = (const char *)base + f->d->offset;
    double g;

    if (f->d->kind == STATS_GAUGE && isnan(((const double *)p)[k]))
        return;
    metrics_put_header(b, f);
    if (f->d->kind == STATS_HISTOGRAM) {
        metrics_put_hist(b, f, l, &((const struct stats_hist *)p)[k]);
        return;
    }
    metrics_put_name(b, f, "");
    metrics_put_labels(b, l);
    sbuf_putc(b, ' ');
    if (f->d->kind == STATS_COUNTER && f->d->unit != STATS_UNIT_MS) {
        sbuf_printf(b, "%" PRIu64, ((const uint64_t *)p)[k]);
    } else {
        g = f->d->kind == STATS_COUNTER ? (double)((const uint64_t *)p)[k]
                                        : ((const double *)p)[k];
        /* Base units: milliseconds go out as seconds. */
        metrics_put_number(b, f->d->unit == STATS_UNIT_MS ? g / 1000 : g);
    }
    sbuf_putc(b, '\n');
}

/* Every sample of one family, instance by instance: the text format wants
 * the lines of a family together. */
static void metrics_put_family(struct sbuf *b, struct metrics_family *f,
                               const char *label,
                               const struct metrics_instance *inst, size_t n)
{
    const struct stats_labels *ls = f->d->labels;
    struct metrics_labels l = { { label, NULL, NULL }, { NULL, NULL, NULL } };

    for (size_t i = 0; i < n; i++) {
        l.value[0] = label ? inst[i].label_value : NULL;
        if (!ls) {
            metrics_put_cell(b, f, &l, inst[i].base, 0);
        } else {
            l.name[1] = ls->name;
            for (size_t k = 0; k < ls->n; k++) {
                l.value[1] = ls->values[k];
                metrics_put_cell(b, f, &l, inst[i].base, k);
            }
            l.value[1] = NULL;
        }
    }
}

void metrics_format_table(struct sbuf *b, const struct stats_table *t,
                          const char *label,
                          const struct metrics_instance *inst, size_t n)
{
    for (size_t i = 0; i < t->n; i++) {
        struct metrics_family f = { t->prefix, &t->rows[i], false };

        metrics_put_family(b, &f, label, inst, n);
    }
}

void metrics_format(struct sbuf *b, const struct stats_values *v)
{
    struct metrics_instance global = { v, NULL };
    struct metrics_instance *nodes = mem_alloc((v->nnodes + 1) *
                                               sizeof(*nodes));
    struct metrics_instance *classes = mem_alloc((v->nclasses + 1) *
                                                 sizeof(*classes));

    sbuf_puts(b, "# HELP redlockd_build_info The running redlockd version, "
                 "as a label; the value is always 1.\n"
                 "# TYPE redlockd_build_info gauge\n"
                 "redlockd_build_info{version=\"");
    metrics_put_escaped(b, REDLOCKD_VERSION, true);
    sbuf_puts(b, "\"} 1\n");
    metrics_format_table(b, &stats_table, NULL, &global, 1);
    for (size_t i = 0; i < v->nclasses; i++) {
        classes[i].base = &v->classes[i];
        classes[i].label_value = v->classes[i].name;
    }
    metrics_format_table(b, &stats_class_table, "class", classes,
                         v->nclasses);
    free(classes);
    for (size_t i = 0; i < v->nnodes; i++) {
        nodes[i].base = &v->nodes[i];
        nodes[i].label_value = v->nodes[i].name;
    }
    metrics_format_table(b, &stats_node_table, "node", nodes, v->nnodes);
    free(nodes);
    global.base = &v->process;
    metrics_format_table(b, &stats_process_table, NULL, &global, 1);
}

static void metrics_render(struct sbuf *b)
{
    struct stats_values v;

    stats_collect(&v);
    metrics_format(b, &v);
    stats_values_deinit(&v);
}

/*
 * Healthy while a quorum of nodes vote and answered recently (within
 * redis.probe_interval_ms + command_timeout_ms, as node reports it): a node
 * that froze without traffic counts as gone at once, before its probe's
 * deadline fails it. When not, `why` gets the nodes' own explanations
 * (STATS "why"), one line, for a response header.
 */
static bool metrics_healthy(char *why, size_t size)
{
    struct stats_values v;
    size_t len = 0;
    int fresh = 0;

    stats_collect(&v);
    for (size_t i = 0; i < v.nnodes; i++)
        fresh += v.nodes[i].voting == 1 && v.nodes[i].answered_recently == 1;
    bool ok = fresh >= v.quorum;
    why[0] = '\0';
    for (size_t i = 0; i < v.nnodes && !ok && len < size; i++) {
        const struct stats_node *n = &v.nodes[i];

        if (!n->why || !*n->why)
            continue;
        int k = snprintf(why + len, size - len, "%s%s is %s", len ? "; " : "",
                         n->name, n->why);
        if (k > 0)
            len += (size_t)k;
    }
    for (char *p = why; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            *p = '?';
    stats_values_deinit(&v);
    return ok;
}

/* ---- the routes -------------------------------------------------------- */

static void metrics_serve_metrics(struct httpd_reply *reply)
{
    /* HEAD too: its Content-Length is the body's it does not get. */
    reply->ctype = METRICS_CTYPE_PROM;
    metrics_render(&reply->body);
}

static void metrics_serve_health(struct httpd_reply *reply)
{
    char why[METRICS_WHY_MAX];

    if (metrics_healthy(why, sizeof(why))) {
        sbuf_puts(&reply->body, "ok\n");
        return;
    }
    /* The body stays "no quorum" for checks that compare it; the reason
     * (a node recovering until when, or down and why) goes in a header. */
    reply->status = "503 Service Unavailable";
    sbuf_printf(&reply->headers, "%s%s\r\n", METRICS_WHY_HEADER,
                why[0] ? why : "too few nodes answered recently");
    sbuf_puts(&reply->body, "no quorum\n");
}

static const struct httpd_route metrics_routes[] = {
    { "/metrics", metrics_serve_metrics },
    { "/healthz", metrics_serve_health },
};

/* ---- start and stop ---------------------------------------------------- */

int metrics_start(uv_loop_t *loop, const struct conf_addr *addr)
{
    struct sockaddr_storage ss;
    bool v6;
    int rc;

    if (addr->kind != CONF_ADDR_TCP) {
        log_error("metrics.listen: %s: must be a TCP HOST:PORT", addr->text);
        return -1;
    }
    v6 = strchr(addr->host, ':');
    rc = v6 ? uv_ip6_addr(addr->host, addr->port, (struct sockaddr_in6 *)&ss)
            : uv_ip4_addr(addr->host, addr->port, (struct sockaddr_in *)&ss);
    if (rc != 0) {
        log_error("metrics.listen: %s: %s", addr->text, uv_strerror(rc));
        return -1;
    }
    rc = httpd_create(&metrics_httpd, loop, (const struct sockaddr *)&ss,
                      "metrics", metrics_routes, NELEM(metrics_routes));
    if (rc != 0) {
        log_error("metrics.listen: cannot listen on %s: %s", addr->text,
                  uv_strerror(rc));
        return -1;
    }
    log_notice("metrics on http://%s/metrics", addr->text);
    return 0;
}

void metrics_stop(void)
{
    if (metrics_httpd)
        httpd_destroy(metrics_httpd);
    metrics_httpd = NULL;
}
