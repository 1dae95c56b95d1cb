/*
 * libredlockd, the leases of a handle: the table, their deadlines and
 * states, what EVENT LOST says of them, the application's on_lost, and the
 * LOCKS round that confirms them. Above the connection (it sends LOCKS and
 * UNLOCK through rl_exchange), beside the watches, below the failover.
 *
 * A lease's deadline is the send time of the request that last confirmed
 * it (LOCK, EXTEND, ADOPT, or the LOCKS of a refresh) plus the validity
 * its reply reported: docs/protocol.md, "Writing a client: the lease
 * deadline rule". A lease is HELD while the current connection confirmed
 * it, UNCONFIRMED while the handle reconnects (its deadline still holds:
 * the keys outlive it on the nodes), and LOST once the daemon said so, a
 * new daemon could not ADOPT it, or its deadline passed unconfirmed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "redlockd_priv.h"

/* ---- the table ---------------------------------------------------------- */

struct rl_lease *rl_lease_find(const struct redlockd *h, const char *resource)
{
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        if (strcmp(h->leases[i].resource, resource) == 0)
            return &h->leases[i];
    }
    return NULL;
}

/* The entry of resource, made (lost, no deadline) if there is none; NULL
 * when out of memory, the connection then closed. */
struct rl_lease *rl_lease_get(struct redlockd *h, const char *resource)
{
    struct rl_lease *l = rl_lease_find(h, resource), *grown;
    size_t cap;

    if (l)
        return l;
    if (h->nleases == h->leases_cap) {
        cap = h->leases_cap ? h->leases_cap * 2 : 8;
        grown = realloc(h->leases, cap * sizeof(*grown));
        if (!grown) {
            rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
            return NULL;
        }
        h->leases = grown;
        h->leases_cap = cap;
    }
    l = &h->leases[h->nleases];
    memset(l, 0, sizeof(*l));
    l->resource = strdup(resource);
    if (!l->resource) {
        rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
        return NULL;
    }
    l->lost = true;
    h->nleases++;
    return l;
}

void rl_lease_del(struct redlockd *h, const char *resource)
{
    struct rl_lease *l = rl_lease_find(h, resource);

    if (!l)
        return;
    free(l->resource);
    *l = h->leases[--h->nleases];
}

void rl_lease_free_all(struct redlockd *h)
{
    size_t i;

    for (i = 0; i < h->nleases; i++)
        free(h->leases[i].resource);
    free(h->leases);
    h->leases = NULL;
    h->nleases = h->leases_cap = 0;
}

/* The daemon no longer holds it for us. fence 0: not known. */
int rl_lease_lose(struct redlockd *h, const char *resource, uint64_t fence)
{
    struct rl_lease *l = rl_lease_get(h, resource);

    if (!l)
        return -REDLOCKD_E_NOMEM;
    l->lost = true;
    if (fence != 0)
        l->fence = fence;
    return 0;
}

/* The application's on_lost, with no request allowed from inside it. */
void rl_tell_lost(struct redlockd *h, const char *resource, uint64_t fence,
                  const char *reason)
{
    if (!h->on_lost)
        return;
    h->in_callback++;
    h->on_lost(resource, fence, reason, h->ud);
    h->in_callback--;
}

/* A lease being released that is found gone is what its owner asked for:
 * nobody to tell. */
void rl_lease_lost_by(struct redlockd *h, struct rl_lease *l,
                      const char *reason)
{
    if (l->lost)
        return;
    l->lost = true;
    l->confirmed = false;
    if (!l->releasing)
        rl_tell_lost(h, l->resource, l->fence, reason);
}

/*
 * The last request confirmed validity_ms of the lease. A detachable
 * session outlives a connection the daemon saw end by its detach time,
 * and then releases its leases; the daemon may see that end before we do
 * (keepalive, a reset we have not read). So a lease is certainly ours for
 * no longer after a confirmation than that, less the daemon's clock-drift
 * margin for a timer of that length.
 */
void rl_lease_confirm(struct redlockd *h, struct rl_lease *l,
                      int64_t validity_ms)
{
    int64_t v = validity_ms > 0 ? validity_ms : 0;

    if (h->detachable) {
        int64_t safe = h->detach_ms - h->detach_ms / 100 - 2;

        if (v > safe)
            v = safe > 0 ? safe : 0;
    }
    l->deadline = h->sent_ms + v;
    l->validity = validity_ms;
    l->confirmed = true;
}

int rl_lease_taken(struct redlockd *h, const struct redlockd_lease *ls,
                   bool renew)
{
    struct rl_lease *l = rl_lease_get(h, ls->resource);

    if (!l)
        return -REDLOCKD_E_NOMEM;
    l->lost = false;
    l->releasing = false;
    l->attached = true;
    l->fence = ls->fence;
    l->ttl = ls->ttl;
    l->renew = renew;
    snprintf(l->token, sizeof(l->token), "%s", ls->token);
    rl_lease_confirm(h, l, ls->validity);
    return 0;
}

void rl_lease_expire(struct redlockd *h)
{
    int64_t now = rl_now_ms();
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        struct rl_lease *l = &h->leases[i];

        if (!l->lost && !l->confirmed && now >= l->deadline)
            rl_lease_lost_by(h, l, "deadline");
    }
}

int64_t rl_lease_earliest(const struct redlockd *h)
{
    int64_t first = -1, now = rl_now_ms();
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        const struct rl_lease *l = &h->leases[i];

        if (!l->lost && l->deadline > now)
            first = rl_earlier(first, l->deadline);
    }
    return first;
}

/*
 * Not detachable, the session ended with its connection and the daemon
 * released its leases. A detachable one whose daemon was shutting down
 * (EVENT SHUTDOWN), or that said it left them on the nodes (EVENT CLOSING
 * reason=shutdown), is gone and its leases are on the nodes until their
 * ttl (a detachable session's drop during the shutdown window is no
 * release): every lease wants an ADOPT. Otherwise a detached session
 * keeps them for a resume.
 */
void rl_lease_unconfirm(struct redlockd *h)
{
    bool released = !h->detachable;
    bool left = h->closing_kept || (h->detachable && h->shutdown_seen);
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        struct rl_lease *l = &h->leases[i];

        if (l->lost)
            continue;
        l->confirmed = false;
        if (left)
            l->attached = false;
        else if (l->attached && released)
            rl_lease_lost_by(h, l, "disconnected");
    }
}

/* EVENT LOST resource= fence= reason= (the connection layer hands it up,
 * through the handle's hooks). */
int rl_event_lost(struct redlockd *h, const struct proto_reply *ev)
{
    const char *res = proto_reply_get(ev, "resource");
    const char *reason = proto_reply_get(ev, "reason");
    const char *fence_s = proto_reply_get(ev, "fence");
    const struct rl_lease *l;
    uint64_t fence = 0;
    bool told;
    int rc;

    if (!res || *res == '\0')
        return rl_fatal(h, REDLOCKD_E_PROTO, "EVENT LOST without a resource");
    /* A missing or odd fence must not hide the loss itself. */
    if (proto_parse_u64(fence_s, rl_len(fence_s), &fence) < 0)
        fence = 0;
    /* One the library gave up already (its deadline passed while the
     * handle reconnected) was reported then; a resumed daemon says so
     * only now. */
    l = rl_lease_find(h, res);
    told = l && l->lost && l->fence == fence && fence != 0;
    rc = rl_lease_lose(h, res, fence);
    if (rc < 0)
        return rc;
    if (!told)
        rl_tell_lost(h, res, fence, reason ? reason : "");
    return 0;
}

/* ---- what the application asks ------------------------------------------ */

/* The connection is gone for good (a handle that does not reconnect):
 * the daemon has released everything. */
static bool rl_all_gone(const struct redlockd *h)
{
    return h->fd < 0 && !rl_can_reconnect(h);
}

int redlockd_lost(const struct redlockd *h, const char *resource)
{
    const struct rl_lease *l;

    if (rl_all_gone(h))
        return 1;
    l = resource ? rl_lease_find(h, resource) : NULL;
    return l && l->lost;
}

int redlockd_lease_deadline(const struct redlockd *h, const char *resource,
                            int64_t *deadline_ms)
{
    const struct rl_lease *l = resource ? rl_lease_find(h, resource) : NULL;

    if (!l)
        return -REDLOCKD_E_NOTHELD;
    if (rl_all_gone(h) || l->lost)
        return -REDLOCKD_E_LOST;
    if (deadline_ms)
        *deadline_ms = l->deadline;
    return 0;
}

int redlockd_lease_check(const struct redlockd *h, const char *resource)
{
    int64_t deadline;
    int rc = redlockd_lease_deadline(h, resource, &deadline);

    if (rc == 0 && rl_now_ms() >= deadline)
        rc = -REDLOCKD_E_LOST;
    return rc;
}

/* An unconfirmed lease past its deadline is never adopted: lost, though
 * the library says so (on_lost) only at its next call. */
int redlockd_lease_state(const struct redlockd *h, const char *resource)
{
    const struct rl_lease *l = resource ? rl_lease_find(h, resource) : NULL;

    if (!l)
        return REDLOCKD_LEASE_NONE;
    if (rl_all_gone(h) || l->lost)
        return REDLOCKD_LEASE_LOST;
    if (l->confirmed && h->fd >= 0)
        return REDLOCKD_LEASE_HELD;
    return rl_now_ms() >= l->deadline ? REDLOCKD_LEASE_LOST
                                      : REDLOCKD_LEASE_UNCONFIRMED;
}

int redlockd_lease_info(const struct redlockd *h, const char *resource,
                        struct redlockd_lease *out)
{
    const struct rl_lease *l = resource ? rl_lease_find(h, resource) : NULL;
    int state = redlockd_lease_state(h, resource);

    if (!l)
        return -REDLOCKD_E_NOTHELD;
    if (out) {
        memset(out, 0, sizeof(*out));
        snprintf(out->resource, sizeof(out->resource), "%s", l->resource);
        memcpy(out->token, l->token, sizeof(out->token));
        out->fence = l->fence;
        out->ttl = l->ttl;
        out->validity = l->validity;
    }
    return state == REDLOCKD_LEASE_LOST ? -REDLOCKD_E_LOST : 0;
}

/* ---- the LOCKS round ---------------------------------------------------- */

/* The member of a LOCKS "locks" array for resource, or NULL. */
static json_t *rl_locks_entry(json_t *locks, const char *resource)
{
    json_t *e;
    size_t i;

    json_array_foreach(locks, i, e) {
        const char *res = json_string_value(json_object_get(e, "resource"));

        if (res && strcmp(res, resource) == 0)
            return e;
    }
    return NULL;
}

static bool rl_json_lists(json_t *names, const char *resource)
{
    json_t *e;
    size_t i;

    json_array_foreach(names, i, e) {
        const char *res = json_string_value(e);

        if (res && strcmp(res, resource) == 0)
            return true;
    }
    return false;
}

/* A lease found in the answer: confirmed on this session. A token shown
 * there (to its own session only) replaces ours: an ADOPT whose answer was
 * lost rotated it. */
static void rl_lease_listed(struct redlockd *h, struct rl_lease *l, json_t *e)
{
    const char *token = json_string_value(json_object_get(e, "token"));

    l->attached = true;
    rl_lease_confirm(h, l, json_integer_value(json_object_get(e, "validity")));
    if (token && strlen(token) == REDLOCKD_TOKEN_LEN)
        memcpy(l->token, token, sizeof(l->token));
}

/* One lease against the LOCKS answer: a new deadline, or lost. After a
 * resume, one the session was not known to hold is left for an ADOPT
 * unless the answer lists it. */
static int rl_locks_lease(struct redlockd *h, struct rl_lease *l,
                          json_t *locks, json_t *lost)
{
    json_t *e = rl_locks_entry(locks, l->resource), *fence, *validity;

    if (!e || rl_json_lists(lost, l->resource)) {
        if (l->attached)
            rl_lease_lost_by(h, l, "missing");
        return 0;
    }
    fence = json_object_get(e, "fence");
    validity = json_object_get(e, "validity");
    if (!json_is_integer(fence) || !json_is_integer(validity))
        return rl_fatal(h, REDLOCKD_E_PROTO,
                        "malformed lease %.200s in reply to LOCKS",
                        l->resource);
    /* Another fence is another acquisition: not the lease we hold. */
    if ((uint64_t)json_integer_value(fence) != l->fence)
        rl_lease_lost_by(h, l, "missing");
    else
        rl_lease_listed(h, l, e);
    return 0;
}

/*
 * After a resume: leases the session holds that the application does not
 * (a LOCK whose answer the broken connection took with it, or one given up
 * at its deadline) are released, so that they are not held for nobody.
 * Best effort: the daemon's refusals do not matter, a broken connection
 * does.
 */
static int rl_release_strays(struct redlockd *h, struct sbuf *b, json_t *locks,
                             int64_t until)
{
    struct proto_reply r;
    json_t *e;
    size_t i;
    int rc;

    json_array_foreach(locks, i, e) {
        const char *res = json_string_value(json_object_get(e, "resource"));
        const struct rl_lease *l = res ? rl_lease_find(h, res) : NULL;

        if (!res || (l && !l->lost) || strlen(res) > REDLOCKD_RESOURCE_MAX)
            continue;
        sbuf_reset(b);
        proto_format_request(b, PROTO_CMD_UNLOCK, res);
        rc = rl_exchange(h, b, until, &r);
        if (rc == 1)
            return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT,
                            "no reply to UNLOCK in time");
        if (rl_transport_failed(h, rc))
            return rc;
    }
    return 0;
}

static int rl_locks_reply(struct redlockd *h, const struct proto_reply *r,
                          struct sbuf *b, int64_t until, bool after_resume)
{
    json_error_t jerr;
    json_t *root, *locks;
    size_t i;
    int rc = 0;

    if (r->kind != PROTO_REPLY_OK || r->text[0] != '{')
        return rl_fatal(h, REDLOCKD_E_PROTO, "LOCKS did not answer with JSON");
    root = json_loads(r->text, 0, &jerr);
    locks = json_object_get(root, "locks");
    if (!json_is_array(locks))
        rc = rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCKS: %s",
                      !root ? jerr.text : "no \"locks\" array");
    for (i = 0; rc == 0 && i < h->nleases; i++) {
        if (!h->leases[i].lost)
            rc = rl_locks_lease(h, &h->leases[i], locks,
                                json_object_get(root, "lost"));
    }
    if (rc == 0 && after_resume)
        rc = rl_release_strays(h, b, locks, until);
    json_decref(root);
    return rc;
}

/* The lease not lost whose deadline comes first among those still ahead. */
static const struct rl_lease *rl_lease_next_due(const struct redlockd *h)
{
    const struct rl_lease *first = NULL;
    int64_t now = rl_now_ms();
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        const struct rl_lease *l = &h->leases[i];

        if (!l->lost && l->deadline > now
            && (!first || l->deadline < first->deadline))
            first = l;
    }
    return first;
}

/* No answer by the deadline of the lease on resource: the connection can
 * not be trusted (a late answer would be taken for the next one's), and a
 * handle that reconnects counts that lease lost now, whatever comes. */
static int rl_locks_late(struct redlockd *h, const char *resource)
{
    struct rl_lease *l;
    int rc;

    if (!resource)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to LOCKS in time");
    rc = rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to LOCKS before the "
                  "deadline of the lease on %.200s", resource);
    l = rl_lease_find(h, resource);
    if (l && rl_can_reconnect(h))
        rl_lease_lost_by(h, l, "deadline");
    return rc;
}

int rl_locks_round(struct redlockd *h, struct sbuf *b, int64_t until,
                   bool watch, bool after_resume)
{
    const struct rl_lease *due = watch ? rl_lease_next_due(h) : NULL;
    char *due_name = NULL;
    struct proto_reply r;
    int rc;

    if (due && (until < 0 || due->deadline < until)) {
        until = due->deadline;
        due_name = strdup(due->resource);
        if (!due_name)
            return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    }
    sbuf_reset(b);
    proto_format_request(b, PROTO_CMD_LOCKS, NULL);
    rc = rl_exchange(h, b, until, &r);
    if (rc == 1)
        rc = rl_locks_late(h, due_name);
    else if (rc == 0)
        rc = rl_locks_reply(h, &r, b, until, after_resume);
    free(due_name);
    return rc;
}
