/*
 * stats: see stats.h.
 */
#include "stats.h"

#include "lockmgr.h"
#include "pool.h"
#include "server.h"
#include "session.h"
#include "timer.h"

struct stats stats;

void stats_init(void)
{
    stats = (struct stats){ 0 };
    stats.started_at = timer_now();
}

#define STAT(name) json_integer((json_int_t)stats.name)
#define LSTAT(name) json_integer((json_int_t)lockmgr_counters()->name)

json_t *stats_json(void)
{
    json_t *o = json_object();
    json_t *acq = json_object();

    json_object_set_new(o, "version", json_string(REDLOCKD_VERSION));
    json_object_set_new(o, "uptime_ms",
                        json_integer((json_int_t)(timer_now() - stats.started_at)));
    json_object_set_new(o, "connections", json_integer((json_int_t)session_count()));
    json_object_set_new(o, "connections_total", STAT(connections_total));
    json_object_set_new(o, "connections_rejected", STAT(connections_rejected));
    json_object_set_new(o, "sessions", json_integer((json_int_t)session_count()));
    json_object_set_new(o, "commands", STAT(commands));
    json_object_set_new(o, "errors", STAT(errors));
    json_object_set_new(o, "locks_held", json_integer((json_int_t)lockmgr_held_count()));
    json_object_set_new(o, "waiters", json_integer((json_int_t)lockmgr_waiter_count()));
    json_object_set_new(acq, "ok", LSTAT(acquire_ok));
    json_object_set_new(acq, "busy", LSTAT(acquire_busy));
    json_object_set_new(acq, "timeout", LSTAT(acquire_timeout));
    json_object_set_new(acq, "unavailable", LSTAT(acquire_unavailable));
    json_object_set_new(o, "acquisitions", acq);
    json_object_set_new(o, "releases", LSTAT(releases));
    json_object_set_new(o, "extends", LSTAT(extends));
    json_object_set_new(o, "renewals", LSTAT(renewals));
    json_object_set_new(o, "renewal_failures", LSTAT(renewal_failures));
    json_object_set_new(o, "leases_lost", LSTAT(leases_lost));
    json_object_set_new(o, "waits", LSTAT(waits));
    json_object_set_new(o, "wakeups_notified", LSTAT(wakeups_notified));
    json_object_set_new(o, "wakeups_retry", LSTAT(wakeups_retry));
    json_object_set_new(o, "output_overflows", STAT(output_overflows));
    json_object_set_new(o, "nodes_total", json_integer(pool_nnodes()));
    json_object_set_new(o, "nodes_voting", json_integer(pool_nodes_voting()));
    json_object_set_new(o, "quorum", json_integer(pool_quorum()));
    json_object_set_new(o, "nodes", pool_stats_json());
    return o;
}
