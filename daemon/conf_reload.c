/*
 * conf_reload: SIGHUP. Compares the running configuration with a freshly
 * loaded one row by row of conf.c's key table: which keys changed, and
 * whether each can apply in a running daemon (then its value moves into
 * the live conf, so pointers to it stay valid) or needs a restart. Each
 * change is reported once, secrets never shown. The top of the conf files
 * with conf_load.c (conf_priv.h): calls only conf.c.
 */
#include "conf_priv.h"

#include <stdio.h>
#include <string.h>

#include "users.h"

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
