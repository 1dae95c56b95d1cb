/*
 * test_mutex: mutual exclusion under faults, checked from the outside
 * (suite "fault").
 *
 * Three redis-server nodes (appendonly yes, appendfsync always), two
 * redlockd daemons on them, 16 clients over 4 resources and two plain
 * Redlock clients (SET NX PX, compare-and-delete) on the same keys; in the
 * first test also two tagged sessions of many lanes and four `redlockctl
 * run` clients (below). One single-threaded driver advances every
 * client's small state machine (connect, LOCK, hold while refreshing its
 * deadline, UNLOCK, again) and a seeded fault schedule: a node stopped and
 * continued, a node killed with -9 and restarted on its data, a daemon killed with -9 (its clients move
 * to the other one) and restarted, a daemon stopped for longer than the
 * ttl, a daemon restarted with SIGTERM (it leaves its leases on the
 * nodes), clients disconnecting abruptly. An exclusive holder whose
 * connection fails works on until its deadline and ADOPTs its lease on the
 * next daemon it reaches (same fence, a new token): its interval runs on
 * if the adoption succeeds before the deadline. It adopts in a session
 * with detach=, and half of those ADOPTs have their connection reset right
 * after the line went out: the client then works on until its old
 * deadline, which whatever the round did must respect (the adopted lease
 * stays the detached session's; nothing it rotated is deleted).
 *
 * Each holder records the interval during which it may work, by the
 * client-side lease bound: its deadline is the time it sent a request
 * plus the validity the reply reports (LOCK's validity=, then the
 * "validity" of LOCKS, sent at least every ttl/4 while holding). The
 * interval is [the OK for LOCK arrived, min(it sent UNLOCK, its deadline,
 * it saw EVENT LOST or lost the connection)]; a plain client's is
 * [quorum seen, min(release started, start + validity)].
 *
 * Tagged sessions (protocol.md, "Tagged requests"): each is one
 * connection and one session with TAG_LANES lanes, each lane a client of
 * its own (tagged LOCK with wait=, hold, tagged UNLOCK, again) on
 * resources mt:0..TAG_RES-1 that both sessions share, never two lanes of
 * one session on the same resource. So a session holds and waits on
 * hundreds of resources at once, its replies coming in the order they
 * finish; a turn's requests go out in one write. One tagged LOCKS
 * confirms every lane: the deadline of each lane held when it went out is
 * its send time plus that lease's "validity". A lane's interval is a
 * client's; a broken connection or a reply overdue ends them all, and the
 * session starts afresh on the other daemon (nothing to adopt). Now and
 * then the schedule cuts a session's connection.
 *
 * `redlockctl run` clients (issue 28): each runs, again and again,
 * `redlockctl -s <both daemons> run mx:<r> -- sh -c '<stamper> & exit 0'`
 * on the classic clients' resources: the command exits at once, and its
 * worker (tests/tools/stamper.c) closes its descriptors and writes a
 * CLOCK_MONOTONIC stamp every 50 ms, after a first line with the
 * REDLOCKD_FENCE it was given. Only redlockctl's keeper (docs/design.md)
 * then holds the lock, confirming the lease, failing over, stopping the
 * group by the lease deadline when it is lost, releasing it when the
 * group is empty. The worker's interval is [first stamp, last stamp],
 * with that fence, read once every run is over. Now and then the schedule
 * SIGKILLs a redlockctl whose command runs: its keeper goes on (this
 * process is a subreaper, so the keeper becomes its child and is waited
 * for by pid).
 *
 * Asserted: no two intervals of one resource overlap; the fences of one
 * resource increase strictly in the order the holders started; no key is
 * left on a node longer than ttl (plus slack) after the last holder of its
 * resource was done (the tagged resources too); no daemon died except
 * those killed on purpose (and every running one exits 0 on SIGTERM);
 * the tagged lanes were granted locks and the redlockctl workers wrote.
 * The second test shows the checker is not blind: two daemons with
 * different key prefixes do not see each other's locks, and the checker
 * must report overlaps.
 *
 * The third test runs the classic load with lock kinds (test "kinds"): two
 * resources are taken shared or exclusive at random, one is a semaphore
 * of SEM_K slots, the fourth stays plain exclusive and is the only one
 * the plain Redlock clients touch (they cannot see shared holders, by
 * design). The checker then also asserts that no reader and writer ever
 * hold together, that no semaphore has more than SEM_K holders (nor one
 * slot two), and the fence order of each kind (docs/design.md).
 *
 * The schedule and the clients' choices come from one seed, printed and
 * overridable with REDLOCKD_MUTEX_SEED; timing still varies from run to
 * run, so a seed reproduces the faults, not every interleaving.
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
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "mutex_checker.h"

#define NNODES 3
#define NDAEMONS 2
#define NCLIENTS 16
#define NPLAIN 2
#define NRES 4
#define QUORUM (NNODES / 2 + 1)

#define TTL_MS 1500
/* Below the validity of a fresh grant, so a LOCK that waited to the end
 * still leaves its holder time to work: a grant known only after its
 * deadline then means the daemon or the driver stalled. */
#define WAIT_MS 1000
#define REFRESH_MS (TTL_MS / 4)         /* the rule asks for ttl/3 at most */
#define DRIFT_MS (TTL_MS / 100 + 2)     /* the plain clients' drift allowance */
#define KEY_SLACK_MS 500
#define DRAIN_MS 15000                  /* the end: outstanding requests */
#define IMPATIENT_MS 1200               /* reply timeout before failing over */
#define PATIENT_MS 8000                 /* outlasts a stopped daemon */
#define PLAIN_IO_MS 100                 /* plain clients' per-node timeout */
/* A holder adopting its lease does so in a session with detach= (as the
 * client libraries do), and of those ADOPTs this many percent have their
 * connection reset right after the line went out (the daemon reads it,
 * then the reset): the session detaches before or after the answer. The
 * client works on until its old deadline and gives up then; whatever the
 * round did must hold the lock until then (the adopted lease is the
 * detached session's, never given back). */
#define ADOPT_CUT_PCT 50
#define ADOPT_DETACH_MS 3000            /* twice TTL_MS */

#define CLIENT_BUF 8192                 /* replies are short; LOCKS of one lock */
#define SEM_K 3                         /* the kinds run's semaphore */
#define RES_SEM 2                       /* ... is this resource */
#define RES_PLAIN 3                     /* the one plain clients share */
#define SHARED_PCT 60                   /* reads among the rw resources */
#define RES_NAME "mx:%d"
#define RES_NAME_MAX 16
#define KEY_MAX 64

/* Tagged sessions: each lane on a resource of its own among TAG_RES,
 * which both sessions share (so they contend), indexed after the classic
 * ones. */
#define NTAGGED 2
#define TAG_LANES 256
#define TAG_RES 384
#define TAG_RES_PREFIX "mt:"
#define NRES_ALL (NRES + TAG_RES)
#define TAG_LINE_MAX 64                 /* "#l127 LOCK mt:191 ttl=1500 wait=1000" */
#define TAG_OUT ((TAG_LANES + 2) * TAG_LINE_MAX)    /* a turn's requests */
#define TAG_BUF 131072                  /* a LOCKS of TAG_LANES locks */
#define TAG_HOLDER 1000                 /* lane l of session i: (i+1)*1000+l */
_Static_assert(TAG_LANES < TAG_RES, "a lane finds a resource free");

/* redlockctl run clients. */
#define NRUNNERS 4
#define RUN_HOLDER 200                  /* runner i: 200+i */
#define RUN_PATH_MAX 320                /* a run's file in a node's dir */
#define EXIT_CONFLICT 75                /* redlockctl run: busy, wait ran out */
#define EXIT_LOST 70                    /* ... the lease was lost */
#define EXIT_UNAVAILABLE 69             /* ... no daemon, or the LOCK broke */
/* The command: the resource and fence it was given and its keeper (the
 * shell's parent) first, then the worker in the background, in the
 * command's process group; the shell exits at once. */
#define RUN_SCRIPT "echo \"$REDLOCKD_RESOURCE $REDLOCKD_FENCE $PPID\" >> \"$1\"; " \
                   "\"$2\" -m \"$1\" \"$3\" & exit 0"

#define US(ms) ((int64_t)(ms) * 1000)
#define STR_(x) #x
#define STR(x) STR_(x)

/* ---- what one run is --------------------------------------------------- */

struct run_conf {
    const char *name;
    int min_ms;                 /* the run lasts at least this long */
    int cap_ms;                 /* and starts no round after this */
    int rounds;                 /* LOCK attempts per client, at least */
    int plain_rounds;           /* attempts per plain client, at least */
    int nplain;
    bool faults;
    int fault_cycles;           /* of the schedule (faults only) */
    bool kinds;                 /* resources of every kind (see the top) */
    int ntagged;                /* tagged sessions */
    int nrunners;               /* redlockctl run clients */
    const char *daemon_json[NDAEMONS];
    const char *prefix[NDAEMONS];   /* each daemon's key prefix */
};

enum fault_kind {
    F_NODE_STOP, F_NODE_KILL, F_DAEMON_KILL, F_DAEMON_STOP, F_DAEMON_RESTART,
    F_NKINDS
};

static const char *const fault_names[F_NKINDS] = {
    "node-stop", "node-kill", "daemon-kill", "daemon-stop", "daemon-restart",
};

#define FAULT_CYCLES 2                  /* the most a run has */
#define MAX_FAULTS (FAULT_CYCLES * F_NKINDS)

struct fault {
    enum fault_kind kind;
    int target;
    int64_t at, until;          /* us since the start of the run */
    bool started;
};

enum req { REQ_NONE, REQ_HELLO, REQ_LOCK, REQ_LOCKS, REQ_UNLOCK, REQ_ADOPT };

/* A redlockd client: one connection, one request in flight at a time, at
 * most one lock. */
struct client {
    int id;
    int fd;                     /* -1: not connected */
    int daemon;                 /* where it connects next / is connected */
    bool patient;               /* rides out a silent daemon */
    char buf[CLIENT_BUF];
    size_t len;
    enum req req;
    int64_t req_sent, req_timeout;
    int res;                    /* of the LOCK in flight or the lock held */
    int64_t next_at;            /* reconnect / next round not before */
    int rounds;                 /* LOCK requests sent */
    /* the grant: */
    bool held;                  /* the session holds it: UNLOCK is due */
    bool working;               /* its interval is open */
    bool shared;                /* kinds: asked for and held mode=shared */
    int slot;                   /* kinds: the semaphore slot held, or -1 */
    /* Its connection failed while it held an exclusive lock: it works on
     * until its deadline and ADOPTs the lease on the next daemon it
     * reaches (the token rotates, the fence stays). */
    bool adopt;
    bool detach;                /* its session asked for detach= */
    char token[64];
    uint64_t fence;
    int64_t start, deadline, hold_until, refreshed;
};

/* One lane of a tagged session: a client's cycle (LOCK, hold, UNLOCK,
 * again), its requests tagged "l<its number>". */
struct lane {
    int res;                    /* of the LOCK in flight or the lock held */
    enum req req;               /* REQ_NONE, REQ_LOCK or REQ_UNLOCK */
    int64_t sent, timeout;      /* of that request */
    bool held, working;         /* as a client's */
    bool asked;                 /* held, no UNLOCK out, when LOCKS went out */
    uint64_t fence;
    int64_t start, deadline, hold_until, next_at;
};

/* A tagged session: one connection, every lane's requests in flight on
 * it at once, one LOCKS (tag "r") for all of them. */
struct tagged {
    int id;
    int fd;                     /* -1: not connected */
    int daemon;
    bool patient;
    bool hello;                 /* its (untagged) HELLO is in flight */
    bool refreshing;            /* its LOCKS is in flight */
    int64_t hello_timeout, locks_sent, locks_timeout, refreshed, next_at;
    int lane_of[TAG_RES];       /* the lane on each resource, or -1 */
    char out[TAG_OUT];          /* this turn's requests, one write */
    size_t out_len;
    char buf[TAG_BUF];
    size_t len;
    struct lane lane[TAG_LANES];
};

/* A redlockctl run client: one run at a time, run i writing
 * <node 0's dir>/run<id>.<i> (and its stderr to that .err). */
struct runner {
    int id;
    pid_t pid;                  /* its redlockctl, or 0 */
    pid_t keeper;               /* the keeper of a redlockctl we SIGKILLed
                                   (our child now), or 0 */
    int res;                    /* of the run going on */
    int runs;                   /* started */
    int64_t next_at;
};

/* A plain Redlock client: synchronous hiredis to each node. */
struct plain {
    int id;
    redisContext *ctx[NNODES];
    int64_t retry_at[NNODES];
    int64_t next_at;
    bool holding;
    int res;
    char token[33];
    int64_t t0, start, valid_end, hold_until;
};

struct counts {
    int rounds, grants, grants_on[NDAEMONS], plain_rounds, plain_grants;
    int adopts, adopts_failed, adopts_cut;
    int refused, lost, expired, late, dropped, unexpected;
    int faults[F_NKINDS], disconnects, crashed, key_violations;
    int modes[3];               /* grants: exclusive, shared, slot */
    long long key_outlived_ms;  /* the longest a key outlived its last holder */
    /* tagged sessions */
    int tag_rounds, tag_grants, tag_refused, tag_lost, tag_expired, tag_late;
    int tag_drops, tag_cuts, tag_peak_held, tag_peak_out;
    /* redlockctl runs: by exit status; those whose worker wrote */
    int runs, run_ok, run_busy, run_lost, run_failed, run_cuts, run_stopped;
    int run_worked, run_stamps;
};

/* Its nodes and daemons (harness.h). */
static struct h_cluster K;
static struct h_redis *const N = K.nodes;
static struct h_daemon *const D = K.daemons;
static bool d_stopped[NDAEMONS];    /* SIGSTOPped */
static bool d_crashed[NDAEMONS];    /* died unasked */
static bool d_terminated[NDAEMONS]; /* sent SIGTERM: exits, is restarted */
/* Static: clients hold large buffers. */
static struct client C[NCLIENTS];
static struct plain P[NPLAIN];
static struct tagged TS[NTAGGED];
static struct runner RN[NRUNNERS];
static struct mc_log ivlog;
static struct counts cnt;
static struct fault faults[MAX_FAULTS];
static int nfaults;
static const struct run_conf *rc;
static int64_t t_run;               /* us: the run's time zero */
static int64_t touch[NRES_ALL];     /* us: the last holder of each was done */
static bool stopping;
static char unexpected_msg[1024];

/* ---- time and randomness ----------------------------------------------- */

static double secs(int64_t t)
{
    return (double)(t - t_run) / 1e6;
}

/* The name of resource index res: the classic resources, then the tagged
 * sessions' own. */
static void res_name(char name[RES_NAME_MAX], int res)
{
    if (res < NRES)
        snprintf(name, RES_NAME_MAX, RES_NAME, res);
    else
        snprintf(name, RES_NAME_MAX, TAG_RES_PREFIX "%d", res - NRES);
}

static void note_touch(int res, int64_t t)
{
    if (res >= 0 && t > touch[res])
        touch[res] = t;
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

static void record(int res, int holder, enum mc_kind kind, uint64_t fence,
                   int64_t start, int64_t end, const struct client *c)
{
    struct mc_interval iv = {
        .res = res, .holder = holder, .kind = kind, .fence = fence,
        .start = start - t_run, .end = end - t_run,
    };

    if (c != NULL) {
        iv.mode = c->shared ? MC_SHARED : MC_EXCLUSIVE;
        if (c->slot >= 0) {
            iv.limit = SEM_K;
            iv.slot = c->slot;
        }
    }

    ck_assert_int_eq(mc_log_add(&ivlog, &iv), 0);
    note_touch(res, end > start ? end : start);
}

/* ---- daemons ------------------------------------------------------------ */

static bool daemon_usable(int i)
{
    return D[i].pid != 0 && !d_crashed[i] && !d_terminated[i];
}

/* A daemon that exited while nobody meant it to. WNOWAIT leaves it a
 * zombie, so h_daemon_stop still collects its status at the end. */
static void daemon_watch(void)
{
    for (int i = 0; i < NDAEMONS; i++) {
        siginfo_t si;

        if (!daemon_usable(i))
            continue;
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)D[i].pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == D[i].pid) {
            d_crashed[i] = true;
            cnt.crashed++;
            fprintf(stderr, "mutex: +%.1f s daemon %d (pid %d) died: %s %d\n",
                    secs(h_now_us()), i, (int)D[i].pid,
                    si.si_code == CLD_EXITED ? "exit status" : "signal",
                    si.si_status);
        }
    }
}

static void daemon_start(int i)
{
    h_cluster_daemon_start(&K, i, rc->daemon_json[i]);
}

/* ---- redlockd clients --------------------------------------------------- */

static int other_daemon(int i)
{
    return (i + 1) % NDAEMONS;
}

/* The interval ends at t, or at the deadline if that came first. */
static void work_end(struct client *c, int64_t t)
{
    int64_t end = t < c->deadline ? t : c->deadline;

    if (!c->working)
        return;
    if (c->deadline <= t)
        cnt.expired++;
    record(c->res, c->id, MC_REDLOCKD, c->fence, c->start, end, c);
    c->working = false;
}

/* Close the connection at once, whatever is in flight. `failover`: the
 * daemon failed us, so try the other one next; otherwise go home, so the
 * clients that a killed daemon sent away come back over time. */
static void client_drop(struct client *c, bool failover)
{
    int64_t now = h_now_us();
    /* An exclusive holder cut off from its daemon may go on until its
     * deadline and take the lease over elsewhere (the careful-client rule
     * still bounds its interval). */
    bool adopt = failover && c->held && c->working && !c->shared &&
                 c->slot < 0 && c->deadline > now && c->req != REQ_UNLOCK;

    if (!adopt)
        work_end(c, now);
    if (c->req == REQ_LOCK || c->held)
        note_touch(c->res, now);
    /* A session with detach= keeps what it held or was adopting for
     * that long, then releases it. */
    if (c->detach && (c->held || c->req == REQ_ADOPT))
        note_touch(c->res, now + US(ADOPT_DETACH_MS));
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = 0;
    c->req = REQ_NONE;
    c->held = false;
    c->adopt = adopt;
    if (!adopt)
        c->res = -1;
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
    /* A short line into an empty socket buffer: anything else means the
     * connection is gone, which the next read reports too. */
    if (w != n)
        client_drop(c, true);
}

static int patience_ms(bool patient)
{
    return patient ? PATIENT_MS : IMPATIENT_MS;
}

static int reply_timeout(const struct client *c)
{
    return patience_ms(c->patient);
}

/* A non-blocking connection to daemon *d, or to the other one when *d is
 * not running; -1 when neither takes it now (*d: the one to try next). */
static int daemon_connect(int *d)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    int fd;

    if (!daemon_usable(*d))
        *d = other_daemon(*d);
    if (!daemon_usable(*d))
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    sa.sin_port = htons((uint16_t)D[*d].port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* Loopback: refused at once, or accepted by the kernel even when the
     * daemon is stopped. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        *d = other_daemon(*d);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void client_connect(struct client *c, int64_t now)
{
    int fd = daemon_connect(&c->daemon);

    if (fd < 0) {
        c->next_at = now + US(100);
        return;
    }
    c->fd = fd;
    c->len = 0;
    c->detach = c->adopt;
    client_send(c, REQ_HELLO, reply_timeout(c), "HELLO name=mx%d%s", c->id,
                c->adopt ? " detach=" STR(ADOPT_DETACH_MS) : "");
}

static void client_lock(struct client *c)
{
    char name[RES_NAME_MAX];

    const char *kind = "";

    c->res = h_rng_range(0, NRES - 1);
    c->shared = false;
    c->slot = -1;
    if (rc->kinds && c->res == RES_SEM)
        kind = " limit=" STR(SEM_K);
    else if (rc->kinds && c->res != RES_PLAIN &&
             h_rng_range(0, 99) < SHARED_PCT) {
        kind = " mode=shared";
        c->shared = true;
    }
    res_name(name, c->res);
    cnt.rounds++;
    c->rounds++;
    client_send(c, REQ_LOCK, WAIT_MS + reply_timeout(c),
                "LOCK %s ttl=%d wait=%d%s", name, TTL_MS, WAIT_MS, kind);
}

static void client_unlock(struct client *c)
{
    char name[RES_NAME_MAX];

    res_name(name, c->res);
    /* The holder stops working before the request leaves. */
    work_end(c, h_now_us());
    client_send(c, REQ_UNLOCK, reply_timeout(c), "UNLOCK %s", name);
}

static void round_done(struct client *c, int64_t now)
{
    c->res = -1;
    c->next_at = now + US(h_rng_range(0, 150));
}

static int hold_ms(void)
{
    /* Mostly short, some past the ttl: those live on renewals alone. */
    return h_rng_range(0, 99) < 85 ? h_rng_range(20, 400) : h_rng_range(1000, 3000);
}

static bool resource_is(const char *name, int res)
{
    char want[RES_NAME_MAX];

    res_name(want, res);
    return name != NULL && strcmp(name, want) == 0;
}

static void on_lock_reply(struct client *c, const char *line, int64_t now)
{
    const char *v;
    long long validity;

    if (h_starts(line, "OK resource=")) {
        ck_assert_msg(resource_is(h_kv(line, "resource"), c->res), "%s", line);
        v = h_kv(line, "fence");
        ck_assert_msg(v != NULL, "LOCK reply without fence: %s", line);
        c->fence = strtoull(v, NULL, 10);
        h_kv_copy(line, "token", c->token, sizeof(c->token));
        v = h_kv(line, "validity");
        ck_assert_msg(v != NULL, "LOCK reply without validity: %s", line);
        validity = strtoll(v, NULL, 10);
        if (rc->kinds && c->res == RES_SEM) {
            v = h_kv(line, "slot");
            ck_assert_msg(v != NULL, "semaphore grant without slot: %s", line);
            c->slot = atoi(v);
            ck_assert_msg(c->slot >= 0 && c->slot < SEM_K, "%s", line);
        }
        if (c->shared) {
            v = h_kv(line, "mode");
            ck_assert_msg(v != NULL && strcmp(v, "shared") == 0, "%s", line);
        }
        cnt.modes[c->slot >= 0 ? 2 : c->shared]++;
        cnt.grants++;
        cnt.grants_on[c->daemon]++;
        c->held = true;
        c->start = now;
        c->deadline = c->req_sent + US(validity);
        c->refreshed = c->req_sent;
        c->hold_until = now + US(hold_ms());
        if (c->deadline > now) {
            c->working = true;
        } else {
            /* Over before it was known: the holder never works. */
            cnt.late++;
            record(c->res, c->id, MC_REDLOCKD, c->fence, now, c->deadline, c);
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
    note_unexpected("client %d: LOCK answered \"%s\"", c->id, line);
    round_done(c, now);
}

/* The lock in a LOCKS reply, or NULL. */
static json_t *locks_find(json_t *o, const struct client *c)
{
    json_t *locks = json_object_get(o, "locks"), *l;
    size_t i;

    json_array_foreach(locks, i, l) {
        const char *name = json_string_value(json_object_get(l, "resource"));
        json_t *fence = json_object_get(l, "fence");

        if (resource_is(name, c->res) && json_is_integer(fence) &&
            (uint64_t)json_integer_value(fence) == c->fence)
            return l;
    }
    return NULL;
}

static void on_locks_reply(struct client *c, const char *line, int64_t now)
{
    json_t *o, *l, *v;
    json_error_t err;

    if (!h_starts(line, "OK {")) {
        note_unexpected("client %d: LOCKS answered \"%s\"", c->id, line);
        return;
    }
    o = json_loads(line + 3, 0, &err);
    ck_assert_msg(json_is_object(o), "LOCKS: bad JSON (%s): %s", err.text, line);
    l = locks_find(o, c);
    v = l != NULL ? json_object_get(l, "validity") : NULL;
    if (l != NULL && !json_is_integer(v))
        note_unexpected("client %d: LOCKS without validity: %s", c->id, line);
    if (l == NULL || !json_is_integer(v)) {
        /* No longer held: it learns so now (its deadline may come first). */
        work_end(c, now);
        c->held = false;
    } else {
        int64_t deadline = c->req_sent + US(json_integer_value(v));

        /* A shorter lease than it thought, already over: it learns so now,
         * not back when the new deadline was. */
        if (deadline <= now)
            work_end(c, now);
        else
            c->deadline = deadline;
    }
    json_decref(o);
}

static void on_unlock_reply(struct client *c, const char *line, int64_t now)
{
    if (!h_starts(line, "OK resource=") && !h_starts(line, "ERR LOST ") &&
        !h_starts(line, "ERR NOTHELD "))
        note_unexpected("client %d: UNLOCK answered \"%s\"", c->id, line);
    c->held = false;
    round_done(c, now);
}

static void on_event(struct client *c, const char *line, int64_t now)
{
    const char *v;

    if (!h_starts(line, "EVENT LOST "))
        return;     /* SHUTDOWN, CLOSING: the connection's end tells */
    if (c->res < 0 || !c->held || !resource_is(h_kv(line, "resource"), c->res))
        return;
    v = h_kv(line, "fence");
    if (v == NULL || strtoull(v, NULL, 10) != c->fence)
        return;
    cnt.lost++;
    work_end(c, now);
    c->held = false;
}

/* Reset the connection its ADOPT just went out on. It works on until its
 * old deadline (work_end in client_tick) and starts again after. */
static void client_cut_adopt(struct client *c)
{
    struct linger lg = { .l_onoff = 1, .l_linger = 0 };

    (void)setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    note_touch(c->res, h_now_us() + US(ADOPT_DETACH_MS));
    close(c->fd);
    c->fd = -1;
    c->len = 0;
    c->req = REQ_NONE;
    c->adopt = false;
    c->held = false;
    c->next_at = c->deadline + US(h_rng_range(50, 200));
    cnt.adopts_cut++;
}

/* The lease it held when its connection failed, taken over here. */
static void client_adopt(struct client *c, int64_t now)
{
    char name[RES_NAME_MAX];

    if (!c->working || c->deadline <= now) {
        /* Its deadline passed on the way: nothing left to take over. */
        work_end(c, now);
        c->adopt = false;
        round_done(c, now);
        return;
    }
    res_name(name, c->res);
    client_send(c, REQ_ADOPT, reply_timeout(c), "ADOPT %s token=%s ttl=%d",
                name, c->token, TTL_MS);
    if (c->fd >= 0 && h_rng_range(0, 99) < ADOPT_CUT_PCT)
        client_cut_adopt(c);
}

static void on_adopt_reply(struct client *c, const char *line, int64_t now)
{
    const char *v;

    c->adopt = false;
    if (!h_starts(line, "OK resource=")) {
        if (!h_starts(line, "ERR LOST ") && !h_starts(line, "ERR UNAVAILABLE ")
            && !h_starts(line, "ERR SHUTDOWN "))
            note_unexpected("client %d: ADOPT answered \"%s\"", c->id, line);
        cnt.adopts_failed++;
        work_end(c, now);
        round_done(c, now);
        return;
    }
    v = h_kv(line, "fence");
    if (v == NULL || strtoull(v, NULL, 10) != c->fence)
        note_unexpected("client %d: ADOPT changed the fence %" PRIu64
                        ": \"%s\"", c->id, c->fence, line);
    h_kv_copy(line, "token", c->token, sizeof(c->token));
    v = h_kv(line, "validity");
    if (v != NULL) {
        int64_t deadline = c->req_sent + US(strtoll(v, NULL, 10));
        /* The interval stays one: it worked on, under its old deadline,
         * while cut off; a deadline already past ended it. */
        if (c->working && c->deadline > now && deadline > c->deadline)
            c->deadline = deadline;
    }
    c->refreshed = c->req_sent;
    c->held = c->working;
    cnt.adopts++;
    if (!c->held)
        round_done(c, now);
}

static void client_line(void *ud, const char *line, int64_t now)
{
    struct client *c = ud;
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
        if (c->adopt)
            client_adopt(c, now);
        break;
    case REQ_ADOPT:
        on_adopt_reply(c, line, now);
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

/*
 * Read what has arrived on *fd into buf (*len bytes are there already)
 * and hand each complete line to on_line, which may close the connection
 * (*fd -1). Returns -1 when the peer closed it or it failed, else 0.
 */
static int lines_read(const int *fd, char *buf, size_t size, size_t *len,
                      void (*on_line)(void *ud, const char *line, int64_t now),
                      void *ud)
{
    for (;;) {
        ssize_t n = recv(*fd, buf + *len, size - 1 - *len, 0);
        int64_t now = h_now_us();
        char *lf;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0)
            return -1;
        *len += (size_t)n;
        while (*fd >= 0 && (lf = memchr(buf, '\n', *len)) != NULL) {
            size_t ll = (size_t)(lf - buf);

            *lf = '\0';
            on_line(ud, buf, now);
            if (*fd < 0)
                return 0;
            memmove(buf, lf + 1, *len - ll - 1);
            *len -= ll + 1;
        }
        ck_assert_msg(*len < size - 1, "a line of %zu bytes", *len);
    }
}

/* Read what has arrived and act on every complete line. */
static void client_read(struct client *c)
{
    if (lines_read(&c->fd, c->buf, sizeof(c->buf), &c->len, client_line, c) < 0)
        client_drop(c, true);
}

static bool client_busy(const struct client *c)
{
    return c->fd >= 0 && (c->req != REQ_NONE || c->held);
}

static bool rounds_done(void)
{
    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].rounds < rc->rounds)
            return false;
    }
    return true;
}

static void client_tick(struct client *c, int64_t now)
{
    if (c->working && now >= c->deadline)
        work_end(c, now);
    if (c->fd < 0) {
        if (!stopping && now >= c->next_at)
            client_connect(c, now);
        return;
    }
    if (c->working && now >= c->deadline)
        work_end(c, now);
    if (c->req != REQ_NONE) {
        if (now >= c->req_timeout)
            client_drop(c, true);
        return;
    }
    if (c->held) {
        if (!c->working || stopping || now >= c->hold_until) {
            client_unlock(c);
        } else if (now - c->refreshed >= US(REFRESH_MS)) {
            c->refreshed = now;
            client_send(c, REQ_LOCKS, reply_timeout(c), "LOCKS");
        }
        return;
    }
    if (!stopping && now >= c->next_at)
        client_lock(c);
}

/* ---- tagged sessions ---------------------------------------------------- */

static int lane_holder(const struct tagged *t, int l)
{
    return TAG_HOLDER * (t->id + 1) + l;
}

/* Lane l's interval ends at now, or at its deadline if that came first. */
static void lane_end(struct tagged *t, int l, int64_t now)
{
    struct lane *ln = &t->lane[l];
    int64_t end = now < ln->deadline ? now : ln->deadline;

    if (!ln->working)
        return;
    if (ln->deadline <= now)
        cnt.tag_expired++;
    record(ln->res, lane_holder(t, l), MC_REDLOCKD, ln->fence, ln->start, end,
           NULL);
    ln->working = false;
}

/* The lane is through with its resource: another lane may take it. */
static void lane_done(struct tagged *t, struct lane *ln, int64_t now)
{
    if (ln->res >= 0)
        t->lane_of[ln->res - NRES] = -1;
    ln->res = -1;
    ln->req = REQ_NONE;
    ln->held = ln->asked = false;
    ln->next_at = now + US(h_rng_range(0, 150));
}

/* Close the connection at once: every lane stops working, and the
 * session (not detachable) ends with its locks. `failover` as for a
 * client. */
static void tagged_drop(struct tagged *t, bool failover)
{
    int64_t now = h_now_us();

    for (int l = 0; l < TAG_LANES; l++) {
        struct lane *ln = &t->lane[l];

        lane_end(t, l, now);
        if (ln->req != REQ_NONE || ln->held)
            note_touch(ln->res, now);
        lane_done(t, ln, now);
    }
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->len = t->out_len = 0;
    t->hello = t->refreshing = false;
    t->daemon = failover ? other_daemon(t->daemon) : t->id % NDAEMONS;
    t->next_at = now + US(h_rng_range(50, 200));
    cnt.tag_drops++;
}

/* A request for this turn's write (tagged_flush). */
static void tagged_queue(struct tagged *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void tagged_queue(struct tagged *t, const char *fmt, ...)
{
    size_t room = sizeof(t->out) - t->out_len;
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(t->out + t->out_len, room, fmt, ap);
    va_end(ap);
    ck_assert(n > 0 && (size_t)n < room - 1);
    t->out_len += (size_t)n;
    t->out[t->out_len++] = '\n';
}

/* The turn's requests in one write, which the daemon reads together. As
 * for a client: anything short of all of it means the connection is
 * gone. */
static void tagged_flush(struct tagged *t)
{
    ssize_t w;

    if (t->fd < 0 || t->out_len == 0)
        return;
    do {
        w = send(t->fd, t->out, t->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w != (ssize_t)t->out_len) {
        tagged_drop(t, true);
        return;
    }
    t->out_len = 0;
}

static void tagged_connect(struct tagged *t, int64_t now)
{
    int fd = daemon_connect(&t->daemon);

    if (fd < 0) {
        t->next_at = now + US(100);
        return;
    }
    t->fd = fd;
    t->len = t->out_len = 0;
    t->hello = true;
    t->hello_timeout = now + US(patience_ms(t->patient));
    tagged_queue(t, "HELLO name=mt%d", t->id);
}

/* A resource no other lane of this session is on. */
static void lane_lock(struct tagged *t, int l, int64_t now)
{
    struct lane *ln = &t->lane[l];
    char name[RES_NAME_MAX];
    int k = h_rng_range(0, TAG_RES - 1);

    while (t->lane_of[k] >= 0)
        k = (k + 1) % TAG_RES;
    t->lane_of[k] = l;
    ln->res = NRES + k;
    ln->req = REQ_LOCK;
    ln->sent = now;
    ln->timeout = now + US(WAIT_MS + patience_ms(t->patient));
    res_name(name, ln->res);
    cnt.tag_rounds++;
    tagged_queue(t, "#l%d LOCK %s ttl=%d wait=%d", l, name, TTL_MS, WAIT_MS);
}

static void lane_unlock(struct tagged *t, int l, int64_t now)
{
    struct lane *ln = &t->lane[l];
    char name[RES_NAME_MAX];

    /* The holder stops working before the request leaves. */
    lane_end(t, l, now);
    ln->req = REQ_UNLOCK;
    ln->sent = now;
    ln->timeout = now + US(patience_ms(t->patient));
    res_name(name, ln->res);
    tagged_queue(t, "#l%d UNLOCK %s", l, name);
}

/* One LOCKS for every lane: those holding now (and not releasing) learn
 * their deadlines from its answer. */
static void tagged_refresh(struct tagged *t, int64_t now)
{
    for (int l = 0; l < TAG_LANES; l++) {
        struct lane *ln = &t->lane[l];

        ln->asked = ln->held && ln->working && ln->req == REQ_NONE;
    }
    t->refreshing = true;
    t->locks_sent = t->refreshed = now;
    t->locks_timeout = now + US(patience_ms(t->patient));
    tagged_queue(t, "#r LOCKS");
}

static void on_lane_lock(struct tagged *t, int l, const char *body, int64_t now)
{
    struct lane *ln = &t->lane[l];
    const char *v;
    long long validity;

    if (h_starts(body, "OK resource=")) {
        ck_assert_msg(resource_is(h_kv(body, "resource"), ln->res), "%s", body);
        v = h_kv(body, "fence");
        ck_assert_msg(v != NULL, "LOCK reply without fence: %s", body);
        ln->fence = strtoull(v, NULL, 10);
        v = h_kv(body, "validity");
        ck_assert_msg(v != NULL, "LOCK reply without validity: %s", body);
        validity = strtoll(v, NULL, 10);
        cnt.tag_grants++;
        ln->held = true;
        ln->start = now;
        ln->deadline = ln->sent + US(validity);
        ln->hold_until = now + US(hold_ms());
        if (ln->deadline > now) {
            ln->working = true;
        } else {
            cnt.tag_late++;
            record(ln->res, lane_holder(t, l), MC_REDLOCKD, ln->fence, now,
                   ln->deadline, NULL);
        }
        return;
    }
    if (h_starts(body, "ERR BUSY ") || h_starts(body, "ERR TIMEOUT ") ||
        h_starts(body, "ERR UNAVAILABLE ")) {
        cnt.tag_refused++;
        lane_done(t, ln, now);
        return;
    }
    if (h_starts(body, "ERR SHUTDOWN ")) {
        tagged_drop(t, true);
        return;
    }
    note_unexpected("tagged %d lane %d: LOCK answered \"%s\"", t->id, l, body);
    lane_done(t, ln, now);
}

static void on_lane_unlock(struct tagged *t, int l, const char *body,
                           int64_t now)
{
    if (!h_starts(body, "OK resource=") && !h_starts(body, "ERR LOST ") &&
        !h_starts(body, "ERR NOTHELD "))
        note_unexpected("tagged %d lane %d: UNLOCK answered \"%s\"", t->id, l,
                        body);
    lane_done(t, &t->lane[l], now);
}

/* The lane on the resource a reply or event names, or -1. */
static int lane_named(const struct tagged *t, const char *name)
{
    char *rest;
    long k;

    if (name == NULL || !h_starts(name, TAG_RES_PREFIX))
        return -1;
    k = strtol(name + strlen(TAG_RES_PREFIX), &rest, 10);
    if (*rest != '\0' || k < 0 || k >= TAG_RES)
        return -1;
    return t->lane_of[k];
}

/* One lease of the LOCKS answer: the lane holding it, if it asked, has
 * its deadline moved (or learns that it is over). */
static void lane_confirm(struct tagged *t, json_t *lock, int64_t now)
{
    int l = lane_named(t, json_string_value(json_object_get(lock, "resource")));
    json_t *fence = json_object_get(lock, "fence");
    json_t *v = json_object_get(lock, "validity");
    struct lane *ln;
    int64_t deadline;

    if (l < 0)
        return;
    ln = &t->lane[l];
    if (!ln->asked || !json_is_integer(fence) ||
        (uint64_t)json_integer_value(fence) != ln->fence)
        return;
    if (!json_is_integer(v)) {
        note_unexpected("tagged %d: LOCKS without validity for lane %d", t->id,
                        l);
        return;
    }
    ln->asked = false;
    deadline = t->locks_sent + US(json_integer_value(v));
    /* As for a client: a lease already over is learnt now. */
    if (deadline <= now)
        lane_end(t, l, now);
    else
        ln->deadline = deadline;
}

static void tagged_on_locks(struct tagged *t, const char *body, int64_t now)
{
    json_t *o, *lock;
    json_error_t err;
    size_t i;

    t->refreshing = false;
    if (!h_starts(body, "OK {")) {
        note_unexpected("tagged %d: LOCKS answered \"%.200s\"", t->id, body);
        return;
    }
    o = json_loads(body + 3, 0, &err);
    ck_assert_msg(json_is_object(o), "LOCKS: bad JSON (%s): %.200s", err.text,
                  body);
    json_array_foreach(json_object_get(o, "locks"), i, lock)
        lane_confirm(t, lock, now);
    json_decref(o);
    /* Held when LOCKS went out, and not in its answer: no longer held. */
    for (int l = 0; l < TAG_LANES; l++) {
        struct lane *ln = &t->lane[l];

        if (!ln->asked || !ln->held || ln->req != REQ_NONE)
            continue;
        cnt.tag_lost++;
        lane_end(t, l, now);
        lane_done(t, ln, now);
    }
}

static void tagged_on_event(struct tagged *t, const char *line, int64_t now)
{
    const char *v;
    struct lane *ln;
    int l;

    if (!h_starts(line, "EVENT LOST "))
        return;     /* SHUTDOWN, CLOSING: the connection's end tells */
    l = lane_named(t, h_kv(line, "resource"));
    if (l < 0 || !t->lane[l].held)
        return;
    ln = &t->lane[l];
    v = h_kv(line, "fence");
    if (v == NULL || strtoull(v, NULL, 10) != ln->fence)
        return;
    cnt.tag_lost++;
    lane_end(t, l, now);
    /* An UNLOCK on its way is answered LOST, and ends the round then. */
    if (ln->req == REQ_NONE)
        lane_done(t, ln, now);
}

/* "#l<n> <reply>": lane n's; "#r ...": the LOCKS; untagged: the HELLO. */
static void tagged_line(void *ud, const char *line, int64_t now)
{
    struct tagged *t = ud;
    const char *body = strchr(line, ' ');
    char *rest;
    long l;

    if (h_starts(line, "EVENT ")) {
        tagged_on_event(t, line, now);
    } else if (line[0] != '#') {
        if (!t->hello || !h_starts(line, "OK proto=1 "))
            note_unexpected("tagged %d: \"%.200s\"", t->id, line);
        t->hello = false;
    } else if (body != NULL && h_starts(line, "#r ") && t->refreshing) {
        tagged_on_locks(t, body + 1, now);
    } else if (body != NULL && line[1] == 'l' &&
               (l = strtol(line + 2, &rest, 10)) >= 0 && l < TAG_LANES &&
               rest == body && t->lane[l].req != REQ_NONE) {
        enum req req = t->lane[l].req;

        t->lane[l].req = REQ_NONE;
        if (req == REQ_LOCK)
            on_lane_lock(t, (int)l, body + 1, now);
        else
            on_lane_unlock(t, (int)l, body + 1, now);
    } else {
        note_unexpected("tagged %d: a reply nobody asked for: \"%.200s\"",
                        t->id, line);
    }
}

static void tagged_read(struct tagged *t)
{
    if (lines_read(&t->fd, t->buf, sizeof(t->buf), &t->len, tagged_line, t) < 0)
        tagged_drop(t, true);
}

/* A reply that should have come by now has not. */
static bool tagged_overdue(const struct tagged *t, int64_t now)
{
    if ((t->hello && now >= t->hello_timeout) ||
        (t->refreshing && now >= t->locks_timeout))
        return true;
    for (int l = 0; l < TAG_LANES; l++) {
        if (t->lane[l].req != REQ_NONE && now >= t->lane[l].timeout)
            return true;
    }
    return false;
}

static bool tagged_busy(const struct tagged *t)
{
    if (t->fd < 0)
        return false;
    if (t->hello || t->refreshing)
        return true;
    for (int l = 0; l < TAG_LANES; l++) {
        if (t->lane[l].req != REQ_NONE || t->lane[l].held)
            return true;
    }
    return false;
}

/* How many resources the tagged sessions hold, and hold or wait for, at
 * once: the most of either. */
static void tagged_peaks(void)
{
    int held = 0, out = 0;

    for (int i = 0; i < rc->ntagged; i++) {
        for (int l = 0; l < TAG_LANES; l++) {
            const struct lane *ln = &TS[i].lane[l];

            held += ln->working;
            out += ln->working || ln->req == REQ_LOCK;
        }
    }
    if (held > cnt.tag_peak_held)
        cnt.tag_peak_held = held;
    if (out > cnt.tag_peak_out)
        cnt.tag_peak_out = out;
}

/* Every lane's next step, as a client's, then the turn's write. */
static void tagged_tick(struct tagged *t, int64_t now)
{
    bool holding = false;

    for (int l = 0; l < TAG_LANES; l++) {
        if (t->lane[l].working && now >= t->lane[l].deadline)
            lane_end(t, l, now);
    }
    if (t->fd < 0) {
        if (!stopping && now >= t->next_at)
            tagged_connect(t, now);
    } else if (tagged_overdue(t, now)) {
        tagged_drop(t, true);
    } else if (!t->hello) {
        for (int l = 0; l < TAG_LANES; l++) {
            struct lane *ln = &t->lane[l];

            if (ln->req != REQ_NONE)
                continue;
            if (ln->held && (!ln->working || stopping || now >= ln->hold_until))
                lane_unlock(t, l, now);
            else if (ln->held)
                holding = true;
            else if (!stopping && now >= ln->next_at)
                lane_lock(t, l, now);
        }
        if (holding && !t->refreshing && now - t->refreshed >= US(REFRESH_MS))
            tagged_refresh(t, now);
    }
    tagged_flush(t);
}

static void tagged_init(struct tagged *t, int id)
{
    memset(t->lane_of, -1, sizeof(t->lane_of));
    t->id = id;
    t->fd = -1;
    t->daemon = id % NDAEMONS;
    /* One rides out a silent daemon, the other leaves it. */
    t->patient = id % 2 == 0;
    t->hello = t->refreshing = false;
    t->len = t->out_len = 0;
    t->refreshed = t->next_at = 0;
    for (int l = 0; l < TAG_LANES; l++) {
        struct lane *ln = &t->lane[l];

        ln->res = -1;
        ln->req = REQ_NONE;
        ln->held = ln->working = ln->asked = false;
        ln->next_at = 0;
    }
}

/* The schedule's cut: a connected session's connection closed at once. */
static void tagged_cut(void)
{
    int pick = h_rng_range(0, rc->ntagged - 1);

    for (int k = 0; k < rc->ntagged; k++) {
        struct tagged *t = &TS[(pick + k) % rc->ntagged];

        if (t->fd >= 0) {
            tagged_drop(t, false);
            cnt.tag_cuts++;
            return;
        }
    }
}

/* ---- plain Redlock clients ---------------------------------------------- */

static const char plain_cad[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";

static void plain_fail(struct plain *p, int i, int64_t now)
{
    if (p->ctx[i] != NULL)
        redisFree(p->ctx[i]);
    p->ctx[i] = NULL;
    /* A stopped node accepts connections and never answers: do not pay
     * the timeout on every attempt. */
    p->retry_at[i] = now + US(1000);
}

static redisContext *plain_ctx(struct plain *p, int i, int64_t now)
{
    struct timeval tv = { 0, PLAIN_IO_MS * 1000 };
    redisContext *ctx;

    if (p->ctx[i] != NULL || now < p->retry_at[i])
        return p->ctx[i];
    ctx = redisConnectWithTimeout("127.0.0.1", N[i].port, tv);
    if (ctx == NULL || ctx->err != 0 || redisSetTimeout(ctx, tv) != REDIS_OK) {
        if (ctx != NULL)
            redisFree(ctx);
        p->retry_at[i] = now + US(300);
        return NULL;
    }
    p->ctx[i] = ctx;
    return ctx;
}

static void plain_key(char *key, size_t size, int res)
{
    char name[RES_NAME_MAX];

    res_name(name, res);
    snprintf(key, size, "%s%s", rc->prefix[0], name);
}

/* Send one command to every reachable node at once, then collect: a
 * stopped node costs one timeout, not one per node. Returns how many
 * answered with `want` (a status text, or an integer 1 when NULL). */
static int plain_all(struct plain *p, const char *want, const char *fmt, ...)
{
    bool sent[NNODES] = { false };
    int64_t now = h_now_us();
    int ok = 0;
    va_list ap;

    for (int i = 0; i < NNODES; i++) {
        redisContext *ctx = plain_ctx(p, i, now);

        if (ctx == NULL)
            continue;
        va_start(ap, fmt);
        sent[i] = redisvAppendCommand(ctx, fmt, ap) == REDIS_OK;
        va_end(ap);
        if (!sent[i])
            plain_fail(p, i, now);
    }
    for (int i = 0; i < NNODES; i++) {
        redisReply *r = NULL;

        if (!sent[i])
            continue;
        if (redisGetReply(p->ctx[i], (void **)&r) != REDIS_OK || r == NULL) {
            plain_fail(p, i, h_now_us());
            continue;
        }
        if (want != NULL ? r->type == REDIS_REPLY_STATUS && strcmp(r->str, want) == 0
                         : r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            ok++;
        freeReplyObject(r);
    }
    return ok;
}

static void plain_release(struct plain *p)
{
    char key[KEY_MAX];

    plain_key(key, sizeof(key), p->res);
    plain_all(p, NULL, "EVAL %s 1 %s %s", plain_cad, key, p->token);
}

static void plain_try(struct plain *p)
{
    char key[KEY_MAX];
    int ok;
    int64_t now, validity;

    p->res = rc->kinds ? RES_PLAIN : h_rng_range(0, NRES - 1);
    for (int i = 0; i < 32; i++)
        p->token[i] = "0123456789abcdef"[h_rng_next() % 16];
    p->token[32] = '\0';
    plain_key(key, sizeof(key), p->res);
    cnt.plain_rounds++;
    p->t0 = h_now_us();
    ok = plain_all(p, "OK", "SET %s %s NX PX %d", key, p->token, TTL_MS);
    now = h_now_us();
    validity = US(TTL_MS) - (now - p->t0) - US(DRIFT_MS);
    if (ok >= QUORUM && validity > 0) {
        int64_t hold = US(h_rng_range(10, 300));

        cnt.plain_grants++;
        p->holding = true;
        p->start = now;
        p->valid_end = p->t0 + validity;
        /* Always release within the validity, by the driver's own clock. */
        if (hold > validity - US(20))
            hold = validity > US(20) ? validity - US(20) : 0;
        p->hold_until = now + hold;
        return;
    }
    /* Partial keys: gone at once, or by their ttl. */
    note_touch(p->res, p->t0);
    plain_release(p);
    p->next_at = h_now_us() + US(h_rng_range(50, 250));
}

static void plain_tick(struct plain *p, int64_t now)
{
    if (p->holding) {
        if (now >= p->hold_until || stopping) {
            int64_t t = h_now_us();

            record(p->res, 100 + p->id, MC_PLAIN, 0, p->start,
                   t < p->valid_end ? t : p->valid_end, NULL);
            p->holding = false;
            plain_release(p);
            p->next_at = h_now_us() + US(h_rng_range(20, 200));
        }
        return;
    }
    if (!stopping && now >= p->next_at)
        plain_try(p);
}

static void plain_close(struct plain *p)
{
    for (int i = 0; i < NNODES; i++) {
        if (p->ctx[i] != NULL)
            redisFree(p->ctx[i]);
        p->ctx[i] = NULL;
    }
}

/* ---- redlockctl run clients --------------------------------------------- */

static const char *env_bin(const char *var)
{
    const char *bin = getenv(var);

    ck_assert_msg(bin != NULL && *bin != '\0', "%s is not set (run through "
                  "meson test)", var);
    return bin;
}

/* The file of r's run `run`, or (ext ".err") its redlockctl's stderr: in
 * node 0's directory, which the harness removes even when the test dies. */
static void run_path(char *buf, const struct runner *r, int run, const char *ext)
{
    int n = snprintf(buf, RUN_PATH_MAX, "%s/run%d.%d%s", N[0].dir, r->id, run,
                     ext);

    ck_assert(n > 0 && n < RUN_PATH_MAX);
}

/* The first line redlockctl wrote on stderr ("" for none) into buf. */
static void run_said(const struct runner *r, int run, char *buf, size_t size)
{
    char path[RUN_PATH_MAX];
    FILE *f;

    run_path(path, r, run, ".err");
    buf[0] = '\0';
    f = fopen(path, "r");
    if (f == NULL)
        return;
    if (fgets(buf, (int)size, f) != NULL)
        buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
}

/* In the child: redlockctl with stdio of its own and nothing else of
 * ours (the clients' sockets must not live on in it), signals as a shell
 * would give them. */
static void runner_exec(char *const *argv, const char *err_path, pid_t parent)
{
    sigset_t none;
    int in = open("/dev/null", O_RDWR);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    /* The visible redlockctl never outlives the test; its keeper is not
     * asked to (the command's group ends within its MS). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent || in < 0 || err < 0)
        _exit(127);
    dup2(in, 0);
    dup2(in, 1);
    dup2(err, 2);
    if (close_range(3, ~0U, 0) < 0) {
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(argv[0], argv);
    _exit(127);
}

/* Mostly short, some past the ttl: those live on the keeper's
 * confirmations alone. */
static int run_ms(void)
{
    return h_rng_range(0, 99) < 75 ? h_rng_range(50, 500) : h_rng_range(1000, 3000);
}

/* The next run: its home daemon first, the other as the failover. */
static void runner_start(struct runner *r)
{
    char file[RUN_PATH_MAX], err[RUN_PATH_MAX], name[RES_NAME_MAX];
    char cname[16], s0[32], s1[32], ms[16];
    int home = r->id % NDAEMONS;
    char *argv[] = {
        (char *)env_bin("REDLOCKCTL_BIN"), "-q", "--name", cname, "-s", s0,
        "-s", s1, "run", "--ttl", STR(TTL_MS), "--wait", STR(WAIT_MS),
        "--detach", STR(ADOPT_DETACH_MS), name, "--", "sh", "-c", RUN_SCRIPT,
        "sh", file, (char *)env_bin("STAMPER_BIN"), ms, NULL,
    };
    pid_t parent = getpid();

    r->res = h_rng_range(0, NRES - 1);
    res_name(name, r->res);
    snprintf(cname, sizeof(cname), "mxrun%d", r->id);
    snprintf(s0, sizeof(s0), "127.0.0.1:%d", D[home].port);
    snprintf(s1, sizeof(s1), "127.0.0.1:%d", D[other_daemon(home)].port);
    snprintf(ms, sizeof(ms), "%d", run_ms());
    run_path(file, r, r->runs, "");
    run_path(err, r, r->runs, ".err");
    r->runs++;
    cnt.runs++;
    r->pid = fork();
    ck_assert_msg(r->pid >= 0, "fork: %s", strerror(errno));
    if (r->pid == 0)
        runner_exec(argv, err, parent);
}

/* Its last run ended with wait status st (its redlockctl's, or after a
 * SIGKILL its keeper's, which is the same by design). */
static void runner_done(struct runner *r, int st, int64_t now)
{
    int status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    char said[256];
    bool released;

    run_said(r, r->runs - 1, said, sizeof(said));
    switch (status) {
    case 0:
        cnt.run_ok++;
        break;
    case EXIT_CONFLICT:
        cnt.run_busy++;
        break;
    case EXIT_LOST:
        cnt.run_lost++;
        break;
    case EXIT_UNAVAILABLE:
        cnt.run_failed++;
        break;
    default:
        note_unexpected("runner %d: run %d exited %d: %s", r->id, r->runs - 1,
                        status, said);
    }
    if (said[0] != '\0')
        fprintf(stderr, "mutex: +%.1f s run %d.%d exited %d: %s\n", secs(now),
                r->id, r->runs - 1, status, said);
    /* A run that did not end in a release (a quiet one that took the lock
     * released it) may leave its session detached, holding the lock, for
     * --detach. */
    released = (status == 0 || status == EXIT_CONFLICT) && said[0] == '\0';
    note_touch(r->res, now + (released ? 0 : US(ADOPT_DETACH_MS)));
    r->next_at = now + US(h_rng_range(0, 150));
}

/* A run whose end we cannot know: a keeper its redlockctl reaped just
 * before our SIGKILL landed. */
static void runner_lost_track(struct runner *r, int64_t now)
{
    r->pid = r->keeper = 0;
    note_touch(r->res, now + US(ADOPT_DETACH_MS));
    r->next_at = now;
}

static void runner_tick(struct runner *r, int64_t now)
{
    pid_t w;
    int st;

    if (r->pid != 0 && waitpid(r->pid, &st, WNOHANG) == r->pid) {
        r->pid = 0;
        runner_done(r, st, now);
    }
    if (r->keeper != 0 && (w = waitpid(r->keeper, &st, WNOHANG)) != 0) {
        if (w == r->keeper) {
            r->keeper = 0;
            runner_done(r, st, now);
        } else {
            runner_lost_track(r, now);
        }
    }
    if (r->pid == 0 && r->keeper == 0 && !stopping && now >= r->next_at)
        runner_start(r);
}

static bool runner_busy(const struct runner *r)
{
    return r->pid != 0 || r->keeper != 0;
}

/* The file of r's run `run`, read past its command's first line (the
 * resource, fence and keeper into the pointers); NULL while the command
 * has not written it, or when it never ran. */
static FILE *run_open(const struct runner *r, int run, char name[RES_NAME_MAX],
                      unsigned long long *fence, long *keeper)
{
    char path[RUN_PATH_MAX];
    FILE *f;

    run_path(path, r, run, "");
    f = fopen(path, "r");
    if (f != NULL && fscanf(f, "%15s %llu %ld", name, fence, keeper) != 3) {
        fclose(f);
        f = NULL;
    }
    return f;
}

/* The keeper of r's run going on; 0 while its command has not started. */
static pid_t runner_keeper(const struct runner *r)
{
    char name[RES_NAME_MAX];
    unsigned long long fence;
    long keeper;
    FILE *f = run_open(r, r->runs - 1, name, &fence, &keeper);

    if (f == NULL)
        return 0;
    fclose(f);
    return (pid_t)keeper;
}

/*
 * The schedule's cut: SIGKILL a redlockctl whose command runs. Its keeper
 * holds on by design; orphaned, it becomes our child (we are a
 * subreaper), and its exit is then the run's.
 */
static void runner_cut(void)
{
    int pick = h_rng_range(0, rc->nrunners - 1);

    for (int k = 0; k < rc->nrunners; k++) {
        struct runner *r = &RN[(pick + k) % rc->nrunners];
        pid_t keeper = r->pid != 0 ? runner_keeper(r) : 0;
        int st;

        if (keeper <= 0)
            continue;
        ck_assert_int_eq(kill(r->pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(r->pid, &st, 0), r->pid);
        r->pid = 0;
        cnt.run_cuts++;
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
            r->keeper = keeper;
        else
            runner_done(r, st, h_now_us());     /* it had just exited */
        return;
    }
}

/* The end of the run: a run still going after the drain (its worker
 * writes for 3 s at most: one that hangs) gets SIGTERM, then SIGKILL, and
 * its lock counts as held for --detach more. */
static void runner_stop(struct runner *r)
{
    pid_t pid = r->pid != 0 ? r->pid : r->keeper;
    int64_t until = h_now_us() + US(h_scale(5000));
    int st;

    if (pid == 0)
        return;
    cnt.run_stopped++;
    kill(pid, SIGTERM);
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (h_now_us() >= until) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        h_sleep_ms(10);
    }
    runner_lost_track(r, h_now_us());
}

/* Run `run` of r: the worker's interval, from its first stamp to its last,
 * with the fence its command was given. A run whose command never started
 * (the lock was busy) has no file; a worker stopped before its first
 * stamp worked not at all. */
static void run_collect(const struct runner *r, int run)
{
    char name[RES_NAME_MAX];
    unsigned long long fence;
    long long ns, first = -1, last = -1;
    long keeper;
    int res = -1, n = 0;
    FILE *f = run_open(r, run, name, &fence, &keeper);

    if (f == NULL)
        return;
    for (int i = 0; i < NRES; i++) {
        if (resource_is(name, i))
            res = i;
    }
    while (fscanf(f, "%lld", &ns) == 1) {
        if (first < 0)
            first = ns;
        last = ns;
        n++;
    }
    fclose(f);
    if (res < 0 && first >= 0)
        note_unexpected("runner %d: run %d was given %s", r->id, run, name);
    if (res < 0 || first < 0)
        return;
    cnt.run_worked++;
    cnt.run_stamps += n;
    /* Stamps are instants: the interval closes just after the last. */
    record(res, RUN_HOLDER + r->id, MC_REDLOCKD, fence, first / 1000,
           last / 1000 + 1, NULL);
}

static void runs_collect(void)
{
    for (int i = 0; i < rc->nrunners; i++) {
        for (int run = 0; run < RN[i].runs; run++)
            run_collect(&RN[i], run);
    }
}

/* ---- the fault schedule ------------------------------------------------- */

static void faults_plan(void)
{
    int64_t t = US(3000);

    nfaults = 0;
    ck_assert_int_le(rc->fault_cycles, FAULT_CYCLES);
    for (int cycle = 0; cycle < rc->fault_cycles; cycle++) {
        enum fault_kind order[F_NKINDS] = {
            F_NODE_STOP, F_NODE_KILL, F_DAEMON_KILL, F_DAEMON_STOP,
            F_DAEMON_RESTART,
        };

        for (int i = F_NKINDS - 1; i > 0; i--) {
            int j = h_rng_range(0, i);
            enum fault_kind k = order[i];

            order[i] = order[j];
            order[j] = k;
        }
        for (int i = 0; i < F_NKINDS; i++) {
            struct fault *f = &faults[nfaults++];
            int ms = 0;

            f->kind = order[i];
            f->started = false;
            switch (f->kind) {
            case F_NODE_STOP:
                f->target = h_rng_range(0, NNODES - 1);
                ms = h_rng_range(1000, 3000);
                break;
            case F_NODE_KILL:
                f->target = h_rng_range(0, NNODES - 1);
                ms = h_rng_range(500, 2000);
                break;
            case F_DAEMON_KILL:
                f->target = h_rng_range(0, NDAEMONS - 1);
                ms = h_rng_range(2000, 4000);
                break;
            case F_DAEMON_STOP:
                /* Longer than the ttl: leases run out while it sleeps. */
                f->target = h_rng_range(0, NDAEMONS - 1);
                ms = 2 * TTL_MS + h_rng_range(0, 1000);
                break;
            case F_DAEMON_RESTART:
                /* SIGTERM leaves its leases; its clients adopt them on
                 * the other daemon, or on this one once it is back. */
                f->target = h_rng_range(0, NDAEMONS - 1);
                ms = h_rng_range(1500, 2500);
                break;
            case F_NKINDS:
                break;
            }
            f->at = t;
            f->until = t + US(ms);
            t = f->until + US(h_rng_range(2000, 3500));
        }
    }
}

static int64_t faults_end(void)
{
    return nfaults > 0 ? faults[nfaults - 1].until : 0;
}

/* The daemon that most exclusive holders are connected to now, or want
 * when none is: a daemon fault then cuts some holder off (and it ADOPTs
 * its lease elsewhere), rather than hitting a daemon its clients have
 * already left after an earlier fault. */
static int fault_daemon_with_holders(int want)
{
    int n[NDAEMONS] = { 0 };
    int best = want;

    for (int i = 0; i < NCLIENTS; i++) {
        const struct client *c = &C[i];
        if (c->fd >= 0 && c->held && c->working && !c->shared && c->slot < 0)
            n[c->daemon]++;
    }
    for (int d = 0; d < NDAEMONS; d++)
        if (n[d] > n[best])
            best = d;
    return best;
}

static int fault_daemon(int want)
{
    want = fault_daemon_with_holders(want);
    if (daemon_usable(want) && !d_stopped[want])
        return want;
    want = other_daemon(want);
    return daemon_usable(want) && !d_stopped[want] ? want : -1;
}

static void fault_begin(struct fault *f)
{
    int64_t ms = (f->until - f->at) / 1000;

    switch (f->kind) {
    case F_NODE_STOP:
        h_redis_pause(&N[f->target]);
        break;
    case F_NODE_KILL:
        h_redis_kill(&N[f->target]);
        break;
    case F_DAEMON_KILL:
        f->target = fault_daemon(f->target);
        if (f->target < 0)
            break;
        h_daemon_kill(&D[f->target]);
        break;
    case F_DAEMON_STOP:
        f->target = fault_daemon(f->target);
        if (f->target < 0)
            break;
        ck_assert_int_eq(kill(D[f->target].pid, SIGSTOP), 0);
        d_stopped[f->target] = true;
        break;
    case F_DAEMON_RESTART:
        f->target = fault_daemon(f->target);
        if (f->target < 0)
            break;
        /* Not waited for here: the clients act while it shuts down. */
        ck_assert_int_eq(kill(D[f->target].pid, SIGTERM), 0);
        d_terminated[f->target] = true;
        break;
    case F_NKINDS:
        break;
    }
    if (f->target >= 0)
        cnt.faults[f->kind]++;
    fprintf(stderr, "mutex: +%.1f s %s %s %d for %" PRId64 " ms\n",
            secs(h_now_us()), fault_names[f->kind],
            f->kind == F_NODE_STOP || f->kind == F_NODE_KILL ? "node" : "daemon",
            f->target, ms);
}

static void fault_end(struct fault *f)
{
    if (f->target < 0)
        return;
    switch (f->kind) {
    case F_NODE_STOP:
        h_redis_resume(&N[f->target]);
        break;
    case F_NODE_KILL:
        /* Same port and directory: the append-only file brings it back. */
        h_redis_restart(&N[f->target]);
        break;
    case F_DAEMON_KILL:
        h_daemon_cleanup(&D[f->target]);
        daemon_start(f->target);
        break;
    case F_DAEMON_STOP:
        ck_assert_int_eq(kill(D[f->target].pid, SIGCONT), 0);
        d_stopped[f->target] = false;
        break;
    case F_DAEMON_RESTART: {
        int st = h_daemon_wait(&D[f->target], 10000);
        if (st != 0) {
            cnt.crashed++;
            fprintf(stderr, "mutex: daemon %d exited %d on SIGTERM\n",
                    f->target, st);
        }
        h_daemon_restart(&D[f->target]);
        d_terminated[f->target] = false;
        break;
    }
    case F_NKINDS:
        break;
    }
}

/* Now and then a tagged session's connection cut, or a redlockctl whose
 * command runs SIGKILLed (its keeper holds on). */
static void cuts_tick(int64_t t, int64_t *next_cut)
{
    bool runner = rc->nrunners > 0 && (rc->ntagged == 0 || h_rng_range(0, 1));

    if (rc->ntagged + rc->nrunners == 0 || t < *next_cut || t >= faults_end())
        return;
    if (runner)
        runner_cut();
    else
        tagged_cut();
    *next_cut = t + US(h_rng_range(3000, 6000));
}

static void faults_tick(int64_t now, int64_t *next_disconnect, int64_t *next_cut)
{
    int64_t t = now - t_run;

    for (int i = 0; i < nfaults; i++) {
        struct fault *f = &faults[i];

        if (!f->started && t >= f->at) {
            f->started = true;
            fault_begin(f);
        }
        if (f->started && f->until >= 0 && t >= f->until) {
            fault_end(f);
            f->until = -1;  /* done */
        }
    }
    /* Abrupt disconnects: half of them hit a holder. */
    if (t >= *next_disconnect && t < faults_end()) {
        int pick = h_rng_range(0, NCLIENTS - 1);
        bool want_holder = h_rng_range(0, 1) == 0;

        for (int k = 0; k < NCLIENTS; k++) {
            struct client *c = &C[(pick + k) % NCLIENTS];

            if (c->fd >= 0 && (!want_holder || c->working)) {
                client_drop(c, false);
                cnt.disconnects++;
                break;
            }
        }
        *next_disconnect = t + US(h_rng_range(1000, 2500));
    }
    cuts_tick(t, next_cut);
}

static bool faults_over(void)
{
    for (int i = 0; i < nfaults; i++) {
        if (faults[i].until >= 0)
            return false;
    }
    return true;
}

/* ---- the end: keys ------------------------------------------------------ */

/* The resources of this run: the tagged sessions' too when it has some. */
static int run_nres(void)
{
    return rc->ntagged > 0 ? NRES_ALL : NRES;
}

/*
 * After every client is done, each lock key must vanish from every node
 * within ttl (plus slack) of the last holder of its resource.
 */
static void keys_check(void)
{
    redisContext *ctx[NNODES];
    bool gone[NDAEMONS][NRES_ALL][NNODES];
    int64_t last_seen[NDAEMONS][NRES_ALL][NNODES];
    int nprefix = strcmp(rc->prefix[0], rc->prefix[1]) == 0 ? 1 : NDAEMONS;
    int nres = run_nres();
    int64_t until = 0;
    bool all_gone = false;

    for (int i = 0; i < NNODES; i++)
        ctx[i] = h_redis_connect(&N[i]);
    memset(gone, 0, sizeof(gone));
    for (int r = 0; r < nres; r++) {
        int64_t u = touch[r] + US(TTL_MS + KEY_SLACK_MS);

        if (u > until)
            until = u;
        for (int k = 0; k < NDAEMONS; k++) {
            for (int i = 0; i < NNODES; i++)
                last_seen[k][r][i] = -1;
        }
    }
    while (!all_gone) {
        int64_t now = h_now_us();

        all_gone = true;
        for (int k = 0; k < nprefix; k++) {
            for (int r = 0; r < nres; r++) {
                char name[RES_NAME_MAX];

                res_name(name, r);
                for (int i = 0; i < NNODES; i++) {
                    redisReply *rep;

                    if (gone[k][r][i])
                        continue;
                    /* The lock, its readers' set and the semaphore's
                     * slots. */
                    rep = redisCommand(ctx[i], "EXISTS %s%s %s%s:shared "
                                       "%s%s#0 %s%s#1 %s%s#2", rc->prefix[k],
                                       name, rc->prefix[k], name,
                                       rc->prefix[k], name, rc->prefix[k],
                                       name, rc->prefix[k], name);
                    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_INTEGER,
                                  "EXISTS on node %d: %s", i,
                                  rep == NULL ? ctx[i]->errstr : "not an integer");
                    if (rep->integer == 0)
                        gone[k][r][i] = true;
                    else
                        last_seen[k][r][i] = now;
                    all_gone = all_gone && gone[k][r][i];
                    freeReplyObject(rep);
                }
            }
        }
        if (now > until)
            break;
        if (!all_gone)
            h_sleep_ms(20);
    }
    for (int k = 0; k < nprefix; k++) {
        for (int r = 0; r < nres; r++) {
            char name[RES_NAME_MAX];

            res_name(name, r);
            for (int i = 0; i < NNODES; i++) {
                long long outlived;

                if (last_seen[k][r][i] < 0)
                    continue;
                outlived = (long long)(last_seen[k][r][i] - touch[r]) / 1000;
                if (outlived > cnt.key_outlived_ms)
                    cnt.key_outlived_ms = outlived;
                if (!gone[k][r][i] ||
                    last_seen[k][r][i] > touch[r] + US(TTL_MS + KEY_SLACK_MS)) {
                    cnt.key_violations++;
                    fprintf(stderr, "mutex: key %s%s still on node %d "
                            "%lld ms after its last holder (ttl %d)\n",
                            rc->prefix[k], name, i, outlived, TTL_MS);
                }
            }
        }
    }
    for (int i = 0; i < NNODES; i++)
        redisFree(ctx[i]);
}

/* ---- one run ------------------------------------------------------------ */

static void run_init(const struct run_conf *conf)
{
    rc = conf;
    memset(&cnt, 0, sizeof(cnt));
    memset(touch, 0, sizeof(touch));
    memset(d_stopped, 0, sizeof(d_stopped));
    memset(d_crashed, 0, sizeof(d_crashed));
    unexpected_msg[0] = '\0';
    stopping = false;
    nfaults = 0;
    mc_log_init(&ivlog);
    h_cluster_nodes(&K, NNODES, "--appendonly yes --appendfsync always");
    for (int i = 0; i < NDAEMONS; i++) {
        daemon_start(i);
        h_wait_voting(&D[i], NNODES, h_scale(5000));
    }
    for (int i = 0; i < NCLIENTS; i++) {
        struct client *c = &C[i];

        c->id = i;
        c->fd = -1;
        c->daemon = i % NDAEMONS;
        c->patient = h_rng_range(0, 1) == 0;
        c->req = REQ_NONE;
        c->res = -1;
        c->held = c->working = false;
        c->shared = false;
        c->slot = -1;
        c->next_at = 0;
        c->rounds = 0;
    }
    for (int i = 0; i < NPLAIN; i++) {
        memset(&P[i], 0, sizeof(P[i]));
        P[i].id = i;
    }
    for (int i = 0; i < NTAGGED; i++)
        tagged_init(&TS[i], i);
    memset(RN, 0, sizeof(RN));
    for (int i = 0; i < NRUNNERS; i++)
        RN[i].id = i;
    /* A redlockctl SIGKILLed by the schedule leaves its keeper to us. */
    if (conf->nrunners > 0)
        ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    if (conf->faults)
        faults_plan();
}

static bool plain_rounds_done(void)
{
    return cnt.plain_rounds >= rc->plain_rounds * rc->nplain;
}

/* Every client's next step (a plain client's may block on a stopped
 * node: the later ones look at the clock again); true while any has
 * something left to finish. */
static bool clients_tick(int64_t now)
{
    bool busy = false;

    for (int i = 0; i < NCLIENTS; i++) {
        client_tick(&C[i], now);
        busy = busy || client_busy(&C[i]);
    }
    for (int i = 0; i < rc->nplain; i++) {
        plain_tick(&P[i], h_now_us());
        busy = busy || P[i].holding;
    }
    for (int i = 0; i < rc->ntagged; i++) {
        tagged_tick(&TS[i], h_now_us());
        busy = busy || tagged_busy(&TS[i]);
    }
    if (rc->ntagged > 0)
        tagged_peaks();
    for (int i = 0; i < rc->nrunners; i++) {
        runner_tick(&RN[i], h_now_us());
        busy = busy || runner_busy(&RN[i]);
    }
    return busy;
}

/* Up to 5 ms for replies to the clients and tagged sessions; read them. */
static void clients_poll(void)
{
    struct pollfd pfd[NCLIENTS + NTAGGED];
    int map[NCLIENTS + NTAGGED], n = 0;

    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].fd >= 0) {
            pfd[n].fd = C[i].fd;
            pfd[n].events = POLLIN;
            map[n++] = i;
        }
    }
    for (int i = 0; i < rc->ntagged; i++) {
        if (TS[i].fd >= 0) {
            pfd[n].fd = TS[i].fd;
            pfd[n].events = POLLIN;
            map[n++] = NCLIENTS + i;
        }
    }
    if (poll(pfd, (nfds_t)n, 5) <= 0)
        return;
    for (int k = 0; k < n; k++) {
        if (pfd[k].revents == 0)
            continue;
        if (map[k] < NCLIENTS && C[map[k]].fd >= 0)
            client_read(&C[map[k]]);
        else if (map[k] >= NCLIENTS && TS[map[k] - NCLIENTS].fd >= 0)
            tagged_read(&TS[map[k] - NCLIENTS]);
    }
}

/* Clients, plain clients, tagged sessions, redlockctl runs and faults
 * until the rounds are done, the schedule has run and the run is long
 * enough; then let every holder finish, and close everything. */
static void run_drive(void)
{
    int64_t next_disconnect = US(1500), next_cut = US(2500), next_watch = 0;
    int64_t drain_until = 0;

    t_run = h_now_us();
    for (;;) {
        int64_t now = h_now_us(), t = now - t_run;
        bool busy;

        if (now >= next_watch) {
            daemon_watch();
            next_watch = now + US(250);
        }
        if (rc->faults)
            faults_tick(now, &next_disconnect, &next_cut);
        if (!stopping && ((rounds_done() && plain_rounds_done() && faults_over() &&
                           t >= US(rc->min_ms) &&
                           (!rc->faults || t >= faults_end() + US(5000))) ||
                          t >= US(rc->cap_ms))) {
            stopping = true;
            drain_until = now + US(DRAIN_MS);
            ck_assert_msg(faults_over(), "the run cap came before the faults ended");
        }
        busy = clients_tick(now);
        if (stopping && (!busy || now >= drain_until))
            break;
        clients_poll();
    }
    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].fd >= 0)
            client_drop(&C[i], false);
    }
    for (int i = 0; i < rc->nplain; i++)
        plain_close(&P[i]);
    for (int i = 0; i < rc->ntagged; i++) {
        if (TS[i].fd >= 0)
            tagged_drop(&TS[i], false);
    }
    for (int i = 0; i < rc->nrunners; i++)
        runner_stop(&RN[i]);
    runs_collect();
}

struct run_result {
    struct mc_report rep;
    int exit_status[NDAEMONS];
    double seconds;
};

/* The summary of the tagged sessions and redlockctl runs, when the run
 * had them ("" otherwise). */
static void summary_extra(char *buf, size_t size)
{
    int n = 0;

    buf[0] = '\0';
    if (rc->ntagged > 0)
        n = snprintf(buf, size, " tagged: sessions=%d lanes=%d rounds=%d "
                     "grants=%d refused=%d lost=%d expired=%d late=%d drops=%d "
                     "(cut %d) held at once <= %d (with waits %d)", rc->ntagged,
                     rc->ntagged * TAG_LANES, cnt.tag_rounds, cnt.tag_grants,
                     cnt.tag_refused, cnt.tag_lost, cnt.tag_expired,
                     cnt.tag_late, cnt.tag_drops, cnt.tag_cuts,
                     cnt.tag_peak_held, cnt.tag_peak_out);
    if (rc->nrunners > 0 && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " redlockctl run: runs=%d "
                 "worked=%d (stamps %d) exit 0=%d busy=%d lost=%d unavailable=%d "
                 "SIGKILLed=%d stopped=%d", cnt.runs, cnt.run_worked,
                 cnt.run_stamps, cnt.run_ok, cnt.run_busy, cnt.run_lost,
                 cnt.run_failed, cnt.run_cuts, cnt.run_stopped);
}

static void run_finish(uint64_t seed, struct run_result *res)
{
    char extra[512];
    int64_t t_end;

    /* No fault outlives the run (the cap assertion covers it), but a
     * daemon SIGCONT is cheap insurance for the key check. */
    for (int i = 0; i < NDAEMONS; i++) {
        if (d_stopped[i] && D[i].pid != 0)
            kill(D[i].pid, SIGCONT);
    }
    keys_check();
    daemon_watch();
    for (int i = 0; i < NDAEMONS; i++)
        res->exit_status[i] = h_daemon_finish(&D[i]);
    t_end = h_now_us();
    res->seconds = (double)(t_end - t_run) / 1e6;
    ck_assert_int_eq(mc_check(&ivlog, &res->rep), 0);
    summary_extra(extra, sizeof(extra));
    fprintf(stderr,
            "mutex[%s]: seed=%" PRIu64 " rounds=%d grants=%d (redlockd %d: d0 %d, "
            "d1 %d; plain %d of %d rounds) intervals=%zu late=%d lost=%d "
            "expired=%d refused=%d drops=%d faults: node-stop=%d node-kill=%d "
            "daemon-kill=%d daemon-stop=%d daemon-restart=%d disconnects=%d "
            "adopts=%d (failed %d, cut %d) violations: "
            "overlap=%zu fence=%zu key=%d (keys outlived holders by <= %lld ms) "
            "crashed=%d exit=%d/%d unexpected=%d time=%.1f s "
            "(exclusive/shared/slot grants %d/%d/%d)%s\n",
            rc->name, seed, cnt.rounds, cnt.grants + cnt.plain_grants, cnt.grants,
            cnt.grants_on[0], cnt.grants_on[1], cnt.plain_grants, cnt.plain_rounds,
            res->rep.intervals, cnt.late, cnt.lost, cnt.expired, cnt.refused,
            cnt.dropped, cnt.faults[F_NODE_STOP], cnt.faults[F_NODE_KILL],
            cnt.faults[F_DAEMON_KILL], cnt.faults[F_DAEMON_STOP],
            cnt.faults[F_DAEMON_RESTART], cnt.disconnects, cnt.adopts,
            cnt.adopts_failed, cnt.adopts_cut,
            res->rep.overlaps, res->rep.fence_violations, cnt.key_violations,
            cnt.key_outlived_ms, cnt.crashed, res->exit_status[0],
            res->exit_status[1], cnt.unexpected, res->seconds, cnt.modes[0],
            cnt.modes[1], cnt.modes[2], extra);
    if (res->rep.msg[0] != '\0')
        fprintf(stderr, "mutex[%s]: seed=%" PRIu64 " violations:\n%s", rc->name,
                seed, res->rep.msg);
    if (unexpected_msg[0] != '\0')
        fprintf(stderr, "mutex[%s]: unexpected replies:\n%s", rc->name,
                unexpected_msg);
    mc_log_deinit(&ivlog);
}

static void teardown(void)
{
    for (int i = 0; i < NCLIENTS; i++) {
        if (C[i].fd >= 0)
            close(C[i].fd);
        C[i].fd = -1;
    }
    for (int i = 0; i < NTAGGED; i++) {
        if (TS[i].fd >= 0)
            close(TS[i].fd);
        TS[i].fd = -1;
    }
    for (int i = 0; i < NRUNNERS; i++)
        runner_stop(&RN[i]);
    for (int i = 0; i < NPLAIN; i++)
        plain_close(&P[i]);
}

/* ---- the tests ---------------------------------------------------------- */

static const struct run_conf mutex_conf = {
    .name = "faults",
    .min_ms = 60000,
    .cap_ms = 120000,
    .rounds = 40,
    .plain_rounds = 150,
    .nplain = NPLAIN,
    .faults = true,
    .fault_cycles = FAULT_CYCLES,
    .ntagged = NTAGGED,
    .nrunners = NRUNNERS,
    .daemon_json = {
        "{\"redis\":{\"command_timeout_ms\":100,\"reconnect_max_ms\":250}}",
        "{\"redis\":{\"command_timeout_ms\":100,\"reconnect_max_ms\":250}}",
    },
    .prefix = { "lock:", "lock:" },
};

/* One run of conf, and what must hold after it. */
static void run_checked(const struct run_conf *conf)
{
    struct run_result res;
    uint64_t seed = h_seed("REDLOCKD_MUTEX_SEED");

    fprintf(stderr, "mutex[%s]: seed=%" PRIu64 " (set REDLOCKD_MUTEX_SEED to "
            "replay its schedule)\n", conf->name, seed);
    run_init(conf);
    run_drive();
    run_finish(seed, &res);
    ck_assert_msg(res.rep.overlaps == 0, "seed %" PRIu64 ": %zu overlapping "
                  "intervals:\n%s", seed, res.rep.overlaps, res.rep.msg);
    ck_assert_msg(res.rep.fence_violations == 0, "seed %" PRIu64 ": %zu fences "
                  "not above the previous holder's:\n%s", seed,
                  res.rep.fence_violations, res.rep.msg);
    ck_assert_msg(cnt.key_violations == 0, "seed %" PRIu64 ": %d keys outlived "
                  "their last holder by more than the ttl", seed,
                  cnt.key_violations);
    ck_assert_msg(cnt.crashed == 0 && res.exit_status[0] == 0 &&
                  res.exit_status[1] == 0, "seed %" PRIu64 ": a daemon died "
                  "(%d during the run) or did not exit 0 on SIGTERM (%d, %d)",
                  seed, cnt.crashed, res.exit_status[0], res.exit_status[1]);
    ck_assert_msg(cnt.unexpected == 0, "seed %" PRIu64 ": unexpected replies:\n%s",
                  seed, unexpected_msg);
    ck_assert_msg(res.rep.intervals > 0, "no holder ever worked");
    if (conf->faults && !conf->kinds)
        ck_assert_msg(cnt.adopts + cnt.adopts_failed + cnt.adopts_cut > 0,
                      "seed %" PRIu64
                      ": no holder cut off from its daemon tried ADOPT",
                      seed);
    /* Every lane granted a few times over, and workers that wrote: the
     * new clients did run. */
    if (conf->ntagged > 0)
        ck_assert_msg(cnt.tag_grants > conf->ntagged * TAG_LANES,
                      "seed %" PRIu64 ": %d grants to %d tagged lanes", seed,
                      cnt.tag_grants, conf->ntagged * TAG_LANES);
    if (conf->nrunners > 0)
        ck_assert_msg(cnt.run_worked > 0, "seed %" PRIu64 ": no redlockctl "
                      "run's worker wrote (%d runs)", seed, cnt.runs);
    if (conf->kinds)
        ck_assert_msg(cnt.modes[0] > 0 && cnt.modes[1] > 0 && cnt.modes[2] > 0,
                      "seed %" PRIu64 ": a kind was never granted (%d/%d/%d)",
                      seed, cnt.modes[0], cnt.modes[1], cnt.modes[2]);
}

START_TEST(mutex_under_faults)
{
    run_checked(&mutex_conf);
}
END_TEST

/* The same load with lock kinds, and one cycle of faults. */
static const struct run_conf kinds_conf = {
    .name = "kinds",
    .min_ms = 25000,
    .cap_ms = 100000,
    .rounds = 25,
    .plain_rounds = 100,
    .nplain = NPLAIN,
    .faults = true,
    .fault_cycles = 1,
    .kinds = true,
    .daemon_json = {
        "{\"id\":\"d0\",\"redis\":{\"command_timeout_ms\":100,"
        "\"reconnect_max_ms\":250}}",
        "{\"id\":\"d1\",\"redis\":{\"command_timeout_ms\":100,"
        "\"reconnect_max_ms\":250}}",
    },
    .prefix = { "lock:", "lock:" },
};

START_TEST(kinds_under_faults)
{
    run_checked(&kinds_conf);
}
END_TEST

/* The checker must see what is wrong: daemons with different key prefixes
 * each grant every resource on their own. */
static const struct run_conf broken_conf = {
    .name = "broken",
    .min_ms = 15000,
    .cap_ms = 15000,
    .rounds = 5,
    .plain_rounds = 0,
    .nplain = 0,
    .faults = false,
    .daemon_json = {
        "{\"locks\":{\"key_prefix\":\"a:\"}}",
        "{\"locks\":{\"key_prefix\":\"b:\"}}",
    },
    .prefix = { "a:", "b:" },
};

START_TEST(checker_sees_split_prefixes)
{
    struct run_result res;
    uint64_t seed = h_seed("REDLOCKD_MUTEX_SEED");

    fprintf(stderr, "mutex[broken]: seed=%" PRIu64 "\n", seed);
    run_init(&broken_conf);
    run_drive();
    run_finish(seed, &res);
    ck_assert_msg(res.rep.overlaps > 0, "seed %" PRIu64 ": two daemons that do not "
                  "see each other's keys, and the checker found no overlap in %zu "
                  "intervals", seed, res.rep.intervals);
    ck_assert_msg(cnt.crashed == 0 && res.exit_status[0] == 0 &&
                  res.exit_status[1] == 0, "a daemon died or did not exit 0");
}
END_TEST

static Suite *mutex_suite(void)
{
    Suite *s = suite_create("mutex");
    TCase *tc = tcase_create("mutex");

    h_cluster_fixture(tc, &K, 0, false);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 280);
    tcase_add_test(tc, mutex_under_faults);
    tcase_add_test(tc, kinds_under_faults);
    tcase_add_test(tc, checker_sees_split_prefixes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(mutex_suite());
}
