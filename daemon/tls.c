/*
 * tls: see tls.h.
 *
 * Each connection's SSL reads from a memory BIO that tls_conn_input fills
 * with the socket's bytes and writes into a memory BIO that
 * tls_conn_seal empties into conn's wire buffer: the shape of Node's
 * tls_wrap, with libuv doing all the socket work. Everything the socket
 * delivered is decrypted at once (SSL_read until it wants more), so no
 * plain text ever waits inside OpenSSL for a read that may not come;
 * conn's own read-ahead limit then applies to the plain lines as it does
 * on a plain port.
 */
#include "tls.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "conf.h"
#include "log.h"
#include "mem.h"

/* One record's worth: SSL_read returns at most a record at a time. */
#define TLS_PLAIN_CHUNK 16384

struct tls_conn {
    SSL *ssl;
    BIO *rbio;              /* socket -> SSL (owned by ssl) */
    BIO *wbio;              /* SSL -> socket (owned by ssl) */
    bool started;           /* the first bytes were looked at */
    bool established;
    bool failed;
    enum tls_fail fail;
    char detail[192];
    char cn[64];
};

static SSL_CTX *tls_ctx;    /* for new connections; NULL: no TLS */
static bool tls_ctx_verifies;   /* tls_ctx requires client certificates */
static char tls_plain[TLS_PLAIN_CHUNK];

/* ---- the context -------------------------------------------------------- */

/* OpenSSL's reason for the last failure, its queue emptied. */
static const char *tls_ssl_reason(char *buf, size_t size)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;

    snprintf(buf, size, "%s", r ? r : "unknown error");
    ERR_clear_error();
    return buf;
}

static int tls_fail_ctx(SSL_CTX *ctx, char *err, size_t errlen,
                        const char *what, const char *file)
{
    char why[128];

    snprintf(err, errlen, "%s \"%s\": %s", what, file,
             tls_ssl_reason(why, sizeof(why)));
    SSL_CTX_free(ctx);
    return -1;
}

static int tls_load_pair(SSL_CTX *ctx, const struct conf *c, char *err,
                         size_t errlen)
{
    if (SSL_CTX_use_certificate_chain_file(ctx, c->tls.cert_file) != 1)
        return tls_fail_ctx(ctx, err, errlen, "tls.cert_file",
                            c->tls.cert_file);
    if (SSL_CTX_use_PrivateKey_file(ctx, c->tls.key_file,
                                    SSL_FILETYPE_PEM) != 1)
        return tls_fail_ctx(ctx, err, errlen, "tls.key_file",
                            c->tls.key_file);
    if (SSL_CTX_check_private_key(ctx) != 1)
        return tls_fail_ctx(ctx, err, errlen, "tls.key_file does not "
                            "match tls.cert_file", c->tls.key_file);
    return 0;
}

static int tls_load_client_ca(SSL_CTX *ctx, const struct conf *c, char *err,
                              size_t errlen)
{
    STACK_OF(X509_NAME) *names;

    if (!c->tls.verify_clients)
        return 0;
    if (SSL_CTX_load_verify_locations(ctx, c->tls.ca_file, NULL) != 1)
        return tls_fail_ctx(ctx, err, errlen, "tls.ca_file", c->tls.ca_file);
    /* The CA names a client is told to pick its certificate by. */
    names = SSL_load_client_CA_file(c->tls.ca_file);
    if (names)
        SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER |
                       SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    return 0;
}

/* Say what was loaded, and warn about a certificate out of its dates:
 * clients will refuse it, and the operator should hear it from us. */
static void tls_log_certificate(SSL_CTX *ctx, const struct conf *c)
{
    X509 *x = SSL_CTX_get0_certificate(ctx);
    char subject[256] = "?", until[64] = "?";
    BIO *b;

    if (!x)
        return;
    X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof(subject));
    b = BIO_new(BIO_s_mem());
    if (b && ASN1_TIME_print(b, X509_get0_notAfter(x)) == 1) {
        int n = BIO_read(b, until, sizeof(until) - 1);
        until[n > 0 ? n : 0] = '\0';
    }
    BIO_free(b);
    log_notice("tls: certificate %s (%s), valid until %s%s", subject,
               c->tls.cert_file, until,
               c->tls.verify_clients ? "; client certificates required" : "");
    if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0)
        log_warn("tls: the certificate in %s has expired: clients will "
                 "refuse it", c->tls.cert_file);
    else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0)
        log_warn("tls: the certificate in %s is not valid yet: clients "
                 "will refuse it", c->tls.cert_file);
}

static bool tls_wanted(const struct conf *c)
{
    for (size_t i = 0; i < c->nlisten; i++) {
        if (c->listen[i].tls)
            return true;
    }
    return false;
}

int tls_configure(const struct conf *c, char *err, size_t errlen)
{
    SSL_CTX *ctx;

    if (!tls_wanted(c))
        return 0;
    ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, errlen, "tls: cannot make a TLS context");
        return -1;
    }
    SSL_CTX_set_min_proto_version(ctx, strcmp(c->tls.min_version, "1.3") == 0
                                           ? TLS1_3_VERSION : TLS1_2_VERSION);
    /* Renegotiation only adds ways to stall a connection. An idle
     * connection gives its record buffers back. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION |
                             SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"redlockd", 8);
    if (tls_load_pair(ctx, c, err, errlen) < 0 ||
        tls_load_client_ca(ctx, c, err, errlen) < 0)
        return -1;
    tls_log_certificate(ctx, c);
    SSL_CTX_free(tls_ctx);  /* connections keep their own reference */
    tls_ctx = ctx;
    tls_ctx_verifies = c->tls.verify_clients;
    return 0;
}

bool tls_verifies_clients(void)
{
    return tls_ctx && tls_ctx_verifies;
}

void tls_cleanup(void)
{
    SSL_CTX_free(tls_ctx);
    tls_ctx = NULL;
    tls_ctx_verifies = false;
}

/* ---- a connection --------------------------------------------------------- */

struct tls_conn *tls_conn_new(void)
{
    struct tls_conn *t;

    if (!tls_ctx)
        return NULL;
    t = mem_alloc(sizeof(*t));
    t->ssl = SSL_new(tls_ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rbio || !t->wbio) {
        SSL_free(t->ssl);
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    /* An empty read BIO means "wait for more", not end of file. */
    BIO_set_mem_eof_return(t->rbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    SSL_set_accept_state(t->ssl);
    return t;
}

void tls_conn_free(struct tls_conn *t)
{
    if (!t)
        return;
    SSL_free(t->ssl);       /* and both BIOs */
    free(t);
}

bool tls_looks_like_handshake(const char *data, size_t len)
{
    /* A handshake record: type 22, then protocol major version 3. */
    return len >= 1 && (unsigned char)data[0] == 0x16 &&
           (len < 2 || data[1] == 0x03);
}

static enum tls_io tls_conn_fail(struct tls_conn *t, enum tls_fail why,
                                 const char *detail)
{
    t->failed = true;
    t->fail = why;
    snprintf(t->detail, sizeof(t->detail), "%s", detail);
    ERR_clear_error();
    return TLS_IO_FAILED;
}

/* What went wrong in the handshake (or later), from OpenSSL's reason. */
static enum tls_io tls_conn_ssl_failed(struct tls_conn *t)
{
    unsigned long e = ERR_peek_last_error();
    int reason = ERR_GET_REASON(e);
    const char *text = e ? ERR_reason_error_string(e) : NULL;
    long vr = SSL_get_verify_result(t->ssl);
    char detail[192];
    enum tls_fail why = TLS_FAIL_protocol;

    if (reason == SSL_R_UNSUPPORTED_PROTOCOL ||
        reason == SSL_R_VERSION_TOO_LOW || reason == SSL_R_NO_PROTOCOLS_AVAILABLE)
        why = TLS_FAIL_version;
    else if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
        why = TLS_FAIL_no_client_cert;
    else if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED)
        why = TLS_FAIL_bad_client_cert;
    else if (reason >= SSL_AD_REASON_OFFSET)
        why = TLS_FAIL_peer_alert;     /* an alert the client sent */
    if (why == TLS_FAIL_bad_client_cert && vr != X509_V_OK)
        snprintf(detail, sizeof(detail), "client certificate: %s",
                 X509_verify_cert_error_string(vr));
    else
        snprintf(detail, sizeof(detail), "%s", text ? text : "TLS error");
    return tls_conn_fail(t, why, detail);
}

/* The handshake just finished: take the verified client certificate's
 * CN (a user name, with auth.users). conn counts it (conn_tls_ready). */
static void tls_conn_established_now(struct tls_conn *t)
{
    X509 *peer;

    t->established = true;
    peer = SSL_get1_peer_certificate(t->ssl);
    if (!peer)
        return;
    if (SSL_get_verify_result(t->ssl) == X509_V_OK &&
        X509_NAME_get_text_by_NID(X509_get_subject_name(peer),
                                  NID_commonName, t->cn, sizeof(t->cn)) < 0)
        t->cn[0] = '\0';
    X509_free(peer);
}

enum tls_io tls_conn_input(struct tls_conn *t, const char *data, size_t len,
                           tls_plain_fn *plain, void *ud)
{
    if (t->failed)
        return TLS_IO_FAILED;
    if (!t->started) {
        t->started = true;
        if (!tls_looks_like_handshake(data, len))
            return tls_conn_fail(t, TLS_FAIL_plaintext,
                                 "plain text on a TLS port");
    }
    if (len > INT_MAX || BIO_write(t->rbio, data, (int)len) != (int)len)
        return tls_conn_fail(t, TLS_FAIL_protocol, "out of memory");
    for (;;) {
        int n = SSL_read(t->ssl, tls_plain, sizeof(tls_plain));
        if (!t->established && SSL_is_init_finished(t->ssl))
            tls_conn_established_now(t);
        if (n > 0) {
            if (plain(ud, tls_plain, (size_t)n) < 0)
                return tls_conn_fail(t, TLS_FAIL_protocol,
                                     "out of memory for the read buffer");
            continue;
        }
        switch (SSL_get_error(t->ssl, n)) {
        case SSL_ERROR_WANT_READ:
            return TLS_IO_OK;
        case SSL_ERROR_ZERO_RETURN:
            return TLS_IO_CLOSED;
        default:
            return tls_conn_ssl_failed(t);
        }
    }
}

int tls_conn_seal(struct tls_conn *t, struct sbuf *in, struct sbuf *wire)
{
    if (t->established && !t->failed && in->len > 0) {
        size_t off = 0;
        while (off < in->len) {
            size_t n = in->len - off;
            int k = SSL_write(t->ssl, in->data + off,
                              n > INT_MAX ? INT_MAX : (int)n);
            if (k <= 0) {
                tls_conn_ssl_failed(t);
                return -1;
            }
            off += (size_t)k;
        }
        sbuf_reset(in);
    }
    /* Records for the socket: replies, handshake messages, alerts. */
    while (BIO_ctrl_pending(t->wbio) > 0) {
        char buf[TLS_PLAIN_CHUNK + 256];
        int k = BIO_read(t->wbio, buf, sizeof(buf));
        if (k <= 0)
            break;
        sbuf_append(wire, buf, (size_t)k);
    }
    return 0;
}

void tls_conn_close_notify(struct tls_conn *t)
{
    if (t->established && !t->failed && SSL_shutdown(t->ssl) < 0)
        ERR_clear_error();
}

bool tls_conn_established(const struct tls_conn *t)
{
    return t->established;
}

enum tls_fail tls_conn_failure(const struct tls_conn *t)
{
    return t->fail;
}

const char *tls_conn_detail(const struct tls_conn *t)
{
    return t->detail;
}

const char *tls_conn_peer_cn(const struct tls_conn *t)
{
    return t->cn;
}

void tls_conn_describe(const struct tls_conn *t, char *buf, size_t size)
{
    snprintf(buf, size, "%s %s", SSL_get_version(t->ssl),
             SSL_get_cipher_name(t->ssl));
}
