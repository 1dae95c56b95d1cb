/*
 * redlock: the rules (redlock.h). The pure parts: the Redlock arithmetic
 * (quorum, drift, validity), the outcome of a round from its counts, and
 * the fence plan that decides an acquisition from its votes
 * (docs/design.md, "Fences"); and the tokens, 128 random bits each. No
 * state but the tokens' random block, no I/O but the OS random source:
 * what tests/unit/test_redlock.c runs on tables of votes.
 *
 * The bottom of redlock's files (redlock_priv.h lists them): the rounds
 * over the nodes are redlock_op.c's, above it.
 */
#include "redlock.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

int redlock_quorum(int nnodes)
{
    return nnodes / 2 + 1;
}

int64_t redlock_drift_ms(uint32_t ttl, double factor)
{
    return (int64_t)((double)ttl * factor) + REDLOCK_DRIFT_MIN_MS;
}

int64_t redlock_validity(uint32_t ttl, uint64_t elapsed_ms, double drift)
{
    return (int64_t)ttl - (int64_t)elapsed_ms - redlock_drift_ms(ttl, drift);
}

enum redlock_status redlock_decide(int nnodes, int ok, int busy, int failed,
                                   int64_t validity)
{
    int quorum = redlock_quorum(nnodes);

    if (ok >= quorum && validity > 0)
        return REDLOCK_OK;
    /* So many nodes hold another value that no quorum was possible even
     * had every failed node said yes: the resource is taken. */
    if (busy > nnodes - quorum)
        return REDLOCK_BUSY;
    if (ok >= quorum || failed > 0)
        return REDLOCK_UNAVAILABLE;
    return REDLOCK_BUSY;
}

void redlock_fence_plan(const struct redlock_node_vote *v, int n,
                        uint64_t fence, int64_t validity, bool may_raise,
                        struct redlock_fence_plan *plan, bool *raise)
{
    int quorum = redlock_quorum(n);

    memset(plan, 0, sizeof(*plan));
    for (int i = 0; i < n; i++) {
        switch (v[i].vote) {
        case REDLOCK_VOTE_HELD:
            plan->held++;
            if (fence == 0 && v[i].counter > plan->fence)
                plan->fence = v[i].counter;
            break;
        case REDLOCK_VOTE_BUSY:
            plan->busy++;
            break;
        case REDLOCK_VOTE_FAILED:
        default:
            plan->failed++;
            break;
        }
    }
    if (fence != 0)
        plan->fence = fence;
    for (int i = 0; i < n; i++) {
        bool holds = v[i].vote == REDLOCK_VOTE_HELD;
        if (holds && v[i].counter >= plan->fence)
            plan->reached++;
        if (raise)
            raise[i] = holds && v[i].counter < plan->fence;
    }

    if (plan->held < quorum || validity <= 0) {
        plan->step = REDLOCK_STEP_FAIL;
        plan->status = redlock_decide(n, plan->held, plan->busy, plan->failed,
                                      validity);
    } else if (plan->reached >= quorum) {
        plan->step = REDLOCK_STEP_GRANT;
        plan->status = REDLOCK_OK;
    } else if (may_raise) {
        plan->step = REDLOCK_STEP_RAISE;
        plan->status = REDLOCK_OK;
    } else {
        /* A quorum holds the key, but the fence did not reach one. */
        plan->step = REDLOCK_STEP_FAIL;
        plan->status = REDLOCK_UNAVAILABLE;
    }
}

/* Tokens come from the OS random source, read a block at a time: one
 * getrandom per 256 tokens instead of one per LOCK. A block is used once,
 * front to back, and wiped as it is used. */
#define REDLOCK_RANDOM_BLOCK 4096

int redlock_token(char out[REDLOCK_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    static unsigned char pool[REDLOCK_RANDOM_BLOCK];
    static size_t avail;
    enum { RAW = REDLOCK_TOKEN_LEN / 2 };

    if (avail < RAW) {
        size_t got = 0;
        while (got < sizeof(pool)) {
            ssize_t k = getrandom(pool + got, sizeof(pool) - got, 0);
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                avail = 0;
                return -1;
            }
            got += (size_t)k;
        }
        avail = sizeof(pool);
    }
    unsigned char *raw = pool + sizeof(pool) - avail;
    for (size_t i = 0; i < RAW; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    memset(raw, 0, RAW);
    avail -= RAW;
    out[REDLOCK_TOKEN_LEN] = '\0';
    return 0;
}
