/*
 * redlockd-taskq, the ground floor: what every file uses. The messages
 * (die, logmsg), the wall clock, and the stop flag that SIGTERM and SIGINT
 * set (taskq_shared.h lists the files). It calls nothing of the others.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "taskq_shared.h"

volatile sig_atomic_t stop_flag;

void on_stop(int sig)
{
    (void)sig;
    stop_flag = 1;
}

void die(int code, const char *fmt, ...)
{
    va_list ap;

    fputs("taskq: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

void logmsg(const struct cfg *c, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "taskq[%s]: ", c->name ? c->name : "-");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
