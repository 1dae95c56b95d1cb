#!/usr/bin/env bash
# run.sh: the go suite (meson test --suite go): go vet, then go test -race,
# over the Go client's module (client/go). Its tests start real
# redis-server and redlockd processes ($REDLOCKD_BIN) on free loopback
# ports.
#
# Usage: tests/go/run.sh GO MODULE_DIR BUILD_DIR
#
# Offline and self-contained: the module needs nothing but the standard
# library (GOPROXY=off), and Go's build cache and GOPATH live in BUILD_DIR
# unless GOCACHE or GOPATH are set, so no home directory is needed.
set -euo pipefail

go=$1
module=$2
build=$3

export GOCACHE=${GOCACHE:-$build/go-cache}
export GOPATH=${GOPATH:-$build/go-path}
export GOPROXY=off GOFLAGS=-mod=mod GO111MODULE=on GOTELEMETRY=off
# -race needs cgo (and the C compiler scripts/deps installs).
export CGO_ENABLED=1

cd "$module"
"$go" vet ./...
exec "$go" test -race -count=1 -timeout 240s ./...
