/*
 * session: a client's session (see session.h for its states).
 *
 * Requests are served strictly in order: conn hands over one line at a
 * time (ops->line), and a request that needs Redis holds the connection's
 * queue (conn_hold) until its answer arrives through one of the lockmgr
 * owner callbacks ("answers from lockmgr"), which replies and lets the
 * queue go on (conn_done). A later request waits meanwhile, so a
 * pipelined UNLOCK after LOCK always sees the lock.
 *
 * The end of a connection (conn ops->closed) decides what becomes of the
 * session: it detaches or ends ("detach, resume, end").
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
#include "status.h"
#include "wording.h"

/* Room for the nodes' own explanation in an ERR UNAVAILABLE line. */
#define SESSION_WHY_SIZE 512

/* A lease lost: told already (lost), or to be told on resume (untold). */
struct session_lost {
    struct list link;
    uint64_t fence;
    enum lockmgr_lost_reason why;
    char resource[];
};

static struct {
    const struct conf *conf;    /* read live: a reload changes it in place */
    struct proto_limits limits;
    struct list attached;       /* struct session, newest connection first */
    size_t count;
    struct list detached;       /* struct session, newest first */
    size_t ndetached;
    size_t abandoned;           /* leases of detached sessions left at
                                   shutdown */
    uint64_t abandoned_until;
    uint64_t next_id;
    char epoch[16];             /* the start time in session ids */
    bool shutdown;
} sessions = { .attached = LIST_INIT(sessions.attached),
        .detached = LIST_INIT(sessions.detached) };

void session_init(const struct conf *conf)
{
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    struct timespec ts;
    char tmp[16];
    int n = 0;

    sessions.conf = conf;
    sessions.limits.max_resource_len = conf->locks.max_resource_len;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    do {
        tmp[n++] = digits[ms % 36];
        ms /= 36;
    } while (ms && n < (int)sizeof(tmp) - 1);
    for (int i = 0; i < n; i++)
        sessions.epoch[i] = tmp[n - 1 - i];
    sessions.epoch[n] = '\0';
}

static void session_auth_cb(struct timer *t);
static void session_expire_cb(struct timer *t);
static void session_attach(struct session *s, struct conn *c,
                           struct list *after);

static const struct lockmgr_owner_ops session_owner_ops;

struct session *session_create(struct conn *c)
{
    struct session *s = mem_alloc(sizeof(*s));

    s->id = ++sessions.next_id;
    snprintf(s->idstr, sizeof(s->idstr), "s%" PRIu64 ".%s", s->id, sessions.epoch);
    list_init(&s->link);
    list_init(&s->lost);
    list_init(&s->untold);
    lockmgr_owner_init(&s->owner, &session_owner_ops, s->idstr, s->name,
                       s->peer);
    timer_init(&s->auth_timer, session_auth_cb, s);
    timer_init(&s->detach_timer, session_expire_cb, s);
    session_attach(s, c, &sessions.attached);
    return s;
}

static void session_lost_free(struct list *head, size_t *n)
{
    struct list *p, *tmp;

    list_foreach_safe(p, tmp, head) {
        list_remove(p);
        free(list_entry(p, struct session_lost, link));
    }
    *n = 0;
}

static void session_free(struct session *s)
{
    session_lost_free(&s->lost, &s->nlost);
    session_lost_free(&s->untold, &s->nuntold);
    free(s->unlock_lost);
    free(s);
}

static void session_ref(struct session *s)
{
    s->refs++;
}

static void session_unref(struct session *s)
{
    if (--s->refs == 0)
        session_free(s);
}

size_t session_count(void)
{
    return sessions.count;
}

size_t session_detached_count(void)
{
    return sessions.ndetached;
}

size_t session_count_ip(const char *ip)
{
    struct list *p;
    size_t n = 0;

    list_foreach(p, &sessions.attached) {
        const struct session *x = container_of(p, struct session, link);
        n += strcmp(x->conn->ip, ip) == 0;
    }
    return n;
}

/* ---- commands ---------------------------------------------------------- */

/* With a password or users configured, a client logs in first. */
static bool session_login_required(void)
{
    const struct conf *cf = sessions.conf;

    return cf->auth.password || cf->auth.nusers;
}

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

static struct session *session_resume(struct session *s,
                                      const struct proto_request *r);
static void session_tell_untold(struct session *s);
static json_t *session_list_for(const struct session *s);

/* HELLO detach=: 0 turns it off; above 0 the session gets a secret (kept
 * if it had one). False when refused (answered). */
static bool hello_detach(struct session *s, uint32_t ms)
{
    struct conn *c = s->conn;
    unsigned max = sessions.conf->limits.max_detach_ms;

    if (ms == 0) {
        s->detach_ms = 0;
        s->secret[0] = '\0';
        return true;
    }
    if (max == 0) {
        conn_err(c, PROTO_ERR_ARG, "detach is off on this daemon "
                 "(limits.max_detach_ms is 0)");
        return false;
    }
    if (ms > max) {
        conn_errf(c, PROTO_ERR_ARG, "detach must be at most %u ms "
                  "(limits.max_detach_ms)", max);
        return false;
    }
    if (!s->secret[0] && redlock_token(s->secret) != 0) {
        s->secret[0] = '\0';
        conn_err(c, PROTO_ERR_UNAVAILABLE, "the system's random source "
                 "failed; no secret to resume with");
        return false;
    }
    s->detach_ms = ms;
    return true;
}

static void cmd_hello(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    bool resume = r->has & PROTO_OPT_RESUME;

    if ((r->has & PROTO_OPT_DETACH) && !hello_detach(s, r->detach))
        return;
    /* Resumed, c serves the session named from now on: the rest of the
     * HELLO is that session's. */
    if (resume && !(s = session_resume(s, r)))
        return;
    /* Answering may close c (output over its limit): the session resumed
     * then detaches again, or ends, under us. */
    session_ref(s);
    if (r->has & PROTO_OPT_NAME)
        snprintf(s->name, sizeof(s->name), "%.*s", (int)r->name_len, r->name);
    if (r->has & PROTO_OPT_KEEPALIVE)
        conn_set_keepalive(c, r->keepalive);
    conn_ok_begin(c);
    conn_kv_u64(c, "proto", PROTO_VERSION);
    conn_kv_str(c, "session", s->idstr);
    conn_kv_str(c, "server", "redlockd/" REDLOCKD_VERSION);
    conn_kv_u64(c, "nodes", (uint64_t)redlock_nnodes());
    conn_kv_u64(c, "quorum", (uint64_t)redlock_nquorum());
    if (s->detach_ms && (r->has & PROTO_OPT_DETACH))
        conn_kv_str(c, "secret", s->secret);
    if (resume)
        conn_kv_u64(c, "resumed", s->owner.nleases);
    conn_end(c);
    session_tell_untold(s);
    if (s->name[0])
        log_debug("%s is %s", s->idstr, s->name);
    session_unref(s);
}

/* A wrong AUTH is answered after a delay that grows with each failure
 * (100 ms per failure so far, at most 2 s): guessing gets slow. A wrong
 * user name and a wrong password take the same path, so neither the
 * answer nor its delay tells which names exist. */
static void session_auth_cb(struct timer *t)
{
    struct session *s = t->data;
    struct conn *c = s->conn;     /* stopped when the connection leaves */

    conn_err(c, PROTO_ERR_AUTH, sessions.conf->auth.nusers
             ? "invalid user name or password" : "invalid password");
    conn_done(c);
}

/* who: "" for AUTH <password>, else what the log may say of the user. */
static void auth_failed(struct session *s, const char *who)
{
    struct conn *c = s->conn;
    unsigned max = sessions.conf->limits.max_auth_failures;
    uint64_t delay = 100 * (uint64_t)s->auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): wrong password%s (%u of "
               "limits.max_auth_failures=%u)", s->idstr, s->peer, who,
               s->auth_failures, max);
    if (s->auth_failures >= max) {
        conn_err(c, PROTO_ERR_AUTH, "invalid password; too many failures, "
                 "closing (limits.max_auth_failures)");
        conn_stop(c, "too many wrong passwords", true);
        conn_close_announced(c, "auth", "too many wrong passwords");
        return;
    }
    conn_hold(c);
    timer_start(&s->auth_timer, delay < 2000 ? delay : 2000);
}

/* s is u's from now on: its checks are u's prefixes (looked up by name
 * each time, so a reload applies), and no operator password carries
 * over. how: for the audit line. */
static void session_log_in(struct session *s, const struct users_user *u,
                           const char *how)
{
    s->authed = true;
    s->admin = false;
    snprintf(s->user, sizeof(s->user), "%s", u->name);
    log_notice("%s (%s): logged in as user %s%s %s", s->idstr, s->peer,
               u->name, u->admin ? " (admin)" : "", how);
}

/* The user s is logged in as, in the configuration as it is now; NULL
 * when s is no user's, or its user was removed by a reload. */
static const struct users_user *session_user(const struct session *s)
{
    const struct conf *cf = sessions.conf;

    if (!s->user[0])
        return NULL;
    return users_find(cf->auth.users, cf->auth.nusers, s->user,
                      strlen(s->user));
}

/* A verified client certificate whose subject CN names a user logs its
 * connection in as that user, with no AUTH (TLS, tls.verify_clients: conn
 * fills cert_cn only for a certificate it verified, once the handshake is
 * done, after the session was made: session_execute asks at each line
 * until s is logged in). A CN that names no user changes nothing: the
 * client may still AUTH. A session already a user's stays that user. */
static void session_login_cert(struct session *s)
{
    const struct conf *cf = sessions.conf;
    const struct conn *c = s->conn;
    const struct users_user *u;

    if (!c || !c->cert_cn[0] || s->user[0])
        return;
    u = users_find(cf->auth.users, cf->auth.nusers, c->cert_cn,
                   strnlen(c->cert_cn, sizeof(c->cert_cn)));
    if (u)
        session_log_in(s, u, "by client certificate");
}

/* AUTH <name> <password>. An unknown name still costs a comparison, and
 * its log line does not repeat what was sent (it may be a password typed
 * in the wrong place). */
static void cmd_auth_user(struct session *s, const struct proto_request *r)
{
    const struct conf *cf = sessions.conf;
    const struct users_user *u;
    char who[USERS_NAME_MAX + 16];
    bool ok;

    if (!cf->auth.nusers) {
        conn_err(s->conn, PROTO_ERR_AUTH, "no users are configured "
                 "(auth.users): send AUTH <password>");
        return;
    }
    u = users_find(cf->auth.users, cf->auth.nusers, r->args[0],
                   r->args_len[0]);
    ok = users_secret_equal(r->args[1], r->args_len[1],
                            u ? u->password : cf->auth.users[0].password);
    if (u && ok) {
        session_log_in(s, u, "with a password");
        conn_ok(s->conn);
        return;
    }
    if (u)
        snprintf(who, sizeof(who), " for user %s", u->name);
    else
        snprintf(who, sizeof(who), " (an unknown user name)");
    auth_failed(s, who);
}

static void cmd_auth(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    const char *pw = sessions.conf->auth.password;
    const char *admin = sessions.conf->auth.admin_password;

    /* A session's user never changes: its leases were taken, and are
     * checked, under that user's prefixes (also after a resume by another
     * user's connection). Refused before any password is compared, so it
     * costs no failure and tells nothing. */
    if (s->user[0]) {
        conn_errf(c, PROTO_ERR_ARG, "this session is user %s's, and a "
                  "session's user never changes (AUTH on a new connection)",
                  s->user);
        return;
    }
    if (r->nargs == 2) {
        cmd_auth_user(s, r);
        return;
    }
    if (!pw && !admin) {
        conn_errf(c, PROTO_ERR_AUTH, "no password is configured%s",
                 sessions.conf->auth.nusers ? "; send AUTH <user> "
                 "<password>" : "");
        return;
    }
    if (admin && users_secret_equal(r->arg, r->arg_len, admin)) {
        s->authed = s->admin = true;
        s->user[0] = '\0';
        log_notice("%s (%s): authenticated as an operator (admin password)",
                   s->idstr, s->peer);
        conn_ok(c);
    } else if (pw && users_secret_equal(r->arg, r->arg_len, pw)) {
        s->authed = true;
        s->user[0] = '\0';
        conn_ok(c);
    } else {
        auth_failed(s, "");
    }
}

/* ---- users: what lies within a user's prefixes --------------------------- */

_Static_assert(PROTO_CMD_COUNT <= 32, "denied_told has a bit per command");

/* ERR DENIED. The audit line goes out at notice once per session and
 * command, later ones at debug: a client looping on a refused name cannot
 * flood the log. res may be NULL (READMIT). */
static void session_deny(struct session *s, enum proto_cmd cmd,
                         const char *res, size_t len, const char *why)
{
    const char *what = proto_cmd_name(cmd);
    int n = (int)(len > 64 ? 64 : len);
    uint32_t bit = 1u << cmd;

    if (!(s->denied_told & bit))
        log_notice("%s (%s): user %s denied %s %.*s: %s", s->idstr, s->peer,
                   s->user, what, n, res ? res : "", why);
    else
        log_debug("%s (%s): user %s denied %s %.*s: %s", s->idstr, s->peer,
                  s->user, what, n, res ? res : "", why);
    s->denied_told |= bit;
    if (res)
        conn_errf(s->conn, PROTO_ERR_DENIED, "user %s may not %s %.*s: %s",
                  s->user, what, n, res, why);
    else
        conn_errf(s->conn, PROTO_ERR_DENIED, "user %s may not %s: %s",
                  s->user, what, why);
}

/* May s do cmd to each of res[0..n)? A session of no user may (the shared
 * password, or no login at all, as before users); a user's, only within
 * its prefixes. False when refused (answered ERR DENIED). */
static bool session_may(struct session *s, enum proto_cmd cmd,
                        const char *const *res, const size_t *len, size_t n)
{
    const struct users_user *u;

    if (!s->user[0])
        return true;
    u = session_user(s);
    for (size_t i = 0; i < n; i++) {
        if (u && users_allows(u, res[i], len[i]))
            continue;
        session_deny(s, cmd, res[i], len[i], u ? "outside the user's "
                     "prefixes" : "the user is no longer configured");
        return false;
    }
    return true;
}

/* Forget that the lease on res was lost; true if it was. */
static bool session_take_lost(struct session *s, const char *res, size_t len)
{
    struct list *p;

    list_foreach(p, &s->lost) {
        struct session_lost *x = list_entry(p, struct session_lost, link);
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
    struct conn *c = s->conn;
    const struct conf *cf = sessions.conf;
    if (ttl < cf->locks.min_ttl_ms || ttl > cf->locks.max_ttl_ms) {
        conn_errf(c, PROTO_ERR_ARG, "ttl must be between %u and %u ms",
                  cf->locks.min_ttl_ms, cf->locks.max_ttl_ms);
        return false;
    }
    return true;
}

/* The request's resources against this session: ERR HELD for one it
 * holds already. Forgets a lost lease of each (a new LOCK starts over). */
static bool lock_names_free(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;

    for (size_t i = 0; i < r->nargs; i++) {
        if (lockmgr_held(&s->owner, r->args[i], r->args_len[i])) {
            conn_errf(c, PROTO_ERR_HELD, "this session already holds %.*s",
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
    struct conn *c = s->conn;
    const struct conf *cf = sessions.conf;

    if (r->nargs > cf->locks.max_multi) {
        conn_errf(c, PROTO_ERR_ARG, "at most %u resources in one LOCK "
                  "(locks.max_multi)", cf->locks.max_multi);
        return false;
    }
    if (r->limit > cf->locks.max_limit) {
        conn_errf(c, PROTO_ERR_ARG, "limit must be between 1 and %u "
                  "(locks.max_limit)", cf->locks.max_limit);
        return false;
    }
    if (r->nargs > 1 && r->mode == PROTO_MODE_SHARED) {
        conn_err(c, PROTO_ERR_ARG, "several resources are locked in "
                 "exclusive mode only");
        return false;
    }
    if (r->nargs > 1 && r->limit) {
        conn_err(c, PROTO_ERR_ARG, "limit= takes one resource");
        return false;
    }
    if (r->limit && r->mode == PROTO_MODE_SHARED) {
        conn_err(c, PROTO_ERR_ARG, "limit= and mode=shared do not go "
                 "together: each slot is an exclusive lock");
        return false;
    }
    return true;
}

static void cmd_lock(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    const struct conf *cf = sessions.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl
                                            : cf->locks.default_ttl_ms;
    /* Nobody is left to wait for the answer after EOF. */
    uint32_t wait = (r->has & PROTO_OPT_WAIT) && !c->eof ? r->wait : 0;

    if (!session_may(s, r->cmd, r->args, r->args_len, r->nargs))
        return;
    if (sessions.shutdown) {
        conn_err(c, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(s, ttl) || !lock_kind_ok(s, r))
        return;
    if (wait > cf->locks.max_wait_ms) {
        conn_errf(c, PROTO_ERR_ARG, "wait must be at most %u ms",
                  cf->locks.max_wait_ms);
        return;
    }
    if (!lock_names_free(s, r))
        return;
    if (s->owner.nleases + r->nargs > cf->limits.max_locks_per_session) {
        conn_errf(c, PROTO_ERR_LIMIT, "this session holds %zu locks "
                  "(limits.max_locks_per_session)", s->owner.nleases);
        return;
    }
    struct lockmgr_req lr = {
        .n = r->nargs, .res = r->args, .len = r->args_len,
        .mode = r->mode == PROTO_MODE_SHARED ? LOCKMGR_SHARED
                                             : LOCKMGR_EXCLUSIVE,
        .limit = r->limit, .ttl = ttl, .wait = wait, .renew = r->renew,
    };
    conn_hold(c);
    s->asking = PROTO_CMD_LOCK;
    s->lock_started_ns = uv_hrtime();
    s->lock_waited = wait > 0;
    lockmgr_lock_req(&s->owner, &lr, NULL);
}

/* ADOPT: take over an exclusive lease by its token (a client whose daemon
 * died or restarted). Answered as a LOCK is (owner_locked). */
static void cmd_adopt(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    const struct conf *cf = sessions.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl
                                            : cf->locks.default_ttl_ms;

    if (!session_may(s, r->cmd, r->args, r->args_len, r->nargs))
        return;
    if (sessions.shutdown) {
        conn_err(c, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(s, ttl))
        return;
    if (r->nargs > cf->locks.max_multi) {
        conn_errf(c, PROTO_ERR_ARG, "at most %u resources in one ADOPT "
                  "(locks.max_multi)", cf->locks.max_multi);
        return;
    }
    if (!lock_names_free(s, r))
        return;
    struct lockmgr_adopt_req ar = {
        .n = r->nargs, .res = r->args, .len = r->args_len, .token = r->token,
        .ttl = ttl, .renew = r->renew,
    };
    conn_hold(c);
    s->asking = PROTO_CMD_ADOPT;
    s->lock_started_ns = uv_hrtime();
    s->lock_waited = false;
    lockmgr_adopt(&s->owner, &ar, NULL);
}

/* The lease for an UNLOCK/EXTEND of res, or NULL after answering
 * NOTHELD/LOST (forgetting the lost lease: the client has heard). */
static struct lease *held_or_reply_name(struct session *s, const char *res,
                                        size_t len)
{
    struct conn *c = s->conn;
    struct lease *l = lockmgr_held(&s->owner, res, len);
    if (l)
        return l;
    if (session_take_lost(s, res, len))
        conn_errf(c, PROTO_ERR_LOST, "the lease on %.*s was lost",
                  (int)len, res);
    else
        conn_errf(c, PROTO_ERR_NOTHELD, "this session does not hold %.*s",
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
            const char *x = list_entry(p, struct session_lost, link)->resource;
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
    struct conn *c = s->conn;
    struct lease *ls[PROTO_MAX_RESOURCES];
    size_t n = 0;

    if (r->nargs == 1) {
        struct lease *l = held_or_reply(s, r);
        if (!l)
            return;
        conn_hold(c);
        lockmgr_unlock(&s->owner, l, NULL);
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
            const char *x = list_entry(p, struct session_lost, link)->resource;
            lost |= strlen(x) == r->args_len[i] &&
                    memcmp(x, r->args[i], r->args_len[i]) == 0;
        }
        if (!lost) {
            conn_errf(c, PROTO_ERR_NOTHELD, "this session does not hold "
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
            conn_errf(c, PROTO_ERR_LOST, "the lease on %.*s was lost",
                      (int)r->args_len[lost], r->args[lost]);
            return;
        }
        /* Released first; the answer then says LOST for this one. */
        s->unlock_lost = mem_alloc(r->args_len[lost] + 1);
        memcpy(s->unlock_lost, r->args[lost], r->args_len[lost]);
    }
    conn_hold(c);
    lockmgr_unlock_many(&s->owner, ls, n, NULL);
}

static void cmd_extend(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;

    if (!check_ttl(s, r->ttl))
        return;
    struct lease *l = held_or_reply(s, r);
    if (!l)
        return;
    conn_hold(c);
    lockmgr_extend(&s->owner, l, r->ttl, NULL);
}

static void cmd_locks(struct session *s)
{
    struct conn *c = s->conn;
    json_t *lost = json_array();
    struct list *p;

    list_foreach(p, &s->lost)
        json_array_append_new(lost, json_string(
            list_entry(p, struct session_lost, link)->resource));
    conn_json(c, json_pack("{s:s, s:o, s:o}", "session", s->idstr,
                           "locks", status_leases_json(&s->owner, true),
                           "lost", lost));
}

/* A user's FORCEUNLOCK (res) or READMIT (res NULL): an admin user's,
 * within its prefixes; READMIT concerns every resource, so it needs the
 * prefix "" too. */
static bool session_user_operates(struct session *s, enum proto_cmd cmd,
                                  const char *res, size_t len)
{
    const struct users_user *u = session_user(s);

    if (u && !u->admin) {
        session_deny(s, cmd, res, len, "not an admin user");
        return false;
    }
    if (res)
        return session_may(s, cmd, &res, &len, 1);
    if (!u || !users_allows_all(u)) {
        session_deny(s, cmd, NULL, 0, u ? "it concerns every resource: "
                     "only an admin user with the prefix \"\" may" :
                     "the user is no longer configured");
        return false;
    }
    return true;
}

/* An operator's: one check shared by FORCEUNLOCK (res) and READMIT (res
 * NULL). */
static bool session_is_operator(struct session *s, enum proto_cmd cmd,
                                const char *res, size_t len)
{
    struct conn *c = s->conn;
    const char *what = proto_cmd_name(cmd);

    if (s->user[0])
        return session_user_operates(s, cmd, res, len);
    if (!sessions.conf->auth.admin_password) {
        conn_errf(c, PROTO_ERR_NOAUTH, "%s is disabled: no "
                  "auth.admin_password is configured", what);
        return false;
    }
    if (!s->admin) {
        conn_errf(c, PROTO_ERR_NOAUTH, "%s needs AUTH with the admin "
                  "password", what);
        return false;
    }
    return true;
}

static void cmd_forceunlock(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;

    if (!session_is_operator(s, r->cmd, r->arg, r->arg_len))
        return;
    if (s->user[0])
        log_notice("%s (name=%s peer=%s) user %s: FORCEUNLOCK %.*s",
                   s->idstr, s->name[0] ? s->name : "-", s->peer, s->user,
                   (int)r->arg_len, r->arg);
    conn_hold(c);
    lockmgr_force_release(&s->owner, r->arg, r->arg_len, NULL);
}

/* End a node's recovery now: the operator knows no lock outlived it. */
static void cmd_readmit(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    char node[128], msg[512];
    int n;

    if (!session_is_operator(s, r->cmd, NULL, 0))
        return;
    snprintf(node, sizeof(node), "%.*s", (int)r->arg_len, r->arg);
    n = node_end_recovery(node, msg, sizeof(msg));
    if (n < 0) {
        conn_errf(c, PROTO_ERR_ARG, "%s", msg[0] ? msg : "no such node");
        return;
    }
    log_notice("%s (name=%s peer=%s%s%s) READMIT %s: %s", s->idstr,
               s->name[0] ? s->name : "-", s->peer, s->user[0] ? " user=" : "",
               s->user, node, msg);
    conn_ok_begin(c);
    conn_kv_u64(c, "readmitted", (uint64_t)n);
    conn_end(c);
}

static void cmd_status(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;

    if (!session_may(s, r->cmd, &r->arg, &r->arg_len, 1))
        return;
    if (r->limit > sessions.conf->locks.max_limit) {
        conn_errf(c, PROTO_ERR_ARG, "limit must be between 1 and %u "
                  "(locks.max_limit)", sessions.conf->locks.max_limit);
        return;
    }
    conn_hold(c);
    lockmgr_status(&s->owner, r->arg, r->arg_len, r->limit, NULL);
}

static void cmd_quit(struct session *s)
{
    struct conn *c = s->conn;

    conn_ok_begin(c);
    conn_word(c, "bye");
    conn_end(c);
    conn_stop(c, "QUIT", false);
}

static void cmd_help(struct session *s, const struct proto_request *r)
{
    struct conn *c = s->conn;
    enum proto_cmd cmd;

    if (!r->arg) {
        conn_help(c);
        return;
    }
    cmd = proto_cmd_lookup(r->arg, r->arg_len);
    if (cmd == PROTO_CMD_NONE)
        conn_errf(c, PROTO_ERR_ARG, "no such command: %.*s (HELP lists them)",
                  (int)r->arg_len, r->arg);
    else
        conn_usage(c, cmd);
}

static void session_execute(struct session *s, char *line, size_t len)
{
    struct conn *c = s->conn;
    struct proto_request r;
    struct proto_error err;

    enum proto_parse_status st = proto_parse(line, len, &sessions.limits, &r, &err);
    if (st == PROTO_PARSE_EMPTY)
        return;
    stats_count_command(r.cmd);
    if (st == PROTO_PARSE_ERROR) {
        conn_err(c, err.code, err.msg);
        return;
    }
    /* A verified client certificate naming a user logs in with the first
     * line (the TLS handshake ends after the session was made). */
    if (!s->authed && c->cert_cn[0])
        session_login_cert(s);
    if (!s->authed && session_login_required() && cmd_needs_auth(r.cmd)) {
        conn_err(c, PROTO_ERR_NOAUTH, sessions.conf->auth.nusers
                 ? "authentication required: send AUTH <user> <password> "
                   "first" : "authentication required: send AUTH "
                   "<password> first");
        return;
    }
    switch (r.cmd) {
    case PROTO_CMD_PING:     conn_pong(c, r.arg, r.arg ? r.arg_len : 0); break;
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
    case PROTO_CMD_SESSIONS: conn_json(c, session_list_for(s)); break;
    case PROTO_CMD_STATS:    conn_json(c, stats_json()); break;
    case PROTO_CMD_HELP:     cmd_help(s, &r); break;
    case PROTO_CMD_QUIT:     cmd_quit(s); break;
    default:                 conn_err(c, PROTO_ERR_UNKNOWN, NULL); break;
    }
}

/* conn ops->line: s is c's session. */
static void session_on_line(struct conn *c, void *data, char *line,
                            size_t len)
{
    struct session *s = data;

    (void)c;
    session_ref(s);     /* a resume may end s on the way */
    session_execute(s, line, len);
    session_unref(s);
}

/* ---- answers from lockmgr (the owner interface) ------------------------- */

/*
 * An answer reaches a session only while the connection that asked is
 * attached (lockmgr_owner_cancel drops the others), so s->conn is the one
 * to answer on. A lease lost reaches it in any state but ended.
 */

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

/* A refusal of command cmd, worded (wording.h). */
static void conn_refusal(struct conn *c, enum proto_cmd cmd,
                         const struct lockmgr_refusal *no)
{
    char msg[PROTO_MAX_ERRMSG + SESSION_WHY_SIZE];
    enum proto_err err = wording_refusal(cmd, no, msg, sizeof(msg));

    conn_err(c, err, msg);
}

static void owner_locked(struct lockmgr_owner *o, void *ask,
                         const struct lockmgr_grant *g,
                         const struct lockmgr_refusal *no)
{
    struct session *s = owner_session(o);
    struct conn *c = s->conn;

    (void)ask;
    stats_observe_lock(s->lock_waited,
                       (double)(uv_hrtime() - s->lock_started_ns) / 1e9);
    if (!c)
        return;
    if (!g) {
        conn_refusal(c, s->asking, no);
    } else {
        conn_ok_begin(c);
        if (g->nresources > 1)
            conn_kv_u64(c, "resources", g->nresources);
        else
            conn_kv_str(c, "resource", g->resource);
        conn_kv_str(c, "token", g->token);
        conn_kv_u64(c, "fence", g->fence);
        conn_kv_u64(c, "ttl", g->ttl);
        conn_kv_i64(c, "validity", g->validity);
        if (g->mode == LOCKMGR_SHARED)
            conn_kv_str(c, "mode", "shared");
        if (g->limit) {
            conn_kv_u64(c, "limit", g->limit);
            conn_kv_u64(c, "slot", g->slot);
        }
        conn_end(c);
    }
    conn_done(c);
}

static void owner_unlocked(struct lockmgr_owner *o, void *ask,
                           const char *resource, size_t nres, int nodes,
                           const struct lockmgr_refusal *no)
{
    struct session *s = owner_session(o);
    struct conn *c = s->conn;
    char *lost = s->unlock_lost;

    (void)ask;
    s->unlock_lost = NULL;
    if (!c) {
        free(lost);
        return;
    }
    if (lost) {
        conn_errf(c, PROTO_ERR_LOST, "the lease on %s was lost; the others "
                  "are released", lost);
    } else if (no) {
        struct lockmgr_refusal gone = *no;
        gone.resource = resource;
        gone.count = nres;
        conn_refusal(c, PROTO_CMD_UNLOCK, &gone);
    } else {
        conn_ok_begin(c);
        if (nres > 1)
            conn_kv_u64(c, "resources", nres);
        else
            conn_kv_str(c, "resource", resource);
        conn_kv_u64(c, "nodes", (uint64_t)nodes);
        conn_end(c);
    }
    free(lost);
    conn_done(c);
}

static void owner_extended(struct lockmgr_owner *o, void *ask,
                           const char *resource, uint32_t ttl,
                           int64_t validity, const struct lockmgr_refusal *no)
{
    struct conn *c = owner_session(o)->conn;

    (void)ask;
    if (!c)
        return;
    if (no) {
        conn_refusal(c, PROTO_CMD_EXTEND, no);
    } else {
        conn_ok_begin(c);
        conn_kv_str(c, "resource", resource);
        conn_kv_u64(c, "ttl", ttl);
        conn_kv_i64(c, "validity", validity);
        conn_end(c);
    }
    conn_done(c);
}

/* Add a lost lease to list (bounded like the leases themselves): at the
 * head, or at the tail for oldest first. */
static void session_lost_add(struct list *list, size_t *n, bool tail,
                             const char *resource, uint64_t fence,
                             enum lockmgr_lost_reason why)
{
    size_t len = strlen(resource);

    if (*n >= sessions.conf->limits.max_locks_per_session)
        return;
    struct session_lost *x = mem_alloc(sizeof(*x) + len + 1);
    x->fence = fence;
    x->why = why;
    memcpy(x->resource, resource, len + 1);
    if (tail)
        list_push_tail(list, &x->link);
    else
        list_push_head(list, &x->link);
    (*n)++;
}

/* Attached: told now, and remembered so a later UNLOCK/EXTEND says LOST,
 * not NOTHELD. Detached: kept to be told after the resume reply. */
static void owner_lost(struct lockmgr_owner *o, const char *resource,
                       uint64_t fence, enum lockmgr_lost_reason why)
{
    struct session *s = owner_session(o);
    struct conn *c = s->conn;

    if (!c) {
        session_lost_add(&s->untold, &s->nuntold, true, resource, fence,
                         why);
        return;
    }
    session_lost_add(&s->lost, &s->nlost, false, resource, fence, why);
    conn_event_lost(c, resource, fence, lockmgr_lost_reason_name(why));
    conn_flush(c);
}

static void owner_status(struct lockmgr_owner *o, void *ask,
                         const struct lockmgr_status *st)
{
    struct conn *c = owner_session(o)->conn;

    (void)ask;
    if (!c)
        return;
    conn_json(c, status_json(st));
    conn_done(c);
}

static const struct lockmgr_owner_ops session_owner_ops = {
    .ref = owner_ref, .unref = owner_unref,
    .locked = owner_locked, .unlocked = owner_unlocked,
    .extended = owner_extended, .lost = owner_lost, .status = owner_status,
};

/* ---- attach, detach, resume, end ---------------------------------------- */

static void session_on_line(struct conn *c, void *data, char *line,
                            size_t len);
static void session_on_eof(struct conn *c, void *data);
static void session_on_closed(struct conn *c, void *data);

static const struct conn_ops session_conn_ops = {
    .line = session_on_line, .eof = session_on_eof,
    .closed = session_on_closed,
};

/* c serves s from now on; s is listed among the attached sessions right
 * after `after` (the table's head, or the place of the connection's
 * previous session, so the listing keeps connection order). Takes the
 * state's reference. */
static void session_attach(struct session *s, struct conn *c,
                           struct list *after)
{
    s->state = SESSION_ATTACHED;
    s->conn = c;
    s->owner.detached = false;
    snprintf(s->peer, sizeof(s->peer), "%s", c->peer);
    conn_bind(c, &session_conn_ops, s, s->idstr);
    list_insert_after(after, &s->link);
    sessions.count++;
    session_ref(s);
}

/* The connection serving s leaves it (closed, or taken by a resume
 * elsewhere): what that connection asked is withdrawn, and what it was
 * told is its own. s keeps its state's reference. */
static void session_unplug(struct session *s)
{
    list_remove(&s->link);
    sessions.count--;
    s->conn = NULL;
    timer_stop(&s->auth_timer);
    free(s->unlock_lost);
    s->unlock_lost = NULL;
    s->auth_failures = 0;
    session_lost_free(&s->lost, &s->nlost);
    lockmgr_owner_cancel(&s->owner);
}

/* Release everything s holds (died: a drop, so lock_delay applies) and
 * drop the state's reference. */
static void session_end(struct session *s, bool died)
{
    s->state = SESSION_ENDED;
    lockmgr_owner_end(&s->owner, died);
    session_unref(s);
}

/* Detached, its connection gone: keep the leases for detach_ms (at most
 * limits.max_detach_ms as it is now). */
static void session_detach(struct session *s)
{
    unsigned max = sessions.conf->limits.max_detach_ms;

    if (s->detach_ms > max)
        s->detach_ms = max;
    s->state = SESSION_DETACHED;
    s->owner.detached = true;
    s->owner.detached_at = timer_now();
    timer_start(&s->detach_timer, s->detach_ms);
    list_push_head(&sessions.detached, &s->link);
    sessions.ndetached++;
    log_info("%s (%s): connection gone; detached with %zu leases for up to "
             "%u ms", s->idstr, s->peer, s->owner.nleases, s->detach_ms);
}

/* Off the detached table, to be attached again or ended. */
static void session_undetach(struct session *s)
{
    timer_stop(&s->detach_timer);
    list_remove(&s->link);
    sessions.ndetached--;
}

static void session_expire_cb(struct timer *t)
{
    struct session *s = t->data;

    log_info("%s (%s): not resumed within %u ms (detach=); ended, its %zu "
             "leases released", s->idstr, s->peer, s->detach_ms,
             s->owner.nleases);
    session_undetach(s);
    session_end(s, true);
}

/* conn ops->eof: nobody is left to wait for a LOCK's answer. */
static void session_on_eof(struct conn *c, void *data)
{
    struct session *s = data;

    (void)c;
    lockmgr_cut_wait(&s->owner);    /* may answer, and run the queue */
}

/* conn ops->closed: the connection ended. Without QUIT a session that
 * asked for detach= detaches; otherwise it ends. At shutdown every close
 * is the daemon's doing: no lock-delay, no detaching. */
static void session_on_closed(struct conn *c, void *data)
{
    struct session *s = data;
    bool died = c->died && !sessions.shutdown;

    session_unplug(s);
    if (s->detach_ms > 0 && died && sessions.conf->limits.max_detach_ms > 0) {
        session_detach(s);
        return;
    }
    if (sessions.shutdown && s->detach_ms && c->died)
        /* A detachable session's connection dropping is no release, and
         * nothing can resume it now: its leases are left to expire. */
        sessions.abandoned += lockmgr_owner_abandon(&s->owner, &sessions.abandoned_until);
    session_end(s, died);
}

/* The session in `list` named r->resume, if r->secret is its secret (self,
 * the asking session, is never the one). */
static struct session *session_find_in(struct list *list,
                                       const struct session *self,
                                       const struct proto_request *r)
{
    struct list *p;

    list_foreach(p, list) {
        struct session *x = list_entry(p, struct session, link);
        if (x == self || strlen(x->idstr) != r->resume_len ||
            memcmp(x->idstr, r->resume, r->resume_len) != 0)
            continue;
        return x->detach_ms && users_secret_equal(r->secret,
                                                  PROTO_SECRET_LEN, x->secret)
               ? x : NULL;
    }
    return NULL;
}

/* ERR NOSESSION, counted as a wrong password. */
static void resume_refused(struct session *s)
{
    struct conn *c = s->conn;
    unsigned max = sessions.conf->limits.max_auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): HELLO resume= of an unknown session or with a "
               "wrong secret (%u of limits.max_auth_failures=%u)", s->idstr,
               s->peer, s->auth_failures, max);
    conn_err(c, PROTO_ERR_NOSESSION, "no such session, or a wrong secret");
    if (s->auth_failures >= max) {
        conn_stop(c, "too many failed resumes", true);
        conn_close_announced(c, "auth", "too many failed resumes");
    }
}

/* x, attached to another connection, is taken over: that connection is
 * unbound and closed with EVENT CLOSING reason=resumed. */
static void session_take_over(struct session *x, const struct conn *by)
{
    struct conn *old = x->conn;

    session_unplug(x);
    conn_bind(old, NULL, NULL, x->idstr);
    log_info("%s (%s): taken over by a new connection (%s) with %zu "
             "leases", x->idstr, x->peer, by->peer, x->owner.nleases);
    conn_close_now_announced(old, "resumed", "resumed on another "
                             "connection");
}

/* What s's connection was told was lost becomes x's (x was left by its
 * connection, so it has no such list of its own). */
static void session_lost_move(struct session *x, struct session *s)
{
    struct list *p;

    while ((p = list_first(&s->lost))) {
        list_remove(p);
        list_push_tail(&x->lost, p);
    }
    x->nlost = s->nlost;
    s->nlost = 0;
}

/* Who x is after s's connection resumed it: a session that logged in
 * keeps its identity (its user, proven by the secret), whatever s's
 * connection logged in as; one that never did takes s's. (Merging
 * "authed" alone would make a user's connection that resumed a session
 * with no login unrestricted.) */
static void session_resume_identity(struct session *x,
                                    const struct session *s)
{
    if (!x->authed) {
        x->authed = s->authed;
        x->admin = s->admin;
        memcpy(x->user, s->user, sizeof(x->user));
    } else if (!x->user[0]) {
        x->admin |= s->admin;   /* as before users: a password adds */
    }
}

/*
 * HELLO resume=: s's connection serves the session named from now on, if
 * the secret is right; s, which holds nothing, ends. What s's connection
 * was granted (AUTH) carries over, and so do its failures. Returns the
 * session now attached, or NULL when refused (answered).
 */
static struct session *session_resume(struct session *s,
                                      const struct proto_request *r)
{
    struct conn *c = s->conn;
    struct session *x;

    if (s->owner.nleases > 0 || s->owner.nwaits) {
        conn_err(c, PROTO_ERR_ARG, "resume= must come before this "
                 "connection locks anything");
        return NULL;
    }
    if ((x = session_find_in(&sessions.detached, s, r))) {
        session_undetach(x);
        log_info("%s (%s): resumed with %zu leases after %" PRIu64 " ms "
                 "detached", x->idstr, c->peer, x->owner.nleases,
                 timer_now() - x->owner.detached_at);
    } else if ((x = session_find_in(&sessions.attached, s, r))) {
        session_take_over(x, c);
    } else {
        resume_refused(s);
        return NULL;
    }
    session_resume_identity(x, s);
    x->auth_failures = s->auth_failures;
    session_lost_move(x, s);
    session_attach(x, c, &s->link);
    session_unref(x);           /* its previous state's reference */
    session_unplug(s);
    session_end(s, false);      /* holds nothing */
    return x;
}

/* After the reply to a resume: what was lost while detached. */
static void session_tell_untold(struct session *s)
{
    struct list *p;

    /* One at a time: a connection closed halfway through (its output
     * over the limit) leaves the rest for the next resume. */
    while (s->conn && (p = list_first(&s->untold))) {
        struct session_lost *x = list_entry(p, struct session_lost, link);
        list_remove(p);
        s->nuntold--;
        session_lost_add(&s->lost, &s->nlost, false, x->resource, x->fence,
                         x->why);
        conn_event_lost(s->conn, x->resource, x->fence,
                        lockmgr_lost_reason_name(x->why));
        free(x);
    }
}

/* ---- the session table -------------------------------------------------- */

/* One SESSIONS entry; its keys come in the order they always had. */
static json_t *session_json(const struct session *s, uint64_t now)
{
    bool attached = s->state == SESSION_ATTACHED;
    json_t *j = json_pack("{s:s, s:s?, s:s, s:I, s:I}",
                          "id", s->idstr,
                          "name", s->name[0] ? s->name : NULL,
                          "peer", s->peer,
                          "locks", (json_int_t)s->owner.nleases,
                          "waits", (json_int_t)s->owner.nwaits);

    if (attached) {
        json_object_set_new(j, "idle_ms", json_integer(
            (json_int_t)(now - s->conn->last_line_at)));
        json_object_set_new(j, "age_ms", json_integer(
            (json_int_t)(now - s->conn->created_at)));
    } else {
        json_object_set_new(j, "attached", json_false());
        json_object_set_new(j, "detached_ms", json_integer(
            (json_int_t)(now - s->owner.detached_at)));
    }
    json_object_set_new(j, "held", status_leases_json(&s->owner,
                                                             false));
    if (attached)
        json_object_set_new(j, "attached", json_true());
    if (s->user[0])
        json_object_set_new(j, "user", json_string(s->user));
    return j;
}

/* The sessions of user (NULL: every session) in list into arr. */
static void session_list_add(json_t *arr, struct list *list,
                             const char *user, uint64_t now)
{
    struct list *p;

    list_foreach(p, list) {
        const struct session *x = list_entry(p, const struct session, link);
        if (!user || strcmp(x->user, user) == 0)
            json_array_append_new(arr, session_json(x, now));
    }
}

/* SESSIONS as `user` may see it (NULL: all): a user sees its own
 * sessions only, so no other user's resource names reach it. */
static json_t *session_list_user(const char *user)
{
    json_t *arr = json_array();
    uint64_t now = timer_now();

    session_list_add(arr, &sessions.attached, user, now);
    session_list_add(arr, &sessions.detached, user, now);
    return json_pack("{s:o}", "sessions", arr);
}

json_t *session_list_json(void)
{
    return session_list_user(NULL);
}

/* SESSIONS asked by s. */
static json_t *session_list_for(const struct session *s)
{
    return session_list_user(s->user[0] ? s->user : NULL);
}

void session_set_shutdown(void)
{
    sessions.shutdown = true;
}

/* A session that holds leases at shutdown stays open until its client
 * releases them (UNLOCK, QUIT, or closing the connection) or the daemon
 * exits; one that holds none is closed now. */
/* The attached sessions now, each with a reference (session_let_go): a
 * walk that closes connections may end any session of the list, not only
 * the one in hand, so it walks this copy instead. *n: how many. */
static struct session **session_snapshot(size_t *n)
{
    struct session **all = mem_alloc((sessions.count + 1) * sizeof(*all));
    struct list *p;

    *n = 0;
    list_foreach(p, &sessions.attached) {
        struct session *s = list_entry(p, struct session, link);
        session_ref(s);
        all[(*n)++] = s;
    }
    return all;
}

static void session_let_go(struct session **all, size_t n)
{
    for (size_t i = 0; i < n; i++)
        session_unref(all[i]);
    free(all);
}

void session_shutdown_all(void)
{
    struct list *p;
    struct session **all;
    size_t n;

    /* Detached sessions cannot resume any more (nothing is accepted):
     * their leases are left to expire now. */
    while ((p = list_first(&sessions.detached))) {
        struct session *s = list_entry(p, struct session, link);
        sessions.abandoned += lockmgr_owner_abandon(&s->owner, &sessions.abandoned_until);
        session_undetach(s);
        session_end(s, false);
    }
    all = session_snapshot(&n);
    for (size_t i = 0; i < n; i++) {
        struct session *s = all[i];
        struct conn *c = s->conn;
        if (s->state != SESSION_ATTACHED || !c)
            continue;
        conn_ref(c);
        conn_event_shutdown(c);
        lockmgr_owner_shutdown(&s->owner);  /* may answer a waiting LOCK */
        if (s->owner.nleases == 0)
            conn_close_announced(c, "shutdown", "the daemon is shutting "
                                 "down");
        conn_flush(c);
        conn_unref(c);
    }
    session_let_go(all, n);
}

size_t session_abandon_all(uint64_t *until)
{
    size_t n = sessions.abandoned, nall;
    struct session **all;

    if (sessions.abandoned_until > *until)
        *until = sessions.abandoned_until;
    all = session_snapshot(&nall);
    for (size_t i = 0; i < nall; i++) {
        struct session *s = all[i];
        struct conn *c = s->conn;
        if (s->state != SESSION_ATTACHED || !c)
            continue;
        conn_ref(c);
        n += lockmgr_owner_abandon(&s->owner, until);
        conn_close_announced(c, "shutdown", "the daemon is shutting down; "
                             "its leases are left to expire by their ttl");
        conn_flush(c);
        conn_unref(c);
    }
    session_let_go(all, nall);
    return n;
}

void session_close_all(const char *why)
{
    struct list *p;

    while ((p = list_first(&sessions.attached))) {
        struct session *s = list_entry(p, struct session, link);
        conn_close(s->conn, false, why);    /* unplugs s */
    }
}
