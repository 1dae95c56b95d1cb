/*
 * test_taskq: redlockd-taskq (examples/taskq) as real processes against
 * three real redis-server nodes and the real redlockd; node 0 also holds
 * the queue.
 *
 * 201 tasks over 4 workers: 200 that succeed, among them one ("slow") whose
 * first run hangs until its worker and then itself are SIGKILLed (the
 * command outlives its worker, under its keeper), one ("flaky") that fails
 * twice before it succeeds, and ones reporting progress through the helper
 * command and through the file descriptor; plus one ("bad") that always
 * fails. Asserted afterwards:
 *   - every one of the 200 completed exactly once (completions[id] == 1),
 *     and the fence recorded for it (done[id]) is the REDLOCKD_FENCE of a
 *     run of its command that succeeded;
 *   - the killed worker's task was recovered as stale work and completed
 *     by another worker in its second attempt, under a larger fence;
 *   - the flaky task took 3 attempts, the bad one is in the dead-letter
 *     list after max-attempts (4) runs;
 *   - pending, processing and retry are empty;
 *   - `status --json` while the slow task runs shows it in processing with
 *     its lock held and the holder named, and at the end the counts;
 *   - the monitor's GET /status answers the same JSON, other paths 404;
 *   - (issue 28) a worker SIGKILLed while a worker of its task's command
 *     that closed its descriptors (tests/tools/stamper.c) writes: another
 *     client waiting for the task's lock is granted it after the last
 *     write and within a second of it, and the task is then recovered;
 *   - a finished task's running_ms is what its run took, and stays so;
 *     the monitor answers HEAD, 405 with Allow, and 503 (not exiting)
 *     while the queue's Redis is down, 200 once it is back.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NODES 3
#define WORKERS 4
#define GOOD 200
#define MAX_ATTEMPTS 4

static struct h_redis R[NODES];
static struct h_daemon D;
static pid_t W[WORKERS + 1];    /* the workers, and the monitor last */
static char S[64], RQ[64];      /* daemon and queue Redis as HOST:PORT */

static const char *bin(void)
{
    const char *b = getenv("TASKQ_BIN");

    ck_assert_msg(b != NULL, "TASKQ_BIN is not set");
    return b;
}

static const char *tmp_path(const char *name)
{
    static char bufs[4][400];
    static int next;
    char *b = bufs[next++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", D.dir, name);
    return b;
}

static void setup(void)
{
    memset(R, 0, sizeof(R));
    memset(&D, 0, sizeof(D));
    memset(W, 0, sizeof(W));
}

static void teardown(void)
{
    int rc;

    for (int i = 0; i <= WORKERS; i++)
        if (W[i] > 0) {
            kill(W[i], SIGKILL);
            waitpid(W[i], NULL, 0);
            W[i] = 0;
        }
    rc = h_daemon_finish(&D);
    h_daemon_cleanup(&D);
    h_redis_cleanup_all(R, NODES);
    ck_assert_msg(rc == 0, "redlockd exited with status %d on SIGTERM", rc);
}

/* Start argv with stdout to /dev/null and stderr appended to log; the
 * child dies with the test (PDEATHSIG). */
static pid_t spawn(char *const argv[], const char *log)
{
    pid_t parent = getpid(), pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int out = open("/dev/null", O_WRONLY);
        int err = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static void write_script(void)
{
    FILE *f = fopen(tmp_path("task.sh"), "w");

    ck_assert_ptr_nonnull(f);
    fputs("#!/bin/sh\n"
          "log=\"$TASKQ_TEST_DIR/runs.log\"\n"
          "echo \"start $TASKQ_ID $TASKQ_ATTEMPT $REDLOCKD_FENCE\" >> \"$log\"\n"
          "case \"$TASKQ_PAYLOAD\" in\n"
          "slow) if [ \"$TASKQ_ATTEMPT\" = 1 ]; then\n"
          "        echo \"$TASKQ_ID $REDLOCKD_FENCE $$\" > \"$TASKQ_TEST_DIR/slow.tmp\"\n"
          "        mv \"$TASKQ_TEST_DIR/slow.tmp\" \"$TASKQ_TEST_DIR/slow.started\"\n"
          "        exec sleep 30\n"
          "      fi ;;\n"
          "flaky) if [ \"$TASKQ_ATTEMPT\" -lt 3 ]; then exit 1; fi ;;\n"
          "bad) exit 3 ;;\n"
          "helper) \"$TASKQ_BIN\" progress half way || exit 9 ;;\n"
          "long) if [ \"$TASKQ_ATTEMPT\" = 1 ]; then\n"
          "        echo $$ > \"$TASKQ_TEST_DIR/long.tmp\"\n"
          "        mv \"$TASKQ_TEST_DIR/long.tmp\" \"$TASKQ_TEST_DIR/long.pid\"\n"
          "        exec sleep 30\n"
          "      fi ;;\n"
          "fd) echo \"via fd\" >&\"$TASKQ_PROGRESS_FD\" ;;\n"
          "cfd) if [ \"$TASKQ_ATTEMPT\" = 1 ]; then\n"
          "        \"$STAMPER_BIN\" \"$TASKQ_TEST_DIR/stamps\" 3000 &\n"
          "        echo $$ > \"$TASKQ_TEST_DIR/cfd.tmp\"\n"
          "        mv \"$TASKQ_TEST_DIR/cfd.tmp\" \"$TASKQ_TEST_DIR/cfd.pid\"\n"
          "        sleep 1\n"
          "      fi ;;\n"
          "esac\n"
          "echo \"done $TASKQ_ID $TASKQ_ATTEMPT $REDLOCKD_FENCE\" >> \"$log\"\n",
          f);
    fclose(f);
}

static redisContext *q;

static long long qint(const char *fmt, const char *a, const char *b)
{
    redisReply *r = redisCommand(q, fmt, a, b);
    long long v = -1;

    ck_assert_ptr_nonnull(r);
    if (r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

static char *qstr(const char *fmt, const char *a, const char *b)
{
    redisReply *r = redisCommand(q, fmt, a, b);
    char *s = NULL;

    ck_assert_ptr_nonnull(r);
    if (r->type == REDIS_REPLY_STRING)
        s = strdup(r->str);
    freeReplyObject(r);
    return s;
}

static json_t *status_json(void)
{
    static char out[1 << 20];
    char *argv[] = { (char *)bin(), "status", "q", "--json", "--redis", RQ,
                     "--server", S, NULL };
    json_t *j;
    int st = h_run(argv, out, sizeof(out));

    ck_assert_msg(st == 0, "status exited %d: %s", st, out);
    j = json_loads(out, 0, NULL);
    ck_assert_msg(j != NULL, "status --json printed \"%s\"", out);
    return j;
}

static long long count_of(json_t *s, const char *list)
{
    return json_integer_value(json_object_get(json_object_get(s, list), "count"));
}

static void http_req(int port, const char *method, const char *path,
                     char *buf, size_t size);

/* GET path from 127.0.0.1:port; the whole answer into buf. */
static void http_get(int port, const char *path, char *buf, size_t size)
{
    http_req(port, "GET", path, buf, size);
}

/* `method` path from 127.0.0.1:port; the whole answer into buf. */
static void http_req(int port, const char *method, const char *path,
                     char *buf, size_t size)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    size_t len = 0;
    char req[256];
    uint64_t t0 = h_now_ms();

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        ck_assert_msg(h_since(t0) < h_scale(5000), "monitor not listening");
        close(fd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        h_sleep_ms(50);
    }
    snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method,
             path);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    {
        struct timeval tv = { 5, 0 };

        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    for (;;) {
        ssize_t k = read(fd, buf + len, size - 1 - len);

        if (k <= 0 || len + (size_t)k >= size - 1) {
            if (k > 0)
                len += (size_t)k;
            break;
        }
        len += (size_t)k;
    }
    buf[len] = '\0';
    close(fd);
}

/* Nodes, a daemon, the addresses taskq is given, the queue's connection
 * and the task script: what every test starts from. */
static void start_all(void)
{
    h_redis_start_all(R, NODES, NULL);
    h_daemon_start(&D, R, NODES, NULL);
    h_wait_voting(&D, NODES, h_scale(5000));
    snprintf(S, sizeof(S), "127.0.0.1:%d", D.port);
    snprintf(RQ, sizeof(RQ), "127.0.0.1:%d", R[0].port);
    q = h_redis_connect(&R[0]);
    write_script();
    setenv("TASKQ_TEST_DIR", D.dir, 1);
}

START_TEST(test_queue)
{
    static char out[65536], runs[1 << 21];
    char *push[GOOD + 8], *work[40], line[256], script[400];
    int slow_idx = 5, flaky_idx = 7, helper_idx = 9, fd_idx = 11;
    char payloads[GOOD][16];
    uint64_t t0 = h_now_ms();
    int np = 0, st;
    FILE *f;
    char slow_id[32] = "";
    unsigned long long slow_fence1 = 0;
    pid_t slow_pid = 0;
    int slow_cmd = 0;

    start_all();

    /* Push: ids 1..200 the good ones, 201 the bad one. */
    push[np++] = (char *)bin();
    push[np++] = "push";
    push[np++] = "q";
    push[np++] = "--redis";
    push[np++] = RQ;
    for (int i = 0; i < GOOD; i++) {
        if (i == slow_idx)
            snprintf(payloads[i], sizeof(payloads[i]), "slow");
        else if (i == flaky_idx)
            snprintf(payloads[i], sizeof(payloads[i]), "flaky");
        else if (i == helper_idx)
            snprintf(payloads[i], sizeof(payloads[i]), "helper");
        else if (i == fd_idx)
            snprintf(payloads[i], sizeof(payloads[i]), "fd");
        else
            snprintf(payloads[i], sizeof(payloads[i]), "n%d", i);
        push[np++] = payloads[i];
    }
    push[np++] = "bad";
    push[np] = NULL;
    st = h_run(push, out, sizeof(out));
    ck_assert_msg(st == 0, "push exited %d: %s", st, out);
    ck_assert_int_eq(qint("LLEN %s", "taskq:q:pending", NULL), GOOD + 1);

    /* Four workers. */
    np = 0;
    work[np++] = (char *)bin();
    work[np++] = "work";
    work[np++] = "q";
    work[np++] = "--redis";
    work[np++] = RQ;
    work[np++] = "--server";
    work[np++] = S;
    work[np++] = "--ttl";
    work[np++] = "3000";
    work[np++] = "--max-attempts";
    work[np++] = "4";
    work[np++] = "--backoff";
    work[np++] = "100";
    work[np++] = "--backoff-max";
    work[np++] = "400";
    work[np++] = "--claim-grace";
    work[np++] = "500";
    work[np++] = "--recover-interval";
    work[np++] = "300";
    work[np++] = "--poll";
    work[np++] = "200";
    work[np++] = "--expected";
    work[np++] = "1000";
    work[np++] = "--";
    work[np++] = "/bin/sh";
    /* A copy: tmp_path's buffers rotate. */
    snprintf(script, sizeof(script), "%s", tmp_path("task.sh"));
    work[np++] = script;
    work[np] = NULL;
    for (int i = 0; i < WORKERS; i++)
        W[i] = spawn(work, getenv("TASKQ_TEST_LOG") ? getenv("TASKQ_TEST_LOG")
                                                    : tmp_path("workers.log"));

    /* The slow task's first run: find its worker and kill it. */
    while ((f = fopen(tmp_path("slow.started"), "r")) == NULL) {
        ck_assert_msg(h_since(t0) < h_scale(20000), "the slow task never started");
        h_sleep_ms(20);
    }
    ck_assert_int_eq(fscanf(f, "%31s %llu %d", slow_id, &slow_fence1,
                            &slow_cmd), 3);
    fclose(f);
    {
        char k[64], *pid_s;
        json_t *s, *t;
        size_t i;
        bool seen = false;

        snprintf(k, sizeof(k), "taskq:q:task:%s", slow_id);
        pid_s = qstr("HGET %s pid", k, NULL);
        ck_assert_ptr_nonnull(pid_s);
        slow_pid = (pid_t)atol(pid_s);
        free(pid_s);
        /* While it runs, status shows it with its lock and holder. */
        s = status_json();
        json_array_foreach(json_object_get(json_object_get(s, "processing"), "tasks"),
                           i, t) {
            if (strcmp(json_string_value(json_object_get(t, "id")), slow_id) != 0)
                continue;
            seen = true;
            ck_assert(json_is_true(json_object_get(t, "lock_held")));
            ck_assert_msg(json_is_object(json_object_get(t, "holder")),
                          "no holder shown");
            ck_assert_int_eq(json_integer_value(json_object_get(t, "fence")),
                             (json_int_t)slow_fence1);
        }
        ck_assert_msg(seen, "the running slow task is not in status' processing");
        json_decref(s);
    }
    {
        int killed = -1;

        for (int i = 0; i < WORKERS; i++)
            if (W[i] == slow_pid)
                killed = i;
        ck_assert_msg(killed >= 0, "task %s runs under pid %ld, not a worker",
                      slow_id, (long)slow_pid);
        kill(W[killed], SIGKILL);
        waitpid(W[killed], NULL, 0);
        W[killed] = 0;
        /* Its command outlives it (and keeps the task's lock: see
         * test_worker_killed) until it is stopped too, as an operator
         * would stop a hung one. */
        ck_assert_int_gt(slow_cmd, 1);
        kill(-(pid_t)slow_cmd, SIGKILL);
    }

    /* Everything ends: 200 completed, 1 dead. */
    while (qint("LLEN %s", "taskq:q:completed", NULL) < GOOD ||
           qint("LLEN %s", "taskq:q:dead", NULL) < 1) {
        if (h_since(t0) > h_scale(60000)) {
            h_daemon_dump_log(&D);
            ck_abort_msg("after %lld ms: %lld completed, %lld dead, %lld pending,"
                         " %lld processing (worker log: %s)", h_since(t0),
                         qint("LLEN %s", "taskq:q:completed", NULL),
                         qint("LLEN %s", "taskq:q:dead", NULL),
                         qint("LLEN %s", "taskq:q:pending", NULL),
                         qint("LLEN %s", "taskq:q:processing", NULL),
                         tmp_path("workers.log"));
        }
        h_sleep_ms(50);
    }
    fprintf(stderr, "test_taskq: all tasks ended after %lld ms\n", h_since(t0));

    /* The monitor, while the workers still run. */
    {
        static char body[1 << 20];
        int port = h_free_port();
        char listen[64];
        char *mon[] = { (char *)bin(), "monitor", "q", "--redis", RQ, "--server", S,
                        "--listen", listen, NULL };
        char *js;
        json_t *j;

        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        W[WORKERS] = spawn(mon, tmp_path("monitor.log"));
        http_get(port, "/status", body, sizeof(body));
        ck_assert_msg(strncmp(body, "HTTP/1.0 200", 12) == 0, "monitor: %s", body);
        js = strstr(body, "\r\n\r\n");
        ck_assert_ptr_nonnull(js);
        j = json_loads(js + 4, 0, NULL);
        ck_assert_msg(j != NULL, "monitor body: %s", js + 4);
        ck_assert_int_eq(count_of(j, "completed"), GOOD);
        ck_assert_int_eq(count_of(j, "dead"), 1);
        json_decref(j);
        http_get(port, "/other", body, sizeof(body));
        ck_assert_msg(strncmp(body, "HTTP/1.0 404", 12) == 0, "monitor: %s", body);
    }

    for (int i = 0; i <= WORKERS; i++)
        if (W[i] > 0)
            kill(W[i], SIGTERM);
    for (int i = 0; i <= WORKERS; i++) {
        uint64_t ts = h_now_ms();
        int ws = 0;

        while (W[i] > 0 && waitpid(W[i], &ws, WNOHANG) == 0) {
            ck_assert_msg(h_since(ts) < h_scale(5000), "worker %d ignores SIGTERM", i);
            h_sleep_ms(20);
        }
        if (W[i] > 0)
            ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                          "worker %d ended with %d", i, ws);
        W[i] = 0;
    }

    /* Exactly once, with the fence of a successful run. */
    f = fopen(tmp_path("runs.log"), "r");
    ck_assert_ptr_nonnull(f);
    runs[fread(runs, 1, sizeof(runs) - 1, f)] = '\0';
    fclose(f);
    for (int i = 1; i <= GOOD; i++) {
        char id[16], *fence;

        snprintf(id, sizeof(id), "%d", i);
        ck_assert_msg(qint("HGET %s %s", "taskq:q:completions", id) == 1,
                      "task %s completed %lld times", id,
                      qint("HGET %s %s", "taskq:q:completions", id));
        fence = qstr("HGET %s %s", "taskq:q:done", id);
        ck_assert_msg(fence != NULL, "no fence recorded for task %s", id);
        {
            bool found = false;

            for (char *l = runs; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
                char tid[16];
                int att;
                char fen[32];

                if (sscanf(l, "done %15s %d %31s", tid, &att, fen) == 3 &&
                    strcmp(tid, id) == 0 && strcmp(fen, fence) == 0)
                    found = true;
            }
            ck_assert_msg(found, "task %s: fence %s is not that of a successful run",
                          id, fence);
        }
        free(fence);
    }
    {
        char k[64];
        char *v;

        snprintf(k, sizeof(k), "taskq:q:task:%s", slow_id);
        ck_assert_int_eq(qint("HGET %s %s", k, "attempts"), 2);
        ck_assert_int_gt(qint("HGET %s %s", "taskq:q:done", slow_id),
                         (long long)slow_fence1);
        v = qstr("HGET %s %s", k, "last_error");
        ck_assert_msg(v && strstr(v, "stale"), "slow task last_error %s", v);
        free(v);
        snprintf(k, sizeof(k), "taskq:q:task:%d", flaky_idx + 1);
        ck_assert_int_eq(qint("HGET %s %s", k, "attempts"), 3);
        v = qstr("HGET %s %s", k, "last_error");
        ck_assert_msg(v && strcmp(v, "exit status 1") == 0, "flaky last_error %s", v);
        free(v);
        snprintf(k, sizeof(k), "taskq:q:task:%d", helper_idx + 1);
        v = qstr("HGET %s %s", k, "progress");
        ck_assert_msg(v && strcmp(v, "half way") == 0, "helper progress %s", v);
        free(v);
        snprintf(k, sizeof(k), "taskq:q:task:%d", fd_idx + 1);
        v = qstr("HGET %s %s", k, "progress");
        ck_assert_msg(v && strcmp(v, "via fd") == 0, "fd progress %s", v);
        free(v);
        snprintf(k, sizeof(k), "taskq:q:task:%d", GOOD + 1);
        ck_assert_int_eq(qint("HGET %s %s", k, "attempts"), MAX_ATTEMPTS);
        v = qstr("HGET %s %s", k, "state");
        ck_assert_msg(v && strcmp(v, "dead") == 0, "bad task state %s", v);
        free(v);
        v = qstr("LINDEX %s 0", "taskq:q:dead", NULL);
        snprintf(line, sizeof(line), "%d", GOOD + 1);
        ck_assert_msg(v && strcmp(v, line) == 0, "dead list holds %s", v);
        free(v);
        ck_assert_int_eq(qint("HLEN %s", "taskq:q:completions", NULL), GOOD);
    }
    {
        json_t *s = status_json();

        ck_assert_int_eq(count_of(s, "completed"), GOOD);
        ck_assert_int_eq(count_of(s, "dead"), 1);
        ck_assert_int_eq(count_of(s, "pending"), 0);
        ck_assert_int_eq(count_of(s, "processing"), 0);
        ck_assert_int_eq(count_of(s, "retry"), 0);
        json_decref(s);
    }
    redisFree(q);
    fprintf(stderr, "test_taskq: done after %lld ms\n", h_since(t0));
}
END_TEST

/* A lease whose deadline passes unconfirmed (the daemon SIGSTOPped) stops
 * the command before the lock's ttl is over, the task records it, and once
 * the daemon is back the task is recovered and completed once. */
START_TEST(test_lease_lost)
{
    static char out[4096];
    char script[400], pidpath[400], *v;
    char *push[] = { (char *)bin(), "push", "q", "--redis", RQ, "long", NULL };
    char *work[] = { (char *)bin(), "work", "q", "--redis", RQ, "--server", S,
                     "--ttl", "1500", "--keepalive", "0", "--claim-grace", "200",
                     "--recover-interval", "200", "--poll", "200", "--",
                     "/bin/sh", script, NULL };
    uint64_t t0, stopped;
    pid_t cmd;
    FILE *f;
    int st;

    start_all();
    snprintf(script, sizeof(script), "%s", tmp_path("task.sh"));
    snprintf(pidpath, sizeof(pidpath), "%s", tmp_path("long.pid"));
    st = h_run(push, out, sizeof(out));
    ck_assert_msg(st == 0, "push exited %d: %s", st, out);
    W[0] = spawn(work, getenv("TASKQ_TEST_LOG") ? getenv("TASKQ_TEST_LOG")
                                                : tmp_path("workers.log"));
    t0 = h_now_ms();
    while ((f = fopen(pidpath, "r")) == NULL) {
        ck_assert_msg(h_since(t0) < h_scale(10000), "the long task never started");
        h_sleep_ms(20);
    }
    ck_assert_int_eq(fscanf(f, "%d", &cmd), 1);
    fclose(f);
    kill(D.pid, SIGSTOP);
    stopped = h_now_ms();
    /* The command goes before the 1500 ms ttl could let another daemon in. */
    while (kill(cmd, 0) == 0) {
        char stat[64], buf[256];
        FILE *sf;

        snprintf(stat, sizeof(stat), "/proc/%d/stat", (int)cmd);
        sf = fopen(stat, "r");
        if (sf) {
            bool zombie = fgets(buf, sizeof(buf), sf) && strstr(buf, ") Z ");

            fclose(sf);
            if (zombie)
                break;
        }
        if (h_since(stopped) > 1500) {
            kill(D.pid, SIGCONT);
            ck_abort_msg("the command still runs %lld ms after the daemon stopped",
                         h_since(stopped));
        }
        h_sleep_ms(10);
    }
    fprintf(stderr, "test_taskq: command stopped %lld ms after the daemon\n",
            h_since(stopped));
    h_sleep_ms(100);
    v = qstr("HGET %s %s", "taskq:q:task:1", "last_error");
    kill(D.pid, SIGCONT);
    ck_assert_msg(v && strcmp(v, "lease lost while running") == 0,
                  "last_error %s", v);
    free(v);
    /* Back: the same worker reconnects, recovers the task and completes it. */
    while (qint("HGET %s %s", "taskq:q:completions", "1") != 1) {
        ck_assert_msg(h_since(t0) < h_scale(20000), "the long task never completed");
        h_sleep_ms(50);
    }
    ck_assert_int_eq(qint("HGET %s %s", "taskq:q:task:1", "attempts"), 2);
    kill(W[0], SIGTERM);
    waitpid(W[0], &st, 0);
    W[0] = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker ended with %d", st);
    redisFree(q);
}
END_TEST

/* CLOCK_REALTIME in ns, the clock the stamper writes. */
static long long wall_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The number on the last line of a file (0 if there is none). */
static long long last_number(const char *path)
{
    static char buf[1 << 16];
    char *end, *start;
    FILE *f = fopen(path, "r");
    size_t n;

    if (!f)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (!(end = strrchr(buf, '\n')))
        return 0;
    *end = '\0';
    start = strrchr(buf, '\n');
    return strtoll(start ? start + 1 : buf, NULL, 10);
}

/* Does any process of the group pgid run? Zombies do not count (an
 * orphan's exit status may wait for a slow init). */
static bool group_alive(pid_t pgid)
{
    DIR *d;
    struct dirent *e;
    bool alive = false;

    if (kill(-pgid, 0) < 0 && errno == ESRCH)
        return false;
    d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    while (!alive && (e = readdir(d)) != NULL) {
        char path[300], buf[1024], state;
        const char *paren;
        long ppid, pgrp;
        FILE *f;
        size_t n;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        if ((paren = strrchr(buf, ')'))
            && sscanf(paren + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3
            && pgrp == (long)pgid && state != 'Z' && state != 'X')
            alive = true;
    }
    closedir(d);
    return alive;
}

/*
 * Issue 28: a worker SIGKILLed while its task's command runs, the command
 * having started a worker of its own as Python's subprocess.Popen does by
 * default (close_fds, the same process group) that writes every 50 ms for
 * 3 s; the command itself exits at 1 s, the worker is killed at 0.5 s.
 * Another client waiting for the task's lock must not be granted it while
 * the command's worker writes, and must be granted it within a second of
 * its last write. Then the task is stale work: a new worker recovers it
 * and completes it in its second attempt.
 */
START_TEST(test_worker_killed)
{
    static char out[4096];
    char script[400], pidpath[400], stamps[400], *v;
    char *push[] = { (char *)bin(), "push", "q", "--redis", RQ, "cfd", NULL };
    char *work[] = { (char *)bin(), "work", "q", "--redis", RQ, "--server", S,
                     "--ttl", "1500", "--claim-grace", "200",
                     "--recover-interval", "200", "--poll", "200", "--",
                     "/bin/sh", script, NULL };
    long long killed, granted, last;
    struct h_client c;
    uint64_t t0;
    char *line;
    pid_t pgid;
    FILE *f;
    int st;

    start_all();
    snprintf(script, sizeof(script), "%s", tmp_path("task.sh"));
    snprintf(pidpath, sizeof(pidpath), "%s", tmp_path("cfd.pid"));
    snprintf(stamps, sizeof(stamps), "%s", tmp_path("stamps"));
    st = h_run(push, out, sizeof(out));
    ck_assert_msg(st == 0, "push exited %d: %s", st, out);
    W[0] = spawn(work, getenv("TASKQ_TEST_LOG") ? getenv("TASKQ_TEST_LOG")
                                                : tmp_path("workers.log"));
    t0 = h_now_ms();
    while ((f = fopen(pidpath, "r")) == NULL) {
        ck_assert_msg(h_since(t0) < h_scale(10000), "the task never started");
        h_sleep_ms(10);
    }
    ck_assert_int_eq(fscanf(f, "%d", &pgid), 1);
    fclose(f);
    h_connect_tcp_ok(&c, D.port);
    h_expect(&c, "ERR BUSY", "LOCK taskq:q:1 ttl=30000");
    h_sleep_ms(500);
    ck_assert_int_eq(kill(W[0], SIGKILL), 0);
    killed = wall_ns();
    waitpid(W[0], NULL, 0);
    W[0] = 0;

    h_sendf(&c, "LOCK taskq:q:1 ttl=30000 wait=%d\n", h_scale(8000));
    line = h_recv_line(&c, h_scale(10000));
    granted = wall_ns();
    ck_assert_msg(line && h_starts(line, "OK "), "LOCK taskq:q:1 wait=: %s",
                  line ? line : "no answer");
    t0 = h_now_ms();
    while (group_alive(pgid)) {
        ck_assert_msg(h_since(t0) < h_scale(5000), "the command's group %d "
                      "still runs 5 s after the grant", (int)pgid);
        h_sleep_ms(10);
    }
    last = last_number(stamps);
    fprintf(stderr, "test_taskq: after the worker's SIGKILL: its command's "
            "worker's last write %lld ms, another client's grant %lld ms\n",
            (last - killed) / 1000000, (granted - killed) / 1000000);
    ck_assert_msg(last > killed, "the command's worker wrote nothing after "
                  "the SIGKILL");
    ck_assert_msg(last < granted, "another client was granted the task's "
                  "lock while its command's worker still wrote: its last "
                  "write came %lld ms after the grant",
                  (last - granted) / 1000000);
    ck_assert_msg(granted - last < (long long)h_scale(1000) * 1000000,
                  "the lock was granted %lld ms after the last write",
                  (granted - last) / 1000000);
    h_expect(&c, "OK resource=taskq:q:1 ", "UNLOCK taskq:q:1");
    h_close(&c);

    /* Stale work now: recovered and completed by a new worker. */
    W[0] = spawn(work, getenv("TASKQ_TEST_LOG") ? getenv("TASKQ_TEST_LOG")
                                                : tmp_path("workers.log"));
    t0 = h_now_ms();
    while (qint("HGET %s %s", "taskq:q:completions", "1") != 1) {
        ck_assert_msg(h_since(t0) < h_scale(10000), "the task was not "
                      "completed after its worker died");
        h_sleep_ms(50);
    }
    ck_assert_int_eq(qint("HGET %s %s", "taskq:q:task:1", "attempts"), 2);
    v = qstr("HGET %s %s", "taskq:q:task:1", "last_error");
    ck_assert_msg(v && strstr(v, "stale"), "last_error %s", v);
    free(v);
    kill(W[0], SIGTERM);
    waitpid(W[0], &st, 0);
    W[0] = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker ended with %d",
                  st);
    redisFree(q);
}
END_TEST

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);

    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The JSON body of an HTTP answer (the caller decrefs). */
static json_t *http_json(const char *answer)
{
    const char *js = strstr(answer, "\r\n\r\n");
    json_t *j;

    ck_assert_msg(js != NULL, "no end of head in: %s", answer);
    j = json_loads(js + 4, 0, NULL);
    ck_assert_msg(j != NULL, "body is not JSON: %s", js + 4);
    return j;
}

/* Finished tasks' running_ms stays what their run took (it kept growing);
 * the monitor answers HEAD as GET without the body, 405 names what it
 * takes, and a queue Redis that goes away is a 503 (the monitor used to
 * exit), and a 200 again once it is back. */
START_TEST(test_status_and_monitor)
{
    static char out[65536], body[1 << 20];
    char script[400], listen[64];
    char *push[] = { (char *)bin(), "push", "q", "--redis", RQ, "n1", "n2",
                     NULL };
    char *work[] = { (char *)bin(), "work", "q", "--redis", RQ, "--server", S,
                     "--max-tasks", "2", "--", "/bin/sh", script, NULL };
    char *mon[] = { (char *)bin(), "monitor", "q", "--redis", RQ, "--server",
                    S, "--listen", listen, NULL };
    int port = h_free_port(), st;
    json_t *s1, *s2, *t, *j;
    size_t i;

    start_all();
    snprintf(script, sizeof(script), "%s", tmp_path("task.sh"));
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    st = h_run(push, out, sizeof(out));
    ck_assert_msg(st == 0, "push exited %d: %s", st, out);
    st = h_run(work, out, sizeof(out));
    ck_assert_msg(st == 0, "work --max-tasks 2 exited %d: %s", st, out);

    s1 = status_json();
    ck_assert_int_eq(count_of(s1, "completed"), 2);
    h_sleep_ms(300);
    s2 = status_json();
    json_array_foreach(json_object_get(json_object_get(s1, "completed"), "tasks"),
                       i, t) {
        json_t *t2 = json_array_get(json_object_get(json_object_get(s2,
                                    "completed"), "tasks"), i);
        json_int_t ran = json_integer_value(json_object_get(t, "running_ms"));

        ck_assert_msg(json_is_integer(json_object_get(t, "running_ms")),
                      "completed task without running_ms");
        ck_assert_int_eq(ran, json_integer_value(json_object_get(t, "finished")) -
                              json_integer_value(json_object_get(t, "started")));
        ck_assert_int_eq(ran, json_integer_value(json_object_get(t2, "running_ms")));
    }
    json_decref(s1);
    json_decref(s2);

    W[0] = spawn(mon, tmp_path("monitor.log"));
    http_get(port, "/status", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 200", 12) == 0, "GET: %s", body);
    j = http_json(body);
    ck_assert_int_eq(count_of(j, "completed"), 2);
    json_decref(j);
    http_req(port, "HEAD", "/status", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 200", 12) == 0 &&
                  strstr(body, "Content-Type: application/json") &&
                  strstr(body, "Content-Length: ") &&
                  ends_with(body, "\r\n\r\n"), "HEAD /status: %s", body);
    http_req(port, "HEAD", "/other", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 404", 12) == 0 &&
                  ends_with(body, "\r\n\r\n"), "HEAD /other: %s", body);
    http_req(port, "POST", "/status", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 405", 12) == 0 &&
                  strstr(body, "Allow: GET, HEAD\r\n"), "POST: %s", body);

    /* The queue's Redis goes away: 503, twice, and the monitor lives. */
    h_redis_kill(&R[0]);
    for (int k = 0; k < 2; k++) {
        http_get(port, "/status", body, sizeof(body));
        ck_assert_msg(strncmp(body, "HTTP/1.0 503", 12) == 0, "GET #%d with "
                      "Redis down: %s", k, body);
        j = http_json(body);
        ck_assert_str_eq(json_string_value(json_object_get(j, "queue")), "q");
        ck_assert_msg(h_starts(json_string_value(json_object_get(j, "error")),
                               "redis: "), "error: %s", body);
        json_decref(j);
    }
    http_req(port, "HEAD", "/status", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 503", 12) == 0, "HEAD: %s", body);
    ck_assert_msg(waitpid(W[0], &st, WNOHANG) == 0, "the monitor exited (%d)",
                  st);
    h_redis_restart(&R[0]);
    http_get(port, "/status", body, sizeof(body));
    ck_assert_msg(strncmp(body, "HTTP/1.0 200", 12) == 0, "GET after the "
                  "restart: %s", body);
    json_decref(http_json(body));
    redisFree(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("taskq");
    TCase *tc = tcase_create("queue");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 150);
    tcase_add_test(tc, test_queue);
    tcase_add_test(tc, test_lease_lost);
    tcase_add_test(tc, test_status_and_monitor);
    suite_add_tcase(s, tc);
    /* Issue 28, a case of its own: CK_RUN_CASE=keeper. */
    tc = tcase_create("keeper");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_worker_killed);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
