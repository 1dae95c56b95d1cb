/*
 * conf_priv.h: what the conf files share with one another; nothing outside
 * them includes it (conf.h is the module's contract).
 *
 * The configuration is read by six files in layers, each calling only the
 * files below it, never one above:
 *
 *   conf_load.c    top: conf_load(). Pass 1 walks the file's keys onto
 *                  rows of the table, pass 2 hands each given row to its
 *                  type's reader (conf_types[]), pass 3 is conf_validate().
 *   conf_reload.c  top: conf_reload(), SIGHUP's diff of two loaded
 *                  configurations, row by row (which keys changed, which
 *                  of them apply live).
 *   conf_users.c   the reader of auth.users (user objects).
 *   conf_value.c   the readers of every other row type, and the string
 *                  and secret-file rules auth.users uses too.
 *   conf_check.c   pass 3 (rules of more than one key) and conf_warnings().
 *   conf.c         bottom: the key table, defaults and teardown, messages,
 *                  addresses.
 *
 * A reader is a conf_apply_fn: it gets a row and a value of the JSON type
 * conf_types[] accepts for the row's type, stores it in ld->c and returns
 * 0, or returns -1 after conf_fail() has written a message naming the key.
 */
#ifndef REDLOCKD_CONF_PRIV_H
#define REDLOCKD_CONF_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "conf.h"

#define CONF_SECRET_MAX 512

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

/* The key table (conf.c), CONF_NKEYS rows in the order they are applied;
 * a static assertion there keeps the count true. */
#define CONF_NKEYS 59
extern const struct conf_key *const conf_keys;

/* Indexed by enum log_level_value (conf.c). */
#define CONF_NLEVELS (CONF_LOG_ERROR + 1)
extern const char *const conf_level_names[CONF_NLEVELS];

/* The errors of values a mode or level row can not read, of whatever JSON
 * type. */
#define CONF_MODE_WRONG "expected an octal mode string such as \"0660\""
#define CONF_LEVEL_WRONG "must be one of debug, info, notice, warning, error"

struct conf_loader {
    struct conf *c;
    const char *name;           /* file name for messages */
    char *err;
    size_t errlen;
    json_t *given[CONF_NKEYS];  /* (borrowed from the tree) value per row */
};

static inline void *conf_field(struct conf *c, const struct conf_key *k)
{
    return (char *)c + k->off;
}

/* ---- conf.c ------------------------------------------------------------- */

/* The defaults of every row into c (zeroed first); -1 if a default string
 * could not be allocated. */
int conf_defaults(struct conf *c);
void conf_addrs_free(struct conf_addr *v, size_t n);
void conf_strings_free(char **v, size_t n);
/* Secrets may end up in a core dump otherwise. */
void conf_free_secret(char *s);

/* One log line per message: a control byte from the file must not split it. */
void conf_sanitize(char *s);
/* The message into err (if any); always returns -1. */
int conf_msg(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "NAME: KEY: message"; always returns -1. */
int conf_fail(struct conf_loader *ld, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* flags: PROTO_ADDR_ALLOW_* (the rows use the PROTO_ADDR_FOR_* sets). */
int conf_addr_parse(struct conf_addr *a, const char *text, unsigned flags,
                    char *err, size_t errlen);
/* Would binding both fail, or mean the same place? */
bool conf_addr_same(const struct conf_addr *x, const struct conf_addr *y);

/* ---- conf_value.c: the readers, and rules auth.users shares ------------- */

typedef int conf_apply_fn(struct conf_loader *ld, const struct conf_key *k,
                          json_t *v);

conf_apply_fn conf_apply_integer;       /* CONF_T_UINT, CONF_T_INT */
conf_apply_fn conf_apply_bool;
conf_apply_fn conf_apply_number;
conf_apply_fn conf_apply_string;
conf_apply_fn conf_apply_secret_file;
conf_apply_fn conf_apply_mode;
conf_apply_fn conf_apply_level;
conf_apply_fn conf_apply_addrs;
conf_apply_fn conf_apply_addr;
conf_apply_fn conf_apply_classes;

/* Length, control characters and (CONF_S_WORD) spaces by rule k; -1 with
 * the reason in why. */
int conf_check_text(const struct conf_key *k, const char *s, size_t len,
                    char *why, size_t whylen);
/* The secret in the first line of path, checked by rule k, into *out
 * (malloc'd); -1 with the reason in why (never the file's content). */
int conf_read_secret(const char *path, const struct conf_key *k, char **out,
                     char *why, size_t whylen);
/* Is s visible ASCII (0x21-0x7e) only, as resource names and AUTH words
 * are? */
bool conf_visible(const char *s, size_t n);

/* ---- conf_users.c ------------------------------------------------------- */

conf_apply_fn conf_apply_users;         /* CONF_T_USERS */

/* ---- conf_check.c ------------------------------------------------------- */

/* Pass 3: the rules that involve more than one key, and "id"'s default. */
int conf_validate(struct conf_loader *ld);

#endif
