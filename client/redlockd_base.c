/*
 * libredlockd, the ground floor: what every file of the library uses, and
 * which calls nothing of it: the one formatter of error messages and the
 * word and text of every public code (proto's table for the daemon's
 * codes), the monotonic clock and deadlines, the poll() wait that keeps
 * them, and small readers (quoting untrusted text for a message, visible
 * words). redlockd_priv.h says where this stands among the others.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "redlockd_priv.h"

/* ---- errors ------------------------------------------------------------- */

/* The one formatter of error messages; e may be NULL. */
int rl_seterr(struct redlockd_error *e, int code, const char *fmt, ...)
{
    va_list ap;

    if (e) {
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
    }
    return -code;
}

/*
 * The word and the description of every public code. The daemon's come
 * from proto's table; the library's own are named after their enum
 * suffix, so neither can drift from the enum.
 */
struct rl_code_text {
    const char *name;
    const char *msg;
};

#define RL_OWN_CODE(suffix, msg) [REDLOCKD_E_##suffix] = { #suffix, msg }

static const struct rl_code_text rl_code_texts[REDLOCKD_CODE_COUNT] = {
    [REDLOCKD_OK] = { "OK", "success" },
#define X(name, word, msg) [REDLOCKD_E_##name] = { word, msg },
    PROTO_ERRORS(X)
#undef X
    RL_OWN_CODE(OTHER, "the daemon answered with an unknown code"),
    RL_OWN_CODE(IO, "connection error"),
    RL_OWN_CODE(IO_TIMEOUT, "timed out talking to the daemon"),
    RL_OWN_CODE(CLOSED, "the connection to the daemon is closed"),
    RL_OWN_CODE(PROTO, "unexpected data from the daemon"),
    RL_OWN_CODE(NOMEM, "out of memory"),
    RL_OWN_CODE(INVALID, "invalid argument"),
};

/* The entry of a code, either sign; NULL for none. */
static const struct rl_code_text *rl_code_text(int code)
{
    if (code < 0)
        code = -code;
    if (code >= REDLOCKD_CODE_COUNT || !rl_code_texts[code].name)
        return NULL;
    return &rl_code_texts[code];
}

const char *redlockd_strerror(int code)
{
    const struct rl_code_text *t = rl_code_text(code);

    return t ? t->msg : "unknown error code";
}

const char *redlockd_code_name(int code)
{
    const struct rl_code_text *t = rl_code_text(code);

    return t ? t->name : "?";
}

/* ---- small readers and clocks ------------------------------------------- */

/* The length of a reply value that may be missing (NULL): proto's number
 * readers reject NULL, so a missing key reads as a malformed number. */
size_t rl_len(const char *s)
{
    return s ? strlen(s) : 0;
}

/* 1..max bytes of visible ASCII: client names and passwords. */
int rl_visible_word(const char *s, size_t max)
{
    size_t len;

    if (!s)
        return 0;
    len = strlen(s);
    if (len == 0 || len > max)
        return 0;
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
            return 0;
    }
    return 1;
}

/* The start of untrusted text, printable, for an error message. */
void rl_quote(char *dst, size_t sz, const char *line, size_t len)
{
    size_t i, n = len < sz - 1 ? len : sz - 1;

    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)line[i];
        dst[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    dst[n] = '\0';
}

int64_t rl_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1: no deadline. */
int64_t rl_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : rl_now_ms() + timeout_ms;
}

int64_t rl_earlier(int64_t a, int64_t b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

int rl_remaining(int64_t deadline)
{
    int64_t left;

    if (deadline < 0)
        return -1;
    left = deadline - rl_now_ms();
    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* 1 ready, 0 deadline passed, -1 poll failed (errno). */
int rl_wait(int fd, short events, int64_t deadline)
{
    struct pollfd p;
    int n;

    for (;;) {
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        n = poll(&p, 1, rl_remaining(deadline));
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}
