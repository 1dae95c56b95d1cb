/*
 * wording: see wording.h.
 */
#include "wording.h"

#include <inttypes.h>
#include <stdio.h>

/* "job:42", "job:42 and 2 more" (the request named count of them). */
static const char *names(const struct lockmgr_refusal *no, char *buf,
                         size_t size)
{
    const char *r = no->resource ? no->resource : "the resource";

    if (no->count > 1)
        snprintf(buf, size, "%s and %zu more", r, no->count - 1);
    else
        snprintf(buf, size, "%s", r);
    return buf;
}

static enum proto_err unavailable(const struct lockmgr_refusal *no,
                                  char *msg, size_t size)
{
    snprintf(msg, size, "no quorum of %d of %d redis nodes voted in time%s%s",
             no->quorum, no->nodes, no->detail ? ": " : "",
             no->detail ? no->detail : "");
    return PROTO_ERR_UNAVAILABLE;
}

/* Busy, timeout, cut: the names and whether a semaphore is full. */
static enum proto_err still_held(const struct lockmgr_refusal *no,
                                 char *msg, size_t size)
{
    char n[PROTO_MAX_ERRMSG / 2];
    const char *are = no->count > 1 ? "are" : "is";

    names(no, n, sizeof(n));
    switch (no->why) {
    case LOCKMGR_NO_CUT:
        snprintf(msg, size, "the client closed the connection while "
                 "waiting for %s", n);
        return PROTO_ERR_TIMEOUT;
    case LOCKMGR_NO_TIMEOUT:
        if (no->limit)
            snprintf(msg, size, "all %" PRIu32 " slots of %s are still held",
                     no->limit, n);
        else
            snprintf(msg, size, "%s %s still held by someone else", n, are);
        return PROTO_ERR_TIMEOUT;
    default:
        if (no->limit)
            snprintf(msg, size, "all %" PRIu32 " slots of %s are held",
                     no->limit, n);
        else
            snprintf(msg, size, "%s %s held by someone else", n, are);
        return PROTO_ERR_BUSY;
    }
}

/* A resource locked here one way and asked (or found) another. */
static enum proto_err kind(const struct lockmgr_refusal *no, char *msg,
                           size_t size)
{
    const char *r = no->resource;

    if (!no->here)
        snprintf(msg, size, "%s is locked here without limit=, not as a "
                 "semaphore of limit=%" PRIu32, r, no->limit);
    else if (!no->limit)
        snprintf(msg, size, "%s is a semaphore here (limit=%" PRIu32 "): "
                 "lock it with that limit", r, no->here);
    else
        snprintf(msg, size, "%s is a semaphore of limit=%" PRIu32 " here, "
                 "not %" PRIu32 ": every holder must use the same limit", r,
                 no->here, no->limit);
    return PROTO_ERR_ARG;
}

/* GONE: what was lost depends on the command. */
static enum proto_err gone(enum proto_cmd cmd,
                           const struct lockmgr_refusal *no, char *msg,
                           size_t size)
{
    if (cmd == PROTO_CMD_ADOPT)
        snprintf(msg, size, "the token holds on too few nodes: the lease is "
                 "gone (or was adopted elsewhere)");
    else if (cmd == PROTO_CMD_UNLOCK)
        snprintf(msg, size, "%s%s: the lease was no longer held on any node",
                 no->resource ? no->resource : "the resource",
                 no->count > 1 ? " (or another of them)" : "");
    else
        snprintf(msg, size, "the lease on %s was lost",
                 no->resource ? no->resource : "the resource");
    return PROTO_ERR_LOST;
}

enum proto_err wording_refusal(enum proto_cmd cmd,
                               const struct lockmgr_refusal *no, char *msg,
                               size_t size)
{
    switch (no->why) {
    case LOCKMGR_NO_BUSY:
    case LOCKMGR_NO_TIMEOUT:
    case LOCKMGR_NO_CUT:
        return still_held(no, msg, size);
    case LOCKMGR_NO_UNAVAILABLE:
        if (cmd == PROTO_CMD_EXTEND) {
            snprintf(msg, size, "could not set the new ttl on a quorum of "
                     "nodes; some may hold it, the others the old one: "
                     "count on the shorter until an EXTEND succeeds");
            return PROTO_ERR_UNAVAILABLE;
        }
        return unavailable(no, msg, size);
    case LOCKMGR_NO_RANDOM:
        snprintf(msg, size, "the system's random source failed: no token "
                 "can be made");
        return PROTO_ERR_UNAVAILABLE;
    case LOCKMGR_NO_SHUTDOWN:
        snprintf(msg, size, "the daemon is shutting down");
        return PROTO_ERR_SHUTDOWN;
    case LOCKMGR_NO_WAITERS:
        snprintf(msg, size, "%zu requests already wait for %s "
                 "(limits.max_waiters_per_resource)", no->count,
                 no->resource);
        return PROTO_ERR_LIMIT;
    case LOCKMGR_NO_LOCKS:
        snprintf(msg, size, "this session would hold more than %zu locks "
                 "(limits.max_locks_per_session)", no->count);
        return PROTO_ERR_LIMIT;
    case LOCKMGR_NO_HELD:
        snprintf(msg, size, "this session already holds %s", no->resource);
        return PROTO_ERR_HELD;
    case LOCKMGR_NO_KIND:
        return kind(no, msg, size);
    case LOCKMGR_NO_MULTI_KIND:
        snprintf(msg, size, "%s is a semaphore here: the resources of one "
                 "grant are exclusive", no->resource);
        return PROTO_ERR_ARG;
    case LOCKMGR_NO_TOO_LARGE:
        snprintf(msg, size, "%s is a semaphore of limit=%" PRIu32 " on the "
                 "nodes, more than locks.max_limit (%zu) here", no->resource,
                 no->limit, no->count);
        return PROTO_ERR_ARG;
    case LOCKMGR_NO_NO_SIZE:
        snprintf(msg, size, "slot %" PRIu32 " of %s: its semaphore's size is "
                 "not stored on the nodes", no->slot, no->resource);
        return PROTO_ERR_ARG;
    case LOCKMGR_NO_GONE:
        return gone(cmd, no, msg, size);
    }
    snprintf(msg, size, "refused");
    return PROTO_ERR_ARG;
}
