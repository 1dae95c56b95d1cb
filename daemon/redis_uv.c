/*
 * redis_uv: see redis_uv.h. The watcher lives in a small heap block that
 * hiredis reaches through ac->ev.data; hiredis calls the cleanup hook when
 * it frees the context, and the block is freed in the handle's close
 * callback, as libuv requires.
 */
#include "redis_uv.h"

#include <stdlib.h>

struct redis_uv {
    uv_poll_t poll;
    redisAsyncContext *ac;      /* NULL once hiredis let go of it */
    int events;
};

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

static void redis_uv_update(struct redis_uv *w, int add, int del)
{
    w->events = (w->events | add) & ~del;
    if (w->events)
        uv_poll_start(&w->poll, w->events, redis_uv_on_poll);
    else
        uv_poll_stop(&w->poll);
}

static void redis_uv_add_read(void *p)  { redis_uv_update(p, UV_READABLE, 0); }
static void redis_uv_del_read(void *p)  { redis_uv_update(p, 0, UV_READABLE); }
static void redis_uv_add_write(void *p) { redis_uv_update(p, UV_WRITABLE, 0); }
static void redis_uv_del_write(void *p) { redis_uv_update(p, 0, UV_WRITABLE); }

static void redis_uv_closed(uv_handle_t *h)
{
    free(h->data);
}

static void redis_uv_cleanup(void *p)
{
    struct redis_uv *w = p;

    w->ac = NULL;
    uv_close((uv_handle_t *)&w->poll, redis_uv_closed);
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data)
        return -1;
    struct redis_uv *w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    if (uv_poll_init(loop, &w->poll, ac->c.fd) != 0) {
        free(w);
        return -1;
    }
    w->poll.data = w;
    w->ac = ac;
    ac->ev.data = w;
    ac->ev.addRead = redis_uv_add_read;
    ac->ev.delRead = redis_uv_del_read;
    ac->ev.addWrite = redis_uv_add_write;
    ac->ev.delWrite = redis_uv_del_write;
    ac->ev.cleanup = redis_uv_cleanup;
    return 0;
}
