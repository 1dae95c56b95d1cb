/*
 * proto: the redlockd wire protocol v1 (see proto.h and docs/protocol.md).
 *
 * Three parts, all pure functions over caller-owned memory:
 *   - proto_parse: one untrusted request line -> struct proto_request, or an
 *     ERR code plus a safe message. This is the only place client bytes are
 *     interpreted; everything after it works on validated fields.
 *   - proto_format_*: reply and event lines (and, for the client, request
 *     lines from the command table), with every variable part sanitized so
 *     a value can never split or forge a line.
 *   - proto_reply_parse: the client side of the same lines.
 *
 * Command words and error codes come from the X-macro tables in proto.h; the
 * per-command argument rules live in proto_cmd_specs below.
 */
#include "proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* How much of a client word is quoted back in an error message. */
#define PROTO_QUOTE_MAX 32

/* ---- tables ----------------------------------------------------------- */

static const char *const proto_cmd_words[PROTO_CMD_COUNT] = {
    [PROTO_CMD_NONE] = NULL,
#define X(name, word, usage) [PROTO_CMD_##name] = word,
    PROTO_COMMANDS(X)
#undef X
};

static const char *const proto_cmd_usage[PROTO_CMD_COUNT] = {
    [PROTO_CMD_NONE] = NULL,
#define X(name, word, usage) [PROTO_CMD_##name] = usage,
    PROTO_COMMANDS(X)
#undef X
};

struct proto_err_entry {
    const char *word;
    const char *msg;
};

static const struct proto_err_entry proto_err_table[PROTO_ERR_COUNT] = {
    [PROTO_ERR_NONE] = { NULL, NULL },
#define X(name, word, msg) [PROTO_ERR_##name] = { word, msg },
    PROTO_ERRORS(X)
#undef X
};

/*
 * Argument rules per command. `raw_first` makes the first word after the
 * command positional even if it contains '=', because a PING word or an AUTH
 * password may legitimately hold one.
 */
struct proto_cmd_spec {
    unsigned opts;          /* allowed PROTO_OPT_* bits */
    unsigned required;      /* PROTO_OPT_* bits that must be present */
    unsigned min_args;
    unsigned max_args;
    bool resource;          /* the positional argument is a resource name */
    bool raw_first;
    bool raw_all;           /* every word is positional: AUTH's user name
                               and password may each hold a '=' */
    const char *missing;    /* message when min_args is not met */
};

static const struct proto_cmd_spec proto_cmd_specs[PROTO_CMD_COUNT] = {
    [PROTO_CMD_PING] = { 0, 0, 0, 1, false, true, false, NULL },
    [PROTO_CMD_HELLO] = {
        PROTO_OPT_PROTO | PROTO_OPT_NAME | PROTO_OPT_KEEPALIVE |
        PROTO_OPT_DETACH | PROTO_OPT_RESUME | PROTO_OPT_SECRET,
        0, 0, 0, false, false, false, NULL },
    [PROTO_CMD_AUTH] = { 0, 0, 1, 2, false, true, true,
                         "AUTH needs a password (or a user and a password)" },
    [PROTO_CMD_LOCK] = {
        PROTO_OPT_TTL | PROTO_OPT_WAIT | PROTO_OPT_RENEW | PROTO_OPT_MODE |
        PROTO_OPT_LIMIT | PROTO_OPT_VALUE,
        0, 1, PROTO_MAX_RESOURCES, true, false, false,
        "LOCK needs a resource name" },
    [PROTO_CMD_UNLOCK] = { 0, 0, 1, PROTO_MAX_RESOURCES, true, false, false,
                           "UNLOCK needs a resource name" },
    [PROTO_CMD_ADOPT] = { PROTO_OPT_TOKEN | PROTO_OPT_TTL | PROTO_OPT_RENEW,
                          PROTO_OPT_TOKEN, 1, PROTO_MAX_RESOURCES, true, false,
                          false, "ADOPT needs a resource name" },
    [PROTO_CMD_EXTEND] = { PROTO_OPT_TTL | PROTO_OPT_VALUE, 0, 1, 1, true,
                           false, false, "EXTEND needs a resource name" },
    [PROTO_CMD_LOCKS] = { 0, 0, 0, 0, false, false, false, NULL },
    [PROTO_CMD_STATUS] = { PROTO_OPT_LIMIT, 0, 1, 1, true, false, false,
                           "STATUS needs a resource name" },
    [PROTO_CMD_SESSIONS] = { 0, 0, 0, 0, false, false, false, NULL },
    [PROTO_CMD_STATS] = { 0, 0, 0, 0, false, false, false, NULL },
    [PROTO_CMD_TOP] = { PROTO_OPT_LIMIT, 0, 0, 0, false, false, false, NULL },
    [PROTO_CMD_FORCEUNLOCK] = { 0, 0, 1, 1, true, false, false,
                                "FORCEUNLOCK needs a resource name" },
    [PROTO_CMD_READMIT] = { 0, 0, 1, 1, false, true, false,
                            "READMIT needs a node (host:port as configured) "
                            "or all" },
    [PROTO_CMD_WATCH] = { 0, 0, 1, PROTO_MAX_RESOURCES, true, false, false,
                          "WATCH needs a resource name" },
    [PROTO_CMD_UNWATCH] = { 0, 0, 1, PROTO_MAX_RESOURCES, true, false, false,
                            "UNWATCH needs a resource name" },
    [PROTO_CMD_HELP] = { 0, 0, 0, 1, false, true, false, NULL },
    [PROTO_CMD_QUIT] = { 0, 0, 0, 0, false, false, false, NULL },
};

struct proto_opt_entry {
    const char *name;
    unsigned bit;
};

static const struct proto_opt_entry proto_opt_table[] = {
    { "ttl", PROTO_OPT_TTL },
    { "wait", PROTO_OPT_WAIT },
    { "renew", PROTO_OPT_RENEW },
    { "proto", PROTO_OPT_PROTO },
    { "name", PROTO_OPT_NAME },
    { "keepalive", PROTO_OPT_KEEPALIVE },
    { "mode", PROTO_OPT_MODE },
    { "limit", PROTO_OPT_LIMIT },
    { "detach", PROTO_OPT_DETACH },
    { "resume", PROTO_OPT_RESUME },
    { "secret", PROTO_OPT_SECRET },
    { "token", PROTO_OPT_TOKEN },
    { "value", PROTO_OPT_VALUE },
};

#define PROTO_NOPTS (sizeof(proto_opt_table) / sizeof(proto_opt_table[0]))

/* ---- table lookups ---------------------------------------------------- */

const char *proto_cmd_name(enum proto_cmd cmd)
{
    if ((int)cmd <= PROTO_CMD_NONE || cmd >= PROTO_CMD_COUNT)
        return NULL;
    return proto_cmd_words[cmd];
}

const char *proto_opt_name(enum proto_opt opt)
{
    size_t i;

    for (i = 0; i < PROTO_NOPTS; i++) {
        if (proto_opt_table[i].bit == (unsigned)opt)
            return proto_opt_table[i].name;
    }
    return NULL;
}

const char *proto_err_word(enum proto_err code)
{
    if ((int)code <= PROTO_ERR_NONE || code >= PROTO_ERR_COUNT)
        return NULL;
    return proto_err_table[code].word;
}

const char *proto_err_default_msg(enum proto_err code)
{
    if ((int)code <= PROTO_ERR_NONE || code >= PROTO_ERR_COUNT)
        return NULL;
    return proto_err_table[code].msg;
}

enum proto_err proto_err_from_word(const char *word, size_t len)
{
    int i;

    for (i = PROTO_ERR_NONE + 1; i < PROTO_ERR_COUNT; i++) {
        const char *w = proto_err_table[i].word;
        if (strlen(w) == len && memcmp(w, word, len) == 0)
            return (enum proto_err)i;
    }
    return PROTO_ERR_NONE;
}

/* ASCII-only, so the daemon's locale can never change what a command is. */
static bool proto_word_ieq(const char *upper, const char *word, size_t len)
{
    size_t i;

    if (strlen(upper) != len)
        return false;
    for (i = 0; i < len; i++) {
        char c = word[i];
        if (c >= 'a' && c <= 'z')
            c = (char)(c - 'a' + 'A');
        if (c != upper[i])
            return false;
    }
    return true;
}

enum proto_cmd proto_cmd_lookup(const char *word, size_t len)
{
    int i;

    for (i = PROTO_CMD_NONE + 1; i < PROTO_CMD_COUNT; i++) {
        if (proto_word_ieq(proto_cmd_words[i], word, len))
            return (enum proto_cmd)i;
    }
    return PROTO_CMD_NONE;
}

/* ---- small helpers ---------------------------------------------------- */

static bool proto_is_sep(char c)
{
    return c == ' ' || c == '\t';
}

static bool proto_is_ctl(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

static bool proto_is_visible(unsigned char c)
{
    return c >= 0x21 && c <= 0x7e;
}

/*
 * Next word of a NUL-terminated line: skips separators, terminates the word
 * in place and leaves *pos after it. NULL at the end of the line.
 */
static char *proto_next_word(char **pos, size_t *wlen)
{
    char *p = *pos, *start;

    while (proto_is_sep(*p))
        p++;
    if (*p == '\0') {
        *pos = p;
        return NULL;
    }
    start = p;
    while (*p != '\0' && !proto_is_sep(*p))
        p++;
    *wlen = (size_t)(p - start);
    if (*p != '\0')
        *p++ = '\0';
    *pos = p;
    return start;
}

/*
 * Copy at most PROTO_QUOTE_MAX bytes of an untrusted word for an error
 * message, replacing anything that is not printable ASCII.
 */
static void proto_quote(char *dst, size_t dstsz, const char *s, size_t len)
{
    size_t i, n = len > PROTO_QUOTE_MAX ? PROTO_QUOTE_MAX : len;

    if (dstsz < n + 4)
        n = dstsz > 4 ? dstsz - 4 : 0;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[i] = (c >= 0x20 && c <= 0x7e) ? (char)c : '?';
    }
    if (n < len && dstsz >= n + 4) {
        memcpy(dst + n, "...", 3);
        n += 3;
    }
    dst[n] = '\0';
}

static enum proto_parse_status proto_fail(struct proto_error *err,
                                          enum proto_err code,
                                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum proto_parse_status proto_fail(struct proto_error *err,
                                          enum proto_err code,
                                          const char *fmt, ...)
{
    va_list ap;

    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return PROTO_PARSE_ERROR;
}

/* ---- names ------------------------------------------------------------ */

static size_t proto_max_resource(const struct proto_limits *lim)
{
    static const struct proto_limits def = PROTO_LIMITS_DEFAULT;

    return (lim ? lim : &def)->max_resource_len;
}

static size_t proto_max_value(const struct proto_limits *lim)
{
    return lim && lim->max_value_len ? lim->max_value_len
                                     : PROTO_VALUE_LEN_DEFAULT;
}

static bool proto_all_visible(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        if (!proto_is_visible((unsigned char)s[i]))
            return false;
    }
    return true;
}

int proto_valid_resource(const char *s, size_t len,
                         const struct proto_limits *lim)
{
    if (!s || len == 0 || len > proto_max_resource(lim))
        return 0;
    return proto_all_visible(s, len) ? 1 : 0;
}

/* ---- request parsing -------------------------------------------------- */

static const struct proto_opt_entry *proto_opt_lookup(const char *name,
                                                      size_t len)
{
    size_t i;

    for (i = 0; i < PROTO_NOPTS; i++) {
        const char *n = proto_opt_table[i].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return &proto_opt_table[i];
    }
    return NULL;
}

static bool proto_has_upper(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        if (s[i] >= 'A' && s[i] <= 'Z')
            return true;
    }
    return false;
}

/*
 * A duration option (ttl= wait= keepalive= detach=): whole milliseconds,
 * or a number with a unit (num.h). The message says what was wrong and
 * what a duration looks like.
 */
static enum proto_parse_status proto_set_duration(const char *opt,
                                                  const char *val,
                                                  size_t vlen, uint32_t min,
                                                  uint32_t *out,
                                                  struct proto_error *err)
{
    char q[PROTO_QUOTE_MAX + 4];
    enum proto_dur e = proto_parse_duration(val, vlen, out);

    if (e == PROTO_DUR_OK && *out >= min)
        return PROTO_PARSE_OK;
    proto_quote(q, sizeof(q), val, vlen);
    if (e == PROTO_DUR_OK)
        return proto_fail(err, PROTO_ERR_ARG, "%s must be at least %" PRIu32
                          " ms (got '%s')", opt, min, q);
    return proto_fail(err, PROTO_ERR_ARG, "%s must be %" PRIu32 " to "
                      "4294967295 ms, or a number with ms, s, m or h: '%s' %s",
                      opt, min, q, proto_dur_why(e));
}

/* Store the value of an option that the command allows. */
static enum proto_parse_status proto_set_opt(struct proto_request *req,
                                             const struct proto_limits *lim,
                                             unsigned bit, const char *val,
                                             size_t vlen,
                                             struct proto_error *err)
{
    char q[PROTO_QUOTE_MAX + 4];

    switch (bit) {
    case PROTO_OPT_TTL:
        return proto_set_duration("ttl", val, vlen, 1, &req->ttl, err);
    case PROTO_OPT_WAIT:
        return proto_set_duration("wait", val, vlen, 0, &req->wait, err);
    case PROTO_OPT_KEEPALIVE:
        return proto_set_duration("keepalive", val, vlen, 0, &req->keepalive,
                                  err);
    case PROTO_OPT_DETACH:
        return proto_set_duration("detach", val, vlen, 0, &req->detach, err);
    case PROTO_OPT_RESUME:
        if (vlen == 0 || vlen > PROTO_MAX_SESSION_LEN ||
            !proto_all_visible(val, vlen))
            return proto_fail(err, PROTO_ERR_ARG, "resume must be a session "
                              "id (1 to %d visible ascii characters)",
                              PROTO_MAX_SESSION_LEN);
        req->resume = val;
        req->resume_len = vlen;
        break;
    case PROTO_OPT_SECRET:
        if (vlen != PROTO_SECRET_LEN || strspn(val, "0123456789abcdef") <
            PROTO_SECRET_LEN)
            return proto_fail(err, PROTO_ERR_ARG, "secret must be %d "
                              "lower-case hex digits", PROTO_SECRET_LEN);
        req->secret = val;
        break;
    case PROTO_OPT_TOKEN:
        if (vlen != PROTO_TOKEN_LEN || strspn(val, "0123456789abcdef") <
            PROTO_TOKEN_LEN)
            return proto_fail(err, PROTO_ERR_ARG, "token must be %d "
                              "lower-case hex digits", PROTO_TOKEN_LEN);
        req->token = val;
        break;
    case PROTO_OPT_RENEW:
        if (vlen != 1 || (val[0] != '0' && val[0] != '1'))
            return proto_fail(err, PROTO_ERR_ARG, "renew must be 0 or 1");
        req->renew = val[0] == '1';
        break;
    case PROTO_OPT_MODE:
        if (vlen == 6 && memcmp(val, "shared", 6) == 0)
            req->mode = PROTO_MODE_SHARED;
        else if (vlen == 9 && memcmp(val, "exclusive", 9) == 0)
            req->mode = PROTO_MODE_EXCLUSIVE;
        else
            return proto_fail(err, PROTO_ERR_ARG,
                              "mode must be shared or exclusive");
        break;
    case PROTO_OPT_LIMIT:
        if (proto_parse_u32(val, vlen, &req->limit) < 0 || req->limit == 0)
            return proto_fail(err, PROTO_ERR_ARG, "limit must be a whole "
                              "number from 1 to 4294967295");
        break;
    case PROTO_OPT_PROTO:
        if (proto_parse_u32(val, vlen, &req->proto) < 0
            || req->proto != PROTO_VERSION) {
            proto_quote(q, sizeof(q), val, vlen);
            return proto_fail(err, PROTO_ERR_ARG,
                              "unsupported protocol version '%s' (this "
                              "server speaks %d)", q, PROTO_VERSION);
        }
        break;
    case PROTO_OPT_NAME:
        if (vlen == 0 || vlen > PROTO_MAX_NAME_LEN
            || !proto_all_visible(val, vlen))
            return proto_fail(err, PROTO_ERR_ARG,
                              "name must be 1 to %d visible ascii characters",
                              PROTO_MAX_NAME_LEN);
        req->name = val;
        req->name_len = vlen;
        break;
    case PROTO_OPT_VALUE:
        if (vlen == 0 || vlen > proto_max_value(lim)
            || !proto_all_visible(val, vlen))
            return proto_fail(err, PROTO_ERR_ARG,
                              "value must be 1 to %zu visible ascii "
                              "characters (locks.max_value_len)",
                              proto_max_value(lim));
        req->value = val;
        req->value_len = vlen;
        break;
    default:
        return proto_fail(err, PROTO_ERR_ARG, "malformed request");
    }
    return PROTO_PARSE_OK;
}

/* One "name=value" word; `eq` points at its '='. */
static enum proto_parse_status proto_parse_opt(struct proto_request *req,
                                               const struct proto_cmd_spec *sp,
                                               const struct proto_limits *lim,
                                               char *word, size_t wlen,
                                               const char *eq,
                                               struct proto_error *err)
{
    const struct proto_opt_entry *o;
    const char *cmd = proto_cmd_name(req->cmd);
    size_t nlen = (size_t)(eq - word);
    char q[PROTO_QUOTE_MAX + 4];

    proto_quote(q, sizeof(q), word, nlen);
    if (nlen == 0)
        return proto_fail(err, PROTO_ERR_ARG, "option without a name");
    if (sp->opts == 0)
        return proto_fail(err, PROTO_ERR_ARG, "%s takes no options (got '%s')",
                          cmd, q);
    if (proto_has_upper(word, nlen))
        return proto_fail(err, PROTO_ERR_ARG,
                          "option names are lower-case (got '%s')", q);
    o = proto_opt_lookup(word, nlen);
    if (!o || (sp->opts & o->bit) == 0)
        return proto_fail(err, PROTO_ERR_ARG, "unknown option '%s' for %s",
                          q, cmd);
    if (req->has & o->bit)
        return proto_fail(err, PROTO_ERR_ARG, "option '%s' given twice", q);
    req->has |= o->bit;
    return proto_set_opt(req, lim, o->bit, eq + 1, wlen - nlen - 1, err);
}

static enum proto_parse_status proto_parse_arg(struct proto_request *req,
                                               const struct proto_cmd_spec *sp,
                                               const struct proto_limits *lim,
                                               char *word, size_t wlen,
                                               struct proto_error *err)
{
    const char *cmd = proto_cmd_name(req->cmd);

    if (sp->max_args == 0)
        return proto_fail(err, PROTO_ERR_ARG, "%s takes no arguments", cmd);
    if (req->nargs >= sp->max_args && sp->max_args > 1 && sp->resource)
        return proto_fail(err, PROTO_ERR_ARG, "%s names at most %u "
                          "resources", cmd, sp->max_args);
    if (req->nargs >= sp->max_args)
        return proto_fail(err, PROTO_ERR_ARG,
                          "wrong number of arguments for %s", cmd);
    if (sp->resource && wlen > proto_max_resource(lim))
        return proto_fail(err, PROTO_ERR_ARG,
                          "resource name longer than %zu bytes "
                          "(locks.max_resource_len)",
                          proto_max_resource(lim));
    if (sp->resource && !proto_valid_resource(word, wlen, lim))
        return proto_fail(err, PROTO_ERR_ARG,
                          "resource name must be visible ascii (0x21-0x7e)");
    for (size_t i = 0; sp->resource && i < req->nargs; i++) {
        if (req->args_len[i] == wlen && memcmp(req->args[i], word, wlen) == 0) {
            char q[PROTO_QUOTE_MAX + 4];
            proto_quote(q, sizeof(q), word, wlen);
            return proto_fail(err, PROTO_ERR_ARG, "resource '%s' named "
                              "twice", q);
        }
    }
    if (!req->arg) {
        req->arg = word;
        req->arg_len = wlen;
    }
    if (sp->max_args > 1) {
        req->args[req->nargs] = word;
        req->args_len[req->nargs] = wlen;
    }
    req->nargs++;
    return PROTO_PARSE_OK;
}

static enum proto_parse_status proto_parse_words(struct proto_request *req,
                                                 const struct proto_limits *lim,
                                                 char *pos,
                                                 struct proto_error *err)
{
    const struct proto_cmd_spec *sp = &proto_cmd_specs[req->cmd];
    enum proto_parse_status st;
    char *word, *eq;
    size_t wlen;

    while ((word = proto_next_word(&pos, &wlen))) {
        eq = memchr(word, '=', wlen);
        if (eq && !sp->raw_all && !(sp->raw_first && !req->arg))
            st = proto_parse_opt(req, sp, lim, word, wlen, eq, err);
        else
            st = proto_parse_arg(req, sp, lim, word, wlen, err);
        if (st != PROTO_PARSE_OK)
            return st;
    }
    if (sp->min_args > 0 && !req->arg)
        return proto_fail(err, PROTO_ERR_ARG, "%s", sp->missing);
    if ((sp->required & PROTO_OPT_TTL) && !(req->has & PROTO_OPT_TTL))
        return proto_fail(err, PROTO_ERR_ARG, "%s needs ttl=<ms>",
                          proto_cmd_name(req->cmd));
    if ((sp->required & PROTO_OPT_TOKEN) && !(req->has & PROTO_OPT_TOKEN))
        return proto_fail(err, PROTO_ERR_ARG, "%s needs token=<hex>",
                          proto_cmd_name(req->cmd));
    if (req->cmd == PROTO_CMD_EXTEND
        && !(req->has & (PROTO_OPT_TTL | PROTO_OPT_VALUE)))
        return proto_fail(err, PROTO_ERR_ARG,
                          "EXTEND needs ttl=<ms> or value=<text>");
    /* A value names one holder: an exclusive lock's. */
    if ((req->has & PROTO_OPT_VALUE) && req->cmd == PROTO_CMD_LOCK
        && (req->mode == PROTO_MODE_SHARED || (req->has & PROTO_OPT_LIMIT)))
        return proto_fail(err, PROTO_ERR_ARG,
                          "value= is for exclusive locks (not with "
                          "mode=shared or limit=)");
    /* resume= and secret= go together; a resumed session keeps its
     * detach= */
    if (!(req->has & PROTO_OPT_RESUME) != !(req->has & PROTO_OPT_SECRET))
        return proto_fail(err, PROTO_ERR_ARG, "resume= and secret= go "
                          "together");
    if ((req->has & PROTO_OPT_RESUME) && (req->has & PROTO_OPT_DETACH))
        return proto_fail(err, PROTO_ERR_ARG, "a resumed session keeps its "
                          "detach=; give it without resume=");
    return PROTO_PARSE_OK;
}

static bool proto_has_ctl(const char *line, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)line[i];
        if (proto_is_ctl(c) && c != '\t')
            return true;
    }
    return false;
}

/* The tag of a line that starts with a good one and has more after it
 * (the line untouched), else NULL. */
static void proto_peek_tag(const char *line, size_t len, const char **tag,
                           size_t *tag_len)
{
    size_t i = 0, j;

    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i == len || line[i] != '#')
        return;
    for (j = i + 1; j < len && line[j] != ' ' && line[j] != '\t'; j++)
        ;
    if (j < len && proto_valid_tag(line + i + 1, j - i - 1)) {
        *tag = line + i + 1;
        *tag_len = j - i - 1;
    }
}

enum proto_parse_status proto_parse(char *line, size_t len,
                                    const struct proto_limits *lim,
                                    struct proto_request *req,
                                    struct proto_error *err)
{
    char q[PROTO_QUOTE_MAX + 4];
    char *pos = line, *word;
    size_t wlen;

    memset(req, 0, sizeof(*req));
    req->renew = true;
    err->code = PROTO_ERR_NONE;
    err->msg[0] = '\0';

    if (len > 0 && line[len - 1] == '\r')
        len--;
    line[len] = '\0';
    if (proto_has_ctl(line, len)) {
        /* Refused whole, but under its tag when it has a good one: the
         * client matches answers by tag. */
        proto_peek_tag(line, len, &req->tag, &req->tag_len);
        return proto_fail(err, PROTO_ERR_ARG, "control character in request");
    }
    word = proto_next_word(&pos, &wlen);
    if (!word)
        return PROTO_PARSE_EMPTY;
    if (word[0] == '#') {
        const char *tag = word + 1;
        size_t tag_len = wlen - 1;

        if (!proto_valid_tag(tag, tag_len))
            return proto_fail(err, PROTO_ERR_ARG, "malformed tag: '#' and "
                              "then 1 to %d of A-Z a-z 0-9 _ - . : before "
                              "the request", PROTO_MAX_TAG);
        word = proto_next_word(&pos, &wlen);
        if (!word)
            return proto_fail(err, PROTO_ERR_ARG, "a tag with no request "
                              "after it");
        /* Set only now: a tag with nothing after it tags nothing, and is
         * answered untagged. */
        req->tag = tag;
        req->tag_len = tag_len;
    }
    req->cmd = proto_cmd_lookup(word, wlen);
    if (req->cmd == PROTO_CMD_NONE) {
        proto_quote(q, sizeof(q), word, wlen);
        return proto_fail(err, PROTO_ERR_UNKNOWN, "unknown command '%s'", q);
    }
    return proto_parse_words(req, lim, pos, err);
}

int proto_valid_tag(const char *s, size_t len)
{
    if (len < 1 || len > PROTO_MAX_TAG)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!s[i] || !strchr(PROTO_TAG_CHARS, s[i]))
            return 0;
    return 1;
}

/* ---- formatting ------------------------------------------------------- */

/* Append s[0..len) with every byte for which bad() holds replaced by rep. */
static void proto_put_clean(struct sbuf *b, const char *s, size_t len,
                            bool (*bad)(unsigned char), char rep)
{
    size_t i, run = 0;

    sbuf_reserve(b, len);
    for (i = 0; i < len; i++) {
        if (!bad((unsigned char)s[i]))
            continue;
        sbuf_append(b, s + run, i - run);
        sbuf_putc(b, rep);
        run = i + 1;
    }
    sbuf_append(b, s + run, len - run);
}

/* Bytes that would split a reply word: separators and control bytes. */
static bool proto_bad_in_word(unsigned char c)
{
    return c == ' ' || proto_is_ctl(c);
}

/* Anything outside printable ASCII, in error messages. */
static bool proto_bad_in_msg(unsigned char c)
{
    return c < 0x20 || c > 0x7e;
}

/*
 * Control bytes in a JSON text. Outside strings they can only be whitespace
 * (jansson escapes them inside strings), so a space keeps the JSON valid.
 */
static bool proto_bad_in_json(unsigned char c)
{
    return proto_is_ctl(c);
}

void proto_format_tag(struct sbuf *b, const char *tag, size_t len)
{
    sbuf_putc(b, '#');
    proto_put_clean(b, tag, len, proto_bad_in_word, '_');
    sbuf_putc(b, ' ');
}

void proto_format_ok_begin(struct sbuf *b)
{
    sbuf_puts(b, "OK");
}

void proto_format_grant(struct sbuf *b, const struct proto_grant *g)
{
    proto_format_ok_begin(b);
    if (g->nresources > 1)
        proto_format_kv_u64(b, "resources", g->nresources);
    else
        proto_format_kv_str(b, "resource", g->resource);
    proto_format_kv_str(b, "token", g->token);
    proto_format_kv_u64(b, "fence", g->fence);
    proto_format_kv_u64(b, "ttl", g->ttl);
    proto_format_kv_i64(b, "validity", g->validity);
    if (g->shared)
        proto_format_kv_str(b, "mode", "shared");
    if (g->limit) {
        proto_format_kv_u64(b, "limit", g->limit);
        proto_format_kv_u64(b, "slot", g->slot);
    }
    proto_format_end(b);
}

void proto_format_kv_strn(struct sbuf *b, const char *key, const char *val,
                          size_t len)
{
    sbuf_putc(b, ' ');
    proto_put_clean(b, key, strlen(key), proto_bad_in_word, '_');
    sbuf_putc(b, '=');
    if (val)
        proto_put_clean(b, val, len, proto_bad_in_word, '_');
}

void proto_format_kv_str(struct sbuf *b, const char *key, const char *val)
{
    proto_format_kv_strn(b, key, val, val ? strlen(val) : 0);
}

void proto_format_kv_u64(struct sbuf *b, const char *key, uint64_t val)
{
    sbuf_putc(b, ' ');
    proto_put_clean(b, key, strlen(key), proto_bad_in_word, '_');
    sbuf_putc(b, '=');
    sbuf_put_u64(b, val);
}

void proto_format_kv_i64(struct sbuf *b, const char *key, int64_t val)
{
    sbuf_putc(b, ' ');
    proto_put_clean(b, key, strlen(key), proto_bad_in_word, '_');
    sbuf_putc(b, '=');
    if (val < 0)
        sbuf_putc(b, '-');
    /* The magnitude, INT64_MIN's too, in unsigned arithmetic. */
    sbuf_put_u64(b, val < 0 ? 0 - (uint64_t)val : (uint64_t)val);
}

void proto_format_word(struct sbuf *b, const char *word)
{
    sbuf_putc(b, ' ');
    proto_put_clean(b, word, strlen(word), proto_bad_in_word, '_');
}

void proto_format_end(struct sbuf *b)
{
    sbuf_putc(b, '\n');
}

void proto_format_cmd(struct sbuf *b, enum proto_cmd cmd)
{
    const char *word = proto_cmd_name(cmd);

    if (word)
        sbuf_puts(b, word);
}

void proto_format_opt_u64(struct sbuf *b, enum proto_opt opt, uint64_t val)
{
    const char *name = proto_opt_name(opt);

    if (name)
        proto_format_kv_u64(b, name, val);
}

void proto_format_opt_str(struct sbuf *b, enum proto_opt opt,
                          const char *val)
{
    const char *name = proto_opt_name(opt);

    if (name)
        proto_format_kv_str(b, name, val);
}

void proto_format_request(struct sbuf *b, enum proto_cmd cmd,
                          const char *arg)
{
    proto_format_cmd(b, cmd);
    if (arg)
        proto_format_word(b, arg);
    proto_format_end(b);
}

void proto_format_ok(struct sbuf *b)
{
    sbuf_puts(b, "OK\n");
}

void proto_format_ok_json(struct sbuf *b, const char *json)
{
    if (!json)
        json = "{}";
    sbuf_puts(b, "OK ");
    proto_put_clean(b, json, strlen(json), proto_bad_in_json, ' ');
    sbuf_putc(b, '\n');
}

void proto_format_pong(struct sbuf *b, const char *word, size_t len)
{
    sbuf_puts(b, "PONG");
    if (word && len > 0) {
        sbuf_putc(b, ' ');
        proto_put_clean(b, word, len, proto_bad_in_word, '_');
    }
    sbuf_putc(b, '\n');
}

/* msg[0..len) is untrusted text; it is sanitized on the way out. */
static void proto_put_err(struct sbuf *b, enum proto_err code,
                          const char *msg, size_t len)
{
    const char *word = proto_err_word(code);

    /* An out-of-range code is a bug in the caller; still send a valid line. */
    if (!word) {
        code = PROTO_ERR_ARG;
        word = proto_err_word(code);
    }
    if (!msg || len == 0) {
        msg = proto_err_default_msg(code);
        len = strlen(msg);
    }
    sbuf_printf(b, "ERR %s ", word);
    proto_put_clean(b, msg, len, proto_bad_in_msg, '?');
    sbuf_putc(b, '\n');
}

void proto_format_err(struct sbuf *b, enum proto_err code, const char *msg)
{
    proto_put_err(b, code, msg, msg ? strlen(msg) : 0);
}

void proto_format_errf(struct sbuf *b, enum proto_err code, const char *fmt,
                       ...)
{
    struct sbuf msg = SBUF_INIT;
    va_list ap;

    va_start(ap, fmt);
    sbuf_vprintf(&msg, fmt, ap);
    va_end(ap);
    proto_put_err(b, code, msg.data, msg.len);
    sbuf_deinit(&msg);
}

void proto_format_event_lost(struct sbuf *b, const char *resource,
                             uint64_t fence, const char *reason)
{
    sbuf_puts(b, "EVENT LOST");
    proto_format_kv_str(b, "resource", resource);
    proto_format_kv_u64(b, "fence", fence);
    proto_format_kv_str(b, "reason", reason);
    proto_format_end(b);
}

void proto_format_event_holder(struct sbuf *b, const struct proto_holder *h)
{
    sbuf_puts(b, "EVENT HOLDER");
    proto_format_kv_str(b, "resource", h->resource);
    proto_format_kv_u64(b, "held", h->held);
    if (h->foreign) {
        proto_format_kv_u64(b, "foreign", 1);
    } else if (h->mode) {
        proto_format_kv_str(b, "mode", h->mode);
        if (h->limit)
            proto_format_kv_u64(b, "limit", h->limit);
        if (strcmp(h->mode, "exclusive") == 0) {
            proto_format_kv_u64(b, "fence", h->fence);
            proto_format_kv_str(b, "name", h->name);
            proto_format_kv_str(b, "daemon", h->daemon);
            if (h->value && h->value[0])
                proto_format_kv_str(b, "value", h->value);
        }
    }
    proto_format_end(b);
}

void proto_format_event_shutdown(struct sbuf *b)
{
    sbuf_puts(b, "EVENT SHUTDOWN\n");
}

void proto_format_event_closing(struct sbuf *b, const char *reason)
{
    sbuf_puts(b, "EVENT CLOSING");
    proto_format_kv_str(b, "reason", reason);
    proto_format_end(b);
}

void proto_format_usage(struct sbuf *b, enum proto_cmd cmd)
{
    sbuf_puts(b, "OK ");
    sbuf_puts(b, proto_cmd_usage[cmd]);
    sbuf_putc(b, '\n');
}

void proto_format_help(struct sbuf *b)
{
    int i;

    sbuf_puts(b, "OK");
    for (i = PROTO_CMD_NONE + 1; i < PROTO_CMD_COUNT; i++) {
        sbuf_putc(b, ' ');
        sbuf_puts(b, proto_cmd_words[i]);
    }
    sbuf_putc(b, '\n');
}

/* ---- reply parsing (client side) -------------------------------------- */

static void proto_reply_kvs(struct proto_reply *r, char *pos)
{
    char *word, *eq;
    size_t wlen;

    while ((word = proto_next_word(&pos, &wlen))) {
        if (r->nkv == PROTO_REPLY_MAX_KV)
            return;
        eq = memchr(word, '=', wlen);
        r->kv[r->nkv].key = word;
        r->kv[r->nkv].val = "";
        if (eq) {
            *eq = '\0';
            r->kv[r->nkv].val = eq + 1;
        }
        r->nkv++;
    }
}

static int proto_reply_ok(struct proto_reply *r, char *pos)
{
    while (proto_is_sep(*pos))
        pos++;
    r->kind = PROTO_REPLY_OK;
    if (*pos == '{')
        r->text = pos;
    else
        proto_reply_kvs(r, pos);
    return 0;
}

static int proto_reply_pong(struct proto_reply *r, char *pos)
{
    char *word;
    size_t wlen;

    word = proto_next_word(&pos, &wlen);
    if (word && proto_next_word(&pos, &wlen))
        return -1;
    r->kind = PROTO_REPLY_PONG;
    if (word)
        r->text = word;
    return 0;
}

/* "ERR <CODE> message": name is the code word, pos the message. */
static void proto_reply_err(struct proto_reply *r, char *name, char *pos)
{
    while (proto_is_sep(*pos))
        pos++;
    r->kind = PROTO_REPLY_ERR;
    r->err = proto_err_from_word(name, strlen(name));
    r->err_word = name;
    r->text = pos;
}

/* "EVENT <NAME> k=v...". */
static void proto_reply_event(struct proto_reply *r, char *name, char *pos)
{
    r->kind = PROTO_REPLY_EVENT;
    r->text = name;
    proto_reply_kvs(r, pos);
}

/* ERR and EVENT must name something (a code, an event) after their word;
 * fill gets that name (NUL-terminated) and the rest of the line. */
static int proto_reply_named(struct proto_reply *r, char *pos,
                             void (*fill)(struct proto_reply *, char *, char *))
{
    size_t nlen;
    char *name = proto_next_word(&pos, &nlen);

    if (!name)
        return -1;
    fill(r, name, pos);
    return 0;
}

static int proto_reply_dispatch(struct proto_reply *r, char *line)
{
    char *pos = line, *word;
    size_t wlen;

    word = proto_next_word(&pos, &wlen);
    if (!word)
        return -1;
    if (word[0] == '#') {
        if (!proto_valid_tag(word + 1, wlen - 1))
            return -1;
        r->tag = word + 1;
        r->tag_len = wlen - 1;
        word = proto_next_word(&pos, &wlen);
        if (!word || strcmp(word, "EVENT") == 0)
            return -1;
    }
    if (strcmp(word, "OK") == 0)
        return proto_reply_ok(r, pos);
    if (strcmp(word, "PONG") == 0)
        return proto_reply_pong(r, pos);
    if (strcmp(word, "ERR") == 0)
        return proto_reply_named(r, pos, proto_reply_err);
    if (strcmp(word, "EVENT") == 0)
        return proto_reply_named(r, pos, proto_reply_event);
    return -1;
}

static void proto_reply_clear(struct proto_reply *r)
{
    memset(r, 0, sizeof(*r));
    r->kind = PROTO_REPLY_INVALID;
    r->err = PROTO_ERR_NONE;
    r->err_word = "";
    r->text = "";
}

int proto_reply_parse(char *line, size_t len, struct proto_reply *r)
{
    proto_reply_clear(r);
    if (len > 0 && line[len - 1] == '\r')
        len--;
    line[len] = '\0';
    if (proto_has_ctl(line, len) || proto_reply_dispatch(r, line) < 0) {
        proto_reply_clear(r);
        return -1;
    }
    return 0;
}

const char *proto_reply_get(const struct proto_reply *r, const char *key)
{
    size_t i;

    for (i = 0; i < r->nkv; i++) {
        if (strcmp(r->kv[i].key, key) == 0)
            return r->kv[i].val;
    }
    return NULL;
}
