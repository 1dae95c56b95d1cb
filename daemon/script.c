/*
 * script: see script.h.
 *
 * Every builder lays its script's words out in the order the Lua file's
 * header gives (KEYS, then ARGV, then the guard for the voting ones), so
 * that a script's layout is written down twice only: in its Lua header
 * and here. The GROUP packer below is the one other reader of these
 * layouts (lua/group.lua is its Lua side).
 */
#include "script.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const script_names[SCRIPT_COUNT] = {
    [SCRIPT_ACQUIRE] = "ACQUIRE", [SCRIPT_RELEASE] = "RELEASE",
    [SCRIPT_EXTEND] = "EXTEND", [SCRIPT_RAISE] = "RAISE",
    [SCRIPT_RAISE_HELD] = "RAISE_HELD", [SCRIPT_UNDO] = "UNDO",
    [SCRIPT_ACQUIRE_SHARED] = "ACQUIRE_SHARED",
    [SCRIPT_ACQUIRE_MULTI] = "ACQUIRE_MULTI",
    [SCRIPT_RAISE_SHARED] = "RAISE_SHARED", [SCRIPT_INSPECT] = "INSPECT",
    [SCRIPT_FORCE] = "FORCE", [SCRIPT_EXTEND_MANY] = "EXTEND_MANY",
    [SCRIPT_ADOPT] = "ADOPT", [SCRIPT_ADOPT_ONE] = "ADOPT_ONE",
    [SCRIPT_RELEASE_MANY] = "RELEASE_MANY", [SCRIPT_SET_FENCE] = "SET_FENCE",
    [SCRIPT_GROUP] = "GROUP", [SCRIPT_RELABEL] = "RELABEL",
};

const char *script_name(int script)
{
    return script >= 0 && script < SCRIPT_COUNT ? script_names[script]
                                                : "command";
}

/* ---- building one call -------------------------------------------------- */

static void call_begin(struct script_call *c, enum script s)
{
    c->w.script = (int)s;
    c->w.nkeys = 0;
    c->w.argc = 0;
    c->w.group = 0;
    c->w.argv = c->argv;
    c->w.lens = c->lens;
}

static void put(struct script_call *c, const char *s, size_t len)
{
    c->argv[c->w.argc] = s;
    c->lens[c->w.argc++] = len;
}

static void put_str(struct script_call *c, const char *s)
{
    put(c, s, strlen(s));
}

/* A number, formatted into c's i-th number buffer. */
static void put_num(struct script_call *c, int i, uint64_t v)
{
    int len = snprintf(c->num[i], sizeof(c->num[i]), "%" PRIu64, v);

    put(c, c->num[i], (size_t)len);
}

/* The keys are in: what follows are arguments. */
static void keys_end(struct script_call *c)
{
    c->w.nkeys = c->w.argc;
}

/* Room for the guard, set per node (script_set_guard); empty until then,
 * which is "no check". */
static void guard_room(struct script_call *c)
{
    for (int i = 0; i < SCRIPT_GUARD_WORDS; i++)
        put(c, "", 0);
}

bool script_guarded(const struct script_words *w)
{
    switch (w->script) {
    case SCRIPT_ACQUIRE:
    case SCRIPT_ACQUIRE_SHARED:
    case SCRIPT_ACQUIRE_MULTI:
    case SCRIPT_RAISE_HELD:
    case SCRIPT_RAISE_SHARED:
    case SCRIPT_EXTEND:
    case SCRIPT_EXTEND_MANY:
    case SCRIPT_ADOPT:
    case SCRIPT_ADOPT_ONE:
    case SCRIPT_GROUP:
    case SCRIPT_RELABEL:
        return true;
    default:
        return false;
    }
}

void script_set_guard(struct script_call *c,
                      const char *const words[SCRIPT_GUARD_WORDS],
                      const size_t lens[SCRIPT_GUARD_WORDS])
{
    int at = c->w.argc - SCRIPT_GUARD_WORDS;

    for (int i = 0; i < SCRIPT_GUARD_WORDS; i++) {
        c->argv[at + i] = words[i];
        c->lens[at + i] = lens[i];
    }
}

/* An acquisition's five arguments: token, ttl, seen, label, wait. */
static void acquire_args(struct script_call *c, const struct script_acquire *a)
{
    keys_end(c);
    put_str(c, a->token);
    put_num(c, 0, a->ttl);
    put_num(c, 1, a->seen);
    put_str(c, a->label);
    put(c, a->wait ? "1" : "0", 1);
    guard_room(c);
}

void script_acquire(struct script_call *c, const struct script_acquire *a)
{
    if (a->n > 1) {
        call_begin(c, SCRIPT_ACQUIRE_MULTI);
        c->w.group = 'm';
        put_str(c, a->fence);
        for (int i = 0; i < a->n; i++) {
            put(c, a->keys[i], a->lens[i]);
            put(c, a->shared[i], a->sharedlens[i]);
        }
    } else {
        call_begin(c, a->mode_shared ? SCRIPT_ACQUIRE_SHARED
                                     : SCRIPT_ACQUIRE);
        c->w.group = a->mode_shared ? 's' : a->shared ? 'a' : 'b';
        put(c, a->keys[0], a->lens[0]);
        put_str(c, a->fence);
        if (a->shared)
            put(c, a->shared[0], a->sharedlens[0]);
    }
    acquire_args(c, a);
}

void script_raise_held(struct script_call *c, int n, const char *const *keys,
                       const size_t *lens, const char *fence,
                       const char *token, uint64_t value)
{
    call_begin(c, SCRIPT_RAISE_HELD);
    put(c, keys[0], lens[0]);
    put_str(c, fence);
    for (int i = 1; i < n; i++)
        put(c, keys[i], lens[i]);
    keys_end(c);
    put_str(c, token);
    put_num(c, 0, value);
    guard_room(c);
}

void script_raise_shared(struct script_call *c, const char *shared,
                         size_t len, const char *fence, const char *token,
                         uint64_t value)
{
    call_begin(c, SCRIPT_RAISE_SHARED);
    put(c, shared, len);
    put_str(c, fence);
    keys_end(c);
    put_str(c, token);
    put_num(c, 0, value);
    guard_room(c);
}

void script_raise(struct script_call *c, const char *fence, uint64_t value)
{
    call_begin(c, SCRIPT_RAISE);
    put_str(c, fence);
    keys_end(c);
    put_num(c, 0, value);
}

void script_release(struct script_call *c, const char *key, size_t len,
                    const char *token, const char *channel,
                    const char *instance)
{
    call_begin(c, SCRIPT_RELEASE);
    c->w.group = 'r';
    put(c, key, len);
    keys_end(c);
    put_str(c, token);
    put_str(c, channel);
    put_str(c, instance);
}

void script_undo(struct script_call *c, const char *key, size_t len,
                 const char *token)
{
    call_begin(c, SCRIPT_UNDO);
    put(c, key, len);
    keys_end(c);
    put_str(c, token);
}

void script_extend(struct script_call *c, const char *key, size_t len,
                   const char *token, uint32_t ttl)
{
    call_begin(c, SCRIPT_EXTEND);
    c->w.group = 'e';
    put(c, key, len);
    keys_end(c);
    put_str(c, token);
    put_num(c, 0, ttl);
    guard_room(c);
}

void script_relabel(struct script_call *c, const char *key, size_t len,
                    const char *token, const char *label, size_t labellen,
                    uint32_t ttl)
{
    call_begin(c, SCRIPT_RELABEL);
    put(c, key, len);
    keys_end(c);
    put_str(c, token);
    put(c, label, labellen);
    put_num(c, 0, ttl);
    guard_room(c);
}

void script_extend_many(struct script_call *c, int n,
                        const char *const *keys, const size_t *lens,
                        const char *const *tokens, const uint32_t *ttls)
{
    call_begin(c, SCRIPT_EXTEND_MANY);
    for (int i = 0; i < n; i++)
        put(c, keys[i], lens[i]);
    keys_end(c);
    for (int i = 0; i < n; i++) {
        put_str(c, tokens[i]);
        put_num(c, i, ttls[i]);
    }
    guard_room(c);
}

void script_release_many(struct script_call *c, int n,
                         const char *const *keys, const size_t *lens,
                         const char *const *tokens, const char *channel,
                         const char *instance)
{
    call_begin(c, SCRIPT_RELEASE_MANY);
    for (int i = 0; i < n; i++)
        put(c, keys[i], lens[i]);
    keys_end(c);
    put_str(c, channel);
    put_str(c, instance);
    for (int i = 0; i < n; i++)
        put_str(c, tokens[i]);
}

void script_adopt(struct script_call *c, int n, const char *const *keys,
                  const size_t *lens, const char *old, const char *token,
                  uint32_t ttl, const char *label)
{
    call_begin(c, SCRIPT_ADOPT);
    for (int i = 0; i < n; i++)
        put(c, keys[i], lens[i]);
    keys_end(c);
    put_str(c, old);
    put_str(c, token);
    put_num(c, 0, ttl);
    put_str(c, label);
    guard_room(c);
}

void script_adopt_one(struct script_call *c, const struct script_resource *r,
                      const char *old, const char *token, uint32_t ttl,
                      const char *label)
{
    call_begin(c, SCRIPT_ADOPT_ONE);
    put(c, r->key, r->keylen);
    put(c, r->shared, r->sharedlen);
    keys_end(c);
    put_str(c, old);
    put_str(c, token);
    put_num(c, 0, ttl);
    put_str(c, label);
    put(c, r->slots, r->slotslen);
    put_num(c, 1, r->limit);
    guard_room(c);
}

void script_set_fence(struct script_call *c, int n, const char *const *keys,
                      const size_t *lens, const char *token, uint64_t fence)
{
    call_begin(c, SCRIPT_SET_FENCE);
    for (int i = 0; i < n; i++)
        put(c, keys[i], lens[i]);
    keys_end(c);
    put_str(c, token);
    put_num(c, 0, fence);
}

/* INSPECT and FORCE: KEYS lock, shared; ARGV the slot prefix, K. */
static void probe_words(struct script_call *c, enum script s,
                        const struct script_resource *r)
{
    call_begin(c, s);
    put(c, r->key, r->keylen);
    put(c, r->shared, r->sharedlen);
    keys_end(c);
    put(c, r->slots, r->slotslen);
    put_num(c, 0, r->limit);
}

void script_inspect(struct script_call *c, const struct script_resource *r)
{
    probe_words(c, SCRIPT_INSPECT, r);
}

void script_force(struct script_call *c, const struct script_resource *r,
                  const char *channel)
{
    probe_words(c, SCRIPT_FORCE, r);
    put_str(c, channel);
}

void script_command(struct script_call *c, int argc, const char *const *argv,
                    const size_t *lens)
{
    c->w.script = SCRIPT_COMMAND;
    c->w.nkeys = 0;
    c->w.argc = 0;
    c->w.group = 0;
    c->w.argv = c->argv;
    c->w.lens = c->lens;
    for (int i = 0; i < argc && i < SCRIPT_MAX_WORDS; i++)
        put(c, argv[i], lens[i]);
}

/* ---- group commit ------------------------------------------------------- */

/* Where a call of that kind has the fence key, -1 for none. */
static int group_fence_word(char kind)
{
    return kind == 'm' ? 0 : kind == 'r' || kind == 'e' ? -1 : 1;
}

/* The arguments, after its keys and before the guard, that a call of that
 * kind carries into a GROUP call; a release's last two (the channel and
 * the instance id) are the call's, taken once. */
static int group_args(char kind)
{
    return kind == 'r' ? 1 : kind == 'e' ? 2 : 5;
}

/* The words a call adds to a GROUP call: its keys but the fence key, its
 * arguments ('m' also its number of resources). */
static int group_words(const struct script_words *w)
{
    return w->nkeys - (group_fence_word(w->group) >= 0) +
           (w->group == 'm') + group_args(w->group);
}

static bool word_eq(const struct script_words *a, int i,
                    const struct script_words *b, int j)
{
    return a->lens[i] == b->lens[j] &&
           memcmp(a->argv[i], b->argv[j], a->lens[i]) == 0;
}

bool script_group_fits(const struct script_group *g,
                       const struct script_words *w, unsigned max)
{
    if (!w->group || g->n >= max || g->n >= CONF_GROUP_MAX ||
        g->words + group_words(w) >
            SCRIPT_MAX_WORDS_GROUP - 4 - SCRIPT_GUARD_WORDS)
        return false;
    if (w->group == 'r')
        return !g->rel ||
               (word_eq(g->rel, 2, w, 2) && word_eq(g->rel, 3, w, 3));
    int fi = group_fence_word(w->group);
    if (g->acq && fi >= 0 &&
        !word_eq(g->acq, group_fence_word(g->acq->group), w, fi))
        return false;
    for (int i = 1; g->guard && i <= SCRIPT_GUARD_WORDS; i++)
        if (!word_eq(g->guard, g->guard->argc - i, w, w->argc - i))
            return false;
    return true;
}

void script_group_add(struct script_group *g, const struct script_words *w)
{
    g->m[g->n++] = w;
    g->words += group_words(w);
    if (group_fence_word(w->group) >= 0 && !g->acq)
        g->acq = w;
    if (w->group != 'r' && !g->guard)
        g->guard = w;
    if (w->group == 'r' && !g->rel)
        g->rel = w;
}

void script_group_call(const struct script_group *g, struct script_call *c)
{
    call_begin(c, SCRIPT_GROUP);
    /* KEYS: the fence key (without an acquisition, never read: one of the
     * group's own keys stands in, which any ACL on the node lets us
     * name), then each member's. */
    const struct script_words *f = g->acq ? g->acq : g->m[0];
    int fi = g->acq ? group_fence_word(g->acq->group) : 0;
    put(c, f->argv[fi], f->lens[fi]);
    for (unsigned i = 0; i < g->n; i++) {
        const struct script_words *w = g->m[i];
        int skip = group_fence_word(w->group);
        for (int k = 0; k < w->nkeys; k++)
            if (k != skip)
                put(c, w->argv[k], w->lens[k]);
        c->kinds[i] = w->group;
    }
    keys_end(c);
    c->kinds[g->n] = '\0';
    put(c, c->kinds, g->n);
    for (int i = 2; i <= 3; i++) {
        if (g->rel)
            put(c, g->rel->argv[i], g->rel->lens[i]);
        else
            put(c, "", 0);
    }
    for (unsigned i = 0; i < g->n; i++) {
        const struct script_words *w = g->m[i];
        int from = w->nkeys;
        if (w->group == 'm')
            put_num(c, (int)i, (uint64_t)(w->nkeys - 1) / 2);
        for (int k = from; k < from + group_args(w->group); k++)
            put(c, w->argv[k], w->lens[k]);
    }
    if (g->guard) {
        for (int i = SCRIPT_GUARD_WORDS; i > 0; i--)
            put(c, g->guard->argv[g->guard->argc - i],
                g->guard->lens[g->guard->argc - i]);
    } else {
        guard_room(c);
    }
}
