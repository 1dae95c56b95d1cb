/*
 * server: the daemon-wide context, the listeners and accepting clients.
 *
 * Listens on every configured address (TCP and unix at once), or on the
 * sockets systemd passed (socket activation) instead. Each accepted
 * connection becomes a session; max_clients and protected mode are applied
 * here, with one ERR line before the close.
 */
#ifndef REDLOCKD_SERVER_H
#define REDLOCKD_SERVER_H

#include <stdbool.h>

#include <uv.h>

#include "proto.h"

struct conf;

struct server {
    uv_loop_t *loop;
    const struct conf *conf;
};

extern struct server server;

int server_start(uv_loop_t *loop, const struct conf *conf);
/* Close the listeners (sessions are closed separately). */
void server_stop_listening(void);
/* The last handles of the connections' machinery (the end-of-turn flush),
 * closed when the daemon exits. */
void server_deinit(void);

#endif
