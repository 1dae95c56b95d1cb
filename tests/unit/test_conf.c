/*
 * Unit tests for daemon/conf*.c: defaults, every key, type and range errors,
 * unknown keys, JSON syntax errors, secrets read from files, address
 * parsing, the cross-key rules, and the config files shipped in conf/.
 * Most tests are tables: one row per input, run with tcase_add_loop_test.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"

#define NAME "t.json"
#define ROWS(t) ((int)(sizeof(t) / sizeof((t)[0])))

static struct conf c;
static char err[CONF_ERRLEN];

static void setup(void)
{
    memset(&c, 0, sizeof(c));
    err[0] = '\0';
}

static void teardown(void)
{
    conf_deinit(&c);
}

/* c is always deinit-safe here (zeroed, loaded, or defaults after an error). */
static int load(const char *json)
{
    conf_deinit(&c);
    return conf_load_string(&c, json, NAME, err, sizeof(err));
}

/* A temp file holding `text`; the caller unlinks and frees the path. */
static char *temp_file(const char *text)
{
    char *path = strdup("/tmp/test_conf_XXXXXX");
    int fd;

    ck_assert_ptr_nonnull(path);
    fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void assert_error(const char *key, const char *msg)
{
    ck_assert_msg(strncmp(err, NAME ": ", strlen(NAME) + 2) == 0,
                  "error does not start with the file name: %s", err);
    ck_assert_msg(strstr(err, key), "no key \"%s\" in: %s", key, err);
    ck_assert_msg(strstr(err, msg), "no \"%s\" in: %s", msg, err);
    ck_assert_msg(!strchr(err, '\n'), "multi-line error: %s", err);
}

static void assert_defaults(const struct conf *d)
{
    ck_assert_ptr_null(d->path);
    ck_assert_uint_eq(d->nlisten, 1);
    ck_assert_int_eq(d->listen[0].kind, CONF_ADDR_TCP);
    ck_assert_str_eq(d->listen[0].host, "127.0.0.1");
    ck_assert_int_eq(d->listen[0].port, 7390);
    ck_assert_str_eq(d->listen[0].text, "tcp://127.0.0.1:7390");
    ck_assert_uint_eq(d->unix_socket_mode, 0660);
    ck_assert_uint_eq(d->redis.nnodes, 1);
    ck_assert_str_eq(d->redis.nodes[0].host, "127.0.0.1");
    ck_assert_int_eq(d->redis.nodes[0].port, 6379);
    ck_assert_str_eq(d->redis.nodes[0].text, "127.0.0.1:6379");
    ck_assert_ptr_null(d->redis.username);
    ck_assert_ptr_null(d->redis.password);
    ck_assert_int_eq(d->redis.db, 0);
    ck_assert_uint_eq(d->redis.pool_size, 2);
    ck_assert_uint_eq(d->redis.connect_timeout_ms, 1000);
    ck_assert_uint_eq(d->redis.command_timeout_ms, 100);
    ck_assert_uint_eq(d->redis.reconnect_max_ms, 5000);
    ck_assert_uint_eq(d->redis.batch_keys_in_flight, 65536);
    ck_assert_uint_eq(d->redis.group_max, 32);
    ck_assert_str_eq(d->locks.key_prefix, "lock:");
    ck_assert_str_eq(d->locks.fence_key, "redlockd:fence");
    ck_assert_str_eq(d->locks.release_channel, "redlockd:released");
    ck_assert_uint_eq(d->locks.default_ttl_ms, 30000);
    ck_assert_uint_eq(d->locks.min_ttl_ms, 100);
    ck_assert_uint_eq(d->locks.max_ttl_ms, 86400000);
    ck_assert_uint_eq(d->locks.max_wait_ms, 3600000);
    ck_assert_double_eq(d->locks.drift_factor, 0.01);
    ck_assert_uint_eq(d->locks.lock_delay_ms, 0);
    ck_assert_uint_eq(d->locks.max_resource_len, 200);
    ck_assert_uint_eq(d->locks.retry_ms, 500);
    ck_assert_uint_eq(d->limits.max_clients, 10000);
    ck_assert_uint_eq(d->limits.max_line, 4096);
    ck_assert_uint_eq(d->limits.max_locks_per_session, 1024);
    ck_assert_uint_eq(d->limits.max_pipeline, 128);
    ck_assert_uint_eq(d->limits.max_output_bytes, 1048576);
    ck_assert_uint_eq(d->limits.idle_timeout_ms, 0);
    ck_assert_uint_eq(d->limits.handshake_timeout_ms, 10000);
    ck_assert_ptr_null(d->auth.password);
    ck_assert(d->auth.protected_mode);
    ck_assert_ptr_null(d->tls.cert_file);
    ck_assert_ptr_null(d->tls.key_file);
    ck_assert_ptr_null(d->tls.ca_file);
    ck_assert(!d->tls.verify_clients);
    ck_assert_str_eq(d->tls.min_version, "1.2");
    ck_assert_ptr_null(d->metrics.listen);
    ck_assert_ptr_null(d->metrics.resource_classes);     /* "prefix" */
    ck_assert_uint_eq(d->metrics.nresource_classes, 0);
    ck_assert_uint_eq(d->metrics.max_classes, 32);
    ck_assert_int_eq(d->log.level, CONF_LOG_INFO);
    ck_assert_uint_eq(d->shutdown_timeout_ms, 5000);
}

/* ---- defaults ---------------------------------------------------------- */

START_TEST(test_init_defaults)
{
    conf_init(&c);
    assert_defaults(&c);
    conf_deinit(&c);
    conf_deinit(&c);    /* deinit leaves it safe to deinit again */
}
END_TEST

START_TEST(test_empty_object_defaults)
{
    ck_assert_int_eq(load("{}"), 0);
    assert_defaults(&c);
    conf_deinit(&c);
    ck_assert_int_eq(load(" {\n}\n"), 0);
    assert_defaults(&c);
    conf_deinit(&c);
    ck_assert_int_eq(load("{\"redis\": {}, \"locks\": {}, \"log\": {}}"), 0);
    assert_defaults(&c);
}
END_TEST

/* ---- every key with a valid, non-default value ------------------------- */

static const char all_keys[] =
    "{\n"
    "  \"listen\": [\"tcp://0.0.0.0:7391\", \"[::1]:7392\",\n"
    "             \"10.0.0.1:7393\",\n"
    "             \"unix:/run/redlockd/redlockd.sock\",\n"
    "             \"tls://[::]:7394\"],\n"
    "  \"unix_socket_mode\": \"0600\",\n"
    "  \"redis\": {\n"
    "    \"nodes\": [\"10.0.0.1:6379\", \"redis-b.example.com:6380\",\n"
    "              \"[2001:db8::1]:6381\", \"unix:/run/redis/redis.sock\"],\n"
    "    \"username\": \"redlockd\",\n"
    "    \"password\": \"r pass\",\n"
    "    \"password_file\": null,\n"
    "    \"db\": 3,\n"
    "    \"pool_size\": 4,\n"
    "    \"connect_timeout_ms\": 2000,\n"
    "    \"command_timeout_ms\": 50,\n"
    "    \"reconnect_max_ms\": 10000,\n"
    "    \"batch_keys_in_flight\": 4096,\n"
    "    \"group_max\": 8\n"
    "  },\n"
    "  \"locks\": {\n"
    "    \"key_prefix\": \"app:lock:\",\n"
    "    \"fence_key\": \"app:fence\",\n"
    "    \"release_channel\": \"app:released\",\n"
    "    \"default_ttl_ms\": 15000,\n"
    "    \"min_ttl_ms\": 1000,\n"
    "    \"max_ttl_ms\": 600000,\n"
    "    \"max_wait_ms\": 60000,\n"
    "    \"drift_factor\": 0.02,\n"
    "    \"lock_delay_ms\": 2000,\n"
    "    \"max_resource_len\": 100,\n"
    "    \"retry_ms\": 250\n"
    "  },\n"
    "  \"limits\": {\n"
    "    \"max_clients\": 500,\n"
    "    \"max_line\": 1024,\n"
    "    \"max_locks_per_session\": 16,\n"
    "    \"max_pipeline\": 32,\n"
    "    \"max_output_bytes\": 65536,\n"
    "    \"idle_timeout_ms\": 300000,\n"
    "    \"handshake_timeout_ms\": 0\n"
    "  },\n"
    "  \"auth\": {\n"
    "    \"password\": \"s3cret\",\n"
    "    \"password_file\": null,\n"
    "    \"protected_mode\": false\n"
    "  },\n"
    "  \"tls\": {\"cert_file\": \"/etc/redlockd/tls/server.crt\",\n"
    "          \"key_file\": \"/etc/redlockd/tls/server.key\",\n"
    "          \"ca_file\": \"/etc/redlockd/tls/ca.crt\",\n"
    "          \"verify_clients\": true, \"min_version\": \"1.3\"},\n"
    "  \"metrics\": {\"listen\": \"127.0.0.1:9390\"},\n"
    "  \"log\": {\"level\": \"debug\"},\n"
    "  \"shutdown_timeout_ms\": 0\n"
    "}\n";

START_TEST(test_all_keys)
{
    ck_assert_msg(load(all_keys) == 0, "%s", err);
    ck_assert_uint_eq(c.nlisten, 5);
    ck_assert(!c.listen[0].tls);
    ck_assert(c.listen[4].tls);
    ck_assert_str_eq(c.listen[4].host, "::");
    ck_assert_int_eq(c.listen[4].port, 7394);
    ck_assert_str_eq(c.tls.cert_file, "/etc/redlockd/tls/server.crt");
    ck_assert_str_eq(c.tls.key_file, "/etc/redlockd/tls/server.key");
    ck_assert_str_eq(c.tls.ca_file, "/etc/redlockd/tls/ca.crt");
    ck_assert(c.tls.verify_clients);
    ck_assert_str_eq(c.tls.min_version, "1.3");
    ck_assert_str_eq(c.listen[0].host, "0.0.0.0");
    ck_assert_int_eq(c.listen[0].port, 7391);
    ck_assert_str_eq(c.listen[1].host, "::1");
    ck_assert_int_eq(c.listen[1].port, 7392);
    ck_assert_str_eq(c.listen[2].host, "10.0.0.1");
    ck_assert_int_eq(c.listen[3].kind, CONF_ADDR_UNIX);
    ck_assert_str_eq(c.listen[3].path, "/run/redlockd/redlockd.sock");
    ck_assert_ptr_null(c.listen[3].host);
    ck_assert_uint_eq(c.unix_socket_mode, 0600);
    ck_assert_uint_eq(c.redis.nnodes, 4);
    ck_assert_str_eq(c.redis.nodes[1].host, "redis-b.example.com");
    ck_assert_int_eq(c.redis.nodes[1].port, 6380);
    ck_assert_str_eq(c.redis.nodes[2].host, "2001:db8::1");
    ck_assert_str_eq(c.redis.nodes[3].path, "/run/redis/redis.sock");
    ck_assert_str_eq(c.redis.username, "redlockd");
    ck_assert_str_eq(c.redis.password, "r pass");
    ck_assert_int_eq(c.redis.db, 3);
    ck_assert_uint_eq(c.redis.pool_size, 4);
    ck_assert_uint_eq(c.redis.connect_timeout_ms, 2000);
    ck_assert_uint_eq(c.redis.command_timeout_ms, 50);
    ck_assert_uint_eq(c.redis.reconnect_max_ms, 10000);
    ck_assert_uint_eq(c.redis.batch_keys_in_flight, 4096);
    ck_assert_uint_eq(c.redis.group_max, 8);
    ck_assert_str_eq(c.locks.key_prefix, "app:lock:");
    ck_assert_str_eq(c.locks.fence_key, "app:fence");
    ck_assert_str_eq(c.locks.release_channel, "app:released");
    ck_assert_uint_eq(c.locks.default_ttl_ms, 15000);
    ck_assert_uint_eq(c.locks.min_ttl_ms, 1000);
    ck_assert_uint_eq(c.locks.max_ttl_ms, 600000);
    ck_assert_uint_eq(c.locks.max_wait_ms, 60000);
    ck_assert_double_eq(c.locks.drift_factor, 0.02);
    ck_assert_uint_eq(c.locks.lock_delay_ms, 2000);
    ck_assert_uint_eq(c.locks.max_resource_len, 100);
    ck_assert_uint_eq(c.locks.retry_ms, 250);
    ck_assert_uint_eq(c.limits.max_clients, 500);
    ck_assert_uint_eq(c.limits.max_line, 1024);
    ck_assert_uint_eq(c.limits.max_locks_per_session, 16);
    ck_assert_uint_eq(c.limits.max_pipeline, 32);
    ck_assert_uint_eq(c.limits.max_output_bytes, 65536);
    ck_assert_uint_eq(c.limits.idle_timeout_ms, 300000);
    ck_assert_uint_eq(c.limits.handshake_timeout_ms, 0);
    ck_assert_str_eq(c.auth.password, "s3cret");
    ck_assert(!c.auth.protected_mode);
    ck_assert_ptr_nonnull(c.metrics.listen);
    ck_assert_str_eq(c.metrics.listen->host, "127.0.0.1");
    ck_assert_int_eq(c.metrics.listen->port, 9390);
    ck_assert_int_eq(c.log.level, CONF_LOG_DEBUG);
    ck_assert_uint_eq(c.shutdown_timeout_ms, 0);
}
END_TEST

/* Values at the edges of their ranges, and the other accepted spellings. */
static const char *const good_rows[] = {
    "{\"limits\": {\"max_line\": 64}}",
    "{\"limits\": {\"max_line\": 1048576}}",
    "{\"limits\": {\"max_output_bytes\": 1073741824}}",
    "{\"redis\": {\"db\": 1000, \"pool_size\": 64}}",
    "{\"redis\": {\"batch_keys_in_flight\": 1}}",
    "{\"redis\": {\"batch_keys_in_flight\": 16777216}}",
    "{\"redis\": {\"group_max\": 1}}",
    "{\"redis\": {\"group_max\": 64}}",
    "{\"locks\": {\"drift_factor\": 0}}",
    "{\"locks\": {\"drift_factor\": 0.0}}",
    "{\"locks\": {\"drift_factor\": 0.499}}",
    "{\"locks\": {\"key_prefix\": \"\", \"fence_key\": \"redlockd fence\"}}",
    "{\"locks\": {\"min_ttl_ms\": 10, \"default_ttl_ms\": 10}}",
    "{\"locks\": {\"max_ttl_ms\": 2147483647, \"default_ttl_ms\": 2147483647}}",
    ("{\"redis\": {\"username\": null, \"password\": null,"
     " \"password_file\": null}}"),
    "{\"auth\": {\"password\": null, \"password_file\": null}}",
    "{\"metrics\": {\"listen\": null}}",
    "{\"metrics\": {\"listen\": \"[::1]:9390\"}}",
    "{\"metrics\": {\"resource_classes\": \"prefix\"}}",
    "{\"metrics\": {\"resource_classes\": []}}",
    "{\"metrics\": {\"resource_classes\": [\"x\", \"other:\"]}}",
    "{\"metrics\": {\"max_classes\": 0}}",
    "{\"metrics\": {\"max_classes\": 1024}}",
    ("{\"metrics\": {\"max_classes\": 2, \"resource_classes\":"
     " [\"a:\", \"b:\"]}}"),
    "{\"log\": {\"level\": \"info\"}}",
    "{\"log\": {\"level\": \"notice\"}}",
    "{\"log\": {\"level\": \"warning\"}}",
    "{\"log\": {\"level\": \"error\"}}",
    "{\"redis\": {\"nodes\": [\"localhost:6379\"]}}",
    "{\"listen\": [\"127.0.0.1:7390\", \"unix:/tmp/r.sock\"]}",
    ("{\"listen\": [\"unix:///run/r.sock\"], \"redis\": {\"nodes\":"
     " [\"tcp://redis-a:6379\", \"unix:///run/redis.sock\"]}}"),
};

START_TEST(test_good_values)
{
    ck_assert_msg(load(good_rows[_i]) == 0, "%s: %s", good_rows[_i], err);
}
END_TEST

/* ---- type and range errors --------------------------------------------- */

struct bad_row {
    const char *json;
    const char *key;
    const char *msg;
};

static const struct bad_row bad_rows[] = {
    /* wrong types */
    { "{\"limits\": {\"max_line\": \"4096\"}}", "limits.max_line",
      "expected an integer" },
    { "{\"limits\": {\"max_line\": 4096.0}}", "limits.max_line",
      "expected an integer" },
    { "{\"limits\": {\"max_line\": null}}", "limits.max_line",
      "expected an integer" },
    { "{\"redis\": {\"db\": true}}", "redis.db", "expected an integer" },
    { "{\"shutdown_timeout_ms\": [1]}", "shutdown_timeout_ms",
      "expected an integer" },
    { "{\"auth\": {\"protected_mode\": 1}}", "auth.protected_mode",
      "expected true or false" },
    { "{\"auth\": {\"protected_mode\": \"yes\"}}", "auth.protected_mode",
      "expected true or false" },
    { "{\"locks\": {\"drift_factor\": \"0.01\"}}", "locks.drift_factor",
      "expected a number" },
    { "{\"locks\": {\"key_prefix\": null}}", "locks.key_prefix",
      "expected a string" },
    { "{\"locks\": {\"fence_key\": 5}}", "locks.fence_key",
      "expected a string" },
    { "{\"redis\": {\"username\": 5}}", "redis.username",
      "expected a string or null" },
    { "{\"auth\": {\"password\": false}}", "auth.password",
      "expected a string or null" },
    { "{\"auth\": {\"password_file\": 1}}", "auth.password_file",
      "expected a string or null" },
    { "{\"listen\": \"tcp://127.0.0.1:7390\"}", "listen",
      "expected an array of address strings" },
    { "{\"listen\": [7390]}", "listen[0]", "expected a string" },
    { "{\"redis\": {\"nodes\": {}}}", "redis.nodes", "expected an array" },
    { "{\"metrics\": {\"listen\": 9390}}", "metrics.listen",
      "expected a string or null" },
    { "{\"log\": {\"level\": 1}}", "log.level", "must be one of debug" },
    { "{\"log\": {\"level\": \"INFO\"}}", "log.level", "must be one of" },
    { "{\"log\": {\"level\": \"verbose\"}}", "log.level", "must be one of" },
    { "{\"unix_socket_mode\": 432}", "unix_socket_mode",
      "expected an octal mode string" },
    /* below the minimum */
    { "{\"limits\": {\"max_line\": 63}}", "limits.max_line",
      "must be between 64 and 1048576" },
    { "{\"limits\": {\"max_clients\": 0}}", "limits.max_clients",
      "must be between 1 and 1000000" },
    { "{\"limits\": {\"max_output_bytes\": 4095}}", "limits.max_output_bytes",
      "must be between 4096 and 1073741824" },
    { "{\"redis\": {\"db\": -1}}", "redis.db", "must be between 0 and 1000" },
    { "{\"redis\": {\"pool_size\": 0}}", "redis.pool_size",
      "must be between 1 and 64" },
    { "{\"redis\": {\"batch_keys_in_flight\": 0}}",
      "redis.batch_keys_in_flight", "must be between 1 and 16777216" },
    { "{\"redis\": {\"group_max\": 65}}", "redis.group_max",
      "must be between 1 and 64" },
    { "{\"redis\": {\"command_timeout_ms\": 0}}", "redis.command_timeout_ms",
      "must be between 1 and 600000" },
    { "{\"locks\": {\"min_ttl_ms\": 9}}", "locks.min_ttl_ms",
      "must be between 10 and 2147483647" },
    { "{\"locks\": {\"retry_ms\": 9}}", "locks.retry_ms",
      "must be between 10 and 600000" },
    { "{\"locks\": {\"max_resource_len\": 0}}", "locks.max_resource_len",
      "must be between 1 and 1024" },
    { "{\"locks\": {\"drift_factor\": -0.1}}", "locks.drift_factor",
      "must be at least 0 and below 0.5" },
    { "{\"shutdown_timeout_ms\": -5}", "shutdown_timeout_ms",
      "must be between 0 and 3600000" },
    { "{\"locks\": {\"fence_key\": \"\"}}", "locks.fence_key",
      "must be 1 to 256 bytes long" },
    { "{\"auth\": {\"password\": \"\"}}", "auth.password",
      "must be 1 to 512 bytes long" },
    { "{\"listen\": []}", "listen", "must have 1 to 64 addresses" },
    { "{\"redis\": {\"nodes\": []}}", "redis.nodes",
      "must have 1 to 64 addresses" },
    /* above the maximum */
    { "{\"limits\": {\"max_line\": 1048577}}", "limits.max_line",
      "must be between 64 and 1048576" },
    { "{\"limits\": {\"max_line\": 9223372036854775807}}", "limits.max_line",
      "must be between 64 and 1048576" },
    { "{\"limits\": {\"max_pipeline\": 65537}}", "limits.max_pipeline",
      "must be between 1 and 65536" },
    { "{\"redis\": {\"db\": 1001}}", "redis.db", "must be between 0 and 1000" },
    { "{\"redis\": {\"pool_size\": 65}}", "redis.pool_size",
      "must be between 1 and 64" },
    { "{\"redis\": {\"batch_keys_in_flight\": 16777217}}",
      "redis.batch_keys_in_flight", "must be between 1 and 16777216" },
    { "{\"locks\": {\"max_ttl_ms\": 2147483648}}", "locks.max_ttl_ms",
      "must be between 10 and 2147483647" },
    { "{\"locks\": {\"max_resource_len\": 1025}}", "locks.max_resource_len",
      "must be between 1 and 1024" },
    { "{\"locks\": {\"lock_delay_ms\": 86400001}}", "locks.lock_delay_ms",
      "must be between 0 and 86400000" },
    { "{\"locks\": {\"drift_factor\": 0.5}}", "locks.drift_factor",
      "must be at least 0 and below 0.5" },
    { "{\"limits\": {\"handshake_timeout_ms\": 3600001}}",
      "limits.handshake_timeout_ms", "must be between 0 and 3600000" },
    { "{\"unix_socket_mode\": \"1777\"}", "unix_socket_mode",
      "must be at most 0777" },
    /* string contents */
    { "{\"locks\": {\"key_prefix\": \"a\\nb\"}}", "locks.key_prefix",
      "must not contain control characters" },
    { "{\"auth\": {\"password\": \"two words\"}}", "auth.password",
      "must not contain spaces" },
    { "{\"redis\": {\"username\": \"a b\"}}", "redis.username",
      "must not contain spaces" },
    /* addresses inside the file */
    { "{\"listen\": [\"localhost:7390\"]}", "listen[0]",
      "host must be an IPv4 address" },
    { "{\"listen\": [\"tcp://127.0.0.1:0\"]}", "listen[0]",
      "port must be a number from 1 to 65535" },
    { "{\"listen\": [\"127.0.0.1:7390\", \"unix:run/x.sock\"]}", "listen[1]",
      "must be absolute" },
    { "{\"metrics\": {\"listen\": \"unix:/run/m.sock\"}}", "metrics.listen",
      "unix sockets are not allowed here" },
    { "{\"metrics\": {\"listen\": \"localhost:9390\"}}", "metrics.listen",
      "host must be an IPv4 address" },
    { "{\"redis\": {\"nodes\": [\"127.0.0.1:6379\", \"bad_host:1\"]}}",
      "redis.nodes[1]", "invalid host name" },
    { "{\"redis\": {\"nodes\": [\"redis\"]}}", "redis.nodes[0]",
      "expected HOST:PORT" },
    { "{\"redis\": {\"nodes\": [\"/run/redis.sock\"]}}", "redis.nodes[0]",
      "write a unix socket as unix:/PATH" },
    { "{\"listen\": [\"[fe80::1%eth0]:7390\"]}", "listen[0]",
      "not a valid IPv6 address" },
    { "{\"metrics\": {\"listen\": \"tcp://[::1]\"}}", "metrics.listen",
      "expected [IPv6]:PORT" },
    { "{\"listen\": [\"127.0.0.1:7390\\n\"]}", "listen[0]",
      "control character in the address" },
};

START_TEST(test_bad_values)
{
    const struct bad_row *r = &bad_rows[_i];

    ck_assert_msg(load(r->json) == -1, "accepted: %s", r->json);
    assert_error(r->key, r->msg);
    assert_defaults(&c);
}
END_TEST

/* ---- unknown keys and structure ---------------------------------------- */

struct exact_row {
    const char *json;
    const char *err;
};

static const struct exact_row structure_rows[] = {
    { "{\"bogus\": 1}", NAME ": bogus: unknown key" },
    { "{\"redis\": {\"nodez\": []}}", NAME ": redis.nodez: unknown key" },
    { "{\"log\": {\"level\": \"info\", \"file\": \"x\"}}",
      NAME ": log.file: unknown key" },
    { "{\"redis.db\": 1}", NAME ": redis.db: unknown key" },
    { "{\"limits\": {\"max_line\": {\"x\": 1}}}",
      NAME ": limits.max_line: expected an integer" },
    { "{\"redis\": {\"tls\": {\"on\": true}}}",
      NAME ": redis.tls: unknown key" },
    { "{\"redis\": []}", NAME ": redis: expected an object" },
    { "{\"auth\": null}", NAME ": auth: expected an object" },
    { "{\"\": 1}", NAME ": \"\": unknown key" },
    { "{\"a\\nb\": 1}", NAME ": a?b: unknown key" },
    { "[]", NAME ": the top level must be a JSON object" },
    { "\"listen\"", NAME ": the top level must be a JSON object" },
};

START_TEST(test_structure)
{
    ck_assert_int_eq(load(structure_rows[_i].json), -1);
    ck_assert_str_eq(err, structure_rows[_i].err);
    assert_defaults(&c);
}
END_TEST

static const struct exact_row syntax_rows[] = {
    { "{\n  \"listen\": [\"127.0.0.1:7390\",]\n}",
      NAME ":2:31: JSON syntax error: unexpected token near ']'" },
    { "{\"log\": {\"level\": \"info\"}, \"log\": {}}",
      NAME ":1:32: JSON syntax error: duplicate object key near '\"log\"'" },
    { "{\n\n  \"db\": 01\n}", NAME ":3:9: JSON syntax error: invalid token" },
    { "{} x", NAME ":1:4: JSON syntax error: end of file expected near 'x'" },
    { "", NAME ":1:0: JSON syntax error: unexpected token near end of file" },
    { "{\"a\": \"\\u0000\"}",
      NAME ":1:14: JSON syntax error: \\u0000 is not allowed" },
};

START_TEST(test_syntax)
{
    ck_assert_int_eq(load(syntax_rows[_i].json), -1);
    ck_assert_msg(strncmp(err, syntax_rows[_i].err,
                          strlen(syntax_rows[_i].err)) == 0,
                  "got: %s", err);
    ck_assert_ptr_null(strchr(err, '\n'));
    assert_defaults(&c);
}
END_TEST

/* ---- cross-key rules ---------------------------------------------------- */

static const struct bad_row cross_rows[] = {
    { "{\"locks\": {\"default_ttl_ms\": 50}}", "locks.default_ttl_ms",
      "must be between locks.min_ttl_ms (100) and locks.max_ttl_ms "
      "(86400000)" },
    { "{\"locks\": {\"default_ttl_ms\": 90000000}}", "locks.default_ttl_ms",
      "must be between locks.min_ttl_ms" },
    { "{\"locks\": {\"max_ttl_ms\": 20000}}", "locks.default_ttl_ms",
      "and locks.max_ttl_ms (20000)" },
    { "{\"locks\": {\"min_ttl_ms\": 5000, \"max_ttl_ms\": 1000,"
      " \"default_ttl_ms\": 2000}}", "locks.min_ttl_ms",
      "must not be above locks.max_ttl_ms (1000)" },
    { "{\"redis\": {\"password\": \"a\", \"password_file\": \"/dev/null\"}}",
      "redis.password_file", "cannot be used together with redis.password" },
    { "{\"auth\": {\"password_file\": \"/nonexistent\", \"password\": \"a\"}}",
      "auth.password_file", "cannot be used together with auth.password" },
    { "{\"redis\": {\"username\": \"u\"}}", "redis.username",
      "needs redis.password or redis.password_file" },
    { "{\"listen\": [\"127.0.0.1:7390\", \"tcp://127.0.0.1:7390\"]}",
      "listen[1]", "repeats listen[0]" },
    { "{\"listen\": [\"[::1]:7390\", \"[0:0::1]:7390\"]}", "listen[1]",
      "repeats listen[0]" },
    { "{\"listen\": [\"unix:/tmp/a\", \"127.0.0.1:1\", \"unix:/tmp/a\"]}",
      "listen[2]", "repeats listen[0]" },
    { "{\"listen\": [\"unix:/tmp/a\", \"unix:///tmp/a\"]}", "listen[1]",
      "repeats listen[0]" },
    { "{\"redis\": {\"nodes\": [\"a.example:6379\", \"b:1\","
      " \"A.EXAMPLE:6379\"]}}", "redis.nodes[2]", "repeats redis.nodes[0]" },
    { "{\"metrics\": {\"listen\": \"127.0.0.1:7390\"}}", "metrics.listen",
      "is also listen[0]" },
    { "{\"listen\": [\"tls://127.0.0.1:7391\"]}", "tls.cert_file",
      "required by listen \"tls://127.0.0.1:7391\"" },
    { "{\"listen\": [\"tls://127.0.0.1:7391\"], \"tls\": {\"cert_file\":"
      " \"/a.crt\"}}", "tls.key_file", "required by listen" },
    { "{\"listen\": [\"127.0.0.1:7391\", \"tls://127.0.0.1:7391\"]}",
      "listen[1]", "repeats listen[0]" },
    { "{\"tls\": {\"verify_clients\": true}}", "tls.verify_clients",
      "needs tls.ca_file" },
    { "{\"tls\": {\"min_version\": \"1.1\"}}", "tls.min_version",
      "must be \"1.2\" or \"1.3\"" },
    { "{\"redis\": {\"nodes\": [\"tls://127.0.0.1:6379\"]}}",
      "redis.nodes", "tls:// is not allowed here" },
    { "{\"metrics\": {\"listen\": \"tls://127.0.0.1:9390\"}}",
      "metrics.listen", "tls:// is not allowed here" },
    { "{\"limits\": {\"max_line\": 64}, \"auth\": {\"password\":"
      " \"0123456789012345678901234567890123456789012345678901234567\"}}",
      "auth.password", "too long for an AUTH line" },
    { "{\"locks\": {\"fence_key\": \"lock:fence\"}}", "locks.fence_key",
      "\"lock:fence\" would also be the key of a lock on \"fence\"" },
    { "{\"locks\": {\"key_prefix\": \"\"}}", "locks.fence_key",
      "would also be the key of a lock on \"redlockd:fence\"" },
    /* a waiter's mark on resource x */
    { "{\"locks\": {\"fence_key\": \"lock:x waiting\"}}", "locks.fence_key",
      "\"lock:x waiting\" could also be a key redlockd writes" },
    /* the fences of x's shared holders */
    { "{\"locks\": {\"fence_key\": \"lock:x:shared fences\"}}",
      "locks.fence_key", "could also be a key redlockd writes" },
    /* x's shared set, slot 12 of x, with x at the longest name */
    { "{\"locks\": {\"max_resource_len\": 1, \"fence_key\": \"lock:x:shared\"}}",
      "locks.fence_key", "could also be a key redlockd writes" },
    { "{\"locks\": {\"max_resource_len\": 1, \"fence_key\": \"lock:x#12\"}}",
      "locks.fence_key", "could also be a key redlockd writes" },
    /* the marker and the ttl record are the counter's name and more */
    { "{\"locks\": {\"fence_key\": \"lock:\"}}", "locks.fence_key",
      "\"lock::admitted\" (the recovery marker) could also be a key" },
    { "{\"locks\": {\"key_prefix\": \"f\", \"fence_key\": \"f\"}}",
      "locks.fence_key", "\"f:admitted\" (the recovery marker)" },
};

/* metrics.resource_classes: a list of prefixes, each a class. */
static const struct bad_row class_rows[] = {
    { "{\"metrics\": {\"resource_classes\": \"first\"}}",
      "metrics.resource_classes",
      "must be \"prefix\" or a list of resource name prefixes" },
    { "{\"metrics\": {\"resource_classes\": 3}}",
      "metrics.resource_classes",
      "must be \"prefix\" or a list of resource name prefixes" },
    { "{\"metrics\": {\"resource_classes\": [\"job:\", 7]}}",
      "metrics.resource_classes[1]", "expected a string" },
    { "{\"metrics\": {\"resource_classes\": [\"\"]}}",
      "metrics.resource_classes[0]",
      "must be 1 to locks.max_resource_len (200) visible ASCII" },
    { "{\"metrics\": {\"resource_classes\": [\"a b\"]}}",
      "metrics.resource_classes[0]", "visible ASCII characters" },
    { "{\"locks\": {\"max_resource_len\": 3}, \"metrics\": "
      "{\"resource_classes\": [\"job:\"]}}", "metrics.resource_classes[0]",
      "must be 1 to locks.max_resource_len (3)" },
    { "{\"metrics\": {\"resource_classes\": [\"other\"]}}",
      "metrics.resource_classes[0]",
      "\"other\" is the class of the resources no prefix takes" },
    { "{\"metrics\": {\"resource_classes\": [\"a:\", \"b:\", \"a:\"]}}",
      "metrics.resource_classes[2]", "\"a:\" repeats "
      "metrics.resource_classes[0]" },
    { "{\"metrics\": {\"max_classes\": 1, \"resource_classes\":"
      " [\"a:\", \"b:\"]}}", "metrics.resource_classes",
      "2 prefixes, more than metrics.max_classes (1): list fewer or raise it" },
    { "{\"metrics\": {\"max_classes\": 1025}}", "metrics.max_classes",
      "must be between 0 and 1024" },
    { "{\"metrics\": {\"max_classes\": -1}}", "metrics.max_classes",
      "must be between 0 and 1024" },
};

START_TEST(test_classes_bad)
{
    const struct bad_row *r = &class_rows[_i];

    ck_assert_msg(load(r->json) == -1, "accepted: %s", r->json);
    assert_error(r->key, r->msg);
    assert_defaults(&c);
}
END_TEST

START_TEST(test_classes_list)
{
    ck_assert_msg(load("{\"metrics\": {\"resource_classes\": "
                       "[\"invoice:\", \"job:\"], \"max_classes\": 8}}") == 0,
                  "%s", err);
    ck_assert_uint_eq(c.metrics.nresource_classes, 2);
    ck_assert_str_eq(c.metrics.resource_classes[0], "invoice:");
    ck_assert_str_eq(c.metrics.resource_classes[1], "job:");
    ck_assert_uint_eq(c.metrics.max_classes, 8);
    /* [] is a list (every resource "other"), not "prefix". */
    ck_assert_int_eq(load("{\"metrics\": {\"resource_classes\": []}}"), 0);
    ck_assert_ptr_nonnull(c.metrics.resource_classes);
    ck_assert_uint_eq(c.metrics.nresource_classes, 0);
}
END_TEST

/* SIGHUP applies both; the report says what the classes were and are. */
struct class_report { int n; bool applied; char was[64], now[64]; };

static void collect_class_report(void *ud, const char *key, const char *was,
                                 const char *now, bool applied)
{
    struct class_report *r = ud;

    if (strncmp(key, "metrics.", 8) != 0)
        return;
    r->n++;
    r->applied = applied;
    snprintf(r->was, sizeof(r->was), "%s", was);
    snprintf(r->now, sizeof(r->now), "%s", now);
}

START_TEST(test_classes_reload)
{
    struct conf fresh;
    struct class_report rep = { 0 };

    ck_assert_int_eq(load("{}"), 0);
    ck_assert_int_eq(conf_load_string(&fresh, "{\"metrics\": "
                     "{\"resource_classes\": [\"a:\", \"b:\"]}}", NAME, err,
                     sizeof(err)), 0);
    ck_assert_int_eq(conf_reload(&c, &fresh, collect_class_report, &rep), 0);
    ck_assert_int_eq(rep.n, 1);
    ck_assert(rep.applied);
    ck_assert_str_eq(rep.was, "prefix");
    ck_assert_str_eq(rep.now, "[2 prefixes]");
    ck_assert_uint_eq(c.metrics.nresource_classes, 2);
    ck_assert_str_eq(c.metrics.resource_classes[1], "b:");
    ck_assert_ptr_null(fresh.metrics.resource_classes);     /* the old */
    conf_deinit(&fresh);

    /* The same list: nothing to report; another max_classes is live. */
    rep.n = 0;
    ck_assert_int_eq(conf_load_string(&fresh, "{\"metrics\": "
                     "{\"resource_classes\": [\"a:\", \"b:\"], "
                     "\"max_classes\": 5}}", NAME, err, sizeof(err)), 0);
    ck_assert_int_eq(conf_reload(&c, &fresh, collect_class_report, &rep), 0);
    ck_assert_int_eq(rep.n, 1);
    ck_assert(rep.applied);
    ck_assert_str_eq(rep.was, "32");
    ck_assert_uint_eq(c.metrics.max_classes, 5);
    conf_deinit(&fresh);
}
END_TEST

START_TEST(test_cross_rules)
{
    const struct bad_row *r = &cross_rows[_i];

    ck_assert_msg(load(r->json) == -1, "accepted: %s", r->json);
    assert_error(r->key, r->msg);
    assert_defaults(&c);
}
END_TEST

START_TEST(test_cross_rules_edges)
{
    /* One byte shorter than cross_rows' auth.password row: exactly fits. */
    ck_assert_msg(load("{\"limits\": {\"max_line\": 64},"
                       " \"auth\": {\"password\":"
                       " \"012345678901234567890123456789012345678901234567890"
                       "123456\"}}") == 0, "%s", err);
    conf_deinit(&c);
    ck_assert_msg(load("{\"locks\": {\"min_ttl_ms\": 30000,"
                       " \"max_ttl_ms\": 30000}}") == 0, "%s", err);
    conf_deinit(&c);
    ck_assert_msg(load("{\"metrics\": {\"listen\": \"127.0.0.1:7391\"}}") == 0,
                  "%s", err);
    /* fence keys that no resource name can reach */
    ck_assert_msg(load("{\"locks\": {\"key_prefix\": \"\","
                       " \"fence_key\": \"redlockd fence\"}}") == 0, "%s", err);
    ck_assert_msg(load("{\"locks\": {\"fence_key\": \"lock: fence\"}}") == 0,
                  "%s", err);
    conf_deinit(&c);
    ck_assert_msg(load("{\"locks\": {\"max_resource_len\": 1,"
                       " \"fence_key\": \"lock:xy#\"}}") == 0, "%s", err);
    conf_deinit(&c);
    ck_assert_msg(load("{\"locks\": {\"fence_key\": \"f\"}}") == 0,
                  "%s", err);
    ck_assert_msg(load("{\"locks\": {\"max_resource_len\": 4,"
                       " \"fence_key\": \"lock:fence\"}}") == 0, "%s", err);
}
END_TEST

/* ---- unix_socket_mode --------------------------------------------------- */

struct mode_row {
    const char *text;
    int ok;
    unsigned mode;      /* when ok */
};

#define OCTAL "expected an octal mode string such as \"0660\""

static const struct mode_row mode_rows[] = {
    { "0660", 1, 0660 }, { "660", 1, 0660 }, { "0600", 1, 0600 },
    { "0777", 1, 0777 }, { "000", 1, 0 }, { "0000", 1, 0 },
    { "66", 0, 0 }, { "06600", 0, 0 }, { "0680", 0, 0 }, { "0x1a", 0, 0 },
    { "", 0, 0 }, { "1000", 0, 0 }, { "-660", 0, 0 }, { " 660", 0, 0 },
};

START_TEST(test_socket_mode)
{
    const struct mode_row *r = &mode_rows[_i];
    char json[128];

    snprintf(json, sizeof(json), "{\"unix_socket_mode\": \"%s\"}", r->text);
    if (r->ok) {
        ck_assert_msg(load(json) == 0, "%s: %s", r->text, err);
        ck_assert_uint_eq(c.unix_socket_mode, r->mode);
    } else {
        ck_assert_msg(load(json) == -1, "accepted %s", r->text);
        assert_error("unix_socket_mode: ", strcmp(r->text, "1000") == 0 ?
                     "must be at most 0777" : OCTAL);
    }
}
END_TEST

/* ---- passwords from files ---------------------------------------------- */

struct secret_row {
    const char *section;    /* "redis" or "auth" */
    const char *content;
    const char *want;       /* NULL: expect an error containing `msg` */
    const char *msg;
};

static const struct secret_row secret_rows[] = {
    { "auth", "s3cret\n", "s3cret", NULL },
    { "auth", "s3cret", "s3cret", NULL },
    { "auth", "s3cret\r\nsecond line\n", "s3cret", NULL },
    { "redis", "pass with spaces\n", "pass with spaces", NULL },
    { "auth", "pass with spaces\n", NULL, "must not contain spaces" },
    { "auth", "", NULL, "the first line is empty" },
    { "redis", "\n", NULL, "the first line is empty" },
    { "redis", "\r\nsecret\n", NULL, "the first line is empty" },
    { "redis", "a\tb\n", NULL, "must not contain control characters" },
};

START_TEST(test_password_file)
{
    const struct secret_row *r = &secret_rows[_i];
    char *path = temp_file(r->content);
    char json[256], key[64];
    const char *got;

    snprintf(json, sizeof(json), "{\"%s\": {\"password_file\": \"%s\"}}",
             r->section, path);
    snprintf(key, sizeof(key), "%s.password_file", r->section);
    if (r->want) {
        ck_assert_msg(load(json) == 0, "%s", err);
        got = strcmp(r->section, "auth") == 0 ? c.auth.password
                                              : c.redis.password;
        ck_assert_str_eq(got, r->want);
    } else {
        ck_assert_int_eq(load(json), -1);
        assert_error(key, r->msg);
        ck_assert_msg(strstr(err, path), "no path in: %s", err);
        assert_defaults(&c);
    }
    unlink(path);
    free(path);
}
END_TEST

START_TEST(test_password_file_errors)
{
    char big[1024];

    ck_assert_int_eq(load("{\"redis\": {\"password_file\":"
                          " \"/nonexistent/pw\"}}"), -1);
    assert_error("redis.password_file", "/nonexistent/pw: cannot open:");
    ck_assert_int_eq(load("{\"auth\": {\"password_file\": \"/\"}}"), -1);
    assert_error("auth.password_file", "/: cannot read:");

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    char *path = temp_file(big);
    char json[128];

    snprintf(json, sizeof(json), "{\"auth\": {\"password_file\": \"%s\"}}",
             path);
    ck_assert_int_eq(load(json), -1);
    assert_error("auth.password_file", "the first line is too long");
    unlink(path);
    free(path);

    /* The username rule is satisfied by a password read from a file. */
    path = temp_file("pw\n");
    snprintf(json, sizeof(json), "{\"redis\": {\"username\": \"u\","
             " \"password_file\": \"%s\"}}", path);
    ck_assert_msg(load(json) == 0, "%s", err);
    ck_assert_str_eq(c.redis.password, "pw");
    unlink(path);
    free(path);
}
END_TEST

/* ---- loading from a file ----------------------------------------------- */

START_TEST(test_load_file)
{
    char *path = temp_file("{\n  \"log\": {\"level\": \"warning\"}\n}\n");

    ck_assert_msg(conf_load(&c, path, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(c.path, path);
    ck_assert_int_eq(c.log.level, CONF_LOG_WARNING);
    conf_deinit(&c);
    unlink(path);
    free(path);

    path = temp_file("{\n  \"log\": {\"level\": \"warning\",}\n}\n");
    ck_assert_int_eq(conf_load(&c, path, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, ":2:"));
    ck_assert_int_eq(strncmp(err, path, strlen(path)), 0);
    assert_defaults(&c);
    conf_deinit(&c);
    unlink(path);
    free(path);

    path = temp_file("{\"limits\": {\"max_line\": 1}}");
    ck_assert_int_eq(conf_load(&c, path, err, sizeof(err)), -1);
    ck_assert_int_eq(strncmp(err, path, strlen(path)), 0);
    ck_assert_ptr_nonnull(strstr(err, ": limits.max_line: must be between"));
    conf_deinit(&c);
    unlink(path);
    free(path);

    ck_assert_int_eq(conf_load(&c, "/nonexistent/r.json", err, sizeof(err)),
                     -1);
    ck_assert_str_eq(err, "/nonexistent/r.json: cannot open: "
                          "No such file or directory");
    assert_defaults(&c);
}
END_TEST

/* ---- address parsing --------------------------------------------------- */

struct addr_row {
    const char *text;
    bool allow_unix;
    int ok;
    enum conf_addr_kind kind;
    const char *host_or_path;
    int port;
};

#define TCP CONF_ADDR_TCP
#define UNX CONF_ADDR_UNIX

static const struct addr_row addr_rows[] = {
    { "127.0.0.1:7390", false, 1, TCP, "127.0.0.1", 7390 },
    { "tcp://127.0.0.1:7390", false, 1, TCP, "127.0.0.1", 7390 },
    { "tcp://0.0.0.0:1", false, 1, TCP, "0.0.0.0", 1 },
    { "10.1.2.3:65535", false, 1, TCP, "10.1.2.3", 65535 },
    { "[::1]:7390", false, 1, TCP, "::1", 7390 },
    { "tcp://[::]:7390", false, 1, TCP, "::", 7390 },
    { "[2001:DB8:0:0::1]:6379", false, 1, TCP, "2001:db8::1", 6379 },
    { "redis-1.example.com:6379", false, 1, TCP, "redis-1.example.com", 6379 },
    { "localhost:6379", false, 1, TCP, "localhost", 6379 },
    { "unix:/run/redlockd/redlockd.sock", true, 1, UNX,
      "/run/redlockd/redlockd.sock", 0 },
    { "unix:/a", true, 1, UNX, "/a", 0 },
    { "unix:///run/x.sock", true, 1, UNX, "/run/x.sock", 0 },
    { "tcp://redis-a:6379", false, 1, TCP, "redis-a", 6379 },
    /* 107 bytes of path: the longest that fits in sun_path */
    { "unix:/" "123456789012345678901234567890123456789012345678901234567890"
      "1234567890123456789012345678901234567890123456", true, 1, UNX,
      "/123456789012345678901234567890123456789012345678901234567890"
      "1234567890123456789012345678901234567890123456", 0 },
    { "unix:/" "123456789012345678901234567890123456789012345678901234567890"
      "12345678901234567890123456789012345678901234567",
      true, 0, UNX, NULL, 0 },
    { "unix:/run/x.sock", false, 0, UNX, NULL, 0 },
    { "unix:run/x.sock", true, 0, UNX, NULL, 0 },
    { "unix:", true, 0, UNX, NULL, 0 },
    { "127.0.0.1:0", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:65536", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:99999", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:100000", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:+80", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:80x", false, 0, TCP, NULL, 0 },
    { "127.0.0.1:", false, 0, TCP, NULL, 0 },
    { "127.0.0.1", false, 0, TCP, NULL, 0 },
    { ":7390", false, 0, TCP, NULL, 0 },
    { "256.0.0.1:7390", false, 0, TCP, NULL, 0 },
    { "1.2.3:7390", false, 0, TCP, NULL, 0 },
    { "::1:7390", false, 0, TCP, NULL, 0 },
    { "[::1]7390", false, 0, TCP, NULL, 0 },
    { "[::1:7390", false, 0, TCP, NULL, 0 },
    { "[127.0.0.1]:7390", false, 0, TCP, NULL, 0 },
    { "[fe80::1%eth0]:7390", false, 0, TCP, NULL, 0 },
    { "[]:7390", false, 0, TCP, NULL, 0 },
    { "http://127.0.0.1:80", false, 0, TCP, NULL, 0 },
    { "tcp://", false, 0, TCP, NULL, 0 },
    { "bad_host:1", false, 0, TCP, NULL, 0 },
    { "1.2.3.4.5:1", false, 0, TCP, NULL, 0 },
    { "/run/x.sock", true, 0, UNX, NULL, 0 },
    { "unix://host/x.sock", true, 0, UNX, NULL, 0 },
    { "tcp://unix:/x", true, 0, TCP, NULL, 0 },
    { "-bad:1", false, 0, TCP, NULL, 0 },
    { "", false, 0, TCP, NULL, 0 },
};

START_TEST(test_parse_addr)
{
    const struct addr_row *r = &addr_rows[_i];
    struct conf_addr a;
    int rc = conf_parse_addr(&a, r->text, r->allow_unix, err, sizeof(err));

    if (!r->ok) {
        ck_assert_msg(rc == -1, "accepted \"%s\"", r->text);
        ck_assert_msg(strstr(err, r->text), "%s", err);
        ck_assert_ptr_null(a.host);
        ck_assert_ptr_null(a.path);
        ck_assert_ptr_null(a.text);
        conf_addr_deinit(&a);
        return;
    }
    ck_assert_msg(rc == 0, "\"%s\": %s", r->text, err);
    ck_assert_int_eq(a.kind, r->kind);
    ck_assert_str_eq(a.text, r->text);
    if (r->kind == CONF_ADDR_TCP) {
        ck_assert_str_eq(a.host, r->host_or_path);
        ck_assert_int_eq(a.port, r->port);
        ck_assert_ptr_null(a.path);
    } else {
        ck_assert_str_eq(a.path, r->host_or_path);
        ck_assert_ptr_null(a.host);
    }
    conf_addr_deinit(&a);
    ck_assert_ptr_null(a.text);
}
END_TEST

START_TEST(test_parse_addr_messages)
{
    struct conf_addr a;

    ck_assert_int_eq(conf_parse_addr(&a, "127.0.0.1:0", false, err,
                                     sizeof(err)), -1);
    ck_assert_str_eq(err, "\"127.0.0.1:0\": port must be a number from 1 "
                          "to 65535");
    ck_assert_int_eq(conf_parse_addr(&a, "unix:x", true, err, sizeof(err)), -1);
    ck_assert_str_eq(err, "\"unix:x\": unix socket path must be absolute");
    ck_assert_int_eq(conf_parse_addr(&a, "::1:80", true, err, sizeof(err)), -1);
    ck_assert_str_eq(err, "\"::1:80\": IPv6 addresses must be in brackets, "
                          "as [::1]:PORT");
    /* A tiny buffer truncates, never overflows. */
    ck_assert_int_eq(conf_parse_addr(&a, "x", true, err, 8), -1);
    ck_assert_uint_eq(strlen(err), 7);
}
END_TEST

/* ---- the files shipped in conf/ ---------------------------------------- */

/* The source tree, found from this file's path as the compiler saw it
 * (meson runs tests from the build root, where __FILE__ is relative). */
static void conf_dir(char *buf, size_t size)
{
    const char *file = __FILE__;
    const char *tail = strstr(file, "tests/unit/test_conf.c");

    ck_assert_ptr_nonnull(tail);
    snprintf(buf, size, "%.*sconf", (int)(tail - file), file);
}

static void load_shipped(const char *name)
{
    char dir[512], path[600];

    conf_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ck_assert_msg(conf_load(&c, path, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(c.path, path);
}

START_TEST(test_shipped_default)
{
    load_shipped("redlockd.json");
    free(c.path);
    c.path = NULL;
    assert_defaults(&c);
}
END_TEST

START_TEST(test_shipped_one_node)
{
    load_shipped("one-node.json");
    ck_assert_uint_eq(c.redis.nnodes, 1);
}
END_TEST

START_TEST(test_shipped_three_nodes)
{
    load_shipped("three-nodes.json");
    ck_assert_uint_eq(c.redis.nnodes, 3);
    ck_assert_int_eq(c.redis.nodes[0].port, 6379);
    ck_assert_int_eq(c.redis.nodes[1].port, 6380);
    ck_assert_int_eq(c.redis.nodes[2].port, 6381);
    ck_assert_uint_eq(c.nlisten, 2);
    ck_assert_int_eq(c.listen[1].kind, CONF_ADDR_UNIX);
    ck_assert_str_eq(c.listen[1].path, "/run/redlockd/redlockd.sock");
}
END_TEST

/* ---- auth.users ---------------------------------------------------------- */

#define U1 "{\"name\": \"alice\", \"password\": \"pa\", \"prefixes\": "
START_TEST(test_users_good)
{
    ck_assert_msg(load("{\"auth\": {\"users\": ["
                       U1 "[\"invoice:\", \"job:\"], \"admin\": true},"
                       "{\"name\": \"bob\", \"password\": \"a=b\", "
                       "\"prefixes\": []},"
                       "{\"name\": \"root\", \"password\": \"r\", "
                       "\"prefixes\": [\"\"], \"admin\": false}]}}") == 0,
                  "%s", err);
    ck_assert_uint_eq(c.auth.nusers, 3);
    ck_assert_str_eq(c.auth.users[0].name, "alice");
    ck_assert_str_eq(c.auth.users[0].password, "pa");
    ck_assert_ptr_null(c.auth.users[0].password_file);
    ck_assert_uint_eq(c.auth.users[0].nprefixes, 2);
    ck_assert_str_eq(c.auth.users[0].prefixes[1], "job:");
    ck_assert(c.auth.users[0].admin);
    ck_assert_uint_eq(c.auth.users[1].nprefixes, 0);
    ck_assert(!c.auth.users[1].admin);
    ck_assert_str_eq(c.auth.users[2].prefixes[0], "");
    /* An empty list is no users at all (login as before). */
    ck_assert_int_eq(load("{\"auth\": {\"users\": []}}"), 0);
    ck_assert_uint_eq(c.auth.nusers, 0);
    ck_assert_ptr_null(c.auth.users);
    ck_assert_int_eq(load("{}"), 0);
    ck_assert_uint_eq(c.auth.nusers, 0);
}
END_TEST

static const struct { const char *json, *key, *msg; } user_bad_rows[] = {
    { "{\"auth\": {\"users\": {}}}", "auth.users",
      "expected a list of user objects" },
    { "{\"auth\": {\"users\": null}}", "auth.users", "expected a list" },
    { "{\"auth\": {\"users\": [\"alice\"]}}", "auth.users[0]",
      "expected an object" },
    { "{\"auth\": {\"users\": [" U1 "[], \"role\": 1}]}}",
      "auth.users[0].role", "unknown key" },
    { "{\"auth\": {\"users\": [{\"password\": \"p\", \"prefixes\": []}]}}",
      "auth.users[0].name", "required" },
    { "{\"auth\": {\"users\": [{\"name\": \"\", \"password\": \"p\", "
      "\"prefixes\": []}]}}", "auth.users[0].name", "must be 1 to 64" },
    { "{\"auth\": {\"users\": [{\"name\": \"a b\", \"password\": \"p\", "
      "\"prefixes\": []}]}}", "auth.users[0].name", "spaces" },
    { "{\"auth\": {\"users\": [{\"name\": \"caf\\u00e9\", \"password\": "
      "\"p\", \"prefixes\": []}]}}", "auth.users[0].name", "visible ASCII" },
    { "{\"auth\": {\"users\": [{\"name\": 7, \"password\": \"p\", "
      "\"prefixes\": []}]}}", "auth.users[0].name", "expected a string" },
    { "{\"auth\": {\"users\": [" U1 "[]}, " U1 "[]}]}}",
      "auth.users[1].name", "\"alice\" repeats auth.users[0].name" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"prefixes\": []}]}}",
      "auth.users[0]", "needs password or password_file" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"password\": \"p\", "
      "\"password_file\": \"/dev/null\", \"prefixes\": []}]}}",
      "auth.users[0]", "cannot be used together" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"password\": \"\", "
      "\"prefixes\": []}]}}", "auth.users[0].password", "must be 1 to" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"password\": \"p q\", "
      "\"prefixes\": []}]}}", "auth.users[0].password", "spaces" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"password_file\": "
      "\"/nonexistent/pw\", \"prefixes\": []}]}}",
      "auth.users[0].password_file", "/nonexistent/pw: cannot open" },
    { "{\"auth\": {\"users\": [{\"name\": \"a\", \"password\": \"p\"}]}}",
      "auth.users[0].prefixes", "required" },
    { "{\"auth\": {\"users\": [" U1 "\"job:\"}]}}",
      "auth.users[0].prefixes", "expected a list of strings" },
    { "{\"auth\": {\"users\": [" U1 "[\"job:\", 3]}]}}",
      "auth.users[0].prefixes[1]", "expected a string" },
    { "{\"auth\": {\"users\": [" U1 "[\"a b\"]}]}}",
      "auth.users[0].prefixes[0]", "visible ASCII" },
    { "{\"locks\": {\"max_resource_len\": 3}, \"auth\": {\"users\": ["
      U1 "[\"job:\"]}]}}", "auth.users[0].prefixes[0]",
      "locks.max_resource_len (3)" },
    { "{\"auth\": {\"users\": [" U1 "[], \"admin\": 1}]}}",
      "auth.users[0].admin", "expected true or false" },
    { "{\"limits\": {\"max_line\": 64}, \"auth\": {\"users\": [{\"name\": "
      "\"alice\", \"password\": \"" "0123456789012345678901234567890123456789"
      "01234567890123456789\", \"prefixes\": []}]}}", "auth.users[0]",
      "too long for an AUTH line" },
};

START_TEST(test_users_bad)
{
    ck_assert_msg(load(user_bad_rows[_i].json) == -1, "row %d loaded", _i);
    assert_error(user_bad_rows[_i].key, user_bad_rows[_i].msg);
    ck_assert_uint_eq(c.auth.nusers, 0);
}
END_TEST

/* A password_file is read at load; a file others may read is kept for
 * conf_warnings, which names the file and never its content. */
static void collect_warning(void *ud, const char *msg)
{
    char *out = ud;
    strncat(out, msg, 1023 - strlen(out));
    strncat(out, "\n", 1023 - strlen(out));
}

START_TEST(test_users_password_file)
{
    char *path = temp_file("fil3-secret\r\nignored\n");
    char json[512], warned[1024] = "";

    snprintf(json, sizeof(json), "{\"auth\": {\"users\": [{\"name\": \"a\", "
             "\"password_file\": \"%s\", \"prefixes\": [\"x\"]}]}}", path);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_msg(load(json) == 0, "%s", err);
    ck_assert_str_eq(c.auth.users[0].password, "fil3-secret");
    ck_assert_str_eq(c.auth.users[0].password_file, path);
    ck_assert(!c.auth.users[0].file_readable);
    conf_warnings(&c, collect_warning, warned);
    ck_assert_str_eq(warned, "");
    /* The daemon's group may read it (0640), as the docs suggest. */
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_msg(load(json) == 0, "%s", err);
    ck_assert(!c.auth.users[0].file_readable);

    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_msg(load(json) == 0, "%s", err);
    ck_assert(c.auth.users[0].file_readable);
    conf_warnings(&c, collect_warning, warned);
    ck_assert_msg(strstr(warned, path) && strstr(warned, "auth.users[0]"),
                  "%s", warned);
    ck_assert_msg(!strstr(warned, "fil3-secret"), "%s", warned);
    ck_assert_msg(!strchr(warned, '\n') || strchr(warned, '\n')[1] == '\0',
                  "more than one line: %s", warned);
    unlink(path);
    free(path);
}
END_TEST

/* SIGHUP: users are live, and the report never shows a secret. */
struct report { int n; bool applied; char was[64], now[64]; };

static void collect_report(void *ud, const char *key, const char *was,
                           const char *now, bool applied)
{
    struct report *r = ud;
    if (strcmp(key, "auth.users") != 0)
        return;
    r->n++;
    r->applied = applied;
    snprintf(r->was, sizeof(r->was), "%s", was);
    snprintf(r->now, sizeof(r->now), "%s", now);
}

START_TEST(test_users_reload)
{
    struct conf fresh;
    struct report rep = { 0 };

    ck_assert_int_eq(load("{\"auth\": {\"users\": [" U1 "[\"a:\"]}]}}"), 0);
    ck_assert_int_eq(conf_load_string(&fresh, "{\"auth\": {\"users\": ["
                     U1 "[\"b:\", \"c:\"], \"admin\": true}]}}", NAME, err,
                     sizeof(err)), 0);
    ck_assert_int_eq(conf_reload(&c, &fresh, collect_report, &rep), 0);
    ck_assert_int_eq(rep.n, 1);
    ck_assert(rep.applied);
    ck_assert_str_eq(rep.was, "");
    ck_assert_str_eq(rep.now, "");
    ck_assert_uint_eq(c.auth.nusers, 1);
    ck_assert_uint_eq(c.auth.users[0].nprefixes, 2);
    ck_assert_str_eq(c.auth.users[0].prefixes[0], "b:");
    ck_assert(c.auth.users[0].admin);
    ck_assert_uint_eq(fresh.auth.users[0].nprefixes, 1);   /* the old */
    conf_deinit(&fresh);

    /* The same list again: nothing to report. A changed password is. */
    rep.n = 0;
    ck_assert_int_eq(conf_load_string(&fresh, "{\"auth\": {\"users\": ["
                     U1 "[\"b:\", \"c:\"], \"admin\": true}]}}", NAME, err,
                     sizeof(err)), 0);
    conf_reload(&c, &fresh, collect_report, &rep);
    ck_assert_int_eq(rep.n, 0);
    conf_deinit(&fresh);
    ck_assert_int_eq(conf_load_string(&fresh, "{\"auth\": {\"users\": ["
                     "{\"name\": \"alice\", \"password\": \"new\", "
                     "\"prefixes\": [\"b:\", \"c:\"], \"admin\": true}]}}",
                     NAME, err, sizeof(err)), 0);
    conf_reload(&c, &fresh, collect_report, &rep);
    ck_assert_int_eq(rep.n, 1);
    ck_assert_str_eq(c.auth.users[0].password, "new");
    conf_deinit(&fresh);

    /* Removed: no users left. */
    ck_assert_int_eq(conf_load_string(&fresh, "{}", NAME, err, sizeof(err)),
                     0);
    conf_reload(&c, &fresh, collect_report, &rep);
    ck_assert_uint_eq(c.auth.nusers, 0);
    conf_deinit(&fresh);
}
END_TEST

/* With users, remote peers can log in: no protected-mode warning. */
START_TEST(test_users_protected_mode)
{
    char warned[1024] = "";

    ck_assert_int_eq(load("{\"listen\": [\"0.0.0.0:7390\"], \"auth\": "
                          "{\"users\": [" U1 "[]}]}}"), 0);
    conf_warnings(&c, collect_warning, warned);
    ck_assert_str_eq(warned, "");
}
END_TEST

/* ------------------------------------------------------------------------ */

static TCase *tcase(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_add_checked_fixture(tc, setup, teardown);
    return tc;
}

static Suite *conf_suite(void)
{
    Suite *s = suite_create("conf");
    TCase *tc;

    tc = tcase("defaults");
    tcase_add_test(tc, test_init_defaults);
    tcase_add_test(tc, test_empty_object_defaults);
    tcase_add_test(tc, test_all_keys);
    tcase_add_loop_test(tc, test_good_values, 0, ROWS(good_rows));
    suite_add_tcase(s, tc);

    tc = tcase("errors");
    tcase_add_loop_test(tc, test_bad_values, 0, ROWS(bad_rows));
    tcase_add_loop_test(tc, test_structure, 0, ROWS(structure_rows));
    tcase_add_loop_test(tc, test_syntax, 0, ROWS(syntax_rows));
    tcase_add_loop_test(tc, test_cross_rules, 0, ROWS(cross_rows));
    tcase_add_loop_test(tc, test_classes_bad, 0, ROWS(class_rows));
    tcase_add_test(tc, test_classes_list);
    tcase_add_test(tc, test_classes_reload);
    tcase_add_test(tc, test_cross_rules_edges);
    tcase_add_loop_test(tc, test_socket_mode, 0, ROWS(mode_rows));
    suite_add_tcase(s, tc);

    tc = tcase("files");
    tcase_add_loop_test(tc, test_password_file, 0, ROWS(secret_rows));
    tcase_add_test(tc, test_password_file_errors);
    tcase_add_test(tc, test_load_file);
    tcase_add_test(tc, test_shipped_default);
    tcase_add_test(tc, test_shipped_one_node);
    tcase_add_test(tc, test_shipped_three_nodes);
    suite_add_tcase(s, tc);

    tc = tcase("users");
    tcase_add_test(tc, test_users_good);
    tcase_add_loop_test(tc, test_users_bad, 0, ROWS(user_bad_rows));
    tcase_add_test(tc, test_users_password_file);
    tcase_add_test(tc, test_users_reload);
    tcase_add_test(tc, test_users_protected_mode);
    suite_add_tcase(s, tc);

    tc = tcase("addresses");
    tcase_add_loop_test(tc, test_parse_addr, 0, ROWS(addr_rows));
    tcase_add_test(tc, test_parse_addr_messages);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(conf_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
