/*
 * conf_users: the reader of auth.users, a list of user objects (users.h).
 * Each has its own keys (name, password or password_file, prefixes,
 * admin), each checked and named in messages as "auth.users[I].KEY";
 * password files are read at each load, and whether others may read one
 * is kept for conf_warnings(). Calls conf_value.c for the string rules and
 * secret files, and conf.c.
 */
#include "conf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "users.h"

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

int conf_apply_users(struct conf_loader *ld, const struct conf_key *k,
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
