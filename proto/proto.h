/*
 * proto: the redlockd wire protocol v1 as a pure library.
 *
 * Bytes in, validated structs out (proto_parse); structs in, reply lines out
 * (proto_format_*); reply lines in, structs out (proto_reply_parse, used by
 * the client library). No sockets, no loop, no globals. The daemon, the
 * client library, the tests and the fuzzer all link it.
 *
 * Command names and error codes live in the X-macro tables below, so the
 * enums, the wire words, HELP and the default messages cannot drift apart.
 * docs/protocol.md describes the protocol for people.
 */
#ifndef REDLOCKD_PROTO_H
#define REDLOCKD_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "num.h"
#include "sbuf.h"

#define PROTO_VERSION 1

/* X(enum suffix, wire word, usage line for HELP <command>) */
#define PROTO_COMMANDS(X)                                                   \
    X(PING, "PING", "PING [word]")                                          \
    X(HELLO, "HELLO", "HELLO [proto=1] [name=<client-name>] "               \
                      "[keepalive=<ms>] [detach=<ms>] "                     \
                      "[resume=<session> secret=<hex>]")                    \
    X(AUTH, "AUTH", "AUTH [<user>] <password>")                             \
    X(LOCK, "LOCK", "LOCK <resource>... [ttl=<ms>] [wait=<ms>] [renew=0|1] " \
                    "[mode=shared|exclusive] [limit=<n>] [value=<text>]")   \
    X(UNLOCK, "UNLOCK", "UNLOCK <resource>...")                             \
    X(ADOPT, "ADOPT", "ADOPT <resource>... token=<hex> [ttl=<ms>] "          \
                      "[renew=0|1]")                                        \
    X(EXTEND, "EXTEND", "EXTEND <resource> [ttl=<ms>] [value=<text>] "      \
                        "(one of them at least)")                           \
    X(LOCKS, "LOCKS", "LOCKS")                                              \
    X(STATUS, "STATUS", "STATUS <resource> [limit=<n>]")                    \
    X(SESSIONS, "SESSIONS", "SESSIONS")                                     \
    X(STATS, "STATS", "STATS")                                              \
    X(TOP, "TOP", "TOP [limit=<n>]")                                        \
    X(FORCEUNLOCK, "FORCEUNLOCK", "FORCEUNLOCK <resource> (admin only)")    \
    X(READMIT, "READMIT", "READMIT <node>|all (admin only: end a recovery)") \
    X(WATCH, "WATCH", "WATCH <resource>... (EVENT HOLDER now and on each "  \
                      "change)")                                            \
    X(UNWATCH, "UNWATCH", "UNWATCH <resource>...")                          \
    X(HELP, "HELP", "HELP [command]")                                       \
    X(QUIT, "QUIT", "QUIT")

enum proto_cmd {
    PROTO_CMD_NONE = 0,
#define X(name, word, usage) PROTO_CMD_##name,
    PROTO_COMMANDS(X)
#undef X
    PROTO_CMD_COUNT
};

/* X(enum suffix, wire word, default message) */
#define PROTO_ERRORS(X)                                                     \
    X(ARG, "ARG", "malformed request")                                      \
    X(UNKNOWN, "UNKNOWN", "unknown command")                                \
    X(TOOLONG, "TOOLONG", "request line too long")                          \
    X(NOAUTH, "NOAUTH", "authentication required")                          \
    X(AUTH, "AUTH", "invalid password")                                     \
    X(BUSY, "BUSY", "resource is held by someone else")                     \
    X(TIMEOUT, "TIMEOUT", "timed out waiting for the lock")                 \
    X(HELD, "HELD", "this session already holds the resource")             \
    X(NOTHELD, "NOTHELD", "this session does not hold the resource")        \
    X(LOST, "LOST", "the lease on the resource was lost")                   \
    X(UNAVAILABLE, "UNAVAILABLE", "a quorum of redis nodes is unavailable") \
    X(LIMIT, "LIMIT", "a configured limit was reached")                     \
    X(SHUTDOWN, "SHUTDOWN", "the daemon is shutting down")                  \
    X(NOSESSION, "NOSESSION", "no such session, or a wrong secret")         \
    X(DENIED, "DENIED", "this user may not do that to that resource")

enum proto_err {
    PROTO_ERR_NONE = 0,
#define X(name, word, msg) PROTO_ERR_##name,
    PROTO_ERRORS(X)
#undef X
    PROTO_ERR_COUNT
};

/* Bits of proto_request.has: which options were given. */
enum proto_opt {
    PROTO_OPT_TTL = 1u << 0,
    PROTO_OPT_WAIT = 1u << 1,
    PROTO_OPT_RENEW = 1u << 2,
    PROTO_OPT_PROTO = 1u << 3,
    PROTO_OPT_NAME = 1u << 4,
    PROTO_OPT_KEEPALIVE = 1u << 5,
    PROTO_OPT_MODE = 1u << 6,
    PROTO_OPT_LIMIT = 1u << 7,
    PROTO_OPT_DETACH = 1u << 8,
    PROTO_OPT_RESUME = 1u << 9,
    PROTO_OPT_SECRET = 1u << 10,
    PROTO_OPT_TOKEN = 1u << 11,
    PROTO_OPT_VALUE = 1u << 12,
};

/* LOCK mode=: exclusive (the default) or shared. */
enum proto_mode { PROTO_MODE_EXCLUSIVE = 0, PROTO_MODE_SHARED };

/* Checks that depend on configuration; everything else is fixed by v1. */
struct proto_limits {
    size_t max_resource_len;    /* default PROTO_RESOURCE_LEN_DEFAULT */
    size_t max_value_len;       /* value=; 0: PROTO_VALUE_LEN_DEFAULT */
};

/* The daemon's locks.max_resource_len: its default, and the most it may be
 * set to. A client cannot ask a daemon for its value, so the client library
 * checks names against the latter and leaves the rest to the daemon. */
#define PROTO_RESOURCE_LEN_DEFAULT 200
#define PROTO_RESOURCE_LEN_MAX 1024
#define PROTO_LIMITS_DEFAULT { PROTO_RESOURCE_LEN_DEFAULT, \
                               PROTO_VALUE_LEN_DEFAULT }
/* The daemon's locks.max_value_len (a holder's value=, visible ASCII):
 * its default and the most it may be set to. */
#define PROTO_VALUE_LEN_DEFAULT 256
#define PROTO_VALUE_LEN_MAX 4096
#define PROTO_MAX_NAME_LEN 64   /* HELLO name=: 1..64 visible ASCII bytes */
#define PROTO_MAX_SESSION_LEN 39 /* HELLO resume=: a session id's bytes */
#define PROTO_SECRET_LEN 32     /* HELLO secret=: hex digits (128 bits) */
#define PROTO_TOKEN_LEN 32      /* ADOPT token=: a lock token's hex digits */
#define PROTO_MAX_ERRMSG 160
/* The most resources one LOCK or UNLOCK may name (the daemon's
 * locks.max_multi is at most this). */
#define PROTO_MAX_RESOURCES 256
/* A request's tag: "#<tag> " before it, 1..32 of A-Z a-z 0-9 _ - . :
 * (protocol.md, "Tagged requests"); its reply carries the same prefix. */
#define PROTO_MAX_TAG 32

/*
 * One parsed request. String fields point into the line passed to
 * proto_parse (which is modified in place: word separators become NUL), so
 * the request is valid only while that line buffer lives.
 */
struct proto_request {
    const char *tag;        /* "#<tag> " before the request: the tag (not
                               NUL-terminated: tag_len bytes), or NULL */
    size_t tag_len;
    enum proto_cmd cmd;
    const char *arg;        /* resource (LOCK UNLOCK EXTEND STATUS), word
                               (PING, may be NULL), password (AUTH; with
                               two words the user, and args[] holds
                               both); the first of args */
    size_t arg_len;
    size_t nargs;           /* LOCK, UNLOCK: resources named (no name
                               twice), in request order */
    const char *args[PROTO_MAX_RESOURCES];
    size_t args_len[PROTO_MAX_RESOURCES];
    unsigned has;           /* PROTO_OPT_* bits */
    uint32_t ttl;           /* ttl= */
    uint32_t wait;          /* wait= */
    bool renew;             /* renew=, true unless renew=0 was given */
    enum proto_mode mode;   /* mode= */
    uint32_t limit;         /* limit= (1 and up; 0 when not given) */
    uint32_t proto;         /* proto= (only 1 is accepted) */
    uint32_t keepalive;     /* keepalive= (0 = off) */
    uint32_t detach;        /* detach= (0 = off) */
    const char *resume;     /* resume=: a session id (visible ASCII) */
    size_t resume_len;
    const char *secret;     /* secret=: PROTO_SECRET_LEN hex digits */
    const char *token;      /* token=: PROTO_TOKEN_LEN hex digits */
    const char *name;       /* name= */
    size_t name_len;
    const char *value;      /* value= (LOCK exclusive, EXTEND): the
                               holder's value, visible ASCII */
    size_t value_len;
};

/* Result of proto_parse. */
enum proto_parse_status {
    PROTO_PARSE_OK = 0,     /* *req is filled in */
    PROTO_PARSE_EMPTY,      /* empty or blank line: ignore, send nothing */
    PROTO_PARSE_ERROR,      /* send ERR <code> <errmsg> */
};

struct proto_error {
    enum proto_err code;
    char msg[PROTO_MAX_ERRMSG];     /* human-readable, printable ASCII */
};

/*
 * Parse one request line. `line` holds `len` bytes without the LF (the
 * framing layer splits lines and handles max_line / TOOLONG); one trailing CR
 * is dropped here. The buffer must have room for len+1 bytes: it is
 * NUL-terminated and split in place. Rules (protocol.md): any control byte
 * other than TAB (NUL and a CR not at the end included) -> ERR ARG; command
 * names case-insensitive; options lower-case name=value, unknown or repeated
 * options -> ERR ARG; numbers decimal digits only, at most 4294967295;
 * resources 1..max_resource_len bytes of 0x21-0x7E; LOCK and UNLOCK take
 * up to PROTO_MAX_RESOURCES of them, none named twice.
 *
 * A line that starts with '#' is tagged: the first word, less the '#', is
 * the tag (1..PROTO_MAX_TAG bytes of PROTO_TAG_CHARS), and the request
 * follows. A malformed tag (empty, too long, a byte outside the set,
 * nothing after it) is an error with req->tag NULL: its reply goes
 * untagged. Once the tag is read, req->tag is set, also when the rest
 * fails: that error is the tagged request's answer.
 */
enum proto_parse_status proto_parse(char *line, size_t len,
                                    const struct proto_limits *lim,
                                    struct proto_request *req,
                                    struct proto_error *err);

/* The bytes a tag may hold. */
#define PROTO_TAG_CHARS \
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.:"
/* 1 if s[0..len) is a valid tag (without its '#'), else 0. */
int proto_valid_tag(const char *s, size_t len);

/* 1 if s[0..len) is a valid resource name under lim, else 0. */
int proto_valid_resource(const char *s, size_t len,
                         const struct proto_limits *lim);

const char *proto_cmd_name(enum proto_cmd cmd);     /* "LOCK"; NULL if out of range */
const char *proto_opt_name(enum proto_opt opt);     /* "ttl"; NULL if unknown */
const char *proto_err_word(enum proto_err code);    /* "BUSY" */
const char *proto_err_default_msg(enum proto_err code);
enum proto_err proto_err_from_word(const char *word, size_t len); /* NONE if unknown */

/*
 * Formatting. Each call appends exactly one complete LF-terminated line,
 * or (ok_begin / kv_* / end) builds one in steps:
 *
 *     proto_format_ok_begin(b);
 *     proto_format_kv_str(b, "resource", r);
 *     proto_format_kv_u64(b, "fence", 17);
 *     proto_format_end(b);                  -> "OK resource=job:42 fence=17\n"
 *
 * Values given to kv_str must not contain spaces or control bytes; any such
 * byte is replaced by '_' so a reply line can never be split or forged.
 *
 * Requests (the client side) are built the same way, from the command
 * table, so a client can never spell a command differently from the
 * parser:
 *
 *     proto_format_cmd(b, PROTO_CMD_LOCK);
 *     proto_format_word(b, "job:42");
 *     proto_format_opt_u64(b, PROTO_OPT_TTL, 5000);
 *     proto_format_end(b);                  -> "LOCK job:42 ttl=5000\n"
 */
/* "#<tag> ": put before a tagged request's reply (and by a client before
 * its request); the tag must be valid (proto_valid_tag). */
void proto_format_tag(struct sbuf *b, const char *tag, size_t len);

/* A grant (LOCK, ADOPT) in one call:
 * "OK resource=<r>|resources=<n> token= fence= ttl= validity= [mode=shared]
 * [limit= slot=]\n" */
struct proto_grant {
    const char *resource;   /* the first resource */
    size_t nresources;      /* more than 1: "resources=<n>" instead */
    const char *token;
    uint64_t fence;
    uint32_t ttl;
    int64_t validity;
    bool shared;
    uint32_t limit, slot;   /* a semaphore slot: limit > 0 */
};
void proto_format_grant(struct sbuf *b, const struct proto_grant *g);

void proto_format_ok_begin(struct sbuf *b);
void proto_format_kv_str(struct sbuf *b, const char *key, const char *val);
void proto_format_kv_strn(struct sbuf *b, const char *key, const char *val,
                          size_t len);
void proto_format_kv_u64(struct sbuf *b, const char *key, uint64_t val);
void proto_format_kv_i64(struct sbuf *b, const char *key, int64_t val);
void proto_format_word(struct sbuf *b, const char *word);  /* " word" */
void proto_format_end(struct sbuf *b);                     /* "\n" */
/* "LOCK": the command's wire word; nothing for an out-of-range cmd. */
void proto_format_cmd(struct sbuf *b, enum proto_cmd cmd);
/* " ttl=5000", " name=alice": an option by its PROTO_OPT_* bit, named from
 * the parser's option table; nothing for an unknown bit. */
void proto_format_opt_u64(struct sbuf *b, enum proto_opt opt, uint64_t val);
void proto_format_opt_str(struct sbuf *b, enum proto_opt opt,
                          const char *val);
/* A whole request without options: "QUIT\n", or with arg "UNLOCK x\n". */
void proto_format_request(struct sbuf *b, enum proto_cmd cmd,
                          const char *arg);

void proto_format_ok(struct sbuf *b);                      /* "OK\n" */
/* "OK <json>\n": json must be one line (jansson JSON_COMPACT output). */
void proto_format_ok_json(struct sbuf *b, const char *json);
/* "PONG\n" or "PONG <word>\n" */
void proto_format_pong(struct sbuf *b, const char *word, size_t len);
/* "ERR <CODE> <msg>\n"; msg NULL -> default message; non-printable bytes of
 * msg are replaced so untrusted text can be echoed safely. */
void proto_format_err(struct sbuf *b, enum proto_err code, const char *msg);
void proto_format_errf(struct sbuf *b, enum proto_err code, const char *fmt,
                       ...) __attribute__((format(printf, 3, 4)));
/* EVENT HOLDER (protocol.md, "Watching a lock"): who holds a watched
 * resource now. */
struct proto_holder {
    const char *resource;
    uint64_t held;              /* holders: 0 free, 1 exclusive, shared
                                   holders, or semaphore slots used */
    bool foreign;               /* another Redlock client's key */
    const char *mode;           /* "exclusive", "shared", "semaphore", or
                                   NULL (free, foreign) */
    uint32_t limit;             /* semaphore: K */
    uint64_t fence;             /* exclusive: */
    const char *name;           /* "" when the holder gave none */
    const char *daemon;
    const char *value;          /* NULL or "": none */
};
void proto_format_event_holder(struct sbuf *b, const struct proto_holder *h);
/* "EVENT LOST resource=<r> fence=<n> reason=<reason>\n" */
void proto_format_event_lost(struct sbuf *b, const char *resource,
                             uint64_t fence, const char *reason);
/* "EVENT SHUTDOWN\n" */
void proto_format_event_shutdown(struct sbuf *b);
/* "EVENT CLOSING reason=<reason>\n": the daemon closes this connection
 * on its own (handshake, idle, keepalive, output, auth, shutdown). */
void proto_format_event_closing(struct sbuf *b, const char *reason);
/* "OK PING HELLO AUTH ...\n" from the command table */
void proto_format_help(struct sbuf *b);
/* "OK <usage line>\n" of cmd (HELP <command>). */
void proto_format_usage(struct sbuf *b, enum proto_cmd cmd);
/* The command named by word (any case), or PROTO_CMD_NONE. */
enum proto_cmd proto_cmd_lookup(const char *word, size_t len);

/*
 * Reply parsing (client side). `line` is one line without LF (a trailing CR
 * is dropped); as for proto_parse the buffer must have room for len+1 bytes
 * (the LF's place will do). It is modified in place and the struct points
 * into it. Returns 0, or -1 with kind PROTO_REPLY_INVALID for a line that is
 * not a v1 reply or event (unknown first word, control bytes, ERR or EVENT
 * without a word, PONG with more than one word).
 */
enum proto_reply_kind {
    PROTO_REPLY_INVALID = 0,
    PROTO_REPLY_OK,         /* "OK" [kv words | json] */
    PROTO_REPLY_PONG,       /* "PONG" [word] */
    PROTO_REPLY_ERR,        /* "ERR CODE msg" */
    PROTO_REPLY_EVENT,      /* "EVENT NAME kv..." */
};

#define PROTO_REPLY_MAX_KV 32

struct proto_kv {
    const char *key;
    const char *val;
};

struct proto_reply {
    const char *tag;        /* the reply's "#<tag> " (tag_len bytes, not
                               NUL-terminated), or NULL: untagged */
    size_t tag_len;
    enum proto_reply_kind kind;
    enum proto_err err;     /* ERR: the code (NONE if the word is unknown) */
    const char *err_word;   /* ERR: the code word as sent */
    const char *text;       /* ERR: message; OK: the JSON object when the
                               text after "OK " starts with '{', else "";
                               PONG: word; EVENT: name ("LOST",
                               "SHUTDOWN"); never NULL, "" if none */
    size_t nkv;             /* OK (non-JSON) / EVENT: words found; a word
                               without '=' (e.g. "bye") has val "" */
    struct proto_kv kv[PROTO_REPLY_MAX_KV];
};

/* A reply may start with "#<tag> " (the answer to a tagged request); an
 * EVENT never does. */
int proto_reply_parse(char *line, size_t len, struct proto_reply *r);
/* Value of key in r->kv, or NULL. */
const char *proto_reply_get(const struct proto_reply *r, const char *key);

#endif
