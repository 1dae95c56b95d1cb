/*
 * conf: the key table of the daemon's JSON configuration
 * (docs/configuration.md), and what every conf file builds on.
 *
 * conf_keys[] is the one table of {key, type, offset, default, min, max}:
 * conf_load.c reads a file through it, conf_reload.c compares two
 * configurations row by row, and conf_init() takes its defaults from it,
 * so a default cannot drift away from the range that checks it. Besides
 * the table this file owns a struct conf's life (defaults, teardown), the
 * one-line messages every pass writes, and addresses (struct conf_addr).
 * It is the bottom of the conf files (conf_priv.h) and calls none of them.
 */
#include "conf_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "addr.h"
#include "proto.h"
#include "users.h"

#define CONF_ADDRS_MAX 64
#define CONF_NAME_MAX 256
#define CONF_PATH_MAX 4096    /* PATH_MAX */
#define CONF_MS_MAX 2147483647LL     /* protocol durations fit in 32 bits */
#define CONF_STR_(x) #x
#define CONF_STR(x) CONF_STR_(x)

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
static const struct conf_key conf_key_table[] = {
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

_Static_assert(sizeof(conf_key_table) / sizeof(conf_key_table[0]) ==
               CONF_NKEYS, "CONF_NKEYS (conf_priv.h) must count the rows "
               "of conf_key_table");

const struct conf_key *const conf_keys = conf_key_table;

const char *const conf_level_names[CONF_NLEVELS] = {
    "debug", "info", "notice", "warning", "error",
};

/* ---- messages ---------------------------------------------------------- */

void conf_sanitize(char *s)
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

int conf_msg(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    conf_vmsg(err, errlen, "", fmt, ap);
    va_end(ap);
    return -1;
}

int conf_fail(struct conf_loader *ld, const char *key,
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

void conf_addrs_free(struct conf_addr *v, size_t n)
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

int conf_addr_parse(struct conf_addr *a, const char *text,
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
bool conf_addr_same(const struct conf_addr *x,
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
int conf_defaults(struct conf *c)
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

void conf_strings_free(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

void conf_free_secret(char *s)
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
