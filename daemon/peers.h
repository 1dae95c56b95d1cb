/*
 * peers: the other daemons on the same nodes, as far as one needs to know
 * them: each daemon says on the daemons' channel (pool.h, the watch
 * channel) who it is every PEERS_ANNOUNCE_MS, "I <instance id> <id>", and
 * warns when another live daemon uses its `id` (the host name by
 * default): their holders' labels, STATUS and EVENT HOLDER could not tell
 * the two apart, and an operator reading them would be misled.
 */
#ifndef REDLOCKD_PEERS_H
#define REDLOCKD_PEERS_H

#include <stdbool.h>
#include <stddef.h>

struct conf;

void peers_init(const struct conf *conf);
/* The daemon stops: no more announcements (before the timers go). */
void peers_stop(void);
/* A message on the daemons' channel that starts with "I ": true if it was
 * one (handled), false for others. */
bool peers_on_message(const char *msg, size_t len);

#endif
