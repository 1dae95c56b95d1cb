/*
 * session, the lock commands (session_priv.h): LOCK, ADOPT, UNLOCK and
 * EXTEND, checked against the session and the config and handed to
 * lockmgr, and lockmgr's answers to them worded for the client (a grant,
 * OK, or a refusal through wording.h). How long each LOCK (and ADOPT)
 * took to answer goes to the sessions' observer (stats_glue.c's
 * histograms).
 *
 * A command that lockmgr will answer makes its record running
 * (session_serve_later) and hands it to lockmgr as the `ask`; the answer
 * comes back to session_cmd.c's owner callbacks, which word it here and
 * then finish the record.
 */
#include "session_priv.h"

#include <string.h>

#include <uv.h>

#include "conf.h"
#include "conn.h"
#include "mem.h"

/* Who times the answers to LOCK and ADOPT (session.h). */
static const struct session_observer *observer;

void session_set_observer(const struct session_observer *ob)
{
    observer = ob;
}

/* ---- the commands -------------------------------------------------------- */

static bool check_ttl(struct session_serve *v, uint32_t ttl)
{
    const struct conf *cf = sessions.conf;

    if (ttl < cf->locks.min_ttl_ms || ttl > cf->locks.max_ttl_ms) {
        session_say_errf(&v->t, PROTO_ERR_ARG,
                         "ttl must be between %u and %u ms",
                         cf->locks.min_ttl_ms, cf->locks.max_ttl_ms);
        return false;
    }
    return true;
}

/* The request's resources against this session: ERR HELD for one it
 * holds already. Forgets a lost lease of each (a new LOCK starts over). */
static bool lock_names_free(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;

    for (size_t i = 0; i < r->nargs; i++) {
        if (lockmgr_held(&s->owner, r->args[i], r->args_len[i])) {
            session_say_errf(&v->t, PROTO_ERR_HELD, "this session already "
                             "holds %.*s", (int)r->args_len[i], r->args[i]);
            return false;
        }
    }
    for (size_t i = 0; i < r->nargs; i++)
        session_take_lost(s, r->args[i], r->args_len[i]);
    return true;
}

/* mode=, limit= and several resources: which go together. */
static bool lock_kind_ok(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    const struct conf *cf = sessions.conf;

    if (r->nargs > cf->locks.max_multi) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "at most %u resources in one "
                         "LOCK (locks.max_multi)", cf->locks.max_multi);
        return false;
    }
    if (r->limit > cf->locks.max_limit) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "limit must be between 1 and "
                         "%u (locks.max_limit)", cf->locks.max_limit);
        return false;
    }
    if (r->nargs > 1 && r->mode == PROTO_MODE_SHARED) {
        session_say_err(&v->t, PROTO_ERR_ARG, "several resources are locked "
                        "in exclusive mode only");
        return false;
    }
    if (r->nargs > 1 && r->limit) {
        session_say_err(&v->t, PROTO_ERR_ARG, "limit= takes one resource");
        return false;
    }
    if (r->limit && r->mode == PROTO_MODE_SHARED) {
        session_say_err(&v->t, PROTO_ERR_ARG, "limit= and mode=shared do not "
                        "go together: each slot is an exclusive lock");
        return false;
    }
    return true;
}

void session_cmd_lock(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const struct conf *cf = sessions.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl
                                            : cf->locks.default_ttl_ms;
    /* Nobody is left to wait for the answer after EOF. */
    uint32_t wait = (r->has & PROTO_OPT_WAIT) && !s->conn->eof ? r->wait : 0;

    if (!session_may(v, r->cmd, r->args, r->args_len, r->nargs))
        return;
    if (sessions.shutdown) {
        session_say_err(&v->t, PROTO_ERR_SHUTDOWN,
                        "the daemon is shutting down");
        return;
    }
    if (!check_ttl(v, ttl) || !lock_kind_ok(v))
        return;
    if (wait > cf->locks.max_wait_ms) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "wait must be at most %u ms",
                         cf->locks.max_wait_ms);
        return;
    }
    if (!lock_names_free(v))
        return;
    if (s->owner.nleases + r->nargs > cf->limits.max_locks_per_session) {
        session_say_errf(&v->t, PROTO_ERR_LIMIT, "this session holds %zu "
                         "locks (limits.max_locks_per_session)",
                         s->owner.nleases);
        return;
    }
    struct lockmgr_req lr = {
        .n = r->nargs, .res = r->args, .len = r->args_len,
        .mode = r->mode == PROTO_MODE_SHARED ? LOCKMGR_SHARED
                                             : LOCKMGR_EXCLUSIVE,
        .limit = r->limit, .ttl = ttl, .wait = wait, .renew = r->renew,
        .value = r->value,
    };
    struct sreq *q = session_serve_later(v);
    q->waited = wait > 0;
    lockmgr_lock_req(&s->owner, &lr, q);
}

/* ADOPT: take over an exclusive lease by its token (a client whose daemon
 * died or restarted). Answered as a LOCK is (session_answer_locked). */
void session_cmd_adopt(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const struct conf *cf = sessions.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl
                                            : cf->locks.default_ttl_ms;

    if (!session_may(v, r->cmd, r->args, r->args_len, r->nargs))
        return;
    if (sessions.shutdown) {
        session_say_err(&v->t, PROTO_ERR_SHUTDOWN,
                        "the daemon is shutting down");
        return;
    }
    if (!check_ttl(v, ttl))
        return;
    if (r->nargs > cf->locks.max_multi) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "at most %u resources in one "
                         "ADOPT (locks.max_multi)", cf->locks.max_multi);
        return;
    }
    if (!lock_names_free(v))
        return;
    struct lockmgr_adopt_req ar = {
        .n = r->nargs, .res = r->args, .len = r->args_len, .token = r->token,
        .ttl = ttl, .renew = r->renew,
    };
    lockmgr_adopt(&s->owner, &ar, session_serve_later(v));
}

/* The lease for an UNLOCK/EXTEND of res, or NULL after answering
 * NOTHELD/LOST (forgetting the lost lease: the client has heard). */
static struct lease *held_or_reply(struct session_serve *v, const char *res,
                                   size_t len)
{
    struct session *s = v->t.s;
    struct lease *l = lockmgr_held(&s->owner, res, len);

    if (l)
        return l;
    if (session_take_lost(s, res, len))
        session_say_errf(&v->t, PROTO_ERR_LOST, "the lease on %.*s was lost",
                         (int)len, res);
    else
        session_say_errf(&v->t, PROTO_ERR_NOTHELD, "this session does not "
                         "hold %.*s", (int)len, res);
    return NULL;
}

/*
 * UNLOCK r1 r2 ...: every name must be held or lost (else NOTHELD, and
 * nothing is released); the held ones are released at once; a lost one
 * makes the answer LOST once they are.
 */
void session_cmd_unlock(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    struct lease *ls[PROTO_MAX_RESOURCES];
    long lost = -1;
    size_t n = 0;

    if (r->nargs == 1) {
        struct lease *l = held_or_reply(v, r->arg, r->arg_len);
        if (l)
            lockmgr_unlock(&s->owner, l, session_serve_later(v));
        return;
    }
    for (size_t i = 0; i < r->nargs; i++) {
        struct lease *l = lockmgr_held(&s->owner, r->args[i], r->args_len[i]);
        if (l) {
            ls[n++] = l;
        } else if (session_was_lost(s, r->args[i], r->args_len[i])) {
            if (lost < 0)
                lost = (long)i;
        } else {
            session_say_errf(&v->t, PROTO_ERR_NOTHELD, "this session does not "
                             "hold %.*s (nothing was released)",
                             (int)r->args_len[i], r->args[i]);
            return;
        }
    }
    if (lost >= 0) {
        for (size_t i = 0; i < r->nargs; i++)
            session_take_lost(s, r->args[i], r->args_len[i]);
        if (!n) {
            session_say_errf(&v->t, PROTO_ERR_LOST,
                             "the lease on %.*s was lost",
                             (int)r->args_len[lost], r->args[lost]);
            return;
        }
    }
    struct sreq *q = session_serve_later(v);
    if (lost >= 0) {
        /* Released first; the answer then says LOST for this one. */
        q->unlock_lost = mem_alloc(r->args_len[lost] + 1);
        memcpy(q->unlock_lost, r->args[lost], r->args_len[lost]);
    }
    lockmgr_unlock_many(&s->owner, ls, n, q);
}

/* EXTEND ttl= and/or value= (a value names an exclusive holder). */
void session_cmd_extend(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct lease *l;
    enum lockmgr_mode mode;
    uint32_t limit;

    if ((r->has & PROTO_OPT_TTL) && !check_ttl(v, r->ttl))
        return;
    if (!(l = held_or_reply(v, r->arg, r->arg_len)))
        return;
    if (!r->value) {
        lockmgr_extend(&v->t.s->owner, l, r->ttl, session_serve_later(v));
        return;
    }
    lockmgr_lease_kind(l, &mode, &limit);
    if (mode != LOCKMGR_EXCLUSIVE || limit) {
        session_say_err(&v->t, PROTO_ERR_ARG, "value= is for exclusive locks "
                        "(not a shared hold or a semaphore slot)");
        return;
    }
    lockmgr_extend_value(&v->t.s->owner, l, r->ttl, r->value,
                         session_serve_later(v));
}

/* ---- lockmgr's answers --------------------------------------------------- */

void session_answer_locked(const struct sreq *q, const struct lockmgr_grant *g,
                           const struct lockmgr_refusal *no)
{
    const struct session_to t = session_req_to(q);
    struct sbuf *b;

    if (observer)
        observer->lock_answered(q->waited,
                                (double)(uv_hrtime() - q->started_ns) / 1e9);
    if (!g) {
        session_say_refusal(&t, q->cmd, no);
    } else if ((b = session_say(&t))) {
        const struct proto_grant pg = {
            .resource = g->resource, .nresources = g->nresources,
            .token = g->token, .fence = g->fence, .ttl = g->ttl,
            .validity = g->validity, .shared = g->mode == LOCKMGR_SHARED,
            .limit = g->limit, .slot = g->slot,
        };
        proto_format_grant(b, &pg);
    }
}

void session_answer_unlocked(const struct sreq *q, const char *resource,
                             size_t nres, int nodes,
                             const struct lockmgr_refusal *no)
{
    const struct session_to t = session_req_to(q);
    struct sbuf *b;

    if (q->unlock_lost) {
        session_say_errf(&t, PROTO_ERR_LOST, "the lease on %s was lost; the "
                         "others are released", q->unlock_lost);
    } else if (no) {
        struct lockmgr_refusal gone = *no;
        gone.resource = resource;
        gone.count = nres;
        session_say_refusal(&t, PROTO_CMD_UNLOCK, &gone);
    } else if ((b = session_say(&t))) {
        proto_format_ok_begin(b);
        if (nres > 1)
            proto_format_kv_u64(b, "resources", nres);
        else
            proto_format_kv_str(b, "resource", resource);
        proto_format_kv_u64(b, "nodes", (uint64_t)nodes);
        proto_format_end(b);
    }
}

void session_answer_extended(const struct sreq *q, const char *resource,
                             uint32_t ttl, int64_t validity,
                             const struct lockmgr_refusal *no)
{
    const struct session_to t = session_req_to(q);
    struct sbuf *b;

    if (no) {
        session_say_refusal(&t, PROTO_CMD_EXTEND, no);
    } else if ((b = session_say(&t))) {
        proto_format_ok_begin(b);
        proto_format_kv_str(b, "resource", resource);
        proto_format_kv_u64(b, "ttl", ttl);
        proto_format_kv_i64(b, "validity", validity);
        proto_format_end(b);
    }
}
