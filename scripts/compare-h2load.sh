#!/usr/bin/env bash
# h2load's rate against mock-apns and against nghttpd on this machine, same flags
# (-c 4 -m 100, 300-byte body, TLS), median of RUNS runs each, the two alternating, after one unmeasured
# warm-up run each (the mock's first requests grow its buffers and statistics). Also each server's CPU time
# per request (user + system, from /proc), which other load on the machine changes far less than the rates.
# Usage:
#   scripts/compare-h2load.sh [REQUESTS] [RUNS] [MOCK_THREADS]
set -euo pipefail
requests=${1:-200000}
runs=${2:-3}
threads=${3:-2}
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

python3 -c "import json; print(json.dumps({'aps': {'alert': {'title': 'Benchmark', 'body': 'x' * 240}}}, separators=(',', ':')))" \
    | head -c 300 > "$work/body.json"
python3 - "$work/body.json" <<'PY'
import sys, json
path = sys.argv[1]
body = {'aps': {'alert': {'title': 'Benchmark', 'body': ''}}}
base = len(json.dumps(body, separators=(',', ':')))
body['aps']['alert']['body'] = 'x' * (300 - base)
open(path, 'w').write(json.dumps(body, separators=(',', ':')))
PY
token=$(printf '%064x' 1)

"$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$work/tls" --no-auth --threads "$threads" > "$work/mock.out" &
mock_pid=$!
for _ in $(seq 100); do grep -q listening "$work/mock.out" && break; sleep 0.1; done
mock_port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/mock.out")

mkdir -p "$work/docroot/3/device" && echo ok > "$work/docroot/3/device/$token"
nghttpd_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nghttpd -n "$threads" -d "$work/docroot" "$nghttpd_port" "$work/tls/server-key.pem" "$work/tls/server.pem" >/dev/null 2>&1 &
nghttpd_pid=$!
sleep 0.5

ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system time of process $1, in clock ticks
rate() {  # rate URL PID: "REQ/S US_PER_REQUEST"
    local before after result
    before=$(cpu_ticks "$2")
    result=$(h2load -n "$requests" -c 4 -m 100 -d "$work/body.json" -H 'apns-topic: com.example.bench' "$1" 2>&1 \
        | sed -n 's/.*finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p')
    after=$(cpu_ticks "$2")
    echo "$result $(awk -v t="$((after - before))" -v hz="$ticks" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')"
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "cores: $(nproc), requests per run: $requests, runs: $runs, server threads: $threads, load: $(cut -d' ' -f1-3 /proc/loadavg)"
mock_url="https://127.0.0.1:$mock_port/3/device/$token"
nghttpd_url="https://127.0.0.1:$nghttpd_port/3/device/$token"
rate "$mock_url" "$mock_pid" > /dev/null
rate "$nghttpd_url" "$nghttpd_pid" > /dev/null
mock_rates=(); nghttpd_rates=(); mock_cpu=(); nghttpd_cpu=()
for _ in $(seq "$runs"); do
    read -r r c < <(rate "$mock_url" "$mock_pid"); mock_rates+=("$r"); mock_cpu+=("$c")
    read -r r c < <(rate "$nghttpd_url" "$nghttpd_pid"); nghttpd_rates+=("$r"); nghttpd_cpu+=("$c")
done
mock_median=$(printf '%s\n' "${mock_rates[@]}" | median)
nghttpd_median=$(printf '%s\n' "${nghttpd_rates[@]}" | median)
echo "mock-apns: ${mock_rates[*]} req/s (median $mock_median)"
echo "nghttpd:   ${nghttpd_rates[*]} req/s (median $nghttpd_median)"
echo "CPU per request: mock-apns ${mock_cpu[*]} us (median $(printf '%s\n' "${mock_cpu[@]}" | median))," \
    "nghttpd ${nghttpd_cpu[*]} us (median $(printf '%s\n' "${nghttpd_cpu[@]}" | median)); load: $(cut -d' ' -f1-3 /proc/loadavg)"
# Also each mock run against the nghttpd run right after it: the machine's speed drifts between runs, and the median
# of these pairs moves less than the ratio of the two medians.
paired_median=$(for i in "${!mock_rates[@]}"; do
    awk -v m="${mock_rates[$i]}" -v n="${nghttpd_rates[$i]}" 'BEGIN {printf "%.4f\n", m / n}'
done | median)
awk -v m="$mock_median" -v n="$nghttpd_median" -v p="$paired_median" \
    'BEGIN {printf "mock-apns / nghttpd = %.2f (run by run: median %.2f)\n", m / n, p}'
