/*
 * server: see server.h.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "conf.h"
#include "conn.h"
#include "log.h"
#include "mem.h"
#include "session.h"
#include "tls.h"

struct server server;
static struct server_counters counters;

const struct server_counters *server_counters(void)
{
    return &counters;
}

struct listener {
    union conn_stream h;
    bool is_unix;
    bool tls;               /* tls://: each connection speaks TLS */
    char name[128];
    char *unlink_path;      /* (owned) socket file we created */
    ino_t unlink_ino;       /* ... and its inode, so only it is removed */
    struct listener *next;
};

static struct listener *listeners;

static void listener_closed(uv_handle_t *h)
{
    struct listener *l = h->data;
    free(l->unlink_path);
    free(l);
}

static struct listener *listener_new(bool is_unix, const char *name)
{
    struct listener *l = mem_alloc(sizeof(*l));
    l->is_unix = is_unix;
    snprintf(l->name, sizeof(l->name), "%s", name);
    return l;
}

/* Start listening on l once bound (rc: how binding went); on failure the
 * listener is closed and freed. */
static void on_connection(uv_stream_t *ls, int status);

static int listener_finish(struct listener *l, int rc)
{
    if (rc == 0)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc != 0) {
        uv_close(&l->h.handle, listener_closed);
        return rc;
    }
    l->next = listeners;
    listeners = l;
    return 0;
}

static bool addr_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)ss;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
            return true;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            return in6->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

static void peer_describe(struct conn *c, bool is_unix)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";

    if (is_unix) {
        snprintf(c->peer, sizeof(c->peer), "unix");
        c->trusted = true;
        return;
    }
    if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(c->peer, sizeof(c->peer), "?");
        return;
    }
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)&ss;
        uv_ip4_name(in, host, sizeof(host));
        snprintf(c->peer, sizeof(c->peer), "%s:%u", host, ntohs(in->sin_port));
        snprintf(c->ip, sizeof(c->ip), "%s", host);
    } else {
        const struct sockaddr_in6 *in6 = (const void *)&ss;
        uv_ip6_name(in6, host, sizeof(host));
        snprintf(c->peer, sizeof(c->peer), "[%s]:%u", host,
                 ntohs(in6->sin6_port));
        snprintf(c->ip, sizeof(c->ip), "%s", host);
    }
    c->trusted = addr_is_loopback(&ss);
}

/* Answer one ERR line and close: for connections we will not serve. */
static void server_reject(struct conn *c, enum proto_err code,
                          const char *msg, const char *why)
{
    struct sbuf *b = conn_reply(c);

    counters.rejected++;
    counters.errors[code]++;
    if (b)
        proto_format_err(b, code, msg);
    conn_close_after_reply(c, why, false);
    conn_flush(c);
    log_info("%s rejected (%s): %s", c->name, c->peer, why);
}

static void on_connection(uv_stream_t *ls, int status)
{
    struct listener *l = ls->data;
    const struct conf *cf = server.conf;

    if (status < 0) {
        log_warn("accept on %s: %s", l->name, uv_strerror(status));
        return;
    }
    size_t active = session_count();
    int rc;
    struct conn *c = conn_create(server.loop, l->is_unix, &rc);
    if (!c) {
        log_warn("accept on %s: %s", l->name, uv_strerror(rc));
        return;
    }
    rc = uv_accept(ls, &c->h.stream);
    if (rc != 0) {
        log_warn("accept on %s: %s", l->name, uv_strerror(rc));
        conn_close(c, false, "accept failed");
        return;
    }
    if (!l->is_unix)
        uv_tcp_nodelay(&c->h.tcp, 1);
    if (l->tls && conn_use_tls(c) != 0) {
        log_warn("accept on %s: cannot start TLS (out of memory)", l->name);
        conn_close(c, false, "no TLS state");
        return;
    }
    peer_describe(c, l->is_unix);
    session_create(c);     /* binds c: its name is the session's */
    counters.accepted++;
    conn_start(c);
    if (session_shutting_down()) {
        server_reject(c, PROTO_ERR_SHUTDOWN, "the daemon is shutting down",
                      "shutting down");
        return;
    }
    if (active >= cf->limits.max_clients) {
        server_reject(c, PROTO_ERR_LIMIT, "too many clients (max_clients)",
                      "max_clients reached");
        return;
    }
    /* This connection's session is already counted among them. */
    if (cf->limits.max_clients_per_ip && c->ip[0] &&
        session_count_ip(c->ip) > cf->limits.max_clients_per_ip) {
        server_reject(c, PROTO_ERR_LIMIT, "too many connections from "
                      "this address (limits.max_clients_per_ip)",
                      "max_clients_per_ip reached");
        return;
    }
    /* A verified client certificate is a credential of its own. */
    bool cert_required = l->tls && tls_verifies_clients();
    if (cf->auth.protected_mode && !cf->auth.password && !cf->auth.nusers &&
        !c->trusted && !cert_required) {
        server_reject(c, PROTO_ERR_NOAUTH, "protected mode: no password "
                      "is set and this peer is not local; set auth.password "
                      "or auth.users, or auth.protected_mode false",
                      "protected mode");
        return;
    }
    log_debug("%s connected from %s", c->name, c->peer);
}

static int listen_tcp(const struct conf_addr *a)
{
    struct sockaddr_storage ss;
    int rc;

    if (strchr(a->host, ':'))
        rc = uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss);
    else
        rc = uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss);
    if (rc != 0)
        return rc;
    struct listener *l = listener_new(false, a->text);
    l->tls = a->tls;
    uv_tcp_init(server.loop, &l->h.tcp);
    l->h.handle.data = l;
    rc = uv_tcp_bind(&l->h.tcp, (const struct sockaddr *)&ss,
                     strchr(a->host, ':') ? UV_TCP_IPV6ONLY : 0);
    return listener_finish(l, rc);
}

/* Does a process accept connections on the unix socket at path? */
static bool unix_socket_alive(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd, rc;

    if (strlen(path) >= sizeof(sa.sun_path))
        return false;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    /* EAGAIN: alive, its backlog is full. */
    bool alive = rc == 0 || errno == EAGAIN;
    close(fd);
    return alive;
}

/* The directory part of path exists? */
static bool parent_exists(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *slash = strrchr(path, '/');
    struct stat st;

    if (!slash || slash == path)
        return true;
    if ((size_t)(slash - path) >= sizeof(dir))
        return false;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
 * A socket file left by an earlier run would make bind fail: remove it,
 * but only if nothing answers on it (a second daemon must not take over
 * the socket of a running one) and never anything that is not a socket.
 */
static int listen_unix(const struct conf_addr *a, unsigned mode,
                       const char **why)
{
    struct stat st;

    if (!parent_exists(a->path)) {
        *why = "no such directory";
        return UV_ENOENT;
    }
    if (lstat(a->path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            *why = "the path exists and is not a socket";
            return UV_EEXIST;
        }
        if (unix_socket_alive(a->path)) {
            *why = "the socket is in use by another process (another "
                   "redlockd?)";
            return UV_EADDRINUSE;
        }
        log_notice("removing the stale socket file %s", a->path);
        unlink(a->path);
    }
    struct listener *l = listener_new(true, a->text);
    uv_pipe_init(server.loop, &l->h.pipe, 0);
    l->h.handle.data = l;
    int rc = uv_pipe_bind(&l->h.pipe, a->path);
    if (rc == 0) {
        l->unlink_path = strdup(a->path);
        if (chmod(a->path, mode) != 0)
            rc = uv_translate_sys_error(errno);
        else if (lstat(a->path, &st) == 0)
            l->unlink_ino = st.st_ino;
    }
    return listener_finish(l, rc);
}

#ifdef HAVE_SYSTEMD
static int listen_activated(int fd)
{
    bool is_unix = sd_is_socket(fd, AF_UNIX, SOCK_STREAM, 1) > 0;
    char name[64];
    snprintf(name, sizeof(name), "fd %d (%s)", fd, is_unix ? "unix" : "tcp");
    struct listener *l = listener_new(is_unix, name);
    int rc;
    if (is_unix) {
        uv_pipe_init(server.loop, &l->h.pipe, 0);
        rc = uv_pipe_open(&l->h.pipe, fd);
    } else {
        uv_tcp_init(server.loop, &l->h.tcp);
        rc = uv_tcp_open(&l->h.tcp, fd);
    }
    l->h.handle.data = l;
    rc = listener_finish(l, rc);
    if (rc != 0)
        return rc;
    log_notice("listening on socket-activated %s", name);
    return 0;
}
#endif

void server_deinit(void)
{
    conn_deinit();
}

int server_start(uv_loop_t *loop, const struct conf *c)
{
    server.loop = loop;
    server.conf = c;
    conn_init(loop, c);
    session_init(c);

#ifdef HAVE_SYSTEMD
    int n = sd_listen_fds(1);
    if (n > 0) {
        for (int i = 0; i < n; i++) {
            int rc = listen_activated(SD_LISTEN_FDS_START + i);
            if (rc != 0) {
                log_error("socket-activated fd %d: %s",
                          SD_LISTEN_FDS_START + i, uv_strerror(rc));
                return -1;
            }
        }
        return 0;
    }
#endif
    for (size_t i = 0; i < c->nlisten; i++) {
        const struct conf_addr *a = &c->listen[i];
        const char *why = NULL;
        int rc = a->kind == CONF_ADDR_UNIX
                 ? listen_unix(a, c->unix_socket_mode, &why)
                 : listen_tcp(a);
        if (rc != 0) {
            log_error("cannot listen on %s: %s", a->text,
                      why ? why : uv_strerror(rc));
            return -1;
        }
        log_notice("listening on %s", a->text);
    }
    return 0;
}

void server_stop_listening(void)
{
    struct listener *l = listeners, *next;

    for (; l; l = next) {
        next = l->next;
        struct stat st;
        /* Only the file we made: not one someone put there since. */
        if (l->unlink_path && lstat(l->unlink_path, &st) == 0 &&
            st.st_ino == l->unlink_ino)
            unlink(l->unlink_path);
        uv_close(&l->h.handle, listener_closed);
    }
    listeners = NULL;
}
