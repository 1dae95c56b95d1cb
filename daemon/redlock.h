/*
 * redlock: one lock operation fanned out to all N nodes at once.
 *
 * Acquire: SET NX PX on every node in parallel (the acquire script also
 * reads the node's fence counter); with a quorum of votes and validity left,
 * the fence is raised to max+1 on a quorum before success is reported, so
 * fences strictly increase across daemons (see docs/design.md). On any
 * failure the partial keys are removed from every node, owner-checked.
 * Release and extend are owner-checked too; inspect reads each node's PTTL.
 *
 * Requests go out through pool_script/pool_command; which answers count is
 * node's call (node_votes: up and not recovering from a restart). A release
 * that cannot reach a node is left to node_release_later, and every fence
 * granted is reported to node_note_fence for repairs.
 *
 * An operation always completes: its callback runs exactly once, within
 * about command_timeout_ms per round, even if every node is down. Callers
 * that may go away meanwhile keep a reference on themselves until then.
 * The arithmetic is in pure functions (redlock_quorum, redlock_drift_ms,
 * redlock_validity, redlock_decide) with unit tests. redlock_init hands node
 * the two numbers it applies to restarted nodes (node_set_rules): the
 * quorum and max_ttl_ms plus its drift.
 */
#ifndef REDLOCKD_REDLOCK_H
#define REDLOCKD_REDLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REDLOCK_TOKEN_LEN 32    /* hex chars of a 128-bit token */

enum redlock_status {
    REDLOCK_OK,
    REDLOCK_BUSY,           /* held by another token on too many nodes */
    REDLOCK_UNAVAILABLE,    /* not enough nodes answered in time */
    REDLOCK_LOST,           /* extend: our key is gone on too many nodes */
};

struct redlock_result {
    enum redlock_status status;
    int ok;                 /* counted (voting) successes */
    int busy;               /* nodes holding another token (acquire) or
                               not holding ours (extend/release) */
    int failed;             /* errors, timeouts, down or non-voting nodes */
    uint64_t fence;         /* acquire: the fencing token */
    int64_t validity;       /* acquire/extend: ms of validity left */
    int64_t pttl;           /* acquire BUSY: smallest PTTL seen, -1 unknown */
    int deleted;            /* release: nodes where our key was deleted */
    uint64_t elapsed_ms;
};

typedef void (*redlock_cb)(void *ud, const struct redlock_result *res);

/* Per-node view for STATUS. */
struct redlock_node_view {
    const char *name;       /* the node's address as configured */
    bool up;
    bool voting;
    bool answered;
    int64_t pttl;           /* -2 no key, -1 no expiry, else ms */
};
typedef void (*redlock_inspect_cb)(void *ud, const struct redlock_node_view *v,
                                   int n);

struct conf;
void redlock_init(const struct conf *conf);

void redlock_acquire(const char *key, size_t keylen, const char *token,
                     uint32_t ttl, redlock_cb cb, void *ud);
/* cb may be NULL when nobody waits for the answer. */
void redlock_release(const char *key, size_t keylen, const char *token,
                     redlock_cb cb, void *ud);
void redlock_extend(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud);
void redlock_inspect(const char *key, size_t keylen, redlock_inspect_cb cb,
                     void *ud);
/* FORCEUNLOCK (operators): see struct redlock_ops. */
void redlock_force_release(const char *key, size_t keylen, redlock_cb cb,
                           void *ud);

/*
 * What lockmgr needs of redlock, as a table so that lockmgr's unit tests can
 * put a scripted fake in its place (tests/unit/test_lockmgr.c).
 * redlock_ops_default is the real thing.
 */
struct redlock_ops {
    void (*acquire)(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud);
    void (*release)(const char *key, size_t keylen, const char *token,
                    redlock_cb cb, void *ud);
    void (*extend)(const char *key, size_t keylen, const char *token,
                   uint32_t ttl, redlock_cb cb, void *ud);
    void (*inspect)(const char *key, size_t keylen, redlock_inspect_cb cb,
                    void *ud);
    /* Delete key on every node whatever it holds, and announce it;
     * res->deleted counts the nodes that had it. */
    void (*force_release)(const char *key, size_t keylen, redlock_cb cb,
                          void *ud);
    int (*token)(char out[REDLOCK_TOKEN_LEN + 1]);
    int (*nnodes)(void);
    int (*quorum)(void);
};
extern const struct redlock_ops redlock_ops_default;

/* Nodes configured, and how many must agree. */
int redlock_nnodes(void);
int redlock_nquorum(void);

/* Operations started and not finished (shutdown waits for them). */
size_t redlock_live(void);

/* Pure parts. */
int redlock_quorum(int nnodes);
/* The clock drift allowed over ttl ms: factor * ttl (truncated) plus
 * REDLOCK_DRIFT_MIN_MS, as the Redlock paper adds for timer granularity.
 * Subtracted from every validity, and added to max_ttl_ms before a
 * restarted node votes again. */
#define REDLOCK_DRIFT_MIN_MS 2
int64_t redlock_drift_ms(uint32_t ttl, double factor);
/* ms of a lock's ttl left after elapsed_ms, drift taken off; <= 0: none. */
int64_t redlock_validity(uint32_t ttl, uint64_t elapsed_ms, double drift);
enum redlock_status redlock_decide(int nnodes, int ok, int busy, int failed,
                                   int64_t validity);
/* 32 lower-case hex chars + NUL from the OS random source; 0 or -1. */
int redlock_token(char out[REDLOCK_TOKEN_LEN + 1]);

#endif
