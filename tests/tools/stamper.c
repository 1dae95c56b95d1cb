/*
 * redlockd-test-stamper: a background worker as Python's subprocess.Popen
 * starts one by default, for the tests of what keeps a lock (issue 28):
 *
 *     redlockd-test-stamper [-m] FILE MS
 *
 * It closes every descriptor above 2 it inherited (Popen's close_fds=True,
 * so it does not hold the lock connection a command inherited), stays in
 * its parent's process group and session, and appends the wall-clock time
 * in ns (CLOCK_REALTIME, as `date +%s%N`) as one line to FILE every 50 ms
 * for MS ms: each line is a write made while it believed the lock held.
 * The tests compare the last line with the time another client was
 * granted the lock. The file is opened for each line, so a reader never
 * sees a line half written (the lines are far below PIPE_BUF) and the
 * stamper holds no descriptor between writes. With -m the stamps are
 * CLOCK_MONOTONIC instead, the clock a test driver keeps its own times on
 * (test_mutex), so that nothing has to be converted between the two.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STAMPER_PERIOD_MS 50

static long long stamper_ns(clockid_t clock)
{
    struct timespec ts;

    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int stamper_write(const char *path, clockid_t clock)
{
    char line[32];
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    int n = snprintf(line, sizeof(line), "%lld\n", stamper_ns(clock));
    int rc = 0;

    if (fd < 0)
        return -1;
    if (write(fd, line, (size_t)n) != n)
        rc = -1;
    close(fd);
    return rc;
}

int main(int argc, char **argv)
{
    struct timespec period = { 0, STAMPER_PERIOD_MS * 1000000L };
    clockid_t clock = CLOCK_REALTIME;
    long long end;
    char *rest;
    long ms;

    if (argc == 4 && strcmp(argv[1], "-m") == 0) {
        clock = CLOCK_MONOTONIC;
        argc--;
        argv++;
    }
    if (argc != 3 || (ms = strtol(argv[2], &rest, 10)) <= 0 || *rest != '\0') {
        fprintf(stderr, "usage: redlockd-test-stamper [-m] FILE MS\n");
        return 64;
    }
    if (close_range(3, ~0U, 0) < 0) {
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    }
    end = stamper_ns(CLOCK_MONOTONIC) + ms * 1000000LL;
    while (stamper_ns(CLOCK_MONOTONIC) < end) {
        if (stamper_write(argv[1], clock) < 0) {
            fprintf(stderr, "redlockd-test-stamper: %s: %s\n", argv[1],
                    strerror(errno));
            return 1;
        }
        nanosleep(&period, NULL);
    }
    return 0;
}
