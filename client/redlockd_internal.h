/*
 * Internals of libredlockd shared with its unit tests (tests/unit/
 * test_client.c). Not installed, and not exported from the shared library
 * (client/redlockd.map lists the public symbols): the tests link the static
 * one.
 */
#ifndef REDLOCKD_CLIENT_INTERNAL_H
#define REDLOCKD_CLIENT_INTERNAL_H

#include <stddef.h>

#include "addr.h"
#include "redlockd.h"

/* Replies to inspection commands are single JSON lines. */
#define REDLOCKD_MAX_REPLY (1024 * 1024)

/* A server address read by proto_addr_parse (proto/addr.h) under
 * PROTO_ADDR_FOR_CLIENT, in the shape connect needs. */
struct redlockd_addr {
    int is_unix;
    int is_tls;                             /* tls://HOST:PORT */
    char host[PROTO_ADDR_HOST_MAX + 1];     /* without the IPv6 brackets */
    char port[PROTO_PORT_TEXT_SIZE];        /* decimal, for getaddrinfo */
    char path[PROTO_ADDR_PATH_MAX + 1];
    char text[PROTO_ADDR_TEXT_SIZE];        /* canonical, for messages */
};

/* Parse a server address (see redlockd_opts.server).
 * 0 or -REDLOCKD_E_INVALID. */
int redlockd_addr_parse(const char *s, struct redlockd_addr *a,
                        struct redlockd_error *err);

/* Wrap a connected socket in a handle, without any handshake. The handle
 * owns fd from then on, also on failure. */
int redlockd_open_fd(struct redlockd **out, int fd,
                     const struct redlockd_opts *opts,
                     struct redlockd_error *err);

/* The HELLO / AUTH exchange that redlockd_connect does after connecting. */
int redlockd_handshake(struct redlockd *h, const struct redlockd_opts *opts);

#endif
