/*
 * conf: the daemon's JSON configuration file (docs/configuration.md).
 *
 * conf_load() reads one JSON object with jansson through a table of
 * {key, type, offset, default, min, max}, then one validate pass. Every
 * error names the file and the key (and line:column for JSON syntax errors).
 * All keys are optional; conf_init() fills in the defaults.
 *
 * Behind it, six files in layers (conf_priv.h lists them): the key table
 * in conf.c at the bottom, conf_load.c and conf_reload.c on top.
 */
#ifndef REDLOCKD_CONF_H
#define REDLOCKD_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "users.h"

/*
 * The keys redlockd writes on the nodes. For a resource r: key_prefix + r
 * (exclusive), + CONF_SHARED_SUFFIX (its shared holders), + CONF_SLOT_SEP
 * and a number (a semaphore slot), and any of these + CONF_WAITING_SUFFIX
 * (the mark of a waiter); the shared set + CONF_FENCES_SUFFIX (its
 * members' fences, a hash). Beside them, one of each per node:
 * locks.fence_key (the fence counter), + CONF_MARKER_SUFFIX (the recovery
 * marker) and + CONF_MAXTTL_SUFFIX (the longest ttl any daemon granted
 * there). conf refuses a configuration in which one of the second kind
 * could be one of the first (docs/design.md, "Names that collide").
 */
#define CONF_SHARED_SUFFIX ":shared"
#define CONF_SLOT_SEP '#'
#define CONF_WAITING_SUFFIX " waiting"
#define CONF_FENCES_SUFFIX " fences"
#define CONF_MARKER_SUFFIX ":admitted"
#define CONF_MAXTTL_SUFFIX ":maxttl"

/* The largest values locks.max_multi and locks.max_limit may take: request
 * and script sizes are derived from them. */
#define CONF_MAX_MULTI 256
#define CONF_MAX_LIMIT 65536
/* The largest redis.group_max: requests in one GROUP call. */
#define CONF_GROUP_MAX 64
/* The longest "id": a word in holder labels, logs and announcements. */
#define CONF_ID_MAX 64
/* The largest metrics.max_classes: each class is some 60 series. */
#define CONF_CLASSES_MAX 1024

/* From meson (sysconfdir), so the daemon looks where `meson install` put
 * the file. */
#ifdef REDLOCKD_CONF_PATH
#define CONF_DEFAULT_PATH REDLOCKD_CONF_PATH
#else
#define CONF_DEFAULT_PATH "/etc/redlockd/redlockd.json"
#endif
#define CONF_ERRLEN 512

enum conf_addr_kind { CONF_ADDR_TCP, CONF_ADDR_UNIX };

/*
 * A parsed "tcp://HOST:PORT", "HOST:PORT", "[V6]:PORT", "tls://HOST:PORT" or
 * "unix:/PATH": the
 * grammar is proto/addr.h's (proto_addr_parse); this is the daemon's own
 * copy of the result, kept with the text as written.
 */
struct conf_addr {
    enum conf_addr_kind kind;
    char *host;         /* TCP: "127.0.0.1" or "::1" (no brackets); else NULL */
    int port;           /* TCP */
    bool tls;           /* TCP: tls://HOST:PORT (listen only) */
    char *path;         /* UNIX: absolute path; else NULL */
    char *text;         /* as written in the file, for logs and STATS */
};

enum log_level_value { /* same order as log.h's levels */
    CONF_LOG_DEBUG, CONF_LOG_INFO, CONF_LOG_NOTICE, CONF_LOG_WARNING,
    CONF_LOG_ERROR,
};

/*
 * The loaded configuration. Each field is the key of the same name in the
 * file; defaults and allowed ranges live in one place, conf.c's key table
 * (and docs/configuration.md), so they are not repeated here.
 */
struct conf {
    char *path;                     /* the file it came from, or NULL */
    char *id;                       /* this daemon's name; default: the
                                       host name */

    struct conf_addr *listen;
    size_t nlisten;
    unsigned unix_socket_mode;      /* from an octal string, e.g. "0660" */

    struct {
        struct conf_addr *nodes;
        size_t nnodes;
        char *username;             /* NULL: AUTH with the password alone */
        char *password;             /* password, or password_file's line */
        int db;
        unsigned pool_size;         /* data connections per node */
        unsigned connect_timeout_ms;
        unsigned command_timeout_ms;
        unsigned reconnect_max_ms;  /* backoff cap */
        unsigned probe_interval_ms; /* each node is asked something at
                                       least this often */
        unsigned batch_keys_in_flight; /* keys of batched renewals (and,
                                       apart, releases) out at once */
        unsigned group_max;         /* requests in one GROUP call (pool.c,
                                       "Group commit"); 1: none */
    } redis;

    struct {
        char *key_prefix;           /* Redis key = key_prefix + resource */
        char *fence_key;            /* the fence counter's key */
        char *release_channel;      /* pub/sub channel of release notices */
        unsigned default_ttl_ms;
        unsigned min_ttl_ms;
        unsigned max_ttl_ms;
        unsigned max_wait_ms;
        double drift_factor;
        unsigned lock_delay_ms;     /* keys kept after a dropped session */
        unsigned max_resource_len;
        unsigned retry_ms;          /* waiters' fallback poll */
        unsigned max_limit;         /* largest LOCK limit= (semaphores) */
        unsigned max_multi;         /* most resources in one LOCK */
        unsigned max_value_len;     /* longest value= (a holder's value) */
        unsigned watch_poll_ms;     /* how often watched keys are read for
                                       other clients' changes; 0: never */
    } locks;

    struct {
        unsigned max_clients;
        unsigned max_line;
        unsigned max_locks_per_session;
        unsigned max_pipeline;      /* requests read ahead per connection */
        unsigned max_inflight;      /* tagged requests unanswered per
                                       session */
        unsigned max_watches;       /* resources one session WATCHes */
        unsigned max_output_bytes;  /* unsent replies before a disconnect */
        unsigned idle_timeout_ms;   /* 0: off */
        unsigned handshake_timeout_ms;  /* 0: off */
        unsigned max_clients_per_ip;    /* 0: no cap */
        unsigned max_waiters_per_resource;  /* 0: no cap */
        unsigned max_auth_failures; /* wrong AUTHs before a close */
        unsigned max_detach_ms;     /* longest HELLO detach=; 0: off */
    } limits;

    struct {
        char *password;             /* password, or password_file's line;
                                       NULL: no AUTH needed */
        char *admin_password;       /* enables FORCEUNLOCK; NULL: off */
        bool protected_mode;
        struct users_user *users;   /* auth.users (users.h); NULL: none */
        size_t nusers;              /* above 0: every client logs in */
    } auth;

    struct {
        char *cert_file;            /* PEM chain; needed by tls:// */
        char *key_file;             /* PEM private key */
        char *ca_file;              /* CAs of client certificates */
        bool verify_clients;        /* a client certificate is required */
        char *min_version;          /* "1.2" or "1.3" */
    } tls;

    struct {
        struct conf_addr *listen;   /* NULL: no metrics endpoint */
        char **resource_classes;    /* the prefixes listed (rclass.h);
                                       NULL: "prefix" */
        size_t nresource_classes;
        unsigned max_classes;
    } metrics;

    struct {
        int level;                  /* enum log_level_value */
    } log;

    unsigned shutdown_timeout_ms;
};

/* Fill in every default (no allocation needed beyond the default strings). */
void conf_init(struct conf *c);
void conf_deinit(struct conf *c);

/*
 * Load and validate `path` into c (which conf_load initialises itself).
 * Returns 0, or -1 with a one-line message in err such as
 *   "/etc/redlockd/redlockd.json: limits.max_line: must be between 64 and 1048576"
 *   "x.json:3:14: JSON syntax error: ..."
 * On error c holds defaults only (already conf_deinit-safe).
 */
int conf_load(struct conf *c, const char *path, char *err, size_t errlen);

/* Same as conf_load, from a string; `name` stands for the file in messages. */
int conf_load_string(struct conf *c, const char *text, const char *name,
                     char *err, size_t errlen);

/* Parse one address as redis.nodes does (host names allowed), and unix
 * sockets when allow_unix; 0 or -1 with a message (no key/file prefix). */
int conf_parse_addr(struct conf_addr *a, const char *text, bool allow_unix,
                    char *err, size_t errlen);
void conf_addr_deinit(struct conf_addr *a);

/*
 * SIGHUP: take from `fresh` (a conf that loaded and validated) every key a
 * running daemon can change in place (log level, limits, passwords, ttl
 * bounds, lock delay, probe interval, ...), so pointers to `live` stay
 * valid. Every key that differs is reported once: applied, or needing a
 * restart (listen, nodes, key prefix, ...) and left as it was; was/now
 * are the values as text ("" for secrets and lists). Returns how many need
 * a restart. fresh keeps what live gave up: conf_deinit it after.
 */
typedef void conf_report_fn(void *ud, const char *key, const char *was,
                            const char *now, bool applied);
int conf_reload(struct conf *live, struct conf *fresh, conf_report_fn *report,
                void *ud);

/* Settings that load but will not do what the operator likely meant (an
 * open address that protected mode will refuse every peer on): one
 * message each. */
typedef void conf_warn_fn(void *ud, const char *msg);
void conf_warnings(const struct conf *c, conf_warn_fn *warn, void *ud);

#endif
