/*
 * conf: loads the daemon's JSON configuration file (docs/configuration.md).
 *
 * One jansson tree goes through three passes:
 *   1. walk:     every key in the file must name a row of conf_keys[] or a
 *                section holding such rows; anything else is an error.
 *   2. apply:    rows are applied in table order, so the first error
 *                reported does not depend on the order of keys in the
 *                file: the JSON type first (conf_types[]), then what
 *                the row's type checks itself (range, syntax).
 *   3. validate: the rules that involve more than one key.
 * conf_init() takes its defaults from the same table, so a default cannot
 * drift away from the range that checks it.
 */
#include "conf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>
#include <sys/stat.h>

#include <jansson.h>

#include "addr.h"
#include "proto.h"
#include "num.h"
#include "rclass.h"
#include "users.h"

#define CONF_FILE_MAX (1024 * 1024)  /* a config file is a few KiB */
#define CONF_ADDRS_MAX 64
#define CONF_SECRET_MAX 512
#define CONF_NAME_MAX 256
#define CONF_PATH_MAX 4096    /* PATH_MAX */
#define CONF_MS_MAX 2147483647LL     /* protocol durations fit in 32 bits */
#define CONF_STR_(x) #x
#define CONF_STR(x) CONF_STR_(x)

enum conf_type {
    CONF_T_UINT,        /* unsigned, JSON integer in [min, max] */
    CONF_T_INT,         /* int, JSON integer in [min, max] */
    CONF_T_BOOL,
    CONF_T_NUMBER,      /* double, JSON number in [min, dmax) */
    CONF_T_STRING,      /* char *, length in [min, max] */
    CONF_T_SECRET_FILE, /* char *: the first line of the named file */
    CONF_T_MODE,        /* unsigned, octal string */
    CONF_T_LEVEL,       /* int, log level name */
    CONF_T_ADDRS,       /* struct conf_addr * + size_t count */
    CONF_T_ADDR,        /* struct conf_addr *, or NULL */
    CONF_T_USERS,       /* struct users_user * + size_t count (users.h) */
    CONF_T_CLASSES,     /* char ** + size_t count: "prefix" (NULL), or a
                           list of resource name prefixes (rclass.h) */
};

/* String rules (flags of CONF_T_STRING and CONF_T_SECRET_FILE rows). */
#define CONF_S_NULL 0x1     /* null means "not set" */
#define CONF_S_WORD 0x2     /* no spaces: clients send it as one word */

struct conf_key {
    const char *key;        /* full path, "limits.max_line" */
    enum conf_type type;
    size_t off;             /* the field in struct conf */
    size_t count_off;       /* CONF_T_ADDRS: the count field */
    long long min, max;     /* value, string bytes or list entries */
    long long ival;         /* default of integer-like types */
    double dval, dmax;      /* CONF_T_NUMBER: default, exclusive maximum */
    const char *sval;       /* default string or address */
    unsigned flags;         /* CONF_S_*, or PROTO_ADDR_ALLOW_* for addresses */
};

#define F(field) offsetof(struct conf, field)
#define K_UINT(k, fld, def, lo, hi) \
    { .key = k, .type = CONF_T_UINT, .off = F(fld), .min = lo, .max = hi, \
      .ival = def }
#define K_STR(k, fld, def, lo, hi, fl) \
    { .key = k, .type = CONF_T_STRING, .off = F(fld), .min = lo, .max = hi, \
      .sval = def, .flags = fl }
#define K_SECRET(k, fld, fl) \
    { .key = k, .type = CONF_T_SECRET_FILE, .off = F(fld), .min = 1, \
      .max = CONF_SECRET_MAX, .flags = fl }
#define K_ADDRS(k, fld, cnt, def, fl) \
    { .key = k, .type = CONF_T_ADDRS, .off = F(fld), .count_off = F(cnt), \
      .min = 1, .max = CONF_ADDRS_MAX, .sval = def, .flags = fl }

/*
 * A *_file row must come after the row it fills, so that it can tell that
 * both were given (see conf_apply_secret_file).
 */
static const struct conf_key conf_keys[] = {
    K_STR("id", id, NULL, 1, CONF_ID_MAX, CONF_S_NULL | CONF_S_WORD),
    K_ADDRS("listen", listen, nlisten,
            "tcp://127.0.0.1:" CONF_STR(PROTO_DEFAULT_PORT),
            PROTO_ADDR_FOR_LISTEN),
    { .key = "unix_socket_mode", .type = CONF_T_MODE,
      .off = F(unix_socket_mode), .min = 0, .max = 0777, .ival = 0660 },

    K_ADDRS("redis.nodes", redis.nodes, redis.nnodes, "127.0.0.1:6379",
            PROTO_ADDR_FOR_NODE),
    K_STR("redis.username", redis.username, NULL, 1, CONF_NAME_MAX,
          CONF_S_NULL | CONF_S_WORD),
    K_STR("redis.password", redis.password, NULL, 1, CONF_SECRET_MAX,
          CONF_S_NULL),
    K_SECRET("redis.password_file", redis.password, 0),
    { .key = "redis.db", .type = CONF_T_INT, .off = F(redis.db),
      .min = 0, .max = 1000, .ival = 0 },
    K_UINT("redis.pool_size", redis.pool_size, 2, 1, 64),
    K_UINT("redis.connect_timeout_ms", redis.connect_timeout_ms, 1000,
           1, 600000),
    K_UINT("redis.command_timeout_ms", redis.command_timeout_ms, 100,
           1, 600000),
    K_UINT("redis.reconnect_max_ms", redis.reconnect_max_ms, 5000,
           1, 3600000),
    K_UINT("redis.probe_interval_ms", redis.probe_interval_ms, 1000,
           10, 600000),
    K_UINT("redis.batch_keys_in_flight", redis.batch_keys_in_flight, 65536,
           1, 16777216),
    K_UINT("redis.group_max", redis.group_max, 32, 1, CONF_GROUP_MAX),

    K_STR("locks.key_prefix", locks.key_prefix, "lock:", 0, 128, 0),
    K_STR("locks.fence_key", locks.fence_key, "redlockd:fence",
          1, CONF_NAME_MAX, 0),
    K_STR("locks.release_channel", locks.release_channel, "redlockd:released",
          1, CONF_NAME_MAX, 0),
    K_UINT("locks.default_ttl_ms", locks.default_ttl_ms, 30000,
           10, CONF_MS_MAX),
    K_UINT("locks.min_ttl_ms", locks.min_ttl_ms, 100, 10, CONF_MS_MAX),
    K_UINT("locks.max_ttl_ms", locks.max_ttl_ms, 86400000, 10, CONF_MS_MAX),
    K_UINT("locks.max_wait_ms", locks.max_wait_ms, 3600000, 0, CONF_MS_MAX),
    { .key = "locks.drift_factor", .type = CONF_T_NUMBER,
      .off = F(locks.drift_factor), .min = 0, .dval = 0.01, .dmax = 0.5 },
    K_UINT("locks.lock_delay_ms", locks.lock_delay_ms, 0, 0, 86400000),
    K_UINT("locks.max_resource_len", locks.max_resource_len,
           PROTO_RESOURCE_LEN_DEFAULT, 1, PROTO_RESOURCE_LEN_MAX),
    K_UINT("locks.retry_ms", locks.retry_ms, 500, 10, 600000),
    K_UINT("locks.max_limit", locks.max_limit, 1024, 1, CONF_MAX_LIMIT),
    K_UINT("locks.max_multi", locks.max_multi, 16, 1, CONF_MAX_MULTI),
    K_UINT("locks.max_value_len", locks.max_value_len,
           PROTO_VALUE_LEN_DEFAULT, 1, PROTO_VALUE_LEN_MAX),
    K_UINT("locks.watch_poll_ms", locks.watch_poll_ms, 1000, 0, CONF_MS_MAX),

    K_UINT("limits.max_clients", limits.max_clients, 10000, 1, 1000000),
    K_UINT("limits.max_line", limits.max_line, 4096, 64, 1048576),
    K_UINT("limits.max_locks_per_session", limits.max_locks_per_session,
           1024, 1, 1000000),
    K_UINT("limits.max_pipeline", limits.max_pipeline, 128, 1, 65536),
    K_UINT("limits.max_inflight", limits.max_inflight, 1024, 1, 1048576),
    K_UINT("limits.max_watches", limits.max_watches, 1024, 1, 1048576),
    K_UINT("limits.max_output_bytes", limits.max_output_bytes, 1048576,
           4096, 1073741824),
    K_UINT("limits.idle_timeout_ms", limits.idle_timeout_ms, 0,
           0, CONF_MS_MAX),
    K_UINT("limits.handshake_timeout_ms", limits.handshake_timeout_ms, 10000,
           0, 3600000),
    K_UINT("limits.max_clients_per_ip", limits.max_clients_per_ip, 0,
           0, 1000000),
    K_UINT("limits.max_waiters_per_resource",
           limits.max_waiters_per_resource, 0, 0, 1000000),
    K_UINT("limits.max_auth_failures", limits.max_auth_failures, 5,
           1, 1000000),
    K_UINT("limits.max_detach_ms", limits.max_detach_ms, 60000, 0,
           CONF_MS_MAX),

    K_STR("auth.password", auth.password, NULL, 1, CONF_SECRET_MAX,
          CONF_S_NULL | CONF_S_WORD),
    K_SECRET("auth.password_file", auth.password, CONF_S_WORD),
    K_STR("auth.admin_password", auth.admin_password, NULL, 1,
          CONF_SECRET_MAX, CONF_S_NULL | CONF_S_WORD),
    K_SECRET("auth.admin_password_file", auth.admin_password, CONF_S_WORD),
    { .key = "auth.protected_mode", .type = CONF_T_BOOL,
      .off = F(auth.protected_mode), .ival = 1 },
    /* After locks.* and limits.*: a user's prefixes and AUTH line are
     * checked against them. */
    { .key = "auth.users", .type = CONF_T_USERS, .off = F(auth.users),
      .count_off = F(auth.nusers), .min = 0, .max = USERS_MAX },

    K_STR("tls.cert_file", tls.cert_file, NULL, 1, CONF_PATH_MAX, CONF_S_NULL),
    K_STR("tls.key_file", tls.key_file, NULL, 1, CONF_PATH_MAX, CONF_S_NULL),
    K_STR("tls.ca_file", tls.ca_file, NULL, 1, CONF_PATH_MAX, CONF_S_NULL),
    { .key = "tls.verify_clients", .type = CONF_T_BOOL,
      .off = F(tls.verify_clients), .ival = 0 },
    K_STR("tls.min_version", tls.min_version, "1.2", 3, 3, 0),

    { .key = "metrics.listen", .type = CONF_T_ADDR, .off = F(metrics.listen),
      .flags = PROTO_ADDR_FOR_METRICS },
    /* After locks.*: a listed prefix is a resource name's start, checked
     * against locks.max_resource_len. */
    { .key = "metrics.resource_classes", .type = CONF_T_CLASSES,
      .off = F(metrics.resource_classes),
      .count_off = F(metrics.nresource_classes), .min = 0,
      .max = CONF_CLASSES_MAX },
    K_UINT("metrics.max_classes", metrics.max_classes, 32, 0,
           CONF_CLASSES_MAX),
    { .key = "log.level", .type = CONF_T_LEVEL, .off = F(log.level),
      .ival = CONF_LOG_INFO },
    K_UINT("shutdown_timeout_ms", shutdown_timeout_ms, 5000, 0, 3600000),
};

#define CONF_NKEYS (sizeof(conf_keys) / sizeof(conf_keys[0]))

/* The errors of values a mode or level row can not read, of whatever JSON
 * type. */
#define CONF_MODE_WRONG "expected an octal mode string such as \"0660\""
#define CONF_LEVEL_WRONG "must be one of debug, info, notice, warning, error"

/* Indexed by enum log_level_value. */
static const char *const conf_level_names[] = {
    "debug", "info", "notice", "warning", "error",
};

struct conf_loader {
    struct conf *c;
    const char *name;           /* file name for messages */
    char *err;
    size_t errlen;
    json_t *given[CONF_NKEYS];  /* (borrowed from the tree) value per row */
};

/* ---- messages ---------------------------------------------------------- */

/* One log line per message: a control byte from the file must not split it. */
static void conf_sanitize(char *s)
{
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
    }
}

static void conf_vmsg(char *err, size_t errlen, const char *prefix,
                      const char *fmt, va_list ap)
{
    size_t n;

    if (!err || errlen == 0)
        return;
    snprintf(err, errlen, "%s", prefix);
    n = strlen(err);
    if (n < errlen - 1)
        vsnprintf(err + n, errlen - n, fmt, ap);
    conf_sanitize(err);
}

static int conf_msg(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int conf_msg(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    conf_vmsg(err, errlen, "", fmt, ap);
    va_end(ap);
    return -1;
}

/* "NAME: KEY: message"; always returns -1. */
static int conf_fail(struct conf_loader *ld, const char *key,
                     const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int conf_fail(struct conf_loader *ld, const char *key,
                     const char *fmt, ...)
{
    char prefix[CONF_ERRLEN];
    va_list ap;

    if (key[0] == '\0')
        key = "\"\"";
    snprintf(prefix, sizeof(prefix), "%s: %s: ", ld->name, key);
    va_start(ap, fmt);
    conf_vmsg(ld->err, ld->errlen, prefix, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- addresses --------------------------------------------------------- */

void conf_addr_deinit(struct conf_addr *a)
{
    if (!a)
        return;
    free(a->host);
    free(a->path);
    free(a->text);
    memset(a, 0, sizeof(*a));
}

static void conf_addrs_free(struct conf_addr *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        conf_addr_deinit(&v[i]);
    free(v);
}

/* The conf_addr of a parsed address: its own copies, and the text as
 * written for logs and STATS. */
static int conf_addr_fill(struct conf_addr *a, const struct proto_addr *pa,
                          const char *text)
{
    if (pa->kind == PROTO_ADDR_KIND_UNIX) {
        a->kind = CONF_ADDR_UNIX;
        a->path = strdup(pa->path);
    } else {
        a->kind = CONF_ADDR_TCP;
        a->host = strdup(pa->host);
        a->port = pa->port;
        a->tls = pa->tls;
    }
    a->text = strdup(text);
    return a->text && (a->path || a->host) ? 0 : -1;
}

/* flags: PROTO_ADDR_ALLOW_* (the rows use the PROTO_ADDR_FOR_* sets). */
static int conf_addr_parse(struct conf_addr *a, const char *text,
                           unsigned flags, char *err, size_t errlen)
{
    struct proto_addr pa;
    enum proto_addr_err e;

    memset(a, 0, sizeof(*a));
    e = proto_addr_parse(&pa, text, flags);
    if (e != PROTO_ADDR_OK)
        return conf_msg(err, errlen, "\"%s\": %s", text,
                        proto_addr_strerror(e));
    if (conf_addr_fill(a, &pa, text) < 0) {
        conf_addr_deinit(a);
        return conf_msg(err, errlen, "\"%s\": out of memory", text);
    }
    return 0;
}

int conf_parse_addr(struct conf_addr *a, const char *text, bool allow_unix,
                    char *err, size_t errlen)
{
    unsigned flags = PROTO_ADDR_ALLOW_NAMES
                     | (allow_unix ? PROTO_ADDR_ALLOW_UNIX : 0);

    return conf_addr_parse(a, text, flags, err, errlen);
}

static bool conf_host_any(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
}

/* Would binding both fail, or mean the same place? A wildcard address
 * takes its port on every address of its family (IPv6 listeners are
 * IPv6-only). */
static bool conf_addr_same(const struct conf_addr *x,
                           const struct conf_addr *y)
{
    if (x->kind != y->kind)
        return false;
    if (x->kind == CONF_ADDR_UNIX)
        return strcmp(x->path, y->path) == 0;
    if (x->port != y->port)
        return false;
    if (strcasecmp(x->host, y->host) == 0)
        return true;
    bool v6x = strchr(x->host, ':'), v6y = strchr(y->host, ':');
    return v6x == v6y && (conf_host_any(x->host) || conf_host_any(y->host));
}

/* ---- defaults and teardown -------------------------------------------- */

static void *conf_field(struct conf *c, const struct conf_key *k)
{
    return (char *)c + k->off;
}

static int conf_default_addrs(struct conf *c, const struct conf_key *k)
{
    struct conf_addr *v = calloc(1, sizeof(*v));

    if (!v)
        return -1;
    if (conf_addr_parse(v, k->sval, k->flags, NULL, 0) < 0) {
        free(v);
        return -1;
    }
    *(struct conf_addr **)conf_field(c, k) = v;
    *(size_t *)((char *)c + k->count_off) = 1;
    return 0;
}

static int conf_default(struct conf *c, const struct conf_key *k)
{
    void *p = conf_field(c, k);

    switch (k->type) {
    case CONF_T_UINT:
    case CONF_T_MODE:
        *(unsigned *)p = (unsigned)k->ival;
        return 0;
    case CONF_T_INT:
    case CONF_T_LEVEL:
        *(int *)p = (int)k->ival;
        return 0;
    case CONF_T_BOOL:
        *(bool *)p = k->ival != 0;
        return 0;
    case CONF_T_NUMBER:
        *(double *)p = k->dval;
        return 0;
    case CONF_T_STRING:
        if (!k->sval)
            return 0;
        *(char **)p = strdup(k->sval);
        return !*(char **)p ? -1 : 0;
    case CONF_T_ADDRS:
        return conf_default_addrs(c, k);
    case CONF_T_SECRET_FILE:
    case CONF_T_ADDR:
    case CONF_T_USERS:
    case CONF_T_CLASSES:
        return 0;   /* their fields start out NULL (and 0) */
    }
    return -1;
}

/* Like conf_init, but says whether the default strings could be allocated. */
static int conf_defaults(struct conf *c)
{
    int rc = 0;

    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (conf_default(c, &conf_keys[i]) < 0)
            rc = -1;
    }
    return rc;
}

void conf_init(struct conf *c)
{
    /* On allocation failure the fields stay NULL; conf_load reports it. */
    (void)conf_defaults(c);
}

static void conf_strings_free(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

/* Secrets may end up in a core dump otherwise. */
static void conf_free_secret(char *s)
{
    if (!s)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}

void conf_deinit(struct conf *c)
{
    if (!c)
        return;
    free(c->path);
    conf_addrs_free(c->listen, c->nlisten);
    conf_addrs_free(c->redis.nodes, c->redis.nnodes);
    free(c->redis.username);
    conf_free_secret(c->redis.password);
    free(c->locks.key_prefix);
    free(c->locks.fence_key);
    free(c->locks.release_channel);
    conf_free_secret(c->auth.password);
    conf_free_secret(c->auth.admin_password);
    free(c->tls.cert_file);
    free(c->tls.key_file);
    free(c->tls.ca_file);
    free(c->tls.min_version);
    users_free(c->auth.users, c->auth.nusers);
    free(c->id);
    conf_addr_deinit(c->metrics.listen);
    free(c->metrics.listen);
    conf_strings_free(c->metrics.resource_classes,
                      c->metrics.nresource_classes);
    memset(c, 0, sizeof(*c));
}

/* ---- pass 1: walk ------------------------------------------------------ */

static int conf_find(const char *key)
{
    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (strcmp(conf_keys[i].key, key) == 0)
            return (int)i;
    }
    return -1;
}

static bool conf_is_section(const char *key)
{
    size_t n = strlen(key);

    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (strncmp(conf_keys[i].key, key, n) == 0 &&
            conf_keys[i].key[n] == '.')
            return true;
    }
    return false;
}

static int conf_walk(struct conf_loader *ld, json_t *obj, const char *prefix)
{
    char path[128];
    const char *k;
    json_t *v;
    bool dotted;
    int i;

    json_object_foreach(obj, k, v) {
        snprintf(path, sizeof(path), "%s%s%s", prefix,
                 prefix[0] != '\0' ? "." : "", k);
        /* A dotted key must not reach a nested row: "redis.db" at the top. */
        dotted = strchr(k, '.');
        i = dotted ? -1 : conf_find(path);
        if (i >= 0) {
            ld->given[i] = v;
        } else if (!dotted && prefix[0] == '\0' && conf_is_section(path)) {
            if (!json_is_object(v))
                return conf_fail(ld, path, "expected an object");
            if (conf_walk(ld, v, path) < 0)
                return -1;
        } else {
            return conf_fail(ld, path, "unknown key");
        }
    }
    return 0;
}

/* ---- pass 2: apply ----------------------------------------------------- */

static int conf_apply_integer(struct conf_loader *ld,
                              const struct conf_key *k, json_t *v)
{
    json_int_t n = json_integer_value(v);

    if (n < k->min || n > k->max)
        return conf_fail(ld, k->key, "must be between %lld and %lld",
                         k->min, k->max);
    if (k->type == CONF_T_INT)
        *(int *)conf_field(ld->c, k) = (int)n;
    else
        *(unsigned *)conf_field(ld->c, k) = (unsigned)n;
    return 0;
}

static int conf_apply_bool(struct conf_loader *ld, const struct conf_key *k,
                           json_t *v)
{
    *(bool *)conf_field(ld->c, k) = json_is_true(v);
    return 0;
}

static int conf_apply_number(struct conf_loader *ld,
                             const struct conf_key *k, json_t *v)
{
    double d = json_number_value(v);

    if (!(d >= (double)k->min && d < k->dmax))
        return conf_fail(ld, k->key, "must be at least %lld and below %g",
                         k->min, k->dmax);
    *(double *)conf_field(ld->c, k) = d;
    return 0;
}

/* The checks shared by strings written in the file and read from a file. */
static int conf_check_text(const struct conf_key *k, const char *s,
                           size_t len, char *why, size_t whylen)
{
    if ((long long)len < k->min || (long long)len > k->max)
        return conf_msg(why, whylen, "must be %lld to %lld bytes long",
                        k->min, k->max);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];

        if (ch < 0x20 || ch == 0x7f)
            return conf_msg(why, whylen,
                            "must not contain control characters");
        if (ch == ' ' && (k->flags & CONF_S_WORD))
            return conf_msg(why, whylen, "must not contain spaces");
    }
    return 0;
}

static int conf_apply_string(struct conf_loader *ld,
                             const struct conf_key *k, json_t *v)
{
    char **p = conf_field(ld->c, k);
    char why[128];
    char *s = NULL;

    if (json_is_string(v)) {
        if (conf_check_text(k, json_string_value(v), json_string_length(v),
                            why, sizeof(why)) < 0)
            return conf_fail(ld, k->key, "%s", why);
        s = strdup(json_string_value(v));
        if (!s)
            return conf_fail(ld, k->key, "out of memory");
    }
    conf_free_secret(*p);
    *p = s;
    return 0;
}

/*
 * The first line of `path` into buf, without its LF or CR LF. Reads at most
 * size - 1 bytes, so a huge or endless file (a device) cannot hurt.
 */
static int conf_read_line(const char *path, char *buf, size_t size,
                          char *why, size_t whylen)
{
    FILE *f = fopen(path, "re");
    size_t n;
    char *nl;

    if (!f)
        return conf_msg(why, whylen, "cannot open: %s", strerror(errno));
    n = fread(buf, 1, size - 1, f);
    if (ferror(f)) {
        conf_msg(why, whylen, "cannot read: %s", strerror(errno));
        fclose(f);
        return -1;
    }
    fclose(f);
    nl = memchr(buf, '\n', n);
    if (!nl && n == size - 1)
        return conf_msg(why, whylen, "the first line is too long");
    if (nl)
        n = (size_t)(nl - buf);
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    buf[n] = '\0';
    if (memchr(buf, '\0', n))
        return conf_msg(why, whylen, "the first line contains a NUL byte");
    if (n == 0)
        return conf_msg(why, whylen, "the first line is empty");
    return 0;
}

/* The secret in the first line of path, checked by rule k, into *out
 * (malloc'd); -1 with the reason in why (never the file's content). */
static int conf_read_secret(const char *path, const struct conf_key *k,
                            char **out, char *why, size_t whylen)
{
    char buf[CONF_SECRET_MAX + 3];      /* room for CR LF and the NUL */
    int rc;

    rc = conf_read_line(path, buf, sizeof(buf), why, whylen);
    if (rc == 0)
        rc = conf_check_text(k, buf, strlen(buf), why, whylen);
    if (rc == 0) {
        *out = strdup(buf);
        if (!*out)
            rc = conf_msg(why, whylen, "out of memory");
    }
    explicit_bzero(buf, sizeof(buf));
    return rc;
}

static int conf_apply_secret_file(struct conf_loader *ld,
                                  const struct conf_key *k, json_t *v)
{
    int peer_len = (int)(strlen(k->key) - strlen("_file"));
    char **p = conf_field(ld->c, k);
    const char *path;
    char why[160];

    if (json_is_null(v))
        return 0;
    if (*p)
        return conf_fail(ld, k->key, "cannot be used together with %.*s",
                         peer_len, k->key);
    path = json_string_value(v);
    if (conf_read_secret(path, k, p, why, sizeof(why)) < 0)
        return conf_fail(ld, k->key, "%s: %s", path, why);
    return 0;
}

static int conf_apply_mode(struct conf_loader *ld, const struct conf_key *k,
                           json_t *v)
{
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    uint32_t mode;

    /* "0660" or "660": the way chmod spells it, never a bare 0 or 07777. */
    if (n < 3 || n > 4 || proto_parse_octal(s, n, &mode) < 0)
        return conf_fail(ld, k->key, CONF_MODE_WRONG);
    if (mode > (unsigned long long)k->max)
        return conf_fail(ld, k->key, "must be at most 0%llo",
                         (unsigned long long)k->max);
    *(unsigned *)conf_field(ld->c, k) = (unsigned)mode;
    return 0;
}

static int conf_apply_level(struct conf_loader *ld, const struct conf_key *k,
                            json_t *v)
{
    size_t n = sizeof(conf_level_names) / sizeof(conf_level_names[0]);

    for (size_t i = 0; i < n; i++) {
        if (strcmp(json_string_value(v), conf_level_names[i]) == 0) {
            *(int *)conf_field(ld->c, k) = (int)i;
            return 0;
        }
    }
    return conf_fail(ld, k->key, CONF_LEVEL_WRONG);
}

static int conf_apply_addr_at(struct conf_loader *ld, const struct conf_key *k,
                              struct conf_addr *a, json_t *v, size_t i)
{
    char key[128], why[CONF_ERRLEN];

    snprintf(key, sizeof(key), "%s[%zu]", k->key, i);
    if (!json_is_string(v))
        return conf_fail(ld, key, "expected a string");
    if (conf_addr_parse(a, json_string_value(v), k->flags,
                        why, sizeof(why)) < 0)
        return conf_fail(ld, key, "%s", why);
    return 0;
}

static int conf_apply_addrs(struct conf_loader *ld, const struct conf_key *k,
                            json_t *v)
{
    struct conf_addr **p = conf_field(ld->c, k);
    size_t *count = (size_t *)((char *)ld->c + k->count_off);
    size_t n = json_array_size(v);
    struct conf_addr *list;

    if ((long long)n < k->min || (long long)n > k->max)
        return conf_fail(ld, k->key, "must have %lld to %lld addresses",
                         k->min, k->max);
    list = calloc(n, sizeof(*list));
    if (!list)
        return conf_fail(ld, k->key, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (conf_apply_addr_at(ld, k, &list[i], json_array_get(v, i), i) < 0) {
            conf_addrs_free(list, i);
            return -1;
        }
    }
    conf_addrs_free(*p, *count);
    *p = list;
    *count = n;
    return 0;
}

static int conf_apply_addr(struct conf_loader *ld, const struct conf_key *k,
                           json_t *v)
{
    struct conf_addr **p = conf_field(ld->c, k);
    struct conf_addr *a = NULL;
    char why[CONF_ERRLEN];

    if (json_is_string(v)) {
        a = calloc(1, sizeof(*a));
        if (!a)
            return conf_fail(ld, k->key, "out of memory");
        if (conf_addr_parse(a, json_string_value(v), k->flags,
                            why, sizeof(why)) < 0) {
            free(a);
            return conf_fail(ld, k->key, "%s", why);
        }
    }
    conf_addr_deinit(*p);
    free(*p);
    *p = a;
    return 0;
}

/* ---- auth.users --------------------------------------------------------- */

/* The keys of one user object, and the rules of its strings. */
static const char *const conf_user_keys[] = {
    "name", "password", "password_file", "prefixes", "admin",
};
static const struct conf_key conf_user_name_rule = {
    .key = "name", .type = CONF_T_STRING, .min = 1, .max = USERS_NAME_MAX,
    .flags = CONF_S_WORD };
static const struct conf_key conf_user_secret_rule = {
    .key = "password", .type = CONF_T_STRING, .min = 1,
    .max = CONF_SECRET_MAX, .flags = CONF_S_WORD };

/* Is s visible ASCII (0x21-0x7e) only, as resource names and AUTH words
 * are? */
static bool conf_visible(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    }
    return true;
}

static int conf_user_unknown_keys(struct conf_loader *ld, const char *at,
                                  json_t *obj)
{
    size_t nkeys = sizeof(conf_user_keys) / sizeof(conf_user_keys[0]);
    char key[192];
    const char *k;
    json_t *v;

    json_object_foreach(obj, k, v) {
        bool known = false;
        for (size_t i = 0; i < nkeys; i++)
            known |= strcmp(k, conf_user_keys[i]) == 0;
        if (known)
            continue;
        snprintf(key, sizeof(key), "%s.%s", at, k);
        return conf_fail(ld, key, "unknown key (a user has name, password "
                         "or password_file, prefixes and admin)");
    }
    return 0;
}

/* name: one visible word, not the name of an earlier user. */
static int conf_user_name(struct conf_loader *ld, const char *at,
                          json_t *obj, struct users_user *list, size_t i)
{
    json_t *v = json_object_get(obj, "name");
    char key[192], why[128];
    const char *s;

    snprintf(key, sizeof(key), "%s.name", at);
    if (!v)
        return conf_fail(ld, key, "required");
    if (!json_is_string(v))
        return conf_fail(ld, key, "expected a string");
    s = json_string_value(v);
    if (conf_check_text(&conf_user_name_rule, s, json_string_length(v),
                        why, sizeof(why)) < 0)
        return conf_fail(ld, key, "%s", why);
    if (!conf_visible(s, json_string_length(v)))
        return conf_fail(ld, key, "must be visible ASCII characters");
    for (size_t j = 0; j < i; j++) {
        if (strcmp(list[j].name, s) == 0)
            return conf_fail(ld, key, "\"%s\" repeats auth.users[%zu].name",
                             s, j);
    }
    list[i].name = strdup(s);
    return list[i].name ? 0 : conf_fail(ld, key, "out of memory");
}

/* password or password_file: exactly one. The file is read now (and at
 * each reload); whether others may read it is kept for conf_warnings. */
static int conf_user_password(struct conf_loader *ld, const char *at,
                              json_t *obj, struct users_user *u)
{
    json_t *pw = json_object_get(obj, "password");
    json_t *file = json_object_get(obj, "password_file");
    char key[192], why[160];
    struct stat st;

    if (pw && file)
        return conf_fail(ld, at, "password and password_file cannot be "
                         "used together");
    if (!pw && !file)
        return conf_fail(ld, at, "needs password or password_file");
    snprintf(key, sizeof(key), "%s.%s", at, pw ? "password" : "password_file");
    if (!json_is_string(pw ? pw : file))
        return conf_fail(ld, key, "expected a string");
    if (pw) {
        if (conf_check_text(&conf_user_secret_rule, json_string_value(pw),
                            json_string_length(pw), why, sizeof(why)) < 0)
            return conf_fail(ld, key, "%s", why);
        u->password = strdup(json_string_value(pw));
        return u->password ? 0 : conf_fail(ld, key, "out of memory");
    }
    u->password_file = strdup(json_string_value(file));
    if (!u->password_file)
        return conf_fail(ld, key, "out of memory");
    if (conf_read_secret(u->password_file, &conf_user_secret_rule,
                         &u->password, why, sizeof(why)) < 0)
        return conf_fail(ld, key, "%s: %s", u->password_file, why);
    /* Others, not the group: 0640 with the daemon's group is the way
     * docs/configuration.md recommends. */
    u->file_readable = stat(u->password_file, &st) == 0 &&
                       (st.st_mode & S_IROTH);
    return 0;
}

/* prefixes: a list of strings that start resource names; [] allows
 * nothing, "" everything. */
static int conf_user_prefixes(struct conf_loader *ld, const char *at,
                              json_t *obj, struct users_user *u)
{
    json_t *v = json_object_get(obj, "prefixes");
    size_t max = ld->c->locks.max_resource_len;
    char key[192];

    snprintf(key, sizeof(key), "%s.prefixes", at);
    if (!v)
        return conf_fail(ld, key, "required: a list of resource name "
                         "prefixes ([] allows no resource, [\"\"] every one)");
    if (!json_is_array(v))
        return conf_fail(ld, key, "expected a list of strings");
    if (json_array_size(v) > USERS_PREFIXES_MAX)
        return conf_fail(ld, key, "at most %d prefixes", USERS_PREFIXES_MAX);
    u->prefixes = calloc(json_array_size(v) + 1, sizeof(*u->prefixes));
    if (!u->prefixes)
        return conf_fail(ld, key, "out of memory");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *p = json_array_get(v, i);
        snprintf(key, sizeof(key), "%s.prefixes[%zu]", at, i);
        if (!json_is_string(p))
            return conf_fail(ld, key, "expected a string");
        if (json_string_length(p) > max ||
            !conf_visible(json_string_value(p), json_string_length(p)))
            return conf_fail(ld, key, "must be at most locks.max_resource_len "
                             "(%zu) visible ASCII characters", max);
        u->prefixes[i] = strdup(json_string_value(p));
        if (!u->prefixes[i])
            return conf_fail(ld, key, "out of memory");
        u->nprefixes++;
    }
    return 0;
}

static int conf_user_admin(struct conf_loader *ld, const char *at,
                           json_t *obj, struct users_user *u)
{
    json_t *v = json_object_get(obj, "admin");
    char key[192];

    snprintf(key, sizeof(key), "%s.admin", at);
    if (v && !json_is_boolean(v))
        return conf_fail(ld, key, "expected true or false");
    u->admin = json_is_true(v);
    return 0;
}

static int conf_apply_user(struct conf_loader *ld, json_t *obj,
                           struct users_user *list, size_t i)
{
    char at[64];

    snprintf(at, sizeof(at), "auth.users[%zu]", i);
    if (!json_is_object(obj))
        return conf_fail(ld, at, "expected an object with name, password "
                         "or password_file, prefixes and admin");
    if (conf_user_unknown_keys(ld, at, obj) < 0 ||
        conf_user_name(ld, at, obj, list, i) < 0 ||
        conf_user_password(ld, at, obj, &list[i]) < 0 ||
        conf_user_prefixes(ld, at, obj, &list[i]) < 0 ||
        conf_user_admin(ld, at, obj, &list[i]) < 0)
        return -1;
    return 0;
}

static int conf_apply_users(struct conf_loader *ld, const struct conf_key *k,
                            json_t *v)
{
    struct users_user **p = conf_field(ld->c, k);
    size_t *count = (size_t *)((char *)ld->c + k->count_off);
    size_t n = json_array_size(v);
    struct users_user *list;

    if ((long long)n > k->max)
        return conf_fail(ld, k->key, "at most %lld users", k->max);
    list = calloc(n + 1, sizeof(*list));
    if (!list)
        return conf_fail(ld, k->key, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (conf_apply_user(ld, json_array_get(v, i), list, i) < 0) {
            users_free(list, i + 1);
            return -1;
        }
    }
    users_free(*p, *count);
    *p = n ? list : NULL;
    *count = n;
    if (!n)
        free(list);
    return 0;
}

/* ---- metrics.resource_classes --------------------------------------------- */

/* One listed prefix: the start of a resource name (1 to
 * locks.max_resource_len visible characters), not "other" (the class of
 * everything else), not one listed before. */
static int conf_class_prefix(struct conf_loader *ld, const struct conf_key *k,
                             json_t *p, char **list, size_t i)
{
    size_t max = ld->c->locks.max_resource_len;
    char key[128];

    snprintf(key, sizeof(key), "%s[%zu]", k->key, i);
    if (!json_is_string(p))
        return conf_fail(ld, key, "expected a string");
    if (json_string_length(p) == 0 || json_string_length(p) > max ||
        !conf_visible(json_string_value(p), json_string_length(p)))
        return conf_fail(ld, key, "must be 1 to locks.max_resource_len (%zu) "
                         "visible ASCII characters", max);
    if (strcmp(json_string_value(p), RCLASS_OTHER_NAME) == 0)
        return conf_fail(ld, key, "\"%s\" is the class of the resources no "
                         "prefix takes", RCLASS_OTHER_NAME);
    for (size_t j = 0; j < i; j++) {
        if (strcmp(list[j], json_string_value(p)) == 0)
            return conf_fail(ld, key, "\"%s\" repeats %s[%zu]", list[j],
                             k->key, j);
    }
    list[i] = strdup(json_string_value(p));
    return list[i] ? 0 : conf_fail(ld, key, "out of memory");
}

/* "prefix" (the field stays NULL), or a list of prefixes. */
static int conf_apply_classes(struct conf_loader *ld,
                              const struct conf_key *k, json_t *v)
{
    char ***p = conf_field(ld->c, k);
    size_t *count = (size_t *)((char *)ld->c + k->count_off);
    size_t n = json_array_size(v);
    char **list = NULL;

    if (json_is_string(v) && strcmp(json_string_value(v), "prefix") != 0)
        return conf_fail(ld, k->key, "must be \"prefix\" or a list of "
                         "resource name prefixes");
    if (json_is_array(v)) {
        if ((long long)n > k->max)
            return conf_fail(ld, k->key, "at most %lld prefixes", k->max);
        list = calloc(n + 1, sizeof(*list));
        if (!list)
            return conf_fail(ld, k->key, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if (conf_class_prefix(ld, k, json_array_get(v, i), list, i) < 0) {
                conf_strings_free(list, i);
                return -1;
            }
        }
    }
    conf_strings_free(*p, *count);
    *p = list;
    *count = list ? n : 0;
    return 0;
}

typedef int conf_apply_fn(struct conf_loader *ld, const struct conf_key *k,
                          json_t *v);

#define CONF_J(t) (1u << (t))

/*
 * The JSON a row of each type takes, and the error for any other: checked
 * here once, so each apply function gets a value of its JSON type (or
 * null where null is taken, which each gives its own meaning).
 */
static const struct conf_type_rule {
    unsigned takes;         /* CONF_J(JSON_*) bits */
    const char *wrong;
    conf_apply_fn *apply;
} conf_types[] = {
    [CONF_T_UINT] = { CONF_J(JSON_INTEGER), "expected an integer",
                      conf_apply_integer },
    [CONF_T_INT] = { CONF_J(JSON_INTEGER), "expected an integer",
                     conf_apply_integer },
    [CONF_T_BOOL] = { CONF_J(JSON_TRUE) | CONF_J(JSON_FALSE),
                      "expected true or false", conf_apply_bool },
    [CONF_T_NUMBER] = { CONF_J(JSON_INTEGER) | CONF_J(JSON_REAL),
                        "expected a number", conf_apply_number },
    /* With CONF_S_NULL, null too: see conf_apply. */
    [CONF_T_STRING] = { CONF_J(JSON_STRING), "expected a string",
                        conf_apply_string },
    [CONF_T_SECRET_FILE] = { CONF_J(JSON_STRING) | CONF_J(JSON_NULL),
                             "expected a string or null",
                             conf_apply_secret_file },
    [CONF_T_MODE] = { CONF_J(JSON_STRING), CONF_MODE_WRONG, conf_apply_mode },
    [CONF_T_LEVEL] = { CONF_J(JSON_STRING), CONF_LEVEL_WRONG,
                       conf_apply_level },
    [CONF_T_ADDRS] = { CONF_J(JSON_ARRAY),
                       "expected an array of address strings",
                       conf_apply_addrs },
    [CONF_T_ADDR] = { CONF_J(JSON_STRING) | CONF_J(JSON_NULL),
                      "expected a string or null", conf_apply_addr },
    [CONF_T_USERS] = { CONF_J(JSON_ARRAY), "expected a list of user objects",
                       conf_apply_users },
    [CONF_T_CLASSES] = { CONF_J(JSON_STRING) | CONF_J(JSON_ARRAY),
                         "must be \"prefix\" or a list of resource name "
                         "prefixes", conf_apply_classes },
};

static int conf_apply(struct conf_loader *ld, const struct conf_key *k,
                      json_t *v)
{
    const struct conf_type_rule *t;
    unsigned takes;
    const char *wrong;

    if ((size_t)k->type >= sizeof(conf_types) / sizeof(conf_types[0]))
        return conf_fail(ld, k->key, "internal error: unknown type");
    t = &conf_types[k->type];
    takes = t->takes;
    wrong = t->wrong;
    if (k->type == CONF_T_STRING && (k->flags & CONF_S_NULL)) {
        takes |= CONF_J(JSON_NULL);
        wrong = "expected a string or null";
    }
    if (!(takes & CONF_J(json_typeof(v))))
        return conf_fail(ld, k->key, "%s", wrong);
    return t->apply(ld, k, v);
}

/* ---- pass 3: validate -------------------------------------------------- */

static int conf_check_ttls(struct conf_loader *ld)
{
    const struct conf *c = ld->c;

    if (c->locks.min_ttl_ms > c->locks.max_ttl_ms)
        return conf_fail(ld, "locks.min_ttl_ms",
                         "must not be above locks.max_ttl_ms (%u)",
                         c->locks.max_ttl_ms);
    if (c->locks.default_ttl_ms < c->locks.min_ttl_ms ||
        c->locks.default_ttl_ms > c->locks.max_ttl_ms)
        return conf_fail(ld, "locks.default_ttl_ms",
                         "must be between locks.min_ttl_ms (%u) and "
                         "locks.max_ttl_ms (%u)",
                         c->locks.min_ttl_ms, c->locks.max_ttl_ms);
    return 0;
}

static int conf_check_dups(struct conf_loader *ld, const char *key,
                           const struct conf_addr *v, size_t n)
{
    char at[128];

    if (n == 0)
        return conf_fail(ld, key, "needs at least one address");
    for (size_t i = 1; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (!conf_addr_same(&v[i], &v[j]))
                continue;
            snprintf(at, sizeof(at), "%s[%zu]", key, i);
            if (v[i].kind == CONF_ADDR_TCP &&
                strcasecmp(v[i].host, v[j].host) != 0)
                return conf_fail(ld, at, "\"%s\" and %s[%zu] (\"%s\") "
                                 "both take port %d", v[i].text, key, j,
                                 v[j].text, v[i].port);
            return conf_fail(ld, at, "\"%s\" repeats %s[%zu] (\"%s\")",
                             v[i].text, key, j, v[j].text);
        }
    }
    return 0;
}

static int conf_check_metrics(struct conf_loader *ld)
{
    const struct conf *c = ld->c;

    for (size_t i = 0; c->metrics.listen && i < c->nlisten; i++) {
        if (conf_addr_same(c->metrics.listen, &c->listen[i]))
            return conf_fail(ld, "metrics.listen",
                             "\"%s\" is also listen[%zu]",
                             c->metrics.listen->text, i);
    }
    return 0;
}

/* A list names each of its prefixes a class: no more than max_classes. */
static int conf_check_classes(struct conf_loader *ld)
{
    const struct conf *c = ld->c;

    if (c->metrics.nresource_classes > c->metrics.max_classes)
        return conf_fail(ld, "metrics.resource_classes", "%zu prefixes, more "
                         "than metrics.max_classes (%u): list fewer or raise "
                         "it", c->metrics.nresource_classes,
                         c->metrics.max_classes);
    return 0;
}

/* "AUTH " + name + " " + password + CR LF must fit in one request line. */
static int conf_check_user_lines(struct conf_loader *ld)
{
    const struct conf *c = ld->c;
    char at[64];

    for (size_t i = 0; i < c->auth.nusers; i++) {
        const struct users_user *u = &c->auth.users[i];
        if (strlen(u->name) + strlen(u->password) + 8 <= c->limits.max_line)
            continue;
        snprintf(at, sizeof(at), "auth.users[%zu]", i);
        return conf_fail(ld, at, "name and password too long for an AUTH "
                         "line of limits.max_line (%u bytes)",
                         c->limits.max_line);
    }
    return 0;
}

static int conf_check_secrets(struct conf_loader *ld)
{
    const struct conf *c = ld->c;
    /* "AUTH " + password + CR LF must fit in one request line. */
    size_t auth_len = c->auth.password ? strlen(c->auth.password) + 7 : 0;

    if (c->redis.username && !c->redis.password)
        return conf_fail(ld, "redis.username",
                         "needs redis.password or redis.password_file");
    if (auth_len > c->limits.max_line)
        return conf_fail(ld, "auth.password",
                         "too long for an AUTH line of limits.max_line "
                         "(%u bytes)", c->limits.max_line);
    if (c->auth.admin_password &&
        strlen(c->auth.admin_password) + 7 > c->limits.max_line)
        return conf_fail(ld, "auth.admin_password",
                         "too long for an AUTH line of limits.max_line "
                         "(%u bytes)", c->limits.max_line);
    if (c->auth.admin_password && c->auth.password &&
        strcmp(c->auth.admin_password, c->auth.password) == 0)
        return conf_fail(ld, "auth.admin_password",
                         "must differ from auth.password, or every client "
                         "could force-release any lock");
    return conf_check_user_lines(ld);
}

/* "id" defaults to the host name, made one visible word. */
static int conf_default_id(struct conf_loader *ld)
{
    char host[CONF_ID_MAX + 1] = "";
    struct conf *c = ld->c;

    if (c->id)
        return 0;
    if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
        snprintf(host, sizeof(host), "redlockd");
    for (char *p = host; *p; p++) {
        if (*p < 0x21 || *p > 0x7e)
            *p = '_';
    }
    c->id = strdup(host);
    if (!c->id)
        return conf_fail(ld, "id", "out of memory");
    return 0;
}

/* Is s (n bytes, a key's text after locks.key_prefix) what redlockd could
 * write for some resource of at most max bytes: its key, its shared set,
 * one of its semaphore slots, the waiting mark of one of those, or the
 * shared set's fences? */
static bool conf_names_lock(const char *s, size_t n, size_t max)
{
    size_t wl = strlen(CONF_WAITING_SUFFIX), sl = strlen(CONF_SHARED_SUFFIX);
    size_t fl = strlen(CONF_FENCES_SUFFIX);
    size_t d;

    if (n > wl && memcmp(s + n - wl, CONF_WAITING_SUFFIX, wl) == 0)
        n -= wl;
    else if (n > fl + sl && memcmp(s + n - fl, CONF_FENCES_SUFFIX, fl) == 0 &&
             memcmp(s + n - fl - sl, CONF_SHARED_SUFFIX, sl) == 0)
        n -= fl;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    }
    if (n >= 1 && n <= max)
        return true;
    if (n > sl && n - sl <= max && memcmp(s + n - sl, CONF_SHARED_SUFFIX,
                                          sl) == 0)
        return true;
    for (d = n; d > 0 && s[d - 1] >= '0' && s[d - 1] <= '9'; d--)
        ;
    return d < n && d >= 2 && s[d - 1] == CONF_SLOT_SEP && d - 1 <= max;
}

/*
 * The fence counter, the recovery marker and the longest-ttl record are
 * one key each per node. If one of them could also be a key that redlockd
 * writes for some resource, a client locking (or waiting for) that
 * resource would overwrite it: a waiting mark on the counter resets
 * fences, a lock on the marker fakes an intact node. (The release channel
 * is a pub/sub name, not a key: it cannot collide with one.)
 */
static int conf_check_derived_key(struct conf_loader *ld, const char *key,
                                  const char *name, const char *suffix)
{
    const struct conf *c = ld->c;
    size_t plen = strlen(c->locks.key_prefix);
    char full[CONF_ERRLEN];

    snprintf(full, sizeof(full), "%s%s", name, suffix);
    if (strncmp(full, c->locks.key_prefix, plen) != 0 ||
        !conf_names_lock(full + plen, strlen(full + plen),
                         c->locks.max_resource_len))
        return 0;
    if (!suffix[0] && !strpbrk(full + plen, " ") &&
        strlen(full + plen) <= c->locks.max_resource_len)
        return conf_fail(ld, key, "\"%s\" would also be the key of a lock on "
                         "\"%s\" (it starts with locks.key_prefix)", full,
                         full + plen);
    return conf_fail(ld, key, "\"%s\"%s%s%s could also be a key redlockd "
                     "writes for a resource (it starts with locks.key_prefix "
                     "\"%s\"); choose a name outside it", full,
                     suffix[0] ? " (the " : "",
                     suffix[0] ? (strcmp(suffix, CONF_MARKER_SUFFIX) == 0
                                  ? "recovery marker" : "longest-ttl record")
                               : "",
                     suffix[0] ? ")" : "", c->locks.key_prefix);
}

static int conf_check_fence_key(struct conf_loader *ld)
{
    const struct conf *c = ld->c;

    if (conf_check_derived_key(ld, "locks.fence_key", c->locks.fence_key,
                               "") < 0 ||
        conf_check_derived_key(ld, "locks.fence_key", c->locks.fence_key,
                               CONF_MARKER_SUFFIX) < 0 ||
        conf_check_derived_key(ld, "locks.fence_key", c->locks.fence_key,
                               CONF_MAXTTL_SUFFIX) < 0)
        return -1;
    return 0;
}

/* TLS settings hang together: a tls:// listener needs a certificate and
 * its key, verify_clients the CA that signs client certificates. */
static int conf_check_tls(struct conf_loader *ld)
{
    const struct conf *c = ld->c;
    const char *v = c->tls.min_version;

    for (size_t i = 0; i < c->nlisten; i++) {
        if (!c->listen[i].tls)
            continue;
        if (!c->tls.cert_file)
            return conf_fail(ld, "tls.cert_file", "required by listen "
                             "\"%s\" (a PEM certificate chain)",
                             c->listen[i].text);
        if (!c->tls.key_file)
            return conf_fail(ld, "tls.key_file", "required by listen "
                             "\"%s\" (the certificate's PEM private key)",
                             c->listen[i].text);
    }
    if (c->tls.verify_clients && !c->tls.ca_file)
        return conf_fail(ld, "tls.verify_clients", "needs tls.ca_file (the "
                         "CA that signs client certificates)");
    if (strcmp(v, "1.2") != 0 && strcmp(v, "1.3") != 0)
        return conf_fail(ld, "tls.min_version", "must be \"1.2\" or "
                         "\"1.3\"");
    return 0;
}

static int conf_validate(struct conf_loader *ld)
{
    if (conf_check_ttls(ld) < 0 ||
        conf_check_fence_key(ld) < 0 ||
        conf_check_dups(ld, "listen", ld->c->listen, ld->c->nlisten) < 0 ||
        conf_check_dups(ld, "redis.nodes", ld->c->redis.nodes,
                        ld->c->redis.nnodes) < 0 ||
        conf_check_metrics(ld) < 0 ||
        conf_check_classes(ld) < 0 ||
        conf_check_secrets(ld) < 0 ||
        conf_check_tls(ld) < 0 ||
        conf_default_id(ld) < 0)
        return -1;
    return 0;
}

/* ---- loading ----------------------------------------------------------- */

static json_t *conf_parse_json(const char *text, size_t len, const char *name,
                               char *err, size_t errlen)
{
    json_error_t je;
    json_t *root;

    root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        conf_msg(err, errlen, "%s:%d:%d: JSON syntax error: %s",
                 name, je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        conf_msg(err, errlen, "%s: the top level must be a JSON object", name);
        json_decref(root);
        return NULL;
    }
    return root;
}

static int conf_load_tree(struct conf_loader *ld, json_t *root)
{
    if (conf_walk(ld, root, "") < 0)
        return -1;
    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (ld->given[i] &&
            conf_apply(ld, &conf_keys[i], ld->given[i]) < 0)
            return -1;
    }
    return conf_validate(ld);
}

static int conf_load_buf(struct conf *c, const char *text, size_t len,
                         const char *name, char *err, size_t errlen)
{
    struct conf_loader ld = { .c = c, .name = name, .err = err,
                              .errlen = errlen };
    json_t *root;
    int rc;

    if (conf_defaults(c) < 0) {
        conf_deinit(c);
        conf_init(c);
        return conf_msg(err, errlen, "%s: out of memory", name);
    }
    root = conf_parse_json(text, len, name, err, errlen);
    rc = root ? conf_load_tree(&ld, root) : -1;
    json_decref(root);
    if (rc < 0) {
        conf_deinit(c);
        conf_init(c);
    }
    return rc;
}

int conf_load_string(struct conf *c, const char *text, const char *name,
                     char *err, size_t errlen)
{
    if (!name)
        name = "(config)";
    return conf_load_buf(c, text, strlen(text), name, err, errlen);
}

/* The whole file into a malloc'd buffer; NULL with a message in err. */
static char *conf_slurp(const char *path, size_t *len, char *err,
                        size_t errlen)
{
    FILE *f = fopen(path, "re");
    char *buf;
    size_t n;

    if (!f) {
        conf_msg(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(CONF_FILE_MAX + 1);
    n = buf ? fread(buf, 1, CONF_FILE_MAX + 1, f) : 0;
    if (!buf || ferror(f) || n > CONF_FILE_MAX) {
        if (!buf)
            conf_msg(err, errlen, "%s: out of memory", path);
        else if (ferror(f))
            conf_msg(err, errlen, "%s: cannot read: %s", path,
                     strerror(errno));
        else
            conf_msg(err, errlen, "%s: larger than %d bytes", path,
                     CONF_FILE_MAX);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

int conf_load(struct conf *c, const char *path, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = conf_slurp(path, &len, err, errlen);
    int rc;

    if (!text) {
        conf_init(c);
        return -1;
    }
    rc = conf_load_buf(c, text, len, path, err, errlen);
    free(text);
    if (rc == 0) {
        c->path = strdup(path);
        if (!c->path) {
            conf_deinit(c);
            conf_init(c);
            return conf_msg(err, errlen, "%s: out of memory", path);
        }
    }
    return rc;
}

/* ---- reload and warnings ------------------------------------------------ */

/* Keys a running daemon applies on SIGHUP (by prefix); the rest need a
 * restart. */
static const char *const conf_live_keys[] = {
    "log.", "limits.", "auth.", "tls.", "redis.username", "redis.password",
    "redis.probe_interval_ms", "redis.batch_keys_in_flight",
    "locks.default_ttl_ms", "locks.min_ttl_ms",
    "locks.max_ttl_ms", "locks.max_wait_ms", "locks.lock_delay_ms",
    "locks.retry_ms", "locks.max_limit", "locks.max_multi",
    "locks.max_value_len", "locks.watch_poll_ms",
    "metrics.resource_classes", "metrics.max_classes",
    "shutdown_timeout_ms",
};

static bool conf_key_live(const struct conf_key *k)
{
    for (size_t i = 0; i < sizeof(conf_live_keys) / sizeof(*conf_live_keys);
         i++) {
        const char *p = conf_live_keys[i];
        if (strncmp(k->key, p, strlen(p)) == 0)
            return true;
    }
    return false;
}

static bool conf_str_same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Two string lists, NULL being none (not an empty list). */
static bool conf_strings_same(char **a, size_t na, char **b, size_t nb)
{
    if (!a || !b || na != nb)
        return a == b;
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i], b[i]) != 0)
            return false;
    return true;
}

/* metrics.resource_classes for the reload's report: "prefix", or how
 * many prefixes (their text could be long). */
static void conf_classes_text(char **list, char *out, size_t size)
{
    size_t n = 0;

    while (list && list[n])
        n++;
    if (list)
        snprintf(out, size, "[%zu prefix%s]", n, n == 1 ? "" : "es");
    else
        snprintf(out, size, "prefix");
}

/* A scalar field p of key k as text in out. */
static void conf_scalar_text(const struct conf_key *k, const void *p,
                             char *out, size_t size)
{
    switch (k->type) {
    case CONF_T_UINT:
    case CONF_T_MODE:
        snprintf(out, size, "%u", *(const unsigned *)p);
        break;
    case CONF_T_INT:
        snprintf(out, size, "%d", *(const int *)p);
        break;
    case CONF_T_LEVEL:
        snprintf(out, size, "%s", conf_level_names[*(const int *)p]);
        break;
    case CONF_T_BOOL:
        snprintf(out, size, "%s", *(const bool *)p ? "true" : "false");
        break;
    default:
        snprintf(out, size, "%g", *(const double *)p);
        break;
    }
}

/* Do live and fresh differ in k? `was`/`now` describe the values (empty
 * for secrets and lists). */
static bool conf_differs(const struct conf_key *k, struct conf *live,
                         struct conf *fresh, char *was, char *now,
                         size_t size)
{
    void *a = conf_field(live, k), *b = conf_field(fresh, k);

    was[0] = now[0] = '\0';
    switch (k->type) {
    case CONF_T_UINT:
    case CONF_T_MODE:
    case CONF_T_INT:
    case CONF_T_LEVEL:
    case CONF_T_BOOL:
    case CONF_T_NUMBER:
        conf_scalar_text(k, a, was, size);
        conf_scalar_text(k, b, now, size);
        return memcmp(a, b, k->type == CONF_T_BOOL     ? sizeof(bool)
                            : k->type == CONF_T_NUMBER ? sizeof(double)
                                                       : sizeof(int)) != 0;
    case CONF_T_STRING:
    case CONF_T_SECRET_FILE:
        return !conf_str_same(*(char **)a, *(char **)b);
    case CONF_T_ADDRS: {
        struct conf_addr *x = *(struct conf_addr **)a;
        struct conf_addr *y = *(struct conf_addr **)b;
        size_t n = *(size_t *)((char *)live + k->count_off);
        if (n != *(size_t *)((char *)fresh + k->count_off))
            return true;
        for (size_t i = 0; i < n; i++) {
            if (!conf_str_same(x[i].text, y[i].text))
                return true;
        }
        return false;
    }
    case CONF_T_ADDR: {
        struct conf_addr *x = *(struct conf_addr **)a;
        struct conf_addr *y = *(struct conf_addr **)b;
        return !conf_str_same(x ? x->text : NULL, y ? y->text : NULL);
    }
    case CONF_T_USERS:
        return !users_same(*(struct users_user **)a,
                           *(size_t *)((char *)live + k->count_off),
                           *(struct users_user **)b,
                           *(size_t *)((char *)fresh + k->count_off));
    case CONF_T_CLASSES:
        conf_classes_text(*(char ***)a, was, size);
        conf_classes_text(*(char ***)b, now, size);
        return !conf_strings_same(*(char ***)a,
                                  *(size_t *)((char *)live + k->count_off),
                                  *(char ***)b,
                                  *(size_t *)((char *)fresh + k->count_off));
    }
    return false;
}

/* Take k's value from fresh (fresh gets the old one, to free). */
static void conf_take(const struct conf_key *k, struct conf *live,
                      struct conf *fresh)
{
    char *a = conf_field(live, k), *b = conf_field(fresh, k);
    size_t size;

    switch (k->type) {
    case CONF_T_UINT:
    case CONF_T_MODE:
        size = sizeof(unsigned);
        break;
    case CONF_T_INT:
    case CONF_T_LEVEL:
        size = sizeof(int);
        break;
    case CONF_T_BOOL:
        size = sizeof(bool);
        break;
    case CONF_T_NUMBER:
        size = sizeof(double);
        break;
    default:
        size = sizeof(char *);
        break;
    }
    char tmp[sizeof(double) > sizeof(char *) ? sizeof(double)
                                             : sizeof(char *)];
    memcpy(tmp, a, size);
    memcpy(a, b, size);
    memcpy(b, tmp, size);
    if (k->type == CONF_T_USERS || k->type == CONF_T_CLASSES) {
        /* and its count */
        size_t *na = (size_t *)((char *)live + k->count_off);
        size_t *nb = (size_t *)((char *)fresh + k->count_off);
        size_t n = *na;
        *na = *nb;
        *nb = n;
    }
}

int conf_reload(struct conf *live, struct conf *fresh, conf_report_fn *report,
                void *ud)
{
    int restart = 0;

    for (size_t i = 0; i < CONF_NKEYS; i++) {
        const struct conf_key *k = &conf_keys[i];
        char was[64], now[64];

        /* A *_file row fills the field of the row before it. */
        if (i > 0 && conf_keys[i - 1].off == k->off)
            continue;
        if (!conf_differs(k, live, fresh, was, now, sizeof(was)))
            continue;
        if (k->type == CONF_T_SECRET_FILE || k->type == CONF_T_USERS ||
            (k->type == CONF_T_STRING && strstr(k->key, "password")))
            was[0] = now[0] = '\0';     /* never log a secret */
        if (conf_key_live(k)) {
            conf_take(k, live, fresh);
            report(ud, k->key, was, now, true);
        } else {
            report(ud, k->key, was, now, false);
            restart++;
        }
    }
    return restart;
}

/* A password file others can read: one line naming the file (never what
 * it holds). */
static void conf_warn_user_files(const struct conf *c, conf_warn_fn *warn,
                                 void *ud)
{
    char msg[CONF_ERRLEN];

    for (size_t i = 0; i < c->auth.nusers; i++) {
        const struct users_user *u = &c->auth.users[i];
        if (!u->file_readable)
            continue;
        snprintf(msg, sizeof(msg), "auth.users[%zu] (%s): password_file %s "
                 "is readable by others; chmod 0600 it (or 0640 with the "
                 "daemon's group)", i, u->name, u->password_file);
        conf_sanitize(msg);
        warn(ud, msg);
    }
}

void conf_warnings(const struct conf *c, conf_warn_fn *warn, void *ud)
{
    char msg[CONF_ERRLEN];

    for (size_t i = 0; i < c->nlisten; i++) {
        const struct conf_addr *a = &c->listen[i];
        bool loopback = a->kind == CONF_ADDR_UNIX ||
                        strncmp(a->host, "127.", 4) == 0 ||
                        strcmp(a->host, "::1") == 0;
        if (loopback || c->auth.password || c->auth.nusers ||
            !c->auth.protected_mode || (a->tls && c->tls.verify_clients))
            continue;
        snprintf(msg, sizeof(msg), "listen \"%s\" accepts remote peers, but "
                 "with no auth.password protected mode refuses every one "
                 "of them; set auth.password (or, on tls://, "
                 "tls.verify_clients), or auth.protected_mode false on a "
                 "trusted network", a->text);
        warn(ud, msg);
    }
    conf_warn_user_files(c, warn, ud);
}
