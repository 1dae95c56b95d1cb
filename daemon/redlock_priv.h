/*
 * redlock's private header: what its files share, and the functions one
 * file of it calls in another (prefix rl_). Nothing outside
 * daemon/redlock*.c includes it.
 *
 * The files, bottom to top; each calls only the files below it:
 *   redlock.c         the rules, pure: quorum, drift, validity, the
 *                     outcome of a round, the fence plan; tokens
 *   redlock_vote.c    a node's reply to an op's round, as its vote:
 *                     acquire and raise (the fence counters), ADOPT (what
 *                     the token held), release and extend; error replies
 *                     logged, at most once per node and reason every few
 *                     seconds; the largest fence seen
 *   redlock_probe.c   the plain rounds: STATUS (INSPECT) and FORCEUNLOCK
 *                     (FORCE), one script to every node, done at the last
 *                     reply
 *   redlock_op.c      the ops: each operation lockmgr asks for, fanned
 *                     out to every node, answered at a quorum, its late
 *                     replies still counted; the raise round, the undo,
 *                     batches of renewals and releases; set-up and the
 *                     table lockmgr uses (struct redlock_ops)
 */
#ifndef REDLOCKD_REDLOCK_PRIV_H
#define REDLOCKD_REDLOCK_PRIV_H

#include "redlock.h"

#include <hiredis/hiredis.h>

#include "hmap.h"
#include "list.h"
#include "timer.h"

enum op_kind { OP_ACQUIRE, OP_RAISE, OP_RELEASE, OP_EXTEND, OP_ADOPT };

struct batch_queue;

/* One operation over every node (redlock_op.c has its life). */
struct op {
    enum op_kind kind;
    enum redlock_mode mode; /* acquire: what it takes */
    int nres;               /* acquire: resources */
    bool with_shared;       /* acquire: their shared sets follow the keys */
    int pending;            /* node requests outstanding (+1 while sending) */
    bool answered;          /* cb ran before the last reply (a quorum
                               decided); the op lives on until then */
    bool in_early;          /* an answered acquisition: in `early` */
    uint64_t awaiting;      /* nodes whose reply to this round is out */
    struct redlock_result res;
    uint64_t start_ns;
    uint32_t ttl;
    bool undo;              /* acquire: some node may hold our key */
    bool wait;              /* acquire: will wait (struct redlock_lock) */
    bool adopt_one;         /* adopt: keys are key, shared set, old token,
                               label, slot prefix (ADOPT_ONE) */
    uint32_t nslots;        /* adopt_one: slots to look at */
    bool adopted;           /* adopt_one: res.adopted_* set by a node */
    char *adopted_value;    /* (owned) adopt: res.adopted_value */
    struct redlock_node_vote *votes;    /* (owned) acquire: one per node */
    int *links;             /* (with votes) acquire: per node, the pool
                               connection its request went on */
    uint64_t *gens;         /* (in this allocation) per node, its
                               node_vote_gen when the request was sent */
    struct timer defer;     /* completes an op no node could take */
    redlock_cb cb;
    void *ud;
    const char **keys;      /* (in this allocation) nres keys, then nres
                               shared sets when with_shared */
    size_t *lens;
    const char *key;        /* keys[0], for logs and one-key ops */
    size_t keylen;
    const char *label;      /* acquire: the holder label ("" for none), in
                               this allocation after the keys */
    struct list blink;      /* batched: in its queue (struct batch_queue),
                               or waiting in an acquisition's followers */
    struct batch_queue *bq; /* waiting: the queue it joins then, or NULL */
    /* An acquisition answered before its last reply: in `early` by token,
     * with the batched releases and extends of that token waiting for
     * it. */
    struct hmap_node tnode;
    struct list followers;
    char token[REDLOCK_TOKEN_LEN + 1];
    _Alignas(uint64_t) char buf[];  /* gens, the key pointers and lengths,
                                       then the keys' bytes, each
                                       NUL-terminated */
};

/* redlock_vote.c */
/* Before the first op: the error replies' table. */
void rl_vote_init(void);
/* Node's reply r (NULL: none, the node failed) to o's round, counted into
 * o->res (and o->votes, for an acquisition or its raise). */
void rl_vote_count(struct op *o, int node, const redisReply *r);
/* A fence script's reply that says the key is ours: its counter in *c.
 * False for any other reply. */
bool rl_vote_held(const redisReply *r, uint64_t *c);
/* The largest fence counter this daemon has seen a voting node hold for
 * one of its keys, or granted; rl_fence_saw(f) moves it up to f. Every
 * acquisition sends it: a node behind it moves up to it, so the nodes'
 * counters converge and the normal grant is one round. Only an
 * optimisation: the proof needs nothing from it. */
uint64_t rl_fence_seen(void);
void rl_fence_saw(uint64_t f);

/* redlock_probe.c */
/* Before the first round: the config (read live). */
void rl_probe_init(const struct conf *conf);
/* Rounds started and not finished. */
size_t rl_probe_live(void);

#endif
