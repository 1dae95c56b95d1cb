/*
 * libFuzzer target for proto/: every input is treated as a request line, as
 * a reply line, as untrusted text echoed in replies, and as a duration.
 *
 * Besides the sanitizers' memory checks, it asserts the properties the
 * daemon and the client rely on: a parsed request only holds validated
 * fields that point into the line, error messages are short and printable,
 * and whatever goes into a formatter comes out as exactly one line that the
 * reply parser reads back.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "proto.h"

static char *fuzz_copy(const uint8_t *data, size_t size)
{
    char *p = malloc(size + 1);

    FUZZ_CHECK(p);
    if (size > 0)
        memcpy(p, data, size);
    p[size] = '\0';
    return p;
}

static bool fuzz_printable(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return false;
    }
    return true;
}

/* Exactly one LF, at the end, and no other control byte. */
static void fuzz_check_line(const struct sbuf *b)
{
    size_t i;

    FUZZ_CHECK(b->len > 0 && b->data[b->len - 1] == '\n');
    for (i = 0; i + 1 < b->len; i++) {
        unsigned char c = (unsigned char)b->data[i];
        FUZZ_CHECK(c >= 0x20 && c != 0x7f);
    }
}

static void fuzz_check_request(const char *line, size_t size,
                               const struct proto_limits *lim,
                               const struct proto_request *req)
{
    FUZZ_CHECK(req->cmd > PROTO_CMD_NONE && req->cmd < PROTO_CMD_COUNT);
    if (req->arg) {
        FUZZ_CHECK(req->arg >= line && req->arg + req->arg_len <= line + size);
        FUZZ_CHECK(strlen(req->arg) == req->arg_len);
    }
    if (req->cmd == PROTO_CMD_LOCK || req->cmd == PROTO_CMD_UNLOCK
        || req->cmd == PROTO_CMD_EXTEND || req->cmd == PROTO_CMD_STATUS)
        FUZZ_CHECK(proto_valid_resource(req->arg, req->arg_len, lim));
    if (req->cmd == PROTO_CMD_LOCK || req->cmd == PROTO_CMD_UNLOCK) {
        /* Several names: each valid, inside the line, none twice. */
        FUZZ_CHECK(req->nargs >= 1 && req->nargs <= PROTO_MAX_RESOURCES);
        FUZZ_CHECK(req->args[0] == req->arg);
        for (size_t i = 0; i < req->nargs; i++) {
            FUZZ_CHECK(req->args[i] >= line &&
                       req->args[i] + req->args_len[i] <= line + size);
            FUZZ_CHECK(proto_valid_resource(req->args[i], req->args_len[i],
                                            lim));
            for (size_t j = 0; j < i; j++)
                FUZZ_CHECK(req->args_len[i] != req->args_len[j] ||
                           memcmp(req->args[i], req->args[j],
                                  req->args_len[i]) != 0);
        }
    }
    if (req->has & PROTO_OPT_LIMIT)
        FUZZ_CHECK(req->limit >= 1);
    if (req->cmd == PROTO_CMD_EXTEND)
        FUZZ_CHECK(req->has & PROTO_OPT_TTL);
    if (req->has & PROTO_OPT_TTL)
        FUZZ_CHECK(req->ttl >= 1);
    if (req->has & PROTO_OPT_PROTO)
        FUZZ_CHECK(req->proto == PROTO_VERSION);
    if (req->name)
        FUZZ_CHECK(req->name_len >= 1 && req->name_len <= PROTO_MAX_NAME_LEN
                   && fuzz_printable(req->name, req->name_len));
}

/* A tag read (also on an error after it): a valid one, inside the line,
 * right after its '#'; its reply's "#<tag> " reads back as the same tag. */
static void fuzz_check_tag(const char *line, size_t size,
                           const struct proto_request *req)
{
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;

    if (!req->tag)
        return;
    FUZZ_CHECK(req->tag > line && req->tag + req->tag_len <= line + size);
    FUZZ_CHECK(req->tag[-1] == '#');
    FUZZ_CHECK(proto_valid_tag(req->tag, req->tag_len));
    proto_format_tag(&b, req->tag, req->tag_len);
    sbuf_puts(&b, "PONG\n");
    fuzz_check_line(&b);
    FUZZ_CHECK(proto_reply_parse(b.data, b.len - 1, &r) == 0);
    FUZZ_CHECK(r.kind == PROTO_REPLY_PONG && r.tag_len == req->tag_len);
    sbuf_deinit(&b);
}

static void fuzz_parse_request(const uint8_t *data, size_t size)
{
    struct proto_limits lim = PROTO_LIMITS_DEFAULT;
    struct proto_request req;
    struct proto_error err;
    struct sbuf b = SBUF_INIT;
    char *line = fuzz_copy(data, size);
    size_t n;

    switch (proto_parse(line, size, &lim, &req, &err)) {
    case PROTO_PARSE_OK:
        fuzz_check_request(line, size, &lim, &req);
        fuzz_check_tag(line, size, &req);
        /* Echoing a PING word must stay one line. */
        proto_format_pong(&b, req.arg, req.arg_len);
        fuzz_check_line(&b);
        break;
    case PROTO_PARSE_EMPTY:
        break;
    case PROTO_PARSE_ERROR:
        FUZZ_CHECK(err.code == PROTO_ERR_ARG || err.code == PROTO_ERR_UNKNOWN);
        n = strlen(err.msg);
        FUZZ_CHECK(n > 0 && n < PROTO_MAX_ERRMSG);
        FUZZ_CHECK(fuzz_printable(err.msg, n));
        proto_format_err(&b, err.code, err.msg);
        fuzz_check_line(&b);
        fuzz_check_tag(line, size, &req);
        break;
    default:
        FUZZ_CHECK(!"unexpected parse status");
    }
    sbuf_deinit(&b);
    free(line);
}

static void fuzz_parse_reply(const uint8_t *data, size_t size)
{
    struct proto_reply r;
    char *line = fuzz_copy(data, size);
    size_t i;

    if (proto_reply_parse(line, size, &r) == 0) {
        FUZZ_CHECK(r.kind != PROTO_REPLY_INVALID);
        FUZZ_CHECK(r.text && r.err_word);
        FUZZ_CHECK(r.nkv <= PROTO_REPLY_MAX_KV);
        for (i = 0; i < r.nkv; i++)
            FUZZ_CHECK(proto_reply_get(&r, r.kv[i].key));
        if (r.tag)
            FUZZ_CHECK(r.kind != PROTO_REPLY_EVENT
                       && proto_valid_tag(r.tag, r.tag_len));
    } else {
        FUZZ_CHECK(r.kind == PROTO_REPLY_INVALID);
    }
    free(line);
}

/* Untrusted text through the formatters, then back through the parser. */
static void fuzz_format(const uint8_t *data, size_t size)
{
    struct sbuf b = SBUF_INIT;
    struct proto_reply r;
    char *text = fuzz_copy(data, size);

    proto_format_err(&b, PROTO_ERR_ARG, text);
    fuzz_check_line(&b);
    FUZZ_CHECK(proto_reply_parse(b.data, b.len - 1, &r) == 0);
    FUZZ_CHECK(r.kind == PROTO_REPLY_ERR && r.err == PROTO_ERR_ARG);

    sbuf_reset(&b);
    proto_format_ok_begin(&b);
    proto_format_kv_strn(&b, "v", text, size);
    proto_format_end(&b);
    fuzz_check_line(&b);
    FUZZ_CHECK(proto_reply_parse(b.data, b.len - 1, &r) == 0);
    FUZZ_CHECK(r.kind == PROTO_REPLY_OK && r.nkv == 1);
    /* Sanitizing replaces bytes one for one, so the value keeps its length. */
    FUZZ_CHECK(strcmp(r.kv[0].key, "v") == 0 && strlen(r.kv[0].val) == size);

    sbuf_reset(&b);
    proto_format_ok_json(&b, text);
    fuzz_check_line(&b);
    sbuf_deinit(&b);
    free(text);
}

/* The whole input as a duration: whatever it is, a number without a unit
 * means what the u32 reader says, and a value taken is written back as
 * its milliseconds and read again the same. */
static void fuzz_duration(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    char back[PROTO_U64_DIGITS + 1];
    uint32_t ms = 0, again = 1, u = 0;
    enum proto_dur e = proto_parse_duration(s, size, &ms);
    size_t digits = 0;

    FUZZ_CHECK(proto_dur_why(e) != NULL);
    while (digits < size && s[digits] >= '0' && s[digits] <= '9')
        digits++;
    if (digits == size && size > 0) {
        int rc = proto_parse_u32(s, size, &u);

        FUZZ_CHECK((rc == 0) == (e == PROTO_DUR_OK));
        FUZZ_CHECK(rc < 0 || u == ms);
    }
    if (e != PROTO_DUR_OK)
        return;
    *proto_write_u64(back, ms) = '\0';
    FUZZ_CHECK(proto_parse_duration(back, strlen(back), &again)
               == PROTO_DUR_OK && again == ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_duration(data, size);
    fuzz_parse_request(data, size);
    fuzz_parse_reply(data, size);
    fuzz_format(data, size);
    return 0;
}
