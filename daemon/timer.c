/*
 * timer: see timer.h. A binary min-heap of armed timers ordered by `due`;
 * the single uv_timer_t is always armed for the heap's top.
 */
#include "timer.h"
#include "mem.h"

#include <stdio.h>
#include <time.h>
#include <stdlib.h>

static struct {
    uv_loop_t *loop;        /* NULL on the manual clock */
    uint64_t manual_now;
    uv_timer_t handle;
    struct timer **heap;
    size_t len, cap;
    int running;        /* inside timer_fire: defer re-arming */
} ts;

static void timer_fire(uv_timer_t *h);

int timer_sys_init(uv_loop_t *loop)
{
    ts.loop = loop;
    ts.len = 0;
    return uv_timer_init(loop, &ts.handle);
}

void timer_sys_init_manual(uint64_t now)
{
    ts.loop = NULL;
    ts.manual_now = now;
    ts.len = 0;
}

void timer_sys_deinit(void)
{
    if (ts.loop)
        uv_close((uv_handle_t *)&ts.handle, NULL);
    free(ts.heap);
    ts.heap = NULL;
    ts.len = ts.cap = 0;
}

uint64_t timer_now(void)
{
    return ts.loop ? uv_now(ts.loop) : ts.manual_now;
}

size_t timer_count(void)
{
    return ts.len;
}

void timer_init(struct timer *t, timer_cb cb, void *data)
{
    t->due = 0;
    t->slot = 0;
    t->cb = cb;
    t->data = data;
}

static void heap_set(size_t i, struct timer *t)
{
    ts.heap[i] = t;
    t->slot = i + 1;
}

static void heap_up(size_t i)
{
    struct timer *t = ts.heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (ts.heap[parent]->due <= t->due)
            break;
        heap_set(i, ts.heap[parent]);
        i = parent;
    }
    heap_set(i, t);
}

static void heap_down(size_t i)
{
    struct timer *t = ts.heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        uint64_t mdue = t->due;
        if (l < ts.len && ts.heap[l]->due < mdue) {
            m = l;
            mdue = ts.heap[l]->due;
        }
        if (r < ts.len && ts.heap[r]->due < mdue)
            m = r;
        if (m == i)
            break;
        heap_set(i, ts.heap[m]);
        i = m;
    }
    heap_set(i, t);
}

static void timer_rearm(void)
{
    if (ts.running || !ts.loop)
        return;
    if (ts.len == 0) {
        uv_timer_stop(&ts.handle);
        return;
    }
    uint64_t now = timer_now(), due = ts.heap[0]->due;
    uv_timer_start(&ts.handle, timer_fire, due > now ? due - now : 0, 0);
}

static void heap_remove(size_t i)
{
    struct timer *t = ts.heap[i];
    ts.len--;
    if (i != ts.len) {
        struct timer *last = ts.heap[ts.len];
        heap_set(i, last);
        heap_up(i);
        if (last->slot - 1 == i)
            heap_down(i);
    }
    t->slot = 0;
}

void timer_stop(struct timer *t)
{
    if (!t->slot)
        return;
    size_t i = t->slot - 1;
    int was_top = i == 0;
    heap_remove(i);
    if (was_top)
        timer_rearm();
}

void timer_start_at(struct timer *t, uint64_t due)
{
    if (t->slot) {
        size_t i = t->slot - 1;
        heap_remove(i);
    }
    if (ts.len == ts.cap) {
        size_t ncap = ts.cap ? ts.cap * 2 : 64;
        ts.heap = mem_realloc(ts.heap, ncap * sizeof(*ts.heap));
        ts.cap = ncap;
    }
    t->due = due;
    heap_set(ts.len, t);
    ts.len++;
    heap_up(ts.len - 1);
    timer_rearm();
}

void timer_start(struct timer *t, uint64_t ms)
{
    timer_start_at(t, timer_now() + ms);
}

/* Fire every timer due at or before `now`, earliest first. */
static void timer_run(uint64_t now)
{
    ts.running = 1;
    while (ts.len > 0 && ts.heap[0]->due <= now) {
        struct timer *t = ts.heap[0];
        heap_remove(0);
        if (!ts.loop && t->due > ts.manual_now)
            ts.manual_now = t->due;
        t->cb(t);       /* may start or stop any timer, or free t */
    }
    ts.running = 0;
    timer_rearm();
}

static void timer_fire(uv_timer_t *h)
{
    (void)h;
    timer_run(uv_now(ts.loop));
}

void timer_advance(uint64_t ms)
{
    uint64_t until = ts.manual_now + ms;
    timer_run(until);
    ts.manual_now = until;
}

void timer_fmt_utc(uint64_t at, char *buf, size_t size)
{
    struct timespec ts;
    struct tm tm;
    uint64_t now = timer_now();
    time_t t;

    clock_gettime(CLOCK_REALTIME, &ts);
    t = ts.tv_sec + (time_t)(at > now ? (at - now + 999) / 1000 : 0);
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}
