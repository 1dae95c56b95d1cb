/*
 * mem: see mem.h.
 */
#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mem_oom(void)
{
    fputs("redlockd: out of memory\n", stderr);
    abort();
}

void *mem_alloc(size_t size)
{
    void *p = calloc(1, size);
    if (!p)
        mem_oom();
    return p;
}

void *mem_realloc(void *p, size_t size)
{
    void *n = realloc(p, size);
    if (!n)
        mem_oom();
    return n;
}

char *mem_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = mem_alloc(n);

    memcpy(p, s, n);
    return p;
}
