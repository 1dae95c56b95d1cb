/*
 * log: leveled logging to stderr.
 *
 * Under systemd (JOURNAL_STREAM set) lines carry a "<N>" syslog priority
 * prefix and no timestamp, since journald adds both; otherwise a timestamp
 * and the level name. Client bytes reach the log only after proto/ has
 * validated them (resource names) or sanitized them (error messages).
 */
#ifndef REDLOCKD_LOG_H
#define REDLOCKD_LOG_H

#include <stddef.h>

enum log_level {
    LOG_LEVEL_DEBUG,
    LOG_LEVEL_INFO,
    LOG_LEVEL_NOTICE,
    LOG_LEVEL_WARNING,
    LOG_LEVEL_ERROR,
};

void log_init(enum log_level level);
int log_enabled(enum log_level level);
void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...) \
    do { if (log_enabled(LOG_LEVEL_DEBUG)) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__); } while (0)
#define log_info(...) \
    do { if (log_enabled(LOG_LEVEL_INFO)) log_write(LOG_LEVEL_INFO, __VA_ARGS__); } while (0)
#define log_notice(...) \
    do { if (log_enabled(LOG_LEVEL_NOTICE)) log_write(LOG_LEVEL_NOTICE, __VA_ARGS__); } while (0)
#define log_warn(...) \
    do { if (log_enabled(LOG_LEVEL_WARNING)) log_write(LOG_LEVEL_WARNING, __VA_ARGS__); } while (0)
#define log_error(...) log_write(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
