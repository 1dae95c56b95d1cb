/*
 * libredlockd, TLS under a connection: the handle's TLS settings (one
 * SSL_CTX, made when a tls:// server is listed), the handshake, and the
 * reads and writes of redlockd_conn.c when the connection has an SSL.
 * Under the connection layer: it calls only redlockd_base.c.
 *
 * The socket stays what it is without TLS: non-blocking, every wait a
 * poll() (rl_wait: the handshake's here, the others in redlockd_conn.c).
 * OpenSSL reaches it through a BIO of our own that uses send(MSG_NOSIGNAL)
 * (its socket BIO uses write(), and a closed peer would raise SIGPIPE in
 * the application) and recv(). SSL_ERROR_WANT_READ / _WANT_WRITE become
 * "wait for POLLIN / POLLOUT", so the handshake keeps the connect timeout
 * and reads and writes keep the I/O timeout. A read drains what OpenSSL
 * has already decrypted (SSL_pending) into the input buffer, so nothing
 * waits inside the SSL while poll() says the socket is quiet.
 *
 * Failures name their reason: the certificate check's (an unknown CA, a
 * name mismatch, expired), a server that does not speak TLS, one that
 * wants a client certificate; the text goes into the handle's tls_err for
 * redlockd_conn.c's message.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "redlockd_priv.h"

/* ---- the socket BIO ----------------------------------------------------- */

static struct rl_tls_link *rl_bio_link(BIO *b)
{
    return BIO_get_data(b);
}

static int rl_bio_write(BIO *b, const char *buf, int len)
{
    ssize_t n;

    BIO_clear_retry_flags(b);
    n = send(rl_bio_link(b)->fd, buf, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static int rl_bio_read(BIO *b, char *buf, int len)
{
    struct rl_tls_link *link = rl_bio_link(b);
    ssize_t n;

    BIO_clear_retry_flags(b);
    n = recv(link->fd, buf, (size_t)len, 0);
    if (n > 0)
        link->rx += (size_t)n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)n;
}

static long rl_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    /* Nothing is buffered here: a flush is always done. */
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int rl_bio_create(BIO *b)
{
    BIO_set_data(b, NULL);
    return 1;
}

/* ---- settings ----------------------------------------------------------- */

/* A host name or an IP address, as text: what SNI and the name check
 * take. */
static bool rl_tls_name_ok(const char *s)
{
    size_t len = strlen(s);

    return len > 0 && len <= PROTO_ADDR_HOST_MAX
        && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789.-:") == len;
}

/* An option, else its environment variable, else NULL. */
static const char *rl_tls_opt(const char *value, const char *env)
{
    const char *e;

    if (value)
        return value;
    e = getenv(env);
    return e && *e != '\0' ? e : NULL;
}

/* The last OpenSSL error's reason, for a message ("" when none). */
static const char *rl_tls_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;

    return r ? r : "";
}

/* A file the context could not load: why, as fopen says it when it
 * can not be read at all, else OpenSSL's reason. */
static int rl_tls_load_err(struct redlockd_error *err, const char *what,
                           const char *path)
{
    FILE *f = fopen(path, "r");
    int rc;

    if (!f)
        rc = rl_seterr(err, REDLOCKD_E_INVALID, "%s %s: %s", what, path,
                       strerror(errno));
    else
        rc = rl_seterr(err, REDLOCKD_E_INVALID, "%s %s: cannot load: %s",
                       what, path, rl_tls_reason());
    if (f)
        fclose(f);
    ERR_clear_error();
    return rc;
}

static int rl_tls_ctx_trust(SSL_CTX *ctx, const char *ca,
                            struct redlockd_error *err)
{
    if (!ca) {
        if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
            int rc = rl_seterr(err, REDLOCKD_E_INVALID,
                               "cannot load the system's CA store: %s",
                               rl_tls_reason());
            ERR_clear_error();  /* not left for the application's OpenSSL */
            return rc;
        }
        return 0;
    }
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
        return rl_tls_load_err(err, "tls_ca_file", ca);
    return 0;
}

static int rl_tls_ctx_identity(SSL_CTX *ctx, const char *cert,
                               const char *key, struct redlockd_error *err)
{
    if (!cert && !key)
        return 0;
    if (!cert)
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "tls_key_file without tls_cert_file");
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        return rl_tls_load_err(err, "tls_cert_file", cert);
    if (SSL_CTX_use_PrivateKey_file(ctx, key ? key : cert,
                                    SSL_FILETYPE_PEM) != 1
        && ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH)
        return rl_tls_load_err(err, "tls_key_file", key ? key : cert);
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "tls_key_file %s is not the key of tls_cert_file %s",
                         key ? key : cert, cert);
    }
    return 0;
}

static SSL_CTX *rl_tls_ctx_new(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (!ctx)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* A daemon that closes without close_notify just closed: the line
     * protocol ends its own messages, so a cut is a partial line. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* rl_send retries from where it stopped. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

static BIO_METHOD *rl_tls_bio_method(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                 "redlockd socket");

    if (!m)
        return NULL;
    if (BIO_meth_set_write(m, rl_bio_write) != 1
        || BIO_meth_set_read(m, rl_bio_read) != 1
        || BIO_meth_set_ctrl(m, rl_bio_ctrl) != 1
        || BIO_meth_set_create(m, rl_bio_create) != 1) {
        BIO_meth_free(m);
        return NULL;
    }
    return m;
}

static bool rl_tls_wanted(const struct redlockd *h)
{
    for (size_t i = 0; i < h->nservers; i++) {
        if (h->servers[i].is_tls)
            return true;
    }
    return false;
}

int rl_tls_setup(struct redlockd *h, const struct redlockd_opts *o,
                 struct redlockd_error *err)
{
    const char *ca = rl_tls_opt(o->tls_ca_file, REDLOCKD_TLS_CA_ENV);
    const char *cert = rl_tls_opt(o->tls_cert_file, REDLOCKD_TLS_CERT_ENV);
    const char *key = rl_tls_opt(o->tls_key_file, REDLOCKD_TLS_KEY_ENV);
    int rc;

    if (!rl_tls_wanted(h))
        return 0;
    if (o->tls_server_name && !rl_tls_name_ok(o->tls_server_name))
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "tls_server_name: expected a host name or an IP "
                         "address");
    h->tls_ctx = rl_tls_ctx_new();
    h->tls_bio = rl_tls_bio_method();
    if (o->tls_server_name) {
        h->tls_name = strdup(o->tls_server_name);
        if (!h->tls_name)
            return rl_seterr(err, REDLOCKD_E_NOMEM, "out of memory");
    }
    if (!h->tls_ctx || !h->tls_bio) {
        ERR_clear_error();
        return rl_seterr(err, REDLOCKD_E_NOMEM, "cannot set up TLS: out of "
                         "memory");
    }
    rc = rl_tls_ctx_trust(h->tls_ctx, ca, err);
    if (rc == 0)
        rc = rl_tls_ctx_identity(h->tls_ctx, cert, key, err);
    return rc;
}

void rl_tls_teardown(struct redlockd *h)
{
    SSL_CTX_free(h->tls_ctx);
    BIO_meth_free(h->tls_bio);
    free(h->tls_name);
    h->tls_ctx = NULL;
    h->tls_bio = NULL;
    h->tls_name = NULL;
}

/* ---- why a handshake or a record failed --------------------------------- */

/* What a failed certificate check means to the user. */
static const char *rl_tls_verify_word(long v)
{
    switch (v) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_UNTRUSTED:
        return "unknown CA";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return "name mismatch";
    case X509_V_ERR_CERT_HAS_EXPIRED:
        return "expired";
    case X509_V_ERR_CERT_NOT_YET_VALID:
        return "not yet valid";
    default:
        return "not trusted";
    }
}

/* An error from the server's side of the TLS layer, by its reason. */
static const char *rl_tls_ssl_reason(int reason)
{
    switch (reason) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_HTTP_REQUEST:
        return "the server does not speak TLS (a plain tcp:// listener?)";
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return "the server requires a client certificate (tls_cert_file, "
               "tls_key_file)";
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
        return "the server refused our client certificate";
    default:
        return NULL;
    }
}

/* The reason of a failed SSL_* call (ret its value) into h->tls_err. */
static void rl_tls_explain(struct redlockd *h, const char *server, int ret)
{
    int e = SSL_get_error(h->ssl, ret);
    long v = SSL_get_verify_result(h->ssl);
    unsigned long q = ERR_peek_error();
    const char *why;

    if (e == SSL_ERROR_SSL && v != X509_V_OK) {
        bool name = v == X509_V_ERR_HOSTNAME_MISMATCH
                    || v == X509_V_ERR_IP_ADDRESS_MISMATCH;

        snprintf(h->tls_err, sizeof(h->tls_err),
                 "certificate of %.80s refused: %s (%s)%s%.80s", server,
                 rl_tls_verify_word(v), X509_verify_cert_error_string(v),
                 name ? "; checked for " : "", name ? h->tls_peer : "");
    } else if (e == SSL_ERROR_SSL && q && ERR_GET_LIB(q) == ERR_LIB_SSL
               && (why = rl_tls_ssl_reason(ERR_GET_REASON(q)))) {
        snprintf(h->tls_err, sizeof(h->tls_err), "TLS with %.80s: %s (%s)",
                 server, why, rl_tls_reason());
    } else if (e == SSL_ERROR_SSL) {
        snprintf(h->tls_err, sizeof(h->tls_err), "TLS with %.80s: %s", server,
                 q ? rl_tls_reason() : "protocol error");
    } else if (h->tls_link.rx == 0 && !SSL_is_init_finished(h->ssl)) {
        snprintf(h->tls_err, sizeof(h->tls_err),
                 "TLS with %.80s: the server closed the connection without "
                 "a TLS answer: it does not speak TLS (a plain tcp:// "
                 "listener?)", server);
    } else if (e == SSL_ERROR_SYSCALL && errno != 0) {
        snprintf(h->tls_err, sizeof(h->tls_err), "TLS with %.80s: %s", server,
                 strerror(errno));
    } else {
        snprintf(h->tls_err, sizeof(h->tls_err),
                 "TLS with %.80s: the server closed the connection in the "
                 "handshake (not a tls:// listener, or it refused us)",
                 server);
    }
    ERR_clear_error();
}

/* ---- connecting --------------------------------------------------------- */

/* The name to check, and how: an IP address as an IP, a name as a DNS
 * name and the SNI. */
static int rl_tls_name(struct redlockd *h, const struct redlockd_addr *a)
{
    const char *name = h->tls_name ? h->tls_name : a->host;
    unsigned char bin[sizeof(struct in6_addr)];
    char ip[INET6_ADDRSTRLEN];
    size_t len = strcspn(name, "%");    /* a zone is the host's business */

    snprintf(h->tls_peer, sizeof(h->tls_peer), "%s", name);
    if (len < sizeof(ip)) {
        memcpy(ip, name, len);
        ip[len] = '\0';
        if (inet_pton(AF_INET, ip, bin) == 1
            || inet_pton(AF_INET6, ip, bin) == 1) {
            snprintf(h->tls_peer, sizeof(h->tls_peer), "%s", ip);
            return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(h->ssl), ip)
                       == 1 ? 0 : -1;
        }
    }
    if (SSL_set_tlsext_host_name(h->ssl, name) != 1
        || SSL_set1_host(h->ssl, name) != 1)
        return -1;
    return 0;
}

static int rl_tls_new(struct redlockd *h, const struct redlockd_addr *a,
                      int fd, struct redlockd_error *err)
{
    BIO *bio;

    h->ssl = SSL_new(h->tls_ctx);
    bio = h->ssl ? BIO_new(h->tls_bio) : NULL;
    if (!bio) {
        ERR_clear_error();
        return rl_seterr(err, REDLOCKD_E_NOMEM, "TLS with %s: out of memory",
                         a->text);
    }
    h->tls_link.fd = fd;
    h->tls_link.rx = 0;
    BIO_set_data(bio, &h->tls_link);
    BIO_set_init(bio, 1);
    SSL_set_bio(h->ssl, bio, bio);
    if (rl_tls_name(h, a) < 0) {
        ERR_clear_error();
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "TLS with %s: cannot check the name %s", a->text,
                         h->tls_peer);
    }
    return 0;
}

int rl_tls_connect(struct redlockd *h, const struct redlockd_addr *a, int fd,
                   int64_t deadline, struct redlockd_error *err)
{
    int ret, rc, e;

    if (!h->tls_ctx)
        return rl_seterr(err, REDLOCKD_E_INVALID, "TLS with %s: not set up",
                         a->text);
    rc = rl_tls_new(h, a, fd, err);
    while (rc == 0) {
        ERR_clear_error();
        errno = 0;
        ret = SSL_connect(h->ssl);
        if (ret == 1)
            return 0;
        e = SSL_get_error(h->ssl, ret);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            rl_tls_explain(h, a->text, ret);
            rc = rl_seterr(err, REDLOCKD_E_IO, "%s", h->tls_err);
            break;
        }
        rc = rl_wait(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                     deadline);
        if (rc < 0)
            rc = rl_seterr(err, REDLOCKD_E_IO, "TLS with %s: poll: %s",
                           a->text, strerror(errno));
        else if (rc == 0)
            rc = rl_seterr(err, REDLOCKD_E_IO_TIMEOUT,
                           "TLS with %s: handshake timed out (is it a "
                           "tls:// listener?)", a->text);
        else
            rc = 0;
    }
    rl_tls_free(h);
    return rc;
}

void rl_tls_free(struct redlockd *h)
{
    SSL_free(h->ssl);
    h->ssl = NULL;
}

/* ---- reading and writing ------------------------------------------------ */

/* After an SSL_read/SSL_write that moved nothing: -1 with errno EAGAIN
 * and *events, EINTR, 0 at EOF (read only), or -1 with errno EPROTO and
 * the reason in tls_err. */
static ssize_t rl_tls_failed(struct redlockd *h, int ret, short *events)
{
    int e = SSL_get_error(h->ssl, ret);

    switch (e) {
    case SSL_ERROR_WANT_READ:
        *events = POLLIN;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        *events = POLLOUT;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL:
        if (errno == 0)
            return 0;
        ERR_clear_error();
        return -1;
    default:
        rl_tls_explain(h, h->servers ? h->servers[h->cur].text : "the "
                       "server", ret);
        errno = EPROTO;
        return -1;
    }
}

ssize_t rl_tls_read(struct redlockd *h, char *buf, size_t len, short *events)
{
    size_t n = 0, more;

    ERR_clear_error();
    errno = 0;
    if (SSL_read_ex(h->ssl, buf, len, &n) != 1)
        return rl_tls_failed(h, 0, events);
    /* What is decrypted already would not wake a poll(): take it now. */
    while (n < len && SSL_pending(h->ssl) > 0
           && SSL_read_ex(h->ssl, buf + n, len - n, &more) == 1)
        n += more;
    ERR_clear_error();
    return (ssize_t)n;
}

bool rl_tls_pending(const struct redlockd *h)
{
    return h->ssl && SSL_has_pending(h->ssl);
}

ssize_t rl_tls_write(struct redlockd *h, const char *buf, size_t len,
                     short *events)
{
    size_t n = 0;
    ssize_t rc;

    ERR_clear_error();
    errno = 0;
    if (SSL_write_ex(h->ssl, buf, len, &n) == 1)
        return (ssize_t)n;
    rc = rl_tls_failed(h, 0, events);
    /* A write finds the end of the connection as a reset. */
    if (rc == 0)
        errno = EPIPE;
    return rc == 0 ? -1 : rc;
}
