/*
 * Unit tests for daemon/lockmgr.c: the lock table, FIFO wait queues,
 * renewal scheduling, EXTEND, LOST, lock-delay and the end of an owner,
 * with the races between them.
 *
 * No sockets and no Redis: lockmgr runs against a fake redlock (every
 * operation is recorded and answered by the test, in any order, with any
 * result) and the timer's manual clock. The build links only lockmgr and
 * the leaves below it, which is itself the test that lockmgr is a leaf.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "hmap.h"
#include "lockmgr_priv.h"
#include "status.h"
#include "wording.h"
#include "log.h"
#include "timer.h"

/* ---- the fake redlock --------------------------------------------------- */

enum fop { F_ACQUIRE, F_RELEASE, F_EXTEND, F_INSPECT, F_FORCE, F_ADOPT };

struct fcall {
    enum fop op;
    char key[256];          /* the (first) key */
    char token[REDLOCK_TOKEN_LEN + 1];
    uint32_t ttl;
    /* acquire: */
    enum redlock_mode mode;
    int nkeys;
    char keys[512];         /* every key, space-separated */
    bool with_shared;       /* the shared sets were given */
    char shared[256];       /* the first shared set */
    char label[256];        /* the holder label */
    /* inspect / force: */
    uint32_t limit;
    redlock_cb cb;
    redlock_inspect_cb icb;
    void *ud;
    bool done;
};

#define MAX_CALLS 256
static struct fcall calls[MAX_CALLS];
static int ncalls;
static unsigned token_seq;
static bool token_fails;

static struct fcall *record(enum fop op, const char *key, size_t keylen,
                            const char *token, uint32_t ttl)
{
    ck_assert_int_lt(ncalls, MAX_CALLS);
    struct fcall *c = &calls[ncalls++];
    memset(c, 0, sizeof(*c));
    c->op = op;
    snprintf(c->key, sizeof(c->key), "%.*s", (int)keylen, key);
    if (token)
        snprintf(c->token, sizeof(c->token), "%s", token);
    c->ttl = ttl;
    return c;
}

static void f_acquire(const struct redlock_lock *lk, const char *token,
                      uint32_t ttl, redlock_cb cb, void *ud)
{
    struct fcall *c = record(F_ACQUIRE, lk->keys[0], lk->lens[0], token, ttl);
    size_t at = 0;

    c->mode = lk->mode;
    c->nkeys = lk->n;
    for (int i = 0; i < lk->n; i++)
        at += (size_t)snprintf(c->keys + at, sizeof(c->keys) - at, "%s%.*s",
                               i ? " " : "", (int)lk->lens[i], lk->keys[i]);
    c->with_shared = lk->shared != NULL;
    ck_assert_uint_eq(strlen(lk->label), lk->labellen);
    snprintf(c->label, sizeof(c->label), "%s", lk->label);
    if (lk->shared)
        snprintf(c->shared, sizeof(c->shared), "%.*s",
                 (int)lk->shared_lens[0], lk->shared[0]);
    c->cb = cb;
    c->ud = ud;
}

static void f_release(const char *key, size_t keylen, const char *token,
                      redlock_cb cb, void *ud)
{
    struct fcall *c = record(F_RELEASE, key, keylen, token, 0);
    c->cb = cb;
    c->ud = ud;
}

static void f_extend(const char *key, size_t keylen, const char *token,
                     uint32_t ttl, redlock_cb cb, void *ud)
{
    struct fcall *c = record(F_EXTEND, key, keylen, token, ttl);
    c->cb = cb;
    c->ud = ud;
}

static void f_inspect(const struct redlock_probe *p, redlock_inspect_cb cb,
                      void *ud)
{
    struct fcall *c = record(F_INSPECT, p->key, p->keylen, NULL, 0);
    snprintf(c->shared, sizeof(c->shared), "%.*s", (int)p->sharedlen,
             p->shared);
    snprintf(c->keys, sizeof(c->keys), "%.*s", (int)p->slotslen, p->slots);
    c->limit = p->limit;
    c->icb = cb;
    c->ud = ud;
}

static int f_token(char out[REDLOCK_TOKEN_LEN + 1])
{
    if (token_fails)
        return -1;
    snprintf(out, REDLOCK_TOKEN_LEN + 1, "%032x", ++token_seq);
    return 0;
}

static void f_force(const struct redlock_probe *p, redlock_cb cb, void *ud)
{
    struct fcall *c = record(F_FORCE, p->key, p->keylen, NULL, 0);
    c->limit = p->limit;
    c->cb = cb;
    c->ud = ud;
}

/* token: the old one; keys: every key; label: the new token. One
 * resource: its key, shared set and slot prefix, and limit the slots
 * looked at. */
static void f_adopt(const struct redlock_adopt *a, redlock_cb cb, void *ud)
{
    const struct redlock_probe *p = a->one;
    struct fcall *c = p ? record(F_ADOPT, p->key, p->keylen, a->old_token,
                                 a->ttl)
                        : record(F_ADOPT, a->keys[0], a->lens[0],
                                 a->old_token, a->ttl);
    size_t at = 0;

    if (p) {
        c->nkeys = 1;
        snprintf(c->keys, sizeof(c->keys), "%.*s", (int)p->slotslen,
                 p->slots);
        snprintf(c->shared, sizeof(c->shared), "%.*s", (int)p->sharedlen,
                 p->shared);
        c->limit = p->limit;
    }
    c->nkeys = p ? 1 : a->n;
    for (int i = 0; i < a->n; i++)
        at += (size_t)snprintf(c->keys + at, sizeof(c->keys) - at, "%s%.*s",
                               i ? " " : "", (int)a->lens[i], a->keys[i]);
    snprintf(c->label, sizeof(c->label), "%s", a->token);
    c->cb = cb;
    c->ud = ud;
}

static int f_nnodes(void) { return 3; }
static int f_quorum(void) { return 2; }

static const struct redlock_ops fake_ops = {
    .acquire = f_acquire, .release = f_release, .extend = f_extend,
    .extend_batched = f_extend, .release_batched = f_release,
    .inspect = f_inspect, .force_release = f_force, .adopt = f_adopt,
    .token = f_token,
    .nnodes = f_nnodes,
    .quorum = f_quorum,
};

/* The index of the only unanswered call of kind op on key, asserted. */
static int pending(enum fop op, const char *key)
{
    int found = -1;
    for (int i = 0; i < ncalls; i++) {
        if (calls[i].done || calls[i].op != op || strcmp(calls[i].key, key))
            continue;
        ck_assert_msg(found < 0, "two open calls of kind %d on %s", op, key);
        found = i;
    }
    ck_assert_msg(found >= 0, "no open call of kind %d on %s", op, key);
    return found;
}

static int count_open(enum fop op, const char *key)
{
    int n = 0;
    for (int i = 0; i < ncalls; i++)
        n += !calls[i].done && calls[i].op == op && !strcmp(calls[i].key, key);
    return n;
}

static void answer(int i, const struct redlock_result *res)
{
    ck_assert(!calls[i].done);
    calls[i].done = true;
    if (calls[i].cb)
        calls[i].cb(calls[i].ud, res);
}

static void answer_ok(int i, uint64_t fence, int64_t validity)
{
    struct redlock_result r = { .status = REDLOCK_OK, .ok = 3,
                                .fence = fence, .validity = validity,
                                .deleted = 3 };
    answer(i, &r);
}

/* An ADOPT of one resource that found the token in a shared set
 * (limit 0) or in slot `slot` of a semaphore of `limit` (0: not stored). */
static void answer_adopted(int i, uint64_t fence, enum redlock_held held,
                           uint32_t slot, uint32_t limit)
{
    struct redlock_result r = { .status = REDLOCK_OK, .ok = 3,
                                .fence = fence, .validity = 9000,
                                .deleted = 3, .adopted = held,
                                .adopted_slot = slot,
                                .adopted_limit = limit };
    answer(i, &r);
}

static void answer_busy(int i, int64_t pttl)
{
    struct redlock_result r = { .status = REDLOCK_BUSY, .busy = 3,
                                .pttl = pttl };
    answer(i, &r);
}

/* As redlock reports it: for an EXTEND-type call, the validity its ttl
 * would have given (what the nodes that did answer now hold). */
static void answer_unavailable(int i)
{
    struct redlock_result r = { .status = REDLOCK_UNAVAILABLE, .ok = 1,
                                .failed = 2, .pttl = -1,
                                .validity = (int64_t)calls[i].ttl - 100 };
    answer(i, &r);
}

static void answer_lost(int i)
{
    struct redlock_result r = { .status = REDLOCK_LOST, .busy = 3 };
    answer(i, &r);
}

static void answer_released(int i, int deleted, int busy)
{
    struct redlock_result r = { .status = REDLOCK_OK, .deleted = deleted,
                                .busy = busy };
    answer(i, &r);
}

/* ---- a fake owner -------------------------------------------------------- */

struct fowner {
    struct lockmgr_owner o;
    char id[16];
    char name[16];
    int refs;
    int nlocked, nfailed, nunlocked, nextended, nlost, nstatus;
    enum proto_err err;
    enum lockmgr_no no;         /* the last refusal's reason */
    uint64_t fence;
    int64_t validity;
    uint32_t ttl;
    int nodes;
    size_t nres;
    enum lockmgr_mode mode;
    uint32_t limit, slot;
    char token[REDLOCK_TOKEN_LEN + 1];
    enum lockmgr_lost_reason why;
    json_t *status;
    /* Called from inside the ->locked callback, to test re-entry. */
    void (*on_locked)(struct fowner *f);
};

static struct fowner *fo(struct lockmgr_owner *o)
{
    return container_of(o, struct fowner, o);
}

static void o_ref(struct lockmgr_owner *o) { fo(o)->refs++; }
static void o_unref(struct lockmgr_owner *o)
{
    ck_assert_int_gt(fo(o)->refs, 0);
    fo(o)->refs--;
}

/* The owner's first LOCK waiting (its lockreq), or NULL. */
static void *first_wait(const struct lockmgr_owner *o)
{
    struct list *p = list_first(&o->waits);
    return p ? list_entry(p, struct lockreq, olink) : NULL;
}

/* The code a client reads for a refusal (wording.h), so that the tests
 * say what the protocol says. */
static enum proto_err code_of(enum proto_cmd cmd,
                              const struct lockmgr_refusal *no)
{
    char msg[512];
    return no ? wording_refusal(cmd, no, msg, sizeof(msg)) : PROTO_ERR_NONE;
}

static void o_locked(struct lockmgr_owner *o, void *ask,
                     const struct lockmgr_grant *g,
                     const struct lockmgr_refusal *no)
{
    struct fowner *f = fo(o);
    (void)ask;
    if (g) {
        f->nlocked++;
        f->fence = g->fence;
        f->validity = g->validity;
        f->ttl = g->ttl;
        f->err = PROTO_ERR_NONE;
        f->nres = g->nresources;
        f->mode = g->mode;
        f->limit = g->limit;
        f->slot = g->slot;
        snprintf(f->token, sizeof(f->token), "%s", g->token);
        ck_assert_int_eq(strlen(g->token), REDLOCK_TOKEN_LEN);
    } else {
        f->nfailed++;
        f->err = code_of(PROTO_CMD_LOCK, no);
        f->no = no->why;
    }
    if (f->on_locked)
        f->on_locked(f);
}

static void o_unlocked(struct lockmgr_owner *o, void *ask,
                       const char *resource, size_t nres, int nodes,
                       const struct lockmgr_refusal *no)
{
    (void)ask;
    (void)resource;
    fo(o)->nunlocked++;
    fo(o)->nres = nres;
    fo(o)->nodes = nodes;
    fo(o)->err = code_of(PROTO_CMD_UNLOCK, no);
}

static void o_extended(struct lockmgr_owner *o, void *ask,
                       const char *resource, uint32_t ttl, int64_t validity,
                       const struct lockmgr_refusal *no)
{
    (void)ask;
    (void)resource;
    fo(o)->nextended++;
    fo(o)->ttl = ttl;
    fo(o)->validity = validity;
    fo(o)->err = code_of(PROTO_CMD_EXTEND, no);
}

static void o_lost(struct lockmgr_owner *o, const char *resource,
                   uint64_t fence, enum lockmgr_lost_reason why)
{
    (void)resource;
    fo(o)->nlost++;
    fo(o)->fence = fence;
    fo(o)->why = why;
}

static void o_status(struct lockmgr_owner *o, void *ask,
                     const struct lockmgr_status *st)
{
    (void)ask;
    fo(o)->nstatus++;
    json_decref(fo(o)->status);
    fo(o)->status = status_json(st);
}

static const struct lockmgr_owner_ops owner_ops = {
    .ref = o_ref, .unref = o_unref, .locked = o_locked,
    .unlocked = o_unlocked, .extended = o_extended, .lost = o_lost,
    .status = o_status,
};

static struct fowner A, B, C, D;
static struct conf conf;

static void owner_setup(struct fowner *f, const char *id)
{
    json_decref(f->status);
    memset(f, 0, sizeof(*f));
    snprintf(f->id, sizeof(f->id), "%s", id);
    lockmgr_owner_init(&f->o, &owner_ops, f->id, f->name, "test");
}

static void setup(void)
{
    log_init(LOG_LEVEL_ERROR);
    timer_sys_init_manual(1000000);
    conf_init(&conf);
    ncalls = 0;
    token_seq = 0;
    token_fails = false;
    lockmgr_init(&conf, &fake_ops);
    owner_setup(&A, "s1");
    owner_setup(&B, "s2");
    owner_setup(&C, "s3");
    owner_setup(&D, "s4");
}

static void teardown(void)
{
    lockmgr_deinit();
    conf_deinit(&conf);
    timer_sys_deinit();
    json_decref(A.status);
    json_decref(B.status);
    json_decref(C.status);
    json_decref(D.status);
    A.status = B.status = C.status = D.status = NULL;
}

#define R(s) (s), strlen(s)

static struct lease *held(struct fowner *f, const char *res)
{
    return lockmgr_held(&f->o, R(res));
}

/* f holds res with the given ttl (renewing), fence, asserted. */
static void take(struct fowner *f, const char *res, uint32_t ttl,
                 uint64_t fence)
{
    int before = f->nlocked;
    lockmgr_lock(&f->o, R(res), ttl, 0, true, NULL);
    char key[256];
    snprintf(key, sizeof(key), "lock:%s", res);
    answer_ok(pending(F_ACQUIRE, key), fence, ttl - 100);
    ck_assert_int_eq(f->nlocked, before + 1);
    ck_assert_ptr_nonnull(held(f, res));
}

/* Let f's owner end and every release it started complete. */
static void end_and_release(struct fowner *f, const char *key)
{
    lockmgr_owner_end(&f->o, false);
    while (count_open(F_RELEASE, key))
        answer_released(pending(F_RELEASE, key), 3, 0);
}

/* ---- sessions that outlive their connection, ADOPT, shutdown ----------- */

/* The connection that asked went away, the owner lives on (a session
 * detached, or taken over by a new connection): what it asked is
 * withdrawn or not answered, what it holds stays its own. */
START_TEST(test_owner_cancel_withdraws_requests)
{
    take(&A, "r", 3000, 4);
    take(&A, "e", 30000, 5);
    take(&A, "u", 30000, 6);
    lockmgr_lock(&A.o, R("w"), 30000, 5000, true, NULL);
    int acq = pending(F_ACQUIRE, "lock:w");
    lockmgr_extend(&A.o, held(&A, "e"), 20000, NULL);
    lockmgr_unlock(&A.o, held(&A, "u"), NULL);
    struct lockmgr_adopt_req ar = {
        .n = 1, .res = (const char *[]){ "q" }, .len = (size_t[]){ 1 },
        .token = "0123456789abcdef0123456789abcdef", .ttl = 20000,
        .renew = true,
    };
    lockmgr_adopt(&A.o, &ar, NULL);
    int adopt = pending(F_ADOPT, "lock:q");
    lockmgr_owner_cancel(&A.o);
    ck_assert_uint_eq(A.o.nwaits, 0);
    /* A LOCK's grant that arrives now is given back, unheard; an
     * ADOPT's is the owner's lease (the token was its lease: nothing the
     * round rotated is ever deleted), unheard too. */
    answer_ok(acq, 7, 29000);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:w"), 1);
    answer_ok(adopt, 3, 19000);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:q"), 0);
    ck_assert_ptr_nonnull(held(&A, "q"));
    ck_assert_int_eq(A.nlocked, 3);
    /* The other operations complete, unanswered. */
    answer_ok(pending(F_EXTEND, "lock:e"), 0, 19900);
    answer_released(pending(F_RELEASE, "lock:u"), 3, 0);
    ck_assert_int_eq(A.nextended + A.nunlocked + A.nfailed, 0);
    ck_assert_ptr_null(held(&A, "u"));
    ck_assert_uint_eq(A.o.nleases, 3);
    /* The leases renew as before, a loss is told, and a new request is
     * answered. */
    timer_advance(1000);
    answer_lost(pending(F_EXTEND, "lock:r"));
    ck_assert_int_eq(A.nlost, 1);
    lockmgr_unlock(&A.o, held(&A, "e"), NULL);
    answer_released(pending(F_RELEASE, "lock:e"), 3, 0);
    ck_assert_int_eq(A.nunlocked, 1);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_owner_abandon_leaves_keys)
{
    uint64_t until = 0;

    take(&A, "r", 3000, 4);
    take(&B, "q", 30000, 5);
    lockmgr_lock(&C.o, R("r"), 3000, 10000, true, NULL);      /* waits here */
    ck_assert_uint_eq(lockmgr_owner_abandon(&A.o, &until), 1);
    ck_assert_uint_eq(A.o.nleases, 0);
    ck_assert_uint_eq(lockmgr_held_count(), 1);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);   /* not deleted */
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    ck_assert(until >= timer_now() + 2900 - 100);
    timer_advance(2000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);    /* nor renewed */
    /* The waiter asks the nodes, which still have the key until its ttl. */
    ck_assert_int_ge(count_open(F_ACQUIRE, "lock:r"), 1);
    lockmgr_owner_end(&A.o, false);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_adopt)
{
    take(&A, "r", 30000, 9);
    char old[REDLOCK_TOKEN_LEN + 1];
    snprintf(old, sizeof(old), "%s", A.token);

    /* B adopts A's lease by its token (as a client moving here would). */
    struct lockmgr_adopt_req ar = {
        .n = 1, .res = (const char *[]){ "r" }, .len = (size_t[]){ 1 },
        .token = old, .ttl = 20000, .renew = true,
    };
    lockmgr_adopt(&B.o, &ar, NULL);
    ck_assert_int_eq(B.nlocked, 0);
    int i = pending(F_ADOPT, "lock:r");
    ck_assert_str_eq(calls[i].token, old);
    ck_assert_str_ne(calls[i].label, old);   /* a new token */
    ck_assert_int_eq(calls[i].ttl, 20000);
    answer_ok(i, 9, 19900);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(B.fence, 9);
    ck_assert_str_eq(B.token, calls[i].label);
    ck_assert_ptr_nonnull(held(&B, "r"));
    /* A's lease had the old token: A hears it is gone, and what it sends
     * to the nodes is owner-checked with the old token. */
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_ptr_null(held(&A, "r"));
    answer_released(pending(F_RELEASE, "lock:r"), 0, 3);
    ck_assert_uint_eq(lockmgr_counters()->adopts, 1);

    /* Errors: held here already, too few nodes, no quorum. */
    lockmgr_adopt(&B.o, &ar, NULL);
    ck_assert_int_eq(B.err, PROTO_ERR_HELD);
    ar.res = (const char *[]){ "q" };
    lockmgr_adopt(&C.o, &ar, NULL);
    answer_busy(pending(F_ADOPT, "lock:q"), 100);
    ck_assert_int_eq(C.err, PROTO_ERR_LOST);
    lockmgr_adopt(&C.o, &ar, NULL);
    answer_unavailable(pending(F_ADOPT, "lock:q"));
    ck_assert_int_eq(C.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_ptr_null(held(&C, "q"));
    /* The owner ends during the round: what was rotated is left to
     * expire, never deleted. */
    lockmgr_adopt(&D.o, &ar, NULL);
    i = pending(F_ADOPT, "lock:q");
    lockmgr_owner_end(&D.o, false);
    answer_ok(i, 3, 19000);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:q"), 0);
    ck_assert_int_eq(D.nlocked, 0);
    ck_assert_uint_eq(lockmgr_counters()->adopts_left, 1);
    ck_assert_int_eq(C.refs + D.refs, 0);
}
END_TEST

START_TEST(test_adopt_multi)
{
    lockmgr_adopt(&A.o, &(struct lockmgr_adopt_req){
        .n = 2, .res = (const char *[]){ "a", "b" },
        .len = (size_t[]){ 1, 1 },
        .token = "0123456789abcdef0123456789abcdef", .ttl = 5000,
        .renew = true }, NULL);
    int i = pending(F_ADOPT, "lock:a");
    ck_assert_str_eq(calls[i].keys, "lock:a lock:b");
    answer_ok(i, 4, 4900);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_uint_eq(A.nres, 2);
    ck_assert_ptr_nonnull(held(&A, "a"));
    ck_assert_ptr_nonnull(held(&A, "b"));
    /* A later LOCK of either waits behind A, as for a grant. */
    lockmgr_lock(&B.o, R("b"), 5000, 0, true, NULL);
    ck_assert_int_eq(B.err, PROTO_ERR_BUSY);
}
END_TEST

/* ---- the lock table ------------------------------------------------------ */

START_TEST(test_lock_uncontended)
{
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(A.nlocked, 0);         /* never answered inline */
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_int_eq(calls[i].ttl, 30000);
    ck_assert_ptr_eq(first_wait(&A.o), calls[i].ud);
    answer_ok(i, 17, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_int_eq(A.fence, 17);
    ck_assert_int_eq(A.validity, 29000);
    ck_assert_uint_eq(A.o.nwaits, 0);
    ck_assert_uint_eq(A.o.nleases, 1);
    ck_assert_uint_eq(lockmgr_held_count(), 1);
    ck_assert_ptr_nonnull(held(&A, "r"));
    ck_assert_ptr_null(held(&B, "r"));
    ck_assert_int_eq(A.refs, 0);            /* no reference left behind */
    ck_assert_uint_eq(lockmgr_counters()->acquire_ok, 1);

    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    ck_assert_uint_eq(A.o.nleases, 0);
    ck_assert_int_eq(A.nunlocked, 0);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    ck_assert_int_eq(A.nunlocked, 1);
    ck_assert_int_eq(A.nodes, 3);
    ck_assert_int_eq(A.err, PROTO_ERR_NONE);
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    ck_assert_int_eq(A.refs, 0);
    ck_assert_uint_eq(timer_count(), 0);    /* the lease's timer is gone */
}
END_TEST

START_TEST(test_busy_and_unavailable)
{
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:r"), 500);
    ck_assert_int_eq(A.nfailed, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_BUSY);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);

    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    answer_unavailable(pending(F_ACQUIRE, "lock:r"));
    ck_assert_int_eq(A.nfailed, 2);
    ck_assert_int_eq(A.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_int_eq(A.refs, 0);
    ck_assert_uint_eq(lockmgr_counters()->acquire_busy, 1);
    ck_assert_uint_eq(lockmgr_counters()->acquire_unavailable, 1);
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

START_TEST(test_unlock_lost_when_no_node_had_it)
{
    take(&A, "r", 30000, 1);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    answer_released(pending(F_RELEASE, "lock:r"), 0, 3);
    ck_assert_int_eq(A.nunlocked, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_LOST);
}
END_TEST

START_TEST(test_fifo_queue)
{
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_lock(&C.o, R("r"), 30000, 5000, true, NULL);
    /* Held here: nobody asks Redis while the holder lives. */
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 2);

    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    /* Not before the holder's keys are gone. */
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    /* The head, and only the head, tries. */
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&B.o));
    answer_ok(i, 2, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(C.nlocked, 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 1);

    lockmgr_unlock(&B.o, held(&B, "r"), NULL);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    i = pending(F_ACQUIRE, "lock:r");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&C.o));
    answer_ok(i, 3, 29000);
    ck_assert_int_eq(C.nlocked, 1);
    ck_assert_int_eq(C.fence, 3);
    ck_assert_uint_eq(lockmgr_counters()->wakeups_notified, 2);
}
END_TEST

START_TEST(test_wait_zero_behind_holder_is_busy)
{
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(B.nfailed, 1);
    ck_assert_int_eq(B.err, PROTO_ERR_BUSY);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
}
END_TEST

START_TEST(test_wait_zero_during_release_waits_for_it)
{
    take(&A, "r", 30000, 1);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(B.nfailed, 0);         /* no stale BUSY */
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    answer_ok(pending(F_ACQUIRE, "lock:r"), 2, 29000);
    ck_assert_int_eq(B.nlocked, 1);
}
END_TEST

START_TEST(test_wait_times_out)
{
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 1000, true, NULL);
    timer_advance(999);
    ck_assert_int_eq(B.nfailed, 0);
    timer_advance(1);
    ck_assert_int_eq(B.nfailed, 1);
    ck_assert_int_eq(B.err, PROTO_ERR_TIMEOUT);
    ck_assert_int_eq(B.refs, 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
}
END_TEST

START_TEST(test_wait_retries_after_busy_elsewhere)
{
    /* Held by another daemon: the head sleeps until the key's PTTL (or a
     * jittered retry), then asks again. */
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:r"), 200);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    timer_advance(200);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    timer_advance(5);       /* PTTL + 1, plus up to 4 ms of jitter */
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    ck_assert_uint_eq(lockmgr_counters()->wakeups_retry, 1);
    answer_ok(pending(F_ACQUIRE, "lock:r"), 9, 29000);
    ck_assert_int_eq(A.nlocked, 1);
}
END_TEST

START_TEST(test_release_notification_wakes_sleeper)
{
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:r"), 20000);
    lockmgr_on_release(R("lock:other"));
    timer_advance(10);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    /* Every node announces the same release: one wake-up, within the
     * jitter, not one per copy. */
    lockmgr_on_release(R("lock:r"));
    lockmgr_on_release(R("lock:r"));
    lockmgr_on_release(R("lock:r"));
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    timer_advance(4);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    ck_assert_uint_eq(lockmgr_counters()->wakeups_notified, 1);
}
END_TEST

START_TEST(test_notification_during_attempt_retries_at_once)
{
    /* Race: the head is talking to Redis when the holder elsewhere
     * releases. Its BUSY answer is stale: it asks again without sleeping. */
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    int i = pending(F_ACQUIRE, "lock:r");
    lockmgr_on_release(R("lock:r"));
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);   /* not twice */
    answer_busy(i, 20000);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);   /* at once */
    answer_ok(pending(F_ACQUIRE, "lock:r"), 4, 29000);
    ck_assert_int_eq(A.nlocked, 1);
}
END_TEST

START_TEST(test_woken_waiter_while_head_attempts)
{
    /* Race: a local release kicks the queue while the head's attempt is
     * in flight: no second attempt, and the head's answer decides. */
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    int i = pending(F_ACQUIRE, "lock:r");
    lockmgr_on_release(R("lock:r"));
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    answer_ok(i, 5, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_int_eq(B.nlocked + B.nfailed, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
}
END_TEST

START_TEST(test_lock_held_back_until_ready)
{
    /* At start-up no node is checked yet: a LOCK then would fail
     * UNAVAILABLE at once. It is held until lockmgr_ready(), in order. */
    lockmgr_starting();
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);     /* behind A */
    lockmgr_lock(&C.o, R("q"), 30000, 500, true, NULL);   /* waits less */
    lockmgr_lock(&D.o, R("p"), 30000, 0, true, NULL);     /* goes away */
    ck_assert_int_eq(ncalls, 0);
    ck_assert_int_eq(A.nfailed + B.nfailed + C.nfailed + D.nfailed, 0);
    lockmgr_owner_end(&D.o, true);
    ck_assert_int_eq(D.refs, 0);

    /* A wait that runs out first: no quorum voted in time. */
    timer_advance(500);
    ck_assert_int_eq(C.nfailed, 1);
    ck_assert_int_eq(C.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_int_eq(ncalls, 0);

    lockmgr_ready();
    lockmgr_ready();                                /* harmless twice */
    ck_assert_int_eq(ncalls, 1);                    /* A's, nobody else's */
    ck_assert_int_eq(B.nfailed, 0);                 /* A asks first */
    answer_ok(pending(F_ACQUIRE, "lock:r"), 1, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_int_eq(B.nfailed, 1);                 /* then A holds it */
    ck_assert_int_eq(B.err, PROTO_ERR_BUSY);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:p"), 0);

    /* Ready: straight to Redis. */
    lockmgr_lock(&C.o, R("q"), 30000, 0, true, NULL);
    answer_ok(pending(F_ACQUIRE, "lock:q"), 1, 29000);
    ck_assert_int_eq(C.nlocked, 1);
    ck_assert_int_eq(A.refs + B.refs + C.refs, 0);
}
END_TEST

START_TEST(test_adopt_held_back_until_ready)
{
    /* As a LOCK: at start-up an ADOPT would only find nodes not yet
     * voting (UNAVAILABLE); it waits for lockmgr_ready(). */
    struct lockmgr_adopt_req ar = {
        .n = 1, .res = (const char *[]){ "r" }, .len = (size_t[]){ 1 },
        .token = "0123456789abcdef0123456789abcdef", .ttl = 10000,
        .renew = true,
    };
    lockmgr_starting();
    lockmgr_adopt(&A.o, &ar, NULL);
    ar.res = (const char *[]){ "q" };
    lockmgr_adopt(&B.o, &ar, NULL);                       /* goes away */
    ar.res = (const char *[]){ "p" };
    lockmgr_adopt(&C.o, &ar, NULL);                       /* shut down */
    ck_assert_int_eq(ncalls, 0);
    lockmgr_owner_end(&B.o, true);
    ck_assert_int_eq(B.refs, 0);
    lockmgr_owner_shutdown(&C.o);
    ck_assert_int_eq(C.err, PROTO_ERR_SHUTDOWN);
    ck_assert_int_eq(C.refs, 0);
    ck_assert_int_eq(A.nlocked + A.nfailed, 0);
    lockmgr_ready();
    ck_assert_int_eq(ncalls, 1);
    answer_ok(pending(F_ADOPT, "lock:r"), 5, 9000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_uint_eq(A.fence, 5);
}
END_TEST

/* A LOCK without wait= behind another session's acquisition still under
 * way: nobody holds the resource yet, so it waits for that outcome. The
 * other fails UNAVAILABLE: it asks itself (and hears the nodes' answer,
 * not "held by someone else"); the other is granted: BUSY at once. */
START_TEST(test_nowait_behind_asking)
{
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(B.nfailed, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    answer_unavailable(pending(F_ACQUIRE, "lock:r"));
    ck_assert_int_eq(A.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_int_eq(B.nfailed, 0);
    answer_unavailable(pending(F_ACQUIRE, "lock:r"));   /* B's own */
    ck_assert_int_eq(B.nfailed, 1);
    ck_assert_int_eq(B.err, PROTO_ERR_UNAVAILABLE);

    lockmgr_lock(&C.o, R("q"), 30000, 0, true, NULL);
    lockmgr_lock(&D.o, R("q"), 30000, 0, true, NULL);
    answer_ok(pending(F_ACQUIRE, "lock:q"), 2, 29000);
    ck_assert_int_eq(C.nlocked, 1);
    ck_assert_int_eq(D.nfailed, 1);
    ck_assert_int_eq(D.err, PROTO_ERR_BUSY);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:q"), 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
}
END_TEST

START_TEST(test_held_back_lock_cut_or_shut_down)
{
    lockmgr_starting();
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_lock(&B.o, R("q"), 30000, 5000, true, NULL);
    lockmgr_cut_wait(&A.o);
    ck_assert_int_eq(A.nfailed, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_TIMEOUT);
    lockmgr_owner_shutdown(&B.o);
    ck_assert_int_eq(B.nfailed, 1);
    ck_assert_int_eq(B.err, PROTO_ERR_SHUTDOWN);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
    ck_assert_int_eq(A.refs + B.refs, 0);
    lockmgr_ready();
    ck_assert_int_eq(ncalls, 0);
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

START_TEST(test_cut_wait)
{
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_cut_wait(&B.o);
    ck_assert_int_eq(B.nfailed, 1);
    ck_assert_int_eq(B.err, PROTO_ERR_TIMEOUT);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
}
END_TEST

START_TEST(test_cut_wait_during_attempt)
{
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    int i = pending(F_ACQUIRE, "lock:r");
    lockmgr_cut_wait(&A.o);
    ck_assert_int_eq(A.nfailed, 0);         /* answers after that try */
    answer_busy(i, 20000);
    ck_assert_int_eq(A.nfailed, 1);
    /* The client gave up waiting: that is a TIMEOUT, as when it sleeps. */
    ck_assert_int_eq(A.err, PROTO_ERR_TIMEOUT);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);   /* no sleep */
}
END_TEST

START_TEST(test_no_random_source)
{
    token_fails = true;
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(A.nfailed, 0);         /* from the timer, not inline */
    timer_advance(0);
    ck_assert_int_eq(A.nfailed, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_int_eq(ncalls, 0);
}
END_TEST

/* ---- leases: renewal, expiry, EXTEND, LOST -------------------------------- */

START_TEST(test_renewal_schedule)
{
    take(&A, "r", 3000, 1);
    timer_advance(999);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    timer_advance(1);                       /* every ttl/3 */
    int i = pending(F_EXTEND, "lock:r");
    ck_assert_int_eq(calls[i].ttl, 3000);
    answer_ok(i, 0, 2900);
    timer_advance(999);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    timer_advance(1);
    answer_ok(pending(F_EXTEND, "lock:r"), 0, 2900);
    ck_assert_int_eq(A.nlost, 0);
    ck_assert_uint_eq(lockmgr_counters()->renewals, 2);
}
END_TEST

START_TEST(test_renewal_lost_on_nodes)
{
    take(&A, "r", 3000, 1);
    timer_advance(1000);
    answer_lost(pending(F_EXTEND, "lock:r"));
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_NODE);
    ck_assert_ptr_null(held(&A, "r"));
}
END_TEST

START_TEST(test_renewal_retries_then_lost)
{
    take(&A, "r", 3000, 1);                 /* validity 2900 */
    timer_advance(1000);
    answer_unavailable(pending(F_EXTEND, "lock:r"));
    ck_assert_int_eq(A.nlost, 0);
    /* Retried every ttl/10 (300 ms) while validity lasts. */
    timer_advance(299);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    timer_advance(1);
    answer_unavailable(pending(F_EXTEND, "lock:r"));
    for (int k = 0; k < 20 && A.nlost == 0; k++) {
        timer_advance(300);
        if (count_open(F_EXTEND, "lock:r"))
            answer_unavailable(pending(F_EXTEND, "lock:r"));
    }
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_QUORUM);
    ck_assert_uint_ge(lockmgr_counters()->renewal_failures, 2);
}
END_TEST

START_TEST(test_extend)
{
    take(&A, "r", 3000, 1);
    lockmgr_extend(&A.o, held(&A, "r"), 9000, NULL);
    int i = pending(F_EXTEND, "lock:r");
    ck_assert_int_eq(calls[i].ttl, 9000);
    answer_ok(i, 0, 8800);
    ck_assert_int_eq(A.nextended, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_NONE);
    ck_assert_int_eq(A.ttl, 9000);
    ck_assert_int_eq(A.validity, 8800);
    /* The new ttl is the renewal lease now: next renewal at 9000/3. */
    timer_advance(2999);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    timer_advance(1);
    ck_assert_int_eq(calls[pending(F_EXTEND, "lock:r")].ttl, 9000);
}
END_TEST

START_TEST(test_extend_lost_and_unavailable)
{
    take(&A, "r", 3000, 1);
    lockmgr_extend(&A.o, held(&A, "r"), 9000, NULL);
    answer_unavailable(pending(F_EXTEND, "lock:r"));
    ck_assert_int_eq(A.nextended, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_UNAVAILABLE);
    ck_assert_ptr_nonnull(held(&A, "r"));

    lockmgr_extend(&A.o, held(&A, "r"), 9000, NULL);
    answer_lost(pending(F_EXTEND, "lock:r"));
    ck_assert_int_eq(A.nextended, 2);
    ck_assert_int_eq(A.err, PROTO_ERR_LOST);
    ck_assert_ptr_null(held(&A, "r"));
}
END_TEST

START_TEST(test_extend_while_renewal_in_flight)
{
    /* Race: EXTEND arrives while a renewal with the old ttl is out. They
     * never run at once: the EXTEND goes out when the renewal is answered,
     * and the renewal's longer validity cannot overwrite the EXTEND's. */
    take(&A, "r", 3000, 1);
    timer_advance(1000);
    int renewal = pending(F_EXTEND, "lock:r");
    lockmgr_extend(&A.o, held(&A, "r"), 1000, NULL);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 1);
    answer_ok(renewal, 0, 2900);
    int ext = pending(F_EXTEND, "lock:r");
    ck_assert_int_eq(calls[ext].ttl, 1000);
    answer_ok(ext, 0, 900);
    ck_assert_int_eq(A.nextended, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_NONE);
    ck_assert_int_eq(A.validity, 900);
    json_t *arr = status_leases_json(&A.o, true);
    json_int_t v = json_integer_value(json_object_get(json_array_get(arr, 0),
                                                      "validity"));
    json_decref(arr);
    ck_assert_int_le(v, 900);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_renewal_waits_for_extend)
{
    /* The renewal timer firing while an EXTEND is out sends nothing. */
    take(&A, "r", 3000, 1);
    lockmgr_extend(&A.o, held(&A, "r"), 3000, NULL);
    int ext = pending(F_EXTEND, "lock:r");
    timer_advance(1000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 1);
    answer_ok(ext, 0, 2900);
    ck_assert_int_eq(A.nextended, 1);
    timer_advance(1000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 1);
}
END_TEST

static json_int_t lease_validity_of(struct fowner *f)
{
    json_t *arr = status_leases_json(&f->o, true);
    json_int_t v = json_integer_value(json_object_get(json_array_get(arr, 0),
                                                      "validity"));
    json_decref(arr);
    return v;
}

START_TEST(test_failed_shorter_extend_shortens_lease)
{
    /* Issue: EXTEND x ttl=100 answered UNAVAILABLE, but the nodes that
     * answered already run PEXPIRE 100. The lease must not outlive them:
     * its validity drops to what they hold and it is lost at once. */
    take(&A, "r", 30000, 1);
    lockmgr_extend(&A.o, held(&A, "r"), 100, NULL);
    timer_advance(100);
    struct redlock_result r = { .status = REDLOCK_UNAVAILABLE, .ok = 1,
                                .failed = 2, .validity = 100 - 100 - 3 };
    answer(pending(F_EXTEND, "lock:r"), &r);
    ck_assert_int_eq(A.nextended, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_UNAVAILABLE);
    timer_advance(0);
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_QUORUM);
    ck_assert_ptr_null(held(&A, "r"));
}
END_TEST

START_TEST(test_failed_extend_caps_validity)
{
    take(&A, "r", 30000, 1);
    lockmgr_extend(&A.o, held(&A, "r"), 5000, NULL);
    struct redlock_result r = { .status = REDLOCK_UNAVAILABLE, .ok = 1,
                                .failed = 2, .validity = 4900 };
    answer(pending(F_EXTEND, "lock:r"), &r);
    ck_assert_ptr_nonnull(held(&A, "r"));
    ck_assert_int_le(lease_validity_of(&A), 4900);
    /* A failed EXTEND to a longer ttl keeps the old (shorter) bound. */
    lockmgr_extend(&A.o, held(&A, "r"), 60000, NULL);
    r.validity = 59000;
    answer(pending(F_EXTEND, "lock:r"), &r);
    ck_assert_int_le(lease_validity_of(&A), 4900);
}
END_TEST

START_TEST(test_hard_deadline_with_renewal_in_flight)
{
    /* Issue: while a renewal is in flight nothing enforced the deadline.
     * The lease is lost before its validity ends, whether or not an op is
     * out, and the late answer is ignored. The keys are left to expire:
     * nothing is deleted or announced. */
    take(&A, "r", 3000, 1);                 /* validity 2900 */
    timer_advance(1000);
    int renewal = pending(F_EXTEND, "lock:r");
    timer_advance(1899);
    ck_assert_int_eq(A.nlost, 1);           /* before 2900 */
    ck_assert_int_eq(A.why, LOST_QUORUM);
    ck_assert_ptr_null(held(&A, "r"));
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
    answer_ok(renewal, 0, 2900);
    ck_assert_ptr_null(held(&A, "r"));
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
    timer_advance(100000);
    ck_assert_uint_eq(timer_count(), 0);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_lost_leaves_keys_and_waiters_ask_redis)
{
    take(&A, "r", 3000, 1);
    lockmgr_lock(&B.o, R("r"), 3000, 10000, true, NULL);
    timer_advance(1000);
    answer_unavailable(pending(F_EXTEND, "lock:r"));
    for (int k = 0; k < 40 && A.nlost == 0; k++) {
        timer_advance(100);
        if (count_open(F_EXTEND, "lock:r"))
            answer_unavailable(pending(F_EXTEND, "lock:r"));
    }
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
    /* The local waiter is free to ask Redis, which knows when the keys
     * really expire. */
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
}
END_TEST

START_TEST(test_no_retry_that_cannot_finish)
{
    /* Renewal retries stop when one could not be answered (command
     * timeout plus grace) before the hard deadline. */
    conf.redis.command_timeout_ms = 100;
    take(&A, "r", 3000, 1);                 /* validity 2900 */
    uint64_t t0 = timer_now();
    timer_advance(1000);
    answer_unavailable(pending(F_EXTEND, "lock:r"));
    uint64_t last_sent = 0;
    while (A.nlost == 0) {
        timer_advance(10);
        if (count_open(F_EXTEND, "lock:r")) {
            last_sent = timer_now();
            answer_unavailable(pending(F_EXTEND, "lock:r"));
        }
        ck_assert_uint_lt(timer_now(), t0 + 3000);
    }
    uint64_t lost_at = timer_now();
    ck_assert_uint_gt(last_sent, 0);
    ck_assert_uint_le(last_sent + 2 * 100, lost_at);
    ck_assert_uint_lt(lost_at, t0 + 2900);
}
END_TEST

START_TEST(test_renew0_lost_before_validity_keys_kept)
{
    lockmgr_lock(&A.o, R("r"), 3000, 0, false, NULL);
    answer_ok(pending(F_ACQUIRE, "lock:r"), 7, 2950);
    timer_advance(2949);
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_EXPIRED);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
}
END_TEST

START_TEST(test_unlock_lost_without_quorum)
{
    /* Issue: UNLOCK answered OK nodes=1 although a quorum no longer held
     * the key. */
    take(&A, "r", 30000, 1);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    answer_released(pending(F_RELEASE, "lock:r"), 1, 2);
    ck_assert_int_eq(A.nunlocked, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_LOST);
    /* One node down is not a loss. */
    take(&A, "r", 30000, 2);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    struct redlock_result r = { .status = REDLOCK_OK, .deleted = 2,
                                .failed = 1 };
    answer(pending(F_RELEASE, "lock:r"), &r);
    ck_assert_int_eq(A.err, PROTO_ERR_NONE);
    ck_assert_int_eq(A.nodes, 2);
}
END_TEST

START_TEST(test_renewal_reply_after_lost)
{
    /* Race: an EXTEND waits behind a renewal, and the renewal finds the
     * key gone. The lease is lost (the keys that are still ours removed)
     * and the waiting EXTEND is answered LOST without being sent. */
    take(&A, "r", 3000, 1);
    timer_advance(1000);
    int renewal = pending(F_EXTEND, "lock:r");
    lockmgr_extend(&A.o, held(&A, "r"), 9000, NULL);
    answer_lost(renewal);
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_NODE);
    ck_assert_int_eq(A.nextended, 1);
    ck_assert_int_eq(A.err, PROTO_ERR_LOST);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    ck_assert_ptr_null(held(&A, "r"));
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    answer_released(pending(F_RELEASE, "lock:r"), 2, 0);
    timer_advance(100000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r"), 0);
    ck_assert_uint_eq(timer_count(), 0);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

/* ---- the end of an owner ------------------------------------------------- */

START_TEST(test_end_releases_everything)
{
    take(&A, "r1", 30000, 1);
    take(&A, "r2", 30000, 1);
    lockmgr_owner_end(&A.o, false);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r1"), 1);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r2"), 1);
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    answer_released(pending(F_RELEASE, "lock:r1"), 3, 0);
    answer_released(pending(F_RELEASE, "lock:r2"), 3, 0);
    ck_assert_int_eq(A.nunlocked, 0);       /* nobody asked */
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_lock_delay_on_drop)
{
    conf.locks.lock_delay_ms = 5000;
    take(&A, "r", 30000, 1);
    lockmgr_owner_end(&A.o, true);          /* a drop: keep the key */
    ck_assert_int_eq(count_open(F_RELEASE, "lock:r"), 0);
    int i = pending(F_EXTEND, "lock:r");
    ck_assert_int_eq(calls[i].ttl, 5000);
    answer_ok(i, 0, 4900);

    take(&B, "q", 30000, 2);
    lockmgr_owner_end(&B.o, false);         /* QUIT: no delay */
    ck_assert_int_eq(count_open(F_RELEASE, "lock:q"), 1);
}
END_TEST

START_TEST(test_end_during_acquisition)
{
    /* Race: the owner ends while its acquisition is in flight. The grant
     * that arrives later is given back; the owner hears nothing. */
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    int i = pending(F_ACQUIRE, "lock:r");
    char token[REDLOCK_TOKEN_LEN + 1];
    snprintf(token, sizeof(token), "%s", calls[i].token);
    lockmgr_owner_end(&A.o, false);
    ck_assert_int_eq(A.refs, 0);
    answer_ok(i, 3, 29000);
    ck_assert_int_eq(A.nlocked + A.nfailed, 0);
    int r = pending(F_RELEASE, "lock:r");
    ck_assert_str_eq(calls[r].token, token);
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
}
END_TEST

START_TEST(test_end_of_waiter_passes_the_turn)
{
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:r"), 20000);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_owner_end(&A.o, false);         /* the sleeping head leaves */
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&B.o));
    ck_assert_uint_eq(lockmgr_waiter_count(), 1);
}
END_TEST

/* ---- re-entry from an owner's callback ----------------------------------- */

static void lock_another(struct fowner *f)
{
    f->on_locked = NULL;
    lockmgr_lock(&f->o, R("second"), 30000, 0, true, NULL);
}

static void end_self(struct fowner *f)
{
    f->on_locked = NULL;
    lockmgr_owner_end(&f->o, false);
}

START_TEST(test_callback_may_call_back_in)
{
    A.on_locked = lock_another;
    lockmgr_lock(&A.o, R("first"), 30000, 0, true, NULL);
    answer_ok(pending(F_ACQUIRE, "lock:first"), 1, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    answer_ok(pending(F_ACQUIRE, "lock:second"), 1, 29000);
    ck_assert_int_eq(A.nlocked, 2);
    ck_assert_uint_eq(A.o.nleases, 2);
}
END_TEST

START_TEST(test_callback_may_end_owner)
{
    /* B ends itself from its grant callback, while the queue behind it
     * (C) is being served: nothing is used after it is freed. */
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_lock(&C.o, R("r"), 30000, 5000, true, NULL);
    B.on_locked = end_self;
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    answer_ok(pending(F_ACQUIRE, "lock:r"), 2, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_ptr_null(held(&B, "r"));
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&C.o));
    ck_assert_int_eq(B.refs, 0);
}
END_TEST

START_TEST(test_no_answer_after_end)
{
    take(&A, "r", 30000, 1);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    lockmgr_owner_end(&A.o, false);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    ck_assert_int_eq(A.nunlocked, 0);
    ck_assert_int_eq(A.refs, 0);
}
END_TEST

START_TEST(test_force_release_tells_local_holder)
{
    take(&A, "r", 30000, 5);
    lockmgr_force_release(&B.o, R("r"), NULL);
    struct redlock_result r = { .status = REDLOCK_OK, .deleted = 3 };
    answer(pending(F_FORCE, "lock:r"), &r);
    ck_assert_int_eq(B.nunlocked, 1);
    ck_assert_int_eq(B.nodes, 3);
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_NODE);
    ck_assert_ptr_null(held(&A, "r"));
    ck_assert_int_eq(B.refs, 0);
}
END_TEST


/* ---- lock kinds --------------------------------------------------------- */

/* The open call of kind op on key made for f's pending LOCK. */
static int pending_of(enum fop op, const char *key, const struct fowner *f)
{
    for (int i = 0; i < ncalls; i++)
        if (!calls[i].done && calls[i].op == op && !strcmp(calls[i].key, key)
            && calls[i].ud == first_wait(&f->o))
            return i;
    ck_abort_msg("no open call of kind %d on %s for %s", op, key, f->id);
    return -1;
}

static void lock_kind(struct fowner *f, const char *res, enum lockmgr_mode m,
                      uint32_t limit, uint32_t wait)
{
    const char *names[] = { res };
    size_t lens[] = { strlen(res) };
    struct lockmgr_req r = {
        .n = 1, .res = names, .len = lens, .mode = m, .limit = limit,
        .ttl = 30000, .wait = wait, .renew = true,
    };
    lockmgr_lock_req(&f->o, &r, NULL);
}

static void lock_shared(struct fowner *f, const char *res, uint32_t wait)
{
    lock_kind(f, res, LOCKMGR_SHARED, 0, wait);
}

/* n names from a space-separated list. */
static void lock_multi(struct fowner *f, const char *list, uint32_t wait)
{
    static char buf[256];
    const char *names[16];
    size_t lens[16], n = 0;

    snprintf(buf, sizeof(buf), "%s", list);
    for (char *t = strtok(buf, " "); t; t = strtok(NULL, " ")) {
        names[n] = t;
        lens[n++] = strlen(t);
    }
    struct lockmgr_req r = {
        .n = n, .res = names, .len = lens, .mode = LOCKMGR_EXCLUSIVE,
        .ttl = 30000, .wait = wait, .renew = true,
    };
    lockmgr_lock_req(&f->o, &r, NULL);
}

START_TEST(test_shared_readers_hold_together)
{
    lock_shared(&A, "r", 0);
    int i = pending_of(F_ACQUIRE, "lock:r", &A);
    ck_assert_int_eq(calls[i].mode, REDLOCK_SHARED);
    ck_assert_str_eq(calls[i].shared, "lock:r:shared");
    /* A second reader asks at once, while the first still asks. */
    lock_shared(&B, "r", 5000);
    int j = pending_of(F_ACQUIRE, "lock:r", &B);
    answer_ok(j, 2, 29000);
    answer_ok(i, 1, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(A.mode, LOCKMGR_SHARED);
    ck_assert_uint_eq(lockmgr_held_count(), 2);
    /* A third, later, with both holding. */
    lock_shared(&C, "r", 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &C), 3, 29000);
    ck_assert_int_eq(C.nlocked, 1);

    /* Renewal and release go to the set, owner-checked by token. */
    timer_advance(10000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:r:shared"), 3);
    for (int k = 0; k < ncalls; k++)
        if (!calls[k].done && calls[k].op == F_EXTEND)
            answer_ok(k, 0, 29000);
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    int k = pending(F_RELEASE, "lock:r:shared");
    ck_assert_str_eq(calls[k].token, A.token);
    answer_released(k, 3, 0);
    ck_assert_int_eq(A.nunlocked, 1);
    end_and_release(&B, "lock:r:shared");
    end_and_release(&C, "lock:r:shared");
    ck_assert_uint_eq(lockmgr_held_count(), 0);
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

START_TEST(test_writer_not_overtaken_by_later_readers)
{

    lock_shared(&A, "r", 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &A), 1, 29000);
    /* A writer waits for the reader here. */
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    /* A later reader does not overtake it, wait or not. */
    lock_shared(&C, "r", 5000);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    lock_shared(&D, "r", 0);
    ck_assert_int_eq(D.nfailed, 1);
    ck_assert_int_eq(D.err, PROTO_ERR_BUSY);
    ck_assert_uint_eq(lockmgr_waiter_count(), 2);

    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);  /* not yet */
    answer_released(pending(F_RELEASE, "lock:r:shared"), 3, 0);
    /* The writer, alone. */
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&B.o));
    ck_assert_int_eq(calls[i].mode, REDLOCK_EXCLUSIVE);
    ck_assert(calls[i].with_shared);    /* it checks the readers' set */
    answer_ok(i, 2, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    lockmgr_unlock(&B.o, held(&B, "r"), NULL);
    answer_released(pending(F_RELEASE, "lock:r"), 3, 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &C), 3, 29000);
    ck_assert_int_eq(C.nlocked, 1);
    end_and_release(&C, "lock:r:shared");
    lockmgr_owner_end(&D.o, false);
}
END_TEST

START_TEST(test_writer_waits_for_readers_asking)
{
    /* A reader is asking Redis; a writer after it waits for the answer
     * (the reader may win), and a reader after the writer too. */
    lock_shared(&A, "r", 5000);
    int i = pending_of(F_ACQUIRE, "lock:r", &A);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lock_shared(&C, "r", 5000);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    /* The reader is busy elsewhere (a writer on another daemon): it
     * sleeps, and everyone behind it waits too. */
    answer_busy(i, 300);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    timer_advance(305);
    i = pending_of(F_ACQUIRE, "lock:r", &A);
    answer_ok(i, 5, 29000);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    end_and_release(&A, "lock:r:shared");
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &B), 6, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    end_and_release(&B, "lock:r");
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &C), 7, 29000);
    ck_assert_int_eq(C.nlocked, 1);
}
END_TEST

START_TEST(test_shared_exclusive_wait0)
{
    take(&A, "r", 30000, 1);
    lock_shared(&B, "r", 0);
    ck_assert_int_eq(B.err, PROTO_ERR_BUSY);
    end_and_release(&A, "lock:r");
    lock_shared(&A, "r", 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &A), 2, 29000);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(B.nfailed, 2);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 0);
    /* A reader whose lease goes away: a wait=0 writer waits for that. */
    lockmgr_unlock(&A.o, held(&A, "r"), NULL);
    lockmgr_lock(&B.o, R("r"), 30000, 0, true, NULL);
    ck_assert_int_eq(B.nfailed, 2);
    answer_released(pending(F_RELEASE, "lock:r:shared"), 3, 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &B), 3, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    end_and_release(&B, "lock:r");
}
END_TEST

START_TEST(test_shared_release_notification)
{
    /* A writer busy on another daemon's readers wakes when their set is
     * announced empty. */
    lockmgr_lock(&A.o, R("r"), 30000, 5000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:r"), 20000);
    lockmgr_on_release(R("lock:r:shared"));
    timer_advance(4);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:r"), 1);
    ck_assert_uint_eq(lockmgr_counters()->wakeups_notified, 1);
    answer_ok(pending(F_ACQUIRE, "lock:r"), 4, 29000);
    /* A resource whose name ends like a set is its own resource too. */
    lockmgr_lock(&B.o, R("x:shared"), 30000, 5000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:x:shared"), 20000);
    lockmgr_on_release(R("lock:x:shared"));
    timer_advance(4);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:x:shared"), 1);
}
END_TEST

START_TEST(test_shared_lost_and_lock_delay)
{
    conf.locks.lock_delay_ms = 700;
    lock_shared(&A, "r", 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &A), 1, 29000);
    lock_shared(&B, "r", 0);
    answer_ok(pending_of(F_ACQUIRE, "lock:r", &B), 2, 29000);
    /* A's renewal finds its member gone: LOST, and only A's. */
    timer_advance(10000);
    int i = -1;
    for (int k = 0; k < ncalls; k++)
        if (!calls[k].done && calls[k].op == F_EXTEND &&
            !strcmp(calls[k].token, A.token))
            i = k;
    ck_assert_int_ge(i, 0);
    answer_lost(i);
    ck_assert_int_eq(A.nlost, 1);
    ck_assert_int_eq(A.why, LOST_NODE);
    ck_assert_int_eq(B.nlost, 0);
    ck_assert_ptr_nonnull(held(&B, "r"));
    /* B's connection drops: its member is kept for the lock delay. */
    lockmgr_owner_end(&B.o, true);
    int j = -1;
    for (int k = 0; k < ncalls; k++)
        if (!calls[k].done && calls[k].op == F_EXTEND && calls[k].ttl == 700)
            j = k;
    ck_assert_int_ge(j, 0);
    ck_assert_str_eq(calls[j].key, "lock:r:shared");
}
END_TEST

/* One resource's ADOPT takes whatever the token holds: a shared hold, a
 * semaphore slot (of the size stored with it); one this daemon cannot
 * keep beside its own locks is refused and given back. */
START_TEST(test_adopt_kinds)
{
    struct lockmgr_adopt_req ar = {
        .n = 1, .res = (const char *[]){ "s" }, .len = (size_t[]){ 1 },
        .token = "0123456789abcdef0123456789abcdef", .ttl = 10000,
        .renew = true,
    };
    lockmgr_adopt(&A.o, &ar, NULL);
    int i = pending(F_ADOPT, "lock:s");
    ck_assert_str_eq(calls[i].shared, "lock:s:shared");
    ck_assert_str_eq(calls[i].keys, "lock:s#");
    ck_assert_uint_eq(calls[i].limit, conf.locks.max_limit);
    answer_adopted(i, 7, REDLOCK_HELD_SHARED, 0, 0);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_int_eq(A.mode, LOCKMGR_SHARED);
    ck_assert_uint_eq(A.fence, 7);
    lockmgr_unlock(&A.o, held(&A, "s"), NULL);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:s:shared"), 1);

    /* Slot 1 of 3: a LOCK limit=3 here looks at the other two, and says
     * the limit in its label. */
    ar.res = (const char *[]){ "k" };
    lockmgr_adopt(&C.o, &ar, NULL);
    answer_adopted(pending(F_ADOPT, "lock:k"), 8, REDLOCK_HELD_SLOT, 1, 3);
    ck_assert_int_eq(C.nlocked, 1);
    ck_assert_uint_eq(C.limit, 3);
    ck_assert_uint_eq(C.slot, 1);
    lock_kind(&B, "k", LOCKMGR_EXCLUSIVE, 3, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:k#1"), 0);
    i = count_open(F_ACQUIRE, "lock:k#0") ? pending(F_ACQUIRE, "lock:k#0")
                                          : pending(F_ACQUIRE, "lock:k#2");
    ck_assert_msg(strstr(calls[i].label, "\"limit\":3}"), "label %s",
                  calls[i].label);
    /* Another size here, or none stored: refused, and the slot rotated
     * to the new token is left to expire (never deleted). */
    lockmgr_adopt(&D.o, &ar, NULL);
    i = pending(F_ADOPT, "lock:k");
    answer_adopted(i, 8, REDLOCK_HELD_SLOT, 0, 5);
    ck_assert_int_eq(D.err, PROTO_ERR_ARG);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:k#0"), 0);
    ar.res = (const char *[]){ "u" };
    lockmgr_adopt(&D.o, &ar, NULL);
    answer_adopted(pending(F_ADOPT, "lock:u"), 8, REDLOCK_HELD_SLOT, 0, 0);
    ck_assert_int_eq(D.err, PROTO_ERR_ARG);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:u#0"), 0);
    ck_assert_ptr_null(held(&D, "k"));
    ck_assert_ptr_null(held(&D, "u"));
    /* A semaphore larger than this daemon allows: refused, not made. */
    ar.res = (const char *[]){ "w" };
    lockmgr_adopt(&D.o, &ar, NULL);
    answer_adopted(pending(F_ADOPT, "lock:w"), 8, REDLOCK_HELD_SLOT, 2,
                   conf.locks.max_limit + 1);
    ck_assert_int_eq(D.err, PROTO_ERR_ARG);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:w#2"), 0);
    ck_assert_ptr_null(held(&D, "w"));
}
END_TEST

/* Two ADOPTs at once: one of resource m1 alone, which turns out to be a
 * semaphore slot, and one of a multi-resource grant that has m1 too: the
 * grant cannot put an exclusive lease on a semaphore's entry. */
START_TEST(test_adopt_multi_meets_semaphore)
{
    lockmgr_adopt(&A.o, &(struct lockmgr_adopt_req){
        .n = 1, .res = (const char *[]){ "m1" }, .len = (size_t[]){ 2 },
        .token = "0123456789abcdef0123456789abcdef", .ttl = 5000,
        .renew = true }, NULL);
    lockmgr_adopt(&B.o, &(struct lockmgr_adopt_req){
        .n = 2, .res = (const char *[]){ "m1", "m2" },
        .len = (size_t[]){ 2, 2 },
        .token = "fedcba9876543210fedcba9876543210", .ttl = 5000,
        .renew = true }, NULL);
    int a = ncalls - 2, b = ncalls - 1;
    ck_assert(calls[a].op == F_ADOPT && calls[b].op == F_ADOPT);
    answer_adopted(a, 4, REDLOCK_HELD_SLOT, 1, 3);
    ck_assert_int_eq(A.nlocked, 1);
    answer_ok(b, 5, 4900);
    ck_assert_int_eq(B.nlocked, 0);
    ck_assert_int_eq(B.err, PROTO_ERR_ARG);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:m2"), 0);
}
END_TEST

/* A slot moved from one session here to another: still taken while the
 * old holder's release is under way, and after it. */
START_TEST(test_adopt_slot_here)
{
    lock_kind(&A, "m", LOCKMGR_EXCLUSIVE, 2, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:m#0") +
                     count_open(F_ACQUIRE, "lock:m#1"), 1);
    int i = count_open(F_ACQUIRE, "lock:m#0") ? pending(F_ACQUIRE, "lock:m#0")
                                              : pending(F_ACQUIRE, "lock:m#1");
    char key[sizeof(calls[0].key)];
    snprintf(key, sizeof(key), "%s", calls[i].key);
    answer_ok(i, 3, 29000);
    uint32_t slot = A.slot;
    struct lockmgr_adopt_req ar = {
        .n = 1, .res = (const char *[]){ "m" }, .len = (size_t[]){ 1 },
        .token = A.token, .ttl = 10000, .renew = true,
    };
    lockmgr_adopt(&B.o, &ar, NULL);
    answer_adopted(pending(F_ADOPT, "lock:m"), 3, REDLOCK_HELD_SLOT, slot, 2);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(A.nlost, 1);
    lock_kind(&C, "m", LOCKMGR_EXCLUSIVE, 2, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, key), 0);
    int j = pending(F_RELEASE, key);
    ck_assert_str_eq(calls[j].token, ar.token);
    answer_released(j, 0, 3);
    /* The other slot taken too: nothing left to try. */
    snprintf(key + strlen(key) - 1, 2, "%u", 1 - slot);
    answer_ok(pending(F_ACQUIRE, key), 4, 29000);
    ck_assert_int_eq(C.nlocked, 1);
    lock_kind(&D, "m", LOCKMGR_EXCLUSIVE, 2, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:m#0") +
                     count_open(F_ACQUIRE, "lock:m#1"), 0);
    ck_assert_int_eq(D.err, PROTO_ERR_BUSY);
}
END_TEST

/* ---- STATUS's decisions (lockmgr_status_plan), on tables ---------------- */

#define NV(pttl, shared, slots, token, label, fence) \
    { "n", true, true, true, pttl, shared, slots, token, label, fence, NULL }
struct plan_row {
    const char *what;
    struct redlock_node_view v[3];
    uint32_t limit;
    size_t nexcl, nshared;
    bool here;
    /* want */
    int present, with_shared;
    int64_t shared_holders;
    uint32_t slots_held;
    const char *mode;
    bool held, remote_token;
    int remote;
    uint64_t remote_fence;
    bool fence_agreed;
};
static const struct plan_row plan_rows[] = {
    { "free", { NV(-2, 0, "", NULL, NULL, 0), NV(-2, 0, "", NULL, NULL, 0),
                NV(-2, 0, "", NULL, NULL, 0) }, 0, 0, 0, false,
      0, 0, 0, 0, NULL, false, false, -1, 0, false },
    { "a key on two nodes", { NV(900, 0, "", "t1", "L", 5),
                              NV(950, 0, "", "t1", "L", 7),
                              NV(-2, 0, "", NULL, NULL, 0) }, 0, 0, 0, false,
      2, 0, 0, 0, "exclusive", true, true, 1, 7, false },
    { "a late node's own larger fence: the quorum's is the grant's",
      { NV(900, 0, "", "t1", "L", 316), NV(950, 0, "", "t1", "L", 317),
        NV(950, 0, "", "t1", "L", 316) }, 0, 0, 0, false,
      3, 0, 0, 0, "exclusive", true, true, 0, 316, true },
    { "no fence on a quorum yet (a raise round under way)",
      { NV(900, 0, "", "t1", "L", 315), NV(950, 0, "", "t1", "L", 317),
        NV(950, 0, "", "t1", "L", 316) }, 0, 0, 0, false,
      3, 0, 0, 0, "exclusive", true, true, 1, 317, false },
    { "a foreign token", { NV(900, 0, "", "x", NULL, 0),
                           NV(900, 0, "", "x", NULL, 0),
                           NV(900, 0, "", "y", NULL, 0) }, 0, 0, 0, false,
      3, 0, 0, 0, "exclusive", true, true, -1, 0, false },
    { "one token on two, one of them not voting",
      { NV(900, 0, "", "t1", "L", 5), NV(-2, 0, "", NULL, NULL, 0),
        { "n", true, false, true, 900, 0, "", "t1", "L", 5, NULL } },
      0, 0, 0, false,
      2, 0, 0, 0, "exclusive", true, false, -1, 0, false },
    { "shared on two", { NV(-2, 2, "", NULL, NULL, 0),
                         NV(-2, 3, "", NULL, NULL, 0),
                         NV(-2, 0, "", NULL, NULL, 0) }, 0, 0, 0, false,
      0, 2, 3, 0, "shared", true, false, -1, 0, false },
    { "shared, more here", { NV(-2, 1, "", NULL, NULL, 0),
                             NV(-2, 0, "", NULL, NULL, 0),
                             NV(-2, 0, "", NULL, NULL, 0) }, 0, 0, 4, true,
      0, 1, 4, 0, "shared", true, false, -1, 0, false },
    { "slots on a quorum", { NV(-2, 0, "110", NULL, NULL, 0),
                             NV(-2, 0, "100", NULL, NULL, 0),
                             NV(-2, 0, "011", NULL, NULL, 0) }, 3, 0, 0,
      false, 0, 0, 0, 2, NULL, true, false, -1, 0, false },
    { "held here: the nodes' holder is not asked for",
      { NV(900, 0, "", "t1", "L", 5), NV(900, 0, "", "t1", "L", 5),
        NV(-2, 0, "", NULL, NULL, 0) }, 0, 1, 0, true,
      2, 0, 0, 0, "exclusive", true, false, -1, 0, false },
};

START_TEST(test_status_plan)
{
    struct lockmgr_status_plan p;
    const struct plan_row *r = &plan_rows[_i];

    lockmgr_status_plan(r->v, 3, 2, r->limit, r->nexcl, r->nshared, r->here,
                        &p);
    ck_assert_msg(p.present == r->present && p.with_shared == r->with_shared
                  && p.shared_holders == r->shared_holders
                  && p.slots_held == r->slots_held && p.held == r->held
                  && p.remote_token == r->remote_token
                  && p.remote == r->remote
                  && p.remote_fence == r->remote_fence
                  && p.remote_fence_agreed == r->fence_agreed
                  && ((!p.mode && !r->mode) ||
                      (p.mode && r->mode && strcmp(p.mode, r->mode) == 0)),
                  "%s: present %d shared %d/%" PRId64 " slots %u mode %s "
                  "held %d remote %d/%d/%" PRIu64 " agreed %d", r->what,
                  p.present, p.with_shared, p.shared_holders, p.slots_held,
                  p.mode ? p.mode : "-", p.held, p.remote_token, p.remote,
                  p.remote_fence, p.remote_fence_agreed);
}
END_TEST

START_TEST(test_semaphore_slots)
{
    /* This daemon starts at slot spread % K; the next holder takes the
     * next free one. */
    free(conf.id);
    conf.id = strdup("daemon-a");
    lockmgr_deinit();
    lockmgr_init(&conf, &fake_ops);
    uint32_t base = (uint32_t)(hmap_hash("daemon-a", 8) % 3);
    char k0[32], k1[32], k2[32];
    snprintf(k0, sizeof(k0), "lock:s#%u", base);
    snprintf(k1, sizeof(k1), "lock:s#%u", (base + 1) % 3);
    snprintf(k2, sizeof(k2), "lock:s#%u", (base + 2) % 3);

    lock_kind(&A, "s", LOCKMGR_EXCLUSIVE, 3, 0);
    int i = pending(F_ACQUIRE, k0);
    ck_assert(!calls[i].with_shared);   /* slots have no readers */
    /* A second asks at the same time, for the next slot. */
    lock_kind(&B, "s", LOCKMGR_EXCLUSIVE, 3, 5000);
    int j = pending(F_ACQUIRE, k1);
    answer_ok(i, 10, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_uint_eq(A.limit, 3);
    ck_assert_uint_eq(A.slot, base);
    /* k1 is taken on another daemon: on to the last. */
    answer_busy(j, 900);
    answer_busy(pending(F_ACQUIRE, k2), 400);
    ck_assert_int_eq(B.nlocked, 0);
    /* Every slot tried: it sleeps until the shortest PTTL. */
    ck_assert_int_eq(count_open(F_ACQUIRE, k1) + count_open(F_ACQUIRE, k2), 0);
    /* Another K here: ERR ARG, and so is a plain LOCK. */
    lock_kind(&C, "s", LOCKMGR_EXCLUSIVE, 4, 0);
    ck_assert_int_eq(C.err, PROTO_ERR_ARG);
    lockmgr_lock(&C.o, R("s"), 30000, 0, true, NULL);
    ck_assert_int_eq(C.err, PROTO_ERR_ARG);
    ck_assert_int_eq(C.nfailed, 2);
    /* A release of slot k1 elsewhere: B asks for that slot first. */
    lockmgr_on_release(k1, strlen(k1));
    timer_advance(4);
    answer_ok(pending(F_ACQUIRE, k1), 11, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_uint_eq(B.slot, (base + 1) % 3);
    /* The last slot. */
    lock_kind(&C, "s", LOCKMGR_EXCLUSIVE, 3, 0);
    answer_ok(pending(F_ACQUIRE, k2), 12, 29000);
    /* All three held here: a fourth does not ask Redis. */
    lock_kind(&D, "s", LOCKMGR_EXCLUSIVE, 3, 0);
    ck_assert_int_eq(D.err, PROTO_ERR_BUSY);
    lock_kind(&D, "s", LOCKMGR_EXCLUSIVE, 3, 5000);
    ck_assert_int_eq(count_open(F_ACQUIRE, k0), 0);
    /* B leaves: D gets B's slot. */
    lockmgr_unlock(&B.o, held(&B, "s"), NULL);
    answer_released(pending(F_RELEASE, k1), 3, 0);
    answer_ok(pending(F_ACQUIRE, k1), 13, 29000);
    ck_assert_int_eq(D.nlocked, 1);
    ck_assert_uint_eq(D.slot, (base + 1) % 3);
    json_t *arr = status_leases_json(&D.o, true);
    json_t *l0 = json_array_get(arr, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(l0, "limit")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(l0, "slot")),
                     (base + 1) % 3);
    json_decref(arr);
    /* STATUS looks at the slots this daemon knows of. */
    lockmgr_status(&A.o, R("s"), 0, NULL);
    ck_assert_uint_eq(calls[pending(F_INSPECT, "lock:s")].limit, 3);
    ck_assert_str_eq(calls[pending(F_INSPECT, "lock:s")].keys, "lock:s#");
    end_and_release(&A, k0);
    end_and_release(&C, k2);
    end_and_release(&D, k1);
}
END_TEST

START_TEST(test_multi_grant_into_leases)
{
    lock_multi(&A, "a b c", 0);
    int i = pending(F_ACQUIRE, "lock:a");
    ck_assert_int_eq(calls[i].nkeys, 3);
    ck_assert_str_eq(calls[i].keys, "lock:a lock:b lock:c");
    ck_assert(calls[i].with_shared);
    answer_ok(i, 21, 29000);
    ck_assert_int_eq(A.nlocked, 1);
    ck_assert_uint_eq(A.nres, 3);
    ck_assert_uint_eq(A.o.nleases, 3);
    ck_assert_ptr_nonnull(held(&A, "a"));
    ck_assert_ptr_nonnull(held(&A, "c"));
    /* One token, one fence; each resource its own lease: UNLOCK b. */
    lockmgr_unlock(&A.o, held(&A, "b"), NULL);
    int k = pending(F_RELEASE, "lock:b");
    ck_assert_str_eq(calls[k].token, A.token);
    answer_released(k, 3, 0);
    ck_assert_int_eq(A.nunlocked, 1);
    ck_assert_uint_eq(A.nres, 1);
    ck_assert_ptr_null(held(&A, "b"));
    /* b is free for others now, a and c are not. */
    take(&B, "b", 30000, 22);
    lockmgr_lock(&C.o, R("a"), 30000, 0, true, NULL);
    ck_assert_int_eq(C.err, PROTO_ERR_BUSY);
    /* The renewals of a and c go out together. */
    timer_advance(10000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:a"), 1);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:c"), 1);
    answer_ok(pending(F_EXTEND, "lock:a"), 0, 29000);
    timer_advance(3);
    answer_ok(pending(F_EXTEND, "lock:c"), 0, 29000);
    timer_advance(10000);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:a"), 1);
    ck_assert_int_eq(count_open(F_EXTEND, "lock:c"), 1);
    answer_ok(pending(F_EXTEND, "lock:a"), 0, 29000);
    answer_ok(pending(F_EXTEND, "lock:c"), 0, 29000);
    /* UNLOCK of both: one answer. */
    struct lease *ls[] = { held(&A, "c"), held(&A, "a") };
    lockmgr_unlock_many(&A.o, ls, 2, NULL);
    answer_released(pending(F_RELEASE, "lock:c"), 3, 0);
    ck_assert_int_eq(A.nunlocked, 1);
    answer_released(pending(F_RELEASE, "lock:a"), 2, 0);
    ck_assert_int_eq(A.nunlocked, 2);
    ck_assert_uint_eq(A.nres, 2);
    ck_assert_int_eq(A.nodes, 2);
    ck_assert_uint_eq(A.o.nleases, 0);
    end_and_release(&B, "lock:b");
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

START_TEST(test_multi_no_deadlock_fifo)
{
    /* B wants {a, b}, C then {b, a}: each queue has B before C, so
     * whatever frees up, B goes first and C never holds a part. */
    take(&A, "b", 30000, 1);
    lock_multi(&B, "a b", 5000);
    lock_multi(&C, "b a", 5000);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:a"), 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:b"), 0);
    /* A later single LOCK of a waits behind B too. */
    lockmgr_lock(&D.o, R("a"), 30000, 5000, true, NULL);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:a"), 0);
    end_and_release(&A, "lock:b");
    int i = pending(F_ACQUIRE, "lock:a");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&B.o));
    answer_ok(i, 2, 29000);
    ck_assert_int_eq(B.nlocked, 1);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:b") +
                     count_open(F_ACQUIRE, "lock:a"), 0);
    /* B lets go of a only: C still needs b, and D waits behind C. */
    lockmgr_unlock(&B.o, held(&B, "a"), NULL);
    answer_released(pending(F_RELEASE, "lock:a"), 3, 0);
    ck_assert_int_eq(count_open(F_ACQUIRE, "lock:a") +
                     count_open(F_ACQUIRE, "lock:b"), 0);
    end_and_release(&B, "lock:b");
    i = pending(F_ACQUIRE, "lock:b");
    ck_assert_ptr_eq(calls[i].ud, first_wait(&C.o));
    ck_assert_str_eq(calls[i].keys, "lock:b lock:a");
    answer_ok(i, 3, 29000);
    end_and_release(&C, "lock:a");
    while (count_open(F_RELEASE, "lock:b"))
        answer_released(pending(F_RELEASE, "lock:b"), 3, 0);
    answer_ok(pending(F_ACQUIRE, "lock:a"), 4, 29000);
    ck_assert_int_eq(D.nlocked, 1);
    end_and_release(&D, "lock:a");
}
END_TEST

START_TEST(test_multi_end_during_attempt)
{
    lock_multi(&A, "a b", 5000);
    int i = pending(F_ACQUIRE, "lock:a");
    lockmgr_owner_end(&A.o, false);
    answer_ok(i, 5, 29000);
    /* Nobody wants it now: both keys are given back. */
    ck_assert_int_eq(count_open(F_RELEASE, "lock:a"), 1);
    ck_assert_int_eq(count_open(F_RELEASE, "lock:b"), 1);
    ck_assert_int_eq(A.nlocked, 0);
    ck_assert_int_eq(A.refs, 0);
    ck_assert_uint_eq(lockmgr_waiter_count(), 0);
}
END_TEST

/* ---- inspection ----------------------------------------------------------- */

START_TEST(test_status_and_leases_json)
{
    snprintf(A.name, sizeof(A.name), "billing");
    take(&A, "r", 30000, 17);
    lockmgr_lock(&B.o, R("r"), 30000, 5000, true, NULL);
    lockmgr_status(&C.o, R("r"), 0, NULL);
    int i = pending(F_INSPECT, "lock:r");
    ck_assert_str_eq(calls[i].shared, "lock:r:shared");
    /* A semaphore nobody here knows would show in the first slots. */
    ck_assert_uint_eq(calls[i].limit, LOCKMGR_SLOT_PROBE);
    struct redlock_node_view v[3] = {
        { .name = "n1", .up = true, .voting = true, .answered = true,
          .pttl = 29000, .slots = "" },
        { .name = "n2", .up = true, .voting = true, .answered = true,
          .pttl = 29000, .slots = "" },
        { .name = "n3", .pttl = -2 },
    };
    calls[i].done = true;
    calls[i].icb(calls[i].ud, v, 3);
    ck_assert_int_eq(C.nstatus, 1);
    json_t *st = C.status;
    ck_assert(json_is_true(json_object_get(st, "held")));
    ck_assert_int_eq(json_integer_value(json_object_get(st, "waiters")), 1);
    json_t *h = json_object_get(st, "holder");
    ck_assert_str_eq(json_string_value(json_object_get(h, "session")), "s1");
    ck_assert_str_eq(json_string_value(json_object_get(h, "name")), "billing");
    ck_assert_int_eq(json_integer_value(json_object_get(h, "fence")), 17);
    ck_assert_str_eq(json_string_value(json_object_get(st, "key")), "lock:r");
    ck_assert_ptr_null(json_object_get(st, "limit"));   /* none found */
    json_t *nodes = json_object_get(st, "nodes");
    ck_assert_uint_eq(json_array_size(nodes), 3);
    ck_assert(json_is_null(json_object_get(json_array_get(nodes, 2), "pttl")));
    ck_assert_int_eq(C.refs, 0);

    json_t *arr = status_leases_json(&A.o, false);
    ck_assert_uint_eq(json_array_size(arr), 1);
    json_t *l0 = json_array_get(arr, 0);
    ck_assert_str_eq(json_string_value(json_object_get(l0, "resource")), "r");
    ck_assert_int_eq(json_integer_value(json_object_get(l0, "fence")), 17);
    ck_assert_ptr_null(json_object_get(l0, "token"));   /* not for others */
    json_decref(arr);
    arr = status_leases_json(&A.o, true);      /* its own LOCKS */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(arr, 0),
                                                       "token")), A.token);
    json_decref(arr);
    end_and_release(&A, "lock:r");
}
END_TEST

/* ---- what the wait and hold histograms are told -------------------------- */

#define SEEN_MAX 16
static struct seen {
    char resource[64];
    bool wait, granted;
    uint64_t ms;
} seen[SEEN_MAX];
static int nseen;

static void seen_add(const char *res, size_t len, bool wait, bool granted,
                     uint64_t ms)
{
    ck_assert_int_lt(nseen, SEEN_MAX);
    snprintf(seen[nseen].resource, sizeof(seen[nseen].resource), "%.*s",
             (int)len, res);
    seen[nseen].wait = wait;
    seen[nseen].granted = granted;
    seen[nseen].ms = ms;
    nseen++;
}

static void seen_waited(const char *res, size_t len, bool granted,
                        uint64_t ms)
{
    seen_add(res, len, true, granted, ms);
}

static void seen_held(const char *res, size_t len, uint64_t ms)
{
    seen_add(res, len, false, false, ms);
}

static const struct lockmgr_observer seen_observer = {
    .waited = seen_waited, .held = seen_held,
};

static void assert_seen(int i, const char *res, bool wait, bool granted,
                        uint64_t ms)
{
    ck_assert_int_lt(i, nseen);
    ck_assert_str_eq(seen[i].resource, res);
    ck_assert_msg(seen[i].wait == wait && seen[i].granted == granted &&
                  seen[i].ms == ms, "seen[%d] %s: wait %d granted %d %" PRIu64
                  " ms, not %d %d %" PRIu64, i, res, seen[i].wait,
                  seen[i].granted, seen[i].ms, wait, granted, ms);
}

/* Every grant (at once or after a wait) and every ERR TIMEOUT is told
 * with the time since the LOCK, once per resource; BUSY and UNAVAILABLE
 * are not; every lease that ends is told with its hold, released or
 * lost. */
START_TEST(test_observer_waits_and_holds)
{
    nseen = 0;
    lockmgr_set_observer(&seen_observer);
    lockmgr_lock(&A.o, R("job:1"), 30000, 0, true, NULL);
    timer_advance(3);
    answer_ok(pending(F_ACQUIRE, "lock:job:1"), 1, 29000);
    assert_seen(0, "job:1", true, true, 3);
    lockmgr_lock(&B.o, R("job:1"), 30000, 1000, true, NULL);
    lockmgr_lock(&C.o, R("job:1"), 30000, 0, true, NULL);     /* BUSY */
    timer_advance(1000);
    ck_assert_int_eq(B.err, PROTO_ERR_TIMEOUT);
    ck_assert_int_eq(C.err, PROTO_ERR_BUSY);
    ck_assert_int_eq(nseen, 2);
    assert_seen(1, "job:1", true, false, 1000);
    lockmgr_lock(&C.o, R("mail:1"), 30000, 0, true, NULL);
    answer_unavailable(pending(F_ACQUIRE, "lock:mail:1"));
    ck_assert_int_eq(nseen, 2);

    /* Released: told at UNLOCK, not when the nodes answer. */
    timer_advance(500);
    lockmgr_unlock(&A.o, held(&A, "job:1"), NULL);
    assert_seen(2, "job:1", false, false, 1500);
    answer_released(pending(F_RELEASE, "lock:job:1"), 3, 0);

    /* Several resources: each is told. */
    lock_multi(&B, "a:1 b:2", 5000);
    timer_advance(7);
    answer_ok(pending(F_ACQUIRE, "lock:a:1"), 4, 29000);
    ck_assert_int_eq(nseen, 5);
    assert_seen(3, "a:1", true, true, 7);
    assert_seen(4, "b:2", true, true, 7);

    /* Lost: the nodes no longer hold it. */
    timer_advance(10000);
    answer_lost(pending(F_EXTEND, "lock:a:1"));
    ck_assert_int_eq(B.nlost, 1);
    assert_seen(5, "a:1", false, false, 10000);
    lockmgr_set_observer(NULL);
    end_and_release(&B, "lock:b:2");
    ck_assert_int_eq(nseen, 6);
}
END_TEST

/* STATUS lists this daemon's waiters, in queue order, each with how long
 * it has waited so far. */
START_TEST(test_status_lists_waiters)
{
    snprintf(C.name, sizeof(C.name), "batch");
    take(&A, "r", 30000, 1);
    lockmgr_lock(&B.o, R("r"), 30000, 60000, true, NULL);
    timer_advance(250);
    lockmgr_lock(&C.o, R("r"), 30000, 60000, true, NULL);
    timer_advance(100);
    lockmgr_status(&D.o, R("r"), 0, NULL);
    int i = pending(F_INSPECT, "lock:r");
    struct redlock_node_view v[3] = {
        { .name = "n1", .up = true, .voting = true, .answered = true,
          .pttl = 29000, .slots = "" },
        { .name = "n2", .pttl = -2 }, { .name = "n3", .pttl = -2 },
    };
    timer_advance(50);      /* the nodes' round trip counts too */
    calls[i].done = true;
    calls[i].icb(calls[i].ud, v, 3);
    json_t *w = json_object_get(D.status, "waiting");
    ck_assert_uint_eq(json_array_size(w), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(D.status, "waiters")),
                     2);
    json_t *w0 = json_array_get(w, 0), *w1 = json_array_get(w, 1);
    ck_assert_str_eq(json_string_value(json_object_get(w0, "session")), "s2");
    ck_assert_int_eq(json_integer_value(json_object_get(w0, "waited_ms")),
                     400);
    ck_assert(json_is_null(json_object_get(w0, "name")));
    ck_assert_str_eq(json_string_value(json_object_get(w0, "mode")),
                     "exclusive");
    ck_assert_str_eq(json_string_value(json_object_get(w1, "session")), "s3");
    ck_assert_str_eq(json_string_value(json_object_get(w1, "name")), "batch");
    ck_assert_int_eq(json_integer_value(json_object_get(w1, "waited_ms")),
                     150);
    /* Unchanged beside it: the holder. */
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(
        D.status, "holder"), "session")), "s1");
    lockmgr_owner_end(&B.o, false);
    lockmgr_owner_end(&C.o, false);
    end_and_release(&A, "lock:r");
}
END_TEST

static bool visible_x(void *ud, const char *res, size_t len)
{
    (void)ud;
    return len >= 2 && memcmp(res, "x:", 2) == 0;
}

/* TOP: the resources held or waited for here, the longest wait first,
 * then the longest hold; the limit and a user's view. */
START_TEST(test_top)
{
    struct lockmgr_top_view t[8];
    size_t n, total;

    take(&A, "x:held-long", 30000, 1);
    timer_advance(1000);
    take(&A, "x:held", 30000, 2);
    take(&B, "y:contended", 30000, 3);
    lockmgr_lock(&C.o, R("y:contended"), 30000, 60000, true, NULL);
    timer_advance(300);
    lockmgr_lock(&D.o, R("x:held"), 30000, 60000, true, NULL);
    lockmgr_lock(&C.o, R("y:contended2"), 30000, 60000, true, NULL);
    answer_busy(pending(F_ACQUIRE, "lock:y:contended2"), 5000);
    timer_advance(200);

    total = lockmgr_top(t, 8, &n, NULL, NULL);
    ck_assert_uint_eq(total, 4);
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(t[0].resource, "y:contended");
    ck_assert_uint_eq(t[0].waited_ms, 500);
    ck_assert_uint_eq(t[0].waiters, 1);
    ck_assert_uint_eq(t[0].holders, 1);
    ck_assert_str_eq(t[0].session, "s2");
    ck_assert_uint_eq(t[0].held_ms, 500);
    /* Equal waits: the longer hold first. */
    ck_assert_str_eq(t[1].resource, "x:held");
    ck_assert_uint_eq(t[1].waited_ms, 200);
    ck_assert_str_eq(t[2].resource, "y:contended2");
    ck_assert_uint_eq(t[2].waited_ms, 200);
    ck_assert_uint_eq(t[2].holders, 0);
    ck_assert_ptr_null(t[2].session);
    ck_assert_str_eq(t[3].resource, "x:held-long");
    ck_assert_uint_eq(t[3].waiters, 0);
    ck_assert_uint_eq(t[3].held_ms, 1500);

    /* The first two only, all counted. */
    total = lockmgr_top(t, 2, &n, NULL, NULL);
    ck_assert_uint_eq(total, 4);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(t[0].resource, "y:contended");
    ck_assert_str_eq(t[1].resource, "x:held");
    /* What the asker may see. */
    total = lockmgr_top(t, 8, &n, visible_x, NULL);
    ck_assert_uint_eq(total, 2);
    ck_assert_str_eq(t[0].resource, "x:held");
    ck_assert_str_eq(t[1].resource, "x:held-long");

    lockmgr_owner_end(&C.o, false);
    lockmgr_owner_end(&D.o, false);
    while (count_open(F_ACQUIRE, "lock:y:contended2"))
        answer_busy(pending(F_ACQUIRE, "lock:y:contended2"), 5000);
    end_and_release(&B, "lock:y:contended");
    lockmgr_owner_end(&A.o, false);
    while (count_open(F_RELEASE, "lock:x:held"))
        answer_released(pending(F_RELEASE, "lock:x:held"), 3, 0);
    while (count_open(F_RELEASE, "lock:x:held-long"))
        answer_released(pending(F_RELEASE, "lock:x:held-long"), 3, 0);
    total = lockmgr_top(t, 8, &n, NULL, NULL);
    ck_assert_uint_eq(total, 0);
    ck_assert_uint_eq(n, 0);
}
END_TEST

/* A semaphore held only through other daemons: STATUS looks at the first
 * slots, reads the size off a slot's label, and looks again at all of
 * them. */
START_TEST(test_status_finds_a_semaphore_elsewhere)
{
    static const char label[] = "{\"daemon\":\"d2\",\"session\":\"s9\","
                                "\"limit\":3}";
    struct redlock_node_view v[3] = {
        { .name = "n1", .up = true, .voting = true, .answered = true,
          .pttl = -2, .slots = "1100000000000000", .slot_label = label },
        { .name = "n2", .up = true, .voting = true, .answered = true,
          .pttl = -2, .slots = "1100000000000000", .slot_label = label },
        { .name = "n3", .pttl = -2 },
    };
    int i;

    lockmgr_status(&C.o, R("sem"), 0, NULL);
    i = pending(F_INSPECT, "lock:sem");
    ck_assert_uint_eq(calls[i].limit, LOCKMGR_SLOT_PROBE);
    calls[i].done = true;
    calls[i].icb(calls[i].ud, v, 3);
    ck_assert_int_eq(C.nstatus, 0);             /* not yet: once more */
    i = pending(F_INSPECT, "lock:sem");
    ck_assert_uint_eq(calls[i].limit, 3);
    v[0].slots = v[1].slots = "110";
    calls[i].done = true;
    calls[i].icb(calls[i].ud, v, 3);
    ck_assert_int_eq(C.nstatus, 1);
    ck_assert_int_eq(json_integer_value(json_object_get(C.status, "limit")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(C.status,
                                                        "slots_held")), 2);
    ck_assert(json_is_true(json_object_get(C.status, "held")));
    ck_assert_int_eq(C.refs, 0);
}
END_TEST

/* C's STATUS of a resource nobody here holds, the nodes answering v[3]:
 * the holder it names (owned by C.status). */
static json_t *holder_seen(const struct redlock_node_view *v)
{
    lockmgr_status(&C.o, R("elsewhere"), 0, NULL);
    int i = pending(F_INSPECT, "lock:elsewhere");
    calls[i].done = true;
    calls[i].icb(calls[i].ud, v, 3);
    return json_object_get(C.status, "holder");
}

/* The label an acquisition stores after its token names daemon, session
 * and client (quotes escaped: it is JSON); STATUS where no holder is here
 * names the one the nodes record, with the highest fence stored, or
 * {"foreign":true} for a value in no redlockd's form, or nobody when no
 * token is on a quorum. */
START_TEST(test_status_names_a_holder_elsewhere)
{
    free(conf.id);
    conf.id = strdup("d\"1");
    lockmgr_deinit();
    lockmgr_init(&conf, &fake_ops);
    snprintf(A.name, sizeof(A.name), "bil\\ling");
    lockmgr_lock(&A.o, R("r"), 30000, 0, true, NULL);
    int i = pending(F_ACQUIRE, "lock:r");
    ck_assert_str_eq(calls[i].label,
                     "{\"daemon\":\"d\\\"1\",\"session\":\"s1\","
                     "\"name\":\"bil\\\\ling\"}");
    answer_ok(i, 5, 29000);

    static const char lab[] = "{\"daemon\":\"far\",\"session\":\"s9.x\","
                              "\"name\":\"bob\"}";
    struct redlock_node_view v[3] = {
        { .name = "n1", .voting = true, .answered = true, .pttl = 9000,
          .slots = "",
          .token = "t1", .label = lab, .fence = 40 },
        { .name = "n2", .voting = true, .answered = true, .pttl = 9000,
          .slots = "",
          .token = "t1", .label = lab, .fence = 41 },
        { .name = "n3", .voting = true, .answered = true, .pttl = 9000,
          .slots = "",
          .token = "t2", .label = lab, .fence = 99 },
    };
    json_t *h = holder_seen(v);
    ck_assert_str_eq(json_string_value(json_object_get(h, "daemon")), "far");
    ck_assert_str_eq(json_string_value(json_object_get(h, "session")), "s9.x");
    ck_assert_str_eq(json_string_value(json_object_get(h, "name")), "bob");
    ck_assert_int_eq(json_integer_value(json_object_get(h, "fence")), 41);

    /* Some other client's value. */
    v[0].label = v[1].label = NULL;
    h = holder_seen(v);
    ck_assert(json_is_true(json_object_get(h, "foreign")));

    /* A label that is no holder label is foreign too. */
    v[0].label = v[1].label = "{\"daemon\":1}";
    h = holder_seen(v);
    ck_assert(json_is_true(json_object_get(h, "foreign")));

    /* A node that does not vote does not count. */
    v[1].voting = false;
    ck_assert(json_is_null(holder_seen(v)));

    /* No token on a quorum: nobody. */
    v[1].voting = true;
    v[1].token = "t3";
    ck_assert(json_is_null(holder_seen(v)));
    ck_assert_int_eq(C.refs, 0);
    end_and_release(&A, "lock:r");
}
END_TEST

/* ---- timer and hmap ------------------------------------------------------- */

static int fired[16], nfired;

static void tcb(struct timer *t)
{
    fired[nfired++] = (int)(intptr_t)t->data;
}

START_TEST(test_timer_order_stop_restart)
{
    struct timer t[5];
    for (int i = 0; i < 5; i++)
        timer_init(&t[i], tcb, (void *)(intptr_t)i);
    nfired = 0;
    timer_start(&t[0], 50);
    timer_start(&t[1], 10);
    timer_start(&t[2], 30);
    timer_start(&t[3], 30);
    timer_start(&t[4], 70);
    timer_stop(&t[2]);
    timer_stop(&t[2]);          /* twice is fine */
    timer_start(&t[4], 5);      /* re-arming moves it */
    ck_assert_uint_eq(timer_count(), 4);
    timer_advance(9);
    ck_assert_int_eq(nfired, 1);
    ck_assert_int_eq(fired[0], 4);
    timer_advance(100);
    ck_assert_int_eq(nfired, 4);
    ck_assert_int_eq(fired[1], 1);
    ck_assert_int_eq(fired[2], 3);
    ck_assert_int_eq(fired[3], 0);
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

static struct timer chain;
static uint64_t chain_at[4];
static int nchain;

static void chain_cb(struct timer *t)
{
    chain_at[nchain++] = timer_now();
    if (nchain < 4)
        timer_start(t, 10);     /* re-arm from inside the callback */
}

START_TEST(test_timer_rearm_in_callback)
{
    uint64_t t0 = timer_now();
    nchain = 0;
    timer_init(&chain, chain_cb, NULL);
    timer_start(&chain, 10);
    timer_advance(1000);
    ck_assert_int_eq(nchain, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(chain_at[i], t0 + 10 * (uint64_t)(i + 1));
    ck_assert_uint_eq(timer_now(), t0 + 1000);
}
END_TEST

static uint64_t many_at[1000];
static int nmany;

static void many_cb(struct timer *t)
{
    (void)t;
    many_at[nmany++] = timer_now();
}

START_TEST(test_timer_many)
{
    enum { N = 1000 };
    static struct timer t[N];
    uint64_t t0 = timer_now();
    nmany = 0;
    for (int i = 0; i < N; i++) {
        timer_init(&t[i], many_cb, NULL);
        timer_start(&t[i], (uint64_t)((i * 7919) % N));
    }
    for (int i = 0; i < N; i += 2)
        timer_stop(&t[i]);
    ck_assert_uint_eq(timer_count(), N / 2);
    timer_advance(N);
    /* Each fired at its due time, earliest first. */
    ck_assert_int_eq(nmany, N / 2);
    for (int i = 1; i < nmany; i++)
        ck_assert_uint_le(many_at[i - 1], many_at[i]);
    ck_assert_uint_ge(many_at[0], t0);
    ck_assert_uint_eq(timer_count(), 0);
}
END_TEST

#include "hmap.h"

struct item {
    struct hmap_node node;
    char key[16];
};

START_TEST(test_hmap)
{
    enum { N = 500 };
    static struct item items[N];
    struct hmap m;
    hmap_init(&m);
    for (int i = 0; i < N; i++) {
        int k = snprintf(items[i].key, sizeof(items[i].key), "k%d", i);
        hmap_put(&m, &items[i].node, items[i].key, (size_t)k);
    }
    ck_assert_uint_eq(m.count, N);
    ck_assert_uint_ge(m.nbuckets, N);       /* grew past load 1 */
    for (int i = 0; i < N; i++) {
        char key[16];
        int k = snprintf(key, sizeof(key), "k%d", i);
        struct hmap_node *n = hmap_get(&m, key, (size_t)k);
        ck_assert_ptr_eq(n, &items[i].node);
    }
    ck_assert_ptr_null(hmap_get(&m, "k", 1));
    ck_assert_ptr_null(hmap_get(&m, "k5000", 5));
    /* Deleting while iterating visits every node exactly once. */
    struct hmap_iter it;
    struct hmap_node *n;
    int seen = 0;
    hmap_iter_init(&it, &m);
    while ((n = hmap_iter_next(&it))) {
        struct item *x = container_of(n, struct item, node);
        if ((x - items) % 2 == 0)
            hmap_del(&m, n);
        seen++;
    }
    ck_assert_int_eq(seen, N);
    ck_assert_uint_eq(m.count, N / 2);
    ck_assert_ptr_null(hmap_get(&m, "k0", 2));
    ck_assert_ptr_eq(hmap_get(&m, "k1", 2), &items[1].node);
    hmap_deinit(&m);
}
END_TEST

static Suite *lockmgr_suite(void)
{
    Suite *s = suite_create("lockmgr");
    TCase *t = tcase_create("table");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_lock_uncontended);
    tcase_add_test(t, test_busy_and_unavailable);
    tcase_add_test(t, test_unlock_lost_when_no_node_had_it);
    tcase_add_test(t, test_fifo_queue);
    tcase_add_test(t, test_wait_zero_behind_holder_is_busy);
    tcase_add_test(t, test_wait_zero_during_release_waits_for_it);
    tcase_add_test(t, test_wait_times_out);
    tcase_add_test(t, test_wait_retries_after_busy_elsewhere);
    tcase_add_test(t, test_release_notification_wakes_sleeper);
    tcase_add_test(t, test_notification_during_attempt_retries_at_once);
    tcase_add_test(t, test_woken_waiter_while_head_attempts);
    tcase_add_test(t, test_cut_wait);
    tcase_add_test(t, test_lock_held_back_until_ready);
    tcase_add_test(t, test_held_back_lock_cut_or_shut_down);
    tcase_add_test(t, test_cut_wait_during_attempt);
    tcase_add_test(t, test_no_random_source);
    suite_add_tcase(s, t);

    t = tcase_create("lease");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_renewal_schedule);
    tcase_add_test(t, test_renewal_lost_on_nodes);
    tcase_add_test(t, test_renewal_retries_then_lost);
    tcase_add_test(t, test_extend);
    tcase_add_test(t, test_extend_lost_and_unavailable);
    tcase_add_test(t, test_extend_while_renewal_in_flight);
    tcase_add_test(t, test_renewal_waits_for_extend);
    tcase_add_test(t, test_failed_shorter_extend_shortens_lease);
    tcase_add_test(t, test_failed_extend_caps_validity);
    tcase_add_test(t, test_hard_deadline_with_renewal_in_flight);
    tcase_add_test(t, test_lost_leaves_keys_and_waiters_ask_redis);
    tcase_add_test(t, test_no_retry_that_cannot_finish);
    tcase_add_test(t, test_renew0_lost_before_validity_keys_kept);
    tcase_add_test(t, test_unlock_lost_without_quorum);
    tcase_add_test(t, test_renewal_reply_after_lost);
    suite_add_tcase(s, t);

    t = tcase_create("owner");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_end_releases_everything);
    tcase_add_test(t, test_owner_cancel_withdraws_requests);
    tcase_add_test(t, test_owner_abandon_leaves_keys);
    tcase_add_test(t, test_adopt);
    tcase_add_test(t, test_adopt_multi);
    tcase_add_loop_test(t, test_status_plan, 0,
                        sizeof(plan_rows) / sizeof(plan_rows[0]));
    tcase_add_test(t, test_adopt_multi_meets_semaphore);
    tcase_add_test(t, test_adopt_held_back_until_ready);
    tcase_add_test(t, test_nowait_behind_asking);
    tcase_add_test(t, test_adopt_kinds);
    tcase_add_test(t, test_adopt_slot_here);
    tcase_add_test(t, test_lock_delay_on_drop);
    tcase_add_test(t, test_end_during_acquisition);
    tcase_add_test(t, test_end_of_waiter_passes_the_turn);
    tcase_add_test(t, test_callback_may_call_back_in);
    tcase_add_test(t, test_callback_may_end_owner);
    tcase_add_test(t, test_no_answer_after_end);
    tcase_add_test(t, test_status_and_leases_json);
    tcase_add_test(t, test_status_finds_a_semaphore_elsewhere);
    tcase_add_test(t, test_status_names_a_holder_elsewhere);
    tcase_add_test(t, test_observer_waits_and_holds);
    tcase_add_test(t, test_status_lists_waiters);
    tcase_add_test(t, test_top);
    tcase_add_test(t, test_force_release_tells_local_holder);
    suite_add_tcase(s, t);

    t = tcase_create("kinds");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_shared_readers_hold_together);
    tcase_add_test(t, test_writer_not_overtaken_by_later_readers);
    tcase_add_test(t, test_writer_waits_for_readers_asking);
    tcase_add_test(t, test_shared_exclusive_wait0);
    tcase_add_test(t, test_shared_release_notification);
    tcase_add_test(t, test_shared_lost_and_lock_delay);
    tcase_add_test(t, test_semaphore_slots);
    tcase_add_test(t, test_multi_grant_into_leases);
    tcase_add_test(t, test_multi_no_deadlock_fifo);
    tcase_add_test(t, test_multi_end_during_attempt);
    suite_add_tcase(s, t);

    t = tcase_create("timer_hmap");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_timer_order_stop_restart);
    tcase_add_test(t, test_timer_rearm_in_callback);
    tcase_add_test(t, test_timer_many);
    tcase_add_test(t, test_hmap);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lockmgr_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
