/*
 * lockmgr, its life and its owners' (lockmgr_priv.h): set-up (init,
 * start-up held back until ready), an owner's set-up, and what ends or
 * cancels an owner. The top of lockmgr: these entry points reach into
 * several layers below (waits, leases, ADOPTs held back), and nothing
 * below calls up here.
 */
#include "lockmgr_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"

/* ---- set-up ------------------------------------------------------------ */

void lockmgr_init(const struct conf *conf, const struct redlock_ops *rl)
{
    memset(&lm, 0, sizeof(lm));
    lm.conf = conf;
    lm.rl = rl;
    lm.kick = lm_entry_kick;    /* lease -> wait, without a name */
    hmap_init(&lm.table);
    list_init(&lm.notices);
    list_init(&lm.held_back);
    list_init(&lm.adopts_held);
    if (getrandom(&lm.rng, sizeof(lm.rng), GRND_NONBLOCK) != sizeof(lm.rng))
        lm.rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    lm.rng |= 1;
    /* Daemons with different ids start at different slots, so two of them
     * do not both ask for slot 0 first. */
    if (conf->id)
        lm.spread = hmap_hash(conf->id, strlen(conf->id));
    lm.prefixlen = strlen(conf->locks.key_prefix);
    lm.keycap = lm.prefixlen + conf->locks.max_resource_len +
               LOCKMGR_SLOT_SUFFIX_SIZE;
    lm.keybuf = mem_alloc(lm.keycap);
    memcpy(lm.keybuf, conf->locks.key_prefix, lm.prefixlen);
}

void lockmgr_deinit(void)
{
    /* Owners are ended and ops drained before this; anything left is a
     * lease whose release did not complete before the shutdown timeout. */
    struct hmap_iter it;
    struct hmap_node *n;
    hmap_iter_init(&it, &lm.table);
    while ((n = hmap_iter_next(&it))) {
        struct lock_entry *e = container_of(n, struct lock_entry, node);
        hmap_del(&lm.table, n);
        lm_entry_free(e);
    }
    hmap_deinit(&lm.table);
    free(lm.keybuf);
    lm.keybuf = NULL;
}

void lockmgr_owner_init(struct lockmgr_owner *o,
                        const struct lockmgr_owner_ops *ops,
                        const char *id, const char *name, const char *peer)
{
    memset(o, 0, sizeof(*o));
    o->ops = ops;
    o->id = id;
    o->name = name;
    o->peer = peer;
    list_init(&o->leases);
    list_init(&o->waits);
}


/* Held back at start-up; ends with lockmgr_ready(). */
void lockmgr_starting(void)
{
    lm.starting = true;
}

void lockmgr_ready(void)
{
    if (!lm.starting)
        return;
    lm_enter();
    lm.starting = false;
    lm_req_send_held();
    lm_adopt_send_held();
    lm_leave();
}

/* ---- what ends or cancels an owner -------------------------------------- */

void lockmgr_owner_shutdown(struct lockmgr_owner *o)
{
    struct list *p, *tmp;

    lm_enter();
    list_foreach_safe(p, tmp, &o->waits) {
        struct lockreq *q = list_entry(p, struct lockreq, olink);
        q->shutdown = true;
        if (!q->attempting)
            lm_req_refuse(q, LOCKMGR_NO_SHUTDOWN);
    }
    lm_adopt_unhold(o, true);
    lm_leave();
}

size_t lockmgr_owner_abandon(struct lockmgr_owner *o, uint64_t *until)
{
    struct list *link;
    size_t n = 0;

    lm_enter();
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        /* The keys last as long as the last renewal's ttl: at most the
         * validity plus what was taken off it (drift, the round). */
        uint64_t end = l->valid_until + lm.conf->redis.command_timeout_ms +
                       (uint64_t)((double)l->ttl * lm.conf->locks.drift_factor)
                       + 2;
        if (end > *until)
            *until = end;
        log_info(AUDIT_FMT ": left on the nodes to expire by its ttl",
                 AUDIT_ARGS("abandoned", l, o));
        lm_lease_leave_keys(l);
        n++;
    }
    lm_leave();
    return n;
}

/* o's LOCKs are no longer o's: each dropped now, or, with an attempt in
 * flight, when it completes (a grant then given back). */
static void owner_drop_waits(struct lockmgr_owner *o)
{
    struct list *link;

    while ((link = list_first(&o->waits))) {
        struct lockreq *q = list_entry(link, struct lockreq, olink);
        lm_req_disown(q);
        if (!q->attempting)
            lm_req_drop(q);
    }
}

void lockmgr_owner_cancel(struct lockmgr_owner *o)
{
    lm_enter();
    o->gen++;
    owner_drop_waits(o);
    lm_adopt_unhold(o, false);
    lm_leave();
}

void lockmgr_owner_end(struct lockmgr_owner *o, bool died)
{
    uint32_t delay = died ? lm.conf->locks.lock_delay_ms : 0;
    struct list *link;

    lm_enter();
    o->ended = true;
    lm_adopt_unhold(o, false);
    owner_drop_waits(o);
    while ((link = list_first(&o->leases))) {
        struct lease *l = list_entry(link, struct lease, olink);
        lm_lease_release(l, delay, NULL, delay ? "the connection dropped; "
                      "keys kept for locks.lock_delay_ms" : "the session "
                      "ended");
    }
    lm_leave();
}
