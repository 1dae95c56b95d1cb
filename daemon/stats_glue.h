/*
 * stats_glue: the one place where the daemon's numbers enter the stats
 * codec (stats.h has the rule).
 *
 * Every module keeps its counters to itself and knows no stats. This
 * file, above them all, reads their accessors and fills a report's
 * values, by name only: lockmgr's counters as its LOCKMGR_COUNTERS list
 * maps them to STATS_CODEC rows; conn's, the server's and the sessions'
 * counters (struct conn_counters, server_counters, session_counters; the
 * TLS failures by the names of TLS_FAILURES); node's numbers from struct
 * node_report, one field per STATS_NODE_CODEC row (and the STATS "nodes"
 * objects from the same report); and the classes of the per-class
 * histograms (rclass.h), which it owns. It is also the observer of
 * lockmgr (waits and holds), the sessions (LOCK answers) and the pool
 * (node replies), which feed the histograms stats keeps. A name that does
 * not match fails to compile. main calls stats_glue_register once, after
 * stats_init, and stats_glue_configure after each reload.
 */
#ifndef REDLOCKD_STATS_GLUE_H
#define REDLOCKD_STATS_GLUE_H

struct conf;

/* The providers, and the observers of lockmgr (the wait and hold
 * histograms, per class of c's metrics.resource_classes), the sessions
 * and the pool. Returns 0, or -1 when stats has no room for the
 * providers. */
int stats_glue_register(const struct conf *c);
/* A reload: classes made anew when c's settings differ from the ones in
 * use (their histograms then start from zero), else nothing. */
void stats_glue_configure(const struct conf *c);
/* At exit: the classes freed, nothing observed any more. */
void stats_glue_deinit(void);

#endif
