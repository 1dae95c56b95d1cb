/*
 * num: strict number readers (see num.h).
 *
 * One digit loop serves every reader; the public functions only choose the
 * base, the digit cap and the largest value. Keeping them in one place is
 * what makes "a number" mean the same thing on the wire, in the config
 * file and in the client library.
 */
#include "num.h"

#include <stdbool.h>
#include <string.h>

#define NUM_U16_DIGITS 5
#define NUM_U32_DIGITS 10
#define NUM_U64_DIGITS 20
#define NUM_U32_OCTAL_DIGITS 11

static bool num_digit(char c, unsigned base, unsigned *d)
{
    if (c < '0' || c > '9' || (unsigned)(c - '0') >= base)
        return false;
    *d = (unsigned)(c - '0');
    return true;
}

/* s[0..len): 1..maxdigits digits of base, value at most max. */
static int num_read(const char *s, size_t len, unsigned base,
                    size_t maxdigits, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    unsigned d;
    size_t i;

    if (!s || len == 0 || len > maxdigits)
        return -1;
    for (i = 0; i < len; i++) {
        if (!num_digit(s[i], base, &d) || v > (max - d) / base)
            return -1;
        v = v * base + d;
    }
    *out = v;
    return 0;
}

/* num_read into a uint32_t. */
static int num_read_u32(const char *s, size_t len, unsigned base,
                        size_t maxdigits, uint32_t *out)
{
    uint64_t v;

    if (num_read(s, len, base, maxdigits, UINT32_MAX, &v) < 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int proto_parse_u32(const char *s, size_t len, uint32_t *out)
{
    return num_read_u32(s, len, 10, NUM_U32_DIGITS, out);
}

int proto_parse_u64(const char *s, size_t len, uint64_t *out)
{
    return num_read(s, len, 10, NUM_U64_DIGITS, UINT64_MAX, out);
}

int proto_parse_i64(const char *s, size_t len, int64_t *out)
{
    bool neg = s && len > 0 && s[0] == '-';
    /* INT64_MIN's magnitude is one more than INT64_MAX. */
    uint64_t max = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t v;

    if (neg) {
        s++;
        len--;
    }
    if (num_read(s, len, 10, NUM_U64_DIGITS, max, &v) < 0)
        return -1;
    if (!neg)
        *out = (int64_t)v;
    else if (v == (uint64_t)INT64_MAX + 1)
        *out = INT64_MIN;
    else
        *out = -(int64_t)v;
    return 0;
}

int proto_parse_range(const char *s, size_t len, uint64_t min, uint64_t max,
                      uint64_t *out)
{
    uint64_t v;

    if (num_read(s, len, 10, NUM_U64_DIGITS, max, &v) < 0 || v < min)
        return -1;
    *out = v;
    return 0;
}

int proto_parse_port(const char *s, size_t len, uint16_t *out)
{
    uint64_t v;

    if (num_read(s, len, 10, NUM_U16_DIGITS, UINT16_MAX, &v) < 0 || v == 0)
        return -1;
    *out = (uint16_t)v;
    return 0;
}

int proto_parse_octal(const char *s, size_t len, uint32_t *out)
{
    return num_read_u32(s, len, 8, NUM_U32_OCTAL_DIGITS, out);
}

/* ---- durations ---------------------------------------------------------- */

#define NUM_DUR_FRACTION_DIGITS 9

static const struct {
    const char *name;
    uint32_t ms;
} num_units[] = {
    { "ms", 1 },
    { "s", 1000 },
    { "m", 60 * 1000 },
    { "h", 60 * 60 * 1000 },
};

/* Digits at s[*i..len), at most max of them, into *v; how many. */
static size_t num_digits(const char *s, size_t len, size_t *i, size_t max,
                         uint64_t *v)
{
    size_t n = 0;

    *v = 0;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
        if (n < max)
            *v = *v * 10 + (uint64_t)(s[*i] - '0');
        n++;
        (*i)++;
    }
    return n;
}

enum proto_dur proto_parse_duration(const char *s, size_t len, uint32_t *ms)
{
    uint64_t whole, frac = 0, scale = 1, mult, v;
    size_t i = 0, nwhole, nfrac = 0, u;

    if (!s || len == 0)
        return PROTO_DUR_EMPTY;
    if (s[0] == '-' || s[0] == '+')
        return PROTO_DUR_SIGN;
    nwhole = num_digits(s, len, &i, NUM_U32_DIGITS, &whole);
    if (i < len && s[i] == '.') {
        i++;
        nfrac = num_digits(s, len, &i, NUM_DUR_FRACTION_DIGITS, &frac);
        if (nfrac == 0 || nfrac > NUM_DUR_FRACTION_DIGITS)
            return nwhole == 0 ? PROTO_DUR_EMPTY : PROTO_DUR_SYNTAX;
        for (u = 0; u < nfrac; u++)
            scale *= 10;
    }
    if (nwhole == 0)
        return PROTO_DUR_EMPTY;
    if (nwhole > NUM_U32_DIGITS)
        return PROTO_DUR_RANGE;
    if (i == len) {
        /* Bare: milliseconds, whole ones only. */
        if (nfrac > 0)
            return PROTO_DUR_SYNTAX;
        mult = 1;
    } else {
        for (u = 0; u < sizeof(num_units) / sizeof(num_units[0]); u++)
            if (strlen(num_units[u].name) == len - i
                && memcmp(num_units[u].name, s + i, len - i) == 0)
                break;
        if (u == sizeof(num_units) / sizeof(num_units[0]))
            return s[i] == '.' ? PROTO_DUR_SYNTAX : PROTO_DUR_UNIT;
        mult = num_units[u].ms;
    }
    /* whole < 10^10 and frac < 10^9, mult <= 3.6e6: no overflow in 64 bits. */
    if (frac * mult % scale != 0)
        return PROTO_DUR_PARTIAL;
    v = whole * mult + frac * mult / scale;
    if (v > PROTO_DURATION_MAX_MS)
        return PROTO_DUR_RANGE;
    *ms = (uint32_t)v;
    return PROTO_DUR_OK;
}

const char *proto_dur_why(enum proto_dur e)
{
    switch (e) {
    case PROTO_DUR_OK: return "is fine";
    case PROTO_DUR_EMPTY: return "has no number";
    case PROTO_DUR_SIGN: return "has a sign (durations are never negative)";
    case PROTO_DUR_SYNTAX: return "is not a number (a fraction needs a unit)";
    case PROTO_DUR_UNIT: return "has an unknown unit (use ms, s, m or h)";
    case PROTO_DUR_PARTIAL: return "is not a whole number of milliseconds";
    case PROTO_DUR_RANGE: return "is more than 4294967295 ms";
    }
    return "is not a duration";
}

char *proto_write_u64(char *p, uint64_t v)
{
    char tmp[PROTO_U64_DIGITS];
    size_t n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}
