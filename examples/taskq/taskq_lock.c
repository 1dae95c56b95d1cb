/*
 * redlockd-taskq, the daemon's side: the session on redlockd (lk, or one
 * of a task's), a lock's status there, and a task's resource name
 * (taskq_shared.h lists the files). It calls only taskq_base.c and
 * libredlockd.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "redlockd.h"
#include "taskq_shared.h"

struct redlockd *lk;

/* A session of the worker's: lk, or one of a task's (work_one in
 * taskq_work.c). */
int lock_open(const struct cfg *c, struct redlockd **h,
              struct redlockd_error *err)
{
    struct redlockd_opts o;

    memset(&o, 0, sizeof(o));
    o.server = c->server;
    o.name = c->name;
    o.keepalive_ms = (unsigned)c->keepalive_ms;
    /* A worker (or a task's keeper) that dies keeps its locks only as
     * long as their ttl (a blip shorter than that is ridden out): its
     * stale work is then recovered by another worker, not the library's
     * default 30 s later. */
    o.detach_ms = c->ttl_ms;
    return redlockd_connect(h, &o, err);
}

void lock_connect(const struct cfg *c)
{
    struct redlockd_error err;

    if (lock_open(c, &lk, &err) < 0)
        die(EXIT_UNAVAILABLE, "redlockd %s: %s",
            c->server ? c->server : "(default)", err.msg);
}

/* STATUS of a resource as JSON (caller decrefs), NULL on failure. */
json_t *lock_status(const char *res)
{
    char *txt = NULL;
    json_t *j;

    if (redlockd_status(lk, res, &txt) < 0)
        return NULL;
    j = json_loads(txt, 0, NULL);
    free(txt);
    return j;
}

/* The redlockd resource of a task. */
void lock_resource(const struct cfg *c, const char *id, char *out,
                   size_t size)
{
    snprintf(out, size, "taskq:%s:%s", c->queue, id);
}
