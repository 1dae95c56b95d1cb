/*
 * libredlockd, one connection: server addresses, connecting, and the line
 * I/O of a request and its reply. The connection layer: it calls only
 * TLS and the ground floor (redlockd_base.c), and hands what it reads that
 * is not its own back to the layers above through the handle's hooks
 * (struct rl_conn_hooks, redlockd_priv.h).
 *
 * A handle owns one non-blocking socket at a time; every wait (connect,
 * send, reply) goes through poll() so the connect and I/O timeouts hold. A
 * request is one line out and one reply line in, read from an input buffer
 * that also carries the daemon's EVENT lines and the tagged answers to
 * submissions: those are handed on wherever they show up (before a reply,
 * after it, or while polling for events) and never taken for a reply; the
 * connection keeps only its own events (SHUTDOWN, CLOSING). proto/ does
 * the protocol's parts: reply lines are parsed by proto_reply_parse,
 * server addresses by proto_addr_parse, numbers by its strict readers; it
 * also owns the error-code table, which this file maps to the public enum
 * for ERR replies.
 *
 * A connection to a tls:// server carries TLS (redlockd_tls.c) under the
 * same waits: rl_conn_recv and rl_conn_send are the only places that tell
 * the two apart.
 *
 * A transport failure drops the connection (rl_drop); what becomes of the
 * requests in flight, the session and its leases then is the business of
 * the layers above (the hooks' dropped: redlockd_inflight.c, then
 * redlockd_failover.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "redlockd_priv.h"

/* QUIT is a courtesy (the daemon then skips lock_delay_ms); never wait long. */
#define RL_QUIT_TIMEOUT_MS 1000
#define RL_READ_CHUNK 4096
#define RL_IN_MAX (REDLOCKD_MAX_REPLY + 2 + RL_READ_CHUNK)

/* Protocol error code -> public code; a missing REDLOCKD_E_<name> fails
 * to compile, so the two enums cannot drift apart. */
static const int rl_code_of_proto[PROTO_ERR_COUNT] = {
#define X(name, word, msg) [PROTO_ERR_##name] = REDLOCKD_E_##name,
    PROTO_ERRORS(X)
#undef X
};

/* ---- a dropped connection ----------------------------------------------- */

/* The connection is gone: close it, and let the layers above decide what
 * that means for the requests in flight, the session and its leases
 * (h->hooks->dropped). */
static void rl_drop(struct redlockd *h)
{
    if (h->fd < 0)
        return;
    rl_close_fd(h);
    snprintf(h->dead, sizeof(h->dead), "%s", h->err.msg);
    h->hooks->dropped(h);
}

int rl_drop_rc(struct redlockd *h, int rc)
{
    rl_drop(h);
    return rc;
}

/* TOOLONG closes the connection too, but its request was refused: not
 * one to send again, nor one whose outcome is unknown. */
bool rl_transport_failed(const struct redlockd *h, int rc)
{
    return rc < 0 && h->fd < 0 && rc != -REDLOCKD_E_TOOLONG;
}

/* A handle made by redlockd_open_fd has no server to go to, and
 * reconnect_max_ms < 0 asks for no reconnecting. */
bool rl_can_reconnect(const struct redlockd *h)
{
    return h->nservers > 0 && h->reconnect_max_ms >= 0;
}

static int rl_fatal_errno(struct redlockd *h, const char *what)
{
    int e = errno;

    if (e == EPROTO && h->ssl)
        return rl_fatal(h, REDLOCKD_E_IO, "%s: %s", what, h->tls_err);
    if (e == EPIPE || e == ECONNRESET)
        return rl_fatal(h, REDLOCKD_E_CLOSED,
                        "%s: connection reset by the daemon", what);
    return rl_fatal(h, REDLOCKD_E_IO, "%s: %s", what, strerror(e));
}

/* ---- server addresses --------------------------------------------------- */

int redlockd_addr_parse(const char *s, struct redlockd_addr *a,
                        struct redlockd_error *err)
{
    struct proto_addr pa;
    enum proto_addr_err e;
    char shown[48];

    memset(a, 0, sizeof(*a));
    e = proto_addr_parse(&pa, s, PROTO_ADDR_FOR_CLIENT);
    if (e != PROTO_ADDR_OK) {
        rl_quote(shown, sizeof(shown), s ? s : "", rl_len(s));
        return rl_seterr(err, REDLOCKD_E_INVALID, "server address \"%s\": %s",
                         shown, proto_addr_strerror(e));
    }
    a->is_unix = pa.kind == PROTO_ADDR_KIND_UNIX;
    a->is_tls = pa.tls;
    memcpy(a->host, pa.host, sizeof(a->host));
    memcpy(a->path, pa.path, sizeof(a->path));
    if (!a->is_unix)
        snprintf(a->port, sizeof(a->port), "%u", (unsigned)pa.port);
    proto_addr_format(&pa, a->text, sizeof(a->text));
    return 0;
}

/* ---- connecting --------------------------------------------------------- */

/* 0 connected, else an errno value (ETIMEDOUT when the deadline passed). */
static int rl_connect_sa(int fd, const struct sockaddr *sa, socklen_t salen,
                         int64_t deadline)
{
    int soerr = 0, rc;
    socklen_t len = sizeof(soerr);

    for (;;) {
        if (connect(fd, sa, salen) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        /* A unix listener with a full backlog says EAGAIN: retry. */
        if (errno != EAGAIN || rl_remaining(deadline) == 0)
            break;
        poll(NULL, 0, 10);
    }
    if (errno == EAGAIN)
        return ETIMEDOUT;
    if (errno != EINPROGRESS)
        return errno;
    rc = rl_wait(fd, POLLOUT, deadline);
    if (rc < 0)
        return errno;
    if (rc == 0)
        return ETIMEDOUT;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
        return errno;
    return soerr;
}

static int rl_socket(int family, int *fd)
{
    *fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    return *fd < 0 ? errno : 0;
}

/* A connect failure as a message naming the address. */
static int rl_connect_err(const struct redlockd_addr *a, int e,
                          struct redlockd_error *err)
{
    if (e == ETIMEDOUT)
        return rl_seterr(err, REDLOCKD_E_IO_TIMEOUT,
                         "connect to %s: timed out", a->text);
    return rl_seterr(err, REDLOCKD_E_IO, "connect to %s: %s", a->text,
                     strerror(e));
}

/* 0 connected, else an errno value. */
static int rl_connect_unix(const struct redlockd_addr *a, int64_t deadline,
                           int *fd)
{
    struct sockaddr_un sun;
    int e;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, a->path, strlen(a->path));
    e = rl_socket(AF_UNIX, fd);
    if (e != 0)
        return e;
    e = rl_connect_sa(*fd, (struct sockaddr *)&sun, sizeof(sun), deadline);
    if (e != 0) {
        close(*fd);
        *fd = -1;
    }
    return e;
}

static void rl_tune_tcp(int fd)
{
    int one = 1;

    /* One line per request: no reason to let Nagle hold it back. Failure
     * only costs latency. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

/* 0 connected, else an errno value; tries every address of the host. */
static int rl_connect_ai(struct addrinfo *res, int64_t deadline, int *fd)
{
    struct addrinfo *ai;
    int e = ECONNREFUSED;

    for (ai = res; ai; ai = ai->ai_next) {
        e = rl_socket(ai->ai_family, fd);
        if (e != 0)
            continue;
        e = rl_connect_sa(*fd, ai->ai_addr, ai->ai_addrlen, deadline);
        if (e == 0) {
            rl_tune_tcp(*fd);
            return 0;
        }
        close(*fd);
        *fd = -1;
        if (e == ETIMEDOUT)
            break;
    }
    return e;
}

/* Connect to a; 0 or -code with err set. */
static int rl_connect_fd(const struct redlockd_addr *a, int64_t deadline,
                         int *fd, struct redlockd_error *err)
{
    struct addrinfo hints, *res;
    int e;

    *fd = -1;
    if (a->is_unix) {
        e = rl_connect_unix(a, deadline, fd);
        return e == 0 ? 0 : rl_connect_err(a, e, err);
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    e = getaddrinfo(a->host, a->port, &hints, &res);
    if (e != 0)
        return rl_seterr(err, REDLOCKD_E_IO, "cannot resolve %s: %s", a->host,
                         gai_strerror(e));
    e = rl_connect_ai(res, deadline, fd);
    freeaddrinfo(res);
    return e == 0 ? 0 : rl_connect_err(a, e, err);
}

int rl_connect(struct redlockd *h, const struct redlockd_addr *a,
               int64_t deadline)
{
    int fd, rc = rl_connect_fd(a, deadline, &fd, &h->err);

    if (rc == 0 && a->is_tls) {
        rc = rl_tls_connect(h, a, fd, deadline, &h->err);
        if (rc < 0)
            close(fd);
    }
    if (rc == 0)
        rl_attach_fd(h, fd);
    return rc;
}

void rl_attach_fd(struct redlockd *h, int fd)
{
    h->fd = fd;
    h->in_start = h->in_len = h->in_scan = 0;
    h->shutdown_seen = 0;
    h->closing = h->closing_kept = false;
    h->settled = false;
}

/* No close_notify: this is a cut (a detachable session detaches), and
 * the daemon may be gone. */
void rl_close_fd(struct redlockd *h)
{
    if (h->fd < 0)
        return;
    rl_tls_free(h);
    (void)shutdown(h->fd, SHUT_RDWR);
    close(h->fd);
    h->fd = -1;
    h->settled = false;
}

/* ---- the transport: plain or TLS ---------------------------------------- */

/* One read: n > 0, 0 at EOF, or -1 with errno (EAGAIN: wait for *events). */
static ssize_t rl_conn_recv(struct redlockd *h, char *buf, size_t len,
                            short *events)
{
    *events = POLLIN;
    if (h->ssl)
        return rl_tls_read(h, buf, len, events);
    return recv(h->fd, buf, len, 0);
}

/* One write: n > 0, or -1 with errno (EAGAIN: wait for *events). */
static ssize_t rl_conn_send(struct redlockd *h, const char *buf, size_t len,
                            short *events)
{
    *events = POLLOUT;
    if (h->ssl)
        return rl_tls_write(h, buf, len, events);
    return send(h->fd, buf, len, MSG_NOSIGNAL);
}

/* ---- events ------------------------------------------------------------- */

static int rl_is_event(const char *line, size_t len)
{
    return len > 6 && memcmp(line, "EVENT", 5) == 0
        && (line[5] == ' ' || line[5] == '\t');
}

/* EVENT CLOSING reason=shutdown: the daemon exits and leaves every lease it
 * still holds for us on the nodes, to ADOPT elsewhere (the session itself
 * ends). Other reasons end the connection only. */
static void rl_event_closing(struct redlockd *h, const struct proto_reply *ev)
{
    const char *reason = proto_reply_get(ev, "reason");

    h->closing = true;
    if (reason && strcmp(reason, "shutdown") == 0)
        h->closing_kept = true;
}

/* line is one EVENT line in the input buffer (LF still there). The
 * connection's own (SHUTDOWN, CLOSING) are handled here; the others go to
 * the layers above (h->hooks->event). */
static int rl_event(struct redlockd *h, char *line, size_t len)
{
    struct proto_reply ev;

    if (proto_reply_parse(line, len, &ev) < 0 || ev.kind != PROTO_REPLY_EVENT)
        return rl_fatal(h, REDLOCKD_E_PROTO, "unparseable EVENT line");
    h->nevents++;
    if (strcmp(ev.text, "SHUTDOWN") == 0) {
        h->shutdown_seen = 1;
        return 0;
    }
    if (strcmp(ev.text, "CLOSING") == 0) {
        rl_event_closing(h, &ev);
        return 0;
    }
    /* LOST, HOLDER and newer ones: the leases' and the watches'. */
    return h->hooks->event(h, &ev);
}

/* ---- input buffer ------------------------------------------------------- */

/* Room for one more read: drop consumed bytes, then grow up to RL_IN_MAX. */
static int rl_in_reserve(struct redlockd *h)
{
    size_t cap;
    char *grown;

    if (h->in_start > 0) {
        memmove(h->in, h->in + h->in_start, h->in_len - h->in_start);
        h->in_len -= h->in_start;
        h->in_scan -= h->in_start;
        h->in_start = 0;
    }
    if (h->in_cap - h->in_len >= RL_READ_CHUNK || h->in_cap == RL_IN_MAX)
        return 0;
    cap = h->in_cap ? h->in_cap * 2 : 2 * RL_READ_CHUNK;
    if (cap > RL_IN_MAX)
        cap = RL_IN_MAX;
    grown = realloc(h->in, cap);
    if (!grown)
        return rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
    h->in = grown;
    h->in_cap = cap;
    return 0;
}

/* 1 with the next complete line (without its LF, which stays in the buffer
 * for proto_reply_parse's NUL), 0 if there is none yet. Lines are valid
 * until the next rl_fill. Blank lines are skipped. */
static int rl_next_line(struct redlockd *h, char **line, size_t *len)
{
    char *lf;

    for (;;) {
        /* Nothing new (possibly no buffer yet: memchr wants a pointer). */
        if (h->in_scan == h->in_len)
            return 0;
        lf = memchr(h->in + h->in_scan, '\n', h->in_len - h->in_scan);
        if (!lf) {
            h->in_scan = h->in_len;
            return 0;
        }
        *line = h->in + h->in_start;
        *len = (size_t)(lf - *line);
        h->in_start = h->in_scan = (size_t)(lf + 1 - h->in);
        if (*len > 1 || (*len == 1 && **line != '\r'))
            return 1;
    }
}

/* 1 if the pending partial line is already longer than any reply may be. */
static int rl_in_overlong(const struct redlockd *h)
{
    return h->in_len - h->in_start > REDLOCKD_MAX_REPLY;
}

/* After a send or recv that moved nothing (errno says why): 0 to try
 * again (interrupted, or the socket is ready now), 1 the deadline passed,
 * negative: the connection failed and is closed. */
static int rl_io_retry(struct redlockd *h, short events, int64_t deadline,
                       const char *what)
{
    int rc;

    if (errno == EINTR)
        return 0;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return rl_fatal_errno(h, what);
    rc = rl_wait(h->fd, events, deadline);
    if (rc < 0)
        return rl_fatal_errno(h, "poll");
    return rc == 0 ? 1 : 0;
}

/* Read what the socket has, waiting until deadline. 0 read something,
 * 1 deadline passed (the caller decides whether that is an error),
 * negative: connection gone. */
static int rl_fill(struct redlockd *h, int64_t deadline)
{
    ssize_t n;
    short events;
    int rc;

    rc = rl_in_reserve(h);
    if (rc < 0)
        return rc;
    /* Callers check rl_in_overlong first; a zero-length recv would look
     * like EOF. */
    if (h->in_len == h->in_cap)
        return rl_fatal(h, REDLOCKD_E_PROTO, "line from the daemon too long");
    for (;;) {
        n = rl_conn_recv(h, h->in + h->in_len, h->in_cap - h->in_len,
                         &events);
        if (n > 0) {
            h->in_len += (size_t)n;
            return 0;
        }
        if (n == 0)
            return rl_fatal(h, REDLOCKD_E_CLOSED,
                            "the daemon closed the connection%s",
                            h->shutdown_seen ? " (it is shutting down)" : "");
        rc = rl_io_retry(h, events, deadline, "receive");
        if (rc != 0)
            return rc;
    }
}

/* A line that is not the reply a blocking call waits for: an EVENT, or
 * the answer to a submission (h->hooks->tagged). 1 handled, 0 it is the
 * caller's reply, or -code. */
static int rl_route(struct redlockd *h, char *line, size_t len)
{
    int rc;

    if (rl_is_event(line, len)) {
        rc = rl_event(h, line, len);
        return rc < 0 ? rc : 1;
    }
    if (line[0] == '#')
        return h->hooks->tagged(h, line, len);
    return 0;
}

int rl_drain_events(struct redlockd *h)
{
    char *line;
    size_t len;
    int rc;

    while (h->fd >= 0 && rl_next_line(h, &line, &len)) {
        rc = rl_route(h, line, len);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return rl_fatal(h, REDLOCKD_E_PROTO,
                            "the daemon sent a reply nobody asked for");
    }
    return 0;
}

int rl_read_events(struct redlockd *h, int64_t deadline)
{
    return rl_read_until(h, deadline, &h->nevents);
}

int rl_read_until(struct redlockd *h, int64_t deadline,
                  const unsigned long *count)
{
    unsigned long before = *count;
    int rc;

    for (;;) {
        rc = rl_drain_events(h);
        if (rc < 0)
            return rc;
        if (*count != before)
            return (int)(*count - before);
        if (rl_in_overlong(h))
            return rl_fatal(h, REDLOCKD_E_PROTO,
                            "line from the daemon too long");
        rc = rl_fill(h, deadline);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
}

void rl_peek(struct redlockd *h)
{
    while (h->fd >= 0 && rl_read_events(h, rl_now_ms()) > 0)
        ;
    if (h->fd >= 0 && h->closing)
        rl_fatal(h, REDLOCKD_E_CLOSED, "the daemon closed the connection");
}

/* ---- requests and replies ----------------------------------------------- */

/* Copy a reply line out of the input buffer and parse it there. */
static int rl_take_reply(struct redlockd *h, const char *line, size_t len,
                         struct proto_reply *r)
{
    char *grown, shown[48];

    if (len + 1 > h->reply_cap) {
        grown = realloc(h->reply, len + 1);
        if (!grown)
            return rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
        h->reply = grown;
        h->reply_cap = len + 1;
    }
    memcpy(h->reply, line, len);
    /* Quoting the line says so when the client was pointed at the wrong
     * port (Redis, HTTP). */
    if (proto_reply_parse(h->reply, len, r) < 0) {
        rl_quote(shown, sizeof(shown), line, len);
        return rl_fatal(h, REDLOCKD_E_PROTO,
                        "unparseable reply (is this redlockd?): \"%s\"", shown);
    }
    return 0;
}

/* Read up to the next reply, handling the events in front of it. 1: none
 * came before deadline (the caller closes the connection: a late reply
 * would be taken for the next request's). */
static int rl_read_reply(struct redlockd *h, int64_t deadline,
                         struct proto_reply *r)
{
    char *line;
    size_t len;
    int rc;

    for (;;) {
        while (rl_next_line(h, &line, &len)) {
            if (len > REDLOCKD_MAX_REPLY)
                return rl_fatal(h, REDLOCKD_E_PROTO,
                                "reply longer than %d bytes",
                                REDLOCKD_MAX_REPLY);
            rc = rl_route(h, line, len);
            if (rc < 0)
                return rc;
            if (rc == 0)
                return rl_take_reply(h, line, len, r);
        }
        if (rl_in_overlong(h))
            return rl_fatal(h, REDLOCKD_E_PROTO, "reply longer than %d bytes",
                            REDLOCKD_MAX_REPLY);
        rc = rl_fill(h, deadline);
        if (rc != 0)
            return rc;
    }
}

int rl_send_all(struct redlockd *h, const char *buf, size_t len,
                int64_t deadline)
{
    ssize_t n;
    short events;
    int rc;

    while (len > 0) {
        n = rl_conn_send(h, buf, len, &events);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        /* The daemon may have said why before closing: read that instead. */
        if (errno == EPIPE || errno == ECONNRESET)
            return 0;
        rc = rl_io_retry(h, events, deadline, "send");
        if (rc < 0)
            return rc;
        if (rc == 1)
            return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "send timed out");
    }
    return 0;
}

int rl_reply_error(const struct proto_reply *r, struct redlockd_error *e)
{
    if (r->err == PROTO_ERR_NONE)
        return rl_seterr(e, REDLOCKD_E_OTHER, "%s %s", r->err_word, r->text);
    return rl_seterr(e, rl_code_of_proto[r->err], "%s",
                     *r->text != '\0' ? r->text
                                      : proto_err_default_msg(r->err));
}

static int rl_daemon_err(struct redlockd *h, const struct proto_reply *r)
{
    int rc = rl_reply_error(r, &h->err);

    /* The daemon closes after TOOLONG. */
    if (rc == -REDLOCKD_E_TOOLONG)
        rl_drop(h);
    return rc;
}

int rl_exchange(struct redlockd *h, const struct sbuf *b, int64_t deadline,
                struct proto_reply *r)
{
    int rc;

    if (h->fd < 0)
        return rl_fail(h, REDLOCKD_E_CLOSED, "not connected (%.200s)",
                       h->dead);
    b = h->hooks->call_line(h, b);
    if (!b)
        return -REDLOCKD_E_NOMEM;
    h->sent_ms = rl_now_ms();
    rc = rl_send_all(h, b->data, b->len, deadline);
    if (rc == 0)
        rc = rl_read_reply(h, deadline, r);
    h->call_id = 0;
    if (rc != 0)
        return rc;
    if (r->kind == PROTO_REPLY_ERR)
        return rl_daemon_err(h, r);
    return 0;
}

int64_t rl_io_deadline(const struct redlockd *h, uint32_t extra_ms)
{
    return h->io_timeout_ms < 0 ? -1
                                : rl_now_ms() + h->io_timeout_ms + extra_ms;
}

int rl_expect(struct redlockd *h, const struct proto_reply *r,
              enum proto_reply_kind kind, enum proto_cmd cmd)
{
    if (r->kind == kind)
        return 0;
    return rl_fatal(h, REDLOCKD_E_PROTO, "unexpected reply to %s",
                    proto_cmd_name(cmd));
}

struct sbuf *rl_req(struct sbuf *b, enum proto_cmd cmd)
{
    sbuf_reset(b);
    proto_format_cmd(b, cmd);
    return b;
}

/* Sent with one send (or SSL_write): the socket may already be gone, and
 * nothing that goes wrong here is worth reporting. */
void rl_quit(struct redlockd *h)
{
    int timeout = RL_QUIT_TIMEOUT_MS;
    int64_t deadline;
    char scratch[512];
    short events;
    ssize_t n;

    if (h->io_timeout_ms >= 0 && h->io_timeout_ms < timeout)
        timeout = h->io_timeout_ms;
    deadline = rl_deadline(timeout);
    sbuf_reset(&h->req);
    proto_format_request(&h->req, PROTO_CMD_QUIT, NULL);
    if (rl_conn_send(h, h->req.data, h->req.len, &events)
        != (ssize_t)h->req.len)
        return;
    for (;;) {
        n = rl_conn_recv(h, scratch, sizeof(scratch), &events);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return;
        if (rl_wait(h->fd, events, deadline) <= 0)
            return;
    }
}
