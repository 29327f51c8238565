#!/usr/bin/env bash
# make fuzz: build the libFuzzer targets in Fuzz/ and run each for SECONDS (default 60).
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]        targets: job-line response-parser request-validator json
#                                                     http1-request
#   bash scripts/fuzz.sh --reproduce TARGET FILE...   run a target once on saved inputs (e.g. a crash file)
#
# The code under test is built as the package's own modules, by SwiftPM from Package.swift (so the fuzzers see the
# same sources, settings and `package` access as `swift build`), with libFuzzer coverage and AddressSanitizer:
# `swift build -c release --build-path .build/fuzz/spm -Xswiftc -sanitize=fuzzer,address --target <module>`.
# Only pure-Swift modules are fuzzed, so no C library is instrumented or linked: FanoutCore (JSON, APNs responses,
# payloads), FanoutJobFormat (the job-line parser), MockAPNsValidation (mock-apns's request validator) and FanoutHTTP1
# (the HTTP server's HTTP/1.1 head parser and chunked decoder). Each
# target in Fuzz/ is then compiled with `swiftc -sanitize=fuzzer,address`, importing those modules and linking their
# objects. Everything goes into .build/fuzz/:
#   bin/<target>         the fuzzers           corpus/<target>/   the seeds (Tests/Fuzz/Corpus) plus what runs add
#   crashes/<target>/    crash-*, timeout-*, oom-*, leak-* inputs    logs/<target>.log   libFuzzer's output
#   spm/                 SwiftPM's instrumented build of the modules
# A crash stops that target's run; its input is kept for a regression test (Tests/*/FuzzRegressionTests.swift).
# The exit status is 1 when any target crashed or failed to build.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/.build/fuzz
all_targets=(job-line response-parser request-validator json http1-request)
SWIFT=${SWIFT:-swift}
SWIFTC=${SWIFTC:-swiftc}

declare -A source=([job-line]=JobLine.swift [response-parser]=ResponseParser.swift
    [request-validator]=RequestValidator.swift [json]=JSONParser.swift [http1-request]=HTTP1Request.swift)
# The package modules each target imports, dependencies first.
declare -A modules=([job-line]="FanoutCore FanoutJobFormat MockAPNsValidation" [response-parser]=FanoutCore
    [request-validator]="FanoutCore MockAPNsValidation" [json]=FanoutCore [http1-request]=FanoutHTTP1)
# Longest input libFuzzer generates: room for a 4 KiB payload (5 KiB for voip) inside a job line or a request; an
# HTTP/1.1 head with a few chunks after it.
declare -A max_len=([job-line]=8192 [response-parser]=2048 [request-validator]=8192 [json]=4096 [http1-request]=4096)

spm=$out/spm
products=$spm/release

# The modules `targets` need, built (or brought up to date) by SwiftPM with the fuzzer's instrumentation.
build_modules() {
    local target module needed=()
    for target in "$@"; do
        for module in ${modules[$target]}; do
            [[ " ${needed[*]} " == *" $module "* ]] || needed+=("$module")
        done
    done
    for module in "${needed[@]}"; do
        echo "building $module (fuzzer + address instrumentation)"
        "$SWIFT" build -c release --build-path "$spm" -Xswiftc -sanitize=fuzzer,address --target "$module" \
            >"$out/logs/build-$module.log" 2>&1 || { cat "$out/logs/build-$module.log" >&2; return 1; }
    done
}

# The package name SwiftPM compiled the modules with, which `package` access across modules needs.
package_name() {
    grep -m1 -A1 '"-package-name"' "$products/description.json" | tail -1 | cut -d'"' -f2
}

flags=(-sanitize=fuzzer,address -swift-version 6 -parse-as-library -O -g)
if command -v ld.lld >/dev/null 2>&1 || [ -x "$(dirname "$(command -v "$SWIFTC")")/ld.lld" ]; then
    flags+=(-use-ld=lld)  # gold prints a warning per ASan symbol; lld links the same binary quietly
fi

build_target() {
    local target=$1 binary=$out/bin/$1 module objects=()
    local files=("Fuzz/${source[$target]}" Fuzz/FuzzSupport.swift)
    for module in ${modules[$target]}; do
        # The objects of the module's current sources (a stale one of a deleted file would still lie there).
        mapfile -t -O ${#objects[@]} objects < <(grep -o '"object": "[^"]*\.swift\.o"' \
            "$products/$module.build/output-file-map.json" | cut -d'"' -f4)
    done
    mkdir -p "$out/bin"
    if [ -f "$binary" ] && [ -z "$(find "${files[@]}" "${objects[@]}" -newer "$binary" | head -1)" ]; then
        return 0
    fi
    echo "building $target"
    "$SWIFTC" "${flags[@]}" -package-name "$(package_name)" -I "$products/Modules" "${files[@]}" "${objects[@]}" \
        -o "$binary"
}

# The environment every run gets: a job-file directory holding tokens.txt, for `tokens_file` in job lines.
# Leak checking stays on: libFuzzer reports an input after which more memory stays allocated than before it.
export FANOUT_FUZZ_JOB_DIR=$out/jobdir
export ASAN_OPTIONS=${ASAN_OPTIONS:-"abort_on_error=1:symbolize=1"}
setup_env() {
    mkdir -p "$FANOUT_FUZZ_JOB_DIR"
    printf '%s\n' 3f1a9c0e5b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a \
        8e6c4a2f0d8b6e4c2a0f8d6b4e2c0a8f6d4b2e0c8a6f4d2b0e8c6a4f2d0b8e6c >"$FANOUT_FUZZ_JOB_DIR/tokens.txt"
}

if [ "${1:-}" = --reproduce ]; then
    [ $# -ge 3 ] || { echo "usage: $0 --reproduce TARGET FILE..." >&2; exit 2; }
    target=$2
    shift 2
    [ -n "${source[$target]:-}" ] || { echo "unknown target $target (${all_targets[*]})" >&2; exit 2; }
    mkdir -p "$out/logs"
    build_modules "$target" && build_target "$target" || exit 1
    setup_env
    exec "$out/bin/$target" -runs=1 "$@"
fi

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for target in "${targets[@]}"; do
    [ -n "${source[$target]:-}" ] || { echo "unknown target $target (${all_targets[*]})" >&2; exit 2; }
done

mkdir -p "$out/logs"
build_modules "${targets[@]}" || { echo "the package's modules did not build for fuzzing" >&2; exit 1; }
setup_env
status=0
rows=()
for target in "${targets[@]}"; do
    if ! build_target "$target"; then
        rows+=("$(printf '%-18s %s' "$target" "BUILD FAILED")")
        status=1
        continue
    fi
    corpus=$out/corpus/$target
    crashes=$out/crashes/$target
    log=$out/logs/$target.log
    mkdir -p "$corpus" "$crashes" "$out/logs"
    cp -n Tests/Fuzz/Corpus/"$target"/* "$corpus"/ 2>/dev/null || true
    before=$(find "$crashes" -type f | wc -l)
    echo "fuzzing $target for ${seconds}s (corpus: $(find "$corpus" -type f | wc -l) inputs)"
    "$out/bin/$target" "$corpus" -max_total_time="$seconds" -max_len="${max_len[$target]}" -timeout=10 \
        -rss_limit_mb=2048 -dict="Fuzz/$target.dict" -artifact_prefix="$crashes/" -print_final_stats=1 \
        >"$log" 2>&1
    code=$?
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    coverage=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
    found=$(($(find "$crashes" -type f | wc -l) - before))
    if [ "$code" -ne 0 ] || [ "$found" -gt 0 ]; then
        status=1
        newest=$(ls -t "$crashes" 2>/dev/null | head -1)
        why=$(grep -E -m1 'fuzz property violated|Fatal error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|deadly signal' "$log")
        rows+=("$(printf '%-18s %12s executions  CRASH (exit %s): %s' "$target" "${executions:-?}" "$code" "${why:-see $log}")")
        rows+=("$(printf '%-18s   input: %s' "" "${crashes#"$root"/}/$newest")")
        rows+=("$(printf '%-18s   reproduce: bash scripts/fuzz.sh --reproduce %s %s' "" "$target" "${crashes#"$root"/}/$newest")")
    else
        rows+=("$(printf '%-18s %12s executions  no crash  (%s)' "$target" "${executions:-?}" "$coverage")")
    fi
done

echo
echo "== fuzz report (${seconds}s per target; logs in ${out#"$root"/}/logs)"
printf '%s\n' "${rows[@]}"
exit $status
