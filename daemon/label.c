/*
 * label: see label.h.
 */
#include "label.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "num.h"

/* The length of a token in a value: 128 random bits in lower-case hex. */
#define LABEL_TOKEN_LEN 32

/* s as the inside of a JSON string at out + at (when out is not NULL);
 * returns the new end. A label's strings are visible ASCII, so '"' and
 * '\\' are all there is to escape; anything below ' ' is dropped, never
 * stored. */
static size_t put_str(char *out, size_t at, const char *s)
{
    for (; s && *s; s++) {
        if ((unsigned char)*s < ' ')
            continue;
        if (*s == '"' || *s == '\\') {
            if (out)
                out[at] = '\\';
            at++;
        }
        if (out)
            out[at] = *s;
        at++;
    }
    return at;
}

static size_t put_lit(char *out, size_t at, const char *lit)
{
    size_t n = strlen(lit);

    if (out)
        memcpy(out + at, lit, n);
    return at + n;
}

size_t label_write(const struct label *l, char *out)
{
    size_t at = put_lit(out, 0, "{\"daemon\":\"");

    at = put_str(out, at, l->daemon ? l->daemon : "");
    at = put_lit(out, at, "\",\"session\":\"");
    at = put_str(out, at, l->session);
    if (l->name && l->name[0]) {
        at = put_lit(out, at, "\",\"name\":\"");
        at = put_str(out, at, l->name);
    }
    if (l->value && l->value[0]) {
        at = put_lit(out, at, "\",\"value\":\"");
        at = put_str(out, at, l->value);
    }
    at = put_lit(out, at, "\"");
    if (l->limit) {
        char num[sizeof(",\"limit\":4294967295")];
        snprintf(num, sizeof(num), ",\"limit\":%" PRIu32, l->limit);
        at = put_lit(out, at, num);
    }
    at = put_lit(out, at, "}");
    if (out)
        out[at] = '\0';
    return at;
}

bool label_split(char *v, size_t len, const char **label, uint64_t *fence)
{
    char *sp = memrchr(v, ' ', len);
    uint64_t f;

    if (len < LABEL_TOKEN_LEN + 4 || v[LABEL_TOKEN_LEN] != ' ' || !sp ||
        sp <= v + LABEL_TOKEN_LEN + 1 ||
        strspn(v, "0123456789abcdef") != LABEL_TOKEN_LEN ||
        proto_parse_u64(sp + 1, (size_t)(v + len - sp - 1), &f) != 0)
        return false;
    v[LABEL_TOKEN_LEN] = '\0';
    *sp = '\0';
    *label = v + LABEL_TOKEN_LEN + 1;
    *fence = f;
    return true;
}

char *label_value_of(const char *field, size_t len)
{
    static const char head[] = ",\"value\":\"";
    size_t hlen = sizeof(head) - 1, n = 0;
    char *out;

    if (len <= hlen + 1 || memcmp(field, head, hlen) != 0 ||
        field[len - 1] != '"')
        return NULL;
    out = malloc(len);
    if (!out)
        return NULL;
    for (size_t i = hlen; i < len - 1; i++) {
        if (field[i] == '\\' && i + 1 < len - 1)
            i++;
        out[n++] = field[i];
    }
    out[n] = '\0';
    return out;
}

json_t *label_holder(const char *label)
{
    json_t *h = label ? json_loads(label, 0, NULL) : NULL;

    if (!json_is_object(h) ||
        !json_is_string(json_object_get(h, "daemon")) ||
        !json_is_string(json_object_get(h, "session"))) {
        json_decref(h);
        return NULL;
    }
    return h;
}
