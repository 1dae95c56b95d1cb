/*
 * rclass: the class of a resource, for the per-class wait and hold
 * histograms (metrics.resource_classes, metrics.max_classes;
 * docs/metrics.md, "Classes").
 *
 * A class is a prefix of resource names. By "prefix" (the default) a
 * resource's class is its name up to and including its first ':' (job:42
 * is in job:), met as clients use them; given a list, the longest listed
 * prefix a name starts with. Either way at most `max` classes are ever
 * named: a name without ':', one that starts with no listed prefix, and
 * every new prefix once `max` are known are class "other" (index 0), so
 * the number of series stays bounded whatever names clients send. A
 * lookup costs a hash of the name's prefix (one per distinct listed
 * length), never a walk over the classes.
 *
 * Pure (no I/O, no globals): tests/unit/test_rclass.c checks it alone.
 * stats_glue owns the daemon's one instance and makes a new one when a
 * reload changes the settings.
 */
#ifndef REDLOCKD_RCLASS_H
#define REDLOCKD_RCLASS_H

#include <stdbool.h>
#include <stddef.h>

/* The class of the resources no named class takes: always index 0. */
#define RCLASS_OTHER 0
#define RCLASS_OTHER_NAME "other"

struct rclass;

/* prefixes NULL: classes by the first ':'; else the n listed prefixes are
 * the classes 1..n, in that order (the caller keeps n <= max: conf
 * checks it). The strings are copied. */
struct rclass *rclass_create(const char *const *prefixes, size_t n,
                             size_t max);
void rclass_destroy(struct rclass *rc);
/* Would rclass_create(prefixes, n, max) make the same classes? */
bool rclass_same(const struct rclass *rc, const char *const *prefixes,
                 size_t n, size_t max);
/* The class of res[0..len): its index, RCLASS_OTHER when none. By "prefix"
 * this names a new class the first time one is met, while fewer than max
 * are named. */
size_t rclass_of(struct rclass *rc, const char *res, size_t len);
/* Classes named so far, "other" included: indexes 0..count-1. */
size_t rclass_count(const struct rclass *rc);
/* The name of class i (< rclass_count), valid while rc lives. */
const char *rclass_name(const struct rclass *rc, size_t i);

#endif
