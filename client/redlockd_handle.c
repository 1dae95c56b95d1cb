/*
 * libredlockd, the handle: made (redlockd_connect, redlockd_open_fd),
 * closed (redlockd_close: QUIT) or forgotten (redlockd_forget: a forked
 * copy lets go without a word), and what it tells (its connection, its
 * daemon, its last error). The top of the library: the one file that
 * knows every other, it wires the connection layer to the layers above
 * it (struct rl_conn_hooks: an event, a tagged answer, the line of a
 * blocking request, a dropped connection) and frees what each of them
 * owns.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "redlockd_priv.h"

/* ---- what the connection hands back ------------------------------------- */

/* EVENT LOST is the lease table's, EVENT HOLDER the watches'. */
static int rl_hook_event(struct redlockd *h, const struct proto_reply *ev)
{
    if (strcmp(ev->text, "LOST") == 0)
        return rl_event_lost(h, ev);
    if (strcmp(ev->text, "HOLDER") == 0)
        return rl_event_holder(h, ev);
    /* Other events are for newer clients. */
    return 0;
}

/* The submissions in flight are answered with the failure first; then
 * the failover says what the drop means for the session and its leases. */
static void rl_hook_dropped(struct redlockd *h)
{
    rl_inflight_broke(h);
    rl_after_drop(h);
}

static const struct rl_conn_hooks rl_hooks = {
    .event = rl_hook_event,
    .tagged = rl_inflight_line,
    .call_line = rl_inflight_call,
    .dropped = rl_hook_dropped,
};

/* ---- the handle --------------------------------------------------------- */

static int rl_check_opts(const struct redlockd_opts *o,
                         struct redlockd_error *err)
{
    if (o->name && !rl_visible_word(o->name, PROTO_MAX_NAME_LEN))
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "a client name is 1 to %d visible ASCII characters",
                         PROTO_MAX_NAME_LEN);
    if (o->password && !rl_visible_word(o->password, RL_PASSWORD_MAX))
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "a password is 1 to %d visible ASCII characters "
                         "(no spaces)", RL_PASSWORD_MAX);
    if (o->user && !rl_visible_word(o->user, REDLOCKD_USER_MAX))
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "a user name is 1 to %d visible ASCII characters",
                         REDLOCKD_USER_MAX);
    if (o->user && !o->password)
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "a user needs a password");
    if (o->reconnect_min_ms < 0)
        return rl_seterr(err, REDLOCKD_E_INVALID,
                         "reconnect_min_ms must not be negative");
    return 0;
}

/* A handle without a connection, keeping opts (NULL: defaults). */
static int rl_handle_new(struct redlockd **out,
                         const struct redlockd_opts *opts,
                         struct redlockd_error *err)
{
    static const struct redlockd_opts none;
    struct redlockd *h;

    *out = NULL;
    h = calloc(1, sizeof(*h));
    if (!h || sbuf_try_reserve(&h->req, RL_REQ_MAX) < 0
        || sbuf_try_reserve(&h->freq, RL_REQ_MAX) < 0) {
        if (h) {
            sbuf_deinit(&h->req);
            sbuf_deinit(&h->freq);
        }
        free(h);
        return rl_seterr(err, REDLOCKD_E_NOMEM, "out of memory");
    }
    h->fd = -1;
    h->hooks = &rl_hooks;
    if (rl_keep_opts(h, opts ? opts : &none) < 0) {
        if (err)
            *err = h->err;
        redlockd_close(h);
        return -REDLOCKD_E_NOMEM;
    }
    *out = h;
    return 0;
}

int redlockd_open_fd(struct redlockd **out, int fd,
                     const struct redlockd_opts *opts,
                     struct redlockd_error *err)
{
    int fl, rc;

    *out = NULL;
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0
        || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        rl_seterr(err, REDLOCKD_E_IO, "fcntl: %s", strerror(errno));
        close(fd);
        return -REDLOCKD_E_IO;
    }
    rc = rl_handle_new(out, opts, err);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    rl_attach_fd(*out, fd);
    (*out)->settled = true;
    return 0;
}

int redlockd_handshake(struct redlockd *h, const struct redlockd_opts *opts)
{
    int rc = rl_begin_plain(h);

    if (rc == 0)
        rc = rl_check_opts(opts, &h->err);
    if (rc == 0)
        rc = rl_keep_opts(h, opts);
    if (rc == 0)
        rc = rl_handshake(h, -1);
    return rc;
}

/* ---- connecting --------------------------------------------------------- */

int redlockd_connect(struct redlockd **out, const struct redlockd_opts *opts,
                     struct redlockd_error *err)
{
    struct redlockd_opts none;
    struct redlockd *h;
    int rc;

    *out = NULL;
    if (!opts) {
        memset(&none, 0, sizeof(none));
        opts = &none;
    }
    rc = rl_check_opts(opts, err);
    if (rc == 0)
        rc = rl_check_servers(opts, err);
    if (rc < 0)
        return rc;
    rc = rl_handle_new(&h, opts, err);
    if (rc < 0)
        return rc;
    rc = rl_keep_servers(h, opts, err);
    if (rc == 0)
        rc = rl_tls_setup(h, opts, err);
    if (rc < 0) {
        redlockd_close(h);
        return rc;
    }
    h->seed = (unsigned)rl_now_ms() ^ (unsigned)(uintptr_t)h;
    /* No handle yet for the caller, so no on_lost calls for it either. */
    h->on_lost = NULL;
    rc = rl_connect_first(h);
    if (rc < 0) {
        if (err)
            *err = h->err;
        redlockd_close(h);
        return rc;
    }
    h->on_lost = opts->on_lost;
    *out = h;
    return 0;
}

/* ---- closing and telling ------------------------------------------------ */

/* Everything a handle owns, its connection closed without a word: no
 * QUIT, and no TLS close_notify (SSL_free sends nothing). */
static void rl_free(struct redlockd *h)
{
    if (h->fd >= 0) {
        rl_tls_free(h);
        close(h->fd);
    }
    rl_lease_free_all(h);
    rl_inflight_free(h);
    rl_watch_free(h);
    rl_free_opts(h);
    free(h->in);
    free(h->reply);
    sbuf_deinit(&h->req);
    sbuf_deinit(&h->freq);
    free(h);
}

/* QUIT makes the daemon release the session's leases at once (without
 * lock_delay_ms), detachable or not. A handle that is reconnecting leaves
 * its detached session to end on its own: its detach time. */
void redlockd_close(struct redlockd *h)
{
    if (!h)
        return;
    if (h->fd >= 0)
        rl_quit(h);
    rl_free(h);
}

void redlockd_forget(struct redlockd *h)
{
    if (h)
        rl_free(h);
}

int redlockd_fd(const struct redlockd *h)
{
    return h->fd;
}

int redlockd_shutting_down(const struct redlockd *h)
{
    return h->shutdown_seen;
}

const struct redlockd_info *redlockd_info(const struct redlockd *h)
{
    return &h->info;
}

const struct redlockd_error *redlockd_last_error(const struct redlockd *h)
{
    return &h->err;
}
