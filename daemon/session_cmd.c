/*
 * session, what its lines mean (session_priv.h): each line read is
 * parsed, run now or queued, run through the command files when its turn
 * comes, and answered; an answer that comes later (lockmgr's owner
 * callbacks, the delayed answer to a wrong AUTH) finishes its request
 * here and starts what was waiting for it.
 *
 * The top of the session's files. It makes each session (session_create:
 * session.c's session_new, handed this file's struct session_ops) and
 * owns what a session is called through: the table a connection calls
 * (its lines are commands here, its end is session.c's
 * session_on_closed) and lockmgr's owner callbacks. session.c, the life
 * below, calls back up only through that table: to withdraw what a
 * connection that leaves asked, and for the requests in flight that
 * SESSIONS shows (session_req.c serves both).
 *
 * Requests in flight. A line is parsed as it arrives. One that can run
 * runs at once: its answer goes out now (PING, HELP, LOCKS, an error) or,
 * when it needs Redis, later, from one of the lockmgr owner callbacks
 * ("answers from lockmgr"); meanwhile it is a struct sreq on s->reqs, in
 * the order read, which lockmgr's answer finds again through its `ask`.
 * When a request may start is session_req.c's (protocol.md, "Tagged
 * requests"); HELLO, AUTH and QUIT are never tagged, and a tag still in
 * use is refused.
 *
 * A request that must wait keeps its line (with the separators the parser
 * cut put back) and is parsed again when its turn comes; its turn comes
 * when the one before it is answered (sreq_done: session_req_unlink puts
 * it on s->ready, and one loop, not recursion, starts what is ready: a
 * run of requests answered at once, such as a thousand ERR HELD, cannot
 * grow the stack). Every reply is one line with its request's "#<tag> "
 * in front (session_reply.c).
 */
#include "session_priv.h"

#include "conf.h"
#include "conn.h"

static void sreq_run(struct session *s, const struct proto_request *r,
                     struct sreq *q);
static void sreq_done(struct sreq *q);

/* What proto_parse checks against: locks.max_value_len is live (SIGHUP),
 * locks.max_resource_len is not (lockmgr sizes its key buffer by it). */
static const struct proto_limits *parse_limits(void)
{
    sessions.limits.max_value_len = sessions.conf->locks.max_value_len;
    return &sessions.limits;
}

/* ---- running the requests ------------------------------------------------ */

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
            const struct session_to t = session_req_to(q);
            session_say_err(&t, err.code, err.msg);
            sreq_done(q);
            continue;
        }
        sreq_run(s, &r, q);
    }
    s->starting = false;
    session_req_flow(s);
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
        session_req_unlink(q);
    session_req_free(q);
    sreq_start_ready(s);
}

/* ---- the commands -------------------------------------------------------- */

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

static void cmd_quit(struct session_serve *v)
{
    struct sbuf *b = session_say(&v->t);

    if (b) {
        proto_format_ok_begin(b);
        proto_format_word(b, "bye");
        proto_format_end(b);
    }
    conn_stop(v->t.s->conn, "QUIT", false);
}

static void cmd_help(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct sbuf *b;
    enum proto_cmd cmd = PROTO_CMD_NONE;

    if (r->arg && (cmd = proto_cmd_lookup(r->arg, r->arg_len)) ==
                  PROTO_CMD_NONE) {
        session_say_errf(&v->t, PROTO_ERR_ARG, "no such command: %.*s (HELP "
                         "lists them)", (int)r->arg_len, r->arg);
        return;
    }
    if (!(b = session_say(&v->t)))
        return;
    if (r->arg)
        proto_format_usage(b, cmd);
    else
        proto_format_help(b);
}

static void cmd_ping(struct session_serve *v)
{
    const struct proto_request *r = v->r;
    struct sbuf *b = session_say(&v->t);

    if (b)
        proto_format_pong(b, r->arg, r->arg ? r->arg_len : 0);
}

/* Serve r on s (q: its record when it had to wait for its turn). An
 * answer that comes later keeps (or makes) the record running; otherwise
 * it is answered now and the record, if any, goes. */
static void sreq_run(struct session *s, const struct proto_request *r,
                     struct sreq *q)
{
    struct session_serve v = {
        .t = { s, r->tag, r->tag_len }, .r = r, .q = q,
    };

    if (q)
        q->in_run = true;
    /* A verified client certificate naming a user logs in with the first
     * line (the TLS handshake ends after the session was made). */
    if (!s->authed && s->conn->cert_cn[0])
        session_login_cert(s);
    if (!s->authed && session_login_required() && cmd_needs_auth(r->cmd)) {
        session_say_err(&v.t, PROTO_ERR_NOAUTH, sessions.conf->auth.nusers
                        ? "authentication required: send AUTH <user> "
                          "<password> first"
                        : "authentication required: send AUTH "
                          "<password> first");
    } else {
        switch (r->cmd) {
        case PROTO_CMD_PING:        cmd_ping(&v); break;
        case PROTO_CMD_HELLO:       session_cmd_hello(&v); break;
        case PROTO_CMD_AUTH:        session_cmd_auth(&v); break;
        case PROTO_CMD_LOCK:        session_cmd_lock(&v); break;
        case PROTO_CMD_UNLOCK:      session_cmd_unlock(&v); break;
        case PROTO_CMD_ADOPT:       session_cmd_adopt(&v); break;
        case PROTO_CMD_EXTEND:      session_cmd_extend(&v); break;
        case PROTO_CMD_LOCKS:       session_cmd_locks(&v); break;
        case PROTO_CMD_STATUS:      session_cmd_status(&v); break;
        case PROTO_CMD_FORCEUNLOCK: session_cmd_forceunlock(&v); break;
        case PROTO_CMD_READMIT:     session_cmd_readmit(&v); break;
        case PROTO_CMD_WATCH:       session_cmd_watch(&v); break;
        case PROTO_CMD_UNWATCH:     session_cmd_unwatch(&v); break;
        case PROTO_CMD_SESSIONS:    session_cmd_sessions(&v); break;
        case PROTO_CMD_STATS:       session_cmd_stats(&v); break;
        case PROTO_CMD_TOP:         session_cmd_top(&v); break;
        case PROTO_CMD_HELP:        cmd_help(&v); break;
        case PROTO_CMD_QUIT:        cmd_quit(&v); break;
        default:                    session_say_err(&v.t, PROTO_ERR_UNKNOWN,
                                                    NULL);
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
    session_count_command(r.cmd);
    struct session_to t = { s, r.tag, r.tag_len };
    if (st == PROTO_PARSE_ERROR) {
        session_say_err(&t, err.code, err.msg);
        return;
    }
    if (r.tag && !cmd_taggable(r.cmd)) {
        session_say_errf(&t, PROTO_ERR_ARG, "%s is never tagged: send it "
                         "without a tag", proto_cmd_name(r.cmd));
        return;
    }
    if (r.tag && session_req_tag_in_use(s, r.tag, r.tag_len)) {
        session_say_err(&t, PROTO_ERR_ARG, "tag in use: a request with this "
                        "tag is not answered yet");
        return;
    }
    size_t n = session_req_resources(&r, &res, &rlen);
    bool wait = r.tag ? session_req_queued(s, res, rlen, n)
                      : !list_empty(&s->reqs);
    session_ref(s);
    if (!wait) {
        sreq_run(s, &r, NULL);
    } else {
        line_restore(line, len);
        session_req_new(s, &r, line, len);
    }
    session_req_flow(s);
    session_unref(s);
}

/* ---- answers from lockmgr (the owner interface) ------------------------- */

/*
 * An answer reaches a session only while the connection that asked is
 * attached (lockmgr_owner_cancel drops the others, and the records with
 * them): ask is the request's record, s->conn the one to answer on. A
 * lease lost reaches it in any state but ended. The command files word
 * the answers; each finishes its request here.
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
    (void)o;
    session_answer_locked(ask, g, no);
    sreq_done(ask);
}

static void owner_unlocked(struct lockmgr_owner *o, void *ask,
                           const char *resource, size_t nres, int nodes,
                           const struct lockmgr_refusal *no)
{
    (void)o;
    session_answer_unlocked(ask, resource, nres, nodes, no);
    sreq_done(ask);
}

static void owner_extended(struct lockmgr_owner *o, void *ask,
                           const char *resource, uint32_t ttl,
                           int64_t validity, const struct lockmgr_refusal *no)
{
    (void)o;
    session_answer_extended(ask, resource, ttl, validity, no);
    sreq_done(ask);
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
    (void)o;
    session_answer_status(ask, st);
    sreq_done(ask);
}

static const struct lockmgr_owner_ops session_owner_ops = {
    .ref = owner_ref, .unref = owner_unref,
    .locked = owner_locked, .unlocked = owner_unlocked,
    .extended = owner_extended, .lost = owner_lost, .status = owner_status,
};

/* ---- the answer to a wrong AUTH ------------------------------------------ */

/* A wrong AUTH is answered after a delay that grows with each failure
 * (100 ms per failure so far, at most 2 s): guessing gets slow. A wrong
 * user name and a wrong password take the same path, so neither the
 * answer nor its delay tells which names exist. The AUTH waits as a
 * request in flight (untagged: nothing after it runs meanwhile). */
static void session_auth_cb(struct timer *t)
{
    struct session *s = t->data;
    struct sreq *q = s->auth_q;     /* stopped when the connection leaves */
    const struct session_to to = session_req_to(q);

    s->auth_q = NULL;
    session_say_err(&to, PROTO_ERR_AUTH, sessions.conf->auth.nusers
                    ? "invalid user name or password" : "invalid password");
    sreq_done(q);
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
    return session_req_busy(data);
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
    .withdraw = session_req_withdraw,
    .inflight_json = session_req_json,
};

struct session *session_create(struct conn *c)
{
    struct session *s = session_new(c, &session_cmd_ops);

    timer_init(&s->auth_timer, session_auth_cb, s);
    return s;
}
