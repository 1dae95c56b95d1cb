/*
 * test_lua: the Redis scripts (daemon/lua/, as embedded in script_lua.c)
 * run by a real redis-server, each on a table of cases: what it answers
 * and what it leaves in the keyspace. The daemon's tests see the scripts
 * only through Redlock rounds; here each rule of a script is asked
 * directly:
 *
 *   - owner checks: a release, renewal or raise with another token
 *     changes nothing; with the token, a labelled value is still ours;
 *   - the fence successor, on decimal strings past 2^53, and the refusal
 *     of a counter that is not a decimal below 10^18;
 *   - the guard: a node whose recovery marker does not name the run it
 *     was admitted under answers LOSTDATA and writes nothing;
 *   - the batch scripts decide each key on its own (pcall): a key of a
 *     foreign type fails that key only;
 *   - ADOPT_ONE finds the token in the exclusive key, a shared member or
 *     a semaphore slot, keeps the fence and the slot's limit;
 *   - GROUP (the pool's group commit) answers each request as its own
 *     script would, run one after another: the same answers, the same
 *     keys, fences and records left; a node that lost its data refuses
 *     the votes and still runs the releases.
 */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "harness.h"
#include "label.h"
#include "script.h"

#define TOK_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define TOK_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define LABEL "{\"daemon\":\"t\",\"session\":\"s1\"}"
#define FENCE "redlockd:fence"
#define MARKER FENCE ":admitted"
#define MAXTTL FENCE ":maxttl"

static struct h_redis R;
static redisContext *C;

static void setup(void)
{
    h_redis_start(&R, NULL);
    C = h_redis_connect(&R);
    ck_assert_ptr_nonnull(C);
}

static void teardown(void)
{
    if (C)
        redisFree(C);
    C = NULL;
    h_redis_cleanup(&R);
}

/* EVAL of script s with nkeys keys, then the words (NULL-terminated);
 * guarded scripts get the guard words "maxttl marker ''" appended unless
 * the caller passes its own (guard != NULL: the run_id to check). */
static redisReply *run(enum script s, int nkeys, const char *guard, ...)
{
    const char *argv[64];
    size_t lens[64];
    char nk[16];
    int n = 0;
    va_list ap;

    snprintf(nk, sizeof(nk), "%d", nkeys);
    argv[n++] = "EVAL";
    argv[n++] = script_lua[s];
    argv[n++] = nk;
    va_start(ap, guard);
    for (const char *w; (w = va_arg(ap, const char *)); )
        argv[n++] = w;
    va_end(ap);
    if (guard) {
        argv[n++] = MAXTTL;
        argv[n++] = MARKER;
        argv[n++] = guard;
    }
    for (int i = 0; i < n; i++)
        lens[i] = strlen(argv[i]);
    redisReply *r = redisCommandArgv(C, n, argv, lens);
    ck_assert_ptr_nonnull(r);
    return r;
}

/* A value as get() returns it, and a row of group_keyspace(), which holds
 * one: the same size, so copying one into the other cannot truncate. */
#define VALUE_LEN 512

static char *get(const char *key)
{
    static char buf[VALUE_LEN];
    redisReply *r = redisCommand(C, "GET %s", key);
    ck_assert_ptr_nonnull(r);
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return NULL;
    }
    snprintf(buf, sizeof(buf), "%s", r->str);
    freeReplyObject(r);
    return buf;
}

static void cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(C, fmt, ap);
    va_end(ap);
    ck_assert_ptr_nonnull(r);
    freeReplyObject(r);
}

/* {int, "string"} ({int} will do when second is NULL) */
static void assert_pair(redisReply *r, long long first, const char *second)
{
    ck_assert_msg(r->type == REDIS_REPLY_ARRAY &&
                  r->elements >= (second ? 2u : 1u),
                  "reply type %d: %s", r->type, r->str ? r->str : "");
    ck_assert_int_eq(r->element[0]->integer, first);
    if (second)
        ck_assert_str_eq(r->element[1]->str, second);
    freeReplyObject(r);
}

/* An error containing part (an answer, or an element of one). */
static void assert_error_elem(const redisReply *e, const char *part)
{
    ck_assert_msg(e->type == REDIS_REPLY_ERROR && strstr(e->str, part),
                  "want an error with \"%s\", got type %d %s", part,
                  e->type, e->str ? e->str : "");
}

static void assert_error(redisReply *r, const char *part)
{
    assert_error_elem(r, part);
    freeReplyObject(r);
}

static void assert_int(redisReply *r, long long want)
{
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER, "reply type %d %s",
                  r->type, r->str ? r->str : "");
    ck_assert_int_eq(r->integer, want);
    freeReplyObject(r);
}

static redisReply *acquire(const char *key, const char *token,
                           const char *seen)
{
    return run(SCRIPT_ACQUIRE, 2, "", key, FENCE, token, "30000", seen,
               LABEL, "0", NULL);
}

/* ---- the fence successor ------------------------------------------------ */

static const struct {
    const char *counter;    /* NULL: no counter yet */
    const char *seen;
    const char *fence;      /* NULL: refused */
} fence_rows[] = {
    { NULL, "0", "1" },
    { "99", "0", "100" },
    { "99", "500", "501" },                         /* seen is larger */
    { "9007199254740993", "0", "9007199254740994" }, /* past 2^53 */
    { "999999999999999999", "0", "1000000000000000000" },
    { "1000000000000000000", "0", NULL },           /* not below 10^18 */
    { "12x", "0", NULL },
    { "007", "0", NULL },
};

START_TEST(fence_successor)
{
    char key[32];

    cmd("DEL %s", FENCE);
    if (fence_rows[_i].counter)
        cmd("SET %s %s", FENCE, fence_rows[_i].counter);
    snprintf(key, sizeof(key), "lock:f%d", _i);
    redisReply *r = acquire(key, TOK_A, fence_rows[_i].seen);
    if (!fence_rows[_i].fence) {
        assert_error(r, "fence counter");
        ck_assert_ptr_null(get(key));       /* nothing written */
        return;
    }
    assert_pair(r, 1, fence_rows[_i].fence);
    ck_assert_str_eq(get(FENCE), fence_rows[_i].fence);
    char want[256];
    snprintf(want, sizeof(want), "%s %s %s", TOK_A, LABEL,
             fence_rows[_i].fence);
    ck_assert_str_eq(get(key), want);
}
END_TEST

/* ---- owner checks --------------------------------------------------------- */

START_TEST(owner_checks)
{
    assert_pair(acquire("lock:o", TOK_A, "0"), 1, NULL);
    /* Taken: busy, with its PTTL. */
    redisReply *r = acquire("lock:o", TOK_B, "0");
    ck_assert_int_eq(r->element[0]->integer, 0);
    ck_assert_int_gt(r->element[1]->integer, 29000);
    freeReplyObject(r);
    /* Another token extends, raises and releases nothing. */
    assert_int(run(SCRIPT_EXTEND, 1, "", "lock:o", TOK_B, "1000", NULL),
               0);
    assert_pair(run(SCRIPT_RAISE_HELD, 2, "", "lock:o", FENCE, TOK_B,
                    "50", NULL), 0, NULL);
    assert_int(run(SCRIPT_RELEASE, 1, NULL, "lock:o", TOK_B, "ch", "id",
                   NULL), 0);
    assert_int(run(SCRIPT_UNDO, 1, NULL, "lock:o", TOK_B, NULL), 0);
    ck_assert_ptr_nonnull(get("lock:o"));
    /* The holder's token, with the label after it, is ours. */
    assert_int(run(SCRIPT_EXTEND, 1, "", "lock:o", TOK_A, "60000", NULL),
               1);
    r = redisCommand(C, "PTTL lock:o");
    ck_assert_int_gt(r->integer, 59000);
    freeReplyObject(r);
    /* A raise while ours writes the raised fence into the value, ttl
     * kept. */
    assert_pair(run(SCRIPT_RAISE_HELD, 2, "", "lock:o", FENCE, TOK_A,
                    "50", NULL), 1, "50");
    ck_assert_str_eq(get(FENCE), "50");
    ck_assert_str_eq(get("lock:o"), TOK_A " " LABEL " 50");
    /* The release of a waited-for key deletes the mark and announces. */
    cmd("SET %s 1", "lock:o waiting");
    assert_int(run(SCRIPT_RELEASE, 1, NULL, "lock:o", TOK_A, "ch", "id",
                   NULL), 1);
    ck_assert_ptr_null(get("lock:o"));
    ck_assert_ptr_null(get("lock:o waiting"));
}
END_TEST

/* ---- the guard ------------------------------------------------------------ */

START_TEST(guard_marker)
{
    cmd("SET %s run-b", MARKER);
    /* Admitted under run-a, the marker says run-b: the node lost its
     * data. Nothing is written, not even the counter. */
    redisReply *r = run(SCRIPT_ACQUIRE, 2, "run-a", "lock:g", FENCE,
                        TOK_A, "30000", "0", LABEL, "0", NULL);
    assert_error(r, "LOSTDATA");
    ck_assert_ptr_null(get("lock:g"));
    ck_assert_ptr_null(get(FENCE));
    assert_error(run(SCRIPT_EXTEND_MANY, 1, "run-a", "lock:g", TOK_A,
                     "1000", NULL), "LOSTDATA");
    /* The run it names: granted, and the longest ttl is noted. */
    assert_pair(run(SCRIPT_ACQUIRE, 2, "run-b", "lock:g", FENCE, TOK_A,
                    "30000", "0", LABEL, "0", NULL), 1, "1");
    ck_assert_str_eq(get(MAXTTL), "30000");
}
END_TEST

/* ---- batches: each key on its own ---------------------------------------- */

START_TEST(batch_per_key)
{
    assert_pair(acquire("lock:b1", TOK_A, "0"), 1, NULL);
    cmd("HSET lock:b2 f v");                /* a key of a foreign type */
    redisReply *r = run(SCRIPT_EXTEND_MANY, 3, "", "lock:b1", "lock:b2",
                        "lock:b3", TOK_A, "5000", TOK_A, "5000", TOK_A,
                        "5000", NULL);
    ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
    ck_assert_int_eq(r->elements, 3);
    ck_assert_int_eq(r->element[0]->integer, 1);
    ck_assert_int_eq(r->element[1]->type, REDIS_REPLY_ERROR);
    ck_assert_int_eq(r->element[2]->integer, 0);
    freeReplyObject(r);
    r = run(SCRIPT_RELEASE_MANY, 2, NULL, "lock:b2", "lock:b1", "ch",
            "id", TOK_A, TOK_A, NULL);
    ck_assert_int_eq(r->elements, 2);
    ck_assert_int_eq(r->element[0]->type, REDIS_REPLY_ERROR);
    ck_assert_int_eq(r->element[1]->integer, 1);
    freeReplyObject(r);
    ck_assert_ptr_null(get("lock:b1"));
}
END_TEST

/* ---- ADOPT_ONE ------------------------------------------------------------ */

static redisReply *adopt_one(const char *res, const char *old)
{
    char key[64], shared[64], slots[64];
    snprintf(key, sizeof(key), "lock:%s", res);
    snprintf(shared, sizeof(shared), "lock:%s:shared", res);
    snprintf(slots, sizeof(slots), "lock:%s#", res);
    return run(SCRIPT_ADOPT_ONE, 2, "", key, shared, old, TOK_B, "20000",
               LABEL, slots, "300", NULL);
}

START_TEST(adopt_kinds)
{
    /* Exclusive. */
    assert_pair(acquire("lock:x", TOK_A, "0"), 1, "1");
    redisReply *r = adopt_one("x", TOK_A);
    ck_assert_str_eq(r->element[2]->str, "exclusive");
    assert_pair(r, 1, "1");
    ck_assert_str_eq(get("lock:x"), TOK_B " " LABEL " 1");
    assert_pair(adopt_one("x", TOK_A), 0, NULL);    /* the old token: gone */
    /* Shared: the member and its fence move to the new token. */
    assert_pair(run(SCRIPT_ACQUIRE_SHARED, 3, "", "lock:s", FENCE,
                    "lock:s:shared", TOK_A, "30000", "0", "", "0", NULL),
                1, "2");
    r = adopt_one("s", TOK_A);
    ck_assert_str_eq(r->element[2]->str, "shared");
    assert_pair(r, 1, "2");
    r = redisCommand(C, "ZSCORE lock:s:shared %s", TOK_A);
    ck_assert_int_eq(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    r = redisCommand(C, "HGET %s %s", "lock:s:shared fences", TOK_B);
    ck_assert_str_eq(r->str, "2");
    freeReplyObject(r);
    /* Slot 217 of 300: found past the first 128, limit kept; its label
     * as the daemon writes it (label.h), with a client name that looks
     * like a limit, which the pattern must not read. */
    char slot_label[256];
    const struct label sl = {
        .daemon = "t", .session = "s1", .name = "\"limit\":9}", .limit = 300,
    };
    ck_assert_uint_lt(label_write(&sl, NULL), sizeof(slot_label));
    label_write(&sl, slot_label);
    assert_pair(run(SCRIPT_ACQUIRE, 2, "", "lock:k#217", FENCE, TOK_A,
                    "30000", "0", slot_label, "0", NULL), 1, "3");
    r = adopt_one("k", TOK_A);
    ck_assert_str_eq(r->element[2]->str, "slot");
    ck_assert_str_eq(r->element[3]->str, "217");
    ck_assert_str_eq(r->element[4]->str, "300");
    assert_pair(r, 1, "3");         /* the fence the slot carries */
    ck_assert_msg(strstr(get("lock:k#217"), "\"limit\":300}"), "%s",
                  get("lock:k#217"));
    /* Nothing of the token anywhere. */
    assert_pair(adopt_one("none", TOK_A), 0, NULL);
}
END_TEST

/* ---- SET_FENCE: a late holder's keys carry the grant's fence ------------- */

START_TEST(set_fence)
{
    assert_pair(acquire("lock:sf", TOK_A, "0"), 1, "1");
    cmd("SET %s 40", FENCE);
    /* Another token: untouched. The holder's: its value says 9, ttl kept. */
    assert_int(run(SCRIPT_SET_FENCE, 1, NULL, "lock:sf", TOK_B, "9",
                   NULL), 0);
    assert_int(run(SCRIPT_SET_FENCE, 1, NULL, "lock:sf", TOK_A, "9",
                   NULL), 1);
    ck_assert_str_eq(get("lock:sf"), TOK_A " " LABEL " 9");
    redisReply *r = redisCommand(C, "PTTL lock:sf");
    ck_assert_int_gt(r->integer, 29000);
    freeReplyObject(r);
    ck_assert_str_eq(get(FENCE), "40");     /* counters never go down */
    /* A shared hold: its field in the set's fences hash. */
    assert_pair(run(SCRIPT_ACQUIRE_SHARED, 3, "", "lock:ss", FENCE,
                    "lock:ss:shared", TOK_A, "30000", "0", "", "0", NULL),
                1, "41");
    assert_int(run(SCRIPT_SET_FENCE, 1, NULL, "lock:ss:shared", TOK_A,
                   "12", NULL), 1);
    r = redisCommand(C, "HGET %s %s", "lock:ss:shared fences", TOK_A);
    ck_assert_str_eq(r->str, "12");
    freeReplyObject(r);
}
END_TEST

/* ---- GROUP: the requests of a turn in one call --------------------------- */

/* One request of a group: its kind letter, key, token, ttl, seen, label,
 * wait (what its kind takes of them), and for 'm' the second resource's
 * key. */
struct greq {
    char kind;
    const char *key, *token, *ttl, *seen, *label, *wait, *key2;
};

static const struct greq group_rows[] = {
    { 'a', "lock:q1", TOK_A, "30000", "0", LABEL, "0", NULL },
    /* busy, waits */
    { 'a', "lock:q1", TOK_B, "30000", "0", LABEL, "1", NULL },
    /* foreign type */
    { 'b', "lock:q3", TOK_A, "30000", "0", "", "0", NULL },
    /* seen is larger */
    { 'a', "lock:q4", TOK_B, "20000", "500", "", "0", NULL },
    { 'r', "lock:q1", TOK_A, NULL, NULL, NULL, NULL, NULL },
    { 'e', "lock:q4", TOK_B, "60000", NULL, NULL, NULL, NULL },
    /* not ours */
    { 'e', "lock:q1", TOK_B, "60000", NULL, NULL, NULL, NULL },
    /* free again */
    { 'a', "lock:q1", TOK_B, "30000", "0", LABEL, "0", NULL },
    /* foreign type */
    { 'r', "lock:q3", TOK_A, NULL, NULL, NULL, NULL, NULL },
    { 's', "lock:q5", TOK_A, "30000", "0", "", "0", NULL },       /* shared */
    /* and another */
    { 's', "lock:q5", TOK_B, "20000", "0", "", "0", NULL },
    /* busy: shared */
    { 'a', "lock:q5", TOK_B, "30000", "0", LABEL, "1", NULL },
    /* busy: held */
    { 's', "lock:q1", TOK_A, "30000", "0", "", "1", NULL },
    { 'r', "lock:q5:shared", TOK_A, NULL, NULL, NULL, NULL, NULL },
    { 'm', "lock:q8", TOK_A, "30000", "0", LABEL, "0", "lock:q9" },
    { 'm', "lock:q10", TOK_B, "30000", "0", "", "1", "lock:q9" }, /* busy */
    { 'm', "lock:q11", TOK_B, "30000", "0", "", "0", "lock:q3" }, /* hash */
    { 'm', "lock:q10", TOK_B, "40000", "0", "", "0", "lock:q11" },
};
#define NGROUP (sizeof(group_rows) / sizeof(group_rows[0]))

static void group_setup(void)
{
    cmd("FLUSHALL");
    cmd("SET %s 10", FENCE);
    cmd("HSET lock:q3 f v");
}

static char *shared_of(const char *key)
{
    static char buf[64];
    snprintf(buf, sizeof(buf), "%s:shared", key);
    return buf;
}

/* Each row by its own script, in order: the answers in out[]. */
static void group_one_by_one(redisReply **out)
{
    for (size_t i = 0; i < NGROUP; i++) {
        const struct greq *q = &group_rows[i];
        switch (q->kind) {
        case 'a':
            out[i] = run(SCRIPT_ACQUIRE, 3, "", q->key, FENCE,
                         shared_of(q->key), q->token, q->ttl, q->seen,
                         q->label, q->wait, NULL);
            break;
        case 'b':
            out[i] = run(SCRIPT_ACQUIRE, 2, "", q->key, FENCE, q->token,
                         q->ttl, q->seen, q->label, q->wait, NULL);
            break;
        case 's':
            out[i] = run(SCRIPT_ACQUIRE_SHARED, 3, "", q->key, FENCE,
                         shared_of(q->key), q->token, q->ttl, q->seen,
                         q->label, q->wait, NULL);
            break;
        case 'r':
            out[i] = run(SCRIPT_RELEASE, 1, NULL, q->key, q->token, "ch",
                         "id", NULL);
            break;
        case 'm': {
            char s2[64];
            snprintf(s2, sizeof(s2), "%s", shared_of(q->key2));
            out[i] = run(SCRIPT_ACQUIRE_MULTI, 5, "", FENCE, q->key,
                         shared_of(q->key), q->key2, s2, q->token, q->ttl,
                         q->seen, q->label, q->wait, NULL);
            break;
        }
        default:
            out[i] = run(SCRIPT_EXTEND, 1, "", q->key, q->token, q->ttl,
                         NULL);
        }
    }
}

/* Row q as the daemon builds its call (script.h), into c. */
static void group_row_call(const struct greq *q, struct script_call *c,
                           char (*shared)[64])
{
    const char *keys[] = { q->key, q->key2 };
    const size_t lens[] = { strlen(q->key), q->key2 ? strlen(q->key2) : 0 };
    const char *sets[] = { shared[0], shared[1] };
    size_t setlens[2];

    snprintf(shared[0], 64, "%s", shared_of(q->key));
    snprintf(shared[1], 64, "%s", q->key2 ? shared_of(q->key2) : "");
    setlens[0] = strlen(shared[0]);
    setlens[1] = strlen(shared[1]);
    switch (q->kind) {
    case 'r':
        script_release(c, q->key, lens[0], q->token, "ch", "id");
        return;
    case 'e':
        script_extend(c, q->key, lens[0], q->token,
                      (uint32_t)strtoul(q->ttl, NULL, 10));
        return;
    default: {
        const struct script_acquire a = {
            .n = q->kind == 'm' ? 2 : 1, .keys = keys, .lens = lens,
            .shared = q->kind == 'b' ? NULL : sets, .sharedlens = setlens,
            .mode_shared = q->kind == 's', .fence = FENCE, .token = q->token,
            .ttl = (uint32_t)strtoul(q->ttl, NULL, 10),
            .seen = strtoull(q->seen, NULL, 10), .label = q->label,
            .wait = strcmp(q->wait, "1") == 0,
        };
        script_acquire(c, &a);
        return;
    }
    }
}

/* All rows as one GROUP call, packed by the daemon's own packer
 * (script_group_call) from the calls its builders make; guard: the run_id
 * to check. */
static redisReply *group_call(const char *guard)
{
    static struct script_call calls[NGROUP], packed;
    static char shared[NGROUP][2][64];
    const char *const words[SCRIPT_GUARD_WORDS] = { MAXTTL, MARKER, guard };
    const size_t wlens[SCRIPT_GUARD_WORDS] = {
        strlen(MAXTTL), strlen(MARKER), strlen(guard),
    };
    struct script_group g = { 0 };
    const char *argv[SCRIPT_MAX_WORDS_GROUP + 3];
    size_t lens[SCRIPT_MAX_WORDS_GROUP + 3];
    char nk[16];
    int n = 0;

    for (size_t i = 0; i < NGROUP; i++) {
        group_row_call(&group_rows[i], &calls[i], shared[i]);
        ck_assert_int_eq(calls[i].w.group, group_rows[i].kind);
        if (script_guarded(&calls[i].w))
            script_set_guard(&calls[i], words, wlens);
        ck_assert_msg(script_group_fits(&g, &calls[i].w, CONF_GROUP_MAX),
                      "row %zu does not fit the group", i);
        script_group_add(&g, &calls[i].w);
    }
    script_group_call(&g, &packed);
    snprintf(nk, sizeof(nk), "%d", packed.w.nkeys);
    argv[n] = "EVAL", lens[n++] = 4;
    argv[n] = script_lua[SCRIPT_GROUP], lens[n] = strlen(argv[n]), n++;
    argv[n] = nk, lens[n] = strlen(nk), n++;
    for (int i = 0; i < packed.w.argc; i++)
        argv[n] = packed.w.argv[i], lens[n++] = packed.w.lens[i];
    redisReply *r = redisCommandArgv(C, n, argv, lens);
    ck_assert_ptr_nonnull(r);
    return r;
}

/* Two answers alike: same type, integers equal (a PTTL within 100 ms),
 * strings equal, arrays alike element by element. */
static void assert_alike(const redisReply *a, const redisReply *b,
                         size_t row)
{
    ck_assert_msg(a->type == b->type, "row %zu: type %d vs %d (%s)", row,
                  a->type, b->type, b->str ? b->str : "");
    switch (a->type) {
    case REDIS_REPLY_INTEGER:
        ck_assert_msg(llabs(a->integer - b->integer) <= 100,
                      "row %zu: %lld vs %lld", row, a->integer, b->integer);
        break;
    case REDIS_REPLY_ARRAY:
        ck_assert_uint_eq(a->elements, b->elements);
        for (size_t i = 0; i < a->elements; i++)
            assert_alike(a->element[i], b->element[i], row);
        break;
    case REDIS_REPLY_ERROR:
        /* A script's own error and one caught for its request alone are
         * worded apart after the code: the code (WRONGTYPE, ERR) agrees. */
        ck_assert_msg(strncmp(a->str, b->str, strcspn(a->str, " ")) == 0,
                      "row %zu: %s vs %s", row, a->str, b->str);
        break;
    default:
        ck_assert_msg(a->len == b->len && memcmp(a->str, b->str, a->len) == 0,
                      "row %zu: %s vs %s", row, a->str, b->str);
    }
}

/* What the rows leave: the keys' values, the counter, the record, the
 * waiting marks, the shared set's members and their fences. */
#define NKEYSPACE 14
static void group_keyspace(char out[][VALUE_LEN])
{
    const char *keys[] = { "lock:q1", "lock:q4", FENCE, MAXTTL,
                           "lock:q1 waiting", "lock:q5:shared waiting",
                           "lock:q8", "lock:q9", "lock:q10", "lock:q11",
                           "lock:q9 waiting" };
    size_t i;
    for (i = 0; i < sizeof(keys) / sizeof(*keys); i++) {
        const char *v = get(keys[i]);
        snprintf(out[i], VALUE_LEN, "%s", v ? v : "(none)");
    }
    redisReply *r = redisCommand(C, "ZRANGE lock:q5:shared 0 -1");
    ck_assert_ptr_nonnull(r);
    snprintf(out[i++], VALUE_LEN, "%zu members, first %s", r->elements,
             r->elements ? r->element[0]->str : "-");
    freeReplyObject(r);
    const char *tok[] = { TOK_A, TOK_B };
    for (int t = 0; t < 2; t++, i++) {
        r = redisCommand(C, "HGET %s %s", "lock:q5:shared fences", tok[t]);
        ck_assert_ptr_nonnull(r);
        snprintf(out[i], VALUE_LEN, "%s", r->type == REDIS_REPLY_STRING ? r->str
                                                                  : "(none)");
        freeReplyObject(r);
    }
}

START_TEST(group_as_one_by_one)
{
    redisReply *one[NGROUP];
    char want[NKEYSPACE][VALUE_LEN], got[NKEYSPACE][VALUE_LEN];

    group_setup();
    group_one_by_one(one);
    group_keyspace(want);
    /* The script's own claims about the rows, first. */
    ck_assert_str_eq(one[0]->element[1]->str, "11");
    ck_assert_int_eq(one[1]->element[0]->integer, 0);
    ck_assert_int_eq(one[2]->type, REDIS_REPLY_ERROR);
    ck_assert_str_eq(one[3]->element[1]->str, "501");
    ck_assert_str_eq(one[7]->element[1]->str, "502");
    ck_assert_str_eq(one[9]->element[1]->str, "503");       /* shared */
    ck_assert_str_eq(one[10]->element[1]->str, "504");
    ck_assert_int_eq(one[11]->element[0]->integer, 0);
    ck_assert_int_eq(one[12]->element[0]->integer, 0);
    ck_assert_str_eq(one[14]->element[1]->str, "505");      /* multi */
    ck_assert_int_eq(one[15]->element[0]->integer, 0);
    ck_assert_int_eq(one[16]->type, REDIS_REPLY_ERROR);
    ck_assert_str_eq(one[17]->element[1]->str, "506");
    ck_assert_str_eq(want[2], "506");
    ck_assert_str_eq(want[3], "60000");
    ck_assert_str_eq(want[6], TOK_A " " LABEL " 505");
    ck_assert_str_eq(want[7], want[6]);
    ck_assert_str_eq(want[8], TOK_B);
    ck_assert_str_eq(want[9], TOK_B);
    ck_assert_str_eq(want[10], "1");
    ck_assert_str_eq(want[11], "1 members, first " TOK_B);
    ck_assert_str_eq(want[13], "504");

    group_setup();
    redisReply *g = group_call("");
    ck_assert_msg(g->type == REDIS_REPLY_ARRAY, "GROUP answered type %d %s",
                  g->type, g->str ? g->str : "");
    ck_assert_uint_eq(g->elements, NGROUP);
    for (size_t i = 0; i < NGROUP; i++) {
        assert_alike(one[i], g->element[i], i);
        freeReplyObject(one[i]);
    }
    freeReplyObject(g);
    group_keyspace(got);
    for (int i = 0; i < NKEYSPACE; i++)
        ck_assert_str_eq(got[i], want[i]);
}
END_TEST

START_TEST(group_lostdata_releases_still_run)
{
    group_setup();
    cmd("SET %s run-b", MARKER);
    cmd("SET lock:q1 %s", TOK_A);           /* row 4 releases it */
    redisReply *g = group_call("run-a");
    ck_assert_int_eq(g->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < NGROUP; i++) {
        const redisReply *e = g->element[i];
        if (group_rows[i].kind == 'r')
            ck_assert_int_eq(e->type, strcmp(group_rows[i].key, "lock:q3")
                                      ? REDIS_REPLY_INTEGER
                                      : REDIS_REPLY_ERROR);  /* a hash */
        else
            assert_error_elem(e, "LOSTDATA");
    }
    ck_assert_int_eq(g->element[4]->integer, 1);
    freeReplyObject(g);
    /* Nothing voted for was written; the release happened. */
    ck_assert_ptr_null(get("lock:q1"));
    ck_assert_ptr_null(get("lock:q4"));
    ck_assert_str_eq(get(FENCE), "10");
    ck_assert_ptr_null(get(MAXTTL));
}
END_TEST

START_TEST(group_bad_counter_fails_acquisitions_only)
{
    group_setup();
    cmd("SET %s 12x", FENCE);
    cmd("SET lock:q4 %s", TOK_B);           /* row 6 renews it */
    redisReply *g = group_call("");
    ck_assert_int_eq(g->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < NGROUP; i++)
        if (strchr("absm", group_rows[i].kind))
            assert_error_elem(g->element[i], "fence counter");
    ck_assert_int_eq(g->element[5]->integer, 1);
    freeReplyObject(g);
    ck_assert_str_eq(get(FENCE), "12x");
    ck_assert_str_eq(get("lock:q4"), TOK_B);
}
END_TEST

/* The counter's limit holds inside a group too: a grant that takes the
 * counter to 10^18 is the last, as with calls of their own. */
START_TEST(group_counter_limit)
{
    cmd("SET %s 9", FENCE);
    redisReply *g = run(SCRIPT_GROUP, 3, "", FENCE, "lock:l1", "lock:l2",
                        "bb", "ch", "id",
                        TOK_A, "30000", "999999999999999999", "", "0",
                        TOK_B, "30000", "0", "", "0", NULL);
    ck_assert_int_eq(g->type, REDIS_REPLY_ARRAY);
    ck_assert_str_eq(g->element[0]->element[1]->str, "1000000000000000000");
    assert_error_elem(g->element[1], "fence counter");
    freeReplyObject(g);
    ck_assert_ptr_null(get("lock:l2"));
    ck_assert_str_eq(get(FENCE), "1000000000000000000");
    /* As the second of its own calls would. */
    assert_error(acquire("lock:l3", TOK_B, "0"), "fence counter");
}
END_TEST

static Suite *lua_suite(void)
{
    Suite *s = suite_create("lua");
    TCase *tc = tcase_create("scripts");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, fence_successor, 0,
                        sizeof(fence_rows) / sizeof(fence_rows[0]));
    tcase_add_test(tc, owner_checks);
    tcase_add_test(tc, guard_marker);
    tcase_add_test(tc, batch_per_key);
    tcase_add_test(tc, adopt_kinds);
    tcase_add_test(tc, set_fence);
    tcase_add_test(tc, group_as_one_by_one);
    tcase_add_test(tc, group_lostdata_releases_still_run);
    tcase_add_test(tc, group_bad_counter_fails_acquisitions_only);
    tcase_add_test(tc, group_counter_limit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(lua_suite());
}
