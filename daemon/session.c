/*
 * session: a client's session, its life (see session.h for its states;
 * session_priv.h for how the work is split with the command files).
 *
 * This file is the session object, its references, the table of attached
 * and detached sessions, what the end of a connection makes of it (detach
 * or end), resume and takeover, the lists of leases lost, the events it
 * says on its own (EVENT LOST, EVENT HOLDER), SESSIONS, and shutdown. It
 * is the bottom of the session's files: what serves the session's lines
 * (session_cmd.c, above it) made it with session_new and a table of
 * struct session_ops, and this file reaches that layer only through that
 * table (the connection's calls, lockmgr's answers, withdrawing a
 * connection's requests, the requests in flight in SESSIONS), never by
 * name.
 */
#include "session_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf.h"
#include "conn.h"
#include "log.h"
#include "mem.h"
#include "status.h"

struct session_table sessions = { .attached = LIST_INIT(sessions.attached),
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

static void session_expire_cb(struct timer *t);
static void session_attach(struct session *s, struct conn *c,
                           struct list *after);

struct session *session_new(struct conn *c, const struct session_ops *ops)
{
    struct session *s = mem_alloc(sizeof(*s));

    s->ops = ops;
    s->id = ++sessions.next_id;
    snprintf(s->idstr, sizeof(s->idstr), "s%" PRIu64 ".%s", s->id, sessions.epoch);
    list_init(&s->link);
    list_init(&s->lost);
    list_init(&s->untold);
    list_init(&s->reqs);
    list_init(&s->ready);
    lockmgr_owner_init(&s->owner, ops->owner, s->idstr, s->name, s->peer);
    watch_client_init(&s->watch, session_say_watch);
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

/* Add a lost lease to list (bounded like the leases themselves): at the
 * head, or at the tail for oldest first. */
void session_lost_add(struct list *list, size_t *n, bool tail,
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

/* The record that the lease on res was lost and told (s->lost), or
 * NULL. */
static struct session_lost *session_lost_find(const struct session *s,
                                              const char *res, size_t len)
{
    const struct list *p;

    list_foreach(p, &s->lost) {
        struct session_lost *x = list_entry(p, struct session_lost, link);
        if (strlen(x->resource) == len && memcmp(x->resource, res, len) == 0)
            return x;
    }
    return NULL;
}

bool session_was_lost(const struct session *s, const char *res, size_t len)
{
    return session_lost_find(s, res, len) != NULL;
}

/* Forget that the lease on res was lost; true if it was. */
bool session_take_lost(struct session *s, const char *res, size_t len)
{
    struct session_lost *x = session_lost_find(s, res, len);

    if (!x)
        return false;
    list_remove(&x->link);
    free(x);
    s->nlost--;
    return true;
}

/* ---- what it says on its own -------------------------------------------- */

/* An EVENT HOLDER line for a watcher (watch.h); a detached session hears
 * the state again when resumed. */
void session_say_watch(struct watch_client *c, const char *line, size_t len)
{
    struct session *s = container_of(c, struct session, watch);
    struct sbuf *b = s->conn ? conn_reply(s->conn) : NULL;

    if (b)
        sbuf_append(b, line, len);
}

void session_say_lost(struct session *s, const char *resource,
                      uint64_t fence, enum lockmgr_lost_reason why)
{
    struct sbuf *b = s->conn ? conn_reply(s->conn) : NULL;

    if (b)
        proto_format_event_lost(b, resource, fence,
                                lockmgr_lost_reason_name(why));
}

/* ---- attach, detach, resume, end ---------------------------------------- */

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
    conn_bind(c, s->ops->conn, s, s->idstr);
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
    s->ops->withdraw(s);
    s->auth_failures = 0;
    session_lost_free(&s->lost, &s->nlost);
    lockmgr_owner_cancel(&s->owner);
}

/* Release everything s holds (died: a drop, so lock_delay applies) and
 * drop the state's reference. */
static void session_end(struct session *s, bool died)
{
    s->state = SESSION_ENDED;
    watch_client_clear(&s->watch);
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

/* conn ops->closed: the connection ended. Without QUIT a session that
 * asked for detach= detaches; otherwise it ends. At shutdown every close
 * is the daemon's doing: no lock-delay, no detaching. */
void session_on_closed(struct conn *c, void *data)
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
 * the secret is right; s, which holds nothing (the caller checked), ends.
 * What s's connection was granted (AUTH) carries over, and so do its
 * failures. Returns the session now attached, or NULL when no session of
 * that name has that secret (nothing is answered: the caller says so).
 */
struct session *session_resume(struct session *s,
                               const struct proto_request *r)
{
    struct conn *c = s->conn;
    struct session *x;

    if ((x = session_find_in(&sessions.detached, s, r))) {
        session_undetach(x);
        log_info("%s (%s): resumed with %zu leases after %" PRIu64 " ms "
                 "detached", x->idstr, c->peer, x->owner.nleases,
                 timer_now() - x->owner.detached_at);
    } else if ((x = session_find_in(&sessions.attached, s, r))) {
        session_take_over(x, c);
    } else {
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

void session_tell_untold(struct session *s)
{
    struct list *p;
    struct sbuf *b;

    /* One at a time: a connection that cannot take more output (its
     * client reads nothing) leaves the rest for the next resume. */
    while (s->conn && (p = list_first(&s->untold)) &&
           (b = conn_reply(s->conn))) {
        struct session_lost *x = list_entry(p, struct session_lost, link);
        list_remove(p);
        s->nuntold--;
        proto_format_event_lost(b, x->resource, x->fence,
                                lockmgr_lost_reason_name(x->why));
        session_lost_add(&s->lost, &s->nlost, false, x->resource, x->fence,
                         x->why);
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
        s->ops->inflight_json(s, j);
    if (attached)
        json_object_set_new(j, "attached", json_true());
    json_object_set_new(j, "watching", json_integer((json_int_t)s->watch.n));
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

json_t *session_list_for(const struct session *s)
{
    return session_list_user(s->user[0] ? s->user : NULL);
}

void session_set_shutdown(void)
{
    sessions.shutdown = true;
}

bool session_shutting_down(void)
{
    return sessions.shutdown;
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
        struct sbuf *b = conn_reply(c);
        conn_ref(c);
        if (b)
            proto_format_event_shutdown(b);
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
