/*
 * session's private header: what its two files share. Nothing outside
 * daemon/session*.c includes it.
 *
 *   session.c      a session's life: create, attach, detach, resume, end;
 *                  the tables of attached and detached sessions, the lists
 *                  of leases lost, the events it says on its own,
 *                  SESSIONS, shutdown
 *   session_cmd.c  what its lines mean: the commands, auth and users, the
 *                  answers lockmgr gives (worded for the client), and the
 *                  requests in flight (tagged requests, their order); it
 *                  makes the sessions (session_create) and owns the tables
 *                  they are called through
 *
 * session_cmd.c calls session.c; session.c calls session_cmd.c only
 * through the struct session_ops each session was made with.
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

#endif
