/*
 * watch: WATCH and EVENT HOLDER (docs/protocol.md, "Watching a lock").
 *
 * A session that watches a resource hears who holds it now, then every
 * change, as EVENT HOLDER lines. The state always comes from the nodes
 * (lockmgr_peek, as STATUS reads it), one read at a time per resource: a
 * change noticed while a read is out asks for one more after it, so the
 * last line a watcher gets is never older than the last change noticed,
 * and lines equal to the last one sent are not sent again.
 *
 * Changes are noticed three ways:
 *   - made here: lockmgr tells (lockmgr_set_change_observer) once the
 *     nodes show a grant, a release, a new value or an ADOPT;
 *   - made through another daemon: the watch channel (pool.h). Each daemon
 *     announces the resources its sessions watch ("W"), again every
 *     WATCH_ANNOUNCE_MS; a daemon that changes a resource announced there
 *     says so ("C", with a semaphore's size), so nobody publishes anything
 *     for resources nobody watches;
 *   - made by other Redlock clients (a plain SET NX key, its expiry): every
 *     watched resource is read again each locks.watch_poll_ms.
 * Watches end with their session and survive a resume, which hears the
 * current state again (watch_client_resend).
 */
#ifndef REDLOCKD_WATCH_H
#define REDLOCKD_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "list.h"

struct conf;

/* One session's watches; say() writes an EVENT HOLDER line (LF ended) to
 * its client, or drops it when nobody listens (detached). */
struct watch_client {
    struct list watches;            /* struct watcher (clink) */
    size_t n;
    void (*say)(struct watch_client *c, const char *line, size_t len);
};

void watch_init(const struct conf *conf);
/* The daemon stops: no more reads, announcements or timers (before the
 * timers go). */
void watch_stop(void);
/* Free what is left, after the loop (no timer is touched). */
void watch_deinit(void);

void watch_client_init(struct watch_client *c,
                       void (*say)(struct watch_client *c, const char *line,
                                   size_t len));
/* How many of res[0..n) c does not watch yet (for limits.max_watches). */
size_t watch_client_new(const struct watch_client *c,
                        const char *const *res, const size_t *len, size_t n);
/* WATCH: c watches each of res[0..n) (again: it hears the state again). */
void watch_add(struct watch_client *c, const char *const *res,
               const size_t *len, size_t n);
/* UNWATCH: c stops watching those it watches. */
void watch_remove(struct watch_client *c, const char *const *res,
                  const size_t *len, size_t n);
/* The session ends: every watch of c goes. */
void watch_client_clear(struct watch_client *c);
/* The session resumed: c hears each state it watches again. */
void watch_client_resend(struct watch_client *c);

/* A message on the watch channel (pool's on_watch). */
void watch_on_message(const char *msg, size_t len);

#endif
