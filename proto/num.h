/*
 * num: the strict number readers shared by the request parser, the config
 * loader and the client library.
 *
 * Every reader takes s[0..len) (no NUL needed; a NUL inside is just a bad
 * byte), accepts digits of its base only (no sign unless it says so, no
 * spaces, no "0x", no trailing garbage), rejects overflow, returns 0 or -1,
 * and leaves *out untouched on failure. A reader also caps the number of
 * digits at what its largest value needs, so "00000000001" is not a u32
 * (the wire protocol has always read numbers this way).
 */
#ifndef REDLOCKD_NUM_H
#define REDLOCKD_NUM_H

#include <stddef.h>
#include <stdint.h>

/* Decimal 0..4294967295, at most 10 digits. */
int proto_parse_u32(const char *s, size_t len, uint32_t *out);
/* Decimal 0..18446744073709551615, at most 20 digits. */
int proto_parse_u64(const char *s, size_t len, uint64_t *out);
/* Decimal with an optional leading '-' (never '+'), INT64_MIN..INT64_MAX.
 * Only for numbers a daemon writes (validity=); requests take no sign. */
int proto_parse_i64(const char *s, size_t len, int64_t *out);
/* Decimal in [min, max], at most 20 digits. */
int proto_parse_range(const char *s, size_t len, uint64_t min, uint64_t max,
                      uint64_t *out);
/* A TCP port: decimal 1..65535, at most 5 digits ("07390" is 7390). */
int proto_parse_port(const char *s, size_t len, uint16_t *out);
/* Octal digits only, 0..037777777777, at most 11 digits (file modes). */
int proto_parse_octal(const char *s, size_t len, uint32_t *out);

/*
 * Durations, in milliseconds, 0..4294967295 (the protocol's ttl=, wait=,
 * keepalive=, detach=; redlockctl's --ttl, --wait, ...):
 *
 *     duration = digits                       bare: milliseconds, as always
 *              | digits [ "." digits ] unit   unit: ms, s, m or h
 *
 * "30000", "30s", "500ms", "2m", "1.5s", "0.5h". At most 10 digits before
 * the point and 9 after it; a fraction needs a unit and must come to whole
 * milliseconds ("1.5ms" and "0.0001s" do not). Units are lower-case. No
 * sign, no spaces, no exponent. Returns PROTO_DUR_OK and sets *ms, or why
 * not (proto_dur_why) and leaves *ms untouched.
 */
enum proto_dur {
    PROTO_DUR_OK = 0,
    PROTO_DUR_EMPTY,        /* no digits before the unit: "", "s", ".5s" */
    PROTO_DUR_SIGN,         /* "-1", "+1s" */
    PROTO_DUR_SYNTAX,       /* "1.", "1.5" (no unit), "1..5s", too many
                               digits after the point */
    PROTO_DUR_UNIT,         /* an unknown unit: "5d", "5S", "5sec" */
    PROTO_DUR_PARTIAL,      /* not whole milliseconds: "1.5ms", "0.0001s" */
    PROTO_DUR_RANGE,        /* above 4294967295 ms, or over 10 digits */
};
#define PROTO_DURATION_MAX_MS 4294967295u
enum proto_dur proto_parse_duration(const char *s, size_t len, uint32_t *ms);
/* What was wrong, for a message: "has no number", "has an unknown unit
 * (use ms, s, m or h)", ... */
const char *proto_dur_why(enum proto_dur e);

/* The other way, for the hot paths (replies, Redis commands) where printf
 * showed in profiles: v in decimal at p, at most PROTO_U64_DIGITS bytes,
 * no NUL. Returns the end of the digits. */
#define PROTO_U64_DIGITS 20
char *proto_write_u64(char *p, uint64_t v);

#endif
