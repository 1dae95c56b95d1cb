/*
 * server: the daemon-wide context, the listeners and accepting clients.
 *
 * Listens on every configured address (TCP and unix at once), or on the
 * sockets systemd passed (socket activation) instead. Each accepted
 * connection becomes a session; max_clients and protected mode are applied
 * here, with one ERR line before the close. It counts what it accepts and
 * refuses in struct server_counters, which stats_glue.c reads.
 */
#ifndef REDLOCKD_SERVER_H
#define REDLOCKD_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "proto.h"

struct conf;

struct server {
    uv_loop_t *loop;
    const struct conf *conf;
};

extern struct server server;

/* What the server counts (for STATS and /metrics, through stats_glue.c). */
struct server_counters {
    uint64_t accepted;              /* connections accepted, refused ones
                                       included */
    uint64_t rejected;              /* refused with an ERR line */
    uint64_t errors[PROTO_ERR_COUNT];   /* those ERR lines, by code */
};

const struct server_counters *server_counters(void);

int server_start(uv_loop_t *loop, const struct conf *conf);
/* Close the listeners (sessions are closed separately). */
void server_stop_listening(void);
/* The last handles of the connections' machinery (the end-of-turn flush),
 * closed when the daemon exits. */
void server_deinit(void);

#endif
