/*
 * addr: the one address grammar of redlockd.
 *
 * The daemon's config (listen, redis.nodes, metrics.listen) and the client
 * library's server address are all read here, so an address means the same
 * thing everywhere. Pure: text in, a struct proto_addr with fixed-size
 * buffers out; no sockets, no name resolution, no allocation, no globals.
 * Callers that need host names resolved (the client, hiredis) do it later.
 *
 * The grammar, for every caller:
 *
 *   tcp://HOST:PORT, HOST:PORT   TCP; "tcp://" is optional everywhere
 *   tls://HOST:PORT              TCP with TLS, if the caller allows it
 *   [IPV6]:PORT                  IPv6 literals always in brackets
 *   unix:/ABSOLUTE/PATH          Unix socket, if the caller allows them
 *   unix:///ABSOLUTE/PATH        the URL spelling of the same path
 *
 *   HOST   an IPv4 literal that inet_pton(AF_INET) takes (dotted quad,
 *          no leading zeros), stored as written; or, with _ALLOW_NAMES,
 *          a host name: 1..253 letters, digits, '.' and '-', starting with
 *          a letter or digit and not made of digits and dots only (such a
 *          "1.2.3" is a mistyped address, which a resolver would read as
 *          1.2.0.3).
 *   IPV6   what inet_pton(AF_INET6) takes, stored in canonical form
 *          ("2001:DB8:0::1" -> "2001:db8::1") so duplicates compare equal;
 *          with _ALLOW_ZONE a "%zone" suffix (1..15 of [A-Za-z0-9._-])
 *          is kept for getaddrinfo, which understands it.
 *   PORT   1..65535, 1 to 5 decimal digits, no sign (proto_parse_port).
 *          With _ALLOW_DEFAULT_PORT ":PORT" may be left out and means
 *          PROTO_DEFAULT_PORT.
 *   PATH   1..PROTO_ADDR_PATH_MAX bytes (sun_path less its NUL); it must
 *          start with '/' unless _ALLOW_RELATIVE. With
 *          _ALLOW_BARE_PATH a text starting with '/' is a Unix socket
 *          without the "unix:" prefix.
 *
 * No control byte (below 0x20, or 0x7f) anywhere; any other scheme
 * ("http://", "udp://", "unix://host/...") is refused. "unix:" always
 * starts a unix socket, so a host named "unix" is written tcp://unix:PORT.
 *
 * Who allows what (the PROTO_ADDR_FOR_* sets of PROTO_ADDR_ALLOW_* flags):
 *   listen           TCP literals, tls:// and unix:/PATH (no names:
 *                    what the daemon binds must not depend on a resolver)
 *   redis.nodes      as listen, plus host names (hiredis resolves them)
 *   metrics.listen   TCP literals only
 *   client server    everything: tls://, names, zones, a default port, a bare
 *                    /PATH and relative unix: paths, as libredlockd has
 *                    always accepted
 *
 * Where the config's and the client's old parsers disagreed, one rule now
 * holds for both: the config's stricter host rules (a bracketed host must
 * be IPv6, names are letters, digits, '.' and '-', "1.2.3" is refused,
 * ports have at most 5 digits) and the client's "unix:///PATH" spelling.
 */
#ifndef REDLOCKD_ADDR_H
#define REDLOCKD_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

/* redlockd's own TCP port: the client's default, the daemon's default
 * listen address. */
#define PROTO_DEFAULT_PORT 7390

#define PROTO_ADDR_HOST_MAX 253     /* a DNS name's longest text form */
#define PROTO_ADDR_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)
#define PROTO_ADDR_ZONE_MAX 15      /* IF_NAMSIZ less its NUL */
#define PROTO_PORT_TEXT_SIZE sizeof("65535")
/* Room for proto_addr_format's longest output: "tls://[" HOST "]:65535" or
 * "unix:" PATH, and the NUL. */
#define PROTO_ADDR_TEXT_SIZE (PROTO_ADDR_HOST_MAX + PROTO_ADDR_PATH_MAX + 16)

/* What a caller accepts beyond HOST:PORT with an IP literal. */
enum proto_addr_flag {
    PROTO_ADDR_ALLOW_UNIX = 1u << 0,         /* unix:/PATH */
    PROTO_ADDR_ALLOW_NAMES = 1u << 1,        /* host names, not only IPs */
    PROTO_ADDR_ALLOW_ZONE = 1u << 2,         /* [fe80::1%eth0] */
    PROTO_ADDR_ALLOW_DEFAULT_PORT = 1u << 3, /* ":PORT" optional */
    PROTO_ADDR_ALLOW_BARE_PATH = 1u << 4,    /* "/PATH" alone is unix */
    PROTO_ADDR_ALLOW_RELATIVE = 1u << 5,     /* unix:PATH, not absolute */
    PROTO_ADDR_ALLOW_TLS = 1u << 6,          /* tls://HOST:PORT */
};

#define PROTO_ADDR_FOR_LISTEN (PROTO_ADDR_ALLOW_UNIX | PROTO_ADDR_ALLOW_TLS)
#define PROTO_ADDR_FOR_NODE (PROTO_ADDR_ALLOW_UNIX | PROTO_ADDR_ALLOW_NAMES)
#define PROTO_ADDR_FOR_METRICS 0u
#define PROTO_ADDR_FOR_CLIENT                                            \
    (PROTO_ADDR_ALLOW_UNIX | PROTO_ADDR_ALLOW_NAMES | PROTO_ADDR_ALLOW_ZONE \
     | PROTO_ADDR_ALLOW_DEFAULT_PORT | PROTO_ADDR_ALLOW_BARE_PATH         \
     | PROTO_ADDR_ALLOW_RELATIVE | PROTO_ADDR_ALLOW_TLS)

/* X(enum suffix, one-line message) */
#define PROTO_ADDR_ERRORS(X)                                                 \
    X(EMPTY, "empty address")                                                \
    X(CONTROL, "control character in the address")                          \
    X(SCHEME, "unknown scheme (use tcp://, tls:// or unix:)")               \
    X(TLS, "tls:// is not allowed here")                                     \
    X(UNIX, "unix sockets are not allowed here")                             \
    X(UNIX_PREFIX, "write a unix socket as unix:/PATH")                      \
    X(UNIX_HOST, "a unix socket URL has no host: unix:///PATH")             \
    X(PATH_EMPTY, "empty unix socket path")                                  \
    X(PATH_RELATIVE, "unix socket path must be absolute")                    \
    X(PATH_LONG, "unix socket path is longer than 107 bytes")                \
    X(NO_PORT, "expected HOST:PORT")                                         \
    X(PORT, "port must be a number from 1 to 65535")                         \
    X(NO_HOST, "missing host")                                               \
    X(BRACKET, "missing ']' after the IPv6 address")                         \
    X(AFTER_BRACKET, "expected [IPv6]:PORT")                                 \
    X(UNBRACKETED, "IPv6 addresses must be in brackets, as [::1]:PORT")      \
    X(IPV6, "not a valid IPv6 address")                                      \
    X(IPV4, "not a valid IPv4 address")                                      \
    X(LITERAL, "host must be an IPv4 address or a [bracketed] IPv6 address") \
    X(NAME, "invalid host name")

enum proto_addr_err {
    PROTO_ADDR_OK = 0,
#define X(name, msg) PROTO_ADDR_E_##name,
    PROTO_ADDR_ERRORS(X)
#undef X
    PROTO_ADDR_E_COUNT
};

enum proto_addr_kind { PROTO_ADDR_KIND_TCP = 1, PROTO_ADDR_KIND_UNIX };

struct proto_addr {
    enum proto_addr_kind kind;
    char host[PROTO_ADDR_HOST_MAX + 1];     /* TCP: no brackets; else "" */
    uint16_t port;                          /* TCP: 1..65535; else 0 */
    bool tls;                               /* TCP: tls://HOST:PORT */
    char path[PROTO_ADDR_PATH_MAX + 1];     /* KIND_UNIX; else "" */
};

/*
 * Parse the NUL-terminated `text` under `flags` (PROTO_ADDR_* bits).
 * Returns PROTO_ADDR_OK with *a filled in, or the reason; *a is then
 * zeroed. proto_addr_strerror gives the reason's message, which does not
 * quote the text (the caller knows it and where it came from).
 */
enum proto_addr_err proto_addr_parse(struct proto_addr *a, const char *text,
                                     unsigned flags);
/* The message of a reason; never NULL. */
const char *proto_addr_strerror(enum proto_addr_err e);

/* "host:port", "tls://host:port", "[v6]:port" or "unix:/path" into buf (size >=
 * PROTO_ADDR_TEXT_SIZE never truncates); returns what snprintf does. The
 * text parses back to the same address under the flags that read it. */
int proto_addr_format(const struct proto_addr *a, char *buf, size_t size);

#endif
