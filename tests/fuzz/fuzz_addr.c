/*
 * libFuzzer target for proto/addr.c: every input is an address text, read
 * under each caller's set of rules (listen, redis.nodes, metrics.listen,
 * the client) and under the flags its first byte names.
 *
 * Besides the sanitizers' memory checks, it asserts what the daemon and the
 * client rely on: an accepted address holds only validated, terminated
 * fields; a refused one leaves the struct zeroed and a one-line reason;
 * proto_addr_format's text reads back as the same address; and the client,
 * whose rules are a superset, accepts whatever the daemon accepts, with the
 * same result.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "fuzz.h"

/* The client's set holds every flag. */
#define FUZZ_ALL_FLAGS PROTO_ADDR_FOR_CLIENT

static const unsigned fuzz_sets[] = {
    PROTO_ADDR_FOR_LISTEN,
    PROTO_ADDR_FOR_NODE,
    PROTO_ADDR_FOR_METRICS,
    PROTO_ADDR_FOR_CLIENT,
};

static int fuzz_printable(const char *s)
{
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return 0;
    }
    return 1;
}

static int fuzz_all_zero(const struct proto_addr *a)
{
    static const struct proto_addr zero;

    return memcmp(a, &zero, sizeof(zero)) == 0;
}

static void fuzz_check_tcp(const struct proto_addr *a, unsigned flags)
{
    size_t n = strnlen(a->host, sizeof(a->host));

    FUZZ_CHECK(n > 0 && n < sizeof(a->host));
    FUZZ_CHECK(fuzz_printable(a->host) && !strchr(a->host, ' '));
    FUZZ_CHECK(a->port >= 1);
    FUZZ_CHECK(a->path[0] == '\0');
    if (!(flags & PROTO_ADDR_ALLOW_ZONE))
        FUZZ_CHECK(!strchr(a->host, '%'));
    if (!(flags & PROTO_ADDR_ALLOW_TLS))
        FUZZ_CHECK(!a->tls);
}

static void fuzz_check_unix(const struct proto_addr *a, unsigned flags)
{
    size_t n = strnlen(a->path, sizeof(a->path));

    FUZZ_CHECK(flags & PROTO_ADDR_ALLOW_UNIX);
    FUZZ_CHECK(n > 0 && n <= PROTO_ADDR_PATH_MAX);
    FUZZ_CHECK(a->host[0] == '\0' && a->port == 0 && !a->tls);
    if (!(flags & PROTO_ADDR_ALLOW_RELATIVE))
        FUZZ_CHECK(a->path[0] == '/');
}

/* The formatted text parses back, under the same rules, to the same. */
static void fuzz_roundtrip(const struct proto_addr *a, unsigned flags)
{
    char text[PROTO_ADDR_TEXT_SIZE];
    struct proto_addr b;
    int n = proto_addr_format(a, text, sizeof(text));

    FUZZ_CHECK(n > 0 && (size_t)n < sizeof(text));
    FUZZ_CHECK(proto_addr_parse(&b, text, flags) == PROTO_ADDR_OK);
    FUZZ_CHECK(memcmp(a, &b, sizeof(b)) == 0);
}

static void fuzz_one(const char *text, unsigned flags)
{
    struct proto_addr a, c;
    enum proto_addr_err e = proto_addr_parse(&a, text, flags);
    const char *msg = proto_addr_strerror(e);

    FUZZ_CHECK(msg && msg[0] != '\0' && fuzz_printable(msg));
    if (e != PROTO_ADDR_OK) {
        FUZZ_CHECK(e > PROTO_ADDR_OK && e < PROTO_ADDR_E_COUNT);
        FUZZ_CHECK(fuzz_all_zero(&a));
        return;
    }
    FUZZ_CHECK(a.kind == PROTO_ADDR_KIND_TCP || a.kind == PROTO_ADDR_KIND_UNIX);
    if (a.kind == PROTO_ADDR_KIND_TCP)
        fuzz_check_tcp(&a, flags);
    else
        fuzz_check_unix(&a, flags);
    fuzz_roundtrip(&a, flags);
    /* More flags only ever accept more, and never change a result. */
    FUZZ_CHECK(proto_addr_parse(&c, text, FUZZ_ALL_FLAGS) == PROTO_ADDR_OK);
    FUZZ_CHECK(memcmp(&a, &c, sizeof(c)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    size_t i;

    FUZZ_CHECK(text);
    if (size > 0)
        memcpy(text, data, size);
    text[size] = '\0';
    for (i = 0; i < sizeof(fuzz_sets) / sizeof(fuzz_sets[0]); i++)
        fuzz_one(text, fuzz_sets[i]);
    /* The first byte as a flag set, the rest as the text. */
    if (size > 0)
        fuzz_one(text + 1, (unsigned)data[0] & FUZZ_ALL_FLAGS);
    free(text);
    return 0;
}
