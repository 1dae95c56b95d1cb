/*
 * libredlockd, the calls: the blocking commands of redlockd.h (LOCK,
 * UNLOCK, EXTEND, PING, the refresh, the inspections, FORCEUNLOCK, the
 * lock kinds, watching, reconnecting on request, reading events), and the
 * request lines and answers that the submissions (redlockd_inflight.c)
 * share with them. The handle itself is redlockd_handle.c's, the
 * connection redlockd_conn.c's, the lease table and its deadlines
 * redlockd_lease.c's, and following the leases across connections and
 * daemons redlockd_failover.c's (redlockd_priv.h says which is which, and
 * in which order they call each other).
 *
 * Every command starts with rl_begin, which reconnects first when the
 * connection was lost (and the handle may), and ends with rl_finish, which
 * handles the events that came in behind the reply. A command whose
 * connection breaks under it is sent again on the new one when that
 * changes nothing (UNLOCK, EXTEND, PING, the inspection commands); a LOCK
 * is not: its outcome is unknown, and it fails with REDLOCKD_E_IO.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "redlockd_priv.h"

_Static_assert(REDLOCKD_USER_MAX + RL_PASSWORD_MAX + sizeof("AUTH  \n")
               <= RL_REQ_MAX, "an AUTH line fits in the request buffer");
_Static_assert(PROTO_MAX_SESSION_LEN + PROTO_SECRET_LEN + PROTO_MAX_NAME_LEN
               + 128 <= RL_REQ_MAX, "a resuming HELLO fits in the buffer");

/* ---- small helpers ------------------------------------------------------ */

/* A whole request without options ("PING\n", "UNLOCK job:42\n"). */
static void rl_req_line(struct redlockd *h, enum proto_cmd cmd,
                        const char *arg)
{
    sbuf_reset(&h->req);
    proto_format_request(&h->req, cmd, arg);
}

/* "LOCK job:42": the command word and its resource, options to follow. */
static struct sbuf *rl_req_on(struct redlockd *h, enum proto_cmd cmd,
                              const char *resource)
{
    struct sbuf *b = rl_req(&h->req, cmd);

    proto_format_word(b, resource);
    return b;
}

static bool rl_passed(int64_t until)
{
    return until >= 0 && rl_now_ms() >= until;
}

/* ---- the start and end of a call ---------------------------------------- */

/* Not from the callback, and a clean error. */
int rl_begin_plain(struct redlockd *h)
{
    if (h->in_callback)
        return rl_fail(h, REDLOCKD_E_INVALID,
                       "called from the on_lost or on_holder callback");
    h->err.code = 0;
    h->err.msg[0] = '\0';
    return 0;
}

/* A usable connection, reconnecting first (by until, -1: the library's
 * own bounds only) when the last one was lost, or is found lost now. (A
 * handle that does not reconnect reads nothing ahead: its tests put
 * replies in the socket before the request.) */
static int rl_begin_within(struct redlockd *h, int64_t until)
{
    int rc = rl_begin_plain(h);

    if (rc < 0)
        return rc;
    if (!rl_can_reconnect(h))
        return h->fd >= 0 ? 0 : rl_recover(h, until);
    rl_peek(h);
    if (h->fd >= 0 && h->settled)
        return 0;
    return rl_recover(h, until);
}

int rl_begin(struct redlockd *h)
{
    return rl_begin_within(h, -1);
}

/* Events that came in behind the reply are handled now, so that poll() on
 * the socket never sleeps on an event already read; and a lease whose
 * deadline passed while the handle could not reconnect is lost now. */
static int rl_finish(struct redlockd *h, int rc)
{
    int drc;

    if (h->in_callback)
        return rc;
    drc = rl_drain_events(h);
    /* With TLS, events may also wait decrypted inside OpenSSL, where no
     * poll() on the socket sees them: read them too, while that finds
     * any. */
    while (drc >= 0 && h->fd >= 0 && rl_tls_pending(h) &&
           rl_read_events(h, rl_now_ms()) > 0)
        ;

    if (h->fd < 0 && rl_can_reconnect(h))
        rl_lease_expire(h);
    return drc < 0 ? drc : rc;
}

/* rl_exchange of h->req within the I/O timeout; extra_ms lengthens it for
 * requests the daemon may hold on purpose (LOCK wait=). */
static int rl_call(struct redlockd *h, uint32_t extra_ms,
                   struct proto_reply *r)
{
    int rc = rl_exchange(h, &h->req, rl_io_deadline(h, extra_ms), r);

    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT,
                        "no reply from the daemon in time");
    return rc;
}

/* rl_call of a request that changes nothing when it is sent twice: after
 * a transport failure, reconnect and send it once more. */
static int rl_call_again(struct redlockd *h, uint32_t extra_ms,
                         struct proto_reply *r)
{
    int rc = rl_call(h, extra_ms, r);

    if (!rl_transport_failed(h, rc) || !rl_can_reconnect(h))
        return rc;
    rc = rl_recover(h, -1);
    return rc < 0 ? rc : rl_call(h, extra_ms, r);
}

/* A request without options ("PING", "STATUS job:42") whose reply has
 * nothing to read but its kind. */
static int rl_call_expect(struct redlockd *h, enum proto_cmd cmd,
                          const char *arg, enum proto_reply_kind kind)
{
    struct proto_reply r;
    int rc;

    rl_req_line(h, cmd, arg);
    rc = rl_call_again(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, kind, cmd);
    return rc;
}

/* The public header cannot include proto.h; the numbers must agree. */
_Static_assert(REDLOCKD_RESOURCE_MAX == PROTO_RESOURCE_LEN_MAX,
               "REDLOCKD_RESOURCE_MAX is not the largest max_resource_len");
_Static_assert(REDLOCKD_RESOURCE_DEFAULT_MAX == PROTO_RESOURCE_LEN_DEFAULT,
               "REDLOCKD_RESOURCE_DEFAULT_MAX is not its default");

/* The daemon's rule (proto_valid_resource), under the largest limit a
 * daemon may be configured with; the daemon checks its own (by default
 * PROTO_RESOURCE_LEN_DEFAULT) and says so. */
static int rl_check_resource(struct redlockd *h, const char *resource)
{
    static const struct proto_limits lim = { PROTO_RESOURCE_LEN_MAX,
                                             PROTO_VALUE_LEN_MAX };
    size_t len = resource ? strlen(resource) : 0;

    if (len > PROTO_RESOURCE_LEN_MAX)
        return rl_fail(h, REDLOCKD_E_INVALID,
                       "resource name of %zu bytes is too long: redlockd "
                       "takes 1 to %d bytes by default "
                       "(locks.max_resource_len, at most %d)",
                       len, PROTO_RESOURCE_LEN_DEFAULT,
                       PROTO_RESOURCE_LEN_MAX);
    if (len > 0 && proto_valid_resource(resource, len, &lim))
        return 0;
    return rl_fail(h, REDLOCKD_E_INVALID,
                   "a resource name is 1 to %d visible ASCII characters "
                   "(locks.max_resource_len), no spaces",
                   PROTO_RESOURCE_LEN_DEFAULT);
}

/* A holder's value (LOCK value=, EXTEND value=), under the largest limit a
 * daemon may be configured with; the daemon checks its own. */
static int rl_check_value(struct redlockd *h, const char *value)
{
    if (rl_visible_word(value, REDLOCKD_VALUE_MAX))
        return 0;
    return rl_fail(h, REDLOCKD_E_INVALID,
                   "a value is 1 to %d visible ASCII characters "
                   "(locks.max_value_len), no spaces",
                   REDLOCKD_VALUE_DEFAULT_MAX);
}

/* Start of a request on one resource: checked before anything else. */
static int rl_begin_on(struct redlockd *h, const char *resource)
{
    int rc = rl_begin_plain(h);

    if (rc == 0)
        rc = rl_check_resource(h, resource);
    return rc < 0 ? rc : rl_begin(h);
}

/* ---- events, reconnecting on request ------------------------------------ */

int redlockd_poll_events(struct redlockd *h, int timeout_ms)
{
    int64_t until = rl_deadline(timeout_ms);
    unsigned long before = h->nevents;
    int rc = rl_begin_within(h, until);

    while (rc >= 0) {
        rc = rl_read_events(h, until);
        if (rc >= 0)
            return (int)(h->nevents - before);
        if (!rl_transport_failed(h, rc) || !rl_can_reconnect(h)
            || rl_passed(until))
            break;
        rc = rl_recover(h, until);
    }
    return rl_finish(h, rc);
}

int redlockd_reconnect(struct redlockd *h)
{
    int rc = rl_begin_plain(h);

    if (rc < 0)
        return rc;
    if (!rl_can_reconnect(h))
        return rl_fail(h, REDLOCKD_E_INVALID, "this handle does not "
                       "reconnect (no server to go to, or "
                       "reconnect_max_ms < 0)");
    if (h->fd >= 0) {
        rl_fail(h, REDLOCKD_E_CLOSED, "reconnecting on request");
        rl_drop_rc(h, 0);
        h->err.code = 0;
    }
    return rl_recover(h, -1);
}

/* ---- LOCK, UNLOCK, EXTEND, PING ----------------------------------------- */

static int rl_lease_fill(struct redlockd *h, const struct proto_reply *r,
                         const char *resource, struct redlockd_lease *lease)
{
    const char *token = proto_reply_get(r, "token");
    const char *fence = proto_reply_get(r, "fence");
    const char *ttl_s = proto_reply_get(r, "ttl");
    const char *validity = proto_reply_get(r, "validity");
    uint32_t ttl = 0;

    if (!token || strlen(token) > REDLOCKD_TOKEN_LEN
        || proto_parse_u64(fence, rl_len(fence), &lease->fence) < 0
        || proto_parse_u32(ttl_s, rl_len(ttl_s), &ttl) < 0
        || proto_parse_i64(validity, rl_len(validity), &lease->validity) < 0)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCK");
    lease->ttl = ttl;
    strcpy(lease->token, token);
    strcpy(lease->resource, resource);
    return 0;
}

/* The caller may be waiting in here to stop its work at a deadline: never
 * wait for the answer past one (unless !watch: the confirmation of a new
 * lease, whose deadline may be about to pass), nor past the I/O timeout or
 * the caller's own timeout_ms (negative: none). */
static int rl_refresh(struct redlockd *h, int timeout_ms, bool watch)
{
    int64_t until = rl_earlier(rl_io_deadline(h, 0), rl_deadline(timeout_ms));

    return rl_locks_round(h, &h->req, until, watch, false);
}

static int rl_lock_reply(struct redlockd *h, const struct proto_reply *r,
                         const char *resource, int renew,
                         struct redlockd_lease *lease)
{
    struct redlockd_lease scratch;
    int rc;

    if (!lease)
        lease = &scratch;
    rc = rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_LOCK);
    if (rc == 0)
        rc = rl_lease_fill(h, r, resource, lease);
    if (rc == 0)
        rc = rl_lease_taken(h, lease, renew != 0);
    /* The deadline counts from when LOCK was sent, however long it waited
     * for the grant: if that used up half the validity, confirm the lease
     * again now rather than hand out a deadline about to pass. */
    if (rc == 0 && rl_now_ms() >= h->sent_ms + lease->validity / 2)
        rc = rl_refresh(h, -1, false);
    return rc;
}

/* The connection broke with a LOCK in flight: it may have been granted or
 * not. Taken as failed; a grant that did happen stays with the old
 * session, which the daemon ends (and releases) unless it is resumed, and
 * a resume releases it (rl_locks_round). The handle reconnects all the
 * same, for its other leases. */
static int rl_lock_broke(struct redlockd *h, enum proto_cmd cmd)
{
    char why[sizeof(h->err.msg)];

    snprintf(why, sizeof(why), "%s", h->err.msg);
    (void)rl_recover(h, -1);
    return rl_fail(h, REDLOCKD_E_IO, "the connection broke with %s in flight "
                   "(%.160s): its outcome is unknown, taken as failed",
                   proto_cmd_name(cmd), why);
}

int redlockd_lock(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                  uint32_t wait_ms, int renew, struct redlockd_lease *lease)
{
    struct proto_reply r;
    struct sbuf *b;
    int rc = rl_begin_on(h, resource);

    if (rc < 0)
        return rl_finish(h, rc);
    b = rl_req_on(h, PROTO_CMD_LOCK, resource);
    if (ttl_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_TTL, ttl_ms);
    if (wait_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_WAIT, wait_ms);
    proto_format_opt_u64(b, PROTO_OPT_RENEW, renew ? 1 : 0);
    proto_format_end(b);
    rc = rl_call(h, wait_ms, &r);
    if (rc == 0)
        rc = rl_lock_reply(h, &r, resource, renew, lease);
    else if (rl_transport_failed(h, rc) && rl_can_reconnect(h))
        rc = rl_lock_broke(h, PROTO_CMD_LOCK);
    return rl_finish(h, rc);
}

/* After an UNLOCK or EXTEND answered rc: LOST, and NOTHELD for a lease we
 * thought held, mean the daemon no longer holds it for us. */
static int rl_lease_refused(struct redlockd *h, const char *resource, int rc)
{
    if (rc == -REDLOCKD_E_LOST
        || (rc == -REDLOCKD_E_NOTHELD && rl_lease_find(h, resource))) {
        if (rl_lease_lose(h, resource, 0) < 0)
            return -REDLOCKD_E_NOMEM;
    }
    return rc;
}

/* ---- UNLOCK ------------------------------------------------------------- */

/* The leases being released: marked, so that one found gone while the
 * handle reconnects is not reported lost (its owner let it go). */
static void rl_mark_releasing(struct redlockd *h, const char *const *res,
                              size_t n, bool on)
{
    for (size_t i = 0; i < n; i++) {
        struct rl_lease *l = rl_lease_find(h, res[i]);

        if (l && (!on || !l->lost))
            l->releasing = on;
    }
}

/* Build "UNLOCK r1 r2..." in h->req of those of res[] that the (new)
 * session still holds; how many. */
static size_t rl_unlock_held(struct redlockd *h, const char *const *res,
                             size_t n)
{
    size_t k = 0;

    rl_req(&h->req, PROTO_CMD_UNLOCK);
    for (size_t i = 0; i < n; i++) {
        const struct rl_lease *l = rl_lease_find(h, res[i]);

        if (l && !l->lost) {
            proto_format_word(&h->req, res[i]);
            k++;
        }
    }
    proto_format_end(&h->req);
    return k;
}

/* The connection broke with an UNLOCK in flight, and the handle is back:
 * what the session still holds is released again; what is gone (it was
 * released before the break, or lost meanwhile) counts as released. A
 * lease already lost before the UNLOCK still answers LOST. */
static int rl_unlock_again(struct redlockd *h, const char *const *res,
                           size_t n)
{
    struct proto_reply r;
    int rc = 0;

    if (rl_unlock_held(h, res, n) > 0) {
        rc = rl_call(h, 0, &r);
        if (rc == 0)
            rc = rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_UNLOCK);
        if (rc == -REDLOCKD_E_NOTHELD)
            rc = 0;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct rl_lease *l = rl_lease_find(h, res[i]);

        if (l && l->lost && !l->releasing)
            rc = rl_fail(h, REDLOCKD_E_LOST, "the lease on %.200s was lost",
                         res[i]);
    }
    return rc;
}

/* UNLOCK res[] (its line in h->req): sent again on a new connection when
 * the first one broke under it. */
static int rl_unlock_call(struct redlockd *h, const char *const *res,
                          size_t n)
{
    struct proto_reply r;
    int rc;

    rl_mark_releasing(h, res, n, true);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_UNLOCK);
    else if (rl_transport_failed(h, rc) && rl_can_reconnect(h)) {
        rc = rl_recover(h, -1);
        if (rc == 0)
            rc = rl_unlock_again(h, res, n);
    }
    rl_mark_releasing(h, res, n, false);
    return rc;
}

int rl_unlock_line(struct redlockd *h, const char *resource)
{
    int rc = rl_begin_on(h, resource);

    if (rc == 0)
        rl_req_line(h, PROTO_CMD_UNLOCK, resource);
    return rc;
}

int rl_unlock_answered(struct redlockd *h, const char *resource, int rc)
{
    if (rc == 0)
        rl_lease_del(h, resource);
    else
        rc = rl_lease_refused(h, resource, rc);
    return rc;
}

int redlockd_unlock(struct redlockd *h, const char *resource)
{
    const char *one[] = { resource };
    int rc = rl_unlock_line(h, resource);

    if (rc < 0)
        return rl_finish(h, rc);
    rc = rl_unlock_call(h, one, 1);
    return rl_finish(h, rl_unlock_answered(h, resource, rc));
}

/* ---- EXTEND, PING ------------------------------------------------------- */

static int rl_extend_reply(struct redlockd *h, const struct proto_reply *r,
                           const char *resource, uint32_t ttl_ms,
                           int64_t *validity_ms)
{
    const char *validity = proto_reply_get(r, "validity");
    struct rl_lease *l = rl_lease_find(h, resource);
    int64_t v;

    if (rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_EXTEND) < 0)
        return -REDLOCKD_E_PROTO;
    if (proto_parse_i64(validity, rl_len(validity), &v) < 0)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to EXTEND");
    if (l && !l->lost) {
        if (ttl_ms > 0)
            l->ttl = ttl_ms;
        rl_lease_confirm(h, l, v);
    }
    if (validity_ms)
        *validity_ms = v;
    return 0;
}

/* An EXTEND that failed otherwise (UNAVAILABLE) may have set the shorter
 * ttl on some nodes: until a refresh says how long the lease now is, it is
 * confirmed only up to when the EXTEND went out. A longer ttl can only
 * have lengthened it, and a value alone (ttl_ms 0) leaves it as it was. */
static void rl_extend_failed(struct redlockd *h, const char *resource,
                             uint32_t ttl_ms)
{
    struct rl_lease *l = rl_lease_find(h, resource);

    if (l && !l->lost && ttl_ms > 0 && ttl_ms < l->ttl
        && h->sent_ms < l->deadline)
        l->deadline = h->sent_ms;
}

/* "EXTEND r ttl= value=": a ttl above 0, or a value, or both. */
int rl_extend_line(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                   const char *value)
{
    struct sbuf *b;
    int rc = rl_begin_plain(h);

    if (rc == 0 && ttl_ms == 0 && !value)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "EXTEND needs a ttl above 0");
    if (rc == 0 && value)
        rc = rl_check_value(h, value);
    if (rc == 0)
        rc = rl_begin_on(h, resource);
    if (rc < 0)
        return rc;
    b = rl_req_on(h, PROTO_CMD_EXTEND, resource);
    if (ttl_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_TTL, ttl_ms);
    if (value)
        proto_format_opt_str(b, PROTO_OPT_VALUE, value);
    proto_format_end(b);
    return 0;
}

int rl_extend_answered(struct redlockd *h, const struct proto_reply *r, int rc,
                       const char *resource, uint32_t ttl_ms,
                       int64_t *validity_ms)
{
    if (rc == 0)
        return rl_extend_reply(h, r, resource, ttl_ms, validity_ms);
    if (rc == -REDLOCKD_E_UNAVAILABLE) {
        rl_extend_failed(h, resource, ttl_ms);
        return rc;
    }
    return rl_lease_refused(h, resource, rc);
}

int redlockd_extend(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                    int64_t *validity_ms)
{
    struct proto_reply r;
    int rc = rl_extend_line(h, resource, ttl_ms, NULL);

    if (rc < 0)
        return rl_finish(h, rc);
    rc = rl_call_again(h, 0, &r);
    return rl_finish(h, rl_extend_answered(h, &r, rc, resource, ttl_ms,
                                           validity_ms));
}

/* Sent again after a broken connection as EXTEND is: the same value set
 * twice is set once. */
int redlockd_set_value(struct redlockd *h, const char *resource,
                       const char *value)
{
    struct proto_reply r;
    int rc = rl_begin_plain(h);

    if (rc == 0 && !value)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "value must not be NULL");
    if (rc == 0)
        rc = rl_extend_line(h, resource, 0, value);
    if (rc < 0)
        return rl_finish(h, rc);
    rc = rl_call_again(h, 0, &r);
    return rl_finish(h, rl_extend_answered(h, &r, rc, resource, 0, NULL));
}

int redlockd_ping(struct redlockd *h)
{
    int rc = rl_begin(h);

    if (rc < 0)
        return rl_finish(h, rc);
    return rl_finish(h, rl_call_expect(h, PROTO_CMD_PING, NULL,
                                       PROTO_REPLY_PONG));
}

/* ---- refreshing the deadlines ------------------------------------------- */

/*
 * The refresh waits no longer than the earliest deadline ahead when it
 * starts: a caller waiting here stops its work at that deadline, so a
 * connection that broke then is not reconnected within this call.
 */
int redlockd_refresh_within(struct redlockd *h, int timeout_ms)
{
    int64_t caller = rl_deadline(timeout_ms);
    int64_t bound = rl_earlier(caller, rl_lease_earliest(h));
    int rc = rl_begin_within(h, caller);

    if (rc < 0)
        return rl_finish(h, rc);
    rc = rl_refresh(h, timeout_ms, true);
    if (rl_transport_failed(h, rc) && rl_can_reconnect(h) && !rl_passed(bound))
        rc = rl_recover(h, caller);
    return rl_finish(h, rc);
}

int redlockd_refresh(struct redlockd *h)
{
    return redlockd_refresh_within(h, -1);
}

/* ---- inspection --------------------------------------------------------- */

static int rl_json_reply(struct redlockd *h, const struct proto_reply *r,
                         const char *what, char **json)
{
    if (r->kind != PROTO_REPLY_OK || r->text[0] != '{')
        return rl_fatal(h, REDLOCKD_E_PROTO, "%s did not answer with JSON",
                        what);
    *json = strdup(r->text);
    if (!*json)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return 0;
}

/* An inspection command whose request h->req holds. */
static int rl_inspect_req(struct redlockd *h, enum proto_cmd cmd, char **json)
{
    struct proto_reply r;
    int rc;

    rc = rl_call_again(h, 0, &r);
    if (rc == 0)
        rc = rl_json_reply(h, &r, proto_cmd_name(cmd), json);
    rc = rl_finish(h, rc);
    if (rc < 0) {
        free(*json);
        *json = NULL;
    }
    return rc;
}

/* An inspection command, with its resource (STATUS) or NULL. */
static int rl_inspect(struct redlockd *h, enum proto_cmd cmd, const char *arg,
                      char **json)
{
    rl_req_line(h, cmd, arg);
    return rl_inspect_req(h, cmd, json);
}

static int rl_inspect_begin(struct redlockd *h, char **json,
                            const char *resource)
{
    int rc = rl_begin_plain(h);

    if (rc == 0 && !json)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "json must not be NULL");
    if (rc == 0)
        *json = NULL;
    if (rc == 0 && resource)
        rc = rl_check_resource(h, resource);
    if (rc == 0)
        rc = rl_begin(h);
    return rc < 0 ? rl_finish(h, rc) : 0;
}

int redlockd_locks(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json, NULL);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_LOCKS, NULL, json);
}

int redlockd_sessions(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json, NULL);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_SESSIONS, NULL, json);
}

int redlockd_stats(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json, NULL);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_STATS, NULL, json);
}

int redlockd_status(struct redlockd *h, const char *resource, char **json)
{
    int rc = rl_inspect_begin(h, json, resource);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_STATUS, resource, json);
}

int redlockd_top(struct redlockd *h, uint32_t limit, char **json)
{
    int rc = rl_inspect_begin(h, json, NULL);
    struct sbuf *b;

    if (rc < 0)
        return rc;
    b = rl_req(&h->req, PROTO_CMD_TOP);
    if (limit)
        proto_format_opt_u64(b, PROTO_OPT_LIMIT, limit);
    proto_format_end(b);
    return rl_inspect_req(h, PROTO_CMD_TOP, json);
}

int redlockd_holder(struct redlockd *h, const char *resource,
                    struct redlockd_holder *holder)
{
    char *json = NULL;
    int rc = rl_begin_plain(h);

    if (rc == 0 && !holder)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "holder must not be NULL");
    if (rc < 0)
        return rl_finish(h, rc);
    rc = redlockd_status(h, resource, &json);
    if (rc == 0)
        rc = rl_holder_from_status(h, json, resource, holder);
    free(json);
    return rc;
}

/* ---- operators ---------------------------------------------------------- */

int redlockd_force_unlock(struct redlockd *h, const char *resource)
{
    struct proto_reply r;
    const char *nodes;
    uint32_t n;
    int rc = rl_begin_on(h, resource);

    if (rc < 0)
        return rl_finish(h, rc);
    rl_req_line(h, PROTO_CMD_FORCEUNLOCK, resource);
    rc = rl_call_again(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_FORCEUNLOCK);
    if (rc == 0) {
        nodes = proto_reply_get(&r, "nodes");
        if (proto_parse_u32(nodes, rl_len(nodes), &n) < 0 || n > INT32_MAX)
            rc = rl_fatal(h, REDLOCKD_E_PROTO,
                          "malformed reply to FORCEUNLOCK");
        else
            rc = (int)n;
    }
    return rl_finish(h, rc);
}

/* ---- lock kinds: shared, semaphores, several resources ------------------ */

/* The names, checked, and room in h->req for a line naming them all. */
static int rl_check_resources(struct redlockd *h, const char *const *res,
                              size_t n)
{
    size_t need = RL_REQ_MAX;

    if (!res || n == 0 || n > PROTO_MAX_RESOURCES)
        return rl_fail(h, REDLOCKD_E_INVALID, "1 to %d resources",
                       PROTO_MAX_RESOURCES);
    for (size_t i = 0; i < n; i++) {
        int rc = rl_check_resource(h, res[i]);
        if (rc < 0)
            return rc;
        need += strlen(res[i]) + 1;
    }
    sbuf_reset(&h->req);
    if (sbuf_try_reserve(&h->req, need) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return 0;
}

/* Begin a request naming several resources: "<CMD> r1 r2 ..." in *b. */
static int rl_req_names(struct redlockd *h, enum proto_cmd cmd,
                        const char *const *resources, size_t n,
                        struct sbuf **b)
{
    int rc = rl_begin_plain(h);

    if (rc == 0)
        rc = rl_check_resources(h, resources, n);
    if (rc == 0)
        rc = rl_begin(h);
    if (rc < 0)
        return rc;
    *b = rl_req(&h->req, cmd);
    for (size_t i = 0; i < n; i++)
        proto_format_word(*b, resources[i]);
    return 0;
}

/* The grant's kind from the LOCK reply, checked against the request. */
static int rl_grant_kind(struct redlockd *h, const struct proto_reply *r,
                         size_t n, struct redlockd_grant *g)
{
    const char *mode = proto_reply_get(r, "mode");
    const char *limit = proto_reply_get(r, "limit");
    const char *slot = proto_reply_get(r, "slot");
    const char *nres = proto_reply_get(r, "resources");
    uint32_t k = 1;

    g->mode = mode && strcmp(mode, "shared") == 0 ? REDLOCKD_SHARED
                                                  : REDLOCKD_EXCLUSIVE;
    g->limit = g->slot = 0;
    if ((limit && proto_parse_u32(limit, strlen(limit), &g->limit) < 0) ||
        (slot && proto_parse_u32(slot, strlen(slot), &g->slot) < 0) ||
        (nres && proto_parse_u32(nres, strlen(nres), &k) < 0) ||
        k != n)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCK");
    g->nresources = k;
    return 0;
}

/* "LOCK r1 r2... opts" in h->req, after the start of a call: 0 or -code. */
int rl_lock_line(struct redlockd *h, const char *const *resources, size_t n,
                 const struct redlockd_lock_opts *o)
{
    struct sbuf *b;
    int rc = rl_begin_plain(h);

    if (rc == 0 && o->value)
        rc = rl_check_value(h, o->value);
    if (rc == 0)
        rc = rl_req_names(h, PROTO_CMD_LOCK, resources, n, &b);

    if (rc < 0)
        return rc;
    if (o->ttl_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_TTL, o->ttl_ms);
    if (o->wait_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_WAIT, o->wait_ms);
    if (o->no_renew)
        proto_format_opt_u64(b, PROTO_OPT_RENEW, 0);
    if (o->mode == REDLOCKD_SHARED)
        proto_format_opt_str(b, PROTO_OPT_MODE, "shared");
    if (o->limit > 0)
        proto_format_opt_u64(b, PROTO_OPT_LIMIT, o->limit);
    if (o->value)
        proto_format_opt_str(b, PROTO_OPT_VALUE, o->value);
    proto_format_end(b);
    return 0;
}

int rl_lock_granted(struct redlockd *h, const struct proto_reply *r,
                    const char *const *resources, size_t n, bool renew,
                    struct redlockd_grant *g)
{
    int rc = rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_LOCK);

    if (rc == 0)
        rc = rl_lease_fill(h, r, resources[0], &g->lease);
    if (rc == 0)
        rc = rl_grant_kind(h, r, n, g);
    /* Each resource is a lease of its own, with the deadline rule. */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct redlockd_lease one = g->lease;
        snprintf(one.resource, sizeof(one.resource), "%s", resources[i]);
        rc = rl_lease_taken(h, &one, renew);
    }
    return rc;
}

int redlockd_lockv(struct redlockd *h, const char *const *resources, size_t n,
                   const struct redlockd_lock_opts *opts,
                   struct redlockd_grant *grant)
{
    static const struct redlockd_lock_opts defaults;
    const struct redlockd_lock_opts *o = opts ? opts : &defaults;
    struct redlockd_grant scratch;
    struct proto_reply r;
    int rc;

    rc = rl_lock_line(h, resources, n, o);
    if (rc < 0)
        return rl_finish(h, rc);
    rc = rl_call(h, o->wait_ms, &r);
    if (rl_transport_failed(h, rc) && rl_can_reconnect(h))
        return rl_finish(h, rl_lock_broke(h, PROTO_CMD_LOCK));
    if (rc == 0)
        rc = rl_lock_granted(h, &r, resources, n, !o->no_renew,
                             grant ? grant : &scratch);
    return rl_finish(h, rc);
}

int redlockd_unlockv(struct redlockd *h, const char *const *resources,
                     size_t n)
{
    struct sbuf *b;
    int rc;

    rc = rl_req_names(h, PROTO_CMD_UNLOCK, resources, n, &b);
    if (rc < 0)
        return rl_finish(h, rc);
    proto_format_end(b);
    rc = rl_unlock_call(h, resources, n);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            rl_lease_del(h, resources[i]);
        else if (rc == -REDLOCKD_E_LOST
                 && rl_lease_lose(h, resources[i], 0) < 0)
            rc = -REDLOCKD_E_NOMEM;
    }
    return rl_finish(h, rc);
}

/* ---- watching ----------------------------------------------------------- */

/* WATCH or UNWATCH (cmd) of res[]; sent again after a broken connection
 * (watching twice is watching once). How many the session watches now. */
static int rl_watch_call(struct redlockd *h, enum proto_cmd cmd,
                         const char *const *resources, size_t n)
{
    struct proto_reply r;
    const char *count;
    struct sbuf *b;
    uint32_t k = 0;
    int rc = rl_req_names(h, cmd, resources, n, &b);

    if (rc < 0)
        return rl_finish(h, rc);
    proto_format_end(b);
    rc = rl_call_again(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, PROTO_REPLY_OK, cmd);
    if (rc == 0) {
        count = proto_reply_get(&r, "watching");
        if (proto_parse_u32(count, rl_len(count), &k) < 0 || k > INT32_MAX)
            rc = rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to %s",
                          proto_cmd_name(cmd));
    }
    if (rc == 0)
        rc = rl_watch_noted(h, cmd, resources, n, h->req.len);
    return rl_finish(h, rc < 0 ? rc : (int)k);
}

int redlockd_watch(struct redlockd *h, const char *const *resources, size_t n)
{
    return rl_watch_call(h, PROTO_CMD_WATCH, resources, n);
}

int redlockd_unwatch(struct redlockd *h, const char *const *resources,
                     size_t n)
{
    return rl_watch_call(h, PROTO_CMD_UNWATCH, resources, n);
}
