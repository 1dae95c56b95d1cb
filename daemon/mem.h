/*
 * mem: allocation that cannot fail quietly.
 *
 * A lock server that cannot allocate a session or a lease cannot keep its
 * promises either, so running out of memory ends the process with one
 * clear line (as Redis does); systemd restarts it and the leases expire by
 * their ttl. Untrusted sizes never reach these: every size is bounded by a
 * configured limit first.
 */
#ifndef REDLOCKD_MEM_H
#define REDLOCKD_MEM_H

#include <stddef.h>

__attribute__((noreturn)) void mem_oom(void);
/* Zeroed memory for `size` bytes. */
void *mem_alloc(size_t size);
void *mem_realloc(void *p, size_t size);
char *mem_strdup(const char *s);

#endif
