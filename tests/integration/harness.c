/*
 * harness: real redis-server and redlockd processes for integration tests.
 *
 * Each process runs in its own mkdtemp directory on a free loopback port.
 * Tests run under check's fork mode, where a failed assertion _exit()s the
 * test process without running teardowns or atexit handlers, so cleanup
 * does not depend on the test getting that far:
 *   - every child gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the test;
 *   - every temp dir gets a small guardian process holding the read end of
 *     a pipe; if the test dies without saying goodbye, the pipe hits EOF and
 *     the guardian prints the daemon log (the only clue a failed CI run
 *     leaves) and removes the dir;
 *   - an atexit handler and the *_cleanup functions cover normal exits.
 * Bookkeeping records the owning pid, so a forked test never kills or
 * removes what its parent started.
 */
#include "harness.h"

/* The tests' default shutdown_timeout_ms (the daemon's is 5000). */
#define H_SHUTDOWN_TIMEOUT_MS 1000

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define H_MAX_PROCS 64
#define H_MAX_ARGS 64

/* A started child: killed by the atexit handler if still registered. */
struct h_proc {
    pid_t pid;
    pid_t owner;
};

/* A temp dir and the guardian that removes it if the owner dies. */
struct h_guard {
    pid_t pid;
    pid_t owner;
    int fd;                 /* write end; a byte on it means "all is well" */
    char dir[256];
};

static struct h_proc procs[H_MAX_PROCS];
static struct h_guard guards[H_MAX_PROCS];
static bool atexit_done;

static void h_atexit(void);

/* ---- small utilities ---- */

uint64_t h_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int64_t h_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void h_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static uint64_t rng_state;

uint64_t h_seed(const char *env)
{
    const char *s = getenv(env);
    uint64_t seed;

    if (s != NULL && *s != '\0') {
        char *end;

        errno = 0;
        seed = strtoull(s, &end, 0);
        ck_assert_msg(errno == 0 && *end == '\0', "%s is not a number: %s",
                      env, s);
    } else if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        seed = (uint64_t)h_now_us() ^ ((uint64_t)getpid() << 32);
    }
    rng_state = seed;
    return seed;
}

uint64_t h_rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int h_rng_range(int lo, int hi)
{
    return lo + (int)(h_rng_next() % (uint64_t)(hi - lo + 1));
}

long long h_since(uint64_t t0)
{
    return (long long)(h_now_ms() - t0);
}

bool h_slow(void)
{
    const char *w = getenv("REDLOCKD_TEST_WRAPPER");

    return w && *w != '\0';
}

/* The daemon's redis.command_timeout_ms under valgrind, unless a test sets
 * its own (the default is 100). */
#define H_SLOW_COMMAND_TIMEOUT_MS 400

/* Built with AddressSanitizer (the daemon beside us then is too): a few
 * times slower, and a test's own command timeout below the floor above
 * (slow_command_floor) saw healthy nodes time out on a loaded machine. */
#if defined(__SANITIZE_ADDRESS__)
#define H_SANITIZED true
#else
#define H_SANITIZED false
#endif

/* Valgrind makes the daemon an order of magnitude slower; stretch waits. */
int h_scale(int ms)
{
    return h_slow() ? ms * 5 : ms;
}

bool h_starts(const char *line, const char *prefix)
{
    return line && strncmp(line, prefix, strlen(prefix)) == 0;
}

bool h_holds_token(const char *value, const char *token)
{
    size_t n = strlen(token);

    return value && strncmp(value, token, n) == 0 &&
           (value[n] == ' ' || value[n] == '\0');
}

const char *h_kv(const char *line, const char *key)
{
    static char value[4096];
    size_t klen = strlen(key);
    const char *p = line;

    while (p && *p != '\0') {
        size_t wlen = strcspn(p, " \t");

        if (wlen > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t vlen = wlen - klen - 1;

            if (vlen >= sizeof(value))
                vlen = sizeof(value) - 1;
            memcpy(value, p + klen + 1, vlen);
            value[vlen] = '\0';
            return value;
        }
        p += wlen;
        p += strspn(p, " \t");
    }
    return NULL;
}

/* Split `s` on blanks into argv[*n...]; no quoting (test args need none). */
static void split_words(char *s, char **argv, int *n, int max)
{
    for (char *w = strtok(s, " \t"); w != NULL; w = strtok(NULL, " \t")) {
        if (*n >= max - 1)
            ck_abort_msg("harness: too many arguments");
        argv[(*n)++] = w;
    }
    argv[*n] = NULL;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *dir)
{
    if (dir[0] != '\0')
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_tmpdir(char *out, size_t size, const char *tag)
{
    const char *tmp = getenv("TMPDIR");

    /* The daemon's unix socket lives in here: keep sun_path (108) happy. */
    if (!tmp || *tmp == '\0' || strlen(tmp) > 60)
        tmp = "/tmp";
    snprintf(out, size, "%s/redlockd-%s.XXXXXX", tmp, tag);
    if (!mkdtemp(out))
        ck_abort_msg("harness: mkdtemp %s: %s", out, strerror(errno));
}

/* Close every descriptor above 2 except `keep`: children must not hold
 * test sockets open, or the daemon would never see a client's EOF. */
static void close_fds_except(int keep)
{
    long max;

    if (keep < 3 && close_range(3, ~0U, 0) == 0)
        return;
    if (keep == 3 && close_range(4, ~0U, 0) == 0)
        return;
    if (keep > 3 && close_range(3, (unsigned)keep - 1, 0) == 0 &&
        close_range((unsigned)keep + 1, ~0U, 0) == 0)
        return;
    /* Kernels before 5.9 lack close_range. */
    max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 1 << 20)
        max = 1 << 20;
    for (int fd = 3; fd < max; fd++) {
        if (fd != keep)
            close(fd);
    }
}

static void dump_file(const char *path, const char *title)
{
    char buf[4096];
    size_t n;
    FILE *f = fopen(path, "r");

    fprintf(stderr, "---- %s (%s) ----\n", title, path);
    if (f) {
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
            fwrite(buf, 1, n, stderr);
        fclose(f);
    }
    fprintf(stderr, "---- end of %s ----\n", title);
}

/* ---- process bookkeeping ---- */

static void proc_register(pid_t pid)
{
    if (!atexit_done) {
        atexit(h_atexit);
        atexit_done = true;
    }
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (procs[i].pid == 0) {
            procs[i].pid = pid;
            procs[i].owner = getpid();
            return;
        }
    }
    kill(pid, SIGKILL);
    ck_abort_msg("harness: more than %d processes", H_MAX_PROCS);
}

static void proc_forget(pid_t pid)
{
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (procs[i].pid == pid)
            procs[i].pid = 0;
    }
}

/* waitpid with a deadline; returns true and the status once `pid` exited. */
static bool wait_exit(pid_t pid, int timeout_ms, int *status)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);

        if (r == pid || (r < 0 && errno == ECHILD))
            return true;
        if (h_now_ms() >= end)
            return false;
        h_sleep_ms(5);
    }
}

static void kill_wait(pid_t pid)
{
    int status;

    kill(pid, SIGKILL);
    wait_exit(pid, 10000, &status);
    proc_forget(pid);
}

/* SIGKILL and reap *pid if it runs, and mark it not running. */
static void kill_reap(pid_t *pid)
{
    if (*pid == 0)
        return;
    kill_wait(*pid);
    *pid = 0;
}

/* An exit status as h_daemon_stop and h_run report it. */
static int exit_code(int status)
{
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* pipe2(O_CLOEXEC) into fds, then fork(): both the guardian and h_run talk
 * to their child over a pipe. Returns fork's result. */
static pid_t fork_with_pipe(int fds[2])
{
    pid_t pid;

    if (pipe2(fds, O_CLOEXEC) < 0)
        ck_abort_msg("harness: pipe: %s", strerror(errno));
    pid = fork();
    if (pid < 0)
        ck_abort_msg("harness: fork: %s", strerror(errno));
    return pid;
}

/* The guardian: wait for a goodbye byte or for EOF (owner died). */
static void guard_main(int fd, const char *dir, const char *log)
{
    char b;
    ssize_t n;

    /* check SIGKILLs the failed test's process group: step out of it. */
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    /* stderr may be a pipe nobody reads any more; still remove the dir. */
    signal(SIGPIPE, SIG_IGN);
    close_fds_except(fd);
    do {
        n = read(fd, &b, 1);
    } while (n < 0 && errno == EINTR);
    if (n == 1)
        _exit(0);
    /* Give the PDEATHSIG'd children a moment to die and flush. */
    h_sleep_ms(200);
    if (log && access(log, R_OK) == 0)
        dump_file(log, "redlockd log of a test that died");
    rm_rf(dir);
    _exit(0);
}

static void guard_start(const char *dir, const char *log)
{
    int fds[2];
    pid_t pid = fork_with_pipe(fds);

    if (pid == 0)
        guard_main(fds[0], dir, log);
    close(fds[0]);
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (guards[i].pid == 0) {
            guards[i].pid = pid;
            guards[i].owner = getpid();
            guards[i].fd = fds[1];
            snprintf(guards[i].dir, sizeof(guards[i].dir), "%s", dir);
            return;
        }
    }
    ck_abort_msg("harness: more than %d temp dirs", H_MAX_PROCS);
}

/* Remove `dir` and dismiss its guardian (only the owner does this). */
static void guard_end(const char *dir)
{
    int status;

    /* Never made, or removed already: cleanup may run more than once. */
    if (dir[0] == '\0')
        return;
    for (int i = 0; i < H_MAX_PROCS; i++) {
        struct h_guard *g = &guards[i];

        if (g->pid == 0 || g->owner != getpid() || strcmp(g->dir, dir) != 0)
            continue;
        rm_rf(g->dir);
        if (write(g->fd, "x", 1) < 0) {
            /* The guardian is gone already; nothing left to tell. */
        }
        close(g->fd);
        wait_exit(g->pid, 2000, &status);
        g->pid = 0;
    }
}

static void h_atexit(void)
{
    pid_t me = getpid();

    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (procs[i].pid != 0 && procs[i].owner == me)
            kill_wait(procs[i].pid);
    }
    for (int i = 0; i < H_MAX_PROCS; i++) {
        if (guards[i].pid != 0 && guards[i].owner == me)
            guard_end(guards[i].dir);
    }
}

/* fork + exec argv with stdout/stderr appended to `log`. The child dies
 * with the test process (PDEATHSIG) even if nobody cleans up. */
static pid_t spawn(char **argv, const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();

    if (pid < 0)
        ck_abort_msg("harness: fork: %s", strerror(errno));
    if (pid == 0) {
        int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int in = open("/dev/null", O_RDONLY);

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent || out < 0 || in < 0)
            _exit(127);
        dup2(in, 0);
        dup2(out, 1);
        dup2(out, 2);
        close_fds_except(-1);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "harness: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    proc_register(pid);
    return pid;
}

/* ---- ports ---- */

static bool port_bindable(int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok;

    if (fd < 0)
        return false;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

/* Ports below the kernel's ephemeral range (32768+ by default), so the
 * hundreds of outgoing test connections never sit on a port we hand out;
 * random, so parallel test programs rarely pick the same one. Callers
 * retry on the remaining race. */
int h_free_port(void)
{
    static bool seeded;

    if (!seeded) {
        /* Not getpid() ^ time: test programs started side by side have
         * pids one apart and clocks one ms apart, and would pick the same
         * ports. */
        unsigned seed = (unsigned)getpid() ^ (unsigned)h_now_ms();
        if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
            seed ^= (unsigned)h_now_ms() << 16;
        srandom(seed);
        seeded = true;
    }
    for (int i = 0; i < 200; i++) {
        int port = 20000 + (int)(random() % 12000);

        if (port_bindable(port))
            return port;
    }
    ck_abort_msg("harness: no free port in 20000-31999");
    return -1;
}

int h_refusing_port(int *port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&sa, &len) == 0,
                  "bind: %s", strerror(errno));
    *port = ntohs(sa.sin_port);
    return fd;
}

/* True once something on 127.0.0.1 is in LISTEN state on `port`. Reading
 * /proc/net/tcp instead of connecting keeps readiness probes from taking
 * a client slot (tests of max_clients count them). */
static bool port_listening(int port)
{
    char line[512];
    bool found = false;
    FILE *f = fopen("/proc/net/tcp", "r");

    if (!f)
        return !port_bindable(port);
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned addr, lport, state;

        if (sscanf(line, " %*d: %x:%x %*x:%*x %x", &addr, &lport, &state) == 3)
            found = (int)lport == port && state == 0x0A;
    }
    fclose(f);
    return found;
}

/* Is a socket listening on the unix path? (/proc/net/unix: the file
 * exists from bind on, but connecting works only after listen.) */
static bool unix_listening(const char *path)
{
    char line[1024], sock_path[512];
    bool found = false;
    FILE *f = fopen("/proc/net/unix", "r");

    if (!f)
        return true;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned flags;

        if (sscanf(line, "%*s %*x %*x %x %*x %*x %*u %511s", &flags,
                   sock_path) == 2)
            found = (flags & 0x10000) && strcmp(sock_path, path) == 0;
    }
    fclose(f);
    return found;
}

/* ---- redis ---- */

/* True once the redis-server with process id `pid` answers on `port`
 * (not another program's node that happens to hold the port). */
static bool redis_ping(int port, pid_t pid)
{
    struct timeval tv = { 0, 300000 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *reply = NULL;
    bool ok = false;

    if (c && c->err == 0) {
        char want[32];
        snprintf(want, sizeof(want), "process_id:%ld\r", (long)pid);
        redisSetTimeout(c, tv);
        reply = redisCommand(c, "INFO server");
        ok = reply && reply->type == REDIS_REPLY_STRING &&
             strstr(reply->str, want);
    }
    if (reply)
        freeReplyObject(reply);
    if (c)
        redisFree(c);
    return ok;
}

static pid_t redis_spawn(struct h_redis *r)
{
    char *argv[H_MAX_ARGS];
    char port[16], log[300], extra[sizeof(r->extra)];
    int n = 0;

    snprintf(port, sizeof(port), "%d", r->port);
    snprintf(log, sizeof(log), "%s/redis.log", r->dir);
    snprintf(extra, sizeof(extra), "%s", r->extra);
    argv[n++] = "redis-server";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    argv[n++] = "--logfile";
    argv[n++] = log;
    split_words(extra, argv, &n, H_MAX_ARGS);
    return spawn(argv, log);
}

/* Start and wait for PING; false if the process exited (port race). */
static bool redis_launch(struct h_redis *r, int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;
    int status;

    r->pid = redis_spawn(r);
    while (h_now_ms() < end) {
        if (redis_ping(r->port, r->pid))
            return true;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            proc_forget(r->pid);
            r->pid = 0;
            return false;
        }
        h_sleep_ms(10);
    }
    kill_wait(r->pid);
    r->pid = 0;
    return false;
}

static void redis_fail(const struct h_redis *r, const char *what)
{
    char log[300];

    snprintf(log, sizeof(log), "%s/redis.log", r->dir);
    dump_file(log, "redis-server log");
    ck_abort_msg("harness: redis-server %s on port %d failed", what, r->port);
}

void h_redis_start(struct h_redis *r, const char *extra)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->extra, sizeof(r->extra), "%s", extra ? extra : "");
    make_tmpdir(r->dir, sizeof(r->dir), "redis");
    guard_start(r->dir, NULL);
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = h_free_port();
        if (redis_launch(r, h_scale(5000)))
            return;
    }
    redis_fail(r, "start");
}

void h_redis_restart(struct h_redis *r)
{
    if (r->pid != 0)
        h_redis_stop(r);
    /* Loading a big append-only file can take a while. */
    if (!redis_launch(r, h_scale(15000)))
        redis_fail(r, "restart");
}

void h_redis_stop(struct h_redis *r)
{
    int status;

    if (r->pid == 0)
        return;
    /* A stopped (paused) process keeps SIGTERM pending forever. */
    kill(r->pid, SIGCONT);
    kill(r->pid, SIGTERM);
    if (!wait_exit(r->pid, 10000, &status))
        kill_wait(r->pid);
    proc_forget(r->pid);
    r->pid = 0;
}

void h_redis_kill(struct h_redis *r)
{
    kill_reap(&r->pid);
}

void h_redis_pause(struct h_redis *r)
{
    if (r->pid != 0)
        kill(r->pid, SIGSTOP);
}

void h_redis_resume(struct h_redis *r)
{
    if (r->pid != 0)
        kill(r->pid, SIGCONT);
}

void h_redis_cleanup(struct h_redis *r)
{
    kill_reap(&r->pid);
    guard_end(r->dir);
    r->dir[0] = '\0';
}

static redisContext *redis_connect(const struct h_redis *r)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);

    if (c && c->err == 0)
        redisSetTimeout(c, tv);
    return c;
}

redisContext *h_redis_connect(const struct h_redis *r)
{
    redisContext *c = redis_connect(r);

    if (!c || c->err != 0)
        ck_abort_msg("harness: connect to redis port %d: %s", r->port,
                     c ? c->errstr : "out of memory");
    return c;
}

/* Interpret one reply as h_redis_cmd documents it. */
static long long reply_value(const redisReply *reply, char **str)
{
    switch (reply->type) {
    case REDIS_REPLY_INTEGER:
        return reply->integer;
    case REDIS_REPLY_NIL:
        return -2;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
        if (str)
            *str = strdup(reply->str);
        return 0;
    case REDIS_REPLY_ERROR:
        if (str)
            *str = strdup(reply->str);
        return -3;
    default:
        return (long long)reply->elements;
    }
}

/* Returns -3 also when the node cannot be reached (it may be stopped on
 * purpose); *str then holds hiredis's message. Arrays give their size. */
long long h_redis_cmd(const struct h_redis *r, char **str, const char *fmt, ...)
{
    redisContext *c = redis_connect(r);
    redisReply *reply = NULL;
    long long v;
    va_list ap;

    if (str)
        *str = NULL;
    if (c && c->err == 0) {
        va_start(ap, fmt);
        reply = redisvCommand(c, fmt, ap);
        va_end(ap);
    }
    if (!reply) {
        if (str)
            *str = strdup(c ? c->errstr : "out of memory");
        v = -3;
    } else {
        v = reply_value(reply, str);
        freeReplyObject(reply);
    }
    if (c)
        redisFree(c);
    return v;
}

/* ---- redlockd ---- */

/* ---- certificates for the TLS tests ---------------------------------------- */

static char h_certs[256];

void h_certs_make(void)
{
    const char *src = getenv("REDLOCKD_SRCDIR");
    char cmd[1024];

    if (!src) {
        fprintf(stderr, "harness: REDLOCKD_SRCDIR is not set (run the "
                "tests through meson)\n");
        exit(1);
    }
    snprintf(h_certs, sizeof(h_certs), "%s/redlockd-certs.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(h_certs)) {
        perror("harness: mkdtemp for the certificates");
        exit(1);
    }
    snprintf(cmd, sizeof(cmd), "'%s/tests/tools/mkcerts.sh' '%s'", src,
             h_certs);
    if (system(cmd) != 0) {
        fprintf(stderr, "harness: %s failed\n", cmd);
        h_certs_remove();
        exit(1);
    }
}

const char *h_certs_dir(void)
{
    return h_certs;
}

const char *h_cert(const char *name)
{
    static char paths[8][320];
    static int next;
    char *p = paths[next++ % 8];

    snprintf(p, sizeof(paths[0]), "%s/%s", h_certs, name);
    return p;
}

void h_certs_remove(void)
{
    char cmd[300];

    if (!h_certs[0])
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", h_certs);
    if (system(cmd) != 0)
        fprintf(stderr, "harness: could not remove %s\n", h_certs);
    h_certs[0] = '\0';
}

const char *h_daemon_bin(void)
{
    const char *bin = getenv("REDLOCKD_BIN");

    if (!bin || *bin == '\0')
        ck_abort_msg("harness: REDLOCKD_BIN is not set (run via meson test)");
    return bin;
}

/* Under valgrind, and on a loaded machine under AddressSanitizer, a test's
 * own short command timeout (100 ms, to see a stopped node go down
 * quickly) is shorter than the daemon's own stalls, and healthy nodes then
 * time out at random: such a test gets the slow floor instead. Its waits
 * are h_scale()d under valgrind, and under ASan long enough as they are
 * (the fault suite passes with the floor). */
static void slow_command_floor(json_t *conf)
{
    json_t *redis = json_object_get(conf, "redis");
    json_t *v = json_object_get(redis, "command_timeout_ms");

    if ((h_slow() || H_SANITIZED) && json_is_integer(v) &&
        json_integer_value(v) < H_SLOW_COMMAND_TIMEOUT_MS)
        json_object_set_new(redis, "command_timeout_ms",
                            json_integer(H_SLOW_COMMAND_TIMEOUT_MS));
}

/* A config with a certificate and no tls:// address listens on one. */
static void listen_tls(json_t *conf, struct h_daemon *d)
{
    json_t *list = json_object_get(conf, "listen"), *v;
    size_t i;

    d->tls_port = 0;
    if (!json_object_get(json_object_get(conf, "tls"), "cert_file"))
        return;
    json_array_foreach(list, i, v) {
        if (h_starts(json_string_value(v) ? json_string_value(v) : "",
                     "tls://"))
            return;
    }
    d->tls_port = h_free_port();
    json_array_append_new(list, json_sprintf("tls://127.0.0.1:%d",
                                             d->tls_port));
}

static json_t *daemon_config(struct h_daemon *d, const int *ports,
                             int nports, const char *extra_json)
{
    char tcp[64], unix_addr[310];
    json_t *conf, *extra, *list = json_array();
    json_error_t err;

    for (int i = 0; i < nports; i++)
        json_array_append_new(list, json_sprintf("127.0.0.1:%d", ports[i]));
    snprintf(tcp, sizeof(tcp), "tcp://127.0.0.1:%d", d->port);
    snprintf(unix_addr, sizeof(unix_addr), "unix:%s", d->sock_path);
    /* A stop under held leases waits shutdown_timeout_ms for their
     * clients to release them; tests keep that short unless they set it. */
    conf = json_pack("{s:[s,s], s:{s:o}, s:{s:s}, s:i}",
                     "listen", tcp, unix_addr,
                     "redis", "nodes", list,
                     "log", "level", "debug",
                     "shutdown_timeout_ms", H_SHUTDOWN_TIMEOUT_MS);
    if (!conf)
        ck_abort_msg("harness: json_pack failed");
    /* Under valgrind the daemon's own loop can stall past the default
     * 100 ms for a node's answer, and a test not about timeouts then sees
     * a healthy node go down (see slow_command_floor for tests that set a
     * shorter one). */
    if (h_slow())
        json_object_set_new(json_object_get(conf, "redis"),
                            "command_timeout_ms",
                            json_integer(H_SLOW_COMMAND_TIMEOUT_MS));
    if (!extra_json)
        return conf;
    extra = json_loads(extra_json, 0, &err);
    if (!json_is_object(extra))
        ck_abort_msg("harness: extra_json is not a JSON object: %s (%s)",
                     err.text, extra_json);
    json_object_update_recursive(conf, extra);
    json_decref(extra);
    slow_command_floor(conf);
    listen_tls(conf, d);
    return conf;
}

/* Which of our own listen addresses the (merged) config still has. */
static void listen_wanted(json_t *conf, const struct h_daemon *d,
                          bool *tcp, bool *unix_sock)
{
    char tcp_addr[64];
    size_t i;
    json_t *v;

    snprintf(tcp_addr, sizeof(tcp_addr), "tcp://127.0.0.1:%d", d->port);
    *tcp = *unix_sock = false;
    json_array_foreach(json_object_get(conf, "listen"), i, v) {
        const char *s = json_string_value(v);

        if (s && strcmp(s, tcp_addr) == 0)
            *tcp = true;
        if (s && h_starts(s, "unix:") && strcmp(s + 5, d->sock_path) == 0)
            *unix_sock = true;
    }
}

static pid_t daemon_spawn(const struct h_daemon *d)
{
    char *argv[H_MAX_ARGS];
    char wrapper[512];
    int n = 0;
    const char *w = getenv("REDLOCKD_TEST_WRAPPER");

    snprintf(wrapper, sizeof(wrapper), "%s", w ? w : "");
    split_words(wrapper, argv, &n, H_MAX_ARGS - 4);
    argv[n++] = (char *)h_daemon_bin();
    argv[n++] = "-c";
    argv[n++] = (char *)d->conf_path;
    argv[n] = NULL;
    return spawn(argv, d->log_path);
}

static bool log_mentions(const char *path, const char *needle)
{
    char buf[65536];
    size_t n;
    FILE *f = fopen(path, "r");

    if (!f)
        return false;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcasestr(buf, needle);
}

/* Wait until the listeners exist. 1 = ready, 0 = exited, -1 = timeout. */
static int daemon_wait_ready(struct h_daemon *d, bool tcp, bool unix_sock)
{
    uint64_t end = h_now_ms() + (uint64_t)h_scale(6000);
    struct stat st;
    int status;

    while (h_now_ms() < end) {
        bool ok_tcp = !tcp || port_listening(d->port);
        bool ok_unix = !unix_sock ||
                       (stat(d->sock_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
                        unix_listening(d->sock_path));

        if (ok_tcp && ok_unix)
            return 1;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            proc_forget(d->pid);
            d->pid = 0;
            return 0;
        }
        h_sleep_ms(10);
    }
    return -1;
}

/* daemon_wait_ready's verdict: on anything but 1, kill what is left, show
 * the log and fail the test. */
static void daemon_assert_ready(struct h_daemon *d, int ready,
                                const char *what)
{
    if (ready == 1)
        return;
    if (d->pid != 0)
        kill_wait(d->pid);
    d->pid = 0;
    h_daemon_dump_log(d);
    ck_abort_msg("harness: redlockd did not %s (%s)", what,
                 ready == 0 ? "it exited" : "timeout");
}

static void daemon_paths(struct h_daemon *d)
{
    snprintf(d->conf_path, sizeof(d->conf_path), "%s/redlockd.json", d->dir);
    snprintf(d->sock_path, sizeof(d->sock_path), "%s/redlockd.sock", d->dir);
    snprintf(d->log_path, sizeof(d->log_path), "%s/redlockd.log", d->dir);
}

void h_daemon_start(struct h_daemon *d, struct h_redis *nodes, int nnodes,
                    const char *extra_json)
{
    int *ports = calloc(nnodes > 0 ? (size_t)nnodes : 1, sizeof(*ports));

    if (!ports)
        ck_abort_msg("harness: out of memory");
    for (int i = 0; i < nnodes; i++)
        ports[i] = nodes[i].port;
    h_daemon_start_ports(d, ports, nnodes, extra_json);
    free(ports);
}

void h_daemon_start_ports(struct h_daemon *d, const int *ports, int nports,
                          const char *extra_json)
{
    int ready = 0;

    (void)h_daemon_bin();   /* fail before creating anything */
    memset(d, 0, sizeof(*d));
    make_tmpdir(d->dir, sizeof(d->dir), "daemon");
    daemon_paths(d);
    guard_start(d->dir, d->log_path);
    /* Retry only the race where another test took our port meanwhile. */
    for (int attempt = 0; attempt < 3 && ready == 0; attempt++) {
        bool tcp, unix_sock;
        json_t *conf;

        if (attempt > 0 && !log_mentions(d->log_path, "in use"))
            break;
        d->port = h_free_port();
        conf = daemon_config(d, ports, nports, extra_json);
        listen_wanted(conf, d, &tcp, &unix_sock);
        if (json_dump_file(conf, d->conf_path, JSON_INDENT(2)) != 0)
            ck_abort_msg("harness: cannot write %s", d->conf_path);
        json_decref(conf);
        d->pid = daemon_spawn(d);
        ready = daemon_wait_ready(d, tcp, unix_sock);
    }
    daemon_assert_ready(d, ready, "start");
}

void h_daemon_restart(struct h_daemon *d)
{
    json_error_t err;
    json_t *conf = json_load_file(d->conf_path, 0, &err);
    bool tcp, unix_sock;
    int ready;

    if (d->pid != 0)
        ck_abort_msg("harness: h_daemon_restart: redlockd is running");
    if (!conf)
        ck_abort_msg("harness: %s: %s", d->conf_path, err.text);
    listen_wanted(conf, d, &tcp, &unix_sock);
    json_decref(conf);
    d->pid = daemon_spawn(d);
    ready = daemon_wait_ready(d, tcp, unix_sock);
    daemon_assert_ready(d, ready, "start again");
}

int h_daemon_stop(struct h_daemon *d)
{
    int status = 0;

    if (d->pid == 0)
        ck_abort_msg("harness: h_daemon_stop: redlockd is not running");
    kill(d->pid, SIGTERM);
    if (!wait_exit(d->pid, h_scale(10000), &status)) {
        kill_wait(d->pid);
        d->pid = 0;
        h_daemon_dump_log(d);
        ck_abort_msg("harness: redlockd did not exit within 10 s of SIGTERM");
    }
    proc_forget(d->pid);
    d->pid = 0;
    return exit_code(status);
}

int h_daemon_wait(struct h_daemon *d, int timeout_ms)
{
    int status = 0;

    if (d->pid == 0)
        ck_abort_msg("harness: h_daemon_wait: redlockd is not running");
    if (!wait_exit(d->pid, h_scale(timeout_ms), &status)) {
        kill_wait(d->pid);
        d->pid = 0;
        h_daemon_dump_log(d);
        ck_abort_msg("harness: redlockd did not exit within %d ms",
                     timeout_ms);
    }
    proc_forget(d->pid);
    d->pid = 0;
    return exit_code(status);
}

void h_daemon_kill(struct h_daemon *d)
{
    kill_reap(&d->pid);
}

void h_daemon_cleanup(struct h_daemon *d)
{
    kill_reap(&d->pid);
    guard_end(d->dir);
    d->dir[0] = '\0';
}

const char *h_daemon_log(const struct h_daemon *d)
{
    static char buf[1 << 20];
    size_t n = 0;
    FILE *f = fopen(d->log_path, "r");

    if (f) {
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

bool h_log_waits_for(const struct h_daemon *d, const char *needle,
                     int timeout_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        if (strstr(h_daemon_log(d), needle))
            return true;
        if (h_now_ms() >= end)
            return false;
        h_sleep_ms(20);
    }
}

void h_daemon_dump_log(const struct h_daemon *d)
{
    dump_file(d->log_path, "redlockd log");
}

int h_run(char *const argv[], char *out, size_t outsize)
{
    int fds[2], status;
    size_t len = 0;
    ssize_t n;
    pid_t pid;

    pid = fork_with_pipe(fds);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close_fds_except(-1);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    while ((n = read(fds[0], out + len, outsize - 1 - len)) > 0 ||
           (n < 0 && errno == EINTR))
        len += n > 0 ? (size_t)n : 0;
    out[len] = '\0';
    close(fds[0]);
    waitpid(pid, &status, 0);
    return exit_code(status);
}

/* ---- clients ---- */

static void client_init(struct h_client *c, int fd)
{
    /* Only the header fields: the buffers are large and filled lazily. */
    c->fd = fd;
    c->len = 0;
    c->line[0] = '\0';
    c->events[0] = '\0';
    c->events_len = 0;
}

static int client_connect(struct h_client *c, int domain,
                          const struct sockaddr *sa, socklen_t salen)
{
    struct timeval tv = { 5, 0 };
    int fd = socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);

    client_init(c, -1);
    if (fd < 0)
        return -errno;
    /* A daemon that stops reading must fail the test, not hang it. */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, sa, salen) < 0) {
        int e = errno;

        close(fd);
        return -e;
    }
    c->fd = fd;
    return 0;
}

int h_connect_tcp(struct h_client *c, int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };

    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return client_connect(c, AF_INET, (struct sockaddr *)&sa, sizeof(sa));
}

int h_connect_unix(struct h_client *c, const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    return client_connect(c, AF_UNIX, (struct sockaddr *)&sa, sizeof(sa));
}

void h_close(struct h_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = 0;
}

void h_reset(struct h_client *c)
{
    struct linger lg = { .l_onoff = 1, .l_linger = 0 };

    if (c->fd >= 0 && setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg,
                                 sizeof(lg)) < 0)
        ck_abort_msg("harness: SO_LINGER: %s", strerror(errno));
    h_close(c);
}

void h_shutdown_write(struct h_client *c)
{
    if (c->fd >= 0 && shutdown(c->fd, SHUT_WR) < 0)
        ck_abort_msg("harness: shutdown: %s", strerror(errno));
}

/* A peer that already closed is not an error here: the next read shows
 * the EOF, which is what such tests look for. */
void h_send(struct h_client *c, const char *data, size_t len)
{
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(c->fd, data + off, len - off, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            return;
        if (n < 0)
            ck_abort_msg("harness: send: %s", strerror(errno));
        off += (size_t)n;
    }
}

static char *vformat(const char *fmt, va_list ap, const char *suffix)
{
    char *s = NULL, *line;

    if (vasprintf(&s, fmt, ap) < 0)
        ck_abort_msg("harness: out of memory");
    line = malloc(strlen(s) + strlen(suffix) + 1);
    if (!line)
        ck_abort_msg("harness: out of memory");
    strcpy(line, s);
    strcat(line, suffix);
    free(s);
    return line;
}

void h_sendf(struct h_client *c, const char *fmt, ...)
{
    va_list ap;
    char *s;

    va_start(ap, fmt);
    s = vformat(fmt, ap, "");
    va_end(ap);
    h_send(c, s, strlen(s));
    free(s);
}

/* Why the last client_fill returned no data, for failure messages. */
static char fill_why[128];

/* Read more bytes into c->buf. 1 = got some, 0 = EOF, -1 = timeout. */
static int client_fill(struct h_client *c, uint64_t deadline)
{
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    ssize_t n;
    int r;

    if (c->fd < 0) {
        snprintf(fill_why, sizeof(fill_why), "connection already closed");
        return 0;
    }
    if (c->len >= sizeof(c->buf) - 1)
        ck_abort_msg("harness: reply line longer than %zu bytes", sizeof(c->buf));
    do {
        uint64_t now = h_now_ms();

        r = now >= deadline ? 0 : poll(&p, 1, (int)(deadline - now));
    } while (r < 0 && errno == EINTR);
    if (r <= 0) {
        snprintf(fill_why, sizeof(fill_why), "%s",
                 r == 0 ? "timeout" : strerror(errno));
        return -1;
    }
    do {
        n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        /* EOF and a reset are alike to tests; the message tells them apart. */
        snprintf(fill_why, sizeof(fill_why), "%s",
                 n == 0 ? "EOF" : strerror(errno));
        return 0;
    }
    c->len += (size_t)n;
    return 1;
}

/* Move the line at buf[off..off+len) (LF at off+len) into c->line. */
static char *take_line(struct h_client *c, size_t off, size_t len)
{
    memcpy(c->line, c->buf + off, len);
    c->line[len] = '\0';
    memmove(c->buf + off, c->buf + off + len + 1, c->len - off - len - 1);
    c->len -= len + 1;
    return c->line;
}

static char *recv_line_until(struct h_client *c, uint64_t deadline)
{
    for (;;) {
        char *lf = memchr(c->buf, '\n', c->len);

        if (lf)
            return take_line(c, 0, (size_t)(lf - c->buf));
        if (client_fill(c, deadline) <= 0)
            return NULL;
    }
}

char *h_recv_line(struct h_client *c, int timeout_ms)
{
    return recv_line_until(c, h_now_ms() + (uint64_t)h_scale(timeout_ms));
}

static void note_event(struct h_client *c, const char *line)
{
    size_t n = strlen(line);

    if (c->events_len + n + 2 > sizeof(c->events))
        ck_abort_msg("harness: too many unread EVENT lines");
    memcpy(c->events + c->events_len, line, n);
    c->events_len += n;
    c->events[c->events_len++] = '\n';
    c->events[c->events_len] = '\0';
}

char *h_cmd(struct h_client *c, const char *fmt, ...)
{
    uint64_t deadline = h_now_ms() + (uint64_t)h_scale(5000);
    va_list ap;
    char *req;

    va_start(ap, fmt);
    req = vformat(fmt, ap, "\n");
    va_end(ap);
    h_send(c, req, strlen(req));
    for (;;) {
        char *line = recv_line_until(c, deadline);

        if (!line) {
            req[strcspn(req, "\n")] = '\0';
            ck_abort_msg("no reply to \"%.200s\" within %d ms: %s", req,
                         h_scale(5000), fill_why);
        }
        if (!h_starts(line, "EVENT ")) {
            free(req);
            return line;
        }
        note_event(c, line);
    }
}

bool h_wait_eof(struct h_client *c, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)h_scale(timeout_ms);

    for (;;) {
        int r;

        c->len = 0;
        r = client_fill(c, deadline);
        if (r == 0)
            return true;
        if (r < 0)
            return false;
    }
}

/* Take a remembered event line starting with `prefix` out of c->events. */
static char *take_event(struct h_client *c, const char *prefix)
{
    char *p = c->events;

    while (p < c->events + c->events_len) {
        char *lf = strchr(p, '\n');
        size_t n = (size_t)(lf - p);

        if (h_starts(p, prefix)) {
            memcpy(c->line, p, n);
            c->line[n] = '\0';
            memmove(p, lf + 1, (size_t)(c->events + c->events_len - lf));
            c->events_len -= n + 1;
            return c->line;
        }
        p = lf + 1;
    }
    return NULL;
}

/* Find a complete buffered line starting with `prefix`; other lines stay
 * where they are, so replies are not lost to an event wait. */
static char *take_buffered(struct h_client *c, const char *prefix)
{
    size_t off = 0;

    while (off < c->len) {
        char *lf = memchr(c->buf + off, '\n', c->len - off);
        size_t n;

        if (!lf)
            return NULL;
        n = (size_t)(lf - (c->buf + off));
        if (n >= strlen(prefix) && memcmp(c->buf + off, prefix, strlen(prefix)) == 0)
            return take_line(c, off, n);
        off += n + 1;
    }
    return NULL;
}

char *h_expect_event(struct h_client *c, const char *prefix, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)h_scale(timeout_ms);
    char *line = take_event(c, prefix);

    while (!line) {
        line = take_buffered(c, prefix);
        if (!line && client_fill(c, deadline) <= 0)
            return NULL;
    }
    return line;
}

void h_raise_nofile(int want)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        ck_abort_msg("harness: getrlimit: %s", strerror(errno));
    if (rl.rlim_cur >= (rlim_t)want)
        return;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (rlim_t)want)
        ck_abort_msg("harness: need %d open files, hard limit is %llu", want,
                     (unsigned long long)rl.rlim_max);
    rl.rlim_cur = (rlim_t)want;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        ck_abort_msg("harness: setrlimit: %s", strerror(errno));
}

/* ---- fault proxies ---- */

const char *h_proxy_bin(void)
{
    const char *bin = getenv("REDLOCKD_FAULTPROXY_BIN");

    if (!bin || *bin == '\0')
        ck_abort_msg("harness: REDLOCKD_FAULTPROXY_BIN is not set (run via meson test)");
    return bin;
}

void h_proxy_dump_log(const struct h_proxy *p)
{
    dump_file(p->log_path, "faultproxy log");
}

/* The port of the proxy's "ready 127.0.0.1:<port>" line, 0 until then. */
static int proxy_ready_port(const char *log)
{
    char line[256];
    int port = 0;
    FILE *f = fopen(log, "r");

    if (!f)
        return 0;
    while (port == 0 && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "ready 127.0.0.1:%d", &port) != 1)
            port = 0;
    }
    fclose(f);
    return port;
}

void h_proxy_start(struct h_proxy *p, int target_port)
{
    char *argv[8];
    char target[32];
    uint64_t end;
    int status;

    (void)h_proxy_bin();    /* fail before creating anything */
    memset(p, 0, sizeof(*p));
    p->target = target_port;
    make_tmpdir(p->dir, sizeof(p->dir), "proxy");
    snprintf(p->ctl, sizeof(p->ctl), "%s/ctl.sock", p->dir);
    snprintf(p->log_path, sizeof(p->log_path), "%s/faultproxy.log", p->dir);
    guard_start(p->dir, NULL);
    snprintf(target, sizeof(target), "127.0.0.1:%d", target_port);
    argv[0] = (char *)h_proxy_bin();
    argv[1] = "--listen";
    argv[2] = "127.0.0.1:0";    /* the kernel's choice: no port race */
    argv[3] = "--target";
    argv[4] = target;
    argv[5] = "--control";
    argv[6] = p->ctl;
    argv[7] = NULL;
    p->pid = spawn(argv, p->log_path);
    end = h_now_ms() + (uint64_t)h_scale(5000);
    while (h_now_ms() < end) {
        p->port = proxy_ready_port(p->log_path);
        if (p->port != 0)
            return;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            proc_forget(p->pid);
            p->pid = 0;
            break;
        }
        h_sleep_ms(5);
    }
    if (p->pid != 0)
        kill_reap(&p->pid);
    h_proxy_dump_log(p);
    ck_abort_msg("harness: faultproxy to port %d did not start", target_port);
}

static char *proxy_vctl(struct h_proxy *p, bool want_ok, const char *fmt,
                        va_list ap)
{
    /* Clients are large (buffers): static keeps this one off the stack. */
    static struct h_client ctl;
    static char reply[1024];
    char *req = vformat(fmt, ap, "\n");
    char *line;
    int rc = h_connect_unix(&ctl, p->ctl);

    ck_assert_msg(rc == 0, "faultproxy control %s: %s", p->ctl, strerror(-rc));
    h_send(&ctl, req, strlen(req));
    line = h_recv_line(&ctl, 5000);
    req[strcspn(req, "\n")] = '\0';
    if (!line || (want_ok && !h_starts(line, "OK"))) {
        h_proxy_dump_log(p);
        ck_abort_msg("faultproxy \"%s\" answered \"%s\"", req,
                     line ? line : "(nothing)");
    }
    snprintf(reply, sizeof(reply), "%s", line);
    h_close(&ctl);
    free(req);
    return reply;
}

char *h_proxy_ctl(struct h_proxy *p, const char *fmt, ...)
{
    va_list ap;
    char *reply;

    va_start(ap, fmt);
    reply = proxy_vctl(p, true, fmt, ap);
    va_end(ap);
    return reply;
}

char *h_proxy_try(struct h_proxy *p, const char *fmt, ...)
{
    va_list ap;
    char *reply;

    va_start(ap, fmt);
    reply = proxy_vctl(p, false, fmt, ap);
    va_end(ap);
    return reply;
}

int h_proxy_stop(struct h_proxy *p)
{
    int status = 0;

    if (p->pid == 0)
        ck_abort_msg("harness: h_proxy_stop: faultproxy is not running");
    kill(p->pid, SIGTERM);
    if (!wait_exit(p->pid, h_scale(5000), &status)) {
        kill_reap(&p->pid);
        h_proxy_dump_log(p);
        ck_abort_msg("harness: faultproxy did not exit within 5 s of SIGTERM");
    }
    proc_forget(p->pid);
    p->pid = 0;
    return exit_code(status);
}

void h_proxy_cleanup(struct h_proxy *p)
{
    kill_reap(&p->pid);
    guard_end(p->dir);
    p->dir[0] = '\0';
}

void h_proxy_start_all(struct h_proxy *ps, const struct h_redis *nodes, int n)
{
    for (int i = 0; i < n; i++)
        h_proxy_start(&ps[i], nodes[i].port);
}

void h_proxy_cleanup_all(struct h_proxy *ps, int n)
{
    for (int i = 0; i < n; i++)
        h_proxy_cleanup(&ps[i]);
}

/* ---- helpers shared by the test programs ---- */

void h_redis_start_all(struct h_redis *nodes, int n, const char *extra)
{
    for (int i = 0; i < n; i++)
        h_redis_start(&nodes[i], extra);
}

void h_redis_resume_all(struct h_redis *nodes, int n)
{
    for (int i = 0; i < n; i++)
        h_redis_resume(&nodes[i]);
}

void h_redis_cleanup_all(struct h_redis *nodes, int n)
{
    for (int i = 0; i < n; i++)
        h_redis_cleanup(&nodes[i]);
}

void h_connect_tcp_ok(struct h_client *c, int port)
{
    int rc = h_connect_tcp(c, port);

    ck_assert_msg(rc == 0, "connect to 127.0.0.1:%d: %s", port, strerror(-rc));
}

void h_connect_counted(struct h_client *c, int port)
{
    uint64_t t0 = h_now_ms();

    for (;;) {
        h_connect_tcp_ok(c, port);
        if (strcmp(h_cmd(c, "PING"), "PONG") == 0)
            return;
        h_close(c);
        ck_assert_msg(h_since(t0) < h_scale(3000), "connect to 127.0.0.1:%d: "
                      "still refused after 3 s", port);
        h_sleep_ms(50);
    }
}

void h_connect_unix_ok(struct h_client *c, const char *path)
{
    int rc = h_connect_unix(c, path);

    ck_assert_msg(rc == 0, "connect to %s: %s", path, strerror(-rc));
}

int h_daemon_finish(struct h_daemon *d)
{
    int rc;

    if (d->pid == 0)
        return 0;
    rc = h_daemon_stop(d);
    if (rc != 0)
        h_daemon_dump_log(d);
    return rc;
}

void h_daemon_finish_ok(struct h_daemon *d)
{
    int port = d->port, rc = h_daemon_finish(d);

    ck_assert_msg(rc == 0, "redlockd (port %d) exited with status %d on "
                  "SIGTERM", port, rc);
}

/* h_cmd of an already formatted request, asserting the reply's start; the
 * request is kept so the message can quote it. */
static char *expect_req(struct h_client *c, const char *prefix, const char *req)
{
    char *line = h_cmd(c, "%s", req);

    ck_assert_msg(h_starts(line, prefix), "\"%s\" answered \"%s\", want \"%s...\"",
                  req, line, prefix);
    return line;
}

char *h_expect(struct h_client *c, const char *prefix, const char *fmt, ...)
{
    va_list ap;
    char *req, *line;

    va_start(ap, fmt);
    req = vformat(fmt, ap, "");
    va_end(ap);
    line = expect_req(c, prefix, req);
    free(req);
    return line;
}

json_t *h_ok_json(struct h_client *c, const char *fmt, ...)
{
    va_list ap;
    char *req, *line;
    json_error_t err;
    json_t *obj;

    va_start(ap, fmt);
    req = vformat(fmt, ap, "");
    va_end(ap);
    line = expect_req(c, "OK {", req);
    obj = json_loads(line + 3, 0, &err);
    ck_assert_msg(json_is_object(obj), "%s: bad JSON (%s): %s", req, err.text, line);
    free(req);
    return obj;
}

json_int_t h_json_int(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);

    ck_assert_msg(json_is_integer(v), "JSON field \"%s\" is not an integer", key);
    return json_integer_value(v);
}

const char *h_json_str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);

    ck_assert_msg(json_is_string(v), "JSON field \"%s\" is not a string", key);
    return json_string_value(v);
}

json_int_t h_stats_int(struct h_client *c, const char *key)
{
    json_t *stats = h_ok_json(c, "STATS");
    json_int_t v = h_json_int(stats, key);

    json_decref(stats);
    return v;
}

void h_kv_copy(const char *line, const char *key, char *out, size_t size)
{
    const char *v = h_kv(line, key);

    ck_assert_msg(v, "no %s= in \"%s\"", key, line);
    snprintf(out, size, "%s", v);
}

void h_wait_voting(const struct h_daemon *d, int nnodes, int timeout_ms)
{
    /* Clients are large (buffers): static keeps this one off the stack. */
    static struct h_client probe;
    uint64_t t0 = h_now_ms();
    json_int_t voting;

    h_connect_tcp_ok(&probe, d->port);
    for (;;) {
        voting = h_stats_int(&probe, "nodes_voting");
        if (voting == nnodes || h_since(t0) >= timeout_ms)
            break;
        h_sleep_ms(10);
    }
    h_close(&probe);
    if (voting != nnodes)
        h_daemon_dump_log(d);
    ck_assert_msg(voting == nnodes, "only %lld of %d nodes voting after %d ms",
                  (long long)voting, nnodes, timeout_ms);
}

int h_wait_any_line(struct h_client **cs, int n, long long timeout_ms,
                    char **line)
{
    uint64_t end = h_now_ms() + (uint64_t)timeout_ms;

    ck_assert_int_le(n, H_MAX_WAIT_CLIENTS);
    for (;;) {
        struct pollfd p[H_MAX_WAIT_CLIENTS];
        uint64_t now;

        /* A line already buffered would never make poll() return. */
        for (int i = 0; i < n; i++) {
            if (memchr(cs[i]->buf, '\n', cs[i]->len)) {
                *line = h_recv_line(cs[i], 1);
                return i;
            }
            p[i].fd = cs[i]->fd;
            p[i].events = POLLIN;
            p[i].revents = 0;
        }
        now = h_now_ms();
        if (now >= end || poll(p, (nfds_t)n, (int)(end - now)) <= 0)
            return -1;
        for (int i = 0; i < n; i++) {
            if (p[i].revents != 0) {
                *line = h_recv_line(cs[i], 200);
                ck_assert_msg(*line, "client %d: EOF or half a line", i);
                return i;
            }
        }
    }
}

/* ---- the cluster fixture ---- */

void h_cluster_init(struct h_cluster *k)
{
    memset(k, 0, sizeof(*k));
    for (int i = 0; i < H_CLUSTER_CLIENTS; i++)
        k->clients[i].fd = -1;
}

void h_cluster_nodes(struct h_cluster *k, int n, const char *extra)
{
    ck_assert_int_le(n, H_MAX_NODES);
    h_redis_start_all(k->nodes, n, extra);
    k->nnodes = n;
}

void h_cluster_nodes_first(struct h_cluster *k, int n, const char *extra0)
{
    ck_assert_int_ge(n, 1);
    ck_assert_int_le(n, H_MAX_NODES);
    h_redis_start(&k->nodes[0], extra0);
    h_redis_start_all(&k->nodes[1], n - 1, NULL);
    k->nnodes = n;
}

struct h_proxy *h_cluster_proxy(struct h_cluster *k, int p, int node)
{
    ck_assert(p >= 0 && p < H_MAX_NODES && node >= 0 && node < H_MAX_NODES);
    h_proxy_start(&k->proxies[p], k->nodes[node].port);
    return &k->proxies[p];
}

void h_cluster_route(struct h_cluster *k, int d, int node, int p)
{
    ck_assert(d >= 0 && d < H_CLUSTER_DAEMONS);
    ck_assert(p >= 0 && p < H_MAX_NODES && node >= 0 && node < H_MAX_NODES);
    k->via[d][node] = p + 1;
}

void h_cluster_proxy_all(struct h_cluster *k, int d)
{
    for (int i = 0; i < k->nnodes; i++) {
        h_cluster_proxy(k, i, i);
        h_cluster_route(k, d, i, i);
    }
}

struct h_daemon *h_cluster_daemon_start(struct h_cluster *k, int d,
                                        const char *extra_json)
{
    int ports[H_MAX_NODES];

    ck_assert(d >= 0 && d < H_CLUSTER_DAEMONS);
    for (int i = 0; i < k->nnodes; i++) {
        int p = k->via[d][i];

        ports[i] = p == 0 ? k->nodes[i].port : k->proxies[p - 1].port;
    }
    h_daemon_start_ports(&k->daemons[d], ports, k->nnodes, extra_json);
    return &k->daemons[d];
}

struct h_daemon *h_cluster_daemon(struct h_cluster *k, int d,
                                  const char *extra_json, int timeout_ms)
{
    struct h_daemon *dm = h_cluster_daemon_start(k, d, extra_json);

    h_wait_voting(dm, k->nnodes, timeout_ms);
    return dm;
}

void h_cluster_start(struct h_cluster *k, int nnodes, int ndaemons,
                     const char *extra_json, int timeout_ms)
{
    h_cluster_nodes(k, nnodes, NULL);
    for (int d = 0; d < ndaemons; d++)
        h_cluster_daemon(k, d, extra_json, timeout_ms);
}

struct h_client *h_cluster_client(struct h_cluster *k, int i, int d)
{
    ck_assert(i >= 0 && i < H_CLUSTER_CLIENTS);
    ck_assert(d >= 0 && d < H_CLUSTER_DAEMONS);
    h_connect_tcp_ok(&k->clients[i], k->daemons[d].port);
    return &k->clients[i];
}

void h_cluster_stop(struct h_cluster *k)
{
    for (int d = 0; d < H_CLUSTER_DAEMONS; d++)
        h_daemon_finish_ok(&k->daemons[d]);
}

static void cluster_close_clients(struct h_cluster *k)
{
    for (int i = 0; i < H_CLUSTER_CLIENTS; i++) {
        if (k->clients[i].fd > 0)
            h_close(&k->clients[i]);
    }
}

void h_cluster_continue(struct h_cluster *k)
{
    h_redis_resume_all(k->nodes, k->nnodes);
    for (int d = 0; d < H_CLUSTER_DAEMONS; d++) {
        if (k->daemons[d].pid != 0)
            kill(k->daemons[d].pid, SIGCONT);
    }
}

int h_cluster_finish(struct h_cluster *k)
{
    int rc = 0;

    h_cluster_continue(k);
    cluster_close_clients(k);
    for (int d = 0; d < H_CLUSTER_DAEMONS; d++) {
        int r = h_daemon_finish(&k->daemons[d]);

        rc = rc != 0 ? rc : r;
    }
    return rc;
}

void h_cluster_cleanup(struct h_cluster *k)
{
    cluster_close_clients(k);
    h_cluster_continue(k);
    for (int d = 0; d < H_CLUSTER_DAEMONS; d++)
        h_daemon_cleanup(&k->daemons[d]);
    h_proxy_cleanup_all(k->proxies, H_MAX_NODES);
    h_redis_cleanup_all(k->nodes, k->nnodes);
}

void h_cluster_teardown(struct h_cluster *k)
{
    int rc = h_cluster_finish(k);

    h_cluster_cleanup(k);
    ck_assert_msg(rc == 0, "redlockd exited with status %d on SIGTERM", rc);
}

int h_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* The cluster h_cluster_fixture set up and how it ends. */
static struct h_cluster *fixture;
static int fixture_nnodes;

static void fixture_setup(void)
{
    h_cluster_init(fixture);
    if (fixture_nnodes > 0)
        h_cluster_nodes(fixture, fixture_nnodes, NULL);
}

static void fixture_teardown(void)
{
    h_cluster_teardown(fixture);
}

static void fixture_cleanup(void)
{
    h_cluster_cleanup(fixture);
}

void h_cluster_fixture(TCase *tc, struct h_cluster *k, int nnodes,
                       bool check_exit)
{
    if (fixture && fixture != k) {
        fprintf(stderr, "harness: one cluster fixture per test program\n");
        abort();
    }
    fixture = k;
    fixture_nnodes = nnodes;
    tcase_add_checked_fixture(tc, fixture_setup,
                              check_exit ? fixture_teardown : fixture_cleanup);
}

struct h_node_view h_stats_node(struct h_client *c, int i)
{
    json_t *o = h_ok_json(c, "STATS");
    json_t *n = json_array_get(json_object_get(o, "nodes"), (size_t)i);
    json_t *why;
    struct h_node_view v;

    ck_assert_msg(json_is_object(n), "STATS has no nodes[%d]", i);
    ck_assert_msg(json_is_boolean(json_object_get(n, "voting")) &&
                  json_is_boolean(json_object_get(n, "recovering")),
                  "STATS nodes[%d] lacks voting/recovering", i);
    v.up = json_is_true(json_object_get(n, "up"));
    v.voting = json_is_true(json_object_get(n, "voting"));
    v.recovering = json_is_true(json_object_get(n, "recovering"));
    v.aof_always = json_is_true(json_object_get(n, "aof_always"));
    v.has_until = json_is_string(json_object_get(n, "until"));
    v.restarts = h_json_int(n, "restarts");
    why = json_object_get(n, "why");
    snprintf(v.why, sizeof(v.why), "%s",
             json_is_string(why) ? json_string_value(why) : "(no why)");
    json_decref(o);
    return v;
}
