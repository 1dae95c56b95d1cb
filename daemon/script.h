/*
 * script: the wire layout of every Redis script redlockd runs, in one home.
 *
 * The scripts themselves are Lua files under daemon/lua/ (one a script,
 * with its keys, arguments and replies in its header; shared pieces in
 * daemon/lua/lib/), embedded at build time as script_lua[] by
 * daemon/lua/embed.py (the @CONST@ words they splice in are the macros
 * here and in conf.h). This module builds each call's words in the order
 * its script reads them (struct script_call, one builder per script), and
 * packs the calls of one loop turn to one node connection into a GROUP
 * call (script_group_*). It is pure: no I/O, no loop, no allocation. The
 * pool above it only moves these words to a node and back; redlock and
 * node say what to run.
 *
 * The fence scripts are the halves of a grant's fence (docs/design.md,
 * "Fences"): the ACQUIRE scripts set the counter to max(counter, seen) + 1
 * atomically with a successful grant and return it; RAISE_HELD raises the
 * counter to a value only while the keys hold our token, RAISE_SHARED only
 * while our shared member is live; each returns the counter it leaves (as
 * decimal strings). They answer an error, having written nothing that
 * matters, when the counter is not a decimal below 10^18 or a lock's key is
 * not of its type. RAISE is node's repair of a restarted node, which owns
 * no key.
 *
 * The scripts whose answers are votes (ACQUIRE*, EXTEND*, RAISE_HELD,
 * RAISE_SHARED, ADOPT*) end with SCRIPT_GUARD_WORDS more arguments: the
 * longest-ttl record's key, the recovery marker's key, and the run_id under
 * which the node was admitted ("" for no check), set per node with
 * script_set_guard. A node whose marker does not name that run answers an
 * error starting "LOSTDATA" before writing anything (lua/lib/guard.lua).
 *
 * A resource's exclusive key is a plain string holding the token, or
 * "token label fence" when the acquisition gave a label (label.h; the
 * owner checks accept both); its shared holders are the members of a
 * sorted set (the tokens, scored by their expiry on the node's clock) and
 * their fences the fields of a hash beside it (lua/lib/shared_put.lua).
 * RELEASE and EXTEND take either.
 */
#ifndef REDLOCKD_SCRIPT_H
#define REDLOCKD_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"

enum script {
    SCRIPT_ACQUIRE,         /* KEYS lock,fence[,shared] ARGV token,ttl,seen,
                               label,wait -> {1,"counter"} | {0,pttl} */
    SCRIPT_RELEASE,         /* KEYS lock|shared ARGV token,channel,
                               instance id -> 1|0 */
    SCRIPT_EXTEND,          /* KEYS lock|shared ARGV token,ttl -> 1|0 */
    SCRIPT_RAISE,           /* KEYS fence ARGV value -> 1 */
    SCRIPT_RAISE_HELD,      /* KEYS lock,fence[,lock...] ARGV token,value
                               -> {1,"counter"} ours | {0,"counter"} not */
    SCRIPT_UNDO,            /* KEYS lock ARGV token -> 1|0 (no PUBLISH) */
    SCRIPT_ACQUIRE_SHARED,  /* KEYS lock,fence,shared ARGV token,ttl,seen,
                               label (unused),wait -> {1,"counter"} |
                               {0,pttl} */
    SCRIPT_ACQUIRE_MULTI,   /* KEYS fence,lock1,shared1,... ARGV token,ttl,
                               seen,label,wait -> {1,"counter"} | {0,pttl} */
    SCRIPT_RAISE_SHARED,    /* KEYS shared,fence ARGV token,value
                               -> {1,"counter"} | {0,"counter"} */
    SCRIPT_INSPECT,         /* KEYS lock,shared ARGV slot-prefix,K
                               -> {pttl, live shared, "0110...", value} */
    SCRIPT_FORCE,           /* KEYS lock,shared ARGV slot-prefix,K,channel
                               -> keys deleted */
    SCRIPT_EXTEND_MANY,     /* KEYS lock|shared... ARGV token,ttl,... (a
                               pair per key) -> {1|0, ...} */
    SCRIPT_ADOPT,           /* KEYS lock... ARGV old token,new token,ttl,
                               label -> {1,"fence"} all ours, rotated | {0} */
    SCRIPT_ADOPT_ONE,       /* KEYS lock,shared ARGV old token,new token,
                               ttl,label,slot-prefix,K -> {1,"fence",kind
                               [,"slot","limit"]} | {0} */
    SCRIPT_RELEASE_MANY,    /* KEYS lock|shared... ARGV channel,instance
                               id,token... -> {1|0, ...} */
    SCRIPT_SET_FENCE,       /* KEYS lock... ARGV token,fence -> keys
                               rewritten: where a key holds the token, the
                               fence its value carries becomes ARGV[2] (ttl
                               kept): for a node that answered a grant after
                               the quorum had decided it, with a counter
                               above the grant's fence (redlock_op.c,
                               op_align) */
    SCRIPT_GROUP,           /* KEYS fence,keys... ARGV kinds,channel,
                               instance id,words... -> {answer, ...}:
                               ACQUIRE*, RELEASE and EXTEND calls sent
                               together (script_group_*) */
    SCRIPT_RELABEL,         /* KEYS lock ARGV token,label,ttl -> 1|0:
                               EXTEND value= */
    SCRIPT_COUNT
};

/* Not a script: a plain command (PING, INFO, PUBLISH...). */
#define SCRIPT_COMMAND (-1)

/* The guard's words at the end of a voting script's arguments. */
#define SCRIPT_GUARD_WORDS 3
/* The most keys one EXTEND_MANY or RELEASE_MANY takes. */
#define SCRIPT_BATCH_MAX 128
/* The most words of one call: an acquisition of locks.max_multi resources
 * (the fence key, two keys per resource, five arguments, the guard), or a
 * batch (three words a key at most, the guard). */
#define SCRIPT_MAX_WORDS_LOCK (2 * CONF_MAX_MULTI + 6 + SCRIPT_GUARD_WORDS)
#define SCRIPT_MAX_WORDS_BATCH (3 * SCRIPT_BATCH_MAX + SCRIPT_GUARD_WORDS)
#define SCRIPT_MAX_WORDS (SCRIPT_MAX_WORDS_BATCH > SCRIPT_MAX_WORDS_LOCK \
                          ? SCRIPT_MAX_WORDS_BATCH : SCRIPT_MAX_WORDS_LOCK)
/* A GROUP call's words (lua/group.lua): the fence key, the kinds, the
 * channel and the instance id, then room for 7 per request (an ACQUIRE's
 * two keys and five arguments; a LOCK of several resources takes more, and
 * one too large for the room left goes alone), and the guard. */
#define SCRIPT_MAX_WORDS_GROUP (4 + 7 * CONF_GROUP_MAX + SCRIPT_GUARD_WORDS)
/* Room for any 64-bit integer in decimal, sign and NUL included. */
#define SCRIPT_NUM_SIZE sizeof("-9223372036854775808")
/* How long a waiting mark outlives the key it marks (lua/lib/busy.lua): a
 * waiter asks again at that key's PTTL at the latest (lockmgr's
 * req_sleep), so the mark is there while it waits. */
#define SCRIPT_WAIT_MARK_MS "2000"

/* Each script's text, by enum script (generated: script_lua.c). */
extern const char *const script_lua[SCRIPT_COUNT];
/* Its name for logs ("ACQUIRE"), or "command". */
const char *script_name(int script);

/*
 * A call's words as its script reads them. `group` is the letter it takes
 * in a GROUP call (lua/group.lua: 'a' ACQUIRE with the shared set, 'b'
 * without, 's' ACQUIRE_SHARED, 'm' ACQUIRE_MULTI, 'r' RELEASE, 'e'
 * EXTEND), 0 when it always goes alone. The pool keeps its own copy of
 * the words (argv, lens) and hands that to the GROUP packer.
 */
struct script_words {
    int script;                     /* enum script, or SCRIPT_COMMAND */
    int nkeys;
    int argc;                       /* keys and arguments */
    char group;
    const char *const *argv;
    const size_t *lens;
};

/* One call being built, on its sender's stack; the words point into the
 * caller's strings and into num. */
struct script_call {
    struct script_words w;
    const char *argv[SCRIPT_MAX_WORDS];
    size_t lens[SCRIPT_MAX_WORDS];
    char num[SCRIPT_BATCH_MAX][SCRIPT_NUM_SIZE];
    char kinds[CONF_GROUP_MAX + 1];     /* a GROUP call's letters */
};

/* An acquisition's round: n exclusive keys, with their shared holders'
 * sets when shared is not NULL (an exclusive grant checks them; several
 * resources always do); mode_shared takes the one key's set shared. */
struct script_acquire {
    int n;
    const char *const *keys;
    const size_t *lens;
    const char *const *shared;      /* n, or NULL */
    const size_t *sharedlens;
    bool mode_shared;
    const char *fence;              /* the fence counter's key */
    const char *token;
    uint32_t ttl;
    uint64_t seen;                  /* the largest fence seen */
    const char *label;              /* "" for none */
    bool wait;                      /* a busy answer marks the key */
};

void script_acquire(struct script_call *c, const struct script_acquire *a);
/* RAISE_HELD of n keys (one grant's) to value, owner-checked by token. */
void script_raise_held(struct script_call *c, int n, const char *const *keys,
                       const size_t *lens, const char *fence,
                       const char *token, uint64_t value);
void script_raise_shared(struct script_call *c, const char *shared,
                         size_t len, const char *fence, const char *token,
                         uint64_t value);
void script_raise(struct script_call *c, const char *fence, uint64_t value);
void script_release(struct script_call *c, const char *key, size_t len,
                    const char *token, const char *channel,
                    const char *instance);
void script_undo(struct script_call *c, const char *key, size_t len,
                 const char *token);
void script_extend(struct script_call *c, const char *key, size_t len,
                   const char *token, uint32_t ttl);
/* EXTEND value=: the key's label replaced by label, and its ttl set. */
void script_relabel(struct script_call *c, const char *key, size_t len,
                    const char *token, const char *label, size_t labellen,
                    uint32_t ttl);
/* n keys of one grant: EXTEND_MANY with their tokens and ttls, or
 * RELEASE_MANY with their tokens (n <= SCRIPT_BATCH_MAX). */
void script_extend_many(struct script_call *c, int n,
                        const char *const *keys, const size_t *lens,
                        const char *const *tokens, const uint32_t *ttls);
void script_release_many(struct script_call *c, int n,
                         const char *const *keys, const size_t *lens,
                         const char *const *tokens, const char *channel,
                         const char *instance);
void script_adopt(struct script_call *c, int n, const char *const *keys,
                  const size_t *lens, const char *old, const char *token,
                  uint32_t ttl, const char *label);
/* One resource: its key and shared set, and where its slots are. */
struct script_resource {
    const char *key;
    size_t keylen;
    const char *shared;
    size_t sharedlen;
    const char *slots;              /* the slot keys' prefix */
    size_t slotslen;
    uint32_t limit;                 /* the slots to look at */
};
void script_adopt_one(struct script_call *c, const struct script_resource *r,
                      const char *old, const char *token, uint32_t ttl,
                      const char *label);
void script_set_fence(struct script_call *c, int n, const char *const *keys,
                      const size_t *lens, const char *token, uint64_t fence);
void script_inspect(struct script_call *c, const struct script_resource *r);
void script_force(struct script_call *c, const struct script_resource *r,
                  const char *channel);
/* A plain command of argc words (at most SCRIPT_MAX_WORDS). */
void script_command(struct script_call *c, int argc, const char *const *argv,
                    const size_t *lens);

/* Does this call end with the guard's words? */
bool script_guarded(const struct script_words *w);
/* Set them (node_guard's, for the node the call goes to). */
void script_set_guard(struct script_call *c,
                      const char *const words[SCRIPT_GUARD_WORDS],
                      const size_t lens[SCRIPT_GUARD_WORDS]);

/*
 * Group commit: consecutive calls of one loop turn to one connection that
 * can go together (each has a group letter, and they agree on the words
 * they share: the fence key, the guard, the release channel) become one
 * GROUP call of at most `max` of them, which answers an array of what each
 * would have answered, in order. The packer reads the members' words and
 * keeps pointers to them: they must outlive the packed call's build.
 */
struct script_group {
    unsigned n;
    int words;                      /* the GROUP words of them all */
    const struct script_words *m[CONF_GROUP_MAX];
    /* The first member of each sort, whose shared words the call takes:
     * an acquisition's fence key, a guarded one's guard, a release's
     * channel and instance id. */
    const struct script_words *acq, *guard, *rel;
};

/* May w join g (w->group set, g not full)? */
bool script_group_fits(const struct script_group *g,
                       const struct script_words *w, unsigned max);
void script_group_add(struct script_group *g, const struct script_words *w);
/* The GROUP call of g's members (more than one); its words point into
 * theirs and into c. */
void script_group_call(const struct script_group *g, struct script_call *c);

#endif
