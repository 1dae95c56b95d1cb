/*
 * conf_value: pass 2's readers, one per row type (conf_priv.h's
 * conf_apply_fn): integers and numbers against the row's range, strings
 * against its rules, secrets read from the first line of a file, modes,
 * log levels, addresses and metrics.resource_classes. conf_load.c picks the
 * reader by the row's type once the JSON type is right (conf_types[]);
 * auth.users (conf_users.c) reads its strings and password files with the
 * same rules. Calls only conf.c.
 */
#include "conf_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "num.h"
#include "rclass.h"

int conf_apply_integer(struct conf_loader *ld,
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

int conf_apply_bool(struct conf_loader *ld, const struct conf_key *k,
                    json_t *v)
{
    *(bool *)conf_field(ld->c, k) = json_is_true(v);
    return 0;
}

int conf_apply_number(struct conf_loader *ld,
                      const struct conf_key *k, json_t *v)
{
    double d = json_number_value(v);

    if (!(d >= (double)k->min && d < k->dmax))
        return conf_fail(ld, k->key, "must be at least %lld and below %g",
                         k->min, k->dmax);
    *(double *)conf_field(ld->c, k) = d;
    return 0;
}

int conf_check_text(const struct conf_key *k, const char *s,
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

int conf_apply_string(struct conf_loader *ld,
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

int conf_read_secret(const char *path, const struct conf_key *k,
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

int conf_apply_secret_file(struct conf_loader *ld,
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

int conf_apply_mode(struct conf_loader *ld, const struct conf_key *k,
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

int conf_apply_level(struct conf_loader *ld, const struct conf_key *k,
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

int conf_apply_addrs(struct conf_loader *ld, const struct conf_key *k,
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

int conf_apply_addr(struct conf_loader *ld, const struct conf_key *k,
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

bool conf_visible(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    }
    return true;
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
int conf_apply_classes(struct conf_loader *ld,
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
