/*
 * libFuzzer target for daemon/conf*.c: every input is a config file's text.
 *
 * Besides the sanitizers' memory checks, it asserts what the daemon relies
 * on: a refused file gives one printable line naming the reason and leaves
 * a conf that conf_deinit takes; an accepted one has at least one listen
 * address and one node, ttl bounds in order and an id; and reloading the
 * same text over it changes nothing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "fuzz.h"

static void fuzz_report(void *ud, const char *key, const char *was,
                        const char *now, bool applied)
{
    (void)key;
    (void)was;
    (void)now;
    (void)applied;
    (*(int *)ud)++;
}

static int fuzz_one_line(const char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f)
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    char err[CONF_ERRLEN];
    struct conf c, again;

    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    err[0] = '\0';
    if (conf_load_string(&c, text, "fuzz.json", err, sizeof(err)) != 0) {
        FUZZ_CHECK(err[0] != '\0');
        FUZZ_CHECK(fuzz_one_line(err));
        conf_deinit(&c);
        free(text);
        return 0;
    }
    FUZZ_CHECK(c.nlisten >= 1 && c.redis.nnodes >= 1);
    FUZZ_CHECK(c.locks.min_ttl_ms <= c.locks.default_ttl_ms);
    FUZZ_CHECK(c.locks.default_ttl_ms <= c.locks.max_ttl_ms);
    FUZZ_CHECK(c.id && c.id[0]);
    FUZZ_CHECK(conf_load_string(&again, text, "fuzz.json", err,
                                sizeof(err)) == 0);
    int changes = 0;
    FUZZ_CHECK(conf_reload(&c, &again, fuzz_report, &changes) == 0);
    FUZZ_CHECK(changes == 0);
    conf_deinit(&again);
    conf_deinit(&c);
    free(text);
    return 0;
}
