/*
 * session's private header: what its files share. Nothing outside
 * daemon/session*.c includes it.
 *
 * The files, bottom to top; each calls only the files below it:
 *
 *   session.c          a session's life: create, attach, detach, resume,
 *                      end; the tables of attached and detached sessions,
 *                      the lists of leases lost, the events it says on its
 *                      own, SESSIONS, shutdown
 *   session_reply.c    an answer's line: "#<tag> " first, ERR counted by
 *                      code, refusals worded, OK and JSON; what the
 *                      sessions count (struct session_counters)
 *   session_req.c      the requests in flight: their records (struct
 *                      sreq), the order per resource, tags, when a
 *                      request may start, pausing the connection,
 *                      withdrawing them
 *   session_auth.c     who the session is and what it may touch: HELLO,
 *                      AUTH, a client certificate's user, a user's
 *                      prefixes (ERR DENIED), the operators' check
 *   session_lock.c     LOCK, ADOPT, UNLOCK, EXTEND and lockmgr's answers
 *                      to them worded; who times those answers
 *   session_inspect.c  what is held and who may change that: LOCKS,
 *                      STATUS, TOP, STATS, SESSIONS, WATCH, UNWATCH,
 *                      FORCEUNLOCK, READMIT
 *   session_cmd.c      what the lines mean: each read, run now or queued,
 *                      run through the commands above when its turn
 *                      comes, answered (at once, by lockmgr's owner
 *                      callbacks, or by the delayed AUTH's timer), the
 *                      next started; it makes the sessions
 *                      (session_create) and owns the tables they are
 *                      called through
 *
 * session.c calls no file above it by name: the command files serve a
 * session through the struct session_ops it was made with. A command
 * whose answer comes later keeps its record (session_serve_later); only
 * session_cmd.c finishes records (its sreq_done starts what is ready,
 * which runs commands again).
 */
#ifndef REDLOCKD_SESSION_PRIV_H
#define REDLOCKD_SESSION_PRIV_H

#include "session.h"

#include <jansson.h>

/* A lease lost: told already (lost), or to be told on resume (untold). */
struct session_lost {
    struct list link;
    uint64_t fence;
    enum lockmgr_lost_reason why;
    char resource[];
};

struct session_table {
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
};
extern struct session_table sessions;

/* What serves a session (session_cmd.c), handed to session_new: session.c
 * reaches the layer above it only through this. */
struct session_ops {
    /* What each connection the session gets calls (conn_bind); its
     * `closed` is session_on_closed. */
    const struct conn_ops *conn;
    /* lockmgr's answers to the session (lockmgr_owner_init). */
    const struct lockmgr_owner_ops *owner;
    /* The connection leaves s (closed, detached, taken over): its
     * requests in flight are withdrawn (their answers will not come:
     * lockmgr's owner is cancelled right after), what it was told goes
     * with it. */
    void (*withdraw)(struct session *s);
    /* SESSIONS: s's requests in flight (their count, and the first few)
     * into its entry j. */
    void (*inflight_json)(const struct session *s, json_t *j);
};

/* session.c */
/* A new session, attached to c (which it binds to ops->conn), served by
 * ops. */
struct session *session_new(struct conn *c, const struct session_ops *ops);
/* conn ops->closed: the connection ended. Without QUIT a session that
 * asked for detach= detaches; otherwise it ends. */
void session_on_closed(struct conn *c, void *data);
void session_ref(struct session *s);
void session_unref(struct session *s);
/* Add a lost lease to list (bounded like the leases themselves): at the
 * head, or at the tail for oldest first. */
void session_lost_add(struct list *list, size_t *n, bool tail,
                      const char *resource, uint64_t fence,
                      enum lockmgr_lost_reason why);
/* HELLO resume=: s's connection serves the session named from now on, if
 * the secret is right (s, which must hold and wait for nothing, ends);
 * NULL when no session of that name has that secret (nothing answered). */
struct session *session_resume(struct session *s,
                               const struct proto_request *r);
/* After the reply to a resume: what was lost while detached. */
void session_tell_untold(struct session *s);
/* SESSIONS as s may see it (a user's: its own sessions). */
json_t *session_list_for(const struct session *s);

/* The lease on res was lost and told (s->lost)? session_take_lost also
 * forgets it (true if it was). */
bool session_was_lost(const struct session *s, const char *res, size_t len);
bool session_take_lost(struct session *s, const char *res, size_t len);
/* EVENT HOLDER (watch.h) and EVENT LOST on s's connection, if it has
 * one. */
void session_say_watch(struct watch_client *c, const char *line, size_t len);
void session_say_lost(struct session *s, const char *resource,
                      uint64_t fence, enum lockmgr_lost_reason why);

/* ---- the command files' (session_cmd.c and the files under it) ---------- */

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
struct session_to {
    struct session *s;
    const char *tag;
    size_t tag_len;
};

/* The request being served by a command. */
struct session_serve {
    struct session_to t;
    const struct proto_request *r;
    struct sreq *q;                 /* its record: set when it waits for
                                       an answer (session_serve_later), or
                                       when it had to wait for its turn */
};

/* session_reply.c */
/* The buffer for one reply line to t, its tag written; NULL when nobody
 * can hear it (no connection, or one being closed). */
struct sbuf *session_say(const struct session_to *t);
/* ERR <code> <msg> (counted); msg may be NULL (the code's own words). */
void session_say_err(const struct session_to *t, enum proto_err code,
                     const char *msg);
void session_say_errf(const struct session_to *t, enum proto_err code,
                      const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A refusal of command cmd, worded (wording.h). */
void session_say_refusal(const struct session_to *t, enum proto_cmd cmd,
                         const struct lockmgr_refusal *no);
void session_say_ok(const struct session_to *t);
/* "OK <json>"; takes the reference to j. */
void session_say_json(const struct session_to *t, json_t *j);
/* A request line parsed (empty ones are not counted). */
void session_count_command(enum proto_cmd cmd);

/* session_req.c */
/* The resources r names that its order may depend on. */
size_t session_req_resources(const struct proto_request *r,
                             const char *const **res, const size_t **len);
/* Would a tagged request naming these resources have to wait for one
 * read before it? */
bool session_req_queued(const struct session *s, const char *const *res,
                        const size_t *len, size_t n);
bool session_req_tag_in_use(const struct session *s, const char *tag,
                            size_t len);
/* The record of r, read on s: last in s->reqs, in the queues of its
 * resources. line (len bytes), when given, is kept to run it later. */
struct sreq *session_req_new(struct session *s, const struct proto_request *r,
                             const char *line, size_t len);
/* Off every queue and table; the requests whose turn it was are ready
 * (on s->ready). */
void session_req_unlink(struct sreq *q);
void session_req_free(struct sreq *q);
/* Where q's answer goes. */
struct session_to session_req_to(const struct sreq *q);
/* Pause or resume the connection's lines as the requests in flight
 * demand. */
void session_req_flow(struct session *s);
/* conn ops->busy: are answers still owed? */
bool session_req_busy(const struct session *s);
/* session ops->withdraw and ->inflight_json (struct session_ops). */
void session_req_withdraw(struct session *s);
void session_req_json(const struct session *s, json_t *j);
/* The command needs an answer it will get later: its record, running
 * (the `ask` lockmgr hands back). */
struct sreq *session_serve_later(struct session_serve *v);

/* session_auth.c */
/* With a password or users configured, a client logs in first. */
bool session_login_required(void);
/* A verified client certificate whose subject CN names a user logs s in
 * as that user (see the function). */
void session_login_cert(struct session *s);
/* The user s is logged in as, in the configuration as it is now; NULL
 * when s is no user's, or its user was removed by a reload. */
const struct users_user *session_user(const struct session *s);
/* ERR DENIED, audited. res may be NULL (READMIT). */
void session_deny(struct session_serve *v, enum proto_cmd cmd,
                  const char *res, size_t len, const char *why);
/* May the session do cmd to each of res[0..n)? False when refused
 * (answered ERR DENIED). */
bool session_may(struct session_serve *v, enum proto_cmd cmd,
                 const char *const *res, const size_t *len, size_t n);
/* An operator's right to FORCEUNLOCK res, or to READMIT (res NULL);
 * false when refused (answered). */
bool session_is_operator(struct session_serve *v, enum proto_cmd cmd,
                         const char *res, size_t len);
void session_cmd_hello(struct session_serve *v);
void session_cmd_auth(struct session_serve *v);

/* session_lock.c */
void session_cmd_lock(struct session_serve *v);
void session_cmd_adopt(struct session_serve *v);
void session_cmd_unlock(struct session_serve *v);
void session_cmd_extend(struct session_serve *v);
/* lockmgr's answers to them (struct lockmgr_owner_ops), said to the
 * request q (the `ask`); its record is session_cmd.c's to finish. */
void session_answer_locked(const struct sreq *q, const struct lockmgr_grant *g,
                           const struct lockmgr_refusal *no);
void session_answer_unlocked(const struct sreq *q, const char *resource,
                             size_t nres, int nodes,
                             const struct lockmgr_refusal *no);
void session_answer_extended(const struct sreq *q, const char *resource,
                             uint32_t ttl, int64_t validity,
                             const struct lockmgr_refusal *no);

/* session_inspect.c */
void session_cmd_locks(struct session_serve *v);
void session_cmd_status(struct session_serve *v);
void session_cmd_top(struct session_serve *v);
void session_cmd_stats(struct session_serve *v);
void session_cmd_sessions(struct session_serve *v);
void session_cmd_watch(struct session_serve *v);
void session_cmd_unwatch(struct session_serve *v);
void session_cmd_forceunlock(struct session_serve *v);
void session_cmd_readmit(struct session_serve *v);
/* lockmgr's answer to STATUS, said to the request q. */
void session_answer_status(const struct sreq *q,
                           const struct lockmgr_status *st);

#endif
