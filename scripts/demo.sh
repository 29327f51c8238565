#!/usr/bin/env bash
# make demo: start mock-apns on a free port with freshly generated TLS material and signing key,
# send examples/jobs.jsonl with `fanout send`, print the summary, stop the mock.
set -euo pipefail
bin=$(swift build -c release --show-bin-path)
demo=.demo
rm -rf "$demo" && mkdir -p "$demo"

"$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$demo/tls" --key-id DEMOKEY123 --team-id DEMOTEAM12 \
    --stats "$demo/stats.json" > "$demo/mock.out" 2> "$demo/mock.err" &
mock=$!
trap 'kill $mock 2>/dev/null; wait $mock 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q '^listening on' "$demo/mock.out" 2>/dev/null && break
    kill -0 $mock 2>/dev/null || { cat "$demo/mock.err"; exit 1; }
    sleep 0.1
done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$demo/mock.out")
echo "mock-apns listening on 127.0.0.1:$port (TLS material in $demo/tls)"

echo "fanout send: examples/jobs.jsonl (a Live Activity start, two updates, an end to 3,000 tokens, and an alert)"
set +e
"$bin/fanout" send --jobs examples/jobs.jsonl --results "$demo/results.jsonl" --summary "$demo/summary.json" \
    --invalid-tokens "$demo/invalid-tokens.jsonl" \
    --endpoint "localhost:$port" --ca-file "$demo/tls/ca.pem" \
    --key "$demo/tls/auth-key.p8" --key-id DEMOKEY123 --team-id DEMOTEAM12 --progress never
status=$?
set -e
echo "results: $(wc -l < "$demo/results.jsonl") lines in $demo/results.jsonl; first one:"
head -1 "$demo/results.jsonl"
kill $mock; wait $mock 2>/dev/null || true
trap - EXIT
echo "mock-apns stats: $(cat "$demo/stats.json")"
exit $status
