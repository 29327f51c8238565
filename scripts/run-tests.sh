#!/usr/bin/env bash
# The whole test suite as two XCTest processes side by side (make test). Most of the suite's time is spent waiting
# for the processes its tests start (redis-server, fanout serve, workers, mock-apns, timeouts), not on the CPU: one
# process used about 0.6 of a core on two. The classes that start Redis-backed services and fleets run in one
# process, everything else in the other; each class runs whole in one of them, in XCTest's usual order.
#
# Usage: scripts/run-tests.sh [--serial]   (--serial: one process, as `swift test --skip-build` runs it)
# Needs a build with tests (`swift build --build-tests`). Exit status: non-zero when either half failed or ran no
# test. Each half's log is kept in .build/test-logs/ and printed whole once both are done.
set -euo pipefail
cd "$(dirname "$0")/.."
SWIFT=${SWIFT:-swift}

if [[ "${1:-}" == "--serial" ]]; then
    exec "$SWIFT" test --skip-build
fi

bin=$("$SWIFT" build --show-bin-path)
bundle="$bin/FanoutPackageTests.xctest"
[[ -x "$bundle" ]] || { echo "run-tests: $bundle not found: swift build --build-tests first" >&2; exit 2; }

# The Redis-backed classes: about half of the suite's time on two cores (2026-12-06: 360 of 726 s).
redis_classes=(
    FanoutIntegrationTests.FleetTests
    FanoutIntegrationTests.ServeQueueTests
    FanoutIntegrationTests.ServeFailoverTests
    FanoutIntegrationTests.ServeRedisTests
)

logs=.build/test-logs
mkdir -p "$logs"
all=$("$SWIFT" test list --skip-build | cut -d/ -f1 | sort -u)
for class in "${redis_classes[@]}"; do
    grep -qx "$class" <<<"$all" || { echo "run-tests: no test class $class (renamed? update this script)" >&2; exit 2; }
done
rest=$(grep -vxF -f <(printf '%s\n' "${redis_classes[@]}") <<<"$all" | paste -sd, -)
first=$(printf '%s\n' "${redis_classes[@]}" | paste -sd, -)

# Each process takes the ports it picks for its servers from a range of its own (LoopbackPort.free), below the
# kernel's ephemeral ports: a port freed by a test that killed its server (a Redis primary its sentinels still
# watch) is never reused by the other process's tests.
start=$(date +%s)
FANOUT_TEST_PORTS=20000-25999 "$bundle" "$first" >"$logs/redis.log" 2>&1 &
redis_pid=$!
FANOUT_TEST_PORTS=26000-31999 "$bundle" "$rest" >"$logs/rest.log" 2>&1 &
rest_pid=$!
status=0
wait "$redis_pid" || status=$?
wait "$rest_pid" || status=$?

cat "$logs/redis.log" "$logs/rest.log"
echo
echo "run-tests: two processes, $(($(date +%s) - start)) s"
for half in redis rest; do
    summary=$(grep -E "^[[:space:]]+Executed [0-9]+ tests?," "$logs/$half.log" | tail -1 || true)
    echo "  $half: ${summary:-no summary: the process did not finish}"
    if ! grep -qE "Executed [1-9][0-9]* tests?, with 0 failures" <<<"$summary" && [[ $status -eq 0 ]]; then
        status=1
    fi
done
grep -h ": error: " "$logs/redis.log" "$logs/rest.log" || true
exit "$status"
