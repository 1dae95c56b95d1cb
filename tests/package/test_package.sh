#!/usr/bin/env bash
# test_package: the Debian packages built from a copy of this checkout,
# linted, installed, used from the installed files only, upgraded over a
# local edit, purged and installed again (scripts/test --package).
#
# Usage: tests/package/test_package.sh RESULTS
#
# As root on a Debian 12 machine with the build dependencies installed
# (scripts/test --package installs them first) and none of the packages
# installed. Appends one JSON line per check to RESULTS ({"name", "result":
# "OK" or "FAIL"}, as meson's testlog.json), for scripts/test's closing
# count; exits non-zero at the first failed check, after cleaning up: the
# redlockd and redis-server processes it started are stopped by PID, the
# packages purged, the redlockd user removed if the test made it, and the
# work directory removed (kept, and named, after a failure).
#
# systemd need not run (CI's machine has no init): the daemon is started as
# redlockd.service would start it, from the installed unit's own lines
# (User, Group, UMask, LimitNOFILE, RuntimeDirectory, ExecStartPre,
# ExecStart), and the unit is checked with systemd-analyze verify.
set -euo pipefail

if [ $# -ne 1 ]; then
    sed -n '6p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2
    exit 2
fi
results=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The binary packages of debian/control, and the debug symbols dh makes.
packages=(redlockd redlockd-tools libredlockd0 libredlockd-dev python3-redlockd)
unit=/lib/systemd/system/redlockd.service
conf=/etc/redlockd/redlockd.json

work=""
daemon_pid=""
redis_pids=()
user_was_there=0
# The directories the packages or their user make (none is here before).
own_dirs=(/etc/redlockd /var/lib/redlockd /run/redlockd)
current=""
failed=0

# ---- checks and their record ----

record() {
    printf '{"name": "package / %s", "result": "%s"}\n' "$1" "$2" >>"$results"
}

# begin NAME: a check starts; ok: it passed. A command that fails in
# between ends the script (set -e), and the EXIT trap records NAME as FAIL.
begin() {
    current=$1
    echo "--- package: $1"
}

ok() {
    record "$current" OK
    current=""
}

die() {
    echo "package: $*" >&2
    exit 1
}

# ---- processes ----

# stop_pid PID SECONDS: SIGTERM, then SIGKILL after SECONDS. Only PIDs this
# script started are ever passed here.
stop_pid() {
    local pid=$1 secs=$2 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

installed_packages() {
    local p status
    for p in "${packages[@]}" "${packages[@]/%/-dbgsym}"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null ||
                 true)
        if [ -n "$status" ] && [ "$status" != not-installed ]; then
            echo "$p"
        fi
    done
}

apt_get() {
    DEBIAN_FRONTEND=noninteractive apt-get -q -y \
        -o Dpkg::Use-Pty=0 --no-install-recommends "$@"
}

purge_all() {
    local left
    mapfile -t left < <(installed_packages)
    if [ "${#left[@]}" -gt 0 ]; then
        apt_get purge "${left[@]}" >"$work/purge.log" 2>&1 ||
            { cat "$work/purge.log"; return 1; }
    fi
}

cleanup() {
    local rc=$?
    trap - EXIT
    if [ -n "$current" ]; then
        record "$current" FAIL
        failed=1
    fi
    [ -z "$daemon_pid" ] || stop_pid "$daemon_pid" 15
    local pid
    for pid in "${redis_pids[@]}"; do
        stop_pid "$pid" 5
    done
    if [ -n "$work" ]; then
        purge_all || echo "package: purge failed in cleanup" >&2
        # What a failed purge left.
        rm -rf "${own_dirs[@]}"
        if [ "$user_was_there" -eq 0 ] && getent passwd redlockd >/dev/null; then
            userdel redlockd 2>/dev/null || true
        fi
        if [ "$user_was_there" -eq 0 ] && getent group redlockd >/dev/null; then
            groupdel redlockd 2>/dev/null || true
        fi
        if [ "$failed" -eq 0 ] && [ "$rc" -eq 0 ]; then
            rm -rf "$work"
        else
            echo "package: failed; logs kept in $work" >&2
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# ---- before anything: a machine this test may install on ----

begin "preflight"
[ "$(id -u)" -eq 0 ] || die "run as root (it installs and purges packages)"
mapfile -t already < <(installed_packages)
[ "${#already[@]}" -eq 0 ] ||
    die "already installed here, not touching them: ${already[*]}"
if getent passwd redlockd >/dev/null || getent group redlockd >/dev/null; then
    user_was_there=1
fi
for d in "${own_dirs[@]}"; do
    [ ! -e "$d" ] || die "$d is here (another install?), not touching it"
done
work=$(mktemp -d /tmp/redlockd-package.XXXXXX)
# apt reads the .deb files as its own user (_apt).
chmod 755 "$work"
version=$(cd "$repo" && meson introspect --projectinfo meson.build |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
[ -n "$version" ]
ok

# ---- build ----

begin "build (dpkg-buildpackage -us -uc -b)"
src=$work/src/redlockd
mkdir -p "$src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked files and new ones not ignored: what a commit would hold.
    (cd "$repo" && git ls-files -z -c -o --exclude-standard |
        xargs -0 cp -a --parents -t "$src")
else
    (cd "$repo" && tar -c --exclude='./build*' --exclude=./obj-* . |
        tar -x -C "$src")
fi
(cd "$src" && dpkg-checkbuilddeps)
start=$SECONDS
if ! (cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1; then
    tail -n 60 "$work/build.log"
    die "dpkg-buildpackage failed (log: $work/build.log)"
fi
echo "built in $((SECONDS - start)) s"
changes=$work/src/redlockd_${version}_$(dpkg-architecture -qDEB_HOST_ARCH).changes
[ -f "$changes" ] || die "no $changes: debian/changelog's version is not $version"
debs=()
for p in "${packages[@]}"; do
    deb=$(echo "$work/src/${p}_${version}_"*.deb)
    [ -f "$deb" ] || die "no package $p $version"
    debs+=("$deb")
done
ls -l "$work/src/"*.deb
ok

begin "lintian: no errors, no warnings"
# Errors and warnings fail (each one is fixed, or overridden with its
# reason in debian/*.lintian-overrides); info and pedantic tags are shown.
lint_rc=0
lintian --fail-on error,warning --display-info --pedantic "$changes" \
    >"$work/lintian.log" 2>&1 || lint_rc=$?
grep -v '^running with root privileges' "$work/lintian.log" || true
[ "$lint_rc" -eq 0 ] || die "lintian reports errors or warnings"
ok

# ---- install ----

begin "install (apt-get install ./*.deb)"
apt_get install "$work/src/"*.deb >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; die "apt-get install failed"; }
for f in /usr/sbin/redlockd "$unit" /lib/systemd/system/redlockd.socket \
         /usr/lib/tmpfiles.d/redlockd.conf /usr/lib/sysusers.d/redlockd.conf \
         "$conf" /usr/share/man/man8/redlockd.8.gz \
         /usr/share/man/man5/redlockd.json.5.gz \
         /usr/bin/redlockctl /usr/bin/redlockd-taskq \
         /usr/share/man/man1/redlockctl.1.gz \
         /usr/share/man/man1/redlockd-taskq.1.gz \
         /usr/include/redlockd.h \
         /usr/lib/python3/dist-packages/redlockd/__init__.py; do
    [ -e "$f" ] || die "not installed: $f"
done
dpkg-query -W -f='${Conffiles}\n' redlockd | grep -q " $conf " ||
    die "$conf is not a conffile"
# The static user and group the unit runs as, made by the package.
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd redlockd) ||
    die "no redlockd user"
[ "$(getent group redlockd | cut -d: -f3)" = "$gid" ] || die "no redlockd group"
[ "$uid" -lt 1000 ] || die "redlockd is not a system user (uid $uid)"
[ "$home" = /var/lib/redlockd ] || die "redlockd's home is $home"
case $shell in */nologin | /bin/false) ;; *) die "redlockd's shell is $shell" ;; esac
if command -v systemd-tmpfiles >/dev/null; then
    [ "$(stat -c %U:%G:%a /var/lib/redlockd)" = redlockd:redlockd:750 ] ||
        die "/var/lib/redlockd: $(stat -c %U:%G:%a /var/lib/redlockd)"
fi
ok

begin "unit (systemd-analyze verify)"
grep -qx 'User=redlockd' "$unit"
grep -qx 'Group=redlockd' "$unit"
if grep -q '^DynamicUser' "$unit"; then die "the unit still has DynamicUser"; fi
systemd-analyze verify "$unit" /lib/systemd/system/redlockd.socket
ok

# ---- run it, from the installed files only ----

begin "daemon: started as the unit would, as user redlockd"
# Free loopback ports, as the kernel hands them out.
read -r -a ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
port=${ports[0]}
redis_pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
for p in "${ports[@]:1}"; do
    mkdir -p "$work/redis-$p"
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
        --requirepass "$redis_pass" --daemonize no --dir "$work/redis-$p" \
        --logfile "$work/redis-$p/redis.log" </dev/null &
    redis_pids+=("$!")
done
for p in "${ports[@]:1}"; do
    for ((i = 0; i < 50; i++)); do
        REDISCLI_AUTH=$redis_pass redis-cli -p "$p" ping 2>/dev/null |
            grep -q PONG && break
        sleep 0.1
    done
    [ "$i" -lt 50 ] || die "redis-server on port $p did not start"
done
# The password file as the docs say: 0640 root:redlockd, which the daemon's
# user reads and nobody else does.
install -m 0640 -o root -g redlockd /dev/null /etc/redlockd/redis.pass
echo "$redis_pass" >/etc/redlockd/redis.pass
cat >"$conf" <<EOF
{
  "listen": ["tcp://127.0.0.1:$port", "unix:/run/redlockd/redlockd.sock"],
  "redis": {
    "nodes": ["127.0.0.1:${ports[1]}", "127.0.0.1:${ports[2]}", "127.0.0.1:${ports[3]}"],
    "password_file": "/etc/redlockd/redis.pass"
  },
  "locks": { "max_ttl_ms": 60000 },
  "shutdown_timeout_ms": 2000
}
EOF
# What the unit says, read from the installed unit.
unit_key() {
    sed -n "s/^$1=//p" "$unit" | tail -n 1
}
user=$(unit_key User)
group=$(unit_key Group)
read -r -a exec_pre <<<"$(unit_key ExecStartPre)"
read -r -a exec_start <<<"$(unit_key ExecStart)"
[ "$user:$group:${exec_start[0]}" = redlockd:redlockd:/usr/sbin/redlockd ] ||
    die "the unit runs ${exec_start[0]} as $user:$group"
as_unit() {
    setpriv --reuid="$user" --regid="$group" --init-groups --no-new-privs \
        --inh-caps=-all --bounding-set=-all -- "$@"
}
rundir=/run/$(unit_key RuntimeDirectory)
install -d -o "$user" -g "$group" -m "$(unit_key RuntimeDirectoryMode)" "$rundir"
(cd / && umask "$(unit_key UMask)" && as_unit "${exec_pre[@]}")
# LimitNOFILE, as far as this machine's hard limit lets root raise it (a
# container may cap it below the unit's value; systemd would fail there).
nofile=$(unit_key LimitNOFILE)
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$nofile" -gt "$hard" ]; then
    nofile=$hard
fi
(
    cd /
    umask "$(unit_key UMask)"
    ulimit -n "$nofile"
    exec setpriv --reuid="$user" --regid="$group" --init-groups \
        --no-new-privs --inh-caps=-all --bounding-set=-all -- \
        "${exec_start[@]}" </dev/null >"$work/redlockd.log" 2>&1
) &
daemon_pid=$!
for ((i = 0; i < 100; i++)); do
    redlockctl -s "127.0.0.1:$port" ping >/dev/null 2>&1 && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
redlockctl -s "127.0.0.1:$port" ping ||
    { cat "$work/redlockd.log"; die "the daemon does not answer"; }
[ "$(ps -o user= -p "$daemon_pid")" = redlockd ] ||
    die "the daemon runs as $(ps -o user= -p "$daemon_pid")"
[ "$(stat -c %U:%G "$rundir/redlockd.sock")" = redlockd:redlockd ]
ok

begin "redlockctl run: a command under a lock"
# shellcheck disable=SC2016 # the command's shell expands them
out=$(cd "$work" && redlockctl -s "127.0.0.1:$port" run --wait 5s pkg:job -- \
      sh -c 'echo "fence=$REDLOCKD_FENCE resource=$REDLOCKD_RESOURCE"')
echo "$out"
[[ $out =~ ^fence=[0-9]+\ resource=pkg:job$ ]]
ok

begin "python3: a lock with the packaged client"
(cd "$work" && env -u PYTHONPATH /usr/bin/python3 -E -s - "$version" <<'EOF'
import sys
import redlockd
assert redlockd.__file__ == "/usr/lib/python3/dist-packages/redlockd/__init__.py", redlockd.__file__
assert redlockd.__version__ == sys.argv[1], redlockd.__version__
with redlockd.Client("unix:/run/redlockd/redlockd.sock", name="package") as c:
    with c.lock("pkg:python", ttl=10000, wait=5000) as lease:
        print("python: got", lease.resource, "fence", lease.fence)
        lease.check()
EOF
)
ok

begin "C: a program built with pkg-config --cflags --libs redlockd"
# The README's example (tests/client/example.c), against the installed
# header and library; and linked statically (pkg-config --static).
read -r -a flags <<<"$(pkg-config --cflags --libs redlockd)"
cc -Wall -Werror -o "$work/example" "$src/tests/client/example.c" "${flags[@]}"
ldd "$work/example" | grep -q '/libredlockd.so.0 '
"$work/example" "127.0.0.1:$port"
read -r -a static_libs <<<"$(pkg-config --static --libs redlockd)"
static_libs=("${static_libs[@]/#-lredlockd/$(pkg-config --variable=libdir redlockd)/libredlockd.a}")
read -r -a cflags <<<"$(pkg-config --cflags redlockd)"
cc -Wall -Werror -o "$work/example-static" "${cflags[@]}" \
    "$src/tests/client/example.c" "${static_libs[@]}"
if ldd "$work/example-static" | grep -q libredlockd; then
    die "the static link uses libredlockd.so"
fi
"$work/example-static" "127.0.0.1:$port"
ok

begin "stop: SIGTERM, a clean exit within the unit's TimeoutStopSec"
timeout=$(unit_key TimeoutStopSec)
timeout=${timeout%s}
kill -TERM "$daemon_pid"
for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=""
[ "$rc" -eq 0 ] || { tail -n 20 "$work/redlockd.log"; die "exit status $rc"; }
ok

begin "upgrade keeps the edited conffile"
cp "$conf" "$work/conf.edited"
DEBIAN_FRONTEND=noninteractive dpkg -i "$work/src/redlockd_${version}_"*.deb \
    >"$work/upgrade.log" 2>&1 || { cat "$work/upgrade.log"; false; }
cmp "$conf" "$work/conf.edited"
[ -f /etc/redlockd/redis.pass ]
[ "$(getent passwd redlockd | cut -d: -f3)" = "$uid" ]
ok

# ---- purge, and nothing left ----

# Every file the packages hold, from the .deb files themselves.
package_files() {
    local deb
    for deb in "$@"; do
        dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -n 's|^\./\(.*[^/]\)$|/\1|p'
    done
}

# Files of the packages, or of their user, still on the machine.
leftovers() {
    local f
    while read -r f; do
        if [ -e "$f" ] || [ -L "$f" ]; then echo "$f"; fi
    done < <(package_files "$@")
    for f in "${own_dirs[@]}" /usr/lib/python3/dist-packages/redlockd; do
        if [ -e "$f" ]; then echo "$f"; fi
    done
    find /etc /var /run /usr /lib /tmp /srv /opt /home /root -xdev \
        \( -user redlockd -o -group redlockd \) -print 2>/dev/null || true
    # The units' enablement (symlinks and deb-systemd-helper's state).
    find /etc/systemd /var/lib/systemd -name '*redlockd*' -print 2>/dev/null ||
        true
    installed_packages
}

begin "purge: no file of the packages or of their user is left"
purge_all
remains=$(leftovers "$work/src/"*.deb)
[ -z "$remains" ] || die "left after purge: $remains"
ok

begin "reinstall after purge"
apt_get install "${debs[@]}" >"$work/reinstall.log" 2>&1 ||
    { cat "$work/reinstall.log"; die "apt-get install failed"; }
[ "$(getent passwd redlockd | cut -d: -f3)" = "$uid" ]
dpkg-deb --fsys-tarfile "$work/src/redlockd_${version}_"*.deb |
    tar -xO "./etc/redlockd/redlockd.json" | cmp - "$conf"
(cd / && as_unit /usr/sbin/redlockd --check-config -c "$conf")
(cd "$work" && /usr/bin/python3 -E -s -c 'import redlockd')
purge_all
remains=$(leftovers "${debs[@]}")
[ -z "$remains" ] || die "left after the second purge: $remains"
ok
