#!/usr/bin/env bash
# make sanitize: the test suite under ThreadSanitizer and then AddressSanitizer. make sanitize-core (what CI runs):
# ThreadSanitizer over the concurrent core's tests (Makefile's TSAN_CORE_TESTS).
#
#   bash scripts/sanitize.sh [FILTER]
#
# FILTER is passed to `swift test --filter` (a regex over Target.Class/method), for a subset when the
# whole suite is too slow under TSan, e.g. `bash scripts/sanitize.sh 'FanoutCoreTests|EngineTests'`.
# A full run (no FILTER, no SANITIZE_SKIP, both sanitizers) writes its result to the "Sanitizers" section of
# docs/RELIABILITY.md (SANITIZE_OUT to write elsewhere).
# The whole suite takes about 28 minutes under TSan on 2 shared cores (make sanitize-core: about 4), plus the builds.
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
# ThreadSanitizer reads scripts/tsan-suppressions.txt, where each suppression says why it is there (only code outside
# this repository may be suppressed).
# The ThreadSanitizer build is compiled with the FANOUT_TSAN condition (-Xswiftc -DFANOUT_TSAN): the package's lock,
# FanoutMutex, is then a pthread mutex, which TSan intercepts, instead of Synchronization.Mutex, whose contended
# hand-over (a futex syscall) it cannot see on Linux (Sources/FanoutCore/FanoutMutex.swift says more). So every
# report counts: the exit status is 0 only when every run built, passed its tests and left no sanitizer report,
# and the ThreadSanitizer canary (a deliberate race, after the tests) was reported.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
filter=${1:-}
sanitizers=${SANITIZERS:-thread address}
limit=${SANITIZE_TIMEOUT:-5400}
jobs=${SANITIZE_JOBS:-$(nproc)}
overall=0
summary=()
rows=()

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
    local conditions=()
    [ "$san" = thread ] && conditions=(-Xswiftc -DFANOUT_TSAN)
    local built_in
    if ! timeout --kill-after=30 "$limit" swift build --build-tests --sanitize="$san" --scratch-path "$scratch" \
        -j "$jobs" "${conditions[@]}" >"$scratch/build.log" 2>&1; then
        tail -30 "$scratch/build.log"
        summary+=("$san: BUILD FAILED or timed out after $((SECONDS - started))s (see ${scratch#"$root"/}/build.log)")
        rows+=("| $san | build failed | | | | $((SECONDS - started)) | |")
        overall=1
        return
    fi
    built_in=$((SECONDS - started))
    echo "   built in ${built_in}s"

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
        "${conditions[@]}" "${filter_args[@]}" >"$log" 2>&1
    status=$?
    local took=$((SECONDS - started))

    # XCTest's last "Executed" line is the total over every test bundle run.
    tests=$(grep -Eo 'Executed [0-9]+ tests?, with [0-9]+ failures?' "$log" | tail -1)
    local passed=${tests:-no XCTest summary}
    local classified=$scratch/reports.txt
    classify_reports "$reports" >"$classified"
    local count
    count=$(grep -c . "$classified")
    failures=$(grep -E "^Test Case .* failed" "$log" | sed -E "s/^Test Case '([^']*)' failed.*$/\1/" | sort -u)

    # The canary: a clean ThreadSanitizer run means something only if this run can see a race at all, so the same
    # build runs ThreadSanitizerCanaryTests once more with FANOUT_TSAN_CANARY=1, which makes it race on an
    # unsynchronised counter (Tests/FanoutCoreTests/FanoutMutexTests.swift), and the run fails unless TSan reports it.
    # Its reports go to a directory of their own and count for nothing else.
    local canary_verdict="" canary_note=""
    if [ "$san" = thread ]; then
        local canary=$scratch/canary
        rm -rf "$canary" && mkdir -p "$canary"
        FANOUT_TSAN_CANARY=1 \
            TSAN_OPTIONS="halt_on_error=0 exitcode=0 log_path=$canary/tsan ${TSAN_OPTIONS:-}" \
            timeout --kill-after=30 "$limit" swift test --skip-build --sanitize="$san" --scratch-path "$scratch" \
            "${conditions[@]}" --filter 'FanoutCoreTests\.ThreadSanitizerCanaryTests' >"$scratch/canary.log" 2>&1
        local canary_status=$? caught
        caught=$(classify_reports "$canary" | grep -c 'Tests/FanoutCoreTests/FanoutMutexTests.swift')
        if [ "$canary_status" -ne 0 ] || [ "$caught" -eq 0 ]; then
            canary_verdict="CANARY NOT REPORTED: the deliberate race went unseen (exit $canary_status, $caught report(s); see ${scratch#"$root"/}/canary.log)"
        else
            canary_note="   canary: the deliberate race was reported ($caught report(s) in ${canary#"$root"/}/)"
        fi
    fi

    local verdict=ok
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then verdict="TIMED OUT after ${took}s"; fi
    [ "$status" -ne 0 ] && [ "$verdict" = ok ] && verdict="TESTS FAILED (exit $status)"
    [ "$count" -gt 0 ] && [ "$verdict" = ok ] && verdict="SANITIZER REPORTS"
    [ -n "$canary_verdict" ] && [ "$verdict" = ok ] && verdict=$canary_verdict
    [ "$verdict" != ok ] && overall=1

    summary+=("$san: $verdict; $passed in ${took}s; $count sanitizer report(s)")
    [ -n "$canary_note" ] && summary+=("$canary_note")
    local executed failed
    executed=$(grep -Eo '^Executed [0-9]+' <<<"$tests" | grep -Eo '[0-9]+')
    failed=$(grep -Eo '[0-9]+ failures?' <<<"$tests" | grep -Eo '[0-9]+')
    rows+=("| $san | $verdict | ${executed:-?} | ${failed:-?} | $count | $built_in | $took |")
    summary+=("   log ${log#"$root"/}, raw reports ${reports#"$root"/}/, one line per report in ${classified#"$root"/}")
    if [ -n "$failures" ]; then
        summary+=("   failing tests:")
        while IFS= read -r name; do summary+=("     $name"); done <<<"$failures"
    fi
    if [ "$count" -gt 0 ]; then
        # Distinct reports: kind and the first frame in the project's sources of each access.
        while IFS= read -r line; do summary+=("   $line"); done < <(sort "$classified" | uniq -c | sort -rn)
    fi
}

# One line per sanitizer report in the log files under $1: tab-separated, the kind and, for each access
# (ThreadSanitizer) or the crash (AddressSanitizer), its first frame in the project's sources.
classify_reports() {
    local file
    for file in "$1"/*; do
        [ -f "$file" ] || continue
        awk '
            function flush() {
                if (kind == "") return
                line = kind
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
                if (where[section] == "" && match($0, /\/(Sources|Tools|Tests|Benchmarks)\/[^ ]*:[0-9]+/))
                    where[section] = substr($0, RSTART + 1, RLENGTH - 1)
                next
            }
            /^SUMMARY:/ { flush() }
            END { flush() }
        ' "$file"
    done
}

# record FILE: replaces the "Sanitizers" section at the end of FILE (from its marker on) with this run's result.
# scripts/soak.sh, which writes the rest of the file, keeps the section.
record() {
    local file=$1 commit kernel kept=""
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit (with uncommitted changes)"
    kernel=$(uname -sr)
    [ -f "$file" ] && kept=$(sed '/^<!-- sanitize -->$/,$d' "$file")
    {
        printf '%s\n\n' "$kept"
        cat <<EOF
<!-- sanitize -->
## Sanitizers

The whole test suite under ThreadSanitizer and then AddressSanitizer, written by \`scripts/sanitize.sh\` at the end
of each full run. CI runs the ThreadSanitizer part over the concurrent core's tests (\`make sanitize-core\`).

- **Command:** \`make sanitize\`
- **Date:** $(date -u '+%Y-%m-%d %H:%M UTC')
- **Commit:** $commit
- **Machine:** $(nproc) cores, $kernel; \`swift build -j $jobs\`.
- **Verdict:** $([ "$overall" -eq 0 ] && echo "clean (exit 0)" || echo "FAILED (exit 1)")

| sanitizer | verdict | tests | failures | reports | build s | tests s |
|---|---|---:|---:|---:|---:|---:|
$(printf '%s\n' "${rows[@]}")

How to read it:
- **Reports** counts every sanitizer report, in the test process and in the processes the tests start
  (\`fanout\`, \`mock-apns\`); none is set aside. scripts/tsan-suppressions.txt may only hold entries for code
  outside this repository, each saying why.
- ThreadSanitizer sees every lock: its build compiles the package's lock (\`FanoutMutex\`) as a pthread mutex
  (\`FANOUT_TSAN\`), since it cannot see \`Synchronization.Mutex\`'s contended hand-over on Linux.
- **The canary.** After the suite, the same ThreadSanitizer build runs \`ThreadSanitizerCanaryTests\` with
  \`FANOUT_TSAN_CANARY=1\`, a deliberate race on an unsynchronised counter; the run fails unless TSan reports it,
  so a clean run cannot come from a ThreadSanitizer that stopped looking.
- Left out: \`AllocationTests\` (its probe replaces malloc, as the sanitizers do). Tests that bound elapsed time
  are given 10 times as long under ThreadSanitizer, 3 times under AddressSanitizer.
EOF
    } >"$file"
}

for san in $sanitizers; do run_one "$san"; done
# A full run (every test, both sanitizers) records its result; a subset (a filter, `make sanitize-core`) does not.
if [ -z "$filter" ] && [ "$sanitizers" = "thread address" ] && [ -z "${SANITIZE_SKIP:-}" ]; then
    record "${SANITIZE_OUT:-$root/docs/RELIABILITY.md}"
    summary+=("recorded in ${SANITIZE_OUT:-docs/RELIABILITY.md}")
fi

echo
echo "== sanitizer report"
printf '%s\n' "${summary[@]}"
exit $overall
