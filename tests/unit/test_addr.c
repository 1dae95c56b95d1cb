/*
 * Unit tests for proto/addr.c: the one address grammar of the daemon's
 * config and the client library.
 *
 * One table holds every form, accepted and refused, with the flags it is
 * read under and the exact outcome (the reason code for a refusal), so a
 * change of rule shows up as a named row. The caller sets (PROTO_ADDR_FOR_*)
 * get their own rows: what listen, redis.nodes, metrics.listen and the
 * client each take.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define ALL PROTO_ADDR_FOR_CLIENT
#define LISTEN PROTO_ADDR_FOR_LISTEN
#define NODE PROTO_ADDR_FOR_NODE
#define METRICS PROTO_ADDR_FOR_METRICS
#define TCP PROTO_ADDR_KIND_TCP
#define UNX PROTO_ADDR_KIND_UNIX
#define E(name) PROTO_ADDR_E_##name
#define OK PROTO_ADDR_OK

/* 107 and 108 bytes of path: the longest that fits in sun_path, and one
 * more. */
#define PATH100 "/123456789012345678901234567890123456789012345678901234567890" \
                "123456789012345678901234567890123456789"
#define PATH107 PATH100 "1234567"
#define PATH108 PATH100 "12345678"

/* 253 and 254 bytes of host name. */
#define LABEL50 "abcdefghij0123456789abcdefghij0123456789abcdefghi."
#define NAME250 LABEL50 LABEL50 LABEL50 LABEL50 LABEL50
#define NAME253 NAME250 "com"
#define NAME254 NAME250 "coms"

struct t_addr {
    const char *text;
    unsigned flags;
    enum proto_addr_err want;
    enum proto_addr_kind kind;      /* when OK */
    const char *host_or_path;       /* when OK */
    unsigned port;                  /* when OK and TCP */
};

static const struct t_addr t_rows[] = {
    /* IPv4 literals, with and without the scheme */
    { "127.0.0.1:7390", 0, OK, TCP, "127.0.0.1", 7390 },
    { "tcp://127.0.0.1:7390", 0, OK, TCP, "127.0.0.1", 7390 },
    { "tcp://0.0.0.0:1", 0, OK, TCP, "0.0.0.0", 1 },
    { "10.1.2.3:65535", 0, OK, TCP, "10.1.2.3", 65535 },
    { "255.255.255.255:80", 0, OK, TCP, "255.255.255.255", 80 },
    { "1.2.3.4:07390", 0, OK, TCP, "1.2.3.4", 7390 },
    { "256.0.0.1:7390", ALL, E(IPV4), 0, NULL, 0 },
    { "1.2.3:7390", ALL, E(IPV4), 0, NULL, 0 },
    { "1.2.3.4.5:7390", ALL, E(IPV4), 0, NULL, 0 },
    { "01.2.3.4:7390", ALL, E(IPV4), 0, NULL, 0 },
    { "1..2.3:7390", ALL, E(IPV4), 0, NULL, 0 },
    { "1234:7390", ALL, E(IPV4), 0, NULL, 0 },
    /* ports */
    { "127.0.0.1:0", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:1", 0, OK, TCP, "127.0.0.1", 1 },
    { "127.0.0.1:65535", 0, OK, TCP, "127.0.0.1", 65535 },
    { "127.0.0.1:65536", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:99999", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:100000", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:007390", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:99999999999", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:+80", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:-1", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:80x", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:80 ", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1: 80", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:0x50", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:abc", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1:", ALL, E(PORT), 0, NULL, 0 },
    { "127.0.0.1", 0, E(NO_PORT), 0, NULL, 0 },
    { "127.0.0.1", NODE, E(NO_PORT), 0, NULL, 0 },
    /* the default port is the client's alone */
    { "127.0.0.1", ALL, OK, TCP, "127.0.0.1", PROTO_DEFAULT_PORT },
    { "locks.example.com", ALL, OK, TCP, "locks.example.com", 7390 },
    { "[::1]", ALL, OK, TCP, "::1", 7390 },
    { "[::1]", NODE, E(AFTER_BRACKET), 0, NULL, 0 },
    { "tcp://", ALL, E(NO_HOST), 0, NULL, 0 },
    { "tcp://", 0, E(NO_HOST), 0, NULL, 0 },
    /* empty host */
    { ":7390", ALL, E(NO_HOST), 0, NULL, 0 },
    { "[]:7390", ALL, E(NO_HOST), 0, NULL, 0 },
    { "tcp://:7390", ALL, E(NO_HOST), 0, NULL, 0 },
    /* IPv6: brackets required, canonical form kept */
    { "[::1]:7390", 0, OK, TCP, "::1", 7390 },
    { "tcp://[::]:7390", 0, OK, TCP, "::", 7390 },
    { "[2001:DB8:0:0::1]:6379", 0, OK, TCP, "2001:db8::1", 6379 },
    { "[0000:0000:0000:0000:0000:0000:0000:0001]:1", 0, OK, TCP, "::1", 1 },
    { "[::ffff:10.0.0.1]:1", 0, OK, TCP, "::ffff:10.0.0.1", 1 },
    { "::1", ALL, E(UNBRACKETED), 0, NULL, 0 },
    { "::1:7390", ALL, E(UNBRACKETED), 0, NULL, 0 },
    { "2001:db8::1:80", ALL, E(UNBRACKETED), 0, NULL, 0 },
    { "[::1", ALL, E(BRACKET), 0, NULL, 0 },
    { "[::1:7390", ALL, E(BRACKET), 0, NULL, 0 },
    { "[::1]7390", ALL, E(AFTER_BRACKET), 0, NULL, 0 },
    { "[::1]x", ALL, E(AFTER_BRACKET), 0, NULL, 0 },
    { "[::1]:", ALL, E(PORT), 0, NULL, 0 },
    { "[::1]:abc", ALL, E(PORT), 0, NULL, 0 },
    { "[::1]:7390x", ALL, E(PORT), 0, NULL, 0 },
    { "[::1]:7390]", ALL, E(PORT), 0, NULL, 0 },
    { "[127.0.0.1]:7390", ALL, E(IPV6), 0, NULL, 0 },
    { "[localhost]:7390", ALL, E(IPV6), 0, NULL, 0 },
    { "[::g]:7390", ALL, E(IPV6), 0, NULL, 0 },
    { "[1:2:3:4:5:6:7:8:9]:7390", ALL, E(IPV6), 0, NULL, 0 },
    { "[0000:0000:0000:0000:0000:0000:0000:0000:1]:1", ALL, E(IPV6), 0,
      NULL, 0 },
    /* zones: for getaddrinfo callers only */
    { "[fe80::1%lo]:1", ALL, OK, TCP, "fe80::1%lo", 1 },
    { "[FE80::1%eth0.5]", ALL, OK, TCP, "fe80::1%eth0.5", 7390 },
    { "[fe80::1%eth0]:7390", NODE, E(IPV6), 0, NULL, 0 },
    { "[fe80::1%]:1", ALL, E(IPV6), 0, NULL, 0 },
    { "[fe80::1%a/b]:1", ALL, E(IPV6), 0, NULL, 0 },
    { "[fe80::1%a b]:1", ALL, E(IPV6), 0, NULL, 0 },
    { "[fe80::1%0123456789abcdef]:1", ALL, E(IPV6), 0, NULL, 0 },
    { "[fe80::1%0123456789abcde]:1", ALL, OK, TCP,
      "fe80::1%0123456789abcde", 1 },
    { "[%lo]:1", ALL, E(IPV6), 0, NULL, 0 },
    /* host names */
    { "redis-1.example.com:6379", NODE, OK, TCP, "redis-1.example.com", 6379 },
    { "localhost:6379", NODE, OK, TCP, "localhost", 6379 },
    { "Redis-B.Example.COM:1", NODE, OK, TCP, "Redis-B.Example.COM", 1 },
    { "1host:1", NODE, OK, TCP, "1host", 1 },
    { "a.b.c.d.e:1", NODE, OK, TCP, "a.b.c.d.e", 1 },
    { NAME253 ":1", NODE, OK, TCP, NAME253, 1 },
    { NAME254 ":1", NODE, E(NAME), 0, NULL, 0 },
    { NAME254 ":1", LISTEN, E(LITERAL), 0, NULL, 0 },
    { "localhost:7390", LISTEN, E(LITERAL), 0, NULL, 0 },
    { "localhost:9390", METRICS, E(LITERAL), 0, NULL, 0 },
    { "bad_host:1", NODE, E(NAME), 0, NULL, 0 },
    { "-bad:1", NODE, E(NAME), 0, NULL, 0 },
    { ".bad:1", NODE, E(NAME), 0, NULL, 0 },
    { "bad host:1", ALL, E(NAME), 0, NULL, 0 },
    { "h\xc3\xa9:1", ALL, E(NAME), 0, NULL, 0 },
    /* unix sockets */
    { "unix:/run/redlockd/redlockd.sock", LISTEN, OK, UNX,
      "/run/redlockd/redlockd.sock", 0 },
    { "unix:/a", NODE, OK, UNX, "/a", 0 },
    { "unix:/tmp/my dir/x.sock", NODE, OK, UNX, "/tmp/my dir/x.sock", 0 },
    { "unix:///run/x.sock", LISTEN, OK, UNX, "/run/x.sock", 0 },
    { "unix:" PATH107, LISTEN, OK, UNX, PATH107, 0 },
    { "unix:" PATH108, ALL, E(PATH_LONG), 0, NULL, 0 },
    { "unix:///" PATH107, LISTEN, E(PATH_LONG), 0, NULL, 0 },
    { "unix:/run/x.sock", METRICS, E(UNIX), 0, NULL, 0 },
    { "unix:///run/x.sock", METRICS, E(UNIX), 0, NULL, 0 },
    { "unix:run/x.sock", NODE, E(PATH_RELATIVE), 0, NULL, 0 },
    { "unix:", NODE, E(PATH_EMPTY), 0, NULL, 0 },
    { "unix:", ALL, E(PATH_EMPTY), 0, NULL, 0 },
    { "unix://", ALL, E(UNIX_HOST), 0, NULL, 0 },
    { "unix://host/x.sock", ALL, E(UNIX_HOST), 0, NULL, 0 },
    { "/run/x.sock", LISTEN, E(UNIX_PREFIX), 0, NULL, 0 },
    { "/run/x.sock", METRICS, E(UNIX), 0, NULL, 0 },
    /* the client's extras: a bare path, a relative unix: path */
    { "/run/redlockd.sock", ALL, OK, UNX, "/run/redlockd.sock", 0 },
    { "unix:rel.sock", ALL, OK, UNX, "rel.sock", 0 },
    { "unix:6379", ALL, OK, UNX, "6379", 0 },
    { "unix:6379", NODE, E(PATH_RELATIVE), 0, NULL, 0 },
    { "tcp://unix:6379", NODE, OK, TCP, "unix", 6379 },
    { PATH108, ALL, E(PATH_LONG), 0, NULL, 0 },
    /* schemes, junk and control bytes */
    { "", ALL, E(EMPTY), 0, NULL, 0 },
    { "http://127.0.0.1:80", ALL, E(SCHEME), 0, NULL, 0 },
    { "udp://1.2.3.4:5", ALL, E(SCHEME), 0, NULL, 0 },
    { "TCP://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "tcp://tcp://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "tcp:/127.0.0.1:1", ALL, E(UNBRACKETED), 0, NULL, 0 },
    /* tls://: listen and clients only */
    { "tls://127.0.0.1:7391", LISTEN, OK, TCP, "127.0.0.1", 7391 },
    { "tls://[::]:7391", LISTEN, OK, TCP, "::", 7391 },
    { "tls://locks.example.com", ALL, OK, TCP, "locks.example.com", 7390 },
    { "tls://locks.example.com:7391", LISTEN, E(LITERAL), 0, NULL, 0 },
    { "tls://127.0.0.1:6379", NODE, E(TLS), 0, NULL, 0 },
    { "tls://127.0.0.1:9390", METRICS, E(TLS), 0, NULL, 0 },
    { "tls://unix:/x.sock", ALL, E(PORT), 0, NULL, 0 },
    { "TLS://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "tls://tcp://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "127.0.0.1:1\n", ALL, E(CONTROL), 0, NULL, 0 },
    { "unix:/a\tb", ALL, E(CONTROL), 0, NULL, 0 },
    { "unix:/a\x7f", ALL, E(CONTROL), 0, NULL, 0 },
    /* tls://: listen and the client (test_addr_rows checks the flag) */
    { "tls://127.0.0.1:7391", ALL, OK, TCP, "127.0.0.1", 7391 },
    { "tls://127.0.0.1:7391", LISTEN, OK, TCP, "127.0.0.1", 7391 },
    { "tls://localhost:7391", LISTEN, E(LITERAL), 0, NULL, 0 },
    { "tls://127.0.0.1:7391", NODE, E(TLS), 0, NULL, 0 },
    { "tls://127.0.0.1:7391", METRICS, E(TLS), 0, NULL, 0 },
    { "tls://locks.example.com", ALL, OK, TCP, "locks.example.com", 7390 },
    { "tls://[::1]:1", ALL, OK, TCP, "::1", 1 },
    { "tls://unix:1", ALL, OK, TCP, "unix", 1 },
    { "tls://", ALL, E(NO_HOST), 0, NULL, 0 },
    { "tls://:1", ALL, E(NO_HOST), 0, NULL, 0 },
    { "tls://127.0.0.1:0", ALL, E(PORT), 0, NULL, 0 },
    { "tls://unix:/run/x.sock", ALL, E(PORT), 0, NULL, 0 },
    { "tls:///run/x.sock", ALL, E(NAME), 0, NULL, 0 },
    { "tls://tcp://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "tcp://tls://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "TLS://127.0.0.1:1", ALL, E(SCHEME), 0, NULL, 0 },
    { "tls:/127.0.0.1:1", ALL, E(UNBRACKETED), 0, NULL, 0 },
};

START_TEST(test_addr_rows)
{
    const struct t_addr *t = &t_rows[_i];
    struct proto_addr a;
    enum proto_addr_err e;

    memset(&a, 'x', sizeof(a));
    e = proto_addr_parse(&a, t->text, t->flags);
    ck_assert_msg(e == t->want, "\"%s\" flags %#x: got %d (%s), want %d (%s)",
                  t->text, t->flags, e, proto_addr_strerror(e), t->want,
                  proto_addr_strerror(t->want));
    if (e != PROTO_ADDR_OK) {
        ck_assert_int_eq(a.kind, 0);
        ck_assert(!a.tls);
        ck_assert_str_eq(a.host, "");
        ck_assert_str_eq(a.path, "");
        ck_assert_uint_eq(a.port, 0);
        return;
    }
    ck_assert_int_eq(a.kind, t->kind);
    ck_assert(a.tls == (strncmp(t->text, "tls://", 6) == 0));
    if (t->kind == PROTO_ADDR_KIND_TCP) {
        ck_assert_str_eq(a.host, t->host_or_path);
        ck_assert_uint_eq(a.port, t->port);
        ck_assert_str_eq(a.path, "");
    } else {
        ck_assert_str_eq(a.path, t->host_or_path);
        ck_assert_str_eq(a.host, "");
        ck_assert_uint_eq(a.port, 0);
    }
}
END_TEST

/* Each caller set, on one form of each kind. */
struct t_set {
    unsigned flags;
    enum proto_addr_err v4, name, v6, zone, nport, unixp, bare, rel;
};

static const struct t_set t_sets[] = {
    { LISTEN, OK, E(LITERAL), OK, E(IPV6), E(NO_PORT), OK, E(UNIX_PREFIX),
      E(PATH_RELATIVE) },
    { NODE, OK, OK, OK, E(IPV6), E(NO_PORT), OK, E(UNIX_PREFIX),
      E(PATH_RELATIVE) },
    { METRICS, OK, E(LITERAL), OK, E(IPV6), E(NO_PORT), E(UNIX), E(UNIX),
      E(UNIX) },
    { ALL, OK, OK, OK, OK, OK, OK, OK, OK },
};

START_TEST(test_addr_sets)
{
    const struct t_set *t = &t_sets[_i];
    struct proto_addr a;

    ck_assert_int_eq(proto_addr_parse(&a, "tcp://10.0.0.1:1", t->flags), t->v4);
    ck_assert_int_eq(proto_addr_parse(&a, "redis-a:6379", t->flags), t->name);
    ck_assert_int_eq(proto_addr_parse(&a, "[::]:1", t->flags), t->v6);
    ck_assert_int_eq(proto_addr_parse(&a, "[fe80::1%lo]:1", t->flags),
                     t->zone);
    ck_assert_int_eq(proto_addr_parse(&a, "10.0.0.1", t->flags), t->nport);
    ck_assert_int_eq(proto_addr_parse(&a, "unix:/run/r.sock", t->flags),
                     t->unixp);
    ck_assert_int_eq(proto_addr_parse(&a, "/run/r.sock", t->flags), t->bare);
    ck_assert_int_eq(proto_addr_parse(&a, "unix:r.sock", t->flags), t->rel);
}
END_TEST

START_TEST(test_addr_null)
{
    struct proto_addr a;

    ck_assert_int_eq(proto_addr_parse(&a, NULL, ALL), E(EMPTY));
    ck_assert_int_eq(a.kind, 0);
}
END_TEST

/* Every reason has a distinct one-line message; out of range is safe. */
START_TEST(test_addr_messages)
{
    int i, j;

    for (i = PROTO_ADDR_OK; i < PROTO_ADDR_E_COUNT; i++) {
        const char *m = proto_addr_strerror(i);

        ck_assert_ptr_nonnull(m);
        ck_assert_uint_gt(strlen(m), 0);
        ck_assert_ptr_null(strchr(m, '\n'));
        for (j = 0; j < i; j++)
            ck_assert_str_ne(proto_addr_strerror(j), m);
    }
    ck_assert_str_eq(proto_addr_strerror(PROTO_ADDR_E_COUNT),
                     "invalid address");
    ck_assert_str_eq(proto_addr_strerror(-1), "invalid address");
    /* The config's messages, as docs/configuration.md shows them. */
    ck_assert_str_eq(proto_addr_strerror(E(PORT)),
                     "port must be a number from 1 to 65535");
    ck_assert_str_eq(proto_addr_strerror(E(PATH_RELATIVE)),
                     "unix socket path must be absolute");
    ck_assert_str_eq(proto_addr_strerror(E(LITERAL)),
                     "host must be an IPv4 address or a [bracketed] IPv6 "
                     "address");
}
END_TEST

struct t_fmt {
    const char *text;
    const char *want;
};

static const struct t_fmt t_fmt_rows[] = {
    { "tcp://127.0.0.1:7390", "127.0.0.1:7390" },
    { "[2001:DB8::1]:1", "[2001:db8::1]:1" },
    { "[fe80::1%lo]", "[fe80::1%lo]:7390" },
    { "locks.example.com", "locks.example.com:7390" },
    { "unix:///run/x.sock", "unix:/run/x.sock" },
    { "/run/x.sock", "unix:/run/x.sock" },
    { "unix:" PATH107, "unix:" PATH107 },
    { "//run/x.sock", "unix:////run/x.sock" },
    { "unix:////x", "unix:////x" },
    { "unix", "tcp://unix:7390" },
    { "tcp://unix:1", "tcp://unix:1" },
    { "tls://127.0.0.1:7391", "tls://127.0.0.1:7391" },
    { "tls://[::1]", "tls://[::1]:7390" },
    { "tls://unix:1", "tls://unix:1" },
    { "Unix:1", "Unix:1" },
    { "[1111:2222:3333:4444:5555:6666:7777:8888%0123456789abcde]:65535",
      "[1111:2222:3333:4444:5555:6666:7777:8888%0123456789abcde]:65535" },
    { "tls://127.0.0.1:7391", "tls://127.0.0.1:7391" },
    { "tls://[2001:DB8::1]", "tls://[2001:db8::1]:7390" },
    { "tls://unix:1", "tls://unix:1" },
    { "tls://" NAME253 ":65535", "tls://" NAME253 ":65535" },
    { "tls://[1111:2222:3333:4444:5555:6666:7777:8888%0123456789abcde]:65535",
      "tls://[1111:2222:3333:4444:5555:6666:7777:8888%0123456789abcde]"
      ":65535" },
};

/* What proto_addr_format writes reads back as the same address. */
START_TEST(test_addr_format)
{
    const struct t_fmt *t = &t_fmt_rows[_i];
    struct proto_addr a, b;
    char buf[PROTO_ADDR_TEXT_SIZE];
    int n;

    ck_assert_int_eq(proto_addr_parse(&a, t->text, ALL), OK);
    n = proto_addr_format(&a, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_lt(n, (int)sizeof(buf));
    ck_assert_str_eq(buf, t->want);
    ck_assert_int_eq(proto_addr_parse(&b, buf, ALL), OK);
    ck_assert_mem_eq(&a, &b, sizeof(a));
}
END_TEST

START_TEST(test_addr_format_small)
{
    struct proto_addr a;
    char buf[8];

    ck_assert_int_eq(proto_addr_parse(&a, "127.0.0.1:7390", 0), OK);
    ck_assert_int_eq(proto_addr_format(&a, buf, sizeof(buf)), 14);
    ck_assert_str_eq(buf, "127.0.0");
}
END_TEST

static Suite *addr_suite(void)
{
    Suite *s = suite_create("addr");
    TCase *tc = tcase_create("parse");

    tcase_add_loop_test(tc, test_addr_rows, 0, ARRAY_LEN(t_rows));
    tcase_add_loop_test(tc, test_addr_sets, 0, ARRAY_LEN(t_sets));
    tcase_add_test(tc, test_addr_null);
    tcase_add_test(tc, test_addr_messages);
    suite_add_tcase(s, tc);

    tc = tcase_create("format");
    tcase_add_loop_test(tc, test_addr_format, 0, ARRAY_LEN(t_fmt_rows));
    tcase_add_test(tc, test_addr_format_small);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(addr_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
