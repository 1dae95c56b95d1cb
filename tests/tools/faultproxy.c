/*
 * redlockd-faultproxy: a userspace TCP fault proxy for the fault tests.
 *
 * tc netem is not available on the test kernels, so a test that wants a
 * slow, partitioned or resetting Redis node puts one of these in front of
 * it: the daemon is configured with the proxy's port, the test itself
 * talks to the node directly, and only the daemon sees the fault.
 *
 *   redlockd-faultproxy -l [127.0.0.1:]PORT -t [127.0.0.1:]PORT -c SOCKET
 *
 * It listens on 127.0.0.1:PORT (0: the kernel picks one) and forwards every
 * accepted connection to the target, which must be on 127.0.0.1 too. Once
 * both sockets are bound it prints "ready 127.0.0.1:<port>" on stdout.
 * Faults are switched at run time over the unix control socket SOCKET, one
 * command per line, one reply line per command, "OK ..." or "ERR ...":
 *
 *   pass             plain forwarding again: no delay, no blackhole, no
 *                    refuse. Held chunks leave now; delayed ones keep their
 *                    due time (they are "in flight").
 *   delay MS         every chunk, both ways, leaves MS ms after it was read
 *   delay-up MS      the same for client -> server only
 *   delay-down MS    the same for server -> client only
 *   blackhole [hold] forward nothing either way, but keep reading (up to
 *                    the cap) and keep it: after `pass` it is delivered in
 *                    order, which is what TCP does when a partition heals
 *                    (its retransmissions turn loss into delay). The default.
 *   blackhole drop   forward nothing and discard what is read from now on
 *                    (chunks queued before are held): lost messages. It
 *                    can cut a stream in the middle of one, which real TCP
 *                    never does; use it for "the request never arrived".
 *   refuse           reset new connections right after accept (the
 *                    client's connect() succeeds, its first read fails)
 *   reset            RST every open connection now, on both sides, and
 *                    keep accepting
 *   stats            one line of counters
 *   help             the command list
 *
 * The settings are independent (a delay stays on under a blackhole) until
 * `pass`. A blackhole does not stop new connections: the kernel completes
 * the handshake anyway, so a client reconnecting to a partitioned node sees
 * a silent connection, not a connect timeout. If the target refuses, the
 * client is reset.
 *
 * Each connection has two flows, up (client -> server) and down. A flow
 * reads its source into a FIFO of chunks stamped with the time they may
 * leave (read time + that direction's delay); a timer writes them out in
 * order as they come due, so a later, shorter delay never overtakes an
 * earlier one. EOF and a read error travel through the same FIFO as
 * markers: the peer's FIN or RST arrives after the bytes sent before it,
 * delayed and held like them (a blackhole drops data, never a marker).
 *
 * Memory is bounded: a flow holds at most FLOW_HOLD_MAX bytes, queued or
 * being written, chunk headers counted. At the cap it stops reading its
 * source, so the sender sees TCP back-pressure, not loss. At most
 * PROXY_CONNS_MAX connections are open; more are reset at accept. So the
 * whole process holds at most about 2 * 256 KiB * 256 = 128 MiB of data.
 *
 * One thread, one libuv loop, no polling: timers and sockets only.
 * SIGTERM or SIGINT closes everything and exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uv.h>

#include "daemon/list.h"

#define PROXY_CONNS_MAX 256
#define PROXY_BACKLOG 128
#define FLOW_HOLD_MAX (256 * 1024)  /* bytes one flow may hold */
#define FLOW_READ_MAX 65536         /* one read, so the largest chunk */
#define CTL_LINE_MAX 256            /* a longer command line is refused */
#define CTL_REPLY_MAX 512
#define CTL_ARGS_MAX 2              /* words after the command */
#define CTL_CLIENTS_MAX 16
#define DELAY_MAX_MS 3600000u
#define PORT_TEXT_MAX 5             /* digits of 65535 */

enum { FLOW_UP, FLOW_DOWN, FLOW_COUNT };

enum blackhole { BLACKHOLE_OFF, BLACKHOLE_HOLD, BLACKHOLE_DROP };

static const char *const blackhole_name[] = { "off", "hold", "drop" };

enum chunk_kind { CHUNK_DATA, CHUNK_EOF, CHUNK_RST };

struct flow;

/* Bytes read from a flow's source, or an EOF/RST marker. (own) flow's
 * queue until handed to uv_write; then the write callback frees it. */
struct chunk {
    struct list node;           /* on flow->queue */
    struct flow *flow;
    enum chunk_kind kind;
    uint64_t due_ns;            /* uv_hrtime() when it may leave */
    uv_write_t req;
    size_t len;
    char data[];
};

/* One direction of a connection: src is read, dst is written. */
struct flow {
    struct conn *conn;
    int dir;                    /* FLOW_UP or FLOW_DOWN */
    uv_tcp_t *src, *dst;        /* point into conn */
    struct list queue;          /* chunks not yet written, oldest first */
    size_t held;                /* chunk bytes queued or being written */
    uv_timer_t timer;           /* the queue head's due time */
    uv_shutdown_t shut_req;
    bool reading;
    bool src_done;              /* EOF or an error read: no more reads */
    bool shut;                  /* the EOF marker left: shutdown(dst) sent */
    bool shut_done;
};

/* A proxied connection: four handles, freed after the last close callback.
 * Every handle's data points at a flow (the client's at the up flow, the
 * server's at the down flow: each is the source of its flow). */
struct conn {
    struct list node;           /* on P.conns while open */
    uv_tcp_t client, server;
    uv_connect_t connect_req;
    struct flow flow[FLOW_COUNT];
    bool connected;             /* to the target */
    bool closing;
    int handles;                /* close callbacks still due */
};

/* A control connection. */
struct ctl_client {
    struct list node;           /* on P.ctls while open */
    uv_pipe_t pipe;
    bool closing;
    bool close_after;           /* close once the pending reply is written */
    size_t len;
    char buf[CTL_LINE_MAX];
};

/* A reply being written; freed by its write callback. */
struct ctl_reply {
    uv_write_t req;
    struct ctl_client *cl;
    size_t len;
    char text[];
};

static struct {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_pipe_t ctl;
    uv_signal_t sigterm, sigint;
    struct sockaddr_in target;
    int port;
    unsigned delay_ms[FLOW_COUNT];
    enum blackhole blackhole;
    bool refuse;
    bool stopping;
    struct list conns;
    struct list ctls;
    size_t nconns, nctls;
    uint64_t accepted, refused, resets;
    uint64_t bytes[FLOW_COUNT];     /* written to the other side */
    uint64_t dropped[FLOW_COUNT];   /* read and discarded (blackhole drop) */
} P;

static void conn_close(struct conn *c, bool rst);
static void flow_pump(struct flow *f);

static void proxy_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void proxy_log(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "faultproxy %d: ", P.port);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void *proxy_alloc(size_t size)
{
    void *p = malloc(size);

    if (!p) {
        proxy_log("out of memory");
        abort();
    }
    return p;
}

/* ---- chunks and flows --------------------------------------------------- */

static size_t chunk_size(const struct chunk *k)
{
    return sizeof(*k) + k->len;
}

static void chunk_queue(struct flow *f, enum chunk_kind kind,
                        const char *data, size_t len)
{
    struct chunk *k = proxy_alloc(sizeof(*k) + len);

    k->flow = f;
    k->kind = kind;
    k->due_ns = uv_hrtime() + (uint64_t)P.delay_ms[f->dir] * 1000000u;
    k->len = len;
    if (len > 0)
        memcpy(k->data, data, len);
    list_push_tail(&f->queue, &k->node);
    f->held += chunk_size(k);
}

/* How many data bytes the next read may take without passing the cap. */
static size_t flow_room(const struct flow *f)
{
    size_t used = f->held + sizeof(struct chunk);

    if (used >= FLOW_HOLD_MAX)
        return 0;
    return FLOW_HOLD_MAX - used < FLOW_READ_MAX ? FLOW_HOLD_MAX - used
                                                : FLOW_READ_MAX;
}

static void conn_fail(struct conn *c, const char *what, int err)
{
    if (!c->closing && !P.stopping)
        proxy_log("%s: %s; resetting the connection", what, uv_strerror(err));
    conn_close(c, true);
}

static void flow_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    /* One loop thread, and libuv hands each buffer to the read callback
     * before asking for the next: one static buffer serves every read. */
    static char space[FLOW_READ_MAX];
    struct flow *f = h->data;

    (void)hint;
    buf->base = space;
    buf->len = flow_room(f);
}

static void flow_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Start or stop reading the source as the flow's state asks. */
static void flow_read_update(struct flow *f)
{
    const struct conn *c = f->conn;
    bool want = !c->closing && c->connected && !f->src_done && flow_room(f) > 0;
    int rc = 0;

    if (want == f->reading)
        return;
    f->reading = want;
    if (want)
        rc = uv_read_start((uv_stream_t *)f->src, flow_alloc_cb, flow_read_cb);
    else
        uv_read_stop((uv_stream_t *)f->src);
    if (rc != 0)
        conn_fail(f->conn, "read start", rc);
}

static void flow_release(struct flow *f, struct chunk *k)
{
    f->held -= chunk_size(k);
    free(k);
    flow_read_update(f);
}

static void flow_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct flow *f = s->data;

    if (nread > 0) {
        if (P.blackhole == BLACKHOLE_DROP) {
            P.dropped[f->dir] += (uint64_t)nread;
            return;
        }
        chunk_queue(f, CHUNK_DATA, buf->base, (size_t)nread);
        flow_read_update(f);
        flow_pump(f);
    } else if (nread == 0) {
        /* EAGAIN: nothing this time. */
    } else if (nread == UV_ENOBUFS) {
        /* At the cap (flow_room gave 0): wait for writes to drain. */
        flow_read_update(f);
    } else {
        /* EOF becomes a FIN for the other side, any error an RST. */
        f->src_done = true;
        flow_read_update(f);
        chunk_queue(f, nread == UV_EOF ? CHUNK_EOF : CHUNK_RST, NULL, 0);
        flow_pump(f);
    }
}

static void flow_written_cb(uv_write_t *req, int status)
{
    struct chunk *k = container_of(req, struct chunk, req);
    struct flow *f = k->flow;

    if (status == 0)
        P.bytes[f->dir] += k->len;
    flow_release(f, k);
    if (status < 0 && status != UV_ECANCELED)
        conn_fail(f->conn, "write", status);
}

static void flow_shut_cb(uv_shutdown_t *req, int status)
{
    struct flow *f = container_of(req, struct flow, shut_req);
    struct conn *c = f->conn;

    if (status == UV_ECANCELED)
        return;
    if (status < 0) {
        conn_fail(c, "shutdown", status);
        return;
    }
    f->shut_done = true;
    if (c->flow[FLOW_UP].shut_done && c->flow[FLOW_DOWN].shut_done)
        conn_close(c, false);
}

/* Hand one due chunk on. Returns false when the connection is closing. */
static bool flow_send(struct flow *f, struct chunk *k)
{
    uv_buf_t b;
    int rc;

    switch (k->kind) {
    case CHUNK_DATA:
        b = uv_buf_init(k->data, (unsigned)k->len);
        rc = uv_write(&k->req, (uv_stream_t *)f->dst, &b, 1, flow_written_cb);
        if (rc != 0) {
            flow_release(f, k);
            conn_fail(f->conn, "write", rc);
            return false;
        }
        return true;
    case CHUNK_EOF:
        flow_release(f, k);
        f->shut = true;
        rc = uv_shutdown(&f->shut_req, (uv_stream_t *)f->dst, flow_shut_cb);
        if (rc != 0) {
            conn_fail(f->conn, "shutdown", rc);
            return false;
        }
        return true;
    case CHUNK_RST:
        flow_release(f, k);
        conn_close(f->conn, true);
        return false;
    }
    return false;
}

static void flow_timer_cb(uv_timer_t *t)
{
    flow_pump(t->data);
}

/* Send every chunk that is due, oldest first; arm the timer for the next. */
static void flow_pump(struct flow *f)
{
    const struct conn *c = f->conn;
    struct list *n;

    while (!c->closing && c->connected && P.blackhole == BLACKHOLE_OFF &&
           !f->shut && (n = list_first(&f->queue))) {
        struct chunk *k = list_entry(n, struct chunk, node);
        uint64_t now = uv_hrtime();

        if (k->due_ns > now) {
            /* Rounded up, and checked against the clock again when the
             * timer fires: a chunk never leaves early. */
            uint64_t ms = (k->due_ns - now + 999999u) / 1000000u;

            uv_timer_start(&f->timer, flow_timer_cb, ms, 0);
            return;
        }
        list_remove(n);
        if (!flow_send(f, k))
            return;
    }
}

/* ---- connections -------------------------------------------------------- */

static void conn_free(struct conn *c)
{
    for (int i = 0; i < FLOW_COUNT; i++) {
        struct list *n, *tmp;

        list_foreach_safe(n, tmp, &c->flow[i].queue) {
            list_remove(n);
            free(list_entry(n, struct chunk, node));
        }
    }
    free(c);
}

static void conn_closed_cb(uv_handle_t *h)
{
    struct flow *f = h->data;
    struct conn *c = f->conn;

    if (--c->handles == 0)
        conn_free(c);
}

/* SO_LINGER 0 makes close() send an RST instead of a FIN. A socket that
 * was never created (connect not started) has no fd and just closes. */
static void conn_close_tcp(uv_tcp_t *t, bool rst)
{
    uv_os_fd_t fd;

    if (rst && uv_fileno((uv_handle_t *)t, &fd) == 0) {
        struct linger l = { .l_onoff = 1, .l_linger = 0 };

        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    uv_close((uv_handle_t *)t, conn_closed_cb);
}

static void conn_close(struct conn *c, bool rst)
{
    if (c->closing)
        return;
    c->closing = true;
    list_remove(&c->node);
    P.nconns--;
    conn_close_tcp(&c->client, rst);
    conn_close_tcp(&c->server, rst);
    for (int i = 0; i < FLOW_COUNT; i++)
        uv_close((uv_handle_t *)&c->flow[i].timer, conn_closed_cb);
}

static void flow_init(struct conn *c, int dir, uv_tcp_t *src, uv_tcp_t *dst)
{
    struct flow *f = &c->flow[dir];

    f->conn = c;
    f->dir = dir;
    f->src = src;
    f->dst = dst;
    list_init(&f->queue);
    uv_timer_init(P.loop, &f->timer);
    f->timer.data = f;
    src->data = f;
}

static struct conn *conn_create(void)
{
    struct conn *c = proxy_alloc(sizeof(*c));

    memset(c, 0, sizeof(*c));
    uv_tcp_init(P.loop, &c->client);
    uv_tcp_init(P.loop, &c->server);
    flow_init(c, FLOW_UP, &c->client, &c->server);
    flow_init(c, FLOW_DOWN, &c->server, &c->client);
    c->handles = 4;
    list_push_tail(&P.conns, &c->node);
    P.nconns++;
    return c;
}

static void conn_connected_cb(uv_connect_t *req, int status)
{
    struct conn *c = container_of(req, struct conn, connect_req);

    if (status == UV_ECANCELED)
        return;
    if (status < 0) {
        conn_fail(c, "connect to the target", status);
        return;
    }
    c->connected = true;
    uv_tcp_nodelay(&c->server, 1);
    for (int i = 0; i < FLOW_COUNT; i++)
        flow_read_update(&c->flow[i]);
}

static void proxy_accept_cb(uv_stream_t *server, int status)
{
    struct conn *c;
    int rc;

    if (status < 0) {
        proxy_log("accept: %s", uv_strerror(status));
        return;
    }
    c = conn_create();
    if (uv_accept(server, (uv_stream_t *)&c->client) != 0) {
        conn_close(c, false);
        return;
    }
    P.accepted++;
    if (P.refuse || P.nconns > PROXY_CONNS_MAX) {
        P.refused++;
        conn_close(c, true);
        return;
    }
    uv_tcp_nodelay(&c->client, 1);
    rc = uv_tcp_connect(&c->connect_req, &c->server,
                        (const struct sockaddr *)&P.target, conn_connected_cb);
    if (rc != 0)
        conn_fail(c, "connect to the target", rc);
}

/* ---- control commands ---------------------------------------------------- */

/* Digits only, at most DELAY_MAX_MS. */
static bool ctl_read_ms(const char *s, unsigned *out)
{
    unsigned long v = 0;

    if (*s == '\0' || strlen(s) > 7)
        return false;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return false;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    if (v > DELAY_MAX_MS)
        return false;
    *out = (unsigned)v;
    return true;
}

static void ctl_state(char *out, size_t size)
{
    snprintf(out, size, "OK blackhole=%s refuse=%d delay_up=%u delay_down=%u",
             blackhole_name[P.blackhole], P.refuse ? 1 : 0,
             P.delay_ms[FLOW_UP], P.delay_ms[FLOW_DOWN]);
}

/* Let held chunks go: after `pass`, or a blackhole turned off. */
static void ctl_pump_all(void)
{
    struct list *n, *tmp;

    list_foreach_safe(n, tmp, &P.conns) {
        struct conn *c = list_entry(n, struct conn, node);

        for (int i = 0; i < FLOW_COUNT && !c->closing; i++)
            flow_pump(&c->flow[i]);
    }
}

/* Each command: argv[0..argc) after the command word; writes the reply. */
typedef void ctl_fn(int arg, char **argv, int argc, char *out, size_t size);

static void cmd_pass(int arg, char **argv, int argc, char *out, size_t size)
{
    (void)arg;
    (void)argv;
    (void)argc;
    P.delay_ms[FLOW_UP] = P.delay_ms[FLOW_DOWN] = 0;
    P.blackhole = BLACKHOLE_OFF;
    P.refuse = false;
    ctl_pump_all();
    ctl_state(out, size);
}

/* arg: the flow, or FLOW_COUNT for both. */
static void cmd_delay(int arg, char **argv, int argc, char *out, size_t size)
{
    unsigned ms;

    (void)argc;
    if (!ctl_read_ms(argv[0], &ms)) {
        snprintf(out, size, "ERR delay wants milliseconds, 0 to %u", DELAY_MAX_MS);
        return;
    }
    for (int i = 0; i < FLOW_COUNT; i++) {
        if (arg == FLOW_COUNT || arg == i)
            P.delay_ms[i] = ms;
    }
    ctl_state(out, size);
}

static void cmd_blackhole(int arg, char **argv, int argc, char *out, size_t size)
{
    (void)arg;
    if (argc == 0 || strcasecmp(argv[0], "hold") == 0) {
        P.blackhole = BLACKHOLE_HOLD;
    } else if (strcasecmp(argv[0], "drop") == 0) {
        P.blackhole = BLACKHOLE_DROP;
    } else {
        snprintf(out, size, "ERR blackhole takes hold or drop");
        return;
    }
    ctl_state(out, size);
}

static void cmd_refuse(int arg, char **argv, int argc, char *out, size_t size)
{
    (void)arg;
    (void)argv;
    (void)argc;
    P.refuse = true;
    ctl_state(out, size);
}

static void cmd_reset(int arg, char **argv, int argc, char *out, size_t size)
{
    struct list *n, *tmp;
    uint64_t count = 0;

    (void)arg;
    (void)argv;
    (void)argc;
    list_foreach_safe(n, tmp, &P.conns) {
        conn_close(list_entry(n, struct conn, node), true);
        count++;
    }
    P.resets += count;
    snprintf(out, size, "OK reset=%" PRIu64, count);
}

static void cmd_stats(int arg, char **argv, int argc, char *out, size_t size)
{
    size_t held[FLOW_COUNT] = { 0, 0 };
    struct list *n;

    (void)arg;
    (void)argv;
    (void)argc;
    list_foreach(n, &P.conns) {
        const struct conn *c = list_entry(n, struct conn, node);

        for (int i = 0; i < FLOW_COUNT; i++)
            held[i] += c->flow[i].held;
    }
    snprintf(out, size,
             "OK open=%zu accepted=%" PRIu64 " refused=%" PRIu64
             " resets=%" PRIu64 " up_bytes=%" PRIu64 " down_bytes=%" PRIu64
             " held_up=%zu held_down=%zu dropped_up=%" PRIu64
             " dropped_down=%" PRIu64 " blackhole=%s refuse=%d"
             " delay_up=%u delay_down=%u",
             P.nconns, P.accepted, P.refused, P.resets,
             P.bytes[FLOW_UP], P.bytes[FLOW_DOWN], held[FLOW_UP],
             held[FLOW_DOWN], P.dropped[FLOW_UP], P.dropped[FLOW_DOWN],
             blackhole_name[P.blackhole], P.refuse ? 1 : 0,
             P.delay_ms[FLOW_UP], P.delay_ms[FLOW_DOWN]);
}

static void cmd_help(int arg, char **argv, int argc, char *out, size_t size);

static const struct ctl_cmd {
    const char *name;
    const char *usage;
    int minargs, maxargs;
    int arg;                    /* passed to fn */
    ctl_fn *fn;
} ctl_cmds[] = {
    { "pass", "pass", 0, 0, 0, cmd_pass },
    { "delay", "delay MS", 1, 1, FLOW_COUNT, cmd_delay },
    { "delay-up", "delay-up MS", 1, 1, FLOW_UP, cmd_delay },
    { "delay-down", "delay-down MS", 1, 1, FLOW_DOWN, cmd_delay },
    { "blackhole", "blackhole [hold|drop]", 0, 1, 0, cmd_blackhole },
    { "refuse", "refuse", 0, 0, 0, cmd_refuse },
    { "reset", "reset", 0, 0, 0, cmd_reset },
    { "stats", "stats", 0, 0, 0, cmd_stats },
    { "help", "help", 0, 0, 0, cmd_help },
};

#define CTL_NCMDS (sizeof(ctl_cmds) / sizeof(ctl_cmds[0]))

static void cmd_help(int arg, char **argv, int argc, char *out, size_t size)
{
    size_t len;

    (void)arg;
    (void)argv;
    (void)argc;
    len = (size_t)snprintf(out, size, "OK");
    for (size_t i = 0; i < CTL_NCMDS && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, " %s", ctl_cmds[i].name);
}

static void ctl_exec(char *line, char *out, size_t size)
{
    char *argv[CTL_ARGS_MAX + 1];
    char *cmd = strtok(line, " \t");
    int argc = 0;

    if (!cmd) {
        snprintf(out, size, "ERR empty command (try help)");
        return;
    }
    for (char *w = strtok(NULL, " \t"); w != NULL; w = strtok(NULL, " \t")) {
        if (argc == CTL_ARGS_MAX) {
            snprintf(out, size, "ERR too many arguments");
            return;
        }
        argv[argc++] = w;
    }
    argv[argc] = NULL;
    for (size_t i = 0; i < CTL_NCMDS; i++) {
        const struct ctl_cmd *c = &ctl_cmds[i];

        if (strcasecmp(cmd, c->name) != 0)
            continue;
        if (argc < c->minargs || argc > c->maxargs) {
            snprintf(out, size, "ERR usage: %s", c->usage);
            return;
        }
        c->fn(c->arg, argv, argc, out, size);
        return;
    }
    snprintf(out, size, "ERR unknown command (try help)");
}

/* ---- the control socket --------------------------------------------------- */

static void ctl_closed_cb(uv_handle_t *h)
{
    struct ctl_client *cl = h->data;

    free(cl);
}

static void ctl_close(struct ctl_client *cl)
{
    if (cl->closing)
        return;
    cl->closing = true;
    list_remove(&cl->node);
    P.nctls--;
    uv_close((uv_handle_t *)&cl->pipe, ctl_closed_cb);
}

static void ctl_written_cb(uv_write_t *req, int status)
{
    struct ctl_reply *r = container_of(req, struct ctl_reply, req);
    struct ctl_client *cl = r->cl;

    free(r);
    if (status == UV_ECANCELED)
        return;
    if (status < 0 || cl->close_after)
        ctl_close(cl);
}

static void ctl_reply(struct ctl_client *cl, const char *text)
{
    size_t len = strlen(text);
    struct ctl_reply *r = proxy_alloc(sizeof(*r) + len + 1);
    uv_buf_t b;

    r->cl = cl;
    r->len = len + 1;
    memcpy(r->text, text, len);
    r->text[len] = '\n';
    b = uv_buf_init(r->text, (unsigned)r->len);
    if (uv_write(&r->req, (uv_stream_t *)&cl->pipe, &b, 1, ctl_written_cb) != 0) {
        free(r);
        ctl_close(cl);
    }
}

/* Run every complete line in the buffer; refuse one that fills it. */
static void ctl_lines(struct ctl_client *cl)
{
    char line[CTL_LINE_MAX], reply[CTL_REPLY_MAX];
    char *lf;

    while (!cl->close_after && (lf = memchr(cl->buf, '\n', cl->len))) {
        size_t n = (size_t)(lf - cl->buf);

        memcpy(line, cl->buf, n);
        line[n] = '\0';
        if (n > 0 && line[n - 1] == '\r')
            line[n - 1] = '\0';
        /* Logged and parsed as text: no control bytes past this point. */
        for (char *p = line; *p != '\0'; p++) {
            if ((unsigned char)*p < 0x20 && *p != '\t')
                *p = '?';
        }
        memmove(cl->buf, lf + 1, cl->len - n - 1);
        cl->len -= n + 1;
        proxy_log("control: %s", line);
        ctl_exec(line, reply, sizeof(reply));
        proxy_log("control: -> %s", reply);
        ctl_reply(cl, reply);
    }
    if (!cl->close_after && cl->len == sizeof(cl->buf)) {
        ctl_reply(cl, "ERR line too long");
        cl->close_after = true;
    }
}

static void ctl_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    struct ctl_client *cl = h->data;

    (void)hint;
    buf->base = cl->buf + cl->len;
    buf->len = sizeof(cl->buf) - cl->len;
}

static void ctl_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct ctl_client *cl = s->data;

    (void)buf;
    if (nread > 0) {
        if (cl->close_after)
            return;
        cl->len += (size_t)nread;
        ctl_lines(cl);
    } else if (nread == 0) {
        /* EAGAIN: nothing this time. */
    } else if (nread == UV_ENOBUFS) {
        /* Only after "line too long": the reply is on its way. */
        uv_read_stop(s);
    } else {
        /* EOF or an error: replies still queued are cancelled. */
        ctl_close(cl);
    }
}

static void ctl_accept_cb(uv_stream_t *server, int status)
{
    struct ctl_client *cl;

    if (status < 0) {
        proxy_log("control accept: %s", uv_strerror(status));
        return;
    }
    cl = proxy_alloc(sizeof(*cl));
    memset(cl, 0, sizeof(*cl));
    uv_pipe_init(P.loop, &cl->pipe, 0);
    cl->pipe.data = cl;
    list_push_tail(&P.ctls, &cl->node);
    P.nctls++;
    if (uv_accept(server, (uv_stream_t *)&cl->pipe) != 0 ||
        P.nctls > CTL_CLIENTS_MAX ||
        uv_read_start((uv_stream_t *)&cl->pipe, ctl_alloc_cb, ctl_read_cb) != 0)
        ctl_close(cl);
}

/* ---- start and stop ------------------------------------------------------- */

static void proxy_stop(void)
{
    struct list *n, *tmp;

    if (P.stopping)
        return;
    P.stopping = true;
    /* Closing the bound pipe also unlinks its path (libuv does that). */
    uv_close((uv_handle_t *)&P.listener, NULL);
    uv_close((uv_handle_t *)&P.ctl, NULL);
    uv_close((uv_handle_t *)&P.sigterm, NULL);
    uv_close((uv_handle_t *)&P.sigint, NULL);
    list_foreach_safe(n, tmp, &P.conns)
        conn_close(list_entry(n, struct conn, node), false);
    list_foreach_safe(n, tmp, &P.ctls)
        ctl_close(list_entry(n, struct ctl_client, node));
}

static void proxy_signal_cb(uv_signal_t *s, int signum)
{
    (void)s;
    proxy_log("signal %d: stopping", signum);
    proxy_stop();
}

/* "[127.0.0.1:]PORT". Returns 0, -EPERM for another host, -EINVAL. */
static int proxy_parse_addr(const char *s, bool zero_ok, int *port)
{
    static const char loopback[] = "127.0.0.1:";
    const char *p = s;
    long v = 0;

    if (strncmp(s, loopback, sizeof(loopback) - 1) == 0)
        p = s + sizeof(loopback) - 1;
    else if (strchr(s, ':') || strchr(s, '.'))
        return -EPERM;
    if (*p == '\0' || strlen(p) > PORT_TEXT_MAX)
        return -EINVAL;
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (*p - '0');
    }
    if (v > 65535 || (v == 0 && !zero_ok))
        return -EINVAL;
    *port = (int)v;
    return 0;
}

static void proxy_usage(FILE *f)
{
    fprintf(f, "usage: redlockd-faultproxy -l [127.0.0.1:]PORT"
               " -t [127.0.0.1:]PORT -c CONTROL_SOCKET\n"
               "  -l, --listen   where clients connect (0: any free port)\n"
               "  -t, --target   where connections are forwarded (loopback only)\n"
               "  -c, --control  unix socket for commands (send \"help\")\n");
}

static int proxy_arg_addr(const char *opt, const char *s, bool zero_ok, int *port)
{
    int rc = proxy_parse_addr(s, zero_ok, port);

    if (rc == -EPERM)
        fprintf(stderr, "redlockd-faultproxy: %s %s: only 127.0.0.1 is allowed\n",
                opt, s);
    else if (rc != 0)
        fprintf(stderr, "redlockd-faultproxy: %s %s: not a port\n", opt, s);
    return rc;
}

static int proxy_listen(int port, const char *ctl_path)
{
    struct sockaddr_in sa;
    int len = sizeof(sa);
    int rc;

    uv_tcp_init(P.loop, &P.listener);
    uv_pipe_init(P.loop, &P.ctl, 0);
    uv_signal_init(P.loop, &P.sigterm);
    uv_signal_init(P.loop, &P.sigint);
    uv_ip4_addr("127.0.0.1", port, &sa);
    rc = uv_tcp_bind(&P.listener, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&P.listener, PROXY_BACKLOG, proxy_accept_cb);
    if (rc == 0)
        rc = uv_tcp_getsockname(&P.listener, (struct sockaddr *)&sa, &len);
    if (rc != 0) {
        fprintf(stderr, "redlockd-faultproxy: listen on 127.0.0.1:%d: %s\n",
                port, uv_strerror(rc));
        return rc;
    }
    P.port = ntohs(sa.sin_port);
    if (P.port == ntohs(P.target.sin_port)) {
        fprintf(stderr, "redlockd-faultproxy: the target is the proxy itself\n");
        return UV_EINVAL;
    }
    rc = uv_pipe_bind(&P.ctl, ctl_path);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&P.ctl, CTL_CLIENTS_MAX, ctl_accept_cb);
    if (rc != 0) {
        fprintf(stderr, "redlockd-faultproxy: control socket %s: %s\n",
                ctl_path, uv_strerror(rc));
        return rc;
    }
    uv_signal_start(&P.sigterm, proxy_signal_cb, SIGTERM);
    uv_signal_start(&P.sigint, proxy_signal_cb, SIGINT);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "listen", required_argument, NULL, 'l' },
        { "target", required_argument, NULL, 't' },
        { "control", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *ctl_path = NULL;
    int listen_port = -1, target_port = -1, opt, rc;

    while ((opt = getopt_long(argc, argv, "l:t:c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'l':
            if (proxy_arg_addr("--listen", optarg, true, &listen_port) != 0)
                return 2;
            break;
        case 't':
            if (proxy_arg_addr("--target", optarg, false, &target_port) != 0)
                return 2;
            break;
        case 'c':
            ctl_path = optarg;
            break;
        case 'h':
            proxy_usage(stdout);
            return 0;
        default:
            proxy_usage(stderr);
            return 2;
        }
    }
    if (optind != argc || listen_port < 0 || target_port < 0 || !ctl_path) {
        proxy_usage(stderr);
        return 2;
    }
    /* libuv would cut a longer path short and bind another name. */
    if (strlen(ctl_path) >= sizeof(((struct sockaddr_un *)NULL)->sun_path)) {
        fprintf(stderr, "redlockd-faultproxy: --control %s: path too long\n",
                ctl_path);
        return 2;
    }
    /* A peer that went away is a write error to handle, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    P.loop = uv_default_loop();
    list_init(&P.conns);
    list_init(&P.ctls);
    uv_ip4_addr("127.0.0.1", target_port, &P.target);
    if (proxy_listen(listen_port, ctl_path) != 0) {
        proxy_stop();
        uv_run(P.loop, UV_RUN_DEFAULT);
        uv_loop_close(P.loop);
        return 1;
    }
    printf("ready 127.0.0.1:%d\n", P.port);
    fflush(stdout);
    proxy_log("forwarding to 127.0.0.1:%d, control %s", target_port, ctl_path);
    uv_run(P.loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(P.loop);
    if (rc != 0) {
        proxy_log("loop close: %s", uv_strerror(rc));
        return 1;
    }
    return 0;
}
