/*
 * conf_check: the rules about a configuration as a whole. Pass 3
 * (conf_validate) refuses what no single key's row can see: ttl bounds in
 * order, addresses that repeat, secrets that do not fit an AUTH line, a
 * fence key that a lock could overwrite, TLS settings that do not hang
 * together; and gives "id" its default. conf_warnings() names settings that
 * load but will not do what the operator likely meant. Calls only conf.c.
 */
#include "conf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "users.h"

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

int conf_validate(struct conf_loader *ld)
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

/* ---- warnings ----------------------------------------------------------- */

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
