/*
 * test_cli: redlockctl as a real process against the real redlockd and real
 * redis-server nodes (issue 5, point 3), plus the README's example program.
 *
 * Each test starts its own nodes and daemon from a checked fixture that
 * always stops them again and asserts that the daemon exits 0 on SIGTERM.
 * redlockctl runs with stdout and stderr captured separately, so messages
 * can be told from output. What is checked, against redlockctl(1):
 *   - two `run --wait` on one resource never overlap (their commands'
 *     start/end marks alternate) and both succeed; the command sees
 *     REDLOCKD_RESOURCE, REDLOCKD_TOKEN (32 hex) and a growing
 *     REDLOCKD_FENCE;
 *   - a busy lock gives status 75 (or -E N) without running the command,
 *     also after --wait ran out, and -q keeps stderr quiet;
 *   - the command's own exit status, 128+N for a death by signal N, and
 *     127 for a command that does not exist;
 *   - the keeper (issue 28): SIGKILL of redlockctl neither frees the lock
 *     nor stops the command; a worker the command left in its process
 *     group after closing its descriptors (tests/tools/stamper.c, as
 *     Python's close_fds) keeps the lock: another client's LOCK wait= is
 *     granted after its last write and within a second of it; the lock is
 *     freed at once when the group ends (no --detach wait); a redlockctl
 *     stopped past its ttl costs nothing (case "keeper");
 *   - SIGKILL of redlockctl's keeper: redlockctl says so and exits 137;
 *     the command inherited the lock connection ($REDLOCKD_LOCK_FD), so
 *     the daemon keeps the lock until the command's last process exits,
 *     and frees it the --detach time later;
 *   - SIGTERM and SIGINT sent to redlockctl reach the command; SIGTERM
 *     and SIGHUP also reach the rest of its group after the command itself
 *     exited, so the lock is released and redlockctl exits at once;
 *   - a lease lost while the command runs (two of three nodes SIGSTOPped)
 *     stops the command, and redlockctl exits 70;
 *   - a lease lost to FORCEUNLOCK: SIGTERM reaches the command's whole
 *     process group, and a grandchild gets its time to act on it after the
 *     command's shell died; one that ignores it is SIGKILLed --kill-after
 *     seconds later, not at once;
 *   - so does a lease whose deadline passes unconfirmed: with its daemon
 *     SIGSTOPped the command is stopped before a second daemon on the same
 *     nodes grants the lock (comparing the command's last write with the
 *     grant), and a keeper that was itself stopped past the deadline
 *     stops its command as it resumes;
 *   - failover (issue 18): `run` with two daemons (-s twice, or a comma
 *     list in $REDLOCKD_SERVER) rides through its daemon's SIGTERM and
 *     restart, and through its SIGKILL: the command runs its 3 s to the
 *     end, exit 0, and another client gets BUSY all along; ping goes to
 *     the list's next daemon when the first is down; a `run --wait`
 *     whose LOCK waits on a daemon that stops (ERR SHUTDOWN) or dies (the
 *     LOCK cut off) takes the lock through the second one (case
 *     "failover");
 *   - a command that ended within its lease, whose final UNLOCK the
 *     stopped daemon answers LOST only after the deadline, gives the
 *     command's status, not 70;
 *   - options anywhere for every command (for run, before COMMAND), and
 *     usage messages that name the missing word (run -- true: RESOURCE);
 *     names as long as the daemon takes, and messages naming its limit;
 *   - stats as a short table (nodes, sessions, locks, rates, quantiles);
 *   - status, sessions, stats and ping, as tables and as --json, over TCP,
 *     the unix socket and $REDLOCKD_SERVER; an unreachable daemon gives 69
 *     and one "redlockctl: ..." line on stderr, and so does ping to a
 *     daemon without a quorum (two of three nodes SIGSTOPped);
 *   - locks lists the locks of two sessions with their names, sorted, as
 *     a table and as a --json array, when the daemon's SESSIONS lists
 *     held locks, and otherwise fails with 69 and a clear message;
 *   - release --force (FORCEUNLOCK) deletes a lock held by another
 *     session, which hears EVENT LOST, with the admin password from a file
 *     or $REDLOCKD_ADMIN_PASSWORD; without it (NOAUTH) or with a wrong one
 *     it exits 69 with one clear line and the lock stays; plain release
 *     is a usage error (64);
 *   - TLS (issue 21): `run` holding a lock through the daemon's tls://
 *     listener (another client BUSY meanwhile), --tls-ca anywhere and
 *     $REDLOCKD_TLS_CA; an unknown CA, a name mismatch and a daemon that
 *     wants a client certificate give 69 and one line naming the reason,
 *     --tls-cert/--tls-key satisfy it, and a CA file that does not load
 *     is a usage error (64); a plain address of the TLS port prints the
 *     daemon's "this port speaks TLS" and is a usage error (64), the
 *     command not run; certificates from tests/tools/mkcerts.sh;
 *   - leader election (issue 32): two `elect` candidates, each with a
 *     --value; the first leads (its command sees REDLOCKD_VALUE, `leader`
 *     prints its value, the second waits), killing its command makes the
 *     second the leader, and a `watch` running all along prints a line
 *     per change (the time, the resource, the event's words) into its
 *     pipe as it happens; with nobody leading, `leader` exits 1 and says
 *     nothing; watch exits 0 on SIGTERM;
 *   - `watch --json`: a JSON object per line (time, resource, held, and
 *     the holder's mode, fence, name, value); with two daemons, watch
 *     goes on through the second when the first dies (and says so);
 *   - `lock`: prints the resource, fence and token, holds the lock (past
 *     its ttl; `status` shows its value) until SIGTERM or SIGINT, then
 *     releases it at once (exit 0); --json; busy: 75; a lease lost while
 *     held: exit 70;
 *   - usage errors of those commands: an option of another command, a
 *     missing --value or RESOURCE, a malformed value;
 *   - --version, --help, and a usage error (64);
 *   - the README's library example runs and exits 0.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define PROCS_MAX 32
#define ARGS_MAX 32

/* Redis timeouts short enough that two stopped nodes cost a lease within
 * a couple of seconds (as test_fault does). */
#define FAULT_JSON "{\"redis\":{\"command_timeout_ms\":100," \
                   "\"reconnect_max_ms\":200}}"

/* Exit statuses documented in redlockctl(1). */
#define EXIT_BUSY 75
#define EXIT_LOST 70
#define EXIT_USAGE 64
#define EXIT_UNAVAILABLE 69
#define EXIT_DENIED 77

/* A started process with its stdout and stderr captured through pipes.
 * The outputs involved are far below a pipe's capacity, but the pipes are
 * drained while waiting anyway, so a chatty process can never block. */
struct proc {
    pid_t pid;              /* 0 once reaped */
    int out_fd, err_fd;     /* non-blocking read ends; -1 when closed */
    int status;             /* exit status, or 128+signal */
    char cmdline[512];      /* its arguments, for messages */
    char out[16384];
    size_t out_len;
    char err[16384];
    size_t err_len;
};

/* The nodes (R), the daemon D, a second daemon D2 on the same nodes for
 * tests about what another daemon may grant, and the raw protocol
 * clients A and B (harness.h). */
static struct h_cluster K;
static struct h_redis *const R = K.nodes;
static struct h_daemon *const D = &K.daemons[0];
static struct h_daemon *const D2 = &K.daemons[1];
static struct h_client *const A = &K.clients[0];
static struct h_client *const B = &K.clients[1];
static struct proc P[PROCS_MAX];
static int np;
/* The daemon's TCP address as redlockctl takes it: "127.0.0.1:<port>". */
static char S[64];
/* REDLOCKD_SERVER for the next processes started (NULL: unset). */
static const char *server_env;
/* REDLOCKD_ADMIN_PASSWORD likewise. */
static const char *admin_env;
/* $REDLOCKD_TLS_CA for redlockctl, or NULL. */
static const char *tls_ca_env;
/* REDLOCKD_USER likewise. */
static const char *user_env;

/* ---- fixture ---- */

static void setup(void)
{
    h_cluster_init(&K);
    memset(P, 0, sizeof(P));
    np = 0;
    S[0] = '\0';
    server_env = NULL;
    admin_env = NULL;
    tls_ca_env = NULL;
    user_env = NULL;
}

static void proc_close_pipes(struct proc *p)
{
    if (p->out_fd >= 0)
        close(p->out_fd);
    if (p->err_fd >= 0)
        close(p->err_fd);
    p->out_fd = p->err_fd = -1;
}

static void kill_children(pid_t pid);

/* Runs after every passing test; a failing one _exit()s its fork, and then
 * PDEATHSIG and the harness's guardians clean up instead. */
static void teardown(void)
{
    for (int i = 0; i < np; i++) {
        if (P[i].pid != 0) {
            kill_children(P[i].pid);
            kill(P[i].pid, SIGKILL);
            waitpid(P[i].pid, NULL, 0);
            P[i].pid = 0;
        }
        proc_close_pipes(&P[i]);
    }
    /* Stopped nodes and daemons continued, the clients closed, each
     * daemon SIGTERMed and its exit status 0 asserted. */
    h_cluster_teardown(&K);
}

/* ---- daemon and raw protocol ---- */

/* Start the daemon over the nodes and wait until every node votes. */
static void start_daemon(const char *extra_json)
{
    h_cluster_daemon(&K, 0, extra_json, h_scale(5000));
    snprintf(S, sizeof(S), "127.0.0.1:%d", D->port);
}

/* The same for a daemon with auth.password: A, authenticated with it,
 * polls STATS (h_wait_voting's would be refused) and stays connected. */
static void start_daemon_auth(const char *extra_json, const char *password)
{
    uint64_t t0;

    h_cluster_daemon_start(&K, 0, extra_json);
    snprintf(S, sizeof(S), "127.0.0.1:%d", D->port);
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK", "AUTH %s", password);
    t0 = h_now_ms();
    while (h_stats_int(A, "nodes_voting") < K.nnodes) {
        ck_assert_msg(h_since(t0) < h_scale(5000), "nodes not voting in 5 s");
        h_sleep_ms(10);
    }
}

/* LOCK retried while BUSY for up to timeout_ms; returns how long it took. */
static long long lock_within(struct h_client *c, const char *res, int timeout_ms)
{
    uint64_t t0 = h_now_ms();

    for (;;) {
        char *line = h_cmd(c, "LOCK %s ttl=30000", res);

        if (h_starts(line, "OK "))
            return h_since(t0);
        ck_assert_msg(h_starts(line, "ERR BUSY"), "LOCK %s answered \"%s\"", res, line);
        ck_assert_msg(h_since(t0) < timeout_ms, "%s still BUSY after %d ms", res,
                      timeout_ms);
        h_sleep_ms(5);
    }
}

/* The lock is free right now: take it and give it back. */
static void assert_free(const char *res)
{
    h_expect(A, "OK resource=", "LOCK %s ttl=30000", res);
    h_expect(A, "OK resource=", "UNLOCK %s", res);
}

/* ---- files ---- */

/* A path inside the daemon's temp dir, which the harness removes even when
 * the test dies. Returned in one of a few rotating static buffers. */
static const char *tmp_path(const char *name)
{
    static char bufs[4][400];
    static int next;
    char *b = bufs[next++ % 4];

    ck_assert_msg(D->dir[0] != '\0', "tmp_path before the daemon started");
    snprintf(b, sizeof(bufs[0]), "%s/%s", D->dir, name);
    return b;
}

/* The whole file into buf; false if it does not exist. */
static bool read_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    size_t n;

    buf[0] = '\0';
    if (!f)
        return false;
    n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return true;
}

static bool file_exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* Wait until a file holds a complete line (the writer's echo finished):
 * returns its first number (the pids written by the commands below). */
static long wait_file_number(const char *path, int timeout_ms)
{
    uint64_t t0 = h_now_ms();
    char buf[256];

    while (h_since(t0) < timeout_ms) {
        if (read_file(path, buf, sizeof(buf)) && strchr(buf, '\n'))
            return strtol(buf, NULL, 10);
        h_sleep_ms(10);
    }
    ck_abort_msg("%s not written within %d ms", path, timeout_ms);
    return -1;
}

/* A process that exited (a zombie nobody reaped counts) or never was. */
static bool pid_gone(pid_t pid)
{
    char path[64], buf[512];
    const char *paren;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    if (!read_file(path, buf, sizeof(buf)))
        return true;
    paren = strrchr(buf, ')');
    return paren && (paren[2] == 'Z' || paren[2] == 'X');
}

static bool wait_pid_gone(pid_t pid, int timeout_ms)
{
    uint64_t t0 = h_now_ms();

    while (!pid_gone(pid)) {
        if (h_since(t0) >= timeout_ms)
            return false;
        h_sleep_ms(10);
    }
    return true;
}

/* The parent of a process (0 when it is gone): the command's parent is
 * the keeper, the process of redlockctl that holds the lock. */
static long ppid_of(long pid)
{
    char path[64], buf[1024], state;
    const char *paren;
    long ppid;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if (!read_file(path, buf, sizeof(buf)) || !(paren = strrchr(buf, ')'))
        || sscanf(paren + 1, " %c %ld", &state, &ppid) != 2)
        return 0;
    return ppid;
}

/* SIGKILL to the children of pid: a redlockctl run's keeper, which
 * outlives a SIGKILL of redlockctl by design. (/proc/PID/task/PID/children
 * needs CONFIG_PROC_CHILDREN: every process's parent is read instead.) */
static void kill_children(pid_t pid)
{
    DIR *d = opendir("/proc");
    struct dirent *e;

    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        long child = atol(e->d_name);

        if (child > 0 && ppid_of(child) == (long)pid)
            kill((pid_t)child, SIGKILL);
    }
    closedir(d);
}

/* ---- processes ---- */

static const char *env_bin(const char *var)
{
    const char *bin = getenv(var);

    if (!bin || *bin == '\0')
        ck_abort_msg("%s is not set (run through meson test)", var);
    return bin;
}

static void child_exec(const char *bin, char **argv, int out, int err,
                       pid_t parent)
{
    sigset_t none;
    int in = open("/dev/null", O_RDONLY);

    /* Never outlive the test, whatever happens to it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent || in < 0)
        _exit(127);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    /* Test sockets left open in redlockctl would hide its exit from the
     * daemon, and pipe ends would hide EOF from us. */
    if (close_range(3, ~0U, 0) < 0) {
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    }
    /* redlockctl keeps signals its parent ignored ignored (as under
     * nohup): give it a plain start whatever check or meson did. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (server_env)
        setenv("REDLOCKD_SERVER", server_env, 1);
    else
        unsetenv("REDLOCKD_SERVER");
    if (admin_env)
        setenv("REDLOCKD_ADMIN_PASSWORD", admin_env, 1);
    else
        unsetenv("REDLOCKD_ADMIN_PASSWORD");
    if (tls_ca_env)
        setenv("REDLOCKD_TLS_CA", tls_ca_env, 1);
    else
        unsetenv("REDLOCKD_TLS_CA");
    unsetenv("REDLOCKD_TLS_CERT");
    unsetenv("REDLOCKD_TLS_KEY");
    if (user_env)
        setenv("REDLOCKD_USER", user_env, 1);
    else
        unsetenv("REDLOCKD_USER");
    execv(bin, argv);
    fprintf(stderr, "test: exec %s: %s\n", bin, strerror(errno));
    _exit(127);
}

/* Start bin with args (NULL-terminated) and return at once. */
static struct proc *proc_startv(const char *bin, const char *const *args)
{
    char *argv[ARGS_MAX];
    int out[2], err[2], n = 0;
    pid_t parent = getpid();
    struct proc *p;

    ck_assert_int_lt(np, PROCS_MAX);
    p = &P[np++];
    argv[n++] = (char *)bin;
    p->cmdline[0] = '\0';
    for (; *args != NULL; args++) {
        size_t len = strlen(p->cmdline);

        ck_assert_int_lt(n, ARGS_MAX - 1);
        argv[n++] = (char *)*args;
        snprintf(p->cmdline + len, sizeof(p->cmdline) - len, "%s%s",
                 len > 0 ? " " : "", *args);
    }
    argv[n] = NULL;
    ck_assert(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0);
    p->pid = fork();
    ck_assert_msg(p->pid >= 0, "fork: %s", strerror(errno));
    if (p->pid == 0)
        child_exec(bin, argv, out[1], err[1], parent);
    close(out[1]);
    close(err[1]);
    p->out_fd = out[0];
    p->err_fd = err[0];
    fcntl(p->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(p->err_fd, F_SETFL, O_NONBLOCK);
    return p;
}

/* redlockctl with the arguments first... (NULL-terminated). */
static struct proc *ctl_startv(const char *first, va_list ap)
{
    const char *args[ARGS_MAX];
    int n = 0;

    for (const char *a = first; a != NULL; a = va_arg(ap, const char *)) {
        ck_assert_int_lt(n, ARGS_MAX - 1);
        args[n++] = a;
    }
    args[n] = NULL;
    return proc_startv(env_bin("REDLOCKCTL_BIN"), args);
}

static struct proc *ctl_start(const char *first, ...) __attribute__((sentinel));
static struct proc *ctl_start(const char *first, ...)
{
    struct proc *p;
    va_list ap;

    va_start(ap, first);
    p = ctl_startv(first, ap);
    va_end(ap);
    return p;
}

/* Read what a pipe has now (the writer may be gone, or may live on in a
 * grandchild: never wait for EOF). */
static void drain_fd(int *fd, char *buf, size_t *len, size_t size)
{
    ssize_t n;

    while (*fd >= 0) {
        char scratch[4096];

        n = read(*fd, scratch, sizeof(scratch));
        if (n > 0) {
            size_t room = size - 1 - *len;
            size_t take = (size_t)n < room ? (size_t)n : room;

            memcpy(buf + *len, scratch, take);
            *len += take;
            buf[*len] = '\0';
        } else if (n == 0) {
            close(*fd);
            *fd = -1;
        } else if (errno != EINTR) {
            return;
        }
    }
}

static void proc_drain(struct proc *p)
{
    drain_fd(&p->out_fd, p->out, &p->out_len, sizeof(p->out));
    drain_fd(&p->err_fd, p->err, &p->err_len, sizeof(p->err));
}

/* True once the process exited (status in p->status), false if it is still
 * running after timeout_ms. */
static bool proc_exited(struct proc *p, int timeout_ms)
{
    uint64_t t0 = h_now_ms();
    int st;

    while (p->pid != 0) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);

        proc_drain(p);
        if (r == p->pid) {
            p->pid = 0;
            p->status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
            /* Its last words may have arrived after the drain above. */
            proc_drain(p);
            proc_close_pipes(p);
            break;
        }
        if (h_since(t0) >= timeout_ms)
            return false;
        h_sleep_ms(5);
    }
    return true;
}

/* Wait for the exit, failing the test (with the process's stderr) when it
 * takes longer than timeout_ms; returns the exit status. */
static int proc_wait(struct proc *p, int timeout_ms)
{
    if (!proc_exited(p, timeout_ms)) {
        kill(p->pid, SIGKILL);
        proc_exited(p, 5000);
        ck_abort_msg("process still running after %d ms; stdout: %s; stderr: %s",
                     timeout_ms, p->out, p->err);
    }
    return p->status;
}

static int count_lines(const char *s)
{
    int n = 0;

    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

/* Assert an exit status, showing the process's output when it differs. */
static void assert_status(const struct proc *p, int want, const char *what)
{
    ck_assert_msg(p->status == want, "%s: exit status %d, want %d; stdout: %s; "
                  "stderr: %s", what, p->status, want, p->out, p->err);
}

/* Successful commands print no messages. */
static void assert_ok_quiet(const struct proc *p, const char *what)
{
    assert_status(p, 0, what);
    ck_assert_msg(p->err_len == 0, "%s: exit 0 but stderr says: %s", what, p->err);
}

/* A failure is one line on stderr starting "redlockctl:", nothing on stdout. */
static void assert_one_error_line(const struct proc *p, const char *what)
{
    ck_assert_msg(h_starts(p->err, "redlockctl:") && count_lines(p->err) == 1 &&
                  p->err[p->err_len - 1] == '\n',
                  "%s: stderr is not one \"redlockctl: ...\" line: \"%s\"", what,
                  p->err);
    ck_assert_msg(p->out_len == 0, "%s: stdout not empty: %s", what, p->out);
}

static json_t *parse_json(const struct proc *p, const char *what)
{
    json_error_t jerr;
    json_t *o = json_loads(p->out, 0, &jerr);

    ck_assert_msg(json_is_object(o), "%s: output is not a JSON object (%s): %s",
                  what, jerr.text, p->out);
    return o;
}

/* redlockctl run to a quiet exit 0 (within 5 s) that printed `want`. */
static struct proc *ctl_okv(const char *want, const char *first, va_list ap)
{
    struct proc *p = ctl_startv(first, ap);

    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, p->cmdline);
    ck_assert_msg(strstr(p->out, want), "%s printed no \"%s\": %s",
                  p->cmdline, want, p->out);
    return p;
}

static struct proc *ctl_ok(const char *want, const char *first, ...)
    __attribute__((sentinel));
static struct proc *ctl_ok(const char *want, const char *first, ...)
{
    struct proc *p;
    va_list ap;

    va_start(ap, first);
    p = ctl_okv(want, first, ap);
    va_end(ap);
    return p;
}

/* The same for a --json command: its output parsed (the caller decrefs). */
static json_t *ctl_ok_json(const char *first, ...) __attribute__((sentinel));
static json_t *ctl_ok_json(const char *first, ...)
{
    struct proc *p;
    va_list ap;

    va_start(ap, first);
    p = ctl_okv("{", first, ap);
    va_end(ap);
    return parse_json(p, p->cmdline);
}

/* ---- run: mutual exclusion and the lock in the environment ---- */

/* Appends "start <pid> <fence> <token> <resource>", sleeps, appends
 * "end <pid>": two runs overlapping would interleave the marks. */
#define MARK_SCRIPT \
    "echo start $$ \"$REDLOCKD_FENCE\" \"$REDLOCKD_TOKEN\" " \
    "\"$REDLOCKD_RESOURCE\" >> \"$1\"; sleep 0.3; echo end $$ >> \"$1\""

struct mark {
    long pid;
    unsigned long long fence;
    char token[64];
    char resource[64];
};

static void check_token(const char *token, const char *line)
{
    ck_assert_msg(strlen(token) == 32, "REDLOCKD_TOKEN is not 32 chars: %s", line);
    for (const char *t = token; *t != '\0'; t++)
        ck_assert_msg(isxdigit((unsigned char)*t), "REDLOCKD_TOKEN not hex: %s", line);
}

START_TEST(run_excludes)
{
    const char *marks;
    struct proc *p1, *p2;
    struct mark m[2];
    char buf[4096], *line, *save = NULL;
    int n = 0;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    marks = tmp_path("marks");
    p1 = ctl_start("-s", S, "run", "--wait", "10000", "cli:ex", "--",
                   "sh", "-c", MARK_SCRIPT, "sh", marks, NULL);
    p2 = ctl_start("-s", S, "run", "--wait", "10000", "cli:ex", "--",
                   "sh", "-c", MARK_SCRIPT, "sh", marks, NULL);
    proc_wait(p1, h_scale(15000));
    proc_wait(p2, h_scale(15000));
    assert_ok_quiet(p1, "first run --wait 10000");
    assert_ok_quiet(p2, "second run --wait 10000");

    ck_assert(read_file(marks, buf, sizeof(buf)));
    for (line = strtok_r(buf, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save), n++) {
        long pid;

        ck_assert_msg(n < 4, "more than 4 marks; line %d: %s", n + 1, line);
        if (n % 2 == 0) {
            struct mark *k = &m[n / 2];

            ck_assert_msg(sscanf(line, "start %ld %llu %63s %63s", &k->pid,
                                 &k->fence, k->token, k->resource) == 4,
                          "mark %d is not \"start PID FENCE TOKEN RESOURCE\": %s",
                          n + 1, line);
            check_token(k->token, line);
            ck_assert_str_eq(k->resource, "cli:ex");
        } else {
            ck_assert_msg(sscanf(line, "end %ld", &pid) == 1 && pid == m[n / 2].pid,
                          "mark %d is \"%s\", want \"end %ld\": the runs overlapped",
                          n + 1, line, m[n / 2].pid);
        }
    }
    ck_assert_msg(n == 4, "%d marks, want 4", n);
    ck_assert_msg(m[0].pid != m[1].pid, "the same command ran twice?");
    ck_assert_str_ne(m[0].token, m[1].token);
    ck_assert_msg(m[1].fence > m[0].fence, "REDLOCKD_FENCE went from %llu to %llu",
                  m[0].fence, m[1].fence);
    /* Both released their lock. */
    h_cluster_client(&K, 0, 0);
    assert_free("cli:ex");
}
END_TEST

/* ---- run: lock kinds ---- */

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    if (!f)
        return false;
    fputs(text, f);
    return fclose(f) == 0;
}

/* --shared runs hold together while an exclusive run is refused; --limit
 * hands out slots; -r takes several resources, all or none. */
START_TEST(run_kinds)
{
    const char *mark = NULL, *out2;
    struct proc *p1, *p2, *p3;
    char buf[4096];

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    mark = tmp_path("in");
    out2 = tmp_path("out2");
    /* Reader 1 holds until the file appears; reader 2 runs meanwhile. */
    p1 = ctl_start("-s", S, "run", "--shared", "cli:rw", "--", "sh", "-c",
                   "echo \"$REDLOCKD_MODE\" > \"$1.mode\"; "
                   "while [ ! -e \"$1\" ]; do sleep 0.02; done", "sh", mark,
                   NULL);
    h_cluster_client(&K, 0, 0);
    uint64_t t0 = h_now_ms();
    for (;;) {
        json_t *st = h_ok_json(A, "STATUS cli:rw");
        json_int_t n = h_json_int(st, "holders_here");
        json_decref(st);
        if (n == 1)
            break;
        ck_assert_msg(h_since(t0) < h_scale(5000), "reader 1 never held");
        h_sleep_ms(20);
    }
    p2 = ctl_start("-s", S, "run", "--shared", "cli:rw", "--", "sh", "-c",
                   "echo \"$REDLOCKD_FENCE\" > \"$1\"", "sh", out2, NULL);
    proc_wait(p2, h_scale(5000));
    assert_ok_quiet(p2, "a second --shared run");
    ck_assert(read_file(out2, buf, sizeof(buf)));
    p3 = ctl_start("-s", S, "run", "cli:rw", "--", "true", NULL);
    proc_wait(p3, h_scale(5000));
    assert_status(p3, EXIT_BUSY, "an exclusive run under a reader");
    ck_assert(write_file(mark, "x"));
    proc_wait(p1, h_scale(5000));
    assert_ok_quiet(p1, "the first --shared run");
    char path[512];
    snprintf(path, sizeof(path), "%s.mode", mark);
    ck_assert(read_file(path, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "shared\n");

    /* Semaphore: the slot in REDLOCKD_SLOT; K against a holder's K. */
    h_expect(A, "OK resource=cli:sem ", "LOCK cli:sem limit=2");
    p1 = ctl_start("-s", S, "run", "--limit", "2", "cli:sem", "--", "sh",
                   "-c", "echo \"$REDLOCKD_SLOT\" > \"$1\"", "sh", out2,
                   NULL);
    proc_wait(p1, h_scale(5000));
    assert_ok_quiet(p1, "run --limit 2");
    ck_assert(read_file(out2, buf, sizeof(buf)));
    ck_assert_msg(strcmp(buf, "0\n") == 0 || strcmp(buf, "1\n") == 0,
                  "REDLOCKD_SLOT=%s", buf);
    p1 = ctl_start("-s", S, "run", "--limit", "3", "cli:sem", "--", "true",
                   NULL);
    proc_wait(p1, h_scale(5000));
    assert_status(p1, EXIT_USAGE, "run --limit 3 against limit=2");
    ck_assert_ptr_nonnull(strstr(p1->err, "every holder must use the same "
                                 "limit"));

    /* Several resources: all of them for the command, then released. */
    p1 = ctl_start("-s", S, "run", "-r", "cli:a", "-r", "cli:b", "--", "sh",
                   "-c", "echo \"$REDLOCKD_RESOURCES|$REDLOCKD_RESOURCE\" > "
                   "\"$1\"", "sh", out2, NULL);
    proc_wait(p1, h_scale(5000));
    assert_ok_quiet(p1, "run -r cli:a -r cli:b");
    ck_assert(read_file(out2, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "cli:a cli:b|cli:a\n");
    h_expect(A, "OK resource=cli:b ", "LOCK cli:b");
    p1 = ctl_start("-s", S, "run", "-r", "cli:a", "-r", "cli:b", "--", "true",
                   NULL);
    proc_wait(p1, h_scale(5000));
    assert_status(p1, EXIT_BUSY, "run -r with one of them busy");
    assert_free("cli:a");
    p1 = ctl_start("-s", S, "status", "--shared", "cli:a", NULL);
    proc_wait(p1, h_scale(5000));
    assert_status(p1, EXIT_USAGE, "status --shared");
}
END_TEST

/* ---- run: busy lock, and the command's own status ---- */

START_TEST(run_busy)
{
    const char *marker;
    struct proc *p;
    uint64_t t0;
    long long took;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    marker = tmp_path("ran");
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK ", "HELLO name=other-holder");
    h_expect(A, "OK resource=cli:busy ", "LOCK cli:busy ttl=30000");

    p = ctl_start("-s", S, "run", "cli:busy", "--", "sh", "-c", "touch \"$1\"",
                  "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_BUSY, "run on a busy lock");
    ck_assert_msg(!file_exists(marker), "the command ran although the lock was busy");
    assert_one_error_line(p, "run on a busy lock");

    p = ctl_start("-s", S, "run", "-E", "3", "cli:busy", "--", "sh", "-c",
                  "touch \"$1\"", "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, 3, "run -E 3 on a busy lock");
    ck_assert_msg(!file_exists(marker), "the command ran although the lock was busy");

    /* -q: a cron job's quiet skip. */
    p = ctl_start("-s", S, "run", "-q", "cli:busy", "--", "sh", "-c",
                  "touch \"$1\"", "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_BUSY, "run -q on a busy lock");
    ck_assert_msg(p->err_len == 0 && p->out_len == 0, "-q printed: %s%s", p->out,
                  p->err);
    ck_assert_msg(!file_exists(marker), "the command ran although the lock was busy");

    /* The wait runs out: the same status, after the wait. */
    t0 = h_now_ms();
    p = ctl_start("-s", S, "run", "--wait", "400", "cli:busy", "--", "sh", "-c",
                  "touch \"$1\"", "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    took = h_since(t0);
    assert_status(p, EXIT_BUSY, "run --wait 400 on a busy lock");
    ck_assert_msg(took >= 380, "gave up after %lld ms of --wait 400", took);
    ck_assert_msg(!file_exists(marker), "the command ran although the lock was busy");
    assert_one_error_line(p, "run --wait 400 on a busy lock");

    /* Once free, the command runs. */
    h_expect(A, "OK resource=cli:busy ", "UNLOCK cli:busy");
    p = ctl_start("-s", S, "run", "cli:busy", "--", "sh", "-c", "touch \"$1\"",
                  "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "run on a free lock");
    ck_assert_msg(file_exists(marker), "the command did not run on a free lock");
    assert_free("cli:busy");
}
END_TEST

/* -E 0 treats a busy lock as success: the status is 0, but the command
 * must still not run (redlockctl(1): `run -E 0 -q db-migrate --
 * ./migrate.sh`). */
START_TEST(run_busy_exit_zero)
{
    const char *marker;
    struct proc *p;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    marker = tmp_path("ran");
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK resource=cli:busy0 ", "LOCK cli:busy0 ttl=30000");

    /* Long spelling after `run`, and -q: a cron job's quiet skip. */
    p = ctl_start("-s", S, "run", "--conflict-exit-code", "0", "-q", "cli:busy0",
                  "--", "sh", "-c", "touch \"$1\"", "sh", marker, NULL);
    proc_wait(p, h_scale(5000));
    ck_assert_msg(!file_exists(marker), "-E 0: the command ran although the lock "
                  "was busy (stderr: %s)", p->err);
    assert_status(p, 0, "run --conflict-exit-code 0 -q on a busy lock");
    ck_assert_msg(p->err_len == 0 && p->out_len == 0, "-q printed: %s%s", p->out,
                  p->err);

    h_expect(A, "OK resource=cli:busy0 ", "UNLOCK cli:busy0");
}
END_TEST

START_TEST(run_exit_status)
{
    struct proc *p;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);

    p = ctl_start("-s", S, "run", "cli:st", "--", "sh", "-c", "exit 42", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, 42, "run -- sh -c 'exit 42'");
    ck_assert_msg(p->err_len == 0, "stderr: %s", p->err);
    assert_free("cli:st");

    p = ctl_start("-s", S, "run", "cli:st", "--", "sh", "-c", "kill -USR1 $$", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, 128 + SIGUSR1, "a command killed by SIGUSR1");
    assert_free("cli:st");

    /* No "--": the command starts at the first word after RESOURCE. */
    p = ctl_start("-s", S, "run", "cli:st", "true", NULL);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "run RESOURCE true");

    p = ctl_start("-s", S, "run", "cli:st", "--", "/nonexistent/redlockd-test",
                  NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, 127, "a command that does not exist");
    assert_free("cli:st");
}
END_TEST

/* ---- run: signals ---- */

/* `run --ttl TTL RESOURCE` of a command that writes its pid and sleeps;
 * the command's pid in *cmd once it runs. */
static struct proc *run_sleeper(const char *res, const char *ttl, long *cmd)
{
    const char *pidf = tmp_path("pid");
    struct proc *p;

    unlink(pidf);
    p = ctl_start("-s", S, "run", "--on-lost", "kill", "--ttl", ttl, res, "--",
                  "sh", "-c", "echo $$ > \"$1\"; exec sleep 30", "sh", pidf, NULL);
    *cmd = wait_file_number(pidf, h_scale(5000));
    return p;
}

/* Does any process of the process group pgid still run? Zombies do not
 * count: an orphan's exit status may wait a while for a slow init, but it
 * has closed its files (the lock connection among them). */
static bool group_alive(long pgid)
{
    DIR *d;
    struct dirent *e;
    bool alive = false;

    if (kill(-(pid_t)pgid, 0) < 0 && errno == ESRCH)
        return false;
    d = opendir("/proc");
    ck_assert_msg(d != NULL, "/proc: %s", strerror(errno));
    while (!alive && (e = readdir(d)) != NULL) {
        char path[300], buf[1024], state;
        const char *paren;
        long ppid, pgrp;

        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        if (!read_file(path, buf, sizeof(buf)) || !(paren = strrchr(buf, ')')))
            continue;
        if (sscanf(paren + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3 &&
            pgrp == pgid && state != 'Z' && state != 'X')
            alive = true;
    }
    closedir(d);
    return alive;
}

/* Wait up to timeout_ms for the group to be empty (every process of it
 * exited). */
static bool wait_group_gone(long pgid, int timeout_ms)
{
    uint64_t t0 = h_now_ms();

    while (group_alive(pgid)) {
        if (h_since(t0) >= timeout_ms)
            return false;
        h_sleep_ms(5);
    }
    return true;
}

/* The end of a test that started a command's process group: SIGKILL what is
 * left of it (nothing, when all went well). The group is the one redlockctl
 * made for the command the test started, led by the pid the command wrote. */
static void kill_group(long pgid)
{
    if (pgid > 1)
        kill(-(pid_t)pgid, SIGKILL);
}

/*
 * The command exits at once, leaving a process of its group behind (a
 * `sleep &`): redlockctl keeps the lock until that process exits too, then
 * unlocks and exits with the command's status.
 */
START_TEST(run_waits_for_group)
{
    const char *pidf, *donef;
    struct proc *p;
    uint64_t t0;
    long pgid;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    pidf = tmp_path("pid");
    donef = tmp_path("done");
    h_cluster_client(&K, 0, 0);
    t0 = h_now_ms();
    p = ctl_start("-s", S, "run", "--ttl", "600", "cli:grp", "--", "sh", "-c",
                  "echo $$ > \"$1\"; (sleep 1.5; echo done > \"$2\") & exit 3",
                  "sh", pidf, donef, NULL);
    pgid = wait_file_number(pidf, h_scale(5000));
    h_sleep_ms(300);
    ck_assert_msg(!proc_exited(p, 0), "redlockctl exited with the command, "
                  "while its group still runs");
    for (int i = 0; i < 2; i++) {
        h_expect(A, "ERR BUSY", "LOCK cli:grp ttl=30000");
        ck_assert_msg(group_alive(pgid) && !file_exists(donef), "the group "
                      "ended %lld ms after it started, before the check",
                      h_since(t0));
        h_sleep_ms(500);
    }
    proc_wait(p, h_scale(5000));
    assert_status(p, 3, "redlockctl after the group ended");
    ck_assert_msg(file_exists(donef), "redlockctl exited before the group");
    h_expect(A, "OK resource=cli:grp ", "LOCK cli:grp ttl=30000");
}
END_TEST

/*
 * SIGKILL of redlockctl's keeper (the process that holds the lock: the
 * command's parent; redlockctl then exits too) leaves no process to UNLOCK,
 * nor to stop the command: the command inherited the lock connection, so
 * the daemon keeps the lock (and renews it, past several ttls) while any
 * process holding that connection runs, and releases it once the last one
 * has exited and the session's --detach time has run out. (With the
 * keeper alive, the lock goes as soon as the group is empty: the
 * run_keeper_* tests.) Here the command's shell waits for its child
 * `sleep` and then writes a file: both must outlive redlockctl.
 */
START_TEST(run_sigkill_keeps_lock)
{
    const char *pidf, *donef, *fdf;
    char buf[256];
    struct proc *p;
    long long took, free_after;
    uint64_t t0;
    long pgid, keeper, ctl;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    pidf = tmp_path("pid");
    donef = tmp_path("done");
    fdf = tmp_path("fd");
    h_cluster_client(&K, 0, 0);
    t0 = h_now_ms();
    p = ctl_start("-s", S, "run", "--ttl", "600", "--detach", "1000", "cli:kill",
                  "--", "sh", "-c",
                  "readlink \"/proc/$$/fd/$REDLOCKD_LOCK_FD\" > \"$3\"; "
                  "echo $$ > \"$1\"; sleep 2; echo done > \"$2\"",
                  "sh", pidf, donef, fdf, NULL);
    pgid = wait_file_number(pidf, h_scale(5000));
    h_expect(A, "ERR BUSY", "LOCK cli:kill ttl=30000");

    /* The keeper first: redlockctl says so and exits as the keeper did.
     * (Without a keeper, the command's parent is redlockctl itself.) */
    keeper = ppid_of(pgid);
    ctl = p->pid;
    ck_assert_msg(keeper > 1, "the command has no parent");
    ck_assert_int_eq(kill((pid_t)keeper, SIGKILL), 0);
    proc_wait(p, h_scale(5000));
    assert_status(p, 128 + SIGKILL, "redlockctl after its keeper's SIGKILL");
    ck_assert_msg(keeper == ctl || strstr(p->err, "keeper (pid"),
                  "redlockctl did not say its keeper was killed: %s", p->err);
    /* Still held right after the kill, and still after more than two ttls
     * without redlockctl (the daemon renews the lease of the connection
     * the command holds), while the command's `sleep` runs. */
    for (int i = 0; i < 2; i++) {
        h_sleep_ms(i == 0 ? 200 : 1200);
        h_expect(A, "ERR BUSY", "LOCK cli:kill ttl=30000");
        ck_assert_msg(group_alive(pgid) && !file_exists(donef),
                      "the command (group %ld) ended %lld ms after it started, "
                      "before the check", pgid, h_since(t0));
    }
    fprintf(stderr, "run_sigkill_keeps_lock: still BUSY %lld ms after the "
            "command started, redlockctl long dead\n", h_since(t0));

    /* The command was not stopped: it finishes its work, and its exit
     * detaches the session, which ends (freeing the lock) 1000 ms later. */
    ck_assert_msg(wait_group_gone(pgid, h_scale(5000)),
                  "the command (group %ld) still runs %lld ms after it started",
                  pgid, h_since(t0));
    free_after = h_since(t0);
    ck_assert_msg(read_file(donef, buf, sizeof(buf)) && strcmp(buf, "done\n") == 0,
                  "the command did not finish its work (file: \"%s\")", buf);
    took = lock_within(A, "cli:kill", h_scale(3000));
    fprintf(stderr, "run_sigkill_keeps_lock: the command ended %lld ms after it "
            "started, the lock free %lld ms later\n", free_after, took);
    ck_assert_msg(took >= 900, "the lock was free %lld ms after the command "
                  "ended, before --detach 1000 ran out", took);
    h_expect(A, "OK resource=cli:kill ", "UNLOCK cli:kill");
    /* REDLOCKD_LOCK_FD named the inherited connection. */
    ck_assert_msg(read_file(fdf, buf, sizeof(buf)) && h_starts(buf, "socket:["),
                  "$REDLOCKD_LOCK_FD is not a socket in the command: \"%s\"", buf);
    kill_group(pgid);
}
END_TEST

START_TEST(run_sigterm_forwarded)
{
    static const int sigs[] = { SIGTERM, SIGINT };
    const char *mark, *ready;
    char buf[256];
    struct proc *p;
    long cmd;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    mark = tmp_path("term");
    ready = tmp_path("ready");
    h_cluster_client(&K, 0, 0);

    /* The command traps TERM and says so; the loop's sleep gets TERM too
     * (sent to the command's process group), so the trap runs at once. */
    p = ctl_start("-s", S, "run", "cli:term", "--", "sh", "-c",
                  "trap 'echo term >> \"$1\"; exit 3' TERM; echo $$ > \"$2\"; "
                  "while :; do sleep 0.05; done", "sh", mark, ready, NULL);
    wait_file_number(ready, h_scale(5000));
    kill(p->pid, SIGTERM);
    proc_wait(p, h_scale(5000));
    assert_status(p, 3, "SIGTERM to redlockctl, command traps it and exits 3");
    ck_assert_msg(read_file(mark, buf, sizeof(buf)) && strcmp(buf, "term\n") == 0,
                  "the command's TERM trap did not run (marker: \"%s\")", buf);
    assert_free("cli:term");

    /* Not trapped, the command dies of it and redlockctl says 128+N; SIGINT
     * (Ctrl-C) is passed on the same way. */
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        p = run_sleeper("cli:term", "30000", &cmd);
        kill(p->pid, sigs[i]);
        proc_wait(p, h_scale(5000));
        assert_status(p, 128 + sigs[i], strsignal(sigs[i]));
        assert_free("cli:term");
    }
}
END_TEST

/* ---- run: the lease is lost while the command runs ---- */

/* redlockctl p exits 70 within timeout_ms, saying `word`, and its command
 * cmd goes with it; returns how long the exit took. */
static long long assert_stopped_lost(struct proc *p, long cmd, int timeout_ms,
                                     const char *word, const char *what)
{
    uint64_t t0 = h_now_ms();
    long long took;

    proc_wait(p, h_scale(10000));
    took = h_since(t0);
    fprintf(stderr, "%s: redlockctl exited after %lld ms; it said: %s", what, took,
            p->err);
    assert_status(p, EXIT_LOST, what);
    ck_assert_msg(took < timeout_ms, "%s: redlockctl took %lld ms", what, took);
    ck_assert_msg(h_starts(p->err, "redlockctl:") && strstr(p->err, word),
                  "%s: no message saying \"%s\": %s", what, word, p->err);
    ck_assert_msg(wait_pid_gone((pid_t)cmd, h_scale(3000)),
                  "%s: the command (pid %ld) still runs", what, cmd);
    return took;
}

START_TEST(run_lease_lost)
{
    struct proc *p;
    long cmd;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    p = run_sleeper("cli:lost", "1500", &cmd);
    /* One node of three left: no renewal can reach a quorum. */
    h_redis_pause(&R[1]);
    h_redis_pause(&R[2]);
    assert_stopped_lost(p, cmd, h_scale(6000), "lost",
                        "run_lease_lost, ttl 1500, after the pause");
    h_redis_resume(&R[1]);
    h_redis_resume(&R[2]);
}
END_TEST

/* ---- run: the daemon stalls ---- */

/* Appends the wall-clock time in ns every 10 ms until it is killed: each
 * line is a write the command made while it believed it held the lock. */
#define STAMP_SCRIPT \
    "echo $$ > \"$2\"; while :; do date +%s%N >> \"$1\"; sleep 0.01; done"

/* CLOCK_REALTIME in ns, the clock `date +%s%N` reads. */
static long long wall_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The number on the last complete line of a file (0 if there is none). */
static long long last_number(const char *path)
{
    static char buf[1 << 20];
    char *end, *start;

    if (!read_file(path, buf, sizeof(buf)) || !(end = strrchr(buf, '\n')))
        return 0;
    *end = '\0';
    start = strrchr(buf, '\n');
    return strtoll(start ? start + 1 : buf, NULL, 10);
}

/*
 * Safety issue 6: `run --ttl 2000` whose daemon is SIGSTOPped. Nobody
 * renews the lease, so a second daemon on the same nodes grants the lock
 * once the keys expire on Redis. redlockctl must have stopped the command
 * by then: at the lease deadline (the send time of its last confirmation
 * plus the validity reported), at most ttl after the last confirmation,
 * which came before the pause.
 */
START_TEST(run_daemon_stalled)
{
    const int ttl = 2000;
    const char *stamps, *pidf;
    long long paused, granted = 0, last, try_at;
    struct proc *p;
    uint64_t t0;
    bool exited;
    long cmd;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(NULL);
    h_cluster_daemon(&K, 1, NULL, h_scale(5000));
    stamps = tmp_path("stamps");
    pidf = tmp_path("pid");
    p = ctl_start("-s", S, "run", "--ttl", "2000", "cli:stall", "--", "sh", "-c",
                  STAMP_SCRIPT, "sh", stamps, pidf, NULL);
    cmd = wait_file_number(pidf, h_scale(5000));
    /* Past the first renewals and confirmations. */
    h_sleep_ms(1000);
    h_cluster_client(&K, 1, 1);
    h_expect(B, "ERR BUSY", "LOCK cli:stall ttl=30000");

    paused = wall_ns();
    t0 = h_now_ms();
    ck_assert_int_eq(kill(D->pid, SIGSTOP), 0);
    /* The other daemon takes the lock as soon as Redis lets it; the time a
     * successful LOCK was sent is a lower bound of its grant. */
    while (granted == 0) {
        char *line;

        try_at = wall_ns();
        line = h_cmd(B, "LOCK cli:stall ttl=30000");
        if (h_starts(line, "OK "))
            granted = try_at;
        else
            ck_assert_msg(h_starts(line, "ERR BUSY"), "LOCK on the second daemon: %s",
                          line);
        ck_assert_msg(h_since(t0) < h_scale(3 * ttl), "the second daemon could "
                      "not take the lock %d ms after the first one stopped",
                      h_scale(3 * ttl));
        h_sleep_ms(2);
    }
    exited = proc_exited(p, h_scale(ttl + 1000) - (int)h_since(t0));
    /* Its group is gone with it; let a straggler's write land. */
    ck_assert_msg(!exited || wait_pid_gone((pid_t)cmd, h_scale(3000)),
                  "the command (pid %ld) still runs after redlockctl ended", cmd);
    h_sleep_ms(50);
    last = last_number(stamps);
    fprintf(stderr, "run_daemon_stalled: after the pause: the command's last write "
            "%lld ms, the other daemon's grant %lld ms, redlockctl %s\n",
            (last - paused) / 1000000, (granted - paused) / 1000000,
            exited ? "exited" : "still running");
    fprintf(stderr, "run_daemon_stalled: redlockctl said: %s", p->err);
    ck_assert_msg(last > paused, "no write from the command before the pause");
    ck_assert_msg(last < granted, "the command wrote %lld ms after another daemon "
                  "granted its lock (the last write %lld ms after the pause)",
                  (last - granted) / 1000000, (last - paused) / 1000000);
    ck_assert_msg(last - paused <= (long long)h_scale(ttl + 100) * 1000000,
                  "the command wrote %lld ms after the pause, ttl is %d ms",
                  (last - paused) / 1000000, ttl);
    ck_assert_msg(exited, "redlockctl still running %d ms after its daemon stopped; "
                  "stderr: %s", h_scale(ttl + 1000), p->err);
    assert_status(p, EXIT_LOST, "run whose daemon stopped");
    ck_assert_msg(strstr(p->err, "lost"), "no message about the lost lease: %s",
                  p->err);
    ck_assert_int_eq(kill(D->pid, SIGCONT), 0);
}
END_TEST

/* The process of redlockctl that confirms the lease (its keeper, the
 * command's parent) stopped past the lease deadline: when it runs again,
 * the command has been running unconfirmed, and is stopped at once. */
START_TEST(run_ctl_stopped)
{
    struct proc *p;
    long cmd, keeper;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    p = run_sleeper("cli:ctlstop", "1000", &cmd);
    keeper = ppid_of(cmd);
    ck_assert_msg(keeper > 1, "the command has no parent");
    ck_assert_int_eq(kill((pid_t)keeper, SIGSTOP), 0);
    h_sleep_ms(1500);
    ck_assert_int_eq(kill((pid_t)keeper, SIGCONT), 0);
    assert_stopped_lost(p, cmd, h_scale(500), "deadline",
                        "run_ctl_stopped, ttl 1000, after it resumed");
    /* The connection closed, so the daemon let the lock go. */
    h_cluster_client(&K, 0, 0);
    assert_free("cli:ctlstop");
}
END_TEST

/* ---- run: the keeper (issue 28) ---- */

/* A LOCK with wait= sent now, its answer read later (lock_answer). */
static void lock_ask(struct h_client *c, const char *res, int wait_ms)
{
    h_sendf(c, "LOCK %s ttl=30000 wait=%d\n", res, wait_ms);
}

/* The answer to lock_ask, asserted to be a grant within timeout_ms; the
 * wall-clock time it arrived (an upper bound of the grant's) in ns. */
static long long lock_answer(struct h_client *c, const char *res,
                             int timeout_ms)
{
    char *line = h_recv_line(c, timeout_ms);

    ck_assert_msg(line != NULL, "LOCK %s wait=: no answer in %d ms", res,
                  timeout_ms);
    ck_assert_msg(h_starts(line, "OK "), "LOCK %s wait=: %s", res, line);
    return wall_ns();
}

/*
 * The issue's case: the command starts a worker as Python's
 * subprocess.Popen does by default (close_fds: it does not hold the lock
 * connection; the same process group), redlockctl gets SIGKILL at 0.5 s,
 * the command exits at 1 s, the worker writes every 50 ms until 2.5 s.
 * Another client waiting for the lock must not be granted it while the
 * worker writes (the group still runs), and must be granted it within a
 * second of the worker's last write (the keeper releases it at once, not
 * after --detach).
 */
START_TEST(run_keeper_close_fds)
{
    const char *stamps, *pidf;
    long long killed, granted, last;
    struct proc *p;
    long pgid;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    stamps = tmp_path("stamps");
    pidf = tmp_path("pid");
    h_cluster_client(&K, 0, 0);
    p = ctl_start("-s", S, "run", "--ttl", "2000", "--detach", "1000",
                  "cli:cfd", "--", "sh", "-c",
                  "\"$1\" \"$2\" 2500 & echo $$ > \"$3\"; sleep 1",
                  "job", env_bin("STAMPER_BIN"), stamps, pidf, NULL);
    pgid = wait_file_number(pidf, h_scale(5000));
    h_expect(A, "ERR BUSY", "LOCK cli:cfd ttl=30000");
    h_sleep_ms(500);
    ck_assert_int_eq(kill(p->pid, SIGKILL), 0);
    killed = wall_ns();
    proc_wait(p, h_scale(5000));
    assert_status(p, 128 + SIGKILL, "redlockctl after SIGKILL");

    lock_ask(A, "cli:cfd", h_scale(8000));
    granted = lock_answer(A, "cli:cfd", h_scale(10000));
    ck_assert_msg(wait_group_gone(pgid, h_scale(5000)), "the command's group "
                  "%ld still runs 5 s after the grant", pgid);
    last = last_number(stamps);
    fprintf(stderr, "run_keeper_close_fds: after redlockctl's SIGKILL: the "
            "worker's last write %lld ms, another client's grant %lld ms\n",
            (last - killed) / 1000000, (granted - killed) / 1000000);
    ck_assert_msg(last > killed, "the worker wrote nothing after the SIGKILL");
    ck_assert_msg(last < granted, "another client was granted the lock while "
                  "the command's worker still wrote: its last write came %lld "
                  "ms after the grant", (last - granted) / 1000000);
    ck_assert_msg(granted - last < (long long)h_scale(1000) * 1000000,
                  "the lock was granted %lld ms after the worker's last write",
                  (granted - last) / 1000000);
    h_expect(A, "OK resource=cli:cfd ", "UNLOCK cli:cfd");
    kill_group(pgid);
}
END_TEST

/*
 * The command's group ends after a SIGKILL of redlockctl, which asked for
 * no --detach (the session would be kept 30 s after its connection closed):
 * the lock is released at once, as when redlockctl lives.
 */
START_TEST(run_keeper_release_at_once)
{
    const char *pidf;
    long long took;
    struct proc *p;
    uint64_t gone;
    long pgid;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    pidf = tmp_path("pid");
    h_cluster_client(&K, 0, 0);
    p = ctl_start("-s", S, "run", "--ttl", "2000", "cli:once", "--", "sh", "-c",
                  "echo $$ > \"$1\"; sleep 1", "sh", pidf, NULL);
    pgid = wait_file_number(pidf, h_scale(5000));
    h_expect(A, "ERR BUSY", "LOCK cli:once ttl=30000");
    ck_assert_int_eq(kill(p->pid, SIGKILL), 0);
    proc_wait(p, h_scale(5000));
    lock_ask(A, "cli:once", h_scale(4000));
    ck_assert_msg(wait_group_gone(pgid, h_scale(5000)), "the command (group "
                  "%ld) still runs", pgid);
    gone = h_now_ms();
    lock_answer(A, "cli:once", h_scale(6000));
    took = h_since(gone);
    fprintf(stderr, "run_keeper_release_at_once: granted %lld ms after the "
            "group was seen gone\n", took);
    ck_assert_msg(took < h_scale(500), "the lock was granted %lld ms after "
                  "the command's group ended", took);
    h_expect(A, "OK resource=cli:once ", "UNLOCK cli:once");
}
END_TEST

/*
 * redlockctl itself stopped (SIGSTOP; Ctrl-Z stops it the same way) for
 * longer than the lease's ttl costs nothing: the keeper, in a process
 * group of its own, confirms the lease all along, so redlockctl does not
 * stop the command when it is continued, and the lock stays held.
 */
START_TEST(run_keeper_ctl_stopped)
{
    struct proc *p;
    long cmd;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    p = run_sleeper("cli:ctlstop", "1000", &cmd);
    ck_assert_int_eq(kill(p->pid, SIGSTOP), 0);
    h_sleep_ms(1500);
    h_expect(A, "ERR BUSY", "LOCK cli:ctlstop ttl=30000");
    ck_assert_int_eq(kill(p->pid, SIGCONT), 0);
    ck_assert_msg(!proc_exited(p, 500), "redlockctl exited %d after SIGCONT: "
                  "%s", p->status, p->err);
    ck_assert_msg(!pid_gone((pid_t)cmd), "the command was stopped");
    h_expect(A, "ERR BUSY", "LOCK cli:ctlstop ttl=30000");
    kill(p->pid, SIGTERM);
    proc_wait(p, h_scale(5000));
    assert_status(p, 128 + SIGTERM, "redlockctl SIGTERMed after SIGCONT");
    ck_assert_msg(p->err_len == 0, "redlockctl said: %s", p->err);
    assert_free("cli:ctlstop");
}
END_TEST

/*
 * redlockctl(1): SIGINT, SIGTERM and SIGHUP go to the command's process
 * group. After the command itself has exited, the keeper holds the lock
 * for the rest of its group (a `sleep 30 &` here): SIGTERM, then SIGHUP,
 * to redlockctl reaches that rest too, so the group ends, the lock is
 * released and redlockctl exits with the command's status at once, not
 * when the straggler ends by itself.
 */
START_TEST(run_signal_after_command)
{
    static const int sigs[] = { SIGTERM, SIGHUP };
    const char *pidf;
    struct proc *p;
    long long took;
    uint64_t t0;
    long pgid;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    pidf = tmp_path("pid");
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        unlink(pidf);
        p = ctl_start("-s", S, "run", "cli:rest", "--", "sh", "-c",
                      "echo $$ > \"$1\"; sleep 30 & exit 3", "sh", pidf, NULL);
        pgid = wait_file_number(pidf, h_scale(5000));
        ck_assert_msg(wait_pid_gone((pid_t)pgid, h_scale(5000)),
                      "the command (pid %ld) did not exit", pgid);
        h_sleep_ms(100);
        h_expect(A, "ERR BUSY", "LOCK cli:rest ttl=30000");
        t0 = h_now_ms();
        ck_assert_int_eq(kill(p->pid, sigs[i]), 0);
        if (!proc_exited(p, h_scale(3000))) {
            took = h_since(t0);
            kill_group(pgid);
            proc_wait(p, h_scale(5000));
            ck_abort_msg("%s to redlockctl after its command exited: still "
                         "running %lld ms later, its group (%ld) untouched; "
                         "stderr: %s", strsignal(sigs[i]), took, pgid, p->err);
        }
        took = h_since(t0);
        fprintf(stderr, "run_signal_after_command: %s: redlockctl exited %lld "
                "ms after it\n", strsignal(sigs[i]), took);
        assert_status(p, 3, "redlockctl after a signal to the rest of the group");
        ck_assert_msg(wait_group_gone(pgid, h_scale(1000)), "the rest of the "
                      "command's group (%ld) still runs", pgid);
        assert_free("cli:rest");
        kill_group(pgid);
    }
}
END_TEST

/*
 * The command ends within its lease, just as its daemon stops (SIGSTOP):
 * the final UNLOCK waits for the daemon past the lease's deadline, and the
 * daemon, continued, answers that the lease was lost. The loss came after
 * the command's group ended, so it cost the command nothing: redlockctl
 * exits with the command's status, not 70.
 */
START_TEST(run_unlock_after_deadline)
{
    const int ttl = 2000;
    struct proc *p;
    long cmd;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    p = ctl_start("-s", S, "--timeout", "10s", "run", "--ttl", "2000",
                  "cli:late", "--", "sh", "-c",
                  "echo $$ > \"$1\"; exec sleep 30", "sh",
                  tmp_path("pid"), NULL);
    cmd = wait_file_number(tmp_path("pid"), h_scale(5000));
    h_sleep_ms(300);
    ck_assert_int_eq(kill(D->pid, SIGSTOP), 0);
    ck_assert_int_eq(kill((pid_t)cmd, SIGTERM), 0);
    ck_assert_msg(wait_pid_gone((pid_t)cmd, h_scale(2000)), "the command "
                  "(pid %ld) still runs", cmd);
    /* The UNLOCK waits for the stopped daemon, past the lease deadline. */
    h_sleep_ms(ttl + 500);
    ck_assert_msg(!proc_exited(p, 0), "redlockctl exited (%d) while its "
                  "daemon was stopped: %s", p->status, p->err);
    ck_assert_int_eq(kill(D->pid, SIGCONT), 0);
    proc_wait(p, h_scale(10000));
    fprintf(stderr, "run_unlock_after_deadline: redlockctl said: %s", p->err);
    assert_status(p, 128 + SIGTERM, "run whose command ended within its "
                  "lease, its release answered after the deadline");
}
END_TEST

/* ---- run: failover ---- */

#define FAILOVER_JSON "{\"shutdown_timeout_ms\":500}"

/* D and D2 on the same nodes, each with a short shutdown_timeout_ms (a
 * lease still held delays a stopping daemon's exit by that much); B is
 * connected to D2. The address of D2 into s2. */
static void start_two_daemons(char *s2, size_t size)
{
    start_daemon(FAILOVER_JSON);
    h_cluster_daemon(&K, 1, FAILOVER_JSON, h_scale(5000));
    snprintf(s2, size, "127.0.0.1:%d", D2->port);
    h_cluster_client(&K, 1, 1);
}

/* `run` of a command that runs 3 s undisturbed, then writes "done". */
#define FAILOVER_CMD "echo $$ > \"$1\"; sleep 3; echo done > \"$2\""

/* res is BUSY for another client (B) while the command of redlockctl p
 * runs (it has not written donef by the time the answer came: after
 * that, redlockctl releases the lock); else what redlockctl and the
 * daemons said. */
static void busy_for(struct proc *p, const char *res, const char *donef)
{
    char *line = h_cmd(B, "LOCK %s ttl=30000", res);

    if (h_starts(line, "ERR BUSY"))
        return;
    if (h_starts(line, "OK ") && file_exists(donef)) {
        h_expect(B, "OK resource=", "UNLOCK %s", res);
        return;
    }
    proc_drain(p);
    h_daemon_dump_log(D);
    h_daemon_dump_log(D2);
    ck_abort_msg("LOCK %s on the other daemon answered \"%s\" while "
                 "redlockctl (pid %ld) held it; its stderr: %s", res, line,
                 (long)p->pid, p->err);
}

/* Until redlockctl p exits: res is BUSY for another client (B) every
 * 20 ms. */
static void busy_until_exit(struct proc *p, const char *res,
                            const char *donef)
{
    uint64_t t0 = h_now_ms();

    while (!proc_exited(p, 20)) {
        busy_for(p, res, donef);
        ck_assert_msg(h_since(t0) < h_scale(10000), "redlockctl still running "
                      "10 s on; stderr: %s", p->err);
    }
}

/* redlockctl holds res through the first daemon, D (asked with A). */
static void assert_held_on_first(const char *res)
{
    json_t *st;

    h_cluster_client(&K, 0, 0);
    st = h_ok_json(A, "STATUS %s", res);
    ck_assert_msg(h_json_int(st, "holders_here") == 1, "%s is not held through "
                  "the first daemon", res);
    json_decref(st);
    h_close(A);
}

/* The command ran its 3 s to the end, redlockctl exited 0 without a word,
 * and released the lock. */
static void assert_rode_through(const struct proc *p, const char *donef,
                                const char *res, long long took)
{
    char buf[64];

    assert_ok_quiet(p, p->cmdline);
    ck_assert_msg(read_file(donef, buf, sizeof(buf)) && strcmp(buf, "done\n") == 0,
                  "the command did not finish its work (file: \"%s\")", buf);
    ck_assert_msg(took >= 3000, "the command ended after %lld ms, before its "
                  "3 s sleep", took);
    h_expect(B, "OK resource=", "LOCK %s ttl=30000", res);
    h_expect(B, "OK resource=", "UNLOCK %s", res);
}

/*
 * redlockctl -s A -s B run, while A and then B are stopped (SIGTERM) and
 * started again, as a rolling restart does: the command is not
 * interrupted, and another client gets BUSY all along (redlockctl adopts
 * the lease on the other daemon, or on the restarted one).
 */
START_TEST(run_failover_restart)
{
    const char *pidf, *donef;
    char s2[64];
    struct proc *p;
    uint64_t t0, start;
    int checks = 0;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons(s2, sizeof(s2));
    pidf = tmp_path("pid");
    donef = tmp_path("done");
    start = h_now_ms();
    p = ctl_start("-s", S, "-s", s2, "run", "cli:fo", "--", "sh", "-c",
                  FAILOVER_CMD, "sh", pidf, donef, NULL);
    wait_file_number(pidf, h_scale(5000));
    busy_for(p, "cli:fo", donef);
    assert_held_on_first("cli:fo");

    t0 = h_now_ms();
    ck_assert_int_eq(kill(D->pid, SIGTERM), 0);
    while (!pid_gone(D->pid)) {
        busy_for(p, "cli:fo", donef);
        checks++;
        ck_assert_msg(h_since(t0) < h_scale(5000), "redlockd still running");
        h_sleep_ms(20);
    }
    ck_assert_int_eq(h_daemon_wait(D, 5000), 0);
    fprintf(stderr, "run_failover_restart: A stopped in %lld ms (%d BUSY "
            "checks)\n", h_since(t0), checks);
    h_daemon_restart(D);
    h_wait_voting(D, K.nnodes, h_scale(5000));
    busy_for(p, "cli:fo", donef);
    /* Then B's daemon, as a rolling restart goes on: the checker moves to
     * the restarted A. */
    h_close(B);
    h_cluster_client(&K, 1, 0);
    busy_for(p, "cli:fo", donef);
    ck_assert_int_eq(h_daemon_stop(D2), 0);
    h_daemon_restart(D2);
    busy_until_exit(p, "cli:fo", donef);
    assert_rode_through(p, donef, "cli:fo", h_since(start));
}
END_TEST

/*
 * The same with the daemons in $REDLOCKD_SERVER (a comma list) and A
 * killed (SIGKILL) for good: redlockctl adopts the lease on B.
 */
START_TEST(run_failover_kill)
{
    const char *pidf, *donef;
    char s2[64], list[160];
    struct proc *p;
    uint64_t start;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons(s2, sizeof(s2));
    snprintf(list, sizeof(list), "%s,%s", S, s2);
    server_env = list;
    pidf = tmp_path("pid");
    donef = tmp_path("done");
    start = h_now_ms();
    p = ctl_start("run", "cli:fk", "--", "sh", "-c", FAILOVER_CMD, "sh", pidf,
                  donef, NULL);
    wait_file_number(pidf, h_scale(5000));
    busy_for(p, "cli:fk", donef);
    assert_held_on_first("cli:fk");
    h_daemon_kill(D);
    /* With A gone, the list's next daemon answers the other commands. */
    ctl_ok("PONG", "ping", NULL);
    busy_until_exit(p, "cli:fk", donef);
    assert_rode_through(p, donef, "cli:fk", h_since(start));
}
END_TEST

/*
 * `run --wait` through two daemons, waiting on the first (another client
 * holds the lock through the second): when the first stops (SIGTERM: its
 * LOCK is answered ERR SHUTDOWN) or dies (SIGKILL: the connection breaks
 * with the LOCK in flight), redlockctl sends the LOCK again through the
 * second daemon, within what is left of --wait, and runs its command once
 * the holder lets go, instead of giving up (69).
 */
START_TEST(run_lock_fails_over)
{
    static const int sigs[] = { SIGTERM, SIGKILL };
    const char *pidf;
    char s2[64];
    struct proc *p;
    json_t *st;
    uint64_t t0;

    h_cluster_nodes(&K, 3, NULL);
    start_two_daemons(s2, sizeof(s2));
    pidf = tmp_path("pid");
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        unlink(pidf);
        h_expect(B, "OK resource=", "LOCK cli:lfo ttl=30000");
        p = ctl_start("-s", S, "-s", s2, "run", "--wait", "20s", "cli:lfo",
                      "--", "sh", "-c", "echo $$ > \"$1\"", "sh", pidf, NULL);
        /* Its LOCK waits on the first daemon. */
        h_cluster_client(&K, 0, 0);
        t0 = h_now_ms();
        for (;;) {
            st = h_ok_json(A, "STATUS cli:lfo");
            if (h_json_int(st, "waiters") == 1)
                break;
            json_decref(st);
            ck_assert_msg(h_since(t0) < h_scale(5000), "no LOCK waits on "
                          "the first daemon");
            h_sleep_ms(10);
        }
        json_decref(st);
        h_close(A);
        if (sigs[i] == SIGKILL) {
            h_daemon_kill(D);
        } else {
            ck_assert_int_eq(kill(D->pid, SIGTERM), 0);
            ck_assert_int_eq(h_daemon_wait(D, h_scale(5000)), 0);
        }
        h_sleep_ms(500);
        ck_assert_msg(!proc_exited(p, 0), "%s of the daemon its LOCK waited "
                      "on: redlockctl exited %d; stderr: %s",
                      strsignal(sigs[i]), p->status, p->err);
        h_expect(B, "OK resource=", "UNLOCK cli:lfo");
        proc_wait(p, h_scale(5000));
        assert_ok_quiet(p, p->cmdline);
        ck_assert_msg(file_exists(pidf), "the command did not run");
        h_daemon_restart(D);
        h_wait_voting(D, K.nnodes, h_scale(5000));
    }
}
END_TEST

/* ---- status, sessions, stats, ping ---- */

/* The line of p's output that starts with `label`, or fail. */
static const char *line_of(const struct proc *p, const char *label)
{
    const char *l = p->out;

    for (; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (h_starts(l, label))
            return l;
    ck_abort_msg("%s: no line starting \"%s\" in: %s", p->cmdline, label,
                 p->out);
    return NULL;
}

/* `stats` with one lock held (by A) and one grant before: the short
 * table (redlockctl(1)), not the 300 lines of every counter. */
static void stats_table(void)
{
    struct proc *p = ctl_ok("NODE", "-s", S, "stats", NULL);
    char node[80];
    int n;

    ck_assert_msg(count_lines(p->out) <= 12 + K.nnodes, "stats printed %d lines: %s",
                  count_lines(p->out), p->out);
    ck_assert_msg(!strstr(p->out, "acquire_seconds") && !strstr(p->out, ".le."),
                  "stats shows histogram internals: %s", p->out);
    ck_assert_msg(h_starts(line_of(p, "daemon"), "daemon        redlockd "
                           REDLOCKD_VERSION ", up "), "%s", p->out);
    ck_assert_msg(sscanf(line_of(p, "nodes"), "nodes %d of", &n) == 1 && n == K.nnodes,
                  "nodes line: %s", p->out);
    ck_assert_msg(h_starts(line_of(p, "locks"), "locks         1 held, 0 waiting"),
                  "locks line: %s", p->out);
    ck_assert_msg(strstr(line_of(p, "grants"), "/s over 1.0 s (1 since start)"),
                  "grants line: %s", p->out);
    ck_assert_msg(h_starts(line_of(p, "losses"), "losses        0.0/s"),
                  "losses line: %s", p->out);
    ck_assert_msg(h_starts(line_of(p, "acquire"), "acquire       p50 ") &&
                  strstr(line_of(p, "acquire"), " p99 "), "acquire line: %s",
                  p->out);
    ck_assert_msg(h_starts(line_of(p, "NODE"), "NODE "), "%s", p->out);
    snprintf(node, sizeof(node), "127.0.0.1:%d ", R[0].port);
    ck_assert_msg(h_starts(line_of(p, node), node) &&
                  strstr(line_of(p, node), " voting "), "node row: %s", p->out);
}

START_TEST(inspection_commands)
{
    char addr[400];
    json_t *o, *s, *v;
    size_t i;
    bool found = false;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK ", "HELLO name=cli-holder");
    h_expect(A, "OK resource=cli:insp ", "LOCK cli:insp ttl=30000");

    ctl_ok("cli-holder", "-s", S, "status", "cli:insp", NULL);
    o = ctl_ok_json("-s", S, "--json", "status", "cli:insp", NULL);
    ck_assert_str_eq(h_json_str(o, "resource"), "cli:insp");
    ck_assert_msg(json_is_true(json_object_get(o, "held")), "status: not held");
    v = json_object_get(json_object_get(o, "holder"), "name");
    ck_assert_msg(json_is_string(v) && strcmp(json_string_value(v), "cli-holder") == 0,
                  "status: holder is not cli-holder");
    json_decref(o);

    /* A key some other Redlock client set. */
    ck_assert(h_redis_cmd(&R[0], NULL, "SET lock:cli:other x PX 30000") != -3);
    ctl_ok("another Redlock client", "-s", S, "status", "cli:other", NULL);

    /* Options right after the command work too (redlockctl(1)). */
    o = ctl_ok_json("status", "--json", "-s", S, "cli:free", NULL);
    ck_assert_msg(json_is_false(json_object_get(o, "held")), "free resource held");
    json_decref(o);

    ctl_ok("cli-holder", "-s", S, "sessions", NULL);
    o = ctl_ok_json("-s", S, "--json", "sessions", NULL);
    json_array_foreach(json_object_get(o, "sessions"), i, s) {
        v = json_object_get(s, "name");
        if (json_is_string(v) && strcmp(json_string_value(v), "cli-holder") == 0)
            found = true;
    }
    ck_assert_msg(found, "--json sessions lacks cli-holder");
    json_decref(o);

    stats_table();
    o = ctl_ok_json("-s", S, "--json", "stats", NULL);
    ck_assert_int_eq(h_json_int(o, "locks_held"), 1);
    ck_assert_msg(json_is_object(json_object_get(o, "acquire_seconds")),
                  "stats --json lacks the histograms");
    json_decref(o);

    ctl_ok("PONG", "-s", S, "ping", NULL);
    o = ctl_ok_json("-s", S, "--json", "ping", NULL);
    ck_assert_msg(h_starts(h_json_str(o, "server"), "redlockd/"), "--json ping: "
                  "server is %s", h_json_str(o, "server"));
    ck_assert_int_eq(h_json_int(o, "nodes_voting"), 1);
    ck_assert(json_is_true(json_object_get(o, "quorum_ok")));
    json_decref(o);

    /* The unix socket, spelled both ways, and $REDLOCKD_SERVER. */
    snprintf(addr, sizeof(addr), "unix:%s", D->sock_path);
    ctl_ok("PONG", "-s", addr, "ping", NULL);
    ctl_ok("cli-holder", "--server", D->sock_path, "status", "cli:insp", NULL);
    snprintf(addr, sizeof(addr), "unix://%s", D->sock_path);
    ctl_ok("PONG", "-s", addr, "ping", NULL);
    server_env = S;
    ctl_ok("PONG", "ping", NULL);
    server_env = NULL;
}
END_TEST

/* A usage error: status 64, one line on stderr that says `want`. */
static void assert_usage(struct proc *p, const char *want)
{
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, p->cmdline);
    assert_one_error_line(p, p->cmdline);
    ck_assert_msg(strstr(p->err, want), "%s: stderr does not say \"%s\": %s",
                  p->cmdline, want, p->err);
}

/* Options anywhere, for every command (redlockctl(1) OPTIONS); run's end
 * at COMMAND; what a missing word is called; resource names as long as
 * the daemon takes, and the messages about longer ones. */
START_TEST(options_anywhere)
{
    char name[1100];
    const char *marker;
    struct proc *p;
    json_t *o;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    marker = tmp_path("ran");

    o = ctl_ok_json("status", "cli:w", "--json", "-s", S, NULL);
    ck_assert_str_eq(h_json_str(o, "resource"), "cli:w");
    json_decref(o);
    json_decref(ctl_ok_json("sessions", "-s", S, "--json", NULL));
    json_decref(ctl_ok_json("stats", "--json", "-s", S, NULL));
    json_decref(ctl_ok_json("ping", "-s", S, "--json", NULL));
    ctl_ok("[", "locks", "-s", S, "--json", NULL);
    /* Between RESOURCE and "--", and with no "--": the command's own
     * options are its own. */
    ctl_ok("cli:w 2000\n", "run", "cli:w", "-s", S, "--ttl", "2000", "--",
           "sh", "-c", "echo $REDLOCKD_RESOURCE 2000", NULL);
    ctl_ok("--ttl -x\n", "run", "cli:w", "-s", S, "sh", "-c", "echo \"$*\"",
           "sh", "--ttl", "-x", NULL);
    ctl_ok("cli:w\n", "run", "-s", S, "cli:w", "--", "sh", "-c",
           "echo $REDLOCKD_RESOURCE", "--json", NULL);
    assert_usage(ctl_start("status", "cli:w", "--ttl", "5", "-s", S, NULL),
                 "--ttl is an option of run");

    /* The words that are missing, named as such. */
    assert_usage(ctl_start("-s", S, "run", "--", "sh", "-c",
                           "touch \"$1\"", "sh", marker, NULL),
                 "run: missing RESOURCE before --");
    ck_assert_msg(!file_exists(marker), "run -- ran its command");
    assert_usage(ctl_start("-s", S, "run", NULL),
                 "run: missing RESOURCE and COMMAND");
    assert_usage(ctl_start("-s", S, "run", "cli:w", "--", NULL),
                 "run: missing COMMAND after RESOURCE");
    assert_usage(ctl_start("-s", S, "status", NULL), "status: missing RESOURCE");
    assert_usage(ctl_start("-s", S, "status", "a", "b", NULL),
                 "status: expected one RESOURCE");
    assert_usage(ctl_start("-s", S, "stats", "x", NULL),
                 "stats takes no arguments");
    assert_usage(ctl_start("frob", "--json", NULL), "unknown command \"frob\"");

    /* Names: 200 bytes are taken, 201 refused by the daemon, over 1024
     * by the library; both messages say what the limit is. */
    memset(name, 'n', 200);
    name[200] = '\0';
    ctl_ok("", "-s", S, "run", name, "--", "true", NULL);
    strcpy(name + 200, "n");
    assert_usage(ctl_start("-s", S, "run", name, "--", "true", NULL),
                 "longer than 200 bytes (locks.max_resource_len)");
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    p = ctl_start("-s", S, "status", name, NULL);
    assert_usage(p, "1099 bytes is too long: redlockd takes 1 to 200 bytes by "
                 "default (locks.max_resource_len, at most 1024)");
    ck_assert_msg(!strstr(p->err, "1 to 1024"), "%s", p->err);
}
END_TEST

/* --ttl, --wait, --detach and --timeout take units (2m, 1.5s) as the
 * daemon's ttl= does; bare numbers stay milliseconds. */
START_TEST(run_durations)
{
    const char *donef;
    struct proc *p;
    json_t *o;
    json_int_t pttl;
    uint64_t t0;
    long long took;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    donef = tmp_path("done");
    h_cluster_client(&K, 0, 0);

    p = ctl_start("-s", S, "--timeout", "2.5s", "run", "--ttl", "2m",
                  "--detach", "0.5m", "cli:dur", "--", "sh", "-c",
                  "sleep 1; touch \"$1\"", "sh", donef, NULL);
    t0 = h_now_ms();
    for (;;) {
        o = h_ok_json(A, "STATUS cli:dur");
        if (json_is_true(json_object_get(o, "held")))
            break;
        json_decref(o);
        ck_assert_msg(h_since(t0) < h_scale(5000), "run never took the lock");
        h_sleep_ms(10);
    }
    pttl = h_json_int(json_array_get(json_object_get(o, "nodes"), 0), "pttl");
    json_decref(o);
    ck_assert_msg(pttl > 60000 && pttl <= 120000, "--ttl 2m: PTTL %lld",
                  (long long)pttl);
    proc_wait(p, h_scale(10000));
    assert_ok_quiet(p, "run --ttl 2m");
    ck_assert_msg(file_exists(donef), "the command did not finish");

    h_expect(A, "OK resource=cli:dur ", "LOCK cli:dur");
    t0 = h_now_ms();
    p = ctl_start("-s", S, "run", "--wait", "0.5s", "cli:dur", "--", "true",
                  NULL);
    proc_wait(p, h_scale(5000));
    took = h_since(t0);
    assert_status(p, EXIT_BUSY, "run --wait 0.5s on a busy lock");
    ck_assert_msg(took >= 480, "--wait 0.5s gave up after %lld ms", took);
    ck_assert_msg(strstr(p->err, "after waiting 500 ms"), "%s", p->err);

    assert_usage(ctl_start("-s", S, "run", "--ttl", "5d", "cli:dur", "--",
                           "true", NULL),
                 "--ttl: expected milliseconds or a number with ms, s, m or h "
                 "(500, 1.5s, 2m), at most 4294967295 ms; \"5d\" has an "
                 "unknown unit (use ms, s, m or h)");
    assert_usage(ctl_start("-s", S, "run", "--wait", "-1s", "cli:dur", "--",
                           "true", NULL), "has a sign");
    assert_usage(ctl_start("-s", S, "--timeout", "25d", "ping", NULL),
                 "unknown unit");
    assert_usage(ctl_start("-s", S, "--timeout", "600h", "ping", NULL),
                 "at most 2147483647 ms; \"600h\" is more than that");
}
END_TEST

/* ping exits 69 while the daemon answers but has no quorum of Redis nodes
 * to vote: a health check must not call it healthy. */
START_TEST(ping_no_quorum)
{
    struct proc *p;
    json_t *o;
    uint64_t t0;
    int n = 0;

    h_cluster_nodes(&K, 3, NULL);
    start_daemon(FAULT_JSON);
    h_cluster_client(&K, 0, 0);
    ctl_ok("3 voting", "-s", S, "ping", NULL);

    h_redis_pause(&R[1]);
    h_redis_pause(&R[2]);
    /* A stopped node is noticed when a command to it times out: LOCK
     * attempts (UNAVAILABLE) are the trigger. */
    t0 = h_now_ms();
    while (h_stats_int(A, "nodes_voting") >= h_stats_int(A, "quorum")) {
        char *line = h_cmd(A, "LOCK cli:q%d ttl=30000", n++);

        ck_assert_msg(h_starts(line, "ERR UNAVAILABLE"), "LOCK with two of three "
                      "nodes stopped: %s", line);
        ck_assert_msg(h_since(t0) < h_scale(5000), "the daemon did not notice the "
                      "stopped nodes in 5 s");
    }

    p = ctl_start("-s", S, "ping", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_UNAVAILABLE, "ping without a quorum");
    ck_assert_msg(h_starts(p->out, "PONG") && strstr(p->out, "1 voting"),
                  "ping without a quorum printed: %s", p->out);
    ck_assert_msg(h_starts(p->err, "redlockctl: ping: no quorum") &&
                  count_lines(p->err) == 1, "ping without a quorum said: %s", p->err);

    p = ctl_start("-s", S, "--json", "ping", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_UNAVAILABLE, "--json ping without a quorum");
    o = parse_json(p, "--json ping without a quorum");
    ck_assert_int_eq(h_json_int(o, "nodes_voting"), 1);
    ck_assert_int_eq(h_json_int(o, "quorum"), 2);
    ck_assert_msg(json_is_false(json_object_get(o, "quorum_ok")), "quorum_ok: %s",
                  p->out);
    json_decref(o);

    h_redis_resume(&R[1]);
    h_redis_resume(&R[2]);
    h_wait_voting(D, K.nnodes, h_scale(10000));
    ctl_ok("3 voting", "-s", S, "ping", NULL);
}
END_TEST

START_TEST(unreachable_daemon)
{
    char addr[64];
    struct proc *p;
    int port, fd;
    static const char *const cmds[][3] = {
        { "ping", NULL, NULL },
        { "status", "cli:x", NULL },
        { "sessions", NULL, NULL },
        { "stats", NULL, NULL },
        { "locks", NULL, NULL },
    };

    /* Connection refused. */
    fd = h_refusing_port(&port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        p = ctl_start("-s", addr, cmds[i][0], cmds[i][1], NULL);
        proc_wait(p, h_scale(10000));
        assert_status(p, EXIT_UNAVAILABLE, cmds[i][0]);
        assert_one_error_line(p, cmds[i][0]);
    }
    /* run does not start the command (it would exit 99). */
    p = ctl_start("-s", addr, "run", "cli:x", "--", "sh", "-c", "exit 99", NULL);
    proc_wait(p, h_scale(10000));
    assert_status(p, EXIT_UNAVAILABLE, "run with no daemon");
    assert_one_error_line(p, "run with no daemon");

    p = ctl_start("-s", "unix:/nonexistent/redlockd-test.sock", "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_status(p, EXIT_UNAVAILABLE, "ping to a missing unix socket");
    assert_one_error_line(p, "ping to a missing unix socket");
    close(fd);
}
END_TEST

/* ---- locks ---- */

/* Does this daemon's SESSIONS give each session a "held" array? */
static bool sessions_list_held(struct h_client *c)
{
    json_t *o = h_ok_json(c, "SESSIONS");
    json_t *first = json_array_get(json_object_get(o, "sessions"), 0);
    bool held;

    ck_assert_msg(json_is_object(first), "SESSIONS lists no session");
    held = json_is_array(json_object_get(first, "held"));
    json_decref(o);
    return held;
}

/* The n-th whitespace-separated word of line into out. */
static void word_of(const char *line, int n, char *out, size_t size)
{
    const char *p = line;
    size_t len;

    for (int i = 0;; i++) {
        p += strspn(p, " ");
        len = strcspn(p, " \n");
        if (i == n || len == 0)
            break;
        p += len;
    }
    ck_assert_msg(len > 0 && len < size, "no word %d in \"%s\"", n, line);
    memcpy(out, p, len);
    out[len] = '\0';
}

START_TEST(locks_lists_holders)
{
    static const char *const res[3] = { "cli:l1", "cli:l2", "cli:l3" };
    static const char *const names[3] = { "cli-a", "cli-a", "cli-b" };
    char sid[2][64], fence[3][32], w[64];
    const char *line;
    struct proc *p;
    json_t *arr, *row;
    json_error_t jerr;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    h_cluster_client(&K, 1, 0);
    h_kv_copy(h_expect(A, "OK ", "HELLO name=cli-a"), "session", sid[0],
              sizeof(sid[0]));
    h_kv_copy(h_expect(B, "OK ", "HELLO name=cli-b"), "session", sid[1],
              sizeof(sid[1]));
    /* Taken out of order: the listing sorts by resource. */
    h_kv_copy(h_expect(A, "OK resource=cli:l2 ", "LOCK cli:l2 ttl=30000"),
              "fence", fence[1], sizeof(fence[1]));
    h_kv_copy(h_expect(B, "OK resource=cli:l3 ", "LOCK cli:l3 ttl=30000"),
              "fence", fence[2], sizeof(fence[2]));
    h_kv_copy(h_expect(A, "OK resource=cli:l1 ", "LOCK cli:l1 ttl=30000"),
              "fence", fence[0], sizeof(fence[0]));

    if (!sessions_list_held(A)) {
        /* Today's daemon: say so, do not print an empty table. */
        for (int json = 0; json < 2; json++) {
            p = json ? ctl_start("-s", S, "--json", "locks", NULL)
                     : ctl_start("-s", S, "locks", NULL);
            proc_wait(p, h_scale(5000));
            assert_status(p, EXIT_UNAVAILABLE, "locks without \"held\"");
            assert_one_error_line(p, "locks without \"held\"");
            ck_assert_msg(strstr(p->err, "does not list held locks; upgrade "
                                 "redlockd"), "locks said: %s", p->err);
        }
        return;
    }

    p = ctl_ok("RESOURCE", "-s", S, "locks", NULL);
    ck_assert_msg(count_lines(p->out) == 4, "locks: not a header and 3 rows: "
                  "%s", p->out);
    ck_assert_msg(h_starts(p->out, "RESOURCE") && strstr(p->out, "FENCE") &&
                  strstr(p->out, "MODE") && strstr(p->out, "SESSION") &&
                  strstr(p->out, "NAME") && strstr(p->out, "PEER") &&
                  strstr(p->out, "HELD_MS") && strstr(p->out, "VALIDITY"),
                  "locks header: %s", p->out);
    line = strchr(p->out, '\n') + 1;
    for (int i = 0; i < 3; i++, line = strchr(line, '\n') + 1) {
        word_of(line, 0, w, sizeof(w));
        ck_assert_msg(strcmp(w, res[i]) == 0, "locks row %d is %s: %s", i, w,
                      p->out);
        word_of(line, 1, w, sizeof(w));
        ck_assert_msg(strcmp(w, fence[i]) == 0, "locks row %d fence %s, want "
                      "%s: %s", i, w, fence[i], p->out);
        word_of(line, 2, w, sizeof(w));
        ck_assert_str_eq(w, "exclusive");
        word_of(line, 3, w, sizeof(w));
        ck_assert_str_eq(w, sid[i == 2]);
        word_of(line, 4, w, sizeof(w));
        ck_assert_str_eq(w, names[i]);
    }

    p = ctl_ok("[", "-s", S, "--json", "locks", NULL);
    arr = json_loads(p->out, 0, &jerr);
    ck_assert_msg(json_is_array(arr) && json_array_size(arr) == 3,
                  "--json locks is not an array of 3: %s", p->out);
    for (int i = 0; i < 3; i++) {
        row = json_array_get(arr, (size_t)i);
        ck_assert_str_eq(h_json_str(row, "resource"), res[i]);
        ck_assert_int_eq(h_json_int(row, "fence"), strtoll(fence[i], NULL, 10));
        ck_assert_str_eq(h_json_str(row, "mode"), "exclusive");
        ck_assert_str_eq(h_json_str(row, "session"), sid[i == 2]);
        ck_assert_str_eq(h_json_str(row, "name"), names[i]);
        ck_assert_msg(h_starts(h_json_str(row, "peer"), "127.0.0.1:"),
                      "peer: %s", p->out);
        ck_assert_int_ge(h_json_int(row, "held_ms"), 0);
        ck_assert_int_gt(h_json_int(row, "validity"), 0);
    }
    json_decref(arr);

    /* Released locks leave the listing. */
    h_expect(A, "OK ", "UNLOCK cli:l1");
    h_expect(A, "OK ", "UNLOCK cli:l2");
    h_expect(B, "OK ", "UNLOCK cli:l3");
    p = ctl_ok("RESOURCE", "-s", S, "locks", NULL);
    ck_assert_msg(count_lines(p->out) == 1, "locks after UNLOCK: %s", p->out);
    p = ctl_ok("[]", "-s", S, "--json", "locks", NULL);
}
END_TEST

/* ---- release --force ---- */

#define ADMIN_JSON "{\"auth\":{\"password\":\"cli-user-pw\"," \
                   "\"admin_password\":\"cli-admin-pw\"}}"

static const char *write_secret(const char *name, const char *text)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "w");

    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
    return path;
}

/* A refused release --force: 69, one line saying `want`. */
static void assert_release_refused(struct proc *p, const char *want,
                                   const char *what)
{
    proc_wait(p, h_scale(10000));
    assert_status(p, EXIT_UNAVAILABLE, what);
    assert_one_error_line(p, what);
    ck_assert_msg(strstr(p->err, want), "%s said: %s", what, p->err);
}

START_TEST(release_force)
{
    const char *admin, *user;
    json_t *o;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth(ADMIN_JSON, "cli-user-pw");
    admin = write_secret("admin.pw", "cli-admin-pw\n");
    user = write_secret("user.pw", "cli-user-pw\n");
    h_cluster_client(&K, 1, 0);
    h_expect(B, "OK", "AUTH cli-user-pw");
    h_expect(A, "OK ", "HELLO name=cli-holder");
    h_expect(A, "OK resource=cli:f ", "LOCK cli:f ttl=30000");

    /* Another session's lock goes, and its holder hears of it. */
    ctl_ok("released cli:f on 1 node(s)\n", "-s", S, "release", "--force",
           "--admin-password-file", admin, "cli:f", NULL);
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=cli:f ",
                                 h_scale(5000)),
                  "the holder heard no EVENT LOST; events: %s", A->events);
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "EXISTS lock:cli:f"), 0);
    h_expect(B, "OK resource=cli:f ", "LOCK cli:f ttl=30000");

    /* The password from the environment; --password-file as well is fine
     * (the admin password authenticates on its own); --json. */
    admin_env = "cli-admin-pw";
    o = ctl_ok_json("-s", S, "--password-file", user, "--json", "release",
                    "--force", "cli:f", NULL);
    admin_env = NULL;
    ck_assert_str_eq(h_json_str(o, "resource"), "cli:f");
    ck_assert_int_eq(h_json_int(o, "nodes"), 1);
    json_decref(o);
    ck_assert_msg(h_expect_event(B, "EVENT LOST resource=cli:f ",
                                 h_scale(5000)),
                  "the second holder heard no EVENT LOST");
    /* Nothing to delete is no error. */
    ctl_ok("released cli:none on 0 node(s)\n", "-s", S, "release", "--force",
           "--admin-password-file", admin, "cli:none", NULL);
}
END_TEST

/* ---- users (auth.users) ---- */

#define USERS_JSON "{\"auth\":{\"users\":[" \
    "{\"name\":\"alice\",\"password\":\"cli-alice-pw\"," \
    "\"prefixes\":[\"cli:a:\"]}," \
    "{\"name\":\"ops\",\"password\":\"cli-ops-pw\"," \
    "\"prefixes\":[\"cli:\"],\"admin\":true}]}}"

/* A refusal of the daemon's: status `want`, one line naming `code`. */
static void assert_refused(struct proc *p, int want, const char *code,
                           const char *what)
{
    proc_wait(p, h_scale(10000));
    assert_status(p, want, what);
    assert_one_error_line(p, what);
    ck_assert_msg(strstr(p->err, code), "%s said: %s", what, p->err);
}

START_TEST(users_login)
{
    const char *alice, *ops, *bad;
    struct proc *p;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth(USERS_JSON, "alice cli-alice-pw");
    alice = write_secret("alice.pw", "cli-alice-pw\n");
    ops = write_secret("ops.pw", "cli-ops-pw\n");
    bad = write_secret("bad.pw", "not-alice-pw\n");

    /* Within alice's prefixes: run works; outside, DENIED exits 77. */
    ctl_ok("", "-s", S, "--user", "alice", "--password-file", alice, "run",
           "cli:a:1", "--", "true", NULL);
    p = ctl_start("-s", S, "--user", "alice", "--password-file", alice,
                  "run", "cli:b:1", "--", "true", NULL);
    assert_refused(p, EXIT_DENIED, "(DENIED)", "run outside the prefixes");
    p = ctl_start("-s", S, "--user", "alice", "--password-file", alice,
                  "status", "cli:b:1", NULL);
    assert_refused(p, EXIT_DENIED, "(DENIED)", "status outside the prefixes");
    /* The user from the environment. */
    user_env = "alice";
    ctl_ok("", "-s", S, "--password-file", alice, "run", "cli:a:2", "--",
           "true", NULL);
    user_env = NULL;

    /* An admin user forces a release within its prefixes. */
    h_expect(A, "OK resource=cli:a:3 ", "LOCK cli:a:3 ttl=30000");
    ctl_ok("released cli:a:3 on 1 node(s)\n", "-s", S, "--user", "ops",
           "--password-file", ops, "release", "--force", "cli:a:3", NULL);
    ck_assert_msg(h_expect_event(A, "EVENT LOST resource=cli:a:3 ",
                                 h_scale(5000)), "no EVENT LOST");
    p = ctl_start("-s", S, "--user", "ops", "--password-file", ops,
                  "release", "--force", "other:1", NULL);
    assert_refused(p, EXIT_DENIED, "(DENIED)", "release outside the prefixes");
    p = ctl_start("-s", S, "--user", "alice", "--password-file", alice,
                  "release", "--force", "cli:a:3", NULL);
    assert_refused(p, EXIT_DENIED, "not an admin", "release by a non-admin");

    /* A wrong password; a user without a password file. */
    p = ctl_start("-s", S, "--user", "alice", "--password-file", bad,
                  "status", "cli:a:1", NULL);
    assert_refused(p, EXIT_UNAVAILABLE, "(AUTH)", "a wrong user password");
    p = ctl_start("-s", S, "--user", "alice", "status", "cli:a:1", NULL);
    assert_refused(p, EXIT_USAGE, "needs --password-file", "no password");
}
END_TEST

START_TEST(release_force_refused)
{
    const char *bad, *user, *admin;
    struct proc *p;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth(ADMIN_JSON, "cli-user-pw");
    bad = write_secret("bad.pw", "not-the-admin-pw\n");
    user = write_secret("user.pw", "cli-user-pw\n");
    admin = write_secret("admin.pw", "cli-admin-pw\n");
    h_expect(A, "OK resource=cli:f ", "LOCK cli:f ttl=30000");

    /* No admin password: a user, not an operator. */
    p = ctl_start("-s", S, "--password-file", user, "release", "--force",
                  "cli:f", NULL);
    assert_release_refused(p, "not an operator: the daemon needs "
                           "auth.admin_password and this command the same "
                           "password", "release --force as a user");
    ck_assert_msg(strstr(p->err, "(NOAUTH)"), "%s", p->err);
    /* No password at all. */
    p = ctl_start("-s", S, "release", "--force", "cli:f", NULL);
    assert_release_refused(p, "not an operator", "release --force, no password");
    /* A wrong admin password, from the file and from the environment. */
    p = ctl_start("-s", S, "release", "--force", "--admin-password-file", bad,
                  "cli:f", NULL);
    assert_release_refused(p, "refused the admin password",
                           "release --force, wrong admin password");
    ck_assert_msg(strstr(p->err, "(AUTH)"), "%s", p->err);
    admin_env = "not-the-admin-pw";
    p = ctl_start("-s", S, "release", "--force", "cli:f", NULL);
    admin_env = NULL;
    assert_release_refused(p, "refused the admin password",
                           "release --force, wrong $REDLOCKD_ADMIN_PASSWORD");
    /* The user password given as the admin password is accepted by AUTH,
     * but it is not an operator's. */
    p = ctl_start("-s", S, "release", "--force", "--admin-password-file", user,
                  "cli:f", NULL);
    assert_release_refused(p, "not an operator",
                           "release --force with the user password");
    /* The lock stayed with its holder. */
    h_expect(A, "OK resource=cli:f ", "EXTEND cli:f ttl=30000");
    ck_assert_msg(!strstr(A->events, "EVENT LOST"), "events: %s", A->events);

    /* Usage errors: no --force, no resource, an unreadable file, an option
     * of run. */
    p = ctl_start("-s", S, "release", "cli:f", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "release without --force");
    assert_one_error_line(p, "release without --force");
    ck_assert_msg(strstr(p->err, "a lock lives as long as the session"),
                  "release without --force said: %s", p->err);
    p = ctl_start("-s", S, "release", "--force", "--admin-password-file",
                  admin, NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "release --force without a resource");
    assert_one_error_line(p, "release --force without a resource");
    p = ctl_start("-s", S, "release", "--force", "--admin-password-file",
                  tmp_path("missing.pw"), "cli:f", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "release --force, missing password file");
    assert_one_error_line(p, "release --force, missing password file");
    p = ctl_start("-s", S, "release", "--force", "--ttl", "5", "cli:f", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "release --force --ttl");
    assert_one_error_line(p, "release --force --ttl");
    p = ctl_start("-s", S, "status", "--force", "cli:f", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "status --force");
    assert_one_error_line(p, "status --force");
    h_expect(A, "OK resource=cli:f ", "EXTEND cli:f ttl=30000");
}
END_TEST

/* A daemon without auth.admin_password has FORCEUNLOCK disabled. */
START_TEST(release_force_disabled)
{
    struct proc *p;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    h_expect(A, "OK resource=cli:f ", "LOCK cli:f ttl=30000");
    p = ctl_start("-s", S, "release", "--force", "cli:f", NULL);
    assert_release_refused(p, "not an operator", "release --force, disabled");
    ck_assert_msg(strstr(p->err, "admin_password"), "%s", p->err);
    h_expect(A, "OK resource=cli:f ", "EXTEND cli:f ttl=30000");
}
END_TEST

/* ---- run: a lease lost, the command's whole group stopped ---- */

/*
 * The command's shell starts a second shell in the background (the
 * grandchild, same process group) and waits. $1: where the command writes
 * its pid (the group), $2: the grandchild's file, $3: where the grandchild
 * writes its pid once its trap is set, $4: the grandchild's script.
 */
#define GROUP_SCRIPT \
    "echo $$ > \"$1\"; sh -c \"$4\" grandchild \"$2\" \"$3\" & wait"
/* A grandchild that cleans up on SIGTERM, which takes it 300 ms. (No
 * `sleep &`: one forked as the signal comes might miss it and linger.) */
#define TERM_CLEANUP_SCRIPT \
    "trap 'sleep 0.3; echo term > \"$1\"; exit 0' TERM; echo $$ > \"$2\"; " \
    "while :; do sleep 0.05; done"
/* A grandchild that ignores SIGTERM (its `sleep`s too) and only stops for
 * SIGKILL, writing a stamp every 20 ms meanwhile. */
#define TERM_IGNORED_SCRIPT \
    "trap '' TERM; echo $$ > \"$2\"; " \
    "while :; do date +%s%N >> \"$1\"; sleep 0.02; done"

/* `run --kill-after KILL_AFTER RES` of GROUP_SCRIPT with `grandchild` as its
 * grandchild, on a daemon with an admin password; takes the lease away with
 * FORCEUNLOCK once the grandchild is ready. The group's pid in *pgid, the
 * grandchild's in *gc; returns when the lease was taken away. */
static struct proc *run_group_then_lose(const char *res, const char *kill_after,
                                        const char *grandchild, const char *out,
                                        long *pgid, long *gc, uint64_t *lost_at)
{
    const char *user, *pidf = tmp_path("pid"), *readyf = tmp_path("ready");
    struct proc *p;

    user = write_secret("user.pw", "cli-user-pw\n");
    p = ctl_start("-s", S, "--password-file", user, "run", "--kill-after",
                  kill_after, res, "--", "sh", "-c", GROUP_SCRIPT, "command",
                  pidf, out, readyf, grandchild, NULL);
    *pgid = wait_file_number(pidf, h_scale(5000));
    *gc = wait_file_number(readyf, h_scale(5000));
    h_cluster_client(&K, 1, 0);
    h_expect(B, "OK", "AUTH cli-admin-pw");
    *lost_at = h_now_ms();
    h_expect(B, "OK ", "FORCEUNLOCK %s", res);
    return p;
}

/* EVENT LOST: SIGTERM reaches the grandchild too, and it gets its time to
 * act on it: the command's shell dies of SIGTERM at once, but redlockctl
 * waits for the rest of the group (up to --kill-after) before it SIGKILLs
 * what is left and exits 70. */
START_TEST(run_lost_terms_group)
{
    const char *termf;
    char buf[256];
    struct proc *p;
    long pgid, gc;
    long long took;
    uint64_t t0;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth(ADMIN_JSON, "cli-user-pw");
    termf = tmp_path("term");
    p = run_group_then_lose("cli:grp", "3", TERM_CLEANUP_SCRIPT, termf, &pgid,
                            &gc, &t0);
    proc_wait(p, h_scale(6000));
    took = h_since(t0);
    fprintf(stderr, "run_lost_terms_group: redlockctl exited %lld ms after "
            "FORCEUNLOCK; it said: %s", took, p->err);
    assert_status(p, EXIT_LOST, "run whose lock was FORCEUNLOCKed");
    ck_assert_msg(strstr(p->err, "lost the lock on cli:grp"), "stderr: %s",
                  p->err);
    ck_assert_msg(read_file(termf, buf, sizeof(buf)) && strcmp(buf, "term\n") == 0,
                  "the grandchild (pid %ld) did not finish its SIGTERM trap "
                  "before redlockctl exited (file: \"%s\")", gc, buf);
    ck_assert_msg(took < h_scale(2500), "redlockctl took %lld ms: it waited for "
                  "--kill-after 3, not for the group to end", took);
    ck_assert_msg(wait_group_gone(pgid, h_scale(1000)),
                  "the command's group %ld still runs", pgid);
    kill_group(pgid);
}
END_TEST

/* A grandchild that ignores SIGTERM runs until SIGKILL, which comes
 * --kill-after seconds after the SIGTERM, to the whole group (not at once
 * when the command's shell has died). */
START_TEST(run_lost_kills_group_after)
{
    const char *stamps;
    struct proc *p;
    long pgid, gc;
    long long took, last_ms;
    long long lost_wall;
    uint64_t t0;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon_auth(ADMIN_JSON, "cli-user-pw");
    stamps = tmp_path("stamps");
    p = run_group_then_lose("cli:grpkill", "1", TERM_IGNORED_SCRIPT, stamps,
                            &pgid, &gc, &t0);
    lost_wall = wall_ns();
    proc_wait(p, h_scale(6000));
    took = h_since(t0);
    ck_assert_msg(wait_group_gone(pgid, h_scale(1000)),
                  "the command's group %ld still runs after redlockctl exited",
                  pgid);
    h_sleep_ms(50);
    last_ms = last_number(stamps);
    /* No write at all: -1. */
    last_ms = last_ms > 0 ? (last_ms - lost_wall) / 1000000 : -1;
    fprintf(stderr, "run_lost_kills_group_after: redlockctl exited %lld ms "
            "after FORCEUNLOCK, the grandchild's last write %lld ms after it; "
            "redlockctl said: %s", took, last_ms, p->err);
    assert_status(p, EXIT_LOST, "run whose lock was FORCEUNLOCKed");
    ck_assert_msg(took >= 900, "redlockctl exited %lld ms after the loss: the "
                  "group got no --kill-after 1 to end", took);
    ck_assert_msg(took < h_scale(2500), "redlockctl exited %lld ms after the "
                  "loss, --kill-after is 1 s", took);
    ck_assert_msg(last_ms >= 800, "the grandchild (pid %ld) stopped writing "
                  "%lld ms after the loss: killed before --kill-after 1", gc,
                  last_ms);
    kill_group(pgid);
}
END_TEST

/* ---- leader election: elect, leader, watch, lock (issue 32) ---- */

/* p's stdout from offset `from` on holds `want` within timeout_ms
 * (asserted): where it starts. */
static size_t wait_output(struct proc *p, size_t from, const char *want,
                          int timeout_ms)
{
    uint64_t t0 = h_now_ms();
    const char *at;

    for (;;) {
        proc_drain(p);
        at = from <= p->out_len ? strstr(p->out + from, want) : NULL;
        if (at)
            return (size_t)(at - p->out);
        ck_assert_msg(h_since(t0) < timeout_ms, "%s printed no \"%s\" "
                      "within %d ms; stdout: %s; stderr: %s", p->cmdline,
                      want, timeout_ms, p->out, p->err);
        h_sleep_ms(10);
    }
}

/* `leader RESOURCE`: exactly "want\n", or with want NULL nothing at all
 * and exit 1. */
static void assert_leader(const char *res, const char *want)
{
    struct proc *p = ctl_start("-s", S, "leader", res, NULL);
    char line[300];

    proc_wait(p, h_scale(5000));
    if (!want) {
        assert_status(p, 1, "leader with nobody leading");
        ck_assert_msg(p->out_len == 0 && p->err_len == 0, "leader with nobody "
                      "leading said: %s%s", p->out, p->err);
        return;
    }
    assert_ok_quiet(p, p->cmdline);
    snprintf(line, sizeof(line), "%s\n", want);
    ck_assert_str_eq(p->out, line);
}

/* The fence of the watch line that shows value (asserted to be one:
 * "<time> <resource> held=1 mode=exclusive fence=<n> ... value=<v>"). */
static unsigned long long watched_fence(const struct proc *w, const char *res,
                                        const char *value)
{
    char want[128], copy[sizeof(w->out)], *line, *save = NULL;
    char when[64], name[128];
    unsigned long long fence;

    snprintf(want, sizeof(want), " value=%s", value);
    memcpy(copy, w->out, w->out_len + 1);
    for (line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (!strstr(line, want))
            continue;
        ck_assert_msg(sscanf(line, "%63s %127s held=1 mode=exclusive "
                             "fence=%llu ", when, name, &fence) == 3,
                      "watch line: %s", line);
        ck_assert_msg(strchr(when, 'T') && isdigit((unsigned char)when[0]),
                      "watch line without its time first: %s", line);
        ck_assert_str_eq(name, res);
        return fence;
    }
    ck_abort_msg("no watch line with%s: %s", want, w->out);
    return 0;
}

/* sh -c: the command writes its pid (its own process group: redlockctl
 * made it so) and REDLOCKD_VALUE, then leads until killed. */
#define LEAD_SCRIPT \
    "echo $$ > \"$1\"; echo \"$REDLOCKD_VALUE\" > \"$2\"; exec sleep 30"

static struct proc *candidate(const char *value, const char *pidf,
                              const char *valf)
{
    return ctl_start("-s", S, "elect", "cli:lead", "--value", value, "--",
                     "sh", "-c", LEAD_SCRIPT, "sh", pidf, valf, NULL);
}

START_TEST(elect_two_candidates)
{
    const char *pid1, *pid2, *val1, *val2;
    struct proc *w, *c1, *c2;
    long lead1, lead2;
    size_t at;
    char buf[64];

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    pid1 = tmp_path("pid1");
    val1 = tmp_path("val1");
    pid2 = tmp_path("pid2");
    val2 = tmp_path("val2");
    assert_leader("cli:lead", NULL);
    w = ctl_start("-s", S, "watch", "cli:lead", NULL);
    wait_output(w, 0, " cli:lead held=0\n", h_scale(5000));

    c1 = candidate("10.0.0.1:8080", pid1, val1);
    lead1 = wait_file_number(pid1, h_scale(5000));
    c2 = candidate("10.0.0.2:8080", pid2, val2);
    at = wait_output(w, 0, " value=10.0.0.1:8080\n", h_scale(2000));
    assert_leader("cli:lead", "10.0.0.1:8080");
    ck_assert(read_file(val1, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "10.0.0.1:8080\n");
    h_sleep_ms(300);
    ck_assert_msg(!file_exists(pid2) && !proc_exited(c2, 0), "the second "
                  "candidate did not wait: %s", c2->err);

    /* The leader's command dies: the other candidate leads. */
    ck_assert_int_eq(kill((pid_t)lead1, SIGTERM), 0);
    lead2 = wait_file_number(pid2, h_scale(5000));
    proc_wait(c1, h_scale(5000));
    assert_status(c1, 128 + SIGTERM, "the first leader after its command's "
                  "SIGTERM");
    at = wait_output(w, at, " value=10.0.0.2:8080\n", h_scale(2000));
    ck_assert(read_file(val2, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "10.0.0.2:8080\n");
    assert_leader("cli:lead", "10.0.0.2:8080");
    ck_assert_uint_gt(watched_fence(w, "cli:lead", "10.0.0.2:8080"),
                      watched_fence(w, "cli:lead", "10.0.0.1:8080"));

    /* Nobody left: free, and the watcher says so. */
    ck_assert_int_eq(kill((pid_t)lead2, SIGTERM), 0);
    proc_wait(c2, h_scale(5000));
    assert_status(c2, 128 + SIGTERM, "the second leader");
    wait_output(w, at, " cli:lead held=0\n", h_scale(2000));
    assert_leader("cli:lead", NULL);
    ck_assert_int_eq(kill(w->pid, SIGTERM), 0);
    proc_wait(w, h_scale(5000));
    assert_ok_quiet(w, "watch after SIGTERM");
    kill_group(lead1);
    kill_group(lead2);
}
END_TEST

START_TEST(watch_json_lines)
{
    char copy[sizeof(P[0].out)], *line, *save = NULL;
    int n = 0, valued = 0;
    struct proc *w;
    size_t at;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    w = ctl_start("-s", S, "watch", "cli:wj", "--json", "cli:wk", NULL);
    wait_output(w, 0, "\"cli:wk\"", h_scale(5000));
    h_expect(A, "OK ", "HELLO name=alice");
    h_expect(A, "OK resource=cli:wj ", "LOCK cli:wj value=http://x:1/?a=b");
    at = wait_output(w, 0, "\"value\":\"http://x:1/?a=b\"", h_scale(2000));
    h_expect(A, "OK resource=cli:wk ", "LOCK cli:wk mode=shared");
    wait_output(w, at, "\"mode\":\"shared\"", h_scale(2000));
    h_expect(A, "OK resource=cli:wj ", "UNLOCK cli:wj");
    wait_output(w, at, "\"resource\":\"cli:wj\",\"held\":0",
                h_scale(2000));
    ck_assert_int_eq(kill(w->pid, SIGTERM), 0);
    proc_wait(w, h_scale(5000));
    assert_ok_quiet(w, "watch --json after SIGTERM");

    memcpy(copy, w->out, w->out_len + 1);
    for (line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), n++) {
        json_t *o = json_loads(line, 0, NULL);

        ck_assert_msg(json_is_object(o), "not a JSON object: %s", line);
        ck_assert_msg(json_is_string(json_object_get(o, "time")) &&
                      json_is_string(json_object_get(o, "resource")) &&
                      json_is_integer(json_object_get(o, "held")),
                      "no time, resource or held: %s", line);
        if (json_object_get(o, "value")) {
            valued++;
            ck_assert_str_eq(h_json_str(o, "resource"), "cli:wj");
            ck_assert_str_eq(h_json_str(o, "mode"), "exclusive");
            ck_assert_str_eq(h_json_str(o, "name"), "alice");
            ck_assert_int_gt(h_json_int(o, "fence"), 0);
        }
        json_decref(o);
    }
    ck_assert_msg(n >= 5 && valued == 1, "%d lines, %d with a value: %s", n,
                  valued, w->out);
}
END_TEST

/* watch with two daemons (-s twice): its daemon dies, and it goes on
 * through the other, telling the changes made there; it says so on
 * stderr. */
START_TEST(watch_follows_failover)
{
    char s2[64];
    struct proc *w;
    size_t at;

    h_cluster_nodes(&K, 1, NULL);
    start_two_daemons(s2, sizeof(s2));
    w = ctl_start("-s", S, "-s", s2, "watch", "cli:wf", NULL);
    at = wait_output(w, 0, " cli:wf held=0\n", h_scale(5000));
    h_daemon_kill(D);
    h_expect(B, "OK resource=cli:wf ", "LOCK cli:wf value=on-d2");
    wait_output(w, at, " value=on-d2\n", h_scale(5000));
    h_expect(B, "OK resource=cli:wf ", "UNLOCK cli:wf");
    ck_assert_int_eq(kill(w->pid, SIGTERM), 0);
    proc_wait(w, h_scale(5000));
    assert_status(w, 0, "watch after SIGTERM");
    ck_assert_msg(strstr(w->err, "lost the connection") &&
                  strstr(w->err, "watching again through"), "watch said: %s",
                  w->err);
}
END_TEST

/* The first line of `lock`: "resource=<r> fence=<n> token=<hex>". */
static unsigned long long granted_fence(struct proc *p, const char *res)
{
    char r[128], token[64];
    unsigned long long fence;

    wait_output(p, 0, "\n", h_scale(5000));
    ck_assert_msg(sscanf(p->out, "resource=%127s fence=%llu token=%63s", r,
                         &fence, token) == 3 && count_lines(p->out) == 1,
                  "lock printed: %s", p->out);
    ck_assert_str_eq(r, res);
    check_token(token, p->out);
    return fence;
}

START_TEST(lock_holds_until_signal)
{
    unsigned long long fence;
    struct proc *p;
    json_t *o;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);
    p = ctl_start("-s", S, "lock", "cli:lk", "--value", "v1", "--ttl", "1000",
                  NULL);
    fence = granted_fence(p, "cli:lk");
    h_expect(A, "ERR BUSY", "LOCK cli:lk ttl=30000");
    assert_leader("cli:lk", "v1");
    ctl_ok(", value v1\n", "-s", S, "status", "cli:lk", NULL);
    h_sleep_ms(1500);       /* past its ttl: kept */
    h_expect(A, "ERR BUSY", "LOCK cli:lk ttl=30000");
    ck_assert_int_eq(kill(p->pid, SIGTERM), 0);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "lock after SIGTERM");
    assert_free("cli:lk");  /* at once, not after --detach */
    assert_leader("cli:lk", NULL);

    p = ctl_start("-s", S, "--json", "lock", "cli:lk", NULL);
    wait_output(p, 0, "\n", h_scale(5000));
    o = parse_json(p, "lock --json");
    ck_assert_str_eq(h_json_str(o, "resource"), "cli:lk");
    ck_assert_int_gt(h_json_int(o, "fence"), (json_int_t)fence);
    ck_assert_uint_eq(strlen(h_json_str(o, "token")), 32);
    json_decref(o);
    ctl_start("-s", S, "lock", "cli:lk", NULL);
    proc_wait(&P[np - 1], h_scale(5000));
    assert_status(&P[np - 1], EXIT_BUSY, "lock of a held lock");
    ck_assert_int_eq(kill(p->pid, SIGINT), 0);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "lock after SIGINT");

    /* Lost: its key deleted behind the daemon's back. */
    p = ctl_start("-s", S, "lock", "cli:lk2", "--ttl", "600", NULL);
    granted_fence(p, "cli:lk2");
    ck_assert_int_eq(h_redis_cmd(&R[0], NULL, "DEL lock:cli:lk2"), 1);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_LOST, "lock after its lease was lost");
    ck_assert_msg(strstr(p->err, "lost the lock on cli:lk2"), "lock said: %s",
                  p->err);
}
END_TEST

START_TEST(elect_lock_watch_usage)
{
    static const char *const bad[][8] = {
        { "elect", "cli:u", "--", "true" },
        { "elect", "cli:u", "--value", "v", "--shared", "--", "true" },
        { "elect", "--value", "v", "--", "true" },
        { "lock", "cli:u", "--on-lost", "kill" },
        { "lock", "cli:u", "--value", "two words" },
        { "lock", "cli:u", "cli:v" },
        { "watch", "--ttl", "1s", "cli:u" },
        { "watch" },
        { "leader" },
        { "leader", "cli:u", "--value", "v" },
    };
    struct proc *p;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = proc_startv(env_bin("REDLOCKCTL_BIN"), bad[i]);
        proc_wait(p, h_scale(5000));
        assert_status(p, EXIT_USAGE, p->cmdline);
        assert_one_error_line(p, p->cmdline);
    }
}
END_TEST

/* ---- --version, --help, usage errors ---- */

START_TEST(version_and_help)
{
    struct proc *p;

    p = ctl_start("--version", NULL);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "--version");
    ck_assert_str_eq(p->out, "redlockctl " REDLOCKD_VERSION "\n");
    p = ctl_start("-V", NULL);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "-V");
    ck_assert_str_eq(p->out, "redlockctl " REDLOCKD_VERSION "\n");

    p = ctl_start("--help", NULL);
    proc_wait(p, h_scale(5000));
    assert_ok_quiet(p, "--help");
    ck_assert_msg(strstr(p->out, "Usage:") && strstr(p->out, "run") &&
                  strstr(p->out, "--conflict-exit-code") &&
                  strstr(p->out, "locks") &&
                  strstr(p->out, "release --force") &&
                  strstr(p->out, "--admin-password-file") &&
                  strstr(p->out, "elect RESOURCE --value TEXT") &&
                  strstr(p->out, "watch RESOURCE...") &&
                  strstr(p->out, "leader RESOURCE") &&
                  strstr(p->out, "(run and elect only)"),
                  "--help: %s", p->out);

    p = ctl_start("--no-such-option", "ping", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "an unknown option");
    assert_one_error_line(p, "an unknown option");

    p = ctl_start("run", "cli:x", NULL);
    proc_wait(p, h_scale(5000));
    assert_status(p, EXIT_USAGE, "run without a command");
    assert_one_error_line(p, "run without a command");
}
END_TEST

/* ---- the README's library example ---- */

START_TEST(readme_example)
{
    char addr[400];
    struct proc *p;
    unsigned long long fence1 = 0, fence2 = 0;

    h_cluster_nodes(&K, 1, NULL);
    start_daemon(NULL);
    h_cluster_client(&K, 0, 0);

    p = proc_startv(env_bin("EXAMPLE_BIN"), (const char *const[]){ S, NULL });
    proc_wait(p, h_scale(10000));
    assert_ok_quiet(p, "example 127.0.0.1:PORT");
    ck_assert_msg(sscanf(p->out, "got example:job, fence %llu", &fence1) == 1,
                  "example printed: %s", p->out);

    /* No argument: $REDLOCKD_SERVER, here the unix socket. */
    snprintf(addr, sizeof(addr), "unix:%s", D->sock_path);
    server_env = addr;
    p = proc_startv(env_bin("EXAMPLE_BIN"), (const char *const[]){ NULL });
    proc_wait(p, h_scale(10000));
    server_env = NULL;
    assert_ok_quiet(p, "example with $REDLOCKD_SERVER");
    ck_assert_msg(sscanf(p->out, "got example:job, fence %llu", &fence2) == 1,
                  "example printed: %s", p->out);
    ck_assert_msg(fence2 > fence1, "fence went from %llu to %llu", fence1, fence2);
    /* It released what it took. */
    assert_free("example:job");
}
END_TEST

/* ---- TLS ---- */

/* The daemon with a tls:// listener (the pair `name`, more of "tls" in
 * extra); its address into addr. */
static void start_daemon_tls(const char *name, const char *extra, char *addr,
                             size_t size)
{
    char json[2048];

    snprintf(json, sizeof(json), "{\"tls\":{\"cert_file\":\"%s/%s.crt\","
             "\"key_file\":\"%s/%s.key\"%s}}", h_certs_dir(), name,
             h_certs_dir(), name, extra);
    h_cluster_nodes(&K, 1, NULL);
    start_daemon(json);
    ck_assert_int_gt(D->tls_port, 0);
    snprintf(addr, size, "tls://127.0.0.1:%d", D->tls_port);
}

static void assert_error_names(const struct proc *p, int status,
                               const char *what, const char *reason)
{
    assert_status(p, status, what);
    assert_one_error_line(p, what);
    ck_assert_msg(strstr(p->err, reason), "%s: stderr \"%s\" lacks \"%s\"",
                  what, p->err, reason);
}

/* run holds the lock over TLS while its command runs. */
START_TEST(tls_run)
{
    char addr[64], name_addr[64];
    const char *started;
    struct proc *p;

    start_daemon_tls("server", "", addr, sizeof(addr));
    h_cluster_client(&K, 0, 0);
    started = tmp_path("started");
    p = ctl_start("-s", addr, "--tls-ca", h_cert("ca.crt"), "run", "cli:tls",
                  "--", "sh", "-c", "echo $$ > \"$1\"; sleep 1", "sh",
                  started, NULL);
    wait_file_number(started, h_scale(5000));
    h_expect(A, "ERR BUSY", "LOCK cli:tls ttl=30000");
    proc_wait(p, h_scale(10000));
    assert_ok_quiet(p, "run over TLS");
    assert_free("cli:tls");

    /* --tls-ca after the command word, by host name. */
    snprintf(name_addr, sizeof(name_addr), "tls://localhost:%d", D->tls_port);
    p = ctl_start("run", "cli:tls", "-s", name_addr, "--tls-ca",
                  h_cert("ca.crt"), "--", "true", NULL);
    proc_wait(p, h_scale(10000));
    assert_ok_quiet(p, "run --tls-ca after run");
    /* The CA from $REDLOCKD_TLS_CA. */
    tls_ca_env = h_cert("ca.crt");
    p = ctl_start("-s", addr, "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_status(p, 0, "ping with $REDLOCKD_TLS_CA");
    tls_ca_env = NULL;
    assert_free("cli:tls");
}
END_TEST

START_TEST(tls_errors)
{
    char addr[64], extra[512];
    struct proc *p;

    snprintf(extra, sizeof(extra), ",\"ca_file\":\"%s\","
             "\"verify_clients\":true", h_cert("ca.crt"));
    start_daemon_tls("server", extra, addr, sizeof(addr));
    p = ctl_start("-s", addr, "--tls-ca", h_cert("other-ca.crt"), "run",
                  "cli:tls", "--", "sh", "-c", "exit 99", NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_UNAVAILABLE, "run, another CA", "unknown CA");
    p = ctl_start("-s", addr, "--tls-ca", h_cert("ca.crt"),
                  "--tls-server-name", "elsewhere.test", "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_UNAVAILABLE, "ping, another name",
                       "name mismatch");
    p = ctl_start("-s", addr, "--tls-ca", h_cert("ca.crt"), "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_UNAVAILABLE, "ping, no client certificate",
                       "requires a client certificate");
    p = ctl_start("ping", "-s", addr, "--tls-ca", h_cert("ca.crt"),
                  "--tls-cert", h_cert("client.crt"), "--tls-key",
                  h_cert("client.key"), NULL);
    proc_wait(p, h_scale(10000));
    assert_status(p, 0, "ping with a client certificate");
    p = ctl_start("-s", addr, "--tls-ca", "/nonexistent/ca.crt", "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_USAGE, "ping, no CA file", "/nonexistent/ca.crt");
}
END_TEST

/* A plain address of the daemon's TLS port: the daemon's own line says
 * what is wrong ("this port speaks TLS: connect with tls:// ..."), a
 * usage error (the address), and run does not run its command. */
START_TEST(tls_plain_client)
{
    char addr[64], plain[64];
    struct proc *p;

    start_daemon_tls("server", "", addr, sizeof(addr));
    snprintf(plain, sizeof(plain), "127.0.0.1:%d", D->tls_port);
    p = ctl_start("-s", plain, "ping", NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_USAGE, "ping, plain to the TLS port",
                       "this port speaks TLS");
    ck_assert_msg(strstr(p->err, "tls://"), "stderr \"%s\" lacks \"tls://\"",
                  p->err);
    p = ctl_start("-s", plain, "run", "cli:tls", "--", "sh", "-c", "exit 99",
                  NULL);
    proc_wait(p, h_scale(10000));
    assert_error_names(p, EXIT_USAGE, "run, plain to the TLS port",
                       "this port speaks TLS");
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, run_excludes);
    tcase_add_test(tc, run_busy);
    tcase_add_test(tc, run_kinds);
    tcase_add_test(tc, run_busy_exit_zero);
    tcase_add_test(tc, run_exit_status);
    tcase_add_test(tc, run_sigkill_keeps_lock);
    tcase_add_test(tc, run_waits_for_group);
    tcase_add_test(tc, run_sigterm_forwarded);
    tcase_add_test(tc, run_lease_lost);
    tcase_add_test(tc, run_daemon_stalled);
    tcase_add_test(tc, run_ctl_stopped);
    tcase_add_test(tc, inspection_commands);
    tcase_add_test(tc, options_anywhere);
    tcase_add_test(tc, run_durations);
    tcase_add_test(tc, ping_no_quorum);
    tcase_add_test(tc, unreachable_daemon);
    tcase_add_test(tc, locks_lists_holders);
    tcase_add_test(tc, release_force);
    tcase_add_test(tc, release_force_refused);
    tcase_add_test(tc, users_login);
    tcase_add_test(tc, release_force_disabled);
    tcase_add_test(tc, run_lost_terms_group);
    tcase_add_test(tc, run_lost_kills_group_after);
    tcase_add_test(tc, tls_run);
    tcase_add_test(tc, tls_errors);
    tcase_add_test(tc, tls_plain_client);
    tcase_add_test(tc, elect_two_candidates);
    tcase_add_test(tc, watch_json_lines);
    tcase_add_test(tc, lock_holds_until_signal);
    tcase_add_test(tc, elect_lock_watch_usage);
    tcase_add_test(tc, version_and_help);
    tcase_add_test(tc, readme_example);
    suite_add_tcase(s, tc);
    /* The keeper (issue 28), a case of its own: CK_RUN_CASE=keeper. */
    tc = tcase_create("keeper");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, run_keeper_close_fds);
    tcase_add_test(tc, run_keeper_release_at_once);
    tcase_add_test(tc, run_keeper_ctl_stopped);
    tcase_add_test(tc, run_signal_after_command);
    tcase_add_test(tc, run_unlock_after_deadline);
    suite_add_tcase(s, tc);
    /* Failover through two daemons: CK_RUN_CASE=failover. */
    tc = tcase_create("failover");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, run_failover_restart);
    tcase_add_test(tc, run_failover_kill);
    tcase_add_test(tc, run_lock_fails_over);
    tcase_add_test(tc, watch_follows_failover);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cli_suite());
    int failed;

    h_certs_make();
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    h_certs_remove();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
