/*
 * libredlockd: a small blocking C client for the redlockd lock service.
 *
 * One handle is one connection, and one connection is one daemon session:
 * every lock taken through a handle is held for as long as the handle stays
 * connected (the daemon renews the lease), and is released by the daemon the
 * moment the connection drops. Build with `pkg-config --cflags --libs
 * redlockd`. The wire protocol is described in docs/protocol.md.
 *
 *     struct redlockd *h;
 *     struct redlockd_lease lease;
 *     struct redlockd_error err;
 *
 *     if (redlockd_connect(&h, NULL, &err) < 0)
 *         die(err.msg);
 *     if (redlockd_lock(h, "job:42", 0, 5000, 1, &lease) == 0) {
 *         do_work(lease.fence);          // check redlockd_lost() as you go
 *         redlockd_unlock(h, "job:42");
 *     }
 *     redlockd_close(h);
 *
 * Return values: every function that can fail returns 0 (or a count) on
 * success and the negated code, -REDLOCKD_E_*, on failure. The failing
 * call's code and message are then kept in the handle: see
 * redlockd_last_error(). redlockd_strerror() accepts the code with either
 * sign.
 *
 * Threads: the library has no global state. A handle must be used by one
 * thread at a time (use one handle, that is one connection, per thread);
 * different handles may be used from different threads freely.
 *
 * Transport errors (REDLOCKD_E_IO, _IO_TIMEOUT, _CLOSED, _PROTO, and
 * _NOMEM while reading) close the connection, as does REDLOCKD_E_TOOLONG:
 * the daemon then releases every lock of the handle, so redlockd_lost()
 * answers 1 for all of them, and later calls fail with REDLOCKD_E_CLOSED
 * (redlockd_fd() is -1). Reconnect with a new handle. Other errors the
 * daemon answers with (REDLOCKD_E_BUSY and friends) and REDLOCKD_E_INVALID
 * leave the connection usable.
 */
#ifndef REDLOCKD_CLIENT_H
#define REDLOCKD_CLIENT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REDLOCKD_DEFAULT_SERVER "127.0.0.1:7390"
#define REDLOCKD_SERVER_ENV "REDLOCKD_SERVER"
/* The longest resource name the library accepts. The daemon's own limit
 * (locks.max_resource_len, default 200) applies too. */
#define REDLOCKD_RESOURCE_MAX 1024
#define REDLOCKD_TOKEN_LEN 32

enum redlockd_code {
    REDLOCKD_OK = 0,
    /* Answered by the daemon (ERR <CODE>); the connection stays usable
     * except after TOOLONG. One per protocol error code. */
    REDLOCKD_E_ARG,         /* malformed request */
    REDLOCKD_E_UNKNOWN,     /* unknown command */
    REDLOCKD_E_TOOLONG,     /* request line too long (daemon closes) */
    REDLOCKD_E_NOAUTH,      /* a password is required */
    REDLOCKD_E_AUTH,        /* wrong password */
    REDLOCKD_E_BUSY,        /* held by someone else, wait was 0 */
    REDLOCKD_E_TIMEOUT,     /* wait ran out before the lock could be had */
    REDLOCKD_E_HELD,        /* this session already holds the resource */
    REDLOCKD_E_NOTHELD,     /* this session does not hold the resource */
    REDLOCKD_E_LOST,        /* the lease was lost */
    REDLOCKD_E_UNAVAILABLE, /* no quorum of Redis nodes */
    REDLOCKD_E_LIMIT,       /* a configured limit was hit */
    REDLOCKD_E_SHUTDOWN,    /* the daemon is stopping */
    REDLOCKD_E_OTHER,       /* an ERR code this library does not know */
    /* Found by the library. */
    REDLOCKD_E_IO,          /* connect, send or receive failed (errno text) */
    REDLOCKD_E_IO_TIMEOUT,  /* connect or I/O timeout ran out */
    REDLOCKD_E_CLOSED,      /* the connection is closed (by the daemon, or
                               after an earlier transport error) */
    REDLOCKD_E_PROTO,       /* the daemon sent something unparseable */
    REDLOCKD_E_NOMEM,       /* out of memory */
    REDLOCKD_E_INVALID,     /* bad argument to the library; nothing sent */
    REDLOCKD_CODE_COUNT
};

struct redlockd_error {
    int code;               /* enum redlockd_code, positive; 0 = no error */
    char msg[256];          /* the daemon's message, or errno text */
};

/*
 * Connection options. Zero-initialise and set what you need: every zero or
 * NULL field means "the default".
 */
struct redlockd_opts {
    /* "tcp://HOST:PORT", "HOST:PORT", "[IPV6]:PORT", "unix:/PATH" or a path
     * starting with '/'. The port defaults to 7390. NULL: $REDLOCKD_SERVER,
     * else REDLOCKD_DEFAULT_SERVER. */
    const char *server;
    int connect_timeout_ms;     /* 0: 5000; negative: none */
    /* How long to wait for each reply (LOCK adds its wait to it).
     * 0: 10000; negative: none. */
    int io_timeout_ms;
    const char *name;           /* HELLO name=, shown by SESSIONS */
    /* HELLO keepalive=: the daemon ends the session when nothing has
     * arrived for this long, so call redlockd_ping() more often. 0: off. */
    unsigned keepalive_ms;
    const char *password;       /* sent with AUTH when not NULL */
    /*
     * Called from inside library calls (any request, redlockd_poll_events)
     * when the daemon reports EVENT LOST, with that event's fields; and once
     * with resource NULL, fence 0 and reason "disconnected" when the
     * connection is lost, which means every lease of the handle is gone.
     * It must not make requests on the same handle (they fail with
     * REDLOCKD_E_INVALID); redlockd_lost() is fine.
     */
    void (*on_lost)(const char *resource, uint64_t fence, const char *reason,
                    void *ud);
    void *ud;
};

struct redlockd_lease {
    char resource[REDLOCKD_RESOURCE_MAX + 1];
    char token[REDLOCKD_TOKEN_LEN + 1]; /* the random value in Redis */
    uint64_t fence;     /* fencing token: pass it to the guarded storage */
    uint32_t ttl;       /* lease on Redis, ms */
    int64_t validity;   /* ms the lock was certainly valid for when granted */
};

/* What the daemon said to HELLO. */
struct redlockd_info {
    char session[64];   /* "s7" */
    char server[64];    /* "redlockd/0.1.0" */
    unsigned nodes;     /* Redis nodes configured */
    unsigned quorum;
};

struct redlockd;

/*
 * Connect, send HELLO (proto=1, name, keepalive) and AUTH when a password
 * is given. opts may be NULL. On failure *out is NULL and err (if not NULL)
 * says why.
 */
int redlockd_connect(struct redlockd **out, const struct redlockd_opts *opts,
                     struct redlockd_error *err);

/* Send QUIT (so the daemon releases the locks at once, without
 * lock_delay_ms), close and free. NULL is fine. */
void redlockd_close(struct redlockd *h);

/*
 * LOCK: ttl_ms 0 = the daemon's default; wait_ms 0 = fail with
 * REDLOCKD_E_BUSY at once, else wait up to that long (REDLOCKD_E_TIMEOUT);
 * renew 1 = the daemon keeps the lease alive while connected. lease may be
 * NULL.
 */
int redlockd_lock(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                  uint32_t wait_ms, int renew, struct redlockd_lease *lease);
int redlockd_unlock(struct redlockd *h, const char *resource);
/* EXTEND: set the lease to ttl_ms; validity_ms may be NULL. */
int redlockd_extend(struct redlockd *h, const char *resource, uint32_t ttl_ms,
                    int64_t *validity_ms);
int redlockd_ping(struct redlockd *h);

/* Inspection: *json gets the daemon's JSON object as a malloc'd string,
 * to be released with free(). */
int redlockd_locks(struct redlockd *h, char **json);
int redlockd_status(struct redlockd *h, const char *resource, char **json);
int redlockd_sessions(struct redlockd *h, char **json);
int redlockd_stats(struct redlockd *h, char **json);

/*
 * 1 if the lease on resource taken through this handle was lost (EVENT LOST
 * arrived, UNLOCK/EXTEND answered ERR LOST, or the connection is gone),
 * else 0. Taking the resource again clears it. Only events already read
 * count: call redlockd_poll_events() while idle.
 */
int redlockd_lost(const struct redlockd *h, const char *resource);

/*
 * Read EVENT lines that have arrived, without sending anything. Waits up to
 * timeout_ms for at least one (0: do not wait, negative: forever). Returns
 * the number of events handled, or a negative code (connection closed...).
 */
int redlockd_poll_events(struct redlockd *h, int timeout_ms);

/* The socket, to wait for readability with poll() alongside other work,
 * then call redlockd_poll_events(h, 0). -1 once closed. */
int redlockd_fd(const struct redlockd *h);

/* 1 once the daemon has sent EVENT SHUTDOWN. */
int redlockd_shutting_down(const struct redlockd *h);

const struct redlockd_info *redlockd_info(const struct redlockd *h);
/* The last failure on this handle (code 0 if the last call succeeded). */
const struct redlockd_error *redlockd_last_error(const struct redlockd *h);
/* A fixed description of a code, for either sign; never NULL. */
const char *redlockd_strerror(int code);
/* "BUSY" for REDLOCKD_E_BUSY, "IO" for REDLOCKD_E_IO...; never NULL. */
const char *redlockd_code_name(int code);

/* ---- lock kinds: shared, semaphores, several resources ------------------
 * (docs/protocol.md, "Additions"). New calls beside redlockd_lock, which
 * keeps its meaning. */

enum redlockd_mode {
    REDLOCKD_EXCLUSIVE = 0,     /* the default */
    REDLOCKD_SHARED = 1,        /* any number of shared holders at once */
};

/* Zero-initialise and set what you need: every zero means the default. */
struct redlockd_lock_opts {
    uint32_t ttl_ms;            /* 0: the daemon's default */
    uint32_t wait_ms;           /* 0: REDLOCKD_E_BUSY at once */
    int no_renew;               /* 1: renew=0 (the lease just expires) */
    enum redlockd_mode mode;    /* SHARED: one resource, no limit */
    uint32_t limit;             /* K > 0: one of K slots of a semaphore
                                   (one resource; every holder the same K) */
};

/* What a redlockd_lockv grant is. */
struct redlockd_grant {
    struct redlockd_lease lease;    /* resource: the first name */
    unsigned nresources;            /* names granted (all of them) */
    enum redlockd_mode mode;
    uint32_t limit;                 /* K, or 0 */
    uint32_t slot;                  /* limit > 0: the slot held */
};

/*
 * LOCK n resources (1 to the daemon's locks.max_multi, none twice), all or
 * none, with opts (NULL: all defaults). Several resources are exclusive
 * only and share one token and fence; afterwards each is held on its own
 * (redlockd_unlock, redlockd_extend, redlockd_lost name one). grant may be
 * NULL. Errors as redlockd_lock, and REDLOCKD_E_ARG for a mode, limit or
 * number of names the daemon refuses (a K that disagrees with the one its
 * other holders use).
 */
int redlockd_lockv(struct redlockd *h, const char *const *resources, size_t n,
                   const struct redlockd_lock_opts *opts,
                   struct redlockd_grant *grant);
/* UNLOCK n resources at once; REDLOCKD_E_NOTHELD (nothing released) when
 * one is not held, REDLOCKD_E_LOST when one had been lost (the others are
 * released). */
int redlockd_unlockv(struct redlockd *h, const char *const *resources,
                     size_t n);

#ifdef __cplusplus
}
#endif

#endif
