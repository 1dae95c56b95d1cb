/*
 * session: the protocol half of a client connection (see session.h).
 *
 * Requests are served strictly in order: a request starts only after the
 * one before it was answered, so a pipelined UNLOCK after LOCK always sees
 * the lock. A request that needs Redis marks the session busy; its answer
 * arrives through one of the lockmgr owner callbacks at the end of this
 * file, which replies (through conn's reply calls) and resumes the queue.
 */
#include "session.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf.h"
#include "conn.h"
#include "log.h"
#include "mem.h"
#include "node.h"
#include "stats.h"

/* A lease lost while its session was detached: told when it resumes. */
struct detached_lost {
    struct list link;
    uint64_t fence;
    enum lockmgr_lost_reason why;
    char resource[];
};

/*
 * A session whose connection ended without QUIT after it asked for HELLO
 * detach=: its leases, still renewed by lockmgr, wait here for a HELLO
 * resume= with its id and secret, at most detach_ms. Its lockmgr owner is
 * its own; lockmgr_owner_move hands the leases over in both directions.
 */
struct detached {
    struct list link;               /* in S.detached */
    struct lockmgr_owner owner;
    char idstr[SESSION_ID_LEN];
    char name[PROTO_MAX_NAME_LEN + 1];
    char peer[80];
    char secret[PROTO_SECRET_LEN + 1];
    uint32_t detach_ms;
    bool authed, admin;
    struct timer timer;             /* detach_ms runs out */
    struct list lost;               /* struct detached_lost, oldest first */
    size_t nlost;
    int refs;                       /* S.detached's, and lockmgr notices' */
};

static struct {
    const struct conf *conf;    /* read live: a reload changes it in place */
    struct proto_limits limits;
    struct list live;           /* sessions not closing */
    size_t count;
    struct list detached;       /* struct detached */
    size_t ndetached;
    size_t abandoned;           /* leases of detached sessions left at
                                   shutdown */
    uint64_t abandoned_until;
    uint64_t next_id;
    char epoch[16];             /* the start time in session ids */
    bool shutdown;
} S = { .live = LIST_INIT(S.live), .detached = LIST_INIT(S.detached) };

void session_init(const struct conf *conf)
{
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    struct timespec ts;
    char tmp[16];
    int n = 0;

    S.conf = conf;
    S.limits.max_resource_len = conf->locks.max_resource_len;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    do {
        tmp[n++] = digits[ms % 36];
        ms /= 36;
    } while (ms && n < (int)sizeof(tmp) - 1);
    for (int i = 0; i < n; i++)
        S.epoch[i] = tmp[n - 1 - i];
    S.epoch[n] = '\0';
}

static void session_auth_cb(struct timer *t);
static void session_stop(struct session *s, const char *why, bool died);

static const struct lockmgr_owner_ops session_owner_ops;

static void session_idle_cb(struct timer *t);
static void session_arm_idle(struct session *s);

struct session *session_create(void)
{
    struct session *s = mem_alloc(sizeof(*s));

    s->id = ++S.next_id;
    snprintf(s->idstr, sizeof(s->idstr), "s%" PRIu64 ".%s", s->id, S.epoch);
    sbuf_init(&s->out);
    sbuf_init(&s->wbuf);
    list_init(&s->queue);
    list_init(&s->lost);
    lockmgr_owner_init(&s->owner, &session_owner_ops, s->idstr, s->name,
                       s->peer);
    timer_init(&s->auth_timer, session_auth_cb, s);
    s->refs = 1;                /* the handle's; dropped by its close cb */
    s->created_at = s->last_line_at = timer_now();
    timer_init(&s->idle_timer, session_idle_cb, s);
    session_arm_idle(s);        /* handshake_timeout_ms */
    list_push_head(&S.live, &s->link);
    S.count++;
    return s;
}

static void session_unlist(struct session *s)
{
    if (!list_linked(&s->link))
        return;
    list_remove(&s->link);
    S.count--;
}

static void queue_free(struct session *s)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &s->queue) {
        list_remove(p);
        free(list_entry(p, struct line, link));
    }
    s->qlen = 0;
}

bool session_has_queued(const struct session *s)
{
    return !list_empty(&s->queue);
}

static void session_free(struct session *s)
{
    struct list *p, *tmp;

    queue_free(s);
    free(s->cur);
    list_foreach_safe(p, tmp, &s->lost) {
        list_remove(p);
        free(list_entry(p, struct lost_lease, link));
    }
    free(s->rbuf);
    free(s->unlock_lost);
    sbuf_deinit(&s->out);
    sbuf_deinit(&s->wbuf);
    free(s);
}

void session_ref(struct session *s)
{
    s->refs++;
}

void session_unref(struct session *s)
{
    if (--s->refs == 0)
        session_free(s);
}

size_t session_count(void)
{
    return S.count;
}

size_t session_detached_count(void)
{
    return S.ndetached;
}

size_t session_count_ip(const char *ip)
{
    struct list *p;
    size_t n = 0;

    list_foreach(p, &S.live) {
        const struct session *x = container_of(p, struct session, link);
        n += strcmp(x->ip, ip) == 0;
    }
    return n;
}

/* ---- idle / handshake / keepalive -------------------------------------- */

/* Why a quiet connection is closed: the EVENT CLOSING reason and the log's
 * words. */
struct idle_rule {
    const char *reason;
    const char *why;
};

static const struct idle_rule idle_handshake = {
    "handshake", "no request within limits.handshake_timeout_ms" };
static const struct idle_rule idle_idle = {
    "idle", "idle for limits.idle_timeout_ms" };
static const struct idle_rule idle_keepalive = {
    "keepalive", "no line within the session's keepalive" };

/* How long s may stay quiet, and which rule says so (0: forever). */
static uint64_t session_idle_limit(const struct session *s,
                                   const struct idle_rule **rule)
{
    const struct conf *c = S.conf;
    uint64_t limit = 0;

    if (!s->got_line) {
        *rule = &idle_handshake;
        return c->limits.handshake_timeout_ms;
    }
    if (c->limits.idle_timeout_ms) {
        limit = c->limits.idle_timeout_ms;
        *rule = &idle_idle;
    }
    if (s->keepalive_ms && (!limit || s->keepalive_ms < limit)) {
        limit = s->keepalive_ms;
        *rule = &idle_keepalive;
    }
    return limit;
}

static void session_arm_idle(struct session *s)
{
    const struct idle_rule *rule = NULL;
    uint64_t limit = session_idle_limit(s, &rule);

    if (!limit || s->closing)
        timer_stop(&s->idle_timer);
    else
        timer_start_at(&s->idle_timer, s->last_line_at + limit);
}

static void session_idle_cb(struct timer *t)
{
    struct session *s = t->data;
    const struct idle_rule *rule = NULL;
    uint64_t limit = session_idle_limit(s, &rule);

    if (!limit || s->closing)
        return;
    /* Lines reset last_line_at without touching the timer; check again. */
    if (timer_now() < s->last_line_at + limit) {
        timer_start_at(&s->idle_timer, s->last_line_at + limit);
        return;
    }
    log_info("%s (%s): %s, closing", s->idstr, s->peer, rule->why);
    conn_close_now_announced(s, rule->reason, rule->why);
}

/* ---- request queue ----------------------------------------------------- */

void session_push_line(struct session *s, const char *data, size_t len,
                       bool toolong)
{
    struct line *ln = mem_alloc(sizeof(*ln) + len + 1);

    ln->toolong = toolong;
    ln->len = len;
    if (len)
        memcpy(ln->data, data, len);
    ln->data[len] = '\0';
    list_push_tail(&s->queue, &ln->link);
    s->qlen++;

    s->last_line_at = timer_now();
    if (!s->got_line) {
        s->got_line = true;
        session_arm_idle(s);
    }
}

static struct line *queue_pop(struct session *s)
{
    struct list *p = list_first(&s->queue);

    if (!p)
        return NULL;
    list_remove(p);
    s->qlen--;
    return list_entry(p, struct line, link);
}

static void request_done(struct session *s)
{
    s->busy = false;
    free(s->cur);
    s->cur = NULL;
    session_process(s);
}

/* ---- commands ---------------------------------------------------------- */

static bool cmd_needs_auth(enum proto_cmd cmd)
{
    switch (cmd) {
    case PROTO_CMD_PING:
    case PROTO_CMD_HELLO:
    case PROTO_CMD_AUTH:
    case PROTO_CMD_HELP:
    case PROTO_CMD_QUIT:
        return false;
    default:
        return true;
    }
}

static size_t session_resume(struct session *s, const struct proto_request *r);
static void session_tell_resume_lost(struct session *s);
static void session_note_lost(struct session *s, const char *resource);
static json_t *detached_json(const struct detached *d);

/* HELLO detach=: 0 turns it off; above 0 the session gets a secret (kept
 * if it had one). False when refused (answered). */
static bool hello_detach(struct session *s, uint32_t ms)
{
    unsigned max = S.conf->limits.max_detach_ms;

    if (ms == 0) {
        s->detach_ms = 0;
        s->secret[0] = '\0';
        return true;
    }
    if (max == 0) {
        conn_err(s, PROTO_ERR_ARG, "detach is off on this daemon "
                 "(limits.max_detach_ms is 0)");
        return false;
    }
    if (ms > max) {
        conn_errf(s, PROTO_ERR_ARG, "detach must be at most %u ms "
                  "(limits.max_detach_ms)", max);
        return false;
    }
    if (!s->secret[0] && redlock_token(s->secret) != 0) {
        s->secret[0] = '\0';
        conn_err(s, PROTO_ERR_UNAVAILABLE, "the system's random source "
                 "failed; no secret to resume with");
        return false;
    }
    s->detach_ms = ms;
    return true;
}

static void cmd_hello(struct session *s, const struct proto_request *r)
{
    bool resume = r->has & PROTO_OPT_RESUME;
    size_t resumed = 0;

    if ((r->has & PROTO_OPT_DETACH) && !hello_detach(s, r->detach))
        return;
    if (resume && (resumed = session_resume(s, r)) == (size_t)-1)
        return;
    if (r->has & PROTO_OPT_NAME)
        snprintf(s->name, sizeof(s->name), "%.*s", (int)r->name_len, r->name);
    if (r->has & PROTO_OPT_KEEPALIVE) {
        s->keepalive_ms = r->keepalive;
        session_arm_idle(s);
    }
    conn_ok_begin(s);
    conn_kv_u64(s, "proto", PROTO_VERSION);
    conn_kv_str(s, "session", s->idstr);
    conn_kv_str(s, "server", "redlockd/" REDLOCKD_VERSION);
    conn_kv_u64(s, "nodes", (uint64_t)redlock_nnodes());
    conn_kv_u64(s, "quorum", (uint64_t)redlock_nquorum());
    if (s->detach_ms && (r->has & PROTO_OPT_DETACH))
        conn_kv_str(s, "secret", s->secret);
    if (resume)
        conn_kv_u64(s, "resumed", resumed);
    conn_end(s);
    session_tell_resume_lost(s);
    if (s->name[0])
        log_debug("%s is %s", s->idstr, s->name);
}

/* Compare without an early exit so timing does not reveal a prefix. */
static bool secret_equal(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned char diff = alen != blen;
    for (size_t i = 0; i < alen; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (blen ? blen : 1)]);
    return diff == 0;
}

/* A wrong AUTH is answered after a delay that grows with each failure
 * (100 ms per failure so far, at most 2 s): guessing gets slow. */
static void session_auth_cb(struct timer *t)
{
    struct session *s = t->data;

    if (s->closing)
        return;
    conn_err(s, PROTO_ERR_AUTH, "invalid password");
    request_done(s);
}

static void auth_failed(struct session *s)
{
    unsigned max = S.conf->limits.max_auth_failures;
    uint64_t delay = 100 * (uint64_t)s->auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): wrong password (%u of limits.max_auth_failures=%u)",
               s->idstr, s->peer, s->auth_failures, max);
    if (s->auth_failures >= max) {
        conn_err(s, PROTO_ERR_AUTH, "invalid password; too many failures, "
                 "closing (limits.max_auth_failures)");
        session_stop(s, "too many wrong passwords", true);
        conn_close_announced(s, "auth", "too many wrong passwords");
        return;
    }
    s->busy = true;
    timer_start(&s->auth_timer, delay < 2000 ? delay : 2000);
}

static void cmd_auth(struct session *s, const struct proto_request *r)
{
    const char *pw = S.conf->auth.password;
    const char *admin = S.conf->auth.admin_password;

    if (!pw && !admin) {
        conn_err(s, PROTO_ERR_AUTH, "no password is configured");
        return;
    }
    if (admin && secret_equal(r->arg, r->arg_len, admin)) {
        s->authed = s->admin = true;
        log_notice("%s (%s): authenticated as an operator (admin password)",
                   s->idstr, s->peer);
        conn_ok(s);
    } else if (pw && secret_equal(r->arg, r->arg_len, pw)) {
        s->authed = true;
        conn_ok(s);
    } else {
        auth_failed(s);
    }
}

/* Forget that the lease on res was lost; true if it was. */
static bool session_take_lost(struct session *s, const char *res, size_t len)
{
    struct list *p;

    list_foreach(p, &s->lost) {
        struct lost_lease *x = list_entry(p, struct lost_lease, link);
        if (strlen(x->resource) == len && memcmp(x->resource, res, len) == 0) {
            list_remove(p);
            free(x);
            s->nlost--;
            return true;
        }
    }
    return false;
}

static bool check_ttl(struct session *s, uint32_t ttl)
{
    const struct conf *c = S.conf;
    if (ttl < c->locks.min_ttl_ms || ttl > c->locks.max_ttl_ms) {
        conn_errf(s, PROTO_ERR_ARG, "ttl must be between %u and %u ms",
                  c->locks.min_ttl_ms, c->locks.max_ttl_ms);
        return false;
    }
    return true;
}

/* The request's resources against this session: ERR HELD for one it
 * holds already. Forgets a lost lease of each (a new LOCK starts over). */
static bool lock_names_free(struct session *s, const struct proto_request *r)
{
    for (size_t i = 0; i < r->nargs; i++) {
        if (lockmgr_held(&s->owner, r->args[i], r->args_len[i])) {
            conn_errf(s, PROTO_ERR_HELD, "this session already holds %.*s",
                      (int)r->args_len[i], r->args[i]);
            return false;
        }
    }
    for (size_t i = 0; i < r->nargs; i++)
        session_take_lost(s, r->args[i], r->args_len[i]);
    return true;
}

/* mode=, limit= and several resources: which go together. */
static bool lock_kind_ok(struct session *s, const struct proto_request *r)
{
    const struct conf *c = S.conf;

    if (r->nargs > c->locks.max_multi) {
        conn_errf(s, PROTO_ERR_ARG, "at most %u resources in one LOCK "
                  "(locks.max_multi)", c->locks.max_multi);
        return false;
    }
    if (r->limit > c->locks.max_limit) {
        conn_errf(s, PROTO_ERR_ARG, "limit must be between 1 and %u "
                  "(locks.max_limit)", c->locks.max_limit);
        return false;
    }
    if (r->nargs > 1 && r->mode == PROTO_MODE_SHARED) {
        conn_err(s, PROTO_ERR_ARG, "several resources are locked in "
                 "exclusive mode only");
        return false;
    }
    if (r->nargs > 1 && r->limit) {
        conn_err(s, PROTO_ERR_ARG, "limit= takes one resource");
        return false;
    }
    if (r->limit && r->mode == PROTO_MODE_SHARED) {
        conn_err(s, PROTO_ERR_ARG, "limit= and mode=shared do not go "
                 "together: each slot is an exclusive lock");
        return false;
    }
    return true;
}

static void cmd_lock(struct session *s, const struct proto_request *r)
{
    const struct conf *c = S.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl : c->locks.default_ttl_ms;
    /* Nobody is left to wait for the answer after EOF. */
    uint32_t wait = (r->has & PROTO_OPT_WAIT) && !s->eof ? r->wait : 0;

    if (S.shutdown) {
        conn_err(s, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(s, ttl) || !lock_kind_ok(s, r))
        return;
    if (wait > c->locks.max_wait_ms) {
        conn_errf(s, PROTO_ERR_ARG, "wait must be at most %u ms",
                  c->locks.max_wait_ms);
        return;
    }
    if (!lock_names_free(s, r))
        return;
    if (s->owner.nleases + r->nargs > c->limits.max_locks_per_session) {
        conn_errf(s, PROTO_ERR_LIMIT, "this session holds %zu locks "
                  "(limits.max_locks_per_session)", s->owner.nleases);
        return;
    }
    struct lockmgr_req lr = {
        .n = r->nargs, .res = r->args, .len = r->args_len,
        .mode = r->mode == PROTO_MODE_SHARED ? LOCKMGR_SHARED
                                             : LOCKMGR_EXCLUSIVE,
        .limit = r->limit, .ttl = ttl, .wait = wait, .renew = r->renew,
    };
    s->busy = true;
    s->lock_started_ns = uv_hrtime();
    s->lock_waited = wait > 0;
    lockmgr_lock_req(&s->owner, &lr);
}

/* ADOPT: take over an exclusive lease by its token (a client whose daemon
 * died or restarted). Answered as a LOCK is (owner_locked). */
static void cmd_adopt(struct session *s, const struct proto_request *r)
{
    const struct conf *c = S.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl : c->locks.default_ttl_ms;

    if (S.shutdown) {
        conn_err(s, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(s, ttl))
        return;
    if (r->nargs > c->locks.max_multi) {
        conn_errf(s, PROTO_ERR_ARG, "at most %u resources in one ADOPT "
                  "(locks.max_multi)", c->locks.max_multi);
        return;
    }
    if (!lock_names_free(s, r))
        return;
    struct lockmgr_adopt_req ar = {
        .n = r->nargs, .res = r->args, .len = r->args_len, .token = r->token,
        .ttl = ttl, .renew = r->renew,
    };
    s->busy = true;
    s->lock_started_ns = uv_hrtime();
    s->lock_waited = false;
    lockmgr_adopt(&s->owner, &ar);
}

/* The lease for an UNLOCK/EXTEND of res, or NULL after answering
 * NOTHELD/LOST (forgetting the lost lease: the client has heard). */
static struct lease *held_or_reply_name(struct session *s, const char *res,
                                        size_t len)
{
    struct lease *l = lockmgr_held(&s->owner, res, len);
    if (l)
        return l;
    if (session_take_lost(s, res, len))
        conn_errf(s, PROTO_ERR_LOST, "the lease on %.*s was lost",
                  (int)len, res);
    else
        conn_errf(s, PROTO_ERR_NOTHELD, "this session does not hold %.*s",
                  (int)len, res);
    return NULL;
}

static struct lease *held_or_reply(struct session *s,
                                   const struct proto_request *r)
{
    return held_or_reply_name(s, r->arg, r->arg_len);
}

/* A lost lease of this session among names; the first, or -1. */
static long lost_among(struct session *s, const struct proto_request *r)
{
    struct list *p;

    for (size_t i = 0; i < r->nargs; i++) {
        list_foreach(p, &s->lost) {
            const char *x = list_entry(p, struct lost_lease, link)->resource;
            if (strlen(x) == r->args_len[i] &&
                memcmp(x, r->args[i], r->args_len[i]) == 0)
                return (long)i;
        }
    }
    return -1;
}

/*
 * UNLOCK r1 r2 ...: every name must be held or lost (else NOTHELD, and
 * nothing is released); the held ones are released at once; a lost one
 * makes the answer LOST once they are.
 */
static void cmd_unlock(struct session *s, const struct proto_request *r)
{
    struct lease *ls[PROTO_MAX_RESOURCES];
    size_t n = 0;

    if (r->nargs == 1) {
        struct lease *l = held_or_reply(s, r);
        if (!l)
            return;
        s->busy = true;
        lockmgr_unlock(&s->owner, l);
        return;
    }
    for (size_t i = 0; i < r->nargs; i++) {
        struct lease *l = lockmgr_held(&s->owner, r->args[i], r->args_len[i]);
        if (l) {
            ls[n++] = l;
            continue;
        }
        bool lost = false;
        struct list *p;
        list_foreach(p, &s->lost) {
            const char *x = list_entry(p, struct lost_lease, link)->resource;
            lost |= strlen(x) == r->args_len[i] &&
                    memcmp(x, r->args[i], r->args_len[i]) == 0;
        }
        if (!lost) {
            conn_errf(s, PROTO_ERR_NOTHELD, "this session does not hold "
                      "%.*s (nothing was released)", (int)r->args_len[i],
                      r->args[i]);
            return;
        }
    }
    long lost = lost_among(s, r);
    if (lost >= 0) {
        for (size_t i = 0; i < r->nargs; i++)
            session_take_lost(s, r->args[i], r->args_len[i]);
        if (!n) {
            conn_errf(s, PROTO_ERR_LOST, "the lease on %.*s was lost",
                      (int)r->args_len[lost], r->args[lost]);
            return;
        }
        /* Released first; the answer then says LOST for this one. */
        s->unlock_lost = mem_alloc(r->args_len[lost] + 1);
        memcpy(s->unlock_lost, r->args[lost], r->args_len[lost]);
    }
    s->busy = true;
    lockmgr_unlock_many(&s->owner, ls, n);
}

static void cmd_extend(struct session *s, const struct proto_request *r)
{
    if (!check_ttl(s, r->ttl))
        return;
    struct lease *l = held_or_reply(s, r);
    if (!l)
        return;
    s->busy = true;
    lockmgr_extend(&s->owner, l, r->ttl);
}

static void cmd_locks(struct session *s)
{
    json_t *lost = json_array();
    struct list *p;

    list_foreach(p, &s->lost)
        json_array_append_new(lost, json_string(
            list_entry(p, struct lost_lease, link)->resource));
    conn_json(s, json_pack("{s:s, s:o, s:o}", "session", s->idstr,
                           "locks", lockmgr_owner_leases_json(&s->owner, true),
                           "lost", lost));
}

/* An operator's: one check shared by FORCEUNLOCK and READMIT. */
static bool session_is_operator(struct session *s, const char *what)
{
    if (!S.conf->auth.admin_password) {
        conn_errf(s, PROTO_ERR_NOAUTH, "%s is disabled: no "
                  "auth.admin_password is configured", what);
        return false;
    }
    if (!s->admin) {
        conn_errf(s, PROTO_ERR_NOAUTH, "%s needs AUTH with the admin "
                  "password", what);
        return false;
    }
    return true;
}

static void cmd_forceunlock(struct session *s, const struct proto_request *r)
{
    if (!session_is_operator(s, "FORCEUNLOCK"))
        return;
    s->busy = true;
    lockmgr_force_release(&s->owner, r->arg, r->arg_len);
}

/* End a node's recovery now: the operator knows no lock outlived it. */
static void cmd_readmit(struct session *s, const struct proto_request *r)
{
    char node[128], msg[512];
    int n;

    if (!session_is_operator(s, "READMIT"))
        return;
    snprintf(node, sizeof(node), "%.*s", (int)r->arg_len, r->arg);
    n = node_end_recovery(node, msg, sizeof(msg));
    if (n < 0) {
        conn_errf(s, PROTO_ERR_ARG, "%s", msg[0] ? msg : "no such node");
        return;
    }
    log_notice("%s (name=%s peer=%s) READMIT %s: %s", s->idstr,
               s->name[0] ? s->name : "-", s->peer, node, msg);
    conn_ok_begin(s);
    conn_kv_u64(s, "readmitted", (uint64_t)n);
    conn_end(s);
}

static void cmd_status(struct session *s, const struct proto_request *r)
{
    if (r->limit > S.conf->locks.max_limit) {
        conn_errf(s, PROTO_ERR_ARG, "limit must be between 1 and %u "
                  "(locks.max_limit)", S.conf->locks.max_limit);
        return;
    }
    s->busy = true;
    lockmgr_status(&s->owner, r->arg, r->arg_len, r->limit);
}

json_t *session_list_json(void)
{
    json_t *arr = json_array();
    uint64_t now = timer_now();
    struct list *p;

    list_foreach(p, &S.live) {
        const struct session *s = list_entry(p, struct session, link);
        json_array_append_new(arr, json_pack(
            "{s:s, s:s?, s:s, s:I, s:I, s:I, s:I, s:o}",
            "id", s->idstr,
            "name", s->name[0] ? s->name : NULL,
            "peer", s->peer,
            "locks", (json_int_t)s->owner.nleases,
            "waits", (json_int_t)(s->owner.pending ? 1 : 0),
            "idle_ms", (json_int_t)(now - s->last_line_at),
            "age_ms", (json_int_t)(now - s->created_at),
            "held", lockmgr_owner_leases_json(&s->owner, false)));
        json_object_set_new(json_array_get(arr, json_array_size(arr) - 1),
                            "attached", json_true());
    }
    list_foreach(p, &S.detached)
        json_array_append_new(arr, detached_json(
            list_entry(p, const struct detached, link)));
    return json_pack("{s:o}", "sessions", arr);
}

/* Nothing after QUIT (or a too-long line) is read or served. */
static void session_stop(struct session *s, const char *why, bool died)
{
    queue_free(s);
    free(s->rbuf);
    s->rbuf = NULL;
    s->rlen = s->rcap = 0;
    conn_close_after_reply(s, why, died);
}

static void cmd_quit(struct session *s)
{
    conn_ok_begin(s);
    conn_word(s, "bye");
    conn_end(s);
    session_stop(s, "QUIT", false);
}

static void cmd_help(struct session *s, const struct proto_request *r)
{
    enum proto_cmd cmd;

    if (!r->arg) {
        conn_help(s);
        return;
    }
    cmd = proto_cmd_lookup(r->arg, r->arg_len);
    if (cmd == PROTO_CMD_NONE)
        conn_errf(s, PROTO_ERR_ARG, "no such command: %.*s (HELP lists them)",
                  (int)r->arg_len, r->arg);
    else
        conn_usage(s, cmd);
}

static void session_execute(struct session *s, struct line *ln)
{
    struct proto_request r;
    struct proto_error err;

    enum proto_parse_status st = proto_parse(ln->data, ln->len, &S.limits,
                                             &r, &err);
    if (st == PROTO_PARSE_EMPTY)
        return;
    stats_count_command(r.cmd);
    if (st == PROTO_PARSE_ERROR) {
        conn_err(s, err.code, err.msg);
        return;
    }
    if (!s->authed && S.conf->auth.password && cmd_needs_auth(r.cmd)) {
        conn_err(s, PROTO_ERR_NOAUTH, "authentication required: send AUTH "
                 "<password> first");
        return;
    }
    switch (r.cmd) {
    case PROTO_CMD_PING:     conn_pong(s, r.arg, r.arg ? r.arg_len : 0); break;
    case PROTO_CMD_HELLO:    cmd_hello(s, &r); break;
    case PROTO_CMD_AUTH:     cmd_auth(s, &r); break;
    case PROTO_CMD_LOCK:     cmd_lock(s, &r); break;
    case PROTO_CMD_UNLOCK:   cmd_unlock(s, &r); break;
    case PROTO_CMD_ADOPT:    cmd_adopt(s, &r); break;
    case PROTO_CMD_EXTEND:   cmd_extend(s, &r); break;
    case PROTO_CMD_LOCKS:    cmd_locks(s); break;
    case PROTO_CMD_STATUS:   cmd_status(s, &r); break;
    case PROTO_CMD_FORCEUNLOCK: cmd_forceunlock(s, &r); break;
    case PROTO_CMD_READMIT:  cmd_readmit(s, &r); break;
    case PROTO_CMD_SESSIONS: conn_json(s, session_list_json()); break;
    case PROTO_CMD_STATS:    conn_json(s, stats_json()); break;
    case PROTO_CMD_HELP:     cmd_help(s, &r); break;
    case PROTO_CMD_QUIT:     cmd_quit(s); break;
    default:                 conn_err(s, PROTO_ERR_UNKNOWN, NULL); break;
    }
}

void session_process(struct session *s)
{
    if (s->in_process)
        return;     /* an answer arrived synchronously; the loop goes on */
    s->in_process = true;
    session_ref(s);
    while (!s->closing && !s->busy) {
        struct line *ln = queue_pop(s);
        if (!ln) {
            if (!conn_refill(s))
                break;
            continue;
        }
        if (ln->toolong) {
            conn_errf(s, PROTO_ERR_TOOLONG, "request line longer than %u "
                      "bytes (limits.max_line); closing",
                      S.conf->limits.max_line);
            free(ln);
            session_stop(s, "request line too long", true);
            break;
        }
        s->cur = ln;
        session_execute(s, ln);
        if (!s->busy && s->cur == ln) {
            free(ln);
            s->cur = NULL;
        }
    }
    s->in_process = false;
    if (!s->closing) {
        conn_flush(s);
        conn_update_reading(s);
    }
    session_unref(s);
}

/* ---- answers from lockmgr (the owner interface) ------------------------- */

static struct session *owner_session(struct lockmgr_owner *o)
{
    return container_of(o, struct session, owner);
}

static void owner_ref(struct lockmgr_owner *o)
{
    session_ref(owner_session(o));
}

static void owner_unref(struct lockmgr_owner *o)
{
    session_unref(owner_session(o));
}

static void owner_locked(struct lockmgr_owner *o,
                         const struct lockmgr_grant *g, enum proto_err err,
                         const char *msg)
{
    struct session *s = owner_session(o);

    stats_observe_lock(s->lock_waited,
                       (double)(uv_hrtime() - s->lock_started_ns) / 1e9);
    if (s->closing)
        return;
    if (!g) {
        conn_err(s, err, msg);
    } else {
        conn_ok_begin(s);
        if (g->nresources > 1)
            conn_kv_u64(s, "resources", g->nresources);
        else
            conn_kv_str(s, "resource", g->resource);
        conn_kv_str(s, "token", g->token);
        conn_kv_u64(s, "fence", g->fence);
        conn_kv_u64(s, "ttl", g->ttl);
        conn_kv_i64(s, "validity", g->validity);
        if (g->mode == LOCKMGR_SHARED)
            conn_kv_str(s, "mode", "shared");
        if (g->limit) {
            conn_kv_u64(s, "limit", g->limit);
            conn_kv_u64(s, "slot", g->slot);
        }
        conn_end(s);
    }
    request_done(s);
}

static void owner_unlocked(struct lockmgr_owner *o, const char *resource,
                           size_t nres, int nodes, enum proto_err err)
{
    struct session *s = owner_session(o);
    char *lost = s->unlock_lost;

    s->unlock_lost = NULL;
    if (s->closing) {
        free(lost);
        return;
    }
    if (lost) {
        conn_errf(s, PROTO_ERR_LOST, "the lease on %s was lost; the others "
                  "are released", lost);
    } else if (err != PROTO_ERR_NONE) {
        conn_errf(s, err, "%s%s: the lease was no longer held on any node",
                  resource, nres > 1 ? " (or another of them)" : "");
    } else {
        conn_ok_begin(s);
        if (nres > 1)
            conn_kv_u64(s, "resources", nres);
        else
            conn_kv_str(s, "resource", resource);
        conn_kv_u64(s, "nodes", (uint64_t)nodes);
        conn_end(s);
    }
    free(lost);
    request_done(s);
}

static void owner_extended(struct lockmgr_owner *o, const char *resource,
                           uint32_t ttl, int64_t validity, enum proto_err err)
{
    struct session *s = owner_session(o);

    if (s->closing)
        return;
    if (err == PROTO_ERR_LOST) {
        conn_errf(s, err, "the lease on %s was lost", resource);
    } else if (err != PROTO_ERR_NONE) {
        conn_err(s, err, "could not set the new ttl on a quorum of nodes; "
                 "some may hold it, the others the old one: count on the "
                 "shorter until an EXTEND succeeds");
    } else {
        conn_ok_begin(s);
        conn_kv_str(s, "resource", resource);
        conn_kv_u64(s, "ttl", ttl);
        conn_kv_i64(s, "validity", validity);
        conn_end(s);
    }
    request_done(s);
}

static void owner_lost(struct lockmgr_owner *o, const char *resource,
                       uint64_t fence, enum lockmgr_lost_reason why)
{
    struct session *s = owner_session(o);

    if (s->closing)
        return;
    session_note_lost(s, resource);
    conn_event_lost(s, resource, fence, lockmgr_lost_reason_name(why));
    conn_flush(s);
}

/* Remember a lost lease so a later UNLOCK/EXTEND says LOST, not NOTHELD;
 * bounded like the leases themselves. */
static void session_note_lost(struct session *s, const char *resource)
{
    size_t len = strlen(resource);

    if (s->nlost < S.conf->limits.max_locks_per_session) {
        struct lost_lease *x = mem_alloc(sizeof(*x) + len + 1);
        memcpy(x->resource, resource, len + 1);
        list_push_head(&s->lost, &x->link);
        s->nlost++;
    }
}

static void owner_status(struct lockmgr_owner *o, json_t *status)
{
    struct session *s = owner_session(o);

    if (s->closing) {
        json_decref(status);
        return;
    }
    conn_json(s, status);
    request_done(s);
}

static const struct lockmgr_owner_ops session_owner_ops = {
    .ref = owner_ref, .unref = owner_unref,
    .locked = owner_locked, .unlocked = owner_unlocked,
    .extended = owner_extended, .lost = owner_lost, .status = owner_status,
};

/* ---- detached sessions ------------------------------------------------- */

static struct detached *owner_detached(struct lockmgr_owner *o)
{
    return container_of(o, struct detached, owner);
}

static void detached_free(struct detached *d)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, &d->lost) {
        list_remove(p);
        free(list_entry(p, struct detached_lost, link));
    }
    free(d);
}

static void detached_ref(struct lockmgr_owner *o)
{
    owner_detached(o)->refs++;
}

static void detached_unref(struct lockmgr_owner *o)
{
    struct detached *d = owner_detached(o);

    if (--d->refs == 0)
        detached_free(d);
}

/* Kept to be told on resume; bounded like the leases themselves. */
static void detached_lost(struct lockmgr_owner *o, const char *resource,
                          uint64_t fence, enum lockmgr_lost_reason why)
{
    struct detached *d = owner_detached(o);
    size_t len = strlen(resource);

    if (d->nlost >= S.conf->limits.max_locks_per_session)
        return;
    struct detached_lost *x = mem_alloc(sizeof(*x) + len + 1);
    x->fence = fence;
    x->why = why;
    memcpy(x->resource, resource, len + 1);
    list_push_tail(&d->lost, &x->link);
    d->nlost++;
}

/* A detached session sends no requests: only lost (and references) can
 * reach it. */
static void detached_status(struct lockmgr_owner *o, json_t *status)
{
    (void)o;
    json_decref(status);
}

static const struct lockmgr_owner_ops detached_owner_ops = {
    .ref = detached_ref, .unref = detached_unref,
    .lost = detached_lost, .status = detached_status,
};

/* Off the table: resumed (nothing left to release), expired or shut down
 * (lockmgr_owner_end releases, or abandon left, what it held). */
static void detached_end(struct detached *d, bool died)
{
    list_remove(&d->link);
    S.ndetached--;
    timer_stop(&d->timer);
    lockmgr_owner_end(&d->owner, died);
    detached_unref(&d->owner);
}

static void detached_expire_cb(struct timer *t)
{
    struct detached *d = t->data;

    log_info("%s (%s): not resumed within %u ms (detach=); ended, its %zu "
             "leases released", d->idstr, d->peer, d->detach_ms,
             d->owner.nleases);
    detached_end(d, true);
}

static bool session_may_detach(const struct session *s)
{
    return s->detach_ms > 0 && s->died && !s->resumed_away && !S.shutdown &&
           S.conf->limits.max_detach_ms > 0;
}

/* The connection of s ended without QUIT: keep its leases for detach_ms
 * (at most limits.max_detach_ms as it is now). Its pending LOCK is left
 * for lockmgr_owner_end to cancel. */
static void session_detach(struct session *s)
{
    struct detached *d = mem_alloc(sizeof(*d));
    unsigned max = S.conf->limits.max_detach_ms;

    memcpy(d->idstr, s->idstr, sizeof(d->idstr));
    memcpy(d->name, s->name, sizeof(d->name));
    memcpy(d->peer, s->peer, sizeof(d->peer));
    memcpy(d->secret, s->secret, sizeof(d->secret));
    d->detach_ms = s->detach_ms < max ? s->detach_ms : max;
    d->authed = s->authed;
    d->admin = s->admin;
    list_init(&d->lost);
    d->refs = 1;
    lockmgr_owner_init(&d->owner, &detached_owner_ops, d->idstr, d->name,
                       d->peer);
    d->owner.detached = true;
    d->owner.detached_at = timer_now();
    lockmgr_owner_move(&s->owner, &d->owner);
    timer_init(&d->timer, detached_expire_cb, d);
    timer_start(&d->timer, d->detach_ms);
    list_push_head(&S.detached, &d->link);
    S.ndetached++;
    log_info("%s (%s): connection gone; detached with %zu leases for up to "
             "%u ms", d->idstr, d->peer, d->owner.nleases, d->detach_ms);
}

/* The session named r->resume, if r->secret is its secret: a detached one,
 * or one still attached to another connection. */
static struct detached *detached_find(const struct proto_request *r)
{
    struct list *p;

    list_foreach(p, &S.detached) {
        struct detached *d = list_entry(p, struct detached, link);
        if (strlen(d->idstr) == r->resume_len &&
            memcmp(d->idstr, r->resume, r->resume_len) == 0)
            return secret_equal(r->secret, PROTO_SECRET_LEN, d->secret)
                   ? d : NULL;
    }
    return NULL;
}

static struct session *attached_find(const struct session *self,
                                     const struct proto_request *r)
{
    struct list *p;

    list_foreach(p, &S.live) {
        struct session *x = list_entry(p, struct session, link);
        if (x == self || x->closing || x->resumed_away ||
            strlen(x->idstr) != r->resume_len ||
            memcmp(x->idstr, r->resume, r->resume_len) != 0)
            continue;
        return x->detach_ms &&
               secret_equal(r->secret, PROTO_SECRET_LEN, x->secret) ? x : NULL;
    }
    return NULL;
}

/* ERR NOSESSION, counted as a wrong password. */
static void resume_refused(struct session *s)
{
    unsigned max = S.conf->limits.max_auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): HELLO resume= of an unknown session or with a "
               "wrong secret (%u of limits.max_auth_failures=%u)", s->idstr,
               s->peer, s->auth_failures, max);
    conn_err(s, PROTO_ERR_NOSESSION, "no such session, or a wrong secret");
    if (s->auth_failures >= max) {
        session_stop(s, "too many failed resumes", true);
        conn_close_announced(s, "auth", "too many failed resumes");
    }
}

/*
 * HELLO resume=: s becomes the session named, with its leases, if the
 * secret is right. One still attached elsewhere is taken over: its
 * connection gets EVENT CLOSING reason=resumed and is closed. Leases lost
 * while detached are told (EVENT LOST) right after the reply. Returns the
 * leases s holds now, or (size_t)-1 when refused (answered).
 */
static size_t session_resume(struct session *s, const struct proto_request *r)
{
    struct detached *d = NULL;
    struct session *x = NULL;

    if (s->owner.nleases > 0 || s->owner.pending) {
        conn_err(s, PROTO_ERR_ARG, "resume= must come before this "
                 "connection locks anything");
        return (size_t)-1;
    }
    if (!(d = detached_find(r)) && !(x = attached_find(s, r))) {
        resume_refused(s);
        return (size_t)-1;
    }
    if (d) {
        memcpy(s->idstr, d->idstr, sizeof(s->idstr));
        memcpy(s->name, d->name, sizeof(s->name));
        memcpy(s->secret, d->secret, sizeof(s->secret));
        s->detach_ms = d->detach_ms;
        s->authed |= d->authed;
        s->admin |= d->admin;
        lockmgr_owner_move(&d->owner, &s->owner);
        /* Told after the reply: queued in order behind it. */
        s->resume_lost = d;
        list_remove(&d->link);
        S.ndetached--;
        timer_stop(&d->timer);
        log_info("%s (%s): resumed with %zu leases after %" PRIu64 " ms "
                 "detached", s->idstr, s->peer, s->owner.nleases,
                 timer_now() - d->owner.detached_at);
    } else {
        memcpy(s->idstr, x->idstr, sizeof(s->idstr));
        memcpy(s->name, x->name, sizeof(s->name));
        memcpy(s->secret, x->secret, sizeof(s->secret));
        s->detach_ms = x->detach_ms;
        s->authed |= x->authed;
        s->admin |= x->admin;
        x->resumed_away = true;
        lockmgr_owner_move(&x->owner, &s->owner);
        log_info("%s (%s): taken over by a new connection (%s) with %zu "
                 "leases", x->idstr, x->peer, s->peer, s->owner.nleases);
        conn_close_now_announced(x, "resumed", "resumed on another "
                                 "connection");
    }
    return s->owner.nleases;
}

/* After the reply to a resume: what was lost while detached. */
static void session_tell_resume_lost(struct session *s)
{
    struct detached *d = s->resume_lost;
    struct list *p;

    if (!d)
        return;
    s->resume_lost = NULL;
    list_foreach(p, &d->lost) {
        struct detached_lost *x = list_entry(p, struct detached_lost, link);
        session_note_lost(s, x->resource);
        conn_event_lost(s, x->resource, x->fence,
                        lockmgr_lost_reason_name(x->why));
    }
    lockmgr_owner_end(&d->owner, false);    /* holds nothing now */
    detached_unref(&d->owner);
}

static json_t *detached_json(const struct detached *d)
{
    return json_pack("{s:s, s:s?, s:s, s:I, s:I, s:b, s:I, s:o}",
                     "id", d->idstr,
                     "name", d->name[0] ? d->name : NULL,
                     "peer", d->peer,
                     "locks", (json_int_t)d->owner.nleases,
                     "waits", (json_int_t)0,
                     "attached", false,
                     "detached_ms", (json_int_t)(timer_now() -
                                                 d->owner.detached_at),
                     "held", lockmgr_owner_leases_json(&d->owner, false));
}

/* ---- the end of a session ---------------------------------------------- */

void session_on_eof(struct session *s)
{
    session_ref(s);
    lockmgr_cut_wait(&s->owner);    /* may answer, and run the queue */
    if (!s->closing)
        session_process(s);
    session_unref(s);
}

void session_end(struct session *s)
{
    timer_stop(&s->idle_timer);
    timer_stop(&s->auth_timer);
    session_unlist(s);
    queue_free(s);
    session_tell_resume_lost(s);    /* ended before its reply went out */
    if (session_may_detach(s))
        session_detach(s);
    else if (S.shutdown && s->detach_ms && s->dropped)
        /* A detachable session's connection dropping is no release, and
         * nothing can resume it now: its leases are left to expire. */
        S.abandoned += lockmgr_owner_abandon(&s->owner, &S.abandoned_until);
    lockmgr_owner_end(&s->owner, s->died);
}

void session_set_shutdown(void)
{
    S.shutdown = true;
}

bool session_shutting_down(void)
{
    return S.shutdown;
}

/* A session that holds leases at shutdown stays open until its client
 * releases them (UNLOCK, QUIT, or closing the connection) or the daemon
 * exits; one that holds none is closed now. */
void session_shutdown_all(void)
{
    struct list *p, *tmp;

    /* Detached sessions cannot resume any more (nothing is accepted):
     * their leases are left to expire now. */
    while ((p = list_first(&S.detached))) {
        struct detached *d = list_entry(p, struct detached, link);
        S.abandoned += lockmgr_owner_abandon(&d->owner, &S.abandoned_until);
        detached_end(d, false);
    }
    list_foreach_safe(p, tmp, &S.live) {
        struct session *s = list_entry(p, struct session, link);
        session_ref(s);
        conn_event_shutdown(s);
        lockmgr_owner_shutdown(&s->owner);  /* may answer a waiting LOCK */
        if (s->owner.nleases == 0)
            conn_close_announced(s, "shutdown", "the daemon is shutting "
                                 "down");
        conn_flush(s);
        session_unref(s);
    }
}

size_t session_abandon_all(uint64_t *until)
{
    struct list *p, *tmp;
    size_t n = S.abandoned;

    if (S.abandoned_until > *until)
        *until = S.abandoned_until;
    list_foreach_safe(p, tmp, &S.live) {
        struct session *s = list_entry(p, struct session, link);
        session_ref(s);
        n += lockmgr_owner_abandon(&s->owner, until);
        conn_close_announced(s, "shutdown", "the daemon is shutting down; "
                             "its leases are left to expire by their ttl");
        conn_flush(s);
        session_unref(s);
    }
    return n;
}

void session_close_all(const char *why)
{
    struct list *p;

    while ((p = list_first(&S.live))) {
        struct session *s = list_entry(p, struct session, link);
        conn_close(s, false, why);  /* unlists s */
    }
}
