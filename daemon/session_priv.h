/*
 * session's private header: what its two files share. Nothing outside
 * daemon/session*.c includes it.
 *
 *   session.c      a session's life: create, attach, detach, resume, end;
 *                  the tables of attached and detached sessions, SESSIONS,
 *                  shutdown
 *   session_cmd.c  what its lines mean: the commands, auth and users, the
 *                  answers lockmgr gives (worded for the client), and the
 *                  requests in flight (tagged requests, their order)
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

/* session.c */
void session_ref(struct session *s);
void session_unref(struct session *s);
/* Add a lost lease to list (bounded like the leases themselves): at the
 * head, or at the tail for oldest first. */
void session_lost_add(struct list *list, size_t *n, bool tail,
                      const char *resource, uint64_t fence,
                      enum lockmgr_lost_reason why);
/* HELLO resume=: s's connection serves the session named from now on, if
 * the secret is right (s, which holds nothing, ends); NULL when refused
 * (answered on the request r came with: tag NULL). */
struct session *session_resume(struct session *s,
                               const struct proto_request *r);
/* After the reply to a resume: what was lost while detached. */
void session_tell_untold(struct session *s);
/* SESSIONS as s may see it (a user's: its own sessions). */
json_t *session_list_for(const struct session *s);

/* session_cmd.c */
extern const struct lockmgr_owner_ops session_owner_ops;
/* A new session's part of it (its timers). */
void session_cmd_init(struct session *s);
/* conn ops: one request line; does the session still owe answers? */
void session_cmd_line(struct session *s, char *line, size_t len);
bool session_cmd_busy(const struct session *s);
/* The connection leaves s (closed, detached, taken over): its requests in
 * flight are withdrawn (their answers will not come: lockmgr's owner was
 * cancelled), what it was told goes with it. */
void session_cmd_withdraw(struct session *s);
/* SESSIONS: s's requests in flight (their count, and the first few). */
void session_cmd_inflight_json(const struct session *s, json_t *j);
/* EVENT LOST resource=... on s's connection. */
void session_say_watch(struct watch_client *c, const char *line, size_t len);
void session_say_lost(struct session *s, const char *resource,
                      uint64_t fence, enum lockmgr_lost_reason why);
/* ERR <code> <msg>, untagged, on s's connection (counted). */
void session_say_err(struct session *s, enum proto_err code, const char *msg);

#endif
