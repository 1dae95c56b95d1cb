/*
 * redlockctl top: the resources held and waited for longest, from the
 * daemon's TOP, refreshed in place on a terminal or written as plain text
 * (see below).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"

/* ---- top: what is held and waited for longest ----------------------------
 * `top` asks the daemon's TOP every CTL_TOP_REFRESH_MS and shows its
 * resources as top(1) shows processes: the longest wait first, then the
 * longest hold. On a terminal it takes the alternate screen, redraws it in
 * place, fits the rows to its height and each line to its width, and
 * reads keys without echo (q quits); the screen, the cursor and the
 * terminal's modes are put back however it ends (q, -n, SIGINT, SIGTERM,
 * SIGHUP, a lost daemon). Anywhere else (a pipe, a file) it writes plain
 * text, no escape codes: each refresh a block ending in a blank line, or
 * with --json TOP's answer, one line each. -n N stops after N refreshes. */
#define CTL_TOP_REFRESH_MS 1000
#define CTL_TOP_MAX 100                 /* the most TOP lists */
#define CTL_TOP_HEAD_LINES 3            /* title, blank, column names */

struct ctl_top {
    bool screen;                /* stdout is a terminal: redraw in place */
    bool keys;                  /* stdin too: its keys are read */
    struct termios saved;       /* stdin's modes before, when keys */
    unsigned rows, cols;
};

static volatile sig_atomic_t ctl_top_stop, ctl_top_resized;

static void ctl_top_on_signal(int sig)
{
    if (sig == SIGWINCH)
        ctl_top_resized = 1;
    else
        ctl_top_stop = 1;
}

/* The handlers, with the signals blocked but in ppoll (no wake-up lost
 * between a look at the flags and the wait); *old gets the mask before. */
static void ctl_top_signals(sigset_t *old)
{
    static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGWINCH };
    struct sigaction sa = { .sa_handler = ctl_top_on_signal };
    sigset_t block;

    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        sigaddset(&block, sigs[i]);
        sigaction(sigs[i], &sa, NULL);
    }
    sigprocmask(SIG_BLOCK, &block, old);
}

static void ctl_top_size(struct ctl_top *t)
{
    struct winsize ws;

    t->rows = 24;
    t->cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 &&
        ws.ws_col > 0) {
        t->rows = ws.ws_row;
        t->cols = ws.ws_col;
    }
}

/* A terminal: keys one by one without echo, the alternate screen, no
 * cursor. */
static void ctl_top_screen_on(struct ctl_top *t)
{
    struct termios raw;

    t->screen = isatty(STDOUT_FILENO);
    t->keys = t->screen && isatty(STDIN_FILENO) &&
              tcgetattr(STDIN_FILENO, &t->saved) == 0;
    if (t->keys) {
        raw = t->saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    if (t->screen) {
        fputs("\033[?1049h\033[?25l", stdout);
        ctl_top_size(t);
    }
}

static void ctl_top_screen_off(const struct ctl_top *t)
{
    if (t->screen)
        fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    if (t->keys)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

/* How many resources to ask for: as many as fit on the screen. */
static uint32_t ctl_top_limit(const struct ctl_top *t)
{
    unsigned fit;

    if (!t->screen)
        return CTL_TOP_MAX;
    fit = t->rows > CTL_TOP_HEAD_LINES + 1 ? t->rows - CTL_TOP_HEAD_LINES - 1
                                           : 1;
    return fit < CTL_TOP_MAX ? fit : CTL_TOP_MAX;
}

/* One refresh as text: the title, then a table of TOP's resources. */
static void ctl_top_frame(FILE *out, json_t *root, bool screen)
{
    struct ctl_table tb = { .ncols = 7,
                            .right = (1u << 1) | (1u << 2) | (1u << 3) |
                                     (1u << 4) };
    json_t *list = json_object_get(root, "resources"), *r;
    char b[7][128], clock[16];
    time_t now = time(NULL);
    size_t i;

    strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
    fprintf(out, "redlockd %s: %" JSON_INTEGER_FORMAT " resource%s held or "
            "waited for, %zu shown, %s%s\n\n",
            ctl_text(root, "daemon", b[0], sizeof(b[0])),
            ctl_int(root, "total"), ctl_int(root, "total") == 1 ? "" : "s",
            json_array_size(list), clock, screen ? " (q: quit)" : "");
    ctl_table_add(&tb, (const char *const[]){ "RESOURCE", "WAITERS",
                                              "LONGEST WAIT", "HOLDERS",
                                              "HELD FOR", "HOLDER", "MODE" });
    json_array_foreach(list, i, r) {
        json_t *holder = json_object_get(r, "holder");
        const char *row[7] = {
            ctl_text(r, "resource", b[0], sizeof(b[0])),
            ctl_text(r, "waiters", b[1], sizeof(b[1])),
            ctl_int(r, "waiters") ? ctl_duration(json_object_get(
                r, "waited_ms"), b[2], sizeof(b[2])) : "-",
            ctl_text(r, "holders", b[3], sizeof(b[3])),
            json_is_object(holder) ? ctl_duration(json_object_get(
                holder, "held_ms"), b[4], sizeof(b[4])) : "-",
            ctl_session_name(holder, b[5], sizeof(b[5])),
            ctl_text(r, "mode", b[6], sizeof(b[6])),
        };
        ctl_table_add(&tb, row);
    }
    ctl_table_fprint(out, &tb);
}

/* The frame over the last one: from the top left, each line cut to the
 * width and cleared to its end, the rest of the screen cleared. */
static void ctl_top_draw(const struct ctl_top *t, const char *text)
{
    unsigned row = 0;

    fputs("\033[H", stdout);
    while (*text && row + 1 < t->rows) {
        size_t len = strcspn(text, "\n");

        fprintf(stdout, "%.*s\033[K\n",
                (int)(len < t->cols ? len : t->cols), text);
        text += len + (text[len] == '\n');
        row++;
    }
    fputs("\033[J", stdout);
}

static int ctl_top_show(const struct ctl *c, const struct ctl_top *t,
                        const char *json)
{
    json_t *root;
    char *text = NULL;
    size_t len = 0;
    FILE *mem;

    if (c->json) {
        printf("%s\n", json);
        return 0;
    }
    if (!(root = ctl_parse_json(json)))
        return EX_UNAVAILABLE;
    if (!t->screen) {
        ctl_top_frame(stdout, root, false);
        putchar('\n');
    } else if ((mem = open_memstream(&text, &len))) {
        ctl_top_frame(mem, root, true);
        fclose(mem);
        ctl_top_draw(t, text);
        free(text);
    }
    json_decref(root);
    return 0;
}

/* Until the next refresh is due: false to stop (q, a signal). A key other
 * than q, or a new size, redraws at once. */
static bool ctl_top_wait(struct ctl_top *t, const sigset_t *mask)
{
    double until = ctl_now_ms() + CTL_TOP_REFRESH_MS;
    struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
    char key;

    while (!ctl_top_stop) {
        long left = (long)(until - ctl_now_ms());
        struct timespec ts = { left / 1000, left % 1000 * 1000000L };

        if (ctl_top_resized) {
            ctl_top_resized = 0;
            ctl_top_size(t);
            return true;
        }
        if (left <= 0)
            return true;
        if (ppoll(&p, t->keys ? 1 : 0, &ts, mask) <= 0)
            continue;
        if (read(STDIN_FILENO, &key, 1) == 1)
            return key != 'q' && key != 'Q';
    }
    return false;
}

int ctl_top(struct ctl *c)
{
    struct redlockd_opts o = { 0 };
    struct ctl_top t = { 0 };
    struct redlockd *h;
    sigset_t mask;
    char *json;
    int rc;

    rc = ctl_connect(c, &o, &h);
    if (rc != 0)
        return rc;
    ctl_top_signals(&mask);
    if (!c->json)
        ctl_top_screen_on(&t);
    for (unsigned n = 0; rc == 0 && !ctl_top_stop; ) {
        json = NULL;
        rc = redlockd_top(h, ctl_top_limit(&t), &json);
        if (rc < 0) {
            ctl_top_screen_off(&t);
            t.screen = t.keys = false;
            rc = ctl_report("top", rc, redlockd_last_error(h)->msg);
        } else {
            rc = ctl_top_show(c, &t, json);
        }
        free(json);
        fflush(stdout);
        if (rc != 0 || (c->iterations && ++n >= c->iterations) ||
            !ctl_top_wait(&t, &mask))
            break;
    }
    ctl_top_screen_off(&t);
    redlockd_close(h);
    return rc;
}
