/*
 * The libredlockd example shown in the README: take a lock, waiting up to
 * five seconds, do the work under it, release it. Built by the tests so the
 * README's program can not rot. Usage: example [ADDR] (default:
 * $REDLOCKD_SERVER, else 127.0.0.1:7390).
 */
#include <inttypes.h>
#include <stdio.h>

#include <redlockd.h>

int main(int argc, char **argv)
{
    struct redlockd_opts opts = { .server = argc > 1 ? argv[1] : NULL,
                                  .name = "example" };
    struct redlockd_error err;
    struct redlockd_lease lease;
    struct redlockd *h;

    if (redlockd_connect(&h, &opts, &err) < 0) {
        fprintf(stderr, "connect: %s\n", err.msg);
        return 1;
    }
    if (redlockd_lock(h, "example:job", 10000, 5000, 1, &lease) < 0) {
        fprintf(stderr, "lock: %s\n", redlockd_last_error(h)->msg);
        redlockd_close(h);
        return 1;
    }
    printf("got %s, fence %" PRIu64 "\n", lease.resource, lease.fence);
    /* ... work, passing lease.fence to the storage; stop if
     * redlockd_lost(h, "example:job") says so ... */
    redlockd_unlock(h, "example:job");
    redlockd_close(h);
    return 0;
}
