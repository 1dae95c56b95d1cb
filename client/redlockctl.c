/*
 * redlockctl: the command-line client of redlockd, built on libredlockd.
 *
 * `run` guards a command with a lock: it takes the lock (the daemon renews
 * the lease while our connection lives), then forks its keeper (see "run:
 * the keeper" below), which holds the lock from then on and runs the
 * command in its own process group with the lock in its environment and
 * the lock connection inherited, forwards SIGINT, SIGTERM and SIGHUP to
 * that group, watches the connection for EVENT LOST, confirms the lease
 * every ttl/3 (redlockd_refresh), stops the whole group (SIGTERM, SIGKILL
 * after --kill-after) when the lease is lost or its deadline passes
 * unconfirmed, and releases the lock as soon as no process of the group is
 * left. With several servers (-s repeated) the library follows the lease
 * when the connection breaks or the daemon restarts or dies (resume, or
 * ADOPT on another daemon), and the command runs on; see "run: failover"
 * below. `elect` is `run` for a leader: it campaigns (waits for the lock,
 * without a time limit unless --wait says otherwise) and stores --value
 * with the lock, so that `leader` (STATUS's holder) and `watch` (WATCH,
 * a line per EVENT HOLDER) show it on every daemon. `lock` takes a lock
 * without a command and holds it (refreshing, following it across
 * daemons, as the keeper does) until SIGINT, SIGTERM or SIGHUP, or until
 * it is lost. `ping`, `status`, `sessions`
 * and `stats` print the daemon's answers, as tables or (--json) raw;
 * `locks` lists every lock the daemon's sessions hold, from SESSIONS;
 * `top` shows what is waited for and held longest, from TOP, refreshed
 * every second (see "top" below).
 * `release --force` is the operator's FORCEUNLOCK, after AUTH with the
 * admin password. (A plain `release` does not exist: redlockctl's locks
 * live as long as its session, which ends with the command.)
 * Exit statuses are listed in usage() and in redlockctl(1); keep both in
 * step.
 */
#include <errno.h>
#include <fcntl.h>
#include <err.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "keeper.h"
#include "num.h"
#include "redlockd.h"

#ifndef REDLOCKD_VERSION
#define REDLOCKD_VERSION "unknown"
#endif

#define CTL_EXIT_LOST 70            /* the lease was lost, command stopped */
#define CTL_DEFAULT_TIMEOUT_MS 5000
/*
 * run: the keeper (issue 28). The lock is the command's process group's:
 * held while any process of the group lives, whether or not it kept the
 * lock connection (a worker started with close_fds does not), even after
 * redlockctl itself is killed with SIGKILL. So once the lock is taken,
 * redlockctl forks a keeper (client/keeper.c): in a process group of its
 * own (a terminal's SIGINT or SIGTSTP to the foreground group, where
 * redlockctl is, never reaches it), the subreaper of the command's
 * orphans, the only owner of the lock's handle (this process forgets its
 * copy without a word: redlockd_forget). The keeper runs the command and
 * everything below (refreshes, failover, deadlines, --on-lost), looks
 * with kill(-pgid, 0) whether the group is empty once the command itself
 * has exited, and then releases the lock at once (UNLOCK, QUIT). The
 * visible redlockctl only forwards SIGINT, SIGTERM and SIGHUP to the
 * keeper and exits with its status; SIGKILLed, it leaves the keeper
 * running, unaffected. Processes that leave the group (setsid, setpgid)
 * are not waited for.
 *
 * The keeper also hands the lock connection down to the command (not
 * close-on-exec, its number in REDLOCKD_LOCK_FD), for the case where the
 * keeper itself is killed: the daemon then sees the connection close only
 * when the last process holding that socket exits; the session detaches,
 * and the lock is released when its detach time (--detach) runs out.
 * After a failover the session is on a connection of the keeper's own,
 * which the command does not have (the library shut the inherited one
 * down): a SIGKILLed keeper then keeps the lock for the detach time only.
 * For the same reason `run` asks for no HELLO keepalive: once the keeper
 * is gone nobody would send the lines that keep such a session alive.
 *
 * It confirms the lease every third of its ttl (the daemon's renewal
 * period), which leaves each confirmation two thirds of a ttl to arrive
 * before the deadline of the one before; sooner when the validity left is
 * short, never more often than every CTL_REFRESH_MIN_MS and never less
 * often than every CTL_REFRESH_MAX_MS.
 *
 * Unconfirmed, the command is stopped a little before the lease deadline:
 * the keys outlive the deadline only by the daemon's drift margin (22 ms
 * for a 2 s ttl), and stopping takes time (our wake-up, the signal, the
 * command's exit). The daemon keeps the same twentieth of the ttl for its
 * clients to act on EVENT LOST.
 */
#define CTL_REFRESH_MAX_MS 15000
#define CTL_REFRESH_MIN_MS 50
#define CTL_STOP_EARLY_MAX_MS 1000
#define CTL_NAME_MAX 64
/* The environment variable that names the inherited lock connection. */
#define CTL_LOCK_FD_ENV "REDLOCKD_LOCK_FD"
/*
 * run: failover. The session asks for HELLO detach= of the ttl, at least
 * CTL_DETACH_MIN_MS and at most CTL_DETACH_MAX_MS (the daemon's default
 * limits.max_detach_ms), unless --detach says otherwise: so a broken
 * connection costs nothing while the library resumes the session, and a
 * daemon restarted or lost costs nothing while it adopts the lease on
 * another. While the handle is not connected, redlockctl gives it slices
 * of at most CTL_RECONNECT_SLICE_MS to reconnect in, so that signals and
 * the command's exit are not left waiting, and looks again after
 * CTL_RECONNECT_POLL_MS. Before the grant, a LOCK refused by a daemon that
 * is stopping, or cut off by a broken connection, is sent again through
 * the next daemon (ctl_lock_again), within what is left of --wait.
 */
#define CTL_DETACH_MIN_MS 30000
#define CTL_DETACH_MAX_MS 60000
#define CTL_RECONNECT_SLICE_MS 1000
#define CTL_RECONNECT_POLL_MS 20

/* run -r: the most resources one run takes (the daemon's locks.max_multi
 * may allow fewer). */
#define CTL_MAX_RESOURCES 256
/* Room for every option in struct ctl's record of those given (asserted
 * where the options are listed). */
#define CTL_OPTS_MAX 64
/* elect without --wait campaigns in LOCKs that wait this long each, again
 * and again: within the daemon's locks.max_wait_ms (an hour by default),
 * and short enough that a daemon that stalls is noticed. */
#define CTL_CAMPAIGN_ROUND_MS 60000
/* leader: the exit status when nobody leads (no exclusive holder with a
 * value). */
#define CTL_EXIT_NO_LEADER 1

struct ctl {
    /* common options */
    const char *servers[REDLOCKD_SERVERS_MAX];  /* -s, in order */
    size_t nservers;
    const char *password_file;
    /* --tls-*: NULL leaves the library its $REDLOCKD_TLS_* default */
    const char *tls_ca, *tls_cert, *tls_key, *tls_server_name;
    const char *user;               /* --user, else $REDLOCKD_USER */
    const char *name;
    int timeout_ms;
    int json;
    /* run options (elect and lock take most of them) */
    uint32_t ttl_ms;
    uint32_t wait_ms;
    int wait_set;                   /* --wait given */
    const char *value;              /* --value: the holder's value */
    bool campaign;                  /* elect without --wait: no limit */
    int kill_on_lost;
    unsigned kill_after_s;
    int conflict_exit;
    int quiet;
    /* run: lock kinds (see "run: lock kinds" below) */
    int shared;                     /* --shared */
    uint32_t limit;                 /* --limit K */
    const char *resources[CTL_MAX_RESOURCES];   /* -r, in order */
    size_t nresources;
    /* run: failover */
    int detach_set;                 /* --detach given */
    uint32_t detach_ms;             /* its value; 0: off */
    /* release options */
    int force;
    const char *admin_password_file;
    /* top options */
    unsigned iterations;            /* -n; 0: until stopped */
    /* which of ctl_opts were given (to check they suit the command) */
    bool given[CTL_OPTS_MAX];

    char password[1025];
    char admin_password[1025];
    char default_name[CTL_NAME_MAX + 1];
};

/*
 * The words after the command word, with options anywhere among them (so
 * `status job:9 --json` works as `--json status job:9` does); "--" ends
 * the options. For run and elect the options end at COMMAND too: the
 * words from there on are the command's, whatever they look like.
 */
struct ctl_args {
    char **words;               /* the words that are not options (owned
                                   array, argc long); run: RESOURCE */
    int nwords;
    bool dashdash;              /* a "--" ended the options */
    char **cmd;                 /* run, elect: COMMAND [ARGS...]; NULL:
                                   none */
    int ncmd;
};

/* ---- options, usage ---------------------------------------------------- */

/* Long-only options: values above any short letter. */
enum {
    OPT_PASSWORD_FILE = 256,
    OPT_NAME,
    OPT_TIMEOUT,
    OPT_JSON,
    OPT_TTL,
    OPT_WAIT,
    OPT_ON_LOST,
    OPT_KILL_AFTER,
    OPT_SHARED,
    OPT_LIMIT,
    OPT_FORCE,
    OPT_ADMIN_PASSWORD_FILE,
    OPT_DETACH,
    OPT_TLS_CA,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_SERVER_NAME,
    OPT_USER,
    OPT_VALUE,
};

/* Which commands take an option: a set of them, or every command. */
enum ctl_scope {
    CTL_ANY = 0,
    CTL_RUN = 1u << 0,
    CTL_ELECT = 1u << 1,
    CTL_LOCK = 1u << 2,
    CTL_RELEASE = 1u << 3,
    CTL_TOP = 1u << 4,
};

/* The commands that take a lock, and most of run's options. */
#define CTL_HOLDING (CTL_RUN | CTL_ELECT | CTL_LOCK)

/* The commands of the scope bits, bit by bit. */
static const char *const ctl_scope_cmd[] = { "run", "elect", "lock",
                                             "release", "top" };
#define CTL_NSCOPES (sizeof(ctl_scope_cmd) / sizeof(ctl_scope_cmd[0]))

/*
 * Every option once: getopt's tables, the option lists of --help and the
 * check that run's options go to run are all made from it.
 */
struct ctl_opt {
    const char *name;           /* --name */
    int val;                    /* the short letter, or OPT_* */
    const char *arg;            /* its argument as --help shows it; NULL:
                                   the option takes none */
    unsigned scope;             /* enum ctl_scope bits; CTL_ANY: all */
    const char *help;           /* one or more lines, each ending in \n */
};

static const struct ctl_opt ctl_opts[] = {
    { "server", 's', "ADDR", CTL_ANY,
      "HOST:PORT, [IPV6]:PORT, tls://HOST:PORT or\n"
      "unix:/PATH; repeat for daemons to fail over to\n"
      "(default: $REDLOCKD_SERVER, comma-separated, else\n"
      "127.0.0.1:7390)\n" },
    { "password-file", OPT_PASSWORD_FILE, "F", CTL_ANY,
      "send the first line of F with AUTH\n" },
    { "tls-ca", OPT_TLS_CA, "F", CTL_ANY,
      "tls://: trust the CAs in PEM file F (default:\n"
      "$REDLOCKD_TLS_CA, else the system's store)\n" },
    { "tls-cert", OPT_TLS_CERT, "F", CTL_ANY,
      "tls://: present the client certificate in F\n"
      "(default: $REDLOCKD_TLS_CERT, else none)\n" },
    { "tls-key", OPT_TLS_KEY, "F", CTL_ANY,
      "tls://: the key of --tls-cert (default:\n"
      "$REDLOCKD_TLS_KEY, else in the --tls-cert file)\n" },
    { "tls-server-name", OPT_TLS_SERVER_NAME, "NAME", CTL_ANY,
      "tls://: the name the daemon's certificate must\n"
      "carry (default: the host of the address)\n" },
    { "user", OPT_USER, "NAME", CTL_ANY,
      "log in as NAME of the daemon's auth.users, with\n"
      "--password-file's password (default: $REDLOCKD_USER)\n" },
    { "name", OPT_NAME, "NAME", CTL_ANY, "client name shown by `sessions`\n" },
    { "timeout", OPT_TIMEOUT, "TIME", CTL_ANY,
      "connect and reply timeout (default 5s, 0: none)\n" },
    { "json", OPT_JSON, NULL, CTL_ANY,
      "print the daemon's JSON instead of a table (watch:\n"
      "an object per line)\n" },
    { "help", 'h', NULL, CTL_ANY, "show this help\n" },
    { "version", 'V', NULL, CTL_ANY, "show the version\n" },
    { "ttl", OPT_TTL, "TIME", CTL_HOLDING,
      "lease on Redis (default: the daemon's, 30s); the\n"
      "command is stopped (lock: exits) once TIME passes\n"
      "without the daemon confirming the lease\n" },
    { "wait", OPT_WAIT, "TIME", CTL_HOLDING,
      "wait up to TIME for a busy lock (default 0: don't;\n"
      "elect: as long as it takes)\n" },
    { "value", OPT_VALUE, "TEXT", CTL_HOLDING,
      "the holder's value (a leader's address), 1 to 256\n"
      "visible ASCII characters, shown by status, leader\n"
      "and watch on every daemon; the command gets it as\n"
      "REDLOCKD_VALUE (elect: required)\n" },
    { "on-lost", OPT_ON_LOST, "kill|ignore", CTL_RUN | CTL_ELECT,
      "when the lease is lost: SIGTERM the command's\n"
      "whole process group (default), or let it finish\n" },
    { "kill-after", OPT_KILL_AFTER, "SEC", CTL_RUN | CTL_ELECT,
      "SIGKILL the group SEC seconds after that SIGTERM\n"
      "if any of it still runs (default 5)\n" },
    { "conflict-exit-code", 'E', "N", CTL_HOLDING,
      "exit status when the lock is busy (default 75)\n" },
    { "quiet", 'q', NULL, CTL_HOLDING,
      "say nothing when the lock is busy\n" },
    { "shared", OPT_SHARED, NULL, CTL_RUN | CTL_LOCK,
      "a shared lock: other --shared runs hold it too\n" },
    { "limit", OPT_LIMIT, "K", CTL_RUN | CTL_LOCK,
      "one of K slots of a semaphore (K holders at once)\n" },
    { "resource", 'r', "R", CTL_RUN | CTL_LOCK,
      "lock R too (repeat for several, all or none)\n" },
    { "detach", OPT_DETACH, "TIME", CTL_HOLDING,
      "how long the daemon keeps the session after the\n"
      "connection is lost (default: the ttl, 30s to 60s;\n"
      "0: off, a lost connection loses the lock)\n" },
    { "force", OPT_FORCE, NULL, CTL_RELEASE,
      "delete the lock whoever holds it (FORCEUNLOCK)\n" },
    { "admin-password-file", OPT_ADMIN_PASSWORD_FILE, "F", CTL_RELEASE,
      "the daemon's auth.admin_password: the first line\n"
      "of F (default: $REDLOCKD_ADMIN_PASSWORD)\n" },
    { "iterations", 'n', "N", CTL_TOP,
      "show N refreshes, then exit (default: until q or\n"
      "a signal; -n 1 prints once)\n" },
};

#define CTL_NOPTS (sizeof(ctl_opts) / sizeof(ctl_opts[0]))
#define CTL_HELP_COL 26         /* where --help's descriptions start */

_Static_assert(CTL_NOPTS <= CTL_OPTS_MAX, "CTL_OPTS_MAX is too small");

/* "run and elect", "run, elect and lock": the commands of scope bits. */
static const char *ctl_scope_words(unsigned scope, char *buf, size_t sz)
{
    size_t i, n = 0, k = 0, len = 0;

    for (i = 0; i < CTL_NSCOPES; i++)
        n += (scope >> i) & 1u;
    buf[0] = '\0';
    for (i = 0; i < CTL_NSCOPES; i++) {
        if (!((scope >> i) & 1u))
            continue;
        k++;
        len += (size_t)snprintf(buf + len, len < sz ? sz - len : 0, "%s%s",
                                k == 1 ? "" : k == n ? " and " : ", ",
                                ctl_scope_cmd[i]);
    }
    return buf;
}

static const struct ctl_opt *ctl_opt_find(int val)
{
    size_t i;

    for (i = 0; i < CTL_NOPTS; i++) {
        if (ctl_opts[i].val == val)
            return &ctl_opts[i];
    }
    return NULL;
}

/* "-E, --conflict-exit-code N" and its description, lined up; an option
 * of some of the section's commands only says which. */
static void ctl_usage_opt(FILE *out, const struct ctl_opt *o, unsigned section)
{
    char left[64], cmds[64];
    const char *line, *nl;

    snprintf(left, sizeof(left), "  %c%c%c --%s%s%s",
             o->val < 256 ? '-' : ' ', o->val < 256 ? o->val : ' ',
             o->val < 256 ? ',' : ' ', o->name, o->arg ? " " : "",
             o->arg ? o->arg : "");
    if (strlen(left) + 2 > CTL_HELP_COL)
        fprintf(out, "%s\n%*s", left, CTL_HELP_COL, "");
    else
        fprintf(out, "%-*s", CTL_HELP_COL, left);
    for (line = o->help; (nl = strchr(line, '\n')); line = nl + 1)
        fprintf(out, "%*s%.*s\n", line == o->help ? 0 : CTL_HELP_COL, "",
                (int)(nl - line), line);
    if (o->scope != section)
        fprintf(out, "%*s(%s only)\n", CTL_HELP_COL, "",
                ctl_scope_words(o->scope, cmds, sizeof(cmds)));
}

/* The options of a section: of every command (CTL_ANY), or of some of
 * the section's commands. */
static void ctl_usage_opts(FILE *out, unsigned section)
{
    size_t i;

    for (i = 0; i < CTL_NOPTS; i++) {
        if (section == CTL_ANY ? ctl_opts[i].scope == CTL_ANY
                               : (ctl_opts[i].scope & section) != 0)
            ctl_usage_opt(out, &ctl_opts[i], section);
    }
}

static void ctl_usage(FILE *out)
{
    fputs(
"Usage: redlockctl [OPTIONS] COMMAND [ARGS]\n"
"\n"
"Commands:\n"
"  run [RUN OPTIONS] RESOURCE [--] COMMAND [ARGS...]\n"
"                      take the lock, run COMMAND while holding it,\n"
"                      release the lock\n"
"  run [RUN OPTIONS] -r RESOURCE [-r RESOURCE...] [--] COMMAND [ARGS...]\n"
"                      the same for several locks, all of them or none\n"
"  elect RESOURCE --value TEXT [RUN OPTIONS] [--] COMMAND [ARGS...]\n"
"                      campaign: wait for the lock (as long as it takes\n"
"                      unless --wait), then run COMMAND as the leader, as\n"
"                      run does, with TEXT stored with the lock\n"
"  leader RESOURCE     print the leader's value (exit 1: nobody leads)\n"
"  watch RESOURCE...   print a line each time the holder changes, until\n"
"                      SIGINT or SIGTERM\n"
"  lock [RUN OPTIONS] RESOURCE\n"
"                      take the lock, print its fence and token, hold it\n"
"                      until SIGINT or SIGTERM (exit 0) or until it is\n"
"                      lost (exit 70), then release it\n"
"  status RESOURCE     what the daemon and the Redis nodes know of RESOURCE\n"
"  sessions            the daemon's client sessions\n"
"  stats               the daemon's nodes, sessions, locks, grants and losses\n"
"                      per second and acquire latency (--json: every counter)\n"
"  ping                check that the daemon answers and has a quorum of\n"
"                      Redis nodes\n"
"  locks               every lock the daemon's sessions hold, with the\n"
"                      holders' names\n"
"  top [-n N]          the resources held or waited for, the longest wait\n"
"                      first, refreshed every second (q quits)\n"
"  release --force [RELEASE OPTIONS] RESOURCE\n"
"                      operators: delete the lock on RESOURCE whoever\n"
"                      holds it (the holder loses it); needs the daemon's\n"
"                      admin password\n"
"\n", out);
    fprintf(out,
"Options go anywhere: before the command, after it or after its arguments;\n"
"for run and elect, before COMMAND (its words are the command's; -- ends\n"
"the options).\n"
"RESOURCE is 1 to %d visible ASCII characters (the daemon's\n"
"locks.max_resource_len, by default).\n"
"\n"
"Options:\n", REDLOCKD_RESOURCE_DEFAULT_MAX);
    ctl_usage_opts(out, CTL_ANY);
    fputs("\nRun options (of run, elect and lock):\n", out);
    ctl_usage_opts(out, CTL_HOLDING);
    fputs("\nRelease options:\n", out);
    ctl_usage_opts(out, CTL_RELEASE);
    fputs("\nTop options:\n", out);
    ctl_usage_opts(out, CTL_TOP);
    fputs(
"\n"
"The command gets REDLOCKD_RESOURCE, REDLOCKD_TOKEN and REDLOCKD_FENCE;\n"
"with -r also REDLOCKD_RESOURCES (space-separated), with --limit\n"
"REDLOCKD_SLOT, with --shared REDLOCKD_MODE=shared, with --value\n"
"REDLOCKD_VALUE. It inherits the lock connection as file descriptor\n"
"$REDLOCKD_LOCK_FD. The lock stays held while any process of the\n"
"command's process group runs, even after redlockctl itself is killed (a\n"
"keeper process holds it), and is released as soon as the group is empty.\n"
"With several servers (-s repeated) the lock moves to another daemon when\n"
"its own restarts or dies, and the command runs on (REDLOCKD_TOKEN is then\n"
"out of date).\n"
"\n"
"Exit status:\n"
"  run, elect: the command's status (128+N if it died of signal N); 75 (or\n"
"       -E) when the lock is busy or the wait ran out, without running the\n"
"       command; 70 when the lease was lost and the command was stopped\n"
"       for it; 126/127 when the command can not be run.\n"
"  lock: 0 after SIGINT, SIGTERM or SIGHUP; 75 (or -E) as for run; 70 when\n"
"       the lease was lost.\n"
"  leader: 1 when nobody leads (no exclusive holder with a value).\n"
"  0 success; 64 usage or configuration error; 69 the daemon could not be\n"
"  reached or refused the request (release --force: not an operator, wrong\n"
"  admin password), or (ping) has no quorum of Redis nodes.\n",
          out);
}

/* ---- option parsing ----------------------------------------------------- */

/* Decimal digits only, at most max. */
static int ctl_number(const char *s, const struct ctl_opt *o,
                      unsigned long max, unsigned long *out)
{
    unsigned long v = 0;
    const char *p;

    for (p = s; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > max)
            break;
    }
    if (p == s || *p != '\0') {
        warnx("--%s: expected a number from 0 to %lu, got \"%s\"", o->name,
              max, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int ctl_number_u32(const char *s, const struct ctl_opt *o,
                          uint32_t *out)
{
    unsigned long v;

    if (ctl_number(s, o, UINT32_MAX, &v) < 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* A TIME option: milliseconds, or a number with a unit (2m, 1.5s), read
 * as the daemon reads ttl= (num.h), at most max ms. */
static int ctl_opt_duration(const char *s, const struct ctl_opt *o,
                            uint32_t max, uint32_t *out)
{
    enum proto_dur e = proto_parse_duration(s, strlen(s), out);

    if (e == PROTO_DUR_OK && *out <= max)
        return 0;
    warnx("--%s: expected milliseconds or a number with ms, s, m or h "
          "(500, 1.5s, 2m), at most %" PRIu32 " ms; \"%s\" %s", o->name,
          max, s, e == PROTO_DUR_OK ? "is more than that" : proto_dur_why(e));
    return -1;
}

/* --value: what the daemon stores (1 to its locks.max_value_len visible
 * ASCII characters, the longest limit a daemon may have checked here). */
static int ctl_opt_value(struct ctl *c, const char *s)
{
    size_t len = strlen(s);
    const char *p;

    for (p = s; *p >= 0x21 && *p <= 0x7e; p++)
        ;
    if (len == 0 || len > REDLOCKD_VALUE_MAX || *p != '\0') {
        warnx("--value: expected 1 to %d visible ASCII characters "
              "(the daemon's locks.max_value_len), no spaces",
              REDLOCKD_VALUE_DEFAULT_MAX);
        return -1;
    }
    c->value = s;
    return 0;
}

static int ctl_on_lost_mode(struct ctl *c, const char *s)
{
    if (strcmp(s, "kill") == 0)
        c->kill_on_lost = 1;
    else if (strcmp(s, "ignore") == 0)
        c->kill_on_lost = 0;
    else {
        warnx("--on-lost: expected kill or ignore, got \"%s\"", s);
        return -1;
    }
    return 0;
}

/* 0 parsed, 1 done (help/version printed), -1 usage error. */
static int ctl_option(struct ctl *c, const struct ctl_opt *o, const char *arg)
{
    unsigned long v;
    uint32_t u;

    c->given[o - ctl_opts] = true;
    switch (o->val) {
    case 's':
        if (c->nservers >= REDLOCKD_SERVERS_MAX) {
            warnx("-s: at most %d servers", REDLOCKD_SERVERS_MAX);
            return -1;
        }
        c->servers[c->nservers++] = arg;
        return 0;
    case OPT_DETACH:
        c->detach_set = 1;
        return ctl_opt_duration(arg, o, PROTO_DURATION_MAX_MS, &c->detach_ms);
    case OPT_PASSWORD_FILE: c->password_file = arg; return 0;
    case OPT_TLS_CA: c->tls_ca = arg; return 0;
    case OPT_TLS_CERT: c->tls_cert = arg; return 0;
    case OPT_TLS_KEY: c->tls_key = arg; return 0;
    case OPT_TLS_SERVER_NAME: c->tls_server_name = arg; return 0;
    case OPT_USER: c->user = arg; return 0;
    case OPT_NAME: c->name = arg; return 0;
    case OPT_JSON: c->json = 1; return 0;
    case 'h': ctl_usage(stdout); return 1;
    case 'V': printf("redlockctl %s\n", REDLOCKD_VERSION); return 1;
    case OPT_TIMEOUT:
        if (ctl_opt_duration(arg, o, INT32_MAX, &u) < 0)
            return -1;
        c->timeout_ms = u == 0 ? -1 : (int)u;
        return 0;
    case OPT_TTL:
        return ctl_opt_duration(arg, o, PROTO_DURATION_MAX_MS, &c->ttl_ms);
    case OPT_WAIT:
        c->wait_set = 1;
        return ctl_opt_duration(arg, o, PROTO_DURATION_MAX_MS, &c->wait_ms);
    case OPT_VALUE: return ctl_opt_value(c, arg);
    case OPT_ON_LOST: return ctl_on_lost_mode(c, arg);
    case 'q': c->quiet = 1; return 0;
    case OPT_SHARED: c->shared = 1; return 0;
    case OPT_LIMIT:
        if (ctl_number_u32(arg, o, &c->limit) < 0)
            return -1;
        if (c->limit == 0) {
            warnx("--limit: expected a number from 1 up");
            return -1;
        }
        return 0;
    case 'r':
        if (c->nresources >= CTL_MAX_RESOURCES) {
            warnx("-r: at most %d resources", CTL_MAX_RESOURCES);
            return -1;
        }
        c->resources[c->nresources++] = arg;
        return 0;
    case OPT_FORCE: c->force = 1; return 0;
    case OPT_ADMIN_PASSWORD_FILE: c->admin_password_file = arg; return 0;
    case OPT_KILL_AFTER:
        if (ctl_number(arg, o, 86400, &v) < 0)
            return -1;
        c->kill_after_s = (unsigned)v;
        return 0;
    case 'E':
        if (ctl_number(arg, o, 255, &v) < 0)
            return -1;
        c->conflict_exit = (int)v;
        return 0;
    case 'n':
        if (ctl_number(arg, o, 1000000, &v) < 0)
            return -1;
        if (v == 0) {
            warnx("-n: expected a number from 1 up");
            return -1;
        }
        c->iterations = (unsigned)v;
        return 0;
    }
    return -1;
}

/* ---- run: lock kinds ------------------------------------------------------
 * --shared, --limit K, -r R (several resources) and --value: taken with
 * redlockd_lockv, released with redlockd_unlockv. */

/* Does this run use a kind that redlockd_lock cannot ask for? */
static bool ctl_kinds(const struct ctl *c)
{
    return c->shared || c->limit || c->nresources > 1 || c->value;
}

/* Is resource one this run holds? */
static bool ctl_holds(const struct ctl *c, const char *first,
                      const char *resource)
{
    if (strcmp(first, resource) == 0)
        return true;
    for (size_t i = 0; i < c->nresources; i++)
        if (strcmp(c->resources[i], resource) == 0)
            return true;
    return false;
}

static int ctl_lockv(const struct ctl *c, struct redlockd *h,
                     uint32_t wait_ms, struct redlockd_lease *lease)
{
    struct redlockd_lock_opts o = {
        .ttl_ms = c->ttl_ms, .wait_ms = wait_ms,
        .mode = c->shared ? REDLOCKD_SHARED : REDLOCKD_EXCLUSIVE,
        .limit = c->limit, .value = c->value,
    };
    struct redlockd_grant g;
    char slot[16];
    int rc;

    rc = redlockd_lockv(h, c->resources, c->nresources, &o, &g);
    if (rc < 0)
        return rc;
    *lease = g.lease;
    /* For the command (the parent's environment is the child's). */
    if (c->limit) {
        snprintf(slot, sizeof(slot), "%" PRIu32, g.slot);
        setenv("REDLOCKD_SLOT", slot, 1);
    }
    if (c->shared)
        setenv("REDLOCKD_MODE", "shared", 1);
    if (c->nresources > 1) {
        size_t len = 0;
        for (size_t i = 0; i < c->nresources; i++)
            len += strlen(c->resources[i]) + 1;
        char *all = malloc(len);
        if (all) {
            all[0] = '\0';
            for (size_t i = 0; i < c->nresources; i++) {
                if (i)
                    strcat(all, " ");
                strcat(all, c->resources[i]);
            }
            setenv("REDLOCKD_RESOURCES", all, 1);
            free(all);
        }
    }
    return 0;
}

static int ctl_unlockv(const struct ctl *c, struct redlockd *h)
{
    return redlockd_unlockv(h, c->resources, c->nresources);
}

static void ctl_defaults(struct ctl *c)
{
    char host[256] = "";
    size_t i;

    memset(c, 0, sizeof(*c));
    c->timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    c->kill_on_lost = 1;
    c->kill_after_s = 5;
    c->conflict_exit = EX_TEMPFAIL;
    /* "redlockctl@host" tells an operator where a lock holder runs. */
    if (gethostname(host, sizeof(host) - 1) < 0)
        host[0] = '\0';
    snprintf(c->default_name, sizeof(c->default_name), "redlockctl%s%.53s",
             host[0] ? "@" : "", host);
    for (i = 0; c->default_name[i] != '\0'; i++) {
        unsigned char ch = (unsigned char)c->default_name[i];
        if (ch < 0x21 || ch > 0x7e)
            c->default_name[i] = '_';
    }
}

/* ---- connecting --------------------------------------------------------- */

/* The first line of path into buf (what: "password", "admin password"). */
static int ctl_read_secret(const char *path, const char *what, char *buf,
                           size_t size)
{
    FILE *f = fopen(path, "r");
    size_t len;

    if (!f) {
        warn("cannot open %s file %s", what, path);
        return -1;
    }
    if (!fgets(buf, (int)size, f))
        buf[0] = '\0';
    fclose(f);
    len = strcspn(buf, "\r\n");
    buf[len] = '\0';
    if (len == 0) {
        warnx("%s file %s is empty", what, path);
        return -1;
    }
    return 0;
}

static int ctl_read_password(struct ctl *c)
{
    return ctl_read_secret(c->password_file, "password", c->password,
                           sizeof(c->password));
}

/* A library failure as one line; returns the exit status it deserves. */
static int ctl_report(const char *what, int rc, const char *msg)
{
    int code = rc < 0 ? -rc : rc;
    /* The daemon's own refusals get their code word, for grep (the codes
     * added after the library's own, NOSESSION on, are the daemon's). */
    int refused = code < REDLOCKD_E_IO || code > REDLOCKD_E_INVALID;

    if (!what)
        warnx("%s", msg);
    else if (!refused)
        warnx("%s: %s", what, msg);
    else
        warnx("%s: %s (%s)", what, msg, redlockd_code_name(code));
    if (code == REDLOCKD_E_INVALID || code == REDLOCKD_E_ARG)
        return EX_USAGE;
    if (code == REDLOCKD_E_DENIED)
        return EX_NOPERM;
    return EX_UNAVAILABLE;
}

/* The addresses the library will use, for messages. */
static const char *ctl_server(const struct ctl *c)
{
    static char list[512];
    const char *env = getenv(REDLOCKD_SERVER_ENV);
    size_t len = 0;

    if (c->nservers == 0)
        return env && *env != '\0' ? env : REDLOCKD_DEFAULT_SERVER;
    list[0] = '\0';
    for (size_t i = 0; i < c->nservers && len < sizeof(list); i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s",
                                i > 0 ? "," : "", c->servers[i]);
    return list;
}

#define CTL_USER_ENV "REDLOCKD_USER"

/* --user, else $REDLOCKD_USER; NULL for none. */
static const char *ctl_user(const struct ctl *c)
{
    const char *env = getenv(CTL_USER_ENV);

    if (c->user)
        return c->user;
    return env && *env != '\0' ? env : NULL;
}

static int ctl_connect(struct ctl *c, struct redlockd_opts *o,
                       struct redlockd **h)
{
    struct redlockd_error err;
    int rc;

    if (c->password_file && ctl_read_password(c) < 0)
        return EX_USAGE;
    /* A user logs in with its password; the admin password is no
     * user's. */
    if (ctl_user(c) && c->admin_password[0] == '\0') {
        if (!c->password_file) {
            warnx("--user %s needs --password-file (its password)",
                  ctl_user(c));
            return EX_USAGE;
        }
        o->user = ctl_user(c);
    }
    o->servers = c->nservers > 0 ? c->servers : NULL;
    o->nservers = c->nservers;
    o->connect_timeout_ms = c->timeout_ms;
    o->io_timeout_ms = c->timeout_ms;
    o->name = c->name ? c->name : c->default_name;
    o->tls_ca_file = c->tls_ca;
    o->tls_cert_file = c->tls_cert;
    o->tls_key_file = c->tls_key;
    o->tls_server_name = c->tls_server_name;
    /* An operator's AUTH (release --force) makes a user's needless. */
    if (c->admin_password[0] != '\0')
        o->password = c->admin_password;
    else
        o->password = c->password_file ? c->password : NULL;
    rc = redlockd_connect(h, o, &err);
    /* Connect errors name the address already. */
    if (rc == -REDLOCKD_E_IO || rc == -REDLOCKD_E_IO_TIMEOUT)
        return ctl_report(NULL, rc, err.msg);
    if (rc == -REDLOCKD_E_AUTH && o->password == c->admin_password) {
        warnx("%s: the daemon refused the admin password: %s (AUTH)",
              ctl_server(c), err.msg);
        return EX_UNAVAILABLE;
    }
    if (rc < 0)
        return ctl_report(ctl_server(c), rc, err.msg);
    return 0;
}

/* ---- output ------------------------------------------------------------- */

#define CTL_TABLE_COLS 8

/* Rows of text cells, printed with aligned columns. */
struct ctl_table {
    size_t ncols;
    size_t nrows;
    char **cells;               /* nrows * ncols, owned */
    unsigned right;             /* bit i: right-align column i */
};

static void ctl_table_add(struct ctl_table *t, const char *const *row)
{
    char **grown;
    size_t i;

    grown = realloc(t->cells, (t->nrows + 1) * t->ncols * sizeof(*grown));
    if (!grown)
        errx(EX_OSERR, "out of memory");
    t->cells = grown;
    for (i = 0; i < t->ncols; i++) {
        char **cell = &t->cells[t->nrows * t->ncols + i];

        *cell = strdup(row[i] ? row[i] : "-");
        if (!*cell)
            errx(EX_OSERR, "out of memory");
    }
    t->nrows++;
}

static void ctl_table_fprint(FILE *out, struct ctl_table *t)
{
    size_t w[CTL_TABLE_COLS] = { 0 }, r, i, len;
    const char *cell;

    for (r = 0; r < t->nrows; r++) {
        for (i = 0; i < t->ncols; i++) {
            len = strlen(t->cells[r * t->ncols + i]);
            w[i] = len > w[i] ? len : w[i];
        }
    }
    for (r = 0; r < t->nrows; r++) {
        /* No trailing blanks: a row ends at its last non-empty cell. */
        size_t last = t->ncols;

        while (last > 1 && t->cells[r * t->ncols + last - 1][0] == '\0')
            last--;
        for (i = 0; i < last; i++) {
            cell = t->cells[r * t->ncols + i];
            if (i + 1 == last && !(t->right & (1u << i)))
                fprintf(out, "%s", cell);
            else if (t->right & (1u << i))
                fprintf(out, "%*s", (int)w[i], cell);
            else
                fprintf(out, "%-*s", (int)w[i], cell);
            fputs(i + 1 == last ? "\n" : "  ", out);
        }
    }
    for (r = 0; r < t->nrows * t->ncols; r++)
        free(t->cells[r]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = 0;
}

static void ctl_table_print(struct ctl_table *t)
{
    ctl_table_fprint(stdout, t);
}

/* A JSON scalar as text; NULL for a missing member. */
static const char *ctl_scalar(json_t *v, char *buf, size_t sz)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return json_string_value(v);
    case JSON_INTEGER:
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL: snprintf(buf, sz, "%g", json_real_value(v)); return buf;
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    default: return NULL;
    }
}

static const char *ctl_field(json_t *obj, const char *key, char *buf, size_t sz)
{
    json_t *v = json_object_get(obj, key);

    return !v ? NULL : ctl_scalar(v, buf, sz);
}

/* A member for printf: "-" when missing. */
static const char *ctl_text(json_t *obj, const char *key, char *buf, size_t sz)
{
    const char *s = ctl_field(obj, key, buf, sz);

    return s ? s : "-";
}

/* Milliseconds as "850 ms", "5.9 s", "3 min 20 s". */
static const char *ctl_duration(json_t *v, char *buf, size_t sz)
{
    json_int_t ms;

    if (!json_is_integer(v))
        return NULL;
    ms = json_integer_value(v);
    if (ms < 1000)
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " ms", ms);
    else if (ms < 60000)
        snprintf(buf, sz, "%.1f s", (double)ms / 1000.0);
    else
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " min %" JSON_INTEGER_FORMAT
                 " s", ms / 60000, ms / 1000 % 60);
    return buf;
}

static json_t *ctl_parse_json(const char *text)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);

    if (!root || !json_is_object(root)) {
        warnx("the daemon sent unreadable JSON: %s",
              !root ? jerr.text : "not an object");
        json_decref(root);
        return NULL;
    }
    return root;
}

static void ctl_print_holder(json_t *root)
{
    json_t *holder = json_object_get(root, "holder");
    json_t *name = json_object_get(holder, "name");
    json_t *daemon = json_object_get(holder, "daemon");
    json_t *value = json_object_get(holder, "value");
    char fence[32], held[32], session[64];

    if (!json_is_true(json_object_get(root, "held")))
        return;
    if (json_is_true(json_object_get(holder, "foreign"))) {
        printf("holder    another Redlock client (not a redlockd)\n");
        return;
    }
    if (!json_is_object(holder)) {
        printf("holder    unknown (no one token on a quorum of nodes)\n");
        return;
    }
    printf("holder    session %s",
           ctl_text(holder, "session", session, sizeof(session)));
    if (json_is_string(name))
        printf(" (%s)", json_string_value(name));
    if (json_is_string(daemon))
        printf(" on %s", json_string_value(daemon));
    if (ctl_field(holder, "fence", fence, sizeof(fence)))
        printf(", fence %s", fence);
    if (ctl_duration(json_object_get(holder, "held_ms"), held,
                     sizeof(held)))
        printf(", held for %s", held);
    if (json_is_string(value))
        printf(", value %s", json_string_value(value));
    putchar('\n');
}

static const char *ctl_pttl(json_t *v, char *buf, size_t sz)
{
    if (!json_is_integer(v))
        return NULL;
    if (json_integer_value(v) == -2)
        return "no key";
    if (json_integer_value(v) == -1)
        return "no expiry";
    snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " ms", json_integer_value(v));
    return buf;
}

/* "s3.mx9 (worker-2)": the session of a TOP holder or a STATUS waiter,
 * with its client name. */
static const char *ctl_session_name(json_t *who, char *buf, size_t sz)
{
    const char *session = json_string_value(json_object_get(who, "session"));
    const char *name = json_string_value(json_object_get(who, "name"));

    if (!session)
        return "-";
    snprintf(buf, sz, "%s%s%s%s", session, name ? " (" : "",
             name ? name : "", name ? ")" : "");
    return buf;
}

/* This daemon's waiters, as STATUS lists them, in the order they are
 * served: "waiting   s9.x (report-3) for 2.1 s", the others under it. */
static void ctl_print_waiting(json_t *waiting)
{
    char who[256], waited[64];
    json_t *w;
    size_t i;

    json_array_foreach(waiting, i, w) {
        printf("%-10s%s", i ? "" : "waiting", ctl_session_name(w, who,
                                                               sizeof(who)));
        if (ctl_duration(json_object_get(w, "waited_ms"), waited,
                         sizeof(waited)))
            printf(" for %s", waited);
        putchar('\n');
    }
}

static void ctl_print_status(json_t *root)
{
    struct ctl_table t = { .ncols = 3, .right = 1u << 2 };
    char b1[64], b2[64];
    json_t *node;
    size_t i;

    printf("resource  %s\n", ctl_text(root, "resource", b1, sizeof(b1)));
    printf("key       %s\n", ctl_text(root, "key", b1, sizeof(b1)));
    printf("held      %s\n",
           json_is_true(json_object_get(root, "held")) ? "yes" : "no");
    ctl_print_holder(root);
    if (ctl_field(root, "waiters", b1, sizeof(b1)))
        printf("waiters   %s\n", b1);
    ctl_print_waiting(json_object_get(root, "waiting"));
    if (json_array_size(json_object_get(root, "nodes")) == 0)
        return;
    putchar('\n');
    ctl_table_add(&t, (const char *const[]){ "NODE", "UP", "PTTL" });
    json_array_foreach(json_object_get(root, "nodes"), i, node) {
        const char *row[3] = {
            ctl_field(node, "node", b1, sizeof(b1)),
            json_is_true(json_object_get(node, "up")) ? "yes" : "no",
            ctl_pttl(json_object_get(node, "pttl"), b2, sizeof(b2)),
        };
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

static void ctl_print_sessions(json_t *root)
{
    struct ctl_table t = { .ncols = 6,
                           .right = (1u << 3) | (1u << 4) | (1u << 5) };
    char b[6][64];
    json_t *s;
    size_t i;

    ctl_table_add(&t, (const char *const[]){ "ID", "NAME", "PEER", "LOCKS",
                                             "WAITS", "IDLE" });
    json_array_foreach(json_object_get(root, "sessions"), i, s) {
        const char *row[6] = {
            ctl_field(s, "id", b[0], sizeof(b[0])),
            ctl_field(s, "name", b[1], sizeof(b[1])),
            ctl_field(s, "peer", b[2], sizeof(b[2])),
            ctl_field(s, "locks", b[3], sizeof(b[3])),
            ctl_field(s, "waits", b[4], sizeof(b[4])),
            ctl_duration(json_object_get(s, "idle_ms"), b[5], sizeof(b[5])),
        };
        if (json_is_null(json_object_get(s, "name")))
            row[1] = "-";
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

/* ---- inspection commands ------------------------------------------------ */

static int ctl_show(struct ctl *c, const char *json, void (*print)(json_t *))
{
    json_t *root;

    if (c->json) {
        printf("%s\n", json);
        return 0;
    }
    root = ctl_parse_json(json);
    if (!root)
        return EX_UNAVAILABLE;
    print(root);
    json_decref(root);
    return 0;
}

static int ctl_fetch_status(struct redlockd *h, const char *resource,
                            char **json)
{
    return redlockd_status(h, resource, json);
}

static int ctl_fetch_sessions(struct redlockd *h, const char *resource,
                              char **json)
{
    (void)resource;
    return redlockd_sessions(h, json);
}

/* The commands that print one JSON answer of the daemon. */
static const struct ctl_inspector {
    const char *cmd;
    int nargs;                  /* 1: takes RESOURCE */
    int (*fetch)(struct redlockd *h, const char *resource, char **json);
    void (*print)(json_t *root);
} ctl_inspectors[] = {
    { "status", 1, ctl_fetch_status, ctl_print_status },
    { "sessions", 0, ctl_fetch_sessions, ctl_print_sessions },
};

static const struct ctl_inspector *ctl_inspector_find(const char *cmd)
{
    size_t i;

    for (i = 0; i < sizeof(ctl_inspectors) / sizeof(ctl_inspectors[0]); i++) {
        if (strcmp(ctl_inspectors[i].cmd, cmd) == 0)
            return &ctl_inspectors[i];
    }
    return NULL;
}

static int ctl_inspect(struct ctl *c, const struct ctl_inspector *in,
                       const char *resource)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    char *json = NULL;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = in->fetch(h, resource, &json);
    if (rc < 0)
        rc = ctl_report(in->cmd, rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_show(c, json, in->print);
    free(json);
    redlockd_close(h);
    return rc;
}

static double ctl_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* What STATS says of the Redis nodes: ping's quorum check. */
struct ctl_votes {
    json_int_t voting;
    json_int_t quorum;
};

static int ctl_read_votes(struct redlockd *h, struct ctl_votes *v)
{
    char *json = NULL;
    json_t *root, *voting, *quorum;
    int rc;

    rc = redlockd_stats(h, &json);
    if (rc < 0)
        return ctl_report("ping: STATS", rc, redlockd_last_error(h)->msg);
    root = ctl_parse_json(json);
    free(json);
    if (!root)
        return EX_UNAVAILABLE;
    voting = json_object_get(root, "nodes_voting");
    quorum = json_object_get(root, "quorum");
    rc = 0;
    if (!json_is_integer(voting) || !json_is_integer(quorum)) {
        warnx("ping: STATS has no nodes_voting and quorum");
        rc = EX_UNAVAILABLE;
    } else {
        v->voting = json_integer_value(voting);
        v->quorum = json_integer_value(quorum);
    }
    json_decref(root);
    return rc;
}

static void ctl_ping_json(const struct redlockd_info *info,
                          const struct ctl_votes *v, double rtt)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:f}",
                          "server", info->server, "session", info->session,
                          "nodes", (json_int_t)info->nodes,
                          "quorum", v->quorum, "nodes_voting", v->voting,
                          "quorum_ok", v->voting >= v->quorum, "rtt_ms", rtt);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* PING for the round trip, then STATS: a daemon without a quorum of Redis
 * nodes answers, but can grant no lock, and a health check must say so. */
static int ctl_ping(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    const struct redlockd_info *info;
    struct ctl_votes v = { 0, 0 };
    struct redlockd *h;
    double t0, rtt;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    t0 = ctl_now_ms();
    rc = redlockd_ping(h);
    rtt = ctl_now_ms() - t0;
    if (rc < 0)
        rc = ctl_report("ping", rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_read_votes(h, &v);
    if (rc != 0) {
        redlockd_close(h);
        return rc;
    }
    info = redlockd_info(h);
    if (c->json)
        ctl_ping_json(info, &v, rtt);
    else
        printf("PONG from %s: session %s, %u Redis node%s, %" JSON_INTEGER_FORMAT
               " voting (quorum %" JSON_INTEGER_FORMAT "), %.3f ms\n",
               info->server, info->session, info->nodes,
               info->nodes == 1 ? "" : "s", v.voting, v.quorum, rtt);
    if (v.voting < v.quorum) {
        warnx("ping: no quorum: %" JSON_INTEGER_FORMAT " of %u Redis nodes "
              "voting, %" JSON_INTEGER_FORMAT " needed; no lock can be "
              "granted", v.voting, info->nodes, v.quorum);
        rc = EX_UNAVAILABLE;
    }
    redlockd_close(h);
    return rc;
}

static const char *ctl_json_str(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

static void ctl_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- stats: the short table -------------------------------------------- */

/*
 * `stats` shows what an operator looks at first, as `consul info` or
 * `etcdctl endpoint status -w table` do: the nodes with their state and
 * latency, sessions, locks held and waiting, grants and losses per second
 * (between two STATS CTL_STATS_SAMPLE_MS apart) and acquire latency
 * quantiles (from the daemon's histogram since it started). --json prints
 * the first STATS answer whole, at once.
 */
#define CTL_STATS_SAMPLE_MS 1000

static json_int_t ctl_int(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);

    return json_is_integer(v) ? json_integer_value(v) : 0;
}

/* Seconds as "850 us", "3.4 ms", "1.25 s". */
static const char *ctl_seconds(double s, char *buf, size_t sz)
{
    if (s < 0.001)
        snprintf(buf, sz, "%.0f us", s * 1e6);
    else if (s < 1.0)
        snprintf(buf, sz, "%.3g ms", s * 1e3);
    else
        snprintf(buf, sz, "%.3g s", s);
    return buf;
}

/*
 * The q-quantile of a STATS histogram ({"count", "le": [bounds],
 * "buckets": [cumulative counts, the last one +Inf]}), interpolated within
 * its bucket as Prometheus's histogram_quantile() does. Its text in buf,
 * "> 10 s" beyond the last bound; NULL when the histogram is empty or
 * unreadable.
 */
static const char *ctl_quantile(json_t *h, double q, char *buf, size_t sz)
{
    json_t *le = json_object_get(h, "le"), *b = json_object_get(h, "buckets");
    size_t n = json_array_size(le), i;
    double rank, prev = 0, lo = 0, cum, hi, v;
    char num[32];

    if (n == 0 || json_array_size(b) != n + 1 || ctl_int(h, "count") <= 0)
        return NULL;
    rank = q * (double)ctl_int(h, "count");
    for (i = 0; i < n; i++) {
        cum = (double)json_integer_value(json_array_get(b, i));
        hi = json_number_value(json_array_get(le, i));
        if (cum >= rank && cum > prev) {
            v = lo + (hi - lo) * (rank - prev) / (cum - prev);
            return ctl_seconds(v, buf, sz);
        }
        prev = cum;
        lo = hi;
    }
    snprintf(buf, sz, "> %s", ctl_seconds(lo, num, sizeof(num)));
    return buf;
}

static void ctl_print_stat_nodes(json_t *root)
{
    struct ctl_table t = { .ncols = 5, .right = (1u << 2) | (1u << 3) };
    char b[4][64];
    json_t *node;
    size_t i;

    ctl_table_add(&t, (const char *const[]){ "NODE", "STATE", "LATENCY",
                                             "MAX", "" });
    json_array_foreach(json_object_get(root, "nodes"), i, node) {
        const char *why = ctl_json_str(node, "why");
        const char *err = ctl_json_str(node, "last_error");
        const char *row[5] = {
            ctl_field(node, "node", b[0], sizeof(b[0])),
            ctl_field(node, "state", b[1], sizeof(b[1])),
            ctl_seconds(json_number_value(json_object_get(node, "latency_ms"))
                        / 1e3, b[2], sizeof(b[2])),
            ctl_seconds(json_number_value(json_object_get(node,
                        "latency_max_ms")) / 1e3, b[3], sizeof(b[3])),
            /* Why it does not vote, or what went wrong last. */
            why && *why ? why : err && *err ? err : "",
        };
        ctl_table_add(&t, row);
    }
    ctl_table_print(&t);
}

/* One "grants  12.5/s over 1.0 s (340 since start)" line. */
static void ctl_print_rate(const char *what, json_int_t before,
                           json_int_t after, double secs)
{
    printf("%-14s%.1f/s over %.1f s (%" JSON_INTEGER_FORMAT
           " since start)\n", what,
           secs > 0 ? (double)(after - before) / secs : 0.0, secs, after);
}

static void ctl_print_stats(json_t *before, json_t *root, double secs)
{
    json_t *acq = json_object_get(root, "acquisitions");
    json_t *hist = json_object_get(root, "acquire_seconds");
    json_int_t conns = ctl_int(root, "connections");
    static const double qs[] = { 0.5, 0.9, 0.99 };
    static const char *const qnames[] = { "p50", "p90", "p99" };
    char b[64], up[64];
    size_t i;

    printf("%-14sredlockd %s, up %s\n", "daemon",
           ctl_text(root, "version", b, sizeof(b)),
           ctl_duration(json_object_get(root, "uptime_ms"), up, sizeof(up))
               ? up : "-");
    printf("%-14s%" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT
           " voting, quorum %" JSON_INTEGER_FORMAT "\n", "nodes",
           ctl_int(root, "nodes_voting"), ctl_int(root, "nodes_total"),
           ctl_int(root, "quorum"));
    printf("%-14s%" JSON_INTEGER_FORMAT " (%" JSON_INTEGER_FORMAT
           " detached), %" JSON_INTEGER_FORMAT " connection%s\n", "sessions",
           ctl_int(root, "sessions"), ctl_int(root, "sessions_detached"),
           conns, conns == 1 ? "" : "s");
    printf("%-14s%" JSON_INTEGER_FORMAT " held, %" JSON_INTEGER_FORMAT
           " waiting\n", "locks", ctl_int(root, "locks_held"),
           ctl_int(root, "waiters"));
    ctl_print_rate("grants", ctl_int(json_object_get(before, "acquisitions"),
                                     "ok"), ctl_int(acq, "ok"), secs);
    ctl_print_rate("losses", ctl_int(before, "leases_lost"),
                   ctl_int(root, "leases_lost"), secs);
    printf("%-14s", "acquire");
    if (!ctl_quantile(hist, 0.5, b, sizeof(b))) {
        printf("no acquisitions yet\n");
    } else {
        for (i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
            printf("%s %s%s", qnames[i], ctl_quantile(hist, qs[i], b,
                                                      sizeof(b)),
                   i + 1 < sizeof(qs) / sizeof(qs[0]) ? ", " : "");
        printf(" (of %" JSON_INTEGER_FORMAT " since start)\n",
               ctl_int(hist, "count"));
    }
    if (json_array_size(json_object_get(root, "nodes")) > 0) {
        putchar('\n');
        ctl_print_stat_nodes(root);
    }
}

static int ctl_fetch_json(struct redlockd *h, json_t **root)
{
    char *json = NULL;
    int rc = redlockd_stats(h, &json);

    if (rc < 0)
        return ctl_report("stats", rc, redlockd_last_error(h)->msg);
    *root = ctl_parse_json(json);
    free(json);
    return *root ? 0 : EX_UNAVAILABLE;
}

static int ctl_stats(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    json_t *before = NULL, *after = NULL;
    char *json = NULL;
    double t0 = 0, t1 = 0;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    if (c->json) {
        rc = redlockd_stats(h, &json);
        if (rc < 0)
            rc = ctl_report("stats", rc, redlockd_last_error(h)->msg);
        else
            printf("%s\n", json);
        rc = rc < 0 ? rc : 0;
        free(json);
        redlockd_close(h);
        return rc;
    }
    t0 = ctl_now_ms();
    rc = ctl_fetch_json(h, &before);
    if (rc == 0) {
        ctl_sleep_ms(CTL_STATS_SAMPLE_MS);
        t1 = ctl_now_ms();
        rc = ctl_fetch_json(h, &after);
    }
    if (rc == 0)
        ctl_print_stats(before, after, (t1 - t0) / 1000.0);
    json_decref(before);
    json_decref(after);
    redlockd_close(h);
    return rc;
}

/* ---- locks: every lock of every session --------------------------------- */

/* By resource, then by session (shared holders of one resource). */
static int ctl_row_cmp(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *rx = ctl_json_str(x, "resource"), *ry = ctl_json_str(y, "resource");
    const char *sx = ctl_json_str(x, "session"), *sy = ctl_json_str(y, "session");
    int d = strcmp(rx ? rx : "", ry ? ry : "");

    return d != 0 ? d : strcmp(sx ? sx : "", sy ? sy : "");
}

/* One row: the held lock with its session's id, name and peer. */
static json_t *ctl_lock_row(json_t *sess, json_t *lock)
{
    json_t *mode = json_object_get(lock, "mode");
    json_t *name = json_object_get(sess, "name");
    json_t *row = json_object();

    json_object_set(row, "resource", json_object_get(lock, "resource"));
    json_object_set(row, "fence", json_object_get(lock, "fence"));
    json_object_set_new(row, "mode", json_is_string(mode) ? json_copy(mode)
                                     : json_string("exclusive"));
    json_object_set(row, "session", json_object_get(sess, "id"));
    json_object_set_new(row, "name", json_is_string(name) ? json_copy(name)
                                     : json_null());
    json_object_set(row, "peer", json_object_get(sess, "peer"));
    json_object_set(row, "held_ms", json_object_get(lock, "held_ms"));
    json_object_set(row, "validity", json_object_get(lock, "validity"));
    return row;
}

/* The rows of SESSIONS, sorted; NULL (said why) when it lists no locks. */
static json_t *ctl_lock_rows(json_t *root)
{
    json_t *sessions = json_object_get(root, "sessions"), *sess, *lock;
    json_t **rows = NULL, *out;
    size_t i, j, n = 0, cap = 0;

    if (!json_is_array(sessions)) {
        warnx("locks: SESSIONS has no \"sessions\" array");
        return NULL;
    }
    /* Our own session is always there, so a daemon that lists held locks
     * shows it with an empty "held". */
    json_array_foreach(sessions, i, sess) {
        json_t *held = json_object_get(sess, "held");

        if (!json_is_array(held)) {
            warnx("locks: this daemon's SESSIONS does not list held locks; "
                  "upgrade redlockd");
            for (j = 0; j < n; j++)
                json_decref(rows[j]);
            free(rows);
            return NULL;
        }
        json_array_foreach(held, j, lock) {
            if (n == cap) {
                json_t **grown;

                cap = cap ? 2 * cap : 16;
                grown = realloc(rows, cap * sizeof(*rows));
                if (!grown)
                    errx(EX_OSERR, "out of memory");
                rows = grown;
            }
            rows[n++] = ctl_lock_row(sess, lock);
        }
    }
    if (n > 0)
        qsort(rows, n, sizeof(*rows), ctl_row_cmp);
    out = json_array();
    for (i = 0; i < n; i++)
        json_array_append_new(out, rows[i]);
    free(rows);
    return out;
}

static void ctl_print_locks(json_t *rows)
{
    struct ctl_table t = { .ncols = 8,
                           .right = (1u << 1) | (1u << 6) | (1u << 7) };
    static const char *const keys[8] = { "resource", "fence", "mode",
                                         "session", "name", "peer",
                                         "held_ms", "validity" };
    char b[8][64];
    json_t *row;
    size_t i, k;

    ctl_table_add(&t, (const char *const[]){ "RESOURCE", "FENCE", "MODE",
                                             "SESSION", "NAME", "PEER",
                                             "HELD_MS", "VALIDITY" });
    json_array_foreach(rows, i, row) {
        const char *cells[8];

        for (k = 0; k < 8; k++) {
            cells[k] = ctl_field(row, keys[k], b[k], sizeof(b[k]));
            if (json_is_null(json_object_get(row, keys[k])))
                cells[k] = "-";
        }
        ctl_table_add(&t, cells);
    }
    ctl_table_print(&t);
}

static int ctl_locks(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct redlockd *h;
    json_t *root = NULL, *rows = NULL;
    char *json = NULL, *text;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_sessions(h, &json);
    if (rc < 0)
        rc = ctl_report("locks: SESSIONS", rc, redlockd_last_error(h)->msg);
    else if (!(root = ctl_parse_json(json)) || !(rows = ctl_lock_rows(root)))
        rc = EX_UNAVAILABLE;
    else if (c->json) {
        text = json_dumps(rows, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!text)
            errx(EX_OSERR, "out of memory");
        printf("%s\n", text);
        free(text);
    } else {
        ctl_print_locks(rows);
    }
    json_decref(rows);
    json_decref(root);
    free(json);
    redlockd_close(h);
    return rc;
}

/* ---- top: what is held and waited for longest ----------------------------
 * `top` asks the daemon's TOP every CTL_TOP_REFRESH_MS and shows its
 * resources as top(1) shows processes: the longest wait first, then the
 * longest hold. On a terminal it takes the alternate screen, redraws it in
 * place, fits the rows to its height and each line to its width, and
 * reads keys without echo (q quits); the screen, the cursor and the
 * terminal's modes are put back however it ends (q, -n, SIGINT, SIGTERM,
 * SIGHUP, a lost daemon). Anywhere else (a pipe, a file) it writes plain
 * text, no escape codes: each refresh a block ending in a blank line, or
 * with --json TOP's answer, one line each. -n N stops after N refreshes. */
#define CTL_TOP_REFRESH_MS 1000
#define CTL_TOP_MAX 100                 /* the most TOP lists */
#define CTL_TOP_HEAD_LINES 3            /* title, blank, column names */

struct ctl_top {
    bool screen;                /* stdout is a terminal: redraw in place */
    bool keys;                  /* stdin too: its keys are read */
    struct termios saved;       /* stdin's modes before, when keys */
    unsigned rows, cols;
};

static volatile sig_atomic_t ctl_top_stop, ctl_top_resized;

static void ctl_top_on_signal(int sig)
{
    if (sig == SIGWINCH)
        ctl_top_resized = 1;
    else
        ctl_top_stop = 1;
}

/* The handlers, with the signals blocked but in ppoll (no wake-up lost
 * between a look at the flags and the wait); *old gets the mask before. */
static void ctl_top_signals(sigset_t *old)
{
    static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGWINCH };
    struct sigaction sa = { .sa_handler = ctl_top_on_signal };
    sigset_t block;

    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        sigaddset(&block, sigs[i]);
        sigaction(sigs[i], &sa, NULL);
    }
    sigprocmask(SIG_BLOCK, &block, old);
}

static void ctl_top_size(struct ctl_top *t)
{
    struct winsize ws;

    t->rows = 24;
    t->cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 &&
        ws.ws_col > 0) {
        t->rows = ws.ws_row;
        t->cols = ws.ws_col;
    }
}

/* A terminal: keys one by one without echo, the alternate screen, no
 * cursor. */
static void ctl_top_screen_on(struct ctl_top *t)
{
    struct termios raw;

    t->screen = isatty(STDOUT_FILENO);
    t->keys = t->screen && isatty(STDIN_FILENO) &&
              tcgetattr(STDIN_FILENO, &t->saved) == 0;
    if (t->keys) {
        raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    if (t->screen) {
        fputs("\033[?1049h\033[?25l", stdout);
        ctl_top_size(t);
    }
}

static void ctl_top_screen_off(const struct ctl_top *t)
{
    if (t->screen)
        fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    if (t->keys)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

/* How many resources to ask for: as many as fit on the screen. */
static uint32_t ctl_top_limit(const struct ctl_top *t)
{
    unsigned fit;

    if (!t->screen)
        return CTL_TOP_MAX;
    fit = t->rows > CTL_TOP_HEAD_LINES + 1 ? t->rows - CTL_TOP_HEAD_LINES - 1
                                           : 1;
    return fit < CTL_TOP_MAX ? fit : CTL_TOP_MAX;
}

/* One refresh as text: the title, then a table of TOP's resources. */
static void ctl_top_frame(FILE *out, json_t *root, bool screen)
{
    struct ctl_table tb = { .ncols = 7,
                            .right = (1u << 1) | (1u << 2) | (1u << 3) |
                                     (1u << 4) };
    json_t *list = json_object_get(root, "resources"), *r;
    char b[7][128], clock[16];
    time_t now = time(NULL);
    size_t i;

    strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
    fprintf(out, "redlockd %s: %" JSON_INTEGER_FORMAT " resource%s held or "
            "waited for, %zu shown, %s%s\n\n",
            ctl_text(root, "daemon", b[0], sizeof(b[0])),
            ctl_int(root, "total"), ctl_int(root, "total") == 1 ? "" : "s",
            json_array_size(list), clock, screen ? " (q: quit)" : "");
    ctl_table_add(&tb, (const char *const[]){ "RESOURCE", "WAITERS",
                                              "LONGEST WAIT", "HOLDERS",
                                              "HELD FOR", "HOLDER", "MODE" });
    json_array_foreach(list, i, r) {
        json_t *holder = json_object_get(r, "holder");
        const char *row[7] = {
            ctl_text(r, "resource", b[0], sizeof(b[0])),
            ctl_text(r, "waiters", b[1], sizeof(b[1])),
            ctl_int(r, "waiters") ? ctl_duration(json_object_get(
                r, "waited_ms"), b[2], sizeof(b[2])) : "-",
            ctl_text(r, "holders", b[3], sizeof(b[3])),
            json_is_object(holder) ? ctl_duration(json_object_get(
                holder, "held_ms"), b[4], sizeof(b[4])) : "-",
            ctl_session_name(holder, b[5], sizeof(b[5])),
            ctl_text(r, "mode", b[6], sizeof(b[6])),
        };
        ctl_table_add(&tb, row);
    }
    ctl_table_fprint(out, &tb);
}

/* The frame over the last one: from the top left, each line cut to the
 * width and cleared to its end, the rest of the screen cleared. */
static void ctl_top_draw(const struct ctl_top *t, const char *text)
{
    unsigned row = 0;

    fputs("\033[H", stdout);
    while (*text && row + 1 < t->rows) {
        size_t len = strcspn(text, "\n");

        fprintf(stdout, "%.*s\033[K\n",
                (int)(len < t->cols ? len : t->cols), text);
        text += len + (text[len] == '\n');
        row++;
    }
    fputs("\033[J", stdout);
}

static int ctl_top_show(const struct ctl *c, const struct ctl_top *t,
                        const char *json)
{
    json_t *root;
    char *text = NULL;
    size_t len = 0;
    FILE *mem;

    if (c->json) {
        printf("%s\n", json);
        return 0;
    }
    if (!(root = ctl_parse_json(json)))
        return EX_UNAVAILABLE;
    if (!t->screen) {
        ctl_top_frame(stdout, root, false);
        putchar('\n');
    } else if ((mem = open_memstream(&text, &len))) {
        ctl_top_frame(mem, root, true);
        fclose(mem);
        ctl_top_draw(t, text);
        free(text);
    }
    json_decref(root);
    return 0;
}

/* Until the next refresh is due: false to stop (q, a signal). A key other
 * than q, or a new size, redraws at once. */
static bool ctl_top_wait(struct ctl_top *t, const sigset_t *mask)
{
    double until = ctl_now_ms() + CTL_TOP_REFRESH_MS;
    struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
    char key;

    while (!ctl_top_stop) {
        long left = (long)(until - ctl_now_ms());
        struct timespec ts = { left / 1000, left % 1000 * 1000000L };

        if (ctl_top_resized) {
            ctl_top_resized = 0;
            ctl_top_size(t);
            return true;
        }
        if (left <= 0)
            return true;
        if (ppoll(&p, t->keys ? 1 : 0, &ts, mask) <= 0)
            continue;
        if (read(STDIN_FILENO, &key, 1) == 1)
            return key != 'q' && key != 'Q';
    }
    return false;
}

static int ctl_top(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct ctl_top t = { 0 };
    struct redlockd *h;
    sigset_t mask;
    char *json;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    ctl_top_signals(&mask);
    if (!c->json)
        ctl_top_screen_on(&t);
    for (unsigned n = 0; rc == 0 && !ctl_top_stop; ) {
        json = NULL;
        rc = redlockd_top(h, ctl_top_limit(&t), &json);
        if (rc < 0) {
            ctl_top_screen_off(&t);
            t.screen = t.keys = false;
            rc = ctl_report("top", rc, redlockd_last_error(h)->msg);
        } else {
            rc = ctl_top_show(c, &t, json);
        }
        free(json);
        fflush(stdout);
        if (rc != 0 || (c->iterations && ++n >= c->iterations) ||
            !ctl_top_wait(&t, &mask))
            break;
    }
    ctl_top_screen_off(&t);
    redlockd_close(h);
    return rc;
}

/* ---- release --force: FORCEUNLOCK ---------------------------------------- */

#define CTL_ADMIN_PASSWORD_ENV "REDLOCKD_ADMIN_PASSWORD"

static int ctl_admin_password(struct ctl *c)
{
    const char *env = getenv(CTL_ADMIN_PASSWORD_ENV);

    if (c->admin_password_file)
        return ctl_read_secret(c->admin_password_file, "admin password",
                               c->admin_password, sizeof(c->admin_password));
    if (env && *env != '\0') {
        if (strlen(env) >= sizeof(c->admin_password)
            || strpbrk(env, " \t\r\n")) {
            warnx("$%s is not one word of at most %zu bytes",
                  CTL_ADMIN_PASSWORD_ENV, sizeof(c->admin_password) - 1);
            return -1;
        }
        strcpy(c->admin_password, env);
    }
    /* None: FORCEUNLOCK goes out anyway, and the daemon's NOAUTH says
     * why it is refused. */
    return 0;
}

static int ctl_release(struct ctl *c, int argc, char **argv)
{
    struct redlockd_opts o = { 0 };
    const struct redlockd_error *e;
    struct redlockd *h;
    int rc;

    if (!c->force) {
        warnx("release: a lock lives as long as the session that took it "
              "(run releases its lock when the command exits); to delete "
              "someone else's lock as an operator: release --force RESOURCE");
        return EX_USAGE;
    }
    if (argc != 1) {
        warnx("release: expected one RESOURCE");
        return EX_USAGE;
    }
    /* An admin user (--user) needs no admin password, unless one is
     * named outright. */
    if ((!ctl_user(c) || c->admin_password_file) && ctl_admin_password(c) < 0)
        return EX_USAGE;
    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_force_unlock(h, argv[0]);
    e = redlockd_last_error(h);
    if (rc == -REDLOCKD_E_NOAUTH) {
        warnx("release: not an operator: the daemon needs "
              "auth.admin_password and this command the same password "
              "(--admin-password-file or $%s): %s (NOAUTH)",
              CTL_ADMIN_PASSWORD_ENV, e->msg);
        rc = EX_UNAVAILABLE;
    } else if (rc < 0) {
        rc = ctl_report("release", rc, e->msg);
    } else {
        if (c->json) {
            json_t *j = json_pack("{s:s, s:i}", "resource", argv[0],
                                  "nodes", rc);
            char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER)
                           : NULL;

            if (!text)
                errx(EX_OSERR, "out of memory");
            printf("%s\n", text);
            free(text);
            json_decref(j);
        } else
            printf("released %s on %d node(s)\n", argv[0], rc);
        rc = 0;
    }
    redlockd_close(h);
    return rc;
}

/* ---- run ---------------------------------------------------------------- */

struct ctl_run {
    struct ctl *c;
    const char *resource;
    struct redlockd *h;
    /* Our own close-on-exec duplicate of the lock connection: once the
     * library gave the connection up, shutdown() on it ends it for the
     * command's copies too. -1: none. */
    int conn;
    struct keeper_group g;      /* the command and its process group */
    int lost;                   /* set by ctl_on_lost, or the deadline */
    int lost_noticed;           /* acted on (message, SIGTERM) */
    char lost_reason[160];
    double refresh_every;       /* ttl/3 within the CTL_REFRESH_* bounds */
    double next_refresh;
    double stop_early;          /* how long before the deadline to stop */
    bool not_taken;             /* the lock was busy or refused */
    /* When the work the lock guarded ended (the command's group was seen
     * empty; lock: told to stop), and the earliest deadline of the leases
     * then (-1: none known): a loss the release reports afterwards is
     * judged against these, not against when the release came back. */
    int64_t ended_ms;
    int64_t covered_until;
};

/* The library's own reasons for a lost lease, for the message. */
static const char *ctl_lost_why(const char *reason)
{
    if (strcmp(reason, "deadline") == 0)
        return "it was not confirmed again before its deadline";
    if (strcmp(reason, "adopt") == 0)
        return "no daemon could take it over after the connection was lost";
    if (strcmp(reason, "disconnected") == 0)
        return "the session ended with the connection";
    return "the daemon could not keep the lease";
}

static void ctl_on_lost(const char *resource, uint64_t fence,
                        const char *reason, void *ud)
{
    struct ctl_run *r = ud;

    (void)fence;
    /* The library gave the connection up for good (a handle that does
     * not reconnect; one that does shuts a lost connection down itself):
     * the command's inherited copies must not keep the daemon's session,
     * and with it the lease, alive. */
    if (!resource && r->conn >= 0)
        (void)shutdown(r->conn, SHUT_RDWR);
    if (r->lost)
        return;
    if (!resource)
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "the connection to the daemon was lost");
    else if (ctl_holds(r->c, r->resource, resource))
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "%s%s%s (%s)", ctl_lost_why(reason),
                 r->c->nresources > 1 ? ", on " : "",
                 r->c->nresources > 1 ? resource : "", reason);
    else
        return;
    r->lost = 1;
}

/* In the child: hand the lock connection down to the command. Its number
 * goes into REDLOCKD_LOCK_FD; one of 0-2 (redlockctl started with stdio
 * closed) is moved up first, the command's stdio is not the place for it.
 * -1 on failure. */
static int ctl_child_lock_fd(int fd)
{
    char num[16];

    if (fd < 3) {
        fd = fcntl(fd, F_DUPFD, 3);
        if (fd < 0)
            return -1;
    } else if (fcntl(fd, F_SETFD, 0) < 0) {
        return -1;
    }
    snprintf(num, sizeof(num), "%d", fd);
    return setenv(CTL_LOCK_FD_ENV, num, 1);
}

/* What the command inherits, set in the child before exec. */
struct ctl_child {
    const struct redlockd_lease *lease;
    const char *value;          /* --value, or NULL */
    int lock_fd;
};

static int ctl_child_setup(void *ud)
{
    const struct ctl_child *ch = ud;
    char fence[24];

    snprintf(fence, sizeof(fence), "%" PRIu64, ch->lease->fence);
    if (setenv("REDLOCKD_RESOURCE", ch->lease->resource, 1) < 0
        || setenv("REDLOCKD_TOKEN", ch->lease->token, 1) < 0
        || setenv("REDLOCKD_FENCE", fence, 1) < 0
        || (ch->value && setenv("REDLOCKD_VALUE", ch->value, 1) < 0)) {
        warn("setenv");
        return -1;
    }
    if (ctl_child_lock_fd(ch->lock_fd) < 0) {
        warn("cannot pass the lock connection on");
        return -1;
    }
    return 0;
}

/* In the keeper: the command, in a process group of its own. No
 * parent-death signal: the command outlives us (even our SIGKILL), and
 * keeps the lock through the connection it inherits. */
static int ctl_spawn(struct ctl_run *r, const struct redlockd_lease *lease,
                     char **argv)
{
    struct ctl_child ch = { .lease = lease, .value = r->c->value,
                            .lock_fd = redlockd_fd(r->h) };

    if (ch.lock_fd < 0) {
        warnx("lost the connection to the daemon before the command started");
        return -1;
    }
    r->conn = fcntl(ch.lock_fd, F_DUPFD_CLOEXEC, 3);
    if (r->conn < 0) {
        warn("dup");
        return -1;
    }
    if (keeper_spawn(&r->g, argv, ctl_child_setup, &ch) < 0) {
        warn("fork");
        return -1;
    }
    return 0;
}

/* Is there more to wait for? The command itself, then the rest of its
 * process group: the lock is the group's while any of it runs (a
 * background job the command left, a worker that closed its
 * descriptors). After a lost lease there is nothing to keep; with
 * --on-lost kill, SIGTERM went to all of the group and each process has
 * --kill-after to finish before SIGKILL. */
static bool ctl_waiting(struct ctl_run *r)
{
    if (!r->g.exited)
        return true;
    if (r->lost_noticed && (!r->c->kill_on_lost || r->g.killed))
        return false;
    if (r->lost && !r->lost_noticed)
        return false;
    return keeper_group_left(&r->g);
}

static void ctl_handle_signals(struct ctl_run *r)
{
    int sig;

    /* To the command's group for as long as the lock is held for it:
     * while the command runs, and after it exited while others of its
     * group run on (keeper_kill sends nothing once the group is gone). */
    while ((sig = keeper_signal_next()) > 0) {
        if (sig == SIGCHLD)
            keeper_reap(&r->g);
        else
            keeper_kill(&r->g, sig);
    }
}

/* The lease is gone: the command no longer has the right to run. */
static void ctl_notice_lost(struct ctl_run *r)
{
    const struct redlockd_error *e = redlockd_last_error(r->h);

    /* The command itself may have exited already while others of its
     * group run on: they are told too. */
    if (!r->lost || r->lost_noticed || !keeper_group_left(&r->g))
        return;
    r->lost_noticed = 1;
    if (!r->c->kill_on_lost) {
        warnx("lost the lock on %s: %s%s%s; --on-lost ignore: the command "
              "goes on", r->resource, r->lost_reason, e->code ? ": " : "",
              e->msg);
        return;
    }
    warnx("lost the lock on %s: %s%s%s; stopping the command's process "
          "group (SIGTERM, SIGKILL after %u s)", r->resource, r->lost_reason,
          e->code ? ": " : "", e->msg, r->c->kill_after_s);
    keeper_stop(&r->g, (int64_t)r->c->kill_after_s * 1000);
}

/* Failures reach us through ctl_on_lost; a lost connection leaves the
 * handle unconnected, and ctl_timers reconnects. (A daemon shutting down
 * is not left before it closes the connection: closing it ourselves then
 * would release the lock.) */
static void ctl_handle_daemon(struct ctl_run *r)
{
    (void)redlockd_poll_events(r->h, 0);
    ctl_notice_lost(r);
}

/* When the command must have been told to stop, unless the lease is
 * confirmed again: stop_early before its deadline. false once the lease is
 * not held any more. */
static bool ctl_stop_at(const struct ctl_run *r, double *at)
{
    int64_t deadline;

    if (redlockd_lease_deadline(r->h, r->resource, &deadline) != 0)
        return false;
    *at = (double)deadline - r->stop_early;
    return true;
}

/* The next confirmation: refresh_every after `sent`, or halfway to the
 * stop time when that comes first. */
static void ctl_schedule_refresh(struct ctl_run *r, double sent)
{
    double every = r->refresh_every, stop;

    if (ctl_stop_at(r, &stop) && (stop - sent) / 2 < every)
        every = (stop - sent) / 2;
    r->next_refresh = sent + (every > CTL_REFRESH_MIN_MS ? every
                                                         : CTL_REFRESH_MIN_MS);
}

/* Confirm the lease, or (not connected) reconnect: not waiting past the
 * stop time, and while reconnecting not past a slice of it either. A lost
 * lease reaches us through ctl_on_lost. */
static void ctl_refresh(struct ctl_run *r)
{
    double sent = ctl_now_ms(), stop, within;

    if (!ctl_stop_at(r, &stop) || stop <= sent)
        return;
    within = stop - sent;
    if (redlockd_fd(r->h) < 0 && within > CTL_RECONNECT_SLICE_MS)
        within = CTL_RECONNECT_SLICE_MS;
    if (redlockd_refresh_within(r->h, (int)within) == -REDLOCKD_E_IO_TIMEOUT)
        snprintf(r->lost_reason, sizeof(r->lost_reason),
                 "the daemon did not confirm the lease");
    ctl_schedule_refresh(r, sent);
}

/* The stop time came without a confirmation (a daemon that stalls says
 * nothing): soon another holder may have the lock. */
static void ctl_check_deadline(struct ctl_run *r)
{
    double stop, left;

    if (r->lost || !ctl_stop_at(r, &stop) || ctl_now_ms() < stop)
        return;
    left = stop + r->stop_early - ctl_now_ms();
    snprintf(r->lost_reason, sizeof(r->lost_reason),
             "the daemon did not confirm the lease in time (its deadline %s "
             "%.0f ms %s)", left >= 0 ? "is" : "passed",
             left >= 0 ? left : -left, left >= 0 ? "away" : "ago");
    r->lost = 1;
}

/* The lease's own timers: its deadline, its refresh (or a reconnection).
 * A deadline passed while we were not looking (the keeper itself was
 * stopped) is not undone by a refresh: the command ran unconfirmed. */
static void ctl_lease_timers(struct ctl_run *r)
{
    double now = ctl_now_ms();

    ctl_check_deadline(r);
    if (!r->lost && (now >= r->next_refresh || redlockd_fd(r->h) < 0))
        ctl_refresh(r);
    ctl_check_deadline(r);
}

static void ctl_timers(struct ctl_run *r)
{
    keeper_timers(&r->g);
    ctl_lease_timers(r);
    ctl_notice_lost(r);
}

static int ctl_poll_timeout(const struct ctl_run *r)
{
    double now = ctl_now_ms(), next = -1, stop;

    if (!r->lost) {
        next = r->next_refresh;
        if (ctl_stop_at(r, &stop) && stop < next)
            next = stop;
    }
    /* Reconnecting: the library paces the attempts. */
    if (!r->lost && redlockd_fd(r->h) < 0
        && (next < 0 || now + CTL_RECONNECT_POLL_MS < next))
        next = now + CTL_RECONNECT_POLL_MS;
    /* SIGKILL due, processes of the group that are not our children. */
    return keeper_timeout(&r->g, next < 0 ? -1
                                 : next <= now ? 0 : (int)(next - now) + 1);
}

/* From the grant on: when to confirm the lease, and how early to give up
 * on it (see CTL_REFRESH_MAX_MS). */
static void ctl_follow(struct ctl_run *r, uint32_t ttl)
{
    r->refresh_every = ttl / 3.0;
    if (r->refresh_every > CTL_REFRESH_MAX_MS)
        r->refresh_every = CTL_REFRESH_MAX_MS;
    r->stop_early = ttl / 20.0;
    if (r->stop_early > CTL_STOP_EARLY_MAX_MS)
        r->stop_early = CTL_STOP_EARLY_MAX_MS;
    ctl_schedule_refresh(r, ctl_now_ms());
}

static void ctl_wait_child(struct ctl_run *r, uint32_t ttl)
{
    struct pollfd p[2];
    nfds_t n;

    ctl_follow(r, ttl);
    while (ctl_waiting(r)) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(r->h);
        p[1].events = POLLIN;
        n = r->lost ? 1 : 2;
        if (poll(p, n, ctl_poll_timeout(r)) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0)
            ctl_handle_signals(r);
        if (n == 2 && p[1].revents != 0)
            ctl_handle_daemon(r);
        ctl_timers(r);
    }
}

/* The work the lock guarded is over: its time, and how long the leases
 * were sure to be ours then (see struct ctl_run). */
static void ctl_work_ended(struct ctl_run *r)
{
    int64_t deadline;

    r->ended_ms = keeper_now_ms();
    r->covered_until = -1;
    for (size_t i = 0; i < r->c->nresources; i++) {
        if (redlockd_lease_deadline(r->h, r->c->resources[i], &deadline)
            != 0) {
            r->covered_until = -1;
            return;
        }
        if (r->covered_until < 0 || deadline < r->covered_until)
            r->covered_until = deadline;
    }
}

/* Release the lock, after ctl_work_ended; false when it turned out lost
 * before the work ended (said so, as having happened before `when`). A
 * loss found only after that (a release answered late, past the deadline
 * that still covered the work's end) cost the work nothing: said, not
 * counted. A release that fails otherwise is said, and left to the
 * daemon. */
static bool ctl_unlock(struct ctl_run *r, const char *when)
{
    int rc = ctl_kinds(r->c) ? ctl_unlockv(r->c, r->h)
                             : redlockd_unlock(r->h, r->resource);

    if (rc == -REDLOCKD_E_LOST && r->ended_ms < r->covered_until) {
        warnx("the lease on %s ran out before its release reached the "
              "daemon, but only after %s (%" PRId64 " ms before its "
              "deadline)", r->resource, when,
              r->covered_until - r->ended_ms);
        return true;
    }
    if (rc == -REDLOCKD_E_LOST) {
        warnx("the lease on %s was lost before %s", r->resource, when);
        return false;
    }
    if (rc < 0)
        warnx("could not release %s (the daemon releases it as the "
              "session ends%s): %s", r->resource,
              redlockd_fd(r->h) < 0 ? ", when its detach time runs out" : "",
              redlockd_last_error(r->h)->msg);
    return true;
}

/* After the command: release the lock and pick the exit status. */
static int ctl_finish(struct ctl_run *r)
{
    int lost = r->lost, status = keeper_exit_status(r->g.status);

    if (!lost) {
        ctl_work_ended(r);
        lost = !ctl_unlock(r, "the command ended");
    } else if (!r->lost_noticed) {
        warnx("lost the lock on %s as the command ended: %s", r->resource,
              r->lost_reason);
    }
    if (lost && r->c->kill_on_lost) {
        /* Anything the command left behind in its group goes too (after a
         * lease lost while it ran, what --kill-after left of it). */
        keeper_kill(&r->g, SIGKILL);
        return CTL_EXIT_LOST;
    }
    return status;
}

/* One LOCK, waiting up to wait_ms. */
static int ctl_take(const struct ctl_run *r, uint32_t wait_ms,
                    struct redlockd_lease *lease)
{
    const struct ctl *c = r->c;

    return ctl_kinds(c) ? ctl_lockv(c, r->h, wait_ms, lease)
                        : redlockd_lock(r->h, r->resource, c->ttl_ms, wait_ms,
                                        1, lease);
}

/* The daemons the handle may go to: -s, else $REDLOCKD_SERVER's list (as
 * the library reads them). */
static size_t ctl_nservers(const struct ctl *c)
{
    const char *env = getenv(REDLOCKD_SERVER_ENV);
    size_t n = 1;

    if (c->nservers > 0)
        return c->nservers;
    for (; env && *env != '\0'; env++)
        n += *env == ',';
    return n;
}

/*
 * A LOCK that its daemon could not answer for good, worth sending again
 * through the next daemon when there is one: refused because the daemon
 * is stopping (SHUTDOWN: the handle leaves it now rather than wait for it
 * to close the connection), or cut off by a broken connection (IO: its
 * outcome unknown; a grant that did happen stays with the old session,
 * which the resume releases or its daemon ends), once the handle is
 * connected again.
 */
static bool ctl_lock_again(const struct ctl_run *r, int rc)
{
    if (ctl_nservers(r->c) < 2)
        return false;
    if (rc == -REDLOCKD_E_SHUTDOWN)
        return redlockd_reconnect(r->h) == 0;
    return rc == -REDLOCKD_E_IO && redlockd_fd(r->h) >= 0;
}

/* ctl_take, sent again through the next daemon (ctl_lock_again) within
 * what is left of wait_ms: once that has run out, no more often than
 * there are daemons. */
static int ctl_take_failover(const struct ctl_run *r, uint32_t wait_ms,
                             struct redlockd_lease *lease)
{
    int64_t until = keeper_now_ms() + wait_ms, left = wait_ms;
    size_t late = 0;
    int rc;

    for (;;) {
        rc = ctl_take(r, left > 0 ? (uint32_t)left : 0, lease);
        if (rc == 0 || !ctl_lock_again(r, rc))
            return rc;
        left = until - keeper_now_ms();
        if (left <= 0 && ++late > ctl_nservers(r->c))
            return rc;
    }
}

/* elect without --wait: LOCKs waiting CTL_CAMPAIGN_ROUND_MS each until one
 * is granted. A LOCK cut off by a broken connection (its outcome unknown:
 * a grant that did happen is released by a resume, else with the old
 * session) is sent again once the handle is back. */
static int ctl_campaign(const struct ctl_run *r, struct redlockd_lease *lease)
{
    int rc;

    do {
        rc = ctl_take_failover(r, CTL_CAMPAIGN_ROUND_MS, lease);
    } while (rc == -REDLOCKD_E_TIMEOUT
             || (rc == -REDLOCKD_E_IO && redlockd_fd(r->h) >= 0));
    return rc;
}

static int ctl_lock_status(struct ctl_run *r, struct redlockd_lease *lease)
{
    const struct ctl *c = r->c;
    int rc;

    rc = c->campaign ? ctl_campaign(r, lease)
                     : ctl_take_failover(r, c->wait_ms, lease);
    if (rc == 0)
        return 0;
    r->not_taken = true;
    if (rc == -REDLOCKD_E_BUSY || rc == -REDLOCKD_E_TIMEOUT) {
        if (!c->quiet && rc == -REDLOCKD_E_BUSY)
            warnx("%s is locked by someone else", r->resource);
        else if (!c->quiet)
            warnx("%s is still locked after waiting %" PRIu32 " ms",
                  r->resource, c->wait_ms);
        return c->conflict_exit;
    }
    return ctl_report("lock", rc, redlockd_last_error(r->h)->msg);
}

/* Take the lock: true when taken, else false with the exit status in
 * *status (the conflict status may be 0 with -E 0, so it cannot double as
 * the "taken" signal). */
static bool ctl_lock(struct ctl_run *r, struct redlockd_lease *lease,
                     int *status)
{
    *status = ctl_lock_status(r, lease);
    return !r->not_taken;
}

/* The visible redlockctl, once the keeper runs: its exit status is ours
 * (the command's, or 70...), so that shells and scripts see what they
 * would without a keeper. A keeper killed by a signal (an operator's
 * SIGKILL, the OOM killer) leaves the command to the connection it
 * inherited, which keeps the lock while some process holds it. */
static int ctl_relay(pid_t keeper)
{
    int st = keeper_relay(keeper);

    if (WIFSIGNALED(st)) {
        warnx("the keeper (pid %ld) that held the lock was killed by signal "
              "%d (%s); the command's processes that inherited the lock "
              "connection keep the lock while they run, and --detach after",
              (long)keeper, WTERMSIG(st), strsignal(WTERMSIG(st)));
    }
    return keeper_exit_status(st);
}

/* HELLO detach= for run (see CTL_DETACH_MIN_MS); negative: off. */
static int ctl_detach(const struct ctl *c)
{
    uint32_t ttl = c->ttl_ms ? c->ttl_ms : CTL_DETACH_MIN_MS;

    if (c->detach_set)
        return c->detach_ms == 0 ? -1
             : c->detach_ms > INT32_MAX ? INT32_MAX : (int)c->detach_ms;
    if (ttl < CTL_DETACH_MIN_MS)
        return CTL_DETACH_MIN_MS;
    return ttl > CTL_DETACH_MAX_MS ? CTL_DETACH_MAX_MS : (int)ttl;
}

/*
 * The resources of run, elect (both take COMMAND) and lock: RESOURCE, or
 * those -r gave, all in c->resources; the first into *first. -1 after a
 * usage error (said).
 */
static int ctl_resources(struct ctl *c, const char *cmd,
                         const struct ctl_args *a, bool takes_cmd,
                         const char **first)
{
    if (a->nwords == 0 && c->nresources == 0) {
        warnx(a->dashdash ? "%s: missing RESOURCE before -- (try --help)"
              : a->cmd || !takes_cmd ? "%s: missing RESOURCE (try --help)"
              : "%s: missing RESOURCE and COMMAND (try --help)", cmd);
        return -1;
    }
    if (a->nwords > 0 && c->nresources > 0) {
        warnx("%s: give the resources either as RESOURCE or with -r, "
              "not both (\"%s\")", cmd, a->words[0]);
        return -1;
    }
    /* (run and elect take the word after RESOURCE for COMMAND) */
    if (a->nwords > 1) {
        warnx("%s: expected one RESOURCE, got %d words (\"%s\" ...)", cmd,
              a->nwords, a->words[0]);
        return -1;
    }
    if (takes_cmd && !a->cmd) {
        warnx("%s: missing COMMAND after %s (try --help)", cmd,
              c->nresources > 0 ? "the resources" : "RESOURCE");
        return -1;
    }
    if (c->nresources == 0)
        c->resources[c->nresources++] = a->words[0];
    *first = c->resources[0];
    return 0;
}

/* run and elect (cmd). a: RESOURCE (unless -r gave the resources), then
 * COMMAND [ARGS...]. */
static int ctl_run(struct ctl *c, const char *cmd, const struct ctl_args *a)
{
    struct ctl_run r = { .c = c, .conn = -1 };
    /* No keepalive: the command keeps the connection after us (see
     * CTL_REFRESH_MAX_MS). */
    struct redlockd_opts o = { .on_lost = ctl_on_lost, .ud = &r,
                               .detach_ms = ctl_detach(c) };
    struct redlockd_lease lease;
    int rc;

    if (ctl_resources(c, cmd, a, true, &r.resource) < 0)
        return EX_USAGE;
    rc = ctl_connect(c, &o, &r.h);
    if (rc != 0)
        return rc;
    if (!ctl_lock(&r, &lease, &rc)) {
        redlockd_close(r.h);
        return rc;
    }
    if (r.lost) {
        warnx("lost the lock on %s right after taking it: %s", r.resource,
              r.lost_reason);
        rc = CTL_EXIT_LOST;
    }
    if (rc == 0) {
        /* From here on the keeper holds the lock; we only relay signals to
         * it and report how it ended (see "run: the keeper" above). */
        pid_t keeper = keeper_fork(true);

        if (keeper > 0) {
            redlockd_forget(r.h);
            return ctl_relay(keeper);
        }
        if (keeper < 0) {
            warn("fork");
            rc = EX_OSERR;
        }
    }
    if (rc == 0 && ctl_spawn(&r, &lease, a->cmd) < 0)
        rc = EX_OSERR;
    if (rc == 0) {
        ctl_wait_child(&r, lease.ttl);
        rc = ctl_finish(&r);
    }
    redlockd_close(r.h);
    /* The command's processes still holding the connection (the lock was
     * released, or lost) keep no session open. */
    if (r.conn >= 0) {
        (void)shutdown(r.conn, SHUT_RDWR);
        close(r.conn);
    }
    return rc;
}

/* ---- lock: a lock held until told to let go ----------------------------- */

/* The end of the wait: SIGINT, SIGTERM or SIGHUP caught? (SIGCHLD, of no
 * child of ours, means nothing.) */
static bool ctl_told_to_stop(void)
{
    bool stop = false;
    int sig;

    while ((sig = keeper_signal_next()) > 0)
        stop = stop || sig != SIGCHLD;
    return stop;
}

/* What lock prints once it holds the lock, flushed for a pipe. */
static void ctl_print_grant(const struct ctl *c,
                            const struct redlockd_lease *l)
{
    json_t *o;
    char *text;

    if (!c->json) {
        printf("resource=%s fence=%" PRIu64 " token=%s\n", l->resource,
               l->fence, l->token);
    } else {
        o = json_pack("{s:s, s:I, s:s}", "resource", l->resource, "fence",
                      (json_int_t)l->fence, "token", l->token);
        text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!text)
            errx(EX_OSERR, "out of memory");
        printf("%s\n", text);
        free(text);
        json_decref(o);
    }
    fflush(stdout);
}

/* Follow the lease as the keeper does (events, refreshes, reconnection)
 * until a signal says stop or the lease is lost. */
static void ctl_hold_wait(struct ctl_run *r, uint32_t ttl)
{
    struct pollfd p[2];
    bool stop = false;

    ctl_follow(r, ttl);
    while (!stop && !r->lost) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(r->h);        /* -1: poll() skips it */
        p[1].events = POLLIN;
        if (poll(p, 2, ctl_poll_timeout(r)) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0)
            stop = ctl_told_to_stop();
        if (p[1].revents != 0)
            (void)redlockd_poll_events(r->h, 0);
        ctl_lease_timers(r);
    }
}

/* lock: RESOURCE (or -r's), no command. Signals are caught from the grant
 * on; before it, they end us as they would any program, and the daemon
 * drops a waiting LOCK with its connection. */
static int ctl_hold(struct ctl *c, const struct ctl_args *a)
{
    struct ctl_run r = { .c = c, .conn = -1 };
    struct redlockd_opts o = { .on_lost = ctl_on_lost, .ud = &r,
                               .detach_ms = ctl_detach(c) };
    const struct redlockd_error *e;
    struct redlockd_lease lease;
    int rc;

    if (ctl_resources(c, "lock", a, false, &r.resource) < 0)
        return EX_USAGE;
    rc = ctl_connect(c, &o, &r.h);
    if (rc != 0)
        return rc;
    if (!ctl_lock(&r, &lease, &rc)) {
        redlockd_close(r.h);
        return rc;
    }
    if (keeper_catch_signals() < 0)
        err(EX_OSERR, "pipe");
    ctl_print_grant(c, &lease);
    ctl_hold_wait(&r, lease.ttl);
    e = redlockd_last_error(r.h);
    if (r.lost) {
        warnx("lost the lock on %s: %s%s%s", r.resource, r.lost_reason,
              e->code ? ": " : "", e->msg);
        rc = CTL_EXIT_LOST;
    } else {
        ctl_work_ended(&r);
        rc = ctl_unlock(&r, "the signal to let it go") ? 0 : CTL_EXIT_LOST;
    }
    redlockd_close(r.h);
    return rc;
}

/* ---- watch and leader: who holds a resource ------------------------------ */

/* A holder as the daemon's words, after EVENT HOLDER resource=<r>. */
static void ctl_holder_words(FILE *out, const struct redlockd_holder *hd)
{
    fprintf(out, "held=%u", hd->held);
    if (hd->foreign)
        fputs(" foreign=1", out);
    else if (hd->held > 0 && hd->limit > 0)
        fprintf(out, " mode=semaphore limit=%" PRIu32, hd->limit);
    else if (hd->held > 0 && hd->mode == REDLOCKD_SHARED)
        fputs(" mode=shared", out);
    else if (hd->held > 0)
        fprintf(out, " mode=exclusive fence=%" PRIu64 " name=%s daemon=%s%s%s",
                hd->fence, hd->name, hd->daemon, hd->value[0] ? " value=" : "",
                hd->value);
}

/* The same as a JSON object (time: when it was heard, or NULL). */
static json_t *ctl_holder_json(const struct redlockd_holder *hd,
                               const char *time)
{
    json_t *o = json_object();

    if (time)
        json_object_set_new(o, "time", json_string(time));
    json_object_set_new(o, "resource", json_string(hd->resource));
    json_object_set_new(o, "held", json_integer(hd->held));
    if (hd->foreign) {
        json_object_set_new(o, "foreign", json_true());
    } else if (hd->held > 0 && hd->limit > 0) {
        json_object_set_new(o, "mode", json_string("semaphore"));
        json_object_set_new(o, "limit", json_integer(hd->limit));
    } else if (hd->held > 0 && hd->mode == REDLOCKD_SHARED) {
        json_object_set_new(o, "mode", json_string("shared"));
    } else if (hd->held > 0) {
        json_object_set_new(o, "mode", json_string("exclusive"));
        json_object_set_new(o, "fence", json_integer((json_int_t)hd->fence));
        json_object_set_new(o, "name", hd->name[0] ? json_string(hd->name)
                                                   : json_null());
        json_object_set_new(o, "daemon", json_string(hd->daemon));
        if (hd->value[0])
            json_object_set_new(o, "value", json_string(hd->value));
    }
    return o;
}

static void ctl_print_json(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

    if (!text)
        errx(EX_OSERR, "out of memory");
    printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* Now as "2026-01-31T14:05:09.123+0100": local time, to the millisecond,
 * one word. */
static const char *ctl_timestamp(char *buf, size_t sz)
{
    struct timespec ts;
    struct tm tm;
    char zone[8];
    size_t len;

    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    len = strftime(buf, sz, "%Y-%m-%dT%H:%M:%S", &tm);
    if (strftime(zone, sizeof(zone), "%z", &tm) == 0)
        zone[0] = '\0';
    snprintf(buf + len, sz - len, ".%03ld%s", ts.tv_nsec / 1000000, zone);
    return buf;
}

/* on_holder of watch: one line per event, flushed at once (into a pipe
 * too). ud is the struct ctl. */
static void ctl_on_holder(const struct redlockd_holder *hd, void *ud)
{
    const struct ctl *c = ud;
    char when[64];

    ctl_timestamp(when, sizeof(when));
    if (c->json) {
        ctl_print_json(ctl_holder_json(hd, when));
    } else {
        printf("%s %s ", when, hd->resource);
        ctl_holder_words(stdout, hd);
        putchar('\n');
    }
    fflush(stdout);
}

/* Events until SIGINT, SIGTERM or SIGHUP (0). A lost connection is taken
 * up again, for as long as it takes, in slices that leave the signals
 * their turn (the library watches again on a new session, and the daemon
 * tells the states then), saying so on stderr once each way. */
static int ctl_watch_wait(struct redlockd *h)
{
    struct pollfd p[2];
    bool away = false;
    int rc;

    for (;;) {
        p[0].fd = keeper_signal_fd();
        p[0].events = POLLIN;
        p[1].fd = redlockd_fd(h);
        p[1].events = POLLIN;
        if (poll(p, 2, away ? 0 : -1) < 0 && errno != EINTR)
            err(EX_OSERR, "poll");
        if (p[0].revents != 0 && ctl_told_to_stop())
            return 0;
        rc = redlockd_poll_events(h, away ? CTL_RECONNECT_SLICE_MS : 0);
        if (rc < 0 && !away)
            warnx("watch: lost the connection to %s; reconnecting",
                  redlockd_server(h));
        else if (rc >= 0 && away)
            warnx("watch: watching again through %s", redlockd_server(h));
        away = rc < 0 || redlockd_fd(h) < 0;
    }
}

static int ctl_watch(struct ctl *c, const struct ctl_args *a)
{
    struct redlockd_opts o = { .on_holder = ctl_on_holder, .ud = c };
    struct redlockd *h;
    int rc;

    if (a->nwords == 0) {
        warnx("watch: missing RESOURCE (try --help)");
        return EX_USAGE;
    }
    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    if (keeper_catch_signals() < 0)
        err(EX_OSERR, "pipe");
    rc = redlockd_watch(h, (const char *const *)a->words, (size_t)a->nwords);
    if (rc < 0)
        rc = ctl_report("watch", rc, redlockd_last_error(h)->msg);
    else
        rc = ctl_watch_wait(h);
    redlockd_close(h);
    return rc;
}

/* leader: the value of an exclusive holder that has one; nothing, and
 * CTL_EXIT_NO_LEADER, otherwise. */
static int ctl_leader(struct ctl *c, const char *resource)
{
    struct redlockd_opts o = { 0 };
    struct redlockd_holder hd;
    struct redlockd *h;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    rc = redlockd_holder(h, resource, &hd);
    if (rc < 0)
        rc = ctl_report("leader", rc, redlockd_last_error(h)->msg);
    else if (hd.held != 1 || hd.foreign || hd.limit > 0
             || hd.mode != REDLOCKD_EXCLUSIVE || hd.value[0] == '\0')
        rc = CTL_EXIT_NO_LEADER;
    else if (c->json)
        ctl_print_json(ctl_holder_json(&hd, NULL));
    else
        printf("%s\n", hd.value);
    redlockd_close(h);
    return rc;
}

/* ---- main --------------------------------------------------------------- */

/* getopt_long's tables from ctl_opts: "+:" (stop at the first word that
 * is not an option, report a missing argument as ':') and the short
 * letters. */
static void ctl_getopt_tables(struct option *longopts, char *shorts)
{
    size_t i;

    *shorts++ = '+';
    *shorts++ = ':';
    for (i = 0; i < CTL_NOPTS; i++) {
        const struct ctl_opt *o = &ctl_opts[i];

        longopts[i] = (struct option){ o->name, o->arg ? required_argument
                                                       : no_argument,
                                       NULL, o->val };
        if (o->val < 256) {
            *shorts++ = (char)o->val;
            if (o->arg)
                *shorts++ = ':';
        }
    }
    longopts[CTL_NOPTS] = (struct option){ NULL, 0, NULL, 0 };
    *shorts = '\0';
}

/*
 * Options from argv[1] on (argv[0] is skipped, as getopt does), up to the
 * first word that is not one: its index (argc when none is left; after a
 * "--" that ended the options, the index after it, and *dashdash is set),
 * 0 when help or version was printed, -1 on a usage error.
 */
static int ctl_parse(struct ctl *c, int argc, char **argv, bool *dashdash)
{
    struct option longopts[CTL_NOPTS + 1];
    char shorts[2 + 2 * CTL_NOPTS + 1];
    int opt, rc, last_end = 1;

    ctl_getopt_tables(longopts, shorts);
    optind = 0;         /* glibc: start afresh on this argv */
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
        if (opt == '?' || opt == ':') {
            warnx("%s %s (try --help)", opt == '?' ? "unknown option"
                  : "missing argument for", argv[optind - 1]);
            return -1;
        }
        /* getopt only returns what the tables hold. */
        rc = ctl_option(c, ctl_opt_find(opt), optarg);
        if (rc != 0)
            return rc > 0 ? 0 : -1;
        last_end = optind;
    }
    /* getopt steps over the "--" that ends the options (but "--" as an
     * option's argument, --name --, ended before it). */
    *dashdash = optind == last_end + 1 && strcmp(argv[optind - 1], "--") == 0;
    return optind;
}

/* argv[0] is the command word; takes_cmd: run and elect, COMMAND follows
 * RESOURCE. 1 parsed, 0 help or version printed, -1 usage error. */
static int ctl_parse_args(struct ctl *c, bool takes_cmd, int argc,
                          char **argv, struct ctl_args *a)
{
    int k = 0, j;

    memset(a, 0, sizeof(*a));
    a->words = calloc((size_t)argc, sizeof(*a->words));
    if (!a->words)
        errx(EX_OSERR, "out of memory");
    /* argv[k] plays getopt's argv[0]: the command word, then each word
     * taken, so that parsing goes on after it. */
    for (;;) {
        j = ctl_parse(c, argc - k, argv + k, &a->dashdash);
        if (j <= 0)
            return j;
        k += j;
        if (k >= argc)
            return 1;
        /* COMMAND follows "--", RESOURCE, or -r's resources. */
        if (takes_cmd
            && (a->dashdash || a->nwords > 0 || c->nresources > 0)) {
            a->cmd = argv + k;
            a->ncmd = argc - k;
            return 1;
        }
        if (a->dashdash)
            break;
        a->words[a->nwords++] = argv[k];
    }
    while (k < argc)
        a->words[a->nwords++] = argv[k++];
    return 1;
}

/* An option of other commands than cmd (scope: cmd's bit, or CTL_ANY for
 * a command with no options of its own). */
static int ctl_foreign_opt(const struct ctl *c, const char *cmd,
                           unsigned scope)
{
    char cmds[64];

    for (size_t i = 0; i < CTL_NOPTS; i++) {
        const struct ctl_opt *o = &ctl_opts[i];

        if (c->given[i] && o->scope != CTL_ANY && !(o->scope & scope)) {
            warnx("%s: --%s is an option of %s", cmd, o->name,
                  ctl_scope_words(o->scope, cmds, sizeof(cmds)));
            return -1;
        }
    }
    return 0;
}

/* The commands, for the check that comes before their arguments. */
static const char *const ctl_commands[] = {
    "run", "elect", "lock", "leader", "watch", "status", "sessions", "stats",
    "ping", "locks", "release", "top",
};

static bool ctl_known(const char *cmd)
{
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(*ctl_commands); i++)
        if (strcmp(ctl_commands[i], cmd) == 0)
            return true;
    return false;
}

/* elect: run with a value, waiting as long as it takes unless --wait. */
static int ctl_elect(struct ctl *c, const struct ctl_args *a)
{
    if (!c->value) {
        warnx("elect: missing --value TEXT (what leader and watch show of "
              "the leader; try --help)");
        return EX_USAGE;
    }
    c->campaign = !c->wait_set;
    return ctl_run(c, "elect", a);
}

static int ctl_dispatch(struct ctl *c, const char *cmd,
                        const struct ctl_args *a)
{
    const struct ctl_inspector *in = ctl_inspector_find(cmd);
    int nargs = in ? in->nargs : strcmp(cmd, "leader") == 0;

    if (strcmp(cmd, "run") == 0)
        return ctl_foreign_opt(c, cmd, CTL_RUN) < 0 ? EX_USAGE
                                                     : ctl_run(c, cmd, a);
    if (strcmp(cmd, "elect") == 0)
        return ctl_foreign_opt(c, cmd, CTL_ELECT) < 0 ? EX_USAGE
                                                       : ctl_elect(c, a);
    if (strcmp(cmd, "lock") == 0)
        return ctl_foreign_opt(c, cmd, CTL_LOCK) < 0 ? EX_USAGE
                                                      : ctl_hold(c, a);
    if (strcmp(cmd, "release") == 0)
        return ctl_foreign_opt(c, cmd, CTL_RELEASE) < 0
                   ? EX_USAGE : ctl_release(c, a->nwords, a->words);
    if (ctl_foreign_opt(c, cmd, strcmp(cmd, "top") == 0 ? CTL_TOP
                                                        : CTL_ANY) < 0)
        return EX_USAGE;
    if (strcmp(cmd, "watch") == 0)
        return ctl_watch(c, a);
    if (a->nwords != nargs) {
        if (nargs == 0)
            warnx("%s takes no arguments (got \"%s\")", cmd, a->words[0]);
        else if (a->nwords == 0)
            warnx("%s: missing RESOURCE (try --help)", cmd);
        else
            warnx("%s: expected one RESOURCE, got %d words (\"%s\" ...)",
                  cmd, a->nwords, a->words[0]);
        return EX_USAGE;
    }
    if (strcmp(cmd, "ping") == 0)
        return ctl_ping(c);
    if (strcmp(cmd, "locks") == 0)
        return ctl_locks(c);
    if (strcmp(cmd, "stats") == 0)
        return ctl_stats(c);
    if (strcmp(cmd, "top") == 0)
        return ctl_top(c);
    if (strcmp(cmd, "leader") == 0)
        return ctl_leader(c, a->words[0]);
    return ctl_inspect(c, in, nargs > 0 ? a->words[0] : NULL);
}

int main(int argc, char **argv)
{
    struct ctl c;
    struct ctl_args a;
    const char *cmd;
    bool dashdash;
    int i, rc;

    ctl_defaults(&c);
    i = ctl_parse(&c, argc, argv, &dashdash);
    if (i <= 0)
        return i == 0 ? 0 : EX_USAGE;
    if (i >= argc) {
        warnx("no command given (try --help)");
        return EX_USAGE;
    }
    cmd = argv[i];
    if (strcmp(cmd, "help") == 0) {
        ctl_usage(stdout);
        return 0;
    }
    if (!ctl_known(cmd)) {
        warnx("unknown command \"%s\" (try --help)", cmd);
        return EX_USAGE;
    }
    /* The command's words, options anywhere: argv[i] plays argv[0]. */
    rc = ctl_parse_args(&c, strcmp(cmd, "run") == 0
                            || strcmp(cmd, "elect") == 0,
                        argc - i, argv + i, &a);
    if (rc > 0)
        rc = ctl_dispatch(&c, cmd, &a);
    else
        rc = rc == 0 ? 0 : EX_USAGE;
    free(a.words);
    return rc;
}
