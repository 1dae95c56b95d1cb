/*
 * log: see log.h.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static enum log_level log_min = LOG_LEVEL_INFO;
static int log_journal;     /* stderr is connected to journald */

static const char *const log_names[] = {
    "debug", "info", "notice", "warning", "error",
};
/* syslog priorities: debug 7, info 6, notice 5, warning 4, err 3 */
static const int log_prio[] = { 7, 6, 5, 4, 3 };

void log_init(enum log_level level)
{
    log_min = level;
    log_journal = getenv("JOURNAL_STREAM") ? 1 : 0;
}

int log_enabled(enum log_level level)
{
    return level >= log_min;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    if (log_journal) {
        fprintf(stderr, "<%d>%s\n", log_prio[level], msg);
        return;
    }
    /* Local time with its UTC offset, so lines from hosts in different
     * zones (or across a DST change) can be put in order. */
    struct timespec ts;
    struct tm tm;
    char when[32], zone[8];
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    strftime(zone, sizeof(zone), "%z", &tm);
    fprintf(stderr, "%s.%03ld%s [%s] %s\n", when, ts.tv_nsec / 1000000L,
            zone, log_names[level], msg);
}
