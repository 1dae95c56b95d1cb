/*
 * stats: the daemon's counters and gauges, reported by STATS (and
 * /metrics if enabled). Counters only grow; gauges are read live from the
 * modules that own them when the report is built.
 */
#ifndef REDLOCKD_STATS_H
#define REDLOCKD_STATS_H

#include <stdint.h>

#include <jansson.h>

struct stats {
    uint64_t started_at;            /* uv_now ms */
    uint64_t connections_total;
    uint64_t connections_rejected;  /* max_clients, protected mode */
    uint64_t commands;
    uint64_t errors;                /* ERR replies sent */
    uint64_t output_overflows;
};

extern struct stats stats;

void stats_init(void);
/* The STATS reply object. */
json_t *stats_json(void);

#endif
