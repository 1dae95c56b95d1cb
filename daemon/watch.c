/*
 * watch: see watch.h.
 */
#include "watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "conf.h"
#include "hmap.h"
#include "label.h"
#include "lockmgr.h"
#include "mem.h"
#include "pool.h"
#include "proto.h"
#include "sbuf.h"
#include "timer.h"

/* How often this daemon tells the others what its sessions watch, and how
 * long they believe it. */
#define WATCH_ANNOUNCE_MS 1000
#define WATCH_REMOTE_MS (3 * WATCH_ANNOUNCE_MS + 500)
/* The longest "W" message: announcements go in several when longer. */
#define WATCH_MSG_MAX 8192
/* Reads in a row that may not say "free" (read_undecided). */
#define WATCH_UNDECIDED_MAX 3

/* A resource some session here watches. */
struct watched {
    struct hmap_node node;
    struct list watchers;           /* struct watcher (rlink) */
    size_t nwatchers;
    uint32_t limit;                 /* a semaphore's K once known, else 0 */
    char *line;                     /* the last state read (EVENT HOLDER,
                                       LF ended), NULL before the first */
    size_t linelen;
    uint64_t seq;                   /* line's number: moves when it changes */
    bool reading;                   /* a peek is out (it holds w) */
    bool again;                     /* read again once it is back */
    int undecided;                  /* reads in a row that could not say */
    size_t len;
    char resource[];
};

/* One client's watch of one resource. */
struct watcher {
    struct list rlink;              /* in w->watchers */
    struct list clink;              /* in c->watches */
    struct watched *w;
    struct watch_client *c;
    uint64_t sent;                  /* the seq it last heard; 0: none */
};

/* A resource a session on another daemon watches, until the
 * announcement runs out. */
struct remote {
    struct hmap_node node;
    uint64_t until;
    size_t len;
    char resource[];
};

static struct {
    const struct conf *conf;
    struct hmap watched;            /* struct watched, by resource */
    struct hmap remote;             /* struct remote, by resource */
    struct timer poll;              /* locks.watch_poll_ms */
    struct timer announce;          /* WATCH_ANNOUNCE_MS */
    bool stopped;                   /* the daemon stops: no more reads */
} W;

static void read_start(struct watched *w);

/* ---- the state of a resource -------------------------------------------- */

/* Who holds it, as EVENT HOLDER says: a holder here first (its own
 * facts), else the one a quorum of nodes agrees on (its label), else the
 * shared holders or slots the nodes count. *label keeps the strings of a
 * label alive (the caller decrefs). */
static void holder_of(const struct lockmgr_status *st, uint32_t limit,
                      struct proto_holder *h, json_t **label)
{
    const struct lockmgr_status_plan *p = st->plan;

    memset(h, 0, sizeof(*h));
    h->resource = st->resource;
    *label = NULL;
    if (st->nholders > 0 && st->holders[0].slot < 0 &&
        st->holders[0].mode == LOCKMGR_EXCLUSIVE) {
        const struct lockmgr_holder_view *x = &st->holders[0];
        h->held = 1;
        h->mode = "exclusive";
        h->fence = x->fence;
        h->name = x->name;
        h->daemon = st->daemon;
        h->value = x->value;
    } else if (p->remote_token && !st->nholders) {
        *label = p->remote >= 0 ? label_holder(st->nodes[p->remote].label)
                                : NULL;
        h->held = 1;
        h->foreign = *label == NULL;
        if (*label) {
            const char *name = json_string_value(json_object_get(*label,
                                                                 "name"));
            h->mode = "exclusive";
            h->fence = p->remote_fence;
            h->name = name ? name : "";
            h->daemon = json_string_value(json_object_get(*label, "daemon"));
            h->value = json_string_value(json_object_get(*label, "value"));
        }
    } else if (p->mode && strcmp(p->mode, "shared") == 0) {
        h->held = (uint64_t)p->shared_holders;
        h->mode = "shared";
    } else if (limit && p->slots_held > 0) {
        h->held = p->slots_held;
        h->mode = "semaphore";
        h->limit = limit;
    }
}

/* ---- resources watched here --------------------------------------------- */

static struct watched *watched_find(const char *res, size_t len)
{
    struct hmap_node *n = hmap_get(&W.watched, res, len);

    return n ? container_of(n, struct watched, node) : NULL;
}

/* "W <id> <resource>..." for these, as many messages as they need. */
static void announce(struct watched *const *ws, size_t n)
{
    struct sbuf b = SBUF_INIT;
    size_t start;

    sbuf_printf(&b, "W %s", pool_instance_id());
    start = b.len;
    for (size_t i = 0; i < n; i++) {
        if (b.len + 1 + ws[i]->len > WATCH_MSG_MAX && b.len > start) {
            pool_publish_watch(b.data, b.len);
            b.len = start;
        }
        sbuf_putc(&b, ' ');
        sbuf_append(&b, ws[i]->resource, ws[i]->len);
    }
    if (b.len > start)
        pool_publish_watch(b.data, b.len);
    sbuf_deinit(&b);
}

static struct watched *watched_get(const char *res, size_t len)
{
    struct watched *w = watched_find(res, len);

    if (w)
        return w;
    w = mem_alloc(sizeof(*w) + len + 1);
    memcpy(w->resource, res, len);
    w->len = len;
    list_init(&w->watchers);
    hmap_put(&W.watched, &w->node, w->resource, len);
    if (W.stopped)
        return w;
    announce(&w, 1);
    if (!W.poll.slot && W.conf->locks.watch_poll_ms)
        timer_start(&W.poll, W.conf->locks.watch_poll_ms);
    if (!W.announce.slot)
        timer_start(&W.announce, WATCH_ANNOUNCE_MS);
    return w;
}

/* Freed once nobody watches it and no read holds it. */
static void watched_put(struct watched *w)
{
    if (w->nwatchers || w->reading)
        return;
    hmap_del(&W.watched, &w->node);
    free(w->line);
    free(w);
}

/* Each watcher that has not heard the latest line hears it. */
static void watched_tell(struct watched *w)
{
    struct list *p;

    if (!w->line)
        return;
    list_foreach(p, &w->watchers) {
        struct watcher *x = list_entry(p, struct watcher, rlink);

        if (x->sent != w->seq) {
            x->sent = w->seq;
            x->c->say(x->c, w->line, w->linelen);
        }
    }
}

/* A read that cannot say for sure, whose line could take a holder back a
 * step: one that says nobody holds it while it could not count every vote
 * (a node that voted when the read began did not answer, or a quorum of
 * the nodes that answered has keys that the voting ones do not agree on:
 * a node out of the vote for a moment), which sent between two lines of
 * one holder would read as a release and a new grant; or one that names
 * another daemon's holder before a quorum of nodes stores its fence (its
 * raise round under way: the fence shown could be a late node's own, and
 * go down after). The line stays, and a later read (the poll's, or the
 * next at once when there is no poll) decides, up to WATCH_UNDECIDED_MAX
 * such reads in a row, after which what they say is sent. */
static bool read_undecided(const struct lockmgr_status *st,
                           const struct proto_holder *h)
{
    const struct lockmgr_status_plan *p = st->plan;

    if (!st->nholders && p->remote_token && p->remote >= 0 &&
        !p->remote_fence_agreed)
        return true;
    if (h->held)
        return false;
    if (p->held)
        return true;
    for (int i = 0; i < st->nnodes; i++)
        if (st->nodes[i].voting && !st->nodes[i].answered)
            return true;
    return false;
}

static void read_done(void *ud, const struct lockmgr_status *st)
{
    struct watched *w = ud;
    struct sbuf b = SBUF_INIT;
    struct proto_holder h;
    json_t *label;

    w->reading = false;
    /* lockmgr found the semaphore's size (here or on the nodes). */
    if (st->limit)
        w->limit = st->limit;
    if (w->nwatchers) {
        holder_of(st, st->limit, &h, &label);
        proto_format_event_holder(&b, &h);
        json_decref(label);
        if (w->line && read_undecided(st, &h) &&
            ++w->undecided < WATCH_UNDECIDED_MAX) {
            if (!W.conf->locks.watch_poll_ms)
                w->again = true;
        } else {
            w->undecided = 0;
            if (!w->line || b.len != w->linelen ||
                memcmp(b.data, w->line, b.len) != 0) {
                free(w->line);
                w->line = mem_alloc(b.len);
                memcpy(w->line, b.data, b.len);
                w->linelen = b.len;
                w->seq++;
            }
        }
        sbuf_deinit(&b);
        watched_tell(w);
    }
    if (w->again && w->nwatchers) {
        w->again = false;
        read_start(w);
        return;
    }
    watched_put(w);
}

static void read_start(struct watched *w)
{
    if (W.stopped)
        return;
    if (w->reading) {
        w->again = true;
        return;
    }
    w->reading = true;
    lockmgr_peek(w->resource, w->len, w->limit, read_done, w);
}

/* ---- clients ------------------------------------------------------------ */

void watch_client_init(struct watch_client *c,
                       void (*say)(struct watch_client *c, const char *line,
                                   size_t len))
{
    list_init(&c->watches);
    c->n = 0;
    c->say = say;
}

static struct watcher *client_find(const struct watch_client *c,
                                   const char *res, size_t len)
{
    struct watched *w = watched_find(res, len);
    const struct list *p;

    if (!w)
        return NULL;
    list_foreach(p, &w->watchers) {
        struct watcher *x = list_entry(p, struct watcher, rlink);

        if (x->c == c)
            return x;
    }
    return NULL;
}

size_t watch_client_new(const struct watch_client *c,
                        const char *const *res, const size_t *len, size_t n)
{
    size_t k = 0;

    for (size_t i = 0; i < n; i++)
        k += client_find(c, res[i], len[i]) == NULL;
    return k;
}

void watch_add(struct watch_client *c, const char *const *res,
               const size_t *len, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct watcher *x = client_find(c, res[i], len[i]);

        if (!x) {
            x = mem_alloc(sizeof(*x));
            x->c = c;
            x->w = watched_get(res[i], len[i]);
            list_push_tail(&x->w->watchers, &x->rlink);
            x->w->nwatchers++;
            list_push_tail(&c->watches, &x->clink);
            c->n++;
        }
        /* Described now, from a fresh read (a state kept from before may
         * miss another client's change since). */
        x->sent = 0;
        read_start(x->w);
    }
}

static void watcher_free(struct watcher *x)
{
    struct watched *w = x->w;

    list_remove(&x->rlink);
    list_remove(&x->clink);
    w->nwatchers--;
    x->c->n--;
    free(x);
    watched_put(w);
}

void watch_remove(struct watch_client *c, const char *const *res,
                  const size_t *len, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct watcher *x = client_find(c, res[i], len[i]);

        if (x)
            watcher_free(x);
    }
}

void watch_client_clear(struct watch_client *c)
{
    struct list *p;

    while ((p = list_first(&c->watches)))
        watcher_free(list_entry(p, struct watcher, clink));
}

void watch_client_resend(struct watch_client *c)
{
    struct list *p;

    list_foreach(p, &c->watches) {
        struct watcher *x = list_entry(p, struct watcher, clink);

        x->sent = 0;
        read_start(x->w);
    }
}

/* ---- other daemons ------------------------------------------------------ */

static struct remote *remote_find(const char *res, size_t len)
{
    struct hmap_node *n = hmap_get(&W.remote, res, len);

    return n ? container_of(n, struct remote, node) : NULL;
}

static void remote_del(struct remote *r)
{
    hmap_del(&W.remote, &r->node);
    free(r);
}

/* Some session on another daemon watches res (for WATCH_REMOTE_MS). */
static void remote_note(const char *res, size_t len)
{
    struct remote *r = remote_find(res, len);

    if (!r) {
        r = mem_alloc(sizeof(*r) + len + 1);
        memcpy(r->resource, res, len);
        r->len = len;
        hmap_put(&W.remote, &r->node, r->resource, len);
    }
    r->until = timer_now() + WATCH_REMOTE_MS;
}

/* A change here: read it for our watchers, and tell the other daemons'
 * when they have any ("C <id> <resource> <K>"). */
static void on_change(const char *res, size_t len, uint32_t limit)
{
    struct watched *w = watched_find(res, len);
    struct remote *r = remote_find(res, len);

    if (w) {
        if (limit)
            w->limit = limit;
        read_start(w);
    }
    if (r && r->until < timer_now()) {
        remote_del(r);
        r = NULL;
    }
    if (r && !W.stopped) {
        struct sbuf b = SBUF_INIT;
        sbuf_printf(&b, "C %s %.*s %u", pool_instance_id(), (int)len, res,
                    limit);
        pool_publish_watch(b.data, b.len);
        sbuf_deinit(&b);
    }
}

/* The next word of [*p, end): its start and length, or NULL at the end. */
static const char *next_word(const char **p, const char *end, size_t *len)
{
    const char *s = *p, *e;

    while (s < end && *s == ' ')
        s++;
    if (s == end)
        return NULL;
    e = memchr(s, ' ', (size_t)(end - s));
    if (!e)
        e = end;
    *len = (size_t)(e - s);
    *p = e;
    return s;
}

void watch_on_message(const char *msg, size_t len)
{
    const char *p = msg, *end = msg + len, *op, *id, *res, *k;
    size_t oplen = 0, idlen = 0, rlen = 0, klen = 0;

    if (!W.conf)
        return;
    op = next_word(&p, end, &oplen);
    id = next_word(&p, end, &idlen);
    if (!op || !id || oplen != 1 ||
        (idlen == strlen(pool_instance_id()) &&
         memcmp(id, pool_instance_id(), idlen) == 0))
        return;
    if (*op == 'W') {
        while ((res = next_word(&p, end, &rlen)))
            remote_note(res, rlen);
    } else if (*op == 'C' && (res = next_word(&p, end, &rlen))) {
        struct watched *w = watched_find(res, rlen);
        uint32_t limit = 0;

        k = next_word(&p, end, &klen);
        if (!w)
            return;
        if (k && proto_parse_u32(k, klen, &limit) == 0 && limit)
            w->limit = limit;
        read_start(w);
    }
}

/* ---- timers ------------------------------------------------------------- */

/* Every resource watched here is read again: other clients' changes. */
static void poll_cb(struct timer *t)
{
    struct hmap_iter it;
    struct hmap_node *n;

    (void)t;
    if (!W.watched.count || !W.conf->locks.watch_poll_ms)
        return;
    hmap_iter_init(&it, &W.watched);
    while ((n = hmap_iter_next(&it)))
        read_start(container_of(n, struct watched, node));
    timer_start(&W.poll, W.conf->locks.watch_poll_ms);
}

/* Tell the others again what is watched here; forget what they stopped
 * telling us. */
static void announce_cb(struct timer *t)
{
    uint64_t now = timer_now();
    struct watched **ws;
    struct hmap_iter it;
    struct hmap_node *n;
    size_t k = 0;

    (void)t;
    hmap_iter_init(&it, &W.remote);
    while ((n = hmap_iter_next(&it))) {
        struct remote *r = container_of(n, struct remote, node);
        if (r->until < now)
            remote_del(r);
    }
    if (!W.poll.slot && W.conf->locks.watch_poll_ms && W.watched.count)
        timer_start(&W.poll, W.conf->locks.watch_poll_ms);
    if (!W.watched.count && !W.remote.count)
        return;
    ws = mem_alloc((W.watched.count + 1) * sizeof(*ws));
    hmap_iter_init(&it, &W.watched);
    while ((n = hmap_iter_next(&it)))
        ws[k++] = container_of(n, struct watched, node);
    announce(ws, k);
    free(ws);
    timer_start(&W.announce, WATCH_ANNOUNCE_MS);
}

void watch_init(const struct conf *conf)
{
    W.conf = conf;
    hmap_init(&W.watched);
    hmap_init(&W.remote);
    timer_init(&W.poll, poll_cb, NULL);
    timer_init(&W.announce, announce_cb, NULL);
    lockmgr_set_change_observer(on_change);
}

void watch_stop(void)
{
    W.stopped = true;
    timer_stop(&W.poll);
    timer_stop(&W.announce);
}

void watch_deinit(void)
{
    struct hmap_iter it;
    struct hmap_node *n;

    hmap_iter_init(&it, &W.watched);
    while ((n = hmap_iter_next(&it))) {
        struct watched *w = container_of(n, struct watched, node);
        hmap_del(&W.watched, n);
        free(w->line);
        free(w);
    }
    hmap_iter_init(&it, &W.remote);
    while ((n = hmap_iter_next(&it)))
        remote_del(container_of(n, struct remote, node));
    hmap_deinit(&W.remote);
    hmap_deinit(&W.watched);
    lockmgr_set_change_observer(NULL);
    W.conf = NULL;
    W.stopped = false;
}
