/*
 * redis_uv: runs a hiredis async context on the libuv loop.
 *
 * Our own version of what hiredis's adapters/libuv.h does, because the
 * 0.14 adapter drops poll errors: a refused connect or a reset socket then
 * only shows up when a timeout fires, and a quiet subscriber connection
 * might never notice. Here an error is handed to hiredis as a read (or a
 * write while connecting), so it sees the socket's error at once.
 */
#ifndef REDLOCKD_REDIS_UV_H
#define REDLOCKD_REDIS_UV_H

#include <hiredis/async.h>
#include <uv.h>

/* 0, or -1 (the context is untouched and may simply be freed). */
int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);
/* fn runs once at the end of each loop turn in which redis_uv_want_flush
 * was called, just before the output of every context is written (one
 * hook for the process: the pool's). Queueing commands in it is queueing
 * them for that write. */
void redis_uv_before_flush(void (*fn)(void));
void redis_uv_want_flush(void);
/* Close the loop-wide flush handle (at exit, once no context is left). */
void redis_uv_close(void);

#endif
