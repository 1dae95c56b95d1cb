/*
 * redlockctl: the command-line client of redlockd, built on libredlockd.
 *
 * `run` guards a command with a lock: it takes the lock (the daemon renews
 * the lease while our connection lives), then forks its keeper (see "run:
 * the keeper" in ctl_run.c), which holds the lock from then on and runs the
 * command in its own process group with the lock in its environment and
 * the lock connection inherited, forwards SIGINT, SIGTERM and SIGHUP to
 * that group, watches the connection for EVENT LOST, confirms the lease
 * every ttl/3 (redlockd_refresh), stops the whole group (SIGTERM, SIGKILL
 * after --kill-after) when the lease is lost or its deadline passes
 * unconfirmed, and releases the lock as soon as no process of the group is
 * left. With several servers (-s repeated) the library follows the lease
 * when the connection breaks or the daemon restarts or dies (resume, or
 * ADOPT on another daemon), and the command runs on; see "run: failover"
 * in ctl_run.c. `elect` is `run` for a leader: it campaigns (waits for
 * the lock, without a time limit unless --wait says otherwise) and stores
 * --value with the lock, so that `leader` (STATUS's holder) and `watch`
 * (WATCH, a line per EVENT HOLDER) show it on every daemon. `lock` takes a
 * lock without a command and holds it (refreshing, following it across
 * daemons, as the keeper does) until SIGINT, SIGTERM or SIGHUP, or until
 * it is lost. `ping`, `status`, `sessions`
 * and `stats` print the daemon's answers, as tables or (--json) raw;
 * `locks` lists every lock the daemon's sessions hold, from SESSIONS;
 * `top` shows what is waited for and held longest, from TOP, refreshed
 * every second (see ctl_top.c).
 * `release --force` is the operator's FORCEUNLOCK, after AUTH with the
 * admin password. (A plain `release` does not exist: redlockctl's locks
 * live as long as its session, which ends with the command.)
 * Exit statuses are listed in usage() and in redlockctl(1); keep both in
 * step.
 *
 * This file is the program's entry: the options (one table for getopt,
 * --help and the check that an option suits its command), their parsing,
 * usage, and the dispatch to the commands, which live in the files ctl.h
 * lists.
 */
#include <err.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include "ctl.h"
#include "num.h"

#ifndef REDLOCKD_VERSION
#define REDLOCKD_VERSION "unknown"
#endif

#define CTL_DEFAULT_TIMEOUT_MS 5000

/* ---- options, usage ----------------------------------------------------- */

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
