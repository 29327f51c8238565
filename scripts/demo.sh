#!/usr/bin/env bash
# make demo, in four parts.
# Part 1: start mock-apns on a free port with freshly generated TLS material and signing key, send
# examples/jobs.jsonl with `fanout send`, print the summary, stop the mock.
# Part 2: the token registry. Import generated registrations, restart the mock with ~50 of activity
# match-7's tokens answered 410 Unregistered, send examples/activity-jobs.jsonl (an update and an end
# addressed by activity_id) with `fanout send --registry`, and show the registry pruned of those tokens.
# Part 3: fanout serve against the mock (with its channel management listener): tokens registered over HTTP with
# the device key, a broadcast channel created for the activity, an update by activity id, the dispatch read back.
# Part 4: certificate-based authentication: mock-apns requiring client certificates, fanout push with the app's
# .p12 (no provider token), and a topic the certificate does not cover refused before sending.
# Exits 0 when every part behaves as expected.
set -euo pipefail
# The demo's mock is on this machine: an HTTPS_PROXY of the environment (which fanout honours) must not carry it.
export NO_PROXY="${NO_PROXY:+$NO_PROXY,}localhost,127.0.0.1"
bin=$(swift build -c release --show-bin-path)
demo=.demo
rm -rf "$demo" && mkdir -p "$demo"

# start_mock NAME [ARGS...]: mock-apns in the background (pid in $mock, port in $port), its output in
# $demo/NAME.out and $demo/NAME.err, sharing the TLS material and signing key in $demo/tls.
start_mock() {
    local name=$1
    shift
    "$bin/mock-apns" --listen 127.0.0.1:0 --tls-dir "$demo/tls" --key-id DEMOKEY123 --team-id DEMOTEAM12 \
        "$@" > "$demo/$name.out" 2> "$demo/$name.err" &
    mock=$!
    trap 'kill $mock 2>/dev/null; wait $mock 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        grep -q '^listening on' "$demo/$name.out" 2>/dev/null && break
        kill -0 $mock 2>/dev/null || { cat "$demo/$name.err"; exit 1; }
        sleep 0.1
    done
    port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$demo/$name.out")
}

stop_mock() {
    kill $mock; wait $mock 2>/dev/null || true
    trap - EXIT
}

# field FILE KEY: the integer value of "KEY" in the one-line JSON object in FILE (empty when absent).
field() {
    sed -n "s/.*\"$2\": *\([0-9][0-9]*\).*/\1/p" "$1" | head -1
}

send_flags=(--endpoint "localhost:PORT" --ca-file "$demo/tls/ca.pem"
    --key "$demo/tls/auth-key.p8" --key-id DEMOKEY123 --team-id DEMOTEAM12 --progress never)

echo "== Part 1: a job file of raw tokens =="
start_mock mock --stats "$demo/stats.json"
echo "mock-apns listening on 127.0.0.1:$port (TLS material in $demo/tls)"

echo "fanout send: examples/jobs.jsonl (a Live Activity start, two updates, an end to 3,000 tokens, and an alert)"
set +e
"$bin/fanout" send --jobs examples/jobs.jsonl --results "$demo/results.jsonl" --summary "$demo/summary.json" \
    --invalid-tokens "$demo/invalid-tokens.jsonl" "${send_flags[@]/PORT/$port}"
status=$?
set -e
echo "results: $(wc -l < "$demo/results.jsonl") lines in $demo/results.jsonl; first one:"
head -1 "$demo/results.jsonl"
stop_mock
echo "mock-apns stats: $(cat "$demo/stats.json")"

echo
echo "== Part 2: Live Activities addressed by id through the token registry =="
# The registrations: 2,000 update tokens of activity match-7 (devices dev-0001..dev-2000 of 500 users),
# 100 of activity match-8, 20 push-to-start tokens and 50 devices' regular push tokens, all of the app
# com.acme.app. Every 40th match-7 token (50 of them) is one the mock answers 410 Unregistered.
match7=2000 match8=100 every=40
gone=$((match7 / every))
registrations="$demo/registrations.jsonl"
awk -v match7=$match7 -v match8=$match8 'BEGIN {
    app = "\"app\": \"com.acme.app\""
    for (i = 1; i <= match7; i++)
        printf "{%s, \"activity_id\": \"match-7\", \"token\": \"a7%062x\", \"device\": \"dev-%04d\", \"user\": \"user-%03d\"}\n", app, i, i, i % 500
    for (i = 1; i <= match8; i++)
        printf "{%s, \"activity_id\": \"match-8\", \"token\": \"a8%062x\", \"device\": \"dev-%04d\", \"user\": \"user-%03d\"}\n", app, i, match7 + i, i % 500
    for (i = 1; i <= 20; i++)
        printf "{%s, \"push_to_start_token\": \"b1%062x\", \"attributes_type\": \"MatchAttributes\", \"device\": \"dev-%04d\", \"user\": \"user-%03d\"}\n", app, i, i, i % 500
    for (i = 1; i <= 50; i++)
        printf "{%s, \"device\": \"dev-%04d\", \"user\": \"user-%03d\", \"push_token\": \"c1%062x\"}\n", app, i, i % 500, i
}' > "$registrations"
awk -v match7=$match7 -v every=$every 'BEGIN { for (i = every; i <= match7; i += every) printf "a7%062x\n", i }' \
    > "$demo/unregistered.txt"

registry="$demo/registry.db"
echo "fanout registry import: $(wc -l < "$registrations") registrations generated into $registrations"
"$bin/fanout" registry --db "$registry" import "$registrations" --workspace acme
"$bin/fanout" registry --db "$registry" stats > "$demo/stats-before.json"
echo "fanout registry stats, before: $(cat "$demo/stats-before.json")"

start_mock mock-registry --stats "$demo/stats-registry.json" --unregistered "$demo/unregistered.txt"
echo "mock-apns restarted on 127.0.0.1:$port, answering 410 Unregistered for the $gone tokens in $demo/unregistered.txt"

echo "fanout send --registry: examples/activity-jobs.jsonl (an update of match-7 by activity_id, then its end; one job at a time)"
set +e
"$bin/fanout" send --jobs examples/activity-jobs.jsonl --registry "$registry" --concurrent-jobs 1 \
    --results "$demo/activity-results.jsonl" --summary "$demo/activity-summary.json" "${send_flags[@]/PORT/$port}" \
    > /dev/null
send_status=$?
set -e
echo "summary: $(cat "$demo/activity-summary.json")"
stop_mock
echo "mock-apns stats: $(cat "$demo/stats-registry.json")"

"$bin/fanout" registry --db "$registry" stats > "$demo/stats-after.json"
echo "fanout registry stats, after: $(cat "$demo/stats-after.json")"
"$bin/fanout" registry --db "$registry" events > "$demo/events.jsonl"
pruned=$(grep -c '"change":"removed","reason":"unregistered"' "$demo/events.jsonl" || true)
echo "fanout registry events: $(wc -l < "$demo/events.jsonl") lines, $pruned removed/unregistered; the last three:"
tail -3 "$demo/events.jsonl"

# The checks: every live match-7 token gets the update and the end; the 410s are pruned from the registry
# (the end may still reach a few of them, if their removal had not landed when it was read).
live=$((match7 - gone))
before=$(field "$demo/stats-before.json" update_tokens)
after=$(field "$demo/stats-after.json" update_tokens)
delivered=$(field "$demo/activity-summary.json" delivered)
unregistered=$(field "$demo/activity-summary.json" unregistered)
accepted=$(field "$demo/stats-registry.json" accepted)
problems=()
[ "$send_status" = 1 ] || problems+=("fanout send exited $send_status, not 1 (some tokens were unregistered)")
[ "$before" = $((match7 + match8)) ] || problems+=("update_tokens before is $before, not $((match7 + match8))")
[ "$delivered" = $((2 * live)) ] || problems+=("delivered is $delivered, not $((2 * live)) (2 jobs x $live live tokens)")
[ "$accepted" = "$delivered" ] || problems+=("the mock accepted $accepted, not $delivered")
[ "${unregistered:-0}" -ge "$gone" ] || problems+=("unregistered is $unregistered, under $gone")
[ "$((before - after))" = "$gone" ] || problems+=("update_tokens dropped by $((before - after)), not $gone")
[ "$pruned" = "$gone" ] || problems+=("$pruned removed/unregistered events, not $gone")

echo
if [ ${#problems[@]} -eq 0 ]; then
    echo "Part 2 OK: $delivered delivered ($live live tokens x 2 jobs), update_tokens $before -> $after (-$gone unregistered)"
else
    echo "Part 2 FAILED:"
    printf '  %s\n' "${problems[@]}"
    exit 1
fi

echo
echo "== Part 3: fanout serve: register tokens over HTTP, give the activity a broadcast channel, update it =="
start_mock mock-serve --manage-listen 127.0.0.1:0
for _ in $(seq 50); do grep -q '^manage listening on' "$demo/mock-serve.out" && break; sleep 0.1; done
manage_port=$(sed -n 's/^manage listening on .*:\([0-9]*\)$/\1/p' "$demo/mock-serve.out")
server_key=sk_demo_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
device_key=dk_demo_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
digest() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat > "$demo/serve.json" <<JSON
{"workspaces": {"demo": {
  "server_keys_sha256": ["$(digest "$server_key")"], "device_keys_sha256": ["$(digest "$device_key")"],
  "apps": {"com.acme.app": {"team_id": "DEMOTEAM12", "key_id": "DEMOKEY123", "key_path": "tls/auth-key.p8",
    "endpoint": "localhost:$port", "manage_endpoint": "localhost:$manage_port", "ca_file": "tls/ca.pem"}}}}}
JSON
"$bin/fanout" serve --config "$demo/serve.json" --db "$demo/serve.db" --listen 127.0.0.1:0 \
    > "$demo/serve.out" 2> "$demo/serve.err" &
serve=$!
trap 'kill $serve $mock 2>/dev/null; wait $serve $mock 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q '^listening on' "$demo/serve.out" 2>/dev/null && break
    kill -0 $serve 2>/dev/null || { cat "$demo/serve.err"; exit 1; }
    sleep 0.1
done
api="http://$(sed -n 's/^listening on //p' "$demo/serve.out")"
echo "fanout serve listening on $api (keys only as SHA-256 digests in $demo/serve.json)"
for n in 1 2 3; do
    curl -sf "$api/v1/activities/match-9/tokens" -H "Authorization: Bearer $device_key" \
        -d "{\"token\": \"$(printf 'c9%062x' $n)\", \"device_id\": \"iphone-$n\"}" > /dev/null
done
echo "POST /v1/activities/match-9/tokens x3 (device key): 3 update tokens registered"
channel=$(curl -sf "$api/v1/activities/match-9/channel" -H "Authorization: Bearer $server_key" -d '{}')
echo "POST /v1/activities/match-9/channel: $channel"
accepted=$(curl -sf "$api/v1/activities/match-9/update" -H "Authorization: Bearer $server_key" \
    -d '{"content_state": {"home": 1, "away": 0}, "alert": {"title": "Goal!", "body": "1-0"}}')
echo "POST /v1/activities/match-9/update: $accepted"
dispatch=$(printf %s "$accepted" | sed -n 's/.*"dispatch_id":"\([^"]*\)".*/\1/p')
for _ in $(seq 100); do
    curl -sf "$api/v1/dispatches/$dispatch" -H "Authorization: Bearer $server_key" > "$demo/dispatch.json"
    grep -q '"state":"done"' "$demo/dispatch.json" && break
    sleep 0.1
done
echo "GET /v1/dispatches/$dispatch: $(cat "$demo/dispatch.json")"
kill -TERM $serve; wait $serve 2>/dev/null || true
stop_mock
sed -i 's/": /":/g' "$demo/dispatch.json"
if grep -q '"delivered":4' "$demo/dispatch.json" && grep -q '"broadcasts":1' "$demo/dispatch.json"; then
    echo "Part 3 OK: one broadcast to the channel and 3 token pushes, all delivered"
else
    echo "Part 3 FAILED: expected 4 delivered (3 tokens and 1 broadcast)"
    exit 1
fi

echo
echo "== Part 4: certificate-based authentication (the app's push certificate, no provider token) =="
start_mock cert --client-ca "$demo/tls/ca.pem" --no-auth
echo "mock-apns on 127.0.0.1:$port requires a client certificate signed by $demo/tls/ca.pem"
cert_flags=(--endpoint "localhost:$port" --ca-file "$demo/tls/ca.pem"
    --cert "$demo/tls/client.p12" --cert-password-env DEMO_CERT_PASSWORD --token "$(printf '%064x' 7)")
export DEMO_CERT_PASSWORD=fanout-test    # the password of the .p12 that --tls-dir writes
echo "fanout push --cert $demo/tls/client.p12 --topic com.example.app:"
"$bin/fanout" push "${cert_flags[@]}" --topic com.example.app --payload '{"aps":{"alert":"Hello"}}' | head -1
set +e
refused=$("$bin/fanout" push "${cert_flags[@]}" --topic com.other.app --payload '{"aps":{"alert":"x"}}' 2>&1)
refused_status=$?
set -e
echo "fanout push --topic com.other.app: exit $refused_status: $refused"
stop_mock
if [ "$refused_status" -eq 2 ]; then
    echo "Part 4 OK: delivered with the certificate, and another topic refused before sending"
else
    echo "Part 4 FAILED: expected exit 2 for a topic the certificate does not cover"
    exit 1
fi
exit $status
