/*
 * redlockctl, output: rows of text cells printed as aligned columns, and
 * the daemon's JSON members as text (scalars, durations, a session with
 * its client name) for the tables of the inspection commands and top.
 */
#include <err.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include <jansson.h>

#include "ctl.h"

/* ---- tables ------------------------------------------------------------- */

void ctl_table_add(struct ctl_table *t, const char *const *row)
{
    char **grown;
    size_t i;

    grown = realloc(t->cells, (t->nrows + 1) * t->ncols * sizeof(*grown));
    if (!grown)
        errx(EX_OSERR, "out of memory");
    t->cells = grown;
    for (i = 0; i < t->ncols; i++) {
        char **cell = &t->cells[t->nrows * t->ncols + i];

        *cell = strdup(row[i] ? row[i] : "-");
        if (!*cell)
            errx(EX_OSERR, "out of memory");
    }
    t->nrows++;
}

void ctl_table_fprint(FILE *out, struct ctl_table *t)
{
    size_t w[CTL_TABLE_COLS] = { 0 }, r, i, len;
    const char *cell;

    for (r = 0; r < t->nrows; r++) {
        for (i = 0; i < t->ncols; i++) {
            len = strlen(t->cells[r * t->ncols + i]);
            w[i] = len > w[i] ? len : w[i];
        }
    }
    for (r = 0; r < t->nrows; r++) {
        /* No trailing blanks: a row ends at its last non-empty cell. */
        size_t last = t->ncols;

        while (last > 1 && t->cells[r * t->ncols + last - 1][0] == '\0')
            last--;
        for (i = 0; i < last; i++) {
            cell = t->cells[r * t->ncols + i];
            if (i + 1 == last && !(t->right & (1u << i)))
                fprintf(out, "%s", cell);
            else if (t->right & (1u << i))
                fprintf(out, "%*s", (int)w[i], cell);
            else
                fprintf(out, "%-*s", (int)w[i], cell);
            fputs(i + 1 == last ? "\n" : "  ", out);
        }
    }
    for (r = 0; r < t->nrows * t->ncols; r++)
        free(t->cells[r]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = 0;
}

void ctl_table_print(struct ctl_table *t)
{
    ctl_table_fprint(stdout, t);
}

/* ---- JSON members as text ----------------------------------------------- */

/* A JSON scalar as text; NULL for a missing member. */
static const char *ctl_scalar(json_t *v, char *buf, size_t sz)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return json_string_value(v);
    case JSON_INTEGER:
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL: snprintf(buf, sz, "%g", json_real_value(v)); return buf;
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    default: return NULL;
    }
}

const char *ctl_field(json_t *obj, const char *key, char *buf, size_t sz)
{
    json_t *v = json_object_get(obj, key);

    return !v ? NULL : ctl_scalar(v, buf, sz);
}

/* A member for printf: "-" when missing. */
const char *ctl_text(json_t *obj, const char *key, char *buf, size_t sz)
{
    const char *s = ctl_field(obj, key, buf, sz);

    return s ? s : "-";
}

/* Milliseconds as "850 ms", "5.9 s", "3 min 20 s". */
const char *ctl_duration(json_t *v, char *buf, size_t sz)
{
    json_int_t ms;

    if (!json_is_integer(v))
        return NULL;
    ms = json_integer_value(v);
    if (ms < 1000)
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " ms", ms);
    else if (ms < 60000)
        snprintf(buf, sz, "%.1f s", (double)ms / 1000.0);
    else
        snprintf(buf, sz, "%" JSON_INTEGER_FORMAT " min %" JSON_INTEGER_FORMAT
                 " s", ms / 60000, ms / 1000 % 60);
    return buf;
}

json_t *ctl_parse_json(const char *text)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);

    if (!root || !json_is_object(root)) {
        warnx("the daemon sent unreadable JSON: %s",
              !root ? jerr.text : "not an object");
        json_decref(root);
        return NULL;
    }
    return root;
}

/* "s3.mx9 (worker-2)": the session of a TOP holder or a STATUS waiter,
 * with its client name. */
const char *ctl_session_name(json_t *who, char *buf, size_t sz)
{
    const char *session = json_string_value(json_object_get(who, "session"));
    const char *name = json_string_value(json_object_get(who, "name"));

    if (!session)
        return "-";
    snprintf(buf, sz, "%s%s%s%s", session, name ? " (" : "",
             name ? name : "", name ? ")" : "");
    return buf;
}

json_int_t ctl_int(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);

    return json_is_integer(v) ? json_integer_value(v) : 0;
}
