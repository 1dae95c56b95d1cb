/*
 * redlockd-taskq: a task queue in Redis lists, worked on under redlockd locks.
 *
 *   taskq push QUEUE PAYLOAD...          add tasks, print their ids
 *   taskq work QUEUE [opts] -- CMD ARGS  take tasks one at a time and run CMD
 *   taskq status QUEUE [--json]          counts, ages, locks and holders
 *   taskq monitor QUEUE --listen H:P     the same as JSON over HTTP, GET /status
 *                                        (HEAD too; 503 while Redis is down)
 *   taskq progress TEXT...               (inside a task) report progress
 *
 * This file is the program's face: main (the options, usage and the
 * dispatch) and the two small subcommands, push and progress. The others
 * are in taskq_status.c and taskq_work.c (taskq_shared.h lists the files).
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "taskq_shared.h"

/* ---- push ---- */

static int cmd_push(struct cfg *c, int argc, char **argv)
{
    if (argc < 1)
        die(EXIT_USAGE, "push: no payload");
    queue_connect(c);
    for (int i = 0; i < argc; i++) {
        char id[64];

        queue_push(c, argv[i], id, sizeof(id));
        printf("%s\n", id);
    }
    queue_close();
    return 0;
}

/* ---- progress helper ---- */

static int cmd_progress(int argc, char **argv)
{
    const char *fd_s = getenv("TASKQ_PROGRESS_FD");
    char line[4096];
    size_t n = 0;
    int fd;

    if (!fd_s)
        die(EXIT_USAGE, "progress: TASKQ_PROGRESS_FD is not set (not in a task)");
    fd = atoi(fd_s);
    line[0] = '\0';
    for (int i = 0; i < argc && n + 2 < sizeof(line); i++)
        n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s",
                              i ? " " : "", argv[i]);
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    if (write(fd, line, n) != (ssize_t)n)
        die(EXIT_SOFTWARE, "progress: %s", strerror(errno));
    return 0;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fputs("usage: redlockd-taskq push QUEUE PAYLOAD...\n"
          "       redlockd-taskq work QUEUE [options] -- COMMAND [ARGS]\n"
          "       redlockd-taskq status QUEUE [--json]\n"
          "       redlockd-taskq monitor QUEUE --listen 127.0.0.1:PORT\n"
          "       redlockd-taskq progress TEXT...   (from a task's command)\n"
          "options (every subcommand):\n"
          "  --redis HOST:PORT      the Redis holding the queues (127.0.0.1:6379)\n"
          "  --server ADDR          redlockd ($REDLOCKD_SERVER, else 127.0.0.1:7390)\n"
          "work options:\n"
          "  --name NAME            worker name (taskq-PID@HOST)\n"
          "  --ttl MS               lock ttl on Redis (10000)\n"
          "  --keepalive MS         session keepalive (10000)\n"
          "  --max-attempts N       runs before a task is dead (5)\n"
          "  --backoff MS           first retry delay, doubled each time (1000)\n"
          "  --backoff-max MS       (60000)\n"
          "  --expected MS          expected run time of a task (60000)\n"
          "  --suspect-factor X     held longer than X * expected: suspect (3)\n"
          "  --claim-grace MS       a task taken this recently is not stale (5000)\n"
          "  --recover-interval MS  how often to look for stale work (2000)\n"
          "  --poll MS              BLMOVE timeout (1000)\n"
          "  --max-tasks N          exit after N tasks (0: run until SIGTERM)\n",
          f);
}

static int int_arg(const char *opt, const char *v, int min)
{
    char *end;
    long n;

    errno = 0;
    n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || n < min || n > INT_MAX)
        die(EXIT_USAGE, "%s: bad value \"%s\"", opt, v ? v : "");
    return (int)n;
}

int main(int argc, char **argv)
{
    struct cfg c;
    const char *sub;
    char **rest;
    int nrest = 0;

    memset(&c, 0, sizeof(c));
    snprintf(c.redis_host, sizeof(c.redis_host), "127.0.0.1");
    c.redis_port = 6379;
    c.ttl_ms = 10000;
    c.keepalive_ms = 10000;
    c.max_attempts = 5;
    c.backoff_ms = 1000;
    c.backoff_max_ms = 60000;
    c.expected_ms = 60000;
    c.suspect_factor = 3;
    c.claim_grace_ms = 5000;
    c.recover_ms = 2000;
    c.poll_ms = 1000;

    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    sub = argv[1];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(sub, "progress") == 0)
        return cmd_progress(argc - 2, argv + 2);
    rest = calloc((size_t)argc, sizeof(*rest));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--") == 0) {
            c.cmd = argv + i + 1;
            break;
        }
        if (strncmp(a, "--", 2) != 0) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            c.json = true;
            continue;
        }
        if (!v)
            die(EXIT_USAGE, "%s needs a value", a);
        i++;
        if (strcmp(a, "--redis") == 0) {
            const char *colon = strrchr(v, ':');

            if (!colon || colon == v)
                die(EXIT_USAGE, "--redis: HOST:PORT expected, not \"%s\"", v);
            snprintf(c.redis_host, sizeof(c.redis_host), "%.*s",
                     (int)(colon - v), v);
            c.redis_port = int_arg(a, colon + 1, 1);
        } else if (strcmp(a, "--server") == 0) {
            c.server = v;
        } else if (strcmp(a, "--name") == 0) {
            c.name = v;
        } else if (strcmp(a, "--listen") == 0) {
            c.listen = v;
        } else if (strcmp(a, "--ttl") == 0) {
            c.ttl_ms = int_arg(a, v, 100);
        } else if (strcmp(a, "--keepalive") == 0) {
            c.keepalive_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--max-attempts") == 0) {
            c.max_attempts = int_arg(a, v, 1);
        } else if (strcmp(a, "--backoff") == 0) {
            c.backoff_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--backoff-max") == 0) {
            c.backoff_max_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--expected") == 0) {
            c.expected_ms = int_arg(a, v, 1);
        } else if (strcmp(a, "--suspect-factor") == 0) {
            c.suspect_factor = atof(v);
        } else if (strcmp(a, "--claim-grace") == 0) {
            c.claim_grace_ms = int_arg(a, v, 0);
        } else if (strcmp(a, "--recover-interval") == 0) {
            c.recover_ms = int_arg(a, v, 10);
        } else if (strcmp(a, "--poll") == 0) {
            c.poll_ms = int_arg(a, v, 10);
        } else if (strcmp(a, "--max-tasks") == 0) {
            c.max_tasks = int_arg(a, v, 0);
        } else {
            die(EXIT_USAGE, "unknown option %s", a);
        }
    }
    if (nrest < 1)
        die(EXIT_USAGE, "%s: no QUEUE", sub);
    c.queue = rest[0];
    if (nrest > 1 && strcmp(sub, "push") != 0)
        die(EXIT_USAGE, "%s: unexpected argument %s", sub, rest[1]);
    int rc;
    if (strcmp(sub, "push") == 0)
        rc = cmd_push(&c, nrest - 1, rest + 1);
    else if (strcmp(sub, "work") == 0)
        rc = cmd_work(&c);
    else if (strcmp(sub, "status") == 0)
        rc = cmd_status(&c);
    else if (strcmp(sub, "monitor") == 0)
        rc = cmd_monitor(&c);
    else
        die(EXIT_USAGE, "unknown subcommand %s", sub);
    free(rest);
    return rc;
}
