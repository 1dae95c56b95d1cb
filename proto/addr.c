/*
 * addr: the address grammar (see addr.h for the rules).
 *
 * proto_addr_parse picks the form from the text's start ("unix:", '/',
 * "tcp://", another scheme), then for TCP splits host from port, reads the
 * port and only then judges the host, so "localhost:0" is reported for its
 * port wherever names are allowed or not. Each caller's permissions are the
 * flags it passes; nothing here knows who is asking.
 */
#include "addr.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "num.h"

/* The PATH_LONG message spells the limit out. */
_Static_assert(PROTO_ADDR_PATH_MAX == 107, "update the PATH_LONG message");

static const char *const proto_addr_msgs[PROTO_ADDR_E_COUNT] = {
    [PROTO_ADDR_OK] = "valid address",
#define X(name, msg) [PROTO_ADDR_E_##name] = msg,
    PROTO_ADDR_ERRORS(X)
#undef X
};

/* A TCP address split into its parts, still pointing into the text. */
struct addr_split {
    const char *host;
    size_t hlen;
    const char *port;       /* NULL: no ":PORT" */
    bool v6;                /* the host was in brackets */
};

const char *proto_addr_strerror(enum proto_addr_err e)
{
    if ((int)e < 0 || e >= PROTO_ADDR_E_COUNT)
        return "invalid address";
    return proto_addr_msgs[e];
}

/* ---- character classes (ASCII only: the locale must not matter) ------- */

static bool addr_is_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
        || (c >= 'A' && c <= 'Z');
}

static bool addr_has_control(const char *s)
{
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    }
    return false;
}

/* s[0..len) holds only alnum bytes and bytes of `extra`. */
static bool addr_all_of(const char *s, size_t len, const char *extra)
{
    for (size_t i = 0; i < len; i++) {
        if (!addr_is_alnum(s[i]) && !strchr(extra, s[i]))
            return false;
    }
    return true;
}

/* ---- unix sockets ----------------------------------------------------- */

static enum proto_addr_err addr_unix(struct proto_addr *a, const char *path,
                                     unsigned flags)
{
    size_t len = strlen(path);

    if (!(flags & PROTO_ADDR_ALLOW_UNIX))
        return PROTO_ADDR_E_UNIX;
    if (len == 0)
        return PROTO_ADDR_E_PATH_EMPTY;
    if (path[0] != '/' && !(flags & PROTO_ADDR_ALLOW_RELATIVE))
        return PROTO_ADDR_E_PATH_RELATIVE;
    if (len > PROTO_ADDR_PATH_MAX)
        return PROTO_ADDR_E_PATH_LONG;
    a->kind = PROTO_ADDR_KIND_UNIX;
    memcpy(a->path, path, len + 1);
    return PROTO_ADDR_OK;
}

/* After "unix:": "//" starts a URL, whose host part must be empty. */
static enum proto_addr_err addr_unix_url(struct proto_addr *a,
                                         const char *rest, unsigned flags)
{
    if (!(flags & PROTO_ADDR_ALLOW_UNIX))
        return PROTO_ADDR_E_UNIX;
    if (strncmp(rest, "//", 2) == 0) {
        if (rest[2] != '/')
            return PROTO_ADDR_E_UNIX_HOST;
        rest += 2;
    }
    return addr_unix(a, rest, flags);
}

/* ---- TCP: splitting and the port -------------------------------------- */

static enum proto_addr_err addr_split_v6(const char *s, struct addr_split *sp)
{
    const char *end = strchr(s, ']');

    if (!end)
        return PROTO_ADDR_E_BRACKET;
    sp->host = s + 1;
    sp->hlen = (size_t)(end - s - 1);
    sp->v6 = true;
    sp->port = NULL;
    if (end[1] == '\0')
        return PROTO_ADDR_OK;
    if (end[1] != ':')
        return PROTO_ADDR_E_AFTER_BRACKET;
    sp->port = end + 2;
    return PROTO_ADDR_OK;
}

static enum proto_addr_err addr_split(const char *s, struct addr_split *sp)
{
    const char *colon;

    if (s[0] == '[')
        return addr_split_v6(s, sp);
    colon = strchr(s, ':');
    /* "::1:7390" cannot be split safely: which colon is the port's? */
    if (colon && strchr(colon + 1, ':'))
        return PROTO_ADDR_E_UNBRACKETED;
    sp->host = s;
    sp->hlen = colon ? (size_t)(colon - s) : strlen(s);
    sp->port = colon ? colon + 1 : NULL;
    sp->v6 = false;
    return PROTO_ADDR_OK;
}

static enum proto_addr_err addr_port(const struct addr_split *sp,
                                     unsigned flags, uint16_t *port)
{
    if (sp->port)
        return proto_parse_port(sp->port, strlen(sp->port), port) == 0
                   ? PROTO_ADDR_OK : PROTO_ADDR_E_PORT;
    if (!(flags & PROTO_ADDR_ALLOW_DEFAULT_PORT))
        return sp->v6 ? PROTO_ADDR_E_AFTER_BRACKET : PROTO_ADDR_E_NO_PORT;
    *port = PROTO_DEFAULT_PORT;
    return PROTO_ADDR_OK;
}

/* ---- TCP: the host ---------------------------------------------------- */

/* Appends "%zone" to the canonical address already in a->host. */
static enum proto_addr_err addr_zone(struct proto_addr *a, const char *zone,
                                     size_t len)
{
    size_t n = strlen(a->host);

    if (len == 0 || len > PROTO_ADDR_ZONE_MAX
        || !addr_all_of(zone, len, "._-"))
        return PROTO_ADDR_E_IPV6;
    a->host[n] = '%';
    memcpy(a->host + n + 1, zone, len);
    a->host[n + 1 + len] = '\0';
    return PROTO_ADDR_OK;
}

static enum proto_addr_err addr_host_v6(struct proto_addr *a, const char *h,
                                        size_t len, unsigned flags)
{
    const char *pct = memchr(h, '%', len);
    size_t alen = pct ? (size_t)(pct - h) : len;
    unsigned char bin[sizeof(struct in6_addr)];
    char lit[INET6_ADDRSTRLEN];

    if (pct && !(flags & PROTO_ADDR_ALLOW_ZONE))
        return PROTO_ADDR_E_IPV6;
    /* Every valid spelling fits in INET6_ADDRSTRLEN. */
    if (alen >= sizeof(lit))
        return PROTO_ADDR_E_IPV6;
    memcpy(lit, h, alen);
    lit[alen] = '\0';
    if (inet_pton(AF_INET6, lit, bin) != 1)
        return PROTO_ADDR_E_IPV6;
    if (!inet_ntop(AF_INET6, bin, a->host, sizeof(a->host)))
        return PROTO_ADDR_E_IPV6;
    if (pct)
        return addr_zone(a, pct + 1, len - alen - 1);
    return PROTO_ADDR_OK;
}

/* "1.2.3" is a name to a resolver (1.2.0.3), but surely a typo here. */
static bool addr_looks_numeric(const char *s, size_t len)
{
    return strspn(s, "0123456789.") >= len;
}

static bool addr_is_hostname(const char *s, size_t len)
{
    return len > 0 && addr_is_alnum(s[0]) && addr_all_of(s, len, ".-");
}

static enum proto_addr_err addr_host(struct proto_addr *a, const char *h,
                                     size_t len, unsigned flags)
{
    unsigned char bin[sizeof(struct in_addr)];

    if (len > PROTO_ADDR_HOST_MAX)
        return (flags & PROTO_ADDR_ALLOW_NAMES) ? PROTO_ADDR_E_NAME
                                                : PROTO_ADDR_E_LITERAL;
    memcpy(a->host, h, len);
    a->host[len] = '\0';
    if (inet_pton(AF_INET, a->host, bin) == 1)
        return PROTO_ADDR_OK;
    if (addr_looks_numeric(a->host, len))
        return PROTO_ADDR_E_IPV4;
    if (!(flags & PROTO_ADDR_ALLOW_NAMES))
        return PROTO_ADDR_E_LITERAL;
    if (!addr_is_hostname(a->host, len))
        return PROTO_ADDR_E_NAME;
    return PROTO_ADDR_OK;
}

static enum proto_addr_err addr_tcp(struct proto_addr *a, const char *s,
                                    unsigned flags)
{
    struct addr_split sp;
    enum proto_addr_err e = addr_split(s, &sp);

    if (e == PROTO_ADDR_OK && sp.hlen == 0)
        e = PROTO_ADDR_E_NO_HOST;
    if (e == PROTO_ADDR_OK)
        e = addr_port(&sp, flags, &a->port);
    if (e == PROTO_ADDR_OK)
        e = sp.v6 ? addr_host_v6(a, sp.host, sp.hlen, flags)
                  : addr_host(a, sp.host, sp.hlen, flags);
    if (e == PROTO_ADDR_OK)
        a->kind = PROTO_ADDR_KIND_TCP;
    return e;
}

/* ---- the whole address ------------------------------------------------ */

static enum proto_addr_err addr_dispatch(struct proto_addr *a, const char *s,
                                         unsigned flags)
{
    if (!s || *s == '\0')
        return PROTO_ADDR_E_EMPTY;
    if (addr_has_control(s))
        return PROTO_ADDR_E_CONTROL;
    if (strncmp(s, "unix:", 5) == 0)
        return addr_unix_url(a, s + 5, flags);
    if (s[0] == '/') {
        if (flags & PROTO_ADDR_ALLOW_BARE_PATH)
            return addr_unix(a, s, flags);
        return (flags & PROTO_ADDR_ALLOW_UNIX) ? PROTO_ADDR_E_UNIX_PREFIX
                                               : PROTO_ADDR_E_UNIX;
    }
    if (strncmp(s, "tcp://", 6) == 0) {
        s += 6;
    } else if (strncmp(s, "tls://", 6) == 0) {
        if (!(flags & PROTO_ADDR_ALLOW_TLS))
            return PROTO_ADDR_E_TLS;
        a->tls = true;
        s += 6;
    }
    if (strstr(s, "://"))
        return PROTO_ADDR_E_SCHEME;
    return addr_tcp(a, s, flags);
}

enum proto_addr_err proto_addr_parse(struct proto_addr *a, const char *text,
                                     unsigned flags)
{
    enum proto_addr_err e;

    memset(a, 0, sizeof(*a));
    e = addr_dispatch(a, text, flags);
    if (e != PROTO_ADDR_OK)
        memset(a, 0, sizeof(*a));
    return e;
}

int proto_addr_format(const struct proto_addr *a, char *buf, size_t size)
{
    /* "unix:" + "//x" would read back as a URL with a host: spell such a
     * path as a URL, so the text always parses back to the same path. */
    if (a->kind == PROTO_ADDR_KIND_UNIX)
        return snprintf(buf, size, "unix:%s%s",
                        strncmp(a->path, "//", 2) == 0 ? "//" : "", a->path);
    const char *scheme = a->tls ? "tls://" : "";
    if (strchr(a->host, ':'))
        return snprintf(buf, size, "%s[%s]:%u", scheme, a->host,
                        (unsigned)a->port);
    /* "unix:6379" is a unix socket; a host named unix needs the scheme. */
    if (!a->tls && strcmp(a->host, "unix") == 0)
        scheme = "tcp://";
    return snprintf(buf, size, "%s%s:%u", scheme, a->host, (unsigned)a->port);
}
