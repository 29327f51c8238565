#!/usr/bin/env bash
# make sanitize: the test suite under ThreadSanitizer and then AddressSanitizer.
#
#   bash scripts/sanitize.sh [FILTER]
#
# FILTER is passed to `swift test --filter` (a regex over Target.Class/method), for a subset when the
# whole suite is too slow under TSan, e.g. `bash scripts/sanitize.sh 'FanoutCoreTests|EngineTests'`.
# The whole suite takes about 7 minutes under TSan and 2 under ASan on 2 cores, plus the two builds.
#
# Environment:
#   SANITIZERS        which to run, in order (default "thread address")
#   SANITIZE_TIMEOUT  seconds allowed for each build and for each test run (default 5400)
#   SANITIZE_JOBS     swift build -j (default: all cores)
#   SANITIZE_SKIP     passed to `swift test --skip` (a regex), to leave out tests that cannot run here
#                     (AllocationTests is always left out: its probe replaces malloc, as the sanitizers do)
#
# Tests that bound elapsed time multiply the bound by FANOUT_TIME_SCALE, set here to 10 under TSan and 3 under
# ASan (about how much slower each makes the engine), so they check the same promise as a plain run.
#
# Each sanitizer builds into its own scratch path (.build-tsan, .build-asan), so the normal .build is
# untouched. Reports are written by the sanitizer runtimes to .build-<san>/reports/<san>.<pid>
# (log_path), which also catches the mock-apns and fanout processes the integration tests start.
# ThreadSanitizer reads scripts/tsan-suppressions.txt, where each suppression says why it is there.
# TSan does not see Synchronization.Mutex's lock on Linux (see that file): reports whose two accesses both run
# inside Mutex.withLock bodies are counted apart and listed in .build-tsan/reports.txt, not failed on.
# The exit status is 0 only when every run built, passed its tests and left no other sanitizer report.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
filter=${1:-}
sanitizers=${SANITIZERS:-thread address}
limit=${SANITIZE_TIMEOUT:-5400}
jobs=${SANITIZE_JOBS:-$(nproc)}
overall=0
summary=()

run_one() {
    local san=$1 short scratch reports log status tests failures
    case $san in
        thread) short=tsan ;;
        address) short=asan ;;
        *) echo "unknown sanitizer $san (thread or address)" >&2; return 2 ;;
    esac
    scratch=$root/.build-$short
    reports=$scratch/reports
    log=$scratch/test.log
    mkdir -p "$scratch"
    rm -rf "$reports" && mkdir -p "$reports"

    echo "== $san: building into ${scratch#"$root"/} (limit ${limit}s)"
    local started=$SECONDS
    if ! timeout --kill-after=30 "$limit" swift build --build-tests --sanitize="$san" --scratch-path "$scratch" \
        -j "$jobs" >"$scratch/build.log" 2>&1; then
        tail -30 "$scratch/build.log"
        summary+=("$san: BUILD FAILED or timed out after $((SECONDS - started))s (see ${scratch#"$root"/}/build.log)")
        overall=1
        return
    fi
    echo "   built in $((SECONDS - started))s"

    local filter_args=()
    [ -n "$filter" ] && filter_args=(--filter "$filter")
    # AllocationTests runs alloc-probe, which replaces malloc to count its calls; a sanitizer's runtime replaces
    # malloc too, and the probe crashes under it (its counts would not be the build's anyway). Always left out here.
    local skip="AllocationTests${SANITIZE_SKIP:+|$SANITIZE_SKIP}"
    filter_args+=(--skip "$skip")
    echo "== $san: testing${filter:+ (filter: $filter)} (skipping: $skip)"
    started=$SECONDS
    # TSan: halt_on_error=0 and exitcode=0 report every race and keep going, so one run finds them all and the
    # `fanout`/`mock-apns` processes the tests start keep their own exit status (TSan's default 66 would fail the
    # test for the report instead of letting this script count it). ASan cannot recover in Swift: an error aborts.
    # Leak checking is off. With it on, the test process's only direct leak is XCTest's own (swift_weakAssign in
    # XCTest.awaitUsingExpectation keeps the async test cases alive), and ~1,000 indirect leaks hang off it: the test
    # cases and whatever they hold, product objects included, so every run would be "leaking" without a project bug.
    # (The fuzz targets do check leaks, per input: scripts/fuzz.sh.)
    # ASan's quarantine is 16 MB, not its default 256: freed blocks wait there before reuse, so the default would make
    # FaultMatrixTests' bound on resident memory growth (50 MB) measure ASan's quarantine filling (+61 to +245 MB)
    # instead of the engine. A use after free is still caught while the block is in the 16 MB.
    TSAN_OPTIONS="suppressions=$root/scripts/tsan-suppressions.txt halt_on_error=0 exitcode=0 second_deadlock_stack=1 log_path=$reports/tsan ${TSAN_OPTIONS:-}" \
        ASAN_OPTIONS="detect_leaks=0 quarantine_size_mb=16 log_path=$reports/asan ${ASAN_OPTIONS:-}" \
        FANOUT_TIME_SCALE=$([ "$san" = thread ] && echo 10 || echo 3) \
        timeout --kill-after=30 "$limit" swift test --skip-build --sanitize="$san" --scratch-path "$scratch" \
        "${filter_args[@]}" >"$log" 2>&1
    status=$?
    local took=$((SECONDS - started))

    # XCTest's last "Executed" line is the total over every test bundle run.
    tests=$(grep -Eo 'Executed [0-9]+ tests?, with [0-9]+ failures?' "$log" | tail -1)
    local passed=${tests:-no XCTest summary}
    local classified=$scratch/reports.txt
    classify_reports "$reports" >"$classified"
    local total mutex unexplained
    total=$(grep -c . "$classified")
    mutex=$(grep -c '^mutex' "$classified")
    unexplained=$((total - mutex))
    failures=$(grep -E "^Test Case .* failed" "$log" | sed -E "s/^Test Case '([^']*)' failed.*$/\1/" | sort -u)

    local verdict=ok
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then verdict="TIMED OUT after ${took}s"; fi
    [ "$status" -ne 0 ] && [ "$verdict" = ok ] && verdict="TESTS FAILED (exit $status)"
    [ "$unexplained" -gt 0 ] && [ "$verdict" = ok ] && verdict="SANITIZER REPORTS"
    [ "$verdict" != ok ] && overall=1

    summary+=("$san: $verdict; $passed in ${took}s; $unexplained sanitizer report(s) to look at")
    [ "$mutex" -gt 0 ] && summary+=("   + $mutex ThreadSanitizer report(s) with both accesses inside Mutex.withLock bodies: the lock TSan cannot see (scripts/tsan-suppressions.txt says why); not counted")
    summary+=("   log ${log#"$root"/}, raw reports ${reports#"$root"/}/, one line per report in ${classified#"$root"/}")
    if [ -n "$failures" ]; then
        summary+=("   failing tests:")
        while IFS= read -r name; do summary+=("     $name"); done <<<"$failures"
    fi
    if [ "$unexplained" -gt 0 ]; then
        # Distinct reports: kind and the first frame in the project's sources of each access.
        while IFS= read -r line; do summary+=("   $line"); done < <(
            grep -v '^mutex' "$classified" | cut -f2- | sort | uniq -c | sort -rn)
    fi
}

# One line per sanitizer report in the log files under $1: `mutex` or `report`, then tab-separated the kind and,
# for each access (ThreadSanitizer) or the crash (AddressSanitizer), its first frame in the project's sources.
#
# A ThreadSanitizer report is `mutex` when both accesses run inside the body of a Synchronization.Mutex's withLock:
# a frame whose mangled name is a closure taking `inout sending` and returning `sending` (mangled `zYu`, then `K`,
# `YK<type>` or `<type>YK` when it throws (a generic body's thrown type comes before `YK`: SQLiteRegistryStore.read's
# `zYuAIYKYTXEfU`), then `YTXEfU`), i.e. withLock's `(inout sending Value) throws(E) -> sending Result`; no
# code in this repository declares such a closure itself. The frame may be below the access (a helper such as
# ProviderTokenCache.mint(_:now:) that the body calls with `&state`).
classify_reports() {
    local file
    for file in "$1"/*; do
        [ -f "$file" ] || continue
        awk '
            function flush() {
                if (kind == "") return
                label = (accesses >= 2 && locked[1] && locked[2]) ? "mutex" : "report"
                line = label "\t" kind
                for (i = 1; i <= (accesses > 2 ? 2 : (accesses == 0 ? 1 : accesses)); i++)
                    line = line "\t" (where[i] == "" ? "?" : where[i])
                print line
                kind = ""
            }
            /^(WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer)/ {
                flush()
                kind = $0
                sub(/ \(pid=[0-9]+\)/, "", kind)
                sub(/ on address 0x[0-9a-f]+.*/, "", kind)
                accesses = 0
                delete locked
                delete where
                section = 0
                if (kind ~ /AddressSanitizer|LeakSanitizer/) { accesses = 1; section = 1 }
                next
            }
            kind == "" { next }
            /^  [A-Z]/ {
                # A section header: an access ("Read of size 8 at ... by thread T1:") or something else.
                if ($0 ~ / by (main )?thread/ && $0 !~ /created by/ && $0 !~ /^  (Location|Thread|Mutex)/ \
                    && kind ~ /ThreadSanitizer/ && accesses < 2) {
                    accesses++
                    section = accesses
                } else if (kind ~ /ThreadSanitizer/) {
                    section = 0
                }
                next
            }
            /^    #[0-9]+ / && section > 0 {
                if ($2 ~ /zYu(K|YK[A-Za-z0-9_]+|[A-Za-z0-9_]+YK)?YTXEfU/) locked[section] = 1
                if (where[section] == "" && match($0, /\/(Sources|Tools|Tests|Benchmarks)\/[^ ]*:[0-9]+/))
                    where[section] = substr($0, RSTART + 1, RLENGTH - 1)
                next
            }
            /^SUMMARY:/ { flush() }
            END { flush() }
        ' "$file"
    done
}

for san in $sanitizers; do run_one "$san"; done

echo
echo "== sanitizer report"
printf '%s\n' "${summary[@]}"
exit $overall
