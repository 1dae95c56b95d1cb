/*
 * Unit tests for the pure Redlock arithmetic (daemon/redlock.c): quorum,
 * clock drift, validity, the outcome of a round of votes, tokens, and the
 * fence decision: on tables of node replies, and on the interleavings of
 * two acquisitions the old two-round fence got wrong, driven through a
 * model of the nodes' scripts (docs/design.md, "Fences").
 */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

START_TEST(test_quorum)
{
    static const int want[] = { 0, 1, 2, 2, 3, 3, 4, 4 };
    for (int n = 1; n <= 7; n++)
        ck_assert_int_eq(redlock_quorum(n), want[n]);
}
END_TEST

static const struct {
    uint32_t ttl;
    double factor;
    int64_t want;
} drift_cases[] = {
    { 30000, 0.01, 300 + 2 },
    { 100, 0.01, 1 + 2 },                   /* truncated, not rounded */
    { 199, 0.01, 1 + 2 },
    { 1000, 0.0, 2 },                       /* no factor: only the 2 ms */
    { 86400000, 0.01, 864000 + 2 },         /* max_ttl_ms's default */
    { 4294967295u, 0.49, 2104533974 + 2 },   /* largest ttl and factor */
};

START_TEST(test_drift)
{
    for (size_t i = 0; i < sizeof(drift_cases) / sizeof(drift_cases[0]); i++) {
        int64_t got = redlock_drift_ms(drift_cases[i].ttl,
                                       drift_cases[i].factor);
        ck_assert_msg(got == drift_cases[i].want,
                      "case %zu: ttl=%u factor=%g: got %ld want %ld", i,
                      drift_cases[i].ttl, drift_cases[i].factor, (long)got,
                      (long)drift_cases[i].want);
        /* Validity takes exactly that drift off the ttl. */
        ck_assert_int_eq(redlock_validity(drift_cases[i].ttl, 0,
                                          drift_cases[i].factor),
                         (int64_t)drift_cases[i].ttl - got);
    }
}
END_TEST

static const struct {
    uint32_t ttl;
    uint64_t elapsed;
    double drift;
    int64_t want;
} validity_cases[] = {
    { 30000, 0, 0.01, 30000 - 300 - 2 },
    { 30000, 100, 0.01, 30000 - 100 - 302 },
    { 10000, 120, 0.01, 10000 - 120 - 102 },
    { 100, 0, 0.01, 100 - 1 - 2 },          /* drift truncates: 1 ms */
    { 100, 97, 0.01, 0 },                   /* exactly used up */
    { 100, 98, 0.01, -1 },                  /* past it */
    { 1000, 0, 0.0, 998 },                  /* no drift: only the 2 ms */
    { 1000, 5000, 0.01, 1000 - 5000 - 12 }, /* slow node: negative */
    { 86400000, 3, 0.01, 86400000 - 3 - 864002 },
    { 4294967295u, 0, 0.01, 4294967295LL - 42949672 - 2 },
};

START_TEST(test_validity)
{
    for (size_t i = 0; i < sizeof(validity_cases) / sizeof(validity_cases[0]); i++) {
        int64_t got = redlock_validity(validity_cases[i].ttl,
                                       validity_cases[i].elapsed,
                                       validity_cases[i].drift);
        ck_assert_msg(got == validity_cases[i].want,
                      "case %zu: ttl=%u elapsed=%lu: got %ld want %ld", i,
                      validity_cases[i].ttl,
                      (unsigned long)validity_cases[i].elapsed, (long)got,
                      (long)validity_cases[i].want);
    }
}
END_TEST

static const struct {
    int n, ok, busy, failed;
    int64_t validity;
    enum redlock_status want;
} decide_cases[] = {
    { 1, 1, 0, 0, 10, REDLOCK_OK },
    { 1, 0, 1, 0, 10, REDLOCK_BUSY },
    { 1, 0, 0, 1, 10, REDLOCK_UNAVAILABLE },
    { 1, 1, 0, 0, 0, REDLOCK_UNAVAILABLE },     /* validity must be > 0 */
    { 3, 3, 0, 0, 10, REDLOCK_OK },
    { 3, 2, 1, 0, 10, REDLOCK_OK },
    { 3, 2, 0, 1, 10, REDLOCK_OK },             /* one node down is fine */
    { 3, 2, 0, 1, -5, REDLOCK_UNAVAILABLE },    /* too slow */
    { 3, 1, 2, 0, 10, REDLOCK_BUSY },
    { 3, 0, 3, 0, 10, REDLOCK_BUSY },
    { 3, 1, 0, 2, 10, REDLOCK_UNAVAILABLE },    /* two nodes stopped */
    { 3, 0, 0, 3, 10, REDLOCK_UNAVAILABLE },
    { 3, 1, 1, 1, 10, REDLOCK_UNAVAILABLE },    /* could have been ours */
    { 3, 0, 2, 1, 10, REDLOCK_BUSY },           /* held on a majority */
    { 5, 3, 2, 0, 10, REDLOCK_OK },
    { 5, 2, 3, 0, 10, REDLOCK_BUSY },
    { 5, 2, 2, 1, 10, REDLOCK_UNAVAILABLE },
    { 5, 0, 3, 2, 10, REDLOCK_BUSY },
    { 7, 4, 0, 3, 1, REDLOCK_OK },
    { 7, 3, 0, 4, 1, REDLOCK_UNAVAILABLE },
    { 2, 1, 1, 0, 10, REDLOCK_BUSY },           /* even N: quorum 2 */
    { 2, 2, 0, 0, 10, REDLOCK_OK },
};

START_TEST(test_decide)
{
    for (size_t i = 0; i < sizeof(decide_cases) / sizeof(decide_cases[0]); i++) {
        enum redlock_status got = redlock_decide(decide_cases[i].n,
            decide_cases[i].ok, decide_cases[i].busy, decide_cases[i].failed,
            decide_cases[i].validity);
        ck_assert_msg(got == decide_cases[i].want, "case %zu: got %d want %d",
                      i, got, decide_cases[i].want);
    }
}
END_TEST

/* ---- the fence decision on tables of replies ---------------------------- */

#define MAXN 7
#define H(c) { REDLOCK_VOTE_HELD, (c) }
#define B { REDLOCK_VOTE_BUSY, 0 }
#define BC(c) { REDLOCK_VOTE_BUSY, (c) }     /* a counter that must not count */
#define F { REDLOCK_VOTE_FAILED, 0 }
#define FC(c) { REDLOCK_VOTE_FAILED, (c) }

static const struct {
    const char *what;
    int n;
    struct redlock_node_vote v[MAXN];
    uint64_t fence;                 /* 0: first round */
    int64_t validity;
    bool may_raise;
    enum redlock_step step;
    enum redlock_status status;
    uint64_t want_fence;
    int reached;
    unsigned raise;                 /* bit i: node i is below the fence */
} plan_cases[] = {
    { "equal counters: one round", 3, { H(7), H(7), H(7) }, 0, 10, true,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 7, 3, 0 },
    { "26,21,26: the quorum returning F holds the key, one round",
      3, { H(26), H(21), H(26) }, 0, 10, true,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 26, 2, 0x2 },
    { "26,21 and busy: raise the 21", 3, { H(26), H(21), B }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 26, 1, 0x2 },
    { "26,21 and failed: raise the 21", 3, { H(26), H(21), F }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 26, 1, 0x2 },
    { "a failed node's counter is no part of F",
      3, { H(21), H(26), FC(99) }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 26, 1, 0x1 },
    { "a busy node's counter is no part of F",
      3, { H(7), H(7), BC(40) }, 0, 10, true,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 7, 2, 0 },
    { "after the raise: a quorum of holders at F", 3, { H(26), H(26), F },
      26, 10, false, REDLOCK_STEP_GRANT, REDLOCK_OK, 26, 2, 0 },
    { "the raise came back higher: still at F", 3, { H(30), H(26), F },
      26, 10, false, REDLOCK_STEP_GRANT, REDLOCK_OK, 26, 2, 0 },
    { "the raise was lost", 3, { H(26), F, B }, 26, 10, false,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 1, 0 },
    { "raised where we hold no key: counts for nothing (the old hole)",
      3, { H(26), F, BC(26) }, 26, 10, false,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 1, 0 },
    { "our key went during the raise, held by another on a majority",
      3, { H(26), B, B }, 26, 10, false,
      REDLOCK_STEP_FAIL, REDLOCK_BUSY, 26, 1, 0 },
    { "no second raise round", 3, { H(26), H(21), B }, 26, 10, false,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 1, 0x2 },
    { "validity used up in the first round", 3, { H(7), H(7), B }, 0, 0, true,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 7, 2, 0 },
    { "validity used up by the raise round", 3, { H(26), H(26), F }, 26, -1,
      false, REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 2, 0 },
    { "validity used up: no raise either", 3, { H(26), H(21), B }, 0, 0, true,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 1, 0x2 },
    { "held elsewhere", 3, { B, B, H(7) }, 0, 10, true,
      REDLOCK_STEP_FAIL, REDLOCK_BUSY, 7, 1, 0 },
    { "two nodes down", 3, { F, F, H(7) }, 0, 10, true,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 7, 1, 0 },
    { "nothing at all", 3, { F, F, F }, 0, 10, true,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 0, 0, 0 },
    { "7,7 then the next acquisition: 8 on the node it took after",
      3, { B, H(8), H(7) }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 8, 1, 0x4 },
    { "five nodes, two at F", 5, { H(10), H(12), H(12), H(11), B }, 0, 10,
      true, REDLOCK_STEP_RAISE, REDLOCK_OK, 12, 2, 0x9 },
    { "five nodes, three at F", 5, { H(12), H(12), H(12), H(3), F }, 0, 10,
      true, REDLOCK_STEP_GRANT, REDLOCK_OK, 12, 3, 0x8 },
    { "five nodes, raise reached one of two", 5,
      { H(12), H(12), F, H(12), B }, 12, 10, false,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 12, 3, 0 },
    { "one node", 1, { H(5) }, 0, 10, true,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 5, 1, 0 },
    { "two nodes apart", 2, { H(3), H(4) }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 4, 1, 0x1 },
    { "two nodes raised", 2, { H(4), H(4) }, 4, 10, false,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 4, 2, 0 },
    { "two nodes, one busy", 2, { H(4), B }, 0, 10, true,
      REDLOCK_STEP_FAIL, REDLOCK_BUSY, 4, 1, 0 },
    /* Before the last reply (redlock answers at a quorum): the nodes yet
     * to answer count as failed, and only a grant is taken early. */
    { "early: two of three in at one counter: granted now", 3,
      { H(7), H(7), F }, 0, 10, false,
      REDLOCK_STEP_GRANT, REDLOCK_OK, 7, 2, 0 },
    { "early: two of three in, apart: wait for the third", 3,
      { H(26), H(21), F }, 0, 10, false,
      REDLOCK_STEP_FAIL, REDLOCK_UNAVAILABLE, 26, 1, 0x2 },
    { "seven nodes, four holders apart", 7,
      { H(9), H(8), H(9), H(7), F, F, B }, 0, 10, true,
      REDLOCK_STEP_RAISE, REDLOCK_OK, 9, 2, 0xa },
};

START_TEST(test_fence_plan)
{
    for (size_t i = 0; i < sizeof(plan_cases) / sizeof(plan_cases[0]); i++) {
        struct redlock_fence_plan p;
        bool raise[MAXN];
        unsigned mask = 0;

        redlock_fence_plan(plan_cases[i].v, plan_cases[i].n,
                           plan_cases[i].fence, plan_cases[i].validity,
                           plan_cases[i].may_raise, &p, raise);
        for (int k = 0; k < plan_cases[i].n; k++)
            mask |= raise[k] ? 1u << k : 0;
        ck_assert_msg(p.step == plan_cases[i].step &&
                      p.status == plan_cases[i].status &&
                      p.fence == plan_cases[i].want_fence &&
                      p.reached == plan_cases[i].reached &&
                      mask == plan_cases[i].raise,
                      "case %zu (%s): step %d status %d fence %" PRIu64
                      " reached %d raise %#x; want %d %d %" PRIu64 " %d %#x",
                      i, plan_cases[i].what, p.step, p.status, p.fence,
                      p.reached, mask, plan_cases[i].step,
                      plan_cases[i].status, plan_cases[i].want_fence,
                      plan_cases[i].reached, plan_cases[i].raise);
        /* Without the raise array the decision is the same. */
        struct redlock_fence_plan q;
        redlock_fence_plan(plan_cases[i].v, plan_cases[i].n,
                           plan_cases[i].fence, plan_cases[i].validity,
                           plan_cases[i].may_raise, &q, NULL);
        ck_assert_int_eq(q.step, p.step);
        ck_assert_int_eq(p.held + p.busy + p.failed, plan_cases[i].n);
    }
}
END_TEST

/* ---- a model of the nodes' scripts --------------------------------------- */

/*
 * One node as the two fence scripts see it: its counter and which
 * acquisition's token its key holds (0: none). m_acquire is the acquire
 * script (SET NX, then the counter to max(counter, seen) + 1), m_raise the
 * owner-checked raise, m_release the compare-and-delete.
 */
struct m_node {
    uint64_t counter;
    int holder;
};

static struct redlock_node_vote m_acquire(struct m_node *m, int who,
                                          uint64_t seen)
{
    struct redlock_node_vote v = B;

    if (m->holder != 0)
        return v;
    m->holder = who;
    m->counter = (m->counter > seen ? m->counter : seen) + 1;
    v.vote = REDLOCK_VOTE_HELD;
    v.counter = m->counter;
    return v;
}

static struct redlock_node_vote m_raise(struct m_node *m, int who, uint64_t f)
{
    struct redlock_node_vote v = BC(m->counter);

    if (m->holder != who)
        return v;
    if (f > m->counter)
        m->counter = f;
    v.vote = REDLOCK_VOTE_HELD;
    v.counter = m->counter;
    return v;
}

static void m_release(struct m_node *m, int who)
{
    if (m->holder == who)
        m->holder = 0;
}

static void plan3(const struct redlock_node_vote *v, uint64_t fence,
                  bool may_raise, struct redlock_fence_plan *p, bool *raise)
{
    redlock_fence_plan(v, 3, fence, 1000, may_raise, p, raise);
}

/*
 * The first case. Counters 20, 25, 20. E takes nodes 0 and 1
 * (node 2 is held by a foreign key); its raise of node 0 to 26 never
 * arrives. L takes node 2 at once, and node 0 after E is gone from it.
 * The old fence granted E 26 on a raise that counted node 2, where E held
 * no key, then L 21: counters 21, 26, 26 at the end. Now E fails, and L's
 * fence is above anything granted before.
 */
START_TEST(test_fence_hole_lost_raise)
{
    struct m_node m[3] = { { 20, 0 }, { 25, 0 }, { 20, 99 } };
    struct redlock_node_vote e[3], l[3];
    struct redlock_fence_plan p;
    bool raise[3];
    const int E = 1, L = 2;

    e[0] = m_acquire(&m[0], E, 0);
    e[1] = m_acquire(&m[1], E, 0);
    e[2] = m_acquire(&m[2], E, 0);
    plan3(e, 0, true, &p, raise);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_eq(p.fence, 26);
    ck_assert(raise[0] && !raise[1] && !raise[2]);

    m_release(&m[2], 99);
    l[2] = m_acquire(&m[2], L, 0);
    l[1] = m_acquire(&m[1], L, 0);
    /* A raise of node 2 would count for nothing: E holds no key there. */
    e[2] = m_raise(&m[2], E, 26);
    ck_assert_int_eq(e[2].vote, REDLOCK_VOTE_BUSY);
    e[0].vote = REDLOCK_VOTE_FAILED;        /* the raise of node 0: lost */
    plan3(e, 26, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_FAIL);
    m_release(&m[0], E);
    m_release(&m[1], E);

    l[0] = m_acquire(&m[0], L, 0);
    plan3(l, 0, true, &p, raise);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_eq(p.fence, 22);
    ck_assert(!raise[0] && !raise[1] && raise[2]);
    l[2] = m_raise(&m[2], L, p.fence);
    plan3(l, p.fence, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 22);
}
END_TEST

/*
 * The same interleaving with the raise arriving: E is granted 26, and L,
 * which took node 2 while E was still deciding and node 0 after E let it
 * go, reads 26 there and is granted 27.
 */
START_TEST(test_fence_hole_raise_lands)
{
    struct m_node m[3] = { { 20, 0 }, { 25, 0 }, { 20, 99 } };
    struct redlock_node_vote e[3], l[3];
    struct redlock_fence_plan p;
    bool raise[3];
    const int E = 1, L = 2;

    for (int i = 0; i < 3; i++)
        e[i] = m_acquire(&m[i], E, 0);
    plan3(e, 0, true, &p, raise);
    m_release(&m[2], 99);
    l[2] = m_acquire(&m[2], L, 0);
    l[1] = m_acquire(&m[1], L, 0);
    e[0] = m_raise(&m[0], E, p.fence);
    plan3(e, p.fence, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 26);
    m_release(&m[0], E);
    m_release(&m[1], E);

    l[0] = m_acquire(&m[0], L, 0);
    plan3(l, 0, true, &p, raise);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_eq(p.fence, 27);
    l[2] = m_raise(&m[2], L, p.fence);
    plan3(l, p.fence, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 27);
}
END_TEST

/*
 * The second case: equal counters 6, 6, 6, and two grants in a
 * row both got 7 (the second read node 2 before the first's raise landed
 * there, and node 1 where that raise was lost). Now the first is granted
 * 7 in one round, and the second, on the node the first left, reads 7 and
 * gets 8.
 */
START_TEST(test_fence_equal_counters)
{
    struct m_node m[3] = { { 6, 0 }, { 6, 0 }, { 6, 99 } };
    struct redlock_node_vote e[3], l[3];
    struct redlock_fence_plan p;
    const int E = 1, L = 2;

    for (int i = 0; i < 3; i++)
        e[i] = m_acquire(&m[i], E, 0);
    plan3(e, 0, true, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 7);
    m_release(&m[2], 99);
    l[2] = m_acquire(&m[2], L, 0);
    l[0] = m_acquire(&m[0], L, 0);
    m_release(&m[0], E);
    m_release(&m[1], E);
    l[1] = m_acquire(&m[1], L, 0);
    plan3(l, 0, true, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_eq(p.fence, 8);
    l[2] = m_raise(&m[2], L, p.fence);
    plan3(l, p.fence, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 8);
}
END_TEST

/*
 * Shared grants can hold a node at the same time, so tenure does not order
 * them, and nothing needs to: they hold together. Counters 5, 10, 10. S1
 * takes nodes 0 and 1 (6, 11), S2 nodes 0 and 2 (7, 11): both find F = 11
 * and raise their holder below it (owner-checked on the member): both are
 * granted 11 (docs/design.md: concurrent readers may share a fence once
 * counters have diverged). A writer after them, on any quorum, finds at
 * least 11 on a node one of them held and goes above both.
 */
struct m_shared {
    uint64_t counter;
    unsigned readers;           /* bit per shared acquisition */
    int writer;
};

static struct redlock_node_vote ms_acquire(struct m_shared *m, int who,
                                           uint64_t seen)
{
    struct redlock_node_vote v = { REDLOCK_VOTE_HELD, 0 };

    m->readers |= 1u << who;
    m->counter = (m->counter > seen ? m->counter : seen) + 1;
    v.counter = m->counter;
    return v;
}

static struct redlock_node_vote ms_raise(struct m_shared *m, int who,
                                         uint64_t f)
{
    struct redlock_node_vote v = { REDLOCK_VOTE_HELD, 0 };

    if (!(m->readers & (1u << who))) {
        v.vote = REDLOCK_VOTE_BUSY;
        return v;
    }
    if (f > m->counter)
        m->counter = f;
    v.counter = m->counter;
    return v;
}

/*
 * A grant taken on the first two replies, before a third node that is
 * ahead (another daemon's grants went there) has answered: E gets 6, not
 * the 10 the third would have raised it to. The next grant after E, on
 * any two nodes, is still above 6: the two quorums share a node that E
 * left at 6 or more.
 */
START_TEST(test_fence_early_grant)
{
    struct m_node m[3] = { { 5, 0 }, { 5, 0 }, { 9, 0 } };
    struct redlock_node_vote e[3] = { F, F, F }, l[3] = { F, F, F };
    struct redlock_fence_plan p;
    const int E = 1, L = 2;

    e[0] = m_acquire(&m[0], E, 0);
    e[1] = m_acquire(&m[1], E, 0);
    plan3(e, 0, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_eq(p.fence, 6);
    e[2] = m_acquire(&m[2], E, 0);      /* the late reply: 10, unused */
    ck_assert_uint_eq(e[2].counter, 10);
    for (int i = 0; i < 3; i++)
        m_release(&m[i], E);

    /* L answered early too, on nodes 1 and 2 (11 there, 7 on node 1). */
    l[1] = m_acquire(&m[1], L, 0);
    l[2] = m_acquire(&m[2], L, 0);
    plan3(l, 0, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_FAIL);   /* apart: wait */
    l[0] = m_acquire(&m[0], L, 0);
    plan3(l, 0, true, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_gt(p.fence, 6);
}
END_TEST


/* The exclusive acquire: not while a reader is live. */
static struct redlock_node_vote mx_acquire(struct m_shared *m, int who)
{
    struct redlock_node_vote v = { REDLOCK_VOTE_BUSY, 0 };

    if (m->readers || m->writer)
        return v;
    m->writer = who;
    m->counter++;
    v.vote = REDLOCK_VOTE_HELD;
    v.counter = m->counter;
    return v;
}

START_TEST(test_fence_shared_raise)
{
    struct m_shared m[3] = { { 5, 0, 0 }, { 10, 0, 0 }, { 10, 0, 0 } };
    struct redlock_node_vote s1[3] = { F, F, F }, s2[3] = { F, F, F }, w[3];
    struct redlock_fence_plan p;
    bool raise[3];
    const int S1 = 1, S2 = 2, W = 3;

    s1[0] = ms_acquire(&m[0], S1, 0);
    s1[1] = ms_acquire(&m[1], S1, 0);
    s2[0] = ms_acquire(&m[0], S2, 0);
    s2[2] = ms_acquire(&m[2], S2, 0);
    /* A writer meanwhile finds readers on every node it asks. */
    for (int i = 0; i < 3; i++)
        w[i] = mx_acquire(&m[i], W);
    plan3(w, 0, true, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_FAIL);
    ck_assert_int_eq(p.status, REDLOCK_BUSY);

    plan3(s1, 0, true, &p, raise);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    ck_assert_uint_eq(p.fence, 11);
    ck_assert(raise[0] && !raise[1]);
    s1[0] = ms_raise(&m[0], S1, 11);
    plan3(s1, 11, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    plan3(s2, 0, true, &p, raise);
    ck_assert_uint_eq(p.fence, 11);
    ck_assert_int_eq(p.step, REDLOCK_STEP_RAISE);
    s2[0] = ms_raise(&m[0], S2, 11);     /* already 11: S1 raised it */
    plan3(s2, 11, false, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);   /* 11 too */

    /* Both leave; the writer is above both, on whichever quorum. */
    for (int i = 0; i < 3; i++)
        m[i].readers = 0;
    w[0] = mx_acquire(&m[0], W);
    w[1] = mx_acquire(&m[1], W);
    w[2].vote = REDLOCK_VOTE_FAILED;
    plan3(w, 0, true, &p, NULL);
    ck_assert_int_eq(p.step, REDLOCK_STEP_GRANT);
    ck_assert_uint_gt(p.fence, 11);
}
END_TEST

START_TEST(test_token)
{
    char a[REDLOCK_TOKEN_LEN + 1], b[REDLOCK_TOKEN_LEN + 1];

    ck_assert_int_eq(redlock_token(a), 0);
    ck_assert_int_eq(redlock_token(b), 0);
    ck_assert_uint_eq(strlen(a), 32);
    ck_assert_uint_eq(strspn(a, "0123456789abcdef"), 32);
    ck_assert_str_ne(a, b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("redlock");
    TCase *tc = tcase_create("pure");
    tcase_add_test(tc, test_quorum);
    tcase_add_test(tc, test_drift);
    tcase_add_test(tc, test_validity);
    tcase_add_test(tc, test_decide);
    tcase_add_test(tc, test_fence_plan);
    tcase_add_test(tc, test_fence_hole_lost_raise);
    tcase_add_test(tc, test_fence_hole_raise_lands);
    tcase_add_test(tc, test_fence_equal_counters);
    tcase_add_test(tc, test_fence_early_grant);
    tcase_add_test(tc, test_fence_shared_raise);
    tcase_add_test(tc, test_token);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
