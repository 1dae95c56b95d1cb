/*
 * lockmgr: see lockmgr.h; the structures and the split into files in
 * lockmgr_priv.h. This file is the bottom of it: the state every part
 * shares (`lm`), owners and the answers they get (notices), the
 * observers, the audit trail, the entries of the lock table, holder
 * labels and the probes STATUS, FORCEUNLOCK and ADOPT send. It calls no
 * other file of lockmgr: the layers above it (lease, wait, adopt,
 * inspect, life) call down into it, never the other way.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "label.h"
#include "log.h"
#include "mem.h"

struct lockmgr_state lm;

/* ---- owners and notices ------------------------------------------------ */

void lm_owner_ref(struct lockmgr_owner *o)
{
    o->ops->ref(o);
}

/* Must not call back into lockmgr (a session only frees memory here). */
void lm_owner_unref(struct lockmgr_owner *o)
{
    o->ops->unref(o);
}

/* A notice for o (with a reference on it), its strings copied: the
 * resource, and a refusal's. */
static struct notice *notice_make(enum notice_kind kind,
                                  struct lockmgr_owner *o, unsigned gen,
                                  void *ask, const char *resource,
                                  const struct lockmgr_refusal *no)
{
    size_t rlen = resource ? strlen(resource) : 0;
    size_t nlen = no && no->resource ? strlen(no->resource) + 1 : 0;
    size_t dlen = no && no->detail ? strlen(no->detail) + 1 : 0;
    struct notice *n = mem_alloc(sizeof(*n) + rlen + 1 + nlen + dlen);
    char *at = n->text + rlen + 1;

    n->kind = kind;
    n->o = o;
    n->gen = gen;
    n->ask = ask;
    n->nres = 1;
    lm_owner_ref(o);
    if (rlen)
        memcpy(n->text, resource, rlen);
    if (no) {
        n->refused = true;
        n->no = *no;
        if (nlen) {
            memcpy(at, no->resource, nlen);
            n->no.resource = at;
            at += nlen;
        }
        if (dlen) {
            memcpy(at, no->detail, dlen);
            n->no.detail = at;
        }
    }
    list_push_tail(&lm.notices, &n->link);
    return n;
}

struct notice *lm_notice_new(enum notice_kind kind,
                             struct lockmgr_owner *o, unsigned gen,
                             void *ask, const char *resource)
{
    return notice_make(kind, o, gen, ask, resource, NULL);
}

struct notice *lm_notice_refused(enum notice_kind kind,
                                 struct lockmgr_owner *o, unsigned gen,
                                 void *ask, const char *resource,
                                 const struct lockmgr_refusal *no)
{
    return notice_make(kind, o, gen, ask, resource, no);
}

static void notice_deliver(struct notice *n)
{
    struct lockmgr_owner *o = n->o;
    const struct lockmgr_owner_ops *ops = o->ops;
    const struct lockmgr_refusal *no = n->refused ? &n->no : NULL;

    /* An answer for a requester that went away (lockmgr_owner_cancel)
     * is dropped; a loss is the owner's whoever asks for it. */
    if (o->ended || (n->kind != N_LOST && n->gen != o->gen))
        return;
    switch (n->kind) {
    case N_LOCKED:
        if (!no) {
            struct lockmgr_grant g = {
                .resource = n->text, .nresources = n->nres,
                .token = n->token, .fence = n->fence, .ttl = n->ttl,
                .validity = n->validity, .mode = n->mode,
                .limit = n->limit, .slot = n->slot,
            };
            ops->locked(o, n->ask, &g, NULL);
        } else {
            ops->locked(o, n->ask, NULL, no);
        }
        break;
    case N_UNLOCKED:
        ops->unlocked(o, n->ask, n->text, n->nres, n->nodes, no);
        break;
    case N_EXTENDED:
        ops->extended(o, n->ask, n->text, n->ttl, n->validity, no);
        break;
    case N_LOST:
        ops->lost(o, n->text, n->fence, n->why);
        break;
    }
}

static void notices_flush(void)
{
    struct list *link;

    if (lm.flushing)
        return;     /* an owner called back in: the loop below goes on */
    lm.flushing = true;
    while ((link = list_first(&lm.notices))) {
        struct notice *n = list_entry(link, struct notice, link);
        list_remove(link);
        notice_deliver(n);
        lm_owner_unref(n->o);
        free(n);
    }
    lm.flushing = false;
}

void lm_enter(void)
{
    lm.depth++;
}

void lm_leave(void)
{
    if (--lm.depth == 0)
        notices_flush();
}

/* ---- observers ---------------------------------------------------------- */

static lockmgr_change_fn *change_observer; /* outside lm: init keeps it */

void lockmgr_set_change_observer(lockmgr_change_fn *fn)
{
    change_observer = fn;
}

void lm_changed(const struct lock_entry *e)
{
    if (change_observer)
        change_observer(e->resource, e->keylen - lm.prefixlen, e->limit);
}

/* Outside lm: lockmgr_init keeps it. */
static const struct lockmgr_observer *observer;

void lockmgr_set_observer(const struct lockmgr_observer *ob)
{
    observer = ob;
}

void lm_observe_held(const struct lease *l)
{
    if (observer)
        observer->held(l->resource, strlen(l->resource),
                       timer_now() - l->acquired_at);
}

void lm_observe_waited(const struct lockreq *q, bool granted)
{
    uint64_t waited = timer_now() - q->asked_at;

    for (size_t i = 0; observer && i < q->n; i++) {
        const struct lock_entry *e = q->pos[i].e;
        observer->waited(e->resource, e->keylen - lm.prefixlen, granted,
                         waited);
    }
}

const char *lockmgr_lost_reason_name(enum lockmgr_lost_reason r)
{
    switch (r) {
    case LOST_EXPIRED: return "expired";
    case LOST_QUORUM:  return "quorum";
    case LOST_NODE:    return "node";
    }
    return "unknown";
}

size_t lockmgr_held_count(void)
{
    return lm.held;
}

size_t lockmgr_waiter_count(void)
{
    return lm.waiters;
}

const struct lockmgr_counters *lockmgr_counters(void)
{
    return &lm.c;
}

int64_t lm_lease_validity(const struct lease *l)
{
    uint64_t now = timer_now();
    return l->valid_until > now ? (int64_t)(l->valid_until - now) : 0;
}

const char *lockmgr_mode_name(enum lockmgr_mode m)
{
    return m == LOCKMGR_SHARED ? "shared" : "exclusive";
}

/* ---- the audit trail ------------------------------------------------------
 * One info line per grant, release and loss (a warning for a loss the
 * holder did not choose), naming the session, its client name and peer. */

/* " (shared)", " (slot 3 of 5)" or "" for the audit line. */
const char *lm_lease_kind(const struct lease *l)
{
    static char buf[64];

    if (l->mode == LOCKMGR_SHARED)
        return " (shared)";
    if (!l->limit)
        return "";
    snprintf(buf, sizeof(buf), " (slot %" PRId64 " of %" PRIu32 ")", l->slot,
             l->limit);
    return buf;
}

void lm_audit(const struct lease *l, const struct lockmgr_owner *o,
              const char *what, const char *why)
{
    if (o)
        log_info(AUDIT_FMT ": %s", AUDIT_ARGS(what, l, o), why);
    else
        log_info("%s fence=%" PRIu64 " %s%s: %s", what, l->fence,
                 l->resource, lm_lease_kind(l), why);
}

/* ---- entries ------------------------------------------------------------ */

/* key_prefix + res in lm.keybuf (valid until the next call). The buffer is
 * sized for max_resource_len and a slot's suffix, and grows if a longer
 * name ever comes. */
const char *lm_entry_key(const char *res, size_t len, size_t *keylen)
{
    if (lm.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE > lm.keycap) {
        lm.keycap = lm.prefixlen + len + LOCKMGR_SLOT_SUFFIX_SIZE;
        lm.keybuf = mem_realloc(lm.keybuf, lm.keycap);
    }
    memcpy(lm.keybuf + lm.prefixlen, res, len);
    lm.keybuf[lm.prefixlen + len] = '\0';
    *keylen = lm.prefixlen + len;
    return lm.keybuf;
}

/* The key of slot `slot` of e in lm.keybuf (valid until the next call). */
const char *lm_entry_slot_key(const struct lock_entry *e, uint32_t slot,
                              size_t *keylen)
{
    size_t len = e->keylen - lm.prefixlen;
    lm_entry_key(e->resource, len, keylen);
    *keylen += (size_t)snprintf(lm.keybuf + *keylen, LOCKMGR_SLOT_SUFFIX_SIZE,
                                "%c%" PRIu32, LOCKMGR_SLOT_SEP, slot);
    return lm.keybuf;
}

struct lock_entry *lm_entry_lookup(const char *key, size_t keylen)
{
    struct hmap_node *n = hmap_get(&lm.table, key, keylen);
    return n ? container_of(n, struct lock_entry, node) : NULL;
}

struct lock_entry *lm_entry_find(const char *res, size_t len)
{
    size_t keylen;
    const char *key = lm_entry_key(res, len, &keylen);
    return lm_entry_lookup(key, keylen);
}

/* The entry of res, made for a request of that limit if there is none. */
struct lock_entry *lm_entry_get(const char *res, size_t len,
                                uint32_t limit)
{
    struct lock_entry *e = lm_entry_find(res, len);
    if (e)
        return e;
    size_t keylen = lm.prefixlen + len;
    e = mem_alloc(sizeof(*e) + keylen + 1 + keylen +
                  LOCKMGR_SHARED_SUFFIX_LEN + 1);
    memcpy(e->key, lm.conf->locks.key_prefix, lm.prefixlen);
    memcpy(e->key + lm.prefixlen, res, len);
    e->keylen = keylen;
    e->key[keylen] = '\0';
    e->resource = e->key + lm.prefixlen;
    char *sh = e->key + keylen + 1;
    memcpy(sh, e->key, keylen);
    memcpy(sh + keylen, LOCKMGR_SHARED_SUFFIX, LOCKMGR_SHARED_SUFFIX_LEN + 1);
    e->shared = sh;
    e->sharedlen = keylen + LOCKMGR_SHARED_SUFFIX_LEN;
    list_init(&e->holders);
    list_init(&e->waiters);
    e->limit = limit;
    if (limit)
        e->slots = mem_alloc(limit);
    hmap_put(&lm.table, &e->node, e->key, e->keylen);
    return e;
}

struct lockreq *lm_entry_head(const struct lock_entry *e)
{
    struct req_pos *p = lm_pos_of(list_first(&e->waiters));
    return p ? p->q : NULL;
}

void lm_entry_free(struct lock_entry *e)
{
    free(e->slots);
    free(e);
}

void lm_entry_maybe_free(struct lock_entry *e)
{
    if (e->nheld || !list_empty(&e->waiters) || e->pins)
        return;
    hmap_del(&lm.table, &e->node);
    lm_entry_free(e);
}

void lm_entry_push(struct req_pos *p)
{
    list_push_tail(&p->e->waiters, &p->link);
    p->e->nwait++;
    lm.waiters++;
}

void lm_entry_remove(struct req_pos *p)
{
    list_remove(&p->link);
    p->e->nwait--;
    lm.waiters--;
}

void lm_slot_take(struct lock_entry *e, int64_t slot)
{
    e->slots[slot]++;
    e->nused++;
}

/* ---- holder labels and probes ------------------------------------------- */

/* The holder label an acquisition of o stores after its token (label.h):
 * this daemon, o's session and client name, the holder's value (or NULL)
 * and a semaphore slot's limit. Writes it to out unless out is NULL;
 * returns its length. */
size_t lm_label_put(const struct lockmgr_owner *o, uint32_t limit,
                    const char *value, char *out)
{
    const struct label l = {
        .daemon = lm.conf->id, .session = o->id, .name = o->name,
        .value = value, .limit = limit,
    };

    return label_write(&l, out);
}

/* What STATUS and FORCEUNLOCK look at: the resource's keys, and `limit`
 * slots (or as many as this daemon knows it has). The names stay in
 * *buf (owned by the caller) until the call is made. */
void lm_probe_make(const char *res, size_t len, uint32_t limit,
                   struct redlock_probe *pr, char **buf)
{
    struct lock_entry *e = lm_entry_find(res, len);
    size_t keylen = lm.prefixlen + len;
    char *b = mem_alloc(3 * (keylen + LOCKMGR_SHARED_SUFFIX_LEN + 2));

    memcpy(b, lm.conf->locks.key_prefix, lm.prefixlen);
    memcpy(b + lm.prefixlen, res, len);
    b[keylen] = '\0';
    char *sh = b + keylen + 1;
    memcpy(sh, b, keylen);
    memcpy(sh + keylen, LOCKMGR_SHARED_SUFFIX, LOCKMGR_SHARED_SUFFIX_LEN + 1);
    char *sl = sh + keylen + LOCKMGR_SHARED_SUFFIX_LEN + 1;
    memcpy(sl, b, keylen);
    sl[keylen] = LOCKMGR_SLOT_SEP;
    sl[keylen + 1] = '\0';
    pr->key = b;
    pr->keylen = keylen;
    pr->shared = sh;
    pr->sharedlen = keylen + LOCKMGR_SHARED_SUFFIX_LEN;
    pr->slots = sl;
    pr->slotslen = keylen + 1;
    pr->limit = limit ? limit : e ? e->limit : 0;
    *buf = b;
}
