/*
 * label: the holder label, in one home.
 *
 * An exclusive key (a lock, a semaphore slot, each key of a multi-resource
 * grant) that redlockd takes holds "<token> <label> <fence>": the random
 * token that owner checks compare, then a compact JSON object naming the
 * holder, then the grant's fence. Other Redlock clients see a string that
 * starts with the token, which is all they compare; STATUS and ADOPT on any
 * daemon of the same nodes read the rest. The label is
 *
 *   {"daemon":"<id>","session":"<id>"[,"name":"<client name>"]
 *    [,"value":"<holder's value>"][,"limit":K]}
 *
 * compact (no space: the value splits at its first and last space; a
 * holder's value= is visible ASCII), with "limit" last (a semaphore
 * slot's size, which ADOPT finds there: lua/adopt_one.lua matches that
 * one pattern, ',"limit":(%d+)}' before the fence) and "value" last on an
 * exclusive lock's key (lua/lib/value_of.lua carries it over an ADOPT:
 * the first ',"value":"' of a label is that field's, as a '"' inside a
 * JSON string is always escaped). This module writes it, splits a value into its parts and reads
 * a label back; it is pure (no I/O), and unit-tested
 * (tests/unit/test_label.c).
 */
#ifndef REDLOCKD_LABEL_H
#define REDLOCKD_LABEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* What a label says. Strings are visible ASCII (the config's id, session
 * ids, proto's client names); name may be NULL or "". */
struct label {
    const char *daemon;
    const char *session;
    const char *name;
    const char *value;              /* the holder's value=, or NULL */
    uint32_t limit;                 /* a semaphore slot's K, or 0 */
};

/* Write l's label and a NUL to out unless out is NULL; returns its length
 * (without the NUL), so a first call with NULL sizes the buffer. */
size_t label_write(const struct label *l, char *out);

/* A key's value, len bytes at v (NUL-terminated), split in place:
 * "token label fence" with a 32-hex token and a decimal fence is
 * redlockd's, and gives true with *label and *fence set (v then holds the
 * token alone); anything else is all token (false). */
bool label_split(char *v, size_t len, const char **label, uint64_t *fence);

/* The holder's value from a label's value field as lua/lib/value_of.lua
 * returns it (',"value":"<escaped>"'): malloc'd, or NULL when the field is
 * empty or malformed. */
char *label_value_of(const char *field, size_t len);

/* The holder a label names, as STATUS shows it: its JSON object (daemon,
 * session and, when given, name, value and limit), or NULL when the text is no
 * redlockd label (a foreign client's value). The caller decrefs. */
json_t *label_holder(const char *label);

#endif
