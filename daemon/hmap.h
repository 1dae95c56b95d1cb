/*
 * hmap: an intrusive hash map keyed by byte strings.
 *
 * Owners embed a struct hmap_node and keep the key bytes alive while the
 * node is in the map; the map never allocates or frees entries, only its
 * bucket array. Used for the lock table (resource -> entry).
 */
#ifndef REDLOCKD_HMAP_H
#define REDLOCKD_HMAP_H

#include <stddef.h>
#include <stdint.h>

#include "list.h"   /* container_of */

struct hmap_node {
    struct hmap_node *next;
    uint64_t hash;
    const char *key;
    size_t keylen;
};

struct hmap {
    struct hmap_node **buckets;
    size_t nbuckets;    /* power of two */
    size_t count;
};

void hmap_init(struct hmap *m);
void hmap_deinit(struct hmap *m);       /* frees buckets, not entries */
struct hmap_node *hmap_get(const struct hmap *m, const char *key, size_t len);
/* The key must not be present; n->key must stay valid while in the map. */
void hmap_put(struct hmap *m, struct hmap_node *n, const char *key, size_t len);
void hmap_del(struct hmap *m, struct hmap_node *n);

/* Iteration that tolerates deleting the current node. */
struct hmap_iter {
    const struct hmap *m;
    size_t bucket;
    struct hmap_node *next;
};
void hmap_iter_init(struct hmap_iter *it, const struct hmap *m);
struct hmap_node *hmap_iter_next(struct hmap_iter *it);

uint64_t hmap_hash(const char *key, size_t len);

#endif
