#!/usr/bin/env bash
# run.sh: measure redlockd on this machine (method in docs/benchmarks.md).
#
# Builds redlockd and redlockd-bench if needed, starts three redis-server
# nodes (no persistence) and one redlockd on free loopback ports, all in
# one temporary directory, runs every redlockd-bench mode with parameters
# sized for a 2-core machine (about two minutes in all), then
# redis-benchmark against one node as the Redis ceiling of this machine.
# Everything it started is stopped and the directory removed on exit,
# Ctrl-C included.
#
# Usage: tests/bench/run.sh
# Environment (all optional):
#   BUILD_DIR      meson build directory (default: a persistent one in
#                  ${TMPDIR:-/tmp}, so later runs only rebuild what changed)
#   RESULTS_DIR    keep each mode's JSON result (and the daemon log) there
#   DURATION       seconds per throughput run (default 10)
#   IDLE_SESSIONS  sessions of the idle run (default 10000)
#   IDLE_HOLD      seconds the idle locks are held (default 20; with the
#                  30 s ttl, renewals run every 10 s)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-${TMPDIR:-/tmp}/redlockd-bench-build}
duration=${DURATION:-10}
idle_sessions=${IDLE_SESSIONS:-10000}
idle_hold=${IDLE_HOLD:-20}

run_dir=""
daemon_pid=""
redis_pids=()
redis_ports=()

log() { printf '%s\n' "$*" >&2; }

# Stop a process we started: TERM, up to 10 s, then KILL.
stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local pid
    if [ -n "$daemon_pid" ]; then
        stop_pid "$daemon_pid"
    fi
    for pid in "${redis_pids[@]}"; do
        stop_pid "$pid"
    done
    if [ -n "$run_dir" ]; then
        rm -rf "$run_dir"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- build ------------------------------------------------------------------

bench_bin=$build/tests/bench/redlockd-bench
daemon_bin=$build/daemon/redlockd

if [ ! -f "$build/build.ninja" ]; then
    log "== meson setup $build"
    meson setup "$build" "$repo" >/dev/null
fi
log "== building in $build"
ninja -C "$build" daemon/redlockd >/dev/null
if ninja -C "$build" -t targets all | grep -q '^tests/bench/redlockd-bench:'; then
    ninja -C "$build" tests/bench/redlockd-bench >/dev/null
else
    # tests/meson.build does not include tests/bench yet: build it alone.
    mkdir -p "$build/tests/bench"
    # shellcheck disable=SC2046  # pkg-config output is a list of flags
    cc -std=c11 -O2 -g -Wall -Wextra -D_GNU_SOURCE \
        -o "$bench_bin" "$repo/tests/bench/redlockd-bench.c" \
        $(pkg-config --cflags --libs jansson)
fi

# ---- processes ----------------------------------------------------------------

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/redlockd-bench.XXXXXX")
results=${RESULTS_DIR:-$run_dir/results}
mkdir -p "$results"

# Enough descriptors for the idle run in this shell, which the daemon and
# the bench inherit.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((idle_sessions + 200)) ]; then
    idle_sessions=$((hard - 200))
    log "note: the hard RLIMIT_NOFILE is $hard; idle run uses $idle_sessions sessions"
fi
ulimit -n "$hard"

taken_ports=" "

# A loopback port nothing listens on now (checked by connecting), not
# handed out before in this run. A race with other programs remains; the
# callers retry with another port if the bind fails.
free_port() {
    local p i
    for ((i = 0; i < 500; i++)); do
        p=$((20000 + RANDOM % 12000))
        case $taken_ports in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken_ports+="$p "
            echo "$p"
            return 0
        fi
    done
    log "no free port found"
    return 1
}

start_redis() {
    local n=$1 attempt port dir pid i
    for ((attempt = 0; attempt < 5; attempt++)); do
        port=$(free_port)
        dir=$run_dir/redis$n
        mkdir -p "$dir"
        redis-server --port "$port" --bind 127.0.0.1 --save '' \
            --appendonly no --dir "$dir" --logfile "$dir/redis.log" \
            --daemonize no &
        pid=$!
        for ((i = 0; i < 100; i++)); do
            if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
                redis_pids+=("$pid")
                redis_ports+=("$port")
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        stop_pid "$pid"
    done
    log "redis-server $n did not start; see $dir/redis.log"
    return 1
}

# One request line to the daemon; prints the reply line.
daemon_cmd() {
    local reply
    exec 3<>"/dev/tcp/127.0.0.1/$daemon_port"
    printf '%s\n' "$1" >&3
    IFS= read -r -t 5 reply <&3 || reply=""
    exec 3>&-
    printf '%s\n' "$reply"
}

start_daemon() {
    local attempt nodes="" port i
    for port in "${redis_ports[@]}"; do
        nodes+="${nodes:+, }\"127.0.0.1:$port\""
    done
    for ((attempt = 0; attempt < 5; attempt++)); do
        daemon_port=$(free_port)
        cat >"$run_dir/redlockd.json" <<EOF
{
  "listen": ["tcp://127.0.0.1:$daemon_port", "unix:$run_dir/redlockd.sock"],
  "redis": { "nodes": [$nodes] },
  "limits": { "max_clients": $((idle_sessions + 1000)) },
  "log": { "level": "info" }
}
EOF
        "$daemon_bin" -c "$run_dir/redlockd.json" 2>"$run_dir/redlockd.log" &
        daemon_pid=$!
        # Ready when it answers and all three nodes vote.
        for ((i = 0; i < 100; i++)); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$daemon_port") 2>/dev/null &&
                daemon_cmd STATS | grep -q '"nodes_voting":3'; then
                return 0
            fi
            kill -0 "$daemon_pid" 2>/dev/null || break
            sleep 0.1
        done
        stop_pid "$daemon_pid"
        daemon_pid=""
    done
    log "redlockd did not start:"
    cat "$run_dir/redlockd.log" >&2
    return 1
}

for n in 1 2 3; do
    start_redis "$n"
done
start_daemon

cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "== machine: $(nproc) CPUs (${cpu_model:-unknown model}), $(uname -sr)"
echo "== $("$daemon_bin" --version), redis $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p'), nodes on ports ${redis_ports[*]}, daemon pid $daemon_pid on port $daemon_port"

bench() {
    local name=$1
    shift
    echo
    "$bench_bin" -s "127.0.0.1:$daemon_port" --pid "$daemon_pid" \
        --json-file "$results/$name.json" "$@"
}

# ---- runs ---------------------------------------------------------------------

# The daemon alone: parse, dispatch, reply.
bench ping -c 50 -P 16 -d "$duration" ping
# Redlock round trips to three nodes per request, one request at a time
# per connection, then eight LOCK+UNLOCK pairs in flight per connection.
bench lock -c 50 -d "$duration" lock
bench lock-pipelined -c 50 -P 8 -d "$duration" lock
# One hot resource, twenty clients queued on it.
bench contend -c 20 -w 5000 -d "$duration" contend
# Memory per session holding a renewed lock, renewal CPU, release on drop.
bench idle -c "$idle_sessions" -H "$idle_hold" -t 30000 idle

echo
echo "== daemon after the runs (STATS):"
daemon_cmd STATS | sed 's/^OK //' |
    jq -c '{commands, errors, acquisitions, renewals, renewal_failures,
            leases_lost, nodes: [.nodes[] | {node, timeouts, errors,
            latency_ms: (.latency_ms * 1000 | round / 1000)}]}' 2>/dev/null ||
    daemon_cmd STATS

echo
echo "== Redis ceiling: redis-benchmark -q -n 100000 -t set against node 1"
# -q still redraws a progress line with CRs; keep the final line only.
redis-benchmark -p "${redis_ports[0]}" -q -n 100000 -t set |
    tr '\r' '\n' | grep -v 'rps=' | grep '[^[:space:]]'

if [ -n "${RESULTS_DIR:-}" ]; then
    cp "$run_dir/redlockd.log" "$results/redlockd.log"
    echo
    echo "== JSON results and the daemon log in $results"
fi
