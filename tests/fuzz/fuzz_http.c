/*
 * libFuzzer target for the HTTP request reader (httpd_request_* in
 * daemon/httpd.c, which serves the metrics endpoint), the one place the
 * daemon reads HTTP from the network.
 *
 * The first input byte picks a chunk size; the rest is what a client
 * sends. The stream is read twice, at once and in chunks, as reads from a
 * socket may cut it anywhere, against the metrics endpoint's two routes.
 * Besides the sanitizers' memory checks, it asserts: both reads decide the
 * same, the head never passes HTTPD_HEAD_MAX, an undecided head took every
 * byte, a request routed to /metrics or /healthz is a GET or HEAD naming
 * that path, and the response for it carries its body's length and, for
 * HEAD, no body.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "httpd.h"
#include "sbuf.h"

/* The reader only matches paths: nothing is served here. */
static const struct httpd_route routes[] = {
    { "/metrics", NULL },
    { "/healthz", NULL },
};

/* Allocated once: a struct httpd_request holds a head-sized buffer. */
static struct httpd_request *whole, *chunked;

static size_t fuzz_feed_all(struct httpd_request *r, const char *s,
                            size_t len, size_t chunk)
{
    size_t taken = 0;

    for (size_t off = 0; off < len; off += chunk) {
        size_t n = len - off < chunk ? len - off : chunk;
        size_t used = httpd_request_feed(r, s + off, n);

        FUZZ_CHECK(used <= n);
        /* Nothing is taken after the head is decided. */
        FUZZ_CHECK(used == n || r->answer != HTTPD_ANSWER_NONE);
        taken += used;
    }
    return taken;
}

static void fuzz_check_route(const struct httpd_request *r, const char *s,
                             size_t len)
{
    const char *path;

    FUZZ_CHECK(r->route < sizeof(routes) / sizeof(routes[0]));
    path = routes[r->route].path;

    FUZZ_CHECK(r->parser.method == HTTP_GET ||
               r->parser.method == HTTP_HEAD);
    FUZZ_CHECK(r->parser.http_major == 1);
    FUZZ_CHECK(memmem(s, len, path, strlen(path)));
    FUZZ_CHECK(memmem(r->url, r->url_len, path, strlen(path)));
}

/* The response to a request, with the stream itself as the body. */
static void fuzz_check_response(const struct httpd_request *r,
                                const char *s, size_t len)
{
    bool head_only = httpd_request_is_head(r);
    struct sbuf b = SBUF_INIT;
    char want[64];
    const char *end;

    httpd_format_response(&b, "200 OK", "text/plain", "", s, len,
                            head_only);
    snprintf(want, sizeof(want), "\r\nContent-Length: %zu\r\n", len);
    FUZZ_CHECK(memmem(b.data, b.len, want, strlen(want)));
    end = memmem(b.data, b.len, "\r\n\r\n", 4);
    FUZZ_CHECK(end);
    FUZZ_CHECK((size_t)(end + 4 - b.data) + (head_only ? 0 : len) == b.len);
    sbuf_deinit(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data + 1;
    size_t len, chunk, a, b;

    if (size == 0)
        return 0;
    len = size - 1;
    chunk = (size_t)data[0] % 64 + 1;
    if (!whole) {
        whole = malloc(sizeof(*whole));
        chunked = malloc(sizeof(*chunked));
        FUZZ_CHECK(whole && chunked);
    }
    httpd_request_init(whole, routes, sizeof(routes) / sizeof(routes[0]));
    httpd_request_init(chunked, routes, sizeof(routes) / sizeof(routes[0]));
    a = fuzz_feed_all(whole, s, len, len > 0 ? len : 1);
    b = fuzz_feed_all(chunked, s, len, chunk);

    FUZZ_CHECK(whole->answer == chunked->answer);
    FUZZ_CHECK(a == whole->head_len && b == chunked->head_len);
    FUZZ_CHECK(whole->head_len <= HTTPD_HEAD_MAX);
    FUZZ_CHECK(whole->url_len <= whole->head_len);
    FUZZ_CHECK(httpd_request_is_head(whole) ==
               httpd_request_is_head(chunked));
    /* Where the reader stops does not depend on the cut, nor what it kept
     * of a good head. (Of a bad one, the parser hands over the target's
     * pieces up to each cut, but not the piece an error interrupts.) */
    FUZZ_CHECK(whole->head_len == chunked->head_len);
    if (whole->answer != HTTPD_ANSWER_BAD_REQUEST)
        FUZZ_CHECK(whole->url_len == chunked->url_len &&
                   memcmp(whole->url, chunked->url, whole->url_len) == 0);
    switch (whole->answer) {
    case HTTPD_ANSWER_NONE:
        FUZZ_CHECK(whole->head_len == len && len < HTTPD_HEAD_MAX);
        break;
    case HTTPD_ANSWER_TOO_LARGE:
        FUZZ_CHECK(whole->head_len == HTTPD_HEAD_MAX);
        break;
    case HTTPD_ANSWER_ROUTE:
        FUZZ_CHECK(whole->route == chunked->route);
        fuzz_check_route(whole, s, len);
        break;
    case HTTPD_ANSWER_NOT_FOUND:
    case HTTPD_ANSWER_BAD_METHOD:
    case HTTPD_ANSWER_BAD_REQUEST:
        break;
    default:
        FUZZ_CHECK(!"unexpected answer");
    }
    fuzz_check_response(whole, s, len);
    return 0;
}
