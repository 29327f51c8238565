#!/usr/bin/env bash
# The long fault matrix (`make soak`, after a release build): `fanout send` against a mock-apns
# subprocess, one run per fault, one with all of them mixed (1,000,000 notifications), and one
# killed with SIGKILL at 10 random moments and resumed each time. Prints a Markdown reliability
# table and writes it to docs/RELIABILITY.md with the command and the date.
#
# For every run: outcomes by kind (from the results file; the summary line when there is one),
# notifications with no result or more than one, notifications the mock accepted more than once
# (tokens appearing more than once in --record) against the in-flight bound, the peak memory of the
# fanout process (VmHWM from /proc/PID/status, polled), and the wall time. A run that outlives its
# deadline (derived from the retry and connect policy) is killed and marked.
#
# Environment: SOAK_SINGLE (notifications per single-fault run, default 200000), SOAK_MIXED
# (default 1000000), SOAK_CRASH (default 1000000), SOAK_KILLS (default 10), FANOUT_BIN_DIR
# (default: `swift build -c release --show-bin-path`), SOAK_OUT (default docs/RELIABILITY.md),
# SOAK_ONLY (names of the runs to do, space-separated; default all).
# Needs bash, awk, sed and procfs; no root.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
SINGLE=${SOAK_SINGLE:-200000}
MIXED=${SOAK_MIXED:-1000000}
CRASH=${SOAK_CRASH:-1000000}
KILLS=${SOAK_KILLS:-10}
OUT=${SOAK_OUT:-docs/RELIABILITY.md}
BIN=${FANOUT_BIN_DIR:-$(swift build -c release --show-bin-path)}
for tool in fanout mock-apns make-tokens; do
    [ -x "$BIN/$tool" ] || { echo "soak: $BIN/$tool is not built (run swift build -c release)" >&2; exit 2; }
done

# fanout send's defaults, which the bounds and deadlines below are derived from.
LOOPS=2             # --loops
CONNECTIONS=1       # --connections (per loop)
STREAMS=1000        # maxConcurrentStreams (and mock-apns's --max-streams)
IN_FLIGHT=$((2 * LOOPS * CONNECTIONS * STREAMS))  # the engine's default maxInFlight
RESULTS_WRITE_THRESHOLD=65536  # fanout send writes its buffered results lines past this (ResultsWriter)
MAX_ATTEMPTS=8
RETRY_CAP_S=5
CONNECT_ATTEMPTS=5
CONNECT_TIMEOUT_S=10

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fanout-soak.XXXXXX")
MOCK_PID=""
FANOUT_PID=""
cleanup() {
    [ -n "$FANOUT_PID" ] && kill -9 "$FANOUT_PID" 2>/dev/null || true
    [ -n "$MOCK_PID" ] && kill -9 "$MOCK_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "soak: $*" >&2; }

# Whether PID is still running (a zombie, finished but not yet waited for, is not).
running() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# A field of /proc/PID/status in kB (VmHWM, VmRSS), or nothing.
proc_kb() { awk -v key="$2:" '$1 == key { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

# start_mock DIR PORT ARGS...: starts mock-apns on 127.0.0.1:PORT (0: any) with the shared TLS
# directory, appending to DIR/record.txt, its stats in DIR/stats.K.json (K: incarnation); sets
# MOCK_PID and MOCK_PORT.
MOCK_INCARNATION=0
start_mock() {
    local dir=$1 port=$2
    shift 2
    MOCK_INCARNATION=$((MOCK_INCARNATION + 1))
    local out="$dir/mock.$MOCK_INCARNATION.out"
    "$BIN/mock-apns" --listen "127.0.0.1:$port" --tls-dir "$WORK/tls" --threads 2 --max-streams "$STREAMS" \
        --stats "$dir/stats.$MOCK_INCARNATION.json" --record "$dir/record.txt" "$@" >"$out" 2>&1 &
    MOCK_PID=$!
    local waited=0
    until grep -q '^listening on ' "$out" 2>/dev/null; do
        if ! running "$MOCK_PID" || [ "$waited" -ge 100 ]; then
            log "mock-apns did not start: $(cat "$out")"
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    MOCK_PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out")
}

stop_mock() {
    [ -n "$MOCK_PID" ] || return 0
    kill -TERM "$MOCK_PID" 2>/dev/null || true
    wait "$MOCK_PID" 2>/dev/null || true
    MOCK_PID=""
}

# The sum of one counter over every stats file of DIR.
stat_sum() {
    { cat "$1"/stats.*.json 2>/dev/null || true; } | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" | awk '{ s += $1 } END { print s + 0 }'
}

# A tokens file of N tokens (cut from one generated file) and a one-job jobs file in DIR.
make_job() {
    local dir=$1 count=$2
    if [ ! -f "$WORK/tokens.$count.txt" ]; then
        head -n "$count" "$WORK/tokens.txt" >"$WORK/tokens.$count.txt"
        [ "$(wc -l <"$WORK/tokens.$count.txt")" -eq "$count" ] || { log "not enough tokens"; exit 1; }
    fi
    printf '{"id": "soak", "topic": "com.example.app", "push_type": "alert", "payload": {"aps": {"alert": "soak"}}, "tokens_file": "%s"}\n' \
        "$WORK/tokens.$count.txt" >"$dir/jobs.jsonl"
}

# The deadline of a run of N notifications, in seconds: a floor for the work (20,000 a second; a
# release build does over 60,000), the latency rounds, one notification using up every attempt at
# the retry cap, and one round of connect attempts at the connect timeout and retry cap (once more
# per restart of the mock), plus 30 s. When no connection can succeed (UNUSABLE=1), nothing is
# sent: 30 s and one round of connect attempts, whatever N.
deadline_for() {
    local count=$1 latency_ms=${2:-0} restarts=${3:-0} unusable=${4:-0}
    if [ "$unusable" = 1 ]; then
        echo $((30 + CONNECT_ATTEMPTS * (CONNECT_TIMEOUT_S + RETRY_CAP_S)))
        return
    fi
    local rounds=$(((count + LOOPS * CONNECTIONS * STREAMS - 1) / (LOOPS * CONNECTIONS * STREAMS)))
    echo $((30 + count / 20000 + rounds * latency_ms / 1000 + MAX_ATTEMPTS * RETRY_CAP_S \
        + (1 + restarts) * CONNECT_ATTEMPTS * (CONNECT_TIMEOUT_S + RETRY_CAP_S)))
}

# start_fanout DIR PORT CA [--resume]: `fanout send` in the background; sets FANOUT_PID.
start_fanout() {
    local dir=$1 port=$2 ca=$3
    shift 3
    "$BIN/fanout" send --jobs "$dir/jobs.jsonl" --results "$dir/results.jsonl" --summary "$dir/summary.json" \
        --endpoint "localhost:$port" --ca-file "$ca" --key "$WORK/tls/auth-key.p8" --key-id KEYID12345 \
        --team-id TEAMID1234 --loops "$LOOPS" --connections "$CONNECTIONS" --progress never "$@" \
        >>"$dir/fanout.out" 2>>"$dir/fanout.err" &
    FANOUT_PID=$!
}

# watch_fanout DIR DEADLINE_S [RESTART_AT_BYTES]: polls the running fanout until it exits or
# outlives DEADLINE_S (then SIGKILL); records its peak memory (VmHWM) and its RSS once 10% of the
# results are in and at the end; with RESTART_AT_BYTES, kills the mock with SIGKILL once the
# results file is that large and restarts it on the same port. Sets RC, TIMED_OUT, PEAK_KB,
# RSS_EARLY_KB, RSS_LATE_KB, RESTARTS (added to).
watch_fanout() {
    local dir=$1 deadline=$2 restart_at=${3:-0} early_at=${4:-0}
    local start
    start=$(now)
    TIMED_OUT=0
    local restarted=0
    while running "$FANOUT_PID"; do
        local hwm rss size
        hwm=$(proc_kb "$FANOUT_PID" VmHWM)
        rss=$(proc_kb "$FANOUT_PID" VmRSS)
        [ -n "$hwm" ] && [ "$hwm" -gt "$PEAK_KB" ] && PEAK_KB=$hwm
        size=$(stat -c %s "$dir/results.jsonl" 2>/dev/null || echo 0)
        if [ -n "$rss" ]; then
            [ "$RSS_EARLY_KB" -eq 0 ] && [ "$size" -ge "$early_at" ] && RSS_EARLY_KB=$rss
            RSS_LATE_KB=$rss
        fi
        if [ "$restart_at" -gt 0 ] && [ "$restarted" -eq 0 ] && [ "$size" -ge "$restart_at" ]; then
            local port=$MOCK_PORT
            kill -9 "$MOCK_PID"
            wait "$MOCK_PID" 2>/dev/null || true
            start_mock "$dir" "$port" "${MOCK_ARGS[@]}"
            restarted=1
            RESTARTS=$((RESTARTS + 1))
            log "  mock-apns killed with SIGKILL and restarted on port $port"
        fi
        if awk -v s="$start" -v n="$(now)" -v d="$deadline" 'BEGIN { exit !(n - s > d) }'; then
            kill -9 "$FANOUT_PID" 2>/dev/null || true
            TIMED_OUT=1
            log "  fanout send outlived its deadline of $deadline s and was killed"
        fi
        sleep 0.1
    done
    RC=0
    wait "$FANOUT_PID" || RC=$?
    FANOUT_PID=""
}

# analyse DIR N: reads the results file, the summary and the record; sets the row's figures.
analyse() {
    local dir=$1 count=$2
    read -r LINES DISTINCT DELIVERED REJECTED UNREGISTERED FAILED EXPIRED RATE_LIMITED INVALID < <(
        awk '
            {
                token = ""; outcome = ""
                if (match($0, /"token":"[0-9a-fA-F]*"/)) token = substr($0, RSTART + 9, RLENGTH - 10)
                if (match($0, /"outcome":"[a-z_]*"/)) outcome = substr($0, RSTART + 11, RLENGTH - 12)
                lines++
                if (!(token in seen)) { seen[token] = 1; distinct++ }
                count[outcome]++
            }
            END {
                print lines + 0, distinct + 0, count["delivered"] + 0, count["rejected"] + 0, count["unregistered"] + 0,
                    count["failed"] + 0, count["expired"] + 0, count["rate_limited"] + 0, count["invalid"] + 0
            }' "$dir/results.jsonl" 2>/dev/null || echo 0 0 0 0 0 0 0 0 0)
    NO_RESULT=$((count - DISTINCT))
    REPEATED=$((LINES - DISTINCT))
    read -r ACCEPTED DUPLICATES < <(awk '{ if (seen[$1]++) d++ } END { print NR + 0, d + 0 }' "$dir/record.txt" 2>/dev/null || echo 0 0)
    RETRIES=$({ sed -n 's/.*"retries": *\([0-9]*\).*/\1/p' "$dir/summary.json" 2>/dev/null || true; } | tail -n 1)
    RETRIES=${RETRIES:-?}
    DROPS=$(stat_sum "$dir" connections_dropped)
    GOAWAYS=$(stat_sum "$dir" goaways_sent)
    REFUSED=$(stat_sum "$dir" streams_refused)
}

ROWS=()
FAILURES=0

thousands() { echo "$1" | sed -e ':a' -e 's/\B[0-9]\{3\}\>/,&/' -e 'ta'; }

# row NAME N BOUND WALL NOTES EXPECT: appends a table row; EXPECT is "delivered" (every
# notification delivered), "delivered+rejected", or "failed".
row() {
    local name=$1 count=$2 bound=$3 wall=$4 notes=$5 expect=$6
    local verdict=ok problems=()
    [ "$NO_RESULT" -eq 0 ] || problems+=("$NO_RESULT without a result")
    [ "$REPEATED" -eq 0 ] || problems+=("$REPEATED with two results")
    [ "$DUPLICATES" -le "$bound" ] || problems+=("duplicates over the bound")
    [ "$TIMED_OUT" -eq 0 ] || problems+=("outlived its deadline")
    case $expect in
        delivered) [ "$DELIVERED" -eq "$count" ] || problems+=("not all delivered") ;;
        delivered+rejected) [ $((DELIVERED + REJECTED)) -eq "$count" ] || problems+=("not all delivered or rejected") ;;
        failed) [ "$FAILED" -eq "$count" ] || problems+=("not all failed") ;;
    esac
    if [ "${#problems[@]}" -gt 0 ]; then
        verdict="**FAIL**: $(IFS=';'; echo "${problems[*]}" | sed 's/;/; /g')"
        FAILURES=$((FAILURES + 1))
    fi
    local other=$((UNREGISTERED + EXPIRED + RATE_LIMITED + INVALID))
    local memory
    memory=$(awk -v p="$PEAK_KB" -v e="$RSS_EARLY_KB" -v l="$RSS_LATE_KB" \
        'BEGIN { printf "%.0f (%.0f → %.0f)", p / 1024, e / 1024, l / 1024 }')
    ROWS+=("| $name | $(thousands "$count") | $(thousands "$DELIVERED") | $(thousands "$REJECTED") | $(thousands "$FAILED") | $(thousands "$other") | $(thousands "$NO_RESULT") | $(thousands "$REPEATED") | $(thousands "$DUPLICATES") ≤ $(thousands "$bound") | $(thousands "$RETRIES") | $memory | $wall | $notes | $verdict |")
    log "  ${ROWS[-1]}"
}

# run_fault NAME N EXPECT LATENCY_MS RESTART(0|1) CA MOCK_ARGS...: one single run.
selected() { [ -z "${SOAK_ONLY:-}" ] || [[ " $SOAK_ONLY " == *" $1 "* ]]; }

run_fault() {
    local name=$1 count=$2 expect=$3 latency=$4 restart=$5 ca=$6
    shift 6
    selected "$name" || return 0
    MOCK_ARGS=("$@")
    log "$name: $count notifications, mock-apns ${MOCK_ARGS[*]:-(no faults)}$([ "$restart" = 1 ] && echo ', killed and restarted mid-run')"
    local dir="$WORK/$name"
    mkdir -p "$dir"
    make_job "$dir" "$count"
    MOCK_INCARNATION=0
    RESTARTS=0
    PEAK_KB=0
    RSS_EARLY_KB=0
    RSS_LATE_KB=0
    local port
    if [ "$name" = unreachable ]; then
        # A port that was just free: a mock started and killed.
        start_mock "$dir" 0
        port=$MOCK_PORT
        kill -9 "$MOCK_PID"
        wait "$MOCK_PID" 2>/dev/null || true
        MOCK_PID=""
        rm -f "$dir"/stats.*.json "$dir/record.txt"
    else
        start_mock "$dir" 0 "${MOCK_ARGS[@]}"
        port=$MOCK_PORT
    fi
    local line_bytes=280 restart_at=0 unusable=0 deadline
    [ "$restart" = 1 ] && restart_at=$((count * 2 / 5 * line_bytes))
    [ "$expect" = failed ] && unusable=1
    deadline=$(deadline_for "$count" "$latency" "$restart" "$unusable")
    local start
    start=$(now)
    start_fanout "$dir" "$port" "$ca"
    watch_fanout "$dir" "$deadline" "$restart_at" $((count / 10 * line_bytes))
    local wall
    wall=$(elapsed "$start")
    stop_mock
    analyse "$dir" "$count"
    # Each connection that died (dropped, or every one when the mock was killed) may have carried
    # up to STREAMS notifications the mock had accepted but not answered.
    local bound=$(((DROPS + RESTARTS * LOOPS * CONNECTIONS) * STREAMS))
    local notes="$DROPS drops, $GOAWAYS GOAWAYs, $REFUSED refused"
    [ "$RESTARTS" -gt 0 ] && notes="$notes, mock killed and restarted ×$RESTARTS (record lower bound: the killed mock's last ≤1 s of record is lost)"
    [ "$TIMED_OUT" -eq 1 ] && notes="$notes, killed at its deadline of $deadline s (the rest never got a result)"
    [ "$RC" -gt 1 ] && [ "$TIMED_OUT" -eq 0 ] && notes="$notes, exit $RC"
    row "$name" "$count" "$bound" "$wall" "$notes" "$expect"
    rm -f "$dir/results.jsonl" "$dir/record.txt"
}

# The crash-and-resume run: one job of N notifications; `fanout send` killed with SIGKILL at
# KILLS random moments (0.3 to 1.3 s after each start), resumed with --resume each time, then
# resumed to the end.
run_crash() {
    local count=$1
    local name="crash-and-resume"
    selected "$name" || return 0
    log "$name: $count notifications, fanout send killed with SIGKILL $KILLS times and resumed"
    local dir="$WORK/$name"
    mkdir -p "$dir"
    make_job "$dir" "$count"
    MOCK_INCARNATION=0
    RESTARTS=0
    PEAK_KB=0
    RSS_EARLY_KB=0
    RSS_LATE_KB=0
    MOCK_ARGS=()
    start_mock "$dir" 0
    local port=$MOCK_PORT kills=0 resume=() start
    start=$(now)
    while [ "$kills" -lt "$KILLS" ]; do
        start_fanout "$dir" "$port" "$WORK/tls/ca.pem" "${resume[@]}"
        sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.3 + r / 32767 }')"
        local hwm
        hwm=$(proc_kb "$FANOUT_PID" VmHWM)
        [ -n "$hwm" ] && [ "$hwm" -gt "$PEAK_KB" ] && PEAK_KB=$hwm
        if ! running "$FANOUT_PID"; then
            wait "$FANOUT_PID" || true
            FANOUT_PID=""
            log "  the run finished before kill $((kills + 1))"
            break
        fi
        kill -9 "$FANOUT_PID"
        wait "$FANOUT_PID" 2>/dev/null || true
        FANOUT_PID=""
        kills=$((kills + 1))
        log "  kill $kills: $(wc -l <"$dir/results.jsonl") results so far"
        resume=(--resume)
    done
    if [ ! -s "$dir/summary.json" ]; then
        start_fanout "$dir" "$port" "$WORK/tls/ca.pem" --resume
        watch_fanout "$dir" "$(deadline_for "$count")" 0 0
    else
        RC=0
        TIMED_OUT=0
    fi
    local wall
    wall=$(elapsed "$start")
    stop_mock
    analyse "$dir" "$count"
    # Only what was in flight at a kill may be sent twice (at most maxInFlight), and the results the killed
    # process had not written yet (less than fanout send's 64 KiB write threshold of lines): per kill.
    local shortest
    shortest=$(awk 'NR == 1 || length($0) < m { m = length($0) } END { print m + 1 }' "$dir/results.jsonl")
    local bound=$((kills * (IN_FLIGHT + RESULTS_WRITE_THRESHOLD / shortest + 1)))
    local notes="killed with SIGKILL ×$kills at random moments, resumed with --resume each time"
    [ "$RC" -ne 0 ] && [ "$TIMED_OUT" -eq 0 ] && notes="$notes, last run exit $RC"
    [ "$kills" -lt "$KILLS" ] && notes="$notes (only $kills kills: the run ended first)"
    row "$name" "$count" "$bound" "$wall" "$notes" delivered
    rm -f "$dir/results.jsonl" "$dir/record.txt"
}

log "binaries: $BIN; work directory: $WORK"
largest=$SINGLE
[ "$MIXED" -gt "$largest" ] && largest=$MIXED
[ "$CRASH" -gt "$largest" ] && largest=$CRASH
"$BIN/make-tokens" --count "$largest" --seed 7 --out "$WORK/tokens.txt"
# TLS material for every mock (created by a first mock-apns start), and another CA for the wrong-CA run.
mkdir -p "$WORK/setup"
start_mock "$WORK/setup" 0
stop_mock
"$BIN/mock-apns" --listen 127.0.0.1:0 --tls-dir "$WORK/other-tls" >"$WORK/other.out" 2>&1 &
other_pid=$!
until grep -q '^listening on ' "$WORK/other.out" 2>/dev/null; do sleep 0.1; done
kill -TERM "$other_pid"
wait "$other_pid" 2>/dev/null || true
CA="$WORK/tls/ca.pem"

STARTED=$(now)
run_fault goaway "$SINGLE" delivered 0 0 "$CA" --goaway-every 5000
run_fault tcp-drop "$SINGLE" delivered 0 0 "$CA" --drop-every 20000
run_fault refused-stream "$SINGLE" delivered 0 0 "$CA" --refuse-every 100
run_fault throttle-after-reject "$SINGLE" delivered+rejected 0 0 "$CA" --throttle-after-reject \
    --fail 0.01:400:BadTopic --fail 0.02:503:ServiceUnavailable --seed 11
run_fault 5xx "$SINGLE" delivered 0 0 "$CA" --fail 0.05:500:InternalServerError --fail 0.05:503:ServiceUnavailable --seed 5
run_fault 429 "$SINGLE" delivered 0 0 "$CA" --fail 0.08:429:TooManyRequests --seed 429
run_fault latency-200ms "$SINGLE" delivered 200 0 "$CA" --latency-ms 200
run_fault mock-restart "$SINGLE" delivered 0 1 "$CA" --latency-ms 1
run_fault wrong-ca "$SINGLE" failed 0 0 "$WORK/other-tls/ca.pem"
run_fault unreachable "$SINGLE" failed 0 0 "$CA"
run_fault mixed "$MIXED" delivered+rejected 1 1 "$CA" --goaway-every 30011 --drop-every 50021 --refuse-every 997 \
    --throttle-after-reject --latency-ms 1 --fail 0.02:503:ServiceUnavailable --fail 0.01:500:InternalServerError \
    --fail 0.01:429:TooManyRequests --fail 0.002:400:BadTopic --seed 2026
run_crash "$CRASH"
TOTAL_WALL=$(elapsed "$STARTED")

TABLE_HEADER="| fault | notifications | delivered | rejected | failed | other | no result | two results | accepted twice ≤ bound | retries | fanout peak MB (RSS at 10% → end) | wall s | notes | verdict |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
TABLE=$(printf '%s\n' "$TABLE_HEADER" "${ROWS[@]}")
echo "$TABLE"

case $OUT in /*) OUT_PATH=$OUT ;; *) OUT_PATH="$ROOT/$OUT" ;; esac
COMMAND="make soak"
[ -n "${SOAK_COMMAND:-}" ] && COMMAND=$SOAK_COMMAND
# What follows the soak table is kept: the hand-written Redis failover section (from its `<!-- redis-failover -->`
# marker) and scripts/sanitize.sh's (`make sanitize`, from `<!-- sanitize -->`), whichever comes first, to the end.
SANITIZE_SECTION=""
[ -f "$OUT_PATH" ] && SANITIZE_SECTION=$(awk '/^<!-- (redis-failover|sanitize) -->$/ { keep = 1 } keep' "$OUT_PATH")
{
    cat <<EOF
# Reliability

The long fault matrix: \`fanout send\` (release build) against a \`mock-apns\` subprocess,
one run per fault, one with the faults mixed, and one crash-and-resume run. Generated by
\`scripts/soak.sh\`; the short version runs in \`make test\`
(\`Tests/FanoutIntegrationTests/FaultMatrixTests.swift\`).

- **Command:** \`$COMMAND\`
- **Date:** $(date -u '+%Y-%m-%d %H:%M UTC')
- **Machine:** $(nproc) cores, $(uname -sr); \`fanout send --loops $LOOPS --connections $CONNECTIONS\`, every other
  setting at its default (8 attempts, backoff 100 ms to 5 s, $IN_FLIGHT in flight); mock-apns
  \`--threads 2 --max-streams $STREAMS\`.
- **Total wall time:** $TOTAL_WALL s.

$TABLE

How to read it:
- **Outcomes** come from the results file (one line per notification); *other* is unregistered,
  expired, rate-limited and invalid together. *No result* and *two results* must be 0.
- **Accepted twice** counts tokens that appear more than once in mock-apns's \`--record\` (every
  token is sent once per run). Only notifications in flight on a connection that died may be
  accepted twice, so the bound is (connections dropped + connections killed with the mock) ×
  $STREAMS streams, and, for crash-and-resume, kills × ($IN_FLIGHT, the engine's in-flight limit,
  plus the results lines that fit in the $RESULTS_WRITE_THRESHOLD bytes \`fanout send\` buffers before
  it writes them: a killed run's unwritten results are sent again on resume).
  When the mock is killed with SIGKILL, the part of its record it had not flushed yet (at most the
  last second) is lost with it, so for those rows the count is a lower bound; the in-process test
  \`testMockKilledAndRestartedOnTheSamePortMidRun\` counts it exactly.
- **Retries** are attempts beyond the first, from the summary line (\`?\` when the run was killed).
- **Memory** is the fanout process's peak resident set (VmHWM), and its RSS once 10% of the
  results were written and at the end: flat means the in-flight limit holds.
- **Deadline.** Each run must end within 30 s + notifications / 20,000 per s + latency rounds +
  8 attempts × 5 s + 5 connect attempts × (10 s + 5 s) (once more per mock restart). When no
  connection can succeed (wrong-ca, unreachable) nothing is sent, so the deadline is 30 s + one
  round of connect attempts (105 s), whatever the job's size. A run that outlives its deadline is
  killed and marked; what it had not finished has no result.
- **Rows marked FAIL** are product bugs to fix; the short matrix in \`FaultMatrixTests.swift\` has
  the same checks, and its test comments say what each found.
- **Faults:** goaway \`--goaway-every 5000\`; tcp-drop \`--drop-every 20000\`; refused-stream
  \`--refuse-every 100\`; throttle-after-reject with 1% \`400 BadTopic\` and 2% \`503\`; 5xx 5% \`500\`
  + 5% \`503\`; 429 8%; latency-200ms \`--latency-ms 200\` (mock-apns has no spike option: a fixed
  high latency); mock-restart: mock killed with SIGKILL at 40% of the results and restarted on the
  same port with the same \`--tls-dir\`; wrong-ca: \`--ca-file\` of another CA; unreachable: a port
  nobody listens on; mixed: every mock fault at once (GOAWAY every 30,011, drop every 50,021,
  REFUSED_STREAM every 997, throttle after reject, 1 ms latency, 2% 503, 1% 500, 1% 429, 0.2%
  \`400 BadTopic\`) plus the mock killed and restarted at 40%.
EOF
    if [ -n "$SANITIZE_SECTION" ]; then printf '\n%s\n' "$SANITIZE_SECTION"; fi
} >"$OUT_PATH"
log "wrote $OUT ($FAILURES row(s) failed their checks)"
[ "$FAILURES" -eq 0 ]
