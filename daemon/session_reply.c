/*
 * session, an answer's line (session_priv.h): one line each, the
 * request's "#<tag> " first, formatted with proto's formatters into the
 * buffer the session's connection hands out (conn_reply), which leaves in
 * one write at the end of the loop turn. Every ERR is counted by its code
 * here, as every request line is by its command (struct
 * session_counters): what the sessions count, in one place.
 *
 * The bottom of the command files: it calls none of them.
 */
#include "session_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "conn.h"
#include "wording.h"

/* Room for the nodes' own explanation in an ERR UNAVAILABLE line. */
#define SESSION_WHY_SIZE 512

/* What the sessions count (session.h). */
static struct session_counters counters;

struct sbuf *session_say(const struct session_to *t)
{
    struct sbuf *b = t->s->conn ? conn_reply(t->s->conn) : NULL;

    if (b && t->tag)
        proto_format_tag(b, t->tag, t->tag_len);
    return b;
}

/* The cells a command and an error code are counted in: "other" (the
 * NONE cell) for a value outside the table. */
static size_t command_cell(enum proto_cmd cmd)
{
    return (int)cmd > PROTO_CMD_NONE && cmd < PROTO_CMD_COUNT
           ? (size_t)cmd : PROTO_CMD_NONE;
}

static size_t error_cell(enum proto_err code)
{
    return (int)code > PROTO_ERR_NONE && code < PROTO_ERR_COUNT
           ? (size_t)code : PROTO_ERR_NONE;
}

void session_say_err(const struct session_to *t, enum proto_err code,
                     const char *msg)
{
    struct sbuf *b = session_say(t);

    counters.errors[error_cell(code)]++;
    if (b)
        proto_format_err(b, code, msg);
}

void session_say_errf(const struct session_to *t, enum proto_err code,
                      const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + SESSION_WHY_SIZE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    session_say_err(t, code, msg);
}

void session_say_refusal(const struct session_to *t, enum proto_cmd cmd,
                         const struct lockmgr_refusal *no)
{
    char msg[PROTO_MAX_ERRMSG + SESSION_WHY_SIZE];

    session_say_err(t, wording_refusal(cmd, no, msg, sizeof(msg)), msg);
}

void session_say_ok(const struct session_to *t)
{
    struct sbuf *b = session_say(t);

    if (b)
        proto_format_ok(b);
}

void session_say_json(const struct session_to *t, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    struct sbuf *b;

    json_decref(j);
    if (!text) {
        session_say_err(t, PROTO_ERR_LIMIT,
                        "out of memory building the reply");
        return;
    }
    if ((b = session_say(t)))
        proto_format_ok_json(b, text);
    free(text);
}

/* ---- counting ------------------------------------------------------------ */

void session_count_command(enum proto_cmd cmd)
{
    counters.commands[command_cell(cmd)]++;
}

const struct session_counters *session_counters(void)
{
    return &counters;
}
