/*
 * users: the configured users (auth.users) and what each may touch.
 *
 * A user logs in with AUTH <name> <password> (or, later, a TLS client
 * certificate whose subject CN is its name) and may then LOCK, ADOPT,
 * STATUS and (an admin) FORCEUNLOCK only resources that start with one of
 * its prefixes. conf fills the list from the file; session asks the
 * questions below. Pure functions over the list: no I/O, no globals, so
 * tests/unit/test_users.c checks them directly.
 *
 * A session keeps its user's name, never a pointer into the list: a
 * SIGHUP reload replaces the list, and the next check looks the name up
 * in the new one (a user removed by the reload is then denied everything).
 */
#ifndef REDLOCKD_USERS_H
#define REDLOCKD_USERS_H

#include <stdbool.h>
#include <stddef.h>

/* A user name: 1 to USERS_NAME_MAX visible ASCII bytes (one AUTH word). */
#define USERS_NAME_MAX 64
/* The most users, and the most prefixes one user has (the checks are
 * linear scans: keep them short). */
#define USERS_MAX 1024
#define USERS_PREFIXES_MAX 64

struct users_user {
    char *name;
    char *password;         /* password, or password_file's first line */
    char *password_file;    /* the file it came from, or NULL */
    bool file_readable;     /* password_file is readable by others:
                               conf_warnings says so */
    char **prefixes;        /* "" matches every resource */
    size_t nprefixes;       /* 0: no resource at all */
    bool admin;             /* FORCEUNLOCK within its prefixes */
};

/* Free the strings of n users and the array itself (secrets wiped). */
void users_free(struct users_user *v, size_t n);

/* The user named name[0..len), or NULL. Looks at every entry whatever it
 * finds, so the time taken does not tell which names exist. */
const struct users_user *users_find(const struct users_user *v, size_t n,
                                    const char *name, size_t len);

/* Does one of u's prefixes start res[0..len)? */
bool users_allows(const struct users_user *u, const char *res, size_t len);

/* Could a name that starts with prefix[0..len) be within u's prefixes:
 * does one of them start it, or start with it? What u may learn of the
 * names: a class of the per-class histograms (rclass.h), which holds no
 * other user's resource names when it overlaps u's own. */
bool users_overlaps(const struct users_user *u, const char *prefix,
                    size_t len);

/* Does u cover every resource (a prefix ""): what a whole-daemon action
 * such as READMIT asks of a user. */
bool users_allows_all(const struct users_user *u);

/* Do two lists say the same (names, secrets, prefixes, admin)? For a
 * reload's report. */
bool users_same(const struct users_user *a, size_t na,
                const struct users_user *b, size_t nb);

/* Compare a[0..alen) with the NUL-terminated b without an early exit, so
 * the time taken does not reveal how much of a secret was right. */
bool users_secret_equal(const char *a, size_t alen, const char *b);

#endif
