/*
 * conf_load: loads the daemon's JSON configuration file
 * (docs/configuration.md) through conf.c's key table.
 *
 * One jansson tree goes through three passes:
 *   1. walk:     every key in the file must name a row of conf_keys[] or a
 *                section holding such rows; anything else is an error.
 *   2. apply:    rows are applied in table order, so the first error
 *                reported does not depend on the order of keys in the
 *                file: the JSON type first (conf_types[]), then what
 *                the row's type checks itself (range, syntax), in its
 *                reader (conf_value.c, conf_users.c).
 *   3. validate: the rules that involve more than one key (conf_check.c).
 * On any error the conf is left with defaults only. The top of the conf
 * files with conf_reload.c (conf_priv.h): it calls the others, none calls
 * it.
 */
#include "conf_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONF_FILE_MAX (1024 * 1024)  /* a config file is a few KiB */

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

/* ---- pass 2: apply, by type ---------------------------------------------- */

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
