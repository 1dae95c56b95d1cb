/*
 * status: what STATUS, LOCKS, SESSIONS and TOP show of locks, as JSON.
 *
 * lockmgr decides (who holds a resource here and on the nodes, in which
 * mode, which slots; lockmgr_status_plan) and hands the facts over as
 * plain structs; this module only writes them out, so lockmgr needs no
 * jansson and the wire format has one home (docs/protocol.md, STATUS,
 * LOCKS and TOP).
 */
#ifndef REDLOCKD_STATUS_H
#define REDLOCKD_STATUS_H

#include <stdbool.h>

#include <jansson.h>

#include "lockmgr.h"

/* STATUS's object (caller owns it). */
json_t *status_json(const struct lockmgr_status *st);
/* o's leases as an array (caller owns it). With `tokens` each names its
 * token: for o's own LOCKS only (never SESSIONS: a token is a bearer
 * credential for ADOPT). */
json_t *status_leases_json(const struct lockmgr_owner *o, bool tokens);
/* TOP's object: this daemon's id, the total of the resources held or
 * waited for here, and the first n of them (lockmgr_top). */
json_t *status_top_json(const char *daemon, const struct lockmgr_top_view *t,
                        size_t n, size_t total);

#endif
