/*
 * tls: the server side of TLS for tls:// listeners, with OpenSSL driven
 * through memory BIOs on the loop's own thread.
 *
 * conn keeps its socket and its libuv reads and writes; tls sits between
 * the bytes and the lines. What the socket delivers goes in with
 * tls_conn_input, which decrypts it and hands the plain text to conn's
 * line reader (the handshake runs inside it, on the first bytes). Replies
 * go the other way with tls_conn_seal, which encrypts conn's output into
 * the bytes conn writes to the socket, together with whatever the
 * handshake or an alert left to send. Nothing here touches a socket, a
 * timer, a session or a counter: the handshake's time limit is conn's
 * handshake timer, and a failure is reported with a reason (enum
 * tls_fail) that conn logs and counts.
 *
 * One SSL_CTX serves new connections. tls_configure builds it at start
 * and again on SIGHUP; a reload that cannot load its files keeps the old
 * one. A connection keeps the context it started with until it closes.
 */
#ifndef REDLOCKD_TLS_H
#define REDLOCKD_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "sbuf.h"

struct conf;
struct tls_conn;

/*
 * Why a connection on a TLS port (or a TLS handshake on a plain one)
 * ended before a handshake completed: conn counts each (struct
 * conn_counters), and these names are the reason= labels of
 * redlockd_tls_handshake_failures_total (STATS_TLSFAIL_LABELS in stats.h,
 * which stats_glue.c maps name by name, so the two lists cannot drift).
 * plain_port, timeout and eof are conn's to see; tls_conn_failure says
 * which of the others it was.
 */
#define TLS_FAILURES(V)                                                      \
    V(plaintext) V(plain_port) V(timeout) V(eof) V(version)                  \
    V(no_client_cert) V(bad_client_cert) V(peer_alert) V(protocol)

#define TLS_FAIL_ENUM(name) TLS_FAIL_##name,
enum tls_fail { TLS_FAILURES(TLS_FAIL_ENUM) TLS_FAIL_N };
#undef TLS_FAIL_ENUM

/* (Re)build the context from c->tls.* (cert_file, key_file, ca_file,
 * verify_clients, min_version): 0, or -1 with the reason in err and the
 * context in use unchanged. Without a tls:// listener nothing is built. */
int tls_configure(const struct conf *c, char *err, size_t errlen);
/* Does the context in use require a client certificate? (What the file
 * says may differ after a reload that failed.) */
bool tls_verifies_clients(void);
/* Free the context (at exit; connections still open keep theirs). */
void tls_cleanup(void);

/* A connection's TLS state, from the current context; NULL when out of
 * memory or when no context was built. */
struct tls_conn *tls_conn_new(void);
void tls_conn_free(struct tls_conn *t);

enum tls_io {
    TLS_IO_OK,          /* all of it taken; maybe more to send (seal) */
    TLS_IO_CLOSED,      /* the client ended TLS (close_notify) */
    TLS_IO_FAILED,      /* see tls_conn_failure; an alert may wait to go */
};

/* Plain text for the reader: 0, or -1 to stop (out of memory). */
typedef int tls_plain_fn(void *ud, const char *data, size_t len);

/* Bytes from the socket: decrypted, every plain byte goes to plain(). */
enum tls_io tls_conn_input(struct tls_conn *t, const char *data, size_t len,
                           tls_plain_fn *plain, void *ud);
/* Encrypt all of *in (once the handshake is done; before, it waits in
 * *in) and append every byte due to the socket to *wire. -1 if TLS
 * failed while encrypting. */
int tls_conn_seal(struct tls_conn *t, struct sbuf *in, struct sbuf *wire);

/* Queue TLS's own goodbye (close_notify) for the next seal: a client
 * then tells our close from a cut connection. */
void tls_conn_close_notify(struct tls_conn *t);

/* The handshake finished. */
bool tls_conn_established(const struct tls_conn *t);
/* After TLS_IO_FAILED: the reason (counted), and a line for the log. */
enum tls_fail tls_conn_failure(const struct tls_conn *t);
const char *tls_conn_detail(const struct tls_conn *t);
/* The subject CN of the client's certificate once it was verified
 * (tls.verify_clients); "" otherwise. */
const char *tls_conn_peer_cn(const struct tls_conn *t);
/* "TLSv1.3 TLS_AES_256_GCM_SHA384", for the connection's log line. */
void tls_conn_describe(const struct tls_conn *t, char *buf, size_t size);

/* Does `data` start like a TLS handshake record (for a plain port)? */
bool tls_looks_like_handshake(const char *data, size_t len);

#endif
