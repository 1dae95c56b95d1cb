/*
 * session, what is held and who may change it (session_priv.h): LOCKS
 * (this session's leases), STATUS (one resource as the nodes see it),
 * TOP, STATS and SESSIONS, each narrowed to a user's prefixes; WATCH and
 * UNWATCH (watch.c reads the states and says EVENT HOLDER); and the
 * operators' FORCEUNLOCK and READMIT. The JSON is status.c's, stats.c's
 * and session.c's; this file checks, asks and answers.
 */
#include "session_priv.h"

#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "node.h"
#include "rclass.h"
#include "stats.h"
#include "status.h"

/* ---- what is held and waited for ----------------------------------------- */

void session_cmd_locks(struct session_serve *v)
{
    struct session *s = v->t.s;
    json_t *lost = json_array();
    struct list *p;

    list_foreach(p, &s->lost)
        json_array_append_new(lost, json_string(
            list_entry(p, struct session_lost, link)->resource));
    session_say_json(&v->t, json_pack("{s:s, s:o, s:o}", "session",
                                      s->idstr, "locks",
                                      status_leases_json(&s->owner, true),
                                      "lost", lost));
}

void session_cmd_status(struct session_serve *v)
{
    const struct proto_request *r = v->r;

    if (!session_may(v, r->cmd, &r->arg, &r->arg_len, 1))
        return;
    if (r->limit > sessions.conf->locks.max_limit) {
        session_say_errf(&v->t, PROTO_ERR_ARG,
                         "limit must be between 1 and %u (locks.max_limit)",
                         sessions.conf->locks.max_limit);
        return;
    }
    lockmgr_status(&v->t.s->owner, r->arg, r->arg_len, r->limit,
                   session_serve_later(v));
}

void session_answer_status(const struct sreq *q,
                           const struct lockmgr_status *st)
{
    const struct session_to t = session_req_to(q);

    session_say_json(&t, status_json(st));
}

static bool top_visible(void *ud, const char *res, size_t len)
{
    return users_allows(ud, res, len);
}

/* TOP: this daemon's resources with holders or waiters, the longest wait
 * first; a user sees those within its prefixes only, as for STATUS. */
void session_cmd_top(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    const struct session *s = v->t.s;
    struct lockmgr_top_view top[LOCKMGR_TOP_MAX];
    const struct users_user *u = NULL;
    size_t n, total;

    if (r->limit > LOCKMGR_TOP_MAX) {
        session_say_errf(&v->t, PROTO_ERR_ARG,
                         "limit must be between 1 and %d", LOCKMGR_TOP_MAX);
        return;
    }
    if (s->user[0] && !(u = session_user(s))) {
        session_deny(v, r->cmd, NULL, 0, "the user is no longer configured");
        return;
    }
    total = lockmgr_top(top, r->limit ? r->limit : LOCKMGR_TOP_DEFAULT, &n,
                        u ? top_visible : NULL, (void *)u);
    session_say_json(&v->t, status_top_json(sessions.conf->id, top, n,
                                            total));
}

/*
 * STATS: the same for all but its per-class histograms, whose class names
 * are the starts of resource names: a user sees "other" and the classes
 * its prefixes overlap, never another user's names (docs/protocol.md,
 * "Users and prefixes").
 */
static json_t *stats_for(const struct session *s)
{
    const struct users_user *u = s->user[0] ? session_user(s) : NULL;
    json_t *st = stats_json(), *classes, *c;
    const char *name;
    void *tmp;

    if (!s->user[0])
        return st;
    classes = json_object_get(st, "classes");
    json_object_foreach_safe(classes, tmp, name, c) {
        if (strcmp(name, RCLASS_OTHER_NAME) != 0 &&
            !(u && users_overlaps(u, name, strlen(name))))
            json_object_del(classes, name);
    }
    return st;
}

void session_cmd_stats(struct session_serve *v)
{
    session_say_json(&v->t, stats_for(v->t.s));
}

/* SESSIONS: a user's own sessions, or every session (session.c). */
void session_cmd_sessions(struct session_serve *v)
{
    session_say_json(&v->t, session_list_for(v->t.s));
}

/* ---- watching ------------------------------------------------------------ */

/* "OK watching=<n>" */
static void say_watching(struct session_serve *v)
{
    struct sbuf *b = session_say(&v->t);

    if (b) {
        proto_format_ok_begin(b);
        proto_format_kv_u64(b, "watching", v->t.s->watch.n);
        proto_format_end(b);
    }
}

/* WATCH: the state of each now (EVENT HOLDER, after the OK), then each
 * change; at most limits.max_watches per session, all or none. */
void session_cmd_watch(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_watches;
    size_t fresh;

    if (!session_may(v, r->cmd, r->args, r->args_len, r->nargs))
        return;
    fresh = watch_client_new(&s->watch, r->args, r->args_len, r->nargs);
    if (s->watch.n + fresh > max) {
        session_say_errf(&v->t, PROTO_ERR_LIMIT, "this session watches %zu "
                         "resources; %zu more would pass "
                         "limits.max_watches (%u)", s->watch.n, fresh, max);
        return;
    }
    /* The states follow the OK: each is read from the nodes first. */
    watch_add(&s->watch, r->args, r->args_len, r->nargs);
    say_watching(v);
}

void session_cmd_unwatch(struct session_serve *v)
{
    const struct proto_request *r = v->r;

    watch_remove(&v->t.s->watch, r->args, r->args_len, r->nargs);
    say_watching(v);
}

/* ---- operators ----------------------------------------------------------- */

void session_cmd_forceunlock(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;

    if (!session_is_operator(v, r->cmd, r->arg, r->arg_len))
        return;
    if (s->user[0])
        log_notice("%s (name=%s peer=%s) user %s: FORCEUNLOCK %.*s",
                   s->idstr, s->name[0] ? s->name : "-", s->peer, s->user,
                   (int)r->arg_len, r->arg);
    lockmgr_force_release(&s->owner, r->arg, r->arg_len,
                          session_serve_later(v));
}

/* End a node's recovery now: the operator knows no lock outlived it. */
void session_cmd_readmit(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    char node[128], msg[512];
    struct sbuf *b;
    int n;

    if (!session_is_operator(v, r->cmd, NULL, 0))
        return;
    snprintf(node, sizeof(node), "%.*s", (int)r->arg_len, r->arg);
    n = node_end_recovery(node, msg, sizeof(msg));
    if (n < 0) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "%s",
                         msg[0] ? msg : "no such node");
        return;
    }
    log_notice("%s (name=%s peer=%s%s%s) READMIT %s: %s", s->idstr,
               s->name[0] ? s->name : "-", s->peer, s->user[0] ? " user=" : "",
               s->user, node, msg);
    if ((b = session_say(&v->t))) {
        proto_format_ok_begin(b);
        proto_format_kv_u64(b, "readmitted", (uint64_t)n);
        proto_format_end(b);
    }
}
