/*
 * session: the protocol half of a client connection (see session.h).
 *
 * Requests are served strictly in order: a request starts only after the
 * one before it was answered, so a pipelined UNLOCK after LOCK always sees
 * the lock. A request that needs Redis marks the session busy; its answer
 * arrives through a session_*_done() call, which replies and resumes the
 * queue.
 */
#include "session.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "mem.h"
#include "pool.h"
#include "server.h"
#include "stats.h"

static struct {
    struct session *head;       /* live sessions (not closing) */
    size_t count;
    uint64_t next_id;
    bool shutdown;
} S;

static void session_idle_cb(struct timer *t);
static void session_arm_idle(struct session *s);

struct session *session_create(const struct conf *conf)
{
    struct session *s = mem_alloc(sizeof(*s));
    (void)conf;

    s->id = ++S.next_id;
    snprintf(s->idstr, sizeof(s->idstr), "s%" PRIu64, s->id);
    sbuf_init(&s->out);
    sbuf_init(&s->wbuf);
    s->refs = 1;                /* the handle's; dropped by its close cb */
    s->created_at = s->last_line_at = timer_now();
    timer_init(&s->idle_timer, session_idle_cb, s);
    session_arm_idle(s);        /* handshake_timeout_ms */
    s->next = S.head;
    if (S.head)
        S.head->prev = s;
    S.head = s;
    S.count++;
    return s;
}

static void session_unlist(struct session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else if (S.head == s)
        S.head = s->next;
    else
        return;     /* not listed */
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    S.count--;
}

static void queue_free(struct session *s)
{
    struct line *ln = s->qhead, *next;
    for (; ln; ln = next) {
        next = ln->next;
        free(ln);
    }
    s->qhead = s->qtail = NULL;
    s->qlen = 0;
}

static void session_free(struct session *s)
{
    queue_free(s);
    free(s->cur);
    struct lost_lease *x = s->lost, *nx;
    for (; x; x = nx) {
        nx = x->next;
        free(x);
    }
    free(s->rbuf);
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

/* ---- idle / handshake / keepalive -------------------------------------- */

static uint64_t session_idle_limit(const struct session *s, const char **why)
{
    const struct conf *c = server.conf;
    uint64_t limit = 0;

    if (!s->got_line) {
        *why = "no request within limits.handshake_timeout_ms";
        return c->limits.handshake_timeout_ms;
    }
    if (c->limits.idle_timeout_ms) {
        limit = c->limits.idle_timeout_ms;
        *why = "idle for limits.idle_timeout_ms";
    }
    if (s->keepalive_ms && (!limit || s->keepalive_ms < limit)) {
        limit = s->keepalive_ms;
        *why = "keepalive expired";
    }
    return limit;
}

static void session_arm_idle(struct session *s)
{
    const char *why = "";
    uint64_t limit = session_idle_limit(s, &why);

    if (!limit || s->closing)
        timer_stop(&s->idle_timer);
    else
        timer_start_at(&s->idle_timer, s->last_line_at + limit);
}

static void session_idle_cb(struct timer *t)
{
    struct session *s = t->data;
    const char *why = "";
    uint64_t limit = session_idle_limit(s, &why);

    if (!limit || s->closing)
        return;
    /* Lines reset last_line_at without touching the timer; check again. */
    if (timer_now() < s->last_line_at + limit) {
        timer_start_at(&s->idle_timer, s->last_line_at + limit);
        return;
    }
    log_info("%s (%s): %s, closing", s->idstr, s->peer, why);
    conn_close(s, true, why);
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
    if (s->qtail)
        s->qtail->next = ln;
    else
        s->qhead = ln;
    s->qtail = ln;
    s->qlen++;

    s->last_line_at = timer_now();
    if (!s->got_line) {
        s->got_line = true;
        session_arm_idle(s);
    }
}

static void reply_err(struct session *s, enum proto_err code, const char *msg)
{
    struct sbuf b = SBUF_INIT;
    stats.errors++;
    proto_format_err(&b, code, msg);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
}

static void reply_errf(struct session *s, enum proto_err code,
                       const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void reply_errf(struct session *s, enum proto_err code,
                       const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    reply_err(s, code, msg);
}

static void reply_json(struct session *s, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    struct sbuf b = SBUF_INIT;

    json_decref(j);
    if (!text) {
        reply_err(s, PROTO_ERR_LIMIT, "out of memory building the reply");
        return;
    }
    proto_format_ok_json(&b, text);
    free(text);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
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

static void cmd_ping(struct session *s, const struct proto_request *r)
{
    struct sbuf b = SBUF_INIT;
    proto_format_pong(&b, r->arg, r->arg ? r->arg_len : 0);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
}

static void cmd_hello(struct session *s, const struct proto_request *r)
{
    struct sbuf b = SBUF_INIT;

    if (r->has & PROTO_OPT_NAME)
        snprintf(s->name, sizeof(s->name), "%.*s", (int)r->name_len, r->name);
    if (r->has & PROTO_OPT_KEEPALIVE) {
        s->keepalive_ms = r->keepalive;
        session_arm_idle(s);
    }
    proto_format_ok_begin(&b);
    proto_format_kv_u64(&b, "proto", PROTO_VERSION);
    proto_format_kv_str(&b, "session", s->idstr);
    proto_format_kv_str(&b, "server", "redlockd/" REDLOCKD_VERSION);
    proto_format_kv_u64(&b, "nodes", (uint64_t)pool_nnodes());
    proto_format_kv_u64(&b, "quorum", (uint64_t)pool_quorum());
    proto_format_end(&b);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
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

static void cmd_auth(struct session *s, const struct proto_request *r)
{
    const char *pw = server.conf->auth.password;

    if (!pw) {
        reply_err(s, PROTO_ERR_AUTH, "no password is configured");
        return;
    }
    if (!secret_equal(r->arg, r->arg_len, pw)) {
        log_notice("%s (%s): wrong password", s->idstr, s->peer);
        reply_err(s, PROTO_ERR_AUTH, "invalid password");
        return;
    }
    s->authed = true;
    struct sbuf b = SBUF_INIT;
    proto_format_ok(&b);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
}

static bool session_take_lost(struct session *s, const char *res, size_t len)
{
    struct lost_lease **pp = &s->lost;
    for (; *pp; pp = &(*pp)->next) {
        if (strlen((*pp)->resource) == len &&
            memcmp((*pp)->resource, res, len) == 0) {
            struct lost_lease *x = *pp;
            *pp = x->next;
            free(x);
            s->nlost--;
            return true;
        }
    }
    return false;
}

static bool check_ttl(struct session *s, uint32_t ttl)
{
    const struct conf *c = server.conf;
    if (ttl < c->locks.min_ttl_ms || ttl > c->locks.max_ttl_ms) {
        reply_errf(s, PROTO_ERR_ARG, "ttl must be between %u and %u ms",
                   c->locks.min_ttl_ms, c->locks.max_ttl_ms);
        return false;
    }
    return true;
}

static void cmd_lock(struct session *s, const struct proto_request *r)
{
    const struct conf *c = server.conf;
    uint32_t ttl = (r->has & PROTO_OPT_TTL) ? r->ttl : c->locks.default_ttl_ms;
    /* Nobody is left to wait for the answer after EOF. */
    uint32_t wait = (r->has & PROTO_OPT_WAIT) && !s->eof ? r->wait : 0;

    if (S.shutdown) {
        reply_err(s, PROTO_ERR_SHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (!check_ttl(s, ttl))
        return;
    if (wait > c->locks.max_wait_ms) {
        reply_errf(s, PROTO_ERR_ARG, "wait must be at most %u ms",
                   c->locks.max_wait_ms);
        return;
    }
    if (lockmgr_held(s, r->arg, r->arg_len)) {
        reply_errf(s, PROTO_ERR_HELD, "this session already holds %.*s",
                   (int)r->arg_len, r->arg);
        return;
    }
    if (s->nleases >= c->limits.max_locks_per_session) {
        reply_errf(s, PROTO_ERR_LIMIT, "this session holds %zu locks "
                   "(limits.max_locks_per_session)", s->nleases);
        return;
    }
    session_take_lost(s, r->arg, r->arg_len);
    s->busy = true;
    lockmgr_lock(s, r->arg, r->arg_len, ttl, wait, r->renew);
}

void session_lock_done(struct session *s, struct lease *l, enum proto_err err,
                       const char *msg)
{
    if (s->closing)
        return;
    if (!l) {
        reply_err(s, err, msg);
    } else {
        struct sbuf b = SBUF_INIT;
        proto_format_ok_begin(&b);
        proto_format_kv_str(&b, "resource", lockmgr_lease_resource(l));
        proto_format_kv_str(&b, "token", l->token);
        proto_format_kv_u64(&b, "fence", l->fence);
        proto_format_kv_u64(&b, "ttl", l->ttl);
        proto_format_kv_i64(&b, "validity", lockmgr_lease_validity(l));
        proto_format_end(&b);
        conn_send_buf(s, &b);
        sbuf_deinit(&b);
    }
    request_done(s);
}

/* The lease for an UNLOCK/EXTEND, or NULL after answering NOTHELD/LOST. */
static struct lease *held_or_reply(struct session *s,
                                   const struct proto_request *r)
{
    struct lease *l = lockmgr_held(s, r->arg, r->arg_len);
    if (l)
        return l;
    if (session_take_lost(s, r->arg, r->arg_len))
        reply_errf(s, PROTO_ERR_LOST, "the lease on %.*s was lost",
                   (int)r->arg_len, r->arg);
    else
        reply_errf(s, PROTO_ERR_NOTHELD, "this session does not hold %.*s",
                   (int)r->arg_len, r->arg);
    return NULL;
}

static void cmd_unlock(struct session *s, const struct proto_request *r)
{
    struct lease *l = held_or_reply(s, r);
    if (!l)
        return;
    s->busy = true;
    lockmgr_unlock(s, l);
}

void session_unlock_done(struct session *s, const char *resource, int nodes,
                         enum proto_err err)
{
    if (s->closing)
        return;
    if (err != PROTO_ERR_NONE) {
        reply_errf(s, err, "%s: the lease was no longer held on any node",
                   resource);
    } else {
        struct sbuf b = SBUF_INIT;
        proto_format_ok_begin(&b);
        proto_format_kv_str(&b, "resource", resource);
        proto_format_kv_u64(&b, "nodes", (uint64_t)nodes);
        proto_format_end(&b);
        conn_send_buf(s, &b);
        sbuf_deinit(&b);
    }
    request_done(s);
}

static void cmd_extend(struct session *s, const struct proto_request *r)
{
    if (!check_ttl(s, r->ttl))
        return;
    struct lease *l = held_or_reply(s, r);
    if (!l)
        return;
    s->busy = true;
    lockmgr_extend(s, l, r->ttl);
}

void session_extend_done(struct session *s, struct lease *l,
                         enum proto_err err, int64_t validity)
{
    if (s->closing)
        return;
    if (err == PROTO_ERR_LOST) {
        reply_errf(s, err, "the lease on %s was lost",
                   lockmgr_lease_resource(l));
    } else if (err != PROTO_ERR_NONE) {
        reply_err(s, err, "could not extend the lease on a quorum of nodes; "
                  "the current lease stays");
    } else {
        struct sbuf b = SBUF_INIT;
        proto_format_ok_begin(&b);
        proto_format_kv_str(&b, "resource", lockmgr_lease_resource(l));
        proto_format_kv_u64(&b, "ttl", l->ttl);
        proto_format_kv_i64(&b, "validity", validity);
        proto_format_end(&b);
        conn_send_buf(s, &b);
        sbuf_deinit(&b);
    }
    request_done(s);
}

static json_t *lease_json(const struct lease *l)
{
    uint64_t now = timer_now();
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:b, s:I}",
                     "resource", lockmgr_lease_resource(l),
                     "fence", (json_int_t)l->fence,
                     "ttl", (json_int_t)l->ttl,
                     "validity", (json_int_t)lockmgr_lease_validity(l),
                     "held_ms", (json_int_t)(now - l->acquired_at),
                     "renew", l->renew,
                     "renewals", (json_int_t)l->renewals);
}

static void cmd_locks(struct session *s)
{
    json_t *arr = json_array();
    for (const struct lease *l = s->leases; l; l = l->s_next)
        json_array_append_new(arr, lease_json(l));
    json_t *lost = json_array();
    for (const struct lost_lease *x = s->lost; x; x = x->next)
        json_array_append_new(lost, json_string(x->resource));
    reply_json(s, json_pack("{s:s, s:o, s:o}", "session", s->idstr,
                            "locks", arr, "lost", lost));
}

static void cmd_status(struct session *s, const struct proto_request *r)
{
    s->busy = true;
    lockmgr_status(s, r->arg, r->arg_len);
}

void session_status_done(struct session *s, json_t *status)
{
    if (s->closing) {
        json_decref(status);
        return;
    }
    reply_json(s, status);
    request_done(s);
}

json_t *session_list_json(void)
{
    json_t *arr = json_array();
    uint64_t now = timer_now();

    for (const struct session *s = S.head; s; s = s->next) {
        json_array_append_new(arr, json_pack(
            "{s:s, s:s?, s:s, s:I, s:I, s:I, s:I}",
            "id", s->idstr,
            "name", s->name[0] ? s->name : NULL,
            "peer", s->peer,
            "locks", (json_int_t)s->nleases,
            "waits", (json_int_t)(s->lockreq ? 1 : 0),
            "idle_ms", (json_int_t)(now - s->last_line_at),
            "age_ms", (json_int_t)(now - s->created_at)));
    }
    return json_pack("{s:o}", "sessions", arr);
}

static void cmd_quit(struct session *s)
{
    struct sbuf b = SBUF_INIT;
    proto_format_ok_begin(&b);
    proto_format_word(&b, "bye");
    proto_format_end(&b);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
    queue_free(s);          /* lines after QUIT are not served */
    s->died = false;
    s->quit = true;
    s->close_after_write = true;
}

static void cmd_help(struct session *s)
{
    struct sbuf b = SBUF_INIT;
    proto_format_help(&b);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
}

static void session_execute(struct session *s, struct line *ln)
{
    struct proto_request r;
    struct proto_error err;

    enum proto_parse_status st = proto_parse(ln->data, ln->len, &server.limits,
                                             &r, &err);
    if (st == PROTO_PARSE_EMPTY)
        return;
    stats.commands++;
    if (st == PROTO_PARSE_ERROR) {
        reply_err(s, err.code, err.msg);
        return;
    }
    if (!s->authed && server.conf->auth.password && cmd_needs_auth(r.cmd)) {
        reply_err(s, PROTO_ERR_NOAUTH, "authentication required: send AUTH "
                  "<password> first");
        return;
    }
    switch (r.cmd) {
    case PROTO_CMD_PING:     cmd_ping(s, &r); break;
    case PROTO_CMD_HELLO:    cmd_hello(s, &r); break;
    case PROTO_CMD_AUTH:     cmd_auth(s, &r); break;
    case PROTO_CMD_LOCK:     cmd_lock(s, &r); break;
    case PROTO_CMD_UNLOCK:   cmd_unlock(s, &r); break;
    case PROTO_CMD_EXTEND:   cmd_extend(s, &r); break;
    case PROTO_CMD_LOCKS:    cmd_locks(s); break;
    case PROTO_CMD_STATUS:   cmd_status(s, &r); break;
    case PROTO_CMD_SESSIONS: reply_json(s, session_list_json()); break;
    case PROTO_CMD_STATS:    reply_json(s, stats_json()); break;
    case PROTO_CMD_HELP:     cmd_help(s); break;
    case PROTO_CMD_QUIT:     cmd_quit(s); break;
    default:
        reply_err(s, PROTO_ERR_UNKNOWN, NULL);
        break;
    }
}

void session_process(struct session *s)
{
    if (s->in_process)
        return;     /* an answer arrived synchronously; the loop goes on */
    s->in_process = true;
    session_ref(s);
    while (!s->closing && !s->busy) {
        if (!s->qhead && !conn_refill(s))
            break;
        if (!s->qhead)
            continue;   /* only empty lines were framed */
        struct line *ln = s->qhead;
        s->qhead = ln->next;
        if (!s->qhead)
            s->qtail = NULL;
        s->qlen--;
        ln->next = NULL;
        if (ln->toolong) {
            reply_errf(s, PROTO_ERR_TOOLONG, "request line longer than %u "
                       "bytes (limits.max_line); closing",
                       server.conf->limits.max_line);
            free(ln);
            queue_free(s);
            s->died = true;
            s->quit = true;
            s->close_after_write = true;
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

/* ---- leases and the end of a session ----------------------------------- */

void session_add_lease(struct session *s, struct lease *l)
{
    l->s_prev = NULL;
    l->s_next = s->leases;
    if (s->leases)
        s->leases->s_prev = l;
    s->leases = l;
    s->nleases++;
}

void session_remove_lease(struct session *s, struct lease *l)
{
    if (l->s_prev)
        l->s_prev->s_next = l->s_next;
    else
        s->leases = l->s_next;
    if (l->s_next)
        l->s_next->s_prev = l->s_prev;
    l->s_prev = l->s_next = NULL;
    s->nleases--;
}

void session_lease_lost(struct session *s, struct lease *l,
                        enum lockmgr_lost_reason why)
{
    const char *res = lockmgr_lease_resource(l);
    size_t len = strlen(res);
    const struct conf *c = server.conf;

    if (s->closing)
        return;
    log_warn("%s (%s): lease on %s lost (%s)", s->idstr, s->peer, res,
             lockmgr_lost_reason_name(why));
    /* Remember it so a later UNLOCK/EXTEND says LOST, not NOTHELD; bounded
     * like the leases themselves. */
    if (s->nlost < c->limits.max_locks_per_session) {
        struct lost_lease *x = mem_alloc(sizeof(*x) + len + 1);
        memcpy(x->resource, res, len + 1);
        x->next = s->lost;
        s->lost = x;
        s->nlost++;
    }
    struct sbuf b = SBUF_INIT;
    proto_format_event_lost(&b, res, l->fence, lockmgr_lost_reason_name(why));
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
    conn_flush(s);
}

void session_on_eof(struct session *s)
{
    session_ref(s);
    lockmgr_cut_wait(s);    /* may answer, and run the queue meanwhile */
    if (!s->closing)
        session_process(s);
    session_unref(s);
}

void session_end(struct session *s)
{
    timer_stop(&s->idle_timer);
    session_unlist(s);
    queue_free(s);
    lockmgr_session_end(s, s->died);
}

void session_shutdown_notice(struct session *s)
{
    struct sbuf b = SBUF_INIT;
    proto_format_event_shutdown(&b);
    conn_send_buf(s, &b);
    sbuf_deinit(&b);
    /* Try to get it out now: the connection closes right after. */
    if (!s->writing && s->out.len > 0) {
        uv_buf_t ub = uv_buf_init(s->out.data, (unsigned)s->out.len);
        int k = uv_try_write(&s->h.stream, &ub, 1);
        if (k > 0)
            sbuf_consume(&s->out, (size_t)k);
    }
}

void session_set_shutdown(void)
{
    S.shutdown = true;
}

bool session_shutting_down(void)
{
    return S.shutdown;
}

void session_close_all(const char *why)
{
    while (S.head) {
        struct session *s = S.head;
        session_shutdown_notice(s);
        conn_close(s, false, why);  /* unlists s */
    }
}
