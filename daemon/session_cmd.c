/*
 * session, what its lines mean (session_priv.h): the commands, auth and
 * users, the answers lockmgr gives, and the requests in flight.
 *
 * The upper of the session's two files. It makes each session
 * (session_create: session.c's session_new, handed this file's struct
 * session_ops) and owns what a session is called through: the table a
 * connection calls (its lines are commands here, its end is session.c's
 * session_on_closed) and lockmgr's owner callbacks. session.c, the life
 * below, calls back up only through that table: to withdraw what a
 * connection that leaves asked, and for the requests in flight that
 * SESSIONS shows. HELLO resume= is worded here too: session.c finds and
 * moves the session, this file says why it refused.
 *
 * Requests in flight. A line is parsed as it arrives. One that can run
 * runs at once: its answer goes out now (PING, HELP, LOCKS, an error) or,
 * when it needs Redis, later, from one of the lockmgr owner callbacks
 * ("answers from lockmgr"); meanwhile it is a struct sreq on s->reqs, in
 * the order read, which lockmgr's answer finds again through its `ask`.
 * The rules (protocol.md, "Tagged requests"):
 *
 *   - a tagged request ("#<tag> LOCK ...") runs as soon as it is read,
 *     unless a request read before it and not yet answered names one of
 *     its resources: then it waits for it (the resource's queue in
 *     s->order, one struct sreq_pos per resource it names);
 *   - an untagged request runs alone: after every request read before it
 *     was answered, and the connection gives no more lines (conn_pause)
 *     until it is answered, so no request read after it starts before;
 *   - at most limits.max_inflight tagged requests are unanswered at a
 *     time: beyond, the connection is paused until some are answered (the
 *     client's bytes wait in the kernel, as for max_pipeline);
 *   - HELLO, AUTH and QUIT are never tagged; a tag still in use is refused.
 *
 * A request that must wait keeps its line (with the separators the parser
 * cut put back) and is parsed again when its turn comes; its turn comes
 * when the one before it is answered (sreq_done puts it on s->ready, and
 * one loop, not recursion, starts what is ready: a run of requests
 * answered at once, such as a thousand ERR HELD, cannot grow the stack).
 * Every reply is one line with its request's "#<tag> " in front, written
 * into the connection's buffer (conn_reply, proto's formatters), which is
 * written at the end of the loop turn: the answers of a turn leave in one
 * write.
 */
#include "session_priv.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "conn.h"
#include "log.h"
#include "mem.h"
#include "node.h"
#include "rclass.h"
#include "redlock.h"
#include "stats.h"
#include "status.h"
#include "wording.h"

/* What the sessions count (session.h), and who times their LOCKs. */
static struct session_counters counters;
static const struct session_observer *observer;

/* Room for the nodes' own explanation in an ERR UNAVAILABLE line. */
#define SESSION_WHY_SIZE 512
/* SESSIONS lists at most this many of a session's requests in flight (it
 * counts them all): its reply stays far below limits.max_output_bytes. */
#define SESSION_INFLIGHT_SHOWN 16

struct sres;

/* One resource a request names, in that resource's queue. */
struct sreq_pos {
    struct list link;               /* in sres->fifo */
    struct sres *r;
    struct sreq *q;
};

/* A resource some request of this session names: its requests in the
 * order read. Lives while it has any. */
struct sres {
    struct hmap_node node;          /* in s->order */
    struct list fifo;               /* struct sreq_pos */
    char name[];
};

/* A request read and not answered yet. */
struct sreq {
    struct list link;               /* in s->reqs, in the order read */
    struct list rlink;              /* in s->ready when its turn came */
    struct hmap_node tnode;         /* in s->tags (tagged) */
    struct session *s;
    enum proto_cmd cmd;
    bool tagged;
    bool running;                   /* started: its answer is due */
    bool in_run;                    /* its command runs (sreq_run): an
                                       answer given meanwhile (lockmgr may
                                       answer at once) only marks it */
    bool answered;                  /* so marked */
    bool unlinked;                  /* off every queue (withdrawn, or
                                       answered) */
    size_t tag_len;
    char tag[PROTO_MAX_TAG + 1];
    uint64_t started_ns;            /* LOCK, ADOPT: for the histograms */
    bool waited;                    /* LOCK allowed a wait */
    char *unlock_lost;              /* (owned) UNLOCK of several: the lost
                                       one its answer names */
    char *line;                     /* waiting: its line (in this
                                       allocation, after pos), to run */
    size_t linelen;
    size_t npos;
    struct sreq_pos pos[];
};

/* Where an answer goes: the session's connection, with the tag of the
 * request (NULL: untagged). */
struct to {
    struct session *s;
    const char *tag;
    size_t tag_len;
};

/* The request being served by a command. */
struct serve {
    struct to t;
    const struct proto_request *r;
    struct sreq *q;                 /* its record: set when it waits for
                                       an answer (serve_later), or when it
                                       had to wait for its turn */
};

static void sreq_done(struct sreq *q);
static void sreq_flow(struct session *s);

/* ---- replies: one line each, "#<tag> " first --------------------------- */

static struct to sreq_to(const struct sreq *q)
{
    return (struct to){ q->s, q->tagged ? q->tag : NULL, q->tag_len };
}

/* The buffer for one reply line to t, its tag written; NULL when nobody
 * can hear it (no connection, or one being closed). */
static struct sbuf *say(const struct to *t)
{
    struct sbuf *b = t->s->conn ? conn_reply(t->s->conn) : NULL;

    if (b && t->tag)
        proto_format_tag(b, t->tag, t->tag_len);
    return b;
}

/* The cells a command and an error code are counted in: "other" (the
 * NONE cell) for a value outside the table. */
static size_t command_cell(enum proto_cmd cmd)
{
    return (int)cmd > PROTO_CMD_NONE && cmd < PROTO_CMD_COUNT
           ? (size_t)cmd : PROTO_CMD_NONE;
}

static size_t error_cell(enum proto_err code)
{
    return (int)code > PROTO_ERR_NONE && code < PROTO_ERR_COUNT
           ? (size_t)code : PROTO_ERR_NONE;
}

static void say_err(const struct to *t, enum proto_err code, const char *msg)
{
    struct sbuf *b = say(t);

    counters.errors[error_cell(code)]++;
    if (b)
        proto_format_err(b, code, msg);
}

static void say_errf(const struct to *t, enum proto_err code,
                     const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say_errf(const struct to *t, enum proto_err code,
                     const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + SESSION_WHY_SIZE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    say_err(t, code, msg);
}

/* A refusal of command cmd, worded (wording.h). */
static void say_refusal(const struct to *t, enum proto_cmd cmd,
                        const struct lockmgr_refusal *no)
{
    char msg[PROTO_MAX_ERRMSG + SESSION_WHY_SIZE];

    say_err(t, wording_refusal(cmd, no, msg, sizeof(msg)), msg);
}

static void say_ok(const struct to *t)
{
    struct sbuf *b = say(t);

    if (b)
        proto_format_ok(b);
}

/* "OK <json>"; takes the reference to j. */
static void say_json(const struct to *t, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    struct sbuf *b;

    json_decref(j);
    if (!text) {
        say_err(t, PROTO_ERR_LIMIT, "out of memory building the reply");
        return;
    }
    if ((b = say(t)))
        proto_format_ok_json(b, text);
    free(text);
}

/* ERR <code> <msg>, untagged, on s's connection (counted). */
static void session_say_err(struct session *s, enum proto_err code,
                            const char *msg)
{
    const struct to t = { s, NULL, 0 };

    say_err(&t, code, msg);
}


/* ---- requests in flight -------------------------------------------------- */

/* What proto_parse checks against: locks.max_value_len is live (SIGHUP),
 * locks.max_resource_len is not (lockmgr sizes its key buffer by it). */
static const struct proto_limits *parse_limits(void)
{
    sessions.limits.max_value_len = sessions.conf->locks.max_value_len;
    return &sessions.limits;
}

/* The resources r names that its order may depend on. */
static size_t req_resources(const struct proto_request *r,
                            const char *const **res, const size_t **len)
{
    switch (r->cmd) {
    case PROTO_CMD_LOCK:
    case PROTO_CMD_UNLOCK:
    case PROTO_CMD_ADOPT:
        *res = r->args;
        *len = r->args_len;
        return r->nargs;
    case PROTO_CMD_EXTEND:
    case PROTO_CMD_STATUS:
    case PROTO_CMD_FORCEUNLOCK:
        *res = &r->arg;
        *len = &r->arg_len;
        return r->arg ? 1 : 0;
    default:
        return 0;
    }
}

/* Would a tagged request naming these resources have to wait for one
 * read before it? */
static bool resources_busy(const struct session *s, const char *const *res,
                           const size_t *len, size_t n)
{
    for (size_t i = 0; s->order && i < n; i++)
        if (hmap_get(s->order, res[i], len[i]))
            return true;
    return false;
}

static bool tag_in_use(const struct session *s, const char *tag, size_t len)
{
    return s->tags && hmap_get(s->tags, tag, len);
}

/* q's place in the queue of each resource it names. */
static void sreq_enqueue(struct sreq *q, const char *const *res,
                         const size_t *len)
{
    struct session *s = q->s;

    if (q->npos && !s->order) {
        s->order = mem_alloc(sizeof(*s->order));
        hmap_init(s->order);
    }
    for (size_t i = 0; i < q->npos; i++) {
        struct hmap_node *n = hmap_get(s->order, res[i], len[i]);
        struct sres *r;
        if (n) {
            r = container_of(n, struct sres, node);
        } else {
            r = mem_alloc(sizeof(*r) + len[i] + 1);
            memcpy(r->name, res[i], len[i]);
            list_init(&r->fifo);
            hmap_put(s->order, &r->node, r->name, len[i]);
        }
        q->pos[i].r = r;
        q->pos[i].q = q;
        list_push_tail(&r->fifo, &q->pos[i].link);
    }
}

/* The record of r, read on s: last in s->reqs, in the queues of its
 * resources. line (len bytes), when given, is kept to run it later. */
static struct sreq *sreq_new(struct session *s, const struct proto_request *r,
                             const char *line, size_t len)
{
    const char *const *res = NULL;
    const size_t *rlen = NULL;
    size_t n = req_resources(r, &res, &rlen);
    struct sreq *q = mem_alloc(sizeof(*q) + n * sizeof(q->pos[0]) +
                               (line ? len + 1 : 0));

    q->s = s;
    q->cmd = r->cmd;
    q->npos = n;
    list_init(&q->rlink);
    if (line) {
        q->line = (char *)&q->pos[n];
        memcpy(q->line, line, len);
        q->linelen = len;
    }
    if (r->tag) {
        q->tagged = true;
        q->tag_len = r->tag_len;
        memcpy(q->tag, r->tag, r->tag_len);
        if (!s->tags) {
            s->tags = mem_alloc(sizeof(*s->tags));
            hmap_init(s->tags);
        }
        hmap_put(s->tags, &q->tnode, q->tag, q->tag_len);
        s->ntagged++;
    }
    list_push_tail(&s->reqs, &q->link);
    sreq_enqueue(q, res, rlen);
    return q;
}

/* May q run now? An untagged one when it is the only one left; a tagged
 * one when it is first in the queue of each resource it names. */
static bool sreq_may_start(const struct sreq *q)
{
    if (!q->tagged)
        return list_first(&q->s->reqs) == &q->link;
    for (size_t i = 0; i < q->npos; i++)
        if (list_first(&q->pos[i].r->fifo) != &q->pos[i].link)
            return false;
    return true;
}

static void sreq_ready(struct sreq *q)
{
    if (!q->running && !list_linked(&q->rlink) && sreq_may_start(q))
        list_push_tail(&q->s->ready, &q->rlink);
}

/* Off every queue and table; the requests whose turn it was are ready. */
static void sreq_unlink(struct sreq *q)
{
    struct session *s = q->s;

    q->unlinked = true;
    list_remove(&q->link);
    if (list_linked(&q->rlink))
        list_remove(&q->rlink);
    if (q->tagged) {
        hmap_del(s->tags, &q->tnode);
        s->ntagged--;
    }
    for (size_t i = 0; i < q->npos; i++) {
        struct sres *r = q->pos[i].r;
        list_remove(&q->pos[i].link);
        if (list_empty(&r->fifo)) {
            hmap_del(s->order, &r->node);
            free(r);
        } else {
            sreq_ready(list_entry(list_first(&r->fifo), struct sreq_pos,
                                  link)->q);
        }
    }
    /* An untagged request waits for everything before it. */
    struct list *first = list_first(&s->reqs);
    if (first)
        sreq_ready(list_entry(first, struct sreq, link));
}

static void sreq_free(struct sreq *q)
{
    free(q->unlock_lost);
    free(q);
}

static void sreq_run(struct session *s, const struct proto_request *r,
                     struct sreq *q);

/* Run what is ready, in order; one loop, not recursion. */
static void sreq_start_ready(struct session *s)
{
    struct list *p;

    if (s->starting)
        return;
    s->starting = true;
    session_ref(s);
    while (s->conn && (p = list_first(&s->ready))) {
        struct sreq *q = list_entry(p, struct sreq, rlink);
        struct proto_request r;
        struct proto_error err;

        list_remove(p);
        /* It parsed when read: the same line parses the same now. */
        if (proto_parse(q->line, q->linelen, parse_limits(), &r,
                        &err) != PROTO_PARSE_OK) {
            const struct to t = sreq_to(q);
            say_err(&t, err.code, err.msg);
            sreq_done(q);
            continue;
        }
        sreq_run(s, &r, q);
    }
    s->starting = false;
    sreq_flow(s);
    session_unref(s);
}

/* q is answered. While its command still runs, that is only noted:
 * sreq_run finishes it. */
static void sreq_done(struct sreq *q)
{
    struct session *s = q->s;

    if (q->in_run) {
        q->answered = true;
        return;
    }
    if (!q->unlinked)
        sreq_unlink(q);
    sreq_free(q);
    sreq_start_ready(s);
}

/* Lines wait while an untagged request is unanswered (it runs alone), or
 * while max_inflight tagged ones are. */
static void sreq_flow(struct session *s)
{
    struct list *last = list_last(&s->reqs);
    bool barrier = last && !list_entry(last, struct sreq, link)->tagged;
    bool full = s->ntagged >= sessions.conf->limits.max_inflight;
    bool pause = s->conn && (barrier || full);

    if (pause == s->paused || !s->conn)
        return;
    s->paused = pause;
    if (pause)
        conn_pause(s->conn);
    else
        conn_resume(s->conn);
}

static bool session_cmd_busy(const struct session *s)
{
    return !list_empty(&s->reqs);
}

/* The connection leaves s (closed, detached, taken over): its requests in
 * flight are withdrawn (their answers will not come: lockmgr's owner was
 * cancelled), what it was told goes with it. */
static void session_cmd_withdraw(struct session *s)
{
    struct list *p;

    timer_stop(&s->auth_timer);
    s->auth_q = NULL;
    while ((p = list_first(&s->reqs))) {
        struct sreq *q = list_entry(p, struct sreq, link);
        sreq_unlink(q);
        if (q->in_run)
            q->answered = true;     /* sreq_run frees it */
        else
            sreq_free(q);
    }
    list_init(&s->ready);
    if (s->order) {
        hmap_deinit(s->order);
        free(s->order);
        s->order = NULL;
    }
    if (s->tags) {
        hmap_deinit(s->tags);
        free(s->tags);
        s->tags = NULL;
    }
    s->paused = false;
}

/* SESSIONS: s's requests in flight (their count, and the first few). */
static void session_cmd_inflight_json(const struct session *s, json_t *j)
{
    json_t *arr = json_array();
    uint64_t now = uv_hrtime();
    size_t n = 0;
    struct list *p;

    list_foreach(p, &s->reqs) {
        const struct sreq *q = list_entry(p, struct sreq, link);
        json_t *e;
        if (++n > SESSION_INFLIGHT_SHOWN)
            continue;
        e = json_pack("{s:s, s:b}", "command", proto_cmd_name(q->cmd),
                      "running", q->running);
        if (q->tagged)
            json_object_set_new(e, "tag", json_stringn(q->tag, q->tag_len));
        if (q->npos)
            json_object_set_new(e, "resource",
                                json_string(q->pos[0].r->name));
        if (q->running && q->started_ns)
            json_object_set_new(e, "ms", json_integer(
                (json_int_t)((now - q->started_ns) / 1000000)));
        json_array_append_new(arr, e);
    }
    json_object_set_new(j, "inflight", json_integer((json_int_t)n));
    json_object_set_new(j, "requests", arr);
}

/* The command needs an answer it will get later: its record, running
 * (the `ask` lockmgr hands back). */
static struct sreq *serve_later(struct serve *v)
{
    if (!v->q) {
        v->q = sreq_new(v->t.s, v->r, NULL, 0);
        v->q->in_run = true;
    }
    v->q->running = true;
    v->q->started_ns = uv_hrtime();
    return v->q;
}

/* ---- logging in ---------------------------------------------------------- */

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

/* HELLO, AUTH and QUIT change the whole session, or end it: they are
 * never tagged. */
static bool cmd_taggable(enum proto_cmd cmd)
{
    return cmd != PROTO_CMD_HELLO && cmd != PROTO_CMD_AUTH &&
           cmd != PROTO_CMD_QUIT;
}

/* HELLO detach=: 0 turns it off; above 0 the session gets a secret (kept
 * if it had one). False when refused (answered). */
static bool hello_detach(struct serve *v, uint32_t ms)
{
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_detach_ms;

    if (ms == 0) {
        s->detach_ms = 0;
        s->secret[0] = '\0';
        return true;
    }
    if (max == 0) {
        say_err(&v->t, PROTO_ERR_ARG, "detach is off on this daemon "
                "(limits.max_detach_ms is 0)");
        return false;
    }
    if (ms > max) {
        say_errf(&v->t, PROTO_ERR_ARG, "detach must be at most %u ms "
                 "(limits.max_detach_ms)", max);
        return false;
    }
    if (!s->secret[0] && redlock_token(s->secret) != 0) {
        s->secret[0] = '\0';
        say_err(&v->t, PROTO_ERR_UNAVAILABLE, "the system's random source "
                "failed; no secret to resume with");
        return false;
    }
    s->detach_ms = ms;
    return true;
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
    session_say_err(s, PROTO_ERR_NOSESSION, "no such session, or a wrong "
                    "secret");
    if (s->auth_failures >= max) {
        conn_stop(c, "too many failed resumes", true);
        conn_close_announced(c, "auth", "too many failed resumes");
    }
}

/* HELLO resume=: the session named, served by this connection from now
 * on (session_resume), or NULL when refused (answered). */
static struct session *hello_resume(struct serve *v)
{
    struct session *s = v->t.s, *x;

    if (s->owner.nleases > 0 || s->owner.nwaits) {
        session_say_err(s, PROTO_ERR_ARG, "resume= must come before this "
                        "connection locks anything");
        return NULL;
    }
    if (!(x = session_resume(s, v->r)))
        resume_refused(s);
    return x;
}

static void cmd_hello(struct serve *v)
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
    if ((b = say(&v->t))) {
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

/* A wrong AUTH is answered after a delay that grows with each failure
 * (100 ms per failure so far, at most 2 s): guessing gets slow. A wrong
 * user name and a wrong password take the same path, so neither the
 * answer nor its delay tells which names exist. The AUTH waits as a
 * request in flight (untagged: nothing after it runs meanwhile). */
static void session_auth_cb(struct timer *t)
{
    struct session *s = t->data;
    struct sreq *q = s->auth_q;     /* stopped when the connection leaves */
    const struct to to = sreq_to(q);

    s->auth_q = NULL;
    say_err(&to, PROTO_ERR_AUTH, sessions.conf->auth.nusers
            ? "invalid user name or password" : "invalid password");
    sreq_done(q);
}

/* who: "" for AUTH <password>, else what the log may say of the user. */
static void auth_failed(struct serve *v, const char *who)
{
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_auth_failures;
    uint64_t delay = 100 * (uint64_t)s->auth_failures;

    s->auth_failures++;
    log_notice("%s (%s): wrong password%s (%u of "
               "limits.max_auth_failures=%u)", s->idstr, s->peer, who,
               s->auth_failures, max);
    if (s->auth_failures >= max) {
        say_err(&v->t, PROTO_ERR_AUTH, "invalid password; too many "
                "failures, closing (limits.max_auth_failures)");
        conn_stop(s->conn, "too many wrong passwords", true);
        conn_close_announced(s->conn, "auth", "too many wrong passwords");
        return;
    }
    s->auth_q = serve_later(v);
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
 * done, after the session was made: each line asks until s is logged
 * in). A CN that names no user changes nothing: the client may still
 * AUTH. A session already a user's stays that user. */
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
static void cmd_auth_user(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const struct conf *cf = sessions.conf;
    const struct users_user *u;
    char who[USERS_NAME_MAX + 16];
    bool ok;

    if (!cf->auth.nusers) {
        say_err(&v->t, PROTO_ERR_AUTH, "no users are configured "
                "(auth.users): send AUTH <password>");
        return;
    }
    u = users_find(cf->auth.users, cf->auth.nusers, r->args[0],
                   r->args_len[0]);
    ok = users_secret_equal(r->args[1], r->args_len[1],
                            u ? u->password : cf->auth.users[0].password);
    if (u && ok) {
        session_log_in(s, u, "with a password");
        say_ok(&v->t);
        return;
    }
    if (u)
        snprintf(who, sizeof(who), " for user %s", u->name);
    else
        snprintf(who, sizeof(who), " (an unknown user name)");
    auth_failed(v, who);
}

static void cmd_auth(struct serve *v)
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
        say_errf(&v->t, PROTO_ERR_ARG, "this session is user %s's, and a "
                 "session's user never changes (AUTH on a new connection)",
                 s->user);
        return;
    }
    if (r->nargs == 2) {
        cmd_auth_user(v);
        return;
    }
    if (!pw && !admin) {
        say_errf(&v->t, PROTO_ERR_AUTH, "no password is configured%s",
                 sessions.conf->auth.nusers ? "; send AUTH <user> "
                 "<password>" : "");
        return;
    }
    if (admin && users_secret_equal(r->arg, r->arg_len, admin)) {
        s->authed = s->admin = true;
        s->user[0] = '\0';
        log_notice("%s (%s): authenticated as an operator (admin password)",
                   s->idstr, s->peer);
        say_ok(&v->t);
    } else if (pw && users_secret_equal(r->arg, r->arg_len, pw)) {
        s->authed = true;
        s->user[0] = '\0';
        say_ok(&v->t);
    } else {
        auth_failed(v, "");
    }
}

/* ---- users: what lies within a user's prefixes --------------------------- */

_Static_assert(PROTO_CMD_COUNT <= 32, "denied_told has a bit per command");

/* ERR DENIED. The audit line goes out at notice once per session and
 * command, later ones at debug: a client looping on a refused name cannot
 * flood the log. res may be NULL (READMIT). */
static void session_deny(struct serve *v, enum proto_cmd cmd,
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
        say_errf(&v->t, PROTO_ERR_DENIED, "user %s may not %s %.*s: %s",
                 s->user, what, n, res, why);
    else
        say_errf(&v->t, PROTO_ERR_DENIED, "user %s may not %s: %s", s->user,
                 what, why);
}

/* May the session do cmd to each of res[0..n)? A session of no user may
 * (the shared password, or no login at all, as before users); a user's,
 * only within its prefixes. False when refused (answered ERR DENIED). */
static bool session_may(struct serve *v, enum proto_cmd cmd,
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

/* ---- locks --------------------------------------------------------------- */


static bool check_ttl(struct serve *v, uint32_t ttl)
{
    const struct conf *cf = sessions.conf;

    if (ttl < cf->locks.min_ttl_ms || ttl > cf->locks.max_ttl_ms) {
        say_errf(&v->t, PROTO_ERR_ARG, "ttl must be between %u and %u ms",
                 cf->locks.min_ttl_ms, cf->locks.max_ttl_ms);
        return false;
    }
    return true;
}

/* The request's resources against this session: ERR HELD for one it
 * holds already. Forgets a lost lease of each (a new LOCK starts over). */
static bool lock_names_free(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;

    for (size_t i = 0; i < r->nargs; i++) {
        if (lockmgr_held(&s->owner, r->args[i], r->args_len[i])) {
            say_errf(&v->t, PROTO_ERR_HELD, "this session already holds "
                     "%.*s", (int)r->args_len[i], r->args[i]);
            return false;
        }
    }
    for (size_t i = 0; i < r->nargs; i++)
        session_take_lost(s, r->args[i], r->args_len[i]);
    return true;
}

/* mode=, limit= and several resources: which go together. */
static bool lock_kind_ok(struct serve *v)
{
    const struct proto_request *r = v->r;
    const struct conf *cf = sessions.conf;

    if (r->nargs > cf->locks.max_multi) {
        say_errf(&v->t, PROTO_ERR_ARG, "at most %u resources in one LOCK "
                 "(locks.max_multi)", cf->locks.max_multi);
        return false;
    }
    if (r->limit > cf->locks.max_limit) {
        say_errf(&v->t, PROTO_ERR_ARG, "limit must be between 1 and %u "
                 "(locks.max_limit)", cf->locks.max_limit);
        return false;
    }
    if (r->nargs > 1 && r->mode == PROTO_MODE_SHARED) {
        say_err(&v->t, PROTO_ERR_ARG, "several resources are locked in "
                "exclusive mode only");
        return false;
    }
    if (r->nargs > 1 && r->limit) {
        say_err(&v->t, PROTO_ERR_ARG, "limit= takes one resource");
        return false;
    }
    if (r->limit && r->mode == PROTO_MODE_SHARED) {
        say_err(&v->t, PROTO_ERR_ARG, "limit= and mode=shared do not go "
                "together: each slot is an exclusive lock");
        return false;
    }
    return true;
}

static void cmd_lock(struct serve *v)
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
        say_err(&v->t, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(v, ttl) || !lock_kind_ok(v))
        return;
    if (wait > cf->locks.max_wait_ms) {
        say_errf(&v->t, PROTO_ERR_ARG, "wait must be at most %u ms",
                 cf->locks.max_wait_ms);
        return;
    }
    if (!lock_names_free(v))
        return;
    if (s->owner.nleases + r->nargs > cf->limits.max_locks_per_session) {
        say_errf(&v->t, PROTO_ERR_LIMIT, "this session holds %zu locks "
                 "(limits.max_locks_per_session)", s->owner.nleases);
        return;
    }
    struct lockmgr_req lr = {
        .n = r->nargs, .res = r->args, .len = r->args_len,
        .mode = r->mode == PROTO_MODE_SHARED ? LOCKMGR_SHARED
                                             : LOCKMGR_EXCLUSIVE,
        .limit = r->limit, .ttl = ttl, .wait = wait, .renew = r->renew,
        .value = r->value,
    };
    struct sreq *q = serve_later(v);
    q->waited = wait > 0;
    lockmgr_lock_req(&s->owner, &lr, q);
}

/* ADOPT: take over an exclusive lease by its token (a client whose daemon
 * died or restarted). Answered as a LOCK is (owner_locked). */
static void cmd_adopt(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    const struct conf *cf = sessions.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl
                                            : cf->locks.default_ttl_ms;

    if (!session_may(v, r->cmd, r->args, r->args_len, r->nargs))
        return;
    if (sessions.shutdown) {
        say_err(&v->t, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(v, ttl))
        return;
    if (r->nargs > cf->locks.max_multi) {
        say_errf(&v->t, PROTO_ERR_ARG, "at most %u resources in one ADOPT "
                 "(locks.max_multi)", cf->locks.max_multi);
        return;
    }
    if (!lock_names_free(v))
        return;
    struct lockmgr_adopt_req ar = {
        .n = r->nargs, .res = r->args, .len = r->args_len, .token = r->token,
        .ttl = ttl, .renew = r->renew,
    };
    lockmgr_adopt(&s->owner, &ar, serve_later(v));
}

/* The lease for an UNLOCK/EXTEND of res, or NULL after answering
 * NOTHELD/LOST (forgetting the lost lease: the client has heard). */
static struct lease *held_or_reply(struct serve *v, const char *res,
                                   size_t len)
{
    struct session *s = v->t.s;
    struct lease *l = lockmgr_held(&s->owner, res, len);

    if (l)
        return l;
    if (session_take_lost(s, res, len))
        say_errf(&v->t, PROTO_ERR_LOST, "the lease on %.*s was lost",
                 (int)len, res);
    else
        say_errf(&v->t, PROTO_ERR_NOTHELD, "this session does not hold %.*s",
                 (int)len, res);
    return NULL;
}

/*
 * UNLOCK r1 r2 ...: every name must be held or lost (else NOTHELD, and
 * nothing is released); the held ones are released at once; a lost one
 * makes the answer LOST once they are.
 */
static void cmd_unlock(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    struct lease *ls[PROTO_MAX_RESOURCES];
    long lost = -1;
    size_t n = 0;

    if (r->nargs == 1) {
        struct lease *l = held_or_reply(v, r->arg, r->arg_len);
        if (l)
            lockmgr_unlock(&s->owner, l, serve_later(v));
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
            say_errf(&v->t, PROTO_ERR_NOTHELD, "this session does not hold "
                     "%.*s (nothing was released)", (int)r->args_len[i],
                     r->args[i]);
            return;
        }
    }
    if (lost >= 0) {
        for (size_t i = 0; i < r->nargs; i++)
            session_take_lost(s, r->args[i], r->args_len[i]);
        if (!n) {
            say_errf(&v->t, PROTO_ERR_LOST, "the lease on %.*s was lost",
                     (int)r->args_len[lost], r->args[lost]);
            return;
        }
    }
    struct sreq *q = serve_later(v);
    if (lost >= 0) {
        /* Released first; the answer then says LOST for this one. */
        q->unlock_lost = mem_alloc(r->args_len[lost] + 1);
        memcpy(q->unlock_lost, r->args[lost], r->args_len[lost]);
    }
    lockmgr_unlock_many(&s->owner, ls, n, q);
}

/* EXTEND ttl= and/or value= (a value names an exclusive holder). */
static void cmd_extend(struct serve *v)
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
        lockmgr_extend(&v->t.s->owner, l, r->ttl, serve_later(v));
        return;
    }
    lockmgr_lease_kind(l, &mode, &limit);
    if (mode != LOCKMGR_EXCLUSIVE || limit) {
        say_err(&v->t, PROTO_ERR_ARG, "value= is for exclusive locks (not "
                "a shared hold or a semaphore slot)");
        return;
    }
    lockmgr_extend_value(&v->t.s->owner, l, r->ttl, r->value, serve_later(v));
}

/* "OK watching=<n>" */
static void say_watching(struct serve *v)
{
    struct sbuf *b = say(&v->t);

    if (b) {
        proto_format_ok_begin(b);
        proto_format_kv_u64(b, "watching", v->t.s->watch.n);
        proto_format_end(b);
    }
}

/* WATCH: the state of each now (EVENT HOLDER, after the OK), then each
 * change; at most limits.max_watches per session, all or none. */
static void cmd_watch(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;
    unsigned max = sessions.conf->limits.max_watches;
    size_t fresh;

    if (!session_may(v, r->cmd, r->args, r->args_len, r->nargs))
        return;
    fresh = watch_client_new(&s->watch, r->args, r->args_len, r->nargs);
    if (s->watch.n + fresh > max) {
        say_errf(&v->t, PROTO_ERR_LIMIT, "this session watches %zu "
                 "resources; %zu more would pass limits.max_watches (%u)",
                 s->watch.n, fresh, max);
        return;
    }
    /* The states follow the OK: each is read from the nodes first. */
    watch_add(&s->watch, r->args, r->args_len, r->nargs);
    say_watching(v);
}

static void cmd_unwatch(struct serve *v)
{
    const struct proto_request *r = v->r;

    watch_remove(&v->t.s->watch, r->args, r->args_len, r->nargs);
    say_watching(v);
}

static void cmd_locks(struct serve *v)
{
    struct session *s = v->t.s;
    json_t *lost = json_array();
    struct list *p;

    list_foreach(p, &s->lost)
        json_array_append_new(lost, json_string(
            list_entry(p, struct session_lost, link)->resource));
    say_json(&v->t, json_pack("{s:s, s:o, s:o}", "session", s->idstr,
                              "locks", status_leases_json(&s->owner, true),
                              "lost", lost));
}

/* ---- operators ----------------------------------------------------------- */

/* A user's FORCEUNLOCK (res) or READMIT (res NULL): an admin user's,
 * within its prefixes; READMIT concerns every resource, so it needs the
 * prefix "" too. */
static bool session_user_operates(struct serve *v, enum proto_cmd cmd,
                                  const char *res, size_t len)
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
static bool session_is_operator(struct serve *v, enum proto_cmd cmd,
                                const char *res, size_t len)
{
    struct session *s = v->t.s;
    const char *what = proto_cmd_name(cmd);

    if (s->user[0])
        return session_user_operates(v, cmd, res, len);
    if (!sessions.conf->auth.admin_password) {
        say_errf(&v->t, PROTO_ERR_NOAUTH, "%s is disabled: no "
                 "auth.admin_password is configured", what);
        return false;
    }
    if (!s->admin) {
        say_errf(&v->t, PROTO_ERR_NOAUTH, "%s needs AUTH with the admin "
                 "password", what);
        return false;
    }
    return true;
}

static void cmd_forceunlock(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct session *s = v->t.s;

    if (!session_is_operator(v, r->cmd, r->arg, r->arg_len))
        return;
    if (s->user[0])
        log_notice("%s (name=%s peer=%s) user %s: FORCEUNLOCK %.*s",
                   s->idstr, s->name[0] ? s->name : "-", s->peer, s->user,
                   (int)r->arg_len, r->arg);
    lockmgr_force_release(&s->owner, r->arg, r->arg_len, serve_later(v));
}

/* End a node's recovery now: the operator knows no lock outlived it. */
static void cmd_readmit(struct serve *v)
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
        say_errf(&v->t, PROTO_ERR_ARG, "%s", msg[0] ? msg : "no such node");
        return;
    }
    log_notice("%s (name=%s peer=%s%s%s) READMIT %s: %s", s->idstr,
               s->name[0] ? s->name : "-", s->peer, s->user[0] ? " user=" : "",
               s->user, node, msg);
    if ((b = say(&v->t))) {
        proto_format_ok_begin(b);
        proto_format_kv_u64(b, "readmitted", (uint64_t)n);
        proto_format_end(b);
    }
}

static void cmd_status(struct serve *v)
{
    const struct proto_request *r = v->r;

    if (!session_may(v, r->cmd, &r->arg, &r->arg_len, 1))
        return;
    if (r->limit > sessions.conf->locks.max_limit) {
        say_errf(&v->t, PROTO_ERR_ARG, "limit must be between 1 and %u "
                 "(locks.max_limit)", sessions.conf->locks.max_limit);
        return;
    }
    lockmgr_status(&v->t.s->owner, r->arg, r->arg_len, r->limit,
                   serve_later(v));
}

/* ---- what is held and waited for ----------------------------------------- */

static bool top_visible(void *ud, const char *res, size_t len)
{
    return users_allows(ud, res, len);
}

/* TOP: this daemon's resources with holders or waiters, the longest wait
 * first; a user sees those within its prefixes only, as for STATUS. */
static void cmd_top(struct serve *v)
{
    const struct proto_request *r = v->r;
    const struct session *s = v->t.s;
    struct lockmgr_top_view top[LOCKMGR_TOP_MAX];
    const struct users_user *u = NULL;
    size_t n, total;

    if (r->limit > LOCKMGR_TOP_MAX) {
        say_errf(&v->t, PROTO_ERR_ARG, "limit must be between 1 and %d",
                 LOCKMGR_TOP_MAX);
        return;
    }
    if (s->user[0] && !(u = session_user(s))) {
        session_deny(v, r->cmd, NULL, 0, "the user is no longer configured");
        return;
    }
    total = lockmgr_top(top, r->limit ? r->limit : LOCKMGR_TOP_DEFAULT, &n,
                        u ? top_visible : NULL, (void *)u);
    say_json(&v->t, status_top_json(sessions.conf->id, top, n, total));
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

/* ---- the rest ------------------------------------------------------------ */

static void cmd_quit(struct serve *v)
{
    struct sbuf *b = say(&v->t);

    if (b) {
        proto_format_ok_begin(b);
        proto_format_word(b, "bye");
        proto_format_end(b);
    }
    conn_stop(v->t.s->conn, "QUIT", false);
}

static void cmd_help(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct sbuf *b;
    enum proto_cmd cmd = PROTO_CMD_NONE;

    if (r->arg && (cmd = proto_cmd_lookup(r->arg, r->arg_len)) ==
                  PROTO_CMD_NONE) {
        say_errf(&v->t, PROTO_ERR_ARG, "no such command: %.*s (HELP lists "
                 "them)", (int)r->arg_len, r->arg);
        return;
    }
    if (!(b = say(&v->t)))
        return;
    if (r->arg)
        proto_format_usage(b, cmd);
    else
        proto_format_help(b);
}

static void cmd_ping(struct serve *v)
{
    const struct proto_request *r = v->r;
    struct sbuf *b = say(&v->t);

    if (b)
        proto_format_pong(b, r->arg, r->arg ? r->arg_len : 0);
}

/* Serve r on s (q: its record when it had to wait for its turn). An
 * answer that comes later keeps (or makes) the record running; otherwise
 * it is answered now and the record, if any, goes. */
static void sreq_run(struct session *s, const struct proto_request *r,
                     struct sreq *q)
{
    struct serve v = {
        .t = { s, r->tag, r->tag_len }, .r = r, .q = q,
    };

    if (q)
        q->in_run = true;
    /* A verified client certificate naming a user logs in with the first
     * line (the TLS handshake ends after the session was made). */
    if (!s->authed && s->conn->cert_cn[0])
        session_login_cert(s);
    if (!s->authed && session_login_required() && cmd_needs_auth(r->cmd)) {
        say_err(&v.t, PROTO_ERR_NOAUTH, sessions.conf->auth.nusers
                ? "authentication required: send AUTH <user> <password> "
                  "first" : "authentication required: send AUTH "
                  "<password> first");
    } else {
        switch (r->cmd) {
        case PROTO_CMD_PING:        cmd_ping(&v); break;
        case PROTO_CMD_HELLO:       cmd_hello(&v); break;
        case PROTO_CMD_AUTH:        cmd_auth(&v); break;
        case PROTO_CMD_LOCK:        cmd_lock(&v); break;
        case PROTO_CMD_UNLOCK:      cmd_unlock(&v); break;
        case PROTO_CMD_ADOPT:       cmd_adopt(&v); break;
        case PROTO_CMD_EXTEND:      cmd_extend(&v); break;
        case PROTO_CMD_LOCKS:       cmd_locks(&v); break;
        case PROTO_CMD_STATUS:      cmd_status(&v); break;
        case PROTO_CMD_FORCEUNLOCK: cmd_forceunlock(&v); break;
        case PROTO_CMD_READMIT:     cmd_readmit(&v); break;
        case PROTO_CMD_WATCH:       cmd_watch(&v); break;
        case PROTO_CMD_UNWATCH:     cmd_unwatch(&v); break;
        case PROTO_CMD_SESSIONS:    say_json(&v.t, session_list_for(s)); break;
        case PROTO_CMD_STATS:       say_json(&v.t, stats_for(s)); break;
        case PROTO_CMD_TOP:         cmd_top(&v); break;
        case PROTO_CMD_HELP:        cmd_help(&v); break;
        case PROTO_CMD_QUIT:        cmd_quit(&v); break;
        default:                    say_err(&v.t, PROTO_ERR_UNKNOWN, NULL);
        }
    }
    if (v.q) {
        v.q->in_run = false;
        if (v.q->answered || !v.q->running)
            sreq_done(v.q);
    }
}

/* The line, its separators put back (the parser cut it in place; every
 * NUL in it now was a space or a tab), to run it later. */
static void line_restore(char *line, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (line[i] == '\0')
            line[i] = ' ';
}

/* conn ops->line: one request line of s. */
static void session_cmd_line(struct session *s, char *line, size_t len)
{
    struct proto_request r;
    struct proto_error err;
    enum proto_parse_status st;
    const char *const *res = NULL;
    const size_t *rlen = NULL;

    st = proto_parse(line, len, parse_limits(), &r, &err);
    if (st == PROTO_PARSE_EMPTY)
        return;
    counters.commands[command_cell(r.cmd)]++;
    struct to t = { s, r.tag, r.tag_len };
    if (st == PROTO_PARSE_ERROR) {
        say_err(&t, err.code, err.msg);
        return;
    }
    if (r.tag && !cmd_taggable(r.cmd)) {
        say_errf(&t, PROTO_ERR_ARG, "%s is never tagged: send it without a "
                 "tag", proto_cmd_name(r.cmd));
        return;
    }
    if (r.tag && tag_in_use(s, r.tag, r.tag_len)) {
        say_err(&t, PROTO_ERR_ARG, "tag in use: a request with this tag is "
                "not answered yet");
        return;
    }
    size_t n = req_resources(&r, &res, &rlen);
    bool wait = r.tag ? resources_busy(s, res, rlen, n)
                      : !list_empty(&s->reqs);
    session_ref(s);
    if (!wait) {
        sreq_run(s, &r, NULL);
    } else {
        line_restore(line, len);
        sreq_new(s, &r, line, len);
    }
    sreq_flow(s);
    session_unref(s);
}

/* ---- answers from lockmgr (the owner interface) ------------------------- */

/*
 * An answer reaches a session only while the connection that asked is
 * attached (lockmgr_owner_cancel drops the others, and the records with
 * them): ask is the request's record, s->conn the one to answer on. A
 * lease lost reaches it in any state but ended.
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

static void owner_locked(struct lockmgr_owner *o, void *ask,
                         const struct lockmgr_grant *g,
                         const struct lockmgr_refusal *no)
{
    struct sreq *q = ask;
    const struct to t = sreq_to(q);
    struct sbuf *b;

    if (observer)
        observer->lock_answered(q->waited,
                                (double)(uv_hrtime() - q->started_ns) / 1e9);
    if (!g) {
        say_refusal(&t, q->cmd, no);
    } else if ((b = say(&t))) {
        const struct proto_grant pg = {
            .resource = g->resource, .nresources = g->nresources,
            .token = g->token, .fence = g->fence, .ttl = g->ttl,
            .validity = g->validity, .shared = g->mode == LOCKMGR_SHARED,
            .limit = g->limit, .slot = g->slot,
        };
        proto_format_grant(b, &pg);
    }
    (void)o;
    sreq_done(q);
}

static void owner_unlocked(struct lockmgr_owner *o, void *ask,
                           const char *resource, size_t nres, int nodes,
                           const struct lockmgr_refusal *no)
{
    struct sreq *q = ask;
    const struct to t = sreq_to(q);
    struct sbuf *b;

    (void)o;
    if (q->unlock_lost) {
        say_errf(&t, PROTO_ERR_LOST, "the lease on %s was lost; the others "
                 "are released", q->unlock_lost);
    } else if (no) {
        struct lockmgr_refusal gone = *no;
        gone.resource = resource;
        gone.count = nres;
        say_refusal(&t, PROTO_CMD_UNLOCK, &gone);
    } else if ((b = say(&t))) {
        proto_format_ok_begin(b);
        if (nres > 1)
            proto_format_kv_u64(b, "resources", nres);
        else
            proto_format_kv_str(b, "resource", resource);
        proto_format_kv_u64(b, "nodes", (uint64_t)nodes);
        proto_format_end(b);
    }
    sreq_done(q);
}

static void owner_extended(struct lockmgr_owner *o, void *ask,
                           const char *resource, uint32_t ttl,
                           int64_t validity, const struct lockmgr_refusal *no)
{
    struct sreq *q = ask;
    const struct to t = sreq_to(q);
    struct sbuf *b;

    (void)o;
    if (no) {
        say_refusal(&t, PROTO_CMD_EXTEND, no);
    } else if ((b = say(&t))) {
        proto_format_ok_begin(b);
        proto_format_kv_str(b, "resource", resource);
        proto_format_kv_u64(b, "ttl", ttl);
        proto_format_kv_i64(b, "validity", validity);
        proto_format_end(b);
    }
    sreq_done(q);
}

/* Attached: told now, and remembered so a later UNLOCK/EXTEND says LOST,
 * not NOTHELD. Detached: kept to be told after the resume reply. */
static void owner_lost(struct lockmgr_owner *o, const char *resource,
                       uint64_t fence, enum lockmgr_lost_reason why)
{
    struct session *s = owner_session(o);

    if (!s->conn) {
        session_lost_add(&s->untold, &s->nuntold, true, resource, fence,
                         why);
        return;
    }
    session_lost_add(&s->lost, &s->nlost, false, resource, fence, why);
    session_say_lost(s, resource, fence, why);
}

static void owner_status(struct lockmgr_owner *o, void *ask,
                         const struct lockmgr_status *st)
{
    struct sreq *q = ask;
    const struct to t = sreq_to(q);

    (void)o;
    say_json(&t, status_json(st));
    sreq_done(q);
}

static const struct lockmgr_owner_ops session_owner_ops = {
    .ref = owner_ref, .unref = owner_unref,
    .locked = owner_locked, .unlocked = owner_unlocked,
    .extended = owner_extended, .lost = owner_lost, .status = owner_status,
};

/* ---- counting ------------------------------------------------------------ */

const struct session_counters *session_counters(void)
{
    return &counters;
}

void session_set_observer(const struct session_observer *ob)
{
    observer = ob;
}

/* ---- what a session is served by ----------------------------------------- */

/* conn ops->line: s is c's session. */
static void session_on_line(struct conn *c, void *data, char *line,
                            size_t len)
{
    (void)c;
    session_cmd_line(data, line, len);
}

static bool session_on_busy(struct conn *c, void *data)
{
    (void)c;
    return session_cmd_busy(data);
}

/* conn ops->eof: nobody is left to wait for a LOCK's answer. */
static void session_on_eof(struct conn *c, void *data)
{
    struct session *s = data;

    (void)c;
    lockmgr_cut_wait(&s->owner);    /* may answer, and run the queue */
}

/* Each connection a session gets calls it through this: its lines are
 * commands, its end is the session's life (session.c). */
static const struct conn_ops session_conn_ops = {
    .line = session_on_line, .busy = session_on_busy, .eof = session_on_eof,
    .closed = session_on_closed,
};

static const struct session_ops session_cmd_ops = {
    .conn = &session_conn_ops, .owner = &session_owner_ops,
    .withdraw = session_cmd_withdraw,
    .inflight_json = session_cmd_inflight_json,
};

struct session *session_create(struct conn *c)
{
    struct session *s = session_new(c, &session_cmd_ops);

    timer_init(&s->auth_timer, session_auth_cb, s);
    return s;
}
