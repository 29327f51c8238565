#!/usr/bin/env bash
# make lint: every lock in the package is a FanoutMutex (Sources/FanoutCore/FanoutMutex.swift), never a
# Synchronization.Mutex of its own. ThreadSanitizer builds (make sanitize) make FanoutMutex a pthread mutex, the
# only lock TSan sees on Linux; a Mutex used directly would bring back races TSan reports because it cannot see
# the lock (its contended hand-over is a futex syscall), and every real one among them would be lost in those.
set -euo pipefail
cd "$(dirname "$0")/.."
found=$(grep -rnP --include='*.swift' '(?<![A-Za-z0-9_.])Mutex\s*[<(]' Sources Tools Tests Benchmarks Fuzz examples \
    | grep -v '^Sources/FanoutCore/FanoutMutex.swift:' || true)
if [ -n "$found" ]; then
    echo "Synchronization.Mutex used directly (use FanoutMutex, which ThreadSanitizer builds can see):"
    echo "$found"
    exit 1
fi
