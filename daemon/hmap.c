/*
 * hmap: see hmap.h. Separate chaining, FNV-1a hashing, doubling at load 1.
 * Resource names come from clients, so a hostile client could pick colliding
 * names; each session's lock count is capped (max_locks_per_session) and the
 * chains stay short in practice. A keyed hash would be the next step.
 */
#include "hmap.h"
#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t hmap_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ULL;
    }
    return h;
}

void hmap_init(struct hmap *m)
{
    m->nbuckets = 64;
    m->count = 0;
    m->buckets = mem_alloc(m->nbuckets * sizeof(*m->buckets));
}

void hmap_deinit(struct hmap *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = m->count = 0;
}

struct hmap_node *hmap_get(const struct hmap *m, const char *key, size_t len)
{
    uint64_t h = hmap_hash(key, len);
    struct hmap_node *n = m->buckets[h & (m->nbuckets - 1)];
    for (; n; n = n->next) {
        if (n->hash == h && n->keylen == len && memcmp(n->key, key, len) == 0)
            return n;
    }
    return NULL;
}

static void hmap_grow(struct hmap *m)
{
    size_t nb = m->nbuckets * 2;
    struct hmap_node **b = mem_alloc(nb * sizeof(*b));
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct hmap_node *n = m->buckets[i], *next;
        for (; n; n = next) {
            next = n->next;
            size_t j = n->hash & (nb - 1);
            n->next = b[j];
            b[j] = n;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
}

void hmap_put(struct hmap *m, struct hmap_node *n, const char *key, size_t len)
{
    if (m->count >= m->nbuckets)
        hmap_grow(m);
    n->hash = hmap_hash(key, len);
    n->key = key;
    n->keylen = len;
    size_t i = n->hash & (m->nbuckets - 1);
    n->next = m->buckets[i];
    m->buckets[i] = n;
    m->count++;
}

void hmap_del(struct hmap *m, struct hmap_node *n)
{
    struct hmap_node **pp = &m->buckets[n->hash & (m->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            n->next = NULL;
            m->count--;
            return;
        }
    }
}

void hmap_iter_init(struct hmap_iter *it, const struct hmap *m)
{
    it->m = m;
    it->bucket = 0;
    it->next = m->nbuckets ? m->buckets[0] : NULL;
}

struct hmap_node *hmap_iter_next(struct hmap_iter *it)
{
    while (!it->next) {
        if (++it->bucket >= it->m->nbuckets)
            return NULL;
        it->next = it->m->buckets[it->bucket];
    }
    struct hmap_node *n = it->next;
    it->next = n->next;
    return n;
}
