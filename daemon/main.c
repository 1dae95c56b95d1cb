/*
 * redlockd: the lock-service daemon's entry point.
 *
 * Parses the command line, loads the config, and runs one libuv loop with
 * the listeners, the sessions, the lock table and the Redis pool on it.
 * SIGINT/SIGTERM start a clean shutdown: stop listening, tell clients
 * (EVENT SHUTDOWN), wait up to shutdown_timeout_ms for them to release
 * their locks (UNLOCK, QUIT, closing the connection), leave every lease
 * still held on the nodes to expire by its ttl (never deleted under a
 * holder that may still be working), drop the Redis connections, free
 * everything.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>

#include <uv.h>

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "conf.h"
#include "lockmgr.h"
#include "log.h"
#include "metrics.h"
#include "node.h"
#include "peers.h"
#include "pool.h"
#include "redis_uv.h"
#include "redlock.h"
#include "server.h"
#include "session.h"
#include "stats.h"
#include "stats_glue.h"
#include "timer.h"
#include "tls.h"
#include "watch.h"

static struct {
    uv_loop_t loop;
    struct conf conf;
    uv_signal_t sigint, sigterm, sighup;
    uv_signal_t sigusr1;    /* w2-nodes hook, see on_sigusr1 */
    struct timer drain;
    uint64_t drain_deadline;
    int finish_turns;
    size_t left;            /* leases left to expire at exit */
    uint64_t left_until;    /* uv_now ms the last of their keys may live */
    struct timer ready;
    uint64_t ready_deadline;
} app;

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: redlockd [-c FILE] [--check-config] [--version] [--help]\n"
        "\n"
        "A lock service: clients connect over TCP or a unix socket and take\n"
        "leases that redlockd holds with the Redlock algorithm on N Redis\n"
        "nodes, renews while the client is connected, and releases when it\n"
        "disconnects.\n"
        "\n"
        "  -c, --config FILE   configuration file (default %s)\n"
        "  -t, --check-config  validate the configuration and exit\n"
        "  -v, -V, --version   print the version and exit\n"
        "  -h, --help          print this help and exit\n",
        CONF_DEFAULT_PATH);
}

static void notify(const char *state)
{
#ifdef HAVE_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

static void close_walk_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Close the handles main owns (uv_close also stops the signal watchers);
 * the loop then runs out. */
static void close_own_handles(void)
{
    uv_close((uv_handle_t *)&app.sigint, NULL);
    uv_close((uv_handle_t *)&app.sigterm, NULL);
    uv_close((uv_handle_t *)&app.sighup, NULL);
    redis_uv_close();
    server_deinit();
    uv_close((uv_handle_t *)&app.sigusr1, NULL);
    timer_sys_deinit();
}

/* Last phase: the pool is down; operations it failed finish on the next
 * timer turns (some start one more, e.g. giving back a late grant, which
 * fails at once; batched ones wait for their 1 ms flush). When none is
 * left, free the pool and close the rest. */
static void log_exit_line(void);

static void finish_cb(struct timer *t)
{
    if (redlock_live() > 0 && app.finish_turns++ < 100) {
        timer_start(t, 1);
        return;
    }
    node_free();
    log_exit_line();
    close_own_handles();
}

/* The last line the daemon logs: what it left on the nodes. */
static void log_exit_line(void)
{
    char when[TIMER_UTC_SIZE];
    uint64_t now = timer_now();
    uint64_t in = app.left_until > now ? app.left_until - now : 0;

    if (app.left == 0) {
        log_notice("stopped: no lease left on the nodes");
        return;
    }
    timer_fmt_utc(app.left_until, when, sizeof(when));
    log_notice("stopped: %zu lease%s left on the nodes to expire by %s "
               "(neither deleted nor renewed); the last expires by %s (in "
               "%" PRIu64 " ms). Their clients may ADOPT them on another "
               "daemon", app.left, app.left == 1 ? "" : "s",
               app.left == 1 ? "its ttl" : "their ttls", when, in);
}

static void drain_cb(struct timer *t)
{
    (void)t;
    /* Clients release what they hold (UNLOCK, QUIT, closing), sessions
     * answer what they have in flight, and releases keep operations live;
     * give them until the deadline (their own command timeouts bound each
     * one). */
    if (lockmgr_held_count() > 0 || pool_busy() || redlock_live() > 0) {
        if (timer_now() < app.drain_deadline) {
            timer_start(&app.drain, 10);
            return;
        }
        if (redlock_live() > 0)
            log_warn("shutdown_timeout_ms passed with releases in flight; "
                     "their keys will expire by their ttl");
    }
    watch_stop();
    peers_stop();
    app.left = session_abandon_all(&app.left_until);
    session_close_all("shutdown_timeout_ms passed");
    node_shutdown();
    app.drain.cb = finish_cb;
    timer_start(&app.drain, 0);
}

static void daemon_stop(const char *why)
{
    if (session_shutting_down())
        return;
    log_notice("shutting down (%s)", why);
    timer_stop(&app.ready);
    notify("STOPPING=1");
    session_set_shutdown();
    server_stop_listening();
    metrics_stop();
    session_shutdown_all();
    app.drain_deadline = timer_now() + app.conf.shutdown_timeout_ms;
    timer_init(&app.drain, drain_cb, NULL);
    timer_start(&app.drain, 0);
}

/* ---- SIGHUP: reload ------------------------------------------------------ */

struct reload_tally {
    int applied, restart;
};

static void reload_report(void *ud, const char *key, const char *was,
                          const char *now, bool applied)
{
    struct reload_tally *t = ud;

    if (applied)
        t->applied++;
    if (was[0] || now[0])
        log_notice("reload: %s %s -> %s%s", key, was, now,
                   applied ? "" : " (needs a restart; ignored until then)");
    else
        log_notice("reload: %s changed%s", key,
                   applied ? "" : " (needs a restart; ignored until then)");
}

static void warn_log(void *ud, const char *msg)
{
    (void)ud;
    log_warn("%s", msg);
}

static void reload(void)
{
    struct conf fresh;
    struct reload_tally t = { 0, 0 };
    char err[CONF_ERRLEN];

    notify("RELOADING=1");
    if (conf_load(&fresh, app.conf.path, err, sizeof(err)) != 0) {
        log_error("reload rejected: %s; the running configuration stays",
                  err);
        conf_deinit(&fresh);
        notify("READY=1");
        return;
    }
    t.restart = conf_reload(&app.conf, &fresh, reload_report, &t);
    node_reloaded();
    stats_glue_configure(&app.conf);
    /* The certificate is read again even if its path stayed the same:
     * a renewed certificate usually replaces the old file. */
    if (tls_configure(&app.conf, err, sizeof(err)) != 0)
        log_error("reload: %s; new TLS connections keep the certificate "
                  "and key loaded before", err);
    conf_deinit(&fresh);
    log_init((enum log_level)app.conf.log.level);
    log_notice("reloaded %s: %d change(s) applied, %d need a restart",
               app.conf.path, t.applied, t.restart);
    conf_warnings(&app.conf, warn_log, NULL);
    notify("READY=1");
}

static void on_sighup(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    if (!session_shutting_down())
        reload();
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    daemon_stop(signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* An even number of nodes needs a quorum one larger than the odd number
 * below it and tolerates no more of them down: say so, once, at start. */
static void warn_even_nodes(const struct conf *c)
{
    size_t n = c->redis.nnodes, quorum = n / 2 + 1;

    if (n < 2 || n % 2 != 0)
        return;
    log_warn("redis.nodes: %zu nodes need a quorum of %zu and tolerate %zu "
             "of them down, no more than %zu node%s would; %zu tolerate%s "
             "one more", n, quorum, n - quorum, n - 1, n - 1 == 1 ? "" : "s",
             n + 1, n + 1 == 1 ? "s" : "");
}

/* Tell systemd, and lockmgr (which holds back the LOCKs that came
 * before), we are ready once a quorum of nodes votes (or the connect
 * timeout has passed, so a start with nodes down is still visible). */
static void ready_cb(struct timer *t)
{
    (void)t;
    if (session_shutting_down())
        return;
    int voting = node_nvoting();
    int quorum = redlock_nquorum();
    if (voting < quorum && timer_now() < app.ready_deadline) {
        timer_start(&app.ready, 10);
        return;
    }
    if (voting < quorum)
        log_warn("only %d of %d redis nodes reachable (quorum %d): LOCK "
                 "answers ERR UNAVAILABLE until more are up", voting,
                 redlock_nnodes(), quorum);
    log_notice("redlockd %s ready: %d of %d redis node(s) up, quorum %d",
               REDLOCKD_VERSION, voting, redlock_nnodes(), quorum);
    lockmgr_ready();
    notify("READY=1");
}

/* ---- SIGUSR1 ends every node recovery -------------------------------------
 * The same as READMIT for every node (session.c, cmd_readmit), for an
 * operator with a shell on the host but no admin password (and for
 * tests/integration/test_nodes.c). node_end_recovery logs what it did at
 * notice. */
static void on_sigusr1(uv_signal_t *h, int signum)
{
    char msg[1024];
    (void)h;
    (void)signum;
    int n = node_end_recovery("all", msg, sizeof(msg));
    log_notice("SIGUSR1: %s%s", n > 0 ? "" : "nothing to end: ", msg);
}
/* ---- end of the w2-nodes hook ---------------------------------------------- */

static void on_release(const char *key, size_t len)
{
    lockmgr_on_release(key, len);
}

/* The daemons' channel: who is there (peers.c), and what is watched and
 * changed (watch.c). */
static void on_daemon_message(const char *msg, size_t len)
{
    if (!peers_on_message(msg, len))
        watch_on_message(msg, len);
}

/* Stats, and the providers (stats_glue.c) that fill every report from the
 * modules that do not know stats. */
static void stats_start(void)
{
    stats_init();
    if (stats_glue_register(&app.conf) != 0) {
        fprintf(stderr, "redlockd: too many stats providers "
                "(STATS_PROVIDERS_MAX)\n");
        exit(1);
    }
}

static int run(void)
{
    if (uv_loop_init(&app.loop) != 0) {
        fprintf(stderr, "redlockd: cannot create the event loop\n");
        return 1;
    }
    timer_sys_init(&app.loop);
    stats_start();
    redlock_init(&app.conf);
    lockmgr_init(&app.conf, &redlock_ops_default);
    watch_init(&app.conf);
    uv_signal_init(&app.loop, &app.sigint);
    uv_signal_init(&app.loop, &app.sigterm);
    uv_signal_start(&app.sigint, on_signal, SIGINT);
    uv_signal_start(&app.sigterm, on_signal, SIGTERM);
    uv_signal_init(&app.loop, &app.sighup);
    uv_signal_start(&app.sighup, on_sighup, SIGHUP);
    uv_signal_init(&app.loop, &app.sigusr1);
    uv_signal_start(&app.sigusr1, on_sigusr1, SIGUSR1);

    int rc = server_start(&app.loop, &app.conf);
    if (rc == 0 && app.conf.metrics.listen)
        rc = metrics_start(&app.loop, app.conf.metrics.listen);
    if (rc == 0) {
        warn_even_nodes(&app.conf);
        lockmgr_starting();
        node_init(&app.loop, &app.conf, on_release, on_daemon_message);
        peers_init(&app.conf);
        app.ready_deadline = timer_now() + app.conf.redis.connect_timeout_ms;
        timer_init(&app.ready, ready_cb, NULL);
        timer_start(&app.ready, 0);
        uv_run(&app.loop, UV_RUN_DEFAULT);
    } else {
        server_stop_listening();
        metrics_stop();
        close_own_handles();
        uv_run(&app.loop, UV_RUN_DEFAULT);
    }
    /* Anything still open at this point is a bug; close it so the loop
     * can be freed, and say so. */
    if (uv_loop_alive(&app.loop)) {
        log_warn("handles left open at exit; closing them");
        uv_walk(&app.loop, close_walk_cb, NULL);
        uv_run(&app.loop, UV_RUN_DEFAULT);
    }
    watch_deinit();
    lockmgr_deinit();
    stats_glue_deinit();
    redlock_deinit();
    uv_loop_close(&app.loop);
    return rc == 0 ? 0 : 1;
}

static void warn_stderr(void *ud, const char *msg)
{
    (void)ud;
    fprintf(stderr, "redlockd: warning: %s\n", msg);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "check-config", no_argument, NULL, 't' },
        { "version", no_argument, NULL, 'v' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *path = CONF_DEFAULT_PATH;
    bool check = false;
    int ch;

    /* -V too: what redlockctl -V and most daemons take. */
    while ((ch = getopt_long(argc, argv, "c:tvVh", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': path = optarg; break;
        case 't': check = true; break;
        case 'v':
        case 'V': printf("redlockd %s\n", REDLOCKD_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    /* `redlockd --check-config FILE` reads naturally too. */
    if (optind < argc) {
        if (optind + 1 == argc && check) {
            path = argv[optind];
        } else {
            fprintf(stderr, "redlockd: unexpected argument '%s'\n",
                    argv[optind]);
            usage(stderr);
            return 2;
        }
    }

    char err[CONF_ERRLEN];
    if (conf_load(&app.conf, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "redlockd: %s\n", err);
        conf_deinit(&app.conf);
        return 1;
    }
    if (check) {
        conf_warnings(&app.conf, warn_stderr, NULL);
        if (tls_configure(&app.conf, err, sizeof(err)) != 0) {
            fprintf(stderr, "redlockd: %s\n", err);
            conf_deinit(&app.conf);
            return 1;
        }
        tls_cleanup();
        printf("%s: configuration OK (%zu listen address(es), %zu redis "
               "node(s))\n", path, app.conf.nlisten, app.conf.redis.nnodes);
        conf_deinit(&app.conf);
        return 0;
    }
    log_init((enum log_level)app.conf.log.level);
    conf_warnings(&app.conf, warn_log, NULL);
    if (tls_configure(&app.conf, err, sizeof(err)) != 0) {
        log_error("%s", err);
        conf_deinit(&app.conf);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int rc = run();
    tls_cleanup();
    conf_deinit(&app.conf);
    return rc;
}
