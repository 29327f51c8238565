#!/usr/bin/env bash
# follow-kill.sh [PRODUCERS] [JOBS] [TOKENS]: `fanout send --follow` as a live queue under concurrent producers and
# two SIGKILLs. PRODUCERS (3) run `fanout append` at once, JOBS (10,000) jobs of TOKENS (100) tokens in all, in
# batches; the sender is killed with SIGKILL at a third and at two thirds of the results and started again with
# --resume; at the end it is stopped with SIGTERM. (JOBS is rounded up to a multiple of PRODUCERS.) Checks: one results line per (job, token), every job line whole
# (no interleaving, none lost), and mock-apns's resends per kill within the in-flight bound. Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
producers=${1:-3} jobs=${2:-10000} tokens=${3:-100}
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d "${TMPDIR:-/tmp}/follow-kill.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$work/tls" --key-id KEYID12345 --team-id TEAMID1234 --threads 2 \
    --record "$work/record.txt" > "$work/mock.out" 2> "$work/mock.err" &
for _ in $(seq 100); do grep -q '^listening on' "$work/mock.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/mock.out")
queue="$work/queue.jsonl" results="$work/results.jsonl"
: > "$queue"
echo '{"rate_limits": {"default": {"requests_per_hour": 1000000000}}}' > "$work/send.json"
send() {
    "$bin/fanout" send --jobs "$queue" --follow --results "$results" --config "$work/send.json" \
        --endpoint "localhost:$port" --ca-file "$work/tls/ca.pem" --key "$work/tls/auth-key.p8" \
        --key-id KEYID12345 --team-id TEAMID1234 --progress never --loops 1 --connections 2 "$@" \
        > "$work/send.out" 2>> "$work/send.err" &
    sender=$!
}
lines() { [ -f "$results" ] && tr -cd '\n' < "$results" | wc -c || echo 0; }
per=$(((jobs + producers - 1) / producers)) batches=10
jobs=$((per * producers)) total=$((per * producers * tokens))
for p in $(seq 0 $((producers - 1))); do
    awk -v p=$p -v per=$per -v tokens=$tokens 'BEGIN {
        for (j = 0; j < per; j++) {
            n = p * per + j
            printf "{\"id\": \"p%d-%d\", \"topic\": \"com.example.app\", \"push_type\": \"alert\", \"payload\": {\"aps\": {\"alert\": \"x\"}}, \"tokens\": [", p, n
            for (t = 0; t < tokens; t++) printf "%s\"%064x\"", (t ? ", " : ""), n * tokens + t
            print "]}"
        }
    }' > "$work/p$p.jsonl"
    split -n l/$batches -d "$work/p$p.jsonl" "$work/p$p.batch."
done
started=$(date +%s.%N)
send
for p in $(seq 0 $((producers - 1))); do
    (for b in "$work"/p$p.batch.*; do "$bin/fanout" append --jobs "$queue" - < "$b" > /dev/null; sleep 0.2; done) &
done
for fraction in 3 2; do
    target=$((total / fraction))
    until [ "$(lines)" -ge "$target" ]; do sleep 0.05; done
    kill -KILL $sender; wait $sender 2>/dev/null || true
    echo "killed at $(lines) results lines"
    send --resume
done
until [ "$(lines)" -ge "$total" ]; do sleep 0.1; done
kill -TERM $sender; wait $sender
finished=$(date +%s.%N)
echo "summary: $(tail -1 "$work/send.out")"
kill %1 2>/dev/null; sleep 0.5
python3 - "$results" "$queue" "$work/record.txt" "$total" "$jobs" <<'PY'
import json, sys, collections
results, queue, record, total, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
keys = [(o["job"], o["token"]) for o in map(json.loads, open(results))]
lines = open(queue).read().splitlines()
whole = sum(1 for line in lines if json.loads(line))
sent = collections.Counter(line.split()[0] for line in open(record))
resent = sum(n - 1 for n in sent.values())
print(f"results lines {len(keys)} (distinct {len(set(keys))}) of {total}; job lines {len(lines)}, whole {whole} of {jobs}; "
      f"tokens accepted by the mock {len(sent)}, resent {resent} (bound per kill: 4000 in flight + 656 unwritten)")
ok = len(keys) == total and len(set(keys)) == total and len(lines) == jobs and whole == jobs and resent <= 2 * 4656
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
echo "seconds: $(echo "$finished - $started" | bc)"
