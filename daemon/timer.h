/*
 * timer: many cheap one-shot timers driven by one uv_timer_t.
 *
 * Leases, waits, keepalives, request timeouts and reconnect backoffs each
 * need a deadline. A uv_timer_t per deadline would need a close callback
 * before the owning struct could be freed; these timers are plain embedded
 * structs kept in a binary min-heap, so stopping one is all an owner must do
 * before freeing it. Times are uv_now() milliseconds (CLOCK_MONOTONIC).
 *
 * Unit tests run the same heap on a manual clock instead of a loop
 * (timer_sys_init_manual, timer_advance), so code built on timers can be
 * tested without sockets or sleeping.
 */
#ifndef REDLOCKD_TIMER_H
#define REDLOCKD_TIMER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct timer;
typedef void (*timer_cb)(struct timer *t);

struct timer {
    uint64_t due;       /* uv_now() ms at which it fires */
    size_t slot;        /* index in the heap + 1; 0 = not armed */
    timer_cb cb;
    void *data;         /* for the owner */
};

int timer_sys_init(uv_loop_t *loop);
/* Close the driving uv_timer_t (the loop must run once more to finish);
 * in manual mode just forget the heap. */
void timer_sys_deinit(void);

/* Manual clock (tests): no loop; time stands at `now` until advanced. */
void timer_sys_init_manual(uint64_t now);
/* Move the manual clock forward by ms, firing every timer that falls due
 * on the way, in order, each with the clock set to its due time. */
void timer_advance(uint64_t ms);
/* Armed timers (tests check that owners stopped theirs). */
size_t timer_count(void);

void timer_init(struct timer *t, timer_cb cb, void *data);
/* (Re)arm t to fire after `ms` milliseconds from now. */
void timer_start(struct timer *t, uint64_t ms);
void timer_start_at(struct timer *t, uint64_t due);
void timer_stop(struct timer *t);
uint64_t timer_now(void);   /* uv_now() of the loop, or the manual clock */

/* Room for timer_fmt_utc's text, NUL included. */
#define TIMER_UTC_SIZE sizeof("2026-12-02T10:00:00Z")
/* The wall-clock time (UTC, whole seconds rounded up) at which timer_now()
 * reaches `at`, for messages to people; at in the past is now. Deadlines
 * themselves stay on the monotonic clock. */
void timer_fmt_utc(uint64_t at, char *buf, size_t size);

#endif
