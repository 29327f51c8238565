#!/usr/bin/env bash
# Reference-counting calls (swift_retain, swift_release) per notification on throughput-1c's path, counted
# exactly with uprobes on the Swift runtime: two runs of the bench's child job (SMALL and LARGE tokens, one loop,
# one connection, 1,000 streams) against mock-apns, and the difference divided by LARGE - SMALL, so a job's fixed
# costs cancel out. The mock's own calls per request are counted over the same runs (perf stat -p on it). Each counted call traps into the kernel, so the runs are slow (about 10,000 notifications a
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
mock_pid=$(jobs -p | tail -1)
perf probe -q -x "$runtime" -a swift_retain -a swift_release
events=(-e probe_libswiftCore:swift_retain -e probe_libswiftCore:swift_release)
totals() { awk -F, '/swift_retain/ {r = $1} /swift_release/ {l = $1} END {print r, l}' "$1"; }

job() {  # job TOKENS: one bench child job against the mock
    "$bin/fanout-bench" --child job --port "$port" --ca "$work/tls/ca.pem" --key "$work/tls/auth-key.p8" \
        --tokens "$1" > /dev/null
}
count() {  # count TOKENS: "RETAINS RELEASES" of the child
    perf stat -x, "${events[@]}" -o "$work/stat" "$bin/fanout-bench" --child job --port "$port" \
        --ca "$work/tls/ca.pem" --key "$work/tls/auth-key.p8" --tokens "$1" > /dev/null
    totals "$work/stat"
}
count_mock() {  # count_mock TOKENS: "RETAINS RELEASES" of the mock, in a run of its own (a probed mock is slower,
    # which changes how the child's turns batch, so the two are not counted in the same run)
    perf stat -x, "${events[@]}" -p "$mock_pid" -o "$work/mock-stat" &
    local stat=$!
    sleep 0.3  # perf attaches
    job "$1"
    kill -INT "$stat"
    wait "$stat" || true
    totals "$work/mock-stat"
}
job 2000  # warm-up: the mock's first connection
read -r retains_small releases_small < <(count "$small")
read -r retains_large releases_large < <(count "$large")
read -r mock_retains_small mock_releases_small < <(count_mock "$small")
read -r mock_retains_large mock_releases_large < <(count_mock "$large")
per() { awk -v a="$1" -v b="$2" -v n=$((large - small)) 'BEGIN {printf "%.1f", (b - a) / n}'; }
echo "per notification: swift_retain $(per "$retains_small" "$retains_large")," \
    "swift_release $(per "$releases_small" "$releases_large") (runs of $small and $large tokens)"
echo "mock-apns per request: swift_retain $(per "$mock_retains_small" "$mock_retains_large")," \
    "swift_release $(per "$mock_releases_small" "$mock_releases_large")"
