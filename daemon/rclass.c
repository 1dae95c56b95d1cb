/*
 * rclass: see rclass.h.
 */
#include "rclass.h"

#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "mem.h"

struct rclass_entry {
    struct hmap_node node;          /* in rc->names (not "other") */
    size_t index;
    size_t len;
    char name[];
};

struct rclass {
    struct hmap names;              /* name -> entry, every class but 0 */
    struct rclass_entry **v;        /* (owned) by index; v[0] is "other" */
    size_t n;                       /* classes, "other" included */
    size_t max;                     /* named classes at most */
    bool listed;                    /* classes are the prefixes given */
    size_t *lens;                   /* (owned) listed: each prefix length
                                       once, longest first */
    size_t nlens;
};

static struct rclass_entry *rclass_entry_new(const char *name, size_t len,
                                             size_t index)
{
    struct rclass_entry *e = mem_alloc(sizeof(*e) + len + 1);

    memcpy(e->name, name, len);
    e->name[len] = '\0';
    e->len = len;
    e->index = index;
    return e;
}

/* A new class: the next index, findable by name. */
static size_t rclass_add(struct rclass *rc, const char *name, size_t len)
{
    struct rclass_entry *e = rclass_entry_new(name, len, rc->n);

    rc->v[rc->n++] = e;
    hmap_put(&rc->names, &e->node, e->name, len);
    return e->index;
}

static void rclass_add_len(struct rclass *rc, size_t len)
{
    size_t i = 0;

    while (i < rc->nlens && rc->lens[i] > len)
        i++;
    if (i < rc->nlens && rc->lens[i] == len)
        return;
    memmove(&rc->lens[i + 1], &rc->lens[i],
            (rc->nlens - i) * sizeof(*rc->lens));
    rc->lens[i] = len;
    rc->nlens++;
}

struct rclass *rclass_create(const char *const *prefixes, size_t n,
                             size_t max)
{
    struct rclass *rc = mem_alloc(sizeof(*rc));
    size_t cap = (prefixes ? n : max) + 1;

    hmap_init(&rc->names);
    rc->max = max;
    rc->v = mem_alloc(cap * sizeof(*rc->v));
    rc->v[rc->n++] = rclass_entry_new(RCLASS_OTHER_NAME,
                                      strlen(RCLASS_OTHER_NAME), 0);
    if (!prefixes)
        return rc;
    rc->listed = true;
    rc->lens = mem_alloc((n ? n : 1) * sizeof(*rc->lens));
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(prefixes[i]);

        /* conf refuses a prefix given twice; a repeat is no new class. */
        if (hmap_get(&rc->names, prefixes[i], len))
            continue;
        rclass_add(rc, prefixes[i], len);
        rclass_add_len(rc, len);
    }
    return rc;
}

void rclass_destroy(struct rclass *rc)
{
    if (!rc)
        return;
    for (size_t i = 0; i < rc->n; i++)
        free(rc->v[i]);
    free(rc->v);
    free(rc->lens);
    hmap_deinit(&rc->names);
    free(rc);
}

bool rclass_same(const struct rclass *rc, const char *const *prefixes,
                 size_t n, size_t max)
{
    if (rc->max != max || rc->listed != (prefixes != NULL))
        return false;
    if (!prefixes)
        return true;
    if (rc->n != n + 1)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(rc->v[i + 1]->name, prefixes[i]) != 0)
            return false;
    return true;
}

static size_t rclass_find(const struct rclass *rc, const char *name,
                          size_t len)
{
    struct hmap_node *n = hmap_get(&rc->names, name, len);

    return n ? container_of(n, struct rclass_entry, node)->index
             : RCLASS_OTHER;
}

/* The longest listed prefix res starts with. */
static size_t rclass_of_listed(const struct rclass *rc, const char *res,
                               size_t len)
{
    for (size_t i = 0; i < rc->nlens; i++) {
        size_t k;

        if (rc->lens[i] > len)
            continue;
        if ((k = rclass_find(rc, res, rc->lens[i])) != RCLASS_OTHER)
            return k;
    }
    return RCLASS_OTHER;
}

size_t rclass_of(struct rclass *rc, const char *res, size_t len)
{
    const char *colon;
    size_t plen, k;

    if (rc->listed)
        return rclass_of_listed(rc, res, len);
    colon = memchr(res, ':', len);
    if (!colon)
        return RCLASS_OTHER;
    plen = (size_t)(colon - res) + 1;
    if ((k = rclass_find(rc, res, plen)) != RCLASS_OTHER)
        return k;
    return rc->n - 1 < rc->max ? rclass_add(rc, res, plen) : RCLASS_OTHER;
}

size_t rclass_count(const struct rclass *rc)
{
    return rc->n;
}

const char *rclass_name(const struct rclass *rc, size_t i)
{
    return rc->v[i]->name;
}
