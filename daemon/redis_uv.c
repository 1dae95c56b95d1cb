/*
 * redis_uv: see redis_uv.h.
 *
 * The watcher lives in a small heap block that hiredis reaches through
 * ac->ev.data; hiredis calls the cleanup hook when it frees the context,
 * and the block is freed in the poll handle's close callback, as libuv
 * requires.
 *
 * System calls per request are what this file is about:
 * - the poll mask is changed only when it really changes (hiredis asks to
 *   "add read" after every write; libuv turns every uv_poll_start into an
 *   epoll_ctl);
 * - a connected context's output is not written when the socket becomes
 *   writable (that would cost an epoll_ctl to ask and another to stop
 *   asking, per request) but once per loop turn, just before the loop
 *   polls, from one uv_prepare handle: every command queued during the
 *   turn goes out in one write. Only when the kernel buffer is full does
 *   the watcher ask to be told that it is writable again;
 * - a hook (redis_uv_before_flush) runs first in that handle, so that the
 *   pool can hand hiredis the requests it gathered during the turn (its
 *   group commit) in time for the same write.
 */
#include "redis_uv.h"

#include <stdbool.h>
#include <stdlib.h>

#include "list.h"

struct redis_uv {
    uv_poll_t poll;
    redisAsyncContext *ac;      /* NULL once hiredis let go of it */
    int events;                 /* the mask the poll handle has */
    bool want_write;            /* hiredis has output for us to write */
    struct list flush_link;     /* on R.flush while want_write */
};

static struct {
    uv_prepare_t prepare;
    bool ready;                 /* prepare initialised */
    bool flushing;              /* inside flush_cb */
    struct list flush;          /* watchers with output to write */
    void (*before)(void);       /* redis_uv_before_flush's hook */
    bool want_before;           /* redis_uv_want_flush since it last ran */
} R;

static void redis_uv_on_poll(uv_poll_t *h, int status, int events);

static void redis_uv_set(struct redis_uv *w, int events)
{
    if (events == w->events)
        return;
    w->events = events;
    if (events)
        uv_poll_start(&w->poll, events, redis_uv_on_poll);
    else
        uv_poll_stop(&w->poll);
}

static void redis_uv_on_poll(uv_poll_t *h, int status, int events)
{
    struct redis_uv *w = h->data;

    if (status < 0) {
        /* libuv has stopped the watcher; let hiredis find the error on the
         * socket itself (SO_ERROR while connecting, read() after). */
        if (w->ac && !(w->ac->c.flags & REDIS_CONNECTED))
            redisAsyncHandleWrite(w->ac);
        else if (w->ac)
            redisAsyncHandleRead(w->ac);
        /* Still alive (hiredis saw no error after all): watch again. */
        if (w->ac && w->events)
            uv_poll_start(&w->poll, w->events, redis_uv_on_poll);
        return;
    }
    if (w->ac && (events & UV_READABLE))
        redisAsyncHandleRead(w->ac);
    if (w->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(w->ac);
}

/* Once per loop turn, before it polls: write what hiredis has queued. */
static void redis_uv_flush_cb(uv_prepare_t *h)
{
    struct list *p;

    do {
        if (R.want_before) {
            R.want_before = false;
            if (R.before)
                R.before();     /* may queue output: still this turn's */
        }
        R.flushing = true;
        while ((p = list_first(&R.flush))) {
            struct redis_uv *w = container_of(p, struct redis_uv,
                                              flush_link);
            list_remove(p);
            if (w->ac && w->want_write)
                redisAsyncHandleWrite(w->ac);   /* may free the context */
        }
        R.flushing = false;
        /* A failed write runs callbacks, which may gather new requests:
         * those go out now, not after the loop has slept. */
    } while (R.want_before);
    uv_prepare_stop(h);
}

static void redis_uv_add_read(void *p)
{
    struct redis_uv *w = p;
    redis_uv_set(w, w->events | UV_READABLE);
}

static void redis_uv_del_read(void *p)
{
    struct redis_uv *w = p;
    redis_uv_set(w, w->events & ~UV_READABLE);
}

static void redis_uv_add_write(void *p)
{
    struct redis_uv *w = p;

    w->want_write = true;
    /* Connecting (the connect's end shows as writable), or asked again
     * while we write: the socket is full, so wait until it drains. */
    if (!(w->ac->c.flags & REDIS_CONNECTED) || R.flushing ||
        (w->events & UV_WRITABLE)) {
        redis_uv_set(w, w->events | UV_WRITABLE);
        return;
    }
    if (!list_linked(&w->flush_link)) {
        list_push_tail(&R.flush, &w->flush_link);
        uv_prepare_start(&R.prepare, redis_uv_flush_cb);
    }
}

static void redis_uv_del_write(void *p)
{
    struct redis_uv *w = p;

    w->want_write = false;
    if (list_linked(&w->flush_link))
        list_remove(&w->flush_link);
    redis_uv_set(w, w->events & ~UV_WRITABLE);
}

static void redis_uv_closed(uv_handle_t *h)
{
    free(h->data);
}

static void redis_uv_cleanup(void *p)
{
    struct redis_uv *w = p;

    w->ac = NULL;
    w->want_write = false;
    if (list_linked(&w->flush_link))
        list_remove(&w->flush_link);
    uv_close((uv_handle_t *)&w->poll, redis_uv_closed);
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data)
        return -1;
    if (!R.ready) {
        if (uv_prepare_init(loop, &R.prepare) != 0)
            return -1;
        list_init(&R.flush);
        R.ready = true;
    }
    struct redis_uv *w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    if (uv_poll_init(loop, &w->poll, ac->c.fd) != 0) {
        free(w);
        return -1;
    }
    w->poll.data = w;
    w->ac = ac;
    list_init(&w->flush_link);
    ac->ev.data = w;
    ac->ev.addRead = redis_uv_add_read;
    ac->ev.delRead = redis_uv_del_read;
    ac->ev.addWrite = redis_uv_add_write;
    ac->ev.delWrite = redis_uv_del_write;
    ac->ev.cleanup = redis_uv_cleanup;
    return 0;
}

void redis_uv_before_flush(void (*fn)(void))
{
    R.before = fn;
}

void redis_uv_want_flush(void)
{
    if (!R.ready)
        return;
    R.want_before = true;
    uv_prepare_start(&R.prepare, redis_uv_flush_cb);
}

void redis_uv_close(void)
{
    if (R.ready)
        uv_close((uv_handle_t *)&R.prepare, NULL);
    R.ready = false;
}
