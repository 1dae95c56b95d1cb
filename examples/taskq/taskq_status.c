/*
 * redlockd-taskq status and monitor: the queue as one JSON object (each
 * list's count and oldest age, its first tasks, and for those in
 * processing their locks, holders and whether they are suspect), printed
 * as text or JSON, or answered over HTTP to GET /status (taskq_shared.h
 * lists the files).
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "redlockd.h"
#include "taskq_shared.h"

/* ---- status ---- */

static long long hget_ll(redisReply *h, const char *field, long long dflt)
{
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (h->element[i]->str && strcmp(h->element[i]->str, field) == 0 &&
            h->element[i + 1]->str)
            return strtoll(h->element[i + 1]->str, NULL, 10);
    return dflt;
}

/* How long the task's run took: until now while it runs, until it
 * finished once completed or dead (not growing any more); null when it
 * has not run, or waits for another attempt (the last one's end is not
 * recorded). */
static json_t *task_running_ms(redisReply *h, int64_t now)
{
    long long started = hget_ll(h, "started", 0);
    long long finished = hget_ll(h, "finished", 0);
    const char *state = NULL;

    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (h->element[i]->str && strcmp(h->element[i]->str, "state") == 0)
            state = h->element[i + 1]->str;
    if (started <= 0 || !state)
        return json_null();
    if (strcmp(state, "running") == 0)
        return json_integer(now > started ? now - started : 0);
    if (finished >= started)
        return json_integer(finished - started);
    return json_null();
}

/* A task's hash as a JSON object of strings (numbers where they are). */
static json_t *task_json(const struct cfg *c, const char *id, int64_t now)
{
    redisReply *h = queue_cmd("HGETALL %s", queue_task_key(c, id));
    json_t *o = json_object();
    long long t;

    json_object_set_new(o, "id", json_string(id));
    for (size_t i = 0; h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2) {
        const char *f = h->element[i]->str, *v = h->element[i + 1]->str;
        char *end;
        long long n;

        if (!f || !v)
            continue;
        n = strtoll(v, &end, 10);
        if (*v && *end == '\0' && strcmp(f, "payload") != 0)
            json_object_set_new(o, f, json_integer(n));
        else
            json_object_set_new(o, f, json_string(v));
    }
    if ((t = hget_ll(h, "created", 0)) > 0)
        json_object_set_new(o, "age_ms", json_integer(now - t));
    json_t *ran = task_running_ms(h, now);

    if (json_is_null(ran))
        json_decref(ran);
    else
        json_object_set_new(o, "running_ms", ran);
    freeReplyObject(h);
    return o;
}

/* One list (or the delayed set): count, oldest age and up to `show` tasks. */
static json_t *list_json(const struct cfg *c, const char *name, bool zset,
                         int show, int64_t now, bool with_locks)
{
    json_t *o = json_object(), *arr = json_array();
    long long n = queue_cmd_int(zset ? "ZCARD %s" : "LLEN %s",
                                queue_key(c, name));
    long long oldest = -1;
    redisReply *r;

    /* Lists grow on the left, so the right end is the oldest. */
    r = zset ? queue_cmd("ZRANGE %s 0 %d", queue_key(c, name), show - 1)
             : queue_cmd("LRANGE %s -%d -1", queue_key(c, name), show);
    for (size_t i = r->type == REDIS_REPLY_ARRAY ? r->elements : 0; i-- > 0;) {
        size_t k = zset ? r->elements - 1 - i : i;
        const char *id = r->element[k]->str;
        json_t *t;

        if (!id)
            continue;
        t = task_json(c, id, now);
        if (with_locks) {
            char res[600];
            json_t *st;

            lock_resource(c, id, res, sizeof(res));
            st = lock_status(res);
            if (st) {
                json_t *held = json_object_get(st, "held");
                json_t *holder = json_object_get(st, "holder");
                json_int_t hms = json_integer_value(json_object_get(holder, "held_ms"));

                json_object_set(t, "lock_held", held ? held : json_false());
                json_object_set(t, "holder", holder ? holder : json_null());
                json_object_set_new(t, "suspect", json_boolean(
                    hms > (json_int_t)(c->suspect_factor * c->expected_ms)));
                json_decref(st);
            }
        }
        if (json_integer_value(json_object_get(t, "age_ms")) > oldest)
            oldest = json_integer_value(json_object_get(t, "age_ms"));
        json_array_append_new(arr, t);
    }
    freeReplyObject(r);
    json_object_set_new(o, "count", json_integer(n));
    if (oldest >= 0)
        json_object_set_new(o, "oldest_age_ms", json_integer(oldest));
    json_object_set_new(o, "tasks", arr);
    return o;
}

static json_t *status_json(const struct cfg *c)
{
    int64_t now = wall_ms();
    json_t *o = json_object();

    json_object_set_new(o, "queue", json_string(c->queue));
    json_object_set_new(o, "pending", list_json(c, "pending", false, 20, now, false));
    json_object_set_new(o, "processing",
                        list_json(c, "processing", false, 100, now, lk != NULL));
    json_object_set_new(o, "retry", list_json(c, "delayed", true, 20, now, false));
    json_object_set_new(o, "completed", list_json(c, "completed", false, 10, now, false));
    json_object_set_new(o, "dead", list_json(c, "dead", false, 20, now, false));
    json_object_set_new(o, "daemon", json_boolean(lk != NULL));
    return o;
}

static void print_status(const struct cfg *c, json_t *s)
{
    static const char *const lists[] = { "pending", "processing", "retry",
                                         "completed", "dead" };

    printf("queue %s\n", c->queue);
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        json_t *l = json_object_get(s, lists[i]), *t;
        size_t k;

        printf("%-10s %6lld", lists[i],
               (long long)json_integer_value(json_object_get(l, "count")));
        if (json_object_get(l, "oldest_age_ms"))
            printf("  oldest %.1fs", json_integer_value(
                       json_object_get(l, "oldest_age_ms")) / 1000.0);
        putchar('\n');
        if (strcmp(lists[i], "completed") == 0)
            continue;
        json_array_foreach(json_object_get(l, "tasks"), k, t) {
            json_t *holder = json_object_get(t, "holder");

            printf("  %-8s attempts=%lld", json_string_value(json_object_get(t, "id")),
                   (long long)json_integer_value(json_object_get(t, "attempts")));
            if (strcmp(lists[i], "processing") == 0) {
                json_t *ran = json_object_get(t, "running_ms");
                char running[32] = "-";

                if (json_is_integer(ran))
                    snprintf(running, sizeof(running), "%.1fs",
                             json_integer_value(ran) / 1000.0);
                printf(" worker=%s fence=%lld running=%s lock=%s",
                       json_string_value(json_object_get(t, "worker")) ?
                       json_string_value(json_object_get(t, "worker")) : "-",
                       (long long)json_integer_value(json_object_get(t, "fence")),
                       running,
                       json_is_true(json_object_get(t, "lock_held")) ? "held" : "FREE");
                if (json_is_object(holder) && json_object_get(holder, "name"))
                    printf(" holder=%s", json_string_value(json_object_get(holder, "name")));
                if (json_is_true(json_object_get(t, "suspect")))
                    printf(" SUSPECT");
            }
            if (json_object_get(t, "last_error"))
                printf(" last_error=\"%s\"",
                       json_string_value(json_object_get(t, "last_error")));
            putchar('\n');
        }
    }
}

static void status_connect(const struct cfg *c)
{
    struct redlockd_opts o;
    struct redlockd_error err;

    queue_connect(c);
    memset(&o, 0, sizeof(o));
    o.server = c->server;
    o.name = "taskq-status";
    o.connect_timeout_ms = 2000;
    if (redlockd_connect(&lk, &o, &err) < 0) {
        fprintf(stderr, "taskq: redlockd: %s (locks not shown)\n", err.msg);
        lk = NULL;
    }
}

int cmd_status(struct cfg *c)
{
    json_t *s;

    status_connect(c);
    s = status_json(c);
    if (c->json) {
        char *txt = json_dumps(s, JSON_COMPACT);

        printf("%s\n", txt);
        free(txt);
    } else {
        print_status(c, s);
    }
    json_decref(s);
    redlockd_close(lk);
    queue_close();
    return 0;
}

/* ---- monitor: GET /status ---- */

/* One answer and its head; HEAD gets the head alone (with the length the
 * body would have). */
static void http_reply(int fd, bool head_only, const char *code,
                       const char *ctype, const char *extra, const char *body)
{
    char head[512];
    size_t blen = strlen(body);
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "%sConnection: close\r\n\r\n", code, ctype, blen, extra);

    if (write(fd, head, (size_t)n) == n && !head_only)
        (void)!write(fd, body, blen);
}

/* GET /status: 200 with the status JSON, or 503 with {"queue", "error"}
 * while the queue's Redis does not answer (the connection is made again
 * for the next request). */
static void monitor_status(struct cfg *c, int fd, bool head_only)
{
    json_t *s;
    char *txt;
    const char *error;

    queue_error_clear();
    if (!queue_connected())
        (void)queue_connect(c);
    if (lk && redlockd_ping(lk) < 0) {
        redlockd_close(lk);
        lk = NULL;
    }
    s = queue_connected() ? status_json(c) : NULL;
    error = queue_error();
    if (error) {
        json_decref(s);
        s = json_pack("{s:s, s:s}", "queue", c->queue, "error", error);
        queue_close();
    }
    txt = json_dumps(s, JSON_COMPACT);
    if (!txt)
        die(EXIT_SOFTWARE, "out of memory");
    http_reply(fd, head_only, error ? "503 Service Unavailable"
               : "200 OK", "application/json", "", txt);
    free(txt);
    json_decref(s);
}

/* Read the request head (bounded: 2 s, 2 KiB) and answer it. */
static void monitor_request(struct cfg *c, int fd)
{
    char req[2048], method[16] = "", path[256] = "";
    size_t len = 0;
    bool head;

    while (len < sizeof(req) - 1) {
        struct pollfd q = { fd, POLLIN, 0 };
        ssize_t k;

        if (poll(&q, 1, 2000) <= 0)
            break;
        k = read(fd, req + len, sizeof(req) - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
            break;
    }
    req[len] = '\0';
    if (sscanf(req, "%15s %255[^ ?\r\n]", method, path) != 2) {
        http_reply(fd, false, "400 Bad Request", "text/plain", "",
                   "bad request\n");
        return;
    }
    head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0)
        http_reply(fd, false, "405 Method Not Allowed", "text/plain",
                   "Allow: GET, HEAD\r\n", "GET or HEAD only\n");
    else if (strcmp(path, "/status") == 0)
        monitor_status(c, fd, head);
    else
        http_reply(fd, head, "404 Not Found", "text/plain", "",
                   "not found\n");
}

int cmd_monitor(struct cfg *c)
{
    char host[256];
    const char *colon;
    struct sockaddr_in sin;
    int ls, one = 1;

    if (!c->listen || !(colon = strrchr(c->listen, ':')))
        die(EXIT_USAGE, "monitor: --listen HOST:PORT is required");
    snprintf(host, sizeof(host), "%.*s", (int)(colon - c->listen), c->listen);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
        die(EXIT_USAGE, "monitor: bad address %s", c->listen);
    ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ls < 0 || bind(ls, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        listen(ls, 16) < 0)
        die(EXIT_UNAVAILABLE, "monitor: %s: %s", c->listen, strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    /* The monitor reports a Redis that is down (503); it does not die. */
    queue_set_soft(true);
    status_connect(c);
    if (queue_error())
        fprintf(stderr, "taskq: monitor: %s (answering 503 until it is "
                "back)\n", queue_error());
    fprintf(stderr, "taskq: monitor of %s on http://%s/status\n", c->queue,
            c->listen);
    while (!stop_flag) {
        struct pollfd p = { ls, POLLIN, 0 };
        int fd;

        if (poll(&p, 1, 500) <= 0)
            continue;
        fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        monitor_request(c, fd);
        close(fd);
    }
    close(ls);
    redlockd_close(lk);
    queue_close();
    return 0;
}
