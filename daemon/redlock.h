/*
 * redlock: one lock operation fanned out to all N nodes at once.
 *
 * Acquire: one script per node takes the key with SET NX PX (or, for a
 * shared lock, adds our member to the resource's set of shared holders;
 * for several resources, takes every key or none) and, in the
 * same step, sets that node's fence counter to max(counter, the largest
 * fence this daemon has seen) + 1 and returns it. The fence F is the
 * largest value the granting nodes returned. A grant counts once a quorum
 * of nodes on which this acquisition holds the key each store a counter of
 * at least F, written while the key was ours: when the granting nodes
 * returned F (or a quorum of them did), that is the first round; else the
 * ones below F are raised by an owner-checked script in a second round,
 * and validity is checked again (for a shared grant, owner-checked on its
 * member in the set). Why that makes fences strictly increase
 * across daemons is in docs/design.md, "Fences". On any failure the
 * partial keys are removed from every node, owner-checked. Release and
 * extend are owner-checked too; inspect reads each node's PTTL.
 *
 * Each call's words are script.h's, sent with pool_call; which answers count is
 * node's call (node_votes: up and not recovering from a restart). A release
 * that cannot reach a node is left to node_release_later, and every fence
 * granted is reported to node_note_fence for repairs. A Redis error reply
 * (OOM, NOAUTH, READONLY, WRONGTYPE, ...) is a failed vote; its reason is
 * logged, once per node and reason every few seconds.
 *
 * An operation always completes: its callback runs exactly once, within
 * about command_timeout_ms per round, even if every node is down. Callers
 * that may go away meanwhile keep a reference on themselves until then.
 * The arithmetic is in pure functions (redlock_quorum, redlock_drift_ms,
 * redlock_validity, redlock_decide, redlock_fence_plan) with unit tests.
 * redlock_init hands node the two numbers it applies to restarted nodes
 * (node_set_rules): the quorum and max_ttl_ms plus its drift.
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

enum redlock_mode { REDLOCK_EXCLUSIVE, REDLOCK_SHARED };
/* The key a lease's token is in: the exclusive key, a member of the
 * shared set, a semaphore slot. */
enum redlock_held { REDLOCK_HELD_KEY, REDLOCK_HELD_SHARED, REDLOCK_HELD_SLOT };

struct redlock_result {
    enum redlock_status status;
    int ok;                 /* counted (voting) successes; acquire: nodes
                               holding the key at the end */
    int busy;               /* nodes holding another token (acquire) or
                               not holding ours (extend/release) */
    int failed;             /* errors, timeouts, down or non-voting nodes */
    uint64_t fence;         /* acquire: the fencing token */
    int rounds;             /* acquire: 1, or 2 after a raise round */
    int64_t validity;       /* acquire/extend: ms of validity left */
    int64_t pttl;           /* acquire BUSY: smallest PTTL seen, -1 unknown */
    int deleted;            /* release: nodes where our key was deleted */
    uint64_t elapsed_ms;
    /* adopt of one resource: what the token held */
    enum redlock_held adopted;
    uint32_t adopted_slot;  /* REDLOCK_HELD_SLOT: which */
    uint32_t adopted_limit; /* and its semaphore's size as stored, 0 when
                               not stored */
    const char *adopted_value;  /* an exclusive lease's holder value, carried
                                   over (label.h), or NULL */
};

typedef void (*redlock_cb)(void *ud, const struct redlock_result *res);

/* What one acquisition takes; lockmgr makes the key names. */

struct redlock_lock {
    enum redlock_mode mode;
    int n;                      /* resources: 1, or up to CONF_MAX_MULTI
                                   (EXCLUSIVE only): all of them or none */
    const char *const *keys;    /* n exclusive keys (strings, SET NX PX) */
    const size_t *lens;
    const char *const *shared;  /* n keys of the resources' shared holders'
                                   sets, which an exclusive grant must find
                                   without a live member; NULL for keys that
                                   have no shared holders (semaphore slots).
                                   SHARED: our member goes into shared[0]. */
    const size_t *shared_lens;
    const char *label;          /* stored after the token of exclusive keys
                                   (STATUS on other daemons reads it), or
                                   NULL; one word */
    size_t labellen;
    bool wait;                  /* it waits when turned away: mark the keys
                                   in its way, so their release is
                                   announced */
};

/* ADOPT (protocol.md): keys holding old_token get token and label, with
 * the fence each carries, and the ttl, on every node; the result's
 * status is OK with a quorum of voting nodes that did so in time (fence:
 * the largest they carried), BUSY when too many did not hold the old
 * token, else UNAVAILABLE. Keys rotated on too few nodes are left to
 * expire. One resource (`one`) may be held in any way: the exclusive key,
 * a member of the shared set or one of probe->limit semaphore slots; the
 * result says which (adopted_*), and nodes that disagree do not count. */
struct redlock_probe;
struct redlock_adopt {
    int n;                      /* exclusive keys of one multi-resource
                                   grant (keys, lens), or 0 with one */
    const struct redlock_probe *one;
    const char *const *keys;
    const size_t *lens;
    const char *old_token;      /* REDLOCK_TOKEN_LEN hex chars */
    const char *token;          /* the new one */
    const char *label;          /* as in struct redlock_lock */
    size_t labellen;
    uint32_t ttl;
};
void redlock_adopt(const struct redlock_adopt *a, redlock_cb cb, void *ud);

/* What STATUS and FORCEUNLOCK look at for one resource. */
struct redlock_probe {
    const char *key;            /* the exclusive key */
    size_t keylen;
    const char *shared;         /* the shared holders' set */
    size_t sharedlen;
    const char *slots;          /* slot i's key is this prefix + i */
    size_t slotslen;
    uint32_t limit;             /* slots 0..limit-1 (0: none) */
};

/* Per-node view for STATUS. */
struct redlock_node_view {
    const char *name;       /* the node's address as configured */
    bool up;
    bool voting;
    bool answered;
    int64_t pttl;           /* exclusive key: -2 no key, -1 no expiry, else ms */
    int64_t shared;         /* live shared holders */
    const char *slots;      /* limit chars, '1' for a slot key that exists,
                               or NULL when the node did not answer */
    /* The exclusive key's value: its token (the first word, or all of a
     * value some other client set), and for redlockd's "token label
     * fence" the label and that fence. NULL, NULL, 0 when no key. */
    const char *token;
    const char *label;
    uint64_t fence;
    /* The label of the first slot key present (the semaphore's size is
     * in it), or NULL. */
    const char *slot_label;
};
typedef void (*redlock_inspect_cb)(void *ud, const struct redlock_node_view *v,
                                   int n);

struct conf;
void redlock_init(const struct conf *conf);
/* Free what redlock_init allocated, once no op is left (redlock_live). */
void redlock_deinit(void);

void redlock_acquire(const struct redlock_lock *lk, const char *token,
                     uint32_t ttl, redlock_cb cb, void *ud);
/* cb may be NULL when nobody waits for the answer. key is an exclusive key
 * or a shared set (the script tells them apart). */
void redlock_release(const char *key, size_t keylen, const char *token,
                     redlock_cb cb, void *ud);
void redlock_extend(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud);
/* An extend that also replaces the key's holder label (EXTEND value=),
 * answered as an extend. */
void redlock_relabel(const char *key, size_t keylen, const char *token,
                     uint32_t ttl, const char *label, size_t labellen,
                     redlock_cb cb, void *ud);
/* redlock_extend and redlock_release for requests nobody waits for
 * (renewals, lock-delay, the releases of ended sessions): those asked for
 * within a millisecond go to each node together, as one script that
 * handles each key owner-checked. */
void redlock_extend_batched(const char *key, size_t keylen, const char *token,
                            uint32_t ttl, redlock_cb cb, void *ud);
void redlock_release_batched(const char *key, size_t keylen,
                             const char *token, redlock_cb cb, void *ud);
void redlock_inspect(const struct redlock_probe *p, redlock_inspect_cb cb,
                     void *ud);
/* FORCEUNLOCK (operators): see struct redlock_ops. */
void redlock_force_release(const struct redlock_probe *p, redlock_cb cb,
                           void *ud);

/*
 * What lockmgr needs of redlock, as a table so that lockmgr's unit tests can
 * put a scripted fake in its place (tests/unit/test_lockmgr.c).
 * redlock_ops_default is the real thing.
 */
struct redlock_ops {
    void (*acquire)(const struct redlock_lock *lk, const char *token,
                    uint32_t ttl, redlock_cb cb, void *ud);
    void (*release)(const char *key, size_t keylen, const char *token,
                    redlock_cb cb, void *ud);
    void (*extend)(const char *key, size_t keylen, const char *token,
                   uint32_t ttl, redlock_cb cb, void *ud);
    void (*relabel)(const char *key, size_t keylen, const char *token,
                    uint32_t ttl, const char *label, size_t labellen,
                    redlock_cb cb, void *ud);
    void (*extend_batched)(const char *key, size_t keylen,
                           const char *token, uint32_t ttl, redlock_cb cb,
                           void *ud);
    void (*release_batched)(const char *key, size_t keylen,
                            const char *token, redlock_cb cb, void *ud);
    void (*inspect)(const struct redlock_probe *p, redlock_inspect_cb cb,
                    void *ud);
    /* Delete the resource's keys on every node whatever they hold, and
     * announce it; res->deleted counts the nodes that had one. */
    void (*force_release)(const struct redlock_probe *p, redlock_cb cb,
                          void *ud);
    void (*adopt)(const struct redlock_adopt *a, redlock_cb cb, void *ud);
    int (*token)(char out[REDLOCK_TOKEN_LEN + 1]);
    int (*nnodes)(void);
    int (*quorum)(void);
    /* Why fewer than a quorum vote now, one line in buf (0: nothing known,
     * e.g. the nodes simply answered too late). */
    size_t (*why_unavailable)(char *buf, size_t size);
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

/*
 * The fence decision, pure (docs/design.md, "Fences"). Each node's part in
 * an acquisition after a round:
 */
enum redlock_vote {
    REDLOCK_VOTE_FAILED,    /* no answer, an error reply, or not voting */
    REDLOCK_VOTE_BUSY,      /* the key does not hold our token there */
    REDLOCK_VOTE_HELD,      /* a voting node where the key holds our token */
};

struct redlock_node_vote {
    enum redlock_vote vote;
    uint64_t counter;       /* HELD: the fence counter the node left while
                               the key held our token */
};

enum redlock_step {
    REDLOCK_STEP_GRANT,     /* a quorum of holders is at the fence or above */
    REDLOCK_STEP_RAISE,     /* a quorum holds the key, too few at the fence:
                               raise the holders below it, decide again */
    REDLOCK_STEP_FAIL,      /* give up and undo; status says why */
};

struct redlock_fence_plan {
    enum redlock_step step;
    enum redlock_status status; /* REDLOCK_OK unless step is FAIL */
    uint64_t fence;             /* F */
    int held, busy, failed;     /* votes of each kind */
    int reached;                /* holders with a counter of at least F */
};

/*
 * Decide an acquisition from the votes v[0..n). fence: 0 in the first
 * round, where F is the largest counter of the holders; after the raise
 * round, that round's F (it is kept). may_raise: a raise round may still
 * follow (false after it). raise, unless NULL, gets raise[i] set for each
 * holder below F: where a raise round would go.
 */
void redlock_fence_plan(const struct redlock_node_vote *v, int n,
                        uint64_t fence, int64_t validity, bool may_raise,
                        struct redlock_fence_plan *plan, bool *raise);

/* 32 lower-case hex chars + NUL from the OS random source; 0 or -1. */
int redlock_token(char out[REDLOCK_TOKEN_LEN + 1]);

#endif
