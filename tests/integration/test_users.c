/*
 * test_users: auth.users against a real redis-server (docs/protocol.md,
 * "Users and prefixes").
 *
 * Users log in with AUTH <name> <password> and may touch only resources
 * within their prefixes: every command, inside and outside them; an admin
 * user's FORCEUNLOCK and READMIT; what SESSIONS shows a user; a wrong
 * name and a wrong password told apart by nothing a client sees; the
 * shared auth.password beside users; a password file others can read; a
 * SIGHUP that changes prefixes, passwords and the list itself; a resumed
 * session keeping its user; and the audit lines, with no secret in them.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct h_cluster K;
static struct h_redis *const R = &K.nodes[0];
static struct h_daemon *const D = &K.daemons[0];

/* alice: invoice: and job:; bob: report:; ops: an admin within job:;
 * root: an admin of every resource (""). Passwords that no log line may
 * ever hold. */
#define USERS_JSON                                                          \
    "\"users\":["                                                           \
    "{\"name\":\"alice\",\"password\":\"Alice-Secret-1\","                  \
    "\"prefixes\":[\"invoice:\",\"job:\"]},"                                \
    "{\"name\":\"bob\",\"password\":\"Bob-Secret-2\","                      \
    "\"prefixes\":[\"report:\"]},"                                          \
    "{\"name\":\"ops\",\"password\":\"Ops-Secret-3\","                      \
    "\"prefixes\":[\"job:\"],\"admin\":true},"                              \
    "{\"name\":\"root\",\"password\":\"Root-Secret-4\","                    \
    "\"prefixes\":[\"\"],\"admin\":true}]"

static void start(const char *extra_json)
{
    h_daemon_start(D, R, 1, extra_json);
    h_sleep_ms(300);    /* the node connects (STATS needs a login here) */
}

static const char *daemon_log(void)
{
    return h_daemon_log(D);
}

/* No secret of USERS_JSON (nor the shared passwords) in the log. */
static void assert_no_secret_logged(void)
{
    static const char *const secrets[] = {
        "Alice-Secret-1", "Bob-Secret-2", "Ops-Secret-3", "Root-Secret-4",
        "Shared-Secret-5", "Admin-Secret-6", "Wrong-Secret-7", "File-Secret",
    };
    const char *log = daemon_log();

    for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++)
        ck_assert_msg(!strstr(log, secrets[i]), "%s logged:\n%s", secrets[i],
                      log);
}

static void login(struct h_client *c, const char *user, const char *pw)
{
    h_connect_tcp_ok(c, D->port);
    h_expect(c, "OK", "AUTH %s %s", user, pw);
}

/* Rewrite the daemon's config file: merge `patch` (JSON object text) into
 * what it holds now (a list is replaced whole). */
static void patch_config(const char *patch)
{
    json_error_t err;
    json_t *conf = json_load_file(D->conf_path, 0, &err);
    json_t *p = json_loads(patch, 0, &err);

    ck_assert_msg(conf && p, "patch_config: %s", err.text);
    json_object_update_recursive(conf, p);
    ck_assert_int_eq(json_dump_file(conf, D->conf_path, JSON_INDENT(2)), 0);
    json_decref(conf);
    json_decref(p);
}

/* SIGHUP, and wait for the reload's last line (the count of changes). */
static void reload(int nth)
{
    const char *needle = "change(s) applied";
    int seen = 0;

    kill(D->pid, SIGHUP);
    for (int i = 0; i < h_scale(3000) / 20 && seen < nth; i++) {
        const char *p = daemon_log();
        seen = 0;
        while ((p = strstr(p, needle))) {
            seen++;
            p++;
        }
        if (seen < nth)
            h_sleep_ms(20);
    }
    ck_assert_msg(seen >= nth, "reload %d not logged:\n%s", nth, daemon_log());
}

/* ---- before a login ------------------------------------------------------ */

START_TEST(login_required_with_users)
{
    struct h_client c;
    char *line;

    start("{\"auth\":{" USERS_JSON "}}");
    h_connect_tcp_ok(&c, D->port);
    ck_assert_str_eq(h_cmd(&c, "PING"), "PONG");
    h_expect(&c, "OK ", "HELP");
    h_expect(&c, "OK proto=1 ", "HELLO name=t");
    static const char *const gated[] = {
        "LOCK invoice:1", "UNLOCK invoice:1", "EXTEND invoice:1 ttl=1000",
        "LOCKS", "STATUS invoice:1", "SESSIONS", "STATS",
        "FORCEUNLOCK invoice:1", "READMIT all",
        "ADOPT invoice:1 token=0123456789abcdef0123456789abcdef",
    };
    for (size_t i = 0; i < sizeof(gated) / sizeof(gated[0]); i++) {
        line = h_cmd(&c, "%s", gated[i]);
        ck_assert_msg(h_starts(line, "ERR NOAUTH ") &&
                      strstr(line, "AUTH <user> <password>"), "%s: %s",
                      gated[i], line);
    }
    /* Users but no auth.password: a one-word AUTH says how to log in,
     * without counting as a failure. */
    line = h_expect(&c, "ERR AUTH ", "AUTH Alice-Secret-1");
    ck_assert_msg(strstr(line, "AUTH <user> <password>"), "%s", line);
    h_expect(&c, "OK", "AUTH alice Alice-Secret-1");
    h_expect(&c, "OK resource=invoice:1 ", "LOCK invoice:1");
    ck_assert_msg(h_log_waits_for(D,
                                  "logged in as user alice with a password",
                                  h_scale(2000)), "%s", daemon_log());
    assert_no_secret_logged();
    h_close(&c);
}
END_TEST

/* ---- every command, inside and outside the prefixes --------------------- */

START_TEST(prefixes_every_command)
{
    struct h_client a, b, a2;
    char token[64], btoken[64], *line;

    start("{\"auth\":{" USERS_JSON "}}");
    login(&a, "alice", "Alice-Secret-1");
    login(&b, "bob", "Bob-Secret-2");
    h_expect(&a, "OK proto=1 ", "HELLO name=alice-app");

    /* LOCK, one and several: all inside, or nothing taken. */
    line = h_expect(&a, "OK resource=invoice:1 ", "LOCK invoice:1");
    h_kv_copy(line, "token", token, sizeof(token));
    line = h_expect(&a, "ERR DENIED ", "LOCK report:1");
    ck_assert_msg(strstr(line, "user alice may not LOCK report:1"), "%s",
                  line);
    h_expect(&a, "ERR DENIED ", "LOCK invoice:2 report:2");
    h_expect(&a, "ERR DENIED ", "LOCK job:2 jobs");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:invoice:2"), 0);
    h_expect(&a, "OK resources=2 ", "LOCK invoice:3 job:3");
    h_expect(&a, "ERR DENIED ", "LOCK Invoice:4");     /* case counts */
    h_expect(&a, "ERR DENIED ", "LOCK invoice");       /* a prefix is whole */

    /* STATUS: with a resource inside; outside DENIED; without, ARG. */
    json_t *st = h_ok_json(&a, "STATUS invoice:1");
    ck_assert(json_is_true(json_object_get(st, "held")));
    json_decref(st);
    line = h_expect(&b, "OK resource=report:1 ", "LOCK report:1");
    h_kv_copy(line, "token", btoken, sizeof(btoken));
    h_expect(&a, "ERR DENIED ", "STATUS report:1");
    h_expect(&a, "ERR ARG ", "STATUS");
    h_expect(&b, "ERR DENIED ", "STATUS invoice:1");

    /* ADOPT: outside DENIED (bob keeps his lease); inside, alice's own
     * lease moves to her other connection. */
    h_expect(&a, "ERR DENIED ", "ADOPT report:1 token=%s", btoken);
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:report:1"), 1);
    login(&a2, "alice", "Alice-Secret-1");
    h_expect(&a2, "OK resource=invoice:1 ", "ADOPT invoice:1 token=%s",
             token);
    line = h_cmd(&a, "UNLOCK invoice:1");       /* moved: no longer a's */
    ck_assert_msg(h_starts(line, "ERR LOST ") ||
                  h_starts(line, "ERR NOTHELD "), "%s", line);

    /* UNLOCK, EXTEND, LOCKS: the session's own leases; a name outside the
     * prefixes is simply not held. */
    h_expect(&a, "OK resource=job:3 ", "EXTEND job:3 ttl=20000");
    h_expect(&a, "ERR NOTHELD ", "UNLOCK report:1");
    h_expect(&a, "ERR NOTHELD ", "EXTEND report:1 ttl=20000");
    json_t *locks = h_ok_json(&a, "LOCKS");
    ck_assert_uint_eq(json_array_size(json_object_get(locks, "locks")), 2);
    json_decref(locks);
    h_expect(&a, "OK resource=job:3 ", "UNLOCK job:3");
    h_expect(&a, "OK ", "STATS");

    /* FORCEUNLOCK and READMIT: alice is no admin. */
    line = h_expect(&a, "ERR DENIED ", "FORCEUNLOCK invoice:3");
    ck_assert_msg(strstr(line, "not an admin"), "%s", line);
    h_expect(&a, "ERR DENIED ", "READMIT all");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:invoice:3"), 1);

    h_close(&a);
    h_close(&a2);
    h_close(&b);
    assert_no_secret_logged();
}
END_TEST

START_TEST(admin_users)
{
    struct h_client a, op, root;

    start("{\"auth\":{" USERS_JSON "}}");
    login(&a, "alice", "Alice-Secret-1");
    login(&op, "ops", "Ops-Secret-3");
    login(&root, "root", "Root-Secret-4");
    h_expect(&a, "OK resource=job:1 ", "LOCK job:1");
    h_expect(&a, "OK resource=invoice:1 ", "LOCK invoice:1");

    /* ops: FORCEUNLOCK within job: only; READMIT concerns every resource,
     * which ops does not cover. */
    h_expect(&op, "OK resource=job:1 nodes=1", "FORCEUNLOCK job:1");
    ck_assert_msg(h_expect_event(&a, "EVENT LOST resource=job:1 ", 3000),
                  "the holder was not told");
    h_expect(&op, "ERR DENIED ", "FORCEUNLOCK invoice:1");
    ck_assert_int_eq(h_redis_cmd(R, NULL, "EXISTS lock:invoice:1"), 1);
    h_expect(&op, "ERR DENIED ", "READMIT all");
    h_expect(&op, "ERR DENIED ", "LOCK invoice:9");

    /* root (prefix ""): anything, READMIT included. */
    h_expect(&root, "OK resource=invoice:1 nodes=1", "FORCEUNLOCK invoice:1");
    h_expect(&root, "OK readmitted=", "READMIT all");
    h_expect(&root, "OK resource=anything ", "LOCK anything");

    ck_assert_msg(h_log_waits_for(D, "user ops: FORCEUNLOCK job:1",
                                  h_scale(2000)), "%s", daemon_log());
    ck_assert_msg(strstr(daemon_log(), "logged in as user ops (admin)"),
                  "%s", daemon_log());
    ck_assert_msg(strstr(daemon_log(), "user=root) READMIT all"), "%s",
                  daemon_log());
    ck_assert_msg(strstr(daemon_log(), "user ops denied FORCEUNLOCK "
                         "invoice:1"), "%s", daemon_log());
    assert_no_secret_logged();
    h_close(&a);
    h_close(&op);
    h_close(&root);
}
END_TEST

/* SESSIONS shows a user its own sessions only; the shared password and
 * the admin password see all of them, with their users. */
START_TEST(sessions_of_a_user)
{
    struct h_client a, a2, b, shared;
    json_t *j, *arr;
    char *text;

    start("{\"auth\":{\"password\":\"Shared-Secret-5\"," USERS_JSON "}}");
    login(&a, "alice", "Alice-Secret-1");
    login(&a2, "alice", "Alice-Secret-1");
    login(&b, "bob", "Bob-Secret-2");
    login(&shared, "Shared-Secret-5", "");
    h_expect(&b, "OK resource=report:secret-name ", "LOCK report:secret-name");
    h_expect(&a, "OK resource=invoice:1 ", "LOCK invoice:1");

    j = h_ok_json(&a, "SESSIONS");
    arr = json_object_get(j, "sessions");
    ck_assert_uint_eq(json_array_size(arr), 2);
    for (size_t i = 0; i < 2; i++)
        ck_assert_str_eq(h_json_str(json_array_get(arr, i), "user"), "alice");
    text = json_dumps(j, JSON_COMPACT);
    ck_assert_msg(!strstr(text, "report:") && !strstr(text, "bob"), "%s",
                  text);
    free(text);
    json_decref(j);

    j = h_ok_json(&shared, "SESSIONS");
    arr = json_object_get(j, "sessions");
    ck_assert_uint_eq(json_array_size(arr), 4);
    text = json_dumps(j, JSON_COMPACT);
    ck_assert_msg(strstr(text, "\"user\":\"bob\"") &&
                  strstr(text, "report:secret-name"), "%s", text);
    free(text);
    json_decref(j);
    h_close(&a);
    h_close(&a2);
    h_close(&b);
    h_close(&shared);
}
END_TEST

/* The shared auth.password and auth.admin_password keep their meaning
 * beside users: unrestricted, and the operator's FORCEUNLOCK. */
START_TEST(shared_passwords_beside_users)
{
    struct h_client s, op, a;

    start("{\"auth\":{\"password\":\"Shared-Secret-5\",\"admin_password\":"
          "\"Admin-Secret-6\"," USERS_JSON "}}");
    h_connect_tcp_ok(&s, D->port);
    h_expect(&s, "ERR NOAUTH ", "LOCK x");
    h_expect(&s, "OK", "AUTH Shared-Secret-5");
    h_expect(&s, "OK resource=report:9 ", "LOCK report:9");
    h_expect(&s, "OK resource=x ", "LOCK x");
    h_expect(&s, "ERR NOAUTH ", "FORCEUNLOCK x");
    login(&op, "Admin-Secret-6", "");
    h_expect(&op, "OK resource=x nodes=1", "FORCEUNLOCK x");
    /* A session of the shared password may log in as a user (and is
     * restricted from then on); a user's session stays that user's
     * (auth_never_changes_user). */
    h_expect(&s, "OK", "AUTH alice Alice-Secret-1");
    h_expect(&s, "ERR DENIED ", "LOCK z");
    login(&a, "alice", "Alice-Secret-1");
    h_expect(&a, "ERR DENIED ", "LOCK y");
    h_expect(&a, "ERR ARG ", "AUTH Shared-Secret-5");
    h_expect(&a, "ERR DENIED ", "LOCK y");
    assert_no_secret_logged();
    h_close(&s);
    h_close(&op);
    h_close(&a);
}
END_TEST

/* ---- wrong names and wrong passwords ------------------------------------ */

/* The failures of one connection: the replies, and how long the second
 * one took (the delay grows with each failure). */
static void auth_twice(const char *user, const char *pw, char *first,
                       char *second, long long *second_ms)
{
    struct h_client c;
    uint64_t t0;

    h_connect_tcp_ok(&c, D->port);
    snprintf(first, 256, "%s", h_cmd(&c, "AUTH %s %s", user, pw));
    t0 = h_now_ms();
    snprintf(second, 256, "%s", h_cmd(&c, "AUTH %s %s", user, pw));
    *second_ms = h_since(t0);
    h_close(&c);
}

START_TEST(wrong_name_and_wrong_password_alike)
{
    char f1[256], s1[256], f2[256], s2[256], *line;
    long long ms1, ms2;
    struct h_client c;

    start("{\"auth\":{" USERS_JSON "},\"limits\":{\"max_auth_failures\":3}}");
    auth_twice("alice", "Wrong-Secret-7", f1, s1, &ms1);
    auth_twice("Wrong-Secret-7", "Alice-Secret-1", f2, s2, &ms2);
    ck_assert_str_eq(f1, "ERR AUTH invalid user name or password");
    ck_assert_str_eq(f1, f2);
    ck_assert_str_eq(s1, s2);
    /* The second failure of a connection waits (100 ms) for both. */
    ck_assert_msg(ms1 >= 90 && ms2 >= 90, "delays %lld and %lld ms", ms1,
                  ms2);
    /* A password right for another user is wrong. */
    h_connect_tcp_ok(&c, D->port);
    h_expect(&c, "ERR AUTH ", "AUTH alice Bob-Secret-2");
    /* Both kinds count toward limits.max_auth_failures. */
    h_expect(&c, "ERR AUTH ", "AUTH nobody Bob-Secret-2");
    line = h_cmd(&c, "AUTH alice wrong");
    ck_assert_msg(strstr(line, "too many failures"), "%s", line);
    ck_assert(h_wait_eof(&c, 3000));
    h_close(&c);
    /* The log says which user failed, but never repeats an unknown name
     * (it may be a password typed in the wrong place) nor a password. */
    ck_assert_msg(h_log_waits_for(D, "wrong password for user alice",
                                  h_scale(2000)), "%s", daemon_log());
    ck_assert_msg(strstr(daemon_log(), "(an unknown user name)"), "%s",
                  daemon_log());
    assert_no_secret_logged();
}
END_TEST

/* ---- password files, reload ---------------------------------------------- */

/* A file holding text, with mode; path into out (in dir). */
static void write_file(const char *dir, const char *name, const char *text,
                       mode_t mode, char *out, size_t size)
{
    FILE *f;

    snprintf(out, size, "%s/%s", dir, name);
    f = fopen(out, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(out, mode), 0);
}

START_TEST(password_file_mode_warns)
{
    char dir[] = "/tmp/test_users_XXXXXX", open_pw[300], closed_pw[300];
    char json[1024];
    struct h_client a, b;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_file(dir, "open.pw", "File-Secret-open\n", 0644, open_pw,
               sizeof(open_pw));
    write_file(dir, "closed.pw", "File-Secret-closed\n", 0640, closed_pw,
               sizeof(closed_pw));
    snprintf(json, sizeof(json), "{\"auth\":{\"users\":["
             "{\"name\":\"a\",\"password_file\":\"%s\",\"prefixes\":[\"a:\"]},"
             "{\"name\":\"b\",\"password_file\":\"%s\",\"prefixes\":[\"b:\"]}"
             "]}}", open_pw, closed_pw);
    start(json);
    login(&a, "a", "File-Secret-open");
    login(&b, "b", "File-Secret-closed");
    h_expect(&a, "OK resource=a:1 ", "LOCK a:1");
    ck_assert_msg(h_log_waits_for(D, open_pw, h_scale(2000)),
                  "no warning naming %s:\n%s",
                  open_pw, daemon_log());
    ck_assert_msg(strstr(daemon_log(), "is readable by others"), "%s",
                  daemon_log());
    ck_assert_msg(!strstr(daemon_log(), closed_pw), "%s", daemon_log());

    /* A reload reads the files again: b's new password works, the old one
     * no more; a session logged in stays so. */
    write_file(dir, "closed.pw", "File-Secret-new\n", 0600, closed_pw,
               sizeof(closed_pw));
    reload(1);
    h_close(&b);
    h_connect_tcp_ok(&b, D->port);
    h_expect(&b, "ERR AUTH ", "AUTH b File-Secret-closed");
    h_close(&b);
    login(&b, "b", "File-Secret-new");
    h_expect(&b, "OK resource=b:1 ", "LOCK b:1");
    h_expect(&a, "OK resource=a:2 ", "LOCK a:2");
    assert_no_secret_logged();
    h_close(&a);
    h_close(&b);
    unlink(open_pw);
    unlink(closed_pw);
    rmdir(dir);
}
END_TEST

START_TEST(reload_changes_prefixes)
{
    struct h_client a, b;

    start("{\"auth\":{\"users\":["
          "{\"name\":\"alice\",\"password\":\"Alice-Secret-1\","
          "\"prefixes\":[\"invoice:\"]},"
          "{\"name\":\"bob\",\"password\":\"Bob-Secret-2\","
          "\"prefixes\":[\"report:\"]}]}}");
    login(&a, "alice", "Alice-Secret-1");
    login(&b, "bob", "Bob-Secret-2");
    h_expect(&a, "OK resource=invoice:1 ", "LOCK invoice:1");
    h_expect(&a, "ERR DENIED ", "LOCK job:1");

    /* alice's prefixes change: the next checks of the same session follow;
     * what she holds stays hers. */
    patch_config("{\"auth\":{\"users\":["
                 "{\"name\":\"alice\",\"password\":\"Alice-Secret-1\","
                 "\"prefixes\":[\"job:\"]},"
                 "{\"name\":\"bob\",\"password\":\"Bob-Secret-2\","
                 "\"prefixes\":[\"report:\"]}]}}");
    reload(1);
    ck_assert_msg(strstr(daemon_log(), "reload: auth.users changed"), "%s",
                  daemon_log());
    h_expect(&a, "OK resource=job:1 ", "LOCK job:1");
    h_expect(&a, "ERR DENIED ", "LOCK invoice:2");
    h_expect(&a, "ERR DENIED ", "STATUS invoice:1");
    h_expect(&a, "OK resource=invoice:1 ", "UNLOCK invoice:1");

    /* bob removed: his session, still open, is denied everything. */
    patch_config("{\"auth\":{\"users\":["
                 "{\"name\":\"alice\",\"password\":\"Alice-Secret-1\","
                 "\"prefixes\":[\"job:\"]}]}}");
    reload(2);
    char *line = h_expect(&b, "ERR DENIED ", "LOCK report:1");
    ck_assert_msg(strstr(line, "no longer configured"), "%s", line);
    h_expect(&a, "OK resource=job:2 ", "LOCK job:2");
    assert_no_secret_logged();
    h_close(&a);
    h_close(&b);
}
END_TEST

/* ---- resume ---------------------------------------------------------------- */

/* A detached session resumed on a new connection keeps its user, whatever
 * that connection logged in as; a session that never logged in takes the
 * new connection's login (never more than it). */
START_TEST(resume_keeps_user)
{
    struct h_client a, n, x, m;
    char sid[64], secret[64], *line;

    start("{\"auth\":{" USERS_JSON "}}");
    h_connect_tcp_ok(&a, D->port);
    line = h_expect(&a, "OK proto=1 ", "HELLO detach=10000");
    h_kv_copy(line, "session", sid, sizeof(sid));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_expect(&a, "OK", "AUTH alice Alice-Secret-1");
    h_expect(&a, "OK resource=invoice:1 ", "LOCK invoice:1");
    h_close(&a);                        /* detaches */
    h_sleep_ms(200);

    login(&n, "bob", "Bob-Secret-2");
    h_expect(&n, "OK proto=1 session=", "HELLO resume=%s secret=%s", sid,
             secret);
    h_expect(&n, "ERR DENIED ", "LOCK report:1");
    h_expect(&n, "OK resource=invoice:2 ", "LOCK invoice:2");
    h_expect(&n, "OK resource=invoice:1 ", "UNLOCK invoice:1");

    /* A session with no login, resumed by bob's connection: bob's. */
    h_connect_tcp_ok(&x, D->port);
    line = h_expect(&x, "OK proto=1 ", "HELLO detach=10000");
    h_kv_copy(line, "session", sid, sizeof(sid));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_close(&x);
    h_sleep_ms(200);
    login(&m, "bob", "Bob-Secret-2");
    h_expect(&m, "OK proto=1 session=", "HELLO resume=%s secret=%s", sid,
             secret);
    h_expect(&m, "ERR DENIED ", "LOCK invoice:3");
    h_expect(&m, "OK resource=report:3 ", "LOCK report:3");
    h_close(&n);
    h_close(&m);
}
END_TEST

/* A session's user never changes: once logged in as a user (by AUTH, or
 * a resumed session that was one), AUTH of any kind answers ERR ARG and
 * changes nothing, and a wrong password there costs no failure. */
START_TEST(auth_never_changes_user)
{
    struct h_client a, n, x;
    char sid[64], secret[64], *line;

    start("{\"auth\":{\"password\":\"Shared-Secret-5\",\"admin_password\":"
          "\"Admin-Secret-6\"," USERS_JSON "}}");
    login(&a, "alice", "Alice-Secret-1");
    h_expect(&a, "ERR ARG ", "AUTH bob Bob-Secret-2");
    h_expect(&a, "ERR ARG ", "AUTH root Root-Secret-4");
    h_expect(&a, "ERR ARG ", "AUTH alice Alice-Secret-1");
    h_expect(&a, "ERR ARG ", "AUTH Admin-Secret-6");
    h_expect(&a, "ERR ARG ", "AUTH Shared-Secret-5");
    for (int i = 0; i < 6; i++)
        h_expect(&a, "ERR ARG ", "AUTH root Wrong-Secret-7");
    h_expect(&a, "ERR DENIED ", "LOCK report:1");
    h_expect(&a, "ERR DENIED ", "FORCEUNLOCK job:1");
    h_expect(&a, "OK resource=job:1 ", "LOCK job:1");
    line = h_expect(&a, "OK {", "SESSIONS");
    ck_assert_msg(strstr(line, "\"user\":\"alice\""), "SESSIONS: %s", line);

    /* Resumed by a connection of another user: the session's user. */
    line = h_expect(&a, "OK proto=1 ", "HELLO detach=10000");
    h_kv_copy(line, "session", sid, sizeof(sid));
    h_kv_copy(line, "secret", secret, sizeof(secret));
    h_close(&a);
    h_sleep_ms(200);
    login(&n, "bob", "Bob-Secret-2");
    h_expect(&n, "OK proto=1 session=", "HELLO resume=%s secret=%s", sid,
             secret);
    h_expect(&n, "ERR ARG ", "AUTH bob Bob-Secret-2");
    h_expect(&n, "ERR DENIED ", "LOCK report:2");
    h_expect(&n, "OK resource=job:2 ", "LOCK job:2");

    /* No user yet: the shared password, then a user, once. */
    h_connect_tcp_ok(&x, D->port);
    h_expect(&x, "OK", "AUTH Shared-Secret-5");
    h_expect(&x, "OK", "AUTH bob Bob-Secret-2");
    h_expect(&x, "ERR ARG ", "AUTH alice Alice-Secret-1");
    h_expect(&x, "ERR DENIED ", "LOCK job:3");
    assert_no_secret_logged();
    h_close(&n);
    h_close(&x);
}
END_TEST

/* ---- audit lines ------------------------------------------------------------ */

/* A client looping on a refused name is audited at notice once per
 * command; the repeats go to debug only. */
START_TEST(denied_audited_once_per_command)
{
    struct h_client a;
    const char *p;
    int notices = 0;

    start("{\"auth\":{" USERS_JSON "},\"log\":{\"level\":\"notice\"}}");
    login(&a, "alice", "Alice-Secret-1");
    for (int i = 0; i < 20; i++)
        h_expect(&a, "ERR DENIED ", "LOCK report:%d", i);
    h_expect(&a, "ERR DENIED ", "STATUS report:1");
    ck_assert(h_log_waits_for(D, "denied STATUS report:1", h_scale(2000)));
    for (p = daemon_log(); (p = strstr(p, "user alice denied LOCK")); p++)
        notices++;
    ck_assert_int_eq(notices, 1);
    h_close(&a);
}
END_TEST

static Suite *users_suite(void)
{
    Suite *s = suite_create("users");
    TCase *tc = tcase_create("users");

    h_cluster_fixture(tc, &K, 1, true);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, login_required_with_users);
    tcase_add_test(tc, prefixes_every_command);
    tcase_add_test(tc, admin_users);
    tcase_add_test(tc, sessions_of_a_user);
    tcase_add_test(tc, shared_passwords_beside_users);
    tcase_add_test(tc, wrong_name_and_wrong_password_alike);
    tcase_add_test(tc, password_file_mode_warns);
    tcase_add_test(tc, reload_changes_prefixes);
    tcase_add_test(tc, resume_keeps_user);
    tcase_add_test(tc, auth_never_changes_user);
    tcase_add_test(tc, denied_audited_once_per_command);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(users_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
