/*
 * session, who it is and what it may touch (session_priv.h): logging in
 * (HELLO, with its detach= and resume=; AUTH with the shared password,
 * the operators' password or a user's; a verified client certificate
 * that names a user) and the checks every command makes against the
 * session's user: a user's prefixes (ERR DENIED, audited) and the
 * operators' commands.
 *
 * HELLO resume= is worded here: session.c finds and moves the session,
 * this file says why it refused. A wrong AUTH is answered later, after a
 * delay: its record waits (session_serve_later) and the auth timer's
 * callback, in session_cmd.c, answers it and starts what follows.
 */
#include "session_priv.h"

#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "conn.h"
#include "log.h"
#include "redlock.h"

/* ---- logging in ---------------------------------------------------------- */

bool session_login_required(void)
{
    const struct conf *cf = sessions.conf;

    return cf->auth.password || cf->auth.nusers;
}

/* HELLO detach=: 0 turns it off; above 0 the session gets a secret (kept
 * if it had one). False when refused (answered). */
static bool hello_detach(struct session_serve *v, uint32_t ms)
{
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_detach_ms;

    if (ms == 0) {
        s->detach_ms = 0;
        s->secret[0] = '\0';
        return true;
    }
    if (max == 0) {
        session_say_err(&v->t, PROTO_ERR_ARG, "detach is off on this daemon "
                        "(limits.max_detach_ms is 0)");
        return false;
    }
    if (ms > max) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "detach must be at most %u ms "
                         "(limits.max_detach_ms)", max);
        return false;
    }
    if (!s->secret[0] && redlock_token(s->secret) != 0) {
        s->secret[0] = '\0';
        session_say_err(&v->t, PROTO_ERR_UNAVAILABLE, "the system's random "
                        "source failed; no secret to resume with");
        return false;
    }
    s->detach_ms = ms;
    return true;
}

/* ERR <code> <msg>, untagged, on s's connection (counted): HELLO is
 * never tagged. */
static void hello_err(struct session *s, enum proto_err code,
                      const char *msg)
{
    const struct session_to t = { s, NULL, 0 };

    session_say_err(&t, code, msg);
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
    hello_err(s, PROTO_ERR_NOSESSION, "no such session, or a wrong secret");
    if (s->auth_failures >= max) {
        conn_stop(c, "too many failed resumes", true);
        conn_close_announced(c, "auth", "too many failed resumes");
    }
}

/* HELLO resume=: the session named, served by this connection from now
 * on (session_resume), or NULL when refused (answered). */
static struct session *hello_resume(struct session_serve *v)
{
    struct session *s = v->t.s, *x;

    if (s->owner.nleases > 0 || s->owner.nwaits) {
        hello_err(s, PROTO_ERR_ARG, "resume= must come before this connection "
                  "locks anything");
        return NULL;
    }
    if (!(x = session_resume(s, v->r)))
        resume_refused(s);
    return x;
}

void session_cmd_hello(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    bool resume = r->has & PROTO_OPT_RESUME;
    struct sbuf *b;

    if ((r->has & PROTO_OPT_DETACH) && !hello_detach(v, r->detach))
        return;
    /* Resumed, the connection serves the session named from now on: the
     * rest of the HELLO is that session's. */
    if (resume && !(s = hello_resume(v)))
        return;
    v->t.s = s;
    /* Answering may close the connection (output over its limit): the
     * session resumed then detaches again, or ends, under us. */
    session_ref(s);
    if (r->has & PROTO_OPT_NAME)
        snprintf(s->name, sizeof(s->name), "%.*s", (int)r->name_len, r->name);
    if ((r->has & PROTO_OPT_KEEPALIVE) && s->conn)
        conn_set_keepalive(s->conn, r->keepalive);
    if ((b = session_say(&v->t))) {
        proto_format_ok_begin(b);
        proto_format_kv_u64(b, "proto", PROTO_VERSION);
        proto_format_kv_str(b, "session", s->idstr);
        proto_format_kv_str(b, "server", "redlockd/" REDLOCKD_VERSION);
        proto_format_kv_u64(b, "nodes", (uint64_t)redlock_nnodes());
        proto_format_kv_u64(b, "quorum", (uint64_t)redlock_nquorum());
        if (s->detach_ms && (r->has & PROTO_OPT_DETACH))
            proto_format_kv_str(b, "secret", s->secret);
        if (resume)
            proto_format_kv_u64(b, "resumed", s->owner.nleases);
        proto_format_end(b);
    }
    session_tell_untold(s);
    if (resume)
        watch_client_resend(&s->watch);
    if (s->name[0])
        log_debug("%s is %s", s->idstr, s->name);
    session_unref(s);
}

/* who: "" for AUTH <password>, else what the log may say of the user. */
static void auth_failed(struct session_serve *v, const char *who)
{
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_auth_failures;
    uint64_t delay = 100 * (uint64_t)s->auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): wrong password%s (%u of "
               "limits.max_auth_failures=%u)", s->idstr, s->peer, who,
               s->auth_failures, max);
    if (s->auth_failures >= max) {
        session_say_err(&v->t, PROTO_ERR_AUTH, "invalid password; too many "
                        "failures, closing (limits.max_auth_failures)");
        conn_stop(s->conn, "too many wrong passwords", true);
        conn_close_announced(s->conn, "auth", "too many wrong passwords");
        return;
    }
    s->auth_q = session_serve_later(v);
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

const struct users_user *session_user(const struct session *s)
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
 * done, after the session was made: each line asks until s is logged
 * in). A CN that names no user changes nothing: the client may still
 * AUTH. A session already a user's stays that user. */
void session_login_cert(struct session *s)
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
static void cmd_auth_user(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const struct conf *cf = sessions.conf;
    const struct users_user *u;
    char who[USERS_NAME_MAX + 16];
    bool ok;

    if (!cf->auth.nusers) {
        session_say_err(&v->t, PROTO_ERR_AUTH, "no users are configured "
                        "(auth.users): send AUTH <password>");
        return;
    }
    u = users_find(cf->auth.users, cf->auth.nusers, r->args[0],
                   r->args_len[0]);
    ok = users_secret_equal(r->args[1], r->args_len[1],
                            u ? u->password : cf->auth.users[0].password);
    if (u && ok) {
        session_log_in(s, u, "with a password");
        session_say_ok(&v->t);
        return;
    }
    if (u)
        snprintf(who, sizeof(who), " for user %s", u->name);
    else
        snprintf(who, sizeof(who), " (an unknown user name)");
    auth_failed(v, who);
}

void session_cmd_auth(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const char *pw = sessions.conf->auth.password;
    const char *admin = sessions.conf->auth.admin_password;

    /* A session's user never changes: its leases were taken, and are
     * checked, under that user's prefixes (also after a resume by another
     * user's connection). Refused before any password is compared, so it
     * costs no failure and tells nothing. */
    if (s->user[0]) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "this session is user %s's, "
                         "and a session's user never changes (AUTH on a new "
                         "connection)", s->user);
        return;
    }
    if (r->nargs == 2) {
        cmd_auth_user(v);
        return;
    }
    if (!pw && !admin) {
        session_say_errf(&v->t, PROTO_ERR_AUTH, "no password is configured%s",
                         sessions.conf->auth.nusers ? "; send AUTH <user> "
                         "<password>" : "");
        return;
    }
    if (admin && users_secret_equal(r->arg, r->arg_len, admin)) {
        s->authed = s->admin = true;
        s->user[0] = '\0';
        log_notice("%s (%s): authenticated as an operator (admin password)",
                   s->idstr, s->peer);
        session_say_ok(&v->t);
    } else if (pw && users_secret_equal(r->arg, r->arg_len, pw)) {
        s->authed = true;
        s->user[0] = '\0';
        session_say_ok(&v->t);
    } else {
        auth_failed(v, "");
    }
}

/* ---- users: what lies within a user's prefixes --------------------------- */

_Static_assert(PROTO_CMD_COUNT <= 32, "denied_told has a bit per command");

/* ERR DENIED. The audit line goes out at notice once per session and
 * command, later ones at debug: a client looping on a refused name cannot
 * flood the log. res may be NULL (READMIT). */
void session_deny(struct session_serve *v, enum proto_cmd cmd,
                  const char *res, size_t len, const char *why)
{
    struct session *s = v->t.s;
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
        session_say_errf(&v->t, PROTO_ERR_DENIED,
                         "user %s may not %s %.*s: %s", s->user, what, n, res,
                         why);
    else
        session_say_errf(&v->t, PROTO_ERR_DENIED, "user %s may not %s: %s",
                         s->user, what, why);
}

/* May the session do cmd to each of res[0..n)? A session of no user may
 * (the shared password, or no login at all, as before users); a user's,
 * only within its prefixes. False when refused (answered ERR DENIED). */
bool session_may(struct session_serve *v, enum proto_cmd cmd,
                 const char *const *res, const size_t *len, size_t n)
{
    const struct users_user *u;

    if (!v->t.s->user[0])
        return true;
    u = session_user(v->t.s);
    for (size_t i = 0; i < n; i++) {
        if (u && users_allows(u, res[i], len[i]))
            continue;
        session_deny(v, cmd, res[i], len[i], u ? "outside the user's "
                     "prefixes" : "the user is no longer configured");
        return false;
    }
    return true;
}

/* ---- operators ----------------------------------------------------------- */

/* A user's FORCEUNLOCK (res) or READMIT (res NULL): an admin user's,
 * within its prefixes; READMIT concerns every resource, so it needs the
 * prefix "" too. */
static bool session_user_operates(struct session_serve *v,
                                  enum proto_cmd cmd, const char *res,
                                  size_t len)
{
    const struct users_user *u = session_user(v->t.s);

    if (u && !u->admin) {
        session_deny(v, cmd, res, len, "not an admin user");
        return false;
    }
    if (res)
        return session_may(v, cmd, &res, &len, 1);
    if (!u || !users_allows_all(u)) {
        session_deny(v, cmd, NULL, 0, u ? "it concerns every resource: "
                     "only an admin user with the prefix \"\" may" :
                     "the user is no longer configured");
        return false;
    }
    return true;
}

/* An operator's: one check shared by FORCEUNLOCK (res) and READMIT (res
 * NULL). */
bool session_is_operator(struct session_serve *v, enum proto_cmd cmd,
                         const char *res, size_t len)
{
    struct session *s = v->t.s;
    const char *what = proto_cmd_name(cmd);

    if (s->user[0])
        return session_user_operates(v, cmd, res, len);
    if (!sessions.conf->auth.admin_password) {
        session_say_errf(&v->t, PROTO_ERR_NOAUTH, "%s is disabled: no "
                         "auth.admin_password is configured", what);
        return false;
    }
    if (!s->admin) {
        session_say_errf(&v->t, PROTO_ERR_NOAUTH, "%s needs AUTH with the "
                         "admin password", what);
        return false;
    }
    return true;
}
