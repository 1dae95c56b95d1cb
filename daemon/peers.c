/*
 * peers: see peers.h.
 */
#include "peers.h"

#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "log.h"
#include "pool.h"
#include "timer.h"

#define PEERS_ANNOUNCE_MS 5000
/* Warned once per other daemon (its instance id), and no more often than
 * this in all. */
#define PEERS_WARN_MS 60000

static struct {
    const struct conf *conf;
    struct timer announce;
    char warned[POOL_INSTANCE_ID_LEN + 1];  /* the last one warned about */
    uint64_t warned_at;
    bool stopped;
} P;

static void announce_cb(struct timer *t)
{
    char msg[8 + POOL_INSTANCE_ID_LEN + CONF_ID_MAX];
    int n;

    (void)t;
    if (P.stopped)
        return;
    n = snprintf(msg, sizeof(msg), "I %s %s", pool_instance_id(),
                 P.conf->id);
    if (n > 0 && (size_t)n < sizeof(msg))
        pool_publish_watch(msg, (size_t)n);
    timer_start(&P.announce, PEERS_ANNOUNCE_MS);
}

void peers_init(const struct conf *conf)
{
    P.conf = conf;
    P.stopped = false;
    P.warned[0] = '\0';
    timer_init(&P.announce, announce_cb, NULL);
    timer_start(&P.announce, 0);
}

void peers_stop(void)
{
    P.stopped = true;
    timer_stop(&P.announce);
}

bool peers_on_message(const char *msg, size_t len)
{
    const char *inst, *id;
    size_t ilen, idlen;
    uint64_t now = timer_now();

    if (len < 2 || msg[0] != 'I' || msg[1] != ' ')
        return false;
    inst = msg + 2;
    id = memchr(inst, ' ', len - 2);
    if (!P.conf || !id)
        return true;
    ilen = (size_t)(id - inst);
    id++;
    idlen = len - (size_t)(id - msg);
    if (ilen != POOL_INSTANCE_ID_LEN ||
        memcmp(inst, pool_instance_id(), ilen) == 0 ||
        idlen != strlen(P.conf->id) || memcmp(id, P.conf->id, idlen) != 0)
        return true;
    if (memcmp(P.warned, inst, ilen) == 0 && now - P.warned_at < PEERS_WARN_MS)
        return true;
    memcpy(P.warned, inst, ilen);
    P.warned[ilen] = '\0';
    P.warned_at = now;
    log_warn("another redlockd on these redis nodes (instance %s) has this "
             "daemon's id \"%s\": holders' labels, STATUS and WATCH cannot "
             "tell the two apart; give each daemon its own `id` in the "
             "configuration", P.warned, P.conf->id);
    return true;
}
