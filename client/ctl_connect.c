/*
 * redlockctl, connecting: the secrets read from files, the options every
 * command hands the library (servers, TLS, user, client name, timeouts),
 * and a library failure as one line and the exit status it deserves. Also
 * what several commands wait with: the clock, and the signals (SIGINT,
 * SIGTERM, SIGHUP) that end a wait.
 */
#include <err.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "keeper.h"

/* ---- connecting --------------------------------------------------------- */

/* The first line of path into buf (what: "password", "admin password"). */
int ctl_read_secret(const char *path, const char *what, char *buf,
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
int ctl_report(const char *what, int rc, const char *msg)
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
const char *ctl_user(const struct ctl *c)
{
    const char *env = getenv(CTL_USER_ENV);

    if (c->user)
        return c->user;
    return env && *env != '\0' ? env : NULL;
}

int ctl_connect(struct ctl *c, struct redlockd_opts *o,
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

/* ---- waiting ------------------------------------------------------------ */

double ctl_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* The end of the wait: SIGINT, SIGTERM or SIGHUP caught? (SIGCHLD, of no
 * child of ours, means nothing.) */
bool ctl_told_to_stop(void)
{
    bool stop = false;
    int sig;

    while ((sig = keeper_signal_next()) > 0)
        stop = stop || sig != SIGCHLD;
    return stop;
}
