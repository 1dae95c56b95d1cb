/*
 * list: one intrusive, circular, doubly linked list for the whole daemon.
 *
 * A struct that lives on a list embeds a struct list; the list itself is a
 * struct list head (a sentinel). A node that is on no list points at itself,
 * so list_remove is safe to call twice and list_linked tells whether it is
 * on one. The list never allocates. (twemproxy's nc_queue.h, Linux's
 * list.h.)
 */
#ifndef REDLOCKD_LIST_H
#define REDLOCKD_LIST_H

#include <stdbool.h>
#include <stddef.h>

#ifndef container_of
#define container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))
#endif

struct list {
    struct list *prev, *next;
};

#define LIST_INIT(name) { &(name), &(name) }

static inline void list_init(struct list *n)
{
    n->prev = n->next = n;
}

static inline bool list_empty(const struct list *head)
{
    return head->next == head;
}

/* Is this node on some list? (Only for nodes that were list_init'ed.) */
static inline bool list_linked(const struct list *n)
{
    return n->next != n;
}

static inline void list_insert_after(struct list *pos, struct list *n)
{
    n->prev = pos;
    n->next = pos->next;
    pos->next->prev = n;
    pos->next = n;
}

static inline void list_push_tail(struct list *head, struct list *n)
{
    list_insert_after(head->prev, n);
}

static inline void list_push_head(struct list *head, struct list *n)
{
    list_insert_after(head, n);
}

static inline void list_remove(struct list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* First and last node, or NULL for an empty list. */
static inline struct list *list_first(const struct list *head)
{
    return head->next == head ? NULL : head->next;
}

static inline struct list *list_last(const struct list *head)
{
    return head->prev == head ? NULL : head->prev;
}

/* The struct that embeds node `n` as `member`, or NULL when n is NULL. */
#define list_entry(n, type, member) \
    ((n) ? container_of((n), type, member) : (type *)NULL)

#define list_foreach(pos, head) \
    for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

/* Tolerates removing (and freeing) pos inside the body. */
#define list_foreach_safe(pos, tmp, head) \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); \
         (pos) = (tmp), (tmp) = (pos)->next)

#endif
