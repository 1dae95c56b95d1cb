/*
 * pool: see pool.h.
 *
 * Ownership: pool_init allocates the nodes and their links, pool_free frees
 * them; the pool owns every pool_req from send until its reply callback has
 * run. hiredis owns the redisAsyncContext; we drop our pointer to it (l->ac =
 * NULL, ac->data = NULL) *before* asking hiredis to free it, so callbacks
 * hiredis runs while freeing (NULL replies, onDisconnect) never reach a link
 * through a context that is going away.
 */
#include "pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <hiredis/async.h>

#include "list.h"
#include "log.h"
#include "mem.h"
#include "num.h"
#include "redis_uv.h"
#include "stats.h"
#include "timer.h"

#define POOL_BACKOFF_MIN_MS 100
#define POOL_SHA_LEN 40         /* hex chars of a script's SHA1 (SCRIPT LOAD) */
#define POOL_EVAL_WORDS 3       /* EVALSHA sha numkeys, before a script's words */
#define POOL_HS_STEP_MAX 32     /* "SCRIPT LOAD: " and the like, before an error */
#define POOL_KEEPALIVE_S 15     /* TCP keepalive idle time on node links */
#define POOL_LINK_FILL 64       /* requests out on a link before the next
                                   takes some (pool_node_pick) */
#define POOL_PROBE_SUFFIX ":probe:" /* probe channel: release channel, this,
                                       the instance id */

/*
 * The fence scripts start alike: read the counter (KEYS[k], the fence key
 * fk) into c, and refuse, before any write, a counter that is not a
 * decimal below 10^18 (its successor then stays far from overflow).
 * Counters are compared as strings, by length and then byte by byte: Lua
 * numbers are doubles, exact only up to 2^53, so no counter is ever
 * turned into one.
 */
#define POOL_LUA_COUNTER_AT(k) \
    "local function above(a, b)\n" \
    "  if #a ~= #b then return #a > #b end\n" \
    "  for i = 1, #a do\n" \
    "    local x, y = string.byte(a, i), string.byte(b, i)\n" \
    "    if x ~= y then return x > y end\n" \
    "  end\n" \
    "  return false\n" \
    "end\n" \
    "local fk = KEYS[" k "]\n" \
    "local c = redis.call('GET', fk) or '0'\n" \
    "if c ~= '0' and not (#c <= 18 and string.find(c, '^[1-9][0-9]*$')) then\n" \
    "  return redis.error_reply('ERR fence counter ' .. fk ..\n" \
    "                           ' is not a decimal below 10^18')\n" \
    "end\n"
#define POOL_LUA_COUNTER POOL_LUA_COUNTER_AT("2")

/*
 * The guard of every script whose answer is a vote (acquire, extend,
 * raise): its last three arguments are the longest-ttl record, the
 * recovery marker and the run_id under which the daemon admitted this node
 * ('' from a node that does not vote: no check, its answer is not counted).
 * A node whose marker no longer names that run lost its data since it was
 * admitted (FLUSHALL, eviction, a failover to an empty replica): it answers
 * LOSTDATA before writing anything, so its vote fails now rather than at
 * the next probe, and the daemon starts its recovery on that answer.
 *
 * note_ttl(t): the record holds the longest ttl granted or renewed on this
 * node while some such lease may live (its own expiry is kept at least t
 * ahead), so that a daemon deciding how long a node that lost its data
 * must wait can read the longest lease any daemon may still hold
 * (docs/design.md, "Restarted nodes").
 */
#define POOL_LUA_GUARD \
    "local ttl_key = ARGV[#ARGV - 2]\n" \
    "local admitted = ARGV[#ARGV]\n" \
    "if admitted ~= '' and redis.call('GET', ARGV[#ARGV - 1]) ~= admitted then\n" \
    "  return redis.error_reply('LOSTDATA ' .. ARGV[#ARGV - 1] .. ' does not ' ..\n" \
    "    'name run ' .. admitted .. ': the node lost its data since it was ' ..\n" \
    "    'admitted')\n" \
    "end\n" \
    "local function note_ttl(t)\n" \
    "  t = tonumber(t)\n" \
    "  local v = tonumber(redis.call('GET', ttl_key) or '0') or 0\n" \
    "  if v < t or redis.call('PTTL', ttl_key) < t then\n" \
    "    if v < t then v = t end\n" \
    "    redis.call('SET', ttl_key, v, 'PX', t)\n" \
    "  end\n" \
    "end\n"

/* m = max(c, seen), and f = m + 1, the fence a grant gets (seen is
 * ARGV[3] in the acquire scripts). The successor is taken on the decimal
 * string (Lua's doubles are exact only to 2^53). */
#define POOL_LUA_SEEN(arg) \
    "local m = c\n" \
    "if above(" arg ", m) then m = " arg " end\n" \
    "local i = #m\n" \
    "while i > 0 and string.byte(m, i) == 57 do i = i - 1 end\n" \
    "local f\n" \
    "if i == 0 then f = '1' .. string.rep('0', #m)\n" \
    "else f = string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)\n" \
    "         .. string.rep('0', #m - i) end\n"

/* The grant: the counter becomes f, written in the same script as the
 * grant, so while the key is ours (docs/design.md, "Fences"). */
#define POOL_LUA_GRANT \
    "redis.call('SET', fk, f)\n" \
    "note_ttl(ARGV[2])\n" \
    "return {1, f}\n"

/* What a granted exclusive key holds: "token label fence" when the holder
 * gave a label (ARGV[4], redlockd's JSON naming daemon, session and
 * client; see docs/design.md, "Holder labels"), else just the token.
 * STATUS on any daemon reads it back. */
#define POOL_LUA_VALUE \
    "local value = ARGV[1]\n" \
    "if ARGV[4] and ARGV[4] ~= '' then\n" \
    "  value = ARGV[1] .. ' ' .. ARGV[4] .. ' ' .. f\n" \
    "end\n"

/* A busy answer: k's PTTL, and when the request will wait (ARGV[5] is
 * '1'), k marked as waited for, so that its release is announced (only
 * then: an uncontended release publishes nothing). The mark,
 * k .. ' waiting', is nobody's lock (no resource name has a space) and
 * outlives k's PTTL by POOL_WAIT_MARK_MS, the waiter's next try coming at
 * that PTTL at the latest (lockmgr's req_sleep). */
#define POOL_WAIT_MARK_MS "2000"
#define POOL_LUA_BUSY \
    "local function busy(k)\n" \
    "  local p = redis.call('PTTL', k)\n" \
    "  if ARGV[5] == '1' then\n" \
    "    local w = p\n" \
    "    if w < 0 then w = 0 end\n" \
    "    redis.call('SET', k .. '" CONF_WAITING_SUFFIX "', '1', 'PX', w + " POOL_WAIT_MARK_MS ")\n" \
    "  end\n" \
    "  return p\n" \
    "end\n"

/* Owner checks: value v is token t's, with or without a label after it. */
#define POOL_LUA_OURS \
    "local function ours(v, t)\n" \
    "  return type(v) == 'string' and\n" \
    "         (v == t or string.sub(v, 1, #t + 1) == t .. ' ')\n" \
    "end\n"

/* The fence a labelled value carries ("token label fence"), or nil. */
#define POOL_LUA_FENCE_OF \
    "local function fence_of(v)\n" \
    "  return string.match(v, '^%x+ %S+ (%d+)$')\n" \
    "end\n"

/* The node's own clock in ms: shared holders' expiry times are its. */
#define POOL_LUA_NOW \
    "local now_t = redis.call('TIME')\n" \
    "local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)\n"

/* A key of the wrong type is no lock of ours: an error (a failed vote),
 * never a busy vote or a grant. */
#define POOL_LUA_NOTLOCK \
    "local function notlock(k, t)\n" \
    "  return redis.error_reply('WRONGTYPE ' .. k .. ' holds a ' .. t ..\n" \
    "                           ', not a lock')\n" \
    "end\n"

/* The shared holders of a set s still alive by the node's clock: their
 * count (expired members are dropped first), or nil and the type of a key
 * that is no set. */
#define POOL_LUA_READERS \
    "local function readers(s)\n" \
    "  local t = redis.call('TYPE', s)['ok']\n" \
    "  if t == 'none' then return 0 end\n" \
    "  if t ~= 'zset' then return nil, t end\n" \
    POOL_LUA_NOW \
    "  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)\n" \
    "  return redis.call('ZCARD', s)\n" \
    "end\n"

/* A shared hold is a member of the set: the token, scored by its expiry
 * on the node's clock. The set lives as long as its latest member. */
#define POOL_LUA_SHARED_PUT \
    "local function put(s, token, ttl)\n" \
    POOL_LUA_NOW \
    "  redis.call('ZADD', s, now + ttl, token)\n" \
    "  if redis.call('PTTL', s) < ttl then redis.call('PEXPIRE', s, ttl) end\n" \
    "end\n"

/* release(k, t, channel, id): 1 when k was ours and is gone, else 0. A
 * key of another type (a shared lock's set) is handled as such: the
 * token's member is removed. The release is announced on channel ("k id"
 * for a key, "k" for a set once it has no live member left: only
 * exclusive waiters wait for that) when a waiter marked k (POOL_LUA_BUSY). */
#define POOL_LUA_RELEASE \
    POOL_LUA_OURS \
    "local function release(k, t, channel, id)\n" \
    "  local function announce(msg)\n" \
    "    if redis.call('DEL', k .. '" CONF_WAITING_SUFFIX "') == 1 then\n" \
    "      redis.call('PUBLISH', channel, msg)\n" \
    "    end\n" \
    "  end\n" \
    "  local v = redis.pcall('GET', k)\n" \
    "  if type(v) == 'table' and v.err then\n" \
    "    local s = redis.call('ZSCORE', k, t)\n" \
    "    if not s then return 0 end\n" \
    "    redis.call('ZREM', k, t)\n" \
    POOL_LUA_NOW \
    "    redis.call('ZREMRANGEBYSCORE', k, '-inf', now)\n" \
    "    if redis.call('EXISTS', k) == 0 then announce(k) end\n" \
    "    if tonumber(s) <= now then return 0 end\n" \
    "    return 1\n" \
    "  end\n" \
    "  if ours(v, t) then\n" \
    "    redis.call('DEL', k)\n" \
    "    announce(k .. ' ' .. id)\n" \
    "    return 1\n" \
    "  end\n" \
    "  return 0\n" \
    "end\n"

/* The body of a batch script: fn(args) for each key i, each in its own
 * pcall so that one key's error (a key of a foreign type, OOM) is that
 * key's answer alone, not the batch's. Writes before an error stay, as
 * they would for a script of its own. */
#define POOL_LUA_EACH(fn, args) \
    "local out = {}\n" \
    "for i = 1, #KEYS do\n" \
    "  local ok, r = pcall(" fn ", " args ")\n" \
    "  if ok then out[i] = r else\n" \
    "    out[i] = redis.error_reply(type(r) == 'table' and r.err or tostring(r))\n" \
    "  end\n" \
    "end\n"

/* extend(k, t, ttl): 1 when k is ours and now lasts ttl ms more, else 0.
 * On a shared lock's set only a live member is ours to extend (one past
 * its expiry may already have let a writer in). */
#define POOL_LUA_EXTEND \
    POOL_LUA_SHARED_PUT \
    POOL_LUA_OURS \
    "local longest = 0\n" \
    "local function extend(k, t, ttl)\n" \
    "  local v = redis.pcall('GET', k)\n" \
    "  if type(v) == 'table' and v.err then\n" \
    "    local s = redis.call('ZSCORE', k, t)\n" \
    "    if not s then return 0 end\n" \
    POOL_LUA_NOW \
    "    if tonumber(s) <= now then\n" \
    "      redis.call('ZREM', k, t)\n" \
    "      return 0\n" \
    "    end\n" \
    "    put(k, t, tonumber(ttl))\n" \
    "  elseif ours(v, t) then\n" \
    "    redis.call('PEXPIRE', k, ttl)\n" \
    "  else\n" \
    "    return 0\n" \
    "  end\n" \
    "  if tonumber(ttl) > longest then longest = tonumber(ttl) end\n" \
    "  return 1\n" \
    "end\n"

static const char *const pool_lua[POOL_SCRIPT_COUNT] = {
    /* With the key taken, the counter becomes max(c, seen) + 1 in the same
     * script: the fence is written while the key is ours. With KEYS[3],
     * the resource's shared holders' set, the key is not taken while that
     * has a live member. */
    [POOL_SCRIPT_ACQUIRE] =
        POOL_LUA_GUARD
        POOL_LUA_COUNTER
        POOL_LUA_NOTLOCK
        POOL_LUA_READERS
        POOL_LUA_BUSY
        POOL_LUA_SEEN("ARGV[3]")
        POOL_LUA_VALUE
        "if KEYS[3] then\n"
        "  local n, t = readers(KEYS[3])\n"
        "  if not n then return notlock(KEYS[3], t) end\n"
        "  if n > 0 then return {0, busy(KEYS[3])} end\n"
        "end\n"
        "if not redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then\n"
        "  local t = redis.call('TYPE', KEYS[1])['ok']\n"
        "  if t ~= 'string' and t ~= 'none' then return notlock(KEYS[1], t) end\n"
        "  return {0, busy(KEYS[1])}\n"
        "end\n"
        POOL_LUA_GRANT,
    [POOL_SCRIPT_RELEASE] =
        POOL_LUA_RELEASE
        "return release(KEYS[1], ARGV[1], ARGV[2], ARGV[3])\n",
    /* Releases nobody waits for, together: key i with token ARGV[2 + i];
     * ARGV[1] the channel, ARGV[2] the instance id. */
    [POOL_SCRIPT_RELEASE_MANY] =
        POOL_LUA_RELEASE
        POOL_LUA_EACH("release", "KEYS[i], ARGV[2 + i], ARGV[1], ARGV[2]")
        "return out\n",
    [POOL_SCRIPT_EXTEND] =
        POOL_LUA_GUARD
        POOL_LUA_EXTEND
        "local r = extend(KEYS[1], ARGV[1], ARGV[2])\n"
        "if r == 1 then note_ttl(longest) end\n"
        "return r\n",
    /* Renewals due together: key i with token ARGV[2i-1] and ttl
     * ARGV[2i], each owner-checked on its own. */
    [POOL_SCRIPT_EXTEND_MANY] =
        POOL_LUA_GUARD
        POOL_LUA_EXTEND
        POOL_LUA_EACH("extend", "KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]")
        "if longest > 0 then note_ttl(longest) end\n"
        "return out\n",
    [POOL_SCRIPT_RAISE] =
        "local c = tonumber(redis.call('GET', KEYS[1]) or '0')\n"
        "if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end\n"
        "return 1\n",
    /* Only while the key holds our token: a raise where we hold no key
     * proves nothing about the next holder (docs/design.md, "Fences").
     * KEYS[3] and on: the other keys of a grant of several resources,
     * which must all hold it too. */
    [POOL_SCRIPT_RAISE_HELD] =
        POOL_LUA_GUARD
        POOL_LUA_COUNTER
        POOL_LUA_OURS
        POOL_LUA_FENCE_OF
        "for i = 1, #KEYS do\n"
        "  if i ~= 2 and not ours(redis.call('GET', KEYS[i]), ARGV[1]) then\n"
        "    return {0, c}\n"
        "  end\n"
        "end\n"
        "if above(ARGV[2], c) then\n"
        "  redis.call('SET', fk, ARGV[2])\n"
        "  c = ARGV[2]\n"
        "end\n"
        /* The values say the grant's fence too (STATUS, ADOPT read it):
         * the raised one, the key's ttl kept. */
        "for i = 1, #KEYS do\n"
        "  if i ~= 2 then\n"
        "    local v = redis.call('GET', KEYS[i])\n"
        "    local f = fence_of(v)\n"
        "    if f and above(ARGV[2], f) then\n"
        "      redis.call('SET', KEYS[i], string.sub(v, 1, #v - #f) .. ARGV[2],\n"
        "                 'KEEPTTL')\n"
        "    end\n"
        "  end\n"
        "end\n"
        "return {1, c}\n",
    /* ADOPT: every key holds the old token (ARGV[1]): each gets the new
     * token (ARGV[2]) and label (ARGV[4]) with the fence it carries, and
     * the ttl ARGV[3]; {1, the largest fence carried}. Else nothing is
     * written: {0}. */
    [POOL_SCRIPT_ADOPT] =
        POOL_LUA_GUARD
        POOL_LUA_OURS
        POOL_LUA_FENCE_OF
        "local vals, best = {}, ''\n"
        "for i = 1, #KEYS do\n"
        "  local v = redis.pcall('GET', KEYS[i])\n"
        "  if not ours(v, ARGV[1]) then return {0} end\n"
        "  local f = fence_of(v) or ''\n"
        "  if #f > #best or (#f == #best and f > best) then best = f end\n"
        "  vals[i] = f\n"
        "end\n"
        "for i = 1, #KEYS do\n"
        "  local v = ARGV[2]\n"
        "  if ARGV[4] ~= '' and vals[i] ~= '' then\n"
        "    v = ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. vals[i]\n"
        "  end\n"
        "  redis.call('SET', KEYS[i], v, 'PX', ARGV[3])\n"
        "end\n"
        "note_ttl(ARGV[3])\n"
        "return {1, best}\n",
    [POOL_SCRIPT_UNDO] =
        POOL_LUA_OURS
        "if ours(redis.call('GET', KEYS[1]), ARGV[1]) then\n"
        "  redis.call('DEL', KEYS[1])\n"
        "  return 1\n"
        "end\n"
        "return 0\n",
    /* A shared hold: not while the exclusive key exists (whoever set it,
     * redlockd or another Redlock client). */
    [POOL_SCRIPT_ACQUIRE_SHARED] =
        POOL_LUA_GUARD
        POOL_LUA_COUNTER
        POOL_LUA_NOTLOCK
        POOL_LUA_SHARED_PUT
        POOL_LUA_BUSY
        POOL_LUA_SEEN("ARGV[3]")
        "local t = redis.call('TYPE', KEYS[1])['ok']\n"
        "if t ~= 'none' then\n"
        "  if t ~= 'string' then return notlock(KEYS[1], t) end\n"
        "  return {0, busy(KEYS[1])}\n"
        "end\n"
        "t = redis.call('TYPE', KEYS[3])['ok']\n"
        "if t ~= 'none' and t ~= 'zset' then return notlock(KEYS[3], t) end\n"
        "if t == 'zset' then\n"
        POOL_LUA_NOW
        "  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)\n"
        "end\n"
        "put(KEYS[3], ARGV[1], tonumber(ARGV[2]))\n"
        POOL_LUA_GRANT,
    /* All the keys or none, in one step: no two requests for overlapping
     * sets can each hold a part. The busy answer's PTTL is the longest of
     * the keys that stood in the way. */
    [POOL_SCRIPT_ACQUIRE_MULTI] =
        POOL_LUA_GUARD
        POOL_LUA_COUNTER_AT("1")
        POOL_LUA_NOTLOCK
        POOL_LUA_READERS
        POOL_LUA_BUSY
        POOL_LUA_SEEN("ARGV[3]")
        POOL_LUA_VALUE
        "local held, wait = false, -1\n"
        "for i = 2, #KEYS, 2 do\n"
        "  local x, s = KEYS[i], KEYS[i + 1]\n"
        "  local t = redis.call('TYPE', x)['ok']\n"
        "  local p = nil\n"
        "  if t ~= 'none' then\n"
        "    if t ~= 'string' then return notlock(x, t) end\n"
        "    p = busy(x)\n"
        "  else\n"
        "    local n, st = readers(s)\n"
        "    if not n then return notlock(s, st) end\n"
        "    if n > 0 then p = busy(s) end\n"
        "  end\n"
        "  if p then\n"
        "    held = true\n"
        "    if p > wait then wait = p end\n"
        "  end\n"
        "end\n"
        "if held then return {0, wait} end\n"
        "for i = 2, #KEYS, 2 do\n"
        "  redis.call('SET', KEYS[i], value, 'PX', ARGV[2])\n"
        "end\n"
        POOL_LUA_GRANT,
    /* RAISE_HELD for a shared hold: only while our member is live. */
    [POOL_SCRIPT_RAISE_SHARED] =
        POOL_LUA_GUARD
        POOL_LUA_COUNTER
        POOL_LUA_NOW
        "local s = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
        "if not s or tonumber(s) <= now then return {0, c} end\n"
        "if above(ARGV[2], c) then\n"
        "  redis.call('SET', fk, ARGV[2])\n"
        "  c = ARGV[2]\n"
        "end\n"
        "return {1, c}\n",
    /* A late holder's keys carry the fence the grant got, not its own
     * larger counter (which stays: counters never go down), so that
     * STATUS and ADOPT read the grant's fence there too. */
    [POOL_SCRIPT_SET_FENCE] =
        POOL_LUA_OURS
        POOL_LUA_FENCE_OF
        "local n = 0\n"
        "for i = 1, #KEYS do\n"
        "  local v = redis.pcall('GET', KEYS[i])\n"
        "  if ours(v, ARGV[1]) then\n"
        "    local f = fence_of(v)\n"
        "    if f and f ~= ARGV[2] then\n"
        "      redis.call('SET', KEYS[i], string.sub(v, 1, #v - #f) .. ARGV[2],\n"
        "                 'KEEPTTL')\n"
        "      n = n + 1\n"
        "    end\n"
        "  end\n"
        "end\n"
        "return n\n",
    /* STATUS: the exclusive key's PTTL, the live shared holders, for
     * each of K semaphore slots (keys ARGV[1] .. i, which are not in KEYS:
     * there can be up to locks.max_limit of them) '1' if it exists, and
     * the exclusive key's value ('' when none). */
    [POOL_SCRIPT_INSPECT] =
        POOL_LUA_NOW
        "local n = 0\n"
        "if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then\n"
        "  n = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')\n"
        "end\n"
        "local bits = {}\n"
        "for i = 0, tonumber(ARGV[2]) - 1 do\n"
        "  bits[#bits + 1] = redis.call('EXISTS', ARGV[1] .. i) == 1 and '1' or '0'\n"
        "end\n"
        "local v = redis.pcall('GET', KEYS[1])\n"
        "if type(v) ~= 'string' then v = '' end\n"
        "return {redis.call('PTTL', KEYS[1]), n, table.concat(bits), v}\n",
    /* FORCEUNLOCK: every key of the resource, whoever holds it, and the
     * release announced (a slot's too, so semaphore waiters wake). */
    [POOL_SCRIPT_FORCE] =
        "local n = redis.call('DEL', KEYS[1], KEYS[2])\n"
        "local first = nil\n"
        "for i = 0, tonumber(ARGV[2]) - 1 do\n"
        "  local k = ARGV[1] .. i\n"
        "  if redis.call('DEL', k) == 1 then\n"
        "    n = n + 1\n"
        "    first = first or k\n"
        "  end\n"
        "end\n"
        "redis.call('PUBLISH', ARGV[3], KEYS[1])\n"
        "if first then redis.call('PUBLISH', ARGV[3], first) end\n"
        "return n\n",
};

enum link_state { LINK_DOWN, LINK_CONNECTING, LINK_UP };

struct pool_link;

struct pool_req {
    struct list queue;              /* in link->queue, send order */
    struct pool_link *link;
    uint64_t deadline;              /* uv_now ms */
    uint64_t sent_ns;
    pool_reply_cb cb;
    void *ud;
    int script;                     /* enum pool_script, or -1 */
    int nkeys;
    int argc;                       /* words in argv */
    bool retried;                   /* NOSCRIPT fallback already used */
    char **argv;                    /* (owned) points into this allocation */
    size_t *lens;
};

struct pool_node;

struct pool_link {
    struct pool_node *node;
    redisAsyncContext *ac;          /* (hiredis-owned) NULL when down */
    enum link_state state;
    bool subscriber;
    struct list queue;              /* pool_reqs awaiting a reply */
    unsigned nqueue;                /* of them */
    uint64_t connect_deadline;
    uint64_t last_progress;         /* last reply, or first send into an
                                       empty queue (uv_now ms) */
    bool graced;                    /* got one extra period since then */
    struct timer timer;             /* earliest deadline of this link */
    struct timer probe_timer;       /* probe_interval_ms after last_send
                                       (data) or last_recv (subscriber) */
    uint64_t last_send;             /* data: last request written (uv_now) */
    bool fsync_always, aof_on;      /* data: what this handshake read */
    /* Subscriber only: */
    uint64_t last_recv;             /* last message or subscribe reply */
    uint64_t probe_seq;             /* the probe message awaited */
    uint64_t probe_deadline;        /* by when it must arrive, 0 if none */
    bool probe_refused;             /* PUBLISH not allowed: not probed */
};

struct pool_node {
    int idx;
    const struct conf_addr *addr;
    struct pool_link *links;        /* pool_size data links */
    struct pool_link sub;           /* release notifications */
    unsigned nup;                   /* data links in LINK_UP */
    bool failed;                    /* between pool_node_fail and reconnect */
    bool identified;                /* came up with a run_id: connecting
                                       again counts as a reconnect */
    unsigned backoff_ms;
    struct timer reconnect_timer;
    uint64_t probe_seq;             /* last probe message number sent */

    struct pool_node_stats st;
};

static struct {
    uv_loop_t *loop;
    const struct conf *conf;
    struct pool_hooks hooks;            /* the user's, copied at init */
    struct pool_node *nodes;
    int nnodes;
    bool stopping;
    uint64_t inflight;                  /* requests awaiting replies */
    char sha[POOL_SCRIPT_COUNT][POOL_SHA_LEN + 1]; /* "" until loaded */
    char instance_id[POOL_INSTANCE_ID_LEN + 1];
    char *probe_channel;                /* (owned) see POOL_PROBE_SUFFIX */
    char *cmd;                          /* (owned) resp_format's buffer */
    size_t cmdcap;
} P;

static void link_connect(struct pool_link *l);
static void pool_node_fail(struct pool_node *n, const char *why);

/* ---- request queue of a link ------------------------------------------ */

static void link_arm(struct pool_link *l)
{
    uint64_t due = UINT64_MAX;
    if (l->state == LINK_CONNECTING)
        due = l->connect_deadline;
    struct pool_req *oldest = list_entry(list_first(&l->queue),
                                         struct pool_req, queue);
    if (oldest) {
        /* A node that keeps answering is alive even when a burst queues a
         * request behind thousands of others: time out only when the
         * oldest request is overdue *and* nothing came back meanwhile. */
        uint64_t d = oldest->deadline;
        uint64_t quiet = l->last_progress + P.conf->redis.command_timeout_ms;
        if (quiet > d)
            d = quiet;
        if (d < due)
            due = d;
    }
    if (l->probe_deadline && l->probe_deadline < due)
        due = l->probe_deadline;
    if (due == UINT64_MAX)
        timer_stop(&l->timer);
    else
        timer_start_at(&l->timer, due);
}

/* A copy of the request, or NULL (logged) when it has more words than
 * link_send has room for. */
static struct pool_req *req_create(int script, int nkeys, int argc,
                                   const char **argv, const size_t *lens)
{
    size_t bytes = 0;

    if (argc > POOL_MAX_ARGS) {
        log_error("a redis request of %d words (at most %d): not sent", argc,
                  POOL_MAX_ARGS);
        return NULL;
    }
    for (int i = 0; i < argc; i++)
        bytes += lens[i] + 1;
    size_t size = sizeof(struct pool_req) + (size_t)argc * (sizeof(char *) +
                  sizeof(size_t)) + bytes;
    struct pool_req *q = mem_alloc(size);
    q->argv = (char **)(void *)(q + 1);
    q->lens = (size_t *)(void *)(q->argv + argc);
    char *p = (char *)(q->lens + argc);
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], lens[i]);
        p[lens[i]] = '\0';
        q->argv[i] = p;
        q->lens[i] = lens[i];
        p += lens[i] + 1;
    }
    list_init(&q->queue);
    q->script = script;
    q->nkeys = nkeys;
    q->argc = argc;
    return q;
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* One RESP bulk string at p; past it. */
static char *put_bulk(char *p, const char *s, size_t len)
{
    *p++ = '$';
    p = proto_write_u64(p, len);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* q as a RESP array in P.cmd, the bytes redisAsyncCommandArgv would
 * write: hiredis formats with its own printf (sdscatfmt), which was the
 * daemon's biggest user-space cost. Returns the length. */
static size_t resp_format(const struct pool_req *q, bool by_sha)
{
    /* Around each word "$", its length's digits and two CRLFs (the
     * array's "*<n>" CRLF is shorter). */
    const size_t over = 1 + PROTO_U64_DIGITS + 4;
    const char *script = NULL;
    size_t scriptlen = 0, need = over;
    int words = q->argc;
    char nkeys[PROTO_U64_DIGITS];
    size_t nkeyslen = 0;

    if (q->script >= 0) {
        script = by_sha ? P.sha[q->script] : pool_lua[q->script];
        scriptlen = strlen(script);
        nkeyslen = (size_t)(proto_write_u64(nkeys, (uint64_t)q->nkeys) -
                            nkeys);
        need += 3 * over + 7 + scriptlen + nkeyslen;
        words += POOL_EVAL_WORDS;
    }
    for (int i = 0; i < q->argc; i++)
        need += over + q->lens[i];
    if (need > P.cmdcap) {
        P.cmd = mem_realloc(P.cmd, need);
        P.cmdcap = need;
    }

    char *p = P.cmd;
    *p++ = '*';
    p = proto_write_u64(p, (uint64_t)words);
    *p++ = '\r';
    *p++ = '\n';
    if (script) {
        p = by_sha ? put_bulk(p, "EVALSHA", 7) : put_bulk(p, "EVAL", 4);
        p = put_bulk(p, script, scriptlen);
        p = put_bulk(p, nkeys, nkeyslen);
    }
    for (int i = 0; i < q->argc; i++)
        p = put_bulk(p, q->argv[i], q->lens[i]);
    return (size_t)(p - P.cmd);
}

/* Hand q to hiredis on l; 0, or -1 with q still owned by the caller. */
static int link_send(struct pool_link *l, struct pool_req *q)
{
    bool by_sha = q->script >= 0 && !q->retried && P.sha[q->script][0];

    if (!l->ac)
        return -1;
    size_t len = resp_format(q, by_sha);
    if (redisAsyncFormattedCommand(l->ac, link_on_reply, q, P.cmd,
                                   len) != REDIS_OK)
        return -1;
    q->sent_ns = uv_hrtime();
    l->last_send = timer_now();
    q->deadline = timer_now() + P.conf->redis.command_timeout_ms;
    if (l->state == LINK_CONNECTING && q->deadline < l->connect_deadline)
        q->deadline = l->connect_deadline;
    if (list_empty(&l->queue)) {
        l->last_progress = timer_now();
        l->graced = false;
    }
    q->link = l;
    list_push_tail(&l->queue, &q->queue);
    l->nqueue++;
    link_arm(l);
    l->node->st.requests++;
    P.inflight++;
    return 0;
}

static void pool_node_note_latency(struct pool_node *n, uint64_t sent_ns)
{
    double ms = (double)(uv_hrtime() - sent_ns) / 1e6;
    n->st.latency_ms = n->st.latency_ms == 0 ? ms : n->st.latency_ms * 0.9 + ms * 0.1;
    if (ms > n->st.latency_max_ms)
        n->st.latency_max_ms = ms;
    stats_observe_node_request(n->idx, ms / 1000);
}

static void link_on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct pool_req *q = privdata;
    struct pool_link *l = q->link;
    struct pool_node *n = l->node;
    redisReply *r = reply;

    list_remove(&q->queue);
    l->nqueue--;
    P.inflight--;
    if (!r) {
        /* The connection failed (or we are dropping it): fail the node once,
         * unless this context was already detached by pool_node_fail. */
        if (l->ac == ac)
            pool_node_fail(n, ac->errstr[0] ? ac->errstr : "connection lost");
    } else {
        l->last_progress = timer_now();
        l->graced = false;
        n->st.last_answer_ms = timer_now();
        link_arm(l);
        pool_node_note_latency(n, q->sent_ns);
        if (r->type == REDIS_REPLY_ERROR) {
            if (q->script >= 0 && !q->retried &&
                strncmp(r->str, "NOSCRIPT", 8) == 0 && l->ac == ac) {
                /* A restarted or flushed node lost its script cache. */
                log_info("redis %s: NOSCRIPT, falling back to EVAL",
                         n->addr->text);
                q->retried = true;
                if (link_send(l, q) == 0)
                    return;
            }
            n->st.errors++;
            snprintf(n->st.last_error, sizeof(n->st.last_error), "%s", r->str);
        }
    }
    q->cb(q->ud, n->idx, r);
    free(q);
}

/* ---- connection lifecycle ---------------------------------------------- */

static void link_drop(struct pool_link *l)
{
    redisAsyncContext *ac = l->ac;

    if (l->state == LINK_UP && !l->subscriber)
        l->node->nup--;
    l->state = LINK_DOWN;
    l->ac = NULL;
    l->probe_deadline = 0;
    timer_stop(&l->timer);
    timer_stop(&l->probe_timer);
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac);     /* runs pending callbacks with NULL */
    }
}

static void pool_node_reconnect_cb(struct timer *t)
{
    struct pool_node *n = t->data;

    if (P.stopping)
        return;
    n->failed = false;
    if (n->identified)
        n->st.reconnects++;
    for (unsigned i = 0; i < P.conf->redis.pool_size; i++)
        link_connect(&n->links[i]);
    link_connect(&n->sub);
}

static void pool_node_fail(struct pool_node *n, const char *why)
{
    if (n->failed)
        return;
    n->failed = true;
    snprintf(n->st.last_error, sizeof(n->st.last_error), "%s", why);
    if (P.hooks.on_down)
        P.hooks.on_down(n->idx, why);
    for (unsigned i = 0; i < P.conf->redis.pool_size; i++)
        link_drop(&n->links[i]);
    link_drop(&n->sub);
    if (P.stopping)
        return;
    timer_start(&n->reconnect_timer, n->backoff_ms);
    n->backoff_ms *= 2;
    if (n->backoff_ms > P.conf->redis.reconnect_max_ms)
        n->backoff_ms = P.conf->redis.reconnect_max_ms;
}

/*
 * Was the deadline missed because this loop was busy rather than because
 * the node was silent? libuv runs timers before polling, with a clock read
 * at the start of the iteration: after a long pass (closing 10000 sessions
 * at once, say) a deadline can expire before our requests were even
 * written, or before replies already in the socket were read. Then give
 * the node one more period, once per stall.
 */
static bool link_loop_was_late(struct pool_link *l)
{
    uint64_t now = uv_hrtime() / 1000000u;
    uint64_t period = P.conf->redis.command_timeout_ms;
    bool unsent = l->ac && l->ac->c.obuf && l->ac->c.obuf[0];

    if (l->graced || (!unsent && now < l->timer.due + period / 2))
        return false;
    l->graced = true;
    uv_update_time(P.loop);
    l->last_progress = timer_now();
    if (l->probe_deadline)
        l->probe_deadline = timer_now() + period;
    link_arm(l);
    return true;
}

static void link_timeout_cb(struct timer *t)
{
    struct pool_link *l = t->data;
    struct pool_node *n = l->node;

    if (link_loop_was_late(l))
        return;
    if (l->state == LINK_CONNECTING) {
        pool_node_fail(n, "connect timeout");
    } else if (l->subscriber) {
        n->st.timeouts++;
        pool_node_fail(n, "probe timeout (subscriber connection)");
    } else {
        n->st.timeouts++;
        pool_node_fail(n, "command timeout");
    }
}

static void link_ready(struct pool_link *l, const char *run_id)
{
    struct pool_node *n = l->node;

    l->state = LINK_UP;
    l->last_recv = timer_now();
    link_arm(l);
    timer_start(&l->probe_timer, P.conf->redis.probe_interval_ms);
    if (l->subscriber || n->nup++ > 0)
        return;
    n->backoff_ms = POOL_BACKOFF_MIN_MS;
    n->identified = run_id[0] != '\0';
    if (P.hooks.on_up)
        P.hooks.on_up(n->idx, run_id, l->fsync_always && l->aof_on);
}

/*
 * Handshake replies. `node` says whose reply it is; ud is NULL, or for
 * SCRIPT LOAD the SHA slot of the script it loaded, or for INFO (the last
 * step) the link. Any error fails the node.
 */
static bool hs_check(int node, redisReply *r, const char *what)
{
    struct pool_node *n = &P.nodes[node];

    if (!r)
        return false;   /* the node already failed */
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[POOL_HS_STEP_MAX + POOL_ERR_SIZE];
        snprintf(msg, sizeof(msg), "%s: %s", what, r->str);
        log_error("redis %s: %s", n->addr->text, msg);
        pool_node_fail(n, msg);
        return false;
    }
    return true;
}

static void hs_auth_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    hs_check(node, r, "AUTH");
}

static void hs_select_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    hs_check(node, r, "SELECT");
}

static void hs_script_cb(void *ud, int node, redisReply *r)
{
    char *sha = ud;     /* P.sha[] of the script this link loaded */

    if (!hs_check(node, r, "SCRIPT LOAD"))
        return;
    if (r->type != REDIS_REPLY_STRING || r->len != POOL_SHA_LEN)
        return;
    if (!sha[0]) {
        memcpy(sha, r->str, POOL_SHA_LEN);
        sha[POOL_SHA_LEN] = '\0';
    }
}

/* "CONFIG GET x" answers {x, value}: the value, or NULL when CONFIG is
 * renamed or forbidden. */
static const char *hs_config_value(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return NULL;
    return r->element[1]->str;
}

/* Both start false at every handshake: a node whose CONFIG is refused
 * makes no AOF promise, whatever its previous instance said. */
static void hs_config_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    const char *v = hs_config_value(r);
    (void)node;
    l->fsync_always = v && strcmp(v, "always") == 0;
}

static void hs_config_aof_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    const char *v = hs_config_value(r);
    (void)node;
    l->aof_on = v && strcmp(v, "yes") == 0;
}

static void hs_info_cb(void *ud, int node, redisReply *r)
{
    struct pool_link *l = ud;
    char run_id[POOL_RUN_ID_MAX + 1] = "";

    if (!hs_check(node, r, "INFO"))
        return;
    if (l->state != LINK_CONNECTING)
        return;
    if (r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "run_id:");
        if (p) {
            p += 7;
            size_t k = strcspn(p, "\r\n");
            if (k >= sizeof(run_id))
                k = sizeof(run_id) - 1;
            memcpy(run_id, p, k);
            run_id[k] = '\0';
        }
    }
    link_ready(l, run_id);
}

static int hs_send(struct pool_link *l, pool_reply_cb cb, void *ud, int argc,
                   const char **argv)
{
    size_t lens[POOL_MAX_ARGS];
    for (int i = 0; i < argc && i < POOL_MAX_ARGS; i++)
        lens[i] = strlen(argv[i]);
    struct pool_req *q = req_create(-1, 0, argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    if (link_send(l, q) != 0) {
        free(q);
        return -1;
    }
    return 0;
}

/* A release notification: "<key> <instance id>". Ours is dropped (our
 * own waiters hear of our releases directly); one without an id is a key
 * published by an older daemon. */
static void sub_on_release(const char *msg, size_t len)
{
    const size_t idlen = POOL_INSTANCE_ID_LEN;

    if (len > idlen + 1 && msg[len - idlen - 1] == ' ' &&
        strspn(msg + len - idlen, "0123456789abcdef") == idlen) {
        if (memcmp(msg + len - idlen, P.instance_id, idlen) == 0)
            return;
        len -= idlen + 1;
    }
    if (P.hooks.on_release)
        P.hooks.on_release(msg, len);
}

/* The subscriber heard its probe: it and its node are alive. */
static void sub_on_probe(struct pool_link *l, const redisReply *m)
{
    if (strtoull(m->str, NULL, 10) != l->probe_seq || !l->probe_deadline)
        return;
    l->probe_deadline = 0;
    l->graced = false;
    link_arm(l);
}

static void sub_on_message(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct pool_link *l = privdata;
    redisReply *r = reply;
    (void)ac;

    if (!r || l->ac != ac)
        return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return;
    l->last_recv = timer_now();
    l->node->st.last_answer_ms = l->last_recv;
    if (strcmp(r->element[0]->str, "subscribe") == 0) {
        if (l->state == LINK_CONNECTING)
            link_ready(l, "");
        return;
    }
    if (strcmp(r->element[0]->str, "message") != 0 ||
        r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(r->element[1]->str, P.probe_channel) == 0)
        sub_on_probe(l, r->element[2]);
    else
        sub_on_release(r->element[2]->str, r->element[2]->len);
}

static void link_handshake(struct pool_link *l)
{
    const struct conf *c = P.conf;
    int rc = 0;

    if (c->redis.password) {
        const char *argv[] = { "AUTH", c->redis.username, c->redis.password };
        if (c->redis.username)
            rc |= hs_send(l, hs_auth_cb, NULL, 3, argv);
        else {
            argv[1] = c->redis.password;
            rc |= hs_send(l, hs_auth_cb, NULL, 2, argv);
        }
    }
    if (l->subscriber) {
        const char *argv[] = { "SUBSCRIBE", c->locks.release_channel,
                               P.probe_channel };
        size_t lens[] = { 9, strlen(argv[1]), strlen(argv[2]) };
        l->probe_refused = false;
        if (rc == 0 && redisAsyncCommandArgv(l->ac, sub_on_message, l, 3,
                                             argv, lens) != REDIS_OK)
            rc = -1;
    } else {
        char db[POOL_NUM_SIZE];
        snprintf(db, sizeof(db), "%d", c->redis.db);
        const char *sel[] = { "SELECT", db };
        if (c->redis.db != 0)
            rc |= hs_send(l, hs_select_cb, NULL, 2, sel);
        for (int s = 0; s < POOL_SCRIPT_COUNT; s++) {
            const char *argv[] = { "SCRIPT", "LOAD", pool_lua[s] };
            rc |= hs_send(l, hs_script_cb, P.sha[s], 3, argv);
        }
        const char *cfg[] = { "CONFIG", "GET", "appendfsync" };
        const char *aof[] = { "CONFIG", "GET", "appendonly" };
        const char *info[] = { "INFO", "server" };
        l->fsync_always = l->aof_on = false;
        rc |= hs_send(l, hs_config_cb, l, 3, cfg);
        rc |= hs_send(l, hs_config_aof_cb, l, 3, aof);
        rc |= hs_send(l, hs_info_cb, l, 2, info);
    }
    if (rc != 0)
        pool_node_fail(l->node, "could not queue the handshake");
}

static void link_on_connect(const redisAsyncContext *ac, int status)
{
    struct pool_link *l = ac->data;

    if (!l || l->ac != ac)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback returns. */
        char why[POOL_ERR_SIZE];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        l->ac = NULL;
        ((redisAsyncContext *)ac)->data = NULL;
        pool_node_fail(l->node, why[0] ? why : "connect failed");
    }
}

static void link_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct pool_link *l = ac->data;
    (void)status;

    if (!l || l->ac != ac)
        return;
    char why[POOL_ERR_SIZE];
    snprintf(why, sizeof(why), "%s", ac->errstr[0] ? ac->errstr :
             "connection closed");
    l->ac = NULL;   /* hiredis frees it after this callback */
    pool_node_fail(l->node, why);
}

/* Kernel keepalive: idle POOL_KEEPALIVE_S, then 3 probes a third of that
 * apart. Set on the socket directly: hiredis's own helper would record a
 * failure as a context error. Best effort. */
static void link_keepalive(int fd)
{
    int on = 1, idle = POOL_KEEPALIVE_S, intvl = POOL_KEEPALIVE_S / 3, cnt = 3;

    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0)
        return;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

static void link_connect(struct pool_link *l)
{
    const struct conf_addr *a = l->node->addr;
    redisAsyncContext *ac;

    if (l->node->failed)
        return;
    if (a->kind == CONF_ADDR_UNIX)
        ac = redisAsyncConnectUnix(a->path);
    else
        ac = redisAsyncConnect(a->host, a->port);
    if (!ac) {
        pool_node_fail(l->node, "out of memory");
        return;
    }
    if (ac->err) {
        char why[POOL_ERR_SIZE];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        pool_node_fail(l->node, why);
        return;
    }
    /* A peer that vanished without a FIN is found by the probes; keepalive
     * also lets the kernel notice it. */
    if (a->kind == CONF_ADDR_TCP)
        link_keepalive(ac->c.fd);
    if (redis_uv_attach(ac, P.loop) != 0) {
        redisAsyncFree(ac);
        pool_node_fail(l->node, "cannot attach to the event loop");
        return;
    }
    ac->data = l;
    redisAsyncSetConnectCallback(ac, link_on_connect);
    redisAsyncSetDisconnectCallback(ac, link_on_disconnect);
    l->ac = ac;
    l->state = LINK_CONNECTING;
    l->connect_deadline = timer_now() + P.conf->redis.connect_timeout_ms;
    link_arm(l);
    link_handshake(l);
}

/* ---- probes ------------------------------------------------------------ */

static struct pool_link *pool_node_pick(struct pool_node *n);

static void probe_ping_cb(void *ud, int node, redisReply *r)
{
    (void)ud;
    (void)node;
    (void)r;    /* its deadline and the reply's arrival did the work */
}

static void probe_published_cb(void *ud, int node, redisReply *r)
{
    struct pool_node *n = &P.nodes[node];
    struct pool_link *sub = &n->sub;
    (void)ud;

    if (!r || sub->state != LINK_UP || !sub->probe_deadline)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        /* An ACL without this channel: the data links are still probed. */
        log_warn("redis %s: PUBLISH to %s refused (%s); its subscriber "
                 "connection is not probed", n->addr->text, P.probe_channel,
                 r->str);
        sub->probe_refused = true;
        sub->probe_deadline = 0;
        link_arm(sub);
    } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
        /* Nobody is subscribed there although our link says it is. */
        pool_node_fail(n, "subscriber connection lost its subscription");
    }
}

/* PING a data link; the request's deadline fails a node that froze. */
static void link_probe_data(struct pool_link *l)
{
    const char *argv[] = { "PING" };
    size_t lens[] = { 4 };
    struct pool_req *q = req_create(-1, 0, 1, argv, lens);

    if (!q)
        return;
    q->cb = probe_ping_cb;
    if (link_send(l, q) != 0)
        free(q);
}

/* Send the subscriber a message on its own channel through a data link;
 * it must arrive within command_timeout_ms. */
static void link_probe_sub(struct pool_link *l)
{
    struct pool_node *n = l->node;
    struct pool_link *via = pool_node_pick(n);
    char seq[POOL_NUM_SIZE];

    if (!via)
        return;
    snprintf(seq, sizeof(seq), "%" PRIu64, ++n->probe_seq);
    const char *argv[] = { "PUBLISH", P.probe_channel, seq };
    size_t lens[] = { 7, strlen(P.probe_channel), strlen(seq) };
    struct pool_req *q = req_create(-1, 0, 3, argv, lens);
    if (!q)
        return;
    q->cb = probe_published_cb;
    if (link_send(via, q) != 0) {
        free(q);
        return;
    }
    l->probe_seq = n->probe_seq;
    l->probe_deadline = timer_now() + P.conf->redis.command_timeout_ms;
    link_arm(l);
}

/* Runs probe_interval_ms after a link's last request (data) or last
 * message (subscriber): probe it if that is still the latest. */
static void link_probe_cb(struct timer *t)
{
    struct pool_link *l = t->data;
    uint64_t every = P.conf->redis.probe_interval_ms;
    uint64_t now = timer_now();
    uint64_t last;

    if (P.stopping || l->state != LINK_UP || l->node->failed)
        return;
    if (l->subscriber) {
        if (!l->probe_deadline && !l->probe_refused &&
            now >= l->last_recv + every)
            link_probe_sub(l);
        last = l->probe_deadline ? now : l->last_recv;
    } else {
        if (now >= l->last_send + every)
            link_probe_data(l);
        last = l->last_send;
    }
    if (l->state != LINK_UP)
        return;     /* the probe failed the node */
    timer_start_at(&l->probe_timer, last + every > now ? last + every
                                                       : now + every);
}

/* ---- public ------------------------------------------------------------ */

static void link_init(struct pool_link *l, struct pool_node *n, bool sub)
{
    l->node = n;
    l->subscriber = sub;
    l->state = LINK_DOWN;
    list_init(&l->queue);
    timer_init(&l->timer, link_timeout_cb, l);
    timer_init(&l->probe_timer, link_probe_cb, l);
}

/* 64 random bits as hex; the clock and pid if the OS has no randomness
 * to give (the id only has to differ between daemons). */
static void pool_draw_instance_id(void)
{
    uint64_t v = 0;
    ssize_t k;

    do {
        k = getrandom(&v, sizeof(v), 0);
    } while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof(v))
        v = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
    snprintf(P.instance_id, sizeof(P.instance_id), "%016" PRIx64, v);
}

int pool_init(uv_loop_t *loop, const struct conf *conf,
              const struct pool_hooks *hooks)
{
    P.loop = loop;
    P.conf = conf;
    P.hooks = *hooks;
    P.nnodes = (int)conf->redis.nnodes;
    pool_draw_instance_id();
    size_t chlen = strlen(conf->locks.release_channel) +
                   strlen(POOL_PROBE_SUFFIX) + POOL_INSTANCE_ID_LEN + 1;
    P.probe_channel = mem_alloc(chlen);
    snprintf(P.probe_channel, chlen, "%s%s%s", conf->locks.release_channel,
             POOL_PROBE_SUFFIX, P.instance_id);
    P.nodes = mem_alloc(sizeof(struct pool_node) * (size_t)P.nnodes);
    for (int i = 0; i < P.nnodes; i++) {
        struct pool_node *n = &P.nodes[i];
        n->idx = i;
        n->addr = &conf->redis.nodes[i];
        n->backoff_ms = POOL_BACKOFF_MIN_MS;
        n->links = mem_alloc(sizeof(struct pool_link) * conf->redis.pool_size);
        for (unsigned k = 0; k < conf->redis.pool_size; k++)
            link_init(&n->links[k], n, false);
        link_init(&n->sub, n, true);
        timer_init(&n->reconnect_timer, pool_node_reconnect_cb, n);
    }
    for (int i = 0; i < P.nnodes; i++)
        pool_node_reconnect_cb(&P.nodes[i].reconnect_timer);
    return 0;
}

void pool_shutdown(void)
{
    if (!P.nodes || P.stopping)
        return;
    P.stopping = true;
    for (int i = 0; i < P.nnodes; i++) {
        struct pool_node *n = &P.nodes[i];
        n->failed = true;
        for (unsigned k = 0; k < P.conf->redis.pool_size; k++)
            link_drop(&n->links[k]);
        link_drop(&n->sub);
    }
    /* Only now: dropping a link runs callbacks that may touch any node. */
    for (int i = 0; i < P.nnodes; i++)
        timer_stop(&P.nodes[i].reconnect_timer);
}

void pool_free(void)
{
    if (!P.nodes)
        return;
    for (int i = 0; i < P.nnodes; i++)
        free(P.nodes[i].links);
    free(P.nodes);
    P.nodes = NULL;
    free(P.probe_channel);
    P.probe_channel = NULL;
    free(P.cmd);
    P.cmd = NULL;
    P.cmdcap = 0;
}

bool pool_busy(void)
{
    return P.inflight > 0;
}

int pool_nnodes(void)
{
    return P.nnodes;
}

bool pool_node_up(int node)
{
    const struct pool_node *n = &P.nodes[node];
    return !n->failed && n->nup > 0;
}

const char *pool_node_name(int node)
{
    return P.nodes[node].addr->text;
}

const char *pool_instance_id(void)
{
    return P.instance_id;
}

/* The first link that is up and has fewer than POOL_LINK_FILL requests
 * out, else the up link with the fewest. Filling one link first rather
 * than taking turns lets hiredis write more requests per system call and
 * the node answer more per read; the others take the overflow, and the
 * traffic when the first is down. */
static struct pool_link *pool_node_pick(struct pool_node *n)
{
    unsigned size = P.conf->redis.pool_size;
    struct pool_link *best = NULL;

    for (unsigned i = 0; i < size; i++) {
        struct pool_link *l = &n->links[i];
        if (l->state != LINK_UP || !l->ac)
            continue;
        if (l->nqueue < POOL_LINK_FILL)
            return l;
        if (!best || l->nqueue < best->nqueue)
            best = l;
    }
    return best;
}

static int pool_node_send(int node, struct pool_req *q)
{
    struct pool_node *n = &P.nodes[node];
    struct pool_link *l = NULL;

    if (!P.stopping && pool_node_up(node))
        l = pool_node_pick(n);
    if (!l || link_send(l, q) != 0) {
        free(q);
        return -1;
    }
    return 0;
}

int pool_script(int node, enum pool_script s, int nkeys, int nargs,
                const char **argv, const size_t *lens,
                pool_reply_cb cb, void *ud)
{
    const char *words[POOL_MAX_ARGS];
    size_t wlens[POOL_MAX_ARGS];
    int argc = nkeys + nargs;

    /* The release script publishes who released, so that this daemon can
     * tell its own announcements from the others' (sub_on_release). */
    if (s == POOL_SCRIPT_RELEASE && argc < POOL_MAX_ARGS) {
        memcpy(words, argv, sizeof(*argv) * (size_t)argc);
        memcpy(wlens, lens, sizeof(*lens) * (size_t)argc);
        words[argc] = P.instance_id;
        wlens[argc++] = POOL_INSTANCE_ID_LEN;
        argv = words;
        lens = wlens;
    }
    struct pool_req *q = req_create((int)s, nkeys, argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return pool_node_send(node, q);
}

int pool_command(int node, int argc, const char **argv, const size_t *lens,
                 pool_reply_cb cb, void *ud)
{
    struct pool_req *q = req_create(-1, 0, argc, argv, lens);
    if (!q)
        return -1;
    q->cb = cb;
    q->ud = ud;
    return pool_node_send(node, q);
}

const struct pool_node_stats *pool_node_stats(int node)
{
    return &P.nodes[node].st;
}
