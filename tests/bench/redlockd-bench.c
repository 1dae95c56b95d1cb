/*
 * redlockd-bench: a load generator for a running redlockd.
 *
 * It speaks the line protocol over raw sockets, many connections driven by
 * one epoll loop in one thread, so the client costs little next to the
 * daemon it measures. Modes:
 *
 *   lock     each connection loops LOCK + UNLOCK; with -P N it keeps N
 *            such pairs in flight (sent back to back, the protocol runs
 *            them in order). One op (a "cycle") = one LOCK+UNLOCK pair. The
 *            resource is new for every cycle (<prefix>:<conn>:<i>), or with
 *            --fixed one per connection (<prefix>:<conn>); --multi N locks
 *            N resources in one request, --lock-opts adds words such as
 *            mode=shared or limit=4 to every LOCK. With --tags M each
 *            connection runs M cycles at once as tagged requests
 *            ("#s<k> LOCK ...", protocol.md "Tagged requests"): each of
 *            its M slots sends a LOCK, the UNLOCK once the LOCK is
 *            granted, and the next LOCK once that is answered, as M tasks
 *            sharing one session would; the daemon answers them in the
 *            order they finish.
 *   contend  every connection LOCKs the same resource with wait=..., and
 *            UNLOCKs as soon as it has it (or after --hold-ms): measures
 *            handoffs per second and the time from one holder's UNLOCK
 *            reply to the next grant on another connection. It also checks
 *            mutual exclusion as far as a client can (see contend_granted)
 *            and exits 4 if it saw a violation.
 *   idle     C sessions that each say HELLO and hold L renewed locks; the
 *            daemon's RSS before, at its peak and --after seconds after
 *            every connection was dropped at once; CPU of the watched
 *            processes and STATS renewals over the hold; then STATUS must
 *            show every lock released.
 *   ping     pipelined PING: the daemon's own per-request cost, no Redis.
 *
 * TLS: --tls-ca FILE (or a tls:// address) makes every connection speak
 * TLS, the server checked against that CA (the system store without
 * --tls-ca) and its address (an IP address SAN). Each socket stays
 * non-blocking under the same epoll loop: SSL_set_fd on it, SSL_connect
 * driven by the loop (WANT_READ arms EPOLLIN alone, WANT_WRITE EPOLLOUT),
 * then SSL_read/SSL_write where plain connections read()/write(). Read
 * ahead is on, so records can wait in OpenSSL's buffer where epoll does not
 * see them: a read goes on while SSL_has_pending() says so. A write that
 * wants to read first (WANT_READ) is retried after the next read, a read
 * that wants to write (WANT_WRITE) on the next EPOLLOUT. The handshakes
 * happen while connecting, before the measured window, so a TLS run
 * measures the steady-state cost of requests inside TLS.
 *
 * CPU: --watch NAME=PID (repeatable; --pid adds "daemon") samples
 * utime+stime of other processes from /proc/PID/stat at the start and the
 * end of the measured window, and the tool's own CPU time
 * (CLOCK_PROCESS_CPUTIME_ID) over the same window, reported as "client".
 *
 * Latencies go into log-linear histograms (64 sub-buckets per power of
 * two, about 1.6 % resolution, HDR-style), timed from the moment a request
 * was queued for sending to the moment its reply line was read. With
 * pipelining that includes the time spent queued behind earlier requests
 * on the same connection, which is what the client sees.
 *
 * Every phase has a deadline (connecting, the run itself, draining the
 * replies still in flight, checking releases), so the tool always ends.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define BENCH_MAX_LINE (1 << 20)        /* a reply longer than this is junk */
#define BENCH_SETUP_TIMEOUT_S 120.0     /* connecting + HELLO (+ idle LOCK) */
#define BENCH_DRAIN_GRACE_S 5.0         /* replies in flight at the end */
#define BENCH_RELEASE_TIMEOUT_S 30.0    /* idle: all locks gone after close */
#define BENCH_CTL_TIMEOUT_MS 10000      /* one control request */
#define BENCH_MAX_ERRCODES 16
#define BENCH_HANDOFF_RING 4096

/* ---- time ---------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t sec_to_ns(double s)
{
    return (uint64_t)(s * 1e9);
}

/* ---- histogram ----------------------------------------------------------- */

#define HIST_SUB 64
#define HIST_LINEAR (2 * HIST_SUB)
#define HIST_OCTAVES 40
#define HIST_BUCKETS (HIST_LINEAR + HIST_OCTAVES * HIST_SUB)

struct hist {
    uint64_t count, sum, min, max;     /* nanoseconds */
    uint64_t b[HIST_BUCKETS];
};

/* Values below 128 ns get a bucket each; above, each power of two is split
 * into 64 equal buckets, so the relative error stays under 1/64. */
static unsigned hist_index(uint64_t v)
{
    unsigned shift, idx;

    if (v < HIST_LINEAR)
        return (unsigned)v;
    shift = (unsigned)(63 - __builtin_clzll(v)) - 6;
    idx = HIST_LINEAR + (shift - 1) * HIST_SUB +
          (unsigned)((v >> shift) - HIST_SUB);
    return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

/* The middle of a bucket, a fair stand-in for the values in it. */
static uint64_t hist_value(unsigned idx)
{
    unsigned k, shift;

    if (idx < HIST_LINEAR)
        return idx;
    k = idx - HIST_LINEAR;
    shift = k / HIST_SUB + 1;
    return ((uint64_t)(k % HIST_SUB + HIST_SUB) << shift) +
           ((uint64_t)1 << shift) / 2;
}

static void hist_add(struct hist *h, uint64_t v)
{
    if (h->count == 0 || v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
    h->count++;
    h->sum += v;
    h->b[hist_index(v)]++;
}

static uint64_t hist_percentile(const struct hist *h, double p)
{
    uint64_t rank, seen = 0;

    if (h->count == 0)
        return 0;
    rank = (uint64_t)((p / 100.0) * (double)h->count + 0.999999);
    if (rank < 1)
        rank = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);

            return v < h->min ? h->min : v > h->max ? h->max : v;
        }
    }
    return h->max;
}

/* ---- options and global state ------------------------------------------- */

enum mode { MODE_LOCK, MODE_CONTEND, MODE_IDLE, MODE_PING };
static const char *const mode_names[] = { "lock", "contend", "idle", "ping" };

enum req_kind { REQ_HELLO, REQ_LOCK, REQ_UNLOCK, REQ_PING };

enum conn_state {
    CS_NEW,             /* not started yet */
    CS_CONNECTING,
    CS_HANDSHAKE,       /* TLS: SSL_connect not done yet */
    CS_SETUP,           /* HELLO (and for idle the LOCK) in flight */
    CS_READY,
    CS_CLOSED,
};

struct pending {
    uint64_t sent;      /* now_ns() when queued */
    uint8_t kind;       /* enum req_kind */
};

/* --tags: one of a connection's cycles in flight. */
struct tslot {
    uint64_t sent;      /* now_ns() when its request was queued */
    uint64_t seq;       /* the cycle's resource number */
    uint8_t kind;       /* enum req_kind of the request out, if busy */
    bool busy;          /* a request of it awaits its reply */
    bool lock_ok;
};

struct bconn {
    int fd;
    SSL *ssl;           /* TLS: NULL on a plain connection */
    bool write_wants_read;  /* TLS: SSL_write said WANT_READ */
    bool read_wants_write;  /* TLS: SSL_read said WANT_WRITE */
    bool tls_dead;          /* TLS: a fatal error, no close_notify */
    unsigned idx;
    enum conn_state state;
    bool out_armed;     /* EPOLLOUT registered */
    bool holding;       /* a LOCK was granted, UNLOCK not yet answered */
    bool lock_ok;       /* the last LOCK reply was OK (pipelined pairs) */
    uint64_t seq;       /* next resource number (lock mode) */
    uint64_t grant_no;  /* contend: number of our current grant */
    uint64_t unlock_due;/* contend --hold-ms: when to send UNLOCK, 0 none */
    unsigned nlocks;    /* idle: LOCK replies so far */
    unsigned char *got; /* idle: which of the L locks were granted */
    struct pending *q;  /* ring of requests awaiting replies */
    struct tslot *slots;    /* --tags: B.tags of them */
    unsigned qhead, qlen, qcap;
    char *rbuf;
    size_t rlen, rcap;
    char *wbuf;
    size_t wlen, woff, wcap;
};

enum hist_id { H_LOCK, H_UNLOCK, H_PING, H_HANDOFF, H_COUNT };

struct handoff_slot {
    uint64_t grant_no;
    unsigned conn;      /* who got the grant */
    uint64_t grant_at;
    uint64_t unlock_at; /* 0 until that holder's UNLOCK was answered */
};

enum phase { PH_SETUP, PH_RUN, PH_DRAIN, PH_HOLD };

#define BENCH_MAX_WATCH 16

/* A process whose CPU time is sampled at the edges of the window. */
struct watch {
    char name[32];
    pid_t pid;
    double cpu0, cpu1;  /* seconds, -1 when unreadable */
};

static struct {
    /* options */
    enum mode mode;
    const char *server;
    struct sockaddr_storage sa;
    socklen_t salen;
    unsigned conns;
    double duration;
    uint64_t nops;
    unsigned pipeline;
    unsigned tags;              /* lock: cycles in flight per connection,
                                   as tagged requests (0: untagged) */
    unsigned ttl;
    unsigned wait;
    double hold;
    unsigned window;
    char prefix[96];
    pid_t pid;
    bool find_pid;
    bool json;
    const char *json_file;
    bool fixed;                 /* lock: one resource per connection */
    unsigned multi;             /* lock: resources per LOCK (1) */
    char lock_opts[128];        /* extra words for every LOCK */
    unsigned hold_ms;           /* contend: time held before UNLOCK */
    unsigned locks_per_conn;    /* idle: L */
    double after;               /* idle: RSS this long after the drop */
    bool strict;                /* exit 5 when the run did not complete */
    bool tls;                   /* every connection speaks TLS */
    const char *tls_ca, *tls_cert, *tls_key;
    char host[128];             /* the -s host: the name TLS checks */
    SSL_CTX *ssl_ctx;
    char tls_version[32], tls_cipher[64];   /* of the first handshake */
    struct watch w[BENCH_MAX_WATCH];
    unsigned nwatch;
    double client0, client1;    /* our own CPU over the window */

    /* state */
    int ep;
    struct bconn *c;
    enum phase phase;
    unsigned started, connecting, in_setup, ready, closed;
    uint64_t outstanding;       /* requests sent, not answered */
    unsigned holders;
    uint64_t t_start, t_end;

    /* results */
    uint64_t ops, ops_started, requests, errors, events, lost_events;
    uint64_t disconnects, connect_errors, unexpected;
    struct { char code[16]; uint64_t n; } err[BENCH_MAX_ERRCODES];
    unsigned nerr;
    struct hist h[H_COUNT];
    uint64_t grants;
    struct handoff_slot ho[BENCH_HANDOFF_RING];
    unsigned locked;            /* idle: LOCKs granted */
    unsigned ndue;              /* contend: connections with unlock_due */
    /* contend: what the client can check of mutual exclusion */
    long cs_holder;             /* connection in its critical section, -1 */
    uint64_t last_fence;
    uint64_t violations, fence_violations, missing_fence;
    /* idle: RSS sampling */
    long rss_peak;
    uint64_t rss_next;
} B;

static volatile sig_atomic_t interrupted;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;

    fputs("redlockd-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warnx(const char *fmt, ...)
{
    va_list ap;

    fputs("redlockd-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void *xrealloc(void *p, size_t n)
{
    void *r = realloc(p, n);

    if (!r)
        die("out of memory (%zu bytes)", n);
    return r;
}

static void on_sigint(int sig)
{
    interrupted = sig;
}

/* ---- the daemon's process: pid, RSS, CPU ---------------------------------- */

/* A "Vm...:" line of /proc/PID/status (field with its colon) in KiB, or
 * -1. */
static long proc_status_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    size_t n = strlen(field);
    long kib = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, field, n) == 0) {
            kib = strtol(line + n, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kib;
}

static long proc_rss_kib(pid_t pid)
{
    return proc_status_kib(pid, "VmRSS:");
}

/* User + system CPU time of pid, in seconds, or -1. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    unsigned long long ut, st;
    const char *p;
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses; fields resume
     * after the last ')'. utime and stime are fields 14 and 15. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                            "%llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Our own CPU time (all threads: there is one), in seconds. */
static double self_cpu_s(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return -1;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sample every watched process and ourselves: at = 0 start, 1 end. */
static void watch_sample(int at)
{
    for (unsigned i = 0; i < B.nwatch; i++) {
        double v = proc_cpu_s(B.w[i].pid);

        if (at == 0)
            B.w[i].cpu0 = v;
        else
            B.w[i].cpu1 = v;
    }
    if (at == 0)
        B.client0 = self_cpu_s();
    else
        B.client1 = self_cpu_s();
}

static void watch_add(const char *name, pid_t pid)
{
    if (B.nwatch == BENCH_MAX_WATCH)
        die("at most %d --watch processes", BENCH_MAX_WATCH);
    for (unsigned i = 0; i < B.nwatch; i++)
        if (strcmp(B.w[i].name, name) == 0)
            die("--watch name used twice: %s", name);
    snprintf(B.w[B.nwatch].name, sizeof(B.w[B.nwatch].name), "%s", name);
    B.w[B.nwatch].pid = pid;
    B.nwatch++;
}

/* The socket inode of the listener for the -s address, from /proc/net. */
static unsigned long listener_inode(void)
{
    char line[1024];
    unsigned long inode = 0;

    if (B.sa.ss_family == AF_UNIX) {
        const struct sockaddr_un *un = (const void *)&B.sa;
        FILE *f = fopen("/proc/net/unix", "r");

        while (f && inode == 0 && fgets(line, sizeof(line), f)) {
            unsigned long flags, ino;
            char path[512] = "";

            /* Num RefCount Protocol Flags Type St Inode Path */
            if (sscanf(line, "%*s %*s %*s %lx %*s %*s %lu %511s", &flags, &ino,
                       path) == 3 && (flags & 0x10000) != 0 &&
                strcmp(path, un->sun_path) == 0)
                inode = ino;
        }
        if (f)
            fclose(f);
        return inode;
    }
    for (int v6 = 0; v6 < 2 && inode == 0; v6++) {
        FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
        unsigned port = ntohs(B.sa.ss_family == AF_INET
                              ? ((const struct sockaddr_in *)&B.sa)->sin_port
                              : ((const struct sockaddr_in6 *)&B.sa)->sin6_port);

        while (f && inode == 0 && fgets(line, sizeof(line), f)) {
            unsigned lport, st;
            unsigned long ino;

            /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
            if (sscanf(line, "%*s %*[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu",
                       &lport, &st, &ino) == 3 && st == 0x0A && lport == port)
                inode = ino;
        }
        if (f)
            fclose(f);
    }
    return inode;
}

/* -p: which process has the listening socket open. Only processes of our
 * own user are readable, which is the usual benchmark setup. */
static pid_t find_daemon_pid(void)
{
    unsigned long inode = listener_inode();
    char want[64], path[600], link[64];
    struct dirent *pe;
    pid_t found = 0;
    DIR *proc;

    if (inode == 0)
        return 0;
    snprintf(want, sizeof(want), "socket:[%lu]", inode);
    proc = opendir("/proc");
    while (proc && found == 0 && (pe = readdir(proc))) {
        struct dirent *fe;
        DIR *fds;

        if (!isdigit((unsigned char)pe->d_name[0]))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/fd", pe->d_name);
        fds = opendir(path);
        while (fds && found == 0 && (fe = readdir(fds))) {
            ssize_t n;

            snprintf(path, sizeof(path), "/proc/%s/fd/%s", pe->d_name,
                     fe->d_name);
            n = readlink(path, link, sizeof(link) - 1);
            if (n > 0) {
                link[n] = '\0';
                if (strcmp(link, want) == 0)
                    found = (pid_t)atoi(pe->d_name);
            }
        }
        if (fds)
            closedir(fds);
    }
    if (proc)
        closedir(proc);
    return found;
}

/* ---- addresses and sockets ----------------------------------------------- */

static void parse_server(const char *s)
{
    memset(&B.sa, 0, sizeof(B.sa));
    if (strncmp(s, "unix:", 5) == 0)
        s += 5;
    if (strncmp(s, "tls://", 6) == 0) {
        B.tls = true;
        s += 6;
    }
    if (s[0] == '/') {
        struct sockaddr_un *un = (void *)&B.sa;

        if (strlen(s) >= sizeof(un->sun_path))
            die("unix socket path too long: %s", s);
        un->sun_family = AF_UNIX;
        strcpy(un->sun_path, s);
        B.salen = sizeof(*un);
        return;
    }
    if (strncmp(s, "tcp://", 6) == 0)
        s += 6;

    char host[128];
    const char *colon;
    long port;
    char *end;

    if (s[0] == '[') {
        const char *rb = strchr(s, ']');

        if (!rb || rb[1] != ':' || (size_t)(rb - s - 1) >= sizeof(host))
            die("bad server address: %s", s);
        snprintf(host, sizeof(host), "%.*s", (int)(rb - s - 1), s + 1);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            die("bad server address (want HOST:PORT or /path): %s", s);
        snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
    }
    port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535)
        die("bad port in %s", s);
    snprintf(B.host, sizeof(B.host), "%s", host);
    if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&B.sa)->sin_addr) == 1) {
        struct sockaddr_in *in = (void *)&B.sa;

        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        B.salen = sizeof(*in);
    } else if (inet_pton(AF_INET6, host,
                         &((struct sockaddr_in6 *)&B.sa)->sin6_addr) == 1) {
        struct sockaddr_in6 *in6 = (void *)&B.sa;

        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        B.salen = sizeof(*in6);
    } else {
        die("not a numeric IP address: %s", host);
    }
}

static int socket_open(bool nonblock)
{
    int fd = socket(B.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC |
                    (nonblock ? SOCK_NONBLOCK : 0), 0);

    if (fd < 0)
        return -errno;
    if (B.sa.ss_family != AF_UNIX) {
        int one = 1;

        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

/* Enough descriptors for every connection plus a few of our own. */
static void raise_nofile(unsigned need)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        die("getrlimit: %s", strerror(errno));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need)
        return;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
        die("%u connections need %u file descriptors; the hard limit is %lu "
            "(raise it with ulimit -Hn or limits.conf)", B.conns, need,
            (unsigned long)rl.rlim_max);
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        die("setrlimit(RLIMIT_NOFILE, %u): %s", need, strerror(errno));
}

/* ---- TLS ------------------------------------------------------------------- */

/* Why a TLS call failed: the certificate check's verdict when it failed,
 * else the last queued OpenSSL error, else the socket's. */
static const char *tls_error(SSL *ssl, int err)
{
    static char buf[256];
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    unsigned long e = ERR_peek_last_error();

    if (v != X509_V_OK)
        snprintf(buf, sizeof(buf), "certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
    else if (e != 0)
        ERR_error_string_n(e, buf, sizeof(buf));
    else if (err == SSL_ERROR_SYSCALL)
        snprintf(buf, sizeof(buf), "%s", errno ? strerror(errno)
                                               : "unexpected EOF");
    else
        snprintf(buf, sizeof(buf), "SSL error %d", err);
    ERR_clear_error();
    return buf;
}

static void tls_init(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (!ctx)
        die("SSL_CTX_new: %s", tls_error(NULL, SSL_ERROR_SSL));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (B.tls_ca) {
        if (SSL_CTX_load_verify_locations(ctx, B.tls_ca, NULL) != 1)
            die("--tls-ca %s: %s", B.tls_ca, tls_error(NULL, SSL_ERROR_SSL));
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        die("the system's CA store: %s", tls_error(NULL, SSL_ERROR_SSL));
    }
    if (B.tls_cert) {
        const char *key = B.tls_key ? B.tls_key : B.tls_cert;

        if (SSL_CTX_use_certificate_chain_file(ctx, B.tls_cert) != 1)
            die("--tls-cert %s: %s", B.tls_cert, tls_error(NULL, SSL_ERROR_SSL));
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1)
            die("--tls-key %s: %s", key, tls_error(NULL, SSL_ERROR_SSL));
    }
    /* Read ahead: one read() takes every record the socket has (records
     * left in OpenSSL's buffer are why reads loop on SSL_has_pending).
     * Partial writes, and a buffer that may move between the retries of
     * one SSL_write: wbuf grows by realloc while a write waits. */
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                          SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    B.ssl_ctx = ctx;
}

/* A client SSL on fd that checks the server's certificate for the -s
 * address (numeric, see parse_server: an IP address SAN, no SNI). */
static SSL *tls_new(int fd)
{
    SSL *ssl = SSL_new(B.ssl_ctx);

    if (!ssl || SSL_set_fd(ssl, fd) != 1 ||
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), B.host) != 1)
        die("SSL_new: %s", tls_error(NULL, SSL_ERROR_SSL));
    SSL_set_connect_state(ssl);
    return ssl;
}

/* The version and cipher of the first handshake, for the report. */
static void tls_note(SSL *ssl)
{
    if (B.tls_version[0])
        return;
    snprintf(B.tls_version, sizeof(B.tls_version), "%s", SSL_get_version(ssl));
    snprintf(B.tls_cipher, sizeof(B.tls_cipher), "%s",
             SSL_get_cipher_name(ssl));
}

/* ---- connections --------------------------------------------------------- */

static void conn_arm(struct bconn *c, bool out)
{
    struct epoll_event ev = { .events = EPOLLIN | (out ? EPOLLOUT : 0),
                              .data.ptr = c };

    if (out == c->out_armed)
        return;
    c->out_armed = out;
    epoll_ctl(B.ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void contend_left(struct bconn *c);

static void conn_close(struct bconn *c)
{
    if (c->state == CS_CLOSED || c->state == CS_NEW)
        return;
    if (c->state == CS_CONNECTING || c->state == CS_HANDSHAKE)
        B.connecting--;
    if (c->state == CS_CONNECTING || c->state == CS_HANDSHAKE ||
        c->state == CS_SETUP)
        B.in_setup--;
    if (c->state == CS_READY)
        B.ready--;
    if (c->holding)
        B.holders--;
    c->holding = false;
    if (B.mode == MODE_CONTEND)
        contend_left(c);
    if (c->ssl) {
        /* A close_notify, not waited for; not after a fatal error. */
        if (!c->tls_dead && SSL_is_init_finished(c->ssl))
            SSL_shutdown(c->ssl);
        ERR_clear_error();
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    c->write_wants_read = c->read_wants_write = c->tls_dead = false;
    close(c->fd);
    c->fd = -1;
    c->state = CS_CLOSED;
    B.closed++;
    B.outstanding -= c->qlen;
    c->qlen = 0;
    free(c->q);
    free(c->rbuf);
    free(c->wbuf);
    c->q = NULL;
    c->rbuf = c->wbuf = NULL;
}

/* The server is gone (or TLS failed): count it, say why, close. */
static void conn_lost(struct bconn *c, const char *why)
{
    /* Expected only when idle mode's check is over; anything else is
     * the daemon dropping us (limits, shutdown). */
    B.disconnects++;
    if (B.disconnects <= 3)
        warnx("connection %u closed by the server%s%s", c->idx,
              why[0] ? ": " : "", why);
    conn_close(c);
}

/* TLS: SSL_write what is queued. A write that wants to read first is
 * retried after the next read (conn_read ends in conn_flush). */
static void conn_flush_tls(struct bconn *c)
{
    c->write_wants_read = false;
    while (c->woff < c->wlen) {
        size_t len = c->wlen - c->woff;
        int n, err;

        ERR_clear_error();
        n = SSL_write(c->ssl, c->wbuf + c->woff,
                      (int)(len > (1u << 30) ? 1u << 30 : len));
        if (n > 0) {
            c->woff += (size_t)n;
            continue;
        }
        err = SSL_get_error(c->ssl, n);
        if (err == SSL_ERROR_WANT_WRITE) {
            conn_arm(c, true);
            return;
        }
        if (err == SSL_ERROR_WANT_READ) {
            c->write_wants_read = true;
            conn_arm(c, c->read_wants_write);
            return;
        }
        c->tls_dead = true;
        conn_lost(c, tls_error(c->ssl, err));
        return;
    }
    c->woff = c->wlen = 0;
    conn_arm(c, c->read_wants_write);
}

static void conn_flush(struct bconn *c)
{
    if (c->ssl) {
        conn_flush_tls(c);
        return;
    }
    while (c->woff < c->wlen) {
        ssize_t n = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);

        if (n > 0) {
            c->woff += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            conn_arm(c, true);
            return;
        }
        B.disconnects++;
        conn_close(c);
        return;
    }
    c->woff = c->wlen = 0;
    conn_arm(c, false);
}

static void conn_send(struct bconn *c, enum req_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_send(struct bconn *c, enum req_kind kind, const char *fmt, ...)
{
    va_list ap;
    int n;

    while (c->wcap - c->wlen < 4096) {
        c->wcap = c->wcap ? c->wcap * 2 : 8192;
        c->wbuf = xrealloc(c->wbuf, c->wcap);
    }
    va_start(ap, fmt);
    n = vsnprintf(c->wbuf + c->wlen, c->wcap - c->wlen, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= c->wcap - c->wlen)
        die("request line too long");
    c->wlen += (size_t)n;
    if (c->qlen == c->qcap) {
        /* Grow the ring, unrolling it so the oldest entry is first. */
        unsigned ncap = c->qcap ? c->qcap * 2 : 4;
        struct pending *nq = xrealloc(NULL, ncap * sizeof(*nq));

        for (unsigned i = 0; i < c->qlen; i++)
            nq[i] = c->q[(c->qhead + i) % c->qcap];
        free(c->q);
        c->q = nq;
        c->qhead = 0;
        c->qcap = ncap;
    }
    c->q[(c->qhead + c->qlen) % c->qcap] =
        (struct pending){ .sent = now_ns(), .kind = (uint8_t)kind };
    c->qlen++;
    B.outstanding++;
}

/* A tagged request of slot k: its line, no place in the ring (the tag
 * finds the slot). */
static void conn_send_tagged(struct bconn *c, unsigned k, enum req_kind kind,
                             const char *fmt, const char *names)
{
    struct tslot *t = &c->slots[k];
    int n;

    while (c->wcap - c->wlen < 4096) {
        c->wcap = c->wcap ? c->wcap * 2 : 8192;
        c->wbuf = xrealloc(c->wbuf, c->wcap);
    }
    n = snprintf(c->wbuf + c->wlen, c->wcap - c->wlen, "#s%u ", k);
    c->wlen += (size_t)n;
    n = snprintf(c->wbuf + c->wlen, c->wcap - c->wlen, fmt, names, B.ttl,
                 B.lock_opts[0] ? " " : "", B.lock_opts);
    if (n < 0 || (size_t)n >= c->wcap - c->wlen)
        die("request line too long");
    c->wlen += (size_t)n;
    t->sent = now_ns();
    t->kind = (uint8_t)kind;
    t->busy = true;
    B.outstanding++;
}

static void conn_start(struct bconn *c)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.ptr = c };
    int fd = socket_open(true);

    B.started++;
    if (fd < 0)
        die("socket: %s", strerror(-fd));
    c->fd = fd;
    c->state = CS_CONNECTING;
    c->out_armed = true;
    B.connecting++;
    B.in_setup++;
    if (epoll_ctl(B.ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&B.sa, B.salen) != 0 &&
        errno != EINPROGRESS && errno != EAGAIN) {
        B.connect_errors++;
        if (B.connect_errors == 1)
            warnx("connect to %s: %s", B.server, strerror(errno));
        conn_close(c);
    }
}

/* ---- what each mode sends ------------------------------------------------ */

static bool may_generate(void)
{
    return B.phase == PH_RUN && !interrupted &&
           (B.nops == 0 || B.ops_started < B.nops);
}

/* The resource names of one lock-mode cycle, space-separated. */
/* The names a LOCK names: with --fixed the same ones each time, per
 * connection (and per slot of its tags: slot >= 0), else new ones. */
static const char *lock_names(const struct bconn *c, uint64_t seq, long slot)
{
    static char buf[2048];
    char base[160];
    size_t off = 0;

    if (B.fixed && slot >= 0)
        snprintf(base, sizeof(base), "%s:%u:s%ld", B.prefix, c->idx, slot);
    else if (B.fixed)
        snprintf(base, sizeof(base), "%s:%u", B.prefix, c->idx);
    else
        snprintf(base, sizeof(base), "%s:%u:%" PRIu64, B.prefix, c->idx, seq);
    if (B.multi <= 1)
        return strcpy(buf, base);
    for (unsigned k = 0; k < B.multi; k++) {
        int n = snprintf(buf + off, sizeof(buf) - off, "%s%s/%u",
                         k ? " " : "", base, k);

        if (n < 0 || (size_t)n >= sizeof(buf) - off)
            die("--multi %u: request line too long", B.multi);
        off += (size_t)n;
    }
    return buf;
}

static void send_lock(struct bconn *c, uint64_t seq)
{
    conn_send(c, REQ_LOCK, "LOCK %s ttl=%u%s%s\n", lock_names(c, seq, -1), B.ttl,
              B.lock_opts[0] ? " " : "", B.lock_opts);
}

static void send_unlock(struct bconn *c, uint64_t seq)
{
    conn_send(c, REQ_UNLOCK, "UNLOCK %s\n", lock_names(c, seq, -1));
}

static void tagged_lock(struct bconn *c, unsigned k)
{
    c->slots[k].seq = c->seq++;
    B.ops_started++;
    conn_send_tagged(c, k, REQ_LOCK, "LOCK %s ttl=%u%s%s\n",
                     lock_names(c, c->slots[k].seq, (long)k));
}

static void fill_lock(struct bconn *c)
{
    if (B.tags) {
        if (!c->slots)
            c->slots = calloc(B.tags, sizeof(*c->slots));
        if (!c->slots)
            die("out of memory");
        for (unsigned k = 0; k < B.tags && may_generate(); k++)
            if (!c->slots[k].busy)
                tagged_lock(c, k);
        return;
    }
    if (B.pipeline <= 1) {
        /* One request at a time: UNLOCK only after the LOCK came back OK. */
        if (c->qlen > 0)
            return;
        if (c->holding) {
            send_unlock(c, c->seq - 1);
        } else if (may_generate()) {
            send_lock(c, c->seq);
            c->seq++;
            B.ops_started++;
        }
        return;
    }
    /* Pairs back to back: the daemon runs a connection's requests in
     * order, so each UNLOCK finds its LOCK done. */
    while (c->qlen + 2 <= 2 * B.pipeline && may_generate()) {
        send_lock(c, c->seq);
        send_unlock(c, c->seq);
        c->seq++;
        B.ops_started++;
    }
}

static void fill_contend(struct bconn *c)
{
    if (c->qlen > 0)
        return;
    if (c->holding) {
        if (c->unlock_due != 0) {
            if (now_ns() < c->unlock_due)
                return;
            c->unlock_due = 0;
            B.ndue--;
        }
        /* Out of the critical section from the moment UNLOCK is sent:
         * the daemon can hand the lock on only after it has read it. */
        if (B.cs_holder == (long)c->idx)
            B.cs_holder = -1;
        conn_send(c, REQ_UNLOCK, "UNLOCK %s:hot\n", B.prefix);
    } else if (may_generate()) {
        conn_send(c, REQ_LOCK, "LOCK %s:hot ttl=%u wait=%u\n", B.prefix,
                  B.ttl, B.wait);
        B.ops_started++;
    }
}

static void fill_ping(struct bconn *c)
{
    while (c->qlen < B.pipeline && may_generate()) {
        conn_send(c, REQ_PING, "PING\n");
        B.ops_started++;
    }
}

static void conn_fill(struct bconn *c)
{
    if (c->state != CS_READY)
        return;
    switch (B.mode) {
    case MODE_LOCK: fill_lock(c); break;
    case MODE_CONTEND: fill_contend(c); break;
    case MODE_PING: fill_ping(c); break;
    case MODE_IDLE: break;      /* the lock was taken during setup */
    }
}

/* ---- replies -------------------------------------------------------------- */

static void count_error(const char *line)
{
    char code[16];
    size_t n = 0;
    const char *p = line;

    B.errors++;
    if (strncmp(p, "ERR ", 4) == 0) {
        p += 4;
        while (n < sizeof(code) - 1 && p[n] != '\0' && p[n] != ' ')
            n++;
    }
    if (n == 0) {
        snprintf(code, sizeof(code), "?");
    } else {
        memcpy(code, p, n);
        code[n] = '\0';
    }
    for (unsigned i = 0; i < B.nerr; i++) {
        if (strcmp(B.err[i].code, code) == 0) {
            B.err[i].n++;
            return;
        }
    }
    if (B.nerr < BENCH_MAX_ERRCODES) {
        snprintf(B.err[B.nerr].code, sizeof(B.err[B.nerr].code), "%s", code);
        B.err[B.nerr++].n = 1;
    }
    if (B.errors <= 3)
        warnx("server said: %.200s", line);
}

/* Grant k+1 follows the UNLOCK reply of grant k; whichever of the two is
 * seen second closes the pair. Both can arrive in one epoll batch, in
 * either order, so a negative gap counts as 0. Only a handoff to another
 * connection counts: a connection that gets the lock back (the only one,
 * or the next in line being itself) measures its own round trip. */
static void handoff_record(const struct handoff_slot *from,
                           const struct handoff_slot *to)
{
    if (from->conn == to->conn)
        return;
    hist_add(&B.h[H_HANDOFF], to->grant_at > from->unlock_at
                              ? to->grant_at - from->unlock_at : 0);
}

/* The value of key=NUMBER in a reply line, or false. */
static bool reply_u64(const char *line, const char *key, uint64_t *out)
{
    size_t kl = strlen(key);

    for (const char *p = line; (p = strstr(p, key)) != NULL; p += kl) {
        if ((p == line || p[-1] == ' ') && p[kl] == '=' &&
            isdigit((unsigned char)p[kl + 1])) {
            *out = strtoull(p + kl + 1, NULL, 10);
            return true;
        }
    }
    return false;
}

/*
 * Mutual exclusion, as far as one client can see it. A connection is in
 * its critical section from reading its grant to sending its UNLOCK (or
 * reading EVENT LOST). A correct daemon can grant the next waiter only
 * after it has read that UNLOCK, so a grant read while another connection
 * is still inside is a violation, whatever the timing. And grants of one
 * resource are read in the order they were made, so their fences must
 * strictly increase. --hold-ms widens the critical section so that an
 * overlap has time to show.
 */
static void contend_granted(struct bconn *c, const char *line, uint64_t now)
{
    uint64_t k = B.grants++, fence;
    struct handoff_slot *s = &B.ho[k % BENCH_HANDOFF_RING];
    struct handoff_slot *prev = &B.ho[(k - 1) % BENCH_HANDOFF_RING];

    if (B.cs_holder >= 0 && B.cs_holder != (long)c->idx) {
        B.violations++;
        if (B.violations <= 3)
            warnx("MUTUAL EXCLUSION VIOLATED: connection %u granted while "
                  "connection %ld holds the lock: %.200s", c->idx,
                  B.cs_holder, line);
    }
    B.cs_holder = (long)c->idx;
    if (reply_u64(line, "fence", &fence)) {
        if (fence <= B.last_fence && B.last_fence != 0) {
            B.fence_violations++;
            if (B.fence_violations <= 3)
                warnx("FENCE NOT INCREASING: %" PRIu64 " after %" PRIu64,
                      fence, B.last_fence);
        }
        if (fence > B.last_fence)
            B.last_fence = fence;
    } else {
        B.missing_fence++;
    }
    if (B.hold_ms > 0) {
        c->unlock_due = now + (uint64_t)B.hold_ms * 1000000u;
        B.ndue++;
    }
    *s = (struct handoff_slot){ .grant_no = k, .conn = c->idx, .grant_at = now };
    c->grant_no = k;
    if (k > 0 && prev->grant_no == k - 1 && prev->unlock_at != 0)
        handoff_record(prev, s);
}

static void contend_released(struct bconn *c, uint64_t now)
{
    uint64_t k = c->grant_no;
    struct handoff_slot *s = &B.ho[k % BENCH_HANDOFF_RING];
    struct handoff_slot *next = &B.ho[(k + 1) % BENCH_HANDOFF_RING];

    if (s->grant_no != k)
        return;
    s->unlock_at = now;
    if (k + 1 < B.grants && next->grant_no == k + 1)
        handoff_record(s, next);
}

/* The lock is gone without an UNLOCK (EVENT LOST, a dropped connection):
 * someone else may rightly have it now. */
static void contend_left(struct bconn *c)
{
    if (B.cs_holder == (long)c->idx)
        B.cs_holder = -1;
    if (c->unlock_due != 0) {
        c->unlock_due = 0;
        B.ndue--;
    }
}

/* idle: the next of this session's L locks, one at a time. */
static void idle_send_lock(struct bconn *c)
{
    conn_send(c, REQ_LOCK, "LOCK %s:idle:%u:%u ttl=%u renew=1\n", B.prefix,
              c->idx, c->nlocks, B.ttl);
}

static void set_holding(struct bconn *c, bool on)
{
    if (c->holding == on)
        return;
    c->holding = on;
    if (on)
        B.holders++;
    else
        B.holders--;
}

static void on_reply(struct bconn *c, enum req_kind kind, const char *line,
                     uint64_t sent, uint64_t now)
{
    bool ok = kind == REQ_PING
              ? strncmp(line, "PONG", 4) == 0
              : strncmp(line, "OK", 2) == 0 && (line[2] == '\0' || line[2] == ' ');
    uint64_t lat = now > sent ? now - sent : 0;

    if (!ok) {
        if (strncmp(line, "ERR ", 4) == 0)
            count_error(line);
        else
            B.unexpected++;
    }
    if (kind != REQ_HELLO)
        B.requests++;
    switch (kind) {
    case REQ_HELLO:
        if (!ok || !strstr(line, "proto=1")) {
            warnx("HELLO answered: %.200s", line);
            conn_close(c);
            return;
        }
        if (B.mode == MODE_IDLE) {
            if (!c->got)
                c->got = calloc(B.locks_per_conn, 1);
            if (!c->got)
                die("out of memory");
            idle_send_lock(c);
            return;
        }
        c->state = CS_READY;
        B.in_setup--;
        B.ready++;
        return;
    case REQ_LOCK:
        hist_add(&B.h[H_LOCK], lat);
        c->lock_ok = ok;
        if (B.mode == MODE_IDLE) {
            if (ok) {
                c->got[c->nlocks] = 1;
                B.locked++;
                set_holding(c, true);
            }
            if (++c->nlocks < B.locks_per_conn) {
                idle_send_lock(c);
                return;
            }
            c->state = CS_READY;
            B.in_setup--;
            B.ready++;
            return;
        }
        if (ok && (B.mode == MODE_CONTEND || B.pipeline <= 1))
            set_holding(c, true);
        if (ok && B.mode == MODE_CONTEND)
            contend_granted(c, line, now);
        return;
    case REQ_UNLOCK:
        hist_add(&B.h[H_UNLOCK], lat);
        if (B.mode == MODE_CONTEND && c->holding)
            contend_released(c, now);
        if (c->lock_ok && ok)
            B.ops++;
        set_holding(c, false);
        return;
    case REQ_PING:
        hist_add(&B.h[H_PING], lat);
        if (ok)
            B.ops++;
        return;
    }
}

/* --tags: the reply to slot k's request (after its tag). A granted
 * LOCK is followed by its UNLOCK at once; an answered UNLOCK (or a
 * refused LOCK) frees the slot for the next cycle. */
static void on_tagged_reply(struct bconn *c, unsigned k, const char *line,
                            uint64_t now)
{
    struct tslot *t = &c->slots[k];
    bool ok = strncmp(line, "OK", 2) == 0 && (line[2] == '\0' || line[2] == ' ');
    uint64_t lat = now > t->sent ? now - t->sent : 0;

    t->busy = false;
    B.outstanding--;
    B.requests++;
    if (!ok) {
        if (strncmp(line, "ERR ", 4) == 0)
            count_error(line);
        else
            B.unexpected++;
    }
    if (t->kind == REQ_LOCK) {
        hist_add(&B.h[H_LOCK], lat);
        t->lock_ok = ok;
        if (ok)
            conn_send_tagged(c, k, REQ_UNLOCK, "UNLOCK %s\n",
                             lock_names(c, t->seq, (long)k));
        return;
    }
    hist_add(&B.h[H_UNLOCK], lat);
    if (t->lock_ok && ok)
        B.ops++;
}

/* "#s<k> ": the slot k of a tagged reply, or -1. */
static long reply_slot(const char *line, const char **rest)
{
    char *end;
    unsigned long k;

    if (line[0] != '#' || line[1] != 's')
        return -1;
    k = strtoul(line + 2, &end, 10);
    if (*end != ' ' || k >= B.tags)
        return -1;
    *rest = end + 1;
    return (long)k;
}

static void conn_on_line(struct bconn *c, const char *line, uint64_t now)
{
    struct pending p;
    const char *rest;
    long k;

    if (strncmp(line, "EVENT ", 6) == 0) {
        B.events++;
        if (strncmp(line, "EVENT LOST", 10) == 0) {
            B.lost_events++;
            if (B.mode == MODE_CONTEND)
                contend_left(c);
            if (B.mode != MODE_IDLE)
                set_holding(c, false);
        }
        return;
    }
    if (line[0] == '#') {
        if (!c->slots || (k = reply_slot(line, &rest)) < 0 ||
            !c->slots[k].busy) {
            B.unexpected++;
            return;
        }
        on_tagged_reply(c, (unsigned)k, rest, now);
        return;
    }
    if (c->qlen == 0) {
        B.unexpected++;
        return;
    }
    p = c->q[c->qhead];
    c->qhead = (c->qhead + 1) % c->qcap;
    c->qlen--;
    B.outstanding--;
    on_reply(c, (enum req_kind)p.kind, line, p.sent, now);
}

/* Read into the free part of rbuf: the bytes read, 0 when there is
 * nothing now, -1 when the connection is gone (closed here). */
static ssize_t conn_recv(struct bconn *c)
{
    char *buf = c->rbuf + c->rlen;
    size_t len = c->rcap - c->rlen - 1;
    ssize_t n;
    int r, err;

    if (!c->ssl) {
        n = read(c->fd, buf, len);
        if (n > 0)
            return n;
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        conn_lost(c, n < 0 ? strerror(errno) : "");
        return -1;
    }
    ERR_clear_error();
    r = SSL_read(c->ssl, buf, (int)len);
    if (r > 0) {
        c->read_wants_write = false;
        return r;
    }
    err = SSL_get_error(c->ssl, r);
    if (err == SSL_ERROR_WANT_READ) {
        c->read_wants_write = false;
        return 0;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
        /* Retried on EPOLLOUT (conn_event). */
        c->read_wants_write = true;
        conn_arm(c, true);
        return 0;
    }
    if (err != SSL_ERROR_ZERO_RETURN)
        c->tls_dead = true;
    conn_lost(c, err == SSL_ERROR_ZERO_RETURN ? "" : tls_error(c->ssl, err));
    return -1;
}

/* One read (plain: epoll is level-triggered and calls again), or with TLS
 * as many as it takes to empty OpenSSL's buffer, which epoll cannot see;
 * every complete line handled; then the next requests sent. */
static void conn_read(struct bconn *c)
{
    bool got = false;

    do {
        uint64_t now;
        size_t start = 0;
        ssize_t n;

        if (c->rcap - c->rlen < 512) {
            if (c->rcap >= BENCH_MAX_LINE)
                die("a reply line over %d bytes", BENCH_MAX_LINE);
            c->rcap = c->rcap ? c->rcap * 2 : 4096;
            c->rbuf = xrealloc(c->rbuf, c->rcap);
        }
        n = conn_recv(c);
        if (n < 0)
            return;
        if (n == 0)
            break;
        got = true;
        now = now_ns();
        c->rlen += (size_t)n;
        for (size_t i = 0; i < c->rlen && c->state != CS_CLOSED; i++) {
            if (c->rbuf[i] != '\n')
                continue;
            c->rbuf[i] = '\0';
            if (i > start && c->rbuf[i - 1] == '\r')
                c->rbuf[i - 1] = '\0';
            conn_on_line(c, c->rbuf + start, now);
            start = i + 1;
        }
        if (c->state == CS_CLOSED)
            return;
        memmove(c->rbuf, c->rbuf + start, c->rlen - start);
        c->rlen -= start;
    } while (c->ssl && SSL_has_pending(c->ssl));
    if (!got && !c->write_wants_read)
        return;
    conn_fill(c);
    conn_flush(c);
}

/* Connected (and with TLS, the handshake done): say HELLO. */
static void conn_session(struct bconn *c)
{
    B.connecting--;
    c->state = CS_SETUP;
    conn_send(c, REQ_HELLO, "HELLO proto=1 name=bench-%u\n", c->idx);
    conn_flush(c);
}

/* TLS: one step of SSL_connect, driven by the loop. */
static void conn_handshake(struct bconn *c)
{
    int r, err;

    ERR_clear_error();
    r = SSL_connect(c->ssl);
    if (r == 1) {
        tls_note(c->ssl);
        conn_session(c);
        return;
    }
    err = SSL_get_error(c->ssl, r);
    if (err == SSL_ERROR_WANT_READ) {
        conn_arm(c, false);
        return;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
        conn_arm(c, true);
        return;
    }
    c->tls_dead = true;
    B.connect_errors++;
    if (B.connect_errors == 1)
        warnx("TLS handshake with %s: %s", B.server, tls_error(c->ssl, err));
    conn_close(c);
}

static void conn_connected(struct bconn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);

    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
        B.connect_errors++;
        if (B.connect_errors == 1)
            warnx("connect to %s: %s", B.server, strerror(err));
        conn_close(c);
        return;
    }
    if (B.tls) {
        c->ssl = tls_new(c->fd);
        c->state = CS_HANDSHAKE;
        conn_handshake(c);
        return;
    }
    conn_session(c);
}

static void conn_event(struct bconn *c, uint32_t events)
{
    if (c->state == CS_CONNECTING) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            conn_connected(c);
        return;
    }
    if (c->state == CS_HANDSHAKE) {
        conn_handshake(c);
        return;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        conn_read(c);
    if (c->state != CS_CLOSED && (events & EPOLLOUT)) {
        if (c->read_wants_write)
            conn_read(c);       /* it ends in conn_flush */
        else
            conn_flush(c);
    }
}

/* ---- the loop -------------------------------------------------------------- */

/* Start connections while fewer than `window` are still being set up:
 * the accept backlog never overflows (a dropped SYN costs a one-second
 * retransmit), and the daemon is measured holding sessions, not absorbing
 * a connection storm (with 256 at a time, idle mode's HELLO+LOCK bursts
 * pushed Redis replies past command_timeout_ms 100 on a 2-core machine). */
static void start_more(void)
{
    while (B.started < B.conns && B.in_setup < B.window)
        conn_start(&B.c[B.started]);
}

typedef bool (*done_fn)(void);

/* contend --hold-ms: send the UNLOCKs that are due; returns the epoll
 * timeout (ms) until the next one, or -1 when none is pending. */
static int fire_due(uint64_t now)
{
    uint64_t next = UINT64_MAX;

    if (B.ndue == 0)
        return -1;
    for (unsigned i = 0; i < B.started; i++) {
        struct bconn *c = &B.c[i];

        if (c->unlock_due == 0 || c->state != CS_READY)
            continue;
        if (c->unlock_due <= now) {
            conn_fill(c);
            conn_flush(c);
        } else if (c->unlock_due < next) {
            next = c->unlock_due;
        }
    }
    if (next == UINT64_MAX)
        return -1;
    /* Rounded up: an UNLOCK up to 1 ms late, rather than a busy loop. */
    return (int)((next - now + 999999u) / 1000000u);
}

/* idle: the daemon's RSS, sampled every 10 ms for its peak. */
static void rss_tick(uint64_t now)
{
    long kib;

    if (B.mode != MODE_IDLE || B.pid <= 0 || now < B.rss_next)
        return;
    B.rss_next = now + 10000000u;
    kib = proc_rss_kib(B.pid);
    if (kib > B.rss_peak)
        B.rss_peak = kib;
}

static void loop_until(uint64_t deadline, done_fn done)
{
    struct epoll_event ev[512];

    while (!interrupted && !done()) {
        uint64_t now = now_ns();
        int n, timeout, due;

        if (now >= deadline)
            break;
        if (B.phase == PH_SETUP)
            start_more();
        rss_tick(now);
        timeout = (int)((deadline - now) / 1000000) + 1;
        if (timeout > 100)
            timeout = 100;
        if (B.mode == MODE_IDLE && B.pid > 0 && timeout > 10)
            timeout = 10;
        due = fire_due(now);
        if (due >= 0 && due < timeout)
            timeout = due;
        n = epoll_wait(B.ep, ev, (int)(sizeof(ev) / sizeof(ev[0])), timeout);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++)
            conn_event(ev[i].data.ptr, ev[i].events);
    }
}

static bool setup_done(void)
{
    return B.started == B.conns && B.in_setup == 0;
}

static bool run_done(void)
{
    /* With -n: every op started, and their replies are back. */
    return B.nops > 0 && B.ops_started >= B.nops && B.outstanding == 0 &&
           B.holders == 0;
}

static bool drain_done(void)
{
    return B.outstanding == 0 && B.holders == 0;
}

static bool never_done(void)
{
    return B.ready == 0;        /* nothing left to wait for */
}

static void setup_connections(void)
{
    B.phase = PH_SETUP;
    loop_until(now_ns() + sec_to_ns(BENCH_SETUP_TIMEOUT_S), setup_done);
    if (!setup_done())
        warnx("setup incomplete after %.0f s: %u of %u connections ready",
              BENCH_SETUP_TIMEOUT_S, B.ready, B.conns);
    if (B.ready == 0)
        die("no connection to %s could be set up", B.server);
}

/* ---- a synchronous control connection (idle mode) ------------------------ */

struct ctl {
    int fd;
    SSL *ssl;           /* TLS: a blocking SSL on fd */
    char buf[65536];
    size_t len;
    char line[65536];
};

static int ctl_open(struct ctl *k)
{
    int fd = socket_open(false);

    k->len = 0;
    k->fd = -1;
    k->ssl = NULL;
    if (fd < 0)
        return fd;
    if (connect(fd, (struct sockaddr *)&B.sa, B.salen) != 0) {
        int e = errno;

        close(fd);
        return -e;
    }
    if (B.tls) {
        /* Blocking, each read and write bounded by the socket timeouts. */
        struct timeval tv = { .tv_sec = BENCH_CTL_TIMEOUT_MS / 1000,
                              .tv_usec = BENCH_CTL_TIMEOUT_MS % 1000 * 1000 };
        int r;

        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        k->ssl = tls_new(fd);
        ERR_clear_error();
        r = SSL_connect(k->ssl);
        if (r != 1) {
            warnx("TLS handshake with %s: %s", B.server,
                  tls_error(k->ssl, SSL_get_error(k->ssl, r)));
            SSL_free(k->ssl);
            k->ssl = NULL;
            close(fd);
            return -EPROTO;
        }
    }
    k->fd = fd;
    return 0;
}

static bool ctl_write(struct ctl *k, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n;

        if (k->ssl) {
            ERR_clear_error();
            n = SSL_write(k->ssl, data, (int)len);
            if (n <= 0) {
                ERR_clear_error();
                return false;
            }
        } else {
            n = send(k->fd, data, len, MSG_NOSIGNAL);
        }

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        data += n;
        len -= (size_t)n;
    }
    return true;
}

/* The next reply line (EVENT lines skipped), or NULL on EOF or timeout. */
static const char *ctl_line(struct ctl *k, int timeout_ms)
{
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;

    for (;;) {
        char *nl = memchr(k->buf, '\n', k->len);

        if (nl) {
            size_t n = (size_t)(nl - k->buf);

            memcpy(k->line, k->buf, n);
            k->line[n] = '\0';
            if (n > 0 && k->line[n - 1] == '\r')
                k->line[n - 1] = '\0';
            memmove(k->buf, nl + 1, k->len - n - 1);
            k->len -= n + 1;
            if (strncmp(k->line, "EVENT ", 6) == 0)
                continue;
            return k->line;
        }
        if (k->len == sizeof(k->buf))
            return NULL;

        uint64_t now = now_ns();
        struct pollfd p = { .fd = k->fd, .events = POLLIN };
        ssize_t n;

        if (now >= deadline || interrupted)
            return NULL;
        /* What OpenSSL has buffered already, poll would not see. */
        if (!(k->ssl && SSL_has_pending(k->ssl)) &&
            poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
            continue;
        if (k->ssl) {
            ERR_clear_error();
            n = SSL_read(k->ssl, k->buf + k->len,
                         (int)(sizeof(k->buf) - k->len));
            if (n <= 0)
                ERR_clear_error();
        } else {
            n = recv(k->fd, k->buf + k->len, sizeof(k->buf) - k->len, 0);
        }
        if (n <= 0)
            return NULL;
        k->len += (size_t)n;
    }
}

static void ctl_close(struct ctl *k)
{
    if (k->ssl) {
        SSL_shutdown(k->ssl);
        ERR_clear_error();
        SSL_free(k->ssl);
        k->ssl = NULL;
    }
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
}

/* A number from the daemon's STATS, or -1. */
static long long ctl_stat(const char *key)
{
    struct ctl *k = xrealloc(NULL, sizeof(*k));
    long long v = -1;
    const char *line;

    if (ctl_open(k) == 0 && ctl_write(k, "STATS\n", 6) &&
        (line = ctl_line(k, BENCH_CTL_TIMEOUT_MS)) &&
        strncmp(line, "OK {", 4) == 0) {
        json_t *o = json_loads(line + 3, 0, NULL);

        if (json_is_integer(json_object_get(o, key)))
            v = json_integer_value(json_object_get(o, key));
        json_decref(o);
    }
    ctl_close(k);
    free(k);
    return v;
}

/* After every idle connection is gone, ask STATUS about each resource
 * (pipelined in batches) until none is held; returns how many still are. */
static unsigned idle_check_released(double *took_s, unsigned *rounds)
{
    const unsigned batch = 256;
    uint64_t t0 = now_ns();
    uint64_t deadline = t0 + sec_to_ns(BENCH_RELEASE_TIMEOUT_S);
    const unsigned L = B.locks_per_conn;
    unsigned *todo = xrealloc(NULL, ((size_t)B.conns * L + 1) * sizeof(*todo));
    unsigned ntodo = 0, left = 0;
    struct ctl *k = xrealloc(NULL, sizeof(*k));

    for (unsigned i = 0; i < B.conns; i++)
        for (unsigned j = 0; B.c[i].got && j < L; j++)
            if (B.c[i].got[j])
                todo[ntodo++] = i * L + j;
    k->fd = -1;
    k->ssl = NULL;
    *rounds = 0;
    while (ntodo > 0 && now_ns() < deadline && !interrupted) {
        (*rounds)++;
        if (k->fd < 0 && ctl_open(k) != 0) {
            warnx("cannot connect to check the releases");
            break;
        }
        left = 0;
        for (unsigned off = 0; off < ntodo; off += batch) {
            unsigned end = off + batch < ntodo ? off + batch : ntodo;
            char req[256];
            bool io_ok = true;

            for (unsigned i = off; i < end && io_ok; i++) {
                int n = snprintf(req, sizeof(req), "STATUS %s:idle:%u:%u\n",
                                 B.prefix, todo[i] / L, todo[i] % L);
                io_ok = ctl_write(k, req, (size_t)n);
            }
            for (unsigned i = off; i < end; i++) {
                const char *line = io_ok ? ctl_line(k, BENCH_CTL_TIMEOUT_MS)
                                         : NULL;
                json_t *o = line && strncmp(line, "OK {", 4) == 0
                            ? json_loads(line + 3, 0, NULL) : NULL;

                if (!o || !json_is_false(json_object_get(o, "held")))
                    todo[left++] = todo[i];
                json_decref(o);
                if (!line)
                    io_ok = false;
            }
            if (!io_ok) {
                /* Reconnect for the next round; what was not answered
                 * is asked again then. */
                warnx("the STATUS connection failed");
                ctl_close(k);
                for (unsigned i = end; i < ntodo; i++)
                    todo[left++] = todo[i];
                break;
            }
        }
        ntodo = left;
        if (ntodo > 0)
            usleep(200 * 1000);
    }
    *took_s = (double)(now_ns() - t0) / 1e9;
    ctl_close(k);
    free(k);
    free(todo);
    return ntodo;
}

/* ---- reporting -------------------------------------------------------------- */

static double ns_to_ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static json_t *hist_json(const struct hist *h)
{
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f}",
                     "count", (json_int_t)h->count,
                     "mean", h->count ? ns_to_ms(h->sum / h->count) : 0.0,
                     "p50", ns_to_ms(hist_percentile(h, 50)),
                     "p90", ns_to_ms(hist_percentile(h, 90)),
                     "p99", ns_to_ms(hist_percentile(h, 99)),
                     "p999", ns_to_ms(hist_percentile(h, 99.9)),
                     "max", ns_to_ms(h->max));
}

static void hist_print(FILE *f, const char *label, const struct hist *h)
{
    if (h->count == 0)
        return;
    fprintf(f, "  %-18s p50 %7.3f  p90 %7.3f  p99 %7.3f  max %8.3f ms"
            "  (n=%" PRIu64 ")\n", label,
            ns_to_ms(hist_percentile(h, 50)), ns_to_ms(hist_percentile(h, 90)),
            ns_to_ms(hist_percentile(h, 99)), ns_to_ms(h->max), h->count);
}

struct daemon_sample {
    long rss_kib;
    double cpu_s;
    uint64_t at;
};

static void daemon_sample(struct daemon_sample *s)
{
    s->at = now_ns();
    s->rss_kib = B.pid > 0 ? proc_rss_kib(B.pid) : -1;
    s->cpu_s = B.pid > 0 ? proc_cpu_s(B.pid) : -1;
}

/* Daemon CPU between two samples, percent of one core, or -1. */
static double cpu_percent(const struct daemon_sample *a,
                          const struct daemon_sample *b)
{
    if (a->cpu_s < 0 || b->cpu_s < 0 || b->at <= a->at)
        return -1;
    return 100.0 * (b->cpu_s - a->cpu_s) / ((double)(b->at - a->at) / 1e9);
}

static json_t *errors_json(void)
{
    json_t *o = json_object();

    json_object_set_new(o, "total", json_integer((json_int_t)B.errors));
    for (unsigned i = 0; i < B.nerr; i++)
        json_object_set_new(o, B.err[i].code, json_integer((json_int_t)B.err[i].n));
    return o;
}

static void errors_print(FILE *f)
{
    fprintf(f, "  errors:            %" PRIu64, B.errors);
    for (unsigned i = 0; i < B.nerr; i++)
        fprintf(f, "%s%s %" PRIu64, i ? ", " : " (", B.err[i].code, B.err[i].n);
    fprintf(f, "%s\n", B.nerr ? ")" : "");
    if (B.disconnects || B.connect_errors || B.unexpected || B.lost_events)
        fprintf(f, "  disconnects %" PRIu64 ", connect errors %" PRIu64
                ", unexpected lines %" PRIu64 ", EVENT LOST %" PRIu64 "\n",
                B.disconnects, B.connect_errors, B.unexpected, B.lost_events);
}

static void emit(json_t *o, void (*human)(FILE *, json_t *))
{
    const size_t flags = JSON_INDENT(2) | JSON_REAL_PRECISION(6);

    json_object_set_new(o, "mode", json_string(mode_names[B.mode]));
    json_object_set_new(o, "server", json_string(B.server));
    json_object_set_new(o, "tls", json_boolean(B.tls));
    if (B.tls && B.tls_version[0]) {
        json_object_set_new(o, "tls_version", json_string(B.tls_version));
        json_object_set_new(o, "tls_cipher", json_string(B.tls_cipher));
    }
    json_object_set_new(o, "connections", json_integer(B.conns));
    json_object_set_new(o, "errors", errors_json());
    json_object_set_new(o, "disconnects", json_integer((json_int_t)B.disconnects));
    json_object_set_new(o, "connect_errors",
                        json_integer((json_int_t)B.connect_errors));
    json_object_set_new(o, "unexpected_lines",
                        json_integer((json_int_t)B.unexpected));
    json_object_set_new(o, "events_lost", json_integer((json_int_t)B.lost_events));
    json_object_set_new(o, "interrupted", json_boolean(interrupted != 0));
    if (B.json_file && json_dump_file(o, B.json_file, flags) != 0)
        warnx("cannot write %s", B.json_file);
    if (B.json) {
        json_dumpf(o, stdout, flags);
        fputc('\n', stdout);
    } else {
        human(stdout, o);
    }
    json_decref(o);
}

static double jnum(json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

/* CPU seconds of every watched process and of this one over the window,
 * and (with ops > 0) microseconds per op. */
static json_t *cpu_json(uint64_t ops, json_t **per_op)
{
    json_t *o = json_object();

    *per_op = json_object();
    for (unsigned i = 0; i <= B.nwatch; i++) {
        const char *name = i < B.nwatch ? B.w[i].name : "client";
        double a = i < B.nwatch ? B.w[i].cpu0 : B.client0;
        double b = i < B.nwatch ? B.w[i].cpu1 : B.client1;

        if (a < 0 || b < 0)
            continue;
        json_object_set_new(o, name, json_real(b - a));
        if (ops > 0)
            json_object_set_new(*per_op, name,
                                json_real((b - a) * 1e6 / (double)ops));
    }
    return o;
}

static void cpu_print(FILE *f, json_t *o, const char *key, const char *what)
{
    json_t *m = json_object_get(o, key);
    const char *name;
    json_t *v;
    bool first = true;

    if (!m || json_object_size(m) == 0)
        return;
    fprintf(f, "  %-18s", what);
    json_object_foreach(m, name, v) {
        fprintf(f, "%s%s %.1f", first ? " " : ", ", name, json_number_value(v));
        first = false;
    }
    fputc('\n', f);
}

static void human_throughput(FILE *f, json_t *o)
{
    double cpu = jnum(o, "daemon_cpu_percent");

    fprintf(f, "redlockd-bench %s: %s, %u connections, %s %u, %.2f s\n",
            mode_names[B.mode], B.server, B.conns,
            B.tags ? "tagged, in flight" : "pipeline",
            B.tags ? B.tags : B.pipeline, jnum(o, "elapsed_s"));
    if (B.tls)
        fprintf(f, "  TLS:               %s, %s\n",
                B.tls_version[0] ? B.tls_version : "no handshake",
                B.tls_cipher[0] ? B.tls_cipher : "-");
    if (B.mode == MODE_LOCK)
        fprintf(f, "  cycles (LOCK+UNLOCK): %" PRIu64 "  (%.0f /s)\n", B.ops,
                jnum(o, "cycles_per_s"));
    else if (B.mode == MODE_CONTEND)
        fprintf(f, "  handoffs:          %" PRIu64 "  (%.0f grants/s)\n",
                B.grants, jnum(o, "handoffs_per_s"));
    fprintf(f, "  requests:          %" PRIu64 "  (%.0f req/s)\n", B.requests,
            jnum(o, "requests_per_s"));
    errors_print(f);
    hist_print(f, B.mode == MODE_CONTEND ? "LOCK (incl. wait)" : "LOCK",
               &B.h[H_LOCK]);
    hist_print(f, "UNLOCK", &B.h[H_UNLOCK]);
    hist_print(f, "PING", &B.h[H_PING]);
    hist_print(f, "UNLOCK->next grant", &B.h[H_HANDOFF]);
    if (cpu >= 0 && json_object_get(o, "daemon_cpu_percent"))
        fprintf(f, "  daemon pid %d: CPU %.1f%% of one core, RSS %.1f MiB\n",
                (int)B.pid, cpu, jnum(o, "daemon_rss_kib") / 1024.0);
    cpu_print(f, o, "cpu_us_per_cycle", "CPU us per cycle:");
    if (B.mode == MODE_CONTEND)
        fprintf(f, "  mutual exclusion:  %" PRIu64 " violations, %" PRIu64
                " fences not increasing (%" PRIu64 " grants without a fence)"
                "%s\n", B.violations, B.fence_violations, B.missing_fence,
                B.violations + B.fence_violations ? "  ** VIOLATED **" : "");
    fprintf(f, "  complete:          %s\n",
            json_is_true(json_object_get(o, "complete")) ? "yes" : "NO");
}

/* lock, contend, ping: connect, run for the duration (or -n ops), drain. */
static int run_throughput(void)
{
    struct daemon_sample s0, s1;
    double elapsed;
    json_t *o, *lat, *per;
    bool complete;
    unsigned ready_at_start;

    setup_connections();
    ready_at_start = B.ready;
    B.phase = PH_RUN;
    daemon_sample(&s0);
    watch_sample(0);
    B.t_start = now_ns();
    for (unsigned i = 0; i < B.started; i++) {
        conn_fill(&B.c[i]);
        if (B.c[i].state == CS_READY)
            conn_flush(&B.c[i]);
    }
    loop_until(B.t_start + sec_to_ns(B.duration), run_done);
    B.phase = PH_DRAIN;
    loop_until(now_ns() + sec_to_ns(BENCH_DRAIN_GRACE_S + B.wait / 1000.0 +
                                    B.hold_ms / 1000.0), drain_done);
    B.t_end = now_ns();
    watch_sample(1);
    daemon_sample(&s1);
    if (!drain_done())
        warnx("%" PRIu64 " replies still outstanding at the end", B.outstanding);
    complete = !interrupted && B.ops > 0 && drain_done() &&
               ready_at_start == B.conns && B.disconnects == 0 &&
               B.connect_errors == 0 && B.unexpected == 0;

    elapsed = (double)(B.t_end - B.t_start) / 1e9;
    o = json_object();
    lat = json_object();
    json_object_set_new(o, "pipeline", json_integer(B.pipeline));
    json_object_set_new(o, "tags", json_integer(B.tags));
    json_object_set_new(o, "elapsed_s", json_real(elapsed));
    json_object_set_new(o, "requests", json_integer((json_int_t)B.requests));
    json_object_set_new(o, "requests_per_s",
                        json_real((double)B.requests / elapsed));
    if (B.mode != MODE_PING) {
        json_object_set_new(o, "ttl_ms", json_integer(B.ttl));
        json_object_set_new(o, "cycles", json_integer((json_int_t)B.ops));
        json_object_set_new(o, "cycles_per_s",
                            json_real((double)B.ops / elapsed));
        json_object_set_new(o, "cpu_s", cpu_json(B.ops, &per));
        json_object_set_new(o, "cpu_us_per_cycle", per);
    }
    if (B.mode == MODE_LOCK) {
        json_object_set_new(o, "fixed_resource", json_boolean(B.fixed));
        json_object_set_new(o, "multi", json_integer(B.multi));
        json_object_set_new(o, "lock_opts", json_string(B.lock_opts));
        json_object_set_new(o, "ops", json_integer((json_int_t)B.ops));
        json_object_set_new(o, "ops_per_s", json_real((double)B.ops / elapsed));
        json_object_set_new(lat, "lock", hist_json(&B.h[H_LOCK]));
        json_object_set_new(lat, "unlock", hist_json(&B.h[H_UNLOCK]));
    } else if (B.mode == MODE_CONTEND) {
        json_object_set_new(o, "wait_ms", json_integer(B.wait));
        json_object_set_new(o, "hold_ms", json_integer(B.hold_ms));
        json_object_set_new(o, "handoffs", json_integer((json_int_t)B.grants));
        json_object_set_new(o, "handoffs_per_s",
                            json_real((double)B.grants / elapsed));
        json_object_set_new(lat, "lock", hist_json(&B.h[H_LOCK]));
        json_object_set_new(lat, "unlock", hist_json(&B.h[H_UNLOCK]));
        json_object_set_new(lat, "handoff", hist_json(&B.h[H_HANDOFF]));
        json_object_set_new(o, "mutex", json_pack("{s:I, s:I, s:I}",
            "violations", (json_int_t)B.violations,
            "fence_violations", (json_int_t)B.fence_violations,
            "grants_without_fence", (json_int_t)B.missing_fence));
    } else {
        json_object_set_new(o, "pings", json_integer((json_int_t)B.ops));
        json_object_set_new(lat, "ping", hist_json(&B.h[H_PING]));
        json_object_set_new(o, "cpu_s", cpu_json(B.ops, &per));
        json_object_set_new(o, "cpu_us_per_ping", per);
    }
    json_object_set_new(o, "latency_ms", lat);
    json_object_set_new(o, "complete", json_boolean(complete));
    if (B.pid > 0) {
        json_object_set_new(o, "daemon_pid", json_integer(B.pid));
        json_object_set_new(o, "daemon_cpu_percent",
                            json_real(cpu_percent(&s0, &s1)));
        json_object_set_new(o, "daemon_rss_kib", json_integer(s1.rss_kib));
    }
    emit(o, human_throughput);
    if (B.violations + B.fence_violations > 0)
        return 4;
    if (B.strict && !complete)
        return 5;
    return 0;
}

static void human_idle(FILE *f, json_t *o)
{
    json_t *rss = json_object_get(o, "daemon_rss_kib");
    json_t *pct = json_object_get(o, "hold_cpu_percent");
    long long renewals = (long long)jnum(o, "hold_renewals");

    fprintf(f, "redlockd-bench idle: %s, %u sessions x %u locks, ttl %u ms, "
            "renew=1, held %.1f s\n", B.server, B.conns, B.locks_per_conn,
            B.ttl, jnum(o, "hold_s"));
    fprintf(f, "  locks granted: %u of %u (setup %.2f s)\n", B.locked,
            B.conns * B.locks_per_conn, jnum(o, "setup_s"));
    errors_print(f);
    hist_print(f, "LOCK", &B.h[H_LOCK]);
    if (rss) {
        fprintf(f, "  daemon RSS: %.1f MiB before, %.1f MiB with the locks "
                "held, %.1f MiB at the peak, %.1f MiB %.1f s after the "
                "drop\n", jnum(rss, "before") / 1024.0,
                jnum(rss, "locked") / 1024.0, jnum(rss, "peak") / 1024.0,
                jnum(rss, "after") / 1024.0, B.after);
        fprintf(f, "  memory per lock held: %.0f bytes\n",
                jnum(o, "bytes_per_lock"));
    }
    if (pct && json_object_size(pct) > 0)
        cpu_print(f, o, "hold_cpu_percent", "CPU % while holding:");
    if (renewals >= 0)
        fprintf(f, "  renewals while holding: %lld (%.0f/s)\n", renewals,
                jnum(o, "hold_renewals_per_s"));
    fprintf(f, "  after closing all: %u of %u locks still held after %.2f s, "
            "%u STATUS round(s)%s\n", (unsigned)jnum(o, "still_held"),
            B.locked, jnum(o, "release_check_s"),
            (unsigned)json_integer_value(json_object_get(o, "release_check_rounds")),
            jnum(o, "still_held") == 0 ? " (all released)" : "  ** NOT RELEASED **");
}

/* Reset the daemon's VmHWM (peak RSS), so that it tells this run's peak;
 * false when the kernel does not let us. */
static bool reset_peak_rss(void)
{
    char path[64];
    FILE *f;
    bool ok;

    snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)B.pid);
    f = fopen(path, "w");
    if (!f)
        return false;
    ok = fputs("5\n", f) >= 0;
    return fclose(f) == 0 && ok;
}

static long proc_hwm_kib(pid_t pid)
{
    return proc_status_kib(pid, "VmHWM:");
}

/* idle: sessions that each hold L renewed locks, then all dropped. */
static int run_idle(void)
{
    struct daemon_sample s0, s1, s2, s3;
    long long ren1, ren2, lost1, lost2;
    uint64_t t_setup, t_drop;
    double hold_s, took;
    unsigned still, rounds;
    bool hwm = false;
    json_t *o, *pct;

    if (B.pid <= 0)
        warnx("no daemon pid (--pid or -p): memory and CPU are not measured");
    daemon_sample(&s0);
    if (B.pid > 0) {
        hwm = reset_peak_rss();
        B.rss_peak = s0.rss_kib;
    }
    t_setup = now_ns();
    setup_connections();
    ren1 = ctl_stat("renewals");
    lost1 = ctl_stat("leases_lost");
    daemon_sample(&s1);
    watch_sample(0);
    B.phase = PH_HOLD;
    loop_until(now_ns() + sec_to_ns(B.hold), never_done);
    watch_sample(1);
    daemon_sample(&s2);
    ren2 = ctl_stat("renewals");
    lost2 = ctl_stat("leases_lost");
    hold_s = (double)(s2.at - s1.at) / 1e9;

    /* Every connection at once, then the RSS for --after seconds. */
    t_drop = now_ns();
    for (unsigned i = 0; i < B.started; i++)
        conn_close(&B.c[i]);
    while (!interrupted && now_ns() < t_drop + sec_to_ns(B.after)) {
        rss_tick(now_ns());
        usleep(2000);
    }
    daemon_sample(&s3);
    if (hwm) {
        long k = proc_hwm_kib(B.pid);

        if (k > B.rss_peak)
            B.rss_peak = k;
    }
    if (s3.rss_kib > B.rss_peak)
        B.rss_peak = s3.rss_kib;
    still = idle_check_released(&took, &rounds);

    o = json_object();
    json_object_set_new(o, "ttl_ms", json_integer(B.ttl));
    json_object_set_new(o, "sessions", json_integer(B.conns));
    json_object_set_new(o, "locks_per_session", json_integer(B.locks_per_conn));
    json_object_set_new(o, "locks_granted", json_integer(B.locked));
    json_object_set_new(o, "setup_s", json_real((double)(s1.at - t_setup) / 1e9));
    json_object_set_new(o, "hold_s", json_real(hold_s));
    json_object_set_new(o, "after_s", json_real(B.after));
    json_object_set_new(o, "latency_ms", json_pack("{s:o}", "lock",
                                                   hist_json(&B.h[H_LOCK])));
    if (B.pid > 0 && s0.rss_kib >= 0 && s3.rss_kib >= 0) {
        double per = B.locked ? (double)(s1.rss_kib - s0.rss_kib) * 1024.0 /
                                B.locked : 0;

        json_object_set_new(o, "daemon_pid", json_integer(B.pid));
        json_object_set_new(o, "daemon_rss_kib", json_pack(
            "{s:i, s:i, s:i, s:i, s:i}", "before", (int)s0.rss_kib,
            "locked", (int)s1.rss_kib, "after_hold", (int)s2.rss_kib,
            "peak", (int)B.rss_peak, "after", (int)s3.rss_kib));
        json_object_set_new(o, "peak_from_vmhwm", json_boolean(hwm));
        json_object_set_new(o, "bytes_per_lock", json_real(per));
    }
    pct = json_object();
    for (unsigned i = 0; i <= B.nwatch && hold_s > 0; i++) {
        const char *name = i < B.nwatch ? B.w[i].name : "client";
        double a = i < B.nwatch ? B.w[i].cpu0 : B.client0;
        double b = i < B.nwatch ? B.w[i].cpu1 : B.client1;

        if (a >= 0 && b >= 0)
            json_object_set_new(pct, name, json_real(100.0 * (b - a) / hold_s));
    }
    json_object_set_new(o, "hold_cpu_percent", pct);
    if (ren1 >= 0 && ren2 >= 0) {
        json_object_set_new(o, "hold_renewals", json_integer(ren2 - ren1));
        json_object_set_new(o, "hold_renewals_per_s",
                            json_real((double)(ren2 - ren1) / hold_s));
    }
    if (lost1 >= 0 && lost2 >= 0)
        json_object_set_new(o, "hold_leases_lost", json_integer(lost2 - lost1));
    json_object_set_new(o, "still_held", json_integer(still));
    json_object_set_new(o, "release_check_s", json_real(took));
    json_object_set_new(o, "release_check_rounds", json_integer(rounds));
    json_object_set_new(o, "complete", json_boolean(
        !interrupted && still == 0 && B.locked == B.conns * B.locks_per_conn));
    emit(o, human_idle);
    if (still > 0 && !interrupted)
        return 3;
    if (B.strict && B.locked != B.conns * B.locks_per_conn)
        return 5;
    return 0;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: redlockd-bench [options] lock|contend|idle|ping\n"
        "\n"
        "Load generator for a running redlockd (line protocol, one thread,\n"
        "epoll). Prints a summary, or JSON with --json.\n"
        "\n"
        "  -s, --server ADDR     HOST:PORT, [V6]:PORT or /unix/path\n"
        "                        (default 127.0.0.1:7390); tls://HOST:PORT\n"
        "                        speaks TLS (as --tls-ca does)\n"
        "  -c, --connections N   connections (default 50; idle: 1000)\n"
        "  -d, --duration SEC    run time (default 10; with -n: a cap, 300)\n"
        "  -n, --ops N           stop after N ops (LOCK+UNLOCK pairs, grants\n"
        "                        or PINGs) instead\n"
        "  -P, --pipeline N      lock: pairs in flight per connection;\n"
        "                        ping: PINGs in flight (default 1; ping 16)\n"
        "  -T, --tags M          lock: M cycles in flight per connection as\n"
        "                        tagged requests (LOCK, then UNLOCK once\n"
        "                        granted), as M tasks sharing a session\n"
        "  -t, --ttl MS          lock ttl (default 30000)\n"
        "  -w, --wait MS         contend: LOCK wait= (default 5000)\n"
        "  -H, --hold SEC        idle: how long the locks are held (default 10)\n"
        "  -L, --locks N         idle: locks per session (default 1)\n"
        "      --after SEC       idle: RSS this long after the drop (default 2)\n"
        "      --fixed           lock: one resource per connection, not per cycle\n"
        "      --multi N         lock: N resources in each LOCK and UNLOCK\n"
        "      --lock-opts STR   lock: words added to every LOCK (mode=shared)\n"
        "      --hold-ms MS      contend: hold each grant MS before UNLOCK\n"
        "      --window N        connections being set up at once (default 32)\n"
        "      --prefix STR      resource name prefix (default bench:<pid>)\n"
        "      --pid PID         the daemon's pid, for RSS and CPU figures\n"
        "      --watch NAME=PID  also sample the CPU time of PID (repeatable)\n"
        "      --strict          exit 5 unless the run completed (every\n"
        "                        connection set up, cycles done, replies\n"
        "                        drained, no disconnect)\n"
        "      --tls-ca FILE     every connection speaks TLS, the server's\n"
        "                        certificate checked against this CA and the\n"
        "                        -s address (without it, tls:// uses the\n"
        "                        system's CA store); handshakes happen while\n"
        "                        connecting, before the measured window\n"
        "      --tls-cert FILE   TLS: a client certificate (PEM, with its\n"
        "      --tls-key FILE    chain) and its key (default: in the cert file)\n"
        "  -p, --find-pid        find the daemon's pid from its listening socket\n"
        "      --json            print JSON instead of the summary\n"
        "      --json-file FILE  also write the JSON to FILE\n"
        "  -h, --help            this help\n"
        "\n"
        "Exit status: 0 done, 1 error, 2 usage, 3 idle: locks not released,\n"
        "4 contend: mutual exclusion violated, 5 --strict: incomplete.\n");
}

static unsigned long parse_num(const char *s, const char *what, unsigned long max)
{
    char *end;
    unsigned long v;

    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v > max || s[0] == '-')
        die("bad %s: %s", what, s);
    return v;
}

static double parse_secs(const char *s, const char *what)
{
    char *end;
    double v = strtod(s, &end);

    if (end == s || *end != '\0' || !(v > 0) || v > 86400)
        die("bad %s: %s", what, s);
    return v;
}

static void parse_args(int argc, char **argv)
{
    enum { OPT_PREFIX = 256, OPT_PID, OPT_JSON, OPT_JSON_FILE, OPT_WINDOW,
           OPT_AFTER, OPT_FIXED, OPT_MULTI, OPT_LOCK_OPTS, OPT_HOLD_MS,
           OPT_WATCH, OPT_STRICT, OPT_TLS_CA, OPT_TLS_CERT, OPT_TLS_KEY };
    static const struct option opts[] = {
        { "server", required_argument, NULL, 's' },
        { "connections", required_argument, NULL, 'c' },
        { "duration", required_argument, NULL, 'd' },
        { "ops", required_argument, NULL, 'n' },
        { "pipeline", required_argument, NULL, 'P' },
        { "tags", required_argument, NULL, 'T' },
        { "ttl", required_argument, NULL, 't' },
        { "wait", required_argument, NULL, 'w' },
        { "hold", required_argument, NULL, 'H' },
        { "window", required_argument, NULL, OPT_WINDOW },
        { "locks", required_argument, NULL, 'L' },
        { "after", required_argument, NULL, OPT_AFTER },
        { "fixed", no_argument, NULL, OPT_FIXED },
        { "multi", required_argument, NULL, OPT_MULTI },
        { "lock-opts", required_argument, NULL, OPT_LOCK_OPTS },
        { "hold-ms", required_argument, NULL, OPT_HOLD_MS },
        { "watch", required_argument, NULL, OPT_WATCH },
        { "strict", no_argument, NULL, OPT_STRICT },
        { "tls-ca", required_argument, NULL, OPT_TLS_CA },
        { "tls-cert", required_argument, NULL, OPT_TLS_CERT },
        { "tls-key", required_argument, NULL, OPT_TLS_KEY },
        { "prefix", required_argument, NULL, OPT_PREFIX },
        { "pid", required_argument, NULL, OPT_PID },
        { "find-pid", no_argument, NULL, 'p' },
        { "json", no_argument, NULL, OPT_JSON },
        { "json-file", required_argument, NULL, OPT_JSON_FILE },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    long conns = -1, pipeline = -1;
    bool have_duration = false;
    int ch;

    B.server = "127.0.0.1:7390";
    B.duration = 10;
    B.ttl = 30000;
    B.wait = 5000;
    B.hold = 10;
    B.window = 32;
    B.multi = 1;
    B.locks_per_conn = 1;
    B.after = 2;
    snprintf(B.prefix, sizeof(B.prefix), "bench:%d", (int)getpid());
    while ((ch = getopt_long(argc, argv, "s:c:d:n:P:T:t:w:H:L:ph", opts, NULL)) != -1) {
        switch (ch) {
        case 's': B.server = optarg; break;
        case 'c': conns = (long)parse_num(optarg, "connection count", 1000000); break;
        case 'd': B.duration = parse_secs(optarg, "duration"); have_duration = true; break;
        case 'n': B.nops = parse_num(optarg, "op count", UINT64_MAX / 2); break;
        case 'P': pipeline = (long)parse_num(optarg, "pipeline depth", 4096); break;
        case 'T': B.tags = (unsigned)parse_num(optarg, "--tags", 1024); break;
        case 't': B.ttl = (unsigned)parse_num(optarg, "ttl", UINT32_MAX); break;
        case 'w': B.wait = (unsigned)parse_num(optarg, "wait", UINT32_MAX); break;
        case 'H': B.hold = parse_secs(optarg, "hold time"); break;
        case 'p': B.find_pid = true; break;
        case OPT_WINDOW: B.window = (unsigned)parse_num(optarg, "window", 65536); break;
        case 'L': B.locks_per_conn = (unsigned)parse_num(optarg, "locks per session", 4096); break;
        case OPT_AFTER: B.after = parse_secs(optarg, "--after"); break;
        case OPT_FIXED: B.fixed = true; break;
        case OPT_MULTI: B.multi = (unsigned)parse_num(optarg, "--multi", 256); break;
        case OPT_LOCK_OPTS:
            if (strlen(optarg) >= sizeof(B.lock_opts) || strpbrk(optarg, "\r\n"))
                die("bad --lock-opts: %s", optarg);
            snprintf(B.lock_opts, sizeof(B.lock_opts), "%s", optarg);
            break;
        case OPT_HOLD_MS: B.hold_ms = (unsigned)parse_num(optarg, "--hold-ms", 600000); break;
        case OPT_WATCH: {
            const char *eq = strchr(optarg, '=');
            char name[32];

            if (!eq || eq == optarg || (size_t)(eq - optarg) >= sizeof(name))
                die("bad --watch (want NAME=PID): %s", optarg);
            snprintf(name, sizeof(name), "%.*s", (int)(eq - optarg), optarg);
            watch_add(name, (pid_t)parse_num(eq + 1, "--watch pid", INT32_MAX));
            break;
        }
        case OPT_STRICT: B.strict = true; break;
        case OPT_TLS_CA: B.tls_ca = optarg; B.tls = true; break;
        case OPT_TLS_CERT: B.tls_cert = optarg; break;
        case OPT_TLS_KEY: B.tls_key = optarg; break;
        case OPT_PREFIX:
            if (strlen(optarg) == 0 || strlen(optarg) > 64 || strpbrk(optarg, " \t\r\n"))
                die("bad prefix: %s", optarg);
            snprintf(B.prefix, sizeof(B.prefix), "%s", optarg);
            break;
        case OPT_PID: B.pid = (pid_t)parse_num(optarg, "pid", INT32_MAX); break;
        case OPT_JSON: B.json = true; break;
        case OPT_JSON_FILE: B.json_file = optarg; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind + 1 != argc) {
        usage(stderr);
        exit(2);
    }
    {
        size_t m = 0, nmodes = sizeof(mode_names) / sizeof(mode_names[0]);

        while (m < nmodes && strcmp(argv[optind], mode_names[m]) != 0)
            m++;
        if (m == nmodes) {
            fprintf(stderr, "redlockd-bench: unknown mode '%s'\n", argv[optind]);
            usage(stderr);
            exit(2);
        }
        B.mode = (enum mode)m;
    }
    B.conns = conns > 0 ? (unsigned)conns : B.mode == MODE_IDLE ? 1000 : 50;
    B.pipeline = pipeline > 0 ? (unsigned)pipeline : B.mode == MODE_PING ? 16 : 1;
    if (B.window == 0)
        B.window = 1;
    if (B.multi == 0)
        B.multi = 1;
    if (B.locks_per_conn == 0)
        B.locks_per_conn = 1;
    if ((uint64_t)B.conns * B.locks_per_conn > UINT32_MAX / 2)
        die("too many locks in all");
    if (B.nops > 0 && !have_duration)
        B.duration = 300;
    parse_server(B.server);
    if (B.tls && B.sa.ss_family == AF_UNIX)
        die("TLS needs a HOST:PORT address, not a unix socket: %s", B.server);
    if ((B.tls_cert || B.tls_key) && !B.tls)
        die("--tls-cert and --tls-key need --tls-ca or a tls:// address");
    if (B.tls_key && !B.tls_cert)
        die("--tls-key needs --tls-cert");
    if (B.tags && B.mode != MODE_LOCK)
        die("--tags goes with the lock mode");
    if (B.tags && pipeline > 0)
        die("--tags and --pipeline do not go together");
}

int main(int argc, char **argv)
{
    struct sigaction sa = { .sa_handler = on_sigint };
    int rc;

    parse_args(argc, argv);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (B.find_pid && B.pid == 0) {
        B.pid = find_daemon_pid();
        if (B.pid == 0)
            warnx("-p: no process of ours listens on %s", B.server);
    }
    if (B.pid > 0) {
        bool named = false;

        for (unsigned i = 0; i < B.nwatch; i++)
            named = named || strcmp(B.w[i].name, "daemon") == 0;
        if (!named)
            watch_add("daemon", B.pid);
    }
    B.cs_holder = -1;
    if (B.tls)
        tls_init();
    raise_nofile(B.conns + 32);
    B.ep = epoll_create1(EPOLL_CLOEXEC);
    if (B.ep < 0)
        die("epoll_create1: %s", strerror(errno));
    B.c = calloc(B.conns, sizeof(*B.c));
    if (!B.c)
        die("out of memory");
    for (unsigned i = 0; i < B.conns; i++) {
        B.c[i].idx = i;
        B.c[i].fd = -1;
    }
    rc = B.mode == MODE_IDLE ? run_idle() : run_throughput();
    for (unsigned i = 0; i < B.started; i++) {
        conn_close(&B.c[i]);
        free(B.c[i].got);
    }
    free(B.c);
    close(B.ep);
    SSL_CTX_free(B.ssl_ctx);
    if (interrupted) {
        /* The partial results are out; now die of the signal, so that a
         * calling shell stops too instead of running its next command. */
        signal((int)interrupted, SIG_DFL);
        raise((int)interrupted);
    }
    return rc;
}
