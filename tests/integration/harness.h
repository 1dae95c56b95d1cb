/*
 * harness: test support for integration and fault tests.
 *
 * Starts real redis-server processes and the real redlockd binary on free
 * loopback ports, each in its own temporary directory, and talks to the
 * daemon over TCP or its unix socket with plain line I/O. Never a mock.
 *
 * Every function aborts the test (ck_abort_msg / fail) on a setup error, so
 * callers do not check returns unless noted.
 */
#ifndef REDLOCKD_TEST_HARNESS_H
#define REDLOCKD_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#define H_MAX_NODES 7

struct h_redis {
    pid_t pid;              /* 0 when not running */
    int port;
    char dir[256];          /* its data directory (persistent across restart) */
    char extra[256];        /* extra redis-server args it was started with */
};

/* Start redis-server on a free 127.0.0.1 port; `extra` is appended to the
 * command line (e.g. "--appendonly yes --appendfsync always") or NULL.
 * Waits until it answers PING. */
void h_redis_start(struct h_redis *r, const char *extra);
/* Start again on the same port and dir (after stop or kill). */
void h_redis_restart(struct h_redis *r);
void h_redis_stop(struct h_redis *r);       /* SIGTERM, wait; keeps dir */
void h_redis_kill(struct h_redis *r);       /* SIGKILL, wait */
void h_redis_pause(struct h_redis *r);      /* SIGSTOP */
void h_redis_resume(struct h_redis *r);     /* SIGCONT */
void h_redis_cleanup(struct h_redis *r);    /* stop if running, rm -rf dir */
/* A synchronous hiredis connection (1 s timeout) for inspecting keys. */
redisContext *h_redis_connect(const struct h_redis *r);
/* Convenience: run a command (printf-style like redisCommand) and return the
 * reply's integer, or -2 for nil, -3 for error; string replies are returned
 * through *str (malloc'd) when str != NULL. */
long long h_redis_cmd(const struct h_redis *r, char **str, const char *fmt, ...);

struct h_daemon {
    pid_t pid;
    int port;               /* TCP listen port on 127.0.0.1 */
    char dir[256];          /* temp dir: config, unix socket, log */
    char conf_path[300];
    char sock_path[300];    /* unix socket path (listen "unix:...") */
    char log_path[300];     /* the daemon's stderr goes here */
    int tls_port;           /* tls://127.0.0.1 listen port; 0: none */
};

/*
 * Write a config listening on tcp://127.0.0.1:<free port> and
 * unix:<dir>/redlockd.sock, with redis.nodes = the given nodes, log level
 * debug, and then merge `extra_json` (a JSON object text, may be NULL) over
 * it recursively, e.g. "{\"limits\":{\"max_clients\":5}}". Start redlockd
 * -c <conf> and wait until the TCP port accepts connections (5 s max).
 * If the environment variable REDLOCKD_TEST_WRAPPER is set (for example
 * "valgrind --leak-check=full --error-exitcode=99 --errors-for-leak-kinds=definite"),
 * the daemon runs under it (and the start wait is 30 s).
 * REDLOCKD_BIN names the binary (set by meson).
 */
void h_daemon_start(struct h_daemon *d, struct h_redis *nodes, int nnodes,
                    const char *extra_json);
/* With "tls":{"cert_file":...} in extra_json and no tls:// address of its
 * own in "listen", the config also listens on tls://127.0.0.1:<free port>,
 * which d->tls_port says. */
/* The same with the node ports given directly (127.0.0.1:ports[i]), so a
 * test can point the daemon at fault proxies while it talks to the Redis
 * nodes behind them itself. */
void h_daemon_start_ports(struct h_daemon *d, const int *ports, int nports,
                          const char *extra_json);
/* SIGTERM and wait (10 s, then SIGKILL and fail); returns the exit status
 * (WEXITSTATUS, or 128+signal). Tests assert it is 0 (which under the
 * valgrind wrapper also means no leaks). */
int h_daemon_stop(struct h_daemon *d);
/* Start a stopped daemon again with the same config, port and directory
 * (its log goes on), as a service manager's restart does. */
void h_daemon_restart(struct h_daemon *d);
/* Wait for a daemon already told to stop to exit (timeout_ms, stretched
 * under the wrapper; then SIGKILL and fail), without signalling it again:
 * a second SIGTERM that lands after its handlers are closed kills it.
 * Returns the exit status as h_daemon_stop. */
int h_daemon_wait(struct h_daemon *d, int timeout_ms);
void h_daemon_kill(struct h_daemon *d);     /* SIGKILL, wait */
void h_daemon_cleanup(struct h_daemon *d);  /* kill if running, rm -rf dir */
/* The daemon's log so far (its first MiB; a static buffer, overwritten by
 * the next call). */
const char *h_daemon_log(const struct h_daemon *d);
/* Poll the daemon's log until it mentions needle: true, or false after
 * timeout_ms (the caller's bound, already stretched as its file stretches
 * them). */
bool h_log_waits_for(const struct h_daemon *d, const char *needle,
                     int timeout_ms);
/* Print the daemon log to stderr (call on failure paths to help debugging). */
void h_daemon_dump_log(const struct h_daemon *d);

/*
 * A fault proxy (tests/tools/faultproxy.c) in front of one node: it listens
 * on a 127.0.0.1 port the kernel picks and forwards to 127.0.0.1:target,
 * delaying, blackholing or resetting on command. Commands and their
 * meaning are in the top comment of faultproxy.c. REDLOCKD_FAULTPROXY_BIN
 * names the binary (set by meson).
 */
struct h_proxy {
    pid_t pid;              /* 0 when not running */
    int port;               /* where it listens; point the daemon here */
    int target;             /* the port it forwards to */
    char dir[256];          /* temp dir: control socket, log */
    char ctl[300];          /* its control socket (unix) */
    char log_path[300];     /* its stdout and stderr */
};

/* Start a proxy to 127.0.0.1:target_port and wait until it is ready. It
 * outlives restarts of the node behind it (connections made while the node
 * is down are reset); a stopped proxy is not restarted, its port would
 * change. */
void h_proxy_start(struct h_proxy *p, int target_port);
/* Send one control command (printf-style, no newline) and assert the
 * reply starts with "OK"; returns it (a static buffer, overwritten by the
 * next call). */
char *h_proxy_ctl(struct h_proxy *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same without the assertion: the reply, "OK ..." or "ERR ...". */
char *h_proxy_try(struct h_proxy *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* SIGTERM and wait (5 s, then SIGKILL and fail); returns the exit status
 * (WEXITSTATUS, or 128+signal): 0 for a clean stop. */
int h_proxy_stop(struct h_proxy *p);
void h_proxy_cleanup(struct h_proxy *p);    /* kill if running, rm -rf dir */
void h_proxy_dump_log(const struct h_proxy *p);
/* ps[i] in front of nodes[i], for i in [0, n). */
void h_proxy_start_all(struct h_proxy *ps, const struct h_redis *nodes, int n);
void h_proxy_cleanup_all(struct h_proxy *ps, int n);
/* The proxy binary (REDLOCKD_FAULTPROXY_BIN); aborts when unset. */
const char *h_proxy_bin(void);

struct h_client {
    int fd;
    char buf[65536];        /* bytes read, not yet returned as lines */
    size_t len;
    char line[65536];       /* the last line returned */
    char events[16384];     /* EVENT lines seen by h_cmd, LF-separated */
    size_t events_len;
};

/* Connect; return 0 or -errno (does not abort: connection limits are tested). */
int h_connect_tcp(struct h_client *c, int port);
int h_connect_unix(struct h_client *c, const char *path);
void h_close(struct h_client *c);           /* close(fd) without QUIT */
/* Close with a reset (SO_LINGER 0): the daemon's next read fails at once,
 * where after h_close it would still answer what it had read. */
void h_reset(struct h_client *c);
/* shutdown(SHUT_WR): the daemon sees EOF while replies can still arrive
 * (what `nc -q1` and `nc -N` do after the last line). */
void h_shutdown_write(struct h_client *c);
void h_send(struct h_client *c, const char *data, size_t len);
void h_sendf(struct h_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Read one line (without LF) into a static-per-client buffer; returns NULL on
 * EOF or if nothing arrived within timeout_ms. */
char *h_recv_line(struct h_client *c, int timeout_ms);
/* Send "line\n" and return the next line that is not an EVENT (5 s timeout;
 * fails the test on timeout/EOF). EVENT lines seen meanwhile are appended to
 * c->events (newline separated) for h_expect_event. */
char *h_cmd(struct h_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* True if the peer closed the connection within timeout_ms (reads and
 * discards data meanwhile). */
bool h_wait_eof(struct h_client *c, int timeout_ms);
/* Wait up to timeout_ms for an EVENT line starting with `prefix`
 * (e.g. "EVENT LOST resource=x"); returns it or NULL. */
char *h_expect_event(struct h_client *c, const char *prefix, int timeout_ms);

/* Helpers for assertions on "OK k=v ..." lines: value of key or NULL
 * (returned in a static buffer). */
const char *h_kv(const char *line, const char *key);
bool h_starts(const char *line, const char *prefix);
/* Does a lock key's value belong to token: the token, or the token and the
 * holder label redlockd stores after it ("token label fence")? */
bool h_holds_token(const char *value, const char *token);

/* The throwaway PKI of tests/tools/mkcerts.sh (found through
 * REDLOCKD_SRCDIR), for the TLS tests: made once per test program, from
 * main before the tests fork, so a failure prints why and exits 1 rather
 * than asserting. h_cert gives <dir>/<name> in one of 8 static buffers
 * used in turn; h_certs_dir the directory; h_certs_remove deletes it at
 * the end of main. */
void h_certs_make(void);
const char *h_certs_dir(void);
const char *h_cert(const char *name);
void h_certs_remove(void);

/* The redlockd binary (REDLOCKD_BIN); aborts when unset. */
const char *h_daemon_bin(void);
/* Run argv (no wrapper) to completion with stdout and stderr captured
 * together into out (NUL-terminated, truncated to outsize - 1); returns the
 * exit status (WEXITSTATUS, or 128+signal). */
int h_run(char *const argv[], char *out, size_t outsize);
/* Raise the soft RLIMIT_NOFILE to at least `want` (aborts if the hard
 * limit is lower). Daemons started afterwards inherit it. */
void h_raise_nofile(int want);

/* A seed for h_rng_next: the number in the environment variable `env`
 * (decimal or 0x hex; asserted to be one) when set, else random; the
 * test prints it so that a failed run can be repeated. */
uint64_t h_seed(const char *env);
/* splitmix64 from h_seed's seed: small, good enough, and the same on
 * every platform. */
uint64_t h_rng_next(void);
/* Uniform in [lo, hi]. */
int h_rng_range(int lo, int hi);

uint64_t h_now_ms(void);                    /* CLOCK_MONOTONIC */
int64_t h_now_us(void);                     /* the same, in microseconds */
void h_sleep_ms(int ms);
int h_free_port(void);
/* A loopback port that refuses connections for as long as the returned
 * socket stays open (the caller closes it): bound, never listening, so no
 * other test running in parallel can start a server on it meanwhile
 * (h_free_port can not promise that). */
int h_refusing_port(int *port);

/*
 * Shared by the test programs: what several of them would otherwise each
 * define. All fail the test (ck_assert) where they say "assert".
 */

/* Milliseconds since t0 (an h_now_ms value). */
long long h_since(uint64_t t0);
/* True when the daemon runs under REDLOCKD_TEST_WRAPPER (valgrind), which
 * makes it many times slower. Files with their own multiplier build on it. */
bool h_slow(void);
/* An upper time bound stretched 5x under the wrapper (the harness's own
 * waits use it too). Lower bounds, how long something must wait, are
 * never to be stretched. */
int h_scale(int ms);

/* h_redis_start (with the same `extra`), h_redis_resume and
 * h_redis_cleanup of nodes[0..n). */
void h_redis_start_all(struct h_redis *nodes, int n, const char *extra);
void h_redis_resume_all(struct h_redis *nodes, int n);
void h_redis_cleanup_all(struct h_redis *nodes, int n);
/* Connect over TCP to 127.0.0.1:port and assert it worked. */
void h_connect_tcp_ok(struct h_client *c, int port);
/* Connect to the unix socket at path and assert it worked. */
void h_connect_unix_ok(struct h_client *c, const char *path);
/* h_connect_tcp_ok, then PING until answered PONG: a connection closed
 * just before (a readiness probe, the test's own) may still count against
 * the daemon's limits for a moment, and a refused connection is retried
 * for up to 3 s. */
void h_connect_counted(struct h_client *c, int port);
/* The end of a test: SIGTERM a running daemon (h_daemon_stop) and print its
 * log when it did not exit 0, so the failure that follows has its clue.
 * Returns the exit status, 0 when it was not running. */
int h_daemon_finish(struct h_daemon *d);
/* h_daemon_finish, asserting exit status 0 (under valgrind: no leaks). */
void h_daemon_finish_ok(struct h_daemon *d);

/* Send a printf-formatted request (h_cmd) and assert the reply starts with
 * `prefix`; returns the reply (h_cmd's buffer). */
char *h_expect(struct h_client *c, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Send a request, assert an "OK {...}" reply and return its JSON object;
 * the caller decrefs. */
json_t *h_ok_json(struct h_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* obj[key], asserted to be an integer. */
json_int_t h_json_int(const json_t *obj, const char *key);
/* obj[key], asserted to be a string (owned by obj). */
const char *h_json_str(const json_t *obj, const char *key);
/* One top-level integer of STATS. */
json_int_t h_stats_int(struct h_client *c, const char *key);
/* A copy of key=value of a reply line (h_kv's buffer is overwritten by
 * the next call), asserted to be there. */
void h_kv_copy(const char *line, const char *key, char *out, size_t size);

/* Poll STATS until nodes_voting is nnodes, for up to timeout_ms (the
 * caller's bound, already stretched as that file stretches them). A daemon
 * listens before its Redis connections are up; a LOCK then waits for a
 * quorum (at most connect_timeout_ms), but a test about every node (STATS,
 * STATUS, fences on each) must not start before all of them vote. */
void h_wait_voting(const struct h_daemon *d, int nnodes, int timeout_ms);

#define H_MAX_WAIT_CLIENTS 16
/* Wait until one of cs[0..n) (n <= H_MAX_WAIT_CLIENTS) has a complete line;
 * returns its index with the line in *line, or -1 after timeout_ms (not
 * stretched). Asserts a ready client delivers a whole line. */
int h_wait_any_line(struct h_client **cs, int n, long long timeout_ms,
                    char **line);

/*
 * A test cluster: Redis nodes, redlockd daemons over all of them, fault
 * proxies in front of nodes where a test wants them, and raw protocol
 * clients, what every integration test would otherwise declare and start,
 * stop and clean up by hand. Keep one static (clients are large), made
 * the test case's fixture with h_cluster_fixture (or zeroed or
 * h_cluster_init'ed by hand); tests address its members directly
 * (k->nodes[i], k->daemons[d], k->clients[i], k->proxies[p]).
 */
#define H_CLUSTER_DAEMONS 2
#define H_CLUSTER_CLIENTS 8

struct h_cluster {
    struct h_redis nodes[H_MAX_NODES];
    int nnodes;             /* nodes started (the daemons use them all) */
    struct h_daemon daemons[H_CLUSTER_DAEMONS];
    struct h_client clients[H_CLUSTER_CLIENTS];
    /* Fault proxies (h_cluster_proxy), and which of them each daemon
     * reaches each node through (h_cluster_route): proxies[via[d][i] - 1],
     * 0 for the node itself. */
    struct h_proxy proxies[H_MAX_NODES];
    int via[H_CLUSTER_DAEMONS][H_MAX_NODES];
};

/* Zero it, with every client marked closed. */
void h_cluster_init(struct h_cluster *k);
/* Start nodes[0..n) with h_redis_start(extra) and set nnodes. */
void h_cluster_nodes(struct h_cluster *k, int n, const char *extra);
/* The same with redis-server options for node 0 only (persistence, a
 * memory policy), the others plain. */
void h_cluster_nodes_first(struct h_cluster *k, int n, const char *extra0);
/* Start proxies[p] in front of nodes[node] (h_proxy_start); returns it. */
struct h_proxy *h_cluster_proxy(struct h_cluster *k, int p, int node);
/* A proxy in front of every node (proxies[i] before nodes[i]), and
 * daemons[d] routed through them all. */
void h_cluster_proxy_all(struct h_cluster *k, int d);
/* Daemons[d], when started after this, reach nodes[node] through
 * proxies[p] (its port in the config) instead of directly. */
void h_cluster_route(struct h_cluster *k, int d, int node, int p);
/* Start daemons[d] over the nodes (h_daemon_start, or through the proxies
 * h_cluster_route named) without waiting. */
struct h_daemon *h_cluster_daemon_start(struct h_cluster *k, int d,
                                        const char *extra_json);
/* h_cluster_daemon_start, then h_wait_voting for every node within
 * timeout_ms (the caller's bound, already stretched as it stretches). */
struct h_daemon *h_cluster_daemon(struct h_cluster *k, int d,
                                  const char *extra_json, int timeout_ms);
/* The one call: nnodes plain nodes and daemons[0..ndaemons) with the same
 * extra_json, each waited for until every node votes. */
void h_cluster_start(struct h_cluster *k, int nnodes, int ndaemons,
                     const char *extra_json, int timeout_ms);
/* clients[i] connected over TCP to daemons[d] (asserted); returns it. */
struct h_client *h_cluster_client(struct h_cluster *k, int i, int d);
/* The end of a test: h_daemon_finish_ok of every running daemon (exit
 * status 0 asserted: under valgrind, no leaks). */
void h_cluster_stop(struct h_cluster *k);
/* SIGCONT every node and daemon a test may have left stopped (SIGSTOP):
 * a stopped node would hold up a daemon's release at shutdown, and a
 * stopped daemon would not exit on SIGTERM. */
void h_cluster_continue(struct h_cluster *k);
/* For a teardown that checks the exit itself: h_cluster_continue, close
 * the clients, h_daemon_finish each running daemon; returns the first
 * non-zero exit status, 0 when all exited cleanly or none ran. */
int h_cluster_finish(struct h_cluster *k);
/* The teardown: close the clients, continue stopped nodes and daemons,
 * then kill and remove every daemon, proxy and node (h_*_cleanup). Safe
 * to call twice. */
void h_cluster_cleanup(struct h_cluster *k);
/* The teardown of a test that checks the daemons' exit there:
 * h_cluster_finish, h_cluster_cleanup, then assert the exit status was 0
 * (under valgrind: no leaks). */
void h_cluster_teardown(struct h_cluster *k);

/* Make k the checked fixture of tc (one cluster per test program): before
 * each test h_cluster_init and, when nnodes > 0, h_cluster_nodes(nnodes,
 * no extra options); after each test that passed h_cluster_teardown when
 * check_exit (each daemon's exit status 0 asserted), else
 * h_cluster_cleanup (for tests that assert their daemons' exit
 * themselves). */
void h_cluster_fixture(TCase *tc, struct h_cluster *k, int nnodes,
                       bool check_exit);

/* A test program's main: run every test of s (verbosity from CK_VERBOSITY)
 * and return EXIT_SUCCESS when none failed, else EXIT_FAILURE. */
int h_run_suite(Suite *s);

/* Node i as STATS reports it (nodes[i]; voting and recovering asserted to
 * be booleans, restarts an integer). */
struct h_node_view {
    bool up, voting, recovering, aof_always, has_until;
    long long restarts;
    char why[512];          /* its "why", or "(no why)" */
};
struct h_node_view h_stats_node(struct h_client *c, int i);

#endif
