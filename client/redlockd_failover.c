/*
 * libredlockd, following the leases across connections: the options and
 * the list of servers, the handshake, what a dropped connection means for
 * the session (the hooks' dropped, after the submissions in flight), and
 * reconnecting (docs/protocol.md, "Additions, part 2"). Above the
 * connection, the leases and the watches; the handle (redlockd_handle.c)
 * makes the first connection with rl_connect_first, and every call
 * (redlockd_calls.c) reconnects through rl_recover.
 *
 * A handle's session asks for HELLO detach=, so it outlives a lost
 * connection on its daemon for that long; the daemon keeps renewing its
 * leases meanwhile. When the connection breaks, the handle reconnects
 * inside the next blocking call, with a pause between rounds that doubles
 * from reconnect_min_ms to reconnect_max_ms:
 *
 *   - to the daemon it was on, HELLO resume=<session> secret=<hex>: the
 *     same session, with its leases; a LOCKS round then confirms them (and
 *     releases what the session holds that the application does not);
 *   - to any server (round robin, that daemon again after ERR NOSESSION:
 *     a restarted daemon knows no sessions) a new session, and one ADOPT
 *     per grant (the resources of one multi-resource LOCK go together,
 *     with their token): the same lease, the same fence, a new token.
 *
 * Meanwhile a lease is unconfirmed; its deadline still holds, since its
 * keys outlive it on the nodes. One whose deadline passes before it is
 * confirmed again is never adopted: it is lost ("deadline"), and one that
 * ADOPT refuses is lost too ("adopt"). The wait is bounded by the I/O
 * timeout, the earliest lease deadline and the caller's own timeout, so
 * that a caller can stop its work at a deadline; what is left is taken up
 * again by the next call.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redlockd_priv.h"

/* An ADOPT names one grant's resources: at most the daemon's max_multi. */
#define RL_ADOPT_MAX PROTO_MAX_RESOURCES

const char *redlockd_server(const struct redlockd *h)
{
    return h->nservers > 0 ? h->servers[h->cur].text : "";
}

/* ---- options and servers ------------------------------------------------ */

static int rl_dup(char **dst, const char *src)
{
    free(*dst);
    *dst = NULL;
    if (!src)
        return 0;
    *dst = strdup(src);
    return *dst ? 0 : -REDLOCKD_E_NOMEM;
}

int rl_keep_opts(struct redlockd *h, const struct redlockd_opts *o)
{
    h->io_timeout_ms = o->io_timeout_ms ? o->io_timeout_ms : RL_IO_TIMEOUT_MS;
    h->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms
                                                  : RL_CONNECT_TIMEOUT_MS;
    h->keepalive_ms = o->keepalive_ms;
    h->detach_ms = o->detach_ms == 0 ? RL_DETACH_MS
                 : o->detach_ms < 0 ? 0 : o->detach_ms;
    h->reconnect_min_ms = o->reconnect_min_ms > 0 ? o->reconnect_min_ms
                                                  : RL_RECONNECT_MIN_MS;
    h->reconnect_max_ms = o->reconnect_max_ms == 0 ? RL_RECONNECT_MAX_MS
                                                   : o->reconnect_max_ms;
    if (h->reconnect_max_ms >= 0 && h->reconnect_max_ms < h->reconnect_min_ms)
        h->reconnect_max_ms = h->reconnect_min_ms;
    h->on_lost = o->on_lost;
    h->on_holder = o->on_holder;
    h->ud = o->ud;
    if (rl_dup(&h->name, o->name) < 0 || rl_dup(&h->password, o->password) < 0
        || rl_dup(&h->user, o->user) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return 0;
}

void rl_free_opts(struct redlockd *h)
{
    free(h->name);
    free(h->password);
    free(h->user);
    free(h->servers);
    rl_tls_teardown(h);
    h->name = h->password = h->user = NULL;
    h->servers = NULL;
    h->nservers = 0;
}

/* One more server; -code with err set. */
static int rl_add_server(struct redlockd_addr *list, size_t *n,
                         const char *text, struct redlockd_error *err)
{
    if (*n == REDLOCKD_SERVERS_MAX)
        return rl_seterr(err, REDLOCKD_E_INVALID, "at most %d servers",
                         REDLOCKD_SERVERS_MAX);
    return redlockd_addr_parse(text, &list[(*n)++], err);
}

/* $REDLOCKD_SERVER: one address, or several separated by commas. */
static int rl_env_servers(struct redlockd_addr *list, size_t *n,
                          const char *env, struct redlockd_error *err)
{
    char one[PROTO_ADDR_TEXT_SIZE + 64];
    const char *p = env, *comma;
    int rc = 0;

    while (rc == 0) {
        comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) - 1
                                                 ? len : sizeof(one) - 1), p);
        rc = rl_add_server(list, n, one, err);
        if (!comma)
            break;
        p = comma + 1;
    }
    return rc;
}

/* The servers of the options: servers[] wins, then server, then
 * $REDLOCKD_SERVER, then REDLOCKD_DEFAULT_SERVER. */
static int rl_parse_servers(const struct redlockd_opts *o,
                            struct redlockd_addr *list, size_t *n,
                            struct redlockd_error *err)
{
    const char *env = getenv(REDLOCKD_SERVER_ENV);
    int rc = 0;

    *n = 0;
    if (o->servers && o->nservers > 0) {
        for (size_t i = 0; rc == 0 && i < o->nservers; i++)
            rc = rl_add_server(list, n, o->servers[i], err);
        return rc;
    }
    if (o->server)
        return rl_add_server(list, n, o->server, err);
    if (env && *env != '\0')
        return rl_env_servers(list, n, env, err);
    return rl_add_server(list, n, REDLOCKD_DEFAULT_SERVER, err);
}

/* Checked before anything is resolved or connected. */
int rl_check_servers(const struct redlockd_opts *o, struct redlockd_error *err)
{
    struct redlockd_addr list[REDLOCKD_SERVERS_MAX];
    size_t n;

    return rl_parse_servers(o, list, &n, err);
}

int rl_keep_servers(struct redlockd *h, const struct redlockd_opts *o,
                    struct redlockd_error *err)
{
    struct redlockd_addr list[REDLOCKD_SERVERS_MAX];
    size_t n;
    int rc = rl_parse_servers(o, list, &n, err);

    if (rc < 0)
        return rc;
    h->servers = malloc(n * sizeof(*h->servers));
    if (!h->servers)
        return rl_seterr(err, REDLOCKD_E_NOMEM, "out of memory");
    memcpy(h->servers, list, n * sizeof(*h->servers));
    h->nservers = n;
    h->cur = 0;
    return 0;
}

/* ---- the session -------------------------------------------------------- */

/* No session to resume any more: every lease wants an ADOPT. */
static void rl_session_forget(struct redlockd *h)
{
    h->secret[0] = '\0';
    h->detachable = false;
    h->resumed = false;
    for (size_t i = 0; i < h->nleases; i++)
        h->leases[i].attached = false;
}

/* Called by rl_drop, the connection closed. A handle that does not
 * reconnect has lost everything; one that does keeps its leases
 * unconfirmed, for a resume or an ADOPT. */
void rl_after_drop(struct redlockd *h)
{
    h->resumed = false;
    if (!rl_can_reconnect(h)) {
        rl_tell_lost(h, NULL, 0, "disconnected");
        return;
    }
    rl_lease_unconfirm(h);
    if (!h->detachable || h->closing_kept || h->shutdown_seen)
        rl_session_forget(h);
}

/* ---- HELLO and AUTH ----------------------------------------------------- */

static void rl_copy_word(char *dst, size_t sz, const char *src)
{
    snprintf(dst, sz, "%s", src ? src : "");
}

static bool rl_is_secret(const char *s)
{
    if (!s || strlen(s) != PROTO_SECRET_LEN)
        return false;
    for (; *s != '\0'; s++) {
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')
              || (*s >= 'A' && *s <= 'F')))
            return false;
    }
    return true;
}

/* The reply to HELLO: who we talk to. */
static int rl_hello_reply(struct redlockd *h, const struct proto_reply *r)
{
    const char *proto = proto_reply_get(r, "proto");
    const char *nodes = proto_reply_get(r, "nodes");
    const char *quorum = proto_reply_get(r, "quorum");
    uint32_t n;

    if (rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_HELLO) < 0)
        return -REDLOCKD_E_PROTO;
    if (proto && strcmp(proto, "1") != 0)
        return rl_fatal(h, REDLOCKD_E_PROTO,
                        "the daemon speaks protocol %.16s, this library 1",
                        proto);
    rl_copy_word(h->info.session, sizeof(h->info.session),
                 proto_reply_get(r, "session"));
    rl_copy_word(h->info.server, sizeof(h->info.server),
                 proto_reply_get(r, "server"));
    if (proto_parse_u32(nodes, rl_len(nodes), &n) == 0)
        h->info.nodes = n;
    if (proto_parse_u32(quorum, rl_len(quorum), &n) == 0)
        h->info.quorum = n;
    return 0;
}

/* A new session on the current server: the one before (if any) is no
 * longer ours to resume, and holds nothing of this handle's, nor watches
 * anything. With detach=, the secret that resumes the new one. */
static void rl_session_new(struct redlockd *h, const struct proto_reply *r,
                           bool detach)
{
    const char *secret = proto_reply_get(r, "secret");

    rl_session_forget(h);
    h->rewatch = h->nwatches > 0;
    h->detachable = detach && rl_is_secret(secret);
    rl_copy_word(h->secret, sizeof(h->secret), h->detachable ? secret : NULL);
    h->session_server = h->cur;
}

/* Send one HELLO: fresh (with detach= or not) or resuming the session. */
static int rl_hello_send(struct redlockd *h, bool detach, bool resume,
                         int64_t deadline, struct proto_reply *r)
{
    struct sbuf *b = rl_req(&h->freq, PROTO_CMD_HELLO);
    int rc;

    proto_format_opt_u64(b, PROTO_OPT_PROTO, PROTO_VERSION);
    if (h->name)
        proto_format_opt_str(b, PROTO_OPT_NAME, h->name);
    if (h->keepalive_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_KEEPALIVE, h->keepalive_ms);
    if (detach)
        proto_format_opt_u64(b, PROTO_OPT_DETACH, (uint64_t)h->detach_ms);
    if (resume) {
        proto_format_opt_str(b, PROTO_OPT_RESUME, h->info.session);
        proto_format_opt_str(b, PROTO_OPT_SECRET, h->secret);
    }
    proto_format_end(b);
    rc = rl_exchange(h, b, rl_earlier(deadline, rl_io_deadline(h, 0)), r);
    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to HELLO from %s "
                        "in time", redlockd_server(h));
    return rc;
}

/*
 * A new session. detach= is asked for when the handle can come back to
 * it; a daemon that refuses it (ERR ARG: one older than detach=, or with
 * limits.max_detach_ms 0 or below our detach_ms) gets a plain HELLO, and
 * the handle then lives without resume: on a lost connection the daemon
 * releases the session's leases, so they are lost with it.
 *
 * An ERR ARG that the daemon closes the connection after refused the
 * connection, not detach=: a plain client on a tls:// port reads "ERR ARG
 * this port speaks TLS: ..." as the reply to its first line. When the
 * plain HELLO then finds the connection closed, that refusal is the
 * error, not the close that hid it.
 */
static int rl_hello_fresh(struct redlockd *h, int64_t deadline)
{
    bool detach = rl_can_reconnect(h) && h->detach_ms > 0;
    struct redlockd_error refused;
    struct proto_reply r;
    int rc;

    rc = rl_hello_send(h, detach, false, deadline, &r);
    if (rc == -REDLOCKD_E_ARG && detach) {
        refused = h->err;
        detach = false;
        rc = rl_hello_send(h, false, false, deadline, &r);
        if (rc == -REDLOCKD_E_CLOSED && h->fd < 0) {
            h->err = refused;
            snprintf(h->dead, sizeof(h->dead), "%s", refused.msg);
            return -REDLOCKD_E_ARG;
        }
    }
    if (rc == 0)
        rc = rl_hello_reply(h, &r);
    if (rc == 0)
        rl_session_new(h, &r, detach);
    return rc;
}

static int rl_auth(struct redlockd *h, int64_t deadline)
{
    struct proto_reply r;
    int rc;

    sbuf_reset(&h->freq);
    /* AUTH [user] password */
    proto_format_cmd(&h->freq, PROTO_CMD_AUTH);
    if (h->user)
        proto_format_word(&h->freq, h->user);
    proto_format_word(&h->freq, h->password);
    proto_format_end(&h->freq);
    rc = rl_exchange(h, &h->freq, rl_earlier(deadline, rl_io_deadline(h, 0)),
                     &r);
    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to AUTH in time");
    if (rc == 0)
        rc = rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_AUTH);
    return rc;
}

int rl_handshake(struct redlockd *h, int64_t deadline)
{
    int rc = rl_hello_fresh(h, deadline);

    if (rc == 0 && h->password)
        rc = rl_auth(h, deadline);
    if (rc == 0)
        rc = rl_drain_events(h);
    return rc;
}

/* HELLO resume=: the same session, which keeps its authentication. */
static int rl_hello_resume(struct redlockd *h, int64_t deadline)
{
    struct proto_reply r;
    int rc = rl_hello_send(h, false, true, deadline, &r);

    if (rc == 0)
        rc = rl_hello_reply(h, &r);
    if (rc == 0)
        h->resumed = true;
    return rc;
}

/* ---- attaching to a server ---------------------------------------------- */

/* A failed attempt: its connection (if any) goes, leaving the session as
 * it was. */
static int rl_attempt_failed(struct redlockd *h, int rc)
{
    if (h->fd >= 0) {
        rl_close_fd(h);
        snprintf(h->dead, sizeof(h->dead), "%s", h->err.msg);
    }
    return rc;
}

/* Connect to server s and resume the session there, or start a new one. */
static int rl_attach_one(struct redlockd *h, size_t s, int64_t until)
{
    int64_t by = rl_earlier(until, rl_deadline(h->connect_timeout_ms));
    int rc;

    h->cur = s;
    rc = rl_connect(h, &h->servers[s], by);
    if (rc < 0)
        return rc;
    if (h->secret[0] && h->session_server == s) {
        rc = rl_hello_resume(h, by);
        if (rc == 0)
            return rl_drain_events(h);
        if (rc != -REDLOCKD_E_NOSESSION)
            return rl_attempt_failed(h, rc);
    }
    rc = rl_handshake(h, by);
    return rc < 0 ? rl_attempt_failed(h, rc) : 0;
}

static bool rl_passed(int64_t until)
{
    return until >= 0 && rl_now_ms() >= until;
}

/* One round: every server once, from the current one on. */
static int rl_attach(struct redlockd *h, int64_t until)
{
    size_t start = h->cur;
    int rc = -REDLOCKD_E_CLOSED;

    for (size_t i = 0; i < h->nservers && !rl_passed(until); i++) {
        size_t s = (start + i) % h->nservers;

        rc = rl_attach_one(h, s, until);
        if (rc == 0)
            return 0;
        /* The next attempt, in this call or a later one, goes on from
         * the next server. */
        h->cur = (s + 1) % h->nservers;
    }
    return rc;
}

/* ---- ADOPT -------------------------------------------------------------- */

/* The leases that one ADOPT takes: from index first on, those of the same
 * grant (its token) that want one. Their names into names[]. */
static size_t rl_adopt_names(const struct redlockd *h, size_t first,
                             const char **names)
{
    const struct rl_lease *f = &h->leases[first];
    size_t n = 0;

    for (size_t i = first; i < h->nleases && n < RL_ADOPT_MAX; i++) {
        const struct rl_lease *l = &h->leases[i];

        if (!l->lost && !l->attached && strcmp(l->token, f->token) == 0)
            names[n++] = l->resource;
    }
    return n;
}

/* "ADOPT r1 r2 token=<hex> ttl=<ms> renew=0|1" in h->freq. */
static int rl_adopt_line(struct redlockd *h, const struct rl_lease *f,
                         const char *const *names, size_t n)
{
    size_t need = RL_REQ_MAX;

    for (size_t i = 0; i < n; i++)
        need += strlen(names[i]) + 1;
    sbuf_reset(&h->freq);
    if (sbuf_try_reserve(&h->freq, need) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    rl_req(&h->freq, PROTO_CMD_ADOPT);
    for (size_t i = 0; i < n; i++)
        proto_format_word(&h->freq, names[i]);
    proto_format_opt_str(&h->freq, PROTO_OPT_TOKEN, f->token);
    if (f->ttl > 0)
        proto_format_opt_u64(&h->freq, PROTO_OPT_TTL, f->ttl);
    proto_format_opt_u64(&h->freq, PROTO_OPT_RENEW, f->renew ? 1 : 0);
    proto_format_end(&h->freq);
    return 0;
}

/* What happened to each lease of the group, by name (an event read while
 * waiting may have grown the table). */
static void rl_adopt_lose(struct redlockd *h, char **names, size_t n,
                          const char *reason)
{
    for (size_t i = 0; i < n; i++) {
        struct rl_lease *l = rl_lease_find(h, names[i]);

        if (l)
            rl_lease_lost_by(h, l, reason);
    }
}

/* OK resource=<r> token=<new> fence=<same> ttl= validity=: the same lease
 * with a new token. Another fence would be another lease: not ours. */
static int rl_adopt_ok(struct redlockd *h, const struct proto_reply *r,
                       char **names, size_t n)
{
    const char *token = proto_reply_get(r, "token");
    const char *fence_s = proto_reply_get(r, "fence");
    const char *validity_s = proto_reply_get(r, "validity");
    uint64_t fence;
    int64_t validity;

    if (!token || strlen(token) != REDLOCKD_TOKEN_LEN
        || proto_parse_u64(fence_s, rl_len(fence_s), &fence) < 0
        || proto_parse_i64(validity_s, rl_len(validity_s), &validity) < 0)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to ADOPT");
    for (size_t i = 0; i < n; i++) {
        struct rl_lease *l = rl_lease_find(h, names[i]);

        if (!l)
            continue;
        if (l->fence != fence) {
            rl_lease_lost_by(h, l, "adopt");
            continue;
        }
        memcpy(l->token, token, sizeof(l->token));
        l->attached = true;
        l->lost = false;
        rl_lease_confirm(h, l, validity);
    }
    return 0;
}

/* The group's earliest deadline: no ADOPT answer is waited for past it. */
static int64_t rl_group_deadline(const struct redlockd *h, char **names,
                                 size_t n)
{
    int64_t first = -1;

    for (size_t i = 0; i < n; i++) {
        const struct rl_lease *l = rl_lease_find(h, names[i]);

        if (l)
            first = rl_earlier(first, l->deadline);
    }
    return first;
}

/* Send the ADOPT of the group in names and take in its answer: 0 done (held
 * or lost), 1 to try again later, -code when the connection broke. */
static int rl_adopt_send(struct redlockd *h, char **names, size_t n,
                         int64_t until)
{
    int64_t due = rl_group_deadline(h, names, n);
    struct proto_reply r;
    int rc;

    if (rl_passed(due)) {
        rl_adopt_lose(h, names, n, "deadline");
        return 0;
    }
    rc = rl_exchange(h, &h->freq, rl_earlier(rl_earlier(until, due),
                                             rl_io_deadline(h, 0)), &r);
    if (rc == 1) {
        rc = rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to ADOPT in time");
        if (rl_passed(due))
            rl_adopt_lose(h, names, n, "deadline");
        return rc;
    }
    if (rc == 0)
        return rl_adopt_ok(h, &r, names, n);
    if (rl_transport_failed(h, rc))
        return rc;
    if (rc == -REDLOCKD_E_LOST || rc == -REDLOCKD_E_ARG) {
        rl_adopt_lose(h, names, n, "adopt");
        return 0;
    }
    /* HELD: an ADOPT whose answer was lost took it already; a LOCKS round
     * will say. UNAVAILABLE (a daemon just started, its nodes not yet up),
     * SHUTDOWN, LIMIT: later, while the deadline lasts. */
    if (rc == -REDLOCKD_E_HELD)
        h->resumed = true;
    return 1;
}

/* The grant of the lease at index first: its leases go together (a
 * shared hold or a semaphore slot is one resource: the daemon finds which
 * kind the token holds). */
static int rl_adopt_group(struct redlockd *h, size_t first, int64_t until)
{
    const char *names[RL_ADOPT_MAX];
    char *copies[RL_ADOPT_MAX];
    size_t n = rl_adopt_names(h, first, names), k;
    int rc;

    rc = rl_adopt_line(h, &h->leases[first], names, n);
    for (k = 0; rc == 0 && k < n; k++) {
        copies[k] = strdup(names[k]);
        if (!copies[k])
            rc = rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    }
    if (rc == 0)
        rc = rl_adopt_send(h, copies, n, until);
    while (k > 0)
        free(copies[--k]);
    return rc;
}

/* ---- reconnecting ------------------------------------------------------- */

/*
 * A connection just made: after a resume, a LOCKS round confirms what the
 * session still holds; then every lease the session does not hold is
 * adopted, and a new session watches what the handle watches. 0 all
 * settled, 1 some ADOPT to try again later, -code.
 */
static int rl_settle(struct redlockd *h, int64_t until)
{
    bool later = false;
    int rc;

    if (h->resumed) {
        rc = rl_locks_round(h, &h->freq,
                            rl_earlier(until, rl_io_deadline(h, 0)), false,
                            true);
        if (rc < 0)
            return rc;
        h->resumed = false;
    }
    rl_lease_expire(h);
    for (size_t i = 0; i < h->nleases; i++) {
        if (h->leases[i].lost || h->leases[i].attached)
            continue;
        rc = rl_adopt_group(h, i, until);
        if (rc < 0)
            return rc;
        later = later || rc == 1;
    }
    if (h->rewatch) {
        rc = rl_watch_again(h, until);
        if (rc < 0)
            return rc;
    }
    return later || h->resumed ? 1 : 0;
}

/* The pause before the next round: reconnect_min_ms doubling up to
 * reconnect_max_ms, less a random part of up to a half so that the
 * clients of a restarted daemon do not all come back at once. */
static void rl_backoff(struct redlockd *h)
{
    int b = h->backoff_ms ? h->backoff_ms : h->reconnect_min_ms;
    int jitter = b / 2 > 0 ? (int)(rand_r(&h->seed) % (unsigned)(b / 2 + 1))
                           : 0;

    h->next_round_ms = rl_now_ms() + b - jitter;
    h->backoff_ms = b >= h->reconnect_max_ms / 2 ? h->reconnect_max_ms : 2 * b;
}

/* Sleep until the next round may start: 1 when until comes first. */
static int rl_pause(struct redlockd *h, int64_t until)
{
    int64_t wake = h->next_round_ms;

    if (until >= 0 && until < wake)
        wake = until;
    while (rl_now_ms() < wake)
        (void)poll(NULL, 0, rl_remaining(wake));
    return rl_passed(until) ? 1 : 0;
}

/* The failure of a recovery that ran out of time, saying why. */
static int rl_recover_failed(struct redlockd *h, int rc, bool tried)
{
    char why[sizeof(h->err.msg)];
    int code = rc < 0 ? -rc : REDLOCKD_E_IO_TIMEOUT;

    if (!tried)
        return rl_fail(h, REDLOCKD_E_CLOSED, "not connected (%.160s), and "
                       "no time left to reconnect", h->dead);
    snprintf(why, sizeof(why), "%s", h->err.msg);
    if (why[0] == '\0')
        snprintf(why, sizeof(why), "ran out of time");
    if (code != REDLOCKD_E_IO && code != REDLOCKD_E_IO_TIMEOUT
        && code != REDLOCKD_E_CLOSED)
        code = REDLOCKD_E_IO;
    return rl_fail(h, code, "not reconnected to %s%s: %.180s",
                   h->nservers > 1 ? "any of the servers, last " : "",
                   redlockd_server(h), why);
}

int rl_recover(struct redlockd *h, int64_t caller_until)
{
    int64_t until;
    bool tried = false;
    int rc = 0;

    if (!rl_can_reconnect(h))
        return rl_fail(h, REDLOCKD_E_CLOSED, "not connected (%.200s)",
                       h->dead);
    rl_lease_expire(h);
    until = rl_earlier(rl_earlier(caller_until, rl_io_deadline(h, 0)),
                       rl_lease_earliest(h));
    for (;;) {
        rl_lease_expire(h);
        if (rl_pause(h, until))
            break;
        tried = true;
        if (h->fd < 0 && (rc = rl_attach(h, until)) < 0) {
            rl_backoff(h);
            continue;
        }
        rc = rl_settle(h, until);
        if (rc == 0) {
            h->settled = true;
            h->backoff_ms = 0;
            h->next_round_ms = 0;
            h->err.code = 0;
            h->err.msg[0] = '\0';
            return 0;
        }
        rl_backoff(h);
    }
    rl_lease_expire(h);
    return rl_recover_failed(h, rc, tried);
}

/* ---- connecting --------------------------------------------------------- */

/* The first connection: each server once, in order, until one answers.
 * A daemon's refusal (a wrong password...) ends it: the next server would
 * say the same. */
int rl_connect_first(struct redlockd *h)
{
    int rc = -REDLOCKD_E_CLOSED;

    for (size_t s = 0; s < h->nservers; s++) {
        h->cur = s;
        rc = rl_connect(h, &h->servers[s], rl_deadline(h->connect_timeout_ms));
        if (rc < 0)
            continue;
        rc = rl_handshake(h, -1);
        if (rc == 0) {
            h->settled = true;
            return 0;
        }
        /* ARG: refused with the connection closed after it too (a plain
         * client on a tls:// port, rl_hello_fresh), a mistake to show. */
        if (!rl_transport_failed(h, rc) || rc == -REDLOCKD_E_ARG)
            return rl_attempt_failed(h, rc);
    }
    h->cur = 0;
    return rc;
}
