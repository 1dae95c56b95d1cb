/*
 * What the libFuzzer targets in tests/fuzz/ share: the entry point they
 * define and a check that stays on in every build (assert() would vanish
 * under NDEBUG), so a broken property is a crash libFuzzer reports.
 */
#ifndef REDLOCKD_FUZZ_H
#define REDLOCKD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,        \
                    __LINE__, #cond);                                     \
            abort();                                                      \
        }                                                                 \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
