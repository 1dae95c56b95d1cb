#!/usr/bin/env bash
# run.sh: kept for old habits; the benchmark is scripts/bench now (see
# docs/benchmarks.md). Arguments and environment pass through.
set -euo pipefail
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/bench" "$@"
