/*
 * libredlockd, watching (docs/protocol.md, "Watching a lock"): the
 * resources a handle watches, the EVENT HOLDER lines that say who holds
 * them (each handed to opts.on_holder), WATCH sent again when the handle's
 * session is a new one, and the holder read off STATUS's JSON for
 * redlockd_holder.
 *
 * Watches belong to the session. A resumed session keeps them, and the
 * daemon tells their states again by itself; a new session (after a
 * failover) watches nothing, so rl_settle has rl_watch_again name them
 * all once more. The list is the handle's record of what the application
 * asked for, changed only by WATCH and UNWATCH answered OK. Above the
 * connection (EVENT HOLDER comes up through the handle's hooks), beside the
 * lease table, below the failover that calls rl_watch_again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "redlockd_priv.h"

/* The public header cannot include proto.h; the numbers must agree. */
_Static_assert(REDLOCKD_VALUE_MAX == PROTO_VALUE_LEN_MAX,
               "REDLOCKD_VALUE_MAX is not the largest max_value_len");
_Static_assert(REDLOCKD_VALUE_DEFAULT_MAX == PROTO_VALUE_LEN_DEFAULT,
               "REDLOCKD_VALUE_DEFAULT_MAX is not its default");
_Static_assert(REDLOCKD_NAME_MAX == PROTO_MAX_NAME_LEN,
               "REDLOCKD_NAME_MAX is not HELLO name='s limit");

/* ---- the list ----------------------------------------------------------- */

static bool rl_watched(const struct redlockd *h, const char *resource,
                       size_t *at)
{
    for (size_t i = 0; i < h->nwatches; i++) {
        if (strcmp(h->watches[i], resource) == 0) {
            *at = i;
            return true;
        }
    }
    return false;
}

static int rl_watch_add(struct redlockd *h, const char *resource)
{
    size_t at;
    char **grown;

    if (rl_watched(h, resource, &at))
        return 0;
    if (h->nwatches == h->watches_cap) {
        size_t cap = h->watches_cap ? h->watches_cap * 2 : 8;

        grown = realloc(h->watches, cap * sizeof(*grown));
        if (!grown)
            return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
        h->watches = grown;
        h->watches_cap = cap;
    }
    h->watches[h->nwatches] = strdup(resource);
    if (!h->watches[h->nwatches])
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    h->nwatches++;
    return 0;
}

static void rl_watch_del(struct redlockd *h, const char *resource)
{
    size_t at;

    if (!rl_watched(h, resource, &at))
        return;
    free(h->watches[at]);
    h->watches[at] = h->watches[--h->nwatches];
}

int rl_watch_noted(struct redlockd *h, enum proto_cmd cmd,
                   const char *const *res, size_t n, size_t line_len)
{
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (cmd == PROTO_CMD_WATCH)
            rc = rl_watch_add(h, res[i]);
        else
            rl_watch_del(h, res[i]);
    }
    if (cmd == PROTO_CMD_WATCH && line_len > h->watch_line_max)
        h->watch_line_max = line_len;
    return rc;
}

void rl_watch_free(struct redlockd *h)
{
    for (size_t i = 0; i < h->nwatches; i++)
        free(h->watches[i]);
    free(h->watches);
    h->watches = NULL;
    h->nwatches = h->watches_cap = 0;
}

/* ---- EVENT HOLDER ------------------------------------------------------- */

/* A word of the daemon's into a fixed field (redlockd's own limits make
 * every one fit). */
static void rl_copy(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

static void rl_tell_holder(struct redlockd *h, const struct redlockd_holder *hd)
{
    h->in_callback++;
    h->on_holder(hd, h->ud);
    h->in_callback--;
}

int rl_event_holder(struct redlockd *h, const struct proto_reply *ev)
{
    const char *res = proto_reply_get(ev, "resource");
    const char *held = proto_reply_get(ev, "held");
    const char *mode = proto_reply_get(ev, "mode");
    const char *limit = proto_reply_get(ev, "limit");
    const char *fence = proto_reply_get(ev, "fence");
    const char *foreign = proto_reply_get(ev, "foreign");
    struct redlockd_holder hd;
    uint32_t k;

    if (!h->on_holder)
        return 0;
    memset(&hd, 0, sizeof(hd));
    if (!res || *res == '\0' || strlen(res) > REDLOCKD_RESOURCE_MAX
        || proto_parse_u32(held, rl_len(held), &k) < 0
        || (limit && proto_parse_u32(limit, strlen(limit), &hd.limit) < 0)
        || (fence && proto_parse_u64(fence, strlen(fence), &hd.fence) < 0))
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed EVENT HOLDER");
    strcpy(hd.resource, res);
    hd.held = k;
    hd.foreign = foreign && strcmp(foreign, "1") == 0;
    hd.mode = mode && strcmp(mode, "shared") == 0 ? REDLOCKD_SHARED
                                                  : REDLOCKD_EXCLUSIVE;
    rl_copy(hd.name, sizeof(hd.name), proto_reply_get(ev, "name"));
    rl_copy(hd.daemon, sizeof(hd.daemon), proto_reply_get(ev, "daemon"));
    rl_copy(hd.value, sizeof(hd.value), proto_reply_get(ev, "value"));
    rl_tell_holder(h, &hd);
    return 0;
}

/* ---- a new session ------------------------------------------------------ */

/* "WATCH w[first] w[first+1]..." in h->freq, no longer than a line the
 * daemon took from the application (but always with one name, which a
 * daemon took in such a line): how many names it holds. */
static size_t rl_watch_line(struct redlockd *h, size_t first)
{
    size_t n = 0, len = strlen("WATCH\n");

    rl_req(&h->freq, PROTO_CMD_WATCH);
    for (size_t i = first; i < h->nwatches && n < PROTO_MAX_RESOURCES; i++) {
        size_t more = strlen(h->watches[i]) + 1;

        if (n > 0 && len + more > h->watch_line_max)
            break;
        proto_format_word(&h->freq, h->watches[i]);
        len += more;
        n++;
    }
    proto_format_end(&h->freq);
    return n;
}

/* One line of them: 0 also when the daemon refused it (ERR LIMIT, DENIED:
 * those stay unwatched); -code when the connection is gone. */
static int rl_watch_send(struct redlockd *h, int64_t until)
{
    struct proto_reply r;
    int rc = rl_exchange(h, &h->freq, rl_earlier(until, rl_io_deadline(h, 0)),
                         &r);

    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to WATCH in time");
    if (rc == 0)
        return rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_WATCH);
    return h->fd < 0 ? rc : 0;
}

int rl_watch_again(struct redlockd *h, int64_t until)
{
    size_t i = 0;
    int rc;

    sbuf_reset(&h->freq);
    if (h->nwatches > 0
        && sbuf_try_reserve(&h->freq, h->watch_line_max + RL_REQ_MAX) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    while (i < h->nwatches) {
        i += rl_watch_line(h, i);
        rc = rl_watch_send(h, until);
        if (rc < 0)
            return rc;
    }
    h->rewatch = false;
    return 0;
}

/* ---- STATUS ------------------------------------------------------------- */

static bool rl_json_is(json_t *o, const char *key, const char *want)
{
    const char *s = json_string_value(json_object_get(o, key));

    return s && strcmp(s, want) == 0;
}

/* A count in the JSON (at least 1: the resource is held). */
static unsigned rl_json_count(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;

    return n > 0 && n <= UINT32_MAX ? (unsigned)n : 1;
}

/* What STATUS says of a held resource's holders: a semaphore's slots
 * ("limit", "slots_held"), shared holders, or the exclusive holder
 * ("holder": {"foreign":true}, or its fence, name, daemon and value; null
 * when no one token is on a quorum of nodes). */
static void rl_status_held(json_t *root, struct redlockd_holder *out)
{
    json_t *who = json_object_get(root, "holder");
    json_t *limit = json_object_get(root, "limit");
    json_t *fence = json_object_get(who, "fence");

    out->held = 1;
    if (json_is_integer(limit)) {
        out->limit = (uint32_t)json_integer_value(limit);
        out->held = rl_json_count(root, "slots_held");
    } else if (rl_json_is(root, "mode", "shared")) {
        out->mode = REDLOCKD_SHARED;
        out->held = rl_json_count(root, "shared_holders");
    } else if (json_is_true(json_object_get(who, "foreign"))) {
        out->foreign = 1;
    } else if (json_is_object(who)) {
        out->fence = json_is_integer(fence) && json_integer_value(fence) > 0
                   ? (uint64_t)json_integer_value(fence) : 0;
        rl_copy(out->name, sizeof(out->name),
                json_string_value(json_object_get(who, "name")));
        rl_copy(out->daemon, sizeof(out->daemon),
                json_string_value(json_object_get(who, "daemon")));
        rl_copy(out->value, sizeof(out->value),
                json_string_value(json_object_get(who, "value")));
    }
}

int rl_holder_from_status(struct redlockd *h, const char *json,
                          const char *resource, struct redlockd_holder *out)
{
    json_t *root = json_loads(json, 0, NULL);

    if (!json_is_object(root)) {
        json_decref(root);
        return rl_fail(h, REDLOCKD_E_PROTO,
                       "STATUS did not answer with a JSON object");
    }
    memset(out, 0, sizeof(*out));
    rl_copy(out->resource, sizeof(out->resource), resource);
    if (json_is_true(json_object_get(root, "held")))
        rl_status_held(root, out);
    json_decref(root);
    return 0;
}
