/*
 * session, its requests in flight (session_priv.h): the record of each
 * request read and not answered yet (struct sreq, on s->reqs in the order
 * read), and the rules of when it may start (protocol.md, "Tagged
 * requests"):
 *
 *   - a tagged request ("#<tag> LOCK ...") may start as soon as it is
 *     read, unless a request read before it and not yet answered names
 *     one of its resources: then it waits for it (the resource's queue in
 *     s->order, one struct sreq_pos per resource it names);
 *   - an untagged request runs alone: after every request read before it
 *     was answered, and the connection gives no more lines (conn_pause)
 *     until it is answered, so no request read after it starts before;
 *   - at most limits.max_inflight tagged requests are unanswered at a
 *     time: beyond, the connection is paused until some are answered (the
 *     client's bytes wait in the kernel, as for max_pipeline);
 *   - a tag still in use is refused (session_cmd.c asks here).
 *
 * A request whose turn comes, when the one before it leaves its queues
 * (session_req_unlink), is put on s->ready; session_cmd.c starts what is
 * ready, in one loop. This file keeps the records and their order; it
 * runs nothing and answers nothing.
 */
#include "session_priv.h"

#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "conf.h"
#include "conn.h"
#include "mem.h"

/* SESSIONS lists at most this many of a session's requests in flight (it
 * counts them all): its reply stays far below limits.max_output_bytes. */
#define SESSION_INFLIGHT_SHOWN 16

struct session_to session_req_to(const struct sreq *q)
{
    return (struct session_to){ q->s, q->tagged ? q->tag : NULL,
                                q->tag_len };
}

size_t session_req_resources(const struct proto_request *r,
                             const char *const **res, const size_t **len)
{
    switch (r->cmd) {
    case PROTO_CMD_LOCK:
    case PROTO_CMD_UNLOCK:
    case PROTO_CMD_ADOPT:
        *res = r->args;
        *len = r->args_len;
        return r->nargs;
    case PROTO_CMD_EXTEND:
    case PROTO_CMD_STATUS:
    case PROTO_CMD_FORCEUNLOCK:
        *res = &r->arg;
        *len = &r->arg_len;
        return r->arg ? 1 : 0;
    default:
        return 0;
    }
}

bool session_req_queued(const struct session *s, const char *const *res,
                        const size_t *len, size_t n)
{
    for (size_t i = 0; s->order && i < n; i++)
        if (hmap_get(s->order, res[i], len[i]))
            return true;
    return false;
}

bool session_req_tag_in_use(const struct session *s, const char *tag,
                            size_t len)
{
    return s->tags && hmap_get(s->tags, tag, len);
}

/* q's place in the queue of each resource it names. */
static void sreq_enqueue(struct sreq *q, const char *const *res,
                         const size_t *len)
{
    struct session *s = q->s;

    if (q->npos && !s->order) {
        s->order = mem_alloc(sizeof(*s->order));
        hmap_init(s->order);
    }
    for (size_t i = 0; i < q->npos; i++) {
        struct hmap_node *n = hmap_get(s->order, res[i], len[i]);
        struct sres *r;
        if (n) {
            r = container_of(n, struct sres, node);
        } else {
            r = mem_alloc(sizeof(*r) + len[i] + 1);
            memcpy(r->name, res[i], len[i]);
            list_init(&r->fifo);
            hmap_put(s->order, &r->node, r->name, len[i]);
        }
        q->pos[i].r = r;
        q->pos[i].q = q;
        list_push_tail(&r->fifo, &q->pos[i].link);
    }
}

struct sreq *session_req_new(struct session *s, const struct proto_request *r,
                             const char *line, size_t len)
{
    const char *const *res = NULL;
    const size_t *rlen = NULL;
    size_t n = session_req_resources(r, &res, &rlen);
    struct sreq *q = mem_alloc(sizeof(*q) + n * sizeof(q->pos[0]) +
                               (line ? len + 1 : 0));

    q->s = s;
    q->cmd = r->cmd;
    q->npos = n;
    list_init(&q->rlink);
    if (line) {
        q->line = (char *)&q->pos[n];
        memcpy(q->line, line, len);
        q->linelen = len;
    }
    if (r->tag) {
        q->tagged = true;
        q->tag_len = r->tag_len;
        memcpy(q->tag, r->tag, r->tag_len);
        if (!s->tags) {
            s->tags = mem_alloc(sizeof(*s->tags));
            hmap_init(s->tags);
        }
        hmap_put(s->tags, &q->tnode, q->tag, q->tag_len);
        s->ntagged++;
    }
    list_push_tail(&s->reqs, &q->link);
    sreq_enqueue(q, res, rlen);
    return q;
}

/* May q run now? An untagged one when it is the only one left; a tagged
 * one when it is first in the queue of each resource it names. */
static bool sreq_may_start(const struct sreq *q)
{
    if (!q->tagged)
        return list_first(&q->s->reqs) == &q->link;
    for (size_t i = 0; i < q->npos; i++)
        if (list_first(&q->pos[i].r->fifo) != &q->pos[i].link)
            return false;
    return true;
}

static void sreq_ready(struct sreq *q)
{
    if (!q->running && !list_linked(&q->rlink) && sreq_may_start(q))
        list_push_tail(&q->s->ready, &q->rlink);
}

void session_req_unlink(struct sreq *q)
{
    struct session *s = q->s;

    q->unlinked = true;
    list_remove(&q->link);
    if (list_linked(&q->rlink))
        list_remove(&q->rlink);
    if (q->tagged) {
        hmap_del(s->tags, &q->tnode);
        s->ntagged--;
    }
    for (size_t i = 0; i < q->npos; i++) {
        struct sres *r = q->pos[i].r;
        list_remove(&q->pos[i].link);
        if (list_empty(&r->fifo)) {
            hmap_del(s->order, &r->node);
            free(r);
        } else {
            sreq_ready(list_entry(list_first(&r->fifo), struct sreq_pos,
                                  link)->q);
        }
    }
    /* An untagged request waits for everything before it. */
    struct list *first = list_first(&s->reqs);
    if (first)
        sreq_ready(list_entry(first, struct sreq, link));
}

void session_req_free(struct sreq *q)
{
    free(q->unlock_lost);
    free(q);
}

/* Lines wait while an untagged request is unanswered (it runs alone), or
 * while max_inflight tagged ones are. */
void session_req_flow(struct session *s)
{
    struct list *last = list_last(&s->reqs);
    bool barrier = last && !list_entry(last, struct sreq, link)->tagged;
    bool full = s->ntagged >= sessions.conf->limits.max_inflight;
    bool pause = s->conn && (barrier || full);

    if (pause == s->paused || !s->conn)
        return;
    s->paused = pause;
    if (pause)
        conn_pause(s->conn);
    else
        conn_resume(s->conn);
}

bool session_req_busy(const struct session *s)
{
    return !list_empty(&s->reqs);
}

/* The connection leaves s (closed, detached, taken over): its requests in
 * flight are withdrawn (their answers will not come: lockmgr's owner was
 * cancelled), what it was told goes with it. */
void session_req_withdraw(struct session *s)
{
    struct list *p;

    timer_stop(&s->auth_timer);
    s->auth_q = NULL;
    while ((p = list_first(&s->reqs))) {
        struct sreq *q = list_entry(p, struct sreq, link);
        session_req_unlink(q);
        if (q->in_run)
            q->answered = true;     /* its sreq_run frees it */
        else
            session_req_free(q);
    }
    list_init(&s->ready);
    if (s->order) {
        hmap_deinit(s->order);
        free(s->order);
        s->order = NULL;
    }
    if (s->tags) {
        hmap_deinit(s->tags);
        free(s->tags);
        s->tags = NULL;
    }
    s->paused = false;
}

/* SESSIONS: s's requests in flight (their count, and the first few). */
void session_req_json(const struct session *s, json_t *j)
{
    json_t *arr = json_array();
    uint64_t now = uv_hrtime();
    size_t n = 0;
    struct list *p;

    list_foreach(p, &s->reqs) {
        const struct sreq *q = list_entry(p, struct sreq, link);
        json_t *e;
        if (++n > SESSION_INFLIGHT_SHOWN)
            continue;
        e = json_pack("{s:s, s:b}", "command", proto_cmd_name(q->cmd),
                      "running", q->running);
        if (q->tagged)
            json_object_set_new(e, "tag", json_stringn(q->tag, q->tag_len));
        if (q->npos)
            json_object_set_new(e, "resource",
                                json_string(q->pos[0].r->name));
        if (q->running && q->started_ns)
            json_object_set_new(e, "ms", json_integer(
                (json_int_t)((now - q->started_ns) / 1000000)));
        json_array_append_new(arr, e);
    }
    json_object_set_new(j, "inflight", json_integer((json_int_t)n));
    json_object_set_new(j, "requests", arr);
}

struct sreq *session_serve_later(struct session_serve *v)
{
    if (!v->q) {
        v->q = session_req_new(v->t.s, v->r, NULL, 0);
        v->q->in_run = true;
    }
    v->q->running = true;
    v->q->started_ns = uv_hrtime();
    return v->q;
}
