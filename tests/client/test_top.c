/*
 * test_top: `redlockctl top` against the real redlockd and a real
 * redis-server node.
 *
 * Three resources are set up on the daemon through raw protocol clients:
 * q:b waited for the longest, q:a waited for less, q:c held with nobody
 * waiting. Checked, against redlockctl(1):
 *   - `top -n 1` with stdout a pipe prints one plain block (no escape
 *     byte): the title with the daemon's id and the total, the column
 *     names, the resources in the order q:b, q:a, q:c with their waiters,
 *     holders and holder's name, and a blank line; `-n 2` two blocks,
 *     `--json` TOP's answer per refresh; arguments and -n elsewhere are
 *     usage errors; `status` lists the waiters;
 *   - on a terminal (a pseudo-terminal of forkpty, of a set size), the
 *     screen is redrawn in place every second: the test reads what
 *     arrives, takes the screen after a refresh, and finds q:b on the first
 *     row of the table, no line wider than the terminal and no more lines
 *     than its rows; meanwhile the terminal does not echo or wait for
 *     lines; `q` (and, in a second run, SIGINT) ends it with status 0,
 *     the cursor shown, the alternate screen left and the terminal's modes
 *     as they were.
 */
#include <check.h>
#include <errno.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "harness.h"

#define EXIT_USAGE 64
#define SCREEN_ROWS 20
#define SCREEN_COLS 100

static struct h_cluster K;
static struct h_daemon *const D = &K.daemons[0];
static char S[64];              /* the daemon as -s takes it */

static const char *ctl_bin(void)
{
    const char *bin = getenv("REDLOCKCTL_BIN");

    ck_assert_msg(bin && *bin, "REDLOCKCTL_BIN is not set");
    return bin;
}

/* q:a and q:c held by a session named holder-1; q:b held by it as well,
 * and waited for by two clients, 300 ms before anyone waits for q:a. */
static void setup_locks(void)
{
    struct h_client *a, *b, *c, *d;

    h_cluster_daemon(&K, 0, NULL, h_scale(5000));
    snprintf(S, sizeof(S), "127.0.0.1:%d", D->port);
    a = h_cluster_client(&K, 0, 0);
    h_expect(a, "OK ", "HELLO name=holder-1");
    h_expect(a, "OK ", "LOCK q:a");
    h_expect(a, "OK ", "LOCK q:b");
    h_expect(a, "OK ", "LOCK q:c");
    b = h_cluster_client(&K, 1, 0);
    c = h_cluster_client(&K, 2, 0);
    h_sendf(b, "LOCK q:b wait=60000\n");
    h_sendf(c, "LOCK q:b wait=60000\n");
    h_sleep_ms(300);
    d = h_cluster_client(&K, 3, 0);
    h_sendf(d, "LOCK q:a wait=60000\n");
    h_sleep_ms(50);
}

/* The line of out that starts with prefix, or NULL. */
static const char *line_of(const char *out, const char *prefix)
{
    size_t n = strlen(prefix);

    for (const char *p = out; p && *p; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, prefix, n) == 0)
            return p;
    }
    return NULL;
}

/* The words of a table row, at most max. */
static int row_words(const char *line, char words[][64], int max)
{
    int n = 0;

    while (*line && *line != '\n' && n < max) {
        size_t len;

        line += strspn(line, " ");
        len = strcspn(line, " \n");
        if (len == 0)
            break;
        snprintf(words[n++], 64, "%.*s", (int)len, line);
        line += len;
    }
    return n;
}

START_TEST(top_once_plain)
{
    static char out[65536];
    char w[12][64];
    const char *title, *head, *rb, *ra, *rc;
    int st, n;

    setup_locks();
    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "top", "-n",
                                "1", NULL }, out, sizeof(out));
    ck_assert_msg(st == 0, "top -n 1: status %d: %s", st, out);
    ck_assert_msg(!strchr(out, '\033'), "an escape code in plain output: %s",
                  out);
    title = line_of(out, "redlockd ");
    ck_assert_msg(title == out, "no title first: %s", out);
    ck_assert_msg(strstr(title, ": 3 resources held or waited for, 3 shown"),
                  "title: %s", out);
    head = line_of(out, "RESOURCE ");
    ck_assert_msg(head && strstr(head, "WAITERS") && strstr(head, "HOLDER"),
                  "no column names: %s", out);
    rb = line_of(out, "q:b ");
    ra = line_of(out, "q:a ");
    rc = line_of(out, "q:c ");
    ck_assert_msg(rb && ra && rc && head < rb && rb < ra && ra < rc,
                  "not q:b, q:a, q:c after the head: %s", out);
    /* q:b: 2 waiters, one holder, its name, exclusive. */
    n = row_words(rb, w, 12);
    ck_assert_msg(n >= 8 && strcmp(w[1], "2") == 0, "q:b row: %.200s", rb);
    ck_assert_msg(strstr(rb, "(holder-1)") && strstr(rb, "exclusive"),
                  "q:b row: %.200s", rb);
    n = row_words(rc, w, 12);
    ck_assert_msg(n >= 2 && strcmp(w[1], "0") == 0 && strcmp(w[2], "-") == 0,
                  "q:c row: %.200s", rc);
    /* One block, then a blank line. */
    ck_assert_msg(strlen(out) > 2 && strcmp(out + strlen(out) - 2, "\n\n")
                  == 0, "no blank line at the end: %s", out);
    ck_assert_msg(!line_of(rc, "redlockd "), "two blocks: %s", out);

    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "top", "-n",
                                "2", NULL }, out, sizeof(out));
    ck_assert_msg(st == 0, "top -n 2: status %d: %s", st, out);
    title = line_of(out, "redlockd ");
    ck_assert_msg(title && line_of(title + 1, "redlockd "),
                  "not two blocks: %s", out);

    /* status names this daemon's waiters, the first in line first. */
    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "status", "q:b",
                                NULL }, out, sizeof(out));
    ck_assert_msg(st == 0, "status: %d %s", st, out);
    rb = line_of(out, "waiting ");
    ck_assert_msg(rb && strstr(rb, " for ") && line_of(rb + 1, "          s"),
                  "no two waiters: %s", out);
}
END_TEST

START_TEST(top_json_and_usage)
{
    static char out[65536];
    json_error_t jerr;
    json_t *o, *r;
    int st;

    setup_locks();
    st = h_run((char *const[]){ (char *)ctl_bin(), "--json", "-s", S, "top",
                                "-n", "1", NULL }, out, sizeof(out));
    ck_assert_msg(st == 0, "top --json: status %d: %s", st, out);
    o = json_loads(out, 0, &jerr);
    ck_assert_msg(json_is_object(o), "not JSON (%s): %s", jerr.text, out);
    ck_assert_int_eq(h_json_int(o, "total"), 3);
    r = json_object_get(o, "resources");
    ck_assert_str_eq(h_json_str(json_array_get(r, 0), "resource"), "q:b");
    ck_assert_str_eq(h_json_str(json_array_get(r, 1), "resource"), "q:a");
    ck_assert_str_eq(h_json_str(json_array_get(r, 2), "resource"), "q:c");
    json_decref(o);

    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "top", "q:a",
                                NULL }, out, sizeof(out));
    ck_assert_msg(st == EXIT_USAGE && strstr(out, "takes no arguments"),
                  "top q:a: %d %s", st, out);
    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "top", "-n", "0",
                                NULL }, out, sizeof(out));
    ck_assert_msg(st == EXIT_USAGE, "top -n 0: %d %s", st, out);
    st = h_run((char *const[]){ (char *)ctl_bin(), "-s", S, "status", "q:a",
                                "-n", "1", NULL }, out, sizeof(out));
    ck_assert_msg(st == EXIT_USAGE && strstr(out, "an option of top"),
                  "status -n: %d %s", st, out);
}
END_TEST

/* ---- on a terminal ------------------------------------------------------- */

struct term {
    pid_t pid;
    int fd;                     /* the pseudo-terminal's master side */
    char out[262144];           /* everything it wrote */
    size_t len;
};

static void term_start(struct term *t)
{
    struct winsize ws = { .ws_row = SCREEN_ROWS, .ws_col = SCREEN_COLS };

    t->len = 0;
    t->out[0] = '\0';
    t->pid = forkpty(&t->fd, NULL, NULL, &ws);
    ck_assert_msg(t->pid >= 0, "forkpty: %s", strerror(errno));
    if (t->pid == 0) {
        execl(ctl_bin(), "redlockctl", "-s", S, "top", (char *)NULL);
        _exit(127);
    }
}

/* Read what the terminal got for ms (or until it is closed). */
static void term_read(struct term *t, int ms)
{
    uint64_t t0 = h_now_ms();

    while (h_since(t0) < ms) {
        struct timeval tv = { 0, 20000 };
        fd_set rd;
        ssize_t n;

        FD_ZERO(&rd);
        FD_SET(t->fd, &rd);
        if (select(t->fd + 1, &rd, NULL, NULL, &tv) <= 0)
            continue;
        n = read(t->fd, t->out + t->len, sizeof(t->out) - 1 - t->len);
        if (n <= 0)
            break;          /* EIO: the other side is closed */
        t->len += (size_t)n;
        t->out[t->len] = '\0';
    }
}

/* How many times the screen was drawn from its top left. */
static int term_frames(const struct term *t)
{
    int n = 0;

    for (const char *p = t->out; (p = strstr(p, "\033[H")); p += 3)
        n++;
    return n;
}

/* The last complete frame as plain lines (escape sequences and CRs
 * taken out) in screen, and how many lines it has. */
static int term_screen(const struct term *t, char *screen, size_t size,
                       int *widest)
{
    const char *end = t->out + t->len, *start = NULL, *last = NULL;
    int lines = 0, width = 0;
    size_t k = 0;

    for (const char *p = t->out; (p = strstr(p, "\033[H")); p += 3) {
        start = last;
        last = p;
    }
    /* The last frame may still be arriving: take the one before it. */
    ck_assert_msg(start, "fewer than two frames: %s", t->out);
    end = last;
    for (const char *p = start + 3; p < end && k + 1 < size; p++) {
        if (*p == '\033') {
            while (p < end && !((*p >= 'A' && *p <= 'Z') ||
                                (*p >= 'a' && *p <= 'z')))
                p++;
            continue;
        }
        if (*p == '\r')
            continue;
        if (*p == '\n') {
            lines++;
            width = 0;
        } else if (++width > *widest) {
            *widest = width;
        }
        screen[k++] = *p;
    }
    screen[k] = '\0';
    return lines;
}

static tcflag_t term_lflag(const struct term *t)
{
    struct termios tio;

    ck_assert_int_eq(tcgetattr(t->fd, &tio), 0);
    return tio.c_lflag & (ICANON | ECHO);
}

/* Stop it with q (or sig), and see it leave the terminal as it was. */
static void term_stop(struct term *t, int sig)
{
    static const char restore[] = "\033[?25h\033[?1049l";
    uint64_t t0 = h_now_ms();
    int st;

    if (sig)
        kill(t->pid, sig);
    else
        ck_assert_int_eq(write(t->fd, "q", 1), 1);
    while (waitpid(t->pid, &st, WNOHANG) == 0) {
        term_read(t, 50);
        if (h_since(t0) > h_scale(3000)) {
            kill(t->pid, SIGKILL);
            waitpid(t->pid, &st, 0);
            ck_abort_msg("top still running %d ms after %s", h_scale(3000),
                         sig ? "a signal" : "q");
        }
    }
    term_read(t, 100);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "top ended with %#x", st);
    ck_assert_msg(t->len >= sizeof(restore) - 1 &&
                  memcmp(t->out + t->len - (sizeof(restore) - 1), restore,
                         sizeof(restore) - 1) == 0,
                  "the screen and cursor were not put back: ...%s",
                  t->out + (t->len > 80 ? t->len - 80 : 0));
    ck_assert_msg(term_lflag(t) == (ICANON | ECHO),
                  "the terminal's modes were not put back");
    close(t->fd);
}

START_TEST(top_on_a_terminal)
{
    static struct term t;
    static char screen[65536];
    char w[12][64];
    const char *head, *first;
    int lines, widest = 0;
    uint64_t t0;

    setup_locks();
    term_start(&t);
    /* A frame at once, then one a second: read until a refresh came. */
    t0 = h_now_ms();
    while (term_frames(&t) < 3 && h_since(t0) < h_scale(5000))
        term_read(&t, 100);
    ck_assert_msg(term_frames(&t) >= 3, "no refresh within %d ms: %s",
                  h_scale(5000), t.out);
    ck_assert_msg(strstr(t.out, "\033[?1049h"), "no alternate screen");
    ck_assert_msg(term_lflag(&t) == 0, "echo or line mode left on");
    lines = term_screen(&t, screen, sizeof(screen), &widest);
    ck_assert_msg(lines < SCREEN_ROWS && widest <= SCREEN_COLS,
                  "%d lines, %d columns on a %dx%d screen:\n%s", lines,
                  widest, SCREEN_ROWS, SCREEN_COLS, screen);
    ck_assert_msg(strstr(screen, "q: quit"), "no q hint:\n%s", screen);
    head = line_of(screen, "RESOURCE ");
    ck_assert_msg(head, "no column names on the screen:\n%s", screen);
    first = strchr(head, '\n') + 1;
    ck_assert_msg(row_words(first, w, 12) >= 2 && strcmp(w[0], "q:b") == 0 &&
                  strcmp(w[1], "2") == 0,
                  "the longest wait is not first:\n%s", screen);
    ck_assert_msg(line_of(first, "q:a ") && line_of(first, "q:c "),
                  "q:a or q:c missing:\n%s", screen);
    term_stop(&t, 0);

    /* SIGINT, as Ctrl-C sends it, ends it as cleanly. */
    term_start(&t);
    t0 = h_now_ms();
    while (term_frames(&t) < 1 && h_since(t0) < h_scale(5000))
        term_read(&t, 50);
    term_stop(&t, SIGINT);
}
END_TEST

static Suite *top_suite(void)
{
    Suite *s = suite_create("top");
    TCase *tc = tcase_create("top");

    h_cluster_fixture(tc, &K, 1, true);
    tcase_set_timeout(tc, h_scale(30));
    tcase_add_test(tc, top_once_plain);
    tcase_add_test(tc, top_json_and_usage);
    tcase_add_test(tc, top_on_a_terminal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(top_suite());
}
