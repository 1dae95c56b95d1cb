/*
 * stats_glue: the stats providers for modules that must not know stats.
 *
 * lockmgr is a leaf and never includes stats.h; pool and node keep their
 * counters to themselves. This file, above them all, reads their accessors
 * and fills a report's values, by name only: lockmgr's counters as its
 * LOCKMGR_COUNTERS list maps them to STATS_CODEC rows, node's numbers
 * from struct node_report, one field per STATS_NODE_CODEC row (and the
 * STATS "nodes" objects from the same report). A name that does not
 * match fails to compile. main calls stats_glue_register once, after
 * stats_init.
 */
#ifndef REDLOCKD_STATS_GLUE_H
#define REDLOCKD_STATS_GLUE_H

#include <stdint.h>

/* For lockmgr's lease-end observer (it is a leaf, so it is handed this
 * rather than calling stats): a lease stopped being held after held_ms. */
void stats_glue_lease_ended(uint64_t held_ms);

/* Returns 0, or -1 when stats has no room for the providers. */
int stats_glue_register(void);

#endif
