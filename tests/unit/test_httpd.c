/*
 * test_httpd: the daemon's HTTP server (daemon/httpd.h), which serves the
 * metrics endpoint.
 *
 * First its request reader and response format, which need no socket,
 * on a table of heads fed at once and byte by byte. Then the server on a
 * real loop and loopback sockets, driven from this one thread: a route's
 * reply, HEAD, the answers of its own, the connection cap, and destroying
 * it with connections open (the loop must then run out, and sanitizers
 * see nothing left). Timeouts (408, linger) take seconds and are left to
 * tests/integration/test_metrics.c.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "httpd.h"
#include "sbuf.h"
#include "timer.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void serve_hello(struct httpd_reply *reply)
{
    sbuf_puts(&reply->body, "hello\n");
}

static void serve_busy(struct httpd_reply *reply)
{
    reply->status = "503 Service Unavailable";
    reply->ctype = "text/x-test";
    sbuf_puts(&reply->headers, "X-Why: because\r\n");
    sbuf_puts(&reply->body, "busy\n");
}

static const struct httpd_route routes[] = {
    { "/metrics", serve_hello },
    { "/healthz", serve_busy },
};

/* ---- the request reader ------------------------------------------------ */

struct reader_case {
    const char *in;
    enum httpd_answer answer;
    size_t route;               /* for ROUTE */
    bool head;
};

#define ROUTE_M HTTPD_ANSWER_ROUTE, 0       /* /metrics */
#define ROUTE_H HTTPD_ANSWER_ROUTE, 1       /* /healthz */

static const struct reader_case reader_cases[] = {
    { "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", ROUTE_M, false },
    { "HEAD /metrics HTTP/1.1\r\n\r\n", ROUTE_M, true },
    { "GET /healthz?probe=1 HTTP/1.0\n\n", ROUTE_H, false },
    { "HEAD /healthz#x HTTP/1.0\r\n\r\n", ROUTE_H, true },
    { "GET http://h:1/metrics HTTP/1.1\r\n\r\n", ROUTE_M, false },
    { "\r\nGET /metrics HTTP/1.1\r\n\r\n", ROUTE_M, false },
    { "GET /metrics/ HTTP/1.1\r\n\r\n", HTTPD_ANSWER_NOT_FOUND, 0, false },
    { "GET /METRICS HTTP/1.1\r\n\r\n", HTTPD_ANSWER_NOT_FOUND, 0, false },
    { "HEAD / HTTP/1.1\r\n\r\n", HTTPD_ANSWER_NOT_FOUND, 0, true },
    { "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
      HTTPD_ANSWER_BAD_METHOD, 0, false },
    { "OPTIONS /metrics HTTP/1.1\r\n\r\n", HTTPD_ANSWER_BAD_METHOD, 0, false },
    { "GET /metrics HTTP/2.0\r\n\r\n", HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "GET /metrics\r\n\r\n", HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "GET metrics HTTP/1.1\r\n\r\n", HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "FROB /metrics HTTP/1.1\r\n\r\n", HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "hello there\r\n\r\n", HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "GET /metrics HTTP/1.1\r\nbad header\r\n\r\n",
      HTTPD_ANSWER_BAD_REQUEST, 0, false },
    { "GET /metrics HTTP/1.1\r\nHost: x\r\n", HTTPD_ANSWER_NONE, 0, false },
    { "", HTTPD_ANSWER_NONE, 0, false },
};

/* Fed at once and fed byte by byte, a head reads the same. */
START_TEST(reader_table)
{
    for (size_t i = 0; i < NELEM(reader_cases); i++) {
        const struct reader_case *c = &reader_cases[i];
        size_t len = strlen(c->in);
        struct httpd_request *whole = malloc(sizeof(*whole));
        struct httpd_request *bytes = malloc(sizeof(*bytes));

        ck_assert(whole && bytes);
        httpd_request_init(whole, routes, NELEM(routes));
        httpd_request_init(bytes, routes, NELEM(routes));
        httpd_request_feed(whole, c->in, len);
        for (size_t k = 0; k < len; k++)
            httpd_request_feed(bytes, c->in + k, 1);
        ck_assert_msg(whole->answer == c->answer, "case %zu: answer %d, "
                      "want %d", i, whole->answer, c->answer);
        ck_assert_msg(bytes->answer == c->answer, "case %zu byte by byte: "
                      "answer %d, want %d", i, bytes->answer, c->answer);
        if (c->answer == HTTPD_ANSWER_ROUTE)
            ck_assert_msg(whole->route == c->route &&
                          bytes->route == c->route, "case %zu: route", i);
        ck_assert_msg(httpd_request_is_head(whole) == c->head,
                      "case %zu: HEAD", i);
        ck_assert_msg(whole->head_len == bytes->head_len,
                      "case %zu: head %zu vs %zu bytes", i, whole->head_len,
                      bytes->head_len);
        free(whole);
        free(bytes);
    }
}
END_TEST

/* A head of exactly HTTPD_HEAD_MAX bytes is read; one byte more is 431,
 * and nothing past the limit is taken. */
START_TEST(reader_head_limit)
{
    static const char line[] = "GET /healthz HTTP/1.1\r\nX: ";
    char *buf = malloc(HTTPD_HEAD_MAX + 64);
    struct httpd_request *r = malloc(sizeof(*r));
    size_t n;

    ck_assert(buf && r);
    for (size_t extra = 0; extra <= 1; extra++) {
        size_t total = HTTPD_HEAD_MAX + extra;

        memcpy(buf, line, sizeof(line) - 1);
        memset(buf + sizeof(line) - 1, 'a', total - (sizeof(line) - 1) - 4);
        memcpy(buf + total - 4, "\r\n\r\n", 4);
        httpd_request_init(r, routes, NELEM(routes));
        n = httpd_request_feed(r, buf, total);
        ck_assert_msg(r->answer == (extra ? HTTPD_ANSWER_TOO_LARGE
                                          : HTTPD_ANSWER_ROUTE),
                      "%zu-byte head: answer %d", total, r->answer);
        ck_assert_uint_le(n, HTTPD_HEAD_MAX);
        ck_assert_uint_eq(httpd_request_feed(r, "\r\n", 2), 0);
    }
    free(r);
    free(buf);
}
END_TEST

/* HEAD keeps the headers, Content-Length too, and drops the body. */
START_TEST(response_head_only)
{
    struct sbuf get = SBUF_INIT, head = SBUF_INIT;
    const char *g, *h;

    httpd_format_response(&get, "200 OK", "text/plain", "X: y\r\n",
                          "body\n", 5, false);
    httpd_format_response(&head, "200 OK", "text/plain", "X: y\r\n",
                          "body\n", 5, true);
    g = sbuf_cstr(&get);
    h = sbuf_cstr(&head);
    ck_assert_str_eq(h, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                     "Content-Length: 5\r\nCache-Control: no-store\r\n"
                     "X: y\r\nConnection: close\r\n\r\n");
    ck_assert_uint_eq(strlen(g), strlen(h) + 5);
    ck_assert(strncmp(g, h, strlen(h)) == 0);
    ck_assert_str_eq(g + strlen(h), "body\n");
    sbuf_deinit(&get);
    sbuf_deinit(&head);
}
END_TEST

/* ---- the server on a loop ---------------------------------------------- */

static uv_loop_t loop;
static struct httpd *server;
static struct sockaddr_in addr;

/* A loopback port nobody listens on now (the kernel's pick). */
static void pick_addr(void)
{
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert(fd >= 0);
    ck_assert(bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&addr, &len) == 0);
    close(fd);
}

static void server_setup(void)
{
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(timer_sys_init(&loop), 0);
    pick_addr();
    ck_assert_int_eq(httpd_create(&server, &loop,
                                  (const struct sockaddr *)&addr, "test",
                                  routes, NELEM(routes)), 0);
}

/* Destroy the server (if the test did not) and check that the loop runs
 * out: every handle closed, every connection freed. */
static void server_teardown(void)
{
    if (server)
        httpd_destroy(server);
    server = NULL;
    timer_sys_deinit();
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert(!uv_loop_alive(&loop));
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static void pump(int ms)
{
    struct timespec ts = { 0, 1000000 };

    for (int i = 0; i < ms; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        nanosleep(&ts, NULL);
    }
}

static int client_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert(fd >= 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0,
                  "connect: %s", strerror(errno));
    return fd;
}

/* Run the loop until the server closes fd's connection; what it sent.
 * A reset counts as a close. */
static char *client_read_all(int fd)
{
    struct sbuf got = SBUF_INIT;
    char buf[4096];

    for (int i = 0; i < 3000; i++) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n > 0) {
            sbuf_append(&got, buf, (size_t)n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            char *s = strdup(sbuf_cstr(&got));

            sbuf_deinit(&got);
            close(fd);
            return s;
        }
        pump(1);
    }
    ck_abort_msg("the server did not close within 3 s");
    return NULL;
}

static char *client_request(const char *req)
{
    int fd = client_connect();

    ck_assert(send(fd, req, strlen(req), 0) == (ssize_t)strlen(req));
    return client_read_all(fd);
}

/* A route's reply as it set it; HEAD without the body; GET of no route
 * and POST answered by the server itself. */
START_TEST(server_routes_and_answers)
{
    char *r;

    r = client_request("GET /metrics HTTP/1.1\r\n\r\n");
    ck_assert_str_eq(r, "HTTP/1.1 200 OK\r\n"
                     "Content-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: 6\r\nCache-Control: no-store\r\n"
                     "Connection: close\r\n\r\nhello\n");
    free(r);
    r = client_request("HEAD /healthz HTTP/1.0\r\n\r\n");
    ck_assert_str_eq(r, "HTTP/1.1 503 Service Unavailable\r\n"
                     "Content-Type: text/x-test\r\n"
                     "Content-Length: 5\r\nCache-Control: no-store\r\n"
                     "X-Why: because\r\nConnection: close\r\n\r\n");
    free(r);
    r = client_request("GET /nope HTTP/1.1\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 404 Not Found\r\n", 24) == 0, "%s", r);
    ck_assert_msg(strstr(r, "\r\n\r\nnot found\n"), "%s", r);
    free(r);
    r = client_request("POST /metrics HTTP/1.1\r\n\r\n");
    ck_assert_msg(strstr(r, " 405 Method Not Allowed\r\n") &&
                  strstr(r, "\r\nAllow: GET, HEAD\r\n"), "%s", r);
    free(r);
}
END_TEST

/* One connection over the cap is accepted and closed at once, with no
 * answer; the others stay open until the server is destroyed, which
 * closes them. */
START_TEST(server_cap_and_destroy)
{
    int fds[HTTPD_MAX_CONNS];
    char *r;

    for (size_t i = 0; i < NELEM(fds); i++) {
        fds[i] = client_connect();
        pump(1);
    }
    /* One of them has half a head: destroy must not wait for the rest. */
    ck_assert(send(fds[0], "GET /met", 8, 0) == 8);
    pump(20);
    r = client_request("GET /metrics HTTP/1.1\r\n\r\n");
    ck_assert_str_eq(r, "");
    free(r);
    ck_assert(recv(fds[1], (char[1]){ 0 }, 1, MSG_DONTWAIT) < 0 &&
              errno == EAGAIN);
    httpd_destroy(server);
    server = NULL;
    for (size_t i = 0; i < NELEM(fds); i++) {
        r = client_read_all(fds[i]);
        ck_assert_str_eq(r, "");
        free(r);
    }
}
END_TEST

/* A port already taken: the bind's error, and nothing left open. */
START_TEST(server_create_fails)
{
    struct httpd *second = (struct httpd *)&loop;   /* must be reset */

    ck_assert_int_eq(httpd_create(&second, &loop,
                                  (const struct sockaddr *)&addr, "test",
                                  routes, NELEM(routes)), UV_EADDRINUSE);
    ck_assert_ptr_null(second);
}
END_TEST

static Suite *httpd_suite(void)
{
    Suite *s = suite_create("httpd");
    TCase *tc = tcase_create("reader");

    tcase_add_test(tc, reader_table);
    tcase_add_test(tc, reader_head_limit);
    tcase_add_test(tc, response_head_only);
    suite_add_tcase(s, tc);
    tc = tcase_create("server");
    tcase_add_checked_fixture(tc, server_setup, server_teardown);
    tcase_add_test(tc, server_routes_and_answers);
    tcase_add_test(tc, server_cap_and_destroy);
    tcase_add_test(tc, server_create_fails);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(httpd_suite());
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
