/*
 * pool_lua: the Redis scripts' text, one C string per enum pool_script.
 *
 * The scripts live in daemon/lua/ as Lua files (one per script, with a
 * header saying its keys, arguments and replies; the pieces several share
 * in daemon/lua/lib/), and meson turns them into pool_lua.c at build time
 * (daemon/lua/embed.py), so the binary stays one file. The constants they
 * use (@NAME@ in the files) are the C macros below and in conf.h.
 */
#ifndef REDLOCKD_POOL_LUA_H
#define REDLOCKD_POOL_LUA_H

#include "conf.h"
#include "pool.h"

/* How long a waiting mark outlives the key it marks (lib/busy.lua): a
 * waiter asks again at that key's PTTL at the latest (lockmgr's
 * req_sleep), so the mark is there while it waits. */
#define POOL_WAIT_MARK_MS "2000"

extern const char *const pool_lua[POOL_SCRIPT_COUNT];

#endif
