#!/usr/bin/env bash
# Reference-counting calls (swift_retain, swift_release) per notification on throughput-1c's path, counted
# exactly with uprobes on the Swift runtime: two runs of the bench's child job (SMALL and LARGE tokens, one loop,
# one connection, 1,000 streams) against mock-apns, and the difference divided by LARGE - SMALL, so a job's fixed
# costs cancel out. Each counted call traps into the kernel, so the runs are slow (about 10,000 notifications a
# second); the counts, not the time, are the figure. Needs root and perf (Debian's linux-perf).
# Usage:
#   scripts/count-arc.sh [SMALL] [LARGE]
set -euo pipefail
small=${1:-10000}
large=${2:-30000}
bin=$(swift build -c release --show-bin-path)
runtime=$(ldd "$bin/fanout-bench" | awk '/libswiftCore.so/ {print $3}')
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; perf probe -q -d "probe_libswiftCore:*" 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$work/tls" --threads 1 --key-id BENCHKEY01 --team-id BENCHTEAM1 \
    > "$work/mock.out" &
for _ in $(seq 100); do grep -q listening "$work/mock.out" && break; sleep 0.1; done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/mock.out")
perf probe -q -x "$runtime" -a swift_retain -a swift_release

count() {  # count TOKENS: "RETAINS RELEASES"
    perf stat -x, -e probe_libswiftCore:swift_retain -e probe_libswiftCore:swift_release -o "$work/stat" \
        "$bin/fanout-bench" --child job --port "$port" --ca "$work/tls/ca.pem" --key "$work/tls/auth-key.p8" \
        --tokens "$1" > /dev/null
    awk -F, '/swift_retain/ {r = $1} /swift_release/ {l = $1} END {print r, l}' "$work/stat"
}
count 2000 > /dev/null  # warm-up: the mock's first connection
read -r retains_small releases_small < <(count "$small")
read -r retains_large releases_large < <(count "$large")
awk -v a="$retains_small" -v b="$retains_large" -v c="$releases_small" -v d="$releases_large" -v n=$((large - small)) \
    'BEGIN {printf "per notification: swift_retain %.1f, swift_release %.1f (runs of %d and %d tokens)\n", (b - a) / n, (d - c) / n, '"$small"', '"$large"'}'
