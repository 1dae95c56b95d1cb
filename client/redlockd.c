/*
 * libredlockd: the blocking client behind redlockd.h.
 *
 * A handle owns one non-blocking socket; every wait (connect, send, reply)
 * goes through poll() so the connect and I/O timeouts hold. A request is
 * one line out and one reply line in, read from an input buffer that also
 * carries the daemon's EVENT lines: those are handled wherever they show
 * up (before a reply, after it, or in redlockd_poll_events) and never taken
 * for a reply. proto/ does the protocol's parts: request lines are built
 * from its command table (proto_format_cmd and friends, into the handle's
 * preallocated request buffer), reply lines are parsed by proto_reply_parse,
 * server addresses by proto_addr_parse, numbers by its strict readers; it
 * also owns the error-code table, which this file only maps to the public
 * enum.
 *
 * The handle keeps a table of its leases with their deadlines: the send
 * time of the request that last confirmed each (LOCK, EXTEND, or the LOCKS
 * of redlockd_refresh) plus the validity its reply reported. That is the
 * rule of docs/protocol.md, "Writing a client: the lease deadline rule";
 * every time here is CLOCK_MONOTONIC milliseconds.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "proto.h"
#include "redlockd.h"
#include "redlockd_internal.h"

#define RL_CONNECT_TIMEOUT_MS 5000
#define RL_IO_TIMEOUT_MS 10000
/* QUIT is a courtesy (the daemon then skips lock_delay_ms); never wait long. */
#define RL_QUIT_TIMEOUT_MS 1000
#define RL_READ_CHUNK 4096
#define RL_IN_MAX (REDLOCKD_MAX_REPLY + 2 + RL_READ_CHUNK)
#define RL_PASSWORD_MAX 1024
/* The longest request line: LOCK with a resource of the longest size and
 * every option (AUTH's password is shorter). */
#define RL_REQ_MAX (REDLOCKD_RESOURCE_MAX + 128)

_Static_assert(RL_PASSWORD_MAX + sizeof("AUTH \n") <= RL_REQ_MAX,
               "an AUTH line fits in the request buffer");

/* A lease of the handle: held from LOCK to UNLOCK, or reported lost and
 * kept, so that redlockd_lost() can say so, until the resource is taken
 * again. */
struct rl_lease {
    char *resource;
    uint64_t fence;             /* 0 when only an ERR LOST named it */
    uint32_t ttl;
    /* The send time of the request that last confirmed the lease plus the
     * validity its reply reported. */
    int64_t deadline;
    bool lost;                  /* EVENT LOST, ERR LOST, NOTHELD, or missing
                                   from LOCKS */
};

struct redlockd {
    int fd;                     /* -1 once closed */
    int io_timeout_ms;          /* negative: none */
    void (*on_lost)(const char *resource, uint64_t fence, const char *reason,
                    void *ud);
    void *ud;
    int in_callback;            /* inside on_lost: no requests */
    int shutdown_seen;
    unsigned long nevents;      /* events handled so far */

    /* Bytes read, lines not yet taken: [in_start, in_len) of in. */
    char *in;
    size_t in_start, in_len, in_cap;
    size_t in_scan;             /* no LF in [in_start, in_scan) */

    /* The last reply line, copied out of `in` so the events behind it can
     * be read before the caller is done with it. */
    char *reply;
    size_t reply_cap;

    struct rl_lease *leases;
    size_t nleases, leases_cap;
    int64_t sent_ms;            /* when the last request went out */

    /* The request line being built. Reserved for RL_REQ_MAX bytes when the
     * handle is made, so building a request never allocates (sbuf aborts
     * when it cannot; a library must not). */
    struct sbuf req;

    struct redlockd_info info;
    struct redlockd_error err;
    char dead[sizeof(((struct redlockd_error *)0)->msg)]; /* why fd is -1 */
};

/* Protocol error code -> public code; a missing REDLOCKD_E_<name> fails
 * to compile, so the two enums cannot drift apart. */
static const int rl_code_of_proto[PROTO_ERR_COUNT] = {
#define X(name, word, msg) [PROTO_ERR_##name] = REDLOCKD_E_##name,
    PROTO_ERRORS(X)
#undef X
};

/* ---- errors ------------------------------------------------------------- */

/* The one formatter of error messages; e may be NULL. */
static int rl_seterr(struct redlockd_error *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int rl_seterr(struct redlockd_error *e, int code, const char *fmt, ...)
{
    va_list ap;

    if (e) {
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
    }
    return -code;
}

/* A failure of a call on h: its code and message become the last error. */
#define rl_fail(h, code, ...) rl_seterr(&(h)->err, (code), __VA_ARGS__)

/* The daemon releases a dead session's locks: tell the owner all are gone. */
static void rl_disconnect(struct redlockd *h)
{
    if (h->fd < 0)
        return;
    close(h->fd);
    h->fd = -1;
    snprintf(h->dead, sizeof(h->dead), "%s", h->err.msg);
    if (h->on_lost) {
        h->in_callback++;
        h->on_lost(NULL, 0, "disconnected", h->ud);
        h->in_callback--;
    }
}

static int rl_disconnect_rc(struct redlockd *h, int rc)
{
    rl_disconnect(h);
    return rc;
}

/* A transport failure: the reply stream can not be trusted any more, so
 * the connection closes after the error is set (its message goes into
 * h->dead). */
#define rl_fatal(h, code, ...) \
    rl_disconnect_rc((h), rl_fail((h), (code), __VA_ARGS__))

static int rl_fatal_errno(struct redlockd *h, const char *what)
{
    int e = errno;

    if (e == EPIPE || e == ECONNRESET)
        return rl_fatal(h, REDLOCKD_E_CLOSED,
                        "%s: connection reset by the daemon", what);
    return rl_fatal(h, REDLOCKD_E_IO, "%s: %s", what, strerror(e));
}

/*
 * The word and the description of every public code. The daemon's come
 * from proto's table; the library's own are named after their enum
 * suffix, so neither can drift from the enum.
 */
struct rl_code_text {
    const char *name;
    const char *msg;
};

#define RL_OWN_CODE(suffix, msg) [REDLOCKD_E_##suffix] = { #suffix, msg }

static const struct rl_code_text rl_code_texts[REDLOCKD_CODE_COUNT] = {
    [REDLOCKD_OK] = { "OK", "success" },
#define X(name, word, msg) [REDLOCKD_E_##name] = { word, msg },
    PROTO_ERRORS(X)
#undef X
    RL_OWN_CODE(OTHER, "the daemon answered with an unknown code"),
    RL_OWN_CODE(IO, "connection error"),
    RL_OWN_CODE(IO_TIMEOUT, "timed out talking to the daemon"),
    RL_OWN_CODE(CLOSED, "the connection to the daemon is closed"),
    RL_OWN_CODE(PROTO, "unexpected data from the daemon"),
    RL_OWN_CODE(NOMEM, "out of memory"),
    RL_OWN_CODE(INVALID, "invalid argument"),
};

/* The entry of a code, either sign; NULL for none. */
static const struct rl_code_text *rl_code_text(int code)
{
    if (code < 0)
        code = -code;
    if (code >= REDLOCKD_CODE_COUNT || !rl_code_texts[code].name)
        return NULL;
    return &rl_code_texts[code];
}

const char *redlockd_strerror(int code)
{
    const struct rl_code_text *t = rl_code_text(code);

    return t ? t->msg : "unknown error code";
}

const char *redlockd_code_name(int code)
{
    const struct rl_code_text *t = rl_code_text(code);

    return t ? t->name : "?";
}

/* ---- small readers ------------------------------------------------------ */

/* The length of a reply value that may be missing (NULL): proto's number
 * readers reject NULL, so a missing key reads as a malformed number. */
static size_t rl_len(const char *s)
{
    return s ? strlen(s) : 0;
}

/* 1..max bytes of visible ASCII: client names and passwords. */
static int rl_visible_word(const char *s, size_t max)
{
    size_t len;

    if (!s)
        return 0;
    len = strlen(s);
    if (len == 0 || len > max)
        return 0;
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
            return 0;
    }
    return 1;
}

static int64_t rl_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1: no deadline. */
static int64_t rl_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : rl_now_ms() + timeout_ms;
}

static int rl_remaining(int64_t deadline)
{
    int64_t left;

    if (deadline < 0)
        return -1;
    left = deadline - rl_now_ms();
    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* 1 ready, 0 deadline passed, -1 poll failed (errno). */
static int rl_wait(int fd, short events, int64_t deadline)
{
    struct pollfd p;
    int n;

    for (;;) {
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        n = poll(&p, 1, rl_remaining(deadline));
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* ---- server addresses --------------------------------------------------- */

/* The start of untrusted text, printable, for an error message. */
static void rl_quote(char *dst, size_t sz, const char *line, size_t len)
{
    size_t i, n = len < sz - 1 ? len : sz - 1;

    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)line[i];
        dst[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    dst[n] = '\0';
}

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

static int rl_connect_fd(const struct redlockd_addr *a, int timeout_ms,
                         int *fd, struct redlockd_error *err)
{
    int64_t deadline = rl_deadline(timeout_ms);
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

/* ---- leases ------------------------------------------------------------ */

static struct rl_lease *rl_lease_find(const struct redlockd *h,
                                      const char *resource)
{
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        if (strcmp(h->leases[i].resource, resource) == 0)
            return &h->leases[i];
    }
    return NULL;
}

/* The entry of resource, made (lost, no deadline) if there is none; NULL
 * when out of memory, the handle then closed. */
static struct rl_lease *rl_lease_get(struct redlockd *h, const char *resource)
{
    struct rl_lease *l = rl_lease_find(h, resource), *grown;
    size_t cap;

    if (l)
        return l;
    if (h->nleases == h->leases_cap) {
        cap = h->leases_cap ? h->leases_cap * 2 : 8;
        grown = realloc(h->leases, cap * sizeof(*grown));
        if (!grown) {
            rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
            return NULL;
        }
        h->leases = grown;
        h->leases_cap = cap;
    }
    l = &h->leases[h->nleases];
    memset(l, 0, sizeof(*l));
    l->resource = strdup(resource);
    if (!l->resource) {
        rl_fatal(h, REDLOCKD_E_NOMEM, "out of memory");
        return NULL;
    }
    l->lost = true;
    h->nleases++;
    return l;
}

static void rl_lease_del(struct redlockd *h, const char *resource)
{
    struct rl_lease *l = rl_lease_find(h, resource);

    if (!l)
        return;
    free(l->resource);
    *l = h->leases[--h->nleases];
}

/* The daemon no longer holds it for us. fence 0: not known. */
static int rl_lease_lose(struct redlockd *h, const char *resource,
                         uint64_t fence)
{
    struct rl_lease *l = rl_lease_get(h, resource);

    if (!l)
        return -REDLOCKD_E_NOMEM;
    l->lost = true;
    if (fence != 0)
        l->fence = fence;
    return 0;
}

/* The last request confirmed validity_ms of the lease. */
static void rl_lease_confirm(struct redlockd *h, struct rl_lease *l,
                             int64_t validity_ms)
{
    l->deadline = h->sent_ms + (validity_ms > 0 ? validity_ms : 0);
}

int redlockd_lost(const struct redlockd *h, const char *resource)
{
    const struct rl_lease *l;

    if (h->fd < 0)
        return 1;
    l = resource ? rl_lease_find(h, resource) : NULL;
    return l && l->lost;
}

int redlockd_lease_deadline(const struct redlockd *h, const char *resource,
                            int64_t *deadline_ms)
{
    const struct rl_lease *l = resource ? rl_lease_find(h, resource)
                                                : NULL;

    if (!l)
        return -REDLOCKD_E_NOTHELD;
    if (h->fd < 0 || l->lost)
        return -REDLOCKD_E_LOST;
    if (deadline_ms)
        *deadline_ms = l->deadline;
    return 0;
}

int redlockd_lease_check(const struct redlockd *h, const char *resource)
{
    int64_t deadline;
    int rc = redlockd_lease_deadline(h, resource, &deadline);

    if (rc == 0 && rl_now_ms() >= deadline)
        rc = -REDLOCKD_E_LOST;
    return rc;
}

/* ---- events ------------------------------------------------------------- */

static int rl_is_event(const char *line, size_t len)
{
    return len > 6 && memcmp(line, "EVENT", 5) == 0
        && (line[5] == ' ' || line[5] == '\t');
}

static int rl_event_lost(struct redlockd *h, const struct proto_reply *ev)
{
    const char *res = proto_reply_get(ev, "resource");
    const char *reason = proto_reply_get(ev, "reason");
    const char *fence_s = proto_reply_get(ev, "fence");
    uint64_t fence = 0;
    int rc;

    if (!res || *res == '\0')
        return rl_fatal(h, REDLOCKD_E_PROTO, "EVENT LOST without a resource");
    /* A missing or odd fence must not hide the loss itself. */
    if (proto_parse_u64(fence_s, rl_len(fence_s), &fence) < 0)
        fence = 0;
    rc = rl_lease_lose(h, res, fence);
    if (rc < 0)
        return rc;
    if (h->on_lost) {
        h->in_callback++;
        h->on_lost(res, fence, reason ? reason : "", h->ud);
        h->in_callback--;
    }
    return 0;
}

/* line is one EVENT line in the input buffer (LF still there). */
static int rl_event(struct redlockd *h, char *line, size_t len)
{
    struct proto_reply ev;

    if (proto_reply_parse(line, len, &ev) < 0 || ev.kind != PROTO_REPLY_EVENT)
        return rl_fatal(h, REDLOCKD_E_PROTO, "unparseable EVENT line");
    h->nevents++;
    if (strcmp(ev.text, "LOST") == 0)
        return rl_event_lost(h, &ev);
    if (strcmp(ev.text, "SHUTDOWN") == 0)
        h->shutdown_seen = 1;
    /* Other events are for newer clients. */
    return 0;
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
    int rc;

    rc = rl_in_reserve(h);
    if (rc < 0)
        return rc;
    /* Callers check rl_in_overlong first; a zero-length recv would look
     * like EOF. */
    if (h->in_len == h->in_cap)
        return rl_fatal(h, REDLOCKD_E_PROTO, "line from the daemon too long");
    for (;;) {
        n = recv(h->fd, h->in + h->in_len, h->in_cap - h->in_len, 0);
        if (n > 0) {
            h->in_len += (size_t)n;
            return 0;
        }
        if (n == 0)
            return rl_fatal(h, REDLOCKD_E_CLOSED,
                            "the daemon closed the connection%s",
                            h->shutdown_seen ? " (it is shutting down)" : "");
        rc = rl_io_retry(h, POLLIN, deadline, "receive");
        if (rc != 0)
            return rc;
    }
}

/* Handle every complete line already read; they must all be events, as no
 * request is outstanding. */
static int rl_drain_events(struct redlockd *h)
{
    char *line;
    size_t len;
    int rc;

    while (h->fd >= 0 && rl_next_line(h, &line, &len)) {
        if (!rl_is_event(line, len))
            return rl_fatal(h, REDLOCKD_E_PROTO,
                            "the daemon sent a reply nobody asked for");
        rc = rl_event(h, line, len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int rl_begin(struct redlockd *h);

int redlockd_poll_events(struct redlockd *h, int timeout_ms)
{
    int64_t deadline = rl_deadline(timeout_ms);
    unsigned long before = h->nevents;
    int rc = rl_begin(h);

    if (rc < 0)
        return rc;
    for (;;) {
        rc = rl_drain_events(h);
        if (rc < 0)
            return rc;
        if (h->nevents != before)
            return (int)(h->nevents - before);
        if (rl_in_overlong(h))
            return rl_fatal(h, REDLOCKD_E_PROTO,
                            "line from the daemon too long");
        rc = rl_fill(h, deadline);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
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
            if (!rl_is_event(line, len))
                return rl_take_reply(h, line, len, r);
            rc = rl_event(h, line, len);
            if (rc < 0)
                return rc;
        }
        if (rl_in_overlong(h))
            return rl_fatal(h, REDLOCKD_E_PROTO, "reply longer than %d bytes",
                            REDLOCKD_MAX_REPLY);
        rc = rl_fill(h, deadline);
        if (rc != 0)
            return rc;
    }
}

static int rl_send(struct redlockd *h, const char *buf, size_t len,
                   int64_t deadline)
{
    ssize_t n;
    int rc;

    while (len > 0) {
        n = send(h->fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        /* The daemon may have said why before closing: read that instead. */
        if (errno == EPIPE || errno == ECONNRESET)
            return 0;
        rc = rl_io_retry(h, POLLOUT, deadline, "send");
        if (rc < 0)
            return rc;
        if (rc == 1)
            return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "send timed out");
    }
    return 0;
}

static int rl_daemon_err(struct redlockd *h, const struct proto_reply *r)
{
    int code;

    if (r->err == PROTO_ERR_NONE)
        return rl_fail(h, REDLOCKD_E_OTHER, "%s %s", r->err_word, r->text);
    code = rl_code_of_proto[r->err];
    rl_fail(h, code, "%s", *r->text != '\0' ? r->text
                                             : proto_err_default_msg(r->err));
    /* The daemon closes after TOOLONG. */
    if (code == REDLOCKD_E_TOOLONG)
        rl_disconnect(h);
    return -code;
}

/* Start of every request: a usable handle and a clean error. */
static int rl_begin(struct redlockd *h)
{
    if (h->in_callback)
        return rl_fail(h, REDLOCKD_E_INVALID,
                       "called from the on_lost callback");
    if (h->fd < 0)
        return rl_fail(h, REDLOCKD_E_CLOSED, "not connected (%.200s)", h->dead);
    h->err.code = 0;
    h->err.msg[0] = '\0';
    return 0;
}

/* Start a request line in h->req: its command word, from the table. */
static struct sbuf *rl_req(struct redlockd *h, enum proto_cmd cmd)
{
    sbuf_reset(&h->req);
    proto_format_cmd(&h->req, cmd);
    return &h->req;
}

/* A whole request without options ("PING\n", "UNLOCK job:42\n"). */
static void rl_req_line(struct redlockd *h, enum proto_cmd cmd,
                        const char *arg)
{
    sbuf_reset(&h->req);
    proto_format_request(&h->req, cmd, arg);
}

/*
 * Send the request line built in h->req (noting when in h->sent_ms) and
 * read its reply into r (valid until the next request), giving up at
 * deadline (-1: never). ERR replies become their code; 1: no reply in
 * time, the connection still open. The caller handles r, then ends with
 * rl_finish.
 */
static int rl_exchange(struct redlockd *h, int64_t deadline,
                       struct proto_reply *r)
{
    int rc;

    h->sent_ms = rl_now_ms();
    rc = rl_send(h, h->req.data, h->req.len, deadline);
    if (rc < 0)
        return rc;
    rc = rl_read_reply(h, deadline, r);
    if (rc != 0)
        return rc;
    if (r->kind == PROTO_REPLY_ERR)
        return rl_daemon_err(h, r);
    return 0;
}

/* -1: no deadline. */
static int64_t rl_io_deadline(const struct redlockd *h, uint32_t extra_ms)
{
    return h->io_timeout_ms < 0 ? -1
                                : rl_now_ms() + h->io_timeout_ms + extra_ms;
}

/* rl_exchange within the I/O timeout; extra_ms lengthens it for requests
 * the daemon may hold on purpose (LOCK wait=). */
static int rl_call(struct redlockd *h, uint32_t extra_ms,
                   struct proto_reply *r)
{
    int rc = rl_exchange(h, rl_io_deadline(h, extra_ms), r);

    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT,
                        "no reply from the daemon in time");
    return rc;
}

/* Events that came in behind the reply are handled now, so that poll() on
 * the socket never sleeps on an event already read. */
static int rl_finish(struct redlockd *h, int rc)
{
    int drc = rl_drain_events(h);

    return drc < 0 ? drc : rc;
}

static int rl_expect(struct redlockd *h, const struct proto_reply *r,
                     enum proto_reply_kind kind, enum proto_cmd cmd)
{
    if (r->kind == kind)
        return 0;
    return rl_fatal(h, REDLOCKD_E_PROTO, "unexpected reply to %s",
                    proto_cmd_name(cmd));
}

/* The daemon's rule (proto_valid_resource), under the library's own cap;
 * the daemon's configured one may be lower. */
/* A request without options ("PING", "UNLOCK job:42") whose reply has
 * nothing to read but its kind. */
static int rl_call_expect(struct redlockd *h, enum proto_cmd cmd,
                          const char *arg, enum proto_reply_kind kind)
{
    struct proto_reply r;
    int rc;

    rl_req_line(h, cmd, arg);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, kind, cmd);
    return rc;
}

static int rl_check_resource(struct redlockd *h, const char *resource)
{
    static const struct proto_limits lim = { REDLOCKD_RESOURCE_MAX };

    if (resource
        && proto_valid_resource(resource, strlen(resource), &lim))
        return 0;
    return rl_fail(h, REDLOCKD_E_INVALID,
                   "a resource name is 1 to %d visible ASCII characters",
                   REDLOCKD_RESOURCE_MAX);
}

/* Start of a request on one resource. */
static int rl_begin_on(struct redlockd *h, const char *resource)
{
    int rc = rl_begin(h);

    return rc < 0 ? rc : rl_check_resource(h, resource);
}

/* "LOCK job:42": the command word and its resource, options to follow. */
static struct sbuf *rl_req_on(struct redlockd *h, enum proto_cmd cmd,
                              const char *resource)
{
    struct sbuf *b = rl_req(h, cmd);

    proto_format_word(b, resource);
    return b;
}

/* ---- the handle --------------------------------------------------------- */

int redlockd_open_fd(struct redlockd **out, int fd,
                     const struct redlockd_opts *opts,
                     struct redlockd_error *err)
{
    struct redlockd *h;
    int fl;

    *out = NULL;
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0
        || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        rl_seterr(err, REDLOCKD_E_IO, "fcntl: %s", strerror(errno));
        close(fd);
        return -REDLOCKD_E_IO;
    }
    h = calloc(1, sizeof(*h));
    if (!h || sbuf_try_reserve(&h->req, RL_REQ_MAX) < 0) {
        free(h);
        close(fd);
        return rl_seterr(err, REDLOCKD_E_NOMEM, "out of memory");
    }
    h->fd = fd;
    h->io_timeout_ms = RL_IO_TIMEOUT_MS;
    if (opts) {
        if (opts->io_timeout_ms != 0)
            h->io_timeout_ms = opts->io_timeout_ms;
        h->on_lost = opts->on_lost;
        h->ud = opts->ud;
    }
    *out = h;
    return 0;
}

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
    return 0;
}

static void rl_copy_word(char *dst, size_t sz, const char *src)
{
    snprintf(dst, sz, "%s", src ? src : "");
}

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

static int rl_hello(struct redlockd *h, const struct redlockd_opts *o)
{
    struct sbuf *b = rl_req(h, PROTO_CMD_HELLO);
    struct proto_reply r;
    int rc;

    proto_format_opt_u64(b, PROTO_OPT_PROTO, PROTO_VERSION);
    if (o->name)
        proto_format_opt_str(b, PROTO_OPT_NAME, o->name);
    if (o->keepalive_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_KEEPALIVE, o->keepalive_ms);
    proto_format_end(b);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_hello_reply(h, &r);
    return rl_finish(h, rc);
}

static int rl_auth(struct redlockd *h, const char *password)
{
    return rl_finish(h, rl_call_expect(h, PROTO_CMD_AUTH, password,
                                       PROTO_REPLY_OK));
}

int redlockd_handshake(struct redlockd *h, const struct redlockd_opts *opts)
{
    int rc;

    rc = rl_begin(h);
    if (rc == 0)
        rc = rl_check_opts(opts, &h->err);
    if (rc == 0)
        rc = rl_hello(h, opts);
    if (rc == 0 && opts->password)
        rc = rl_auth(h, opts->password);
    return rc;
}

static const char *rl_server(const struct redlockd_opts *o)
{
    const char *env;

    if (o->server)
        return o->server;
    env = getenv(REDLOCKD_SERVER_ENV);
    return env && *env != '\0' ? env : REDLOCKD_DEFAULT_SERVER;
}

int redlockd_connect(struct redlockd **out, const struct redlockd_opts *opts,
                     struct redlockd_error *err)
{
    struct redlockd_opts none;
    struct redlockd_addr addr;
    struct redlockd *h;
    int fd, rc, timeout;

    *out = NULL;
    if (!opts) {
        memset(&none, 0, sizeof(none));
        opts = &none;
    }
    rc = rl_check_opts(opts, err);
    if (rc == 0)
        rc = redlockd_addr_parse(rl_server(opts), &addr, err);
    if (rc < 0)
        return rc;
    timeout = opts->connect_timeout_ms ? opts->connect_timeout_ms
                                       : RL_CONNECT_TIMEOUT_MS;
    rc = rl_connect_fd(&addr, timeout, &fd, err);
    if (rc == 0)
        rc = redlockd_open_fd(&h, fd, opts, err);
    if (rc < 0)
        return rc;
    /* No handle yet for the caller, so no on_lost calls for it either. */
    h->on_lost = NULL;
    rc = redlockd_handshake(h, opts);
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

/* Send QUIT and wait briefly for the daemon to close its end, so a clean
 * close never looks like a dropped session (lock_delay_ms). */
static void rl_quit(struct redlockd *h)
{
    int timeout = RL_QUIT_TIMEOUT_MS;
    int64_t deadline;
    char scratch[512];
    ssize_t n;

    if (h->io_timeout_ms >= 0 && h->io_timeout_ms < timeout)
        timeout = h->io_timeout_ms;
    deadline = rl_deadline(timeout);
    rl_req_line(h, PROTO_CMD_QUIT, NULL);
    if (send(h->fd, h->req.data, h->req.len, MSG_NOSIGNAL)
        != (ssize_t)h->req.len)
        return;
    for (;;) {
        n = recv(h->fd, scratch, sizeof(scratch), 0);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return;
        if (rl_wait(h->fd, POLLIN, deadline) <= 0)
            return;
    }
}

void redlockd_close(struct redlockd *h)
{
    size_t i;

    if (!h)
        return;
    if (h->fd >= 0) {
        rl_quit(h);
        close(h->fd);
    }
    for (i = 0; i < h->nleases; i++)
        free(h->leases[i].resource);
    free(h->leases);
    free(h->in);
    free(h->reply);
    sbuf_deinit(&h->req);
    free(h);
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

/* ---- commands ----------------------------------------------------------- */

static int rl_lease_fill(struct redlockd *h, const struct proto_reply *r,
                         const char *resource, struct redlockd_lease *lease)
{
    const char *token = proto_reply_get(r, "token");
    const char *fence = proto_reply_get(r, "fence");
    const char *ttl_s = proto_reply_get(r, "ttl");
    const char *validity = proto_reply_get(r, "validity");
    uint32_t ttl = 0;

    if (!token || strlen(token) > REDLOCKD_TOKEN_LEN
        || proto_parse_u64(fence, rl_len(fence), &lease->fence) < 0
        || proto_parse_u32(ttl_s, rl_len(ttl_s), &ttl) < 0
        || proto_parse_i64(validity, rl_len(validity), &lease->validity) < 0)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCK");
    lease->ttl = ttl;
    strcpy(lease->token, token);
    strcpy(lease->resource, resource);
    return 0;
}

static int rl_refresh(struct redlockd *h, int timeout_ms, bool watch);

/* A new lease: its entry, no longer lost (events read after this reply are
 * about the new lease), with its first deadline. */
static int rl_lease_taken(struct redlockd *h, const struct redlockd_lease *ls)
{
    struct rl_lease *l = rl_lease_get(h, ls->resource);

    if (!l)
        return -REDLOCKD_E_NOMEM;
    l->lost = false;
    l->fence = ls->fence;
    l->ttl = ls->ttl;
    rl_lease_confirm(h, l, ls->validity);
    return 0;
}

static int rl_lock_reply(struct redlockd *h, const struct proto_reply *r,
                         const char *resource, struct redlockd_lease *lease)
{
    struct redlockd_lease scratch;
    int rc;

    if (!lease)
        lease = &scratch;
    rc = rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_LOCK);
    if (rc == 0)
        rc = rl_lease_fill(h, r, resource, lease);
    if (rc == 0)
        rc = rl_lease_taken(h, lease);
    /* The deadline counts from when LOCK was sent, however long it waited
     * for the grant: if that used up half the validity, confirm the lease
     * again now rather than hand out a deadline about to pass. */
    if (rc == 0 && rl_now_ms() >= h->sent_ms + lease->validity / 2)
        rc = rl_refresh(h, -1, false);
    return rc;
}

int redlockd_lock(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                  uint32_t wait_ms, int renew, struct redlockd_lease *lease)
{
    struct proto_reply r;
    struct sbuf *b;
    int rc = rl_begin_on(h, resource);

    if (rc < 0)
        return rc;
    b = rl_req_on(h, PROTO_CMD_LOCK, resource);
    if (ttl_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_TTL, ttl_ms);
    if (wait_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_WAIT, wait_ms);
    proto_format_opt_u64(b, PROTO_OPT_RENEW, renew ? 1 : 0);
    proto_format_end(b);
    rc = rl_call(h, wait_ms, &r);
    if (rc == 0)
        rc = rl_lock_reply(h, &r, resource, lease);
    return rl_finish(h, rc);
}

/* After an UNLOCK or EXTEND answered rc: LOST, and NOTHELD for a lease we
 * thought held, mean the daemon no longer holds it for us. */
static int rl_lease_refused(struct redlockd *h, const char *resource, int rc)
{
    if (rc == -REDLOCKD_E_LOST
        || (rc == -REDLOCKD_E_NOTHELD && rl_lease_find(h, resource))) {
        if (rl_lease_lose(h, resource, 0) < 0)
            return -REDLOCKD_E_NOMEM;
    }
    return rc;
}

int redlockd_unlock(struct redlockd *h, const char *resource)
{
    int rc = rl_begin_on(h, resource);

    if (rc < 0)
        return rc;
    rc = rl_call_expect(h, PROTO_CMD_UNLOCK, resource, PROTO_REPLY_OK);
    if (rc == 0)
        rl_lease_del(h, resource);
    else
        rc = rl_lease_refused(h, resource, rc);
    return rl_finish(h, rc);
}

static int rl_extend_reply(struct redlockd *h, const struct proto_reply *r,
                           const char *resource, uint32_t ttl_ms,
                           int64_t *validity_ms)
{
    const char *validity = proto_reply_get(r, "validity");
    struct rl_lease *l = rl_lease_find(h, resource);
    int64_t v;

    if (rl_expect(h, r, PROTO_REPLY_OK, PROTO_CMD_EXTEND) < 0)
        return -REDLOCKD_E_PROTO;
    if (proto_parse_i64(validity, rl_len(validity), &v) < 0)
        return rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to EXTEND");
    if (l && !l->lost) {
        l->ttl = ttl_ms;
        rl_lease_confirm(h, l, v);
    }
    if (validity_ms)
        *validity_ms = v;
    return 0;
}

/* An EXTEND that failed otherwise (UNAVAILABLE) may have set the shorter
 * ttl on some nodes: until a refresh says how long the lease now is, it is
 * confirmed only up to when the EXTEND went out. A longer ttl can only
 * have lengthened it. */
static void rl_extend_failed(struct redlockd *h, const char *resource,
                             uint32_t ttl_ms)
{
    struct rl_lease *l = rl_lease_find(h, resource);

    if (l && !l->lost && ttl_ms < l->ttl && h->sent_ms < l->deadline)
        l->deadline = h->sent_ms;
}

int redlockd_extend(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                    int64_t *validity_ms)
{
    struct proto_reply r;
    struct sbuf *b;
    int rc = rl_begin_on(h, resource);

    if (rc == 0 && ttl_ms == 0)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "EXTEND needs a ttl above 0");
    if (rc < 0)
        return rc;
    b = rl_req_on(h, PROTO_CMD_EXTEND, resource);
    proto_format_opt_u64(b, PROTO_OPT_TTL, ttl_ms);
    proto_format_end(b);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_extend_reply(h, &r, resource, ttl_ms, validity_ms);
    else if (rc == -REDLOCKD_E_UNAVAILABLE)
        rl_extend_failed(h, resource, ttl_ms);
    else
        rc = rl_lease_refused(h, resource, rc);
    return rl_finish(h, rc);
}

int redlockd_ping(struct redlockd *h)
{
    int rc = rl_begin(h);

    if (rc < 0)
        return rc;
    return rl_finish(h, rl_call_expect(h, PROTO_CMD_PING, NULL,
                                       PROTO_REPLY_PONG));
}

/* ---- refreshing the deadlines ------------------------------------------ */

/* The member of a LOCKS "locks" array for resource, or NULL. */
static json_t *rl_locks_entry(json_t *locks, const char *resource)
{
    json_t *e;
    size_t i;

    json_array_foreach(locks, i, e) {
        const char *res = json_string_value(json_object_get(e, "resource"));

        if (res && strcmp(res, resource) == 0)
            return e;
    }
    return NULL;
}

static bool rl_json_lists(json_t *names, const char *resource)
{
    json_t *e;
    size_t i;

    json_array_foreach(names, i, e) {
        const char *res = json_string_value(e);

        if (res && strcmp(res, resource) == 0)
            return true;
    }
    return false;
}

/* A lease the daemon no longer lists: lost, as if EVENT LOST had said so. */
static void rl_lease_missing(struct redlockd *h, struct rl_lease *l)
{
    l->lost = true;
    if (h->on_lost) {
        h->in_callback++;
        h->on_lost(l->resource, l->fence, "missing", h->ud);
        h->in_callback--;
    }
}

/* One held lease against the LOCKS answer: a new deadline, or lost. */
static int rl_refresh_lease(struct redlockd *h, struct rl_lease *l,
                            json_t *locks, json_t *lost)
{
    json_t *e = rl_locks_entry(locks, l->resource), *fence, *validity;

    if (!e || rl_json_lists(lost, l->resource)) {
        rl_lease_missing(h, l);
        return 0;
    }
    fence = json_object_get(e, "fence");
    validity = json_object_get(e, "validity");
    if (!json_is_integer(fence) || !json_is_integer(validity))
        return rl_fatal(h, REDLOCKD_E_PROTO,
                        "malformed lease %.200s in reply to LOCKS",
                        l->resource);
    /* Another fence is another acquisition: not the lease we hold. */
    if ((uint64_t)json_integer_value(fence) != l->fence)
        rl_lease_missing(h, l);
    else
        rl_lease_confirm(h, l, json_integer_value(validity));
    return 0;
}

static int rl_refresh_reply(struct redlockd *h, const struct proto_reply *r)
{
    json_error_t jerr;
    json_t *root, *locks;
    size_t i;
    int rc = 0;

    if (r->kind != PROTO_REPLY_OK || r->text[0] != '{')
        return rl_fatal(h, REDLOCKD_E_PROTO, "LOCKS did not answer with JSON");
    root = json_loads(r->text, 0, &jerr);
    locks = json_object_get(root, "locks");
    if (!json_is_array(locks))
        rc = rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCKS: %s",
                      !root ? jerr.text : "no \"locks\" array");
    for (i = 0; rc == 0 && i < h->nleases; i++) {
        if (!h->leases[i].lost)
            rc = rl_refresh_lease(h, &h->leases[i], locks,
                                  json_object_get(root, "lost"));
    }
    json_decref(root);
    return rc;
}

/* The held lease whose deadline comes first among those still ahead. */
static const struct rl_lease *rl_lease_next_due(const struct redlockd *h)
{
    const struct rl_lease *first = NULL;
    int64_t now = rl_now_ms();
    size_t i;

    for (i = 0; i < h->nleases; i++) {
        const struct rl_lease *l = &h->leases[i];

        if (!l->lost && l->deadline > now
            && (!first || l->deadline < first->deadline))
            first = l;
    }
    return first;
}

/* The caller may be waiting in here to stop its work at a deadline: never
 * wait for the answer past one (unless !watch: the confirmation of a new
 * lease, whose deadline may be about to pass), nor past the I/O timeout or
 * the caller's own timeout_ms (negative: none). */
static int rl_refresh(struct redlockd *h, int timeout_ms, bool watch)
{
    const struct rl_lease *due = watch ? rl_lease_next_due(h) : NULL;
    int64_t until = rl_io_deadline(h, 0);
    struct proto_reply r;
    bool by_lease = false;
    int rc;

    if (timeout_ms >= 0 && (until < 0 || rl_now_ms() + timeout_ms < until))
        until = rl_now_ms() + timeout_ms;
    if (due && (until < 0 || due->deadline < until)) {
        until = due->deadline;
        by_lease = true;
    }
    rl_req_line(h, PROTO_CMD_LOCKS, NULL);
    rc = rl_exchange(h, until, &r);
    if (rc == 1 && by_lease)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT,
                        "no reply to LOCKS before the deadline of the lease "
                        "on %.200s", due->resource);
    if (rc == 1)
        return rl_fatal(h, REDLOCKD_E_IO_TIMEOUT, "no reply to LOCKS in time");
    if (rc == 0)
        rc = rl_refresh_reply(h, &r);
    return rc;
}

int redlockd_refresh_within(struct redlockd *h, int timeout_ms)
{
    int rc = rl_begin(h);

    if (rc < 0)
        return rc;
    return rl_finish(h, rl_refresh(h, timeout_ms, true));
}

int redlockd_refresh(struct redlockd *h)
{
    return redlockd_refresh_within(h, -1);
}

static int rl_json_reply(struct redlockd *h, const struct proto_reply *r,
                         const char *what, char **json)
{
    if (r->kind != PROTO_REPLY_OK || r->text[0] != '{')
        return rl_fatal(h, REDLOCKD_E_PROTO, "%s did not answer with JSON",
                        what);
    *json = strdup(r->text);
    if (!*json)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return 0;
}

/* An inspection command, with its resource (STATUS) or NULL. */
static int rl_inspect(struct redlockd *h, enum proto_cmd cmd, const char *arg,
                      char **json)
{
    struct proto_reply r;
    int rc;

    rl_req_line(h, cmd, arg);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_json_reply(h, &r, proto_cmd_name(cmd), json);
    rc = rl_finish(h, rc);
    if (rc < 0) {
        free(*json);
        *json = NULL;
    }
    return rc;
}

static int rl_inspect_begin(struct redlockd *h, char **json)
{
    int rc = rl_begin(h);

    if (rc == 0 && !json)
        rc = rl_fail(h, REDLOCKD_E_INVALID, "json must not be NULL");
    if (rc == 0)
        *json = NULL;
    return rc;
}

int redlockd_locks(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_LOCKS, NULL, json);
}

int redlockd_sessions(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_SESSIONS, NULL, json);
}

int redlockd_stats(struct redlockd *h, char **json)
{
    int rc = rl_inspect_begin(h, json);

    return rc < 0 ? rc : rl_inspect(h, PROTO_CMD_STATS, NULL, json);
}

int redlockd_status(struct redlockd *h, const char *resource, char **json)
{
    int rc = rl_inspect_begin(h, json);

    if (rc == 0)
        rc = rl_check_resource(h, resource);
    if (rc < 0)
        return rc;
    return rl_inspect(h, PROTO_CMD_STATUS, resource, json);
}

/* ---- operators ---------------------------------------------------------- */

int redlockd_force_unlock(struct redlockd *h, const char *resource)
{
    struct proto_reply r;
    const char *nodes;
    uint32_t n;
    int rc = rl_begin_on(h, resource);

    if (rc < 0)
        return rc;
    rl_req_line(h, PROTO_CMD_FORCEUNLOCK, resource);
    rc = rl_call(h, 0, &r);
    if (rc == 0)
        rc = rl_expect(h, &r, PROTO_REPLY_OK, PROTO_CMD_FORCEUNLOCK);
    if (rc == 0) {
        nodes = proto_reply_get(&r, "nodes");
        if (proto_parse_u32(nodes, rl_len(nodes), &n) < 0 || n > INT32_MAX)
            rc = rl_fatal(h, REDLOCKD_E_PROTO,
                          "malformed reply to FORCEUNLOCK");
        else
            rc = (int)n;
    }
    return rl_finish(h, rc);
}

/* ---- lock kinds: shared, semaphores, several resources ------------------ */

/* The names, checked, and room in h->req for a line naming them all. */
static int rl_check_resources(struct redlockd *h, const char *const *res,
                              size_t n)
{
    size_t need = RL_REQ_MAX;

    if (!res || n == 0 || n > PROTO_MAX_RESOURCES)
        return rl_fail(h, REDLOCKD_E_INVALID, "1 to %d resources",
                       PROTO_MAX_RESOURCES);
    for (size_t i = 0; i < n; i++) {
        int rc = rl_check_resource(h, res[i]);
        if (rc < 0)
            return rc;
        need += strlen(res[i]) + 1;
    }
    sbuf_reset(&h->req);
    if (sbuf_try_reserve(&h->req, need) < 0)
        return rl_fail(h, REDLOCKD_E_NOMEM, "out of memory");
    return 0;
}

/* Begin a request naming several resources: "<CMD> r1 r2 ..." in *b. */
static int rl_req_names(struct redlockd *h, enum proto_cmd cmd,
                        const char *const *resources, size_t n,
                        struct sbuf **b)
{
    int rc = rl_begin(h);

    if (rc == 0)
        rc = rl_check_resources(h, resources, n);
    if (rc < 0)
        return rc;
    *b = rl_req(h, cmd);
    for (size_t i = 0; i < n; i++)
        proto_format_word(*b, resources[i]);
    return 0;
}

/* End request b of command cmd, send it and expect OK (extra_ms as for
 * rl_call). */
static int rl_call_ok(struct redlockd *h, struct sbuf *b, uint32_t extra_ms,
                      enum proto_cmd cmd, struct proto_reply *r)
{
    int rc;

    proto_format_end(b);
    rc = rl_call(h, extra_ms, r);
    return rc == 0 ? rl_expect(h, r, PROTO_REPLY_OK, cmd) : rc;
}

int redlockd_lockv(struct redlockd *h, const char *const *resources, size_t n,
                   const struct redlockd_lock_opts *opts,
                   struct redlockd_grant *grant)
{
    static const struct redlockd_lock_opts defaults;
    const struct redlockd_lock_opts *o = opts ? opts : &defaults;
    struct redlockd_grant scratch;
    struct redlockd_grant *g = grant ? grant : &scratch;
    struct proto_reply r;
    struct sbuf *b;
    int rc;

    rc = rl_req_names(h, PROTO_CMD_LOCK, resources, n, &b);
    if (rc < 0)
        return rc;
    if (o->ttl_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_TTL, o->ttl_ms);
    if (o->wait_ms > 0)
        proto_format_opt_u64(b, PROTO_OPT_WAIT, o->wait_ms);
    if (o->no_renew)
        proto_format_opt_u64(b, PROTO_OPT_RENEW, 0);
    if (o->mode == REDLOCKD_SHARED)
        proto_format_opt_str(b, PROTO_OPT_MODE, "shared");
    if (o->limit > 0)
        proto_format_opt_u64(b, PROTO_OPT_LIMIT, o->limit);
    rc = rl_call_ok(h, b, o->wait_ms, PROTO_CMD_LOCK, &r);
    if (rc == 0)
        rc = rl_lease_fill(h, &r, resources[0], &g->lease);
    if (rc == 0) {
        const char *mode = proto_reply_get(&r, "mode");
        const char *limit = proto_reply_get(&r, "limit");
        const char *slot = proto_reply_get(&r, "slot");
        const char *nres = proto_reply_get(&r, "resources");
        uint32_t k = 1;

        g->mode = mode && strcmp(mode, "shared") == 0 ? REDLOCKD_SHARED
                                                      : REDLOCKD_EXCLUSIVE;
        g->limit = g->slot = 0;
        if ((limit && proto_parse_u32(limit, strlen(limit), &g->limit) < 0) ||
            (slot && proto_parse_u32(slot, strlen(slot), &g->slot) < 0) ||
            (nres && proto_parse_u32(nres, strlen(nres), &k) < 0) ||
            k != n)
            rc = rl_fatal(h, REDLOCKD_E_PROTO, "malformed reply to LOCK");
        g->nresources = k;
    }
    /* Each resource is a lease of its own, with the deadline rule. */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct redlockd_lease one = g->lease;
        snprintf(one.resource, sizeof(one.resource), "%s", resources[i]);
        rc = rl_lease_taken(h, &one);
    }
    return rl_finish(h, rc);
}

int redlockd_unlockv(struct redlockd *h, const char *const *resources,
                     size_t n)
{
    struct proto_reply r;
    struct sbuf *b;
    int rc;

    rc = rl_req_names(h, PROTO_CMD_UNLOCK, resources, n, &b);
    if (rc < 0)
        return rc;
    rc = rl_call_ok(h, b, 0, PROTO_CMD_UNLOCK, &r);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            rl_lease_del(h, resources[i]);
        else if (rc == -REDLOCKD_E_LOST && rl_lease_lose(h, resources[i], 0) < 0)
            rc = -REDLOCKD_E_NOMEM;
    }
    return rl_finish(h, rc);
}
