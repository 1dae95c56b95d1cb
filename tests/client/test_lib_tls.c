/*
 * test_lib_tls: libredlockd over tls:// (issue 21, item 2) against the real
 * daemon's TLS listener and real redis-server nodes.
 *
 * The certificates are made once per run by tests/tools/mkcerts.sh (its
 * header lists them) into a temporary directory; each test starts a
 * daemon whose tls:// listener (harness: d->tls_port) uses the pair it
 * needs. What is checked, each with the reason the error message names:
 *   - a full LOCK / UNLOCK over TLS, by IP address and by host name, with
 *     a plain-TCP handle of the same daemon BUSY meanwhile; the CA from
 *     $REDLOCKD_TLS_CA when the option is not set;
 *   - a CA that did not sign the server's certificate: "unknown CA";
 *   - a certificate for another name: "name mismatch" (and the name that
 *     was checked); tls_server_name naming it connects;
 *   - an expired certificate: "expired";
 *   - tls.verify_clients: no client certificate, "the server requires a
 *     client certificate"; with one, the lock works;
 *   - tls:// to the plain TCP port: "does not speak TLS";
 *   - a plain address of the TLS port: the daemon's own line, "this port
 *     speaks TLS", as REDLOCKD_E_ARG (with and without detach=, whose
 *     fallback HELLO must not hide it; also first of two servers);
 *   - option files that do not load: REDLOCKD_E_INVALID naming the file;
 *   - failover: two tls:// servers, the handle's daemon SIGKILLed, the
 *     lease adopted over TLS on the other (same fence);
 *   - the first server down: the handle connects to the second.
 */
#include <check.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <openssl/ssl.h>

#include "harness.h"
#include "redlockd.h"

#define HANDLES_MAX 8

static struct h_cluster K;
static struct h_daemon *const D = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];
static struct redlockd *H[HANDLES_MAX];
static int nh;

/* ---- fixture ---- */

static void setup(void)
{
    h_cluster_init(&K);
    memset(H, 0, sizeof(H));
    nh = 0;
}

static void teardown(void)
{
    int rc;

    h_cluster_continue(&K);
    for (int i = 0; i < nh; i++)
        redlockd_close(H[i]);
    nh = 0;
    rc = h_cluster_finish(&K);
    h_cluster_cleanup(&K);
    ck_assert_msg(rc == 0, "redlockd exited with status %d on SIGTERM", rc);
}

/* ---- helpers ---- */

/* A daemon d over the nodes, listening on tls:// with the pair `name`
 * (server: server.crt, server.key), `extra` more of "tls" (may be ""). */
static void start_tls(int d, const char *name, const char *extra)
{
    char json[2048];

    if (K.nnodes == 0)
        h_cluster_nodes(&K, 1, NULL);
    snprintf(json, sizeof(json),
             "{\"shutdown_timeout_ms\":300,\"tls\":{\"cert_file\":\"%s/%s.crt\","
             "\"key_file\":\"%s/%s.key\"%s}}", h_certs_dir(), name,
             h_certs_dir(), name, extra);
    h_cluster_daemon(&K, d, json, h_scale(5000));
    ck_assert_msg(K.daemons[d].tls_port > 0, "no tls:// listener");
}

static void addr_of(char *buf, size_t size, const char *host, int port)
{
    snprintf(buf, size, "tls://%s:%d", host, port);
}

/* Connect, keeping the handle for the teardown. */
static struct redlockd *open_ok(const struct redlockd_opts *o)
{
    struct redlockd_error err;
    struct redlockd *h = NULL;
    int rc;

    ck_assert_int_lt(nh, HANDLES_MAX);
    rc = redlockd_connect(&h, o, &err);
    ck_assert_msg(rc == 0 && h, "connect to %s: %d %s",
                  o->server ? o->server : o->servers[0], rc,
                  rc < 0 ? err.msg : "");
    H[nh++] = h;
    return h;
}

/* A connect that must fail with code `want` and a message holding each
 * of the NULL-terminated texts. */
static void open_fails(const struct redlockd_opts *o, int want, ...)
{
    struct redlockd_error err;
    struct redlockd *h = NULL;
    const char *text;
    va_list ap;
    int rc;

    memset(&err, 0, sizeof(err));
    rc = redlockd_connect(&h, o, &err);
    ck_assert_msg(rc == -want && !h, "connect to %s: %d (%s: %s), want -%d",
                  o->server, rc, redlockd_code_name(rc), err.msg, want);
    ck_assert_int_eq(err.code, want);
    fprintf(stderr, "tls: %s: %s\n", o->server, err.msg);
    va_start(ap, want);
    while ((text = va_arg(ap, const char *)))
        ck_assert_msg(strstr(err.msg, text), "message \"%s\" lacks \"%s\"",
                      err.msg, text);
    va_end(ap);
}

static void lock_unlock(struct redlockd *h, struct redlockd *other,
                        const char *res)
{
    struct redlockd_lease l;
    int rc = redlockd_lock(h, res, 10000, 0, 1, &l);

    ck_assert_msg(rc == 0, "LOCK %s over TLS: %d %s", res, rc,
                  redlockd_last_error(h)->msg);
    ck_assert_uint_gt(l.fence, 0);
    ck_assert_int_eq(redlockd_lease_check(h, res), 0);
    ck_assert_int_eq(redlockd_refresh(h), 0);
    ck_assert_int_eq(redlockd_ping(h), 0);
    if (other)
        ck_assert_int_eq(redlockd_lock(other, res, 10000, 0, 1, NULL),
                         -REDLOCKD_E_BUSY);
    ck_assert_int_eq(redlockd_unlock(h, res), 0);
    if (other) {
        ck_assert_int_eq(redlockd_lock(other, res, 10000, 0, 1, NULL), 0);
        ck_assert_int_eq(redlockd_unlock(other, res), 0);
    }
}

/* ---- tests ---- */

START_TEST(tls_lock_unlock)
{
    char a[64], b[64], plain[64];
    struct redlockd_opts o = { .name = "tls-ip" };
    struct redlockd_opts p = { .name = "plain" };
    struct redlockd *h, *other;
    char *json = NULL;

    start_tls(0, "server", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    snprintf(plain, sizeof(plain), "127.0.0.1:%d", D->port);
    p.server = plain;
    other = open_ok(&p);

    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    h = open_ok(&o);
    ck_assert_str_eq(redlockd_server(h), a);
    lock_unlock(h, other, "tls:ip");
    ck_assert_int_eq(redlockd_sessions(h, &json), 0);
    ck_assert_ptr_nonnull(strstr(json, "tls-ip"));
    free(json);

    /* By name (SNI and a DNS name check), the CA from the environment. */
    addr_of(b, sizeof(b), "localhost", D->tls_port);
    ck_assert_int_eq(setenv(REDLOCKD_TLS_CA_ENV, h_cert("ca.crt"), 1), 0);
    o.server = b;
    o.name = "tls-name";
    o.tls_ca_file = NULL;
    h = open_ok(&o);
    lock_unlock(h, other, "tls:name");
    unsetenv(REDLOCKD_TLS_CA_ENV);
}
END_TEST

START_TEST(tls_unknown_ca)
{
    char a[64];
    struct redlockd_opts o = { 0 };

    start_tls(0, "server", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    o.server = a;
    o.tls_ca_file = h_cert("other-ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "unknown CA", "refused", a, NULL);
    /* The system's store does not know the test CA either. */
    o.tls_ca_file = NULL;
    unsetenv(REDLOCKD_TLS_CA_ENV);
    open_fails(&o, REDLOCKD_E_IO, "unknown CA", NULL);
}
END_TEST

START_TEST(tls_other_ca_server)
{
    char a[64];
    struct redlockd_opts o = { 0 };

    start_tls(0, "other", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "unknown CA", NULL);
}
END_TEST

START_TEST(tls_wrong_name)
{
    char a[64], b[64];
    struct redlockd_opts o = { 0 };
    struct redlockd *h;

    start_tls(0, "wrongname", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "name mismatch", "127.0.0.1", NULL);
    addr_of(b, sizeof(b), "localhost", D->tls_port);
    o.server = b;
    open_fails(&o, REDLOCKD_E_IO, "name mismatch", "localhost", NULL);
    /* The name the certificate has, checked instead of the host. */
    o.server = a;
    o.tls_server_name = "elsewhere.test";
    h = open_ok(&o);
    lock_unlock(h, NULL, "tls:servername");
}
END_TEST

START_TEST(tls_expired)
{
    char a[64];
    struct redlockd_opts o = { 0 };

    start_tls(0, "expired", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "expired", NULL);
}
END_TEST

START_TEST(tls_client_cert)
{
    char a[64], extra[512];
    struct redlockd_opts o = { .name = "alice" };
    struct redlockd *h;

    snprintf(extra, sizeof(extra), ",\"ca_file\":\"%s\","
             "\"verify_clients\":true", h_cert("ca.crt"));
    start_tls(0, "server", extra);
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "requires a client certificate", NULL);
    /* A certificate of a CA the daemon does not trust. */
    o.tls_cert_file = h_cert("other.crt");
    o.tls_key_file = h_cert("other.key");
    open_fails(&o, REDLOCKD_E_IO, "client certificate", NULL);
    /* The key in the environment. */
    o.tls_cert_file = h_cert("client.crt");
    o.tls_key_file = NULL;
    ck_assert_int_eq(setenv(REDLOCKD_TLS_KEY_ENV, h_cert("client.key"), 1), 0);
    h = open_ok(&o);
    unsetenv(REDLOCKD_TLS_KEY_ENV);
    lock_unlock(h, NULL, "tls:alice");
}
END_TEST

START_TEST(tls_plain_port)
{
    char a[64];
    struct redlockd_opts o = { .connect_timeout_ms = 3000 };

    start_tls(0, "server", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->port);
    o.server = a;
    o.tls_ca_file = h_cert("ca.crt");
    open_fails(&o, REDLOCKD_E_IO, "does not speak TLS", NULL);
}
END_TEST

/* A plain client on the TLS port: the daemon answers "ERR ARG this port
 * speaks TLS: ..." and closes; that line is the error, whether the handle
 * asked for detach= (and would retry a plain HELLO) or not. */
START_TEST(tls_plain_client)
{
    char a[64], b[64];
    const char *servers[] = { a, b };
    struct redlockd_opts o = { .connect_timeout_ms = 3000 };

    start_tls(0, "server", "");
    snprintf(a, sizeof(a), "127.0.0.1:%d", D->tls_port);
    o.server = a;
    open_fails(&o, REDLOCKD_E_ARG, "this port speaks TLS", "tls://", NULL);
    o.reconnect_max_ms = -1;
    open_fails(&o, REDLOCKD_E_ARG, "this port speaks TLS", "tls://", NULL);
    /* First in a list: the mistake is shown, not skipped for the next. */
    snprintf(b, sizeof(b), "127.0.0.1:%d", D->port);
    o.reconnect_max_ms = 0;
    o.servers = servers;
    o.nservers = 2;
    open_fails(&o, REDLOCKD_E_ARG, "this port speaks TLS", NULL);
}
END_TEST

START_TEST(tls_bad_files)
{
    char a[64];
    struct redlockd_opts o = { 0 };

    /* Checked before connecting: no daemon needed. */
    snprintf(a, sizeof(a), "tls://127.0.0.1:1");
    o.server = a;
    o.tls_ca_file = "/nonexistent/ca.crt";
    open_fails(&o, REDLOCKD_E_INVALID, "tls_ca_file /nonexistent/ca.crt",
               "No such file", NULL);
    o.tls_ca_file = h_cert("bad.crt");
    open_fails(&o, REDLOCKD_E_INVALID, "tls_ca_file", "bad.crt", NULL);
    o.tls_ca_file = h_cert("ca.crt");
    o.tls_cert_file = h_cert("client.crt");
    o.tls_key_file = h_cert("other.key");
    open_fails(&o, REDLOCKD_E_INVALID, "is not the key of", NULL);
    o.tls_cert_file = NULL;
    open_fails(&o, REDLOCKD_E_INVALID, "tls_key_file without tls_cert_file",
               NULL);
    o.tls_key_file = NULL;
    o.tls_server_name = "bad name";
    open_fails(&o, REDLOCKD_E_INVALID, "tls_server_name", NULL);
}
END_TEST

/* Two tls:// daemons: the handle's dies, the lease is adopted over TLS on
 * the other, with its fence. */
START_TEST(tls_failover)
{
    static const char *servers[2];
    char a[64], b[64];
    struct redlockd_opts o = { .name = "tls-fo" };
    struct redlockd_lease l, now;
    struct redlockd *h;
    int rc;

    h_cluster_nodes(&K, 3, NULL);
    start_tls(0, "server", "");
    start_tls(1, "server", "");
    addr_of(a, sizeof(a), "127.0.0.1", D->tls_port);
    addr_of(b, sizeof(b), "127.0.0.1", D2->tls_port);
    servers[0] = a;
    servers[1] = b;
    o.servers = servers;
    o.nservers = 2;
    o.tls_ca_file = h_cert("ca.crt");
    h = open_ok(&o);
    ck_assert_str_eq(redlockd_server(h), a);
    ck_assert_int_eq(redlockd_lock(h, "tls:fo", 30000, 0, 1, &l), 0);
    h_daemon_kill(D);
    rc = redlockd_refresh(h);
    ck_assert_msg(rc == 0, "refresh after the kill: %d %s", rc,
                  redlockd_last_error(h)->msg);
    ck_assert_str_eq(redlockd_server(h), b);
    ck_assert_int_eq(redlockd_lease_info(h, "tls:fo", &now), 0);
    ck_assert_int_eq(redlockd_lease_state(h, "tls:fo"), REDLOCKD_LEASE_HELD);
    ck_assert_uint_eq(now.fence, l.fence);
    ck_assert_str_ne(now.token, l.token);
    ck_assert_int_eq(redlockd_unlock(h, "tls:fo"), 0);

    /* A new handle: the first server is down, the second answers. */
    h = open_ok(&o);
    ck_assert_str_eq(redlockd_server(h), b);
    lock_unlock(h, NULL, "tls:second");
}
END_TEST

/* ---- events decrypted but not yet read ---- */

/* A fake daemon for one connection: answers HELLO, and PING with PONG and
 * `nevents` EVENT LOST lines in the same record. */
static void fake_daemon(int lfd, int nevents)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    char buf[4096], *big;
    size_t n = 0, cap = 64 + (size_t)nevents * 64;
    int fd;
    SSL *ssl;

    if (!ctx || SSL_CTX_use_certificate_chain_file(ctx, h_cert("server.crt"))
        != 1 || SSL_CTX_use_PrivateKey_file(ctx, h_cert("server.key"),
                                            SSL_FILETYPE_PEM) != 1)
        _exit(2);
    fd = accept(lfd, NULL, NULL);
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1)
        _exit(3);
    big = malloc(cap);
    for (;;) {
        int k = SSL_read(ssl, buf, sizeof(buf) - 1);
        if (k <= 0)
            break;
        buf[k] = '\0';
        if (strncmp(buf, "HELLO", 5) == 0) {
            const char *ok = "OK proto=1 session=s1 server=redlockd/0.1.0 "
                             "nodes=1 quorum=1\n";
            SSL_write(ssl, ok, (int)strlen(ok));
        } else if (strncmp(buf, "PING", 4) == 0) {
            n = (size_t)snprintf(big, cap, "PONG\n");
            for (int i = 0; i < nevents; i++)
                n += (size_t)snprintf(big + n, cap - n, "EVENT LOST "
                                      "resource=r%d fence=%d reason=expired\n",
                                      i, i + 1);
            SSL_write(ssl, big, (int)n);    /* one write: few records */
        } else {
            SSL_write(ssl, "OK\n", 3);
        }
    }
    _exit(0);
}

/* Events that arrive behind a reply are all handled by the time the call
 * returns, including those OpenSSL decrypted beyond the handle's input
 * buffer: a poll() on redlockd_fd() would never wake for those, and
 * `redlockctl run` waits exactly so for EVENT LOST. */
START_TEST(tls_events_behind_reply)
{
    struct redlockd_opts o = { 0 };
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof(a);
    char server[64];
    struct pollfd p;
    struct redlockd *h;
    int lfd = socket(AF_INET, SOCK_STREAM, 0), st;
    pid_t pid;

    ck_assert(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    ck_assert(listen(lfd, 1) == 0);
    ck_assert(getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        fake_daemon(lfd, 250);
    close(lfd);
    snprintf(server, sizeof(server), "tls://127.0.0.1:%d",
             ntohs(a.sin_port));
    o.server = server;
    o.tls_ca_file = h_cert("ca.crt");
    o.reconnect_max_ms = -1;
    h = open_ok(&o);
    ck_assert_int_eq(redlockd_ping(h), 0);
    p.fd = redlockd_fd(h);
    p.events = POLLIN;
    ck_assert_int_eq(poll(&p, 1, 300), 0);      /* the socket is empty */
    ck_assert_int_eq(redlockd_poll_events(h, 0), 0);   /* and so is TLS */
    redlockd_close(h);          /* the fake daemon ends with the client */
    H[--nh] = NULL;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fake daemon: %d",
                  st);
}
END_TEST

static Suite *tls_suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("tls");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, tls_lock_unlock);
    tcase_add_test(tc, tls_unknown_ca);
    tcase_add_test(tc, tls_other_ca_server);
    tcase_add_test(tc, tls_wrong_name);
    tcase_add_test(tc, tls_expired);
    tcase_add_test(tc, tls_client_cert);
    tcase_add_test(tc, tls_plain_port);
    tcase_add_test(tc, tls_plain_client);
    tcase_add_test(tc, tls_bad_files);
    tcase_add_test(tc, tls_failover);
    tcase_add_test(tc, tls_events_behind_reply);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr;
    int failed;

    h_certs_make();
    /* The tests choose their CA themselves. */
    unsetenv(REDLOCKD_TLS_CA_ENV);
    unsetenv(REDLOCKD_TLS_CERT_ENV);
    unsetenv(REDLOCKD_TLS_KEY_ENV);
    sr = srunner_create(tls_suite());
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    h_certs_remove();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
