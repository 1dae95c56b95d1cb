#!/usr/bin/env bash
# test.sh: the Node client's tests (meson's "node" suite runs this).
#
#   client/node/scripts/test.sh [TEST_FILE...]
#
# npm ci when node_modules is missing or older than package-lock.json (the
# two pinned build tools: typescript, @types/node), the build (tsc, strict,
# to dist/esm and dist/cjs), tsc --noEmit on the TypeScript user of the
# types (test/types), then node --test on each test file (test/*.test.mjs,
# or those named), one after another. The tests start real redis-server
# nodes and real redlockd processes on free loopback ports: REDLOCKD_BIN
# names the daemon (default: the checkout's build/daemon/redlockd).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

if [ ! -f node_modules/.package-lock.json ] ||
    [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "test.sh: npm ci in client/node" >&2
    npm ci --no-audit --no-fund --loglevel=error
fi

node scripts/build.mjs
node node_modules/typescript/bin/tsc -p test/types/tsconfig.json

REDLOCKD_BIN=${REDLOCKD_BIN:-$here/../../build/daemon/redlockd}
case $REDLOCKD_BIN in /*) ;; *) REDLOCKD_BIN=$PWD/$REDLOCKD_BIN ;; esac
if [ ! -x "$REDLOCKD_BIN" ]; then
    echo "test.sh: no redlockd at $REDLOCKD_BIN (meson setup build && meson compile -C build, or set REDLOCKD_BIN)" >&2
    exit 1
fi
export REDLOCKD_BIN

if [ $# -eq 0 ]; then
    set -- test/*.test.mjs
fi
status=0
for f in "$@"; do
    echo "test.sh: node --test $f" >&2
    node --test "$f" || status=1
done
exit $status
