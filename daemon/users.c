/*
 * users: the configured users and their prefixes (see users.h).
 */
#include "users.h"

#include <stdlib.h>
#include <string.h>

static void users_free_secret(char *s)
{
    if (!s)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}

void users_free(struct users_user *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        free(v[i].name);
        users_free_secret(v[i].password);
        free(v[i].password_file);
        for (size_t j = 0; j < v[i].nprefixes; j++)
            free(v[i].prefixes[j]);
        free(v[i].prefixes);
    }
    free(v);
}

bool users_secret_equal(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned char diff = alen != blen;

    for (size_t i = 0; i < alen; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (blen ? blen : 1)]);
    return diff == 0;
}

const struct users_user *users_find(const struct users_user *v, size_t n,
                                    const char *name, size_t len)
{
    const struct users_user *found = NULL;

    for (size_t i = 0; i < n; i++) {
        if (users_secret_equal(name, len, v[i].name) && !found)
            found = &v[i];
    }
    return found;
}

bool users_allows(const struct users_user *u, const char *res, size_t len)
{
    for (size_t i = 0; i < u->nprefixes; i++) {
        size_t plen = strlen(u->prefixes[i]);
        if (plen <= len && memcmp(u->prefixes[i], res, plen) == 0)
            return true;
    }
    return false;
}

bool users_overlaps(const struct users_user *u, const char *prefix,
                    size_t len)
{
    for (size_t i = 0; i < u->nprefixes; i++) {
        size_t plen = strlen(u->prefixes[i]);
        if (memcmp(u->prefixes[i], prefix, plen < len ? plen : len) == 0)
            return true;
    }
    return false;
}

bool users_allows_all(const struct users_user *u)
{
    for (size_t i = 0; i < u->nprefixes; i++) {
        if (u->prefixes[i][0] == '\0')
            return true;
    }
    return false;
}

static bool users_str_same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool users_one_same(const struct users_user *a,
                           const struct users_user *b)
{
    if (!users_str_same(a->name, b->name) ||
        !users_str_same(a->password, b->password) ||
        !users_str_same(a->password_file, b->password_file) ||
        a->admin != b->admin || a->nprefixes != b->nprefixes)
        return false;
    for (size_t i = 0; i < a->nprefixes; i++) {
        if (strcmp(a->prefixes[i], b->prefixes[i]) != 0)
            return false;
    }
    return true;
}

bool users_same(const struct users_user *a, size_t na,
                const struct users_user *b, size_t nb)
{
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++) {
        if (!users_one_same(&a[i], &b[i]))
            return false;
    }
    return true;
}
