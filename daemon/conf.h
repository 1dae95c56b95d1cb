/*
 * conf: the daemon's JSON configuration file (docs/configuration.md).
 *
 * conf_load() reads one JSON object with jansson through a table of
 * {key, type, offset, default, min, max}, then one validate pass. Every
 * error names the file and the key (and line:column for JSON syntax errors).
 * All keys are optional; conf_init() fills in the defaults.
 */
#ifndef REDLOCKD_CONF_H
#define REDLOCKD_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONF_DEFAULT_PATH "/etc/redlockd/redlockd.json"
#define CONF_ERRLEN 512

enum conf_addr_kind { CONF_ADDR_TCP, CONF_ADDR_UNIX };

/*
 * A parsed "tcp://HOST:PORT", "HOST:PORT", "[V6]:PORT" or "unix:/PATH": the
 * grammar is proto/addr.h's (proto_addr_parse); this is the daemon's own
 * copy of the result, kept with the text as written.
 */
struct conf_addr {
    enum conf_addr_kind kind;
    char *host;         /* TCP: "127.0.0.1" or "::1" (no brackets); else NULL */
    int port;           /* TCP: 1..65535 */
    char *path;         /* UNIX: absolute path; else NULL */
    char *text;         /* as written in the file, for logs and STATS */
};

enum log_level_value { /* same order as log.h's levels */
    CONF_LOG_DEBUG, CONF_LOG_INFO, CONF_LOG_NOTICE, CONF_LOG_WARNING,
    CONF_LOG_ERROR,
};

struct conf {
    char *path;                     /* file it came from, or NULL */

    struct conf_addr *listen;       /* "listen" */
    size_t nlisten;
    unsigned unix_socket_mode;      /* "unix_socket_mode", octal string "0660" */

    struct {
        struct conf_addr *nodes;    /* "redis.nodes", 1..64 entries */
        size_t nnodes;
        char *username;             /* NULL = none */
        char *password;             /* from password or password_file */
        int db;                     /* 0..1000 */
        unsigned pool_size;         /* 1..64, default 2 */
        unsigned connect_timeout_ms;/* 1..600000, default 1000 */
        unsigned command_timeout_ms;/* 1..600000, default 100 */
        unsigned reconnect_max_ms;  /* 1..3600000, default 5000 */
        unsigned probe_interval_ms; /* 10..600000, default 1000: each node
                                       is asked something this often */
    } redis;

    struct {
        char *key_prefix;           /* default "lock:", 0..128 bytes */
        char *fence_key;            /* added: default "redlockd:fence" */
        char *release_channel;      /* added: default "redlockd:released" */
        unsigned default_ttl_ms;    /* 30000, within [min_ttl_ms, max_ttl_ms] */
        unsigned min_ttl_ms;        /* 100, >= 10 */
        unsigned max_ttl_ms;        /* 86400000 */
        unsigned max_wait_ms;       /* 3600000 */
        double drift_factor;        /* 0.01, 0 <= x < 0.5 */
        unsigned lock_delay_ms;     /* 0 */
        unsigned max_resource_len;  /* 200, 1..1024 */
        unsigned retry_ms;          /* added: waiters' fallback poll, 500 */
    } locks;

    struct {
        unsigned max_clients;       /* 10000, 1..1000000 */
        unsigned max_line;          /* 4096, 64..1048576 */
        unsigned max_locks_per_session; /* 1024, 1..1000000 */
        unsigned max_pipeline;      /* 128, 1..65536 */
        unsigned max_output_bytes;  /* 1048576, 4096..1073741824 */
        unsigned idle_timeout_ms;   /* 0 = off */
        unsigned handshake_timeout_ms; /* 10000, 0 = off */
    } limits;

    struct {
        char *password;             /* from password or password_file; NULL = none */
        bool protected_mode;        /* true */
    } auth;

    struct {
        struct conf_addr *listen;   /* NULL = none */
    } metrics;

    struct {
        int level;                  /* enum log_level_value, default INFO */
    } log;

    unsigned shutdown_timeout_ms;   /* 5000 */
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

#endif
