/*
 * libFuzzer target for the TLS-to-line boundary (daemon/tls.c): the code
 * between the socket's bytes and the line reader on a tls:// listener.
 *
 * The first input byte picks the mode, the second a chunk size:
 *   even mode  the rest goes to a fresh server connection as if from the
 *              socket, in chunks: never a crash, never plain text before
 *              a handshake, a failure stays a failure, and what is left
 *              to send (an alert) drains.
 *   odd mode   an in-memory OpenSSL client shakes hands with the server
 *              connection, every record cut into chunks of that size on
 *              the way, then sends the rest of the input as plain text
 *              and the server seals a reply: the server's reader gets
 *              exactly the bytes the client wrote, in order, however the
 *              records were cut, and the client reads the reply intact.
 * The server's key and certificate are made once, in memory, and written
 * to a temporary directory for tls_configure.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "conf.h"
#include "fuzz.h"
#include "sbuf.h"
#include "tls.h"

#define FUZZ_PLAIN_MAX 65536

static SSL_CTX *client_ctx;

/* What the server's reader was given. */
static int fuzz_plain(void *ud, const char *data, size_t len)
{
    struct sbuf *b = ud;

    FUZZ_CHECK(b->len + len <= FUZZ_PLAIN_MAX);
    sbuf_append(b, data, len);
    return 0;
}

static void fuzz_write_pem(const char *path, EVP_PKEY *key, X509 *x)
{
    FILE *f = fopen(path, "w");

    FUZZ_CHECK(f);
    FUZZ_CHECK(key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
                   : PEM_write_X509(f, x));
    fclose(f);
}

/* A self-signed P-256 certificate for "localhost". */
static void fuzz_make_pair(const char *crt, const char *key)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_NAME *n;

    FUZZ_CHECK(k && x);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, k);
    n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC,
                               (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, n);
    FUZZ_CHECK(X509_sign(x, k, EVP_sha256()) > 0);
    fuzz_write_pem(crt, NULL, x);
    fuzz_write_pem(key, k, NULL);
    X509_free(x);
    EVP_PKEY_free(k);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static char dir[] = "/tmp/redlockd-fuzz-tls.XXXXXX";
    static char crt[64], key[64], version[] = "1.2", text[] = "tls://x";
    static struct conf_addr addr = { .kind = CONF_ADDR_TCP, .tls = true };
    static struct conf c;
    char err[256];

    (void)argc;
    (void)argv;
    FUZZ_CHECK(mkdtemp(dir));
    snprintf(crt, sizeof(crt), "%s/server.crt", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    fuzz_make_pair(crt, key);
    addr.text = text;
    c.listen = &addr;
    c.nlisten = 1;
    c.tls.cert_file = crt;
    c.tls.key_file = key;
    c.tls.min_version = version;
    if (tls_configure(&c, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_tls: %s\n", err);
        abort();
    }
    unlink(crt);
    unlink(key);
    rmdir(dir);
    client_ctx = SSL_CTX_new(TLS_client_method());
    FUZZ_CHECK(client_ctx);
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_NONE, NULL);
    return 0;
}

/* Feed len bytes in chunks; the last result. */
static enum tls_io fuzz_feed(struct tls_conn *t, const char *data,
                             size_t len, size_t chunk, struct sbuf *plain)
{
    enum tls_io r = TLS_IO_OK;

    for (size_t off = 0; off < len && r == TLS_IO_OK; off += chunk) {
        size_t n = len - off < chunk ? len - off : chunk;
        r = tls_conn_input(t, data + off, n, fuzz_plain, plain);
    }
    return r;
}

static void fuzz_raw(const uint8_t *data, size_t size, size_t chunk)
{
    struct tls_conn *t = tls_conn_new();
    struct sbuf plain = SBUF_INIT, in = SBUF_INIT, wire = SBUF_INIT;
    enum tls_io r;

    FUZZ_CHECK(t);
    r = fuzz_feed(t, (const char *)data, size, chunk, &plain);
    /* No handshake can be finished by bytes nobody encrypted for it. */
    FUZZ_CHECK(!tls_conn_established(t));
    FUZZ_CHECK(plain.len == 0);
    if (r == TLS_IO_FAILED) {
        /* Failed stays failed; the reason is a known one. */
        FUZZ_CHECK(tls_conn_input(t, "x", 1, fuzz_plain, &plain) ==
                   TLS_IO_FAILED);
        FUZZ_CHECK(tls_conn_failure(t) < TLS_FAIL_N);
        FUZZ_CHECK(tls_conn_detail(t)[0] != '\0');
    }
    /* Replies wait for a handshake; what TLS has to say drains. */
    sbuf_append(&in, "OK\n", 3);
    tls_conn_seal(t, &in, &wire);
    FUZZ_CHECK(in.len == 3 || r == TLS_IO_FAILED);
    tls_conn_free(t);
    sbuf_deinit(&plain);
    sbuf_deinit(&in);
    sbuf_deinit(&wire);
}

/* Move what the client SSL wrote to the server, in chunks. */
static enum tls_io fuzz_to_server(BIO *from, struct tls_conn *t,
                                  size_t chunk, struct sbuf *plain)
{
    char buf[16384];
    int k;
    enum tls_io r = TLS_IO_OK;

    while (r == TLS_IO_OK && (k = BIO_read(from, buf, sizeof(buf))) > 0)
        r = fuzz_feed(t, buf, (size_t)k, chunk, plain);
    return r;
}

/* Move what the server sealed to the client. */
static void fuzz_to_client(struct tls_conn *t, struct sbuf *out, BIO *to)
{
    struct sbuf wire = SBUF_INIT;

    FUZZ_CHECK(tls_conn_seal(t, out, &wire) == 0);
    if (wire.len)
        FUZZ_CHECK(BIO_write(to, wire.data, (int)wire.len) == (int)wire.len);
    sbuf_deinit(&wire);
}

static void fuzz_session(const uint8_t *data, size_t size, size_t chunk)
{
    struct tls_conn *t = tls_conn_new();
    SSL *cl = SSL_new(client_ctx);
    BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
    struct sbuf plain = SBUF_INIT, none = SBUF_INIT, reply = SBUF_INIT;
    char got[64];
    int rounds = 0;

    FUZZ_CHECK(t && cl && c_in && c_out);
    BIO_set_mem_eof_return(c_in, -1);
    SSL_set_bio(cl, c_in, c_out);
    SSL_set_connect_state(cl);
    /* The handshake, each flight cut into chunks on its way in. */
    for (;;) {
        int hs = SSL_do_handshake(cl);
        if (hs == 1)
            break;
        FUZZ_CHECK(SSL_get_error(cl, hs) == SSL_ERROR_WANT_READ);
        FUZZ_CHECK(fuzz_to_server(c_out, t, chunk, &plain) == TLS_IO_OK);
        fuzz_to_client(t, &none, c_in);
        FUZZ_CHECK(++rounds < 10);
    }
    FUZZ_CHECK(fuzz_to_server(c_out, t, chunk, &plain) == TLS_IO_OK);
    FUZZ_CHECK(tls_conn_established(t));
    FUZZ_CHECK(plain.len == 0);

    /* The client's plain text arrives whole and in order. */
    if (size > 0)
        FUZZ_CHECK(SSL_write(cl, data, (int)size) == (int)size);
    FUZZ_CHECK(fuzz_to_server(c_out, t, chunk, &plain) == TLS_IO_OK);
    FUZZ_CHECK(plain.len == size);
    FUZZ_CHECK(size == 0 || memcmp(plain.data, data, size) == 0);

    /* And the server's reply reaches the client. */
    sbuf_append(&reply, "OK fuzz\n", 8);
    fuzz_to_client(t, &reply, c_in);
    FUZZ_CHECK(reply.len == 0);
    int k, n = 0;
    while ((k = SSL_read(cl, got + n, (int)sizeof(got) - n)) > 0)
        n += k;
    FUZZ_CHECK(n == 8 && memcmp(got, "OK fuzz\n", 8) == 0);
    ERR_clear_error();

    SSL_free(cl);
    tls_conn_free(t);
    sbuf_deinit(&plain);
    sbuf_deinit(&none);
    sbuf_deinit(&reply);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t chunk;

    if (size < 2)
        return 0;
    chunk = (size_t)data[1] + 1;
    if (data[0] & 1)
        fuzz_session(data + 2, size - 2, chunk);
    else
        fuzz_raw(data + 2, size - 2, chunk);
    return 0;
}
