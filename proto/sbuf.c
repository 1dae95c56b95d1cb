/*
 * sbuf: a small growable byte buffer (see sbuf.h).
 *
 * The data is kept NUL-terminated whenever memory is allocated, so a reply
 * line can be logged or compared as a C string without a copy. Growth
 * doubles the capacity; allocation failure aborts because a lock server
 * that cannot build a reply line cannot make progress anyway.
 */
#include "sbuf.h"

#include "num.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SBUF_MIN_CAP 64

static void sbuf_oom(size_t want)
{
    fprintf(stderr, "redlockd: out of memory (sbuf of %zu bytes)\n", want);
    abort();
}

void sbuf_init(struct sbuf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void sbuf_deinit(struct sbuf *b)
{
    free(b->data);
    sbuf_init(b);
}

void sbuf_reset(struct sbuf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

/* Room for `extra` more bytes plus the terminating NUL; 0 or -1. */
int sbuf_try_reserve(struct sbuf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (extra > SIZE_MAX - b->len - 1)
        return -1;
    need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : SBUF_MIN_CAP;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

void sbuf_reserve(struct sbuf *b, size_t extra)
{
    if (sbuf_try_reserve(b, extra) < 0)
        sbuf_oom(b->len + extra);
}

void sbuf_append(struct sbuf *b, const void *p, size_t n)
{
    sbuf_reserve(b, n);
    if (n > 0)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sbuf_puts(struct sbuf *b, const char *s)
{
    sbuf_append(b, s, strlen(s));
}

void sbuf_putc(struct sbuf *b, char c)
{
    sbuf_append(b, &c, 1);
}

void sbuf_put_u64(struct sbuf *b, uint64_t v)
{
    char digits[PROTO_U64_DIGITS];
    sbuf_append(b, digits, (size_t)(proto_write_u64(digits, v) - digits));
}

void sbuf_vprintf(struct sbuf *b, const char *fmt, va_list ap)
{
    va_list cp;
    size_t room;
    int n;

    sbuf_reserve(b, 0);
    room = b->cap - b->len;
    va_copy(cp, ap);
    n = vsnprintf(b->data + b->len, room, fmt, cp);
    va_end(cp);
    if (n < 0) {
        /* Only an invalid format gets here; leave the buffer unchanged. */
        b->data[b->len] = '\0';
        return;
    }
    if ((size_t)n >= room) {
        sbuf_reserve(b, (size_t)n);
        va_copy(cp, ap);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, cp);
        va_end(cp);
    }
    b->len += (size_t)n;
}

void sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    sbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

void sbuf_consume(struct sbuf *b, size_t n)
{
    if (n >= b->len) {
        sbuf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

const char *sbuf_cstr(struct sbuf *b)
{
    if (!b->data)
        return "";
    b->data[b->len] = '\0';
    return b->data;
}
