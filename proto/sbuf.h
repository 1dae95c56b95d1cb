/*
 * sbuf: a small growable byte buffer.
 *
 * Reply lines are built into an sbuf by the proto_format_* functions and
 * then handed to the connection's output queue. Allocation failure aborts
 * the process (as Redis does): a lock server that cannot allocate a reply
 * line cannot do anything useful. A library that must not abort (the
 * client) reserves its largest line once with sbuf_try_reserve, so later
 * appends within that size never allocate.
 */
#ifndef REDLOCKD_SBUF_H
#define REDLOCKD_SBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

struct sbuf {
    char *data;     /* NUL-terminated when len > 0 or after sbuf_cstr() */
    size_t len;
    size_t cap;
};

#define SBUF_INIT { NULL, 0, 0 }

void sbuf_init(struct sbuf *b);
void sbuf_deinit(struct sbuf *b);
void sbuf_reset(struct sbuf *b);               /* len = 0, keeps memory */
void sbuf_reserve(struct sbuf *b, size_t extra);
/* As sbuf_reserve, but -1 instead of aborting when memory runs out. */
int sbuf_try_reserve(struct sbuf *b, size_t extra);
void sbuf_append(struct sbuf *b, const void *p, size_t n);
void sbuf_puts(struct sbuf *b, const char *s);
void sbuf_putc(struct sbuf *b, char c);
void sbuf_put_u64(struct sbuf *b, uint64_t v);     /* decimal */
void sbuf_printf(struct sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void sbuf_vprintf(struct sbuf *b, const char *fmt, va_list ap);
void sbuf_consume(struct sbuf *b, size_t n);   /* drop n bytes from the front */
const char *sbuf_cstr(struct sbuf *b);         /* "" for an empty buffer */

#endif
