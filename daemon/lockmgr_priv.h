/*
 * lockmgr's private header: the structures its files share, and the
 * functions one file of it calls in another (prefix lm_). Nothing outside
 * daemon/lockmgr*.c includes it but lockmgr's own unit test (the pattern
 * of client/redlockd_priv.h). What it declares is the bottom layer's,
 * lockmgr.c's (with lockmgr.h, the contract every part works to): the
 * shared state `lm` and the structures every part works on.
 *
 * The files, bottom to top; each calls only the files below it (a layer
 * that must tell one above it something does so through a pointer that
 * lockmgr_init installs: lm.kick):
 *   lockmgr.c          the shared state (lm), owners and their answers
 *                      (notices), the observers, the audit trail, the
 *                      entries of the lock table, holder labels, probes
 *   lockmgr_lease.c    leases: renewal, loss, release (UNLOCK), EXTEND;
 *                      a holder gone kicks the waiters through lm.kick
 *   lockmgr_wait.c     LOCK requests: who may talk to Redis, the queues,
 *                      attempts, wake-ups, grants (which make leases)
 *   lockmgr_adopt.c    ADOPT (it makes leases, and loses the old ones)
 *   lockmgr_inspect.c  FORCEUNLOCK, STATUS, the views LOCKS and TOP show
 *   lockmgr_life.c     set-up and start-up, and what ends or cancels an
 *                      owner: the entry points that reach several layers
 *
 * Ownership:
 * - An entry lives while it has holders or waiters (lm_entry_maybe_free),
 *   and while a kick walks its queue (pins).
 * - A lockreq (one LOCK request) is owned by the FIFOs it waits in (one
 *   per resource it names, all entered at once, so any two requests are in
 *   the same order in every queue they share); it holds an owner reference
 *   until it has answered. When its owner ends (or cancels) first,
 *   req->o becomes NULL and the request is dropped, or, if an acquisition
 *   is in flight, dropped when it completes (releasing the keys if it
 *   won).
 * - A lease is owned by lockmgr. While held it is on its owner's list and
 *   among its entry's holders; on release or loss it leaves the owner at
 *   once but stays among the holders until its keys are gone from Redis
 *   (so no local waiter races the release), then is freed when no op
 *   refers to it. The leases of one grant of several resources are
 *   siblings (glink), renewed together.
 *
 * Who may talk to Redis: a waiter whose every predecessor in each of its
 * queues is talking to Redis already, and that nothing held or asked for
 * ahead of it rules out: an exclusive request needs its entries empty and
 * itself first; a shared one, no exclusive holder or request ahead; a
 * semaphore's, a slot that no holder or request here has. So readers go
 * together, a writer waits for the readers before it and keeps the readers
 * after it waiting, and only one request at a time asks for a key.
 *
 * Answers to owners are notices: queued (with an owner reference) while
 * lockmgr works, delivered by lm_leave() when the outermost entry point is
 * done and every structure is consistent again. Every entry point (the
 * public functions, redlock callbacks, timer callbacks) runs between
 * lm_enter() and lm_leave().
 */
#ifndef REDLOCKD_LOCKMGR_PRIV_H
#define REDLOCKD_LOCKMGR_PRIV_H

#include "lockmgr.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "hmap.h"
#include "timer.h"

/* Where a request waits: one per resource it names. */
struct req_pos {
    struct list link;               /* in entry->waiters */
    struct lock_entry *e;
    struct lockreq *q;
};

struct lockreq {
    struct lockmgr_owner *o;        /* (ref) NULL once cancelled */
    void *ask;                      /* o's, handed back with the answer */
    struct list olink;              /* in o->waits while o's */
    enum lockmgr_mode mode;
    uint32_t limit;                 /* semaphore: K; 0 otherwise */
    int64_t slot;                   /* semaphore: the slot asked for, or -1 */
    uint32_t visited;               /* semaphore: slots considered this pass */
    int64_t hint;                   /* semaphore: a slot announced free, -1 */
    int64_t pass_pttl;              /* semaphore: least PTTL this pass */
    uint32_t ttl;
    bool renew;
    uint64_t asked_at;              /* timer_now ms */
    uint64_t deadline;              /* timer_now ms; 0 = do not wait */
    bool attempting;                /* a redlock acquire is in flight */
    bool no_token;                  /* the OS random source failed */
    bool cut;                       /* the client stopped waiting (EOF) */
    bool woken;                     /* its timer is a notified wake-up */
    bool notified;                  /* a release was announced meanwhile */
    bool shutdown;                  /* the daemon stops: no grant */
    struct list hlink;              /* in lm.held_back (start-up) */
    enum redlock_status last;
    struct timer timer;
    char token[REDLOCK_TOKEN_LEN + 1];
    const char *label;              /* stored with the token (label_put):
                                       in this allocation, after pos */
    size_t labellen;
    const char *value;              /* the holder's value= (in the label
                                       too), after it; NULL for none */
    size_t n;
    struct req_pos pos[];           /* n */
};

struct lock_entry {
    struct hmap_node node;
    struct list holders;            /* struct lease (elink): this daemon's,
                                       those whose keys are going away too */
    size_t nheld;                   /* holders */
    size_t nexcl;                   /* of them exclusive */
    size_t ngone;                   /* of them released or lost */
    size_t ngone_excl;              /* of those exclusive */
    struct list waiters;            /* struct req_pos, FIFO */
    size_t nwait;
    uint32_t limit;                 /* a semaphore of this many slots, or 0 */
    uint8_t *slots;                 /* (owned) semaphore: for each slot,
                                       the holders and requests here (2
                                       only while an ADOPT moves a lease
                                       from one session to another) */
    uint32_t nused;                 /* their sum */
    uint32_t ngone_slots;           /* of them by holders going away */
    int pins;                       /* kicks walking its queue */
    size_t keylen;
    const char *resource;           /* inside key, after the prefix */
    const char *shared;             /* key + ":shared", after key */
    size_t sharedlen;
    char key[];                     /* key_prefix + resource, NUL, shared */
};

struct lease {
    struct list olink;              /* in owner->leases while held */
    struct list elink;              /* in entry->holders while entry */
    struct list glink;              /* siblings: one grant's other leases */
    struct lockmgr_owner *owner;    /* NULL once released or lost */
    struct lock_entry *entry;       /* NULL once its keys are gone */
    enum lockmgr_mode mode;
    uint32_t limit;                 /* semaphore: K, or 0 */
    int64_t slot;                   /* semaphore: its slot, or -1 */
    char token[REDLOCK_TOKEN_LEN + 1];
    uint64_t fence;
    uint32_t ttl;                   /* current lease on Redis (ms) */
    bool renew;
    bool gone;                      /* released or lost: free when idle */
    bool extending;                 /* a renewal or EXTEND is in flight */
    bool renew_due;                 /* a renewal fell due meanwhile */
    struct extend_ctx *queued;      /* an EXTEND waiting for that one */
    int ops;                        /* redlock ops in flight for it */
    uint64_t acquired_at;           /* timer_now ms */
    uint64_t valid_until;           /* timer_now ms the validity runs out */
    uint64_t renewals;
    char *value;                    /* (owned) the holder's value=, or
                                       NULL */
    struct timer timer;             /* next renewal */
    struct timer deadline;          /* LOST, op in flight or not */
    size_t keylen;
    const char *key;                /* what it holds in Redis: the key, the
                                       shared set or the slot's key (in this
                                       allocation, after resource) */
    char resource[];
};

struct extend_ctx {
    struct lease *l;
    struct lockmgr_owner *o;        /* (ref) */
    void *ask;
    unsigned gen;                   /* o->gen when asked */
    uint32_t ttl;
    char *value;                    /* (owned) EXTEND value=, or NULL */
};

/* One UNLOCK of one or more leases: answered once all are released. */
struct unlock_ctx {
    struct lockmgr_owner *o;        /* (ref) */
    void *ask;
    unsigned gen;                   /* o->gen when asked */
    size_t n;                       /* leases */
    size_t left;                    /* releases not done yet */
    int nodes;                      /* the fewest deletions of any */
    bool lost;                      /* one had been lost before */
    char resource[];                /* the first lease's */
};

enum notice_kind { N_LOCKED, N_UNLOCKED, N_EXTENDED, N_LOST };

/* One answer waiting to be delivered to its owner. */
struct notice {
    struct list link;
    enum notice_kind kind;
    struct lockmgr_owner *o;        /* (ref) */
    unsigned gen;                   /* answers: the asker's o->gen */
    void *ask;                      /* answers: the asker's */
    bool refused;                   /* no holds why */
    struct lockmgr_refusal no;      /* its strings inside text */
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;
    int nodes;
    size_t nres;
    enum lockmgr_mode mode;
    uint32_t limit, slot;
    enum lockmgr_lost_reason why;
    char token[REDLOCK_TOKEN_LEN + 1];
    char text[];                    /* resource NUL [no's resource NUL
                                       no's detail NUL] */
};

struct lockmgr_state {
    const struct conf *conf;
    const struct redlock_ops *rl;
    struct hmap table;
    size_t prefixlen;
    char *keybuf;                   /* key_prefix + the longest resource,
                                       and room for a slot's suffix */
    size_t keycap;
    size_t held;
    size_t waiters;
    struct lockmgr_counters c;
    struct list notices;
    int depth;                      /* entry points on the stack */
    bool flushing;
    bool starting;                  /* until lockmgr_ready() */
    struct list held_back;          /* struct lockreq (hlink), in order */
    struct list adopts_held;        /* struct adopt_ctx (hlink), in order */
    uint64_t rng;                   /* xorshift64* state, never 0 */
    uint64_t spread;                /* where this daemon starts in a
                                       semaphore's slots: hash of its id */
    /* A holder of e is gone (its keys deleted, or left to expire): the
     * waiters get their turn. lm_entry_kick (lockmgr_wait.c), installed
     * by lockmgr_init, so the leases never name the layer above them. */
    void (*kick)(struct lock_entry *e);
};
extern struct lockmgr_state lm;

/* How long a waiter woken by a release announcement waits before asking:
 * up to this many ms, at random, so waiters on several daemons that hear
 * the same announcement do not all ask in the same millisecond. */
#define LOCKMGR_WAKE_JITTER_MS 4
/* Renewals fall due on multiples of this many ms (lease_renew_due). */
#define LOCKMGR_RENEW_GRAIN_MS 100

/* The shared holders' set of resource r is key_prefix + r + this; slot i
 * of a semaphore r is key_prefix + r + "#" + i. */
#define LOCKMGR_SHARED_SUFFIX CONF_SHARED_SUFFIX
#define LOCKMGR_SHARED_SUFFIX_LEN (sizeof(LOCKMGR_SHARED_SUFFIX) - 1)
#define LOCKMGR_SLOT_SEP CONF_SLOT_SEP
/* "#" and a slot number below CONF_MAX_LIMIT, NUL included. */
#define LOCKMGR_SLOT_SUFFIX_SIZE sizeof("#65535")

/* What a new lease is, beside its entry and key. */
struct lease_init {
    enum lockmgr_mode mode;
    uint32_t limit;
    int64_t slot;
    const char *token;
    uint64_t fence;
    uint32_t ttl;
    bool renew;
    int64_t validity;
    const char *value;              /* copied; NULL for none */
};

#define AUDIT_FMT "%s fence=%" PRIu64 " %s%s %s (name=%s peer=%s)"
#define AUDIT_ARGS(what, l, o) what, (l)->fence, (l)->resource, \
    lm_lease_kind(l), (o)->id, (o)->name[0] ? (o)->name : "-", \
    (o)->peer ? (o)->peer : "-"

/* The request of a queue position (an entry's waiters are struct
 * req_pos). */
static inline struct req_pos *lm_pos_of(const struct list *link)
{
    return list_entry(link, struct req_pos, link);
}

/* lockmgr.c */
void lm_owner_ref(struct lockmgr_owner *o);
void lm_owner_unref(struct lockmgr_owner *o);
struct notice *lm_notice_new(enum notice_kind kind,
                             struct lockmgr_owner *o, unsigned gen,
                             void *ask, const char *resource);
struct notice *lm_notice_refused(enum notice_kind kind,
                                 struct lockmgr_owner *o, unsigned gen,
                                 void *ask, const char *resource,
                                 const struct lockmgr_refusal *no);
void lm_enter(void);
void lm_leave(void);
/* Who holds e's resource changed here, as the nodes show now: told to
 * the change observer (the watchers). */
void lm_changed(const struct lock_entry *e);
/* For the observer: a lease stopped being held; q was answered, granted
 * or TIMEOUT. */
void lm_observe_held(const struct lease *l);
void lm_observe_waited(const struct lockreq *q, bool granted);
int64_t lm_lease_validity(const struct lease *l);
const char *lm_lease_kind(const struct lease *l);
void lm_audit(const struct lease *l, const struct lockmgr_owner *o,
              const char *what, const char *why);
const char *lm_entry_key(const char *res, size_t len, size_t *keylen);
const char *lm_entry_slot_key(const struct lock_entry *e, uint32_t slot,
                              size_t *keylen);
struct lock_entry *lm_entry_lookup(const char *key, size_t keylen);
struct lock_entry *lm_entry_find(const char *res, size_t len);
struct lock_entry *lm_entry_get(const char *res, size_t len,
                                uint32_t limit);
struct lockreq *lm_entry_head(const struct lock_entry *e);
void lm_entry_free(struct lock_entry *e);
void lm_entry_maybe_free(struct lock_entry *e);
void lm_entry_push(struct req_pos *p);
void lm_entry_remove(struct req_pos *p);
void lm_slot_take(struct lock_entry *e, int64_t slot);
size_t lm_label_put(const struct lockmgr_owner *o, uint32_t limit,
                    const char *value, char *out);
void lm_probe_make(const char *res, size_t len, uint32_t limit,
                   struct redlock_probe *pr, char **buf);

/* lockmgr_lease.c */
const char *lm_req_key(const struct lockreq *q, size_t i, size_t *keylen);
struct lease *lm_lease_new(struct lock_entry *e, const char *key,
                           size_t keylen, const struct lease_init *in);
struct lease *lm_lease_create(struct lockreq *q, size_t i, uint64_t fence,
                              int64_t validity);
void lm_lease_attach(struct lease *l, struct lockmgr_owner *o);
void lm_lease_release(struct lease *l, uint32_t delay_ms,
                      struct unlock_ctx *u, const char *why);
void lm_lease_leave_keys(struct lease *l);
void lm_lease_lose(struct lease *l, enum lockmgr_lost_reason why);

/* lockmgr_wait.c */
void lm_entry_kick(struct lock_entry *e);
void lm_req_drop(struct lockreq *q);
/* q is no longer its owner's (cancelled, ended): off o->waits, and the
 * owner reference it held let go; what it gets is given back. */
void lm_req_disown(struct lockreq *q);
/* Answer q with a refusal of that reason and no facts, and drop it. */
void lm_req_refuse(struct lockreq *q, enum lockmgr_no why);
void lm_req_send_held(void);

/* lockmgr_adopt.c */
void lm_adopt_unhold(struct lockmgr_owner *o, bool shutdown);
void lm_adopt_send_held(void);

#endif
