/*
 * test_lostupdate: no lost updates under faults, checked on registers the
 * locks guard (suite "fault"). A Jepsen-style companion of test_mutex:
 * that one checks the holders' intervals; this one checks what a lock is
 * for, that read-modify-write under it loses nothing.
 *
 * Three redis-server lock nodes, two redlockd daemons on them, and a fourth
 * redis-server that is no lock node but the storage the locks guard: NREG
 * registers, each a counter and the highest fence it accepted. A write is
 * a script that refuses a fence below the last one accepted (fencing, as
 * docs/protocol.md asks of storage). NCLIENTS clients, driven by one
 * single-threaded poll loop, each repeat a round on a register i:
 *
 *   LOCK reg:i ttl= wait=  on a daemon (ttl up to that daemon's max_ttl_ms)
 *   GET its counter        (a plain read, as most storage offers)
 *   work a while           (mostly short; some holds outlast the ttl, kept
 *                           alive by the daemon's renewals and LOCKS)
 *   write counter+1 with the fence; acknowledged only if the register
 *                           answered 1 (0: a stale fence, refused)
 *   UNLOCK reg:i
 *
 * Clients follow the lease deadline rule of docs/protocol.md: the deadline
 * is the time LOCK (or LOCKS) was sent plus the validity of its reply,
 * LOCKS refreshes it every ttl/4, and it is checked, after reading what
 * the daemon sent meanwhile, right before the read and right before the
 * write. Past it, or after EVENT LOST, an error or a lost connection, the
 * client gives the round up and writes nothing.
 *
 * If the locks exclude, every acknowledged increment is in the final
 * values: asserted, per register, final == acknowledged (no lost update).
 * Two holders at once show as a lost update when the lower fence writes
 * between the higher one's read and write (the fence protects the write,
 * not the read before it), or as a stale write refused when it comes after
 * the higher one's write (counted and printed, not a failure). A lost
 * update is printed from the register's own log of accepted writes, with
 * the writers involved: client, daemon, fence, times, the faults then.
 * Also counted, not asserted (the first few printed in detail): pairs of
 * holders whose work overlapped, and fences granted twice.
 *
 * Faults, from a seeded schedule: a lock node stopped (SIGSTOP) and
 * continued; a lock node killed with -9 and restarted on its directory;
 * FLUSHALL of a lock node, and of two at once; a daemon's config file
 * rewritten to raise locks.max_ttl_ms, then SIGHUP; daemons with different
 * max_ttl_ms; a daemon restarted (SIGTERM, after which it must exit 0,
 * then started again with the same settings); a daemon stopped for longer
 * than its longest ttl, then continued. The faults that lose keys wait
 * (a few seconds at most) for a client in the middle of a hold, its write
 * due soon, while another waits for the same lock on the other daemon.
 * Case "general" runs each fault once, one after the other, on nodes with
 * appendfsync always; case "flush_ttl" runs nodes without persistence,
 * daemons with max_ttl_ms 1000 (raised to 6000 by SIGHUP) and 6000, and
 * overlaps the faults that lose keys: a node killed during another's
 * pause, flushes, a flush during a pause.
 *
 * Each case also asserts enough rounds and acknowledged increments (a run
 * that did nothing fails), that every fault of the schedule happened, no
 * unexpected reply, and that every daemon not killed on purpose exits 0 on
 * SIGTERM (during the run and at the end). A third case shows the checker
 * is not blind: daemons with different key prefixes do not see each
 * other's locks, and it must find lost updates.
 *
 * The seed is printed and can be replayed with REDLOCKD_LOSTUPDATE_SEED;
 * timing still varies from run to run, so a seed reproduces the schedule
 * and the clients' choices, not every interleaving.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NNODES 3
#define NDAEMONS 2
#define NCLIENTS 8

#define NREG 3                          /* registers, each its own lock */
#define RES_FMT "reg:%d"                /* the lock of register i */
#define REG_VALUE "lu:value:%d"         /* its counter */
#define REG_FENCE "lu:fence:%d"         /* the highest fence it accepted */
#define REG_LOG "lu:log:%d"             /* "attempt fence value" per write */
#define RES_NAME_MAX 16

#define TTL_MIN_MS 300                  /* the shortest ttl a client asks */
#define WAIT_MIN_MS 200
#define WAIT_MAX_MS 1000
#define IMPATIENT_MS 1500               /* reply timeout beyond wait= */
#define WRITE_GUARD_US 2000             /* a register call takes < 1 ms */
#define ARM_MS 4000                     /* a fault waits this long for a holder */
#define DRAIN_MS 10000                  /* the end: outstanding requests */
#define RELOAD_WAIT_MS 3000             /* SIGHUP to "reload:" in the log */
#define CAP_MS 80000                    /* no run starts a round after this */
#define MAX_ATT 16384                   /* grants recorded */
#define MAX_FAULTS 16
#define CLIENT_BUF 8192
#define MAX_REPORT 8                    /* anomalies printed in detail */
#define REPORT(n) (!rc->quiet && (n) <= MAX_REPORT)

#define US(ms) ((int64_t)(ms) * 1000)

/* The register's fenced write: KEYS value, fence, log; ARGV the new
 * value, the writer's fence and its attempt number. */
static const char reg_write_lua[] =
    "local last = tonumber(redis.call('GET', KEYS[2]) or '0') "
    "local f = tonumber(ARGV[2]) "
    "if f < last then return 0 end "
    "redis.call('SET', KEYS[1], ARGV[1]) "
    "redis.call('SET', KEYS[2], ARGV[2]) "
    "redis.call('RPUSH', KEYS[3], ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. ARGV[1]) "
    "return 1";

/* ---- what one run is --------------------------------------------------- */

struct run_conf {
    const char *name;
    const char *node_extra;     /* redis-server args of the lock nodes */
    int max_ttl[NDAEMONS];      /* locks.max_ttl_ms each daemon starts with */
    int probe_ms;               /* redis.probe_interval_ms */
    int long_pct;               /* rounds whose hold is ttl/2 .. 1.25 ttl */
    int mid_pct, mid_lo, mid_hi;    /* rounds whose hold is mid_lo .. mid_hi ms */
    int tail_ms;                /* the run goes on this long after the faults */
    int min_rounds, min_acked;  /* a run that did less fails */
    const char *prefix[NDAEMONS];   /* locks.key_prefix, NULL: the default */
    bool quiet;                 /* count anomalies, print none in detail */
    void (*plan)(void);
};

enum fault_kind {
    F_NODE_STOP, F_NODE_KILL, F_FLUSH, F_FLUSH2, F_TTL_RAISE,
    F_DAEMON_RESTART, F_DAEMON_STOP, F_NKINDS
};

static const char *const fault_names[F_NKINDS] = {
    "node-stop", "node-kill", "flush", "flush2", "ttl-raise",
    "daemon-restart", "daemon-stop",
};

enum fault_state { FS_PLANNED, FS_ACTIVE, FS_DONE, FS_SKIPPED };

struct fault {
    enum fault_kind kind;
    int target, target2;        /* node or daemon; target2: flush2's other */
    int anchor;                 /* `at` counts from this fault, or -1: the run */
    bool from_end;              /* ... from its end, not its beginning */
    int64_t at;                 /* us after the anchor */
    int dur_ms;                 /* 0: instant; daemon-stop: 0 = max_ttl + x */
    int param;                  /* ttl-raise: the new locks.max_ttl_ms */
    int want_hold_ms;           /* > 0: fire while a holder has this long left */
    int write_after_ms;         /* ... its write due after this (0: half that) */
    int write_within_ms;        /* ... and (> 0) within this */
    bool hold_since_anchor;     /* ... of a lock granted since the anchor began */
    int hold_daemon;            /* ... on this daemon (-1: either) */
    bool on_holder;             /* a daemon fault: hit that holder's daemon */
    int holder_daemon;          /* the daemon of the holder found, or -1 */
    int end_anchor;             /* >= 0: end this long after that fault ends */
    int end_after_ms;
    enum fault_state state;
    int64_t armed;              /* us: when it first was due */
    int64_t t_begin, t_end;     /* us since t_run, as they happened */
    int64_t end_due;            /* us since t_run */
    char what[96];
};

enum req { REQ_NONE, REQ_HELLO, REQ_LOCK, REQ_LOCKS, REQ_UNLOCK };
enum phase { PH_NONE, PH_READ, PH_THINK };

/* One grant, from LOCK's OK to the end of the round. */
enum att_result {
    ATT_HOLDING, ATT_ACKED, ATT_STALE, ATT_EXPIRED, ATT_LOST, ATT_DROPPED,
    ATT_NRESULTS
};

static const char *const att_names[ATT_NRESULTS] = {
    "holding", "acknowledged", "stale-refused", "expired", "lost-lease",
    "dropped",
};

struct attempt {
    int client, daemon, dgen, ttl, reg;
    uint64_t fence;
    char token[12];
    /* us since t_run; -1: did not happen */
    int64_t sent, granted, read_at, write_at, done, deadline;
    long long read_val;
    enum att_result result;
    bool unlock_lost;           /* its UNLOCK was answered ERR LOST */
};

/* A redlockd client: one connection, one request in flight, one lock. */
struct client {
    int id;
    int fd;                     /* -1: not connected */
    int daemon;                 /* where it connects next / is connected */
    char buf[CLIENT_BUF];
    size_t len;
    enum req req;
    int64_t req_sent, req_timeout;
    int64_t next_at;            /* reconnect / next round not before */
    int rounds;                 /* LOCK requests sent */
    int ttl;                    /* of the LOCK in flight or the lock held */
    int reg;                    /* ... on this register */
    char res[RES_NAME_MAX];     /* its lock's name */
    bool held;                  /* granted and not given up */
    enum phase phase;
    int att;                    /* its attempt, or -1 */
    int last_att;               /* the round's attempt, for its UNLOCK */
    uint64_t fence;
    int64_t deadline, refreshed, write_at;
    long long read_val;
};

enum dstate { D_UP, D_STOPPED, D_TERMINATING, D_DOWN };

struct counts {
    int rounds, grants, acked, acked_reg[NREG], stale, expired, lost_leases;
    int refused, dropped, unexpected, late_writes, unlock_lost;
    int faults[F_NKINDS], skipped, crashed, term_bad, reloads;
};

/* Its nodes and daemons (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_daemon *const D = K.daemons;
static struct h_redis R;                /* the register */
static enum dstate dstate[NDAEMONS];
static bool d_crashed[NDAEMONS];
static int d_gen[NDAEMONS];             /* restarts */
static int d_max_now[NDAEMONS];         /* max_ttl_ms the daemon applies */
static int d_max_conf[NDAEMONS];        /* ... its config file says */
static int d_term_status[NDAEMONS];     /* of the last SIGTERM during the run */
static struct {
    bool pending;
    long offset;                        /* log size when SIGHUP went out */
    int want;
    int64_t until;
} reload[NDAEMONS];
static bool node_busy[NNODES];          /* stopped or down by a fault */
static struct client C[NCLIENTS];
static struct attempt A[MAX_ATT];
static int natt;
static bool att_overflow;
static struct fault F[MAX_FAULTS];
static int nfaults;
static struct counts cnt;
static const struct run_conf *rc;
static redisContext *reg;
static int64_t t_run;
static bool stopping;
static char unexpected_msg[2048];

/* ---- time and randomness ----------------------------------------------- */

static int64_t rel(int64_t t)
{
    return t - t_run;
}

static double secs(int64_t r)
{
    return (double)r / 1e6;
}

static void note_unexpected(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void note_unexpected(const char *fmt, ...)
{
    size_t len = strlen(unexpected_msg);
    va_list ap;

    cnt.unexpected++;
    if (len + 2 >= sizeof(unexpected_msg))
        return;
    va_start(ap, fmt);
    vsnprintf(unexpected_msg + len, sizeof(unexpected_msg) - len - 1, fmt, ap);
    va_end(ap);
    len = strlen(unexpected_msg);
    unexpected_msg[len] = '\n';
    unexpected_msg[len + 1] = '\0';
}

/* ---- daemons ------------------------------------------------------------ */

static void daemon_json(int i, char *buf, size_t size)
{
    char prefix[64] = "";

    if (rc->prefix[i] != NULL)
        snprintf(prefix, sizeof(prefix), ",\"key_prefix\":\"%s\"", rc->prefix[i]);
    /* Under the wrapper the harness's longer command timeout stays. */
    snprintf(buf, size,
             "{\"id\":\"lu%d\",\"redis\":{%s\"reconnect_max_ms\":250,"
             "\"probe_interval_ms\":%d},\"locks\":{\"max_ttl_ms\":%d,"
             "\"default_ttl_ms\":%d%s}}",
             i, h_slow() ? "" : "\"command_timeout_ms\":100,", rc->probe_ms,
             d_max_conf[i], TTL_MIN_MS, prefix);
}

static void daemon_start(int i)
{
    char json[512];

    daemon_json(i, json, sizeof(json));
    h_cluster_daemon_start(&K, i, json);
    dstate[i] = D_UP;
    d_max_now[i] = d_max_conf[i];
    reload[i].pending = false;
}

static bool daemon_usable(int i)
{
    return D[i].pid != 0 && !d_crashed[i] && dstate[i] != D_DOWN;
}

static bool daemon_exited(int i)
{
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    return D[i].pid != 0 &&
           waitid(P_PID, (id_t)D[i].pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == D[i].pid;
}

/* The exit of a daemon told to terminate: collect it (h_daemon_stop on a
 * zombie returns its status at once). */
static void daemon_reap(int i)
{
    int st = h_daemon_stop(&D[i]);

    d_term_status[i] = st;
    if (st != 0) {
        cnt.term_bad++;
        fprintf(stderr, "lostupdate: +%.1f s daemon %d exited %d on SIGTERM\n",
                secs(rel(h_now_us())), i, st);
        h_daemon_dump_log(&D[i]);
    }
    dstate[i] = D_DOWN;
}

/* A daemon that exited while nobody meant it to (WNOWAIT: h_daemon_stop
 * still collects it at the end); one told to terminate is reaped. */
static void daemon_watch(void)
{
    for (int i = 0; i < NDAEMONS; i++) {
        if (D[i].pid == 0 || d_crashed[i] || !daemon_exited(i))
            continue;
        if (dstate[i] == D_TERMINATING) {
            daemon_reap(i);
            continue;
        }
        d_crashed[i] = true;
        cnt.crashed++;
        fprintf(stderr, "lostupdate: +%.1f s daemon %d (pid %d) died\n",
                secs(rel(h_now_us())), i, (int)D[i].pid);
    }
}

/* Has the daemon's log, from `offset` on, a line containing `needle`? */
static bool log_has_since(const struct h_daemon *d, long offset, const char *needle)
{
    static char buf[1 << 18];
    FILE *f = fopen(d->log_path, "r");
    size_t n;

    if (f == NULL)
        return false;
    if (fseek(f, offset, SEEK_SET) != 0) {
        fclose(f);
        return false;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static long file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Rewrite the daemon's config with a new locks.max_ttl_ms and SIGHUP it;
 * clients use the new maximum once the log says it was applied. */
static void daemon_raise_ttl(int i, int max_ttl)
{
    json_error_t err;
    json_t *conf = json_load_file(D[i].conf_path, 0, &err);
    json_t *locks;

    ck_assert_msg(json_is_object(conf), "%s: %s", D[i].conf_path, err.text);
    locks = json_object_get(conf, "locks");
    if (!json_is_object(locks)) {
        locks = json_object();
        json_object_set_new(conf, "locks", locks);
    }
    json_object_set_new(locks, "max_ttl_ms", json_integer(max_ttl));
    ck_assert_int_eq(json_dump_file(conf, D[i].conf_path, JSON_INDENT(2)), 0);
    json_decref(conf);
    d_max_conf[i] = max_ttl;
    reload[i].pending = true;
    reload[i].offset = file_size(D[i].log_path);
    reload[i].want = max_ttl;
    reload[i].until = h_now_us() + US(h_scale(RELOAD_WAIT_MS));
    ck_assert_int_eq(kill(D[i].pid, SIGHUP), 0);
}

static void reload_tick(int64_t now)
{
    for (int i = 0; i < NDAEMONS; i++) {
        char want[64];

        if (!reload[i].pending || dstate[i] != D_UP)
            continue;
        snprintf(want, sizeof(want), "reload: locks.max_ttl_ms %d -> %d",
                 d_max_now[i], reload[i].want);
        if (log_has_since(&D[i], reload[i].offset, want)) {
            d_max_now[i] = reload[i].want;
            reload[i].pending = false;
            cnt.reloads++;
            fprintf(stderr, "lostupdate: +%.1f s daemon %d applies "
                    "max_ttl_ms=%d\n", secs(rel(now)), i, d_max_now[i]);
        } else if (now >= reload[i].until) {
            reload[i].pending = false;
            note_unexpected("daemon %d: no \"%s\" in its log %d ms after SIGHUP",
                            i, want, h_scale(RELOAD_WAIT_MS));
        }
    }
}

/* ---- the register ------------------------------------------------------- */

static long long reg_read(int i)
{
    redisReply *r = redisCommand(reg, "GET " REG_VALUE, i);
    long long v;

    ck_assert_msg(r != NULL, "register GET: %s", reg->errstr);
    ck_assert_msg(r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING,
                  "register GET: reply type %d", r->type);
    v = r->type == REDIS_REPLY_NIL ? 0 : strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

/* 1: written, 0: refused (a fence below the last one accepted). */
static int reg_write(int i, long long value, uint64_t fence, int att)
{
    redisReply *r = redisCommand(reg, "EVAL %s 3 " REG_VALUE " " REG_FENCE " "
                                 REG_LOG " %lld %" PRIu64 " %d", reg_write_lua,
                                 i, i, i, value, fence, att);
    int v;

    ck_assert_msg(r != NULL, "register write: %s", reg->errstr);
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER &&
                  (r->integer == 0 || r->integer == 1),
                  "register write: type %d %s", r->type,
                  r->type == REDIS_REPLY_ERROR ? r->str : "");
    v = (int)r->integer;
    freeReplyObject(r);
    return v;
}

/* ---- redlockd clients --------------------------------------------------- */

static int other_daemon(int i)
{
    return (i + 1) % NDAEMONS;
}

static struct attempt *att_of(const struct client *c)
{
    return c->att >= 0 ? &A[c->att] : NULL;
}

/* The round's grant is over: how, and when. One that did not write
 * stopped working at its deadline if that came first. */
static void att_end(struct client *c, enum att_result how, int64_t t)
{
    struct attempt *a = att_of(c);

    if (how != ATT_ACKED && how != ATT_STALE && t > c->deadline)
        t = c->deadline;
    if (a != NULL && a->result == ATT_HOLDING) {
        a->result = how;
        a->done = rel(t);
    }
    c->last_att = c->att;
    c->att = -1;
    c->held = false;
    c->phase = PH_NONE;
}

static void client_drop(struct client *c, bool failover)
{
    int64_t now = h_now_us();

    if (c->held)
        att_end(c, ATT_DROPPED, now);
    c->att = -1;
    c->held = false;
    c->phase = PH_NONE;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = 0;
    c->req = REQ_NONE;
    c->daemon = failover ? other_daemon(c->daemon) : c->id % NDAEMONS;
    c->next_at = now + US(h_rng_range(50, 200));
    cnt.dropped++;
}

static void client_send(struct client *c, enum req req, int timeout_ms,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void client_send(struct client *c, enum req req, int timeout_ms,
                        const char *fmt, ...)
{
    char line[256];
    va_list ap;
    int n;
    ssize_t w;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    ck_assert(n > 0 && n < (int)sizeof(line) - 1);
    line[n++] = '\n';
    c->req = req;
    c->req_sent = h_now_us();
    c->req_timeout = c->req_sent + US(timeout_ms);
    do {
        w = send(c->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w != n)
        client_drop(c, true);
}

static void client_connect(struct client *c, int64_t now)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    int fd;

    if (!daemon_usable(c->daemon))
        c->daemon = other_daemon(c->daemon);
    if (!daemon_usable(c->daemon)) {
        c->next_at = now + US(100);
        return;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    sa.sin_port = htons((uint16_t)D[c->daemon].port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        c->daemon = other_daemon(c->daemon);
        c->next_at = now + US(100);
        return;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    c->fd = fd;
    c->len = 0;
    client_send(c, REQ_HELLO, h_scale(IMPATIENT_MS), "HELLO name=lu%d", c->id);
}

static void client_lock(struct client *c)
{
    int max = d_max_now[c->daemon];
    int lo = h_slow() ? 4 * TTL_MIN_MS : TTL_MIN_MS;
    int wait = h_rng_range(WAIT_MIN_MS, WAIT_MAX_MS);

    if (lo > max)
        lo = max;
    c->ttl = h_rng_range(lo, max);
    c->reg = h_rng_range(0, NREG - 1);
    snprintf(c->res, sizeof(c->res), RES_FMT, c->reg);
    cnt.rounds++;
    c->rounds++;
    client_send(c, REQ_LOCK, wait + h_scale(IMPATIENT_MS),
                "LOCK %s ttl=%d wait=%d", c->res, c->ttl, wait);
}

static void round_done(struct client *c, int64_t now)
{
    c->next_at = now + US(h_rng_range(0, 40));
}

static int think_ms(const struct client *c)
{
    int r = h_rng_range(0, 99);

    if (r < rc->long_pct)
        return h_rng_range(c->ttl / 2, c->ttl + c->ttl / 4);
    if (r < rc->long_pct + rc->mid_pct)
        return h_rng_range(rc->mid_lo, rc->mid_hi);
    return h_rng_range(0, 20);
}

static void on_lock_reply(struct client *c, const char *line, int64_t now)
{
    const char *v;
    struct attempt *a;

    if (h_starts(line, "OK resource=")) {
        v = h_kv(line, "resource");
        ck_assert_msg(v != NULL && strcmp(v, c->res) == 0, "client %d asked for "
                      "%s: %s", c->id, c->res, line);
        v = h_kv(line, "fence");
        ck_assert_msg(v != NULL, "LOCK reply without fence: %s", line);
        c->fence = strtoull(v, NULL, 10);
        v = h_kv(line, "validity");
        ck_assert_msg(v != NULL, "LOCK reply without validity: %s", line);
        c->deadline = c->req_sent + US(strtoll(v, NULL, 10));
        c->refreshed = c->req_sent;
        c->held = true;
        c->phase = PH_READ;
        cnt.grants++;
        c->att = -1;
        if (natt < MAX_ATT) {
            c->att = natt++;
            a = &A[c->att];
            memset(a, 0, sizeof(*a));
            a->client = c->id;
            a->daemon = c->daemon;
            a->dgen = d_gen[c->daemon];
            a->ttl = c->ttl;
            a->reg = c->reg;
            a->fence = c->fence;
            v = h_kv(line, "token");
            snprintf(a->token, sizeof(a->token), "%s", v != NULL ? v : "?");
            a->sent = rel(c->req_sent);
            a->granted = rel(now);
            a->read_at = a->write_at = a->done = -1;
            a->deadline = rel(c->deadline);
            a->read_val = -1;
            a->result = ATT_HOLDING;
        } else {
            att_overflow = true;
        }
        /* A grant that waited: confirm the lease before working (the
         * deadline counts from the send). */
        if (c->deadline - now < US(c->ttl / 2)) {
            c->refreshed = now;
            client_send(c, REQ_LOCKS, h_scale(IMPATIENT_MS), "LOCKS");
        }
        return;
    }
    if (h_starts(line, "ERR BUSY ") || h_starts(line, "ERR TIMEOUT ") ||
        h_starts(line, "ERR UNAVAILABLE ")) {
        cnt.refused++;
        round_done(c, now);
        return;
    }
    if (h_starts(line, "ERR SHUTDOWN ")) {
        client_drop(c, true);
        return;
    }
    note_unexpected("client %d: LOCK ttl=%d on daemon %d answered \"%s\"",
                    c->id, c->ttl, c->daemon, line);
    round_done(c, now);
}

static void on_locks_reply(struct client *c, const char *line, int64_t now)
{
    json_t *o, *locks, *l, *found = NULL, *v = NULL;
    json_error_t err;
    size_t i;

    if (!h_starts(line, "OK {")) {
        note_unexpected("client %d: LOCKS answered \"%s\"", c->id, line);
        return;
    }
    if (!c->held)
        return;     /* given up meanwhile (EVENT LOST) */
    o = json_loads(line + 3, 0, &err);
    ck_assert_msg(json_is_object(o), "LOCKS: bad JSON (%s): %s", err.text, line);
    locks = json_object_get(o, "locks");
    json_array_foreach(locks, i, l) {
        const char *name = json_string_value(json_object_get(l, "resource"));
        json_t *fence = json_object_get(l, "fence");

        if (name != NULL && strcmp(name, c->res) == 0 &&
            json_is_integer(fence) &&
            (uint64_t)json_integer_value(fence) == c->fence)
            found = l;
    }
    if (found != NULL)
        v = json_object_get(found, "validity");
    if (!json_is_integer(v) || json_integer_value(v) <= 0) {
        cnt.lost_leases++;
        att_end(c, ATT_LOST, now);
        round_done(c, now);
    } else {
        /* The newest confirmation counts, even a shorter one. */
        c->deadline = c->req_sent + US(json_integer_value(v));
        if (att_of(c) != NULL)
            att_of(c)->deadline = rel(c->deadline);
    }
    json_decref(o);
}

static void on_unlock_reply(struct client *c, const char *line, int64_t now)
{
    if (h_starts(line, "ERR LOST ")) {
        cnt.unlock_lost++;
        if (c->last_att >= 0)
            A[c->last_att].unlock_lost = true;
    } else if (!h_starts(line, "OK resource=") && !h_starts(line, "ERR NOTHELD "))
        note_unexpected("client %d: UNLOCK answered \"%s\"", c->id, line);
    round_done(c, now);
}

static void on_event(struct client *c, const char *line, int64_t now)
{
    const char *v;

    if (!h_starts(line, "EVENT LOST "))
        return;     /* SHUTDOWN, CLOSING: the connection's end tells */
    v = h_kv(line, "resource");
    if (!c->held || v == NULL || strcmp(v, c->res) != 0)
        return;
    v = h_kv(line, "fence");
    if (v == NULL || strtoull(v, NULL, 10) != c->fence)
        return;
    cnt.lost_leases++;
    att_end(c, ATT_LOST, now);
    if (c->req == REQ_NONE)
        round_done(c, now);
}

static void client_line(struct client *c, const char *line, int64_t now)
{
    enum req req = c->req;

    if (h_starts(line, "EVENT ")) {
        on_event(c, line, now);
        return;
    }
    c->req = REQ_NONE;
    switch (req) {
    case REQ_HELLO:
        if (!h_starts(line, "OK proto=1 "))
            note_unexpected("client %d: HELLO answered \"%s\"", c->id, line);
        c->next_at = now;
        break;
    case REQ_LOCK:
        on_lock_reply(c, line, now);
        break;
    case REQ_LOCKS:
        on_locks_reply(c, line, now);
        break;
    case REQ_UNLOCK:
        on_unlock_reply(c, line, now);
        break;
    case REQ_NONE:
        note_unexpected("client %d: a reply nobody asked for: \"%s\"", c->id, line);
        break;
    }
}

/* Read what has arrived (never blocks) and act on every complete line. */
static void client_read(struct client *c)
{
    while (c->fd >= 0) {
        ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, 0);
        int64_t now = h_now_us();
        char *lf;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            client_drop(c, true);
            return;
        }
        c->len += (size_t)n;
        while (c->fd >= 0 && (lf = memchr(c->buf, '\n', c->len)) != NULL) {
            size_t ll = (size_t)(lf - c->buf);

            *lf = '\0';
            client_line(c, c->buf, now);
            if (c->fd < 0)
                return;
            memmove(c->buf, lf + 1, c->len - ll - 1);
            c->len -= ll + 1;
        }
        ck_assert_msg(c->len < sizeof(c->buf) - 1, "client %d: a line of %zu bytes",
                      c->id, c->len);
    }
}

/* The careful-client check before touching the register: whatever the
 * daemon said is read first, then the deadline must leave room for the
 * call. False: the round is given up. */
static bool client_may_work(struct client *c)
{
    client_read(c);
    if (c->fd < 0 || !c->held)
        return false;
    if (h_now_us() + WRITE_GUARD_US >= c->deadline) {
        int64_t now = h_now_us();

        cnt.expired++;
        att_end(c, ATT_EXPIRED, now);
        client_send(c, REQ_UNLOCK, h_scale(IMPATIENT_MS), "UNLOCK %s", c->res);
        return false;
    }
    return true;
}

static void client_do_read(struct client *c)
{
    struct attempt *a;

    if (!client_may_work(c))
        return;
    c->read_val = reg_read(c->reg);
    c->write_at = h_now_us() + US(think_ms(c));
    c->phase = PH_THINK;
    a = att_of(c);
    if (a != NULL) {
        a->read_at = rel(h_now_us());
        a->read_val = c->read_val;
    }
}

static void client_do_write(struct client *c)
{
    struct attempt *a;
    int64_t t0, t1;
    int ok;

    if (!client_may_work(c))
        return;
    t0 = h_now_us();
    ok = reg_write(c->reg, c->read_val + 1, c->fence, c->att);
    t1 = h_now_us();
    a = att_of(c);
    if (a != NULL)
        a->write_at = rel(t0);
    if (t1 > c->deadline) {
        cnt.late_writes++;
        fprintf(stderr, "lostupdate: +%.3f s client %d's write ended %.3f ms "
                "after its deadline (the test stalled)\n", secs(rel(t1)),
                c->id, (double)(t1 - c->deadline) / 1e3);
    }
    if (ok) {
        cnt.acked++;
        cnt.acked_reg[c->reg]++;
        att_end(c, ATT_ACKED, t1);
    } else {
        cnt.stale++;
        att_end(c, ATT_STALE, t1);
    }
    client_send(c, REQ_UNLOCK, h_scale(IMPATIENT_MS), "UNLOCK %s", c->res);
}

static bool client_busy(const struct client *c)
{
    return c->fd >= 0 && (c->req != REQ_NONE || c->held);
}

static void client_tick(struct client *c, int64_t now)
{
    if (c->fd < 0) {
        if (!stopping && now >= c->next_at)
            client_connect(c, now);
        return;
    }
    if (c->req != REQ_NONE) {
        /* Not past the deadline waiting for an answer: stop and close. */
        if (now >= c->req_timeout || (c->held && now >= c->deadline)) {
            if (c->held) {
                cnt.expired++;
                att_end(c, ATT_EXPIRED, now);
            }
            client_drop(c, true);
        }
        return;
    }
    if (c->held) {
        if (c->phase == PH_READ) {
            client_do_read(c);
        } else if (now >= c->write_at) {
            client_do_write(c);
        } else if (now >= c->deadline - WRITE_GUARD_US) {
            (void)client_may_work(c);  /* gives it up */
        } else if (now - c->refreshed >= US(c->ttl / 4)) {
            c->refreshed = now;
            client_send(c, REQ_LOCKS, h_scale(IMPATIENT_MS), "LOCKS");
        }
        return;
    }
    if (!stopping && now >= c->next_at)
        client_lock(c);
}

/* ---- the fault schedule ------------------------------------------------- */

static struct fault *fault_add(enum fault_kind kind, int anchor, bool from_end,
                               int at_ms, int dur_ms)
{
    struct fault *f;

    ck_assert_int_lt(nfaults, MAX_FAULTS);
    f = &F[nfaults++];
    memset(f, 0, sizeof(*f));
    f->kind = kind;
    f->anchor = anchor;
    f->from_end = from_end;
    f->at = US(at_ms);
    f->dur_ms = dur_ms;
    f->target = f->target2 = -1;
    f->end_anchor = -1;
    f->hold_daemon = f->holder_daemon = -1;
    f->state = FS_PLANNED;
    return f;
}

/* Each after the end of the one before. */
static struct fault *fault_next(enum fault_kind kind, int gap_ms, int dur_ms)
{
    return fault_add(kind, nfaults - 1, nfaults > 0, nfaults > 0 ? gap_ms : 2000,
                     dur_ms);
}

static int other_node(int a, int b)
{
    int k;

    do {
        k = h_rng_range(0, NNODES - 1);
    } while (k == a || k == b);
    return k;
}

/* Case "general": every kind once, one after the other, in random order. */
static void plan_general(void)
{
    enum fault_kind order[] = {
        F_NODE_STOP, F_NODE_KILL, F_FLUSH, F_TTL_RAISE, F_DAEMON_RESTART,
        F_DAEMON_STOP,
    };
    int n = (int)(sizeof(order) / sizeof(*order));

    for (int i = n - 1; i > 0; i--) {
        int j = h_rng_range(0, i);
        enum fault_kind k = order[i];

        order[i] = order[j];
        order[j] = k;
    }
    for (int i = 0; i < n; i++) {
        struct fault *f = fault_next(order[i], h_rng_range(1200, 2000), 0);

        switch (f->kind) {
        case F_NODE_STOP:
            f->target = h_rng_range(0, NNODES - 1);
            f->dur_ms = h_rng_range(1000, 2500);
            break;
        case F_NODE_KILL:
            f->target = h_rng_range(0, NNODES - 1);
            f->dur_ms = h_rng_range(300, 1500);
            break;
        case F_FLUSH:
            f->target = h_rng_range(0, NNODES - 1);
            f->want_hold_ms = 400;
            f->write_within_ms = 700;
            break;
        case F_TTL_RAISE:
            f->target = h_rng_range(0, NDAEMONS - 1);
            f->param = 4000;
            break;
        case F_DAEMON_RESTART:
            /* SIGTERM while a holder on it is about to write and a
             * waiter on the other daemon asks for the same lock. */
            f->target = h_rng_range(0, NDAEMONS - 1);
            f->dur_ms = h_rng_range(300, 1500);
            f->want_hold_ms = 100;
            f->write_after_ms = 5;
            f->write_within_ms = 40;
            f->on_holder = true;
            break;
        case F_DAEMON_STOP:
            f->target = h_rng_range(0, NDAEMONS - 1);
            f->dur_ms = 0;      /* longer than its max_ttl, when it starts */
            break;
        default:
            break;
        }
    }
}

/*
 * Case "flush_ttl": daemon 0 starts with max_ttl_ms 1000 and raises it to
 * 6000 by SIGHUP, daemon 1 has 6000 from the start (raised to 8000 later);
 * then the faults that lose keys, timed for a holder in the middle of its
 * hold and a waiter for its lock on the other daemon: a node killed (it
 * comes back empty: no persistence) during another node's pause, a flush,
 * two nodes flushed at once, a flush during a pause.
 */
static void plan_flush_ttl(void)
{
    struct fault *f;
    int x, y, a;

    f = fault_add(F_TTL_RAISE, -1, false, 1500, 0);
    f->target = 0;
    f->param = 6000;

    /* Locks granted during the pause are on the two other nodes only;
     * one of them is killed under a long one of daemon 1 and comes back
     * empty. The pause ends once daemon 0, had it kept the wait of the
     * max_ttl_ms it started with, would let the empty node vote again: the
     * paused node and it are then a quorum that never saw the lock. The
     * wait must cover the longest lease any daemon may hold (6000). */
    x = h_rng_range(0, NNODES - 1);
    y = other_node(x, -1);
    f = fault_next(F_NODE_STOP, 1500, 1);
    f->target = x;
    a = nfaults - 1;
    f->end_anchor = a + 1;
    f->end_after_ms = 1500;
    f = fault_add(F_NODE_KILL, a, false, 500, 300);
    f->target = y;
    f->want_hold_ms = 2500;
    f->write_after_ms = 1800;   /* after the pause ends */
    f->write_within_ms = 3500;
    f->hold_since_anchor = true;
    f->hold_daemon = 1;

    f = fault_add(F_FLUSH, a, true, 2000, 0);
    f->target = h_rng_range(0, NNODES - 1);
    f->want_hold_ms = 400;
    f->write_within_ms = 700;

    x = h_rng_range(0, NNODES - 1);
    f = fault_next(F_FLUSH2, 2500, 0);
    f->target = x;
    f->target2 = other_node(x, -1);
    f->want_hold_ms = 400;
    f->write_within_ms = 700;

    f = fault_next(F_TTL_RAISE, 2500, 0);
    f->target = 1;
    f->param = 8000;

    x = h_rng_range(0, NNODES - 1);
    f = fault_next(F_NODE_STOP, 1000, 1);
    f->target = x;
    a = nfaults - 1;
    f->end_anchor = a + 1;
    f->end_after_ms = 1500;
    f = fault_add(F_FLUSH, a, false, 500, 0);
    f->target = other_node(x, -1);
    f->want_hold_ms = 400;
    f->write_within_ms = 700;
    f->hold_since_anchor = true;
}

/* No faults. */
static void plan_none(void)
{
}

/* When a planned fault is due (us since t_run), or -1: not yet known. */
static int64_t fault_due(const struct fault *f)
{
    const struct fault *an;

    if (f->anchor < 0)
        return f->at;
    an = &F[f->anchor];
    if (an->state == FS_PLANNED || (f->from_end && an->state == FS_ACTIVE))
        return -1;
    return (f->from_end ? an->t_end : an->t_begin) + f->at;
}

/*
 * Is the moment right for a fault that wants a holder: 2 when a client is
 * in the middle of a hold with at least want_hold_ms of its lease left and
 * its write due in [write_after_ms (or half of want_hold_ms),
 * write_within_ms (when set)], granted since the anchor began and on
 * hold_daemon if the fault says so, while another client waits for the
 * same lock on the other daemon (a waiter on the holder's own daemon
 * queues behind it there and asks no node); 1 for such a holder alone; 0
 * for none. The holder's daemon goes to f->holder_daemon. A flush then
 * leaves the holder's key on too few nodes while the waiter asks, and the
 * holder writes soon after: if the waiter is granted too, its read and
 * write likely straddle that write.
 */
static int holder_ready(struct fault *f, int64_t now)
{
    int best = 0;

    f->holder_daemon = -1;
    for (int i = 0; i < NCLIENTS; i++) {
        const struct client *c = &C[i];
        const struct attempt *a = att_of(c);

        if (c->fd < 0 || !c->held || c->phase != PH_THINK ||
            c->write_at - now < (f->write_after_ms > 0 ? US(f->write_after_ms)
                                 : US(f->want_hold_ms) / 2) ||
            c->deadline - now < US(f->want_hold_ms) ||
            (f->write_within_ms > 0 && c->write_at - now > US(f->write_within_ms)))
            continue;
        if (f->hold_daemon >= 0 && c->daemon != f->hold_daemon)
            continue;
        if (f->hold_since_anchor && f->anchor >= 0 &&
            (a == NULL || a->granted < F[f->anchor].t_begin))
            continue;
        if (best == 0)
            f->holder_daemon = c->daemon;
        best = 1;
        for (int j = 0; j < NCLIENTS; j++) {
            const struct client *w = &C[j];

            if (w->fd >= 0 && w->req == REQ_LOCK && w->reg == c->reg &&
                w->daemon != c->daemon) {
                f->holder_daemon = c->daemon;
                return 2;
            }
        }
    }
    return best;
}

static bool node_free(int k)
{
    return k >= 0 && k < NNODES && !node_busy[k];
}

/* The planned node, or another free one (not `not`). */
static int pick_node(int want, int not)
{
    if (node_free(want) && want != not)
        return want;
    for (int k = 0; k < NNODES; k++) {
        if (node_free(k) && k != not)
            return k;
    }
    return -1;
}

static int pick_daemon(int want)
{
    if (daemon_usable(want) && dstate[want] == D_UP)
        return want;
    want = other_daemon(want);
    return daemon_usable(want) && dstate[want] == D_UP ? want : -1;
}

static bool flush_node(int k)
{
    char *s = NULL;
    long long v = h_redis_cmd(&N[k], &s, "FLUSHALL");
    bool ok = v == 0 && s != NULL && strcmp(s, "OK") == 0;

    if (!ok)
        note_unexpected("FLUSHALL on node %d: %lld %s", k, v, s ? s : "");
    free(s);
    return ok;
}

/* Start f now; false if it had to be skipped. */
static bool fault_begin(struct fault *f, int64_t now)
{
    int t;

    switch (f->kind) {
    case F_NODE_STOP:
    case F_NODE_KILL:
        t = f->target = pick_node(f->target, -1);
        if (t < 0)
            return false;
        if (f->kind == F_NODE_STOP)
            h_redis_pause(&N[t]);
        else
            h_redis_kill(&N[t]);
        node_busy[t] = true;
        if (f->end_anchor >= 0)
            snprintf(f->what, sizeof(f->what), "%s n%d until %d ms after the "
                     "%s", fault_names[f->kind], t, f->end_after_ms,
                     fault_names[F[f->end_anchor].kind]);
        else
            snprintf(f->what, sizeof(f->what), "%s n%d %d ms",
                     fault_names[f->kind], t, f->dur_ms);
        break;
    case F_FLUSH:
        t = f->target = pick_node(f->target, -1);
        if (t < 0 || !flush_node(t))
            return false;
        snprintf(f->what, sizeof(f->what), "flush n%d", t);
        break;
    case F_FLUSH2:
        f->target = pick_node(f->target, -1);
        f->target2 = pick_node(f->target2, f->target);
        if (f->target < 0 || f->target2 < 0)
            return false;
        /* Back to back, well inside one probe interval. */
        if (!flush_node(f->target) || !flush_node(f->target2))
            return false;
        snprintf(f->what, sizeof(f->what), "flush n%d and n%d", f->target,
                 f->target2);
        break;
    case F_TTL_RAISE:
        t = f->target = pick_daemon(f->target);
        if (t < 0)
            return false;
        snprintf(f->what, sizeof(f->what), "ttl-raise d%d max_ttl_ms %d -> %d",
                 t, d_max_conf[t], f->param);
        daemon_raise_ttl(t, f->param);
        break;
    case F_DAEMON_RESTART:
        if (f->on_holder && f->holder_daemon >= 0)
            f->target = f->holder_daemon;
        t = f->target = pick_daemon(f->target);
        if (t < 0)
            return false;
        ck_assert_int_eq(kill(D[t].pid, SIGTERM), 0);
        dstate[t] = D_TERMINATING;
        snprintf(f->what, sizeof(f->what), "daemon-restart d%d (SIGTERM, down "
                 "%d ms)", t, f->dur_ms);
        break;
    case F_DAEMON_STOP:
        t = f->target = pick_daemon(f->target);
        if (t < 0)
            return false;
        if (f->dur_ms == 0)
            f->dur_ms = d_max_now[t] + h_rng_range(300, 1000);
        ck_assert_int_eq(kill(D[t].pid, SIGSTOP), 0);
        dstate[t] = D_STOPPED;
        snprintf(f->what, sizeof(f->what), "daemon-stop d%d %d ms", t, f->dur_ms);
        break;
    case F_NKINDS:
        return false;
    }
    f->t_begin = rel(now);
    f->end_due = f->t_begin + US(f->dur_ms);
    return true;
}

static void fault_end(struct fault *f)
{
    int t = f->target;

    switch (f->kind) {
    case F_NODE_STOP:
        h_redis_resume(&N[t]);
        node_busy[t] = false;
        break;
    case F_NODE_KILL:
        /* Same port and directory: what it kept, it loads. */
        h_redis_restart(&N[t]);
        node_busy[t] = false;
        break;
    case F_DAEMON_RESTART:
        if (dstate[t] == D_TERMINATING)
            daemon_reap(t);         /* waits for it, if it must */
        h_daemon_cleanup(&D[t]);
        d_gen[t]++;
        daemon_start(t);
        break;
    case F_DAEMON_STOP:
        ck_assert_int_eq(kill(D[t].pid, SIGCONT), 0);
        dstate[t] = D_UP;
        break;
    default:
        break;
    }
    f->t_end = rel(h_now_us());
}

static void faults_tick(int64_t now)
{
    int64_t t = rel(now);

    for (int i = 0; i < nfaults; i++) {
        struct fault *f = &F[i];
        int64_t due;
        int ready = 0;

        if (f->state == FS_ACTIVE && f->end_anchor >= 0) {
            const struct fault *ea = &F[f->end_anchor];

            if (ea->state == FS_DONE)
                f->end_due = ea->t_end + US(f->end_after_ms);
            else if (ea->state == FS_SKIPPED)
                f->end_due = t;
            else
                continue;
        }
        if (f->state == FS_ACTIVE && t >= f->end_due) {
            fault_end(f);
            f->state = FS_DONE;
            fprintf(stderr, "lostupdate: +%.1f s end of %s\n", secs(f->t_end),
                    f->what);
            continue;
        }
        if (f->state != FS_PLANNED)
            continue;
        if (f->anchor >= 0 && F[f->anchor].state == FS_SKIPPED) {
            f->state = FS_SKIPPED;
            cnt.skipped++;
            continue;
        }
        due = fault_due(f);
        if (due < 0 || t < due)
            continue;
        if (f->armed == 0)
            f->armed = t;
        if (f->want_hold_ms > 0) {
            ready = holder_ready(f, now);
            /* The best moment, then a holder alone, then any moment. */
            if ((ready < 2 && t - f->armed < US(ARM_MS) / 2) ||
                (ready < 1 && t - f->armed < US(ARM_MS)))
                continue;
        }
        if (!fault_begin(f, now)) {
            f->state = FS_SKIPPED;
            cnt.skipped++;
            fprintf(stderr, "lostupdate: +%.1f s %s skipped: no target\n",
                    secs(t), fault_names[f->kind]);
            continue;
        }
        cnt.faults[f->kind]++;
        fprintf(stderr, "lostupdate: +%.1f s %s%s\n", secs(f->t_begin), f->what,
                f->want_hold_ms == 0 ? ""
                : ready == 2 ? " (a holder mid-hold, a waiter on the other daemon)"
                : ready == 1 ? " (a holder mid-hold)" : " (no long holder came)");
        if (f->dur_ms == 0) {
            f->t_end = f->t_begin;
            f->state = FS_DONE;
        } else {
            f->state = FS_ACTIVE;
        }
    }
}

static bool faults_over(void)
{
    for (int i = 0; i < nfaults; i++) {
        if (F[i].state == FS_PLANNED || F[i].state == FS_ACTIVE)
            return false;
    }
    return true;
}

static int64_t faults_last_end(void)
{
    int64_t e = 0;

    for (int i = 0; i < nfaults; i++) {
        if (F[i].state == FS_DONE && F[i].t_end > e)
            e = F[i].t_end;
    }
    return e;
}

/* The faults under way in [from, to] (us since t_run), or over less than
 * 2 s before (their effects outlive them: a node back, keys missing). */
static const char *faults_during(int64_t from, int64_t to)
{
    static char buf[512];
    size_t len = 0;

    buf[0] = '\0';
    for (int i = 0; i < nfaults; i++) {
        const struct fault *f = &F[i];
        int64_t end;

        if (f->state != FS_DONE && f->state != FS_ACTIVE)
            continue;
        end = f->state == FS_ACTIVE ? INT64_MAX : f->t_end + US(2000);
        if (f->t_begin > to || end < from)
            continue;
        len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s[%s @%.1f]",
                                len ? ", " : "", f->what, secs(f->t_begin));
        if (len >= sizeof(buf))
            break;
    }
    return buf[0] ? buf : "none";
}

/* ---- one run ------------------------------------------------------------ */

static void run_init(const struct run_conf *conf)
{
    rc = conf;
    memset(&cnt, 0, sizeof(cnt));
    memset(dstate, 0, sizeof(dstate));
    memset(d_crashed, 0, sizeof(d_crashed));
    memset(d_gen, 0, sizeof(d_gen));
    memset(d_term_status, 0, sizeof(d_term_status));
    memset(reload, 0, sizeof(reload));
    memset(node_busy, 0, sizeof(node_busy));
    unexpected_msg[0] = '\0';
    natt = 0;
    att_overflow = false;
    stopping = false;
    nfaults = 0;
    h_cluster_nodes(&K, NNODES, conf->node_extra);
    h_redis_start(&R, NULL);
    reg = h_redis_connect(&R);
    for (int i = 0; i < NDAEMONS; i++) {
        d_max_conf[i] = conf->max_ttl[i];
        daemon_start(i);
        h_wait_voting(&D[i], NNODES, h_scale(5000));
    }
    for (int i = 0; i < NCLIENTS; i++) {
        struct client *c = &C[i];

        c->id = i;
        c->fd = -1;
        c->daemon = i % NDAEMONS;
        c->req = REQ_NONE;
        c->held = false;
        c->phase = PH_NONE;
        c->att = c->last_att = -1;
        c->next_at = 0;
        c->rounds = 0;
    }
    conf->plan();
}

static void run_drive(void)
{
    int64_t next_watch = 0, drain_until = 0;

    t_run = h_now_us();
    for (;;) {
        struct pollfd pfd[NCLIENTS];
        int map[NCLIENTS], n = 0;
        int64_t now = h_now_us(), t = rel(now);
        bool busy = false;

        if (now >= next_watch) {
            daemon_watch();
            next_watch = now + US(100);
        }
        reload_tick(now);
        faults_tick(now);
        if (!stopping &&
            ((faults_over() && t >= faults_last_end() + US(rc->tail_ms)) ||
             t >= US(h_scale(CAP_MS)))) {
            stopping = true;
            drain_until = now + US(h_scale(DRAIN_MS));
            ck_assert_msg(faults_over(), "the run cap came before the faults ended");
        }
        for (int i = 0; i < NCLIENTS; i++) {
            client_tick(&C[i], h_now_us());
            busy = busy || client_busy(&C[i]);
        }
        if (stopping && (!busy || now >= drain_until))
            break;
        for (int i = 0; i < NCLIENTS; i++) {
            if (C[i].fd >= 0) {
                pfd[n].fd = C[i].fd;
                pfd[n].events = POLLIN;
                map[n++] = i;
            }
        }
        if (poll(pfd, (nfds_t)n, 2) > 0) {
            for (int k = 0; k < n; k++) {
                if (pfd[k].revents != 0 && C[map[k]].fd >= 0)
                    client_read(&C[map[k]]);
            }
        }
    }
    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].fd >= 0)
            client_drop(&C[i], false);
    }
}

/* ---- the end: what the register says ----------------------------------- */

struct verdict {
    long long final, logged, lost, anomalies, overlaps, dup_fences;
    long long final_reg[NREG];
    int acked_unlock_lost;      /* written, then UNLOCK said ERR LOST */
    int exit_status[NDAEMONS];
    double seconds;
};

/* A time of an attempt, +s.mmm, or "-" when it did not happen. */
static const char *tfmt(char *buf, size_t size, int64_t r)
{
    if (r < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "+%.3f", secs(r));
    return buf;
}

static void att_print(const char *tag, int i)
{
    const struct attempt *a = &A[i];
    int64_t last = a->done >= 0 ? a->done : a->granted;
    char rd[16], wr[16], end[16];

    fprintf(stderr, "  %s #%d: reg:%d client %d on d%d (gen %d) fence=%" PRIu64
            " token=%.8s ttl=%d sent=+%.3f granted=+%.3f read=%s (value %lld) "
            "write=%s deadline=+%.3f end=%s %s; faults: %s\n",
            tag, i, a->reg, a->client, a->daemon, a->dgen, a->fence, a->token,
            a->ttl, secs(a->sent), secs(a->granted),
            tfmt(rd, sizeof(rd), a->read_at), a->read_val,
            tfmt(wr, sizeof(wr), a->write_at), secs(a->deadline),
            tfmt(end, sizeof(end), a->done), att_names[a->result],
            faults_during(a->granted, last));
}

/* Attempts that read, and so worked: [read, end of the round]. */
static bool att_worked(const struct attempt *a)
{
    return a->read_at >= 0 && a->done >= 0;
}

static void check_overlaps(struct verdict *v)
{
    int printed = 0;

    /* Not wrong in itself (the lease may have gone after the write), but
     * where a flush took the key before it, the write was unprotected. */
    for (int i = 0; i < natt; i++) {
        if (A[i].result != ATT_ACKED || !A[i].unlock_lost)
            continue;
        if (REPORT(++v->acked_unlock_lost)) {
            fprintf(stderr, "lostupdate[%s]: acknowledged, then UNLOCK answered "
                    "ERR LOST:\n", rc->name);
            att_print("holder", i);
        }
    }

    for (int i = 0; i < natt; i++) {
        for (int j = i + 1; j < natt; j++) {
            const struct attempt *a = &A[i], *b = &A[j];

            if (a->reg != b->reg)
                continue;
            if (a->fence == b->fence && strcmp(a->token, b->token) != 0) {
                v->dup_fences++;
                if (REPORT(v->dup_fences)) {
                    fprintf(stderr, "lostupdate[%s]: two grants with fence %"
                            PRIu64 ":\n", rc->name, a->fence);
                    att_print("grant", i);
                    att_print("grant", j);
                }
            }
            if (!att_worked(a) || !att_worked(b))
                continue;
            if (a->read_at < b->done && b->read_at < a->done) {
                v->overlaps++;
                if (REPORT(++printed)) {
                    fprintf(stderr, "lostupdate[%s]: two holders worked at once:\n",
                            rc->name);
                    att_print("holder", i);
                    att_print("holder", j);
                }
            }
        }
    }
}

/* Walk a register's own log of accepted writes: each must have read the
 * value the one before wrote. One that did not overwrote increments. */
static void check_register(int i, struct verdict *v)
{
    redisReply *r = redisCommand(reg, "LRANGE " REG_LOG " 0 -1", i);
    long long prev = 0;
    uint64_t prev_fence = 0;

    v->final_reg[i] = reg_read(i);
    v->final += v->final_reg[i];
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_ARRAY, "LRANGE: %s",
                  r == NULL ? reg->errstr : "not an array");
    v->logged += (long long)r->elements;
    for (size_t k = 0; k < r->elements; k++) {
        int id;
        uint64_t fence;
        long long value;

        ck_assert(r->element[k]->type == REDIS_REPLY_STRING);
        ck_assert_int_eq(sscanf(r->element[k]->str, "%d %" SCNu64 " %lld", &id,
                                &fence, &value), 3);
        ck_assert_msg(fence >= prev_fence, "the register took fence %" PRIu64
                      " after %" PRIu64, fence, prev_fence);
        if (value != prev + 1) {
            v->anomalies++;
            if (REPORT(v->anomalies) && id >= 0 && id < natt) {
                fprintf(stderr, "lostupdate[%s]: write %zu of reg:%d (value "
                        "%lld, fence %" PRIu64 ") read %lld, but the register "
                        "held %lld then (fence %" PRIu64 "): %lld update(s) "
                        "overwritten\n", rc->name, k, i, value, fence, value - 1,
                        prev, prev_fence, prev + 1 - value);
                att_print("writer", id);
                /* The writes it overwrote: accepted after its read. */
                for (size_t j = 0; j < k; j++) {
                    int jd;
                    uint64_t jf;
                    long long jv;

                    if (sscanf(r->element[j]->str, "%d %" SCNu64 " %lld", &jd,
                               &jf, &jv) == 3 && jd >= 0 && jd < natt &&
                        A[jd].write_at >= A[id].read_at)
                        att_print("overwritten", jd);
                }
            }
        }
        prev = value;
        prev_fence = fence;
    }
    freeReplyObject(r);
    if (v->final_reg[i] != cnt.acked_reg[i])
        fprintf(stderr, "lostupdate[%s]: reg:%d holds %lld after %d acknowledged "
                "increments\n", rc->name, i, v->final_reg[i], cnt.acked_reg[i]);
}

static void run_finish(uint64_t seed, struct verdict *v)
{
    memset(v, 0, sizeof(*v));
    daemon_watch();
    for (int i = 0; i < NREG; i++)
        check_register(i, v);
    v->lost = cnt.acked - v->final;
    check_overlaps(v);
    for (int i = 0; i < NDAEMONS; i++)
        v->exit_status[i] = d_crashed[i] ? -1 : h_daemon_finish(&D[i]);
    v->seconds = (double)(h_now_us() - t_run) / 1e6;
    fprintf(stderr,
            "lostupdate[%s]: seed=%" PRIu64 " acknowledged=%d final=%lld lost=%lld "
            "stale_refused=%d rounds=%d grants=%d (recorded %d%s) expired=%d "
            "lost_leases=%d unlock_lost=%d (after a write %d) refused=%d "
            "drops=%d late_writes=%d overlaps=%lld dup_fences=%lld "
            "anomalies=%lld faults=%d (node-stop=%d node-kill=%d flush=%d "
            "flush2=%d ttl-raise=%d daemon-restart=%d daemon-stop=%d skipped=%d) "
            "reloads=%d max_ttl d0=%d d1=%d crashed=%d exit=%d/%d term_bad=%d "
            "unexpected=%d time=%.1f s\n",
            rc->name, seed, cnt.acked, v->final, v->lost, cnt.stale, cnt.rounds,
            cnt.grants, natt, att_overflow ? ", overflow" : "", cnt.expired,
            cnt.lost_leases, cnt.unlock_lost, v->acked_unlock_lost, cnt.refused,
            cnt.dropped, cnt.late_writes, v->overlaps, v->dup_fences, v->anomalies,
            cnt.faults[F_NODE_STOP] + cnt.faults[F_NODE_KILL] +
            cnt.faults[F_FLUSH] + cnt.faults[F_FLUSH2] + cnt.faults[F_TTL_RAISE] +
            cnt.faults[F_DAEMON_RESTART] + cnt.faults[F_DAEMON_STOP],
            cnt.faults[F_NODE_STOP], cnt.faults[F_NODE_KILL], cnt.faults[F_FLUSH],
            cnt.faults[F_FLUSH2], cnt.faults[F_TTL_RAISE],
            cnt.faults[F_DAEMON_RESTART], cnt.faults[F_DAEMON_STOP], cnt.skipped,
            cnt.reloads, d_max_now[0], d_max_now[1], cnt.crashed,
            v->exit_status[0], v->exit_status[1], cnt.term_bad, cnt.unexpected,
            v->seconds);
    if (unexpected_msg[0] != '\0')
        fprintf(stderr, "lostupdate[%s]: unexpected:\n%s", rc->name,
                unexpected_msg);
}

static void teardown(void)
{
    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].fd >= 0)
            close(C[i].fd);
        C[i].fd = -1;
    }
    if (reg != NULL)
        redisFree(reg);
    reg = NULL;
    h_redis_cleanup(&R);
}

static uint64_t run_one(const struct run_conf *conf, struct verdict *v)
{
    uint64_t seed = h_seed("REDLOCKD_LOSTUPDATE_SEED");

    fprintf(stderr, "lostupdate[%s]: seed=%" PRIu64 " (set REDLOCKD_LOSTUPDATE_SEED "
            "to replay its schedule)\n", conf->name, seed);
    run_init(conf);
    run_drive();
    run_finish(seed, v);
    ck_assert_msg(v->logged == cnt.acked, "seed %" PRIu64 ": the registers "
                  "logged %lld writes, the clients saw %d acknowledged", seed,
                  v->logged, cnt.acked);
    ck_assert_msg(cnt.crashed == 0 && cnt.term_bad == 0 && v->exit_status[0] == 0 &&
                  v->exit_status[1] == 0, "seed %" PRIu64 ": a daemon died (%d) or "
                  "did not exit 0 on SIGTERM (%d during the run; at the end %d, %d)",
                  seed, cnt.crashed, cnt.term_bad, v->exit_status[0],
                  v->exit_status[1]);
    ck_assert_msg(cnt.unexpected == 0, "seed %" PRIu64 ": unexpected:\n%s", seed,
                  unexpected_msg);
    return seed;
}

static void run_checked(const struct run_conf *conf)
{
    struct verdict v;
    uint64_t seed = run_one(conf, &v);
    /* The wrapper slows the daemons, and so the rounds, down. */
    int min_rounds = h_slow() ? conf->min_rounds / 4 : conf->min_rounds;
    int min_acked = h_slow() ? conf->min_acked / 4 : conf->min_acked;

    ck_assert_msg(v.final == cnt.acked, "seed %" PRIu64 ": lost updates: %d "
                  "increments acknowledged, the register holds %lld (%lld lost, "
                  "%lld anomalies, %lld overlapping holders, %d stale writes "
                  "refused)", seed, cnt.acked, v.final, v.lost, v.anomalies,
                  v.overlaps, cnt.stale);
    /* Holders that worked at once are a mutual-exclusion failure even when
     * the interleaving happened not to lose an update. */
    ck_assert_msg(v.overlaps == 0, "seed %" PRIu64 ": %lld pairs of holders "
                  "worked at once (%lld lost updates)", seed, v.overlaps,
                  v.lost);
    ck_assert_msg(cnt.skipped == 0, "seed %" PRIu64 ": %d faults skipped", seed,
                  cnt.skipped);
    ck_assert_msg(cnt.rounds >= min_rounds && cnt.acked >= min_acked,
                  "seed %" PRIu64 ": too little work: %d rounds (want %d), %d "
                  "acknowledged (want %d)", seed, cnt.rounds, min_rounds,
                  cnt.acked, min_acked);
}

/* ---- the tests ---------------------------------------------------------- */

static const struct run_conf general_conf = {
    .name = "general",
    .node_extra = "--appendonly yes --appendfsync always",
    .max_ttl = { 2000, 3000 },
    .probe_ms = 500,
    .long_pct = 5,
    .mid_pct = 45,
    .mid_lo = 20,
    .mid_hi = 300,
    .tail_ms = 3000,
    .min_rounds = 200,
    .min_acked = 100,
    .plan = plan_general,
};

START_TEST(lostupdate_general)
{
    run_checked(&general_conf);
}
END_TEST

static const struct run_conf flush_ttl_conf = {
    .name = "flush_ttl",
    .node_extra = NULL,         /* no persistence: a killed node comes back empty */
    .max_ttl = { 1000, 6000 },
    .probe_ms = 1000,
    .long_pct = 12,
    /* Longer work between read and write: a second holder's write then
     * more likely lands inside it, a lost update rather than a refusal. */
    .mid_pct = 88,
    .mid_lo = 50,
    .mid_hi = 500,
    .tail_ms = 3000,
    .min_rounds = 100,
    .min_acked = 30,
    .plan = plan_flush_ttl,
};

START_TEST(lostupdate_flush_ttl)
{
    run_checked(&flush_ttl_conf);
}
END_TEST

/* The checker must see what is wrong: daemons with different key prefixes
 * each grant every lock on their own, and their holders' read-modify-writes
 * interleave. */
static const struct run_conf broken_conf = {
    .name = "broken",
    .node_extra = NULL,
    .max_ttl = { 2000, 2000 },
    .probe_ms = 1000,
    .long_pct = 0,
    .mid_pct = 90,
    .mid_lo = 50,
    .mid_hi = 300,
    .tail_ms = 5000,
    .prefix = { "a:", "b:" },
    .quiet = true,
    .plan = plan_none,
};

START_TEST(checker_sees_split_prefixes)
{
    struct verdict v;
    uint64_t seed = run_one(&broken_conf, &v);

    ck_assert_msg(v.lost > 0 && v.overlaps > 0, "seed %" PRIu64 ": two daemons "
                  "that do not see each other's keys, and the checker found %lld "
                  "lost updates and %lld overlaps in %d acknowledged increments",
                  seed, v.lost, v.overlaps, cnt.acked);
}
END_TEST

static Suite *lostupdate_suite(void)
{
    Suite *s = suite_create("lostupdate");
    TCase *tc = tcase_create("lostupdate");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 280);
    tcase_add_test(tc, lostupdate_general);
    tcase_add_test(tc, lostupdate_flush_ttl);
    tcase_add_test(tc, checker_sees_split_prefixes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(lostupdate_suite());
}
