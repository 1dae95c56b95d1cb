/*
 * stats_glue: the stats providers for modules that must not know stats.
 *
 * lockmgr is a leaf and pool sits below stats' readers, so neither
 * includes stats.h; this file, above them all, reads their accessors and
 * fills a report's values. main calls stats_glue_register once, after
 * stats_init.
 */
#ifndef REDLOCKD_STATS_GLUE_H
#define REDLOCKD_STATS_GLUE_H

/* Returns 0, or -1 when stats has no room for the providers. */
int stats_glue_register(void);

#endif
