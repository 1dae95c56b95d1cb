/*
 * Unit tests for proto/: the request parser, the number and name readers
 * (num.c), the reply and request formatters, the client-side reply parser
 * and sbuf. The address grammar (addr.c) has its own test_addr.c.
 *
 * Inputs that vary are kept in tables and run with tcase_add_loop_test, so
 * a failure names the table row (the loop index) and the line under test.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Line buffer for one parse; requests point into it. */
static char t_line[4096];

static enum proto_parse_status t_parsen(const char *s, size_t len,
                                        const struct proto_limits *lim,
                                        struct proto_request *req,
                                        struct proto_error *err)
{
    ck_assert_uint_lt(len, sizeof(t_line));
    memcpy(t_line, s, len);
    /* Poison the spare byte: proto_parse must terminate the line itself. */
    t_line[len] = 'X';
    return proto_parse(t_line, len, lim, req, err);
}

static enum proto_parse_status t_parse(const char *s, struct proto_request *req,
                                       struct proto_error *err)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;

    return t_parsen(s, strlen(s), &lim, req, err);
}

static void t_assert_safe_msg(const char *msg)
{
    size_t i, n = strlen(msg);

    ck_assert_uint_gt(n, 0);
    ck_assert_uint_lt(n, PROTO_MAX_ERRMSG);
    for (i = 0; i < n; i++)
        ck_assert_msg(msg[i] >= 0x20 && msg[i] <= 0x7e,
                      "byte %zu of \"%s\" is not printable", i, msg);
}

/* ---- valid requests ---------------------------------------------------- */

#define NAME64 "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
_Static_assert(sizeof(NAME64) == PROTO_MAX_NAME_LEN + 1, "NAME64 length");

struct t_valid {
    const char *line;
    enum proto_cmd cmd;
    const char *arg;        /* NULL: no argument expected */
    unsigned has;
    uint32_t ttl, wait;
    bool renew;
    uint32_t proto, keepalive;
    const char *name;
};

static const struct t_valid t_valid_rows[] = {
    { "PING", PROTO_CMD_PING, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "ping", PROTO_CMD_PING, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "PiNg hello", PROTO_CMD_PING, "hello", 0, 0, 0, true, 0, 0, NULL },
    { "PING a=b", PROTO_CMD_PING, "a=b", 0, 0, 0, true, 0, 0, NULL },
    { "PING caf\xc3\xa9", PROTO_CMD_PING, "caf\xc3\xa9", 0, 0, 0, true, 0, 0,
      NULL },
    { "PING\r", PROTO_CMD_PING, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "PING x\r", PROTO_CMD_PING, "x", 0, 0, 0, true, 0, 0, NULL },
    { "HELLO", PROTO_CMD_HELLO, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "hello proto=1 name=alice keepalive=5000", PROTO_CMD_HELLO, NULL,
      PROTO_OPT_PROTO | PROTO_OPT_NAME | PROTO_OPT_KEEPALIVE, 0, 0, true, 1,
      5000, "alice" },
    { "HELLO keepalive=0", PROTO_CMD_HELLO, NULL, PROTO_OPT_KEEPALIVE, 0, 0,
      true, 0, 0, NULL },
    { "HELLO detach=60000", PROTO_CMD_HELLO, NULL, PROTO_OPT_DETACH, 0, 0,
      true, 0, 0, NULL },
    { "HELLO resume=s2.mx58bw50 secret=0123456789abcdef0123456789abcdef",
      PROTO_CMD_HELLO, NULL, PROTO_OPT_RESUME | PROTO_OPT_SECRET, 0, 0, true,
      0, 0, NULL },
    { "HELLO name=" NAME64, PROTO_CMD_HELLO, NULL, PROTO_OPT_NAME, 0, 0, true,
      0, 0, NAME64 },
    { "HELLO name=a=b", PROTO_CMD_HELLO, NULL, PROTO_OPT_NAME, 0, 0, true, 0,
      0, "a=b" },
    { "AUTH s3cret", PROTO_CMD_AUTH, "s3cret", 0, 0, 0, true, 0, 0, NULL },
    { "auth a=b", PROTO_CMD_AUTH, "a=b", 0, 0, 0, true, 0, 0, NULL },
    { "AUTH p\xc3\xa4ss", PROTO_CMD_AUTH, "p\xc3\xa4ss", 0, 0, 0, true, 0, 0,
      NULL },
    { "LOCK job:42", PROTO_CMD_LOCK, "job:42", 0, 0, 0, true, 0, 0, NULL },
    { "lock job:42 ttl=10000 wait=500 renew=0", PROTO_CMD_LOCK, "job:42",
      PROTO_OPT_TTL | PROTO_OPT_WAIT | PROTO_OPT_RENEW, 10000, 500, false, 0,
      0, NULL },
    { "Lock job:42 renew=1", PROTO_CMD_LOCK, "job:42", PROTO_OPT_RENEW, 0, 0,
      true, 0, 0, NULL },
    { "LOCK ttl=100 job:1", PROTO_CMD_LOCK, "job:1", PROTO_OPT_TTL, 100, 0,
      true, 0, 0, NULL },
    { "LOCK r wait=0", PROTO_CMD_LOCK, "r", PROTO_OPT_WAIT, 0, 0, true, 0, 0,
      NULL },
    { "LOCK r ttl=007", PROTO_CMD_LOCK, "r", PROTO_OPT_TTL, 7, 0, true, 0, 0,
      NULL },
    { "LOCK r ttl=4294967295 wait=4294967295", PROTO_CMD_LOCK, "r",
      PROTO_OPT_TTL | PROTO_OPT_WAIT, 4294967295u, 4294967295u, true, 0, 0,
      NULL },
    { "  LOCK\tjob:1 \t ttl=7  ", PROTO_CMD_LOCK, "job:1", PROTO_OPT_TTL, 7,
      0, true, 0, 0, NULL },
    { "LOCK    a    wait=1\r", PROTO_CMD_LOCK, "a", PROTO_OPT_WAIT, 0, 1,
      true, 0, 0, NULL },
    /* Durations with units; replies keep milliseconds. */
    { "LOCK r ttl=30s wait=500ms", PROTO_CMD_LOCK, "r",
      PROTO_OPT_TTL | PROTO_OPT_WAIT, 30000, 500, true, 0, 0, NULL },
    { "LOCK r ttl=2m wait=1.5s", PROTO_CMD_LOCK, "r",
      PROTO_OPT_TTL | PROTO_OPT_WAIT, 120000, 1500, true, 0, 0, NULL },
    { "LOCK r ttl=1h wait=0s", PROTO_CMD_LOCK, "r",
      PROTO_OPT_TTL | PROTO_OPT_WAIT, 3600000, 0, true, 0, 0, NULL },
    { "EXTEND r ttl=0.25m", PROTO_CMD_EXTEND, "r", PROTO_OPT_TTL, 15000, 0,
      true, 0, 0, NULL },
    { "HELLO keepalive=5s", PROTO_CMD_HELLO, NULL, PROTO_OPT_KEEPALIVE, 0, 0,
      true, 0, 5000, NULL },
    { "LOCK !~#{}[]", PROTO_CMD_LOCK, "!~#{}[]", 0, 0, 0, true, 0, 0, NULL },
    { "UNLOCK job:42", PROTO_CMD_UNLOCK, "job:42", 0, 0, 0, true, 0, 0, NULL },
    { "unlock\tx", PROTO_CMD_UNLOCK, "x", 0, 0, 0, true, 0, 0, NULL },
    { "EXTEND job:42 ttl=5000", PROTO_CMD_EXTEND, "job:42", PROTO_OPT_TTL,
      5000, 0, true, 0, 0, NULL },
    { "extend ttl=1 r", PROTO_CMD_EXTEND, "r", PROTO_OPT_TTL, 1, 0, true, 0,
      0, NULL },
    { "LOCKS", PROTO_CMD_LOCKS, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "locks", PROTO_CMD_LOCKS, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "STATUS job:42", PROTO_CMD_STATUS, "job:42", 0, 0, 0, true, 0, 0, NULL },
    { "SESSIONS", PROTO_CMD_SESSIONS, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "Sessions", PROTO_CMD_SESSIONS, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "STATS", PROTO_CMD_STATS, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "TOP", PROTO_CMD_TOP, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "top limit=5", PROTO_CMD_TOP, NULL, PROTO_OPT_LIMIT, 0, 0, true, 0, 0,
      NULL },
    { "HELP", PROTO_CMD_HELP, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "help\r", PROTO_CMD_HELP, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "HELP lock", PROTO_CMD_HELP, "lock", 0, 0, 0, true, 0, 0, NULL },
    { "QUIT", PROTO_CMD_QUIT, NULL, 0, 0, 0, true, 0, 0, NULL },
    { "quit", PROTO_CMD_QUIT, NULL, 0, 0, 0, true, 0, 0, NULL },
};

START_TEST(test_parse_valid)
{
    const struct t_valid *t = &t_valid_rows[_i];
    struct proto_request req;
    struct proto_error err;
    enum proto_parse_status st = t_parse(t->line, &req, &err);

    ck_assert_msg(st == PROTO_PARSE_OK, "\"%s\": status %d (%s)", t->line,
                  (int)st, err.msg);
    ck_assert_int_eq(req.cmd, t->cmd);
    ck_assert_uint_eq(req.has, t->has);
    if (!t->arg) {
        ck_assert_ptr_null(req.arg);
        ck_assert_uint_eq(req.arg_len, 0);
    } else {
        ck_assert_ptr_nonnull(req.arg);
        ck_assert_uint_eq(req.arg_len, strlen(t->arg));
        ck_assert_str_eq(req.arg, t->arg);
        /* String fields point into the caller's line. */
        ck_assert(req.arg >= t_line && req.arg < t_line + sizeof(t_line));
    }
    ck_assert_uint_eq(req.ttl, t->ttl);
    ck_assert_uint_eq(req.wait, t->wait);
    ck_assert_int_eq(req.renew, t->renew);
    ck_assert_uint_eq(req.proto, t->proto);
    ck_assert_uint_eq(req.keepalive, t->keepalive);
    if (!t->name) {
        ck_assert_ptr_null(req.name);
    } else {
        ck_assert_uint_eq(req.name_len, strlen(t->name));
        ck_assert_str_eq(req.name, t->name);
    }
}
END_TEST

/* mode=, limit= and several resources. */
START_TEST(test_parse_kinds)
{
    struct proto_request req;
    struct proto_error err;

    ck_assert_int_eq(t_parse("LOCK r mode=shared wait=5", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_int_eq(req.mode, PROTO_MODE_SHARED);
    ck_assert_uint_eq(req.has, PROTO_OPT_MODE | PROTO_OPT_WAIT);
    ck_assert_uint_eq(req.nargs, 1);
    ck_assert_int_eq(t_parse("LOCK r mode=exclusive limit=7", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_int_eq(req.mode, PROTO_MODE_EXCLUSIVE);
    ck_assert_uint_eq(req.limit, 7);
    ck_assert_int_eq(t_parse("LOCK r", &req, &err), PROTO_PARSE_OK);
    ck_assert_uint_eq(req.limit, 0);
    ck_assert_int_eq(req.mode, PROTO_MODE_EXCLUSIVE);
    ck_assert_int_eq(t_parse("STATUS r limit=3", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_uint_eq(req.limit, 3);

    /* Several names, options among them; the first is also arg. */
    ck_assert_int_eq(t_parse("LOCK b ttl=9 a c:1 wait=2", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_uint_eq(req.nargs, 3);
    ck_assert_str_eq(req.arg, "b");
    ck_assert_str_eq(req.args[0], "b");
    ck_assert_str_eq(req.args[1], "a");
    ck_assert_str_eq(req.args[2], "c:1");
    ck_assert_uint_eq(req.args_len[2], 3);
    ck_assert_uint_eq(req.ttl, 9);
    ck_assert_int_eq(t_parse("UNLOCK x y", &req, &err), PROTO_PARSE_OK);
    ck_assert_uint_eq(req.nargs, 2);
    /* Names differing in case are different names. */
    ck_assert_int_eq(t_parse("LOCK a A", &req, &err), PROTO_PARSE_OK);

    /* PROTO_MAX_RESOURCES and one more. */
    char line[4 * (PROTO_MAX_RESOURCES + 2) + 16] = "LOCK";
    size_t at = 4;
    for (int i = 0; i < PROTO_MAX_RESOURCES; i++)
        at += (size_t)snprintf(line + at, sizeof(line) - at, " %x", i);
    ck_assert_int_eq(t_parse(line, &req, &err), PROTO_PARSE_OK);
    ck_assert_uint_eq(req.nargs, PROTO_MAX_RESOURCES);
    snprintf(line + at, sizeof(line) - at, " zz");
    ck_assert_int_eq(t_parse(line, &req, &err), PROTO_PARSE_ERROR);
    ck_assert_int_eq(err.code, PROTO_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "at most 256 resources"));
}
END_TEST

/* value=: kept as given, with the lock's other options; EXTEND takes it
 * with or without ttl=, and the limit is the configured one. */
START_TEST(test_parse_value)
{
    static const struct proto_limits small = { 200, 4 };
    struct proto_request req;
    struct proto_error err;
    char line[PROTO_VALUE_LEN_DEFAULT + 32];

    ck_assert_int_eq(t_parse("LOCK leader:a value=http://10.0.0.7:80/x?a=b "
                             "wait=5", &req, &err), PROTO_PARSE_OK);
    ck_assert_uint_eq(req.value_len, strlen("http://10.0.0.7:80/x?a=b"));
    ck_assert(memcmp(req.value, "http://10.0.0.7:80/x?a=b", req.value_len)
              == 0);
    ck_assert(req.has & PROTO_OPT_VALUE);
    ck_assert_uint_eq(req.wait, 5);
    ck_assert_int_eq(t_parse("EXTEND leader:a value=v2", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert(!(req.has & PROTO_OPT_TTL));
    ck_assert_str_eq(req.value, "v2");
    ck_assert_int_eq(t_parse("EXTEND leader:a value=v2 ttl=9", &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_uint_eq(req.ttl, 9);
    ck_assert_int_eq(t_parse("LOCK a b value=x", &req, &err),
                     PROTO_PARSE_OK);

    snprintf(line, sizeof(line), "LOCK r value=%0*d", PROTO_VALUE_LEN_DEFAULT,
             0);
    ck_assert_int_eq(t_parse(line, &req, &err), PROTO_PARSE_OK);
    snprintf(line, sizeof(line), "LOCK r value=%0*d",
             PROTO_VALUE_LEN_DEFAULT + 1, 0);
    ck_assert_int_eq(t_parse(line, &req, &err), PROTO_PARSE_ERROR);
    ck_assert_int_eq(t_parsen("LOCK r value=abcd", 17, &small, &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_int_eq(t_parsen("LOCK r value=abcde", 18, &small, &req, &err),
                     PROTO_PARSE_ERROR);
    ck_assert_ptr_nonnull(strstr(err.msg, "1 to 4 visible"));
}
END_TEST

/* Every command of the table parses from its own wire word. */
START_TEST(test_parse_every_command)
{
    static const char *const args[PROTO_CMD_COUNT] = {
        [PROTO_CMD_AUTH] = " pw",
        [PROTO_CMD_LOCK] = " r",
        [PROTO_CMD_UNLOCK] = " r",
        [PROTO_CMD_ADOPT] = " r token=0123456789abcdef0123456789abcdef",
        [PROTO_CMD_EXTEND] = " r ttl=1",
        [PROTO_CMD_STATUS] = " r",
        [PROTO_CMD_FORCEUNLOCK] = " r",
        [PROTO_CMD_READMIT] = " all",
        [PROTO_CMD_WATCH] = " r s",
        [PROTO_CMD_UNWATCH] = " r",
    };
    struct proto_request req;
    struct proto_error err;
    char buf[64];
    int i;

    for (i = PROTO_CMD_NONE + 1; i < PROTO_CMD_COUNT; i++) {
        snprintf(buf, sizeof(buf), "%s%s", proto_cmd_name(i),
                 args[i] ? args[i] : "");
        ck_assert_msg(t_parse(buf, &req, &err) == PROTO_PARSE_OK, "%s: %s",
                      buf, err.msg);
        ck_assert_int_eq(req.cmd, i);
    }
}
END_TEST

/* ---- empty lines -------------------------------------------------------- */

static const char *const t_empty_rows[] = {
    "", " ", "\t", "   \t \t ", "\r", " \t\r",
};

START_TEST(test_parse_empty)
{
    struct proto_request req;
    struct proto_error err;

    ck_assert_int_eq(t_parse(t_empty_rows[_i], &req, &err),
                     PROTO_PARSE_EMPTY);
}
END_TEST

/* ---- rejected requests -------------------------------------------------- */

#define R200 \
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr" \
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr" \
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr" \
    "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr"
_Static_assert(sizeof(R200) == 201, "R200 must be 200 bytes");

struct t_bad {
    const char *line;
    size_t len;             /* 0: strlen(line) */
    enum proto_err code;
    const char *want;       /* substring of the message */
};

static const struct t_bad t_bad_rows[] = {
    /* unknown commands, quoted back safely */
    { "FOO", 0, PROTO_ERR_UNKNOWN, "unknown command 'FOO'" },
    { "LOCKX r", 0, PROTO_ERR_UNKNOWN, "'LOCKX'" },
    { "ttl=5", 0, PROTO_ERR_UNKNOWN, "'ttl=5'" },
    { "\x80\x81" "bad x", 0, PROTO_ERR_UNKNOWN, "'??bad'" },
    { "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 0,
      PROTO_ERR_UNKNOWN, "'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA...'" },
    /* control bytes; only one trailing CR is dropped */
    { "PI\rNG", 0, PROTO_ERR_ARG, "control character" },
    { "PING\r\r", 0, PROTO_ERR_ARG, "control character" },
    { "\rPING", 0, PROTO_ERR_ARG, "control character" },
    { "PI\0NG", 5, PROTO_ERR_ARG, "control character" },
    { "PING\0", 5, PROTO_ERR_ARG, "control character" },
    { "\0", 1, PROTO_ERR_ARG, "control character" },
    { "LOCK a\x01" "b", 0, PROTO_ERR_ARG, "control character" },
    { "LOCK a\x7f" "b", 0, PROTO_ERR_ARG, "control character" },
    { "LOCK a\x1b[31m", 0, PROTO_ERR_ARG, "control character" },
    { "FOO \n", 0, PROTO_ERR_ARG, "control character" },
    /* missing and extra arguments */
    { "LOCK", 0, PROTO_ERR_ARG, "LOCK needs a resource name" },
    { "LOCK ttl=5", 0, PROTO_ERR_ARG, "LOCK needs a resource name" },
    { "UNLOCK", 0, PROTO_ERR_ARG, "UNLOCK needs a resource name" },
    { "EXTEND", 0, PROTO_ERR_ARG, "EXTEND needs a resource name" },
    { "STATUS", 0, PROTO_ERR_ARG, "STATUS needs a resource name" },
    { "AUTH", 0, PROTO_ERR_ARG, "AUTH needs a password" },
    { "LOCK a b a", 0, PROTO_ERR_ARG, "resource 'a' named twice" },
    { "UNLOCK a b b", 0, PROTO_ERR_ARG, "resource 'b' named twice" },
    { "EXTEND a b ttl=1", 0, PROTO_ERR_ARG, "wrong number of arguments" },
    { "STATUS a b", 0, PROTO_ERR_ARG, "wrong number of arguments" },
    { "PING a b", 0, PROTO_ERR_ARG, "wrong number of arguments for PING" },
    { "AUTH a b c", 0, PROTO_ERR_ARG, "wrong number of arguments for AUTH" },
    { "AUTH a b=1 c=2", 0, PROTO_ERR_ARG,
      "wrong number of arguments for AUTH" },
    { "LOCKS x", 0, PROTO_ERR_ARG, "LOCKS takes no arguments" },
    { "SESSIONS x", 0, PROTO_ERR_ARG, "SESSIONS takes no arguments" },
    { "STATS x", 0, PROTO_ERR_ARG, "STATS takes no arguments" },
    { "TOP job:1", 0, PROTO_ERR_ARG, "TOP takes no arguments" },
    { "TOP limit=0", 0, PROTO_ERR_ARG, "limit must be a whole number" },
    { "TOP wait=5", 0, PROTO_ERR_ARG, "unknown option 'wait' for TOP" },
    { "HELP LOCK x", 0, PROTO_ERR_ARG, "wrong number of arguments for HELP" },
    { "QUIT now", 0, PROTO_ERR_ARG, "QUIT takes no arguments" },
    { "HELLO alice", 0, PROTO_ERR_ARG, "HELLO takes no arguments" },
    /* options */
    { "LOCK r foo=1", 0, PROTO_ERR_ARG, "unknown option 'foo' for LOCK" },
    { "LOCK a=b", 0, PROTO_ERR_ARG, "unknown option 'a'" },
    { "LOCK r keepalive=5", 0, PROTO_ERR_ARG, "unknown option 'keepalive'" },
    { "EXTEND r ttl=5 wait=1", 0, PROTO_ERR_ARG, "unknown option 'wait'" },
    { "HELLO ttl=5", 0, PROTO_ERR_ARG, "unknown option 'ttl' for HELLO" },
    { "LOCK r TTL=5", 0, PROTO_ERR_ARG, "lower-case" },
    { "HELLO Name=x", 0, PROTO_ERR_ARG, "lower-case" },
    { "LOCK r ttl=5 ttl=6", 0, PROTO_ERR_ARG, "option 'ttl' given twice" },
    { "LOCK r renew=0 renew=0", 0, PROTO_ERR_ARG, "'renew' given twice" },
    { "HELLO name=a name=b", 0, PROTO_ERR_ARG, "'name' given twice" },
    { "LOCK r =5", 0, PROTO_ERR_ARG, "option without a name" },
    { "UNLOCK r ttl=5", 0, PROTO_ERR_ARG, "UNLOCK takes no options" },
    { "UNLOCK a=b", 0, PROTO_ERR_ARG, "UNLOCK takes no options (got 'a')" },
    { "STATUS r x=1", 0, PROTO_ERR_ARG, "unknown option 'x' for STATUS" },
    { "STATUS r mode=shared", 0, PROTO_ERR_ARG, "unknown option 'mode'" },
    { "EXTEND r ttl=1 limit=2", 0, PROTO_ERR_ARG, "unknown option 'limit'" },
    { "LOCK r mode=shared mode=shared", 0, PROTO_ERR_ARG, "given twice" },
    { "PING a b=c", 0, PROTO_ERR_ARG, "PING takes no options (got 'b')" },
    { "LOCKS x=1", 0, PROTO_ERR_ARG, "LOCKS takes no options" },
    { "QUIT x=1", 0, PROTO_ERR_ARG, "QUIT takes no options" },
    { "EXTEND r", 0, PROTO_ERR_ARG, "EXTEND needs ttl=<ms> or value=<text>" },
    /* value=: 1..max_value_len visible ASCII, exclusive locks only */
    { "LOCK r value=", 0, PROTO_ERR_ARG, "value must be 1 to 256 visible" },
    { "LOCK r value=a\x80", 0, PROTO_ERR_ARG, "value must be" },
    { "LOCK r mode=shared value=x", 0, PROTO_ERR_ARG,
      "value= is for exclusive locks" },
    { "LOCK r limit=3 value=x", 0, PROTO_ERR_ARG,
      "value= is for exclusive locks" },
    { "LOCK r value=a value=b", 0, PROTO_ERR_ARG, "option 'value' given twice" },
    { "UNLOCK r value=x", 0, PROTO_ERR_ARG, "UNLOCK takes no options" },
    { "WATCH", 0, PROTO_ERR_ARG, "WATCH needs a resource name" },
    { "WATCH r r", 0, PROTO_ERR_ARG, "resource 'r' named twice" },
    { "UNWATCH", 0, PROTO_ERR_ARG, "UNWATCH needs a resource name" },
    { "WATCH r ttl=1", 0, PROTO_ERR_ARG, "WATCH takes no options" },
    /* option values */
    { "LOCK r ttl=0", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=4294967296", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=99999999999", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=00000000001", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=-1", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=+1", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=1a", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=0x10", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=1.5", 0, PROTO_ERR_ARG, "ttl must be" },
    { "EXTEND r ttl=0", 0, PROTO_ERR_ARG, "ttl must be" },
    { "LOCK r ttl=0s", 0, PROTO_ERR_ARG, "ttl must be at least 1 ms (got '0s')" },
    { "LOCK r ttl=-5s", 0, PROTO_ERR_ARG, "'-5s' has a sign (durations are "
      "never negative)" },
    { "LOCK r ttl=5d", 0, PROTO_ERR_ARG, "'5d' has an unknown unit (use ms, s, "
      "m or h)" },
    { "LOCK r ttl=5S", 0, PROTO_ERR_ARG, "unknown unit" },
    { "LOCK r ttl=5sec", 0, PROTO_ERR_ARG, "unknown unit" },
    { "LOCK r ttl=s", 0, PROTO_ERR_ARG, "'s' has no number" },
    { "LOCK r ttl=.5s", 0, PROTO_ERR_ARG, "has no number" },
    { "LOCK r ttl=1.5ms", 0, PROTO_ERR_ARG, "is not a whole number of "
      "milliseconds" },
    { "LOCK r ttl=1.5", 0, PROTO_ERR_ARG, "a fraction needs a unit" },
    { "LOCK r ttl=4294968s", 0, PROTO_ERR_ARG, "'4294968s' is more than "
      "4294967295 ms" },
    { "LOCK r wait=1194h", 0, PROTO_ERR_ARG, "wait must be 0 to 4294967295 "
      "ms, or a number with ms, s, m or h: '1194h' is more than" },
    { "HELLO keepalive=-1s", 0, PROTO_ERR_ARG, "keepalive must be 0 to "
      "4294967295 ms, or a number with ms, s, m or h: '-1s' has a sign" },
    { "HELLO detach=1m30s", 0, PROTO_ERR_ARG, "'1m30s' has an unknown unit" },
    { "LOCK r wait=-1", 0, PROTO_ERR_ARG, "wait must be" },
    { "LOCK r wait=4294967296", 0, PROTO_ERR_ARG, "wait must be" },
    { "LOCK r renew=2", 0, PROTO_ERR_ARG, "renew must be 0 or 1" },
    { "LOCK r renew=01", 0, PROTO_ERR_ARG, "renew must be 0 or 1" },
    { "LOCK r renew=", 0, PROTO_ERR_ARG, "renew must be 0 or 1" },
    { "LOCK r renew=true", 0, PROTO_ERR_ARG, "renew must be 0 or 1" },
    { "LOCK r mode=read", 0, PROTO_ERR_ARG, "mode must be shared or exclusive" },
    { "LOCK r mode=", 0, PROTO_ERR_ARG, "mode must be shared or exclusive" },
    { "LOCK r mode=SHARED", 0, PROTO_ERR_ARG, "mode must be shared or exclusive" },
    { "LOCK r limit=0", 0, PROTO_ERR_ARG, "limit must be" },
    { "LOCK r limit=-1", 0, PROTO_ERR_ARG, "limit must be" },
    { "LOCK r limit=4294967296", 0, PROTO_ERR_ARG, "limit must be" },
    { "LOCK r limit=2x", 0, PROTO_ERR_ARG, "limit must be" },
    { "STATUS r limit=0", 0, PROTO_ERR_ARG, "limit must be" },
    { "HELLO proto=2", 0, PROTO_ERR_ARG, "unsupported protocol version '2'" },
    { "HELLO proto=0", 0, PROTO_ERR_ARG, "unsupported protocol version" },
    { "HELLO proto=v1", 0, PROTO_ERR_ARG, "unsupported protocol version" },
    { "HELLO proto=\xff", 0, PROTO_ERR_ARG, "version '?'" },
    { "HELLO keepalive=x", 0, PROTO_ERR_ARG, "keepalive must be" },
    { "HELLO detach=-1", 0, PROTO_ERR_ARG, "detach must be" },
    { "ADOPT r", 0, PROTO_ERR_ARG, "ADOPT needs token=<hex>" },
    { "ADOPT token=0123456789abcdef0123456789abcdef", 0, PROTO_ERR_ARG,
      "ADOPT needs a resource name" },
    { "ADOPT r token=0123", 0, PROTO_ERR_ARG, "token must be 32" },
    { "ADOPT r token=0123456789abcdef0123456789abcdef wait=1", 0,
      PROTO_ERR_ARG, "unknown option 'wait' for ADOPT" },
    { "LOCK r token=0123456789abcdef0123456789abcdef", 0, PROTO_ERR_ARG,
      "unknown option 'token' for LOCK" },
    { "HELLO resume=s1", 0, PROTO_ERR_ARG, "resume= and secret= go together" },
    { "HELLO secret=0123456789abcdef0123456789abcdef", 0, PROTO_ERR_ARG,
      "resume= and secret= go together" },
    { "HELLO resume=s1 secret=0123456789ABCDEF0123456789abcdef", 0,
      PROTO_ERR_ARG, "secret must be 32 lower-case hex digits" },
    { "HELLO resume=s1 secret=0123", 0, PROTO_ERR_ARG, "secret must be" },
    { "HELLO resume= secret=0123456789abcdef0123456789abcdef", 0,
      PROTO_ERR_ARG, "resume must be a session id" },
    { "HELLO detach=5 resume=s1 secret=0123456789abcdef0123456789abcdef", 0,
      PROTO_ERR_ARG, "a resumed session keeps its detach=" },
    { "HELLO name=" NAME64 "n", 0, PROTO_ERR_ARG, "name must be 1 to 64" },
    { "HELLO name=", 0, PROTO_ERR_ARG, "name must be" },
    { "HELLO name=caf\xc3\xa9", 0, PROTO_ERR_ARG, "name must be" },
    /* resource names */
    { "LOCK caf\xc3\xa9", 0, PROTO_ERR_ARG, "resource name must be visible" },
    { "LOCK \x80", 0, PROTO_ERR_ARG, "resource name must be visible" },
    { "STATUS \xff", 0, PROTO_ERR_ARG, "resource name must be visible" },
    { "LOCK " R200 "r", 0, PROTO_ERR_ARG, "longer than 200 bytes" },
    { "UNLOCK " R200 "r", 0, PROTO_ERR_ARG, "longer than 200 bytes" },
};

/* AUTH <user> <password>: both words positional, '=' and a name equal to
 * the password included. */
START_TEST(test_parse_auth_user)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    static const char *const lines[] = {
        "AUTH alice s3cret", "auth  alice\ts3cret\r", "AUTH a=b c=d",
        "AUTH same same",
    };
    static const char *const want[][2] = {
        { "alice", "s3cret" }, { "alice", "s3cret" }, { "a=b", "c=d" },
        { "same", "same" },
    };
    struct proto_request req;
    struct proto_error err;

    for (size_t i = 0; i < ARRAY_LEN(lines); i++) {
        ck_assert_int_eq(t_parsen(lines[i], strlen(lines[i]), &lim, &req,
                                  &err), PROTO_PARSE_OK);
        ck_assert_int_eq(req.cmd, PROTO_CMD_AUTH);
        ck_assert_uint_eq(req.nargs, 2);
        ck_assert_str_eq(req.arg, want[i][0]);
        ck_assert_str_eq(req.args[0], want[i][0]);
        ck_assert_str_eq(req.args[1], want[i][1]);
        ck_assert_uint_eq(req.args_len[1], strlen(want[i][1]));
    }
    /* One word is the password, as before users. */
    ck_assert_int_eq(t_parsen("AUTH pw", 7, &lim, &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_uint_eq(req.nargs, 1);
    ck_assert_str_eq(req.arg, "pw");
}
END_TEST

START_TEST(test_parse_errors)
{
    const struct t_bad *t = &t_bad_rows[_i];
    size_t len = t->len ? t->len : strlen(t->line);
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    struct proto_request req;
    struct proto_error err;
    enum proto_parse_status st = t_parsen(t->line, len, &lim, &req, &err);

    ck_assert_msg(st == PROTO_PARSE_ERROR, "row %d: status %d", _i, (int)st);
    ck_assert_msg(err.code == t->code, "row %d: code %s, msg \"%s\"", _i,
                  proto_err_word(err.code), err.msg);
    ck_assert_msg(strstr(err.msg, t->want),
                  "row %d: \"%s\" lacks \"%s\"", _i, err.msg, t->want);
    t_assert_safe_msg(err.msg);
}
END_TEST

/* An error must not leave a half-filled request that looks valid. */
START_TEST(test_parse_error_struct)
{
    struct proto_request req;
    struct proto_error err;

    ck_assert_int_eq(t_parse("LOCK", &req, &err), PROTO_PARSE_ERROR);
    ck_assert_int_eq(err.code, PROTO_ERR_ARG);
    ck_assert_int_eq(t_parse("PING", &req, &err), PROTO_PARSE_OK);
    ck_assert_int_eq(err.code, PROTO_ERR_NONE);
    ck_assert_str_eq(err.msg, "");
    ck_assert_int_eq(t_parse("", &req, &err), PROTO_PARSE_EMPTY);
    ck_assert_int_eq(err.code, PROTO_ERR_NONE);
}
END_TEST

/* Long hostile input still yields a short, printable message. */
START_TEST(test_parse_error_truncation)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    struct proto_request req;
    struct proto_error err;
    char line[600];
    size_t i;

    for (i = 0; i < sizeof(line); i++)
        line[i] = (char)(0x80 + i % 0x80);
    ck_assert_int_eq(t_parsen(line, sizeof(line), &lim, &req, &err),
                     PROTO_PARSE_ERROR);
    ck_assert_int_eq(err.code, PROTO_ERR_UNKNOWN);
    t_assert_safe_msg(err.msg);

    memcpy(line, "HELLO proto=", 12);
    memset(line + 12, '9', sizeof(line) - 12);
    ck_assert_int_eq(t_parsen(line, sizeof(line), &lim, &req, &err),
                     PROTO_PARSE_ERROR);
    t_assert_safe_msg(err.msg);
    ck_assert_ptr_nonnull(strstr(err.msg, "..."));
}
END_TEST

/* ---- resource names ---------------------------------------------------- */

START_TEST(test_resource_length)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    static const struct proto_limits small = { 4, 0 };
    struct proto_request req;
    struct proto_error err;

    ck_assert_int_eq(t_parse("LOCK " R200, &req, &err), PROTO_PARSE_OK);
    ck_assert_uint_eq(req.arg_len, 200);
    ck_assert_int_eq(t_parse("LOCK " R200 "r", &req, &err), PROTO_PARSE_ERROR);
    ck_assert_int_eq(err.code, PROTO_ERR_ARG);

    ck_assert_int_eq(t_parsen("LOCK abcd", 9, &small, &req, &err),
                     PROTO_PARSE_OK);
    ck_assert_int_eq(t_parsen("LOCK abcde", 10, &small, &req, &err),
                     PROTO_PARSE_ERROR);
    ck_assert_ptr_nonnull(strstr(err.msg, "longer than 4 bytes"));
    /* NULL limits mean the defaults. */
    ck_assert_int_eq(t_parsen("LOCK " R200, 205, NULL, &req, &err),
                     PROTO_PARSE_OK);

    ck_assert_int_eq(proto_valid_resource(R200, 200, &lim), 1);
    ck_assert_int_eq(proto_valid_resource(R200 "r", 201, &lim), 0);
    ck_assert_int_eq(proto_valid_resource("", 0, &lim), 0);
    ck_assert_int_eq(proto_valid_resource("abcde", 5, &small), 0);
}
END_TEST

struct t_byte {
    unsigned char c;
    int valid;
};

static const struct t_byte t_byte_rows[] = {
    { 0x00, 0 }, { 0x09, 0 }, { 0x1f, 0 }, { 0x20, 0 }, { 0x21, 1 },
    { '=', 1 }, { 'a', 1 }, { 0x7e, 1 }, { 0x7f, 0 }, { 0x80, 0 },
    { 0xff, 0 },
};

START_TEST(test_resource_bytes)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    const struct t_byte *t = &t_byte_rows[_i];
    char name[3] = { 'a', (char)t->c, 'b' };
    struct proto_request req;
    struct proto_error err;
    char line[16];

    ck_assert_int_eq(proto_valid_resource(name, 3, &lim), t->valid);
    /* In a request line the same byte is rejected one way or another (a
     * space splits the word, giving an extra argument), except that '=' is
     * read as an option. */
    memcpy(line, "STATUS ", 7);
    memcpy(line + 7, name, 3);
    if (t->c != '=')
        ck_assert_int_eq(t_parsen(line, 10, &lim, &req, &err),
                         t->valid ? PROTO_PARSE_OK : PROTO_PARSE_ERROR);
    if (!t->valid)
        ck_assert_int_eq(err.code, PROTO_ERR_ARG);
}
END_TEST

/* ---- numbers ----------------------------------------------------------- */

struct t_u32 {
    const char *s;
    int rc;
    uint32_t v;
};

static const struct t_u32 t_u32_rows[] = {
    { "0", 0, 0 },
    { "1", 0, 1 },
    { "007", 0, 7 },
    { "30000", 0, 30000 },
    { "4294967295", 0, 4294967295u },
    { "0000000001", 0, 1 },
    { "4294967296", -1, 0 },
    { "9999999999", -1, 0 },
    { "00000000001", -1, 0 },
    { "18446744073709551617", -1, 0 },
    { "", -1, 0 },
    { "-1", -1, 0 },
    { "+1", -1, 0 },
    { "1a", -1, 0 },
    { "a1", -1, 0 },
    { " 1", -1, 0 },
    { "1 ", -1, 0 },
    { "1.0", -1, 0 },
    { "0x1", -1, 0 },
};

START_TEST(test_parse_u32)
{
    const struct t_u32 *t = &t_u32_rows[_i];
    uint32_t v = 12345;
    int rc = proto_parse_u32(t->s, strlen(t->s), &v);

    ck_assert_msg(rc == t->rc, "\"%s\": rc %d", t->s, rc);
    if (rc == 0)
        ck_assert_uint_eq(v, t->v);
    else
        ck_assert_uint_eq(v, 12345);   /* untouched on failure */
}
END_TEST

/* Durations (num.h): a table of what is taken and why the rest is not. */
struct t_dur {
    const char *s;
    enum proto_dur want;
    uint32_t ms;
};

static const struct t_dur t_dur_rows[] = {
    /* bare numbers stay milliseconds, as the u32 reader reads them */
    { "0", PROTO_DUR_OK, 0 },
    { "30000", PROTO_DUR_OK, 30000 },
    { "007", PROTO_DUR_OK, 7 },
    { "4294967295", PROTO_DUR_OK, 4294967295u },
    { "0000000001", PROTO_DUR_OK, 1 },
    /* units */
    { "500ms", PROTO_DUR_OK, 500 },
    { "30s", PROTO_DUR_OK, 30000 },
    { "2m", PROTO_DUR_OK, 120000 },
    { "1h", PROTO_DUR_OK, 3600000 },
    { "0s", PROTO_DUR_OK, 0 },
    { "0ms", PROTO_DUR_OK, 0 },
    { "1.5s", PROTO_DUR_OK, 1500 },
    { "0.001s", PROTO_DUR_OK, 1 },
    { "1.25m", PROTO_DUR_OK, 75000 },
    { "0.5h", PROTO_DUR_OK, 1800000 },
    { "2.0ms", PROTO_DUR_OK, 2 },
    { "1.500000000s", PROTO_DUR_OK, 1500 },
    { "0.000001h", PROTO_DUR_PARTIAL, 0 },       /* 3.6 ms */
    { "4294967295ms", PROTO_DUR_OK, 4294967295u },
    { "4294967.295s", PROTO_DUR_OK, 4294967295u },
    { "1193h", PROTO_DUR_OK, 4294800000u },
    /* too large */
    { "4294967296", PROTO_DUR_RANGE, 0 },
    { "4294967296ms", PROTO_DUR_RANGE, 0 },
    { "4294968s", PROTO_DUR_RANGE, 0 },
    { "71583m", PROTO_DUR_RANGE, 0 },
    { "1194h", PROTO_DUR_RANGE, 0 },
    { "9999999999h", PROTO_DUR_RANGE, 0 },
    { "00000000001", PROTO_DUR_RANGE, 0 },
    { "99999999999999999999999s", PROTO_DUR_RANGE, 0 },
    /* signs */
    { "-1", PROTO_DUR_SIGN, 0 },
    { "-5s", PROTO_DUR_SIGN, 0 },
    { "+1", PROTO_DUR_SIGN, 0 },
    { "+1s", PROTO_DUR_SIGN, 0 },
    /* no number */
    { "", PROTO_DUR_EMPTY, 0 },
    { "s", PROTO_DUR_EMPTY, 0 },
    { "ms", PROTO_DUR_EMPTY, 0 },
    { ".5s", PROTO_DUR_EMPTY, 0 },
    { ".s", PROTO_DUR_EMPTY, 0 },
    { "h1", PROTO_DUR_EMPTY, 0 },
    /* units that are not */
    { "5d", PROTO_DUR_UNIT, 0 },
    { "5S", PROTO_DUR_UNIT, 0 },
    { "5MS", PROTO_DUR_UNIT, 0 },
    { "5sec", PROTO_DUR_UNIT, 0 },
    { "5us", PROTO_DUR_UNIT, 0 },
    { "5 s", PROTO_DUR_UNIT, 0 },
    { "1m30s", PROTO_DUR_UNIT, 0 },
    { "1e3", PROTO_DUR_UNIT, 0 },
    { "0x10", PROTO_DUR_UNIT, 0 },
    { "5s ", PROTO_DUR_UNIT, 0 },
    /* not whole milliseconds */
    { "1.5ms", PROTO_DUR_PARTIAL, 0 },
    { "0.0005s", PROTO_DUR_PARTIAL, 0 },
    { "0.1ms", PROTO_DUR_PARTIAL, 0 },
    /* malformed numbers */
    { "1.5", PROTO_DUR_SYNTAX, 0 },
    { "1.", PROTO_DUR_SYNTAX, 0 },
    { "1.s", PROTO_DUR_SYNTAX, 0 },
    { "1..5s", PROTO_DUR_SYNTAX, 0 },
    { "1.5.5s", PROTO_DUR_SYNTAX, 0 },
    { "1.0000000000s", PROTO_DUR_SYNTAX, 0 },   /* 10 digits after the point */
};

START_TEST(test_parse_duration)
{
    const struct t_dur *t = &t_dur_rows[_i];
    uint32_t v = 12345;
    enum proto_dur e = proto_parse_duration(t->s, strlen(t->s), &v);

    ck_assert_msg(e == t->want, "\"%s\": %d (%s), want %d (%s)", t->s, (int)e,
                  proto_dur_why(e), (int)t->want, proto_dur_why(t->want));
    if (e == PROTO_DUR_OK)
        ck_assert_msg(v == t->ms, "\"%s\": %u ms, want %u", t->s, v, t->ms);
    else
        ck_assert_uint_eq(v, 12345);   /* untouched on failure */
    ck_assert_ptr_nonnull(proto_dur_why(e));
}
END_TEST

START_TEST(test_parse_duration_len)
{
    uint32_t v = 0;

    /* Only len bytes are read. */
    ck_assert_int_eq(proto_parse_duration("1500ms", 2, &v), PROTO_DUR_OK);
    ck_assert_uint_eq(v, 15);
    ck_assert_int_eq(proto_parse_duration("2s\0", 3, &v), PROTO_DUR_UNIT);
    ck_assert_int_eq(proto_parse_duration("2\0s", 3, &v), PROTO_DUR_UNIT);
    ck_assert_int_eq(proto_parse_duration(NULL, 0, &v), PROTO_DUR_EMPTY);
    /* Every number the u32 reader takes is the same duration. */
    for (uint64_t n = 1; n <= UINT32_MAX; n = n * 7 + 3) {
        char buf[24];
        uint32_t a = 0, b = 1;
        int len = snprintf(buf, sizeof(buf), "%llu", (unsigned long long)n);

        ck_assert_int_eq(proto_parse_u32(buf, (size_t)len, &a), 0);
        ck_assert_int_eq(proto_parse_duration(buf, (size_t)len, &b),
                         PROTO_DUR_OK);
        ck_assert_uint_eq(a, b);
    }
}
END_TEST

START_TEST(test_parse_u32_len)
{
    uint32_t v = 0;

    /* Only len bytes are read: the digits after it do not count. */
    ck_assert_int_eq(proto_parse_u32("123456", 3, &v), 0);
    ck_assert_uint_eq(v, 123);
    ck_assert_int_eq(proto_parse_u32("12\0" "3", 4, &v), -1);
    ck_assert_int_eq(proto_parse_u32(NULL, 0, &v), -1);
}
END_TEST

/*
 * The unsigned readers of num.h, one table: rc -1 means refused, and then
 * the output must be left as it was.
 */
enum t_reader { T_U64, T_PORT, T_OCTAL };

struct t_num {
    enum t_reader reader;
    const char *s;
    int rc;
    uint64_t v;
};

static const struct t_num t_num_rows[] = {
    { T_U64, "0", 0, 0 },
    { T_U64, "18446744073709551615", 0, UINT64_MAX },
    { T_U64, "00000000000000000001", 0, 1 },
    { T_U64, "18446744073709551616", -1, 0 },
    { T_U64, "99999999999999999999", -1, 0 },
    { T_U64, "000000000000000000001", -1, 0 },
    { T_U64, "", -1, 0 },
    { T_U64, "-1", -1, 0 },
    { T_U64, "+1", -1, 0 },
    { T_U64, "1 ", -1, 0 },
    { T_U64, "1e3", -1, 0 },
    { T_PORT, "1", 0, 1 },
    { T_PORT, "7390", 0, 7390 },
    { T_PORT, "65535", 0, 65535 },
    { T_PORT, "07390", 0, 7390 },
    { T_PORT, "0", -1, 0 },
    { T_PORT, "00000", -1, 0 },
    { T_PORT, "65536", -1, 0 },
    { T_PORT, "99999", -1, 0 },
    { T_PORT, "007390", -1, 0 },
    { T_PORT, "4294967297", -1, 0 },
    { T_PORT, "", -1, 0 },
    { T_PORT, "-1", -1, 0 },
    { T_PORT, "+80", -1, 0 },
    { T_PORT, "80x", -1, 0 },
    { T_PORT, " 80", -1, 0 },
    { T_OCTAL, "0", 0, 0 },
    { T_OCTAL, "0660", 0, 0660 },
    { T_OCTAL, "660", 0, 0660 },
    { T_OCTAL, "0777", 0, 0777 },
    { T_OCTAL, "1777", 0, 01777 },
    { T_OCTAL, "37777777777", 0, 037777777777 },
    { T_OCTAL, "40000000000", -1, 0 },
    { T_OCTAL, "000000000001", -1, 0 },
    { T_OCTAL, "0680", -1, 0 },
    { T_OCTAL, "0x1a", -1, 0 },
    { T_OCTAL, "-660", -1, 0 },
    { T_OCTAL, " 660", -1, 0 },
    { T_OCTAL, "", -1, 0 },
};

/* Runs one row's reader, widening its result. */
static int t_read(const struct t_num *t, uint64_t *v)
{
    size_t len = strlen(t->s);
    uint16_t p = (uint16_t)*v;
    uint32_t o = (uint32_t)*v;
    int rc;

    switch (t->reader) {
    case T_U64:
        return proto_parse_u64(t->s, len, v);
    case T_PORT:
        rc = proto_parse_port(t->s, len, &p);
        *v = p;
        return rc;
    case T_OCTAL:
        rc = proto_parse_octal(t->s, len, &o);
        *v = o;
        return rc;
    }
    return -2;
}

START_TEST(test_parse_num)
{
    const struct t_num *t = &t_num_rows[_i];
    uint64_t v = 12345;
    int rc = t_read(t, &v);

    ck_assert_msg(rc == t->rc, "reader %d \"%s\": rc %d", t->reader, t->s, rc);
    ck_assert_uint_eq(v, rc == 0 ? t->v : 12345);
}
END_TEST

struct t_i64 {
    const char *s;
    int rc;
    int64_t v;
};

static const struct t_i64 t_i64_rows[] = {
    { "0", 0, 0 },
    { "-0", 0, 0 },
    { "24100", 0, 24100 },
    { "-5", 0, -5 },
    { "9223372036854775807", 0, INT64_MAX },
    { "-9223372036854775808", 0, INT64_MIN },
    { "9223372036854775808", -1, 0 },
    { "-9223372036854775809", -1, 0 },
    { "-", -1, 0 },
    { "--1", -1, 0 },
    { "+1", -1, 0 },
    { "- 1", -1, 0 },
    { "1-", -1, 0 },
    { "", -1, 0 },
};

START_TEST(test_parse_i64)
{
    const struct t_i64 *t = &t_i64_rows[_i];
    int64_t v = 12345;
    int rc = proto_parse_i64(t->s, strlen(t->s), &v);

    ck_assert_msg(rc == t->rc, "\"%s\": rc %d", t->s, rc);
    ck_assert_int_eq(v, rc == 0 ? t->v : 12345);
}
END_TEST

START_TEST(test_parse_range)
{
    uint64_t v = 7;

    ck_assert_int_eq(proto_parse_range("10", 2, 10, 20, &v), 0);
    ck_assert_uint_eq(v, 10);
    ck_assert_int_eq(proto_parse_range("20", 2, 10, 20, &v), 0);
    ck_assert_uint_eq(v, 20);
    ck_assert_int_eq(proto_parse_range("9", 1, 10, 20, &v), -1);
    ck_assert_int_eq(proto_parse_range("21", 2, 10, 20, &v), -1);
    ck_assert_int_eq(proto_parse_range("123", 2, 10, 20, &v), 0);
    ck_assert_uint_eq(v, 12);
    ck_assert_int_eq(proto_parse_range("18446744073709551615", 20, 0,
                                       UINT64_MAX, &v), 0);
    ck_assert_uint_eq(v, UINT64_MAX);
    v = 7;
    ck_assert_int_eq(proto_parse_range("5", 1, 6, 5, &v), -1);
    ck_assert_int_eq(proto_parse_range("1x", 2, 0, 100, &v), -1);
    ck_assert_uint_eq(v, 7);
}
END_TEST

/* Every reader reads only len bytes, and refuses NULL. */
START_TEST(test_parse_num_len)
{
    uint64_t u = 0;
    int64_t i = 0;
    uint16_t p = 0;
    uint32_t o = 0;

    ck_assert_int_eq(proto_parse_u64("123456", 3, &u), 0);
    ck_assert_uint_eq(u, 123);
    ck_assert_int_eq(proto_parse_i64("-123456", 3, &i), 0);
    ck_assert_int_eq(i, -12);
    ck_assert_int_eq(proto_parse_port("80801", 4, &p), 0);
    ck_assert_uint_eq(p, 8080);
    ck_assert_int_eq(proto_parse_octal("06601", 4, &o), 0);
    ck_assert_uint_eq(o, 0660);
    ck_assert_int_eq(proto_parse_port("8\0" "0", 3, &p), -1);
    ck_assert_int_eq(proto_parse_u64(NULL, 0, &u), -1);
    ck_assert_int_eq(proto_parse_i64(NULL, 0, &i), -1);
    ck_assert_int_eq(proto_parse_port(NULL, 0, &p), -1);
    ck_assert_int_eq(proto_parse_octal(NULL, 0, &o), -1);
    ck_assert_int_eq(proto_parse_range(NULL, 0, 0, 1, &u), -1);
}
END_TEST

/* ---- tables ------------------------------------------------------------ */

/* The contract's words, written out independently of proto.h. */
static const char *const t_err_words[PROTO_ERR_COUNT] = {
    [PROTO_ERR_ARG] = "ARG", [PROTO_ERR_UNKNOWN] = "UNKNOWN",
    [PROTO_ERR_TOOLONG] = "TOOLONG", [PROTO_ERR_NOAUTH] = "NOAUTH",
    [PROTO_ERR_AUTH] = "AUTH", [PROTO_ERR_BUSY] = "BUSY",
    [PROTO_ERR_TIMEOUT] = "TIMEOUT", [PROTO_ERR_HELD] = "HELD",
    [PROTO_ERR_NOTHELD] = "NOTHELD", [PROTO_ERR_LOST] = "LOST",
    [PROTO_ERR_UNAVAILABLE] = "UNAVAILABLE", [PROTO_ERR_LIMIT] = "LIMIT",
    [PROTO_ERR_SHUTDOWN] = "SHUTDOWN",
    [PROTO_ERR_NOSESSION] = "NOSESSION", [PROTO_ERR_DENIED] = "DENIED",
};

START_TEST(test_tables)
{
    int i;

    ck_assert_ptr_null(proto_cmd_name(PROTO_CMD_NONE));
    ck_assert_ptr_null(proto_cmd_name(PROTO_CMD_COUNT));
    ck_assert_str_eq(proto_cmd_name(PROTO_CMD_LOCK), "LOCK");
    ck_assert_str_eq(proto_cmd_name(PROTO_CMD_QUIT), "QUIT");
    ck_assert_ptr_null(proto_err_word(PROTO_ERR_NONE));
    ck_assert_ptr_null(proto_err_word(PROTO_ERR_COUNT));
    ck_assert_ptr_null(proto_err_default_msg(PROTO_ERR_NONE));
    for (i = PROTO_ERR_NONE + 1; i < PROTO_ERR_COUNT; i++) {
        const char *w = proto_err_word(i);
        ck_assert_str_eq(w, t_err_words[i]);
        ck_assert_int_eq(proto_err_from_word(w, strlen(w)), i);
        ck_assert_ptr_nonnull(proto_err_default_msg(i));
        t_assert_safe_msg(proto_err_default_msg(i));
    }
    ck_assert_int_eq(proto_err_from_word("busy", 4), PROTO_ERR_NONE);
    ck_assert_int_eq(proto_err_from_word("BUS", 3), PROTO_ERR_NONE);
    ck_assert_int_eq(proto_err_from_word("BUSYX", 5), PROTO_ERR_NONE);
    ck_assert_int_eq(proto_err_from_word("BUSYX", 4), PROTO_ERR_BUSY);
    ck_assert_int_eq(proto_err_from_word("", 0), PROTO_ERR_NONE);
}
END_TEST

/* ---- formatters -------------------------------------------------------- */

START_TEST(test_format_kv)
{
    struct sbuf b = SBUF_INIT;

    proto_format_ok_begin(&b);
    proto_format_kv_str(&b, "resource", "job:42");
    proto_format_kv_u64(&b, "fence", 17);
    proto_format_end(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "OK resource=job:42 fence=17\n");

    sbuf_reset(&b);
    proto_format_ok_begin(&b);
    proto_format_kv_strn(&b, "token", "abcdef", 3);
    proto_format_kv_u64(&b, "max", UINT64_MAX);
    proto_format_kv_i64(&b, "neg", -5);
    proto_format_kv_i64(&b, "min", INT64_MIN);
    proto_format_kv_str(&b, "empty", "");
    proto_format_kv_u64(&b, "zero", 0);
    proto_format_kv_i64(&b, "izero", 0);
    proto_format_kv_i64(&b, "imax", INT64_MAX);
    proto_format_word(&b, "bye");
    proto_format_end(&b);
    ck_assert_str_eq(sbuf_cstr(&b),
                     "OK token=abc max=18446744073709551615 neg=-5 "
                     "min=-9223372036854775808 empty= zero=0 izero=0 "
                     "imax=9223372036854775807 bye\n");
    sbuf_deinit(&b);
}
END_TEST

/* A value can never split or forge a reply line. */
START_TEST(test_format_kv_sanitize)
{
    struct sbuf b = SBUF_INIT;

    proto_format_ok_begin(&b);
    proto_format_kv_str(&b, "name", "a b\tc\nd\re\x7f" "f");
    proto_format_kv_strn(&b, "nul", "x\0y", 3);
    proto_format_kv_str(&b, "utf8", "caf\xc3\xa9");
    proto_format_word(&b, "by e\n");
    proto_format_end(&b);
    ck_assert_str_eq(sbuf_cstr(&b),
                     "OK name=a_b_c_d_e_f nul=x_y utf8=caf\xc3\xa9 by_e_\n");
    sbuf_deinit(&b);
}
END_TEST

START_TEST(test_format_simple)
{
    struct sbuf b = SBUF_INIT;

    proto_format_ok(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "OK\n");

    sbuf_reset(&b);
    proto_format_ok_json(&b, "{\"session\":\"s7\",\"locks\":[]}");
    ck_assert_str_eq(sbuf_cstr(&b), "OK {\"session\":\"s7\",\"locks\":[]}\n");

    sbuf_reset(&b);
    proto_format_ok_json(&b, "{\n\t\"a\": 1\r\n}");
    ck_assert_str_eq(sbuf_cstr(&b), "OK {  \"a\": 1  }\n");

    sbuf_reset(&b);
    proto_format_pong(&b, NULL, 0);
    ck_assert_str_eq(sbuf_cstr(&b), "PONG\n");

    sbuf_reset(&b);
    proto_format_pong(&b, "hello", 5);
    ck_assert_str_eq(sbuf_cstr(&b), "PONG hello\n");

    sbuf_reset(&b);
    proto_format_pong(&b, "hello", 0);
    ck_assert_str_eq(sbuf_cstr(&b), "PONG\n");

    sbuf_reset(&b);
    proto_format_pong(&b, "a b\n", 4);
    ck_assert_str_eq(sbuf_cstr(&b), "PONG a_b_\n");

    sbuf_reset(&b);
    proto_format_event_lost(&b, "job:42", 17, "expired");
    ck_assert_str_eq(sbuf_cstr(&b),
                     "EVENT LOST resource=job:42 fence=17 reason=expired\n");

    sbuf_reset(&b);
    proto_format_event_shutdown(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "EVENT SHUTDOWN\n");

    sbuf_reset(&b);
    proto_format_help(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "OK PING HELLO AUTH LOCK UNLOCK ADOPT EXTEND "
                     "LOCKS STATUS SESSIONS STATS TOP FORCEUNLOCK READMIT "
                     "WATCH UNWATCH HELP QUIT\n");
    sbuf_deinit(&b);
}
END_TEST

START_TEST(test_format_err)
{
    struct sbuf b = SBUF_INIT;

    proto_format_err(&b, PROTO_ERR_BUSY, NULL);
    ck_assert_str_eq(sbuf_cstr(&b),
                     "ERR BUSY resource is held by someone else\n");

    sbuf_reset(&b);
    proto_format_err(&b, PROTO_ERR_HELD, "");
    ck_assert_str_eq(sbuf_cstr(&b),
                     "ERR HELD this session already holds the resource\n");

    sbuf_reset(&b);
    proto_format_err(&b, PROTO_ERR_ARG, "bad\nline\rhere\x01\x7f\xc3\xa9.");
    ck_assert_str_eq(sbuf_cstr(&b), "ERR ARG bad?line?here?\?\?\?.\n");

    sbuf_reset(&b);
    proto_format_errf(&b, PROTO_ERR_HELD,
                      "this session already holds %s", "invoice:1001");
    ck_assert_str_eq(sbuf_cstr(&b),
                     "ERR HELD this session already holds invoice:1001\n");

    sbuf_reset(&b);
    proto_format_errf(&b, PROTO_ERR_NOTHELD, "%s%c%s", "a", '\n', "EVENT X");
    ck_assert_str_eq(sbuf_cstr(&b), "ERR NOTHELD a?EVENT X\n");

    sbuf_reset(&b);
    proto_format_errf(&b, PROTO_ERR_LIMIT, "%s", "");
    ck_assert_str_eq(sbuf_cstr(&b),
                     "ERR LIMIT a configured limit was reached\n");

    /* An out-of-range code is a caller bug but still yields a valid line. */
    sbuf_reset(&b);
    proto_format_err(&b, PROTO_ERR_NONE, "oops");
    ck_assert_str_eq(sbuf_cstr(&b), "ERR ARG oops\n");
    sbuf_deinit(&b);
}
END_TEST

/* Every code, with its default and with a custom message, round-trips. */
START_TEST(test_format_err_all)
{
    enum proto_err code = (enum proto_err)(_i + 1);
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;
    char want[256];

    proto_format_err(&b, code, NULL);
    snprintf(want, sizeof(want), "ERR %s %s\n", t_err_words[code],
             proto_err_default_msg(code));
    ck_assert_str_eq(sbuf_cstr(&b), want);
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_ERR);
    ck_assert_int_eq(r.err, code);
    ck_assert_str_eq(r.err_word, t_err_words[code]);
    ck_assert_str_eq(r.text, proto_err_default_msg(code));

    sbuf_reset(&b);
    proto_format_err(&b, code, "custom text");
    snprintf(want, sizeof(want), "ERR %s custom text\n", t_err_words[code]);
    ck_assert_str_eq(sbuf_cstr(&b), want);
    sbuf_deinit(&b);
}
END_TEST

/* Requests as the client builds them, every word from the tables. */
START_TEST(test_format_request)
{
    struct sbuf b = SBUF_INIT;

    proto_format_cmd(&b, PROTO_CMD_LOCK);
    proto_format_word(&b, "job:42");
    proto_format_opt_u64(&b, PROTO_OPT_TTL, 30000);
    proto_format_opt_u64(&b, PROTO_OPT_WAIT, 4294967295u);
    proto_format_opt_u64(&b, PROTO_OPT_RENEW, 1);
    proto_format_end(&b);
    ck_assert_str_eq(sbuf_cstr(&b),
                     "LOCK job:42 ttl=30000 wait=4294967295 renew=1\n");

    sbuf_reset(&b);
    proto_format_cmd(&b, PROTO_CMD_HELLO);
    proto_format_opt_u64(&b, PROTO_OPT_PROTO, PROTO_VERSION);
    proto_format_opt_str(&b, PROTO_OPT_NAME, "alice");
    proto_format_opt_u64(&b, PROTO_OPT_KEEPALIVE, 5000);
    proto_format_end(&b);
    ck_assert_str_eq(sbuf_cstr(&b),
                     "HELLO proto=1 name=alice keepalive=5000\n");

    sbuf_reset(&b);
    proto_format_request(&b, PROTO_CMD_QUIT, NULL);
    proto_format_request(&b, PROTO_CMD_UNLOCK, "job:42");
    proto_format_request(&b, PROTO_CMD_AUTH, "pa=ss");
    ck_assert_str_eq(sbuf_cstr(&b), "QUIT\nUNLOCK job:42\nAUTH pa=ss\n");

    /* Out of range: nothing, so a bad call can not forge a word. */
    sbuf_reset(&b);
    proto_format_cmd(&b, PROTO_CMD_NONE);
    proto_format_cmd(&b, PROTO_CMD_COUNT);
    proto_format_opt_u64(&b, (enum proto_opt)0, 1);
    proto_format_opt_str(&b, (enum proto_opt)(1u << 20), "x");
    ck_assert_str_eq(sbuf_cstr(&b), "");

    /* An argument can not split the line. */
    proto_format_request(&b, PROTO_CMD_STATUS, "a b\nPING");
    ck_assert_str_eq(sbuf_cstr(&b), "STATUS a_b_PING\n");
    sbuf_deinit(&b);
}
END_TEST

/* Every command's request reads back as that command. */
START_TEST(test_format_request_parses)
{
    static const struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    struct proto_request req;
    struct proto_error err;
    struct sbuf b = SBUF_INIT;
    int i;

    for (i = PROTO_CMD_NONE + 1; i < PROTO_CMD_COUNT; i++) {
        sbuf_reset(&b);
        proto_format_cmd(&b, (enum proto_cmd)i);
        if (i == PROTO_CMD_AUTH || i == PROTO_CMD_LOCK || i == PROTO_CMD_UNLOCK
            || i == PROTO_CMD_EXTEND || i == PROTO_CMD_STATUS
            || i == PROTO_CMD_FORCEUNLOCK || i == PROTO_CMD_READMIT
            || i == PROTO_CMD_ADOPT || i == PROTO_CMD_WATCH
            || i == PROTO_CMD_UNWATCH)
            proto_format_word(&b, "x");
        if (i == PROTO_CMD_EXTEND)
            proto_format_opt_u64(&b, PROTO_OPT_TTL, 1);
        if (i == PROTO_CMD_ADOPT)
            proto_format_opt_str(&b, PROTO_OPT_TOKEN,
                                 "0123456789abcdef0123456789abcdef");
        proto_format_end(&b);
        ck_assert_int_eq(t_parsen(b.data, b.len - 1, &lim, &req, &err),
                         PROTO_PARSE_OK);
        ck_assert_int_eq(req.cmd, i);
    }
    sbuf_deinit(&b);
}
END_TEST

START_TEST(test_opt_names)
{
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_TTL), "ttl");
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_WAIT), "wait");
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_RENEW), "renew");
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_PROTO), "proto");
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_NAME), "name");
    ck_assert_str_eq(proto_opt_name(PROTO_OPT_KEEPALIVE), "keepalive");
    ck_assert_ptr_null(proto_opt_name((enum proto_opt)0));
    ck_assert_ptr_null(proto_opt_name(PROTO_OPT_TTL | PROTO_OPT_WAIT));
}
END_TEST

START_TEST(test_format_appends)
{
    struct sbuf b = SBUF_INIT;

    /* Formatters append, so pipelined replies can share one buffer. */
    proto_format_ok(&b);
    proto_format_pong(&b, "x", 1);
    proto_format_event_shutdown(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "OK\nPONG x\nEVENT SHUTDOWN\n");
    sbuf_deinit(&b);
}
END_TEST

/* ---- reply parsing ----------------------------------------------------- */

struct t_reply {
    const char *line;
    enum proto_reply_kind kind;
    enum proto_err err;
    const char *err_word;
    const char *text;
    size_t nkv;
    const char *kv[4][2];
};

static const struct t_reply t_reply_rows[] = {
    { "OK", PROTO_REPLY_OK, PROTO_ERR_NONE, "", "", 0, { { 0 } } },
    { "OK\r", PROTO_REPLY_OK, PROTO_ERR_NONE, "", "", 0, { { 0 } } },
    { "OK resource=job:42 fence=17", PROTO_REPLY_OK, PROTO_ERR_NONE, "", "",
      2, { { "resource", "job:42" }, { "fence", "17" } } },
    { "OK proto=1 session=s1 server=redlockd/0.1.0 nodes=3", PROTO_REPLY_OK,
      PROTO_ERR_NONE, "", "", 4,
      { { "proto", "1" }, { "session", "s1" }, { "server", "redlockd/0.1.0" },
        { "nodes", "3" } } },
    { "OK a==b c=", PROTO_REPLY_OK, PROTO_ERR_NONE, "", "", 2,
      { { "a", "=b" }, { "c", "" } } },
    { "OK bye", PROTO_REPLY_OK, PROTO_ERR_NONE, "", "", 1, { { "bye", "" } } },
    { "OK {\"session\":\"s7\",\"locks\":[]}", PROTO_REPLY_OK, PROTO_ERR_NONE,
      "", "{\"session\":\"s7\",\"locks\":[]}", 0, { { 0 } } },
    { "OK {\"a\": \"x y\"}", PROTO_REPLY_OK, PROTO_ERR_NONE, "",
      "{\"a\": \"x y\"}", 0, { { 0 } } },
    { "PONG", PROTO_REPLY_PONG, PROTO_ERR_NONE, "", "", 0, { { 0 } } },
    { "PONG hello", PROTO_REPLY_PONG, PROTO_ERR_NONE, "", "hello", 0,
      { { 0 } } },
    { "PONG hello\r", PROTO_REPLY_PONG, PROTO_ERR_NONE, "", "hello", 0,
      { { 0 } } },
    { "ERR BUSY resource is held by someone else", PROTO_REPLY_ERR,
      PROTO_ERR_BUSY, "BUSY", "resource is held by someone else", 0,
      { { 0 } } },
    { "ERR TIMEOUT", PROTO_REPLY_ERR, PROTO_ERR_TIMEOUT, "TIMEOUT", "", 0,
      { { 0 } } },
    { "ERR FROBNICATED the new thing", PROTO_REPLY_ERR, PROTO_ERR_NONE,
      "FROBNICATED", "the new thing", 0, { { 0 } } },
    { "ERR ARG a=b  two  spaces ", PROTO_REPLY_ERR, PROTO_ERR_ARG, "ARG",
      "a=b  two  spaces ", 0, { { 0 } } },
    { "EVENT LOST resource=job:42 fence=17 reason=expired", PROTO_REPLY_EVENT,
      PROTO_ERR_NONE, "", "LOST", 3,
      { { "resource", "job:42" }, { "fence", "17" }, { "reason", "expired" } } },
    { "EVENT SHUTDOWN", PROTO_REPLY_EVENT, PROTO_ERR_NONE, "", "SHUTDOWN", 0,
      { { 0 } } },
};

START_TEST(test_reply_parse)
{
    const struct t_reply *t = &t_reply_rows[_i];
    struct proto_reply r;
    char line[256];
    size_t i, len = strlen(t->line);

    memcpy(line, t->line, len + 1);
    ck_assert_msg(proto_reply_parse(line, len, &r) == 0, "\"%s\"", t->line);
    ck_assert_int_eq(r.kind, t->kind);
    ck_assert_int_eq(r.err, t->err);
    ck_assert_str_eq(r.err_word, t->err_word);
    ck_assert_str_eq(r.text, t->text);
    ck_assert_uint_eq(r.nkv, t->nkv);
    for (i = 0; i < t->nkv; i++) {
        ck_assert_str_eq(r.kv[i].key, t->kv[i][0]);
        ck_assert_str_eq(r.kv[i].val, t->kv[i][1]);
        ck_assert_str_eq(proto_reply_get(&r, t->kv[i][0]), t->kv[i][1]);
    }
    ck_assert_ptr_null(proto_reply_get(&r, "missing"));
}
END_TEST

struct t_bad_reply {
    const char *line;
    size_t len;
};

static const struct t_bad_reply t_bad_reply_rows[] = {
    { "", 0 }, { " ", 1 }, { "\r", 1 }, { "HELLO", 5 }, { "ok", 2 },
    { "OKAY", 4 }, { "Ok x=1", 6 }, { "ERR", 3 }, { "ERR ", 4 },
    { "EVENT", 5 }, { "EVENT  ", 7 }, { "PONG a b", 8 }, { "OK\x01", 3 },
    { "OK a\0b", 6 }, { "ERR BUSY a\rb", 12 }, { "PONG\x7f", 5 },
    { "OK\r\r", 4 },
};

START_TEST(test_reply_invalid)
{
    const struct t_bad_reply *t = &t_bad_reply_rows[_i];
    struct proto_reply r;
    char line[64];

    memcpy(line, t->line, t->len);
    line[t->len] = 'X';
    ck_assert_msg(proto_reply_parse(line, t->len, &r) == -1, "row %d", _i);
    ck_assert_int_eq(r.kind, PROTO_REPLY_INVALID);
    ck_assert_ptr_nonnull(r.text);
    ck_assert_uint_eq(r.nkv, 0);
}
END_TEST

/* Words beyond PROTO_REPLY_MAX_KV are dropped, not an error. */
START_TEST(test_reply_many_kv)
{
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;
    char key[16];
    int i;

    proto_format_ok_begin(&b);
    for (i = 0; i < PROTO_REPLY_MAX_KV + 5; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        proto_format_kv_u64(&b, key, (uint64_t)i);
    }
    ck_assert_int_eq(proto_reply_parse(b.data, b.len, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_OK);
    ck_assert_uint_eq(r.nkv, PROTO_REPLY_MAX_KV);
    snprintf(key, sizeof(key), "k%d", PROTO_REPLY_MAX_KV - 1);
    ck_assert_ptr_nonnull(proto_reply_get(&r, key));
    snprintf(key, sizeof(key), "k%d", PROTO_REPLY_MAX_KV);
    ck_assert_ptr_null(proto_reply_get(&r, key));
    sbuf_deinit(&b);
}
END_TEST

/* What the formatters write, the reply parser reads back. */
START_TEST(test_reply_roundtrip)
{
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;

    proto_format_event_lost(&b, "job:42", 17, "quorum");
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_EVENT);
    ck_assert_str_eq(r.text, "LOST");
    ck_assert_str_eq(proto_reply_get(&r, "resource"), "job:42");
    ck_assert_str_eq(proto_reply_get(&r, "fence"), "17");
    ck_assert_str_eq(proto_reply_get(&r, "reason"), "quorum");

    sbuf_reset(&b);
    proto_format_help(&b);
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_OK);
    ck_assert_uint_eq(r.nkv, PROTO_CMD_COUNT - 1);
    ck_assert_str_eq(r.kv[0].key, "PING");

    sbuf_reset(&b);
    proto_format_ok_json(&b, "{\"x\":[1,2]}");
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_str_eq(r.text, "{\"x\":[1,2]}");
    sbuf_deinit(&b);
}
END_TEST

/* ---- sbuf -------------------------------------------------------------- */

START_TEST(test_sbuf)
{
    struct sbuf b;
    char big[3000];
    size_t cap;

    sbuf_init(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "");
    ck_assert_uint_eq(b.len, 0);
    sbuf_consume(&b, 5);
    sbuf_reset(&b);
    ck_assert_str_eq(sbuf_cstr(&b), "");

    sbuf_puts(&b, "hello");
    sbuf_putc(&b, ' ');
    sbuf_append(&b, "world!!", 5);
    ck_assert_str_eq(sbuf_cstr(&b), "hello world");
    ck_assert_uint_eq(b.len, 11);

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    sbuf_printf(&b, "<%s|%d>", big, 42);
    ck_assert_uint_eq(b.len, 11 + sizeof(big) - 1 + 5);
    ck_assert_str_eq(b.data + b.len - 4, "|42>");
    ck_assert_uint_gt(b.cap, b.len);

    sbuf_consume(&b, 6);
    ck_assert_int_eq(strncmp(sbuf_cstr(&b), "world<xxx", 9), 0);
    sbuf_consume(&b, b.len + 10);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_str_eq(sbuf_cstr(&b), "");

    cap = b.cap;
    sbuf_reset(&b);
    ck_assert_uint_eq(b.cap, cap);
    sbuf_reserve(&b, 100000);
    ck_assert_uint_ge(b.cap, 100001);
    sbuf_append(&b, "", 0);
    ck_assert_str_eq(sbuf_cstr(&b), "");

    sbuf_deinit(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.cap, 0);
}
END_TEST

START_TEST(test_sbuf_binary)
{
    struct sbuf b = SBUF_INIT;

    sbuf_append(&b, "a\0b", 3);
    ck_assert_uint_eq(b.len, 3);
    ck_assert_int_eq(memcmp(b.data, "a\0b", 4), 0);
    sbuf_consume(&b, 1);
    ck_assert_int_eq(memcmp(b.data, "\0b", 3), 0);
    sbuf_deinit(&b);
}
END_TEST

/* A reserved buffer takes lines up to that size without growing. */
START_TEST(test_sbuf_try_reserve)
{
    struct sbuf b = SBUF_INIT;
    char *data;
    size_t cap;

    ck_assert_int_eq(sbuf_try_reserve(&b, 1000), 0);
    ck_assert_uint_ge(b.cap, 1001);
    data = b.data;
    cap = b.cap;
    proto_format_request(&b, PROTO_CMD_PING, NULL);
    sbuf_reset(&b);
    proto_format_cmd(&b, PROTO_CMD_LOCK);
    proto_format_opt_u64(&b, PROTO_OPT_TTL, UINT64_MAX);
    ck_assert_ptr_eq(b.data, data);
    ck_assert_uint_eq(b.cap, cap);
    /* Too big to add up: refused before any allocation is tried. */
    ck_assert_int_eq(sbuf_try_reserve(&b, SIZE_MAX), -1);
    ck_assert_int_eq(sbuf_try_reserve(&b, SIZE_MAX - b.len), -1);
    ck_assert_str_eq(sbuf_cstr(&b), "LOCK ttl=18446744073709551615");
    sbuf_deinit(&b);
}
END_TEST

/* ---- tags ---------------------------------------------------------------- */

struct t_tag {
    const char *line;
    enum proto_parse_status st;
    const char *tag;        /* NULL: untagged (or a malformed tag) */
    enum proto_cmd cmd;     /* when parsed */
    enum proto_err err;     /* when an error */
};

#define TAG32 "abcdefghijklmnopqrstuvwxyz012345"
_Static_assert(sizeof(TAG32) == PROTO_MAX_TAG + 1, "TAG32 length");

static const struct t_tag t_tag_rows[] = {
    { "#a1 LOCK job:1 wait=5000", PROTO_PARSE_OK, "a1", PROTO_CMD_LOCK, 0 },
    { "#Z.9-x_y:z PING", PROTO_PARSE_OK, "Z.9-x_y:z", PROTO_CMD_PING, 0 },
    { "  #t\tUNLOCK a b", PROTO_PARSE_OK, "t", PROTO_CMD_UNLOCK, 0 },
    { "#" TAG32 " STATS", PROTO_PARSE_OK, TAG32, PROTO_CMD_STATS, 0 },
    { "#t lock x\r", PROTO_PARSE_OK, "t", PROTO_CMD_LOCK, 0 },
    { "LOCK x", PROTO_PARSE_OK, NULL, PROTO_CMD_LOCK, 0 },
    /* A tagged request's own errors are its tagged answer. */
    { "#t FROB", PROTO_PARSE_ERROR, "t", PROTO_CMD_NONE, PROTO_ERR_UNKNOWN },
    { "#t LOCK", PROTO_PARSE_ERROR, "t", PROTO_CMD_LOCK, PROTO_ERR_ARG },
    { "#t LOCK x ttl=-1", PROTO_PARSE_ERROR, "t", PROTO_CMD_LOCK,
      PROTO_ERR_ARG },
    /* A malformed tag: answered untagged. */
    { "#", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "# LOCK x", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "#t", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "#t   ", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "#" TAG32 "6 PING", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE,
      PROTO_ERR_ARG },
    { "#a/b PING", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "#a#b PING", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE, PROTO_ERR_ARG },
    { "#\xc3\xa9 PING", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE,
      PROTO_ERR_ARG },
    { "#t\x01 PING", PROTO_PARSE_ERROR, NULL, PROTO_CMD_NONE,
      PROTO_ERR_ARG },
    /* A control byte after a good tag: refused under that tag. */
    { "#t PING a\x01", PROTO_PARSE_ERROR, "t", PROTO_CMD_NONE,
      PROTO_ERR_ARG },
    { " #u\tLOCK \x7f", PROTO_PARSE_ERROR, "u", PROTO_CMD_NONE,
      PROTO_ERR_ARG },
};

START_TEST(test_parse_tags)
{
    const struct t_tag *row = &t_tag_rows[_i];
    struct proto_request req;
    struct proto_error err;
    enum proto_parse_status st = t_parse(row->line, &req, &err);

    ck_assert_msg(st == row->st, "\"%s\": status %d", row->line, st);
    if (row->tag) {
        ck_assert_ptr_nonnull(req.tag);
        ck_assert_uint_eq(req.tag_len, strlen(row->tag));
        ck_assert(memcmp(req.tag, row->tag, req.tag_len) == 0);
    } else {
        ck_assert_ptr_null(req.tag);
    }
    if (st == PROTO_PARSE_OK)
        ck_assert_int_eq(req.cmd, row->cmd);
    else
        ck_assert_int_eq(err.code, row->err);
}
END_TEST

/* A tagged reply reads back with its tag; an EVENT is never tagged. */
START_TEST(test_tagged_replies)
{
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;
    const struct proto_grant g = {
        .resource = "job:1", .nresources = 1,
        .token = "0123456789abcdef0123456789abcdef", .fence = 9, .ttl = 30000,
        .validity = 29890,
    };

    proto_format_tag(&b, "a2", 2);
    proto_format_grant(&b, &g);
    ck_assert_str_eq(sbuf_cstr(&b), "#a2 OK resource=job:1 token="
                     "0123456789abcdef0123456789abcdef fence=9 ttl=30000 "
                     "validity=29890\n");
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_OK);
    ck_assert_uint_eq(r.tag_len, 2);
    ck_assert(memcmp(r.tag, "a2", 2) == 0);
    ck_assert_str_eq(proto_reply_get(&r, "fence"), "9");

    sbuf_reset(&b);
    proto_format_tag(&b, "t.1", 3);
    proto_format_err(&b, PROTO_ERR_ARG, "tag in use");
    ck_assert_str_eq(sbuf_cstr(&b), "#t.1 ERR ARG tag in use\n");
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_int_eq(r.kind, PROTO_REPLY_ERR);
    ck_assert_int_eq(r.err, PROTO_ERR_ARG);
    ck_assert_uint_eq(r.tag_len, 3);

    sbuf_reset(&b);
    proto_format_grant(&b, &(struct proto_grant){
        .resource = "a", .nresources = 3, .token = "t", .fence = 1,
        .ttl = 2, .validity = 1, .shared = true });
    ck_assert_str_eq(sbuf_cstr(&b), "OK resources=3 token=t fence=1 ttl=2 "
                     "validity=1 mode=shared\n");
    ck_assert_int_eq(proto_reply_parse(b.data, b.len - 1, &r), 0);
    ck_assert_ptr_null(r.tag);

    static const char *const bad[] = {
        "#t EVENT LOST resource=x fence=1 reason=node", "#t", "# OK",
        "#a/b OK", "#t FOO",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char line[128];
        snprintf(line, sizeof(line), "%s", bad[i]);
        ck_assert_msg(proto_reply_parse(line, strlen(line), &r) == -1,
                      "\"%s\" parsed", bad[i]);
    }
    sbuf_deinit(&b);
}
END_TEST

/* ---- suite ------------------------------------------------------------- */

static Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("parse");

    tcase_add_loop_test(tc, test_parse_valid, 0, ARRAY_LEN(t_valid_rows));
    tcase_add_test(tc, test_parse_every_command);
    tcase_add_test(tc, test_parse_value);
    tcase_add_test(tc, test_parse_kinds);
    tcase_add_loop_test(tc, test_parse_empty, 0, ARRAY_LEN(t_empty_rows));
    tcase_add_loop_test(tc, test_parse_errors, 0, ARRAY_LEN(t_bad_rows));
    tcase_add_test(tc, test_parse_auth_user);
    tcase_add_test(tc, test_parse_error_struct);
    tcase_add_test(tc, test_parse_error_truncation);
    tcase_add_test(tc, test_resource_length);
    tcase_add_loop_test(tc, test_resource_bytes, 0, ARRAY_LEN(t_byte_rows));
    tcase_add_loop_test(tc, test_parse_u32, 0, ARRAY_LEN(t_u32_rows));
    tcase_add_test(tc, test_parse_u32_len);
    tcase_add_loop_test(tc, test_parse_duration, 0, ARRAY_LEN(t_dur_rows));
    tcase_add_test(tc, test_parse_duration_len);
    tcase_add_loop_test(tc, test_parse_num, 0, ARRAY_LEN(t_num_rows));
    tcase_add_loop_test(tc, test_parse_i64, 0, ARRAY_LEN(t_i64_rows));
    tcase_add_test(tc, test_parse_range);
    tcase_add_test(tc, test_parse_num_len);
    tcase_add_test(tc, test_tables);
    tcase_add_loop_test(tc, test_parse_tags, 0, ARRAY_LEN(t_tag_rows));
    suite_add_tcase(s, tc);

    tc = tcase_create("format");
    tcase_add_test(tc, test_format_kv);
    tcase_add_test(tc, test_format_kv_sanitize);
    tcase_add_test(tc, test_format_simple);
    tcase_add_test(tc, test_format_err);
    tcase_add_loop_test(tc, test_format_err_all, 0, PROTO_ERR_COUNT - 1);
    tcase_add_test(tc, test_format_appends);
    tcase_add_test(tc, test_format_request);
    tcase_add_test(tc, test_format_request_parses);
    tcase_add_test(tc, test_opt_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("reply");
    tcase_add_loop_test(tc, test_reply_parse, 0, ARRAY_LEN(t_reply_rows));
    tcase_add_loop_test(tc, test_reply_invalid, 0,
                        ARRAY_LEN(t_bad_reply_rows));
    tcase_add_test(tc, test_reply_many_kv);
    tcase_add_test(tc, test_reply_roundtrip);
    tcase_add_test(tc, test_tagged_replies);
    suite_add_tcase(s, tc);

    tc = tcase_create("sbuf");
    tcase_add_test(tc, test_sbuf);
    tcase_add_test(tc, test_sbuf_binary);
    tcase_add_test(tc, test_sbuf_try_reserve);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(proto_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
