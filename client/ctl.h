/*
 * redlockctl's own header: what its files share (not installed). The
 * program is split by concern:
 *
 *   redlockctl.c    main: the options (one table for getopt, --help and
 *                   the check that an option suits its command), their
 *                   parsing, usage, and the dispatch to the commands
 *   ctl_run.c       run, elect and lock: taking the lock (its kinds, the
 *                   LOCK sent again through the next daemon), the keeper's
 *                   side (the command and its process group, refreshes,
 *                   deadlines, --on-lost), the release and the exit status
 *   ctl_inspect.c   the commands that ask and print: status, sessions,
 *                   ping, stats, locks, watch, leader; and the operator's
 *                   release --force
 *   ctl_top.c       top: TOP refreshed in place, or as plain text
 *   ctl_out.c       output: aligned tables, JSON members as text
 *   ctl_connect.c   connecting: secrets, the library's options, failures
 *                   as one line and an exit status; the clock, and the
 *                   signals that end a wait
 *
 * Calls go down: redlockctl.c calls the commands (run, inspect, top), the
 * commands call ctl_out.c and ctl_connect.c, which call only libredlockd
 * and keeper.c (the process that keeps a lock for a command's group,
 * shared with redlockd-taskq).
 */
#ifndef REDLOCKD_CTL_H
#define REDLOCKD_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "redlockd.h"

#define CTL_NAME_MAX 64
/* run -r: the most resources one run takes (the daemon's locks.max_multi
 * may allow fewer). */
#define CTL_MAX_RESOURCES 256
/* Room for every option in struct ctl's record of those given (asserted
 * where the options are listed). */
#define CTL_OPTS_MAX 64
/* While the handle is not connected, the longest slice that run, lock and
 * watch give it to reconnect in, so that signals and the command's exit
 * are not left waiting (see "run: failover" in ctl_run.c). */
#define CTL_RECONNECT_SLICE_MS 1000

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
    /* run: lock kinds (see "run: lock kinds" in ctl_run.c) */
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

/* ---- the commands ------------------------------------------------------- */

/* ctl_run.c */
int ctl_run(struct ctl *c, const char *cmd, const struct ctl_args *a);
int ctl_elect(struct ctl *c, const struct ctl_args *a);
int ctl_hold(struct ctl *c, const struct ctl_args *a);

/* ctl_inspect.c: the commands that print one JSON answer of the daemon
 * (status, sessions), found by name, and the others. */
struct ctl_inspector {
    const char *cmd;
    int nargs;                  /* 1: takes RESOURCE */
    int (*fetch)(struct redlockd *h, const char *resource, char **json);
    void (*print)(json_t *root);
};

const struct ctl_inspector *ctl_inspector_find(const char *cmd);
int ctl_inspect(struct ctl *c, const struct ctl_inspector *in,
                const char *resource);
int ctl_ping(struct ctl *c);
int ctl_stats(struct ctl *c);
int ctl_locks(struct ctl *c);
int ctl_release(struct ctl *c, int argc, char **argv);
int ctl_watch(struct ctl *c, const struct ctl_args *a);
int ctl_leader(struct ctl *c, const char *resource);

/* ctl_top.c */
int ctl_top(struct ctl *c);

/* ---- ctl_out.c ---------------------------------------------------------- */

#define CTL_TABLE_COLS 8

/* Rows of text cells, printed with aligned columns. */
struct ctl_table {
    size_t ncols;
    size_t nrows;
    char **cells;               /* nrows * ncols, owned */
    unsigned right;             /* bit i: right-align column i */
};

void ctl_table_add(struct ctl_table *t, const char *const *row);
void ctl_table_fprint(FILE *out, struct ctl_table *t);
void ctl_table_print(struct ctl_table *t);
const char *ctl_field(json_t *obj, const char *key, char *buf, size_t sz);
const char *ctl_text(json_t *obj, const char *key, char *buf, size_t sz);
const char *ctl_duration(json_t *v, char *buf, size_t sz);
json_t *ctl_parse_json(const char *text);
const char *ctl_session_name(json_t *who, char *buf, size_t sz);
json_int_t ctl_int(json_t *obj, const char *key);

/* ---- ctl_connect.c ------------------------------------------------------ */

int ctl_read_secret(const char *path, const char *what, char *buf,
                    size_t size);
int ctl_report(const char *what, int rc, const char *msg);
const char *ctl_user(const struct ctl *c);
int ctl_connect(struct ctl *c, struct redlockd_opts *o,
                struct redlockd **h);
double ctl_now_ms(void);
bool ctl_told_to_stop(void);

#endif
