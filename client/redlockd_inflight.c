/*
 * libredlockd, several requests in flight on one handle: a submission
 * goes out tagged ("#<id> LOCK ...", docs/protocol.md "Tagged requests")
 * and is kept here until its answer comes; the answer is taken wherever
 * the connection's reader meets it (redlockd_conn.c hands every tagged
 * line here through the handle's hooks: rl_inflight_line), its meaning
 * for the lease table applied at once (with the request lines and answers
 * of redlockd_calls.c), and the result queued until redlockd_complete
 * hands it out.
 *
 * While submissions are in flight, a blocking call's request is tagged
 * too (rl_inflight_call, the hooks' call_line): an untagged one would be a
 * barrier behind them all, and its reply must be told from theirs.
 *
 * The tags are the handle's own counter, in decimal; the daemon refuses a
 * tag still in flight, and ours never repeat.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlockd_priv.h"

struct rl_sub {
    uint64_t id;
    enum redlockd_op op;
    int64_t sent_ms;            /* a grant's deadline counts from it */
    uint32_t ttl;               /* EXTEND */
    bool renew;                 /* LOCK */
    size_t n;                   /* resources named */
    const char **names;         /* n names, in the same allocation */
    /* The answer, once it came. */
    int rc;
    struct redlockd_grant grant;
    int64_t validity;
    struct redlockd_error err;
    struct rl_sub *next;        /* in the queue of answered ones */
};

/* ---- the records -------------------------------------------------------- */

/* A record naming n resources, with room for them. NULL: out of memory. */
static struct rl_sub *rl_sub_new(enum redlockd_op op,
                                 const char *const *resources, size_t n)
{
    size_t bytes = sizeof(struct rl_sub) + n * sizeof(char *);
    struct rl_sub *s;
    char *p;

    for (size_t i = 0; i < n; i++)
        bytes += strlen(resources[i]) + 1;
    s = calloc(1, bytes);
    if (!s)
        return NULL;
    s->op = op;
    s->n = n;
    s->names = (const char **)(s + 1);
    p = (char *)(s->names + n);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(resources[i]) + 1;

        memcpy(p, resources[i], len);
        s->names[i] = p;
        p += len;
    }
    return s;
}

static void rl_sub_queue(struct redlockd *h, struct rl_sub *s)
{
    s->next = NULL;
    if (h->done_tail)
        h->done_tail->next = s;
    else
        h->done_head = s;
    h->done_tail = s;
    h->ndone++;
    h->nsettled++;
}

/* Take the record of tag id out of the table: NULL when none has it. */
static struct rl_sub *rl_sub_take(struct redlockd *h, uint64_t id)
{
    for (size_t i = 0; i < h->nsubs; i++) {
        struct rl_sub *s = h->subs[i];

        if (s->id == id) {
            h->subs[i] = h->subs[--h->nsubs];
            return s;
        }
    }
    return NULL;
}

/* Until its UNLOCK is answered, a lease missing from a refresh is one its
 * owner let go, not one to report lost. */
static void rl_sub_releasing(struct redlockd *h, const struct rl_sub *s,
                             bool on)
{
    struct rl_lease *l;

    if (s->op != REDLOCKD_OP_UNLOCK)
        return;
    l = rl_lease_find(h, s->names[0]);
    if (l && (!on || !l->lost))
        l->releasing = on;
}

void rl_inflight_free(struct redlockd *h)
{
    struct rl_sub *s, *next;

    for (size_t i = 0; i < h->nsubs; i++)
        free(h->subs[i]);
    free(h->subs);
    for (s = h->done_head; s; s = next) {
        next = s->next;
        free(s);
    }
    h->subs = NULL;
    h->nsubs = h->subs_cap = h->ndone = 0;
    h->done_head = h->done_tail = NULL;
    sbuf_deinit(&h->treq);
}

/* ---- tags --------------------------------------------------------------- */

/* "#<id> " and the line of b in h->treq; -code when out of memory. */
static int rl_tagged(struct redlockd *h, const struct sbuf *b, uint64_t id)
{
    char tag[RL_TAG_ROOM];
    int len = snprintf(tag, sizeof(tag), "%" PRIu64, id);

    sbuf_reset(&h->treq);
    if (sbuf_try_reserve(&h->treq, b->len + RL_TAG_ROOM) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    proto_format_tag(&h->treq, tag, (size_t)len);
    sbuf_append(&h->treq, b->data, b->len);
    return 0;
}

const struct sbuf *rl_inflight_call(struct redlockd *h, const struct sbuf *b)
{
    h->call_id = 0;
    if (h->nsubs == 0)
        return b;
    if (rl_tagged(h, b, ++h->next_id) < 0)
        return NULL;
    h->call_id = h->next_id;
    return &h->treq;
}

/* The id a reply's tag spells, or 0 (never a tag of ours). */
static uint64_t rl_tag_id(const char *tag, size_t len)
{
    uint64_t id;

    if (proto_parse_u64(tag, len, &id) < 0)
        return 0;
    return id;
}

/* ---- answers ------------------------------------------------------------ */

/* What the answer r means, applied as its blocking call would (the lease
 * table, deadlines from when the request was sent); the result kept in s.
 * Not an event: nothing here calls on_lost. */
static void rl_settle(struct redlockd *h, struct rl_sub *s,
                      const struct proto_reply *r)
{
    struct redlockd_error saved = h->err;
    int64_t sent = h->sent_ms;
    int rc = 0;

    h->sent_ms = s->sent_ms;
    h->err.code = 0;
    h->err.msg[0] = '\0';
    if (r->kind == PROTO_REPLY_ERR)
        rc = rl_reply_error(r, &h->err);
    switch (s->op) {
    case REDLOCKD_OP_LOCK:
        if (rc == 0)
            rc = rl_lock_granted(h, r, s->names, s->n, s->renew, &s->grant);
        break;
    case REDLOCKD_OP_UNLOCK:
        rl_sub_releasing(h, s, false);
        if (rc == 0)
            rc = rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_UNLOCK);
        rc = rl_unlock_answered(h, s->names[0], rc);
        break;
    case REDLOCKD_OP_EXTEND:
        rc = rl_extend_answered(h, r, rc, s->names[0], s->ttl, &s->validity);
        break;
    }
    s->rc = rc;
    if (rc < 0)
        s->err = h->err;
    /* A failure that cost the connection stays the handle's last error;
     * the daemon's refusal of one submission is only its own. */
    if (h->fd >= 0)
        h->err = saved;
    h->sent_ms = sent;
}

int rl_inflight_line(struct redlockd *h, char *line, size_t len)
{
    const char *sp = memchr(line, ' ', len);
    size_t tag_len = sp ? (size_t)(sp - line) - 1 : 0;
    uint64_t id = rl_tag_id(line + 1, tag_len);
    struct proto_reply r;
    struct rl_sub *s;
    char shown[48];

    /* The blocking call's own is left as it is, for it to parse. */
    if (h->call_id != 0 && id == h->call_id)
        return 0;
    s = rl_sub_take(h, id);
    if (!s) {
        rl_quote(shown, sizeof(shown), line, len);
        return rl_fatal(h, REDLOCKD_E_PROTO,
                        "an answer to a request nobody sent: \"%s\"", shown);
    }
    if (proto_reply_parse(line, len, &r) < 0) {
        rl_quote(shown, sizeof(shown), line, len);
        s->rc = rl_fatal(h, REDLOCKD_E_PROTO, "unparseable reply: \"%s\"",
                         shown);
        s->err = h->err;
    } else {
        rl_settle(h, s, &r);
    }
    rl_sub_queue(h, s);
    /* Its answer made no sense: the connection is gone, and that failure
     * is the reader's too. */
    return h->fd >= 0 ? 1 : -h->err.code;
}

void rl_inflight_broke(struct redlockd *h)
{
    while (h->nsubs > 0) {
        struct rl_sub *s = h->subs[--h->nsubs];

        rl_sub_releasing(h, s, false);
        s->rc = rl_seterr(&s->err, REDLOCKD_E_IO,
                          "the connection broke with %s in flight (%.160s): "
                          "its outcome is unknown, taken as failed",
                          proto_cmd_name(s->op == REDLOCKD_OP_LOCK
                                             ? PROTO_CMD_LOCK
                                         : s->op == REDLOCKD_OP_UNLOCK
                                             ? PROTO_CMD_UNLOCK
                                             : PROTO_CMD_EXTEND),
                          h->dead);
        rl_sub_queue(h, s);
    }
}

/* ---- the public calls --------------------------------------------------- */

/* Send the request line in h->req, tagged, as the record s: 0, or -code
 * (s freed). */
static int rl_submit(struct redlockd *h, struct rl_sub *s, uint64_t *id)
{
    int rc;

    if (h->nsubs == h->subs_cap) {
        size_t cap = h->subs_cap ? h->subs_cap * 2 : 16;
        struct rl_sub **grown = realloc(h->subs, cap * sizeof(*grown));

        if (!grown) {
            free(s);
            return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
        }
        h->subs = grown;
        h->subs_cap = cap;
    }
    s->id = ++h->next_id;
    rc = rl_tagged(h, &h->req, s->id);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->sent_ms = rl_now_ms();
    rc = rl_send_all(h, h->treq.data, h->treq.len, rl_io_deadline(h, 0));
    if (rc < 0) {
        free(s);
        return rc;
    }
    h->subs[h->nsubs++] = s;
    rl_sub_releasing(h, s, true);
    if (id)
        *id = s->id;
    return 0;
}

/* Room for one more, before anything else. */
static int rl_submit_begin(struct redlockd *h, uint64_t *id)
{
    int rc = rl_begin_plain(h);

    if (id)
        *id = 0;
    if (rc == 0 && h->nsubs + h->ndone >= REDLOCKD_INFLIGHT_MAX)
        rc = rl_fail(h, REDLOCKD_E_LIMIT,
                     "%d requests in flight: hand some out with "
                     "redlockd_complete first", REDLOCKD_INFLIGHT_MAX);
    return rc;
}

int redlockd_submit_lock(struct redlockd *h, const char *const *resources,
                         size_t n, const struct redlockd_lock_opts *opts,
                         uint64_t *id)
{
    static const struct redlockd_lock_opts defaults;
    const struct redlockd_lock_opts *o = opts ? opts : &defaults;
    struct rl_sub *s;
    int rc = rl_submit_begin(h, id);

    if (rc == 0)
        rc = rl_lock_line(h, resources, n, o);
    if (rc < 0)
        return rc;
    s = rl_sub_new(REDLOCKD_OP_LOCK, resources, n);
    if (!s)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    s->renew = !o->no_renew;
    return rl_submit(h, s, id);
}

int redlockd_submit_unlock(struct redlockd *h, const char *resource,
                           uint64_t *id)
{
    struct rl_sub *s;
    int rc = rl_submit_begin(h, id);

    if (rc == 0)
        rc = rl_unlock_line(h, resource);
    if (rc < 0)
        return rc;
    s = rl_sub_new(REDLOCKD_OP_UNLOCK, &resource, 1);
    if (!s)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return rl_submit(h, s, id);
}

int redlockd_submit_extend(struct redlockd *h, const char *resource,
                           uint32_t ttl_ms, uint64_t *id)
{
    struct rl_sub *s;
    int rc = rl_submit_begin(h, id);

    if (rc == 0)
        rc = rl_extend_line(h, resource, ttl_ms, NULL);
    if (rc < 0)
        return rc;
    s = rl_sub_new(REDLOCKD_OP_EXTEND, &resource, 1);
    if (!s)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    s->ttl = ttl_ms;
    return rl_submit(h, s, id);
}

/* The oldest answer into *done. */
static void rl_hand_out(struct redlockd *h, struct redlockd_done *done)
{
    struct rl_sub *s = h->done_head;

    h->done_head = s->next;
    if (!h->done_head)
        h->done_tail = NULL;
    h->ndone--;
    memset(done, 0, sizeof(*done));
    done->id = s->id;
    done->op = s->op;
    done->rc = s->rc;
    snprintf(done->resource, sizeof(done->resource), "%s", s->names[0]);
    done->grant = s->grant;
    done->validity = s->validity;
    done->err = s->err;
    free(s);
}

int redlockd_complete(struct redlockd *h, int timeout_ms,
                      struct redlockd_done *done)
{
    int64_t until = rl_deadline(timeout_ms);
    int rc = rl_begin_plain(h);

    if (rc < 0)
        return rc;
    while (!h->done_head && h->nsubs > 0 && h->fd >= 0) {
        rc = rl_read_until(h, until, &h->nsettled);
        if (rc == 0)
            break;
        /* A failure that cost the connection answered every
         * submission (rl_inflight_broke); one that did not is the
         * call's own. */
        if (rc < 0 && h->fd >= 0)
            return rc;
    }
    if (!h->done_head)
        return 0;
    rl_hand_out(h, done);
    return 1;
}

size_t redlockd_inflight(const struct redlockd *h)
{
    return h->nsubs + h->ndone;
}
