/*
 * Unit tests for client/ (libredlockd) without a daemon.
 *
 * Pure parts (server addresses, error names) are checked directly. The
 * request/reply logic is checked through a socketpair: the test plays the
 * daemon on one end, writing canned reply and EVENT lines before the call
 * (the socket buffer holds them) and reading back the request line the
 * library sent, while a handle made by redlockd_open_fd() wraps the other
 * end. Replies too big for the socket buffer come from a forked writer.
 * Failover (reconnect, resume, ADOPT, the detach= fallback) needs handles
 * that connect themselves: a forked daemon on a unix socket of its own
 * plays a script per connection it accepts (t_serve).
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redlockd.h"
#include "redlockd_internal.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TOKEN "0123456789abcdef0123456789abcdef"

/* ---- the fake daemon end ------------------------------------------------ */

struct t_lost_log {
    int calls;
    int disconnects;
    char resource[64];
    unsigned long long fence;
    char reason[32];
    int reentry_rc;         /* what a request from inside the callback got */
    struct redlockd *h;     /* set to try a request from the callback */
};

static void t_on_lost(const char *resource, uint64_t fence, const char *reason,
                      void *ud)
{
    struct t_lost_log *log = ud;

    if (!resource) {
        log->disconnects++;
        return;
    }
    log->calls++;
    snprintf(log->resource, sizeof(log->resource), "%s", resource);
    log->fence = (unsigned long long)fence;
    snprintf(log->reason, sizeof(log->reason), "%s", reason);
    if (log->h)
        log->reentry_rc = redlockd_ping(log->h);
}

/* A handle on one end of a socketpair; *peer is the daemon's end. */
static struct redlockd *t_open(int *peer, const struct redlockd_opts *o)
{
    struct redlockd *h;
    struct redlockd_error err;
    int sv[2];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(redlockd_open_fd(&h, sv[0], o, &err), 0);
    *peer = sv[1];
    return h;
}

/* Closing the peer first lets redlockd_close's QUIT end at once. */
static void t_close(struct redlockd *h, int peer)
{
    close(peer);
    redlockd_close(h);
}

static void t_say(int peer, const char *s)
{
    size_t len = strlen(s);

    ck_assert_int_eq(send(peer, s, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Nothing more to read, though the library may have hung up. */
static void t_expect_nothing(int peer)
{
    struct pollfd p = { peer, POLLIN, 0 };
    char c;

    if (poll(&p, 1, 0) == 1)
        ck_assert_int_eq(recv(peer, &c, 1, MSG_PEEK | MSG_DONTWAIT), 0);
}

/* The library must have sent exactly `want` (and nothing more yet). */
static void t_expect(int peer, const char *want)
{
    char got[4096];
    size_t n = 0, len = strlen(want);
    struct pollfd p = { peer, POLLIN, 0 };
    ssize_t r;

    ck_assert_uint_lt(len, sizeof(got));
    while (n < len) {
        ck_assert_int_eq(poll(&p, 1, 1000), 1);
        r = recv(peer, got + n, len - n, 0);
        ck_assert_int_gt(r, 0);
        n += (size_t)r;
    }
    got[n] = '\0';
    ck_assert_str_eq(got, want);
    t_expect_nothing(peer);
}

/*
 * A daemon that answers in turn, for exchanges of several requests (the
 * library rejects a reply that arrives before its request). steps holds
 * pairs {request line, reply lines}, NULL-terminated. A forked child plays
 * it and reports through a pipe (not its exit status, which valgrind
 * overrides when the child exits holding the parent's allocations).
 */
struct t_daemon {
    pid_t pid;
    int result;     /* read end: one byte, '0' when all went as scripted */
};

static char t_play(int peer, const char *const *steps)
{
    char line[1024];
    size_t n;

    for (; steps[0] != NULL; steps += 2) {
        for (n = 0; n == 0 || line[n - 1] != '\n'; n++) {
            if (n == sizeof(line) - 1 || recv(peer, line + n, 1, 0) != 1)
                return 'r';
        }
        line[n] = '\0';
        if (strcmp(line, steps[0]) != 0)
            return 'x';
        if (send(peer, steps[1], strlen(steps[1]), MSG_NOSIGNAL) < 0)
            return 's';
    }
    return '0';
}

static void t_script(struct t_daemon *d, int peer, const char *const *steps)
{
    int p[2];
    char c;

    ck_assert_int_eq(pipe(p), 0);
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        c = t_play(peer, steps);
        if (write(p[1], &c, 1) != 1)
            _exit(1);
        _exit(0);
    }
    close(p[1]);
    d->result = p[0];
}

static void t_script_done(struct t_daemon *d)
{
    char c = '?';

    ck_assert_int_eq(read(d->result, &c, 1), 1);
    close(d->result);
    ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
    ck_assert_msg(c == '0', "the scripted daemon failed: %c", c);
}

static const char *t_msg(const struct redlockd *h)
{
    return redlockd_last_error(h)->msg;
}

/* ---- server addresses --------------------------------------------------- */

struct t_addr {
    const char *in;
    int is_unix;
    const char *host_or_path;
    const char *port;
};

static const struct t_addr t_addr_good[] = {
    { "tcp://127.0.0.1:7390", 0, "127.0.0.1", "7390" },
    { "127.0.0.1:7390", 0, "127.0.0.1", "7390" },
    { "[::1]:7390", 0, "::1", "7390" },
    { "tcp://[::1]:8000", 0, "::1", "8000" },
    { "[fe80::1%lo]:1", 0, "fe80::1%lo", "1" },
    { "localhost:65535", 0, "localhost", "65535" },
    { "locks.example.com", 0, "locks.example.com", "7390" },
    { "[::1]", 0, "::1", "7390" },
    { "unix:/tmp/x.sock", 1, "/tmp/x.sock", NULL },
    { "unix:///run/redlockd/redlockd.sock", 1, "/run/redlockd/redlockd.sock", NULL },
    { "unix:rel.sock", 1, "rel.sock", NULL },
    { "/run/redlockd.sock", 1, "/run/redlockd.sock", NULL },
};

static const char *const t_addr_bad[] = {
    "", "tcp://", "unix:", ":7390", "host:", "host:0", "host:65536",
    "host:99999999999", "host:-1", "host:+80", "host:80x", "host: 80",
    "::1", "::1:7390", "[::1", "[::1]x", "[::1]:", "[]:7390", "[::1]:abc",
    "http://host:80", "udp://1.2.3.4:5",
    ("unix:/a/very/long/path/that/does/not/fit/in/sun_path/because/it/is/"
     "longer/than/one/hundred/and/eight/bytes/which/is/the/limit/x.sock"),
    /* The daemon's rules, now the client's too (proto/addr.h). */
    "[127.0.0.1]:7390", "[locks.example.com]:1", "bad_host:1", "1.2.3",
    "1.2.3:7390", "unix://host/x.sock", "tcp://tcp://h:1", "h:1\n",
    "host:007390",      /* six digits, though the value would do */
};

START_TEST(test_addr_good)
{
    const struct t_addr *t = &t_addr_good[_i];
    struct redlockd_addr a;
    struct redlockd_error err;

    ck_assert_msg(redlockd_addr_parse(t->in, &a, &err) == 0, "%s: %s", t->in,
                  err.msg);
    ck_assert_int_eq(a.is_unix, t->is_unix);
    if (t->is_unix) {
        ck_assert_str_eq(a.path, t->host_or_path);
    } else {
        ck_assert_str_eq(a.host, t->host_or_path);
        ck_assert_str_eq(a.port, t->port);
    }
}
END_TEST

START_TEST(test_addr_bad)
{
    struct redlockd_addr a;
    struct redlockd_error err = { 0, "" };

    ck_assert_msg(redlockd_addr_parse(t_addr_bad[_i], &a, &err)
                  == -REDLOCKD_E_INVALID, "accepted \"%s\"", t_addr_bad[_i]);
    ck_assert_int_eq(err.code, REDLOCKD_E_INVALID);
    ck_assert_uint_gt(strlen(err.msg), 0);
}
END_TEST

/* The default server and the default port are the same 7390. */
START_TEST(test_addr_default)
{
    struct redlockd_addr a;
    char port[PROTO_PORT_TEXT_SIZE];

    ck_assert_int_eq(redlockd_addr_parse(REDLOCKD_DEFAULT_SERVER, &a, NULL), 0);
    snprintf(port, sizeof(port), "%d", PROTO_DEFAULT_PORT);
    ck_assert_str_eq(a.port, port);
    ck_assert_int_eq(redlockd_addr_parse("127.0.0.1", &a, NULL), 0);
    ck_assert_str_eq(a.port, port);
    ck_assert_str_eq(a.text, REDLOCKD_DEFAULT_SERVER);
    ck_assert_int_eq(redlockd_addr_parse("unix:///run/x.sock", &a, NULL), 0);
    ck_assert_str_eq(a.text, "unix:/run/x.sock");
    ck_assert_int_eq(redlockd_addr_parse("[2001:DB8::1]", &a, NULL), 0);
    ck_assert_str_eq(a.text, "[2001:db8::1]:7390");
}
END_TEST

/* The message names the address (made printable) and the rule. */
START_TEST(test_addr_message)
{
    struct redlockd_addr a;
    struct redlockd_error err;

    ck_assert_int_eq(redlockd_addr_parse("host:0", &a, &err),
                     -REDLOCKD_E_INVALID);
    ck_assert_str_eq(err.msg, "server address \"host:0\": port must be a "
                              "number from 1 to 65535");
    ck_assert_int_eq(redlockd_addr_parse("h\x01:1", &a, &err),
                     -REDLOCKD_E_INVALID);
    ck_assert_str_eq(err.msg, "server address \"h?:1\": control character "
                              "in the address");
}
END_TEST

START_TEST(test_addr_null)
{
    struct redlockd_addr a;

    ck_assert_int_eq(redlockd_addr_parse(NULL, &a, NULL), -REDLOCKD_E_INVALID);
}
END_TEST

/* ---- error codes -------------------------------------------------------- */

START_TEST(test_strerror_distinct)
{
    int i, j;

    for (i = 0; i < REDLOCKD_CODE_COUNT; i++) {
        const char *s = redlockd_strerror(i), *n = redlockd_code_name(i);

        ck_assert_ptr_nonnull(s);
        ck_assert_ptr_nonnull(n);
        ck_assert_uint_gt(strlen(s), 0);
        ck_assert_str_ne(n, "?");
        ck_assert_str_eq(redlockd_strerror(-i), s);
        ck_assert_str_eq(redlockd_code_name(-i), n);
        for (j = 0; j < i; j++) {
            ck_assert_str_ne(redlockd_strerror(j), s);
            ck_assert_str_ne(redlockd_code_name(j), n);
        }
    }
    ck_assert_ptr_nonnull(redlockd_strerror(REDLOCKD_CODE_COUNT));
    ck_assert_ptr_nonnull(redlockd_strerror(-1000));
    ck_assert_str_eq(redlockd_code_name(1000), "?");
}
END_TEST

/* Every ERR code of protocol.md, as the daemon writes it. */
static const struct {
    const char *word;
    int code;
} t_err_codes[] = {
    { "ARG", REDLOCKD_E_ARG },
    { "UNKNOWN", REDLOCKD_E_UNKNOWN },
    { "TOOLONG", REDLOCKD_E_TOOLONG },
    { "NOAUTH", REDLOCKD_E_NOAUTH },
    { "AUTH", REDLOCKD_E_AUTH },
    { "BUSY", REDLOCKD_E_BUSY },
    { "TIMEOUT", REDLOCKD_E_TIMEOUT },
    { "HELD", REDLOCKD_E_HELD },
    { "NOTHELD", REDLOCKD_E_NOTHELD },
    { "LOST", REDLOCKD_E_LOST },
    { "UNAVAILABLE", REDLOCKD_E_UNAVAILABLE },
    { "LIMIT", REDLOCKD_E_LIMIT },
    { "SHUTDOWN", REDLOCKD_E_SHUTDOWN },
    { "SOMETHINGNEW", REDLOCKD_E_OTHER },
};

_Static_assert(ARRAY_LEN(t_err_codes) == REDLOCKD_E_OTHER,
               "one row per protocol error code, plus an unknown one");

START_TEST(test_err_mapping)
{
    struct redlockd *h;
    char line[128];
    int peer;

    h = t_open(&peer, NULL);
    snprintf(line, sizeof(line), "ERR %s the daemon says no\n",
             t_err_codes[_i].word);
    t_say(peer, line);
    ck_assert_int_eq(redlockd_ping(h), -t_err_codes[_i].code);
    t_expect(peer, "PING\n");
    ck_assert_int_eq(redlockd_last_error(h)->code, t_err_codes[_i].code);
    if (t_err_codes[_i].code == REDLOCKD_E_OTHER)
        ck_assert_str_eq(t_msg(h), "SOMETHINGNEW the daemon says no");
    else
        ck_assert_str_eq(t_msg(h), "the daemon says no");
    if (t_err_codes[_i].code == REDLOCKD_E_TOOLONG) {
        /* The daemon closes after TOOLONG; so do we. */
        ck_assert_int_eq(redlockd_fd(h), -1);
        ck_assert_int_eq(redlockd_ping(h), -REDLOCKD_E_CLOSED);
    } else {
        /* A refusal leaves the connection usable. */
        t_say(peer, "PONG\n");
        ck_assert_int_eq(redlockd_ping(h), 0);
        ck_assert_int_eq(redlockd_last_error(h)->code, 0);
    }
    t_close(h, peer);
}
END_TEST

START_TEST(test_err_default_message)
{
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "ERR BUSY\n");
    ck_assert_int_eq(redlockd_lock(h, "job:1", 0, 0, 1, NULL), -REDLOCKD_E_BUSY);
    ck_assert_str_eq(t_msg(h), redlockd_strerror(REDLOCKD_E_BUSY));
    t_close(h, peer);
}
END_TEST

/* ---- LOCK, UNLOCK, EXTEND, PING ----------------------------------------- */

START_TEST(test_lock_reply)
{
    struct redlockd_lease lease;
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "OK resource=job:42 token=" TOKEN
          " fence=18446744073709551615 ttl=30000 validity=29880\n");
    ck_assert_int_eq(redlockd_lock(h, "job:42", 30000, 0, 1, &lease), 0);
    t_expect(peer, "LOCK job:42 ttl=30000 renew=1\n");
    ck_assert_str_eq(lease.resource, "job:42");
    ck_assert_str_eq(lease.token, TOKEN);
    ck_assert(lease.fence == UINT64_MAX);
    ck_assert_uint_eq(lease.ttl, 30000);
    ck_assert_int_eq(lease.validity, 29880);

    t_say(peer, "OK resource=a token=" TOKEN " fence=1 ttl=100 validity=90\r\n");
    ck_assert_int_eq(redlockd_lock(h, "a", 0, 5000, 0, &lease), 0);
    t_expect(peer, "LOCK a wait=5000 renew=0\n");
    ck_assert(lease.fence == 1);
    t_close(h, peer);
}
END_TEST

static const char *const t_bad_lock_replies[] = {
    "OK resource=job:42 fence=1 ttl=100 validity=90\n",              /* token */
    "OK resource=job:42 token=" TOKEN " ttl=100 validity=90\n",       /* fence */
    "OK resource=job:42 token=" TOKEN " fence=-1 ttl=100 validity=90\n",
    "OK resource=job:42 token=" TOKEN " fence=18446744073709551616 ttl=1 validity=1\n",
    "OK resource=job:42 token=" TOKEN "0 fence=1 ttl=100 validity=90\n",
    "OK resource=job:42 token=" TOKEN " fence=1 ttl=x validity=90\n",
    "OK resource=job:42 token=" TOKEN " fence=1 ttl=100\n",
    "PONG\n",
    "OK {\"a\":1}\n",
    "HELLO\n",
    "ERR\n",
};

START_TEST(test_lock_bad_reply)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd_lease lease;
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    t_say(peer, t_bad_lock_replies[_i]);
    ck_assert_int_eq(redlockd_lock(h, "job:42", 0, 0, 1, &lease),
                     -REDLOCKD_E_PROTO);
    /* A lock we can not describe is a lock we must drop: the handle closes
     * and the daemon releases it. */
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_lost(h, "job:42"), 1);
    ck_assert_int_eq(log.disconnects, 1);
    t_close(h, peer);
}
END_TEST

static const char *const t_bad_resources[] = {
    "", "a b", "tab\there", "nl\n", "caf\xc3\xa9",
};

START_TEST(test_lock_invalid_args)
{
    char big[REDLOCKD_RESOURCE_MAX + 2];
    struct redlockd *h;
    char *json = NULL;
    int peer;

    h = t_open(&peer, NULL);
    ck_assert_int_eq(redlockd_lock(h, t_bad_resources[_i], 0, 0, 1, NULL),
                     -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_unlock(h, t_bad_resources[_i]), -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_extend(h, t_bad_resources[_i], 10, NULL),
                     -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_status(h, t_bad_resources[_i], &json),
                     -REDLOCKD_E_INVALID);
    ck_assert_ptr_null(json);
    ck_assert_int_eq(redlockd_lock(h, NULL, 0, 0, 1, NULL), -REDLOCKD_E_INVALID);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ck_assert_int_eq(redlockd_lock(h, big, 0, 0, 1, NULL), -REDLOCKD_E_INVALID);
    /* It names the daemon's limit, not only the library's. */
    ck_assert_msg(strstr(redlockd_last_error(h)->msg, "1 to 200 bytes by default "
                         "(locks.max_resource_len, at most 1024)"),
                  "%s", redlockd_last_error(h)->msg);
    ck_assert_int_eq(redlockd_extend(h, "ok", 0, NULL), -REDLOCKD_E_INVALID);
    ck_assert_int_eq(redlockd_locks(h, NULL), -REDLOCKD_E_INVALID);
    t_expect_nothing(peer);
    /* Still usable: nothing was sent. */
    t_say(peer, "PONG\n");
    ck_assert_int_eq(redlockd_ping(h), 0);
    t_close(h, peer);
}
END_TEST

START_TEST(test_unlock_extend)
{
    struct redlockd *h;
    int64_t validity = 0;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "OK resource=job:42 nodes=3\n");
    ck_assert_int_eq(redlockd_unlock(h, "job:42"), 0);
    t_expect(peer, "UNLOCK job:42\n");

    t_say(peer, "OK resource=job:42 ttl=5000 validity=4990\n");
    ck_assert_int_eq(redlockd_extend(h, "job:42", 5000, &validity), 0);
    t_expect(peer, "EXTEND job:42 ttl=5000\n");
    ck_assert_int_eq(validity, 4990);

    ck_assert_int_eq(redlockd_lost(h, "job:42"), 0);
    t_say(peer, "ERR LOST the lease on job:42 was lost\n");
    ck_assert_int_eq(redlockd_extend(h, "job:42", 5000, NULL), -REDLOCKD_E_LOST);
    ck_assert_int_eq(redlockd_lost(h, "job:42"), 1);
    t_say(peer, "ERR NOTHELD not held\n");
    ck_assert_int_eq(redlockd_unlock(h, "job:42"), -REDLOCKD_E_NOTHELD);
    t_close(h, peer);
}
END_TEST

START_TEST(test_ping)
{
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "PONG\r\n");
    ck_assert_int_eq(redlockd_ping(h), 0);
    t_expect(peer, "PING\n");
    t_say(peer, "OK\n");
    ck_assert_int_eq(redlockd_ping(h), -REDLOCKD_E_PROTO);
    t_close(h, peer);
}
END_TEST

/* ---- HELLO and AUTH ----------------------------------------------------- */

START_TEST(test_handshake)
{
    struct redlockd_opts o = { .name = "alice", .keepalive_ms = 5000,
                               .password = "s3cret" };
    const struct redlockd_info *info;
    struct redlockd *h;
    int peer;

    static const char *const steps[] = {
        "HELLO proto=1 name=alice keepalive=5000\n",
        "OK proto=1 session=s7 server=redlockd/0.1.0 nodes=3 quorum=2\n",
        "AUTH s3cret\n", "OK\n",
        NULL,
    };
    struct t_daemon d;

    h = t_open(&peer, &o);
    t_script(&d, peer, steps);
    ck_assert_int_eq(redlockd_handshake(h, &o), 0);
    t_script_done(&d);
    info = redlockd_info(h);
    ck_assert_str_eq(info->session, "s7");
    ck_assert_str_eq(info->server, "redlockd/0.1.0");
    ck_assert_uint_eq(info->nodes, 3);
    ck_assert_uint_eq(info->quorum, 2);
    t_close(h, peer);
}
END_TEST

START_TEST(test_handshake_refused)
{
    struct redlockd_opts o = { .password = "wrong" };
    static const char *const steps[] = {
        "HELLO proto=1\n",
        "OK proto=1 session=s1 server=redlockd/0.1.0 nodes=1 quorum=1\n",
        "AUTH wrong\n", "ERR AUTH invalid password\n",
        NULL,
    };
    struct redlockd *h;
    struct t_daemon d;
    int peer;

    h = t_open(&peer, &o);
    t_script(&d, peer, steps);
    ck_assert_int_eq(redlockd_handshake(h, &o), -REDLOCKD_E_AUTH);
    ck_assert_str_eq(t_msg(h), "invalid password");
    t_script_done(&d);
    t_close(h, peer);

    /* protected mode: one ERR NOAUTH line, then the daemon hangs up */
    memset(&o, 0, sizeof(o));
    h = t_open(&peer, &o);
    t_say(peer, "ERR NOAUTH protected mode\n");
    shutdown(peer, SHUT_WR);
    ck_assert_int_eq(redlockd_handshake(h, &o), -REDLOCKD_E_NOAUTH);
    ck_assert_str_eq(t_msg(h), "protected mode");
    t_close(h, peer);

    h = t_open(&peer, &o);
    t_say(peer, "OK proto=2 session=s1\n");
    ck_assert_int_eq(redlockd_handshake(h, &o), -REDLOCKD_E_PROTO);
    t_close(h, peer);
}
END_TEST

START_TEST(test_handshake_bad_opts)
{
    struct redlockd_opts o = { .name = "two words" };
    struct redlockd_error err;
    struct redlockd *h = (struct redlockd *)&o;

    /* Checked before connecting: no daemon needed. */
    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_INVALID);
    ck_assert_ptr_null(h);
    o.name = NULL;
    o.password = "has space";
    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_INVALID);
    o.password = NULL;
    o.server = "[::1";
    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_INVALID);
    ck_assert_int_eq(err.code, REDLOCKD_E_INVALID);
}
END_TEST

START_TEST(test_connect_refused)
{
    struct redlockd_opts o = { .server = "unix:/nonexistent/redlockd.sock" };
    struct redlockd_error err;
    struct redlockd *h;

    ck_assert_int_eq(redlockd_connect(&h, &o, &err), -REDLOCKD_E_IO);
    ck_assert_ptr_null(h);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/redlockd.sock"));
}
END_TEST

/* ---- events ------------------------------------------------------------- */

START_TEST(test_event_before_reply)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    t_say(peer, "EVENT LOST resource=job:42 fence=17 reason=expired\nPONG\n");
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.resource, "job:42");
    ck_assert_uint_eq(log.fence, 17);
    ck_assert_str_eq(log.reason, "expired");
    ck_assert_int_eq(redlockd_lost(h, "job:42"), 1);
    ck_assert_int_eq(redlockd_lost(h, "job:43"), 0);

    /* Taking it again clears the loss... */
    t_say(peer, "OK resource=job:42 token=" TOKEN " fence=18 ttl=100 validity=90\n");
    ck_assert_int_eq(redlockd_lock(h, "job:42", 0, 0, 1, NULL), 0);
    ck_assert_int_eq(redlockd_lost(h, "job:42"), 0);
    /* ...but an event behind the reply is about the new lease. */
    t_say(peer, "OK resource=job:42 nodes=1\n"
          "EVENT LOST resource=job:42 fence=18 reason=quorum\n");
    ck_assert_int_eq(redlockd_unlock(h, "job:42"), 0);
    ck_assert_int_eq(redlockd_lost(h, "job:42"), 1);
    ck_assert_int_eq(log.calls, 2);
    ck_assert_uint_eq(log.fence, 18);
    ck_assert_int_eq(log.disconnects, 0);
    t_close(h, peer);
}
END_TEST

START_TEST(test_event_after_lock_reply)
{
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "OK resource=r token=" TOKEN " fence=5 ttl=100 validity=90\n"
          "EVENT LOST resource=r fence=5 reason=node\n");
    ck_assert_int_eq(redlockd_lock(h, "r", 0, 0, 1, NULL), 0);
    /* Read with the reply, so poll() on the fd would not see it. */
    ck_assert_int_eq(redlockd_lost(h, "r"), 1);
    ck_assert_int_eq(redlockd_poll_events(h, 0), 0);
    t_close(h, peer);
}
END_TEST

START_TEST(test_poll_events)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    ck_assert_int_eq(redlockd_poll_events(h, 0), 0);
    ck_assert_int_eq(redlockd_poll_events(h, 20), 0);
    t_say(peer, "EVENT LO");
    ck_assert_int_eq(redlockd_poll_events(h, 20), 0);
    t_say(peer, "ST resource=x fence=3 reason=expired\r\nEVENT SHUTDOWN\n"
          "EVENT NEWKIND a=b\n");
    ck_assert_int_eq(redlockd_poll_events(h, 0), 3);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.resource, "x");
    ck_assert_int_eq(redlockd_lost(h, "x"), 1);
    ck_assert_int_eq(redlockd_shutting_down(h), 1);
    t_expect_nothing(peer);

    /* Outside a request, anything but an event is a broken stream. */
    t_say(peer, "OK\n");
    ck_assert_int_eq(redlockd_poll_events(h, 100), -REDLOCKD_E_PROTO);
    ck_assert_int_eq(log.disconnects, 1);
    t_close(h, peer);
}
END_TEST

START_TEST(test_event_malformed)
{
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "EVENT LOST fence=3 reason=expired\n");
    ck_assert_int_eq(redlockd_poll_events(h, 100), -REDLOCKD_E_PROTO);
    t_close(h, peer);
}
END_TEST

START_TEST(test_callback_reentry)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    log.h = h;
    t_say(peer, "EVENT LOST resource=x fence=3 reason=expired\n");
    ck_assert_int_eq(redlockd_poll_events(h, 100), 1);
    ck_assert_int_eq(log.reentry_rc, -REDLOCKD_E_INVALID);
    t_expect_nothing(peer);
    t_close(h, peer);
}
END_TEST

/* ---- lease deadlines ---------------------------------------------------- */

static int64_t t_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* LOCK res answered with fence and validity (ttl 5000). */
static void t_lock(struct redlockd *h, int peer, const char *res,
                   unsigned fence, unsigned validity)
{
    char reply[256];

    snprintf(reply, sizeof(reply), "OK resource=%s token=" TOKEN " fence=%u "
             "ttl=5000 validity=%u\n", res, fence, validity);
    t_say(peer, reply);
    ck_assert_int_eq(redlockd_lock(h, res, 5000, 0, 1, NULL), 0);
    snprintf(reply, sizeof(reply), "LOCK %s ttl=5000 renew=1\n", res);
    t_expect(peer, reply);
}

/* The deadline of res is `validity` ms after a time in [t0, t1]. */
static void t_assert_deadline(struct redlockd *h, const char *res, int64_t t0,
                              int64_t t1, int64_t validity)
{
    int64_t d = -1;

    ck_assert_int_eq(redlockd_lease_deadline(h, res, &d), 0);
    ck_assert_msg(d >= t0 + validity && d <= t1 + validity,
                  "deadline of %s: %lld, want %lld..%lld", res, (long long)d,
                  (long long)(t0 + validity), (long long)(t1 + validity));
}

START_TEST(test_lease_deadline_lock)
{
    struct redlockd *h;
    int64_t t0, d = 7;
    int peer;

    h = t_open(&peer, NULL);
    ck_assert_int_eq(redlockd_lease_check(h, "a"), -REDLOCKD_E_NOTHELD);
    ck_assert_int_eq(redlockd_lease_deadline(h, "a", &d), -REDLOCKD_E_NOTHELD);
    ck_assert_int_eq(redlockd_lease_check(h, NULL), -REDLOCKD_E_NOTHELD);
    ck_assert(d == 7);
    t0 = t_now_ms();
    t_lock(h, peer, "a", 1, 4000);
    t_assert_deadline(h, "a", t0, t_now_ms(), 4000);
    ck_assert_int_eq(redlockd_lease_check(h, "a"), 0);
    ck_assert_int_eq(redlockd_lease_deadline(h, "a", NULL), 0);

    t_say(peer, "OK resource=a nodes=1\n");
    ck_assert_int_eq(redlockd_unlock(h, "a"), 0);
    t_expect(peer, "UNLOCK a\n");
    ck_assert_int_eq(redlockd_lease_check(h, "a"), -REDLOCKD_E_NOTHELD);

    /* The daemon does not hold what we thought it did. */
    t_lock(h, peer, "b", 2, 4000);
    t_say(peer, "ERR NOTHELD this session does not hold b\n");
    ck_assert_int_eq(redlockd_unlock(h, "b"), -REDLOCKD_E_NOTHELD);
    t_expect(peer, "UNLOCK b\n");
    ck_assert_int_eq(redlockd_lost(h, "b"), 1);
    ck_assert_int_eq(redlockd_lease_check(h, "b"), -REDLOCKD_E_LOST);

    /* EVENT LOST, and a closed connection. */
    t_lock(h, peer, "c", 3, 4000);
    t_say(peer, "EVENT LOST resource=c fence=3 reason=expired\n");
    ck_assert_int_eq(redlockd_poll_events(h, 100), 1);
    ck_assert_int_eq(redlockd_lease_check(h, "c"), -REDLOCKD_E_LOST);
    t_lock(h, peer, "d", 4, 4000);
    close(peer);
    ck_assert_int_eq(redlockd_poll_events(h, 100), -REDLOCKD_E_CLOSED);
    ck_assert_int_eq(redlockd_lease_check(h, "d"), -REDLOCKD_E_LOST);
    ck_assert_int_eq(redlockd_lease_deadline(h, "d", &d), -REDLOCKD_E_LOST);
    redlockd_close(h);
}
END_TEST

START_TEST(test_refresh)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd *h;
    int64_t t0, t1;
    int peer;

    h = t_open(&peer, &o);
    t_lock(h, peer, "a", 1, 4000);
    t_lock(h, peer, "b", 2, 4000);
    t_lock(h, peer, "c", 3, 4000);
    t_lock(h, peer, "d", 4, 4000);
    t_lock(h, peer, "e", 5, 4000);
    /* a: confirmed; b: another acquisition; c: not listed; d: listed lost;
     * e: held, but the daemon could not keep it. */
    t_say(peer, "OK {\"session\":\"s1\",\"locks\":["
          "{\"resource\":\"a\",\"fence\":1,\"ttl\":5000,\"validity\":2500,"
          "\"held_ms\":10,\"renew\":true,\"renewals\":3},"
          "{\"resource\":\"b\",\"fence\":9,\"ttl\":5000,\"validity\":2500},"
          "{\"resource\":\"e\",\"fence\":5,\"ttl\":5000,\"validity\":0},"
          "{\"resource\":\"x\",\"fence\":7,\"ttl\":5000,\"validity\":2500}],"
          "\"lost\":[\"d\"]}\n");
    t0 = t_now_ms();
    ck_assert_int_eq(redlockd_refresh(h), 0);
    t1 = t_now_ms();
    t_expect(peer, "LOCKS\n");
    t_assert_deadline(h, "a", t0, t1, 2500);
    ck_assert_int_eq(redlockd_lease_check(h, "a"), 0);
    ck_assert_int_eq(redlockd_lost(h, "a"), 0);
    for (const char *r = "bcd"; *r != '\0'; r++) {
        const char res[2] = { *r, '\0' };

        ck_assert_int_eq(redlockd_lost(h, res), 1);
        ck_assert_int_eq(redlockd_lease_check(h, res), -REDLOCKD_E_LOST);
    }
    ck_assert_int_eq(log.calls, 3);
    ck_assert_str_eq(log.reason, "missing");
    /* Validity 0: held, but not to be relied on. */
    ck_assert_int_eq(redlockd_lost(h, "e"), 0);
    t_assert_deadline(h, "e", t0, t1, 0);
    ck_assert_int_eq(redlockd_lease_check(h, "e"), -REDLOCKD_E_LOST);
    /* ...until a refresh finds validity left: the daemon kept it. */
    t_say(peer, "OK {\"session\":\"s1\",\"locks\":["
          "{\"resource\":\"a\",\"fence\":1,\"validity\":2000},"
          "{\"resource\":\"e\",\"fence\":5,\"validity\":1000}],\"lost\":[]}\n");
    t0 = t_now_ms();
    ck_assert_int_eq(redlockd_refresh(h), 0);
    t_expect(peer, "LOCKS\n");
    t_assert_deadline(h, "e", t0, t_now_ms(), 1000);
    ck_assert_int_eq(redlockd_lease_check(h, "e"), 0);
    /* Relocking a lost one starts afresh. */
    t_lock(h, peer, "c", 6, 4000);
    ck_assert_int_eq(redlockd_lease_check(h, "c"), 0);
    ck_assert_int_eq(log.disconnects, 0);
    t_close(h, peer);
}
END_TEST

static const char *const t_bad_locks_replies[] = {
    "OK resource=a\n",
    "OK {\"session\":\"s1\"}\n",
    "OK {\"session\":\"s1\",\"locks\":{}}\n",
    "OK {\"locks\":[{\"resource\":\"a\",\"fence\":1}]}\n",
    "OK {\"locks\":[{\"resource\":\"a\",\"fence\":\"1\",\"validity\":5}]}\n",
    "OK {\"locks\":[{\"resource\":\"a\",\"fence\":1,\"validity\":1.5}]}\n",
    "OK {\"locks\":[\n",
};

START_TEST(test_refresh_bad_reply)
{
    struct redlockd *h;
    int peer;

    h = t_open(&peer, NULL);
    t_lock(h, peer, "a", 1, 4000);
    t_say(peer, t_bad_locks_replies[_i]);
    ck_assert_int_eq(redlockd_refresh(h), -REDLOCKD_E_PROTO);
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_lease_check(h, "a"), -REDLOCKD_E_LOST);
    t_close(h, peer);
}
END_TEST

/* A refresh never waits for its answer past a deadline still ahead. */
START_TEST(test_refresh_waits_to_deadline)
{
    struct redlockd_opts o = { .io_timeout_ms = 5000 };
    struct redlockd *h;
    int64_t d = 0, now;
    int peer;

    h = t_open(&peer, &o);
    t_lock(h, peer, "slow", 1, 4000);
    t_lock(h, peer, "soon", 2, 300);
    ck_assert_int_eq(redlockd_lease_deadline(h, "soon", &d), 0);
    ck_assert_int_eq(redlockd_refresh(h), -REDLOCKD_E_IO_TIMEOUT);
    now = t_now_ms();
    ck_assert_msg(now >= d - 1 && now <= d + 200, "refresh gave up %lld ms after "
                  "the deadline", (long long)(now - d));
    ck_assert_ptr_nonnull(strstr(t_msg(h), "soon"));
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_lease_check(h, "slow"), -REDLOCKD_E_LOST);
    t_close(h, peer);

    /* With every deadline passed, the I/O timeout alone bounds it. */
    o.io_timeout_ms = 100;
    h = t_open(&peer, &o);
    t_lock(h, peer, "gone", 1, 100);
    usleep(150 * 1000);
    ck_assert_int_eq(redlockd_refresh(h), -REDLOCKD_E_IO_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(t_msg(h), "in time"));
    t_close(h, peer);
}
END_TEST

/* A LOCK that waited long for its grant is confirmed at once, so the
 * deadline handed out does not count from the request's start. */
START_TEST(test_lock_wait_confirms)
{
    struct redlockd *h;
    struct t_daemon d;
    int64_t t0;
    int peer;
    static const char *const steps[] = {
        "LOCK w wait=1000 renew=1\n",
        "OK resource=w token=" TOKEN " fence=8 ttl=100 validity=1\n",
        "LOCKS\n",
        "OK {\"session\":\"s1\",\"locks\":[{\"resource\":\"w\",\"fence\":8,"
        "\"ttl\":100,\"validity\":90}],\"lost\":[]}\n",
        NULL,
    };

    h = t_open(&peer, NULL);
    t_script(&d, peer, steps);
    t0 = t_now_ms();
    ck_assert_int_eq(redlockd_lock(h, "w", 0, 1000, 1, NULL), 0);
    t_assert_deadline(h, "w", t0, t_now_ms(), 90);
    t_script_done(&d);
    t_close(h, peer);
}
END_TEST

START_TEST(test_extend_deadline)
{
    struct redlockd *h;
    int64_t t0, t1, d = 0;
    int peer;

    h = t_open(&peer, NULL);
    t_lock(h, peer, "a", 1, 4000);
    t_say(peer, "OK resource=a ttl=10000 validity=9900\n");
    t0 = t_now_ms();
    ck_assert_int_eq(redlockd_extend(h, "a", 10000, NULL), 0);
    t_assert_deadline(h, "a", t0, t_now_ms(), 9900);
    t_expect(peer, "EXTEND a ttl=10000\n");

    /* A failed lengthening EXTEND can only have lengthened the lease. */
    ck_assert_int_eq(redlockd_lease_deadline(h, "a", &d), 0);
    t_say(peer, "ERR UNAVAILABLE a quorum of redis nodes is unavailable\n");
    ck_assert_int_eq(redlockd_extend(h, "a", 20000, NULL), -REDLOCKD_E_UNAVAILABLE);
    t_assert_deadline(h, "a", d, d, 0);
    /* A failed shortening one may have shortened it on some nodes. */
    t_say(peer, "ERR UNAVAILABLE a quorum of redis nodes is unavailable\n");
    t0 = t_now_ms();
    ck_assert_int_eq(redlockd_extend(h, "a", 1000, NULL), -REDLOCKD_E_UNAVAILABLE);
    t1 = t_now_ms();
    t_assert_deadline(h, "a", t0, t1, 0);
    ck_assert_int_eq(redlockd_lease_check(h, "a"), -REDLOCKD_E_LOST);
    ck_assert_int_eq(redlockd_lost(h, "a"), 0);
    t_close(h, peer);
}
END_TEST

/* ---- transport failures ------------------------------------------------- */

START_TEST(test_daemon_closes)
{
    struct t_lost_log log = { 0 };
    struct redlockd_opts o = { .on_lost = t_on_lost, .ud = &log };
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    t_say(peer, "EVENT SHUTDOWN\n");
    close(peer);
    ck_assert_int_eq(redlockd_ping(h), -REDLOCKD_E_CLOSED);
    ck_assert_ptr_nonnull(strstr(t_msg(h), "closed the connection"));
    ck_assert_int_eq(redlockd_shutting_down(h), 1);
    ck_assert_int_eq(log.disconnects, 1);
    ck_assert_int_eq(redlockd_lost(h, "anything"), 1);
    ck_assert_int_eq(redlockd_fd(h), -1);
    ck_assert_int_eq(redlockd_ping(h), -REDLOCKD_E_CLOSED);
    ck_assert_ptr_nonnull(strstr(t_msg(h), "not connected"));
    ck_assert_int_eq(redlockd_poll_events(h, 0), -REDLOCKD_E_CLOSED);
    ck_assert_int_eq(log.disconnects, 1);
    redlockd_close(h);
}
END_TEST

START_TEST(test_io_timeout)
{
    struct redlockd_opts o = { .io_timeout_ms = 50 };
    struct redlockd *h;
    int peer;

    h = t_open(&peer, &o);
    ck_assert_int_eq(redlockd_ping(h), -REDLOCKD_E_IO_TIMEOUT);
    /* A late reply would be taken for the next request's: give up. */
    ck_assert_int_eq(redlockd_fd(h), -1);
    t_close(h, peer);
}
END_TEST

START_TEST(test_lock_wait_extends_timeout)
{
    struct redlockd_opts o = { .io_timeout_ms = 50 };
    struct redlockd *h;
    int peer;
    pid_t pid;

    h = t_open(&peer, &o);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        usleep(200 * 1000);
        t_say(peer, "ERR TIMEOUT waited 300 ms\n");
        _exit(0);
    }
    ck_assert_int_eq(redlockd_lock(h, "r", 0, 300, 1, NULL), -REDLOCKD_E_TIMEOUT);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    t_close(h, peer);
}
END_TEST

/* A writer process for replies bigger than the socket buffer. */
static pid_t t_say_big(int peer, const char *head, size_t fill, const char *tail)
{
    pid_t pid = fork();
    char *buf;

    ck_assert_int_ge(pid, 0);
    if (pid > 0)
        return pid;
    buf = malloc(fill);
    memset(buf, 'x', fill);
    if (write(peer, head, strlen(head)) < 0 || write(peer, buf, fill) < 0
        || write(peer, tail, strlen(tail)) < 0)
        _exit(1);
    _exit(0);
}

START_TEST(test_big_json)
{
    struct redlockd *h;
    char *json = NULL;
    size_t fill = REDLOCKD_MAX_REPLY - 64;
    int peer;
    pid_t pid;

    h = t_open(&peer, NULL);
    pid = t_say_big(peer, "OK {\"s\":\"", fill, "\"}\n");
    ck_assert_int_eq(redlockd_stats(h, &json), 0);
    ck_assert_uint_eq(strlen(json), fill + 8);
    free(json);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    t_expect(peer, "STATS\n");
    t_close(h, peer);
}
END_TEST

START_TEST(test_too_long_reply)
{
    struct redlockd *h;
    char *json = NULL;
    int peer;
    pid_t pid;

    h = t_open(&peer, NULL);
    pid = t_say_big(peer, "OK {\"s\":\"", REDLOCKD_MAX_REPLY + 10, "\"}\n");
    ck_assert_int_eq(redlockd_stats(h, &json), -REDLOCKD_E_PROTO);
    ck_assert_ptr_null(json);
    close(peer);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    redlockd_close(h);
}
END_TEST

/* ---- inspection --------------------------------------------------------- */

START_TEST(test_inspect)
{
    struct redlockd *h;
    char *json = NULL;
    int peer;

    h = t_open(&peer, NULL);
    t_say(peer, "OK {\"sessions\":[{\"id\":\"s1\"}]}\n");
    ck_assert_int_eq(redlockd_sessions(h, &json), 0);
    t_expect(peer, "SESSIONS\n");
    ck_assert_str_eq(json, "{\"sessions\":[{\"id\":\"s1\"}]}");
    free(json);

    t_say(peer, "OK {\"resource\":\"job:42\",\"held\":false}\n");
    ck_assert_int_eq(redlockd_status(h, "job:42", &json), 0);
    t_expect(peer, "STATUS job:42\n");
    free(json);

    t_say(peer, "OK {\"session\":\"s1\",\"locks\":[]}\n");
    ck_assert_int_eq(redlockd_locks(h, &json), 0);
    t_expect(peer, "LOCKS\n");
    free(json);

    t_say(peer, "ERR ARG bad resource\n");
    ck_assert_int_eq(redlockd_status(h, "x", &json), -REDLOCKD_E_ARG);
    ck_assert_ptr_null(json);

    t_say(peer, "OK resource=x\n");
    ck_assert_int_eq(redlockd_stats(h, &json), -REDLOCKD_E_PROTO);
    ck_assert_ptr_null(json);
    t_close(h, peer);
}
END_TEST

START_TEST(test_close_sends_quit)
{
    struct redlockd *h;
    char buf[16];
    int peer;
    pid_t pid;

    h = t_open(&peer, NULL);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(peer);    /* or the daemon's end never reaches EOF */
        redlockd_close(h);
        _exit(0);
    }
    ck_assert_int_eq(recv(peer, buf, 5, MSG_WAITALL), 5);
    ck_assert_int_eq(memcmp(buf, "QUIT\n", 5), 0);
    t_say(peer, "OK bye\n");
    close(peer);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    redlockd_close(h);
    redlockd_close(NULL);
}
END_TEST

/* ---- failover: a scripted daemon on a unix socket ------------------------ */

#define T1 "11111111111111111111111111111111"
#define T2 "22222222222222222222222222222222"
#define T3 "33333333333333333333333333333333"
#define S1 "0123456789abcdef0123456789abcdef"
#define S2 "fedcba9876543210fedcba9876543210"

/* Listens on a unix socket of its own; plays conns[i] ({request, reply}
 * pairs, NULL-terminated) on the i-th connection it accepts, and closes
 * that connection after its last reply. */
struct t_server {
    struct t_daemon d;
    char dir[64];
    char path[128];
    char addr[160];
};

static void t_serve_child(int lfd, const char *const *const *conns, int out)
{
    char c = '0';

    alarm(10);
    for (; *conns != NULL && c == '0'; conns++) {
        int fd = accept(lfd, NULL, NULL);

        c = fd < 0 ? 'a' : t_play(fd, *conns);
        if (fd >= 0)
            close(fd);
    }
    if (write(out, &c, 1) != 1)
        _exit(1);
    _exit(0);
}

static void t_serve(struct t_server *s, const char *const *const *conns)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    int lfd, p[2];

    snprintf(s->dir, sizeof(s->dir), "/tmp/rl-unit.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(s->dir));
    snprintf(s->path, sizeof(s->path), "%s/d.sock", s->dir);
    snprintf(s->addr, sizeof(s->addr), "unix:%s", s->path);
    ck_assert_uint_lt(strlen(s->path), sizeof(sun.sun_path));
    memcpy(sun.sun_path, s->path, strlen(s->path) + 1);
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    ck_assert_int_eq(listen(lfd, 8), 0);
    ck_assert_int_eq(pipe(p), 0);
    s->d.pid = fork();
    ck_assert_int_ge(s->d.pid, 0);
    if (s->d.pid == 0)
        t_serve_child(lfd, conns, p[1]);
    close(lfd);
    close(p[1]);
    s->d.result = p[0];
}

static void t_serve_done(struct t_server *s)
{
    t_script_done(&s->d);
    unlink(s->path);
    rmdir(s->dir);
}

static struct redlockd *t_connect_to(struct t_server *s, struct t_lost_log *log)
{
    struct redlockd_opts o = { .server = s->addr, .on_lost = t_on_lost,
                               .ud = log };
    struct redlockd_error err;
    struct redlockd *h = NULL;
    int rc = redlockd_connect(&h, &o, &err);

    ck_assert_msg(rc == 0, "connect: %d %s", rc, err.msg);
    return h;
}

/*
 * The session is unknown after a restart (NOSESSION): a new one, and one
 * ADOPT per grant (b and c together, with their token); one the daemon
 * refuses is lost ("adopt"). Then a LOCK whose connection breaks: it fails
 * with IO, the session is resumed, a LOCKS round confirms the lease and
 * the grant nobody knows about is released.
 */
START_TEST(test_failover_adopt_resume)
{
    static const char *const c1[] = {
        "HELLO proto=1 detach=30000\n",
        "OK proto=1 session=s1 server=redlockd/0.1.0 nodes=3 quorum=2 "
        "secret=" S1 "\n",
        "LOCK a ttl=5000 renew=1\n",
        "OK resource=a token=" T1 " fence=7 ttl=5000 validity=4900\n",
        "LOCK b c ttl=5000\n",
        "OK resource=b token=" T2 " fence=8 ttl=5000 validity=4900 "
        "resources=2\n",
        NULL,
    };
    static const char *const c2[] = {
        "HELLO proto=1 resume=s1 secret=" S1 "\n",
        "ERR NOSESSION no such session, or a wrong secret\n",
        "HELLO proto=1 detach=30000\n",
        "OK proto=1 session=s2 server=redlockd/0.1.0 nodes=3 quorum=2 "
        "secret=" S2 "\n",
        "ADOPT a token=" T1 " ttl=5000 renew=1\n",
        "OK resource=a token=" T3 " fence=7 ttl=5000 validity=4800\n",
        "ADOPT b c token=" T2 " ttl=5000 renew=1\n",
        "ERR LOST the token holds on too few nodes\n",
        "PING\n", "PONG\n",
        "LOCK d ttl=5000 renew=1\n", "",
        NULL,
    };
    static const char *const c3[] = {
        "HELLO proto=1 resume=s2 secret=" S2 "\n",
        "OK proto=1 session=s2 server=redlockd/0.1.0 nodes=3 quorum=2 "
        "resumed=2\n",
        "LOCKS\n",
        "OK {\"session\":\"s2\",\"locks\":[{\"resource\":\"a\",\"fence\":7,"
        "\"ttl\":5000,\"validity\":4000},{\"resource\":\"d\",\"fence\":9,"
        "\"ttl\":5000,\"validity\":4000}],\"lost\":[]}\n",
        "UNLOCK d\n", "OK resource=d nodes=3\n",
        "UNLOCK a\n", "OK resource=a nodes=3\n",
        "QUIT\n", "OK bye\n",
        NULL,
    };
    static const char *const *const conns[] = { c1, c2, c3, NULL };
    const char *bc[] = { "b", "c" };
    struct redlockd_lock_opts lo = { .ttl_ms = 5000 };
    struct t_lost_log log = { 0 };
    struct redlockd_lease l;
    struct t_server s;
    struct redlockd *h;

    t_serve(&s, conns);
    h = t_connect_to(&s, &log);
    ck_assert_int_eq(redlockd_lock(h, "a", 5000, 0, 1, NULL), 0);
    ck_assert_int_eq(redlockd_lockv(h, bc, 2, &lo, NULL), 0);
    /* c1 is closed by now: the ping finds out, and is sent again. */
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_str_eq(redlockd_info(h)->session, "s2");
    ck_assert_int_eq(redlockd_lease_state(h, "a"), REDLOCKD_LEASE_HELD);
    ck_assert_int_eq(redlockd_lease_info(h, "a", &l), 0);
    ck_assert_str_eq(l.token, T3);
    ck_assert_uint_eq(l.fence, 7);
    ck_assert_int_eq(redlockd_lease_state(h, "b"), REDLOCKD_LEASE_LOST);
    ck_assert_int_eq(redlockd_lease_state(h, "c"), REDLOCKD_LEASE_LOST);
    ck_assert_int_eq(log.calls, 2);
    ck_assert_str_eq(log.reason, "adopt");
    ck_assert_int_eq(log.disconnects, 0);
    /* c2 closes with the LOCK unanswered. */
    ck_assert_int_eq(redlockd_lock(h, "d", 5000, 0, 1, NULL), -REDLOCKD_E_IO);
    ck_assert_ptr_nonnull(strstr(t_msg(h), "outcome is unknown"));
    ck_assert_int_eq(redlockd_lease_state(h, "d"), REDLOCKD_LEASE_NONE);
    ck_assert_int_eq(redlockd_lease_state(h, "a"), REDLOCKD_LEASE_HELD);
    ck_assert_int_eq(redlockd_unlock(h, "a"), 0);
    redlockd_close(h);
    t_serve_done(&s);
}
END_TEST

/*
 * A daemon that does not know detach= (ERR ARG) gets a plain HELLO. Its
 * session ends with the connection, so the lease is lost then
 * ("disconnected"), unless the daemon said it left the lease on the nodes
 * (EVENT CLOSING reason=shutdown): then it is adopted.
 */
START_TEST(test_failover_no_detach)
{
    static const char *const c1[] = {
        "HELLO proto=1 detach=30000\n", "ERR ARG unknown option detach=\n",
        "HELLO proto=1\n",
        "OK proto=1 session=s1 server=redlockd/0.0.9 nodes=1 quorum=1\n",
        "LOCK a ttl=5000 renew=1\n",
        "OK resource=a token=" T1 " fence=3 ttl=5000 validity=4900\n",
        NULL,
    };
    static const char *const c2[] = {
        "HELLO proto=1 detach=30000\n", "ERR ARG unknown option detach=\n",
        "HELLO proto=1\n",
        "OK proto=1 session=s2 server=redlockd/0.0.9 nodes=1 quorum=1\n",
        "PING\n", "PONG\n",
        "LOCK b ttl=5000 renew=1\n",
        "OK resource=b token=" T2 " fence=4 ttl=5000 validity=4900\n"
        "EVENT SHUTDOWN\nEVENT CLOSING reason=shutdown\n",
        NULL,
    };
    static const char *const c3[] = {
        "HELLO proto=1 detach=30000\n", "ERR ARG unknown option detach=\n",
        "HELLO proto=1\n",
        "OK proto=1 session=s3 server=redlockd/0.0.9 nodes=1 quorum=1\n",
        "ADOPT b token=" T2 " ttl=5000 renew=1\n",
        "OK resource=b token=" T3 " fence=4 ttl=5000 validity=4800\n",
        "PING\n", "PONG\n",
        "QUIT\n", "OK bye\n",
        NULL,
    };
    static const char *const *const conns[] = { c1, c2, c3, NULL };
    struct t_lost_log log = { 0 };
    struct t_server s;
    struct redlockd *h;

    t_serve(&s, conns);
    h = t_connect_to(&s, &log);
    ck_assert_int_eq(redlockd_lock(h, "a", 5000, 0, 1, NULL), 0);
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_int_eq(redlockd_lease_state(h, "a"), REDLOCKD_LEASE_LOST);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.resource, "a");
    ck_assert_str_eq(log.reason, "disconnected");
    ck_assert_int_eq(redlockd_lock(h, "b", 5000, 0, 1, NULL), 0);
    ck_assert_int_eq(redlockd_ping(h), 0);
    ck_assert_int_eq(redlockd_lease_state(h, "b"), REDLOCKD_LEASE_HELD);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(redlockd_info(h)->session, "s3");
    redlockd_close(h);
    t_serve_done(&s);
}
END_TEST
/* After a fork, the process that forgets the handle says nothing: the one
 * that keeps it goes on using the connection, and its QUIT is the first
 * line the daemon reads. */
START_TEST(test_forget_after_fork)
{
    struct redlockd *h;
    int peer;
    pid_t pid;

    h = t_open(&peer, NULL);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(peer);
        redlockd_forget(h);
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    t_expect_nothing(peer);
    t_say(peer, "PONG\n");
    ck_assert_int_eq(redlockd_ping(h), 0);
    t_expect(peer, "PING\n");
    redlockd_forget(NULL);
    t_close(h, peer);
}
END_TEST


static Suite *client_suite(void)
{
    Suite *s = suite_create("client");
    TCase *tc;

    tc = tcase_create("addr");
    tcase_add_loop_test(tc, test_addr_good, 0, (int)ARRAY_LEN(t_addr_good));
    tcase_add_loop_test(tc, test_addr_bad, 0, (int)ARRAY_LEN(t_addr_bad));
    tcase_add_test(tc, test_addr_null);
    tcase_add_test(tc, test_addr_default);
    tcase_add_test(tc, test_addr_message);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_strerror_distinct);
    tcase_add_loop_test(tc, test_err_mapping, 0, (int)ARRAY_LEN(t_err_codes));
    tcase_add_test(tc, test_err_default_message);
    suite_add_tcase(s, tc);

    tc = tcase_create("commands");
    tcase_add_test(tc, test_lock_reply);
    tcase_add_loop_test(tc, test_lock_bad_reply, 0,
                        (int)ARRAY_LEN(t_bad_lock_replies));
    tcase_add_loop_test(tc, test_lock_invalid_args, 0,
                        (int)ARRAY_LEN(t_bad_resources));
    tcase_add_test(tc, test_unlock_extend);
    tcase_add_test(tc, test_ping);
    tcase_add_test(tc, test_inspect);
    suite_add_tcase(s, tc);

    tc = tcase_create("handshake");
    tcase_add_test(tc, test_handshake);
    tcase_add_test(tc, test_handshake_refused);
    tcase_add_test(tc, test_handshake_bad_opts);
    tcase_add_test(tc, test_connect_refused);
    suite_add_tcase(s, tc);

    tc = tcase_create("events");
    tcase_add_test(tc, test_event_before_reply);
    tcase_add_test(tc, test_event_after_lock_reply);
    tcase_add_test(tc, test_poll_events);
    tcase_add_test(tc, test_event_malformed);
    tcase_add_test(tc, test_callback_reentry);
    suite_add_tcase(s, tc);

    tc = tcase_create("deadlines");
    tcase_add_test(tc, test_lease_deadline_lock);
    tcase_add_test(tc, test_refresh);
    tcase_add_loop_test(tc, test_refresh_bad_reply, 0,
                        (int)ARRAY_LEN(t_bad_locks_replies));
    tcase_add_test(tc, test_refresh_waits_to_deadline);
    tcase_add_test(tc, test_lock_wait_confirms);
    tcase_add_test(tc, test_extend_deadline);
    suite_add_tcase(s, tc);

    tc = tcase_create("transport");
    tcase_add_test(tc, test_daemon_closes);
    tcase_add_test(tc, test_io_timeout);
    tcase_add_test(tc, test_lock_wait_extends_timeout);
    tcase_add_test(tc, test_big_json);
    tcase_add_test(tc, test_too_long_reply);
    tcase_add_test(tc, test_close_sends_quit);
    tcase_add_test(tc, test_forget_after_fork);
    tcase_add_test(tc, test_failover_adopt_resume);
    tcase_add_test(tc, test_failover_no_detach);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(client_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
