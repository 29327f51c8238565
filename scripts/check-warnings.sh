#!/usr/bin/env bash
# make lint's warnings check: builds every target (libraries, tools, benchmarks, tests) with Swift warnings as
# errors, in a scratch path of its own so the flag does not invalidate the everyday build, and fails on any other
# `warning:` line (SwiftPM's own, a C compiler's). The flag is given here, not in Package.swift: unsafe flags there
# would stop other packages from depending on this one.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"${SWIFT:-swift}" build --build-tests --scratch-path .build/lint -Xswiftc -warnings-as-errors >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ] || grep -q "warning:" "$log"; then
    grep -E "(warning|error):" "$log" | sort -u >&2 || true
    echo "check-warnings: the build printed warnings or failed (exit $status)" >&2
    exit 1
fi
echo "check-warnings: every target builds with no warning"
